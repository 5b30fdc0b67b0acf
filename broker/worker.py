"""A worker: one process, one trio loop, owning a partition group (the partitions of one log
directory, or a share of them with `workers_per_dir`).

It connects a DEALER socket to the supervisor's ipc endpoint for it and serves what arrives
(see broker.transport for the frames):

- PRODUCE appends the validated message set to the partition log as it came. ack=none sends no
  reply; ack=written replies once appended; ack=flushed replies once a flush has made the
  messages durable (fsync, if configured) and visible.
- FETCH reads whole flushed messages from the page cache (an mmap view, sent without copying),
  at most broker.fetch_max_bytes of them (but the first message whole, when it fits in the
  request's max_bytes), so that no reply is larger than the front is prepared to hold.
  When fewer than min_bytes lie past the offset it waits, up to max_wait_ms, for the flush that
  brings them: a long poll woken by that flush, not by polling, and not by the flushes before
  it (FlushWaiters).
- OFFSETS answers earliest, latest (the high watermark) or the first offset at a time.
- DESCRIBE_PARTITION answers a partition's offsets, size, segments, oldest timestamp and the
  settings in effect.
- Commands from the supervisor open partitions (recovering them), delete topics, and change a
  topic's settings on its open partitions (PartitionLog.reconfigure; a flush they make due
  happens at once).

Flushes happen on count (once flush_messages are pending, when the worker has nothing left to
read, or after FLUSH_DUE_MESSAGES messages from the supervisor: one flush for the requests that
queued during the last one, not a flush each for requests to queue behind), at each
partition's flush deadline (a timer set to the earliest one), and by group commit: when
producers wait for ack=flushed, the worker flushes their partitions as soon as it has served
every request that has come, so one flush (and fsync) answers a whole burst and nobody waits
flush_interval_ms on an idle disk. The acks a flush gives go back to the supervisor together,
as one message.
Retention runs every retention_check_interval_ms. After a change of a
partition's log start or high watermark the worker reports them, at most every 0.2 s, so the
supervisor can answer metadata requests.

A failed flush (fsync) takes its partition offline: the page cache can no longer be trusted
(PostgreSQL's fsync lesson), so every producer waiting on that partition's flush is answered
STORAGE_ERROR, never acked; requests for the partition are answered PARTITION_UNAVAILABLE
(retriable) naming the failure; and a task reopens the log from the disk, cut back to its high
watermark (PartitionLog.reopen_from_disk), retrying with back-off (0.1 s doubling to 5 s, each
failed attempt logged) while the disk keeps failing. Storage errors answered to requests
(DISK_FULL, STORAGE_ERROR, an OSError such as EMFILE turned into the latter) are logged at most
once per STORAGE_LOG_EVERY_S per kind. Deleting a topic releases its logs without writing
anything (no flush, no index), so a full disk cannot stop it, and removes their folders.

On SIGTERM or SIGINT it flushes every log and answers the producers waiting for that flush,
then stops, closes every log and exits 0. A supervisor that dies, even by SIGKILL, has the
kernel send its workers SIGTERM (PR_SET_PDEATHSIG), so none is left holding its partitions.
With `[metrics] enabled` it counts requests, errors and their time by api, flush durations and
each partition's traffic (broker.worker_stats) and sends the supervisor a snapshot every
STATS_EVERY_S, which serves them (broker.metrics).
Flow control: the worker gives the supervisor back the bytes of the requests it has served
(CREDIT, broker.transport), so the front holds back requests, not the worker's memory, when
the worker falls behind.
The page cache, not the worker, holds recent data, so a restarted worker serves reads as fast
as the one before it.
"""

from __future__ import annotations

import argparse
import itertools
import json
import logging
import math
import shutil
import signal
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import trio
import zmq

from broker import protocol
from broker.clock import SYSTEM_CLOCK
from broker.config import TOPIC_SETTINGS, BrokerConfig
from broker.errors import (
    DiskFull,
    FencedLeaderEpoch,
    FetchSizeTooSmall,
    NotEnoughReplicas,
    NotLeaderForPartition,
    OffsetOutOfRange,
    PartitionUnavailable,
    PylogError,
    StorageError,
    StorageIOError,
    UnknownLeaderEpoch,
    UnknownTopicOrPartition,
    UnsupportedApi,
)
from broker.flush_waiters import FlushWaiters
from broker.log import PartitionLog
from broker.log.config import LogConfig
from broker.log.files import OPEN_FILES
from broker.log.hwcheckpoint import HighWatermarkCheckpoint
from broker.log.message import HEADER_SIZE, Buffer, timestamp_at
from broker.log.segment import storage_error
from broker.logs import configure_logging
from broker.processes import exit_with_supervisor
from broker.ratelog import RateLimitedLog
from broker.replication.follower import Follower, Role, replica_keys
from broker.replication.leader import LeaderState, epoch_entries
from broker.replication.lease import Lease
from broker.transport import (
    COMMAND,
    CREDIT_EVERY_BYTES,
    CREDIT_IDLE_S,
    STATE,
    TrioSocket,
    credit_frames,
    json_frame,
    receive_from_supervisor,
    replies_message,
)
from broker.worker_stats import STATS_EVERY_S, WorkerStats

log = logging.getLogger("pylog.worker")

ANSWER_TIMEOUT_S = 5.0
FIRST_REOPEN_DELAY_S = 0.1
MAX_REOPEN_DELAY_S = 5.0
STORAGE_LOG_EVERY_S = 5.0
FLUSH_DUE_MESSAGES = 8
"""A flush that flush_messages made due waits for the worker to have nothing left to read, but
for at most this many messages (REQUESTS of up to a few hundred requests) from the supervisor."""
FLUSH_RETRY_S = 0.1
"""The wait before flushes are tried again after one failed without failing its log (no
descriptor to reopen its segment with: EMFILE)."""
DISK_ERRORS = (DiskFull, StorageIOError)
"""What the disk or the file table says (not what a request got wrong)."""
_checkpoint_log = RateLimitedLog(log, STORAGE_LOG_EVERY_S)


Reply = tuple[bytes, Buffer]
"""A one-frame reply (an ack, an error) and the tagged identity it goes to."""


class PendingAck(NamedTuple):
    """An ack=flushed produce waiting for the flush of its messages, which end at `end`."""

    end: int
    correlation_id: int
    reply: Reply


