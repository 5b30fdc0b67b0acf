"""CPU time and memory of broker processes, read from /proc (Linux only, no dependencies).

The benchmarks charge a broker with the CPU of its whole process tree: pylogd's supervisor and
workers, a RabbitMQ node's beam.smp and its helpers. Take `cpu_seconds` before and after a timed
run and subtract. Every function accepts any mix of roots and descendants: each is expanded to
its live descendants and the set is counted once, so passing `tree_pids(root)` or just `[root]`
gives the same figure.

What it cannot see: a process that ended between two readings takes its CPU with it (its
parent's cutime only grows once the parent reaps it), so a tree whose helpers come and go
during a run is under-counted. The brokers measured here keep theirs for their whole life.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable
from pathlib import Path

__all__ = ["cpu_seconds", "own_cpu_seconds", "rss_bytes", "tree_pids"]

_PROC = Path("/proc")
_TICKS_PER_S = os.sysconf("SC_CLK_TCK")
_PAGE_BYTES = os.sysconf("SC_PAGE_SIZE")


def _stat_fields(pid: int) -> list[str] | None:
    """Fields of /proc/<pid>/stat after the command name (field 3, "state", is index 0)."""
    try:
        text = (_PROC / str(pid) / "stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    # The command name is in parentheses and may itself contain spaces or parentheses.
    return text[text.rindex(")") + 2 :].split()


def _children(pid: int) -> list[int]:
    """Direct children of `pid`, from every thread's children list (Linux 3.5+)."""
    children: list[int] = []
    try:
        tasks = list((_PROC / str(pid) / "task").iterdir())
    except (FileNotFoundError, ProcessLookupError):
        return children
    for task in tasks:
        try:
            children += [int(c) for c in (task / "children").read_text().split()]
        except (FileNotFoundError, ProcessLookupError):
            continue
    return children


def tree_pids(pid: int) -> list[int]:
    """`pid` and all its live descendants, parents before children; [] if `pid` is gone."""
    if _stat_fields(pid) is None:
        return []
    seen = [pid]
    index = 0
    while index < len(seen) and len(seen) < 10_000:  # bounded: a fork bomb is not a broker
        for child in _children(seen[index]):
            if child not in seen:
                seen.append(child)
        index += 1
    return seen


def _expand(pids: Iterable[int]) -> list[int]:
    everything: dict[int, None] = {}
    for pid in pids:
        everything.update(dict.fromkeys(tree_pids(pid)))
    return list(everything)


def cpu_seconds(pids: Iterable[int]) -> float:
    """User + system CPU seconds used so far by these processes and their live descendants.

    Threads are included (a process's utime/stime cover all its threads); processes that no
    longer exist count nothing."""
    return _cpu_of(_expand(pids))


def own_cpu_seconds(pids: Iterable[int]) -> float:
    """User + system CPU seconds used so far by exactly these processes (their threads
    included, their descendants not: a broker's tree without the private ZooKeeper it
    started, say)."""
    return _cpu_of(dict.fromkeys(pids))


def _cpu_of(pids: Iterable[int]) -> float:
    ticks = 0
    for pid in pids:
        fields = _stat_fields(pid)
        if fields is not None:
            ticks += int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15)
    return ticks / _TICKS_PER_S


def rss_bytes(pids: Iterable[int]) -> int:
    """Resident memory now of these processes and their live descendants, added up.

    Pages shared between them (code, shared memory) are counted once per process."""
    pages = 0
    for pid in _expand(pids):
        fields = _stat_fields(pid)
        if fields is not None:
            pages += int(fields[21])  # rss in pages (field 24)
    return pages * _PAGE_BYTES


def anonymous_rss_bytes(pids: Iterable[int]) -> int:
    """The part of `rss_bytes` that is the processes' own memory (RssAnon in
    /proc/<pid>/status): heap and stacks, not pages of mapped files. A broker that reads
    segments through mmap shows the page cache it touches in its RSS; this leaves it out."""
    total = 0
    for pid in _expand(pids):
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("RssAnon:"):
                    total += int(line.split()[1]) * 1024
    return total
