"""What a broker's start costs with 10,000 partitions and a terabyte of logs: opening every
partition log, then the first read and the first OFFSETS by time of each, in the time and the
memory they take, with the code of several git revisions alternating in one run.

    flock /tmp/bench.lock .venv/bin/python -m perf.bench_startup REV [REV ...]
        [--partitions 10000] [--segments 3] [--segment-mib 32] [--repeat 2] [--dir DIR]

The logs are written once, with sparse files, so that a terabyte fits on a small disk: each
partition has `--segments` closed segments of `--segment-mib` MiB (created with truncate(),
their holes read as zeros) and an active one of 8 KiB, as a clean close leaves them. Only what
a start and the reads below touch is real: the first two messages of each segment (4,096
bytes each on disk, so that every message start is a multiple of 4,096 and the index entries,
one every 4,096 bytes as `index_interval_bytes` has it, are all message starts), and every
segment's .index and .timeindex, written whole in the format and with the checksum of
docs/storage.md: one entry every 4 KiB, and one time index entry for every run (each run's
greatest timestamp one more than the last: the largest time index there can be, 12 bytes per
4 KiB). 3 x 32 MiB x 10,000 is 0.98 TiB of logs and 3.9 GB of indexes.

Each REV (as in perf/compare.py, whose `export` and `run_in_tree` this uses: a commit, or "."
for the working tree) then runs, `--repeat` times, in a process of its own under
RLIMIT_NOFILE 1,024 with the default `max_open_files`:

- open: `PartitionLog.open` of every partition (seconds), the bytes the process read with
  read(2) meanwhile (/proc/self/io rchar: what a cold page cache would have to fetch from
  disk first), its anonymous RSS after (RssAnon: the process's own memory), and its peak RSS;
- first read: 4 KiB at the start of every closed segment of every partition (seconds), and
  the same again (second read: with the default max_open_files of 256, every read maps its
  segment, and its index, again);
- lookup: OFFSETS by time of each partition for the second message of its last closed segment
  (passing over the segments before it; seconds), checked against the offset it must find;
- the process's anonymous and peak RSS at the end, and the most descriptors it held.

The page cache is warm (the files were just written, or read by the previous run): the times
are CPU and system-call costs; rchar says what a cold start would read besides. Prints one
JSON line per run and the medians per revision. Run it alone: on 2 cores anything beside it
skews the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import struct
import sys
import tempfile
import time
from array import array
from pathlib import Path
from typing import Any

from xxhash import xxh3_64_intdigest

INTERVAL = 4096
"""Bytes between index entries (LogConfig's default index_interval_bytes), and the size of
every message on disk."""
FIRST_MS = 1_800_000_000_000


def message(timestamp_ms: int) -> bytes:
    """A message of INTERVAL bytes on disk, as broker.log.encode_message builds it."""
    body = struct.pack(">BBqi", 1, 0, timestamp_ms, -1) + b"x" * (INTERVAL - 26)
    return struct.pack(">IQ", len(body) + 8, xxh3_64_intdigest(body)) + body


def big_endian(typecode: str, values: range) -> bytes:
    items = array(typecode, values)
    if sys.byteorder == "little":
        items.byteswap()
    return items.tobytes()


def index_file(path: Path, segment_size: int, body: bytes) -> None:
    """An index file as docs/storage.md lays it out (not fsynced: a benchmark's files)."""
    size = struct.pack(">Q", segment_size)
    path.write_bytes(size + struct.pack(">Q", xxh3_64_intdigest(size + body)) + body)


def segment(folder: Path, base: int, size: int, first_ms: int) -> None:
    """A closed segment of `size` bytes at `base`: its first two messages real, the rest a
    hole, and its two index files whole (run i's greatest timestamp first_ms + i)."""
    path = folder / f"{base:020d}.log"
    with open(path, "wb") as f:
        f.write(message(first_ms) + message(first_ms + 1))
        f.truncate(size)
    runs = size // INTERVAL
    positions = big_endian("I", range(0, size, INTERVAL))
    index_file(path.with_suffix(".index"), size, positions)
    times = big_endian("q", range(first_ms, first_ms + runs))
    index_file(path.with_suffix(".timeindex"), size, times + positions)


def build(root: Path, partitions: int, segments: int, segment_bytes: int) -> None:
    """Write the partitions (see the module docstring), unless a previous run did."""
    done = root / "built.json"
    shape = {"partitions": partitions, "segments": segments, "segment_bytes": segment_bytes}
    if done.exists() and json.loads(done.read_text()) == shape:
        return
    runs = segment_bytes // INTERVAL
    for p in range(partitions):
        folder = root / f"t-{p}"
        folder.mkdir(parents=True, exist_ok=True)
        for s in range(segments + 1):
            size = segment_bytes if s < segments else 2 * INTERVAL
            segment(folder, s * segment_bytes, size, FIRST_MS + s * runs)
    done.write_text(json.dumps(shape))


def memory() -> dict[str, int]:
    """This process's anonymous and peak resident memory, bytes."""
    status = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines())
    return {k: int(status[k].split()[0]) * 1024 for k in ("RssAnon", "VmHWM")}


def bytes_read() -> int:
    io = dict(line.split(": ") for line in Path("/proc/self/io").read_text().splitlines())
    return int(io["rchar"])


def run_one(root: Path, partitions: int, segments: int, segment_bytes: int) -> dict[str, Any]:
    """One run, in this process, with the code found first on sys.path (the tree's)."""
    import resource

    resource.setrlimit(
        resource.RLIMIT_NOFILE, (1024, resource.getrlimit(resource.RLIMIT_NOFILE)[1])
    )
    import broker
    from broker.log import LogConfig, PartitionLog

    config = LogConfig(segment_bytes=segment_bytes, fsync=False, retention_ms=None)
    result: dict[str, Any] = {"before": memory()}
    read_before, started = bytes_read(), time.perf_counter()
    logs = [PartitionLog.open(root / f"t-{p}", config) for p in range(partitions)]
    result["open_s"] = time.perf_counter() - started
    result["open_read_bytes"] = bytes_read() - read_before
    result["after_open"] = memory()
    assert all(len(log.segments) == segments + 1 for log in logs)
    assert not any(log.recovery.problems for log in logs)
    most_open = len(os.listdir("/proc/self/fd"))
    for turn in ("first_read_s", "second_read_s"):
        started = time.perf_counter()
        for log in logs:
            for s in range(segments):
                assert len(log.read(s * segment_bytes, INTERVAL)) == INTERVAL
            most_open = max(most_open, len(os.listdir("/proc/self/fd")))
        result[turn] = time.perf_counter() - started
    last = (segments - 1) * segment_bytes
    wanted_ms = FIRST_MS + (segments - 1) * (segment_bytes // INTERVAL) + 1
    started = time.perf_counter()
    for log in logs:
        assert log.offset_for_timestamp(wanted_ms) == last + INTERVAL
    result["lookup_s"] = time.perf_counter() - started
    result["end"] = memory()
    result["most_open"] = max(most_open, len(os.listdir("/proc/self/fd")))
    for log in logs:
        log.close(flush=False)
    result["code"] = str(Path(broker.__file__).parent.parent)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("revisions", nargs="*")
    parser.add_argument("--partitions", type=int, default=10_000)
    parser.add_argument("--segments", type=int, default=3)
    parser.add_argument("--segment-mib", type=int, default=32)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--dir", type=Path, default=None, help="where to write (default: /tmp)")
    parser.add_argument("--run", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--logs", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    segment_bytes = args.segment_mib << 20
    if args.run:
        print(json.dumps(run_one(args.logs, args.partitions, args.segments, segment_bytes)))
        return
    if not args.revisions:
        parser.error("name at least one revision")
    from perf.compare import export, run_in_tree

    figures: dict[str, list[dict[str, Any]]] = {}
    with tempfile.TemporaryDirectory(prefix="pylog-bench-startup-", dir=args.dir) as work:
        started = time.perf_counter()
        build(Path(work) / "logs", args.partitions, args.segments, segment_bytes)
        logs = args.partitions * args.segments * segment_bytes
        print(json.dumps({"built_s": round(time.perf_counter() - started, 1), "log_bytes": logs}))
        trees = {r: export(r, Path(work) / f"tree{i}") for i, r in enumerate(args.revisions)}
        flags = [f"--partitions={args.partitions}", f"--segments={args.segments}"]
        flags += [f"--segment-mib={args.segment_mib}", f"--logs={Path(work) / 'logs'}"]
        for _ in range(args.repeat):
            for revision, tree in trees.items():
                result = run_in_tree(revision, tree, __file__, flags)
                figures.setdefault(revision, []).append(result)
                print(json.dumps({"revision": revision, **result}), flush=True)
    for revision, runs in figures.items():
        line: dict[str, Any] = {"revision": revision, "runs": len(runs)}
        for key in ("open_s", "first_read_s", "second_read_s", "lookup_s"):
            line[key] = round(statistics.median(r[key] for r in runs), 2)
        line["open_read_MB"] = round(statistics.median(r["open_read_bytes"] for r in runs) / 1e6, 1)
        for when in ("before", "after_open", "end"):
            rss = statistics.median(r[when]["RssAnon"] for r in runs)
            line[f"anon_rss_{when}_MiB"] = round(rss / 2**20, 1)
        line["peak_rss_MiB"] = round(statistics.median(r["end"]["VmHWM"] for r in runs) / 2**20, 1)
        line["most_open"] = max(r["most_open"] for r in runs)
        print(json.dumps(line))


if __name__ == "__main__":
    main()
