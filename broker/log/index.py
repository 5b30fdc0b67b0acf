"""The sparse index of one segment: where some of its messages start.

Offsets are byte positions, so no index is needed to find a message's bytes. The index answers
the two questions a byte position cannot: is this offset where a message starts, and where is
the last whole message before a fetch's byte limit. It holds the segment-relative position of
one message start every `index.interval.bytes` (and always position 0), so either question is
answered by a bisect and a walk of at most that many bytes of message headers.

File `<base offset, 20 digits>.index`, big-endian:

    0   8      segment_size   u64, the size of the .log file this index describes
    8   8      checksum       u64, xxh3_64 of segment_size and the entries (bytes 0-7, 16-)
    16  4 * n  entries        u32 each, strictly increasing message starts, the first 0

It is written when a segment is closed (rolled, or the log closed cleanly): to a temporary
file, fsynced, then renamed over the old one, and the folder fsynced (broker.log.indexfile,
shared with the time index, broker.log.timeindex). While a segment is active its index lives
in memory (`OffsetIndex`); once it is closed, its index is read from its file
(`MappedOffsetIndex`), mapped when used and never loaded. On open, an index that is missing or
whose segment_size differs from the .log file's size belongs to a segment that was not closed
cleanly: the segment is scanned and the index rebuilt. Opening reads the first 8 bytes of the
file and its length, never its entries nor the log: so opening a log costs what its segment
count needs, whatever it holds. The checksum, and that the entries start at 0 within the
segment, are checked when a read first uses the index; one that fails then is damaged, and is
rebuilt from the log by a scan of the segment (broker.log.partition). An index that passes
while the log's bytes changed under it (a flipped length field) is caught by the read whose
walk meets the broken framing (broker.log.partition rescans that segment then); `pylogctl log
verify` walks every index against its log.
Not safe to share between threads.
"""

from __future__ import annotations

import os
from array import array
from bisect import bisect_right
from collections.abc import Iterable
from pathlib import Path

from broker.log.indexfile import (
    HEAD,
    U32,
    IndexFile,
    big_endian,
    from_big_endian,
    read_index_file,
    read_index_head,
    write_index_file,
)

_ENTRY_BYTES = 4


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

    def write(self, path: Path, segment_size: int) -> os.stat_result:
        """Write this index for a segment of `segment_size` bytes (broker.log.indexfile);
        returns the file's status as written."""
        return write_index_file(path, segment_size, big_endian(self._entries))

    @classmethod
    def load(cls, path: Path, segment_size: int) -> tuple[OffsetIndex | None, str | None]:
        """The index stored at `path` for a segment of `segment_size` bytes, read whole and
        checked, or None and why not: no reason when it is missing or describes another size
        (the segment was not closed cleanly), a reason when it describes this size but is
        damaged. Either way without an index the segment must be scanned."""
        body, damaged = read_index_file(path, segment_size, _ENTRY_BYTES)
        if body is None:
            return None, damaged
        index = cls()
        index._entries = from_big_endian("I", body)
        return index, None


class MappedOffsetIndex:
    """A closed segment's index, read from its file (broker.log.indexfile.IndexFile), mapped
    when used: a lookup is a bisect of the file's entries. IndexDamaged from any lookup whose
    use of the file is the first and finds it damaged."""

    def __init__(self, file: IndexFile) -> None:
        self._file = file

    @classmethod
    def open(cls, path: Path, segment_size: int) -> tuple[MappedOffsetIndex | None, str | None]:
        """The index stored at `path` for a segment of `segment_size` bytes, judged by its head
        and length only (broker.log.indexfile.read_index_head), or None and why not, as
        `OffsetIndex.load` says it."""
        fits, damaged = read_index_head(path, segment_size, _ENTRY_BYTES)
        return (cls(IndexFile(path, segment_size, _ENTRY_BYTES)), None) if fits else (None, damaged)

    @classmethod
    def written(cls, path: Path, segment_size: int, status: os.stat_result) -> MappedOffsetIndex:
        """The index this process just wrote at `path` (`OffsetIndex.write` gave `status`)."""
        return cls(IndexFile(path, segment_size, _ENTRY_BYTES, status))

    def __len__(self) -> int:
        return (len(self._file.mapping()) - HEAD.size) // _ENTRY_BYTES

    @property
    def last(self) -> int:
        """The last indexed position (0 for an index with no entries)."""
        m = self._file.mapping()
        return U32.unpack_from(m, len(m) - _ENTRY_BYTES)[0] if len(m) > HEAD.size else 0

    def floor(self, position: int) -> int:
        """The greatest indexed message start at or before `position` (0 when there is none)."""
        m = self._file.mapping()
        unpack = U32.unpack_from
        low, high = 0, (len(m) - HEAD.size) // _ENTRY_BYTES
        while low < high:  # bisect_right of the big-endian entries, as they lie in the file
            middle = (low + high) // 2
            if position < unpack(m, HEAD.size + _ENTRY_BYTES * middle)[0]:
                high = middle
            else:
                low = middle + 1
        return unpack(m, HEAD.size + _ENTRY_BYTES * (low - 1))[0] if low else 0

    def entries(self) -> list[int]:
        return from_big_endian("I", self._file.mapping()[HEAD.size :]).tolist()

    def close(self) -> None:
        """Unmap the file, if mapped (the next use maps it again)."""
        self._file.close()
