"""`pylogctl quota` against three real brokers: set, describe and delete, one broker down during
a change; every broker applies what is set; followers are never throttled by client quotas."""

from __future__ import annotations

import json
import time
from functools import partial

from broker.client import Producer
from broker.client.connection import Connection
from broker.protocol import Ack, FetchRequest
from tests.cli.conftest import ok, pylogctl
from tests.conftest import wait_until
from tests.pylogd import RunningBroker


def applied(broker: RunningBroker, described: str) -> bool:
    """Whether `broker` logged quotas that include `described` (it logs each change)."""
    lines = broker.log_path.read_text().splitlines()
    said = [line for line in lines if "quotas in ZooKeeper:" in line]
    return bool(said) and described in said[-1]


def test_quotas_set_described_deleted_and_applied_by_every_broker(
    three_brokers: list[RunningBroker],
) -> None:
    endpoint = three_brokers[0].endpoint
    said = ok(endpoint, "quota", "set", "--default-client", "--fetch", "10KB")
    assert said == "quota of client <default> now: produce -, fetch 10000 B/s\n"
    for broker in three_brokers:
        wait_until(partial(applied, broker, "client <default> produce - fetch 10000"), 5)

    # Followers copy at full speed whatever the client quotas: 2 MB at ack=all takes seconds,
    # where 10 KB a second would take minutes.
    ok(endpoint, "topic", "create", "copied", "--config", "replication_factor=3")
    started = time.monotonic()
    with Producer(endpoint, "copied", ack=Ack.ALL, client_id="writer") as producer:
        for i in range(2000):
            producer.send(b"%04d" % i + b"x" * 996)
        producer.flush()
    assert time.monotonic() - started < 20
    # A consumer is held to the default: its second 20 KB fetch waits a second.
    with Connection(endpoint, client_id="slow-reader", timeout_s=10.0) as connection:
        first = connection.call(FetchRequest("copied", 0, 0, 20_000, 0, 0))
        second = connection.call(FetchRequest("copied", 0, len(first.message_set), 20_000, 0, 0))
    assert first.throttle_ms == 0 and second.throttle_ms >= 500

    three_brokers[0].stop()  # a broker down during the change: the others are asked
    both = f"{three_brokers[0].endpoint},{three_brokers[1].endpoint}"
    said = ok(both, "quota", "set", "--client", "writer", "--produce", "1MiB")
    assert said == "quota of client writer now: produce 1048576 B/s, fetch -\n"
    for broker in three_brokers[1:]:
        wait_until(partial(applied, broker, "client writer produce 1048576 fetch -"), 5)
    listed = [json.loads(line) for line in ok(both, "quota", "describe", "--json").splitlines()]
    assert listed == [
        {"kind": "client", "name": "<default>", "produce_bytes_per_s": None,
         "fetch_bytes_per_s": 10000},
        {"kind": "client", "name": "writer", "produce_bytes_per_s": 1048576,
         "fetch_bytes_per_s": None},
    ]  # fmt: skip
    table = ok(both, "quota", "describe").splitlines()
    assert table[0].split() == ["KIND", "NAME", "PRODUCE", "B/S", "FETCH", "B/S"]
    assert table[2].split() == ["client", "writer", "1048576", "-"]
    in_force = ok(both, "quota", "describe", "--client", "writer")
    assert in_force == "quota of client writer in force: produce 1048576 B/s, fetch 10000 B/s\n"

    said = ok(both, "quota", "delete", "--client", "writer")
    assert said == "quota of client writer deleted\n"
    refused = pylogctl(both, "quota", "delete", "--client", "writer")
    assert refused.exit_code == 1
    assert "no quota of client writer: pylogctl quota describe shows them" in refused.output
    said = ok(both, "quota", "delete", "--default-client", "--fetch")
    assert said == "quota of client <default> deleted\n"
    for broker in three_brokers[1:]:
        wait_until(partial(applied, broker, "quotas in ZooKeeper: none"), 5)


def test_quota_commands_refuse_bad_input_with_the_reason() -> None:
    endpoint = "127.0.0.1:1"  # never reached: each is refused before
    for args, reason in [
        (("set", "--produce", "1MB"), "name exactly one of --principal, --client"),
        (("set", "--client", "a", "--principal", "b", "--produce", "1"), "exactly one"),
        (("set", "--client", "a"), "give --produce, --fetch or both"),
        (("set", "--client", "a", "--produce", "0"), "less than 1 byte a second"),
        (("set", "--client", "a", "--produce", "fast"), "'fast' is not a rate"),
        (("set", "--principal", "no spaces", "--produce", "1"), "principal"),
        (("set", "--client", "x" * 256, "--produce", "1"), "1 to 255 printable characters"),
        (("describe", "--client", "a", "--principal", "b"), "not both"),
    ]:
        result = pylogctl(endpoint, "quota", *args)
        assert result.exit_code == 2, (args, result.output)
        assert reason in result.output, (args, result.output)
