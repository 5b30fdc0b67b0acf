"""One segment: a file of whole messages, and its sparse index.

File `<base offset, 20 digits>.log` in the partition folder holds messages back to back (the
format of broker.log.message), exactly as producers' sets arrived; `base offset` is the
partition offset of its first byte, so the message at file position p has offset base + p. The
20-digit names make `ls` list segments in offset order.

A segment is its file (broker.log.segment_file: the write handle, syncs, the mapping reads
are cut from, views in use) and its indexes (broker.log.segment_indexes); this class keeps
them in step and reads whole messages. A segment whose file still has views is reported as in
use and not deleted.

After a crash, or when a disk goes bad, stored bytes may fail their checks: `scan_segment`
(broker.log.segment_scan, run by `Segment.recover`) keeps every valid message, notes each
damaged range (reads of it raise CorruptSegment naming it, so that readers can skip it), and
finds a torn tail, which only the newest segment's recovery cuts, moving the bytes to a
`*.bad` file (`cut_tail`).
A closed segment's stored indexes are not read into memory: opening reads their heads, and they
are mapped, and checked by their checksums, when first used (IndexDamaged when that fails:
the partition then rebuilds them from the log; broker.log.indexfile). Its log is not read on
open either: reads of such a segment walk every message header they serve, and one whose walk
meets broken framing raises FramingBroken (the partition then scans the segment again);
`pylogctl log verify` walks every index against its log (`index_disagreement`). The folder is
fsynced after a file in it is created, renamed or deleted. Not safe to share between threads.
"""

from __future__ import annotations

import os
import shutil
from bisect import bisect_left
from pathlib import Path

from broker.errors import CorruptSegment, FetchSizeTooSmall, InvalidOffset
from broker.log.fsdir import fsync_directory, fsync_file, storage_error
from broker.log.index import MappedOffsetIndex, OffsetIndex
from broker.log.message import (
    ATTRIBUTES_AT,
    MAGIC,
    MAGIC_AT,
    MIN_LENGTH,
    NO_TIMESTAMP,
    Buffer,
    message_size_at,
    timestamp_at,
)
from broker.log.segment_file import SegmentFile
from broker.log.segment_indexes import SegmentIndexes
from broker.log.segment_scan import Damage, SegmentScan, mapped, scan_segment, walk_timestamps
from broker.log.timeindex import MappedTimeIndex, TimeIndex

LOG_SUFFIX = ".log"
INDEX_SUFFIX = ".index"
TIME_INDEX_SUFFIX = ".timeindex"
PRODUCERS_SUFFIX = ".producers"
"""A segment's idempotent producer entries (broker.log.producers)."""


def segment_file_name(base_offset: int, suffix: str = LOG_SUFFIX) -> str:
    """The name of the segment file at `base_offset` (`suffix`: of its index, entries...)."""
    return f"{base_offset:020d}{suffix}"


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


