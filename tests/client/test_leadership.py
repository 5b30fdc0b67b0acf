"""Clients follow leadership on their own (docs/replication.md, "Clients"): three real brokers,
a replicated topic, and leadership moved as the controller moves it (a conditional write of the
partition's state node, the epoch raised) while a producer at ack=all sends and a consumer
reads. Every send is acknowledged, the consumer reads every message in order with no gap
(a batch sent again after NOT_LEADER_FOR_PARTITION may be stored twice: at least once)."""

from __future__ import annotations

import asyncio
import itertools
import os
import signal
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from functools import partial

import pytest

from broker.aio import AsyncGroupConsumer, AsyncPartitionConsumer, AsyncProducer
from broker.client import Admin, Cluster, PartitionConsumer, Producer, TopicConsumer
from broker.client.batches import Delivery
from broker.client.group import GroupConsumer
from broker.errors import NotLeaderForPartition, UnknownTopicOrPartition
from broker.groups.lag import GroupReader
from broker.log.message import Message
from broker.protocol import (
    LATEST,
    Ack,
    ErrorCode,
    FetchRequest,
    MetadataReply,
    MetadataRequest,
    OffsetsRequest,
    encode_error,
)
from broker.registry import PartitionState, Registry
from tests.client.router import serving
from tests.client.test_error_fields import TOPIC, FakePartition
from tests.conftest import wait_until
from tests.pylogd import ThreeBrokers

REPLICATED = {"replication_factor": "3", "min_insync_replicas": "2"}
MESSAGES = 600
DEADLINE_S = 60.0


THREE_BROKERS_FLAGS = (
    "--broker-replica-lag-max-ms",
    "2000",
    "--broker-replica-fetch-wait-ms",
    "200",
)
"""Followers long-poll 200 ms, and one behind for 2 s leaves the ISR. The three brokers are
shared by the module's tests (shared_three_brokers): each uses topics and groups of its own."""


def create_replicated(
    endpoints: dict[int, str], topic: str, partitions: int, config: dict[str, str] = REPLICATED
) -> None:
    """Create `topic` at replication factor 3, and wait until every broker's METADATA lists
    it (CREATE_TOPIC returns once the leaders serve it: a follower's watch may be later)."""
    with Admin(endpoints[1]) as admin:
        admin.create_topic(topic, partitions, config)

    def everywhere() -> bool:
        for endpoint in endpoints.values():
            with Cluster(endpoint) as cluster:
                try:
                    cluster.partitions(topic)
                except UnknownTopicOrPartition:
                    return False
        return True

    wait_until(everywhere, what=f"every broker lists {topic}")


def move_leadership(registry: Registry, topic: str, partition: int) -> int:
    """Move the leadership of `partition` to the next broker of its ISR, as the controller does
    (the epoch raised, written conditionally); the new leader."""
    state, version = registry.topics.partition_state(topic, partition)
    isr = sorted(state.isr)
    assert len(isr) > 1, f"no other in-sync replica to lead: {state}"
    leader = isr[(isr.index(state.leader) + 1) % len(isr)] if state.leader in isr else isr[0]
    incarnation = registry.brokers.epochs()[leader]
    moved = PartitionState(
        leader, state.leader_epoch + 1, state.isr, state.controller_epoch, incarnation
    )
    registry.topics.write_partition_state(topic, partition, moved, version)
    return leader


def answers_as_leader(endpoint: str, topic: str, partition: int) -> bool:
    """Whether the broker at `endpoint` serves FETCH of the partition (it took up leading)."""
    with Cluster(endpoint) as cluster:
        try:
            cluster.connect(endpoint).request(FetchRequest(topic, partition, 0, 1024, 0, 0))
        except NotLeaderForPartition:
            return False
    return True


def bootstrap(endpoints: dict[int, str]) -> str:
    """Every broker's address, comma-separated: a group member finds its group's coordinator
    through them."""
    return ",".join(endpoints[b] for b in sorted(endpoints))


def values(count: int) -> list[bytes]:
    return [b"message-%06d" % i for i in range(count)]


Read = list[tuple[int, bytes]]
"""What a consumer read: (offset, value) pairs, in the order read."""


def check_read(read: Read, sent: list[bytes], sizes: list[int] | None = None) -> None:
    """Everything sent read, in the order sent, offsets rising (without a gap when `sizes`,
    each message's size, are given); a message read twice only as a copy stored again (a batch
    sent again), after its first."""
    for i, ((before, _), (after, _)) in enumerate(itertools.pairwise(read)):
        assert after > before, "read twice, or out of offset order"
        if sizes is not None:
            assert after == before + sizes[i], "a gap"
    new = 0
    for _, value in read:
        if new < len(sent) and value == sent[new]:
            new += 1
        else:
            assert value in sent[:new], f"{value!r} out of order"
    assert new == len(sent)


