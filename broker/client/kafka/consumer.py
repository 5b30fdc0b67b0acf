"""confluent-kafka's Consumer over pylog's GroupConsumer (broker.client.group): subscribe,
poll, consume, commit, seek; and its ShareConsumer, refused."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Self

from broker.client.cluster import Cluster
from broker.client.coordinator import GroupCalls
from broker.client.framing import DEFAULT_CLIENT_ID
from broker.client.group import GroupConsumer
from broker.client.kafka.errors import KafkaException, as_kafka_errors, not_implemented
from broker.client.kafka.messages import (
    OFFSET_BEGINNING,
    OFFSET_END,
    OFFSET_INVALID,
    OFFSET_STORED,
    ClusterMetadata,
    Event,
    Message,
    TopicPartition,
    list_topics,
    offset_at,
)
from broker.client.kafka.settings import (
    CONSUMER_KEYS,
    ISOLATIONS,
    RESETS,
    checked_settings,
    choice,
    client_keys,
    flag,
    number,
)
from broker.client.records import BrokerPartition
from broker.errors import PylogError
from broker.protocol import EARLIEST, LATEST


class ShareConsumer:
    """confluent-kafka's share consumer (KIP-932's queues): pylog has no share groups; each
    partition of a pylog group is read by one member at a time."""

    def __init__(self, conf: Mapping[str, Any] | None = None, **kwargs: Any) -> None:
        raise not_implemented(
            "share groups: pylog has none (KIP-932's queues); read with a Consumer in a group "
            "(docs/clients.md, 'What pylog does not have')"
        )


def _partitions(owned: Iterable[BrokerPartition]) -> list[TopicPartition]:
    return sorted(TopicPartition(tp.topic, tp.partition) for tp in owned)


class Consumer:
    """confluent_kafka.Consumer's shape over pylog's GroupConsumer: a member of `group.id`,
    through the group's coordinator, found through `bootstrap.servers`."""

    def __init__(self, conf: Mapping[str, Any] | None = None, **kwargs: Any) -> None:
        conf = checked_settings({**(conf or {}), **kwargs}, CONSUMER_KEYS, "consumer")
        if not conf.get("group.id"):
            raise KafkaException("group.id: a consumer reads as a member of a group; name it")
        self._eof = flag("enable.partition.eof", conf.get("enable.partition.eof", False))
        self._ends_told: dict[BrokerPartition, int] = {}
        """With enable.partition.eof: the end each owned partition's last EOF event gave."""
        self._conf = conf
        self._reset = choice("auto.offset.reset", conf.get("auto.offset.reset", "latest"), RESETS)
        self._auto_commit_s: float | None = None
        if flag("enable.auto.commit", conf.get("enable.auto.commit", True)):
            self._auto_commit_s = (
                number("auto.commit.interval.ms", conf.get("auto.commit.interval.ms", 5000)) / 1000
            )
        self._session_s = number("session.timeout.ms", conf.get("session.timeout.ms", 6000)) / 1000
        self._wait_ms = int(number("fetch.wait.max.ms", conf.get("fetch.wait.max.ms", 500)))
        fetch = conf.get("max.partition.fetch.bytes", conf.get("fetch.max.bytes"))
        self._fetch_bytes = None if fetch is None else int(number("fetch.max.bytes", fetch))
        self._timeout_s = (
            number("request.timeout.ms", conf.get("request.timeout.ms", 10_000)) / 1000
        )
        self._keys = client_keys(conf)
        self._deserializers = (conf.get("key.deserializer"), conf.get("value.deserializer"))
        self._max_poll_s = (
            number("max.poll.interval.ms", conf.get("max.poll.interval.ms", 300_000)) / 1000
        )
        self._auto_store = flag(
            "enable.auto.offset.store", conf.get("enable.auto.offset.store", True)
        )
        choice("isolation.level", conf.get("isolation.level", "read_committed"), ISOLATIONS)
        self._member: GroupConsumer[Message] | None = None
        self._revoking: frozenset[tuple[str, int]] = frozenset()
        """The partitions on_revoke or on_lost is being called for, while it runs."""
        self._closed = False

    def subscribe(
        self,
        topics: list[str],
        on_assign: Callable[[Consumer, list[TopicPartition]], object] | None = None,
        on_revoke: Callable[[Consumer, list[TopicPartition]], object] | None = None,
        on_lost: Callable[[Consumer, list[TopicPartition]], object] | None = None,
    ) -> None:
        """Join the group for `topics` (whole names; a name starting with ^ is a pattern in
        Kafka, refused here), leaving any subscription before. `on_assign(consumer,
        partitions)` and `on_revoke(consumer, partitions)` run in poll() around rebalances;
        `on_lost(consumer, partitions)` (default: `on_revoke`) when they were lost without a
        commit, as in confluent-kafka."""
        if isinstance(topics, str):
            raise TypeError("subscribe takes a list of topics, not a str")
        patterns = [topic for topic in topics if topic.startswith("^")]
        if patterns:
            raise KafkaException(f"{', '.join(patterns)}: pylog groups subscribe to topics by name")
        self._check_open()
        self.unsubscribe()
        member_options: dict[str, Any] = {}
        if self._fetch_bytes is not None:
            member_options["fetch_bytes"] = self._fetch_bytes
        try:
            self._member = GroupConsumer(
                str(self._conf["bootstrap.servers"]),
                str(self._conf["group.id"]),
                topics,
                instance_id=self._conf.get("group.instance.id"),
                assignor=self._conf.get("group.remote.assignor"),
                max_poll_interval_s=self._max_poll_s,
                store_processed=self._auto_store,
                logger=self._conf.get("logger"),
                reset=self._reset,
                auto_commit_interval_s=self._auto_commit_s,
                on_assigned=None
                if on_assign is None
                else lambda owned: on_assign(self, _partitions(owned)),
                on_revoked=None if on_revoke is None else self._revoked(on_revoke),
                on_lost=None if on_lost is None else self._revoked(on_lost),
                max_wait_ms=self._wait_ms,
                session_timeout_s=self._session_s,
                client_id=str(self._conf.get("client.id", DEFAULT_CLIENT_ID)),
                timeout_s=self._timeout_s,
                keys=self._keys,
                record_type=Message,
                **member_options,
            )
        except PylogError as error:
            raise KafkaException(error) from None
        except ValueError as error:  # a setting out of its bounds (max.poll.interval.ms)
            raise KafkaException(str(error)) from None

    def _revoked(
        self, callback: Callable[[Consumer, list[TopicPartition]], object]
    ) -> Callable[[Iterable[BrokerPartition]], None]:
        """`callback` as the group member calls it for partitions going away, noting them
        for `incremental_unassign` while it runs."""

        def call(owned: Iterable[BrokerPartition]) -> None:
            partitions = _partitions(owned)
            self._revoking = frozenset((tp.topic, tp.partition) for tp in partitions)
            try:
                callback(self, partitions)
            finally:
                self._revoking = frozenset()

        return call

    def committed(
        self, partitions: list[TopicPartition], timeout: float | None = None
    ) -> list[TopicPartition]:
        """`partitions` with the group's committed offset of each (OFFSET_INVALID for one with
        none), asked of the coordinator: by the group member, or, before subscribe(), as one
        who does not join (confluent-kafka's get_watermark_offsets example asks so)."""
        self._check_open()
        asked = [(tp.topic, tp.partition) for tp in partitions]
        found: Mapping[tuple[str, int], int]
        with as_kafka_errors():
            if self._member is not None:
                found = self._member.committed(asked)
            else:
                with GroupCalls(
                    str(self._conf["bootstrap.servers"]),
                    str(self._conf["group.id"]),
                    str(self._conf.get("client.id", DEFAULT_CLIENT_ID)),
                    self._timeout_s,
                    keys=self._keys,
                ) as calls:
                    topics = sorted({topic for topic, _ in asked})
                    found = {
                        (tp.topic, tp.partition): o for tp, o in calls.committed(topics).items()
                    }
        return [
            TopicPartition(
                tp.topic, tp.partition, found.get((tp.topic, tp.partition), OFFSET_INVALID)
            )
            for tp in partitions
        ]

    def list_topics(self, topic: str | None = None, timeout: float = -1) -> ClusterMetadata:
        """The cluster's brokers and `topic` (every topic when None), as confluent-kafka's
        (`timeout` is taken; the client's request.timeout.ms bounds each ask)."""
        with self._cluster() as cluster:
            return list_topics(cluster, topic)

    def get_watermark_offsets(
        self, partition: TopicPartition, timeout: float | None = None, cached: bool = False
    ) -> tuple[int, int]:
        """(low, high): the log start and the high watermark of `partition`, asked of its
        leader (`cached` data pylog does not keep: asked either way). Offsets are byte
        positions, so `high - low` is bytes, not messages."""
        topic, number = partition.topic, partition.partition
        with self._cluster() as cluster, as_kafka_errors():
            return (
                offset_at(cluster, topic, number, EARLIEST),
                offset_at(cluster, topic, number, LATEST),
            )

    def offsets_for_times(
        self, partitions: list[TopicPartition], timeout: float | None = None
    ) -> list[TopicPartition]:
        """For each of `partitions`, whose offset is a time in ms since the epoch, the offset
        of the first message whose timestamp is at or after it (OFFSETS), or OFFSET_END when
        no message is, as confluent-kafka gives them."""
        found = []
        with self._cluster() as cluster, as_kafka_errors():
            for tp in partitions:
                at = offset_at(cluster, tp.topic, tp.partition, tp.offset)
                end = offset_at(cluster, tp.topic, tp.partition, LATEST)
                found.append(
                    TopicPartition(tp.topic, tp.partition, OFFSET_END if at >= end else at)
                )
        return found

    def _cluster(self) -> Cluster:
        """A cluster of its own for a one-off ask, closed by the caller."""
        return Cluster(
            str(self._conf["bootstrap.servers"]),
            str(self._conf.get("client.id", DEFAULT_CLIENT_ID)),
            self._timeout_s,
            keys=self._keys,
        )

    def _joined(self) -> GroupConsumer[Message]:
        self._check_open()
        if self._member is None:
            raise KafkaException("not subscribed: call subscribe(topics) first")
        return self._member

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("Consumer closed")

    def poll(self, timeout: float | None = None) -> Message | None:
        """The next message, waiting up to `timeout` seconds (None or -1: until one comes);
        None when none came. The message returned before counts as processed (auto-commit
        commits it). KafkaException for an error that stops reading (damaged data,
        authorization)."""
        member = self._joined()
        clock = member.cluster.clock  # its transport's: the waits are its fetches'
        deadline = math.inf if timeout is None or timeout < 0 else clock.monotonic() + timeout
        while True:
            if self._eof and (event := self._end_reached(member)) is not None:
                return event
            left = deadline - clock.monotonic()
            wait_ms = (
                self._wait_ms
                if left == math.inf
                else max(0, min(self._wait_ms, round(left * 1000)))
            )
            try:
                record = member.poll_record(wait_ms)
            except PylogError as error:
                raise KafkaException(error) from None
            if record is not None:
                return self._deserialized(record)
            if clock.monotonic() >= deadline:
                return self._end_reached(member) if self._eof else None

    def _end_reached(self, member: GroupConsumer[Message]) -> Message | None:
        """With enable.partition.eof: the event of an owned partition read to an end not told
        before (confluent-kafka's _PARTITION_EOF), or None."""
        ends = member.at_end()
        self._ends_told = {tp: end for tp, end in self._ends_told.items() if tp in ends}
        for tp, end in ends.items():
            if self._ends_told.get(tp) != end:
                self._ends_told[tp] = end
                return Event.partition_eof(tp.topic, tp.partition, end)
        return None

    def consume(self, num_messages: int = 1, timeout: float | None = -1) -> list[Message]:
        """Up to `num_messages` messages, waiting up to `timeout` seconds (-1 or None: until
        that many came) in all."""
        if num_messages < 1:
            raise ValueError("num_messages is 1 or more")
        member = self._joined()
        clock = member.cluster.clock
        deadline = math.inf if timeout is None or timeout < 0 else clock.monotonic() + timeout
        messages: list[Message] = []
        while len(messages) < num_messages:
            left = deadline - clock.monotonic()
            wait_ms = (
                self._wait_ms
                if left == math.inf
                else max(0, min(self._wait_ms, round(left * 1000)))
            )
            try:  # what a fetch brought, at once: the group's bookkeeping once, not a message
                records = member.poll_records(num_messages - len(messages), wait_ms)
            except PylogError as error:
                raise KafkaException(error) from None
            if self._deserializers != (None, None):
                records = [self._deserialized(record) for record in records]
            messages += records
            if not records and self._eof and (event := self._end_reached(member)) is not None:
                messages.append(event)
            if clock.monotonic() >= deadline:
                break
        return messages

    def _deserialized(self, message: Message) -> Message:
        """`message` with its key and value through `key.deserializer` and
        `value.deserializer`, when the consumer has them."""
        key_deserializer, value_deserializer = self._deserializers
        if key_deserializer is None and value_deserializer is None:
            return message
        key, value = message.key(), message.value()
        if key_deserializer is not None and key is not None:
            key = key_deserializer(key)
        if value_deserializer is not None:
            value = value_deserializer(value)
        return Message.of(
            message.topic(),
            message.partition(),
            message.offset(),
            key,
            value,
            message.timestamp()[1],
            message.headers(),
            message.next_offset(),
        )

    def commit(
        self,
        message: Message | None = None,
        offsets: list[TopicPartition] | None = None,
        asynchronous: bool = True,
    ) -> list[TopicPartition] | None:
        """Commit, with the group's coordinator, every message returned so far (no argument);
        or `message` (the offset after it); or `offsets` (each the offset to read next). The
        commit is made before this returns, whatever `asynchronous` says; it returns the
        partitions committed when `asynchronous` is False, as confluent-kafka does."""
        member = self._joined()
        if message is not None and offsets is not None:
            raise ValueError("commit takes a message or offsets, not both")
        with as_kafka_errors():
            if message is not None:
                chosen = {(message.topic(), message.partition()): message.next_offset()}
                member.commit(chosen)
                committed = [
                    TopicPartition(message.topic(), message.partition(), message.next_offset())
                ]
            elif offsets is not None:
                member.commit({(tp.topic, tp.partition): tp.offset for tp in offsets})
                committed = list(offsets)
            else:
                member.commit()
                committed = self.position(self.assignment())
        return None if asynchronous else committed

    def assignment(self) -> list[TopicPartition]:
        """The partitions this member owns now."""
        if self._member is None:
            return []
        return _partitions(self._member.assignment)

    def position(self, partitions: list[TopicPartition]) -> list[TopicPartition]:
        """`partitions` with the offset each is read from next (OFFSET_INVALID for one not
        owned)."""
        member = self._joined()
        positions = {(tp.topic, tp.partition): offset for tp, offset in member.positions().items()}
        return [
            TopicPartition(
                tp.topic, tp.partition, positions.get((tp.topic, tp.partition), OFFSET_INVALID)
            )
            for tp in partitions
        ]

    def seek(self, partition: TopicPartition) -> None:
        """Read `partition.partition` of `partition.topic` from `partition.offset` next (an
        offset where a message starts, or OFFSET_BEGINNING or OFFSET_END: the log start or
        the high watermark, asked of its leader); KafkaException when not owned."""
        member = self._joined()
        topic, number, offset = partition.topic, partition.partition, partition.offset
        with as_kafka_errors():
            if offset in (OFFSET_BEGINNING, OFFSET_END):  # OFFSETS' own EARLIEST and LATEST
                offset = offset_at(member.cluster, topic, number, offset)
            member.seek(topic, number, offset)

    def assign(self, partitions: list[TopicPartition]) -> None:
        """Where the partitions this member was given are read from: each with an offset
        (where a message starts, OFFSET_BEGINNING or OFFSET_END) is read from it next, as
        `seek`; OFFSET_INVALID and OFFSET_STORED leave it where the group's committed offset
        put it. The confluent-kafka tutorial's reset, `consumer.assign(partitions)` in
        `on_assign`, works so. pylog's consumer reads as a member of its group only: a
        partition the group did not give it is a KafkaException, not a manual assignment."""
        if self._member is None and not self._closed:
            raise KafkaException(
                "assign: pylog has no manual assignment: a consumer reads as a member of its "
                "group (subscribe(topics) first), and assign() sets where the partitions the "
                "group gave it are read from (docs/clients.md)"
            )
        member = self._joined()
        owned = {(tp.topic, tp.partition) for tp in member.assignment}
        others = sorted(
            f"{tp.topic}/{tp.partition}"
            for tp in partitions
            if (tp.topic, tp.partition) not in owned
        )
        if others:
            raise KafkaException(
                f"assign: {', '.join(others)} not given to this member by group "
                f"{self._conf['group.id']!r}: pylog reads as a member of a group (subscribe), "
                "and assign() only sets where its own partitions are read from"
            )
        for tp in partitions:
            if tp.offset not in (OFFSET_INVALID, OFFSET_STORED):
                self.seek(tp)

    incremental_assign = assign

    def incremental_unassign(self, partitions: list[TopicPartition]) -> None:
        """Give up `partitions`: in on_revoke or on_lost, for the partitions it was called
        with, as confluent-kafka's examples do (the member gives them up when the callback
        returns, whether or not this was called). Elsewhere a KafkaException: a pylog member
        owns what its group gives it until the group moves it; pause() stops reading one."""
        asked = {(tp.topic, tp.partition) for tp in partitions}
        others = sorted(f"{topic}/{number}" for topic, number in asked - self._revoking)
        if others:
            raise KafkaException(
                f"unassign: {', '.join(others)} not being revoked: a pylog member gives up "
                "partitions when its group moves them (in on_revoke); pause() stops reading one"
            )

    def unassign(self) -> None:
        """Give up every partition, in on_revoke or on_lost (incremental_unassign)."""
        revoking = [TopicPartition(topic, number) for topic, number in sorted(self._revoking)]
        self.incremental_unassign(revoking or self.assignment())

    def store_offsets(
        self, message: Message | None = None, offsets: list[TopicPartition] | None = None
    ) -> None:
        """What the next commit (or auto-commit) records: after `message` (its next offset),
        or `offsets` (each partition's offset to read next), for a consumer with
        enable.auto.offset.store false, as confluent-kafka's; KafkaException for a partition
        not owned."""
        if (message is None) == (offsets is None):
            raise TypeError("store_offsets takes a message or offsets")
        stored = (
            {(message.topic(), message.partition()): message.next_offset()}
            if message is not None
            else {(tp.topic, tp.partition): tp.offset for tp in offsets or ()}
        )
        with as_kafka_errors():
            self._joined().store(stored)

    def pause(self, partitions: list[TopicPartition]) -> None:
        """Stop reading `partitions` of this member's, keeping them (what was fetched for them
        and not handed out is dropped: after `resume` the next message is the one after the
        last one handed out); KafkaException for one not owned."""
        with as_kafka_errors():
            self._joined().pause((tp.topic, tp.partition) for tp in partitions)

    def resume(self, partitions: list[TopicPartition]) -> None:
        """Read `partitions` again after `pause`; KafkaException for one not owned."""
        with as_kafka_errors():
            self._joined().resume((tp.topic, tp.partition) for tp in partitions)

    def unsubscribe(self) -> None:
        """Leave the group (committing with auto-commit); on_revoke runs for the partitions
        given up, and may commit them."""
        if self._member is not None:
            try:
                self._member.close()
            finally:
                self._member = None

    def close(self) -> None:
        """Leave the group and close; poll() raises RuntimeError after."""
        if not self._closed:
            self.unsubscribe()
            self._closed = True

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        """Close (leaving the group), as confluent-kafka's Consumer does at the end of a
        `with` block."""
        self.close()
