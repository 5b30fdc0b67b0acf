"""A consumer of one partition: fetches from a position it keeps itself.

Where it starts: "earliest" (the log start offset), "latest" (the high watermark: only
messages flushed from now on), an int offset (used as given: the broker answers
INVALID_OFFSET or OFFSET_OUT_OF_RANGE for a bad one), or a datetime (the first message whose
timestamp is at or after it, by OFFSETS). Offsets are byte positions: after a fetch at
`position` the next position is `position` plus the length of the message set returned, and
each message's offset is computed from the fetch offset (broker.log.codec.decode, in C when
built).

A message larger than `fetch_bytes` is answered FETCH_SIZE_TOO_SMALL, whose reply gives the
message's size; the consumer then fetches again with that size (up to `max_fetch_bytes`),
instead of stalling on it.

While more is stored past what a fetch returned, the next fetch is sent before the messages of
this one are decoded, so the broker reads while the consumer decodes (one fetch ahead).

Damaged data (docs/storage.md, "Damaged data"): stored bytes that fail their checks are a
range [start, end) of offsets that nobody can read. The consumer meets it either as the
broker's CORRUPT_SEGMENT, whose reply gives the range, or as a fetched message whose checksum
does not match, whose range its length field gives. Either way it first returns the messages
before it, then raises CorruptSegment (broker.errors) naming the range, at every poll, until
the consumer is moved past it (`seek(error.end)`); with `skip_corrupt` it logs the range, adds
it to `skipped` and reads on from `end` by itself.

Leadership: fetches and OFFSETS go to the partition's leader as last heard of, and follow it
when it moves (NOT_LEADER_FOR_PARTITION, or no reply: Cluster.call_leader), within `retries`
with a growing back-off; the position is kept, so nothing is skipped or read twice (the new
leader holds every message below the high watermark the old one let consumers read).

Not safe to share between threads.
"""

from __future__ import annotations

import datetime
import logging
from collections.abc import Iterator
from typing import Final, Literal, cast

from broker.client.cluster import Cluster, partition_of
from broker.client.connection import Connection
from broker.client.framing import DEFAULT_CLIENT_ID, wait_ms
from broker.client.transport import Transport
from broker.errors import (
    BrokerCorruptSegment,
    BrokerError,
    BrokerFetchSizeTooSmall,
    CorruptSegment,
    InvalidMessage,
)
from broker.lifecycle import Closing
from broker.log.codec import decode
from broker.log.message import HEADER_SIZE, LENGTH_SIZE, Buffer, Message, message_size_at
from broker.protocol import EARLIEST, LATEST, FetchReply, FetchRequest, OffsetsRequest
from broker.security import ClientKeys

Start = Literal["earliest", "latest"] | int | datetime.datetime
DEFAULT_FETCH_BYTES: Final = 1 << 20
MAX_FETCH_BYTES: Final = 64 << 20
_EPOCH: Final = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)

log = logging.getLogger(__name__)


def corrupt_segment_reply(error: BrokerError, topic: str, partition: int) -> CorruptSegment | None:
    """The damaged range of partition `partition` of `topic` that a CORRUPT_SEGMENT reply gives
    in its fields (start, end, reason), as CorruptSegment caused by `error`; None for any
    other error."""
    if not isinstance(error, BrokerCorruptSegment):
        return None
    damage = CorruptSegment(f"{topic}-{partition}", error.start, error.end, error.reason)
    damage.__cause__ = error
    return damage


def grown_fetch_bytes(error: BrokerError, max_fetch_bytes: int) -> int | None:
    """The fetch size to fetch again with after FETCH_SIZE_TOO_SMALL: the size of the message
    at the offset, which the reply gives (`needed`), when it is at most `max_fetch_bytes`;
    None for any other error, or a message larger than that."""
    if isinstance(error, BrokerFetchSizeTooSmall) and error.needed <= max_fetch_bytes:
        return error.needed
    return None


def decode_fetched(
    message_set: Buffer, offset: int, topic: str, partition: int
) -> tuple[list[Message], CorruptSegment | None]:
    """The messages of a fetched set whose first is at `offset`, up to the first that fails its
    checks, and the damaged range there, if any (`damaged_range`)."""
    messages, failure = decode(message_set, offset)
    if failure is None:
        return messages, None
    return messages, damaged_range(message_set, offset, topic, partition, failure)


def damaged_range(
    message_set: Buffer, offset: int, topic: str, partition: int, failure: InvalidMessage
) -> CorruptSegment:
    """The damaged range of a fetched set whose first message is at `offset`, where a message
    failed its checks (`failure`): that message, when its length field stays within the set
    (the broker walked it), else the rest of the set (the set ends at a message boundary)."""
    bad = failure.position
    left = len(message_set) - bad
    size = message_size_at(message_set, bad) if left >= LENGTH_SIZE else 0
    end = bad + size if HEADER_SIZE <= size <= left else len(message_set)
    return CorruptSegment(f"{topic}-{partition}", offset + bad, offset + end, failure.reason)


