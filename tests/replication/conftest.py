"""Fixtures of the replication tests: ZooKeeper's observer, and the controller tests' brokers
(registry sessions) and controller services (stopped at the end of each test), for every
module here."""

from __future__ import annotations

from tests.registry.conftest import observer  # noqa: F401 (a fixture)
from tests.replication.test_controller import make_broker, service  # noqa: F401 (fixtures)
