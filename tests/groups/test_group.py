"""One group's rules (broker/groups/group.py) on an injected clock: join, reconciliation
(revoke before give; a partition that stays never pauses), sessions and revocation deadlines,
epochs that fence zombies, static members, KIP-1251 commits, partitions added and topics
deleted, a load from the nodes written, and the registry writes a step costs."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.errors import (
    FencedMemberEpoch,
    GroupNotEmptyError,
    InvalidGroup,
    UnknownMemberId,
    UnreleasedInstanceId,
)
from broker.groups.assignors import TopicPartition
from broker.groups.group import (
    GIVE_LIMIT,
    LEAVE,
    LEAVE_STATIC,
    WAITING_INTERVAL_MS,
    Group,
    Heartbeat,
    HeartbeatReply,
    Member,
    Rules,
    State,
    Write,
)
from broker.protocol import ErrorCode

RULES = Rules()


def tps(topic: str, *numbers: int) -> frozenset[TopicPartition]:
    return frozenset(TopicPartition(topic, n) for n in numbers)


def events(count: int) -> Group:
    return Group("loaders", RULES, 0.0, partitions={"events": range(count)})


@dataclass
class Client:
    """A member as a client keeps it: the epoch of its last reply and what it owns. It gives
    up what it is asked to at once (having committed) and takes what it is given."""

    member_id: str
    topics: tuple[str, ...] = ("events",)
    instance_id: str = ""
    epoch: int = 0
    owned: frozenset[TopicPartition] = frozenset()
    replies: list[HeartbeatReply] = field(default_factory=list)

    def beat(self, group: Group, now: float, **changes: object) -> tuple[HeartbeatReply, Write]:
        request = Heartbeat(
            self.member_id,
            self.epoch,
            self.topics,
            self.owned,
            instance_id=self.instance_id,
            **changes,  # type: ignore[arg-type]
        )
        reply, write = group.heartbeat(request, now)
        self.epoch, self.owned = reply.member_epoch, reply.assignment
        self.replies.append(reply)
        return reply, write


def no_partition_owned_twice(clients: list[Client]) -> None:
    counted = Counter(tp for c in clients for tp in c.owned)
    assert all(n == 1 for n in counted.values()), counted


def settle(group: Group, clients: list[Client], now: float, rounds: int = 6) -> None:
    for _ in range(rounds):
        for client in clients:
            client.beat(group, now)
            no_partition_owned_twice(clients)


def test_the_first_member_joins_at_group_epoch_one_and_is_given_every_partition() -> None:
    group, m1 = events(2), Client("m-1")
    reply, write = m1.beat(group, 0.0)
    assert reply == HeartbeatReply(1, 1000, tps("events", 0, 1))
    assert write.group_epoch == 1
    assert write.owners == {tp: (None, "m-1") for tp in tps("events", 0, 1)}
    ((before, after),) = write.members.values()
    assert before is None and after is not None
    assert after["member_epoch"] == 1 and after["assigned"] == {"events": {"0": 1, "1": 1}}
    assert write.changes() == 4  # state, the member, two owners
    assert group.describe().state == State.STABLE


def test_a_partition_moves_only_after_its_owner_gave_it_up_and_one_that_stays_never_pauses() -> (
    None
):
    group, m1, m2 = events(4), Client("m-1"), Client("m-2")
    m1.beat(group, 0.0)
    kept_by_m1 = None
    reply, write = m2.beat(group, 0.0)
    # The joiner waits for partitions m-1 still owns: nothing given, asked back quickly.
    assert reply.assignment == frozenset() and reply.heartbeat_interval_ms == WAITING_INTERVAL_MS
    assert write.group_epoch == 2 and not write.owners
    # m-1 is asked to give two back: its reply leaves them out; nothing is written yet.
    reply, write = m1.beat(group, 0.5)
    assert len(reply.assignment) == 2 and reply.member_epoch == 1 and not write
    kept_by_m1 = reply.assignment
    assert group.describe().state == State.RECONCILING
    # m-2 is still given nothing: m-1 has not said it gave them up.
    assert m2.beat(group, 0.6)[0].assignment == frozenset()
    # m-1 reports them given up: released, its epoch moves to the assignment epoch.
    reply, write = m1.beat(group, 0.7)
    assert reply.assignment == kept_by_m1 and reply.member_epoch == 2
    assert all(after is None for _, after in write.owners.values()) and len(write.owners) == 2
    reply, write = m2.beat(group, 0.8)
    assert reply.assignment == tps("events", 0, 1, 2, 3) - kept_by_m1
    assert reply.member_epoch == 2
    assert all(m1_reply.assignment >= kept_by_m1 for m1_reply in m1.replies)
    assert group.describe().state == State.STABLE


def test_a_silent_member_is_removed_at_its_session_and_its_partitions_go_to_the_others() -> None:
    group, m1, m2 = events(4), Client("m-1"), Client("m-2")
    settle(group, [m1, m2], 0.0)
    assert len(m1.owned) == len(m2.owned) == 2
    assert group.next_expiry() == 10.0
    assert group.expire(9.9) == ([], Write())
    m1.beat(group, 9.0)  # m-1 lives on; m-2 says nothing from 0.0
    gone, write = group.expire(10.0)
    assert gone == ["m-2"] and write.group_epoch == 3
    assert {tp for tp, (_, after) in write.owners.items() if after is None} == m2.owned
    assert m1.beat(group, 10.1)[0].assignment == tps("events", 0, 1, 2, 3)
    with pytest.raises(UnknownMemberId):
        m2.beat(group, 10.2)


def test_a_member_that_keeps_what_it_is_asked_back_past_its_deadline_is_removed() -> None:
    group, m1, m2 = events(2), Client("m-1"), Client("m-2")
    m1.beat(group, 0.0, rebalance_timeout_ms=5000)
    m2.beat(group, 0.0)
    request = Heartbeat("m-1", m1.epoch, ("events",), m1.owned, rebalance_timeout_ms=5000)
    group.heartbeat(request, 1.0)  # asked back now; it keeps owning them in every heartbeat
    group.heartbeat(request, 4.0)
    assert group.next_expiry() == 6.0
    group.heartbeat(request, 5.9)
    assert group.expire(5.9)[0] == []
    assert group.expire(6.0)[0] == ["m-1"]
    assert m2.beat(group, 6.1)[0].assignment == tps("events", 0, 1)


def test_epochs_fence_a_zombie_and_forgive_a_lost_reply() -> None:
    group, m1, m2 = events(4), Client("m-1"), Client("m-2")
    settle(group, [m1, m2], 0.0)
    stale = Heartbeat("m-1", m1.epoch - 1, ("events",), m1.owned)
    # Its previous epoch, owning within its assignment: the reply that moved it was lost.
    assert group.heartbeat(stale, 1.0)[0].member_epoch == m1.epoch
    with pytest.raises(FencedMemberEpoch):
        group.heartbeat(Heartbeat("m-1", m1.epoch + 5, ("events",), m1.owned), 1.0)
    with pytest.raises(FencedMemberEpoch):  # owns what it was never given
        group.heartbeat(Heartbeat("m-1", m1.epoch, ("events",), m2.owned), 1.0)
    with pytest.raises(UnknownMemberId):
        group.heartbeat(Heartbeat("m-9", 3, ("events",)), 1.0)


def test_joining_again_under_the_same_member_id_replaces_the_earlier_incarnation() -> None:
    group, m1, m2 = events(4), Client("m-1"), Client("m-2")
    settle(group, [m1, m2], 0.0)
    again = Client("m-1")
    write = again.beat(group, 1.0)[1]
    before, after = write.members["m-1"]
    assert before is not None and after is not None  # the node is set, not created
    # Its target stays (sticky by member id): the new incarnation owns them at once, and their
    # owner nodes, naming the same member, need no write.
    assert {tp for tp, (b, a) in write.owners.items() if b == a == "m-1"} == m1.owned
    assert write.changes() == 2  # state and the member's node
    assert again.owned == m1.owned and again.epoch > m1.epoch


def test_a_static_member_leaving_for_a_moment_keeps_its_partitions_for_its_instance() -> None:
    group = events(4)
    m1, m2 = Client("m-1", instance_id="loader-a"), Client("m-2")
    settle(group, [m1, m2], 0.0)
    kept, epoch = m1.owned, group.group_epoch
    reply, write = group.heartbeat(Heartbeat("m-1", LEAVE_STATIC, ("events",)), 1.0)
    assert reply.member_epoch == LEAVE_STATIC and write.group_epoch is None and not write.owners
    with pytest.raises(FencedMemberEpoch):
        group.commit("m-1", m1.epoch, [(next(iter(kept)), 5)])
    # The same instance, a new process and member id: its place and partitions, no rebalance.
    back = Client("m-1b", instance_id="loader-a")
    reply, write = back.beat(group, 2.0)
    assert reply.assignment == kept and group.group_epoch == epoch
    assert not write.owners  # owner nodes name the instance: unchanged
    assert set(write.members) == {"m-1", "m-1b"}
    with pytest.raises(UnreleasedInstanceId):
        Client("m-2", instance_id="loader-a").beat(group, 2.0)
    assert set(group.members) == {"m-1b", "m-2"}  # m-2, refused, is still there
    # The instance's own member joining again (it was fenced) takes its place back.
    reply, write = Client("m-1b", instance_id="loader-a").beat(group, 3.0)
    assert reply.assignment == kept and group.group_epoch == epoch and not write.owners


def test_a_static_member_that_does_not_come_back_is_removed_at_its_session() -> None:
    group = events(2)
    m1 = Client("m-1", instance_id="loader-a")
    m1.beat(group, 0.0)
    group.heartbeat(Heartbeat("m-1", LEAVE_STATIC, ("events",)), 1.0)
    assert group.expire(10.9)[0] == []
    assert group.expire(11.0)[0] == ["m-1"]
    assert group.describe().state == State.EMPTY


def test_a_leave_frees_the_partitions_at_once() -> None:
    group, m1, m2 = events(4), Client("m-1"), Client("m-2")
    settle(group, [m1, m2], 0.0)
    reply, write = group.heartbeat(Heartbeat("m-2", LEAVE, ("events",)), 1.0)
    assert reply.member_epoch == LEAVE and write.members["m-2"][1] is None
    assert m1.beat(group, 1.1)[0].assignment == tps("events", 0, 1, 2, 3)


def test_commits_are_fenced_by_the_epoch_a_partition_was_given_at() -> None:
    """KIP-1251: a commit sent before a heartbeat moved the member's epoch still counts for a
    partition it still owns; one for a partition reassigned since is refused."""
    group, m1 = events(4), Client("m-1")
    m1.beat(group, 0.0)
    first_epoch = m1.epoch
    m2 = Client("m-2")
    settle(group, [m1, m2], 0.0)
    assert m1.epoch > first_epoch
    kept, moved = sorted(m1.owned), sorted(tps("events", 0, 1, 2, 3) - m1.owned)
    results, write = group.commit("m-1", first_epoch, [(kept[0], 10), (moved[0], 20)])
    assert results == [ErrorCode.NONE, ErrorCode.PARTITION_NOT_ASSIGNED]
    assert write.offsets == {kept[0]: (None, 10)}
    assert group.commit("m-1", m1.epoch, [(kept[0], 10)]) == (
        [ErrorCode.NONE],
        Write(),
    )  # unchanged
    with pytest.raises(FencedMemberEpoch):
        group.commit("m-1", m1.epoch + 1, [(kept[0], 11)])
    with pytest.raises(UnknownMemberId):
        group.commit("m-9", 1, [(kept[0], 11)])


def test_a_commit_without_a_member_waits_for_the_readers_to_go() -> None:
    group, m1 = events(2), Client("m-1")
    results, write = group.commit("", -1, [(TopicPartition("events", 0), 7)])
    assert results == [ErrorCode.NONE] and write.offsets == {TopicPartition("events", 0): (None, 7)}
    assert group.commit("", -1, [(TopicPartition("events", 5), 7)])[0] == [
        ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    ]
    m1.beat(group, 0.0)
    with pytest.raises(GroupNotEmptyError, match="m-1"):
        group.commit("", -1, [(TopicPartition("events", 0), 9)])
    assert group.offsets == {TopicPartition("events", 0): 7}


def test_partitions_added_go_out_at_the_next_heartbeats_and_a_deleted_topics_are_revoked() -> None:
    group, m1 = events(2), Client("m-1", topics=("events", "clicks"))
    m1.beat(group, 0.0)
    assert group.set_partitions("events", range(2)) == Write()
    write = group.set_partitions("events", range(4))
    assert write.group_epoch == 2
    assert m1.beat(group, 0.1)[0].assignment == tps("events", 0, 1, 2, 3)
    assert group.set_partitions("other", range(3)) == Write()  # nobody subscribes to it
    group.set_partitions("events", None)
    assert m1.beat(group, 0.2)[0].assignment == frozenset()  # asked back
    reply, write = m1.beat(group, 0.3)
    assert len(write.owners) == 4 and reply.member_epoch == group.group_epoch


def test_a_group_loaded_from_its_nodes_goes_on_where_it_was() -> None:
    group, m1, m2 = events(6), Client("m-1"), Client("m-2")
    settle(group, [m1, m2], 0.0)
    m2.beat(group, 0.0)
    group.commit("m-1", m1.epoch, [(next(iter(m1.owned)), 42)])
    nodes = {m.member_id: m.node() for m in group.members.values()}
    loaded = Group(
        "loaders",
        RULES,
        100.0,
        group_epoch=group.group_epoch,
        members=[Member.from_node(i, node) for i, node in nodes.items()],
        offsets=group.offsets,
        partitions={"events": range(6)},
    )
    assert {m.member_id: m.node() for m in loaded.members.values()} == nodes
    assert loaded.next_expiry() == 110.0  # a whole session from the load
    for client in (m1, m2):
        reply, write = client.beat(loaded, 100.1)
        assert reply.assignment == client.owned and not write
    assert loaded.describe().state == State.STABLE and loaded.offsets == group.offsets


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"session_timeout_ms": 1999}, "below the broker's group.min_session_timeout_ms"),
        ({"session_timeout_ms": 300_001}, "above the broker's group.max_session_timeout_ms"),
        ({"rebalance_timeout_ms": 0}, "rebalance_timeout_ms 0 is not within"),
        ({"assignor": "sticky"}, "assignor 'sticky' is not one of range, uniform"),
        ({"topics": ()}, "at least one topic"),
        ({"topics": ("a/b",)}, "topic 'a/b'"),
        ({"member_id": ".."}, "member id '..'"),
        ({"instance_id": "x y"}, "instance id 'x y'"),
        ({"owned": tps("events", 0)}, "owns nothing yet"),
    ],
)
def test_a_heartbeat_out_of_bounds_is_refused_and_changes_nothing(
    change: dict[str, object], message: str
) -> None:
    group = events(2)
    fields: dict[str, object] = {"member_id": "m-1", "member_epoch": 0, "topics": ("events",)}
    with pytest.raises(InvalidGroup, match=message):
        group.heartbeat(Heartbeat(**(fields | change)), 0.0)  # type: ignore[arg-type]
    assert group.group_epoch == 0 and group.members == {}


def test_a_step_gives_at_most_the_give_limit() -> None:
    group, m1 = events(GIVE_LIMIT + 500), Client("m-1")
    reply = m1.beat(group, 0.0)[0]
    assert len(reply.assignment) == GIVE_LIMIT
    assert reply.heartbeat_interval_ms == WAITING_INTERVAL_MS
    assert len(m1.beat(group, 0.1)[0].assignment) == GIVE_LIMIT + 500


def rebalance_cost(members: int, partitions: int) -> tuple[int, int]:
    """Registry changes of a join to `members` settled ones over `partitions`, until settled
    again, and the partitions moved."""
    group = events(partitions)
    clients = [Client(f"m-{i:02}") for i in range(members)]
    settle(group, clients, 0.0, rounds=3)
    before = {c.member_id: c.owned for c in clients}
    joiner = Client("m-zz")
    changes = joiner.beat(group, 1.0)[1].changes()
    for _ in range(3):
        for client in [*clients, joiner]:
            changes += client.beat(group, 1.0)[1].changes()
    moved = sum(len(before[c.member_id] - c.owned) for c in clients)
    assert moved == len(joiner.owned)
    return changes, moved


def test_registry_writes_of_a_rebalance_grow_with_the_partitions_moved_not_the_group() -> None:
    per_moved = []
    for members in (5, 10, 20):
        changes, moved = rebalance_cost(members, 900)
        # state once; per moved partition an owner deleted and created; the members changed.
        assert changes <= 1 + 2 * moved + 2 * (members + 1)
        per_moved.append(changes / moved)
    assert max(per_moved) <= 3
    changes, moved = rebalance_cost(20, 10)  # a join that moves nothing
    assert moved == 0 and changes <= 3


@dataclass
class Cluster:
    """Clients and a group, driven by Hypothesis."""

    group: Group
    clients: dict[str, Client] = field(default_factory=dict)
    now: float = 0.0


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(["join", "beat", "leave", "silent", "grow"]), st.integers(0, 5)),
        max_size=40,
    )
)
def test_no_partition_is_ever_owned_by_two_members_and_the_group_settles(
    steps: list[tuple[str, int]],
) -> None:
    """Any sequence of joins, heartbeats, leaves, silences past the session and partitions
    added: no two clients own a partition at once; once all beat a few rounds, every member
    owns its share and every partition is owned."""
    world = Cluster(events(8))
    partitions = 8
    for action, n in steps:
        name = f"m-{n}"
        client = world.clients.get(name)
        world.now += 0.5
        if action == "join" and client is None:
            world.clients[name] = client = Client(name)
            client.beat(world.group, world.now)
        elif action == "beat" and client is not None:
            client.beat(world.group, world.now)
        elif action == "leave" and client is not None:
            world.group.heartbeat(Heartbeat(name, LEAVE, ("events",)), world.now)
            del world.clients[name]
        elif action == "silent" and client is not None:
            # It stops (a SIGSTOP): removed at its session; the client learns it and lets go.
            world.now += 11
            for other in world.clients.values():
                if other is not client:
                    other.beat(world.group, world.now - 5)
            world.group.expire(world.now)
            del world.clients[name]
        elif action == "grow":
            partitions += n
            world.group.set_partitions("events", range(partitions))
        no_partition_owned_twice(list(world.clients.values()))
    clients = list(world.clients.values())
    settle(world.group, clients, world.now)
    if clients:
        assert world.group.describe().state == State.STABLE
        assert sum(len(c.owned) for c in clients) == partitions
        shares = [len(c.owned) for c in clients]
        assert max(shares) - min(shares) <= 1


def test_a_heartbeat_from_another_address_updates_the_member_and_the_same_writes_nothing() -> None:
    """DESCRIBE_GROUP shows the client id and address of a member's last heartbeat."""
    group = events(2)
    joined, _ = group.heartbeat(Heartbeat("m-1", 0, ("events",), client_host="10.0.0.7"), 0.0)
    owned = joined.assignment
    same = Heartbeat("m-1", 1, ("events",), owned, client_host="10.0.0.7")
    assert group.heartbeat(same, 1.0)[1] == Write()
    moved = Heartbeat("m-1", 1, ("events",), owned, client_id="loader", client_host="10.0.0.8")
    _, write = group.heartbeat(moved, 2.0)
    ((before, after),) = write.members.values()
    assert before is not None and after is not None
    assert (after["client_id"], after["client_host"]) == ("loader", "10.0.0.8")
    assert group.members["m-1"].client_host == "10.0.0.8"