@dataclass(eq=False)
class Partition:
    """One open partition log, the long polls waiting for its flushes, and the acks."""

    topic: str
    number: int
    log: PartitionLog
    waiters: FlushWaiters = field(default_factory=FlushWaiters)
    acks: deque[PendingAck] = field(default_factory=deque)
    """The ack=flushed produces waiting for a flush, in the order of their offsets: a flush
    answers a prefix of them. Plain entries, not a task each: with a hundred batches in flight
    a task per ack was a third of the worker's CPU."""
    offline: str | None = None
    """Why the partition is offline (a flush failed), until its log is reopened from the disk."""
    replicated: bool = False
    """Whether it has other replicas (a role command said so): then only its leader serves
    clients, and they see up to the high watermark the in-sync replicas agree on."""
    leader: LeaderState | None = None
    """Its followers, the ISR and the high watermark, while it leads here."""
    known_leader: int = -1
    leader_epoch: int = -1
    leader_broker_epoch: int = -1
    """The leader, leader epoch and the leader's broker epoch (its incarnation) as the
    partition's state node last said."""
    lease: Lease = field(default_factory=Lease)
    """The worker's lease: a leader here acts only while it covers its incarnation."""
    min_insync: int = 1
    follower: Follower | None = None
    following: trio.CancelScope | None = None
    """The copy loop from the leader, while it follows, and the scope that cancels it."""
    checkpoint: HighWatermarkCheckpoint | None = None
    """Where `high_watermark_seen` is kept across restarts (broker.log.hwcheckpoint)."""
    high_watermark_seen: int = 0
    """The replicated high watermark as last known here (led, or told by the leader), kept in
    `checkpoint`: where the high watermark starts when this replica becomes the leader."""
    consumers: FlushWaiters = field(default_factory=FlushWaiters)
    """The consumers' long polls on a replicated partition led here: woken by the high
    watermark (`waiters` are woken by this log's flushes: the followers' long polls)."""
    all_acks: deque[PendingAck] = field(default_factory=deque)
    """The ack=all produces waiting for the high watermark, in the order of their offsets."""
    role: dict[str, Any] | None = None
    """The last role command (its state node as the supervisor read it)."""
    messages_in: int = 0
    bytes_in: int = 0
    bytes_out: int = 0
    """Messages and bytes appended, and bytes of messages fetched (broker.worker_stats)."""

    @property
    def name(self) -> str:
        return f"{self.topic}-{self.number}"

    @property
    def high_watermark(self) -> int:
        """What consumers may read up to: the replicated high watermark while it leads a
        replicated partition, else its log's flushed end."""
        leader = self.leader
        return self.log.high_watermark if leader is None else leader.high_watermark

    def note_flush(self, replies: list[Reply]) -> None:
        """Wake the long polls whose min_bytes the high watermark a flush reached brought, and
        add to `replies` the acks of the produces whose messages it stored."""
        high_watermark = self.log.high_watermark
        self.waiters.note_high_watermark(high_watermark)
        acks = self.acks
        if acks and acks[0].end <= high_watermark and self.replicated and not self.leads():
            _fail(acks, self.fenced(), replies)  # it may have been replaced: no ack
        while acks and acks[0].end <= high_watermark:
            replies.append(acks.popleft().reply)
        if self.leader is not None:
            self.advance(replies)

    def advance(self, replies: list[Reply]) -> None:
        """Recompute the replicated high watermark (a flush here, or a follower's fetch); if
        it moved, wake the consumers' long polls it satisfies and answer the ack=all produces
        it covers."""
        leader = self.leader
        assert leader is not None
        if not leader.advance(self.log.high_watermark):
            return
        high_watermark = leader.high_watermark
        self.see_high_watermark(high_watermark)  # kept before anyone is told of it
        self.consumers.note_high_watermark(high_watermark)
        acks = self.all_acks
        if acks and acks[0].end <= high_watermark and not self.leads():
            _fail(acks, self.fenced(), replies)  # it may have been replaced: no ack
        while acks and acks[0].end <= high_watermark:
            replies.append(acks.popleft().reply)

    def see_high_watermark(self, high_watermark: int) -> None:
        """Note the replicated high watermark (led here, or told by the leader) and keep it in
        the checkpoint; a checkpoint the disk refuses is logged (a restart may then start the
        high watermark lower: it rises as followers fetch)."""
        self.high_watermark_seen = high_watermark
        if self.checkpoint is not None:
            try:
                self.checkpoint.write(high_watermark)
            except OSError as error:
                _checkpoint_log.log(logging.ERROR, "checkpoint", f"{self.name}: {error}")

    def fail_acks(self, error: PylogError, replies: list[Reply]) -> None:
        """Answer every waiting ack (ack=flushed and ack=all) `error` instead: its messages
        will not be stored, or not as promised."""
        _fail(self.acks, error, replies)
        _fail(self.all_acks, error, replies)

    def wake_all(self) -> None:
        """Wake every long poll (followers' and consumers'): the partition is deleted, offline,
        or closing."""
        self.waiters.wake_all()
        self.consumers.wake_all()

    def leads(self) -> bool:
        """Whether it leads here now: a leader's term, and the lease covering the incarnation
        it was given to (broker.replication.lease)."""
        return self.leader is not None and self.lease.covers(
            self.leader_broker_epoch, time.monotonic()
        )

    def fenced(self) -> NotLeaderForPartition:
        """What a leader whose lease does not cover it answers: another may lead now, for all
        it can tell (leader -1: not known)."""
        return NotLeaderForPartition(self.name, -1, self.leader_epoch)

    def not_leader(self) -> NotLeaderForPartition:
        return NotLeaderForPartition(self.name, self.known_leader, self.leader_epoch)

    def check_leader(self) -> None:
        """NotLeaderForPartition unless clients (and followers) may be served here: a
        replicated partition only by its leader, under its lease."""
        if self.replicated and not self.leads():
            raise self.not_leader() if self.leader is None else self.fenced()


