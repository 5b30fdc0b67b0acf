"""Power cuts under load: pylogd runs under the shim of tests/log/powerloss.c, which keeps track
of every write its log dirs have not fsynced and every directory entry not made durable;
producers send at ack=flushed; then every process is killed at once and the disk put back as a
power loss leaves it (every other cut the strictest state, the others a state drawn: zero
tails, pages half written, entries committed up to a point). After each of 20 cuts the broker
starts again on what is left: every message ever acknowledged is there, in the order
acknowledged, and every message read is whole (no checksum fails, no offset is given twice)."""

from __future__ import annotations

import functools
import random
import threading
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest

from broker.client import Admin, PartitionConsumer
from broker.client import Producer as ClientProducer
from broker.client.connection import Connection
from broker.errors import PylogError
from broker.log import encode_message, iter_messages
from broker.protocol import LATEST, Ack, FetchRequest, OffsetsRequest, ProduceRequest
from broker.worker import SYNC_TOGETHER_FROM
from broker.zookeeper import free_port
from perf.cpu import tree_pids
from tests.conftest import wait_until
from tests.log import powerloss
from tests.pylogd import RunningBroker, broker_flags

CUTS = 20
REPLICATED = {"replication_factor": "3", "min_insync_replicas": "2"}
REPLICA_FLAGS = ("--broker-replica-lag-max-ms", "1000", "--broker-replica-fetch-wait-ms", "200")
BATCH = 10


class Producer(threading.Thread):
    """Sends batches of BATCH messages ("<partition>:<n>") to one partition at ack=flushed,
    one at a time, until `stop` is set or a request fails (the power is cut); `acked` holds
    the numbers of the messages acknowledged, in order."""

    def __init__(self, endpoint: str, topic: str, partition: int, first: int) -> None:
        super().__init__(daemon=True)
        self.endpoint, self.topic, self.partition = endpoint, topic, partition
        self.next = first
        self.acked: list[int] = []
        self.stop = threading.Event()

    def run(self) -> None:
        with Connection(self.endpoint, timeout_s=2.0) as connection:
            while not self.stop.is_set():
                numbers = range(self.next, self.next + BATCH)
                message_set = b"".join(
                    encode_message(f"{self.partition}:{n}".encode()) for n in numbers
                )
                try:
                    connection.request(
                        ProduceRequest(self.topic, self.partition, Ack.FLUSHED, message_set)
                    )
                except PylogError:
                    return
                self.acked.extend(numbers)
                self.next += BATCH


def read_all(endpoint: str, topic: str, partition: int) -> list[int]:
    """The numbers of every message of the partition, from its start to its end (every
    message's checksum checked on the way)."""
    numbers = []
    with Connection(endpoint, timeout_s=10.0) as connection:
        end = connection.request(OffsetsRequest(topic, partition, LATEST)).offset
        offset = 0
        while offset < end:
            reply = connection.request(FetchRequest(topic, partition, offset, 1 << 20, 0, 0))
            assert len(reply.message_set) > 0, f"nothing at {offset} below the end {end}"
            for message in iter_messages(bytes(reply.message_set), offset):
                owner, number = message.value.decode().split(":")
                assert int(owner) == partition
                numbers.append(int(number))
                offset = message.next_offset
    return numbers


