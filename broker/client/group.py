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

Being a member (joined, the lease, the assignment followed, commits, leaving) is its
GroupMember's (broker.client.group_member). Where a partition given is read from, the fetches
by broker, leaders followed and damaged data are the member's FetchSession's
(broker.client.group_fetch); its commits are its OffsetCommits' (broker.client.group_commits),
how it follows the assignment its Rebalances' (broker.client.group_rebalance).

Not safe to share between threads (the heartbeat thread only sets a flag that `poll` reads).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping

from broker.client.framing import wait_ms
from broker.client.group_member import GroupMember
from broker.client.records import BrokerPartition, R


class GroupConsumer(GroupMember[R]):
    """Consume `topics` as member `consumer_id` of `group` (GroupMember's parameters): `poll()`,
    `poll_record()`, `poll_records()` or `for record in member` hand out the records fetched,
    each counted as processed when the next is asked for (see the module's text)."""

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

    def interrupt(self) -> None:
        """End a `for record in member` loop at its next step, the record in hand counted as
        processed: within max_wait_ms when no message comes. It only sets a flag, so a signal
        handler may call it (raising there instead could land inside kazoo, whose bare
        `except:` in a library would swallow the exception and leave the loop running)."""
        self._interrupted = True

    def store(self, offsets: Mapping[tuple[str, int], int]) -> None:
        """What the next commit (or auto-commit) records for each of `offsets`' partitions
        ((topic, partition) -> the offset to read next): Kafka's store_offsets, for a member
        whose `store_processed` is False. ValueError, nothing stored, for one not owned."""
        owned = self.fetching.among(offsets)
        for partition, offset in zip(owned, offsets.values(), strict=True):
            partition.position = offset
