"""A worker's replica fetchers (docs/replication.md, "The follower"): one connection to each
leader broker it follows partitions of, shared by all of them (Kafka's replica fetcher per
source broker), not a socket per followed partition.

A `Fetcher` is a DEALER connected to one leader's front. The copy loop of each partition
followed from that leader (broker.replication.follower) sends its requests on it as it makes
them, and one receiving task hands each reply to the request waiting for it by correlation id
(the fetcher's own count): a reply to a request that gave up waiting is passed over. The copy
loops' fetches go together (`fetch`): those asked for in one turn of the worker's loop leave
as one MULTI_FETCH, one long poll on the leader for all of them (Kafka's fetcher sends a
broker one fetch request for all its partitions), and each loop is handed its part's answer.
A thousand partitions followed idle from a leader cost it one long poll, not a thousand, and
while nothing comes the long polls grow longer (`Fetcher._waits`: replica_fetch_wait_ms doubled
each idle round, up to half of replica_lag_max_ms), so that the part-by-part work of a round
(about 30 us a part on each side) is done a tenth as often.

`Fetchers` holds the fetchers of a worker, one per leader broker, front endpoint and Curve
key, counted by the copy loops that use each: the first loop to follow a leader connects it
(reading this broker's keys then, in curve mode), and the last to stop closes it.

In security.mode curve the socket is a Curve client of the leader's front: it presents this
broker's key pair (a key of the cluster, which the leader lets in as the cluster principal,
broker.security) and takes the leader for the holder of the public key the leader registered
in ZooKeeper, provided that key is one of the cluster's (BrokerKeys.to_leader). Why the last
handshake failed, as the socket's monitor saw it, is told with a request that got no reply. A
socket the leader refused (its ZAP handler, or ZeroMQ's protocol) is never connected again by
libzmq and takes no message: its waiting requests end at once, and the copy loops' next try
connects a new one (Fetchers.acquire), which gets in once the leader lets the key in.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import trio
import zmq

from broker import protocol
from broker.errors import (
    FetchSessionIdNotFound,
    InvalidFetchSessionEpoch,
    MalformedReply,
    PartitionUnavailable,
    PylogError,
    UnsupportedVersion,
)
from broker.log.message import Buffer
from broker.security import BrokerKeys
from broker.security.monitor import close_monitored, monitor_handshakes
from broker.trio_socket import TrioSocket
from broker.zmqio import monitor_event, receive_frames

log = logging.getLogger("pylog.follower")

SESSION_FETCH_VERSION = 2
"""MULTI_FETCH's version with fetch sessions."""
COPY_WAIT_S = 0.2
"""How long a session's next fetch waits for the copy loops handed bytes to ask again."""
Key = tuple[str, int]


@dataclass(frozen=True)
class Source:
    """A leader broker as its followers reach it (Kafka's source broker): its id, its front's
    endpoint and, in curve mode, the public key it registered (None: none)."""

    broker: int
    endpoint: str
    key: str | None = None

    def __str__(self) -> str:
        return f"leader {self.broker} ({self.endpoint})"


class _Handshakes:
    """The handshakes of a fetcher's socket with the leader, from the socket's monitor (`take`
    each event): why the last one failed (`failure`), None once one succeeded; `refused` once
    the leader refused this broker's key or a handshake failed ZeroMQ's protocol, after which
    libzmq never connects that socket again (a handshake merely broken off, it does)."""

    def __init__(self, socket: zmq.Socket[bytes], leader: Source) -> None:
        self.monitor: zmq.Socket[bytes] = monitor_handshakes(socket)
        self.leader = leader
        self.failure: str | None = None
        self.refused = False

    def take(self, frames: Sequence[Buffer]) -> None:
        """Take one event of the monitor."""
        kind, value = monitor_event(frames)
        leader = self.leader
        if kind == zmq.EVENT_HANDSHAKE_SUCCEEDED:
            self.failure = None
        elif kind == zmq.EVENT_HANDSHAKE_FAILED_AUTH:  # value: the ZAP status code
            self.refused = True
            self.failure = (
                f"{leader} refused this broker's key (ZAP {value}): it is none of the "
                "leader's cluster keys (security.key_file, security.broker_keys), so the "
                "leader does not take this broker for one of its cluster"
            )
        elif kind == zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL:
            self.refused = True
            self.failure = (
                f"the handshake with {leader} failed (ZeroMQ protocol error {value:#x}): "
                "one of the two serves plaintext, or the leader holds another key than "
                "it registered"
            )
        elif kind == zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL:
            self.failure = (
                f"{leader} broke the handshake off: does it serve the other security.mode?"
            )


