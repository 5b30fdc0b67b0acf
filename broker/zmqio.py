"""Multipart sends and receives on the request path, without pyzmq's per-frame overhead.

pyzmq's `send_multipart` and `recv_multipart` cost several microseconds a frame beyond the
libzmq call: an enum operation per flag (`SNDMORE | flags`) and, on receive, a
`getsockopt(RCVMORE)` (~2.5 µs here) per frame. On a path where a request crosses three
sockets, that was the largest single cost of a one-message request (perf/README.md). These
helpers call the backend's `send` and `recv` directly with int flags, and read a frame's
"more" flag from the frame itself.

- `send_frames` sends a multipart message; frames under pyzmq's copy threshold (64 KiB) are
  copied into ZeroMQ, larger buffers and `zmq.Frame`s are sent without copying.
- `receive_routed` receives one whole message whose first frame is an identity or a tag that
  always has frames after it (what a ROUTER, or our DEALER peers, receive): that frame as
  bytes, the rest as `zmq.Frame`s (they carry their "more" flag; forwarded as they are, they
  are not copied).
- `receive_frames` receives one whole message of any shape, every frame a `zmq.Frame`.
- `receive_bytes` receives one frame as bytes, with no "more" check at all: for a peer of ours
  whose messages say how many frames they have (supervisor to worker).
- `monitor_event` reads an event of a socket monitor (zmq_socket_monitor: a frame of a u16
  event and a u32 value, native byte order, then the endpoint's frame). pyzmq's
  parse_monitor_message does the same, but its module imports asyncio (through zmq.asyncio),
  20 ms at every start of every process that reads events: pylogd, its workers, the clients.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Final

import zmq
from zmq.backend import Socket as _BackendSocket

from broker.log.message import Buffer

NOBLOCK: Final = int(zmq.NOBLOCK)
_SNDMORE: Final = int(zmq.SNDMORE)
_send = _BackendSocket.send
_recv = _BackendSocket.recv
_MONITOR_EVENT: Final = struct.Struct("=HI")


def send_frames(
    socket: zmq.Socket[bytes], frames: Sequence[Buffer | zmq.Frame], flags: int = 0
) -> None:
    """Send `frames` as one message (flags: 0 or NOBLOCK). zmq.Again, with NOBLOCK and the
    queue full, can only come from the first frame: then nothing was sent."""
    more = flags | _SNDMORE
    last = len(frames) - 1
    for i in range(last):
        _send(socket, frames[i], more, False)
    _send(socket, frames[last], flags, False)


def receive_routed(socket: zmq.Socket[bytes], flags: int = 0) -> tuple[bytes, list[zmq.Frame]]:
    """One whole message of two or more frames: the first as bytes, the others as zmq.Frame."""
    first: bytes = _recv(socket, flags, True)
    return first, _rest(socket, _recv(socket, 0, False))


def receive_frames(socket: zmq.Socket[bytes], flags: int = 0) -> list[zmq.Frame]:
    """One whole message, every frame a zmq.Frame."""
    return _rest(socket, _recv(socket, flags, False))


def _rest(socket: zmq.Socket[bytes], frame: zmq.Frame) -> list[zmq.Frame]:
    """`frame` and the frames of its message after it (there as soon as it is: ZeroMQ delivers
    messages whole)."""
    frames = [frame]
    while frame.more:
        frame = _recv(socket, 0, False)
        frames.append(frame)
    return frames


def receive_bytes(socket: zmq.Socket[bytes], flags: int = 0) -> bytes:
    """One frame, as bytes, with no "more" check: for messages whose frame count the receiver
    knows (broker.transport.receive_from_supervisor)."""
    frame: bytes = _recv(socket, flags, True)
    return frame


def source_fd(frames: Sequence[zmq.Frame]) -> int:
    """The descriptor of the TCP connection a received message came by (ZeroMQ's SRCFD, what a
    monitor's EVENT_DISCONNECTED names), or -1 for one without (inproc, a message made here)."""
    try:
        return int(frames[0].get(zmq.SRCFD))
    except zmq.ZMQError:
        return -1


def monitor_event(frames: Sequence[Buffer]) -> tuple[int, int]:
    """The event (a zmq.EVENT_* number) and its value from the frames a monitor socket gave.
    Raises ValueError for frames that are not a monitor event."""
    if len(frames) != 2 or len(frames[0]) != _MONITOR_EVENT.size:
        raise ValueError(f"not a ZeroMQ monitor event: {len(frames)} frames")
    event, value = _MONITOR_EVENT.unpack(frames[0])
    return event, value
