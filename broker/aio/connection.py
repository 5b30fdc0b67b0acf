"""Connections to brokers on asyncio: pyzmq's zmq.asyncio sockets.

An `AsyncConnection` holds one DEALER socket to one broker: any number of requests in flight,
from any number of tasks, each matched to its reply by correlation id by a reader task of the
connection's own (docs/protocol.md, "Transport"). A reply that nobody waits for any more (it
came after its request's timeout, or its task was cancelled) is dropped. Frames are built and
read by broker.protocol, request framing and the retry rule are broker.client.framing's
(Framing, Retry), METADATA is read as broker.client.cluster reads it (BrokerMap).

Timeouts are the sync client's: a request waits `timeout_s` for its reply (a FETCH also its
max_wait_ms), then raises broker.errors.Unavailable. Cancelling a task that waits for a reply
(task.cancel(), asyncio.timeout) leaves the connection usable.

A task of the connection's own reads the socket's handshake events (its monitor, as
broker.client.transport's): once the Curve handshake fails (or, without keys, the broker turns
out to serve Curve), every request waiting raises broker.errors.AuthenticationFailed at once,
and the socket is dropped, so that the next request makes a new handshake. A connection refused
(nothing listens at the address) while requests wait fails them with
broker.errors.ConnectionRefused at once, and drops the socket too.

Not safe to share between event loops (or threads).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Sequence
from typing import overload

import zmq
import zmq.asyncio

from broker.client.cluster import (
    BrokerMap,
    Connections,
    PartitionRequest,
    Pause,
    advance,
    topic_partitions,
)
from broker.client.framing import DEFAULT_CLIENT_ID, Framing, Retry, noted
from broker.client.handshakes import Handshakes
from broker.client.transport import FIRE_AND_FORGET_LINGER_MS, terminate_unblocked
from broker.clock import SYSTEM_CLOCK
from broker.errors import (
    AuthenticationFailed,
    BrokerError,
    ConnectionRefused,
    MalformedReply,
    Unavailable,
)
from broker.log.message import Buffer
from broker.protocol import (
    Ack,
    DescribePartitionReply,
    DescribePartitionRequest,
    FetchReply,
    FetchRequest,
    MetadataReply,
    MetadataRequest,
    OffsetsReply,
    OffsetsRequest,
    PartitionInfo,
    ProduceReply,
    ProduceRequest,
    Reply,
    Request,
    decode_reply,
    decode_reply_header,
    request_version,
)
from broker.security import ClientKeys
from broker.security.monitor import CLIENT_EVENTS, close_monitored, monitor_handshakes

log = logging.getLogger(__name__)


class AsyncClientContext(zmq.asyncio.Context):
    """The ZeroMQ context of the asyncio clients: collected unclosed, it does not block
    (broker.client.connection.terminate_unblocked)."""

    def __del__(self) -> None:
        terminate_unblocked(self)


class AsyncConnection(Framing):
    """Requests to the broker at `endpoint` ("host:port" or "tcp://host:port"), any number at
    once. `context` defaults to one of the connection's own, terminated by `close()`. `keys`
    make its socket a CurveZMQ client of a broker serving Curve, as
    broker.client.Connection's."""

    def __init__(
        self,
        endpoint: str,
        client_id: str = DEFAULT_CLIENT_ID,
        timeout_s: float = 10.0,
        context: zmq.asyncio.Context | None = None,
        *,
        keys: ClientKeys | None = None,
    ) -> None:
        super().__init__(endpoint, client_id, timeout_s, keys)
        self._own_context = context is None
        self._context = AsyncClientContext() if context is None else context
        self._socket: zmq.asyncio.Socket | None = None
        self._reader: asyncio.Task[None] | None = None
        self._monitor: zmq.asyncio.Socket | None = None
        """The socket's handshake events (without keys, only a mechanism mismatch fails)."""
        self._watcher: asyncio.Task[None] | None = None
        self._waiting: dict[int, asyncio.Future[list[Buffer]]] = {}
        """Correlation id -> the future of its reply's frames."""
        self._closed = False

    def _dealer(self) -> zmq.asyncio.Socket:
        if self._closed:
            raise ValueError("the connection is closed")
        if self._socket is None:
            socket = self._context.socket(zmq.DEALER)
            monitor = None
            try:
                socket.setsockopt(zmq.LINGER, FIRE_AND_FORGET_LINGER_MS)
                if self.keys is not None:
                    self.keys.apply(socket)
                monitor = monitor_handshakes(socket, CLIENT_EVENTS)
                socket.connect(self.endpoint)
            except BaseException:
                if monitor is None:
                    socket.close(linger=0)
                else:
                    close_monitored(socket, monitor, linger_ms=0)
                raise
            loop = asyncio.get_running_loop()
            self._socket = socket
            self._reader = loop.create_task(self._read(socket))
            if monitor is not None:
                self._monitor = monitor
                self._watcher = loop.create_task(self._watch(monitor))
        return self._socket

    async def _watch(self, monitor: zmq.asyncio.Socket) -> None:
        """Once the socket's handshake fails, or a connection is refused while requests wait,
        drop the socket and fail every request waiting with AuthenticationFailed or
        ConnectionRefused. A request sent since the last handshake did not reach the broker;
        one sent on an earlier connection that broke (and reconnected into the refusal) may
        have, as for any request whose reply was lost. A refusal while none waits is
        forgotten: fire-and-forget requests stay queued until the broker is back."""
        handshakes = Handshakes(self.endpoint, curve=self.keys is not None)
        failure: AuthenticationFailed | ConnectionRefused | None = None
        while failure is None:
            handshakes.take(await monitor.recv_multipart())
            refused = handshakes.take_refusal()
            if refused is not None and any(not w.done() for w in self._waiting.values()):
                failure = refused
            failure = handshakes.failure or failure
        self._watcher = None  # this task, ending: not to be cancelled
        self._drop_socket(linger_ms=0)
        for waiter in self._waiting.values():
            if not waiter.done():
                waiter.set_exception(failure)

    def _drop_socket(self, linger_ms: int | None = None) -> None:
        """Stop the reader and the watcher, close the socket (with its own linger when
        `linger_ms` is None) and its monitor; a next request opens them anew."""
        for task in (self._reader, self._watcher):
            if task is not None:
                task.cancel()
        self._reader = self._watcher = None
        if self._socket is not None and self._monitor is not None:
            close_monitored(self._socket, self._monitor, linger_ms)
        elif self._socket is not None:
            self._socket.close(linger_ms)
        self._socket = self._monitor = None

    async def _read(self, socket: zmq.asyncio.Socket) -> None:
        """Hand every reply to the request waiting for it."""
        while True:
            frames: list[Buffer] = [f.buffer for f in await socket.recv_multipart(copy=False)]
            try:
                correlation_id = decode_reply_header(frames).correlation_id
            except MalformedReply as error:
                log.warning("a reply from %s dropped: %s", self.endpoint, error)
                continue
            waiter = self._waiting.pop(correlation_id, None)
            if waiter is not None and not waiter.done():
                waiter.set_result(frames)

    async def exchange(self, request: Request, version: int | None = None) -> list[Buffer]:
        """Send `request`, asked at api_version `version` (default: protocol.request_version),
        and return its reply's frames (decode them with protocol.decode_reply at that
        version). Unavailable when none comes within the timeout (plus max_wait_ms for a
        FETCH); AuthenticationFailed as soon as the Curve handshake fails (keys set)."""
        timeout_s = self._reply_timeout_s(request)
        correlation_id, frames = self._frames(request, version)
        reply: asyncio.Future[list[Buffer]] = asyncio.get_running_loop().create_future()
        self._waiting[correlation_id] = reply
        try:
            async with asyncio.timeout(timeout_s):
                await self._dealer().send_multipart(frames)
                return await reply
        except TimeoutError:
            raise self._no_reply(request, timeout_s) from None
        except asyncio.CancelledError:
            # The watcher closed the socket while this request waited to send (a DEALER whose
            # handshake was refused has nowhere to send): pyzmq cancels the send, not the task.
            task = asyncio.current_task()
            failure = reply.exception() if reply.done() and not reply.cancelled() else None
            if failure is None or (task is not None and task.cancelling()):
                raise
            raise failure from None
        finally:
            self._waiting.pop(correlation_id, None)

    @overload
    async def request(self, request: ProduceRequest) -> ProduceReply: ...
    @overload
    async def request(self, request: FetchRequest) -> FetchReply: ...
    @overload
    async def request(self, request: OffsetsRequest) -> OffsetsReply: ...
    @overload
    async def request(self, request: MetadataRequest) -> MetadataReply: ...
    async def request(self, request: Request) -> Reply:
        """Send `request` and wait for its reply, once: raises what
        broker.client.Connection.request raises."""
        frames = await self.exchange(request)
        return noted(decode_reply(request.api, frames, request_version(request.api)))

    @overload
    async def call(self, request: FetchRequest, retries: int = ...) -> FetchReply: ...
    @overload
    async def call(self, request: OffsetsRequest, retries: int = ...) -> OffsetsReply: ...
    @overload
    async def call(
        self, request: MetadataRequest, retries: int = ..., version: int = ...
    ) -> MetadataReply: ...
    @overload
    async def call(
        self, request: DescribePartitionRequest, retries: int = ...
    ) -> DescribePartitionReply: ...
    async def call(self, request: Request, retries: int = 3, version: int | None = None) -> Reply:
        """`request`, asked at api_version `version` (default: protocol.request_version),
        retried after a retriable error or a timeout as broker.client.Connection.call retries
        it (Retry), within 3 x the timeout."""
        retry = Retry(retries, 3 * self.timeout_s, SYSTEM_CLOCK)
        if version is None:
            version = request_version(request.api)
        while True:
            try:
                frames = await self.exchange(request, version)
                return noted(decode_reply(request.api, frames, version))
            except ConnectionRefused:
                raise
            except (BrokerError, Unavailable) as error:
                wait_s = retry.wait_after(error)
            await asyncio.sleep(wait_s)

    async def send_nowait(self, request: ProduceRequest) -> None:
        """Send a PRODUCE with ack NONE: the broker never answers it, not even on error."""
        if request.ack is not Ack.NONE:
            raise ValueError("send_nowait is for ack NONE only: the reply would be left unread")
        _, frames = self._frames(request)
        await self._dealer().send_multipart(frames)

    async def close(self) -> None:
        """Stop the reader, close the socket (fire-and-forget requests still queued get up to
        FIRE_AND_FORGET_LINGER_MS to go out) and its monitor, and the context if it is the
        connection's own."""
        if self._closed:
            return
        self._closed = True
        for waiter in self._waiting.values():
            waiter.cancel()
        self._drop_socket()
        if self._own_context:
            await asyncio.to_thread(self._context.term)


