"""`pylogctl group list | describe | reset | delete` against three real brokers and ZooKeeper."""

from __future__ import annotations

import datetime
import json
import os
import selectors
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from broker.client import Admin, Producer
from broker.client.connection import Connection
from broker.client.coordinator import GroupCalls
from broker.client.group import GroupConsumer
from broker.client.records import Record
from broker.errors import BrokerError
from broker.groups.assignors import TopicPartition
from broker.protocol import MetadataRequest
from broker.registry import Registry
from broker.zookeeper import PrivateZooKeeper
from cli.pylogctl import cli
from tests.cli.conftest import Cluster
from tests.conftest import wait_until
from tests.pylogd import RunningBroker

SIZE = 26 + 9
"""A message of these tests on disk: the 26-byte header and a 9-byte value, no key."""
HOUR_AGO_MS = int(time.time() * 1000) - 3_600_000


def run(cluster: Cluster, *args: str) -> Result:
    """`pylogctl group ARGS` on the cluster's registry (--zookeeper, --chroot), and its brokers
    (--broker: a coordinated group's reset goes through its coordinator)."""
    env = {"PYLOG_ZOOKEEPER": cluster.zookeeper, "PYLOG_BROKER": cluster.endpoint}
    return CliRunner().invoke(cli, ["group", *args, "--chroot", cluster.chroot], env=env)


def json_lines(result: Result) -> list[dict[str, object]]:
    assert result.exit_code == 0, result.output
    return [json.loads(line) for line in result.stdout.splitlines()]


@pytest.fixture
def group() -> str:
    return f"g-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def registry(cluster: Cluster) -> Iterator[Registry]:
    with Registry(cluster.zookeeper, cluster.chroot) as registry:
        yield registry


def make_topic(cluster: Cluster, topic: str, counts: list[int], timestamp_ms: int = 0) -> None:
    """Create `topic` with a partition per count (partition p on broker 1 + p % 3) and write
    that many messages `message-i` to each, the i-th stamped `timestamp_ms + i * 1000`."""
    with Admin(cluster.endpoint) as admin:
        admin.create_topic(topic, len(counts))
    with Producer(cluster.endpoint, topic) as producer:
        for partition, count in enumerate(counts):
            for i in range(count):
                stamp = timestamp_ms + i * 1000 if timestamp_ms else None
                producer.send(b"message-%d" % i, timestamp_ms=stamp, partition=partition)


def member(cluster: Cluster, group: str, topic: str, consumer_id: str) -> GroupConsumer:
    """A member of `group` for `topic`, joined through the group's coordinator: returned once
    the coordinator has written its node (/consumers/<group>/members/<consumer_id>), which is
    what `pylogctl group` reads. It joins in its heartbeat thread, so no poll is needed for
    that; one is for it to take its partitions."""
    consumer = GroupConsumer(cluster.endpoint, group, [topic], consumer_id=consumer_id)
    try:
        with Registry(cluster.zookeeper, cluster.chroot) as registry:
            wait_until(
                lambda: consumer_id in registry.groups.group_members(group),
                30,
                f"{consumer_id} in group {group}",
            )
    except BaseException:
        consumer.close()
        raise
    return consumer


def reads(consumer: GroupConsumer, into: list[Record], count: int) -> Callable[[], bool]:
    """A condition for wait_until: `consumer` polled once more, what it gave added to `into`,
    until `into` has `count` records."""

    def enough() -> bool:
        into.extend(consumer.poll(100))
        return len(into) >= count

    return enough


def test_list_names_each_group_with_its_members_and_topics(
    cluster: Cluster, registry: Registry, group: str, topic: str
) -> None:
    make_topic(cluster, topic, [2])
    registry.groups.commit_offset(group, topic, "1-0", SIZE)
    with member(cluster, f"{group}-live", topic, "m1"):
        listed = run(cluster, "list")
        assert listed.exit_code == 0, listed.output
        rows = [line.split() for line in listed.stdout.splitlines()]
        assert rows[0] == ["GROUP", "MEMBERS", "TOPICS"]
        assert [group, "0", topic] in rows and [f"{group}-live", "1", topic] in rows
        as_json = json_lines(run(cluster, "list", "--json"))
        assert {"group": f"{group}-live", "members": ["m1"], "topics": [topic]} in as_json
        assert {"group": group, "members": [], "topics": [topic]} in as_json
    left = run(cluster, "describe", f"{group}-live")  # listed, so described, if empty
    assert left.exit_code == 0, left.output
    assert left.stdout.splitlines()[-1] == (
        f"group {group}-live: 0 members, 0 partitions of 0 topics, lag 0 bytes, 0 messages, - s"
    )


