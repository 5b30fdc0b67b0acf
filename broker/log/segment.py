"""One segment: a file of whole messages, and its sparse index.

File `<base offset, 20 digits>.log` in the partition folder holds messages back to back (the
format of broker.log.message), exactly as producers' sets arrived; `base offset` is the
partition offset of its first byte, so the message at file position p has offset base + p. The
20-digit names make `ls` list segments in offset order.

Writes go straight to the file with os.write (no buffer of our own), so a failed write is seen
at once and undone by truncating back; whether they are fsynced is the caller's choice (flush).
Reads are memoryviews of a read-only mmap, served from the OS page cache. A view stays valid
after the segment is deleted (the mapping keeps the unlinked file's pages), and a segment whose
mapping still has views is reported as in use and not deleted. The write handle and the
mapping are registered in the process's OPEN_FILES (broker.log.files), which closes the least
recently used when too many are open; they are opened again when next needed.

After a crash, or when a disk goes bad, stored bytes may fail their checks: `scan_segment`
(run by `Segment.recover`) keeps every valid message, notes each damaged range (reads of it
raise CorruptSegment naming it, so that readers can skip it), and finds a torn tail, which
only the newest segment's recovery cuts, moving the bytes to a `*.bad` file (`cut_tail`).
A closed segment's stored indexes are not read into memory: opening reads their heads, and they
are mapped, and checked by their checksums, when first used (IndexDamaged when that fails:
the partition then rebuilds them from the log; broker.log.indexfile). Its log is not read on
open either: reads of such a segment walk every message header they serve, and one whose walk
meets broken framing raises FramingBroken (the partition then scans the segment again);
`pylogctl log verify` walks every index against its log (`index_disagreement`). The folder is
fsynced after a file in it is created, renamed or deleted. Not safe to share between threads.
"""

from __future__ import annotations

import contextlib
import errno
import mmap
import os
import re
import shutil
import struct
from bisect import bisect_left
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import NamedTuple

from broker.errors import CorruptSegment, DiskFull, FetchSizeTooSmall, InvalidOffset, StorageIOError
from broker.log.codec import scan
from broker.log.files import OPEN_FILES
from broker.log.fsdir import fsync_directory, fsync_file
from broker.log.index import MappedOffsetIndex, OffsetIndex
from broker.log.message import (
    ATTRIBUTES_AT,
    CHECKSUM_START,
    HEADER_SIZE,
    LENGTH_SIZE,
    MAGIC,
    MAGIC_AT,
    MAX_FORMAT_MESSAGE_BYTES,
    MIN_LENGTH,
    NO_TIMESTAMP,
    SET_CODECS,
    Buffer,
    message_size_at,
    timestamp_at,
    valid_message_end,
)
from broker.log.timeindex import MappedTimeIndex, TimeIndex

LOG_SUFFIX = ".log"
INDEX_SUFFIX = ".index"
TIME_INDEX_SUFFIX = ".timeindex"
PRODUCERS_SUFFIX = ".producers"
"""A segment's idempotent producer entries (broker.log.producers)."""
_FULL_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG}


_LENGTH = struct.Struct(">I")
_LENGTH_AND_TIMESTAMP = struct.Struct(">I10xq")
_STORED_HEADS = re.compile(b"\\x01[" + re.escape(bytes([0, *sorted(SET_CODECS)])) + b"]|\\x02\\x00")
"""What a message has at byte CHECKSUM_START: magic 1, and attributes 0 or a compressed
set's codec; or magic 2 and attributes 0."""
_RESYNC_CHUNK = 1 << 20
_COPY_CHUNK = 1 << 20


def segment_file_name(base_offset: int) -> str:
    return f"{base_offset:020d}{LOG_SUFFIX}"


def bad_file_path(path: Path) -> Path:
    """Where bytes of `path` that cannot be trusted are kept: `<name>.bad`, or `<name>.N.bad`
    (N = 1, 2, ...) when that exists: never over another file."""
    target = path.with_name(path.name + ".bad")
    n = 1
    while target.exists():
        target = path.with_name(f"{path.name}.{n}.bad")
        n += 1
    return target


