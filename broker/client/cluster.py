"""Where a topic's partitions live: METADATA, and one connection per broker.

A cluster is reached through one or more bootstrap endpoints ("host:port" or
"tcp://host:port", several separated by commas); METADATA from any broker names every broker
and, for each partition of a topic, its leader, leader epoch, replicas and in-sync replicas
(version 2; a broker that answers UNSUPPORTED_VERSION is asked version 1 from then on, which
names one broker per partition and no replicas: docs/protocol.md, "METADATA"). Requests for a
partition go to its leader's connection, opened on first use and kept. When a broker cannot be
reached, METADATA is asked of the other brokers last heard of, then of the bootstrap
endpoints.

Leadership moves (docs/replication.md): `call_leader` sends a partition's request (FETCH,
OFFSETS, DESCRIBE_PARTITION) to the leader last heard of, and after a retriable error
(NOT_LEADER_FOR_PARTITION above all, or no reply in time) learns where the leader is now and
sends it again, waiting 0.1 s doubling to 2 s in between, bounded as Connection.call is
(`retries`, and 3 x the timeout). A NOT_LEADER_FOR_PARTITION naming a broker this client
knows, with a leader epoch at least that of the leader last heard of, is taken as it is (the
next attempt goes there); any other error makes the next attempt ask METADATA first.

Not safe to share between threads.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Final, Generic, TypeVar, overload

from broker.client.connection import Connection
from broker.client.framing import DEFAULT_CLIENT_ID, Retry, normalize_endpoint
from broker.client.transport import Transport, ZmqTransport
from broker.clock import WaitingClock
from broker.errors import (
    BrokerError,
    BrokerUnsupportedVersion,
    NotLeaderForPartition,
    PylogError,
    Unavailable,
)
from broker.lifecycle import Closing
from broker.log.message import Buffer
from broker.protocol import (
    DescribePartitionReply,
    DescribePartitionRequest,
    ErrorCode,
    FetchReply,
    FetchRequest,
    MetadataReply,
    MetadataRequest,
    OffsetsReply,
    OffsetsRequest,
    PartitionInfo,
    Reply,
    TopicInfo,
    broker_error,
)
from broker.security import ClientKeys

METADATA_VERSION: Final = 2
"""The METADATA version asked first (leaders, epochs, replicas, ISR); 1 of a broker that
answered it UNSUPPORTED_VERSION."""
PartitionRequest = FetchRequest | OffsetsRequest | DescribePartitionRequest
"""The requests that go to a partition's leader by `call_leader`."""


C = TypeVar("C")
T = TypeVar("T")


def split_endpoints(endpoints: str | Sequence[str]) -> list[str]:
    """ "tcp://a:1,b:2" (or a list of such strings) as a list of endpoints, each
    "tcp://host:port"; ValueError for an address of another form (normalize_endpoint)."""
    parts = [endpoints] if isinstance(endpoints, str) else list(endpoints)
    found = [normalize_endpoint(e) for part in parts for e in part.split(",") if e.strip()]
    if not found:
        raise ValueError(f"no broker endpoint in {endpoints!r}")
    return found


SILENT_S: Final = 30.0
"""How long a broker that gave no reply is asked METADATA after the others."""


def topic_info(reply: MetadataReply, topic: str) -> TopicInfo:
    """`topic` in a METADATA reply. Its error code, if it has one, as the BrokerError it names,
    with a message that says what it means for this topic: UNKNOWN_TOPIC_OR_PARTITION when it
    does not exist, AUTHORIZATION_FAILED when this client's principal may not see it."""
    for info in reply.topics:
        if info.topic == topic:
            if info.error_code != ErrorCode.NONE:
                known = _TOPIC_ERRORS.get(info.error_code, "topic {topic!r}")
                raise broker_error(info.error_code, known.format(topic=topic))
            return info
    raise broker_error(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"no metadata for {topic!r}")


_TOPIC_ERRORS: Final[dict[int, str]] = {
    ErrorCode.UNKNOWN_TOPIC_OR_PARTITION: "topic {topic!r} does not exist",
    ErrorCode.AUTHORIZATION_FAILED: (
        "topic {topic!r}: this client's principal is not authorized to see it (describe, "
        "which every operation grants: pylogctl acl add; docs/security.md)"
    ),
}
"""What a topic's error code in a METADATA reply means for the topic (topic_info)."""


