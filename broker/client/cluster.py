"""Where a topic's partitions live: METADATA, and one connection per broker.

A cluster is reached through one or more bootstrap endpoints ("host:port" or
"tcp://host:port", several separated by commas); METADATA from any broker names every broker
and, for each partition of a topic, the broker that holds it (docs/protocol.md, "Transport").
Requests for a partition go to that broker's connection, opened on first use and kept. When a
broker cannot be reached, METADATA is asked of the other brokers last heard of, then of the
bootstrap endpoints.

Not safe to share between threads.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import zmq

from broker.client.connection import DEFAULT_CLIENT_ID, Connection, normalize_endpoint, poll_ms
from broker.errors import BrokerError, Unavailable
from broker.lifecycle import Closing
from broker.log.message import Buffer
from broker.protocol import (
    ErrorCode,
    MetadataReply,
    MetadataRequest,
    PartitionInfo,
    broker_error,
)
from broker.security import ClientKeys


def split_endpoints(endpoints: str | Sequence[str]) -> list[str]:
    """ "tcp://a:1,b:2" (or a list of such strings) as a list of endpoints, each
    "tcp://host:port"; ValueError for an address of another form (normalize_endpoint)."""
    parts = [endpoints] if isinstance(endpoints, str) else list(endpoints)
    found = [normalize_endpoint(e) for part in parts for e in part.split(",") if e.strip()]
    if not found:
        raise ValueError(f"no broker endpoint in {endpoints!r}")
    return found


def topic_partitions(reply: MetadataReply, topic: str) -> tuple[PartitionInfo, ...]:
    """Every partition of `topic` in a METADATA reply, in order. BrokerError
    UNKNOWN_TOPIC_OR_PARTITION when the topic does not exist."""
    for info in reply.topics:
        if info.topic == topic:
            if info.error_code != ErrorCode.NONE:
                raise broker_error(info.error_code, f"topic {topic!r} does not exist")
            return tuple(sorted(info.partitions, key=lambda p: p.partition))
    raise broker_error(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"no metadata for {topic!r}")


def partition_of(partitions: Sequence[PartitionInfo], topic: str, partition: int) -> PartitionInfo:
    """`partition` of `topic`'s `partitions`; BrokerError UNKNOWN_TOPIC_OR_PARTITION when the
    topic has no such partition."""
    if not 0 <= partition < len(partitions):
        raise broker_error(
            ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
            f"topic {topic!r} has partitions 0 to {len(partitions) - 1}, not {partition}",
        )
    return partitions[partition]


class BrokerMap:
    """What a cluster knows without I/O (shared with broker.aio's): the bootstrap endpoints,
    the brokers last heard of, and whom to ask METADATA next."""

    def __init__(
        self,
        bootstrap: str | Sequence[str],
        client_id: str,
        timeout_s: float,
        retries: int,
        keys: ClientKeys | None = None,
    ) -> None:
        self.bootstrap = split_endpoints(bootstrap) if bootstrap else []
        """Where to ask METADATA when no broker is known yet (may be empty for a user that
        sets `endpoints` itself, as the group consumer does from ZooKeeper)."""
        self.client_id = client_id
        self.timeout_s = timeout_s
        self.retries = retries
        self.keys = keys
        """What every connection presents to brokers serving CurveZMQ (None: plaintext)."""
        self.endpoints: dict[int, str] = {}
        """Broker id -> endpoint, from the last METADATA reply."""

    def _metadata_candidates(self) -> list[str]:
        """Whom to ask METADATA, in order: the brokers last heard of, then the bootstrap."""
        return list(dict.fromkeys([*self.endpoints.values(), *self.bootstrap]))

    def _learn(self, reply: MetadataReply) -> MetadataReply:
        self.endpoints = {b.broker_id: f"tcp://{b.host}:{b.port}" for b in reply.brokers}
        return reply

    def _no_broker(self, broker_id: int) -> BrokerError:
        return broker_error(
            ErrorCode.PARTITION_UNAVAILABLE, f"broker {broker_id} is not registered (down?)"
        )


class Cluster(BrokerMap, Closing):
    """The brokers reachable from `bootstrap`, and connections to them (sharing one context).
    `keys` (broker.security.ClientKeys) go to every connection: each broker is then reached
    over CurveZMQ (docs/security.md)."""

    def __init__(
        self,
        bootstrap: str | Sequence[str],
        client_id: str = DEFAULT_CLIENT_ID,
        timeout_s: float = 10.0,
        retries: int = 3,
        *,
        keys: ClientKeys | None = None,
    ) -> None:
        super().__init__(bootstrap, client_id, timeout_s, retries, keys)
        self.context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        self._by_endpoint: dict[str, Connection] = {}
        self._closed = False

    def connect(self, endpoint: str) -> Connection:
        """The connection to `endpoint`, opened on first use."""
        connection = self._by_endpoint.get(endpoint)
        if connection is None:
            if self._closed:
                raise ValueError("the cluster connection is closed")
            connection = Connection(
                endpoint, self.client_id, self.timeout_s, self.context, keys=self.keys
            )
            self._by_endpoint[endpoint] = connection
        return connection

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
        """METADATA for `topics` (every topic when empty), from the first broker that answers:
        those last heard of, then the bootstrap endpoints. Raises the last error when none
        does."""
        request = MetadataRequest(tuple(topics))
        error: BrokerError | Unavailable | None = None
        for endpoint in self._metadata_candidates():
            try:
                reply = self.connect(endpoint).call(request, self.retries if not error else 0)
            except (BrokerError, Unavailable) as failure:
                if isinstance(failure, BrokerError) and not failure.retriable:
                    raise
                error = failure
                continue
            return self._learn(reply)
        if error is None:
            raise Unavailable("no broker endpoint known to ask METADATA of")
        raise error

    def partitions(self, topic: str) -> tuple[PartitionInfo, ...]:
        """Every partition of `topic`, in order, with its holder and whether it is served
        (error_code). BrokerError UNKNOWN_TOPIC_OR_PARTITION when the topic does not exist."""
        return topic_partitions(self.metadata([topic]), topic)

    def connection_for(self, topic: str, partition: int) -> Connection:
        """The connection to the broker holding `partition` of `topic`."""
        info = partition_of(self.partitions(topic), topic, partition)
        return self.connection(info.broker_id)

    def receive_pipelined(
        self, connections: Iterable[Connection], timeout_s: float
    ) -> tuple[Connection, int, list[Buffer]]:
        """The next reply on any of `connections` (requests sent with send_pipelined): the
        connection, the correlation id and the frames. Unavailable when none comes in time."""
        if len(by_socket := {c.pipelined_socket: c for c in connections}) == 1:
            (connection,) = by_socket.values()  # one broker: no poller to build
            return (connection, *connection.receive_pipelined(timeout_s))
        poller = zmq.Poller()
        for socket in by_socket:
            poller.register(socket, zmq.POLLIN)
        ready = poller.poll(poll_ms(timeout_s))
        if not ready:
            endpoints = ", ".join(c.endpoint for c in by_socket.values())
            raise Unavailable(f"no reply from {endpoints} within {timeout_s:g} s")
        connection = by_socket[ready[0][0]]
        return (connection, *connection.receive_pipelined(0))

    def close(self) -> None:
        """Close every connection (fire-and-forget requests get their linger) and the context."""
        if self._closed:
            return
        self._closed = True
        for connection in self._by_endpoint.values():
            connection.close()
        self.context.term()
