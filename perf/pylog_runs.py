"""pylog's side of the paper's experiments: a private pylogd, and the producer, consumer and
latency runs against it through the Python client (broker.client), as a user would run them.

- `produce`: one Producer sends N messages of 200 bytes, built in the timed loop (encode_message:
  header and XXH3 checksum), in batches of `batch` messages. With ack NONE (the paper's
  producer, which never waits) the run ends when the broker holds all N for consumers: its
  high watermark, asked with OFFSETS, reaches the bytes sent (`held_all`: empty ack=all
  markers after them make the flush, so the flush timer is never waited for). With ack
  FLUSHED, when the last batch is acked; up to `max_in_flight` batches wait for their acks at
  once (the Producer's default is 5). `visible_after_s` is the time from the last send to
  all N visible.
- `consume`: one PartitionConsumer reads N stored messages with fetches of `fetch_bytes` (about
  1,000 messages), decoding every message and verifying its checksum (iter_messages).
- `latency`: a producer thread sends at a fixed rate, each message carrying its send time; the
  consumer in the main thread long-polls and records receive time - send time.

Each result is a dict: messages, seconds, client_cpu_s, broker_cpu_s (supervisor, workers and
private ZooKeeper), for `produce` also visible_after_s, and for latency p50_ms, p99_ms, max_ms.
"""

from __future__ import annotations

import contextlib
import re
import struct
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from broker.client import Admin, Connection, PartitionConsumer, Producer
from broker.log import encode_message
from broker.log.message import HEADER_SIZE
from broker.protocol import LATEST, Ack, OffsetsRequest, ProduceRequest
from broker.security import ClientKeys
from perf.cpu import cpu_seconds, rss_bytes, tree_pids
from perf.latency import latency_summary

MESSAGE_BYTES = 200
VALUE_BYTES = MESSAGE_BYTES - HEADER_SIZE
READY_PREFIX = "pylogd ready on "


Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]
"""A metrics endpoint's samples, by name and sorted labels."""


def scrape(url: str) -> Samples:
    """Every sample of the metrics endpoint at `url`, by name and sorted labels, parsed as
    Prometheus would."""
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def metrics_of(log_path: Path) -> Samples:
    """The samples of the metrics endpoint a pylogd's log (`log_path`) says it serves."""
    found = re.findall(r"metrics on (http://\S+/metrics)", log_path.read_text(errors="replace"))
    if not found:
        raise RuntimeError(f"pylogd did not say where its metrics are: see {log_path}")
    return scrape(found[-1])


class PrivatePylogd:
    """pylogd with its defaults (private ZooKeeper included) on a free port under `data_dir`;
    `program` is the command that starts it (.venv's pylogd when empty)."""

    def __init__(self, data_dir: Path, *flags: str, program: tuple[str, ...] = ()) -> None:
        self.data_dir = data_dir
        self.flags = flags
        self.program = program or (str(Path(sys.executable).with_name("pylogd")),)
        self.process: subprocess.Popen[str] | None = None
        self.endpoint = ""

    def __enter__(self) -> PrivatePylogd:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        command = [*self.program, "--broker-data-dir", str(self.data_dir), "--broker-port", "0"]
        with open(self.data_dir / "pylogd.log", "a") as log:
            self.process = subprocess.Popen(
                [*command, *self.flags], stdout=subprocess.PIPE, stderr=log, text=True
            )
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        if not line.startswith(READY_PREFIX):
            self.__exit__()
            raise RuntimeError(f"pylogd did not start: see {self.data_dir / 'pylogd.log'}")
        self.endpoint = "tcp://" + line[len(READY_PREFIX) :].strip()
        return self

    def pids(self) -> list[int]:
        assert self.process is not None
        return tree_pids(self.process.pid)

    def metrics(self) -> Samples:
        """Every sample of its metrics endpoint (started with --metrics-enabled true)."""
        return metrics_of(self.data_dir / "pylogd.log")

    def __exit__(self, *exc_info: object) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


@contextlib.contextmanager
def fresh_topic(endpoint: str, name: str, keys: ClientKeys | None = None) -> Iterator[str]:
    with Admin(endpoint, keys=keys) as admin:
        admin.create_topic(name, 1)
        try:
            yield name
        finally:
            admin.delete_topic(name)


def _value(i: int) -> bytes:
    return b"%012d" % i + b"x" * (VALUE_BYTES - 12)


