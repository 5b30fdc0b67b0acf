"""A group member as Kafka users expect one: it needs only a broker's address (it joins
through the group's coordinator, docs/protocol.md "Consumer groups"), a rebalance that moves
none of its partitions keeps its positions, and it seeks and commits chosen offsets."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from broker.aio import AsyncGroupConsumer
from broker.aio import group as aio_group
from broker.client import Admin, GroupConsumer, PartitionConsumer, Producer, Record
from broker.client import group_fetch as sync_group
from broker.client.coordinator import GroupCalls
from broker.client.group_fetch import FETCH_ROUND_BYTES, IDLE_ASK_S, fetch_round
from broker.client.records import BrokerPartition, Owned
from broker.errors import AuthenticationFailed
from broker.groups.assignors import TopicPartition
from broker.log.message import encode_message
from broker.zookeeper import PrivateZooKeeper
from tests.conftest import FakeClock, reply_waiting, single_box_flags, wait_until
from tests.pylogd import RunningBroker


@pytest.fixture
def kafka_topic(broker: RunningBroker, topic: str) -> str:
    with Admin(broker.endpoint) as admin:
        admin.create_topic(topic, partitions=2)
    return topic


def produce(broker: RunningBroker, topic: str, values: list[str], partition: int = 0) -> list[int]:
    """Produce `values` to `partition`; their offsets."""
    with Producer(broker.endpoint, topic) as producer:
        sent = [producer.send(value.encode(), partition=partition) for value in values]
        return [delivery.result(30) for delivery in sent]


def test_a_group_member_needs_only_a_brokers_address(
    broker: RunningBroker, kafka_topic: str
) -> None:
    produce(broker, kafka_topic, ["through a broker"], partition=1)
    with GroupConsumer(broker.endpoint, "by-broker", [kafka_topic]) as member:
        records: list[Record] = []
        deadline = time.monotonic() + 30
        while not records and time.monotonic() < deadline:  # bounded: one message
            records = member.poll(500)
    assert [r.value for r in records] == [b"through a broker"]
    with pytest.raises(TypeError, match="zookeeper"):
        GroupConsumer(broker.endpoint, "g", [kafka_topic], zookeeper="127.0.0.1:2181")  # type: ignore[call-arg]


def test_zookeepers_address_given_as_a_brokers_is_named_in_the_error(
    zookeeper: PrivateZooKeeper,
) -> None:
    """A member of the paper's protocol took ZooKeeper's address; given it now, the member's
    first polls raise what its join met (its heartbeat thread died of it, every poll returned
    nothing), and the error names the likely cause."""
    with (
        GroupConsumer(zookeeper.connect_string, "g", ["t"], timeout_s=1) as member,
        pytest.raises(AuthenticationFailed, match="ZooKeeper's address given as a broker's"),
    ):
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:  # bounded: three broken handshakes, then raised
            member.poll(100)

    async def async_member() -> None:
        async with AsyncGroupConsumer(zookeeper.connect_string, "g", ["t"], timeout_s=1) as m:
            async with asyncio.timeout(15):
                async for _ in m:  # bounded: 15 s
                    pass

    with pytest.raises(AuthenticationFailed, match="ZooKeeper's address given as a broker's"):
        asyncio.run(async_member())


def committed_offset(broker: RunningBroker, group: str, topic: str, partition: int) -> int | None:
    """The group's committed offset of `partition`, asked of its coordinator."""
    with GroupCalls(broker.endpoint, group) as calls:
        return calls.committed([topic]).get(TopicPartition(topic, partition))


def test_a_member_without_auto_commit_is_not_sent_back_by_a_rebalance_that_moves_nothing(
    broker: RunningBroker, kafka_topic: str
) -> None:
    """Each start of a member sees its watches fire more than once; a rebalance that leaves its
    range as it is keeps its positions (before, it went back to the committed offsets, and a
    member without auto-commit read its first messages twice)."""
    produce(broker, kafka_topic, [f"m{i}" for i in range(20)])
    with GroupConsumer(
        broker.endpoint, "no-auto", [kafka_topic], auto_commit_interval_s=None
    ) as member:
        values: list[bytes] = []
        deadline = time.monotonic() + 30
        while len(values) < 20 and time.monotonic() < deadline:  # bounded: 20 messages
            values += [r.value for r in member.poll(200)]
        for _ in range(5):  # what a rebalance would send back comes within these
            values += [r.value for r in member.poll(200)]
    assert sorted(values) == sorted(b"m%d" % i for i in range(20))


