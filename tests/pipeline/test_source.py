"""spark.read.format("pylog"): batch reads against a real broker, and bad options."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pyspark.errors import PySparkException
from pyspark.sql import SparkSession

from broker.client import PartitionConsumer
from broker.client.connection import Connection
from broker.log import codec, compression
from pipeline.cluster import SourcePartition, message_bounds
from pipeline.errors import DataLoss
from pipeline.reader import OffsetRange, read_range
from tests.pipeline.conftest import create_topic, produce
from tests.pylogd import RunningBroker


def _rows(spark: SparkSession, **options: str) -> list[Any]:
    return spark.read.format("pylog").options(**options).load().collect()


def test_batch_read_of_a_multi_partition_topic_is_what_was_produced(
    spark: SparkSession, broker: RunningBroker, topic: str
) -> None:
    create_topic(broker.endpoint, topic, 3)
    sent = produce(broker.endpoint, topic, 3, 300, value_bytes=100)

    frame = (
        spark.read.format("pylog")
        .option("broker", broker.endpoint)
        .option("subscribe", topic)
        .option("maxBytesPerPartition", "4096")
        .load()
    )
    rows = frame.collect()

    assert frame.rdd.getNumPartitions() > 3  # each partition's ~13 KB cut into 4 KB ranges
    assert len(rows) == len(sent)
    got = sorted(
        (r.topic, r.partition, r.key, r.value, int(r.timestamp.timestamp() * 1000)) for r in rows
    )
    assert got == sorted((s.topic, s.partition, s.key, s.value, s.timestamp_ms) for s in sent)
    for partition in range(3):
        with PartitionConsumer(broker.endpoint, topic, partition, stop_at_end=True) as consumer:
            offsets = [m.offset for m in consumer]
        assert sorted(r.offset for r in rows if r.partition == partition) == offsets


@pytest.mark.parametrize("compression", ["gzip", "lz4", "zstd"])
def test_a_topic_of_plain_messages_then_compressed_sets_reads_whole(
    spark: SparkSession, broker: RunningBroker, topic: str, compression: str
) -> None:
    """Sets are expanded into rows, each with its set's offset; ranges are cut at set
    boundaries, so no row is read twice or lost."""
    create_topic(broker.endpoint, topic, 2)
    sent = produce(broker.endpoint, topic, 2, 100, value_bytes=60)
    sent += produce(
        broker.endpoint, topic, 2, 400, first=100, value_bytes=60, compression=compression
    )
    rows = _rows(spark, broker=broker.endpoint, subscribe=topic, maxBytesPerPartition="1024")
    got = sorted((r.partition, r.value, r.key, int(r.timestamp.timestamp() * 1000)) for r in rows)
    assert got == sorted((s.partition, s.value, s.key, s.timestamp_ms) for s in sent)
    for partition in range(2):
        with PartitionConsumer(broker.endpoint, topic, partition, stop_at_end=True) as consumer:
            read = [(m.offset, m.value) for m in consumer]
        assert sorted((r.offset, r.value) for r in rows if r.partition == partition) == sorted(read)
        assert len({offset for offset, _ in read}) < len(read)  # sets: shared offsets


def test_offsets_json_bounds_a_batch_read(
    spark: SparkSession, broker: RunningBroker, topic: str
) -> None:
    create_topic(broker.endpoint, topic, 2)
    produce(broker.endpoint, topic, 2, 20)
    everything = _rows(spark, broker=broker.endpoint, subscribe=topic)
    offsets = sorted(r.offset for r in everything if r.partition == 0)

    rows = _rows(
        spark,
        broker=broker.endpoint,
        subscribe=topic,
        startingOffsets=json.dumps({topic: {"0": offsets[2], "1": -2}}),
        endingOffsets=json.dumps({topic: {"0": offsets[5]}}),
    )

    assert sorted(r.offset for r in rows if r.partition == 0) == offsets[2:5]
    assert len([r for r in rows if r.partition == 1]) == 10


def test_assign_reads_only_the_partitions_named(
    spark: SparkSession, broker: RunningBroker, topic: str
) -> None:
    create_topic(broker.endpoint, topic, 3)
    produce(broker.endpoint, topic, 3, 30)

    rows = _rows(spark, broker=broker.endpoint, assign=json.dumps({topic: [1]}))

    assert {r.partition for r in rows} == {1}
    assert len(rows) == 10


def test_the_cluster_is_found_through_zookeeper(
    spark: SparkSession, broker: RunningBroker, topic: str
) -> None:
    create_topic(broker.endpoint, topic, 1)
    produce(broker.endpoint, topic, 1, 5)
    zookeeper, chroot = broker.arguments[0], broker.arguments[1]

    rows = _rows(spark, **{"zookeeper.connect": f"{zookeeper}{chroot}", "subscribe": topic})

    assert len(rows) == 5


def test_an_offset_inside_a_message_is_a_clear_error(
    spark: SparkSession, broker: RunningBroker, topic: str
) -> None:
    create_topic(broker.endpoint, topic, 1)
    produce(broker.endpoint, topic, 1, 5)

    with pytest.raises(PySparkException, match="offset 3 is not a message boundary"):
        _rows(
            spark,
            broker=broker.endpoint,
            subscribe=topic,
            startingOffsets=json.dumps({topic: {"0": 3}}),
        )


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"subscribe": "{topic}", "bogus": "1"}, "unknown source option"),
        ({"subscribe": "{topic}", "assign": '{"{topic}": [0]}'}, "exactly one of the options"),
        ({}, "exactly one of the options subscribe, subscribePattern and assign"),
        ({"subscribe": "no-such-topic-here"}, "topic 'no-such-topic-here' does not exist"),
        ({"subscribe": "{topic}", "startingOffsets": "{not json"}, "is not valid JSON"),
        ({"subscribe": "{topic}", "startingOffsets": '{"other": {"0": 0}}'}, "does not read"),
        ({"subscribe": "{topic}", "startingOffsets": "latest"}, "reads nothing in a batch"),
        ({"subscribe": "{topic}", "failOnDataLoss": "maybe"}, "use true or false"),
        ({"assign": '{"{topic}": [7]}'}, "has no partition 7"),
    ],
)
def test_bad_options_are_clear_errors(
    spark: SparkSession,
    broker: RunningBroker,
    topic: str,
    options: dict[str, str],
    message: str,
) -> None:
    create_topic(broker.endpoint, topic, 1)
    filled = {k: v.replace("{topic}", topic) for k, v in options.items()}

    with pytest.raises(PySparkException, match=message):
        _rows(spark, broker=broker.endpoint, **filled)


def test_a_missing_cluster_option_is_a_clear_error(spark: SparkSession, topic: str) -> None:
    with pytest.raises(PySparkException, match="exactly one of the options broker"):
        _rows(spark, subscribe=topic)


def test_an_empty_topic_reads_as_no_rows(
    spark: SparkSession, broker: RunningBroker, topic: str
) -> None:
    create_topic(broker.endpoint, topic, 2)

    assert _rows(spark, broker=broker.endpoint, subscribe=topic) == []


def test_a_damaged_message_fails_the_query_or_is_skipped_with_fail_on_data_loss_false(
    spark: SparkSession, broker: RunningBroker, topic: str
) -> None:
    create_topic(broker.endpoint, topic, 1)
    sent = produce(broker.endpoint, topic, 1, 6)
    with PartitionConsumer(broker.endpoint, topic, stop_at_end=True) as consumer:
        offsets = [m.offset for m in consumer] + [consumer.position]
    (folder,) = broker.data_dir.parent.glob(f"logs-*/{topic}-0")
    with open(folder / f"{0:020d}.log", "r+b") as f:  # the last value byte of message 3
        f.seek(offsets[4] - 1)
        byte = f.read(1)
        f.seek(offsets[4] - 1)
        f.write(bytes([byte[0] ^ 0x01]))

    damaged = rf"offsets \[{offsets[3]}, {offsets[4]}\)"
    with pytest.raises(PySparkException, match=f"data loss: .*{damaged}"):
        _rows(spark, broker=broker.endpoint, subscribe=topic)
    rows = _rows(spark, broker=broker.endpoint, subscribe=topic, failOnDataLoss="false")
    assert sorted(r.value for r in rows) == sorted(s.value for i, s in enumerate(sent) if i != 3)


def test_a_task_meets_the_brokers_corrupt_segment_as_data_loss(
    pylogd: RunningBroker, topic: str
) -> None:
    create_topic(pylogd.endpoint, topic, 1)
    sent = produce(pylogd.endpoint, topic, 1, 6)
    with PartitionConsumer(pylogd.endpoint, topic, stop_at_end=True) as consumer:
        offsets = [m.offset for m in consumer] + [consumer.position]
    assert pylogd.stop() == 0
    (folder,) = pylogd.data_dir.parent.glob(f"logs-*/{topic}-0")
    with open(folder / f"{0:020d}.log", "r+b") as f:  # found by recovery on the restart
        f.seek(offsets[2] - 1)
        byte = f.read(1)
        f.seek(offsets[2] - 1)
        f.write(bytes([byte[0] ^ 0x01]))
    broker = pylogd.restarted()
    try:
        whole = OffsetRange(topic, 0, broker.endpoint, 0, offsets[-1])
        with pytest.raises(DataLoss, match=rf"offsets \[{offsets[1]}, {offsets[2]}\)"):
            list(read_range(whole, fail_on_data_loss=True))
        batches = list(read_range(whole, fail_on_data_loss=False))
        got = [v.as_py() for b in batches for v in b.column("value")]
        assert got == [s.value for i, s in enumerate(sent) if i != 1]
        with Connection(broker.endpoint, "test") as connection:  # the planner's boundaries
            tp = SourcePartition(topic, 0)
            assert message_bounds(connection, tp, offsets[1]) == (offsets[1], offsets[1])
            assert message_bounds(connection, tp, offsets[1] + 1) == (offsets[1], offsets[2])
    finally:
        broker.stop()


def test_a_task_expands_a_fetch_in_chunks_within_the_readers_budget(
    broker: RunningBroker, topic: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A task yields a fetched reply's rows a chunk at a time, each within the reader's
    budget (READ_MESSAGES rows, stopping at a set's start), not all the reply's sets expanded
    at once: here sets of 4 (MAX_SET_MESSAGES, this process's producer) and a budget of 5."""
    monkeypatch.setattr(compression, "MAX_SET_MESSAGES", 4)
    monkeypatch.setattr(codec, "READ_MESSAGES", 5)
    create_topic(broker.endpoint, topic, 1)
    sent = produce(broker.endpoint, topic, 1, 60, compression="zstd")
    with PartitionConsumer(broker.endpoint, topic, stop_at_end=True) as consumer:
        list(consumer)
        end = consumer.position
    batches = list(read_range(OffsetRange(topic, 0, broker.endpoint, 0, end), True))
    assert max(b.num_rows for b in batches) == 8  # 5 rows, then the set that crossed 5
    assert [v.as_py() for b in batches for v in b.column("value")] == [s.value for s in sent]
