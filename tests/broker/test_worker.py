"""The worker on its own: a real trio nursery and real ZeroMQ sockets (inproc), no supervisor."""

from __future__ import annotations

import errno
import gc
import os
from collections.abc import Iterable, Iterator
from pathlib import Path

import pytest
import trio
import trio.testing
import zmq

from broker import control, protocol
from broker.clock import SYSTEM_CLOCK, Clock
from broker.config import BrokerConfig
from broker.errors import StorageIOError
from broker.flusher import FLUSH_RETRY_S, Flusher
from broker.log import encode_message, fsdir
from broker.log.segment import Segment
from broker.protocol import Ack, Api
from broker.served import Partition
from broker.transport import (
    CREDIT,
    FROM_DEALER,
    REPLIES,
    STATE,
    receive_from_supervisor,
    requests_frame,
)
from broker.trio_socket import TrioSocket
from broker.worker import Worker
from tests.conftest import synced_paths

HOUR_MS = 3_600_000
CLIENT = FROM_DEALER + b"client"


@pytest.fixture
def sockets() -> Iterator[tuple[zmq.Socket[bytes], zmq.Socket[bytes]]]:
    """(the supervisor's end, the worker's end) of an inproc DEALER pair."""
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    supervisor = context.socket(zmq.DEALER)
    supervisor.bind("inproc://worker")
    worker_end = context.socket(zmq.DEALER)
    worker_end.connect("inproc://worker")
    yield supervisor, worker_end
    context.destroy(linger=0)


class TrioClock:
    """broker.clock.Clock read off trio's clock (a MockClock in the tests that use it), with
    an origin of its own, as time.monotonic's differs from trio's."""

    def monotonic(self) -> float:
        return trio.current_time() - 10_000.0

    def time(self) -> float:
        return trio.current_time() + 1_700_000_000.0


def idle_worker(
    worker_end: zmq.Socket[bytes],
    when_idle: bool = False,
    clock: Clock = SYSTEM_CLOCK,
    **settings: object,
) -> Worker:
    """A worker whose partitions flush only on the hour (or on a group commit for producers
    waiting on ack=flushed; whenever it is idle only `when_idle`), with `settings` besides."""
    config = BrokerConfig(
        {
            "log_flush_interval_ms": HOUR_MS,
            "log_flush_messages": 1_000_000,
            "log_flush_when_idle": when_idle,
            **settings,
        }
    )
    return Worker(0, config, TrioSocket(worker_end, receive_from_supervisor), clock)


def replies_in(message: list[bytes]) -> list[list[bytes]]:
    """The replies in a message from the worker, each [tagged identity, *frames]: one, those
    of a REPLIES message, or none (its hello, or the credit it gives back)."""
    if message[0] in (STATE, CREDIT):
        return []
    if message[0][:1] == REPLIES:
        return [message[i : i + 2] for i in range(1, len(message), 2)]
    return [message]


async def replies_from(supervisor: zmq.Socket[bytes], count: int) -> list[list[bytes]]:
    """The first `count` replies the worker sends (replies_in), waiting 10 s at most."""
    replies: list[list[bytes]] = []
    with trio.fail_after(10):
        while len(replies) < count:
            if supervisor.poll(0):
                replies += replies_in(supervisor.recv_multipart())
            else:
                await trio.sleep(0.01)
    return replies


