"""One segment: a file of whole messages, and its sparse index.

File `<base offset, 20 digits>.log` in the partition folder holds messages back to back (the
format of broker.log.message), exactly as producers' sets arrived; `base offset` is the
partition offset of its first byte, so the message at file position p has offset base + p. The
20-digit names make `ls` list segments in offset order.

Writes go straight to the file with os.write (no buffer of our own), so a failed write is seen
at once and undone by truncating back; whether they are fsynced is the caller's choice (flush).
Reads are memoryviews of a read-only mmap, served from the OS page cache. A view stays valid
after the segment is deleted (the mapping keeps the unlinked file's pages), and a segment whose
mapping still has views is reported as in use and not deleted.

After a crash the file may end in a cut-short or garbled message, and bytes written but never
fsynced may be lost or zeroed: `scan_valid` finds the longest valid prefix and `truncate_to`
cuts the rest.
Not safe to share between threads.
"""

from __future__ import annotations

import contextlib
import errno
import mmap
import os
from pathlib import Path

from broker.errors import CorruptSegment, DiskFull, FetchSizeTooSmall, InvalidOffset, StorageIOError
from broker.log.index import OffsetIndex
from broker.log.message import (
    MIN_LENGTH,
    Buffer,
    ScanResult,
    message_size_at,
    scan,
    timestamp_at,
)

LOG_SUFFIX = ".log"
INDEX_SUFFIX = ".index"
_FULL_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG}


def segment_file_name(base_offset: int) -> str:
    return f"{base_offset:020d}{LOG_SUFFIX}"


def storage_error(error: OSError, what: str) -> DiskFull | StorageIOError:
    """The StorageError for an OSError met while doing `what`."""
    if error.errno in _FULL_ERRNOS:
        return DiskFull(f"{what}: {error.strerror or error}")
    return StorageIOError(f"{what}: {error}")