@pytest.mark.slow  # ~1 minute each: 20 starts of pylogd, each after a power cut
@pytest.mark.parametrize(
    "partitions",
    [
        pytest.param(2, id="a-partition-a-worker"),  # a flush round fdatasyncs its one segment
        pytest.param(4, id="two-a-worker"),  # a round of two segments: one syncfs for both
    ],
)
def test_every_acknowledged_message_survives_twenty_power_cuts(
    make_pylogd: Callable[..., RunningBroker],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    partitions: int,
) -> None:
    disk = tmp_path / "disk"  # the log dirs: what the power cut reaches (not pylogd's own log)
    journal = tmp_path / "journal"
    library = powerloss.build(tmp_path)
    for name, value in powerloss.environment(library, disk, journal).items():
        monkeypatch.setenv(name, value)  # for every pylogd started from here on
    broker = make_pylogd(
        "--broker-log-dirs", f"{disk / 'a'},{disk / 'b'}", "--log-flush-interval-ms", "50"
    )
    small = {"segment_bytes": "2048", "max_message_bytes": "1024"}  # rolls, indexes
    with Admin(broker.endpoint) as admin:
        admin.create_topic("power", partitions, small)
    acked: dict[int, list[int]] = {p: [] for p in range(partitions)}
    chance = random.Random(27)
    restored = 0
    for cut in range(CUTS):
        producers = [
            Producer(broker.endpoint, "power", p, (max(acked[p], default=-1) + 1) + 100_000 * cut)
            for p in range(partitions)
        ]
        for producer in producers:
            producer.start()
        target = chance.randrange(20, 200)

        def enough(producers: list[Producer] = producers, target: int = target) -> bool:
            return sum(len(p.acked) for p in producers) >= target

        wait_until(enough, timeout=60, what=f"{target} messages acknowledged before cut {cut}")
        assert broker.process is not None
        powerloss.kill_all(tree_pids(broker.process.pid))  # the power goes: in the middle of it
        broker.process.wait()
        for producer in producers:
            producer.stop.set()
            producer.join(timeout=30)
            assert not producer.is_alive()
            acked[producer.partition].extend(producer.acked)
        # every other cut the strictest state (all not made durable lost), else one drawn
        restored += powerloss.cut(disk, journal, chance if cut % 2 else None)
        broker = broker.restarted()
        for partition in range(partitions):
            numbers = read_all(broker.endpoint, "power", partition)
            assert len(numbers) == len(set(numbers)), f"cut {cut}: a message read twice"
            kept, sent = set(numbers), set(acked[partition])
            lost = [n for n in acked[partition] if n not in kept]
            assert not lost, f"cut {cut}: partition {partition} lost acknowledged {lost[:10]}"
            order = [n for n in numbers if n in sent]
            assert order == acked[partition], f"cut {cut}: acknowledged messages out of order"
    assert restored > 0  # the cuts changed files: writes not yet fsynced were dropped
    total = sum(len(numbers) for numbers in acked.values())  # docs/storage.md quotes these
    print(f"{CUTS} cuts, {total} acknowledged, 0 lost, {restored} files and entries put back")


def test_an_idempotent_set_acknowledged_before_a_power_cut_is_stored_once_when_sent_again(
    make_pylogd: Callable[..., RunningBroker], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A producer's sets acknowledged at ack=flushed, one partition (a flush round of one
    segment), then the power goes (the strictest state: all not made durable lost) before
    their replies reach it: each set sent again after the restart is answered as stored,
    never stored twice. Its entries (docs/storage.md, "Producer state") are as durable as its
    bytes: before, the entries file of a segment, written but not synced, was lost with the
    cut while the bytes stayed, the partition forgot the producer, and its first set sent
    again was stored a second time (its later ones refused UNKNOWN_PRODUCER_ID)."""
    disk, journal = tmp_path / "disk", tmp_path / "journal"
    library = powerloss.build(tmp_path)
    for name, value in powerloss.environment(library, disk, journal).items():
        monkeypatch.setenv(name, value)
    broker = make_pylogd("--broker-log-dirs", str(disk / "a"), "--log-flush-interval-ms", "50")
    with Admin(broker.endpoint) as admin:
        admin.create_topic("once", 1)
    requests = [
        ProduceRequest("once", 0, Ack.FLUSHED, encode_message(f"0:{n}".encode()), 77, 0, sequence)
        for sequence, n in enumerate(range(0, 30, 10))
    ]
    with Connection(broker.endpoint, timeout_s=10.0) as connection:
        first = [connection.request(request) for request in requests]
    assert broker.process is not None
    powerloss.kill_all(tree_pids(broker.process.pid))
    broker.process.wait()
    powerloss.cut(disk, journal)
    broker = broker.restarted()
    with Connection(broker.endpoint, timeout_s=10.0) as connection:
        again = [connection.request(request) for request in requests]
    assert [(r.base_offset, r.count) for r in again] == [(r.base_offset, r.count) for r in first]
    assert read_all(broker.endpoint, "once", 0) == [0, 10, 20]


WIDE = 130
"""A topic's partitions over two log dirs, 65 a worker: past SYNC_TOGETHER_FROM (64), so a
worker makes their new folders durable by one syncfs (broker.log.fsdir.sync_created), not by
fsyncs of each folder."""


@pytest.mark.slow  # ~30 s: two topics of 130 partitions, two power cuts
def test_a_large_new_topics_partitions_outlive_a_power_cut_after_their_first_ack(
    make_pylogd: Callable[..., RunningBroker], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A new topic of WIDE partitions, a message acknowledged at ack=flushed on each, then the
    power goes (the strictest state: all not made durable lost): after the restart every
    partition is there with its message, that cut's topic and the one before."""
    assert WIDE // 2 >= SYNC_TOGETHER_FROM
    disk, journal = tmp_path / "disk", tmp_path / "journal"
    library = powerloss.build(tmp_path)
    for name, value in powerloss.environment(library, disk, journal).items():
        monkeypatch.setenv(name, value)
    broker = make_pylogd("--broker-log-dirs", f"{disk / 'a'},{disk / 'b'}")
    for cut in range(2):
        with Admin(broker.endpoint) as admin:
            admin.create_topic(f"wide-{cut}", WIDE)
        with Connection(broker.endpoint, timeout_s=10.0) as connection:
            for partition in range(WIDE):
                message = encode_message(f"{partition}:{cut}".encode())
                request = ProduceRequest(f"wide-{cut}", partition, Ack.FLUSHED, message)
                wait_until(
                    functools.partial(answered, connection, request), what=f"partition {partition}"
                )
        assert broker.process is not None
        powerloss.kill_all(tree_pids(broker.process.pid))
        broker.process.wait()
        powerloss.cut(disk, journal)
        broker = broker.restarted()
        for made in range(cut + 1):
            for partition in range(WIDE):
                assert read_all(broker.endpoint, f"wide-{made}", partition) == [made], (
                    f"cut {cut}: partition {partition} of wide-{made}"
                )


