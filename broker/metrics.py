"""pylogd's Prometheus endpoint: `[metrics] enabled = true` serves http://HOST:PORT/metrics
(127.0.0.1:9097 by default; port 0 picks a free one, named in the log).

What it shows is what the supervisor knows, read on the HTTP server's thread when scraped: a
BrokerStatistics record that Supervisor.statistics builds from each part's own frozen record
(Front, WorkerPool, Topics; trio's habit), of plain counters the loop keeps (no lock, no cost
on the loop beyond an increment) and gauges read at scrape time. This module reads no part's
insides and imports no supervisor. The names follow Prometheus' conventions (`_total`
counters, `_bytes`):

- pylog_info{broker_id, version} 1
- pylog_front_requests_total: requests the front read from clients;
- pylog_front_read_pauses_total: times the front stopped reading requests because the workers
  owed broker.queued_request_bytes (docs/protocol.md, "Flow control");
- pylog_front_queued_request_bytes: bytes of requests the workers owe now;
- pylog_front_queued_reply_bytes: bytes of replies held for clients that have not taken them
  (those of broker.replies.TRACK_AT bytes or more), pylog_front_muted_connections: the
  connections whose requests wait until they read their replies, pylog_front_parked_requests:
  those requests, and
  pylog_front_replies_refused_total: replies answered REPLIES_NOT_READ in their place
  (broker.replies; docs/protocol.md, "Flow control");
- quotas (broker.quotas), per client with a quota {kind, name, direction}: kind principal or
  client, direction produce or fetch: pylog_quota_bytes_total (bytes counted to the quota),
  pylog_quota_throttle_seconds_total (how long its requests were held back, in all),
  pylog_quota_bytes_per_second (the quota); and pylog_quota_held_requests, the requests held
  back now. A client idle for broker.quotas.FORGET_AFTER_S drops out (its counters too);
- in security.mode curve: pylog_connections_accepted_total and pylog_connections_refused_total
  (Curve handshakes the ZAP handler let in, and refused for an unknown key),
  pylog_handshakes_failed_total{reason} (before ZAP: not_curve, a plaintext client;
  wrong_broker_key; other, a connection broken mid-handshake, which a plaintext client that
  hangs up first may also be), and pylog_authorization_failures_total (requests answered
  AUTHORIZATION_FAILED);
- the group coordinator (broker.groups.service, docs/protocol.md "Consumer groups"):
  pylog_groups_coordinated and pylog_group_members, the groups this broker coordinates and
  their members; pylog_group_registry_writes_total, the coordinator's ZooKeeper transactions
  that landed, and pylog_group_registry_operations_total, the node operations in them (what a
  rebalance costs ZooKeeper);
- the retention guard (broker.groups.guard), per partition of each group this broker
  coordinates {group, topic, partition}: pylog_group_retention_seconds, how long before
  retention deletes the next message the group reads (0: deleted already; absent where nothing
  will as things stand), and pylog_group_retention_bytes, what may still be appended first;
- pylog_worker_up{worker}: 1 while the worker is connected, 0 while it restarts;
- pylog_worker_restarts_total;
- pylog_partitions: the partitions this broker holds;
- pylog_isr_changes_total{kind}: changes of a partition's in-sync set this broker made as its
  leader (shrink, expand; docs/replication.md), and pylog_partitions_under_replicated: the
  replicated partitions it leads whose in-sync set lacks a replica;
- pylog_zookeeper_connected: 1 while the registry's ZooKeeper session is connected;
- process_*: the supervisor process's CPU, memory and open files (prometheus-client's);

and from each worker's last snapshot (broker.worker_stats, sent every STATS_EVERY_S):

- pylog_requests_total{worker, api}, pylog_request_errors_total{worker, api, error} (the
  error code's name; worker "supervisor" counts those the supervisor refused before any worker,
  broker.pool.RequestErrors), pylog_request_seconds{worker, api} (a histogram: the time the worker
  took up to its reply, or to parking a long poll or an ack=flushed producer);
- pylog_flush_seconds{worker}: flushes (write, and fsync if configured), a histogram;
- per partition {topic, partition}: pylog_partition_messages_in_total,
  pylog_partition_bytes_in_total, pylog_partition_bytes_out_total (fetched),
  pylog_partition_log_bytes, pylog_partition_segments, pylog_partition_log_start_offset and
  pylog_partition_high_watermark.

A worker's counters start again from 0 when it restarts (Prometheus' rate() takes the reset);
group lag is pylogctl's (`pylogctl group describe`), not the broker's.
"""

