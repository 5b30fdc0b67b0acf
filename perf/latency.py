"""The one summary every latency run reports, whatever the system."""

from __future__ import annotations

import statistics
from typing import Any


def latency_summary(delays_ms: list[float], expected: int) -> dict[str, Any]:
    """p50, p99 and max of produce-to-consume delays; RuntimeError when fewer than `expected`
    messages arrived (a latency figure over a partial run would flatter the system)."""
    if len(delays_ms) < expected:
        raise RuntimeError(f"only {len(delays_ms)} of {expected} messages arrived")
    ordered = sorted(delays_ms)
    return {
        "messages": expected,
        "p50_ms": round(statistics.median(ordered), 2),
        "p99_ms": round(ordered[max(0, int(len(ordered) * 0.99) - 1)], 2),
        "max_ms": round(ordered[-1], 2),
    }
