"""One client connection to one broker: blocking pyzmq.

A `Connection` holds a REQ socket for requests with one in flight (`request`, `call`) and,
created on first use, a DEALER socket for pipelined requests (`send_pipelined`,
`receive_pipelined`: any number in flight, matched to replies by correlation id) and for
fire-and-forget produce requests, whose reply never comes and would leave a REQ socket
waiting for ever (docs/protocol.md, "Transport"). Frames are built and read by broker.protocol
only.

Timeouts: every request waits at most `timeout_s` for its reply (a FETCH also its own
max_wait_ms). When no reply comes, the REQ socket is closed and a new one connected, because a
REQ socket that lost a reply can never send again; the request raises
broker.errors.Unavailable, which is retriable. `call(..., retries=N)` retries that and every
retriable BrokerError (the broker's Unavailable branch) with a doubling back-off, bounded both
in count and in total time. The Producer retries its batches with the same back-off, bounded
by its delivery_timeout_s (broker.client.producer).

Not safe to share between threads.
"""

from __future__ import annotations

import re
import time
from typing import Any, Final, overload

import zmq

from broker.errors import BrokerError, MalformedReply, Unavailable
from broker.lifecycle import Closing
from broker.log.message import Buffer
from broker.protocol import (
    API_VERSION,
    Ack,
    AlterConfigRequest,
    CreateTopicRequest,
    DeleteTopicRequest,
    DescribeClusterReply,
    DescribeClusterRequest,
    DescribeConfigReply,
    DescribeConfigRequest,
    DescribePartitionReply,
    DescribePartitionRequest,
    EmptyReply,
    FetchReply,
    FetchRequest,
    MetadataReply,
    MetadataRequest,
    OffsetsReply,
    OffsetsRequest,
    ProduceReply,
    ProduceRequest,
    Reply,
    Request,
    RequestHeader,
    decode_reply,
    decode_reply_header,
    encode_request,
)
from broker.security import ClientKeys
from broker.zmqio import receive_frames, send_frames

DEFAULT_CLIENT_ID: Final = "pylog-python"
FIRE_AND_FORGET_LINGER_MS: Final = 5000
"""How long closing waits for fire-and-forget requests still queued to go out."""
_MAX_CORRELATION_ID: Final = 0xFFFFFFFF
RETRY_BACKOFF_S: Final = 0.1
"""The wait before the first retry of a request; it doubles for each next one..."""
MAX_RETRY_BACKOFF_S: Final = 2.0
"""... up to this."""
_ADDRESS: Final = re.compile(
    r"(?:tcp://)?(?P<host>[A-Za-z0-9._-]+|\[[0-9A-Fa-f:.]+\]):(?P<port>[0-9]{1,5})"
)


def normalize_endpoint(address: str) -> str:
    """`address`, "HOST:PORT" or "tcp://HOST:PORT" (blanks around it ignored), as
    "tcp://HOST:PORT"; ValueError for anything else, at once (ZeroMQ would refuse a missing
    "tcp://" only on connect)."""
    match = _ADDRESS.fullmatch(address.strip())
    if match is None or not 1 <= int(match["port"]) <= 65535:
        raise ValueError(
            f"broker address {address!r}: use HOST:PORT or tcp://HOST:PORT (a port from 1 to 65535)"
        )
    return f"tcp://{match['host']}:{int(match['port'])}"


def require_bytes(what: str, value: object, fix: str = "encode it (.encode()) first") -> Buffer:
    """`value` if it is bytes, bytearray or memoryview; else a TypeError naming `what` (and
    saying `fix` for a str), so that a str is refused where it is given rather than deep in
    encoding, or hashed as text."""
    if isinstance(value, bytes | bytearray | memoryview):
        return value
    hint = f": {fix}" if isinstance(value, str) else ""
    raise TypeError(f"{what} must be bytes, not {type(value).__name__}{hint}")


def retriable(error: BrokerError | Unavailable) -> bool:
    """Whether a request that met `error` may succeed when sent again: no reply in time, or a
    retriable code answered."""
    return not isinstance(error, BrokerError) or error.retriable


