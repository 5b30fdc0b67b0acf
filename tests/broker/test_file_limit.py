"""pylogd's limit of open files (broker.processes.ensure_file_limit and segment_file_limit;
docs/storage.md, "File descriptors"): started under a soft limit too low, it raises the soft
limit, so that every partition can be read; without log.max_open_files a worker keeps as many
segment files open as the limits allow; under a hard limit too low for the log.max_open_files
set, it refuses to start with one line that says what to change. Real pylogd processes started
through prlimit(1)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from broker.client import Admin, PartitionConsumer, Producer
from broker.protocol import Ack
from broker.zookeeper import PrivateZooKeeper
from tests.pylogd import RunningBroker

PARTITIONS = 280
"""More than the soft limits given (256) and than log.max_open_files set to 256."""


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
    *flags: str,
) -> RunningBroker:
    broker = RunningBroker(root / f"nofile-{soft}-{hard}", zookeeper.connect_string, chroot)
    broker.command = ["prlimit", f"--nofile={soft}:{hard}", "--", *broker.command, *flags]
    started.append(broker)
    return broker


def test_a_soft_limit_below_max_open_files_is_raised_and_every_partition_reads(
    limited: list[RunningBroker], zookeeper: PrivateZooKeeper, registry_chroot: str, tmp_path: Path
) -> None:
    broker = under_limit(limited, zookeeper, registry_chroot, tmp_path, 256, 4096).start()
    limits = Path(f"/proc/{broker.worker_pids()[0]}/limits").read_text()
    (line,) = [line for line in limits.splitlines() if line.startswith("Max open files")]
    assert line.split()[3:5] == ["4096", "4096"]  # the workers inherited the raised limit
    log = broker.log_path.read_text()
    assert "open files: soft limit raised from 256 to 4096" in log
    assert "a worker keeps up to 3968 segment files open (the limits')" in log  # 4096 - 128
    write_and_read_every_partition(broker)


def test_without_max_open_files_a_worker_keeps_what_a_low_hard_limit_allows(
    limited: list[RunningBroker], zookeeper: PrivateZooKeeper, registry_chroot: str, tmp_path: Path
) -> None:
    """log.max_open_files none under a hard limit of 256: 128 segment files, so pylogd starts
    (it stopped there while the default was 256) and serves more partitions than that."""
    broker = under_limit(limited, zookeeper, registry_chroot, tmp_path, 256, 256).start()
    assert "a worker keeps up to 128 segment files open" in broker.log_path.read_text()
    write_and_read_every_partition(broker)
    (worker,) = broker.worker_pids()
    assert len(list(Path(f"/proc/{worker}/fd").iterdir())) < 256


def write_and_read_every_partition(broker: RunningBroker) -> None:
    """A message to each of PARTITIONS partitions, acked as flushed, and each read back."""
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
    broker = under_limit(
        limited, zookeeper, registry_chroot, tmp_path, 256, 256, "--log-max-open-files", "256"
    ).launch()
    assert broker.process is not None
    assert broker.process.wait(timeout=60) != 0
    lines = broker.log_path.read_text().splitlines()
    (line,) = [text for text in lines if "log.max_open_files" in text]
    assert "a worker needs up to 384 file descriptors, but this process may open 256" in line
    assert "LimitNOFILE=" in line and "lower log.max_open_files to at most 128" in line
