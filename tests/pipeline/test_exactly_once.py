"""The sink's exactly-once delivery (issue 51): Spark tasks that fail after writing part of
their rows, run again by Spark, store each row once. The jobs run in a process of their own
(tests.pipeline.failing_jobs), whose local Spark retries failed tasks."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.pipeline.conftest import create_topic
from tests.pipeline.failing_jobs import Checked, check_rows
from tests.pylogd import RunningBroker

ROWS, TASKS, FAIL_AFTER = 160_000, 4, 30_000
"""The issue's case: before, 240,000 messages were stored, 80,000 of them twice."""


def run_job(*arguments: str) -> dict[str, object]:
    done = subprocess.run(
        [sys.executable, "-m", "tests.pipeline.failing_jobs", *arguments],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
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
