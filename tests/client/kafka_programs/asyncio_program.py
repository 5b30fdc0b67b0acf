"""A program written the way confluent-kafka-python's examples/asyncio_example.py is, without
its transactions (pylog has none): an AIOProducer sends batches of concurrent produce calls
and awaits their deliveries, while an AIOConsumer in a group, its rebalance callbacks async
and calling back into it, stores and commits what it read
(`asyncio_program.py BOOTSTRAP TOPIC GROUP BATCHES`)."""

import asyncio
import sys

from confluent_kafka.aio import AIOConsumer, AIOProducer

assigned = asyncio.Event()


async def run_producer(broker, topic, batches):
    producer = AIOProducer({"bootstrap.servers": broker}, max_workers=5)
    try:
        await assigned.wait()
        for batch in range(batches):
            produce_futures = [
                await producer.produce(
                    topic=topic, key=f"testkey{i}", value=f"testvalue{batch}-{i}"
                )
                for i in range(10)
            ]
            await producer.flush()
            delivered = await asyncio.gather(*produce_futures)
            print(f"Produced batch {batch}: {len(delivered)} delivered")
    finally:
        await producer.close()


async def run_consumer(broker, topic, group, expected):
    consumer = AIOConsumer(
        {
            "bootstrap.servers": broker,
            "group.id": group,
            "auto.offset.reset": "latest",
            "enable.auto.commit": "false",
            "enable.auto.offset.store": "false",
        }
    )

    async def on_assign(consumer, partitions):
        await consumer.incremental_assign(partitions)
        await consumer.pause(partitions)
        await consumer.resume(partitions)
        print(f"on_assign {len(partitions)} partitions")
        assigned.set()

    async def on_revoke(consumer, partitions):
        await consumer.commit()

    seen = []
    try:
        await consumer.subscribe([topic], on_assign=on_assign, on_revoke=on_revoke)
        while len(seen) < expected:
            message = await consumer.poll(1.0)
            if message is None:
                continue
            if message.error():
                print(f"Error: {message.error()}")
                continue
            seen.append(message.value().decode())
            await consumer.store_offsets(message=message)
            if len(seen) % 10 == 0:
                position = await consumer.position(await consumer.assignment())
                await consumer.commit()
                print(f"Committed at {len(seen)}: {len(position)} positions")
    finally:
        await consumer.unsubscribe()
        await consumer.close()
    print(f"Consumed {len(seen)} distinct {len(set(seen))}")


async def main():
    broker, topic, group, batches = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    await asyncio.gather(
        run_producer(broker, topic, batches), run_consumer(broker, topic, group, 10 * batches)
    )


asyncio.run(main())
