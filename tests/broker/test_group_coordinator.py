"""The group coordinator of a real pylogd (broker.groups.service) through the group apis
(docs/protocol.md, "Consumer groups"), against the session's ZooKeeper: a member joins, is
given every partition, commits, is described and listed, leaves; the group is deleted. What
it writes in ZooKeeper is what the paper's readers read (owners, offsets)."""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable, Iterator

import pytest
from kazoo.client import KazooClient

from broker.client import Admin, Connection, GroupConsumer, Producer
from broker.client.coordinator import GroupCalls
from broker.client.framing import DEFAULT_CLIENT_ID
from broker.errors import (
    BrokerFencedMemberEpoch,
    BrokerGroupHasZooKeeperMembers,
    BrokerGroupNotEmpty,
    BrokerInvalidGroup,
    BrokerRegistryUnavailable,
    BrokerUnknownGroup,
    BrokerUnknownMemberId,
)
from broker.groups.assignors import TopicPartition
from broker.protocol import Ack, ErrorCode, GroupHeartbeatRequest, GroupPartitions, partition_list
from broker.registry import Registry
from broker.zookeeper import PrivateZooKeeper
from tests.conftest import wait_until
from tests.proxies import FreezableProxy
from tests.pylogd import RunningBroker


@pytest.fixture
def group() -> str:
    return f"loaders-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def calls(broker: RunningBroker, group: str) -> Iterator[GroupCalls]:
    with GroupCalls(broker.endpoint, group, timeout_s=10.0) as made:
        yield made


@pytest.fixture
def events(broker: RunningBroker, topic: str) -> str:
    with Admin(broker.endpoint) as admin:
        admin.create_topic(topic, 2)
    return topic


def heartbeat(
    group: str, topic: str, epoch: int, owned: tuple[GroupPartitions, ...] = (), member: str = "m-1"
) -> GroupHeartbeatRequest:
    return GroupHeartbeatRequest(group, member, epoch, "", 10_000, 300_000, "", (topic,), owned)


def test_a_member_joins_commits_and_leaves_and_the_group_is_deleted(
    broker: RunningBroker, zookeeper: PrivateZooKeeper, calls: GroupCalls, group: str, events: str
) -> None:
    joined = calls.heartbeat(heartbeat(group, events, 0))
    both = partition_list([(events, 0), (events, 1)])
    assert (joined.member_epoch, joined.heartbeat_interval_ms, joined.assignment) == (1, 1000, both)
    stayed = calls.heartbeat(heartbeat(group, events, 1, both))
    assert (stayed.member_epoch, stayed.assignment) == (1, both)
    outcome = calls.commit({TopicPartition(events, 0): 0, TopicPartition(events, 1): 0}, "m-1", 1)
    assert set(outcome.values()) == {ErrorCode.NONE}
    assert calls.committed([events]) == {TopicPartition(events, 0): 0, TopicPartition(events, 1): 0}
    described = calls.describe()
    assert (described.state, described.group_epoch, described.assignor) == (1, 1, "uniform")
    (member,) = described.members
    assert (member.member_id, member.member_epoch, member.assigned) == ("m-1", 1, both)
    assert (member.client_id, member.client_host) == (DEFAULT_CLIENT_ID, "127.0.0.1")
    listed = {g.group: g for g in calls.list_groups()}
    assert listed[group].members == ("m-1",) and listed[group].topics == (events,)
    with Registry(zookeeper.connect_string, broker.arguments[1]) as registry:
        owners = registry.groups.owners(group)[events]
        assert sorted(owners.values()) == ["m-1", "m-1"]
        assert set(registry.groups.committed_offsets(group)[events].values()) == {0}
    with pytest.raises(BrokerGroupNotEmpty, match="m-1"):
        calls.delete()
    left = calls.heartbeat(heartbeat(group, events, -1))
    assert (left.member_epoch, left.assignment) == (-1, ())
    with pytest.raises(BrokerUnknownMemberId):
        calls.heartbeat(heartbeat(group, events, 1, both))
    calls.delete()
    with pytest.raises(BrokerUnknownGroup):
        calls.describe()
    assert calls.committed() == {}


def test_a_zombies_heartbeat_and_commit_are_refused(
    calls: GroupCalls, group: str, events: str
) -> None:
    first = calls.heartbeat(heartbeat(group, events, 0))
    with pytest.raises(BrokerFencedMemberEpoch):
        calls.heartbeat(heartbeat(group, events, first.member_epoch + 3, first.assignment))
    calls.heartbeat(heartbeat(group, events, 0, member="m-2"))  # group epoch 2
    with pytest.raises(BrokerFencedMemberEpoch):
        calls.commit({TopicPartition(events, 0): 5}, "m-1", first.member_epoch + 1)
    assert calls.commit({TopicPartition(events, 5): 5}, "m-1", first.member_epoch) == {
        TopicPartition(events, 5): ErrorCode.PARTITION_NOT_ASSIGNED
    }


