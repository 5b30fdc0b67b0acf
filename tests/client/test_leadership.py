"""Clients follow leadership on their own (docs/replication.md, "Clients"): three real brokers,
a replicated topic, and leadership moved as the controller moves it (a conditional write of the
partition's state node, the epoch raised) while a producer at ack=all sends and a consumer
reads. Every send is acknowledged, the consumer reads every message in order with no gap
(a batch sent again after NOT_LEADER_FOR_PARTITION may be stored twice: at least once)."""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from collections.abc import Callable, Iterable
from functools import partial
from pathlib import Path

import pytest

from broker.aio import AsyncPartitionConsumer, AsyncProducer
from broker.client import Admin, Cluster, PartitionConsumer, Producer
from broker.client.producer import Delivery
from broker.errors import NotLeaderForPartition
from broker.log.message import Message
from broker.protocol import Ack, FetchRequest, MetadataReply
from broker.registry import PartitionState, Registry
from tests.cluster.conftest import broker_flags
from tests.conftest import wait_until
from tests.pylogd import RunningBroker

REPLICATED = {"replication_factor": "3", "min_insync_replicas": "2"}
MESSAGES = 600
DEADLINE_S = 60.0


@pytest.fixture
def replicating(make_pylogd: Callable[..., RunningBroker], tmp_path: Path) -> list[RunningBroker]:
    """Brokers 1, 2 and 3; followers long-poll 200 ms, and one behind for 2 s leaves the ISR."""
    flags = ("--broker-replica-lag-max-ms", "2000", "--broker-replica-fetch-wait-ms", "200")
    return [make_pylogd(*broker_flags(tmp_path, i), *flags, name=f"broker-{i}") for i in (1, 2, 3)]


def move_leadership(registry: Registry, topic: str, partition: int) -> int:
    """Move the leadership of `partition` to the next broker of its ISR, as the controller does
    (the epoch raised, written conditionally); the new leader."""
    state, version = registry.partition_state(topic, partition)
    isr = sorted(state.isr)
    assert len(isr) > 1, f"no other in-sync replica to lead: {state}"
    leader = isr[(isr.index(state.leader) + 1) % len(isr)] if state.leader in isr else isr[0]
    moved = PartitionState(leader, state.leader_epoch + 1, state.isr, state.controller_epoch)
    registry.write_partition_state(topic, partition, moved, version)
    return leader


def answers_as_leader(endpoint: str, topic: str, partition: int) -> bool:
    """Whether the broker at `endpoint` serves FETCH of the partition (it took up leading)."""
    with Cluster(endpoint) as cluster:
        try:
            cluster.connect(endpoint).request(FetchRequest(topic, partition, 0, 1024, 0, 0))
        except NotLeaderForPartition:
            return False
    return True


def values(count: int) -> list[bytes]:
    return [b"message-%06d" % i for i in range(count)]


def check_read(read: list[Message], sent: list[bytes]) -> None:
    """Everything sent read, in the order sent, offsets without a gap (each message read once);
    a message read twice only as a copy stored again (a batch sent again), after its first."""
    for before, after in itertools.pairwise(read):
        assert after.offset == before.next_offset, "a gap, or a message read twice"
    new = 0
    for message in read:
        if new < len(sent) and message.value == sent[new]:
            new += 1
        else:
            assert message.value in sent[:new], f"{message.value!r} out of order"
    assert new == len(sent)


def test_metadata_version_2_names_leader_epoch_replicas_and_isr(
    replicating: list[RunningBroker], registry: Registry
) -> None:
    with Admin(replicating[0].endpoint) as admin:
        admin.create_topic("described", 2, REPLICATED)
    with Cluster(replicating[1].endpoint) as cluster:
        for info in cluster.partitions("described"):
            state, _ = registry.partition_state("described", info.partition)
            assert info.broker_id == state.leader
            assert info.leader_epoch == state.leader_epoch
            assert sorted(info.replicas) == [1, 2, 3]
            assert sorted(info.isr) == sorted(state.isr)
        assert cluster.metadata_v1 == set()


def test_producer_at_ack_all_and_consumer_follow_leadership_moves(
    replicating: list[RunningBroker], registry: Registry
) -> None:
    endpoints = {b: replicating[b - 1].endpoint for b in (1, 2, 3)}
    with Admin(endpoints[1]) as admin:
        admin.create_topic("moving", 1, REPLICATED)
    sent = values(MESSAGES)
    deliveries: list[Delivery] = []
    failure: list[BaseException] = []

    def produce() -> None:
        try:
            with Producer(
                endpoints[1], "moving", ack=Ack.ALL, batch_messages=10, max_in_flight=1
            ) as producer:
                for value in sent:
                    deliveries.append(producer.send(value))
                    time.sleep(0.002)  # spread the sends over the moves
        except BaseException as error:  # the test thread raises it
            failure.append(error)

    producer = threading.Thread(target=produce)
    producer.start()
    read: list[Message] = []
    moves: list[int] = []
    try:
        with PartitionConsumer(endpoints[2], "moving", 0, max_wait_ms=100) as consumer:
            deadline = time.monotonic() + DEADLINE_S
            while len(set(m.value for m in read)) < MESSAGES and time.monotonic() < deadline:
                read += consumer.poll()
                if len(moves) < 2 and len(read) >= (len(moves) + 1) * MESSAGES // 3:
                    leader = move_leadership(registry, "moving", 0)
                    moves.append(leader)
                    wait_until(partial(answers_as_leader, endpoints[leader], "moving", 0))
                assert not failure, failure
    finally:
        producer.join(DEADLINE_S)
    assert not producer.is_alive() and not failure, failure
    assert len(moves) == 2
    offsets = [d.result(0) for d in deliveries]
    assert len(offsets) == MESSAGES
    check_read(read, sent)
    stored = {m.offset for m in read}
    assert set(offsets) <= stored  # every ack names a message read at that offset


def test_async_producer_and_consumer_follow_leadership_moves(
    replicating: list[RunningBroker], registry: Registry
) -> None:
    endpoints = {b: replicating[b - 1].endpoint for b in (1, 2, 3)}
    with Admin(endpoints[1]) as admin:
        admin.create_topic("moving-aio", 1, REPLICATED)
    sent = values(MESSAGES)

    async def run() -> tuple[list[int], list[Message], list[int]]:
        read: list[Message] = []
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

        sending = asyncio.create_task(produce())
        consumer = AsyncPartitionConsumer(endpoints[3], "moving-aio", 0, max_wait_ms=100)
        try:
            deadline = time.monotonic() + DEADLINE_S
            while len(set(m.value for m in read)) < MESSAGES and time.monotonic() < deadline:
                read += await consumer.poll()
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
            await consumer.close()
            await producer.close()
        return offsets, read, moves

    offsets, read, moves = asyncio.run(run())
    assert len(moves) == 2
    assert len(offsets) == MESSAGES
    check_read(read, sent)
    assert set(offsets) <= {m.offset for m in read}


def test_a_not_leader_naming_a_known_broker_is_followed_without_metadata(
    replicating: list[RunningBroker], registry: Registry
) -> None:
    """A request sent to the old leader answers NOT_LEADER_FOR_PARTITION with the new leader:
    the cluster connection sends it there next (no METADATA asked meanwhile)."""
    endpoints = {b: replicating[b - 1].endpoint for b in (1, 2, 3)}
    with Admin(endpoints[1]) as admin:
        admin.create_topic("hinted", 1, REPLICATED)
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
