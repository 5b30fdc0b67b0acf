"""Acks of keyed traffic at a steady rate over many partitions on three brokers (issue 48's
moderate load, below saturation): how long each message waits for its ack, and what the
machine spends on it.

    flock /tmp/bench.lock .venv/bin/python -m perf.bench_ack_latency [--factor 2]
        [--partitions 900] [--rate 1000] [--seconds 8] [--warm-s 10]

Three pylogd brokers (perf/bench_replication.py's cluster: a private ZooKeeper, all on
127.0.0.1 under a temporary folder), a topic of `--partitions` at replication factor
`--factor` (min_insync_replicas 1) whose ISRs are waited for, `--warm-s` of traffic first (as
fast as it goes); then a producer (acks all, batches of 50, linger 5 ms, 100 requests in
flight) sends `--rate` messages a second of 84 bytes for `--seconds`, each keyed by its number
(spread over the partitions by the key's hash). It prints one JSON line: each message's time
from its send to its Delivery's done callback as percentiles (ms), each broker's CPU and its
worker's (a share of a core), the producer process's, and how busy the machine was
(/proc/stat, all cores, idle and iowait counted idle). Run it alone on the machine.

At 1,000 msg/s over 900 partitions at factor 2 a partition gets a message about once a second:
each batch holds one, and what the acks wait on is the replication path's work per partition
(the followers' rounds, the flushes), which fetch sessions cut (perf/README.md).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from broker.client import Admin, Delivery, Producer
from broker.protocol import Ack
from perf.bench_partitions import broker_pids
from perf.bench_replication import BROKERS, BenchCluster, running_cluster, wait_for
from perf.cpu import own_cpu_seconds

VALUE = b"v" * 84
TOPIC = "acks"
SESSION_TIMEOUT_MS = 6000
TICK_TIME_MS = 2000
PACE_S = 0.002
"""How often the paced loop looks at the clock (and takes acks) between sends."""


def machine_idle() -> tuple[int, int]:
    """Idle and iowait jiffies, and all jiffies, of every core so far (/proc/stat)."""
    fields = [int(f) for f in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return fields[3] + fields[4], sum(fields)


def percentile(sorted_values: list[float], share: float) -> float:
    """The value at `share` (0..1) of `sorted_values` (nearest rank), in ms."""
    return round(sorted_values[int(share * (len(sorted_values) - 1))] * 1000, 1)


def keyed_producer(endpoint: str) -> Producer:
    return Producer(endpoint, TOPIC, ack=Ack.ALL, batch_messages=50, linger_ms=5, max_in_flight=100)


def warm(endpoint: str, seconds: float) -> None:
    """Keyed traffic as fast as it goes for `seconds`, every message acked."""
    with keyed_producer(endpoint) as producer:
        start, sent = time.monotonic(), 0
        while time.monotonic() - start < seconds:
            producer.send(VALUE, key=sent.to_bytes(8, "big"))
            sent += 1
        producer.flush()


def paced(endpoint: str, rate: int, seconds: float) -> list[float]:
    """Send `rate` keyed messages a second, `rate` x `seconds` of them, each when due: each
    one's seconds until its ack (every message must be acked: a failed delivery raises)."""
    waits: list[float] = []
    failures: list[BaseException] = []
    lock = threading.Lock()

    def done(sent_at: float) -> Any:
        def acked(delivery: Delivery) -> None:
            error = delivery.exception()
            with lock:
                if error is not None:
                    failures.append(error)
                else:
                    waits.append(time.monotonic() - sent_at)

        return acked

    total = round(rate * seconds)
    with keyed_producer(endpoint) as producer:
        start, sent = time.monotonic(), 0
        while sent < total:
            while sent < total and start + sent / rate <= time.monotonic():  # the ones due
                key = sent.to_bytes(8, "big")
                producer.send(VALUE, key=key).add_done_callback(done(time.monotonic()))
                sent += 1
            producer.poll(PACE_S)
        producer.flush()
    if failures:
        raise RuntimeError(f"{len(failures)} deliveries failed, the first: {failures[0]}")
    if len(waits) != sent:
        raise RuntimeError(f"{sent} messages sent, {len(waits)} acked")
    return sorted(waits)


def measure(
    cluster: BenchCluster, factor: int, partitions: int, rate: int, seconds: float, warm_s: float
) -> dict[str, Any]:
    endpoint = cluster.endpoint(1)
    config = {"replication_factor": str(factor), "min_insync_replicas": "1"}
    with Admin(endpoint, timeout_s=120) as admin:
        admin.create_topic(TOPIC, partitions, config)
        wait_for(
            lambda: all(len(p.isr) == factor for p in admin.cluster.partitions(TOPIC)),
            "every ISR to fill",
        )
    if warm_s > 0:
        warm(endpoint, warm_s)
    brokers = {b: broker_pids(cluster.brokers[b]) for b in BROKERS}
    workers = {b: pids[1:] for b, pids in brokers.items()}  # the supervisor first
    before = {b: (own_cpu_seconds(brokers[b]), own_cpu_seconds(workers[b])) for b in BROKERS}
    idle_before = machine_idle()
    process_before = time.process_time()
    started = time.monotonic()
    waits = paced(endpoint, rate, seconds)
    taken = time.monotonic() - started
    idle_after = machine_idle()
    busy = 1 - (idle_after[0] - idle_before[0]) / (idle_after[1] - idle_before[1])
    return {
        "factor": factor,
        "partitions": partitions,
        "rate": rate,
        "messages": len(waits),
        "ack_ms": {
            "p50": percentile(waits, 0.5),
            "p90": percentile(waits, 0.9),
            "p99": percentile(waits, 0.99),
            "max": percentile(waits, 1.0),
        },
        "broker_cpu_share": {
            b: round((own_cpu_seconds(brokers[b]) - before[b][0]) / taken, 3) for b in BROKERS
        },
        "worker_cpu_share": {
            b: round((own_cpu_seconds(workers[b]) - before[b][1]) / taken, 3) for b in BROKERS
        },
        "producer_cpu_share": round((time.process_time() - process_before) / taken, 3),
        "machine_busy": round(busy, 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--factor", type=int, default=2)
    parser.add_argument("--partitions", type=int, default=900)
    parser.add_argument("--rate", type=int, default=1000)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--warm-s", type=float, default=10.0)
    parser.add_argument("--dir", type=Path)
    args = parser.parse_args()
    if not 1 <= args.factor <= len(BROKERS) or args.partitions < 1 or args.rate < 1:
        parser.error(f"--factor is 1 to {len(BROKERS)}; --partitions and --rate at least 1")
    with (
        tempfile.TemporaryDirectory(dir=args.dir) as data,
        running_cluster(Path(data), SESSION_TIMEOUT_MS, TICK_TIME_MS) as cluster,
    ):
        figures = measure(
            cluster, args.factor, args.partitions, args.rate, args.seconds, args.warm_s
        )
    print(json.dumps(figures), flush=True)


if __name__ == "__main__":
    main()
