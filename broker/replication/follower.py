"""A follower's copy loop for one partition (docs/replication.md, "The follower"), run as a trio
task of the worker that holds the partition, for one leader and one leader epoch: the worker
cancels it and starts another when the partition's state node names a new leader or epoch.

1. **Truncate** (KIP-101, KIP-279): ask the leader OFFSET_FOR_LEADER_EPOCH for this replica's
   latest epoch, and cut the log to the lower of the leader's answer and this replica's own end
   of that epoch; a replica without history, or whose answer lies outside its log, starts again
   empty at the leader's offset.
2. **Copy**: fetch from the log end, saying the replica's flushed offset, long polling
   `replica_fetch_wait_ms` (a part of the MULTI_FETCH its fetcher sends for the partitions
   followed from that leader, served as a FETCH of version 5); append the bytes exactly as
   they came, with the leader's epoch entries for them (written first, with those of the other
   copy loops of the same turn: `EpochRound`), then hand the partition to the worker
   (`copied`), which flushes what was copied before the next fetch asks for more: the leader
   learns the new flushed offset from that fetch, and its high watermark moves.

The requests go to the leader on the worker's fetcher of that leader broker, which every
partition followed from it shares (broker.replication.fetcher: one connection per leader
broker, a Curve client in security.mode curve).

A fetch answered OFFSET_OUT_OF_RANGE (the leader's log moved, or this replica holds bytes the
leader does not) goes back to 1. Errors that the leader's state will mend (NOT_LEADER, an epoch
that is fenced or not yet known, a leader that does not answer) are retried with back-off,
logged at most once per kind every few seconds.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import trio

from broker import protocol
from broker.backoff import Backoff
from broker.config import BrokerConfig
from broker.errors import OffsetOutOfRange, PylogError
from broker.log import PartitionLog
from broker.log.epochs import LeaderEpochs, assign_together
from broker.log.partition import replicated_epochs
from broker.ratelog import RateLimitedLog
from broker.replication.fetcher import Fetcher, Fetchers, Source
from broker.security import BrokerKeys

log = logging.getLogger("pylog.follower")

REPLY_GRACE_S = 5.0
"""How much longer than its long poll a fetch waits for the leader's reply."""
FIRST_BACKOFF_S = 0.05
MAX_BACKOFF_S = 2.0
LOG_EVERY_S = 5.0


@dataclass(frozen=True)
class Role:
    """Whom a follower copies from: the leader's broker id, its front's endpoint and its
    leader epoch, and in curve mode the public key the leader registered (None: none)."""

    leader: int
    endpoint: str
    epoch: int
    key: str | None = None

    @property
    def source(self) -> Source:
        """The leader's broker as its fetcher reaches it."""
        return Source(self.leader, self.endpoint, self.key)


def replica_keys(config: BrokerConfig) -> BrokerKeys | None:
    """This broker's keys for its fetchers in security.mode curve (read when a fetcher connects
    to a leader, so a file changed is read at the next one), None in plaintext; KeyFileError as
    loading raises it."""
    if config.security_mode != "curve":
        return None
    return BrokerKeys.load(config.key_file_path, config.security_broker_keys)


class EpochRound:
    """The leader epochs the copy loops of a worker write in one turn of its loop, written
    together (broker.log.epochs.assign_together: two syncfs for them all): after a leader
    change, every partition followed from the new leader gets its first bytes of the new epoch
    in the same replies, and each history written on its own cost an fsync of its file and
    one of its folder, in turn, with the worker's loop stopped (1 ms a partition on this
    machine: 2 s for the 2,000 followed in perf/bench_partitions.py's replicated case)."""

    def __init__(self) -> None:
        self._round: _EpochAssignments | None = None

    async def assign(self, history: LeaderEpochs, entry: tuple[int, int]) -> None:
        """`history.assign(*entry)`, with the assignments of the other tasks that ask in this
        turn; raises what it would (ValueError, DiskFull, StorageIOError). The first task of
        a turn writes them all once the turn's others have asked (it yields once first, and
        writes them even when cancelled meanwhile). A copy loop cancelled before the write
        may have its entry written and its bytes not appended: it gives an entry at the log
        end, which describes no byte (as a leader that appended nothing leaves, or an append
        that failed), and so only the entry of the fetch offset is written this way
        (Follower._copy), never one past the log end."""
        assignments = self._round
        if assignments is None:
            assignments = self._round = _EpochAssignments([(history, [entry])])
            index = 0
            try:
                await trio.lowlevel.checkpoint()  # the other copy loops of this turn join
            finally:
                self._round = None
                assignments.results = assign_together(assignments.asked)
                assignments.done.set()
        else:
            index = len(assignments.asked)
            assignments.asked.append((history, [entry]))
            await assignments.done.wait()
        error = assignments.results[index]
        if error is not None:
            raise error


@dataclass
class _EpochAssignments:
    """One turn's assignments (EpochRound) and, once written, each one's error or None."""

    asked: list[tuple[LeaderEpochs, list[tuple[int, int]]]]
    results: list[Exception | None] = field(default_factory=list)
    done: trio.Event = field(default_factory=trio.Event)


