"""The broker registry in ZooKeeper: which brokers are up, where topics live, topic settings.

This is the only module of pylog that imports kazoo. Paths follow Kafka 0.7, under a chroot
that the operator chooses (default "/pylog", so one ensemble can hold several clusters):

    <chroot>/brokers/ids/<broker_id>              ephemeral   BrokerInfo as JSON
        {"version": 1, "host": "10.0.0.7", "port": 9092, "workers": 2, "log_dirs": ["/d1"]}
    <chroot>/brokers/topics/<topic>/<broker_id>   ephemeral   partitions of the topic there
        {"version": 1, "partitions": [0, 3]}
    <chroot>/config/topics/<topic>                persistent  TopicConfig as JSON
        {"version": 1, "partitions": 4, "brokers": [1, 2, 3, 1], "settings": {...}}
    <chroot>/consumers/<group>/ids/<consumer_id>  ephemeral   a member and its topics
        {"version": 1, "topics": ["clicks"]}
    <chroot>/consumers/<group>/owners/<topic>/<broker_id>-<partition>
                                                  ephemeral   the member consuming it
        {"version": 1, "consumer": "host-1234-5f3a"}
    <chroot>/consumers/<group>/offsets/<topic>/<broker_id>-<partition>
                                                  persistent  the group's committed offset
        {"version": 1, "offset": 1042}

docs/registry.md describes every path and value, and who writes and watches each.

Node data is compact UTF-8 JSON with sorted keys. An ephemeral node lives as long as the
ZooKeeper session that created it: when a broker stops, dies or is cut off for longer than the
session timeout, its nodes disappear and everyone watching sees it go.

Connection and session loss:

- A lost connection (ZooKeeper restarting, a network blip) suspends the session; kazoo
  reconnects by itself and, if it is back within the session timeout, the session and all its
  ephemeral nodes are intact. While it is away every call waits at most `request_timeout_s`
  for the connection and then raises RegistryUnavailable.
- An expired session (away for longer than the timeout, or closed by the server) takes all
  our ephemeral nodes with it. kazoo opens a new session; the registry then re-creates every
  node it was asked to register (broker, topic partitions), from a thread of its own, never
  from kazoo's connection thread. A node still present at one of our paths is kept if it
  belongs to the current session and is deleted and created again if it belongs to another
  one (an old session of this broker not yet expired, e.g. after a quick restart).
- The same re-registration runs after every reconnection (it finds the nodes in place after a
  plain connection loss and does nothing), and watches are re-armed and their callbacks called
  with the current state, since ZooKeeper may have dropped events while we were away.
- `wait_registered(timeout)` waits until, in the current connection, every registered node is
  known to exist; `connected` and `statistics()` tell the state.

Every kazoo error, including timeouts, becomes broker.errors.RegistryUnavailable (retriable);
no kazoo exception leaves this module. A request that timed out may still be applied by the
server later: the registration calls are idempotent, and a create_topic_config retried after a
timeout may answer TopicAlreadyExists for its own first attempt.

Thread-safety: a Registry may be used from several threads at once (trio.to_thread included).
Watch callbacks run on threads of the registry, one at a time per watch.
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from kazoo.client import KazooClient, KazooState
from kazoo.exceptions import (
    BadVersionError,
    KazooException,
    NodeExistsError,
    NoNodeError,
    NotEmptyError,
)
from kazoo.handlers.threading import KazooTimeoutError
from kazoo.retry import KazooRetry

from broker.errors import (
    InvalidTopic,
    RegistryUnavailable,
    TopicAlreadyExists,
    UnknownTopicOrPartition,
)
from broker.lifecycle import Running
from broker.protocol import check_topic_name

__all__ = [
    "DEFAULT_CHROOT",
    "FORMAT_VERSION",
    "BrokerInfo",
    "Registry",
    "RegistryStatistics",
    "TopicConfig",
    "partition_name",
]

log = logging.getLogger(__name__)

DEFAULT_CHROOT = "/pylog"
FORMAT_VERSION = 1
"""The "version" written into every node; readers accept nodes of this version or newer."""

_ATTEMPTS = 5  # tries of a create/check/delete cycle that other clients keep racing


def _validate_broker_id(broker_id: int) -> None:
    if isinstance(broker_id, bool) or not isinstance(broker_id, int) or broker_id < 0:
        raise ValueError(f"a broker id is an integer >= 0, not {broker_id!r}")


_NAME = re.compile(r"[A-Za-z0-9._-]{1,249}")


def _check_name(kind: str, name: str) -> None:
    """A group name or consumer id becomes a ZooKeeper path element: 1-249 of A-Z a-z 0-9 . _ -"""
    if not isinstance(name, str) or not _NAME.fullmatch(name) or name in (".", ".."):
        raise ValueError(f"{kind} {name!r}: use 1 to 249 of A-Z a-z 0-9 . _ - (not . or ..)")


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _int_field(obj: Mapping[str, Any], key: str) -> int:
    value = obj.get(key)
    if not isinstance(value, int) or isinstance(value, bool):
        raise ValueError(f"{key!r} is missing or not an integer")
    return value


def _encode(obj: Mapping[str, object]) -> bytes:
    return json.dumps(
        {"version": FORMAT_VERSION, **obj}, sort_keys=True, separators=(",", ":")
    ).encode()


def _decode(data: bytes) -> dict[str, Any]:
    obj = json.loads(data)
    if not isinstance(obj, dict):
        raise ValueError("not a JSON object")
    if _int_field(obj, "version") < FORMAT_VERSION:
        raise ValueError(f"unknown format version {obj['version']!r}")
    return obj


@dataclass(frozen=True)
class BrokerInfo:
    """What /brokers/ids/<broker_id> says about a live broker: where its front socket listens,
    how many workers (partition groups) it runs and on which log directories."""

    host: str
    port: int
    workers: int = 1
    log_dirs: tuple[str, ...] = ()

    def to_json(self) -> bytes:
        return _encode(
            {
                "host": self.host,
                "port": self.port,
                "workers": self.workers,
                "log_dirs": list(self.log_dirs),
            }
        )

    @classmethod
    def from_json(cls, data: bytes) -> BrokerInfo:
        """Parse node data; ValueError when it is not a broker registration."""
        obj = _decode(data)
        host, log_dirs = obj.get("host"), obj.get("log_dirs")
        if not isinstance(host, str):
            raise ValueError("'host' is missing or not a string")
        if not isinstance(log_dirs, list) or not all(isinstance(d, str) for d in log_dirs):
            raise ValueError("'log_dirs' is missing or not a list of strings")
        return cls(
            host=host,
            port=_int_field(obj, "port"),
            workers=_int_field(obj, "workers"),
            log_dirs=tuple(log_dirs),
        )


@dataclass(frozen=True)
class TopicConfig:
    """What /config/topics/<topic> holds: the topic's partition count, the broker that holds
    each partition (`brokers[p]` holds partition p, fixed at creation) and the topic's own
    settings (setting name -> integer, or None to switch that limit off); a setting left out
    takes the broker's [log] default.
    """

    partitions: int
    brokers: tuple[int, ...]
    settings: Mapping[str, int | None] = field(default_factory=dict)

    @classmethod
    def spread(
        cls,
        partitions: int,
        brokers: Iterable[int],
        settings: Mapping[str, int | None] | None = None,
    ) -> TopicConfig:
        """`partitions` partitions dealt round robin over `brokers` in id order: partition p
        goes to the (p mod n)-th broker. InvalidTopic when there is no broker."""
        ids = sorted(set(brokers))
        if not ids:
            raise InvalidTopic("no live broker to hold the topic's partitions")
        holders = tuple(ids[p % len(ids)] for p in range(max(partitions, 0)))
        return cls(partitions, holders, dict(settings or {}))

    def partitions_of(self, broker_id: int) -> list[int]:
        """The partitions that `broker_id` holds, in order."""
        return [p for p, holder in enumerate(self.brokers) if holder == broker_id]

    def validate(self, topic: str) -> None:
        """Raise InvalidTopic when partitions is not >= 1, brokers does not name one broker
        per partition, or a setting is not int | None."""
        if not _is_int(self.partitions) or self.partitions < 1:
            raise InvalidTopic(f"topic {topic!r}: partitions must be >= 1, not {self.partitions!r}")
        if len(self.brokers) != self.partitions or not all(
            _is_int(b) and b >= 0 for b in self.brokers
        ):
            raise InvalidTopic(
                f"topic {topic!r}: brokers must name one broker id per partition, "
                f"not {self.brokers!r}"
            )
        for name, value in self.settings.items():
            if not isinstance(name, str) or not (value is None or _is_int(value)):
                raise InvalidTopic(
                    f"topic {topic!r}: setting {name!r} must be an integer or None, not {value!r}"
                )

    def to_json(self) -> bytes:
        return _encode(
            {
                "partitions": self.partitions,
                "brokers": list(self.brokers),
                "settings": dict(self.settings),
            }
        )

    @classmethod
    def from_json(cls, data: bytes) -> TopicConfig:
        """Parse node data; ValueError when it is not a topic configuration."""
        obj = _decode(data)
        settings = obj.get("settings", {})
        if not isinstance(settings, dict):
            raise ValueError("'settings' is not an object")
        if not all(v is None or _is_int(v) for v in settings.values()):
            raise ValueError("a setting is not an integer or null")
        partitions = _int_field(obj, "partitions")
        brokers = _int_list(obj, "brokers")
        if len(brokers) != partitions:
            raise ValueError(f"'brokers' names {len(brokers)} brokers for {partitions} partitions")
        return cls(partitions, brokers, settings)


def _int_list(obj: Mapping[str, Any], key: str) -> tuple[int, ...]:
    value = obj.get(key)
    if not isinstance(value, list) or not all(_is_int(v) and v >= 0 for v in value):
        raise ValueError(f"{key!r} is missing or not a list of integers >= 0")
    return tuple(value)


def partition_name(broker_id: int, partition: int) -> str:
    """A partition's name under /consumers: "<broker_id>-<partition>", as in Kafka 0.7."""
    return f"{broker_id}-{partition}"