def timestamp_ms(moment: datetime.datetime) -> int:
    """Milliseconds since the Unix epoch, exactly (a naive datetime is taken as UTC)."""
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=datetime.UTC)
    return (moment - _EPOCH) // datetime.timedelta(milliseconds=1)


class PartitionReader:
    """What a partition consumer does without I/O, shared by PartitionConsumer and broker.aio's
    AsyncPartitionConsumer: its settings, where it starts, its position, the fetch it sends
    next, and what a fetch reply, or a fetch error, makes of them."""

    def __init__(
        self,
        topic: str,
        partition: int,
        fetch_bytes: int,
        max_wait_ms: int,
        max_fetch_bytes: int,
        stop_at_end: bool,
        retries: int,
        skip_corrupt: bool,
    ) -> None:
        if not 1 <= fetch_bytes <= max_fetch_bytes:
            raise ValueError(f"fetch_bytes {fetch_bytes} must be in [1, {max_fetch_bytes}]")
        self.topic = topic
        self.skip_corrupt = skip_corrupt
        self.skipped: list[tuple[int, int]] = []
        """The damaged ranges read past with `skip_corrupt`, [start, end) offsets, in order."""
        self.partition = partition
        self.fetch_bytes = fetch_bytes
        self.max_fetch_bytes = max_fetch_bytes
        self.max_wait_ms = max_wait_ms
        self.stop_at_end = stop_at_end
        self.retries = retries
        self.high_watermark: int | None = None
        self.log_start_offset: int | None = None
        self._position = 0

    @staticmethod
    def _start_time(start: Start) -> int | None:
        """The OFFSETS time that finds `start` (EARLIEST, LATEST or ms since the epoch), or
        None for an offset given as it is."""
        if isinstance(start, datetime.datetime):
            return timestamp_ms(start)
        if start == "earliest":
            return EARLIEST
        if start == "latest":
            return LATEST
        if isinstance(start, int) and start >= 0:
            return None
        raise ValueError(f"start {start!r}: use earliest, latest, an offset or a datetime")

    @property
    def position(self) -> int:
        """The offset of the next message to read."""
        return self._position

    def seek(self, offset: int) -> None:
        """Read from `offset` next: a message boundary in [log start, high watermark]."""
        if offset < 0:
            raise ValueError(f"offset {offset} is negative")
        self._position = offset

    @property
    def at_end(self) -> bool:
        """Whether the position had reached the high watermark at the last fetch."""
        return self.high_watermark is not None and self._position >= self.high_watermark

    def _fetch_failed(self, error: BrokerError) -> list[Message] | None:
        """After a fetch answered `error`: at damaged data what `_damaged` makes of it; None
        when the fetch is to be sent again with the fetch size grown to the message there;
        else raises `error`."""
        damage = corrupt_segment_reply(error, self.topic, self.partition)
        if damage is not None:
            return self._damaged(damage)
        grown = grown_fetch_bytes(error, self.max_fetch_bytes)
        if grown is None:
            raise error
        self.fetch_bytes = grown
        return None

    def _take(self, reply: FetchReply) -> list[Message]:
        """The messages of a fetch from the position, the position moved past them (or up to
        damaged data after them: the next fetch meets it)."""
        messages, damage = decode_fetched(
            reply.message_set, self._position, self.topic, self.partition
        )
        self.high_watermark = reply.high_watermark
        self.log_start_offset = reply.log_start_offset
        if damage is None:  # past the last (decode may stop early: its budget)
            self._position = messages[-1].next_offset if messages else self._position
        elif messages:  # these first; the next poll meets the damage
            self._position = damage.start
        else:
            return self._damaged(damage)
        return messages

    def _damaged(self, damage: CorruptSegment) -> list[Message]:
        """At damaged data: raise it, or with skip_corrupt log it and move past it."""
        if not self.skip_corrupt:
            raise damage
        log.warning("skipping damaged data: %s", damage)
        self.skipped.append((damage.start, damage.end))
        self._position = damage.end
        return []

    def _request(self, offset: int, wait_ms: int) -> FetchRequest:
        min_bytes = 1 if wait_ms > 0 else 0
        return FetchRequest(
            self.topic, self.partition, offset, self.fetch_bytes, wait_ms, min_bytes
        )


