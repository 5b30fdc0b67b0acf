"""The front: the routing loop between clients and workers, the one hop every request takes.

    clients --tcp--> front ROUTER --(route by topic, partition)--> DEALER --ipc--> worker N

The front binds the ROUTER socket clients talk to. It reads only a request's header and the
start of its body (KnownPrefixes.route) and forwards the request frame as it came, behind the
ROUTER's identity (tagged, see broker.transport), to the worker that holds the partition
(broker.topics says which); replies come back the same way. It answers METADATA from the
topics' view, and hands CREATE_TOPIC and DELETE_TOPIC to topic management, which answers them
later through `answers`. This loop is plain blocking pyzmq with a poller: the same hop on the
trio adapter runs at two thirds of the rate (perf/README.md, bench_broker.py).

Nothing on this loop waits on ZooKeeper, a disk or a worker: the pool and topic management
never call into the front, they put the replies they owe in `answers`, which the front sends
at the end of every turn (`poll_once`).
"""

from __future__ import annotations

import dataclasses
import errno
import logging
from collections.abc import Callable, Sequence
from typing import Final

import zmq

from broker import control, protocol
from broker.config import BrokerConfig
from broker.errors import (
    AuthorizationFailed,
    BrokerShuttingDown,
    FetchSessionIdNotFound,
    PartitionUnavailable,
    PylogError,
    RepliesNotRead,
    UnsupportedApi,
)
from broker.fetch_joins import FetchJoins
from broker.groups.service import Coordinator, GroupRequest, GroupStatistics
from broker.joins import JOINED, Joins
from broker.log.message import Buffer
from broker.pool import Answers, WorkerHandle, WorkerPool
from broker.processes import port_holder
from broker.quotas import Direction, Kind, QuotaStatistics, Throttle
from broker.replies import HeldReplies
from broker.security import Authorizer, HandshakeFailures, Operation, Principals, ZapHandler
from broker.security.monitor import close_monitored
from broker.topics import Topics
from broker.transport import (
    CREDIT,
    FETCH_JOINED,
    REPLIES,
    STATE,
    connection_of,
    reply_envelope,
    session_worker,
    tagged_identity,
    throttle_of,
    throttled,
)
from broker.zmqio import NOBLOCK, monitor_event, receive_routed, send_frames, source_fd

log = logging.getLogger("pylog.supervisor")

TICK_MS = 100
"""The longest a turn of the loop waits for a message before its housekeeping."""
DRAINED_AT_ONCE = 256
"""The messages read from one socket in a turn: so the other sockets and housekeeping get one."""
OPERATIONS: Final[dict[int, Operation]] = {
    protocol.Api.PRODUCE: Operation.PRODUCE,
    protocol.Api.MULTI_PRODUCE: Operation.PRODUCE,
    protocol.Api.MULTI_FETCH: Operation.FETCH,
    protocol.Api.FETCH: Operation.FETCH,
    protocol.Api.OFFSET_FOR_LEADER_EPOCH: Operation.FETCH,
    protocol.Api.OFFSETS: Operation.DESCRIBE,
    protocol.Api.DESCRIBE_PARTITION: Operation.DESCRIBE,
    protocol.Api.METADATA: Operation.DESCRIBE,
    protocol.Api.DESCRIBE_CONFIG: Operation.DESCRIBE,
    protocol.Api.CREATE_TOPIC: Operation.CREATE,
    protocol.Api.DELETE_TOPIC: Operation.DELETE,
    protocol.Api.ALTER_CONFIG: Operation.ALTER,
    protocol.Api.CREATE_PARTITIONS: Operation.ALTER,
}
"""The ACL operation each api needs on its topic (DESCRIBE_CLUSTER needs none: any principal
let in may ask it; docs/security.md)."""


@dataclasses.dataclass(frozen=True, slots=True)
class SecurityStatistics:
    """Security's figures (broker.metrics), in security.mode curve: handshakes the ZAP handler
    let in and refused, those that failed before it was asked (by reason), and requests
    answered AUTHORIZATION_FAILED."""

    accepted: int
    refused: int
    handshakes_failed: tuple[tuple[str, int], ...]
    authorization_failures: int


@dataclasses.dataclass(frozen=True, slots=True)
class FrontStatistics:
    """The front's figures (broker.metrics): requests read, pauses of reading, the replies
    held for clients (HeldReplies), the quotas', security's (None: plaintext), and the group
    coordinator's."""

    requests: int
    read_pauses: int
    queued_reply_bytes: int
    muted_connections: int
    parked_requests: int
    replies_refused: int
    quotas: QuotaStatistics
    security: SecurityStatistics | None
    groups: GroupStatistics


