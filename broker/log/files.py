"""The files a process keeps open for its segments, at most `max_open_files` of them.

A segment holds a file descriptor while it has a write handle (the active segment, between
appends) and while it has a read mapping (CPython's mmap keeps a duplicate of the file's
descriptor for as long as the mapping is open). Without a bound a worker would hold one or two
per partition it serves, and at the usual limit of 1,024 descriptors it would fail at about
1,000 partitions. So every handle is registered here, most recently used last, and when there
are more than `limit` the least recently used is released: a write handle is closed (the next
append opens the file again; what it wrote is fsynced through the new handle by the next flush,
as fsync covers the file, not the descriptor), a mapping is closed (the next read maps the file
again). A mapping that a view still uses (a fetch reply being sent) cannot be closed: it is
kept aside, still holding its descriptor, and closed once no view uses it, which every new
handle registered here checks. Opening again costs an open(2) for a write handle, and an open,
an mmap and a close for a mapping (perf/bench_files.py measures it). One instance per process,
`OPEN_FILES`. Not safe to share between threads.
"""

from __future__ import annotations

import mmap
from collections import OrderedDict
from collections.abc import Callable

DEFAULT_MAX_OPEN_FILES = 256
"""Well under the usual soft limit of 1,024, leaving room for sockets and for mappings that
views keep open."""


class OpenFiles:
    """A least-recently-used set of the open handles of a process's segments."""

    def __init__(self, limit: int = DEFAULT_MAX_OPEN_FILES) -> None:
        self._limit = _checked(limit)
        self._handles: OrderedDict[object, Callable[[], None]] = OrderedDict()
        self._kept: list[mmap.mmap] = []

    @property
    def limit(self) -> int:
        return self._limit

    @limit.setter
    def limit(self, limit: int) -> None:
        self._limit = _checked(limit)
        self._release_over_limit()

    def __len__(self) -> int:
        """The handles open, kept-aside mappings not counted."""
        return len(self._handles)

    @property
    def kept_aside(self) -> int:
        """Mappings released while a view still used them, not yet closed."""
        self._close_kept()
        return len(self._kept)

    def used(self, key: object, release: Callable[[], None]) -> None:
        """The handle `key` was opened or used now; `release` closes it when it is the least
        recently used of more than `limit`."""
        handles = self._handles
        if key in handles:
            handles.move_to_end(key)
            return
        handles[key] = release
        if self._kept:
            self._close_kept()
        self._release_over_limit()

    def closed(self, key: object) -> None:
        """The handle `key` was closed by its owner."""
        self._handles.pop(key, None)

    def close_mapping(self, mapping: mmap.mmap) -> bool:
        """Close `mapping`, or keep it aside while a view still uses it; say if it closed."""
        try:
            mapping.close()
        except BufferError:
            self._kept.append(mapping)
            return False
        return True

    def _close_kept(self) -> None:
        still_used = []
        for mapping in self._kept:
            try:
                mapping.close()  # a no-op for one its segment closed already
            except BufferError:
                still_used.append(mapping)
        self._kept = still_used

    def _release_over_limit(self) -> None:
        handles = self._handles
        while len(handles) > self._limit:
            _, release = handles.popitem(last=False)
            release()


def _checked(limit: int) -> int:
    if limit < 1:
        raise ValueError(f"max_open_files must be at least 1, not {limit}")
    return limit


OPEN_FILES = OpenFiles()
"""This process's open segment files (`log.max_open_files` sets its limit)."""
