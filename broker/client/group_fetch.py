"""The partitions a group member owns and the fetches that read them (broker.client.group).

A partition given is read from the group's committed offset, or, when none is committed, from
the earliest or latest offset (`reset`). A committed offset that retention has deleted (the
broker answers OFFSET_OUT_OF_RANGE) is reset the same way, logged and counted
(`offset_resets`).

Damaged data on a broker's disk (docs/storage.md, "Damaged data") raises CorruptSegment naming
its offsets, after the records before it, at every poll until it is read past; with
`skip_corrupt` the member logs it, lists it in `skipped` and reads on after it, as
PartitionConsumer does.

Fetches go by broker: one request in flight a broker, a MULTI_FETCH of the owned partitions it
leads (a FETCH for one), sent again as soon as its reply is in, so the broker reads the next
while the records are handed out. While a partition's last reply says enough waits past what
was fetched (`fetch_round`), a fetch asks only the partitions that hold it, each in turn first.
Leadership moves (docs/replication.md): the leaders are asked by METADATA (version 2) when
partitions are given; a fetch answered NOT_LEADER_FOR_PARTITION naming a broker this member
knows goes there next, and after any other retriable error or no reply the partition's leader
is asked again by METADATA before its next fetch (each after the partition's rest,
RETRY_BACKOFF_S).
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final, Generic, Literal

from broker.client.cluster import Cluster
from broker.client.connection import Connection
from broker.client.consumer import (
    DEFAULT_FETCH_BYTES,
    MAX_FETCH_BYTES,
    corrupt_segment_reply,
    damaged_range,
    grown_fetch_bytes,
)
from broker.client.framing import noted
from broker.client.records import NEXT_AT, OFFSET_AT, BrokerPartition, Owned, R
from broker.clock import Clock
from broker.errors import BrokerError, CorruptSegment, MalformedReply, PylogError, Unavailable
from broker.groups.assignors import TopicPartition
from broker.log.codec import decode_records
from broker.protocol import (
    EARLIEST,
    LATEST,
    Api,
    ErrorCode,
    FetchPart,
    FetchReply,
    FetchRequest,
    MultiFetchRequest,
    OffsetsRequest,
    decode_fetch_part,
    decode_reply,
    request_version,
)

Reset = Literal["earliest", "latest"]
RETRY_BACKOFF_S = 0.5
"""How long a partition rests after a retriable fetch error before it is fetched again."""
NEWS_CHECK_S = 0.1
"""How often a member waiting for fetch replies looks for the heartbeat thread's news."""
FETCH_ROUND_BYTES: Final = DEFAULT_FETCH_BYTES
"""What a fetch of a broker's partitions asks for when their last replies say it waits there:
about what a broker's reply holds (its fetch_max_bytes, 1 MiB by default; `fetch_round`)."""
IDLE_ASK_S: Final = 0.5
"""The longest a partition not known to hold data goes unasked while others are read."""


def fetch_round(owned: Sequence[Owned], now: float) -> list[Owned]:
    """Which of a broker's partitions, in the round's order, the next fetch there asks. When
    their last replies say FETCH_ROUND_BYTES wait past their fetch offsets (a partition counted
    up to its fetch_bytes): the first that hold as much between them, and with them those
    not asked for IDLE_ASK_S; else all of them, in one long poll. A broker answers a fetch with
    about that much (its fetch_max_bytes): partitions past it would be answered empty, at a
    cost a part on both sides that a member reading a backlog over many partitions would pay
    for every round."""
    chosen: list[Owned] = []
    known = 0
    for o in owned:
        if known >= FETCH_ROUND_BYTES:
            break
        waiting = min(o.known_end - o.fetch_offset, o.fetch_bytes)
        if waiting > 0:
            chosen.append(o)
            known += waiting
    if known < FETCH_ROUND_BYTES:
        return list(owned)
    asked = set(chosen)
    return [o for o in owned if o in asked or now - o.sent_at >= IDLE_ASK_S]


