"""Spark jobs whose tasks fail on purpose after writing part of their rows (issue 51), each in a
process of its own: a local Spark that retries a failed task (`local[2,4]`, as a cluster's
spark.task.maxFailures of 4 does; the pipeline tests' session retries none).

`batch`: `spark.range(rows)` in `tasks` partitions, each row's value `row-<id>`, written with
`df.write.format("pylog")`; the first run of every task raises after `--fail-after` of its
rows, and Spark runs it again. Prints one JSON line: what the write committed and how long it
took. The caller reads the topic and checks it row by row (`check_rows`).

    .venv/bin/python -m tests.pipeline.failing_jobs batch --broker HOST:PORT --topic T
        [--rows 160000] [--tasks 4] [--fail-after 30000] [--exactly-once true|false]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from broker.client import PartitionConsumer


@dataclass(frozen=True)
class Checked:
    """A topic read whole, against the values `row-0` .. `row-<rows - 1>`."""

    stored: int
    duplicates: int
    """Messages beyond the first of each value."""
    missing: int
    unexpected: int


def check_rows(endpoint: str, topic: str, partitions: int, rows: int) -> Checked:
    """Read every message of `topic` and count each value."""
    counts: Counter[bytes] = Counter()
    for partition in range(partitions):
        with PartitionConsumer(endpoint, topic, partition, stop_at_end=True) as consumer:
            counts.update(message.value for message in consumer)
    expected = {f"row-{n}".encode() for n in range(rows)}
    return Checked(
        sum(counts.values()),
        sum(c - 1 for c in counts.values() if c > 1),
        len(expected - counts.keys()),
        len(counts.keys() - expected),
    )


def _batch(arguments: argparse.Namespace) -> dict[str, object]:
    from pyspark import TaskContext
    from pyspark.sql import SparkSession
    from pyspark.sql.functions import col, udf

    from pipeline import register

    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    spark = (
        SparkSession.builder.master("local[2,4]")
        .appName("pylog-failing-jobs")
        .config("spark.ui.enabled", "false")
        .config("spark.driver.host", "127.0.0.1")
        .getOrCreate()
    )
    register(spark)
    per_task = arguments.rows // arguments.tasks
    fail_after = arguments.fail_after

    @udf("string")
    def value(row_id: int) -> str:
        context = TaskContext.get()
        if context is not None and context.attemptNumber() == 0 and row_id % per_task == fail_after:
            raise RuntimeError(f"task failed on purpose at row {row_id}")
        return f"row-{row_id}"

    frame = spark.range(0, arguments.rows, numPartitions=arguments.tasks)
    started = time.monotonic()
    frame.select(value(col("id")).alias("value")).write.format("pylog").mode("append").options(
        broker=arguments.broker, topic=arguments.topic, exactlyOnce=arguments.exactly_once
    ).save()
    seconds = time.monotonic() - started
    spark.stop()
    return {"rows": arguments.rows, "seconds": round(seconds, 3)}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("job", choices=["batch"])
    parser.add_argument("--broker", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--rows", type=int, default=160_000)
    parser.add_argument("--tasks", type=int, default=4)
    parser.add_argument("--fail-after", type=int, default=30_000)
    parser.add_argument("--exactly-once", choices=["true", "false"], default="true")
    arguments = parser.parse_args(argv)
    per_task, rest = divmod(arguments.rows, arguments.tasks)
    if rest or arguments.fail_after >= per_task:
        parser.error("--rows must divide into --tasks, each more than --fail-after rows")
    print(json.dumps(_batch(arguments)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
