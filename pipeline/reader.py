"""Reading pylog into Spark: the batch reader, and the ranges both readers plan and the tasks
that fetch them (the streaming reader is pipeline.stream_reader's).

A Spark input partition is an `OffsetRange`: the messages of one topic partition whose
offsets lie in [start, end), `start` a message boundary. The driver plans ranges (one per
topic partition, cut at message boundaries into pieces of at most maxBytesPerPartition bytes,
and smaller when minPartitions asks for more ranges than there are partitions); a task fetches
its range from the broker holding the partition and hands Spark Arrow record batches, one per
FETCH reply.

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

import json
import logging
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

import pyarrow as pa
from pyspark.sql.datasource import DataSourceReader, InputPartition
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from broker.client.connection import Connection
from broker.client.consumer import corrupt_segment_reply, damaged_range, grown_fetch_bytes
from broker.errors import BrokerError, CorruptSegment
from broker.log.codec import decode_columns
from broker.log.columns import Columns
from broker.protocol import EARLIEST, LATEST, ErrorCode, FetchRequest, OffsetsRequest
from broker.security import ClientKeys
from pipeline.cluster import CLIENT_ID, FETCH_TIMEOUT_S, RETRIES, DriverView, SourcePartition
from pipeline.errors import DataLoss, NotMessageBoundary, OptionError, PipelineError
from pipeline.options import SourceOptions

log = logging.getLogger(__name__)

SCHEMA: Final = StructType(
    [
        StructField("key", BinaryType(), True),
        StructField("value", BinaryType(), True),
        StructField("topic", StringType(), True),
        StructField("partition", IntegerType(), True),
        StructField("offset", LongType(), True),
        StructField("timestamp", TimestampType(), True),
        StructField("timestampType", IntegerType(), True),
    ]
)
"""The rows of the source, as in Spark's Kafka source without includeHeaders. timestampType
is always 0, Kafka's CreateTime: the timestamp is the producer's."""

HEADERS_TYPE: Final = ArrayType(
    StructType([StructField("key", StringType(), True), StructField("value", BinaryType(), True)])
)
"""The headers column, as spark-sql-kafka types it: null for a message without headers."""
SCHEMA_WITH_HEADERS: Final = StructType(
    [*SCHEMA.fields, StructField("headers", HEADERS_TYPE, True)]
)
"""The rows of the source with includeHeaders true."""

ARROW_SCHEMA: Final = to_arrow_schema(SCHEMA, timezone="UTC")
ARROW_SCHEMA_WITH_HEADERS: Final = to_arrow_schema(SCHEMA_WITH_HEADERS, timezone="UTC")
CREATE_TIME: Final = 0
_TIMESTAMP: Final = ARROW_SCHEMA.field("timestamp").type
"""timestampType of every row: Kafka's CreateTime (the producer's timestamp)."""
FETCH_BYTES: Final = 4 << 20
MAX_FETCH_BYTES: Final = 64 << 20

Offsets = dict[SourcePartition, int]


@dataclass(frozen=True)
class OffsetRange(InputPartition):
    """The messages of `topic` partition `partition` with offsets in [start, end), read from
    the broker at `endpoint`; `start` is a message boundary."""

    topic: str
    partition: int
    endpoint: str
    start: int
    end: int


def encode_offsets(offsets: Mapping[SourcePartition, int]) -> dict[str, dict[str, int]]:
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
            offsets[SourcePartition(topic, int(number))] = offset
    return offsets


def offsets_behind_latest(end_offset: str | None, latest_offset: str | None) -> dict[str, float]:
    """Spark's Kafka-source metrics minOffsetsBehindLatest, maxOffsetsBehindLatest and
    avgOffsetsBehindLatest, in bytes, from a micro-batch's progress (`endOffset` and
    `latestOffset` of its entry in StreamingQueryProgress.sources): for each partition, its
    latest offset when the batch was planned less where the batch ended. Spark does not let a
    Python source report them itself (docs/pipeline.md, "Metrics"). Empty without offsets."""
    if not end_offset or not latest_offset:
        return {}
    ends = decode_offsets(json.loads(end_offset))
    behind = [
        latest - ends[tp]
        for tp, latest in decode_offsets(json.loads(latest_offset)).items()
        if tp in ends
    ]
    if not behind:
        return {}
    return {
        "minOffsetsBehindLatest": float(min(behind)),
        "maxOffsetsBehindLatest": float(max(behind)),
        "avgOffsetsBehindLatest": sum(behind) / len(behind),
    }


# -- tasks ---------------------------------------------------------------------------------


def read_range(
    rng: OffsetRange,
    fail_on_data_loss: bool,
    keys: ClientKeys | None = None,
    include_headers: bool = False,
    timeout_s: float = FETCH_TIMEOUT_S,
) -> Iterator[pa.RecordBatch]:
    """The messages of `rng` as Arrow record batches of the source's schema (the body of a
    Spark task; its headers column too with `include_headers`), fetched with `keys` from a
    broker serving Curve, each reply waited for `timeout_s` (kafkaConsumer.pollTimeoutMs).
    NotMessageBoundary when `rng.start` is inside a message."""
    tp = SourcePartition(rng.topic, rng.partition)
    fetch_bytes = FETCH_BYTES
    position = rng.start
    ahead: tuple[FetchRequest, int] | None = None  # the fetch sent before a batch was yielded
    with Connection(rng.endpoint, CLIENT_ID, timeout_s, keys=keys) as connection:
        while position < rng.end:
            request = FetchRequest(rng.topic, rng.partition, position, fetch_bytes, 0, 0)
            try:
                reply = None
                if ahead is not None and ahead[0] == request:
                    reply = connection.fetched_ahead(ahead[1], connection.timeout_s)
                ahead = None
                if reply is None:
                    reply = connection.call(request, RETRIES)
            except BrokerError as error:
                grown = grown_fetch_bytes(error, MAX_FETCH_BYTES)
                if grown is not None:
                    fetch_bytes = grown
                    continue
                if error.code == ErrorCode.INVALID_OFFSET:
                    raise not_a_boundary(tp, position, error) from None
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
                lost(tp, position, rng.end, why, fail_on_data_loss)
                return
            following = position + len(reply.message_set)
            if following < rng.end:  # the broker reads it while Spark takes this batch
                request = FetchRequest(rng.topic, rng.partition, following, fetch_bytes, 0, 0)
                ahead = request, connection.send_pipelined(request)
            failure = None  # the last chunk's: where the reply's rows stopped
            for columns, failure_at in decode_columns(reply.message_set, position, rng.end):
                if columns.rows:  # one chunk at a time: the reply's sets expand within a budget
                    yield _record_batch(columns, tp, include_headers)
                failure = failure_at
            if failure is None:
                position = following
                continue
            damage = damaged_range(reply.message_set, position, tp.topic, tp.partition, failure)
            if damage.start >= rng.end:
                return  # the next range's: its task reports it
            position = _skip_damaged(tp, damage, fail_on_data_loss)


def read_with(options: SourceOptions, rng: OffsetRange) -> Iterator[pa.RecordBatch]:
    """`read_range` of `rng` as the source's options ask (a task of a batch or a stream)."""
    return read_range(
        rng, options.fail_on_data_loss, options.keys, options.headers, options.poll_timeout_s
    )


