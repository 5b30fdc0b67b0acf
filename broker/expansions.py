"""The compressed sets a worker opens, its clients' in turn (issue 50, 4).

A PRODUCE's compressed sets cost the worker that opens them in proportion to what they expand
to, not to what came on the wire: a few KB of zstd may hold 64 MiB (MAX_EXPANDED_BYTES), about
45 ms to decompress and check. Served in the order they came, forty such sets from four
clients held a fifth client's small produce behind all of them (two seconds; 1,280 from twenty
clients, a minute), past its timeout. So a worker serves a request whose sets it would have to
open (its append raised broker.log.partition.SetsToOpen) in a turn of its client's: each client
that has such requests waiting has its own queue, in the order they came, and the worker
serves one client's for a turn (broker.worker.TURN_S, one request at least), then the next
client's, serving between two turns everything else that came. What a client sends after a
request in its queue goes behind it, so that its requests are appended in the order it sent
them, as before; other clients' go on at once.

A client is its connection (broker.transport.connection_of), and a MULTI_PRODUCE's parts name
the connection they came by (broker.joins.client_of), so that a client's parts keep its order
too. The requests wait as they came, their bytes still counted by the front's flow control
(`queued_request_bytes`) until served, so the queues are bounded by it.
"""

from __future__ import annotations

from collections import deque

import trio

from broker.joins import client_of

Request = tuple[bytes, list[bytes]]
"""A request as the worker takes it: its tagged identity and its frames."""


class Expansions:
    """The requests of each client waiting for their turn, the clients in turn."""

    def __init__(self) -> None:
        self._queues: dict[bytes, deque[Request]] = {}
        """Each client's requests, in the order they came; the clients in the order of their
        turns (a client served goes to the back)."""
        self._waiting = trio.Event()
        self.requests = 0
        """How many requests wait (none: no client has any)."""

    def behind(self, tagged: bytes, frames: list[bytes]) -> bool:
        """Queue the request after its client's requests waiting, if it has any: whether it
        did (when not, serve it now)."""
        queue = self._queues.get(client_of(tagged))
        if queue is None:
            return False
        queue.append((tagged, frames))
        self.requests += 1
        return True

    def wait_turn(self, tagged: bytes, frames: list[bytes]) -> None:
        """Queue the request, whose sets are to be opened, after its client's waiting."""
        self._queues.setdefault(client_of(tagged), deque()).append((tagged, frames))
        self.requests += 1
        self._waiting.set()

    async def next_turn(self) -> tuple[bytes, deque[Request]]:
        """The client whose turn it is and its queue (waiting for one), after a checkpoint:
        the worker's loop serves what came before each turn. Take its requests with `take`,
        then `end_turn`."""
        await trio.lowlevel.checkpoint()
        while not self._queues:
            self._waiting = trio.Event()
            await self._waiting.wait()
        client = next(iter(self._queues))
        return client, self._queues[client]

    def take(self, queue: deque[Request]) -> Request:
        """The first request of a client's queue, taken out of it."""
        self.requests -= 1
        return queue.popleft()

    def end_turn(self, client: bytes) -> None:
        """The turn of `client` is over: it goes to the back of the turns if it has requests
        left (some may have come during its turn), else it has none."""
        queue = self._queues.pop(client)
        if queue:
            self._queues[client] = queue