class Segment:
    """A segment: its file (`file`: size, write handle, mapping), its indexes (`indexes`: in
    memory while it is active or after a scan, else read from their files) and the damaged
    ranges a scan found."""

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
        self.file = SegmentFile(log_path, size)
        self.indexes = SegmentIndexes(self.index_path, self.time_index_path, index, times)
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
        self._first_new: int | None = None
        """Where its first compressed set or message of format 2 starts (what FETCH versions 1
        and 2 cannot read), -1 for none; None until `first_new` walks
        a segment opened from disk (one this process created knows it from its appends)."""

    def __repr__(self) -> str:
        return f"Segment({self.log_path.name}, size={self.size})"

    @property
    def size(self) -> int:
        return self.file.size

    @property
    def end_offset(self) -> int:
        return self.base_offset + self.file.size

    @classmethod
    def create(cls, directory: Path, base_offset: int, sync: bool = True) -> Segment:
        """A new empty segment file; it is an error for it to exist already. Its entry in
        `directory` is fsynced, unless `sync` is False (the caller makes it durable:
        broker.log.fsdir.sync_created)."""
        path = directory / segment_file_name(base_offset)
        try:
            os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
            if sync:
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
        segment.indexes.times = times
        return segment, True, True, None

    # -- writing ---------------------------------------------------------------------------

    def append(
        self, data: Buffer, marks: list[int], greatest: list[int], first_new: int = -1
    ) -> None:
        """Write `data` (validated whole messages) at the end; `marks` are index entries
        relative to its start, `greatest` the greatest timestamps of the runs between them,
        `first_new` where its first set or message of format 2 starts, -1 for none
        (ScanResult). On any error the file is truncated back and nothing changes."""
        start = self.file.size
        self.file.write(data)
        self.indexes.extend(start, marks, greatest)
        if first_new >= 0 and self._first_new == -1:
            self._first_new = start + first_new

    def seal(self) -> None:
        """Stop writing and store the indexes: the time index, then the offset index, which
        marks a clean close. The caller has fsynced the data first (LocalLog.flush): an
        index never vouches for unsynced bytes. DiskFull or StorageIOError when an index
        cannot be written; the segment is then as before, but not marked clean (open scans
        it)."""
        self.file.close_write_handle()
        self.indexes.store(self.size)

    def truncate_to(self, size: int) -> None:
        """Cut the segment to `size` bytes, which must be a message boundary, with its indexes
        and its damaged ranges (only a segment whose indexes are in memory is ever cut: the
        active one, one just scanned, or one whose `indexes.load` made so). The file is not
        fsynced (SegmentFile.cut). OSError as the file system gives it."""
        assert not self.indexes.stored
        self.file.cut(size)
        self._checked_to = min(self._checked_to, size)
        if self._first_new is not None and self._first_new >= size:
            self._first_new = -1
        self.indexes.truncate_to(size)
        kept = [Damage(d.start, min(d.end, size), d.reason) for d in self.damage if d.start < size]
        if kept != self.damage:
            self.damage, self._damage_starts, self._damage_ends = [], [], {}
            for damage in kept:
                self.keep_damage(damage)

    # -- recovery --------------------------------------------------------------------------

    def recover(self, index_interval: int) -> SegmentScan:
        """Check every message (`scan_segment`), rebuild the index and note the damaged
        ranges, which reads then answer with CorruptSegment. A torn tail is the caller's to
        cut (`cut_tail`) or to keep as damage (`keep_damage`)."""
        if self.size == 0:
            result = SegmentScan(0, [], [], None, [NO_TIMESTAMP])
        else:
            with mapped(self.log_path) as data:
                result = scan_segment(data, index_interval)
        self.indexes.rebuild(result.marks, result.greatest)
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
            with mapped(self.log_path) as data:
                walked = walk_timestamps(data, index_interval)
        if walked is None:
            return False
        self.indexes.rebuild_times(*walked)
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

    def message_bounds(self, position: int, limit: int) -> tuple[int, int]:
        """The message containing `position`, as (its start, the next message's start), found by
        walking headers from the nearest indexed start; `limit` is where written data ends."""
        start = self.indexes.offsets.floor(position)
        window = self.file.view(0, limit)
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
            end = max(self.indexes.offsets.floor(window_end), position)
        else:
            end = max(checked_to, position)
        window = self.file.view(0, limit)
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
            window = self.file.view(0, limit)
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
        position = self.indexes.times.start_for(timestamp_ms)
        if position is None:
            return None
        position = max(position, start)
        if position >= limit:
            return None
        window = self.file.view(0, limit)
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

    def close(self) -> None:
        """Release the file's handle and mappings and the index files' mappings."""
        try:
            self.file.close()
        finally:
            self.indexes.close()

    def delete(self) -> None:
        """Close and remove the segment, its indexes and its producer entries from disk."""
        self.close()
        self.log_path.unlink()
        self.index_path.unlink(missing_ok=True)
        self.time_index_path.unlink(missing_ok=True)
        self.log_path.with_suffix(PRODUCERS_SUFFIX).unlink(missing_ok=True)
        fsync_directory(self.log_path.parent)
