"""Replica placement (broker.placement.assign_replicas, docs/replication.md "Placement"): a pure
function, so examples and properties need no broker or ZooKeeper."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from broker.placement import assign_replicas, broker_order

# broker id -> rack (None: none), 1 to 12 brokers; racks from a few names
racks_maps = st.dictionaries(
    st.integers(0, 40), st.none() | st.sampled_from(["a", "b", "c", "d"]), min_size=1, max_size=12
)


@st.composite
def placements(draw: st.DrawFn) -> tuple[int, dict[int, str | None], int]:
    racks = draw(racks_maps)
    return draw(st.integers(0, 40)), racks, draw(st.integers(1, len(racks)))


def test_without_racks_brokers_go_by_id_and_replicas_are_neighbours() -> None:
    racks: dict[int, str | None] = {3: None, 1: None, 2: None}
    assert broker_order(racks) == [1, 2, 3]
    assert assign_replicas(4, racks, 2) == ((1, 2), (2, 3), (3, 1), (1, 2))
    assert assign_replicas(2, racks, 3) == ((1, 2, 3), (2, 3, 1))


def test_racks_alternate_and_each_partition_takes_a_new_rack_while_one_remains() -> None:
    racks: dict[int, str | None] = {1: "b", 2: "b", 3: "a", 4: "a", 5: "c"}
    # a's first, b's first, c's first, then a's second, b's second
    assert broker_order(racks) == [3, 1, 5, 4, 2]
    assert assign_replicas(5, racks, 3) == (
        (3, 1, 5),
        (1, 5, 4),
        (5, 4, 2),
        (4, 2, 5),  # 2 then 3: a taken; 1: b taken; 5: c, new
        (2, 3, 5),  # 3: a; 1: b taken; 5: c
    )
    # Two racks, replication factor 3: both racks first, then the next broker not chosen.
    two: dict[int, str | None] = {1: "x", 2: "x", 3: "y"}
    assert broker_order(two) == [1, 3, 2]
    assert assign_replicas(3, two, 3) == ((1, 3, 2), (3, 2, 1), (2, 3, 1))


def test_brokers_without_a_rack_count_as_one_rack_of_their_own_placed_last() -> None:
    racks: dict[int, str | None] = {1: None, 2: None, 3: "a", 4: "b"}
    assert broker_order(racks) == [3, 4, 1, 2]
    # 1 and 2 share the "no rack" rack: partition 2 takes 3 and 4 before 2
    assert assign_replicas(4, racks, 3) == ((3, 4, 1), (4, 1, 3), (1, 3, 4), (2, 3, 4))


@pytest.mark.parametrize(
    ("partitions", "racks", "factor", "message"),
    [
        (1, {}, 1, "no broker"),
        (1, {1: None}, 0, "replication factor 0 is not between 1 and the 1 broker"),
        (1, {1: None, 2: None}, 3, "replication factor 3 is not between 1 and the 2 broker"),
        (1, {1: None}, True, "replication factor True"),
        (-1, {1: None}, 1, "partitions must be an integer >= 0"),
        (1, {-1: None}, 1, "a broker id is an integer >= 0"),
        (1, {1: ""}, 1, "rack must be a non-empty string or None"),
    ],
)
def test_bad_inputs_are_clear_errors(
    partitions: int, racks: dict[int, str | None], factor: int, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        assign_replicas(partitions, racks, factor)


@given(placements())
def test_each_partition_has_its_replication_factor_of_distinct_live_brokers(
    case: tuple[int, dict[int, str | None], int],
) -> None:
    partitions, racks, factor = case
    assignment = assign_replicas(partitions, racks, factor)
    assert len(assignment) == partitions
    for replicas in assignment:
        assert len(replicas) == factor == len(set(replicas))
        assert set(replicas) <= set(racks)


@given(placements())
def test_leaders_go_round_robin_over_the_broker_order(
    case: tuple[int, dict[int, str | None], int],
) -> None:
    partitions, racks, factor = case
    order = broker_order(racks)
    assert sorted(order) == sorted(racks)
    leaders = [replicas[0] for replicas in assign_replicas(partitions, racks, factor)]
    assert leaders == [order[p % len(order)] for p in range(partitions)]
    counts = Counter(leaders)
    if partitions >= len(racks):  # every broker leads, evenly to within one
        assert max(counts.values()) - min(counts.values()) <= 1


@given(placements())
def test_each_partition_spans_as_many_racks_as_it_can(
    case: tuple[int, dict[int, str | None], int],
) -> None:
    partitions, racks, factor = case
    rack_count = len(set(racks.values()))
    for replicas in assign_replicas(partitions, racks, factor):
        assert len({racks[b] for b in replicas}) == min(factor, rack_count)


@given(placements())
def test_the_same_inputs_give_the_same_assignment_whatever_the_mapping_order(
    case: tuple[int, dict[int, str | None], int],
) -> None:
    partitions, racks, factor = case
    reversed_racks = dict(reversed(list(racks.items())))
    assert assign_replicas(partitions, racks, factor) == assign_replicas(
        partitions, reversed_racks, factor
    )


@given(st.integers(0, 40), st.sets(st.integers(0, 40), min_size=1, max_size=12))
def test_replication_factor_1_without_racks_is_the_round_robin_of_before(
    partitions: int, brokers: set[int]
) -> None:
    ids = sorted(brokers)  # TopicConfig.spread before replicas: partition p on ids[p mod n]
    before = tuple((ids[p % len(ids)],) for p in range(partitions))
    assert assign_replicas(partitions, dict.fromkeys(brokers), 1) == before
