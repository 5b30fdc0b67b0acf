"""What the console's pages show, read with the client library pylogctl uses: Admin for the
brokers, topics and partitions; the registry in ZooKeeper (found through the broker, as
pylogctl's group commands find it) for health, groups, quotas and live settings; GroupReader
for lag, describe_mirror for mirrors, PartitionConsumer for messages.

Every call blocks, each broker or ZooKeeper request bounded by the console's --timeout (no
retries, as pylogctl's); cli.web.app runs them in threads under the page's timeout. Errors are
the library's own (BrokerError, Unavailable, PylogError), and NotFound and BadRequest for what a
page's address names wrongly.
"""

from __future__ import annotations

import collections
import contextlib
import datetime
import logging
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from broker.client import Admin
from broker.client.admin import PartitionDescription, ZooKeeperAddress, zookeeper_of
from broker.client.cluster import Cluster
from broker.client.consumer import PartitionConsumer, Start
from broker.client.lag import GroupLag
from broker.config import LIVE_SETTINGS, setting_name
from broker.errors import BrokerError, PylogError
from broker.groups.lag import GroupReader
from broker.log.message import Message
from broker.mirror.config import MirrorConfig, MirrorConfigError
from broker.mirror.lag import MirrorLag, describe_mirror, mirror_clusters
from broker.protocol import EARLIEST, LATEST, ClusterBroker, ConfigEntry, ErrorCode
from broker.quotas import Kind, Quota, QuotaConfig
from broker.registry import DEFAULT_CHROOT, Registry
from broker.security import ClientKeys, ZooKeeperAuth
from cli.cluster_commands import Health, check
from cli.web.history import LagHistory

log = logging.getLogger("pylog.console")

CLIENT_ID = "pylog-console"
RETRIES = 0
"""As pylogctl's: a broker that does not answer is reported after one --timeout."""
PAGE_MESSAGES = 50
MAX_PAGE_MESSAGES = 500
FETCH_BYTES = 1 << 20
"""The bytes of one fetch of the message browser."""
PAGE_READ_BYTES = 4 << 20
"""The most a page of messages reads from the broker."""
END_BYTES = 256 << 10
"""How far before the high watermark a page "from the end" starts reading, at least."""
TIME_SEARCH_STEPS = 48


class NotFound(Exception):
    """What the page's address names does not exist: a topic, a partition, a group."""


class BadRequest(Exception):
    """The page's address or form is malformed: the message says how."""


@dataclass(frozen=True)
class Target:
    """The cluster and how to reach it: pylog-console's options."""

    broker: str
    timeout_s: float
    keys: ClientKeys | None = None
    zookeeper: str | None = None
    chroot: str | None = None
    zookeeper_auth: ZooKeeperAuth | None = None
    mirror_configs: tuple[Path, ...] = ()


@dataclass(frozen=True)
class ClusterView:
    brokers: tuple[ClusterBroker, ...]
    leads: dict[int, int]
    """Broker id -> how many partitions it leads."""
    health: Health


@dataclass(frozen=True)
class TopicRow:
    name: str
    partitions: int
    offline: int
    """Partitions without a leader serving them."""
    under_replicated: int
    error: str | None = None


@dataclass(frozen=True)
class TopicView:
    name: str
    settings: tuple[ConfigEntry, ...]
    partitions: list[PartitionDescription]
    """Offline ones first, then under-replicated ones, then the rest, each by number."""


@dataclass(frozen=True)
class GroupRow:
    name: str
    members: list[str]
    topics: list[str]


@dataclass(frozen=True)
class MirrorView:
    path: Path
    source: str
    target: str
    lags: list[MirrorLag]
    error: str | None = None


@dataclass(frozen=True)
class SettingsView:
    quotas: QuotaConfig
    broker_settings: dict[str, dict[str, str]]
    """Entry ("default" or a broker id) -> dotted setting name -> value."""
    live: list[str]
    """The settings that can be changed live."""


