"""How far a consumer group is behind, and where its offsets can be moved: the reading behind
`pylogctl group describe` and `pylogctl group reset`.

A group's state is in ZooKeeper (members, owners, committed offsets: docs/registry.md); the
partitions' offsets and messages come from each partition's leader (METADATA, asked of the
brokers registered; the preferred leader when none answers), reached at the endpoints they
register. Offsets are byte positions, so a lag in messages is found by reading the
messages: `backlog` counts them exactly up to `count_bytes` past the committed offset and
estimates the rest from the average size of those counted (and says so). The lag in seconds is
the age of the next unread message: now minus the timestamp of the message at the committed
offset (producers' clocks, so only as good as theirs).

Every offset a reset lands on is a message boundary: the log start, the high watermark, the
first message at or after a time (OFFSETS), the start of the message around a given byte
position (`message_bounds`), or a number of messages before or after the committed offset,
counted by reading them.

Not safe to share between threads.
"""

from __future__ import annotations

import datetime
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, replace
from typing import Final, Literal

from broker.client.cluster import Cluster
from broker.client.connection import Connection, Retry
from broker.client.consumer import (
    MAX_FETCH_BYTES,
    corrupt_segment_reply,
    decode_fetched,
    grown_fetch_bytes,
    timestamp_ms,
)
from broker.client.retention import ahead_of
from broker.errors import (
    BrokerCorruptSegment,
    BrokerError,
    BrokerFetchSizeTooSmall,
    BrokerInvalidOffset,
    CorruptSegment,
    Unavailable,
)
from broker.log.message import Message
from broker.protocol import EARLIEST, LATEST, FetchRequest, OffsetsRequest
from broker.registry import Registry, partition_name

COUNT_BYTES: Final = 256 << 10
"""How many bytes past a committed offset `backlog` reads to count messages exactly: a describe
of 8 partitions 4 MiB behind takes 121 ms with 256 KiB, 252 ms with 1 MiB, 939 ms counting
all (perf/bench_group_lag.py), and --watch repeats it."""
FETCH_BYTES: Final = 64 << 10
SCAN_BACK_BYTES: Final = 64 << 10
"""The first window read back from an offset to find the messages before it (then x4)."""

Target = Literal["earliest", "latest"] | int | datetime.datetime | tuple[Literal["shift-by"], int]
"""Where `plan_reset` moves offsets: the log start, the high watermark, a byte offset (moved to
the start of the message around it), the first message at or after a time, or a number of
messages from the committed offset (negative: back)."""


def log_range(
    connection: Connection, topic: str, partition: int, retries: int = 3
) -> tuple[int, int]:
    """(log start offset, high watermark) of the partition, by OFFSETS."""
    start = connection.call(OffsetsRequest(topic, partition, EARLIEST), retries)
    end = connection.call(OffsetsRequest(topic, partition, LATEST), retries)
    return start.offset, end.offset


def message_bounds(
    connection: Connection, topic: str, partition: int, position: int, retries: int = 3
) -> tuple[int, int]:
    """(start, next) of the message around byte `position` of the partition: (position,
    position) when a message starts there (or it is the high watermark). One FETCH of one
    byte: a boundary answers FETCH_SIZE_TOO_SMALL (or nothing at the high watermark), any
    other position INVALID_OFFSET, whose fields give the boundaries around it (protocol.md).
    BrokerError OFFSET_OUT_OF_RANGE outside [log start, high watermark]."""
    request = FetchRequest(topic, partition, position, 1, 0, 0)
    try:
        connection.call(request, retries)
    except BrokerFetchSizeTooSmall:
        return position, position
    except BrokerCorruptSegment as damage:
        if damage.start != position:
            raise
        return position, position  # a damaged range starts at a boundary too
    except BrokerInvalidOffset as error:
        return error.message_start, error.next_offset
    return position, position


def messages(
    connection: Connection,
    topic: str,
    partition: int,
    start: int,
    end: int,
    retries: int = 3,
    damaged: list[CorruptSegment] | None = None,
) -> Iterator[Message]:
    """The readable messages of [start, end) (`start` a boundary), fetched without waiting;
    damaged ranges (docs/protocol.md) are passed over, their bytes counting as no message,
    and added to `damaged`."""
    position, fetch_bytes = start, FETCH_BYTES
    while position < end:
        try:
            reply = connection.call(
                FetchRequest(topic, partition, position, fetch_bytes, 0, 0), retries
            )
        except BrokerError as error:
            damage = corrupt_segment_reply(error, topic, partition)
            if damage is not None:
                if damaged is not None:
                    damaged.append(damage)
                position = damage.end
                continue
            grown = grown_fetch_bytes(error, MAX_FETCH_BYTES)
            if grown is None:
                raise
            fetch_bytes = grown
            continue
        if not reply.message_set:
            return
        found, damage = decode_fetched(reply.message_set, position, topic, partition)
        for message in found:
            if message.offset >= end:
                return
            yield message
        if damage is not None:
            if damaged is not None:
                damaged.append(damage)
            position = damage.end
        else:  # past the last (decode may stop early: its budget)
            position = found[-1].next_offset


