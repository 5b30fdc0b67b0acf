"""`pylogctl broker config` against three real brokers: live settings for every broker or one,
applied within a second to the partitions each holds (a topic's own setting still wins), kept
through a restart, one broker down during the change; settings read at start only refused."""

from __future__ import annotations

import json
from functools import partial

from broker.client.connection import Connection
from broker.protocol import DescribePartitionRequest
from tests.cli.conftest import ok, pylogctl
from tests.conftest import wait_until
from tests.pylogd import RunningBroker


def in_effect(broker: RunningBroker, topic: str, setting: str) -> str | None:
    """The value of `setting` in effect for `broker`'s copy of partition 0 of `topic`."""
    with Connection(broker.endpoint, timeout_s=5.0) as connection:
        return connection.call(DescribePartitionRequest(topic, 0)).config.get(setting)


def all_in_effect(brokers: list[RunningBroker], topic: str, setting: str, value: str) -> bool:
    return all(in_effect(broker, topic, setting) == value for broker in brokers)


def test_live_settings_apply_to_every_broker_or_one_and_survive_a_restart(
    three_brokers: list[RunningBroker],
) -> None:
    endpoint = three_brokers[0].endpoint
    ok(endpoint, "topic", "create", "live", "--config", "replication_factor=3")
    ok(endpoint, "topic", "create", "own", "--config", "replication_factor=3",
       "--config", "retention_ms=1000")  # fmt: skip
    said = ok(endpoint, "broker", "config", "set", "log.retention_ms=86400000",
              "log.flush_interval_ms=200")  # fmt: skip
    assert said == (
        "live settings of every broker: log.flush_interval_ms=200, log.retention_ms=86400000\n"
    )
    wait_until(partial(all_in_effect, three_brokers, "live", "retention_ms", "86400000"), 5)
    assert all_in_effect(three_brokers, "live", "flush_interval_ms", "200")
    assert all_in_effect(three_brokers, "own", "retention_ms", "1000")  # its own wins
    for broker in three_brokers:
        assert "live settings now: log_flush_interval_ms=200" in broker.log_path.read_text()

    ok(endpoint, "broker", "config", "set", "log.retention_ms=3600000", "--broker-id", "2")
    wait_until(lambda: in_effect(three_brokers[1], "live", "retention_ms") == "3600000", 5)
    assert in_effect(three_brokers[0], "live", "retention_ms") == "86400000"

    three_brokers[2].stop()  # down during the change: it takes it when it starts again
    both = f"{three_brokers[0].endpoint},{three_brokers[1].endpoint}"
    ok(both, "broker", "config", "set", "broker.log_level=debug", "--broker-id", "3")
    three_brokers[2] = three_brokers[2].restarted()
    assert in_effect(three_brokers[2], "live", "retention_ms") == "86400000"
    restarted_log = three_brokers[2].log_path.read_text().split("SIGTERM")[-1]
    assert "live settings now: broker_log_level=debug" in restarted_log
    assert " DEBUG " in restarted_log

    described = [
        json.loads(line) for line in ok(endpoint, "broker", "config", "describe", "--json")
        .splitlines()
    ]  # fmt: skip
    assert described == [
        {"broker": None, "settings": {"log.flush_interval_ms": "200",
                                      "log.retention_ms": "86400000"}},
        {"broker": 2, "settings": {"log.retention_ms": "3600000"}},
        {"broker": 3, "settings": {"broker.log_level": "debug"}},
    ]  # fmt: skip
    text = ok(endpoint, "broker", "config", "describe").splitlines()
    assert text[0] == "every broker: log.flush_interval_ms=200"
    assert text[-1].startswith("live settings: broker.log_level, ")

    said = ok(endpoint, "broker", "config", "delete", "log.flush_interval_ms")
    assert said == "live settings of every broker: log.retention_ms=86400000\n"
    wait_until(partial(all_in_effect, three_brokers, "live", "flush_interval_ms", "50"), 5)
    refused = pylogctl(endpoint, "broker", "config", "delete", "log.flush_interval_ms")
    assert refused.exit_code == 1
    assert "log.flush_interval_ms is not set for every broker" in refused.output


def test_values_are_checked_before_they_are_written(three_brokers: list[RunningBroker]) -> None:
    endpoint = three_brokers[0].endpoint
    for pair, reason in [
        ("nonsense", "'nonsense': give NAME=VALUE"),
        ("broker.port=9999", "broker.port is read at start only: change it in pylogd.toml"),
        (
            "log.retention_ms=soon",
            "log.retention_ms must be a whole number in decimal digits 0-9, not 'soon'",
        ),
        ("log.nonsense=1", "unknown setting 'log.nonsense'"),
        ("broker.log_level=loud", "broker.log_level must be one of debug, info"),
        ("log.level=debug", "unknown setting 'log.level' (did you mean broker.log_level?)"),
        ("log.segment_bytes=10", "segment_bytes"),
    ]:
        result = pylogctl(endpoint, "broker", "config", "set", pair)
        assert result.exit_code == 2, (pair, result.output)
        assert reason in result.output, (pair, result.output)
    assert "no live settings set" in ok(endpoint, "broker", "config", "describe")


def test_a_settings_value_of_choices_is_taken_in_any_case(
    three_brokers: list[RunningBroker],
) -> None:
    """Issue 53, 5: `broker.log_level=DEBUG`, as Kafka's and systemd's habits write it, was
    refused ("broker_log_level must be one of debug, ... not 'DEBUG'")."""
    endpoint = three_brokers[0].endpoint
    said = ok(endpoint, "broker", "config", "set", "broker.log_level=DEBUG")
    assert "broker.log_level=DEBUG" in said
    ok(endpoint, "broker", "config", "delete", "broker.log_level")
