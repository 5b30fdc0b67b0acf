"""A follower cut off from its leader by a freezing TCP proxy (issue 17): it leaves the ISR
while ack=all goes on with the two others, and rejoins once the proxy thaws.

Broker 1, the partition's leader, advertises the proxy's port (broker.advertised_port), so
everyone, followers included, reaches it through the proxy; the proxy freezes only the
connections whose client end is held by the cut follower's processes."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from pathlib import Path

from broker.client import PartitionConsumer, Producer
from broker.client.admin import Admin
from broker.client.cluster import METADATA_VERSION
from broker.client.connection import Connection
from broker.protocol import Ack, MetadataRequest
from broker.registry import Registry
from broker.zookeeper import free_port
from tests.cluster.conftest import broker_flags
from tests.cluster.test_replication import REPLICATED, isr, stored
from tests.conftest import wait_until
from tests.proxies import FreezableProxy
from tests.pylogd import RunningBroker

FLAGS = ("--broker-replica-lag-max-ms", "1000", "--broker-replica-fetch-wait-ms", "200")
"""A follower behind for 1 s leaves the ISR (as tests/cluster/test_replication.py's)."""


class Producing(threading.Thread):
    """A producer at ack=all through `endpoint`, one message at a time, each waited for,
    until stopped, or `limit` messages or `seconds` have passed; `acked` the values
    acknowledged, in order."""

    def __init__(self, endpoint: str, topic: str, limit: int = 5000, seconds: float = 120) -> None:
        super().__init__(daemon=True)
        self.endpoint = endpoint
        self.topic = topic
        self.limit = limit
        self.seconds = seconds
        self.acked: list[bytes] = []
        self.error: BaseException | None = None
        self.stop = threading.Event()

    def run(self) -> None:
        deadline = time.monotonic() + self.seconds
        try:
            with Producer(self.endpoint, self.topic, ack=Ack.ALL, batch_messages=1) as producer:
                for i in range(self.limit):
                    if self.stop.is_set() or time.monotonic() > deadline:
                        return
                    value = b"value-%d" % i
                    producer.send(value).result(timeout=60)
                    self.acked.append(value)
        except BaseException as error:  # reported by the test through `error`
            self.error = error

    def more(self, count: int, what: str) -> None:
        """Wait until `count` more messages than now are acknowledged."""
        target = len(self.acked) + count
        wait_until(lambda: len(self.acked) >= target or not self.is_alive(), 30, what)
        assert self.error is None, f"the producer failed: {self.error!r}"
        assert len(self.acked) >= target, f"the producer stopped: {what}"


def test_a_follower_cut_off_by_a_freezing_proxy_leaves_the_isr_and_rejoins_after(
    make_pylogd: Callable[..., RunningBroker], registry: Registry, tmp_path: Path
) -> None:
    port = free_port()
    with contextlib.ExitStack() as stack:
        proxy = FreezableProxy(("127.0.0.1", port))
        stack.callback(proxy.close)
        through_proxy = f"tcp://127.0.0.1:{proxy.port}"
        leading = ("--broker-port", str(port), "--broker-advertised-port", str(proxy.port))
        brokers = {1: make_pylogd(*broker_flags(tmp_path, 1), *FLAGS, *leading, name="broker-1")}
        assert brokers[1].endpoint == f"tcp://127.0.0.1:{port}"  # the flag after RunningBroker's 0
        for i in (2, 3):
            brokers[i] = make_pylogd(*broker_flags(tmp_path, i), *FLAGS, name=f"broker-{i}")
        with Admin(through_proxy) as admin:
            admin.create_topic("cut", 1, REPLICATED)
        # Broker 1 leads: the partition's preferred leader (docs/replication.md, Placement).
        assert registry.topics.topic_config("cut").replicas[0] == (1, 2, 3)
        assert registry.topics.partition_state("cut", 0)[0].leader == 1
        leader = stack.enter_context(Connection(through_proxy, "tests", 10.0))

        def metadata_isr() -> tuple[int, ...]:
            """The ISR as METADATA tells it, asked of the leader through the proxy."""
            reply = leader.call(MetadataRequest(("cut",)), 0, version=METADATA_VERSION)
            (topic,) = reply.topics
            (partition,) = topic.partitions
            assert partition.broker_id == 1
            return tuple(sorted(partition.isr))

        def in_sync(replicas: tuple[int, ...]) -> bool:
            return isr(registry, "cut", 0) == replicas and metadata_isr() == replicas

        wait_until(lambda: in_sync((1, 2, 3)), what="all three in sync")
        producing = Producing(through_proxy, "cut")
        stack.callback(producing.join, 90)
        stack.callback(producing.stop.set)
        producing.start()
        producing.more(20, "acks before the cut")

        cut = brokers[2]
        proxy.freeze(proxy.from_processes(lambda: [cut.pid, *cut.worker_pids()]))
        # Broker 2's fetches stop; broker 3's, the producer's and METADATA go on.
        wait_until(lambda: in_sync((1, 3)), 30, "broker 2 to leave the ISR (state and METADATA)")
        held = len(stored(tmp_path, 2, "cut-0"))
        producing.more(20, "ack=all with brokers 1 and 3 in sync")
        assert isr(registry, "cut", 0) == (1, 3)
        assert len(stored(tmp_path, 2, "cut-0")) == held  # cut off: it copied nothing more

        proxy.thaw()
        wait_until(lambda: in_sync((1, 2, 3)), 30, "broker 2 to rejoin the ISR")
        producing.more(20, "ack=all with all three in sync")
        producing.stop.set()
        producing.join(90)
        assert not producing.is_alive() and producing.error is None, repr(producing.error)

        with PartitionConsumer(through_proxy, "cut", 0, stop_at_end=True) as consumer:
            read = {message.value for message in consumer}
        assert set(producing.acked) <= read  # none acknowledged lost (at least once)
        # Once it has copied the leader's last bytes: the same bytes where they overlap.
        leader_bytes = stored(tmp_path, 1, "cut-0")
        wait_until(lambda: len(stored(tmp_path, 2, "cut-0")) >= len(leader_bytes))
        for follower in (2, 3):
            copy = stored(tmp_path, follower, "cut-0")
            overlap = min(len(copy), len(leader_bytes))
            assert overlap > 0 and copy[:overlap] == leader_bytes[:overlap], follower