@dataclass
class _Waiting:
    """A request sent, until its reply comes (`frames`) or it gives up."""

    done: trio.Event = field(default_factory=trio.Event)
    frames: list[Buffer] | None = None


@dataclass
class _Part:
    """A copy loop's fetch of one partition, until a MULTI_FETCH brings it something."""

    part: protocol.FetchPart
    high_watermark: int
    """The leader's high watermark as the copy loop last heard it."""
    done: trio.Event = field(default_factory=trio.Event)
    reply: protocol.FetchReply | PylogError | None = None
    abandoned: bool = False
    """Its copy loop stopped waiting (cancelled): it is sent no more."""


class Fetcher:
    """The connection of replica `me` to `leader`, on `socket` (connected, with its monitor
    `handshakes`), shared by the copy loops of every partition followed from it."""

    def __init__(
        self,
        me: int,
        leader: Source,
        socket: zmq.Socket[bytes],
        handshakes: _Handshakes,
        nursery: trio.Nursery,
        idle_wait_max_ms: int,
    ) -> None:
        self.me = me
        self.leader = leader
        self._socket = socket
        self._handshakes = handshakes
        self._channel = TrioSocket(socket, receive_frames)
        self._ids = itertools.count(1)
        self._waiting: dict[int, _Waiting] = {}
        """Correlation id -> the request waiting for its reply."""
        self._nursery = nursery
        self._parts: list[_Part] = []
        """The fetches asked for in this turn, to leave together (`_send_parts`)."""
        self.idle_wait_max_ms = idle_wait_max_ms
        self._idle_rounds = 0
        """MULTI_FETCHes in a row whose answers all brought nothing new (`_waits`)."""
        self.sessions = True
        """Whether the leader speaks MULTI_FETCH version 2 (fetch sessions)."""
        self._session_id = 0
        self._session_epoch = 0
        self._had: dict[Key, tuple[protocol.FetchPart, int]] = {}
        """The session's partitions as its last fetch left them: each one's part, and the high
        watermark its copy loop had heard."""
        self._in_flight = False
        """Whether a fetch of the session is in flight: fetches asked for meanwhile wait for
        its answer, or go at once on their own (`_queue`)."""
        self._sent: dict[Key, tuple[protocol.FetchPart, int]] = {}
        """Each partition's fetch as last sent, in the session or on its own."""
        self._sending = False
        """Whether the session's sending task runs (`_send_parts`)."""
        self._copying: set[Key] = set()
        """Partitions handed bytes by the session's last fetch whose copy loops have not asked
        again yet (copying and flushing them): its next fetch waits for them a while."""
        self._copied = trio.Event()
        """Set when `_copying` empties."""
        self._own: list[_Part] = []
        """Changed fetches asked for in this turn while the session's fetch is in flight, to
        leave on their own (`_send_own`)."""
        self.users = 0
        """The copy loops using this fetcher (Fetchers)."""
        self.scope = trio.CancelScope()
        """The receiving task's: cancelled when the last user is gone, which closes the
        socket."""

    @property
    def refused(self) -> bool:
        """Whether the leader refused this socket's handshake (or it failed ZeroMQ's protocol):
        libzmq never connects it again, so its requests fail at once (Fetchers.acquire
        connects a new one)."""
        return self._handshakes.refused

    async def receive(self) -> None:
        """Hand each reply to the request waiting for it, and watch the handshakes, until
        cancelled; then close the socket."""
        try:
            with self.scope:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(self._watch_handshakes)
                    await self._receive_replies()
        finally:
            close_monitored(self._socket, self._handshakes.monitor)

    async def _receive_replies(self) -> None:
        while True:
            frames: list[Buffer] = [f.buffer for f in await self._channel.receive()]
            try:
                correlation_id = protocol.decode_reply_header(frames).correlation_id
            except MalformedReply as error:
                log.warning("%s: a reply with no header read: %s", self.leader, error)
                continue
            waiting = self._waiting.pop(correlation_id, None)
            if waiting is not None:  # None: the request gave up waiting for it
                waiting.frames = frames
                waiting.done.set()

    async def _watch_handshakes(self) -> None:
        """Take the monitor's events until the socket is refused, then end every request
        waiting: none of them can be answered."""
        monitor = TrioSocket(self._handshakes.monitor, receive_frames)
        while not self._handshakes.refused:
            self._handshakes.take([f.buffer for f in await monitor.receive()])
        for waiting in self._waiting.values():
            waiting.done.set()

    async def request(
        self, request: protocol.Request, version: int, wait_s: float, what: str
    ) -> protocol.Reply:
        """Send `request` (`what`, for errors) to the leader and return its reply (raising its
        error); PartitionUnavailable when none comes within `wait_s` (sending included), or
        at once when the leader refused this socket, with why the handshake failed if it
        did."""
        correlation_id = next(self._ids) % (1 << 32)
        header = protocol.RequestHeader(request.api, version, correlation_id, f"replica-{self.me}")
        waiting = self._waiting[correlation_id] = _Waiting()
        try:
            with trio.move_on_after(wait_s):
                if not self.refused:  # a refused socket takes no message: a send would wait
                    await self._channel.send(protocol.encode_request(header, request))
                    await waiting.done.wait()
        finally:
            self._waiting.pop(correlation_id, None)
        if waiting.frames is None:
            failure = self._handshakes.failure
            if self.refused:
                raise PartitionUnavailable(f"{what}: {failure}")
            cause = f": {failure}" if failure else ""
            raise PartitionUnavailable(
                f"{what}: no reply from {self.leader} within {wait_s:g} s{cause}"
            )
        return protocol.decode_reply(request.api, waiting.frames, version)

    async def fetch(
        self, part: protocol.FetchPart, high_watermark: int, wait_ms: int, wait_s: float
    ) -> protocol.FetchReply:
        """A follower's fetch of one partition (`part`), long polling up to `wait_ms`, the
        leader's high watermark last heard `high_watermark`: its answer (raising its error).
        It goes with every other fetch asked for in this turn as one MULTI_FETCH; an answer
        that brings nothing new (no bytes, the same high watermark) is not handed back, the
        part goes again in the next MULTI_FETCH, so that a partition followed idle costs its
        copy loop nothing. PartitionUnavailable when a MULTI_FETCH it went in gets no reply
        within `wait_s`."""
        waiting = _Part(part, high_watermark)
        self._queue(waiting, wait_ms, wait_s)
        try:
            await waiting.done.wait()
        finally:
            waiting.abandoned = not waiting.done.is_set()
        reply = waiting.reply
        assert reply is not None
        if isinstance(reply, PylogError):
            raise reply
        return reply

    def _queue(self, waiting: _Part, wait_ms: int, wait_s: float) -> None:
        """Queue a fetch for the next MULTI_FETCH. In a session, one fetch of it is in flight
        at a time; a fetch asked for meanwhile that changed since it was last sent (a copy
        loop that copied bytes: its new position moves the leader's high watermark, for the
        producers' acks) goes at once on its own, without a session (`_send_own`); an
        unchanged one waits for the session's next fetch."""
        if not self.sessions:
            if not self._parts:
                self._nursery.start_soon(self._send_parts, wait_ms, wait_s)  # once this turn ends
            self._parts.append(waiting)
            return
        key = (waiting.part.topic, waiting.part.partition)
        if key in self._copying:
            self._copying.discard(key)
            if not self._copying:
                self._copied.set()
        if self._in_flight and self._sent.get(key) != (waiting.part, waiting.high_watermark):
            if not self._own:
                self._nursery.start_soon(self._send_own, wait_ms, wait_s)
            self._own.append(waiting)
            return
        self._parts.append(waiting)
        if not self._sending:
            self._sending = True
            self._nursery.start_soon(self._send_parts, wait_ms, wait_s)

    async def _send_parts(self, wait_ms: int, wait_s: float) -> None:
        """Send the fetches asked for since the last call as one MULTI_FETCH of the fetch
        session (`_session_fetch`), and hand each its part's answer (`_hand`); in a session,
        again while fetches were asked for meanwhile, one in flight at a time."""
        try:
            while True:
                # Two steps of the scheduler first: copy loops woken by the last answers (run
                # in the step after) that ask again at once queue their next fetches.
                await trio.lowlevel.cancel_shielded_checkpoint()
                await trio.lowlevel.cancel_shielded_checkpoint()
                parts = [waiting for waiting in self._parts if not waiting.abandoned]
                self._parts = []
                if not parts:
                    return
                in_session = self._in_flight = self.sessions
                try:
                    answers = await self._fetch_session(parts, wait_ms, wait_s)
                finally:
                    self._in_flight = False
                handed, copying = self._hand(parts, answers, wait_ms, wait_s)
                self._idle_rounds = 0 if handed else self._idle_rounds + 1
                if not in_session:
                    return  # the next turn's fetches start another (_queue)
                await self._wait_copies(copying)
        finally:
            self._sending = False

    async def _wait_copies(self, copying: set[Key]) -> None:
        """Wait, up to COPY_WAIT_S, for the copy loops handed bytes (`copying`) to copy and
        flush them and ask again, so that the session's next fetch names their new positions
        (the leader's high watermark, and the producers' acks, move with them) rather than
        forget them. One that asks later goes on its own (`_queue`)."""
        if copying:
            self._copying, self._copied = copying, trio.Event()
            with trio.move_on_after(COPY_WAIT_S):
                await self._copied.wait()
            self._copying = set()

    async def _fetch_session(
        self, parts: list[_Part], wait_ms: int, wait_s: float
    ) -> dict[Key, protocol.FetchReply | PylogError]:
        """The answers to the MULTI_FETCH of `parts` in the session (`_session_fetch`), by
        partition: each part's, or the request's error for every part (a session the leader
        does not hold, or an epoch out of turn: none, and the next fetch begins a new one)."""
        poll_ms, poll_s = self._waits(wait_ms, wait_s)
        request = self._session_fetch(parts, poll_ms)
        for p in parts:
            self._sent[(p.part.topic, p.part.partition)] = (p.part, p.high_watermark)
        try:
            version = SESSION_FETCH_VERSION if self.sessions else 1
            reply = await self.request(
                request, version, poll_s, f"MULTI_FETCH of {len(parts)} partitions"
            )
            assert isinstance(reply, protocol.MultiFetchReply)
            answers = self._answers(reply)
            if not reply.session_id and len(answers) != len(parts):
                raise MalformedReply(f"{len(reply.parts)} parts answer {len(parts)}")
            self._in_session(request, reply.session_id, parts)
            return answers
        except (FetchSessionIdNotFound, InvalidFetchSessionEpoch) as error:
            log.info("%s: %s", self.leader, error)  # every part asked again, in a new session
            self._session_id = 0
        except UnsupportedVersion:  # a leader of before fetch sessions
            self.sessions, self._session_id = False, 0
        except (PylogError, zmq.ZMQError) as error:
            self._session_id = 0  # the leader may have taken this epoch, or gone
            return self._failed(parts, error)
        return {}

    async def _send_own(self, wait_ms: int, wait_s: float) -> None:
        """Send the changed fetches asked for while the session's fetch was in flight as one
        MULTI_FETCH without a session (a long poll of `wait_ms`), and hand each its answer:
        those answered with nothing new join the session's next fetch."""
        parts = [waiting for waiting in self._own if not waiting.abandoned]
        self._own = []
        if not parts:
            return
        max_bytes = max(1, sum(p.part.max_bytes for p in parts))
        fetched = tuple(p.part for p in parts)
        request = protocol.MultiFetchRequest(self.me, wait_ms, 1, max_bytes, fetched)
        for p in parts:
            self._sent[(p.part.topic, p.part.partition)] = (p.part, p.high_watermark)
        try:
            what = f"MULTI_FETCH of {len(parts)} partitions"
            reply = await self.request(request, 1, wait_s, what)
            assert isinstance(reply, protocol.MultiFetchReply)
            answers = self._answers(reply)
            if len(answers) != len(parts):
                raise MalformedReply(f"{len(reply.parts)} parts answer {len(parts)}")
        except (PylogError, zmq.ZMQError) as error:
            answers = self._failed(parts, error)
        self._hand(parts, answers, wait_ms, wait_s)

    @staticmethod
    def _answers(reply: protocol.MultiFetchReply) -> dict[Key, protocol.FetchReply | PylogError]:
        answers: dict[Key, protocol.FetchReply | PylogError] = {}
        for part_reply in reply.parts:
            key = (part_reply.topic, part_reply.partition)
            try:
                answers[key] = protocol.decode_fetch_part(part_reply)
            except PylogError as error:
                answers[key] = error
        return answers

    @staticmethod
    def _failed(
        parts: list[_Part], error: PylogError | zmq.ZMQError
    ) -> dict[Key, protocol.FetchReply | PylogError]:
        failed = error if isinstance(error, PylogError) else PartitionUnavailable(str(error))
        return {(w.part.topic, w.part.partition): failed for w in parts}

    def _hand(
        self,
        parts: list[_Part],
        answers: dict[Key, protocol.FetchReply | PylogError],
        wait_ms: int,
        wait_s: float,
    ) -> tuple[bool, set[Key]]:
        """Hand each of `parts` its answer, or queue it again when its answer brings nothing
        new (or none came: a session's partition without news); whether any was handed one,
        and the partitions handed bytes (their copy loops copy them)."""
        handed = False
        copying: set[Key] = set()
        for waiting in parts:
            if waiting.abandoned:
                continue
            answer = answers.get((waiting.part.topic, waiting.part.partition))
            if answer is None or (
                isinstance(answer, protocol.FetchReply)
                and not len(answer.message_set)
                and answer.high_watermark == waiting.high_watermark
            ):
                self._queue(waiting, wait_ms, wait_s)  # nothing new: asked again as it was
                continue
            handed = True
            if isinstance(answer, protocol.FetchReply) and len(answer.message_set):
                copying.add((waiting.part.topic, waiting.part.partition))
            waiting.reply = answer
            waiting.done.set()
        return handed, copying

    def _session_fetch(self, parts: list[_Part], poll_ms: int) -> protocol.MultiFetchRequest:
        """The MULTI_FETCH of `parts` (docs/protocol.md, MULTI_FETCH version 2): with no
        session, every part, beginning one; in the session, the parts whose fetch (or high
        watermark heard) changed since the session last had them, and the partitions it had
        that are no longer fetched, forgotten."""
        max_bytes = max(1, sum(p.part.max_bytes for p in parts))
        if not self.sessions:
            return protocol.MultiFetchRequest(
                self.me, poll_ms, 1, max_bytes, tuple(p.part for p in parts)
            )
        if not self._session_id:
            return protocol.MultiFetchRequest(
                self.me, poll_ms, 1, max_bytes, tuple(p.part for p in parts), 0, 0
            )
        fetched = {(p.part.topic, p.part.partition): p for p in parts}
        changed = tuple(
            p.part for key, p in fetched.items() if self._had.get(key) != (p.part, p.high_watermark)
        )
        forgotten = tuple(
            protocol.SessionPartition(*key) for key in self._had if key not in fetched
        )
        for gone in forgotten:
            self._sent.pop((gone.topic, gone.partition), None)  # asked again: sent as changed
        epoch = self._session_epoch + 1
        return protocol.MultiFetchRequest(
            self.me, poll_ms, 1, max_bytes, changed, self._session_id, epoch, forgotten
        )

    def _in_session(
        self, request: protocol.MultiFetchRequest, session_id: int, parts: list[_Part]
    ) -> None:
        """After a reply saying `session_id` (0: none, the leader split the fetch): what the
        session now has, for its next fetch."""
        self._session_id = session_id if self.sessions else 0
        self._session_epoch = max(0, request.session_epoch)
        self._had = {(p.part.topic, p.part.partition): (p.part, p.high_watermark) for p in parts}

    def _waits(self, wait_ms: int, wait_s: float) -> tuple[int, float]:
        """The long poll of the next MULTI_FETCH, and how long its reply is waited for: the
        copy loops' `wait_ms` (replica_fetch_wait_ms), doubled for each round in a row that
        brought nothing new, up to `idle_wait_max_ms`. New data ends a long poll whatever its
        wait, so a longer one costs no latency; it only spares an idle leader the work a part
        a round (reading, answering, and here decoding a part for every partition followed)."""
        longer = min(wait_ms << min(self._idle_rounds, 16), max(wait_ms, self.idle_wait_max_ms))
        return longer, wait_s + (longer - wait_ms) / 1000


