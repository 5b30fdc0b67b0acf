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
shared with the time index, broker.log.timeindex). While a segment is active
its index lives in memory only. On open, an index that is missing or whose segment_size differs from
the .log file's size belongs to a segment that was not closed cleanly; one that describes the
file's size but fails its checksum, or whose entries do not start at 0 within that size, is
damaged. Either way the segment is scanned and the index rebuilt. Loading reads
the index file only (about 0.1% of its segment's size), never the log: so opening a log costs
the same whatever it holds. An index that passes while the log's bytes changed under it (a
flipped length field) is caught by the read whose walk meets the broken framing
(broker.log.partition rescans that segment then); `pylogctl log verify` walks every index
against its log.
Not safe to share between threads.
"""

from __future__ import annotations

from array import array
from bisect import bisect_right
from collections.abc import Iterable
from pathlib import Path

from broker.log.indexfile import big_endian, from_big_endian, read_index_file, write_index_file

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

    def write(self, path: Path, segment_size: int) -> None:
        """Write this index for a segment of `segment_size` bytes (broker.log.indexfile)."""
        write_index_file(path, segment_size, big_endian(self._entries))

    @classmethod
    def load(cls, path: Path, segment_size: int) -> tuple[OffsetIndex | None, str | None]:
        """The index stored at `path` for a segment of `segment_size` bytes, or None and why
        not: no reason when it is missing or describes another size (the segment was not
        closed cleanly), a reason when it describes this size but is damaged. Either way
        without an index the segment must be scanned."""
        body, damaged = read_index_file(path, segment_size, _ENTRY_BYTES)
        if body is None:
            return None, damaged
        entries = from_big_endian("I", body)
        # the checksum vouches for the order this process wrote them in; these two checks
        # cost nothing and catch an index written for other bytes
        if (segment_size > 0 and not entries) or (
            entries and (entries[0] != 0 or entries[-1] >= max(segment_size, 1))
        ):
            return None, "its entries do not start at 0 within the segment"
        index = cls()
        index._entries = entries
        return index, None
