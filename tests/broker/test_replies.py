"""broker.replies on real sockets: a ROUTER on loopback, as the front's, and DEALER clients that
read nothing until told to. Such a client (a receive queue of one message, a 64 KiB socket
buffer) still takes one message into its queue and one more into its decoder: each client is
sent those two first, and a 16 MiB reply after them stays in the ROUTER's hands until the
client reads."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest
import zmq

from broker import protocol
from broker.errors import RepliesNotRead
from broker.replies import TRACK_AT, HeldReplies
from broker.transport import FROM_DEALER
from tests.conftest import wait_until

MIB = 1 << 20
BIG = 16 * MIB


class Client:
    def __init__(self, context: zmq.Context[zmq.Socket[bytes]], router: zmq.Socket[bytes]) -> None:
        self.socket = context.socket(zmq.DEALER)
        self.socket.setsockopt(zmq.LINGER, 0)
        self.socket.setsockopt(zmq.RCVHWM, 1)
        self.socket.setsockopt(zmq.RCVBUF, 64 << 10)
        self.socket.connect(router.getsockopt_string(zmq.LAST_ENDPOINT))
        self.socket.send(b"hello")
        identity, hello = router.recv_multipart()
        assert hello == b"hello"
        self.identity = identity
        self.tagged = FROM_DEALER + identity
        router.send_multipart([identity, b"queued"])  # untracked, taken without reading
        router.send_multipart([identity, bytes(BIG)])
        self.taken = False

    def read(self, replies: int) -> list[bytes]:
        """The first frame of each of the next `replies` replies (after the two of __init__)."""
        if not self.taken:
            assert [len(f) for f in self._next(2)] == [6, BIG]
            self.taken = True
        return self._next(replies)

    def _next(self, replies: int) -> list[bytes]:
        got = []
        for _ in range(replies):
            assert self.socket.poll(10_000), "no reply within 10 s"
            got.append(self.socket.recv_multipart()[0])
        return got


@pytest.fixture
def sockets() -> Iterator[tuple[zmq.Context[zmq.Socket[bytes]], zmq.Socket[bytes]]]:
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    router = context.socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    router.bind("tcp://127.0.0.1:*")
    try:
        yield context, router
    finally:
        with contextlib.suppress(zmq.ZMQError):
            router.close()
        context.destroy(linger=0)


def reply(correlation_id: int, size: int) -> bytes:
    return correlation_id.to_bytes(4, "big") + bytes(size - 4)


def send(router: zmq.Socket[bytes], held: HeldReplies, client: Client, frame: bytes) -> None:
    router.send_multipart([client.identity, *held.send(client.tagged, [frame])])


def refused(first_frame: bytes) -> bool:
    return protocol.decode_reply_header([first_frame]).error_code == (
        protocol.ErrorCode.REPLIES_NOT_READ
    )


def test_a_connection_is_muted_at_its_share_and_its_requests_wait_in_order(
    sockets: tuple[zmq.Context[zmq.Socket[bytes]], zmq.Socket[bytes]],
) -> None:
    context, router = sockets
    held = HeldReplies(ceiling=1 << 30, per_client=MIB, parked_per_client=2)
    client = Client(context, router)
    assert not held.muted(client.tagged)

    send(router, held, client, reply(1, TRACK_AT - 1))  # under TRACK_AT: not counted
    assert held.held_bytes == 0 and not held.muted(client.tagged)
    send(router, held, client, reply(2, BIG))
    assert held.held_bytes == BIG and held.muted(client.tagged)

    # Its requests wait, two of them; a third is refused.
    held.park(client.tagged, [zmq.Frame(b"request 1")])
    held.park(client.tagged, [zmq.Frame(b"request 2")])
    with pytest.raises(RepliesNotRead, match="2 requests waiting"):
        held.park(client.tagged, [zmq.Frame(b"request 3")])
    assert held.parked_requests == 2
    assert list(held.release(lambda: True)) == []  # still muted: none served
    assert held.muted_connections == 1

    # A reply beyond its share is not held: REPLIES_NOT_READ in its place, with its id.
    send(router, held, client, reply(3, BIG))
    assert held.replies_refused == 1 and held.held_bytes == BIG

    # Once it reads, its parked requests come back, in order, and nothing is held.
    first_frames = client.read(3)
    assert [int.from_bytes(f[:4], "big") for f in first_frames] == [1, 2, 3]
    assert len(first_frames[1]) == BIG and refused(first_frames[2])
    served: list[bytes] = []

    def released() -> bool:
        served.extend(frames[0].bytes for _, frames in held.release(lambda: True))
        return held.held_bytes == 0

    wait_until(released, what="ZeroMQ to let go of the reply the client read")
    assert served == [b"request 1", b"request 2"]
    assert held.parked_requests == 0 and held.muted_connections == 0
    assert not held.muted(client.tagged)


def test_a_closed_connections_parked_requests_are_dropped(
    sockets: tuple[zmq.Context[zmq.Socket[bytes]], zmq.Socket[bytes]],
) -> None:
    """Issue 50, 2: a connection that closes while muted would have its parked requests served
    once ZeroMQ dropped its replies. Its close (the descriptor its requests came by) drops
    them; another connection's stay."""
    context, router = sockets
    held = HeldReplies(ceiling=1 << 30, per_client=MIB, parked_per_client=4)
    gone, staying = Client(context, router), Client(context, router)
    for client, fd in ((gone, 7), (staying, 8)):
        send(router, held, client, reply(1, BIG))
        held.park(client.tagged, [zmq.Frame(b"parked")], fd)
    assert held.closed(7) == 1 and held.parked_requests == 1
    assert held.closed(-1) == 0
    gone.socket.close()
    staying.read(1)
    served: list[bytes] = []

    def released() -> bool:
        served.extend(tagged for tagged, _ in held.release(lambda: True))
        return held.held_bytes == 0

    wait_until(released, what="ZeroMQ to let go of both connections' replies")
    assert served == [staying.tagged]


def test_over_the_ceiling_a_connection_that_holds_nothing_still_gets_its_reply(
    sockets: tuple[zmq.Context[zmq.Socket[bytes]], zmq.Socket[bytes]],
) -> None:
    context, router = sockets
    held = HeldReplies(ceiling=8 * MIB, per_client=1 << 30, parked_per_client=64)
    stuck, other = Client(context, router), Client(context, router)

    send(router, held, stuck, reply(1, BIG))  # the broker now holds its ceiling
    assert held.muted(stuck.tagged) and not held.muted(other.tagged)
    send(router, held, other, reply(1, BIG))  # held nothing: gets it
    assert held.held_bytes == 2 * BIG and held.replies_refused == 0
    send(router, held, other, reply(2, BIG))  # holds one now, over the ceiling: refused
    assert held.replies_refused == 1

    assert [len(f) for f in other.read(1)] == [BIG]
    assert refused(other.read(1)[0])
    wait_until(
        lambda: list(held.release(lambda: True)) == [] and held.held_bytes == BIG,
        what="ZeroMQ to let go of the reply the other client read",
    )
    assert held.muted(stuck.tagged) and held.muted_connections == 1
