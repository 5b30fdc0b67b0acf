"""`spark.readStream.format("pylog")`: the stream reader of the pylog source (pipeline.source),
micro-batches of the ranges pipeline.reader plans and reads, and the read-only group a stream
may commit its offsets to (`GroupCommits`). docs/pipeline.md has its options.

Streaming offsets are {"topic": {"partition": offset}} in Spark's checkpoint: the reader
commits nothing to the brokers or to ZooKeeper, but a read-only group's offsets when one is
named (`GroupCommits`, for lag reporting only). Each micro-batch reads [offset in the previous
batch's end, offset in this one's); a partition that is in the end offsets but not in the
start ones (added to the topic since, or a topic subscribePattern matches since) is read from
its log start. A micro-batch keeps within maxBytesPerTrigger (bytes, cut at message
boundaries) and maxOffsetsPerTrigger (messages, counted by the driver reading them).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxBytes,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)

from broker.client import lag
from broker.client.coordinator import GroupCalls
from broker.clock import SYSTEM_CLOCK, Clock
from broker.errors import BrokerError, PylogError
from broker.groups.assignors import TopicPartition
from broker.log.message import HEADER_SIZE
from broker.protocol import ErrorCode
from broker.security import ClientKeys
from pipeline.cluster import CLIENT_ID, RETRIES, DriverView, SourcePartition
from pipeline.errors import PipelineError
from pipeline.options import SourceOptions
from pipeline.reader import (
    OffsetRange,
    Offsets,
    decode_offsets,
    encode_offsets,
    lost,
    not_a_boundary,
    plan,
    read_with,
    starting_offsets,
)

log = logging.getLogger(__name__)


class PylogStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """`spark.readStream.format("pylog")`: micro-batches from startingOffsets on, within
    maxBytesPerTrigger bytes each when set; Trigger.AvailableNow reads up to the high
    watermarks seen when the query started."""

    def __init__(self, options: SourceOptions, clock: Clock = SYSTEM_CLOCK) -> None:
        self.options = options
        self._target: Offsets | None = None
        """The high watermarks to stop at under Trigger.AvailableNow."""
        self._clock = clock
        self._last_trigger: float | None = None
        """When the last micro-batch was let go (clock.monotonic), for maxTriggerDelay."""
        self._group: GroupCommits | None = None
        """The read-only group's commits (options.group), made on first use."""

    def __getstate__(self) -> dict[str, Any]:
        """What Spark's tasks get: the options and target, not the driver's ZooKeeper
        session."""
        return {**self.__dict__, "_group": None}

    def initialOffset(self) -> dict[str, dict[str, int]]:
        with self.options.cluster() as cluster:
            partitions = self.options.subscription.partitions(cluster)
            found = starting_offsets(self.options, cluster, partitions)
        return encode_offsets({tp: start for tp, (start, _, _) in found.items()})

    def getDefaultReadLimit(self) -> ReadLimit:
        """maxOffsetsPerTrigger as Spark's ReadMaxRows, else maxBytesPerTrigger as ReadMaxBytes
        (Spark takes one limit; `latestOffset` applies both options whenever Spark asks for
        a limited batch)."""
        if self.options.max_offsets_per_trigger is not None:
            return ReadMaxRows(self.options.max_offsets_per_trigger)
        if self.options.max_bytes_per_trigger is not None:
            return ReadMaxBytes(self.options.max_bytes_per_trigger)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        with self.options.cluster() as cluster:
            self._target = {tp: high for tp, (_, _, high) in self._current(cluster).items()}

    def reportLatestOffset(self) -> dict[str, dict[str, int]]:
        with self.options.cluster() as cluster:
            return encode_offsets({tp: high for tp, (_, _, high) in self._current(cluster).items()})

    def _current(self, cluster: DriverView) -> dict[SourcePartition, tuple[str, int, int]]:
        """Each partition read now: (endpoint, log start, high watermark)."""
        return {
            tp: (endpoint, *cluster.offsets(tp, endpoint))
            for tp, endpoint in self.options.subscription.partitions(cluster).items()
        }

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, dict[str, int]]:
        begin = decode_offsets(start)
        self._report_progress(begin)
        ends = dict(begin)  # partitions no longer listed stay where they were
        with self.options.cluster() as cluster:
            current = self._current(cluster)
            if self._target is not None:
                target = self._target
                current = {
                    tp: (endpoint, log_start, min(high, target[tp]))
                    for tp, (endpoint, log_start, high) in current.items()
                    if tp in target
                }
            if self._waits(cluster, begin, current):
                return encode_offsets(begin)
            if isinstance(limit, ReadAllAvailable):
                ends.update({tp: high for tp, (_, _, high) in current.items()})
            elif isinstance(limit, (ReadMaxBytes, ReadMaxRows)):
                ends.update(self._limited(cluster, begin, current))
            else:
                raise PipelineError(
                    f"read limit {limit!r} is not supported: use maxBytesPerTrigger or "
                    "maxOffsetsPerTrigger"
                )
        return encode_offsets(ends)

    def _waits(
        self,
        cluster: DriverView,
        begin: Offsets,
        current: Mapping[SourcePartition, tuple[str, int, int]],
    ) -> bool:
        """Whether this trigger makes no micro-batch (minOffsetsPerTrigger): fewer messages
        than that are there and maxTriggerDelay has not passed since the last batch was let
        go, as Spark's Kafka source has it (the first trigger goes; Trigger.AvailableNow never
        waits). The messages are counted by reading them, up to the minimum."""
        wanted = self.options.min_offsets_per_trigger
        if wanted is None or self._target is not None:
            return False
        now = self._clock.monotonic()
        last = self._last_trigger
        if last is None or now - last >= self.options.max_trigger_delay_s:
            self._last_trigger = now
            return False
        if _count_up_to(cluster, begin, current, wanted) < wanted:
            return True
        self._last_trigger = now
        return False

    def commit(self, end: dict[str, Any]) -> None:
        """A micro-batch up to `end` is done (Spark says so when it plans the next one)."""
        self._report_progress(decode_offsets(end))

    def _report_progress(self, processed: Offsets) -> None:
        """With a read-only group (kafka.group.id, groupIdPrefix), commit `processed` as its
        offsets where they moved, for lag reporting: at each trigger (`latestOffset` is given
        the end of the last batch done) and each `commit`. A commit that fails is logged and
        the stream goes on (its own offsets are in Spark's checkpoint)."""
        group = self.options.group
        if group is None:
            return
        try:
            if self._group is None:
                self._group = GroupCommits(self.options.bootstrap, group, self.options.keys)
            self._group.commit(processed)
        except PylogError as error:
            log.warning("group %s: offsets not committed (lag reporting only): %s", group, error)

    def stop(self) -> None:
        if self._group is not None:
            group, self._group = self._group, None
            group.close()

    def _limited(
        self,
        cluster: DriverView,
        begin: Offsets,
        current: Mapping[SourcePartition, tuple[str, int, int]],
    ) -> Offsets:
        """The ends of a batch within maxBytesPerTrigger and maxOffsetsPerTrigger."""
        max_bytes, max_messages = (
            self.options.max_bytes_per_trigger,
            self.options.max_offsets_per_trigger,
        )
        if max_bytes is not None:
            ends = _within_budget(cluster, begin, current, max_bytes)
            current = {
                tp: (endpoint, log_start, ends[tp])
                for tp, (endpoint, log_start, _) in current.items()
            }
        if max_messages is not None:
            return _within_count(cluster, begin, current, max_messages)
        return {tp: high for tp, (_, _, high) in current.items()}

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        begin, ends = decode_offsets(start), decode_offsets(end)
        spans: list[tuple[SourcePartition, str, int, int]] = []
        with self.options.cluster() as cluster:
            holders = self.options.subscription.partitions(cluster)
            for tp, stop in ends.items():
                endpoint = holders.get(tp)
                first = begin.get(tp)
                if first is None:  # a partition new since the last batch: from its log start
                    first = cluster.offsets(tp, endpoint)[0] if endpoint else stop
                if stop < first:
                    why = f"its offsets went back from {first} to {stop} (re-created?)"
                    lost(tp, stop, first, why, self.options.fail_on_data_loss)
                    continue
                if stop == first:
                    continue
                if endpoint is None:
                    lost(
                        tp,
                        first,
                        stop,
                        "the partition no longer exists",
                        self.options.fail_on_data_loss,
                    )
                    continue
                spans.append((tp, endpoint, first, stop))
            return plan(cluster, spans, self.options)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, OffsetRange)
        return read_with(self.options, partition)


