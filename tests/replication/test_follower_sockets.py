"""A fetcher's socket and its handshakes with the leader.

Closed while its handshake is under way (the copy loop that used it cancelled by a role change
just after it started, as when the leader epoch moves twice in a row or the worker stops): the
worker's context carries every other socket's messages after it. libzmq's I/O thread sends a
monitored socket's events with a blocking send; an event sent after the monitor was closed
blocked the worker's I/O thread for ever, and with it every follower and the worker's channel
to its supervisor (seen: a restarted broker that followed nothing more and opened no new
partition).

Refused by the leader's ZAP handler: libzmq never connects that socket again, so the fetcher
connects a new one at the copy loop's next try, which gets in once the leader lets the key in.
Seen: a follower whose second request waited for ever to be sent on the refused socket, with
no warning, and that would not have followed had the leader's keys been mended."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import trio
import trio.testing

from broker import protocol
from broker.log import PartitionLog
from broker.log.epochs import EpochEntry
from broker.log.message import encode_message, iter_messages
from broker.replication.fetcher import Fetchers
from broker.replication.follower import EpochRound, Follower, Role
from broker.security import BrokerKeys, Principals, ZapHandler
from broker.trio_socket import TrioSocket
from tests.sockets import LiveContext

LEADERS = 50
ROUNDS = 20
"""Rounds of LEADERS fetchers at once: on the old code one round in three or so wedged the context
(libzmq closes a socket with no linger at once: the handshake must end in that instant)."""


async def no_copy(count: int) -> None:
    raise AssertionError("nothing was copied")


async def test_fetchers_closed_during_their_handshake_leave_the_workers_context_working(
    tmp_path: Path,
) -> None:
    plog = PartitionLog.open(tmp_path / "clicks-0")
    live = LiveContext(curve=True)  # Curve: handshakes that take the I/O thread a while
    assert live.keys is not None
    client = live.keys
    keys = BrokerKeys(client.public, client.secret, frozenset({client.public, client.broker}))
    try:
        for round_ in range(ROUNDS):
            async with trio.open_nursery() as nursery:  # their handshakes under way together
                fetchers = Fetchers(2, live.context, nursery, 5_000, lambda: keys)
                for leader in range(LEADERS):  # a fetcher, a connection each
                    role = Role(leader, live.endpoint, 0, client.broker.decode())
                    follower = Follower(
                        2,
                        "clicks",
                        0,
                        lambda: plog,
                        role,
                        1 << 20,
                        200,
                        no_copy,
                        fetchers,
                        EpochRound(),
                    )
                    nursery.start_soon(follower.run)
                await trio.testing.wait_all_tasks_blocked()
                nursery.cancel_scope.cancel()
            assert live.carries(), f"the context carries nothing after round {round_}"
    finally:
        live.close()


async def serve_zap(zap: ZapHandler) -> None:
    channel = TrioSocket(zap.socket, lambda socket, flags: socket.recv_multipart(flags))
    while True:
        zap.take(await channel.receive())


async def lead_with_one_message(live: LiveContext) -> None:
    """Broker 1 leading clicks-0 in epoch 0 with one message "first": the first MULTI_FETCH
    gets it, later ones wait (long polls nothing ends)."""
    channel = TrioSocket(live.server, lambda socket, flags: socket.recv_multipart(flags))
    data = encode_message(b"first", timestamp_ms=0)
    answered = False
    while True:
        identity, *frames = await channel.receive()
        header, request = protocol.decode_request(frames)
        reply: protocol.Reply
        if isinstance(request, protocol.OffsetForLeaderEpochRequest):
            reply = protocol.OffsetForLeaderEpochReply(-1, 0)
        elif isinstance(request, protocol.MultiFetchRequest) and not answered:
            answered = True
            fetched = protocol.FetchReply(len(data), 0, data, 0, (EpochEntry(0, 0),))
            part = protocol.encode_reply(0, fetched, protocol.PRODUCERS_FETCH_VERSION)
            reply = protocol.MultiFetchReply((protocol.fetch_part_reply("clicks", 0, part),))
        else:
            continue
        replied = protocol.encode_reply(header.correlation_id, reply, header.version)
        await channel.send([identity, *replied])


async def test_a_follower_refused_by_the_leader_says_why_and_follows_once_let_in(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, "pylog.follower")
    plog = PartitionLog.open(tmp_path / "clicks-0")
    live = LiveContext(curve=True)
    assert live.keys is not None
    client = live.keys
    keys = BrokerKeys(client.public, client.secret, frozenset({client.public, client.broker}))
    principals = Principals(None)  # the leader lets no key in, the follower's neither
    zap = ZapHandler(live.server_context, principals)
    copied = trio.Event()

    async def flushed(count: int) -> None:
        plog.flush()
        copied.set()

    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(serve_zap, zap)
            nursery.start_soon(lead_with_one_message, live)
            fetchers = Fetchers(2, live.context, nursery, 5_000, lambda: keys)
            role = Role(1, live.endpoint, 0, client.broker.decode())
            follower = Follower(
                2, "clicks", 0, lambda: plog, role, 1 << 20, 200, flushed, fetchers, EpochRound()
            )
            nursery.start_soon(follower.run)
            with trio.fail_after(20):
                while "refused this broker's key (ZAP 400)" not in caplog.text:
                    await trio.sleep(0.01)
                while zap.refused < 2:  # it tries again, and is refused again
                    await trio.sleep(0.01)
            principals.from_registry({"brokers": [client.public]})  # the leader's keys mended
            with trio.fail_after(20):
                await copied.wait()
            assert [m.value for m in iter_messages(plog.read(0, 1 << 20))] == [b"first"]
            assert len(fetchers) == 1  # the refused socket closed with its last user
            nursery.cancel_scope.cancel()
    finally:
        zap.close()
        live.close()
