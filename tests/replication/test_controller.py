"""The controller's failover (docs/replication.md, "The controller") against a real ZooKeeper.

Each broker is a registry session of its own that registers the broker (closing the session is
the broker dying; a new session registering the id is it coming back); a ControllerService runs
on a session as its broker's supervisor runs one. Every wait is on a condition, bounded."""

from __future__ import annotations

import dataclasses
import json
import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from functools import cached_property
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from kazoo.client import KazooClient, TransactionRequest

from broker.clock import SYSTEM_CLOCK, Clock
from broker.errors import UnknownTopicOrPartition
from broker.registry import NO_LEADER, BrokerRegistration, PartitionState, Registry, TopicConfig
from broker.registry.session import Failed, Session, Stat
from broker.registry.topics import TopicNodes
from broker.replication import acting
from broker.replication.acting import Acting, Counters
from broker.replication.controller import ControllerService, NotController
from broker.replication.election import choose_leader, choose_preferred
from broker.zookeeper import PrivateZooKeeper
from perf.bench_replication import AckedProducer, BenchCluster
from tests.conftest import REQUEST_TIMEOUT_S, SESSION_TIMEOUT_S, FakeClock, wait_until
from tests.registry.test_registry import expire_session

TOPIC = "clicks"

Broker = Callable[[int], Registry]
Service = Callable[..., ControllerService]
"""service(registry, broker_id, **start's keywords): a started ControllerService."""


@pytest.fixture
def make_broker(make_registry: Callable[..., Registry]) -> Broker:
    """A broker: a registry session of its own with the broker's id registered."""

    def make(broker_id: int) -> Registry:
        registry = make_registry()
        registry.brokers.register(broker_id, BrokerRegistration("127.0.0.1", 9000 + broker_id))
        return registry

    return make


@pytest.fixture
def service(make_registry: Callable[..., Registry]) -> Iterator[Service]:
    """Start controller services; each is stopped (within its bound) before the registries."""
    started: list[ControllerService] = []

    def start(
        registry: Registry, broker_id: int, clock: Clock = SYSTEM_CLOCK, **options: int
    ) -> ControllerService:
        controller = ControllerService(clock)
        controller.start(registry, broker_id, **options)
        started.append(controller)
        return controller

    yield start
    for controller in started:
        assert controller.stop(), "the controller's thread did not end in time"


def plain(state: PartitionState) -> PartitionState:
    """`state` without the leader's broker epoch (a zxid: not known in advance)."""
    return dataclasses.replace(state, leader_broker_epoch=-1)


def plained(found: tuple[PartitionState, int]) -> tuple[PartitionState, int]:
    """A state and its version, the state `plain`."""
    return plain(found[0]), found[1]


def incarnate(registry: Registry, state: PartitionState) -> PartitionState:
    """`state` with its leader in the incarnation registered now: what a controller writes."""
    epoch = registry.brokers.epochs().get(state.leader, -1)
    return dataclasses.replace(state, leader_broker_epoch=epoch)


def wait_state(registry: Registry, partition: int, expected: PartitionState, what: str) -> None:
    """Until the partition's state is `expected`, its leader's broker epoch aside (checked: the
    incarnation registered now, when it is alive)."""

    def reached() -> bool:
        state = registry.topics.partition_state(TOPIC, partition)[0]
        alive = registry.brokers.epochs()
        if state.leader in alive and state.leader_broker_epoch != alive[state.leader]:
            return False
        return plain(state) == expected

    wait_until(reached, what=what)


def wait_controller(controller: ControllerService, epoch: int) -> None:
    wait_until(lambda: controller.controller_epoch == epoch, what=f"controller epoch {epoch}")


def messages(caplog: pytest.LogCaptureFixture, level: int) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "pylog.controller" and r.levelno == level
    ]


# -- the choices, as pure functions ------------------------------------------------------------


def up(*broker_ids: int) -> dict[int, int]:
    """Live brokers, each in its incarnation (broker epoch) 10 + its id."""
    return {b: 10 + b for b in broker_ids}


def test_choose_leader_takes_the_first_alive_isr_replica_in_replicas_order() -> None:
    state = PartitionState(1, 4, (1, 3, 2), 2, 11)
    choice = choose_leader(state, (1, 2, 3), up(2, 3), unclean=False, controller_epoch=5)
    assert choice is not None and choice.kind == "leader"
    # replicas' order, the ISR's order kept, the chosen leader's incarnation named
    assert choice.state == PartitionState(2, 5, (3, 2), 5, 12)


def test_choose_leader_without_an_alive_isr_replica_goes_offline_once_or_unclean() -> None:
    state = PartitionState(1, 4, (1,), 2, 11)
    offline = choose_leader(state, (1, 2, 3), up(3, 2), unclean=False, controller_epoch=5)
    assert offline is not None and offline.kind == "offline"
    assert offline.state == PartitionState(NO_LEADER, 5, (1,), 5)  # the ISR kept: who may lead
    assert (
        choose_leader(offline.state, (1, 2, 3), up(3, 2), unclean=False, controller_epoch=5) is None
    )
    unclean = choose_leader(offline.state, (1, 2, 3), up(3, 2), unclean=True, controller_epoch=6)
    assert unclean is not None and unclean.kind == "unclean"
    assert unclean.state == PartitionState(2, 6, (2,), 6, 12)
    back = choose_leader(offline.state, (1, 2, 3), up(1), unclean=False, controller_epoch=5)
    assert back is not None and back.state == PartitionState(1, 6, (1,), 5, 11)


