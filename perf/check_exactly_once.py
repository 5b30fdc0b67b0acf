"""Issue 51's exactly-once runs: Spark jobs into pylog through failed tasks and a killed driver,
each row checked.

    .venv/bin/python -m perf.check_exactly_once [--runs 20] [--rows 160000] [--stream-rows 80000]

Starts a private pylogd (its private ZooKeeper, fsync off), then `--runs` times, each in fresh
topics:

- `batch`: `--rows` rows written to Parquet and read back in 4 tasks, written to a topic of 3
  partitions with `df.write.format("pylog")`; the first run of every task fails after 30,000
  rows and Spark runs it again (tests.pipeline.failing_jobs batch --parquet);
- `stream`: `--stream-rows` rows of a topic streamed into a topic of 2 partitions, 25,000 a
  micro-batch; batch 1's task fails once after 22,000 rows, and in batch 2 the whole Spark is
  SIGKILLed at that row and the query started again from its checkpoint
  (tests.pipeline.failing_jobs stream).

After each, every message of the target topic is read and each row counted: stored, twice,
lost. Prints a line a run, a summary and one JSON line; exits 1 if any row was lost or stored
twice. Run it alone: it is minutes of Spark on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

from broker.client import Admin, Producer
from perf.bench_spark import start_pylogd
from tests.pipeline.failing_jobs import Checked, check_rows
from tests.pipeline.failing_jobs import run as run_job


def _ran(done: subprocess.CompletedProcess[str], what: str) -> None:
    if done.returncode != 0:
        raise SystemExit(f"{what} failed:\n{done.stderr[-3000:]}")


def batch_run(endpoint: str, work: Path, run: int, rows: int) -> Checked:
    topic = f"batch-{run}"
    with Admin(endpoint) as admin:
        admin.create_topic(topic, 3)
    done = run_job(
        *("batch", "--broker", endpoint, "--topic", topic, "--rows", str(rows)),
        *("--tasks", "4", "--fail-after", "30000", "--parquet", str(work / f"rows-{run}")),
    )
    _ran(done, f"batch run {run}")
    return check_rows(endpoint, topic, 3, rows)


def stream_run(endpoint: str, work: Path, run: int, rows: int) -> Checked:
    source, topic = f"source-{run}", f"stream-{run}"
    with Admin(endpoint) as admin:
        admin.create_topic(source, 1)
        admin.create_topic(topic, 2)
    with Producer(endpoint, source, batch_messages=1000) as producer:
        for number in range(rows):
            producer.send(f"row-{number}".encode())
    arguments = (
        *("stream", "--broker", endpoint, "--topic", topic, "--source", source),
        *("--checkpoint", str(work / f"checkpoint-{run}"), "--rows", str(rows)),
        *("--per-batch", "25000", "--fail-after", "22000"),
    )
    killed = run_job(*arguments)
    if killed.returncode == 0 or not (work / f"checkpoint-{run}.killed").exists():
        raise SystemExit(f"stream run {run}: its Spark was not killed:\n{killed.stderr[-3000:]}")
    _ran(run_job(*arguments), f"stream run {run}, restarted")
    return check_rows(endpoint, topic, 2, rows)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--rows", type=int, default=160_000)
    parser.add_argument("--stream-rows", type=int, default=80_000)
    args = parser.parse_args()
    if args.runs < 1 or args.rows % 4 or args.rows < 4 * 30_001 or args.stream_rows < 50_001:
        parser.error(
            "--runs 1 or more, --rows a multiple of 4 past 120,000, --stream-rows past 50,000"
        )
    work = Path(tempfile.mkdtemp(prefix="pylog-exactly-once-", dir="/tmp"))
    process, endpoint = start_pylogd(work / "pylogd")
    results: dict[str, list[Checked]] = {"batch": [], "stream": []}
    started = time.monotonic()
    try:
        for run in range(1, args.runs + 1):
            for kind, runner, rows in (
                ("batch", batch_run, args.rows),
                ("stream", stream_run, args.stream_rows),
            ):
                checked = runner(endpoint, work, run, rows)
                results[kind].append(checked)
                print(
                    f"run {run:>2} {kind:<6}: {checked.stored:>7,} stored of {rows:,}, "
                    f"{checked.duplicates:,} twice, {checked.missing:,} lost",
                    flush=True,
                )
    finally:
        process.terminate()
        process.wait(60)
        shutil.rmtree(work)
    bad = 0
    for kind, checks in results.items():
        twice = sum(c.duplicates for c in checks)
        lost = sum(c.missing + c.unexpected for c in checks)
        bad += twice + lost
        print(f"{kind}: {len(checks)} runs, {twice} rows stored twice, {lost} lost or unexpected")
    line = {
        "benchmark": "exactly_once",
        "runs": args.runs,
        "seconds": round(time.monotonic() - started),
        **{kind: [asdict(c) for c in checks] for kind, checks in results.items()},
    }
    print(json.dumps(line))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
