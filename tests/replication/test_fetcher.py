"""A worker's replica fetchers (broker.replication.fetcher; docs/replication.md, "The
follower"): the partitions followed from one leader broker share one connection to it, their
fetches asked for together leave as one MULTI_FETCH, each gets its own replies whatever order
they come in, and the connection closes with the last of them. Real follower copy loops and
real logs, against a leader played on a ROUTER socket of 127.0.0.1."""

from __future__ import annotations

import contextlib
import itertools
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import trio
import trio.testing

from broker import protocol
from broker.errors import FetchSessionIdNotFound
from broker.log import PartitionLog
from broker.log.epochs import EpochEntry, LeaderEpochs
from broker.log.fsdir import syncfs
from broker.log.message import Buffer, encode_message, iter_messages
from broker.replication.fetcher import Fetchers
from broker.replication.follower import EpochRound, Follower, Role
from broker.trio_socket import TrioSocket
from tests.sockets import LiveContext

PARTITIONS = 3
IDLE_WAIT_MAX_MS = 5_000


def stored(plog: PartitionLog) -> list[bytes]:
    plog.flush()
    data = b"".join(bytes(s.file.view(0, s.size)) for s in plog.segments)
    return [message.value for message in iter_messages(data)]


@dataclass
class PlayedLeader:
    """Broker 1 leading partitions 0.. of "clicks" in epoch 0, each holding one message, on
    `live`'s ROUTER: it answers OFFSET_FOR_LEADER_EPOCH at once, holds the MULTI_FETCHes of
    the first fetch of every partition until all have come and then answers them last first,
    and leaves later ones waiting (long polls that nothing ends). Records each request's
    connection, and the parts of each MULTI_FETCH.

    `together`: the first fetches are made to leave apart (the last partition's
    OFFSET_FOR_LEADER_EPOCH answered only once the others' first fetches came, as a loaded
    machine may have it), and while they come in more than one MULTI_FETCH each is answered
    with nothing new (the fetcher asks for them again); the message is given only when one
    MULTI_FETCH asks for every partition, so its copy loops get their first bytes in one turn."""

    live: LiveContext
    together: bool = False
    identities: list[bytes] = field(default_factory=list)
    fetches: list[list[int]] = field(default_factory=list)
    """The partitions of each MULTI_FETCH, in the order they came."""
    held: list[tuple[bytes, protocol.RequestHeader, tuple[protocol.FetchPart, ...]]] = field(
        default_factory=list
    )
    """(identity, header, parts) of the first fetches not answered yet."""
    answered: set[int] = field(default_factory=set)
    """The partitions whose first fetch came."""

    async def serve(self) -> None:
        channel = TrioSocket(self.live.server, lambda socket, flags: socket.recv_multipart(flags))
        copied: set[int] = set()
        last: list[Buffer] = []  # the held OFFSET_FOR_LEADER_EPOCH of the last partition
        while True:
            identity, *frames = await channel.receive()
            self.identities.append(identity)
            header, request = protocol.decode_request(frames)
            if isinstance(request, protocol.OffsetForLeaderEpochRequest):
                reply: protocol.Reply = protocol.OffsetForLeaderEpochReply(-1, 0)
                answer = [identity, *protocol.encode_reply(header.correlation_id, reply)]
                if self.together and request.partition == PARTITIONS - 1:
                    last = answer
                else:
                    await channel.send(answer)
            elif isinstance(request, protocol.MultiFetchRequest):
                numbers = [part.partition for part in request.parts]
                self.fetches.append(numbers)
                if not copied.isdisjoint(numbers):
                    continue  # a later fetch: a long poll left waiting
                self.answered.update(numbers)
                self.held.append((identity, header, request.parts))
                if last and len(self.answered) == PARTITIONS - 1:
                    await channel.send(last)
                    last = []
                if sum(len(parts) for _, _, parts in self.held) < PARTITIONS:
                    continue
                apart = self.together and len(self.held) > 1
                for identity, held, parts in reversed(self.held):  # each in its version
                    answered = (
                        protocol.MultiFetchReply(empty_answers(parts))
                        if apart
                        else first_data(parts)
                    )
                    answer = protocol.encode_reply(held.correlation_id, answered, held.version)
                    await channel.send([identity, *answer])
                if not apart:
                    copied.update(self.answered)
                self.held.clear()