def test_a_leader_whose_broker_registered_again_is_chosen_anew_in_a_new_epoch() -> None:
    """A restart within the ZooKeeper session (KIP-380): the broker is alive, but in another
    incarnation than the one chosen; it may lead again, never in the old epoch."""
    state = PartitionState(1, 4, (1, 2, 3), 2, 11)
    restarted = {1: 17, 2: 12, 3: 13}
    choice = choose_leader(state, (1, 2, 3), restarted, unclean=False, controller_epoch=5)
    assert choice is not None and choice.kind == "leader"
    assert choice.state == PartitionState(1, 5, (1, 2, 3), 5, 17)
    alone = PartitionState(1, 0, (1,), 0, 11)  # replication factor 1
    again = choose_leader(alone, (1,), {1: 17}, unclean=False, controller_epoch=5)
    assert again is not None and again.state == PartitionState(1, 1, (1,), 5, 17)
    # A node written before broker epochs (-1) is settled the same way, once.
    legacy = PartitionState(1, 4, (1, 2), 2)
    settled = choose_leader(legacy, (1, 2), up(1, 2), unclean=False, controller_epoch=5)
    assert settled is not None and settled.state == PartitionState(1, 5, (1, 2), 5, 11)
    assert choose_leader(settled.state, (1, 2), up(1, 2), unclean=False, controller_epoch=5) is None


broker_ids = st.integers(0, 5)


@given(
    replicas=st.lists(broker_ids, min_size=1, max_size=4, unique=True),
    data=st.data(),
    alive_ids=st.sets(broker_ids),
    restarted=st.booleans(),
    unclean=st.booleans(),
)
def test_choose_leader_properties(
    replicas: list[int],
    data: st.DataObject,
    alive_ids: set[int],
    restarted: bool,
    unclean: bool,
) -> None:
    isr = data.draw(st.lists(st.sampled_from(replicas), min_size=1, unique=True), label="isr")
    leader = data.draw(st.sampled_from([NO_LEADER, *isr]), label="leader")
    alive = up(*alive_ids)
    chosen_incarnation = -1 if leader == NO_LEADER else 10 + leader - restarted
    state = PartitionState(leader, 3, tuple(isr), 1, chosen_incarnation)
    current = leader in alive and not restarted
    choice = choose_leader(state, replicas, alive, unclean=unclean, controller_epoch=2)
    if choice is None:  # nothing to do: a live leader with a live ISR, or offline already
        assert (current and set(isr) <= set(alive)) or (
            leader == NO_LEADER
            and not (set(isr) & set(alive))
            and not (unclean and set(replicas) & set(alive))
        )
        return
    new = choice.state
    assert new.controller_epoch == 2
    if current:  # only dead followers leave
        assert choice.kind == "isr" and new.leader == leader and new.leader_epoch == 3
        assert new.isr == tuple(b for b in isr if b in alive)
        assert new.leader_broker_epoch == state.leader_broker_epoch
        return
    assert new.leader_epoch == 4
    if new.leader == NO_LEADER:
        assert choice.kind == "offline" and new.isr == state.isr and not (set(isr) & set(alive))
        assert not unclean or not (set(replicas) & set(alive))
    else:
        assert new.leader in alive and new.leader in replicas and new.leader in new.isr
        assert new.leader_broker_epoch == alive[new.leader]
        assert set(new.isr) <= set(alive)
        if choice.kind == "leader":
            candidates = [b for b in replicas if b in alive and b in isr]
            assert new.leader == candidates[0]
        else:
            assert choice.kind == "unclean" and unclean and new.isr == (new.leader,)
            assert not (set(isr) & set(alive))
            assert new.leader == next(b for b in replicas if b in alive)


def test_choose_preferred_moves_only_to_an_alive_in_sync_preferred_leader() -> None:
    state = PartitionState(2, 3, (2, 1), 1, 12)
    choice = choose_preferred(state, (1, 2), up(1, 2), controller_epoch=4)
    assert choice is not None and choice.state == PartitionState(1, 4, (2, 1), 4, 11)
    assert choose_preferred(state, (1, 2), up(2), controller_epoch=4) is None  # 1 is dead
    assert (
        choose_preferred(PartitionState(2, 3, (2,), 1, 12), (1, 2), up(1, 2), controller_epoch=4)
        is None
    )
    assert (
        choose_preferred(PartitionState(1, 3, (1, 2), 1, 11), (1, 2), up(1, 2), controller_epoch=4)
        is None
    )


# -- failover against ZooKeeper ----------------------------------------------------------------


