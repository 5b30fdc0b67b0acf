"""pylog-mirror between two CurveZMQ clusters: its own principal on each side with only the ACLs
docs/mirror.md names, the target's registry behind ZooKeeper ACLs (the brokers' identity, which
writes a topic's log starts)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from functools import partial
from pathlib import Path

from broker.client import Admin, PartitionConsumer, Producer
from broker.errors import UnknownTopicOrPartition
from broker.protocol import Ack
from broker.zookeeper import PrivateZooKeeper
from tests.conftest import wait_until
from tests.curve import SUPER_USER, CurveBroker, running_curve_broker
from tests.mirror.conftest import MirrorProcess


def grant(cluster: CurveBroker, topic: str, *operations: str) -> None:
    for operation in operations:
        cluster.pylogctl(
            "acl", "add", "--principal", "alice", "--topic", topic, "--operation", operation
        )


def config(source: CurveBroker, target: CurveBroker) -> str:
    def cluster(section: str, broker: CurveBroker) -> str:
        return (
            f'[{section}]\nbootstrap = "{broker.broker.endpoint}"\n'
            f'key_file = "{broker.key_dir / "alice.key_secret"}"\n'
            f'broker_key = "{broker.key_dir / "broker.key"}"\n'
        )

    return (
        cluster("source", source)
        + cluster("target", target)
        + f'zookeeper_auth_file = "{target.broker_auth}"\n'
        + '[mirror]\ntopics = ["pay*"]\ndiscover_interval_s = 0.5\n'
    )


def test_a_mirror_copies_between_curve_clusters_with_its_own_principal(
    zookeeper: PrivateZooKeeper, tmp_path: Path, make_mirror: Callable[..., MirrorProcess]
) -> None:
    with (
        running_curve_broker(zookeeper, tmp_path / "source") as source,
        running_curve_broker(zookeeper, tmp_path / "target", zookeeper_acls=True) as target,
    ):
        admin = source.keys(SUPER_USER)
        with Admin(source.broker.endpoint, keys=admin) as cluster:
            cluster.create_topic("payments", 2)
        with Producer(source.broker.endpoint, "payments", ack=Ack.ALL, keys=admin) as producer:
            for i in range(100):
                producer.send(b"payment %d" % i, partition=i % 2)
            producer.flush()
        grant(source, "pay*", "fetch", "describe")
        grant(target, "pay*", "create", "produce", "describe")
        mirror = make_mirror(config(source, target))

        def copied(partition: int) -> list[tuple[int, bytes]]:
            messages: list[list[tuple[int, bytes]]] = [[], []]
            for broker in (source, target):
                keys = broker.keys(SUPER_USER)
                with (
                    contextlib.suppress(UnknownTopicOrPartition),
                    PartitionConsumer(
                        broker.broker.endpoint,
                        "payments",
                        partition,
                        start="earliest",
                        stop_at_end=True,
                        keys=keys,
                    ) as consumer,
                ):
                    messages[broker is target] = [(m.offset, m.value) for m in consumer]
            return messages[0] if messages[0] == messages[1] and len(messages[0]) == 50 else []

        for partition in (0, 1):
            wait_until(partial(copied, partition), 30, f"payments-{partition} copied")
        assert "copy stopped" not in mirror.log() and "not mirrored" not in mirror.log()
        assert mirror.stop() == 0

        # The target's broker key wrong (the source's given): said, and the process goes on.
        wrong = config(source, target).replace(
            f'broker_key = "{target.key_dir / "broker.key"}"',
            f'broker_key = "{source.key_dir / "broker.key"}"',
        )
        confused = make_mirror(wrong, "wrong-key")
        wait_until(lambda: "topic 'payments' is not mirrored" in confused.log(), 30, "refused")
        assert "AuthenticationFailed" in confused.log() or "handshake" in confused.log()
        assert confused.process is not None and confused.process.poll() is None
        assert confused.stop() == 0
