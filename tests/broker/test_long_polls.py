"""Who a flush wakes: the waiters of a partition (long-poll FETCHes and ack=flushed producers)
keyed by the high watermark each needs, so that a flush wakes only those it satisfies, and
deleting a partition, taking it offline or a waiter's own timeout leave nothing behind."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio
import trio.testing
import zmq

from broker import protocol
from broker.control import DeletePartitions
from broker.flush_waiters import FlushWaiters, FlushWaitersStatistics
from broker.protocol import Ack, Api, ErrorCode
from broker.transport import STATE
from tests.broker.test_worker import CLIENT, idle_worker, produce_frames, replies_in

HOUR_MS = 3_600_000
PRODUCE_ID = 7
"""The correlation id of produce_frames' requests; fetches here use ids from 100."""


@pytest.fixture
def sockets() -> Iterator[tuple[zmq.Socket[bytes], zmq.Socket[bytes]]]:
    """(the supervisor's end, the worker's end) of an inproc DEALER pair with no message
    limit, as run_worker sets it (thousands of replies wait there unread)."""
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    supervisor = context.socket(zmq.DEALER)
    supervisor.setsockopt(zmq.RCVHWM, 0)
    supervisor.bind("inproc://worker")
    worker_end = context.socket(zmq.DEALER)
    worker_end.setsockopt(zmq.SNDHWM, 0)
    worker_end.connect("inproc://worker")
    yield supervisor, worker_end
    context.destroy(linger=0)


def fetch_frames(
    min_bytes: int, max_wait_ms: int = HOUR_MS, correlation_id: int = 1
) -> list[bytes]:
    header = protocol.RequestHeader(Api.FETCH, 1, correlation_id, "tests")
    request = protocol.FetchRequest("audit", 0, 0, 1 << 20, max_wait_ms, min_bytes)
    return [bytes(f) for f in protocol.encode_request(header, request)]


def received(supervisor: zmq.Socket[bytes]) -> list[list[bytes]]:
    """Every reply the worker has sent so far (its routing frame stripped)."""
    replies = []
    while supervisor.poll(0):
        message = supervisor.recv_multipart()
        if message[0] != STATE:  # the worker's report of a command
            for tagged, *frames in replies_in(message):
                assert tagged == CLIENT
                replies.append(frames)
    return replies


def codes(replies: list[list[bytes]]) -> dict[int, ErrorCode]:
    """correlation id -> error code of each reply."""
    headers = [protocol.decode_reply_header(frames) for frames in replies]
    return {h.correlation_id: ErrorCode(h.error_code) for h in headers}


class LongPollWakeUps(trio.abc.Instrument):
    """The long-poll tasks scheduled to run (woken) while installed."""

    def __init__(self) -> None:
        self.tasks: set[trio.lowlevel.Task] = set()

    def task_scheduled(self, task: trio.lowlevel.Task) -> None:
        if task.name.endswith("._long_poll"):
            self.tasks.add(task)


# -- the structure on its own -------------------------------------------------------------


async def wait_and_note(waiters: FlushWaiters, offset: int, done: list[int]) -> None:
    await waiters.wait_high_watermark(offset)
    done.append(offset)


async def test_a_new_high_watermark_wakes_only_the_waiters_it_reaches() -> None:
    waiters = FlushWaiters()
    done: list[int] = []
    async with trio.open_nursery() as nursery:
        for offset in (40, 10, 30, 20, 30):
            nursery.start_soon(wait_and_note, waiters, offset, done)
        await trio.testing.wait_all_tasks_blocked()
        assert waiters.statistics().waiting == 5

        assert waiters.note_high_watermark(25) == 2
        await trio.testing.wait_all_tasks_blocked()
        assert sorted(done) == [10, 20]

        assert waiters.note_high_watermark(29) == 0
        assert waiters.note_high_watermark(30) == 2
        await trio.testing.wait_all_tasks_blocked()
        assert sorted(done) == [10, 20, 30, 30]
        assert waiters.statistics().waiting == 1

        assert waiters.wake_all() == 1
    assert sorted(done) == [10, 20, 30, 30, 40]
    assert waiters.statistics() == FlushWaitersStatistics(waiting=0, entries=0, woken=5)


async def test_wake_all_wakes_every_waiter_whatever_it_needs() -> None:
    waiters = FlushWaiters()
    done: list[int] = []
    async with trio.open_nursery() as nursery:
        for offset in range(100):
            nursery.start_soon(wait_and_note, waiters, offset * 1_000_000, done)
        await trio.testing.wait_all_tasks_blocked()
        assert waiters.wake_all() == 100
    assert sorted(done) == [offset * 1_000_000 for offset in range(100)]
    assert waiters.statistics().waiting == waiters.statistics().entries == 0