def produce_and_read_across_moves(
    endpoints: dict[int, str], registry: Registry, topic: str, poll: Callable[[], Read]
) -> tuple[list[int], Read]:
    """Send MESSAGES messages to partition 0 of `topic` at ack=all from a thread, one batch in
    flight, while `poll` reads in this one; move the partition's leadership after a third and
    after two thirds were read. The offsets acknowledged, and what was read."""
    sent = values(MESSAGES)
    deliveries: list[Delivery] = []
    failure: list[BaseException] = []

    def produce() -> None:
        try:
            with Producer(
                endpoints[1], topic, ack=Ack.ALL, batch_messages=10, max_in_flight=1
            ) as producer:
                for value in sent:
                    deliveries.append(producer.send(value, partition=0))
                    time.sleep(0.002)  # spread the sends over the moves
        except BaseException as error:  # the test thread raises it
            failure.append(error)

    producer = threading.Thread(target=produce)
    producer.start()
    read: Read = []
    moves: list[int] = []
    try:
        deadline = time.monotonic() + DEADLINE_S
        while len({value for _, value in read}) < MESSAGES and time.monotonic() < deadline:
            read += poll()
            if len(moves) < 2 and len(read) >= (len(moves) + 1) * MESSAGES // 3:
                leader = move_leadership(registry, topic, 0)
                moves.append(leader)
                wait_until(partial(answers_as_leader, endpoints[leader], topic, 0))
            assert not failure, failure
    finally:
        producer.join(DEADLINE_S)
    assert not producer.is_alive() and not failure, failure
    assert len(moves) == 2
    offsets = [d.result(0) for d in deliveries]
    assert len(offsets) == MESSAGES
    check_read(read, sent)
    assert set(offsets) <= {offset for offset, _ in read}  # each ack names a message read
    return offsets, read


def test_metadata_version_2_names_leader_epoch_replicas_and_isr(
    shared_three_brokers: ThreeBrokers,
) -> None:
    endpoints, registry = shared_three_brokers.endpoints, shared_three_brokers.registry
    create_replicated(endpoints, "described", 2)
    with Cluster(endpoints[2]) as cluster:
        for info in cluster.partitions("described"):
            state, _ = registry.topics.partition_state("described", info.partition)
            assert info.broker_id == state.leader
            assert info.leader_epoch == state.leader_epoch
            assert sorted(info.replicas) == [1, 2, 3]
            assert sorted(info.isr) == sorted(state.isr)
        assert cluster.metadata_v1 == set()


def test_producer_at_ack_all_and_partition_consumer_follow_leadership_moves(
    shared_three_brokers: ThreeBrokers,
) -> None:
    endpoints, registry = shared_three_brokers.endpoints, shared_three_brokers.registry
    create_replicated(endpoints, "moving", 1)
    with PartitionConsumer(endpoints[2], "moving", 0, max_wait_ms=100) as consumer:
        messages: list[Message] = []

        def poll() -> Read:
            got = consumer.poll()
            messages.extend(got)
            return [(m.offset, m.value) for m in got]

        _, read = produce_and_read_across_moves(endpoints, registry, "moving", poll)
    check_read(read, values(MESSAGES), [m.size for m in messages])


def test_topic_consumer_follows_leadership_moves(
    shared_three_brokers: ThreeBrokers,
) -> None:
    endpoints, registry = shared_three_brokers.endpoints, shared_three_brokers.registry
    create_replicated(endpoints, "moving-topic", 2)
    with TopicConsumer(endpoints[3], "moving-topic", [0], follow=True, max_wait_ms=100) as c:
        records = iter(c)

        def poll() -> Read:
            record = next(records)
            return [(record.offset, record.value)]

        produce_and_read_across_moves(endpoints, registry, "moving-topic", poll)


def test_group_member_follows_leadership_moves(shared_three_brokers: ThreeBrokers) -> None:
    endpoints, registry = shared_three_brokers.endpoints, shared_three_brokers.registry
    create_replicated(endpoints, "moving-group", 1)
    member = GroupConsumer(
        bootstrap(endpoints),
        "followers",
        ["moving-group"],
        max_wait_ms=100,
        session_timeout_s=2.0,
    )
    with member:

        def poll() -> Read:
            return [(r.offset, r.value) for r in member.poll()]

        produce_and_read_across_moves(endpoints, registry, "moving-group", poll)


