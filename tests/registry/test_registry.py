"""The broker registry against a real ZooKeeper: nodes, errors, session expiry, lost connection.

An `observer` is a plain kazoo client that looks at the raw nodes (and, for session expiry,
plays the ZooKeeper FAQ's trick: it connects with the registry's session id and password and
closes that session, which expires it for the registry)."""

from __future__ import annotations

import contextlib
import json
import queue
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TypeVar

import pytest
from kazoo.client import KazooClient

from broker.errors import (
    InvalidTopic,
    RegistryUnavailable,
    TopicAlreadyExists,
    UnknownTopicOrPartition,
)
from broker.log.config import SettingValue
from broker.registry import BrokerRegistration, Registry, TopicConfig
from broker.registry.session import Failed, Session, Stat
from broker.zookeeper import PrivateZooKeeper
from tests.broker.test_front import paused
from tests.client.test_connection import UNUSED_PORT
from tests.conftest import wait_until

T = TypeVar("T")

BROKER_1 = BrokerRegistration(host="127.0.0.1", port=9092, workers=2, log_dirs=("/d1", "/d2"))
BROKER_2 = BrokerRegistration(host="127.0.0.1", port=9093, workers=1, log_dirs=("/d3",))


def expire_session(registry: Registry, connect_string: str) -> int:
    """Expire the registry's session on the server; return the expired session's id."""
    session_id = registry.session.session_id
    assert session_id is not None
    client_id = registry.session._client.client_id  # the password is not part of the public API
    intruder = KazooClient(connect_string, client_id=client_id)
    intruder.start(timeout=10)
    intruder.stop()  # closing "its" session ends the registry's
    intruder.close()
    return session_id


def next_value(values: queue.Queue[T], expected: T, timeout: float = 5.0) -> None:
    """Wait until a watch delivers `expected`. A watch may deliver the same state twice (after
    a reconnection, say), so repeats of earlier states are skipped, within the deadline."""
    deadline = time.monotonic() + timeout
    seen: list[T] = []
    while True:
        try:
            value = values.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            pytest.fail(f"no watch delivered {expected!r} within {timeout} s; saw {seen!r}")
        if value == expected:
            return
        seen.append(value)


def node(observer: KazooClient, path: str) -> tuple[dict[str, object], int]:
    """A node's JSON and the session that owns it (0 for a persistent node)."""
    data, stat = observer.get(path)
    return json.loads(data), stat.ephemeralOwner


# -- brokers -----------------------------------------------------------------------------------


def test_registered_broker_appears_with_its_json(registry: Registry, observer: KazooClient) -> None:
    registry.brokers.register(1, BROKER_1)

    data, owner = node(observer, f"{registry.session.chroot}/brokers/ids/1")
    assert data == {
        "version": 1,
        "host": "127.0.0.1",
        "port": 9092,
        "workers": 2,
        "log_dirs": ["/d1", "/d2"],
        "pylog_version": "",
    }
    assert owner == registry.session.session_id
    assert registry.brokers.read() == {1: BROKER_1}


def test_broker_node_is_ephemeral_and_goes_when_the_registry_stops(
    make_registry: Callable[..., Registry], observer: KazooClient
) -> None:
    broker, tool = make_registry(), make_registry()
    broker.brokers.register(7, BROKER_1)
    assert tool.brokers.read() == {7: BROKER_1}

    broker.stop()

    assert tool.brokers.read() == {}
    assert observer.exists(f"{tool.session.chroot}/brokers/ids/7") is None


def test_registering_again_updates_the_broker_node(registry: Registry) -> None:
    registry.brokers.register(1, BROKER_1)
    registry.brokers.register(1, BROKER_2)
    assert registry.brokers.read() == {1: BROKER_2}
    registry.brokers.unregister(1)
    assert registry.brokers.read() == {}


