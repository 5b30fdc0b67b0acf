"""A ZeroMQ socket driven from a trio loop, and the frames between supervisor and workers.

pyzmq has no trio support, and its `zmq.FD` is edge-triggered: it signals that the socket's
state changed, not that a message is waiting, and any send, receive or EVENTS read can consume
that signal. So `TrioSocket` always tries the non-blocking call first, reads EVENTS (which
re-arms the edge) before it waits, and any send wakes a waiting receiver so that it looks
again. trio allows one reader per fd: one task receives, any task may send.

Supervisor <-> worker messages travel over an ipc DEALER pair, the first frame saying what the
rest is:

    REQUEST  b"R", envelope..., b"", header, body[, message set]   a client's request, as the
                                                                   front ROUTER received it
    REPLY    b"R", envelope..., b"", reply frames...               the worker's answer to it
    COMMAND  b"C", JSON                                            supervisor to worker: open or
                                                                   delete partitions
    STATE    b"S", JSON                                            worker to supervisor: hello,
                                                                   partitions opened, offsets

The envelope is the ROUTER's identity frame(s); client frames are never re-encoded.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import trio
import zmq

from broker.log.message import Buffer

REQUEST = b"R"
COMMAND = b"C"
STATE = b"S"

Frame = Buffer | zmq.Frame


class TrioSocket:
    """Receive and send multipart messages on a zmq socket from trio tasks."""

    def __init__(self, socket: zmq.Socket[bytes]) -> None:
        self.socket = socket
        self._fd = int(socket.getsockopt(zmq.FD))
        self._receiver_wait: trio.CancelScope | None = None
        self._received_since_checkpoint = 0

    async def receive(self) -> list[zmq.Frame]:
        """The next multipart message (frames not copied)."""
        while True:
            try:
                frames = self.socket.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                pass
            else:
                # A socket that always has data would never let other tasks run otherwise.
                self._received_since_checkpoint += 1
                if self._received_since_checkpoint >= 16:
                    self._received_since_checkpoint = 0
                    await trio.lowlevel.checkpoint()
                return frames
            self._received_since_checkpoint = 0
            if self._events() & zmq.POLLIN:
                continue
            with trio.CancelScope() as scope:
                self._receiver_wait = scope
                try:
                    await trio.lowlevel.wait_readable(self._fd)
                finally:
                    self._receiver_wait = None

    def _events(self) -> int:
        """Reading EVENTS also re-arms the edge-triggered FD."""
        return int(self.socket.getsockopt(zmq.EVENTS))

    async def send(self, frames: Sequence[Frame]) -> None:
        """Send a multipart message; waits only while the peer's queue is full."""
        while True:
            try:
                self.socket.send_multipart(frames, zmq.NOBLOCK, copy=False)
                break
            except zmq.Again:
                if not self._events() & zmq.POLLOUT:
                    await trio.lowlevel.wait_writable(self._fd)
        # The send may have consumed the edge a waiting receive() depends on: make it look.
        if self._receiver_wait is not None:
            self._receiver_wait.cancel()
        await trio.lowlevel.checkpoint()


def json_frame(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()


def split_envelope(frames: Sequence[Frame], start: int = 1) -> int:
    """The index just past the empty delimiter frame that ends a request's envelope, looking
    from `start`; ValueError when there is none."""
    for i in range(start, len(frames)):
        if len(frames[i]) == 0:
            return i + 1
    raise ValueError("no empty delimiter frame: not a REQ/DEALER request")
