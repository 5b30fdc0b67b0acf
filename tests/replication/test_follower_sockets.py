"""A fetcher's socket closed while its handshake with the leader is under way (the copy loop
that used it cancelled by a role change just after it started, as when the leader epoch moves
twice in a row or the worker stops): the worker's context carries every other socket's
messages after it.
libzmq's I/O thread sends a monitored socket's events with a blocking send; an event sent after
the monitor was closed blocked the worker's I/O thread for ever, and with it every follower and
the worker's channel to its supervisor (seen: a restarted broker that followed nothing more and
opened no new partition)."""

from __future__ import annotations

from pathlib import Path

import trio
import trio.testing

from broker.log import PartitionLog
from broker.replication.fetcher import Fetchers
from broker.replication.follower import Follower, Role
from broker.security import BrokerKeys
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
                        2, "clicks", 0, lambda: plog, role, 1 << 20, 200, no_copy, fetchers
                    )
                    nursery.start_soon(follower.run)
                await trio.testing.wait_all_tasks_blocked()
                nursery.cancel_scope.cancel()
            assert live.carries(), f"the context carries nothing after round {round_}"
    finally:
        live.close()