from __future__ import annotations

import errno
import itertools
import logging
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from importlib import metadata
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, ProcessCollector, start_http_server
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from broker.front import FrontStatistics, SecurityStatistics
from broker.groups.guard import Guarded, Reader
from broker.groups.service import GroupStatistics
from broker.pool import PoolStatistics, WorkerStatistics
from broker.processes import port_holder
from broker.quotas import QuotaStatistics
from broker.topics import TopicsStatistics
from broker.worker_stats import LATENCY_BUCKETS_S

if TYPE_CHECKING:
    from wsgiref.simple_server import WSGIServer

log = logging.getLogger("pylog.supervisor")


@dataclass(frozen=True, slots=True)
class BrokerStatistics:
    """What a broker's endpoint shows (Supervisor.statistics): its id, and the figures of its
    front, workers and partitions, and its ZooKeeper session."""

    broker_id: int
    front: FrontStatistics
    pool: PoolStatistics
    topics: TopicsStatistics
    zookeeper_connected: bool
    retention: Mapping[Reader, Guarded]
    """The retention guard's last forecasts (broker.groups.guard)."""


class BrokerCollector(Collector):
    """A broker's figures, read from `statistics` when scraped."""

    def __init__(self, statistics: Callable[[], BrokerStatistics]) -> None:
        self.statistics = statistics
        try:
            self.version = metadata.version("pylog")
        except metadata.PackageNotFoundError:
            self.version = "unknown"

    def collect(self) -> Iterator[Metric]:
        s = self.statistics()
        front, pool, topics = s.front, s.pool, s.topics
        info = GaugeMetricFamily("pylog_info", "This broker.", labels=["broker_id", "version"])
        info.add_metric([str(s.broker_id), self.version], 1)
        yield info
        yield CounterMetricFamily(
            "pylog_front_requests", "Requests the front read from clients.", front.requests
        )
        yield CounterMetricFamily(
            "pylog_front_read_pauses",
            "Times the front stopped reading requests while the workers owed "
            "broker.queued_request_bytes of them.",
            front.read_pauses,
        )
        yield GaugeMetricFamily(
            "pylog_front_queued_request_bytes",
            "Bytes of requests routed to workers and not yet served.",
            pool.queued_bytes,
        )
        yield GaugeMetricFamily(
            "pylog_front_queued_reply_bytes",
            "Bytes of replies held for clients that have not taken them (replies of 4 KiB or "
            "more).",
            front.queued_reply_bytes,
        )
        yield GaugeMetricFamily(
            "pylog_front_muted_connections",
            "Connections whose requests wait until they read the replies held for them.",
            front.muted_connections,
        )
        yield GaugeMetricFamily(
            "pylog_front_parked_requests",
            "Requests of muted connections waiting for them to read their replies.",
            front.parked_requests,
        )
        yield CounterMetricFamily(
            "pylog_front_replies_refused",
            "Replies answered REPLIES_NOT_READ in their place: their connection was muted.",
            front.replies_refused,
        )
        yield from _quota_metrics(front.quotas)
        yield from _group_metrics(front.groups)
        yield from _retention_metrics(s.retention)
        if front.security is not None:  # security.mode curve
            yield from _security_metrics(front.security)
        up = GaugeMetricFamily(
            "pylog_worker_up", "1 while a worker is connected.", labels=["worker"]
        )
        for worker in pool.workers:
            up.add_metric([str(worker.index)], float(worker.connected))
        yield up
        yield CounterMetricFamily(
            "pylog_worker_restarts", "Workers restarted after they exited.", pool.restarts
        )
        yield GaugeMetricFamily(
            "pylog_partitions", "Partitions this broker holds.", topics.partitions
        )
        changes = CounterMetricFamily(
            "pylog_isr_changes",
            "In-sync set changes this broker made as a leader: shrink, expand.",
            labels=["kind"],
        )
        changes.add_metric(["shrink"], topics.isr_shrinks)
        changes.add_metric(["expand"], topics.isr_expands)
        yield changes
        yield GaugeMetricFamily(
            "pylog_partitions_under_replicated",
            "Replicated partitions led here whose in-sync set is smaller than their replicas.",
            topics.under_replicated,
        )
        yield from _worker_metrics(pool.workers, pool.refused)
        yield GaugeMetricFamily(
            "pylog_zookeeper_connected",
            "1 while the registry's ZooKeeper session is connected.",
            float(s.zookeeper_connected),
        )