def first_data(parts: tuple[protocol.FetchPart, ...]) -> protocol.MultiFetchReply:
    """Each part answered with one message naming its partition."""
    answers = []
    for part in parts:
        data = encode_message(b"partition %d" % part.partition, timestamp_ms=0)
        fetched = protocol.FetchReply(len(data), 0, data, 0, (EpochEntry(0, 0),))
        frames = protocol.encode_reply(0, fetched, protocol.PRODUCERS_FETCH_VERSION)
        answers.append(protocol.fetch_part_reply(part.topic, part.partition, frames))
    return protocol.MultiFetchReply(tuple(answers))


async def play_idle_leader(
    live: LiveContext, answer: Callable[[protocol.MultiFetchRequest, int], int]
) -> None:
    """Answer every MULTI_FETCH on `live`'s ROUTER, each part at the high watermark `answer`
    gives for the request and the count of requests so far (its offset or 38, say): empty,
    or a message "new" at the offset when that is past the offset."""
    channel = TrioSocket(live.server, lambda socket, flags: socket.recv_multipart(flags))
    data = encode_message(b"new", timestamp_ms=0)
    for count in itertools.count(1):
        identity, *frames = await channel.receive()
        header, request = protocol.decode_request(frames)
        assert isinstance(request, protocol.MultiFetchRequest)
        high_watermark = answer(request, count)
        answers = []
        for part in request.parts:
            fetched = protocol.FetchReply(high_watermark, 0, b"", 0)
            if high_watermark > part.offset:
                entries = (EpochEntry(0, part.offset),)
                fetched = protocol.FetchReply(high_watermark, 0, data, 0, entries)
            encoded = protocol.encode_reply(0, fetched, protocol.PRODUCERS_FETCH_VERSION)
            answers.append(protocol.fetch_part_reply(part.topic, part.partition, encoded))
        reply = protocol.MultiFetchReply(tuple(answers))  # no session: every part answered
        replied = protocol.encode_reply(header.correlation_id, reply, header.version)
        await channel.send([identity, *replied])


@pytest.fixture
async def live() -> AsyncIterator[LiveContext]:
    live = LiveContext()
    yield live
    live.close()


EPOCHS = EpochRound()
"""The followers' round of epoch writes, as a worker has one (one trio run at a time uses it)."""


def follower(
    number: int, plogs: dict[int, PartitionLog], fetchers: Fetchers, endpoint: str, epoch: int = 0
) -> Follower:
    async def copied(count: int) -> None:
        plogs[number].flush()

    role = Role(1, endpoint, epoch)
    plog = plogs[number]
    return Follower(
        2, "clicks", number, lambda: plog, role, 1 << 20, 60_000, copied, fetchers, EPOCHS
    )


async def test_the_partitions_followed_from_one_leader_share_one_connection(
    live: LiveContext, tmp_path: Path
) -> None:
    plogs = {n: PartitionLog.open(tmp_path / f"clicks-{n}") for n in range(PARTITIONS)}
    async with copying_from_played_leader(live, plogs) as (leader, fetchers):
        assert len(fetchers) == 1
        assert len(set(leader.identities)) == 1  # every request on one connection
        # Answered last first: each reply reached the partition that asked for it.
        assert {n: stored(p) for n, p in plogs.items()} == {
            n: [b"partition %d" % n] for n in range(PARTITIONS)
        }


