"""A synchronous pylog client over pyzmq: admin, producer, partition consumer.

    Connection         one broker, one request in flight; timeouts, retries (connection.py)
    Admin              create, delete, list and describe topics (admin.py)
    Producer           batches messages per partition, keyed or spread (producer.py)
    PartitionConsumer  reads one partition from an offset, a time, earliest or latest

Errors: broker.errors.BrokerError for an error the broker answered with (its `name` and
`retriable`), broker.errors.Unavailable when no reply came in time.
"""

from broker.client.admin import Admin
from broker.client.connection import Connection
from broker.client.consumer import PartitionConsumer
from broker.client.producer import ProduceAck, Producer
from broker.protocol import Ack

__all__ = ["Ack", "Admin", "Connection", "PartitionConsumer", "ProduceAck", "Producer"]
