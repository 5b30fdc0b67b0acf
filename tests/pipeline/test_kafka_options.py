"""Spark's Kafka-source options, with their Kafka meaning, against a real broker and the
session's local Spark (docs/pipeline.md, "Every spark-sql-kafka option")."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from pyspark.errors import PySparkException, StreamingQueryException
from pyspark.sql import DataFrame, Row, SparkSession
from pyspark.sql.types import StringType, StructField, StructType

from broker.client import Ack, PartitionConsumer, Producer
from pipeline.errors import OptionError
from pipeline.options import parse_source_options
from pipeline.reader import offsets_behind_latest
from pipeline.sink import parse_sink_options
from tests.conftest import wait_until
from tests.pipeline.conftest import Sent, create_topic, produce
from tests.pipeline.test_stream import QUERY_TIMEOUT_S, run_available_now, start_stream, values
from tests.pylogd import RunningBroker

KAFKA_SCHEMA = (
    "key binary, value binary, topic string, partition int, offset long, timestamp timestamp, "
    "timestampType int"
)
"""The Kafka source's schema (without includeHeaders), as Spark's guide gives it."""


def _read(spark: SparkSession, **options: str) -> list[Any]:
    return spark.read.format("pylog").options(**options).load().collect()


def _stamps(sent: list[Sent], partition: int) -> list[int]:
    return [s.timestamp_ms for s in sent if s.partition == partition]


# -- subscribePattern -----------------------------------------------------------------------


def test_subscribe_pattern_reads_every_topic_whose_whole_name_matches(
    spark: SparkSession, broker: RunningBroker, topic: str
) -> None:
    for name, partitions in ((f"{topic}-a", 2), (f"{topic}-b", 1), (f"{topic}-a-x", 1)):
        create_topic(broker.endpoint, name, partitions)
        produce(broker.endpoint, name, partitions, 4, first=len(name))

    rows = _read(spark, broker=broker.endpoint, subscribePattern=f"{re.escape(topic)}-[ab]")

    assert sorted({(r.topic, r.partition) for r in rows}) == [
        (f"{topic}-a", 0),
        (f"{topic}-a", 1),
        (f"{topic}-b", 0),
    ]
    assert len(rows) == 8
    assert _read(spark, broker=broker.endpoint, subscribePattern=f"{topic}-none.*") == []


def test_a_running_stream_picks_up_a_topic_created_later_from_its_log_start(
    spark: SparkSession, broker: RunningBroker, topic: str, tmp_path: Path
) -> None:
    first, later = f"{topic}-1", f"{topic}-2"
    create_topic(broker.endpoint, first, 1)
    sent = produce(broker.endpoint, first, 1, 3)
    seen: list[Row] = []

    def collect(frame: DataFrame, _batch_id: int) -> None:
        seen.extend(frame.collect())

    query = (
        spark.readStream.format("pylog")
        .options(
            broker=broker.endpoint,
            subscribePattern=f"{re.escape(topic)}-\\d",
            startingOffsets="earliest",
        )
        .load()
        .writeStream.foreachBatch(collect)
        .option("checkpointLocation", str(tmp_path))
        .trigger(processingTime="200 milliseconds")
        .start()
    )
    try:
        wait_until(lambda: len(seen) == 3, timeout=QUERY_TIMEOUT_S, what="the first topic")
        create_topic(broker.endpoint, later, 2)
        sent += produce(broker.endpoint, later, 2, 6, first=10)
        wait_until(lambda: len(seen) == 9, timeout=QUERY_TIMEOUT_S, what="the new topic")
    finally:
        query.stop()

    assert sorted(r.value for r in seen) == sorted(s.value for s in sent)


# -- maxOffsetsPerTrigger -------------------------------------------------------------------


def test_max_offsets_per_trigger_counts_messages(
    spark: SparkSession, broker: RunningBroker, topic: str, tmp_path: Path
) -> None:
    create_topic(broker.endpoint, topic, 2)
    sent = produce(broker.endpoint, topic, 2, 30, value_bytes=50)

    batches = run_available_now(
        spark,
        tmp_path,
        broker=broker.endpoint,
        subscribe=topic,
        startingOffsets="earliest",
        maxOffsetsPerTrigger="7",
    )

    sizes = [len(batch) for batch in batches if batch]
    assert max(sizes) == 7 and len(sizes) >= 5, sizes  # 30 messages, at most 7 a batch
    assert values(batches) == sorted(s.value for s in sent)


def test_max_offsets_and_max_bytes_per_trigger_both_hold(
    spark: SparkSession, broker: RunningBroker, topic: str, tmp_path: Path
) -> None:
    create_topic(broker.endpoint, topic, 1)
    sent = produce(broker.endpoint, topic, 1, 12, value_bytes=100)  # 131-135 bytes each

    batches = run_available_now(
        spark,
        tmp_path,
        broker=broker.endpoint,
        subscribe=topic,
        startingOffsets="earliest",
        maxOffsetsPerTrigger="4",
        maxBytesPerTrigger="300",
    )

    assert {len(batch) for batch in batches if batch} == {2}  # 300 bytes hold 2 of them
    assert values(batches) == sorted(s.value for s in sent)


# -- minPartitions --------------------------------------------------------------------------


def test_min_partitions_splits_partitions_on_message_boundaries(
    spark: SparkSession, broker: RunningBroker, topic: str
) -> None:
    create_topic(broker.endpoint, topic, 2)
    sent = produce(broker.endpoint, topic, 2, 40, value_bytes=60)

    frame = (
        spark.read.format("pylog")
        .options(broker=broker.endpoint, subscribe=topic, minPartitions="6")
        .load()
    )

    assert frame.rdd.getNumPartitions() == 6  # 3 about equal parts of each partition
    rows = frame.collect()
    assert sorted((r.partition, r.value) for r in rows) == sorted(
        (s.partition, s.value) for s in sent
    )
    two = spark.read.format("pylog").options(
        broker=broker.endpoint, subscribe=topic, minPartitions="2"
    )
    assert two.load().rdd.getNumPartitions() == 2  # not more than the topic's partitions


# -- offsets by time ------------------------------------------------------------------------


def test_starting_and_ending_offsets_by_timestamp_bound_a_batch_read(
    spark: SparkSession, broker: RunningBroker, topic: str
) -> None:
    create_topic(broker.endpoint, topic, 2)
    sent = produce(broker.endpoint, topic, 2, 20)  # partition 0 even numbers, 1 odd ones
    zero, one = _stamps(sent, 0), _stamps(sent, 1)

    rows = _read(
        spark,
        broker=broker.endpoint,
        subscribe=topic,
        startingOffsetsByTimestamp=json.dumps({topic: {"0": zero[2], "1": one[5]}}),
        endingOffsetsByTimestamp=json.dumps({topic: {"0": zero[6]}}),
    )

    stamps = sorted((r.partition, round(r.timestamp.timestamp() * 1000)) for r in rows)
    assert stamps == [(0, t) for t in zero[2:6]] + [(1, t) for t in one[5:]]


def test_starting_and_ending_timestamp_apply_to_every_partition(
    spark: SparkSession, broker: RunningBroker, topic: str
) -> None:
    create_topic(broker.endpoint, topic, 2)
    sent = produce(broker.endpoint, topic, 2, 20)
    start, end = sent[5].timestamp_ms, sent[15].timestamp_ms  # numbers 5 to 14

    rows = _read(
        spark,
        broker=broker.endpoint,
        subscribe=topic,
        startingTimestamp=str(start),
        endingTimestamp=str(end),
    )

    assert sorted(r.value for r in rows) == sorted(s.value for s in sent[5:15])


def test_a_starting_time_after_every_message_starts_at_latest_or_fails_with_strategy_error(
    spark: SparkSession, broker: RunningBroker, topic: str
) -> None:
    create_topic(broker.endpoint, topic, 1)
    sent = produce(broker.endpoint, topic, 1, 3)
    after = str(sent[-1].timestamp_ms + 1)
    options = {"broker": broker.endpoint, "subscribe": topic, "startingTimestamp": after}

    assert _read(spark, **options) == []
    assert _read(spark, **options, startingOffsetsByTimestampStrategy="latest") == []
    with pytest.raises(PySparkException, match=f"{topic}-0 has no message with a timestamp"):
        _read(spark, **options, startingOffsetsByTimestampStrategy="error")


def test_a_stream_starts_at_starting_offsets_by_timestamp(
    spark: SparkSession, broker: RunningBroker, topic: str, tmp_path: Path
) -> None:
    create_topic(broker.endpoint, topic, 1)
    sent = produce(broker.endpoint, topic, 1, 6)

    batches = run_available_now(
        spark,
        tmp_path,
        broker=broker.endpoint,
        subscribe=topic,
        startingOffsetsByTimestamp=json.dumps({topic: {"0": sent[4].timestamp_ms}}),
    )

    assert values(batches) == sorted(s.value for s in sent[4:])


# -- schema and headers ---------------------------------------------------------------------


def test_code_written_for_the_kafka_schema_runs_unchanged(
    spark: SparkSession, broker: RunningBroker, topic: str
) -> None:
    create_topic(broker.endpoint, topic, 1)
    produce(broker.endpoint, topic, 1, 3)

    frame = (
        spark.read.format("pylog")
        .schema(KAFKA_SCHEMA)
        .options(broker=broker.endpoint, subscribe=topic, includeHeaders="false")
        .load()
        .selectExpr("CAST(key AS STRING)", "CAST(value AS STRING)", "timestampType")
    )

    assert sorted((tuple(r) for r in frame.collect()), key=lambda r: r[1]) == [
        (None, "value-0", 0),
        ("key-1", "value-1", 0),
        ("key-2", "value-2", 0),
    ]


def test_include_headers_gives_the_headers_column_as_kafkas_source_types_it(
    spark: SparkSession, broker: RunningBroker, topic: str
) -> None:
    """array<struct<key:string,value:binary>>, null for a message without headers, through a
    compressed set too; and written back by the sink as it was read."""
    create_topic(broker.endpoint, topic, 1)
    with Producer(broker.endpoint, topic, compression="lz4") as producer:
        producer.send(b"plain")
        producer.send(b"traced", headers=[("trace", b"t1"), ("null", None), ("trace", b"t2")])
        producer.send(b"empty", headers=[])
    frame = (
        spark.read.format("pylog")
        .options(broker=broker.endpoint, subscribe=topic, includeHeaders="true")
        .load()
    )
    assert frame.schema["headers"].dataType.simpleString() == (
        "array<struct<key:string,value:binary>>"
    )
    rows = {r.value: r.headers for r in frame.collect()}
    assert rows[b"plain"] is None and rows[b"empty"] is None
    assert [(h.key, h.value) for h in rows[b"traced"]] == [
        ("trace", bytearray(b"t1")),
        ("null", None),
        ("trace", bytearray(b"t2")),
    ]
    copy = f"{topic}-copy"
    create_topic(broker.endpoint, copy, 1)
    frame.select("value", "headers").write.format("pylog").options(
        broker=broker.endpoint, topic=copy
    ).mode("append").save()
    with PartitionConsumer(broker.endpoint, copy, 0, stop_at_end=True) as consumer:
        copied = {m.value: m.headers for m in consumer}
    assert copied == {
        b"plain": (),
        b"traced": (("trace", b"t1"), ("null", None), ("trace", b"t2")),
        b"empty": (),
    }
    with pytest.raises(PySparkException, match="includeHeaders true adds headers"):
        spark.read.format("pylog").schema(KAFKA_SCHEMA).options(
            broker=broker.endpoint, subscribe=topic, includeHeaders="true"
        ).load().collect()


def test_a_batch_read_ignores_the_stream_only_limits_as_kafkas_source_does(
    spark: SparkSession, broker: RunningBroker, topic: str
) -> None:
    """maxOffsetsPerTrigger and maxBytesPerTrigger limit a stream's micro-batches; a batch read
    given them (a job written for streaming, or for Kafka) reads everything (issue 32: it was
    refused)."""
    create_topic(broker.endpoint, topic, 1)
    produce(broker.endpoint, topic, 1, 4)
    limits = {"maxOffsetsPerTrigger": "1", "maxBytesPerTrigger": "10"}

    assert len(_read(spark, broker=broker.endpoint, subscribe=topic, **limits)) == 4


# -- the cluster ----------------------------------------------------------------------------


def test_kafka_bootstrap_servers_names_the_cluster(
    spark: SparkSession, broker: RunningBroker, topic: str
) -> None:
    create_topic(broker.endpoint, topic, 1)
    produce(broker.endpoint, topic, 1, 4)
    servers = f"{broker.endpoint.removeprefix('tcp://')},127.0.0.1:9"  # the second never asked

    assert len(_read(spark, **{"kafka.bootstrap.servers": servers, "subscribe": topic})) == 4


# -- bad options ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"subscribePattern": "(unclosed"}, "subscribePattern '\\(unclosed'"),
        ({"subscribe": "{topic}", "subscribePattern": "x"}, "exactly one of the options"),
        ({"subscribe": "{topic}", "minPartitions": "0"}, "minPartitions is 0"),
        (
            {"subscribe": "{topic}", "startingTimestamp": "1", "startingOffsets": "earliest"},
            "at most one of startingOffsets",
        ),
        (
            {"subscribe": "{topic}", "endingOffsetsByTimestamp": '{"{topic}": {"0": -1}}'},
            "is not a time",
        ),
        (
            {"subscribe": "{topic}", "startingOffsetsByTimestamp": '{"other": {"0": 5}}'},
            "does not read",
        ),
        (
            {"subscribe": "{topic}", "startingOffsetsByTimestampStrategy": "nearest"},
            "use latest or error",
        ),
    ],
)
def test_bad_kafka_options_are_clear_errors(
    spark: SparkSession,
    broker: RunningBroker,
    topic: str,
    options: dict[str, str],
    message: str,
) -> None:
    create_topic(broker.endpoint, topic, 1)
    filled = {k: v.replace("{topic}", topic) for k, v in options.items()}

    with pytest.raises(PySparkException, match=message):
        _read(spark, broker=broker.endpoint, **filled)


def test_ending_times_are_refused_in_a_stream(
    spark: SparkSession, broker: RunningBroker, topic: str, tmp_path: Path
) -> None:
    create_topic(broker.endpoint, topic, 1)

    with pytest.raises(
        (PySparkException, StreamingQueryException), match="endingTimestamp is for batch reads"
    ):
        run_available_now(
            spark, tmp_path, broker=broker.endpoint, subscribe=topic, endingTimestamp="5"
        )


# -- the sink -------------------------------------------------------------------------------


@pytest.mark.parametrize("ack", ["written", "none"])
def test_the_sink_writes_with_the_ack_mode_asked(
    spark: SparkSession, broker: RunningBroker, topic: str, ack: str
) -> None:
    create_topic(broker.endpoint, topic, 1)
    frame = spark.createDataFrame([(f"v{n}",) for n in range(10)], "value string")

    servers = broker.endpoint.removeprefix("tcp://")  # Kafka's option names the cluster too
    frame.write.format("pylog").mode("append").options(
        **{"kafka.bootstrap.servers": servers, "topic": topic, "ack": ack}
    ).save()

    def stored() -> list[bytes]:  # visible once the broker flushes (by count or time)
        with PartitionConsumer(broker.endpoint, topic, 0, stop_at_end=True) as consumer:
            return sorted(m.value for m in consumer)

    wait_until(lambda: len(stored()) == 10, what=f"ack {ack}'s messages flushed")
    assert stored() == sorted(f"v{n}".encode() for n in range(10))


@pytest.mark.parametrize(
    ("schema", "options", "message"),
    [
        ("value string", {"ack": "most"}, "ack 'most': use none, written, flushed, all"),
        ("value string, headers array<int>", {}, "column 'headers' is array<int>"),
        ("value string", {"kafka.security.protocol": "SSL"}, "authentication are CurveZMQ"),
        ("value string", {"kafka.security.protocol": "TLS"}, "use one of PLAINTEXT, SSL"),
        ("value string", {"kafka.acks": "2"}, "kafka.acks '2': use 0, 1, all or -1"),
        ("value string", {"kafka.acks": "1", "ack": "all"}, "ack all and kafka.acks 1 say"),
        ("value string", {"kafka.compression.type": "snappy"}, "nearest equal here is lz4"),
        ("value string", {"kafka.linger.ms": "soon"}, "kafka.linger.ms 'soon'"),
        ("value string", {"kafka.batch.size": "0"}, "kafka.batch.size is 0: it must be"),
        ("value string", {"kafka.enable.idempotence": "yes"}, "use true or false"),
        (
            "value string",
            {"kafka.enable.idempotence": "true", "kafka.acks": "0"},
            "true with ack none",
        ),
    ],
)
def test_bad_sink_options_are_clear_errors(
    spark: SparkSession,
    broker: RunningBroker,
    topic: str,
    schema: str,
    options: dict[str, str],
    message: str,
) -> None:
    frame = spark.createDataFrame([], schema)

    with pytest.raises(PySparkException, match=message):
        frame.write.format("pylog").mode("append").options(
            broker=broker.endpoint, topic=topic, **options
        ).save()


# -- metrics --------------------------------------------------------------------------------


def test_offsets_behind_latest_come_from_the_progress_not_from_source_metrics(
    spark: SparkSession, broker: RunningBroker, topic: str, tmp_path: Path
) -> None:
    create_topic(broker.endpoint, topic, 1)
    produce(broker.endpoint, topic, 1, 10)
    with PartitionConsumer(broker.endpoint, topic, 0, stop_at_end=True) as consumer:
        offsets = [m.offset for m in consumer] + [consumer.position]

    query = start_stream(
        spark,
        tmp_path,
        lambda frame, batch_id: None,
        {"availableNow": True},
        broker=broker.endpoint,
        subscribe=topic,
        startingOffsets="earliest",
        maxOffsetsPerTrigger="4",
    )
    assert query.awaitTermination(QUERY_TIMEOUT_S)

    (source,) = query.recentProgress[0].sources
    assert source.metrics == {}  # a Python source cannot report any (docs/pipeline.md)
    behind = offsets[-1] - offsets[4]  # the first batch read 4 of the 10 messages
    assert offsets_behind_latest(source.endOffset, source.latestOffset) == {
        "minOffsetsBehindLatest": behind,
        "maxOffsetsBehindLatest": behind,
        "avgOffsetsBehindLatest": behind,
    }


# -- kafka.* options ---------------------------------------------------------------------------

SINK_SCHEMA = StructType([StructField("value", StringType())])
KAFKA_JOB_SOURCE = {
    "kafka.group.id": "reporting",
    "groupIdPrefix": "spark-kafka-source",
    "kafka.security.protocol": "PLAINTEXT",
    "kafka.auto.offset.reset": "earliest",
    "kafka.max.poll.records": "500",
    "kafka.session.timeout.ms": "30000",
}
"""A typical spark-sql-kafka job's source options beyond the cluster and the topic."""
KAFKA_JOB_SINK = {
    "kafka.acks": "all",
    "kafka.compression.type": "zstd",
    "kafka.linger.ms": "5",
    "kafka.batch.size": "65536",
    "kafka.key.serializer": "org.apache.kafka.common.serialization.ByteArraySerializer",
    "kafka.enable.idempotence": "true",
}


