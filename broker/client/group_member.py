"""A member of a consumer group, what broker.client.group's GroupConsumer stands on: joined and
kept in the group by its heartbeat thread (broker.client.membership.Heartbeats), within its
lease or not, following its assignment (Rebalances), fetching (FetchSession), committing
(OffsetCommits) and leaving. GroupConsumer hands out what it fetched; the rules of delivery
and of the processing deadline are in its module's text.

Not safe to share between threads (the heartbeat thread only sets a flag that `poll` reads).
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import uuid
from collections.abc import Callable, Iterable, Mapping
from typing import Generic, cast

from broker.client.cluster import Cluster
from broker.client.consumer import DEFAULT_FETCH_BYTES
from broker.client.coordinator import GroupCalls
from broker.client.framing import DEFAULT_CLIENT_ID
from broker.client.group_commits import OffsetCommits
from broker.client.group_fetch import FetchSession, Reset
from broker.client.group_rebalance import Rebalances
from broker.client.membership import Heartbeats, Membership
from broker.client.records import BrokerPartition, R, Record
from broker.client.transport import Transport
from broker.clock import Clock
from broker.lifecycle import Closing
from broker.security import ClientKeys

log = logging.getLogger("pylog.group")

DEFAULT_MAX_POLL_INTERVAL_S = 300.0
"""A member's processing deadline by default (Kafka's max.poll.interval.ms)."""
MAX_POLL_INTERVAL_S = (2**31 - 1) / 1000
"""The longest: rebalance_timeout_ms is an i32 of milliseconds on the wire."""


def default_consumer_id() -> str:
    """<host>-<pid>-<random>: unique, and telling an operator where the member runs."""
    host = "".join(c if c.isalnum() or c in "._-" else "_" for c in socket.gethostname())
    return f"{host or 'host'}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


class GroupMember(Closing, Generic[R]):
    """Member `consumer_id` of `group` for `topics`, through the group's coordinator, found
    through `broker` ("host:port" of any broker of the cluster; several comma-separated, tried
    in turn). `session_timeout_s` (2 to 300) is how long the coordinator waits for a heartbeat
    before it gives the member's partitions to others; `max_poll_interval_s` how long the
    application may take between two polls (its processing deadline). `instance_id` makes a
    static member: closed and started again within its session, it takes its partitions back
    without a rebalance. `assignor` is the group's ("uniform", sticky, the default; "range",
    the paper's).

    `on_assigned(partitions)` runs after partitions were given, `on_revoked(partitions)` before
    partitions taken away are committed and given up (both in the thread calling `poll`), so a
    user can flush state or commit; `on_lost(partitions)` (default: `on_revoked`) when they
    were lost without a commit (a session that expired; the coordinator no longer knowing the
    member), their next owner reading from the last commit. `auto_commit_interval_s` None turns
    auto-commit off: then only `commit()` commits. `store_processed` False (Kafka's
    enable.auto.offset.store false): records handed out do not count as processed when the
    application asks for the next; only `store` moves what a commit records. `logger`: where
    the member logs (confluent-kafka's `logger` setting). `skip_corrupt` reads past damaged
    data instead of raising CorruptSegment (see broker.client.group's text). `keys`
    (broker.security.ClientKeys: the client's key pair and the brokers' public key) reach
    brokers serving CurveZMQ (docs/security.md); without them the member speaks plaintext.
    `transport` carries the requests (broker.client.transport; default: ZeroMQ sockets), its
    clock the waits for replies. `clock` (broker.clock; default the transport's) times
    auto-commits, the lease, the processing deadline, the rests of partitions after errors and
    the fetches overdue. `record_type` (default Record) is what it hands out: a tuple type of
    Record's layout without a __dict__, each made from the fetched bytes, no Record between."""

    def __init__(
        self,
        broker: str,
        group: str,
        topics: Iterable[str],
        *,
        consumer_id: str | None = None,
        reset: Reset = "earliest",
        auto_commit_interval_s: float | None = 5.0,
        on_assigned: Callable[[frozenset[BrokerPartition]], object] | None = None,
        on_revoked: Callable[[frozenset[BrokerPartition]], object] | None = None,
        on_lost: Callable[[frozenset[BrokerPartition]], object] | None = None,
        max_wait_ms: int = 500,
        fetch_bytes: int = DEFAULT_FETCH_BYTES,
        session_timeout_s: float = 6.0,
        client_id: str = DEFAULT_CLIENT_ID,
        timeout_s: float = 10.0,
        skip_corrupt: bool = False,
        keys: ClientKeys | None = None,
        clock: Clock | None = None,
        record_type: type[R] | None = None,
        instance_id: str | None = None,
        assignor: str | None = None,
        max_poll_interval_s: float = DEFAULT_MAX_POLL_INTERVAL_S,
        store_processed: bool = True,
        logger: logging.Logger | None = None,
        transport: Transport | None = None,
    ) -> None:
        if reset not in ("earliest", "latest"):
            raise ValueError(f"reset {reset!r}: use earliest or latest")
        if not isinstance(broker, str) or not broker:
            raise ValueError(
                f"broker {broker!r}: a group consumer needs a broker's address, host:port"
            )
        if not 0 < max_poll_interval_s <= MAX_POLL_INTERVAL_S:
            raise ValueError(
                f"max_poll_interval_s {max_poll_interval_s}: more than 0, at most "
                f"{MAX_POLL_INTERVAL_S:g}"
            )
        self.group = group
        self.topics = tuple(sorted(set(topics)))
        if not self.topics:
            raise ValueError("a group consumer needs at least one topic")
        self.consumer_id = consumer_id or default_consumer_id()
        self.cluster = Cluster(broker, client_id, timeout_s, keys=keys, transport=transport)
        self.clock = clock = self.cluster.clock if clock is None else clock
        self.store_processed = store_processed
        self.log = logger if logger is not None else log
        """Where its warnings and rebalances are logged (default the "pylog.group" logger; its
        heartbeat thread's warnings too)."""
        self.max_wait_ms = max_wait_ms
        self.timeout_s = timeout_s
        self._rebalance_wanted = threading.Event()
        """Set by the heartbeat thread when its news came (joined, an assignment changed)."""
        self._closed = False
        self._interrupted = False
        membership = Membership(
            group,
            self.consumer_id,
            self.topics,
            round(session_timeout_s * 1000),
            round(max_poll_interval_s * 1000),
            instance_id or "",
            assignor or "",
            polled_at=self.clock.monotonic(),
        )
        self.fetching: FetchSession[R] = FetchSession(
            self.cluster,
            group,
            record_type=record_type if record_type is not None else cast("type[R]", Record),
            reset=reset,
            fetch_bytes=fetch_bytes,
            timeout_s=timeout_s,
            skip_corrupt=skip_corrupt,
            clock=clock,
            log=self.log,
        )
        """The partitions this member owns and the fetches that read them (group_fetch)."""
        beat_s = min(timeout_s, session_timeout_s / 2)
        beats = GroupCalls(broker, group, client_id, beat_s, keys=keys, transport=transport)
        self._heartbeats = Heartbeats(
            membership, beats, self.clock, self._rebalance_wanted, log=self.log
        )
        """The heartbeat thread (it sends the join and every heartbeat; the first poll waits
        for its answer) and the member's state."""
        self.commits = OffsetCommits(
            GroupCalls(broker, group, client_id, timeout_s, keys=keys, transport=transport),
            self.fetching,
            self._heartbeats,
            consumer_id=self.consumer_id,
            auto_commit_interval_s=auto_commit_interval_s,
            clock=clock,
            log=self.log,
        )
        """What the member commits (group_commits), and when it auto-commits."""
        self.rebalancing = Rebalances(
            self._heartbeats,
            self.fetching,
            self.commits,
            self.cluster,
            self._rebalance_wanted,
            on_assigned=on_assigned,
            on_revoked=on_revoked,
            on_lost=on_lost,
            clock=clock,
            log=self.log,
        )
        """How the member follows the assignment (group_rebalance)."""
        self._heartbeats.start()

    def _lease_lapsed(self) -> bool:
        """A member past its lease, or lost: what it fetched is dropped (read again after its
        lease is renewed, or by the partitions' next owners), nothing handed out."""
        if self._heartbeats.membership.may_hand_out(self.clock.monotonic()):
            return False
        self.fetching.stop()
        return True

    def _processed_all(self) -> None:
        """Count every record handed out as processed (the application asked for the next:
        for the processing deadline, it polled now), unless `store_processed` is False."""
        self._heartbeats.membership.polled_at = self.clock.monotonic()
        if self.store_processed:
            for owned in self.fetching.owned.values():
                owned.position = owned.delivered

    def _fill(self, max_wait_ms: int | None) -> None:
        """Follow the assignment when it changed, auto-commit when due, and unless records are
        buffered fetch, waiting up to `max_wait_ms` (default the member's) for some, then send
        the next fetches at once (as PartitionConsumer does: a broker reads them while the
        records are handed out and processed; their replies are taken once every record in
        hand is handed out); positions are left to the caller. It goes on within the wait once
        the heartbeat thread's news came (its join answered, its partitions given)."""
        wait_s = (self.max_wait_ms if max_wait_ms is None else max_wait_ms) / 1000
        waits = self.cluster.clock  # the transport's, whatever the member's clock
        deadline = waits.monotonic() + wait_s
        while not self._filled(wait_s):
            wait_s = deadline - waits.monotonic()
            if wait_s <= 0:
                return

    def _filled(self, wait_s: float) -> bool:
        """A step of `_fill`; False when it only waited (for the heartbeat thread, or for
        partitions), or its wait for fetches was cut short by the heartbeat thread's news (the
        next step follows it, within the poll's wait), True when it fetched, or records are
        buffered."""
        if not self._in_session(wait_s):
            return False
        if self.rebalancing.due() and not self.rebalancing.follow():
            return True
        self.commits.auto_commit()
        if self.fetching.any_buffered():
            return True
        if not self.fetching.owned:
            self._rebalance_wanted.wait(wait_s)
            return False
        self.fetching.send(wait_s)
        self.fetching.receive(wait_s, self._rebalance_wanted)
        if self.fetching.any_buffered():  # the next fetches, read while these are processed
            self.fetching.send(wait_s)
            return True
        return not self._rebalance_wanted.is_set()

    @property
    def connected(self) -> bool:
        """Whether the member may go on: within its lease (broker.client.membership), or told
        it lost its partitions (which the next poll acts on)."""
        membership = self._heartbeats.membership
        return membership.lost or membership.may_hand_out(self.clock.monotonic())

    def _in_session(self, wait_s: float) -> bool:
        """Whether the member may consume: within its lease, at the epoch that gave its
        partitions. Past its lease it pauses, waiting up to `wait_s` for the heartbeat
        thread's news; told it was lost, it drops its partitions (Rebalances.still_member). Raises
        what ended the heartbeat thread, lease or none (`_check_heartbeats`)."""
        self._check_heartbeats()
        if not self.connected:
            self.fetching.stop()
            self._rebalance_wanted.wait(wait_s)
            return False
        return self.rebalancing.still_member()

    def _check_heartbeats(self) -> None:
        """Raise what ended the heartbeat thread (Heartbeats.failure: a refusal for good, a
        failed handshake), if it ended so."""
        if self._heartbeats.failure is not None:
            raise self._heartbeats.failure

    # -- offsets -----------------------------------------------------------------------------

    def committed(self, partitions: Iterable[tuple[str, int]]) -> dict[tuple[str, int], int]:
        """The group's committed offsets of those of `partitions` (topic, partition) that have
        one, asked of the coordinator now (OFFSET_FETCH); owned by this member or not."""
        return self.commits.committed(partitions)

    def commit(self, offsets: Mapping[tuple[str, int], int] | None = None) -> None:
        """Count every record handed out as processed (the one in hand included) and record
        with the coordinator, for every owned partition, the position after it (only where it
        moved). With `offsets` ((topic, partition) -> the offset to read next), record those
        instead, for those partitions alone (each becomes the partition's position; the
        others are left as they are); ValueError, nothing committed, for a partition this
        member does not own."""
        if offsets is None:
            self._processed_all()
            self.commits.commit_positions()
        else:
            self.commits.commit(offsets)

    # -- life cycle --------------------------------------------------------------------------

    def close(self) -> None:
        """Give every partition up (committing the processed records with auto-commit,
        within the lease), then leave the group, so that others take them over at once.
        Records handed out but not processed (see the module's docstring) are read again by
        the partitions' next owners."""
        if self._closed:
            return
        self._closed = True
        heartbeats = self._heartbeats
        try:
            if self.fetching.owned and self.connected and not heartbeats.membership.lost:
                self.rebalancing.give_up(frozenset(self.fetching.owned))
                heartbeats.report(frozenset())
        finally:
            heartbeats.leave()
            heartbeats.calls.close()
            self.commits.close()
            self.cluster.close()
