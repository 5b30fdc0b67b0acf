"""Record headers end to end on a real broker (format 2, docs/storage.md): producers (sync and
asyncio, compressing or not) send them, consumers and pylogctl read them, and a reader of FETCH
version 1 is served a log up to its first message with headers."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from click.testing import CliRunner

from broker.aio import AsyncPartitionConsumer, AsyncProducer
from broker.client import Admin, Connection, PartitionConsumer, Producer
from broker.client.topic_consumer import TopicConsumer
from broker.errors import UnsupportedFormat
from broker.log.message import iter_messages
from broker.protocol import FetchRequest
from cli.pylogctl import cli
from tests.pylogd import RunningBroker

HEADERS = [("trace-id", b"4bf92f3577b34da6"), ("schema", b"\x00\x00\x00\x07"), ("gone", None)]


@pytest.mark.parametrize("compression", ["none", "zstd"])
def test_headers_come_back_in_order_with_plain_and_headerless_messages(
    broker: RunningBroker, topic: str, compression: str
) -> None:
    with Admin(broker.endpoint) as admin:
        admin.create_topic(topic)
    with Producer(broker.endpoint, topic, batch_messages=4, compression=compression) as producer:
        producer.send(b"plain")
        producer.send(b"with", key=b"k", headers=HEADERS)
        producer.send(b"mapping", headers={"a": b"1", "b": None})
        producer.send(b"empty", headers=[])
        producer.send(b"after")
    with PartitionConsumer(broker.endpoint, topic, 0, stop_at_end=True) as consumer:
        read = list(consumer)
    assert [(m.value, m.headers) for m in read] == [
        (b"plain", ()),
        (b"with", tuple(HEADERS)),
        (b"mapping", (("a", b"1"), ("b", None))),
        (b"empty", ()),
        (b"after", ()),
    ]
    assert read[1].key == b"k"
    with TopicConsumer(broker.endpoint, topic) as records:
        assert [r.headers for r in records][1] == tuple(HEADERS)


def test_bad_headers_are_refused_before_anything_is_sent(broker: RunningBroker, topic: str) -> None:
    with Admin(broker.endpoint) as admin:
        admin.create_topic(topic)
    with Producer(broker.endpoint, topic) as producer:
        send: Any = producer.send  # called below with headers its type refuses
        with pytest.raises(TypeError, match="a header's key is a str, not bytes"):
            send(b"v", headers=[(b"k", b"v")])
        with pytest.raises(TypeError, match="the value of header 'k' is bytes or None, not str"):
            send(b"v", headers=[("k", "text")])
        with pytest.raises(TypeError, match="a header is a \\(key, value\\) pair"):
            send(b"v", headers=["k"])
        with pytest.raises(ValueError, match="is over 65535 bytes of UTF-8"):
            producer.send(b"v", headers=[("k" * 70000, b"")])
        assert producer.flush() == []


def test_a_mixed_log_is_read_whole_by_a_new_reader_and_to_its_first_new_message_by_an_old(
    broker: RunningBroker, topic: str
) -> None:
    """Format 1 messages, one with headers, then compressed sets of messages with headers."""
    with Admin(broker.endpoint) as admin:
        admin.create_topic(topic)
    with Producer(broker.endpoint, topic) as producer:
        producer.send(b"one")
        producer.send(b"two")
        producer.send(b"three", headers=[("h", b"v")])
    with Producer(broker.endpoint, topic, batch_messages=3, compression="gzip") as producer:
        for i in range(6):
            producer.send(b"set %d" % i, headers=[("i", b"%d" % i)])
    with PartitionConsumer(broker.endpoint, topic, 0, stop_at_end=True) as consumer:
        read = [(m.value, m.headers) for m in consumer]
    assert read == [
        (b"one", ()),
        (b"two", ()),
        (b"three", (("h", b"v"),)),
        *[(b"set %d" % i, (("i", b"%d" % i),)) for i in range(6)],
    ]
    with Connection(broker.endpoint) as connection:
        old = connection.call(FetchRequest(topic, 0, 0, 1 << 20, 0, 0), version=1)
        assert [m.value for m in iter_messages(old.message_set)] == [b"one", b"two"]
        with pytest.raises(UnsupportedFormat, match="messages with headers"):
            connection.call(FetchRequest(topic, 0, len(old.message_set), 1 << 20, 0, 0), version=1)


def test_the_asyncio_clients_carry_headers(broker: RunningBroker, topic: str) -> None:
    with Admin(broker.endpoint) as admin:
        admin.create_topic(topic)

    async def run() -> list[tuple[bytes, object]]:
        async with AsyncProducer(broker.endpoint, topic) as producer:
            await producer.send(b"a", headers=[("x", b"1")])
            await producer.send(b"b")
        async with AsyncPartitionConsumer(broker.endpoint, topic, 0, stop_at_end=True) as consumer:
            return [(m.value, m.headers) async for m in consumer]

    assert asyncio.run(run()) == [(b"a", (("x", b"1"),)), (b"b", ())]


def test_pylogctl_produces_and_prints_headers(broker: RunningBroker, topic: str) -> None:
    env = {"PYLOG_BROKER": broker.endpoint}
    runner = CliRunner()
    assert runner.invoke(cli, ["topic", "create", topic], env=env).exit_code == 0
    sent = runner.invoke(
        cli,
        ["produce", topic, "--header", "source=web", "--header", "schema=7"],
        input="hello\nworld\n",
        env=env,
    )
    assert sent.exit_code == 0, sent.output
    shown = runner.invoke(cli, ["consume", topic, "--format", "%v %h\\n"], env=env)
    assert shown.output.splitlines() == ["hello source=web,schema=7", "world source=web,schema=7"]
    as_json = runner.invoke(cli, ["consume", topic, "--format", "json"], env=env)
    first = json.loads(as_json.output.splitlines()[0])
    assert first["headers"] == [["source", "web"], ["schema", "7"]]
    bad = runner.invoke(cli, ["produce", topic, "--header", "novalue"], input="x\n", env=env)
    assert bad.exit_code == 2 and "'novalue' is not KEY=VALUE" in bad.output
