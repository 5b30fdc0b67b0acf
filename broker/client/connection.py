"""One client connection to one broker, blocking.

A `Connection` holds a channel for requests with one in flight (`request`, `call`) and, opened
on first use, a pipelined channel (`send_pipelined`, `receive_pipelined`: any number in flight,
matched to replies by correlation id) for fire-and-forget produce requests too, whose reply
never comes and would leave a ZeroMQ REQ socket waiting for ever (docs/protocol.md,
"Transport"). The channels are its transport's (broker.client.transport: ZeroMQ sockets, or
in memory for tests). Frames are built and read by broker.protocol only; what a connection
does without I/O (the address, correlation ids, a request's frames and reply timeout, the
retry rule) is broker.client.framing's, shared with broker.aio's.

Timeouts: every request waits at most `timeout_s` for its reply (a FETCH also its own
max_wait_ms). When no reply comes, the request channel is closed and a new one opened, because
a REQ socket that lost a reply can never send again; the request raises
broker.errors.Unavailable, which is retriable. `call(..., retries=N)` retries that and every
retriable BrokerError (the broker's Unavailable branch) with a doubling back-off, bounded both
in count and in total time on the transport's clock. The Producer retries its batches with
the same back-off, bounded by its delivery_timeout_s (broker.client.producer).

Curve handshakes: a broker serving CurveZMQ that refuses the client's key, or cannot read its
handshake (another broker key), never answers: ZeroMQ drops the connection. The ZeroMQ
transport watches each socket's handshakes while a request waits: a failed handshake ends the
wait at once with broker.errors.AuthenticationFailed, which is not retried (`call`, the
Producer and the consumers raise it as it is), and the channel is dropped, so that a later
request makes a new handshake (the key may be added meanwhile).

Not safe to share between threads.
"""

from __future__ import annotations

from typing import overload

from broker.client.framing import DEFAULT_CLIENT_ID, Framing, Retry, noted
from broker.client.transport import Channel, Transport, ZmqTransport
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
    CreatePartitionsRequest,
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


