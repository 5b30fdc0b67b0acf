"""Replicated partitions on three real brokers (docs/replication.md): followers copy the
leader's bytes, ack=all waits for every in-sync replica, the in-sync set shrinks when a
follower dies and grows when it returns and catches up."""

from __future__ import annotations

import dataclasses
import os
import signal
from collections.abc import Callable
from pathlib import Path

import pytest
import zmq

from broker import protocol
from broker.client import Admin, PartitionConsumer, Producer
from broker.errors import BrokerError
from broker.log.message import encode_message
from broker.protocol import Ack, Api
from broker.registry import Registry
from broker.zookeeper import PrivateZooKeeper
from tests.cluster.conftest import broker_flags
from tests.conftest import wait_until
from tests.proxies import FreezableProxy
from tests.pylogd import RunningBroker, ThreeBrokers

REPLICATED = {"replication_factor": "3", "min_insync_replicas": "2"}


THREE_BROKERS_FLAGS = (
    *("--broker-replica-lag-max-ms", "1000", "--broker-replica-fetch-wait-ms", "200"),
    *("--metrics-enabled", "true", "--metrics-port", "0"),
)
"""Of brokers 1, 2 and 3 (shared_three_brokers: shared by the module's tests, each with topics
of its own; own_three_brokers: a test's own): a follower behind for 1 s leaves the ISR."""


def stored(root: Path, broker_id: int, folder: str) -> bytes:
    """The bytes of a replica's segment files, in offset order."""
    segments = sorted((root / f"broker-{broker_id}" / "logs" / folder).glob("*.log"))
    return b"".join(segment.read_bytes() for segment in segments)


def isr(registry: Registry, topic: str, partition: int) -> tuple[int, ...]:
    return tuple(sorted(registry.topics.partition_state(topic, partition)[0].isr))


def test_ack_all_is_answered_once_every_replica_holds_the_bytes(
    shared_three_brokers: ThreeBrokers,
) -> None:
    registry, one = shared_three_brokers.registry, shared_three_brokers.brokers[1]
    with Admin(one.endpoint) as admin:
        admin.create_topic("copied", 2, REPLICATED)
    values = [b"value-%d" % i for i in range(300)]
    with Producer(one.endpoint, "copied", ack=Ack.ALL, batch_messages=10) as producer:
        for value in values:
            producer.send(value)
        assert sum(ack.count for ack in producer.flush()) == len(values)
    for partition in (0, 1):
        assert isr(registry, "copied", partition) == (1, 2, 3)
        # Acked at ack=all: every in-sync replica holds the bytes already, the same bytes.
        copies = {stored(shared_three_brokers.root, b, f"copied-{partition}") for b in (1, 2, 3)}
        assert len(copies) == 1 and copies != {b""}
    read = []
    for partition in (0, 1):
        with PartitionConsumer(one.endpoint, "copied", partition, stop_at_end=True) as consumer:
            read += [message.value for message in consumer]
    assert sorted(read) == sorted(values)


def test_a_deleted_replicated_topic_leaves_no_file_open_on_any_broker(
    shared_three_brokers: ThreeBrokers,
) -> None:
    """Its segments', producer state's and high-watermark checkpoint's handles (this one kept
    open between writes) are closed when its partitions are deleted."""
    one = shared_three_brokers.brokers[1]
    with Admin(one.endpoint) as admin:
        admin.create_topic("dropped", 2, REPLICATED)
        with Producer(one.endpoint, "dropped", ack=Ack.ALL, batch_messages=10) as producer:
            for i in range(100):
                producer.send(b"value-%d" % i)
            producer.flush()
        root = shared_three_brokers.root
        checkpoints = list(root.glob("broker-*/logs/dropped-*/high-watermark-checkpoint"))
        assert len(checkpoints) == 6  # written by every replica: the handles held were opened
        admin.delete_topic("dropped")
    wait_until(lambda: not list(root.glob("broker-*/logs/dropped-*")), what="the deletes")
    for broker in shared_three_brokers.brokers.values():
        assert [f for f in broker.workers_open_files() if "/dropped-" in f] == []