def produce(
    broker: PrivatePylogd,
    topic: str,
    messages: int,
    batch: int,
    ack: Ack,
    limit_s: float = 600,
    keys: ClientKeys | None = None,
    max_in_flight: int = 5,
) -> dict[str, Any]:
    """Send `messages` 200-byte messages in batches of `batch`; see the module docstring."""
    pids = broker.pids()
    expected_bytes = messages * MESSAGE_BYTES
    with (
        Producer(
            broker.endpoint,
            topic,
            ack=ack,
            batch_messages=batch,
            linger_ms=60_000,
            max_in_flight=max_in_flight,
            keys=keys,
        ) as producer,
        Connection(broker.endpoint, keys=keys) as watcher,
    ):
        broker_cpu = cpu_seconds(pids)
        client_cpu = time.process_time()
        start = time.perf_counter()
        deadline = time.monotonic() + limit_s
        for i in range(messages):
            producer.send(_value(i), partition=0)
        producer.flush()
        sent = time.perf_counter()
        held_all(watcher, topic, expected_bytes, deadline)
        end = time.perf_counter()
        return {
            "messages": messages,
            "seconds": end - start,
            "visible_after_s": end - sent,
            "client_cpu_s": time.process_time() - client_cpu,
            "broker_cpu_s": cpu_seconds(pids) - broker_cpu,
        }


def held_all(watcher: Connection, topic: str, sent_bytes: int, deadline: float) -> None:
    """Return once partition 0 of `topic` holds `sent_bytes` for consumers (its high watermark
    reaches them), without waiting for the broker's flush timer: each time it does not yet,
    an empty message is produced at ack=all, and its flush takes what has come before it.
    Its ack waits for the high watermark to pass it (every in-sync replica flushed it, one
    replica or three), so it is asked for again only for messages that reached the leader
    after it (on the producer's own connection). At ack=flushed, a replicated partition's
    markers chased its followers: each was asked for before they had copied the last, and
    each added bytes to wait for. Raises TimeoutError past `deadline` (time.monotonic)."""
    marker = encode_message(b"")
    latest = OffsetsRequest(topic, 0, LATEST)
    while (held := watcher.call(latest).offset) < sent_bytes:
        if time.monotonic() > deadline:
            raise TimeoutError(f"pylog held {held} of {sent_bytes} bytes")
        watcher.call(ProduceRequest(topic, 0, Ack.ALL, marker))
        sent_bytes += len(marker)


def consume(
    broker: PrivatePylogd,
    topic: str,
    messages: int,
    fetch_bytes: int = 1000 * MESSAGE_BYTES,
    keys: ClientKeys | None = None,
) -> dict[str, Any]:
    """Read `messages` stored messages, every checksum verified."""
    pids = broker.pids()
    with PartitionConsumer(
        broker.endpoint,
        topic,
        0,
        start="earliest",
        fetch_bytes=fetch_bytes,
        max_wait_ms=0,
        keys=keys,
    ) as consumer:
        broker_cpu = cpu_seconds(pids)
        client_cpu = time.process_time()
        start = time.perf_counter()
        count = 0
        while count < messages:
            batch = consumer.poll()
            if not batch:
                raise RuntimeError(f"only {count} of {messages} messages stored")
            count += len(batch)
        seconds = time.perf_counter() - start
    return {
        "messages": count,
        "seconds": seconds,
        "client_cpu_s": time.process_time() - client_cpu,
        "broker_cpu_s": cpu_seconds(pids) - broker_cpu,
    }


_SENT_AT = struct.Struct(">q")


def latency(
    broker: PrivatePylogd, topic: str, rate: int = 10_000, seconds: float = 10.0
) -> dict[str, Any]:
    """Produce at `rate` msg/s for `seconds` (batches of up to 1 ms worth, ack NONE) while
    consuming; per message, receive time - send time."""
    total = int(rate * seconds)
    delays: list[float] = []

    def send() -> None:
        with Producer(
            broker.endpoint, topic, ack=Ack.NONE, batch_messages=max(1, rate // 1000), linger_ms=1
        ) as producer:
            start = time.monotonic()
            for i in range(total):
                due = start + i / rate
                pause = due - time.monotonic()
                if pause > 0:
                    time.sleep(pause)
                sent = _SENT_AT.pack(time.monotonic_ns())
                producer.send(sent + b"x" * (VALUE_BYTES - len(sent)), partition=0)
            producer.flush()

    with PartitionConsumer(broker.endpoint, topic, 0, start="latest", max_wait_ms=100) as consumer:
        consumer.poll(max_wait_ms=0)
        sender = threading.Thread(target=send, daemon=True)
        sender.start()
        deadline = time.monotonic() + seconds + 30
        while len(delays) < total and time.monotonic() < deadline:
            for message in consumer.poll():
                now = time.monotonic_ns()
                delays.append((now - _SENT_AT.unpack_from(message.value)[0]) / 1e6)
        sender.join(30)
    return latency_summary(delays, total)


def rss(broker: PrivatePylogd) -> int:
    return rss_bytes(broker.pids())