def test_a_dead_leaders_partitions_go_to_the_next_isr_replica_and_it_leaves_every_isr(
    make_broker: Broker, service: Service, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="pylog.controller")
    one, two, three, four = make_broker(1), make_broker(2), make_broker(3), make_broker(4)
    four.topics.create_topic_config(TOPIC, TopicConfig.spread(3, [1, 2, 3], replication_factor=3))
    assert [four.topics.partition_state(TOPIC, p)[0].isr for p in range(3)] == [
        (1, 2, 3),
        (2, 3, 1),
        (3, 1, 2),
    ]
    controller = service(four, 4)
    wait_controller(controller, 1)
    one.stop()  # broker 1 dies
    wait_state(four, 0, PartitionState(2, 1, (2, 3), 1), "broker 2 leading partition 0")
    wait_state(four, 1, PartitionState(2, 0, (2, 3), 1), "broker 1 out of partition 1's ISR")
    wait_state(four, 2, PartitionState(3, 0, (3, 2), 1), "broker 1 out of partition 2's ISR")
    # counted and logged once written: wait for the last write's count
    wait_until(lambda: controller.statistics().isr_removals == 2, what="2 ISR removals counted")
    stats = controller.statistics()
    assert (stats.leaders_chosen, stats.unclean_elections, stats.offline_partitions) == (1, 0, 0)
    assert stats.elections == 1
    assert any("clicks-0: leader 1 -> 2" in m for m in messages(caplog, logging.INFO))
    assert (
        two.topics.partition_state(TOPIC, 0)[1] == 1
        and three.topics.partition_state(TOPIC, 1)[1] == 1
    )


def test_without_an_alive_isr_replica_a_partition_has_no_leader_until_one_returns(
    make_broker: Broker,
    service: Service,
    caplog: pytest.LogCaptureFixture,
) -> None:
    one, _two, three = make_broker(1), make_broker(2), make_broker(3)
    three.topics.create_topic_config(TOPIC, TopicConfig.spread(1, [1, 2], replication_factor=2))
    three.topics.write_partition_state(
        TOPIC, 0, incarnate(three, PartitionState(1, 0, (1,), 0)), 0
    )  # 2 fell behind
    controller = service(three, 3)
    wait_controller(controller, 1)
    one.stop()
    offline = PartitionState(NO_LEADER, 1, (1,), 1)
    wait_state(three, 0, offline, "partition 0 without a leader")
    wait_until(lambda: controller.statistics().offline_partitions == 1, what="counted offline")
    errors = messages(caplog, logging.ERROR)
    assert len(errors) == 1 and "clicks-0: no replica of the ISR [1] is alive" in errors[0]
    assert plained(three.topics.partition_state(TOPIC, 0)) == (
        offline,
        2,
    )  # broker 2, not in sync, is not chosen

    make_broker(1)  # broker 1 comes back
    wait_state(three, 0, PartitionState(1, 2, (1,), 1), "broker 1 leading again")
    wait_until(lambda: controller.statistics().offline_partitions == 0, what="none offline")
    assert len(messages(caplog, logging.ERROR)) == 1


def test_with_unclean_election_allowed_an_alive_replica_outside_the_isr_leads(
    make_broker: Broker, service: Service, caplog: pytest.LogCaptureFixture
) -> None:
    one, _two, three = make_broker(1), make_broker(2), make_broker(3)
    config = TopicConfig.spread(1, [1, 2], {"unclean_leader_election": 1}, replication_factor=2)
    three.topics.create_topic_config(TOPIC, config)
    three.topics.write_partition_state(TOPIC, 0, incarnate(three, PartitionState(1, 0, (1,), 0)), 0)
    controller = service(three, 3)
    wait_controller(controller, 1)
    one.stop()
    wait_state(three, 0, PartitionState(2, 1, (2,), 1), "broker 2 leading, uncleanly")
    wait_until(lambda: controller.statistics().unclean_elections == 1, what="counted unclean")
    warnings = messages(caplog, logging.WARNING)
    assert any("clicks-0: UNCLEAN leader election" in m and "broker 2" in m for m in warnings)


def test_allowing_unclean_election_live_brings_an_offline_partition_back(
    make_broker: Broker, service: Service
) -> None:
    one, _two, three = make_broker(1), make_broker(2), make_broker(3)
    three.topics.create_topic_config(TOPIC, TopicConfig.spread(1, [1, 2], replication_factor=2))
    three.topics.write_partition_state(TOPIC, 0, incarnate(three, PartitionState(1, 0, (1,), 0)), 0)
    controller = service(three, 3)
    wait_controller(controller, 1)
    one.stop()
    wait_state(three, 0, PartitionState(NO_LEADER, 1, (1,), 1), "partition 0 without a leader")
    three.topics.alter_topic_settings(TOPIC, lambda s: {**s, "unclean_leader_election": 1})
    wait_state(three, 0, PartitionState(2, 2, (2,), 1), "broker 2 leading, uncleanly")


