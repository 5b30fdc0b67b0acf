"""The group coordinator on three real brokers: a broker that does not coordinate a group
names the one that does (NOT_COORDINATOR), and a client follows it; the coordinator SIGKILLed,
another takes the group over from ZooKeeper with its members' epochs, partitions and offsets;
the first restarted takes it back."""

from __future__ import annotations

import uuid

import pytest

from broker.client import Admin, Connection
from broker.client.coordinator import GroupCalls
from broker.errors import BrokerNotCoordinator
from broker.groups.assignors import TopicPartition
from broker.groups.choice import coordinator_of
from broker.protocol import GroupHeartbeatReply, GroupHeartbeatRequest, partition_list
from tests.conftest import wait_until
from tests.pylogd import ThreeBrokers


def choice(group: str, brokers: tuple[int, ...]) -> int:
    chosen = coordinator_of(group, brokers)
    assert chosen is not None
    return chosen


def a_group_over(three: ThreeBrokers, topic: str, partitions: int) -> tuple[str, int]:
    """A new group's name and the broker that coordinates it, and `topic` created."""
    with Admin(three.brokers[1].endpoint) as admin:
        admin.create_topic(topic, partitions)
    group = f"g-{uuid.uuid4().hex[:8]}"
    return group, choice(group, (1, 2, 3))


def join(calls: GroupCalls, topic: str, member: str) -> GroupHeartbeatReply:
    request = GroupHeartbeatRequest(calls.group, member, 0, "", 10_000, 300_000, "", (topic,), ())
    return calls.heartbeat(request)


def beat(
    calls: GroupCalls, topic: str, member: str, reply: GroupHeartbeatReply
) -> GroupHeartbeatReply:
    request = GroupHeartbeatRequest(
        calls.group, member, reply.member_epoch, "", 10_000, 300_000, "", (topic,), reply.assignment
    )
    return calls.heartbeat(request)


def test_a_broker_names_the_groups_coordinator_and_the_client_follows(
    shared_three_brokers: ThreeBrokers, topic: str
) -> None:
    three = shared_three_brokers
    group, chosen = a_group_over(three, topic, 3)
    other = next(i for i in (1, 2, 3) if i != chosen)
    with Connection(three.endpoints[other]) as connection:
        request = GroupHeartbeatRequest(group, "m-1", 0, "", 10_000, 300_000, "", (topic,), ())
        with pytest.raises(BrokerNotCoordinator) as redirect:
            connection.request(request)
    assert redirect.value.coordinator == chosen
    assert f"tcp://{redirect.value.host}:{redirect.value.port}" == three.endpoints[chosen]
    with GroupCalls(three.endpoints[other], group) as calls:
        joined = join(calls, topic, "m-1")
        assert calls.coordinator == three.endpoints[chosen]
    assert joined.assignment == partition_list((topic, p) for p in range(3))


def test_a_killed_coordinators_groups_are_taken_over_and_handed_back(
    shared_three_brokers: ThreeBrokers, topic: str
) -> None:
    three = shared_three_brokers
    group, chosen = a_group_over(three, topic, 4)
    survivors = [i for i in (1, 2, 3) if i != chosen]
    bootstrap = ",".join(three.endpoints[i] for i in (1, 2, 3))
    with GroupCalls(bootstrap, group, timeout_s=3.0) as calls:
        one = join(calls, topic, "m-1")
        two = join(calls, topic, "m-2")
        for _ in range(3):  # m-1 gives up half, m-2 takes it
            one, two = beat(calls, topic, "m-1", one), beat(calls, topic, "m-2", two)
        assert len(partition_list(_pairs(one))[0].partitions) == 2
        offsets = {TopicPartition(topic, p): 10 * p for p in range(4)}
        mine = {tp: o for tp, o in offsets.items() if tp.partition in _numbers(one)}
        calls.commit(mine, "m-1", one.member_epoch)
        before = calls.describe()
        three.brokers[chosen].kill()
        taken = choice(group, tuple(survivors))

        def answered_by_the_new_coordinator() -> bool:
            nonlocal one
            one = beat(calls, topic, "m-1", one)
            return calls.coordinator == three.endpoints[taken]

        wait_until(answered_by_the_new_coordinator, timeout=30, what="a new coordinator")
        after = calls.describe()
        assert after.coordinator_epoch == before.coordinator_epoch + 1
        assert after.group_epoch == before.group_epoch
        assert {m.member_id: (m.member_epoch, m.assigned) for m in after.members} == {
            m.member_id: (m.member_epoch, m.assigned) for m in before.members
        }
        assert calls.committed([topic]) == mine
        three.restart(chosen)

        def handed_back() -> bool:
            nonlocal one
            one = beat(calls, topic, "m-1", one)
            return calls.coordinator == three.endpoints[chosen]

        wait_until(handed_back, timeout=30, what="the group handed back")
        assert calls.describe().coordinator_epoch == after.coordinator_epoch + 1
        assert calls.committed([topic]) == mine


def _pairs(reply: GroupHeartbeatReply) -> list[tuple[str, int]]:
    return [(t.topic, p) for t in reply.assignment for p in t.partitions]


def _numbers(reply: GroupHeartbeatReply) -> set[int]:
    return {p for _, p in _pairs(reply)}
