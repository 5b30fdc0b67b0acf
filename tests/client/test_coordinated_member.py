"""GroupConsumer through the group's coordinator (`broker` given, no ZooKeeper; docs/protocol.md
"Consumer groups"), against a real pylogd: members share the partitions, a member joining takes
its share while the others read on, a clean hand-over (a join, a close) delivers nothing twice
and loses nothing, a member whose lease ran out hands out nothing, and a removed member's late
commit is refused."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections import Counter
from typing import Any

import pytest

from broker.aio import AsyncGroupConsumer
from broker.client import Admin, GroupConsumer, Producer
from broker.client.coordinator import GroupCalls
from broker.errors import BrokerUnknownMemberId
from broker.groups.assignors import TopicPartition
from tests.conftest import FakeClock, wait_until
from tests.pylogd import RunningBroker

PARTITIONS = 4
PER_PARTITION = 25
SESSION_S = 2.0


@pytest.fixture
def loaded(broker: RunningBroker, topic: str) -> str:
    """`topic` of PARTITIONS partitions, PER_PARTITION messages in each."""
    with Admin(broker.endpoint) as admin:
        admin.create_topic(topic, PARTITIONS)
    with Producer(broker.endpoint, topic) as producer:
        sent = [
            producer.send(f"{p}-{i}".encode(), partition=p)
            for p in range(PARTITIONS)
            for i in range(PER_PARTITION)
        ]
        for delivery in sent:
            delivery.result(30)
    return topic


@pytest.fixture
def group() -> str:
    return f"members-{uuid.uuid4().hex[:8]}"


def member(broker: RunningBroker, group: str, topic: str, **options: object) -> GroupConsumer:
    """A member whose auto-commit waits a minute: what a hand-over commits is what gives up a
    partition and what close() commits."""
    return GroupConsumer(
        broker.endpoint,
        group,
        [topic],
        session_timeout_s=SESSION_S,
        auto_commit_interval_s=60,
        max_wait_ms=50,
        **options,  # type: ignore[arg-type]
    )


def owned(consumer: GroupConsumer) -> set[int]:
    return {tp.partition for tp in consumer.assignment}


def test_members_share_the_partitions_and_a_join_hands_over_without_duplicates(
    broker: RunningBroker, group: str, loaded: str
) -> None:
    """Two members, then a third joining: every message handed out exactly once, and the
    members that keep partitions never stop owning them."""
    seen: Counter[bytes] = Counter()
    members = [member(broker, group, loaded, consumer_id="a")]
    kept_by_a: list[set[int]] = []

    def poll_all() -> list[int]:
        """Poll each member once; how many partitions each owns then."""
        for consumer in members:
            seen.update(r.value for r in consumer.poll(50))
        kept_by_a.append(owned(members[0]))
        return [len(owned(m)) for m in members]

    try:
        wait_until(lambda: poll_all() == [PARTITIONS], what="a owns all")
        members.append(member(broker, group, loaded, consumer_id="b"))
        wait_until(
            lambda: poll_all() == [2, 2],
            what="a and b own two each",
        )
        members.append(member(broker, group, loaded, consumer_id="c"))
        deadline = time.monotonic() + 30
        while sum(seen.values()) < PARTITIONS * PER_PARTITION and time.monotonic() < deadline:
            poll_all()  # bounded: 100 messages, 30 s
        wait_until(
            lambda: sorted(poll_all()) == [1, 1, 2],
            what="the three share the partitions",
        )
    finally:
        for consumer in members:
            consumer.close()
    expected = {f"{p}-{i}".encode() for p in range(PARTITIONS) for i in range(PER_PARTITION)}
    assert set(seen) == expected
    assert [v for v, n in seen.items() if n > 1] == []
    # a partition a keeps is owned all along: from when a had it alone, through both joins
    final = kept_by_a[-1]
    assert final and all(final <= earlier for earlier in kept_by_a if len(earlier) >= len(final))


def test_a_closed_members_partitions_go_to_the_others_from_its_commit(
    broker: RunningBroker, group: str, loaded: str
) -> None:
    first = member(broker, group, loaded, consumer_id="first")
    seen: Counter[bytes] = Counter()

    def some_read() -> bool:
        seen.update(r.value for r in first.poll(50))
        return bool(seen)

    wait_until(some_read, what="a record")
    first.close()  # commits what it processed, gives its partitions up, leaves
    with member(broker, group, loaded, consumer_id="second") as second:
        deadline = time.monotonic() + 30
        while sum(seen.values()) < PARTITIONS * PER_PARTITION and time.monotonic() < deadline:
            seen.update(r.value for r in second.poll(50))  # bounded: 100 messages, 30 s
    assert sum(seen.values()) == len(seen) == PARTITIONS * PER_PARTITION


def test_a_member_whose_lease_ran_out_hands_out_nothing_and_its_late_commit_is_refused(
    broker: RunningBroker, group: str, loaded: str
) -> None:
    clock = FakeClock()
    zombie = member(broker, group, loaded, consumer_id="zombie", clock=clock)
    try:
        first = zombie.poll_record(5000)
        wait_until(lambda: zombie.poll_record(50) is not None, what="records flowing")
        assert first is not None
        heartbeats = zombie._heartbeats
        assert heartbeats is not None
        heartbeats.stop()  # as if frozen: no heartbeat goes out any more
        clock.advance(SESSION_S)  # its lease ran out: buffered records are not handed out
        assert zombie.poll(0) == [] and zombie.poll_record(0) is None
        with member(broker, group, loaded, consumer_id="heir") as heir:

            def heir_owns_all() -> bool:
                heir.poll(50)
                return len(owned(heir)) == PARTITIONS

            wait_until(
                heir_owns_all, what="the zombie removed at its session, the heir given everything"
            )
            with pytest.raises(BrokerUnknownMemberId):
                zombie.commit({(loaded, 0): 0})
            with GroupCalls(broker.endpoint, group) as calls:
                assert calls.committed([loaded]).get(TopicPartition(loaded, 0)) != 0
    finally:
        zombie.close()


@pytest.mark.parametrize("hand_out", ["poll_record", "poll_records"])
def test_records_fetched_before_the_lease_ran_out_are_not_handed_out_after(
    broker: RunningBroker, group: str, loaded: str, hand_out: str
) -> None:
    """A member frozen past its lease (a stopped heartbeat thread, a clock moved on) holds
    records it fetched before: none is handed out (poll_record is also what a step of `for
    record in member` takes), since another member may own their partition by now."""
    clock = FakeClock()
    frozen = member(broker, group, loaded, consumer_id="frozen", clock=clock)
    try:
        wait_until(lambda: frozen.poll_record(50) is not None, what="records flowing")
        owned = frozen.fetching.owned.values()
        assert any(o.buffered for o in owned)  # fetched, not handed out
        heartbeats = frozen._heartbeats
        assert heartbeats is not None
        heartbeats.stop()
        clock.advance(SESSION_S)
        if hand_out == "poll_record":
            assert frozen.poll_record(0) is None
        else:
            assert frozen.poll_records(10, 0) == []
    finally:
        frozen.close()


def test_a_static_member_closed_and_started_again_takes_its_partitions_back(
    broker: RunningBroker, group: str, loaded: str
) -> None:
    """An instance id (Kafka's group.instance.id): close() leaves the partitions to the
    instance for its session, and the instance started again within it is given them back,
    with no rebalance of the others."""
    other = member(broker, group, loaded, consumer_id="other")
    first = member(broker, group, loaded, consumer_id="first", instance_id="loader-a")
    try:

        def shared() -> bool:
            other.poll(20)
            first.poll(20)
            return len(owned(other)) == len(owned(first)) == 2

        wait_until(shared, what="the two share the partitions")
        mine = owned(first)
        with GroupCalls(broker.endpoint, group) as calls:
            epoch = calls.describe().group_epoch
            first.close()
            left = {m.member_id: m.left for m in calls.describe().members}
            assert left == {"first": True, "other": False}
            again = member(broker, group, loaded, consumer_id="again", instance_id="loader-a")
            try:
                wait_until(lambda: (again.poll(20), owned(again) == mine)[1], what="taken back")
                assert calls.describe().group_epoch == epoch  # no rebalance
                assert owned(other) == {0, 1, 2, 3} - mine
            finally:
                again.close()
    finally:
        first.close()
        other.close()


Told = list[frozenset[object]]


def slow_member(
    broker: RunningBroker, group: str, loaded: str
) -> tuple[GroupConsumer, FakeClock, Told, Told]:
    """Member "slow", its processing deadline 30 s on a fake clock; the clock, and the
    partitions it is told it gave up (on_revoked) and lost (on_lost)."""
    clock = FakeClock()
    revoked: Told = []
    lost: Told = []
    slow = member(
        broker,
        group,
        loaded,
        consumer_id="slow",
        clock=clock,
        max_poll_interval_s=30,
        on_revoked=revoked.append,
        on_lost=lost.append,
    )
    return slow, clock, revoked, lost


def share(slow: GroupConsumer, steady: GroupConsumer) -> None:
    wait_until(
        lambda: (slow.poll(20), steady.poll(20), len(owned(slow)) == 2)[2],
        what="the two share the partitions",
    )


def test_a_member_that_does_not_poll_within_its_deadline_leaves_and_joins_again(
    broker: RunningBroker, group: str, loaded: str
) -> None:
    """max_poll_interval_s (Kafka's max.poll.interval.ms): a member whose application has not
    polled for longer leaves by itself, its partitions go to the others; at its next poll it
    drops them (on_lost, uncommitted) and joins again."""
    slow, clock, revoked, lost = slow_member(broker, group, loaded)
    with member(broker, group, loaded, consumer_id="steady") as steady:
        try:
            share(slow, steady)
            revoked_before = len(revoked)  # a hand-over when steady joined, maybe
            clock.advance(30.1)  # the handler took longer than the deadline
            wait_until(
                lambda: (steady.poll(20), len(owned(steady)) == PARTITIONS)[1],
                what="the slow member left and the steady one took its partitions",
            )
            slow.poll(0)  # at last: it drops what it held (lost: not committed), joins again
            assert [len(partitions) for partitions in lost] == [2] and owned(slow) == set()
            assert revoked[revoked_before:] == []  # nothing was given up with a commit
            wait_until(
                lambda: (slow.poll(20), steady.poll(20), len(owned(slow)) == 2)[2],
                what="the slow member back in the group",
            )
        finally:
            slow.close()


def test_a_slow_handler_within_its_deadline_keeps_its_partitions(
    broker: RunningBroker, group: str, loaded: str
) -> None:
    """A handler that takes 29 s of a 30 s processing deadline, twice in a row (the deadline
    runs from each poll): the heartbeats, from a thread of their own, keep the member in the
    group, so it keeps its partitions, is told of no revocation, and commits after."""
    slow, clock, revoked, lost = slow_member(broker, group, loaded)
    with member(broker, group, loaded, consumer_id="steady") as steady:
        try:
            share(slow, steady)
            mine, revoked_before = owned(slow), len(revoked)
            for _ in range(2):
                clock.advance(29.0)  # the handler, just under the deadline
                wait_until(  # a heartbeat sent since the handler started, answered
                    lambda: slow.connected, what="the slow member's lease renewed"
                )
                with GroupCalls(broker.endpoint, group) as calls:
                    described = {m.member_id: m for m in calls.describe().members}
                assert {p for t in described["slow"].assigned for p in t.partitions} == mine
                steady.poll(20)
                slow.poll(20)  # the next record asked for: the deadline starts again
                assert owned(slow) == mine and owned(steady) == {0, 1, 2, 3} - mine
            assert revoked[revoked_before:] == [] and lost == []
            slow.commit()  # still its partitions: accepted
        finally:
            slow.close()


@pytest.mark.parametrize("kind", ["GroupConsumer", "AsyncGroupConsumer"])
def test_a_member_waiting_in_a_long_poll_gives_partitions_up_within_it(
    broker: RunningBroker, group: str, topic: str, kind: str
) -> None:
    """A member whose poll waits up to 10 s on partitions with nothing new: when another member
    joins, the first gives up half of them within its wait (it did at the wait's end, and the
    joiner waited that long for them)."""
    with Admin(broker.endpoint) as admin:
        admin.create_topic(topic, PARTITIONS)
    ready, stop = threading.Event(), threading.Event()
    options: dict[str, Any] = {"session_timeout_s": SESSION_S, "max_wait_ms": 10_000}
    deadline = time.monotonic() + 30

    def poll_first() -> None:  # each poll up to 10 s: nothing comes
        with GroupConsumer(broker.endpoint, group, [topic], **options) as first:
            while len(first.assignment) < PARTITIONS and time.monotonic() < deadline:
                first.poll(50)
            ready.set()
            while not stop.is_set():
                first.poll()

    async def poll_first_async() -> None:
        async with AsyncGroupConsumer(broker.endpoint, group, [topic], **options) as first:
            while len(first.assignment) < PARTITIONS and time.monotonic() < deadline:
                await first.poll(50)
            ready.set()
            while not stop.is_set():
                await first.poll()

    run = poll_first if kind == "GroupConsumer" else lambda: asyncio.run(poll_first_async())
    polling = threading.Thread(target=run)
    polling.start()
    try:
        wait_until(ready.is_set, 30, "the first member owning every partition")
        with member(broker, group, topic, consumer_id="second") as second:
            joined_at = time.monotonic()
            while len(owned(second)) < PARTITIONS // 2 and time.monotonic() < deadline:
                second.poll(50)  # bounded by the deadline
            given_after_s, given = time.monotonic() - joined_at, owned(second)
    finally:
        stop.set()
        polling.join(15)
    assert len(given) == PARTITIONS // 2
    assert given_after_s < 5.0  # heartbeats 1 s apart, then at once: not 10 s
