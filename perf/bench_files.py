"""File descriptors: what a worker holds with many partitions, and what opening a released
segment file again adds to an append and a read; before and after bounding open files.

    flock /tmp/bench.lock .venv/bin/python perf/bench_files.py --old /tmp/wt-old \\
        [--partitions 10000] [--repeat 3] [--dir DIR]

Each figure comes from a child process running the code of one revision (--old, a `git
worktree add` of the revision before, or this tree), the revisions alternating, --repeat
times; the median is printed, one JSON line per revision and case:

- `hot`: one partition, 20,000 appends of a one-message set of 100 bytes (no fsync, no flush
  on the way), then 20,000 reads of 4 KiB at its start: the cost of an append and a read whose
  handles stay open (the bookkeeping of the open-file LRU, and nothing else, in the new code);
- `reopen`: 512 partitions, twice the default max_open_files, appended to and read round robin
  (40 rounds): in the new code every append opens its segment's file again and every read maps
  it again (the least recently used handle is always the one needed); the old code keeps all
  1,024 handles open (the child raises its descriptor limit to the hard limit for it);
- `partitions`: --partitions partitions opened in one process under RLIMIT_NOFILE 1,024, each
  appended to, flushed and read once, round robin: whether it works (the old code stops at
  EMFILE, whose message names the partition), the most descriptors the process held (counted
  every 50 partitions), and the seconds.

Appends write to the page cache (no fsync): the figures are CPU costs. Run it alone.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

CHILD = """
import json, os, resource, sys, time
from pathlib import Path
directory, partitions, rounds, limit = Path(sys.argv[1]), *(int(a) for a in sys.argv[2:5])
hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
resource.setrlimit(resource.RLIMIT_NOFILE, (limit or hard, hard))
from broker.log import LogConfig, PartitionLog, encode_message
config = LogConfig(fsync=False, flush_messages=1 << 30, segment_ms=None, retention_ms=None)
message = encode_message(b"x" * 74, timestamp_ms=1)
logs, most = [], 0
started = time.perf_counter()
try:
    for i in range(partitions):
        logs.append(PartitionLog.open(directory / f"t-{i}", config))
    for turn in range(rounds + 1):
        if turn == 1:
            appended = time.perf_counter()
        for i, log in enumerate(logs):
            log.append(message)
            if rounds == 0:
                log.flush()
                log.read(0, 4096)
                if i % 50 == 0:
                    most = max(most, len(os.listdir("/proc/self/fd")))
    appended = time.perf_counter() - appended if rounds else 0.0
    for log in logs:
        log.flush()
    for turn in range(rounds + 1):
        if turn == 1:
            read = time.perf_counter()
        for log in logs:
            log.read(0, 4096)
    read = time.perf_counter() - read if rounds else 0.0
    most = max(most, len(os.listdir("/proc/self/fd")))
    failed = None
except OSError as error:
    failed = str(error)
elapsed = time.perf_counter() - started
operations = max(1, rounds * partitions)
print(json.dumps({
    "append_us": appended / operations * 1e6 if not failed else None,
    "read_us": read / operations * 1e6 if not failed else None,
    "most_open": most, "failed": failed, "seconds": elapsed,
}))
"""


def child(tree: Path, directory: Path, partitions: int, rounds: int, limit: int) -> dict[str, Any]:
    shutil.rmtree(directory, ignore_errors=True)
    run = subprocess.run(
        [sys.executable, "-c", CHILD, str(directory)]
        + [str(n) for n in (partitions, rounds, limit)],
        env={**os.environ, "PYTHONPATH": str(tree)},
        cwd=tree,
        capture_output=True,
        text=True,
        check=True,
    )
    result: dict[str, Any] = json.loads(run.stdout)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--old", type=Path, required=True, help="a worktree of the old revision")
    parser.add_argument("--partitions", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--dir", type=Path, default=None, help="where to write (default: /tmp)")
    args = parser.parse_args()
    trees = {"old": args.old, "new": Path(__file__).resolve().parents[1]}
    root = Path(tempfile.mkdtemp(prefix="pylog-bench-files-", dir=args.dir))
    try:
        cases = {"hot": (1, 20_000, 0), "reopen": (512, 40, 0)}
        for case, (partitions, rounds, limit) in cases.items():
            runs: dict[str, list[dict[str, Any]]] = {name: [] for name in trees}
            for _ in range(args.repeat):
                for name, tree in trees.items():
                    runs[name].append(child(tree, root / "log", partitions, rounds, limit))
            for name, results in runs.items():
                line: dict[str, Any] = {"case": case, "revision": name, "partitions": partitions}
                for key in ("append_us", "read_us"):
                    line[key] = round(statistics.median(r[key] for r in results), 2)
                line["most_open"] = max(r["most_open"] for r in results)
                print(json.dumps(line), flush=True)
        for name, tree in trees.items():
            result = child(tree, root / "log", args.partitions, 0, 1024)
            line = {"case": "partitions", "revision": name, "partitions": args.partitions}
            line |= {k: result[k] for k in ("most_open", "failed")}
            line["seconds"] = round(result["seconds"], 1)
            print(json.dumps(line), flush=True)
    finally:
        shutil.rmtree(root)


if __name__ == "__main__":
    main()
