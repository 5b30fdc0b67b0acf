"""How a worker flushes its partitions (broker.worker; docs/storage.md, "Flush, roll and
retention"), and what a failed flush does.

Flushes happen on count (once flush_messages are pending, when the worker has nothing left to
read, or after FLUSH_DUE_MESSAGES messages from the supervisor: one flush for the requests that
queued during the last one, not a flush each for requests to queue behind), at each
partition's flush deadline (a timer set to the earliest one: `run`), and by group commit: when
producers wait for ack=flushed, the worker flushes their partitions as soon as it has served
every request that has come (`group_commit`), so one flush (and fsync) answers a whole burst and
nobody waits flush_interval_ms on an idle disk. The partitions flushed at one moment are one
round (broker.log.flush_round): their segments synced by one syncfs of the disk, not an fsync
each. The acks a flush gives go back to the supervisor together, as one message.

A failed flush (fsync) takes its partition offline: the page cache can no longer be trusted
(PostgreSQL's fsync lesson), so every producer waiting on that partition's flush is answered
STORAGE_ERROR, never acked; requests for the partition are answered PARTITION_UNAVAILABLE
(retriable) naming the failure; and a task reopens the log from the disk, cut back to its high
watermark (PartitionLog.reopen_from_disk), retrying with back-off (0.1 s doubling to 5 s, each
failed attempt logged) while the disk keeps failing; `reopened` then lets the partition's
role be taken again.
"""

from __future__ import annotations

import itertools
import logging
import math
from collections.abc import Awaitable, Callable, Iterable

import trio

from broker.backoff import Backoff
from broker.clock import Clock
from broker.errors import DISK_ERRORS, PylogError, StorageError, StorageIOError
from broker.log import PartitionLog
from broker.log.flush_round import FlushRound
from broker.log.message import Buffer
from broker.served import Partition, Served

log = logging.getLogger("pylog.worker")

FIRST_REOPEN_DELAY_S = 0.1
MAX_REOPEN_DELAY_S = 5.0
FLUSH_DUE_MESSAGES = 8
"""A flush that flush_messages made due waits for the worker to have nothing left to read, but
for at most this many messages (REQUESTS of up to a few hundred requests) from the supervisor."""
FLUSH_RETRY_S = 0.1
"""The wait before flushes are tried again after one failed without failing its log (no
descriptor to reopen its segment with: EMFILE)."""


