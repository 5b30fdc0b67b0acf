"""The sparse index of one segment: where some of its messages start.

Offsets are byte positions, so no index is needed to find a message's bytes. The index answers
the two questions a byte position cannot: is this offset where a message starts, and where is
the last whole message before a fetch's byte limit. It holds the segment-relative position of
one message start every `index.interval.bytes` (and always position 0), so either question is
answered by a bisect and a walk of at most that many bytes of message headers.

File `<base offset, 20 digits>.index`, big-endian:

    0   8      segment_size   u64, the size of the .log file this index describes
    8   4 * n  entries        u32 each, strictly increasing message starts, the first 0

It is written when a segment is closed (rolled, or the log closed cleanly): to a temporary
file, fsynced, then renamed over the old one, and the folder fsynced. While a segment is active
its index lives in memory only. On open, an index whose segment_size differs from the .log
file's size, or whose entries are not strictly increasing and below that size, belongs to a
segment that was not closed cleanly; one that passes those checks is then checked against the
log itself (see broker.log.segment). Either way a failed check means the segment is scanned and
the index rebuilt.
Not safe to share between threads.
"""

from __future__ import annotations

import os
import struct
import sys
from array import array
from bisect import bisect_right
from collections.abc import Iterable
from itertools import pairwise
from pathlib import Path

from broker.log.fsdir import fsync_directory

_SIZE = struct.Struct(">Q")


class OffsetIndex:
    """Sorted segment-relative positions of message starts."""

    def __init__(self, entries: Iterable[int] = ()) -> None:
        self._entries = array("I", entries)

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def last(self) -> int:
        """The last indexed position (0 for an index with no entries)."""
        return self._entries[-1] if self._entries else 0

    def floor(self, position: int) -> int:
        """The greatest indexed message start at or before `position` (0 when there is none)."""
        i = bisect_right(self._entries, position)
        return self._entries[i - 1] if i else 0

    def extend(self, base: int, marks: Iterable[int]) -> None:
        """Add message starts given relative to `base`; they must follow every existing entry."""
        self._entries.extend(base + m for m in marks)

    def truncate_to(self, position: int) -> None:
        """Drop entries at or after `position`."""
        del self._entries[bisect_right(self._entries, position - 1) :]

    def entries(self) -> list[int]:
        return self._entries.tolist()

    def write(self, path: Path, segment_size: int) -> None:
        """Write this index for a segment of `segment_size` bytes: tmp file, fsync, rename,
        fsync of the folder."""
        on_disk = array("I", self._entries)
        if sys.byteorder == "little":
            on_disk.byteswap()
        tmp = path.with_name(path.name + ".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.write(fd, _SIZE.pack(segment_size) + on_disk.tobytes())
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
        fsync_directory(path.parent)

    @staticmethod
    def described_size(path: Path) -> int | None:
        """The segment_size an index file at `path` says it describes, or None when it is
        missing or too short to say."""
        try:
            with open(path, "rb") as f:
                head = f.read(_SIZE.size)
        except FileNotFoundError:
            return None
        return _SIZE.unpack(head)[0] if len(head) == _SIZE.size else None

    @classmethod
    def load(cls, path: Path, segment_size: int) -> OffsetIndex | None:
        """The index stored at `path`, or None when it is missing or does not describe a
        segment of exactly `segment_size` bytes (so the segment must be scanned)."""
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return None
        if len(data) < _SIZE.size or (len(data) - _SIZE.size) % 4:
            return None
        (described,) = _SIZE.unpack_from(data)
        if described != segment_size:
            return None
        entries = array("I")
        entries.frombytes(data[_SIZE.size :])
        if sys.byteorder == "little":
            entries.byteswap()
        if (segment_size > 0 and not entries) or (
            entries
            and (
                entries[0] != 0
                or entries[-1] >= max(segment_size, 1)
                or any(a >= b for a, b in pairwise(entries))
            )
        ):
            return None
        index = cls()
        index._entries = entries
        return index
