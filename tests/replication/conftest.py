"""Fixtures of the replication tests."""

from __future__ import annotations

from tests.registry.conftest import observer  # noqa: F401 (a fixture)