class Front:
    """The ROUTER socket clients talk to, and the loop that routes their requests."""

    def __init__(
        self,
        config: BrokerConfig,
        context: zmq.Context[zmq.Socket[bytes]],
        poller: zmq.Poller,
        pool: WorkerPool,
        topics: Topics,
        groups: Coordinator,
        answers: Answers,
    ) -> None:
        self.config = config
        self.poller = poller
        self.pool = pool
        self.topics = topics
        self.groups = groups
        self.answers = answers
        self.port = int(config.broker_port)
        self.socket = context.socket(zmq.ROUTER)
        self.socket.setsockopt(zmq.LINGER, 1000)
        self.socket.setsockopt(zmq.ROUTER_MANDATORY, 0)
        self.socket.setsockopt(zmq.RCVHWM, config.broker_queued_requests_per_client)
        self.socket.setsockopt(zmq.SNDHWM, config.broker_queued_replies_per_client)
        self.stopping = False
        """Set on shutdown: new requests are answered BROKER_SHUTTING_DOWN."""
        self.managed: set[tuple[bytes, int]] = set()
        """The requests handed to topic or group management and not answered yet (tagged
        identity, correlation id): answered once ZooKeeper has answered, or at shutdown
        BROKER_SHUTTING_DOWN (`drain`)."""
        self.queue_limit = int(config.broker_queued_request_bytes)
        self.held = HeldReplies(
            config.broker_queued_reply_bytes,
            config.broker_queued_reply_bytes_per_client,
            config.broker_queued_requests_per_client,
        )
        """The bytes of replies ZeroMQ holds for clients, and the connections muted for them."""
        self.throttle = Throttle(config.broker_queued_requests_per_client, self.queue_limit)
        self.prefixes = protocol.KnownPrefixes()
        """The prefixes of routed requests found good: the next ones are routed unread."""
        """The quotas (broker.quotas): the requests of clients over theirs wait here."""
        self.opened = False
        self.reading = False
        """Whether the loop reads clients' requests: from `open()` on, while the workers owe
        less than queue_limit bytes of them."""
        self.requests = 0
        """Requests read from clients (broker.metrics)."""
        self.read_pauses = 0
        """Times the loop stopped reading requests (broker.metrics)."""
        self.authorizer: Authorizer | None = None
        """Set by `secure`: every request is then checked against the ACLs."""
        self.principals: Principals | None = None
        """Set by `secure`: whose key each request's connection holds, looked up per request
        (a key removed stops its open connections at their next request)."""
        self.handshake_failures: HandshakeFailures | None = None
        self.zap: ZapHandler | None = None
        self.monitor: zmq.Socket[bytes] | None = None
        """The front socket's monitor, from `bind` on: connections closed (the requests a
        quota held for them dropped), and in curve mode handshakes failed."""
        self.joins = Joins()
        """The MULTI_PRODUCE requests whose parts the workers have not all answered."""
        self.fetch_joins = FetchJoins()
        """The MULTI_FETCH requests split over workers whose shares are not all answered."""
        self._restarts_seen = 0
        """The pool's restarts when `joins` were last checked for parts a worker took with it."""
        poller.register(topics.calls.wake_fd, zmq.POLLIN)
        """Registry calls' results wake the loop (applied by Topics.tick at the turn's end)."""
        self._handlers: dict[zmq.Socket[bytes], Callable[[list[bytes]], None]] = {}
        """The sockets this loop reads besides clients' and workers' (the monitor, and the ZAP
        handler's in curve mode), and what takes each message of theirs."""

    def secure(self, secret_key: bytes, zap: ZapHandler, authorizer: Authorizer) -> None:
        """Make the front socket a CurveZMQ server with the broker's `secret_key` (before
        `bind`): every connection is authenticated by `zap` and every request authorized by
        `authorizer`; handshakes that fail before ZAP are counted (HandshakeFailures). Both
        sockets are read on this loop."""
        self.socket.setsockopt(zmq.CURVE_SERVER, 1)
        self.socket.setsockopt(zmq.CURVE_SECRETKEY, secret_key)
        self.socket.setsockopt(zmq.ZAP_DOMAIN, b"pylog")
        # Without a ZAP handler bound, libzmq would let every key in; with this it refuses.
        self.socket.setsockopt(zmq.ZAP_ENFORCE_DOMAIN, 1)
        self.zap = zap
        self.principals = zap.principals
        self.handshake_failures = HandshakeFailures()
        self.authorizer = authorizer
        self._handlers[zap.socket] = zap.take
        self.poller.register(zap.socket, zmq.POLLIN)

    def statistics(self) -> FrontStatistics:
        """The front's figures now (read by the metrics thread)."""
        held = self.held
        return FrontStatistics(
            self.requests,
            self.read_pauses,
            held.held_bytes,
            held.muted_connections,
            held.parked_requests,
            held.replies_refused,
            self.throttle.statistics(),
            self._security_statistics(),
            self.groups.statistics(),
        )

    def _security_statistics(self) -> SecurityStatistics | None:
        zap, authorizer, failures = self.zap, self.authorizer, self.handshake_failures
        if zap is None or authorizer is None or failures is None:
            return None
        failed = tuple(sorted(failures.failed.items()))
        return SecurityStatistics(zap.accepted, zap.refused, failed, authorizer.denied)

    def bind(self) -> None:
        """Listen on broker.host:broker.port (a free port if 0), the socket's monitor made
        first (no event missed: `_from_monitor`); OSError naming the process that holds the
        port if it is in use."""
        events = zmq.EVENT_DISCONNECTED
        if self.handshake_failures is not None:
            events |= HandshakeFailures.EVENTS
        self.monitor = self.socket.get_monitor_socket(events)
        self._handlers[self.monitor] = self._from_monitor
        self.poller.register(self.monitor, zmq.POLLIN)
        host = self.config.broker_host
        try:
            if self.port == 0:
                self.port = self.socket.bind_to_random_port(f"tcp://{host}")
            else:
                self.socket.bind(f"tcp://{host}:{self.port}")
        except zmq.ZMQError as error:
            reason = str(error)
            if error.errno == errno.EADDRINUSE:
                reason = f"port {self.port} is already in use by {port_holder(self.port)}"
            raise OSError(f"cannot listen on {host}:{self.port}: {reason}") from error

    def _from_monitor(self, frames: list[bytes]) -> None:
        """An event of the front socket's monitor: a TCP connection closed (the requests held
        for it, by its quota or while it did not read its replies, dropped), or a Curve
        handshake failed (counted)."""
        event, value = monitor_event(frames)
        if event == zmq.EVENT_DISCONNECTED:
            dropped = self.throttle.closed(value) + self.held.closed(value)
            if dropped:
                log.info("a connection closed: %d requests held for it dropped", dropped)
        elif self.handshake_failures is not None:
            self.handshake_failures.take(event, value)

    def take_limits(self) -> None:
        """The ceilings of flow control as the config has them now (live settings)."""
        config = self.config
        self.queue_limit = self.throttle.held_ceiling = int(config.broker_queued_request_bytes)
        self.held.ceiling = config.broker_queued_reply_bytes
        self.held.per_client = config.broker_queued_reply_bytes_per_client

    def open(self) -> None:
        """Start reading clients' requests (until now a turn reads only the workers)."""
        self.poller.register(self.socket, zmq.POLLIN)
        self.opened = self.reading = True

    def poll_once(self) -> None:
        """One turn: serve what the sockets hold (a bounded amount of each), let the topics and
        the pool do their housekeeping, then send the replies they owe."""
        self._pace()
        for sock, _ in self.poller.poll(self.throttle.timeout_ms(TICK_MS)):
            if isinstance(sock, int):  # the registry calls' wake_fd: applied below
                continue
            take = self._handlers.get(sock)
            if take is not None:  # bounded too: a flood of handshakes holds up nothing
                for _ in range(DRAINED_AT_ONCE):
                    try:
                        message = sock.recv_multipart(NOBLOCK)
                    except zmq.Again:
                        break
                    take(message)
                continue
            worker = self.pool.by_socket(sock)
            for _ in range(DRAINED_AT_ONCE):
                try:
                    first, rest = receive_routed(sock, NOBLOCK)
                except zmq.Again:
                    break
                if worker is not None:
                    self._from_worker(worker, first, rest)
                    continue
                self._from_client(first, rest)
                if not self._room():
                    break  # the workers owe enough: no more requests until they serve them
            if worker is None:
                self.pool.flush_all()
        resumed = False
        for tagged, frames in self.held.release(self._room):  # of unmuted connections
            self._serve(tagged, *tagged_identity(tagged[1:], frames)[1:], frames)
            resumed = True
        for tagged, frames, arrived in self.throttle.due():  # held back for a quota
            self._serve(tagged, *tagged_identity(tagged[1:], frames)[1:], frames, arrived)
            resumed = True
        if resumed:  # sent now, not with the next client's request
            self.pool.flush_all()
        self.topics.tick()
        if self.topics.calls.registry is not None:
            self.groups.tick()
        self.pool.check()
        if self.pool.restarts != self._restarts_seen:
            self._restarts_seen = self.pool.restarts
            running = {w.index: w.restarts for w in self.pool.workers if w.connected}
            if self.joins:
                self.joins.worker_gone(running)
            if self.fetch_joins:
                self.fetch_joins.worker_gone(running)
        self._send_answers()

    def _room(self) -> bool:
        """Whether the workers owe less than queue_limit bytes of requests."""
        return self.pool.queued_bytes < self.queue_limit

    def _pace(self) -> None:
        """Read clients' requests only while the workers owe less than queue_limit bytes of
        them: what is not read waits in ZeroMQ and TCP, and blocks the senders."""
        reading = self._room()
        if reading != self.reading and self.opened:
            self.poller.register(self.socket, zmq.POLLIN if reading else 0)  # 0: unregister
            self.reading = reading
            self.read_pauses += not reading

    def drain(self) -> None:
        """On shutdown: forward the replies workers sent before they exited, and answer the
        requests still waiting for ZooKeeper (topic and group management) BROKER_SHUTTING_DOWN,
        not left to their clients' timeouts (nothing answers them once the loop ends)."""
        for worker, first, rest in self.pool.drained():
            self._from_worker(worker, first, rest)
        self._send_answers()
        stopped = BrokerShuttingDown("the broker shut down before ZooKeeper answered")
        for tagged, correlation_id in sorted(self.managed):
            self._answer(tagged, protocol.encode_error(correlation_id, stopped))
        self.managed.clear()

    def close(self) -> None:
        """Close the front socket (with its linger: replies still queued go out), and its
        monitor in curve mode."""
        if self.socket.closed:
            return
        if self.monitor is None:
            self.socket.close()
        else:
            close_monitored(self.socket, self.monitor)

    def _send_answers(self) -> None:
        """Send the replies the pool and topic management owe (a part's, to its join), then
        those of the MULTI_PRODUCE and MULTI_FETCH requests whose parts are all answered."""
        while self.answers:
            tagged, frames = self.answers.popleft()
            if tagged[:1] == JOINED:
                self.joins.answered(tagged, frames[0])
            elif tagged[:1] == FETCH_JOINED:
                self._share_answered(tagged, frames[0])
            else:
                if self.managed:
                    self._settle(tagged, frames)
                self._answer(tagged, frames)
        for tagged, frames in self.joins.take_done():
            self._answer(tagged, frames)
        for tagged, frames, size in self.fetch_joins.take_done():
            if self.throttle.active:
                self.throttle.fetched(tagged, size)
            self._answer(tagged, frames)

    def _share_answered(self, tag: bytes, frame: Buffer) -> None:
        """A worker answered a MULTI_FETCH share: the workers of the request's other shares
        are asked to answer theirs now (broker.fetch_joins)."""
        for index in self.fetch_joins.answered(tag, frame):
            command = control.encode(control.WakeFetch(tag.hex()))
            self.pool.send(self.pool.workers[index], command)

    def _from_worker(self, worker: WorkerHandle, first: bytes, rest: list[zmq.Frame]) -> None:
        if first == CREDIT:
            self.pool.credit(worker, int.from_bytes(rest[0].bytes, "big"))
        elif first == STATE:
            try:
                report = control.decode_report(rest[0].bytes)
            except ValueError as error:  # a bug: the two sides are one program
                log.error("worker %d: %s", worker.index, error)
                return
            if isinstance(report, control.StatsReport):  # for broker.metrics
                worker.stats = report.snapshot
            else:
                self.topics.worker_report(worker, report)
        elif first[:1] == REPLIES:  # one-frame replies, each behind its tagged identity
            for i in range(0, len(rest), 2):
                tagged = rest[i].bytes
                if tagged[:1] == JOINED:  # a part's: its join takes it
                    self.joins.answered(tagged, rest[i + 1].buffer)
                    continue
                send_frames(self.socket, [*reply_envelope(tagged), rest[i + 1]])
        elif first[:1] == JOINED:
            self.joins.answered(first, rest[0].buffer)
        elif first[:1] == FETCH_JOINED:
            self._share_answered(first, rest[0].buffer)
        else:  # a reply, behind the tagged identity of its client: forwarded as zmq.Frames,
            if len(rest) == 2 and self.throttle.active:  # a FETCH's: its messages count
                self.throttle.fetched(first, len(rest[1]))
            self._answer(first, rest)  # not copied

    def _from_client(self, identity: bytes, frames: list[zmq.Frame]) -> None:
        self.requests += 1
        tagged, request_frames = tagged_identity(identity, frames)
        if self.held.muted(tagged):  # it does not read its replies: its requests wait
            try:
                self.held.park(tagged, frames, source_fd(frames))
            except RepliesNotRead as error:
                self._refuse(tagged, request_frames, error)
            return
        self._serve(tagged, request_frames, frames)

    def _serve(
        self,
        tagged: bytes,
        request_frames: list[memoryview],
        frames: list[zmq.Frame],
        arrived: float | None = None,
    ) -> None:
        """Serve a request of connection `tagged`: route it to its worker, or answer it here.
        `arrived`: when it arrived, for one that a quota held back (Throttle.due)."""
        try:
            if self.stopping:
                raise BrokerShuttingDown("the broker is shutting down")
            if arrived is None and tagged in self.throttle.held:  # in order, behind those
                self.throttle.hold(tagged, frames, self.throttle.clock(), 0.0)
                return
            route = self.prefixes.route(request_frames)
            authorizer = self.authorizer
            principal = "" if self.principals is None else _principal(frames, self.principals)
            if route is not None:  # the hot path: forwarded as it came, nothing else read
                if authorizer is not None:
                    api = protocol.peek_api(request_frames)
                    authorizer.check(principal, OPERATIONS[api], route.topic)
                    if api == protocol.Api.FETCH and (replica := _replica_id(request_frames)) >= 0:
                        authorizer.check_replica(principal, route.topic, replica)
                if self.throttle.active:
                    admitted = self._admitted(tagged, request_frames, frames, principal, arrived)
                    if admitted is None:
                        return  # held back: served by a later turn
                    tagged = admitted
                self._route(tagged, request_frames[0], *route)
                return
            header, request = protocol.decode_request(request_frames)
            if isinstance(request, protocol.MultiProduceRequest | protocol.MultiFetchRequest):
                if self.throttle.active:
                    fetching = (
                        isinstance(request, protocol.MultiFetchRequest) and request.replica_id < 0
                    )
                    admitted = self._admitted(
                        tagged, request_frames, frames, principal, arrived, fetching
                    )
                    if admitted is None:
                        return  # held back: served by a later turn
                    tagged = admitted
                if isinstance(request, protocol.MultiProduceRequest):
                    self._multi_produce(tagged, header, request, request_frames, principal)
                else:
                    self._multi_fetch(tagged, header, request, request_frames, principal)
                return
            if isinstance(request, GROUP_REQUESTS):
                if authorizer is not None:
                    for operation, topic in _group_checks(request):
                        authorizer.check(principal, operation, topic)
                self._manage(tagged, header.correlation_id)
                self.groups.serve(request, tagged, header, _peer_address(frames))
                return  # answered once its group is loaded and its write landed
            if authorizer is not None and not isinstance(
                request, protocol.MetadataRequest | protocol.DescribeClusterRequest
            ):
                authorizer.check(principal, OPERATIONS[request.api], request.topic)
            if isinstance(request, protocol.MetadataRequest):
                metadata = self.topics.metadata(request.topics, self.port)
                if authorizer is not None:
                    metadata = _visible(metadata, authorizer, principal, bool(request.topics))
                reply: protocol.Reply = metadata
            elif isinstance(request, protocol.CreateTopicRequest):
                self._manage(tagged, header.correlation_id)
                self.topics.admin.create(request, tagged, header.correlation_id)
                return  # answered once every broker holding a partition serves it
            elif isinstance(request, protocol.DeleteTopicRequest):
                self._manage(tagged, header.correlation_id)
                self.topics.admin.delete(request.topic, tagged, header.correlation_id)
                return  # answered once ZooKeeper has deleted it
            elif isinstance(request, protocol.DescribeClusterRequest):
                reply = self.topics.describe_cluster(self.port)
            elif isinstance(request, protocol.DescribeConfigRequest):
                self._manage(tagged, header.correlation_id)
                self.topics.admin.describe_config(request.topic, tagged, header.correlation_id)
                return  # answered once read from ZooKeeper
            elif isinstance(request, protocol.AlterConfigRequest):
                self._manage(tagged, header.correlation_id)
                self.topics.admin.alter_config(request, tagged, header.correlation_id)
                return  # answered once ZooKeeper has it
            elif isinstance(request, protocol.CreatePartitionsRequest):
                self._manage(tagged, header.correlation_id)
                self.topics.admin.add_partitions(request, tagged, header.correlation_id)
                return  # answered once ZooKeeper has them
            else:
                raise UnsupportedApi(f"{type(request).__name__} is not served by the front")
            self._answer(
                tagged, protocol.encode_reply(header.correlation_id, reply, header.version)
            )
        except Exception as error:
            if not isinstance(error, PylogError):
                log.exception("unexpected error serving a request")
            self._refuse(tagged, request_frames, error)

    def _admitted(
        self,
        tagged: bytes,
        request_frames: list[memoryview],
        frames: list[zmq.Frame],
        principal: str,
        arrived: float | None,
        fetching: bool = False,
    ) -> bytes | None:
        """A routed request under the quotas: the tagged identity to send it to its worker
        with (saying how long it was held back, if it was), or None when its client is over
        its quota and the request is held back (Throttle.hold). PRODUCE counts its frame;
        a consumer's FETCH (or MULTI_FETCH: `fetching`) is held back by what its client's
        replies counted; a follower's FETCH and the other apis are neither."""
        api = protocol.peek_api(request_frames)
        if api == protocol.Api.PRODUCE or api == protocol.Api.MULTI_PRODUCE:
            direction, size = Direction.PRODUCE, len(request_frames[0])
        elif fetching or (api == protocol.Api.FETCH and _replica_id(request_frames) < 0):
            direction, size = Direction.FETCH, 0
        else:
            return tagged
        if self.principals is not None:
            client = (Kind.PRINCIPAL, principal)
        else:
            client = (Kind.CLIENT, protocol.peek_client_id(request_frames))
        throttle = self.throttle
        wait_s = throttle.admit(tagged, client, direction, size, arrived)
        if wait_s > 0:
            if arrived is None:
                throttle.hold(
                    tagged, frames, throttle.clock(), wait_s, client, fd=source_fd(frames)
                )
            else:  # from Throttle.due: its bytes were counted when it was first held
                throttle.hold(tagged, frames, arrived, wait_s, client, again=True)
            return None
        if arrived is None:
            return tagged
        return throttled(tagged, round((throttle.clock() - arrived) * 1000))

    def _multi_produce(
        self,
        tagged: bytes,
        header: protocol.RequestHeader,
        request: protocol.MultiProduceRequest,
        request_frames: list[memoryview],
        principal: str,
    ) -> None:
        """Split a MULTI_PRODUCE into one PRODUCE of version 3 a part, each routed to the worker
        holding its partition behind its join's tag (broker.joins); a part refused here (an ACL,
        an unknown partition, a worker restarting) is answered at once. With ack none nothing
        is joined: the parts go behind the client's tag, and none is answered."""
        join = None
        part_tag = tagged
        if request.ack is not protocol.Ack.NONE:
            part_tag, join = self.joins.open(
                tagged, header.correlation_id, request.parts, throttle_of(tagged)
            )
        version = protocol.PRODUCE_IDEMPOTENT_VERSION
        for index, part in enumerate(request.parts):
            try:
                if self.authorizer is not None:
                    self.authorizer.check(principal, Operation.PRODUCE, part.topic)
                worker = self._worker_for(part.topic, part.partition)
            except Exception as error:
                if not isinstance(error, PylogError):
                    log.exception("unexpected error routing a part of a MULTI_PRODUCE")
                if self.pool.errors.refused(request_frames, error) and join is not None:
                    self.joins.answer_error(join, index, error)
                continue
            (frame,) = protocol.encode_request(
                protocol.RequestHeader(protocol.Api.PRODUCE, version, index, header.client_id),
                protocol.ProduceRequest(
                    part.topic,
                    part.partition,
                    request.ack,
                    part.message_set,
                    request.producer_id,
                    request.producer_epoch,
                    part.sequence,
                ),
            )
            self.pool.queue(worker, part_tag, frame)
            if join is not None:
                self.joins.routed(join, index, worker.index, worker.restarts)

    def _multi_fetch(
        self,
        tagged: bytes,
        header: protocol.RequestHeader,
        request: protocol.MultiFetchRequest,
        request_frames: list[memoryview],
        principal: str,
    ) -> None:
        """Route a MULTI_FETCH: as it came to the worker that holds all its parts, else split
        into one share a worker (broker.fetch_joins), a part refused here (an ACL, an unknown
        partition, a worker restarting) answered by the front. A consumer's reply under a
        fetch quota is always joined here, so that its messages are counted."""
        authorizer = self.authorizer
        workers: list[WorkerHandle | Exception] = []
        if request.session_id:  # a session's next fetch: to the worker holding the session
            self._session_fetch(tagged, request, request_frames, principal)
            return
        for part in request.parts:
            try:
                if authorizer is not None:
                    authorizer.check(principal, Operation.FETCH, part.topic)
                    if request.replica_id >= 0:
                        authorizer.check_replica(principal, part.topic, request.replica_id)
                workers.append(self._worker_for(part.topic, part.partition))
            except Exception as error:
                if not isinstance(error, PylogError):
                    log.exception("unexpected error routing a part of a MULTI_FETCH")
                self.pool.errors.refused(request_frames, error)  # counted
                workers.append(error)
        first = workers[0]
        counted = self.throttle.active and request.replica_id < 0
        if isinstance(first, WorkerHandle) and not counted and all(w is first for w in workers):
            self.pool.queue(first, tagged, request_frames[0])
            return
        join = self.fetch_joins.open(
            tagged, header.correlation_id, request, throttle_of(tagged), header.version
        )
        for index, routed in enumerate(workers):
            if isinstance(routed, WorkerHandle):
                share = self.fetch_joins.share(join, routed.index, routed.restarts)
                share.indexes.append(index)
            else:
                self.fetch_joins.answer_error(join, index, routed)
        for number, (share, part_request) in enumerate(self.fetch_joins.requests(join)):
            (frame,) = protocol.encode_request(
                protocol.RequestHeader(protocol.Api.MULTI_FETCH, 1, number, header.client_id),
                part_request,
            )
            self.pool.queue(self.pool.workers[share.worker], self.fetch_joins.tag(join), frame)
        self.fetch_joins.close(join)

    def _session_fetch(
        self,
        tagged: bytes,
        request: protocol.MultiFetchRequest,
        request_frames: list[memoryview],
        principal: str,
    ) -> None:
        """Pass a fetch session's next MULTI_FETCH whole to the worker that holds the session
        (broker.transport.session_worker); FETCH_SESSION_ID_NOT_FOUND when it is not
        running, or a partition the fetch names lies elsewhere (the follower begins a new
        session, which the broker splits then: one without a session); the errors of a
        part's checks (an ACL, an unknown partition) for the whole request."""
        index = session_worker(request.session_id)
        if not 0 <= index < len(self.pool.workers) or not self.pool.workers[index].connected:
            raise FetchSessionIdNotFound(f"no fetch session {request.session_id} here")
        worker = self.pool.workers[index]
        for part in request.parts:
            if self.authorizer is not None:
                self.authorizer.check(principal, Operation.FETCH, part.topic)
                self.authorizer.check_replica(principal, part.topic, request.replica_id)
            if self._worker_for(part.topic, part.partition) is not worker:
                raise FetchSessionIdNotFound(
                    f"{part.topic}-{part.partition} is not with fetch session "
                    f"{request.session_id}'s partitions: begin a new session"
                )
        self.pool.queue(worker, tagged, request_frames[0])

    def _refuse(self, tagged: bytes, request_frames: list[memoryview], error: Exception) -> None:
        """Answer a request with `error` (counted; a PRODUCE with ack none gets no answer)."""
        if self.pool.errors.refused(request_frames, error):
            correlation_id = protocol.peek_correlation_id(request_frames)
            self.managed.discard((tagged, correlation_id))  # refused as management took it
            self._answer(tagged, protocol.encode_error(correlation_id, error))

    def _route(self, tagged: bytes, request: memoryview, topic: str, number: int) -> None:
        self.pool.queue(self._worker_for(topic, number), tagged, request)

    def _worker_for(self, topic: str, number: int) -> WorkerHandle:
        """The worker holding partition `number` of `topic`; PartitionUnavailable while it
        restarts (and the errors of Topics.route)."""
        worker = self.topics.route(topic, number)
        if not worker.connected:
            raise PartitionUnavailable(
                f"the worker for {topic}-{number} is restarting; retry shortly"
            )
        return worker

    def _manage(self, tagged: bytes, correlation_id: int) -> None:
        """A request handed to topic or group management: answered later (`managed`)."""
        self.managed.add((tagged, correlation_id))

    def _settle(self, tagged: bytes, frames: Sequence[Buffer]) -> None:
        """An answer owed by management (or the pool) is sent: its request waits no more."""
        self.managed.discard((tagged, protocol.decode_reply_header(frames).correlation_id))

    def _answer(self, tagged: bytes, frames: Sequence[Buffer | zmq.Frame]) -> None:
        """Send a reply, counted in `held` from broker.replies.TRACK_AT bytes on."""
        held = self.held.send(connection_of(tagged), frames)
        send_frames(self.socket, [*reply_envelope(tagged), *held])


