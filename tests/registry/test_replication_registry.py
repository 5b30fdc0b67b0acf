"""The registry's nodes for replication (issue 17, docs/replication.md "Registry") against a real
ZooKeeper: topic configurations with replicas, the partitions' state nodes and their
conditional writes, the controller's election, brokers' racks, and their ZooKeeper ACLs."""

from __future__ import annotations

import json
import queue
import threading
from collections.abc import Callable
from typing import Any

import pytest
from kazoo.client import KazooClient

from broker.errors import (
    InvalidTopic,
    RegistryAccessDenied,
    TopicAlreadyExists,
    UnknownTopicOrPartition,
)
from broker.registry import (
    NO_LEADER,
    BrokerRegistration,
    ControllerInfo,
    ControllerMoved,
    PartitionState,
    PartitionStateChanged,
    Registry,
    TopicConfig,
)
from broker.zookeeper import PrivateZooKeeper
from tests.conftest import wait_until
from tests.registry.test_registry import expire_session, next_value, node
from tests.registry.test_zookeeper_acls import BROKERS, BROKERS_ACL, acl

RACKS: dict[int, str | None] = {1: "a", 2: "a", 3: "b"}


def race(*calls: Callable[[], object]) -> list[object]:
    """Run `calls` on threads of their own, released together; each one's result or the
    exception it raised, in order."""
    start = threading.Barrier(len(calls))
    outcomes: list[object] = [None] * len(calls)

    def run(i: int) -> None:
        start.wait(timeout=10)
        try:
            outcomes[i] = calls[i]()
        except Exception as error:
            outcomes[i] = error

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(calls))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
        assert not thread.is_alive()
    return outcomes


# -- topic configurations with replicas ------------------------------------------------------


def test_spread_places_replicas_and_the_preferred_leader_is_the_partitions_broker() -> None:
    config = TopicConfig.spread(3, [1, 2, 3], replication_factor=2, racks=RACKS)
    # broker order a, b, a: 1, 3, 2; the second replica on the other rack while one remains
    assert config.replicas == ((1, 3), (3, 2), (2, 3))
    assert config.brokers == (1, 3, 2)
    assert [config.preferred_leader(p) for p in range(3)] == [1, 3, 2]
    assert config.replicas_of(2) == (2, 3)
    assert config.partitions_of(3) == [0, 1, 2]  # every partition it is a replica of
    assert config.partitions_of(2) == [1, 2]
    assert config.partitions_of(1) == [0]
    with pytest.raises(UnknownTopicOrPartition, match="partitions 0 to 2"):
        config.replicas_of(3)
    with pytest.raises(InvalidTopic, match="replication factor 4 is not between 1 and the 3"):
        TopicConfig.spread(3, [1, 2, 3], replication_factor=4)
    with pytest.raises(InvalidTopic, match="no live broker"):
        TopicConfig.spread(3, [], replication_factor=1)
    # replication factor 1: one replica each, and the config of before replication
    assert TopicConfig.spread(3, [2, 1]) == TopicConfig(3, (1, 2, 1))
    assert TopicConfig(3, (1, 2, 1)).replicas == ((1,), (2,), (1,))


@pytest.mark.parametrize(
    ("replicas", "message"),
    [
        (((1, 2),), "must name the replicas of each of the 2 partitions"),
        (((1, 2), (2, 2)), "the replicas of partition 1 must be distinct"),
        (((1, 2), ()), "must be distinct broker ids"),
    ],
)
def test_a_config_whose_replicas_disagree_with_its_brokers_is_refused(
    registry: Registry, replicas: tuple[tuple[int, ...], ...], message: str
) -> None:
    with pytest.raises(InvalidTopic, match=message):
        registry.topics.create_topic_config("clicks", TopicConfig(2, (1, 2), {}, replicas))
    with pytest.raises(UnknownTopicOrPartition):
        registry.topics.topic_config("clicks")
    obj = {"version": 1, "partitions": 2, "brokers": [1, 2], "settings": {}}
    with pytest.raises(ValueError, match=message):
        TopicConfig.from_json(json.dumps({**obj, "replicas": [list(r) for r in replicas]}).encode())
    good = TopicConfig.from_json(json.dumps({**obj, "replicas": [[1, 2], [2, 1]]}).encode())
    assert good.replicas == ((1, 2), (2, 1))
    # reassigned: partition 1 moved to broker 3 keeps broker 2 as its name (its group nodes)
    moved = TopicConfig.from_json(json.dumps({**obj, "replicas": [[1, 2], [3]]}).encode())
    assert moved.brokers == (1, 2) and moved.preferred_leader(1) == 3


