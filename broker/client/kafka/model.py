"""The plain shapes confluent-kafka-python's top-level module and its admin client share
(confluent_kafka._model): enumerations with librdkafka's values, and records the admin client
returns. Nothing here talks to a broker."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from broker.client.kafka import TopicPartition


class ConsumerGroupState(Enum):
    """A group's state as confluent-kafka names it. pylog's coordinator says empty (no
    member), stable (every member owns its target) or reconciling (partitions moving between
    members: COMPLETING_REBALANCING); a group of the paper's protocol is STABLE with members,
    EMPTY without."""

    UNKNOWN = 0
    PREPARING_REBALANCING = 1
    COMPLETING_REBALANCING = 2
    STABLE = 3
    DEAD = 4
    EMPTY = 5


class ConsumerGroupType(Enum):
    """CONSUMER: a group its brokers coordinate (KIP-848's kind); CLASSIC: one run by its
    members through ZooKeeper, the paper's protocol (pylog-mirror's)."""

    UNKNOWN = 0
    CONSUMER = 1
    CLASSIC = 2


class IsolationLevel(Enum):
    """Taken for Kafka's sake: pylog has no transactions, so every message is committed."""

    READ_UNCOMMITTED = 0
    READ_COMMITTED = 1


class ElectionType(Enum):
    PREFERRED = 0
    UNCLEAN = 1


@dataclass
class Node:
    """A broker as the admin client's descriptions name it."""

    id: int
    host: str
    port: int
    rack: str | None = None

    @property
    def id_string(self) -> str:
        return str(self.id)

    def __str__(self) -> str:
        return f"{self.host}:{self.port}/{self.id}"


@dataclass
class ConsumerGroupTopicPartitions:
    """A group and partitions of it: what list_consumer_group_offsets and
    alter_consumer_group_offsets take and return (`topic_partitions` None: every partition
    the group has an offset for)."""

    group_id: str
    topic_partitions: list[TopicPartition] | None = None


@dataclass
class TopicCollection:
    """The topics describe_topics asks about."""

    topic_names: list[str] = field(default_factory=list)


@dataclass
class TopicPartitionInfo:
    """A partition of a TopicDescription: its leader (None: none now), replicas and ISR."""

    id: int
    leader: Node | None
    replicas: list[Node]
    isr: list[Node]
