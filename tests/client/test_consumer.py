"""PartitionConsumer against a real pylogd: where it starts, seek, large messages, long polls."""

from __future__ import annotations

import datetime
import threading
import time

import pytest

from broker.client import Ack, Admin, PartitionConsumer, Producer
from broker.client.consumer import Start
from broker.errors import BrokerError
from broker.log.message import Message, encode_message
from tests.pylogd import RunningBroker

T0 = 1_700_000_000_000


def produce(broker: RunningBroker, topic: str, *values: bytes, t0: int = T0) -> int:
    """Produce `values` with timestamps t0, t0 + 1000, ...; the high watermark after them."""
    with Producer(broker.endpoint, topic, ack=Ack.FLUSHED) as producer:
        for i, value in enumerate(values):
            producer.send(value, timestamp_ms=t0 + 1000 * i)
        acks = producer.flush()
    return acks[-1].base_offset + sum(len(encode_message(v)) for v in values[-acks[-1].count :])


def values(messages: list[Message]) -> list[bytes]:
    return [message.value for message in messages]


def test_a_consumer_starts_at_earliest_latest_an_offset_or_a_time_and_can_seek(
    broker: RunningBroker, topic: str
) -> None:
    with Admin(broker.endpoint) as admin:
        admin.create_topic(topic)
    end = produce(broker, topic, b"m0", b"m1", b"m2", b"m3")
    size = len(encode_message(b"m0"))
    assert end == 4 * size

    def read(start: Start) -> list[bytes]:
        with PartitionConsumer(broker.endpoint, topic, start=start, stop_at_end=True) as c:
            return values(list(c))

    assert read("earliest") == [b"m0", b"m1", b"m2", b"m3"]
    assert read("latest") == []
    assert read(2 * size) == [b"m2", b"m3"]
    at_t2 = datetime.datetime.fromtimestamp((T0 + 2000) / 1000, datetime.UTC)
    assert read(at_t2) == [b"m2", b"m3"]
    assert read(at_t2 - datetime.timedelta(milliseconds=1)) == [b"m2", b"m3"]
    assert read(at_t2 + datetime.timedelta(milliseconds=1)) == [b"m3"]

    with PartitionConsumer(broker.endpoint, topic, start="latest", max_wait_ms=0) as consumer:
        assert consumer.position == end
        assert consumer.poll() == [] and consumer.at_end
        consumer.seek(size)
        polled = consumer.poll()
        assert values(polled) == [b"m1", b"m2", b"m3"]
        assert [m.offset for m in polled] == [size, 2 * size, 3 * size]
        assert consumer.position == end and consumer.high_watermark == end
        consumer.seek(size + 1)
        with pytest.raises(BrokerError) as raised:
            consumer.poll()
        assert raised.value.name == "INVALID_OFFSET"
        consumer.seek(end + size)
        with pytest.raises(BrokerError) as raised:
            consumer.poll()
        assert raised.value.name == "OFFSET_OUT_OF_RANGE"


def test_a_message_larger_than_the_fetch_size_is_read_by_growing_the_fetch_size(
    broker: RunningBroker, topic: str
) -> None:
    with Admin(broker.endpoint) as admin:
        admin.create_topic(topic)
    big = bytes(range(256)) * 1000  # 256 000 bytes
    produce(broker, topic, b"small", big, b"after")
    with PartitionConsumer(broker.endpoint, topic, fetch_bytes=1000, stop_at_end=True) as c:
        assert values(list(c)) == [b"small", big, b"after"]
        assert 256_000 < c.fetch_bytes <= 512_000
    with (
        PartitionConsumer(broker.endpoint, topic, fetch_bytes=1000, max_fetch_bytes=4000) as c,
        pytest.raises(BrokerError) as raised,
    ):
        c.seek(len(encode_message(b"small")))
        c.poll()
    assert raised.value.name == "FETCH_SIZE_TOO_SMALL"


def test_a_long_poll_returns_as_soon_as_a_message_arrives(
    broker: RunningBroker, topic: str
) -> None:
    with Admin(broker.endpoint) as admin:
        admin.create_topic(topic)
    polled: list[Message] = []
    with PartitionConsumer(broker.endpoint, topic, start="latest", max_wait_ms=30_000) as c:
        started = time.monotonic()
        poller = threading.Thread(target=lambda: polled.extend(c.poll()))
        poller.start()
        produce(broker, topic, b"wake up")
        poller.join(timeout=20)
        elapsed = time.monotonic() - started
    assert values(polled) == [b"wake up"]
    assert elapsed < 10  # far below max_wait_ms: the reply came with the flush, not the timeout


def test_an_empty_partition_read_to_its_end_yields_nothing_at_once(
    broker: RunningBroker, topic: str
) -> None:
    with Admin(broker.endpoint) as admin:
        admin.create_topic(topic)
    started = time.monotonic()
    with PartitionConsumer(broker.endpoint, topic, max_wait_ms=30_000, stop_at_end=True) as c:
        assert list(c) == []
    assert time.monotonic() - started < 10


def test_the_next_fetch_is_on_its_way_while_a_poll_decodes_and_a_seek_leaves_it_unused(
    broker: RunningBroker, topic: str
) -> None:
    with Admin(broker.endpoint) as admin:
        admin.create_topic(topic)
    names = [b"m%d" % i for i in range(5)]
    produce(broker, topic, *names)
    size = len(encode_message(b"m0"))
    with PartitionConsumer(broker.endpoint, topic, fetch_bytes=size, max_wait_ms=0) as consumer:
        assert values(consumer.poll()) == [b"m0"]
        # More is stored past it: the fetch of m1 was sent before m0 was decoded.
        assert consumer.connection.pipelined_socket.poll(5000)
        assert values(consumer.poll()) == [b"m1"]
        consumer.seek(0)  # the fetch sent ahead (of m2) is not for this position
        assert values(consumer.poll()) == [b"m0"]
        rest = [consumer.poll() for _ in range(4)]
        assert [values(batch) for batch in rest] == [[b"m1"], [b"m2"], [b"m3"], [b"m4"]]
        assert [batch[0].offset for batch in rest] == [size, 2 * size, 3 * size, 4 * size]
        assert consumer.at_end
        assert not consumer.connection.pipelined_socket.poll(100)  # nothing sent past the end