def test_a_kafka_jobs_options_are_taken_mapped_or_ignored(
    spark: SparkSession, broker: RunningBroker, topic: str
) -> None:
    """Every kafka.* option is accepted (issue 32): kafka.acks, kafka.compression.type,
    kafka.linger.ms, kafka.batch.size and kafka.enable.idempotence are the sink's ack,
    compression, batching and idempotence,
    kafka.security.protocol PLAINTEXT matches a client without keys, the group ids are for
    streams (ignored by this batch read), and the rest (consumer and producer settings) are
    ignored."""
    create_topic(broker.endpoint, topic, 1)
    frame = spark.createDataFrame([(f"line {i} " * 8,) for i in range(300)], "value string")
    cluster = {"kafka.bootstrap.servers": broker.endpoint.removeprefix("tcp://")}
    frame.write.format("pylog").options(**cluster, topic=topic, **KAFKA_JOB_SINK).mode(
        "append"
    ).save()
    rows = _read(spark, **cluster, subscribe=topic, **KAFKA_JOB_SOURCE)
    assert sorted(r.value.decode() for r in rows) == sorted(f"line {i} " * 8 for i in range(300))
    with PartitionConsumer(broker.endpoint, topic, 0, stop_at_end=True) as consumer:
        stored = list(consumer)
    assert len({m.offset for m in stored}) < len(stored) // 10  # stored as compressed sets
    assert stored[-1].next_offset < sum(len(m.value) + 26 for m in stored) // 4


