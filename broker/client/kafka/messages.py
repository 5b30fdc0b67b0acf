"""confluent-kafka's records of the Kafka-shaped client: logical offsets, TopicPartition, Message
(and a produced message's delivery report), and the cluster's metadata as list_topics gives it."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Final, cast

from broker.client.batches import Batch
from broker.client.cluster import Cluster
from broker.client.kafka.errors import KafkaError, KafkaException, error_of
from broker.errors import PylogError
from broker.protocol import OffsetsRequest

OFFSET_BEGINNING: Final = -2
"""confluent-kafka's logical offset of a partition's first message (its log start here)."""
OFFSET_END: Final = -1
"""confluent-kafka's logical offset past a partition's last message (its high watermark)."""
OFFSET_STORED: Final = -1000
"""confluent-kafka's logical offset of a partition's committed offset."""
OFFSET_INVALID: Final = -1001
"""The offset of a message whose offset is not known (confluent-kafka's value): acks 0."""
TIMESTAMP_CREATE_TIME: Final = 1
"""A message's timestamp type (confluent-kafka's value): pylog timestamps are the producer's."""


class TopicPartition:
    """A partition of a topic, with an offset where one is meant (the offset to read next),
    as confluent-kafka's: `topic`, `partition`, `offset`, `error`."""

    __slots__ = ("error", "offset", "partition", "topic")

    def __init__(self, topic: str, partition: int = -1, offset: int = OFFSET_INVALID) -> None:
        self.topic = topic
        self.partition = partition
        self.offset = offset
        self.error: KafkaError | None = None

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, TopicPartition):
            return NotImplemented
        return (self.topic, self.partition) == (other.topic, other.partition)

    def __hash__(self) -> int:
        return hash((self.topic, self.partition))

    def __lt__(self, other: TopicPartition) -> bool:
        return (self.topic, self.partition) < (other.topic, other.partition)

    def __repr__(self) -> str:
        return (
            f"TopicPartition{{topic={self.topic},partition={self.partition},offset={self.offset}}}"
        )


class Message(tuple[Any, ...]):
    """A message read or delivered, with confluent-kafka's accessors. A tuple underneath, of a
    group member's Record's layout (topic, partition, offset, timestamp_ms, key, value,
    headers, next_offset), so that a consumer's are made straight from the fetched bytes
    (broker.log.codec.decode_records) with nothing between; read it through its accessors."""

    __slots__ = ()

    @classmethod
    def of(
        cls,
        topic: str,
        partition: int,
        offset: int,
        key: Any,
        value: Any,
        timestamp_ms: int,
        headers: Iterable[tuple[str, bytes | None]] | None,
        next_offset: int = OFFSET_INVALID,
    ) -> Message:
        fields = (topic, partition, offset, timestamp_ms, key, value, tuple(headers or ()))
        return tuple.__new__(cls, (*fields, next_offset))

    def topic(self) -> str:
        return cast(str, self[0])

    def partition(self) -> int:
        return cast(int, self[1])

    def offset(self) -> int:
        """The message's offset: its byte position in the partition (not a count)."""
        return cast(int, self[2])

    def next_offset(self) -> int:
        """Where the next message starts: the offset to commit to have read this one (pylog's
        own; Kafka's is offset() + 1)."""
        return cast(int, self[7])

    def key(self) -> Any:
        return self[4]

    def value(self) -> Any:
        return self[5]

    def headers(self) -> list[tuple[str, bytes | None]] | None:
        return list(self[6]) or None

    def timestamp(self) -> tuple[int, int]:
        return TIMESTAMP_CREATE_TIME, self[3]

    def error(self) -> KafkaError | None:
        return None

    def __len__(self) -> int:
        """The value's length, as confluent-kafka's (not the tuple's)."""
        value = self[5]
        return 0 if value is None else len(value)

    def __repr__(self) -> str:
        return f"Message(topic={self[0]!r}, partition={self[1]}, offset={self[2]})"


