"""Spark jobs whose tasks fail on purpose after writing part of their rows (issue 51), each in a
process of its own: a local Spark that retries a failed task (`local[2,4]`, as a cluster's
spark.task.maxFailures of 4 does; the pipeline tests' session retries none).

`batch`: `spark.range(rows)` in `tasks` partitions, each row's value `row-<id>` (with
`--parquet DIR`, written to Parquet there first and read back from it), written with
`df.write.format("pylog")`; the first run of every task raises after `--fail-after` of its
rows, and Spark runs it again. Prints one JSON line: what the write committed and how long it
took. The caller reads the topic and checks it row by row (`check_rows`).

`stream`: a streaming query from topic `--source` (holding `row-0` .. `row-<rows - 1>`, as the
caller produced them) to `--topic`, Trigger.AvailableNow, at most `--per-batch` messages a
micro-batch, checkpointed in `--checkpoint`. In batch 1 the first run of every task raises
after `--fail-after` rows (Spark runs it again); in batch 2, the first time ever (a file beside
the checkpoint, `<checkpoint>.killed`, says it was done), the job's whole Spark (its JVM: the
driver and its executors) is SIGKILLed from a task at that row. (Spark passes a Python writer
its rows 10,000 at a time: with `--fail-after` past that, part of them went to the sink.) Run
it again with the same checkpoint, as a restarted driver would be: it goes on from the
checkpoint, replaying batch 2. Prints one JSON line when the query finished; a killed run
exits with an error.

    .venv/bin/python -m tests.pipeline.failing_jobs batch --broker HOST:PORT --topic T
        [--rows 160000] [--tasks 4] [--fail-after 30000] [--exactly-once true|false]
        [--parquet DIR]
    .venv/bin/python -m tests.pipeline.failing_jobs stream --broker HOST:PORT --topic T
        --source S --checkpoint DIR [--rows 80000] [--per-batch 25000] [--fail-after 22000]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pyspark import TaskContext
from pyspark.sql.functions import col, udf

from broker.client import PartitionConsumer
from pipeline.sink import BATCH_ID
from tests.pipeline.conftest import local_spark


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


def run(*arguments: str) -> subprocess.CompletedProcess[str]:
    """Run a job (this module's command line) in a process of its own, within 600 s."""
    return subprocess.run(
        [sys.executable, "-m", "tests.pipeline.failing_jobs", *arguments],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


def _past(fail_after: int, fail: Callable[[TaskContext], None]) -> Any:
    """A UDF of a string column that passes it through, calling `fail` with the task's context
    at each row past the first `fail_after` of a task's run (counted per task attempt, in the
    Python worker)."""
    seen: Counter[int] = Counter()

    @udf("string")
    def value(text: str) -> str:
        context = TaskContext.get()
        assert context is not None
        seen[context.taskAttemptId()] += 1
        if seen[context.taskAttemptId()] > fail_after:
            fail(context)
        return text

    return value


def _first_run_fails(context: TaskContext) -> None:
    if context.attemptNumber() == 0:
        raise RuntimeError(f"task {context.partitionId()} failed on purpose")


def _batch(arguments: argparse.Namespace) -> dict[str, object]:
    spark = local_spark("local[2,4]")
    value = _past(arguments.fail_after, _first_run_fails)
    frame = spark.range(0, arguments.rows, numPartitions=arguments.tasks)
    frame = frame.selectExpr("concat('row-', id) AS value")
    if arguments.parquet:
        frame.write.mode("overwrite").parquet(arguments.parquet)
        frame = spark.read.parquet(arguments.parquet)
    started = time.monotonic()
    frame.select(value(col("value")).alias("value")).write.format("pylog").mode("append").options(
        broker=arguments.broker, topic=arguments.topic, exactlyOnce=arguments.exactly_once
    ).save()
    seconds = time.monotonic() - started
    spark.stop()
    return {"rows": arguments.rows, "seconds": round(seconds, 3)}


def _jvm_pid() -> int:
    """The pid of the JVM above this Python worker (its parent, or the daemon's parent)."""
    pid = os.getpid()
    while pid > 1:
        pid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        if b"java" in Path(f"/proc/{pid}/cmdline").read_bytes():
            return pid
    raise RuntimeError("no JVM above this process")


def _stream(arguments: argparse.Namespace) -> dict[str, object]:
    spark = local_spark("local[2,4]")
    killed = Path(f"{arguments.checkpoint}.killed")

    def fail(context: TaskContext) -> None:
        batch = int(context.getLocalProperty(BATCH_ID) or -1)
        if batch == 1:
            _first_run_fails(context)
        elif batch == 2 and not killed.exists():
            killed.touch()
            os.kill(_jvm_pid(), signal.SIGKILL)

    value = _past(arguments.fail_after, fail)

    source = (
        spark.readStream.format("pylog")
        .options(broker=arguments.broker, subscribe=arguments.source)
        .options(startingOffsets="earliest", maxOffsetsPerTrigger=str(arguments.per_batch))
        .load()
    )
    started = time.monotonic()
    query = (
        source.select(value(col("value").cast("string")).alias("value"))
        .writeStream.format("pylog")
        .options(broker=arguments.broker, topic=arguments.topic)
        .options(exactlyOnce=arguments.exactly_once, checkpointLocation=arguments.checkpoint)
        .trigger(availableNow=True)
        .start()
    )
    if not query.awaitTermination(240):
        raise RuntimeError("the query did not finish within 240 s")
    seconds = time.monotonic() - started
    spark.stop()
    return {"rows": arguments.rows, "seconds": round(seconds, 3)}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("job", choices=["batch", "stream"])
    parser.add_argument("--broker", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--rows", type=int, default=160_000)
    parser.add_argument("--tasks", type=int, default=4)
    parser.add_argument("--fail-after", type=int, default=30_000)
    parser.add_argument("--exactly-once", choices=["true", "false"], default="true")
    parser.add_argument("--parquet", help="batch: write the rows to Parquet here, then read them")
    parser.add_argument("--source", help="stream: the topic read")
    parser.add_argument("--checkpoint", help="stream: the query's checkpoint folder")
    parser.add_argument("--per-batch", type=int, default=25_000)
    arguments = parser.parse_args(argv)
    if arguments.job == "stream":
        if not arguments.source or not arguments.checkpoint:
            parser.error("stream needs --source and --checkpoint")
        if arguments.fail_after >= arguments.per_batch:
            parser.error("--fail-after must be below --per-batch")
        print(json.dumps(_stream(arguments)), flush=True)
        return 0
    per_task, rest = divmod(arguments.rows, arguments.tasks)
    if rest or arguments.fail_after >= per_task:
        parser.error("--rows must divide into --tasks, each more than --fail-after rows")
    print(json.dumps(_batch(arguments)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
