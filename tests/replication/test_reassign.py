"""Reassignment by the controller (docs/replication.md, "Reassignment"): its steps as a pure
function, then the controller taking them against a real ZooKeeper, with brokers as registry
sessions (tests/replication/test_controller.py) and the leader's ISR changes written by hand."""

from __future__ import annotations

import dataclasses

import pytest

from broker.errors import InvalidTopic, UnknownTopicOrPartition
from broker.registry import (
    PartitionState,
    Reassignment,
    ReassignmentInProgress,
    Registry,
    TopicConfig,
)
from broker.registry.admin import ElectionInProgress
from broker.replication.reassign import Step, next_step
from tests.conftest import wait_until
from tests.replication.test_controller import TOPIC, Broker, Service


def test_next_step_adds_the_wanted_replicas_then_waits_then_finishes_in_one_step() -> None:
    alive = {1: 11, 2: 12, 3: 13}
    state = PartitionState(1, 4, (1, 2), 7, 11)
    assert next_step((3, 2), (1, 2), state, alive, 9) == Step("expand", (1, 2, 3))
    assert next_step((3, 2), (1, 2, 3), state, alive, 9) == Step(
        "wait", (1, 2, 3), waiting_for=(3,)
    )
    caught_up = PartitionState(1, 4, (1, 2, 3), 7, 11)
    # the leader is removed: the first wanted replica in sync leads, in a new epoch
    assert next_step((3, 2), (1, 2, 3), caught_up, alive, 9) == Step(
        "finish", (3, 2), PartitionState(3, 5, (2, 3), 9, 13)
    )
    # the leader stays: same epoch and incarnation, the ISR loses the removed broker
    assert next_step((2, 1), (1, 2, 3), caught_up, alive, 9) == Step(
        "finish", (2, 1), PartitionState(1, 4, (1, 2), 9, 11)
    )
    # the first wanted replica is dead: the next alive one leads
    assert next_step((3, 2), (1, 2, 3), caught_up, {1: 11, 2: 12}, 9).state == PartitionState(
        2, 5, (2, 3), 9, 12
    )
    # no leader now: wait for one
    offline = PartitionState(-1, 5, (1, 2, 3), 7)
    assert next_step((3, 2), (1, 2, 3), offline, {2: 12, 3: 13}, 9) == Step("wait", (1, 2, 3))


def start_topic(registry: Registry, replicas: tuple[tuple[int, ...], ...]) -> None:
    registry.topics.create_topic_config(
        TOPIC, TopicConfig(len(replicas), tuple(r[0] for r in replicas), {}, replicas)
    )


def join_isr(registry: Registry, partition: int, broker_id: int) -> None:
    """What the leader does once a follower has caught up: the ISR grows, the leader, its
    epoch and its incarnation (broker epoch) stay. (A state without the incarnation, as this
    wrote before, is a leader no longer alive to the controller, which chose it again in a new
    epoch whenever its round came before the reassignment's end.)"""
    state, version = registry.topics.partition_state(TOPIC, partition)
    joined = dataclasses.replace(state, isr=(*state.isr, broker_id), controller_epoch=0)
    registry.topics.write_partition_state(TOPIC, partition, joined, version)


def test_the_controller_moves_a_partition_once_its_new_replica_is_in_sync(
    make_broker: Broker, service: Service
) -> None:
    one, _, _ = (make_broker(b) for b in (1, 2, 3))
    start_topic(one, ((1, 2), (2, 1)))
    controller = service(one, 1)
    wait_until(lambda: controller.controller_epoch is not None, what="an election")

    asked = one.reassignments.start_reassignment(TOPIC, 0, (3, 2), list(one.brokers.read()))
    assert asked == Reassignment(TOPIC, 0, (3, 2), (1, 2))
    with pytest.raises(ReassignmentInProgress, match="being reassigned already"):
        one.reassignments.start_reassignment(TOPIC, 0, (3, 1), list(one.brokers.read()))
    wait_until(
        lambda: one.topics.topic_config(TOPIC).replicas == ((1, 2, 3), (2, 1)), what="expand"
    )
    # broker 3 is not in sync yet: nothing more happens
    wait_until(lambda: controller.statistics().reassignments_waiting == 1, what="a wait")
    assert one.topics.partition_state(TOPIC, 0)[0].isr == (1, 2)
    assert (TOPIC, 0) in one.reassignments.read()

    join_isr(one, 0, 3)
    wait_until(lambda: one.reassignments.read() == {}, what="the finish")
    config = one.topics.topic_config(TOPIC)
    assert config.replicas == ((3, 2), (2, 1))
    assert config.brokers == (1, 2)  # the partitions' names (group nodes) do not move
    state = one.topics.partition_state(TOPIC, 0)[0]
    assert (state.leader, state.leader_epoch, state.isr) == (3, 1, (2, 3))
    # the controller counts a step after ZooKeeper has it: wait for the count too
    wait_until(lambda: controller.statistics().reassignments_done == 1, what="the finish counted")
    stats = controller.statistics()
    assert (stats.reassign_steps, stats.reassignments_waiting) == (2, 0)