class Worker:
    """The partitions of one group and the loop that serves them."""

    def __init__(self, index: int, config: BrokerConfig, socket: TrioSocket[list[bytes]]) -> None:
        self.index = index
        self.config = config
        self.socket = socket
        self.partitions: dict[tuple[str, int], Partition] = {}
        self._deadline_changed = trio.Event()
        self._flush_timer = trio.CancelScope()
        """The scope _flush_when_due sleeps in, its deadline the earliest flush deadline."""
        self.nursery: trio.Nursery | None = None
        self.unanswered_errors = 0
        """Failed produce requests with ack=none, which get no reply: logged and counted."""
        self._flush_wanted: set[Partition] = set()
        """Partitions to flush once the socket has nothing left to read: ack=flushed waits."""
        self._flush_due: set[Partition] = set()
        """Partitions whose appends made a flush due (flush_messages pending), flushed once the
        socket has nothing left to read, or after FLUSH_DUE_MESSAGES messages from the
        supervisor at the latest: one flush (and fsync) for the requests that queued during
        the last one, so that a flush per request does not queue requests behind fsyncs."""
        self._due_for = 0
        """Messages from the supervisor served since _flush_due got its first partition."""
        self.lease = Lease()
        """The lease the supervisor last renewed, shared by every partition here."""
        self._lease_renewed = trio.Event()
        self._state_messages: list[list[bytes]] = []
        """STATE messages for the supervisor made where nothing may be sent (ISR changes to
        ask for), sent by _send_replies."""
        self._replies: list[Reply] = []
        """Replies made where nothing may be sent (acks a flush answered, or failed), sent by
        _send_replies from the loop or the task that flushed."""
        self._storage_log = RateLimitedLog(log, STORAGE_LOG_EVERY_S)
        self._served_bytes = 0
        """Bytes of request frames served and not yet given back to the supervisor (CREDIT)."""
        workers = len(config.log_dir_paths) * config.broker_workers_per_dir
        self._credit_step = min(
            CREDIT_EVERY_BYTES, max(1, config.broker_queued_request_bytes // (2 * workers))
        )
        """Served bytes given back at once: at most half the front's limit over all workers
        held back, so credit held back alone never stops the front reading."""
        self._fetch_max_bytes = config.broker_fetch_max_bytes
        """broker.fetch_max_bytes, read once (BrokerConfig looks a setting up by name)."""
        self._credit_owed = trio.Event()
        """Set when served bytes wait for _give_credit_when_idle."""
        self.stats = WorkerStats()

    # -- the loop --------------------------------------------------------------------------

    async def serve(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            self.nursery = nursery
            nursery.start_soon(self._flush_when_due)
            nursery.start_soon(self._apply_retention)
            nursery.start_soon(self._give_credit_when_idle)
            nursery.start_soon(self._check_isrs)
            nursery.start_soon(self._lapse_leaders)
            if self.config.metrics_enabled:
                nursery.start_soon(self._report_stats)
            await self.socket.send([STATE, json_frame({"hello": self.index})])
            task_status.started()
            while True:
                frames = await self.socket.receive(on_idle=self._group_commit)
                if frames[0] == COMMAND:
                    await self._run_command(json.loads(frames[1]))
                    continue
                # requests, each a client's tagged identity and its frame
                for i in range(1, len(frames), 2):
                    await self._serve_request(frames[i], frames[i + 1 : i + 2])
                    self._served_bytes += len(frames[i + 1])
                if self._flush_due:
                    self._due_for += 1
                    if self._due_for >= FLUSH_DUE_MESSAGES:  # busy: not left for the idle
                        self._flush_partitions(self._take_due())
                if self._replies or self._state_messages:  # acks, failures, ISR changes
                    await self._send_replies()
                if self._served_bytes >= self._credit_step:
                    await self._give_credit()
                elif not self._credit_owed.is_set():
                    self._credit_owed.set()

    async def _give_credit(self) -> None:
        served, self._served_bytes = self._served_bytes, 0
        await self.socket.send(credit_frames(served))  # wakes receive(), as any send must

    async def _give_credit_when_idle(self) -> None:
        """Give back what was served, CREDIT_IDLE_S after the first bytes of it were: a worker
        that falls idle owes the front nothing for long, with no message a request."""
        while True:
            await self._credit_owed.wait()
            await trio.sleep(CREDIT_IDLE_S)
            self._credit_owed = trio.Event()
            if self._served_bytes:
                await self._give_credit()

    async def flush_and_answer(self, timeout_s: float) -> None:
        """Flush every partition and give the producers waiting for a flush their acks (for a
        clean shutdown: their messages are durable, so they are told so; if the flush fails,
        that they were not stored), waiting at most `timeout_s` for the supervisor to take
        them."""
        for partition in list(self.partitions.values()):
            if partition.offline is None:
                self._flush(partition)
        with trio.move_on_after(timeout_s):
            await self._send_replies()

    def close(self) -> None:
        """Flush and close every partition log (a clean close: indexes written)."""
        for partition in self.partitions.values():
            try:
                partition.log.close()
            except PylogError as error:
                log.error("closing %s-%d: %s", partition.topic, partition.number, error)
            partition.wake_all()
        self.partitions.clear()

    async def _send_replies(self) -> None:
        """Send the replies made where nothing could be sent (self._replies), as one REPLIES
        message: a hundred acks of one flush cost the worker one send and the supervisor one
        receive."""
        replies, self._replies = self._replies, []
        if replies:
            await self.socket.send(replies_message(replies))
        messages, self._state_messages = self._state_messages, []
        for message in messages:
            await self.socket.send(message)

    # -- requests --------------------------------------------------------------------------

    async def _serve_request(self, tagged: bytes, request_frames: list[bytes]) -> None:
        started = time.perf_counter()
        api = "unknown"
        correlation_id: int | None = None
        try:
            produce = protocol.peek_produce(request_frames)  # the hot path: no objects made
            if produce is not None:
                api = "produce"
                correlation_id, route, ack, message_set = produce
                await self._produce(tagged, correlation_id, route, ack, message_set)
                return
            header, request = protocol.decode_request(request_frames)
            api = header.api.name.lower()
            correlation_id = header.correlation_id
            if isinstance(request, protocol.ProduceRequest):
                route = protocol.Route(request.topic, request.partition)
                await self._produce(tagged, correlation_id, route, request.ack, request.message_set)
            elif isinstance(request, protocol.FetchRequest):
                await self._fetch(tagged, correlation_id, request, header.version)
            elif isinstance(request, protocol.OffsetForLeaderEpochRequest):
                partition = self._partition(request.topic, request.partition)
                partition.check_leader()
                epoch, end = partition.log.end_offset_for_epoch(request.leader_epoch)
                answer = protocol.OffsetForLeaderEpochReply(epoch, end)
                await self._reply(tagged, protocol.encode_reply(correlation_id, answer))
            elif isinstance(request, protocol.OffsetsRequest):
                reply = protocol.OffsetsReply(self._offset_at(request))
                await self._reply(tagged, protocol.encode_reply(correlation_id, reply))
            elif isinstance(request, protocol.DescribePartitionRequest):
                described = self._describe(request)
                await self._reply(tagged, protocol.encode_reply(correlation_id, described))
            else:
                raise UnsupportedApi(f"{type(request).__name__} is served by the front socket")
        except Exception as error:  # every failure is answered; the worker keeps serving
            if isinstance(error, OSError):  # the disk or the file table (EMFILE) said no
                error = storage_error(error, f"worker {self.index}")
            self.stats.failed(api, protocol.error_code_for(error).name)
            if isinstance(error, DISK_ERRORS):
                kind = type(error).__name__
                self._storage_log.log(logging.ERROR, kind, f"worker {self.index}: {error}")
            elif not isinstance(error, PylogError):
                log.exception("worker %d: unexpected error serving a request", self.index)
            if protocol.is_fire_and_forget(request_frames):
                self.unanswered_errors += 1
                message = f"worker {self.index}: produce with ack=none failed: {error}"
                self._storage_log.log(logging.WARNING, "ack=none", message)
            else:
                if correlation_id is None:  # the request did not decode
                    correlation_id = protocol.peek_correlation_id(request_frames)
                await self._reply(tagged, protocol.encode_error(correlation_id, error))
        finally:
            self.stats.served(api, time.perf_counter() - started)

    def _still_open(self, partition: Partition) -> bool:
        """Whether `partition` is still served here (not deleted, the worker not closing)."""
        return self.partitions.get((partition.topic, partition.number)) is partition

    def _partition(self, topic: str, number: int) -> Partition:
        """The partition, if served: UnknownTopicOrPartition if not here, PartitionUnavailable
        while it is offline."""
        try:
            partition = self.partitions[(topic, number)]
        except KeyError:
            raise UnknownTopicOrPartition(
                f"partition {number} of topic {topic!r} is not on this broker"
            ) from None
        if partition.offline is not None:
            raise PartitionUnavailable(
                f"{partition.name} is offline after {partition.offline}; it is being reopened "
                "from the disk: retry shortly"
            )
        return partition

    async def _produce(
        self,
        tagged: bytes,
        correlation_id: int,
        route: protocol.Route,
        ack: int,
        message_set: Buffer,
    ) -> None:
        partition = self._partition(*route)
        leader = partition.leader
        if partition.replicated:
            partition.check_leader()  # led here, under the lease
            assert leader is not None
            if ack == protocol.Ack.ALL and len(leader.isr) < partition.min_insync:
                raise NotEnoughReplicas(partition.name, len(leader.isr), partition.min_insync)
        plog = partition.log
        high_watermark = plog.high_watermark
        had_deadline = plog.next_flush_deadline() is not None
        try:
            offset, count = plog.append_counted(message_set, flush=False)
        except DISK_ERRORS as error:
            self._on_disk_error(partition, error)
            raise
        partition.messages_in += count
        partition.bytes_in += len(message_set)
        end = plog.log_end_offset
        if plog.high_watermark != high_watermark:  # a roll flushed what came before
            partition.note_flush(self._replies)
        if not had_deadline:
            self._flush_by(plog)
        if plog.flush_due():  # flush_messages (or the interval) reached: see _flush_due
            self._flush_due.add(partition)
        if ack == protocol.Ack.NONE:
            return
        reply = protocol.ProduceReply(offset, count)
        frames = protocol.encode_reply(correlation_id, reply)
        if ack == protocol.Ack.ALL and leader is not None:  # replicated: the ISR must have it
            stored, acks = leader.high_watermark >= end, partition.all_acks
        else:  # ack=all of a partition without replicas is ack=flushed
            stored, acks = ack == protocol.Ack.WRITTEN or plog.high_watermark >= end, partition.acks
        if stored:
            await self._reply(tagged, frames)
            return
        # Answered by the flush (or, at ack=all, the high watermark) that stores it
        # (note_flush, advance), or failed (fail_acks). Flushed soon: followers copy only
        # flushed bytes.
        (frame,) = frames
        acks.append(PendingAck(end, correlation_id, (tagged, frame)))
        self._flush_wanted.add(partition)

    async def _fetch(
        self, tagged: bytes, correlation_id: int, request: protocol.FetchRequest, version: int
    ) -> None:
        partition = self._partition(request.topic, request.partition)
        plog = partition.log
        self._check_epoch(partition, request.leader_epoch)
        if request.replica_id >= 0:
            self._follower_fetched(partition, request)
        else:
            partition.check_leader()
        if request.offset <= plog.high_watermark or request.replica_id < 0:
            plog.check_offset(request.offset)  # its errors come first, before any waiting
        if self._fetch_ready(partition, request) or request.max_wait_ms == 0:
            frames = self._fetch_reply(correlation_id, partition, request, version)
            await self._reply(tagged, frames)
            return
        assert self.nursery is not None
        self.nursery.start_soon(
            self._long_poll, partition, tagged, correlation_id, request, version
        )

    @staticmethod
    def _check_epoch(partition: Partition, epoch: int) -> None:
        """A FETCH's leader epoch (-1: not checked) against the partition's, in the order
        docs/protocol.md gives: newer than known here, not led here, older."""
        if epoch < 0:
            return
        if epoch > partition.leader_epoch:
            raise UnknownLeaderEpoch(partition.name, epoch, partition.leader_epoch)
        partition.check_leader()
        if epoch < partition.leader_epoch:
            raise FencedLeaderEpoch(partition.name, epoch, partition.leader_epoch)

    def _follower_fetched(self, partition: Partition, request: protocol.FetchRequest) -> None:
        """A follower's FETCH: check that it may fetch, note where it is (the high watermark
        may move; its ISR membership may change). A follower copies flushed bytes only; its
        offset may lie past the flushed end, up to the log end, where the reply waits for
        the flush."""
        replica = request.replica_id
        partition.check_leader()
        leader = partition.leader
        if leader is None or replica not in leader.followers:  # (None: one replica, this one)
            raise UnknownTopicOrPartition(f"broker {replica} is not a replica of {partition.name}")
        plog = partition.log
        if not plog.log_start_offset <= request.offset <= plog.log_end_offset:
            raise OffsetOutOfRange(request.offset, plog.log_start_offset, plog.log_end_offset)
        leader.record_fetch(
            replica, request.offset, request.flushed_offset, plog.high_watermark, time.monotonic()
        )
        partition.advance(self._replies)
        self._ask_isr(partition, replica)

    async def _long_poll(
        self,
        partition: Partition,
        tagged: bytes,
        correlation_id: int,
        request: protocol.FetchRequest,
        version: int,
    ) -> None:
        # Deleting the partition, taking it offline or a change of its leader wakes every
        # waiter; a flush (or the high watermark), only those whose min_bytes it brought.
        waiters = partition.waiters
        if request.replica_id < 0 and partition.leader is not None:
            waiters = partition.consumers
        with trio.move_on_after(request.max_wait_ms / 1000):
            while self._still_open(partition) and partition.offline is None:
                if self._fetch_ready(partition, request) or (
                    partition.replicated and partition.leader is None  # answered NOT_LEADER
                ):
                    break
                await waiters.wait_high_watermark(request.offset + request.min_bytes)
        try:
            if not self._still_open(partition) or partition.offline is not None:
                self._partition(partition.topic, partition.number)  # raises: deleted or offline
            frames = self._fetch_reply(correlation_id, partition, request, version)
        except PylogError as error:  # deleted, or retention moved the log start past it
            frames = protocol.encode_error(correlation_id, error)
        await self._reply(tagged, frames)

    @staticmethod
    def _fetch_ready(partition: Partition, request: protocol.FetchRequest) -> bool:
        """Whether min_bytes lie past the offset (0: answer at once, even with nothing):
        bytes flushed here for a follower, up to the high watermark for a consumer."""
        end = partition.log.high_watermark if request.replica_id >= 0 else partition.high_watermark
        return end - request.offset >= request.min_bytes

    def _fetch_reply(
        self,
        correlation_id: int,
        partition: Partition,
        request: protocol.FetchRequest,
        version: int,
    ) -> Sequence[Buffer]:
        """At most fetch_max_bytes of messages, but the first message whole if it fits in the
        request's max_bytes: the cap bounds the broker's memory, never stops a consumer. A
        consumer reads up to the high watermark; a follower, whatever is flushed here, with
        the epoch entries of those bytes."""
        plog = partition.log
        replica = request.replica_id >= 0
        # It may have stopped leading (or a newer epoch come) while the fetch waited.
        self._check_epoch(partition, request.leader_epoch)
        partition.check_leader()
        end = plog.high_watermark if replica else partition.high_watermark
        limit = min(request.max_bytes, self._fetch_max_bytes, max(0, end - request.offset))
        data: Buffer = b""
        if limit:
            try:
                data = plog.read(request.offset, limit)
            except FetchSizeTooSmall as error:
                # A follower gets the message whole whatever its max_bytes: it must copy it.
                if error.needed > request.max_bytes and not replica:  # named as asked
                    raise FetchSizeTooSmall(error.offset, request.max_bytes, error.needed) from None
                data = plog.read(request.offset, error.needed)  # over the cap alone: sent whole
        partition.bytes_out += len(data)
        end = request.offset + len(data)
        entries = epoch_entries(plog.epochs.entries, request.offset, end) if replica else ()
        reply = protocol.FetchReply(
            partition.high_watermark, plog.log_start_offset, data, partition.leader_epoch, entries
        )
        return protocol.encode_reply(correlation_id, reply, version)

    def _offset_at(self, request: protocol.OffsetsRequest) -> int:
        partition = self._partition(request.topic, request.partition)
        partition.check_leader()
        plog = partition.log
        if request.time == protocol.LATEST:
            return partition.high_watermark
        if request.time == protocol.EARLIEST:
            return plog.log_start_offset
        return plog.offset_for_timestamp(request.time)

    def _describe(
        self, request: protocol.DescribePartitionRequest
    ) -> protocol.DescribePartitionReply:
        plog = self._partition(request.topic, request.partition).log
        stats = plog.statistics()
        oldest = -1
        if stats.high_watermark > stats.log_start_offset:  # the first segment holds a message
            oldest = timestamp_at(plog.segments[0].view(0, HEADER_SIZE), 0)
        config = plog.config
        settings = protocol.settings_text({key: getattr(config, key) for key in TOPIC_SETTINGS})
        return protocol.DescribePartitionReply(
            stats.log_start_offset,
            stats.high_watermark,
            stats.log_end_offset,
            stats.size_bytes,
            stats.segments,
            oldest,
            settings,
        )

    async def _reply(self, tagged: bytes, frames: Sequence[Buffer]) -> None:
        await self.socket.send([tagged, *frames])

    # -- commands from the supervisor ------------------------------------------------------

    async def _run_command(self, command: dict[str, Any]) -> None:
        op = command.get("op")
        if op == "open":
            opened, failed = [], []
            for topic, number, directory, settings, replicated in command["partitions"]:
                try:
                    config = self.config.log_config(settings)
                    if self._open(topic, number, Path(directory), config):
                        # Replicated: it serves no client until its role says it leads.
                        self.partitions[(topic, number)].replicated = replicated
                    opened.append([topic, number])
                except (PylogError, OSError, ValueError) as error:
                    if isinstance(error, OSError):
                        error = storage_error(error, f"opening {topic}-{number}")
                    log.error("cannot open %s-%d in %s: %s", topic, number, directory, error)
                    code = protocol.error_code_for(error)
                    failed.append([topic, number, code, f"{topic}-{number}: {error}"])
            await self.socket.send([STATE, json_frame({"opened": opened, "failed": failed})])
        elif op == "delete":
            topic = command["topic"]
            for number, folder in command["partitions"]:
                self._delete(topic, number, Path(folder))
            await self.socket.send([STATE, json_frame({"deleted": topic})])
        elif op == "configure":
            self._configure(command["topic"], command["settings"])
        elif op == "role":
            await self._take_role(command)
        elif op == "lease":
            await self._renew_lease(command["until"], command["broker_epoch"])
        else:
            log.error("worker %d: unknown command %r", self.index, command)
        await self._send_replies()  # acks that a delete failed or a new setting's flush made

    async def _take_role(self, command: dict[str, Any]) -> None:
        """A replicated partition's state node, as the supervisor read it (docs/replication.md):
        lead it (a new term: the epoch's entry added to the log's history first), or follow
        the leader it names (a new copy loop, which truncates first), or, with no leader,
        neither. Waiting acks and consumers of a leader that stops leading are answered
        NOT_LEADER_FOR_PARTITION."""
        partition = self.partitions.get((command["topic"], command["partition"]))
        if partition is None:
            return  # not open: a failed open, a delete
        partition.role = command  # taken again once an offline partition is reopened
        me, leader, epoch = self.config.broker_id, command["leader"], command["leader_epoch"]
        partition.replicated = True
        partition.min_insync = command["min_insync_replicas"]
        partition.known_leader, partition.leader_epoch = leader, epoch
        partition.leader_broker_epoch = command["leader_broker_epoch"]
        current, follower = partition.leader, partition.follower
        endpoint, key = command["endpoint"], command.get("curve_key")
        role = Role(leader, endpoint, epoch, key) if endpoint else None
        if follower is not None and follower.role == role:
            return  # following that leader in that epoch already
        if current is not None and current.epoch == epoch and self._mine(command):
            current.set_isr(command["isr"], command["version"])  # an ISR change in this term
            if tuple(command["replicas"]) != current.replicas:  # a reassignment's
                current.set_replicas(command["replicas"], time.monotonic())
            if len(current.isr) < partition.min_insync:  # what waits was promised more
                error = NotEnoughReplicas(partition.name, len(current.isr), partition.min_insync)
                _fail(partition.all_acks, error, self._replies)
            partition.advance(self._replies)
            return
        self._stop_leading(partition)
        self._stop_following(partition)
        if leader == me:
            if not self._mine(command):
                return  # taken again if the lease comes for that incarnation (_renew_lease)
            plog = partition.log
            start = plog.log_end_offset
            try:
                plog.assign_epoch(epoch)
            except (*DISK_ERRORS, ValueError) as error:  # tried again by _check_isrs
                if not isinstance(error, ValueError):
                    self._on_disk_error(partition, error)
                message = f"{partition.name}: cannot lead epoch {epoch} yet: {error}"
                self._storage_log.log(logging.ERROR, "lead", message)
                return
            partition.leader = LeaderState(
                me,
                epoch,
                start,
                command["replicas"],
                command["isr"],
                min(partition.high_watermark_seen, plog.high_watermark),
                self.config.broker_replica_lag_max_ms / 1000,
                time.monotonic(),
                command["version"],
            )
            log.info(
                "%s: leading in epoch %d from offset %d, ISR %s",
                partition.name,
                epoch,
                start,
                command["isr"],
            )
            partition.advance(self._replies)
        elif leader >= 0 and role is not None:
            self._follow(partition, role)

    def _mine(self, role: dict[str, Any]) -> bool:
        """Whether `role` names this broker the leader, in the incarnation the lease was last
        renewed for: a leadership given to an earlier one (before a restart, or a session
        that expired) is not taken; the controller chooses anew once it sees the broker's new
        epoch."""
        return bool(
            role["leader"] == self.config.broker_id
            and role["leader_broker_epoch"] == self.lease.broker_epoch
        )

    async def _renew_lease(self, until: float, broker_epoch: int) -> None:
        """A lease the supervisor renewed. In a new incarnation (the first lease, or one after
        the session expired), each partition's role is taken again: leaderships of the old
        one end, and one given to the new one, read before the lease came, begins."""
        incarnation = broker_epoch != self.lease.broker_epoch
        self.lease.until, self.lease.broker_epoch = until, broker_epoch
        self._lease_renewed.set()
        if incarnation:
            for partition in list(self.partitions.values()):
                if partition.role is not None and partition.offline is None:
                    await self._take_role(partition.role)

    def _stop_leading(self, partition: Partition) -> None:
        if partition.leader is None:
            return
        partition.leader = None
        partition.fail_acks(partition.not_leader(), self._replies)
        partition.wake_all()  # consumers and followers find it not led here and answer so

    def _stop_following(self, partition: Partition) -> None:
        if partition.following is not None:
            partition.following.cancel()
        partition.following = partition.follower = None

    def _follow(self, partition: Partition, role: Role) -> None:
        config = self.config

        async def copied(count: int) -> None:
            partition.messages_in += count
            assert partition.follower is not None
            partition.see_high_watermark(partition.follower.leader_high_watermark)
            if self._flush(partition):  # before the next fetch: it tells the leader
                await self._send_replies()

        follower = Follower(
            config.broker_id,
            partition.topic,
            partition.number,
            lambda: partition.log,
            role,
            config.broker_replica_fetch_max_bytes,
            config.broker_replica_fetch_wait_ms,
            copied,
            lambda: replica_keys(config),
        )
        scope = trio.CancelScope()
        partition.follower, partition.following = follower, scope

        async def run() -> None:
            with scope:
                await follower.run(self.socket.socket.context)

        assert self.nursery is not None
        self.nursery.start_soon(run)

    def _ask_isr(self, partition: Partition, fetched: int | None = None) -> None:
        """Ask the supervisor for the ISR change due (shrink, or expand by `fetched`, the
        follower whose fetch this is), if one is; it writes the state node and its watch
        brings the new ISR back as a role command."""
        leader = partition.leader
        assert leader is not None
        if not partition.leads():  # a leader that may have been replaced changes nothing
            return
        isr = leader.wanted_isr(time.monotonic(), fetched)
        if isr is None:
            return
        log.info("%s: asking for ISR %s (now %s)", partition.name, list(isr), sorted(leader.isr))
        change = [partition.topic, partition.number, leader.epoch, list(isr)]
        self._state_messages.append([STATE, json_frame({"isr": change})])

    async def _check_isrs(self) -> None:
        """Every quarter of replica_lag_max_ms: the followers of the partitions led here that
        stopped catching up leave the ISR (those that fetch are checked as they fetch), and a
        partition this broker should lead but could not start to (its leader epoch could not
        be written) tries again."""
        while True:
            await trio.sleep(self.config.broker_replica_lag_max_ms / 4000)
            for partition in list(self.partitions.values()):
                if partition.leader is not None:
                    self._ask_isr(partition)
                elif (
                    partition.role is not None
                    and self._mine(partition.role)
                    and partition.offline is None
                ):
                    await self._take_role(partition.role)
            await self._send_replies()

    async def _lapse_leaders(self) -> None:
        """When the lease runs out without a renewal: the partitions led here answer their
        waiting acks NOT_LEADER_FOR_PARTITION (leader -1) and wake their long polls, which
        answer so; until a renewal, they serve nothing (Partition.check_leader)."""
        while True:
            renewed = self._lease_renewed = trio.Event()
            left = self.lease.until - time.monotonic()
            if left > 0:
                with trio.move_on_after(left):
                    await renewed.wait()
                if renewed.is_set():
                    continue
            led = [p for p in self.partitions.values() if p.leader is not None]
            if led:
                log.warning(
                    "worker %d: the lease ran out (ZooKeeper has not confirmed this broker): "
                    "its %d led partitions answer NOT_LEADER_FOR_PARTITION until it does",
                    self.index,
                    len(led),
                )
            for partition in led:
                partition.fail_acks(partition.fenced(), self._replies)
                partition.wake_all()
            await self._send_replies()
            await renewed.wait()

    def _open(self, topic: str, number: int, directory: Path, config: LogConfig) -> bool:
        """Open a partition's log; False when it is open already."""
        if (topic, number) in self.partitions:
            return False
        plog = PartitionLog.open(directory / f"{topic}-{number}", config)
        plog.on_flush = self.stats.flush_seconds.observe
        _log_recovery(f"{topic}-{number}", plog)
        checkpoint = HighWatermarkCheckpoint(plog.directory)
        if checkpoint.problem is not None:
            log.warning("%s-%d: %s", topic, number, checkpoint.problem)
        self.partitions[(topic, number)] = Partition(
            topic,
            number,
            plog,
            lease=self.lease,
            checkpoint=checkpoint,
            high_watermark_seen=checkpoint.value,
        )
        self._deadline_changed.set()
        return True

    def _configure(self, topic: str, settings: dict[str, int | None]) -> None:
        """Apply a topic's new settings to its partitions open here, and flush those that
        they make due (a lower flush_messages or flush_interval_ms)."""
        try:
            config = self.config.log_config(settings)
        except ValueError as error:  # checked against the defaults of the broker that took it
            log.error("topic %s: settings %s refused: %s", topic, settings, error)
            return
        for partition in list(self.partitions.values()):
            if partition.topic == topic:
                partition.log.reconfigure(config)
                if partition.offline is None:
                    self._flush(partition, if_due=True)
        self._deadline_changed.set()
        log.info("worker %d: topic %s now uses %s", self.index, topic, settings)

    def _delete(self, topic: str, number: int, folder: Path) -> None:
        """Stop serving a partition (if open here) and remove its folder. Its log is released
        without writing anything, so that a full or failing disk cannot stop a delete."""
        partition = self.partitions.pop((topic, number), None)
        if partition is not None:
            self._stop_following(partition)
            try:
                partition.log.close(flush=False)
            except PylogError as error:
                log.error("closing %s for its delete: %s", partition.name, error)
            partition.wake_all()  # they see it gone and answer
            deleted = UnknownTopicOrPartition(f"{partition.name} was deleted before its flush")
            partition.fail_acks(deleted, self._replies)  # never acked
        try:
            shutil.rmtree(folder)
        except FileNotFoundError:
            return
        except OSError as error:
            log.error("deleting %s: %s", folder, error)
            return
        log.info("deleted partition %s-%d", topic, number)

    def _flush(self, partition: Partition, if_due: bool = False) -> bool:
        """Flush a partition (only if due, with `if_due`) and wake those waiting for it; a
        failed flush takes it offline (see _on_disk_error). Whether it did not fail."""
        try:
            if if_due:
                if not partition.log.flush_if_due():
                    return True
            else:
                partition.log.flush()
        except DISK_ERRORS as error:
            self._on_disk_error(partition, error)
            if partition.offline is None:  # the log did not fail (EMFILE): try again soon
                self._flush_timer.deadline = min(
                    self._flush_timer.deadline, trio.current_time() + FLUSH_RETRY_S
                )
            return False
        partition.note_flush(self._replies)
        return True

    def _on_disk_error(self, partition: Partition, error: StorageError) -> None:
        """After a disk error from a partition's log: if its log failed (a flush did), take the
        partition offline, answer every producer waiting on its flush (STORAGE_ERROR: their
        messages are not stored) and start reopening it from the disk."""
        if partition.log.failure is None:  # nothing was written wrong: tried again later
            kind = type(error).__name__
            self._storage_log.log(logging.ERROR, kind, f"{partition.name}: {error}")
            return
        if partition.offline is not None:
            return
        partition.offline = f"a failed flush ({partition.log.failure})"
        log.error("%s is offline: %s", partition.name, error)
        partition.wake_all()
        lost = StorageIOError(
            f"{partition.name}: offline after {partition.offline}: the messages were not "
            "stored (send them again once it is back)"
        )
        partition.fail_acks(lost, self._replies)  # never acked
        assert self.nursery is not None
        self.nursery.start_soon(self._reopen, partition)

    async def _reopen(self, partition: Partition) -> None:
        """Reopen an offline partition's log from the disk (cut back to its high watermark),
        backing off while the disk keeps failing; then serve it again."""
        delay = FIRST_REOPEN_DELAY_S
        for attempt in itertools.count(1):
            if not self._still_open(partition):  # deleted meanwhile
                return
            try:
                plog = partition.log.reopen_from_disk()
            except (PylogError, OSError) as error:
                log.error(
                    "recovery of %s failed (attempt %d): %s; next attempt in %.1f s",
                    partition.name,
                    attempt,
                    error,
                    delay,
                )
                await trio.sleep(delay)
                delay = min(delay * 2, MAX_REOPEN_DELAY_S)
                continue
            partition.log = plog
            partition.offline = None
            log.info(
                "%s reopened from the disk, its log ends at %d", partition.name, plog.log_end_offset
            )
            _log_recovery(partition.name, plog)
            self._deadline_changed.set()
            if partition.role is not None and partition.leader is None:  # it could not lead
                await self._take_role(partition.role)
                await self._send_replies()
            return

    # -- background tasks ------------------------------------------------------------------

    async def _group_commit(self) -> None:
        """Flush the partitions that producers wait on (ack=flushed), now that every request
        that came has been served, and send their acks: one flush (and fsync) answers the
        whole burst, and a producer does not wait flush_interval_ms for a disk that is idle."""
        wanted, self._flush_wanted = self._flush_wanted, set()
        self._flush_partitions(wanted | self._take_due())
        await self._send_replies()

    def _take_due(self) -> set[Partition]:
        """The partitions whose flush_messages are pending, now taken to be flushed."""
        due, self._flush_due, self._due_for = self._flush_due, set(), 0
        return due

    def _flush_partitions(self, partitions: set[Partition]) -> None:
        """Flush those of `partitions` still served and online."""
        for partition in partitions:
            if self._still_open(partition) and partition.offline is None:
                self._flush(partition)

    def _flush_by(self, plog: PartitionLog) -> None:
        """Have _flush_when_due wake by `plog`'s flush deadline, which it has just been given:
        its timer moved earlier if need be, without waking it now. (At ack=flushed every group
        commit leaves a partition without a deadline, so each round gives it a new one.)"""
        deadline = plog.next_flush_deadline()
        if deadline is not None:
            # The deadlines are on the partition logs' clock (time.monotonic), not on trio's.
            at = trio.current_time() + deadline - SYSTEM_CLOCK.monotonic()
            if at < self._flush_timer.deadline:
                self._flush_timer.deadline = at

    async def _flush_when_due(self) -> None:
        """Flush each partition when its oldest pending message has waited flush_interval_ms."""
        failed = False
        while True:
            self._deadline_changed = trio.Event()
            deadlines = [
                p.log.next_flush_deadline() for p in self.partitions.values() if p.offline is None
            ]
            due = min((d for d in deadlines if d is not None), default=math.inf)
            # The deadlines are on the partition logs' clock (time.monotonic), not on trio's,
            # which has another origin: wait for the interval left, not until the instant.
            # After a flush that failed, FLUSH_RETRY_S: not at once (a spin until it works), and
            # not at a deadline an hour away when producers wait for it.
            wait_s = FLUSH_RETRY_S if failed else max(0.0, due - SYSTEM_CLOCK.monotonic())
            with trio.move_on_after(wait_s) as self._flush_timer:
                await self._deadline_changed.wait()
            flushed = [  # and those producers wait on, whose group commit failed (EMFILE)
                self._flush(partition, if_due=not partition.acks)
                for partition in list(self.partitions.values())
                if partition.offline is None
            ]
            failed = not all(flushed)
            await self._send_replies()

    async def _report_stats(self) -> None:
        """Send the supervisor a snapshot of the figures every STATS_EVERY_S (for
        broker.metrics)."""
        while True:
            await trio.sleep(STATS_EVERY_S)
            partitions = []
            for p in list(self.partitions.values()):
                figures = p.log.statistics()
                partitions.append(
                    [
                        p.topic,
                        p.number,
                        p.messages_in,
                        p.bytes_in,
                        p.bytes_out,
                        figures.size_bytes,
                        figures.segments,
                        figures.log_start_offset,
                        figures.high_watermark,
                    ]
                )
            await self.socket.send([STATE, json_frame({"stats": self.stats.snapshot(partitions)})])

    async def _apply_retention(self) -> None:
        while True:
            await trio.sleep(self.config.log_retention_check_interval_ms / 1000)
            for partition in list(self.partitions.values()):
                if partition.offline is not None:  # its files are being reopened
                    continue
                try:
                    deleted = partition.log.apply_retention()
                except (PylogError, OSError) as error:
                    log.error("retention of %s-%d: %s", partition.topic, partition.number, error)
                    continue
                if deleted:
                    names = ", ".join(p.name for p in deleted)
                    log.info("retention deleted %s", names)


def _fail(acks: deque[PendingAck], error: PylogError, replies: list[Reply]) -> None:
    """Answer each of `acks` `error`, and forget them."""
    for ack in acks:
        (frame,) = protocol.encode_error(ack.correlation_id, error)
        replies.append((ack.reply[0], frame))
    acks.clear()


def _log_recovery(name: str, plog: PartitionLog) -> None:
    """Log what opening a partition's log found (PartitionLog.recovery)."""
    report = plog.recovery
    for problem in report.problems:
        log.warning("recovery of %s: %s", name, problem)
    if report.segments_scanned:
        log.info(
            "opened %s: scanned %d segments, truncated %d bytes, set aside %d files",
            name,
            report.segments_scanned,
            report.bytes_truncated,
            len(report.bad_files),
        )


async def run_worker(index: int, endpoint: str, config: BrokerConfig) -> None:
    """Serve until SIGTERM or SIGINT, then flush and close every log."""
    OPEN_FILES.limit = config.log_max_open_files
    context = zmq.Context()
    socket = context.socket(zmq.DEALER)
    socket.setsockopt(zmq.LINGER, 5000)
    socket.setsockopt(zmq.SNDHWM, 0)
    socket.setsockopt(zmq.RCVHWM, 0)
    socket.connect(endpoint)
    worker = Worker(index, config, TrioSocket(socket, receive_from_supervisor))
    try:
        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            async with trio.open_nursery() as nursery:
                await nursery.start(worker.serve)
                async for signum in signals:
                    log.info(
                        "worker %d: %s, flushing and exiting", index, signal.Signals(signum).name
                    )
                    await worker.flush_and_answer(ANSWER_TIMEOUT_S)
                    nursery.cancel_scope.cancel()
                    break
    finally:
        worker.close()
        socket.close()
        context.term()


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="A pylog worker (started by pylogd).")
    parser.add_argument("--index", type=int, required=True)
    parser.add_argument("--endpoint", required=True)
    parser.add_argument("--config", required=True, help="the broker settings as JSON")
    parser.add_argument("--supervisor-pid", type=int, required=True)
    args = parser.parse_args(argv)
    exit_with_supervisor(args.supervisor_pid)
    config = BrokerConfig(json.loads(args.config))
    configure_logging(config.broker_log_format)
    trio.run(run_worker, args.index, args.endpoint, config)


if __name__ == "__main__":
    main()
