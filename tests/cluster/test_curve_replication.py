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
from click.testing import CliRunner, Result

from broker.client import Admin, PartitionConsumer, Producer
from broker.protocol import Ack
from broker.registry import Registry
from broker.security import Acl, ClientKeys, generate_keys, load_public_key, parse_operations
from broker.zookeeper import PrivateZooKeeper
from cli.pylogctl import cli
from tests.cluster.test_failover import THREE_BROKERS_FLAGS, run_kills
from tests.conftest import running_three, wait_until
from tests.pylogd import RunningBroker, ThreeBrokers, broker_flags

OPERATOR = "ops"
"""The super user's principal."""
CLIENT = "app"
"""A principal with fetch and produce on every topic (an ACL of `*`), and nothing more."""


def curve_flags(root: Path) -> tuple[str, ...]:
    """The flags of a curve broker of the cluster under `root`: the cluster's key pair, ops as
    the super user; the registry open (the test writes its principals)."""
    return (
        *THREE_BROKERS_FLAGS,
        *("--security-allow-open-registry", "true"),
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
            registry.security.add_principal(name, load_public_key(root / "keys" / f"{name}.key"))
    with running_three(zookeeper, root, chroot, *curve_flags(root)) as three:
        three.registry.security.add_acl(Acl(CLIENT, "*", parse_operations(["produce", "fetch"])))
        yield three


@pytest.fixture
def curve_cluster(zookeeper: PrivateZooKeeper, tmp_path: Path) -> Iterator[ThreeBrokers]:
    with curve_three(zookeeper, tmp_path) as three:
        yield three


def keys(three: ThreeBrokers, name: str = OPERATOR) -> ClientKeys:
    key_dir = three.root / "keys"
    return ClientKeys.load(key_dir / f"{name}.key_secret", key_dir / "broker.key")


def isr(registry: Registry, topic: str, partition: int = 0) -> tuple[int, ...]:
    return tuple(sorted(registry.topics.partition_state(topic, partition)[0].isr))


def test_a_curve_cluster_creates_a_topic_at_replication_factor_3_and_copies_it(
    curve_cluster: ThreeBrokers,
) -> None:
    three = curve_cluster
    with Admin(three.brokers[1].endpoint, keys=keys(three)) as admin:
        admin.create_topic("copied", 1, {"replication_factor": "3", "min_insync_replicas": "2"})
    assert three.registry.topics.topic_config("copied").replicas == ((1, 2, 3),)
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
    leader = three.registry.topics.partition_state("copied", 0)[0].leader
    with PartitionConsumer(
        three.brokers[leader].endpoint, "copied", 0, stop_at_end=True, keys=keys(three, CLIENT)
    ) as consumer:
        assert [m.value for m in consumer] == [b"m-%d" % i for i in range(50)]


def _stored(folder: Path) -> bytes:
    return b"".join(segment.read_bytes() for segment in sorted(folder.glob("*.log")))


def test_the_leader_of_a_curve_cluster_killed_twice_loses_nothing_acknowledged(
    curve_cluster: ThreeBrokers,
) -> None:
    run_kills(curve_cluster, kills=2, keys=keys(curve_cluster))


@pytest.mark.slow  # ~40 s: 10 failovers and as many restarts
def test_the_leader_of_a_curve_cluster_killed_ten_times_loses_nothing_acknowledged(
    curve_cluster: ThreeBrokers,
) -> None:
    run_kills(curve_cluster, kills=10, keys=keys(curve_cluster))


def pylogctl(three: ThreeBrokers, zookeeper: PrivateZooKeeper, *args: str) -> Result:
    options = ("--zookeeper", zookeeper.connect_string, "--chroot", three.chroot)
    return CliRunner().invoke(cli, [*args, *options], catch_exceptions=False)


def test_a_reassignment_in_a_curve_cluster_completes(
    curve_cluster: ThreeBrokers, zookeeper: PrivateZooKeeper
) -> None:
    """A single-copy partition moved to another broker, which copies it over Curve first (the
    move that printed "copying to ..." forever before curve followers)."""
    three = curve_cluster
    with Admin(three.brokers[1].endpoint, keys=keys(three)) as admin:
        admin.create_topic("moved", 1)
    (first,) = three.registry.topics.topic_config("moved").replicas[0]
    other = first % 3 + 1
    with Producer(
        three.brokers[first].endpoint, "moved", ack=Ack.FLUSHED, keys=keys(three, CLIENT)
    ) as producer:
        for i in range(100):
            producer.send(b"m-%d" % i)
        producer.flush()

    result = pylogctl(
        three,
        zookeeper,
        *("topic", "reassign", "moved", "--partition", "0"),
        *("--replicas", str(other), "--wait-timeout", "30"),
    )
    assert result.exit_code == 0, result.output
    assert f"moved-0: done: replicas {other} leader {other}" in result.output
    with PartitionConsumer(
        three.brokers[other].endpoint, "moved", 0, stop_at_end=True, keys=keys(three, CLIENT)
    ) as consumer:
        assert [m.value for m in consumer] == [b"m-%d" % i for i in range(100)]


def test_a_broker_without_the_cluster_key_never_follows_says_why_and_a_cancel_removes_it(
    curve_cluster: ThreeBrokers, zookeeper: PrivateZooKeeper
) -> None:
    """Broker 4 holds a key pair of its own (it trusts the cluster's key, so it does connect):
    the leader refuses its handshakes, it never joins the ISR, the leader's log, its own,
    the controller's and `--status` say why; `--cancel` takes it out of the replicas again,
    which leaves the ISR whole."""
    three = curve_cluster
    key_dir = three.root / "keys"
    rogue = RunningBroker(
        three.root / "broker-4",
        zookeeper.connect_string,
        three.chroot,
        *broker_flags(three.root, 4),
        *curve_flags(three.root),
        *("--security-key-file", str(key_dir / "rogue.key_secret")),
        *("--security-broker-keys", str(key_dir / "broker.key")),
    )
    try:
        rogue.start()
        with Admin(three.brokers[1].endpoint, keys=keys(three)) as admin:
            admin.create_topic("kept", 1, {"replication_factor": "3", "min_insync_replicas": "2"})
        wait_until(lambda: isr(three.registry, "kept") == (1, 2, 3), 30, "in sync")
        leader = three.registry.topics.partition_state("kept", 0)[0].leader
        wanted = (leader, next(b for b in (1, 2, 3) if b != leader), 4)
        result = pylogctl(
            three,
            zookeeper,
            *("topic", "reassign", "kept", "--partition", "0", "--no-wait"),
            *("--replicas", ",".join(map(str, wanted))),
        )
        assert result.exit_code == 0, result.output
        wait_until(
            lambda: 4 in three.registry.topics.topic_config("kept").replicas[0], 30, "expand"
        )

        refused = "refused this broker's key (ZAP 400)"
        wait_until(lambda: refused in rogue.log_path.read_text(), 30, "broker 4's warning")
        assert "unknown client key" in three.brokers[leader].log_path.read_text()
        why = f"leader {leader} refuses broker 4's key"
        status = pylogctl(three, zookeeper, "topic", "reassign", "--status")
        assert status.exit_code == 0, status.output
        assert why in status.output and "copying to 4" in status.output
        logs = "".join(b.log_path.read_text() for b in three.brokers.values())
        assert why in logs  # the controller's, wherever it runs
        assert 4 not in isr(three.registry, "kept")

        cancel = pylogctl(
            three, zookeeper, "topic", "reassign", "kept", "--partition", "0", "--cancel"
        )
        assert cancel.exit_code == 0, cancel.output
        assert "broker(s) 4, added and not in sync, leave its replicas again" in cancel.output
        wait_until(
            lambda: (
                three.registry.topics.topic_config("kept").replicas[0] == (1, 2, 3)
                and not three.registry.reassignments.read()
            ),
            30,
            "broker 4 removed",
        )
        assert isr(three.registry, "kept") == (1, 2, 3)  # whole: no replica out of sync
        wait_until(lambda: not (three.root / "broker-4" / "logs" / "kept-0").exists())
    finally:
        rogue.stop()
        print(f"--- {rogue.log_path}:\n{rogue.log_tail()}")
