"""The request path of pylogd, next to bare ZeroMQ hops of the same shape.

    .venv/bin/python perf/bench_broker.py [--requests 20000] [--window 100]

A client sends PRODUCE requests (ack=written, one 200-byte message each) and, separately,
PRODUCE requests of 50 messages, one at a time on a REQ socket and pipelined on a DEALER with
`--window` requests in flight, to:

- `pylogd`: the real broker (its private ZooKeeper, one worker, fsync off), where each request
  crosses the supervisor's blocking-pyzmq ROUTER, an ipc DEALER, and a trio worker that
  validates and appends it;
- `hop_pyzmq`: a bare middle hop written like the supervisor (blocking pyzmq, poller) in front
  of an echo process: the cost of the topology alone;
- `hop_trio`: the same middle hop written on broker.trio_socket.TrioSocket, the adapter workers
  use: what the supervisor would cost if it ran on trio.

Prints one JSON line with requests/s (and messages/s for the 50-message sets). Run it alone:
anything else on 2 cores skews it.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import trio
import zmq

from broker import protocol
from broker.log import encode_message
from broker.protocol import Ack, Api
from broker.trio_socket import TrioSocket
from broker.zmqio import receive_frames

MESSAGE_BYTES = 200
SET_MESSAGES = 50


def produce_frames(messages: int, correlation_id: int = 1) -> list[bytes]:
    value = b"x" * (MESSAGE_BYTES - 26)
    data = b"".join(encode_message(value, timestamp_ms=0) for _ in range(messages))
    header = protocol.RequestHeader(Api.PRODUCE, 1, correlation_id, "bench")
    request = protocol.ProduceRequest("bench", 0, Ack.WRITTEN, data)
    return [bytes(f) for f in protocol.encode_request(header, request)]


def one_at_a_time(endpoint: str, frames: list[bytes], requests: int) -> float:
    """Requests/s with one in flight (the REQ socket adds the empty delimiter itself)."""
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
    socket = context.socket(zmq.REQ)
    socket.connect(endpoint)
    start = time.perf_counter()
    for _ in range(requests):
        socket.send_multipart(frames)
        socket.recv_multipart()
    elapsed = time.perf_counter() - start
    socket.close(linger=0)
    return requests / elapsed


def pipelined(endpoint: str, frames: list[bytes], requests: int, window: int) -> float:
    """Requests/s with up to `window` in flight on a DEALER."""
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
    socket = context.socket(zmq.DEALER)
    socket.connect(endpoint)
    sent = received = 0
    start = time.perf_counter()
    while received < requests:
        while sent < requests and sent - received < window:
            socket.send_multipart(frames)
            sent += 1
        socket.recv_multipart()
        received += 1
    elapsed = time.perf_counter() - start
    socket.close(linger=0)
    return requests / elapsed


def measure(endpoint: str, requests: int, window: int) -> dict[str, float]:
    single, batch = produce_frames(1), produce_frames(SET_MESSAGES)
    one_at_a_time(endpoint, single, min(requests, 1000))  # warm up connections and caches
    return {
        "one_in_flight_req_per_s": round(one_at_a_time(endpoint, single, requests)),
        "pipelined_req_per_s": round(pipelined(endpoint, single, requests, window)),
        "pipelined_sets_msgs_per_s": round(
            pipelined(endpoint, batch, requests // 10, window) * SET_MESSAGES
        ),
    }


# -- the bare hops -------------------------------------------------------------------------


def run_echo(backend: str) -> None:
    """The far end of a bare hop: send every message straight back."""
    socket: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.DEALER)
    socket.connect(backend)
    while True:
        socket.send_multipart(socket.recv_multipart())


def run_hop_pyzmq(front: str, backend: str) -> None:
    """A middle hop shaped like the supervisor: blocking pyzmq and a poller."""
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
    router, dealer = context.socket(zmq.ROUTER), context.socket(zmq.DEALER)
    router.bind(front)
    dealer.bind(backend)
    poller = zmq.Poller()
    poller.register(router, zmq.POLLIN)
    poller.register(dealer, zmq.POLLIN)
    while True:
        for socket, _ in poller.poll(100):
            other = dealer if socket is router else router
            for _ in range(256):
                try:
                    frames = socket.recv_multipart(zmq.NOBLOCK)
                except zmq.Again:
                    break
                other.send_multipart(frames)


def run_hop_trio(front: str, backend: str) -> None:
    """The same hop on broker.trio_socket.TrioSocket, one task per direction."""

    async def forward(
        source: TrioSocket[list[zmq.Frame]], target: TrioSocket[list[zmq.Frame]]
    ) -> None:
        while True:
            await target.send(await source.receive())

    async def main() -> None:
        context: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
        router, dealer = context.socket(zmq.ROUTER), context.socket(zmq.DEALER)
        router.bind(front)
        dealer.bind(backend)
        a, b = TrioSocket(router, receive_frames), TrioSocket(dealer, receive_frames)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(forward, a, b)
            nursery.start_soon(forward, b, a)

    trio.run(main)


ROLES: dict[str, Callable[..., None]] = {
    "echo": run_echo,
    "hop_pyzmq": run_hop_pyzmq,
    "hop_trio": run_hop_trio,
}


def spawn(role: str, *args: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, __file__, "--role", role, *args])


def bench_hop(role: str, work: Path, requests: int, window: int) -> dict[str, float]:
    front = f"ipc://{work}/{role}-front"
    backend = f"ipc://{work}/{role}-back"
    processes = [spawn(role, front, backend), spawn("echo", backend)]
    try:
        return measure(front, requests, window)
    finally:
        for process in processes:
            process.kill()
            process.wait()


def bench_pylogd(work: Path, requests: int, window: int) -> dict[str, float]:
    pylogd = Path(sys.executable).with_name("pylogd")
    command = [str(pylogd), "--broker-data-dir", str(work / "pylogd"), "--broker-port", "0"]
    command += ["--log-fsync", "false", "--log-flush-interval-ms", "100"]
    process = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
    )
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        if not line.startswith("pylogd ready on "):
            raise SystemExit(f"pylogd did not start (see {work / 'pylogd'})")
        endpoint = "tcp://" + line.split()[-1]
        socket: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.REQ)
        socket.connect(endpoint)
        header = protocol.RequestHeader(Api.CREATE_TOPIC, 1, 1, "bench")
        socket.send_multipart(
            protocol.encode_request(header, protocol.CreateTopicRequest("bench", 1, {}))
        )
        protocol.decode_reply(Api.CREATE_TOPIC, socket.recv_multipart())
        socket.close()
        return measure(endpoint, requests, window)
    finally:
        process.terminate()
        process.wait(60)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=20_000)
    parser.add_argument("--window", type=int, default=100)
    parser.add_argument("--role", choices=sorted(ROLES), help=argparse.SUPPRESS)
    args, rest = parser.parse_known_args()
    if args.role:
        ROLES[args.role](*rest)
        return
    if args.requests < 1000 or args.window < 1:
        parser.error("--requests must be at least 1000 and --window at least 1")
    work = Path(tempfile.mkdtemp(prefix="pylog-bench-", dir="/tmp"))
    try:
        figures = {
            "pylogd": bench_pylogd(work, args.requests, args.window),
            "hop_pyzmq": bench_hop("hop_pyzmq", work, args.requests, args.window),
            "hop_trio": bench_hop("hop_trio", work, args.requests, args.window),
        }
    finally:
        shutil.rmtree(work)
    line = {
        "benchmark": "broker_request_path",
        "requests": args.requests,
        "window": args.window,
        "message_bytes": MESSAGE_BYTES,
        **{f"{name}_{k}": v for name, values in figures.items() for k, v in values.items()},
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
    }
    print(json.dumps(line))


if __name__ == "__main__":
    main()
