"""str where bytes are due: a TypeError at the call that names the argument, or, with an explicit
serializer given to the Producer, the text encoded by it. Against a real broker."""

from __future__ import annotations

import json

import pytest

from broker.client import Ack, Admin, Connection, PartitionConsumer, Producer
from broker.protocol import ProduceRequest
from tests.pylogd import RunningBroker


def read_all(broker: RunningBroker, topic: str) -> list[tuple[bytes | None, bytes]]:
    with PartitionConsumer(broker.endpoint, topic, 0, stop_at_end=True) as consumer:
        return [(bytes(m.key) if m.key is not None else None, bytes(m.value)) for m in consumer]


def test_str_value_or_key_is_a_type_error_naming_it_and_nothing_is_sent(
    broker: RunningBroker, topic: str
) -> None:
    with Admin(broker.endpoint) as admin:
        admin.create_topic(topic)
    with Producer(broker.endpoint, topic, batch_messages=1) as producer:
        with pytest.raises(TypeError, match=r"^Producer.send: value must be bytes, not str"):
            producer.send("hello")
        with pytest.raises(
            TypeError, match=r"^Producer.send: key must be bytes, not str: encode it"
        ):
            producer.send(b"hello", key="user-1")
        with pytest.raises(TypeError, match=r"value must be bytes, not int"):
            producer.send(42)
        producer.send(bytearray(b"buffers"), key=memoryview(b"are bytes"))
    assert read_all(broker, topic) == [(b"are bytes", b"buffers")]
    with Connection(broker.endpoint) as connection:
        request = ProduceRequest(topic, 0, Ack.FLUSHED, "text")  # type: ignore[arg-type]
        with pytest.raises(TypeError, match=r"ProduceRequest.message_set must be bytes, not str"):
            connection.request(request)
        with pytest.raises(TypeError, match=r"ProduceRequest.message_set must be bytes, not str"):
            connection.send_nowait(ProduceRequest(topic, 0, Ack.NONE, "text"))  # type: ignore[arg-type]
    assert read_all(broker, topic) == [(b"are bytes", b"buffers")]


def test_serializers_encode_values_and_keys(broker: RunningBroker, topic: str) -> None:
    with Admin(broker.endpoint) as admin:
        admin.create_topic(topic)
    with Producer(
        broker.endpoint,
        topic,
        serializer=lambda value: json.dumps(value).encode(),
        key_serializer=str.encode,
    ) as producer:
        producer.send({"clicks": 3}, key="user-1")
        producer.send("plain", key=None)  # no key: the key serializer is not called
    wrong = Producer(broker.endpoint, topic, serializer=str)  # type: ignore[arg-type]
    with wrong, pytest.raises(TypeError, match=r"^Producer.send: the serializer's result must"):
        wrong.send("x")
    assert read_all(broker, topic) == [(b"user-1", b'{"clicks": 3}'), (None, b'"plain"')]
