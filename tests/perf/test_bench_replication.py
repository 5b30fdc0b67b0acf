"""perf/bench_replication.py's own logic: the medians it prints, and a whole run at tiny sizes
against a real cluster of three pylogd (the producer at every replication factor, one leader
killed, every acked message read back). It times nothing (perf/ is run by hand, alone)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from perf.bench_replication import ACKS, BATCHES, FACTORS, ended, main, summarize

pytestmark = pytest.mark.broker


def line(ack: str, batch: int, factor: int, rate: int) -> dict[str, object]:
    return {
        "ack": ack,
        "batch": batch,
        "replication_factor": factor,
        "msgs_per_s": rate,
        "client_us_per_message": rate / 100,
        "broker_us_per_message": rate / 10,
    }


def test_summary_gives_medians_per_ack_batch_and_factor() -> None:
    results = [
        line("all", 1, 3, 300),
        line("all", 1, 1, 1000),
        line("all", 1, 3, 100),
        line("all", 1, 1, 3000),
        line("all", 1, 3, 200),
        line("none", 50, 3, 7),
    ]
    summary = summarize(results)
    assert [(s["ack"], s["batch"], s["replication_factor"]) for s in summary] == [
        ("all", 1, 3),
        ("all", 1, 1),
        ("none", 50, 3),
    ]
    assert summary[0] == {
        "ack": "all",
        "batch": 1,
        "replication_factor": 3,
        "runs": 3,
        "msgs_per_s": 200,
        "client_us_per_message": 2.0,
        "broker_us_per_message": 20.0,
    }
    assert summary[1]["msgs_per_s"] == 2000 and summary[1]["runs"] == 2


def test_a_killed_and_reaped_process_has_ended() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert not ended(child.pid)
        child.kill()
        child.wait()
        assert ended(child.pid)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert not ended(os.getpid())


def test_bad_options_are_refused() -> None:
    for argv in (["--messages", "0"], ["--kills", "-1"], ["--repeat", "0"]):
        with pytest.raises(SystemExit):
            main(argv)


@pytest.mark.slow  # ~30 s: three pylogd, twelve producer runs, one leader killed
def test_a_tiny_run_measures_every_factor_and_loses_nothing_acked() -> None:
    tiny = ("--messages", "200", "--kills", "1")
    summary = main([*tiny, "--session-timeout-ms", "2000", "--tick-time-ms", "200"])
    runs = {(s["ack"], s["batch"], s["replication_factor"]) for s in summary["producer"]}
    assert runs == {(a.name.lower(), b, f) for a in ACKS for b in BATCHES for f in FACTORS}
    assert all(s["msgs_per_s"] > 0 and s["runs"] == 1 for s in summary["producer"])
    failover = summary["failover"]
    assert failover["kills"] == 1
    assert failover["failover_median_ms"] >= failover["elected_median_ms"] > 0
    assert failover["acked"] > 0
    assert failover["lost"] == 0
    assert failover["stored"] >= failover["acked"]
