"""`pylogctl topic ...`, `produce` and `consume` against a real pylogd."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import xxhash
from click.testing import CliRunner, Result

from cli.pylogctl import cli
from tests.conftest import wait_until
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
    assert described.output.splitlines() == [
        f"topic {topic}: 3 partitions",
        "partition 0 broker 0 log_start 0 high_watermark 0",
        "partition 1 broker 0 log_start 0 high_watermark 0",
        "partition 2 broker 0 log_start 0 high_watermark 31",  # a 26-byte header + "hello"
    ]

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
        assert set(record) == {"topic", "offset", "partition", "timestamp", "key", "value"}

    user_1 = xxhash.xxh32_intdigest(b"user-1") % 2
    text = run(broker, "consume", topic, "--partition", str(user_1), "--max-messages", "1")
    assert text.exit_code == 0 and text.output == "first\n"
    second = next(r for r in records if r["value"] == "third:with colon")["offset"]
    tail = run(broker, "consume", topic, "--partition", str(user_1), "--from", str(second))
    assert tail.output == "third:with colon\n"


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
    assert result.stderr.startswith("pylogctl: broker tcp://127.0.0.1:9 unreachable: no reply")


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
