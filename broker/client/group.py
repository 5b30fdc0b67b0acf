"""A member of a consumer group: the group shares the partitions of its topics, coordinated
by the brokers (docs/protocol.md, "Consumer groups"); a member needs only a broker's address.

Every partition of a subscribed topic is consumed by exactly one member of the group at a time;
groups are independent of each other. A heartbeat thread (broker.client.membership.Heartbeats)
keeps the member in the group and learns its assignment; the thread that polls follows it in
the poll under way (a wait for records looks for the news every NEWS_CHECK_S) or at its next
poll: partitions taken away are given up (fetching stopped, `on_revoked`, positions
committed with auto-commit, reported at once), partitions given are read from the group's
committed offsets (`on_assigned`), and those that stay are read on. Within its lease only (its
session since it sent its last answered heartbeat) does it hand out records. Told it is unknown
or fenced, it drops its partitions without committing (`on_lost`) and joins again. A member
that does not poll within `max_poll_interval_s` leaves the group (its processing deadline, as
Kafka's max.poll.interval.ms) and joins again at its next poll.

A partition given is read from the group's committed offset, or, when none is committed, from
the earliest or latest offset (`reset`). A committed offset that retention has deleted (the
broker answers OFFSET_OUT_OF_RANGE) is reset the same way, logged and counted
(`offset_resets`).

Delivery is at least once. A record counts as processed when the application asks for the
next one: the next `poll()` call for the records a poll returned, the next step of the iteration
for a record `for record in member` gave. `commit()` also counts every record handed out so far
as processed, the one in hand included. Auto-commit (every `auto_commit_interval_s`, checked at
each poll and each step of the iteration), the commit of a partition given up and `close()`
record only the processed records, so a `break` out of the loop, an exception in the handler or
a crash leaves the record in hand (and everything after it) to be read again by the partition's
next owner. Records fetched and not handed out stay with the member: a loop over it entered
again goes on with the next record.

Damaged data on a broker's disk (docs/storage.md, "Damaged data") raises CorruptSegment naming
its offsets, after the records before it, at every poll until it is read past; with
`skip_corrupt` the member logs it, lists it in `skipped` and reads on after it, as
PartitionConsumer does.

Fetches go by broker: one request in flight a broker, a MULTI_FETCH of the owned partitions it
leads (a FETCH for one), sent again as soon as its reply is in, so the broker reads the next
while the records are handed out. While a partition's last reply says enough waits past what
was fetched (`fetch_round`), a fetch asks only the partitions that hold it, each in turn first.
Leadership moves (docs/replication.md): the leaders are asked by METADATA (version 2) when
partitions are given; a fetch answered NOT_LEADER_FOR_PARTITION naming a broker this member
knows goes there next, and after any other retriable error or no reply the partition's leader
is asked again by METADATA before its next fetch (each after the partition's rest,
RETRY_BACKOFF_S).

Not safe to share between threads (the heartbeat thread only sets a flag that `poll` reads).
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

from broker.client.cluster import Cluster
from broker.client.connection import Connection
from broker.client.consumer import (
    DEFAULT_FETCH_BYTES,
    MAX_FETCH_BYTES,
    corrupt_segment_reply,
    damaged_range,
    grown_fetch_bytes,
)
from broker.client.coordinator import GroupCalls
from broker.client.framing import DEFAULT_CLIENT_ID, noted, wait_ms
from broker.client.membership import Heartbeats, Membership
from broker.clock import SYSTEM_CLOCK, Clock
from broker.errors import (
    BrokerError,
    CorruptSegment,
    MalformedReply,
    PartitionNotAssigned,
    PylogError,
    Unavailable,
    UnknownTopicOrPartition,
)
from broker.groups.assignors import TopicPartition
from broker.lifecycle import Closing
from broker.log.codec import decode_records
from broker.log.headers import Headers
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
from broker.security import ClientKeys

log = logging.getLogger("pylog.group")

Reset = Literal["earliest", "latest"]
RETRY_BACKOFF_S = 0.5
"""How long a partition rests after a retriable fetch error before it is fetched again."""
DEFAULT_MAX_POLL_INTERVAL_S = 300.0
"""A member's processing deadline by default (Kafka's max.poll.interval.ms)."""
NEWS_CHECK_S = 0.1
"""How often a member waiting for fetch replies looks for the heartbeat thread's news."""
FETCH_ROUND_BYTES: Final = DEFAULT_FETCH_BYTES
"""What a fetch of a broker's partitions asks for when their last replies say it waits there:
about what a broker's reply holds (its fetch_max_bytes, 1 MiB by default; `fetch_round`)."""
IDLE_ASK_S: Final = 0.5
"""The longest a partition not known to hold data goes unasked while others are read."""
MAX_POLL_INTERVAL_S = (2**31 - 1) / 1000
"""The longest: rebalance_timeout_ms is an i32 of milliseconds on the wire."""


