"""Fixtures of the registry tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from kazoo.client import KazooClient

from broker.zookeeper import PrivateZooKeeper


@pytest.fixture
def observer(zookeeper: PrivateZooKeeper) -> Iterator[KazooClient]:
    """A plain kazoo client of the test ZooKeeper, with no identity: to look at the nodes
    from outside the registry."""
    client = KazooClient(zookeeper.connect_string)
    client.start(timeout=10)
    yield client
    client.stop()
    client.close()