def fetch_request(owned: Sequence[Owned], wait_s: float) -> FetchRequest | MultiFetchRequest:
    """The next fetch of owned partitions led by one broker: a long poll of up to `wait_s`, one
    FETCH for one partition, a MULTI_FETCH for more (its limit the sum of theirs)."""
    wait_ms = round(wait_s * 1000)
    if len(owned) == 1:
        tp = owned[0].tp
        return FetchRequest(
            tp.topic, tp.partition, owned[0].fetch_offset, owned[0].fetch_bytes, wait_ms, 1
        )
    parts = tuple(
        FetchPart(o.tp.topic, o.tp.partition, o.fetch_offset, o.fetch_bytes) for o in owned
    )
    return MultiFetchRequest(-1, wait_ms, 1, sum(o.fetch_bytes for o in owned), parts)


def fetch_replies(fetched: Sequence[Owned], frames: list[Any]) -> list[FetchReply | BrokerError]:
    """Each partition's answer in the reply to `fetch_request(fetched, ...)`: its FetchReply, or
    the BrokerError it was answered (a MULTI_FETCH refused whole: each part that error).
    MalformedReply for a reply that is not one, or whose parts are not those asked for."""
    if len(fetched) == 1:
        try:
            return [noted(decode_reply(Api.FETCH, frames, request_version(Api.FETCH)))]
        except BrokerError as error:
            return [error]
    try:
        parts = noted(decode_reply(Api.MULTI_FETCH, frames)).parts
    except BrokerError as error:
        return [error] * len(fetched)
    asked = [(o.tp.topic, o.tp.partition) for o in fetched]
    if [(p.topic, p.partition) for p in parts] != asked:
        raise MalformedReply(f"a MULTI_FETCH reply's parts are not those asked for, {asked}")
    replies: list[FetchReply | BrokerError] = []
    for part in parts:
        try:
            replies.append(decode_fetch_part(part))
        except BrokerError as error:
            replies.append(error)
    return replies


