"""A ZeroMQ socket driven from a trio loop: a worker's end of its supervisor's socket, and a
follower's of its leader's.

pyzmq has no trio support, and its `zmq.FD` is edge-triggered: it signals that the socket's
state changed, not that a message is waiting, and any send, receive or EVENTS read can consume
that signal. So `TrioSocket` always tries the non-blocking call first, reads EVENTS (which
re-arms the edge) before it waits, and a send made while a receiver waits reads EVENTS too, and
wakes the receiver only if a message is waiting: the edge the send took is then re-armed, or
the receiver looks. trio allows one reader per fd: one task receives, any task may send.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Generic, TypeVar

import trio
import zmq

from broker.log.message import Buffer
from broker.zmqio import NOBLOCK, send_frames

Message = TypeVar("Message")

RECEIVE_RECHECK_S = 0.1
"""The longest TrioSocket.receive waits on the socket's FD before it looks for a message again."""


class TrioSocket(Generic[Message]):
    """Receive and send multipart messages on a zmq socket from trio tasks. `receive_message`
    reads one message without blocking when given NOBLOCK (one of broker.zmqio's)."""

    def __init__(
        self,
        socket: zmq.Socket[bytes],
        receive_message: Callable[[zmq.Socket[bytes], int], Message],
    ) -> None:
        self.socket = socket
        self._receive_message = receive_message
        self._fd = int(socket.getsockopt(zmq.FD))
        self._receiver_wait: trio.CancelScope | None = None
        self._received_since_checkpoint = 0

    async def receive(self, on_idle: Callable[[], Awaitable[object]] | None = None) -> Message:
        """The next multipart message. `on_idle` is awaited when the socket has nothing left
        to read, before waiting (the worker's group commit, which sends acks)."""
        idle_done = False
        while True:
            try:
                frames = self._receive_message(self.socket, NOBLOCK)
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
            if on_idle is not None and not idle_done:
                idle_done = True
                await on_idle()
                continue  # what it sent may have taken the edge: look again before waiting
            # Bounded: zmq.FD is edge-triggered, and an edge another task's send or EVENTS read
            # took is seen by looking again at the latest RECEIVE_RECHECK_S later, not never.
            with trio.move_on_after(RECEIVE_RECHECK_S) as scope:
                self._receiver_wait = scope
                try:
                    await trio.lowlevel.wait_readable(self._fd)
                finally:
                    self._receiver_wait = None
            idle_done = False

    def _events(self) -> int:
        """Reading EVENTS also re-arms the edge-triggered FD."""
        return int(self.socket.getsockopt(zmq.EVENTS))

    async def send(self, frames: Sequence[Buffer | zmq.Frame]) -> None:
        """Send a multipart message; waits only while the peer's queue is full."""
        while True:
            try:
                send_frames(self.socket, frames, NOBLOCK)
                break
            except zmq.Again:
                if not self._events() & zmq.POLLOUT:
                    await trio.lowlevel.wait_writable(self._fd)
        # The send may have consumed the edge a waiting receive() depends on. Reading EVENTS
        # re-arms it; a message already waiting is the receiver's to take at once.
        if self._receiver_wait is not None and self._events() & zmq.POLLIN:
            self._receiver_wait.cancel()
        await trio.lowlevel.checkpoint()
