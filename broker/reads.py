"""How a worker serves reads (broker.worker): FETCH, OFFSETS, DESCRIBE_PARTITION and
OFFSET_FOR_LEADER_EPOCH.

FETCH reads whole flushed messages from the page cache (an mmap view, sent without copying),
at most broker.fetch_max_bytes of them (but the first message whole, when it fits in the
request's max_bytes), so that no reply is larger than the front is prepared to hold. When fewer
than min_bytes lie past the offset it waits, up to max_wait_ms, for the flush that brings them
(a follower's) or the high watermark (a consumer's of a replicated partition): a long poll
woken by that, not by polling, and not by the flushes before it (FlushWaiters). A follower's
FETCH (replica_id set) tells the leader where the follower is (broker.leadership: the high
watermark and the ISR). OFFSETS answers earliest, latest (the high watermark) or the first
offset at a time; DESCRIBE_PARTITION a partition's offsets, size, segments, oldest timestamp
and the settings in effect.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import trio

from broker import protocol
from broker.config import TOPIC_SETTINGS
from broker.errors import (
    FencedLeaderEpoch,
    FetchSizeTooSmall,
    OffsetOutOfRange,
    PylogError,
    UnknownLeaderEpoch,
    UnknownTopicOrPartition,
)
from broker.leadership import Leadership
from broker.log.message import HEADER_SIZE, Buffer, timestamp_at
from broker.partition import Partition
from broker.replication.leader import epoch_entries
from broker.served import Served
from broker.transport import throttle_of


class Reads:
    """The reads of the partitions of `served`, at most `fetch_max_bytes` a reply."""

    def __init__(self, served: Served, leadership: Leadership, fetch_max_bytes: int) -> None:
        self.served = served
        self.leadership = leadership
        self.fetch_max_bytes = fetch_max_bytes

    async def offset_for_leader_epoch(
        self, tagged: bytes, correlation_id: int, request: protocol.OffsetForLeaderEpochRequest
    ) -> None:
        partition = self.served.get(request.topic, request.partition)
        partition.check_leader()
        epoch, end = partition.log.end_offset_for_epoch(request.leader_epoch)
        answer = protocol.OffsetForLeaderEpochReply(epoch, end)
        await self.served.reply(tagged, protocol.encode_reply(correlation_id, answer))

    async def fetch(
        self, tagged: bytes, correlation_id: int, request: protocol.FetchRequest, version: int
    ) -> None:
        partition = self.served.get(request.topic, request.partition)
        plog = partition.log
        self._check_epoch(partition, request.leader_epoch)
        if request.replica_id >= 0:
            self._follower_fetched(partition, request)
        else:
            partition.check_leader()
        if request.offset <= plog.high_watermark or request.replica_id < 0:
            plog.check_offset(request.offset)  # its errors come first, before any waiting
        if self._fetch_ready(partition, request) or request.max_wait_ms == 0:
            frames = self._fetch_reply(tagged, correlation_id, partition, request, version)
            await self.served.reply(tagged, frames)
            return
        assert self.served.nursery is not None
        self.served.nursery.start_soon(
            self._long_poll, partition, tagged, correlation_id, request, version
        )

    @staticmethod
    def _check_epoch(partition: Partition, epoch: int) -> None:
        """A FETCH's leader epoch (-1: not checked) against the partition's, in the order
        docs/protocol.md gives: newer than known here, not led here, older."""
        if epoch < 0:
            return
        known = partition.replica.leader_epoch
        if epoch > known:
            raise UnknownLeaderEpoch(partition.name, epoch, known)
        partition.check_leader()
        if epoch < known:
            raise FencedLeaderEpoch(partition.name, epoch, known)

    def _follower_fetched(self, partition: Partition, request: protocol.FetchRequest) -> None:
        """A follower's FETCH: check that it may fetch, note where it is (the high watermark
        may move; its ISR membership may change). A follower copies flushed bytes only; its
        offset may lie past the flushed end, up to the log end, where the reply waits for
        the flush."""
        replica = request.replica_id
        partition.check_leader()
        leader = partition.replica.leader
        if leader is None or replica not in leader.followers:  # (None: one replica, this one)
            raise UnknownTopicOrPartition(f"broker {replica} is not a replica of {partition.name}")
        plog = partition.log
        if not plog.log_start_offset <= request.offset <= plog.log_end_offset:
            raise OffsetOutOfRange(request.offset, plog.log_start_offset, plog.log_end_offset)
        leader.record_fetch(
            replica, request.offset, request.flushed_offset, plog.high_watermark, time.monotonic()
        )
        partition.advance(self.served.replies)
        self.leadership.ask_isr(partition, replica)

    async def _long_poll(
        self,
        partition: Partition,
        tagged: bytes,
        correlation_id: int,
        request: protocol.FetchRequest,
        version: int,
    ) -> None:
        # Deleting the partition, taking it offline or a change of its leader wakes every
        # waiter; a flush (or the high watermark), only those whose min_bytes it brought.
        waiters = partition.waiters
        if request.replica_id < 0 and partition.replica.leader is not None:
            waiters = partition.consumers
        with trio.move_on_after(request.max_wait_ms / 1000):
            while self.served.still_open(partition) and partition.offline is None:
                if self._fetch_ready(partition, request) or (
                    partition.replica.replicated and partition.replica.leader is None
                ):
                    break
                await waiters.wait_high_watermark(request.offset + request.min_bytes)
        try:
            if not self.served.still_open(partition) or partition.offline is not None:
                self.served.get(partition.topic, partition.number)  # raises: deleted or offline
            frames = self._fetch_reply(tagged, correlation_id, partition, request, version)
        except PylogError as error:  # deleted, or retention moved the log start past it
            frames = protocol.encode_error(correlation_id, error)
        await self.served.reply(tagged, frames)

    @staticmethod
    def _fetch_ready(partition: Partition, request: protocol.FetchRequest) -> bool:
        """Whether min_bytes lie past the offset (0: answer at once, even with nothing):
        bytes flushed here for a follower, up to the high watermark for a consumer."""
        end = partition.log.high_watermark if request.replica_id >= 0 else partition.high_watermark
        return end - request.offset >= request.min_bytes

    def _fetch_reply(
        self,
        tagged: bytes,
        correlation_id: int,
        partition: Partition,
        request: protocol.FetchRequest,
        version: int,
    ) -> Sequence[Buffer]:
        """At most fetch_max_bytes of messages, but the first message whole if it fits in the
        request's max_bytes: the cap bounds the broker's memory, never stops a consumer. A
        consumer reads up to the high watermark; a follower, whatever is flushed here, with
        the epoch entries of those bytes. A FETCH older than version 3 is served a segment up
        to its first compressed set, and UNSUPPORTED_FORMAT at or past it."""
        plog = partition.log
        replica = request.replica_id >= 0
        # It may have stopped leading (or a newer epoch come) while the fetch waited.
        self._check_epoch(partition, request.leader_epoch)
        partition.check_leader()
        end = plog.high_watermark if replica else partition.high_watermark
        limit = min(request.max_bytes, self.fetch_max_bytes, max(0, end - request.offset))
        sets = version >= protocol.SETS_FETCH_VERSION  # else UnsupportedFormat at a set
        data: Buffer = b""
        if limit:
            try:
                data = plog.read(request.offset, limit, sets)
            except FetchSizeTooSmall as error:
                # A follower gets the message whole whatever its max_bytes: it must copy it.
                if error.needed > request.max_bytes and not replica:  # named as asked
                    raise FetchSizeTooSmall(error.offset, request.max_bytes, error.needed) from None
                data = plog.read(request.offset, error.needed, sets)  # over the cap: sent whole
        partition.bytes_out += len(data)
        end = request.offset + len(data)
        entries = epoch_entries(plog.epochs.entries, request.offset, end) if replica else ()
        producers: tuple[protocol.StoredSet, ...] = ()
        if replica and version >= protocol.PRODUCERS_FETCH_VERSION and len(data):
            producers = plog.producer_sets(request.offset, end)
        reply = protocol.FetchReply(
            partition.high_watermark,
            plog.log_start_offset,
            data,
            partition.replica.leader_epoch,
            entries,
            throttle_of(tagged),
            producers,
        )
        return protocol.encode_reply(correlation_id, reply, version)

    def offset_at(self, request: protocol.OffsetsRequest) -> int:
        partition = self.served.get(request.topic, request.partition)
        partition.check_leader()
        plog = partition.log
        if request.time == protocol.LATEST:
            return partition.high_watermark
        if request.time == protocol.EARLIEST:
            return plog.log_start_offset
        return plog.offset_for_timestamp(request.time)

    def describe(
        self, request: protocol.DescribePartitionRequest
    ) -> protocol.DescribePartitionReply:
        plog = self.served.get(request.topic, request.partition).log
        stats = plog.statistics()
        oldest = -1
        if stats.high_watermark > stats.log_start_offset:  # a message at the log start
            segment = plog.segment_for(stats.log_start_offset)
            position = stats.log_start_offset - segment.base_offset
            oldest = timestamp_at(segment.view(position, position + HEADER_SIZE), 0)
        config = plog.config
        settings = protocol.settings_text({key: getattr(config, key) for key in TOPIC_SETTINGS})
        return protocol.DescribePartitionReply(
            stats.log_start_offset,
            stats.high_watermark,
            stats.log_end_offset,
            stats.size_bytes,
            stats.segments,
            oldest,
            settings,
        )
