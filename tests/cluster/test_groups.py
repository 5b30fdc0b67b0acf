"""Consumer groups on a real cluster: range assignment, rebalances when members come and go,
offsets committed in ZooKeeper, and a member cut off from ZooKeeper."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from broker.client import Admin, Producer
from broker.client.group import (
    BrokerPartition,
    GroupConsumer,
    RebalanceFailed,
    Record,
    assign_range,
)
from broker.log.message import HEADER_SIZE
from broker.protocol import Ack
from broker.registry import Registry
from broker.zookeeper import PrivateZooKeeper
from tests.cluster.conftest import Member, PrintingMember, broker_flags
from tests.conftest import wait_until
from tests.proxies import FreezableProxy
from tests.pylogd import RunningBroker


def produce(endpoint: str, topic: str, values: list[bytes]) -> None:
    with Producer(endpoint, topic, ack=Ack.FLUSHED, batch_messages=20) as producer:
        for value in values:
            producer.send(value)
        assert sum(a.count for a in producer.flush()) == len(values)


def owners(registry: Registry, group: str, topic: str) -> Counter[str]:
    """Member -> how many partitions of `topic` it owns."""
    return Counter(registry.partition_owners(group, topic).values())


def test_the_range_assignment_is_the_papers() -> None:
    partitions = [BrokerPartition("t", 1 + p % 3, p) for p in range(10)]
    shares = {m: assign_range(partitions, ["c", "a", "b"], m) for m in "abc"}
    # sorted by (broker, partition); the first 10 % 3 = 1 member takes one more
    ordered = sorted(partitions, key=lambda tp: (tp.broker_id, tp.partition))
    assert shares == {"a": ordered[0:4], "b": ordered[4:7], "c": ordered[7:10]}
    assert assign_range(partitions, ["a"], "z") == []
    assert assign_range(partitions[:2], ["a", "b", "c"], "c") == []


class CliMember(PrintingMember):
    """`pylogctl group consume --format json` in a child process; its lines, as read."""

    def __init__(self, zookeeper: str, chroot: str, group: str, topic: str, member: str) -> None:
        pylogctl = str(Path(sys.executable).with_name("pylogctl"))
        super().__init__(
            member,
            [
                *(pylogctl, "group", "consume", group, topic, "--consumer-id", member),
                *("--format", "json", "--commit-interval", "0.2"),
                *("--zookeeper", zookeeper, "--chroot", chroot),
            ],
        )


@pytest.fixture
def cli_members(
    zookeeper: PrivateZooKeeper, registry_chroot: str
) -> Iterator[Callable[[str, str, str], CliMember]]:
    started: list[CliMember] = []

    def start(group: str, topic: str, member: str) -> CliMember:
        started.append(CliMember(zookeeper.connect_string, registry_chroot, group, topic, member))
        return started[-1]

    yield start
    for member in started:
        print(f"--- {member.id} stderr:\n{member.stop()[-3000:]}")


def test_a_group_shares_the_partitions_through_joins_and_a_killed_member_losing_nothing(
    three_brokers: list[RunningBroker],
    cli_members: Callable[[str, str, str], CliMember],
    make_registry: Callable[..., Registry],
) -> None:
    one = three_brokers[0]
    with Admin(one.endpoint) as admin:
        admin.create_topic("events", 12)
    registry = make_registry()
    members = [cli_members("loaders", "events", f"m{i}") for i in (1, 2, 3)]
    wait_until(
        lambda: owners(registry, "loaders", "events") == {"m1": 4, "m2": 4, "m3": 4},
        30,
        "three members to own four partitions each",
    )
    produced = [b"a-%d" % i for i in range(600)]
    produce(one.endpoint, "events", produced)

    members.append(cli_members("loaders", "events", "m4"))
    wait_until(
        lambda: owners(registry, "loaders", "events") == {f"m{i}": 3 for i in (1, 2, 3, 4)},
        30,
        "four members to own three partitions each",
    )
    batch = [b"b-%d" % i for i in range(600)]
    produce(one.endpoint, "events", batch)
    produced += batch
    wait_until(
        lambda: set(produced) <= {v.encode() for m in members for v in m.values},
        30,
        "the first two batches to be consumed",
    )

    killed = members[0]
    os.kill(killed.process.pid, signal.SIGKILL)  # no commit, no release: its session expires
    killed.process.wait()
    wait_until(
        lambda: owners(registry, "loaders", "events") == {"m2": 4, "m3": 4, "m4": 4},
        30,
        "the partitions of the killed member to be owned again",
    )
    batch = [b"c-%d" % i for i in range(600)]
    produce(one.endpoint, "events", batch)
    produced += batch

    def consumed() -> Counter[str]:
        return Counter(v for m in members for v in m.values)

    wait_until(
        lambda: {v.decode() for v in produced} <= set(consumed()), 30, "every message consumed"
    )
    # at least once; twice only what the killed member had read past its last commit
    duplicates = {v for v, n in consumed().items() if n > 1}
    assert duplicates <= set(killed.values)
    assert max(consumed().values()) <= 2

    described = subprocess.run(
        [
            str(Path(sys.executable).with_name("pylogctl")),
            *("group", "describe", "loaders", "events", "--json"),
            *("--zookeeper", registry.connect_string, "--chroot", registry.chroot),
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    *partitions, summary = map(json.loads, described)
    assert sorted(summary["members"]) == ["m2", "m3", "m4"]
    assert Counter(p["owner"] for p in partitions) == {"m2": 4, "m3": 4, "m4": 4}
    assert all(p["committed"] is not None for p in partitions)


def test_two_groups_each_see_every_message(
    three_brokers: list[RunningBroker], make_member: Callable[..., Member]
) -> None:
    one = three_brokers[0]
    with Admin(one.endpoint) as admin:
        admin.create_topic("shared", 6)
    left = [make_member("left", ["shared"]) for _ in range(2)]
    right = [make_member("right", ["shared"])]
    wait_until(
        lambda: [len(m.consumer.assignment) for m in (*left, *right)] == [3, 3, 6],
        30,
        "both groups to settle",
    )
    produced = [b"v-%d" % i for i in range(300)]
    produce(one.endpoint, "shared", produced)

    def seen(group: list[Member]) -> Counter[bytes]:
        return Counter(v for m in group for v in m.values())

    wait_until(lambda: set(seen(left)) == set(produced), 30, "group left to read everything")
    wait_until(lambda: set(seen(right)) == set(produced), 30, "group right to read everything")
    assert seen(left) == seen(right) == Counter(produced)  # once each, in each group


def test_committed_offsets_hold_across_a_broker_restart(
    three_brokers: list[RunningBroker],
    make_member: Callable[..., Member],
    make_registry: Callable[..., Registry],
) -> None:
    one, two, _ = three_brokers
    with Admin(one.endpoint) as admin:
        admin.create_topic("kept", 3)
    first = [b"first-%d" % i for i in range(150)]
    produce(one.endpoint, "kept", first)
    member = make_member("keepers", ["kept"])
    wait_until(lambda: set(member.values()) == set(first), 30, "the first batch")
    member.close()  # commits and leaves
    registry = make_registry()
    committed = {
        p: registry.committed_offset("keepers", "kept", f"{1 + p % 3}-{p}") for p in range(3)
    }
    assert all(offset is not None and offset > 0 for offset in committed.values())

    observer = make_member("observers", ["kept"])  # another group, running throughout
    wait_until(lambda: len(observer.consumer.assignment) == 3, 30, "the observer's claim")
    two.kill()
    wait_until(  # broker 2's session expires: its partition leaves the group's share
        lambda: {tp.broker_id for tp in observer.consumer.assignment} == {1, 3},
        30,
        "the observer to rebalance without broker 2",
    )
    again = two.restarted()
    try:
        wait_until(lambda: len(observer.consumer.assignment) == 3, 30, "broker 2's return")
        second = [b"second-%d" % i for i in range(150)]
        with Admin(one.endpoint) as admin:
            wait_until(
                lambda: all(p.error_code == 0 for p in admin.topic("kept").partitions),
                30,
                "broker 2's partition to be served again",
            )
        produce(one.endpoint, "kept", second)
        assert {
            p: registry.committed_offset("keepers", "kept", f"{1 + p % 3}-{p}") for p in range(3)
        } == committed
        resumed = make_member("keepers", ["kept"])
        wait_until(lambda: set(resumed.values()) == set(second), 30, "the second batch")
        assert sorted(resumed.values()) == sorted(second)  # from the commits: nothing again
    finally:
        again.stop()


def test_a_member_cut_off_from_zookeeper_stops_before_another_takes_its_partitions(
    three_brokers: list[RunningBroker],
    make_member: Callable[..., Member],
    zookeeper: PrivateZooKeeper,
) -> None:
    one = three_brokers[0]
    with Admin(one.endpoint) as admin:
        admin.create_topic("guarded", 3)
    proxy = FreezableProxy(("127.0.0.1", zookeeper.port))
    try:
        cut = make_member(
            "guards", ["guarded"], zookeeper=f"127.0.0.1:{proxy.port}", consumer_id="a-cut"
        )
        wait_until(lambda: len(cut.consumer.assignment) == 3, 30, "the first member's claim")
        other = make_member("guards", ["guarded"], consumer_id="b-other")
        wait_until(lambda: len(other.consumer.assignment) == 1, 30, "a rebalance")  # sorted 2nd
        taken_from_cut = set(cut.consumer.assignment)

        stop = threading.Event()

        def keep_producing() -> None:  # bounded: at most 30 s of 100 messages a second
            with Producer(one.endpoint, "guarded", ack=Ack.WRITTEN, linger_ms=0) as producer:
                for i in range(3000):
                    if stop.is_set():
                        return
                    producer.send(b"p-%d" % i)
                    producer.flush()
                    time.sleep(0.01)

        producing = threading.Thread(target=keep_producing, daemon=True)
        producing.start()
        wait_until(lambda: len(cut.records) > 10, 30, "the cut member to be consuming")
        proxy.freeze()
        wait_until(
            lambda: any(taken_from_cut <= tps for _, tps in other.assigned[1:]),
            30,
            "the other member to take the cut member's partitions",
        )
        taken_at = next(t for t, tps in other.assigned[1:] if taken_from_cut <= tps)
        wait_until(
            lambda: sum(1 for t in cut.polls_started if t > taken_at) >= 3,
            30,
            "the cut member to poll again after the takeover",
        )
        stop.set()
        producing.join(30)
        last_read = max(t for t, _ in cut.records)
        assert last_read < taken_at, "the cut member read after its partitions were taken"
        assert not cut.consumer.connected
    finally:
        proxy.close()


def test_a_committed_offset_deleted_by_retention_is_reset_logged_and_counted(
    make_pylogd: Callable[..., RunningBroker],
    tmp_path: Path,
    make_member: Callable[..., Member],
    make_registry: Callable[..., Registry],
    caplog: pytest.LogCaptureFixture,
) -> None:
    broker = make_pylogd(
        *broker_flags(tmp_path, 1), "--log-retention-check-interval-ms", "100", name="b1"
    )
    with Admin(broker.endpoint) as admin:
        settings = {"segment_bytes": "1000", "max_message_bytes": "1000", "retention_bytes": "1000"}
        admin.create_topic("fading", 1, settings)
    registry = make_registry()
    registry.commit_offset("fading-readers", "fading", "1-0", 0)  # a commit from long ago
    produce(broker.endpoint, "fading", [b"%04d" % i for i in range(200)])
    segments = tmp_path / "broker-1" / "logs" / "fading-0"

    def retention_is_done() -> bool:
        """Retention has nothing left to delete: the segments after the oldest hold less than
        retention_bytes (docs/storage.md). A pass that ran while the messages were produced
        deleted only some, and the next (every 100 ms) deletes the rest."""
        try:
            sizes = [path.stat().st_size for path in sorted(segments.glob("*.log"))]
        except FileNotFoundError:  # deleted between the listing and its stat
            return False
        return sum(sizes[1:]) < 1000

    wait_until(retention_is_done, what="retention to delete the oldest segments")
    with Admin(broker.endpoint) as admin:
        log_start = admin.describe("fading")[0].log_start_offset
    assert log_start
    caplog.set_level("WARNING", logger="pylog.group")
    member = make_member("fading-readers", ["fading"])
    wait_until(lambda: member.values()[-1:] == [b"0199"], 30, "the member to read to the end")
    assert member.consumer.offset_resets == 1
    assert member.records[0][1].offset == log_start  # from the earliest offset still there
    assert (
        "offset 0 of fading 1-0 is out of range (deleted by retention?): "
        f"reading from earliest offset {log_start}"
    ) in caplog.text


def test_a_member_that_cannot_claim_its_partitions_gives_up_with_a_clear_error(
    three_brokers: list[RunningBroker],
    zookeeper: PrivateZooKeeper,
    registry_chroot: str,
    make_registry: Callable[..., Registry],
) -> None:
    with Admin(three_brokers[0].endpoint) as admin:
        admin.create_topic("stuck", 3)
    squatter = make_registry()  # a member that never releases partition 1-0
    squatter.register_consumer("stuck-readers", "z-squatter", ["stuck"])
    assert squatter.claim_partition("stuck-readers", "stuck", "1-0", "z-squatter") is None
    with GroupConsumer(
        zookeeper.connect_string,
        "stuck-readers",
        ["stuck"],
        chroot=registry_chroot,
        consumer_id="a-reader",  # sorted first: its range starts with 1-0
        rebalance_retries=2,
        rebalance_backoff_s=0.05,
    ) as reader:
        with pytest.raises(RebalanceFailed, match=r"could not claim stuck/1-0 \(owned by "):
            reader.poll(0)
        assert reader.assignment == frozenset()
    # nothing it claimed on the way is left behind
    assert squatter.partition_owners("stuck-readers", "stuck") == {"1-0": "z-squatter"}


def test_manual_commits_record_only_what_was_returned(
    three_brokers: list[RunningBroker],
    zookeeper: PrivateZooKeeper,
    registry_chroot: str,
    make_registry: Callable[..., Registry],
) -> None:
    one = three_brokers[0]
    with Admin(one.endpoint) as admin:
        admin.create_topic("manual", 1)
    produce(one.endpoint, "manual", [b"m-%d" % i for i in range(50)])
    registry = make_registry()
    with GroupConsumer(
        zookeeper.connect_string,
        "manual-readers",
        ["manual"],
        chroot=registry_chroot,
        auto_commit_interval_s=None,
    ) as reader:
        records: list[Record] = []
        while len(records) < 50:  # bounded: 50 messages come in a few polls
            records += reader.poll(1000)
            assert reader.assignment
        assert registry.committed_offset("manual-readers", "manual", "1-0") is None
        reader.commit()
        (position,) = reader.positions().values()
        assert position == records[-1].offset + HEADER_SIZE + len(records[-1].value)
        assert registry.committed_offset("manual-readers", "manual", "1-0") == position
