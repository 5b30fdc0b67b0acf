"""`pylogctl cluster health` against three real brokers, one of them stopped and started again."""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from click.testing import CliRunner, Result

from cli.pylogctl import cli
from tests.conftest import wait_until
from tests.pylogd import RunningBroker


def health(endpoint: str, *args: str) -> Result:
    return CliRunner().invoke(cli, ["cluster", "health", *args], env={"PYLOG_BROKER": endpoint})


def health_json(endpoint: str) -> dict[str, Any]:
    result = health(endpoint, "--json")
    assert result.exit_code in (0, 1), result.output
    found: dict[str, Any] = json.loads(result.output)
    assert found["healthy"] is (result.exit_code == 0)
    return found


def create(endpoint: str, topic: str, partitions: int, factor: int, min_isr: int) -> None:
    config = (f"replication_factor={factor}", f"min_insync_replicas={min_isr}")
    args = ["topic", "create", topic, "--partitions", str(partitions)]
    args += [arg for setting in config for arg in ("--config", setting)]
    result = CliRunner().invoke(cli, args, env={"PYLOG_BROKER": endpoint})
    assert result.exit_code == 0, result.output


def named(problems: list[dict[str, Any]]) -> set[tuple[str, int]]:
    return {(p["topic"], p["partition"]) for p in problems}


def test_health_names_what_a_stopped_broker_leaves_wrong_and_exits_1_until_it_is_back(
    three_brokers: list[RunningBroker],
) -> None:
    endpoint = three_brokers[0].endpoint
    create(endpoint, "copied", 2, 3, 2)  # loses a replica of each partition, keeps min ISR
    create(endpoint, "strict", 1, 3, 3)  # under its min ISR without any of the three
    create(endpoint, "single", 3, 1, 1)  # one partition on each broker: one loses its leader
    wait_until(lambda: health(endpoint).exit_code == 0, timeout=30, what="a healthy cluster")
    healthy = health_json(endpoint)
    assert healthy["brokers_up"] == [1, 2, 3] and healthy["brokers_down"] == []
    assert healthy["controller"] in (1, 2, 3)
    assert healthy["leaderless"] == healthy["under_replicated"] == healthy["under_min_isr"] == []
    assert health(endpoint).output.splitlines()[0] == "healthy: yes"

    three_brokers[2].stop()
    # The controller takes broker 3 out of every ISR once its session is gone.
    wait_until(
        lambda: len(health_json(endpoint)["under_replicated"]) == 3,
        timeout=30,
        what="broker 3 out of the ISRs",
    )
    unhealthy = health_json(endpoint)
    assert unhealthy["brokers_up"] == [1, 2] and unhealthy["brokers_down"] == [3]
    assert named(unhealthy["under_replicated"]) == {("copied", 0), ("copied", 1), ("strict", 0)}
    assert named(unhealthy["under_min_isr"]) == {("strict", 0)}
    (lost,) = unhealthy["leaderless"]
    assert lost["topic"] == "single" and lost["replicas"] == [3]
    for problem in unhealthy["under_replicated"]:
        assert 3 not in problem["isr"] and problem["leader"] in (1, 2)
    shown = health(endpoint)
    assert shown.exit_code == 1
    lines = shown.output.splitlines()
    assert lines[0] == "healthy: no" and "brokers down: 3" in lines
    assert "leaderless partitions: 1" in lines and "under min ISR partitions: 1" in lines
    assert any(line.startswith("  strict-0 leader ") for line in lines), lines

    pylogctl = str(Path(sys.executable).with_name("pylogctl"))
    watch = ("--watch", "--interval", "0.2", "--broker", endpoint)
    watching = subprocess.Popen(
        [pylogctl, "cluster", "health", *watch],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    printed: queue.Queue[str] = queue.Queue()
    reader = threading.Thread(target=collect, args=(watching, printed))
    reader.start()
    try:
        assert read_until(printed, "healthy: no")
        three_brokers[2].restarted()
        assert read_until(printed, "healthy: yes"), "the watch never saw the cluster healed"
        watching.send_signal(signal.SIGINT)
        assert watching.wait(30) == 0  # Ctrl-C ends a watch quietly
        assert watching.stderr is not None and watching.stderr.read() == ""
    finally:
        if watching.poll() is None:
            watching.kill()
            watching.wait()
        reader.join(10)
    assert health(endpoint).exit_code == 0


def collect(process: subprocess.Popen[str], lines: queue.Queue[str]) -> None:
    """Put each line `process` prints into `lines`, until its stdout closes."""
    assert process.stdout is not None
    for line in process.stdout:
        lines.put(line)


def read_until(lines: queue.Queue[str], wanted: str, limit_s: float = 60.0) -> bool:
    """Take lines from `lines` until one is `wanted` (True), or none comes for `limit_s`."""
    deadline = time.monotonic() + limit_s
    while (left := deadline - time.monotonic()) > 0:
        try:
            if lines.get(timeout=left).rstrip("\n") == wanted:
                return True
        except queue.Empty:
            return False
    return False