def topic_partitions(reply: MetadataReply, topic: str) -> tuple[PartitionInfo, ...]:
    """Every partition of `topic` in a METADATA reply, in order; topic_info's errors."""
    return tuple(sorted(topic_info(reply, topic).partitions, key=lambda p: p.partition))


def partition_of(partitions: Sequence[PartitionInfo], topic: str, partition: int) -> PartitionInfo:
    """`partition` of `topic`'s `partitions`; BrokerError UNKNOWN_TOPIC_OR_PARTITION when the
    topic has no such partition."""
    if not 0 <= partition < len(partitions):
        raise broker_error(
            ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
            f"topic {topic!r} has partitions 0 to {len(partitions) - 1}, not {partition}",
        )
    return partitions[partition]


class Connections(Generic[C]):
    """A cluster's connections (shared with broker.aio's): one per endpoint, made by `open` on
    first use, until `close` hands them all over to be closed (ValueError after that)."""

    def __init__(self, open: Callable[[str], C]) -> None:
        self._open = open
        self._by_endpoint: dict[str, C] = {}
        self.closed = False

    def get(self, endpoint: str) -> C:
        connection = self._by_endpoint.get(endpoint)
        if connection is None:
            if self.closed:
                raise ValueError("the cluster connection is closed")
            connection = self._by_endpoint[endpoint] = self._open(endpoint)
        return connection

    def close(self) -> list[C]:
        """Every connection made, to be closed by the caller; none after this."""
        self.closed = True
        return list(self._by_endpoint.values())


@dataclass(frozen=True, slots=True)
class MetadataCall:
    """A step of BrokerMap.metadata_steps: send `request` at `version` to `endpoint`, and
    send the reply back in (or throw the BrokerError or Unavailable it raised)."""

    endpoint: str
    request: MetadataRequest
    version: int


@dataclass(frozen=True, slots=True)
class Pause:
    """A step of BrokerMap.metadata_steps: wait `seconds` (a back-off), then send None in."""

    seconds: float


MetadataSteps = Generator[MetadataCall | Pause, MetadataReply | None, MetadataReply]
"""The METADATA rules as steps, without I/O: the sync and asyncio clusters each drive them with
their own sends and sleeps (as h11 leaves the sockets to its users)."""


def advance(
    steps: MetadataSteps,
    answer: MetadataReply | None = None,
    failure: BrokerError | Unavailable | None = None,
) -> MetadataCall | Pause | MetadataReply:
    """The next step of `steps`, given the last one's outcome (its reply, or the error it
    raised, thrown in), or the reply they end with."""
    try:
        return steps.send(answer) if failure is None else steps.throw(failure)
    except StopIteration as done:
        learnt: MetadataReply = done.value
        return learnt


