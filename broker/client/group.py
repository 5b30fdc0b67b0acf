"""A member of a consumer group: the group shares the partitions of its topics, coordinated
by the brokers (given `broker`: docs/protocol.md "Consumer groups", broker.client.membership)
or through ZooKeeper as in the Kafka paper (section 3.2; given `zookeeper`: docs/registry.md
has the paths, and the rest of this text is that protocol's but where it says otherwise).

Through the coordinator, a heartbeat thread (broker.client.membership.Heartbeats) keeps the
member in the group and learns its assignment; the thread that polls follows it at its next
poll: partitions taken away are given up (fetching stopped, `on_revoked`, positions committed
with auto-commit, reported at once), partitions given are read from the group's committed
offsets (`on_assigned`), and those that stay are read on. Within its lease only (its session
since it sent its last answered heartbeat) does it hand out records. Told it is unknown or
fenced, it drops its partitions without committing and joins again.


Every partition of a subscribed topic is consumed by exactly one member of the group at a time;
groups are independent of each other. A member:

- registers itself (ephemeral /consumers/<group>/ids/<consumer_id>) and watches the group's
  members, the brokers and the topics; any change triggers a rebalance;
- rebalances in the thread that calls `poll`: unless its range is what it owns already (then
  it reads on from where it is), it stops its fetches, calls `on_revoked`, commits
  (with auto-commit), releases its owner nodes, sorts the topic's partitions (those with a
  replica on a live broker, by preferred leader's id and partition) and the members subscribed
  to the topic, takes its contiguous range (the first len(P) % len(C) members take one more),
  and claims each partition with an ephemeral owner node. A partition still owned by another
  member makes it release all it claimed, back off and start again, at most
  `rebalance_retries` times; then RebalanceFailed;
- reads each partition from the group's committed offset, or, when none is committed, from the
  earliest or latest offset (`reset`). A committed offset that retention has deleted (the
  broker answers OFFSET_OUT_OF_RANGE) is reset the same way, logged and counted
  (`offset_resets`).

Delivery is at least once. A record counts as processed when the application asks for the
next one: the next `poll()` call for the records a poll returned, the next step of the iteration
for a record `for record in member` gave. `commit()` also counts every record handed out so far
as processed, the one in hand included. Auto-commit (every `auto_commit_interval_s`, checked at
each poll and each step of the iteration), the rebalance commit and `close()` record only the
processed records, so a `break` out of the loop, an exception in the handler or a crash leaves
the record in hand (and everything after it) to be read again by the partition's next owner.
Records fetched and not handed out stay with the member: a loop over it entered again goes on
with the next record.

Losing ZooKeeper: while the registry is disconnected the member returns no messages (its owner
nodes may be about to expire and another member to take the partitions over); kazoo notices a
lost connection after about two thirds of the session timeout, before the server expires the
session. If the session did expire, the member's ownership ended with it: it drops its
partitions without committing (their new owners may have committed since) and rebalances.

Damaged data on a broker's disk (docs/storage.md, "Damaged data") raises CorruptSegment naming
its offsets, after the records before it, at every poll until it is read past; with
`skip_corrupt` the member logs it, lists it in `skipped` and reads on after it, as
PartitionConsumer does.

Fetches are pipelined: one FETCH in flight per owned partition, each on the connection to the
partition's leader, so an idle partition's long poll never holds up a busy one. Leadership
moves (docs/replication.md): the leaders are asked by METADATA (version 2) when partitions are
claimed; a fetch answered NOT_LEADER_FOR_PARTITION naming a broker this member knows goes
there next, and after any other retriable error or no reply the partition's leader is asked
again by METADATA before its next fetch (each after the partition's rest, RETRY_BACKOFF_S).
A partition whose preferred leader is down is assigned as long as one of its replicas is
registered (another one may lead it); its node under /consumers keeps the preferred leader's
id.

Not safe to share between threads (the watches only set a flag that `poll` reads).
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Generic, Literal, NamedTuple, cast

from typing_extensions import TypeVar

from broker.backoff import Backoff
from broker.client.cluster import Cluster
from broker.client.connection import DEFAULT_CLIENT_ID, Connection, noted, wait_ms
from broker.client.consumer import (
    DEFAULT_FETCH_BYTES,
    MAX_FETCH_BYTES,
    corrupt_segment_reply,
    damaged_range,
    grown_fetch_bytes,
)
from broker.client.coordinator import GroupCalls
from broker.client.membership import Heartbeats, Membership
from broker.clock import SYSTEM_CLOCK, Clock
from broker.errors import (
    BrokerError,
    CorruptSegment,
    MalformedReply,
    PartitionNotAssigned,
    PylogError,
    RegistryUnavailable,
    Unavailable,
    UnknownTopicOrPartition,
)
from broker.groups.assignors import TopicPartition, contiguous_share
from broker.lifecycle import Closing
from broker.log.codec import decode_records
from broker.log.message import Headers
from broker.protocol import (
    EARLIEST,
    LATEST,
    Api,
    ErrorCode,
    FetchPart,
    FetchReply,
    FetchRequest,
    MultiFetchRequest,
    OffsetsRequest,
    decode_fetch_part,
    decode_reply,
    request_version,
)
from broker.registry import DEFAULT_CHROOT, Registry, TopicConfig, partition_name
from broker.security import ClientKeys, ZooKeeperAuth

log = logging.getLogger("pylog.group")

Reset = Literal["earliest", "latest"]
RETRY_BACKOFF_S = 0.5
"""How long a partition rests after a retriable fetch error before it is fetched again."""
REBALANCE_MAX_BACKOFF_S = 2.0
"""The longest wait between a rebalance's attempts (from rebalance_backoff_s, doubling)."""
DEFAULT_MAX_POLL_INTERVAL_S = 300.0
"""A member's processing deadline by default (Kafka's max.poll.interval.ms)."""
MAX_POLL_INTERVAL_S = (2**31 - 1) / 1000
"""The longest: rebalance_timeout_ms is an i32 of milliseconds on the wire."""


class RebalanceFailed(PylogError):
    """A rebalance could not claim its partitions within its retries: other members kept
    owning them (a member that is stuck, or more rebalances than the back-off allows)."""


@dataclass(frozen=True, order=True, slots=True)
class BrokerPartition:
    """A partition of a topic and the broker that holds it."""

    topic: str
    broker_id: int
    partition: int

    @property
    def name(self) -> str:
        """The name under /consumers: "<broker_id>-<partition>"."""
        return partition_name(self.broker_id, self.partition)


class Record(NamedTuple):
    """A message as a group member receives it."""

    topic: str
    partition: int
    offset: int
    timestamp_ms: int
    key: bytes | None
    value: bytes
    headers: Headers = ()
    """(key, value or None) pairs, in order; () for a message without."""
    next_offset: int = -1
    """Where the next message starts: what to commit to have read this one (the offset of
    the message after it, or of the set after it for the last message of a compressed set;
    a message of a set before its last has its own offset here: committed, the whole set is
    read again). -1 only in a Record made by hand."""