class Flusher:
    """The flushes of the partitions of `served`. `reopened(partition)` is awaited once an
    offline partition's log is reopened from the disk."""

    def __init__(
        self,
        served: Served,
        reopened: Callable[[Partition], Awaitable[None]],
        clock: Clock,
        when_idle: bool = False,
    ) -> None:
        self.served = served
        self.reopened = reopened
        self.clock = clock
        """The partition logs' clock, which their flush deadlines are on."""
        self.when_idle = when_idle
        """log.flush_when_idle: every append is flushed by the next group commit."""
        self.deadline_changed = trio.Event()
        """Set when a partition's flush deadline may have moved earlier: `run` looks again."""
        self.timer = trio.CancelScope()
        """The scope `run` sleeps in, its deadline the earliest flush deadline."""
        self.wanted: set[Partition] = set()
        """Partitions to flush once the socket has nothing left to read: ack=flushed waits."""
        self.due: set[Partition] = set()
        """Partitions whose appends made a flush due (flush_messages pending), flushed once the
        socket has nothing left to read, or after FLUSH_DUE_MESSAGES messages from the
        supervisor at the latest: one flush (and fsync) for the requests that queued during
        the last one, so that a flush per request does not queue requests behind fsyncs."""
        self.due_for = 0
        """Messages from the supervisor served since `due` got its first partition."""
        self.round = FlushRound()
        """Syncs the partitions of a flush round together; `watch` each log dir first."""

    def append(
        self,
        partition: Partition,
        message_set: Buffer,
        producer_id: int,
        epoch: int,
        sequence: int,
        expand: bool,
        client: Callable[[], str],
    ) -> tuple[int, int, int]:
        """Append a producer's set to `partition` (Partition.append: its offset, messages and
        end), its flushes kept in step: a disk error takes it offline (on_disk_error) and is
        raised; after an append (not a set sent again), the acks of what a roll flushed are
        owed, the timer set by a new deadline, and a flush made due by flush_messages noted."""
        plog = partition.log
        flushed = plog.flushed_offset
        had_deadline = plog.local.next_flush_deadline() is not None
        try:
            offset, count, end, appended = partition.append(
                message_set, producer_id, epoch, sequence, expand, client
            )
        except DISK_ERRORS as error:
            self.on_disk_error(partition, error)
            raise
        if appended:
            if plog.flushed_offset != flushed:  # a roll flushed what came before
                self.served.owe(partition.note_flush())
            if not had_deadline:
                self.flush_by(plog)
            if self.when_idle:
                self.wanted.add(partition)
            if plog.local.flush_due():  # flush_messages (or the interval) reached
                self.due.add(partition)
        return offset, count, end

    def served_message(self) -> None:
        """After a message of requests from the supervisor: a flush made due waits no longer
        than FLUSH_DUE_MESSAGES of them (busy: not left for the idle)."""
        if self.due:
            self.due_for += 1
            if self.due_for >= FLUSH_DUE_MESSAGES:
                self.flush_partitions(self.take_due())

    def flush(self, partition: Partition, if_due: bool = False) -> bool:
        """Flush a partition (only if due, with `if_due`): `flush_round` of it alone. Whether
        it did not fail."""
        if if_due and not partition.log.local.flush_due():
            return True
        return self.flush_round([partition])

    def flush_round(self, partitions: Iterable[Partition]) -> bool:
        """Flush `partitions` together (broker.log.flush_round: one syncfs of the disk for all
        their segments), then wake those waiting for each; a partition whose flush failed goes
        offline (see on_disk_error). Whether none failed."""
        of_log = {partition.log: partition for partition in partitions}
        result = self.round.flush(of_log)
        for plog in result.flushed:
            self.served.owe(of_log[plog].note_flush())
        for plog, error in result.failed.items():
            partition = of_log[plog]
            self.on_disk_error(partition, error)
            if partition.offline is None:  # the log did not fail (EMFILE): try again soon
                self.timer.deadline = min(self.timer.deadline, trio.current_time() + FLUSH_RETRY_S)
        for unowned in result.file_system_errors:
            self.served.storage_log.log(
                logging.WARNING,
                "syncfs",
                f"syncing the log dir's file system failed ({unowned}), but no partition flushed "
                "reports it: another file there (one not fsynced, or not pylog's) lost data",
            )
        return not result.failed

    def on_disk_error(self, partition: Partition, error: StorageError) -> None:
        """After a disk error from a partition's log: if its log failed (a flush did), take the
        partition offline, answer every producer waiting on its flush (STORAGE_ERROR: their
        messages are not stored) and start reopening it from the disk."""
        if partition.log.local.failure is None:  # nothing was written wrong: tried again later
            kind = type(error).__name__
            self.served.storage_log.log(logging.ERROR, kind, f"{partition.name}: {error}")
            return
        if partition.offline is not None:
            return
        partition.offline = f"a failed flush ({partition.log.local.failure})"
        log.error("%s is offline: %s", partition.name, error)
        partition.wake_all()
        lost = StorageIOError(
            f"{partition.name}: offline after {partition.offline}: the messages were not "
            "stored (send them again once it is back)"
        )
        self.served.owe(partition.replica.fail_acks(lost))  # never acked
        assert self.served.nursery is not None
        self.served.nursery.start_soon(self._reopen, partition)

    async def _reopen(self, partition: Partition) -> None:
        """Reopen an offline partition's log from the disk (cut back to its high watermark),
        backing off while the disk keeps failing; then serve it again."""
        backoff = Backoff(FIRST_REOPEN_DELAY_S, MAX_REOPEN_DELAY_S)
        for attempt in itertools.count(1):
            if not self.served.still_open(partition):  # deleted meanwhile
                return
            try:
                plog = partition.log.reopen_from_disk()
            except (PylogError, OSError) as error:
                delay = backoff.next()
                log.error(
                    "recovery of %s failed (attempt %d): %s; next attempt in %.1f s",
                    partition.name,
                    attempt,
                    error,
                    delay,
                )
                await trio.sleep(delay)
                continue
            partition.log = plog
            partition.offline = None
            log.info(
                "%s reopened from the disk, its log ends at %d", partition.name, plog.log_end_offset
            )
            log_recovery(partition.name, plog)
            self.deadline_changed.set()
            await self.reopened(partition)
            return

    async def group_commit(self) -> None:
        """Flush the partitions that producers wait on (ack=flushed), now that every request
        that came has been served, and send their acks: one flush (and fsync) answers the
        whole burst, and a producer does not wait flush_interval_ms for a disk that is idle."""
        wanted, self.wanted = self.wanted, set()
        self.flush_partitions(wanted | self.take_due())
        await self.served.send_owed()

    def take_due(self) -> set[Partition]:
        """The partitions whose flush_messages are pending, now taken to be flushed."""
        due, self.due, self.due_for = self.due, set(), 0
        return due

    def flush_partitions(self, partitions: set[Partition]) -> None:
        """Flush those of `partitions` still served and online, in one round."""
        self.flush_round(p for p in partitions if self.served.still_open(p) and p.offline is None)

    def flush_by(self, plog: PartitionLog) -> None:
        """Have `run` wake by `plog`'s flush deadline, which it has just been given:
        its timer moved earlier if need be, without waking it now. (At ack=flushed every group
        commit leaves a partition without a deadline, so each round gives it a new one.)"""
        deadline = plog.local.next_flush_deadline()
        if deadline is not None:
            # The deadlines are on the partition logs' clock, not on trio's.
            at = trio.current_time() + deadline - self.clock.monotonic()
            if at < self.timer.deadline:
                self.timer.deadline = at

    async def run(self) -> None:
        """Flush each partition when its oldest pending message has waited flush_interval_ms."""
        failed = False
        while True:
            self.deadline_changed = trio.Event()
            deadlines = [
                p.log.local.next_flush_deadline()
                for p in self.served.partitions.values()
                if p.offline is None
            ]
            due = min((d for d in deadlines if d is not None), default=math.inf)
            # The deadlines are on the partition logs' clock, not on trio's,
            # which has another origin: wait for the interval left, not until the instant.
            # After a flush that failed, FLUSH_RETRY_S: not at once (a spin until it works), and
            # not at a deadline an hour away when producers wait for it.
            wait_s = FLUSH_RETRY_S if failed else max(0.0, due - self.clock.monotonic())
            with trio.move_on_after(wait_s) as self.timer:
                await self.deadline_changed.wait()
            failed = not self.flush_round(  # with those producers wait on (EMFILE before)
                p
                for p in list(self.served.partitions.values())
                if p.offline is None and (p.replica.acks or p.log.local.flush_due())
            )
            await self.served.send_owed()


def log_recovery(name: str, plog: PartitionLog) -> None:
    """Log what opening a partition's log found (PartitionLog.recovery): nothing for a log
    closed cleanly or cut by nothing (its newest segment is scanned all the same), so that a
    broker of thousands of partitions starts with a line a worker (Worker._open_in_chunks)."""
    report = plog.recovery
    for problem in report.problems:
        log.warning("recovery of %s: %s", name, problem)
    if report.bytes_truncated or report.bad_files:
        log.info(
            "opened %s: scanned %d segments, truncated %d bytes, set aside %d files",
            name,
            report.segments_scanned,
            report.bytes_truncated,
            len(report.bad_files),
        )