class Fetchers:
    """The fetchers of replica `me`'s worker, one per leader, made in `context`, with their
    receiving tasks in `nursery`, their idle long polls up to `idle_wait_max_ms`
    (Fetcher._waits); `keys` reads this broker's keys among brokers (curve mode), None in
    plaintext."""

    def __init__(
        self,
        me: int,
        context: zmq.Context[zmq.Socket[bytes]],
        nursery: trio.Nursery,
        idle_wait_max_ms: int,
        keys: Callable[[], BrokerKeys | None] = lambda: None,
    ) -> None:
        self.me = me
        self.idle_wait_max_ms = idle_wait_max_ms
        self.context = context
        self.nursery = nursery
        self._keys = keys
        self._fetchers: dict[Source, Fetcher] = {}

    def __len__(self) -> int:
        return len(self._fetchers)

    def acquire(self, leader: Source) -> Fetcher:
        """The fetcher of `leader`, connected on first use and again after the leader refused
        it (KeyFileError, nothing connected, when this broker's keys cannot be read or the
        leader's registered key is none of the cluster's); give it back with `release`. A
        refused fetcher closes when the last copy loop holding it gives it back."""
        fetcher = self._fetchers.get(leader)
        if fetcher is None or fetcher.refused:
            fetcher = self._fetchers[leader] = self._connect(leader)
            self.nursery.start_soon(fetcher.receive)
        fetcher.users += 1
        return fetcher

    def release(self, fetcher: Fetcher) -> None:
        """A copy loop done with `fetcher`: the last one closes it."""
        fetcher.users -= 1
        if fetcher.users == 0:
            if self._fetchers.get(fetcher.leader) is fetcher:  # not replaced (refused)
                del self._fetchers[fetcher.leader]
            fetcher.scope.cancel()

    def _connect(self, leader: Source) -> Fetcher:
        """A DEALER connected to the leader's front: a Curve client with this broker's keys in
        curve mode, plaintext else; with its handshakes' monitor."""
        keys = self._keys()
        client_keys = None
        if keys is not None:
            client_keys = keys.to_leader(None if leader.key is None else leader.key.encode())
        socket = self.context.socket(zmq.DEALER)
        socket.setsockopt(zmq.LINGER, 0)
        if client_keys is not None:
            client_keys.apply(socket)
        handshakes = _Handshakes(socket, leader)  # before connecting: no event missed
        socket.connect(leader.endpoint)
        return Fetcher(self.me, leader, socket, handshakes, self.nursery, self.idle_wait_max_ms)
