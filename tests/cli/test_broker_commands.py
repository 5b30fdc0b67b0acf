"""`pylogctl broker list` and the DESCRIBE_CLUSTER behind it (Admin.brokers, Admin.zookeeper),
against a real cluster of three brokers."""

from __future__ import annotations

import json
from collections import Counter
from importlib.metadata import version
from pathlib import Path

from click.testing import CliRunner, Result
from pytest import MonkeyPatch

from broker.client import Admin
from broker.zookeeper import PrivateZooKeeper
from cli.pylogctl import cli
from tests.cli.conftest import Cluster
from tests.conftest import wait_until
from tests.pylogd import RunningBroker


def run(endpoint: str, *args: str) -> Result:
    return CliRunner().invoke(cli, list(args), env={"PYLOG_BROKER": endpoint})


def held_partitions(admin: Admin, topic: str) -> Counter[int]:
    """How many partitions of `topic` each broker holds, as leader or follower."""
    return Counter(r for p in admin.describe_partitions(topic) for r in p.replicas)


def test_broker_list_shows_every_broker_up_with_its_endpoint_version_log_dirs_and_partitions(
    cluster: Cluster, topic: str
) -> None:
    """Issue 53, 7: a broker holding two replicas it did not lead was listed with 0
    partitions (the count was of preferred leaders)."""
    with Admin(cluster.endpoint) as admin:
        admin.create_topic(topic, partitions=4, config={"replication_factor": "2"})
        held = held_partitions(admin, topic)
    assert sum(held.values()) == 8
    listed = run(cluster.brokers[1].endpoint, "broker", "list")  # any broker answers
    assert listed.exit_code == 0, listed.output
    lines = listed.output.splitlines()
    expected = [
        f"broker {i} up   {b.endpoint} version {version('pylog')} partitions {held[i]} "
        f"log_dirs {b.data_dir / 'logs'}"
        for i, b in zip((1, 2, 3), cluster.brokers, strict=True)
    ]
    assert lines[:3] == expected
    assert lines[3] == f"zookeeper {cluster.zookeeper} chroot {cluster.chroot}"

    as_json = run(cluster.endpoint, "broker", "list", "--json")
    assert as_json.exit_code == 0, as_json.output
    objects = [json.loads(line) for line in as_json.output.splitlines()]
    assert objects[0] == {
        "broker_id": 1,
        "up": True,
        "endpoint": cluster.brokers[0].endpoint,
        "version": version("pylog"),
        "log_dirs": [str(cluster.brokers[0].data_dir / "logs")],
        "partitions": held[1],
    }
    assert [o["broker_id"] for o in objects] == [1, 2, 3]


def test_admin_learns_the_clusters_zookeeper_from_a_broker_address(cluster: Cluster) -> None:
    with Admin(cluster.brokers[2].endpoint) as admin:
        address = admin.zookeeper()
    assert (address.connect, address.chroot) == (cluster.zookeeper, cluster.chroot)


def test_a_stopped_broker_holding_partitions_is_listed_down(
    three_brokers: list[RunningBroker], topic: str
) -> None:
    first, second, _ = three_brokers
    with Admin(first.endpoint) as admin:
        admin.create_topic(topic, partitions=3)  # partition 1 on broker 2
        second.stop()
        wait_until(
            lambda: not next(b for b in admin.brokers() if b.broker_id == 2).up,
            what="broker 2 seen down",
        )
    listed = run(first.endpoint, "broker", "list", "--json")
    assert listed.exit_code == 0, listed.output
    down = [json.loads(line) for line in listed.output.splitlines()][1]
    assert down == {
        "broker_id": 2,
        "up": False,
        "endpoint": None,
        "version": None,
        "log_dirs": [],
        "partitions": 1,
    }
    text = run(first.endpoint, "broker", "list").output.splitlines()
    assert text[1] == "broker 2 down partitions 1"


def test_broker_list_of_an_unreachable_broker_is_one_line_and_exit_1() -> None:
    listed = CliRunner().invoke(
        cli, ["broker", "list", "--broker", "127.0.0.1:1", "--timeout", "0.2"]
    )
    assert listed.exit_code == 1
    assert listed.stderr.startswith("pylogctl: broker ")
    assert "unreachable" in listed.stderr and len(listed.stderr.splitlines()) == 1


def test_broker_list_shows_absolute_log_dirs_of_a_broker_started_with_a_relative_data_dir(
    zookeeper: PrivateZooKeeper, registry_chroot: str, tmp_path: Path, monkeypatch: MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # as `pylogd --broker-data-dir ./data-2` from a clone
    broker = RunningBroker(Path("data-2"), zookeeper.connect_string, registry_chroot).start()
    try:
        listed = run(broker.endpoint, "broker", "list", "--json")
        assert listed.exit_code == 0, listed.output
        (record,) = [json.loads(line) for line in listed.output.splitlines()][:1]
        assert record["log_dirs"] == [str(tmp_path / "data-2" / "logs")]
    finally:
        broker.stop()