@dataclass(frozen=True)
class Position:
    """Where a page of messages starts: `offset`, past the first `skip` messages there (those
    of a compressed set, which share its offset, shown on the page before)."""

    offset: int
    skip: int = 0


@dataclass(frozen=True)
class MessagePage:
    topic: str
    partition: int
    messages: list[Message]
    sets: frozenset[int]
    """The offsets of compressed sets on the page (their messages share them)."""
    next: Position
    at_end: bool
    """Whether the page reached the high watermark."""
    log_start: int | None
    high_watermark: int | None


def parse_start(text: str) -> Start | None:
    """The browser's `from`: "earliest", an offset or an ISO time (UTC unless it says
    otherwise) as PartitionConsumer's start, None for "end"; BadRequest for anything else."""
    text = text.strip()
    if text == "end":
        return None
    if text == "earliest":
        return "earliest"
    if text.isdecimal():
        return int(text)
    try:
        moment = datetime.datetime.fromisoformat(text)
    except ValueError:
        raise BadRequest(
            f"from {text!r}: give earliest, end, an offset (a byte position) or an ISO time "
            "such as 2026-11-30T08:00"
        ) from None
    return moment if moment.tzinfo else moment.replace(tzinfo=datetime.UTC)


class Reads:
    """The console's reads of one cluster. The registry is opened on first use and kept (its
    ZooKeeper client reconnects by itself); every other call opens its own connections."""

    def __init__(self, target: Target, history: LagHistory | None = None) -> None:
        self.target = target
        self.history = history if history is not None else LagHistory()
        self._registry: Registry | None = None
        self._lock = threading.Lock()

    def close(self) -> None:
        with self._lock:
            if self._registry is not None:
                self._registry.stop()
                self._registry = None

    @contextlib.contextmanager
    def admin(self) -> Iterator[Admin]:
        target = self.target
        with Admin(
            target.broker, timeout_s=target.timeout_s, retries=RETRIES, keys=target.keys
        ) as admin:
            yield admin

    @contextlib.contextmanager
    def cluster(self) -> Iterator[Cluster]:
        target = self.target
        with Cluster(target.broker, CLIENT_ID, target.timeout_s, RETRIES, keys=target.keys) as c:
            yield c

    def registry(self) -> Registry:
        """The registry, opened now if it is not yet (where --zookeeper says, else where the
        broker's cluster keeps it)."""
        with self._lock:
            if self._registry is None:
                target = self.target
                if target.zookeeper is not None:
                    address = ZooKeeperAddress(target.zookeeper, target.chroot or DEFAULT_CHROOT)
                else:
                    found = zookeeper_of(
                        target.broker,
                        timeout_s=target.timeout_s,
                        retries=RETRIES,
                        keys=target.keys,
                    )
                    address = ZooKeeperAddress(found.connect, target.chroot or found.chroot)
                registry = Registry(
                    address.connect,
                    address.chroot,
                    request_timeout_s=target.timeout_s,
                    auth=target.zookeeper_auth,
                )
                registry.start(timeout=target.timeout_s)
                self._registry = registry
            return self._registry

    # The pages.

    def cluster_view(self) -> ClusterView:
        """The brokers, and the cluster's health as `pylogctl cluster health` says it (with
        the registry's error in it when ZooKeeper cannot be read)."""
        with self.admin() as admin:
            described = admin.describe_cluster()
            leads = collections.Counter(
                p.broker_id for t in admin.metadata().topics for p in t.partitions
            )
            try:
                registry = self.registry()
            except PylogError as error:
                zookeeper = f"{described.zookeeper_connect} chroot {described.zookeeper_chroot}"
                health = Health(zookeeper, "", error=f"the registry could not be read: {error}")
            else:
                health = check(
                    registry, admin, registry.session.connect_string, registry.session.chroot
                )
        return ClusterView(described.brokers, dict(leads), health)

    def topics(self) -> list[TopicRow]:
        """Every topic: those with offline partitions first, then those with under-replicated
        ones, then the rest, each by name."""
        with self.admin() as admin:
            metadata = admin.metadata()
        rows = []
        for info in metadata.topics:
            if info.error_code != ErrorCode.NONE:
                rows.append(TopicRow(info.topic, 0, 0, 0, ErrorCode(info.error_code).name))
                continue
            offline = sum(1 for p in info.partitions if p.error_code or p.broker_id < 0)
            under = sum(1 for p in info.partitions if p.replicas and len(p.isr) < len(p.replicas))
            rows.append(TopicRow(info.topic, len(info.partitions), offline, under))
        return sorted(
            rows, key=lambda r: (0 if r.offline else 1 if r.under_replicated else 2, r.name)
        )

    def topic(self, name: str) -> TopicView:
        with self.admin() as admin:
            try:
                settings = admin.topic_config(name)
                partitions = admin.describe_partitions(name)
            except BrokerError as error:
                if error.code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION:
                    raise NotFound(f"no topic {name!r} in this cluster") from None
                raise

        def order(p: PartitionDescription) -> tuple[int, int]:
            offline = p.state is None
            return (0 if offline else 1 if len(p.isr) < len(p.replicas) else 2, p.partition)

        return TopicView(name, settings, sorted(partitions, key=order))

    def groups(self) -> list[GroupRow]:
        with self.group_reader() as reader:
            return [
                GroupRow(name, sorted(reader.groups.group_members(name)), reader.topics(name))
                for name in reader.groups.names()
            ]

    def group(self, name: str, viewed: bool = True) -> GroupLag:
        """The group's lag (as `pylogctl group describe` reads it), recorded in the history."""
        with self.group_reader() as reader:
            lag = reader.describe(name)
            if not (lag.topics or lag.members) and name not in reader.groups.names():
                raise NotFound(f"no consumer group {name!r}: nothing committed, owned or consuming")
        self.history.record(lag, viewed)
        return lag

    @contextlib.contextmanager
    def group_reader(self) -> Iterator[GroupReader]:
        target = self.target
        registry = self.registry()
        with Cluster((), CLIENT_ID, target.timeout_s, RETRIES, keys=target.keys) as cluster:
            yield GroupReader(registry.groups, registry.topics, registry.brokers, cluster, RETRIES)

    def mirrors(self) -> list[MirrorView]:
        """Each mirror of --mirror-config: its partitions' lag, or why it cannot be read."""
        return [self._mirror(path) for path in self.target.mirror_configs]

    def _mirror(self, path: Path) -> MirrorView:
        try:
            config = MirrorConfig.load(path)
        except MirrorConfigError as error:
            return MirrorView(path, "-", "-", [], str(error))
        source, target = config.source.bootstrap, config.target.bootstrap
        try:
            with mirror_clusters(config, self.target.timeout_s, RETRIES) as clusters:
                lags = describe_mirror(config, *clusters)
        except PylogError as error:
            return MirrorView(path, source, target, [], _error_text(error))
        return MirrorView(path, source, target, lags)

    def settings(self) -> SettingsView:
        registry = self.registry()
        live = sorted(setting_name(name) for name in LIVE_SETTINGS)
        return SettingsView(registry.quotas.read(), dict(registry.settings.read()), live)

    def messages(
        self, topic: str, partition: int, start: str, skip: int, count: int
    ) -> MessagePage:
        """A page of at most `count` messages of the partition from `start` (parse_start),
        past `skip` of them; from "end", the last `count` before the high watermark (found
        through the time index). Reads at most PAGE_READ_BYTES."""
        if not 1 <= count <= MAX_PAGE_MESSAGES:
            raise BadRequest(f"count {count}: 1 to {MAX_PAGE_MESSAGES} messages a page")
        where = parse_start(start)
        target = self.target
        with self.cluster() as cluster:
            try:
                consumer = PartitionConsumer(
                    target.broker,
                    topic,
                    partition,
                    start="earliest" if where is None else where,
                    fetch_bytes=FETCH_BYTES,
                    max_wait_ms=0,
                    stop_at_end=True,
                    retries=RETRIES,
                    client_id=CLIENT_ID,
                    timeout_s=target.timeout_s,
                    cluster=cluster,
                )
            except BrokerError as error:
                if error.code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION:
                    raise NotFound(f"no partition {partition} of topic {topic!r}") from None
                raise
            with consumer:
                if where is None:
                    consumer.seek(_near_end(consumer))
                    skip = 0
                first = consumer.position
                wanted = skip + count + 1
                read: collections.deque[Message] | list[Message]
                read = collections.deque(maxlen=count) if where is None else []
                while (where is None or len(read) < wanted) and (
                    consumer.position - first < PAGE_READ_BYTES
                ):
                    fetched = consumer.poll(0)
                    read.extend(fetched)
                    if not fetched or consumer.at_end:
                        break
                got = list(read)
                shown = got[skip : skip + count]
                following = got[skip + count] if len(got) > skip + count else None
                if following is None:
                    nxt = Position(consumer.position)
                else:
                    same = sum(1 for m in got[: skip + count] if m.offset == following.offset)
                    nxt = Position(following.offset, same)
                offsets = collections.Counter(m.offset for m in got)
                return MessagePage(
                    topic,
                    partition,
                    shown,
                    frozenset(o for o, n in offsets.items() if n > 1),
                    nxt,
                    following is None and consumer.at_end,
                    consumer.log_start_offset,
                    consumer.high_watermark,
                )

    # Changes, with --allow-changes only (cli.web.app checks it), each logged with its author.

    def set_broker_setting(self, who: str, entry: str, name: str, value: str) -> None:
        stored = self.registry().settings.set(entry, {name: value})
        log.warning(
            "change by %s: live setting %s=%s for %s (now %s)", who, name, value, entry, stored
        )

    def delete_broker_setting(self, who: str, entry: str, name: str) -> None:
        try:
            self.registry().settings.delete(entry, (name,))
        except KeyError:
            raise BadRequest(f"{name} is not set for {entry}") from None
        log.warning("change by %s: live setting %s deleted for %s", who, name, entry)

    def set_quota(self, who: str, kind: Kind, name: str, quota: Quota) -> None:
        stored = self.registry().quotas.set(kind, name, quota)
        log.warning("change by %s: quota of %s %s set to %s", who, kind, name, stored)

    def delete_quota(self, who: str, kind: Kind, name: str) -> None:
        try:
            self.registry().quotas.delete(kind, name)
        except KeyError:
            raise BadRequest(f"{kind} {name} has no quota") from None
        log.warning("change by %s: quota of %s %s deleted", who, kind, name)


def _near_end(consumer: PartitionConsumer) -> int:
    """A message boundary at least END_BYTES before the partition's high watermark (its log
    start when it holds less): the offset of a time found by halving, with OFFSETS, the range
    from the epoch to a day from now, the nearest boundary to the end that is that far."""
    start, end = consumer.offset_for_time(EARLIEST), consumer.offset_for_time(LATEST)
    if end - start <= END_BYTES:
        return start
    best, low, high = start, 0, int(datetime.datetime.now(datetime.UTC).timestamp() * 1000)
    high += 86_400_000
    for _ in range(TIME_SEARCH_STEPS):
        if high - low <= 1:
            break
        middle = (low + high) // 2
        offset = consumer.offset_for_time(middle)
        if offset <= end - END_BYTES:
            best, low = max(best, offset), middle
        else:
            high = middle
    return best


def _error_text(error: PylogError) -> str:
    if isinstance(error, BrokerError):
        return f"{error.name}: {error.message}"
    return f"{type(error).__name__}: {error}"
