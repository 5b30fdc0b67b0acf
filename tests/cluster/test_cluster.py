"""Several pylogd processes sharing one ZooKeeper: topics spread over them, clients finding
each partition's broker, a broker dying and coming back."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
import xxhash

from broker.client import Admin, PartitionConsumer, Producer
from broker.client.cluster import Cluster
from broker.errors import BrokerError
from broker.protocol import Ack, ErrorCode, FetchRequest
from tests.conftest import wait_until
from tests.pylogd import RunningBroker


def partition_folders(root: Path, topic: str) -> dict[int, list[str]]:
    """Broker id -> the partition folders of `topic` in its log dir."""
    return {
        i: sorted(p.name for p in (root / f"broker-{i}" / "logs").glob(f"{topic}-*"))
        for i in (1, 2, 3)
    }


def read_partition(endpoint: str, topic: str, partition: int) -> list[bytes]:
    with PartitionConsumer(endpoint, topic, partition, stop_at_end=True) as consumer:
        return [message.value for message in consumer]


def test_a_topic_is_spread_over_the_brokers_and_clients_reach_each_partition_where_it_is(
    three_brokers: list[RunningBroker], tmp_path: Path
) -> None:
    one, two, three = three_brokers
    with Admin(one.endpoint) as admin:
        admin.create_topic("spread", 12)
    # create answers once every partition is served: METADATA from any broker says where
    with Admin(three.endpoint) as admin:
        (info,) = admin.metadata(["spread"]).topics
        assert [b.broker_id for b in admin.metadata().brokers] == [1, 2, 3]
    assert [(p.partition, p.broker_id, p.error_code) for p in info.partitions] == [
        (p, 1 + p % 3, ErrorCode.NONE) for p in range(12)
    ]
    assert partition_folders(tmp_path, "spread") == {
        i: sorted(f"spread-{p}" for p in range(i - 1, 12, 3)) for i in (1, 2, 3)
    }

    keys = [b"user-%d" % i for i in range(240)]
    with Producer(two.endpoint, "spread", ack=Ack.FLUSHED, batch_messages=20) as producer:
        for key in keys:
            producer.send(key + b":value", key=key)
        acks = producer.flush()
    assert sum(a.count for a in acks) == len(keys)
    assert {a.partition for a in acks} == set(range(12))

    expected: dict[int, list[bytes]] = {}
    for key in keys:
        expected.setdefault(xxhash.xxh32_intdigest(key) % 12, []).append(key + b":value")
    for partition in range(12):  # every partition read through broker 1, from its holder
        assert read_partition(one.endpoint, "spread", partition) == expected.get(partition, [])

    # a broker that does not hold a partition says which one does
    with Cluster(three.endpoint) as cluster, pytest.raises(BrokerError) as refused:
        cluster.connect(three.endpoint).request(FetchRequest("spread", 0, 0, 1024, 0, 0))
    assert refused.value.code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    assert "held by broker 1" in refused.value.message

    with Admin(two.endpoint) as admin:
        admin.delete_topic("spread")
    wait_until(
        lambda: partition_folders(tmp_path, "spread") == {1: [], 2: [], 3: []},
        what="every broker to delete its partitions",
    )
    with Admin(one.endpoint) as admin:
        assert admin.list_topics() == []


def test_a_dead_broker_leaves_its_partitions_unavailable_and_they_return_with_nothing_lost(
    three_brokers: list[RunningBroker],
) -> None:
    one, two, three = three_brokers
    with Admin(one.endpoint) as admin:
        admin.create_topic("sturdy", 6)
    first = [b"first-%d" % i for i in range(300)]
    with Producer(one.endpoint, "sturdy", ack=Ack.FLUSHED, batch_messages=10) as producer:
        for value in first:
            producer.send(value)
        assert sum(a.count for a in producer.flush()) == len(first)

    two.kill()
    with Admin(one.endpoint) as admin:

        def unavailable() -> set[int]:
            (info,) = admin.metadata(["sturdy"]).topics
            return {p.partition for p in info.partitions if p.error_code != ErrorCode.NONE}

        wait_until(lambda: unavailable() == {1, 4}, what="broker 2's partitions to go")
        described = {p.partition: p for p in admin.describe("sturdy")}
        assert described[1].high_watermark is None and described[0].high_watermark is not None

    # a batch for a partition of broker 2 fails, after its retries, with a retriable error
    with (
        Producer(three.endpoint, "sturdy", ack=Ack.FLUSHED, retries=2) as producer,
        pytest.raises(BrokerError) as refused,
    ):
        producer.send(b"for broker 2", partition=1)
        producer.flush()
    assert refused.value.code == ErrorCode.PARTITION_UNAVAILABLE and refused.value.retriable

    # keyless messages go to the partitions still served, none is lost or refused
    second = [b"second-%d" % i for i in range(300)]
    with Producer(three.endpoint, "sturdy", ack=Ack.FLUSHED, batch_messages=10) as producer:
        for value in second:
            producer.send(value)
        acks = producer.flush()
    assert sum(a.count for a in acks) == len(second)
    assert {a.partition for a in acks} == {0, 2, 3, 5}

    again = two.restarted()
    try:
        with Admin(three.endpoint) as admin:
            wait_until(lambda: unavailable() == set(), what="broker 2's partitions to return")
        values: Counter[bytes] = Counter()
        for partition in range(6):
            values.update(read_partition(one.endpoint, "sturdy", partition))
        assert values == Counter(first + second)  # every acked message, each once
    finally:
        again.stop()
