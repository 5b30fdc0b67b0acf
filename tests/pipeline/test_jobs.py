"""The load and audit jobs: topics into Parquet, resumed without duplicates, and audited."""

from __future__ import annotations

import datetime
from pathlib import Path

from click.testing import CliRunner
from pyspark.sql import SparkSession

from pipeline import audit, load
from tests.pipeline.conftest import create_topic, produce
from tests.pylogd import RunningBroker

TEN_FIFTEEN = datetime.datetime(2026, 11, 22, 10, 15, tzinfo=datetime.UTC)
ELEVEN_THIRTY = datetime.datetime(2026, 11, 22, 11, 30, tzinfo=datetime.UTC)


def ms(moment: datetime.datetime) -> int:
    return int(moment.timestamp() * 1000)


def test_a_second_load_loads_only_the_new_messages(
    spark: SparkSession, broker: RunningBroker, topic: str, tmp_path: Path
) -> None:
    create_topic(broker.endpoint, topic, 2)
    first = produce(broker.endpoint, topic, 2, 20, timestamp_ms=ms(TEN_FIFTEEN))
    output = str(tmp_path / "warehouse")
    cluster = {"broker": broker.endpoint}

    assert load.load(spark, cluster, [topic], output).rows == 20
    second = produce(broker.endpoint, topic, 2, 7, first=20, timestamp_ms=ms(ELEVEN_THIRTY))
    assert load.load(spark, cluster, [topic], output).rows == 7
    assert load.load(spark, cluster, [topic], output).rows == 0

    loaded = spark.read.parquet(output).collect()
    assert sorted(r.value for r in loaded) == sorted(s.value for s in first + second)
    assert len({(r.partition, r.offset) for r in loaded}) == 27
    assert {(r.topic, str(r.date), r.hour) for r in loaded} == {
        (topic, "2026-11-22", 10),
        (topic, "2026-11-22", 11),
    }
    assert list((tmp_path / "warehouse" / f"topic={topic}" / "date=2026-11-22").iterdir())


def test_the_audit_passes_after_a_load_and_catches_a_deleted_parquet_file(
    spark: SparkSession, broker: RunningBroker, topic: str, tmp_path: Path
) -> None:
    create_topic(broker.endpoint, topic, 2)
    produce(broker.endpoint, topic, 2, 12, timestamp_ms=ms(TEN_FIFTEEN))
    produce(broker.endpoint, topic, 2, 8, first=12, timestamp_ms=ms(ELEVEN_THIRTY))
    output = tmp_path / "warehouse"
    runner = CliRunner()
    loaded = runner.invoke(
        load.main, ["--broker", broker.endpoint, "--topic", topic, "--output", str(output)]
    )
    assert loaded.exit_code == 0, loaded.output
    assert f"loaded 20 messages of {topic}" in loaded.output
    arguments = [
        "--broker",
        broker.endpoint,
        "--topic",
        topic,
        "--output",
        str(output),
        "--start",
        "2026-11-22T10:00",
        "--end",
        "2026-11-22T12:00",
    ]

    clean = runner.invoke(audit.main, arguments)
    assert clean.exit_code == 0, clean.output
    assert "2026-11-22 10:00" in clean.output
    assert f"{topic}: OK, every hour matches" in clean.output

    hour_11 = output / f"topic={topic}" / "date=2026-11-22" / "hour=11"
    next(hour_11.glob("*.parquet")).unlink()
    caught = runner.invoke(audit.main, arguments)
    assert caught.exit_code == 1, caught.output
    assert "<-- differs" in caught.output
    assert f"{topic}: 1 hour(s) differ" in caught.output


def test_a_load_of_a_missing_topic_fails_with_a_short_clear_message(
    spark: SparkSession, broker: RunningBroker, topic: str, tmp_path: Path
) -> None:
    result = CliRunner().invoke(
        load.main, ["--broker", broker.endpoint, "--topic", topic, "--output", str(tmp_path)]
    )

    assert result.exit_code == 1
    assert result.output.strip() == (
        f"Error: pipeline.errors.OptionError: topic {topic!r} does not exist"
    )
