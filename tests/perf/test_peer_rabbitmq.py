"""perf/peer_rabbitmq.py against a real private RabbitMQ node, with small counts.

It checks that every experiment moves exactly the messages it says and that the node leaves no
process behind; it times nothing (perf/ is run by hand, alone on the machine)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

pytest.importorskip("pika", reason="pika is not installed: run scripts/perf-setup")

from perf.peer_rabbitmq import PrivateRabbitMQ, consume, installed, latency, produce
from tests.conftest import wait_until

pytestmark = [
    pytest.mark.slow,  # ~20 s: the node alone takes 5-8 s to boot
    pytest.mark.skipif(
        not installed(), reason="rabbitmq-server is not installed: run scripts/perf-setup"
    ),
]

MESSAGES = 2000


def processes_mentioning(text: str) -> list[int]:
    """Processes whose command line contains `text` (the node's directory or epmd port)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if text in cmdline:
            found.append(int(entry.name))
    return found


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"  # a zombie has exited; only its parent's wait is missing


def test_private_node_runs_every_experiment_and_stop_leaves_no_process(tmp_path: Path) -> None:
    node = PrivateRabbitMQ(tmp_path / "rabbitmq", start_timeout_s=60)
    with node:
        assert node.url == f"amqp://guest:guest@127.0.0.1:{node.port}/%2F"
        pids = node.pids()
        assert pids, "the node has processes"
        for batch in (1, 50):
            for confirm in (False, True):
                result = produce(node.url, "produce", MESSAGES, batch, confirm, pids=pids)
                assert result["messages"] == MESSAGES, (batch, confirm)
                assert result["seconds"] > 0
                assert result["broker_cpu_s"] > 0, "the broker's CPU is seen"

        result = consume(node.url, "consume", MESSAGES, pids=pids)
        assert result["messages"] == MESSAGES
        assert result["client_cpu_s"] > 0

        result = latency(node.url, "latency", rate=1000, seconds=1)
        assert result["messages"] == 1000
        assert 0 <= result["p50_ms"] <= result["p99_ms"] <= result["max_ms"]

        ours = node.all_pids()
        epmd_port = node.rabbitmqctl("eval", 'os:getenv("ERL_EPMD_PORT").').strip('"\n')
        assert epmd_port.isdigit()

    wait_until(lambda: not any(alive(pid) for pid in ours), 10, "the node's processes to exit")
    leftovers = processes_mentioning(str(tmp_path)) + processes_mentioning(f"-port {epmd_port}")
    assert [pid for pid in leftovers if alive(pid) and pid != os.getpid()] == []
