"""broker.backoff.Backoff: the waits every retry and restart of pylog takes."""

from __future__ import annotations

import math

import pytest

from broker.backoff import Backoff


def test_waits_double_up_to_the_ceiling_and_a_reset_starts_again() -> None:
    backoff = Backoff(0.1, 0.5)
    assert [backoff.next() for _ in range(5)] == [0.1, 0.2, 0.4, 0.5, 0.5]
    backoff.reset()
    assert backoff.next() == 0.1
    assert backoff.current_s == 0.2


def test_a_ceiling_raised_or_lowered_applies_from_the_next_doubling() -> None:
    backoff = Backoff(1.0, 2.0)
    assert [backoff.next() for _ in range(3)] == [1.0, 2.0, 2.0]
    backoff.max_s = 30.0  # a worker's crash loop
    assert [backoff.next() for _ in range(5)] == [2.0, 4.0, 8.0, 16.0, 30.0]


def test_delay_and_waited_count_failures_without_state() -> None:
    backoff = Backoff(0.5)
    assert backoff.max_s == math.inf
    assert [backoff.delay(n) for n in range(4)] == [0.5, 1.0, 2.0, 4.0]
    assert backoff.waited(4) == 7.5
    assert backoff.waited(0) == 0
    assert backoff.current_s == 0.5  # untouched
    assert Backoff(0.1, 2.0).delay(10) == 2.0


@pytest.mark.parametrize(("first_s", "max_s"), [(0.0, 1.0), (-1.0, 1.0), (2.0, 1.0)])
def test_a_back_off_that_could_not_wait_is_refused(first_s: float, max_s: float) -> None:
    with pytest.raises(ValueError, match="0 < first_s <= max_s"):
        Backoff(first_s, max_s)