def not_a_boundary(tp: SourcePartition, position: int, error: BrokerError) -> PipelineError:
    return NotMessageBoundary(tp.topic, tp.partition, position, error.message)


def _skip_lost(
    connection: Connection, tp: SourcePartition, position: int, end: int, fail: bool
) -> int:
    """Where to read on after OFFSET_OUT_OF_RANGE at `position`: the log start, once the
    loss is reported (DataLoss) or logged."""
    log_start = connection.call(OffsetsRequest(tp.topic, tp.partition, EARLIEST), RETRIES)
    high = connection.call(OffsetsRequest(tp.topic, tp.partition, LATEST), RETRIES)
    if position < log_start.offset:
        why = f"deleted by retention: the log now starts at {log_start.offset}"
        lost(tp, position, min(log_start.offset, end), why, fail)
        return log_start.offset
    why = f"the partition now ends at {high.offset} (re-created?)"
    lost(tp, position, end, why, fail)
    return end


def _skip_damaged(tp: SourcePartition, damage: CorruptSegment, fail: bool) -> int:
    """Where to read on past damaged data, once the loss is reported (DataLoss) or logged."""
    why = f"damaged on the broker's disk: {damage.reason}"
    lost(tp, damage.start, damage.end, why, fail)
    return damage.end


def lost(tp: SourcePartition, start: int, end: int, why: str, fail: bool) -> None:
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


