"""The log of one partition: a folder of segments, appended at the end and read by offset.

Folder `<topic>-<partition>/` holds `<base offset, 20 digits>.log` segments and their `.index`
and `.timeindex` files (broker.log.segment, broker.log.index, broker.log.timeindex). Offsets
are byte positions in the partition's stream of all bytes ever appended: each segment starts
where the previous one ends (but after a gap recovery found: offsets no segment holds, which
reads answer CorruptSegment), and a sorted list of their base offsets is bisected to find the
segment holding an offset.

Three offsets describe the log:

    log start       the base offset of the oldest segment; retention moves it forward
    high watermark  the end of flushed data; reads never go past it
    log end         the end of appended data; [high watermark, log end) waits for a flush

Flushes are batched: one happens when `flush_messages` messages are pending or the oldest of
them has waited `flush_interval_ms` (checked on append and by `flush_if_due`, which a worker
calls at `next_flush_deadline`), and on roll and close. A flush fsyncs when `fsync` is set; a
failed fsync fails the log (every later append, flush and roll raises StorageIOError) until
`reopen_from_disk` cuts it back to the high watermark and opens it again.

Replication (docs/replication.md; docs/storage.md, "Leader epochs and truncation"): the folder's
`leader-epoch-checkpoint` (broker.log.epochs) is loaded on open as `epochs`; `assign_epoch`
adds a leader's entry, `append_replicated` appends a leader's bytes with their entries,
`end_offset_for_epoch` answers OFFSET_FOR_LEADER_EPOCH, `truncate_to` cuts a follower's log
back to an offset (the bytes first, then the history) and `reset_to` empties it to start
elsewhere. A cut that fails once begun fails the log as a failed fsync does.

Crash behaviour (docs/storage.md, "Recovery"): `open` recovers the folder first
(broker.log.recovery: what is trusted, scanned, put back, cut or set aside). A closed segment's
indexes are checked (checksum) when a read or a lookup first uses them, and one that fails then
is rebuilt from the log as on open, before that request is answered. Reads of a closed segment
walk the headers they serve, and one that meets broken framing scans that segment then; reads
of a damaged range raise CorruptSegment naming its offsets, which readers may skip. Not safe to
share between threads.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import time
from bisect import bisect_right
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from broker.clock import SYSTEM_CLOCK, Clock
from broker.errors import (
    CorruptSegment,
    MessageTooLarge,
    OffsetOutOfRange,
    StorageError,
    StorageIOError,
    UnsupportedFormat,
)
from broker.log.codec import check_sets, converted, validate_message_set
from broker.log.compression import Compressor, compressor_for
from broker.log.config import LogConfig
from broker.log.epochs import NO_EPOCH, LeaderEpochs
from broker.log.fsdir import fsync_directory, fsync_file, make_directory, storage_error
from broker.log.indexfile import IndexDamaged
from broker.log.message import Buffer, ScanResult, message_size_at
from broker.log.producers import ProducerStates, StoredSet
from broker.log.recovery import RecoveryReport, build_time_index, recover_folder, scan_untrusted
from broker.log.segment import FramingBroken, Segment
from broker.log.segment_scan import Damage

log = logging.getLogger(__name__)

_T = TypeVar("_T")

KNOWN_STARTS = 64
"""How many message starts a log remembers as known (`_known`): the ends of its recent flushes
and reads, where followers and consumers fetch next."""


class SetsToOpen(Exception):
    """An append with `expand` false met a producer's compressed sets, which it would have to
    decompress and check (about 45 ms for the 64 MiB a few KB may hold): nothing changed, and
    the caller appends the set again with `expand` true when that work's turn comes (the
    broker's worker takes its clients' in turn: broker.expansions)."""


@dataclass(frozen=True, slots=True)
class LogStatistics:
    log_start_offset: int
    high_watermark: int
    log_end_offset: int
    segments: int
    size_bytes: int
    pending_messages: int


class PartitionLog:
    """Append, flush, read, roll and retention for one partition folder. Use `open`."""

    def __init__(
        self,
        directory: Path,
        config: LogConfig,
        clock: Clock,
        segments: list[Segment],
        recovery: RecoveryReport,
        epochs: LeaderEpochs | None = None,
        producers: ProducerStates | None = None,
    ) -> None:
        self.directory = directory
        self.config = config
        self.recovery = recovery
        self.device = os.stat(directory).st_dev
        """The file system holding the folder (st_dev): the flushes of the logs on one are
        synced together (broker.log.flush_round)."""
        self.epochs = LeaderEpochs(directory) if epochs is None else epochs
        """The folder's leader-epoch history (broker.log.epochs), loaded by `open`, cut by
        `truncate_to` and `reset_to`, added to by `assign_epoch` and `append_replicated`."""
        self.producers = producers or ProducerStates(
            directory, segments[-1].base_offset, directory.name, clock
        )
        """The idempotent producers' last sets (broker.log.producers), loaded by `open`,
        added to by `append_idempotent`, cut by `truncate_to` and `reset_to`."""
        self._clock = clock
        self._segments = segments
        self._bases = [s.base_offset for s in segments]
        self._start = self._bases[0]
        """The log start offset: the first segment's base, or past it once records before
        were deleted (`advance_start`)."""
        self._high_watermark = segments[-1].end_offset
        self._known: OrderedDict[int, None] = OrderedDict()
        """Offsets known to be message starts, most recent last, at most KNOWN_STARTS: the ends
        of recent flushes and reads and the offsets checked, where the next fetches come, so
        that `_locate` need not walk the headers from an index entry to check them again. Cleared
        when bytes are cut or scanned again."""
        self._pending_messages = 0
        self._pending_since: float | None = None
        self._active_since_ms = clock.time() * 1000
        self._failure: str | None = None
        self._compressors: dict[str, Compressor | None] = {}
        """The compressor of the topic's `compression` (None for none), made when first used."""
        self.on_flush: Callable[[float], object] | None = None
        """Told how long each flush that made messages visible took, in seconds (for the
        broker's metrics); carried over by reopen_from_disk."""

    # -- opening ---------------------------------------------------------------------------

    @classmethod
    def open(
        cls, directory: Path, config: LogConfig | None = None, clock: Clock = SYSTEM_CLOCK
    ) -> PartitionLog:
        """Open (creating if needed) the partition folder, recovering it after a crash."""
        config = config or LogConfig()
        make_directory(directory)
        segments, report = recover_folder(directory, config)
        epochs = LeaderEpochs.load(directory, segments[-1].end_offset)
        report = dataclasses.replace(report, problems=report.problems + tuple(epochs.problems))
        end = segments[-1].end_offset
        bases = [s.base_offset for s in segments]
        producers = ProducerStates.load(directory, bases, end, directory.name, clock)
        return cls(directory, config, clock, segments, report, epochs, producers)

    # -- offsets ---------------------------------------------------------------------------

    @property
    def log_start_offset(self) -> int:
        return self._start

    @property
    def high_watermark(self) -> int:
        return self._high_watermark

    @property
    def log_end_offset(self) -> int:
        return self._segments[-1].end_offset

    @property
    def segments(self) -> list[Segment]:
        """The segments, oldest first (do not modify the list)."""
        return self._segments

    # -- writing ---------------------------------------------------------------------------

    def append(self, message_set: Buffer) -> int:
        """Validate a producer's message set, append it as it is, and return the offset of its
        first message. Raises InvalidMessage, MessageTooLarge, DiskFull or StorageIOError and
        then leaves the log's messages and offsets as they were."""
        return self.append_counted(message_set)[0]

    def append_counted(
        self, message_set: Buffer, flush: bool = True, expand: bool = True
    ) -> tuple[int, int]:
        """`append`, also saying how many messages the set held (the inner messages of a
        compressed set, each of its sets checked: broker.log.codec.check_sets). With `flush`
        false, a flush the append makes due (`flush_due`) is the caller's to make: the broker's
        worker makes one for all the requests it was passed at once. With `expand` false, a
        set that holds compressed sets raises SetsToOpen instead, nothing changed."""
        return self._append(
            message_set, self.config.max_message_bytes, flush, (), True, expand=expand
        )

    def append_idempotent(
        self,
        message_set: Buffer,
        producer_id: int,
        epoch: int,
        sequence: int,
        flush: bool = True,
        expand: bool = True,
        client: Callable[[], str] | None = None,
    ) -> tuple[StoredSet, bool]:
        """`append_counted` for a set of an idempotent producer (`producer_id` > 0), checked
        first by `producers` (broker.log.producers): the set as stored, and whether it was
        appended now; a set stored already is not appended again, and its stored set is
        returned. Raises what `append_counted` raises, and OutOfOrderSequence,
        InvalidProducerEpoch, DuplicateSequence or TooManyProducers (nothing appended).
        `client` gives the request's client id, for a new producer's share of places. The
        set's entry is written before its bytes; an append that then fails takes it back."""
        self._refuse_if_failed()
        repeated = self.producers.check(producer_id, epoch, sequence, client)
        if repeated is not None:
            return repeated, False
        stamp = (producer_id, epoch, sequence)
        offset, count = self._append(
            message_set, self.config.max_message_bytes, flush, (), True, None, stamp, expand=expand
        )
        stored = self.producers.last(producer_id)
        assert stored is not None and stored.offset == offset and stored.message_count == count
        return stored, True

    def append_replicated(
        self,
        message_set: Buffer,
        offset: int,
        epochs: Sequence[tuple[int, int]] = (),
        flush: bool = True,
        producers: Sequence[StoredSet] = (),
    ) -> int:
        """Append bytes a follower fetched from its leader, exactly at this log's end, with
        the leader's epoch entries for them, and return how many messages they held.

        `producers` are the leader's entries of the idempotent sets among the bytes (FETCH
        version 5), written with the bytes as the leader wrote them, before them: ValueError,
        before anything changes, for one outside the bytes or one that overlaps the one
        before.

        `offset` is where the bytes start on the leader: ValueError unless it is the log end
        (the follower fetches from its log end). `epochs` are the leader's entries (epoch,
        start offset) for these bytes, oldest first: the one in effect at `offset` (its start
        may be before `offset`: it is taken as starting at `offset`) and those that start
        inside the bytes or at their end; entries before the last that starts at or before
        `offset` are passed over. ValueError, before anything changes, for an entry past the
        bytes' end or one `LeaderEpochs.assign_all` refuses (an epoch below the latest: the
        follower did not truncate first).

        The bytes are checked as a producer's are (framing and checksums, InvalidMessage),
        but by the format's limits and `segment_bytes` only, never by `max_message_bytes`:
        the leader stored them, and a setting lowered since must not stop a follower
        (MessageTooLarge for a set larger than `segment_bytes`). Then the entries are written
        (one write of the history), and only then the bytes: a crash between leaves entries
        that start past the log end, which `open` drops, never bytes without their epoch.
        An append that then fails (DiskFull, StorageIOError) takes the new entries back (an
        entry at the log end stays); if that write fails too, the log fails as after a failed
        fsync (`reopen_from_disk`). Flushes as `append_counted` does."""
        entries = self.replicated_epochs(offset, len(message_set), epochs)
        end = offset + len(message_set)
        at = offset
        for entry in producers:
            if not offset <= at <= entry.offset < entry.end <= end:
                raise ValueError(
                    f"{self.directory.name}: producer entry [{entry.offset}, {entry.end}) is "
                    f"not a set of the bytes [{offset}, {end}) after {at}"
                )
            at = entry.end
        return self._append(
            message_set, self.config.segment_bytes, flush, entries, False, producers=producers
        )[1]

    def replicated_epochs(
        self, offset: int, size: int, epochs: Sequence[tuple[int, int]]
    ) -> list[tuple[int, int]]:
        """The entries `append_replicated` gives the history for `size` bytes at `offset` with
        the leader's `epochs` (its rules; ValueError as it raises for an offset that is not the
        log end or an entry past the bytes' end): a follower that writes them beforehand
        (broker.log.epochs.assign_together) leaves the append nothing to write."""
        if offset != self.log_end_offset:
            raise ValueError(
                f"{self.directory.name}: replicated bytes start at {offset}, not at the log "
                f"end {self.log_end_offset}"
            )
        end = offset + size
        entries = [(epoch, max(start, offset)) for epoch, start in epochs]
        for (epoch, start), (_, given) in zip(entries, epochs, strict=True):
            if start > end:
                raise ValueError(
                    f"{self.directory.name}: leader epoch {epoch} starts at {given}, past "
                    f"the end {end} of the bytes it came with"
                )
        while len(entries) > 1 and entries[1][1] == offset:
            del entries[0]
        return entries

    def _append(
        self,
        message_set: Buffer,
        max_message_bytes: int,
        flush: bool,
        epochs: Sequence[tuple[int, int]],
        producer: bool,
        count: int | None = None,
        stamp: tuple[int, int, int] | None = None,
        producers: Sequence[StoredSet] = (),
        expand: bool = True,
    ) -> tuple[int, int]:
        self._refuse_if_failed()
        config = self.config
        size = len(message_set)
        if size > config.segment_bytes:
            raise MessageTooLarge("message set", size, config.segment_bytes)
        active = self._segments[-1]
        roll = active.size > 0 and (
            active.size + size > config.segment_bytes
            or (
                config.segment_ms is not None
                and self._clock.time() * 1000 - self._active_since_ms >= config.segment_ms
            )
        )
        if roll or not len(active.indexes.offsets):
            next_mark = 0
        else:
            next_mark = max(
                0, active.indexes.offsets.last + config.index_interval_bytes - active.size
            )
        checked = validate_message_set(
            message_set, max_message_bytes, config.index_interval_bytes, next_mark
        )
        if producer:
            # A producer's compressed sets are opened and checked (a leader's bytes were), and
            # the set is stored as the topic's compression says; `count`: its messages.
            if checked.first_set >= 0 and not expand:
                raise SetsToOpen(self.directory.name)
            count = check_sets(message_set, checked, max_message_bytes)
            stored = self._as_topic_stores(message_set, checked)
            if stored is not None:
                return self._append(
                    stored, config.segment_bytes, flush, epochs, False, count, stamp
                )
        elif count is None:
            count = checked.message_count
        if roll:
            self.roll()
            active = self._segments[-1]
        offset = active.end_offset
        if epochs:
            self.epochs.assign_all(epochs)  # before the bytes: never bytes without their epoch
        if stamp is not None:
            producers = (StoredSet(*stamp, offset, offset + size, count),)
        before = self.producers.record(producers) if producers else {}  # never bytes without
        try:
            active.append(message_set, checked.marks, checked.greatest, checked.first_new)
        except StorageError:
            if epochs:
                self._take_back_epochs()
            if producers:
                self._take_back_entries(producers, before)
            raise
        if self._pending_since is None:
            self._pending_since = self._clock.monotonic()
        self._pending_messages += count
        if flush:
            self.flush_if_due()
        return offset, count

    def _as_topic_stores(self, message_set: Buffer, checked: ScanResult) -> bytes | None:
        """A producer's set as the topic's `compression` has it stored, or None when it is
        stored as it came (broker.log.codec.converted); the topic's compressor is kept."""
        wanted = self.config.compression
        if wanted == "producer":
            return None
        if wanted not in self._compressors:
            self._compressors = {wanted: compressor_for(wanted)}
        return converted(message_set, checked, self._compressors[wanted])

    def _take_back_epochs(self) -> None:
        """Drop the entries that start past the log end (an append that failed after they
        were written); a failure to write that fails the log."""
        try:
            self.epochs.truncate_from(self.log_end_offset + 1)
        except StorageError as error:
            self._failure = f"taking back leader epochs: {error}"

    def _take_back_entries(
        self, entries: Sequence[StoredSet], before: dict[int, StoredSet | None]
    ) -> None:
        """Cut the entries of sets whose append failed; a failure to cut fails the log."""
        try:
            self.producers.take_back(entries, before)
        except StorageError as error:
            self._failure = f"taking back producer entries: {error}"

    def flush(self) -> None:
        """Make every appended message visible to reads, fsyncing first when configured.

        A failed fsync fails the log: the kernel may have dropped the pages it could not
        write and a later fsync would report success, so the page cache can no longer be
        trusted. The high watermark stays where it was, and every later append, flush and roll
        raises StorageIOError until `reopen_from_disk`. A flush that cannot open the segment
        again to fsync it (EMFILE...) raises StorageIOError too, but fails nothing: no fsync
        was made, and a later flush tries again. (broker.log.flush_round flushes many logs
        with these steps, syncing their segments together.)"""
        self._refuse_if_failed()
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
        return self._high_watermark != self._segments[-1].end_offset

    def segment_to_sync(self) -> Segment | None:
        """The first step of a flush: the active segment, its write handle open, when the
        topic fsyncs (its written bytes must be synced before `complete_flush`); None when it
        does not. StorageIOError when the log has failed, or when the handle cannot be
        opened again (EMFILE...: that fails nothing)."""
        self._refuse_if_failed()
        if not self.config.fsync:
            return None
        active = self._segments[-1]
        active.file.open_to_sync()
        return active

    def fail_flush(self, error: StorageError) -> None:
        """The sync of `segment_to_sync` failed: the log fails (see `flush`)."""
        self._failure = str(error)

    def complete_flush(self, seconds: float) -> None:
        """The last step of a flush, once `segment_to_sync` is synced (or was None): every
        appended message becomes visible to reads. `seconds`: how long the flush took."""
        self._high_watermark = self._segments[-1].end_offset
        self._note_start(self._high_watermark)
        self._pending_messages = 0
        self._pending_since = None
        if self.on_flush is not None:
            self.on_flush(seconds)

    def next_flush_deadline(self) -> float | None:
        """When (clock.monotonic) the pending messages are due to be flushed, or None."""
        if self._pending_since is None:
            return None
        return self._pending_since + self.config.flush_interval_ms / 1000

    def flush_due(self) -> bool:
        """Whether the oldest pending message has waited flush_interval_ms, or flush_messages
        are pending."""
        deadline = self.next_flush_deadline()
        return deadline is not None and (
            self._clock.monotonic() >= deadline
            or self._pending_messages >= self.config.flush_messages
        )

    def flush_if_due(self) -> bool:
        """Flush if `flush_due`; say if it did."""
        if not self.flush_due():
            return False
        self.flush()
        return True

    def reconfigure(self, config: LogConfig) -> None:
        """Use `config` from now on: a topic's settings changed while the log is open. Each
        setting is read when it is used, so flush_messages and flush_interval_ms count from
        the next `flush_if_due` (the messages already pending included), segment_bytes and
        segment_ms from the next append's roll check, retention_ms and retention_bytes from
        the next `apply_retention`, max_message_bytes and compression from the next append."""
        self.config = config

    def roll(self) -> None:
        """Flush, close the active segment for writes and start a new one where it ends.
        DiskFull or StorageIOError when its index or the new file cannot be written: then the
        active segment stays active (a later roll tries again)."""
        self.flush()
        active = self._segments[-1]
        if active.size == 0:
            return
        active.seal()
        segment = Segment.create(self.directory, active.end_offset)
        self._segments.append(segment)
        self._bases.append(segment.base_offset)
        self._active_since_ms = self._clock.time() * 1000
        if self.config.fsync:
            self.producers.sync()  # the closed segment's entries, as its bytes were
        self.producers.roll(segment.base_offset)

    # -- reading ---------------------------------------------------------------------------

    def read(self, offset: int, max_bytes: int, sets: bool = True) -> memoryview:
        """Whole flushed messages from `offset`, at most `max_bytes` of them, from one segment.

        Empty at the high watermark. OffsetOutOfRange outside [log start, high watermark],
        InvalidOffset inside a message, FetchSizeTooSmall when the first message is larger than
        max_bytes. The view stays valid for as long as it is held, even past retention.
        Without `sets` (a reader of FETCH version 1 or 2), a segment is read only up to its
        first compressed set or message of format 2, and UnsupportedFormat raised at or past
        it.
        """
        if max_bytes < 1:
            raise ValueError(f"max_bytes must be at least 1, not {max_bytes}")
        return self._repairing(lambda: self._read(offset, max_bytes, sets))

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
        self._repairing(lambda: self._locate(offset))

    @contextlib.contextmanager
    def _failing_on(self, what: str) -> Iterator[None]:
        """A change to the files (a cut, a reset) that leaves the log failed if it fails
        midway: a StorageError as it is, an OSError as the StorageError it means, each named
        with `what`; reopen_from_disk finishes it."""
        try:
            yield
        except StorageError as error:
            self._failure = f"{what}: {error}"
            raise
        except OSError as error:
            failure = storage_error(error, f"{self.directory}: {what}")
            self._failure = str(failure)
            raise failure from error

    def _repairing(self, operation: Callable[[], _T]) -> _T:
        """`operation`, run again after each segment it met that had to be scanned again
        (`_rescan`) or had an index rebuilt (`_rebuild_index`); each segment needs it once, so
        at most once a segment, and what meets the same problem after that is raised."""
        for _ in range(len(self._segments)):
            try:
                return operation()
            except FramingBroken as broken:
                self._rescan(broken)
            except IndexDamaged as damaged:
                self._rebuild_index(damaged)
        return operation()

    def _rebuild_index(self, damaged: IndexDamaged) -> None:
        """A closed segment's stored index failed its check on first use (or is gone): never
        trusted, it is rebuilt from the log as on open (a time index by a walk of the message
        headers, an offset index, or a time index whose walk breaks, by a scan of the segment,
        damage kept in place), stored, and every problem logged."""
        segment = next(
            s for s in self._segments if damaged.path in (s.index_path, s.time_index_path)
        )
        name = segment.log_path.name
        kind = "index" if damaged.path == segment.index_path else "time index"
        problems = [f"{name}: {kind} {damaged}; rebuilt from the log"]
        interval = self.config.index_interval_bytes
        if kind == "index" or not build_time_index(segment, interval, problems):
            scan_untrusted(segment, interval, False, problems)
            problems += [
                f"{name}: offsets [{segment.base_offset + d.start}, {segment.base_offset + d.end})"
                f" damaged, kept in place: {d.reason}"
                for d in segment.damage
            ]
        for problem in problems:
            log.warning("%s: %s", self.directory.name, problem)

    def _rescan(self, broken: FramingBroken) -> None:
        """A read met framing that breaks where no damage was known: the file changed after
        it was opened. Scan that segment again as recovery does, cutting nothing: what fails
        the checks becomes damage that reads report (CorruptSegment), and the rest is served."""
        self._known.clear()
        segment = self.segment_for(broken.start)
        result = segment.recover(self.config.index_interval_bytes)
        if result.tail_error is not None:
            segment.keep_damage(Damage(result.end, segment.size, result.tail_error))
        log.warning(
            "%s: %s; %s scanned again: damaged %s",
            self.directory.name,
            broken,
            segment.log_path.name,
            ", ".join(f"[{d.start}, {d.end})" for d in segment.damage) or "nothing",
        )

    def _note_start(self, offset: int) -> None:
        """`offset` is where a message starts (or will: the end of the bytes written)."""
        known = self._known
        known[offset] = None
        if len(known) > KNOWN_STARTS:
            known.popitem(last=False)  # O(1), where a dict's oldest key is found by a scan

    def _locate(self, offset: int) -> tuple[Segment, int, int]:
        """The segment of a readable message start (or the high watermark), the position in
        it, and where its readable bytes end."""
        if not self.log_start_offset <= offset <= self._high_watermark:
            raise OffsetOutOfRange(offset, self.log_start_offset, self._high_watermark)
        segment = self.segment_for(offset)
        limit = min(self._high_watermark, segment.end_offset) - segment.base_offset
        position = offset - segment.base_offset
        if position < limit and offset not in self._known:
            segment.check_boundary(position, limit)
            self._note_start(offset)
        elif position >= segment.size and segment is not self._segments[-1]:
            following = self._bases[bisect_right(self._bases, offset)]
            raise CorruptSegment(
                self.directory.name,
                segment.end_offset,
                following,
                "missing: no segment holds these offsets (recovery found them gone)",
            )
        return segment, position, limit

    def offset_for_timestamp(self, timestamp_ms: int) -> int:
        """The offset of the first flushed message, in offset order, whose timestamp is at or
        after `timestamp_ms`, or the high watermark when there is none: exactly what a walk of
        every message would find, though timestamps are the producers' and need not grow with
        offsets. Segments whose greatest timestamp is older are passed over; in the first
        that is not, a bisect of its time index names the run that holds the message, and a
        walk of that run's headers finds it (broker.log.timeindex). Damaged ranges are passed
        over.
        """
        return self._repairing(lambda: self._offset_for_timestamp(timestamp_ms))

    def _offset_for_timestamp(self, timestamp_ms: int) -> int:
        for segment in self._segments:
            if segment.indexes.times.greatest < timestamp_ms or segment.end_offset <= self._start:
                continue
            limit = min(self._high_watermark, segment.end_offset) - segment.base_offset
            start = max(0, self._start - segment.base_offset)
            position = segment.first_at_or_after(timestamp_ms, limit, start)
            if position is not None:
                return segment.base_offset + position
        return max(self._high_watermark, self._start)

    def producer_sets(self, start: int, end: int) -> tuple[StoredSet, ...]:
        """The idempotent producers' entries of the sets in [`start`, `end`), bytes of one
        segment that a follower fetches (FETCH version 5)."""
        return self.producers.sets_between(self.segment_for(start).base_offset, start, end)

    def segment_for(self, offset: int) -> Segment:
        """The segment holding `offset` (>= log start): the last whose base offset is <= it."""
        return self._segments[bisect_right(self._bases, offset) - 1]

    # -- replication -----------------------------------------------------------------------

    def assign_epoch(self, epoch: int) -> bool:
        """A leader of `epoch` starts at this log's end: entry (epoch, log end) added to the
        history, before anything is appended (`LeaderEpochs.assign`: nothing when `epoch` is
        the latest; ValueError for one below it). StorageIOError for a failed log; DiskFull
        or StorageIOError when the history cannot be written (nothing changed)."""
        self._refuse_if_failed()
        return self.epochs.assign(epoch, self.log_end_offset)

    def end_offset_for_epoch(self, epoch: int) -> tuple[int, int]:
        """This replica's answer to OFFSET_FOR_LEADER_EPOCH for `epoch`: (the largest epoch at
        or below it, that epoch's end offset here), or (-1, log start) when there is none
        (`LeaderEpochs.end_offset_for`)."""
        return self.epochs.end_offset_for(epoch, self.log_end_offset, self.log_start_offset)

    def truncate_to(self, offset: int) -> int:
        """Cut every byte at and after `offset` (a follower's truncation, docs/replication.md),
        and the epoch entries that start there or later; return the bytes cut.

        `offset` must be in [log start, log end] (ValueError else) and where a message starts
        (InvalidOffset, naming the message around it, else); nothing changes then. At the log
        end only the entries starting there are dropped. The high watermark becomes the lower
        of itself and `offset`; appends not yet flushed past `offset` are dropped (those
        before it stay pending). A cut below the high watermark (flushed bytes, as after an
        unclean election) is logged at WARNING, any other at INFO.

        Order, so that a crash anywhere leaves a log `open` reads right: the segments after the
        one holding `offset` are deleted, newest first (the folder fsynced after each: a crash
        leaves a shorter log, never a gap); that segment is cut (its indexes read into memory
        first, or rebuilt by a scan when they cannot be, then cut with it; it becomes the
        active segment) and fsynced; only then is the epoch history written without its
        entries at or past `offset`. A crash before that leaves entries past the new log end,
        which `open` drops, and one at it, which describes no byte and is true of the bytes
        before it: the history never claims bytes it does not have, and no byte past the cut
        survives while the history says it is gone. A segment a reader holds a view of is cut
        by a copy (SegmentFile.cut), so that the view stays valid.

        StorageIOError at once for a failed log. DiskFull or StorageIOError once the cut has
        begun fails the log, as a failed fsync does: `reopen_from_disk` then finishes the cut
        down to the high watermark, which is at or below `offset` already."""
        self._refuse_if_failed()
        start, end = self.log_start_offset, self.log_end_offset
        if not start <= offset <= end:
            raise ValueError(
                f"{self.directory.name}: cannot truncate to {offset}, outside the log "
                f"[{start}, {end}]"
            )
        if offset < end:
            self._repairing(lambda: self._check_cut(offset))
        flushed_cut = max(0, self._high_watermark - offset)
        self._high_watermark = min(self._high_watermark, offset)  # nothing past it is read
        self._known.clear()
        with self._failing_on(f"truncating to {offset}"):
            if offset < end:
                self._cut_segments(offset)
                self.producers.truncate(self.segment_for(offset).base_offset, offset)
            self.epochs.truncate_from(offset)
        self._count_pending()
        level = logging.WARNING if flushed_cut else logging.INFO
        log.log(
            level,
            "%s: truncated to %d: %d bytes cut, %d of them flushed",
            self.directory.name,
            offset,
            end - offset,
            flushed_cut,
        )
        return end - offset

    def _check_cut(self, offset: int) -> None:
        segment = self.segment_for(offset)
        position = offset - segment.base_offset
        if position < segment.size:
            segment.check_boundary(position, segment.size)

    def _cut_segments(self, offset: int) -> None:
        """Delete the segments after the one holding `offset`, newest first, then cut that one
        there and fsync it; it becomes the active segment. OSError and StorageError as the
        files give them."""
        holder = bisect_right(self._bases, offset) - 1
        if holder < len(self._segments) - 1:
            self._active_since_ms = self._clock.time() * 1000  # it becomes the active one
        while len(self._segments) > holder + 1:
            self._segments[-1].delete()
            del self._segments[-1]
            del self._bases[-1]
        segment = self._segments[holder]
        if not segment.indexes.load(
            segment.size
        ):  # a closed segment's, damaged: rebuilt as on open
            result = segment.recover(self.config.index_interval_bytes)
            if result.tail_error is not None:
                segment.keep_damage(Damage(result.end, segment.size, result.tail_error))
        segment.truncate_to(offset - segment.base_offset)
        fsync_file(segment.log_path)

    def _count_pending(self) -> None:
        """Count the messages between the high watermark and the log end again (a cut dropped
        some): they are all in the active segment (a roll flushes first)."""
        active = self._segments[-1]
        position = self._high_watermark - active.base_offset
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

    def reset_to(self, start_offset: int, epoch: int | None = None) -> None:
        """Empty the log and start it again at `start_offset`, above or below its range (a
        follower whose leader's log starts past its own end, or whose own log starts past the
        leader's answer, docs/replication.md; an empty log asked to start past its end,
        `advance_start`): every segment deleted, one empty segment whose base offset is
        `start_offset` created, the epoch history cleared (or, given `epoch`, that epoch
        alone, from `start_offset`), the high watermark and the log start `start_offset`,
        pending appends dropped. Logged at WARNING with the bytes dropped (at INFO when none
        were). ValueError for a negative offset; StorageIOError at once for a failed log.

        Order: the history is cleared first (a log without history is safe: its replica
        truncates further, never less), then the segments are deleted newest first (the folder
        fsynced after each), then the new one created (and the folder fsynced). A crash leaves
        a prefix of the old log without history, or an empty log (at offset 0 when no segment
        was left: the follower's truncation then comes back here). DiskFull or StorageIOError
        once it has begun fails the log, as `truncate_to` says; `reopen_from_disk` then opens
        what is left, cut down to the old log start."""
        self._refuse_if_failed()
        if start_offset < 0:
            raise ValueError(f"{self.directory.name}: cannot start at {start_offset}")
        dropped = self.log_end_offset - self.log_start_offset
        self._high_watermark = self.log_start_offset  # nothing is read from now on
        self._known.clear()
        with self._failing_on(f"resetting to {start_offset}"):
            self.epochs.clear_and_start(start_offset, epoch)
            for segment in reversed(self._segments):
                segment.delete()
            self.producers.reset(start_offset)
            segment = Segment.create(self.directory, start_offset)
        self._segments = [segment]
        self._bases = [start_offset]
        self._start = self._high_watermark = start_offset
        self._pending_messages = 0
        self._pending_since = None
        self._active_since_ms = self._clock.time() * 1000
        log.log(
            logging.WARNING if dropped else logging.INFO,
            "%s: emptied (%d bytes dropped) to start again at %d",
            self.directory.name,
            dropped,
            start_offset,
        )

    def advance_start(self, offset: int) -> int:
        """Delete the records before `offset`: the log start moves there (never back; at most
        to the log end), reads below it are OFFSET_OUT_OF_RANGE from now on, and the segments
        wholly below it are deleted (those a reader holds a view of by the next retention
        pass). An offset inside a message moves the start to the message after it (the bytes
        asked gone stay gone; logged). Returns the log start. Nothing is written here: the
        start is kept in the registry (broker.registry.topics, `log_starts`), which every
        replica applies when it opens the partition, and again as it grows (a follower's start
        past its end is reached as it copies). StorageIOError for a failed log.

        An empty log asked to start past its end starts there (`reset_to`, its latest leader
        epoch kept from there): a mirrored partition begins at the source's log start, so
        that each message lands at the source's offset (docs/mirror.md)."""
        self._refuse_if_failed()
        if self.log_start_offset == self.log_end_offset < offset:
            latest = self.epochs.latest_epoch
            self.reset_to(offset, latest if latest != NO_EPOCH else None)
            return offset
        offset = min(offset, self.log_end_offset)
        if offset <= self._start:
            return self._start
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
        self._start = offset
        self._delete_below_start()
        return offset

    def _delete_below_start(self) -> list[Path]:
        """Delete the oldest segments wholly below the log start that no reader holds; the
        files deleted."""
        deleted: list[Path] = []
        while len(self._segments) > 1 and self._bases[1] <= self._start:
            oldest = self._segments[0]
            if oldest.file.in_use():
                break
            oldest.delete()
            del self._segments[0]
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
        total = sum(s.size for s in self._segments)
        while len(self._segments) > 1:
            oldest = self._segments[0]
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
            del self._segments[0]
            del self._bases[0]
            self._start = max(self._start, self._bases[0])
            total -= oldest.size
            deleted.append(oldest.log_path)
        return deleted

    def segment_states(self) -> list[tuple[int, int, int]]:
        """Each segment file's base offset, bytes and last write (ms since the epoch), oldest
        first: what apply_retention counts from."""
        return [
            (s.base_offset, s.size, s.log_path.stat().st_mtime_ns // 1_000_000)
            for s in self._segments
        ]

    # -- lifetime --------------------------------------------------------------------------

    def statistics(self) -> LogStatistics:
        return LogStatistics(
            log_start_offset=self.log_start_offset,
            high_watermark=self._high_watermark,
            log_end_offset=self.log_end_offset,
            segments=len(self._segments),
            size_bytes=sum(s.size for s in self._segments),
            pending_messages=self._pending_messages,
        )

    @property
    def failure(self) -> str | None:
        """Why a flush failed, if one did (see `flush`); None for a working log."""
        return self._failure

    def _refuse_if_failed(self) -> None:
        if self._failure is not None:
            raise StorageIOError(
                f"{self.directory.name}: a flush failed ({self._failure}): nothing more is "
                "written until the log is reopened from the disk"
            )

    def close(self, flush: bool = True) -> None:
        """Flush, store the active segment's index (a clean close) and release every file.
        An empty active segment stores none: it holds nothing an index vouches for, and
        opening scans the newest segment whatever its index says (an idle partition's close
        so costs no fsync: 10,000 new partitions took 4 fsyncs each, 8-15 s, to stop).

        With flush=False (a log about to be deleted), and after a failed flush, it only
        releases the files: it writes nothing, so neither a full nor a failing disk stops it.
        """
        try:
            if flush and self._failure is None:
                self.flush()
                if self._segments[-1].size:
                    self._segments[-1].seal()
                if self.config.fsync:
                    self.producers.sync()
        finally:
            self.producers.close()
            for segment in self._segments:
                segment.close()

    def reopen_from_disk(self) -> PartitionLog:
        """After a failed flush: the folder opened again from what the disk holds.

        Releases every file without flushing, cuts what was appended past the high watermark
        (it was never acked as flushed, and the page cache holding it cannot be trusted),
        fsyncs the newest segment (which proves the disk takes an fsync again), then `open`s
        the folder, which recovers it. StorageIOError or DiskFull while the disk still fails:
        this log is left closed and failed, and the call can be made again later.

        After a failed `truncate_to` or `reset_to` it finishes the cut: segments that start
        past the high watermark are deleted (newest first; those already gone are passed
        over), and the one holding it is cut there."""
        self.close(flush=False)
        end = self._high_watermark
        try:
            kept = self._segments
            for segment in reversed(self._segments):
                if segment.end_offset <= end:
                    break
                if segment.base_offset > end and segment is not self._segments[0]:
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
        reopened = PartitionLog.open(self.directory, self.config, self._clock)
        reopened.on_flush = self.on_flush
        reopened.advance_start(self._start)
        return reopened

    def __enter__(self) -> PartitionLog:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