def test_the_kafka_options_pylog_ignores_are_logged_naming_them(
    caplog: pytest.LogCaptureFixture,
) -> None:
    cluster = {"kafka.bootstrap.servers": "127.0.0.1:9"}
    with caplog.at_level("WARNING", logger="pylog.pipeline"):
        parse_source_options({**cluster, "subscribe": "t", **KAFKA_JOB_SOURCE}, streaming=False)
        options = parse_sink_options({**cluster, "topic": "t", **KAFKA_JOB_SINK}, SINK_SCHEMA)
    logged = [r.getMessage() for r in caplog.records]
    assert logged == [
        "source options with no meaning to pylog, ignored: kafka.auto.offset.reset, "
        "kafka.max.poll.records, kafka.session.timeout.ms",
        "kafka.group.id is for streaming reads: ignored in a batch read",
        "groupIdPrefix is for streaming reads: ignored in a batch read",
        "sink options with no meaning to pylog, ignored: kafka.key.serializer",
    ]
    stream = {"minOffsetsPerTrigger": "5", "maxTriggerDelay": "2m", **KAFKA_JOB_SOURCE}
    parsed = parse_source_options({**cluster, "subscribe": "t", **stream}, streaming=True)
    assert (parsed.group, parsed.min_offsets_per_trigger, parsed.max_trigger_delay_s) == (
        "reporting",
        5,
        120.0,
    )
    prefixed = parse_source_options(
        {**cluster, "subscribe": "t", "groupIdPrefix": "etl"}, streaming=True
    )
    assert prefixed.group is not None and re.fullmatch(r"etl-[0-9a-f]{12}", prefixed.group)
    for bad in ("soon", "5 weeks", "-1s"):
        with pytest.raises(OptionError, match="maxTriggerDelay"):
            parse_source_options(
                {**cluster, "subscribe": "t", "maxTriggerDelay": bad}, streaming=True
            )
    with pytest.raises(OptionError, match="minOffsetsPerTrigger 9 is over maxOffsetsPerTrigger 4"):
        parse_source_options(
            {
                **cluster,
                "subscribe": "t",
                "minOffsetsPerTrigger": "9",
                "maxOffsetsPerTrigger": "4",
            },
            streaming=True,
        )
    assert (
        options.ack,
        options.compression,
        options.linger_ms,
        options.batch_bytes,
        options.idempotence,
    ) == (Ack.ALL, "zstd", 5, 65536, True)
    off = {**KAFKA_JOB_SINK, "kafka.enable.idempotence": "false"}
    assert not parse_sink_options({**cluster, "topic": "t", **off}, SINK_SCHEMA).idempotence