def test_a_dead_follower_leaves_the_isr_and_catches_up_when_it_returns(
    shared_three_brokers: ThreeBrokers,
) -> None:
    registry, brokers = shared_three_brokers.registry, shared_three_brokers.brokers
    with Admin(brokers[1].endpoint) as admin:
        admin.create_topic("sturdy", 1, REPLICATED)
    leader = registry.topics.partition_state("sturdy", 0)[0].leader
    followers = sorted({1, 2, 3} - {leader})

    def produce(count: int, tag: bytes) -> int:
        with Producer(brokers[leader].endpoint, "sturdy", ack=Ack.ALL, retries=0) as producer:
            for i in range(count):
                producer.send(tag + b"-%d" % i)
            return sum(ack.count for ack in producer.flush())

    assert produce(50, b"all") == 50
    brokers[followers[0]].kill()
    wait_until(lambda: isr(registry, "sturdy", 0) == tuple(sorted({leader, followers[1]})))
    assert produce(50, b"two") == 50  # two in sync: min_insync_replicas is met

    brokers[followers[1]].kill()
    wait_until(lambda: isr(registry, "sturdy", 0) == (leader,))
    with pytest.raises(BrokerError) as refused:
        produce(1, b"alone")
    assert refused.value.name == "NOT_ENOUGH_REPLICAS"

    shared_three_brokers.restart(*followers)
    wait_until(lambda: isr(registry, "sturdy", 0) == (1, 2, 3), timeout=30)
    assert produce(50, b"back") == 50
    copies = {stored(shared_three_brokers.root, b, "sturdy-0") for b in (1, 2, 3)}
    assert len(copies) == 1


def test_a_frozen_follower_leaves_the_isr_and_rejoins_once_it_thaws(
    own_three_brokers: ThreeBrokers, registry: Registry, tmp_path: Path
) -> None:
    brokers = own_three_brokers.brokers  # its own: the leader's counters are this test's alone
    with Admin(brokers[1].endpoint) as admin:
        admin.create_topic("thawed", 1, REPLICATED)
    leader = registry.topics.partition_state("thawed", 0)[0].leader
    frozen = min({1, 2, 3} - {leader})
    with Producer(brokers[leader].endpoint, "thawed", ack=Ack.ALL, retries=0) as producer:
        for i in range(20):
            producer.send(b"before-%d" % i)
        producer.flush()
        workers = brokers[frozen].worker_pids()
        for pid in workers:  # its fetches stop; its ZooKeeper session lives on
            os.kill(pid, signal.SIGSTOP)
        try:
            wait_until(lambda: frozen not in isr(registry, "thawed", 0), what="the ISR to shrink")
            under = ("pylog_partitions_under_replicated", ())
            wait_until(lambda: brokers[leader].metrics()[under] == 1)  # read from the watch
            for i in range(20):
                producer.send(b"during-%d" % i)
            assert sum(ack.count for ack in producer.flush()) == 20  # two in sync are enough
        finally:
            for pid in workers:
                os.kill(pid, signal.SIGCONT)
        wait_until(lambda: isr(registry, "thawed", 0) == (1, 2, 3), what="the ISR to grow")
        expanded = ("pylog_isr_changes_total", (("kind", "expand"),))
        wait_until(lambda: brokers[leader].metrics()[expanded] == 1)  # counted once written
        wait_until(lambda: brokers[leader].metrics()[under] == 0)
        assert brokers[leader].metrics()[("pylog_isr_changes_total", (("kind", "shrink"),))] == 1
        for i in range(20):
            producer.send(b"after-%d" % i)
        producer.flush()
    assert len({stored(tmp_path, b, "thawed-0") for b in (1, 2, 3)}) == 1


def test_a_leader_describes_and_measures_the_high_watermark_its_consumers_see(
    make_pylogd: Callable[..., RunningBroker], tmp_path: Path, registry: Registry
) -> None:
    """DESCRIBE_PARTITION's `high_watermark` is "as in OFFSETS with time -1" (docs/protocol.md),
    and so is the gauge pylog_partition_high_watermark: at a leader whose follower stopped
    copying (in the ISR still: replica_lag_max_ms is a minute), the bytes flushed past the
    high watermark are not yet readable, and neither reports them."""
    flags = ("--broker-replica-lag-max-ms", "60000", "--metrics-enabled", "true")
    brokers = {
        i: make_pylogd(*broker_flags(tmp_path, i), *flags, "--metrics-port", "0", name=f"b-{i}")
        for i in (1, 2)
    }
    with Admin(brokers[1].endpoint) as admin:
        admin.create_topic("held", 1, {"replication_factor": "2", "min_insync_replicas": "1"})
    state = registry.topics.partition_state("held", 0)[0]
    (follower,) = {1, 2} - {state.leader}
    leader = brokers[state.leader]
    workers = brokers[follower].worker_pids()
    with Producer(leader.endpoint, "held", ack=Ack.ALL, retries=0) as producer:
        producer.send(b"copied")
        producer.flush()  # under the high watermark: the follower holds it
    with Admin(leader.endpoint) as admin:
        (before,) = admin.describe("held")
        copied = before.high_watermark
        assert copied is not None
        for pid in workers:
            os.kill(pid, signal.SIGSTOP)
        try:
            with Producer(leader.endpoint, "held", ack=Ack.FLUSHED, retries=0) as producer:
                for i in range(10):
                    producer.send(b"flushed-%d" % i)
                producer.flush()  # flushed at the leader alone
            described = admin.describe_partition("held", 0)
            assert described.log_end_offset > copied
            assert described.high_watermark == copied
            assert [p.high_watermark for p in admin.describe("held")] == [copied]
            labels = (("partition", "0"), ("topic", "held"))
            size = ("pylog_partition_log_bytes", labels)  # a snapshot taken since the produce
            wait_until(lambda: leader.metrics().get(size) == described.size_bytes, what="stats")
            assert leader.metrics()[("pylog_partition_high_watermark", labels)] == copied
        finally:
            for pid in workers:
                os.kill(pid, signal.SIGCONT)


