"""How far a reader is behind in a partition, read from its leader: the log's range
(`log_range`), the boundaries of the message around an offset (`message_bounds`), the messages
after one (`messages`), and the backlog past an offset (`backlog`: messages and bytes); what
broker.groups.lag reads a consumer group's lag and resets with (`pylogctl group describe` and
`pylogctl group reset`), and broker.mirror.lag a mirror's.

Offsets are byte positions, so a lag in messages is found by reading the messages: `backlog`
counts them exactly up to `count_bytes` past the committed offset and estimates the rest from
the average size of those counted (and says so). The lag in seconds is the age of the next
unread message: now minus the timestamp of the message at the committed offset (producers'
clocks, so only as good as theirs).

Not safe to share between threads.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Final

from broker.client.connection import Connection
from broker.client.consumer import (
    MAX_FETCH_BYTES,
    corrupt_segment_reply,
    decode_fetched,
    grown_fetch_bytes,
)
from broker.client.retention import RetentionForecast
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

COUNT_BYTES: Final = 256 << 10
"""How many bytes past a committed offset `backlog` reads to count messages exactly: a describe
of 8 partitions 4 MiB behind takes 121 ms with 256 KiB, 252 ms with 1 MiB, 939 ms counting
all (perf/bench_group_lag.py), and --watch repeats it."""
FETCH_BYTES: Final = 64 << 10


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


def lag_figures(
    found: Backlog, ahead: RetentionForecast | None, position: int, end: int, now_ms: float
) -> dict[str, Any]:
    """A reader's lag at `position` of a log whose readable end is `end`, for a record of
    PartitionLag's fields (a group's, a mirror's): bytes and messages behind (`found`, its
    backlog), the age of the next unread message, and when retention deletes it (`ahead`)."""
    return {
        "lag_bytes": end - position,
        "lag_messages": found.messages,
        "lag_messages_estimated": found.estimated,
        "lag_seconds": 0.0 if position == end else found.age_s(now_ms),
        "retention_seconds": None if ahead is None else ahead.seconds,
        "retention_bytes": None if ahead is None else ahead.bytes,
    }


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