def test_poll_timeout_and_the_offset_retries_are_taken_and_checked() -> None:
    """kafkaConsumer.pollTimeoutMs is a task's wait for a FETCH reply; fetchOffset.numRetries and
    fetchOffset.retryIntervalMs how often, and how far apart, the driver asks again where the
    partitions are while one has no leader (tests/pipeline/test_broker_down.py)."""
    base = {"broker": "127.0.0.1:9092", "subscribe": "t"}
    taken = parse_source_options(
        base
        | {
            "kafkaConsumer.pollTimeoutMs": "2500",
            "fetchOffset.numRetries": "0",
            "fetchOffset.retryIntervalMs": "250",
        },
        streaming=False,
    )
    assert (taken.poll_timeout_s, taken.offset_retries, taken.offset_retry_interval_s) == (
        2.5,
        0,
        0.25,
    )
    default = parse_source_options(base, streaming=False)
    assert (default.poll_timeout_s, default.offset_retries) == (10.0, 3)
    for name, value, message in (
        ("kafkaConsumer.pollTimeoutMs", "0", "more than 0"),
        ("fetchOffset.numRetries", "-1", "a whole number, 0 or more"),
        ("fetchOffset.retryIntervalMs", "soon", "a duration"),
    ):
        with pytest.raises(OptionError, match=message):
            parse_source_options(base | {name: value}, streaming=False)