def test_a_leader_cut_off_from_zookeeper_refuses_ack_all_before_another_is_chosen(
    make_pylogd: Callable[..., RunningBroker],
    tmp_path: Path,
    zookeeper: PrivateZooKeeper,
    registry: Registry,
) -> None:
    proxy = FreezableProxy(("127.0.0.1", zookeeper.port))
    cut: RunningBroker | None = None
    try:
        cut = make_pylogd(
            *broker_flags(tmp_path, 1), name="broker-1", zookeeper=f"127.0.0.1:{proxy.port}"
        )
        for i in (2, 3):
            make_pylogd(*broker_flags(tmp_path, i), name=f"broker-{i}")
        with Admin(cut.endpoint) as admin:
            admin.create_topic("fenced", 1, REPLICATED)
        assert registry.topics.partition_state("fenced", 0)[0].leader == 1

        def produce() -> str:
            with Producer(cut.endpoint, "fenced", ack=Ack.ALL, retries=0) as producer:
                producer.send(b"value")
                try:
                    producer.flush()
                except BrokerError as error:
                    return error.name
            return "acked"

        # CREATE_TOPIC answers once the partition is open, maybe before the leader has read
        # its role (NOT_LEADER_FOR_PARTITION until then: seen in a loaded full run).
        wait_until(lambda: produce() == "acked", what="the leader to ack before the freeze")
        proxy.freeze()
        wait_until(lambda: produce() == "NOT_LEADER_FOR_PARTITION", 30, "ack=all to be refused")
        # Refused while the partition's state still names broker 1: before anyone else leads.
        assert registry.topics.partition_state("fenced", 0)[0].leader == 1
    finally:
        if cut is not None and cut.process is not None:
            cut.kill()  # cut off, it would stop only once its ZooKeeper connection timed out
        proxy.close()


def test_an_ack_all_waiting_when_the_isr_shrinks_below_its_minimum_is_refused(
    shared_three_brokers: ThreeBrokers,
) -> None:
    registry, brokers = shared_three_brokers.registry, shared_three_brokers.brokers
    with Admin(brokers[1].endpoint) as admin:
        admin.create_topic("strict", 1, {"replication_factor": "2", "min_insync_replicas": "2"})
    state = registry.topics.partition_state("strict", 0)[0]
    (follower,) = set(state.isr) - {state.leader}
    workers = brokers[follower].worker_pids()
    with Producer(brokers[state.leader].endpoint, "strict", ack=Ack.ALL, retries=0) as producer:
        producer.send(b"both")
        producer.flush()
        for pid in workers:
            os.kill(pid, signal.SIGSTOP)
        try:
            waiting = producer.send(b"one copy only")  # the follower never copies it
            with pytest.raises(BrokerError) as refused:
                waiting.result(timeout=30)
            assert refused.value.name == "NOT_ENOUGH_REPLICAS"  # not acked by the leader alone
            assert isr(registry, "strict", 0) == (state.leader,)
        finally:
            for pid in workers:
                os.kill(pid, signal.SIGCONT)