def test_describe_gives_lag_in_bytes_messages_and_seconds_and_a_summary(
    cluster: Cluster, registry: Registry, group: str, topic: str
) -> None:
    make_topic(cluster, topic, [5, 3, 0], timestamp_ms=HOUR_AGO_MS)
    registry.groups.commit_offset(group, topic, "1-0", 2 * SIZE)  # messages 2, 3, 4 unread
    registry.groups.commit_offset(group, topic, "2-1", 3 * SIZE)  # all read
    described = run(cluster, "describe", group)  # partition 2: nothing committed
    assert described.exit_code == 0, described.output
    rows = [line.split() for line in described.stdout.splitlines()]
    assert rows[0] == [
        "TOPIC",
        "PARTITION",
        "BROKER",
        "OWNER",
        "COMMITTED",
        "HIGH_WATERMARK",
        "LAG_BYTES",
        "LAG_MESSAGES",
        "LAG_SECONDS",
        "RETENTION_S",
        "NOTE",
    ]
    age = time.time() - (HOUR_AGO_MS + 2000) / 1000  # message 2 is the next unread
    p0 = rows[1]
    assert p0[:8] == [topic, "0", "1", "-", str(2 * SIZE), str(5 * SIZE), str(3 * SIZE), "3"]
    assert age - 60 < float(p0[8]) <= age + 1
    # one segment, nothing appended lately: retention deletes nothing unread as things stand
    assert rows[2] == [topic, "1", "2", "-", str(3 * SIZE), str(3 * SIZE), "0", "0", "0.0", "-"]
    assert rows[3][:6] == [topic, "2", "3", "-", "-", "0"]  # then lag "-" and a note
    summary = rows[4]
    assert summary[:3] == ["group", f"{group}:", "0"]
    assert described.stdout.splitlines()[4].startswith(
        f"group {group}: 0 members, 3 partitions of 1 topic, lag {3 * SIZE} bytes, 3 messages, "
    )

    partitions = json_lines(run(cluster, "describe", group, "--json"))
    assert partitions[0] == {
        "type": "partition",
        "group": group,
        "topic": topic,
        "partition": 0,
        "broker": 1,
        "owner": None,
        "committed": 2 * SIZE,
        "log_start": 0,
        "high_watermark": 5 * SIZE,
        "lag_bytes": 3 * SIZE,
        "lag_messages": 3,
        "lag_messages_estimated": False,
        "lag_seconds": partitions[0]["lag_seconds"],
        "retention_seconds": None,
        "retention_bytes": None,
        "note": None,
    }
    assert partitions[2]["note"] == "no committed offset"
    total = partitions[3]
    assert total["type"] == "group" and total["members"] == {}
    assert (total["lag_bytes"], total["lag_messages"]) == (3 * SIZE, 3)
    assert total["lag_seconds"] == partitions[0]["lag_seconds"]


def test_describe_counts_messages_up_to_a_limit_then_estimates_and_says_so(
    cluster: Cluster, registry: Registry, group: str, topic: str
) -> None:
    make_topic(cluster, topic, [10])
    registry.groups.commit_offset(group, topic, "1-0", 0)
    described = run(cluster, "describe", group, "--count-bytes", str(3 * SIZE))
    assert described.exit_code == 0, described.output
    assert described.stdout.splitlines()[1].split()[6:8] == [str(10 * SIZE), "~10"]
    assert "~10 messages (estimated)" in described.stdout.splitlines()[-1]
    (row, _) = json_lines(run(cluster, "describe", group, "--json", "--count-bytes", "100"))
    assert (row["lag_messages"], row["lag_messages_estimated"]) == (10, True)
    exact = json_lines(run(cluster, "describe", group, "--json"))[0]
    assert (exact["lag_messages"], exact["lag_messages_estimated"]) == (10, False)


