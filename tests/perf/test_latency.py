"""The latency summary: lost messages count against the system, and do not end the run."""

from __future__ import annotations

import math
import time
from pathlib import Path

from perf.latency import DiskProbe, latency_summary


def test_every_message_arrived() -> None:
    summary = latency_summary([float(ms) for ms in range(1, 101)], 100)
    assert summary == {"messages": 100, "lost": 0, "p50_ms": 50.5, "p99_ms": 99.0, "max_ms": 100.0}


def test_lost_messages_count_as_infinite_delays() -> None:
    summary = latency_summary([1.0] * 98, 100)
    assert summary["lost"] == 2
    assert summary["p50_ms"] == 1.0
    assert math.isinf(summary["p99_ms"]) and math.isinf(summary["max_ms"])


def test_the_disk_probe_times_fsyncs_and_leaves_no_file(tmp_path: Path) -> None:
    with DiskProbe(tmp_path, interval_s=0.001) as probe:
        deadline = time.monotonic() + 10
        while len(probe.fsync_ms) < 3 and time.monotonic() < deadline:
            time.sleep(0.001)
    summary = probe.summary()
    assert len(probe.fsync_ms) >= 3
    assert 0 < summary["disk_p99_ms"] <= summary["disk_max_ms"] == round(max(probe.fsync_ms), 2)
    assert not probe.path.exists()
    assert all(math.isnan(value) for value in DiskProbe(tmp_path).summary().values())
