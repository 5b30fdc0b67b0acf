"""Brokers in the registry: /brokers/ids/<broker_id>, an ephemeral node per live broker."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from broker.registry.nodes import decode, encode, int_field, validate_broker_id
from broker.registry.session import NoNode, Session


@dataclass(frozen=True)
class BrokerRegistration:
    """What /brokers/ids/<broker_id> says about a live broker: where its front socket listens,
    how many workers (partition groups) it runs, on which log directories, the pylog version
    it runs ("" for a broker too old to say), and its rack (None without one: not set, or a
    broker older than racks). ValueError when `rack` is not a non-empty string or None.

    In security.mode curve, public data for the other brokers (docs/security.md): `curve_key`,
    the public key of its front (Z85), which a follower of it presents as the server key; and
    `cluster_keys`, the keys it lets in as the cluster principal (a broker's), by which
    `pylogctl topic reassign --status` and the controller tell why a replica cannot follow.
    None and () for a plaintext broker, or one older than curve followers."""

    host: str
    port: int
    workers: int = 1
    log_dirs: tuple[str, ...] = ()
    software_version: str = ""
    rack: str | None = None
    curve_key: str | None = None
    cluster_keys: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.rack is not None and (not isinstance(self.rack, str) or not self.rack):
            raise ValueError(f"a rack is a non-empty string or None, not {self.rack!r}")

    def to_json(self) -> bytes:
        """The node's data; `rack`, `curve_key` and `cluster_keys` are written only when there
        are some."""
        extra: dict[str, object] = {} if self.rack is None else {"rack": self.rack}
        if self.curve_key is not None:
            extra |= {"curve_key": self.curve_key, "cluster_keys": list(self.cluster_keys)}
        return encode(
            {
                "host": self.host,
                "port": self.port,
                "workers": self.workers,
                "log_dirs": list(self.log_dirs),
                "pylog_version": self.software_version,
                **extra,
            }
        )

    @classmethod
    def from_json(cls, data: bytes) -> BrokerRegistration:
        """Parse node data; ValueError when it is not a broker registration."""
        obj = decode(data)
        host, log_dirs = obj.get("host"), obj.get("log_dirs")
        software_version = obj.get("pylog_version", "")
        if not isinstance(software_version, str):
            raise ValueError("'pylog_version' is not a string")
        if not isinstance(host, str):
            raise ValueError("'host' is missing or not a string")
        if not isinstance(log_dirs, list) or not all(isinstance(d, str) for d in log_dirs):
            raise ValueError("'log_dirs' is missing or not a list of strings")
        rack = obj.get("rack")
        if rack is not None and (not isinstance(rack, str) or not rack):
            raise ValueError("'rack' is not a non-empty string")
        curve_key, cluster_keys = obj.get("curve_key"), obj.get("cluster_keys", [])
        if curve_key is not None and not isinstance(curve_key, str):
            raise ValueError("'curve_key' is not a string")
        if not isinstance(cluster_keys, list) or not all(isinstance(k, str) for k in cluster_keys):
            raise ValueError("'cluster_keys' is not a list of strings")
        return cls(
            host=host,
            port=int_field(obj, "port"),
            workers=int_field(obj, "workers"),
            log_dirs=tuple(log_dirs),
            software_version=software_version,
            rack=rack,
            curve_key=curve_key,
            cluster_keys=tuple(cluster_keys),
        )


class Brokers:
    """The brokers registered in the registry (/brokers/ids), on `session`."""

    def __init__(self, session: Session) -> None:
        self._session = session
        self.chroot = session.chroot

    def path(self, broker_id: int) -> str:
        return f"{self.chroot}/brokers/ids/{broker_id}"

    def register(self, broker_id: int, info: BrokerRegistration) -> None:
        """Create (or update) the ephemeral /brokers/ids/<broker_id>, kept until the session stops.

        On RegistryUnavailable the registration is remembered and made once connected."""
        validate_broker_id(broker_id)
        self._session.register(self.path(broker_id), info.to_json())

    def unregister(self, broker_id: int) -> None:
        """Delete /brokers/ids/<broker_id> and stop keeping it (nothing if it is absent)."""
        validate_broker_id(broker_id)
        self._session.unregister(self.path(broker_id))

    def read(self) -> dict[int, BrokerRegistration]:
        """The live brokers: broker id -> BrokerRegistration (unreadable nodes are left out). Their
        racks, for TopicConfig.spread: {i: b.rack for i, b in read().items()}."""
        return self._session.read_all(
            f"{self.chroot}/brokers/ids", BrokerRegistration.from_json, int
        )

    def epochs(self) -> dict[int, int]:
        """The live brokers and the epoch of each (after Kafka's KIP-380): the zxid that created
        its registration node. A broker that registers again, after a restart (even one within
        its old session, whose node it replaces) or a session expiry, has a later epoch: a new
        incarnation, which the controller tells from the old one."""
        path = f"{self.chroot}/brokers/ids"
        try:
            children = self._session.children(path)
        except NoNode:
            return {}
        epochs = {}
        for child in children:
            if child.isascii() and child.isdecimal():
                try:
                    epochs[int(child)] = self._session.get(f"{path}/{child}")[1].czxid
                except NoNode:
                    continue  # gone since listed
        return epochs

    def registered_epoch(self, broker_id: int) -> int | None:
        """The broker epoch of `broker_id`'s registration if it belongs to this session: the
        server has this session alive as it answers. None when it does not (not registered
        yet in this session, or another's). RegistryUnavailable as every call."""
        validate_broker_id(broker_id)
        try:
            _, stat = self._session.get(self.path(broker_id))
        except NoNode:
            return None
        session = self._session.session_id
        return stat.czxid if session is not None and stat.ephemeral_owner == session else None

    def watch_ids(self, callback: Callable[[list[int]], None]) -> None:
        """Call `callback` with the ids of the brokers up, now and whenever a broker comes or
        goes (a broker's restart included: its node is made anew), until the session stops.
        No registration is read for it (Session.watch_children)."""
        self._session.watch_children(
            f"{self.chroot}/brokers/ids",
            lambda names: callback(sorted(int(name) for name in names if name.isdecimal())),
        )

    def watch(self, callback: Callable[[dict[int, BrokerRegistration]], None]) -> None:
        """Call `callback(read())` now and whenever a broker comes or goes, until the session
        stops."""
        self._session.add_watch(
            f"{self.chroot}/brokers/ids", BrokerRegistration.from_json, int, callback
        )
