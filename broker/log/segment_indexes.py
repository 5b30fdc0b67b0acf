"""A segment's two sparse indexes (broker.log.index, broker.log.timeindex): in memory while
the segment is active or after a scan of it, else read from their files, mapped and checked by
their checksums when first used (broker.log.indexfile). Not safe to share between threads."""

from __future__ import annotations

import os
from pathlib import Path

from broker.log.fsdir import storage_error
from broker.log.index import MappedOffsetIndex, OffsetIndex
from broker.log.timeindex import MappedTimeIndex, TimeIndex


class SegmentIndexes:
    """The offset index (`offsets`) and time index (`times`) of a segment, stored at `path`
    and `time_path`."""

    def __init__(
        self,
        path: Path,
        time_path: Path,
        offsets: OffsetIndex | MappedOffsetIndex,
        times: TimeIndex | MappedTimeIndex,
    ) -> None:
        self.path = path
        self.time_path = time_path
        self.offsets = offsets
        self.times = times

    @property
    def stored(self) -> bool:
        """Whether they are read from their files (a closed segment's), not in memory."""
        return isinstance(self.offsets, MappedOffsetIndex) or isinstance(
            self.times, MappedTimeIndex
        )

    def extend(self, start: int, marks: list[int], greatest: list[int]) -> None:
        """Add the entries of bytes appended at `start` (an active segment's: in memory)."""
        offsets, times = self.offsets, self.times
        assert isinstance(offsets, OffsetIndex) and isinstance(times, TimeIndex)
        times.extend(start, offsets.last, marks, greatest)
        offsets.extend(start, marks)

    def truncate_to(self, size: int) -> None:
        """Drop the entries at or past `size` (in memory: `load` first for stored ones)."""
        offsets, times = self.offsets, self.times
        assert isinstance(offsets, OffsetIndex) and isinstance(times, TimeIndex)
        offsets.truncate_to(size)
        times.truncate_to(size)

    def rebuild(self, marks: list[int], greatest: list[int]) -> None:
        """Replace both by the entries of a scan (broker.log.segment_scan), in memory."""
        self.close()
        self.offsets = OffsetIndex(marks)
        self.times = TimeIndex.build(marks, greatest)

    def rebuild_times(self, marks: list[int], greatest: list[int]) -> None:
        """Replace the time index by the entries of a walk of the headers, in memory."""
        if isinstance(self.times, MappedTimeIndex):
            self.times.close()
        self.times = TimeIndex.build(marks, greatest)

    def store(self, size: int) -> None:
        """Write the in-memory time index, then the in-memory offset index, for a segment of
        `size` bytes (each tmp, fsync, rename, fsync of the folder); from then on both are read
        from their files (a closed segment keeps no index in memory). DiskFull or
        StorageIOError when one cannot be written: both then stay in memory."""
        offsets = self.offsets
        assert isinstance(offsets, OffsetIndex)  # of the active segment, or of a scan
        times = self._write_times(size)
        status = _write(offsets, self.path, size)
        self.offsets = MappedOffsetIndex.written(self.path, size, status)
        self.times = times

    def store_times(self, size: int) -> None:
        """Write the in-memory time index (built by `rebuild_times` beside a stored offset
        index), then read it from its file. DiskFull or StorageIOError when it cannot be
        written: it then stays in memory."""
        self.times = self._write_times(size)

    def _write_times(self, size: int) -> MappedTimeIndex:
        times = self.times
        assert isinstance(times, TimeIndex)
        status = _write(times, self.time_path, size)
        return MappedTimeIndex.written(self.time_path, size, times, status)

    def load(self, size: int) -> bool:
        """Read stored indexes of a segment of `size` bytes into memory, whole and checked, so
        that it can be cut and appended to as the active segment (PartitionLog.truncate_to);
        say whether they were, or whether one is missing or damaged (the segment must then be
        recovered, which rebuilds both). True at once for indexes already in memory. OSError as
        the file system gives it."""
        offsets = self.offsets
        if isinstance(offsets, MappedOffsetIndex):
            loaded, _ = OffsetIndex.load(self.path, size)
            if loaded is None:
                return False
            offsets = loaded
        times = self.times
        if isinstance(times, MappedTimeIndex):
            loaded_times, _ = TimeIndex.load(self.time_path, size)
            if loaded_times is None:
                return False
            times = loaded_times
        self.close()
        self.offsets, self.times = offsets, times
        return True

    def close(self) -> None:
        """Unmap the index files read from their files, if mapped."""
        for index in (self.offsets, self.times):
            if isinstance(index, (MappedOffsetIndex, MappedTimeIndex)):
                index.close()


def _write(index: OffsetIndex | TimeIndex, path: Path, size: int) -> os.stat_result:
    try:
        return index.write(path, size)
    except OSError as error:
        raise storage_error(error, f"writing {path}") from error
