"""A scripted fake broker for the client tests: served on a ROUTER of 127.0.0.1 by a thread
(`serving`), or answering in memory, no socket and no thread (`in_memory`)."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Any, Protocol, TypeVar

import zmq

from broker.client.transport import MemoryTransport
from broker.clock import WaitingClock
from broker.protocol import RequestHeader, decode_request


class Fake(Protocol):
    endpoint: str

    def serve(self, socket: zmq.Socket[bytes], stop: threading.Event) -> None: ...


F = TypeVar("F", bound=Fake)


class Answering(Protocol):
    endpoint: str

    def answer(self, header: RequestHeader, request: Any) -> list[bytes] | None: ...


PLAYED_ENDPOINT = "tcp://played:9092"


def in_memory(fake: Answering, clock: WaitingClock) -> MemoryTransport:
    """A MemoryTransport on which `fake` answers each request (its endpoint PLAYED_ENDPOINT),
    its waits passed on `clock`."""
    fake.endpoint = PLAYED_ENDPOINT
    return MemoryTransport(lambda endpoint, frames: fake.answer(*decode_request(frames)), clock)


@contextlib.contextmanager
def serving(fake: F) -> Iterator[F]:
    """`fake` answering on a ROUTER of a free loopback port (its endpoint set) until the block
    ends."""
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    socket = context.socket(zmq.ROUTER)
    port = socket.bind_to_random_port("tcp://127.0.0.1")
    fake.endpoint = f"tcp://127.0.0.1:{port}"
    stop = threading.Event()
    thread = threading.Thread(target=fake.serve, args=(socket, stop), daemon=True)
    thread.start()
    try:
        yield fake
    finally:
        stop.set()
        thread.join()
        socket.close(linger=0)
        context.term()


def answer_requests(
    socket: zmq.Socket[bytes],
    stop: threading.Event,
    answer: Callable[[RequestHeader, Any], list[bytes] | None],
) -> None:
    """Serve `socket` until `stop`: each request decoded and answered with the frames `answer`
    gives for it (None: no reply, as if lost), behind its sender's identity and envelope."""
    while not stop.is_set():
        if not socket.poll(20):
            continue
        identity, *envelope_and_frames = socket.recv_multipart()
        envelope, frames = envelope_and_frames[:-1], envelope_and_frames[-1:]
        header, request = decode_request(frames)
        reply = answer(header, request)
        if reply is not None:
            socket.send_multipart([identity, *envelope, *reply])
