"""The group coordinator on three real brokers: a broker that does not coordinate a group
names the one that does (NOT_COORDINATOR), and a client follows it; the coordinator SIGKILLed,
another takes the group over from ZooKeeper with its members' epochs, partitions and offsets;
the first restarted takes it back."""

from __future__ import annotations

import signal
import sys
import time
import uuid
from collections.abc import Callable, Iterator

import pytest

from broker.client import Admin, Connection, GroupConsumer, Producer
from broker.client.coordinator import GroupCalls
from broker.errors import BrokerNotCoordinator, BrokerUnknownGroup
from broker.groups.assignors import TopicPartition
from broker.groups.choice import coordinator_of
from broker.protocol import Ack, GroupHeartbeatReply, GroupHeartbeatRequest, partition_list
from tests.cluster.conftest import PrintingMember, printing_members
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


class MemberProcess(PrintingMember):
    """tests/coordinated_member.py in a child process; the values it printed, as read."""

    def __init__(self, brokers: str, group: str, topic: str, member_id: str) -> None:
        module = "tests.coordinated_member"
        super().__init__(
            member_id, [sys.executable, "-m", module, brokers, group, topic, member_id]
        )


@pytest.fixture
def member_processes() -> Iterator[Callable[[str, str, str, str], MemberProcess]]:
    with printing_members(MemberProcess) as start:
        yield start


def produce(brokers: str, topic: str, values: list[str], partitions: int) -> None:
    with Producer(brokers, topic, ack=Ack.ALL) as producer:
        sent = [producer.send(v.encode(), partition=i % partitions) for i, v in enumerate(values)]
        for delivery in sent:
            delivery.result(30)


def owners(calls: GroupCalls) -> dict[str, int]:
    """Member -> how many partitions it owns, by DESCRIBE_GROUP ({} before the group is)."""
    try:
        described = calls.describe()
    except BrokerUnknownGroup:
        return {}
    return {m.member_id: sum(len(t.partitions) for t in m.assigned) for m in described.members}


def test_a_killed_members_partitions_are_read_on_by_the_other_from_its_commits(
    shared_three_brokers: ThreeBrokers,
    topic: str,
    member_processes: Callable[[str, str, str, str], MemberProcess],
) -> None:
    three = shared_three_brokers
    group, _ = a_group_over(three, topic, 4)
    bootstrap = ",".join(three.endpoints.values())
    first = [f"first-{i}" for i in range(40)]
    produce(bootstrap, topic, first, 4)
    a = member_processes(bootstrap, group, topic, "a")
    b = member_processes(bootstrap, group, topic, "b")
    with GroupCalls(bootstrap, group) as calls:
        wait_until(lambda: owners(calls) == {"a": 2, "b": 2}, 30, "a and b own two each")
        wait_until(lambda: set(a.values) | set(b.values) >= set(first), 30, "the first read")
        a.stop(signal.SIGKILL)
        killed_at = time.monotonic()
        wait_until(lambda: owners(calls) == {"b": 4}, 30, "b owns all four")
        taken_over_s = time.monotonic() - killed_at
    later = [f"later-{i}" for i in range(40)]
    produce(bootstrap, topic, later, 4)
    wait_until(lambda: set(b.values) >= set(later), 30, "b reads what came after the kill")
    assert set(a.values) | set(b.values) == set(first) | set(later)  # no gap
    assert taken_over_s < 2.0 + 2.0  # the session, and a heartbeat's interval or so