def next_record(member: GroupConsumer) -> Record | None:
    """The member's next record, polled for up to 30 s (it joins and claims first)."""
    record = None
    deadline = time.monotonic() + 30
    while record is None and time.monotonic() < deadline:  # bounded: one message
        record = member.poll_record(200)
    return record


def test_auto_commit_waits_for_its_interval_on_the_members_clock(
    broker: RunningBroker, kafka_topic: str, clock: FakeClock
) -> None:
    offsets = produce(broker, kafka_topic, ["a", "b", "c"])
    with GroupConsumer(
        broker.endpoint, "timed", [kafka_topic], auto_commit_interval_s=5, clock=clock
    ) as member:
        first = next_record(member)
        [partition] = [tp for tp in member.assignment if tp.partition == 0]
        second = member.poll_record(5000)  # "a" is processed: its position could be committed
        assert first is not None and second is not None
        assert (first.value, second.value) == (b"a", b"b")
        assert committed_offset(broker, "timed", kafka_topic, partition.partition) is None
        clock.advance(5)  # the interval is up: the next step commits what was processed
        third = member.poll_record(5000)
        assert third is not None and third.value == b"c"
        committed = committed_offset(broker, "timed", kafka_topic, partition.partition)
        assert committed == offsets[2]  # after "b", which the step took as processed


def test_poll_records_hands_out_up_to_its_limit_in_order_and_counts_them_processed_next(
    broker: RunningBroker, kafka_topic: str, clock: FakeClock
) -> None:
    # What Consumer.consume(n) takes in one call: the records poll_record would hand out one by
    # one, each partition's in order, those of a call processed (auto-committed) at the next.
    offsets = produce(broker, kafka_topic, [f"m{i}" for i in range(7)])
    with GroupConsumer(
        broker.endpoint,
        "batched",
        [kafka_topic],
        auto_commit_interval_s=5,
        clock=clock,
    ) as member:
        first: list[Record] = []
        deadline = time.monotonic() + 30
        while not first and time.monotonic() < deadline:  # bounded: it joins, then fetches
            first = member.poll_records(3, 200)
        [partition] = [tp for tp in member.assignment if tp.partition == 0]
        clock.advance(5)  # the interval is up: the next call commits what was processed
        rest = member.poll_records(10, 5000)
        assert [r.value for r in first] == [b"m0", b"m1", b"m2"]
        assert [r.value for r in rest] == [b"m3", b"m4", b"m5", b"m6"]
        committed = committed_offset(broker, "batched", kafka_topic, partition.partition)
        assert committed == offsets[3]  # after the first call's three, not the second's
        with pytest.raises(ValueError, match="1 or more"):
            member.poll_records(0)


def test_seek_and_commit_of_chosen_offsets(broker: RunningBroker, kafka_topic: str) -> None:
    offsets = produce(broker, kafka_topic, [f"m{i}" for i in range(6)])

    def member_of_chosen() -> GroupConsumer:
        return GroupConsumer(broker.endpoint, "chosen", [kafka_topic], auto_commit_interval_s=None)

    with member_of_chosen() as member:
        first = next_record(member)
        assert first is not None and first.value == b"m0"
        assert first.next_offset == offsets[1]
        member.seek(kafka_topic, 0, offsets[4])
        again = member.poll_record(5000)
        assert again is not None and (again.value, again.offset) == (b"m4", offsets[4])
        member.commit({(kafka_topic, 0): offsets[2]})
        with pytest.raises(ValueError, match="not assigned"):
            member.commit({(kafka_topic, 9): 0})
        with pytest.raises(ValueError, match="not assigned"):
            member.seek(kafka_topic, 9, 0)
    with member_of_chosen() as member:
        resumed = next_record(member)
        assert resumed is not None and resumed.value == b"m2"