class PartitionConsumer(PartitionReader, Closing):
    """Read partition `partition` of `topic` from the broker that holds it, found through
    `endpoint` (any broker of the cluster; several may be given, comma-separated).

    `poll()` is one fetch, a long poll of up to `max_wait_ms`; iterating yields messages for
    ever, or until the high watermark with `stop_at_end`. `high_watermark` and
    `log_start_offset` are as the last fetch reply gave them (None before the first).
    Damaged data raises CorruptSegment naming its offsets; with `skip_corrupt` it is logged,
    listed in `skipped` ([start, end) offsets) and read past (see the module's text).

    `cluster`, when given, is used instead of a Cluster of the consumer's own on `endpoint`
    (several consumers then share its connections, and its keys), and `close()` leaves it
    open. `keys` (broker.security.ClientKeys: the client's key pair and the broker's public
    key) reach brokers serving CurveZMQ (docs/security.md); without them the consumer speaks
    plaintext. `transport` carries the requests of a cluster of its own
    (broker.client.transport; default: ZeroMQ sockets; a MemoryTransport for unit tests)."""

    def __init__(
        self,
        endpoint: str,
        topic: str,
        partition: int = 0,
        start: Start = "earliest",
        fetch_bytes: int = DEFAULT_FETCH_BYTES,
        max_wait_ms: int = 500,
        max_fetch_bytes: int = MAX_FETCH_BYTES,
        stop_at_end: bool = False,
        retries: int = 5,
        client_id: str = DEFAULT_CLIENT_ID,
        timeout_s: float = 10.0,
        skip_corrupt: bool = False,
        cluster: Cluster | None = None,
        *,
        keys: ClientKeys | None = None,
        transport: Transport | None = None,
    ) -> None:
        super().__init__(
            topic,
            partition,
            fetch_bytes,
            max_wait_ms,
            max_fetch_bytes,
            stop_at_end,
            retries,
            skip_corrupt,
        )
        self._own_cluster = cluster is None
        self.cluster = (
            Cluster(endpoint, client_id, timeout_s, retries, keys=keys, transport=transport)
            if cluster is None
            else cluster
        )
        self._prefetch: tuple[Connection, FetchRequest, int] | None = None
        """The fetch sent ahead, the connection it went on, and its correlation id."""
        try:
            time = self._start_time(start)
            partition_of(self.cluster.partitions(topic), topic, partition)  # it exists
            self._position = cast(int, start) if time is None else self.offset_for_time(time)
        except BaseException:
            self.close()
            raise

    @property
    def connection(self) -> Connection:
        """The connection to the partition's leader as last heard of (it follows leadership:
        Cluster.call_leader)."""
        return self.cluster.leader_connection(self.topic, self.partition)

    def offset_for_time(self, time: int) -> int:
        """OFFSETS: the offset for `time` (EARLIEST, LATEST, or ms since the epoch), from the
        partition's leader (Cluster.call_leader)."""
        request = OffsetsRequest(self.topic, self.partition, time)
        return self.cluster.call_leader(request, self.retries).offset

    def poll(self, max_wait_ms: int | None = None) -> list[Message]:
        """One fetch from the position: the messages there, waiting up to `max_wait_ms`
        (default the consumer's) for one to arrive; advances the position past them.

        While more is stored past what a fetch returned, the next fetch is sent before this
        one's messages are decoded (on the connection's pipelined socket), so the broker reads
        it while the consumer decodes; a `seek`, or another wait, leaves that reply unused.
        TypeError for a float `max_wait_ms` (connection.wait_ms)."""
        wait = wait_ms(max_wait_ms, self.max_wait_ms)
        reply = self._prefetched(wait)
        while reply is None:
            try:
                request = self._request(self._position, wait)
                reply = self.cluster.call_leader(request, self.retries)
            except BrokerError as error:
                skipped = self._fetch_failed(error)
                if skipped is not None:
                    return skipped
        following = self._position + len(reply.message_set)
        if reply.message_set and following < reply.high_watermark:
            request = self._request(following, wait)
            connection = self.connection
            self._prefetch = (connection, request, connection.send_pipelined(request))
        return self._take(reply)

    def _prefetched(self, wait: int) -> FetchReply | None:
        """The reply to the fetch sent ahead, if it is for the fetch `poll` would send now and
        came without error in time; else None, and the fetch is sent the usual way (which
        retries, and raises what it meets). Replies to fetches left unused are skipped."""
        if self._prefetch is None:
            return None
        (connection, request, correlation_id), self._prefetch = self._prefetch, None
        if request != self._request(self._position, wait):
            return None  # a seek, another wait or another fetch size since it was sent
        return connection.fetched_ahead(correlation_id, connection.timeout_s + wait / 1000)

    def __iter__(self) -> Iterator[Message]:
        """Messages from the position on, blocking for new ones; with `stop_at_end`, until
        the position reaches the high watermark (fetches then do not wait)."""
        while True:
            wait = 0 if self.stop_at_end else self.max_wait_ms
            yield from self.poll(wait)
            if self.stop_at_end and self.at_end:
                return

    def close(self) -> None:
        if self._own_cluster:
            self.cluster.close()
