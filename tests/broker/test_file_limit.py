"""pylogd's limit of open files (broker.processes.ensure_file_limit; docs/storage.md, "File
descriptors"): started under a soft limit too low for log.max_open_files, it raises the soft
limit, so that every partition can be read; under a hard limit too low, it refuses to start
with one line that says what to change. Real pylogd processes started through prlimit(1)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from broker.client import Admin, PartitionConsumer, Producer
from broker.protocol import Ack
from broker.zookeeper import PrivateZooKeeper
from tests.pylogd import RunningBroker

PARTITIONS = 280
"""More than log.max_open_files (256, the default) and the soft limit given (256)."""


@pytest.fixture
def limited(
    zookeeper: PrivateZooKeeper, registry_chroot: str, tmp_path: Path
) -> Iterator[list[RunningBroker]]:
    """pylogd processes to start under a limit of open files, stopped at the end."""
    started: list[RunningBroker] = []
    yield started
    for broker in started:
        if broker.process is not None and broker.process.poll() is None:
            broker.stop()
        print(f"--- {broker.log_path}:\n{broker.log_tail()}")


def under_limit(
    started: list[RunningBroker],
    zookeeper: PrivateZooKeeper,
    chroot: str,
    root: Path,
    soft: int,
    hard: int,
) -> RunningBroker:
    broker = RunningBroker(root / f"nofile-{soft}-{hard}", zookeeper.connect_string, chroot)
    broker.command = ["prlimit", f"--nofile={soft}:{hard}", "--", *broker.command]
    started.append(broker)
    return broker


def test_a_soft_limit_below_max_open_files_is_raised_and_every_partition_reads(
    limited: list[RunningBroker], zookeeper: PrivateZooKeeper, registry_chroot: str, tmp_path: Path
) -> None:
    broker = under_limit(limited, zookeeper, registry_chroot, tmp_path, 256, 4096).start()
    limits = Path(f"/proc/{broker.worker_pids()[0]}/limits").read_text()
    (line,) = [line for line in limits.splitlines() if line.startswith("Max open files")]
    assert line.split()[3:5] == ["4096", "4096"]  # the workers inherited the raised limit
    assert "open files: soft limit raised from 256 to 4096" in broker.log_path.read_text()
    with Admin(broker.endpoint) as admin:
        admin.create_topic("wide", PARTITIONS)
    with Producer(broker.endpoint, "wide", ack=Ack.FLUSHED) as producer:
        for number in range(PARTITIONS):
            producer.send(b"partition %d" % number, partition=number)
        producer.flush()
    read = {}
    for number in range(PARTITIONS):
        with PartitionConsumer(broker.endpoint, "wide", number, stop_at_end=True) as consumer:
            read[number] = [message.value for message in consumer]
    assert read == {n: [b"partition %d" % n] for n in range(PARTITIONS)}


def test_a_hard_limit_below_max_open_files_stops_pylogd_with_what_to_change(
    limited: list[RunningBroker], zookeeper: PrivateZooKeeper, registry_chroot: str, tmp_path: Path
) -> None:
    broker = under_limit(limited, zookeeper, registry_chroot, tmp_path, 256, 256).launch()
    assert broker.process is not None
    assert broker.process.wait(timeout=60) != 0
    lines = broker.log_path.read_text().splitlines()
    (line,) = [text for text in lines if "log.max_open_files" in text]
    assert "a worker needs up to 384 file descriptors, but this process may open 256" in line
    assert "LimitNOFILE=" in line and "lower log.max_open_files to at most 128" in line