def test_bad_group_names_and_timeouts_are_refused_with_invalid_group(
    broker: RunningBroker, events: str
) -> None:
    with Connection(broker.endpoint) as connection:
        with pytest.raises(BrokerInvalidGroup, match=re.escape("group '../x'")):
            connection.request(heartbeat("../x", events, 0))
        short = GroupHeartbeatRequest("g", "m", 0, "", 1, 300_000, "", (events,), ())
        with pytest.raises(BrokerInvalidGroup, match="below the broker's"):
            connection.request(short)


def test_a_group_of_the_papers_members_is_described_and_not_joined(
    broker: RunningBroker, zookeeper: PrivateZooKeeper, calls: GroupCalls, group: str, events: str
) -> None:
    """While members of the paper's protocol are registered, the group is theirs: described
    (state 3) with its offsets, refused to a coordinated member until they are gone."""
    with Registry(zookeeper.connect_string, broker.arguments[1]) as registry:
        registry.groups.register_consumer(group, "paper-1", [events])
        registry.groups.commit_offset(group, events, f"{broker_id(registry, events)}-0", 35)
        described = calls.describe()
        assert (described.state, [m.member_id for m in described.members]) == (3, ["paper-1"])
        assert described.members[0].topics == (events,)
        assert calls.committed() == {TopicPartition(events, 0): 35}
        with (
            Connection(broker.endpoint) as connection,  # once: a GroupCalls retries it
            pytest.raises(BrokerGroupHasZooKeeperMembers, match="paper-1"),
        ):
            connection.request(heartbeat(group, events, 0))
        registry.groups.unregister_consumer(group, "paper-1")
        joined = calls.heartbeat(heartbeat(group, events, 0))
        assert joined.member_epoch == 1
        assert calls.committed() == {TopicPartition(events, 0): 35}


def broker_id(registry: Registry, topic: str) -> int:
    config = registry.topics.topic_config(topic)
    assert config is not None
    return config.brokers[0]


def test_a_silent_member_is_removed_at_its_session_and_the_other_takes_its_partitions(
    calls: GroupCalls, group: str, events: str
) -> None:
    def member(
        name: str, epoch: int, owned: tuple[GroupPartitions, ...] = ()
    ) -> GroupHeartbeatRequest:
        return GroupHeartbeatRequest(group, name, epoch, "", 2000, 300_000, "", (events,), owned)

    first = calls.heartbeat(member("m-1", 0))
    second = calls.heartbeat(member("m-2", 0))
    assert second.assignment == () and second.heartbeat_interval_ms == 100  # m-1 holds both
    # m-1 goes silent; m-2 beats on, and is given both partitions once m-1's session ended.
    wait_until(
        lambda: (
            calls.heartbeat(member("m-2", second.member_epoch)).assignment
            == partition_list([(events, 0), (events, 1)])
        ),
        timeout=10,
        what="m-1 removed and its partitions given to m-2",
    )
    with pytest.raises(BrokerUnknownMemberId):
        calls.commit({TopicPartition(events, 0): 1}, "m-1", first.member_epoch)


def test_partitions_added_while_a_member_reads_are_given_to_it(
    broker: RunningBroker, zookeeper: PrivateZooKeeper, calls: GroupCalls, group: str, events: str
) -> None:
    """pylogctl topic add-partitions: the coordinator sees the count in its topic view, moves
    the group epoch, and gives the new partitions at the next heartbeats."""
    joined = calls.heartbeat(heartbeat(group, events, 0))
    with Registry(zookeeper.connect_string, broker.arguments[1]) as registry:
        registry.topics.add_partitions(events, 4, {0: None})

    def given_all() -> bool:
        nonlocal joined
        joined = calls.heartbeat(heartbeat(group, events, joined.member_epoch, joined.assignment))
        return joined.assignment == partition_list((events, p) for p in range(4))

    wait_until(given_all, what="the new partitions given")
    assert calls.describe().group_epoch == 2  # the join, then the count


