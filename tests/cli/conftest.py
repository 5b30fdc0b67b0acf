"""A cluster for the operator commands: three brokers on one ZooKeeper chroot, shared by the
tests of a module (starting three takes seconds). Each test uses topics and groups of its own;
tests that stop or restart a broker start their own with `three_brokers`."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from click.testing import CliRunner, Result

from broker.zookeeper import PrivateZooKeeper
from cli.pylogctl import cli
from tests.cluster.conftest import (  # noqa: F401 (fixtures)
    broker_flags,
    make_member,
    three_brokers,
)
from tests.pylogd import RunningBroker


@dataclass(frozen=True)
class Cluster:
    brokers: list[RunningBroker]
    zookeeper: str
    """The ensemble's connect string."""
    chroot: str

    @property
    def endpoint(self) -> str:
        """The first broker's address: any broker answers for the whole cluster."""
        return self.brokers[0].endpoint


@pytest.fixture(scope="module")
def cluster(
    zookeeper: PrivateZooKeeper, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Cluster]:
    """Brokers 1, 2 and 3 of one cluster, running for the whole module."""
    root = tmp_path_factory.mktemp("cluster")
    chroot = f"/test-{uuid.uuid4().hex[:16]}"
    brokers = [
        RunningBroker(
            root / f"broker-{i}", zookeeper.connect_string, chroot, *broker_flags(root, i)
        )
        for i in (1, 2, 3)
    ]
    try:
        for broker in brokers:
            broker.start()
        yield Cluster(brokers, zookeeper.connect_string, chroot)
    finally:
        for broker in brokers:
            if broker.process is not None and broker.process.poll() is None:
                broker.stop()
            print(f"--- {broker.log_path}:\n{broker.log_tail()}")


def pylogctl(endpoint: str, *args: str) -> Result:
    """`pylogctl ARGS` run in-process against the broker at `endpoint` (PYLOG_BROKER)."""
    return CliRunner().invoke(cli, list(args), env={"PYLOG_BROKER": endpoint})


def ok(endpoint: str, *args: str) -> str:
    """pylogctl's output, which must exit 0."""
    result = pylogctl(endpoint, *args)
    assert result.exit_code == 0, result.output
    return result.output