class InterferingTopics(TopicNodes):
    """Topics in the registry on which another writer's write lands between the controller's
    read of a state node and its first write of it, once: what a leader changing the ISR
    meanwhile does."""

    interference: Callable[[], object] | None = None

    def write_partition_states(
        self, topic: str, writes: Sequence[tuple[int, PartitionState, int]], controller_epoch: int
    ) -> list[int] | None:
        interference, self.interference = self.interference, None
        if interference is not None:
            interference()
        return super().write_partition_states(topic, writes, controller_epoch)


class Interfering(Registry):
    """A registry whose topics are InterferingTopics."""

    @cached_property
    def topics(self) -> InterferingTopics:
        return InterferingTopics(self.session, self.brokers)


def test_a_state_written_since_it_was_read_is_read_again_and_decided_anew(
    make_broker: Broker, service: Service, zookeeper: PrivateZooKeeper, registry_chroot: str
) -> None:
    one, two, _three = make_broker(1), make_broker(2), make_broker(3)
    one.topics.create_topic_config(TOPIC, TopicConfig.spread(1, [1, 2, 3], replication_factor=3))
    registry = Interfering(
        zookeeper.connect_string,
        registry_chroot,
        session_timeout_s=SESSION_TIMEOUT_S,
        request_timeout_s=REQUEST_TIMEOUT_S,
    )
    registry.start(timeout=10)
    try:
        controller = service(registry, 4)
        wait_controller(controller, 1)
        # the leader drops 3 from the ISR just before the controller's write that drops 2
        shrunk = PartitionState(1, 0, (1, 2), 0)
        registry.topics.interference = lambda: one.topics.write_partition_state(
            TOPIC, 0, incarnate(one, shrunk), 0
        )
        two.stop()
        wait_state(one, 0, PartitionState(1, 0, (1,), 1), "broker 2 out of the ISR too")
        assert (
            one.topics.partition_state(TOPIC, 0)[1] == 2
        )  # the leader's write, then the controller's
        assert controller.stop()
    finally:
        registry.stop()


class CountingSession(Session):
    """A session that counts its transactions and the state nodes it reads together
    (get_many)."""

    commits = 0
    states_read = 0

    def commit(self, what: str, build: Callable[[TransactionRequest], None]) -> list[Any]:
        self.commits += 1
        return super().commit(what, build)

    def get_many(self, what: str, paths: Sequence[str]) -> list[tuple[bytes, Stat] | Failed]:
        self.states_read += sum(path.endswith("/state") for path in paths)
        return super().get_many(what, paths)


class Counting(Registry):
    """A registry on a CountingSession."""

    session_type = CountingSession


def counted_controller(
    make_registry: Callable[..., Registry], service: Service, broker_id: int
) -> tuple[ControllerService, CountingSession]:
    """A controller service of broker `broker_id` on a Counting registry, elected (epoch 1),
    with no periodic preferred-leader election (its reads would come at any time)."""
    counting = make_registry(of=Counting)
    session = counting.session
    assert isinstance(session, CountingSession)
    controller = service(counting, broker_id, leader_rebalance_interval_ms=0)
    wait_controller(controller, 1)
    return controller, session


def test_a_restarted_brokers_partitions_get_their_new_leader_epochs_a_batch_to_a_transaction(
    make_broker: Broker, make_registry: Callable[..., Registry], service: Service
) -> None:
    """A broker restarted that led many partitions (each one's only replica) has each given a
    new leader epoch: WRITE_BATCH to a transaction, not a transaction each (250 partitions:
    500 transactions before, a leader -1 written and then the broker chosen again)."""
    one = make_broker(1)
    one.topics.create_topic_config(TOPIC, TopicConfig.spread(250, [1]))
    controller, session = counted_controller(make_registry, service, 2)
    session.commits = 0
    one.stop()  # the broker dies...
    wait_until(lambda: controller.statistics().offline_partitions == 250, what="250 offline")
    again = make_broker(1)  # ...and comes back, a new incarnation
    wait_until(lambda: controller.statistics().leaders_chosen == 250, what="250 leaders chosen")
    states = again.topics.partition_states(TOPIC)
    assert {plain(state) for state, _ in states.values()} == {PartitionState(1, 2, (1,), 1)}
    assert {state.leader_broker_epoch for state, _ in states.values()} == {
        again.brokers.epochs()[1]
    }
    assert session.commits == 6  # 3 batches of offline states, 3 of leaders chosen