@contextlib.asynccontextmanager
async def copying_from_played_leader(
    live: LiveContext, plogs: dict[int, PartitionLog], together: bool = False
) -> AsyncIterator[tuple[PlayedLeader, Fetchers]]:
    """Copy loops of `plogs` following a PlayedLeader on `live` (`together` passed on), once
    each log's high watermark moved (its first message copied); stopped at the end."""
    leader = PlayedLeader(live, together)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(leader.serve)
        fetchers = Fetchers(2, live.context, nursery, IDLE_WAIT_MAX_MS)
        for number in plogs:
            nursery.start_soon(follower(number, plogs, fetchers, live.endpoint).run)
        with trio.fail_after(10):
            while any(p.flushed_offset == 0 for p in plogs.values()):
                await trio.sleep(0.01)
        yield leader, fetchers
        nursery.cancel_scope.cancel()


async def test_the_epochs_copied_in_one_turn_are_written_with_two_syncfs_not_an_fsync_each(
    live: LiveContext, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first bytes of an epoch, copied to several partitions from one reply, have their
    histories written together before them: two syncfs for all of them, not an fsync of each
    history file and of each folder in turn (what a leader change over many partitions cost)."""
    plogs = {n: PartitionLog.open(tmp_path / f"clicks-{n}") for n in range(PARTITIONS)}
    fsynced: list[str] = []
    synced_file_systems: list[str] = []
    fsync = os.fsync

    def counted_fsync(fd: int) -> None:
        fsynced.append(os.readlink(f"/proc/self/fd/{fd}"))
        fsync(fd)

    def counted_syncfs(fd: int) -> None:
        synced_file_systems.append(os.readlink(f"/proc/self/fd/{fd}"))
        syncfs(fd)

    monkeypatch.setattr(os, "fsync", counted_fsync)
    monkeypatch.setattr("broker.log.epochs.syncfs", counted_syncfs)
    async with copying_from_played_leader(live, plogs, together=True) as (leader, _):
        assert len(leader.fetches[0]) < PARTITIONS  # the first fetches left apart
    histories = [f for f in fsynced if "leader-epoch" in f or Path(f).name.startswith("clicks-")]
    assert histories == []
    assert len(synced_file_systems) == 2
    for number, plog in plogs.items():
        assert plog.epochs.entries == (EpochEntry(0, 0),)
        assert LeaderEpochs.load(tmp_path / f"clicks-{number}").entries == (EpochEntry(0, 0),)
        assert stored(plog) == [b"partition %d" % number]


async def test_a_fetcher_closes_with_the_last_partition_that_follows_from_it(
    live: LiveContext, tmp_path: Path
) -> None:
    plogs = {n: PartitionLog.open(tmp_path / f"clicks-{n}") for n in range(2)}
    leader = PlayedLeader(live)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(leader.serve)
        fetchers = Fetchers(2, live.context, nursery, IDLE_WAIT_MAX_MS)
        scopes = [trio.CancelScope() for _ in range(2)]

        async def run(number: int) -> None:
            with scopes[number]:
                await follower(number, plogs, fetchers, live.endpoint).run()

        for number in range(2):
            nursery.start_soon(run, number)
        with trio.fail_after(10):
            while len(leader.answered) < 2:  # both partitions' first fetch came
                await trio.sleep(0.01)
        scopes[0].cancel()
        await trio.testing.wait_all_tasks_blocked()
        assert len(fetchers) == 1  # partition 1 still follows broker 1
        scopes[1].cancel()
        await trio.testing.wait_all_tasks_blocked()
        assert len(fetchers) == 0
        # A partition that follows broker 1 again connects anew.
        nursery.start_soon(follower(0, plogs, fetchers, live.endpoint, epoch=1).run)
        with trio.fail_after(10):
            while len(set(leader.identities)) < 2:
                await trio.sleep(0.01)
        nursery.cancel_scope.cancel()


async def test_fetches_asked_for_in_one_turn_leave_as_one_multi_fetch(
    live: LiveContext,
) -> None:
    leader = PlayedLeader(live)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(leader.serve)
        fetchers = Fetchers(2, live.context, nursery, IDLE_WAIT_MAX_MS)
        fetcher = fetchers.acquire(Role(1, live.endpoint, 0).source)
        got: dict[int, bytes] = {}

        async def fetch(number: int) -> None:
            part = protocol.FetchPart("clicks", number, 0, 1 << 20, 0, 0)
            reply = await fetcher.fetch(part, 0, 60_000, 10)
            got[number] = bytes(reply.message_set)

        async with trio.open_nursery() as loops:
            for number in range(PARTITIONS):
                loops.start_soon(fetch, number)
        assert [sorted(numbers) for numbers in leader.fetches] == [list(range(PARTITIONS))]
        assert got == {
            n: encode_message(b"partition %d" % n, timestamp_ms=0) for n in range(PARTITIONS)
        }
        fetchers.release(fetcher)
        nursery.cancel_scope.cancel()


async def test_an_answer_with_nothing_new_is_asked_again_without_waking_the_copy_loop(
    live: LiveContext,
) -> None:
    """A partition followed idle: its part answered empty at the same high watermark goes
    again in the next MULTI_FETCH, and its copy loop is handed only what is new."""
    requests: list[tuple[int, ...]] = []
    size = len(encode_message(b"new", timestamp_ms=0))

    def answer(request: protocol.MultiFetchRequest, count: int) -> int:
        requests.append(tuple(part.offset for part in request.parts))
        return 38 + size if count == 3 else 38  # empty at 38 twice, then a message

    async with trio.open_nursery() as nursery:
        nursery.start_soon(play_idle_leader, live, answer)
        fetchers = Fetchers(2, live.context, nursery, IDLE_WAIT_MAX_MS)
        fetcher = fetchers.acquire(Role(1, live.endpoint, 0).source)
        part = protocol.FetchPart("clicks", 0, 38, 1 << 20, 0, 38)
        with trio.fail_after(10):
            reply = await fetcher.fetch(part, 38, 100, 10)
        assert requests == [(38,), (38,), (38,)]  # asked three times, handed back once
        assert bytes(reply.message_set) == encode_message(b"new", timestamp_ms=0)
        fetchers.release(fetcher)
        nursery.cancel_scope.cancel()


async def test_an_idle_leaders_long_polls_grow_and_new_data_brings_them_back(
    live: LiveContext,
) -> None:
    """Rounds that bring nothing new double the next long poll (replica_fetch_wait_ms, 100
    here), up to the fetcher's most (400 here); a round that brings data sets it back, and
    the wait for a reply grows with the long poll."""
    waits: list[int] = []
    size = len(encode_message(b"new", timestamp_ms=0))

    def answer(request: protocol.MultiFetchRequest, count: int) -> int:
        waits.append(request.max_wait_ms)
        offset = request.parts[0].offset
        return offset + size if count == 6 else offset  # empty five times, then a message

    async with trio.open_nursery() as nursery:
        nursery.start_soon(play_idle_leader, live, answer)
        fetchers = Fetchers(2, live.context, nursery, 400)
        fetcher = fetchers.acquire(Role(1, live.endpoint, 0).source)
        part = protocol.FetchPart("clicks", 0, 38, 1 << 20, 0, 38)
        with trio.fail_after(10):
            reply = await fetcher.fetch(part, 38, 100, 0.5)  # 0.5 s: no 400 ms poll failed
        end = 38 + len(reply.message_set)
        with trio.fail_after(10):
            while len(waits) < 7:  # the next fetch, after the data
                with trio.move_on_after(0.05):
                    await fetcher.fetch(
                        protocol.FetchPart("clicks", 0, end, 1 << 20, 0, end), end, 100, 0.5
                    )
        assert waits[:7] == [100, 200, 400, 400, 400, 400, 100]
        fetchers.release(fetcher)
        nursery.cancel_scope.cancel()


def empty_answers(parts: tuple[protocol.FetchPart, ...]) -> tuple[protocol.FetchPartReply, ...]:
    """Each of `parts` of "clicks" answered with nothing, its offset the high watermark."""
    return tuple(
        protocol.fetch_part_reply(
            "clicks",
            part.partition,
            protocol.encode_reply(
                0, protocol.FetchReply(part.offset, 0, b"", 0), protocol.PRODUCERS_FETCH_VERSION
            ),
        )
        for part in parts
    )


def message_answer(number: int, data: bytes) -> protocol.FetchPartReply:
    """Partition `number` of "clicks" answered with `data` at offset 38, of epoch 0."""
    fetched = protocol.FetchReply(38 + len(data), 0, data, 0, (EpochEntry(0, 38),))
    encoded = protocol.encode_reply(0, fetched, protocol.PRODUCERS_FETCH_VERSION)
    return protocol.fetch_part_reply("clicks", number, encoded)


async def follow_both(follow: Callable[[int], Awaitable[None]], done: Callable[[], bool]) -> None:
    """Run copy loops `follow(0)` and `follow(1)` until `done()` (10 s at most)."""
    async with trio.open_nursery() as loops:
        for number in (0, 1):
            loops.start_soon(follow, number)
        with trio.fail_after(10):
            while not done():
                await trio.sleep(0.01)
        loops.cancel_scope.cancel()


async def test_a_fetcher_goes_on_in_a_fetch_session_naming_only_what_changed(
    live: LiveContext,
) -> None:
    """Against a leader played with fetch sessions (MULTI_FETCH version 2): the first fetch
    begins a session with both partitions; the next names none (nothing changed) and gets
    partition 1's message unnamed; the one after names partition 1 alone, at its new offset;
    told FETCH_SESSION_ID_NOT_FOUND, the fetcher begins a new session with every partition."""
    seen: list[tuple[int, int, tuple[int, ...]]] = []  # (session_id, epoch, partitions named)
    data = encode_message(b"new", timestamp_ms=0)

    async def serve() -> None:
        channel = TrioSocket(live.server, lambda socket, flags: socket.recv_multipart(flags))
        while True:
            identity, *frames = await channel.receive()
            header, request = protocol.decode_request(frames)
            assert isinstance(request, protocol.MultiFetchRequest)
            assert header.version == 2
            seen.append(
                (
                    request.session_id,
                    request.session_epoch,
                    tuple(sorted(p.partition for p in request.parts)),  # in any order
                )
            )
            if len(seen) == 4:  # the session is forgotten
                error = protocol.encode_error(header.correlation_id, FetchSessionIdNotFound("x"))
                await channel.send([identity, *error])
                continue
            answers = empty_answers(request.parts)  # those named: empty at their offset
            if len(seen) == 2:  # partition 1's message, unnamed
                answers += (message_answer(1, data),)
            reply = protocol.MultiFetchReply(answers, 0, 1 << 20 | 9)
            replied = protocol.encode_reply(header.correlation_id, reply, header.version)
            await channel.send([identity, *replied])

    async with trio.open_nursery() as nursery:
        nursery.start_soon(serve)
        fetchers = Fetchers(2, live.context, nursery, IDLE_WAIT_MAX_MS)
        fetcher = fetchers.acquire(Role(1, live.endpoint, 0).source)
        got: dict[int, bytes] = {}

        async def follow(number: int) -> None:
            offset = 38
            while True:  # until cancelled, below: bounded by the five fetches awaited
                part = protocol.FetchPart("clicks", number, offset, 1 << 20, 0, offset)
                reply = await fetcher.fetch(part, offset, 50, 10)
                got[number] = bytes(reply.message_set)
                offset += len(reply.message_set)

        await follow_both(follow, lambda: len(seen) >= 5)
        assert seen[:5] == [
            (0, 0, (0, 1)),  # begun with both
            (1 << 20 | 9, 1, ()),  # nothing changed: none named
            (1 << 20 | 9, 2, (1,)),  # partition 1 at its new offset
            (1 << 20 | 9, 3, ()),  # refused: the session is gone
            (0, 0, (0, 1)),  # begun again with every partition
        ]
        assert got[1] == data
        fetchers.release(fetcher)
        nursery.cancel_scope.cancel()


async def test_a_session_has_one_fetch_in_flight_and_a_late_copy_goes_on_its_own(
    live: LiveContext,
) -> None:
    """One fetch of a session is in flight at a time. Its next fetch waits a while for the
    copy loops handed bytes to ask again; one that asks later, while the session's long poll
    is in flight, is sent at once on its own (version 1, no session: its new position moves
    the leader's high watermark now), and once answered with nothing new it joins the
    session's next fetch, named there at its new position."""
    seen: list[tuple[int, int, tuple[tuple[int, int], ...]]] = []  # (version, epoch, parts)
    data = encode_message(b"new", timestamp_ms=0)
    copied = trio.Event()  # partition 1's copy loop asks again once this is set
    on_its_own = trio.Event()
    held: list[tuple[bytes, int]] = []  # the session's long poll, unanswered

    def answer(parts: tuple[protocol.FetchPart, ...], session_id: int) -> protocol.Reply:
        return protocol.MultiFetchReply(empty_answers(parts), 0, session_id)

    async def serve() -> None:
        channel = TrioSocket(live.server, lambda socket, flags: socket.recv_multipart(flags))
        while True:
            identity, *frames = await channel.receive()
            header, request = protocol.decode_request(frames)
            assert isinstance(request, protocol.MultiFetchRequest)
            parts = tuple(sorted((p.partition, p.offset) for p in request.parts))
            seen.append((header.version, request.session_epoch, parts))
            reply: protocol.Reply
            if len(seen) == 1:  # the session begun: partition 1's message
                reply = protocol.MultiFetchReply((message_answer(1, data),), 0, 1 << 20 | 9)
            elif len(seen) == 2:  # the next fetch, without partition 1 (still copying)
                held.append((identity, header.correlation_id))
                copied.set()
                continue
            elif len(seen) == 3:  # partition 1 on its own: nothing new; then the long poll ends
                on_its_own.set()
                reply = answer(request.parts, 0)
                own = protocol.encode_reply(header.correlation_id, reply, header.version)
                await channel.send([identity, *own])
                await trio.testing.wait_all_tasks_blocked()
                held_identity, held_id = held.pop()
                reply = answer((), 1 << 20 | 9)
                ended = protocol.encode_reply(held_id, reply, 2)
                await channel.send([held_identity, *ended])
                continue
            else:
                reply = answer(request.parts, 1 << 20 | 9)
            replied = protocol.encode_reply(header.correlation_id, reply, header.version)
            await channel.send([identity, *replied])

    async with trio.open_nursery() as nursery:
        nursery.start_soon(serve)
        fetchers = Fetchers(2, live.context, nursery, IDLE_WAIT_MAX_MS)
        fetcher = fetchers.acquire(Role(1, live.endpoint, 0).source)

        async def follow(number: int) -> None:
            offset = 38
            while True:  # until cancelled, below: bounded by the four fetches awaited
                part = protocol.FetchPart("clicks", number, offset, 1 << 20, 0, offset)
                reply = await fetcher.fetch(part, offset, 50, 10)
                if reply.message_set:
                    await copied.wait()  # a slow copy: the session's next fetch leaves first
                offset += len(reply.message_set)

        await follow_both(follow, lambda: len(seen) >= 4)
        new = 38 + len(data)
        assert seen[:4] == [
            (2, 0, ((0, 38), (1, 38))),  # begun with both
            (2, 1, ()),  # partition 1 still copying: forgotten, none named
            (1, -1, ((1, new),)),  # partition 1 on its own, while the session's poll waits
            (2, 2, ((1, new),)),  # then named in the session at its new position
        ]
        assert on_its_own.is_set()
        fetchers.release(fetcher)
        nursery.cancel_scope.cancel()