@dataclass(frozen=True, order=True, slots=True)
class BrokerPartition:
    """A partition of a topic and its preferred leader (the first of its replicas)."""

    topic: str
    broker_id: int
    partition: int


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
    known_end: int = -1
    """Where the partition's readable bytes ended at its last fetch reply (its high watermark
    then; -1 before one and after an error): what is known to wait past `fetch_offset`
    (`fetch_round`), and whether it was read to its end (`at_end`)."""
    buffered: deque[Any] = field(default_factory=deque)
    """Records (of the member's record type) of the last fetch reply not handed out yet."""
    in_flight: tuple[Connection, int] | None = None
    sent_at: float = 0.0
    rest_until: float = 0.0
    located: bool = True
    """False after a fetch error that did not say where the leader is: METADATA is asked before
    the next fetch (GroupConsumer._locate)."""
    paused: bool = False
    """Not fetched until resumed (GroupConsumer.pause)."""


def fetch_round(owned: Sequence[_Owned], now: float) -> list[_Owned]:
    """Which of a broker's partitions, in the round's order, the next fetch there asks. When
    their last replies say FETCH_ROUND_BYTES wait past their fetch offsets (a partition counted
    up to its fetch_bytes): the first that hold as much between them, and with them those
    not asked for IDLE_ASK_S; else all of them, in one long poll. A broker answers a fetch with
    about that much (its fetch_max_bytes): partitions past it would be answered empty, at a
    cost a part on both sides that a member reading a backlog over many partitions would pay
    for every round."""
    chosen: list[_Owned] = []
    known = 0
    for o in owned:
        if known >= FETCH_ROUND_BYTES:
            break
        waiting = min(o.known_end - o.fetch_offset, o.fetch_bytes)
        if waiting > 0:
            chosen.append(o)
            known += waiting
    if known < FETCH_ROUND_BYTES:
        return list(owned)
    asked = set(chosen)
    return [o for o in owned if o in asked or now - o.sent_at >= IDLE_ASK_S]


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


