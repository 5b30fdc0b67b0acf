"""The load and audit jobs: topics into Parquet, resumed without duplicates, and audited."""

from __future__ import annotations

import datetime
import json
import os
import pty
import re
import select
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner
from pyspark.sql import SparkSession

from broker.client import Producer
from cli.pylogctl import cli
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
    assert result.output.strip() == f"Error: topic {topic!r} does not exist"


def _load_command(endpoint: str, topic: str, output: Path, *more: str) -> list[str]:
    """`python -m pipeline.load` as a user runs it (its own process, its own Spark)."""
    return [
        sys.executable,
        "-m",
        "pipeline.load",
        *("--broker", endpoint, "--topic", topic, "--output", str(output), *more),
    ]


def _job_env() -> dict[str, str]:
    """A user's environment: none of the test session's Spark settings."""
    return {k: v for k, v in os.environ.items() if not k.startswith(("PYSPARK_", "SPARK_"))}


def test_a_load_of_an_unknown_topic_or_from_a_down_broker_is_one_line_before_spark(
    broker: RunningBroker, topic: str, tmp_path: Path
) -> None:
    unknown = subprocess.run(
        _load_command(broker.endpoint, topic, tmp_path),
        env=_job_env(),
        capture_output=True,
        text=True,
    )
    assert unknown.returncode == 1
    assert (unknown.stdout + unknown.stderr).strip() == f"Error: topic {topic!r} does not exist"

    with socket.socket() as unused:  # bound, never listening: no broker can take the port
        unused.bind(("127.0.0.1", 0))
        down = f"tcp://127.0.0.1:{unused.getsockname()[1]}"
        refused = subprocess.run(
            _load_command(down, topic, tmp_path), env=_job_env(), capture_output=True, text=True
        )
    assert refused.returncode == 1
    output = (refused.stdout + refused.stderr).strip()
    assert output.startswith(f"Error: connection refused: nothing listens at {down}"), output
    assert "\n" not in output  # one line: Spark never started


@pytest.mark.slow  # ~40 s: a following load through several batches, then a rerun
def test_a_following_load_shows_its_batches_goes_on_until_sigterm_and_a_rerun_loads_nothing_twice(
    spark: SparkSession, broker: RunningBroker, topic: str, tmp_path: Path
) -> None:
    create_topic(broker.endpoint, topic, 2)
    produce(broker.endpoint, topic, 2, 30, value_bytes=100)
    output = tmp_path / "warehouse"
    command = _load_command(
        broker.endpoint,
        topic,
        output,
        "--follow",
        "--interval",
        "0.5",
        "--max-bytes-per-trigger",
        "2000",
    )
    terminal, job_side = pty.openpty()  # stderr on a terminal, as when run by hand
    with subprocess.Popen(
        command, env=_job_env(), stdout=subprocess.PIPE, stderr=job_side, text=True
    ) as job:
        os.close(job_side)
        shown, produced_more, deadline = b"", False, time.monotonic() + 240
        while time.monotonic() < deadline:
            if not select.select([terminal], [], [], 1)[0]:
                continue
            try:
                chunk = os.read(terminal, 65536)
            except OSError:  # EIO: the job has exited
                break
            if not chunk:
                break
            shown += chunk
            loaded = sum(int(n) for n in re.findall(rb"load: batch \d+: (\d+) rows", shown))
            if loaded == 30 and not produced_more:
                produce(broker.endpoint, topic, 2, 12, first=30)  # found by a later batch
                produced_more = True
            elif loaded == 42 and job.poll() is None:
                job.send_signal(signal.SIGTERM)
        if job.poll() is None and time.monotonic() >= deadline:
            job.kill()  # the asserts below say what it printed
        summary, _ = job.communicate(timeout=120)
    os.close(terminal)
    text = shown.decode(errors="replace")

    assert job.returncode == 0, text
    batches = re.findall(r"load: batch (\d+): (\d+) rows, (\d+) bytes still to load", text)
    assert len(batches) >= 3, text  # 2000 bytes a batch of ~3,800, then the 12 more
    assert sum(int(rows) for _, rows, _ in batches) == 42
    assert "loading" in text and "100%" in text, text  # click's bar, until it caught up
    assert "stopping after the micro-batch under way" in text
    assert summary.startswith(f"loaded 42 messages of {topic}"), summary
    produce(broker.endpoint, topic, 2, 3, first=42)
    rerun = CliRunner().invoke(
        load.main, ["--broker", broker.endpoint, "--topic", topic, "--output", str(output)]
    )
    assert rerun.exit_code == 0, rerun.output
    rows = spark.read.parquet(str(output)).where(f"topic = '{topic}'").collect()
    assert sorted(int(r.value.decode().split("-")[1].rstrip(".")) for r in rows) == list(range(45))


