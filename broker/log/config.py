"""The settings of a partition log, with their defaults and the checks on them."""

from __future__ import annotations

from dataclasses import dataclass

from broker.log.message import HEADER_SIZE

DAY_MS = 24 * 60 * 60 * 1000
MAX_SEGMENT_BYTES = (1 << 31) - 1
"""Index entries are u32 positions; a segment also stays well inside what mmap handles."""


@dataclass(frozen=True, slots=True)
class LogConfig:
    """How one partition log stores, flushes, rolls and deletes data.

    Sizes are bytes, durations milliseconds; None switches a limit off.
    """

    flush_messages: int = 10_000
    """Flush once this many messages are pending."""
    flush_interval_ms: int = 1_000
    """Flush once the oldest pending message has waited this long."""
    fsync: bool = True
    """Whether a flush fsyncs the segment (durability) or only makes data visible."""
    segment_bytes: int = 1 << 30
    """Roll to a new segment before one would grow past this size."""
    segment_ms: int | None = 7 * DAY_MS
    """Roll to a new segment when the active one has been active this long (checked on append;
    a restart starts the count again, as the time a segment became active is not stored)."""
    retention_ms: int | None = 7 * DAY_MS
    """Delete closed segments last modified longer ago than this."""
    retention_bytes: int | None = None
    """Delete the oldest closed segments while the rest still hold at least this many bytes."""
    max_message_bytes: int = 1 << 20
    """The largest message accepted, counted on disk (header, key and value)."""
    index_interval_bytes: int = 4096
    """Bytes between sparse index entries: the most a boundary check walks."""

    def __post_init__(self) -> None:
        problems = []
        for name in (
            "flush_messages",
            "flush_interval_ms",
            "segment_bytes",
            "index_interval_bytes",
        ):
            if getattr(self, name) < 1:
                problems.append(f"{name} must be at least 1, not {getattr(self, name)}")
        for name in ("segment_ms", "retention_ms", "retention_bytes"):
            value = getattr(self, name)
            if value is not None and value < 1:
                problems.append(f"{name} must be at least 1 or None (no limit), not {value}")
        if self.segment_bytes > MAX_SEGMENT_BYTES:
            problems.append(f"segment_bytes must be at most {MAX_SEGMENT_BYTES}")
        if self.max_message_bytes < HEADER_SIZE:
            problems.append(
                f"max_message_bytes must be at least {HEADER_SIZE}, not {self.max_message_bytes}"
            )
        if problems:
            raise ValueError("invalid log configuration: " + "; ".join(problems))