def test_a_wait_given_in_seconds_is_refused_not_taken_as_milliseconds(
    broker: RunningBroker, kafka_topic: str
) -> None:
    """poll(1.0), written as a timeout in seconds, was a wait of 1 ms (issue 32)."""
    with GroupConsumer(broker.endpoint, "seconds", [kafka_topic]) as member:
        with pytest.raises(TypeError, match=r"milliseconds, an int, not 1\.0: poll\(1000\)"):
            member.poll(1.0)  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="milliseconds"):
            member.poll_record(0.5)  # type: ignore[arg-type]
        assert member.poll(10) == []
    with PartitionConsumer(broker.endpoint, kafka_topic, 0) as consumer:
        with pytest.raises(TypeError, match="milliseconds"):
            consumer.poll(1.0)  # type: ignore[arg-type]
        assert consumer.poll(0) == []


@pytest.mark.parametrize("kind", ["GroupConsumer", "AsyncGroupConsumer"])
def test_a_member_fetches_its_partitions_of_a_broker_in_one_request(
    make_pylogd: Callable[..., RunningBroker], tmp_path: Path, kind: str
) -> None:
    """A member owning six partitions of one broker (over its two workers) sends it one
    MULTI_FETCH a round, not a FETCH a partition (docs/protocol.md, MULTI_FETCH), and reads
    every message of each; broker.aio's member as well."""
    broker = make_pylogd(
        *single_box_flags(tmp_path), "--metrics-enabled", "true", "--metrics-port", "0"
    )
    with Admin(broker.endpoint) as admin:
        admin.create_topic("spread", partitions=6)
    expected = set()
    for partition in range(6):
        values = [f"p{partition}-{i}" for i in range(10)]
        produce(broker, "spread", values, partition=partition)
        expected |= {v.encode() for v in values}
    seen: set[bytes] = set()
    deadline = time.monotonic() + 30
    if kind == "GroupConsumer":
        with GroupConsumer(broker.endpoint, "by-broker", ["spread"]) as member:
            while seen != expected and time.monotonic() < deadline:  # bounded: 60 messages
                seen |= {r.value for r in member.poll(200)}
    else:

        async def consume() -> None:
            async with AsyncGroupConsumer(
                broker.endpoint, "by-broker-aio", ["spread"], max_wait_ms=200
            ) as member:
                async with asyncio.timeout(30):
                    async for record in member:  # bounded: 60 messages, 30 s
                        seen.add(record.value)
                        if seen == expected:
                            break

        asyncio.run(consume())
    assert seen == expected

    def requests() -> dict[str, float]:  # by api, as the workers last reported them
        return {
            dict(labels)["api"]: value
            for (name, labels), value in broker.metrics().items()
            if name == "pylog_requests_total"
        }

    wait_until(lambda: requests().get("multi_fetch", 0) > 0, 30, "MULTI_FETCH counted")
    assert requests().get("fetch", 0) == 0


def test_a_member_sends_its_next_fetch_before_handing_out_what_it_fetched(
    broker: RunningBroker, topic: str
) -> None:
    """As PartitionConsumer does: the broker reads the next records while the application
    processes these."""
    with Admin(broker.endpoint) as admin:
        admin.create_topic(topic, partitions=1)
    names = [f"m{i}" for i in range(5)]
    produce(broker, topic, names)
    size = len(encode_message(b"m0"))
    with GroupConsumer(
        broker.endpoint, "ahead", [topic], fetch_bytes=size, max_wait_ms=0
    ) as member:
        first: list[Record] = []
        deadline = time.monotonic() + 30
        while not first and time.monotonic() < deadline:  # bounded: it joins first
            first = member.poll(200)
        assert [r.value for r in first] == [b"m0"]
        (owned,) = member.fetching.owned.values()
        # The fetch of m1 went out before m0 was handed out: its reply is waiting.
        assert reply_waiting(member.cluster.connect(owned.endpoint), 5)
        rest: list[bytes] = []
        while len(rest) < 4 and time.monotonic() < deadline:  # bounded: 4 messages
            rest += [r.value for r in member.poll(200)]
        assert rest == [b"m1", b"m2", b"m3", b"m4"]


