"""A consumer group's lag, and where its offsets can be moved: the reading behind `pylogctl
group describe`, `pylogctl group reset` and the console's groups (cli/web).

A group's state is in ZooKeeper (members, owners, committed offsets: docs/registry.md); the
partitions' offsets and messages come from each partition's leader (METADATA, asked of the
brokers registered; the preferred leader when none answers), reached at the endpoints they
register, and are read as broker.client.lag reads them.

Every offset a reset lands on is a message boundary: the log start, the high watermark, the
first message at or after a time (OFFSETS), the start of the message around a given byte
position (`message_bounds`), or a number of messages before or after the committed offset,
counted by reading them.

Not safe to share between threads.
"""

from __future__ import annotations

import datetime
import time
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Final, Literal

from broker.client.cluster import Cluster
from broker.client.connection import Connection
from broker.client.consumer import timestamp_ms
from broker.client.framing import Retry
from broker.client.lag import (
    COUNT_BYTES,
    GroupLag,
    HolderUnavailable,
    PartitionLag,
    backlog,
    lag_figures,
    log_range,
    message_bounds,
    messages,
)
from broker.client.retention import ahead_of
from broker.errors import BrokerError, Unavailable
from broker.protocol import OffsetsRequest
from broker.registry import partition_name
from broker.registry.brokers import Brokers
from broker.registry.coordination import GroupCoordination
from broker.registry.topics import TopicNodes

SCAN_BACK_BYTES: Final = 64 << 10
"""The first window read back from an offset to find the messages before it (then x4)."""

Target = Literal["earliest", "latest"] | int | datetime.datetime | tuple[Literal["shift-by"], int]
"""Where `plan_reset` moves offsets: the log start, the high watermark, a byte offset (moved to
the start of the message around it), the first message at or after a time, or a number of
messages from the committed offset (negative: back)."""


