"""The replies the front holds for clients that have not taken them yet, bounded in bytes.

ZeroMQ's high-water marks count messages, not bytes: a client that sends FETCHes and never
reads would have the front hold every reply (60 unread 16 MiB replies: ~1 GB). So the front
counts what it holds. A reply of TRACKED_BYTES or more is sent as a tracked zero-copy frame,
whose tracker says when ZeroMQ has let go of it (written into the connection's TCP socket, or
the connection closed); until then its bytes count against its client and against the total.

The rule (docs/protocol.md, "Flow control"): a client that holds nothing gets its reply
whatever the totals; otherwise a reply that would take what the front holds for that client
above `per_client`, or for every client above `total`, is dropped. So the front holds at most
`total` plus, for each client, one reply (at most broker.fetch_max_bytes, or one larger
message). Smaller replies are not counted: tracking costs tens of microseconds a message, and
ZeroMQ's SNDHWM (1000 messages a connection) bounds them.
"""

from __future__ import annotations

from collections import deque

import zmq

TRACKED_BYTES = 64 * 1024
"""Replies from this size on are counted (and sent without copying, as pyzmq does anyway)."""


class ReplyBudget:
    """What the front holds, per client (by tagged identity) and in all."""

    def __init__(self, per_client: int, total: int) -> None:
        self.per_client = per_client
        self.total = total
        self.held_bytes = 0
        """Bytes of tracked replies ZeroMQ has not let go of yet."""
        self.dropped = 0
        """Replies dropped since start."""
        self._held: dict[bytes, deque[tuple[zmq.MessageTracker, int]]] = {}
        self._client_bytes: dict[bytes, int] = {}

    def admit(self, client: bytes, size: int) -> bool:
        """Whether a reply of `size` bytes may go to `client` now (False: drop it, counted)."""
        held = self._release(client)
        if not held:
            return True
        if held + size <= self.per_client:
            if self.held_bytes + size <= self.total:
                return True
            self.release_all()  # what others took since the last look
            if self.held_bytes + size <= self.total:
                return True
        self.dropped += 1
        return False

    def held_for(self, client: bytes) -> int:
        """The bytes held for `client` when last looked at."""
        return self._client_bytes.get(client, 0)

    def hold(self, client: bytes, tracker: zmq.MessageTracker, size: int) -> None:
        """Count a reply sent to `client` until its tracker is done."""
        self._held.setdefault(client, deque()).append((tracker, size))
        self._client_bytes[client] = self._client_bytes.get(client, 0) + size
        self.held_bytes += size

    def release_all(self) -> None:
        """Let go of the replies that ZeroMQ is done with (every client's)."""
        for client in list(self._held):
            self._release(client)

    def _release(self, client: bytes) -> int:
        """Let go of `client`'s replies that ZeroMQ is done with: the bytes still held for it.
        A connection's messages leave in the order they were sent, so the first that is not
        done ends the look."""
        replies = self._held.get(client)
        if replies is None:
            return 0
        released = 0
        while replies and replies[0][0].done:
            released += replies.popleft()[1]
        if not released:
            return self._client_bytes[client]
        self.held_bytes -= released
        if not replies:
            del self._held[client], self._client_bytes[client]
            return 0
        self._client_bytes[client] -= released
        return self._client_bytes[client]
