"""`pylog-mirror`'s configuration: a TOML file (deploy/pylog-mirror.toml is the example).

    [source]                      # the cluster copied from
    bootstrap = "10.0.1.5:9092"   # one or more brokers, comma-separated
    key_file = "..."              # CurveZMQ: the mirror's secret key file, and the
    broker_key = "..."            # cluster's public broker key (both, or neither)

    [target]                      # the cluster copied to: the same keys, and
    zookeeper_auth_file = "..."   # the digest identity its ZooKeeper wants, if any
    [target.settings]             # topic settings of the target's topics over the source's
    replication_factor = 3

    [mirror]
    topics = ["clicks", "logs-*"] # names and shell-style patterns (fnmatch)
    ...                           # MirrorSettings below: each key, its default

Every key is checked when the file is read: an unknown one, a wrong type or a bad value is a
MirrorConfigError naming it, before anything is copied.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from broker.errors import PylogError
from broker.protocol import Ack
from broker.security import ClientKeys, KeyFileError, ZooKeeperAuth

FORCED_SETTINGS: Final = {"compression": "producer"}
"""What every target topic stores, whatever the source's topic says: sets as they come, so
that each copied byte lands at its source offset (a conversion would change the sizes)."""
ACKS: Final = {"all": Ack.ALL, "flushed": Ack.FLUSHED}


class MirrorConfigError(PylogError):
    """The mirror's configuration cannot be used (the message names the file and key)."""


@dataclass(frozen=True, slots=True)
class ClusterAddress:
    """A cluster the mirror talks to: its bootstrap brokers and the keys to reach them."""

    bootstrap: str
    keys: ClientKeys | None = None
    zookeeper_auth: ZooKeeperAuth | None = None


@dataclass(frozen=True, slots=True)
class MirrorSettings:
    """[mirror]: what to copy and how."""

    topics: tuple[str, ...]
    """Topic names and fnmatch patterns ("logs-*"): topics matching one are mirrored, those
    created later included (`discover_interval_s`)."""
    client_id: str = "pylog-mirror"
    """The client id of its requests on both clusters (quotas by client id apply to it)."""
    group: str = "pylog-mirror"
    """The group its processes form in the target's registry: they share the partitions."""
    member_id: str | None = None
    """This process's id in the group (default: host-pid-random)."""
    session_timeout_s: float = 6.0
    """Its ZooKeeper session's timeout: how long the partitions of a process that died (or
    lost ZooKeeper) wait before the others take them over."""
    ack: str = "all"
    """When the target acknowledges a copied set: "all" (every in-sync replica holds it) or
    "flushed" (the leader's disk does)."""
    fetch_max_bytes: int = 1 << 20
    """The most bytes a copied set holds (one FETCH, then one PRODUCE): at least the topic's
    max_message_bytes, at most the target topic's segment_bytes."""
    fetch_wait_ms: int = 500
    """How long a FETCH of a caught-up partition waits for new messages at the source."""
    timeout_s: float = 30.0
    """How long a request waits for its reply before the copy takes it as lost (and reads
    where the target stands again)."""
    discover_interval_s: float = 10.0
    """How often the source's topics are listed again, for new topics and new partitions."""
    progress_interval_s: float = 60.0
    """How often a line of progress is logged."""
    retention_check_interval_s: float = 30.0
    """How often each copy asks its source partition's leader when retention deletes the next
    message to copy (broker.client.retention: the pylog_mirror_retention_seconds gauge, the
    RETENTION_S of `pylogctl mirror describe`)."""
    retention_warning_s: float = 3600.0
    """A copy whose next message retention deletes within this long is warned of in the log
    (0: no warning)."""
    metrics_port: int | None = None
    """The port of its Prometheus endpoint on 127.0.0.1 (`metrics_host` to change); none:
    no endpoint."""
    metrics_host: str = "127.0.0.1"

    def __post_init__(self) -> None:
        if not self.topics:
            raise ValueError("topics: name at least one topic or pattern")
        if self.ack not in ACKS:
            raise ValueError(f"ack: {self.ack!r} is not one of {', '.join(ACKS)}")
        for name in ("fetch_max_bytes", "fetch_wait_ms"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}: must be at least 1")
        for name in (
            "timeout_s",
            "session_timeout_s",
            "discover_interval_s",
            "progress_interval_s",
            "retention_check_interval_s",
        ):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name}: must be above 0")
        if self.retention_warning_s < 0:
            raise ValueError("retention_warning_s: must be 0 (no warning) or above")
        if self.metrics_port is not None and not 0 <= self.metrics_port <= 65535:
            raise ValueError(f"metrics_port: {self.metrics_port} is not a port")

    @property
    def acks(self) -> Ack:
        return ACKS[self.ack]

    def mirrors(self, topic: str) -> bool:
        """Whether `topic` is one of `topics` or matches one of their patterns."""
        return any(fnmatch.fnmatchcase(topic, pattern) for pattern in self.topics)


