"""The group coordinator's assignors (broker/groups/assignors.py) under Hypothesis: each
partition of a subscribed topic to exactly one subscriber, balance, a join or a leave moving
the minimum under `uniform`, and `range` equal to the paper's range assignment."""

from __future__ import annotations

from collections import Counter

from hypothesis import given
from hypothesis import strategies as st

from broker.groups.assignors import (
    ASSIGNORS,
    Subscriber,
    Target,
    TopicPartition,
    range_assignment,
    uniform,
)
from broker.mirror.group import assign_range

TOPICS = ("a", "b", "c")

member_ids = st.lists(st.text("mnop", min_size=1, max_size=4), min_size=1, max_size=8, unique=True)
counts = st.fixed_dictionaries({t: st.integers(0, 40) for t in TOPICS})


def same_subscription(
    members: list[str], topics: tuple[str, ...] = TOPICS
) -> dict[str, Subscriber]:
    return {m: Subscriber(frozenset(topics), m) for m in members}


def numbered(partition_counts: dict[str, int]) -> dict[str, list[int]]:
    return {t: list(range(n)) for t, n in partition_counts.items()}


def check_complete(
    target: Target, subs: dict[str, Subscriber], parts: dict[str, list[int]]
) -> None:
    """Every partition of a subscribed topic once, to a member subscribing to it; nothing else."""
    given_out = Counter(tp for tps in target.values() for tp in tps)
    assert set(target) == set(subs)
    expected = {
        TopicPartition(t, p)
        for t, numbers in parts.items()
        if any(t in s.topics for s in subs.values())
        for p in numbers
    }
    assert set(given_out) == expected
    assert all(n == 1 for n in given_out.values())
    for member, tps in target.items():
        assert all(tp.topic in subs[member].topics for tp in tps)


def per_topic(target: Target, topic: str) -> list[int]:
    return [sum(tp.topic == topic for tp in tps) for tps in target.values()]


@given(member_ids, counts, st.sampled_from(sorted(ASSIGNORS)))
def test_every_partition_goes_to_exactly_one_member_balanced_per_topic(
    members: list[str], partition_counts: dict[str, int], name: str
) -> None:
    subs, parts = same_subscription(members), numbered(partition_counts)
    target = ASSIGNORS[name](subs, parts, {})
    check_complete(target, subs, parts)
    for topic in TOPICS:
        shares = per_topic(target, topic)
        assert max(shares) - min(shares) <= 1


@given(member_ids, counts)
def test_uniform_balances_the_whole_group_with_one_subscription(
    members: list[str], partition_counts: dict[str, int]
) -> None:
    """The extra partitions of each topic go to the members with fewest so far: the totals
    differ by at most one too (range gives every topic's extra to the same first members)."""
    target = uniform(same_subscription(members), numbered(partition_counts), {})
    totals = [len(tps) for tps in target.values()]
    assert max(totals) - min(totals) <= 1


@given(
    st.lists(
        st.tuples(st.text("mnop", min_size=1, max_size=4), st.sets(st.sampled_from(TOPICS))),
        min_size=1,
        max_size=8,
        unique_by=lambda m: m[0],
    ),
    counts,
    st.sampled_from(sorted(ASSIGNORS)),
)
def test_members_get_only_topics_they_subscribe_to(
    members: list[tuple[str, set[str]]], partition_counts: dict[str, int], name: str
) -> None:
    subs = {m: Subscriber(frozenset(topics), m) for m, topics in members}
    parts = numbered(partition_counts)
    check_complete(ASSIGNORS[name](subs, parts, {}), subs, parts)


@given(member_ids, counts)
def test_uniform_is_stable(members: list[str], partition_counts: dict[str, int]) -> None:
    """Computed again from its own output, nothing moves."""
    subs, parts = same_subscription(members), numbered(partition_counts)
    target = uniform(subs, parts, {})
    assert uniform(subs, parts, target) == target


@given(member_ids, st.integers(0, 200), st.text("mnopq", min_size=5, max_size=5))
def test_a_join_under_uniform_moves_only_what_the_joiner_is_given(
    members: list[str], partitions: int, joiner: str
) -> None:
    """Each member keeps a subset of what it had: nothing moves between the old members, and
    the partitions that move are exactly the joiner's (its share, floor or ceiling)."""
    subs, parts = same_subscription(members, ("a",)), {"a": list(range(partitions))}
    before = uniform(subs, parts, {})
    after = uniform(subs | same_subscription([joiner], ("a",)), parts, before)
    assert all(after[m] <= before[m] for m in members)
    assert len(after[joiner]) in (
        partitions // (len(members) + 1),
        -(-partitions // (len(members) + 1)),
    )


@given(member_ids.filter(lambda m: len(m) > 1), st.integers(0, 200), st.data())
def test_a_leave_under_uniform_moves_only_the_leavers_partitions(
    members: list[str], partitions: int, data: st.DataObject
) -> None:
    leaver = data.draw(st.sampled_from(members))
    subs, parts = same_subscription(members, ("a",)), {"a": list(range(partitions))}
    before = uniform(subs, parts, {})
    stay = {m: s for m, s in subs.items() if m != leaver}
    after = uniform(stay, parts, before)
    assert all(after[m] >= before[m] for m in stay)


def test_an_eleventh_member_over_900_partitions_moves_81() -> None:
    """The design's figure: the minimum, 900 // 11."""
    ten = [f"m{i:02}" for i in range(10)]
    parts = {"t": list(range(900))}
    before = uniform(same_subscription(ten, ("t",)), parts, {})
    after = uniform(same_subscription([*ten, "m10"], ("t",)), parts, before)
    moved = sum(len(before[m] - after[m]) for m in ten)
    assert moved == len(after["m10"]) == 81


@given(member_ids, st.lists(st.integers(0, 3), max_size=30), st.sampled_from(TOPICS))
def test_range_equals_the_papers_range_assignment(
    members: list[str], name_brokers: list[int], topic: str
) -> None:
    """Partitions in the paper's order (name broker, then number), members by member id: each
    member's share is what the paper's `assign_range` (the mirror's) computes for it."""
    paper = [(b, p) for p, b in enumerate(name_brokers)]
    order = [p for _, p in sorted(paper)]
    target = range_assignment(same_subscription(members, (topic,)), {topic: order}, {})
    for member in members:
        theirs = {TopicPartition(topic, p) for p in assign_range(paper, members, member)}
        assert target[member] == theirs


def test_range_ranks_members_by_instance_id_where_they_have_one() -> None:
    subs = {
        "z-member": Subscriber(frozenset("t"), "a-instance"),
        "a-member": Subscriber(frozenset("t"), "b"),
    }
    target = range_assignment(subs, {"t": [0, 1, 2, 3]}, {})
    assert target["z-member"] == {TopicPartition("t", 0), TopicPartition("t", 1)}
