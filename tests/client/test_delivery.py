"""Producer.send returns a Delivery, shaped like a concurrent.futures.Future of the message's
offset or of the error that failed its batch. Against a real broker."""

from __future__ import annotations

import pytest

from broker.client import Ack, Admin, PartitionConsumer, Producer
from broker.client.producer import Delivery
from broker.errors import BrokerError, UnknownTopicOrPartition
from tests.pylogd import RunningBroker


def create(broker: RunningBroker, topic: str) -> None:
    with Admin(broker.endpoint) as admin:
        admin.create_topic(topic)


def stored_offsets(broker: RunningBroker, topic: str) -> list[int]:
    with PartitionConsumer(broker.endpoint, topic, 0, stop_at_end=True) as consumer:
        return [message.offset for message in consumer]


def test_flush_settles_every_delivery_with_its_message_offset(
    broker: RunningBroker, topic: str
) -> None:
    create(broker, topic)
    with Producer(broker.endpoint, topic, batch_messages=3, linger_ms=60_000) as producer:
        deliveries = [producer.send(b"v" * i) for i in range(8)]
        called: list[Delivery] = []
        deliveries[-1].add_done_callback(called.append)
        assert not deliveries[-1].done() and not called  # the last batch is still open
        producer.flush()
        assert all(d.done() for d in deliveries)
        assert called == [deliveries[-1]]
    assert [d.result(0) for d in deliveries] == stored_offsets(broker, topic)


def test_result_sends_the_open_batch_and_waits_for_its_offset(
    broker: RunningBroker, topic: str
) -> None:
    create(broker, topic)
    with Producer(broker.endpoint, topic, linger_ms=60_000) as producer:
        first, second = producer.send(b"one"), producer.send(b"two")
        assert not second.done()
        assert second.result(timeout=30) == stored_offsets(broker, topic)[1]
        assert first.done() and first.exception() is None
    with Producer(broker.endpoint, topic, ack=Ack.NONE) as producer:
        assert producer.send(b"unacknowledged").result(timeout=30) is None


def test_a_delivery_to_a_partition_gone_raises_the_typed_error(
    broker: RunningBroker, topic: str
) -> None:
    create(broker, topic)
    with Producer(broker.endpoint, topic, linger_ms=60_000) as producer:
        assert producer.partitions == 1  # the layout is known: the send batches at once
        lost = producer.send(b"lost", partition=0)
        with Admin(broker.endpoint) as admin:
            admin.delete_topic(topic)
        with pytest.raises(UnknownTopicOrPartition) as raised:
            lost.result(timeout=30)
        assert isinstance(raised.value, BrokerError)
        assert raised.value.name == "UNKNOWN_TOPIC_OR_PARTITION"
        assert isinstance(lost.exception(0), UnknownTopicOrPartition)
        assert producer.flush() == []  # the error is the delivery's: nothing else is pending
