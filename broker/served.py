"""What the parts of a worker share (broker.worker): the partitions it serves, each a
`Partition`, and what it owes the supervisor (`Served`). The parts are the worker itself (the
loop, PRODUCE, the supervisor's commands), broker.flusher (flushes, failed disks),
broker.reads (FETCH, OFFSETS, DESCRIBE_PARTITION, OFFSET_FOR_LEADER_EPOCH) and
broker.leadership (leading and following replicated partitions); none imports another, the
worker hands each what it needs of the others. All of it runs on the worker's trio loop: not
safe to share between threads.

A Partition is one partition as the worker serves it: its log, its replication state (a
Replica, broker.replication.replica: the rules, without I/O), the long polls waiting on it,
its copy loop while it follows, and the checkpoint its high watermark is kept in across
restarts.

Replies and STATE messages made where nothing may be sent (the acks a flush gives, an ISR
change to ask for) are handed to `owe` and `ask_isr`, and wait until `send_owed`, which the
loop and the tasks that made them call.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import trio

from broker import control
from broker.clock import Clock
from broker.errors import PartitionUnavailable, UnknownTopicOrPartition
from broker.flush_waiters import FlushWaiters
from broker.log import PartitionLog
from broker.log.hwcheckpoint import HighWatermarkCheckpoint
from broker.log.message import Buffer
from broker.ratelog import RateLimitedLog
from broker.replication.follower import Follower
from broker.replication.replica import Replica, Reply
from broker.transport import replies_message
from broker.trio_socket import TrioSocket

log = logging.getLogger("pylog.worker")

STORAGE_LOG_EVERY_S = 5.0
CHECKPOINT_LOG_EVERY_S = 5.0
RATE_SAMPLE_S = 1.0
RATE_WINDOW_S = 300.0
"""A partition's append rate (DESCRIBE_PARTITION version 2) is measured over about this long."""
_checkpoint_log = RateLimitedLog(log, CHECKPOINT_LOG_EVERY_S)


@dataclass(eq=False)
class Partition:
    """One open partition log, its Replica, the long polls waiting on it, and its copy loop."""

    topic: str
    number: int
    log: PartitionLog
    replica: Replica
    checkpoint: HighWatermarkCheckpoint
    """Where `replica.high_watermark_seen` is kept across restarts."""
    clock: Clock
    """The worker's (Served.clock): the Replica is given the time off it."""
    waiters: FlushWaiters = field(default_factory=FlushWaiters)
    """The long polls woken by this log's flushes (followers', and consumers' of a partition
    of one replica)."""
    consumers: FlushWaiters = field(default_factory=FlushWaiters)
    """The consumers' long polls on a replicated partition led here: woken by the high
    watermark."""
    offline: str | None = None
    """Why the partition is offline (a flush failed), until its log is reopened from the disk."""
    follower: Follower | None = None
    following: trio.CancelScope | None = None
    """The copy loop from the leader, while it follows, and the scope that cancels it."""
    messages_in: int = 0
    bytes_in: int = 0
    bytes_out: int = 0
    """Messages and bytes appended, and bytes of messages fetched (broker.worker_stats)."""
    log_start_asked: int = 0
    """Where the registry asks the log to start (records before it deleted: `move_start`)."""
    ends: deque[tuple[float, int]] = field(default_factory=deque)
    """(monotonic time, log end offset) taken at each retention pass and DESCRIBE_PARTITION
    of version 2, at least RATE_SAMPLE_S apart, the oldest within RATE_WINDOW_S:
    `append_rate`."""

    @property
    def name(self) -> str:
        return f"{self.topic}-{self.number}"

    def append_rate(self, now: float) -> int:
        """Note the log's end now, and return the bytes appended a second over the last
        RATE_WINDOW_S (or since the first note within it; 0 before two notes)."""
        ends, end = self.ends, self.log.log_end_offset
        if not ends or now - ends[-1][0] >= RATE_SAMPLE_S:
            ends.append((now, end))
        while len(ends) > 1 and now - ends[1][0] >= RATE_WINDOW_S:
            ends.popleft()
        since, then = ends[0]
        return 0 if now <= since else round((end - then) / (now - since))

    @property
    def high_watermark(self) -> int:
        """What consumers may read up to (Replica.high_watermark)."""
        return self.replica.high_watermark(self.log.flushed_offset)

    def admit(self, ack: int) -> None:
        """Raise what refuses a produce at `ack` here now (Replica.admit)."""
        self.replica.admit(ack, self.clock.monotonic())

    def append(
        self,
        message_set: Buffer,
        producer_id: int,
        epoch: int,
        sequence: int,
        expand: bool,
        client: Callable[[], str],
    ) -> tuple[int, int, int, bool]:
        """Append a producer's set, not flushed (the worker's flushes take it): an idempotent
        producer's (`producer_id`) once, however often it is sent. Its offset, messages and
        end, and whether it was appended now (not a set sent again, which is counted once).
        Raises what PartitionLog.append_counted and append_idempotent raise; `client` gives
        the request's client id, which a new idempotent producer is let in as."""
        plog = self.log
        if producer_id:
            kept, appended = plog.append_idempotent(
                message_set, producer_id, epoch, sequence, False, expand, client
            )
            offset, count, end = kept.offset, kept.message_count, kept.end
        else:
            offset, count = plog.append_counted(message_set, flush=False, expand=expand)
            appended, end = True, plog.log_end_offset
        if appended:
            self.messages_in += count
            self.bytes_in += len(message_set)
        return offset, count, end, appended

    def check_leader(self) -> None:
        """NotLeaderForPartition unless clients may be served here now (Replica.check_serving)."""
        self.replica.check_serving(self.clock.monotonic())

    def move_start(self, asked: int | None = None) -> None:
        """Take `asked` (if given) as the log start the registry asks, and move the log's start
        there as far as its log reaches (a follower behind it gets there as it copies: call
        this again after appending)."""
        if asked is not None:
            self.log_start_asked = max(self.log_start_asked, asked)
        if self.log_start_asked > self.log.log_start_offset and self.offline is None:
            high_watermark = self.replica.start_at(self.log.advance_start(self.log_start_asked))
            if high_watermark is not None:
                self._keep(high_watermark)
                self.consumers.note_high_watermark(high_watermark)

    def note_flush(self) -> list[Reply]:
        """Wake the long polls whose min_bytes the flushed end reached brought; the acks the
        flush gives (or fails), for Served.owe."""
        flushed = self.log.flushed_offset
        self.waiters.note_high_watermark(flushed)
        replica = self.replica
        replies = replica.answer_flushed(flushed, self.clock.monotonic())
        if replica.leader is not None:
            replies += self.update_high_watermark()
        return replies

    def update_high_watermark(self) -> list[Reply]:
        """Recompute the replicated high watermark (a flush here, a follower's fetch, an ISR
        change); if it moved, keep it, then wake the consumers' long polls it satisfies. The
        answers of the ack=all produces it covers, for Served.owe (sent after: kept before
        anyone is told)."""
        high_watermark, replies = self.replica.answer_high_watermark(
            self.log.flushed_offset, self.clock.monotonic()
        )
        if high_watermark is not None:
            self._keep(high_watermark)
            self.consumers.note_high_watermark(high_watermark)
        return replies

    def see_high_watermark(self, high_watermark: int) -> None:
        """The high watermark the leader sent (while it follows): noted and kept."""
        self.replica.high_watermark_seen = high_watermark
        self._keep(high_watermark)

    def _keep(self, high_watermark: int) -> None:
        """Into the checkpoint; one the disk refuses is logged (a restart may then start the
        high watermark lower: it rises as the followers fetch)."""
        try:
            self.checkpoint.write(high_watermark)
        except OSError as error:
            _checkpoint_log.log(logging.ERROR, "checkpoint", f"{self.name}: {error}")

    def wake_all(self) -> None:
        """Wake every long poll (followers' and consumers'): the partition is deleted, offline,
        closing, or no longer led here."""
        self.waiters.wake_all()
        self.consumers.wake_all()


