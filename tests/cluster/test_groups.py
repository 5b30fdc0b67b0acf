"""Consumer groups on a real cluster, their members joining through the brokers' group
coordinator: the partitions shared (uniform, sticky) and handed over incrementally as members
come, a killed member's partitions taken over once its session expires, offsets committed
through the coordinator (kept in ZooKeeper) holding across a restart of the group's
coordinator, a committed offset deleted by retention, and manual commits."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from broker.client import Admin, Producer
from broker.client.coordinator import GroupCalls
from broker.client.group import GroupConsumer
from broker.client.records import Record
from broker.groups.assignors import TopicPartition
from broker.groups.choice import coordinator_of
from broker.log.message import HEADER_SIZE
from broker.protocol import Ack, ErrorCode
from broker.registry import Registry
from tests.cluster.conftest import (
    Member,
    PrintingMember,
    bootstrap,
    broker_flags,
    printing_members,
)
from tests.conftest import wait_until
from tests.pylogd import RunningBroker


def produce(endpoint: str, topic: str, values: list[bytes]) -> None:
    with Producer(endpoint, topic, ack=Ack.FLUSHED, batch_messages=20) as producer:
        for value in values:
            producer.send(value)
        assert sum(a.count for a in producer.flush()) == len(values)


def owners(registry: Registry, group: str, topic: str) -> Counter[str]:
    """Member -> how many partitions of `topic` it owns (the owner nodes the coordinator
    writes: they may lag its assignment a moment)."""
    return Counter(registry.groups.partition_owners(group, topic).values())


def stored_offsets(registry: Registry, group: str, topic: str) -> dict[int, int]:
    """The group's committed offsets of `topic` as ZooKeeper keeps them, by partition number
    (the nodes are named <broker>-<partition>)."""
    offsets = registry.groups.committed_offsets(group).get(topic, {})
    return {int(name.rsplit("-", 1)[1]): offset for name, offset in offsets.items()}


class CliMember(PrintingMember):
    """`pylogctl group consume --format json` in a child process, joining through the brokers
    of `broker`; its lines, as read."""

    def __init__(self, broker: str, group: str, topic: str, member: str) -> None:
        pylogctl = str(Path(sys.executable).with_name("pylogctl"))
        super().__init__(
            member,
            [
                *(pylogctl, "group", "consume", group, topic, "--consumer-id", member),
                *("--format", "json", "--commit-interval", "0.2", "--broker", broker),
            ],
        )


@pytest.fixture
def cli_members() -> Iterator[Callable[[str, str, str, str], CliMember]]:
    with printing_members(CliMember) as start:
        yield start


def test_a_group_shares_the_partitions_through_joins_and_a_killed_member_losing_nothing(
    three_brokers: list[RunningBroker],
    cli_members: Callable[[str, str, str, str], CliMember],
    make_registry: Callable[..., Registry],
) -> None:
    brokers = bootstrap(three_brokers)
    with Admin(brokers) as admin:
        admin.create_topic("events", 12)
    registry = make_registry()
    members = [cli_members(brokers, "loaders", "events", f"m{i}") for i in (1, 2, 3)]
    wait_until(
        lambda: owners(registry, "loaders", "events") == {"m1": 4, "m2": 4, "m3": 4},
        30,
        "three members to own four partitions each",
    )
    produced = [b"a-%d" % i for i in range(600)]
    produce(brokers, "events", produced)

    before = registry.groups.partition_owners("loaders", "events")
    members.append(cli_members(brokers, "loaders", "events", "m4"))
    wait_until(
        lambda: owners(registry, "loaders", "events") == {f"m{i}": 3 for i in (1, 2, 3, 4)},
        30,
        "four members to own three partitions each",
    )
    # incremental: the newcomer's three partitions came one from each member, and every other
    # partition stayed with its owner
    after = registry.groups.partition_owners("loaders", "events")
    assert {p for p, m in after.items() if m != before[p]} == {
        p for p, m in after.items() if m == "m4"
    }
    assert Counter(before[p] for p, m in after.items() if m == "m4") == {"m1": 1, "m2": 1, "m3": 1}
    batch = [b"b-%d" % i for i in range(600)]
    produce(brokers, "events", batch)
    produced += batch
    wait_until(
        lambda: set(produced) <= {v.encode() for m in members for v in m.values},
        30,
        "the first two batches to be consumed",
    )

    killed = members[0]
    os.kill(killed.process.pid, signal.SIGKILL)  # no commit, no leave: its session expires
    killed.process.wait()
    wait_until(
        lambda: owners(registry, "loaders", "events") == {"m2": 4, "m3": 4, "m4": 4},
        30,
        "the coordinator to give the killed member's partitions to the others",
    )
    # only the killed member's partitions moved, one to each of the others
    last = registry.groups.partition_owners("loaders", "events")
    assert {p for p, m in last.items() if m != after[p]} == {
        p for p, m in after.items() if m == "m1"
    }
    batch = [b"c-%d" % i for i in range(600)]
    produce(brokers, "events", batch)
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
            *("group", "describe", "loaders", "events", "--json", "--broker", brokers),
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout.splitlines()
    *partitions, summary = map(json.loads, described)
    assert sorted(summary["members"]) == ["m2", "m3", "m4"]
    assert Counter(p["owner"] for p in partitions) == {"m2": 4, "m3": 4, "m4": 4}
    assert all(p["committed"] is not None for p in partitions)


def test_two_groups_each_see_every_message(
    three_brokers: list[RunningBroker], make_member: Callable[..., Member]
) -> None:
    brokers = bootstrap(three_brokers)
    with Admin(brokers) as admin:
        admin.create_topic("shared", 6)
    left = [make_member(brokers, "left", ["shared"]) for _ in range(2)]
    right = [make_member(brokers, "right", ["shared"])]
    wait_until(
        lambda: [len(m.consumer.assignment) for m in (*left, *right)] == [3, 3, 6],
        30,
        "both groups to settle",
    )
    produced = [b"v-%d" % i for i in range(300)]
    produce(brokers, "shared", produced)

    def seen(group: list[Member]) -> Counter[bytes]:
        return Counter(v for m in group for v in m.values())

    wait_until(lambda: set(seen(left)) == set(produced), 30, "group left to read everything")
    wait_until(lambda: set(seen(right)) == set(produced), 30, "group right to read everything")
    assert seen(left) == seen(right) == Counter(produced)  # once each, in each group


def test_committed_offsets_hold_across_a_restart_of_the_groups_coordinator(
    three_brokers: list[RunningBroker],
    make_member: Callable[..., Member],
    make_registry: Callable[..., Registry],
) -> None:
    """The broker coordinating the group is killed: another takes the group over with its
    offsets (from ZooKeeper), and hands it back when the first is restarted. A member of
    another group reading throughout keeps its partitions, the killed broker's included."""
    brokers = bootstrap(three_brokers)
    with Admin(brokers) as admin:
        admin.create_topic("kept", 3)
    first = [b"first-%d" % i for i in range(150)]
    produce(brokers, "kept", first)
    member = make_member(brokers, "keepers", ["kept"])
    wait_until(lambda: set(member.values()) == set(first), 30, "the first batch")
    member.close()  # commits and leaves
    registry = make_registry()
    committed = stored_offsets(registry, "keepers", "kept")
    assert sorted(committed) == [0, 1, 2]
    assert all(offset > 0 for offset in committed.values())
    expected = {TopicPartition("kept", p): offset for p, offset in committed.items()}
    with GroupCalls(brokers, "keepers") as calls:
        assert calls.committed(["kept"]) == expected

    observer = make_member(brokers, "observers", ["kept"])  # another group, reading throughout
    wait_until(lambda: set(observer.values()) == set(first), 30, "the observer to read it all")
    assert len(observer.consumer.assignment) == 3
    by_id = dict(enumerate(three_brokers, 1))
    chosen = coordinator_of("keepers", by_id)
    assert chosen is not None
    survivors = {i: b for i, b in by_id.items() if i != chosen}
    taker = coordinator_of("keepers", survivors)
    assert taker is not None
    by_id[chosen].kill()
    with GroupCalls(bootstrap(survivors.values()), "keepers") as calls:  # until one answers
        assert calls.committed(["kept"]) == expected
        assert calls.coordinator == survivors[taker].endpoint
    again = three_brokers[chosen - 1].restarted()
    three_brokers[chosen - 1] = again
    brokers = bootstrap(three_brokers)
    with Admin(brokers) as admin:
        wait_until(
            lambda: all(p.error_code == 0 for p in admin.topic("kept").partitions),
            30,
            "the restarted broker's partition to be served again",
        )
    with GroupCalls(brokers, "keepers") as calls:

        def handed_back() -> bool:
            return calls.committed(["kept"]) == expected and calls.coordinator == again.endpoint

        wait_until(handed_back, 30, "the group handed back to the restarted broker")
    assert stored_offsets(registry, "keepers", "kept") == committed

    second = [b"second-%d" % i for i in range(150)]
    produce(brokers, "kept", second)
    resumed = make_member(brokers, "keepers", ["kept"])
    wait_until(lambda: set(resumed.values()) == set(second), 30, "the second batch")
    assert sorted(resumed.values()) == sorted(second)  # from the commits: nothing again
    wait_until(lambda: set(observer.values()) == set(first + second), 30, "the observer to read on")
    assert observer.revoked == []  # its partitions stayed its own throughout
    assert len(observer.consumer.assignment) == 3


