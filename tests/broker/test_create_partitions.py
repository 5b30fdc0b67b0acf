"""CREATE_PARTITIONS (docs/protocol.md, api_key 19): a topic given more partitions through a
broker, by any client that speaks the protocol (the Kafka-shaped admin's create_partitions
among them), with no ZooKeeper reachable from the client; and what it refuses, changing
nothing."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from broker.client import Admin, Connection, PartitionConsumer, Producer
from broker.errors import InvalidTopic, UnknownTopicOrPartition
from broker.protocol import (
    Api,
    CreatePartitionsRequest,
    EmptyReply,
    RequestHeader,
    encode_request,
)
from broker.registry import MAX_PARTITIONS
from tests.conftest import wait_until
from tests.pylogd import RunningBroker

ROOT = Path(__file__).parents[2]


def served(admin: Admin, topic: str) -> int:
    """How many partitions of `topic` METADATA shows served."""
    return sum(p.error_code == 0 for p in admin.topic(topic).partitions)


def test_a_topic_given_more_partitions_serves_them_and_they_take_messages(
    broker: RunningBroker, topic: str
) -> None:
    with Admin(broker.endpoint) as admin:
        admin.create_topic(topic, 2)
        admin.add_partitions(topic, 5)
        wait_until(lambda: served(admin, topic) == 5, what="the new partitions served")
    with Producer(broker.endpoint, topic, partitioner="round_robin") as producer:
        offset = producer.send(b"in partition 4", partition=4).result(30)
    with PartitionConsumer(broker.endpoint, topic, 4, stop_at_end=True) as consumer:
        assert [(m.offset, m.value) for m in consumer] == [(offset, b"in partition 4")]


def test_a_request_built_from_the_document_is_answered_with_an_empty_reply(
    broker: RunningBroker, topic: str
) -> None:
    """The frame of docs/protocol.md's table, written by hand: a topic, then a u32 count."""
    with Admin(broker.endpoint) as admin:
        admin.create_topic(topic, 1)
    body = len(topic).to_bytes(2, "big") + topic.encode() + (3).to_bytes(4, "big")
    header = (19).to_bytes(2, "big") + (1).to_bytes(2, "big") + (7).to_bytes(4, "big")
    frame = header + (3).to_bytes(2, "big") + b"raw" + body
    request = CreatePartitionsRequest(topic, 3)
    encoded = encode_request(RequestHeader(Api.CREATE_PARTITIONS, 1, 7, "raw"), request)
    assert [bytes(f) for f in encoded] == [frame]
    with Connection(broker.endpoint) as connection:
        assert connection.request(request) == EmptyReply()
    with Admin(broker.endpoint) as admin:
        wait_until(lambda: served(admin, topic) == 3, what="the new partitions served")


@pytest.mark.parametrize(
    ("count", "error", "says"),
    [
        (2, InvalidTopic, "has 2 partitions"),
        (1, InvalidTopic, "has 2 partitions"),
        (0, InvalidTopic, "count is 0"),
        (MAX_PARTITIONS + 1, InvalidTopic, f"from 1 to {MAX_PARTITIONS}"),
    ],
)
def test_a_count_not_above_what_the_topic_has_or_over_the_most_is_refused_changing_nothing(
    broker: RunningBroker, topic: str, count: int, error: type[Exception], says: str
) -> None:
    with Admin(broker.endpoint) as admin:
        admin.create_topic(topic, 2)
        with pytest.raises(error, match=says):
            admin.add_partitions(topic, count)
        assert len(admin.topic(topic).partitions) == 2


def test_an_unknown_topic_is_refused(broker: RunningBroker) -> None:
    with Admin(broker.endpoint) as admin, pytest.raises(UnknownTopicOrPartition, match="nowhere"):
        admin.add_partitions("nowhere", 3)


def test_the_client_packages_import_no_registry_kazoo_or_trio() -> None:
    """broker.client and broker.aio stand on the protocol alone (issue 55): none of their
    modules imports the registry, kazoo or trio, even inside a function (the Kafka-shaped
    admin's create_partitions did, to write ZooKeeper itself)."""
    forbidden = ("broker.registry", "kazoo", "trio")
    found = []
    for package in ("broker/client", "broker/aio"):
        for path in sorted((ROOT / package).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Import):
                    names = [alias.name for alias in node.names]
                elif isinstance(node, ast.ImportFrom) and node.module is not None:
                    names = [node.module]
                else:
                    continue
                found += [
                    f"{path.relative_to(ROOT)}:{node.lineno} {name}"
                    for name in names
                    if name.split(".")[0] in forbidden or name.startswith(forbidden[0])
                ]
    assert found == []