@dataclass(frozen=True, slots=True)
class MirrorConfig:
    source: ClusterAddress
    target: ClusterAddress
    mirror: MirrorSettings
    target_settings: Mapping[str, str] = field(default_factory=dict)
    """Topic settings the target's topics take over the source's (decimal text or "none",
    as CREATE_TOPIC takes them)."""

    @classmethod
    def load(cls, path: str | Path) -> MirrorConfig:
        """Read and check the TOML file at `path`; MirrorConfigError naming what is wrong."""
        path = Path(path)
        try:
            document = tomllib.loads(path.read_text())
        except (OSError, tomllib.TOMLDecodeError, UnicodeDecodeError) as error:
            raise MirrorConfigError(f"{path}: {error}") from None
        try:
            return cls.from_document(document)
        except (ValueError, TypeError, KeyFileError) as error:
            raise MirrorConfigError(f"{path}: {error}") from None

    @classmethod
    def from_document(cls, document: Mapping[str, Any]) -> MirrorConfig:
        _known(document, "", {"source", "target", "mirror"})
        for section in ("source", "target", "mirror"):
            if not isinstance(document.get(section), dict):
                raise ValueError(f"[{section}] is missing")
        target = dict(document["target"])
        settings = target.pop("settings", {})
        if not isinstance(settings, dict):
            raise ValueError("[target.settings] must be a table of topic settings")
        if forced := sorted(set(settings) & set(FORCED_SETTINGS)):
            raise ValueError(
                f"[target.settings] {forced[0]}: a mirrored topic stores the source's sets as "
                "they are (its offsets are the source's): it cannot be set"
            )
        mirror = dict(document["mirror"])
        _known(mirror, "mirror", {f.name for f in dataclasses.fields(MirrorSettings)})
        for key, value in mirror.items():
            expected = _TYPES[key]
            if not isinstance(value, expected) or isinstance(value, bool):
                raise ValueError(f"[mirror] {key}: {value!r} is not {_TYPE_NAMES[expected]}")
        topics = mirror.pop("topics", ())
        if not all(isinstance(t, str) for t in topics):
            raise ValueError("[mirror] topics: a list of topic names and patterns")
        return cls(
            _cluster(document["source"], "source", zookeeper=False),
            _cluster(target, "target", zookeeper=True),
            _settings(tuple(topics), mirror),
            {key: _setting_text(key, value) for key, value in settings.items()},
        )


_TYPES: Final[Mapping[str, type | tuple[type, ...]]] = {
    "topics": list,
    "client_id": str,
    "group": str,
    "member_id": str,
    "ack": str,
    "fetch_max_bytes": int,
    "fetch_wait_ms": int,
    "timeout_s": (int, float),
    "session_timeout_s": (int, float),
    "discover_interval_s": (int, float),
    "progress_interval_s": (int, float),
    "retention_check_interval_s": (int, float),
    "retention_warning_s": (int, float),
    "metrics_port": int,
    "metrics_host": str,
}
_TYPE_NAMES: Final[Mapping[type | tuple[type, ...], str]] = {
    list: "a list",
    str: "text",
    int: "an integer",
    (int, float): "a number",
}


def _settings(topics: tuple[str, ...], values: Mapping[str, Any]) -> MirrorSettings:
    try:
        return MirrorSettings(topics, **values)
    except ValueError as error:
        raise ValueError(f"[mirror] {error}") from None


def _known(table: Mapping[str, Any], section: str, keys: set[str]) -> None:
    if unknown := sorted(set(table) - keys):
        where = f"[{section}] " if section else ""
        raise ValueError(f"{where}unknown key {unknown[0]!r} (known: {', '.join(sorted(keys))})")


def _cluster(table: Mapping[str, Any], section: str, zookeeper: bool) -> ClusterAddress:
    keys = {"bootstrap", "key_file", "broker_key"}
    _known(table, section, keys | {"zookeeper_auth_file"} if zookeeper else keys)
    for key, value in table.items():
        if not isinstance(value, str):
            raise ValueError(f"[{section}] {key}: {value!r} is not text")
    if not table.get("bootstrap"):
        raise ValueError(f"[{section}] bootstrap: give the address of a broker (host:port)")
    key_file, broker_key = table.get("key_file"), table.get("broker_key")
    if bool(key_file) != bool(broker_key):
        raise ValueError(f"[{section}] key_file and broker_key go together: give both, or neither")
    client_keys = ClientKeys.load(key_file, broker_key) if key_file and broker_key else None
    auth_file = table.get("zookeeper_auth_file")
    auth = ZooKeeperAuth.load(auth_file) if auth_file else None
    return ClusterAddress(table["bootstrap"], client_keys, auth)


def _setting_text(key: str, value: object) -> str:
    """A [target.settings] value as CREATE_TOPIC takes it: an integer, or "none"."""
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise ValueError(f"[target.settings] {key}: {value!r} is neither an integer nor text")
    return str(value)