@dataclass(frozen=True)
class RegistryStatistics:
    """A snapshot of the registry's connection. `sessions` counts the ZooKeeper sessions
    established (1 until one expires), `sessions_lost` the expiries seen, `nodes_restored`
    the ephemeral nodes re-created because they had gone, `registered` how many ephemeral
    nodes this registry keeps."""

    connected: bool
    session_id: int | None
    sessions: int
    sessions_lost: int
    nodes_restored: int
    registered: int


# Private kazoo-free outcomes of one request. They are RegistryUnavailable subclasses so that,
# should one ever escape a public method, callers still see the documented error.
class _NoNode(RegistryUnavailable):
    pass


class _NodeExists(RegistryUnavailable):
    pass


class _NotEmpty(RegistryUnavailable):
    pass


class _BadVersion(RegistryUnavailable):
    pass


_KAZOO_OUTCOMES: tuple[tuple[type[Exception], type[RegistryUnavailable]], ...] = (
    (NoNodeError, _NoNode),
    (NodeExistsError, _NodeExists),
    (NotEmptyError, _NotEmpty),
    (BadVersionError, _BadVersion),
)


@dataclass(frozen=True)
class _Stat:
    version: int
    ephemeral_owner: int


T = TypeVar("T")


@dataclass(eq=False)
class _ChildrenWatch(Generic[T]):
    """A callback on the children of one path: `read` turns the child names into the value
    the callback gets. Triggers coalesce: the callback sees the latest state, not every step."""

    path: str
    read: Callable[[list[str]], T]
    callback: Callable[[T], None]
    lock: threading.Lock = field(default_factory=threading.Lock)
    dirty: bool = False
    running: bool = False
    # One function object for every arming, so kazoo's watcher set never holds two of ours.
    on_event: Callable[[Any], None] | None = None