def test_a_committed_offset_deleted_by_retention_is_reset_logged_and_counted(
    make_pylogd: Callable[..., RunningBroker],
    tmp_path: Path,
    make_member: Callable[..., Member],
    caplog: pytest.LogCaptureFixture,
) -> None:
    broker = make_pylogd(
        *broker_flags(tmp_path, 1), "--log-retention-check-interval-ms", "100", name="b1"
    )
    with Admin(broker.endpoint) as admin:
        settings = {"segment_bytes": "1000", "max_message_bytes": "1000", "retention_bytes": "1000"}
        admin.create_topic("fading", 1, settings)
    with GroupCalls(broker.endpoint, "fading-readers") as calls:  # a commit from long ago
        assert calls.commit({TopicPartition("fading", 0): 0}) == {
            TopicPartition("fading", 0): ErrorCode.NONE
        }
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
    member = make_member(broker.endpoint, "fading-readers", ["fading"])
    wait_until(lambda: member.values()[-1:] == [b"0199"], 30, "the member to read to the end")
    assert member.consumer.offset_resets == 1
    assert member.records[0][1].offset == log_start  # from the earliest offset still there
    assert (
        "offset 0 of fading/0 is out of range (deleted by retention?): "
        f"reading from earliest offset {log_start}"
    ) in caplog.text


