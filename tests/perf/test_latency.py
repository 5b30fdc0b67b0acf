"""The latency summary: lost messages count against the system, and do not end the run."""

from __future__ import annotations

import math

from perf.latency import latency_summary


def test_every_message_arrived() -> None:
    summary = latency_summary([float(ms) for ms in range(1, 101)], 100)
    assert summary == {"messages": 100, "lost": 0, "p50_ms": 50.5, "p99_ms": 99.0, "max_ms": 100.0}


def test_lost_messages_count_as_infinite_delays() -> None:
    summary = latency_summary([1.0] * 98, 100)
    assert summary["lost"] == 2
    assert summary["p50_ms"] == 1.0
    assert math.isinf(summary["p99_ms"]) and math.isinf(summary["max_ms"])