async def test_a_cancelled_waiter_is_removed_and_never_counted_as_woken() -> None:
    waiters = FlushWaiters()
    done: list[int] = []
    async with trio.open_nursery() as nursery:
        scopes = []
        for offset in range(5_000):
            scope = trio.CancelScope()
            scopes.append(scope)

            async def wait_in(scope: trio.CancelScope = scope, offset: int = offset) -> None:
                with scope:
                    await wait_and_note(waiters, offset, done)

            nursery.start_soon(wait_in)
        await trio.testing.wait_all_tasks_blocked()
        for scope in scopes[::2]:  # the even offsets time out
            scope.cancel()
        await trio.testing.wait_all_tasks_blocked()
        stats = waiters.statistics()
        assert stats.waiting == 2_500
        assert stats.entries <= 2 * stats.waiting  # cancelled entries do not pile up

        assert waiters.note_high_watermark(99) == 50  # the odd offsets under 100
        await trio.testing.wait_all_tasks_blocked()
        assert sorted(done) == list(range(1, 100, 2))
        for scope in scopes:
            scope.cancel()
    assert waiters.statistics().waiting == waiters.statistics().entries == 0
    assert waiters.statistics().woken == 50


# -- in a worker --------------------------------------------------------------------------


async def test_a_flush_wakes_only_the_long_polls_it_satisfies(
    tmp_path: Path,
    sockets: tuple[zmq.Socket[bytes], zmq.Socket[bytes]],
    mock_clock: trio.testing.MockClock,
) -> None:
    # 1,000 long polls for 1 MiB (no flush here brings that much) and 10 for one byte: a flush
    # of one message must wake the 10, not the 1,010. Wake-ups are counted by an instrument
    # on trio's scheduler, whatever the worker's own structure.
    supervisor, worker_end = sockets
    worker = idle_worker(worker_end)
    wake_ups = LongPollWakeUps()
    try:
        async with trio.open_nursery() as nursery:
            worker.nursery = nursery
            worker._open("audit", 0, tmp_path, worker.config.log_config())
            for i in range(100, 1_100):
                await worker._serve_request(CLIENT, fetch_frames(1 << 20, correlation_id=i))
            for i in range(1_100, 1_110):
                await worker._serve_request(CLIENT, fetch_frames(1, correlation_id=i))
            await trio.testing.wait_all_tasks_blocked()
            assert received(supervisor) == []

            trio.lowlevel.add_instrument(wake_ups)
            try:
                for _ in range(3):
                    await worker._serve_request(CLIENT, produce_frames(Ack.WRITTEN))
                    await worker.flusher.group_commit()
                    worker.flusher.flush(worker.partitions[("audit", 0)])
                    await trio.testing.wait_all_tasks_blocked()
            finally:
                trio.lowlevel.remove_instrument(wake_ups)
            answered = codes(received(supervisor))
            assert answered.pop(PRODUCE_ID) == ErrorCode.NONE
            assert len(wake_ups.tasks) == 10
            assert answered == {i: ErrorCode.NONE for i in range(1_100, 1_110)}
            stats = worker.partitions[("audit", 0)].waiters.statistics()
            assert stats.waiting == 1_000 and stats.woken == 10
            nursery.cancel_scope.cancel()
    finally:
        worker.close()


async def test_long_polls_that_time_out_leave_no_waiter_behind(
    tmp_path: Path,
    sockets: tuple[zmq.Socket[bytes], zmq.Socket[bytes]],
    autojump_clock: trio.testing.MockClock,
) -> None:
    supervisor, worker_end = sockets
    worker = idle_worker(worker_end)
    try:
        async with trio.open_nursery() as nursery:
            worker.nursery = nursery
            worker._open("audit", 0, tmp_path, worker.config.log_config())
            waiters = worker.partitions[("audit", 0)].waiters
            for i in range(5_000):
                frames = fetch_frames(1 << 20, max_wait_ms=100 + i % 7, correlation_id=i)
                await worker._serve_request(CLIENT, frames)
            await trio.testing.wait_all_tasks_blocked()
            assert waiters.statistics().waiting == 5_000
            await trio.sleep(1)  # the mock clock's second: every max_wait_ms has passed
            replies = received(supervisor)
            nursery.cancel_scope.cancel()
        assert codes(replies) == {i: ErrorCode.NONE for i in range(5_000)}
        assert all(protocol.decode_reply(Api.FETCH, r).message_set == b"" for r in replies)
        assert waiters.statistics().waiting == waiters.statistics().entries == 0
    finally:
        worker.close()


