"""What a restart costs a partition log: opening it, and reading it back the first time.

    .venv/bin/python perf/bench_open.py [--messages N] [--repeat R] [--dir DIR]

Writes N messages of 100 bytes into segments of 8 MiB and closes the log cleanly, then, --repeat
times: opens it (timed), reads it from the log start to the high watermark in fetches of 1 MiB
(timed: the first read after the open), and reads it again (timed). Prints the best of each as
one JSON line. The page cache is warm throughout: these are CPU costs, to which a cold cache
adds reading whatever the step touches. To compare two revisions in one run, run the script
from this tree with PYTHONPATH set to a worktree of the other (git worktree add). Run it alone.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from pathlib import Path

from broker.log import LogConfig, PartitionLog, encode_message

CONFIG = LogConfig(segment_bytes=8 << 20, flush_messages=1 << 30, fsync=False)


def write_log(directory: Path, messages: int) -> None:
    log = PartitionLog.open(directory, CONFIG)
    batch = encode_message(b"x" * 74) * 1000  # 100 bytes a message on disk
    for _ in range(messages // 1000):
        log.append(batch)
    log.close()
    PartitionLog.open(directory, CONFIG).close()  # indexes as this revision writes them


def read_all(log: PartitionLog) -> float:
    started = time.perf_counter()
    offset = log.log_start_offset
    while offset < log.flushed_offset:
        offset += len(log.read(offset, 1 << 20))
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--dir", type=Path, default=None, help="where to write (default: /tmp)")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="pylog-bench-open-", dir=args.dir))
    try:
        write_log(root / "t-0", args.messages)
        opens, first_reads, second_reads = [], [], []
        for _ in range(args.repeat):
            started = time.perf_counter()
            log = PartitionLog.open(root / "t-0", CONFIG)
            opens.append(time.perf_counter() - started)
            first_reads.append(read_all(log))
            second_reads.append(read_all(log))
            segments = len(log.segments)
            log.close()
    finally:
        shutil.rmtree(root)
    figures = {
        "messages": args.messages,
        "segments": segments,
        "open_ms": round(min(opens) * 1000, 1),
        "first_read_ms": round(min(first_reads) * 1000, 1),
        "second_read_ms": round(min(second_reads) * 1000, 1),
    }
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