class GroupConsumer(Closing, Generic[R]):
    """Consume `topics` as member `consumer_id` of `group`, through the group's coordinator,
    found through `broker` ("host:port" of any broker of the cluster; several comma-separated,
    tried in turn). `session_timeout_s` (2 to 300) is how long the coordinator waits for a
    heartbeat before it gives the member's partitions to others; `max_poll_interval_s` how long
    the application may take between two polls (its processing deadline). `instance_id` makes
    a static member: closed and started again within its session, it takes its partitions back
    without a rebalance. `assignor` is the group's ("uniform", sticky, the default; "range",
    the paper's).

    `on_assigned(partitions)` runs after partitions were given, `on_revoked(partitions)`
    before partitions taken away are committed and given up (both in the thread calling
    `poll`), so a user can flush state or commit; `on_lost(partitions)` (default:
    `on_revoked`) when they were lost without a commit (a session that expired; the coordinator
    no longer knowing the member), their next owner reading from the last commit.
    `auto_commit_interval_s` None turns auto-commit off: then only `commit()` commits.
    `store_processed` False (Kafka's enable.auto.offset.store false): records handed out do not
    count as processed when the application asks for the next; only `store` moves what a
    commit records. `logger`: where the member logs (confluent-kafka's `logger` setting).
    `skip_corrupt` reads past damaged data instead of raising CorruptSegment (see the module's
    text). `keys` (broker.security.ClientKeys: the client's key pair and the brokers' public
    key) reach brokers serving CurveZMQ (docs/security.md); without them the member speaks
    plaintext. `clock` (broker.clock) times auto-commits, the lease, the processing deadline,
    the rests of partitions after errors and the fetches overdue. `record_type` (default
    Record) is what it hands out: a tuple type of Record's layout without a __dict__, each made
    from the fetched bytes, no Record between."""

    def __init__(
        self,
        broker: str,
        group: str,
        topics: Iterable[str],
        *,
        consumer_id: str | None = None,
        reset: Reset = "earliest",
        auto_commit_interval_s: float | None = 5.0,
        on_assigned: Callable[[frozenset[BrokerPartition]], object] | None = None,
        on_revoked: Callable[[frozenset[BrokerPartition]], object] | None = None,
        on_lost: Callable[[frozenset[BrokerPartition]], object] | None = None,
        max_wait_ms: int = 500,
        fetch_bytes: int = DEFAULT_FETCH_BYTES,
        session_timeout_s: float = 6.0,
        client_id: str = DEFAULT_CLIENT_ID,
        timeout_s: float = 10.0,
        skip_corrupt: bool = False,
        keys: ClientKeys | None = None,
        clock: Clock = SYSTEM_CLOCK,
        record_type: type[R] | None = None,
        instance_id: str | None = None,
        assignor: str | None = None,
        max_poll_interval_s: float = DEFAULT_MAX_POLL_INTERVAL_S,
        store_processed: bool = True,
        logger: logging.Logger | None = None,
    ) -> None:
        if reset not in ("earliest", "latest"):
            raise ValueError(f"reset {reset!r}: use earliest or latest")
        if not isinstance(broker, str) or not broker:
            raise ValueError(
                f"broker {broker!r}: a group consumer needs a broker's address, host:port"
            )
        if not 0 < max_poll_interval_s <= MAX_POLL_INTERVAL_S:
            raise ValueError(
                f"max_poll_interval_s {max_poll_interval_s}: more than 0, at most "
                f"{MAX_POLL_INTERVAL_S:g}"
            )
        self.group = group
        self.topics = tuple(sorted(set(topics)))
        if not self.topics:
            raise ValueError("a group consumer needs at least one topic")
        self.consumer_id = consumer_id or default_consumer_id()
        self.clock = clock
        self.record_type = record_type if record_type is not None else cast("type[R]", Record)
        self.reset: Reset = reset
        self.auto_commit_interval_s = auto_commit_interval_s
        self.store_processed = store_processed
        self.log = logger if logger is not None else log
        """Where its warnings and rebalances are logged (default the "pylog.group" logger; its
        heartbeat thread's warnings too)."""
        self.on_assigned = on_assigned
        self.on_revoked = on_revoked
        self.on_lost = on_lost
        self.max_wait_ms = max_wait_ms
        self.fetch_bytes = fetch_bytes
        self.timeout_s = timeout_s
        self.skip_corrupt = skip_corrupt
        self.skipped: list[tuple[BrokerPartition, int, int]] = []
        """The damaged ranges read past with `skip_corrupt`: partition, [start, end) offsets."""
        self.offset_resets = 0
        """Partitions read from `reset` because their committed offset was out of range."""
        self.rebalances = 0
        """How many times partitions were given to this member."""
        self._owned: dict[BrokerPartition, _Owned] = {}
        self._in_flight: dict[tuple[Connection, int], list[_Owned]] = {}
        """The fetches in flight, each of one partition (FETCH) or of several at one broker
        (MULTI_FETCH), by connection and correlation id."""
        self._rotation = 0
        """Where a MULTI_FETCH's parts start among a broker's partitions: moved on each time,
        so that a reply full of the first parts' messages starves none of the others."""
        self._rebalance_wanted = threading.Event()
        """Set by the heartbeat thread when its news came (joined, an assignment changed)."""
        self._waiting: frozenset[BrokerPartition] = frozenset()
        self._waiting_until = 0.0
        """Partitions given that could not be started (`_start`), and when to try again."""
        self._next_commit = self.clock.monotonic() + (auto_commit_interval_s or 0)
        self._closed = False
        self._interrupted = False
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
        self.cluster = Cluster(broker, client_id, timeout_s, keys=keys)
        self._commits = GroupCalls(broker, group, client_id, timeout_s, keys=keys)
        beats = GroupCalls(
            broker, group, client_id, min(timeout_s, session_timeout_s / 2), keys=keys
        )
        self._heartbeats = Heartbeats(
            membership, beats, self.clock, self._rebalance_wanted, log=self.log
        )
        """The heartbeat thread (it sends the join and every heartbeat; the first poll waits
        for its answer) and the member's state."""
        self._heartbeats.start()

    # -- what the member holds ---------------------------------------------------------------

    @property
    def assignment(self) -> frozenset[BrokerPartition]:
        """The partitions this member owns now."""
        return frozenset(self._owned)

    def positions(self) -> dict[BrokerPartition, int]:
        """Each owned partition's position: the offset after the last processed record."""
        return {tp: owned.position for tp, owned in self._owned.items()}

    def at_end(self) -> dict[BrokerPartition, int]:
        """The owned partitions read to their end: every record fetched handed out, up to the
        high watermark their last fetch reply gave, each with that end (Kafka's partition
        EOF)."""
        return {
            tp: owned.known_end
            for tp, owned in self._owned.items()
            if not owned.buffered and owned.delivered == owned.known_end
        }

    # -- consuming ---------------------------------------------------------------------------

    def poll(self, max_wait_ms: int | None = None) -> list[R]:
        """The next messages of the owned partitions, waiting up to `max_wait_ms` (default
        the member's) for some; follows the group's assignment first when it changed. Returns
        nothing outside the member's lease (its coordinator unreachable). Calling it counts
        every record returned before as processed. TypeError for a float `max_wait_ms`
        (poll(1.0) would wait 1 ms)."""
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
        (owned,) = self._owned_among([(topic, partition)])
        self._forget_fetched(owned)
        owned.position = owned.delivered = owned.fetch_offset = offset
        owned.rest_until = 0.0

    def pause(self, partitions: Iterable[tuple[str, int]]) -> None:
        """Stop reading `partitions` (topic, partition) of this member's, keeping them: what
        was fetched for them and not handed out is dropped, so the next record handed out
        after `resume` is the one after the last handed out. A partition given to this
        member again (after a rebalance) is read again. ValueError for one not owned."""
        for owned in self._owned_among(partitions):
            self._forget_fetched(owned)
            owned.fetch_offset = owned.delivered
            owned.paused = True

    def resume(self, partitions: Iterable[tuple[str, int]]) -> None:
        """Read `partitions` again after `pause`. ValueError for one not owned."""
        for owned in self._owned_among(partitions):
            owned.paused = False

    def _owned_among(self, partitions: Iterable[tuple[str, int]]) -> list[_Owned]:
        """The owned partitions of `partitions` (topic, partition), in their order; ValueError
        naming those this member does not own."""
        by_number = self._owned_by_number()
        wanted = list(partitions)
        others = sorted(
            f"{topic}/{number}" for topic, number in wanted if (topic, number) not in by_number
        )
        if others:
            raise ValueError(f"{', '.join(others)} not assigned to this member")
        return [by_number[key] for key in wanted]

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
        """A member past its lease, or lost: what it fetched is dropped (read again after its
        lease is renewed, or by the partitions' next owners), nothing handed out."""
        if self._heartbeats.membership.may_hand_out(self.clock.monotonic()):
            return False
        self._stop_fetching()
        return True

    def interrupt(self) -> None:
        """End a `for record in member` loop at its next step, the record in hand counted as
        processed: within max_wait_ms when no message comes. It only sets a flag, so a signal
        handler may call it (raising there instead could land inside kazoo, whose bare
        `except:` in a library would swallow the exception and leave the loop running)."""
        self._interrupted = True

    def _processed_all(self) -> None:
        """Count every record handed out as processed (the application asked for the next:
        for the processing deadline, it polled now), unless `store_processed` is False."""
        self._heartbeats.membership.polled_at = self.clock.monotonic()
        if self.store_processed:
            for owned in self._owned.values():
                owned.position = owned.delivered

    def store(self, offsets: Mapping[tuple[str, int], int]) -> None:
        """What the next commit (or auto-commit) records for each of `offsets`' partitions
        ((topic, partition) -> the offset to read next): Kafka's store_offsets, for a member
        whose `store_processed` is False. ValueError, nothing stored, for one not owned."""
        owned = self._owned_among(offsets)
        for partition, offset in zip(owned, offsets.values(), strict=True):
            partition.position = offset

    def _fill(self, max_wait_ms: int | None) -> None:
        """Follow the assignment when it changed, auto-commit when due, and unless records are
        buffered fetch, waiting up to `max_wait_ms` (default the member's) for some, then send
        the next fetches at once (as PartitionConsumer does: a broker reads them while the
        records are handed out and processed; their replies are taken once every record in
        hand is handed out); positions are left to the caller. It goes on within the wait once
        the heartbeat thread's news came (its join answered, its partitions given)."""
        wait_s = (self.max_wait_ms if max_wait_ms is None else max_wait_ms) / 1000
        deadline = time.monotonic() + wait_s  # a real wait, whatever the member's clock
        while not self._filled(wait_s):
            wait_s = deadline - time.monotonic()
            if wait_s <= 0:
                return

    def _filled(self, wait_s: float) -> bool:
        """A step of `_fill`; False when it only waited (for the heartbeat thread, or for
        partitions), or its wait for fetches was cut short by the heartbeat thread's news (the
        next step follows it, within the poll's wait), True when it fetched, or records are
        buffered."""
        if not self._in_session(wait_s):
            return False
        if self._assignment_due() and not self._rebalanced():
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
        return not self._rebalance_wanted.is_set()

    def _buffered(self) -> bool:
        return any(owned.buffered for owned in self._owned.values())

    def _rebalanced(self) -> bool:
        """Follow the assignment; False when a broker went away meanwhile, or has not heard
        yet of a partition the coordinator gave this member (partitions just added): the next
        poll tries again, METADATA asked again."""
        try:
            self._reconcile(self._heartbeats)
        except (Unavailable, BrokerError) as error:
            lagging = isinstance(error, UnknownTopicOrPartition)
            if isinstance(error, BrokerError) and not error.retriable and not lagging:
                raise
            if lagging:
                self.cluster.leaders.clear()
            self.log.warning("group %s: rebalance interrupted, will retry: %s", self.group, error)
            self._rebalance_wanted.set()
            return False
        return True

    @property
    def connected(self) -> bool:
        """Whether the member may go on: within its lease (broker.client.membership), or told
        it lost its partitions (which the next poll acts on)."""
        membership = self._heartbeats.membership
        return membership.lost or membership.may_hand_out(self.clock.monotonic())

    def _in_session(self, wait_s: float) -> bool:
        """Whether the member may consume: within its lease, at the epoch that gave its
        partitions. Past its lease it pauses, waiting up to `wait_s` for the heartbeat
        thread's news; told it was lost, it drops its partitions (`_still_member`). Raises
        what ended the heartbeat thread, lease or none (`_check_heartbeats`)."""
        self._check_heartbeats()
        if not self.connected:
            self._stop_fetching()
            self._rebalance_wanted.wait(wait_s)
            return False
        return self._still_member(self._heartbeats)

    def _check_heartbeats(self) -> None:
        """Raise what ended the heartbeat thread (Heartbeats.failure: a refusal for good, a
        failed handshake), if it ended so."""
        if self._heartbeats.failure is not None:
            raise self._heartbeats.failure

    def _still_member(self, heartbeats: Heartbeats) -> bool:
        """After UNKNOWN_MEMBER_ID or FENCED_MEMBER_EPOCH drop every partition, uncommitted
        (their next owner may have committed since), and let the heartbeat thread join
        again."""
        with heartbeats.lock:
            lost = heartbeats.membership.lost
        if not lost:
            return True
        dropped = frozenset(self._owned)
        self._stop_fetching()
        self._owned.clear()
        if dropped:
            self.log.warning(
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
        """Fetch from each broker with no fetch of this member in flight its owned partitions
        not resting (`_next_fetches`): one request a broker, a MULTI_FETCH for two partitions
        or more, a FETCH for one."""
        now = self.clock.monotonic()
        busy = {o.endpoint for o in self._owned.values() if o.in_flight is not None}
        by_endpoint: dict[str, list[_Owned]] = {}
        for owned in self._owned.values():
            if owned.in_flight is not None or owned.rest_until > now or owned.paused:
                continue
            if not owned.located and not self._locate(owned):
                continue
            if owned.endpoint not in busy:  # else it goes with that broker's next
                by_endpoint.setdefault(owned.endpoint, []).append(owned)
        for endpoint, owned_there in self._next_fetches(by_endpoint, now).items():
            request = fetch_request(owned_there, wait_s)
            connection = self.cluster.connect(endpoint)
            key = (connection, connection.send_pipelined(request))
            for owned in owned_there:
                owned.in_flight, owned.sent_at = key, now
            self._in_flight[key] = owned_there

    def _next_fetches(
        self, by_endpoint: dict[str, list[_Owned]], now: float
    ) -> dict[str, list[_Owned]]:
        """What each broker's next fetch asks (`fetch_round`) of the partitions it may, their
        order moved on by one from the last round's (`_rotation`), so that each in turn comes
        first and is read up to its fetch_bytes."""
        self._rotation += 1
        rounds = {}
        for endpoint, owned_there in by_endpoint.items():
            start = self._rotation % len(owned_there)
            rounds[endpoint] = fetch_round(owned_there[start:] + owned_there[:start], now)
        return rounds

    def _receive_fetches(self, wait_s: float) -> None:
        """Wait up to `wait_s` for a first reply, then take every reply already there. The
        wait ends early, within NEWS_CHECK_S, when the heartbeat thread brings news (an
        assignment changed: partitions to give up are given up then, not at the long poll's
        end)."""
        if not self._in_flight:
            return
        deadline = self.clock.monotonic() + wait_s
        real_deadline = time.monotonic() + wait_s  # a real wait, whatever the member's clock
        while self._in_flight:
            if any(o.buffered for o in self._owned.values()):
                timeout_s = 0.0  # data to hand out: take only the replies already here
            else:
                timeout_s = max(0.0, deadline - self.clock.monotonic())
            slice_s = min(timeout_s, NEWS_CHECK_S)
            connections = {connection for connection, _ in self._in_flight}
            try:
                connection, correlation_id, frames = self.cluster.receive_pipelined(
                    connections, slice_s
                )
            except Unavailable:
                if (
                    slice_s < timeout_s
                    and time.monotonic() < real_deadline
                    and not self._rebalance_wanted.is_set()
                ):
                    continue  # a slice waited, no news: the long poll goes on
                break
            fetched = self._in_flight.pop((connection, correlation_id), None)
            if fetched is None:
                continue
            for owned, reply in zip(fetched, fetch_replies(fetched, frames), strict=True):
                owned.in_flight = None
                if self._owned.get(owned.tp) is not owned:
                    continue  # given up while the fetch was in flight
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
                    self.log.warning("no reply to a fetch of %s from %s", owned.tp, owned.endpoint)

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
            self.log.warning("group %s: where is %s led? %s", self.group, tp, error)
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
            owned.known_end = -1
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
        owned.known_end = fetched.high_watermark
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
        self.log.warning(
            "group %s: offset %d of %s/%d is out of range (deleted by retention?): "
            "reading from %s offset %d",
            self.group,
            owned.fetch_offset,
            tp.topic,
            tp.partition,
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
        self.log.warning("group %s: skipping damaged data: %s", self.group, damage)
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

    def _assignment_due(self) -> bool:
        """Whether to follow the assignment now: the heartbeat thread's news came, or
        partitions given wait to be started (`_waiting`) and their rest is over."""
        if self._rebalance_wanted.is_set():
            return True
        return bool(self._waiting) and self.clock.monotonic() >= self._waiting_until

    def _reconcile(self, heartbeats: Heartbeats) -> None:
        """Follow the assignment the heartbeat thread last heard.
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
            self._waiting = frozenset()
            return
        claimed = self._broker_partitions(given)
        waiting = frozenset(self._start(claimed))
        if waiting and waiting != self._waiting:
            self.log.warning(
                "group %s: %d partitions given wait for a leader to read them from "
                "(their brokers down?), tried again every %g s: %s",
                self.group,
                len(waiting),
                RETRY_BACKOFF_S,
                ", ".join(f"{tp.topic}/{tp.partition}" for tp in sorted(waiting)),
            )
        self._waiting = waiting
        self._waiting_until = self.clock.monotonic() + RETRY_BACKOFF_S
        started = [tp for tp in claimed if tp not in waiting]
        if not started:
            return
        self.rebalances += 1
        self.log.info(
            "group %s: %s was given %d partitions: %s",
            self.group,
            self.consumer_id,
            len(started),
            ", ".join(f"{tp.topic}/{tp.partition}" for tp in started),
        )
        heartbeats.report(frozenset(TopicPartition(tp.topic, tp.partition) for tp in self._owned))
        if self.on_assigned is not None:
            self.on_assigned(frozenset(started))

    def _give_up(self, partitions: frozenset[BrokerPartition]) -> None:
        """Stop reading `partitions`: what was fetched for them dropped, `on_revoked`, their
        positions committed (with auto-commit), forgotten. The other partitions are read on,
        what was fetched for them kept, and a fetch in flight for some of them goes on (its
        parts for `partitions` are dropped when it comes: `_receive_fetches`), so that a
        partition that stays never waits for a fetch sent again."""
        for tp in partitions:
            self._owned[tp].buffered.clear()
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

    def _leaders(self, claimed: Iterable[BrokerPartition]) -> dict[tuple[str, int], int]:
        """(topic, partition) -> its leader, by the METADATA `_broker_partitions` asked just
        before, for the partitions of `claimed` that are led by a registered broker now (the
        others: fetched from their preferred leader, which answers where the leader is, or rest
        until METADATA knows)."""
        leaders = {}
        for tp in claimed:
            info = self.cluster.leaders.get((tp.topic, tp.partition))
            if info is None or info.error_code != ErrorCode.NONE:
                continue
            if info.broker_id in self.cluster.endpoints:
                leaders[tp.topic, tp.partition] = info.broker_id
        return leaders

    def _start(self, claimed: Sequence[BrokerPartition]) -> list[BrokerPartition]:
        """Read `claimed` from their committed offsets (or `reset`); those that cannot be read
        now are returned, to be started again after RETRY_BACKOFF_S: no leader registered
        (their brokers down), or no answer from it to where `reset` starts. The others never
        wait for them."""
        leaders = self._leaders(claimed)
        offsets = self._committed(claimed)
        endpoints: dict[BrokerPartition, str] = {}
        waiting: list[BrokerPartition] = []
        for tp in claimed:
            leader = leaders.get((tp.topic, tp.partition), tp.broker_id)
            endpoint = self.cluster.endpoints.get(leader)
            if endpoint is None:
                waiting.append(tp)
            else:
                endpoints[tp] = endpoint
        uncommitted = [tp for tp in endpoints if offsets.get(tp) is None]
        resets = self._reset_offsets(uncommitted, endpoints)
        for tp in endpoints:
            committed = offsets.get(tp)
            position = resets.get(tp) if committed is None else committed
            if position is None:
                waiting.append(tp)
                continue
            self._owned[tp] = _Owned(
                tp,
                endpoints[tp],
                position,
                position,
                committed,
                position,
                fetch_bytes=self.fetch_bytes,
            )
        return waiting

    def committed(self, partitions: Iterable[tuple[str, int]]) -> dict[tuple[str, int], int]:
        """The group's committed offsets of those of `partitions` (topic, partition) that have
        one, asked of the coordinator now (OFFSET_FETCH); owned by this member or not."""
        wanted = list(partitions)
        if not wanted:
            return {}
        committed = self._commits.committed(sorted({topic for topic, _ in wanted}))
        found = {key: committed.get(TopicPartition(*key)) for key in wanted}
        return {key: offset for key, offset in found.items() if offset is not None}

    def _committed(self, partitions: Sequence[BrokerPartition]) -> dict[BrokerPartition, int]:
        """The group's committed offsets of those of `partitions` that have one."""
        found = self.committed((tp.topic, tp.partition) for tp in partitions)
        return {
            tp: found[tp.topic, tp.partition]
            for tp in partitions
            if (tp.topic, tp.partition) in found
        }

    def _reset_offsets(
        self, partitions: Sequence[BrokerPartition], endpoints: Mapping[BrokerPartition, str]
    ) -> dict[BrokerPartition, int]:
        """_reset_offset of each of `partitions`, the OFFSETS requests sent to their leaders
        (`endpoints`) together, one round trip for them all; one not answered so (an error, a
        leader moved) is asked again alone, as _reset_offset asks, and left out when that
        fails too with an error to retry (its leader down)."""
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
                try:
                    offsets[tp] = self._reset_offset(tp)
                except (Unavailable, BrokerError) as error:
                    if isinstance(error, BrokerError) and not error.retriable:
                        raise
                    self.log.warning("group %s: where does %s start? %s", self.group, tp, error)
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
        with the coordinator, for every owned partition, the position after it (only where it
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
        """Record `offsets` with the coordinator (OFFSET_COMMIT at the member's epoch):
        PartitionNotAssigned, nothing of it recorded, for a partition the group gave another
        member since."""
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
        except (BrokerError, Unavailable) as error:  # tried again next time
            self.log.warning("group %s: auto-commit failed: %s", self.group, error)

    # -- life cycle --------------------------------------------------------------------------

    def close(self) -> None:
        """Give every partition up (committing the processed records with auto-commit,
        within the lease), then leave the group, so that others take them over at once.
        Records handed out but not processed (see the module's docstring) are read again by
        the partitions' next owners."""
        if self._closed:
            return
        self._closed = True
        heartbeats = self._heartbeats
        try:
            if self._owned and self.connected and not heartbeats.membership.lost:
                self._give_up(frozenset(self._owned))
                heartbeats.report(frozenset())
        finally:
            heartbeats.leave()
            heartbeats.calls.close()
            self._commits.close()
            self.cluster.close()