_VERSION_AT: Final = 2
"""The request header's api_version: after api_key (docs/protocol.md)."""
_REPLICA_ID_FROM_END: Final = 16
"""FETCH version 2 ends with replica_id (int32), leader_epoch (int32) and flushed_offset
(uint64): replica_id starts this many bytes before the frame's end."""


GROUP_REQUESTS: Final = (
    protocol.GroupHeartbeatRequest,
    protocol.OffsetCommitRequest,
    protocol.OffsetFetchRequest,
    protocol.DescribeGroupRequest,
    protocol.ListGroupsRequest,
    protocol.DeleteGroupRequest,
)
"""The apis the group coordinator answers (broker.groups.service)."""


def _group_checks(
    request: GroupRequest | protocol.ListGroupsRequest,
) -> list[tuple[Operation, str]]:
    """What a group request needs in curve mode (docs/protocol.md, "Consumer groups"): `fetch`
    on each topic a member subscribes to or an OFFSET_COMMIT commits; `delete` on every topic
    (an ACL on `*`) to delete a group."""
    if isinstance(request, protocol.GroupHeartbeatRequest):
        return [(Operation.FETCH, topic) for topic in sorted(set(request.topics))]
    if isinstance(request, protocol.OffsetCommitRequest):
        return [(Operation.FETCH, topic) for topic in sorted({p.topic for p in request.parts})]
    if isinstance(request, protocol.DeleteGroupRequest):
        return [(Operation.DELETE, "*")]
    return []


