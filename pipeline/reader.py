"""Reading pylog into Spark: batch and streaming readers, and the task that fetches a range.

A Spark input partition is an `OffsetRange`: the messages of one topic partition whose
offsets lie in [start, end), `start` a message boundary. The driver plans ranges (one per
topic partition, cut at message boundaries into pieces of at most maxBytesPerPartition bytes);
a task fetches its range from the broker holding the partition and hands Spark Arrow record
batches, one per FETCH reply.

Streaming offsets are {"topic": {"partition": offset}} in Spark's checkpoint and nowhere else:
the reader commits nothing to the brokers or to ZooKeeper. Each micro-batch reads [offset in
the previous batch's end, offset in this one's); a partition that is in the end offsets but not
in the start ones (added to the topic since) is read from its log start.

Lost data: a task that finds its range (partly) deleted by retention, or beyond a partition
that has been re-created shorter, raises DataLoss naming the topic, partition and the missing
range when failOnDataLoss is true, and otherwise logs a warning and reads on from the log start.
Damaged data on a broker's disk (docs/storage.md, "Damaged data": the broker's CORRUPT_SEGMENT,
or a fetched message that fails its checks) is lost data too: DataLoss naming the damaged
offsets, or with failOnDataLoss false a warning, and the task reads on past them.

Readers hold only picklable values (options, endpoints): Spark ships them to its tasks. Every
connection is opened and closed within one call.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

import pyarrow as pa
from pyspark.sql.datasource import DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxBytes,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import (
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from broker.client.connection import Connection
from broker.client.consumer import corrupt_segment_reply, decode_fetched, grown_fetch_bytes
from broker.errors import BrokerError, CorruptSegment
from broker.log.message import Message
from broker.protocol import EARLIEST as EARLIEST_TIME
from broker.protocol import LATEST as LATEST_TIME
from broker.protocol import ErrorCode, FetchRequest, OffsetsRequest
from pipeline.cluster import CLIENT_ID, RETRIES, Cluster, TopicPartition
from pipeline.errors import DataLoss, NotMessageBoundary, OptionError, PipelineError
from pipeline.options import EARLIEST, LATEST, SourceOptions

log = logging.getLogger(__name__)

SCHEMA: Final = StructType(
    [
        StructField("key", BinaryType(), True),
        StructField("value", BinaryType(), True),
        StructField("topic", StringType(), True),
        StructField("partition", IntegerType(), True),
        StructField("offset", LongType(), True),
        StructField("timestamp", TimestampType(), True),
    ]
)
"""The rows of the source, as in Spark's Kafka source (without headers and timestampType)."""

ARROW_SCHEMA: Final = to_arrow_schema(SCHEMA, timezone="UTC")
FETCH_BYTES: Final = 4 << 20
MAX_FETCH_BYTES: Final = 64 << 20

Offsets = dict[TopicPartition, int]


@dataclass(frozen=True)
class OffsetRange(InputPartition):
    """The messages of `topic` partition `partition` with offsets in [start, end), read from
    the broker at `endpoint`; `start` is a message boundary."""

    topic: str
    partition: int
    endpoint: str
    start: int
    end: int


def encode_offsets(offsets: Mapping[TopicPartition, int]) -> dict[str, dict[str, int]]:
    """Offsets as Spark keeps them: {"topic": {"partition": offset}}, sorted."""
    encoded: dict[str, dict[str, int]] = {}
    for tp in sorted(offsets):
        encoded.setdefault(tp.topic, {})[str(tp.partition)] = offsets[tp]
    return encoded


def decode_offsets(encoded: Mapping[str, Any]) -> Offsets:
    """The inverse of encode_offsets; PipelineError for anything else (a checkpoint written by
    another source, say)."""
    offsets: Offsets = {}
    for topic, partitions in encoded.items():
        if not isinstance(partitions, dict):
            raise PipelineError(f"not pylog offsets: {dict(encoded)!r}")
        for number, offset in partitions.items():
            if not str(number).isdigit() or not isinstance(offset, int) or offset < 0:
                raise PipelineError(f"not pylog offsets: {dict(encoded)!r}")
            offsets[TopicPartition(topic, int(number))] = offset
    return offsets