class GroupReader:
    """Reads groups from the registry's `groups` store (their topics' configurations from
    `topics`) and partitions from the brokers registered in `brokers`, through `cluster`."""

    def __init__(
        self,
        groups: GroupCoordination,
        topics: TopicNodes,
        brokers: Brokers,
        cluster: Cluster,
        retries: int = 3,
    ) -> None:
        self.groups = groups
        self.topic_nodes = topics
        self.brokers = brokers
        self.cluster = cluster
        self.retries = retries

    def topics(self, group: str) -> list[str]:
        """The group's topics: those it has committed offsets or owners for, or members
        consuming (empty when there is no such group)."""
        found = {
            *self.groups.committed_offsets(group),
            *self.groups.owners(group),
        }
        for subscribed in self.groups.group_members(group).values():
            found.update(subscribed)
        return sorted(found)

    def describe(
        self, group: str, topics: Iterable[str] = (), count_bytes: int = COUNT_BYTES
    ) -> GroupLag:
        """The lag of each partition of `topics` (default: the group's topics)."""
        members = self.groups.group_members(group)
        committed = self.groups.committed_offsets(group)
        owners = self.groups.owners(group)
        names = sorted(set(topics)) or self.topics(group)
        lag = GroupLag(group, members, names)
        configs = self.topic_nodes.topic_configs()
        self._refresh_endpoints()
        now_ms = time.time() * 1000
        for topic in names:
            config = configs.get(topic)
            if config is None:
                for name, offset in sorted(committed.get(topic, {}).items()):
                    broker_id, _, partition = name.partition("-")
                    lag.partitions.append(
                        PartitionLag(
                            topic,
                            int(partition),
                            int(broker_id),
                            None,
                            offset,
                            note="topic deleted",
                        )
                    )
                continue
            for number, holder in enumerate(config.brokers):
                name = partition_name(holder, number)
                lag.partitions.append(
                    self._partition_lag(
                        PartitionLag(
                            topic,
                            number,
                            holder,
                            owners.get(topic, {}).get(name),
                            committed.get(topic, {}).get(name),
                        ),
                        count_bytes,
                        now_ms,
                    )
                )
        return lag

    def _partition_lag(self, lag: PartitionLag, count_bytes: int, now_ms: float) -> PartitionLag:
        try:
            connection, (start, end) = self._leader_range(lag.topic, lag.partition, lag.broker)
        except (BrokerError, Unavailable) as error:
            return replace(lag, note=f"broker {lag.broker} unavailable: {error}")
        offsets = replace(lag, log_start=start, high_watermark=end)
        if lag.committed is None:
            return replace(offsets, note="no committed offset")
        if lag.committed > end:
            return replace(offsets, note=f"committed offset past the high watermark {end}")
        position, note = lag.committed, None
        if position < start:
            position, note = start, f"committed offset before the log start {start} (deleted)"
        try:
            found = backlog(
                connection, lag.topic, lag.partition, position, end, count_bytes, self.retries
            )
        except (BrokerError, Unavailable) as error:
            return replace(offsets, lag_bytes=end - position, note=f"cannot count: {error}")
        notes = [note] if note else []
        notes += [f"damaged offsets [{a}, {b}) are no messages" for a, b in found.damaged]
        ahead = ahead_of(connection, lag.topic, lag.partition, lag.committed, now_ms, self.retries)
        figures = lag_figures(found, ahead, position, end, now_ms)
        return replace(offsets, **figures, note="; ".join(notes) or None)

    def _refresh_endpoints(self) -> None:
        brokers = self.brokers.read()
        self.cluster.endpoints = {b: f"tcp://{i.host}:{i.port}" for b, i in brokers.items()}
        self.cluster.leaders.clear()  # asked again: leadership may have moved since

    def _connection(self, broker: int) -> Connection:
        endpoint = self.cluster.endpoints.get(broker)
        if endpoint is None:
            raise Unavailable("not registered in ZooKeeper (down?)")
        return self.cluster.connect(endpoint)

    def _leader(self, topic: str, partition: int, holder: int) -> Connection:
        """The connection to the partition's leader (METADATA version 2, asked of the brokers
        registered; Cluster.leader_connection), or to `holder`, its preferred leader, when
        no broker says."""
        try:
            return self.cluster.leader_connection(topic, partition)
        except (BrokerError, Unavailable):
            return self._connection(holder)

    def _leader_range(
        self, topic: str, partition: int, holder: int
    ) -> tuple[Connection, tuple[int, int]]:
        """The partition's leader and its `log_range`, asked again after a retriable error
        (NOT_LEADER_FOR_PARTITION: the broker asked had not heard of a move yet, or has) of the
        leader found then (Cluster.learn_from), up to `retries` more times, 0.1 s doubling
        apart (Retry); raises the last error."""
        clock = self.cluster.clock
        retry = Retry(self.retries, 3 * self.cluster.timeout_s, clock, refusals_within_time=True)
        while True:
            try:
                connection = self._leader(topic, partition, holder)
                return connection, log_range(connection, topic, partition, 0)
            except (BrokerError, Unavailable) as error:
                wait_s = retry.wait_after(error)
                self.cluster.learn_from(topic, partition, error)
            clock.sleep(wait_s)

    # -- resets ------------------------------------------------------------------------------

    def plan_reset(
        self, group: str, topic: str, target: Target, partitions: Iterable[int] = ()
    ) -> list[ResetStep]:
        """Where `target` moves the group's committed offset of each partition of `topic`
        (or of `partitions`), reading only. UnknownTopicOrPartition for a topic that does not
        exist; BrokerError or HolderUnavailable when a holder cannot say (nothing is
        planned)."""
        config = self.topic_nodes.topic_config(topic)
        wanted = set(partitions)
        unknown = wanted - set(range(config.partitions))
        if unknown:
            raise ValueError(
                f"topic {topic} has partitions 0 to {config.partitions - 1}, "
                f"not {', '.join(map(str, sorted(unknown)))}"
            )
        committed = self.groups.committed_offsets(group).get(topic, {})
        self._refresh_endpoints()
        steps = []
        for number, holder in enumerate(config.brokers):
            if wanted and number not in wanted:
                continue
            name = partition_name(holder, number)
            try:
                steps.append(self._step(topic, number, holder, name, committed.get(name), target))
            except Unavailable as error:
                raise HolderUnavailable(
                    f"partition {number} of {topic}: broker {holder} unavailable: {error}"
                ) from error
        return steps

    def apply_reset(self, group: str, steps: Iterable[ResetStep]) -> None:
        """Write each step's `after` as the group's committed offset."""
        for step in steps:
            if step.after is not None:
                self.groups.commit_offset(group, step.topic, step.name, step.after)

    def _step(
        self, topic: str, number: int, holder: int, name: str, before: int | None, target: Target
    ) -> ResetStep:
        step = ResetStep(topic, number, name, before, None)
        if isinstance(target, tuple) and before is None:
            return replace(step, note="no committed offset to shift")
        connection, (start, end) = self._leader_range(topic, number, holder)
        if target == "earliest":
            return replace(step, after=start)
        if target == "latest":
            return replace(step, after=end)
        if isinstance(target, datetime.datetime):
            request = OffsetsRequest(topic, number, timestamp_ms(target))
            return replace(step, after=connection.call(request, self.retries).offset)
        if isinstance(target, int):
            return self._to_offset(step, connection, target, start, end)
        assert before is not None
        return self._shift(step, connection, before, target[1], start, end)

    def _to_offset(
        self, step: ResetStep, connection: Connection, offset: int, start: int, end: int
    ) -> ResetStep:
        if offset < start:
            return replace(step, after=start, note=f"before the log start {start}: moved there")
        if offset > end:
            return replace(step, after=end, note=f"past the high watermark {end}: moved there")
        around, _ = message_bounds(connection, step.topic, step.partition, offset, self.retries)
        if around == offset:
            return replace(step, after=offset)
        return replace(step, after=around, note=f"inside a message: moved to its start {around}")

    def _shift(
        self, step: ResetStep, connection: Connection, before: int, by: int, start: int, end: int
    ) -> ResetStep:
        """`by` messages after `before` (or before it, negative), within [start, end]."""
        origin = min(max(before, start), end)
        read = messages(connection, step.topic, step.partition, origin, end, self.retries)
        if by >= 0:
            offsets = [m.next_offset for _, m in zip(range(by), read, strict=False)]
            if len(offsets) < by:
                note = f"only {len(offsets)} messages after it: moved to the high watermark"
                return replace(step, after=end, note=note)
            return replace(step, after=offsets[-1] if offsets else origin)
        back, window = -by, SCAN_BACK_BYTES
        while True:  # ends: the window grows until it reaches the log start
            low = max(start, origin - window)
            low = message_bounds(connection, step.topic, step.partition, low, self.retries)[0]
            found = [
                m.offset
                for m in messages(connection, step.topic, step.partition, low, origin, self.retries)
            ]
            if len(found) >= back:
                return replace(step, after=found[-back])
            if low <= start:
                note = f"only {len(found)} messages before it: moved to the log start"
                return replace(step, after=start, note=note)
            window *= 4


@dataclass(frozen=True, slots=True)
class ResetStep:
    """One partition of a reset: the group's committed offset `before` and `after` it (None:
    left as it is, `note` says why)."""

    topic: str
    partition: int
    name: str
    before: int | None
    after: int | None
    note: str | None = None
