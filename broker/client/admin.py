"""Cluster and topic administration: brokers, the cluster's ZooKeeper, topics (create,
delete, list, describe) and their settings (describe, alter live).

Any broker of the cluster takes the calls about the whole cluster (the first bootstrap endpoint
that answers is asked); describe asks each partition's state of its leader, and follows
leadership when it moves meanwhile (NOT_LEADER_FOR_PARTITION: Cluster.call_leader).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

from broker.client.cluster import Cluster, topic_info
from broker.client.connection import Connection
from broker.client.framing import DEFAULT_CLIENT_ID
from broker.client.transport import Transport
from broker.errors import BrokerError, Unavailable
from broker.lifecycle import Closing
from broker.protocol import (
    EARLIEST,
    LATEST,
    AlterConfigRequest,
    ClusterBroker,
    ConfigEntry,
    CreatePartitionsRequest,
    CreateTopicRequest,
    DeleteTopicRequest,
    DescribeClusterReply,
    DescribeClusterRequest,
    DescribeConfigRequest,
    DescribePartitionReply,
    DescribePartitionRequest,
    EmptyReply,
    ErrorCode,
    MetadataReply,
    OffsetsRequest,
    TopicInfo,
)
from broker.security import ClientKeys

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class PartitionOffsets:
    """A partition of a topic, its leader (the broker holding it), and its exact offsets (from
    OFFSETS, asked of that leader); the offsets are None while the partition is not served
    (its broker down, or no leader)."""

    partition: int
    broker_id: int
    log_start_offset: int | None
    high_watermark: int | None


@dataclass(frozen=True, slots=True)
class ZooKeeperAddress:
    """Where a cluster keeps its registry: what GroupConsumer and Registry take."""

    connect: str
    """host:port[,host:port...]"""
    chroot: str
    """The znode the registry lives under, such as "/pylog"."""


def zookeeper_of(
    broker: str,
    *,
    client_id: str = DEFAULT_CLIENT_ID,
    timeout_s: float = 10.0,
    retries: int = 3,
    keys: ClientKeys | None = None,
) -> ZooKeeperAddress:
    """The ZooKeeper ensemble and chroot of the cluster `broker` (one or more, comma-separated)
    belongs to, asked of it (`Admin.zookeeper`)."""
    with Admin(broker, client_id, timeout_s, retries, keys=keys) as admin:
        return admin.zookeeper()


@dataclass(frozen=True, slots=True)
class PartitionDescription:
    """A partition of a topic, its leader `broker_id` (-1: none), and its state on that
    leader (from DESCRIBE_PARTITION); `state` is None while the partition is not served (its
    broker down, or no leader). From METADATA version 2: `leader_epoch` (-1: none known),
    `replicas` (the preferred leader first) and `isr`; -1 and empty from a broker that speaks
    only version 1."""

    partition: int
    broker_id: int
    state: DescribePartitionReply | None
    leader_epoch: int = -1
    replicas: tuple[int, ...] = ()
    isr: tuple[int, ...] = ()


class Admin(Closing):
    """Administer the topics of the cluster that `endpoint` (one or more, comma-separated)
    belongs to. Read-only calls are retried on retriable errors; create and delete are sent
    once (a retry after a lost reply could answer TOPIC_ALREADY_EXISTS or
    UNKNOWN_TOPIC_OR_PARTITION for what did succeed).

    `keys` (broker.security.ClientKeys: the client's key pair and the broker's public key)
    reach brokers serving CurveZMQ (docs/security.md); without them it speaks plaintext.
    `transport` carries the requests (broker.client.transport; default: ZeroMQ sockets)."""

    def __init__(
        self,
        endpoint: str,
        client_id: str = DEFAULT_CLIENT_ID,
        timeout_s: float = 10.0,
        retries: int = 3,
        *,
        keys: ClientKeys | None = None,
        transport: Transport | None = None,
    ) -> None:
        self.cluster = Cluster(
            endpoint, client_id, timeout_s, retries, keys=keys, transport=transport
        )
        self.retries = retries

    def _admin_request(
        self,
        request: CreateTopicRequest
        | DeleteTopicRequest
        | AlterConfigRequest
        | CreatePartitionsRequest,
    ) -> EmptyReply:
        """Send once, to the first bootstrap broker that can be reached."""
        error: Unavailable | None = None
        for endpoint in self.cluster.bootstrap:
            try:
                return self.cluster.connect(endpoint).request(request)
            except Unavailable as failure:
                if isinstance(failure, BrokerError):  # answered (retriable): not another's turn
                    raise
                error = failure
        assert error is not None
        raise error

    def create_topic(
        self, topic: str, partitions: int = 1, config: Mapping[str, str] | None = None
    ) -> None:
        """Create `topic` with `partitions` partitions dealt over the live brokers; `config`
        maps topic settings to decimal text or "none" (docs/protocol.md, CREATE_TOPIC). Returns
        once every partition is served. Raises TopicAlreadyExists, InvalidTopic, ..."""
        self._admin_request(CreateTopicRequest(topic, partitions, dict(config or {})))

    def delete_topic(self, topic: str) -> None:
        """Delete `topic` and its data. Raises UnknownTopicOrPartition (a BrokerError)."""
        self._admin_request(DeleteTopicRequest(topic))

    def add_partitions(self, topic: str, count: int) -> None:
        """Give `topic` `count` partitions in all (CREATE_PARTITIONS): the new ones are placed
        over the brokers up (racks apart, leadership round robin, as in a new topic) and served
        moments after this returns. Sent once (sent again after a lost reply, it could be
        refused for what did succeed). Raises UnknownTopicOrPartition, and InvalidTopic when
        `count` is not more than the partitions it has, or over the maximum, or fewer brokers
        are up than its replication factor."""
        self._admin_request(CreatePartitionsRequest(topic, count))

    def _ask(self, ask: Callable[[Connection], T]) -> T:
        """`ask(connection)`, a read-only call about the whole cluster (Cluster.ask_any)."""
        return self.cluster.ask_any(ask)

    def describe_cluster(self) -> DescribeClusterReply:
        """Every broker of the cluster, up (registered) or down (holding partitions but not
        registered), and the ZooKeeper the cluster uses."""
        return self._ask(lambda c: c.call(DescribeClusterRequest(), self.retries))

    def brokers(self) -> tuple[ClusterBroker, ...]:
        """Every broker of the cluster, by id: up or down, endpoint, version, log dirs and how
        many partitions it holds."""
        return self.describe_cluster().brokers

    def zookeeper(self) -> ZooKeeperAddress:
        """The ZooKeeper connect string and chroot of the cluster, as the broker asked uses
        them: what consumer groups need, learnt from a broker address alone."""
        reply = self.describe_cluster()
        return ZooKeeperAddress(reply.zookeeper_connect, reply.zookeeper_chroot)

    def topic_config(self, topic: str) -> tuple[ConfigEntry, ...]:
        """Every setting of `topic` (key, value as text, whether the topic overrides the
        broker's default). BrokerError UNKNOWN_TOPIC_OR_PARTITION when it does not exist."""
        return self._ask(lambda c: c.call(DescribeConfigRequest(topic), self.retries)).entries

    def alter_topic_config(
        self, topic: str, set: Mapping[str, str] | None = None, delete: Sequence[str] = ()
    ) -> None:
        """Change settings of `topic` live: `set` maps settings to decimal text or "none",
        `delete` names settings that go back to the brokers' defaults. Returns once ZooKeeper
        holds the change; the brokers holding the partitions apply it moments later
        (describe_partition shows the settings in effect). BrokerError INVALID_TOPIC, ..."""
        self._admin_request(AlterConfigRequest(topic, dict(set or {}), tuple(delete)))

    def describe_partition(self, topic: str, partition: int) -> DescribePartitionReply:
        """The state of a partition, asked of its leader (followed when it moves:
        Cluster.call_leader): offsets, size on disk, segments, oldest timestamp and the
        settings in effect."""
        self.cluster.partitions(topic)  # the leaders, fresh
        return self.cluster.call_leader(DescribePartitionRequest(topic, partition), self.retries)

    def describe_partitions(self, topic: str) -> list[PartitionDescription]:
        """The state of every partition of `topic`, each asked of its leader (None for one
        that is not served), with its leader, epoch, replicas and ISR from METADATA (the
        leader as found by the DESCRIBE_PARTITION when leadership moved meanwhile)."""
        described = []
        for partition in self.cluster.partitions(topic):
            number = partition.partition
            state = None
            if partition.error_code == ErrorCode.NONE:
                try:
                    request = DescribePartitionRequest(topic, number)
                    state = self.cluster.call_leader(request, self.retries)
                except (BrokerError, Unavailable) as error:
                    if isinstance(error, BrokerError) and not error.retriable:
                        raise
            now = self.cluster.leaders.get((topic, number), partition)
            described.append(
                PartitionDescription(
                    number,
                    now.broker_id,
                    state,
                    now.leader_epoch,
                    partition.replicas,
                    partition.isr,
                )
            )
        return described

    def metadata(self, topics: Iterable[str] = ()) -> MetadataReply:
        """The brokers, and `topics` (every topic when empty) with their partitions. A topic
        that does not exist comes back with its own error code, not as an exception."""
        return self.cluster.metadata(topics)

    def list_topics(self) -> list[str]:
        """The names of every topic, sorted."""
        return sorted(topic.topic for topic in self.metadata().topics)

    def topic(self, topic: str) -> TopicInfo:
        """`topic` and its partitions; BrokerError UNKNOWN_TOPIC_OR_PARTITION when it does not
        exist, AUTHORIZATION_FAILED when this client may not see it (topic_info)."""
        return topic_info(self.metadata([topic]), topic)

    def describe(self, topic: str) -> list[PartitionOffsets]:
        """Every partition of `topic`, with exact log start offsets and high watermarks asked
        of its leader (followed when it moves: Cluster.call_leader; None for a partition that
        is not served)."""
        described = []
        for partition in self.cluster.partitions(topic):
            number = partition.partition
            offsets: tuple[int | None, int | None] = (None, None)
            if partition.error_code == ErrorCode.NONE:
                try:
                    call = self.cluster.call_leader
                    offsets = (
                        call(OffsetsRequest(topic, number, EARLIEST), self.retries).offset,
                        call(OffsetsRequest(topic, number, LATEST), self.retries).offset,
                    )
                except (BrokerError, Unavailable) as error:
                    if isinstance(error, BrokerError) and not error.retriable:
                        raise
            holder = self.cluster.leaders.get((topic, number), partition).broker_id
            described.append(PartitionOffsets(number, holder, *offsets))
        return described

    def close(self) -> None:
        self.cluster.close()
