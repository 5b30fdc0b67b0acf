"""What a group member records with its coordinator: the positions of the partitions its
FetchSession holds, committed at the member's epoch (OFFSET_COMMIT; a member the coordinator
has replaced is refused), read back (OFFSET_FETCH), and auto-commit's schedule
(broker.client.group's module text says which records count as processed)."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from broker.client.coordinator import GroupCalls
from broker.client.group_fetch import FetchSession
from broker.client.membership import Heartbeats
from broker.client.records import BrokerPartition
from broker.clock import Clock
from broker.errors import BrokerError, PartitionNotAssigned, Unavailable
from broker.groups.assignors import TopicPartition


class OffsetCommits:
    """The commits of member `consumer_id` of `group`, through `calls` (its coordinator), for
    the partitions `fetching` holds, at the epoch `heartbeats` last heard. With
    `auto_commit_interval_s` (None: off) `auto_commit` records the positions that moved every
    that many seconds of `clock`. Not safe to share between threads."""

    def __init__(
        self,
        calls: GroupCalls,
        fetching: FetchSession[Any],
        heartbeats: Heartbeats,
        *,
        consumer_id: str,
        auto_commit_interval_s: float | None,
        clock: Clock,
        log: logging.Logger,
    ) -> None:
        self.calls = calls
        self.fetching = fetching
        self.heartbeats = heartbeats
        self.group = calls.group
        self.consumer_id = consumer_id
        self.auto_commit_interval_s = auto_commit_interval_s
        self.clock = clock
        self.log = log
        self._next = clock.monotonic() + (auto_commit_interval_s or 0)

    def committed(self, partitions: Iterable[tuple[str, int]]) -> dict[tuple[str, int], int]:
        """The group's committed offsets of those of `partitions` (topic, partition) that have
        one, asked of the coordinator now (OFFSET_FETCH); owned by this member or not."""
        wanted = list(partitions)
        if not wanted:
            return {}
        committed = self.calls.committed(sorted({topic for topic, _ in wanted}))
        found = {key: committed.get(TopicPartition(*key)) for key in wanted}
        return {key: offset for key, offset in found.items() if offset is not None}

    def committed_of(self, partitions: Sequence[BrokerPartition]) -> dict[BrokerPartition, int]:
        """The group's committed offsets of those of `partitions` that have one."""
        found = self.committed((tp.topic, tp.partition) for tp in partitions)
        return {
            tp: found[tp.topic, tp.partition]
            for tp in partitions
            if (tp.topic, tp.partition) in found
        }

    def commit(self, offsets: Mapping[tuple[str, int], int]) -> None:
        """Record `offsets` ((topic, partition) -> the offset to read next), for those
        partitions alone; each becomes its partition's position. ValueError, nothing
        committed, for a partition this member does not own."""
        owned = self.fetching.by_number()
        strangers = sorted(f"{t}/{p}" for t, p in offsets if (t, p) not in owned)
        if strangers:
            raise ValueError(f"not assigned to this member: {', '.join(strangers)}")
        self._record({owned[key].tp: offset for key, offset in offsets.items()})
        for key, offset in offsets.items():
            owned[key].position = owned[key].committed = offset

    def commit_positions(self, partitions: Iterable[BrokerPartition] | None = None) -> None:
        """Record each owned partition's position (after its last processed record) where it
        moved since the last commit (of `partitions` only, when given)."""
        moved = [
            owned
            for tp, owned in self.fetching.owned.items()
            if owned.position != owned.committed and (partitions is None or tp in partitions)
        ]
        if not moved:
            return
        self._record({owned.tp: owned.position for owned in moved})
        for owned in moved:
            owned.committed = owned.position

    def due(self) -> bool:
        """Whether auto-commit's time has come."""
        return self.auto_commit_interval_s is not None and self.clock.monotonic() >= self._next

    def auto_commit(self) -> None:
        """commit_positions, when `due`; a failure is logged, and tried again next time."""
        if self.auto_commit_interval_s is None or not self.due():
            return
        self._next = self.clock.monotonic() + self.auto_commit_interval_s
        try:
            self.commit_positions()
        except (BrokerError, Unavailable) as error:  # tried again next time
            self.log.warning("group %s: auto-commit failed: %s", self.group, error)

    def close(self) -> None:
        self.calls.close()

    def _record(self, offsets: Mapping[BrokerPartition, int]) -> None:
        """Record `offsets` with the coordinator (OFFSET_COMMIT at the member's epoch):
        PartitionNotAssigned, nothing of it recorded, for a partition the group gave another
        member since."""
        with self.heartbeats.lock:
            epoch = self.heartbeats.membership.epoch
        by_key = {TopicPartition(tp.topic, tp.partition): o for tp, o in offsets.items()}
        outcome = self.calls.commit(by_key, self.consumer_id, epoch)
        refused = sorted(f"{tp.topic}/{tp.partition}" for tp, c in outcome.items() if c)
        if refused:
            raise PartitionNotAssigned(
                f"group {self.group}: {self.consumer_id}'s commit of {', '.join(refused)} "
                f"refused at epoch {epoch}: the group gave them to another member"
            )