def _record_batch(
    columns: Columns, tp: SourcePartition, include_headers: bool = False
) -> pa.RecordBatch:
    """The record batch of messages decoded into Arrow buffers (broker.log.codec, in C when
    built), used as they are; the columns that are the same in every row made by Arrow."""
    rows = columns.rows
    buffer = pa.py_buffer
    headers = [_headers_array(columns)] if include_headers else []
    return pa.RecordBatch.from_arrays(
        [
            pa.Array.from_buffers(
                pa.binary(),
                rows,
                [
                    buffer(columns.key_validity),
                    buffer(columns.key_offsets),
                    buffer(columns.key_data),
                ],
                null_count=columns.key_nulls,
            ),
            pa.Array.from_buffers(
                pa.binary(),
                rows,
                [None, buffer(columns.value_offsets), buffer(columns.value_data)],
                null_count=0,
            ),
            pa.repeat(pa.scalar(tp.topic, pa.string()), rows),
            pa.repeat(pa.scalar(tp.partition, pa.int32()), rows),
            pa.Array.from_buffers(pa.int64(), rows, [None, buffer(columns.offsets)], null_count=0),
            pa.Array.from_buffers(
                _TIMESTAMP, rows, [None, buffer(columns.timestamps_us)], null_count=0
            ),
            pa.repeat(pa.scalar(CREATE_TIME, pa.int32()), rows),
            *headers,
        ],
        schema=ARROW_SCHEMA_WITH_HEADERS if include_headers else ARROW_SCHEMA,
    )


def _headers_array(columns: Columns) -> pa.Array:
    """The headers column of `columns`: a list of (key, value) structs a row, null for a row
    without headers, from the buffers the codec filled."""
    buffer = pa.py_buffer
    entries = columns.header_entries
    keys = pa.Array.from_buffers(
        pa.string(),
        entries,
        [None, buffer(columns.header_key_offsets), buffer(columns.header_key_data)],
        null_count=0,
    )
    values = pa.Array.from_buffers(
        pa.binary(),
        entries,
        [
            buffer(columns.header_value_validity),
            buffer(columns.header_value_offsets),
            buffer(columns.header_value_data),
        ],
        null_count=columns.header_value_nulls,
    )
    entry_type = ARROW_SCHEMA_WITH_HEADERS.field("headers").type.value_type
    pairs = pa.StructArray.from_arrays([keys, values], fields=list(entry_type))
    return pa.Array.from_buffers(
        ARROW_SCHEMA_WITH_HEADERS.field("headers").type,
        columns.rows,
        [buffer(columns.header_validity), buffer(columns.header_offsets)],
        null_count=columns.header_nulls,
        children=[pairs],
    )


# -- planning (driver) ---------------------------------------------------------------------