class Served:
    """The partitions of worker `index`, its socket to the supervisor, and its clock."""

    def __init__(self, index: int, socket: TrioSocket[list[bytes]], clock: Clock) -> None:
        self.index = index
        self.socket = socket
        self.clock = clock
        """The worker's one clock: its parts' times (leases, acks, ISR lags, fetch sessions,
        flush deadlines) are all read off it. Its monotonic() is the machine's in a broker:
        the supervisor's leases are on that."""
        self.partitions: dict[tuple[str, int], Partition] = {}
        self._replies: list[Reply] = []
        """Replies made where nothing may be sent (`owe`), sent by send_owed."""
        self.state_messages: list[list[bytes]] = []
        """STATE messages for the supervisor made where nothing may be sent (ISR changes to
        ask for), sent by send_owed."""
        self.nursery: trio.Nursery | None = None
        """The worker's, once it serves: tasks of its parts (long polls, copy loops, reopens)."""
        self.storage_log = RateLimitedLog(log, STORAGE_LOG_EVERY_S)
        """Storage errors, logged at most once per STORAGE_LOG_EVERY_S per kind."""

    def get(self, topic: str, number: int) -> Partition:
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

    def still_open(self, partition: Partition) -> bool:
        """Whether `partition` is still served here (not deleted, the worker not closing)."""
        return self.partitions.get((partition.topic, partition.number)) is partition

    async def reply(self, tagged: bytes, frames: Sequence[Buffer]) -> None:
        await self.socket.send([tagged, *frames])

    def owe(self, replies: list[Reply]) -> None:
        """Send `replies` with the next send_owed: the one way the parts hand the worker the
        answers a Replica gives (acks a flush or the high watermark gives, failures)."""
        self._replies += replies

    def ask_isr(self, partition: Partition, fetched: int | None = None) -> None:
        """Ask the supervisor for the ISR change due (Replica.isr_to_ask: shrink, or expand by
        `fetched`, the follower whose fetch this is), if one is, with the next send_owed; it
        writes the state node and its watch brings the new ISR back as a role command."""
        leader = partition.replica.leader
        isr = partition.replica.isr_to_ask(self.clock.monotonic(), fetched)
        if leader is None or isr is None:
            return
        log.info("%s: asking for ISR %s (now %s)", partition.name, list(isr), sorted(leader.isr))
        change = control.AskIsr(partition.topic, partition.number, leader.epoch, isr)
        self.state_messages.append(control.encode(change))

    @property
    def owing(self) -> bool:
        """Whether send_owed has anything to send."""
        return bool(self._replies or self.state_messages)

    async def send_owed(self) -> None:
        """Send the replies made where nothing could be sent, as one REPLIES message (a hundred
        acks of one flush cost the worker one send and the supervisor one receive), then the
        STATE messages."""
        replies, self._replies = self._replies, []
        if replies:
            await self.socket.send(replies_message(replies))
        messages, self.state_messages = self.state_messages, []
        for message in messages:
            await self.socket.send(message)
