"""`pylogctl topic ...`, `produce` and `consume` against a real pylogd."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import xxhash
from click.testing import CliRunner, Result

from broker.client import Cluster
from broker.log.message import encode_message
from broker.protocol import Ack, ProduceRequest
from broker.registry import PartitionState, Registry
from cli.pylogctl import cli
from tests.cli.conftest import Cluster as ThreeBrokers
from tests.conftest import single_box_flags, wait_until
from tests.pylogd import RunningBroker


def run(broker: RunningBroker, *args: str, input: bytes | None = None) -> Result:
    return CliRunner().invoke(cli, list(args), input=input, env={"PYLOG_BROKER": broker.endpoint})


def test_create_list_describe_and_delete_a_topic(broker: RunningBroker, topic: str) -> None:
    created = run(
        broker, "topic", "create", topic, "--partitions", "3", "--config", "retention_ms=86400000"
    )
    assert created.exit_code == 0, created.output
    assert created.output == f"created topic {topic} with 3 partitions\n"
    listed = run(broker, "topic", "list")
    assert listed.exit_code == 0 and topic in listed.output.splitlines()

    produced = run(broker, "produce", topic, "--partition", "2", input=b"hello\n")
    assert produced.exit_code == 0, produced.output
    described = run(broker, "topic", "describe", topic)
    assert described.exit_code == 0, described.output
    lines = described.output.splitlines()
    assert lines[0] == f"topic {topic}: 3 partitions"
    assert "setting retention_ms 86400000 topic" in lines
    assert lines[-3:-1] == [
        f"partition {p} broker 0 epoch - replicas 0 isr 0 log_start 0 high_watermark 0 "
        "size_bytes 0 segments 1 oldest -"
        for p in (0, 1)
    ]
    assert lines[-1].startswith(  # a 26-byte header + "hello"
        "partition 2 broker 0 epoch - replicas 0 isr 0 log_start 0 high_watermark 31 "
        "size_bytes 31 segments 1 oldest 20"
    )

    again = run(broker, "topic", "create", topic)
    assert again.exit_code == 1
    assert again.stderr.startswith("pylogctl: TOPIC_ALREADY_EXISTS: ")
    assert run(broker, "topic", "delete", topic).output == f"deleted topic {topic}\n"
    assert topic not in run(broker, "topic", "list").output.splitlines()


def test_produce_from_stdin_with_a_key_separator_then_consume_as_json(
    broker: RunningBroker, topic: str
) -> None:
    assert run(broker, "topic", "create", topic, "--partitions", "2").exit_code == 0
    lines = b"user-1:first\nuser-2:second\nno key here\nuser-1:third:with colon\r\n"
    produced = run(broker, "produce", topic, "--key-separator", ":", input=lines)
    assert produced.exit_code == 0, produced.output
    assert produced.output == "4 messages acknowledged (flushed)\n"

    records = []
    for partition in (0, 1):
        consumed = run(broker, "consume", topic, "--partition", str(partition), "--format", "json")
        assert consumed.exit_code == 0, consumed.output
        records += [json.loads(line) for line in consumed.output.splitlines()]
    keyed = [(r["key"], r["value"]) for r in records if r["key"] is not None]
    assert sorted(keyed) == [
        ("user-1", "first"),
        ("user-1", "third:with colon"),
        ("user-2", "second"),
    ]
    assert [r["value"] for r in records if r["key"] is None] == ["no key here"]
    for record in records:
        if record["key"] is not None:
            assert record["partition"] == xxhash.xxh32_intdigest(record["key"].encode()) % 2
        assert set(record) == {
            "topic",
            "offset",
            "partition",
            "timestamp",
            "key",
            "value",
            "headers",
        }

    user_1 = xxhash.xxh32_intdigest(b"user-1") % 2
    text = run(broker, "consume", topic, "--partition", str(user_1), "--max-messages", "1")
    assert text.exit_code == 0 and text.output == "user-1\tfirst\n"
    second = next(r for r in records if r["value"] == "third:with colon")["offset"]
    tail = run(broker, "consume", topic, "--partition", str(user_1), "--from", str(second))
    assert tail.output == "user-1\tthird:with colon\n"


def test_unknown_topic_is_reported_by_its_error_name_with_exit_1(
    broker: RunningBroker, topic: str
) -> None:
    for args in (
        ["topic", "describe", topic],
        ["topic", "delete", topic],
        ["consume", topic],
        ["produce", topic],
    ):
        result = run(broker, *args, input=b"x\n")
        assert result.exit_code == 1, (args, result.output)
        assert result.stderr.startswith("pylogctl: UNKNOWN_TOPIC_OR_PARTITION: "), args
    bad_config = run(broker, "topic", "create", topic, "--config", "no_such_setting=1")
    assert bad_config.exit_code == 1
    assert bad_config.stderr.startswith("pylogctl: INVALID_TOPIC: ")


def test_usage_errors_exit_2_without_a_broker() -> None:
    runner = CliRunner()
    assert runner.invoke(cli, ["topic", "create", "t", "--config", "novalue"]).exit_code == 2
    assert runner.invoke(cli, ["topic", "create", "t", "--partitions", "0"]).exit_code == 2
    assert runner.invoke(cli, ["consume", "t", "--from", "yesterday-ish"]).exit_code == 2
    assert runner.invoke(cli, ["produce", "t", "--ack", "sometimes"]).exit_code == 2


def test_an_unreachable_broker_is_reported_quickly_with_exit_1() -> None:
    started = time.monotonic()
    result = CliRunner().invoke(
        cli, ["topic", "list", "--broker", "tcp://127.0.0.1:9", "--timeout", "0.3"]
    )
    assert time.monotonic() - started < 3
    assert result.exit_code == 1
    assert result.stderr.startswith(
        "pylogctl: broker tcp://127.0.0.1:9 unreachable: connection refused: nothing listens at"
    )


def test_produce_with_ack_none_from_a_process_that_exits_at_once_still_delivers(
    broker: RunningBroker, topic: str
) -> None:
    assert run(broker, "topic", "create", topic).exit_code == 0
    pylogctl = str(Path(sys.executable).with_name("pylogctl"))
    produced = subprocess.run(
        [pylogctl, "produce", topic, "--ack", "none", "--broker", broker.endpoint],
        input=b"".join(b"fire %d\n" % i for i in range(100)),
        capture_output=True,
        timeout=30,
    )
    assert produced.returncode == 0, produced.stderr
    assert produced.stdout == b"sent 100 messages (ack none: not acknowledged)\n"
    wait_until(
        lambda: len(run(broker, "consume", topic).output.splitlines()) == 100,
        what="100 fire-and-forget messages",
    )
    assert run(broker, "consume", topic, "--max-messages", "2").output == "fire 0\nfire 1\n"


# -- describe and alter, on a cluster of three brokers ------------------------------------------

DEFAULTS = {  # the cluster's brokers run with --log-flush-interval-ms 50
    "flush_messages": "10000",
    "flush_interval_ms": "50",
    "segment_bytes": "1073741824",
    "segment_ms": "604800000",
    "retention_ms": "604800000",
    "retention_bytes": "none",
    "max_message_bytes": "1048576",
    "compression": "producer",
}
DESCRIBED = DEFAULTS | {  # and the replication settings (not a partition log's)
    "replication_factor": "1",
    "min_insync_replicas": "1",
    "unclean_leader_election": "0",
}


def at(endpoint: str, *args: str) -> Result:
    return CliRunner().invoke(cli, list(args), env={"PYLOG_BROKER": endpoint})


def ok(endpoint: str, *args: str) -> Result:
    result = at(endpoint, *args)
    assert result.exit_code == 0, (args, result.output)
    return result


def produce(endpoint: str, topic: str, partition: int, *values: bytes, time_ms: int = 0) -> None:
    """Each value as a message of its own, acknowledged once flushed."""
    with Cluster(endpoint) as client:
        connection = client.connection_for(topic, partition)
        for value in values:
            message = encode_message(value, timestamp_ms=time_ms or None)
            connection.request(ProduceRequest(topic, partition, Ack.FLUSHED, message))


def described(endpoint: str, topic: str) -> dict[str, Any]:
    result = at(endpoint, "topic", "describe", topic, "--json")
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert len(lines) == 1
    return cast(dict[str, Any], json.loads(lines[0]))


def test_topic_describe_shows_every_setting_and_each_partitions_state_on_its_holder(
    cluster: ThreeBrokers, topic: str
) -> None:
    created = ("topic", "create", topic, "--partitions", "3", "--config", "retention_ms=86400000")
    ok(cluster.endpoint, *created)
    produce(cluster.endpoint, topic, 1, b"hello", b"world", time_ms=1_700_000_000_000)

    result = at(cluster.brokers[2].endpoint, "topic", "describe", topic)
    assert result.exit_code == 0, result.output
    settings = [
        f"setting {key} {'86400000 topic' if key == 'retention_ms' else value + ' default'}"
        for key, value in DESCRIBED.items()
    ]
    assert result.output.splitlines() == [
        f"topic {topic}: 3 partitions",
        *settings,
        "partition 0 broker 1 epoch - replicas 1 isr 1 log_start 0 high_watermark 0 "
        "size_bytes 0 segments 1 oldest -",
        "partition 1 broker 2 epoch - replicas 2 isr 2 log_start 0 high_watermark 62 "
        "size_bytes 62 segments 1 oldest 2023-11-14T22:13:20.000+00:00",  # 2 x (26 + 5 bytes)
        "partition 2 broker 3 epoch - replicas 3 isr 3 log_start 0 high_watermark 0 "
        "size_bytes 0 segments 1 oldest -",
    ]
    as_json = described(cluster.endpoint, topic)
    assert as_json["settings"]["retention_ms"] == {"value": "86400000", "overridden": True}
    assert as_json["settings"]["segment_bytes"] == {"value": "1073741824", "overridden": False}
    assert as_json["partitions"][1] == {
        "partition": 1,
        "broker_id": 2,
        "leader_epoch": None,  # no state node: the one replica leads, no epoch
        "replicas": [2],
        "isr": [2],
        "available": True,
        "log_start_offset": 0,
        "high_watermark": 62,
        "log_end_offset": 62,
        "size_bytes": 62,
        "deleted_bytes_on_disk": 0,
        "segments": 1,
        "oldest_timestamp": 1_700_000_000_000,
        "settings_in_effect": DEFAULTS | {"retention_ms": "86400000"},
        "applying": [],
    }


def test_topic_alter_segment_bytes_is_applied_live_by_the_brokers_holding_the_partitions(
    cluster: ThreeBrokers, topic: str
) -> None:
    ok(cluster.endpoint, "topic", "create", topic, "--partitions", "2")
    ok(cluster.endpoint, "topic", "alter", topic, "--set", "max_message_bytes=100")
    altered = at(
        cluster.brokers[2].endpoint,
        "topic",
        "alter",
        topic,
        "--set",
        "segment_bytes=100",
        "--set",
        "retention_ms=none",
    )
    assert altered.exit_code == 0, altered.output
    assert altered.output == f"altered topic {topic}: set segment_bytes=100 retention_ms=none\n"
    wait_until(
        lambda: all(
            p["settings_in_effect"]["segment_bytes"] == "100"
            for p in described(cluster.endpoint, topic)["partitions"]
        ),
        what="both holders applying segment_bytes 100",
    )
    for partition in (0, 1):  # on brokers 1 and 2: 40-byte messages, two a segment
        produce(cluster.endpoint, topic, partition, *[b"0123456789abcd"] * 5)
    state = described(cluster.endpoint, topic)
    assert state["settings"]["segment_bytes"] == {"value": "100", "overridden": True}
    assert state["settings"]["retention_ms"] == {"value": "none", "overridden": True}
    assert [(p["segments"], p["high_watermark"]) for p in state["partitions"]] == [(3, 200)] * 2

    reset = at(cluster.endpoint, "topic", "alter", topic, "--delete", "segment_bytes", "--json")
    assert reset.exit_code == 0, reset.output
    assert json.loads(reset.output) == {"topic": topic, "set": {}, "deleted": ["segment_bytes"]}
    wait_until(
        lambda: all(
            p["settings_in_effect"]["segment_bytes"] == DEFAULTS["segment_bytes"]
            for p in described(cluster.endpoint, topic)["partitions"]
        ),
        what="segment_bytes back to the default",
    )
    produce(cluster.endpoint, topic, 0, *[b"0123456789abcd"] * 5)
    assert described(cluster.endpoint, topic)["partitions"][0]["segments"] == 3  # no roll


def test_topic_alter_refuses_bad_settings_and_leaves_the_topic_as_it_was(
    cluster: ThreeBrokers, topic: str
) -> None:
    ok(cluster.endpoint, "topic", "create", topic, "--config", "retention_ms=1000")
    for args, problem in (
        (["--set", "no_such_setting=1"], "unknown topic setting 'no_such_setting'"),
        (["--set", "segment_bytes=0"], "segment_bytes must be at least 26"),
        (["--set", "segment_bytes=many"], "segment_bytes must be decimal digits 0-9"),
        (["--set", "flush_messages=none"], "flush_messages must be decimal digits 0-9"),
        (["--set", "compression=snappy"], "compression must be one of producer, none, gzip"),
        (["--delete", "no_such_setting"], "unknown topic setting 'no_such_setting'"),
        (["--set", "retention_ms=5", "--delete", "retention_ms"], "both set and deleted"),
    ):
        result = at(cluster.endpoint, "topic", "alter", topic, *args)
        assert result.exit_code == 1, (args, result.output)
        assert result.stderr.startswith("pylogctl: INVALID_TOPIC: "), args
        assert problem in result.stderr, (args, result.stderr)
        assert len(result.stderr.splitlines()) == 1
    settings = described(cluster.endpoint, topic)["settings"]
    assert {k: v["value"] for k, v in settings.items()} == DESCRIBED | {"retention_ms": "1000"}

    missing = at(cluster.endpoint, "topic", "alter", f"{topic}-none", "--set", "retention_ms=1")
    assert missing.exit_code == 1
    assert missing.stderr.startswith("pylogctl: UNKNOWN_TOPIC_OR_PARTITION: ")
    nothing = at(cluster.endpoint, "topic", "alter", topic)
    assert nothing.exit_code == 2
    assert "nothing to change" in nothing.output


def test_topic_alter_retention_and_flush_apply_to_data_already_there(
    make_pylogd: Callable[..., RunningBroker], tmp_path: Path, topic: str
) -> None:
    broker = make_pylogd(
        *single_box_flags(tmp_path),
        "--log-retention-check-interval-ms",
        "100",
        "--log-flush-interval-ms",
        "600000",  # nothing flushes by time while the test runs
        "--log-flush-when-idle",
        "false",  # nor when the worker is idle
    )
    ok(
        broker.endpoint,
        "topic",
        "create",
        topic,
        "--config",
        "segment_bytes=100",
        "--config",
        "max_message_bytes=100",
    )
    with Cluster(broker.endpoint) as client:
        connection = client.connection_for(topic, 0)
        for _ in range(5):  # 40 bytes each: acknowledged once written, left unflushed
            message = encode_message(b"0123456789abcd")
            connection.request(ProduceRequest(topic, 0, Ack.WRITTEN, message))
    state = described(broker.endpoint, topic)["partitions"][0]
    assert (state["high_watermark"], state["log_end_offset"]) == (160, 200)  # rolls flushed

    ok(broker.endpoint, "topic", "alter", topic, "--set", "flush_messages=1")
    wait_until(
        lambda: described(broker.endpoint, topic)["partitions"][0]["high_watermark"] == 200,
        what="the pending message flushed once flush_messages is 1",
    )
    ok(broker.endpoint, "topic", "alter", topic, "--set", "retention_bytes=100")
    wait_until(  # segments [0, 80) [80, 160) [160, 200): the oldest goes, 120 bytes stay
        lambda: described(broker.endpoint, topic)["partitions"][0]["log_start_offset"] == 80,
        what="retention deleting the oldest segment",
    )
    state = described(broker.endpoint, topic)["partitions"][0]
    assert (state["segments"], state["size_bytes"], state["high_watermark"]) == (2, 120, 200)


def test_topic_create_list_and_delete_print_json(cluster: ThreeBrokers, topic: str) -> None:
    created = ok(cluster.endpoint, "topic", "create", topic, "--partitions", "2", "--json")
    assert json.loads(created.output) == {"topic": topic, "partitions": 2, "config": {}}
    listed = ok(cluster.endpoint, "topic", "list", "--json").output.splitlines()
    assert {"topic": topic, "partitions": 2} in [json.loads(line) for line in listed]
    # --json and --broker before the command, as pylogctl's global options (issue 30).
    first = CliRunner().invoke(cli, ["--json", "-b", cluster.endpoint, "topic", "list"])
    assert first.exit_code == 0 and first.output.splitlines() == listed, first.output
    deleted = ok(cluster.endpoint, "topic", "delete", topic, "--json")
    assert json.loads(deleted.output) == {"topic": topic, "deleted": True}


def test_a_broker_down_while_a_topic_is_altered_applies_the_change_when_it_starts(
    three_brokers: list[RunningBroker], topic: str
) -> None:
    first, second, third = three_brokers
    ok(first.endpoint, "topic", "create", topic, "--partitions", "3")  # partition 1 on broker 2
    second.stop()
    ok(
        first.endpoint,
        "topic",
        "alter",
        topic,
        "--set",
        "segment_bytes=100",
        "--set",
        "max_message_bytes=100",
    )
    unavailable = at(first.endpoint, "topic", "describe", topic).output.splitlines()[-2]
    # Its one replica down: down as the leader (no controller), or no leader (a controller).
    assert re.fullmatch(
        r"partition 1 broker (2|-1) epoch (-|\d+) replicas 2 isr (2|-) "
        r"unavailable \((broker down|no leader)\)",
        unavailable,
    ), unavailable
    again = second.restarted()
    try:
        wait_until(
            lambda: described(third.endpoint, topic)["partitions"][1]["available"],
            what="partition 1 served again",
        )
        in_effect = described(third.endpoint, topic)["partitions"][1]["settings_in_effect"]
        assert in_effect["segment_bytes"] == "100"
    finally:
        again.stop()


def test_topic_describe_names_each_partitions_leader_replicas_and_isr_as_leadership_moves(
    cluster: ThreeBrokers, topic: str
) -> None:
    """A replicated topic: every line names the leader, its epoch, the replicas and the ISR;
    after leadership moves (the state node written as the controller writes it) describe shows
    the new leader and epoch, and the partition's state asked of it."""
    config = ("--config", "replication_factor=3", "--config", "min_insync_replicas=2")
    ok(cluster.endpoint, "topic", "create", topic, "--partitions", "2", *config)
    produce(cluster.endpoint, topic, 0, b"hello", time_ms=1_700_000_000_000)
    registry = Registry(cluster.zookeeper, cluster.chroot)
    registry.start(timeout=10)
    try:
        describe_across_a_move(cluster, topic, registry)
    finally:
        registry.stop()