def test_watch_brokers_sees_brokers_come_and_go(make_registry: Callable[..., Registry]) -> None:
    tool, broker = make_registry(), make_registry()
    seen: queue.Queue[dict[int, BrokerRegistration]] = queue.Queue()
    tool.brokers.watch(seen.put)
    next_value(seen, {})

    broker.brokers.register(3, BROKER_2)
    next_value(seen, {3: BROKER_2})
    broker.stop()
    next_value(seen, {})


class ReadCounting(Session):
    """A session that counts the nodes it reads (get and get_many)."""

    nodes_read = 0

    def get(self, path: str) -> tuple[bytes, Stat]:
        self.nodes_read += 1
        return super().get(path)

    def get_many(self, what: str, paths: Sequence[str]) -> list[tuple[bytes, Stat] | Failed]:
        self.nodes_read += len(paths)
        return super().get_many(what, paths)


class ReadCountingRegistry(Registry):
    session_type = ReadCounting


def test_a_watch_of_names_reads_no_node_for_its_callback(
    make_registry: Callable[..., Registry],
) -> None:
    """The controller and a mirror are woken by these watches and read what they need
    themselves: reading every broker's, topic's or member's node for them was thrown away."""
    tool, broker = make_registry(of=ReadCountingRegistry), make_registry()
    assert isinstance(tool.session, ReadCounting)
    ids: queue.Queue[list[int]] = queue.Queue()
    topics: queue.Queue[list[str]] = queue.Queue()
    members: queue.Queue[list[str]] = queue.Queue()
    reassignments: queue.Queue[list[str]] = queue.Queue()
    tool.brokers.watch_ids(ids.put)
    tool.topics.watch_topic_names(topics.put)
    tool.groups.watch_members("loaders", members.put)
    tool.reassignments.watch_reassignments(reassignments.put)
    next_value(ids, [])
    for names in (topics, members, reassignments):
        next_value(names, [])

    broker.brokers.register(3, BROKER_2)
    broker.brokers.register(12, BROKER_1)
    next_value(ids, [3, 12])
    broker.topics.create_topic_config("clicks", TopicConfig.spread(1, [3]))
    next_value(topics, ["clicks"])
    broker.groups.register_consumer("loaders", "m1", ["clicks"])
    next_value(members, ["m1"])
    broker.stop()
    next_value(ids, [])
    next_value(members, [])
    assert tool.session.nodes_read == 0
    # the reads the watches spare are the callers' own, counted
    assert tool.brokers.read() == {} and tool.session.nodes_read == 0  # no child: none read
    assert list(tool.topics.topic_configs()) == ["clicks"] and tool.session.nodes_read == 1


def test_watch_callbacks_run_off_kazoos_threads_and_one_slow_callback_holds_up_no_other(
    make_registry: Callable[..., Registry],
) -> None:
    # kazoo's ChildrenWatch calls its function on kazoo's one event thread: a callback that
    # waits there (on ZooKeeper, or on the application) would stall every other watch.
    tool, broker = make_registry(), make_registry()
    release = threading.Event()
    brokers_seen: queue.Queue[dict[int, BrokerRegistration]] = queue.Queue()
    topics_seen: queue.Queue[dict[str, TopicConfig]] = queue.Queue()
    threads: set[threading.Thread] = set()

    def slow(brokers: dict[int, BrokerRegistration]) -> None:
        threads.add(threading.current_thread())
        brokers_seen.put(brokers)
        release.wait(30)

    def on_topics(configs: dict[str, TopicConfig]) -> None:
        threads.add(threading.current_thread())
        topics_seen.put(configs)

    try:
        tool.brokers.watch(slow)
        next_value(brokers_seen, {})  # and it now waits in the callback
        tool.topics.watch_topic_configs(on_topics)
        next_value(topics_seen, {})
        broker.brokers.register(3, BROKER_2)  # a broker event queues behind the slow callback
        broker.topics.create_topic_config("clicks", TopicConfig.spread(1, [3]))
        next_value(topics_seen, {"clicks": TopicConfig.spread(1, [3])})
    finally:
        release.set()
    next_value(brokers_seen, {3: BROKER_2})
    kazoo_threads = set(tool.session._client.handler._workers)  # its event and completion threads
    assert threads and not threads & kazoo_threads