async def test_deleting_a_partition_answers_every_waiter(
    tmp_path: Path,
    sockets: tuple[zmq.Socket[bytes], zmq.Socket[bytes]],
    mock_clock: trio.testing.MockClock,
) -> None:
    supervisor, worker_end = sockets
    worker = idle_worker(worker_end)
    try:
        async with trio.open_nursery() as nursery:
            worker.nursery = nursery
            worker._open("audit", 0, tmp_path, worker.config.log_config())
            partition = worker.partitions[("audit", 0)]
            waiters = partition.waiters
            for i in range(100, 200):
                await worker._serve_request(CLIENT, fetch_frames(1 << 20, correlation_id=i))
            await worker._serve_request(CLIENT, produce_frames(Ack.FLUSHED))
            await trio.testing.wait_all_tasks_blocked()
            assert waiters.statistics().waiting == 100 and len(partition.replica.acks) == 1

            folder = str(tmp_path / "audit-0")
            await worker._run_command(DeletePartitions("audit", ((0, folder),)))
            await trio.testing.wait_all_tasks_blocked()
            replies = received(supervisor)
            nursery.cancel_scope.cancel()
        assert len(replies) == 101
        assert set(codes(replies).values()) == {ErrorCode.UNKNOWN_TOPIC_OR_PARTITION}
        assert waiters.statistics().waiting == waiters.statistics().entries == 0
    finally:
        worker.close()


async def test_a_failed_fsync_answers_waiting_producers_and_long_polls(
    tmp_path: Path,
    sockets: tuple[zmq.Socket[bytes], zmq.Socket[bytes]],
    mock_clock: trio.testing.MockClock,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Producers waiting on ack=flushed are told STORAGE_ERROR (never acked), long polls
    # PARTITION_UNAVAILABLE: the partition is offline while its log is reopened.
    supervisor, worker_end = sockets
    worker = idle_worker(worker_end)

    def failing_fsync(fd: int) -> None:
        raise OSError(5, "Input/output error (injected)")

    try:
        async with trio.open_nursery() as nursery:
            worker.nursery = nursery
            worker._open("audit", 0, tmp_path, worker.config.log_config())
            partition = worker.partitions[("audit", 0)]
            for i in range(100, 200):
                await worker._serve_request(CLIENT, fetch_frames(1 << 20, correlation_id=i))
            await worker._serve_request(CLIENT, produce_frames(Ack.FLUSHED))
            await trio.testing.wait_all_tasks_blocked()
            assert (
                partition.waiters.statistics().waiting == 100 and len(partition.replica.acks) == 1
            )

            monkeypatch.setattr(os, "fsync", failing_fsync)
            await worker.flusher.group_commit()  # the produce waits for it
            await trio.testing.wait_all_tasks_blocked()
            replies = received(supervisor)
            assert partition.offline is not None
            nursery.cancel_scope.cancel()
        answered = codes(replies)
        assert answered.pop(PRODUCE_ID) == ErrorCode.STORAGE_ERROR
        assert answered == {i: ErrorCode.PARTITION_UNAVAILABLE for i in range(100, 200)}
        assert partition.waiters.statistics().waiting == 0
        assert partition.waiters.statistics().entries == 0
    finally:
        worker.close()


class ServeWakeUps(trio.abc.Instrument):
    """How often the worker's receive loop (Worker.serve) is scheduled while installed."""

    def __init__(self) -> None:
        self.count = 0

    def task_scheduled(self, task: trio.lowlevel.Task) -> None:
        if task.name.endswith("Worker.serve"):
            self.count += 1


async def test_replies_sent_by_other_tasks_do_not_wake_the_idle_receive_loop(
    tmp_path: Path,
    sockets: tuple[zmq.Socket[bytes], zmq.Socket[bytes]],
    mock_clock: trio.testing.MockClock,
) -> None:
    # 50 long polls answered by one flush each send a reply. A send may consume the edge of
    # the socket's fd, so the receive loop must look again, but only when a message waits:
    # waking it after every turn that sent a reply was a fifth of the worker's CPU at a few
    # requests in flight, where each turn sends one.
    supervisor, worker_end = sockets
    worker = idle_worker(worker_end)
    wake_ups = ServeWakeUps()
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(worker.serve)
            worker._open("audit", 0, tmp_path, worker.config.log_config())
            for i in range(100, 150):
                await worker._serve_request(CLIENT, fetch_frames(1, correlation_id=i))
            await worker._serve_request(CLIENT, produce_frames(Ack.WRITTEN))
            await trio.testing.wait_all_tasks_blocked()
            trio.lowlevel.add_instrument(wake_ups)
            try:
                worker.flusher.flush(worker.partitions[("audit", 0)])
                await trio.testing.wait_all_tasks_blocked()
            finally:
                trio.lowlevel.remove_instrument(wake_ups)
            answered = codes(received(supervisor))
            nursery.cancel_scope.cancel()
        assert answered == {
            PRODUCE_ID: ErrorCode.NONE,
            **dict.fromkeys(range(100, 150), ErrorCode.NONE),
        }
        assert wake_ups.count == 0
    finally:
        worker.close()
