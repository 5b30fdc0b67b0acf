"""Reassignment on real brokers (docs/replication.md, "Reassignment"): a partition's replicas
move to the brokers asked for, a broker that joins is given partitions, and nothing a producer
had acknowledged is lost on the way."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

from click.testing import CliRunner, Result

from broker.client import Admin, PartitionConsumer, Producer
from broker.protocol import Ack
from broker.registry import Registry
from broker.zookeeper import PrivateZooKeeper
from cli.pylogctl import cli
from tests.cluster.conftest import broker_flags
from tests.cluster.test_replication import isr, stored
from tests.conftest import wait_until
from tests.pylogd import RunningBroker

FAST = ("--broker-replica-lag-max-ms", "1000", "--broker-replica-fetch-wait-ms", "200")


class Producing:
    """A producer at ack=all on its own thread, sending up to `limit` values until stopped;
    what was acknowledged."""

    def __init__(self, endpoint: str, topic: str, limit: int = 5000) -> None:
        self.producer = Producer(endpoint, topic, ack=Ack.ALL, batch_messages=5, max_in_flight=1)
        self.limit = limit
        self.acked: list[bytes] = []
        self.stop = threading.Event()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            for i in range(self.limit):
                if self.stop.is_set():
                    break
                value = b"value-%d" % i
                self.producer.send(value)
                if i % 5 == 4:
                    self.producer.flush()
                    self.acked_upto(i)
            self.producer.flush()
        except BaseException as error:  # reported by finish()
            self.error = error

    def acked_upto(self, i: int) -> None:
        self.acked = [b"value-%d" % j for j in range(i + 1)]

    def finish(self) -> list[bytes]:
        self.stop.set()
        self.thread.join(60)
        assert not self.thread.is_alive(), "the producer did not stop"
        self.producer.close()
        assert self.error is None, repr(self.error)
        return self.acked


def read_all(endpoint: str, topic: str, partition: int) -> list[bytes]:
    with PartitionConsumer(endpoint, topic, partition, stop_at_end=True) as consumer:
        return [message.value for message in consumer]


def reassigned(registry: Registry, topic: str, partition: int, replicas: tuple[int, ...]) -> bool:
    return (
        registry.topics.topic_config(topic).replicas[partition] == replicas
        and (topic, partition) not in registry.reassignments.read()
    )


def test_a_broker_that_joins_takes_over_a_replica_while_a_producer_goes_on(
    make_pylogd: Callable[..., RunningBroker], registry: Registry, tmp_path: Path
) -> None:
    one, two = (make_pylogd(*broker_flags(tmp_path, i), *FAST, name=f"broker-{i}") for i in (1, 2))
    with Admin(one.endpoint) as admin:
        admin.create_topic("moving", 1, {"replication_factor": "2", "min_insync_replicas": "1"})
    assert registry.topics.topic_config("moving").replicas == ((1, 2),)
    producing = Producing(one.endpoint, "moving")
    wait_until(lambda: len(producing.acked) >= 100, what="acks before the move")
    three = make_pylogd(*broker_flags(tmp_path, 3), *FAST, name="broker-3")

    asked = registry.reassignments.start_reassignment(
        "moving", 0, (3, 2), list(registry.brokers.read())
    )
    assert asked is not None and asked.original == (1, 2)
    wait_until(lambda: reassigned(registry, "moving", 0, (3, 2)), timeout=30, what="the move")
    state = registry.topics.partition_state("moving", 0)[0]
    assert state.leader == 3  # broker 1 left: the first wanted replica leads
    assert set(state.isr) <= {2, 3}
    # broker 1 deleted its copy; its registration no longer names the partition
    wait_until(lambda: not (tmp_path / "broker-1" / "logs" / "moving-0").exists())
    wait_until(lambda: 1 not in registry.topics.topic_brokers("moving"))

    wait_until(lambda: len(producing.acked) >= 200, what="acks after")
    acked = producing.finish()
    wait_until(lambda: isr(registry, "moving", 0) == (2, 3), timeout=30)
    values = read_all(three.endpoint, "moving", 0)
    assert set(acked) <= set(values)  # nothing acknowledged lost
    assert stored(tmp_path, 3, "moving-0") == stored(tmp_path, 2, "moving-0")
    assert two.process is not None and two.process.poll() is None


def test_a_single_copy_partition_moves_to_another_broker(
    make_pylogd: Callable[..., RunningBroker], registry: Registry, tmp_path: Path
) -> None:
    one, two = (make_pylogd(*broker_flags(tmp_path, i), *FAST, name=f"broker-{i}") for i in (1, 2))
    with Admin(one.endpoint) as admin:
        admin.create_topic("single", 2)
    config = registry.topics.topic_config("single")
    assert config.replicas == ((1,), (2,))
    with Producer(one.endpoint, "single", ack=Ack.FLUSHED) as producer:
        for i in range(300):
            producer.send(b"before-%d" % i, partition=0)
        producer.flush()
    before = read_all(one.endpoint, "single", 0)

    registry.reassignments.start_reassignment("single", 0, (2,), list(registry.brokers.read()))
    wait_until(lambda: reassigned(registry, "single", 0, (2,)), timeout=30, what="the move")
    assert registry.topics.partition_state("single", 0)[0].leader == 2
    wait_until(lambda: not (tmp_path / "broker-1" / "logs" / "single-0").exists())
    assert read_all(one.endpoint, "single", 0) == before  # through METADATA, from broker 2
    with Producer(two.endpoint, "single", ack=Ack.FLUSHED) as producer:
        producer.send(b"after", partition=0)
        producer.flush()
    assert read_all(two.endpoint, "single", 0) == [*before, b"after"]
    # the partition keeps its name broker: a group's committed offsets stay where they were
    assert registry.topics.topic_config("single").brokers == (1, 2)


def pylogctl(zookeeper: PrivateZooKeeper, chroot: str, *args: str) -> Result:
    options = ("--zookeeper", zookeeper.connect_string, "--chroot", chroot)
    return CliRunner().invoke(cli, [*args, *options], catch_exceptions=False)


def test_pylogctl_spreads_a_topic_onto_a_broker_that_joined_and_elects_preferred_leaders(
    make_pylogd: Callable[..., RunningBroker],
    registry: Registry,
    zookeeper: PrivateZooKeeper,
    registry_chroot: str,
    tmp_path: Path,
) -> None:
    one, _ = (make_pylogd(*broker_flags(tmp_path, i), *FAST, name=f"broker-{i}") for i in (1, 2))
    with Admin(one.endpoint) as admin:
        admin.create_topic("spread", 3)
        admin.create_topic("pair", 1, {"replication_factor": "2"})
    assert registry.topics.topic_config("spread").replicas == ((1,), (2,), (1,))
    with Producer(one.endpoint, "spread", ack=Ack.FLUSHED) as producer:
        for i in range(100):
            producer.send(b"kept-%d" % i, partition=2)
        producer.flush()
    make_pylogd(*broker_flags(tmp_path, 3), *FAST, name="broker-3")

    planned = pylogctl(
        zookeeper, registry_chroot, "topic", "reassign", "spread", "--spread", "--dry-run"
    )
    assert planned.exit_code == 0, planned.output
    assert planned.output == "spread-2: replicas 1 -> 3\n"
    assert registry.reassignments.read() == {}  # a dry run moves nothing

    moved = pylogctl(
        zookeeper,
        registry_chroot,
        "topic",
        "reassign",
        "spread",
        "--spread",
        "--wait-timeout",
        "60",
    )
    assert moved.exit_code == 0, moved.output
    lines = moved.output.splitlines()
    assert lines[0] == "spread-2: replicas 1 -> 3"
    assert lines[-1] == "spread-2: done: replicas 3 leader 3 isr 3"
    assert registry.topics.topic_config("spread").replicas == ((1,), (2,), (3,))
    assert read_all(one.endpoint, "spread", 2) == [b"kept-%d" % i for i in range(100)]
    status = pylogctl(zookeeper, registry_chroot, "topic", "reassign", "--status")
    assert status.output == "no reassignment under way\n"

    # Reordered replicas: broker 2 becomes the preferred leader; broker 1 goes on leading
    # until a preferred-leader election moves leadership.
    reordered = pylogctl(
        zookeeper, registry_chroot, "topic", "reassign", "pair", "--partition", "0",
        "--replicas", "2,1", "--wait-timeout", "60",
    )  # fmt: skip
    assert reordered.exit_code == 0, reordered.output
    assert registry.topics.partition_state("pair", 0)[0].leader == 1
    elected = pylogctl(zookeeper, registry_chroot, "topic", "elect-preferred", "pair")
    assert elected.exit_code == 0, elected.output
    assert elected.output == "pair: 1 partitions led by their preferred leader\n"
    assert registry.topics.partition_state("pair", 0)[0].leader == 2


def test_pylogctl_reassign_refuses_what_cannot_be_done(
    make_pylogd: Callable[..., RunningBroker],
    zookeeper: PrivateZooKeeper,
    registry_chroot: str,
    tmp_path: Path,
) -> None:
    one = make_pylogd(*broker_flags(tmp_path, 1), name="broker-1")
    with Admin(one.endpoint) as admin:
        admin.create_topic("fixed", 1)
    cases = {
        ("fixed", "--partition", "0", "--replicas", "1,7"): "broker(s) [7] are not registered",
        ("fixed", "--partition", "0", "--replicas", "1,1"): "replicas must be distinct",
        ("fixed", "--partition", "3", "--replicas", "1"): "partition 3 does not exist",
        ("ghost", "--partition", "0", "--replicas", "1"): "topic 'ghost' does not exist",
        ("fixed", "--partition", "0", "--replicas", "x"): "is not broker ids",
        ("fixed", "--partition", "0"): "--partition and --replicas go together",
        ("fixed",): "give --partition and --replicas, or --spread",
        ("fixed", "--partition", "0", "--cancel"): "no reassignment of partition 0",
    }
    for args, message in cases.items():
        result = pylogctl(zookeeper, registry_chroot, "topic", "reassign", *args)
        assert result.exit_code != 0, (args, result.output)
        assert message in result.output, (args, result.output)
    same = pylogctl(
        zookeeper,
        registry_chroot,
        "topic",
        "reassign",
        "fixed",
        "--partition",
        "0",
        "--replicas",
        "1",
    )
    assert same.exit_code == 0 and "has those replicas already" in same.output