def _group_metrics(groups: GroupStatistics) -> Iterator[Metric]:
    yield GaugeMetricFamily(
        "pylog_groups_coordinated", "Consumer groups this broker coordinates.", groups.groups
    )
    yield GaugeMetricFamily(
        "pylog_group_members", "Members of the groups this broker coordinates.", groups.members
    )
    yield CounterMetricFamily(
        "pylog_group_registry_writes",
        "The group coordinator's ZooKeeper transactions that landed.",
        groups.registry_writes,
    )
    yield CounterMetricFamily(
        "pylog_group_registry_operations",
        "Node operations (create, set, delete) in the group coordinator's transactions.",
        groups.registry_operations,
    )


def _retention_metrics(forecasts: Mapping[Reader, Guarded]) -> Iterator[Metric]:
    labels = ["group", "topic", "partition"]
    seconds = GaugeMetricFamily(
        "pylog_group_retention_seconds",
        "Seconds before retention deletes the next message a group this broker coordinates "
        "reads (0: deleted already); absent where nothing will as things stand.",
        labels=labels,
    )
    appended = GaugeMetricFamily(
        "pylog_group_retention_bytes",
        "Bytes that may still be appended to the partition before then, where known.",
        labels=labels,
    )
    for (group, topic, partition), guarded in sorted(forecasts.items()):
        names = [group, topic, str(partition)]
        if guarded.forecast.seconds is not None:
            seconds.add_metric(names, guarded.forecast.seconds)
        if guarded.forecast.bytes is not None:
            appended.add_metric(names, guarded.forecast.bytes)
    yield seconds
    yield appended


def _security_metrics(security: SecurityStatistics) -> Iterator[Metric]:
    yield CounterMetricFamily(
        "pylog_connections_accepted",
        "Curve handshakes the ZAP handler let in (a known client key).",
        security.accepted,
    )
    yield CounterMetricFamily(
        "pylog_connections_refused",
        "Curve handshakes the ZAP handler refused (an unknown client key).",
        security.refused,
    )
    failed = CounterMetricFamily(
        "pylog_handshakes_failed",
        "Curve handshakes that failed before the ZAP handler was asked: not_curve (a "
        "plaintext client), wrong_broker_key, other.",
        labels=["reason"],
    )
    for reason, count in security.handshakes_failed:
        failed.add_metric([reason], count)
    yield failed
    yield CounterMetricFamily(
        "pylog_authorization_failures",
        "Requests (and METADATA topics) answered AUTHORIZATION_FAILED.",
        security.authorization_failures,
    )


_PARTITION_FIGURES = (
    ("pylog_partition_messages_in", "Messages appended to the partition.", "counter"),
    ("pylog_partition_bytes_in", "Bytes of messages appended to the partition.", "counter"),
    ("pylog_partition_bytes_out", "Bytes of messages fetched from the partition.", "counter"),
    ("pylog_partition_log_bytes", "Bytes of the partition's segment files.", "gauge"),
    ("pylog_partition_segments", "Segment files of the partition.", "gauge"),
    ("pylog_partition_log_start_offset", "The partition's log start offset.", "gauge"),
    ("pylog_partition_high_watermark", "The partition's high watermark.", "gauge"),
)
"""The figures of a partition, in the order of a snapshot's partition rows after topic and
partition (broker.worker_stats)."""


def _quota_metrics(statistics: QuotaStatistics) -> Iterator[Metric]:
    labels = ["kind", "name", "direction"]
    counted = CounterMetricFamily(
        "pylog_quota_bytes", "Bytes counted to a client's quota.", labels=labels
    )
    throttled = CounterMetricFamily(
        "pylog_quota_throttle_seconds",
        "How long a client's requests were held back for its quota, in all.",
        labels=labels,
    )
    quotas = GaugeMetricFamily(
        "pylog_quota_bytes_per_second", "A client's quota, bytes a second.", labels=labels
    )
    for c in statistics.clients:
        for direction, size, seconds, quota in (
            ("produce", c.produce_bytes, c.produce_throttled_s, c.produce_quota),
            ("fetch", c.fetch_bytes, c.fetch_throttled_s, c.fetch_quota),
        ):
            if quota is not None:
                values = [c.kind.value, c.name, direction]
                counted.add_metric(values, size)
                throttled.add_metric(values, seconds)
                quotas.add_metric(values, quota)
    yield from (counted, throttled, quotas)
    yield GaugeMetricFamily(
        "pylog_quota_held_requests",
        "Requests held back now because their client is over its quota.",
        statistics.held_requests,
    )