def _peer_address(frames: list[zmq.Frame]) -> str:
    """The address a request came from (ZeroMQ's Peer-Address of its frame), "" if unknown."""
    try:
        return str(frames[-1].get("Peer-Address"))
    except zmq.ZMQError:
        return ""


def _replica_id(frames: list[memoryview]) -> int:
    """The replica_id of a FETCH request that KnownPrefixes.route routed (-1, a consumer's, before
    version 2), read from its place without decoding the request; a frame too short to hold
    one reads -1 (the worker's decoding refuses it)."""
    frame = frames[0]
    if int.from_bytes(frame[_VERSION_AT : _VERSION_AT + 2], "big") < 2 or len(frame) < 32:
        return -1
    at = len(frame) - _REPLICA_ID_FROM_END
    return int.from_bytes(frame[at : at + 4], "big", signed=True)


def _principal(frames: list[zmq.Frame], principals: Principals) -> str:
    """The principal whose key the request's connection holds: ZeroMQ's User-Id of the
    message, which the ZAP handler set to the client's key. AuthorizationFailed when that key
    is no principal's any more (removed since the connection was let in)."""
    try:
        key = str(frames[0].get("User-Id"))
    except zmq.ZMQError:  # not authenticated: cannot happen with ZAP_ENFORCE_DOMAIN
        key = ""
    principal = principals.principal(key)
    if principal is None:
        raise AuthorizationFailed(
            "", "", "", f"the connection's key {key or '(none)'} is no principal's (removed?)"
        )
    return principal


def _visible(
    reply: protocol.MetadataReply, authorizer: Authorizer, principal: str, asked: bool
) -> protocol.MetadataReply:
    """A METADATA reply as `principal` may see it: a topic it asked for and may not describe
    answers AUTHORIZATION_FAILED; when it asked for every topic, those are left out."""
    topics = []
    for info in reply.topics:
        if authorizer.allowed(principal, Operation.DESCRIBE, info.topic):
            topics.append(info)
        elif asked:
            authorizer.deny()
            code = protocol.ErrorCode.AUTHORIZATION_FAILED
            topics.append(protocol.TopicInfo(info.topic, code, ()))
    return dataclasses.replace(reply, topics=tuple(topics))
