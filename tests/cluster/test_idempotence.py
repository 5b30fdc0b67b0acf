"""The idempotent producer across a leader change on three real brokers (docs/protocol.md,
PRODUCE version 3 and FETCH version 5): followers copy the producers' entries with the bytes,
so the new leader answers a set the old one stored with its first offset, and stores it once."""

from __future__ import annotations

import functools

from broker.client import PartitionConsumer
from broker.client.admin import Admin
from broker.client.connection import Connection
from broker.errors import PylogError
from broker.log.message import encode_message
from broker.protocol import Ack, ProduceReply, ProduceRequest
from broker.registry import Registry
from tests.conftest import wait_until
from tests.pylogd import ThreeBrokers

THREE_BROKERS_FLAGS = ("--broker-replica-fetch-wait-ms", "200")
PRODUCER = 0x2F1E5D4C3B2A1908


def leader_of(registry: Registry) -> int:
    return registry.topics.partition_state("once", 0)[0].leader


def led_by_another(registry: Registry, old: int) -> bool:
    return leader_of(registry) not in (old, -1)


def answered(endpoint: str, request: ProduceRequest, replies: list[ProduceReply]) -> bool:
    """Whether the broker at `endpoint` answered `request` (noted in `replies`); False while
    it refuses it for now (not the leader yet, too few in sync)."""
    try:
        with Connection(endpoint, timeout_s=5) as connection:
            replies.append(connection.request(request))
    except PylogError:
        return False
    return True


def test_a_set_the_old_leader_stored_is_stored_once_by_the_new_one(
    own_three_brokers: ThreeBrokers,
) -> None:
    three = own_three_brokers
    registry, brokers = three.registry, three.brokers
    with Admin(brokers[1].endpoint) as admin:
        admin.create_topic("once", 1, {"replication_factor": "3", "min_insync_replicas": "2"})
    wait_until(lambda: leader_of(registry) > 0, what="a leader")
    sets = [
        ProduceRequest("once", 0, Ack.ALL, encode_message(b"v%d" % n), PRODUCER, 0, n)
        for n in range(3)
    ]
    replies: list[ProduceReply] = []
    old = leader_of(registry)
    for request in sets[:2]:  # stored on every replica of the ISR (ack all)
        wait_until(
            functools.partial(answered, brokers[old].endpoint, request, replies),
            what="the leader's ack",
        )
    brokers[old].kill()
    wait_until(functools.partial(led_by_another, registry, old), 60, "another leader")
    new = leader_of(registry)
    again: list[ProduceReply] = []
    for request in sets:  # the first two sent again (their replies "lost"), then the third
        wait_until(
            functools.partial(answered, brokers[new].endpoint, request, again),
            60,
            "the new leader's ack",
        )
    assert [(r.base_offset, r.count) for r in again[:2]] == [
        (r.base_offset, r.count) for r in replies
    ]
    assert again[2].base_offset > again[1].base_offset
    with PartitionConsumer(brokers[new].endpoint, "once", 0, stop_at_end=True) as reader:
        assert [m.value for m in reader] == [b"v0", b"v1", b"v2"]