def test_a_topic_node_written_before_replicas_reads_as_one_replica_each(
    registry: Registry, observer: KazooClient
) -> None:
    old = b'{"brokers":[2,1],"partitions":2,"settings":{},"version":1}'
    observer.create(f"{registry.session.chroot}/config/topics/old", old, makepath=True)
    config = registry.topics.topic_config("old")
    assert config == TopicConfig(2, (2, 1), {}, ((2,), (1,)))
    assert config.partitions_of(1) == [1]
    # a topic of before has no state nodes: asked for, a clear error; given, initial ones
    with pytest.raises(UnknownTopicOrPartition, match="partition 0 of topic 'old' has no state"):
        registry.topics.partition_state("old", 0)
    assert registry.topics.partition_states("old") == {}
    assert registry.topics.create_partition_states("old", config) == 2
    assert registry.topics.create_partition_states("old", config) == 0
    assert registry.topics.partition_states("old") == {
        0: (PartitionState(2, 0, (2,), 0), 0),
        1: (PartitionState(1, 0, (1,), 0), 0),
    }


# -- partition states --------------------------------------------------------------------------


def test_creating_a_topic_writes_each_partitions_initial_state_with_its_config(
    registry: Registry, observer: KazooClient
) -> None:
    config = TopicConfig.spread(2, [1, 2, 3], replication_factor=3)
    registry.brokers.register(
        2, BrokerRegistration("127.0.0.1", 9002)
    )  # broker 1 is not registered
    incarnation = registry.brokers.epochs()[2]
    registry.topics.create_topic_config("clicks", config)
    root = f"{registry.session.chroot}/brokers/topics/clicks/partitions"
    assert node(observer, f"{root}/1/state") == (
        {
            "version": 1,
            "leader": 2,
            "leader_epoch": 0,
            "isr": [2, 3, 1],
            "controller_epoch": 0,
            "leader_broker_epoch": incarnation,
        },
        0,
    )
    # the leader's incarnation: its broker epoch, or -1 when it is not registered
    assert registry.topics.partition_state("clicks", 0) == (
        PartitionState(1, 0, (1, 2, 3), 0, -1),
        0,
    )
    assert json.loads(observer.get(f"{registry.session.chroot}/config/topics/clicks")[0])[
        "replicas"
    ] == [
        [1, 2, 3],
        [2, 3, 1],
    ]
    # brokers' registrations beside "partitions" are read as before, "partitions" passed over
    registry.topics.register_topic_partitions("clicks", 2, [0, 1])
    assert registry.topics.topic_brokers("clicks") == {2: (0, 1)}
    with pytest.raises(TopicAlreadyExists):
        registry.topics.create_topic_config("clicks", config)
    with pytest.raises(UnknownTopicOrPartition):
        registry.topics.partition_state("clicks", 2)


def test_two_writers_racing_on_a_state_node_one_wins_the_other_is_told_to_read_again(
    make_registry: Callable[..., Registry],
) -> None:
    one, two = make_registry(), make_registry()
    one.topics.create_topic_config("clicks", TopicConfig.spread(1, [1, 2, 3], replication_factor=3))
    for round_ in range(10):
        state, version = one.topics.partition_state("clicks", 0)
        shrunk = PartitionState(state.leader, state.leader_epoch, state.isr[:2], 0)
        moved = PartitionState(2, state.leader_epoch + 1, (2, 3), 1)
        outcomes = race(
            lambda: one.topics.write_partition_state("clicks", 0, shrunk, version),  # noqa: B023
            lambda: two.topics.write_partition_state("clicks", 0, moved, version),  # noqa: B023
        )
        won = [o for o in outcomes if isinstance(o, int)]
        lost = [o for o in outcomes if isinstance(o, PartitionStateChanged)]
        assert won == [version + 1] and len(lost) == 1, (round_, outcomes)
        assert lost[0].version == version and lost[0].partition == 0
        # nothing of the loser's was written: the node holds the winner's state
        winner = shrunk if isinstance(outcomes[0], int) else moved
        assert two.topics.partition_state("clicks", 0) == (winner, version + 1)
        one.topics.write_partition_state(
            "clicks", 0, PartitionState(1, state.leader_epoch, (1, 2, 3), 0), version + 1
        )


