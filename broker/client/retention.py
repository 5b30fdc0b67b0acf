"""The retention guard's forecast (issue 51): how long, and how many more bytes appended, before
retention deletes the message a reader reads next, from what the partition's leader says in a
DESCRIBE_PARTITION of version 2 (docs/protocol.md): its segment files (where each starts, its
bytes, its last write), its settings, the bytes appended a second lately, and how often the
broker applies retention.

Retention (broker.log.local_log.LocalLog.apply_retention, docs/storage.md) deletes the
oldest closed segment while it was last written more than `retention_ms` ago, or while the
segments after it hold at least `retention_bytes`; never the active one. So the segment that
holds a reader's next offset goes:

- by time, `retention_ms` after its last write: for a closed segment its file's time; for the
  active one, once it is rolled (when it reaches `segment_bytes` at the append rate, or is
  `segment_ms` old, counted from the previous segment's last write, when it rolled);
- by size, once `retention_bytes` more than the segments after it hold now have been appended
  (for the active one, after it fills), at the append rate;

whichever comes first, at the broker's next retention pass after it (at most
`retention_check_interval_ms` later: the forecast is the earliest moment). A reader behind the
log start has lost data already (0 s).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from broker.client.connection import Connection
from broker.errors import BrokerError, Unavailable
from broker.protocol import (
    DESCRIBE_PARTITION_RETENTION_VERSION,
    DescribePartitionReply,
    DescribePartitionRequest,
)

NONE: Final = "none"


@dataclass(frozen=True, slots=True)
class RetentionForecast:
    """When retention deletes the message at a reader's position: in `seconds` (None: no
    setting will, as things stand: no retention, or no appends to grow past it), after `bytes`
    more are appended (None when not known: no appends measured), by `rule` (`retention_ms`,
    `retention_bytes`, `deleted` when it is gone already, or `none`)."""

    seconds: float | None
    bytes: int | None
    rule: str


def _setting(config: Mapping[str, str], key: str) -> int | None:
    value = config.get(key, NONE)
    return None if value == NONE else int(value)


def forecast(
    state: DescribePartitionReply, position: int, now_ms: float
) -> RetentionForecast | None:
    """The forecast for a reader whose next offset is `position`, at `now_ms` (ms since the
    epoch); None for a reply without segments (a version 1 reply, or a broker of an older
    pylog)."""
    segments = state.segment_list
    if not segments:
        return None
    if position < state.log_start_offset:
        return RetentionForecast(0.0, 0, "deleted")
    config = state.config
    retention_ms = _setting(config, "retention_ms")
    retention_bytes = _setting(config, "retention_bytes")
    segment_bytes = _setting(config, "segment_bytes")
    segment_ms = _setting(config, "segment_ms")
    rate = state.append_bytes_per_s
    k = max(i for i, s in enumerate(segments) if s.base_offset <= position or i == 0)
    held = segments[k]
    active = k == len(segments) - 1
    to_fill = 0 if not active or segment_bytes is None else max(0, segment_bytes - held.size_bytes)
    candidates: list[tuple[float, str]] = []
    if retention_ms is not None:
        if not active:
            candidates.append((held.last_modified_ms + retention_ms, "retention_ms"))
        else:
            rolls = []
            if rate > 0 and segment_bytes is not None:
                rolls.append(now_ms + to_fill / rate * 1000)
            if segment_ms is not None and k > 0:
                rolls.append(max(now_ms, segments[k - 1].last_modified_ms + segment_ms))
            if rolls:
                candidates.append((min(rolls) + retention_ms, "retention_ms"))
    needed = None
    if retention_bytes is not None:
        after = sum(s.size_bytes for s in segments[k + 1 :])
        needed = to_fill + max(0, retention_bytes - after)
        if needed == 0:
            candidates.append((now_ms, "retention_bytes"))
        elif rate > 0:
            candidates.append((now_ms + needed / rate * 1000, "retention_bytes"))
    if not candidates:
        return RetentionForecast(None, needed, NONE)
    due_ms, rule = min(candidates)
    seconds = max(0.0, (due_ms - now_ms) / 1000)
    if rule == "retention_bytes":
        return RetentionForecast(seconds, needed, rule)
    return RetentionForecast(seconds, round(seconds * rate) if rate > 0 else None, rule)


def ahead_of(
    leader: Connection, topic: str, partition: int, position: int, now_ms: float, retries: int
) -> RetentionForecast | None:
    """The forecast for a reader of `partition` of `topic` at `position`, asked of its leader
    (a DESCRIBE_PARTITION of version 2); None when the broker cannot say (an older pylog, or
    no reply)."""
    request = DescribePartitionRequest(topic, partition)
    try:
        state = leader.call(request, retries, version=DESCRIBE_PARTITION_RETENTION_VERSION)
    except (BrokerError, Unavailable):
        return None
    return forecast(state, position, now_ms)