def test_replication_settings_that_cannot_hold_are_refused_with_their_reason(
    shared_three_brokers: ThreeBrokers,
) -> None:
    with Admin(shared_three_brokers.endpoints[1]) as admin:
        for config, reason in (
            ({"replication_factor": "4"}, "replication factor 4"),  # three brokers live
            ({"replication_factor": "0"}, "replication_factor must be from 1 to 255"),
            ({"replication_factor": "2", "min_insync_replicas": "3"}, "ack=all could never"),
            ({"unclean_leader_election": "2"}, "unclean_leader_election must be from 0 to 1"),
        ):
            with pytest.raises(BrokerError) as refused:
                admin.create_topic("refused", 1, config)
            assert refused.value.name == "INVALID_TOPIC" and reason in refused.value.message
        admin.create_topic("pair", 1, {"replication_factor": "2"})
        for change, reason in (
            ({"min_insync_replicas": "3"}, "more than its replication_factor 2"),
            ({"replication_factor": "3"}, "fixed at creation"),
        ):
            with pytest.raises(BrokerError) as refused:
                admin.alter_topic_config("pair", change)
            assert refused.value.name == "INVALID_TOPIC" and reason in refused.value.message
        assert "refused" not in admin.list_topics()


def test_a_message_larger_than_a_followers_fetch_is_copied_whole(
    make_pylogd: Callable[..., RunningBroker], registry: Registry, tmp_path: Path
) -> None:
    flags = ("--broker-replica-fetch-max-bytes", "1024")  # below the topic's message size
    brokers = [make_pylogd(*broker_flags(tmp_path, i), *flags, name=f"broker-{i}") for i in (1, 2)]
    with Admin(brokers[0].endpoint) as admin:
        admin.create_topic("large", 1, {"replication_factor": "2", "min_insync_replicas": "2"})
    leader = registry.topics.partition_state("large", 0)[0].leader
    with Producer(brokers[leader - 1].endpoint, "large", ack=Ack.ALL, retries=0) as producer:
        producer.send(b"x" * 10_000)  # acked only once the follower holds it too
        producer.flush()
    assert stored(tmp_path, 1, "large-0") == stored(tmp_path, 2, "large-0") != b""


def test_a_followers_fetch_with_nothing_to_copy_carries_no_epoch_entries(
    shared_three_brokers: ThreeBrokers,
) -> None:
    """docs/protocol.md, FETCH version 2: a follower is sent the leader's epoch entries for the
    bytes returned, none when there are none (the entry in effect came with every empty reply,
    and a follower reads entries only with bytes). The same for a MULTI_FETCH's part."""
    with Admin(shared_three_brokers.endpoints[1]) as admin:
        admin.create_topic("idle-follower", 1, {"replication_factor": "2"})
    registry = shared_three_brokers.registry
    state = registry.topics.partition_state("idle-follower", 0)[0]
    wait_until(
        lambda: len(registry.topics.partition_state("idle-follower", 0)[0].isr) == 2, 30, "ISR of 2"
    )
    state = registry.topics.partition_state("idle-follower", 0)[0]
    follower = next(b for b in state.isr if b != state.leader)
    with Producer(shared_three_brokers.endpoints[state.leader], "idle-follower") as producer:
        end = producer.send(b"one message").result(30) + len(encode_message(b"one message"))
    context = zmq.Context()
    try:
        socket = context.socket(zmq.DEALER)
        socket.setsockopt(zmq.LINGER, 0)
        socket.connect(shared_three_brokers.endpoints[state.leader])

        def call(api: Api, request: protocol.Request, version: int) -> list[bytes]:
            header = protocol.RequestHeader(api, version, 9, "tests")
            socket.send_multipart([bytes(f) for f in protocol.encode_request(header, request)])
            assert socket.poll(10_000), f"no reply to {api.name}"
            return socket.recv_multipart()

        at_end = protocol.FetchRequest(
            "idle-follower", 0, 0, 1 << 20, 0, 0, follower, state.leader_epoch, 0
        )
        copied = protocol.decode_reply(Api.FETCH, call(Api.FETCH, at_end, 5), 5)
        assert len(copied.message_set) == end and len(copied.epochs) == 1
        at_end = dataclasses.replace(at_end, offset=end, flushed_offset=end)
        nothing = protocol.decode_reply(Api.FETCH, call(Api.FETCH, at_end, 5), 5)
        assert (len(nothing.message_set), nothing.epochs) == (0, ())
        part = protocol.FetchPart("idle-follower", 0, end, 1 << 20, state.leader_epoch, end)
        request = protocol.MultiFetchRequest(follower, 0, 0, 1 << 20, (part,))
        reply = protocol.decode_reply(Api.MULTI_FETCH, call(Api.MULTI_FETCH, request, 1))
        answered = protocol.decode_fetch_part(reply.parts[0])
        assert (len(answered.message_set), answered.epochs) == (0, ())
    finally:
        context.destroy(linger=0)