# -- tasks ---------------------------------------------------------------------------------


def read_range(rng: OffsetRange, fail_on_data_loss: bool) -> Iterator[pa.RecordBatch]:
    """The messages of `rng` as Arrow record batches of the source's schema (the body of a
    Spark task). NotMessageBoundary when `rng.start` is inside a message."""
    tp = TopicPartition(rng.topic, rng.partition)
    fetch_bytes = FETCH_BYTES
    position = rng.start
    with Connection(rng.endpoint, CLIENT_ID) as connection:
        while position < rng.end:
            request = FetchRequest(rng.topic, rng.partition, position, fetch_bytes, 0, 0)
            try:
                reply = connection.call(request, RETRIES)
            except BrokerError as error:
                grown = grown_fetch_bytes(error, MAX_FETCH_BYTES)
                if grown is not None:
                    fetch_bytes = grown
                    continue
                if error.code == ErrorCode.INVALID_OFFSET:
                    raise _not_a_boundary(tp, position, error) from None
                damage = corrupt_segment_reply(error, tp.topic, tp.partition)
                if damage is not None:
                    position = _skip_damaged(tp, damage, fail_on_data_loss)
                    continue
                if error.code != ErrorCode.OFFSET_OUT_OF_RANGE:
                    raise
                position = _skip_lost(connection, tp, position, rng.end, fail_on_data_loss)
                continue
            if not reply.message_set:  # position is the high watermark, below the planned end
                why = f"the partition now ends at {reply.high_watermark} (re-created?)"
                _lost(tp, position, rng.end, why, fail_on_data_loss)
                return
            messages, damage = decode_fetched(reply.message_set, position, tp.topic, tp.partition)
            batch = _record_batch(messages, rng.end, tp)
            if batch.num_rows:
                yield batch
            if damage is None:
                position += len(reply.message_set)
            elif damage.start >= rng.end:
                return  # the next range's: its task reports it
            else:
                position = _skip_damaged(tp, damage, fail_on_data_loss)


def _not_a_boundary(tp: TopicPartition, position: int, error: BrokerError) -> PipelineError:
    return NotMessageBoundary(tp.topic, tp.partition, position, error.message)


def _skip_lost(
    connection: Connection, tp: TopicPartition, position: int, end: int, fail: bool
) -> int:
    """Where to read on after OFFSET_OUT_OF_RANGE at `position`: the log start, once the
    loss is reported (DataLoss) or logged."""
    log_start = connection.call(OffsetsRequest(tp.topic, tp.partition, EARLIEST_TIME), RETRIES)
    high = connection.call(OffsetsRequest(tp.topic, tp.partition, LATEST_TIME), RETRIES)
    if position < log_start.offset:
        why = f"deleted by retention: the log now starts at {log_start.offset}"
        _lost(tp, position, min(log_start.offset, end), why, fail)
        return log_start.offset
    why = f"the partition now ends at {high.offset} (re-created?)"
    _lost(tp, position, end, why, fail)
    return end


def _skip_damaged(tp: TopicPartition, damage: CorruptSegment, fail: bool) -> int:
    """Where to read on past damaged data, once the loss is reported (DataLoss) or logged."""
    why = f"damaged on the broker's disk: {damage.reason}"
    _lost(tp, damage.start, damage.end, why, fail)
    return damage.end


def _lost(tp: TopicPartition, start: int, end: int, why: str, fail: bool) -> None:
    if fail:
        raise DataLoss(tp.topic, tp.partition, start, end, why)
    log.warning(
        "data loss: topic %r partition %d: skipping offsets [%d, %d), %s (failOnDataLoss false)",
        tp.topic,
        tp.partition,
        start,
        end,
        why,
    )


