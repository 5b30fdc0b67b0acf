"""Topics larger than one ZooKeeper transaction can carry (issue 48, docs/registry.md "Writing a
topic"), against a real ZooKeeper: their state nodes are written in chunks under
jute.maxbuffer, then published by the configuration; a writer cut short after its first chunk
leaves nothing a reader takes for a topic, and the next writer completes it."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import pytest
from kazoo.client import KazooClient, TransactionRequest

from broker.errors import (
    InvalidTopic,
    RegistryUnavailable,
    TopicAlreadyExists,
    UnknownTopicOrPartition,
)
from broker.registry import MAX_PARTITIONS, PartitionState, Registry, TopicConfig
from broker.registry.session import Session

PARTITIONS = 4_000
"""More state nodes than one transaction can create: 4,000 took 1,158,102 bytes, past
ZooKeeper's jute.maxbuffer (1 MiB), and the server dropped the connection."""

BIG = TopicConfig.spread(PARTITIONS, [1, 2, 3], replication_factor=2)


class CutShortSession(Session):
    """A session that ends (its broker dies) once it has sent `commits_left` transactions;
    `before_next` runs instead, when given, and the session goes on."""

    commits_left = -1
    before_next: Callable[[], None] | None = None

    def commit(self, what: str, build: Callable[[TransactionRequest], None]) -> list[Any]:
        results = super().commit(what, build)
        self.commits_left -= 1
        if self.commits_left == 0:
            if self.before_next is None:
                self.stop()
            else:
                self.before_next()
        return results


class CutShort(Registry):
    """A registry on a CutShortSession."""

    session_type = CutShortSession

    def __init__(
        self,
        *args: Any,
        commits: int,
        before_next: Callable[[], None] | None = None,
        **options: Any,
    ) -> None:
        super().__init__(*args, **options)
        assert isinstance(self.session, CutShortSession)
        self.session.commits_left = commits
        self.session.before_next = before_next


@pytest.fixture
def make_cut_short(make_registry: Callable[..., Registry]) -> Callable[..., CutShort]:
    def make(**options: Any) -> CutShort:
        registry = make_registry(of=CutShort, **options)
        assert isinstance(registry, CutShort)
        return registry

    return make


def initial_states(config: TopicConfig) -> dict[int, PartitionState]:
    return {p: PartitionState.initial(replicas, {}) for p, replicas in enumerate(config.replicas)}


def states(registry: Registry, topic: str) -> dict[int, PartitionState]:
    return {p: state for p, (state, _) in registry.topics.partition_states(topic).items()}


def no_connection_lost(caplog: pytest.LogCaptureFixture, registry: Registry) -> None:
    lost = [
        r.getMessage() for r in caplog.records if "lost its ZooKeeper connection" in r.getMessage()
    ]
    assert lost == []
    assert registry.session.connected
    assert registry.session.statistics().sessions == 1


def test_a_topic_larger_than_one_transaction_is_created_whole_without_losing_the_connection(
    registry: Registry, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    registry.topics.create_topic_config("big", BIG)
    assert registry.topics.topic_config("big") == BIG
    assert states(registry, "big") == initial_states(BIG)
    no_connection_lost(caplog, registry)


def test_partitions_past_one_transaction_are_added_whole(
    registry: Registry, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    registry.topics.create_topic_config(
        "big", TopicConfig.spread(3, [1, 2, 3], replication_factor=2)
    )
    grown = registry.topics.add_partitions("big", PARTITIONS, {1: None, 2: None, 3: None})
    assert grown.partitions == PARTITIONS
    assert registry.topics.topic_config("big") == grown
    assert states(registry, "big") == initial_states(grown)
    no_connection_lost(caplog, registry)


def test_a_topic_larger_than_one_transaction_is_deleted_whole(
    registry: Registry, observer: KazooClient, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    registry.topics.create_topic_config("big", BIG)
    registry.topics.delete_topic_config("big")
    with pytest.raises(UnknownTopicOrPartition):
        registry.topics.topic_config("big")
    assert observer.exists(f"{registry.session.chroot}/brokers/topics/big") is None
    no_connection_lost(caplog, registry)


def test_a_creation_cut_short_after_its_first_chunk_shows_no_topic_and_is_completed_by_the_next(
    registry: Registry, make_cut_short: Callable[..., CutShort]
) -> None:
    dying = make_cut_short(commits=1)
    with pytest.raises(RegistryUnavailable):
        dying.topics.create_topic_config("big", BIG)
    # what readers see: no topic (no configuration publishes the states written so far)
    assert "big" not in registry.topics.topic_configs()
    with pytest.raises(UnknownTopicOrPartition):
        registry.topics.topic_config("big")
    left = registry.topics.partition_states("big")
    assert 0 < len(left) < PARTITIONS  # a chunk, seen by nobody who reads topics

    registry.topics.create_topic_config("big", BIG)
    assert registry.topics.topic_config("big") == BIG
    completed = registry.topics.partition_states("big")
    assert {p: state for p, (state, _) in completed.items()} == initial_states(BIG)
    # those left were overwritten, so that a version read of them is no longer current
    assert {completed[p][1] for p in left} == {1}


def test_a_creation_overtaken_by_another_is_refused_and_the_other_wins_whole(
    registry: Registry, make_cut_short: Callable[..., CutShort]
) -> None:
    other = TopicConfig.spread(PARTITIONS, [1, 2, 3], replication_factor=3)
    overtaken = make_cut_short(
        commits=1, before_next=lambda: registry.topics.create_topic_config("big", other)
    )
    with pytest.raises(TopicAlreadyExists):
        overtaken.topics.create_topic_config("big", BIG)
    assert registry.topics.topic_config("big") == other
    assert states(registry, "big") == initial_states(other)


def test_a_deletion_cut_short_after_its_first_chunk_leaves_no_topic_and_a_new_one_takes_over(
    registry: Registry, make_cut_short: Callable[..., CutShort], observer: KazooClient
) -> None:
    registry.topics.create_topic_config("big", BIG)
    dying = make_cut_short(commits=2)  # the configuration's deletion, then one chunk of states
    dying.topics.delete_topic_config("big")  # the topic is deleted: the rest is left, and logged
    assert "big" not in registry.topics.topic_configs()
    left = registry.topics.partition_states("big")
    assert 0 < len(left) < PARTITIONS

    small = TopicConfig.spread(3, [1])
    registry.topics.create_topic_config("big", small)
    assert states(registry, "big") == initial_states(small)
    folder = f"{registry.session.chroot}/brokers/topics/big/partitions"
    assert sorted(observer.get_children(folder)) == ["0", "1", "2"]


def test_more_partitions_than_the_maximum_are_refused_before_anything_is_written(
    registry: Registry, observer: KazooClient
) -> None:
    too_many = TopicConfig.spread(MAX_PARTITIONS + 1, [1])
    with pytest.raises(InvalidTopic, match="partitions must be from 1 to 10000, not 10001"):
        registry.topics.create_topic_config("big", too_many)
    assert observer.exists(f"{registry.session.chroot}/brokers/topics/big") is None
    registry.topics.create_topic_config("big", TopicConfig.spread(2, [1]))
    with pytest.raises(InvalidTopic, match="from 1 to 10000"):
        registry.topics.add_partitions("big", MAX_PARTITIONS + 1, {1: None})
    assert registry.topics.topic_config("big").partitions == 2
