"""METADATA as a broker answers it from its view of the cluster (broker.topics.Topics.metadata),
on the view alone: a replicated partition whose state node this broker has not read yet (a
topic just created elsewhere: its watch on the topics fired, the one on the state node not yet)
has no leader known, as docs/protocol.md says: not its first replica at epoch -1 with every
replica in sync. And the view's timers: how long a CREATE_TOPIC waits for its partitions'
holders, and a topic request for ZooKeeper's connection, on the view's clock."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from pathlib import Path

import pytest
import zmq

from broker import control, protocol
from broker.config import BrokerConfig
from broker.errors import TopicAlreadyExists
from broker.pool import WorkerPool
from broker.protocol import CREATE_WAIT_S
from broker.registry import BrokerRegistration, PartitionState, Registry, TopicConfig
from broker.registry_calls import RegistryCalls
from broker.topics import Topics, TopicState
from broker.topics.admin import registry_wait_s
from tests.conftest import FakeClock

ME = 1
PORT = 9092


@pytest.fixture
def topics(tmp_path: Path, clock: FakeClock) -> Iterator[Topics]:
    config = BrokerConfig({"broker_id": ME, "broker_data_dir": str(tmp_path)})
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    pool = WorkerPool(config, context, zmq.Poller(), tmp_path, deque())
    calls = RegistryCalls()
    view = Topics(config, pool, calls, deque(), clock)
    view.live_brokers = {
        b: BrokerRegistration("127.0.0.1", PORT + b, 1, ("/logs",)) for b in (2, 3)
    }
    yield view
    calls.shutdown()
    context.destroy(linger=0)


def partition(topics: Topics, topic: str) -> protocol.PartitionInfo:
    (info,) = topics.metadata((topic,), PORT).topics
    (answer,) = info.partitions
    return answer


def test_a_replicated_partition_whose_state_is_not_read_yet_has_no_leader(topics: Topics) -> None:
    topics.configs["clicks"] = TopicConfig(
        1, (2,), {"replication_factor": 3}, replicas=((2, 3, ME),)
    )
    answer = partition(topics, "clicks")
    assert (answer.broker_id, answer.leader_epoch, answer.isr) == (-1, -1, ())
    assert answer.error_code == protocol.ErrorCode.PARTITION_UNAVAILABLE
    assert answer.replicas == (2, 3, ME)
    # Once read, the state node's leader, epoch and ISR.
    topics.roles.states[("clicks", 0)] = (PartitionState(2, 0, (2, 3), 0), 0)
    answer = partition(topics, "clicks")
    assert (answer.broker_id, answer.leader_epoch, answer.isr) == (2, 0, (2, 3))
    assert answer.error_code == protocol.ErrorCode.NONE


def test_a_partition_of_one_replica_is_led_by_it_with_no_epoch(topics: Topics) -> None:
    topics.configs["single"] = TopicConfig(1, (2,))
    answer = partition(topics, "single")
    assert (answer.broker_id, answer.leader_epoch, answer.isr) == (2, -1, (2,))
    assert answer.error_code == protocol.ErrorCode.NONE


def test_a_partition_led_here_is_unavailable_until_its_worker_opened_it(topics: Topics) -> None:
    """docs/protocol.md: PARTITION_UNAVAILABLE while the leader is still opening it. A broker
    just started answered NONE for its partitions once their worker was connected, before the
    worker had opened them, and so NONE for one its worker then could not open (CI met it:
    test_a_partition_that_cannot_be_opened_at_start_is_listed_with_its_error)."""
    topics.configs["clicks"] = TopicConfig(2, (ME, ME))
    topics.held["clicks"] = TopicState({}, {0: 0, 1: 0})
    worker = topics.pool.workers[0]
    worker.connected = True
    (info,) = topics.metadata(("clicks",), PORT).topics
    assert [p.error_code for p in info.partitions] == [protocol.ErrorCode.PARTITION_UNAVAILABLE] * 2
    failed = (("clicks", 0, int(protocol.ErrorCode.STORAGE_ERROR), "cannot"),)
    topics.worker_report(worker, control.PartitionsOpened((), failed))
    topics.held["clicks"].served.add(1)  # what an opened report does (its registration aside)
    (info,) = topics.metadata(("clicks",), PORT).topics
    assert [p.error_code for p in info.partitions] == [
        protocol.ErrorCode.STORAGE_ERROR,
        protocol.ErrorCode.NONE,
    ]


def test_a_create_topic_whose_holder_never_serves_is_answered_after_the_wait(
    topics: Topics, clock: FakeClock
) -> None:
    # The topic's one partition is broker 2's, which never registers it (it died meanwhile).
    topics.admin._created("clicks", TopicConfig(1, (2,)), b"client", 7)
    topics.admin._on_served({})  # ZooKeeper: nothing served yet
    clock.advance(CREATE_WAIT_S - 0.1)
    topics.admin._on_served({})
    assert not topics.answers
    clock.advance(0.1)
    topics.admin._on_served({})
    [(tagged, reply)] = topics.answers
    assert tagged == b"client"
    header = protocol.decode_reply_header(reply)
    assert (header.correlation_id, header.error_code) == (7, protocol.ErrorCode.NONE)


def test_a_topic_request_while_zookeeper_is_away_is_refused_after_half_the_session_timeout(
    topics: Topics, clock: FakeClock
) -> None:
    topics.calls.registry = Registry("127.0.0.1:1", "/unreached")  # never started: not connected
    wait_s = registry_wait_s(topics.config)
    assert wait_s == 3.0  # the default session timeout's half
    topics.admin.create(protocol.CreateTopicRequest("clicks", 1, {}), b"client", 7)
    clock.advance(wait_s - 0.1)
    topics.admin.resume_awaiting()
    assert not topics.answers
    with pytest.raises(TopicAlreadyExists):  # still on its way: the name is taken
        topics.admin.create(protocol.CreateTopicRequest("clicks", 1, {}), b"other", 8)
    clock.advance(0.1)
    topics.admin.resume_awaiting()
    [(tagged, reply)] = topics.answers
    assert tagged == b"client"
    header = protocol.decode_reply_header(reply)
    assert header.correlation_id == 7
    assert header.error_code == protocol.ErrorCode.REGISTRY_UNAVAILABLE
    assert f"waited {wait_s:g} s" in header.error_message
    assert "clicks" not in topics.admin.creating


def test_a_start_places_the_partitions_on_disk_from_one_listing_of_each_log_dir(
    tmp_path: Path, registry: Registry, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Topics.load lists each log dir once and places each partition held here in the log dir
    its folder is in, without looking for each folder again (20,000 looks, most of a second
    of a restart's start with 20,000 partitions, before a worker was started)."""
    dirs = [tmp_path / "a", tmp_path / "b"]
    for folder in (dirs[0] / "clicks-0", dirs[1] / "clicks-1", dirs[1] / "clicks-2"):
        folder.mkdir(parents=True)
    registry.topics.create_topic_config("clicks", TopicConfig(4, (ME,) * 4))
    config = BrokerConfig(
        {
            "broker_id": ME,
            "broker_data_dir": str(tmp_path),
            "broker_log_dirs": [str(d) for d in dirs],
        }
    )
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    calls = RegistryCalls()
    try:
        pool = WorkerPool(config, context, zmq.Poller(), tmp_path, deque())
        view = Topics(config, pool, calls, deque())
        calls.registry = registry
        looks: list[Path] = []
        is_dir = Path.is_dir

        def counted_is_dir(path: Path) -> bool:
            looks.append(path)
            return is_dir(path)

        monkeypatch.setattr(Path, "is_dir", counted_is_dir)
        view.load()
        monkeypatch.undo()
        assert looks == []
        per_dir = config.broker_workers_per_dir
        log_dirs = {n: w // per_dir for n, w in view.held["clicks"].workers.items()}
        assert log_dirs[0] == 0 and log_dirs[1] == 1 and log_dirs[2] == 1
        assert log_dirs[3] == 0  # a new one: where fewest are
    finally:
        calls.shutdown()
        context.destroy(linger=0)