def test_watch_callbacks_are_called_again_after_a_session_expiry(
    make_registry: Callable[..., Registry], zookeeper: PrivateZooKeeper
) -> None:
    # Children's data may have changed while the session was gone (a topic deleted and made
    # again under the same name): the callback gets the state read anew, names changed or not.
    tool, broker = make_registry(), make_registry()
    broker.brokers.register(3, BROKER_2)
    seen: queue.Queue[dict[int, BrokerRegistration]] = queue.Queue()
    tool.brokers.watch(seen.put)
    next_value(seen, {3: BROKER_2})

    expire_session(tool, zookeeper.connect_string)

    wait_until(lambda: tool.session.statistics().sessions == 2, what="a new session")
    assert seen.get(timeout=5) == {3: BROKER_2}


def test_node_left_by_an_old_session_is_replaced(registry: Registry, observer: KazooClient) -> None:
    # A broker that restarts quickly finds its previous session's node still there.
    path = f"{registry.session.chroot}/brokers/ids/1"
    observer.create(path, b'{"version":1,"stale":true}', ephemeral=True, makepath=True)

    registry.brokers.register(1, BROKER_1)

    data, owner = node(observer, path)
    assert owner == registry.session.session_id != observer.client_id[0]
    assert data["port"] == 9092


# -- topic partitions on brokers ---------------------------------------------------------------


def test_topic_partitions_are_registered_per_broker(
    make_registry: Callable[..., Registry], observer: KazooClient
) -> None:
    one, two = make_registry(), make_registry()
    one.topics.register_topic_partitions("clicks", 1, [0, 1, 2, 3])
    two.topics.register_topic_partitions("clicks", 2, [4, 5])

    assert one.topics.topic_brokers("clicks") == {1: (0, 1, 2, 3), 2: (4, 5)}
    data, owner = node(observer, f"{one.session.chroot}/brokers/topics/clicks/2")
    assert data == {"version": 1, "partitions": [4, 5]}
    assert owner == two.session.session_id

    two.topics.unregister_topic("clicks", 2)
    assert one.topics.topic_brokers("clicks") == {1: (0, 1, 2, 3)}
    two.stop()
    one.topics.unregister_topic("clicks", 1)
    assert one.topics.topic_brokers("clicks") == {}
    assert observer.exists(f"{one.session.chroot}/brokers/topics/clicks") is None
    assert one.topics.topic_brokers("never-registered") == {}


# -- topic configurations ----------------------------------------------------------------------


def test_topic_configs_are_created_read_listed_and_deleted(
    registry: Registry, observer: KazooClient
) -> None:
    clicks = TopicConfig.spread(4, [1, 2], {"retention.ms": 604_800_000, "segment.ms": None})
    views = TopicConfig.spread(1, [1])
    registry.topics.create_topic_config("clicks", clicks)
    registry.topics.create_topic_config("views", views)

    assert registry.topics.topic_config("clicks") == clicks
    assert registry.topics.topic_configs() == {"clicks": clicks, "views": views}
    data, owner = node(observer, f"{registry.session.chroot}/config/topics/clicks")
    assert data == {
        "version": 1,
        "partitions": 4,
        "brokers": [1, 2, 1, 2],
        "replicas": [[1], [2], [1], [2]],
        "settings": {"retention.ms": 604_800_000, "segment.ms": None},
    }
    assert owner == 0, "topic configurations are persistent"

    registry.topics.delete_topic_config("clicks")
    assert registry.topics.topic_configs() == {"views": views}


def test_topic_config_outlives_the_registry_that_made_it(
    make_registry: Callable[..., Registry],
) -> None:
    first = make_registry()
    first.topics.create_topic_config("clicks", TopicConfig.spread(2, [1]))
    first.stop()
    assert make_registry().topics.topic_config("clicks") == TopicConfig.spread(2, [1])