@pytest.mark.slow  # ~30 s: two member processes read on while the coordinator's broker dies
def test_members_read_on_while_their_coordinator_is_killed_and_keep_their_partitions(
    shared_three_brokers: ThreeBrokers,
    topic: str,
    member_processes: Callable[[str, str, str, str], MemberProcess],
) -> None:
    three = shared_three_brokers
    with Admin(three.brokers[1].endpoint) as admin:
        admin.create_topic(topic, 4, {"replication_factor": "3"})
    group = f"g-{uuid.uuid4().hex[:8]}"
    chosen = choice(group, (1, 2, 3))
    bootstrap = ",".join(three.endpoints.values())
    a = member_processes(bootstrap, group, topic, "a")
    b = member_processes(bootstrap, group, topic, "b")
    with GroupCalls(bootstrap, group, timeout_s=3.0) as calls:
        wait_until(lambda: owners(calls) == {"a": 2, "b": 2}, 30, "a and b own two each")
        before = {m.member_id: (m.member_epoch, m.assigned) for m in calls.describe().members}
        three.brokers[chosen].kill()
        after_kill = [f"after-{i}" for i in range(40)]
        produce(bootstrap, topic, after_kill, 4)
        wait_until(
            lambda: set(a.values) | set(b.values) >= set(after_kill), 60, "all read after the kill"
        )
        after = {m.member_id: (m.member_epoch, m.assigned) for m in calls.describe().members}
    three.restart(chosen)
    assert after == before  # taken over with the members' epochs and partitions


def test_a_member_stopped_past_its_session_hands_out_nothing_another_read_and_joins_again(
    shared_three_brokers: ThreeBrokers,
    topic: str,
    member_processes: Callable[[str, str, str, str], MemberProcess],
) -> None:
    """SIGSTOP past the session: the other member is given its partitions; on SIGCONT its
    lease has run out, so what it had fetched is not handed out; told it is unknown, it drops
    its partitions and joins again, and the two share the partitions once more."""
    three = shared_three_brokers
    group, _ = a_group_over(three, topic, 4)
    bootstrap = ",".join(three.endpoints.values())
    a = member_processes(bootstrap, group, topic, "a")
    b = member_processes(bootstrap, group, topic, "b")
    with GroupCalls(bootstrap, group) as calls:
        wait_until(lambda: owners(calls) == {"a": 2, "b": 2}, 30, "a and b own two each")
        a.process.send_signal(signal.SIGSTOP)
        try:
            wait_until(lambda: owners(calls) == {"b": 4}, 30, "b owns all four")
            while_stopped = [f"while-stopped-{i}" for i in range(40)]
            produce(bootstrap, topic, while_stopped, 4)
            wait_until(lambda: set(b.values) >= set(while_stopped), 30, "b reads them all")
        finally:
            a.process.send_signal(signal.SIGCONT)
        wait_until(lambda: owners(calls) == {"a": 2, "b": 2}, 30, "a joined again")
    assert not set(a.values) & set(while_stopped)  # a read none of what b read meanwhile


def test_a_member_reads_the_partitions_led_now_while_a_dead_brokers_wait_for_it(
    shared_three_brokers: ThreeBrokers, topic: str
) -> None:
    """A topic at factor 1 over three brokers, one killed: the coordinator gives a member all six
    partitions, two of them without a leader. The member reads the four led now at once (it
    read none: each poll's start of its partitions failed on the two, for ever), and the two
    once their broker is back."""
    three = shared_three_brokers
    group, coordinator = a_group_over(three, topic, 6)
    bootstrap = ",".join(three.endpoints.values())
    values = [f"v{i}" for i in range(60)]
    produce(bootstrap, topic, values, 6)
    down = next(b for b in (3, 2, 1) if b != coordinator)
    on_down = {
        p for p, b in enumerate(three.registry.topics.topic_config(topic).brokers) if b == down
    }
    assert len(on_down) == 2
    three.brokers[down].kill()
    live = ",".join(e for b, e in three.endpoints.items() if b != down)
    seen: set[str] = set()
    try:
        with GroupConsumer(live, group, [topic], session_timeout_s=2.0, max_wait_ms=100) as member:
            led_now = {v for i, v in enumerate(values) if i % 6 not in on_down}

            def read(expected: set[str]) -> Callable[[], bool]:
                def done() -> bool:
                    seen.update(r.value.decode() for r in member.poll(100))
                    return seen >= expected

                return done

            wait_until(read(led_now), 30, "the partitions led now read")
            assert len(member.assignment) == 4  # the two others wait for their leader
            three.restart(down)
            wait_until(read(set(values)), 60, "the dead broker's partitions read once it is back")
            assert len(member.assignment) == 6
    finally:
        three.heal()