class BrokerMap:
    """What a cluster knows without I/O (shared with broker.aio's): the bootstrap endpoints,
    the brokers last heard of, and whom to ask METADATA next (`metadata_steps`)."""

    def __init__(
        self,
        bootstrap: str | Sequence[str],
        client_id: str,
        timeout_s: float,
        retries: int,
        keys: ClientKeys | None,
        clock: WaitingClock,
    ) -> None:
        self.bootstrap = split_endpoints(bootstrap) if bootstrap else []
        """Where to ask METADATA when no broker is known yet (may be empty for a user that
        sets `endpoints` itself, as the group consumer does from ZooKeeper)."""
        self.client_id = client_id
        self.timeout_s = timeout_s
        self.retries = retries
        self.keys = keys
        """What every connection presents to brokers serving CurveZMQ (None: plaintext)."""
        self.clock = clock
        """The clock of the waits between METADATA rounds and of `silent`."""
        self.endpoints: dict[int, str] = {}
        """Broker id -> endpoint, from the last METADATA reply."""
        self.leaders: dict[tuple[str, int], PartitionInfo] = {}
        """(topic, partition) -> the partition as last heard of: from METADATA, its leader
        (broker_id) changed by a NOT_LEADER_FOR_PARTITION that named one (`learn_from`)."""
        self.metadata_v1: set[str] = set()
        """The endpoints that answered METADATA version 2 UNSUPPORTED_VERSION: asked version 1."""
        self.silent: dict[str, float] = {}
        """The endpoints that last gave no reply (a broker down), and when (on `clock`)."""

    def metadata_steps(self, topics: Iterable[str]) -> MetadataSteps:
        """METADATA for `topics` (every topic when empty), from the first broker that answers:
        those last heard of, then the bootstrap endpoints; version 2, or 1 of a broker that
        answered version 2 UNSUPPORTED_VERSION. Each round asks each broker once (a dead one is
        not asked again at once), then pauses as Retry says; raises the last error when the
        budget is spent, Unavailable when no endpoint is known."""
        request = MetadataRequest(tuple(topics))
        retry = Retry(self.retries, 3 * self.timeout_s, self.clock)
        while True:
            error: BrokerError | Unavailable | None = None
            for endpoint in self._metadata_candidates():
                try:
                    try:
                        version = self._metadata_version(endpoint)
                        reply = yield MetadataCall(endpoint, request, version)
                    except BrokerError as failure:
                        if not self._older_broker(endpoint, failure):
                            raise
                        reply = yield MetadataCall(endpoint, request, 1)
                except (BrokerError, Unavailable) as failure:
                    error = self._no_metadata(endpoint, failure)
                    continue
                assert reply is not None
                self.silent.pop(endpoint, None)
                return self._learn(reply)
            if error is None:
                raise Unavailable("no broker endpoint known to ask METADATA of")
            yield Pause(retry.wait_after(error))

    def _metadata_candidates(self) -> list[str]:
        """Whom to ask METADATA, in order: the brokers last heard of, then the bootstrap; those
        silent within the last SILENT_S last, so that a dead broker costs one timeout, not one
        each time."""
        candidates = list(dict.fromkeys([*self.endpoints.values(), *self.bootstrap]))
        now = self.clock.monotonic()
        silent = {e for e, at in self.silent.items() if now - at < SILENT_S}
        return sorted(candidates, key=lambda endpoint: endpoint in silent)

    def note_silent(self, endpoint: str) -> None:
        """`endpoint` gave no reply in time: a broker down, as far as METADATA goes."""
        self.silent[endpoint] = self.clock.monotonic()

    def _no_metadata(
        self, endpoint: str, failure: BrokerError | Unavailable
    ) -> BrokerError | Unavailable:
        """Note that `endpoint` did not answer METADATA (`failure`); raise it unless retriable
        (another broker may answer), else return it."""
        if isinstance(failure, BrokerError) and not failure.retriable:
            raise failure
        if not isinstance(failure, BrokerError):
            self.note_silent(endpoint)
        return failure

    def _metadata_version(self, endpoint: str) -> int:
        return 1 if endpoint in self.metadata_v1 else METADATA_VERSION

    def _older_broker(self, endpoint: str, error: BrokerError | Unavailable) -> bool:
        """Whether `error`, answered by `endpoint` to METADATA version 2, says that it speaks
        only version 1 (then noted: it is asked version 1 from now on)."""
        if isinstance(error, BrokerUnsupportedVersion) and endpoint not in self.metadata_v1:
            self.metadata_v1.add(endpoint)
            return True
        return False

    def _learn(self, reply: MetadataReply) -> MetadataReply:
        self.endpoints = {b.broker_id: f"tcp://{b.host}:{b.port}" for b in reply.brokers}
        for topic in reply.topics:
            for info in topic.partitions:
                self.leaders[topic.topic, info.partition] = info
        return reply

    def _known_leader(self, topic: str, partition: int) -> int | None:
        """The leader of `partition` of `topic` as last heard of, if it is served by a known
        broker; None: ask METADATA."""
        info = self.leaders.get((topic, partition))
        if info is None or info.error_code != ErrorCode.NONE:
            return None
        if info.broker_id not in self.endpoints:
            return None
        return info.broker_id

    def _leader_of(self, partitions: Sequence[PartitionInfo], topic: str, partition: int) -> int:
        """The leader of `partition` among a topic's fresh `partitions`: BrokerError
        UNKNOWN_TOPIC_OR_PARTITION for no such partition, the partition's error (retriable
        PARTITION_UNAVAILABLE, ...) while it is not served, PARTITION_UNAVAILABLE for a leader
        not registered."""
        info = partition_of(partitions, topic, partition)
        if info.error_code != ErrorCode.NONE:
            raise broker_error(
                info.error_code, f"partition {partition} of {topic!r} is not served now"
            )
        if info.broker_id not in self.endpoints:
            raise self._no_broker(info.broker_id)
        return info.broker_id

    def learn_from(
        self, topic: str, partition: int, error: PylogError, endpoint: str | None = None
    ) -> None:
        """What a request for `partition` of `topic` that failed with `error` tells of its
        leader: a NOT_LEADER_FOR_PARTITION naming a known broker, with a leader epoch not older
        than the one last heard of, moves the partition's leader there; any other error
        forgets the partition (the next request for it asks METADATA). No reply at all from
        `endpoint` (the broker asked) makes it silent: asked METADATA after the others."""
        if endpoint is not None and isinstance(error, Unavailable):
            self.note_silent(endpoint)
        key = (topic, partition)
        info = self.leaders.get(key)
        if (
            isinstance(error, NotLeaderForPartition)
            and error.leader in self.endpoints
            and (info is None or error.leader_epoch >= info.leader_epoch)
        ):
            base = info if info is not None else PartitionInfo(partition, error.leader)
            self.leaders[key] = replace(
                base, broker_id=error.leader, leader_epoch=error.leader_epoch, error_code=0
            )
        else:
            self.leaders.pop(key, None)

    def _no_broker(self, broker_id: int) -> BrokerError:
        return broker_error(
            ErrorCode.PARTITION_UNAVAILABLE, f"broker {broker_id} is not registered (down?)"
        )