class FramingBroken(CorruptSegment):
    """A read met framing that breaks where no damage was known (the file changed after it was
    opened): the partition log scans the segment again (PartitionLog). [start, end) runs to
    the end of the readable data, a message boundary."""


class Damage(NamedTuple):
    """Bytes [start, end) of a segment that fail the checks, kept in place, and why."""

    start: int
    end: int
    reason: str


class SegmentScan(NamedTuple):
    """What `scan_segment` found. `end` is where the bytes to keep end: the size, or the start
    of a torn tail, whose problem is `tail_error` (None when there is none). `marks` are the
    index entries, `damage` the damaged ranges before `end`, `greatest` the greatest timestamp
    of the valid messages of each run between marks (broker.log.message.ScanResult)."""

    end: int
    marks: list[int]
    damage: list[Damage]
    tail_error: str | None
    greatest: list[int]


def scan_segment(data: Buffer, index_interval: int) -> SegmentScan:
    """Check the framing and checksum of every message of a segment's bytes, judged by the
    format's own limits (never by max_message_bytes, a setting that may have changed).

    Where a message fails, its damage ends where the next valid message starts: where its
    length field leads, when that is the end or a valid message, else the first position
    further on where a message passes every check. Damage that no valid message follows is a
    torn tail. Index marks fall every `index_interval` bytes and on the first message after
    each damaged range."""
    size = len(data)
    marks: list[int] = []
    damage: list[Damage] = []
    greatest = [NO_TIMESTAMP]
    pos = next_mark = 0
    while pos < size:
        result = scan(data[pos:], MAX_FORMAT_MESSAGE_BYTES, index_interval, next_mark - pos)
        if result.marks:
            marks.extend(pos + m for m in result.marks)
            next_mark = marks[-1] + index_interval
        greatest[-1] = max(greatest[-1], result.greatest[0])
        greatest += result.greatest[1:]
        pos += result.valid_bytes
        if result.error is None:
            break
        resume = _resume_point(data, pos)
        if resume is None:
            return SegmentScan(pos, marks, damage, result.error, greatest)
        damage.append(Damage(pos, resume, result.error))
        pos = next_mark = resume
    return SegmentScan(size, marks, damage, None, greatest)


def walk_timestamps(data: Buffer, index_interval: int) -> tuple[list[int], list[int]] | None:
    """The marks (one every `index_interval` bytes, as `scan` chooses them) and the greatest
    timestamp of each run between them (ScanResult.greatest) of segment bytes `data`, from
    their message headers alone (no checksums); None when the length fields do not lead from
    byte 0 exactly to the end. About 0.35 s per million messages."""
    size = len(data)
    unpack = _LENGTH_AND_TIMESTAMP.unpack_from
    marks: list[int] = []
    greatest: list[int] = []
    top = NO_TIMESTAMP
    pos = next_mark = 0
    while pos < size:
        if pos + HEADER_SIZE > size:
            return None
        length, timestamp = unpack(data, pos)
        following = pos + LENGTH_SIZE + length
        if following - pos < HEADER_SIZE or following > size:
            return None
        if pos >= next_mark:
            marks.append(pos)
            next_mark = pos + index_interval
            greatest.append(top)
            top = timestamp
        elif timestamp > top:
            top = timestamp
        pos = following
    greatest.append(top)
    return marks, greatest


