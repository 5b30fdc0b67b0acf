"""The log of one partition: a folder of segments, appended at the end and read by offset.

Folder `<topic>-<partition>/` holds `<base offset, 20 digits>.log` segments and their `.index`
and `.timeindex` files (broker.log.segment, broker.log.index, broker.log.timeindex), which
`local` (broker.log.local_log: appends, flushes, reads, rolls, cuts, retention) holds; this
class checks what is appended, keeps the leader epochs and the idempotent producers' entries
in step with the bytes, and reopens a failed log. Offsets are byte positions in the
partition's stream of all bytes ever appended.

Three offsets describe the log:

    log start       the base offset of the oldest segment; retention moves it forward
    high watermark  the end of flushed data; reads never go past it
    log end         the end of appended data; [high watermark, log end) waits for a flush

Flushes are batched: one happens when `flush_messages` messages are pending or the oldest of
them has waited `flush_interval_ms` (checked on append and by the worker at
`local.next_flush_deadline`), and on roll and close. A flush fsyncs when `fsync` is set; a
failed fsync fails the log (every later append, flush and roll raises StorageIOError) until
`reopen_from_disk` cuts it back to the high watermark and opens it again.

Replication (docs/replication.md; docs/storage.md, "Leader epochs and truncation"): the folder's
`leader-epoch-checkpoint` (broker.log.epochs) is loaded on open as `epochs`; `assign_epoch`
adds a leader's entry, `append_replicated` appends a leader's bytes with their entries,
`end_offset_for_epoch` answers OFFSET_FOR_LEADER_EPOCH, `truncate_to` cuts a follower's log
back to an offset (the bytes first, then the history) and `reset_to` empties it to start
elsewhere. A cut that fails once begun fails the log as a failed fsync does.

Crash behaviour (docs/storage.md, "Recovery"): `open` recovers the folder first
(broker.log.recovery: what is trusted, scanned, put back, cut or set aside); reads repair what
they meet (broker.log.local_log). Not safe to share between threads.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Sequence
from pathlib import Path

from broker.clock import SYSTEM_CLOCK, Clock
from broker.errors import MessageTooLarge, StorageError
from broker.log.codec import check_sets, converted, validate_message_set
from broker.log.compression import Compressor, compressor_for
from broker.log.config import LogConfig
from broker.log.epochs import NO_EPOCH, LeaderEpochs
from broker.log.fsdir import make_directory
from broker.log.local_log import LocalLog
from broker.log.message import Buffer
from broker.log.producers import ProducerStates, StoredSet
from broker.log.recovery import RecoveryReport, list_files, recover_folder
from broker.log.segment import Segment

log = logging.getLogger(__name__)


class SetsToOpen(Exception):
    """An append with `expand` false met a producer's compressed sets, which it would have to
    decompress and check (about 45 ms for the 64 MiB a few KB may hold): nothing changed, and
    the caller appends the set again with `expand` true when that work's turn comes (the
    broker's worker takes its clients' in turn: broker.expansions)."""


def replicated_epochs(
    name: str, log_end: int, offset: int, size: int, epochs: Sequence[tuple[int, int]]
) -> list[tuple[int, int]]:
    """The entries `PartitionLog.append_replicated` gives the history of partition `name`,
    whose log ends at `log_end`, for `size` bytes at `offset` with the leader's `epochs` (its
    rules; ValueError as it raises for an offset that is not the log end or an entry past the
    bytes' end): a follower that writes them beforehand (broker.log.epochs.assign_together)
    leaves the append nothing to write."""
    if offset != log_end:
        raise ValueError(
            f"{name}: replicated bytes start at {offset}, not at the log end {log_end}"
        )
    end = offset + size
    entries = [(epoch, max(start, offset)) for epoch, start in epochs]
    for (epoch, start), (_, given) in zip(entries, epochs, strict=True):
        if start > end:
            raise ValueError(
                f"{name}: leader epoch {epoch} starts at {given}, past the end {end} of the "
                "bytes it came with"
            )
    while len(entries) > 1 and entries[1][1] == offset:
        del entries[0]
    return entries


def _check_entries(name: str, offset: int, end: int, producers: Sequence[StoredSet]) -> None:
    """ValueError unless each of `producers` is a set of the bytes [`offset`, `end`) of
    partition `name`, after the one before it."""
    at = offset
    for entry in producers:
        if not offset <= at <= entry.offset < entry.end <= end:
            raise ValueError(
                f"{name}: producer entry [{entry.offset}, {entry.end}) is not a set of the "
                f"bytes [{offset}, {end}) after {at}"
            )
        at = entry.end


class PartitionLog:
    """One partition folder: appends checked and kept in step with the leader epochs and the
    producers' entries, over `local`'s segments (flushes, reads, retention). Use `open`."""

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
        self.recovery = recovery
        self.local = LocalLog(directory, config, clock, segments)
        """The segments: appends, flushes, reads, rolls, cuts, retention (broker.log.local_log);
        `local.config` the topic's settings, `local.failure` why the log failed."""
        self.epochs = LeaderEpochs(directory) if epochs is None else epochs
        """The folder's leader-epoch history (broker.log.epochs), loaded by `open`, cut by
        `truncate_to` and `reset_to`, added to by `assign_epoch` and `append_replicated`."""
        self.producers = producers or ProducerStates(
            directory, segments[-1].base_offset, directory.name, clock
        )
        """The idempotent producers' last sets (broker.log.producers), loaded by `open`,
        added to by `append_idempotent`, cut by `truncate_to` and `reset_to`."""
        self._clock = clock
        self._compressors: dict[str, Compressor | None] = {}
        """The compressor of the topic's `compression` (None for none), made when first used."""

    @classmethod
    def open(
        cls,
        directory: Path,
        config: LogConfig | None = None,
        clock: Clock = SYSTEM_CLOCK,
        sync: bool = True,
    ) -> PartitionLog:
        """Open (creating if needed) the partition folder, recovering it after a crash. What
        it creates (the folder, a first segment) is fsynced into its directory, unless `sync`
        is False: then the caller makes it durable before the log is written to or served
        (broker.log.fsdir.sync_created: one syncfs for many new partitions)."""
        config = config or LogConfig()
        make_directory(directory, sync)
        files = list_files(directory)  # as found: recovery changes no file the others read
        segments, report = recover_folder(directory, config, sync, files)
        epochs = LeaderEpochs.load(directory, segments[-1].end_offset, files)
        report = dataclasses.replace(report, problems=report.problems + tuple(epochs.problems))
        end = segments[-1].end_offset
        bases = [s.base_offset for s in segments]
        producers = ProducerStates.load(directory, bases, end, directory.name, clock, files)
        return cls(directory, config, clock, segments, report, epochs, producers)

    # -- offsets ---------------------------------------------------------------------------

    @property
    def log_start_offset(self) -> int:
        return self.local.start

    @property
    def flushed_offset(self) -> int:
        """The end of the flushed messages: what a partition of one replica serves up to, and
        what a leader's high watermark is computed from (Replica.high_watermark)."""
        return self.local.flushed

    @property
    def log_end_offset(self) -> int:
        return self.local.end_offset

    @property
    def segments(self) -> list[Segment]:
        """The segments, oldest first (do not modify the list)."""
        return self.local.segments

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
        false, a flush the append makes due (`local.flush_due`) is the caller's to make: the
        broker's worker makes one for all the requests it was passed at once. With `expand`
        false, a set that holds compressed sets raises SetsToOpen instead, nothing changed."""
        return self._append(
            message_set, self.local.config.max_message_bytes, flush, (), True, expand=expand
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
        self.local.refuse_if_failed()
        repeated = self.producers.check(producer_id, epoch, sequence, client)
        if repeated is not None:
            return repeated, False
        stamp = (producer_id, epoch, sequence)
        limit = self.local.config.max_message_bytes
        offset, count = self._append(
            message_set, limit, flush, (), True, None, stamp, expand=expand
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
        `offset` are passed over (`replicated_epochs`). ValueError, before anything changes,
        for an entry past the bytes' end or one `LeaderEpochs.assign_all` refuses (an epoch
        below the latest: the follower did not truncate first).

        The bytes are checked as a producer's are (framing and checksums, InvalidMessage),
        but by the format's limits and `segment_bytes` only, never by `max_message_bytes`:
        the leader stored them, and a setting lowered since must not stop a follower
        (MessageTooLarge for a set larger than `segment_bytes`). Then the entries are written
        (one write of the history), and only then the bytes: a crash between leaves entries
        that start past the log end, which `open` drops, never bytes without their epoch.
        An append that then fails (DiskFull, StorageIOError) takes the new entries back (an
        entry at the log end stays); if that write fails too, the log fails as after a failed
        fsync (`reopen_from_disk`). Flushes as `append_counted` does."""
        name, size = self.directory.name, len(message_set)
        entries = replicated_epochs(name, self.log_end_offset, offset, size, epochs)
        _check_entries(name, offset, offset + size, producers)
        return self._append(
            message_set, self.local.config.segment_bytes, flush, entries, False, producers=producers
        )[1]

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
        local = self.local
        local.refuse_if_failed()
        config = local.config
        size = len(message_set)
        if size > config.segment_bytes:
            raise MessageTooLarge("message set", size, config.segment_bytes)
        roll, next_mark = local.placement(size)
        checked = validate_message_set(
            message_set, max_message_bytes, config.index_interval_bytes, next_mark
        )
        if producer:
            # A producer's compressed sets are opened and checked (a leader's bytes were), and
            # the set is stored as the topic's compression says (broker.log.codec.converted,
            # None: as it came); `count`: its messages.
            if checked.first_set >= 0 and not expand:
                raise SetsToOpen(self.directory.name)
            count = check_sets(message_set, checked, max_message_bytes)
            wanted = config.compression
            if wanted != "producer":
                if wanted not in self._compressors:
                    self._compressors = {wanted: compressor_for(wanted)}
                stored = converted(message_set, checked, self._compressors[wanted])
                if stored is not None:
                    return self._append(
                        stored, config.segment_bytes, flush, epochs, False, count, stamp
                    )
        elif count is None:
            count = checked.message_count
        if roll:
            self.roll()
        offset = local.end_offset
        if epochs:
            self.epochs.assign_all(epochs)  # before the bytes: never bytes without their epoch
        if stamp is not None:
            producers = (StoredSet(*stamp, offset, offset + size, count),)
        before = self.producers.record(producers) if producers else {}  # never bytes without
        try:
            local.append(message_set, checked, count)
        except StorageError:  # the history's entries past the log end, the sets' entries
            if epochs:
                with local.taking_back("leader epochs"):
                    self.epochs.truncate_from(local.end_offset + 1)
            if producers:
                with local.taking_back("producer entries"):
                    self.producers.take_back(producers, before)
            raise
        if flush and local.flush_due():
            self.flush()
        return offset, count

    def flush(self) -> None:
        """Make every appended message visible to reads (LocalLog.flush: a failed fsync
        fails the log), the producers' entries synced first when the topic fsyncs."""
        local = self.local
        if local.flush_pending and local.config.fsync and self.producers.unsynced:
            local.refuse_if_failed()
            try:
                self.producers.sync()
            except StorageError as error:
                local.fail_flush(error)
                raise
        local.flush()

    def roll(self) -> None:
        """Flush, close the active segment for writes and start a new one where it ends (with
        the producers' entries, synced when the topic fsyncs). DiskFull or StorageIOError when
        its index or the new file cannot be written: then the active segment stays active (a
        later roll tries again)."""
        local = self.local
        self.flush()
        if local.roll():
            if local.config.fsync:
                self.producers.sync()  # the closed segment's entries, as its bytes were
            self.producers.roll(local.segments[-1].base_offset)

    # -- reading ---------------------------------------------------------------------------

    def read(self, offset: int, max_bytes: int, sets: bool = True) -> memoryview:
        """LocalLog.read: whole flushed messages from `offset`, at most `max_bytes`."""
        return self.local.read(offset, max_bytes, sets)

    def offset_for_timestamp(self, timestamp_ms: int) -> int:
        """LocalLog.offset_for_timestamp: the first flushed message at or after it."""
        return self.local.offset_for_timestamp(timestamp_ms)

    # -- replication -----------------------------------------------------------------------

    def assign_epoch(self, epoch: int) -> bool:
        """A leader of `epoch` starts at this log's end: entry (epoch, log end) added to the
        history, before anything is appended (`LeaderEpochs.assign`: nothing when `epoch` is
        the latest; ValueError for one below it). StorageIOError for a failed log; DiskFull
        or StorageIOError when the history cannot be written (nothing changed)."""
        self.local.refuse_if_failed()
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

        Order, so that a crash anywhere leaves a log `open` reads right: the bytes are cut
        first (LocalLog.cut_to), then the producers' entries, and only then is the epoch
        history written without its entries at or past `offset`. A crash before that leaves
        entries past the new log end, which `open` drops, and one at it, which describes no
        byte and is true of the bytes before it: the history never claims bytes it does not
        have, and no byte past the cut survives while the history says it is gone.

        StorageIOError at once for a failed log. DiskFull or StorageIOError once the cut has
        begun fails the log, as a failed fsync does: `reopen_from_disk` then finishes the cut
        down to the high watermark, which is at or below `offset` already."""
        local = self.local
        local.refuse_if_failed()
        start, end = self.log_start_offset, self.log_end_offset
        if not start <= offset <= end:
            raise ValueError(
                f"{self.directory.name}: cannot truncate to {offset}, outside the log "
                f"[{start}, {end}]"
            )
        flushed_cut = max(0, local.flushed - offset)
        local.cut_to(offset)
        with local.failing_on(f"truncating to {offset}"):
            if offset < end:
                self.producers.truncate(local.segment_for(offset).base_offset, offset)
            self.epochs.truncate_from(offset)
        log.log(
            logging.WARNING if flushed_cut else logging.INFO,
            "%s: truncated to %d: %d bytes cut, %d of them flushed",
            self.directory.name,
            offset,
            end - offset,
            flushed_cut,
        )
        return end - offset

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
        truncates further, never less), then the segments deleted and the new one created
        (LocalLog.delete_segments, start_at). A crash leaves a prefix of the old log without
        history, or an empty log (at offset 0 when no segment was left: the follower's
        truncation then comes back here). DiskFull or StorageIOError
        once it has begun fails the log, as `truncate_to` says; `reopen_from_disk` then opens
        what is left, cut down to the old log start."""
        local = self.local
        local.refuse_if_failed()
        if start_offset < 0:
            raise ValueError(f"{self.directory.name}: cannot start at {start_offset}")
        dropped = self.log_end_offset - self.log_start_offset
        local.flushed = local.start  # nothing is read from now on
        with local.failing_on(f"resetting to {start_offset}"):
            self.epochs.clear_and_start(start_offset, epoch)
            local.delete_segments()
            self.producers.reset(start_offset)
            local.start_at(start_offset)
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
        self.local.refuse_if_failed()
        if self.log_start_offset == self.log_end_offset < offset:
            latest = self.epochs.latest_epoch
            self.reset_to(offset, latest if latest != NO_EPOCH else None)
            return offset
        return self.local.move_start(offset)

    # -- lifetime --------------------------------------------------------------------------

    def close(self, flush: bool = True) -> None:
        """Flush, store the active segment's index (a clean close: LocalLog.close) and the
        producers' entries, and release every file.

        With flush=False (a log about to be deleted), and after a failed flush, it only
        releases the files: it writes nothing, so neither a full nor a failing disk stops it.
        """
        local = self.local
        try:
            clean = flush and local.failure is None
            local.close(clean)
            if clean and local.config.fsync:
                self.producers.sync()
        finally:
            self.producers.close()

    def reopen_from_disk(self) -> PartitionLog:
        """After a failed flush: the folder opened again from what the disk holds.

        Releases every file without flushing, cuts what was appended past the high watermark
        and finishes a cut or reset that failed midway (LocalLog.cut_back_files), then `open`s
        the folder, which recovers it. StorageIOError or DiskFull while the disk still fails:
        this log is left closed and failed, and the call can be made again later."""
        self.close(flush=False)
        self.local.cut_back_files()
        reopened = PartitionLog.open(self.directory, self.local.config, self._clock)
        reopened.local.on_flush = self.local.on_flush
        reopened.advance_start(self.log_start_offset)
        return reopened

    def __enter__(self) -> PartitionLog:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