class Segment:
    """A segment file with its size, its in-memory index and, while active, a write handle."""

    def __init__(self, log_path: Path, base_offset: int, size: int, index: OffsetIndex) -> None:
        self.log_path = log_path
        self.index_path = log_path.with_suffix(INDEX_SUFFIX)
        self.base_offset = base_offset
        self.size = size
        self.index = index
        self._write_fd: int | None = None
        self._map: mmap.mmap | None = None
        self._retired_maps: list[mmap.mmap] = []

    def __repr__(self) -> str:
        return f"Segment({self.log_path.name}, size={self.size})"

    @property
    def end_offset(self) -> int:
        return self.base_offset + self.size

    @classmethod
    def create(cls, directory: Path, base_offset: int) -> Segment:
        """A new empty segment file; it is an error for it to exist already."""
        path = directory / segment_file_name(base_offset)
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
        return cls(path, base_offset, 0, OffsetIndex([]))

    @classmethod
    def open_existing(cls, log_path: Path, base_offset: int) -> tuple[Segment, bool]:
        """Open a segment file; the flag says whether its stored index matched (a clean close)."""
        size = log_path.stat().st_size
        index = OffsetIndex.load(log_path.with_suffix(INDEX_SUFFIX), size)
        return cls(log_path, base_offset, size, index or OffsetIndex()), index is not None

    # -- writing ---------------------------------------------------------------------------

    def append(self, data: Buffer, marks: list[int]) -> None:
        """Write `data` (validated whole messages) at the end; `marks` are index entries
        relative to its start. On any error the file is truncated back and nothing changes."""
        if self._write_fd is None:
            self._write_fd = os.open(self.log_path, os.O_WRONLY | os.O_APPEND)
        fd = self._write_fd
        start = self.size
        try:
            written = os.write(fd, data)
            while written < len(data):
                written += os.write(fd, memoryview(data)[written:])
        except OSError as error:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, start)
            raise storage_error(error, f"append to {self.log_path}") from error
        self.size = start + len(data)
        self.index.extend(start, marks)

    def sync(self) -> None:
        """fsync what was written."""
        if self._write_fd is not None:
            try:
                os.fsync(self._write_fd)
            except OSError as error:
                raise storage_error(error, f"fsync of {self.log_path}") from error

    def seal(self, fsync: bool) -> None:
        """Stop writing: optionally fsync, then store the index, which marks a clean close."""
        if fsync:
            self.sync()
        if self._write_fd is not None:
            os.close(self._write_fd)
            self._write_fd = None
        try:
            self.index.write(self.index_path, self.size)
        except OSError as error:
            raise storage_error(error, f"writing {self.index_path}") from error

    def truncate_to(self, size: int) -> None:
        """Cut the file to `size` bytes, which must be a message boundary."""
        os.truncate(self.log_path, size)
        self.size = size
        self.index.truncate_to(size)
        self._retire_map()

    # -- recovery --------------------------------------------------------------------------

    def scan_valid(self, max_message_bytes: int, index_interval: int) -> ScanResult:
        """Check every message's framing and checksum and rebuild the index from the valid
        prefix; the caller decides what to do with anything after it (see PartitionLog.open)."""
        if self.size == 0:
            self.index = OffsetIndex([])
            return ScanResult(0, 0, [], None)
        with (
            open(self.log_path, "rb") as f,
            mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m,
            memoryview(m) as data,
        ):
            result = scan(data, max_message_bytes, index_interval)
        self.index = OffsetIndex(result.marks)
        return result

    # -- reading ---------------------------------------------------------------------------

    def view(self, start: int, end: int) -> memoryview:
        """Bytes [start, end) of the segment, written bytes only, without copying."""
        if end <= start:
            return memoryview(b"")
        if self._map is None or len(self._map) < end:
            self._retire_map()
            with open(self.log_path, "rb") as f:
                self._map = mmap.mmap(f.fileno(), self.size, access=mmap.ACCESS_READ)
        return memoryview(self._map)[start:end]

    def message_bounds(self, position: int, limit: int) -> tuple[int, int]:
        """The message containing `position`, as (its start, the next message's start), found by
        walking headers from the nearest indexed start; `limit` is where written data ends."""
        start = self.index.floor(position)
        window = self.view(0, limit)
        while True:
            following = self._next_start(window, start, limit)
            if following > position:
                return start, following
            start = following

    def check_boundary(self, position: int, limit: int) -> None:
        """Raise InvalidOffset unless `position` (< limit) is where a message starts."""
        start, following = self.message_bounds(position, limit)
        if start != position:
            raise InvalidOffset(
                self.base_offset + position, self.base_offset + start, self.base_offset + following
            )

    def read(self, position: int, max_bytes: int, limit: int) -> memoryview:
        """Whole messages from message start `position`, at most `max_bytes` of them, none
        past `limit` (the readable end). FetchSizeTooSmall when the first one does not fit."""
        if position >= limit:
            return memoryview(b"")
        window_end = min(limit, position + max_bytes)
        # An indexed start at window_end itself (say, the first unflushed message, right at
        # the high watermark) means everything before it is whole messages: nothing to walk.
        end = max(self.index.floor(window_end), position)
        window = self.view(0, limit)
        while end < window_end:
            following = self._next_start(window, end, limit)
            if following > window_end:
                break
            end = following
        if end == position:
            needed = message_size_at(window, position)
            raise FetchSizeTooSmall(self.base_offset + position, max_bytes, needed)
        return window[position:end]

    def first_at_or_after(self, timestamp_ms: int, limit: int) -> int | None:
        """The position of the first message before `limit` whose timestamp is at or after
        `timestamp_ms`, or None."""
        window = self.view(0, limit)
        position = 0
        while position < limit:
            following = self._next_start(window, position, limit)
            if timestamp_at(window, position) >= timestamp_ms:
                return position
            position = following
        return None

    def _next_start(self, window: memoryview, start: int, limit: int) -> int:
        if start + MIN_LENGTH + 4 > limit:
            raise CorruptSegment(str(self.log_path), start, "message header runs past the data")
        following = start + message_size_at(window, start)
        if following - start < MIN_LENGTH + 4 or following > limit:
            raise CorruptSegment(
                str(self.log_path), start, f"message length {following - start} breaks framing"
            )
        return following

    # -- lifetime --------------------------------------------------------------------------

    def in_use(self) -> bool:
        """Whether a view returned by `view` or `read` is still held somewhere."""
        self._retire_map()
        return bool(self._retired_maps)

    def _retire_map(self) -> None:
        if self._map is not None:
            self._retired_maps.append(self._map)
            self._map = None
        still_exported = []
        for m in self._retired_maps:
            try:
                m.close()
            except BufferError:
                still_exported.append(m)
        self._retired_maps = still_exported

    def close(self) -> None:
        """Release the write handle and any mapping no view still uses."""
        if self._write_fd is not None:
            os.close(self._write_fd)
            self._write_fd = None
        self._retire_map()

    def delete(self) -> None:
        """Close and remove the segment and its index from disk."""
        self.close()
        self.log_path.unlink()
        self.index_path.unlink(missing_ok=True)
