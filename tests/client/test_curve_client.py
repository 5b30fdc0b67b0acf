"""Every client takes Curve keys (issue 16): through a CurveZMQ server with a ZAP handler
(tests/client/curve.py: a Curve front relaying to a real pylogd), a client with the right keys
gets through, and one with an unknown key, a wrong broker key or no keys gets no reply."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from broker.aio import AsyncPartitionConsumer, AsyncProducer
from broker.client import Admin, Connection, PartitionConsumer, Producer, TopicConsumer
from broker.errors import Unavailable
from broker.protocol import Api, MetadataRequest
from broker.security import ClientKeys, generate_keys, load_key_pair
from tests.client.curve import CurveRelay, curve_relay
from tests.pylogd import RunningBroker

SHORT_TIMEOUT_S = 0.5


@pytest.fixture
def relay(broker: RunningBroker, tmp_path: Path) -> Iterator[tuple[CurveRelay, ClientKeys]]:
    with curve_relay(broker.endpoint, tmp_path / "keys") as running:
        yield running


def test_producer_and_consumers_with_keys_get_through_a_curve_server(
    relay: tuple[CurveRelay, ClientKeys], topic: str
) -> None:
    server, keys = relay
    with Admin(server.endpoint, keys=keys) as admin:
        admin.create_topic(topic, 2)
    with Producer(server.endpoint, topic, partitioner="round_robin", keys=keys) as producer:
        offsets = [producer.send(b"m-%d" % i).result(10) for i in range(4)]
    assert len(offsets) == 4
    with PartitionConsumer(server.endpoint, topic, 1, stop_at_end=True, keys=keys) as consumer:
        assert [m.value for m in consumer] == [b"m-1", b"m-3"]
    with TopicConsumer(server.endpoint, topic, keys=keys) as every:
        values = set()
        for record in every:
            values.add(record.value)
            if len(values) == 4:
                break
    assert values == {b"m-0", b"m-1", b"m-2", b"m-3"}
    assert {Api.CREATE_TOPIC, Api.PRODUCE, Api.FETCH} <= set(server.relayed)
    assert server.seen and all(seen == (keys.public, True) for seen in server.seen)


def test_asyncio_clients_with_keys_get_through_a_curve_server(
    relay: tuple[CurveRelay, ClientKeys], topic: str
) -> None:
    server, keys = relay
    with Admin(server.endpoint, keys=keys) as admin:
        admin.create_topic(topic)

    async def produce_and_consume() -> list[bytes]:
        async with AsyncProducer(server.endpoint, topic, keys=keys) as producer:
            for i in range(3):
                await (await producer.send(b"a-%d" % i))
        async with AsyncPartitionConsumer(
            server.endpoint, topic, stop_at_end=True, keys=keys
        ) as consumer:
            return [message.value async for message in consumer]

    assert asyncio.run(produce_and_consume()) == [b"a-0", b"a-1", b"a-2"]
    assert server.seen and all(seen == (keys.public, True) for seen in server.seen)


def test_an_unknown_client_key_is_refused_by_the_zap_handler(
    relay: tuple[CurveRelay, ClientKeys], tmp_path: Path
) -> None:
    server, keys = relay
    _, secret = generate_keys(tmp_path / "other", "stranger")
    stranger = ClientKeys.load(secret, keys.broker)
    with (
        Connection(server.endpoint, timeout_s=SHORT_TIMEOUT_S, keys=stranger) as connection,
        pytest.raises(Unavailable, match=r"within 0\.5 s .*this client's key not allowed\?"),
    ):
        connection.request(MetadataRequest())
    assert server.seen and all(seen == (stranger.public, False) for seen in server.seen)
    assert server.relayed == []


def test_a_wrong_broker_key_gets_no_reply(
    relay: tuple[CurveRelay, ClientKeys], tmp_path: Path
) -> None:
    server, keys = relay
    impostor, _ = load_key_pair(generate_keys(tmp_path / "other", "impostor")[1])
    wrong = ClientKeys(keys.public, keys.secret, impostor)
    with (
        Connection(server.endpoint, timeout_s=SHORT_TIMEOUT_S, keys=wrong) as connection,
        pytest.raises(Unavailable, match=r"within 0\.5 s"),
    ):
        connection.request(MetadataRequest())
    # The server could not read the client's HELLO: it never got as far as asking ZAP.
    assert server.seen == [] and server.relayed == []


def test_a_client_without_keys_gets_no_reply(relay: tuple[CurveRelay, ClientKeys]) -> None:
    server, _ = relay
    with (
        Connection(server.endpoint, timeout_s=SHORT_TIMEOUT_S) as connection,
        pytest.raises(Unavailable, match=r"within 0\.5 s .*\(broker down or unreachable\?\)"),
    ):
        connection.request(MetadataRequest())
    with (
        Producer(server.endpoint, "any", timeout_s=SHORT_TIMEOUT_S, retries=0) as producer,
        pytest.raises(Unavailable),
    ):
        producer.partitions  # noqa: B018 (METADATA, refused)
    assert server.seen == [] and server.relayed == []
