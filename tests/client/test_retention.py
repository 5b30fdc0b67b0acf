"""The retention guard's forecast (issue 51, broker/client/retention.py): how long before
retention deletes the message a reader reads next, from the leader's DESCRIBE_PARTITION of
version 2; against a real broker whose retention then deletes it, and by rule on replies made
here."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest

from broker.client import Admin, Producer
from broker.client.coordinator import GroupCalls
from broker.client.retention import RetentionForecast, forecast
from broker.groups.assignors import TopicPartition
from broker.protocol import (
    DESCRIBE_PARTITION_RETENTION_VERSION,
    DescribePartitionReply,
    DescribePartitionRequest,
    ErrorCode,
    SegmentState,
)
from broker.zookeeper import PrivateZooKeeper
from tests.conftest import single_box_flags, wait_until
from tests.curve import SUPER_USER, running_curve_broker
from tests.dashboard import RETENTION_ONLY, alerted_metrics, queried_metrics
from tests.pylogd import RunningBroker

RETENTION_MS = 6000


def test_a_reader_behind_a_short_retention_is_told_within_a_fifth_when_its_data_goes(
    make_pylogd: Callable[..., RunningBroker], tmp_path: Path, topic: str
) -> None:
    broker = make_pylogd(
        *single_box_flags(tmp_path), "--log-retention-check-interval-ms", "200", name="guard"
    )
    config = {"segment_bytes": "1024", "max_message_bytes": "512"}
    with Admin(broker.endpoint) as admin:
        admin.create_topic(topic, 1, {**config, "retention_ms": str(RETENTION_MS)})
        with Producer(broker.endpoint, topic, batch_messages=5) as producer:
            for n in range(30):  # about 3.6 KiB: three closed segments and the active one
                producer.send(b"%03d" % n + b"." * 100)
        request = DescribePartitionRequest(topic, 0)
        state = admin.cluster.call_leader(request, 3, version=DESCRIBE_PARTITION_RETENTION_VERSION)
        asked_at = time.time()
        ahead = forecast(state, 0, asked_at * 1000)  # a reader still at the first message
        assert ahead is not None and ahead.rule == "retention_ms"
        assert ahead.seconds is not None and 0 < ahead.seconds <= RETENTION_MS / 1000
        assert len(state.segment_list) >= 4 and state.retention_check_interval_ms == 200

        deadline = asked_at + RETENTION_MS / 1000 + 30
        while admin.describe_partition(topic, 0).log_start_offset == 0:
            assert time.time() < deadline, "retention never deleted the first segment"
            time.sleep(0.05)
        gone_after = time.time() - asked_at
        assert abs(gone_after - ahead.seconds) <= 0.2 * gone_after, (gone_after, ahead)

        state = admin.cluster.call_leader(request, 3, version=DESCRIBE_PARTITION_RETENTION_VERSION)
        assert forecast(state, 0, time.time() * 1000) == RetentionForecast(0.0, 0, "deleted")


def reply(
    segments: list[tuple[int, int, int]],
    rate: int = 0,
    start: int = 0,
    **settings: str,
) -> DescribePartitionReply:
    """A version 2 DESCRIBE_PARTITION reply of `segments` (base, bytes, last write ms)."""
    end = segments[-1][0] + segments[-1][1]
    config = {"retention_ms": "none", "retention_bytes": "none", "segment_ms": "none"}
    config |= {"segment_bytes": "1000", **settings}
    states = tuple(SegmentState(*s) for s in segments)
    return DescribePartitionReply(
        start, end, end, end - start, len(states), -1, config, 1000, rate, states
    )


NOW = 1_800_000_000_000


@pytest.mark.parametrize(
    ("state", "position", "expected"),
    [
        # a closed segment: retention_ms after its last write
        (
            reply([(0, 1000, NOW - 4000), (1000, 10, NOW)], 100, retention_ms="10000"),
            500,
            RetentionForecast(6.0, 600, "retention_ms"),
        ),
        # the active one: once it fills at the rate (990 bytes at 99 a second), then retention_ms
        (
            reply([(0, 1000, NOW - 4000), (1000, 10, NOW)], 99, retention_ms="10000"),
            1005,
            RetentionForecast(20.0, 1980, "retention_ms"),
        ),
        # by size: the segments after it must hold retention_bytes (3000 - 1010 more bytes)
        (
            reply(
                [(0, 1000, NOW), (1000, 1000, NOW), (2000, 10, NOW)], 199, retention_bytes="3000"
            ),
            0,
            RetentionForecast(10.0, 1990, "retention_bytes"),
        ),
        # the sooner of the two rules: 490 more bytes at 100 a second before 59 s pass
        (
            reply(
                [(0, 1000, NOW - 1000), (1000, 10, NOW)],
                100,
                retention_ms="60000",
                retention_bytes="500",
            ),
            0,
            RetentionForecast(4.9, 490, "retention_bytes"),
        ),
        # behind the log start: gone already
        (reply([(1000, 10, NOW)], 100, start=1000), 0, RetentionForecast(0.0, 0, "deleted")),
        # no retention setting: never, as things stand
        (reply([(0, 1000, NOW)], 100), 0, RetentionForecast(None, None, "none")),
        # by size, but nothing appended lately: not when, only how much more
        (
            reply([(0, 1000, NOW), (1000, 10, NOW)], 0, retention_bytes="2000"),
            0,
            RetentionForecast(None, 1990, "none"),
        ),
    ],
)
def test_the_forecast_follows_retentions_rules(
    state: DescribePartitionReply, position: int, expected: RetentionForecast
) -> None:
    assert forecast(state, position, NOW) == expected


def test_a_version_1_reply_has_no_forecast() -> None:
    state = reply([(0, 10, NOW)], retention_ms="1000")
    old = DescribePartitionReply(0, 10, 10, 10, 1, -1, state.config)
    assert forecast(old, 0, NOW) is None


def test_the_broker_warns_of_a_group_behind_a_short_retention_and_its_gauge_forecasts_it(
    make_pylogd: Callable[..., RunningBroker], tmp_path: Path, topic: str
) -> None:
    """The broker that coordinates a group whose reader stopped at the first message
    (committed offset 0, no member) forecasts when retention deletes it, in its gauge within a
    fifth of when it goes, and warns of it in its log (broker.groups.guard)."""
    broker = make_pylogd(
        *single_box_flags(tmp_path),
        "--log-retention-check-interval-ms",
        "200",
        "--broker-retention-guard-interval-ms",
        "200",
        "--broker-retention-warning-ms",
        "60000",
        "--metrics-enabled",
        "true",
        "--metrics-port",
        "0",
        name="guarded",
    )
    config = {"segment_bytes": "1024", "max_message_bytes": "512"}
    labels = (("group", "stopped"), ("partition", "0"), ("topic", topic))
    with Admin(broker.endpoint) as admin:
        admin.create_topic(topic, 1, {**config, "retention_ms": str(RETENTION_MS)})
        with Producer(broker.endpoint, topic, batch_messages=5) as producer:
            for n in range(30):  # about 3.6 KiB: three closed segments and the active one
                producer.send(b"%03d" % n + b"." * 100)
        with GroupCalls(broker.endpoint, "stopped") as calls:
            assert calls.commit({TopicPartition(topic, 0): 0}) == {
                TopicPartition(topic, 0): ErrorCode.NONE
            }
        gauge = ("pylog_group_retention_seconds", labels)
        wait_until(lambda: gauge in broker.metrics(), 30, "the guard's first forecast")
        asked_at = time.time()
        forecast_s = broker.metrics()[gauge]
        assert 0 < forecast_s <= RETENTION_MS / 1000
        deadline = asked_at + RETENTION_MS / 1000 + 30
        while admin.describe_partition(topic, 0).log_start_offset == 0:
            assert time.time() < deadline, "retention never deleted the first segment"
            time.sleep(0.05)
        gone_after = time.time() - asked_at
        assert abs(gone_after - forecast_s) <= 0.2 * gone_after, (gone_after, forecast_s)
    wait_until(lambda: broker.metrics().get(gauge) == 0, 30, "the gauge to say it is gone")
    served = {name for name, _ in broker.metrics()}
    assert served >= RETENTION_ONLY and alerted_metrics() <= served  # the dashboard's, the alert's
    assert queried_metrics() >= RETENTION_ONLY
    deleted = f"group stopped: {topic}-0 at offset 0: retention has deleted messages"
    wait_until(lambda: deleted in broker.log_path.read_text(), 30, "the warning it is gone")
    logged = broker.log_path.read_text()
    assert f"group stopped: {topic}-0 at offset 0: retention deletes the next message" in logged
    assert "raise the topic's retention_ms / retention_bytes (pylogctl topic alter)" in logged


def test_a_curve_brokers_guard_reaches_the_leaders_with_the_clusters_keys(
    zookeeper: PrivateZooKeeper, tmp_path: Path, topic: str
) -> None:
    """In security.mode curve the guard is a Curve client of the brokers, with the cluster's
    key pair (let in as the cluster principal, which may describe every topic): its forecast
    comes as in plaintext."""
    interval = ("--broker-retention-guard-interval-ms", "200")
    with running_curve_broker(zookeeper, tmp_path, flags=interval) as secured:
        keys = secured.keys(SUPER_USER)
        endpoint = secured.broker.endpoint
        config = {"segment_bytes": "1024", "max_message_bytes": "512", "retention_ms": "86400000"}
        with Admin(endpoint, keys=keys) as admin:
            admin.create_topic(topic, 1, config)
        with Producer(endpoint, topic, batch_messages=5, keys=keys) as producer:
            for n in range(30):  # closed segments: the first one's goes a day after its write
                producer.send(b"%03d" % n + b"." * 100)
        with GroupCalls(endpoint, "secured-readers", keys=keys) as calls:
            calls.commit({TopicPartition(topic, 0): 0})
        labels = (("group", "secured-readers"), ("partition", "0"), ("topic", topic))
        gauge = ("pylog_group_retention_seconds", labels)
        wait_until(lambda: gauge in secured.broker.metrics(), 30, "the guard's forecast")
        assert 0 < secured.broker.metrics()[gauge] <= 86400