def split_range(
    cluster: DriverView,
    tp: SourcePartition,
    endpoint: str,
    start: int,
    end: int,
    size: int,
    parts: int = 1,
) -> list[OffsetRange]:
    """[start, end) cut at message boundaries into `parts` ranges of about equal bytes, and
    those into ranges of at most `size` bytes (a single message larger than a piece makes a
    range of its own). Each cut is at the start of the message holding the point aimed at."""
    length = end - start
    ranges = []
    low = aimed = start
    while True:
        # the next of the points start + length * i // parts (0 < i < parts) past `aimed`
        i = -(-(aimed - start + 1) * parts // length) if length > 0 else parts
        target = start + length * i // parts if i < parts else None
        if end - low > size and (target is None or target - low > size):
            target = low + size
        if target is None:
            break
        try:
            bound, following = cluster.message_bounds(tp, endpoint, target)
        except BrokerError as error:
            if error.code != ErrorCode.OFFSET_OUT_OF_RANGE:
                raise
            break  # retention moved the log start past `low`: the task reports the loss
        bound = bound if bound > low else following
        if bound >= end:
            break
        ranges.append(OffsetRange(tp.topic, tp.partition, endpoint, low, bound))
        low, aimed = bound, max(target, bound)
    if end > low:
        ranges.append(OffsetRange(tp.topic, tp.partition, endpoint, low, end))
    return ranges


def plan(
    cluster: DriverView,
    spans: Sequence[tuple[SourcePartition, str, int, int]],
    options: SourceOptions,
) -> list[OffsetRange]:
    """The input partitions that read [start, end) of each (partition, endpoint, start, end):
    ranges of at most maxBytesPerPartition bytes, cut at message boundaries. When minPartitions
    is more than the partitions with something to read, each partition's range is also cut
    into about equal parts, as many as its share of all the bytes to read gives it of
    minPartitions (at least one), as Spark's Kafka source shares minPartitions by offsets."""
    wanted = options.min_partitions
    total = sum(max(0, end - start) for _, _, start, end in spans)
    readable = sum(1 for _, _, start, end in spans if end > start)
    if wanted is None or total == 0 or wanted <= readable:
        wanted = 0  # no split asked for, or no more ranges than partitions
    ranges: list[OffsetRange] = []
    for tp, endpoint, start, end in spans:
        parts = max(1, round((end - start) * wanted / total)) if wanted else 1
        ranges += split_range(
            cluster, tp, endpoint, start, end, options.max_bytes_per_partition, parts
        )
    return ranges


def _resolve(
    cluster: DriverView,
    tp: SourcePartition,
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
        lost(tp, wanted, log_start, why, fail_on_data_loss)
        return log_start
    cluster.check_boundary(tp, endpoint, wanted)
    return wanted


def starting_offsets(
    options: SourceOptions, cluster: DriverView, partitions: Mapping[SourcePartition, str]
) -> dict[SourcePartition, tuple[int, int, int]]:
    """For each partition: (start per the options, log start, high watermark)."""
    found = {}
    for tp, endpoint in partitions.items():
        bounds = cluster.offsets(tp, endpoint)
        moment = options.starting_time.get(tp)
        if moment is not None:
            start = cluster.offset_for_time(tp, endpoint, moment)
            if start == bounds[1] and options.time_no_match_error:
                raise OptionError(
                    f"{tp} has no message with a timestamp at or after {moment} (the starting "
                    "time); startingOffsetsByTimestampStrategy latest starts it at its latest "
                    "offset instead"
                )
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
        spans: list[tuple[SourcePartition, str, int, int]] = []
        with options.cluster() as cluster:
            partitions = options.subscription.partitions(cluster)
            for tp, (start, log_start, high) in starting_offsets(
                options, cluster, partitions
            ).items():
                endpoint = partitions[tp]
                moment = options.ending_time.get(tp)
                if moment is not None:
                    end = cluster.offset_for_time(tp, endpoint, moment)
                else:
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
                    raise OptionError(f"{tp}: the end {end} is before the start {start}")
                spans.append((tp, endpoint, start, end))
            return plan(cluster, spans, options)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if not isinstance(partition, OffsetRange):  # Spark's InputPartition(None) for no ranges
            return iter(())
        return read_with(self.options, partition)
