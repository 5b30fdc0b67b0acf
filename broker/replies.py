"""Replies the broker holds for its clients, in bytes, under one ceiling (docs/protocol.md,
"Flow control").

A reply the front sends waits in ZeroMQ, in the supervisor's memory, until the client's
connection takes it into TCP; a client that never reads would have the broker hold every reply
it asked for. So the front counts the bytes of every reply of TRACK_AT bytes or more from the
moment it sends it until ZeroMQ lets it go (sent into TCP, or dropped with the connection): each
such reply goes out as a tracked `zmq.Frame`, whose tracker pyzmq marks done when libzmq
releases it. Per connection and in all:

- A connection is **muted** while it holds `per_client` bytes of replies or more, or while it
  holds any and the broker holds `ceiling` bytes or more in all (Kafka mutes a connection that
  has a response pending; here a connection that reads keeps its pipelined requests going, up
  to its share). The requests of a muted connection are not served: the front parks them, up
  to `parked_per_client` (beyond, each is answered REPLIES_NOT_READ), and serves them in order
  once the connection has taken enough of its replies.
- A reply for a muted connection is not held: it is answered REPLIES_NOT_READ instead (its
  request may be sent again; FETCH is the one api whose replies reach this size). Requests
  already in flight when a connection was muted cannot add to what it holds.
- A connection that holds nothing always gets its reply: every client makes progress, and the
  broker holds at most `ceiling` plus one reply for each connection that held nothing, plus
  the replies under TRACK_AT bytes, which ZeroMQ bounds per connection by count (SNDHWM).

Once the broker holds nothing again, after TRIM_AFTER_S, the supervisor gives the heap's free
pages back to the system (glibc's malloc_trim): without it, the memory freed by replies that
went out stays in the process.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Final

import zmq

from broker.errors import RepliesNotRead
from broker.log.message import Buffer
from broker.protocol import encode_error

TRACK_AT: Final = 4096
"""Replies of this many bytes or more are counted until ZeroMQ lets them go; smaller ones (acks,
errors, a fetch of a few messages) are bounded per connection by ZeroMQ's SNDHWM alone."""
TRIM_AFTER_S: Final = 1.0
"""How long the broker holds no reply before the heap's free pages go back to the system."""


def _find_malloc_trim() -> Callable[[int], int]:
    """glibc's malloc_trim; on a C library without one, a function that does nothing."""
    name = ctypes.util.find_library("c")
    trim = None if name is None else getattr(ctypes.CDLL(name), "malloc_trim", None)
    return (lambda pad: 0) if trim is None else trim


_malloc_trim: Final = _find_malloc_trim()


@dataclass(slots=True)
class _Connection:
    """What the broker holds for one connection: the trackers and sizes of its replies not yet
    taken, oldest first (a connection takes its replies in order), and its parked requests."""

    held: deque[tuple[zmq.MessageTracker, int]] = field(default_factory=deque)
    held_bytes: int = 0
    parked: deque[list[zmq.Frame]] = field(default_factory=deque)
    fd: int = -1
    """The descriptor of its TCP connection, from its last request parked (-1: none known)."""


