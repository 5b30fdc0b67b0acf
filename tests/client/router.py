"""A scripted fake broker served on a ROUTER of 127.0.0.1 by a thread, for the client tests."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Protocol, TypeVar

import zmq


class Fake(Protocol):
    endpoint: str

    def serve(self, socket: zmq.Socket[bytes], stop: threading.Event) -> None: ...


F = TypeVar("F", bound=Fake)


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