def test_creating_an_existing_topic_config_raises_topic_already_exists(
    registry: Registry,
) -> None:
    registry.topics.create_topic_config("clicks", TopicConfig.spread(1, [1]))
    with pytest.raises(TopicAlreadyExists, match="clicks"):
        registry.topics.create_topic_config("clicks", TopicConfig.spread(8, [1]))
    assert registry.topics.topic_config("clicks").partitions == 1


def test_missing_topic_config_raises_unknown_topic(registry: Registry) -> None:
    with pytest.raises(UnknownTopicOrPartition, match="nope"):
        registry.topics.topic_config("nope")
    with pytest.raises(UnknownTopicOrPartition, match="nope"):
        registry.topics.delete_topic_config("nope")


def test_alter_topic_settings_loses_no_change_written_between_its_read_and_its_write(
    registry: Registry, observer: KazooClient
) -> None:
    registry.topics.create_topic_config(
        "clicks", TopicConfig.spread(2, [1], {"retention_ms": 1000})
    )
    path = registry.topics.topic_config_path("clicks")
    seen: list[dict[str, SettingValue]] = []

    def change(settings: Mapping[str, SettingValue]) -> dict[str, SettingValue]:
        seen.append(dict(settings))
        if len(seen) == 1:  # another writer gets in first
            other = TopicConfig.spread(2, [1], {**settings, "segment_ms": 5})
            observer.set(path, other.to_json())
        return {**settings, "segment_bytes": 100}

    altered = registry.topics.alter_topic_settings("clicks", change)
    assert seen == [{"retention_ms": 1000}, {"retention_ms": 1000, "segment_ms": 5}]
    expected = {"retention_ms": 1000, "segment_ms": 5, "segment_bytes": 100}
    assert altered.settings == expected
    assert registry.topics.topic_config("clicks") == altered
    with pytest.raises(UnknownTopicOrPartition, match="nope"):
        registry.topics.alter_topic_settings("nope", dict)


def test_log_starts_move_forward_only_and_keep_the_settings(registry: Registry) -> None:
    registry.topics.create_topic_config(
        "clicks", TopicConfig.spread(3, [1], {"retention_ms": 1000})
    )
    assert b"log_starts" not in registry.topics.topic_config("clicks").to_json()  # none asked yet
    moved = registry.topics.move_log_starts("clicks", {0: 500, 2: 70})
    assert moved.log_starts == {0: 500, 2: 70} and moved.settings == {"retention_ms": 1000}
    moved = registry.topics.move_log_starts("clicks", {0: 100, 2: 90})  # 0 never moves back
    assert moved.log_starts == {0: 500, 2: 90}
    assert registry.topics.topic_config("clicks") == moved
    assert TopicConfig.from_json(moved.to_json()) == moved
    altered = registry.topics.alter_topic_settings("clicks", lambda _: {"segment_ms": 5})
    assert altered.log_starts == {0: 500, 2: 90}  # a settings change keeps them
    with pytest.raises(InvalidTopic, match="partition 3, not one of the topic's"):
        registry.topics.move_log_starts("clicks", {3: 10})
    with pytest.raises(InvalidTopic, match="is -1, not >= 0"):
        registry.topics.move_log_starts("clicks", {1: -1})
    with pytest.raises(ValueError, match="'log_starts' is not an object of partition numbers"):
        TopicConfig.from_json(moved.to_json().replace(b'"0":', b'"x":'))


def test_watch_topic_config_sees_each_change_of_its_data_and_its_deletion(
    registry: Registry,
) -> None:
    first = TopicConfig.spread(2, [1], {"retention_ms": 1000})
    registry.topics.create_topic_config("clicks", first)
    values: queue.Queue[TopicConfig | None] = queue.Queue()

    def changed(config: TopicConfig | None) -> bool:
        values.put(config)
        return True  # go on watching

    registry.topics.watch_topic_config("clicks", changed)
    next_value(values, first)
    altered = registry.topics.alter_topic_settings("clicks", lambda _: {"retention_ms": None})
    next_value(values, altered)
    registry.topics.delete_topic_config("clicks")
    next_value(values, None)


