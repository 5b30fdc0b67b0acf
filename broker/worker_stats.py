"""What a worker counts for the metrics endpoint (broker.metrics), kept as plain numbers on its
loop (an increment and a clock read a request) and sent to the supervisor as a snapshot every
STATS_EVERY_S while `[metrics] enabled`.

The snapshot is JSON (a STATE message, broker.transport):

    {"stats": {"requests": {api: count}, "errors": {api: {error: count}},
               "seconds": {api: [bucket counts..., +Inf count, sum]},
               "flush_seconds": [bucket counts..., +Inf count, sum],
               "partitions": [[topic, partition, messages_in, bytes_in, bytes_out,
                               log_bytes, segments, log_start_offset, high_watermark], ...]}}

Bucket counts are per bucket (not cumulative), for the upper bounds in LATENCY_BUCKETS_S.
"""

from __future__ import annotations

from bisect import bisect_left
from typing import Any

STATS_EVERY_S = 1.0
LATENCY_BUCKETS_S = (
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
)


class Histogram:
    """Observations counted per bucket of LATENCY_BUCKETS_S (the last: above them), and their
    sum."""

    __slots__ = ("counts", "sum")

    def __init__(self) -> None:
        self.counts = [0] * (len(LATENCY_BUCKETS_S) + 1)
        self.sum = 0.0

    def observe(self, seconds: float) -> None:
        self.counts[bisect_left(LATENCY_BUCKETS_S, seconds)] += 1
        self.sum += seconds

    def snapshot(self) -> list[float]:
        return [*self.counts, self.sum]


class WorkerStats:
    """Requests served (by api), errors answered (by api and error), the time each took the
    worker (up to its reply, or to parking it: a long poll's wait and an ack=flushed
    producer's flush are not in it), and flush durations."""

    def __init__(self) -> None:
        self.requests: dict[str, int] = {}
        self.errors: dict[str, dict[str, int]] = {}
        self.seconds: dict[str, Histogram] = {}
        self.flush_seconds = Histogram()

    def served(self, api: str, seconds: float) -> None:
        self.requests[api] = self.requests.get(api, 0) + 1
        histogram = self.seconds.get(api)
        if histogram is None:
            histogram = self.seconds[api] = Histogram()
        histogram.observe(seconds)

    def failed(self, api: str, error: str) -> None:
        by_error = self.errors.setdefault(api, {})
        by_error[error] = by_error.get(error, 0) + 1

    def snapshot(self, partitions: list[list[Any]]) -> dict[str, Any]:
        return {
            "requests": dict(self.requests),
            "errors": {api: dict(counts) for api, counts in self.errors.items()},
            "seconds": {api: h.snapshot() for api, h in self.seconds.items()},
            "flush_seconds": self.flush_seconds.snapshot(),
            "partitions": partitions,
        }
