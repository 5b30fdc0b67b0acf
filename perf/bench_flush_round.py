"""A worker's flush round over many partitions: what making N files' new bytes durable costs
by each way the kernel offers, measured here so that the worker's choice follows figures.

    flock /tmp/bench.lock .venv/bin/python perf/bench_flush_round.py \\
        [--files 1,10,100,1000] [--bytes 5000] [--rounds 30] [--dir DIR]

Each round appends --bytes to each of --files files (one partition's segment each, written
through a descriptor kept open, as a worker does), then makes them durable by one of:

- `fdatasync`: fdatasync of each file, one after another (the worker before one round per
  disk);
- `threads-K`: fdatasync of each file from a pool of K threads (K = 4, 16);
- `syncfs`: one syncfs(2) of the file system that holds them (Linux 5.8 and newer report a
  writeback error of any file there since the descriptor's last syncfs);
- `syncfs+check`: syncfs, then the fdatasync of each file that the worker makes only after a
  syncfs that failed, to learn which files it concerns: measured here on success, as an
  upper bound of what attributing an error would cost (each file's data is already clean, so
  each fdatasync only checks its error state and, at most, the file's size).

It prints one JSON line per file count and way: the median, p90 and max milliseconds of a
round, and the ratio of the median to one-by-one fdatasync's. The files live in --dir
(default: a temporary folder under ./data, on the disk the broker's default log dir uses).
Run it alone: the figures are the disk's, and anything else writing to it skews them.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from broker.log.fsdir import syncfs


def _fdatasync_each(fds: list[int]) -> None:
    for fd in fds:
        os.fdatasync(fd)


def _threads(pool: ThreadPoolExecutor) -> Callable[[list[int]], None]:
    def sync(fds: list[int]) -> None:
        for _ in pool.map(os.fdatasync, fds):
            pass

    return sync


def _syncfs(fds: list[int]) -> None:
    syncfs(fds[0])


def _syncfs_and_check(fds: list[int]) -> None:
    syncfs(fds[0])
    _fdatasync_each(fds)


def measure(
    directory: Path, files: int, size: int, rounds: int, sync: Callable[[list[int]], None]
) -> list[float]:
    """Milliseconds of each of `rounds` rounds: write `size` bytes to each file, then `sync`."""
    folder = Path(tempfile.mkdtemp(dir=directory))
    try:
        fds = [
            os.open(folder / f"{i:020d}.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            for i in range(files)
        ]
        payload = os.urandom(size)
        for fd in fds:  # the files exist on the disk before the first round
            os.write(fd, payload)
        syncfs(fds[0])
        times = []
        for _ in range(rounds):
            for fd in fds:
                os.write(fd, payload)
            started = time.perf_counter()
            sync(fds)
            times.append((time.perf_counter() - started) * 1000)
        for fd in fds:
            os.close(fd)
        return times
    finally:
        shutil.rmtree(folder)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--files", default="1,10,100,1000")
    parser.add_argument("--bytes", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--dir", type=Path, default=Path("data"))
    args = parser.parse_args()
    args.dir.mkdir(parents=True, exist_ok=True)
    ctypes.CDLL(None, use_errno=True)  # fail early where libc has no syncfs
    with ThreadPoolExecutor(4) as four, ThreadPoolExecutor(16) as sixteen:
        ways: dict[str, Callable[[list[int]], None]] = {
            "fdatasync": _fdatasync_each,
            "threads-4": _threads(four),
            "threads-16": _threads(sixteen),
            "syncfs": _syncfs,
            "syncfs+check": _syncfs_and_check,
        }
        for files in (int(f) for f in args.files.split(",")):
            base = None
            for name, sync in ways.items():
                times = sorted(measure(args.dir, files, args.bytes, args.rounds, sync))
                median = statistics.median(times)
                base = base or median
                print(
                    json.dumps(
                        {
                            "files": files,
                            "way": name,
                            "median_ms": round(median, 2),
                            "p90_ms": round(times[int(len(times) * 0.9) - 1], 2),
                            "max_ms": round(times[-1], 2),
                            "ratio_to_fdatasync": round(median / base, 3),
                        }
                    ),
                    flush=True,
                )


if __name__ == "__main__":
    main()
