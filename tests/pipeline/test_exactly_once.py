"""The sink's exactly-once delivery (issue 51): Spark tasks that fail after writing part of
their rows, run again by Spark, store each row once. The jobs run in a process of their own
(tests.pipeline.failing_jobs), whose local Spark retries failed tasks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from broker.client import Producer
from tests.pipeline.conftest import create_topic
from tests.pipeline.failing_jobs import Checked, check_rows, run
from tests.pylogd import RunningBroker

pytestmark = pytest.mark.slow  # ~4 min: each test runs Spark jobs of its own, retried and killed

ROWS, TASKS, FAIL_AFTER = 160_000, 4, 30_000
"""The issue's case: before, 240,000 messages were stored, 80,000 of them twice."""


def run_job(*arguments: str) -> dict[str, object]:
    done = run(*arguments)
    assert done.returncode == 0, done.stderr[-3000:]
    result: dict[str, object] = json.loads(done.stdout.splitlines()[-1])
    return result


def test_tasks_that_fail_after_writing_part_of_their_rows_store_each_row_once(
    broker: RunningBroker, topic: str
) -> None:
    create_topic(broker.endpoint, topic, 3)
    run_job(
        *("batch", "--broker", broker.endpoint, "--topic", topic),
        *("--rows", str(ROWS), "--tasks", str(TASKS), "--fail-after", str(FAIL_AFTER)),
    )
    assert check_rows(broker.endpoint, topic, 3, ROWS) == Checked(ROWS, 0, 0, 0)


def test_with_exactly_once_off_the_rows_of_failed_runs_are_stored_twice(
    broker: RunningBroker, topic: str
) -> None:
    """The off switch: at least once, as before (what the check above would see without
    exactly once): each failed run's rows (20,000 of 30,000 had reached its writer) again."""
    create_topic(broker.endpoint, topic, 3)
    run_job(
        *("batch", "--broker", broker.endpoint, "--topic", topic, "--exactly-once", "false"),
        *("--rows", str(ROWS), "--tasks", str(TASKS), "--fail-after", str(FAIL_AFTER)),
    )
    checked = check_rows(broker.endpoint, topic, 3, ROWS)
    assert checked.missing == checked.unexpected == 0
    assert checked.duplicates > 0 and checked.stored == ROWS + checked.duplicates


def test_a_stream_through_a_failed_task_and_a_killed_driver_stores_each_row_once(
    broker: RunningBroker, topic: str, tmp_path: Path
) -> None:
    """pylog -> pylog with Trigger.AvailableNow, 25,000 rows a micro-batch: batch 1's task
    fails once after 22,000 rows (20,000 of them had gone to the sink; Spark runs it again);
    in batch 2 the whole Spark is SIGKILLed from its task at the same row; run again from its
    checkpoint (as a restarted driver), it replays batch 2 and goes on. Every row once at the
    target (with exactlyOnce false a run stored 28,999 twice)."""
    rows, source = 80_000, f"{topic}-in"
    create_topic(broker.endpoint, source, 1)
    create_topic(broker.endpoint, topic, 2)
    with Producer(broker.endpoint, source, batch_messages=1000) as producer:
        for number in range(rows):
            producer.send(f"row-{number}".encode())
    arguments = (
        *("stream", "--broker", broker.endpoint, "--topic", topic, "--source", source),
        *("--checkpoint", str(tmp_path / "checkpoint"), "--rows", str(rows)),
        *("--per-batch", "25000", "--fail-after", "22000"),
    )
    killed = run(*arguments)
    assert killed.returncode != 0 and (tmp_path / "checkpoint.killed").exists()
    run_job(*arguments)
    assert check_rows(broker.endpoint, topic, 2, rows) == Checked(rows, 0, 0, 0)