def _worker_metrics(
    workers: tuple[WorkerStatistics, ...], refused: tuple[tuple[str, str, int], ...]
) -> Iterator[Metric]:
    """The figures of the workers' last snapshots (broker.worker_stats): requests, errors and
    their time by api, flush time, and each partition's traffic and log; and the errors the
    supervisor answered itself (`refused`, worker "supervisor")."""
    requests = CounterMetricFamily(
        "pylog_requests", "Requests a worker served.", labels=["worker", "api"]
    )
    errors = CounterMetricFamily(
        "pylog_request_errors",
        "Requests a worker answered with an error (or, ack none, could not store); worker "
        '"supervisor": those the supervisor refused before any worker (or, ack none, dropped).',
        labels=["worker", "api", "error"],
    )
    seconds = HistogramMetricFamily(
        "pylog_request_seconds",
        "Time a worker took to serve a request, up to its reply or to parking it (a long "
        "poll's wait and an ack=flushed producer's flush are not in it).",
        labels=["worker", "api"],
    )
    flush = HistogramMetricFamily(
        "pylog_flush_seconds", "Time a flush (write and fsync) took.", labels=["worker"]
    )
    partitions = [
        (CounterMetricFamily if kind == "counter" else GaugeMetricFamily)(
            name, text, labels=["topic", "partition"]
        )
        for name, text, kind in _PARTITION_FIGURES
    ]
    for worker in workers:
        stats = worker.snapshot
        if stats is None:
            continue
        index = str(worker.index)
        for api, count in stats["requests"].items():
            requests.add_metric([index, api], count)
        for api, by_error in stats["errors"].items():
            for error, count in by_error.items():
                errors.add_metric([index, api, error], count)
        for api, histogram in stats["seconds"].items():
            seconds.add_metric([index, api], *_buckets(histogram))
        flush.add_metric([index], *_buckets(stats["flush_seconds"]))
        for topic, number, *figures in stats["partitions"]:
            for family, value in zip(partitions, figures, strict=True):
                family.add_metric([topic, str(number)], value)
    for api, error, count in refused:
        errors.add_metric(["supervisor", api, error], count)
    yield from (requests, errors, seconds, flush, *partitions)


def _buckets(histogram: list[float]) -> tuple[list[tuple[str, float]], float]:
    """A snapshot's histogram (counts per bucket, then the sum) as Prometheus' cumulative
    buckets and the sum."""
    *counts, total = histogram
    bounds = [*(str(b) for b in LATENCY_BUCKETS_S), "+Inf"]
    return list(zip(bounds, itertools.accumulate(counts), strict=True)), total


def serve_metrics(
    statistics: Callable[[], BrokerStatistics], host: str, port: int
) -> tuple[WSGIServer, int]:
    """Start the broker's endpoint on its own thread (serve_collector)."""
    return serve_collector(BrokerCollector(statistics), host, port)


def serve_collector(
    collector: Collector, host: str, port: int, logger: logging.Logger = log
) -> tuple[WSGIServer, int]:
    """Start an endpoint of `collector`'s figures and the process's own on its own thread (its
    address logged by `logger`): the server and the port it listens on. OSError naming the
    process that holds the port if it is in use."""
    registry = CollectorRegistry(auto_describe=True)
    registry.register(collector)
    registry.register(ProcessCollector(registry=None))
    try:
        server, _ = start_http_server(port, host, registry)
    except OSError as error:
        reason = str(error)
        if error.errno == errno.EADDRINUSE:
            reason = f"port {port} is already in use by {port_holder(port)}"
        raise OSError(f"cannot serve metrics on {host}:{port}: {reason}") from error
    bound = int(server.server_address[1])
    logger.info("metrics on http://%s:%d/metrics", host, bound)
    return server, bound
