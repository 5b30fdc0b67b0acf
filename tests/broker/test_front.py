"""The front's routing loop never waits on ZooKeeper: topic creation and deletion run beside
it and finish by message, so produce and fetch for existing partitions go on while ZooKeeper
is paused (SIGSTOP: connected, silent, as a stalled ensemble is)."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from broker.client import Admin
from broker.client.connection import Connection
from broker.log import encode_message
from broker.protocol import (
    Ack,
    Api,
    CreateTopicRequest,
    DeleteTopicRequest,
    ProduceRequest,
    decode_reply,
)
from tests.conftest import reply_waiting, single_box_flags, wait_until
from tests.pylogd import RunningBroker

PRODUCES = 20


@pytest.fixture
def broker_with_pausable_zookeeper(
    make_pylogd: Callable[..., RunningBroker], tmp_path_factory: pytest.TempPathFactory
) -> RunningBroker:
    """pylogd with its private ZooKeeper and a session long enough (20 s) that kazoo does not
    give up on a paused server while the test runs."""
    root = tmp_path_factory.mktemp("front")
    return make_pylogd(
        *single_box_flags(root), "--zookeeper-session-timeout-ms", "20000", zookeeper=""
    )


@contextlib.contextmanager
def paused(pid: int) -> Iterator[None]:
    os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(pid, signal.SIGCONT)


def produce_round_trips(producer: Connection, topic: str) -> list[float]:
    """PRODUCES messages one at a time (ack=written), each answered before the next: their
    latencies."""
    latencies = []
    for i in range(PRODUCES):
        started = time.monotonic()
        request = ProduceRequest(topic, 0, Ack.WRITTEN, encode_message(b"while-paused-%d" % i))
        producer.request(request)
        latencies.append(time.monotonic() - started)
    return latencies


@pytest.mark.parametrize("api", [Api.CREATE_TOPIC, Api.DELETE_TOPIC])
def test_produce_is_served_while_a_topic_change_waits_on_a_paused_zookeeper(
    broker_with_pausable_zookeeper: RunningBroker, api: Api
) -> None:
    broker = broker_with_pausable_zookeeper
    with Admin(broker.endpoint) as admin:
        admin.create_topic("steady", 1)
        admin.create_topic("doomed", 1)
    zookeeper = broker.zookeeper_pid()
    assert zookeeper is not None
    with (
        Connection(broker.endpoint, timeout_s=5.0) as admin_connection,
        Connection(broker.endpoint, timeout_s=5.0) as producer,
    ):
        producer.request(ProduceRequest("steady", 0, Ack.WRITTEN, encode_message(b"before")))
        change = (
            CreateTopicRequest("fresh", 1, {})
            if api == Api.CREATE_TOPIC
            else DeleteTopicRequest("doomed")
        )
        with paused(zookeeper):
            admin_connection.send_pipelined(change)
            latencies = produce_round_trips(producer, "steady")
            # every produce was answered while the topic change still waits on ZooKeeper
            assert not reply_waiting(admin_connection, 0)
        _, frames = admin_connection.receive_pipelined(30.0)  # ZooKeeper is back: it finishes
        decode_reply(api, frames)  # raises BrokerError if it failed
    latencies.sort()
    print(
        f"produce while {api.name} waited: p50 {latencies[len(latencies) // 2] * 1000:.1f} ms, "
        f"max {latencies[-1] * 1000:.1f} ms"
    )
    with Admin(broker.endpoint) as admin:
        assert ("fresh" in admin.list_topics()) == (api == Api.CREATE_TOPIC)
        assert ("doomed" in admin.list_topics()) == (api == Api.CREATE_TOPIC)


def test_produce_is_served_while_the_private_zookeeper_restarts(
    broker_with_pausable_zookeeper: RunningBroker,
) -> None:
    broker = broker_with_pausable_zookeeper
    with Admin(broker.endpoint) as admin:
        admin.create_topic("steady", 1)
    zookeeper = broker.zookeeper_pid()
    assert zookeeper is not None
    with Connection(broker.endpoint, timeout_s=5.0) as producer:
        producer.request(ProduceRequest("steady", 0, Ack.WRITTEN, encode_message(b"before")))
        os.kill(zookeeper, signal.SIGKILL)
        wait_until(
            lambda: "the private ZooKeeper exited" in broker.log_tail(200),
            30,
            "pylogd to notice and start it again",
        )
        produce_round_trips(producer, "steady")
        # all answered while the new JVM was still starting (it takes most of a second)
        assert "private ZooKeeper restarted" not in broker.log_tail(200)
    wait_until(lambda: "private ZooKeeper restarted" in broker.log_tail(200), 60, "the restart")
    # restarted by a thread of pylogd's own, it still dies with pylogd, even by SIGKILL
    restarted = broker.zookeeper_pid()
    assert restarted not in (None, zookeeper)
    broker.kill()
    wait_until(lambda: not Path(f"/proc/{restarted}").exists(), 30, "the new ZooKeeper to exit")


def test_a_worker_keeps_at_most_log_max_open_files_segment_files_open(
    make_pylogd: Callable[..., RunningBroker], tmp_path_factory: pytest.TempPathFactory
) -> None:
    root = tmp_path_factory.mktemp("files")
    broker = make_pylogd("--broker-log-dirs", str(root / "logs"), "--log-max-open-files", "4")
    with Admin(broker.endpoint) as admin:
        admin.create_topic("wide", 20)
    with Connection(broker.endpoint) as producer:
        for number in range(20):
            producer.request(ProduceRequest("wide", number, Ack.FLUSHED, encode_message(b"x")))
    (worker,) = broker.worker_pids()
    fds = Path(f"/proc/{worker}/fd")
    open_segments = [
        target
        for fd in fds.iterdir()
        if re.fullmatch(r"\d{20}\.log", Path(target := os.readlink(fd)).name)
    ]
    assert 0 < len(open_segments) <= 4, open_segments
