"""Leader failover on three real brokers (docs/replication.md, "The controller"): the leader of
a partition is killed with SIGKILL again and again while a producer sends at ack=all and a
consumer reads; nothing acknowledged is lost, nothing is stored twice (the producer is
idempotent), no consumer sees a message that later disappears, and the replicas hold the same
bytes wherever they overlap."""

from __future__ import annotations

import functools
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from broker.client import PartitionConsumer, Producer
from broker.client.admin import Admin
from broker.errors import PylogError
from broker.protocol import Ack
from broker.registry import Registry
from broker.security import ClientKeys
from tests.conftest import wait_until
from tests.pylogd import ThreeBrokers

THREE_BROKERS_FLAGS = (
    *("--broker-replica-lag-max-ms", "1000", "--broker-replica-fetch-wait-ms", "200"),
)
"""Of each test's own three brokers: a follower behind for 1 s leaves the ISR. (A dead leader's
session expires after 2 s, the test brokers' session timeout: then the controller chooses
another.)"""

REQUEST_TIMEOUT_S = 2.0
"""The clients' wait for a reply (10 s by default): a request the killed leader never answers
is sent again after it (the new leader is chosen about 2 s after the kill)."""


@dataclass
class Traffic:
    """A producer at ack=all and a consumer, each on a thread of its own, until `stop`."""

    bootstrap: str
    topic: str
    acked: dict[bytes, int] = field(default_factory=dict)
    """Each acknowledged value and its offset."""
    seen: list[tuple[int, bytes]] = field(default_factory=list)
    """What the consumer read, (offset, value), in order."""
    errors: list[str] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)
    keys: ClientKeys | None = None
    """The clients' keys, for a curve cluster."""

    def produce(self) -> None:
        with Producer(
            self.bootstrap,
            self.topic,
            ack=Ack.ALL,
            retries=None,
            delivery_timeout_s=60,
            timeout_s=REQUEST_TIMEOUT_S,
            keys=self.keys,
        ) as producer:
            for i in range(100_000):  # bounded; stopped long before
                if self.stop.is_set():
                    return
                value = b"v-%d" % i
                try:
                    self.acked[value] = producer.send(value).result(timeout=60)
                except PylogError as error:  # not acked: may be stored or not
                    self.errors.append(f"{value!r}: {error}")
                time.sleep(0.002)

    def wait_for_acks(self, more: int) -> None:
        """Wait until `more` further sends are acknowledged."""
        wanted = len(self.acked) + more
        wait_until(lambda: len(self.acked) >= wanted, 60, f"{more} more acks")

    def consume(self) -> None:
        with PartitionConsumer(
            self.bootstrap,
            self.topic,
            0,
            max_wait_ms=200,
            timeout_s=REQUEST_TIMEOUT_S,
            keys=self.keys,
        ) as consumer:
            while not self.stop.is_set():
                try:
                    self.seen += [(m.offset, m.value) for m in consumer.poll()]
                except PylogError as error:
                    self.errors.append(f"consumer: {error}")
                    time.sleep(0.1)


def stored(root: Path, broker_id: int, folder: str) -> bytes:
    segments = sorted((root / f"broker-{broker_id}" / "logs" / folder).glob("*.log"))
    return b"".join(segment.read_bytes() for segment in segments)


def led_by_another(registry: Registry, old: int) -> bool:
    """Whether the controller has given the partition to a broker other than `old`."""
    return registry.topics.partition_state("durable", 0)[0].leader not in (old, -1)


def run_kills(three: ThreeBrokers, kills: int, keys: ClientKeys | None = None) -> None:
    """`kills` times: the leader killed, a new one chosen, acks from it, the old one back in
    the ISR; then nothing acknowledged lost. `keys`: the clients' (a super user's), for a
    curve cluster."""
    registry, root, brokers = three.registry, three.root, three.brokers
    with Admin(brokers[1].endpoint, keys=keys) as admin:
        admin.create_topic("durable", 1, {"replication_factor": "3", "min_insync_replicas": "2"})
    bootstrap = ",".join(b.endpoint.removeprefix("tcp://") for b in brokers.values())
    traffic = Traffic(bootstrap, "durable", keys=keys)
    threads = [threading.Thread(target=f, daemon=True) for f in (traffic.produce, traffic.consume)]
    for thread in threads:
        thread.start()
    try:
        for _ in range(kills):
            started = time.monotonic()
            traffic.wait_for_acks(20)
            old = registry.topics.partition_state("durable", 0)[0].leader
            brokers[old].kill()
            killed = time.monotonic()
            wait_until(
                functools.partial(led_by_another, registry, old),
                60,
                "the controller to choose another leader",
            )
            chosen = time.monotonic()
            traffic.wait_for_acks(20)
            acked = time.monotonic()
            three.restart(old)
            wait_until(
                lambda: len(registry.topics.partition_state("durable", 0)[0].isr) == 3,
                60,
                "the old leader to catch up and rejoin the ISR",
            )
            print(
                f"kill of broker {old}: acks {killed - started:.1f} s, new leader "
                f"{chosen - killed:.1f} s, its acks {acked - chosen:.1f} s, back in sync "
                f"{time.monotonic() - acked:.1f} s"
            )
    finally:
        traffic.stop.set()
        for thread in threads:
            thread.join(90)
    leader = registry.topics.partition_state("durable", 0)[0].leader
    with PartitionConsumer(
        brokers[leader].endpoint, "durable", 0, stop_at_end=True, keys=keys
    ) as reader:
        final = {m.offset: m.value for m in reader}
    kept = set(final.values())
    lost = [value for value in traffic.acked if value not in kept]
    assert not lost, f"{len(lost)} acknowledged values lost, e.g. {lost[:5]}"
    twice = len(final) - len(kept)  # each value is sent once: the producer is idempotent
    assert not twice, f"{twice} values stored twice"
    for value, offset in traffic.acked.items():
        assert final.get(offset) == value  # where the ack said, too
    vanished = [(offset, v) for offset, v in traffic.seen if final.get(offset) != v]
    assert not vanished, f"the consumer saw {len(vanished)} messages that are gone: {vanished[:5]}"
    # Every replica holds the same bytes where they overlap (each a prefix of the longest).
    copies = sorted((stored(root, b, "durable-0") for b in (1, 2, 3)), key=len)
    for copy in copies[:-1]:
        assert copies[-1].startswith(copy)


def test_the_leader_killed_loses_nothing_acknowledged(own_three_brokers: ThreeBrokers) -> None:
    run_kills(own_three_brokers, kills=1)


@pytest.mark.slow  # ~75 s: 20 failovers and as many restarts
def test_the_leader_killed_twenty_times_loses_nothing_acknowledged(
    own_three_brokers: ThreeBrokers,
) -> None:
    run_kills(own_three_brokers, kills=20)