def test_async_producer_and_consumers_follow_leadership_moves(
    shared_three_brokers: ThreeBrokers,
) -> None:
    """AsyncProducer at ack=all, with an AsyncPartitionConsumer and an AsyncGroupConsumer
    reading, across two moves."""
    endpoints, registry = shared_three_brokers.endpoints, shared_three_brokers.registry
    create_replicated(endpoints, "moving-aio", 1)
    sent = values(MESSAGES)

    async def run() -> tuple[list[int], list[Message], Read, list[int]]:
        read: list[Message] = []
        grouped: Read = []
        moves: list[int] = []
        producer = AsyncProducer(
            endpoints[1], "moving-aio", ack=Ack.ALL, batch_messages=10, max_in_flight=1
        )

        async def produce() -> list[int]:
            deliveries = []
            for value in sent:
                deliveries.append(await producer.send(value))
                await asyncio.sleep(0.002)
            await producer.flush()
            return [await d.result(0) for d in deliveries]

        def done() -> bool:
            return len({m.value for m in read}) == len({v for _, v in grouped}) == MESSAGES

        sending = asyncio.create_task(produce())
        consumer = AsyncPartitionConsumer(endpoints[3], "moving-aio", 0, max_wait_ms=100)
        member = AsyncGroupConsumer(
            bootstrap(endpoints),
            "async-followers",
            ["moving-aio"],
            max_wait_ms=100,
            session_timeout_s=2.0,
        )
        try:
            deadline = time.monotonic() + DEADLINE_S
            while not done() and time.monotonic() < deadline:
                read += await consumer.poll()
                grouped += [(r.offset, r.value) for r in await member.poll()]
                if len(moves) < 2 and len(read) >= (len(moves) + 1) * MESSAGES // 3:
                    leader = await asyncio.to_thread(move_leadership, registry, "moving-aio", 0)
                    moves.append(leader)
                    for _ in range(500):
                        if await asyncio.to_thread(
                            answers_as_leader, endpoints[leader], "moving-aio", 0
                        ):
                            break
                        await asyncio.sleep(0.02)
                if sending.done() and sending.exception() is not None:
                    break
            offsets = await asyncio.wait_for(sending, DEADLINE_S)
        finally:
            sending.cancel()
            await member.close()
            await consumer.close()
            await producer.close()
        return offsets, read, grouped, moves

    offsets, read, grouped, moves = asyncio.run(run())
    assert len(moves) == 2
    assert len(offsets) == MESSAGES
    check_read([(m.offset, m.value) for m in read], sent, [m.size for m in read])
    check_read(grouped, sent)
    assert set(offsets) <= {m.offset for m in read}


def test_a_not_leader_naming_a_known_broker_is_followed_without_metadata(
    shared_three_brokers: ThreeBrokers,
) -> None:
    """A request sent to the old leader answers NOT_LEADER_FOR_PARTITION with the new leader:
    the cluster connection sends it there next (no METADATA asked meanwhile)."""
    endpoints, registry = shared_three_brokers.endpoints, shared_three_brokers.registry
    create_replicated(endpoints, "hinted", 1)
    with Producer(endpoints[1], "hinted", ack=Ack.ALL) as producer:
        producer.send(b"before the move").result()
    with Cluster(endpoints[1]) as cluster:
        old = cluster.partitions("hinted")[0]
        new = move_leadership(registry, "hinted", 0)
        wait_until(lambda: answers_as_leader(endpoints[new], "hinted", 0))
        wait_until(lambda: not answers_as_leader(endpoints[old.broker_id], "hinted", 0))
        asked: list[object] = []
        metadata = cluster.metadata

        def counted(topics: Iterable[str]) -> MetadataReply:
            asked.append(topics)
            return metadata(topics)

        cluster.metadata = counted  # type: ignore[method-assign]
        reply = cluster.call_leader(FetchRequest("hinted", 0, 0, 1 << 20, 0, 0), 3)
        assert reply.message_set and asked == []
        assert cluster.leaders["hinted", 0].broker_id == new
        assert cluster.leaders["hinted", 0].leader_epoch == old.leader_epoch + 1


@dataclass
class OldBroker(FakePartition):
    """Partition 0 of TOPIC on a broker older than replication: it answers METADATA version 2
    UNSUPPORTED_VERSION, version 1 as before."""

    asked: list[int] = field(default_factory=list)
    """The api_version of each METADATA asked."""

    def answer(self, correlation_id: int, request: object) -> list[bytes]:
        if isinstance(request, MetadataRequest):
            self.asked.append(self.version)
            if self.version != 1:
                error = encode_error(correlation_id, ErrorCode.UNSUPPORTED_VERSION, "x")
                return [bytes(f) for f in error]
        return super().answer(correlation_id, request)


