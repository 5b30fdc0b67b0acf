"""Replication in a curve cluster (docs/security.md, "Brokers among themselves"): three real
brokers in security.mode curve, sharing the cluster's key pair, whose followers authenticate to
their leaders with it; a topic at replication factor 3, a producer at ack=all, leaders killed,
a reassignment, a broker that does not hold the cluster's key, a client that asks as a
replica."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from broker.client import Admin, PartitionConsumer, Producer
from broker.protocol import Ack
from broker.registry import Registry
from broker.security import Acl, ClientKeys, generate_keys, load_public_key, parse_operations
from broker.zookeeper import PrivateZooKeeper
from tests.cluster.test_failover import THREE_BROKERS_FLAGS
from tests.conftest import running_three, wait_until
from tests.pylogd import ThreeBrokers

OPERATOR = "ops"
"""The super user's principal."""
CLIENT = "app"
"""A principal with fetch and produce on every topic (an ACL of `*`), and nothing more."""


def curve_flags(root: Path) -> tuple[str, ...]:
    """The flags of a curve broker of the cluster under `root`: the cluster's key pair, ops as
    the super user."""
    return (
        *THREE_BROKERS_FLAGS,
        "--security-mode",
        "curve",
        "--security-key-file",
        str(root / "keys" / "broker.key_secret"),
        "--security-super-users",
        OPERATOR,
    )


@contextlib.contextmanager
def curve_three(zookeeper: PrivateZooKeeper, root: Path) -> Iterator[ThreeBrokers]:
    """Brokers 1, 2 and 3 in curve mode, with the principals ops and app known."""
    for name in ("broker", OPERATOR, CLIENT, "rogue"):
        generate_keys(root / "keys", name)
    chroot = f"/test-{uuid.uuid4().hex[:16]}"
    with Registry(zookeeper.connect_string, chroot) as registry:
        for name in (OPERATOR, CLIENT):
            registry.add_principal(name, load_public_key(root / "keys" / f"{name}.key"))
    with running_three(zookeeper, root, chroot, *curve_flags(root)) as three:
        three.registry.add_acl(Acl(CLIENT, "*", parse_operations(["produce", "fetch"])))
        yield three


@pytest.fixture
def curve_cluster(zookeeper: PrivateZooKeeper, tmp_path: Path) -> Iterator[ThreeBrokers]:
    with curve_three(zookeeper, tmp_path) as three:
        yield three


def keys(three: ThreeBrokers, name: str = OPERATOR) -> ClientKeys:
    key_dir = three.root / "keys"
    return ClientKeys.load(key_dir / f"{name}.key_secret", key_dir / "broker.key")


def isr(registry: Registry, topic: str, partition: int = 0) -> tuple[int, ...]:
    return tuple(sorted(registry.partition_state(topic, partition)[0].isr))


def test_a_curve_cluster_creates_a_topic_at_replication_factor_3_and_copies_it(
    curve_cluster: ThreeBrokers,
) -> None:
    three = curve_cluster
    with Admin(three.brokers[1].endpoint, keys=keys(three)) as admin:
        admin.create_topic("copied", 1, {"replication_factor": "3", "min_insync_replicas": "2"})
    assert three.registry.topic_config("copied").replicas == ((1, 2, 3),)
    with Producer(
        three.brokers[1].endpoint, "copied", ack=Ack.ALL, keys=keys(three, CLIENT)
    ) as producer:
        for i in range(50):
            producer.send(b"m-%d" % i)
        producer.flush()
    wait_until(lambda: isr(three.registry, "copied") == (1, 2, 3), 30, "every replica in sync")
    folders = [three.root / f"broker-{i}" / "logs" / "copied-0" for i in (1, 2, 3)]
    wait_until(lambda: len({_stored(f) for f in folders}) == 1, 30, "the same bytes everywhere")
    assert _stored(folders[0])
    leader = three.registry.partition_state("copied", 0)[0].leader
    with PartitionConsumer(
        three.brokers[leader].endpoint, "copied", 0, stop_at_end=True, keys=keys(three, CLIENT)
    ) as consumer:
        assert [m.value for m in consumer] == [b"m-%d" % i for i in range(50)]


def _stored(folder: Path) -> bytes:
    return b"".join(segment.read_bytes() for segment in sorted(folder.glob("*.log")))
