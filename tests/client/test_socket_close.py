"""Closing a client's Curve socket while its handshake is under way (a connection closed just
after its first request, as a fire-and-forget producer is, or a socket dropped on a timeout
while the broker comes back): the context the socket was in carries every other socket's
messages after it. libzmq's I/O thread sends a monitored socket's events to its monitor with a
blocking send; an event sent after the monitor was closed blocked that thread for ever, and with
it every socket of the context (the cluster clients share one context)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
import zmq
import zmq.asyncio

from broker.aio.connection import AsyncConnection
from broker.client import Connection
from broker.client.transport import ZmqTransport
from broker.protocol import Ack, ProduceRequest
from tests.sockets import LiveContext

ROUNDS = 30
"""Connections opened and closed at once: the handshake that ends after the close came within
the first few on the old code."""


@pytest.fixture
def live() -> Iterator[LiveContext]:
    live = LiveContext(curve=True)
    yield live
    live.close()


@pytest.fixture
def live_asyncio() -> Iterator[LiveContext]:
    live = LiveContext(curve=True, context_class=zmq.asyncio.Context)
    yield live
    live.close()


def request() -> ProduceRequest:
    return ProduceRequest("clicks", 0, Ack.NONE, b"")


def test_connections_closed_during_their_handshake_leave_the_shared_context_working(
    live: LiveContext,
) -> None:
    for _ in range(ROUNDS):
        connection = Connection(live.endpoint, transport=ZmqTransport(live.context), keys=live.keys)
        connection.send_nowait(request())
        connection.close()
    assert live.carries()


def test_asyncio_connections_closed_during_their_handshake_leave_the_shared_context_working(
    live_asyncio: LiveContext,
) -> None:
    context = live_asyncio.context
    assert isinstance(context, zmq.asyncio.Context)

    async def open_and_close() -> None:
        for _ in range(ROUNDS):
            connection = AsyncConnection(
                live_asyncio.endpoint, context=context, keys=live_asyncio.keys
            )
            await connection.send_nowait(request())
            await connection.close()

    asyncio.run(open_and_close())
    assert live_asyncio.carries()
