"""How a worker serves reads (broker.worker): FETCH, MULTI_FETCH, OFFSETS, DESCRIBE_PARTITION
and OFFSET_FOR_LEADER_EPOCH.

FETCH reads whole flushed messages from the page cache (an mmap view, sent without copying),
at most broker.fetch_max_bytes of them (but the first message whole, when it fits in the
request's max_bytes), so that no reply is larger than the front is prepared to hold. When fewer
than min_bytes lie past the offset it waits, up to max_wait_ms, for the flush that brings them
(a follower's) or the high watermark (a consumer's of a replicated partition): a long poll
woken by that, not by polling, and not by the flushes before it (FlushWaiters). A follower's
FETCH (replica_id set) tells the leader where the follower is: the high watermark may move
(Partition.update_high_watermark), an ISR change fall due (Served.ask_isr).

A MULTI_FETCH serves each of its parts as that FETCH, one reply for all and one long poll:
woken by a flush (or the high watermark) of any of its partitions, it answers once min_bytes
are readable over all of them, or any part fails, or the front asks it to (`wake`: the
request's other parts, on another worker, were answered). A follower's MULTI_FETCH of a fetch
session (version 2, broker.fetch_sessions) is served over the partitions it names and those
whose waiters saw bytes come, and over every partition of the session only every
`_full_check_s`: a round costs what changed, not what the session holds.

OFFSETS answers earliest, latest (the high watermark) or the first offset at a time;
DESCRIBE_PARTITION a partition's offsets, size, segments, oldest timestamp and the settings in
effect.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass

import trio

from broker import protocol
from broker.config import TOPIC_SETTINGS
from broker.errors import (
    FencedLeaderEpoch,
    FetchSizeTooSmall,
    OffsetOutOfRange,
    PylogError,
    UnknownLeaderEpoch,
    UnknownTopicOrPartition,
)
from broker.fetch_sessions import FetchSession, FetchSessions
from broker.flush_waiters import FlushWaiters
from broker.log.epochs import EpochEntry
from broker.log.message import HEADER_SIZE, Buffer, timestamp_at
from broker.replication.leader import epoch_entries
from broker.served import Partition, Served
from broker.transport import FETCH_JOINED, throttle_of


@dataclass(frozen=True, slots=True)
class _Round:
    """A MULTI_FETCH being served: what `multi_fetch` read of it, for its answer (its parts as
    FETCHes, each checked: its partition or error), its session and the partitions it named."""

    correlation_id: int
    request: protocol.MultiFetchRequest
    version: int
    fetches: Sequence[protocol.FetchRequest]
    checked: Sequence[Partition | PylogError]
    session: FetchSession | None
    named: frozenset[tuple[str, int]]


class Reads:
    """The reads of the partitions of `served`, at most `fetch_max_bytes` a reply;
    `retention_check_interval_ms()` the worker's interval (a live setting), as
    DESCRIBE_PARTITION says it; `replica_lag_max_ms` the broker's (a follower's fetch session
    is checked whole often enough for it). Its fetch sessions' ids carry the worker's index
    (`served.index`)."""

    def __init__(
        self,
        served: Served,
        fetch_max_bytes: int,
        retention_check_interval_ms: Callable[[], int],
        replica_lag_max_ms: int,
    ) -> None:
        self.served = served
        self.sessions = FetchSessions(served.index, served.clock)
        self.replica_lag_max_ms = replica_lag_max_ms
        self.fetch_max_bytes = fetch_max_bytes
        self.retention_check_interval_ms = retention_check_interval_ms
        self.polls: dict[bytes, trio.Event] = {}
        """The long polls of MULTI_FETCH shares the front may wake (tag FETCH_JOINED), by tag:
        the event their round waits on..."""
        self.woken: set[bytes] = set()
        """... and those the front woke (`wake`)."""

    async def offset_for_leader_epoch(
        self, tagged: bytes, correlation_id: int, request: protocol.OffsetForLeaderEpochRequest
    ) -> None:
        partition = self.served.get(request.topic, request.partition)
        partition.check_leader()
        epoch, end = partition.log.end_offset_for_epoch(request.leader_epoch)
        answer = protocol.OffsetForLeaderEpochReply(epoch, end)
        await self.served.reply(tagged, protocol.encode_reply(correlation_id, answer))

    async def fetch(
        self, tagged: bytes, correlation_id: int, request: protocol.FetchRequest, version: int
    ) -> None:
        partition = self._checked(request)
        if self._fetch_ready(partition, request) or request.max_wait_ms == 0:
            await self.served.reply(
                tagged, self._fetch_reply(tagged, correlation_id, partition, request, version)
            )
            return
        assert self.served.nursery is not None
        self.served.nursery.start_soon(
            self._long_poll, partition, tagged, correlation_id, request, version
        )

    def _checked(self, request: protocol.FetchRequest) -> Partition:
        """The checks a FETCH (or a MULTI_FETCH's part) passes before any waiting: its
        partition, or the error it is answered with, raised."""
        partition = self.served.get(request.topic, request.partition)
        plog = partition.log
        self._check_epoch(partition, request.leader_epoch)
        if request.replica_id >= 0:
            self._follower_fetched(partition, request)
        else:
            partition.check_leader()
        if request.offset <= plog.flushed_offset or request.replica_id < 0:
            plog.local.check_offset(request.offset)  # its errors come first, before any waiting
        return partition

    @staticmethod
    def _check_epoch(partition: Partition, epoch: int) -> None:
        """A FETCH's leader epoch (-1: not checked) against the partition's, in the order
        docs/protocol.md gives: newer than known here, not led here, older."""
        if epoch < 0:
            return
        known = partition.replica.leader_epoch
        if epoch > known:
            raise UnknownLeaderEpoch(partition.name, epoch, known)
        partition.check_leader()
        if epoch < known:
            raise FencedLeaderEpoch(partition.name, epoch, known)

    def _follower_fetched(self, partition: Partition, request: protocol.FetchRequest) -> None:
        """A follower's FETCH: check that it may fetch, note where it is (the high watermark
        may move; its ISR membership may change). A follower copies flushed bytes only; its
        offset may lie past the flushed end, up to the log end, where the reply waits for
        the flush."""
        replica = request.replica_id
        partition.check_leader()
        leader = partition.replica.leader
        if leader is None or replica not in leader.followers:  # (None: one replica, this one)
            raise UnknownTopicOrPartition(f"broker {replica} is not a replica of {partition.name}")
        plog = partition.log
        if not plog.log_start_offset <= request.offset <= plog.log_end_offset:
            raise OffsetOutOfRange(request.offset, plog.log_start_offset, plog.log_end_offset)
        leader.record_fetch(
            replica,
            request.offset,
            request.flushed_offset,
            plog.flushed_offset,
            self.served.clock.monotonic(),
        )
        self.served.owe(partition.update_high_watermark())
        self.served.ask_isr(partition, replica)

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
        waiters = self._waiters(partition, request)
        with trio.move_on_after(request.max_wait_ms / 1000):
            while not self._poll_ended(partition) and not self._fetch_ready(partition, request):
                await waiters.wait_high_watermark(request.offset + request.min_bytes)
        try:
            self._still_served(partition)
            frames = self._fetch_reply(tagged, correlation_id, partition, request, version)
        except PylogError as error:  # deleted, or retention moved the log start past it
            frames = protocol.encode_error(correlation_id, error)
        await self.served.reply(tagged, frames)

    @staticmethod
    def _waiters(partition: Partition, request: protocol.FetchRequest) -> FlushWaiters:
        """What a long poll of `request` waits on: the consumers' (woken by the high
        watermark) on a replicated partition led here, else the flushes'."""
        if request.replica_id < 0 and partition.replica.leader is not None:
            return partition.consumers
        return partition.waiters

    def _poll_ended(self, partition: Partition) -> bool:
        """Whether a long poll on `partition` ends whatever it waits for: the partition is
        deleted, offline, or no longer led here."""
        return (
            not self.served.still_open(partition)
            or partition.offline is not None
            or (partition.replica.replicated and partition.replica.leader is None)
        )

    def _still_served(self, partition: Partition) -> None:
        """After a wait: the error of a partition deleted or taken offline meanwhile."""
        if not self.served.still_open(partition) or partition.offline is not None:
            self.served.get(partition.topic, partition.number)  # raises: deleted or offline

    @staticmethod
    def _readable_end(partition: Partition, request: protocol.FetchRequest) -> int:
        """Where what `request` may read ends: the bytes flushed here for a follower, the
        high watermark for a consumer."""
        if request.replica_id >= 0:
            return partition.log.flushed_offset
        return partition.high_watermark

    @classmethod
    def _fetch_ready(cls, partition: Partition, request: protocol.FetchRequest) -> bool:
        """Whether min_bytes lie past the offset (0: answer at once, even with nothing)."""
        return cls._readable_end(partition, request) - request.offset >= request.min_bytes

    def _fetch_reply(
        self,
        tagged: bytes,
        correlation_id: int,
        partition: Partition,
        request: protocol.FetchRequest,
        version: int,
    ) -> Sequence[Buffer]:
        reply = self._read(partition, request, version, self.fetch_max_bytes, throttle_of(tagged))
        return protocol.encode_reply(correlation_id, reply, version)

    def _read(
        self,
        partition: Partition,
        request: protocol.FetchRequest,
        version: int,
        cap: int,
        throttle_ms: int = 0,
        whole: bool = True,
    ) -> protocol.FetchReply:
        """At most `cap` bytes of messages (fetch_max_bytes for a FETCH: the cap bounds the
        broker's memory, never stops a consumer), but the first message whole if it fits in
        the request's max_bytes and `whole` (nothing taken yet for the reply: else it comes
        next time). A consumer reads up to the high watermark; a follower, whatever is flushed
        here, with the epoch entries of those bytes. A FETCH older than version 3 is served a
        segment up to its first compressed set, and UNSUPPORTED_FORMAT at or past it."""
        plog = partition.log
        replica = request.replica_id >= 0
        # It may have stopped leading (or a newer epoch come) while the fetch waited.
        self._check_epoch(partition, request.leader_epoch)
        partition.check_leader()
        end = self._readable_end(partition, request)
        limit = min(request.max_bytes, cap, max(0, end - request.offset))
        sets = version >= protocol.SETS_FETCH_VERSION  # else UnsupportedFormat at a set
        data: Buffer = b""
        if limit:
            try:
                data = plog.read(request.offset, limit, sets)
            except FetchSizeTooSmall as error:
                # A follower gets the message whole whatever its max_bytes: it must copy it.
                if error.needed > request.max_bytes and not replica:  # named as asked
                    raise FetchSizeTooSmall(error.offset, request.max_bytes, error.needed) from None
                if whole:
                    data = plog.read(request.offset, error.needed, sets)  # over the cap: whole
        partition.bytes_out += len(data)
        end = request.offset + len(data)
        entries: tuple[EpochEntry, ...] = ()
        if replica and len(data):  # none for no bytes (docs/protocol.md, FETCH version 2)
            entries = epoch_entries(plog.epochs.entries, request.offset, end)
        producers: tuple[protocol.StoredSet, ...] = ()
        if replica and version >= protocol.PRODUCERS_FETCH_VERSION and len(data):
            base = plog.local.segment_for(request.offset).base_offset  # read from one segment
            producers = plog.producers.sets_between(base, request.offset, end)
        return protocol.FetchReply(
            partition.high_watermark,
            plog.log_start_offset,
            data,
            partition.replica.leader_epoch,
            entries,
            throttle_ms,
            producers,
        )

    # -- MULTI_FETCH -----------------------------------------------------------------------

    async def multi_fetch(
        self,
        tagged: bytes,
        correlation_id: int,
        request: protocol.MultiFetchRequest,
        version: int = 1,
    ) -> None:
        """Serve each part as a FETCH of version 5, checked first (an error answers the
        request at once); answer at once when max_wait_ms is 0 or min_bytes are readable over
        all the parts, else wait for that in one long poll (`_multi_poll`). A fetch of a
        session (version 2, broker.fetch_sessions) serves the partitions of its session it
        names and those with news (`_session_round`), and is answered with those."""
        if request.session_epoch == protocol.SESSIONLESS:
            fetches = [request.part_request(part) for part in request.parts]
            checked = [self._check_part(fetch) for fetch in fetches]
            served = _Round(correlation_id, request, version, fetches, checked, None, frozenset())
        else:
            served = self._session_round(correlation_id, request, version)
        if request.max_wait_ms == 0 or self._answerable(tagged, served):
            await self.served.reply(tagged, self._multi_reply(tagged, served))
            return
        assert self.served.nursery is not None
        if tagged[:1] == FETCH_JOINED:  # before the task runs: a wake may come first
            self.polls[tagged] = trio.Event()
        poll = self._multi_poll if served.session is None else self._session_poll
        self.served.nursery.start_soon(poll, tagged, served)

    def _session_round(
        self, correlation_id: int, request: protocol.MultiFetchRequest, version: int
    ) -> _Round:
        """A session's fetch, begun or gone on with: the partitions it names and those ready
        since its last round (broker.fetch_sessions), or every partition of the session when
        the last round that checked them all is `_full_check_s` old."""
        if request.session_id:
            session = self.sessions.going_on(request)
        else:
            session = self.sessions.begin(request.replica_id)
        now = self.served.clock.monotonic()
        named = frozenset(session.update(request, now))
        if now - session.checked_at >= self._full_check_s():
            session.checked_at = now
            session.take_ready()
            keys: Collection[tuple[str, int]] = session.fetches.keys()
        else:
            keys = named | session.take_ready()
        return self._session_parts(correlation_id, request, version, session, named, keys)

    def _full_check_s(self) -> float:
        """How often a session's round checks every partition of it: often enough that a
        follower caught up stays so for the ISR (its position is recorded then), and a high
        watermark moved with no bytes reaches it within half a second."""
        return min(0.5, self.replica_lag_max_ms / 4000)

    def _session_parts(
        self,
        correlation_id: int,
        request: protocol.MultiFetchRequest,
        version: int,
        session: FetchSession,
        named: frozenset[tuple[str, int]],
        keys: Collection[tuple[str, int]],
    ) -> _Round:
        """The round of `session` over its partitions among `keys`, in the session's order,
        each checked (as a FETCH: the follower's position recorded) and its waiter set for the
        byte past its fetch offset."""
        fetches, checked = [], []
        for key, fetch in session.fetches.items():
            if key in keys:
                partition = self._check_part(fetch)
                if isinstance(partition, Partition):
                    session.arm(key, self._waiters(partition, fetch), fetch.offset + 1)
                else:
                    session.disarm(key)
                fetches.append(fetch)
                checked.append(partition)
        return _Round(correlation_id, request, version, fetches, checked, session, named)

    def _answerable(self, tagged: bytes, served: _Round) -> bool:
        """Whether a MULTI_FETCH is answered now: a part failed its checks (its partition
        deleted, offline or not led here among them), the front woke it (`wake`), or min_bytes
        are readable over its parts."""
        if tagged in self.woken:
            return True
        checked = served.checked
        if any(not isinstance(p, Partition) for p in checked):
            return True
        return self._readable(checked, served.fetches) >= served.request.min_bytes

    def _check_part(self, request: protocol.FetchRequest) -> Partition | PylogError:
        """The checks a FETCH passes before any waiting, for a part: its partition, or the
        error it is answered with."""
        try:
            return self._checked(request)
        except PylogError as error:
            return error

    @classmethod
    def _readable(
        cls, checked: Sequence[Partition | PylogError], fetches: Sequence[protocol.FetchRequest]
    ) -> int:
        """The bytes readable past the parts' offsets, over all of them."""
        return sum(
            max(0, cls._readable_end(partition, request) - request.offset)
            for partition, request in zip(checked, fetches, strict=True)
            if isinstance(partition, Partition)
        )

    async def _multi_poll(self, tagged: bytes, served: _Round) -> None:
        """Wait until the request is answerable (`_answerable`), a part's partition was
        deleted, taken offline or is no longer led here since its checks, or max_wait_ms pass;
        then answer. Each round waits on every part's waiters for one byte past its offset,
        with one event."""
        request, fetches, checked = served.request, served.fetches, served.checked
        partitions = [p for p in checked if isinstance(p, Partition)]
        wakeable = tagged in self.polls
        with trio.move_on_after(request.max_wait_ms / 1000):
            while not self._answerable(tagged, served) and not any(
                self._poll_ended(p) for p in partitions
            ):
                event = trio.Event()
                if wakeable:
                    self.polls[tagged] = event
                entered = []
                for partition, fetch in zip(checked, fetches, strict=True):
                    if isinstance(partition, Partition):
                        waiters = self._waiters(partition, fetch)
                        entered.append((waiters, waiters.enter(fetch.offset + 1, event)))
                try:
                    await event.wait()
                finally:
                    for waiters, waiter in entered:
                        waiters.leave(waiter)
        await self._multi_answer(tagged, served)

    async def _session_poll(self, tagged: bytes, served: _Round) -> None:
        """A session's long poll: wait until the round is answerable (`_answerable`) or
        max_wait_ms pass, the partitions that become ready meanwhile joining the round."""
        session = served.session
        assert session is not None
        wakeable = tagged in self.polls
        with trio.move_on_after(served.request.max_wait_ms / 1000):
            while not self._answerable(tagged, served):
                session.event = trio.Event()
                if wakeable:
                    self.polls[tagged] = session.event
                await session.event.wait()
                keys = {(f.topic, f.partition) for f in served.fetches} | session.take_ready()
                served = self._session_parts(
                    served.correlation_id,
                    served.request,
                    served.version,
                    session,
                    served.named,
                    keys,
                )
        await self._multi_answer(tagged, served)

    async def _multi_answer(self, tagged: bytes, served: _Round) -> None:
        self.polls.pop(tagged, None)
        self.woken.discard(tagged)
        await self.served.reply(tagged, self._multi_reply(tagged, served))

    def wake(self, tagged: bytes) -> None:
        """The front asks the MULTI_FETCH share of tag `tagged` to be answered now (another
        worker answered the request's other parts with data); nothing if it was answered."""
        event = self.polls.get(tagged)
        if event is not None:
            self.woken.add(tagged)
            event.set()

    def _multi_reply(self, tagged: bytes, served: _Round) -> Sequence[Buffer]:
        """Each part's answer, in order, at most min(max_bytes, fetch_max_bytes) of messages
        in all, but the first message read whole (as a FETCH's). A session's: only the
        partitions the fetch named, and those with news (FetchSession.news)."""
        request, session = served.request, served.session
        cap = min(request.max_bytes, self.fetch_max_bytes)
        taken = 0
        version = protocol.PRODUCERS_FETCH_VERSION
        parts = []
        for fetch, partition in zip(served.fetches, served.checked, strict=True):
            key = (fetch.topic, fetch.partition)
            try:
                if not isinstance(partition, Partition):
                    raise partition
                self._still_served(partition)
                read = self._read(partition, fetch, version, max(0, cap - taken), 0, not taken)
                taken += len(read.message_set)
                if session is not None:
                    if not read.message_set and self._fetch_ready(partition, fetch):
                        session.ready.add(key)  # no room left for its bytes: the next round's
                    # (news() first: it notes what the answer says, named or not)
                    if not session.news(key, read) and key not in served.named:
                        continue  # nothing the follower does not know
                answer = protocol.fetch_part(fetch.topic, fetch.partition, read)
            except PylogError as error:
                if session is not None:
                    session.sent.pop(key, None)  # its next answer is news
                frames = protocol.encode_error(0, error)
                answer = protocol.fetch_part_reply(fetch.topic, fetch.partition, frames)
            parts.append(answer)
        session_id = 0 if session is None else session.id
        reply = protocol.MultiFetchReply(tuple(parts), throttle_of(tagged), session_id)
        return protocol.encode_reply(served.correlation_id, reply, served.version)

    def offset_at(self, request: protocol.OffsetsRequest) -> int:
        partition = self.served.get(request.topic, request.partition)
        partition.check_leader()
        plog = partition.log
        if request.time == protocol.LATEST:
            return partition.high_watermark
        if request.time == protocol.EARLIEST:
            return plog.log_start_offset
        return plog.offset_for_timestamp(request.time)

    def describe(
        self, request: protocol.DescribePartitionRequest, version: int
    ) -> protocol.DescribePartitionReply:
        """The reply to DESCRIBE_PARTITION of `version`: from version 2, with what retention
        is forecast from (each segment file's state, the append rate, noted now)."""
        partition = self.served.get(request.topic, request.partition)
        plog = partition.log
        stats = plog.local.statistics()
        oldest = -1
        if stats.flushed_offset > stats.log_start_offset:  # a message at the log start
            segment = plog.local.segment_for(stats.log_start_offset)
            position = stats.log_start_offset - segment.base_offset
            oldest = timestamp_at(segment.file.view(position, position + HEADER_SIZE), 0)
        config = plog.local.config
        settings = protocol.settings_text({key: getattr(config, key) for key in TOPIC_SETTINGS})
        described = protocol.DescribePartitionReply(
            stats.log_start_offset,
            partition.high_watermark,
            stats.log_end_offset,
            stats.size_bytes,
            stats.segments,
            oldest,
            settings,
        )
        if version < protocol.DESCRIBE_PARTITION_RETENTION_VERSION:
            return described  # a stat of every segment file only for those who read it
        return dataclasses.replace(
            described,
            retention_check_interval_ms=self.retention_check_interval_ms(),
            append_bytes_per_s=partition.append_rate(self.served.clock.monotonic()),
            segment_list=tuple(
                protocol.SegmentState(*state) for state in plog.local.segment_states()
            ),
        )
