"""Storage engine benchmark: append to and read from one partition log, next to a raw baseline.

    .venv/bin/python perf/bench_log.py [--messages N] [--repeat R] [--dir DIR]

Appends pre-built message sets of 50 messages of 200 bytes (validation in full: framing and
checksum of every message) with a flush every 10,000 messages and no fsync, then reads the log
back from the first offset to the high watermark with fetches of --fetch-bytes, twice: copying
each fetch out to bytes (`read`, comparable to the baseline, which copies too), and taking the
zero-copy views only (`read_views`, what a send with copy=False gets). The baseline writes the
same sets with a plain buffered file and reads it back in the same chunks. Runs alternate
between pylog and the baseline; the median of --repeat runs is printed as one JSON line. Run it
alone: anything else on 2 cores skews it.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from broker.log import LogConfig, PartitionLog, encode_message

MESSAGE_BYTES = 200
SET_MESSAGES = 50


def build_sets(messages: int) -> list[bytes]:
    """Distinct message sets (values differ, so checksums differ) ready to append."""
    value_bytes = MESSAGE_BYTES - 26
    sets = []
    for s in range(messages // SET_MESSAGES):
        sets.append(
            b"".join(
                encode_message(
                    (b"%012d" % (s * SET_MESSAGES + i)).ljust(value_bytes, b"x"), timestamp_ms=0
                )
                for i in range(SET_MESSAGES)
            )
        )
    return sets


def bench_log(
    directory: Path, sets: list[bytes], fetch_bytes: int
) -> tuple[float, float, float, int]:
    """Seconds to append all sets, to read everything copying it out, and to read everything
    as views only; and the bytes read."""
    config = LogConfig(flush_messages=10_000, fsync=False)
    log = PartitionLog.open(directory, config)
    start = time.perf_counter()
    for message_set in sets:
        log.append(message_set)
    log.flush()
    append_seconds = time.perf_counter() - start
    timings = []
    read = 0
    for copy in (True, False):
        read = 0
        start = time.perf_counter()
        offset = log.log_start_offset
        while offset < log.flushed_offset:
            view = log.read(offset, fetch_bytes)
            if copy:
                bytes(view)
            read += view.nbytes
            offset += view.nbytes
            del view
        timings.append(time.perf_counter() - start)
    log.close()
    return append_seconds, timings[0], timings[1], read


def bench_raw(path: Path, sets: list[bytes], fetch_bytes: int) -> tuple[float, float, int]:
    """Seconds to write all sets with a buffered file and to read the file back; bytes read."""
    start = time.perf_counter()
    with open(path, "wb") as f:
        for message_set in sets:
            f.write(message_set)
    append_seconds = time.perf_counter() - start
    read = 0
    start = time.perf_counter()
    with open(path, "rb") as f:
        while chunk := f.read(fetch_bytes):
            read += len(chunk)
    read_seconds = time.perf_counter() - start
    return append_seconds, read_seconds, read


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--fetch-bytes", type=int, default=1 << 20)
    parser.add_argument("--dir", type=Path, default=None, help="where to write (default: /tmp)")
    args = parser.parse_args()
    if args.messages < SET_MESSAGES or args.repeat < 1:
        parser.error(f"--messages must be at least {SET_MESSAGES} and --repeat at least 1")
    messages = args.messages // SET_MESSAGES * SET_MESSAGES
    sets = build_sets(messages)
    work = Path(tempfile.mkdtemp(prefix="pylog-bench-", dir=args.dir))
    log_runs: list[tuple[float, float, float, int]] = []
    raw_runs: list[tuple[float, float, int]] = []
    try:
        for n in range(args.repeat):  # alternating, so both see the same machine
            log_runs.append(bench_log(work / f"bench-{n}", sets, args.fetch_bytes))
            shutil.rmtree(work / f"bench-{n}")
            raw_runs.append(bench_raw(work / "raw.log", sets, args.fetch_bytes))
            (work / "raw.log").unlink()
    finally:
        shutil.rmtree(work)
    size = log_runs[0][-1]
    figures: dict[str, float] = {}
    for name, seconds in (
        ("append", [r[0] for r in log_runs]),
        ("read", [r[1] for r in log_runs]),
        ("read_views", [r[2] for r in log_runs]),
        ("raw_append", [r[0] for r in raw_runs]),
        ("raw_read", [r[1] for r in raw_runs]),
    ):
        median = statistics.median(seconds)
        figures[f"{name}_msgs_per_s"] = round(messages / median)
        figures[f"{name}_mb_per_s"] = round(size / median / 1e6, 1)
    line = {
        "benchmark": "storage",
        "messages": messages,
        "message_bytes": MESSAGE_BYTES,
        "set_messages": SET_MESSAGES,
        "fetch_bytes": args.fetch_bytes,
        "repeat": args.repeat,
        **figures,
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
    }
    print(json.dumps(line))


if __name__ == "__main__":
    main()
