"""spark.readStream.format("pylog"): Trigger.AvailableNow, checkpoints, read limits, and data
lost to retention, against real brokers."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from pyspark.errors import StreamingQueryException
from pyspark.sql import DataFrame, Row, SparkSession
from pyspark.sql.streaming.datasource import ReadAllAvailable
from pyspark.sql.streaming.query import StreamingQuery

from broker.client import Admin
from cli.pylogctl import cli
from pipeline.cluster import DriverView, SourcePartition
from pipeline.options import parse_source_options
from pipeline.stream_reader import PylogStreamReader
from tests.conftest import FakeClock, single_box_flags, wait_until
from tests.pipeline.conftest import create_topic, produce
from tests.pylogd import RunningBroker

QUERY_TIMEOUT_S = 120


def run_available_now(spark: SparkSession, checkpoint: Path, **options: str) -> list[list[Row]]:
    """One run of a streaming query with Trigger.AvailableNow: the rows of each micro-batch."""
    batches: list[list[Row]] = []

    def collect(frame: DataFrame, _batch_id: int) -> None:
        batches.append(frame.collect())

    query = start_stream(spark, checkpoint, collect, {"availableNow": True}, **options)
    assert query.awaitTermination(QUERY_TIMEOUT_S), "the query did not finish"
    return batches


def start_stream(
    spark: SparkSession,
    checkpoint: Path,
    on_batch: Callable[[DataFrame, int], None],
    trigger: dict[str, Any],
    **options: str,
) -> StreamingQuery:
    """A streaming query of the pylog source, each micro-batch given to `on_batch`."""
    return (
        spark.readStream.format("pylog")
        .options(**options)
        .load()
        .writeStream.foreachBatch(on_batch)
        .option("checkpointLocation", str(checkpoint))
        .trigger(**trigger)
        .start()
    )


def values(batches: list[list[Row]]) -> list[bytes]:
    return sorted(row.value for batch in batches for row in batch)


def test_a_second_available_now_run_reads_only_new_messages(
    spark: SparkSession, broker: RunningBroker, topic: str, tmp_path: Path
) -> None:
    create_topic(broker.endpoint, topic, 2)
    first = produce(broker.endpoint, topic, 2, 10)
    options = {"broker": broker.endpoint, "subscribe": topic, "startingOffsets": "earliest"}

    assert values(run_available_now(spark, tmp_path, **options)) == sorted(s.value for s in first)

    second = produce(broker.endpoint, topic, 2, 5, first=10)
    assert values(run_available_now(spark, tmp_path, **options)) == sorted(s.value for s in second)
    assert values(run_available_now(spark, tmp_path, **options)) == []


def test_max_bytes_per_trigger_splits_the_work_into_batches(
    spark: SparkSession, broker: RunningBroker, topic: str, tmp_path: Path
) -> None:
    create_topic(broker.endpoint, topic, 2)
    sent = produce(broker.endpoint, topic, 2, 40, value_bytes=100)
    limit = 1000  # bytes; the topic holds about 5.3 KB

    batches = run_available_now(
        spark,
        tmp_path,
        broker=broker.endpoint,
        subscribe=topic,
        startingOffsets="earliest",
        maxBytesPerTrigger=str(limit),
    )

    nonempty = [batch for batch in batches if batch]
    assert len(nonempty) >= 5
    for batch in nonempty:  # a message on disk: 4 + 22 header bytes + key + value
        assert sum(26 + len(row.key or b"") + len(row.value) for row in batch) <= limit
    assert values(batches) == sorted(s.value for s in sent)


def test_a_stream_starts_at_the_latest_offsets_by_default(
    spark: SparkSession, broker: RunningBroker, topic: str, tmp_path: Path
) -> None:
    create_topic(broker.endpoint, topic, 1)
    produce(broker.endpoint, topic, 1, 5)
    options = {"broker": broker.endpoint, "subscribe": topic}

    assert values(run_available_now(spark, tmp_path, **options)) == []
    later = produce(broker.endpoint, topic, 1, 3, first=5)
    assert values(run_available_now(spark, tmp_path, **options)) == sorted(s.value for s in later)


def test_partitions_of_a_recreated_topic_are_picked_up(
    spark: SparkSession, broker: RunningBroker, topic: str, tmp_path: Path
) -> None:
    create_topic(broker.endpoint, topic, 1)
    produce(broker.endpoint, topic, 1, 5)
    options = {
        "broker": broker.endpoint,
        "subscribe": topic,
        "startingOffsets": "earliest",
        "failOnDataLoss": "false",
    }
    run_available_now(spark, tmp_path, **options)
    with Admin(broker.endpoint) as admin:
        admin.delete_topic(topic)
    create_topic(broker.endpoint, topic, 3)
    again = produce(broker.endpoint, topic, 3, 9, first=100)

    rows = [row for batch in run_available_now(spark, tmp_path, **options) for row in batch]

    # Partition 0 went back to offset 0 (logged as a loss and skipped); 1 and 2 are new and
    # are read from their log start.
    assert sorted(r.value for r in rows if r.partition > 0) == sorted(
        s.value for s in again if s.partition > 0
    )


@pytest.fixture
def retention_broker(make_pylogd: Callable[..., RunningBroker], tmp_path: Path) -> RunningBroker:
    """A broker that applies retention every 100 ms."""
    return make_pylogd(
        *single_box_flags(tmp_path), "--log-retention-check-interval-ms", "100", name="retention"
    )


def log_start(endpoint: str, topic: str) -> int:
    with DriverView(endpoint) as cluster:
        return cluster.offsets(SourcePartition(topic, 0), endpoint)[0]


def test_data_deleted_by_retention_before_it_was_read_fails_the_query_by_name(
    spark: SparkSession, retention_broker: RunningBroker, topic: str, tmp_path: Path
) -> None:
    endpoint = retention_broker.endpoint
    create_topic(
        endpoint, topic, 1, segment_bytes="4096", max_message_bytes="4096", retention_bytes="4096"
    )
    produce(endpoint, topic, 1, 10)
    options: dict[str, Any] = {
        "broker": endpoint,
        "subscribe": topic,
        "startingOffsets": "earliest",
    }
    checkpoint = tmp_path / "checkpoint"
    first = run_available_now(spark, checkpoint, **options)
    read_up_to = max(row.offset + 26 + len(row.key or b"") + len(row.value) for row in first[0])
    later = produce(endpoint, topic, 1, 400, first=10)
    wait_until(lambda: log_start(endpoint, topic) > read_up_to, what="retention")
    start = log_start(endpoint, topic)

    with pytest.raises(StreamingQueryException) as failure:
        run_available_now(spark, checkpoint, **options)
    # retention may still be deleting (every 100 ms): the gap ends where the log started then
    named = re.search(
        rf"data loss: topic {re.escape(repr(topic))} partition 0: offsets \[{read_up_to}, "
        r"(\d+)\) were not read",
        str(failure.value),
    )
    assert named is not None, str(failure.value)
    assert start <= int(named.group(1)) <= log_start(endpoint, topic)

    options["failOnDataLoss"] = "false"
    rows = [row for batch in run_available_now(spark, checkpoint, **options) for row in batch]
    assert int(named.group(1)) <= min(row.offset for row in rows) <= log_start(endpoint, topic)
    assert {row.value for row in rows} < {s.value for s in later}


def test_a_checkpointed_offset_inside_a_message_is_a_clear_error(
    spark: SparkSession, broker: RunningBroker, topic: str, tmp_path: Path
) -> None:
    create_topic(broker.endpoint, topic, 1)
    produce(broker.endpoint, topic, 1, 5)
    options = {"broker": broker.endpoint, "subscribe": topic, "startingOffsets": "earliest"}
    run_available_now(spark, tmp_path, **options)
    produce(broker.endpoint, topic, 1, 5, first=5)
    offset_log = tmp_path / "offsets" / "0"  # Spark's: a version, metadata, then our offsets
    *head, ours = offset_log.read_text().splitlines()
    end = json.loads(ours)[topic]["0"]
    offset_log.write_text("\n".join([*head, json.dumps({topic: {"0": end + 1}})]) + "\n")

    with pytest.raises(
        StreamingQueryException, match=f"offset {end + 1} is not a message boundary"
    ):
        run_available_now(spark, tmp_path, **options)


def test_a_starting_offset_inside_a_message_is_a_clear_error(
    spark: SparkSession, broker: RunningBroker, topic: str, tmp_path: Path
) -> None:
    create_topic(broker.endpoint, topic, 1)
    produce(broker.endpoint, topic, 1, 5)

    with pytest.raises(StreamingQueryException, match="offset 7 is not a message boundary"):
        run_available_now(
            spark,
            tmp_path,
            broker=broker.endpoint,
            subscribe=topic,
            startingOffsets=json.dumps({topic: {"0": 7}}),
        )


@pytest.mark.parametrize(
    ("options", "problem"),
    [
        ({"bogus": "1"}, "unknown source option(s) bogus"),
        ({"endingOffsets": "latest"}, "endingOffsets is for batch reads; a stream has no end"),
    ],
)
def test_a_streams_bad_option_fails_the_query_with_its_own_error_alone(
    spark: SparkSession,
    broker: RunningBroker,
    topic: str,
    tmp_path: Path,
    options: dict[str, str],
    problem: str,
) -> None:
    """Refused when PySpark's stream runner asks for the reader: it reports the error, and not
    an UnboundLocalError of its own after it (PySpark 4's runner stops a reader that was never
    made when making it fails; issue 32)."""
    with pytest.raises(StreamingQueryException) as failed:
        run_available_now(spark, tmp_path, broker=broker.endpoint, subscribe=topic, **options)
    assert problem in str(failed.value)
    assert "UnboundLocalError" not in str(failed.value)


def test_min_offsets_per_trigger_waits_for_that_many_messages(
    spark: SparkSession, broker: RunningBroker, topic: str, tmp_path: Path
) -> None:
    """minOffsetsPerTrigger as Spark's Kafka source has it: the first trigger goes; then a
    micro-batch waits until that many messages are there (maxTriggerDelay, an hour here, has
    not passed)."""
    create_topic(broker.endpoint, topic, 2)
    produce(broker.endpoint, topic, 2, 3)
    sizes: list[int] = []
    query = start_stream(
        spark,
        tmp_path,
        lambda frame, _: sizes.append(frame.count()),
        {"processingTime": "200 milliseconds"},
        broker=broker.endpoint,
        subscribe=topic,
        startingOffsets="earliest",
        minOffsetsPerTrigger="5",
        maxTriggerDelay="1h",
    )
    try:
        query.processAllAvailable()
        produce(broker.endpoint, topic, 2, 3, first=3)  # 3 waiting: fewer than 5
        query.processAllAvailable()
        assert sizes == [3]
        produce(broker.endpoint, topic, 2, 2, first=6)  # 5 waiting
        wait_until(lambda: sizes == [3, 5], QUERY_TIMEOUT_S, "a batch of the 5 messages")
    finally:
        query.stop()


def test_max_trigger_delay_lets_a_smaller_batch_go(
    broker: RunningBroker, topic: str, clock: FakeClock
) -> None:
    create_topic(broker.endpoint, topic, 1)
    options = parse_source_options(
        {
            "broker": broker.endpoint,
            "subscribe": topic,
            "startingOffsets": "earliest",
            "minOffsetsPerTrigger": "10",
            "maxTriggerDelay": "30s",
        },
        streaming=True,
    )
    reader = PylogStreamReader(options, clock)
    start = reader.initialOffset()
    assert reader.latestOffset(start, ReadAllAvailable()) == start  # the first: nothing there
    produce(broker.endpoint, topic, 1, 4)
    clock.advance(29.0)
    assert reader.latestOffset(start, ReadAllAvailable()) == start  # 4 < 10, 29 s < 30 s
    clock.advance(1.0)
    end = reader.latestOffset(start, ReadAllAvailable())
    high = DriverView(broker.endpoint).offsets(SourcePartition(topic, 0), broker.endpoint)[1]
    assert end == {topic: {"0": high}}
    produce(broker.endpoint, topic, 1, 10, first=4)
    clock.advance(1.0)
    assert reader.latestOffset(end, ReadAllAvailable()) != end  # 10 there: no wait


def test_kafka_group_id_names_a_read_only_group_that_reports_the_streams_lag(
    spark: SparkSession, broker: RunningBroker, topic: str, tmp_path: Path
) -> None:
    create_topic(broker.endpoint, topic, 2)
    produce(broker.endpoint, topic, 2, 20)
    group = f"reporting-{topic[-8:]}"
    options = {"broker": broker.endpoint, "subscribe": topic, "startingOffsets": "earliest"}
    run_available_now(spark, tmp_path, **options, **{"kafka.group.id": group})
    with DriverView(broker.endpoint) as cluster:
        ends = {
            tp.partition: cluster.offsets(tp, endpoint)[1]
            for tp, endpoint in cluster.matching(re.compile(re.escape(topic))).items()
        }
    runner = CliRunner()
    described = runner.invoke(
        cli, ["group", "describe", group, "--broker", broker.endpoint, "--json"]
    )
    assert described.exit_code == 0, described.output
    lines = [json.loads(line) for line in described.output.splitlines()]
    rows = [line for line in lines if line["type"] == "partition"]
    assert {row["partition"]: row["committed"] for row in rows} == ends
    assert all(row["lag_bytes"] == 0 and row["owner"] is None for row in rows)
    assert [line["lag_bytes"] for line in lines if line["type"] == "group"] == [0]
