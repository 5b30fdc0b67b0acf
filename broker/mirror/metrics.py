"""The mirror's Prometheus figures, read from its copies when scraped (docs/mirror.md,
"Watching it")."""

from __future__ import annotations

import time
from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from broker.mirror.mirror import Mirror


class MirrorCollector(Collector):
    def __init__(self, mirror: Mirror) -> None:
        self.mirror = mirror

    def collect(self) -> Iterator[Metric]:
        labels = ["topic", "partition"]
        copied_bytes = CounterMetricFamily(
            "pylog_mirror_copied_bytes", "Bytes copied to the target.", labels=labels
        )
        copied = CounterMetricFamily(
            "pylog_mirror_copied_messages", "Messages copied to the target.", labels=labels
        )
        lag_bytes = GaugeMetricFamily(
            "pylog_mirror_lag_bytes",
            "The source's high watermark minus the next offset to copy.",
            labels=labels,
        )
        lag_seconds = GaugeMetricFamily(
            "pylog_mirror_lag_seconds",
            "The age of the oldest message not copied yet (0: caught up).",
            labels=labels,
        )
        retention = GaugeMetricFamily(
            "pylog_mirror_retention_seconds",
            "Seconds before retention at the source deletes the next message to copy (0: "
            "deleted already); absent where nothing will as things stand, or not known yet.",
            labels=labels,
        )
        stopped = GaugeMetricFamily(
            "pylog_mirror_stopped",
            "1 for a partition whose copy stopped (its log says why), else 0.",
            labels=labels,
        )
        now_ms = time.time() * 1000
        for progress in self.mirror.progress():
            key = [progress.topic, str(progress.partition)]
            copied_bytes.add_metric(key, progress.copied_bytes)
            copied.add_metric(key, progress.copied_messages)
            if progress.lag_bytes is not None:
                lag_bytes.add_metric(key, progress.lag_bytes)
            lag_seconds.add_metric(key, progress.lag_seconds(now_ms))
            stopped.add_metric(key, int(progress.stopped is not None))
            ahead = progress.retention
            if ahead is not None and ahead.seconds is not None:
                retention.add_metric(key, ahead.seconds)
        yield from (copied_bytes, copied, lag_bytes, lag_seconds, retention, stopped)
        refused = GaugeMetricFamily(
            "pylog_mirror_topics_refused",
            "Topics named that the target cannot mirror (the log says why).",
        )
        refused.add_metric([], len(self.mirror.refused))
        yield refused