class Follower:
    """Copies one partition (`plog`) from `role`'s leader, as replica `me`, on that leader's
    fetcher from `fetchers`."""

    def __init__(
        self,
        me: int,
        topic: str,
        number: int,
        plog: Callable[[], PartitionLog],
        role: Role,
        fetch_max_bytes: int,
        fetch_wait_ms: int,
        copied: Callable[[int], Awaitable[None]],
        fetchers: Fetchers,
        epoch_round: EpochRound,
    ) -> None:
        self.me = me
        self.topic = topic
        self.number = number
        self._plog = plog
        """The partition's log now (a failed log is replaced by its reopened one)."""
        self.role = role
        self.fetch_max_bytes = fetch_max_bytes
        self.fetch_wait_ms = fetch_wait_ms
        self._copied = copied
        """Called with the count of messages after each append: the worker flushes them."""
        self._fetchers = fetchers
        self._epoch_round = epoch_round
        """Where the epoch entries of the bytes fetched are written, before the bytes."""
        self.leader_high_watermark = 0
        """The leader's high watermark, as its last FETCH reply said."""
        self._log = RateLimitedLog(log, LOG_EVERY_S)

    @property
    def name(self) -> str:
        return f"{self.topic}-{self.number}"

    async def run(self) -> None:
        """Copy until cancelled."""
        backoff = Backoff(FIRST_BACKOFF_S, MAX_BACKOFF_S)
        log.info(
            "%s: following broker %d (%s), leader epoch %d",
            self.name,
            self.role.leader,
            self.role.endpoint,
            self.role.epoch,
        )
        fetcher: Fetcher | None = None
        try:
            while True:
                try:
                    if fetcher is None:
                        fetcher = self._fetchers.acquire(self.role.source)
                    await self._truncate(fetcher)
                    await self._copy(fetcher)  # returns when the log must be truncated again
                    backoff.reset()
                except (PylogError, OSError, ValueError) as error:
                    kind = type(error).__name__
                    self._log.log(logging.WARNING, kind, f"{self.name}: {error}; retrying")
                    if fetcher is not None and fetcher.refused:  # connected anew next time
                        self._fetchers.release(fetcher)
                        fetcher = None
                    await trio.sleep(backoff.next())
        finally:
            if fetcher is not None:
                self._fetchers.release(fetcher)

    async def _request(
        self, fetcher: Fetcher, request: protocol.Request, version: int
    ) -> protocol.Reply:
        """`request`'s reply from the leader (raising its error); PartitionUnavailable when
        none comes within the long poll and REPLY_GRACE_S."""
        wait_s = self.fetch_wait_ms / 1000 + REPLY_GRACE_S
        return await fetcher.request(request, version, wait_s, request.api.name)

    async def _truncate(self, fetcher: Fetcher) -> None:
        plog = self._plog()
        latest = plog.epochs.latest_epoch
        request = protocol.OffsetForLeaderEpochRequest(self.topic, self.number, latest)
        reply = await self._request(fetcher, request, 1)
        assert isinstance(reply, protocol.OffsetForLeaderEpochReply)
        plog = self._plog()
        if reply.epoch < 0 or latest < 0:  # no common history: start where the leader starts
            target = reply.end_offset if reply.epoch < 0 else plog.log_start_offset
            if latest >= 0 or plog.log_end_offset != plog.log_start_offset:
                log.warning(
                    "%s: no leader epoch in common with leader %d: starting again at %d",
                    self.name,
                    self.role.leader,
                    target,
                )
            if not (plog.log_start_offset == plog.log_end_offset == target):
                plog.reset_to(target)
            return
        own_end = plog.end_offset_for_epoch(reply.epoch)[1]
        target = min(reply.end_offset, own_end)
        if target < plog.log_start_offset:
            plog.reset_to(reply.end_offset)
        elif target < plog.log_end_offset:
            plog.truncate_to(target)

    async def _copy(self, fetcher: Fetcher) -> None:
        while True:
            plog = self._plog()
            offset = plog.log_end_offset
            part = protocol.FetchPart(
                self.topic,
                self.number,
                offset,
                self.fetch_max_bytes,
                self.role.epoch,
                plog.flushed_offset,
            )
            try:
                wait_s = self.fetch_wait_ms / 1000 + REPLY_GRACE_S
                hwm = self.leader_high_watermark
                reply = await fetcher.fetch(part, hwm, self.fetch_wait_ms, wait_s)
            except OffsetOutOfRange as error:
                log.info("%s: fetch at %d out of range (%s)", self.name, offset, error)
                earliest = protocol.OffsetsRequest(self.topic, self.number, protocol.EARLIEST)
                start = await self._request(fetcher, earliest, 1)
                assert isinstance(start, protocol.OffsetsReply)
                if offset < start.offset:  # retention on the leader went past this log's end
                    self._plog().reset_to(start.offset)
                    continue
                return  # this log holds bytes the leader does not: truncate again
            self.leader_high_watermark = reply.high_watermark
            if len(reply.message_set):
                plog = self._plog()
                latest = plog.epochs.latest_epoch
                if any(epoch != latest for epoch, _ in reply.epochs):  # else nothing to write
                    size = len(reply.message_set)
                    name, log_end = plog.directory.name, plog.log_end_offset
                    entry = replicated_epochs(name, log_end, offset, size, reply.epochs)[0]
                    if entry[0] != latest:  # a new epoch at `offset`: with the turn's others
                        await self._epoch_round.assign(plog.epochs, entry)
                        plog = self._plog()
                count = plog.append_replicated(
                    reply.message_set, offset, reply.epochs, flush=False, producers=reply.producers
                )
                await self._copied(count)
