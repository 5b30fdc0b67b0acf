"""One client connection to one broker: blocking pyzmq.

A `Connection` holds a REQ socket for requests with one in flight (`request`, `call`) and,
created on first use, a DEALER socket for pipelined requests (`send_pipelined`,
`receive_pipelined`: any number in flight, matched to replies by correlation id) and for
fire-and-forget produce requests, whose reply never comes and would leave a REQ socket
waiting for ever (docs/protocol.md, "Transport"). Frames are built and read by broker.protocol
only; what a connection does without I/O (the address, correlation ids, a request's frames and
reply timeout, the retry rule) is broker.client.framing's, shared with broker.aio's.

Timeouts: every request waits at most `timeout_s` for its reply (a FETCH also its own
max_wait_ms). When no reply comes, the REQ socket is closed and a new one connected, because a
REQ socket that lost a reply can never send again; the request raises
broker.errors.Unavailable, which is retriable. `call(..., retries=N)` retries that and every
retriable BrokerError (the broker's Unavailable branch) with a doubling back-off, bounded both
in count and in total time. The Producer retries its batches with the same back-off, bounded
by its delivery_timeout_s (broker.client.producer).

Curve handshakes: a broker serving CurveZMQ that refuses the client's key, or cannot read its
handshake (another broker key), never answers: ZeroMQ drops the connection. So with keys, each
socket gets a monitor (a PAIR socket of the socket's handshake events, closed with it), polled
with the socket while a request waits: a failed handshake ends the wait at once with
broker.errors.AuthenticationFailed, which is not retried (`call`, the Producer and the
consumers raise it as it is), and the socket is dropped, so that a later request makes a new
handshake (the key may be added meanwhile). A plaintext connection has no monitor. The
monitor's events are read, and become those errors, in broker.client.handshakes.

Not safe to share between threads.
"""

from __future__ import annotations

import atexit
import contextlib
import threading
import time
from typing import Any, Final, overload

import zmq

from broker.client.framing import DEFAULT_CLIENT_ID, Framing, Retry, noted
from broker.client.handshakes import HandshakeMonitor, poll_ms
from broker.errors import (
    AuthenticationFailed,
    BrokerError,
    ConnectionRefused,
    MalformedReply,
    Unavailable,
)
from broker.lifecycle import Closing
from broker.log.message import Buffer
from broker.protocol import (
    Ack,
    AlterConfigRequest,
    Api,
    CreateTopicRequest,
    DeleteGroupRequest,
    DeleteTopicRequest,
    DescribeClusterReply,
    DescribeClusterRequest,
    DescribeConfigReply,
    DescribeConfigRequest,
    DescribeGroupReply,
    DescribeGroupRequest,
    DescribePartitionReply,
    DescribePartitionRequest,
    EmptyReply,
    FetchReply,
    FetchRequest,
    GroupHeartbeatReply,
    GroupHeartbeatRequest,
    ListGroupsReply,
    ListGroupsRequest,
    MetadataReply,
    MetadataRequest,
    MultiFetchReply,
    MultiFetchRequest,
    MultiProduceRequest,
    OffsetCommitReply,
    OffsetCommitRequest,
    OffsetFetchReply,
    OffsetFetchRequest,
    OffsetsReply,
    OffsetsRequest,
    ProduceReply,
    ProduceRequest,
    Reply,
    Request,
    decode_reply,
    decode_reply_header,
    request_version,
)
from broker.security import ClientKeys
from broker.security.monitor import close_monitored
from broker.zmqio import NOBLOCK, receive_frames, send_frames


def terminate_unblocked(context: zmq.Context[Any]) -> None:
    """What a client's context does when the garbage collector takes it unclosed (a client
    left unclosed, as `Admin(...).create_topic(...)` under an `except` leaves one in a cycle):
    it terminates on a thread of its own. pyzmq's own finalizer terminates it on the spot,
    and CPython has cleared the context's weak set of sockets by then when they are garbage
    together: it waited for ever for sockets it no longer knew, and the program hung. Their
    own finalizers close them next; the termination then ends."""
    if context.closed or _exiting:  # at exit, as pyzmq: the process's end frees it
        return
    terminating = threading.Thread(target=context.term, name="pylog-context-term", daemon=True)
    with contextlib.suppress(RuntimeError):  # the interpreter is shutting down
        terminating.start()


_exiting = False


@atexit.register
def _at_exit() -> None:
    global _exiting
    _exiting = True


class ClientContext(zmq.Context[zmq.Socket[bytes]]):
    """The ZeroMQ context of the clients: a zmq.Context whose collection never blocks
    (terminate_unblocked)."""

    def __del__(self) -> None:
        terminate_unblocked(self)