class FetchSession(Generic[R]):
    """The partitions a member of `group` owns (`owned`) and the fetches in flight for them,
    through `cluster`. `record_type` is what it buffers, decoded from the fetched bytes;
    `reset` where a partition without a committed offset (or whose offset retention deleted)
    is read from; `fetch_bytes` what a partition's fetch asks at first; `skip_corrupt` reads
    past damaged data (listed in `skipped`) instead of raising it; `clock` times the rests
    after errors and the fetches overdue. It holds no thread and waits only in `receive` (and
    the METADATA and OFFSETS requests of `locate`, `start` and the resets): GroupConsumer
    drives it; AsyncGroupConsumer sends the fetches on asyncio, taking `next_fetches`,
    `on_reply` and `reset_out_of_range` from it. Not safe to share between threads."""

    def __init__(
        self,
        cluster: Cluster,
        group: str,
        *,
        record_type: type[R],
        reset: Reset,
        fetch_bytes: int,
        timeout_s: float,
        skip_corrupt: bool,
        clock: Clock,
        log: logging.Logger,
    ) -> None:
        self.cluster = cluster
        self.group = group
        self.record_type = record_type
        self.reset: Reset = reset
        self.fetch_bytes = fetch_bytes
        self.timeout_s = timeout_s
        self.skip_corrupt = skip_corrupt
        self.clock = clock
        self.log = log
        self.skipped: list[tuple[BrokerPartition, int, int]] = []
        """The damaged ranges read past with `skip_corrupt`: partition, [start, end) offsets."""
        self.offset_resets = 0
        """Partitions read from `reset` because their committed offset was out of range."""
        self.owned: dict[BrokerPartition, Owned] = {}
        self._in_flight: dict[tuple[Connection, int], list[Owned]] = {}
        """The fetches in flight, each of one partition (FETCH) or of several at one broker
        (MULTI_FETCH), by connection and correlation id."""
        self._rotation = 0
        """Where a MULTI_FETCH's parts start among a broker's partitions: moved on each time,
        so that a reply full of the first parts' messages starves none of the others."""

    def positions(self) -> dict[BrokerPartition, int]:
        """Each owned partition's position: the offset after the last processed record."""
        return {tp: owned.position for tp, owned in self.owned.items()}

    def at_end(self) -> dict[BrokerPartition, int]:
        """The owned partitions read to their end: every record fetched handed out, up to the
        high watermark their last fetch reply gave, each with that end (Kafka's partition
        EOF)."""
        return {
            tp: owned.known_end
            for tp, owned in self.owned.items()
            if not owned.buffered and owned.delivered == owned.known_end
        }

    def by_number(self) -> dict[tuple[str, int], Owned]:
        """The owned partitions by (topic, partition number)."""
        return {(tp.topic, tp.partition): owned for tp, owned in self.owned.items()}

    def among(self, partitions: Iterable[tuple[str, int]]) -> list[Owned]:
        """The owned partitions of `partitions` (topic, partition), in their order; ValueError
        naming those this member does not own."""
        by_number = self.by_number()
        wanted = list(partitions)
        others = sorted(
            f"{topic}/{number}" for topic, number in wanted if (topic, number) not in by_number
        )
        if others:
            raise ValueError(f"{', '.join(others)} not assigned to this member")
        return [by_number[key] for key in wanted]

    def any_buffered(self) -> bool:
        return any(owned.buffered for owned in self.owned.values())

    def hand_out(self) -> R | None:
        """The next record fetched and not handed out, now in hand (delivered); None when
        there is none."""
        for owned in self.owned.values():
            buffered = owned.buffered
            if buffered:
                record: R = buffered.popleft()
                owned.delivered = buffered[0][OFFSET_AT] if buffered else owned.fetch_offset
                return record
        return None

    def hand_out_many(self, limit: int) -> list[R]:
        """Up to `limit` records fetched and not handed out, now in hand (delivered), each
        partition's in order."""
        records: list[R] = []
        for owned in self.owned.values():
            buffered = owned.buffered
            if not buffered:
                continue
            take = min(limit - len(records), len(buffered))
            if take == len(buffered):
                records += buffered
                buffered.clear()
            else:
                records += [buffered.popleft() for _ in range(take)]
            owned.delivered = buffered[0][OFFSET_AT] if buffered else owned.fetch_offset
            if len(records) >= limit:
                break
        return records

    def take_buffered(self) -> list[R]:
        """Every record fetched and not handed out, now handed out (delivered)."""
        records: list[R] = []
        for owned in self.owned.values():
            if owned.buffered:
                records += owned.buffered
                owned.buffered.clear()
                owned.delivered = owned.fetch_offset  # a batch is one whole reply
        return records

    def forget_fetched(self, owned: Owned) -> None:
        """Drop what was fetched for `owned`'s partition and not handed out, and forget its
        fetch in flight: its reply, if it comes, is dropped, and the broker's other partitions
        of that request are fetched again."""
        if owned.in_flight is not None:
            fetched = self._in_flight.pop(owned.in_flight)
            for other in fetched:
                other.in_flight = None
            owned.in_flight = None
        owned.buffered.clear()

    def stop(self) -> None:
        """Forget fetches in flight and messages not handed out (their late replies are
        dropped), and records handed out but not processed: fetching resumes after the last
        processed record."""
        self._in_flight.clear()
        for owned in self.owned.values():
            owned.in_flight = None
            owned.buffered.clear()
            owned.fetch_offset = owned.delivered = owned.position

    def send(self, wait_s: float) -> None:
        """Fetch from each broker with no fetch of this member in flight its owned partitions
        not resting (`next_fetches`): one request a broker, a MULTI_FETCH for two partitions
        or more, a FETCH for one."""
        now = self.clock.monotonic()
        busy = {o.endpoint for o in self.owned.values() if o.in_flight is not None}
        by_endpoint: dict[str, list[Owned]] = {}
        for owned in self.owned.values():
            if owned.in_flight is not None or owned.rest_until > now or owned.paused:
                continue
            if not owned.located and not self.locate(owned):
                continue
            if owned.endpoint not in busy:  # else it goes with that broker's next
                by_endpoint.setdefault(owned.endpoint, []).append(owned)
        for endpoint, owned_there in self.next_fetches(by_endpoint, now).items():
            request = fetch_request(owned_there, wait_s)
            connection = self.cluster.connect(endpoint)
            key = (connection, connection.send_pipelined(request))
            for owned in owned_there:
                owned.in_flight, owned.sent_at = key, now
            self._in_flight[key] = owned_there

    def next_fetches(
        self, by_endpoint: dict[str, list[Owned]], now: float
    ) -> dict[str, list[Owned]]:
        """What each broker's next fetch asks (`fetch_round`) of the partitions it may, their
        order moved on by one from the last round's (`_rotation`), so that each in turn comes
        first and is read up to its fetch_bytes."""
        self._rotation += 1
        rounds = {}
        for endpoint, owned_there in by_endpoint.items():
            start = self._rotation % len(owned_there)
            rounds[endpoint] = fetch_round(owned_there[start:] + owned_there[:start], now)
        return rounds

    def receive(self, wait_s: float, news: threading.Event) -> None:
        """Wait up to `wait_s` for a first reply, then take every reply already there. The
        wait ends early, within NEWS_CHECK_S, when the heartbeat thread brings news (an
        assignment changed: partitions to give up are given up then, not at the long poll's
        end)."""
        if not self._in_flight:
            return
        deadline = self.clock.monotonic() + wait_s
        waits = self.cluster.clock  # the transport's, whatever the member's clock
        waited_until = waits.monotonic() + wait_s
        while self._in_flight:
            if any(o.buffered for o in self.owned.values()):
                timeout_s = 0.0  # data to hand out: take only the replies already here
            else:
                timeout_s = max(0.0, deadline - self.clock.monotonic())
            slice_s = min(timeout_s, NEWS_CHECK_S)
            connections = {connection for connection, _ in self._in_flight}
            try:
                connection, correlation_id, frames = self.cluster.receive_pipelined(
                    connections, slice_s
                )
            except Unavailable:
                if slice_s < timeout_s and waits.monotonic() < waited_until and not news.is_set():
                    continue  # a slice waited, no news: the long poll goes on
                break
            fetched = self._in_flight.pop((connection, correlation_id), None)
            if fetched is None:
                continue
            for owned, reply in zip(fetched, fetch_replies(fetched, frames), strict=True):
                owned.in_flight = None
                if self.owned.get(owned.tp) is not owned:
                    continue  # given up while the fetch was in flight
                if self.on_reply(owned, reply):
                    self.reset_out_of_range(owned)
        self._expire(wait_s)

    def _expire(self, wait_s: float) -> None:
        """Forget fetches whose reply is overdue (broker down): they are sent again later."""
        overdue = self.clock.monotonic() - wait_s - self.timeout_s
        for key, fetched in list(self._in_flight.items()):
            if fetched[0].sent_at < overdue:
                del self._in_flight[key]
                for owned in fetched:
                    owned.in_flight = None
                    owned.rest_until = self.clock.monotonic() + RETRY_BACKOFF_S
                    owned.located = False  # the broker may be down: another may lead now
                    self.log.warning("no reply to a fetch of %s from %s", owned.tp, owned.endpoint)

    def _follow_leader(self, owned: Owned, error: PylogError) -> None:
        """After a fetch of `owned` failed with a retriable `error` (or none came): fetch next
        from the leader a NOT_LEADER_FOR_PARTITION names (a broker known, epoch not older),
        else ask METADATA first (`locate`)."""
        tp = owned.tp
        self.cluster.learn_from(tp.topic, tp.partition, error)
        info = self.cluster.leaders.get((tp.topic, tp.partition))
        endpoint = None if info is None else self.cluster.endpoints.get(info.broker_id)
        if endpoint is None:
            owned.located = False
        else:
            owned.endpoint, owned.located = endpoint, True

    def locate(self, owned: Owned) -> bool:
        """Ask METADATA where `owned`'s partition is led now and fetch from there; False (the
        partition rests again) when no broker answers, or it has no leader yet."""
        tp = owned.tp
        try:
            self.cluster.metadata([tp.topic])
        except (BrokerError, Unavailable) as error:
            if isinstance(error, BrokerError) and not error.retriable:
                raise
            self.log.warning("group %s: where is %s led? %s", self.group, tp, error)
            owned.rest_until = self.clock.monotonic() + RETRY_BACKOFF_S
            return False
        info = self.cluster.leaders.get((tp.topic, tp.partition))
        endpoint = None
        if info is not None and info.error_code == ErrorCode.NONE:
            endpoint = self.cluster.endpoints.get(info.broker_id)
        if endpoint is None:
            owned.rest_until = self.clock.monotonic() + RETRY_BACKOFF_S
            return False
        owned.endpoint, owned.located = endpoint, True
        return True

    def on_reply(self, owned: Owned, fetched: FetchReply | BrokerError) -> bool:
        """Take a fetch reply of `owned`'s partition: its records buffered, or its error acted
        on. True when the fetch offset is out of range (deleted by retention?): the caller
        then calls `reset_out_of_range`, which asks the broker (I/O of its own)."""
        tp = owned.tp
        if isinstance(fetched, BrokerError):
            owned.known_end = -1
            error = fetched
            damage = corrupt_segment_reply(error, tp.topic, tp.partition)
            grown = grown_fetch_bytes(error, MAX_FETCH_BYTES)
            if damage is not None:
                self._damaged(owned, damage)
            elif error.code == ErrorCode.OFFSET_OUT_OF_RANGE:
                return True
            elif grown is not None:
                owned.fetch_bytes = grown
            elif error.retriable or error.code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION:
                owned.rest_until = self.clock.monotonic() + RETRY_BACKOFF_S
                self._follow_leader(owned, error)
            else:
                raise error
            return False
        base = owned.fetch_offset
        owned.known_end = fetched.high_watermark
        message_set = fetched.message_set
        records, failure = decode_records(
            message_set, base, self.record_type, tp.topic, tp.partition
        )
        owned.buffered = deque(records)
        if failure is None:  # past the last (decode may stop early: its budget)
            owned.fetch_offset = records[-1][NEXT_AT] if records else base
            return False
        damage = damaged_range(message_set, base, tp.topic, tp.partition, failure)
        if records:  # these first; the next fetch meets the damage
            owned.fetch_offset = damage.start
        else:
            self._damaged(owned, damage)
        return False

    def reset_out_of_range(self, owned: Owned) -> None:
        """Read an owned partition whose fetch offset is out of range from `reset` on (the
        partition rests a moment when the broker cannot say where that is now)."""
        tp = owned.tp
        try:
            offset = self.reset_offset(tp)
        except (Unavailable, BrokerError) as failure:
            if isinstance(failure, BrokerError) and not failure.retriable:
                raise
            owned.rest_until = self.clock.monotonic() + RETRY_BACKOFF_S
            return
        self.offset_resets += 1
        self.log.warning(
            "group %s: offset %d of %s/%d is out of range (deleted by retention?): "
            "reading from %s offset %d",
            self.group,
            owned.fetch_offset,
            tp.topic,
            tp.partition,
            self.reset,
            offset,
        )
        owned.fetch_offset = owned.position = owned.delivered = offset

    def _damaged(self, owned: Owned, damage: CorruptSegment) -> None:
        """At damaged data: raise it (the next poll fetches it again), or with skip_corrupt
        log it and fetch on after it (moving the position past it too when nothing before it
        is still in hand)."""
        if not self.skip_corrupt:
            raise damage
        self.log.warning("group %s: skipping damaged data: %s", self.group, damage)
        self.skipped.append((owned.tp, damage.start, damage.end))
        if owned.position == owned.delivered == damage.start:
            owned.position = owned.delivered = damage.end
        owned.fetch_offset = damage.end

    def broker_partitions(self, partitions: Sequence[TopicPartition]) -> list[BrokerPartition]:
        """`partitions` as BrokerPartitions: each with its preferred leader (from METADATA)
        as the broker its name gives."""
        self.cluster.metadata(sorted({tp.topic for tp in partitions}))
        named = []
        for topic, number in partitions:
            info = self.cluster.leaders.get((topic, number))
            broker = -1 if info is None else (info.replicas or (info.broker_id,))[0]
            named.append(BrokerPartition(topic, broker, number))
        return named

    def _leaders(self, claimed: Iterable[BrokerPartition]) -> dict[tuple[str, int], int]:
        """(topic, partition) -> its leader, by the METADATA `broker_partitions` asked just
        before, for the partitions of `claimed` that are led by a registered broker now (the
        others: fetched from their preferred leader, which answers where the leader is, or rest
        until METADATA knows)."""
        leaders = {}
        for tp in claimed:
            info = self.cluster.leaders.get((tp.topic, tp.partition))
            if info is None or info.error_code != ErrorCode.NONE:
                continue
            if info.broker_id in self.cluster.endpoints:
                leaders[tp.topic, tp.partition] = info.broker_id
        return leaders

    def start(
        self, claimed: Sequence[BrokerPartition], offsets: Mapping[BrokerPartition, int]
    ) -> list[BrokerPartition]:
        """Read `claimed` from their committed offsets (or `reset`); those that cannot be read
        now are returned, to be started again after RETRY_BACKOFF_S: no leader registered
        (their brokers down), or no answer from it to where `reset` starts. The others never
        wait for them."""
        leaders = self._leaders(claimed)
        endpoints: dict[BrokerPartition, str] = {}
        waiting: list[BrokerPartition] = []
        for tp in claimed:
            leader = leaders.get((tp.topic, tp.partition), tp.broker_id)
            endpoint = self.cluster.endpoints.get(leader)
            if endpoint is None:
                waiting.append(tp)
            else:
                endpoints[tp] = endpoint
        uncommitted = [tp for tp in endpoints if offsets.get(tp) is None]
        resets = self.reset_offsets(uncommitted, endpoints)
        for tp in endpoints:
            committed = offsets.get(tp)
            position = resets.get(tp) if committed is None else committed
            if position is None:
                waiting.append(tp)
                continue
            self.owned[tp] = Owned(
                tp,
                endpoints[tp],
                position,
                position,
                committed,
                position,
                fetch_bytes=self.fetch_bytes,
            )
        return waiting

    def reset_offsets(
        self, partitions: Sequence[BrokerPartition], endpoints: Mapping[BrokerPartition, str]
    ) -> dict[BrokerPartition, int]:
        """reset_offset of each of `partitions`, the OFFSETS requests sent to their leaders
        (`endpoints`) together, one round trip for them all; one not answered so (an error, a
        leader moved) is asked again alone, as reset_offset asks, and left out when that
        fails too with an error to retry (its leader down)."""
        time_ = EARLIEST if self.reset == "earliest" else LATEST
        asked: dict[tuple[Connection, int], BrokerPartition] = {}
        for tp in partitions:
            connection = self.cluster.connect(endpoints[tp])
            request = OffsetsRequest(tp.topic, tp.partition, time_)
            asked[connection, connection.send_pipelined(request)] = tp
        offsets: dict[BrokerPartition, int] = {}
        deadline = self.clock.monotonic() + self.timeout_s
        while asked:
            try:
                connection, correlation_id, frames = self.cluster.receive_pipelined(
                    {connection for connection, _ in asked},
                    max(0.0, deadline - self.clock.monotonic()),
                )
            except Unavailable:
                break  # those left are asked alone
            key = (connection, correlation_id)
            if key not in asked:
                continue
            tp = asked.pop(key)
            try:
                offsets[tp] = decode_reply(Api.OFFSETS, frames).offset
            except BrokerError:
                continue  # asked alone below: it follows the leader, retries, raises
        for tp in partitions:
            if tp not in offsets:
                try:
                    offsets[tp] = self.reset_offset(tp)
                except (Unavailable, BrokerError) as error:
                    if isinstance(error, BrokerError) and not error.retriable:
                        raise
                    self.log.warning("group %s: where does %s start? %s", self.group, tp, error)
        return offsets

    def reset_offset(self, tp: BrokerPartition) -> int:
        """The earliest or latest offset (`reset`) of `tp`, asked of its leader
        (Cluster.call_leader: followed when it moves)."""
        time_ = EARLIEST if self.reset == "earliest" else LATEST
        request = OffsetsRequest(tp.topic, tp.partition, time_)
        return self.cluster.call_leader(request, 3).offset
