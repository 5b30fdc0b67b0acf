"""AsyncPartitionConsumer against a real pylogd, each test an asyncio.run: the sync consumer's
starts, seek, errors, large messages and damaged data, and long polls that other tasks run
beside or that are cancelled."""

from __future__ import annotations

import asyncio
import datetime
import time

import pytest

from broker.aio import AsyncPartitionConsumer
from broker.client import Admin
from broker.client.consumer import Start
from broker.errors import CorruptSegment, FetchSizeTooSmall, InvalidOffset, OffsetOutOfRange
from broker.log.message import Message, encode_message
from tests.client.test_consumer import (
    SIZE,
    T0,
    TEN,
    first_segment,
    flip_value_byte,
    produce,
    values,
)
from tests.pylogd import RunningBroker


def create(broker: RunningBroker, topic: str) -> None:
    with Admin(broker.endpoint) as admin:
        admin.create_topic(topic)


async def read_all(consumer: AsyncPartitionConsumer) -> list[bytes]:
    async with consumer:
        return [message.value async for message in consumer]


def test_it_starts_at_earliest_latest_an_offset_or_a_time_and_can_seek(
    broker: RunningBroker, topic: str
) -> None:
    create(broker, topic)
    end = produce(broker, topic, b"m0", b"m1", b"m2", b"m3")
    size = len(encode_message(b"m0"))

    def read(start: Start) -> list[bytes]:
        consumer = AsyncPartitionConsumer(broker.endpoint, topic, start=start, stop_at_end=True)
        return asyncio.run(read_all(consumer))

    assert read("earliest") == [b"m0", b"m1", b"m2", b"m3"]
    assert read("latest") == []
    assert read(2 * size) == [b"m2", b"m3"]
    at_t2 = datetime.datetime.fromtimestamp((T0 + 2000) / 1000, datetime.UTC)
    assert read(at_t2) == [b"m2", b"m3"]
    assert read(at_t2 + datetime.timedelta(milliseconds=1)) == [b"m3"]
    with pytest.raises(ValueError, match="use earliest, latest"):
        AsyncPartitionConsumer(broker.endpoint, topic, start="first")  # type: ignore[arg-type]

    async def seek_around() -> None:
        async with AsyncPartitionConsumer(
            broker.endpoint, topic, start="latest", max_wait_ms=0
        ) as consumer:
            assert consumer.position == end
            assert await consumer.poll() == [] and consumer.at_end
            consumer.seek(size)
            polled = await consumer.poll()
            assert values(polled) == [b"m1", b"m2", b"m3"]
            assert [m.offset for m in polled] == [size, 2 * size, 3 * size]
            consumer.seek(size + 1)
            with pytest.raises(InvalidOffset):
                await consumer.poll()
            consumer.seek(end + size)
            with pytest.raises(OffsetOutOfRange):
                await consumer.poll()

    asyncio.run(seek_around())


def test_a_large_message_grows_the_fetch_size_up_to_its_cap(
    broker: RunningBroker, topic: str
) -> None:
    create(broker, topic)
    big = bytes(range(256)) * 1000
    produce(broker, topic, b"small", big, b"after")
    consumer = AsyncPartitionConsumer(broker.endpoint, topic, fetch_bytes=1000, stop_at_end=True)
    assert asyncio.run(read_all(consumer)) == [b"small", big, b"after"]
    assert 256_000 < consumer.fetch_bytes <= 512_000

    async def capped() -> None:
        async with AsyncPartitionConsumer(
            broker.endpoint, topic, fetch_bytes=1000, max_fetch_bytes=4000
        ) as consumer:
            consumer.seek(len(encode_message(b"small")))
            with pytest.raises(FetchSizeTooSmall):
                await consumer.poll()

    asyncio.run(capped())


def test_damaged_data_is_a_clear_error_and_skip_corrupt_reads_past_it(
    broker: RunningBroker, topic: str
) -> None:
    create(broker, topic)
    produce(broker, topic, *TEN)
    flip_value_byte(first_segment(broker, topic), 4)

    async def read() -> None:
        got: list[bytes] = []
        async with AsyncPartitionConsumer(broker.endpoint, topic, stop_at_end=True) as consumer:
            with pytest.raises(CorruptSegment) as raised:
                async for message in consumer:
                    got.append(message.value)
            assert got == TEN[:4]
            assert (raised.value.start, raised.value.end) == (4 * SIZE, 5 * SIZE)
            assert consumer.position == 4 * SIZE
            consumer.seek(raised.value.end)
            assert [m.value async for m in consumer] == TEN[5:]
        skipping = AsyncPartitionConsumer(
            broker.endpoint, topic, stop_at_end=True, skip_corrupt=True
        )
        assert await read_all(skipping) == TEN[:4] + TEN[5:]
        assert skipping.skipped == [(4 * SIZE, 5 * SIZE)]

    asyncio.run(read())


def test_a_long_poll_lets_other_tasks_run_and_a_cancelled_one_moves_nothing(
    broker: RunningBroker, topic: str
) -> None:
    create(broker, topic)

    async def consume() -> tuple[list[Message], float]:
        async with AsyncPartitionConsumer(
            broker.endpoint, topic, start="latest", max_wait_ms=30_000
        ) as consumer:
            with pytest.raises(TimeoutError):
                async with asyncio.timeout(0.2):  # a long poll cancelled: nothing moves
                    await consumer.poll()
            assert consumer.position == 0
            started = time.monotonic()
            polling = asyncio.create_task(consumer.poll())
            await asyncio.to_thread(produce, broker, topic, b"wake up")  # beside the poll
            return await polling, time.monotonic() - started

    polled, elapsed = asyncio.run(consume())
    assert values(polled) == [b"wake up"]
    assert elapsed < 10  # far below max_wait_ms: the reply came with the flush