def test_an_unreadable_member_node_is_an_error_of_its_group_not_of_the_broker(
    broker: RunningBroker, zookeeper: PrivateZooKeeper, calls: GroupCalls, group: str, events: str
) -> None:
    """A member node the coordinator cannot read (written by hand, or by a later version):
    the group's requests are refused with REGISTRY_UNAVAILABLE naming it, and the broker
    serves everything else (the load ran on its loop: a KeyError there would stop it)."""
    raw = KazooClient(zookeeper.connect_string)
    raw.start(timeout=10)
    try:
        path = f"{broker.arguments[1]}/consumers/{group}/members/m-1"
        raw.create(path, b'{"version": 1, "topics": 7}', makepath=True)
    finally:
        raw.stop()
        raw.close()
    with (
        GroupCalls(broker.endpoint, group, timeout_s=1.0) as fresh,
        pytest.raises(BrokerRegistryUnavailable, match="m-1"),
    ):
        fresh.describe()
    with Admin(broker.endpoint) as admin:
        assert events in admin.list_topics()
    assert calls.heartbeat(heartbeat(f"{group}-other", events, 0)).member_epoch == 1


def test_an_upgraded_group_reads_on_from_what_its_old_members_committed(
    broker: RunningBroker, zookeeper: PrivateZooKeeper, group: str, events: str
) -> None:
    """docs/registry.md, "Upgrading from the paper's members": an old member still registered
    holds the group (a new member is handed nothing); once it is gone, the new member reads each
    partition on from the old members' commit, or from `reset` where they committed none."""
    with Producer(broker.endpoint, events, ack=Ack.FLUSHED) as producer:
        sent = [producer.send(b"m%d" % i, partition=0) for i in range(5)]
        offsets = [delivery.result(30) for delivery in sent]
        producer.send(b"other", partition=1).result(30)
    with Registry(zookeeper.connect_string, broker.arguments[1]) as registry:
        registry.groups.register_consumer(group, "old-1", [events])
        registry.groups.commit_offset(group, events, f"{broker_id(registry, events)}-0", offsets[2])
        with GroupConsumer(broker.endpoint, group, [events], max_wait_ms=50) as member:
            for _ in range(20):  # bounded: about a second, the old member registered throughout
                assert member.poll(50) == []
            registry.groups.unregister_consumer(group, "old-1")
            read: list[bytes] = []

            def all_read() -> bool:
                read.extend(record.value for record in member.poll(50))
                return len(read) >= 4

            wait_until(all_read, 30, "the new member reads on")
    assert sorted(read) == [b"m2", b"m3", b"m4", b"other"]


def test_a_group_reads_on_through_a_zookeeper_outage_and_commits_after_it(
    make_pylogd: Callable[..., RunningBroker],
    zookeeper: PrivateZooKeeper,
    group: str,
    topic: str,
) -> None:
    """The coordinator's broker cut off from ZooKeeper (its connection frozen, as a partition
    or a stalled server would) while a member reads: once ZooKeeper is back the member reads
    what came after, and its commit lands; no record is skipped, and one is read twice only
    if the member was told it lost its partitions (the broker's session may have expired)."""
    proxy = FreezableProxy(("127.0.0.1", zookeeper.port))
    lost: list[frozenset[object]] = []
    try:
        broker = make_pylogd(zookeeper=f"127.0.0.1:{proxy.port}")
        with Admin(broker.endpoint) as admin:
            admin.create_topic(topic, 2)

        def produce(prefix: str) -> list[bytes]:
            values = [f"{prefix}-{i}".encode() for i in range(10)]
            with Producer(broker.endpoint, topic, ack=Ack.FLUSHED) as producer:
                sent = [producer.send(v, partition=i % 2) for i, v in enumerate(values)]
                for delivery in sent:
                    delivery.result(30)
            return values

        before = produce("before")
        with GroupConsumer(
            broker.endpoint,
            group,
            [topic],
            session_timeout_s=6.0,
            auto_commit_interval_s=None,
            max_wait_ms=50,
            on_lost=lost.append,
        ) as member:
            read: list[bytes] = []

            def read_all(values: list[bytes]) -> Callable[[], bool]:
                def done() -> bool:
                    read.extend(r.value for r in member.poll(50))
                    return set(values) <= set(read)

                return done

            wait_until(read_all(before), 30, "the first records read")
            member.commit()
            proxy.freeze()
            wait_until(
                lambda: "lost its ZooKeeper connection" in broker.log_path.read_text(),
                10,
                "the broker to lose ZooKeeper",
            )
            for _ in range(10):  # bounded: about half a second cut off, reading on
                read.extend(r.value for r in member.poll(50))
            proxy.thaw()
            after = produce("after")
            wait_until(read_all(after), 60, "what came after the outage read")
            wait_until(lambda: member.connected, 30, "the member within its lease")
            member.commit()
            with GroupCalls(broker.endpoint, group) as calls:
                committed = calls.committed([topic])
            positions = member.positions().items()
            assert committed == {TopicPartition(tp.topic, tp.partition): o for tp, o in positions}
    finally:
        proxy.close()
    assert set(read) == set(before) | set(after)  # nothing skipped
    if not lost:
        assert len(read) == len(before) + len(after)  # nothing twice