class Retry:
    """The retry rule of `call` (and of broker.aio's): after a retriable error, wait 0.1 s
    doubling to 2 s, at most `retries` times, no retry starting after `max_time_s` from now."""

    def __init__(self, retries: int, max_time_s: float) -> None:
        self.left = retries
        self.deadline = time.monotonic() + max_time_s
        self.backoff_s = RETRY_BACKOFF_S

    def wait_after(self, error: BrokerError | Unavailable) -> float:
        """How long to wait before trying again after `error`; raises `error` itself when it
        is not retriable or the budget is spent."""
        backoff_s = self.backoff_s
        if not retriable(error) or self.left <= 0 or time.monotonic() + backoff_s > self.deadline:
            raise error
        self.left -= 1
        self.backoff_s = min(backoff_s * 2, MAX_RETRY_BACKOFF_S)
        return backoff_s


class Framing:
    """What a connection to one broker does without I/O (shared with broker.aio's): its
    endpoint ("host:port" or "tcp://host:port", see normalize_endpoint), client id, reply
    timeout, Curve keys and correlation ids, and the frames of a request."""

    def __init__(
        self, endpoint: str, client_id: str, timeout_s: float, keys: ClientKeys | None = None
    ) -> None:
        if timeout_s <= 0:
            raise ValueError(f"timeout_s is {timeout_s}: it must be positive")
        self.endpoint = normalize_endpoint(endpoint)
        self.client_id = client_id
        self.timeout_s = timeout_s
        self.keys = keys
        """The client's key pair and the broker's public key, for a broker serving CurveZMQ
        (docs/security.md); None: plaintext."""
        self._next_correlation_id = 1

    def _secure(self, socket: zmq.Socket[Any]) -> None:
        """Make `socket`, not yet connected, a Curve client of the broker if keys are set."""
        if self.keys is not None:
            self.keys.apply(socket)

    def _no_reply(self, request: Request, timeout_s: float) -> Unavailable:
        """The error of a request that got no reply within `timeout_s`. A Curve broker that
        refuses the client's key, or a client without keys, gets silence too: ZeroMQ drops
        the connection in its handshake and never says why to the client."""
        cause = "broker down or unreachable?"
        if self.keys is not None:
            cause = "broker down or unreachable, or this client's key not allowed?"
        return Unavailable(
            f"no reply from {self.endpoint} within {timeout_s:g} s to {request.api.name} ({cause})"
        )

    def _correlation_id(self) -> int:
        correlation_id = self._next_correlation_id
        self._next_correlation_id = correlation_id % _MAX_CORRELATION_ID + 1
        return correlation_id

    def _frames(self, request: Request) -> tuple[int, list[Buffer]]:
        if isinstance(request, ProduceRequest):
            require_bytes("ProduceRequest.message_set", request.message_set)
        correlation_id = self._correlation_id()
        header = RequestHeader(request.api, API_VERSION, correlation_id, self.client_id)
        return correlation_id, encode_request(header, request)

    def _reply_timeout_s(self, request: Request) -> float:
        """How long to wait for the reply to `request`: the timeout, plus a FETCH's
        max_wait_ms. ValueError for a PRODUCE with ack NONE, which gets none."""
        if isinstance(request, ProduceRequest) and request.ack is Ack.NONE:
            raise ValueError("a PRODUCE with ack NONE gets no reply: use send_nowait")
        if isinstance(request, FetchRequest):
            return self.timeout_s + request.max_wait_ms / 1000
        return self.timeout_s


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
            zmq.Context() if context is None else context
        )
        self._req: zmq.Socket[bytes] | None = None
        self._dealer: zmq.Socket[bytes] | None = None
        self._closed = False

    # -- sockets ---------------------------------------------------------------------------

    def _req_socket(self) -> zmq.Socket[bytes]:
        if self._closed:
            raise ValueError("the connection is closed")
        if self._req is None:
            self._req = self._connected(zmq.REQ, linger_ms=0)
        return self._req

    def _connected(self, kind: int, linger_ms: int) -> zmq.Socket[bytes]:
        """A new socket of `kind` connected to the endpoint; closed again if connecting fails
        (a socket left open would make terminating the context wait for ever)."""
        socket = self._context.socket(kind)
        try:
            socket.setsockopt(zmq.LINGER, linger_ms)
            self._secure(socket)
            socket.connect(self.endpoint)
        except BaseException:
            socket.close(linger=0)
            raise
        return socket

    def _reset_req_socket(self) -> None:
        """Drop a REQ socket that lost its reply: it cannot send again."""
        if self._req is not None:
            self._req.close(linger=0)
            self._req = None

    # -- requests --------------------------------------------------------------------------

    @overload
    def request(self, request: ProduceRequest) -> ProduceReply: ...
    @overload
    def request(self, request: FetchRequest) -> FetchReply: ...
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
    def request(self, request: Request) -> Reply:
        """Send `request` and wait for its reply, once.

        Raises BrokerError for an error the broker answered with, MalformedReply for a reply
        that breaks the protocol or answers another request, and Unavailable when no reply came
        within the timeout (plus max_wait_ms for a FETCH). A PRODUCE with ack NONE gets no
        reply: send it with `send_nowait`."""
        return self._request_once(request)

    def _request_once(self, request: Request) -> Reply:
        timeout_s = self._reply_timeout_s(request)
        timeout_ms = max(1, round(timeout_s * 1000))
        correlation_id, frames = self._frames(request)
        socket = self._req_socket()
        try:
            send_frames(socket, frames)
            # poll, not RCVTIMEO: the timeout differs per request.
            if not socket.poll(timeout_ms, zmq.POLLIN):
                raise zmq.Again()
            reply = [frame.buffer for frame in receive_frames(socket)]
        except zmq.Again:
            self._reset_req_socket()
            raise self._no_reply(request, timeout_s) from None
        header = decode_reply_header(reply)
        if header.correlation_id != correlation_id:
            self._reset_req_socket()
            raise MalformedReply(
                f"reply for correlation id {header.correlation_id}, expected {correlation_id}"
            )
        return decode_reply(request.api, reply)

    @overload
    def call(
        self, request: ProduceRequest, retries: int = ..., max_time_s: float | None = ...
    ) -> ProduceReply: ...
    @overload
    def call(
        self, request: FetchRequest, retries: int = ..., max_time_s: float | None = ...
    ) -> FetchReply: ...
    @overload
    def call(
        self, request: OffsetsRequest, retries: int = ..., max_time_s: float | None = ...
    ) -> OffsetsReply: ...
    @overload
    def call(
        self, request: MetadataRequest, retries: int = ..., max_time_s: float | None = ...
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
        self, request: DescribePartitionRequest, retries: int = ..., max_time_s: float | None = ...
    ) -> DescribePartitionReply: ...
    @overload
    def call(
        self, request: DescribeConfigRequest, retries: int = ..., max_time_s: float | None = ...
    ) -> DescribeConfigReply: ...
    def call(self, request: Request, retries: int = 3, max_time_s: float | None = None) -> Reply:
        """`request`, retried up to `retries` more times after a retriable BrokerError or a
        timeout, waiting 0.1 s doubling to 2 s in between; no retry starts after `max_time_s`
        (default: 3 x the timeout). The last error is raised as it was.

        A PRODUCE retried after a timeout may append its messages twice (at least once)."""
        retry = Retry(retries, 3 * self.timeout_s if max_time_s is None else max_time_s)
        while True:
            try:
                return self._request_once(request)
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
        its reply will carry (see `receive_pipelined`). Any number may be in flight."""
        correlation_id, frames = self._frames(request)
        send_frames(self._dealer_socket(), frames)  # a DEALER sends no delimiter
        return correlation_id

    def receive_pipelined(self, timeout_s: float) -> tuple[int, list[Buffer]]:
        """The next reply to a request sent with `send_pipelined`: its correlation id and
        frames (decode them with protocol.decode_reply). Unavailable when none comes within
        `timeout_s`."""
        socket = self._dealer_socket()
        if not socket.poll(max(1, round(timeout_s * 1000)), zmq.POLLIN):
            raise Unavailable(f"no reply from {self.endpoint} within {timeout_s:g} s")
        frames: list[Buffer] = [frame.buffer for frame in receive_frames(socket)]
        return decode_reply_header(frames).correlation_id, frames

    def send_nowait(self, request: ProduceRequest) -> None:
        """Send a PRODUCE with ack NONE on the DEALER socket and return at once: the broker
        never answers it, not even on error. Queued while the broker is unreachable."""
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
            self._dealer.close()
            self._dealer = None
        if self._own_context:
            self._context.term()