def test_a_stopping_controller_ends_its_round_within_one_chunk_of_reads(
    make_broker: Broker, make_registry: Callable[..., Registry], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A round over a topic of 10,000 partitions reads for seconds: the stop is looked at
    between READ_CHUNK states read, not only between topics."""
    monkeypatch.setattr(acting, "READ_CHUNK", 10)
    make_broker(1).topics.create_topic_config(TOPIC, TopicConfig.spread(50, [1]))
    counting = make_registry(of=Counting)
    session = counting.session
    assert isinstance(session, CountingSession)
    epoch = counting.controller.elect(2)
    assert epoch is not None
    session.commits = 0
    asked: list[bool] = []

    def stopping() -> bool:  # the stop comes once the round read its first states
        asked.append(session.states_read > 0)
        return asked[-1]

    acts = Acting(
        counting.brokers, counting.topics, counting.reassignments, epoch, Counters(), stopping
    )
    assert acts.settle() == (False, [])
    assert session.states_read == 10
    assert session.commits == 0  # stopped before its first write


def test_a_round_reads_the_states_only_of_the_topics_and_partitions_changed_since_the_last(
    make_broker: Broker, make_registry: Callable[..., Registry], service: Service
) -> None:
    """A topic settled in this epoch whose configuration, live brokers and configuration node
    stand is not read again: a round woken by another topic reads that topic's states, one
    woken by partitions added reads theirs (each round read every state before: seconds for
    20,000). A topic deleted and made again is read again whole."""
    one = make_broker(1)
    one.topics.create_topic_config(TOPIC, TopicConfig.spread(50, [1]))
    controller, session = counted_controller(make_registry, service, 2)
    wait_until(lambda: session.states_read == 50, what="the first round's reads")

    def offline(topic: str) -> int:
        states = one.topics.partition_states(topic).values()
        return sum(state.leader == NO_LEADER for state, _ in states)

    # partitions on broker 3, never up: the controller writes them offline
    one.topics.create_topic_config("views", TopicConfig.spread(3, [3]))
    wait_until(lambda: controller.statistics().offline_partitions == 3, what="views offline")
    assert offline("views") == 3
    assert session.states_read == 53  # not clicks' 50 again
    one.topics.add_partitions(TOPIC, 60, racks={3: None})
    wait_until(lambda: controller.statistics().offline_partitions == 13, what="10 added offline")
    assert offline(TOPIC) == 10
    assert session.states_read == 63
    one.topics.delete_topic_config("views")
    wait_until(lambda: controller.statistics().offline_partitions == 10, what="views gone")
    one.topics.create_topic_config("views", TopicConfig.spread(3, [3]))  # the same again
    wait_until(lambda: offline("views") == 3, what="views made again, offline again")
    wait_until(lambda: controller.statistics().offline_partitions == 13, what="counted")


def test_a_preferred_leader_election_reads_only_the_partitions_led_by_another_broker(
    make_broker: Broker, make_registry: Callable[..., Registry], service: Service
) -> None:
    one, two = make_broker(1), make_broker(2)
    one.topics.create_topic_config(TOPIC, TopicConfig.spread(20, [1, 2], replication_factor=2))
    controller, session = counted_controller(make_registry, service, 3)
    one.stop()
    wait_until(lambda: controller.statistics().leaders_chosen == 10, what="broker 2 leading all")
    wait_until(
        lambda: all(
            state.leader == 2 and state.isr == (2,)
            for state, _ in two.topics.partition_states(TOPIC).values()
        ),
        what="broker 1 out of every ISR",
    )
    before = session.states_read
    make_broker(1)  # back, but in no ISR: nothing moves
    wait_until(lambda: session.states_read == before + 20, what="its return's round")
    before = session.states_read
    assert controller.elect_preferred() == 0
    assert session.states_read - before == 10  # those whose preferred leader is broker 1


def test_when_the_controllers_session_closes_another_service_takes_over_and_acts(
    make_broker: Broker, service: Service
) -> None:
    registries = {b: make_broker(b) for b in (1, 2, 3)}
    registries[1].topics.create_topic_config(
        TOPIC, TopicConfig.spread(3, [1, 2, 3], replication_factor=2)
    )
    services = {b: service(r, b) for b, r in registries.items()}
    wait_until(
        lambda: [s.controller_epoch for s in services.values()].count(1) == 1,
        what="one controller",
    )
    first = next(b for b, s in services.items() if s.controller_epoch == 1)
    registries[first].stop()  # the controller's broker dies
    others = [b for b in services if b != first]
    wait_until(
        lambda: [services[b].controller_epoch for b in others].count(2) == 1,
        what="another controller, epoch 2",
    )
    second = next(b for b in others if services[b].controller_epoch == 2)
    reader = registries[second]
    config = reader.topics.topic_config(TOPIC)
    for p, replicas in enumerate(config.replicas):
        if replicas[0] == first:  # it led: its follower leads now
            follower = replicas[1]
            expected = PartitionState(follower, 1, (follower,), 2)
        elif first in replicas:  # it followed: it left the ISR
            expected = PartitionState(replicas[0], 0, (replicas[0],), 2)
        else:
            expected = PartitionState(replicas[0], 0, replicas, 0)
        wait_state(reader, p, expected, f"partition {p} settled by the new controller")
    info = reader.controller.current()
    assert info is not None and info.broker_id == second


def test_a_controller_whose_session_expired_is_elected_again_with_a_new_epoch(
    make_broker: Broker,
    service: Service,
    zookeeper: PrivateZooKeeper,
    caplog: pytest.LogCaptureFixture,
) -> None:
    one, _two = make_broker(1), make_broker(2)
    one.topics.create_topic_config(TOPIC, TopicConfig.spread(1, [1, 2], replication_factor=2))
    controller = service(one, 1)
    wait_controller(controller, 1)
    expire_session(one, zookeeper.connect_string)
    wait_controller(controller, 2)
    assert any(
        "no longer the controller of epoch 1" in m for m in messages(caplog, logging.WARNING)
    )
    assert one.controller.epoch() == 2


def test_a_stale_controllers_write_is_refused_and_it_stops_acting_in_that_epoch(
    make_broker: Broker,
    service: Service,
    observer: KazooClient,
    caplog: pytest.LogCaptureFixture,
) -> None:
    one, _two, three = make_broker(1), make_broker(2), make_broker(3)
    three.topics.create_topic_config(TOPIC, TopicConfig.spread(1, [1, 2], replication_factor=2))
    controller = service(three, 3)
    wait_controller(controller, 1)
    # Another controller was elected (epoch 2) without this one hearing of it: /controller_epoch
    # moves past its epoch while its /controller stays (set by hand: no election does that).
    epoch_path = f"{three.session.chroot}/controller_epoch"
    observer.set(epoch_path, json.dumps({"version": 1, "controller_epoch": 2}).encode(), 0)
    one.stop()
    # its write in epoch 1 is refused; it stops acting, resigns, and is elected anew (epoch 3)
    wait_state(three, 0, PartitionState(2, 1, (2,), 3), "broker 2 leading, by epoch 3")
    wait_controller(controller, 3)
    assert three.topics.partition_state(TOPIC, 0)[1] == 1  # one write: epoch 1's never landed
    warnings = messages(caplog, logging.WARNING)
    assert any("no longer the controller of epoch 1: a newer controller" in m for m in warnings)


def test_a_topic_made_before_replication_gets_its_state_nodes(
    make_broker: Broker, service: Service, observer: KazooClient
) -> None:
    one = make_broker(1)
    old = {"version": 1, "partitions": 2, "brokers": [1, 1], "settings": {}}
    observer.create(
        f"{one.session.chroot}/config/topics/{TOPIC}", json.dumps(old).encode(), makepath=True
    )
    service(one, 1)
    wait_until(lambda: len(one.topics.partition_states(TOPIC)) == 2, what="the state nodes")
    assert plained(one.topics.partition_state(TOPIC, 1)) == (PartitionState(1, 0, (1,), 0), 0)


# -- preferred-leader election, stop -----------------------------------------------------------


def test_preferred_leader_election_moves_leadership_back_to_the_first_replica(
    make_broker: Broker, service: Service
) -> None:
    one, two, three = make_broker(1), make_broker(2), make_broker(3)
    three.topics.create_topic_config(TOPIC, TopicConfig.spread(2, [1, 2], replication_factor=2))
    controller = service(three, 3)
    wait_controller(controller, 1)
    one.stop()
    wait_state(three, 0, PartitionState(2, 1, (2,), 1), "broker 2 leading partition 0")
    make_broker(1)  # back, but not in sync yet: nothing moves
    assert controller.elect_preferred() == 0
    # broker 2, leading, takes 1 back into the ISR (its own conditional write)
    two.topics.write_partition_state(TOPIC, 0, incarnate(two, PartitionState(2, 1, (2, 1), 1)), 1)
    with pytest.raises(UnknownTopicOrPartition):
        controller.elect_preferred(["nope"])
    assert controller.elect_preferred([TOPIC]) == 1
    assert plained(three.topics.partition_state(TOPIC, 0)) == (PartitionState(1, 2, (2, 1), 1), 3)
    assert three.topics.partition_state(TOPIC, 1)[0].leader == 2  # its preferred leader already
    assert controller.elect_preferred() == 0
    assert controller.statistics().preferred_moves == 1


def test_a_service_that_is_not_the_controller_refuses_acts_and_a_stopped_one_resigns(
    make_broker: Broker, service: Service
) -> None:
    one, two = make_broker(1), make_broker(2)
    first = service(one, 1)
    wait_controller(first, 1)
    second = service(two, 2)
    with pytest.raises(NotController, match="broker 2 is not the controller: broker 1 is"):
        second.elect_preferred()
    assert first.stop(timeout=5)
    assert first.controller_epoch is None
    wait_controller(second, 2)  # resigned: the other is elected at once, not at session end
    with pytest.raises(NotController):
        first.elect_preferred()
    with pytest.raises(RuntimeError, match="started once"):
        first.start(one, 1)
    with pytest.raises(ValueError, match="a broker id is an integer >= 0"):
        ControllerService().start(one, -1)
    with pytest.raises(TypeError, match="not one name"):
        second.elect_preferred(TOPIC)


# -- the periodic preferred-leader election ----------------------------------------------------

INTERVAL_MS = 100


def test_the_controller_moves_leadership_back_by_itself_once_the_preferred_leader_is_in_sync(
    make_broker: Broker, service: Service, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="pylog.controller")
    one, two, three = make_broker(1), make_broker(2), make_broker(3)
    three.topics.create_topic_config(TOPIC, TopicConfig.spread(2, [1, 2], replication_factor=2))
    began = time.monotonic()
    controller = service(three, 3, leader_rebalance_interval_ms=INTERVAL_MS)
    wait_controller(controller, 1)
    one.stop()
    wait_state(three, 0, PartitionState(2, 1, (2,), 1), "broker 2 leading partition 0")
    make_broker(1)  # back, but out of the ISR: two whole runs later, nothing moved
    runs = controller.statistics().preferred_runs
    wait_until(lambda: controller.statistics().preferred_runs >= runs + 2, what="two more runs")
    assert plained(three.topics.partition_state(TOPIC, 0)) == (PartitionState(2, 1, (2,), 1), 1)
    assert controller.statistics().preferred_moves == 0

    # broker 2, leading, takes 1 back into the ISR: the next run gives it leadership back
    two.topics.write_partition_state(TOPIC, 0, incarnate(two, PartitionState(2, 1, (2, 1), 1)), 1)
    wait_state(three, 0, PartitionState(1, 2, (2, 1), 1), "broker 1 leading again")
    wait_until(lambda: controller.statistics().preferred_moves == 1, what="the move counted")
    assert three.topics.partition_state(TOPIC, 1)[0].leader == 2  # its preferred leader all along
    infos = messages(caplog, logging.INFO)
    assert any("clicks-0: leadership back to the preferred leader 1 (from 2)" in m for m in infos)
    assert any("preferred-leader election: 1 partition(s)" in m for m in infos)
    # never more often than the interval: the first an interval after election, each next one
    # an interval after the previous
    stats = controller.statistics()
    assert stats.preferred_runs <= (time.monotonic() - began) * 1000 / INTERVAL_MS
    assert stats.elections == 1 and stats.leaders_chosen == 1


def test_the_periodic_election_runs_an_interval_after_election_then_after_each_run(
    make_broker: Broker, service: Service, clock: FakeClock
) -> None:
    # on the service's clock, which moves only when the test says so
    one, two = make_broker(1), make_broker(2)
    one.topics.create_topic_config(TOPIC, TopicConfig.spread(1, [1, 2], replication_factor=2))
    two.topics.write_partition_state(TOPIC, 0, incarnate(two, PartitionState(2, 1, (1, 2), 0)), 0)
    controller = service(two, 2, clock=clock, leader_rebalance_interval_ms=INTERVAL_MS)
    wait_until(lambda: controller.statistics().preferred_run_due is not None, what="scheduled")
    elected_at = clock.now_monotonic
    assert controller.statistics().preferred_run_due == elected_at + INTERVAL_MS / 1000
    assert controller.statistics().preferred_runs == 0  # its thread looks every 0.1 s meanwhile
    clock.advance(INTERVAL_MS / 1000)
    wait_until(lambda: controller.statistics().preferred_runs == 1, what="the periodic run")
    wait_state(two, 0, PartitionState(1, 2, (1, 2), 1), "broker 1, preferred, leading")
    assert controller.statistics().preferred_run_due == clock.now_monotonic + INTERVAL_MS / 1000


def test_a_rebalance_interval_of_0_switches_the_periodic_election_off(
    make_broker: Broker, service: Service
) -> None:
    one, two, three, four = make_broker(1), make_broker(2), make_broker(3), make_broker(4)
    one.topics.create_topic_config(TOPIC, TopicConfig.spread(1, [1, 2, 3], replication_factor=3))
    # broker 2 leads; 1, the preferred leader, is alive and in the ISR
    two.topics.write_partition_state(
        TOPIC, 0, incarnate(two, PartitionState(2, 1, (1, 2, 3), 0)), 0
    )
    controller = service(four, 4, leader_rebalance_interval_ms=0)
    wait_controller(controller, 1)
    three.stop()  # a round, seen done: the service acts, yet leaves leadership where it is
    wait_state(two, 0, PartitionState(2, 1, (1, 2), 1), "broker 3 out of the ISR")
    # that round came after the one that elected it: no periodic election was scheduled then
    assert plain(two.topics.partition_state(TOPIC, 0)[0]) == PartitionState(2, 1, (1, 2), 1)
    stats = controller.statistics()
    assert (stats.preferred_runs, stats.preferred_moves, stats.preferred_run_due) == (0, 0, None)
    assert controller.elect_preferred() == 1  # asked, it moves
    assert plain(one.topics.partition_state(TOPIC, 0)[0]) == PartitionState(1, 2, (1, 2), 1)


@pytest.mark.parametrize("interval", [-1, 1.5, True, "100"])
def test_a_bad_rebalance_interval_is_refused_at_start(
    make_broker: Broker, interval: object
) -> None:
    registry = make_broker(1)
    controller = ControllerService()
    with pytest.raises(ValueError, match="leader_rebalance_interval_ms is an integer >= 0"):
        controller.start(registry, 1, leader_rebalance_interval_ms=interval)  # type: ignore[arg-type]
    assert controller.stop()  # never started: nothing to stop


# -- a leader moved off a dying broker (perf/README.md's 17 s failover) ------------------------
# perf/bench_replication.py's failover partition: replicas 2, 3, 1, broker 1 the controller.
# Broker 3 leads (broker 2 was killed before and came back into the ISR); broker 3 is killed:
# until its session expires it is still registered, and the periodic preferred-leader election
# moves leadership to broker 2 with the ISR as it stands, broker 3 in it.

FAILOVER_PARTITION = 1
MOVED = PartitionState(2, 2, (2, 3, 1), 1)
"""Partition 1 once the periodic election moved it to broker 2: the dying 3 still in its ISR."""


def lead_moved_off_a_dying_broker(
    make_broker: Broker, service: Service
) -> tuple[Registry, Registry, ControllerService]:
    """Brokers 1 (the controller, periodic preferred-leader election on), 2 and 3; topic
    "failover" as the benchmark's; broker 3 leads partition 1 and dies (not yet seen: its
    session stands) and the periodic election moves leadership to broker 2. Returns broker 1's
    and broker 3's registries and the controller."""
    one, _two, three = make_broker(1), make_broker(2), make_broker(3)
    config = TopicConfig.spread(2, [1, 2, 3], replication_factor=3)
    assert config.replicas[FAILOVER_PARTITION] == (2, 3, 1)
    one.topics.create_topic_config("failover", config)
    one.topics.write_partition_state(
        "failover", FAILOVER_PARTITION, incarnate(one, PartitionState(3, 1, (2, 3, 1), 0)), 0
    )
    controller = service(one, 1, leader_rebalance_interval_ms=INTERVAL_MS)
    wait_until(
        lambda: plain(one.topics.partition_state("failover", FAILOVER_PARTITION)[0]) == MOVED,
        what="the periodic election moving leadership to broker 2, broker 3 still in the ISR",
    )
    return one, three, controller