def test_pylogctl_load_and_audit_are_the_jobs_with_their_options_and_json(
    spark: SparkSession, broker: RunningBroker, topic: str, tmp_path: Path
) -> None:
    create_topic(broker.endpoint, topic, 2)
    produce(broker.endpoint, topic, 2, 8, timestamp_ms=ms(TEN_FIFTEEN))
    output = str(tmp_path / "warehouse")
    runner = CliRunner()

    loaded = runner.invoke(
        cli, ["load", "--broker", broker.endpoint, "--topic", topic, "--output", output, "--json"]
    )
    assert loaded.exit_code == 0, loaded.output
    lines = [json.loads(line) for line in loaded.stdout.splitlines()]
    assert sum(line["rows"] for line in lines if line["type"] == "batch") == 8
    assert lines[-1] | {"seconds": 0} == {
        "type": "loaded",
        "topics": [topic],
        "output": output,
        "messages": 8,
        "batches": 1,
        "seconds": 0,
    }
    window = ["--start", "2026-11-22T10:00", "--end", "2026-11-22T11:00"]
    audited = runner.invoke(
        cli,
        [
            "audit",
            "--broker",
            broker.endpoint,
            "--topic",
            topic,
            "--output",
            output,
            *window,
            "--json",
        ],
    )
    assert audited.exit_code == 0, audited.output
    assert [json.loads(line) for line in audited.stdout.splitlines()] == [
        {
            "type": "hour",
            "topic": topic,
            "hour": "2026-11-22T10:00:00+00:00",
            "in_pylog": 8,
            "loaded": 8,
            "difference": 0,
        },
        {"type": "audit", "topic": topic, "in_pylog": 8, "loaded": 8, "differing_hours": 0},
    ]


def without_pyspark(code: str) -> subprocess.CompletedProcess[str]:
    """`code` run by this Python with pyspark unimportable (as after scripts/start alone)."""
    return subprocess.run(
        [sys.executable, "-c", f"import sys; sys.modules['pyspark'] = None; {code}"],
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.broker
def test_python_m_pipeline_load_without_pyspark_says_how_to_install_it() -> None:
    """Issue 53, 8: after scripts/start alone (no pipeline extra) the README's Spark section
    ended in a bare `No module named 'pyspark'`."""
    result = without_pyspark(
        "import runpy; sys.argv = ['load', '--help']; "
        "runpy.run_module('pipeline.load', run_name='__main__')"
    )
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1] == (
        "ModuleNotFoundError: pylog's Spark pipeline (python -m pipeline.load, pipeline.audit) "
        "needs its pipeline extra (pyspark is missing): scripts/setup installs it, or pip "
        "install 'pylog[pipeline]' into this environment; and Java 17"
    )


@pytest.mark.broker
def test_pylogctl_load_without_pyspark_says_how_to_install_it() -> None:
    result = without_pyspark(
        "sys.argv = ['pylogctl', 'load', '--help']; from cli.pylogctl import main; main()"
    )
    assert result.returncode == 1
    assert result.stderr.strip() == (
        "Error: pylogctl load runs a Spark job and needs pylog's pipeline extra (pyspark is "
        "missing): pip install 'pylog[pipeline]' into this environment (scripts/setup does), "
        "and Java 17"
    )


def test_the_audit_compares_what_producers_counted_with_what_was_stored_and_loaded(
    spark: SparkSession, broker: RunningBroker, topic: str, tmp_path: Path
) -> None:
    audit_topic = f"{topic}-audit"
    create_topic(broker.endpoint, topic, 2)
    create_topic(broker.endpoint, audit_topic, 1)
    with Producer(broker.endpoint, topic, audit_topic=audit_topic) as producer:
        for n in range(12):
            producer.send(b"v", timestamp_ms=ms(TEN_FIFTEEN) + n)
        for n in range(4):
            producer.send(b"v", timestamp_ms=ms(ELEVEN_THIRTY) + n)
    output = str(tmp_path / "warehouse")
    cluster = {"broker": broker.endpoint}
    load.load(spark, cluster, [topic], output)
    arguments = [
        *("--broker", broker.endpoint, "--topic", topic, "--output", output),
        *("--audit-topic", audit_topic, "--start", "2026-11-22T10:00", "--end", "2026-11-22T12:00"),
    ]
    runner = CliRunner()

    matching = runner.invoke(audit.main, arguments)
    assert matching.exit_code == 0, matching.output
    assert matching.output.splitlines() == [
        "hour (UTC)            produced     in pylog       loaded   difference",
        "2026-11-22 10:00            12           12           12           +0",
        "2026-11-22 11:00             4            4            4           +0",
        "total                       16           16           16           +0",
        f"{topic}: OK, every hour matches",
    ]

    # Two messages that no audited producer counted, stored and loaded: hour 10 differs.
    produce(broker.endpoint, topic, 2, 2, timestamp_ms=ms(TEN_FIFTEEN))
    load.load(spark, cluster, [topic], output)
    differing = runner.invoke(audit.main, [*arguments, "--json"])
    assert differing.exit_code == 1, differing.output
    assert [json.loads(line) for line in differing.stdout.splitlines()][-1] == {
        "type": "audit",
        "topic": topic,
        "produced": 16,
        "in_pylog": 18,
        "loaded": 18,
        "differing_hours": 1,
    }

    half_hour = runner.invoke(
        audit.main, [*arguments[:-4], "--start", "2026-11-22T10:30", "--end", "2026-11-22T12:00"]
    )
    assert half_hour.exit_code == 2
    assert "whole hours" in half_hour.output
