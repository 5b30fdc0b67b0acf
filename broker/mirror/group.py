"""Mirror processes sharing the work (docs/mirror.md, "Several mirrors"): a group in the
target's registry, as consumer groups are (docs/registry.md, /consumers), with the paper's range
assignment (assign_range).

Each process registers as a member of the group (ephemeral /consumers/<group>/ids/<id>,
listing the topics it mirrors) and copies a partition only while it holds the partition's
ephemeral owner node. A member that dies loses its nodes with its ZooKeeper session; the
others see the group change and take its partitions over, each copy going on from the target's
log end. A member whose ZooKeeper connection is lost stops copying at once (kazoo notices it
well before the session can expire and others claim its partitions), so two processes never
copy one partition at the same time.

Sync (kazoo): the Mirror calls it from worker threads.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from broker.groups.assignors import contiguous_share
from broker.registry import partition_name
from broker.registry.coordination import GroupCoordination
from broker.registry.topics import TopicNodes


def assign_range(
    partitions: Sequence[tuple[int, int]], members: Sequence[str], me: str
) -> list[int]:
    """The paper's range assignment: `me`'s contiguous share of the `partitions` ((preferred
    broker, partition) pairs, sorted) among the sorted `members` (the first
    len(partitions) % len(members) members take one more); the partition numbers."""
    ordered = sorted(partitions)
    ranked = sorted(members)
    if me not in ranked:
        return []
    return [
        partition
        for _, partition in ordered[contiguous_share(len(ordered), len(ranked), ranked.index(me))]
    ]


class MirrorGroup:
    """Member `member` of mirror group `group` in the target's registry (its `groups` and
    `topics` stores)."""

    def __init__(
        self, groups: GroupCoordination, topics: TopicNodes, group: str, member: str
    ) -> None:
        self.groups = groups
        self.topics = topics
        self.group = group
        self.member = member
        self._topics: frozenset[str] | None = None
        self.claim_session: int | None = None
        """The ZooKeeper session the partitions owned were claimed in."""

    def join(self, topics: frozenset[str], on_change: Callable[[], None]) -> None:
        """Be a member mirroring `topics` (registered again when they change); `on_change` is
        called (from kazoo's thread) whenever a member joins or leaves."""
        if topics == self._topics:
            return
        first = self._topics is None
        self.groups.register_consumer(self.group, self.member, topics)
        self._topics = topics
        if first:
            self.groups.watch_members(self.group, lambda _members: on_change())

    def wanted(self, partitions: Mapping[str, int]) -> set[tuple[str, int]]:
        """This member's range of each topic's partitions (topic -> count) among the members
        mirroring it."""
        members = self.groups.consumers(self.group)
        wanted: set[tuple[str, int]] = set()
        for topic, count in partitions.items():
            brokers = self.topics.topic_config(topic).brokers
            named = [(brokers[p], p) for p in range(count)]
            mirroring = [member for member, topics in members.items() if topic in topics]
            wanted |= {(topic, p) for p in assign_range(named, mirroring, self.member)}
        return wanted

    def claim(self, topic: str, partition: int) -> str | None:
        """Own the partition (None), or the member that owns it now."""
        return self.groups.claim_partition(
            self.group, topic, self._name(topic, partition), self.member
        )

    def release(self, topic: str, partition: int) -> None:
        self.groups.release_partition(self.group, topic, self._name(topic, partition))

    def _name(self, topic: str, partition: int) -> str:
        brokers = self.topics.topic_config(topic).brokers
        return partition_name(brokers[partition], partition)

    def leave(self) -> None:
        if self._topics is not None:
            self.groups.unregister_consumer(self.group, self.member)
            self._topics = None