@pytest.mark.parametrize("name", ["", ".", "..", "a/b", "x" * 250, "spaces here", "ü"])
def test_invalid_topic_names_are_rejected(registry: Registry, name: str) -> None:
    with pytest.raises(InvalidTopic):
        registry.topics.create_topic_config(name, TopicConfig.spread(1, [1]))
    with pytest.raises(InvalidTopic):
        registry.topics.register_topic_partitions(name, 1, [0])


def test_invalid_topic_configs_are_rejected(registry: Registry) -> None:
    with pytest.raises(InvalidTopic, match="partitions"):
        registry.topics.create_topic_config("clicks", TopicConfig.spread(0, [1]))
    with pytest.raises(InvalidTopic, match=r"retention\.ms"):
        registry.topics.create_topic_config("clicks", TopicConfig(1, (1,), {"retention.ms": "7d"}))
    assert registry.topics.topic_configs() == {}


def test_unreadable_topic_config_is_left_out_of_listings(
    registry: Registry, observer: KazooClient
) -> None:
    observer.create(f"{registry.session.chroot}/config/topics/garbage", b"not json")
    # and JSON nested too deeply for the parser (issue 50, 11: a RecursionError got out)
    observer.create(
        f"{registry.session.chroot}/config/topics/nested", b"[" * 100_000 + b"]" * 100_000
    )
    registry.topics.create_topic_config("clicks", TopicConfig.spread(1, [1]))

    assert registry.topics.topic_configs() == {"clicks": TopicConfig.spread(1, [1])}
    with pytest.raises(RegistryUnavailable, match="garbage holds unreadable data"):
        registry.topics.topic_config("garbage")
    with pytest.raises(RegistryUnavailable, match=r"nested holds unreadable data: .*nested"):
        registry.topics.topic_config("nested")


def test_watch_topic_configs_sees_creates_and_deletes(
    make_registry: Callable[..., Registry],
) -> None:
    broker, admin = make_registry(), make_registry()
    seen: queue.Queue[dict[str, TopicConfig]] = queue.Queue()
    broker.topics.watch_topic_configs(seen.put)
    next_value(seen, {})

    admin.topics.create_topic_config("clicks", TopicConfig.spread(3, [1]))
    next_value(seen, {"clicks": TopicConfig.spread(3, [1])})
    admin.topics.delete_topic_config("clicks")
    next_value(seen, {})


# -- session expiry ----------------------------------------------------------------------------


def test_session_expiry_recreates_broker_and_topic_nodes(
    registry: Registry, observer: KazooClient, zookeeper: PrivateZooKeeper
) -> None:
    registry.brokers.register(1, BROKER_1)
    registry.topics.register_topic_partitions("clicks", 1, [0, 1, 2, 3])
    registry.topics.register_topic_partitions("views", 1, [0, 1])
    seen: queue.Queue[dict[str, TopicConfig]] = queue.Queue()
    registry.topics.watch_topic_configs(seen.put)
    next_value(seen, {})

    old_session = expire_session(registry, zookeeper.connect_string)

    wait_until(
        lambda: (
            registry.session.statistics().sessions_lost == 1
            and registry.session.wait_registered(0.01)
        ),
        what="a new session with every node re-registered",
    )
    new_session = registry.session.session_id
    assert new_session not in (None, old_session)
    stats = registry.session.statistics()
    assert (stats.sessions, stats.nodes_restored, stats.registered) == (2, 3, 3)
    for path in ("brokers/ids/1", "brokers/topics/clicks/1", "brokers/topics/views/1"):
        _, owner = node(observer, f"{registry.session.chroot}/{path}")
        assert owner == new_session, path
    assert registry.brokers.read() == {1: BROKER_1}
    assert registry.topics.topic_brokers("clicks") == {1: (0, 1, 2, 3)}

    # the watch is armed again in the new session
    observer.create(
        f"{registry.session.chroot}/config/topics/late", TopicConfig.spread(1, [1]).to_json()
    )
    next_value(seen, {"late": TopicConfig.spread(1, [1])})