class Connection(Framing, Closing):
    """Requests to the broker at `endpoint` ("host:port" or "tcp://host:port", see
    normalize_endpoint), one at a time.

    `transport` carries them (broker.client.transport); default: a ZmqTransport of the
    connection's own, closed by `close()` (which then waits up to FIRE_AND_FORGET_LINGER_MS
    for unsent fire-and-forget requests). Its clock times the waits between retries.

    `keys` (broker.security.ClientKeys: the client's key pair and the broker's public key)
    make every channel of the connection a CurveZMQ client of a broker serving Curve
    (docs/security.md); without them it speaks plaintext."""

    def __init__(
        self,
        endpoint: str,
        client_id: str = DEFAULT_CLIENT_ID,
        timeout_s: float = 10.0,
        transport: Transport | None = None,
        *,
        keys: ClientKeys | None = None,
    ) -> None:
        super().__init__(endpoint, client_id, timeout_s, keys)
        self._own_transport = transport is None
        self.transport: Transport = ZmqTransport() if transport is None else transport
        self._requests: Channel | None = None
        self._pipelined: Channel | None = None
        self._closed = False

    # -- channels --------------------------------------------------------------------------

    def _request_channel(self) -> Channel:
        if self._closed:
            raise ValueError("the connection is closed")
        if self._requests is None:
            self._requests = self.transport.open(self.endpoint, self.keys, pipelined=False)
        return self._requests

    def _drop_request_channel(self) -> None:
        """Drop a request channel that lost its reply (a REQ socket cannot send again) or its
        handshake."""
        if self._requests is not None:
            self._requests.close()
            self._requests = None

    def _drop_pipelined_channel(self) -> None:
        """Drop a pipelined channel whose handshake failed or whose connection was refused:
        what it holds can never go out, or would go out after its senders were told it
        failed."""
        if self._pipelined is not None:
            self._pipelined.close()
            self._pipelined = None

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
        self,
        request: CreateTopicRequest
        | DeleteTopicRequest
        | AlterConfigRequest
        | CreatePartitionsRequest,
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
        channel = self._request_channel()
        try:
            channel.send(frames)
            reply = channel.receive(timeout_s)
        except (AuthenticationFailed, ConnectionRefused):
            self._drop_request_channel()
            raise
        if reply is None:
            self._drop_request_channel()
            raise self._no_reply(request, timeout_s)
        header = decode_reply_header(reply)
        if header.correlation_id != correlation_id:
            self._drop_request_channel()
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
        clock = self.transport.clock
        retry = Retry(retries, 3 * self.timeout_s if max_time_s is None else max_time_s, clock)
        while True:
            try:
                return self._request_once(request, version)
            except ConnectionRefused:
                raise
            except (BrokerError, Unavailable) as error:
                wait_s = retry.wait_after(error)
            clock.sleep(wait_s)

    @property
    def pipelined_channel(self) -> Channel:
        """The channel of pipelined requests, opened on first use (to wait on beside others:
        Transport.wait_any)."""
        if self._closed:
            raise ValueError("the connection is closed")
        if self._pipelined is None:
            self._pipelined = self.transport.open(self.endpoint, self.keys, pipelined=True)
        return self._pipelined

    def send_pipelined(self, request: Request) -> int:
        """Send `request` on the pipelined channel without waiting; returns the correlation id
        its reply will carry (see `receive_pipelined`). Any number may be in flight.
        AuthenticationFailed, nothing sent, when the channel's Curve handshake failed (looked
        for until one succeeded: a send costs nothing more then; a later handshake that fails
        is met by `receive_pipelined`)."""
        correlation_id, frames = self._frames(request)
        channel = self.pipelined_channel
        try:
            channel.send(frames)
        except AuthenticationFailed:
            self._drop_pipelined_channel()
            raise
        return correlation_id

    def receive_pipelined(self, timeout_s: float) -> tuple[int, list[Buffer]]:
        """The next reply to a request sent with `send_pipelined`: its correlation id and
        frames (decode them with protocol.decode_reply). Unavailable when none comes within
        `timeout_s`; AuthenticationFailed as soon as the channel's Curve handshake fails, and
        ConnectionRefused as soon as a connection is refused (the requests in flight never
        reached the broker, or will never be answered: the channel is dropped with them)."""
        try:
            frames = self.pipelined_channel.receive(timeout_s)
        except (AuthenticationFailed, ConnectionRefused):
            self._drop_pipelined_channel()
            raise
        if frames is None:
            raise Unavailable(f"no reply from {self.endpoint} within {timeout_s:g} s")
        return decode_reply_header(frames).correlation_id, frames

    def fetched_ahead(self, correlation_id: int, timeout_s: float) -> FetchReply | None:
        """The reply to the FETCH sent with `send_pipelined` as `correlation_id` (the replies
        to pipelined requests sent before it are skipped), or None when it failed or did not
        come within `timeout_s`: then send the fetch again the usual way (`call`), which
        retries and raises what it meets."""
        clock = self.transport.clock
        deadline = clock.monotonic() + timeout_s
        try:
            while True:
                left = max(0.001, deadline - clock.monotonic())
                answered, frames = self.receive_pipelined(left)
                if answered == correlation_id:
                    return noted(decode_reply(Api.FETCH, frames, request_version(Api.FETCH)))
        except (BrokerError, Unavailable):
            return None

    def send_nowait(self, request: ProduceRequest | MultiProduceRequest) -> None:
        """Send a PRODUCE (or MULTI_PRODUCE) with ack NONE on the pipelined channel and return at
        once: the broker never answers it, not even on error. Queued while the broker is
        unreachable."""
        if request.ack is not Ack.NONE:
            raise ValueError("send_nowait is for ack NONE only: the reply would be left unread")
        self.send_pipelined(request)

    # -- life cycle ------------------------------------------------------------------------

    def close(self) -> None:
        """Close the channels (fire-and-forget requests still queued get up to
        FIRE_AND_FORGET_LINGER_MS to go out) and the transport if it is the connection's own."""
        if self._closed:
            return
        self._closed = True
        self._drop_request_channel()
        if self._pipelined is not None:
            self._pipelined.close(linger=True)
            self._pipelined = None
        if self._own_transport:
            self.transport.close()
