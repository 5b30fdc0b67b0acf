"""df.write.format("pylog"): a DataFrame into a topic and back, and failed writes."""

from __future__ import annotations

import datetime
from pathlib import Path

import pytest
from pyspark.errors import PySparkException
from pyspark.sql import SparkSession

from broker.client import PartitionConsumer, Producer
from tests.pipeline.conftest import create_topic
from tests.pylogd import RunningBroker


def test_a_dataframe_written_to_a_topic_reads_back_the_same(
    spark: SparkSession, broker: RunningBroker, topic: str
) -> None:
    create_topic(broker.endpoint, topic, 2)
    moment = datetime.datetime(2026, 1, 2, 3, 4, 5, tzinfo=datetime.UTC)
    written = [
        (f"value-{n}", None if n % 4 == 0 else f"key-{n}".encode(), n % 2, moment)
        for n in range(50)
    ]
    frame = spark.createDataFrame(
        written, "value string, key binary, partition int, timestamp timestamp"
    )

    frame.repartition(3).write.format("pylog").mode("append").options(
        broker=broker.endpoint, topic=topic
    ).save()

    rows = spark.read.format("pylog").options(broker=broker.endpoint, subscribe=topic).load()
    assert sorted(
        (r.value.decode(), r.key, r.partition, r.timestamp.astimezone(datetime.UTC))
        for r in rows.collect()
    ) == sorted((v, k, p, m) for v, k, p, m in written)


def test_the_topic_column_routes_rows_and_keys_pick_partitions(
    spark: SparkSession, broker: RunningBroker, topic: str
) -> None:
    other = f"{topic}-b"
    create_topic(broker.endpoint, topic, 2)
    create_topic(broker.endpoint, other, 2)
    frame = spark.createDataFrame(
        [(t, "k1", f"v{n}") for n, t in enumerate([topic, other, topic])],
        "topic string, key string, value string",
    )

    frame.write.format("pylog").mode("append").option("broker", broker.endpoint).save()

    for name, count in ((topic, 2), (other, 1)):
        rows = (
            spark.read.format("pylog").options(broker=broker.endpoint, subscribe=name).load()
        ).collect()
        assert len(rows) == count
        assert len({r.partition for r in rows}) == 1  # one key, one partition


def test_a_failed_write_reaches_the_driver_with_its_cause(
    spark: SparkSession, broker: RunningBroker, topic: str
) -> None:
    create_topic(broker.endpoint, topic, 2)
    frame = spark.createDataFrame([("v", 7)], "value string, partition int")

    with pytest.raises(PySparkException) as failure:
        frame.write.format("pylog").mode("append").options(
            broker=broker.endpoint, topic=topic
        ).save()

    message = str(failure.value)
    assert f"pylog sink: writing to topic {topic!r} failed" in message
    assert "UNKNOWN_TOPIC_OR_PARTITION" in message
    with PartitionConsumer(broker.endpoint, topic, 0, stop_at_end=True) as consumer:
        assert list(consumer) == []


@pytest.mark.parametrize(
    ("schema", "options", "message"),
    [
        ("key string", {}, "needs a value column"),
        ("value int", {}, "column 'value' is int"),
        ("value string", {"topic": None}, "a topic option or a topic column"),
        ("value string", {"acks": "all"}, "unknown sink option"),
    ],
)
def test_bad_sink_columns_and_options_are_clear_errors(
    spark: SparkSession,
    broker: RunningBroker,
    topic: str,
    schema: str,
    options: dict[str, str | None],
    message: str,
) -> None:
    frame = spark.createDataFrame([], schema)
    given = {"broker": broker.endpoint, "topic": topic, **options}

    with pytest.raises(PySparkException, match=message):
        frame.write.format("pylog").mode("append").options(
            **{k: v for k, v in given.items() if v is not None}
        ).save()


def test_a_dataframe_read_from_pylog_is_written_back_as_it_is(
    spark: SparkSession, broker: RunningBroker, topic: str
) -> None:
    """Its offset and timestampType columns are not written, as Spark's Kafka sink ignores
    columns it does not write (issue 32: they were refused); the topic option overrides the
    topic column."""
    copy = f"{topic}-copy"
    create_topic(broker.endpoint, topic, 1)
    create_topic(broker.endpoint, copy, 1)
    with Producer(broker.endpoint, topic) as producer:
        for i in range(3):
            producer.send(b"v-%d" % i, b"k-%d" % i, partition=0)
    read = spark.read.format("pylog").options(broker=broker.endpoint, subscribe=topic).load()

    read.write.format("pylog").mode("append").options(broker=broker.endpoint, topic=copy).save()

    with PartitionConsumer(broker.endpoint, copy, 0, stop_at_end=True) as consumer:
        assert [(m.key, m.value) for m in consumer] == [
            (b"k-%d" % i, b"v-%d" % i) for i in range(3)
        ]


def test_overwrite_is_refused(spark: SparkSession, broker: RunningBroker, topic: str) -> None:
    frame = spark.createDataFrame([("v",)], "value string")

    with pytest.raises(PySparkException, match="only appended to"):
        frame.write.format("pylog").mode("overwrite").options(
            broker=broker.endpoint, topic=topic
        ).save()


def test_a_stream_writes_each_batch_to_the_topic(
    spark: SparkSession, broker: RunningBroker, topic: str, tmp_path: Path
) -> None:
    source, sink = f"{topic}-in", f"{topic}-out"
    create_topic(broker.endpoint, source, 1)
    create_topic(broker.endpoint, sink, 1)
    spark.createDataFrame([(f"m{n}",) for n in range(20)], "value string").write.format(
        "pylog"
    ).mode("append").options(broker=broker.endpoint, topic=source).save()

    query = (
        spark.readStream.format("pylog")
        .options(broker=broker.endpoint, subscribe=source, startingOffsets="earliest")
        .load()
        .select("key", "value")
        .writeStream.format("pylog")
        .options(broker=broker.endpoint, topic=sink)
        .option("checkpointLocation", f"{tmp_path}/checkpoint")
        .trigger(availableNow=True)
        .start()
    )
    assert query.awaitTermination(120)

    with PartitionConsumer(broker.endpoint, sink, 0, stop_at_end=True) as consumer:
        assert sorted(m.value for m in consumer) == sorted(f"m{n}".encode() for n in range(20))
