"""Two clusters on one machine (each a broker with its private ZooKeeper) and `pylog-mirror`
processes between them."""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from broker.client import Admin
from broker.protocol import FetchRequest
from perf.pylog_runs import metrics_of
from tests.cluster.conftest import three_brokers  # noqa: F401 (a fixture)
from tests.conftest import single_box_flags, wait_until
from tests.pylogd import RunningBroker


class MirrorProcess:
    """`pylog-mirror --config <dir>/mirror.toml`, stderr to <dir>/mirror.log."""

    def __init__(self, directory: Path, config: str) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.config_path = directory / "mirror.toml"
        self.config_path.write_text(config)
        self.log_path = directory / "mirror.log"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> MirrorProcess:
        command = [str(Path(sys.executable).with_name("pylog-mirror")), "--config"]
        with open(self.log_path, "a") as log:
            self.process = subprocess.Popen([*command, str(self.config_path)], stderr=log)
        return self

    def kill(self) -> None:
        assert self.process is not None
        self.process.kill()
        self.process.wait()

    def stop(self, timeout: float = 30.0) -> int:
        assert self.process is not None
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def metrics(self) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        wait_until(lambda: "metrics on http" in self.log(), 30, "the mirror's metrics")
        return metrics_of(self.log_path)


def mirror_config(source: str, target: str, topics: list[str], extra: str = "") -> str:
    quoted = ", ".join(f'"{t}"' for t in topics)
    return (
        f'[source]\nbootstrap = "{source}"\n\n[target]\nbootstrap = "{target}"\n\n'
        f"[mirror]\ntopics = [{quoted}]\ndiscover_interval_s = 0.5\nprogress_interval_s = 2\n"
        "session_timeout_s = 2.0\n"
        f"{extra}"
    )


@pytest.fixture
def clusters(
    make_pylogd: Callable[..., RunningBroker], tmp_path: Path
) -> tuple[RunningBroker, RunningBroker]:
    """A source and a target cluster, each one broker with its own private ZooKeeper."""
    source = make_pylogd(*single_box_flags(tmp_path / "source"), name="source", zookeeper="")
    target = make_pylogd(*single_box_flags(tmp_path / "target"), name="target", zookeeper="")
    return source, target


@pytest.fixture
def make_mirror(tmp_path: Path) -> Iterator[Callable[..., MirrorProcess]]:
    """Start pylog-mirror processes; each is stopped (and its log shown) at the test's end."""
    started: list[MirrorProcess] = []

    def make(config: str, name: str = "mirror") -> MirrorProcess:
        mirror = MirrorProcess(tmp_path / name, config)
        started.append(mirror)
        return mirror.start()

    yield make
    for mirror in started:
        if mirror.process is not None and mirror.process.poll() is None:
            mirror.kill()
        print(f"--- {mirror.log_path}:\n{mirror.log()[-6000:]}")


def log_range(endpoint: str, topic: str, partition: int) -> tuple[int, int]:
    """(log start, high watermark) of a partition, asked of its leader in the cluster of the
    broker at `endpoint`."""
    with Admin(endpoint, timeout_s=5.0) as admin:
        state = admin.describe_partition(topic, partition)
    return state.log_start_offset, state.high_watermark


def log_bytes(endpoint: str, topic: str, partition: int, start: int, end: int) -> bytes:
    """The partition's bytes [start, end) as its leader sends them (whole message sets, as
    stored)."""
    out = bytearray()
    with Admin(endpoint, timeout_s=5.0) as admin:
        while start + len(out) < end:
            request = FetchRequest(topic, partition, start + len(out), 1 << 20, 0, 0)
            data = admin.cluster.call_leader(request, 3).message_set
            assert data, f"nothing at {start + len(out)} below {end}"
            out += data
    return bytes(out[: end - start])
