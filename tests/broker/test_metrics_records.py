"""The metrics endpoint's families as broker.metrics builds them from a BrokerStatistics record:
every figure of every part, read from records alone (no broker, no supervisor)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from broker.client.retention import RetentionForecast
from broker.front import FrontStatistics, SecurityStatistics
from broker.groups.guard import Guarded
from broker.groups.service import GroupStatistics
from broker.metrics import BrokerCollector, BrokerStatistics
from broker.pool import PoolStatistics, WorkerStatistics
from broker.quotas import ClientStatistics, Kind, QuotaStatistics
from broker.topics import TopicsStatistics
from broker.worker_stats import WorkerStats

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scraped(statistics: BrokerStatistics) -> Samples:
    registry = CollectorRegistry(auto_describe=True)
    registry.register(BrokerCollector(lambda: statistics))
    text = generate_latest(registry).decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def record(security: SecurityStatistics | None) -> BrokerStatistics:
    stats = WorkerStats()
    stats.served("PRODUCE", 0.0003)
    stats.failed("FETCH", "OFFSET_OUT_OF_RANGE")
    snapshot = stats.snapshot([["clicks", 1, 10, 1000, 500, 1100, 2, 0, 1100]])
    client = ClientStatistics(Kind.CLIENT, "spark", 4096, 0, 1.5, 0.0, 1024, None)
    groups = GroupStatistics(2, 7, 40, 913)
    front = FrontStatistics(11, 2, 8192, 1, 3, 4, QuotaStatistics((client,), 5), security, groups)
    workers = (WorkerStatistics(0, True, snapshot), WorkerStatistics(1, False, None))
    pool = PoolStatistics(300, 6, workers, (("PRODUCE", "UNKNOWN_TOPIC_OR_PARTITION", 7),))
    retention = {
        ("loaders", "clicks", 1): Guarded(500, RetentionForecast(42.5, 4250, "retention_ms")),
        ("idle", "clicks", 1): Guarded(0, RetentionForecast(None, None, "none")),
    }
    return BrokerStatistics(3, front, pool, TopicsStatistics(9, 1, 2, 1), True, retention)


def test_every_part_of_the_record_is_a_family() -> None:
    samples = scraped(record(None))
    expected = {
        ("pylog_front_requests_total", ()): 11,
        ("pylog_front_read_pauses_total", ()): 2,
        ("pylog_front_queued_request_bytes", ()): 300,
        ("pylog_front_queued_reply_bytes", ()): 8192,
        ("pylog_front_muted_connections", ()): 1,
        ("pylog_front_parked_requests", ()): 3,
        ("pylog_front_replies_refused_total", ()): 4,
        ("pylog_quota_held_requests", ()): 5,
        ("pylog_worker_up", (("worker", "0"),)): 1,
        ("pylog_worker_up", (("worker", "1"),)): 0,
        ("pylog_worker_restarts_total", ()): 6,
        ("pylog_partitions", ()): 9,
        ("pylog_isr_changes_total", (("kind", "shrink"),)): 1,
        ("pylog_isr_changes_total", (("kind", "expand"),)): 2,
        ("pylog_partitions_under_replicated", ()): 1,
        ("pylog_zookeeper_connected", ()): 1,
        ("pylog_groups_coordinated", ()): 2,
        ("pylog_group_members", ()): 7,
        ("pylog_group_registry_writes_total", ()): 40,
        ("pylog_group_registry_operations_total", ()): 913,
        (
            "pylog_group_retention_seconds",
            (("group", "loaders"), ("partition", "1"), ("topic", "clicks")),
        ): 42.5,
        (
            "pylog_group_retention_bytes",
            (("group", "loaders"), ("partition", "1"), ("topic", "clicks")),
        ): 4250,
        ("pylog_requests_total", (("api", "PRODUCE"), ("worker", "0"))): 1,
        (
            "pylog_request_errors_total",
            (("api", "FETCH"), ("error", "OFFSET_OUT_OF_RANGE"), ("worker", "0")),
        ): 1,
        (
            "pylog_request_errors_total",
            (("api", "PRODUCE"), ("error", "UNKNOWN_TOPIC_OR_PARTITION"), ("worker", "supervisor")),
        ): 7,
        (
            "pylog_request_seconds_bucket",
            (("api", "PRODUCE"), ("le", "0.0005"), ("worker", "0")),
        ): 1,
        ("pylog_partition_high_watermark", (("partition", "1"), ("topic", "clicks"))): 1100,
        ("pylog_partition_bytes_out_total", (("partition", "1"), ("topic", "clicks"))): 500,
    }
    assert {key: samples.get(key) for key in expected} == expected
    produce = (("direction", "produce"), ("kind", "client"), ("name", "spark"))
    assert samples[("pylog_quota_bytes_total", produce)] == 4096
    assert samples[("pylog_quota_throttle_seconds_total", produce)] == 1.5
    assert samples[("pylog_quota_bytes_per_second", produce)] == 1024
    fetch = (("direction", "fetch"), ("kind", "client"), ("name", "spark"))
    assert ("pylog_quota_bytes_total", fetch) not in samples  # no fetch quota: not shown
    assert not [key for key in samples if key[0].startswith("pylog_connections")]
    (info,) = [labels for name, labels in samples if name == "pylog_info"]
    assert dict(info)["broker_id"] == "3"


def test_security_figures_are_shown_in_curve_mode_only() -> None:
    security = SecurityStatistics(8, 2, (("not_curve", 3), ("other", 0)), 4)
    samples = scraped(record(security))
    assert samples[("pylog_connections_accepted_total", ())] == 8
    assert samples[("pylog_connections_refused_total", ())] == 2
    assert samples[("pylog_handshakes_failed_total", (("reason", "not_curve"),))] == 3
    assert samples[("pylog_handshakes_failed_total", (("reason", "other"),))] == 0
    assert samples[("pylog_authorization_failures_total", ())] == 4