R = TypeVar("R", bound=tuple[Any, ...], default=Record)
"""What a member hands out: Records, or records of another tuple type of Record's layout
(the Kafka-shaped consumer's Messages, broker.client.kafka), made straight from the fetched
bytes (broker.log.codec.decode_records)."""
OFFSET_AT: Final = Record._fields.index("offset")
NEXT_AT: Final = Record._fields.index("next_offset")
"""Where a record of any record type holds its offset, and its next offset."""


@dataclass(eq=False)
class _Owned:
    """An owned partition: what was handed out, what is fetched next, what is in flight."""

    tp: BrokerPartition
    endpoint: str
    position: int
    """The offset after the last processed record: what a commit records."""
    delivered: int
    """The offset after the last record handed out; `position` catches up with it when the
    application asks for the next record (or calls commit())."""
    committed: int | None
    fetch_offset: int = 0
    fetch_bytes: int = DEFAULT_FETCH_BYTES
    buffered: deque[Any] = field(default_factory=deque)
    """Records (of the member's record type) of the last fetch reply not handed out yet."""
    in_flight: tuple[Connection, int] | None = None
    sent_at: float = 0.0
    rest_until: float = 0.0
    located: bool = True
    """False after a fetch error that did not say where the leader is: METADATA is asked before
    the next fetch (GroupConsumer._locate)."""


def fetch_request(owned: Sequence[_Owned], wait_s: float) -> FetchRequest | MultiFetchRequest:
    """The next fetch of owned partitions led by one broker: a long poll of up to `wait_s`, one
    FETCH for one partition, a MULTI_FETCH for more (its limit the sum of theirs)."""
    wait_ms = round(wait_s * 1000)
    if len(owned) == 1:
        tp = owned[0].tp
        return FetchRequest(
            tp.topic, tp.partition, owned[0].fetch_offset, owned[0].fetch_bytes, wait_ms, 1
        )
    parts = tuple(
        FetchPart(o.tp.topic, o.tp.partition, o.fetch_offset, o.fetch_bytes) for o in owned
    )
    return MultiFetchRequest(-1, wait_ms, 1, sum(o.fetch_bytes for o in owned), parts)


def fetch_replies(fetched: Sequence[_Owned], frames: list[Any]) -> list[FetchReply | BrokerError]:
    """Each partition's answer in the reply to `fetch_request(fetched, ...)`: its FetchReply, or
    the BrokerError it was answered (a MULTI_FETCH refused whole: each part that error).
    MalformedReply for a reply that is not one, or whose parts are not those asked for."""
    if len(fetched) == 1:
        try:
            return [noted(decode_reply(Api.FETCH, frames, request_version(Api.FETCH)))]
        except BrokerError as error:
            return [error]
    try:
        parts = noted(decode_reply(Api.MULTI_FETCH, frames)).parts
    except BrokerError as error:
        return [error] * len(fetched)
    asked = [(o.tp.topic, o.tp.partition) for o in fetched]
    if [(p.topic, p.partition) for p in parts] != asked:
        raise MalformedReply(f"a MULTI_FETCH reply's parts are not those asked for, {asked}")
    replies: list[FetchReply | BrokerError] = []
    for part in parts:
        try:
            replies.append(decode_fetch_part(part))
        except BrokerError as error:
            replies.append(error)
    return replies


def default_consumer_id() -> str:
    """<host>-<pid>-<random>: unique, and telling an operator where the member runs."""
    host = "".join(c if c.isalnum() or c in "._-" else "_" for c in socket.gethostname())
    return f"{host or 'host'}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


def assign_range(
    partitions: Sequence[BrokerPartition], members: Sequence[str], me: str
) -> list[BrokerPartition]:
    """The paper's range assignment: `me`'s contiguous share of the sorted `partitions` among
    the sorted `members` (the first len(partitions) % len(members) members take one more)."""
    ordered = sorted(partitions, key=lambda tp: (tp.broker_id, tp.partition))
    ranked = sorted(members)
    if me not in ranked:
        return []
    return ordered[contiguous_share(len(ordered), len(ranked), ranked.index(me))]


def _on_partition_count(wanted: threading.Event) -> Callable[[TopicConfig | None], bool]:
    """A watch of a topic's node that asks for a rebalance when its partition count changes
    (partitions added: `pylogctl topic add-partitions`), not when its settings do."""
    seen: list[int] = []

    def changed(config: TopicConfig | None) -> bool:
        if config is not None:
            if seen and seen[-1] != config.partitions:
                wanted.set()
            seen.append(config.partitions)
            del seen[:-1]
        return True  # watched as long as the registry runs

    return changed


