"""What a client's connection to one broker does without I/O, shared by the blocking one
(broker.client.connection) and asyncio's (broker.aio.connection): the broker's address, the
frames and correlation ids of requests, how long a reply may take, the retry rule of a call,
and a quota's throttling said in the log."""

from __future__ import annotations

import logging
import re
from typing import Final, TypeVar

from broker.backoff import Backoff
from broker.clock import Clock
from broker.errors import BrokerError, ConnectionRefused, Unavailable
from broker.log.message import Buffer
from broker.protocol import (
    CREATE_WAIT_S,
    PRODUCE_IDEMPOTENT_VERSION,
    Ack,
    CreateTopicRequest,
    FetchRequest,
    MultiFetchRequest,
    ProduceRequest,
    Reply,
    Request,
    RequestHeader,
    encode_produce,
    encode_request,
    request_version,
)
from broker.ratelog import RateLimitedLog
from broker.security import ClientKeys

DEFAULT_CLIENT_ID: Final = "pylog-python"
THROTTLE_LOG_EVERY_S: Final = 10.0
"""A client says that a broker held its requests back for a quota at most this often."""
THROTTLE_LOGGER: Final = "pylog.client.quota"
"""The logger that says a broker held this client's requests back for its quota."""
_throttle_log: Final = RateLimitedLog(logging.getLogger(THROTTLE_LOGGER), THROTTLE_LOG_EVERY_S)
ReplyT = TypeVar("ReplyT", bound=Reply)


def noted(reply: ReplyT) -> ReplyT:
    """`reply`, said in the log (WARNING, at most once every THROTTLE_LOG_EVERY_S) when it is
    a PRODUCE or FETCH reply whose broker held its request back for a quota (throttle_ms):
    this client sends more than its operator's quota allows, and is slowed to it."""
    throttle_ms = getattr(reply, "throttle_ms", 0)
    if throttle_ms:
        _throttle_log.log(
            logging.WARNING,
            "throttled",
            f"the broker held a request back {throttle_ms} ms: this client is over its quota "
            "of bytes a second (pylogctl quota describe), and is slowed to it",
        )
    return reply


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


def wait_ms(given: int | None, default: int) -> int:
    """A poll's `max_wait_ms`: `given` (milliseconds, an int), or `default` for None. A float
    is a TypeError: `poll(1.0)`, written as a timeout in seconds, would wait 1 ms."""
    if given is None:
        return default
    if type(given) is not int:
        raise TypeError(
            f"max_wait_ms is milliseconds, an int, not {given!r}: poll(1000) waits up to a "
            "second (broker.client.kafka's Consumer.poll takes seconds)"
        )
    return given


def retriable(error: BrokerError | Unavailable) -> bool:
    """Whether a request that met `error` may succeed when sent again: no reply in time, or a
    retriable code answered."""
    return not isinstance(error, BrokerError) or error.retriable


class Retry:
    """The retry rule of `call` (and of broker.aio's): after a retriable error, wait 0.1 s
    doubling to 2 s, at most `retries` times, no retry starting after `max_time_s` from now
    on `clock`. A refused connection (ConnectionRefused, known at once) counts as one of the
    `retries`, unless `refusals_within_time`: then it is tried again within the time alone, as
    a call to a partition's leader does (Cluster.call_leader): a leader that died refuses until the
    controller names another, which takes its ZooKeeper session's timeout."""

    def __init__(
        self, retries: int, max_time_s: float, clock: Clock, *, refusals_within_time: bool = False
    ) -> None:
        self.refusals_within_time = refusals_within_time
        self.left = retries
        self.clock = clock
        self.deadline = clock.monotonic() + max_time_s
        self.backoff = Backoff(RETRY_BACKOFF_S, MAX_RETRY_BACKOFF_S)

    def wait_after(self, error: BrokerError | Unavailable) -> float:
        """How long to wait before trying again after `error`; raises `error` itself when it
        is not retriable or the budget is spent."""
        if (
            not retriable(error)
            or (self.left <= 0 and self._counted(error))
            or self.clock.monotonic() + self.backoff.current_s > self.deadline
        ):
            raise error
        if self._counted(error):
            self.left -= 1
        return self.backoff.next()

    def _counted(self, error: BrokerError | Unavailable) -> bool:
        return not (self.refusals_within_time and isinstance(error, ConnectionRefused))


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

    def _no_reply(self, request: Request, timeout_s: float) -> Unavailable:
        """The error of a request that got no reply within `timeout_s` (a failed handshake
        is AuthenticationFailed, from the socket's monitor, a client without keys at a Curve
        broker's too)."""
        return Unavailable(
            f"no reply from {self.endpoint} within {timeout_s:g} s to {request.api.name} "
            "(broker down or unreachable?)"
        )

    def _correlation_id(self) -> int:
        correlation_id = self._next_correlation_id
        self._next_correlation_id = correlation_id % _MAX_CORRELATION_ID + 1
        return correlation_id

    def _frames(self, request: Request, version: int | None = None) -> tuple[int, list[Buffer]]:
        """The correlation id and frames of `request`, asked at api_version `version`
        (default: protocol.request_version)."""
        if version is None:
            version = request_version(request.api)
        correlation_id = self._correlation_id()
        if isinstance(request, ProduceRequest):
            require_bytes("ProduceRequest.message_set", request.message_set)
            if version == PRODUCE_IDEMPOTENT_VERSION:  # a producer's every batch: one join
                return correlation_id, encode_produce(correlation_id, self.client_id, request)
        header = RequestHeader(request.api, version, correlation_id, self.client_id)
        return correlation_id, encode_request(header, request)

    def _reply_timeout_s(self, request: Request) -> float:
        """How long to wait for the reply to `request`: the timeout, plus what the broker may
        hold it by design: a FETCH's or MULTI_FETCH's max_wait_ms, a CREATE_TOPIC's
        CREATE_WAIT_S (the broker answers once every partition is served: 10,000 new partitions
        took it 10 s). ValueError for a PRODUCE with ack NONE, which gets none."""
        if isinstance(request, ProduceRequest) and request.ack is Ack.NONE:
            raise ValueError("a PRODUCE with ack NONE gets no reply: use send_nowait")
        if isinstance(request, FetchRequest | MultiFetchRequest):
            return self.timeout_s + request.max_wait_ms / 1000
        if isinstance(request, CreateTopicRequest):
            return self.timeout_s + CREATE_WAIT_S
        return self.timeout_s
