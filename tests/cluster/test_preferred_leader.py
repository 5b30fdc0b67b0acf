"""Preferred-leader election on three real brokers (docs/replication.md, "The controller"): the
controller moves leadership back to a partition's preferred leader by itself, every
`broker.leader_rebalance_interval_ms`, once that broker is back and in sync."""

from __future__ import annotations

from broker.client import PartitionConsumer, Producer
from broker.client.admin import Admin
from broker.protocol import Ack
from broker.registry import NO_LEADER
from tests.conftest import wait_until
from tests.pylogd import RunningBroker, ThreeBrokers

THREE_BROKERS_FLAGS = (
    *("--broker-replica-lag-max-ms", "1000", "--broker-replica-fetch-wait-ms", "200"),
    *("--zookeeper-session-timeout-ms", "2000"),
    *("--broker-leader-rebalance-interval-ms", "500"),
)
"""Of the test's own three brokers: a dead leader's session expires after 2 s; the controller
runs preferred-leader election every 0.5 s."""

REQUEST_TIMEOUT_S = 2.0
"""The producer's wait for a reply (10 s by default): the killed broker, among the bootstrap
brokers, is given up after it."""


def produce(brokers: dict[int, RunningBroker], tag: bytes, count: int) -> list[bytes]:
    """`count` values sent at ack=all through every broker as bootstrap, each acknowledged."""
    bootstrap = ",".join(b.endpoint.removeprefix("tcp://") for b in brokers.values())
    values = [tag + b"-%d" % i for i in range(count)]
    with Producer(
        bootstrap,
        "homing",
        ack=Ack.ALL,
        retries=None,
        delivery_timeout_s=60,
        batch_messages=10,
        timeout_s=REQUEST_TIMEOUT_S,
    ) as producer:
        for value in values:
            producer.send(value)
        assert sum(ack.count for ack in producer.flush()) == count
    return values


def test_leadership_comes_back_to_a_restarted_preferred_leader_once_it_is_in_sync(
    own_three_brokers: ThreeBrokers,
) -> None:
    registry, brokers = own_three_brokers.registry, own_three_brokers.brokers
    with Admin(brokers[1].endpoint) as admin:
        admin.create_topic("homing", 1, {"replication_factor": "3", "min_insync_replicas": "2"})
    preferred = registry.topics.topic_config("homing").replicas[0][0]
    first = registry.topics.partition_state("homing", 0)[0]
    assert first.leader == preferred
    sent = produce(brokers, b"before", 50)

    brokers[preferred].kill()
    wait_until(
        lambda: (
            registry.topics.partition_state("homing", 0)[0].leader not in (preferred, NO_LEADER)
        ),
        60,
        "another broker to lead",
    )
    moved = registry.topics.partition_state("homing", 0)[0]
    assert preferred not in moved.isr
    sent += produce(brokers, b"meanwhile", 50)  # to the new leader, at ack=all

    own_three_brokers.restart(preferred)  # stopped at the end with the others
    # Leadership comes back only once the preferred leader is in the ISR again; the
    # controller's elections are the only writes that change the leader.
    wait_until(
        lambda: registry.topics.partition_state("homing", 0)[0].leader == preferred,
        60,
        "the preferred leader to lead again",
    )
    back = registry.topics.partition_state("homing", 0)[0]
    assert preferred in back.isr and back.leader_epoch > moved.leader_epoch
    sent += produce(brokers, b"after", 50)

    with PartitionConsumer(brokers[preferred].endpoint, "homing", 0, stop_at_end=True) as c:
        read = [message.value for message in c]
    assert set(sent) <= set(read)  # at-least-once: a retried batch may be stored twice
