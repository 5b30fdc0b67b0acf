"""`pylogctl topic delete-records` against three real brokers: records before a time or an
offset are gone on every replica, through a broker down during the change, its restart and a
leader's restart; bad offsets are refused with the boundaries to use."""

from __future__ import annotations

import datetime
import json
from functools import partial

import pytest

from broker.client import Admin, PartitionConsumer, Producer
from broker.client.connection import Connection
from broker.errors import BrokerError, BrokerOffsetOutOfRange, Unavailable
from broker.protocol import EARLIEST, Ack, DescribePartitionRequest, FetchRequest, OffsetsRequest
from tests.cli.conftest import ok, pylogctl
from tests.conftest import wait_until
from tests.pylogd import RunningBroker

TOPIC = "trimmed"
OLD_MS = 1_700_000_000_000
NEW_MS = OLD_MS + 3_600_000


def starts(broker: RunningBroker, partition: int) -> int:
    """The log start of `broker`'s own copy of the partition (each replica describes its own)."""
    with Connection(broker.endpoint, timeout_s=5.0) as connection:
        return connection.call(DescribePartitionRequest(TOPIC, partition)).log_start_offset


def led(endpoint: str, partition: int) -> bool:
    """Whether the partition's leader serves it (a restarted leader is fenced until the
    controller has chosen again)."""
    try:
        with Admin(endpoint) as admin:
            admin.cluster.call_leader(OffsetsRequest(TOPIC, partition, EARLIEST), 0)
    except (BrokerError, Unavailable):
        return False
    return True


def all_start_at(brokers: list[RunningBroker], partition: int, offset: int) -> bool:
    return all(starts(broker, partition) == offset for broker in brokers)


def test_records_before_a_time_or_an_offset_are_gone_on_every_replica_for_good(
    three_brokers: list[RunningBroker],
) -> None:
    endpoint = three_brokers[0].endpoint
    ok(endpoint, "topic", "create", TOPIC, "--partitions", "2", "--config", "replication_factor=3")
    with Producer(endpoint, TOPIC, ack=Ack.ALL) as producer:
        for partition in (0, 1):
            for i in range(200):
                stamp = OLD_MS + i if i < 100 else NEW_MS + i
                producer.send(b"%03d" % i, timestamp_ms=stamp, partition=partition)
        producer.flush()
    with Admin(endpoint) as admin:
        first_new = [admin.describe_partition(TOPIC, p).high_watermark // 2 for p in (0, 1)]
    # 200 messages of one size: the 100th starts halfway
    cut = datetime.datetime.fromtimestamp(NEW_MS / 1000, datetime.UTC).isoformat()

    planned = ok(endpoint, "topic", "delete-records", TOPIC, "--before", cut, "--dry-run")
    assert planned.splitlines() == [
        f"{TOPIC}-{p}: log start would move 0 -> {first_new[p]} "
        f"({first_new[p]} bytes of records would be deleted)"
        for p in (0, 1)
    ]
    assert all_start_at(three_brokers, 0, 0) and all_start_at(three_brokers, 1, 0)

    said = ok(endpoint, "topic", "delete-records", TOPIC, "--before", cut, "--json")
    records = [json.loads(line) for line in said.splitlines()]
    assert [(r["partition"], r["log_start_after"], r["dry_run"]) for r in records] == [
        (0, first_new[0], False),
        (1, first_new[1], False),
    ]
    for p in (0, 1):
        wait_until(partial(all_start_at, three_brokers, p, first_new[p]), 10, "every replica")
    with PartitionConsumer(endpoint, TOPIC, 0, start="earliest", stop_at_end=True) as consumer:
        values = [m.value for m in consumer]
    assert values == [b"%03d" % i for i in range(100, 200)]
    # The deleted bytes stay on disk until their segment goes: describe says which they are.
    lines = ok(endpoint, "topic", "describe", TOPIC).splitlines()
    on_disk = 2 * first_new[0]
    kept = f"size_bytes {on_disk} ({first_new[0]} deleted, on disk until their segment goes)"
    assert kept in lines[-2], lines
    described = json.loads(ok(endpoint, "topic", "describe", TOPIC, "--json"))
    state = described["partitions"][0]
    assert (state["size_bytes"], state["deleted_bytes_on_disk"]) == (on_disk, first_new[0])
    with Admin(endpoint) as admin:
        leader = admin.topic(TOPIC).partitions[0].broker_id
    with (
        Connection(three_brokers[leader - 1].endpoint) as at_leader,
        pytest.raises(BrokerOffsetOutOfRange),
    ):
        at_leader.call(FetchRequest(TOPIC, 0, 0, 1000, 0, 0))

    # A broker down during the change gets it when it comes back; a restarted leader keeps it.
    message = first_new[0] // 100
    later = first_new[0] + 50 * message  # the 150th message of partition 0
    three_brokers[2].stop()
    both = f"{three_brokers[0].endpoint},{three_brokers[1].endpoint}"
    said = ok(both, "topic", "delete-records", TOPIC, "--partition", "0", "--before", str(later))
    deleted = later - first_new[0]
    moved = f"log start moved {first_new[0]} -> {later} ({deleted} bytes of records deleted)"
    assert said == f"{TOPIC}-0: {moved}\n"
    three_brokers[2] = three_brokers[2].restarted()
    wait_until(partial(all_start_at, three_brokers, 0, later), 20, "broker 3's copy too")
    with Admin(both) as admin:
        leader = admin.topic(TOPIC).partitions[0].broker_id
    three_brokers[leader - 1] = three_brokers[leader - 1].restarted()
    endpoint = ",".join(broker.endpoint for broker in three_brokers)  # restarted: new ports
    wait_until(partial(all_start_at, three_brokers, 0, later), 20, "a restarted leader's")
    assert starts(three_brokers[0], 1) == first_new[1]  # the other partition as it was
    wait_until(partial(led, endpoint, 0), 20, "a leader serving partition 0 again")

    said = ok(
        endpoint, "topic", "delete-records", TOPIC, "--partition", "0", "--before", str(later)
    )
    assert said == f"{TOPIC}-0: nothing before {later} (log start {later}): nothing deleted\n"


def test_bad_offsets_are_refused_with_the_boundaries_to_use(
    three_brokers: list[RunningBroker],
) -> None:
    endpoint = three_brokers[0].endpoint
    ok(endpoint, "topic", "create", TOPIC)
    with Producer(endpoint, TOPIC, ack=Ack.FLUSHED) as producer:
        for i in range(3):
            producer.send(b"%03d" % i, timestamp_ms=OLD_MS)
        producer.flush()
    with Admin(endpoint) as admin:
        end = admin.describe_partition(TOPIC, 0).high_watermark
    size = end // 3
    for args, reason in [
        (("--before", "5"), "an OFFSET is a byte position of one partition"),
        (("--partition", "0", "--before", "5"), f"inside the message [0, {size}): give 0"),
        (("--partition", "0", "--before", str(end + 1)), f"past its high watermark {end}"),
        (("--partition", "7", "--before", "latest"), "has partitions 0 to 0, not [7]"),
        (("--before", "yesterday"), "an offset, an ISO time or latest"),
    ]:
        result = pylogctl(endpoint, "topic", "delete-records", TOPIC, *args)
        assert result.exit_code == 2, (args, result.output)
        assert reason in result.output, (args, result.output)
    said = ok(endpoint, "topic", "delete-records", TOPIC, "--before", "latest")
    assert said == f"{TOPIC}-0: log start moved 0 -> {end} ({end} bytes of records deleted)\n"
    assert starts(three_brokers[0], 0) == end