def _within_count(
    cluster: DriverView,
    begin: Offsets,
    current: Mapping[SourcePartition, tuple[str, int, int]],
    max_messages: int,
) -> Offsets:
    """End offsets that read at most `max_messages` messages in all (at least one when there
    is any), shared among the partitions in proportion to the bytes each has to read (offsets
    are bytes: the number of messages is not known without reading them), the remainder of
    the division going one message each to the largest fractions; each share is counted
    exactly, by fetching the partition's next messages (so the driver reads what the batch
    will read, once more). A partition with fewer messages than its share ends at its high
    watermark: its unused share is not passed on."""
    first = {
        tp: max(begin.get(tp, log_start), log_start) for tp, (_, log_start, _) in current.items()
    }
    available = {tp: max(0, high - first[tp]) for tp, (_, _, high) in current.items()}
    total = sum(available.values())
    ends: Offsets = {}
    if not total:
        return {tp: high for tp, (_, _, high) in current.items()}
    shares = {tp: available[tp] * max_messages // total for tp in available}
    by_fraction = sorted(
        (tp for tp in available if available[tp]),
        key=lambda tp: (available[tp] * max_messages % total, available[tp]),
        reverse=True,
    )
    for tp in by_fraction[: max(0, max_messages - sum(shares.values()))]:
        shares[tp] += 1
    for tp, (endpoint, _, high) in current.items():
        start = begin.get(tp, first[tp])
        if high < start:  # the partition went back (re-created): let the batch report it
            ends[tp] = high
        elif shares[tp]:
            ends[tp] = _after_messages(cluster, tp, endpoint, first[tp], high, shares[tp])
        else:
            ends[tp] = start
    return ends


def _count_up_to(
    cluster: DriverView,
    begin: Offsets,
    current: Mapping[SourcePartition, tuple[str, int, int]],
    wanted: int,
) -> int:
    """How many readable messages wait after `begin`, counted by reading them, partition
    by partition, until `wanted` are found (no read when the bytes waiting cannot hold that
    many: a message is at least HEADER_SIZE bytes)."""
    waiting = {
        tp: (endpoint, max(begin.get(tp, log_start), log_start), high)
        for tp, (endpoint, log_start, high) in current.items()
    }
    if sum(max(0, high - first) for _, first, high in waiting.values()) < wanted * HEADER_SIZE:
        return 0
    found = 0
    for tp, (endpoint, first, high) in waiting.items():
        if high <= first:
            continue
        connection = cluster.connect(endpoint)
        try:
            for _ in lag.messages(connection, tp.topic, tp.partition, first, high, RETRIES):
                found += 1
                if found >= wanted:
                    return found
        except BrokerError as error:
            if error.code != ErrorCode.OFFSET_OUT_OF_RANGE:  # retention moved past `first`
                raise
    return found


COMMIT_TIMEOUT_S = 3.0
"""A read-only group's commit waits this long for a reply (three times in all, the coordinator
moving): a refused commit only leaves the reported lag behind."""


class GroupCommits:
    """A stream's read-only group: its offsets committed through the group's coordinator
    (OFFSET_COMMIT without a member, docs/protocol.md "Consumer groups"), with no member and no
    owner: `pylogctl group describe` reads its lag. Refused (GROUP_NOT_EMPTY) while members of
    the group read its topics: their commits are the group's."""

    def __init__(self, bootstrap: str, group: str, keys: ClientKeys | None) -> None:
        self.calls = GroupCalls(bootstrap, group, CLIENT_ID, COMMIT_TIMEOUT_S, keys=keys)
        self._committed: dict[SourcePartition, int] = {}

    def commit(self, offsets: Offsets) -> None:
        """Commit each partition's offset that moved since the last commit."""
        moved = {tp: o for tp, o in offsets.items() if self._committed.get(tp) != o}
        if not moved:
            return
        outcome = self.calls.commit(
            {TopicPartition(tp.topic, tp.partition): o for tp, o in moved.items()}
        )
        for tp, offset in moved.items():
            code = outcome.get(TopicPartition(tp.topic, tp.partition))
            if code == ErrorCode.NONE:
                self._committed[tp] = offset
            else:
                log.warning(
                    "group %s: %s-%d not committed: %s",
                    self.calls.group,
                    tp.topic,
                    tp.partition,
                    code,
                )

    def close(self) -> None:
        self.calls.close()


def _after_messages(
    cluster: DriverView, tp: SourcePartition, endpoint: str, start: int, end: int, count: int
) -> int:
    """The offset after the first `count` readable messages of [start, end) (damaged ranges
    count as no message), or `end` when there are fewer; `start` when retention has just
    deleted it (the next batch plans again from the new log start)."""
    connection = cluster.connect(endpoint)
    try:
        for number, message in enumerate(
            lag.messages(connection, tp.topic, tp.partition, start, end, RETRIES), 1
        ):
            if number == count:
                return message.next_offset
    except BrokerError as error:
        if error.code == ErrorCode.INVALID_OFFSET:
            raise not_a_boundary(tp, start, error) from None
        if error.code != ErrorCode.OFFSET_OUT_OF_RANGE:
            raise
        return start
    return end


def _within_budget(
    cluster: DriverView,
    begin: Offsets,
    current: Mapping[SourcePartition, tuple[str, int, int]],
    max_bytes: int,
) -> Offsets:
    """End offsets that read at most `max_bytes` bytes in all (at least one message when
    there is any), shared among the partitions in proportion to what each has to read, each
    cut at a message boundary."""
    first = {
        tp: max(begin.get(tp, log_start), log_start) for tp, (_, log_start, _) in current.items()
    }
    available = {tp: max(0, high - first[tp]) for tp, (_, _, high) in current.items()}
    total = sum(available.values())
    if total <= max_bytes:
        return {tp: high for tp, (_, _, high) in current.items()}
    ends: Offsets = {}
    for tp, (endpoint, _, high) in current.items():
        share = available[tp] * max_bytes // total
        start = begin.get(tp, first[tp])
        if high < start:  # the partition went back (re-created): let the batch report it
            ends[tp] = high
        elif share:
            ends[tp] = cluster.message_bounds(tp, endpoint, first[tp] + share)[0]
        else:
            ends[tp] = start
    if all(ends[tp] <= begin.get(tp, first[tp]) for tp in ends):
        # Not one whole message fits a share: read one message of the fullest partition.
        tp = max(available, key=available.__getitem__)
        endpoint = current[tp][0]
        ends[tp] = cluster.message_bounds(tp, endpoint, first[tp] + 1)[1]
    return ends