def answered(connection: Connection, request: ProduceRequest) -> bool:
    """Whether `request` was acknowledged (False: refused, its partition not served yet)."""
    try:
        connection.request(request)
    except PylogError:
        return False
    return True


REPLICATED_CUTS = 6


class IdempotentSender(threading.Thread):
    """The client's idempotent producer at ack=all to one partition of a replicated topic,
    BATCH messages ("<partition>:<n>") a set, each set waited for (up to 60 s, its sends again
    through a power cut included), until `stop` is set; `acked` holds the numbers of the
    messages acknowledged, in order. It lives through the cuts: a set whose ack the cut lost
    is sent again, with its sequence, once the brokers are back (stored once, or answered as
    stored already)."""

    def __init__(self, bootstrap: str, topic: str, partition: int) -> None:
        super().__init__(daemon=True)
        self.bootstrap, self.topic, self.partition = bootstrap, topic, partition
        self.acked: list[int] = []
        self.failed: list[BaseException] = []
        self.stop = threading.Event()

    def run(self) -> None:
        with ClientProducer(
            self.bootstrap,
            self.topic,
            ack=Ack.ALL,
            batch_messages=BATCH,
            max_in_flight=1,
            delivery_timeout_s=60,
            timeout_s=2.0,
        ) as producer:
            number = 0
            while not self.stop.is_set():
                numbers = range(number, number + BATCH)
                handles = [
                    producer.send(f"{self.partition}:{n}".encode(), partition=self.partition)
                    for n in numbers
                ]
                try:
                    for handle in handles:
                        handle.result(timeout=90)
                except (PylogError, TimeoutError) as error:  # not acknowledged: may be stored
                    self.failed.append(error)
                else:
                    self.acked.extend(numbers)
                number += BATCH


