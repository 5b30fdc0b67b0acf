"""How a blocking client reaches its brokers: the transport seam (as httpx's transports; h11's
core without I/O is broker.client.framing). A client's connection (broker.client.connection)
builds a request's frames and reads its reply's; a `Transport` carries them. It opens a
`Channel` to a broker's endpoint; a channel sends frames and hands back the replies in the
order they come; the transport waits on several channels at once (`wait_any`).

- `ZmqTransport`, the default: ZeroMQ sockets of one context (docs/protocol.md, "Transport").
  A channel for requests with one in flight is a REQ socket; a pipelined one (any number in
  flight, fire-and-forget produce requests) a DEALER socket. With Curve keys each socket has
  a monitor of its handshakes (broker.client.handshakes): a failed handshake ends a wait at
  once with AuthenticationFailed, and a refused connection with ConnectionRefused.
- `MemoryTransport`: no socket and no thread. Each request is handed at once to a function
  that answers it (a scripted broker, `Answer`); a wait with no reply there passes on the
  transport's clock (a fake clock in tests moves on, rather than anyone blocking). For unit
  tests of the clients, and of programs built on them.

A transport's `clock` is the clock its waits run on: a ZeroMQ socket's wait is real time
(broker.clock.SYSTEM_CLOCK). A client reads the deadlines of its I/O and sleeps between its
retries on it, so that on a MemoryTransport with a fake clock nothing waits at all.

A transport given to a client is the giver's to close; one a client makes it closes itself.
"""

from __future__ import annotations

import atexit
import contextlib
import threading
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Callable, Collection, Sequence
from typing import Any, Final

import zmq

from broker.client.handshakes import HandshakeMonitor, poll_ms
from broker.clock import SYSTEM_CLOCK, WaitingClock
from broker.errors import AuthenticationFailed, ConnectionRefused
from broker.log.message import Buffer
from broker.security import ClientKeys
from broker.security.monitor import close_monitored
from broker.zmqio import NOBLOCK, receive_frames, send_frames

FIRE_AND_FORGET_LINGER_MS: Final = 5000
"""How long closing a pipelined channel waits for fire-and-forget requests still queued to go
out."""


class Channel(ABC):
    """Frames to one broker and its replies, in order. Not safe to share between threads."""

    endpoint: str

    @abstractmethod
    def send(self, frames: Sequence[Buffer]) -> None:
        """Send one request's frames. AuthenticationFailed, nothing sent, when the channel's
        Curve handshake is known to have failed."""

    @abstractmethod
    def receive(self, timeout_s: float) -> list[Buffer] | None:
        """The next reply's frames, or None when none comes within `timeout_s` (0: only look).
        AuthenticationFailed as soon as the handshake fails, ConnectionRefused as soon as a
        connection is refused (what was sent will never be answered: drop the channel)."""

    @abstractmethod
    def close(self, linger: bool = False) -> None:
        """Close the channel; with `linger`, requests still queued get their linger to go out."""


class Transport(ABC):
    """Channels to brokers, and waits on them, timed by `clock`."""

    clock: WaitingClock

    @abstractmethod
    def open(self, endpoint: str, keys: ClientKeys | None, *, pipelined: bool) -> Channel:
        """A channel to `endpoint` ("tcp://host:port"): for requests with one in flight, or
        `pipelined` (any number, and fire-and-forget requests). `keys` make it a CurveZMQ
        client of a broker serving Curve (docs/security.md)."""

    @abstractmethod
    def wait_any(self, channels: Collection[Channel], timeout_s: float) -> Channel | None:
        """One of `channels` (this transport's) with a reply to read, waiting up to
        `timeout_s`; None when none has one by then."""

    @abstractmethod
    def close(self) -> None:
        """Free what the transport holds (its channels closed first)."""


# -- ZeroMQ ---------------------------------------------------------------------------------