class HolderUnavailable(Unavailable):
    """The broker holding a partition could not be asked (down, or no reply in time)."""


@dataclass(frozen=True, slots=True)
class Backlog:
    """The messages of [offset, end): how many (exact, or estimated beyond what was counted),
    the timestamp of the first (None when there is none), and the damaged ranges passed over
    among those counted ([start, end) offsets, no messages)."""

    messages: int
    estimated: bool
    first_timestamp_ms: int | None
    damaged: tuple[tuple[int, int], ...] = ()

    def age_s(self, now_ms: float) -> float | None:
        """The first message's age at `now_ms` in seconds (by its producer's timestamp), to
        0.1 s; None when there is none."""
        if self.first_timestamp_ms is None:
            return None
        return round(max(0.0, now_ms - self.first_timestamp_ms) / 1000, 1)


def backlog(
    connection: Connection,
    topic: str,
    partition: int,
    offset: int,
    end: int,
    count_bytes: int = COUNT_BYTES,
    retries: int = 3,
) -> Backlog:
    """Count the messages of [offset, end) by reading them, up to those starting `count_bytes`
    past `offset`; beyond, estimate them from the average size of those counted."""
    counted, first, reached = 0, None, offset
    found: list[CorruptSegment] = []
    for message in messages(connection, topic, partition, offset, end, retries, found):
        if message.offset - offset >= count_bytes:
            reached = message.offset
            break
        counted += 1
        first = message.timestamp_ms if first is None else first
        reached = message.next_offset
    else:
        reached = end
    damaged = tuple((d.start, d.end) for d in found if d.start < reached)
    if reached == end:
        return Backlog(counted, False, first, damaged)
    estimate = counted + round((end - reached) * counted / (reached - offset))
    return Backlog(estimate, True, first, damaged)


@dataclass(frozen=True, slots=True)
class PartitionLag:
    """One partition of a group's topic: its holder, the group's owner and committed offset,
    the partition's offsets, and the lag (None where unknown; `note` says why)."""

    topic: str
    partition: int
    broker: int
    owner: str | None
    committed: int | None
    log_start: int | None = None
    high_watermark: int | None = None
    lag_bytes: int | None = None
    lag_messages: int | None = None
    lag_messages_estimated: bool = False
    lag_seconds: float | None = None
    retention_seconds: float | None = None
    """How long before retention deletes the next message the group reads (0: deleted
    already; None: nothing will as things stand, or not known: broker.client.retention)."""
    retention_bytes: int | None = None
    """How many more bytes appended before then, where known."""
    note: str | None = None


@dataclass(frozen=True, slots=True)
class GroupLag:
    """A group's members (id -> topics) and the lag of each partition of its topics."""

    group: str
    members: dict[str, tuple[str, ...]]
    topics: list[str]
    partitions: list[PartitionLag] = field(default_factory=list)

    @property
    def lag_bytes(self) -> int:
        return sum(p.lag_bytes or 0 for p in self.partitions)

    @property
    def lag_messages(self) -> int:
        return sum(p.lag_messages or 0 for p in self.partitions)

    @property
    def lag_messages_estimated(self) -> bool:
        return any(p.lag_messages_estimated for p in self.partitions)

    @property
    def lag_seconds(self) -> float | None:
        """The oldest unread message's age, over the partitions (None when none is known)."""
        ages = [p.lag_seconds for p in self.partitions if p.lag_seconds is not None]
        return max(ages) if ages else None

    @property
    def retention_seconds(self) -> float | None:
        """The soonest retention deletes a message the group has not read, over the
        partitions (None when none is forecast)."""
        times = [p.retention_seconds for p in self.partitions if p.retention_seconds is not None]
        return min(times) if times else None