def _resume_point(data: Buffer, pos: int) -> int | None:
    """Where a valid message (or the end) follows the bad message at `pos`, or None."""
    size = len(data)
    if size - pos >= HEADER_SIZE:
        following = pos + message_size_at(data, pos)
        if pos + HEADER_SIZE <= following <= size and (
            following == size or valid_message_end(data, following) is not None
        ):
            return following
    # Search for the magic and attributes of a message (_STORED_HEADS) at CHECKSUM_START, then
    # make the full checks there, copying _RESYNC_CHUNK bytes at a time.
    begin = pos + 1
    while begin < size:
        stop = min(size, begin + _RESYNC_CHUNK)
        window = bytes(data[begin + CHECKSUM_START : stop + CHECKSUM_START + 1])
        for hit in _STORED_HEADS.finditer(window, 0, stop - begin + 1):
            if hit.start() >= stop - begin:
                break
            if valid_message_end(data, begin + hit.start()) is not None:
                return begin + hit.start()
        begin = stop
    return None


def index_disagreement(data: Buffer, entries: Sequence[int]) -> tuple[int, str] | None:
    """Where and why index `entries` do not fit the framing of segment bytes `data`, or None
    when the length fields lead from byte 0 exactly to the end through every entry. Walks
    every message header (no checksums): about 0.25 s per million messages, plus reading the
    file when it is not in the page cache."""
    size = len(data)
    length_at = _LENGTH.unpack_from
    pending = iter(entries)
    target = next(pending, size)
    pos = 0
    while pos < size:
        if pos >= target:
            if pos > target:
                return target, f"entry {target} is not where a message starts"
            target = next(pending, size)
        if pos + HEADER_SIZE > size:
            return pos, f"the message at byte {pos} is cut short by the end of the file"
        following = pos + LENGTH_SIZE + length_at(data, pos)[0]
        if following - pos < HEADER_SIZE or following > size:
            return pos, f"the length field of the message at byte {pos} breaks the framing"
        pos = following
    if target < size:
        return target, f"entry {target} is not where a message starts"
    return None


@contextlib.contextmanager
def _mapped(path: Path) -> Iterator[memoryview]:
    """A non-empty file, read-only and without copying, for the time of a scan."""
    with (
        open(path, "rb") as f,
        mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m,
        memoryview(m) as data,
    ):
        yield data


def storage_error(error: OSError, what: str) -> DiskFull | StorageIOError:
    """The StorageError for an OSError met while doing `what`."""
    if error.errno in _FULL_ERRNOS:
        return DiskFull(f"{what}: {error.strerror or error}")
    return StorageIOError(f"{what}: {error}")