def test_describe_names_the_owner_of_each_partition_and_the_members(
    cluster: Cluster, group: str, topic: str
) -> None:
    make_topic(cluster, topic, [4, 4, 4])
    with member(cluster, group, topic, "solo") as solo:
        wait_until(lambda: solo.poll(100) or len(solo.assignment) == 3, 30, "3 partitions")
        solo.commit()
        described = run(cluster, "describe", group, topic)  # TOPIC... narrows it
        assert described.exit_code == 0, described.output
        rows = [line.split() for line in described.stdout.splitlines()[1:4]]
        assert [row[3] for row in rows] == ["solo", "solo", "solo"]
        assert described.stdout.splitlines()[4].startswith(f"group {group}: 1 member (solo), ")
        total = json_lines(run(cluster, "describe", group, "--json"))[-1]
        assert total["members"] == {"solo": [topic]}


def test_describe_of_a_group_that_does_not_exist_is_an_error(cluster: Cluster, group: str) -> None:
    described = run(cluster, "describe", group)
    assert described.exit_code == 1
    assert described.stderr == (
        f"pylogctl: no consumer group {group!r}: nothing committed, owned or consuming "
        "(pylogctl group list shows the groups)\n"
    )


def test_describe_watch_refreshes_until_ctrl_c(
    cluster: Cluster, registry: Registry, group: str, topic: str
) -> None:
    make_topic(cluster, topic, [3])
    registry.groups.commit_offset(group, topic, "1-0", 0)
    process = subprocess.Popen(
        [
            str(Path(sys.executable).with_name("pylogctl")),
            *("group", "describe", group, "--watch", "--interval", "0.2", "--json"),
            *("--zookeeper", cluster.zookeeper, "--chroot", cluster.chroot),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        os.set_blocking(process.stdout.fileno(), False)
        selector = selectors.DefaultSelector()
        selector.register(process.stdout, selectors.EVENT_READ)
        summaries: list[dict[str, object]] = []
        buffered = ""
        deadline = time.monotonic() + 30
        while len(summaries) < 2 and time.monotonic() < deadline:
            if selector.select(max(0.0, deadline - time.monotonic())):
                buffered += process.stdout.read() or ""
            *lines, buffered = buffered.split("\n")
            summaries += [s for s in map(json.loads, lines) if s["type"] == "group"]
        assert len(summaries) >= 2, "two refreshes"
        registry.groups.commit_offset(group, topic, "1-0", 3 * SIZE)
        while summaries[-1]["lag_bytes"] != 0 and time.monotonic() < deadline:
            if selector.select(max(0.0, deadline - time.monotonic())):
                buffered += process.stdout.read() or ""
            *lines, buffered = buffered.split("\n")
            summaries += [s for s in map(json.loads, lines) if s["type"] == "group"]
        assert summaries[0]["lag_bytes"] == 3 * SIZE and summaries[-1]["lag_bytes"] == 0
        process.send_signal(signal.SIGINT)
        assert process.wait(15) == 0
        assert process.stderr is not None and process.stderr.read() == ""
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def reset(cluster: Cluster, group: str, topic: str, *args: str) -> Result:
    return run(cluster, "reset", group, "--topic", topic, *args)


@pytest.mark.parametrize(
    ("how", "after", "note"),
    [
        (["--to", "earliest"], 0, None),
        (["--to", "latest"], 6 * SIZE, None),
        (["--to", str(4 * SIZE)], 4 * SIZE, None),
        (["--to", str(4 * SIZE + 5)], 4 * SIZE, "inside a message: moved to its start"),
        (["--to", str(60 * SIZE)], 6 * SIZE, "past the high watermark"),
        (["--to", "time:+1s"], 1 * SIZE, None),  # a second after message 0
        (["--shift-by", "-2"], 1 * SIZE, None),
        (["--shift-by", "2"], 5 * SIZE, None),
        (["--shift-by", "-100"], 0, "only 3 messages before it"),
        (["--shift-by", "100"], 6 * SIZE, "only 3 messages after it"),
    ],
)
def test_reset_moves_committed_offsets_to_message_boundaries_dry_run_first(
    cluster: Cluster,
    registry: Registry,
    group: str,
    topic: str,
    how: list[str],
    after: int,
    note: str | None,
) -> None:
    make_topic(cluster, topic, [6, 0], timestamp_ms=HOUR_AGO_MS)
    registry.groups.commit_offset(group, topic, "1-0", 3 * SIZE)
    if how[:2] == ["--to", "time:+1s"]:
        moment = datetime.datetime.fromtimestamp(HOUR_AGO_MS / 1000 + 0.5, datetime.UTC)
        how = ["--to", moment.isoformat()]
    planned = reset(cluster, group, topic, *how)
    assert planned.exit_code == 0, planned.output
    lines = planned.stdout.splitlines()
    assert lines[0].split() == ["TOPIC", "PARTITION", "BEFORE", "AFTER", "NOTE"]
    assert lines[1].split()[:4] == [topic, "0", str(3 * SIZE), str(after)]
    assert (note or "") in lines[1]
    shift = how[0] == "--shift-by"  # partition 1 is empty, with nothing committed
    assert lines[2].split()[:4] == [topic, "1", "-", "-" if shift else "0"]
    assert lines[-1] == "dry run: nothing changed (--execute applies it)"
    assert registry.groups.committed_offset(group, topic, "1-0") == 3 * SIZE

    applied = json_lines(reset(cluster, group, topic, *how, "--execute", "--json"))
    assert applied[0] == {
        "group": group,
        "topic": topic,
        "partition": 0,
        "before": 3 * SIZE,
        "after": after,
        "note": applied[0]["note"],
        "applied": True,
    }
    assert applied[1]["applied"] is not shift
    assert registry.groups.committed_offset(group, topic, "1-0") == after
    assert registry.groups.committed_offset(group, topic, "2-1") == (None if shift else 0)


def test_reset_of_partitions_without_a_commit_sets_them_for_a_new_group(
    cluster: Cluster, registry: Registry, group: str, topic: str
) -> None:
    make_topic(cluster, topic, [2, 3])
    executed = reset(cluster, group, topic, "--to", "latest", "--execute")
    assert executed.exit_code == 0, executed.output
    assert executed.stdout.splitlines()[-1] == f"group {group}: 2 partitions of {topic} reset"
    assert registry.groups.committed_offset(group, topic, "1-0") == 2 * SIZE
    assert registry.groups.committed_offset(group, topic, "2-1") == 3 * SIZE
    with member(cluster, group, topic, "late") as late:  # starts at the end, reads nothing
        wait_until(lambda: late.poll(100) == [] and len(late.assignment) == 2, 30, "assigned")
        assert late.positions() == {
            tp: (2 if tp.partition == 0 else 3) * SIZE for tp in late.assignment
        }


def test_reset_refuses_while_a_member_consumes_the_topic_and_applies_once_it_left(
    cluster: Cluster, registry: Registry, group: str, topic: str
) -> None:
    """A member in the group blocks a reset of its topic: pylogctl refuses it, --force or not
    (the group's coordinator would too: it keeps the offsets its members are given). Once the
    member has left, the reset goes through the coordinator, and the next member reads from
    there."""
    make_topic(cluster, topic, [3])
    registry.groups.commit_offset(group, topic, "1-0", 2 * SIZE)
    with member(cluster, group, topic, "busy"):
        told = (
            f"pylogctl: group {group} has 1 active member (busy) consuming {topic}: stop it "
            "first (its coordinator refuses a reset while a member reads the topic)\n"
        )
        for force in ((), ("--force",)):
            refused = reset(cluster, group, topic, "--to", "earliest", "--execute", *force)
            assert (refused.exit_code, refused.stderr) == (1, told)
        dry = reset(cluster, group, topic, "--to", "earliest")
        assert dry.exit_code == 0 and "--execute will refuse\n" in dry.stdout
        assert registry.groups.committed_offset(group, topic, "1-0") == 2 * SIZE
        with GroupCalls(cluster.endpoint, group) as calls:
            assert calls.committed([topic]) == {TopicPartition(topic, 0): 2 * SIZE}
    executed = reset(cluster, group, topic, "--to", "earliest", "--execute")  # the member down
    assert executed.exit_code == 0, executed.output
    with GroupCalls(cluster.endpoint, group) as calls:
        assert calls.committed([topic]) == {TopicPartition(topic, 0): 0}
    assert registry.groups.committed_offset(group, topic, "1-0") == 0
    with member(cluster, group, topic, "next") as following:
        read: list[Record] = []
        wait_until(reads(following, read, 3), what="3 messages")
        assert [r.value for r in read] == [b"message-0", b"message-1", b"message-2"]


def test_reset_usage_errors_exit_2(cluster: Cluster, group: str, topic: str) -> None:
    for args in (
        [],
        ["--to", "earliest", "--shift-by", "1"],
        ["--to", "yesterday-ish"],
        ["--to", "-4"],
    ):
        result = reset(cluster, group, topic, *args)
        assert result.exit_code == 2, (args, result.output)
    unknown = reset(cluster, group, topic, "--to", "earliest")
    assert unknown.exit_code == 1
    assert (
        unknown.stderr == f"pylogctl: no topic {topic!r} (pylogctl topic list shows the topics)\n"
    )


def test_delete_refuses_while_the_group_has_members_then_deletes_it(
    cluster: Cluster, registry: Registry, group: str, topic: str
) -> None:
    make_topic(cluster, topic, [1])
    registry.groups.commit_offset(group, topic, "1-0", SIZE)
    with member(cluster, group, topic, "stay"):
        refused = run(cluster, "delete", group)
        assert refused.exit_code == 1
        assert refused.stderr == (
            f"pylogctl: group {group} has 1 member (stay): stop it first (a member that died "
            "leaves when its session ends)\n"
        )
        assert registry.groups.committed_offset(group, topic, "1-0") == SIZE
    deleted = run(cluster, "delete", group)
    assert deleted.exit_code == 0, deleted.output
    assert deleted.stdout == f"deleted group {group}\n"
    assert registry.groups.committed_offset(group, topic, "1-0") is None
    assert group not in run(cluster, "list").stdout.split()
    again = run(cluster, "delete", group, "--json")
    assert again.exit_code == 1
    assert again.stderr == (
        f"pylogctl: no consumer group {group!r} (pylogctl group list shows the groups)\n"
    )
    with member(cluster, group, topic, "anew") as anew:  # from --reset (earliest), not SIZE
        read: list[Record] = []
        wait_until(reads(anew, read, 1), what="a message")
        assert [r.offset for r in read] == [0]


def test_the_group_commands_find_zookeeper_through_the_broker(
    cluster: Cluster, registry: Registry, group: str, topic: str
) -> None:
    make_topic(cluster, topic, [2])
    registry.groups.commit_offset(group, topic, "1-0", SIZE)
    env: dict[str, str | None] = {"PYLOG_BROKER": cluster.endpoint, "PYLOG_ZOOKEEPER": None}
    runner = CliRunner()
    described = runner.invoke(cli, ["group", "describe", group, "--json"], env=env)
    partition, summary = json_lines(described)
    assert (partition["committed"], partition["lag_bytes"]) == (SIZE, SIZE)
    assert summary["lag_bytes"] == SIZE
    listed = runner.invoke(cli, ["group", "list", "--broker", cluster.endpoint], env=env)
    assert listed.exit_code == 0 and [group, "0", topic] in map(
        str.split, listed.stdout.splitlines()
    )
    wrong_chroot = runner.invoke(
        cli, ["group", "describe", group, "--chroot", f"/elsewhere-{group}"], env=env
    )
    assert wrong_chroot.exit_code == 1  # --chroot overrides the broker's
    assert wrong_chroot.stderr.startswith(f"pylogctl: no consumer group {group!r}")
    consumed = runner.invoke(
        cli, ["group", "consume", group, topic, "--max-messages", "1", "--format", "json"], env=env
    )
    assert consumed.exit_code == 0, consumed.output
    assert json.loads(consumed.stdout)["offset"] == SIZE  # from the group's committed offset
    assert registry.groups.committed_offset(group, topic, "1-0") == 2 * SIZE


def live_brokers(broker: RunningBroker) -> set[int]:
    """The brokers `broker` names in METADATA: those it has seen registered."""
    with Connection(broker.endpoint) as connection:
        return {b.broker_id for b in connection.request(MetadataRequest(())).brokers}


def test_a_broker_down_leaves_its_partitions_unknown_and_a_reset_undone(
    three_brokers: list[RunningBroker], zookeeper: PrivateZooKeeper, registry_chroot: str
) -> None:
    down = Cluster(three_brokers, zookeeper.connect_string, registry_chroot)
    make_topic(down, "events", [2, 2, 2])
    with Registry(down.zookeeper, down.chroot) as registry:
        for name in ("1-0", "2-1", "3-2"):
            registry.groups.commit_offset("loaders", "events", name, SIZE)
        assert three_brokers[1].stop() == 0  # broker 2, holding partition 1
        # Down once the others have seen it go (their watch on /brokers/ids: milliseconds).
        others = (three_brokers[0], three_brokers[2])
        wait_until(lambda: all(2 not in live_brokers(b) for b in others), what="broker 2 gone")
        described = json_lines(run(down, "describe", "loaders", "--json"))
        assert [p["lag_bytes"] for p in described[:3]] == [SIZE, None, SIZE]
        assert described[1]["note"] == "broker 2 unavailable: not registered in ZooKeeper (down?)"
        assert described[3]["lag_bytes"] == 2 * SIZE
        refused = run(
            down, "reset", "loaders", "--topic", "events", "--to", "earliest", "--execute"
        )
        assert refused.exit_code == 1
        assert refused.stderr == (
            "pylogctl: partition 1 of events: broker 2 unavailable: not registered in ZooKeeper "
            "(down?): nothing was reset (every partition's broker must answer)\n"
        )
        assert registry.groups.committed_offset("loaders", "events", "1-0") == SIZE


def test_describe_counts_the_messages_around_damaged_data_and_says_where_it_is(
    three_brokers: list[RunningBroker], zookeeper: PrivateZooKeeper, registry_chroot: str
) -> None:
    first = Cluster(three_brokers, zookeeper.connect_string, registry_chroot)
    make_topic(first, "events", [5])  # partition 0, on broker 1
    assert three_brokers[0].stop() == 0
    (segment,) = three_brokers[0].data_dir.glob("logs/events-0/*.log")
    with open(segment, "r+b") as f:  # message 2's last byte: recovery keeps it as damaged
        f.seek(3 * SIZE - 1)
        byte = f.read(1)
        f.seek(3 * SIZE - 1)
        f.write(bytes([byte[0] ^ 0x01]))
    restarted = three_brokers[0].restarted()
    try:
        with Registry(first.zookeeper, first.chroot) as registry:
            registry.groups.commit_offset("loaders", "events", "1-0", SIZE)
        (partition, summary) = json_lines(run(first, "describe", "loaders", "--json"))
        assert (partition["lag_bytes"], partition["lag_messages"]) == (4 * SIZE, 3)
        assert partition["note"] == f"damaged offsets [{2 * SIZE}, {3 * SIZE}) are no messages"
        assert summary["lag_messages"] == 3
    finally:
        restarted.stop()


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_group_consume_ends_on_ctrl_c_or_sigterm_committing_what_it_printed(
    cluster: Cluster, registry: Registry, group: str, topic: str, signum: int
) -> None:
    """The signal only asks the member's loop to end (GroupConsumer.interrupt): raised from
    the handler, the exit could land inside a library that swallows it (kazoo's bare `except:`
    did, when members ran through ZooKeeper), and the member went on polling (2 to 3 runs in
    10)."""
    make_topic(cluster, topic, [4])
    process = subprocess.Popen(
        [
            str(Path(sys.executable).with_name("pylogctl")),
            *("group", "consume", group, topic, "--broker", cluster.endpoint),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        printed = [process.stdout.readline() for _ in range(4)]
        assert printed == [f"message-{i}\n" for i in range(4)]
        process.send_signal(signum)
        assert process.wait(15) == 0
        assert process.stderr is not None and process.stderr.read() == ""
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert registry.groups.committed_offset(group, topic, "1-0") == 4 * SIZE


def test_a_coordinated_group_is_listed_reset_through_its_coordinator_and_deleted(
    cluster: Cluster, group: str, topic: str
) -> None:
    """A group whose members joined through the coordinator (`broker=`): listed with them,
    its reset refused while one reads and then committed through the coordinator (which a
    member joining later is given, not what was behind it in ZooKeeper), then deleted."""
    make_topic(cluster, topic, [3])
    coordinated = GroupConsumer(cluster.endpoint, group, [topic], consumer_id="c1")
    try:
        wait_until(lambda: len(coordinated.poll(100)) > 0, what="c1 reads")
        coordinated.commit()
        listed = json_lines(run(cluster, "list", "--json"))
        assert {"group": group, "members": ["c1"], "topics": [topic]} in listed
        reset = ("reset", group, "--topic", topic, "--to", "earliest", "--execute")
        refused = run(cluster, *reset, "--broker", cluster.endpoint)
        assert refused.exit_code == 1 and "c1" in refused.stderr
    finally:
        coordinated.close()
    done = run(cluster, *reset, "--broker", cluster.endpoint)
    assert done.exit_code == 0, done.output
    with GroupCalls(cluster.endpoint, group) as calls:
        assert calls.committed([topic]) == {TopicPartition(topic, 0): 0}
    deleted = run(cluster, "delete", group)
    assert deleted.exit_code == 0, deleted.output
    assert group not in {row["group"] for row in json_lines(run(cluster, "list", "--json"))}
    with GroupCalls(cluster.endpoint, group) as calls:  # deleted behind it, it answered 0
        assert calls.committed([topic]) == {}


def test_a_coordinated_group_is_reset_and_deleted_through_the_brokers_its_zookeeper_names(
    cluster: Cluster, group: str, topic: str
) -> None:
    """Given --zookeeper and no --broker, the coordinator is reached through the brokers
    registered in that ZooKeeper, not through the default broker address (which may be
    another cluster's, or nobody's)."""
    make_topic(cluster, topic, [3])
    with GroupConsumer(cluster.endpoint, group, [topic], consumer_id="c1") as member:
        wait_until(lambda: len(member.poll(100)) > 0, what="c1 reads")
    env = {"PYLOG_ZOOKEEPER": cluster.zookeeper, "PYLOG_BROKER": "127.0.0.1:1"}
    args = ["group", "reset", group, "--topic", topic, "--to", "latest", "--execute"]
    reset = CliRunner().invoke(cli, [*args, "--chroot", cluster.chroot, "--timeout", "2"], env=env)
    assert reset.exit_code == 0, reset.output
    assert "1 partition of" in reset.stdout
    with GroupCalls(cluster.endpoint, group) as calls:
        assert calls.committed([topic]) == {TopicPartition(topic, 0): 3 * SIZE}
    delete = ["group", "delete", group, "--chroot", cluster.chroot, "--timeout", "2"]
    deleted = CliRunner().invoke(cli, delete, env=env)
    assert deleted.exit_code == 0, deleted.output
    with GroupCalls(cluster.endpoint, group) as calls:
        assert calls.committed([topic]) == {}


def test_consume_joins_through_the_coordinator_without_zookeeper_options(
    cluster: Cluster, group: str, topic: str
) -> None:
    """`group consume` joins through the group's coordinator, found through --broker (a member
    epoch, not the paper's state 3), and has no ZooKeeper options any more: it prints what it is
    given, and on SIGTERM commits what it printed and leaves."""
    make_topic(cluster, topic, [4])
    for option in ("--zookeeper", "--chroot", "--zookeeper-auth-file"):
        refused = CliRunner().invoke(
            cli, ["group", "consume", group, topic, option, "x", "--broker", cluster.endpoint]
        )
        assert refused.exit_code == 2, refused.output
        assert f"No such option '{option}'" in refused.stderr
    pylogctl = str(Path(sys.executable).with_name("pylogctl"))
    env = {k: v for k, v in os.environ.items() if k != "PYLOG_ZOOKEEPER"}
    consuming = subprocess.Popen(
        [pylogctl, "group", "consume", group, topic, "--broker", cluster.endpoint],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        with GroupCalls(cluster.endpoint, group) as calls:

            def joined() -> bool:
                try:
                    described = calls.describe()
                except BrokerError:
                    return False
                epochs = [m.member_epoch for m in described.members]
                return described.state == 1 and len(epochs) == 1 and epochs[0] > 0

            wait_until(joined, what="the member through the coordinator")
            wait_until(lambda: calls.committed([topic]) == {TopicPartition(topic, 0): 4 * SIZE})
    finally:
        consuming.send_signal(signal.SIGTERM)
        out, err = consuming.communicate(timeout=30)
    assert consuming.returncode == 0, err
    assert out.splitlines() == [f"message-{i}" for i in range(4)]
    with GroupCalls(cluster.endpoint, group) as calls:
        assert calls.describe().members == ()  # it left on exit
