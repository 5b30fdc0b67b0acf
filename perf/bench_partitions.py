"""Keyed traffic over many partitions against the same over one (issue 48's targets): what a
producer gets when its keys spread its messages over 100 or 1,000 partitions of one broker,
as a ratio to one partition in the same run.

    flock /tmp/bench.lock .venv/bin/python perf/bench_partitions.py \\
        [--partitions 1,100,1000] [--seconds 10] [--only native|kafka] [--dir DIR]

One private pylogd (its defaults, private ZooKeeper included: perf/pylog_runs.py's
PrivatePylogd) under --dir; for each case a fresh topic of that many partitions, then for at
most --seconds (and 2,000,000 messages) one producer sends 100-byte messages whose keys are a
counter's bytes (xxh32 of the key spreads them evenly), then flushes; the rate is the
messages acknowledged over the whole time, flush included:

- `native`: broker.client's Producer at ack=flushed, batches of 50, 100 batches in flight
  (issue 48's first figure);
- `kafka`: broker.client.kafka's Producer (confluent-kafka's shape) with `acks` all and
  `linger.ms` 5, delivery callbacks counted in `poll(0)`.

Prints one JSON line a case (messages, seconds, msg/s, ratio to the same client's one
partition, and for `kafka` on one partition its ratio to `native` on one), then one line of
the targets and whether each holds. Run it alone: on 2 cores anything beside it skews it.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from broker.client import Admin, Producer, kafka
from broker.log.message import HEADER_SIZE
from broker.protocol import Ack
from perf.pylog_runs import PrivatePylogd

MESSAGE_BYTES = 100
MAX_MESSAGES = 2_000_000
KEY_BYTES = 8
VALUE = b"v" * (MESSAGE_BYTES - HEADER_SIZE - KEY_BYTES)


def _key(i: int) -> bytes:
    return i.to_bytes(KEY_BYTES, "big")


def native(endpoint: str, topic: str, seconds: float) -> tuple[int, float]:
    """Messages acked and the seconds they took: the topic-bound Producer at ack=flushed."""
    with Producer(
        endpoint, topic, ack=Ack.FLUSHED, batch_messages=50, linger_ms=5, max_in_flight=100
    ) as producer:
        start = time.perf_counter()
        stop = start + seconds
        sent = 0
        while sent < MAX_MESSAGES and (sent % 1000 or time.perf_counter() < stop):
            producer.send(VALUE, key=_key(sent))
            sent += 1
        producer.flush()
        return sent, time.perf_counter() - start


def kafka_shaped(endpoint: str, topic: str, seconds: float) -> tuple[int, float]:
    """Messages acked and the seconds they took: the Kafka-shaped Producer, acks all."""
    delivered = 0

    def count(error: Any, message: Any) -> None:
        nonlocal delivered
        if error is not None:
            raise RuntimeError(f"a delivery failed: {error}")
        delivered += 1

    producer = kafka.Producer({"bootstrap.servers": endpoint, "acks": "all", "linger.ms": 5})
    try:
        start = time.perf_counter()
        stop = start + seconds
        sent = 0
        while sent < MAX_MESSAGES and (sent % 1000 or time.perf_counter() < stop):
            producer.produce(topic, VALUE, key=_key(sent), on_delivery=count)
            sent += 1
            if sent % 1000 == 0:
                producer.poll(0)
        if producer.flush(60) != 0:
            raise RuntimeError("the Kafka-shaped producer did not deliver everything in 60 s")
        seconds_taken = time.perf_counter() - start
    finally:
        producer.close()
    if delivered != sent:
        raise RuntimeError(f"{delivered} of {sent} delivered")
    return sent, seconds_taken


CLIENTS: dict[str, Callable[[str, str, float], tuple[int, float]]] = {
    "native": native,
    "kafka": kafka_shaped,
}
TARGETS = {("native", 100): 0.8, ("native", 1000): 0.5, ("kafka", 100): 0.8}
"""Issue 48: the least ratio to one partition each case must reach."""
KAFKA_TO_NATIVE = 0.9


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--partitions", default="1,100,1000")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--only", choices=sorted(CLIENTS))
    parser.add_argument("--dir", type=Path)
    args = parser.parse_args()
    counts = [int(p) for p in args.partitions.split(",")]
    rates: dict[tuple[str, int], float] = {}
    with tempfile.TemporaryDirectory(dir=args.dir) as data, PrivatePylogd(Path(data)) as broker:
        for name, client in CLIENTS.items():
            if args.only and name != args.only:
                continue
            for partitions in counts:
                topic = f"{name}-{partitions}"
                with Admin(broker.endpoint) as admin:
                    admin.create_topic(topic, partitions)
                messages, seconds = client(broker.endpoint, topic, args.seconds)
                rate = rates[(name, partitions)] = messages / seconds
                line: dict[str, Any] = {
                    "client": name,
                    "partitions": partitions,
                    "messages": messages,
                    "seconds": round(seconds, 2),
                    "msg_per_s": round(rate),
                }
                if (name, 1) in rates:
                    line["ratio_to_one_partition"] = round(rate / rates[(name, 1)], 3)
                if name == "kafka" and partitions == 1 and ("native", 1) in rates:
                    line["ratio_to_native"] = round(rate / rates[("native", 1)], 3)
                print(json.dumps(line), flush=True)
                with Admin(broker.endpoint) as admin:
                    admin.delete_topic(topic)
    targets = {
        f"{name} over {p}: >= {least}x": round(rates[(name, p)] / rates[(name, 1)], 3) >= least
        for (name, p), least in TARGETS.items()
        if (name, p) in rates and (name, 1) in rates
    }
    if ("kafka", 1) in rates and ("native", 1) in rates:
        ratio = rates[("kafka", 1)] / rates[("native", 1)]
        targets[f"kafka on 1 to native: >= {KAFKA_TO_NATIVE}x"] = ratio >= KAFKA_TO_NATIVE
    print(json.dumps({"targets_held": targets}), flush=True)


if __name__ == "__main__":
    main()
