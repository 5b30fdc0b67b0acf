"""A ZeroMQ context that tests check still carries messages (`LiveContext`): a context whose
I/O thread is blocked carries none, and terminating it would hang the test run, so such a
context is kept, never terminated, and the test fails."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import zmq

from broker.security import ClientKeys

_WEDGED: list[zmq.Context[Any]] = []
"""Contexts found wedged: kept referenced, so that no garbage collection terminates them (pyzmq
does not at interpreter exit)."""


class LiveContext:
    """A context (`context`, a plain one or `context_class`'s) and a ROUTER on 127.0.0.1 in it
    (a Curve server when `curve`: any client key let in, `keys` a client's keys for it)."""

    def __init__(
        self, curve: bool = False, context_class: Callable[[], zmq.Context[Any]] = zmq.Context
    ) -> None:
        self.context: zmq.Context[Any] = context_class()
        self.server_context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        self.server = self.server_context.socket(zmq.ROUTER)
        self.server.setsockopt(zmq.LINGER, 0)
        self.keys: ClientKeys | None = None
        if curve:
            server_public, server_secret = zmq.curve_keypair()
            public, secret = zmq.curve_keypair()
            self.server.setsockopt(zmq.CURVE_SERVER, 1)
            self.server.setsockopt(zmq.CURVE_SECRETKEY, server_secret)
            self.keys = ClientKeys(public, secret, server_public)
        port = self.server.bind_to_random_port("tcp://127.0.0.1")
        self.endpoint = f"tcp://127.0.0.1:{port}"

    def carries(self, timeout_ms: int = 5000) -> bool:
        """Whether a new DEALER of `context` gets a message to the server and its answer back
        within `timeout_ms` each way."""
        socket: zmq.Socket[bytes] = zmq.Context.shadow(self.context.underlying).socket(zmq.DEALER)
        socket.setsockopt(zmq.LINGER, 0)
        try:
            if self.keys is not None:
                self.keys.apply(socket)
            socket.connect(self.endpoint)
            socket.send(b"ping")
            while self.server.poll(timeout_ms):
                identity, body = self.server.recv_multipart()
                if body == b"ping":
                    self.server.send_multipart([identity, b"pong"])
                    return bool(socket.poll(timeout_ms))
            return False
        finally:
            socket.close()

    def close(self) -> None:
        """Close the server; terminate the context if it still carries messages, else keep it
        (terminating it would wait for its blocked I/O thread for ever)."""
        carries = self.carries()
        self.server.close()
        self.server_context.term()
        if carries:
            self.context.destroy(linger=0)
        else:
            _WEDGED.append(self.context)
