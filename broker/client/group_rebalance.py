"""How a group member follows the assignment its heartbeat thread hears from the coordinator
(KIP-848's reconciliation, the member's side; broker.client.group's module text): partitions
taken away are given up first and reported at once, those given are started from their
committed offsets, those that stay are read on; told it is unknown or fenced, the member drops
every partition uncommitted and joins again."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from broker.client.cluster import Cluster
from broker.client.group_commits import OffsetCommits
from broker.client.group_fetch import RETRY_BACKOFF_S, FetchSession
from broker.client.membership import Heartbeats
from broker.client.records import BrokerPartition
from broker.clock import Clock
from broker.errors import BrokerError, Unavailable, UnknownTopicOrPartition
from broker.groups.assignors import TopicPartition

Told = Callable[[frozenset[BrokerPartition]], object]
"""A rebalance callback: on_assigned, on_revoked or on_lost, given the partitions."""


class Rebalances:
    """The rebalances of member `consumer_id` of `group`: `heartbeats` hears the assignment
    (and sets `news`), `fetching` holds the partitions, `commits` commits those given up (with
    auto-commit). `on_assigned`, `on_revoked` and `on_lost` run in the thread that follows
    (GroupConsumer's poll). `count` is how many times partitions were given."""

    def __init__(
        self,
        heartbeats: Heartbeats,
        fetching: FetchSession[Any],
        commits: OffsetCommits,
        cluster: Cluster,
        news: threading.Event,
        *,
        on_assigned: Told | None,
        on_revoked: Told | None,
        on_lost: Told | None,
        clock: Clock,
        log: logging.Logger,
    ) -> None:
        self.heartbeats = heartbeats
        self.fetching = fetching
        self.commits = commits
        self.cluster = cluster
        self.news = news
        self.group = commits.group
        self.consumer_id = commits.consumer_id
        self.on_assigned = on_assigned
        self.on_revoked = on_revoked
        self.on_lost = on_lost
        self.clock = clock
        self.log = log
        self.count = 0
        self._waiting: frozenset[BrokerPartition] = frozenset()
        self._waiting_until = 0.0
        """Partitions given that could not be started (FetchSession.start), and when to try
        again."""

    def due(self) -> bool:
        """Whether to follow the assignment now: the heartbeat thread's news came, or
        partitions given wait to be started and their rest is over."""
        if self.news.is_set():
            return True
        return bool(self._waiting) and self.clock.monotonic() >= self._waiting_until

    def follow(self) -> bool:
        """Follow the assignment; False when a broker went away meanwhile, or has not heard
        yet of a partition the coordinator gave this member (partitions just added): the next
        poll tries again, METADATA asked again."""
        try:
            self._reconcile()
        except (Unavailable, BrokerError) as error:
            lagging = isinstance(error, UnknownTopicOrPartition)
            if isinstance(error, BrokerError) and not error.retriable and not lagging:
                raise
            if lagging:
                self.cluster.leaders.clear()
            self.log.warning("group %s: rebalance interrupted, will retry: %s", self.group, error)
            self.news.set()
            return False
        return True

    def still_member(self) -> bool:
        """After UNKNOWN_MEMBER_ID or FENCED_MEMBER_EPOCH drop every partition, uncommitted
        (their next owner may have committed since), and let the heartbeat thread join
        again."""
        heartbeats = self.heartbeats
        with heartbeats.lock:
            lost = heartbeats.membership.lost
        if not lost:
            return True
        dropped = frozenset(self.fetching.owned)
        self.fetching.stop()
        self.fetching.owned.clear()
        if dropped:
            self.log.warning(
                "group %s: %s lost its %d partitions to the group; joining again",
                self.group,
                self.consumer_id,
                len(dropped),
            )
            told = self.on_lost or self.on_revoked
            if told is not None:
                told(dropped)
        heartbeats.report(frozenset(), dropped_all=True)
        return False

    def give_up(self, partitions: frozenset[BrokerPartition]) -> None:
        """Stop reading `partitions`: what was fetched for them dropped, `on_revoked`, their
        positions committed (with auto-commit), forgotten. The other partitions are read on,
        what was fetched for them kept, and a fetch in flight for some of them goes on (its
        parts for `partitions` are dropped when it comes: FetchSession.receive), so that a
        partition that stays never waits for a fetch sent again."""
        owned = self.fetching.owned
        for tp in partitions:
            owned[tp].buffered.clear()
        if self.on_revoked is not None:
            self.on_revoked(partitions)
        if self.commits.auto_commit_interval_s is not None:
            self.commits.commit_positions(partitions)
        for tp in partitions:
            del owned[tp]

    def _reconcile(self) -> None:
        """Follow the assignment the heartbeat thread last heard.
        Partitions taken away are given up first (fetching stopped, `on_revoked`, their
        positions committed with auto-commit) and reported at once; then those given are read
        from their committed offsets (`on_assigned`). A partition that stays is read on."""
        heartbeats = self.heartbeats
        self.news.clear()
        with heartbeats.lock:
            assignment = heartbeats.membership.assignment
        mine = {TopicPartition(tp.topic, tp.partition): tp for tp in self.fetching.owned}
        revoked = frozenset(tp for key, tp in mine.items() if key not in assignment)
        if revoked:
            self.give_up(revoked)
            heartbeats.report(frozenset(k for k, tp in mine.items() if tp not in revoked))
        given = sorted(assignment - mine.keys())
        if not given:
            self._waiting = frozenset()
            return
        claimed = self.fetching.broker_partitions(given)
        waiting = frozenset(self.fetching.start(claimed, self.commits.committed_of(claimed)))
        if waiting and waiting != self._waiting:
            self.log.warning(
                "group %s: %d partitions given wait for a leader to read them from "
                "(their brokers down?), tried again every %g s: %s",
                self.group,
                len(waiting),
                RETRY_BACKOFF_S,
                ", ".join(f"{tp.topic}/{tp.partition}" for tp in sorted(waiting)),
            )
        self._waiting = waiting
        self._waiting_until = self.clock.monotonic() + RETRY_BACKOFF_S
        started = [tp for tp in claimed if tp not in waiting]
        if not started:
            return
        self.count += 1
        self.log.info(
            "group %s: %s was given %d partitions: %s",
            self.group,
            self.consumer_id,
            len(started),
            ", ".join(f"{tp.topic}/{tp.partition}" for tp in started),
        )
        owned = self.fetching.owned
        heartbeats.report(frozenset(TopicPartition(tp.topic, tp.partition) for tp in owned))
        if self.on_assigned is not None:
            self.on_assigned(frozenset(started))
