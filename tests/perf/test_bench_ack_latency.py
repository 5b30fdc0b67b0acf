"""perf/bench_ack_latency.py as a test of what it measures (not of its times): a short paced run
against three real pylogd at factor 2, every message acked and its wait counted, the figures in
order; and its command line's refusals."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from perf.bench_ack_latency import TICK_TIME_MS, measure, percentile
from perf.bench_replication import running_cluster

pytestmark = pytest.mark.broker


def test_percentiles_are_nearest_rank_in_ms() -> None:
    waits = [0.001 * n for n in range(1, 101)]
    assert percentile(waits, 0.5) == 50.0
    assert percentile(waits, 0.99) == 99.0
    assert percentile(waits, 1.0) == 100.0


def test_a_short_paced_run_acks_every_message_and_charges_each_broker(tmp_path: Path) -> None:
    with running_cluster(tmp_path, 6000, TICK_TIME_MS) as cluster:
        figures = measure(cluster, 2, 12, 200, 1.0, 0.5)
    assert figures["messages"] == 200
    acks = figures["ack_ms"]
    assert 0 < acks["p50"] <= acks["p90"] <= acks["p99"] <= acks["max"]
    for broker in (1, 2, 3):  # every broker leads or follows some of the 12 partitions
        assert 0 < figures["worker_cpu_share"][broker] <= figures["broker_cpu_share"][broker]
    assert 0 < figures["machine_busy"] <= 1


@pytest.mark.parametrize(
    "flags", [("--factor", "4"), ("--factor", "0"), ("--partitions", "0"), ("--rate", "0")]
)
def test_bad_arguments_are_refused_before_any_broker_starts(flags: tuple[str, str]) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "perf.bench_ack_latency", *flags],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert "--factor is 1 to 3" in done.stderr
