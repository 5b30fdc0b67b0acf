"""A synchronous pylog client over pyzmq: admin, producer, partition consumer, group member.

    Connection         one broker, one request in flight; timeouts, retries (connection.py)
    Cluster            METADATA and one connection per broker: where partitions live
                       (cluster.py)
    Admin              create, delete, list and describe topics (admin.py)
    Producer           batches messages per partition, keyed or spread, each to the broker
                       holding its partition (producer.py); send() returns a Delivery
    Delivery           a sent message's handle, shaped like a concurrent.futures.Future:
                       result(timeout) is its offset or raises the error that failed its
                       batch (DeliveryUnknown with ack NONE, which the broker never answers;
                       MaybeStored for a batch sent again after its partition forgot the
                       producer: docs/protocol.md, PRODUCE version 3)
    PartitionConsumer  reads one partition from an offset, a time, earliest or latest
    TopicConsumer      reads every partition of a topic (or some), from the last N messages
                       too, until their end or a time, or on through broker restarts
                       (topic_consumer.py): pylogctl consume
    GroupConsumer      a member of a consumer group, through the group's coordinator, a
                       broker (group.py)
    ZmqTransport       how every client above carries its requests: ZeroMQ sockets by
    MemoryTransport    default, or answered in memory by a played broker, its waits on a
                       fake clock: unit tests with no socket and no thread (transport.py)

broker.aio has the producer, partition consumer and group member on asyncio, with the same
shapes (AsyncProducer, AsyncPartitionConsumer, AsyncGroupConsumer) and this package's rules.

Every client takes any broker of the cluster ("host:port" or "tcp://host:port"; several,
comma-separated, for when one is down) and finds the others from it; none talks to ZooKeeper.

Errors: an error the broker answered with raises its code's own class, both a
broker.errors.BrokerError (its `code`, `name`, `message` and `retriable`) and the class of the
error tree named after it: `except TopicAlreadyExists`, `except UnknownTopicOrPartition`,
`except Unavailable` (PARTITION_UNAVAILABLE and the other retriable codes) all work.
broker.errors.Unavailable alone when no reply came in time, and its broker.errors.ConnectionRefused
at once when nothing listens at a broker's address (a client given several asks the next one
then, without waiting for a timeout; a partition's leader that died is asked again until the
controller names another, within 3 x the timeout). Values and keys are bytes: a str is
a TypeError naming the argument, unless a Producer is given a `serializer` / `key_serializer`.
"""

from broker.client.admin import Admin
from broker.client.batches import Delivery, DeliveryUnknown, MaybeStored, ProduceAck
from broker.client.cluster import Cluster
from broker.client.connection import Connection
from broker.client.consumer import PartitionConsumer
from broker.client.group import GroupConsumer
from broker.client.producer import Producer
from broker.client.records import Record
from broker.client.topic_consumer import Last, TopicConsumer
from broker.client.transport import MemoryTransport, Transport, ZmqTransport
from broker.protocol import Ack

__all__ = [
    "Ack",
    "Admin",
    "Cluster",
    "Connection",
    "Delivery",
    "DeliveryUnknown",
    "GroupConsumer",
    "Last",
    "MaybeStored",
    "MemoryTransport",
    "PartitionConsumer",
    "ProduceAck",
    "Producer",
    "Record",
    "TopicConsumer",
    "Transport",
    "ZmqTransport",
]
