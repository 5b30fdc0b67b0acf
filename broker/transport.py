"""The frames between supervisor and workers (a worker's end of the socket is a
broker.trio_socket.TrioSocket; this module imports no trio, so the supervisor does not).

Supervisor <-> worker messages travel over an ipc DEALER pair; the first byte of the first
frame says what the message is:

    REQUESTS b"B" + count (u32),                  requests from clients, `count` of them, each
             then per request: the tagged         behind its client's identity as the ROUTER
             identity, the request frame          gave it, tagged: b"R" + identity for a DEALER
                                                  client, b"Q" + identity for a REQ client, whose
                                                  replies need the empty delimiter back; b"r" or
                                                  b"q" + throttle_ms (u32) + identity for a
                                                  request a quota held back that long
                                                  (broker.quotas), which its reply says
    REPLY    the same tagged frame, reply frames  the worker's answer, routed back by the tag
    REPLIES  b"P" + count (u32), then per reply:  worker to supervisor: one-frame replies made
             the tagged frame, the reply frame    together (the acks a flush gave), `count`
    COMMAND  b"C", JSON                           supervisor to worker: a broker.control Command
                                                  (open, delete, configure, role, lease)
    STATE    b"S", JSON                           worker to supervisor: a broker.control Report
                                                  (hello, opened, deleted, ISR asked, stats)
    CREDIT   b"K", count (u64)                    worker to supervisor: it has served `count`
                                                  more bytes of request frames (flow control)

The supervisor passes a worker every request it drained for it in one go as one REQUESTS
message: each ZeroMQ message costs a wake-up of the sender's I/O thread and of the receiving
worker, so under load, when requests queue, the hand-offs per request fall by themselves. The
acks one flush gives go back the same way, as one REPLIES message. The
client's request frame is passed through as it came, never re-encoded. The worker knows every
message's frame count from its first frame (receive_from_supervisor), so it reads them with no
per-frame "more" check.

Flow control: the supervisor counts the bytes of the requests it has passed a worker, and
the worker gives them back in CREDIT messages once served (every CREDIT_EVERY_BYTES, or less
when the front's `queued_request_bytes` is small, and CREDIT_IDLE_S after it served them at the
latest), so what waits for a worker is bounded in bytes, not in messages. A request counts its
frame's bytes, but a FETCH counts the most its reply may carry, `fetch_max_bytes`
(`request_weight`): what waits for a worker is also what it will send back, so that clients
pipelining FETCHes cannot queue gigabytes of replies-to-be ahead of everyone else's requests.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, Final

import zmq

from broker.log.message import Buffer
from broker.zmqio import receive_bytes

FROM_DEALER = b"R"
FROM_REQ = b"Q"
_THROTTLED_TAGS: Final = frozenset(b"rq")
"""FROM_DEALER and FROM_REQ of a request a quota held back (the tag's byte, compared without
slicing: every reply is looked at), then throttle_ms."""
REQUESTS = b"B"
REPLIES = b"P"
COMMAND = b"C"
STATE = b"S"
CREDIT = b"K"
CREDIT_EVERY_BYTES = 1 << 20
"""A worker gives back credit at least this often while it has requests to serve..."""
CREDIT_IDLE_S = 0.05
"""... and what it served this long after it served it: not a message each time it has nothing
left to read, which at one request a time cost a message a request (~6 µs of CPU each)."""


_FETCH_KEYS: Final = frozenset({1, 12})
"""The api_keys of FETCH and MULTI_FETCH, the u16 a request frame starts with
(docs/protocol.md)."""
FETCH_JOINED: Final = b"F"
"""The first byte of the tag a MULTI_FETCH's share of a worker goes behind when its parts
span workers (broker.fetch_joins): the front may ask the worker to answer it at once."""


WORKER_SHIFT: Final = 20
"""A fetch session's id (broker.fetch_sessions) is (its worker's index + 1) << WORKER_SHIFT,
plus random low bits: the front finds the worker that holds it (`session_worker`)."""


def session_worker(session_id: int) -> int:
    """The index of the worker that holds fetch session `session_id` (-1 for none)."""
    return (session_id >> WORKER_SHIFT) - 1


def request_weight(frame: Buffer, fetch_max_bytes: int) -> int:
    """What a request frame passed to a worker counts for in the flow control: a FETCH or a
    MULTI_FETCH the most its reply may carry (`fetch_max_bytes`, the broker's), any other its
    length. The front and the worker count the same frames, so each gives back what the other
    took."""
    if len(frame) > 1 and frame[1] in _FETCH_KEYS and frame[0] == 0:
        return fetch_max_bytes
    return len(frame)


def json_frame(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()


def credit_frames(count: int) -> list[bytes]:
    """A CREDIT message giving back `count` bytes of request frames."""
    return [CREDIT, count.to_bytes(8, "big")]


def requests_frame(count: int) -> bytes:
    """The first frame of a REQUESTS message of `count` requests."""
    return REQUESTS + count.to_bytes(4, "big")


def replies_message(replies: Sequence[tuple[bytes, Buffer]]) -> list[Buffer]:
    """A REPLIES message of one-frame replies, each (tagged identity, reply frame)."""
    frames: list[Buffer] = [REPLIES + len(replies).to_bytes(4, "big")]
    for tagged, frame in replies:
        frames += (tagged, frame)
    return frames


def receive_from_supervisor(socket: zmq.Socket[bytes], flags: int = 0) -> list[bytes]:
    """One message from the supervisor, every frame as bytes: [COMMAND, JSON] or
    [REQUESTS + count, tagged, request, tagged, request, ...]. The frames after the first are
    there as soon as it is (ZeroMQ delivers messages whole)."""
    first = receive_bytes(socket, flags)
    more = 2 * int.from_bytes(first[1:5], "big") if first[:1] == REQUESTS else 1
    return [first, *[receive_bytes(socket) for _ in range(more)]]


def tagged_identity(identity: bytes, frames: list[zmq.Frame]) -> tuple[bytes, list[memoryview]]:
    """From what the front ROUTER received (broker.zmqio.receive_routed), the tagged identity
    to route replies by and the request's frames, as views of the frames received: an empty
    frame first and more after it is a REQ client's delimiter, anything else a DEALER
    client's request."""
    if len(frames) > 1 and not len(frames[0]):
        return FROM_REQ + identity, [frame.buffer for frame in frames[1:]]
    return FROM_DEALER + identity, [frame.buffer for frame in frames]


def throttled(tagged: bytes, throttle_ms: int) -> bytes:
    """The tagged identity of a connection's request that a quota held back `throttle_ms`
    (at most 2^32 - 1): what the worker puts in the reply (throttle_of)."""
    return tagged[:1].lower() + min(throttle_ms, 0xFFFFFFFF).to_bytes(4, "big") + tagged[1:]


def throttle_of(tagged: bytes) -> int:
    """How long a quota held back the request of this tagged identity, in ms (0: not)."""
    return int.from_bytes(tagged[1:5], "big") if tagged[0] in _THROTTLED_TAGS else 0


def connection_of(tagged: bytes) -> bytes:
    """The tagged identity of the connection, without a throttle (throttled)."""
    return tagged[:1].upper() + tagged[5:] if tagged[0] in _THROTTLED_TAGS else tagged


def reply_envelope(tagged: bytes) -> list[bytes]:
    """The frames that route a reply back to the client a tagged identity names."""
    tag = tagged[:1]
    if tag == FROM_DEALER:
        return [tagged[1:]]
    if tag == FROM_REQ:
        return [tagged[1:], b""]
    return reply_envelope(connection_of(tagged))
