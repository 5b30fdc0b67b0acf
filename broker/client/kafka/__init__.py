"""The Python client in the shape of confluent-kafka-python, for programs written for Kafka.

A program that uses confluent-kafka's common subset runs against pylog with its import changed
to `from broker.client.kafka import Consumer, KafkaError, KafkaException, Producer,
TopicPartition` (docs/clients.md): the dictionary configuration, `Producer.produce / poll /
flush`, `Consumer.subscribe / poll / consume / commit / seek / assignment / position`, the
delivery callback `on_delivery(err, msg)` and messages read with `msg.value()`,
`msg.offset()`, `msg.error()`. Underneath are this package's Producer and GroupConsumer, with
their rules (at-least-once delivery, offsets as byte positions).

Configuration keys keep Kafka's meaning where pylog has the same concept; any other key is
refused at construction with KafkaException naming it and the keys taken (a key with no
pylog meaning is never silently dropped). The differences a Kafka user meets:

- Offsets are byte positions, not consecutive numbers: commit `msg.offset()` + 1 is wrong;
  commit the message (`commit(message=msg)`) or `TopicPartition(topic, partition,
  offset_after)` where `offset_after` is `position()`'s answer, or the next message's offset.
- The producer sends keyless messages to partitions in turn and keyed ones by their key's
  hash (pylog's partitioner, not Kafka's murmur2: the same key does not land on the
  partition Kafka would choose).
- `enable.idempotence` is true by default (as in Kafka's Java client since 3.0; librdkafka's
  default is false): a batch sent again is stored once, across leader changes too
  (docs/protocol.md, PRODUCE version 3). With `acks` 0 it is off, and true is refused.
- Each topic produced to has connections of its own; callbacks run in `poll()` and `flush()`,
  in the calling thread, as in confluent-kafka.

The package's modules: producer (Producer), consumer (Consumer), messages (TopicPartition,
Message, the logical offsets, the cluster's metadata), errors (KafkaError, KafkaException),
settings (the keys each client takes, checked), all re-exported here; beside them
`broker.client.kafka.admin` (AdminClient and its records), `broker.client.kafka.aio`
(AIOProducer, AIOConsumer) and `broker.client.kafka.model` (the records and enumerations both
share, re-exported here). What pylog does not have (transactions, share groups, manual
assignment) is refused in one line: docs/clients.md, "What pylog does not have".
"""

from __future__ import annotations

from broker.client.kafka.consumer import Consumer, ShareConsumer
from broker.client.kafka.errors import (
    NO_TRANSACTIONS,
    ConcurrentModificationException,
    IllegalStateException,
    KafkaError,
    KafkaException,
)
from broker.client.kafka.messages import (
    OFFSET_BEGINNING,
    OFFSET_END,
    OFFSET_INVALID,
    OFFSET_STORED,
    TIMESTAMP_CREATE_TIME,
    BrokerMetadata,
    ClusterMetadata,
    DeliveryCallback,
    Message,
    PartitionMetadata,
    TopicMetadata,
    TopicPartition,
)
from broker.client.kafka.model import (
    ConsumerGroupState,
    ConsumerGroupTopicPartitions,
    ConsumerGroupType,
    ElectionType,
    IsolationLevel,
    Node,
    TopicCollection,
    TopicPartitionInfo,
)
from broker.client.kafka.producer import Producer
from broker.client.kafka.settings import CONSUMER_KEYS, PRODUCER_KEYS

__all__ = [
    "CONSUMER_KEYS",
    "NO_TRANSACTIONS",
    "OFFSET_BEGINNING",
    "OFFSET_END",
    "OFFSET_INVALID",
    "OFFSET_STORED",
    "PRODUCER_KEYS",
    "TIMESTAMP_CREATE_TIME",
    "BrokerMetadata",
    "ClusterMetadata",
    "ConcurrentModificationException",
    "Consumer",
    "ConsumerGroupState",
    "ConsumerGroupTopicPartitions",
    "ConsumerGroupType",
    "DeliveryCallback",
    "ElectionType",
    "IllegalStateException",
    "IsolationLevel",
    "KafkaError",
    "KafkaException",
    "Message",
    "Node",
    "PartitionMetadata",
    "Producer",
    "ShareConsumer",
    "TopicCollection",
    "TopicMetadata",
    "TopicPartition",
    "TopicPartitionInfo",
]

# Tracebacks, reprs and pickles name the classes where programs import them from (a Kafka
# program's `except KafkaException` reads broker.client.kafka.KafkaException), not the module of
# this package that defines them.
for _public in (
    ConcurrentModificationException,
    Consumer,
    IllegalStateException,
    KafkaError,
    KafkaException,
    Message,
    Producer,
    ShareConsumer,
    TopicPartition,
):
    _public.__module__ = __name__