class Cluster(BrokerMap, Closing):
    """The brokers reachable from `bootstrap`, and connections to them, all over one
    `transport` (broker.client.transport; default: a ZmqTransport of the cluster's own, closed
    with it), whose clock times the waits. `keys` (broker.security.ClientKeys) go to every
    connection: each broker is then reached over CurveZMQ (docs/security.md)."""

    def __init__(
        self,
        bootstrap: str | Sequence[str],
        client_id: str = DEFAULT_CLIENT_ID,
        timeout_s: float = 10.0,
        retries: int = 3,
        *,
        keys: ClientKeys | None = None,
        transport: Transport | None = None,
    ) -> None:
        self._own_transport = transport is None
        self.transport: Transport = ZmqTransport() if transport is None else transport
        super().__init__(bootstrap, client_id, timeout_s, retries, keys, self.transport.clock)
        self._connections = Connections(
            lambda endpoint: Connection(
                endpoint, self.client_id, self.timeout_s, self.transport, keys=self.keys
            )
        )

    def connect(self, endpoint: str) -> Connection:
        """The connection to `endpoint`, opened on first use."""
        return self._connections.get(endpoint)

    def ask_any(self, ask: Callable[[Connection], T]) -> T:
        """`ask(connection)`, a call any broker answers for the whole cluster, of each
        bootstrap broker in turn until one answers. Raises a refusal that no retry changes at
        once, and the last error when none answers."""
        error: BrokerError | Unavailable | None = None
        for endpoint in self.bootstrap:
            try:
                return ask(self.connect(endpoint))
            except (BrokerError, Unavailable) as failure:
                if isinstance(failure, BrokerError) and not failure.retriable:
                    raise
                error = failure
        assert error is not None
        raise error

    def connection(self, broker_id: int) -> Connection:
        """The connection to broker `broker_id` (known from METADATA)."""
        endpoint = self.endpoints.get(broker_id)
        if endpoint is None:
            self.metadata(())
            endpoint = self.endpoints.get(broker_id)
        if endpoint is None:
            raise self._no_broker(broker_id)
        return self.connect(endpoint)

    def metadata(self, topics: Iterable[str]) -> MetadataReply:
        """METADATA for `topics` (every topic when empty), as BrokerMap.metadata_steps asks
        it. Raises the last error when no broker answers."""
        steps = self.metadata_steps(topics)
        step = advance(steps)
        while not isinstance(step, MetadataReply):
            if isinstance(step, Pause):
                self.clock.sleep(step.seconds)
                step = advance(steps)
                continue
            connection = self.connect(step.endpoint)
            try:
                reply = connection.call(step.request, 0, version=step.version)
            except (BrokerError, Unavailable) as error:
                step = advance(steps, failure=error)
            else:
                step = advance(steps, reply)
        return step

    def partitions(self, topic: str) -> tuple[PartitionInfo, ...]:
        """Every partition of `topic`, in order, with its holder and whether it is served
        (error_code). BrokerError UNKNOWN_TOPIC_OR_PARTITION when the topic does not exist."""
        return topic_partitions(self.metadata([topic]), topic)

    def connection_for(self, topic: str, partition: int) -> Connection:
        """The connection to the leader of `partition` of `topic`, from METADATA asked now."""
        return self.connection(self._leader_of(self.partitions(topic), topic, partition))

    def known_leader_connection(self, topic: str, partition: int) -> Connection | None:
        """The connection to the leader of `partition` of `topic` as last heard of; None when
        none is known (no METADATA is asked)."""
        leader = self._known_leader(topic, partition)
        return None if leader is None else self.connection(leader)

    def leader_connection(self, topic: str, partition: int) -> Connection:
        """The connection to the leader of `partition` of `topic` as last heard of (METADATA
        is asked when none is known). Raises as `connection_for`."""
        leader = self._known_leader(topic, partition)
        if leader is None:
            return self.connection_for(topic, partition)
        return self.connection(leader)

    @overload
    def call_leader(
        self, request: FetchRequest, retries: int, version: int | None = ...
    ) -> FetchReply: ...
    @overload
    def call_leader(
        self, request: OffsetsRequest, retries: int, version: int | None = ...
    ) -> OffsetsReply: ...
    @overload
    def call_leader(
        self, request: DescribePartitionRequest, retries: int, version: int | None = ...
    ) -> DescribePartitionReply: ...
    def call_leader(
        self, request: PartitionRequest, retries: int, version: int | None = None
    ) -> Reply:
        """`request` (at api_version `version`, default protocol.request_version's) sent to
        its partition's leader, and after a retriable error (the broker
        is not the leader any more, is down, the partition not served yet) sent again to the
        leader found then (`learn_from`), up to `retries` more times within 3 x the timeout,
        waiting 0.1 s doubling to 2 s in between (Retry). Raises the last error as it was,
        and a non-retriable one at once (UNKNOWN_TOPIC_OR_PARTITION for a partition that does
        not exist, ...). A refused connection (a leader that died, still named until the
        controller moves its partitions) is tried again within the time, not counted."""
        retry = Retry(retries, 3 * self.timeout_s, self.clock, refusals_within_time=True)
        while True:
            endpoint = None
            try:
                connection = self.leader_connection(request.topic, request.partition)
                endpoint = connection.endpoint
                reply: Reply = connection.call(request, 0, version=version)
                return reply
            except (BrokerError, Unavailable) as error:
                wait_s = retry.wait_after(error)
                self.learn_from(request.topic, request.partition, error, endpoint)
            self.clock.sleep(wait_s)

    def receive_pipelined(
        self, connections: Iterable[Connection], timeout_s: float
    ) -> tuple[Connection, int, list[Buffer]]:
        """The next reply on any of `connections` (requests sent with send_pipelined): the
        connection, the correlation id and the frames. Unavailable when none comes in time."""
        if len(by_channel := {c.pipelined_channel: c for c in connections}) == 1:
            (connection,) = by_channel.values()  # one broker: no poller to build
            return (connection, *connection.receive_pipelined(timeout_s))
        ready = self.transport.wait_any(by_channel, timeout_s)
        if ready is None:
            endpoints = ", ".join(c.endpoint for c in by_channel.values())
            raise Unavailable(f"no reply from {endpoints} within {timeout_s:g} s")
        connection = by_channel[ready]
        return (connection, *connection.receive_pipelined(0))

    def close(self) -> None:
        """Close every connection (fire-and-forget requests get their linger) and the transport
        if it is the cluster's own."""
        if self._connections.closed:
            return
        for connection in self._connections.close():
            connection.close()
        if self._own_transport:
            self.transport.close()