DeliveryCallback = Callable[[KafkaError | None, Message], object]
PENDING_FIELDS = 6
"""The items a message produced holds in its batch's `Unreported` until reported."""


class Unreported:
    """The messages of one batch produced and not yet reported, flat in `items`,
    PENDING_FIELDS each: its callback, where it starts in the batch (its delivery's parts:
    broker.client.batches.Handle), key, value, timestamp, headers. Flat, so that a message
    waiting for its ack is references in a list, not an object of its own: with a tuple
    each, the garbage collector walked every message in flight, a tenth of the producer's
    time over 100 partitions (perf/README.md, "Keyed traffic over many partitions")."""

    __slots__ = ("batch", "items")

    def __init__(self, batch: Batch) -> None:
        self.batch = batch
        self.items: list[Any] = []


class Event(Message):
    """An event a Consumer hands out as confluent-kafka's do, a Message with an error():
    the end of a partition reached (enable.partition.eof), at `offset()`."""

    __slots__ = ()

    @classmethod
    def partition_eof(cls, topic: str, partition: int, end: int) -> Event:
        error = KafkaError(
            KafkaError._PARTITION_EOF, f"{topic} [{partition}] reached end at offset {end}"
        )
        return tuple.__new__(cls, (topic, partition, end, 0, None, None, (), end, error))

    def error(self) -> KafkaError | None:
        return cast(KafkaError, self[8])


@dataclass
class BrokerMetadata:
    """A broker of ClusterMetadata (confluent_kafka.admin's)."""

    id: int
    host: str
    port: int

    def __str__(self) -> str:
        return f"{self.host}:{self.port}/{self.id}"


@dataclass
class PartitionMetadata:
    """A partition of TopicMetadata (confluent_kafka.admin's): its leader (-1: none), replicas,
    in-sync replicas (`isrs`) and error (None, or why it is not served now)."""

    id: int
    leader: int
    replicas: list[int]
    isrs: list[int]
    error: KafkaError | None = None

    def __str__(self) -> str:
        return str(self.id)


@dataclass
class TopicMetadata:
    """A topic of ClusterMetadata (confluent_kafka.admin's)."""

    topic: str
    partitions: dict[int, PartitionMetadata]
    error: KafkaError | None = None

    def __str__(self) -> str:
        return self.topic


@dataclass
class ClusterMetadata:
    """What `list_topics` returns (confluent_kafka.admin's): the brokers and the topics asked
    for (every topic when none was). pylog has no cluster id, and METADATA does not name the
    controller: `cluster_id` None, `controller_id` -1."""

    brokers: dict[int, BrokerMetadata] = field(default_factory=dict)
    topics: dict[str, TopicMetadata] = field(default_factory=dict)
    cluster_id: str | None = None
    controller_id: int = -1
    orig_broker_id: int = -1
    orig_broker_name: str | None = None


def list_topics(cluster: Cluster, topic: str | None) -> ClusterMetadata:
    """METADATA of `topic` (every topic when None), as confluent-kafka's list_topics gives it;
    KafkaException when no broker answers."""
    try:
        reply = cluster.metadata(() if topic is None else (topic,))
    except PylogError as error:
        raise KafkaException(error) from None
    return ClusterMetadata(
        brokers={b.broker_id: BrokerMetadata(b.broker_id, b.host, b.port) for b in reply.brokers},
        topics={
            info.topic: TopicMetadata(
                info.topic,
                {
                    p.partition: PartitionMetadata(
                        p.partition,
                        p.broker_id,
                        list(p.replicas),
                        list(p.isr),
                        error_of(p.error_code, f"{info.topic}-{p.partition} is not served now"),
                    )
                    for p in info.partitions
                },
                error_of(info.error_code, f"topic {info.topic!r}"),
            )
            for info in reply.topics
        },
    )


def offset_at(cluster: Cluster, topic: str, partition: int, time: int) -> int:
    """OFFSETS of `partition` of `topic` at `time` (EARLIEST, LATEST or ms), from its leader."""
    return cluster.call_leader(OffsetsRequest(topic, partition, time), 3).offset
