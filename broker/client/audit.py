"""Audit records: what a producer had acknowledged, per hour of its messages' timestamps,
published to an audit topic for the audit job to compare with what the log holds and what was
loaded (the Kafka paper's audit; docs/pipeline.md, "Audit").

A record is one message of the audit topic, keyed by the producer's id, whose value is JSON:

    {"producer": "a3f0c2...", "topic": "clicks", "window_start_ms": 1763805600000,
     "window_ms": 3600000, "count": 1200}

`count` is the producer's running total for that topic and window, so a record sent again (a
retry), or a later one, never adds to the total: the audit takes the largest count of each
(producer, topic, window) and sums over producers. Windows are whole UTC hours.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import asdict, dataclass
from typing import Final

WINDOW_MS: Final = 3_600_000
"""An audit window: one hour of message timestamps, from a whole UTC hour."""


@dataclass(frozen=True, slots=True)
class AuditRecord:
    producer: str
    topic: str
    window_start_ms: int
    window_ms: int
    count: int

    def encode(self) -> bytes:
        return json.dumps(asdict(self)).encode()


class ProducedCounts:
    """A producer's running totals per window, and which changed since they were last taken."""

    def __init__(self, topic: str) -> None:
        self.topic = topic
        self.producer = uuid.uuid4().hex
        self._totals: dict[int, int] = {}
        self._changed: set[int] = set()

    def add(self, windows: dict[int, int]) -> None:
        """Count messages acknowledged: window index (timestamp_ms // WINDOW_MS) -> messages."""
        for window, count in windows.items():
            self._totals[window] = self._totals.get(window, 0) + count
            self._changed.add(window)

    def take_changed(self) -> list[AuditRecord]:
        """The records of the windows whose total changed since the last call."""
        changed, self._changed = sorted(self._changed), set()
        return [
            AuditRecord(self.producer, self.topic, w * WINDOW_MS, WINDOW_MS, self._totals[w])
            for w in changed
        ]
