"""The settings of a partition log, with their defaults and the checks on them."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from broker.log.message import HEADER_SIZE

DAY_MS = 24 * 60 * 60 * 1000
MAX_SEGMENT_BYTES = (1 << 31) - 1
"""Index entries are u32 positions; a segment also stays well inside what mmap handles."""
MAX_SETTING: Final = (1 << 63) - 1
"""The largest value of any setting: an i64, as ZooKeeper's JSON and every client hold it."""

BOUNDS: Final[Mapping[str, tuple[int, int]]] = {
    "flush_messages": (1, MAX_SETTING),
    "flush_interval_ms": (1, MAX_SETTING),
    "segment_bytes": (HEADER_SIZE, MAX_SEGMENT_BYTES),
    "segment_ms": (1, MAX_SETTING),
    "retention_ms": (1, MAX_SETTING),
    "retention_bytes": (1, MAX_SETTING),
    "max_message_bytes": (HEADER_SIZE, MAX_SEGMENT_BYTES),
    "index_interval_bytes": (1, MAX_SEGMENT_BYTES),
}
"""The least and the largest value of each numeric setting (None, where allowed, is no limit):
1 for counts and times (0 would flush, roll or delete all the time); HEADER_SIZE, the smallest
message, for the byte sizes a message must fit in; MAX_SEGMENT_BYTES for those within a
segment. docs/protocol.md (CREATE_TOPIC) gives them to clients."""


COMPRESSIONS: Final = ("producer", "none", "gzip", "lz4", "zstd")
"""A topic's `compression`: keep what producers send, or store every set as that codec (as
Kafka's compression.type)."""
CHOICES: Final[Mapping[str, tuple[str, ...]]] = {"compression": COMPRESSIONS}
"""The settings whose value is one of a few words, and the words."""

SettingValue = int | str | None
"""A topic setting's value: a number, a word of CHOICES, or None for a limit switched off."""


def choice_problem(name: str, value: object) -> str | None:
    """What is wrong with `value` for the setting `name` of CHOICES, or None."""
    if value in CHOICES[name]:
        return None
    return f"{name} must be one of {', '.join(CHOICES[name])}, not {value!r}"


def bound_problem(name: str, value: int) -> str | None:
    """What is wrong with `value` for setting `name` by its BOUNDS, or None."""
    low, high = BOUNDS[name]
    if value < low:
        return f"{name} must be at least {low}, not {value}"
    if value > high:
        return f"{name} must be at most {high}, not {value}"
    return None


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
    compression: str = "producer"
    """`producer`: store producers' sets as they come; `none`, `gzip`, `lz4` or `zstd`: store
    every producer's set so (broker.log.codec.converted)."""

    def __post_init__(self) -> None:
        problems = [
            problem
            for name in BOUNDS
            if (value := getattr(self, name)) is not None
            and (problem := bound_problem(name, value)) is not None
        ]
        problems += [
            problem
            for name in CHOICES
            if (problem := choice_problem(name, getattr(self, name))) is not None
        ]
        if problems:
            raise ValueError("; ".join(problems))

    def check_relations(self) -> None:
        """ValueError unless the settings fit together: segment_bytes at least
        max_message_bytes, so that every message max_message_bytes allows (counted as stored,
        its 4-byte length and header included) fits in a segment. The broker checks it for
        the [log] defaults at start and for a topic's settings on create and alter
        (BrokerConfig.checked_log_config); a LogConfig built directly, in tests, may skip it."""
        if self.segment_bytes < self.max_message_bytes:
            raise ValueError(
                f"segment_bytes ({self.segment_bytes}) must be at least max_message_bytes "
                f"({self.max_message_bytes}): a message that max_message_bytes allows must fit "
                "in a segment"
            )
