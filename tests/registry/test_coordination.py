"""A group coordinator's registry calls against a real ZooKeeper (broker.registry.coordination):
the claim and its fencing, a step written as one transaction conditional on `state`, and a
group read back as the paper's members' readers see it (owners, offsets)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from broker.groups.assignors import TopicPartition
from broker.groups.group import Group, Heartbeat, Member, Rules
from broker.registry import ClaimedElsewhere, ClaimedGroup, Registry, partition_name
from broker.registry.groups import GroupNotEmpty
from broker.registry.session import BadVersion

EVENTS = {"events": range(2)}
NAME_BROKER = 7


def name(tp: TopicPartition) -> str:
    return partition_name(NAME_BROKER, tp.partition)


def claim(registry: Registry, group: str, broker_id: int) -> ClaimedGroup:
    claimed = registry.groups.claim_group(group, broker_id)
    assert claimed is not None  # created when missing
    return claimed


def test_a_claim_writes_the_epochs_and_a_step_the_nodes_readers_know(registry: Registry) -> None:
    claimed = claim(registry, "loaders", 1)
    assert (claimed.coordinator_epoch, claimed.group_epoch, claimed.state_version) == (1, 0, 0)
    assert claimed.members == {} and claimed.offsets == {} and claimed.paper_members == {}
    group = Group("loaders", Rules(), 0.0, partitions=EVENTS)
    reply, write = group.heartbeat(Heartbeat("m-1", 0, ("events",)), 0.0)
    version = registry.groups.write_group("loaders", claimed.state_version, 1, write, name)
    assert version == 1
    _, write = group.commit("m-1", reply.member_epoch, [(TopicPartition("events", 1), 70)])
    assert (
        registry.groups.write_group("loaders", version, 1, write, name) == version
    )  # no new epoch
    assert registry.groups.owners("loaders") == {"events": {"7-0": "m-1", "7-1": "m-1"}}
    assert registry.groups.committed_offsets("loaders") == {"events": {"7-1": 70}}
    again = claim(registry, "loaders", 1)  # the same broker, as after a restart
    assert (again.coordinator_epoch, again.group_epoch) == (2, 1)
    loaded = [Member.from_node(i, node) for i, node in again.members.items()]
    assert [m.node() for m in loaded] == [group.members["m-1"].node()]
    assert again.offsets == {"events": {"7-1": 70}}


def test_a_claim_is_fenced_by_the_live_holder_and_a_deposed_writer_by_the_state_version(
    make_registry: Callable[..., Registry],
) -> None:
    first, second = make_registry(), make_registry()
    claimed = claim(first, "loaders", 1)
    with pytest.raises(ClaimedElsewhere, match="claimed by broker 1") as refused:
        second.groups.claim_group("loaders", 2)
    assert refused.value.broker_id == 1
    first.groups.release_group("loaders")
    taken = claim(second, "loaders", 2)
    assert taken.coordinator_epoch == 2
    group = Group("loaders", Rules(), 0.0, partitions=EVENTS)
    _, write = group.heartbeat(Heartbeat("m-1", 0, ("events",)), 0.0)
    with pytest.raises(BadVersion):
        first.groups.write_group("loaders", claimed.state_version, 1, write, name)
    assert first.groups.owners("loaders") == {}
    second.groups.write_group("loaders", taken.state_version, 2, write, name)
    assert second.groups.owners("loaders") == {"events": {"7-0": "m-1", "7-1": "m-1"}}


def test_offsets_committed_by_the_papers_members_are_read_and_written_over(
    registry: Registry,
) -> None:
    registry.groups.commit_offset("loaders", "events", "7-0", 140)
    claimed = claim(registry, "loaders", 1)
    assert claimed.offsets == {"events": {"7-0": 140}}
    offsets = {TopicPartition("events", 0): 140}
    group = Group("loaders", Rules(), 0.0, offsets=offsets, partitions=EVENTS)
    _, write = group.commit("", -1, [(TopicPartition("events", 0), 150)])
    registry.groups.write_group("loaders", claimed.state_version, 1, write, name)
    assert registry.groups.committed_offset("loaders", "events", "7-0") == 150


def test_a_group_that_does_not_exist_is_not_created_by_a_reader(registry: Registry) -> None:
    """DESCRIBE_GROUP, OFFSET_FETCH and DELETE_GROUP claim with create False."""
    assert registry.groups.claim_group("nobody", 1, create=False) is None
    assert registry.groups.names() == []
    registry.groups.commit_offset("loaders", "events", "7-0", 1)  # a group of the paper's members
    claimed = registry.groups.claim_group("loaders", 1, create=False)
    assert claimed is not None and claimed.offsets == {"events": {"7-0": 1}}


def test_a_group_is_listed_and_deleted_whole(registry: Registry) -> None:
    claimed = claim(registry, "loaders", 1)
    group = Group("loaders", Rules(), 0.0, partitions=EVENTS)
    _, write = group.heartbeat(Heartbeat("m-1", 0, ("events",)), 0.0)
    version = registry.groups.write_group("loaders", claimed.state_version, 1, write, name)
    assert registry.groups.group_listings() == [("loaders", 1, ["m-1"], ["events"])]
    with pytest.raises(BadVersion):
        registry.groups.delete_coordinated_group("loaders", version - 1)
    registry.groups.delete_coordinated_group("loaders", version)
    assert registry.groups.names() == [] and registry.groups.group_listings() == []


def test_pylogctls_delete_waits_for_coordinated_members_then_takes_their_nodes(
    registry: Registry,
) -> None:
    """Registry.delete_group (pylogctl group delete) on a group of the coordinated protocol:
    refused while a member's node stands, and then deleted whole, the coordinator's nodes
    too (it left `state` and `members` behind as "has 0 members")."""
    claimed = claim(registry, "loaders", 1)
    group = Group("loaders", Rules(), 0.0, partitions=EVENTS)
    _, write = group.heartbeat(Heartbeat("m-1", 0, ("events",)), 0.0)
    version = registry.groups.write_group("loaders", claimed.state_version, 1, write, name)
    with pytest.raises(GroupNotEmpty, match="m-1"):
        registry.groups.delete_group("loaders")
    _, write = group.heartbeat(Heartbeat("m-1", -1, ("events",)), 1.0)
    registry.groups.write_group("loaders", version, 1, write, name)
    assert registry.groups.delete_group("loaders")
    assert registry.groups.names() == []