def _record_batch(messages: list[Message], end: int, tp: TopicPartition) -> pa.RecordBatch:
    keys: list[bytes | None] = []
    values: list[bytes] = []
    offsets: list[int] = []
    micros: list[int] = []
    for message in messages:
        if message.offset >= end:
            break
        keys.append(message.key)
        values.append(message.value)
        offsets.append(message.offset)
        micros.append(message.timestamp_ms * 1000)
    count = len(offsets)
    return pa.RecordBatch.from_arrays(
        [
            pa.array(keys, pa.binary()),
            pa.array(values, pa.binary()),
            pa.array([tp.topic] * count, pa.string()),
            pa.array([tp.partition] * count, pa.int32()),
            pa.array(offsets, pa.int64()),
            pa.array(micros, ARROW_SCHEMA.field("timestamp").type),
        ],
        schema=ARROW_SCHEMA,
    )


# -- planning (driver) ---------------------------------------------------------------------


def split_range(
    cluster: Cluster, tp: TopicPartition, endpoint: str, start: int, end: int, size: int
) -> list[OffsetRange]:
    """[start, end) cut at message boundaries into ranges of at most `size` bytes (a single
    message larger than that makes a range of its own)."""
    ranges = []
    low = start
    while end - low > size:
        try:
            bound, following = cluster.message_bounds(tp, endpoint, low + size)
        except BrokerError as error:
            if error.code != ErrorCode.OFFSET_OUT_OF_RANGE:
                raise
            break  # retention moved the log start past `low`: the task reports the loss
        bound = bound if bound > low else following
        ranges.append(OffsetRange(tp.topic, tp.partition, endpoint, low, bound))
        low = bound
    if end > low:
        ranges.append(OffsetRange(tp.topic, tp.partition, endpoint, low, end))
    return ranges


def _resolve(
    cluster: Cluster,
    tp: TopicPartition,
    endpoint: str,
    wanted: int,
    bounds: tuple[int, int],
    what: str,
    fail_on_data_loss: bool,
) -> int:
    """An offset option for one partition, made an offset: EARLIEST and LATEST looked up, an
    offset checked to be a message boundary in [log start, high watermark]."""
    log_start, high_watermark = bounds
    if wanted == EARLIEST:
        return log_start
    if wanted == LATEST:
        return high_watermark
    if wanted > high_watermark:
        raise OptionError(f"{what} {wanted} for {tp} is past its high watermark {high_watermark}")
    if wanted < log_start:
        why = f"deleted by retention: the log starts at {log_start}"
        _lost(tp, wanted, log_start, why, fail_on_data_loss)
        return log_start
    cluster.check_boundary(tp, endpoint, wanted)
    return wanted


def starting_offsets(
    options: SourceOptions, cluster: Cluster, partitions: Mapping[TopicPartition, str]
) -> dict[TopicPartition, tuple[int, int, int]]:
    """For each partition: (start per the options, log start, high watermark)."""
    found = {}
    for tp, endpoint in partitions.items():
        bounds = cluster.offsets(tp, endpoint)
        if options.starting_timestamp_ms is not None:
            start = cluster.offset_for_time(tp, endpoint, options.starting_timestamp_ms)
        else:
            start = _resolve(
                cluster,
                tp,
                endpoint,
                options.starting.get(tp),
                bounds,
                "startingOffsets",
                options.fail_on_data_loss,
            )
        found[tp] = (start, *bounds)
    return found


class PylogBatchReader(DataSourceReader):
    """`spark.read.format("pylog")`: the ranges between startingOffsets and endingOffsets as
    they are when the query is planned."""

    def __init__(self, options: SourceOptions) -> None:
        self.options = options

    def partitions(self) -> Sequence[InputPartition]:
        options = self.options
        ranges: list[OffsetRange] = []
        with Cluster(options.bootstrap) as cluster:
            partitions = options.subscription.partitions(cluster)
            for tp, (start, log_start, high) in starting_offsets(
                options, cluster, partitions
            ).items():
                endpoint = partitions[tp]
                end = _resolve(
                    cluster,
                    tp,
                    endpoint,
                    options.ending.get(tp),
                    (log_start, high),
                    "endingOffsets",
                    options.fail_on_data_loss,
                )
                if end < start:
                    raise OptionError(f"{tp}: endingOffsets {end} is before the start {start}")
                ranges += split_range(
                    cluster, tp, endpoint, start, end, options.max_bytes_per_partition
                )
        return ranges

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if not isinstance(partition, OffsetRange):  # Spark's InputPartition(None) for no ranges
            return iter(())
        return read_range(partition, self.options.fail_on_data_loss)


class PylogStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """`spark.readStream.format("pylog")`: micro-batches from startingOffsets on, within
    maxBytesPerTrigger bytes each when set; Trigger.AvailableNow reads up to the high
    watermarks seen when the query started."""

    def __init__(self, options: SourceOptions) -> None:
        self.options = options
        self._target: Offsets | None = None
        """The high watermarks to stop at under Trigger.AvailableNow."""

    def initialOffset(self) -> dict[str, dict[str, int]]:
        with Cluster(self.options.bootstrap) as cluster:
            partitions = self.options.subscription.partitions(cluster)
            found = starting_offsets(self.options, cluster, partitions)
        return encode_offsets({tp: start for tp, (start, _, _) in found.items()})

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.options.max_bytes_per_trigger is None:
            return ReadAllAvailable()
        return ReadMaxBytes(self.options.max_bytes_per_trigger)

    def prepareForTriggerAvailableNow(self) -> None:
        with Cluster(self.options.bootstrap) as cluster:
            self._target = {tp: high for tp, (_, _, high) in self._current(cluster).items()}

    def reportLatestOffset(self) -> dict[str, dict[str, int]]:
        with Cluster(self.options.bootstrap) as cluster:
            return encode_offsets({tp: high for tp, (_, _, high) in self._current(cluster).items()})

    def _current(self, cluster: Cluster) -> dict[TopicPartition, tuple[str, int, int]]:
        """Each partition read now: (endpoint, log start, high watermark)."""
        return {
            tp: (endpoint, *cluster.offsets(tp, endpoint))
            for tp, endpoint in self.options.subscription.partitions(cluster).items()
        }

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, dict[str, int]]:
        begin = decode_offsets(start)
        ends = dict(begin)  # partitions no longer listed stay where they were
        with Cluster(self.options.bootstrap) as cluster:
            current = self._current(cluster)
            if self._target is not None:
                target = self._target
                current = {
                    tp: (endpoint, log_start, min(high, target[tp]))
                    for tp, (endpoint, log_start, high) in current.items()
                    if tp in target
                }
            if isinstance(limit, ReadAllAvailable):
                ends.update({tp: high for tp, (_, _, high) in current.items()})
            elif isinstance(limit, ReadMaxBytes):
                ends.update(_within_budget(cluster, begin, current, limit.max_bytes))
            else:
                raise PipelineError(
                    f"read limit {limit!r} is not supported: use maxBytesPerTrigger"
                )
        return encode_offsets(ends)

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        begin, ends = decode_offsets(start), decode_offsets(end)
        ranges: list[OffsetRange] = []
        with Cluster(self.options.bootstrap) as cluster:
            holders = self.options.subscription.partitions(cluster)
            for tp, stop in ends.items():
                endpoint = holders.get(tp)
                first = begin.get(tp)
                if first is None:  # a partition new since the last batch: from its log start
                    first = cluster.offsets(tp, endpoint)[0] if endpoint else stop
                if stop < first:
                    why = f"its offsets went back from {first} to {stop} (re-created?)"
                    _lost(tp, stop, first, why, self.options.fail_on_data_loss)
                    continue
                if stop == first:
                    continue
                if endpoint is None:
                    _lost(
                        tp,
                        first,
                        stop,
                        "the partition no longer exists",
                        self.options.fail_on_data_loss,
                    )
                    continue
                ranges += split_range(
                    cluster, tp, endpoint, first, stop, self.options.max_bytes_per_partition
                )
        return ranges

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, OffsetRange)
        return read_range(partition, self.options.fail_on_data_loss)


def _within_budget(
    cluster: Cluster,
    begin: Offsets,
    current: Mapping[TopicPartition, tuple[str, int, int]],
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
