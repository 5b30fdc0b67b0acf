"""The one summary every latency run reports, whatever the system."""

from __future__ import annotations

import math
import statistics
from typing import Any


def latency_summary(delays_ms: list[float], expected: int) -> dict[str, Any]:
    """p50, p99 and max of produce-to-consume delays over the `expected` messages. A message
    that never arrived counts as an infinite delay, so that a partial run does not flatter the
    system (its p99 is infinite once more than 1% are lost); `lost` says how many. The run's
    figures are kept either way: one system losing messages does not end the harness."""
    lost = max(0, expected - len(delays_ms))
    ordered = sorted(delays_ms) + [math.inf] * lost
    return {
        "messages": expected,
        "lost": lost,
        "p50_ms": round(statistics.median(ordered), 2),
        "p99_ms": round(ordered[max(0, int(len(ordered) * 0.99) - 1)], 2),
        "max_ms": round(ordered[-1], 2),
    }