def test_unregistered_nodes_stay_away_after_session_expiry(
    registry: Registry, zookeeper: PrivateZooKeeper
) -> None:
    registry.brokers.register(1, BROKER_1)
    registry.topics.register_topic_partitions("clicks", 1, [0, 1, 2, 3])
    registry.topics.unregister_topic("clicks", 1)

    expire_session(registry, zookeeper.connect_string)

    wait_until(
        lambda: (
            registry.session.statistics().sessions == 2 and registry.session.wait_registered(0.01)
        ),
        what="re-registration in a new session",
    )
    assert registry.brokers.read() == {1: BROKER_1}
    assert registry.topics.topic_brokers("clicks") == {}


# -- connection loss ---------------------------------------------------------------------------


def test_start_without_zookeeper_raises_registry_unavailable() -> None:
    # a port nobody listens on, that no other test's server can take meanwhile (port 0 is
    # never given below 1024): a random free one could be another xdist worker's ZooKeeper
    registry = Registry(f"127.0.0.1:{UNUSED_PORT}", "/pylog", session_timeout_s=2.0)
    started = time.monotonic()
    with pytest.raises(RegistryUnavailable, match="cannot connect to ZooKeeper"):
        registry.start(timeout=0.5)
    assert time.monotonic() - started < 5
    with pytest.raises(RegistryUnavailable):
        registry.brokers.read()


def test_calls_after_stop_raise_registry_unavailable(registry: Registry) -> None:
    registry.stop()
    with pytest.raises(RegistryUnavailable, match="stopped"):
        registry.topics.topic_configs()
    with pytest.raises(RegistryUnavailable, match="stopped"):
        registry.brokers.register(1, BROKER_1)
    registry.stop()  # idempotent


@contextlib.contextmanager
def registry_on_own_zookeeper(
    tmp_path: Path, session_timeout_s: float, request_timeout_s: float, tick_time_ms: int = 1000
) -> Iterator[tuple[PrivateZooKeeper, Registry]]:
    """A ZooKeeper of the test's own (1 s ticks by default: sessions of 2 to 20 s), for a test
    that stops or pauses it, and a registry on it with broker 1 registered."""
    with PrivateZooKeeper(tmp_path, tick_time_ms=tick_time_ms) as server:
        registry = Registry(
            server.connect_string,
            "/pylog",
            session_timeout_s=session_timeout_s,
            request_timeout_s=request_timeout_s,
            reconnect_max_delay_s=0.5,
        )
        with registry:
            registry.brokers.register(1, BROKER_1)
            yield server, registry


@pytest.mark.broker
def test_lost_connection_fails_calls_quickly_and_the_registry_recovers(tmp_path: Path) -> None:
    # This test stops and starts its ZooKeeper. The session outlives a slow restart of the
    # JVM: 40 s, the most 2 s ticks allow (20 s, with 1 s ticks, expired it once in the
    # parallel suite: the server, started again, did not serve the session in time).
    with registry_on_own_zookeeper(tmp_path, 40.0, 0.5, tick_time_ms=2000) as (server, registry):
        registry.topics.create_topic_config("clicks", TopicConfig.spread(2, [1]))
        session = registry.session.session_id

        server.stop()
        wait_until(lambda: not registry.session.connected, what="the registry to see the loss")
        started = time.monotonic()
        with pytest.raises(RegistryUnavailable, match="not connected to ZooKeeper"):
            registry.brokers.read()
        with pytest.raises(RegistryUnavailable):
            registry.topics.create_topic_config("views", TopicConfig.spread(1, [1]))
        assert time.monotonic() - started < 2.5
        assert not registry.session.wait_registered(0)

        server.start()
        assert registry.session.wait_registered(60)
        # back within the session timeout: same session, nodes never went away
        assert registry.session.session_id == session
        assert registry.brokers.read() == {1: BROKER_1}
        assert registry.topics.topic_configs() == {"clicks": TopicConfig.spread(2, [1])}
        registry.topics.create_topic_config("views", TopicConfig.spread(1, [1]))