def test_manual_commits_record_only_what_was_returned(
    three_brokers: list[RunningBroker], make_registry: Callable[..., Registry]
) -> None:
    brokers = bootstrap(three_brokers)
    with Admin(brokers) as admin:
        admin.create_topic("manual", 1)
    produce(brokers, "manual", [b"m-%d" % i for i in range(50)])
    registry = make_registry()
    with (
        GroupConsumer(brokers, "manual-readers", ["manual"], auto_commit_interval_s=None) as reader,
        GroupCalls(brokers, "manual-readers") as calls,
    ):
        records: list[Record] = []
        deadline = time.monotonic() + 30
        while len(records) < 50 and time.monotonic() < deadline:  # bounded: 50 messages, 30 s
            records += reader.poll(1000)
        assert [r.value for r in records] == [b"m-%d" % i for i in range(50)]
        assert reader.assignment
        assert stored_offsets(registry, "manual-readers", "manual") == {}
        assert calls.committed(["manual"]) == {}
        reader.commit()
        (position,) = reader.positions().values()
        assert position == records[-1].offset + HEADER_SIZE + len(records[-1].value)
        assert stored_offsets(registry, "manual-readers", "manual") == {0: position}
        assert calls.committed(["manual"]) == {TopicPartition("manual", 0): position}
