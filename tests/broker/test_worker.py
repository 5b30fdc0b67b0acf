"""The worker on its own: a real trio nursery and real ZeroMQ sockets (inproc), no supervisor."""

from __future__ import annotations

import time
from pathlib import Path

import trio
import trio.testing
import zmq

from broker import protocol
from broker.config import BrokerConfig
from broker.log import encode_message
from broker.protocol import Ack, Api
from broker.transport import FROM_DEALER, TrioSocket
from broker.worker import Worker

HOUR_MS = 3_600_000


async def test_shutdown_acks_producers_still_waiting_for_a_flush(tmp_path: Path) -> None:
    # Without the receive loop nothing flushes (no group commit, an hour's flush interval):
    # the producer waits until the shutdown's flush, and must get its ack from it.
    context = zmq.Context()
    supervisor = context.socket(zmq.DEALER)
    supervisor.bind("inproc://worker")
    socket = context.socket(zmq.DEALER)
    socket.connect("inproc://worker")
    config = BrokerConfig({"log_flush_interval_ms": HOUR_MS, "log_flush_messages": 1_000_000})
    worker = Worker(0, config, TrioSocket(socket))
    try:
        async with trio.open_nursery() as nursery:
            worker.nursery = nursery
            worker._open("audit", 0, tmp_path, config.log_config())
            data = encode_message(b"durable", timestamp_ms=0)
            header = protocol.RequestHeader(Api.PRODUCE, 1, 7, "tests")
            request = protocol.ProduceRequest("audit", 0, Ack.FLUSHED, data)
            frames = [bytes(f) for f in protocol.encode_request(header, request)]
            await worker._serve_request(FROM_DEALER + b"client", frames)
            await trio.testing.wait_all_tasks_blocked()
            assert supervisor.poll(0) == 0  # waiting for its flush
            await worker.flush_and_answer(5.0)
            nursery.cancel_scope.cancel()
        tagged, *reply = supervisor.recv_multipart(zmq.NOBLOCK)
        assert tagged == FROM_DEALER + b"client"
        assert protocol.decode_reply(Api.PRODUCE, reply).base_offset == 0
    finally:
        worker.close()
        context.destroy(linger=0)


async def test_unflushed_data_does_not_keep_the_flush_timer_spinning(tmp_path: Path) -> None:
    # The flush deadline is on time.monotonic's clock; trio's has another origin. Waiting
    # "until" it on trio's clock woke the timer at once, over and over: a core burnt while
    # any partition held unflushed data.
    context = zmq.Context()
    supervisor = context.socket(zmq.DEALER)
    supervisor.bind("inproc://idle-worker")
    socket = context.socket(zmq.DEALER)
    socket.connect("inproc://idle-worker")
    config = BrokerConfig({"log_flush_interval_ms": HOUR_MS, "log_flush_messages": 1_000_000})
    worker = Worker(0, config, TrioSocket(socket))
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(worker.serve)
            worker._open("audit", 0, tmp_path, config.log_config())
            data = encode_message(b"pending", timestamp_ms=0)
            header = protocol.RequestHeader(Api.PRODUCE, 1, 7, "tests")
            request = protocol.ProduceRequest("audit", 0, Ack.WRITTEN, data)
            supervisor.send_multipart(
                [FROM_DEALER + b"client", *protocol.encode_request(header, request)]
            )
            with trio.fail_after(10):
                while not supervisor.poll(0):  # hello, then the produce reply
                    await trio.sleep(0.01)
            cpu = time.process_time()
            await trio.sleep(0.5)  # an hour from its flush, the worker has nothing to do
            busy = time.process_time() - cpu
            nursery.cancel_scope.cancel()
        assert worker.partitions[("audit", 0)].log.statistics().pending_messages == 1
        assert busy < 0.1, f"the worker used {busy:.2f} s of CPU in 0.5 s of idling"
    finally:
        worker.close()
        context.destroy(linger=0)
