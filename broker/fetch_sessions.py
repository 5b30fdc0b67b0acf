"""A worker's fetch sessions (docs/protocol.md, MULTI_FETCH version 2; Kafka's KIP-227): a
follower's MULTI_FETCH of a thousand partitions names every partition only when a session
begins; each next fetch of the session names the partitions whose fetch changed (a new offset,
epoch or flushed offset) and those it forgets, and is answered with the partitions that have
news (bytes, an error, another high watermark, log start or leader epoch). A round of a
thousand idle partitions then costs no part encoded, decoded or answered on either side.

A session lives in the worker that holds its partitions (the front passes its fetches to that
worker whole, the worker's index being in the session's id: broker.transport.session_worker); a
fetch whose partitions lie in several workers gets no session. A worker keeps at most
MAX_SESSIONS, each forgotten once unused for SESSION_IDLE_S, the least recently used first when
room is needed; a worker that restarts has none. Not safe to share between threads.

A round of a session costs the leader the partitions it names and those with news, not all of
them: each partition of a session keeps a waiter in its flush waiters (FlushWaiters) for the
byte past its fetch offset, which marks it `ready` and wakes the session's long poll; a round
checks, reads and answers only the partitions it names and the ready ones, and every
`full_check_s` all of them (where the follower's position is recorded for each, its ISR
membership kept, and a high watermark or log start moved without new bytes answered).
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field
from typing import Final

import trio

from broker import protocol
from broker.clock import Clock
from broker.errors import FetchSessionIdNotFound, InvalidFetchSessionEpoch
from broker.flush_waiters import FlushWaiters, Waiter
from broker.transport import WORKER_SHIFT

MAX_SESSIONS: Final = 1000
"""Sessions a worker keeps (a follower broker holds one a leader worker)."""
SESSION_IDLE_S: Final = 300.0
"""A session unused this long is forgotten (a follower's idle round is 5 s at most)."""

Key = tuple[str, int]
Sent = tuple[int, int, int]
"""What a partition's last answer in the session said: high watermark, log start, leader
epoch."""


@dataclass(eq=False)
class FetchSession:
    """A follower's session: its partitions' fetches, in the order they came, and what each
    was last answered."""

    id: int
    replica_id: int
    used_at: float
    """When a fetch of the session last came, on the worker's clock."""
    epoch: int = 0
    fetches: dict[Key, protocol.FetchRequest] = field(default_factory=dict)
    sent: dict[Key, Sent] = field(default_factory=dict)
    checked_at: float = -1e9
    """When a round last checked every partition of the session."""
    ready: set[Key] = field(default_factory=set)
    """Partitions whose waiter was woken (bytes flushed past the fetch offset, or the
    partition deleted, taken offline or led elsewhere), or left with bytes unanswered: the
    next round checks them."""
    event: trio.Event = field(default_factory=trio.Event)
    """Set when a partition becomes ready: the long poll of the round in progress waits on
    it."""
    armed: dict[Key, tuple[FlushWaiters, int, Waiter]] = field(default_factory=dict)
    """Each partition's waiter: the waiters it is in, the offset it waits for, its entry."""

    def arm(self, key: Key, waiters: FlushWaiters, offset: int) -> None:
        """Mark `key` ready once `waiters` pass `offset` (the waiter it had, left unless it is
        that one still waiting)."""
        had = self.armed.get(key)
        if had is not None:
            if had[0] is waiters and had[1] == offset and not had[2].popped:
                return
            had[0].leave(had[2])
        self.armed[key] = (waiters, offset, waiters.enter(offset, _Ready(self, key)))

    def disarm(self, key: Key) -> None:
        """Leave `key`'s waiter, if it has one."""
        had = self.armed.pop(key, None)
        if had is not None:
            had[0].leave(had[2])

    def close(self) -> None:
        """Leave every waiter (the session is forgotten)."""
        for key in list(self.armed):
            self.disarm(key)

    def take_ready(self) -> set[Key]:
        """The partitions ready since the last call."""
        ready, self.ready = self.ready, set()
        return ready

    def update(self, request: protocol.MultiFetchRequest, now: float) -> set[Key]:
        """Take a fetch of the session (its epoch checked by FetchSessions.going_on) at `now`:
        its parts in (as FETCHes), its forgotten partitions out. Returns the partitions it names:
        each is answered whatever it has."""
        for gone in request.forgotten:
            key = (gone.topic, gone.partition)
            self.fetches.pop(key, None)
            self.sent.pop(key, None)
            self.disarm(key)
        named = set()
        for part in request.parts:
            key = (part.topic, part.partition)
            self.fetches[key] = request.part_request(part)
            named.add(key)
        self.epoch = request.session_epoch
        self.used_at = now
        return named

    def news(self, key: Key, read: protocol.FetchReply) -> bool:
        """Whether a partition's answer tells the follower anything (bytes, or another high
        watermark, log start or leader epoch than its last answer said): noted as said."""
        said = (read.high_watermark, read.log_start_offset, read.leader_epoch)
        if len(read.message_set) or self.sent.get(key) != said:
            self.sent[key] = said
            return True
        return False


class _Ready:
    """A session's waiter on one partition: set, it marks the partition ready and wakes the
    session."""

    __slots__ = ("key", "session")

    def __init__(self, session: FetchSession, key: Key) -> None:
        self.session = session
        self.key = key

    def set(self) -> None:
        self.session.ready.add(self.key)
        self.session.event.set()


class FetchSessions:
    """The sessions of worker `index`, their idle times on `clock`."""

    def __init__(self, index: int, clock: Clock) -> None:
        self.index = index
        self.clock = clock
        self._sessions: dict[int, FetchSession] = {}
        """By id, the least recently used first."""

    def __len__(self) -> int:
        return len(self._sessions)

    def begin(self, replica_id: int) -> FetchSession:
        """A new session of follower `replica_id`, room made for it."""
        now = self.clock.monotonic()
        for old in [s for s in self._sessions.values() if now - s.used_at >= SESSION_IDLE_S]:
            self._sessions.pop(old.id).close()
        while len(self._sessions) >= MAX_SESSIONS:
            self._sessions.pop(next(iter(self._sessions))).close()
        while True:
            session_id = ((self.index + 1) << WORKER_SHIFT) | (
                1 + secrets.randbelow((1 << WORKER_SHIFT) - 1)
            )
            if session_id not in self._sessions:
                break
        session = self._sessions[session_id] = FetchSession(session_id, replica_id, used_at=now)
        return session

    def going_on(self, request: protocol.MultiFetchRequest) -> FetchSession:
        """The session a fetch goes on with, its epoch the one after the session's last:
        FetchSessionIdNotFound, InvalidFetchSessionEpoch (the session is then forgotten: the
        follower begins another)."""
        session = self._sessions.get(request.session_id)
        if session is None or session.replica_id != request.replica_id:
            raise FetchSessionIdNotFound(
                f"no fetch session {request.session_id} of broker {request.replica_id} here: "
                "begin a new one"
            )
        if request.session_epoch != session.epoch + 1:
            self._sessions.pop(session.id).close()
            raise InvalidFetchSessionEpoch(
                f"fetch session {session.id} is at epoch {session.epoch}, the fetch says "
                f"{request.session_epoch}: begin a new one"
            )
        del self._sessions[session.id]  # the most recently used last
        self._sessions[session.id] = session
        return session