class GroupReader:
    """Reads groups from `registry` and partitions from the brokers registered there."""

    def __init__(self, registry: Registry, cluster: Cluster, retries: int = 3) -> None:
        self.registry = registry
        self.cluster = cluster
        self.retries = retries

    def topics(self, group: str) -> list[str]:
        """The group's topics: those it has committed offsets or owners for, or members
        consuming (empty when there is no such group)."""
        found = {
            *self.registry.groups.committed_offsets(group),
            *self.registry.groups.owners(group),
        }
        for subscribed in self.registry.groups.group_members(group).values():
            found.update(subscribed)
        return sorted(found)

    def describe(
        self, group: str, topics: Iterable[str] = (), count_bytes: int = COUNT_BYTES
    ) -> GroupLag:
        """The lag of each partition of `topics` (default: the group's topics)."""
        members = self.registry.groups.group_members(group)
        committed = self.registry.groups.committed_offsets(group)
        owners = self.registry.groups.owners(group)
        names = sorted(set(topics)) or self.topics(group)
        lag = GroupLag(group, members, names)
        configs = self.registry.topics.topic_configs()
        self._refresh_endpoints()
        now_ms = time.time() * 1000
        for topic in names:
            config = configs.get(topic)
            if config is None:
                for name, offset in sorted(committed.get(topic, {}).items()):
                    broker_id, _, partition = name.partition("-")
                    lag.partitions.append(
                        PartitionLag(
                            topic,
                            int(partition),
                            int(broker_id),
                            None,
                            offset,
                            note="topic deleted",
                        )
                    )
                continue
            for number, holder in enumerate(config.brokers):
                name = partition_name(holder, number)
                lag.partitions.append(
                    self._partition_lag(
                        PartitionLag(
                            topic,
                            number,
                            holder,
                            owners.get(topic, {}).get(name),
                            committed.get(topic, {}).get(name),
                        ),
                        count_bytes,
                        now_ms,
                    )
                )
        return lag

    def _partition_lag(self, lag: PartitionLag, count_bytes: int, now_ms: float) -> PartitionLag:
        try:
            connection, (start, end) = self._leader_range(lag.topic, lag.partition, lag.broker)
        except (BrokerError, Unavailable) as error:
            return replace(lag, note=f"broker {lag.broker} unavailable: {error}")
        offsets = replace(lag, log_start=start, high_watermark=end)
        if lag.committed is None:
            return replace(offsets, note="no committed offset")
        if lag.committed > end:
            return replace(offsets, note=f"committed offset past the high watermark {end}")
        position, note = lag.committed, None
        if position < start:
            position, note = start, f"committed offset before the log start {start} (deleted)"
        try:
            found = backlog(
                connection, lag.topic, lag.partition, position, end, count_bytes, self.retries
            )
        except (BrokerError, Unavailable) as error:
            return replace(offsets, lag_bytes=end - position, note=f"cannot count: {error}")
        notes = [note] if note else []
        notes += [f"damaged offsets [{a}, {b}) are no messages" for a, b in found.damaged]
        ahead = ahead_of(connection, lag.topic, lag.partition, lag.committed, now_ms, self.retries)
        return replace(
            offsets,
            lag_bytes=end - position,
            lag_messages=found.messages,
            lag_messages_estimated=found.estimated,
            lag_seconds=0.0 if position == end else found.age_s(now_ms),
            retention_seconds=None if ahead is None else ahead.seconds,
            retention_bytes=None if ahead is None else ahead.bytes,
            note="; ".join(notes) or None,
        )

    def _refresh_endpoints(self) -> None:
        brokers = self.registry.brokers.read()
        self.cluster.endpoints = {b: f"tcp://{i.host}:{i.port}" for b, i in brokers.items()}
        self.cluster.leaders.clear()  # asked again: leadership may have moved since

    def _connection(self, broker: int) -> Connection:
        endpoint = self.cluster.endpoints.get(broker)
        if endpoint is None:
            raise Unavailable("not registered in ZooKeeper (down?)")
        return self.cluster.connect(endpoint)

    def _leader(self, topic: str, partition: int, holder: int) -> Connection:
        """The connection to the partition's leader (METADATA version 2, asked of the brokers
        registered; Cluster.leader_connection), or to `holder`, its preferred leader, when
        no broker says."""
        try:
            return self.cluster.leader_connection(topic, partition)
        except (BrokerError, Unavailable):
            return self._connection(holder)

    def _leader_range(
        self, topic: str, partition: int, holder: int
    ) -> tuple[Connection, tuple[int, int]]:
        """The partition's leader and its `log_range`, asked again after a retriable error
        (NOT_LEADER_FOR_PARTITION: the broker asked had not heard of a move yet, or has) of the
        leader found then (Cluster.learn_from), up to `retries` more times, 0.1 s doubling
        apart (Retry); raises the last error."""
        retry = Retry(self.retries, 3 * self.cluster.timeout_s, refusals_within_time=True)
        while True:
            try:
                connection = self._leader(topic, partition, holder)
                return connection, log_range(connection, topic, partition, 0)
            except (BrokerError, Unavailable) as error:
                wait_s = retry.wait_after(error)
                self.cluster.learn_from(topic, partition, error)
            time.sleep(wait_s)

    # -- resets ------------------------------------------------------------------------------

    def plan_reset(
        self, group: str, topic: str, target: Target, partitions: Iterable[int] = ()
    ) -> list[ResetStep]:
        """Where `target` moves the group's committed offset of each partition of `topic`
        (or of `partitions`), reading only. UnknownTopicOrPartition for a topic that does not
        exist; BrokerError or HolderUnavailable when a holder cannot say (nothing is
        planned)."""
        config = self.registry.topics.topic_config(topic)
        wanted = set(partitions)
        unknown = wanted - set(range(config.partitions))
        if unknown:
            raise ValueError(
                f"topic {topic} has partitions 0 to {config.partitions - 1}, "
                f"not {', '.join(map(str, sorted(unknown)))}"
            )
        committed = self.registry.groups.committed_offsets(group).get(topic, {})
        self._refresh_endpoints()
        steps = []
        for number, holder in enumerate(config.brokers):
            if wanted and number not in wanted:
                continue
            name = partition_name(holder, number)
            try:
                steps.append(self._step(topic, number, holder, name, committed.get(name), target))
            except Unavailable as error:
                raise HolderUnavailable(
                    f"partition {number} of {topic}: broker {holder} unavailable: {error}"
                ) from error
        return steps

    def apply_reset(self, group: str, steps: Iterable[ResetStep]) -> None:
        """Write each step's `after` as the group's committed offset."""
        for step in steps:
            if step.after is not None:
                self.registry.groups.commit_offset(group, step.topic, step.name, step.after)

    def _step(
        self, topic: str, number: int, holder: int, name: str, before: int | None, target: Target
    ) -> ResetStep:
        step = ResetStep(topic, number, name, before, None)
        if isinstance(target, tuple) and before is None:
            return replace(step, note="no committed offset to shift")
        connection, (start, end) = self._leader_range(topic, number, holder)
        if target == "earliest":
            return replace(step, after=start)
        if target == "latest":
            return replace(step, after=end)
        if isinstance(target, datetime.datetime):
            request = OffsetsRequest(topic, number, timestamp_ms(target))
            return replace(step, after=connection.call(request, self.retries).offset)
        if isinstance(target, int):
            return self._to_offset(step, connection, target, start, end)
        assert before is not None
        return self._shift(step, connection, before, target[1], start, end)

    def _to_offset(
        self, step: ResetStep, connection: Connection, offset: int, start: int, end: int
    ) -> ResetStep:
        if offset < start:
            return replace(step, after=start, note=f"before the log start {start}: moved there")
        if offset > end:
            return replace(step, after=end, note=f"past the high watermark {end}: moved there")
        around, _ = message_bounds(connection, step.topic, step.partition, offset, self.retries)
        if around == offset:
            return replace(step, after=offset)
        return replace(step, after=around, note=f"inside a message: moved to its start {around}")

    def _shift(
        self, step: ResetStep, connection: Connection, before: int, by: int, start: int, end: int
    ) -> ResetStep:
        """`by` messages after `before` (or before it, negative), within [start, end]."""
        origin = min(max(before, start), end)
        read = messages(connection, step.topic, step.partition, origin, end, self.retries)
        if by >= 0:
            offsets = [m.next_offset for _, m in zip(range(by), read, strict=False)]
            if len(offsets) < by:
                note = f"only {len(offsets)} messages after it: moved to the high watermark"
                return replace(step, after=end, note=note)
            return replace(step, after=offsets[-1] if offsets else origin)
        back, window = -by, SCAN_BACK_BYTES
        while True:  # ends: the window grows until it reaches the log start
            low = max(start, origin - window)
            low = message_bounds(connection, step.topic, step.partition, low, self.retries)[0]
            found = [
                m.offset
                for m in messages(connection, step.topic, step.partition, low, origin, self.retries)
            ]
            if len(found) >= back:
                return replace(step, after=found[-back])
            if low <= start:
                note = f"only {len(found)} messages before it: moved to the log start"
                return replace(step, after=start, note=note)
            window *= 4


@dataclass(frozen=True, slots=True)
class ResetStep:
    """One partition of a reset: the group's committed offset `before` and `after` it (None:
    left as it is, `note` says why)."""

    topic: str
    partition: int
    name: str
    before: int | None
    after: int | None
    note: str | None = None
