"""The time index of one segment: where to start looking for a timestamp.

Timestamps are the producers' and need not grow with offsets, so the index holds, as Kafka's
`.timeindex` does, the greatest timestamp seen so far rather than the timestamp of a message.
The messages of a segment fall into runs, each starting at an entry of the sparse offset index
(one every `index.interval.bytes`, broker.log.index). Entry (T, P) says: the greatest timestamp
of every message of the segment before the end of the run that starts at position P is T. An
entry is kept only where that greatest timestamp grows, so T and P both strictly increase, and
a segment whose producers' clocks move forward at 1 ms holds at most one entry a millisecond.

The first message at or after time t (in offset order, exactly what a walk of every message
would find) lies in the run of the first entry with T >= t: every message before P is older
than t (the entry before it says so), and some message of that run is not. So a lookup is a
bisect of the T column and a walk of the headers of one run (about `index.interval.bytes`,
plus one message). No entry with T >= t: no message of the segment is at or after t. The last
T is the segment's greatest timestamp, which lets a lookup pass over whole segments.

File `<base offset, 20 digits>.timeindex`, big-endian, with the header and write discipline
of broker.log.indexfile (segment_size u64, checksum u64: xxh3_64 of segment_size and the body):

    16         8 * n  timestamps   i64 each, strictly increasing: the T column
    16 + 8n    4 * n  positions    u32 each, strictly increasing, the first 0: the P column

n is (file size - 16) / 12. It is written with the offset index when a segment is closed (the
time index first: the offset index is the mark of a clean close), kept in memory for the
active segment (`TimeIndex`), read from its file once the segment is closed (`MappedTimeIndex`:
mapped when used, never loaded, its checksum checked on first use as the offset index's is),
and rebuilt with the offset index when recovery scans a segment. A closed segment whose offset
index is trusted but whose time index is missing (written before time indexes existed) or
written for another size gets one by a walk of its message headers when the log is opened
(broker.log.partition), once: the file is then stored. One damaged (found on first use) gets
one the same way then.
Not safe to share between threads.
"""

from __future__ import annotations

import os
import struct
from array import array
from bisect import bisect_left
from collections.abc import Sequence
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
from broker.log.message import NO_TIMESTAMP

_ENTRY_BYTES = 12
_I64 = struct.Struct(">q")


class TimeIndex:
    """Entries (greatest timestamp so far, position of the run it ends), both increasing."""

    def __init__(self) -> None:
        self._times = array("q")
        self._positions = array("I")

    def __len__(self) -> int:
        return len(self._times)

    @property
    def greatest(self) -> int:
        """The greatest timestamp in the segment (NO_TIMESTAMP when it holds no message)."""
        return self._times[-1] if self._times else NO_TIMESTAMP

    def entries(self) -> list[tuple[int, int]]:
        return list(zip(self._times, self._positions, strict=True))

    @classmethod
    def build(cls, marks: Sequence[int], greatest: Sequence[int]) -> TimeIndex:
        """The time index of a segment from the marks and run maxima of a scan of it
        (broker.log.message.ScanResult)."""
        index = cls()
        index.extend(0, 0, marks, greatest)
        return index

    def extend(
        self, base: int, open_run: int, marks: Sequence[int], greatest: Sequence[int]
    ) -> None:
        """Add what a scan of messages appended at segment position `base` found: `marks`,
        relative to `base`, start runs, and `greatest` holds the greatest timestamp of each run
        (ScanResult.greatest: first the messages before the first mark, which continue the
        run that starts at `open_run`)."""
        times, positions = self._times, self._positions
        if times:
            top = times[-1]
            if greatest[0] > top:
                top = greatest[0]
                if positions[-1] == open_run:
                    times[-1] = top
                else:
                    times.append(top)
                    positions.append(open_run)
        else:
            top = NO_TIMESTAMP
        if not marks:  # most appends: no run starts in them
            return
        for i, mark in enumerate(marks, 1):
            if greatest[i] > top or not times:
                top = greatest[i]
                times.append(top)
                positions.append(base + mark)

    def start_for(self, timestamp_ms: int) -> int | None:
        """Where the first message at or after `timestamp_ms` is to be looked for: the start
        of the run of the first entry whose greatest timestamp is at or after it; None when no
        message of the segment is."""
        i = bisect_left(self._times, timestamp_ms)
        return self._positions[i] if i < len(self._times) else None

    def truncate_to(self, position: int) -> None:
        """Drop the entries of runs starting at or after `position` (a cut of the segment
        there). The last entry kept may then count a timestamp of a message cut off: a lookup
        that starts in its run walks on to the end of the segment, and finds the same."""
        i = bisect_left(self._positions, position)
        del self._times[i:]
        del self._positions[i:]

    def write(self, path: Path, segment_size: int) -> os.stat_result:
        """Write this index for a segment of `segment_size` bytes (broker.log.indexfile);
        returns the file's status as written."""
        body = big_endian(self._times) + big_endian(self._positions)
        return write_index_file(path, segment_size, body)

    @classmethod
    def load(cls, path: Path, segment_size: int) -> tuple[TimeIndex | None, str | None]:
        """The time index stored at `path` for a segment of `segment_size` bytes, read whole
        and checked, or None and why not, as OffsetIndex.load says it."""
        body, damaged = read_index_file(path, segment_size, _ENTRY_BYTES)
        if body is None:
            return None, damaged
        n = len(body) // _ENTRY_BYTES
        index = cls()
        index._times = from_big_endian("q", body[: 8 * n])
        index._positions = from_big_endian("I", body[8 * n :])
        return index, None