def test_a_dying_broker_that_lost_leadership_to_the_preferred_election_leaves_the_isr_at_expiry(
    make_broker: Broker, service: Service, caplog: pytest.LogCaptureFixture
) -> None:
    """The controller's half of the 17 s outlier: once broker 3's session ends, the round on
    /brokers/ids removes it from the ISR of the partition broker 2 now leads (choose_leader's
    "leader alive" branch), the leader epoch unchanged. Nothing waits for the leader's 10 s
    lag rule (replica_lag_max_ms)."""
    caplog.set_level(logging.INFO, logger="pylog.controller")
    one, three, controller = lead_moved_off_a_dying_broker(make_broker, service)
    removals = controller.statistics().isr_removals
    three.stop()  # its session ends: /brokers/ids/3 goes
    wait_until(
        lambda: (
            plain(one.topics.partition_state("failover", FAILOVER_PARTITION)[0])
            == PartitionState(2, 2, (2, 1), 1)
        ),
        timeout=5.0,
        what="broker 3 out of the ISR by the controller",
    )
    # counted once a partition: partition 0 (replicas 1, 2, 3) loses it too
    wait_until(lambda: controller.statistics().isr_removals == removals + 2, what="counted")
    assert any(
        m.startswith("failover-1: ") and "[3]" in m and "leave the ISR, now [2, 1]" in m
        for m in messages(caplog, logging.INFO)
    )
    assert controller.statistics().preferred_moves >= 1


