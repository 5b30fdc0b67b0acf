"""The segments of one partition folder (Kafka's LocalLog under its UnifiedLog): appended at
the end, flushed, read by offset, rolled, cut, and deleted by retention.

Offsets are byte positions in the partition's stream of all bytes ever appended: each segment
starts where the previous one ends (but after a gap recovery found: offsets no segment holds,
which reads answer CorruptSegment), and a sorted list of their base offsets is bisected to find
the segment holding an offset. `start` is the log start offset, `flushed` the end of flushed
data (the partition's high watermark: reads never go past it), `end_offset` the end of
appended data; [flushed, end_offset) waits for a flush.

A closed segment's indexes are checked (checksum) when a read or a lookup first uses them, and
one that fails then is rebuilt from the log as on open, before that request is answered. Reads
of a closed segment walk the headers they serve, and one that meets broken framing scans that
segment then; reads of a damaged range raise CorruptSegment naming its offsets, which readers
may skip. A failed fsync, or a cut that fails once begun, fails the log (`failure`): the
partition refuses every change until it is reopened from the disk (PartitionLog). Not safe to
share between threads.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from bisect import bisect_right
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from broker.clock import Clock
from broker.errors import (
    CorruptSegment,
    OffsetOutOfRange,
    StorageError,
    StorageIOError,
    UnsupportedFormat,
)
from broker.log.config import LogConfig
from broker.log.fsdir import fsync_directory, fsync_file, storage_error
from broker.log.indexfile import IndexDamaged
from broker.log.message import Buffer, ScanResult, message_size_at
from broker.log.recovery import rebuild_index, rescan
from broker.log.segment import FramingBroken, Segment
from broker.log.segment_scan import Damage

log = logging.getLogger("broker.log.partition")  # the partition's, as operators see it

_T = TypeVar("_T")

KNOWN_STARTS = 64
"""How many message starts a log remembers as known (`_known`): the ends of its recent flushes
and reads, where followers and consumers fetch next."""


@dataclass(frozen=True, slots=True)
class LogStatistics:
    log_start_offset: int
    flushed_offset: int
    log_end_offset: int
    segments: int
    size_bytes: int
    pending_messages: int


class LocalLog:
    """The segments of the partition folder `directory`, oldest first (see the module
    docstring)."""

    def __init__(
        self, directory: Path, config: LogConfig, clock: Clock, segments: list[Segment]
    ) -> None:
        self.directory = directory
        self.config = config
        self.segments = segments
        """The segments, oldest first (others do not modify the list)."""
        self.device = os.stat(directory).st_dev
        """The file system holding the folder (st_dev): the flushes of the logs on one are
        synced together (broker.log.flush_round)."""
        self._clock = clock
        self._bases = [s.base_offset for s in segments]
        self.start = self._bases[0]
        """The log start offset: the first segment's base, or past it once records before
        were deleted (`move_start`)."""
        self.flushed = segments[-1].end_offset
        """The end of flushed data, which reads never pass: the partition's high watermark."""
        self.failure: str | None = None
        """Why a flush or a cut failed, if one did; None for a working log."""
        self.on_flush: Callable[[float], object] | None = None
        """Told how long each flush that made messages visible took, in seconds (for the
        broker's metrics)."""
        self._known: OrderedDict[int, None] = OrderedDict()
        """Offsets known to be message starts, most recent last, at most KNOWN_STARTS: the ends
        of recent flushes and reads and the offsets checked, where the next fetches come, so
        that `_locate` need not walk the headers from an index entry to check them again. Cleared
        when bytes are cut or scanned again."""
        self._pending_messages = 0
        self._pending_since: float | None = None
        self._active_since_ms = clock.time() * 1000

    @property
    def end_offset(self) -> int:
        return self.segments[-1].end_offset

    def segment_for(self, offset: int) -> Segment:
        """The segment holding `offset` (>= log start): the last whose base offset is <= it."""
        return self.segments[bisect_right(self._bases, offset) - 1]

    def refuse_if_failed(self) -> None:
        if self.failure is not None:
            raise StorageIOError(
                f"{self.directory.name}: a flush failed ({self.failure}): nothing more is "
                "written until the log is reopened from the disk"
            )

    @contextlib.contextmanager
    def failing_on(self, what: str) -> Iterator[None]:
        """A change to the files (a cut, a reset) that leaves the log failed if it fails
        midway: a StorageError as it is, an OSError as the StorageError it means, each named
        with `what`; PartitionLog.reopen_from_disk finishes it."""
        try:
            yield
        except StorageError as error:
            self.failure = f"{what}: {error}"
            raise
        except OSError as error:
            failure = storage_error(error, f"{self.directory}: {what}")
            self.failure = str(failure)
            raise failure from error

    @contextlib.contextmanager
    def taking_back(self, what: str) -> Iterator[None]:
        """Entries written for an append that then failed, being taken back: a StorageError
        doing so fails the log (named "taking back `what`") and goes no further, the append's
        own error being the one its caller raises."""
        try:
            yield
        except StorageError as error:
            self.failure = f"taking back {what}: {error}"

    # -- writing ---------------------------------------------------------------------------

    def placement(self, size: int) -> tuple[bool, int]:
        """For `size` bytes about to be appended: whether the active segment must roll first
        (it holds bytes and would pass `segment_bytes`, or is `segment_ms` old), and where
        their first index entry falls (ScanResult's `next_mark`)."""
        config, active = self.config, self.segments[-1]
        roll = active.size > 0 and (
            active.size + size > config.segment_bytes
            or (
                config.segment_ms is not None
                and self._clock.time() * 1000 - self._active_since_ms >= config.segment_ms
            )
        )
        offsets = active.indexes.offsets
        if roll or not len(offsets):
            return roll, 0
        return roll, max(0, offsets.last + config.index_interval_bytes - active.size)

    def append(self, message_set: Buffer, checked: ScanResult, count: int) -> None:
        """Write checked bytes of `count` messages at the end of the active segment, pending
        until the next flush. DiskFull or StorageIOError leave the log as it was."""
        self.segments[-1].append(message_set, checked.marks, checked.greatest, checked.first_new)
        if self._pending_since is None:
            self._pending_since = self._clock.monotonic()
        self._pending_messages += count

    def roll(self) -> bool:
        """Close the flushed active segment for writes and start a new one where it ends;
        False, nothing done, for an empty one. DiskFull or StorageIOError when its index or
        the new file cannot be written: the active segment then stays active."""
        active = self.segments[-1]
        if active.size == 0:
            return False
        active.seal()
        segment = Segment.create(self.directory, active.end_offset)
        self.segments.append(segment)
        self._bases.append(segment.base_offset)
        self._active_since_ms = self._clock.time() * 1000
        return True

    def reconfigure(self, config: LogConfig) -> None:
        """Use `config` from now on: a topic's settings changed while the log is open. Each
        setting is read when it is used, so flush_messages and flush_interval_ms count from
        the next `flush_due` (the messages already pending included), segment_bytes and
        segment_ms from the next append's `placement`, retention_ms and retention_bytes from
        the next `apply_retention`, max_message_bytes and compression from the next append."""
        self.config = config

    # -- flushing --------------------------------------------------------------------------

    def flush(self) -> None:
        """Make every appended message visible to reads, fsyncing first when configured.

        A failed fsync fails the log: the kernel may have dropped the pages it could not
        write and a later fsync would report success, so the page cache can no longer be
        trusted. `flushed` stays where it was, and every later change raises StorageIOError
        until the partition is reopened from the disk. A flush that cannot open the segment
        again to fsync it (EMFILE...) raises StorageIOError too, but fails nothing: no fsync
        was made, and a later flush tries again. (broker.log.flush_round flushes many logs
        with these steps, syncing their segments together.)"""
        self.refuse_if_failed()
        if not self.flush_pending:
            return
        started = time.perf_counter()
        segment = self.segment_to_sync()
        if segment is not None:
            try:
                segment.file.sync()
            except StorageError as error:
                self.fail_flush(error)
                raise
        self.complete_flush(time.perf_counter() - started)

    @property
    def flush_pending(self) -> bool:
        """Whether messages were appended since the last flush (not yet visible)."""
        return self.flushed != self.segments[-1].end_offset

    def segment_to_sync(self) -> Segment | None:
        """The first step of a flush: the active segment, its write handle open, when the
        topic fsyncs (its written bytes must be synced before `complete_flush`); None when it
        does not. StorageIOError when the log has failed, or when the handle cannot be
        opened again (EMFILE...: that fails nothing)."""
        self.refuse_if_failed()
        if not self.config.fsync:
            return None
        active = self.segments[-1]
        active.file.open_to_sync()
        return active

    def fail_flush(self, error: StorageError) -> None:
        """The sync of `segment_to_sync` failed: the log fails (see `flush`)."""
        self.failure = str(error)

    def complete_flush(self, seconds: float) -> None:
        """The last step of a flush, once `segment_to_sync` is synced (or was None): every
        appended message becomes visible to reads. `seconds`: how long the flush took."""
        self.flushed = self.segments[-1].end_offset
        self._note_start(self.flushed)
        self._pending_messages = 0
        self._pending_since = None
        if self.on_flush is not None:
            self.on_flush(seconds)

    def next_flush_deadline(self) -> float | None:
        """When (clock.monotonic) the pending messages are due to be flushed, or None."""
        if self._pending_since is None:
            return None
        return self._pending_since + self.config.flush_interval_ms / 1000

    def flush_if_due(self) -> bool:
        """Flush if `flush_due`; say if it did."""
        if not self.flush_due():
            return False
        self.flush()
        return True

    def flush_due(self) -> bool:
        """Whether the oldest pending message has waited flush_interval_ms, or flush_messages
        are pending."""
        deadline = self.next_flush_deadline()
        return deadline is not None and (
            self._clock.monotonic() >= deadline
            or self._pending_messages >= self.config.flush_messages
        )

    # -- reading ---------------------------------------------------------------------------

    def read(self, offset: int, max_bytes: int, sets: bool = True) -> memoryview:
        """Whole flushed messages from `offset`, at most `max_bytes` of them, from one segment.

        Empty at `flushed`. OffsetOutOfRange outside [start, flushed],
        InvalidOffset inside a message, FetchSizeTooSmall when the first message is larger than
        max_bytes. The view stays valid for as long as it is held, even past retention.
        Without `sets` (a reader of FETCH version 1 or 2), a segment is read only up to its
        first compressed set or message of format 2, and UnsupportedFormat raised at or past
        it.
        """
        if max_bytes < 1:
            raise ValueError(f"max_bytes must be at least 1, not {max_bytes}")
        return self.repairing(lambda: self._read(offset, max_bytes, sets))

    def _read(self, offset: int, max_bytes: int, sets: bool) -> memoryview:
        segment, position, limit = self._locate(offset)
        if position == limit:
            return memoryview(b"")
        if not sets:
            first = segment.first_new()
            if 0 <= first <= position:
                raise UnsupportedFormat(self.directory.name, segment.base_offset + first)
            if first >= 0:
                limit = min(limit, first)
        view = segment.read(position, max_bytes, limit)
        self._note_start(offset + len(view))  # whole messages: the next one starts there
        return view

    def check_offset(self, offset: int) -> None:
        """Raise what `read` would for `offset` (OffsetOutOfRange, InvalidOffset), reading
        nothing."""
        self.repairing(lambda: self._locate(offset))

    def offset_for_timestamp(self, timestamp_ms: int) -> int:
        """The offset of the first flushed message, in offset order, whose timestamp is at or
        after `timestamp_ms`, or `flushed` when there is none: exactly what a walk of
        every message would find, though timestamps are the producers' and need not grow with
        offsets. Segments whose greatest timestamp is older are passed over; in the first
        that is not, a bisect of its time index names the run that holds the message, and a
        walk of that run's headers finds it (broker.log.timeindex). Damaged ranges are passed
        over.
        """
        return self.repairing(lambda: self._offset_for_timestamp(timestamp_ms))

    def _offset_for_timestamp(self, timestamp_ms: int) -> int:
        for segment in self.segments:
            if segment.indexes.times.greatest < timestamp_ms or segment.end_offset <= self.start:
                continue
            limit = min(self.flushed, segment.end_offset) - segment.base_offset
            start = max(0, self.start - segment.base_offset)
            position = segment.first_at_or_after(timestamp_ms, limit, start)
            if position is not None:
                return segment.base_offset + position
        return max(self.flushed, self.start)

    def repairing(self, operation: Callable[[], _T]) -> _T:
        """`operation`, run again after each segment it met that had to be scanned again or had
        an index rebuilt (broker.log.recovery's `rescan`, `rebuild_index`); each segment needs
        it once, so at most once a segment, and what meets the same problem after that is
        raised."""
        for _ in range(len(self.segments)):
            try:
                return operation()
            except FramingBroken as broken:
                self._known.clear()
                rescan(self.segment_for(broken.start), broken, self.config.index_interval_bytes)
            except IndexDamaged as damaged:
                rebuild_index(self.segments, damaged, self.config.index_interval_bytes)
        return operation()

    def _note_start(self, offset: int) -> None:
        """`offset` is where a message starts (or will: the end of the bytes written)."""
        known = self._known
        known[offset] = None
        if len(known) > KNOWN_STARTS:
            known.popitem(last=False)  # O(1), where a dict's oldest key is found by a scan

    def _locate(self, offset: int) -> tuple[Segment, int, int]:
        """The segment of a readable message start (or the flushed end), the position in it,
        and where its readable bytes end."""
        if not self.start <= offset <= self.flushed:
            raise OffsetOutOfRange(offset, self.start, self.flushed)
        segment = self.segment_for(offset)
        limit = min(self.flushed, segment.end_offset) - segment.base_offset
        position = offset - segment.base_offset
        if position < limit and offset not in self._known:
            segment.check_boundary(position, limit)
            self._note_start(offset)
        elif position >= segment.size and segment is not self.segments[-1]:
            following = self._bases[bisect_right(self._bases, offset)]
            raise CorruptSegment(
                self.directory.name,
                segment.end_offset,
                following,
                "missing: no segment holds these offsets (recovery found them gone)",
            )
        return segment, position, limit

    # -- cutting ---------------------------------------------------------------------------

    def cut_to(self, offset: int) -> None:
        """Cut every byte at and after `offset`, in [start, end_offset]: InvalidOffset, nothing
        changed, unless a message starts there. `flushed` becomes the lower of itself and
        `offset`; appends not yet flushed past it are dropped (those before it stay pending).

        Order, so that a crash anywhere leaves a log that opens right: the segments after the
        one holding `offset` are deleted, newest first (the folder fsynced after each: a crash
        leaves a shorter log, never a gap); that segment is cut (its indexes read into memory
        first, or rebuilt by a scan when they cannot be, then cut with it; it becomes the
        active segment) and fsynced. A segment a reader holds a view of is cut by a copy
        (SegmentFile.cut), so that the view stays valid. DiskFull or StorageIOError once the
        cut has begun fails the log."""
        if offset < self.end_offset:
            self.repairing(lambda: self._check_cut(offset))
        self.flushed = min(self.flushed, offset)  # nothing past it is read
        self._known.clear()
        if offset < self.end_offset:
            with self.failing_on(f"truncating to {offset}"):
                self._cut_segments(offset)
        self._count_pending()

    def _check_cut(self, offset: int) -> None:
        segment = self.segment_for(offset)
        position = offset - segment.base_offset
        if position < segment.size:
            segment.check_boundary(position, segment.size)

    def _cut_segments(self, offset: int) -> None:
        holder = bisect_right(self._bases, offset) - 1
        if holder < len(self.segments) - 1:
            self._active_since_ms = self._clock.time() * 1000  # it becomes the active one
        while len(self.segments) > holder + 1:
            self.segments[-1].delete()
            del self.segments[-1]
            del self._bases[-1]
        segment = self.segments[holder]
        if not segment.indexes.load(segment.size):  # a closed one's, damaged: rebuilt
            result = segment.recover(self.config.index_interval_bytes)
            if result.tail_error is not None:
                segment.keep_damage(Damage(result.end, segment.size, result.tail_error))
        segment.truncate_to(offset - segment.base_offset)
        fsync_file(segment.log_path)

    def _count_pending(self) -> None:
        """Count the messages between the flushed end and the log end again (a cut dropped
        some): they are all in the active segment (a roll flushes first)."""
        active = self.segments[-1]
        position = self.flushed - active.base_offset
        if position >= active.size:
            self._pending_messages = 0
            self._pending_since = None
            return
        with active.file.view(0, active.size) as window:
            count = 0
            while position < active.size:
                position += message_size_at(window, position)
                count += 1
        self._pending_messages = count

    def delete_segments(self) -> None:
        """Delete every segment, newest first (the folder fsynced after each); the list stays
        as it was until `start_at` (`cut_back_files` passes over those gone). OSError and
        StorageError as the files give them."""
        for segment in reversed(self.segments):
            segment.delete()

    def start_at(self, offset: int) -> None:
        """After `delete_segments`: one empty segment whose base offset is `offset` created
        (the folder fsynced), the log start and `flushed` there, nothing pending."""
        segment = Segment.create(self.directory, offset)
        self.segments = [segment]
        self._bases = [offset]
        self.start = self.flushed = offset
        self._known.clear()
        self._pending_messages = 0
        self._pending_since = None
        self._active_since_ms = self._clock.time() * 1000

    def move_start(self, offset: int) -> int:
        """Move the log start up to `offset` (never back; at most to the end), to the start of
        the message after it when `offset` is inside one (logged), and delete the segments
        wholly below it that no reader holds; returns the log start."""
        offset = min(offset, self.end_offset)
        if offset <= self.start:
            return self.start
        segment = self.segment_for(offset)
        position = offset - segment.base_offset
        if position < segment.size:
            start, following = segment.message_bounds(position, segment.size)
            if start != position:
                log.warning(
                    "%s: log start %d is inside the message [%d, %d): moved to %d",
                    self.directory.name,
                    offset,
                    segment.base_offset + start,
                    segment.base_offset + following,
                    segment.base_offset + following,
                )
                offset = segment.base_offset + following
        self.start = offset
        self._delete_below_start()
        return offset

    def _delete_below_start(self) -> list[Path]:
        """Delete the oldest segments wholly below the log start that no reader holds; the
        files deleted."""
        deleted: list[Path] = []
        while len(self.segments) > 1 and self._bases[1] <= self.start:
            oldest = self.segments[0]
            if oldest.file.in_use():
                break
            oldest.delete()
            del self.segments[0]
            del self._bases[0]
            deleted.append(oldest.log_path)
        return deleted

    # -- retention -------------------------------------------------------------------------

    def apply_retention(self) -> list[Path]:
        """Delete the segments wholly below the log start, and the oldest closed segments that
        are past retention_ms or beyond retention_bytes; never the active one, never one a
        reader still holds a view of. Returns the files deleted."""
        config = self.config
        now = self._clock.time()
        deleted = self._delete_below_start()
        total = sum(s.size for s in self.segments)
        while len(self.segments) > 1:
            oldest = self.segments[0]
            too_old = (
                config.retention_ms is not None
                and (now - oldest.log_path.stat().st_mtime) * 1000 > config.retention_ms
            )
            too_big = config.retention_bytes is not None and (
                total - oldest.size >= config.retention_bytes
            )
            if not (too_old or too_big) or oldest.file.in_use():
                break
            oldest.delete()
            del self.segments[0]
            del self._bases[0]
            self.start = max(self.start, self._bases[0])
            total -= oldest.size
            deleted.append(oldest.log_path)
        return deleted

    def segment_states(self) -> list[tuple[int, int, int]]:
        """Each segment file's base offset, bytes and last write (ms since the epoch), oldest
        first: what apply_retention counts from."""
        return [
            (s.base_offset, s.size, s.log_path.stat().st_mtime_ns // 1_000_000)
            for s in self.segments
        ]

    def statistics(self) -> LogStatistics:
        return LogStatistics(
            log_start_offset=self.start,
            flushed_offset=self.flushed,
            log_end_offset=self.end_offset,
            segments=len(self.segments),
            size_bytes=sum(s.size for s in self.segments),
            pending_messages=self._pending_messages,
        )

    def close(self, flush: bool) -> None:
        """Release every file; with `flush`, flush and store the active segment's index first
        (a clean close). An empty active segment stores none: it holds nothing an index
        vouches for, and opening scans the newest segment whatever its index says (an idle
        partition's close so costs no fsync: 10,000 new partitions took 4 fsyncs each, 8-15
        s, to stop)."""
        try:
            if flush:
                self.flush()
                if self.segments[-1].size:
                    self.segments[-1].seal()
        finally:
            for segment in self.segments:
                segment.close()

    def cut_back_files(self) -> None:
        """After a failure (PartitionLog.reopen_from_disk), the files closed: cut what was
        appended past `flushed` (never acked as flushed; the page cache holding it cannot be
        trusted) and finish a cut or reset that failed midway (segments that start past
        `flushed` deleted, newest first, those already gone passed over; the one holding it
        cut there), then fsync the newest segment left (which proves the disk takes an fsync
        again). DiskFull or StorageIOError while the disk still fails."""
        end = self.flushed
        try:
            kept = self.segments
            for segment in reversed(self.segments):
                if segment.end_offset <= end:
                    break
                if segment.base_offset > end and segment is not self.segments[0]:
                    for path in (segment.log_path, segment.index_path, segment.time_index_path):
                        path.unlink(missing_ok=True)
                    fsync_directory(self.directory)
                    kept = kept[:-1]
                elif segment.log_path.exists():
                    segment.file.cut(max(0, end - segment.base_offset))
            if kept and kept[-1].log_path.exists():
                fsync_file(kept[-1].log_path)
        except OSError as error:
            raise storage_error(error, f"cutting {self.directory} back to offset {end}") from error