def describe_across_a_move(cluster: ThreeBrokers, topic: str, registry: Registry) -> None:
    wait_until(
        lambda: described(cluster.endpoint, topic)["partitions"][0]["high_watermark"] == 31,
        what="every replica flushed the message",  # a 26-byte header + "hello"
    )
    state, version = registry.topics.partition_state(topic, 0)
    line = re.compile(
        r"partition (\d) broker ([123]) epoch (\d+) replicas ([123],[123],[123]) isr ([123,]+) "
        r"log_start 0 high_watermark (\d+) "
    )
    shown = [
        line.match(text)
        for text in ok(cluster.endpoint, "topic", "describe", topic).output.splitlines()[-2:]
    ]
    assert all(shown), shown
    first = shown[0]
    assert first is not None
    assert int(first[2]) == state.leader and int(first[3]) == state.leader_epoch
    assert sorted(map(int, first[4].split(","))) == [1, 2, 3]
    assert sorted(map(int, first[5].split(","))) == sorted(state.isr)
    assert first[6] == "31"

    wait_until(lambda: len(registry.topics.partition_state(topic, 0)[0].isr) == 3, what="ISR of 3")
    state, version = registry.topics.partition_state(topic, 0)
    leader = next(b for b in sorted(state.isr) if b != state.leader)
    incarnation = registry.brokers.epochs()[leader]
    moved = PartitionState(
        leader, state.leader_epoch + 1, state.isr, state.controller_epoch, incarnation
    )
    registry.topics.write_partition_state(topic, 0, moved, version)

    def leader_shown() -> bool:
        partition = described(cluster.endpoint, topic)["partitions"][0]
        return partition["broker_id"] == leader and partition["available"] is True

    wait_until(leader_shown, what=f"broker {leader} described as the leader")
    # A new leader's high watermark starts at what it last heard of the old one's (0 when its
    # long poll had not come back since the old one's rose) and rises as the followers fetch
    # from it (docs/replication.md): waited for, not read at once (a CI run read 0).
    wait_until(
        lambda: described(cluster.endpoint, topic)["partitions"][0]["high_watermark"] == 31,
        what="the new leader's high watermark to reach the old one's",
    )
    partition = described(cluster.endpoint, topic)["partitions"][0]
    assert partition["leader_epoch"] == state.leader_epoch + 1
    assert sorted(partition["replicas"]) == [1, 2, 3]
    assert sorted(partition["isr"]) == sorted(state.isr)


def test_describe_shows_no_pending_change_for_replication_settings(
    broker: RunningBroker, topic: str
) -> None:
    """replication_factor and min_insync_replicas are the cluster's, not a partition's log
    settings: a partition never reports them in effect, and describe said "(applying
    replication_factor, min_insync_replicas)" for ever."""
    settings = ("--config", "replication_factor=1", "--config", "min_insync_replicas=1")
    created = run(broker, "topic", "create", topic, *settings, "--config", "retention_ms=60000")
    assert created.exit_code == 0, created.output
    described = run(broker, "topic", "describe", topic)
    assert described.exit_code == 0, described.output
    partition = described.output.splitlines()[-1]
    assert partition.startswith("partition 0 broker 0") and "applying" not in partition
    as_json = json.loads(run(broker, "topic", "describe", topic, "--json").output)
    assert as_json["partitions"][0]["applying"] == []
    assert as_json["partitions"][0]["settings_in_effect"]["retention_ms"] == "60000"