@pytest.mark.broker
def test_a_request_cut_off_by_a_lost_connection_fails_at_once(tmp_path: Path) -> None:
    # The read is sent, then kazoo finds the paused server silent and drops the connection.
    # The call fails then, not request_timeout_s later after sending it again (as kazoo's
    # KazooRetry would): a group member must hear of the loss at once to stop consuming.
    with registry_on_own_zookeeper(tmp_path, 6.0, 60.0) as (server, registry):
        answers: queue.Queue[object] = queue.Queue()

        def read() -> None:
            try:
                answers.put(registry.brokers.read())
            except RegistryUnavailable as error:
                answers.put(error)

        assert server.pid is not None
        with paused(server.pid):
            reader = threading.Thread(target=read)
            reader.start()
            wait_until(lambda: not registry.session.connected, 15, "kazoo to give up on the server")
            reader.join(15)
            answer = answers.get(timeout=0)
        assert isinstance(answer, RegistryUnavailable), answer
        assert "ConnectionLoss" in str(answer)
        assert registry.session.wait_registered(30)
        assert registry.brokers.read() == {1: BROKER_1}


def test_consumer_group_nodes_members_owners_and_offsets(
    make_registry: Callable[..., Registry], observer: KazooClient
) -> None:
    one, two = make_registry(), make_registry()
    one.groups.register_consumer("loaders", "m1", ["clicks", "views"])
    two.groups.register_consumer("loaders", "m2", ["clicks"])
    assert one.groups.consumers("loaders") == {"m1": ("clicks", "views"), "m2": ("clicks",)}
    data, owner = node(observer, f"{one.session.chroot}/consumers/loaders/ids/m1")
    assert (data, owner) == ({"version": 1, "topics": ["clicks", "views"]}, one.session.session_id)

    assert one.groups.claim_partition("loaders", "clicks", "1-0", "m1") is None
    assert one.groups.claim_partition("loaders", "clicks", "1-0", "m1") is None  # ours already
    assert two.groups.claim_partition("loaders", "clicks", "1-0", "m2") == "m1"
    assert two.groups.partition_owners("loaders", "clicks") == {"1-0": "m1"}
    two.groups.release_partition("loaders", "clicks", "1-0")  # not two's: stays
    assert one.groups.partition_owners("loaders", "clicks") == {"1-0": "m1"}
    one.groups.release_partition("loaders", "clicks", "1-0")
    assert two.groups.claim_partition("loaders", "clicks", "1-0", "m2") is None

    assert one.groups.committed_offset("loaders", "clicks", "1-0") is None
    one.groups.commit_offset("loaders", "clicks", "1-0", 1042)
    two.groups.commit_offset("loaders", "clicks", "1-0", 2084)
    assert one.groups.committed_offset("loaders", "clicks", "1-0") == 2084
    data, owner = node(observer, f"{one.session.chroot}/consumers/loaders/offsets/clicks/1-0")
    assert (data, owner) == ({"version": 1, "offset": 2084}, 0), "offsets are persistent"

    two.groups.unregister_consumer("loaders", "m2")
    assert one.groups.consumers("loaders") == {"m1": ("clicks", "views")}


@pytest.mark.parametrize("name", ["", ".", "..", "a/b", "x" * 250, "spaced name"])
def test_bad_group_names_and_consumer_ids_are_refused(registry: Registry, name: str) -> None:
    with pytest.raises(ValueError, match="group"):
        registry.groups.register_consumer(name, "m1", ["clicks"])
    with pytest.raises(ValueError, match="consumer id"):
        registry.groups.register_consumer("loaders", name, ["clicks"])
