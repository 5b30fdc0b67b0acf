"""Fixtures shared by the whole test suite."""

from __future__ import annotations

from dataclasses import dataclass

import pytest


@dataclass
class FakeClock:
    """A clock that moves only when a test says so (see broker.clock.Clock)."""

    now_monotonic: float = 1000.0
    now_time: float = 1_700_000_000.0

    def monotonic(self) -> float:
        return self.now_monotonic

    def time(self) -> float:
        return self.now_time

    def advance(self, seconds: float) -> None:
        self.now_monotonic += seconds
        self.now_time += seconds


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()
