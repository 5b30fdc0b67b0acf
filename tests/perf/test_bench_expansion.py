"""perf/bench_expansion.py at a tiny size against a real pylogd: its figures are made and add
up, and it leaves no process behind. It times nothing (perf/ is run by hand, alone on the
machine)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.broker, pytest.mark.slow]  # ~4 s: a pylogd, its private ZooKeeper


def test_a_tiny_run_prints_the_victims_and_the_attackers_figures(tmp_path: Path) -> None:
    command = [
        sys.executable,
        "-m",
        "perf.bench_expansion",
        "--scenarios",
        "producer",
        "--conns",
        "2",
        "--per-conn",
        "2",
        "--window",
        "2",
        "--baseline",
        "0.5",
        "--tail",
        "0.3",
        "--deadline",
        "60",
        "--victim-wait",
        "30",
        "--dir",
        str(tmp_path),
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    (line,) = done.stdout.splitlines()
    figures = json.loads(line)
    assert figures["scenario"] == "producer"
    assert figures["attackers"] == {"sent": 4, "answered": 4, "answered_by_error": {"NONE": 4}}
    assert figures["victim_baseline_ms_p50"] > 0
    during = figures["victim_during_n"]
    assert during == sum(figures["victim_results"].values())
    if during:
        assert 0 < figures["victim_p50_s"] <= figures["victim_max_s"]
    else:
        assert figures["victim_max_s"] is None and figures["victim_p50_s"] is None
    assert 0 <= figures["victim_over_10s"] <= during
    assert figures["worker_cpu_s_during"] >= 0
    assert figures["worker_peak_rss_mib"] > 0
    assert list(tmp_path.iterdir()) == []  # its data removed