@pytest.mark.slow  # ~2 minutes: 3 brokers started 13 times, 12 of them after a power cut
def test_three_brokers_at_ack_all_lose_and_double_nothing_through_power_cuts(
    make_pylogd: Callable[..., RunningBroker], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Three brokers on one box lose power together, REPLICATED_CUTS times, under idempotent
    producers at ack=all (replication factor 3, min_insync_replicas 2); every other time the
    power goes again as they start (during their recovery), before anyone is served. After
    each, all three start again on what the disks kept: every message acknowledged is there,
    and readable (the high watermark is not below it), and no message is stored twice. Known
    and reported as an expected failure (docs/storage.md, "Producer state"): a set whose bytes
    were written but not yet flushed, whose bytes a cut kept while it lost their producer entry,
    is stored again when sent again (in about one run in seven)."""
    disk, journal = tmp_path / "disk", tmp_path / "journal"
    library = powerloss.build(tmp_path)
    for name, value in powerloss.environment(library, disk, journal).items():
        monkeypatch.setenv(name, value)
    ports = {i: free_port() for i in (1, 2, 3)}  # the same endpoints after every restart
    brokers = {
        i: make_pylogd(
            *broker_flags(disk, i), *REPLICA_FLAGS, "--broker-port", str(ports[i]), name=f"b{i}"
        )
        for i in (1, 2, 3)
    }
    bootstrap = ",".join(f"127.0.0.1:{ports[i]}" for i in (1, 2, 3))
    with Admin(bootstrap) as admin:
        admin.create_topic(
            "power", 2, {**REPLICATED, "segment_bytes": "4096", "max_message_bytes": "1024"}
        )
    senders = [IdempotentSender(bootstrap, "power", p) for p in (0, 1)]
    for sender in senders:
        sender.start()
    chance = random.Random(50)
    acked_before = 0
    for cut in range(REPLICATED_CUTS):
        target = acked_before + chance.randrange(50, 300)

        def enough(target: int = target) -> bool:
            return sum(len(s.acked) for s in senders) >= target

        wait_until(enough, timeout=90, what=f"{target} messages acknowledged before cut {cut}")
        for broker in brokers.values():  # the power goes, for all three at once
            assert broker.process is not None
            powerloss.kill_all(tree_pids(broker.process.pid))
        for broker in brokers.values():
            assert broker.process is not None
            broker.process.wait()
        powerloss.cut(disk, journal, chance if cut % 2 else None)
        if cut % 2:  # and again while they start: their logs' recovery cut short
            starting = {i: broker.relaunched() for i, broker in brokers.items()}

            def recovering(starting: dict[int, RunningBroker] = starting) -> bool:
                return all(broker.worker_pids() for broker in starting.values())

            wait_until(recovering, 30, "their workers started")
            for broker in starting.values():
                assert broker.process is not None
                powerloss.kill_all(tree_pids(broker.process.pid))
                broker.process.wait()
            powerloss.cut(disk, journal)
            brokers = starting
        brokers = {i: broker.restarted() for i, broker in brokers.items()}
        acked_before = sum(len(s.acked) for s in senders)
    for sender in senders:
        sender.stop.set()
        sender.join(timeout=120)
        assert not sender.is_alive()
    unflushed_sets_doubled: list[str] = []
    for sender in senders:
        acked = sender.acked
        assert acked, f"partition {sender.partition}: nothing acknowledged"

        def readable(sender: IdempotentSender = sender) -> bool:
            numbers = read_replicated(bootstrap, "power", sender.partition)
            return set(sender.acked) <= set(numbers)

        wait_until(readable, 60, f"partition {sender.partition}'s acknowledged messages readable")
        numbers = read_replicated(bootstrap, "power", sender.partition)
        counts = Counter(numbers)
        order = [n for n in counts if n in set(acked)]  # each number where it is first
        assert order == acked, f"partition {sender.partition}: out of order"
        twice = sorted(n for n, count in counts.items() if count > 1)
        doubled_sets = sorted({n // BATCH for n in twice})
        assert {counts[n] for n in twice} <= {2} and len(twice) == BATCH * len(doubled_sets), (
            f"partition {sender.partition}: stored twice {twice[:20]}, not whole sets "
            f"(at {[i for i, n in enumerate(numbers) if n in twice[:20]]} of {len(numbers)})"
        )
        unflushed_sets_doubled += [f"{sender.partition}:{s * BATCH}" for s in doubled_sets]
    total = sum(len(s.acked) for s in senders)
    failed = sum(len(s.failed) for s in senders)
    print(f"{REPLICATED_CUTS} cuts of 3 brokers: {total} acknowledged, 0 lost, ", end="")
    print(f"{len(unflushed_sets_doubled)} sets twice; {failed} sets failed")
    if unflushed_sets_doubled:  # docs/storage.md, "Producer state": not fixed yet
        pytest.xfail(
            f"sets {unflushed_sets_doubled} stored twice: a set's bytes written but not yet "
            "flushed survived the cut, and its producer entry did not"
        )


def read_replicated(bootstrap: str, topic: str, partition: int) -> list[int]:
    """The numbers of the messages of a partition of `topic`, as its leader serves them (up
    to the high watermark), in order."""
    with PartitionConsumer(bootstrap, topic, partition, stop_at_end=True) as consumer:
        return [int(m.value.decode().split(":")[1]) for m in consumer]