class Segment:
    """A segment file with its size, its indexes (in memory while it is active or after a scan,
    else read from their files) and, while active, a write handle."""

    def __init__(
        self,
        log_path: Path,
        base_offset: int,
        size: int,
        index: OffsetIndex | MappedOffsetIndex,
        times: TimeIndex | MappedTimeIndex,
    ) -> None:
        self.log_path = log_path
        self.index_path = log_path.with_suffix(INDEX_SUFFIX)
        self.time_index_path = log_path.with_suffix(TIME_INDEX_SUFFIX)
        self.base_offset = base_offset
        self.size = size
        self.index = index
        self.time_index = times
        self._write_fd: int | None = None
        self._unsynced = False
        """Whether bytes were written since the last `sync` (the handle may be closed since)."""
        self._write_key = (self, "write")
        self._map_key = (self, "map")
        """Keys of the handles in OPEN_FILES (broker.log.files), which may release them."""
        self._map: mmap.mmap | None = None
        self.damage: list[Damage] = []
        """Damaged ranges found by `recover`, sorted; reads of them raise CorruptSegment."""
        self.framing_checked = True
        """Whether this process has checked the framing of every message (it wrote them, or
        `recover` scanned them); a segment opened on a trusted index has not, so its reads walk
        the headers they serve past `_checked_to`."""
        self._checked_to = 0
        """Without framing_checked: the end of the headers walked so far, from byte 0."""
        self._damage_starts: list[int] = []
        self._damage_ends: dict[int, int] = {}
        self._retired_maps: list[mmap.mmap] = []
        self._first_new: int | None = None
        """Where its first compressed set or message of format 2 starts (what FETCH versions 1
        and 2 cannot read), -1 for none; None until `first_new` walks
        a segment opened from disk (one this process created knows it from its appends)."""

    def __repr__(self) -> str:
        return f"Segment({self.log_path.name}, size={self.size})"

    @property
    def end_offset(self) -> int:
        return self.base_offset + self.size

    @property
    def stored(self) -> bool:
        """Whether its indexes are read from their files (a closed segment's), not in memory."""
        return isinstance(self.index, MappedOffsetIndex) or isinstance(
            self.time_index, MappedTimeIndex
        )

    @classmethod
    def create(cls, directory: Path, base_offset: int) -> Segment:
        """A new empty segment file; it is an error for it to exist already."""
        path = directory / segment_file_name(base_offset)
        try:
            os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
        except OSError as error:
            raise storage_error(error, f"creating {path}") from error
        try:
            fsync_directory(directory)
        except OSError as error:
            raise storage_error(error, f"creating {path}") from error
        segment = cls(path, base_offset, 0, OffsetIndex([]), TimeIndex())
        segment._first_new = -1
        return segment

    @classmethod
    def open_existing(
        cls, log_path: Path, base_offset: int
    ) -> tuple[Segment, bool, bool, str | None]:
        """Open a segment file on its stored indexes. The first flag says whether its offset
        index can be trusted so far (else the caller must `recover` the segment): it is
        missing or written for another size when the segment was not closed cleanly, and the
        text says why one that describes the file's size is damaged (its length does not fit
        its layout). The second says whether its time index can (else `walk_time_index` or
        `recover` builds it): it is only looked at beside a trusted offset index, and the text
        then says why one that describes the file's size is damaged. Reads the first 8 bytes
        and the length of each index file only, never their entries nor the log, so that
        opening costs the same whatever the segment holds; their checksums are checked on
        first use (IndexDamaged)."""
        size = log_path.stat().st_size
        index_path = log_path.with_suffix(INDEX_SUFFIX)
        index, damaged = MappedOffsetIndex.open(index_path, size)
        stored = OffsetIndex() if index is None else index  # (a mapped index's len() maps it)
        segment = cls(log_path, base_offset, size, stored, TimeIndex())
        segment.framing_checked = False
        if damaged is not None:
            return segment, False, False, f"index {index_path.name} is damaged: {damaged}"
        if index is None:
            return segment, False, False, None
        times, damaged = MappedTimeIndex.open(segment.time_index_path, size)
        if times is None:
            problem = None
            if damaged is not None:
                problem = f"time index {segment.time_index_path.name} is damaged: {damaged}"
            return segment, True, False, problem
        segment.time_index = times
        return segment, True, True, None

    # -- writing ---------------------------------------------------------------------------

    def append(
        self, data: Buffer, marks: list[int], greatest: list[int], first_new: int = -1
    ) -> None:
        """Write `data` (validated whole messages) at the end; `marks` are index entries
        relative to its start, `greatest` the greatest timestamps of the runs between them,
        `first_new` where its first set or message of format 2 starts, -1 for none
        (ScanResult). On any
        error the file is truncated back and nothing changes."""
        index, times = self.index, self.time_index
        assert isinstance(index, OffsetIndex) and isinstance(times, TimeIndex)  # active: in memory
        fd = self._write_handle()
        start = self.size
        self._unsynced = True
        try:
            written = os.write(fd, data)
            while written < len(data):
                written += os.write(fd, memoryview(data)[written:])
        except OSError as error:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, start)
            raise storage_error(error, f"append to {self.log_path}") from error
        self.size = start + len(data)
        times.extend(start, index.last, marks, greatest)
        index.extend(start, marks)
        if first_new >= 0 and self._first_new == -1:
            self._first_new = start + first_new

    def _write_handle(self) -> int:
        """The write handle, opened again if OPEN_FILES released it (StorageIOError, EMFILE
        among them, when it cannot be)."""
        fd = self._write_fd
        if fd is None:
            try:
                fd = os.open(self.log_path, os.O_WRONLY | os.O_APPEND)
            except OSError as error:
                raise storage_error(error, f"opening {self.log_path} to append") from error
            self._write_fd = fd
        OPEN_FILES.used(self._write_key, self._release_write_handle)
        return fd

    def open_to_sync(self) -> None:
        """Open the write handle again if OPEN_FILES released it while written bytes wait for
        `sync`. StorageIOError (EMFILE...) when it cannot be: unlike a failed fsync, that
        leaves the page cache to be trusted."""
        if self._unsynced:
            self._write_handle()

    def sync(self) -> None:
        """fsync what was written since the last sync, through the write handle (opened again
        if it was released: fsync covers the file, whichever descriptor wrote to it)."""
        if self._unsynced:
            try:
                os.fsync(self._write_handle())
            except OSError as error:
                raise storage_error(error, f"fsync of {self.log_path}") from error
            self._unsynced = False

    def synced_by_file_system(self) -> None:
        """What was written so far was made durable by a syncfs of the file system holding the
        file (broker.log.flush_round), one that reported no error: `sync` has nothing left to
        do."""
        self._unsynced = False

    def seal(self) -> None:
        """Stop writing and store the indexes: the time index, then the offset index, which
        marks a clean close. The caller has fsynced the data first (PartitionLog.flush): an
        index never vouches for unsynced bytes. DiskFull or StorageIOError when an index
        cannot be written; the segment is then as before, but not marked clean (open scans
        it)."""
        self.close_write_handle()
        self.store_indexes()

    def store_indexes(self) -> None:
        """Write the in-memory time index, then the in-memory offset index (each tmp, fsync,
        rename, fsync of the folder); from then on both are read from their files (a closed
        segment keeps no index in memory). DiskFull or StorageIOError when one cannot be
        written: both then stay in memory."""
        index = self.index
        assert isinstance(index, OffsetIndex)  # of the active segment, or of a scan
        times = self._write_time_index()
        status = self._write(index, self.index_path)
        self.index = MappedOffsetIndex.written(self.index_path, self.size, status)
        self.time_index = times

    def store_time_index(self) -> None:
        """Write the in-memory time index (built by `walk_time_index` beside a stored offset
        index), then read it from its file. DiskFull or StorageIOError when it cannot be
        written: it then stays in memory."""
        self.time_index = self._write_time_index()

    def _write_time_index(self) -> MappedTimeIndex:
        times = self.time_index
        assert isinstance(times, TimeIndex)
        status = self._write(times, self.time_index_path)
        return MappedTimeIndex.written(self.time_index_path, self.size, times, status)

    def _write(self, index: OffsetIndex | TimeIndex, path: Path) -> os.stat_result:
        try:
            return index.write(path, self.size)
        except OSError as error:
            raise storage_error(error, f"writing {path}") from error

    def truncate_to(self, size: int) -> None:
        """Cut the segment to `size` bytes, which must be a message boundary, with its indexes
        and its damaged ranges (only a segment whose indexes are in memory is ever cut: the
        active one, one just scanned, or one `load_indexes` made so). The file is not
        fsynced (`cut_file`). OSError as the file system gives it."""
        index, times = self.index, self.time_index
        assert isinstance(index, OffsetIndex) and isinstance(times, TimeIndex)
        self.cut_file(size)
        self.size = size
        self._checked_to = min(self._checked_to, size)
        if self._first_new is not None and self._first_new >= size:
            self._first_new = -1
        index.truncate_to(size)
        times.truncate_to(size)
        kept = [Damage(d.start, min(d.end, size), d.reason) for d in self.damage if d.start < size]
        if kept != self.damage:
            self.damage, self._damage_starts, self._damage_ends = [], [], {}
            for damage in kept:
                self.keep_damage(damage)

    def cut_file(self, size: int) -> None:
        """Cut the `.log` file to `size` bytes, if it is longer; nothing else changes, and
        nothing is fsynced. The write handle and the mapping are released first. A view of
        this segment still held (a fetch reply being sent) would meet SIGBUS on a page cut
        off: while one is, the first `size` bytes are copied to `<name>.tmp` (fsynced), which
        is renamed over the file (the folder fsynced), so that the views keep the old file's
        pages (PartitionLog.open deletes a leftover `.log.tmp`). OSError as the file system
        gives it; the file is then as it was."""
        OPEN_FILES.closed(self._write_key)
        self._release_write_handle()
        if os.stat(self.log_path).st_size <= size:
            return
        if not self.in_use():
            os.truncate(self.log_path, size)
            return
        tmp = self.log_path.with_name(self.log_path.name + ".tmp")
        try:
            with open(self.log_path, "rb") as source, open(tmp, "wb") as copy:
                left = size
                while left:
                    chunk = source.read(min(left, _COPY_CHUNK))
                    if not chunk:
                        raise OSError(errno.EIO, f"{self.log_path} ended before byte {size}")
                    copy.write(chunk)
                    left -= len(chunk)
                copy.flush()
                os.fsync(copy.fileno())
            os.replace(tmp, self.log_path)
        except OSError:
            tmp.unlink(missing_ok=True)
            raise
        fsync_directory(self.log_path.parent)

    def load_indexes(self) -> bool:
        """Read the stored indexes of a closed segment into memory, whole and checked, so that
        it can be cut and appended to as the active segment (PartitionLog.truncate_to); say
        whether they were, or whether one is missing or damaged (the segment must then be
        `recover`ed, which rebuilds both). True at once for indexes already in memory.
        OSError as the file system gives it."""
        index = self.index
        if isinstance(index, MappedOffsetIndex):
            loaded, _ = OffsetIndex.load(self.index_path, self.size)
            if loaded is None:
                return False
            index = loaded
        times = self.time_index
        if isinstance(times, MappedTimeIndex):
            loaded_times, _ = TimeIndex.load(self.time_index_path, self.size)
            if loaded_times is None:
                return False
            times = loaded_times
        self._unmap_indexes()
        self.index, self.time_index = index, times
        return True

    # -- recovery --------------------------------------------------------------------------

    def recover(self, index_interval: int) -> SegmentScan:
        """Check every message (`scan_segment`), rebuild the index and note the damaged
        ranges, which reads then answer with CorruptSegment. A torn tail is the caller's to
        cut (`cut_tail`) or to keep as damage (`keep_damage`)."""
        if self.size == 0:
            result = SegmentScan(0, [], [], None, [NO_TIMESTAMP])
        else:
            with _mapped(self.log_path) as data:
                result = scan_segment(data, index_interval)
        self._unmap_indexes()
        self.index = OffsetIndex(result.marks)
        self.time_index = TimeIndex.build(result.marks, result.greatest)
        self.damage = []
        for damage in result.damage:
            self.keep_damage(damage)
        self.framing_checked = True
        return result

    def walk_time_index(self, index_interval: int) -> bool:
        """Build the time index of a segment opened on a trusted offset index from its message
        headers (`walk_timestamps`); False, changing nothing, when their framing breaks (the
        segment must then be recovered). A walk of every header checks the framing, so reads
        no longer walk what they serve."""
        walked: tuple[list[int], list[int]] | None = ([], [NO_TIMESTAMP])
        if self.size > 0:
            with _mapped(self.log_path) as data:
                walked = walk_timestamps(data, index_interval)
        if walked is None:
            return False
        if isinstance(self.time_index, MappedTimeIndex):
            self.time_index.close()
        self.time_index = TimeIndex.build(*walked)
        self.framing_checked = True
        return True

    def keep_damage(self, damage: Damage) -> None:
        """Note damaged range `damage`, which follows every range noted before."""
        self.damage.append(damage)
        self._damage_starts.append(damage.start)
        self._damage_ends[damage.start] = damage.end

    def cut_tail(self, position: int) -> Path:
        """Move bytes [position, size) into a new `*.bad` file beside the segment (fsynced, then
        the folder), then cut the segment there (fsynced). Returns the `*.bad` file. OSError
        leaves the segment as it was."""
        target = bad_file_path(self.log_path)
        with open(self.log_path, "rb") as source, open(target, "xb") as kept:
            source.seek(position)
            shutil.copyfileobj(source, kept)
            kept.flush()
            os.fsync(kept.fileno())
        fsync_directory(self.log_path.parent)
        self.truncate_to(position)
        fsync_file(self.log_path)
        return target

    # -- reading ---------------------------------------------------------------------------

    def view(self, start: int, end: int) -> memoryview:
        """Bytes [start, end) of the segment, written bytes only, without copying."""
        if end <= start:
            return memoryview(b"")
        if self._map is None or len(self._map) < end:
            self._retire_map()
            try:
                with open(self.log_path, "rb") as f:
                    self._map = mmap.mmap(f.fileno(), self.size, access=mmap.ACCESS_READ)
            except OSError as error:
                raise storage_error(error, f"mapping {self.log_path}") from error
        OPEN_FILES.used(self._map_key, self._release_map)
        return memoryview(self._map)[start:end]

    def message_bounds(self, position: int, limit: int) -> tuple[int, int]:
        """The message containing `position`, as (its start, the next message's start), found by
        walking headers from the nearest indexed start; `limit` is where written data ends."""
        start = self.index.floor(position)
        window = self.view(0, limit)
        step = self._next_start if not self.damage else self._next_start_over_damage
        while True:
            following = step(window, start, limit)
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
        if self.damage:
            limit = self._readable_end(position, limit)
        window_end = min(limit, position + max_bytes)
        # An indexed start at window_end itself (say, the first unflushed message, right at
        # the high watermark) means everything before it is whole messages: nothing to walk.
        # Unless this process has not checked that far: then every header served is walked
        # once, so that a length field changed on disk is found (FramingBroken), not served.
        checked_to = self.size if self.framing_checked else self._checked_to
        if window_end <= checked_to:
            end = max(self.index.floor(window_end), position)
        else:
            end = max(checked_to, position)
        window = self.view(0, limit)
        while end < window_end:
            following = self._next_start(window, end, limit)
            if following > window_end:
                break
            end = following
        if position <= checked_to < end:
            self._checked_to = end
        if end == position:
            needed = message_size_at(window, position)
            raise FetchSizeTooSmall(self.base_offset + position, max_bytes, needed)
        return window[position:end]

    def first_new(self) -> int:
        """Where the first compressed set or message of format 2 of the segment starts, -1 for
        none: what a FETCH of version 1 or 2 may be served up to (broker.reads). A segment
        opened from disk learns it by one walk of its message headers, the first time it is
        asked."""
        if self._first_new is None:
            limit = self.size
            window = self.view(0, limit)
            step = self._next_start if not self.damage else self._next_start_over_damage
            position = 0
            while position < limit:
                following = step(window, position, limit)
                if position not in self._damage_ends and (
                    window[position + ATTRIBUTES_AT] or window[position + MAGIC_AT] != MAGIC
                ):
                    break
                position = following
            self._first_new = position if position < limit else -1
        return self._first_new

    def first_at_or_after(self, timestamp_ms: int, limit: int, start: int = 0) -> int | None:
        """The position of the first message from `start` (a message's) up to `limit` whose
        timestamp is at or after `timestamp_ms`, or None: a bisect of the time index, then a
        walk of the headers from the start of the run it names, or `start` if later (one run,
        unless `limit` cuts it short)."""
        position = self.time_index.start_for(timestamp_ms)
        if position is None:
            return None
        position = max(position, start)
        if position >= limit:
            return None
        window = self.view(0, limit)
        damaged = self._damage_ends
        step = self._next_start if not damaged else self._next_start_over_damage
        while position < limit:
            following = step(window, position, limit)
            if position not in damaged and timestamp_at(window, position) >= timestamp_ms:
                return position
            position = following
        return None

    def _readable_end(self, position: int, limit: int) -> int:
        """Where a read from `position` stops: before the next damaged range, or at `limit`.
        CorruptSegment, naming the range, when one starts at `position`."""
        i = bisect_left(self._damage_starts, position)
        if i == len(self.damage):
            return limit
        damage = self.damage[i]
        if damage.start == position:
            raise CorruptSegment(
                self.log_path.parent.name,
                self.base_offset + damage.start,
                self.base_offset + damage.end,
                damage.reason,
            )
        return min(limit, damage.start)

    def _next_start_over_damage(self, window: memoryview, start: int, limit: int) -> int:
        """`_next_start`, where a damaged range counts as one message."""
        end = self._damage_ends.get(start)
        return self._next_start(window, start, limit) if end is None else end

    def _next_start(self, window: memoryview, start: int, limit: int) -> int:
        if start + MIN_LENGTH + 4 > limit:
            raise self._framing_broken(start, limit, "a message header runs past the data")
        following = start + message_size_at(window, start)
        if following - start < MIN_LENGTH + 4 or following > limit:
            reason = f"message length {following - start} breaks framing"
            raise self._framing_broken(start, limit, reason)
        return following

    def _framing_broken(self, start: int, limit: int, reason: str) -> FramingBroken:
        name = self.log_path.parent.name
        return FramingBroken(name, self.base_offset + start, self.base_offset + limit, reason)

    # -- lifetime --------------------------------------------------------------------------

    def in_use(self) -> bool:
        """Whether a view returned by `view` or `read` is still held somewhere."""
        self._retire_map()
        return bool(self._retired_maps)

    def _retire_map(self) -> None:
        """Close the mapping, and any mapping kept aside that no view uses any more."""
        OPEN_FILES.closed(self._map_key)
        self._release_map()
        still_exported = []
        for m in self._retired_maps:
            try:
                m.close()  # a no-op for one OPEN_FILES closed already
            except BufferError:
                still_exported.append(m)
        self._retired_maps = still_exported

    def _release_map(self) -> None:
        """Close the mapping (OPEN_FILES calls this), or keep it aside while views use it."""
        m, self._map = self._map, None
        if m is not None and not OPEN_FILES.close_mapping(m):
            self._retired_maps.append(m)

    def _release_write_handle(self) -> None:
        """Close the write handle for OPEN_FILES; an error of close(2) is the next fsync's to
        report (what was written stays in the page cache, and `sync` still fsyncs it)."""
        fd, self._write_fd = self._write_fd, None
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)

    def close_write_handle(self) -> None:
        """Release the write handle (the next append opens it again). StorageIOError when
        close(2) reports an error; the handle is released all the same."""
        OPEN_FILES.closed(self._write_key)
        fd, self._write_fd = self._write_fd, None
        if fd is not None:
            try:
                os.close(fd)
            except OSError as error:
                raise storage_error(error, f"closing {self.log_path}") from error

    def close(self) -> None:
        """Release the write handle, the index files' mappings and any mapping of the log no
        view still uses."""
        try:
            self.close_write_handle()
        finally:
            self._retire_map()
            self._unmap_indexes()

    def _unmap_indexes(self) -> None:
        """Unmap the index files read from their files, if mapped."""
        for index in (self.index, self.time_index):
            if isinstance(index, (MappedOffsetIndex, MappedTimeIndex)):
                index.close()

    def delete(self) -> None:
        """Close and remove the segment, its indexes and its producer entries from disk."""
        self.close()
        self.log_path.unlink()
        self.index_path.unlink(missing_ok=True)
        self.time_index_path.unlink(missing_ok=True)
        self.log_path.with_suffix(PRODUCERS_SUFFIX).unlink(missing_ok=True)
        fsync_directory(self.log_path.parent)
