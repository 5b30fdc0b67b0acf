"""A member of a consumer group: the group shares the partitions of its topics, coordinated
by the brokers (docs/protocol.md, "Consumer groups"); a member needs only a broker's address.

Every partition of a subscribed topic is consumed by exactly one member of the group at a time;
groups are independent of each other. A heartbeat thread (broker.client.membership.Heartbeats)
keeps the member in the group and learns its assignment; the thread that polls follows it in
the poll under way (a wait for records looks for the news every NEWS_CHECK_S) or at its next
poll: partitions taken away are given up (fetching stopped, `on_revoked`, positions
committed with auto-commit, reported at once), partitions given are read from the group's
committed offsets (`on_assigned`), and those that stay are read on. Within its lease only (its
session since it sent its last answered heartbeat) does it hand out records. Told it is unknown
or fenced, it drops its partitions without committing (`on_lost`) and joins again. A member
that does not poll within `max_poll_interval_s` leaves the group (its processing deadline, as
Kafka's max.poll.interval.ms) and joins again at its next poll.

Delivery is at least once. A record counts as processed when the application asks for the
next one: the next `poll()` call for the records a poll returned, the next step of the iteration
for a record `for record in member` gave. `commit()` also counts every record handed out so far
as processed, the one in hand included. Auto-commit (every `auto_commit_interval_s`, checked at
each poll and each step of the iteration), the commit of a partition given up and `close()`
record only the processed records, so a `break` out of the loop, an exception in the handler or
a crash leaves the record in hand (and everything after it) to be read again by the partition's
next owner. Records fetched and not handed out stay with the member: a loop over it entered
again goes on with the next record.

Where a partition given is read from, the fetches by broker, leaders followed and damaged data
are the member's FetchSession's (broker.client.group_fetch); its commits are its
OffsetCommits' (broker.client.group_commits), how it follows the assignment its Rebalances'
(broker.client.group_rebalance).

Not safe to share between threads (the heartbeat thread only sets a flag that `poll` reads).
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Generic, cast

from broker.client.cluster import Cluster
from broker.client.consumer import DEFAULT_FETCH_BYTES
from broker.client.coordinator import GroupCalls
from broker.client.framing import DEFAULT_CLIENT_ID, wait_ms
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


class GroupConsumer(Closing, Generic[R]):
    """Consume `topics` as member `consumer_id` of `group`, through the group's coordinator,
    found through `broker` ("host:port" of any broker of the cluster; several comma-separated,
    tried in turn). `session_timeout_s` (2 to 300) is how long the coordinator waits for a
    heartbeat before it gives the member's partitions to others; `max_poll_interval_s` how long
    the application may take between two polls (its processing deadline). `instance_id` makes
    a static member: closed and started again within its session, it takes its partitions back
    without a rebalance. `assignor` is the group's ("uniform", sticky, the default; "range",
    the paper's).

    `on_assigned(partitions)` runs after partitions were given, `on_revoked(partitions)`
    before partitions taken away are committed and given up (both in the thread calling
    `poll`), so a user can flush state or commit; `on_lost(partitions)` (default:
    `on_revoked`) when they were lost without a commit (a session that expired; the coordinator
    no longer knowing the member), their next owner reading from the last commit.
    `auto_commit_interval_s` None turns auto-commit off: then only `commit()` commits.
    `store_processed` False (Kafka's enable.auto.offset.store false): records handed out do not
    count as processed when the application asks for the next; only `store` moves what a
    commit records. `logger`: where the member logs (confluent-kafka's `logger` setting).
    `skip_corrupt` reads past damaged data instead of raising CorruptSegment (see the module's
    text). `keys` (broker.security.ClientKeys: the client's key pair and the brokers' public
    key) reach brokers serving CurveZMQ (docs/security.md); without them the member speaks
    plaintext. `transport` carries the requests (broker.client.transport; default: ZeroMQ
    sockets), its clock the waits for replies. `clock` (broker.clock; default the transport's)
    times auto-commits, the lease, the processing deadline, the rests of partitions after
    errors and the fetches overdue. `record_type` (default
    Record) is what it hands out: a tuple type of Record's layout without a __dict__, each made
    from the fetched bytes, no Record between."""

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

    # -- what the member holds ---------------------------------------------------------------

    @property
    def assignment(self) -> frozenset[BrokerPartition]:
        """The partitions this member owns now."""
        return frozenset(self.fetching.owned)

    def positions(self) -> dict[BrokerPartition, int]:
        """Each owned partition's position: the offset after the last processed record."""
        return self.fetching.positions()

    def at_end(self) -> dict[BrokerPartition, int]:
        """The owned partitions read to their end (FetchSession.at_end): Kafka's partition
        EOF."""
        return self.fetching.at_end()

    @property
    def rebalances(self) -> int:
        """How many times partitions were given to this member."""
        return self.rebalancing.count

    @property
    def skipped(self) -> list[tuple[BrokerPartition, int, int]]:
        """The damaged ranges read past with `skip_corrupt`: partition, [start, end) offsets."""
        return self.fetching.skipped

    @property
    def offset_resets(self) -> int:
        """Partitions read from `reset` because their committed offset was out of range."""
        return self.fetching.offset_resets

    # -- consuming ---------------------------------------------------------------------------

    def poll(self, max_wait_ms: int | None = None) -> list[R]:
        """The next messages of the owned partitions, waiting up to `max_wait_ms` (default
        the member's) for some; follows the group's assignment first when it changed. Returns
        nothing outside the member's lease (its coordinator unreachable). Calling it counts
        every record returned before as processed. TypeError for a float `max_wait_ms`
        (poll(1.0) would wait 1 ms)."""
        self._processed_all()
        self._fill(wait_ms(max_wait_ms, self.max_wait_ms))
        return self._take_buffered()

    def __iter__(self) -> Iterator[R]:
        """Messages for ever (until close or interrupt), one at a time: each counts as
        processed when the next one is asked for. Records fetched and not handed out stay
        with the member, so a loop left (break, an exception) and entered again goes on
        where it stopped, the record in hand counted as processed then."""
        while True:
            # asked for the next: the record in hand is processed (a break, an exception or
            # a close() while it was in hand never comes back here)
            self._processed_all()
            if self._closed or self._interrupted:
                return
            record = self._next_record(None)
            if record is not None:
                yield record

    def poll_record(self, max_wait_ms: int | None = None) -> R | None:
        """The next message, one at a time, waiting up to `max_wait_ms` (default the
        member's) for one; None when none came. Calling it counts the record it returned
        before as processed, as a step of `for record in member` does. TypeError for a float
        `max_wait_ms`."""
        self._processed_all()
        return self._next_record(wait_ms(max_wait_ms, self.max_wait_ms))

    def poll_records(self, limit: int, max_wait_ms: int | None = None) -> list[R]:
        """Up to `limit` records, as that many `poll_record` calls would hand them out, in one
        call: the bookkeeping (processed, auto-commit) once, not once a record; waiting up to
        `max_wait_ms` (default the member's) only when none is fetched yet. The records it
        returned before count as processed. ValueError for a `limit` under 1."""
        if limit < 1:
            raise ValueError(f"limit is {limit}: 1 or more")
        self._processed_all()
        self.commits.auto_commit()
        records = self._hand_out_many(limit)
        if not records:
            self._fill(wait_ms(max_wait_ms, self.max_wait_ms))
            records = self._hand_out_many(limit)
        return records

    def _take_buffered(self) -> list[R]:
        """Every record fetched and not handed out, now handed out (FetchSession's
        take_buffered), within the lease."""
        return [] if self._lease_lapsed() else self.fetching.take_buffered()

    def _hand_out_many(self, limit: int) -> list[R]:
        """Up to `limit` records in hand (FetchSession.hand_out_many), within the lease."""
        return [] if self._lease_lapsed() else self.fetching.hand_out_many(limit)

    def _hand_out(self) -> R | None:
        """The next record in hand (FetchSession.hand_out), within the lease."""
        return None if self._lease_lapsed() else self.fetching.hand_out()

    def _next_record(self, max_wait_ms: int | None) -> R | None:
        """Hand out the next record fetched, or fetch (up to `max_wait_ms`) and hand out the
        first that came; auto-commit when due either way."""
        self.commits.auto_commit()
        record = self._hand_out()
        if record is None:
            self._fill(max_wait_ms)
            record = self._hand_out()
        return record

    def seek(self, topic: str, partition: int, offset: int) -> None:
        """Read `partition` of `topic` from `offset` next (a message boundary: else the
        broker answers INVALID_OFFSET at the next fetch, raised by `poll`): the records
        fetched and not handed out are dropped, a fetch in flight is forgotten, and the
        position, what a commit records, becomes `offset`. ValueError when this member does
        not own the partition (now: a rebalance may take it)."""
        (owned,) = self.fetching.among([(topic, partition)])
        self.fetching.forget_fetched(owned)
        owned.position = owned.delivered = owned.fetch_offset = offset
        owned.rest_until = 0.0

    def pause(self, partitions: Iterable[tuple[str, int]]) -> None:
        """Stop reading `partitions` (topic, partition) of this member's, keeping them: what
        was fetched for them and not handed out is dropped, so the next record handed out
        after `resume` is the one after the last handed out. A partition given to this
        member again (after a rebalance) is read again. ValueError for one not owned."""
        for owned in self.fetching.among(partitions):
            self.fetching.forget_fetched(owned)
            owned.fetch_offset = owned.delivered
            owned.paused = True

    def resume(self, partitions: Iterable[tuple[str, int]]) -> None:
        """Read `partitions` again after `pause`. ValueError for one not owned."""
        for owned in self.fetching.among(partitions):
            owned.paused = False

    def _lease_lapsed(self) -> bool:
        """A member past its lease, or lost: what it fetched is dropped (read again after its
        lease is renewed, or by the partitions' next owners), nothing handed out."""
        if self._heartbeats.membership.may_hand_out(self.clock.monotonic()):
            return False
        self.fetching.stop()
        return True

    def interrupt(self) -> None:
        """End a `for record in member` loop at its next step, the record in hand counted as
        processed: within max_wait_ms when no message comes. It only sets a flag, so a signal
        handler may call it (raising there instead could land inside kazoo, whose bare
        `except:` in a library would swallow the exception and leave the loop running)."""
        self._interrupted = True

    def _processed_all(self) -> None:
        """Count every record handed out as processed (the application asked for the next:
        for the processing deadline, it polled now), unless `store_processed` is False."""
        self._heartbeats.membership.polled_at = self.clock.monotonic()
        if self.store_processed:
            for owned in self.fetching.owned.values():
                owned.position = owned.delivered

    def store(self, offsets: Mapping[tuple[str, int], int]) -> None:
        """What the next commit (or auto-commit) records for each of `offsets`' partitions
        ((topic, partition) -> the offset to read next): Kafka's store_offsets, for a member
        whose `store_processed` is False. ValueError, nothing stored, for one not owned."""
        owned = self.fetching.among(offsets)
        for partition, offset in zip(owned, offsets.values(), strict=True):
            partition.position = offset

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
