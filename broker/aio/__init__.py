"""A pylog client on asyncio, for services written on it: the sync client's shapes, awaited.

    AsyncProducer           async with AsyncProducer(...) as p: delivery = await p.send(...);
                            await delivery is the message's offset; await p.flush()
                            (producer.py)
    AsyncDelivery           a sent message's handle: await it, or result(timeout), done(),
                            exception(), add_done_callback(fn)
    AsyncPartitionConsumer  async for message in AsyncPartitionConsumer(...): one partition
                            from an offset, a time, earliest or latest (consumer.py)
    AsyncGroupConsumer      async with AsyncGroupConsumer(...) as member: async for record in
                            member: a member of a consumer group through its coordinator,
                            committing as GroupConsumer does (group.py)
    AsyncConnection         one broker, any number of requests in flight (connection.py)
    AsyncCluster            METADATA and one connection per broker

The sockets are pyzmq's zmq.asyncio ones; what the clients decide without I/O (serializing,
placement, batching, retry budgets and back-off, fetch positions, damaged data, the group's
rebalance and positions) is the sync client's own code (broker.client), so both behave alike:
read broker.client's modules for the rules. The group member's blocking calls (joining,
following a new assignment, commits) run in worker threads (asyncio.to_thread), never on the
event loop; its heartbeats in a thread of its own.

Errors are the sync client's: an error a broker answered with raises its code's own class
(`except TopicAlreadyExists`, `except UnknownTopicOrPartition`, `except Unavailable`), no reply
in time raises broker.errors.Unavailable. Cancelling a task (task.cancel(), asyncio.timeout)
that waits in a client cancels the wait, never a batch in flight nor a group member's
positions: a record is counted as processed only when the next one is asked for, as in the
sync group member.

Each client belongs to the event loop it was first used in.
"""

from broker.aio.connection import AsyncCluster, AsyncConnection
from broker.aio.consumer import AsyncPartitionConsumer
from broker.aio.group import AsyncGroupConsumer
from broker.aio.producer import AsyncDelivery, AsyncProducer

__all__ = [
    "AsyncCluster",
    "AsyncConnection",
    "AsyncDelivery",
    "AsyncGroupConsumer",
    "AsyncPartitionConsumer",
    "AsyncProducer",
]