def test_a_broker_without_metadata_version_2_is_asked_version_1() -> None:
    old = OldBroker()
    with serving(old), Cluster(old.endpoint) as cluster:
        (partition,) = cluster.partitions(TOPIC)
        assert (partition.broker_id, partition.leader_epoch, partition.replicas) == (1, -1, ())
        assert old.asked == [2, 1] and cluster.metadata_v1 == {old.endpoint}
        cluster.partitions(TOPIC)
        assert old.asked == [2, 1, 1]  # noted: version 1 at once
        reply = cluster.call_leader(FetchRequest(TOPIC, 0, 0, 1 << 20, 0, 0), 0)
        assert reply.message_set  # routed by the version 1 holder


def test_group_lag_reads_offsets_of_the_leader_after_a_move(
    shared_three_brokers: ThreeBrokers,
) -> None:
    """`pylogctl group describe`'s reader asks the partition's leader, not its preferred one
    (a follower after the move, which answers NOT_LEADER_FOR_PARTITION)."""
    endpoints, registry = shared_three_brokers.endpoints, shared_three_brokers.registry
    create_replicated(endpoints, "lagging", 1)
    with Producer(endpoints[1], "lagging", ack=Ack.ALL) as producer:
        offsets = [producer.send(value).result() for value in values(10)]
    end = offsets[-1] + offsets[1] - offsets[0]  # ten messages of one size
    registry.groups.commit_offset("lagging-group", "lagging", "1-0", offsets[4])
    new = move_leadership(registry, "lagging", 0)
    wait_until(partial(answers_as_leader, endpoints[new], "lagging", 0))

    def high_watermark() -> int:  # the new leader's starts at what it had heard, then catches up
        with Cluster(endpoints[new]) as cluster:
            return cluster.call_leader(OffsetsRequest("lagging", 0, LATEST), 3).offset

    wait_until(lambda: high_watermark() == end, what="the new leader's high watermark")
    with Cluster((), retries=1) as cluster:
        (lag,) = (
            GroupReader(registry.groups, registry.topics, registry.brokers, cluster)
            .describe("lagging-group", ["lagging"])
            .partitions
        )
    assert (lag.broker, lag.note) == (1, None)  # the preferred leader names the partition
    assert (lag.log_start, lag.high_watermark, lag.committed) == (0, end, offsets[4])
    assert lag.lag_messages == 6  # messages 4 to 9


def test_the_producer_sends_again_after_not_enough_replicas_until_the_isr_grows_back(
    shared_three_brokers: ThreeBrokers,
) -> None:
    """min_insync_replicas 3 and a follower frozen out of the ISR: an ack=all batch is refused
    NOT_ENOUGH_REPLICAS and sent again (0.1 s doubling to 2 s) until the follower is back in
    the ISR, within the producer's delivery_timeout_s; then acknowledged."""
    endpoints, registry = shared_three_brokers.endpoints, shared_three_brokers.registry
    config = {"replication_factor": "3", "min_insync_replicas": "3"}
    create_replicated(endpoints, "strict", 1, config)
    leader = registry.topics.partition_state("strict", 0)[0].leader
    frozen = min({1, 2, 3} - {leader})
    with Producer(endpoints[leader], "strict", ack=Ack.ALL, batch_messages=1) as producer:
        assert producer.send(b"before").result(10) == 0
        workers = shared_three_brokers.brokers[frozen].worker_pids()
        for pid in workers:  # its fetches stop; its ZooKeeper session lives on
            os.kill(pid, signal.SIGSTOP)
        try:
            wait_until(lambda: frozen not in registry.topics.partition_state("strict", 0)[0].isr)
            delivery = producer.send(b"during")
            with pytest.raises(TimeoutError):  # refused, and sent again, while the ISR is 2
                delivery.result(1.0)
        finally:
            for pid in workers:
                os.kill(pid, signal.SIGCONT)
        assert delivery.result(30) > 0
    with PartitionConsumer(endpoints[frozen], "strict", 0, stop_at_end=True) as consumer:
        wait_until(lambda: consumer.offset_for_time(LATEST) > delivery.result(0))
        read = [(m.offset, m.value) for m in consumer]
    # Sent before the leader applied the shrink, the set is appended, then answered
    # NOT_ENOUGH_REPLICAS as the ISR shrinks under it (kept: at least once), and stored again.
    assert read[0] == (0, b"before") and {v for _, v in read[1:]} == {b"during"}
    assert len(read) in (2, 3) and (delivery.result(0), b"during") in read
