"""Rows per second read into Spark from a pylog topic, next to the same rows read from Parquet.

    .venv/bin/python perf/bench_spark.py [--messages 1000000] [--partitions 2] [--master local[*]]

Starts a real pylogd (its private ZooKeeper, fsync off), fills topic "bench" with `--messages`
messages of 200 bytes on disk (no key, a 174-byte value), then in one local Spark session:

- `pylog`: spark.read.format("pylog") over the whole topic into Spark's noop sink (every row
  and column materialised, nothing written): the source's fetch, decode and Arrow path;
- `parquet`: the same rows written once to a Parquet file (not timed) and read back the same
  way: Spark's own columnar reader, the baseline;
- `sink`: the Parquet rows' values written to a new topic of `--partitions` partitions with
  `df.write.format("pylog")`, at least once (`exactlyOnce` false) and exactly once (the
  default), each written once to warm up and then `--sink-rounds` times alternating (issue
  51's target: exactly once at 0.95x or more of at least once).

Each read is run once to warm up (Python workers, JIT) and then timed. Prints the figures and
one JSON line. Run it alone: anything else on 2 cores skews it.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from pyspark.sql import DataFrame, SparkSession

from broker.client import Ack, Admin, Producer
from broker.log.message import HEADER_SIZE
from pipeline import register
from pipeline.cluster import DriverView, SourcePartition

MESSAGE_BYTES = 200


def start_pylogd(work: Path) -> tuple[subprocess.Popen[str], str]:
    command = [str(Path(sys.executable).with_name("pylogd")), "--broker-data-dir", str(work)]
    command += ["--broker-port", "0", "--log-fsync", "false", "--log-flush-interval-ms", "100"]
    process = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
    )
    assert process.stdout is not None
    line = process.stdout.readline()
    if not line.startswith("pylogd ready on "):
        process.kill()
        raise SystemExit(f"pylogd did not start (see {work})")
    return process, "tcp://" + line.split()[-1]


def fill(endpoint: str, messages: int, partitions: int) -> float:
    """Produce the topic; returns messages/s (for the record, not the point)."""
    with Admin(endpoint) as admin:
        admin.create_topic("bench", partitions)
    value = b"x" * (MESSAGE_BYTES - HEADER_SIZE)
    started = time.perf_counter()
    with Producer(
        endpoint,
        "bench",
        ack=Ack.WRITTEN,
        partitioner="round_robin",
        batch_messages=2000,
        batch_bytes=1 << 20,
    ) as producer:
        for _ in range(messages):
            producer.send(value, timestamp_ms=1_700_000_000_000)
    rate = messages / (time.perf_counter() - started)
    # Acked as written: wait until the flushes make every message readable.
    deadline = time.monotonic() + 60
    with DriverView(endpoint) as cluster:
        while True:
            holders = cluster.holders("bench")
            readable = sum(
                cluster.offsets(SourcePartition("bench", p), e)[1] for p, e in holders.items()
            )
            if readable == messages * MESSAGE_BYTES:
                return rate
            if time.monotonic() > deadline:
                raise SystemExit(f"only {readable} bytes of the topic became readable")
            time.sleep(0.05)


def timed_write(
    frame: DataFrame, endpoint: str, topic: str, partitions: int, exactly: str
) -> float:
    """Seconds to write every row of `frame` to a new topic `topic`."""
    with Admin(endpoint) as admin:
        admin.create_topic(topic, partitions)
    writer = frame.write.format("pylog").mode("append")
    started = time.perf_counter()
    writer.options(broker=endpoint, topic=topic, exactlyOnce=exactly).save()
    return time.perf_counter() - started


def timed_read(frame: DataFrame) -> float:
    """Seconds to read every row of `frame` into Spark (the noop sink drops them)."""
    frame.write.format("noop").mode("overwrite").save()  # warm-up
    started = time.perf_counter()
    frame.write.format("noop").mode("overwrite").save()
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--partitions", type=int, default=2)
    parser.add_argument("--master", default="local[*]")
    parser.add_argument("--sink-rounds", type=int, default=2)
    args = parser.parse_args()
    if args.messages < 1000 or args.partitions < 1:
        parser.error("--messages must be at least 1000 and --partitions at least 1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    work = Path(tempfile.mkdtemp(prefix="pylog-bench-spark-", dir="/tmp"))
    process, endpoint = start_pylogd(work / "pylogd")
    try:
        produced = fill(endpoint, args.messages, args.partitions)
        spark = (
            SparkSession.builder.master(args.master)
            .appName("pylog-bench-spark")
            .config("spark.ui.enabled", "false")
            .getOrCreate()
        )
        try:
            register(spark)
            pylog = spark.read.format("pylog").options(broker=endpoint, subscribe="bench").load()
            pylog_s = timed_read(pylog)
            parquet_path = str(work / "bench.parquet")
            pylog.write.parquet(parquet_path)
            parquet = spark.read.parquet(parquet_path)
            if parquet.count() != args.messages:
                raise SystemExit(f"the Parquet copy does not hold {args.messages} rows")
            parquet_s = timed_read(parquet)
            values = parquet.select("value")
            sink_s = {"false": 0.0, "true": 0.0}
            for round_ in range(args.sink_rounds + 1):  # round 0 warms up
                for exactly in sink_s:
                    seconds = timed_write(
                        values, endpoint, f"sink-{exactly}-{round_}", args.partitions, exactly
                    )
                    if round_:
                        sink_s[exactly] += seconds
        finally:
            spark.stop()
    finally:
        process.terminate()
        process.wait(60)
        shutil.rmtree(work)
    mb = args.messages * MESSAGE_BYTES / 1e6
    print(f"topic: {args.messages} messages of {MESSAGE_BYTES} B in {args.partitions} partitions")
    print(f"pylog   -> Spark: {args.messages / pylog_s:>10,.0f} rows/s  {mb / pylog_s:7.1f} MB/s")
    print(f"Parquet -> Spark: {args.messages / parquet_s:>10,.0f} rows/s")
    written = args.messages * args.sink_rounds
    least, exactly = written / sink_s["false"], written / sink_s["true"]
    print(f"Spark -> pylog, at least once: {least:>10,.0f} rows/s")
    print(f"Spark -> pylog, exactly once:  {exactly:>10,.0f} rows/s ({exactly / least:.2f}x)")
    line = {
        "benchmark": "spark_read",
        "messages": args.messages,
        "message_bytes": MESSAGE_BYTES,
        "partitions": args.partitions,
        "master": args.master,
        "produce_messages_per_s": round(produced),
        "pylog_rows_per_s": round(args.messages / pylog_s),
        "parquet_rows_per_s": round(args.messages / parquet_s),
        "sink_at_least_once_rows_per_s": round(least),
        "sink_exactly_once_rows_per_s": round(exactly),
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
    }
    print(json.dumps(line))


if __name__ == "__main__":
    main()