def terminate_unblocked(context: zmq.Context[Any]) -> None:
    """What a client's context does when the garbage collector takes it unclosed (a client
    left unclosed, as `Admin(...).create_topic(...)` under an `except` leaves one in a cycle):
    it terminates on a thread of its own. pyzmq's own finalizer terminates it on the spot,
    and CPython has cleared the context's weak set of sockets by then when they are garbage
    together: it waited for ever for sockets it no longer knew, and the program hung. Their
    own finalizers close them next; the termination then ends."""
    if context.closed or _exiting:  # at exit, as pyzmq: the process's end frees it
        return
    terminating = threading.Thread(target=context.term, name="pylog-context-term", daemon=True)
    with contextlib.suppress(RuntimeError):  # the interpreter is shutting down
        terminating.start()


_exiting = False


@atexit.register
def _at_exit() -> None:
    global _exiting
    _exiting = True


class ClientContext(zmq.Context[zmq.Socket[bytes]]):
    """The ZeroMQ context of the clients: a zmq.Context whose collection never blocks
    (terminate_unblocked)."""

    def __del__(self) -> None:
        terminate_unblocked(self)


class ZmqTransport(Transport):
    """Channels as ZeroMQ sockets of `context` (default: one of the transport's own, terminated
    by `close()`, which then waits up to FIRE_AND_FORGET_LINGER_MS for fire-and-forget requests
    still queued)."""

    clock: WaitingClock = SYSTEM_CLOCK

    def __init__(self, context: zmq.Context[zmq.Socket[bytes]] | None = None) -> None:
        self._own_context = context is None
        self.context: zmq.Context[zmq.Socket[bytes]] = (
            ClientContext() if context is None else context
        )

    def open(self, endpoint: str, keys: ClientKeys | None, *, pipelined: bool) -> ZmqChannel:
        if pipelined:
            return ZmqChannel(self.context, endpoint, keys, zmq.DEALER, FIRE_AND_FORGET_LINGER_MS)
        return ZmqChannel(self.context, endpoint, keys, zmq.REQ, 0)

    def wait_any(self, channels: Collection[Channel], timeout_s: float) -> Channel | None:
        by_socket = {_zmq(channel).socket: channel for channel in channels}
        poller = zmq.Poller()
        for socket in by_socket:
            poller.register(socket, zmq.POLLIN)
        ready = poller.poll(poll_ms(timeout_s))
        return by_socket[ready[0][0]] if ready else None

    def close(self) -> None:
        if self._own_context:
            self.context.term()


def _zmq(channel: Channel) -> ZmqChannel:
    if not isinstance(channel, ZmqChannel):
        raise TypeError(f"{channel!r} is not a channel of a ZmqTransport")
    return channel


class ZmqChannel(Channel):
    """A socket of `kind` (REQ or DEALER) connected to `endpoint`, with its handshakes' monitor
    (without keys, only until its first handshake succeeds: all that could fail is the
    mechanism); closed again if connecting fails (a socket left open would make terminating
    the context wait for ever)."""

    def __init__(
        self,
        context: zmq.Context[zmq.Socket[bytes]],
        endpoint: str,
        keys: ClientKeys | None,
        kind: int,
        linger_ms: int,
    ) -> None:
        self.endpoint = endpoint
        self._bursts = kind == zmq.DEALER
        """Replies come in bursts (the acks of one flush): look before polling."""
        self.socket: zmq.Socket[bytes] = context.socket(kind)
        self._monitor: HandshakeMonitor | None = None
        try:
            self.socket.setsockopt(zmq.LINGER, linger_ms)
            if keys is not None:
                keys.apply(self.socket)
            self._monitor = HandshakeMonitor(self.socket, endpoint, keys is not None)
            self.socket.connect(endpoint)
        except BaseException:
            self.close()
            raise

    def send(self, frames: Sequence[Buffer]) -> None:
        monitor = self._monitor
        if monitor is not None and not monitor.succeeded:
            self._checked(monitor)
        send_frames(self.socket, frames)  # a DEALER sends no delimiter, a REQ one

    def receive(self, timeout_s: float) -> list[Buffer] | None:
        received = None
        if self._bursts:  # no poll while a burst lasts (a try: no context manager a reply)
            try:
                received = receive_frames(self.socket, NOBLOCK)
            except zmq.Again:
                received = None
        if received is None:  # wait outside the handler: Ctrl-C there is not chained to Again
            if not self._readable(timeout_s):
                return None
            received = receive_frames(self.socket)
        return [frame.buffer for frame in received]

    def _readable(self, timeout_s: float) -> bool:
        """Whether the socket has a reply within `timeout_s`; raises as `receive`. A socket
        without monitor is polled alone: a broker that goes down costs the timeout."""
        monitor = self._monitor
        if monitor is None:
            return bool(self.socket.poll(poll_ms(timeout_s), zmq.POLLIN))
        readable = monitor.wait_readable(timeout_s)
        if not monitor.curve:
            self._checked(monitor)
        return readable

    def _checked(self, monitor: HandshakeMonitor) -> None:
        """Take the handshake events (AuthenticationFailed on a failure); the monitor of a
        socket without keys goes once a handshake has succeeded (unread, its events would pile
        up at each reconnection)."""
        monitor.check()
        if monitor.succeeded and not monitor.curve:
            self._monitor = None
            self.socket.disable_monitor()
            monitor.socket.close(linger=0)

    def close(self, linger: bool = False) -> None:
        linger_ms = None if linger else 0
        if self._monitor is None:
            self.socket.close(linger_ms)
        else:
            close_monitored(self.socket, self._monitor.socket, linger_ms)
            self._monitor = None