class AsyncCluster(BrokerMap):
    """The brokers reachable from `bootstrap`, and connections to them (sharing one context,
    each with `keys`): broker.client.Cluster on asyncio."""

    def __init__(
        self,
        bootstrap: str | Sequence[str],
        client_id: str = DEFAULT_CLIENT_ID,
        timeout_s: float = 10.0,
        retries: int = 3,
        *,
        keys: ClientKeys | None = None,
    ) -> None:
        super().__init__(bootstrap, client_id, timeout_s, retries, keys, SYSTEM_CLOCK)
        self.context = AsyncClientContext()
        self._connections = Connections(
            lambda endpoint: AsyncConnection(
                endpoint, self.client_id, self.timeout_s, self.context, keys=self.keys
            )
        )

    def connect(self, endpoint: str) -> AsyncConnection:
        """The connection to `endpoint`, opened on first use."""
        return self._connections.get(endpoint)

    async def connection(self, broker_id: int) -> AsyncConnection:
        """The connection to broker `broker_id` (known from METADATA)."""
        if broker_id not in self.endpoints:
            await self.metadata(())
        endpoint = self.endpoints.get(broker_id)
        if endpoint is None:
            raise self._no_broker(broker_id)
        return self.connect(endpoint)

    async def metadata(self, topics: Iterable[str]) -> MetadataReply:
        """METADATA for `topics` (every topic when empty), as BrokerMap.metadata_steps asks
        it (and broker.client.Cluster.metadata)."""
        steps = self.metadata_steps(topics)
        step = advance(steps)
        while not isinstance(step, MetadataReply):
            if isinstance(step, Pause):
                await asyncio.sleep(step.seconds)
                step = advance(steps)
                continue
            connection = self.connect(step.endpoint)
            try:
                reply = await connection.call(step.request, 0, version=step.version)
            except (BrokerError, Unavailable) as error:
                step = advance(steps, failure=error)
            else:
                step = advance(steps, reply)
        return step

    async def partitions(self, topic: str) -> tuple[PartitionInfo, ...]:
        """Every partition of `topic`, in order (broker.client.Cluster.partitions)."""
        return topic_partitions(await self.metadata([topic]), topic)

    async def connection_for(self, topic: str, partition: int) -> AsyncConnection:
        """The connection to the leader of `partition` of `topic`, from METADATA asked now."""
        partitions = await self.partitions(topic)
        return await self.connection(self._leader_of(partitions, topic, partition))

    async def leader_connection(self, topic: str, partition: int) -> AsyncConnection:
        """The connection to the leader of `partition` of `topic` as last heard of
        (broker.client.Cluster.leader_connection)."""
        leader = self._known_leader(topic, partition)
        if leader is None:
            return await self.connection_for(topic, partition)
        return await self.connection(leader)

    @overload
    async def call_leader(self, request: FetchRequest, retries: int) -> FetchReply: ...
    @overload
    async def call_leader(self, request: OffsetsRequest, retries: int) -> OffsetsReply: ...
    @overload
    async def call_leader(
        self, request: DescribePartitionRequest, retries: int
    ) -> DescribePartitionReply: ...
    async def call_leader(self, request: PartitionRequest, retries: int) -> Reply:
        """`request` sent to its partition's leader, following leadership as
        broker.client.Cluster.call_leader does."""
        retry = Retry(retries, 3 * self.timeout_s, SYSTEM_CLOCK, refusals_within_time=True)
        while True:
            endpoint = None
            try:
                connection = await self.leader_connection(request.topic, request.partition)
                endpoint = connection.endpoint
                frames = await connection.exchange(request)
                return noted(decode_reply(request.api, frames, request_version(request.api)))
            except (BrokerError, Unavailable) as error:
                wait_s = retry.wait_after(error)
                self.learn_from(request.topic, request.partition, error, endpoint)
            await asyncio.sleep(wait_s)

    async def close(self) -> None:
        """Close every connection and the context."""
        if self._connections.closed:
            return
        for connection in self._connections.close():
            await connection.close()
        await asyncio.to_thread(self.context.term)