class MappedTimeIndex:
    """A closed segment's time index, read from its file (broker.log.indexfile.IndexFile),
    mapped when used: a lookup is a bisect of the file's T column. Its greatest timestamp is
    kept once read, so that lookups pass over the segment without mapping it again.
    IndexDamaged from any use of the file that is the first and finds it damaged."""

    def __init__(self, file: IndexFile, greatest: int | None = None) -> None:
        self._file = file
        self._greatest = greatest

    @classmethod
    def open(cls, path: Path, segment_size: int) -> tuple[MappedTimeIndex | None, str | None]:
        """The time index stored at `path` for a segment of `segment_size` bytes, judged by its
        head and length only, or None and why not, as MappedOffsetIndex.open says it."""
        fits, damaged = read_index_head(path, segment_size, _ENTRY_BYTES)
        return (cls(IndexFile(path, segment_size, _ENTRY_BYTES)), None) if fits else (None, damaged)

    @classmethod
    def written(
        cls, path: Path, segment_size: int, index: TimeIndex, status: os.stat_result
    ) -> MappedTimeIndex:
        """`index`, which this process just wrote at `path` (`TimeIndex.write` gave `status`)."""
        return cls(IndexFile(path, segment_size, _ENTRY_BYTES, status), index.greatest)

    @property
    def greatest(self) -> int:
        """The greatest timestamp in the segment (NO_TIMESTAMP when it holds no message)."""
        if self._greatest is None:
            m = self._file.mapping()
            n = (len(m) - HEAD.size) // _ENTRY_BYTES
            self._greatest = _I64.unpack_from(m, HEAD.size + 8 * (n - 1))[0] if n else NO_TIMESTAMP
        return self._greatest

    def start_for(self, timestamp_ms: int) -> int | None:
        """As TimeIndex.start_for: the start of the run of the first entry whose greatest
        timestamp is at or after `timestamp_ms`; None when no message of the segment is."""
        m = self._file.mapping()
        unpack = _I64.unpack_from
        n = (len(m) - HEAD.size) // _ENTRY_BYTES
        low, high = 0, n
        while low < high:  # bisect_left of the big-endian T column, as it lies in the file
            middle = (low + high) // 2
            if unpack(m, HEAD.size + 8 * middle)[0] < timestamp_ms:
                low = middle + 1
            else:
                high = middle
        return U32.unpack_from(m, HEAD.size + 8 * n + 4 * low)[0] if low < n else None

    def close(self) -> None:
        """Unmap the file, if mapped (the next use maps it again)."""
        self._file.close()