class HeldReplies:
    """The front's count of the reply bytes ZeroMQ holds for clients, and the connections it
    mutes for them. The loop calls `send` for each reply, `muted` and `park` for each request,
    and `release` once a turn; the metrics thread reads `held_bytes`, `muted_connections`,
    `parked_requests` and `replies_refused`."""

    def __init__(self, ceiling: int, per_client: int, parked_per_client: int) -> None:
        self.ceiling = ceiling
        self.per_client = per_client
        self.parked_per_client = parked_per_client
        self.held_bytes = 0
        """Bytes of replies sent and not yet let go by ZeroMQ, for all connections."""
        self.muted_connections = 0
        """Connections muted at the end of the last turn (holding too much, or with parked
        requests)."""
        self.parked_requests = 0
        """Requests of muted connections waiting to be served."""
        self.replies_refused = 0
        """Replies answered REPLIES_NOT_READ instead, their connection muted."""
        self._connections: dict[bytes, _Connection] = {}
        """The connections that hold replies or have parked requests, by tagged identity."""
        self._trim_at = 0.0

    def muted(self, tagged: bytes) -> bool:
        """Whether the requests of the connection `tagged` wait (parked) for now."""
        connection = self._connections.get(tagged)
        return connection is not None and (
            bool(connection.parked) or self._over(connection.held_bytes)
        )

    def _over(self, held: int) -> bool:
        return held >= self.per_client or (held > 0 and self.held_bytes >= self.ceiling)

    def park(self, tagged: bytes, frames: list[zmq.Frame], fd: int = -1) -> None:
        """Keep a request of the muted connection `tagged`, come by TCP connection `fd`
        (broker.zmqio.source_fd), to serve later; RepliesNotRead when it has
        parked_per_client requests waiting already."""
        connection = self._connections[tagged]
        connection.fd = fd
        if len(connection.parked) >= self.parked_per_client:
            raise RepliesNotRead(
                f"this connection holds {connection.held_bytes} bytes of replies it has not "
                f"read and {len(connection.parked)} requests waiting for it to read them: "
                "read the replies, then send the request again"
            )
        connection.parked.append(frames)
        self.parked_requests += 1

    def send(
        self, tagged: bytes, frames: Sequence[Buffer | zmq.Frame]
    ) -> Sequence[Buffer | zmq.Frame]:
        """The frames to send for the reply `frames` to `tagged`: as they are under TRACK_AT
        bytes; tracked, and counted, from TRACK_AT on; an error in their place (REPLIES_NOT_READ)
        when the connection is muted."""
        size = sum(len(frame) for frame in frames)
        if size < TRACK_AT:
            return frames
        connection = self._connections.get(tagged)
        if connection is None:
            connection = self._connections[tagged] = _Connection()
        elif self._over(connection.held_bytes):
            self.replies_refused += 1
            error = RepliesNotRead(
                f"this connection holds {connection.held_bytes} bytes of replies it has not "
                f"read ({self.per_client} kept for one connection, {self.held_bytes} of "
                f"{self.ceiling} for all): a reply of {size} bytes was not kept; read the "
                "replies, then send the request again"
            )
            correlation_id = int.from_bytes(_view(frames[0])[:4], "big")
            return encode_error(correlation_id, error)
        # The largest frame carries the reply's bytes; the others (a header) go as they are.
        at = max(range(len(frames)), key=lambda i: len(frames[i]))
        tracked = zmq.Frame(_view(frames[at]), copy=False, track=True)
        assert tracked.tracker is not None
        connection.held.append((tracked.tracker, size))
        connection.held_bytes += size
        self.held_bytes += size
        return [*frames[:at], tracked, *frames[at + 1 :]]

    def closed(self, fd: int) -> int:
        """The TCP connection of descriptor `fd` closed (the front socket's monitor): drop its
        parked requests, never to be served (ZeroMQ drops the replies it held). How many."""
        if fd < 0:
            return 0
        dropped = 0
        for connection in self._connections.values():
            if connection.fd == fd:
                dropped += len(connection.parked)
                self.parked_requests -= len(connection.parked)
                connection.parked.clear()
        return dropped

    def release(self, room: Callable[[], bool]) -> Iterator[tuple[bytes, list[zmq.Frame]]]:
        """Once a turn: forget the replies ZeroMQ let go of, then yield the parked requests of
        the connections no longer muted, in order (tagged identity, frames as received), while
        `room()` says the workers may take more (the rest wait for the next turn)."""
        muted = 0
        for tagged, connection in list(self._connections.items()):
            held = connection.held
            while held and held[0][0].done:
                size = held.popleft()[1]
                connection.held_bytes -= size
                self.held_bytes -= size
            parked = connection.parked
            while parked and not self._over(connection.held_bytes) and room():
                self.parked_requests -= 1
                yield tagged, parked.popleft()
            if parked or self._over(connection.held_bytes):
                muted += 1
            elif not held:
                del self._connections[tagged]
        self.muted_connections = muted
        self._trim_when_idle()

    def _trim_when_idle(self) -> None:
        if self.held_bytes:
            self._trim_at = -1.0  # due once idle again
        elif self._trim_at < 0:
            self._trim_at = time.monotonic() + TRIM_AFTER_S
        elif self._trim_at and time.monotonic() >= self._trim_at:
            self._trim_at = 0.0
            _malloc_trim(0)


def _view(frame: Buffer | zmq.Frame) -> memoryview:
    return frame.buffer if isinstance(frame, zmq.Frame) else memoryview(frame)
