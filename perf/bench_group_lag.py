"""What `pylogctl group describe` costs: the lag of a group of 8 partitions, each 4 MiB behind
(100-byte values), counted exactly up to `count_bytes` per partition and estimated beyond.

    flock /tmp/bench.lock .venv/bin/python -m perf.bench_group_lag [--runs 5]

It starts one pylogd (its private ZooKeeper included) under a temporary folder, stores the
messages, commits offset 0 for a group, and times GroupReader.describe (what describe and each
refresh of --watch run) for several `count_bytes`, the median of `--runs`, with the bytes each
reads from the broker (count_bytes per partition, at most) and what it says the lag is.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from broker.client import Admin, Cluster, Producer
from broker.groups.lag import GroupReader
from broker.protocol import Ack
from broker.registry import Registry
from perf.pylog_runs import PrivatePylogd

TOPIC = "bench-lag"
GROUP = "bench-lag-group"
PARTITIONS = 8
BACKLOG_BYTES = 4 << 20
VALUE = b"v" * 100


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as root, PrivatePylogd(Path(root) / "pylogd") as pylogd:
        with Admin(pylogd.endpoint) as admin:
            admin.create_topic(TOPIC, PARTITIONS)
            address = admin.zookeeper()
        size = 26 + len(VALUE)
        count = BACKLOG_BYTES // size
        with Producer(pylogd.endpoint, TOPIC, ack=Ack.FLUSHED, batch_messages=500) as producer:
            for partition in range(PARTITIONS):
                for _ in range(count):
                    producer.send(VALUE, partition=partition)
        with (
            Registry(address.connect, address.chroot) as registry,
            Cluster((), retries=0) as cluster,
        ):
            reader = GroupReader(registry.groups, registry.topics, registry.brokers, cluster)
            config = registry.topics.topic_config(TOPIC)
            for number, holder in enumerate(config.brokers):
                registry.groups.commit_offset(GROUP, TOPIC, f"{holder}-{number}", 0)
            print(
                f"{PARTITIONS} partitions, each {count:,} messages ({count * size:,} bytes) behind"
            )
            for count_bytes in (64 << 10, 256 << 10, 1 << 20, 4 << 20):
                times = []
                for _ in range(args.runs):
                    started = time.perf_counter()
                    lag = reader.describe(GROUP, count_bytes=count_bytes)
                    times.append(time.perf_counter() - started)
                median_ms = statistics.median(times) * 1000
                shown = f"{'~' if lag.lag_messages_estimated else ''}{lag.lag_messages:,}"
                print(
                    f"count_bytes {count_bytes >> 10:>5} KiB: describe {median_ms:7.1f} ms "
                    f"(median of {args.runs}), reads ~{PARTITIONS * count_bytes >> 10:,} KiB, "
                    f"lag {lag.lag_bytes:,} bytes, {shown} messages"
                )


if __name__ == "__main__":
    main()
