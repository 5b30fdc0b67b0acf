"""Producer.send returns a Delivery: the message's offset once its batch is acknowledged, or the
error that failed exactly its batch. Against a real broker; offsets checked by fetching back."""

from __future__ import annotations

import pytest

from broker.client import Ack, Admin, Delivery, DeliveryUnknown, PartitionConsumer, Producer
from broker.errors import BrokerError, MessageTooLarge, UnknownTopicOrPartition
from tests.conftest import wait_until
from tests.pylogd import RunningBroker


def create(
    broker: RunningBroker, topic: str, partitions: int = 1, config: dict[str, str] | None = None
) -> None:
    with Admin(broker.endpoint) as admin:
        admin.create_topic(topic, partitions, config)


def stored(broker: RunningBroker, topic: str, partition: int = 0) -> dict[int, bytes]:
    """Offset -> value of every message stored in the partition."""
    with PartitionConsumer(broker.endpoint, topic, partition, stop_at_end=True) as consumer:
        return {message.offset: message.value for message in consumer}


@pytest.mark.parametrize("ack", [Ack.WRITTEN, Ack.FLUSHED], ids=lambda ack: ack.name)
def test_each_delivery_gives_the_offset_its_message_landed_at(
    broker: RunningBroker, topic: str, ack: Ack
) -> None:
    create(broker, topic, partitions=2)
    with Producer(broker.endpoint, topic, ack=ack, batch_messages=3, linger_ms=60_000) as producer:
        sent = {
            b"value-%d" % i + b"x" * i: producer.send(b"value-%d" % i + b"x" * i, partition=i % 2)
            for i in range(11)
        }
        called: list[Delivery] = []
        last = sent[max(sent, key=len)]
        last.add_done_callback(called.append)
        assert not last.done() and not called  # its batch is still open
        producer.flush()
        assert all(delivery.done() for delivery in sent.values())
        assert called == [last]
    # WRITTEN acknowledges before the flush that makes messages readable: wait for it
    wait_until(lambda: sum(len(stored(broker, topic, p)) for p in (0, 1)) == 11)
    landed = {p: stored(broker, topic, p) for p in (0, 1)}
    for value, delivery in sent.items():
        assert landed[delivery.partition][delivery.result(0)] == value
        assert delivery.exception(0) is None
    late: list[Delivery] = []
    last.add_done_callback(late.append)  # done already: called at once
    assert late == [last]


def test_result_sends_the_lingering_batch_and_waits_for_its_offset(
    broker: RunningBroker, topic: str
) -> None:
    create(broker, topic)
    with Producer(broker.endpoint, topic, linger_ms=60_000) as producer:
        first, second = producer.send(b"one"), producer.send(b"two")
        assert not second.done()  # linger holds the batch back for a minute
        offset = second.result(timeout=30)
        assert first.done() and first.result(0) < offset
        assert producer.flush() != []  # its acknowledgement is flush's to return, as before
    assert stored(broker, topic, 0) == {first.result(0): b"one", offset: b"two"}


def test_a_failed_batch_fails_exactly_its_messages_handles(
    broker: RunningBroker, topic: str
) -> None:
    create(broker, topic, partitions=2, config={"max_message_bytes": "1000"})
    with Producer(broker.endpoint, topic, batch_messages=100, linger_ms=60_000) as producer:
        fine = [producer.send(b"fine %d" % i, partition=1) for i in range(3)]
        doomed = [producer.send(b"small", partition=0), producer.send(b"x" * 2000, partition=0)]
        with pytest.raises(MessageTooLarge):
            producer.flush()  # raised to flush's caller, as before
        for delivery in doomed:
            assert isinstance(delivery.exception(0), MessageTooLarge)
            with pytest.raises(MessageTooLarge) as raised:
                delivery.result(0)
            assert isinstance(raised.value, BrokerError)
            assert raised.value.name == "MESSAGE_TOO_LARGE"
        # the other partition's batch was sent before the failed one was, and is still good
        offsets = [delivery.result(timeout=30) for delivery in fine]
    assert stored(broker, topic, 1) == dict(
        zip(offsets, [b"fine 0", b"fine 1", b"fine 2"], strict=True)
    )
    assert stored(broker, topic, 0) == {}  # the failed set was refused whole


def test_a_handle_whose_topic_was_deleted_raises_the_typed_error(
    broker: RunningBroker, topic: str
) -> None:
    create(broker, topic)
    with Producer(broker.endpoint, topic, linger_ms=60_000) as producer:
        kept = producer.send(b"kept")
        assert kept.result(timeout=30) == 0
        lost = producer.send(b"lost")
        with Admin(broker.endpoint) as admin:
            admin.delete_topic(topic)
        with pytest.raises(UnknownTopicOrPartition):
            lost.result(timeout=30)  # the error is the handle's, not raised to another call
        assert isinstance(lost.exception(0), UnknownTopicOrPartition)
        assert kept.exception(0) is None and kept.result(0) == 0
        assert [ack.count for ack in producer.flush()] == [1]  # the batch of `kept`


def test_with_ack_none_a_handle_says_it_cannot_know(broker: RunningBroker, topic: str) -> None:
    create(broker, topic)
    with Producer(broker.endpoint, topic, ack=Ack.NONE, linger_ms=60_000) as producer:
        delivery = producer.send(b"unacknowledged")
        assert not delivery.done()
        with pytest.raises(DeliveryUnknown, match="ack NONE"):
            delivery.result(timeout=30)  # sends its batch, then says so
        assert delivery.done() and delivery.exception(0) is None
