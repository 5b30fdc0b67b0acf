"""Compressed sets and messages with headers on a replicated partition: the followers copy the
leader's bytes as they are (FETCH version 3), so every replica's segment is byte for byte the
leader's, and a consumer reads the same messages from whichever replica leads."""

from __future__ import annotations

from pathlib import Path

from broker.client import Ack, Cluster, PartitionConsumer, Producer
from tests.client.test_leadership import create_replicated
from tests.conftest import wait_until
from tests.pylogd import ThreeBrokers


def segment_bytes(root: Path, broker_id: int, topic: str) -> bytes:
    folder = root / f"broker-{broker_id}" / "logs" / f"{topic}-0"
    return b"".join(p.read_bytes() for p in sorted(folder.glob("*.log")))


def test_followers_hold_the_leaders_compressed_sets_and_headers_byte_for_byte(
    shared_three_brokers: ThreeBrokers,
) -> None:
    cluster = shared_three_brokers
    endpoints = cluster.endpoints
    create_replicated(endpoints, "compressed-replicas", 1)
    sent = [(b"line %d " % i * 10, [("n", b"%d" % i)] if i % 3 else None) for i in range(60)]
    with Producer(
        endpoints[1], "compressed-replicas", ack=Ack.ALL, batch_messages=20, compression="zstd"
    ) as producer:
        for value, headers in sent:
            producer.send(value, headers=headers)
    with Producer(endpoints[1], "compressed-replicas", ack=Ack.ALL) as producer:
        producer.send(b"plain after", headers=[("last", None)])
    with Cluster(endpoints[1]) as metadata:
        (info,) = metadata.partitions("compressed-replicas")
    leader = info.broker_id
    wanted = segment_bytes(cluster.root, leader, "compressed-replicas")
    wait_until(
        lambda: all(
            segment_bytes(cluster.root, b, "compressed-replicas") == wanted for b in (1, 2, 3)
        ),
        what="every replica's segment the leader's bytes",
    )
    with PartitionConsumer(endpoints[2], "compressed-replicas", 0, stop_at_end=True) as consumer:
        read = [(m.value, list(m.headers) or None) for m in consumer]
    assert read == [*sent, (b"plain after", [("last", None)])]