class GroupConsumer(Closing, Generic[R]):
    """Consume `topics` as member `consumer_id` of `group`: with `broker` ("host:port",
    several comma-separated) and `zookeeper` None, through the group's coordinator (the
    module's text: a member then needs only a broker's address; `session_timeout_s` from 2 to
    300); or through the ZooKeeper ensemble `zookeeper` ("host:port[,...]") and registry
    `chroot` (default /pylog), the paper's protocol (`rebalance_retries`,
    `rebalance_backoff_s`, `chroot` and `zookeeper_auth` are its alone).

    `on_assigned(partitions)` runs after a rebalance claimed them, `on_revoked(partitions)`
    before they are committed and released (both in the thread calling `poll`), so a user can
    flush state or commit; `on_lost(partitions)` (default: `on_revoked`) when they were lost
    without a commit (a session that expired; the coordinator no longer knowing the member),
    their next owner reading from the last commit. `auto_commit_interval_s` None turns
    auto-commit off: then only `commit()` commits. `skip_corrupt` reads past damaged data
    instead of raising CorruptSegment (see the module's text). `keys`
    (broker.security.ClientKeys: the client's key pair and the brokers' public key) reach
    brokers serving CurveZMQ (docs/security.md); without them the member speaks plaintext.
    `zookeeper_auth` (broker.security.ZooKeeperAuth) is the ZooKeeper digest identity the member
    presents to a registry with ACLs: the group's nodes are its identity's, and every member of
    the group presents the same one (docs/registry.md, "Who may write what"). `clock`
    (broker.clock) times auto-commits, the rests of partitions after errors and the fetches
    overdue. `record_type` (default Record) is what it hands out: a tuple type of Record's
    layout without a __dict__, each made from the fetched bytes, no Record between."""

    def __init__(
        self,
        zookeeper: str | None,
        group: str,
        topics: Iterable[str],
        *,
        broker: str | None = None,
        chroot: str | None = None,
        consumer_id: str | None = None,
        reset: Reset = "earliest",
        auto_commit_interval_s: float | None = 5.0,
        on_assigned: Callable[[frozenset[BrokerPartition]], object] | None = None,
        on_revoked: Callable[[frozenset[BrokerPartition]], object] | None = None,
        on_lost: Callable[[frozenset[BrokerPartition]], object] | None = None,
        max_wait_ms: int = 500,
        fetch_bytes: int = DEFAULT_FETCH_BYTES,
        session_timeout_s: float = 6.0,
        rebalance_retries: int = 10,
        rebalance_backoff_s: float = 0.2,
        client_id: str = DEFAULT_CLIENT_ID,
        timeout_s: float = 10.0,
        skip_corrupt: bool = False,
        keys: ClientKeys | None = None,
        zookeeper_auth: ZooKeeperAuth | None = None,
        clock: Clock = SYSTEM_CLOCK,
        record_type: type[R] | None = None,
        instance_id: str | None = None,
        assignor: str | None = None,
        max_poll_interval_s: float = DEFAULT_MAX_POLL_INTERVAL_S,
    ) -> None:
        if reset not in ("earliest", "latest"):
            raise ValueError(f"reset {reset!r}: use earliest or latest")
        self.group = group
        self.topics = tuple(sorted(set(topics)))
        if not self.topics:
            raise ValueError("a group consumer needs at least one topic")
        self.consumer_id = consumer_id or default_consumer_id()
        self.clock = clock
        self.record_type = record_type if record_type is not None else cast("type[R]", Record)
        self.reset: Reset = reset
        self.auto_commit_interval_s = auto_commit_interval_s
        self.on_assigned = on_assigned
        self.on_revoked = on_revoked
        self.on_lost = on_lost
        self.max_wait_ms = max_wait_ms
        self.fetch_bytes = fetch_bytes
        self.rebalance_retries = rebalance_retries
        self.rebalance_backoff_s = rebalance_backoff_s
        self.timeout_s = timeout_s
        self.skip_corrupt = skip_corrupt
        self.skipped: list[tuple[BrokerPartition, int, int]] = []
        """The damaged ranges read past with `skip_corrupt`: partition, [start, end) offsets."""
        self.offset_resets = 0
        """Partitions read from `reset` because their committed offset was out of range."""
        self.rebalances = 0
        self._owned: dict[BrokerPartition, _Owned] = {}
        self._claim_session: int | None = None
        self._in_flight: dict[tuple[Connection, int], list[_Owned]] = {}
        """The fetches in flight, each of one partition (FETCH) or of several at one broker
        (MULTI_FETCH), by connection and correlation id."""
        self._rotation = 0
        """Where a MULTI_FETCH's parts start among a broker's partitions: moved on each time,
        so that a reply full of the first parts' messages starves none of the others."""
        self._rebalance_wanted = threading.Event()
        self._next_commit = self.clock.monotonic() + (auto_commit_interval_s or 0)
        self._closed = False
        self._interrupted = False
        self.registry: Registry | None = None
        """The paper's protocol: the registry the member runs it through."""
        self._heartbeats: Heartbeats | None = None
        """The coordinated protocol: the heartbeat thread and the member's state."""
        if zookeeper is None:
            if broker is None:
                raise ValueError("a group consumer needs a broker's address or ZooKeeper's")
            if chroot is not None or zookeeper_auth is not None:
                raise ValueError(
                    "chroot and zookeeper_auth are for a member of the paper's protocol "
                    "(zookeeper given); a member through `broker` needs neither"
                )
            if not 0 < max_poll_interval_s <= MAX_POLL_INTERVAL_S:
                raise ValueError(
                    f"max_poll_interval_s {max_poll_interval_s}: more than 0, at most "
                    f"{MAX_POLL_INTERVAL_S:g}"
                )
            membership = Membership(
                group,
                self.consumer_id,
                self.topics,
                round(session_timeout_s * 1000),
                round(max_poll_interval_s * 1000),
                instance_id or "",
                assignor or "",
                polled_at=self.clock.monotonic(),
            )
            self._join_coordinator(broker, client_id, timeout_s, keys, membership)
            return
        if broker is not None:
            raise ValueError("give a group consumer a broker's address or ZooKeeper's, not both")
        if instance_id is not None or assignor is not None:
            raise ValueError(
                "instance_id and assignor are for a member through the group's coordinator "
                "(broker given, zookeeper None)"
            )
        self._rebalance_wanted.set()  # the first poll joins
        self.cluster = Cluster((), client_id, timeout_s, keys=keys)
        self.registry = registry = Registry(
            zookeeper,
            chroot or DEFAULT_CHROOT,
            session_timeout_s=session_timeout_s,
            auth=zookeeper_auth,
        )
        try:
            self._start_registry(max(10.0, timeout_s))
            registry.register_consumer(group, self.consumer_id, self.topics)
            wanted = self._rebalance_wanted
            registry.watch_consumers(group, lambda _: wanted.set())
            registry.watch_brokers(lambda _: wanted.set())
            registry.watch_topic_configs(lambda _: wanted.set())
            for topic in self.topics:
                registry.watch_topic_config(topic, _on_partition_count(wanted))
        except BaseException:
            registry.stop()
            self.cluster.close()
            raise

    def _join_coordinator(
        self,
        broker: str,
        client_id: str,
        timeout_s: float,
        keys: ClientKeys | None,
        membership: Membership,
    ) -> None:
        """Join through the group's coordinator (docs/protocol.md, "Consumer groups"): a
        heartbeat thread of its own (broker.client.membership) sends the join and every
        heartbeat; the first poll waits for its answer."""
        self.cluster = Cluster(broker, client_id, timeout_s, keys=keys)
        self._commits = GroupCalls(broker, self.group, client_id, timeout_s, keys=keys)
        session_s = membership.session_timeout_ms / 1000
        beats = GroupCalls(broker, self.group, client_id, min(timeout_s, session_s / 2), keys=keys)
        self._heartbeats = Heartbeats(membership, beats, self.clock, self._rebalance_wanted)
        self._heartbeats.start()

    @property
    def _paper(self) -> Registry:
        """The registry of a member of the paper's protocol."""
        assert self.registry is not None, "a member through the coordinator has no registry"
        return self.registry

    def _start_registry(self, timeout_s: float) -> None:
        """Connect to ZooKeeper; when it cannot be reached, say that a broker's address is
        taken as `broker` (a pylog broker does not speak ZooKeeper's protocol, so the address
        of one given as `zookeeper` is never reached)."""
        registry = self._paper
        try:
            registry.start(timeout=timeout_s)
        except RegistryUnavailable as error:
            raise RegistryUnavailable(
                f"{error}; if {registry.connect_string} is a pylog broker, give it as "
                f"broker={registry.connect_string!r} and zookeeper None: the member joins "
                "through the group's coordinator"
            ) from None

    # -- what the member holds ---------------------------------------------------------------

    @property
    def assignment(self) -> frozenset[BrokerPartition]:
        """The partitions this member owns now."""
        return frozenset(self._owned)

    def positions(self) -> dict[BrokerPartition, int]:
        """Each owned partition's position: the offset after the last processed record."""
        return {tp: owned.position for tp, owned in self._owned.items()}

    # -- consuming ---------------------------------------------------------------------------

    def poll(self, max_wait_ms: int | None = None) -> list[R]:
        """The next messages of the owned partitions, waiting up to `max_wait_ms` (default
        the member's) for some; rebalances first when the group, the brokers or the topics
        changed. Returns nothing while ZooKeeper is unreachable. Calling it counts every record
        returned before as processed. TypeError for a float `max_wait_ms` (poll(1.0) would
        wait 1 ms)."""
        self._processed_all()
        self._fill(wait_ms(max_wait_ms, self.max_wait_ms))
        return self._take_buffered()

    def __iter__(self) -> Iterator[R]:
        """Messages for ever (until close or interrupt), one at a time: each counts as
        processed when the next one is asked for. Records fetched and not handed out stay
        with the member, so a loop left (break, an exception) and entered again goes on
        where it stopped, the record in hand counted as processed then."""
        while True:
            # asked for the next: the record in hand is processed (a break, an exception or
            # a close() while it was in hand never comes back here)
            self._processed_all()
            if self._closed or self._interrupted:
                return
            record = self._next_record(None)
            if record is not None:
                yield record

    def poll_record(self, max_wait_ms: int | None = None) -> R | None:
        """The next message, one at a time, waiting up to `max_wait_ms` (default the
        member's) for one; None when none came. Calling it counts the record it returned
        before as processed, as a step of `for record in member` does. TypeError for a float
        `max_wait_ms`."""
        self._processed_all()
        return self._next_record(wait_ms(max_wait_ms, self.max_wait_ms))

    def poll_records(self, limit: int, max_wait_ms: int | None = None) -> list[R]:
        """Up to `limit` records, as that many `poll_record` calls would hand them out, in one
        call: the bookkeeping (processed, auto-commit) once, not once a record; waiting up to
        `max_wait_ms` (default the member's) only when none is fetched yet. The records it
        returned before count as processed. ValueError for a `limit` under 1."""
        if limit < 1:
            raise ValueError(f"limit is {limit}: 1 or more")
        self._processed_all()
        self._auto_commit()
        records = self._hand_out_many(limit)
        if not records:
            self._fill(wait_ms(max_wait_ms, self.max_wait_ms))
            records = self._hand_out_many(limit)
        return records

    def _hand_out_many(self, limit: int) -> list[R]:
        """Up to `limit` records fetched and not handed out, now in hand (delivered), each
        partition's in order."""
        records: list[R] = []
        if self._lease_lapsed():
            return records
        for owned in self._owned.values():
            buffered = owned.buffered
            if not buffered:
                continue
            take = min(limit - len(records), len(buffered))
            if take == len(buffered):
                records += buffered
                buffered.clear()
            else:
                records += [buffered.popleft() for _ in range(take)]
            owned.delivered = buffered[0][OFFSET_AT] if buffered else owned.fetch_offset
            if len(records) >= limit:
                break
        return records

    def _next_record(self, max_wait_ms: int | None) -> R | None:
        """Hand out the next record fetched, or fetch (up to `max_wait_ms`) and hand out the
        first that came; auto-commit when due either way."""
        self._auto_commit()
        record = self._hand_out()
        if record is None:
            self._fill(max_wait_ms)
            record = self._hand_out()
        return record

    def seek(self, topic: str, partition: int, offset: int) -> None:
        """Read `partition` of `topic` from `offset` next (a message boundary: else the
        broker answers INVALID_OFFSET at the next fetch, raised by `poll`): the records
        fetched and not handed out are dropped, a fetch in flight is forgotten, and the
        position, what a commit records, becomes `offset`. ValueError when this member does
        not own the partition (now: a rebalance may take it)."""
        owned = self._owned_by_number().get((topic, partition))
        if owned is None:
            raise ValueError(f"{topic}/{partition} is not assigned to this member")
        self._forget_fetched(owned)
        owned.position = owned.delivered = owned.fetch_offset = offset
        owned.rest_until = 0.0

    def _forget_fetched(self, owned: _Owned) -> None:
        """Drop what was fetched for `owned`'s partition and not handed out, and forget its
        fetch in flight: its reply, if it comes, is dropped, and the broker's other partitions
        of that request are fetched again."""
        if owned.in_flight is not None:
            fetched = self._in_flight.pop(owned.in_flight)
            for other in fetched:
                other.in_flight = None
            owned.in_flight = None
        owned.buffered.clear()

    def _hand_out(self) -> R | None:
        """The next record fetched and not handed out, now in hand (delivered); None when
        there is none."""
        if self._lease_lapsed():
            return None
        for owned in self._owned.values():
            buffered = owned.buffered
            if buffered:
                record: R = buffered.popleft()
                owned.delivered = buffered[0][OFFSET_AT] if buffered else owned.fetch_offset
                return record
        return None

    def _lease_lapsed(self) -> bool:
        """A member through the coordinator past its lease, or lost: what it fetched is
        dropped (read again after its lease is renewed, or by the partitions' next owners),
        nothing handed out."""
        heartbeats = self._heartbeats
        if heartbeats is None or heartbeats.membership.may_hand_out(self.clock.monotonic()):
            return False
        self._stop_fetching()
        return True

    def interrupt(self) -> None:
        """End a `for record in member` loop at its next step, the record in hand counted as
        processed: within max_wait_ms when no message comes. It only sets a flag, so a signal
        handler may call it (raising there instead could land inside kazoo, whose bare
        `except:` would swallow the exception and leave the loop running)."""
        self._interrupted = True

    def _processed_all(self) -> None:
        """Count every record handed out as processed (the application asked for the next:
        for the coordinated protocol's processing deadline, it polled now)."""
        if self._heartbeats is not None:
            self._heartbeats.membership.polled_at = self.clock.monotonic()
        for owned in self._owned.values():
            owned.position = owned.delivered

    def _fill(self, max_wait_ms: int | None) -> None:
        """Rebalance when wanted, auto-commit when due, and unless records are buffered fetch,
        waiting up to `max_wait_ms` (default the member's) for some, then send the next
        fetches at once (as PartitionConsumer does: a broker reads them while the records
        are handed out and processed; their replies are taken once every record in hand is
        handed out); positions are left to the caller. A member through the coordinator goes
        on within the wait once its heartbeat thread's news came (its join answered, its
        partitions given)."""
        wait_s = (self.max_wait_ms if max_wait_ms is None else max_wait_ms) / 1000
        deadline = time.monotonic() + wait_s  # a real wait, whatever the member's clock
        while not self._filled(wait_s) and self._heartbeats is not None:
            wait_s = deadline - time.monotonic()
            if wait_s <= 0:
                return

    def _filled(self, wait_s: float) -> bool:
        """A step of `_fill`; False when it only waited (for the registry or the heartbeat
        thread, or for partitions), True when it fetched, or records are buffered."""
        if not self._in_session(wait_s):
            return False
        if self._rebalance_wanted.is_set() and not self._rebalanced():
            return True
        self._auto_commit()
        if self._buffered():
            return True
        if not self._owned:
            self._rebalance_wanted.wait(wait_s)
            return False
        self._send_fetches(wait_s)
        self._receive_fetches(wait_s)
        if self._buffered():  # the next fetches, read by the brokers while these are processed
            self._send_fetches(wait_s)
        return True

    def _buffered(self) -> bool:
        return any(owned.buffered for owned in self._owned.values())

    def _rebalanced(self) -> bool:
        """Rebalance; False when ZooKeeper or a broker went away meanwhile, or a broker has
        not heard yet of a partition the registry gave this member (partitions just added):
        the next poll tries again, METADATA asked again."""
        try:
            if self._heartbeats is None:
                self._rebalance()
            else:
                self._reconcile(self._heartbeats)
        except (Unavailable, BrokerError) as error:
            lagging = isinstance(error, UnknownTopicOrPartition)
            if isinstance(error, BrokerError) and not error.retriable and not lagging:
                raise
            if lagging:
                self.cluster.leaders.clear()
            log.warning("group %s: rebalance interrupted, will retry: %s", self.group, error)
            self._rebalance_wanted.set()
            return False
        return True

    @property
    def connected(self) -> bool:
        """Whether the member may go on: for the paper's protocol, connected to ZooKeeper; for
        the coordinated one, within its lease (broker.client.membership), or told it lost its
        partitions (which the next poll acts on)."""
        if self._heartbeats is None:
            return self._paper.connected
        membership = self._heartbeats.membership
        return membership.lost or membership.may_hand_out(self.clock.monotonic())

    def _wait_connected(self, wait_s: float) -> None:
        """Wait up to `wait_s` until `connected` (the coordinated protocol: for the heartbeat
        thread's news)."""
        if self._heartbeats is None:
            self._paper.wait_connected(wait_s)
        else:
            self._rebalance_wanted.wait(wait_s)

    def _in_session(self, wait_s: float) -> bool:
        """Whether the member may consume: connected to ZooKeeper, in the session that claimed
        its partitions (or, coordinated, within its lease, at the epoch that gave them). A
        suspended connection pauses it; an expired session ends ownership."""
        if not self.connected:
            self._stop_fetching()
            self._wait_connected(wait_s)
            return False
        if self._heartbeats is not None:
            return self._still_member(self._heartbeats)
        session = self._paper.session_id
        if self._owned and session != self._claim_session:
            lost = frozenset(self._owned)
            log.warning(
                "group %s: ZooKeeper session expired; %d partitions lost to the group",
                self.group,
                len(lost),
            )
            self._stop_fetching()
            self._owned.clear()
            self._lost(lost)
            self._rebalance_wanted.set()
        return True

    def _still_member(self, heartbeats: Heartbeats) -> bool:
        """The coordinated protocol: raise what the coordinator refused for good; after
        UNKNOWN_MEMBER_ID or FENCED_MEMBER_EPOCH drop every partition, uncommitted (their next
        owner may have committed since), and let the heartbeat thread join again."""
        if heartbeats.failure is not None:
            raise heartbeats.failure
        with heartbeats.lock:
            lost = heartbeats.membership.lost
        if not lost:
            return True
        dropped = frozenset(self._owned)
        self._stop_fetching()
        self._owned.clear()
        if dropped:
            log.warning(
                "group %s: %s lost its %d partitions to the group; joining again",
                self.group,
                self.consumer_id,
                len(dropped),
            )
            self._lost(dropped)
        heartbeats.report(frozenset(), dropped_all=True)
        return False

    def _lost(self, partitions: frozenset[BrokerPartition]) -> None:
        """Tell the application of partitions lost without a commit: `on_lost`, or, without
        one, `on_revoked`."""
        told = self.on_lost or self.on_revoked
        if told is not None:
            told(partitions)

    def _take_buffered(self) -> list[R]:
        """Every record fetched and not handed out, now handed out (delivered)."""
        records: list[R] = []
        if self._lease_lapsed():
            return records
        for owned in self._owned.values():
            if owned.buffered:
                records += owned.buffered
                owned.buffered.clear()
                owned.delivered = owned.fetch_offset  # a batch is one whole reply
        return records

    def _send_fetches(self, wait_s: float) -> None:
        """Fetch every owned partition not in flight nor resting: one request a broker, a
        MULTI_FETCH for two partitions or more there, a FETCH for one."""
        now = self.clock.monotonic()
        by_endpoint: dict[str, list[_Owned]] = {}
        for owned in self._owned.values():
            if owned.in_flight is not None or owned.rest_until > now:
                continue
            if not owned.located and not self._locate(owned):
                continue
            by_endpoint.setdefault(owned.endpoint, []).append(owned)
        for endpoint, owned_there in self._rotated(by_endpoint).items():
            request = fetch_request(owned_there, wait_s)
            connection = self.cluster.connect(endpoint)
            key = (connection, connection.send_pipelined(request))
            for owned in owned_there:
                owned.in_flight, owned.sent_at = key, now
            self._in_flight[key] = owned_there

    def _rotated(self, by_endpoint: dict[str, list[_Owned]]) -> dict[str, list[_Owned]]:
        """Each broker's partitions to fetch, their order moved on by one from the last
        round's (`_rotation`)."""
        self._rotation += 1
        rotated = {}
        for endpoint, owned_there in by_endpoint.items():
            start = self._rotation % len(owned_there)
            rotated[endpoint] = owned_there[start:] + owned_there[:start]
        return rotated

    def _receive_fetches(self, wait_s: float) -> None:
        """Wait up to `wait_s` for a first reply, then take every reply already there."""
        if not self._in_flight:
            return
        deadline = self.clock.monotonic() + wait_s
        while self._in_flight:
            if any(o.buffered for o in self._owned.values()):
                timeout_s = 0.0  # data to hand out: take only the replies already here
            else:
                timeout_s = max(0.0, deadline - self.clock.monotonic())
            connections = {connection for connection, _ in self._in_flight}
            try:
                connection, correlation_id, frames = self.cluster.receive_pipelined(
                    connections, timeout_s
                )
            except Unavailable:
                break
            fetched = self._in_flight.pop((connection, correlation_id), None)
            if fetched is None:
                continue
            for owned, reply in zip(fetched, fetch_replies(fetched, frames), strict=True):
                owned.in_flight = None
                if self._on_fetch_reply(owned, reply):
                    self._reset_out_of_range(owned)
        self._expire_fetches(wait_s)

    def _expire_fetches(self, wait_s: float) -> None:
        """Forget fetches whose reply is overdue (broker down): they are sent again later."""
        overdue = self.clock.monotonic() - wait_s - self.timeout_s
        for key, fetched in list(self._in_flight.items()):
            if fetched[0].sent_at < overdue:
                del self._in_flight[key]
                for owned in fetched:
                    owned.in_flight = None
                    owned.rest_until = self.clock.monotonic() + RETRY_BACKOFF_S
                    owned.located = False  # the broker may be down: another may lead now
                    log.warning("no reply to a fetch of %s from %s", owned.tp, owned.endpoint)

    def _follow_leader(self, owned: _Owned, error: PylogError) -> None:
        """After a fetch of `owned` failed with a retriable `error` (or none came): fetch next
        from the leader a NOT_LEADER_FOR_PARTITION names (a broker known, epoch not older),
        else ask METADATA first (`_locate`)."""
        tp = owned.tp
        self.cluster.learn_from(tp.topic, tp.partition, error)
        info = self.cluster.leaders.get((tp.topic, tp.partition))
        endpoint = None if info is None else self.cluster.endpoints.get(info.broker_id)
        if endpoint is None:
            owned.located = False
        else:
            owned.endpoint, owned.located = endpoint, True

    def _locate(self, owned: _Owned) -> bool:
        """Ask METADATA where `owned`'s partition is led now and fetch from there; False (the
        partition rests again) when no broker answers, or it has no leader yet."""
        tp = owned.tp
        try:
            self.cluster.metadata([tp.topic])
        except (BrokerError, Unavailable) as error:
            if isinstance(error, BrokerError) and not error.retriable:
                raise
            log.warning("group %s: where is %s led? %s", self.group, tp, error)
            owned.rest_until = self.clock.monotonic() + RETRY_BACKOFF_S
            return False
        info = self.cluster.leaders.get((tp.topic, tp.partition))
        endpoint = None
        if info is not None and info.error_code == ErrorCode.NONE:
            endpoint = self.cluster.endpoints.get(info.broker_id)
        if endpoint is None:
            owned.rest_until = self.clock.monotonic() + RETRY_BACKOFF_S
            return False
        owned.endpoint, owned.located = endpoint, True
        return True

    def _on_fetch_reply(self, owned: _Owned, fetched: FetchReply | BrokerError) -> bool:
        """Take a fetch reply of `owned`'s partition: its records buffered, or its error acted
        on. True when the fetch offset is out of range (deleted by retention?): the caller
        then calls `_reset_out_of_range`, which asks the broker (I/O of its own)."""
        tp = owned.tp
        if isinstance(fetched, BrokerError):
            error = fetched
            damage = corrupt_segment_reply(error, tp.topic, tp.partition)
            grown = grown_fetch_bytes(error, MAX_FETCH_BYTES)
            if damage is not None:
                self._damaged(owned, damage)
            elif error.code == ErrorCode.OFFSET_OUT_OF_RANGE:
                return True
            elif grown is not None:
                owned.fetch_bytes = grown
            elif error.retriable or error.code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION:
                owned.rest_until = self.clock.monotonic() + RETRY_BACKOFF_S
                self._follow_leader(owned, error)
            else:
                raise error
            return False
        base = owned.fetch_offset
        message_set = fetched.message_set
        records, failure = decode_records(
            message_set, base, self.record_type, tp.topic, tp.partition
        )
        owned.buffered = deque(records)
        if failure is None:  # past the last (decode may stop early: its budget)
            owned.fetch_offset = records[-1][NEXT_AT] if records else base
            return False
        damage = damaged_range(message_set, base, tp.topic, tp.partition, failure)
        if records:  # these first; the next fetch meets the damage
            owned.fetch_offset = damage.start
        else:
            self._damaged(owned, damage)
        return False

    def _reset_out_of_range(self, owned: _Owned) -> None:
        """Read an owned partition whose fetch offset is out of range from `reset` on (the
        partition rests a moment when the broker cannot say where that is now)."""
        tp = owned.tp
        try:
            offset = self._reset_offset(tp)
        except (Unavailable, BrokerError) as failure:
            if isinstance(failure, BrokerError) and not failure.retriable:
                raise
            owned.rest_until = self.clock.monotonic() + RETRY_BACKOFF_S
            return
        self.offset_resets += 1
        log.warning(
            "group %s: offset %d of %s %s is out of range (deleted by retention?): "
            "reading from %s offset %d",
            self.group,
            owned.fetch_offset,
            tp.topic,
            tp.name,
            self.reset,
            offset,
        )
        owned.fetch_offset = owned.position = owned.delivered = offset

    def _damaged(self, owned: _Owned, damage: CorruptSegment) -> None:
        """At damaged data: raise it (the next poll fetches it again), or with skip_corrupt
        log it and fetch on after it (moving the position past it too when nothing before it
        is still in hand)."""
        if not self.skip_corrupt:
            raise damage
        log.warning("group %s: skipping damaged data: %s", self.group, damage)
        self.skipped.append((owned.tp, damage.start, damage.end))
        if owned.position == owned.delivered == damage.start:
            owned.position = owned.delivered = damage.end
        owned.fetch_offset = damage.end

    def _stop_fetching(self) -> None:
        """Forget fetches in flight and messages not handed out (their late replies are
        dropped), and records handed out but not processed: fetching resumes after the last
        processed record."""
        self._in_flight.clear()
        for owned in self._owned.values():
            owned.in_flight = None
            owned.buffered.clear()
            owned.fetch_offset = owned.delivered = owned.position

    # -- rebalancing -------------------------------------------------------------------------

    def _rebalance(self) -> None:
        backoff = Backoff(self.rebalance_backoff_s, REBALANCE_MAX_BACKOFF_S)
        for attempt in range(self.rebalance_retries + 1):
            self._rebalance_wanted.clear()
            if attempt == 0 and self._keeps_its_range():
                return
            self._revoke()
            wanted = self._wanted()
            claimed: list[BrokerPartition] = []
            conflict = None
            try:
                names = [(tp.topic, tp.name) for tp in wanted]
                owners = self._paper.claim_partitions(self.group, names, self.consumer_id)
                for tp, owner in zip(wanted, owners, strict=True):
                    if owner is None:
                        claimed.append(tp)
                    elif conflict is None:
                        conflict = (tp, owner)
                if conflict is None:
                    self._start(claimed)
            except BaseException:
                self._release(claimed)
                self._owned.clear()
                raise
            if conflict is None:
                self._claim_session = self._paper.session_id
                self.rebalances += 1
                log.info(
                    "group %s: %s owns %d partitions: %s",
                    self.group,
                    self.consumer_id,
                    len(claimed),
                    ", ".join(f"{tp.topic}/{tp.name}" for tp in claimed),
                )
                if self.on_assigned is not None:
                    self.on_assigned(frozenset(claimed))
                return
            self._release(claimed)
            log.info(
                "group %s: %s/%s still owned by %s; retrying in %.1f s (attempt %d)",
                self.group,
                conflict[0].topic,
                conflict[0].name,
                conflict[1],
                backoff.current_s,
                attempt + 1,
            )
            time.sleep(backoff.next())  # a back-off between attempts, not a wait for a condition
        assert conflict is not None
        tp, owner = conflict
        raise RebalanceFailed(
            f"group {self.group}: {self.consumer_id} could not claim {tp.topic}/{tp.name} "
            f"(owned by {owner}) in {self.rebalance_retries + 1} attempts"
        )

    def _reconcile(self, heartbeats: Heartbeats) -> None:
        """The coordinated protocol: follow the assignment the heartbeat thread last heard.
        Partitions taken away are given up first (fetching stopped, `on_revoked`, their
        positions committed with auto-commit) and reported at once; then those given are read
        from their committed offsets (`on_assigned`). A partition that stays is read on."""
        self._rebalance_wanted.clear()
        with heartbeats.lock:
            assignment = heartbeats.membership.assignment
        mine = {TopicPartition(tp.topic, tp.partition): tp for tp in self._owned}
        revoked = frozenset(tp for key, tp in mine.items() if key not in assignment)
        if revoked:
            self._give_up(revoked)
            heartbeats.report(frozenset(k for k, tp in mine.items() if tp not in revoked))
        given = sorted(assignment - mine.keys())
        if not given:
            return
        claimed = self._broker_partitions(given)
        self._start(claimed)
        self.rebalances += 1
        log.info(
            "group %s: %s was given %d partitions: %s",
            self.group,
            self.consumer_id,
            len(claimed),
            ", ".join(f"{tp.topic}/{tp.partition}" for tp in claimed),
        )
        heartbeats.report(frozenset(TopicPartition(tp.topic, tp.partition) for tp in self._owned))
        if self.on_assigned is not None:
            self.on_assigned(frozenset(claimed))

    def _give_up(self, partitions: frozenset[BrokerPartition]) -> None:
        """Stop reading `partitions`: their fetches forgotten, `on_revoked`, their positions
        committed (with auto-commit), forgotten. The other partitions are read on, what was
        fetched for them kept."""
        for tp in partitions:
            self._forget_fetched(self._owned[tp])
        if self.on_revoked is not None:
            self.on_revoked(partitions)
        if self.auto_commit_interval_s is not None:
            self._commit_positions(partitions)
        for tp in partitions:
            del self._owned[tp]

    def _broker_partitions(self, partitions: Sequence[TopicPartition]) -> list[BrokerPartition]:
        """`partitions` as BrokerPartitions: each with its preferred leader (from METADATA)
        as the broker its name gives."""
        self.cluster.metadata(sorted({tp.topic for tp in partitions}))
        named = []
        for topic, number in partitions:
            info = self.cluster.leaders.get((topic, number))
            broker = -1 if info is None else (info.replicas or (info.broker_id,))[0]
            named.append(BrokerPartition(topic, broker, number))
        return named

    def _revoke(self) -> None:
        """Stop fetching, tell the user, commit (with auto-commit) and release every owner
        node."""
        if not self._owned:
            return
        owned = frozenset(self._owned)
        self._give_up(owned)
        self._release(owned)

    def _release(self, partitions: Iterable[BrokerPartition]) -> None:
        for tp in partitions:
            self._paper.release_partition(self.group, tp.topic, tp.name)

    def _keeps_its_range(self) -> bool:
        """Whether this member's range is what it owns already, in the session that claimed
        it (its owner nodes stand): a change that moves none of its partitions (another
        member's range, a broker that holds none of them, a watch that fires twice at the
        start) then keeps each partition where it is read, the records not yet committed
        included, instead of sending it back to its committed offset."""
        if not self._owned or self._claim_session != self._paper.session_id:
            return False
        return set(self._wanted()) == set(self._owned)

    def _wanted(self) -> list[BrokerPartition]:
        """This member's range of each subscribed topic's live partitions."""
        members = self._paper.consumers(self.group)
        brokers = self._paper.brokers()
        self.cluster.endpoints = {b: f"tcp://{i.host}:{i.port}" for b, i in brokers.items()}
        wanted: list[BrokerPartition] = []
        for topic in self.topics:
            config = self._topic_config(topic)
            if config is None:
                continue
            live = [
                BrokerPartition(topic, holder, number)
                for number, holder in enumerate(config.brokers)
                if any(replica in brokers for replica in config.replicas[number])
            ]
            subscribed = [member for member, topics in members.items() if topic in topics]
            wanted += assign_range(live, subscribed, self.consumer_id)
        return wanted

    def _topic_config(self, topic: str) -> TopicConfig | None:
        try:
            return self._paper.topic_config(topic)
        except PylogError as error:
            if isinstance(error, RegistryUnavailable):
                raise
            log.warning("group %s: topic %r: %s", self.group, topic, error)
            return None

    def _leaders(self, claimed: Iterable[BrokerPartition]) -> dict[tuple[str, int], int]:
        """(topic, partition) -> its leader, by METADATA, for the partitions of `claimed` that
        are led by a registered broker now (the others: fetched from their preferred leader,
        which answers where the leader is, or rest until METADATA knows)."""
        topics = sorted({tp.topic for tp in claimed})
        if not topics:
            return {}
        try:
            self.cluster.metadata(topics)
        except (BrokerError, Unavailable) as error:
            if isinstance(error, BrokerError) and not error.retriable:
                raise
            log.warning("group %s: no METADATA for the leaders: %s", self.group, error)
            return {}
        leaders = {}
        for tp in claimed:
            info = self.cluster.leaders.get((tp.topic, tp.partition))
            if info is None or info.error_code != ErrorCode.NONE:
                continue
            if info.broker_id in self.cluster.endpoints:
                leaders[tp.topic, tp.partition] = info.broker_id
        return leaders

    def _start(self, claimed: Iterable[BrokerPartition]) -> None:
        claimed = list(claimed)
        leaders = self._leaders(claimed)
        offsets = self._committed(claimed)
        endpoints: dict[BrokerPartition, str] = {}
        for tp in claimed:
            leader = leaders.get((tp.topic, tp.partition), tp.broker_id)
            endpoint = self.cluster.endpoints.get(leader)
            if endpoint is None:  # the rebalance is tried again (_rebalanced)
                raise Unavailable(f"{tp.topic}-{tp.partition}: no leader registered now")
            endpoints[tp] = endpoint
        uncommitted = [tp for tp in claimed if offsets.get(tp) is None]
        resets = self._reset_offsets(uncommitted, endpoints)
        for tp in claimed:
            committed = offsets.get(tp)
            position = resets[tp] if committed is None else committed
            self._owned[tp] = _Owned(
                tp,
                endpoints[tp],
                position,
                position,
                committed,
                position,
                fetch_bytes=self.fetch_bytes,
            )

    def _committed(self, partitions: Sequence[BrokerPartition]) -> dict[BrokerPartition, int]:
        """The group's committed offsets of those of `partitions` that have one: read from
        ZooKeeper (the paper's protocol) or asked of the coordinator (OFFSET_FETCH)."""
        if not partitions:
            return {}
        if self._heartbeats is None:
            stored = self._paper.committed_offsets(self.group)
            found = {tp: stored.get(tp.topic, {}).get(tp.name) for tp in partitions}
        else:
            topics = sorted({tp.topic for tp in partitions})
            committed = self._commits.committed(topics)
            found = {tp: committed.get(TopicPartition(tp.topic, tp.partition)) for tp in partitions}
        return {tp: offset for tp, offset in found.items() if offset is not None}

    def _reset_offsets(
        self, partitions: Sequence[BrokerPartition], endpoints: Mapping[BrokerPartition, str]
    ) -> dict[BrokerPartition, int]:
        """_reset_offset of each of `partitions`, the OFFSETS requests sent to their leaders
        (`endpoints`) together, one round trip for them all; one not answered so (an error, a
        leader moved) is asked again alone, as _reset_offset asks."""
        time_ = EARLIEST if self.reset == "earliest" else LATEST
        asked: dict[tuple[Connection, int], BrokerPartition] = {}
        for tp in partitions:
            connection = self.cluster.connect(endpoints[tp])
            request = OffsetsRequest(tp.topic, tp.partition, time_)
            asked[connection, connection.send_pipelined(request)] = tp
        offsets: dict[BrokerPartition, int] = {}
        deadline = self.clock.monotonic() + self.timeout_s
        while asked:
            try:
                connection, correlation_id, frames = self.cluster.receive_pipelined(
                    {connection for connection, _ in asked},
                    max(0.0, deadline - self.clock.monotonic()),
                )
            except Unavailable:
                break  # those left are asked alone
            key = (connection, correlation_id)
            if key not in asked:
                continue
            tp = asked.pop(key)
            try:
                offsets[tp] = decode_reply(Api.OFFSETS, frames).offset
            except BrokerError:
                continue  # asked alone below: it follows the leader, retries, raises
        for tp in partitions:
            if tp not in offsets:
                offsets[tp] = self._reset_offset(tp)
        return offsets

    def _reset_offset(self, tp: BrokerPartition) -> int:
        """The earliest or latest offset (`reset`) of `tp`, asked of its leader
        (Cluster.call_leader: followed when it moves)."""
        time_ = EARLIEST if self.reset == "earliest" else LATEST
        request = OffsetsRequest(tp.topic, tp.partition, time_)
        return self.cluster.call_leader(request, 3).offset

    # -- offsets -----------------------------------------------------------------------------

    def commit(self, offsets: Mapping[tuple[str, int], int] | None = None) -> None:
        """Count every record handed out as processed (the one in hand included) and record
        in ZooKeeper, for every owned partition, the position after it (only where it
        moved). With `offsets` ((topic, partition) -> the offset to read next), record those
        instead, for those partitions alone (each becomes the partition's position; the
        others are left as they are); ValueError, nothing committed, for a partition this
        member does not own."""
        if offsets is None:
            self._processed_all()
            self._commit_positions()
            return
        owned = self._owned_by_number()
        strangers = sorted(f"{t}/{p}" for t, p in offsets if (t, p) not in owned)
        if strangers:
            raise ValueError(f"not assigned to this member: {', '.join(strangers)}")
        self._record({owned[key].tp: offset for key, offset in offsets.items()})
        for key, offset in offsets.items():
            owned[key].position = owned[key].committed = offset

    def _owned_by_number(self) -> dict[tuple[str, int], _Owned]:
        """The owned partitions by (topic, partition number)."""
        return {(tp.topic, tp.partition): owned for tp, owned in self._owned.items()}

    def _commit_positions(self, partitions: Iterable[BrokerPartition] | None = None) -> None:
        """Record each owned partition's position (after its last processed record) where it
        moved since the last commit (of `partitions` only, when given)."""
        moved = [
            owned
            for tp, owned in self._owned.items()
            if owned.position != owned.committed and (partitions is None or tp in partitions)
        ]
        if not moved:
            return
        self._record({owned.tp: owned.position for owned in moved})
        for owned in moved:
            owned.committed = owned.position

    def _record(self, offsets: Mapping[BrokerPartition, int]) -> None:
        """Record `offsets` in ZooKeeper (the paper's protocol) or with the coordinator
        (OFFSET_COMMIT at the member's epoch): PartitionNotAssigned, nothing of it recorded,
        for a partition the group gave another member since."""
        if self._heartbeats is None:
            for tp, offset in offsets.items():
                self._paper.commit_offset(self.group, tp.topic, tp.name, offset)
            return
        with self._heartbeats.lock:
            epoch = self._heartbeats.membership.epoch
        by_key = {TopicPartition(tp.topic, tp.partition): o for tp, o in offsets.items()}
        outcome = self._commits.commit(by_key, self.consumer_id, epoch)
        refused = sorted(f"{tp.topic}/{tp.partition}" for tp, c in outcome.items() if c)
        if refused:
            raise PartitionNotAssigned(
                f"group {self.group}: {self.consumer_id}'s commit of {', '.join(refused)} "
                f"refused at epoch {epoch}: the group gave them to another member"
            )

    def _commit_due(self) -> bool:
        return (
            self.auto_commit_interval_s is not None and self.clock.monotonic() >= self._next_commit
        )

    def _auto_commit(self) -> None:
        if self.auto_commit_interval_s is None or not self._commit_due():
            return
        self._next_commit = self.clock.monotonic() + self.auto_commit_interval_s
        try:
            self._commit_positions()
        except (RegistryUnavailable, BrokerError, Unavailable) as error:  # tried again next time
            log.warning("group %s: auto-commit failed: %s", self.group, error)

    # -- life cycle --------------------------------------------------------------------------

    def close(self) -> None:
        """Commit the processed records (with auto-commit), release the partitions, leave the
        group. Records handed out but not processed (see the module's docstring) are read again
        by the partitions' next owners."""
        if self._closed:
            return
        self._closed = True
        if self._heartbeats is not None:
            self._leave(self._heartbeats)
            return
        registry = self._paper
        try:
            if registry.connected and registry.session_id == self._claim_session:
                self._revoke()
        finally:
            registry.stop()
            self.cluster.close()

    def _leave(self, heartbeats: Heartbeats) -> None:
        """The coordinated protocol's close: give every partition up (committing, within the
        lease), then leave the group, so that others take them over at once."""
        try:
            if self._owned and self.connected and not heartbeats.membership.lost:
                self._give_up(frozenset(self._owned))
                heartbeats.report(frozenset())
        finally:
            heartbeats.leave()
            heartbeats.calls.close()
            self._commits.close()
            self.cluster.close()