class Registry(Running):
    """A broker's (or a tool's) connection to the registry in ZooKeeper.

    Paths, under `chroot`:

        /brokers/ids/<broker_id>              ephemeral   register_broker
        /brokers/topics/<topic>/<broker_id>   ephemeral   register_topic_partitions
        /config/topics/<topic>                persistent  create_topic_config

    `connect_string` is "host:port[,host:port...]" (no chroot there: pass `chroot`).
    `session_timeout_s` is asked of the server, which clamps it to 2-20 of its ticks.
    Every call waits at most `request_timeout_s` for a connection and an answer, then raises
    RegistryUnavailable. kazoo reconnects on its own, waiting at most `reconnect_max_delay_s`
    between attempts.

    Ephemeral nodes registered here are re-created after a session expiry (see the module
    doc); nodes of a previous session found at our paths are replaced. Use as a context
    manager, or call start() and stop(); a Registry is started once.
    """

    def __init__(
        self,
        connect_string: str,
        chroot: str = DEFAULT_CHROOT,
        session_timeout_s: float = 6.0,
        *,
        request_timeout_s: float = 5.0,
        reconnect_max_delay_s: float = 2.0,
    ) -> None:
        if "/" in connect_string:
            raise ValueError(f"pass the chroot as `chroot`, not in {connect_string!r}")
        if not chroot.startswith("/") or (chroot != "/" and chroot.endswith("/")):
            raise ValueError(f"chroot must be an absolute path like /pylog, not {chroot!r}")
        self.connect_string = connect_string
        self.chroot = "" if chroot == "/" else chroot
        self.session_timeout_s = session_timeout_s
        self.request_timeout_s = request_timeout_s
        self._client = KazooClient(
            hosts=connect_string,
            timeout=session_timeout_s,
            connection_retry=KazooRetry(
                max_tries=-1, delay=0.1, backoff=2, max_delay=reconnect_max_delay_s
            ),
        )
        # _state_lock guards the fields below it and is never held during a request: kazoo's
        # connection thread takes it in the state listener.
        self._state_lock = threading.Lock()
        self._generation = 0  # bumped on every connection state change
        self._connected = threading.Event()
        self._registered = threading.Event()
        self._started = False
        self._stopping = False
        self._session_ids: set[int] = set()
        self._sessions_lost = 0
        self._nodes_restored = 0
        # _register_lock serialises every change to our ephemeral nodes, held across requests.
        self._register_lock = threading.RLock()
        self._ephemerals: dict[str, bytes] = {}  # path -> data we keep registered
        self._stale: set[str] = set()  # our ephemeral paths to delete once connected
        self._watches: list[_ChildrenWatch[Any]] = []
        self._stopped = threading.Event()

    # -- paths -------------------------------------------------------------------------------

    def broker_path(self, broker_id: int) -> str:
        return f"{self.chroot}/brokers/ids/{broker_id}"

    def topic_broker_path(self, topic: str, broker_id: int) -> str:
        return f"{self.chroot}/brokers/topics/{topic}/{broker_id}"

    def topic_config_path(self, topic: str) -> str:
        return f"{self.chroot}/config/topics/{topic}"

    # -- lifetime ----------------------------------------------------------------------------

    def start(self, timeout: float = 15.0) -> None:
        """Connect (waiting at most `timeout` seconds) and create the base paths.

        Raises RegistryUnavailable when ZooKeeper cannot be reached in time."""
        if self._started:
            raise RuntimeError("a Registry is started once; make a new one")
        self._started = True
        self._client.add_listener(self._on_state_change)
        try:
            self._client.start(timeout=timeout)
        except (KazooException, KazooTimeoutError) as error:
            self.stop()
            raise RegistryUnavailable(
                f"cannot connect to ZooKeeper at {self.connect_string} within {timeout:g} s "
                f"({type(error).__name__}: {error})"
            ) from error
        try:
            for path in ("/brokers/ids", "/brokers/topics", "/config/topics"):
                self._ensure_path(self.chroot + path)
        except RegistryUnavailable:
            self.stop()
            raise
        log.info("registry connected to %s%s", self.connect_string, self.chroot)

    def stop(self) -> None:
        """Close the session: ZooKeeper deletes our ephemeral nodes at once. Idempotent."""
        with self._state_lock:
            if self._stopping:
                return
            self._stopping = True
            self._connected.clear()
            self._registered.clear()
        self._stopped.set()
        try:
            self._client.stop()
            self._client.close()
        except (KazooException, KazooTimeoutError, OSError) as error:
            log.warning("error while closing the ZooKeeper session: %s", error)

    # -- state -------------------------------------------------------------------------------

    @property
    def connected(self) -> bool:
        """Whether the session is connected now."""
        return self._connected.is_set()

    @property
    def session_id(self) -> int | None:
        """The ZooKeeper session id while connected (it changes after an expiry)."""
        client_id = self._client.client_id
        if client_id is None:
            return None
        session: int = client_id[0]
        return session

    def wait_connected(self, timeout: float | None = None) -> bool:
        """Wait until connected; False if `timeout` seconds passed first."""
        return self._connected.wait(timeout)

    def wait_registered(self, timeout: float | None = None) -> bool:
        """Wait until connected with every registered node known to exist in this connection
        (after a session expiry: re-created); False if `timeout` seconds passed first."""
        return self._registered.wait(timeout)

    def statistics(self) -> RegistryStatistics:
        with self._state_lock:
            sessions, lost, restored = (
                len(self._session_ids),
                self._sessions_lost,
                self._nodes_restored,
            )
        with self._register_lock:
            registered = len(self._ephemerals)
        return RegistryStatistics(
            connected=self.connected,
            session_id=self.session_id,
            sessions=sessions,
            sessions_lost=lost,
            nodes_restored=restored,
            registered=registered,
        )

    # -- brokers -----------------------------------------------------------------------------

    def register_broker(self, broker_id: int, info: BrokerInfo) -> None:
        """Create (or update) the ephemeral /brokers/ids/<broker_id>, kept until stop().

        On RegistryUnavailable the registration is remembered and made once connected."""
        _validate_broker_id(broker_id)
        self._register(self.broker_path(broker_id), info.to_json())

    def unregister_broker(self, broker_id: int) -> None:
        """Delete /brokers/ids/<broker_id> and stop keeping it (nothing if it is absent)."""
        _validate_broker_id(broker_id)
        self._unregister(self.broker_path(broker_id))

    def brokers(self) -> dict[int, BrokerInfo]:
        """The live brokers: broker id -> BrokerInfo (unreadable nodes are left out)."""
        return self._brokers(self._children(f"{self.chroot}/brokers/ids"))

    def watch_brokers(self, callback: Callable[[dict[int, BrokerInfo]], None]) -> None:
        """Call `callback(brokers())` now and whenever a broker comes or goes, until stop()."""
        self._add_watch(_ChildrenWatch(f"{self.chroot}/brokers/ids", self._brokers, callback))

    # -- topic partitions on brokers ---------------------------------------------------------

    def register_topic_partitions(
        self, topic: str, broker_id: int, partitions: Iterable[int]
    ) -> None:
        """Create (or update) the ephemeral /brokers/topics/<topic>/<broker_id> saying that the
        broker holds (and serves) `partitions` of the topic, kept until stop() or unregister.

        On RegistryUnavailable the registration is remembered and made once connected."""
        check_topic_name(topic)
        _validate_broker_id(broker_id)
        numbers = sorted(partitions)
        if not numbers or not all(_is_int(p) and p >= 0 for p in numbers):
            raise InvalidTopic(f"topic {topic!r}: partitions must be numbers >= 0, not {numbers}")
        self._register(self.topic_broker_path(topic, broker_id), _encode({"partitions": numbers}))

    def unregister_topic(self, topic: str, broker_id: int) -> None:
        """Delete /brokers/topics/<topic>/<broker_id> (and the topic's node once empty)."""
        check_topic_name(topic)
        _validate_broker_id(broker_id)
        self._unregister(self.topic_broker_path(topic, broker_id))
        with contextlib.suppress(_NoNode, _NotEmpty):
            self._delete(f"{self.chroot}/brokers/topics/{topic}")

    def topic_brokers(self, topic: str) -> dict[int, tuple[int, ...]]:
        """Broker id -> the partitions of `topic` it serves, for the live brokers holding it."""
        check_topic_name(topic)
        path = f"{self.chroot}/brokers/topics/{topic}"
        try:
            children = self._children(path)
        except _NoNode:
            return {}
        result: dict[int, tuple[int, ...]] = {}
        for child in children:
            try:
                result[int(child)] = _int_list(
                    _decode(self._get(f"{path}/{child}")[0]), "partitions"
                )
            except _NoNode:
                continue  # went away between the listing and the read
            except ValueError as error:
                log.warning("ignoring unreadable %s/%s: %s", path, child, error)
        return result

    # -- topic configurations ----------------------------------------------------------------

    def create_topic_config(self, topic: str, config: TopicConfig) -> None:
        """Create the persistent /config/topics/<topic>; TopicAlreadyExists if it exists."""
        check_topic_name(topic)
        config.validate(topic)
        try:
            self._create(self.topic_config_path(topic), config.to_json(), makepath=True)
        except _NodeExists:
            raise TopicAlreadyExists(f"topic {topic!r} exists already") from None

    def delete_topic_config(self, topic: str) -> None:
        """Delete /config/topics/<topic>; UnknownTopicOrPartition if there is none."""
        check_topic_name(topic)
        try:
            self._delete(self.topic_config_path(topic))
        except _NoNode:
            raise UnknownTopicOrPartition(f"topic {topic!r} does not exist") from None

    def topic_config(self, topic: str) -> TopicConfig:
        """The configuration of `topic`; UnknownTopicOrPartition if there is none."""
        check_topic_name(topic)
        path = self.topic_config_path(topic)
        try:
            data, _ = self._get(path)
        except _NoNode:
            raise UnknownTopicOrPartition(f"topic {topic!r} does not exist") from None
        try:
            return TopicConfig.from_json(data)
        except ValueError as error:
            raise RegistryUnavailable(f"{path} holds unreadable data: {error}") from None

    def topic_configs(self) -> dict[str, TopicConfig]:
        """Every topic's configuration: name -> TopicConfig (unreadable nodes are left out)."""
        return self._topic_configs(self._children(f"{self.chroot}/config/topics"))

    def watch_topic_configs(self, callback: Callable[[dict[str, TopicConfig]], None]) -> None:
        """Call `callback(topic_configs())` now and whenever a topic is created or deleted,
        until stop(). (A node's data is not watched: configurations are created and deleted.)"""
        self._add_watch(
            _ChildrenWatch(f"{self.chroot}/config/topics", self._topic_configs, callback)
        )

    # -- consumer groups ---------------------------------------------------------------------

    def consumer_path(self, group: str, consumer_id: str) -> str:
        return f"{self.chroot}/consumers/{group}/ids/{consumer_id}"

    def owner_path(self, group: str, topic: str, name: str) -> str:
        return f"{self.chroot}/consumers/{group}/owners/{topic}/{name}"

    def offset_path(self, group: str, topic: str, name: str) -> str:
        return f"{self.chroot}/consumers/{group}/offsets/{topic}/{name}"

    def register_consumer(self, group: str, consumer_id: str, topics: Iterable[str]) -> None:
        """Create (or update) the ephemeral /consumers/<group>/ids/<consumer_id> listing the
        topics the member consumes; kept (and re-created after a session expiry) until stop()
        or unregister_consumer."""
        _check_name("group", group)
        _check_name("consumer id", consumer_id)
        names = sorted(set(topics))
        for topic in names:
            check_topic_name(topic)
        self._register(self.consumer_path(group, consumer_id), _encode({"topics": names}))

    def unregister_consumer(self, group: str, consumer_id: str) -> None:
        """Delete /consumers/<group>/ids/<consumer_id> and stop keeping it."""
        self._unregister(self.consumer_path(group, consumer_id))

    def consumers(self, group: str) -> dict[str, tuple[str, ...]]:
        """The group's live members: consumer id -> the topics it consumes."""
        _check_name("group", group)
        path = f"{self.chroot}/consumers/{group}/ids"
        try:
            return self._consumers(group, self._children(path))
        except _NoNode:
            return {}

    def watch_consumers(
        self, group: str, callback: Callable[[dict[str, tuple[str, ...]]], None]
    ) -> None:
        """Call `callback(consumers(group))` now and whenever a member joins or leaves."""
        _check_name("group", group)
        path = f"{self.chroot}/consumers/{group}/ids"
        self._add_watch(
            _ChildrenWatch(path, lambda children: self._consumers(group, children), callback)
        )

    def claim_partition(self, group: str, topic: str, name: str, consumer_id: str) -> str | None:
        """Create the ephemeral owner node of partition `name` of `topic` for `consumer_id`.
        None when it is ours (now, or already in this session); else the id of the member that
        owns it. Not re-created after a session expiry: ownership ends with the session."""
        path = self.owner_path(group, topic, name)
        for _ in range(_ATTEMPTS):
            try:
                self._create(
                    path, _encode({"consumer": consumer_id}), ephemeral=True, makepath=True
                )
                return None
            except _NoNode:
                continue  # a parent was deleted between makepath and create
            except _NodeExists:
                pass
            try:
                data, stat = self._get(path)
            except _NoNode:
                continue
            if stat.ephemeral_owner == self.session_id:
                return None
            try:
                owner = _decode(data).get("consumer")
            except ValueError:
                owner = None
            return str(owner) if isinstance(owner, str) else f"session 0x{stat.ephemeral_owner:x}"
        raise RegistryUnavailable(f"could not claim {path}: it kept changing under us")

    def release_partition(self, group: str, topic: str, name: str) -> None:
        """Delete the owner node of partition `name` if this session holds it."""
        self._delete_if_ours(self.owner_path(group, topic, name))

    def partition_owners(self, group: str, topic: str) -> dict[str, str]:
        """Partition name -> the member owning it, for the owned partitions of `topic`."""
        path = f"{self.chroot}/consumers/{group}/owners/{topic}"
        try:
            children = self._children(path)
        except _NoNode:
            return {}
        owners = {}
        for child in children:
            try:
                owner = _decode(self._get(f"{path}/{child}")[0]).get("consumer")
            except _NoNode:
                continue
            except ValueError as error:
                log.warning("ignoring unreadable %s/%s: %s", path, child, error)
                continue
            if isinstance(owner, str):
                owners[child] = owner
        return owners

    def commit_offset(self, group: str, topic: str, name: str, offset: int) -> None:
        """Write the group's committed offset of partition `name` (persistent)."""
        if not _is_int(offset) or offset < 0:
            raise ValueError(f"an offset is an integer >= 0, not {offset!r}")
        path = self.offset_path(group, topic, name)
        data = _encode({"offset": offset})
        try:
            self._set(path, data, -1)
        except _NoNode:
            try:
                self._create(path, data, makepath=True)
            except _NodeExists:  # another member committed first: ours is as good
                self._set(path, data, -1)

    def committed_offset(self, group: str, topic: str, name: str) -> int | None:
        """The group's committed offset of partition `name`, or None if none was committed."""
        path = self.offset_path(group, topic, name)
        try:
            data, _ = self._get(path)
        except _NoNode:
            return None
        try:
            return _int_field(_decode(data), "offset")
        except ValueError as error:
            raise RegistryUnavailable(f"{path} holds unreadable data: {error}") from None

    # -- readers shared by the listings and the watches --------------------------------------

    def _brokers(self, children: Iterable[str]) -> dict[int, BrokerInfo]:
        path = f"{self.chroot}/brokers/ids"
        result: dict[int, BrokerInfo] = {}
        for child in children:
            try:
                result[int(child)] = BrokerInfo.from_json(self._get(f"{path}/{child}")[0])
            except _NoNode:
                continue
            except ValueError as error:
                log.warning("ignoring unreadable %s/%s: %s", path, child, error)
        return result

    def _consumers(self, group: str, children: Iterable[str]) -> dict[str, tuple[str, ...]]:
        path = f"{self.chroot}/consumers/{group}/ids"
        result: dict[str, tuple[str, ...]] = {}
        for child in children:
            try:
                topics = _decode(self._get(f"{path}/{child}")[0]).get("topics")
            except _NoNode:
                continue
            except ValueError as error:
                log.warning("ignoring unreadable %s/%s: %s", path, child, error)
                continue
            if isinstance(topics, list) and all(isinstance(t, str) for t in topics):
                result[child] = tuple(topics)
            else:
                log.warning("ignoring %s/%s: 'topics' is not a list of names", path, child)
        return result

    def _topic_configs(self, children: Iterable[str]) -> dict[str, TopicConfig]:
        path = f"{self.chroot}/config/topics"
        result: dict[str, TopicConfig] = {}
        for child in children:
            try:
                result[child] = TopicConfig.from_json(self._get(f"{path}/{child}")[0])
            except _NoNode:
                continue
            except ValueError as error:
                log.warning("ignoring unreadable %s/%s: %s", path, child, error)
        return result

    # -- ephemeral registrations -------------------------------------------------------------

    def _register(self, path: str, data: bytes) -> None:
        self._check_open()
        with self._register_lock:
            self._ephemerals[path] = data
            self._stale.discard(path)
            self._ensure_ephemeral(path, data)

    def _unregister(self, path: str) -> None:
        self._check_open()
        with self._register_lock:
            self._ephemerals.pop(path, None)
            try:
                self._delete_if_ours(path)
            except RegistryUnavailable:
                self._stale.add(path)  # deleted at the next reconnection, if still there
                raise

    def _ensure_ephemeral(self, path: str, data: bytes) -> bool:
        """Make `path` an ephemeral node of this session holding `data`. Returns True when it
        had to be created, False when it was there (and is now up to date)."""
        for _ in range(_ATTEMPTS):
            try:
                self._create(path, data, ephemeral=True, makepath=True)
                return True
            except _NoNode:
                continue  # a parent was deleted between makepath and create
            except _NodeExists:
                pass
            try:
                old, stat = self._get(path)
            except _NoNode:
                continue
            session = self.session_id
            if session is None:
                raise RegistryUnavailable(f"register {path}: the connection was lost")
            if stat.ephemeral_owner == session:
                if old != data:
                    try:
                        self._set(path, data, stat.version)
                    except (_NoNode, _BadVersion):
                        continue
                return False
            log.warning(
                "replacing %s held by session 0x%x (ours is 0x%x): a previous session of this "
                "broker, not expired yet, or another process using the same id",
                path,
                stat.ephemeral_owner,
                session,
            )
            with contextlib.suppress(_NoNode, _BadVersion):
                self._delete(path, stat.version)
        raise RegistryUnavailable(f"could not register {path}: it kept changing under us")

    def _delete_if_ours(self, path: str) -> None:
        try:
            _, stat = self._get(path)
            if stat.ephemeral_owner == self.session_id:
                self._delete(path, stat.version)
        except (_NoNode, _BadVersion):
            pass

    # -- connection state --------------------------------------------------------------------

    def _on_state_change(self, state: str) -> None:
        """kazoo's state listener: runs in kazoo's connection thread and must not block."""
        with self._state_lock:
            if self._stopping:
                return
            self._generation += 1
            generation = self._generation
            if state == KazooState.CONNECTED:
                self._connected.set()
            else:
                self._connected.clear()
                self._registered.clear()
                if state == KazooState.LOST:
                    self._sessions_lost += 1
        if state == KazooState.CONNECTED:
            log.info("registry connected to ZooKeeper")
            self._client.handler.spawn(self._restore, generation)
        elif state == KazooState.SUSPENDED:
            log.warning("registry lost its ZooKeeper connection; kazoo is reconnecting")
        else:
            log.warning("registry's ZooKeeper session expired: our ephemeral nodes are gone")

    def _restore(self, generation: int) -> None:
        """After a (re)connection: re-create missing registrations, delete stale ones, re-arm
        the watches. Runs on its own thread; retries while the same connection lasts."""
        delay = 0.1
        while True:
            try:
                restored = self._restore_once()
            except RegistryUnavailable as error:
                with self._state_lock:
                    same_connection = generation == self._generation and not self._stopping
                if not same_connection:
                    return  # a later state change has its own _restore
                log.warning("re-registration failed, retrying in %.1f s: %s", delay, error)
                if self._stopped.wait(delay):
                    return
                delay = min(delay * 2, 2.0)
                continue
            except Exception:
                log.exception("re-registration failed unexpectedly")
                return
            break
        session = self.session_id
        with self._state_lock:
            if generation != self._generation or self._stopping:
                return
            if session is not None:
                self._session_ids.add(session)
            self._nodes_restored += restored
            self._registered.set()
        if restored:
            log.info("re-created %d registry node(s) in session 0x%x", restored, session or 0)
        for watch in list(self._watches):
            self._trigger(watch)

    def _restore_once(self) -> int:
        restored = 0
        with self._register_lock:
            for path in list(self._stale):
                self._delete_if_ours(path)
                self._stale.discard(path)
            for path, data in list(self._ephemerals.items()):
                if self._ensure_ephemeral(path, data):
                    restored += 1
        return restored

    # -- watches -----------------------------------------------------------------------------

    def _add_watch(self, watch: _ChildrenWatch[Any]) -> None:
        self._check_open()

        def on_event(event: Any) -> None:  # kazoo's event thread: only schedule
            if event.type != "NONE":  # NONE: a connection state change, _restore re-arms
                self._trigger(watch)

        watch.on_event = on_event
        self._watches.append(watch)
        self._trigger(watch)

    def _trigger(self, watch: _ChildrenWatch[Any]) -> None:
        with watch.lock:
            watch.dirty = True
            if watch.running:
                return
            watch.running = True
        self._client.handler.spawn(self._run_watch, watch)

    def _run_watch(self, watch: _ChildrenWatch[Any]) -> None:
        delay = 0.1
        while True:
            with watch.lock:
                if not watch.dirty or self._stopping:
                    watch.running = False
                    return
                watch.dirty = False
            try:
                try:
                    children = self._children(watch.path, watch.on_event)
                except _NoNode:
                    self._ensure_path(watch.path)
                    children = self._children(watch.path, watch.on_event)
                value = watch.read(children)
            except RegistryUnavailable as error:
                if not self.connected:
                    with watch.lock:
                        watch.running = False
                    return  # _restore triggers it again on reconnection
                log.warning("reading %s for a watch failed, retrying: %s", watch.path, error)
                with watch.lock:
                    watch.dirty = True
                if self._stopped.wait(delay):
                    return
                delay = min(delay * 2, 2.0)
                continue
            except Exception:
                log.exception("reading %s for a watch failed unexpectedly", watch.path)
                with watch.lock:
                    watch.running = False
                return
            delay = 0.1
            try:
                watch.callback(value)
            except Exception:
                log.exception("registry watch callback on %s failed", watch.path)

    # -- requests: every kazoo call goes through _request ------------------------------------

    def _check_open(self) -> None:
        if not self._started or self._stopping:
            raise RegistryUnavailable("the registry is not started, or stopped")

    def _request(self, what: str, send: Callable[[], Any]) -> Any:
        """Wait for the connection, send one request and wait for its answer, all within
        request_timeout_s; translate every kazoo outcome into a RegistryUnavailable (sub)class."""
        self._check_open()
        deadline = time.monotonic() + self.request_timeout_s
        if not self._connected.wait(self.request_timeout_s):
            raise RegistryUnavailable(
                f"{what}: not connected to ZooKeeper at {self.connect_string} "
                f"(waited {self.request_timeout_s:g} s)"
            )
        try:
            return send().get(timeout=max(0.0, deadline - time.monotonic()))
        except KazooTimeoutError:
            raise RegistryUnavailable(
                f"{what}: no answer from ZooKeeper at {self.connect_string} within "
                f"{self.request_timeout_s:g} s"
            ) from None
        except KazooException as error:
            for kazoo_error, outcome in _KAZOO_OUTCOMES:
                if isinstance(error, kazoo_error):
                    raise outcome(f"{what}: {type(error).__name__}") from None
            raise RegistryUnavailable(
                f"{what}: ZooKeeper at {self.connect_string}: {type(error).__name__} {error}"
            ) from error

    def _create(
        self, path: str, data: bytes, *, ephemeral: bool = False, makepath: bool = False
    ) -> None:
        self._request(
            f"create {path}",
            lambda: self._client.create_async(path, data, ephemeral=ephemeral, makepath=makepath),
        )

    def _get(self, path: str) -> tuple[bytes, _Stat]:
        data, stat = self._request(f"read {path}", lambda: self._client.get_async(path))
        return bytes(data or b""), _Stat(version=stat.version, ephemeral_owner=stat.ephemeralOwner)

    def _children(self, path: str, watch: Callable[[Any], None] | None = None) -> list[str]:
        children = self._request(
            f"list {path}", lambda: self._client.get_children_async(path, watch=watch)
        )
        return sorted(str(child) for child in children)

    def _set(self, path: str, data: bytes, version: int) -> None:
        self._request(f"write {path}", lambda: self._client.set_async(path, data, version))

    def _delete(self, path: str, version: int = -1) -> None:
        self._request(f"delete {path}", lambda: self._client.delete_async(path, version))

    def _ensure_path(self, path: str) -> None:
        self._request(f"create {path}", lambda: self._client.ensure_path_async(path))
