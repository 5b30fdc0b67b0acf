"""OFFSETS by time on a large log: PartitionLog.offset_for_timestamp, before and after the time
index, from one run.

    flock /tmp/bench.lock .venv/bin/python perf/bench_timeindex.py --old /tmp/wt-old \\
        [--messages 100000000] [--lookups 1000] [--old-lookups 1] [--dir DIR]

Writes a synthetic partition of --messages messages of 26 bytes (no key, empty value: the
smallest message, so that 10^8 of them take 2.6 GB) in segments of 40M messages, closed
cleanly, with a small active segment of 1,000: the closed segments' .index and .timeindex
files are written by this tree's code (broker.log.index, broker.log.timeindex) from the
layout, so that building the log takes seconds, not the hours appending 10^8 messages would.
Producers write 1,000 messages a millisecond, and every tenth millisecond's timestamps are 3 ms
behind (timestamps need not grow with offsets). Then, in a child process for each revision
(the tree given by --old, a `git worktree add` of the revision before, and this tree),
alternating: open the log (timed), and look up --lookups random times (--old-lookups for the
old revision, whose lookups walk every header: about 0.3 s per million messages), the first of
them 90% of the way through the log. Prints one JSON line per child: open seconds, the first
lookup (it maps its segment), the median, 99th percentile and greatest lookup in ms; the
offsets found are checked to be the same in both, for the same times.
Finally it removes this tree's .timeindex files and opens the log again with this tree's code:
what the first open of a log written before time indexes costs (each closed segment's headers
walked, the file stored). The page cache is warm (the files were just written). Run it alone.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

MESSAGE_BYTES = 26
PER_MS = 1000
SEGMENT_MESSAGES = 40_000_000
ACTIVE_MESSAGES = 1000
START_MS = 1_700_000_000_000
RUN_MESSAGES = 158
"""With index_interval_bytes 4096 and 26-byte messages a run is 158 messages (4,108 bytes)."""


def block_time(block: int) -> int:
    return START_MS + block - (3 if block % 10 == 9 else 0)


def write_segment(directory: Path, first: int, count: int, closed: bool) -> None:
    """Messages [first, first + count) as one segment file, and its indexes when `closed`."""
    from broker.log.index import OffsetIndex
    from broker.log.message import NO_TIMESTAMP, encode_message
    from broker.log.segment import segment_file_name
    from broker.log.timeindex import TimeIndex

    assert first % PER_MS == 0 and count % PER_MS == 0
    path = directory / segment_file_name(first * MESSAGE_BYTES)
    with open(path, "wb") as f:
        for block in range(first // PER_MS, (first + count) // PER_MS):
            f.write(encode_message(b"", timestamp_ms=block_time(block)) * PER_MS)
    if not closed:
        return
    size = count * MESSAGE_BYTES
    marks = list(range(0, size, RUN_MESSAGES * MESSAGE_BYTES))
    greatest = [NO_TIMESTAMP]
    for mark in marks:
        start = first + mark // MESSAGE_BYTES
        last = min(start + RUN_MESSAGES, first + count) - 1
        greatest.append(max(block_time(start // PER_MS), block_time(last // PER_MS)))
    OffsetIndex(marks).write(path.with_suffix(".index"), size)
    TimeIndex.build(marks, greatest).write(path.with_suffix(".timeindex"), size)


def build(directory: Path, messages: int) -> None:
    directory.mkdir(parents=True)
    closed = messages - ACTIVE_MESSAGES
    first = 0
    while first < closed:
        count = min(SEGMENT_MESSAGES, closed - first)
        write_segment(directory, first, count, closed=True)
        first += count
    write_segment(directory, first, ACTIVE_MESSAGES, closed=False)


CHILD = """
import json, sys, time
from pathlib import Path
from broker.log import LogConfig, PartitionLog
directory, times = Path(sys.argv[1]), json.loads(sys.argv[2])
config = LogConfig(segment_ms=None, retention_ms=None, fsync=False, flush_messages=1 << 30)
started = time.perf_counter()
log = PartitionLog.open(directory, config)
opened = time.perf_counter() - started
took, found = [], []
for t in times:
    started = time.perf_counter()
    found.append(log.offset_for_timestamp(t))
    took.append(time.perf_counter() - started)
print(json.dumps({"open_s": opened, "took": took, "found": found}))
"""


def child(tree: Path, directory: Path, times: list[int]) -> tuple[float, list[float], list[int]]:
    """Seconds to open the log with the code of `tree`, and each lookup's seconds and offset."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    run = subprocess.run(
        [sys.executable, "-c", CHILD, str(directory), json.dumps(times)],
        env=env,
        cwd=tree,
        capture_output=True,
        text=True,
        check=True,
    )
    result = json.loads(run.stdout)
    return float(result["open_s"]), [float(t) for t in result["took"]], result["found"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--old", type=Path, required=True, help="a worktree of the old revision")
    parser.add_argument("--messages", type=int, default=100_000_000)
    parser.add_argument("--lookups", type=int, default=1000)
    parser.add_argument("--old-lookups", type=int, default=1)
    parser.add_argument("--dir", type=Path, default=None, help="where to write (default: /tmp)")
    args = parser.parse_args()
    new = Path(__file__).resolve().parents[1]
    root = Path(tempfile.mkdtemp(prefix="pylog-bench-timeindex-", dir=args.dir))
    try:
        directory = root / "t-0"
        started = time.perf_counter()
        build(directory, args.messages)
        print(json.dumps({"built_s": round(time.perf_counter() - started, 1)}), flush=True)
        last_ms = block_time(args.messages // PER_MS - 1)
        rng = random.Random(12)
        times = [START_MS + int((last_ms - START_MS) * 0.9)]
        times += [rng.randint(START_MS - 5, last_ms + 5) for _ in range(args.lookups - 1)]
        found = {}
        for name, tree, lookups in (("old", args.old, args.old_lookups), ("new", new, len(times))):
            opened, took, found[name] = child(tree, directory, times[:lookups])
            print(
                json.dumps(
                    {
                        "revision": name,
                        "messages": args.messages,
                        "open_s": round(opened, 3),
                        "lookups": len(took),
                        "first_lookup_ms": round(took[0] * 1000, 3),
                        "lookup_median_ms": round(statistics.median(took) * 1000, 3),
                        "lookup_p99_ms": round(sorted(took)[len(took) * 99 // 100] * 1000, 3),
                        "lookup_max_ms": round(max(took) * 1000, 3),
                    }
                ),
                flush=True,
            )
        assert found["old"] == found["new"][: args.old_lookups], (found["old"], found["new"][:5])
        sizes = [p.stat().st_size for p in directory.glob("*.timeindex")]
        for path in directory.glob("*.timeindex"):
            path.unlink()
        opened, _, _ = child(new, directory, times[:1])
        print(
            json.dumps(
                {
                    "revision": "new, first open without .timeindex files",
                    "open_s": round(opened, 3),
                    "timeindex_bytes": sum(sizes),
                    "rebuilt_bytes": sum(p.stat().st_size for p in directory.glob("*.timeindex")),
                }
            ),
            flush=True,
        )
    finally:
        shutil.rmtree(root)


if __name__ == "__main__":
    main()