# -- in memory ------------------------------------------------------------------------------

Answer = Callable[[str, list[bytes]], Sequence[Buffer] | None]
"""A scripted broker for a MemoryTransport: given the endpoint a request went to and its frames
(broker.protocol.decode_request reads them), the reply's frames (broker.protocol's encoders make
them), or None for no reply (a PRODUCE with ack NONE, or a reply lost). It may raise
ConnectionRefused (nothing listens there) or AuthenticationFailed (a handshake refused): the
channel's next receive raises it."""


class MemoryTransport(Transport):
    """Requests answered in memory by `answer`, at once; waits timed by `clock` (for tests, a
    clock that moves when slept on; with SYSTEM_CLOCK a wait with no reply really waits)."""

    def __init__(self, answer: Answer, clock: WaitingClock = SYSTEM_CLOCK) -> None:
        self.answer = answer
        self.clock = clock
        self.channels: list[MemoryChannel] = []
        """Every channel opened, in order (closed ones too)."""

    def open(self, endpoint: str, keys: ClientKeys | None, *, pipelined: bool) -> MemoryChannel:
        channel = MemoryChannel(self, endpoint, pipelined)
        self.channels.append(channel)
        return channel

    def wait_any(self, channels: Collection[Channel], timeout_s: float) -> Channel | None:
        for channel in channels:
            if _memory(channel).ready:
                return channel
        self.clock.sleep(timeout_s)
        return None

    def close(self) -> None:
        for channel in self.channels:
            channel.close()


def _memory(channel: Channel) -> MemoryChannel:
    if not isinstance(channel, MemoryChannel):
        raise TypeError(f"{channel!r} is not a channel of a MemoryTransport")
    return channel


class MemoryChannel(Channel):
    """A channel of a MemoryTransport: each request answered as it is sent, the replies queued."""

    def __init__(self, transport: MemoryTransport, endpoint: str, pipelined: bool) -> None:
        self.endpoint = endpoint
        self.pipelined = pipelined
        self.closed = False
        self._transport = transport
        self._replies: deque[list[Buffer]] = deque()
        self._failure: AuthenticationFailed | ConnectionRefused | None = None

    @property
    def ready(self) -> bool:
        """Whether a receive would return or raise at once."""
        return bool(self._replies) or self._failure is not None

    def send(self, frames: Sequence[Buffer]) -> None:
        if self.closed:
            raise ValueError(f"the channel to {self.endpoint} is closed")
        try:
            reply = self._transport.answer(self.endpoint, [bytes(frame) for frame in frames])
        except (AuthenticationFailed, ConnectionRefused) as failure:
            self._failure = failure
            return
        if reply is not None:
            self._replies.append(list(reply))

    def receive(self, timeout_s: float) -> list[Buffer] | None:
        if self._replies:
            return self._replies.popleft()
        if self._failure is not None:
            failure, self._failure = self._failure, None
            raise failure
        self._transport.clock.sleep(timeout_s)
        return None

    def close(self, linger: bool = False) -> None:
        self.closed = True
        self._replies.clear()