def counted_fsyncs(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The descriptors os.fsync is called with from now on (the calls go through)."""
    fsyncs: list[int] = []
    fsync = os.fsync

    def counted_fsync(fd: int) -> None:
        fsyncs.append(fd)
        fsync(fd)

    monkeypatch.setattr(os, "fsync", counted_fsync)
    return fsyncs


def produce_frames(ack: Ack, correlation_id: int = 7) -> list[bytes]:
    data = encode_message(b"pending", timestamp_ms=0)
    header = protocol.RequestHeader(Api.PRODUCE, 1, correlation_id, "tests")
    request = protocol.ProduceRequest("audit", 0, ack, data)
    return [bytes(f) for f in protocol.encode_request(header, request)]


async def test_shutdown_acks_producers_still_waiting_for_a_flush(
    tmp_path: Path, sockets: tuple[zmq.Socket[bytes], zmq.Socket[bytes]]
) -> None:
    # Without the receive loop nothing flushes (no group commit, an hour's flush interval):
    # the producer waits until the shutdown's flush, and must get its ack from it.
    supervisor, worker_end = sockets
    worker = idle_worker(worker_end)
    try:
        async with trio.open_nursery() as nursery:
            worker.nursery = nursery
            worker._open("audit", 0, tmp_path, worker.config.log_config())
            await worker._serve_request(CLIENT, produce_frames(Ack.FLUSHED))
            await trio.testing.wait_all_tasks_blocked()
            assert supervisor.poll(0) == 0  # waiting for its flush
            await worker.flush_and_answer(5.0)
            nursery.cancel_scope.cancel()
        ((tagged, *reply),) = replies_in(supervisor.recv_multipart(zmq.NOBLOCK))
        assert tagged == CLIENT
        assert protocol.decode_reply(Api.PRODUCE, reply).base_offset == 0
    finally:
        worker.close()


async def answer_one_produce(worker: Worker, supervisor: zmq.Socket[bytes], tmp_path: Path) -> None:
    """Have the serving `worker` open partition audit-0 under `tmp_path` and answer one
    ack=written PRODUCE to it (the reply left unread on `supervisor`)."""
    worker._open("audit", 0, tmp_path, worker.config.log_config())
    supervisor.send_multipart([requests_frame(1), CLIENT, *produce_frames(Ack.WRITTEN)])
    with trio.fail_after(10):
        while not supervisor.poll(0):  # hello, then the produce reply
            await trio.sleep(0.01)


async def test_a_partition_is_flushed_at_its_deadline_and_the_timer_rests_until_then(
    tmp_path: Path,
    sockets: tuple[zmq.Socket[bytes], zmq.Socket[bytes]],
    autojump_clock: trio.testing.MockClock,
) -> None:
    # The flush deadline is on the partition logs' clock; trio's has another origin. Waiting
    # "until" it on trio's clock woke the timer at once, over and over (a core burnt while
    # any partition held unflushed data), or late, by the difference of the origins.
    # Judged on trio's MockClock, by the timer's turns (each looks at every partition).
    supervisor, worker_end = sockets
    worker = idle_worker(worker_end, clock=TrioClock())
    looks = 0
    flush = worker.flusher.flush

    def counted(partition: Partition, if_due: bool = False) -> bool:
        nonlocal looks
        looks += 1
        assert looks <= 10, "the flush timer spins"
        return flush(partition, if_due)

    worker.flusher.flush = counted  # type: ignore[method-assign]
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(worker.serve)
            await answer_one_produce(worker, supervisor, tmp_path)
            log = worker.partitions[("audit", 0)].log
            looks = 0
            await trio.sleep(HOUR_MS / 1000 - 1)  # the worker has nothing to do meanwhile
            assert log.local.statistics().pending_messages == 1
            assert looks <= 1, f"the flush timer turned {looks} times in an idle hour"
            await trio.sleep(2)
            assert log.local.statistics().pending_messages == 0
            nursery.cancel_scope.cancel()
    finally:
        worker.close()


@pytest.mark.parametrize("when_idle", [True, False])
async def test_an_idle_worker_flushes_new_messages_at_once_with_flush_when_idle(
    tmp_path: Path, sockets: tuple[zmq.Socket[bytes], zmq.Socket[bytes]], when_idle: bool
) -> None:
    # An hour's flush interval, a million messages' flush count, nobody waiting on ack=flushed:
    # with log.flush_when_idle (the default) the worker flushes the message once it has served
    # every request that came, so that consumers see it at once; without, it stays pending.
    supervisor, worker_end = sockets
    worker = idle_worker(worker_end, when_idle)
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(worker.serve)
            await answer_one_produce(worker, supervisor, tmp_path)
            await trio.testing.wait_all_tasks_blocked()  # the worker idle, waiting to read
            nursery.cancel_scope.cancel()
        log = worker.partitions[("audit", 0)].log
        assert log.log_end_offset > 0
        assert (log.flushed_offset == log.log_end_offset) is when_idle
    finally:
        worker.close()


async def test_every_request_of_a_requests_message_is_served_in_order(
    tmp_path: Path, sockets: tuple[zmq.Socket[bytes], zmq.Socket[bytes]]
) -> None:
    # The supervisor passes the requests it drained in one go as one message.
    supervisor, worker_end = sockets
    worker = idle_worker(worker_end)
    clients = [FROM_DEALER + b"client-%d" % i for i in range(3)]
    frames: list[bytes] = [requests_frame(len(clients))]
    for client in clients:
        frames += [client, *produce_frames(Ack.WRITTEN)]
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(worker.serve)
            worker._open("audit", 0, tmp_path, worker.config.log_config())
            supervisor.send_multipart(frames)
            replies: list[list[bytes]] = []
            with trio.fail_after(10):
                while len(replies) < len(clients):
                    if supervisor.poll(0):
                        message = supervisor.recv_multipart()
                        if message[0] != STATE:  # the worker's hello
                            replies.append(message)
                    else:
                        await trio.sleep(0.01)
            nursery.cancel_scope.cancel()
        assert [reply[0] for reply in replies] == clients
        offsets = [protocol.decode_reply(Api.PRODUCE, reply[1:]).base_offset for reply in replies]
        assert offsets == sorted(offsets) and len(set(offsets)) == len(clients)
    finally:
        worker.close()


async def test_a_flush_that_fails_without_failing_its_log_is_retried_with_a_pause(
    tmp_path: Path,
    sockets: tuple[zmq.Socket[bytes], zmq.Socket[bytes]],
    autojump_clock: trio.testing.MockClock,
) -> None:
    # A flush that finds no descriptor to reopen its segment with (EMFILE) raises
    # StorageIOError but leaves the log good and the flush due: tried again after a pause,
    # not in a loop that burns a core until descriptors free up.
    _, worker_end = sockets
    worker = idle_worker(worker_end, clock=TrioClock(), log_flush_interval_ms=1)
    attempts = 0

    def no_descriptor() -> None:
        nonlocal attempts
        attempts += 1
        raise StorageIOError("reopening 00000000000000000000.log: [Errno 24] Too many open files")

    try:
        async with trio.open_nursery() as nursery:
            worker.nursery = nursery
            worker._open("audit", 0, tmp_path, worker.config.log_config())
            await worker._serve_request(CLIENT, produce_frames(Ack.WRITTEN))
            plog = worker.partitions[("audit", 0)].log
            plog.local.segment_to_sync = no_descriptor  # type: ignore[method-assign]
            with trio.move_on_after(0.5):
                await worker.flusher.run()
            nursery.cancel_scope.cancel()
        # At the deadline (1 ms), then each FLUSH_RETRY_S: 0.001, 0.101, ..., 0.401 s.
        assert attempts == 1 + int((0.5 - 0.001) / FLUSH_RETRY_S)
        assert worker.partitions[("audit", 0)].offline is None  # the log did not fail
    finally:
        worker.close()


class TaskSpawns(trio.abc.Instrument):
    """How many tasks are spawned while installed."""

    def __init__(self) -> None:
        self.count = 0

    def task_spawned(self, task: trio.lowlevel.Task) -> None:
        self.count += 1


async def test_a_burst_of_acks_is_answered_by_one_flush_without_a_task_each(
    tmp_path: Path, sockets: tuple[zmq.Socket[bytes], zmq.Socket[bytes]]
) -> None:
    # A producer with 100 batches in flight at ack=flushed: the group commit after the burst
    # flushes once and acks all 100, in order, in one message to the supervisor. A trio task
    # per waiting ack (spawned, woken, each sending its reply) was a third of the worker's CPU
    # at 100 in flight.
    supervisor, worker_end = sockets
    worker = idle_worker(worker_end)
    burst = 100
    frames: list[bytes] = [requests_frame(burst)]
    for i in range(burst):
        frames += [CLIENT, *produce_frames(Ack.FLUSHED, correlation_id=i)]
    spawns = TaskSpawns()
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(worker.serve)
            worker._open("audit", 0, tmp_path, worker.config.log_config())
            trio.lowlevel.add_instrument(spawns)
            supervisor.send_multipart(frames)
            replies: list[list[bytes]] = []
            messages = 0
            with trio.fail_after(10):
                while len(replies) < burst:
                    if supervisor.poll(0):
                        message = supervisor.recv_multipart()
                        if message[0] != STATE:  # the worker's hello
                            replies += replies_in(message)
                            messages += 1
                    else:
                        await trio.sleep(0.01)
            trio.lowlevel.remove_instrument(spawns)
            nursery.cancel_scope.cancel()
        plog = worker.partitions[("audit", 0)].log
        assert plog.local.statistics().pending_messages == 0  # flushed by the group commit
        acked = [protocol.decode_reply(Api.PRODUCE, reply[1:]) for reply in replies]
        assert [reply.base_offset for reply in acked] == sorted(r.base_offset for r in acked)
        assert [protocol.decode_reply_header(reply[1:]).correlation_id for reply in replies] == (
            list(range(burst))
        )
        assert spawns.count == 0
        assert messages == 1  # one REPLIES message: one send, one wake-up of the supervisor
    finally:
        worker.close()


class FlushTimerWakeUps(trio.abc.Instrument):
    """How often the worker's flush timer (Worker._flush_when_due) is scheduled."""

    def __init__(self) -> None:
        self.count = 0

    def task_scheduled(self, task: trio.lowlevel.Task) -> None:
        if task.name.endswith("Worker._flush_when_due"):
            self.count += 1


async def test_acks_one_at_a_time_do_not_wake_the_flush_timer(
    tmp_path: Path, sockets: tuple[zmq.Socket[bytes], zmq.Socket[bytes]]
) -> None:
    # Each group commit leaves the partition with nothing to flush; the next produce gives it a
    # flush deadline again, an hour away here. Moving the timer is enough: waking its task to
    # find that out, once a round, was ~5% of the worker's CPU at a few requests in flight.
    supervisor, worker_end = sockets
    worker = idle_worker(worker_end)
    wake_ups = FlushTimerWakeUps()
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(worker.serve)
            worker._open("audit", 0, tmp_path, worker.config.log_config())
            await trio.testing.wait_all_tasks_blocked()
            trio.lowlevel.add_instrument(wake_ups)
            acked = 0
            with trio.fail_after(10):
                for i in range(20):
                    request = [requests_frame(1), CLIENT, *produce_frames(Ack.FLUSHED, i)]
                    supervisor.send_multipart(request)
                    while acked <= i:
                        if supervisor.poll(0):
                            message = supervisor.recv_multipart()
                            if message[0] != STATE:  # the worker's hello
                                acked += len(replies_in(message))
                        else:
                            await trio.sleep(0.001)
            trio.lowlevel.remove_instrument(wake_ups)
            plog = worker.partitions[("audit", 0)].log
            assert plog.local.statistics().pending_messages == 0
            nursery.cancel_scope.cancel()
        assert wake_ups.count == 0
    finally:
        worker.close()


async def test_requests_passed_together_that_reach_flush_messages_get_one_flush(
    tmp_path: Path,
    sockets: tuple[zmq.Socket[bytes], zmq.Socket[bytes]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # flush.messages = 1 and 50 produce requests that queued while the worker was busy (a
    # disk slow for a moment): one flush, one fsync, for the 50. A flush (and fsync) per
    # request, inside each append, had each request wait for the fsyncs of those before it.
    supervisor, worker_end = sockets
    config = BrokerConfig({"log_flush_interval_ms": HOUR_MS, "log_flush_messages": 1})
    worker = Worker(0, config, TrioSocket(worker_end, receive_from_supervisor))
    burst = 50
    frames: list[bytes] = [requests_frame(burst)]
    for i in range(burst):
        frames += [CLIENT, *produce_frames(Ack.FLUSHED, correlation_id=i)]
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(worker.serve)
            worker._open("audit", 0, tmp_path, worker.config.log_config())
            fsyncs = counted_fsyncs(monkeypatch)
            supervisor.send_multipart(frames)
            replies = await replies_from(supervisor, burst)
            nursery.cancel_scope.cancel()
        assert len(fsyncs) == 1
        codes = {protocol.decode_reply_header(reply[1:]).error_code for reply in replies}
        assert codes == {protocol.ErrorCode.NONE}
        assert worker.partitions[("audit", 0)].log.local.statistics().pending_messages == 0
    finally:
        worker.close()


async def test_an_ack_whose_flush_found_no_descriptor_comes_once_the_flush_is_tried_again(
    tmp_path: Path, sockets: tuple[zmq.Socket[bytes], zmq.Socket[bytes]]
) -> None:
    # flush.messages = 1, an hour's flush interval: the flush after the request, and the group
    # commit, find no descriptor to reopen the segment with (EMFILE), which fails nothing. The
    # worker must try again after a pause, not leave the ack for the next append.
    supervisor, worker_end = sockets
    config = BrokerConfig({"log_flush_interval_ms": HOUR_MS, "log_flush_messages": 1})
    worker = Worker(0, config, TrioSocket(worker_end, receive_from_supervisor))
    refusals = 2

    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(worker.serve)
            worker._open("audit", 0, tmp_path, worker.config.log_config())
            plog = worker.partitions[("audit", 0)].log
            segment_to_sync = plog.local.segment_to_sync

            def no_descriptor_at_first() -> Segment | None:
                nonlocal refusals
                if refusals:
                    refusals -= 1
                    raise StorageIOError("reopening 00000000000000000000.log: [Errno 24] Too many")
                return segment_to_sync()

            plog.local.segment_to_sync = no_descriptor_at_first  # type: ignore[method-assign]
            supervisor.send_multipart([requests_frame(1), CLIENT, *produce_frames(Ack.FLUSHED)])
            replies = await replies_from(supervisor, 1)
            nursery.cancel_scope.cancel()
        assert refusals == 0
        assert protocol.decode_reply(Api.PRODUCE, replies[0][1:]).base_offset == 0
        assert plog.local.statistics().pending_messages == 0
    finally:
        worker.close()


async def test_a_roll_that_flushes_wakes_the_long_polls_it_satisfies(
    tmp_path: Path, sockets: tuple[zmq.Socket[bytes], zmq.Socket[bytes]]
) -> None:
    # A roll flushes the segment it closes: the long poll waiting for those bytes is answered
    # then, not at its max_wait_ms (an hour here, and no other flush is due).
    supervisor, worker_end = sockets
    worker = idle_worker(worker_end, log_segment_bytes=40)  # 33 bytes a message: 2nd rolls
    fetch = protocol.FetchRequest("audit", 0, 0, 1 << 20, HOUR_MS, 1)
    fetch_frames = [
        bytes(f)
        for f in protocol.encode_request(protocol.RequestHeader(Api.FETCH, 1, 9, "tests"), fetch)
    ]
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(worker.serve)
            worker._open("audit", 0, tmp_path, worker.config.log_config())
            frames = [requests_frame(2), CLIENT, *produce_frames(Ack.WRITTEN, correlation_id=1)]
            frames += [CLIENT, *fetch_frames]  # waits for the first produce's flush
            supervisor.send_multipart(frames)
            waiters = worker.partitions[("audit", 0)].waiters
            with trio.fail_after(5):
                while not waiters.statistics().waiting:
                    await trio.sleep(0.01)
            rolls = [requests_frame(1), CLIENT, *produce_frames(Ack.WRITTEN, correlation_id=2)]
            supervisor.send_multipart(rolls)
            answered: set[int] = set()
            with trio.fail_after(5):
                while len(answered) < 3:
                    if supervisor.poll(0):
                        message = supervisor.recv_multipart()
                        if message[0] != STATE:  # the worker's hello
                            for reply in replies_in(message):
                                answered.add(protocol.decode_reply_header(reply[1:]).correlation_id)
                    else:
                        await trio.sleep(0.01)
            nursery.cancel_scope.cancel()
        assert answered == {1, 2, 9}
        assert worker.partitions[("audit", 0)].log.local.statistics().segments == 2
    finally:
        worker.close()


async def test_requests_that_queued_behind_a_flush_get_one_flush_and_a_busy_worker_a_bounded_wait(
    tmp_path: Path,
    sockets: tuple[zmq.Socket[bytes], zmq.Socket[bytes]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # flush.messages = 1 and 20 REQUESTS messages of one produce each, queued while the worker
    # was busy (an fsync): flushed when it has nothing left to read, but at least every 8
    # messages (FLUSH_DUE_MESSAGES): 3 flushes, not 20 (each request waiting for the fsyncs
    # of all those before it), nor 1 (a worker that always has more to read never flushing).
    supervisor, worker_end = sockets
    config = BrokerConfig({"log_flush_interval_ms": HOUR_MS, "log_flush_messages": 1})
    worker = Worker(0, config, TrioSocket(worker_end, receive_from_supervisor))
    burst = 20
    worker._open("audit", 0, tmp_path, worker.config.log_config())
    fsyncs = counted_fsyncs(monkeypatch)
    for i in range(burst):
        supervisor.send_multipart([requests_frame(1), CLIENT, *produce_frames(Ack.FLUSHED, i)])
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(worker.serve)
            await replies_from(supervisor, burst)
            nursery.cancel_scope.cancel()
        assert len(fsyncs) == 3
        assert worker.partitions[("audit", 0)].log.local.statistics().pending_messages == 0
    finally:
        worker.close()


async def test_what_copy_loops_append_in_one_turn_is_flushed_in_one_round(
    tmp_path: Path,
    sockets: tuple[zmq.Socket[bytes], zmq.Socket[bytes]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The parts of one MULTI_FETCH reply a follower appends are flushed together, one flush
    round (one syncfs) for them all before their next fetch, not an fsync each in turn."""
    _, worker_end = sockets
    worker = idle_worker(worker_end)
    rounds: list[list[str]] = []
    flush_round = Flusher.flush_round

    def counted(flusher: Flusher, partitions: Iterable[Partition]) -> bool:
        partitions = list(partitions)
        if partitions:  # (the worker's group commits with nothing to flush are not counted)
            rounds.append(sorted(p.name for p in partitions))
        return flush_round(flusher, partitions)

    monkeypatch.setattr(Flusher, "flush_round", counted)
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(worker.serve)
            for number in range(3):
                worker._open("copied", number, tmp_path, worker.config.log_config())
            partitions = [worker.partitions[("copied", n)] for n in range(3)]
            for partition in partitions:  # what a copy loop does with a reply's bytes
                partition.log.append(encode_message(b"copied"))
            with trio.fail_after(10):
                async with trio.open_nursery() as loops:
                    for partition in partitions:
                        loops.start_soon(worker.leadership._flush_copied, partition)
            nursery.cancel_scope.cancel()
        assert rounds == [["copied-0", "copied-1", "copied-2"]]
        assert all(p.log.local.statistics().pending_messages == 0 for p in partitions)
    finally:
        worker.close()


def to_open(directory: Path, count: int) -> list[control.PartitionToOpen]:
    return [control.PartitionToOpen("wide", n, str(directory), {}, False) for n in range(count)]


def counted_folder_fsyncs(monkeypatch: pytest.MonkeyPatch, failing: set[str]) -> list[str]:
    """The folders fsynced from now on (by name); those named in `failing` fail with EIO."""
    folders: list[str] = []
    fsync = os.fsync

    def counted(fd: int) -> None:
        path = Path(os.readlink(f"/proc/self/fd/{fd}"))
        if path.is_dir():
            folders.append(path.name)
            if path.name in failing:
                raise OSError(errno.EIO, os.strerror(errno.EIO))
        fsync(fd)

    monkeypatch.setattr(os, "fsync", counted)
    return folders


def test_new_partitions_opened_together_are_made_durable_by_one_syncfs(
    tmp_path: Path,
    sockets: tuple[zmq.Socket[bytes], zmq.Socket[bytes]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Creating 20 partitions together (SYNC_TOGETHER_FROM lowered to 20) costs one syncfs of
    the log dir's file system, not two folder fsyncs a partition (the folder's entry, its first
    segment's); reopened, they exist. Fewer than that are fsynced each, as one is."""
    _, worker_end = sockets
    worker = idle_worker(worker_end)
    monkeypatch.setattr("broker.worker.SYNC_TOGETHER_FROM", 20)
    folders = counted_folder_fsyncs(monkeypatch, set())
    syncfs_calls = synced_paths(monkeypatch, fsdir, "syncfs")
    try:
        answer, created = worker._open_all(to_open(tmp_path, 20))
        assert created == 20
        assert answer.failed == ()
        assert sorted(answer.opened) == [("wide", n) for n in range(20)]
        assert folders == []
        assert syncfs_calls == [str(tmp_path)]
        assert all(
            (tmp_path / f"wide-{n}" / "00000000000000000000.log").is_file() for n in range(20)
        )
        # opened again (a restart's open): nothing created, nothing synced
        worker.close()
        worker = idle_worker(worker_end)
        answer, created = worker._open_all(to_open(tmp_path, 20))
        assert (len(answer.opened), created) == (20, 0)
        assert syncfs_calls == [str(tmp_path)] and folders == []
        # two new ones alone: their folder and first segment each fsynced, no syncfs
        few = [control.PartitionToOpen("few", n, str(tmp_path), {}, False) for n in range(2)]
        answer, created = worker._open_all(few)
        assert (len(answer.opened), created) == (2, 2)
        assert syncfs_calls == [str(tmp_path)]
        assert sorted(folders) == sorted([tmp_path.name] * 2 + ["few-0", "few-1"])
    finally:
        worker.close()


def test_after_a_failed_syncfs_a_new_partition_whose_folder_fsync_fails_is_not_opened(
    tmp_path: Path,
    sockets: tuple[zmq.Socket[bytes], zmq.Socket[bytes]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A syncfs that fails cannot say whose file's error it reports: each new folder is then
    fsynced, and the log dir; the one whose fsync fails is reported not opened, with a
    storage error, and is not served; the others are."""
    _, worker_end = sockets
    worker = idle_worker(worker_end)
    monkeypatch.setattr("broker.worker.SYNC_TOGETHER_FROM", 5)
    folders = counted_folder_fsyncs(monkeypatch, {"wide-3"})

    def failing_syncfs(fd: int) -> None:
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    monkeypatch.setattr(fsdir, "syncfs", failing_syncfs)
    try:
        answer, _ = worker._open_all(to_open(tmp_path, 5))
        assert sorted(answer.opened) == [("wide", n) for n in (0, 1, 2, 4)]
        ((topic, number, code, message),) = answer.failed
        assert (topic, number, code) == ("wide", 3, protocol.ErrorCode.STORAGE_ERROR)
        assert "wide-3" in message and "Input/output error" in message
        assert ("wide", 3) not in worker.partitions
        assert sorted(folders) == sorted([f"wide-{n}" for n in range(5)] + [tmp_path.name])
    finally:
        worker.close()


async def test_a_worker_opening_partitions_holds_the_garbage_collector_off_meanwhile(
    tmp_path: Path, sockets: tuple[zmq.Socket[bytes], zmq.Socket[bytes]]
) -> None:
    """Opening keeps every object it makes: collections meanwhile walked them all again and
    again, a third of the time to open 10,000 partitions. None runs while a worker opens
    (here 300 partitions, in chunks); the collector is on again after."""
    _, worker_end = sockets
    worker = idle_worker(worker_end)
    collections: list[int] = []
    """How many partitions were open at each collection."""

    def collected(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            collections.append(len(worker.partitions))

    command = control.OpenPartitions(tuple(to_open(tmp_path, 300)))
    gc.callbacks.append(collected)
    try:
        assert gc.isenabled()
        await worker._run_command(command)
        assert all(opened in (0, 300) for opened in collections), collections
        assert gc.isenabled() and len(worker.partitions) == 300
    finally:
        gc.callbacks.remove(collected)
        worker.close()


async def test_partitions_to_open_are_reported_opened_a_chunk_at_a_time(
    tmp_path: Path,
    sockets: tuple[zmq.Socket[bytes], zmq.Socket[bytes]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Of a topic of thousands, a worker reports the partitions it opened OPEN_CHUNK at a time
    (each chunk made durable before its report), so that the first are served while the rest
    open, not all at the end: here 25 partitions in chunks of 10."""
    supervisor, worker_end = sockets
    worker = idle_worker(worker_end)
    monkeypatch.setattr("broker.worker.OPEN_CHUNK", 10)
    try:
        await worker._run_command(control.OpenPartitions(tuple(to_open(tmp_path, 25))))
        reports = []
        while supervisor.poll(0):
            report = control.decode_report(supervisor.recv_multipart()[1])
            assert isinstance(report, control.PartitionsOpened)
            reports.append(report)
        assert [sorted(n for _, n in r.opened) for r in reports] == [
            list(range(0, 10)),
            list(range(10, 20)),
            list(range(20, 25)),
        ]
    finally:
        worker.close()