def test_writing_a_state_of_a_missing_partition_or_with_a_bad_version_is_a_clear_error(
    registry: Registry,
) -> None:
    registry.topics.create_topic_config("clicks", TopicConfig.spread(1, [1]))
    state = PartitionState(1, 1, (1,), 0)
    with pytest.raises(UnknownTopicOrPartition):
        registry.topics.write_partition_state("clicks", 1, state, 0)
    with pytest.raises(UnknownTopicOrPartition):
        registry.topics.write_partition_state("views", 0, state, 0)
    with pytest.raises(ValueError, match="version"):
        registry.topics.write_partition_state("clicks", 0, state, -1)
    with pytest.raises(PartitionStateChanged, match="no longer at version 3"):
        registry.topics.write_partition_state("clicks", 0, state, 3)
    assert registry.topics.write_partition_state("clicks", 0, state, 0) == 1


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ((1, 0, (2, 3), 0), "the leader 1 is not in the ISR"),
        ((-2, 0, (), 0), "leader must be a broker id or -1"),
        ((1, -1, (1,), 0), "leader_epoch must be an integer >= 0"),
        ((1, 0, (1, 1), 0), "isr must be distinct"),
        ((1, 0, (1,), -1), "controller_epoch must be"),
        ((1, 0, (1,), 0, -2), "leader_broker_epoch must be an integer >= -1"),
    ],
)
def test_a_state_out_of_range_is_refused(fields: tuple[Any, ...], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        PartitionState(*fields)
    leader, epoch, isr, controller_epoch, *broker_epoch = fields
    data = json.dumps(
        {
            "version": 1,
            "leader": leader,
            "leader_epoch": epoch,
            "isr": list(isr),
            "controller_epoch": controller_epoch,
            **({"leader_broker_epoch": broker_epoch[0]} if broker_epoch else {}),
        }
    ).encode()
    with pytest.raises(ValueError):
        PartitionState.from_json(data)
    assert PartitionState(NO_LEADER, 4, (), 2).isr == ()  # no leader: any ISR, empty too


def test_a_state_watch_sees_each_write_with_its_version_and_the_deletion(
    make_registry: Callable[..., Registry],
) -> None:
    leader, controller = make_registry(), make_registry()
    controller.topics.create_topic_config(
        "clicks", TopicConfig.spread(1, [1, 2], replication_factor=2)
    )
    seen: queue.Queue[tuple[PartitionState | None, int]] = queue.Queue()

    def changed(state: PartitionState | None, version: int) -> bool:
        seen.put((state, version))
        return True

    leader.topics.watch_partition_state("clicks", 0, changed)
    next_value(seen, (PartitionState(1, 0, (1, 2), 0), 0))
    shrunk = PartitionState(1, 0, (1,), 0)
    controller.topics.write_partition_state("clicks", 0, shrunk, 0)
    next_value(seen, (shrunk, 1))
    controller.topics.delete_topic_config("clicks")
    next_value(seen, (None, -1))


def test_deleting_a_topic_deletes_its_states_and_a_cut_short_deletion_is_overwritten(
    registry: Registry, observer: KazooClient
) -> None:
    root = f"{registry.session.chroot}/brokers/topics"
    registry.topics.create_topic_config("clicks", TopicConfig.spread(2, [1]))
    registry.topics.delete_topic_config("clicks")
    assert observer.exists(f"{root}/clicks") is None
    with pytest.raises(UnknownTopicOrPartition):
        registry.topics.delete_topic_config("clicks")

    # states of a topic of that name whose deletion was cut short (partition 2 of 3 included)
    for p in range(3):
        observer.create(
            f"{root}/clicks/partitions/{p}/state",
            PartitionState(NO_LEADER, 7, (), 3).to_json(),
            makepath=True,
        )
        observer.set(f"{root}/clicks/partitions/{p}/state", PartitionState(1, 8, (1,), 3).to_json())
    registry.topics.create_topic_config("clicks", TopicConfig.spread(2, [1]))
    # overwritten, so that a version read from the old ones is no longer current
    assert registry.topics.partition_states("clicks") == {
        0: (PartitionState(1, 0, (1,), 0), 2),
        1: (PartitionState(1, 0, (1,), 0), 2),
    }
    assert observer.exists(f"{root}/clicks/partitions/2") is None


def test_a_brokers_registration_keeps_its_topic_node_until_the_topic_is_deleted(
    registry: Registry, observer: KazooClient
) -> None:
    root = f"{registry.session.chroot}/brokers/topics/clicks"
    registry.topics.create_topic_config("clicks", TopicConfig.spread(1, [1]))
    registry.topics.register_topic_partitions("clicks", 1, [0])
    registry.topics.unregister_topic("clicks", 1)
    assert observer.exists(f"{root}/partitions/0/state") is not None  # the states stay
    registry.topics.delete_topic_config("clicks")
    assert observer.exists(root) is None


# -- the controller ----------------------------------------------------------------------------


def test_two_brokers_race_for_controller_one_wins_the_other_takes_over_when_it_goes(
    make_registry: Callable[..., Registry],
) -> None:
    one, two = make_registry(), make_registry()
    assert one.controller.current() is None and one.controller.epoch() == 0
    outcomes = race(lambda: one.controller.elect(1), lambda: two.controller.elect(2))
    assert sorted(outcomes, key=str) == [1, None], outcomes
    winner, loser, loser_id = (one, two, 2) if outcomes[0] == 1 else (two, one, 1)
    winner_id = 3 - loser_id
    assert loser.controller.current() == ControllerInfo(winner_id, 1)
    assert loser.controller.epoch() == 1
    assert winner.controller.elect(winner_id) == 1  # already the controller: its epoch
    assert loser.controller.elect(loser_id) is None

    seen: queue.Queue[ControllerInfo | None] = queue.Queue()

    def changed(info: ControllerInfo | None) -> bool:
        seen.put(info)
        return True

    loser.controller.watch(changed)
    next_value(seen, ControllerInfo(winner_id, 1))
    winner.stop()
    next_value(seen, None)
    assert loser.controller.elect(loser_id) == 2
    next_value(seen, ControllerInfo(loser_id, 2))
    assert loser.controller.resign() is True
    next_value(seen, None)
    assert loser.controller.resign() is False
    assert loser.controller.elect(loser_id) == 3


def test_a_controller_whose_session_expired_is_not_controller_again_without_an_election(
    make_registry: Callable[..., Registry], zookeeper: PrivateZooKeeper
) -> None:
    broker, tool = make_registry(), make_registry()
    assert broker.controller.elect(1) == 1
    old_session = expire_session(broker, zookeeper.connect_string)
    wait_until(
        lambda: (
            broker.session.statistics().sessions_lost == 1 and broker.session.wait_registered(0.01)
        ),
        what="a new session",
    )
    assert broker.session.session_id not in (None, old_session)
    assert (
        tool.controller.current() is None
    )  # registrations come back, the controller's node does not
    assert broker.controller.elect(1) == 2


def test_a_stale_controllers_state_writes_are_refused(
    make_registry: Callable[..., Registry],
) -> None:
    first, second = make_registry(), make_registry()
    first.topics.create_topic_config("clicks", TopicConfig.spread(1, [1, 2], replication_factor=2))
    epoch = first.controller.elect(1)
    assert epoch == 1
    moved = PartitionState(2, 1, (2,), epoch)
    assert first.topics.write_partition_state("clicks", 0, moved, 0, controller_epoch=epoch) == 1
    first.controller.resign()
    assert second.controller.elect(2) == 2
    back = PartitionState(1, 2, (1,), epoch)
    with pytest.raises(ControllerMoved, match="controller epoch 1 is over"):
        first.topics.write_partition_state("clicks", 0, back, 1, controller_epoch=epoch)
    assert second.topics.partition_state("clicks", 0) == (moved, 1)
    # the current controller's stale version is still PartitionStateChanged
    with pytest.raises(PartitionStateChanged):
        second.topics.write_partition_state("clicks", 0, back, 0, controller_epoch=2)
    assert second.topics.write_partition_state("clicks", 0, back, 1, controller_epoch=2) == 2


def test_a_controllers_batch_of_state_writes_is_applied_whole_or_not_at_all(
    make_registry: Callable[..., Registry],
) -> None:
    registry, leader = make_registry(), make_registry()
    registry.topics.create_topic_config(
        "clicks", TopicConfig.spread(3, [1, 2], replication_factor=2)
    )
    epoch = registry.controller.elect(1)
    assert epoch == 1
    moved = {p: PartitionState(2, 1, (2,), epoch) for p in range(3)}
    writes = [(p, state, 0) for p, state in moved.items()]
    assert registry.topics.write_partition_states("clicks", writes, epoch) == [1, 1, 1]
    assert registry.topics.partition_states("clicks") == {p: (s, 1) for p, s in moved.items()}
    # a leader writes partition 1 between the controller's read and its next batch
    leader.topics.write_partition_state("clicks", 1, PartitionState(2, 1, (2, 1), epoch), 1)
    back = [(p, PartitionState(1, 2, (1,), epoch), 1) for p in range(3)]
    assert registry.topics.write_partition_states("clicks", back, epoch) is None
    states = registry.topics.partition_states("clicks")
    assert [states[p][1] for p in range(3)] == [1, 2, 1]  # none of the batch written
    assert states[0][0] == moved[0]
    registry.controller.resign()
    assert leader.controller.elect(2) == 2
    with pytest.raises(ControllerMoved):
        registry.topics.write_partition_states("clicks", back[:1], epoch)
    assert registry.topics.partition_state("clicks", 0) == (moved[0], 1)


# -- brokers' racks ----------------------------------------------------------------------------


def test_a_brokers_rack_is_registered_and_a_node_without_one_reads_as_none(
    registry: Registry, observer: KazooClient
) -> None:
    registry.brokers.register(1, BrokerRegistration("127.0.0.1", 9092, rack="eu-1a"))
    registry.brokers.register(2, BrokerRegistration("127.0.0.1", 9093))
    assert node(observer, f"{registry.session.chroot}/brokers/ids/1")[0]["rack"] == "eu-1a"
    assert "rack" not in node(observer, f"{registry.session.chroot}/brokers/ids/2")[0]
    assert {i: b.rack for i, b in registry.brokers.read().items()} == {1: "eu-1a", 2: None}
    with pytest.raises(ValueError, match="rack"):
        BrokerRegistration("127.0.0.1", 9092, rack="")


# -- ZooKeeper ACLs ----------------------------------------------------------------------------


def test_the_new_nodes_are_the_brokers_and_a_session_without_the_identity_cannot_write_them(
    make_registry: Callable[..., Registry], observer: KazooClient, registry_chroot: str
) -> None:
    broker = make_registry(auth=BROKERS)
    broker.topics.create_topic_config("clicks", TopicConfig.spread(1, [1]))
    assert broker.controller.elect(1) == 1
    root = registry_chroot
    for path in (
        f"{root}/brokers/topics/clicks",
        f"{root}/brokers/topics/clicks/partitions",
        f"{root}/brokers/topics/clicks/partitions/0",
        f"{root}/brokers/topics/clicks/partitions/0/state",
        f"{root}/controller",
        f"{root}/controller_epoch",
    ):
        assert acl(observer, path) == BROKERS_ACL, path

    plain = make_registry()
    assert plain.controller.current() == ControllerInfo(1, 1)
    with pytest.raises(RegistryAccessDenied, match=f"write {root}/brokers/topics/clicks/"):
        plain.topics.write_partition_state("clicks", 0, PartitionState(NO_LEADER, 1, (), 0), 0)
    broker.controller.resign()
    with pytest.raises(RegistryAccessDenied, match=f"create {root}/controller"):
        plain.controller.elect(2)
    with pytest.raises(RegistryAccessDenied, match=f"delete {root}/config/topics/clicks"):
        plain.topics.delete_topic_config("clicks")
