"""Audit records: what a producer had acknowledged, per hour of its messages' timestamps,
published to an audit topic for the audit job to compare with what the log holds and what was
loaded (the Kafka paper's audit; docs/pipeline.md, "Audit").

A record is one message of the audit topic, keyed by the producer's id, whose value is JSON:

    {"producer": "a3f0c2...", "topic": "clicks", "window_start_ms": 1763805600000,
     "window_ms": 3600000, "count": 1200, "digest": "9f1c03b2e5d4a781"}

`count` is the producer's running total for that topic and window, so a record sent again (a
retry), or a later one, never adds to the total: the audit takes the largest count of each
(producer, topic, window) and sums over producers. Windows are whole UTC hours. `digest` is the
running sum, modulo 2**64, of `message_digest` of each message counted, as 16 hex digits: the
audit sums the digests of those records as it does their counts and compares the sum with the
same sum over what each stage holds, so a message changed, replaced or moved is caught even
when the counts agree. It is null when a message counted has no known offset (ack NONE).
"""

from __future__ import annotations

import json
import struct
import uuid
from dataclasses import asdict, dataclass
from typing import Any, Final, Protocol

import xxhash

from broker.clock import Clock

WINDOW_MS: Final = 3_600_000
"""An audit window: one hour of message timestamps, from a whole UTC hour."""
DIGEST_MODULUS: Final = 1 << 64
"""Digests add up modulo this: a sum does not depend on the order of its messages."""
_DIGESTED_HEAD: Final = struct.Struct("<iqqq")
"""What `message_digest` hashes before the key and value: partition, offset, timestamp (ms)
and the key's length (-1: none)."""


def message_digest(
    partition: int, offset: int, timestamp_ms: int, key: bytes | None, value: bytes
) -> int:
    """The audit's hash of one message as stored: xxh3_64 of its partition, offset, timestamp,
    key (its length first, -1 for none) and value. Headers are left out (a load's Parquet does
    not keep them)."""
    head = _DIGESTED_HEAD.pack(partition, offset, timestamp_ms, -1 if key is None else len(key))
    return xxhash.xxh3_64_intdigest(b"".join((head, key or b"", value)))


@dataclass(frozen=True, slots=True)
class AuditRecord:
    producer: str
    topic: str
    window_start_ms: int
    window_ms: int
    count: int
    digest: str | None = None

    def encode(self) -> bytes:
        return json.dumps(asdict(self)).encode()


class ProducedCounts:
    """A producer's running totals per window (messages, and the sum of their digests: None
    once one had no known offset), and which changed since they were last taken."""

    def __init__(self, topic: str) -> None:
        self.topic = topic
        self.producer = uuid.uuid4().hex
        self._totals: dict[int, int] = {}
        self._digests: dict[int, int | None] = {}
        self._changed: set[int] = set()

    def add(self, window: int, digest: int | None) -> None:
        """Count one message acknowledged in `window` (timestamp_ms // WINDOW_MS), with its
        message_digest (None when its offset is not known)."""
        self._totals[window] = self._totals.get(window, 0) + 1
        total = self._digests.get(window, 0)
        self._digests[window] = (
            None if total is None or digest is None else (total + digest) % DIGEST_MODULUS
        )
        self._changed.add(window)

    def take_changed(self) -> list[AuditRecord]:
        """The records of the windows whose total changed since the last call."""
        changed, self._changed = sorted(self._changed), set()
        return [
            AuditRecord(
                self.producer,
                self.topic,
                w * WINDOW_MS,
                WINDOW_MS,
                self._totals[w],
                None if (d := self._digests[w]) is None else f"{d:016x}",
            )
            for w in changed
        ]


class AuditSink(Protocol):
    """Where audit records go: a Producer of the audit topic."""

    def send(self, value: Any, key: Any = None) -> object: ...

    def flush(self) -> object: ...

    def close(self) -> None: ...


class AuditPublisher:
    """A producer's audit: its `counts`, published to the audit topic through `sink` (a
    Producer of that topic, acknowledged as flushed) every `interval_s` of `clock` (the
    producer asks `due` when it sends a batch) and whenever `publish` is called (flush)."""

    def __init__(
        self, sink: AuditSink, counts: ProducedCounts, interval_s: float, clock: Clock
    ) -> None:
        self.sink = sink
        self.counts = counts
        self.interval_s = interval_s
        self.clock = clock
        self._due = clock.monotonic() + interval_s

    def due(self) -> bool:
        return self.clock.monotonic() >= self._due

    def publish(self) -> None:
        """Send the records of the windows whose counts changed, and wait for their acks."""
        for record in self.counts.take_changed():
            self.sink.send(record.encode(), record.producer.encode())
        self.sink.flush()
        self._due = self.clock.monotonic() + self.interval_s

    def close(self) -> None:
        self.sink.close()