FIRE_AND_FORGET_LINGER_MS: Final = 5000
"""How long closing waits for fire-and-forget requests still queued to go out."""


class Connection(Framing, Closing):
    """Requests to the broker at `endpoint` ("host:port" or "tcp://host:port", see
    normalize_endpoint), one at a time.

    `context` defaults to a context of the connection's own, terminated by `close()` (which
    then waits up to FIRE_AND_FORGET_LINGER_MS for unsent fire-and-forget requests).

    `keys` (broker.security.ClientKeys: the client's key pair and the broker's public key)
    make every socket of the connection a CurveZMQ client of a broker serving Curve
    (docs/security.md); without them it speaks plaintext."""

    def __init__(
        self,
        endpoint: str,
        client_id: str = DEFAULT_CLIENT_ID,
        timeout_s: float = 10.0,
        context: zmq.Context[zmq.Socket[bytes]] | None = None,
        *,
        keys: ClientKeys | None = None,
    ) -> None:
        super().__init__(endpoint, client_id, timeout_s, keys)
        self._own_context = context is None
        self._context: zmq.Context[zmq.Socket[bytes]] = (
            ClientContext() if context is None else context
        )
        self._req: zmq.Socket[bytes] | None = None
        self._dealer: zmq.Socket[bytes] | None = None
        self._monitors: dict[zmq.Socket[bytes], HandshakeMonitor] = {}
        """The monitor of each socket, with keys."""
        self._closed = False

    # -- sockets ---------------------------------------------------------------------------

    def _req_socket(self) -> zmq.Socket[bytes]:
        if self._closed:
            raise ValueError("the connection is closed")
        if self._req is None:
            self._req = self._connected(zmq.REQ, linger_ms=0)
        return self._req

    def _connected(self, kind: int, linger_ms: int) -> zmq.Socket[bytes]:
        """A new socket of `kind` connected to the endpoint, with its handshakes' monitor
        (without keys, until its first handshake succeeds: `_readable`); closed again if
        connecting fails (a socket left open would make terminating the context wait for
        ever)."""
        socket = self._context.socket(kind)
        try:
            socket.setsockopt(zmq.LINGER, linger_ms)
            self._secure(socket)
            curve = self.keys is not None
            self._monitors[socket] = HandshakeMonitor(socket, self.endpoint, curve)
            socket.connect(self.endpoint)
        except BaseException:
            self._close_socket(socket, linger_ms=0)
            raise
        return socket

    def _close_socket(self, socket: zmq.Socket[bytes], linger_ms: int | None = None) -> None:
        """Close `socket` (with its own linger when `linger_ms` is None) and its monitor."""
        monitor = self._monitors.pop(socket, None)
        if monitor is None:
            socket.close(linger_ms)
        else:
            close_monitored(socket, monitor.socket, linger_ms)

    def _readable(self, socket: zmq.Socket[bytes], timeout_s: float) -> bool:
        """Whether `socket` has a reply within `timeout_s`; AuthenticationFailed as soon as its
        handshake fails, ConnectionRefused as soon as a connection is refused. Without keys
        the monitor goes once a handshake has succeeded (all that could fail is the mechanism,
        and the socket is then polled alone: a broker that goes down later costs the
        timeout)."""
        monitor = self._monitors.get(socket)
        if monitor is None:
            return bool(socket.poll(poll_ms(timeout_s), zmq.POLLIN))
        readable = monitor.wait_readable(timeout_s)
        if not monitor.curve:
            self._checked(socket, monitor)
        return readable

    def _checked(self, socket: zmq.Socket[bytes], monitor: HandshakeMonitor) -> None:
        """Take `socket`'s handshake events (AuthenticationFailed on a failure); the monitor
        of a socket without keys goes once a handshake has succeeded (unread, its events
        would pile up at each reconnection)."""
        monitor.check()
        if monitor.succeeded and not monitor.curve:
            del self._monitors[socket]
            socket.disable_monitor()
            monitor.socket.close(linger=0)

    def _reset_req_socket(self) -> None:
        """Drop a REQ socket that lost its reply (it cannot send again) or its handshake."""
        if self._req is not None:
            self._close_socket(self._req, linger_ms=0)
            self._req = None

    def _reset_dealer_socket(self) -> None:
        """Drop a DEALER socket whose handshake failed or whose connection was refused: what it
        holds can never go out, or would go out after its senders were told it failed."""
        if self._dealer is not None:
            self._close_socket(self._dealer, linger_ms=0)
            self._dealer = None

    # -- requests --------------------------------------------------------------------------

    @overload
    def request(self, request: ProduceRequest) -> ProduceReply: ...
    @overload
    def request(self, request: FetchRequest) -> FetchReply: ...
    @overload
    def request(self, request: MultiFetchRequest) -> MultiFetchReply: ...
    @overload
    def request(self, request: OffsetsRequest) -> OffsetsReply: ...
    @overload
    def request(self, request: MetadataRequest) -> MetadataReply: ...
    @overload
    def request(
        self, request: CreateTopicRequest | DeleteTopicRequest | AlterConfigRequest
    ) -> EmptyReply: ...
    @overload
    def request(self, request: DescribeClusterRequest) -> DescribeClusterReply: ...
    @overload
    def request(self, request: GroupHeartbeatRequest) -> GroupHeartbeatReply: ...
    @overload
    def request(self, request: OffsetCommitRequest) -> OffsetCommitReply: ...
    @overload
    def request(self, request: OffsetFetchRequest) -> OffsetFetchReply: ...
    @overload
    def request(self, request: DescribeGroupRequest) -> DescribeGroupReply: ...
    @overload
    def request(self, request: ListGroupsRequest) -> ListGroupsReply: ...
    @overload
    def request(self, request: DeleteGroupRequest) -> EmptyReply: ...
    def request(self, request: Request) -> Reply:
        """Send `request` and wait for its reply, once.

        Raises BrokerError for an error the broker answered with, MalformedReply for a reply
        that breaks the protocol or answers another request, Unavailable when no reply came
        within the timeout (plus max_wait_ms for a FETCH), and AuthenticationFailed when the
        Curve handshake failed (keys set). A PRODUCE with ack NONE gets no reply: send it with
        `send_nowait`."""
        return self._request_once(request)

    def _request_once(self, request: Request, version: int | None = None) -> Reply:
        if version is None:
            version = request_version(request.api)
        timeout_s = self._reply_timeout_s(request)
        correlation_id, frames = self._frames(request, version)
        socket = self._req_socket()
        try:
            send_frames(socket, frames)
            # poll, not RCVTIMEO: the timeout differs per request.
            if not self._readable(socket, timeout_s):
                raise zmq.Again()
            reply = [frame.buffer for frame in receive_frames(socket)]
        except zmq.Again:
            self._reset_req_socket()
            raise self._no_reply(request, timeout_s) from None
        except (AuthenticationFailed, ConnectionRefused):
            self._reset_req_socket()
            raise
        header = decode_reply_header(reply)
        if header.correlation_id != correlation_id:
            self._reset_req_socket()
            raise MalformedReply(
                f"reply for correlation id {header.correlation_id}, expected {correlation_id}"
            )
        return noted(decode_reply(request.api, reply, version))

    @overload
    def call(
        self, request: ProduceRequest, retries: int = ..., max_time_s: float | None = ...
    ) -> ProduceReply: ...
    @overload
    def call(
        self,
        request: FetchRequest,
        retries: int = ...,
        max_time_s: float | None = ...,
        version: int | None = ...,
    ) -> FetchReply: ...
    @overload
    def call(
        self,
        request: OffsetsRequest,
        retries: int = ...,
        max_time_s: float | None = ...,
        version: int | None = ...,
    ) -> OffsetsReply: ...
    @overload
    def call(
        self,
        request: MetadataRequest,
        retries: int = ...,
        max_time_s: float | None = ...,
        version: int | None = ...,
    ) -> MetadataReply: ...
    @overload
    def call(
        self,
        request: CreateTopicRequest | DeleteTopicRequest | AlterConfigRequest,
        retries: int = ...,
        max_time_s: float | None = ...,
    ) -> EmptyReply: ...
    @overload
    def call(
        self, request: DescribeClusterRequest, retries: int = ..., max_time_s: float | None = ...
    ) -> DescribeClusterReply: ...
    @overload
    def call(
        self,
        request: DescribePartitionRequest,
        retries: int = ...,
        max_time_s: float | None = ...,
        version: int | None = ...,
    ) -> DescribePartitionReply: ...
    @overload
    def call(
        self, request: DescribeConfigRequest, retries: int = ..., max_time_s: float | None = ...
    ) -> DescribeConfigReply: ...
    @overload
    def call(
        self,
        request: MultiFetchRequest,
        retries: int = ...,
        max_time_s: float | None = ...,
        version: int | None = ...,
    ) -> MultiFetchReply: ...
    def call(
        self,
        request: Request,
        retries: int = 3,
        max_time_s: float | None = None,
        version: int | None = None,
    ) -> Reply:
        """`request`, asked at api_version `version` (default: protocol.request_version; METADATA
        and MULTI_FETCH have a version 2), retried up to
        `retries` more times after a retriable BrokerError or a timeout, waiting 0.1 s doubling
        to 2 s in between; no retry starts after `max_time_s` (default: 3 x the timeout). The
        last error is raised as it was; AuthenticationFailed and ConnectionRefused are raised
        at once (nothing listens at this one endpoint: callers that know others ask them,
        Cluster.ask_any and its METADATA rounds).

        A PRODUCE retried after a timeout may append its messages twice (at least once)."""
        retry = Retry(retries, 3 * self.timeout_s if max_time_s is None else max_time_s)
        while True:
            try:
                return self._request_once(request, version)
            except ConnectionRefused:
                raise
            except (BrokerError, Unavailable) as error:
                wait_s = retry.wait_after(error)
            time.sleep(wait_s)

    def _dealer_socket(self) -> zmq.Socket[bytes]:
        if self._closed:
            raise ValueError("the connection is closed")
        if self._dealer is None:
            self._dealer = self._connected(zmq.DEALER, FIRE_AND_FORGET_LINGER_MS)
        return self._dealer

    @property
    def pipelined_socket(self) -> zmq.Socket[bytes]:
        """The DEALER socket of pipelined requests, to poll for replies beside other sockets."""
        return self._dealer_socket()

    def send_pipelined(self, request: Request) -> int:
        """Send `request` on the DEALER socket without waiting; returns the correlation id
        its reply will carry (see `receive_pipelined`). Any number may be in flight.
        AuthenticationFailed, nothing sent, when the socket's Curve handshake failed (looked
        for until one succeeded: a send costs nothing more then; a later handshake of the
        socket that fails is met by `receive_pipelined`)."""
        correlation_id, frames = self._frames(request)
        socket = self._dealer_socket()
        monitor = self._monitors.get(socket)
        if monitor is not None and not monitor.succeeded:
            try:
                self._checked(socket, monitor)
            except AuthenticationFailed:
                self._reset_dealer_socket()
                raise
        send_frames(socket, frames)  # a DEALER sends no delimiter
        return correlation_id

    def receive_pipelined(self, timeout_s: float) -> tuple[int, list[Buffer]]:
        """The next reply to a request sent with `send_pipelined`: its correlation id and
        frames (decode them with protocol.decode_reply). Unavailable when none comes within
        `timeout_s`; AuthenticationFailed as soon as the socket's Curve handshake fails, and
        ConnectionRefused as soon as a connection is refused (the requests in flight never
        reached the broker, or will never be answered: the socket is dropped with them)."""
        socket = self._dealer_socket()
        try:  # replies often come in bursts (the acks of one flush): no poll while they last
            received = receive_frames(socket, NOBLOCK)
        except zmq.Again:
            received = None
        if received is None:  # wait outside the handler: Ctrl-C there is not chained to Again
            try:
                readable = self._readable(socket, timeout_s)
            except (AuthenticationFailed, ConnectionRefused):
                self._reset_dealer_socket()
                raise
            if not readable:
                raise Unavailable(f"no reply from {self.endpoint} within {timeout_s:g} s")
            received = receive_frames(socket)
        frames: list[Buffer] = [frame.buffer for frame in received]
        return decode_reply_header(frames).correlation_id, frames

    def fetched_ahead(self, correlation_id: int, timeout_s: float) -> FetchReply | None:
        """The reply to the FETCH sent with `send_pipelined` as `correlation_id` (the replies
        to pipelined requests sent before it are skipped), or None when it failed or did not
        come within `timeout_s`: then send the fetch again the usual way (`call`), which
        retries and raises what it meets."""
        deadline = time.monotonic() + timeout_s
        try:
            while True:
                left = max(0.001, deadline - time.monotonic())
                answered, frames = self.receive_pipelined(left)
                if answered == correlation_id:
                    return noted(decode_reply(Api.FETCH, frames, request_version(Api.FETCH)))
        except (BrokerError, Unavailable):
            return None

    def send_nowait(self, request: ProduceRequest | MultiProduceRequest) -> None:
        """Send a PRODUCE (or MULTI_PRODUCE) with ack NONE on the DEALER socket and return at
        once: the broker never answers it, not even on error. Queued while the broker is
        unreachable."""
        if request.ack is not Ack.NONE:
            raise ValueError("send_nowait is for ack NONE only: the reply would be left unread")
        self.send_pipelined(request)

    # -- life cycle ------------------------------------------------------------------------

    def close(self) -> None:
        """Close the sockets (fire-and-forget requests still queued get up to
        FIRE_AND_FORGET_LINGER_MS to go out) and the context if it is the connection's own."""
        if self._closed:
            return
        self._closed = True
        self._reset_req_socket()
        if self._dealer is not None:
            self._close_socket(self._dealer)
            self._dealer = None
        if self._own_context:
            self._context.term()