def test_a_new_controller_finishes_a_reassignment_its_predecessor_began(
    make_broker: Broker, service: Service
) -> None:
    one, two, _ = (make_broker(b) for b in (1, 2, 3))
    start_topic(one, ((1, 2),))
    first = service(one, 1)
    wait_until(lambda: first.controller_epoch is not None, what="an election")
    one.reassignments.start_reassignment(TOPIC, 0, (2, 3), list(one.brokers.read()))
    wait_until(lambda: one.topics.topic_config(TOPIC).replicas == ((1, 2, 3),), what="expand")
    assert first.stop()

    second = service(two, 2)
    wait_until(lambda: second.controller_epoch is not None, what="the next election")
    join_isr(two, 0, 3)
    wait_until(lambda: two.reassignments.read() == {}, what="the finish")
    assert two.topics.topic_config(TOPIC).replicas == ((2, 3),)
    state = two.topics.partition_state(TOPIC, 0)[0]
    assert (state.leader, state.isr) == (2, (2, 3))


def test_a_reassignment_of_a_deleted_topic_is_dropped(
    make_broker: Broker, service: Service
) -> None:
    one, _ = (make_broker(b) for b in (1, 2))
    start_topic(one, ((1,),))
    one.reassignments.start_reassignment(TOPIC, 0, (2,), list(one.brokers.read()))
    one.topics.delete_topic_config(TOPIC)
    service(one, 1)
    wait_until(lambda: one.reassignments.read() == {}, what="the reassignment dropped")


def test_reassignments_and_elections_asked_are_checked_first(make_broker: Broker) -> None:
    one = make_broker(1)
    start_topic(one, ((1,), (1,)))
    live = list(one.brokers.read())
    assert one.reassignments.start_reassignment(TOPIC, 1, (1,), live) is None  # nothing to move
    for replicas, message in [
        ((), "at least one replica"),
        ((1, 1), "distinct"),
        ((1, 5), r"broker\(s\) \[5\] are not registered"),
        ((-1,), "a broker id is an integer >= 0"),
    ]:
        with pytest.raises(InvalidTopic, match=message):
            one.reassignments.start_reassignment(TOPIC, 0, replicas, live)
    one.topics.create_topic_config(
        "strict", TopicConfig(1, (1,), {"min_insync_replicas": 2}, ((1, 2),))
    )
    with pytest.raises(InvalidTopic, match="below its min_insync_replicas 2"):
        one.reassignments.start_reassignment("strict", 0, (1,), live)
    with pytest.raises(UnknownTopicOrPartition, match="partition 2 does not exist"):
        one.reassignments.start_reassignment(TOPIC, 2, (1,), live)
    with pytest.raises(UnknownTopicOrPartition, match="no reassignment of partition 0"):
        one.reassignments.cancel_reassignment(TOPIC, 0)
    assert one.reassignments.read() == {}

    one.reassignments.ask_preferred_election([TOPIC])
    assert one.reassignments.preferred_election_asked() == (True, [TOPIC])
    with pytest.raises(ElectionInProgress):
        one.reassignments.ask_preferred_election(None)
    one.reassignments.end_preferred_election()
    assert one.reassignments.preferred_election_asked() == (False, None)
    with pytest.raises(UnknownTopicOrPartition):
        one.reassignments.ask_preferred_election(["ghost"])
