"""AsyncProducer against a real pylogd, each test an asyncio.run: the offsets its deliveries
give are where the messages landed (fetched back), a failed batch fails exactly its messages,
linger is a timer, and cancelled waits leave batches in flight to land."""

from __future__ import annotations

import asyncio

import pytest

from broker.aio import AsyncDelivery, AsyncProducer
from broker.client import Ack, Admin, DeliveryUnknown
from broker.errors import MessageTooLarge, PylogError, UnknownTopicOrPartition
from tests.client.test_delivery import create, stored
from tests.conftest import wait_until
from tests.pylogd import RunningBroker


@pytest.mark.parametrize("ack", [Ack.WRITTEN, Ack.FLUSHED], ids=lambda ack: ack.name)
def test_each_delivery_gives_the_offset_its_message_landed_at(
    broker: RunningBroker, topic: str, ack: Ack
) -> None:
    create(broker, topic, partitions=3)
    values = [b"value %d " % i + bytes(range(i)) for i in range(40)]

    async def produce() -> list[tuple[bytes, AsyncDelivery]]:
        async with AsyncProducer(
            broker.endpoint, topic, ack=ack, batch_messages=7, linger_ms=60_000, max_in_flight=2
        ) as producer:
            sent = [
                (v, await producer.send(v, key=b"key-%d" % (i % 5))) for i, v in enumerate(values)
            ]
            acks = await producer.flush()
            assert sum(a.count for a in acks) == len(values)
            assert producer.messages_sent == len(values)
            return sent

    sent = asyncio.run(produce())
    wait_until(lambda: sum(len(stored(broker, topic, p)) for p in range(3)) == len(values))
    landed = {p: stored(broker, topic, p) for p in range(3)}
    for value, delivery in sent:
        assert delivery.done()
        assert landed[delivery.partition][asyncio.run(delivery.result(0))] == value


def test_a_failed_batch_fails_exactly_its_messages_and_flush_raises_it(
    broker: RunningBroker, topic: str
) -> None:
    create(broker, topic, partitions=2, config={"max_message_bytes": "1000"})

    async def produce() -> tuple[list[int], list[PylogError | None]]:
        async with AsyncProducer(broker.endpoint, topic, linger_ms=60_000) as producer:
            fine = [await producer.send(b"fine %d" % i, partition=1) for i in range(3)]
            doomed = [
                await producer.send(b"small", partition=0),
                await producer.send(b"x" * 2000, partition=0),
            ]
            with pytest.raises(MessageTooLarge):
                await producer.flush()
            errors = [await delivery.exception() for delivery in doomed]
            with pytest.raises(MessageTooLarge):
                await doomed[0]
            return [await delivery for delivery in fine], errors

    offsets, errors = asyncio.run(produce())
    assert all(isinstance(error, MessageTooLarge) for error in errors)
    assert stored(broker, topic, 1) == dict(
        zip(offsets, [b"fine 0", b"fine 1", b"fine 2"], strict=True)
    )
    assert stored(broker, topic, 0) == {}


def test_linger_is_a_timer_and_await_sends_an_open_batch(broker: RunningBroker, topic: str) -> None:
    create(broker, topic)

    async def produce() -> tuple[int, int]:
        async with AsyncProducer(broker.endpoint, topic, linger_ms=50) as producer:
            lingering = await producer.send(b"sent by the linger timer")
            async with asyncio.timeout(30):
                while not lingering.done():  # nothing else is sent: the timer sends it
                    await asyncio.sleep(0.01)
        async with AsyncProducer(broker.endpoint, topic, linger_ms=60_000) as producer:
            waited = await producer.send(b"sent by await")
            return await lingering, await asyncio.wait_for(waited, 30)

    first, second = asyncio.run(produce())
    assert stored(broker, topic) == {first: b"sent by the linger timer", second: b"sent by await"}


def test_a_cancelled_flush_leaves_its_batches_to_land_once(
    broker: RunningBroker, topic: str
) -> None:
    create(broker, topic)

    async def produce() -> list[int]:
        async with AsyncProducer(
            broker.endpoint, topic, batch_messages=5, linger_ms=60_000
        ) as producer:
            deliveries = [await producer.send(b"m%d" % i) for i in range(23)]
            flushing = asyncio.create_task(producer.flush())
            await asyncio.sleep(0)  # flush has started: every batch is sent
            flushing.cancel()
            with pytest.raises(asyncio.CancelledError):
                await flushing
            with pytest.raises(TimeoutError):
                async with asyncio.timeout(0):  # a wait cancelled at once
                    await deliveries[-1]
            acks = await producer.flush()
            assert sum(a.count for a in acks) == 23
            return [await delivery for delivery in deliveries]

    offsets = asyncio.run(produce())
    assert stored(broker, topic) == {o: b"m%d" % i for i, o in enumerate(offsets)}


def test_a_deleted_topic_fails_the_handle_with_the_typed_error(
    broker: RunningBroker, topic: str
) -> None:
    create(broker, topic)

    async def produce() -> None:
        async with AsyncProducer(broker.endpoint, topic, linger_ms=60_000) as producer:
            kept = await producer.send(b"kept")
            assert await kept == 0
            lost = await producer.send(b"lost")
            with Admin(broker.endpoint) as admin:
                admin.delete_topic(topic)
            with pytest.raises(UnknownTopicOrPartition):
                await lost.result(timeout=30)
            assert isinstance(await lost.exception(), UnknownTopicOrPartition)
            with pytest.raises(UnknownTopicOrPartition):
                await producer.flush()  # raised once, by flush, as the sync producer does
            assert [ack.count for ack in await producer.flush()] == [1]  # the batch of `kept`

    asyncio.run(produce())


def test_ack_none_and_str_values_are_refused_plainly(broker: RunningBroker, topic: str) -> None:
    create(broker, topic)

    async def produce() -> None:
        async with AsyncProducer(broker.endpoint, topic, ack=Ack.NONE) as producer:
            with pytest.raises(TypeError, match="value must be bytes, not str"):
                await producer.send("text")
            delivery = await producer.send(b"unacknowledged")
            with pytest.raises(DeliveryUnknown, match="ack NONE"):
                await delivery
            assert delivery.done() and await delivery.exception() is None
        async with AsyncProducer(broker.endpoint, topic, serializer=str.encode) as producer:
            await producer.send("text, encoded")

    asyncio.run(produce())
    wait_until(
        lambda: sorted(stored(broker, topic).values()) == [b"text, encoded", b"unacknowledged"]
    )