def owned_at(partition: int, fetch_offset: int, known_end: int, sent_at: float = 0.0) -> Owned:
    owned = Owned(BrokerPartition("t", 1, partition), "tcp://b", 0, 0, None, fetch_offset)
    owned.known_end, owned.sent_at = known_end, sent_at
    return owned


def test_a_fetch_round_asks_only_the_partitions_known_to_hold_a_replys_worth() -> None:
    """While the last replies say FETCH_ROUND_BYTES wait, the first partitions in the round's
    order that hold it are asked, and those not asked for IDLE_ASK_S with them; else all."""
    now = 100.0
    recent = now - IDLE_ASK_S / 2
    caught_up = owned_at(0, 500, 500, recent)
    small = owned_at(1, 0, 1000, recent)
    big = owned_at(2, 0, 3 * FETCH_ROUND_BYTES, recent)
    after = owned_at(3, 0, 2 * FETCH_ROUND_BYTES, recent)
    unasked = owned_at(4, 0, 0, now - IDLE_ASK_S)
    assert fetch_round([caught_up, small, big, after, unasked], now) == [small, big, unasked]
    # Known data is counted up to a partition's fetch_bytes: two of them hold a round.
    big.fetch_bytes = after.fetch_bytes = FETCH_ROUND_BYTES // 2
    assert fetch_round([big, after, small], now) == [big, after]
    # Less than a round known: all of them, in one long poll.
    assert fetch_round([caught_up, small], now) == [caught_up, small]
    assert fetch_round([owned_at(5, 0, 0), owned_at(6, 0, 0)], now) != []


@pytest.mark.parametrize("kind", ["GroupConsumer", "AsyncGroupConsumer"])
def test_a_member_reading_a_backlog_asks_only_the_partitions_that_hold_it(
    broker: RunningBroker, topic: str, monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    """Over 20 partitions of one broker, one holding 3 MiB, the others a message each: once the
    first round told where the backlog is, rounds ask only the partitions that hold it (a
    reply has room for about 1 MiB; the 19 others would be answered empty, at a cost a part
    on both sides), and every message is read once, each partition's in order."""
    with Admin(broker.endpoint) as admin:
        admin.create_topic(topic, partitions=20)
    value = b"x" * 1000
    with Producer(broker.endpoint, topic, batch_messages=500) as producer:
        deliveries = [producer.send(value, partition=0) for _ in range(3000)]
        deliveries += [producer.send(b"p%d" % p, partition=p) for p in range(1, 20)]
        for delivery in deliveries:
            delivery.result(30)
    asked: list[int] = []
    module = sync_group if kind == "GroupConsumer" else aio_group
    real = module.fetch_request

    def fetch_request(owned: Any, wait_s: float) -> Any:
        asked.append(len(owned))
        return real(owned, wait_s)

    monkeypatch.setattr(module, "fetch_request", fetch_request)
    read: list[Record] = []
    deadline = time.monotonic() + 60
    if kind == "GroupConsumer":
        with GroupConsumer(broker.endpoint, "backlog", [topic]) as member:
            while len(read) < 3019 and time.monotonic() < deadline:  # bounded: 3,019
                read += member.poll(200)
    else:

        async def consume() -> None:
            async with AsyncGroupConsumer(
                broker.endpoint, "backlog-aio", [topic], max_wait_ms=200
            ) as member:
                async with asyncio.timeout(60):
                    async for record in member:  # bounded: 3,019 messages, 60 s
                        read.append(record)
                        if len(read) == 3019:
                            break

        asyncio.run(consume())
    assert len(read) == 3019
    zero = [r.offset for r in read if r.partition == 0]
    assert len(set(zero)) == 3000 and zero == sorted(zero)
    assert {r.value for r in read if r.partition} == {b"p%d" % p for p in range(1, 20)}
    assert asked[0] == 20
    assert min(asked) < 20, asked  # a round of the backlog's partitions only