PATIENCE_S = 8.0
"""The benchmark producer's patience in the test below (6 s sessions: 12 s in the benchmark)."""


def test_the_benchmark_producer_goes_again_to_a_leader_once_the_isr_it_waited_on_changes(
    make_broker: Broker,
    service: Service,
    make_registry: Callable[..., Registry],
    tmp_path: Path,
) -> None:
    """The client's half, with perf/bench_replication.py's own AckedProducer: its request to
    broker 2 (leader since the election) got no reply within REQUEST_TIMEOUT_S, since an
    ack=all there counts broker 3 until ZooKeeper's ISR drops it. Once the controller drops it
    (broker 3's session ended), the producer must send to broker 2 again, not wait out its
    patience for a leader other than broker 2, which never comes."""
    _one, three, _controller = lead_moved_off_a_dying_broker(make_broker, service)
    producer = AckedProducer(BenchCluster(tmp_path, 6000, 2000), patience_s=PATIENCE_S)
    client = make_registry()
    assert producer._leader(client, None) == 2  # the request to broker 2 goes under MOVED
    answers: list[tuple[int | None, float]] = []

    def no_reply_from_two() -> None:
        answers.append((producer._leader(client, 2), time.monotonic()))

    waiting = threading.Thread(target=no_reply_from_two, daemon=True)
    waiting.start()
    try:
        three.stop()  # its session ends: the controller drops it from the ISR
        wait_until(
            lambda: client.topics.partition_state("failover", FAILOVER_PARTITION)[0].isr == (2, 1),
            timeout=5.0,
            what="broker 3 out of the ISR",
        )
        shrunk = time.monotonic()
        waiting.join(PATIENCE_S + 5.0)
        assert not waiting.is_alive()
        leader, at = answers[0]
        assert leader == 2
        assert at - shrunk < PATIENCE_S / 2, (
            f"sent to broker 2 again {at - shrunk:.1f} s after the ISR change: its patience"
        )
    finally:
        producer.stop.set()
        waiting.join(PATIENCE_S + 5.0)
