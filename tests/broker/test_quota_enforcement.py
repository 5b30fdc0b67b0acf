"""Quotas on a real broker: a client over its quota of bytes a second is slowed to it (its
requests held back in the front, the wait in the reply), never refused; others are not slowed
by it; a quota changed in ZooKeeper applies within a second."""

from __future__ import annotations

import logging
import statistics
import threading
import time
from collections.abc import Iterator

import pytest
import zmq
from click.testing import CliRunner

from broker import protocol
from broker.client import Admin
from broker.client import framing as client_framing
from broker.client.connection import Connection
from broker.client.framing import DEFAULT_CLIENT_ID, THROTTLE_LOG_EVERY_S, THROTTLE_LOGGER
from broker.errors import BrokerError
from broker.log import encode_message
from broker.protocol import Ack, FetchRequest, ProduceReply, ProduceRequest
from broker.quotas import WINDOW_S, Kind, Quota, QuotaConfig, describe_quotas
from broker.ratelog import RateLimitedLog
from broker.registry import Registry
from broker.zookeeper import PrivateZooKeeper
from cli.pylogctl import cli
from tests.broker.test_flow_control import fill
from tests.conftest import wait_until
from tests.dashboard import QUOTA_ONLY, queried_metrics
from tests.pylogd import RunningBroker

SET_BYTES = 50_000
"""The message set of each PRODUCE: 50 messages of 1000 bytes."""
MESSAGE_SET = encode_message(b"q" * (SET_BYTES // 50 - 22)) * 50
BROKER_FLAGS = ("--metrics-enabled", "true", "--metrics-port", "0")
"""The module broker's (tests/conftest.py): its metrics served."""


@pytest.fixture
def quotas(broker: RunningBroker, zookeeper: PrivateZooKeeper) -> Iterator[Registry]:
    """A registry on the module broker's chroot, to set quotas with (each test's client ids
    are its own: no default is set here)."""
    registry = Registry(zookeeper.connect_string, broker.arguments[1])
    registry.start(timeout=10)
    yield registry
    registry.stop()


def set_quota(broker: RunningBroker, quotas: Registry, name: str, quota: Quota) -> None:
    """Set `name`'s quota, and wait until the broker says it has it (within a second)."""
    quotas.quotas.set(Kind.CLIENT, name, quota)
    described = describe_quotas(QuotaConfig({Kind.CLIENT: {name: quota}}))
    wait_until(lambda: described in broker.log_path.read_text(), 1.0, "the quota in force")


def create(broker: RunningBroker, topic: str, partitions: int) -> None:
    with Admin(broker.endpoint) as admin:
        admin.create_topic(topic, partitions)


class FlatOut(threading.Thread):
    """A client that produces 50 KB sets one after another as fast as the broker answers
    (ack WRITTEN), noting when each was acknowledged and how long the broker said it held it."""

    def __init__(self, endpoint: str, topic: str, client_id: str, seconds: float) -> None:
        super().__init__(daemon=True)
        self.connection = Connection(endpoint, client_id=client_id, timeout_s=30.0)
        self.request = ProduceRequest(topic, 0, Ack.WRITTEN, MESSAGE_SET)
        self.frame_bytes = sum(len(f) for f in self.connection._frames(self.request)[1])
        self.seconds = seconds
        self.acked: list[float] = []
        self.throttle_ms: list[int] = []
        self.stopped = threading.Event()

    def run(self) -> None:
        deadline = time.monotonic() + self.seconds
        with self.connection:
            while time.monotonic() < deadline and not self.stopped.is_set():
                reply = self.connection.request(self.request)
                self.acked.append(time.monotonic())
                self.throttle_ms.append(reply.throttle_ms)

    def rate(self, start: float, end: float) -> float:
        """Request bytes a second acknowledged in [start, end)."""
        count = sum(1 for t in self.acked if start <= t < end)
        return count * self.frame_bytes / (end - start)


def latencies(endpoint: str, topic: str, seconds: float) -> list[float]:
    """Small PRODUCEs one after another (ack WRITTEN) by a client with no quota: how long
    each took."""
    request = ProduceRequest(topic, 1, Ack.WRITTEN, encode_message(b"calm"))
    took: list[float] = []
    deadline = time.monotonic() + seconds
    with Connection(endpoint, client_id="calm", timeout_s=10.0) as connection:
        while time.monotonic() < deadline and len(took) < 20_000:
            started = time.monotonic()
            connection.request(request)
            took.append(time.monotonic() - started)
    return took


@pytest.mark.parametrize("seconds", [4.5, pytest.param(21.5, marks=pytest.mark.slow)])
def test_a_producer_over_its_quota_is_slowed_to_it_and_others_are_not(
    broker: RunningBroker,
    quotas: Registry,
    topic: str,
    caplog: pytest.LogCaptureFixture,
    seconds: float,
) -> None:
    """Measured from 1.5 s on (it may run a window ahead first): over 3 s in the default run,
    over 20 s in the slow one."""
    name = f"hog-{seconds}"
    create(broker, topic, 2)
    set_quota(broker, quotas, name, Quota(produce_bytes_per_s=1_000_000))
    alone = latencies(broker.endpoint, topic, 1.0)
    hog = FlatOut(broker.endpoint, topic, name, seconds=seconds)
    with caplog.at_level(logging.WARNING, "pylog.client.quota"):
        started = time.monotonic()
        hog.start()
        beside = latencies(broker.endpoint, topic, 3.0)
        hog.join(timeout=seconds + 30)
    # Past its first window (it may run WINDOW_S ahead), within 10% of its quota.
    assert hog.rate(started + 1.5, started + seconds) == pytest.approx(1_000_000, rel=0.1)
    assert max(hog.throttle_ms) > 0  # and the replies said they were held back
    assert "this client is over its quota" in caplog.text
    # The calm client is not slowed by it (its median latency, with generous room for noise).
    assert statistics.median(beside) < 2 * statistics.median(alone) + 0.002
    counted = broker.metrics()
    labels = (("direction", "produce"), ("kind", "client"), ("name", name))
    assert counted[("pylog_quota_bytes_total", labels)] >= (seconds - 0.5) * 1_000_000
    assert counted[("pylog_quota_throttle_seconds_total", labels)] > 1.0
    assert counted[("pylog_quota_bytes_per_second", labels)] == 1_000_000
    assert queried_metrics() >= QUOTA_ONLY  # the dashboard's quota panels have their figures
    assert {name for name, _ in counted} >= QUOTA_ONLY


def test_requests_held_for_a_quota_are_bounded_in_bytes_over_the_clients_connections(
    broker: RunningBroker, quotas: Registry, topic: str
) -> None:
    """Issue 50, 2: connections pipelining PRODUCEs under a small quota were held back 64
    each, whatever their bytes (40 of 512 KiB ones took the supervisor to 1.3 GiB). A client's
    held requests are bounded in bytes over all its connections, a quarter of
    queued_request_bytes (8 MiB): the rest answered REPLIES_NOT_READ at once."""
    create(broker, topic, 1)
    set_quota(broker, quotas, "hoarder", Quota(produce_bytes_per_s=1000))
    header = protocol.RequestHeader(protocol.Api.PRODUCE, 2, 0, "hoarder")
    frames = protocol.encode_request(header, ProduceRequest(topic, 0, Ack.WRITTEN, MESSAGE_SET))
    size = sum(len(frame) for frame in frames)
    context = zmq.Context()
    sockets = [context.socket(zmq.DEALER) for _ in range(4)]
    refused = 0
    try:
        for socket in sockets:
            socket.connect(broker.endpoint)
            for _ in range(20):
                socket.send_multipart(frames)
        share = (8 << 20) // 4

        def held() -> float:
            return broker.metrics()[("pylog_quota_held_requests", ())]

        wait_until(lambda: held() > 0, 10, "requests held back")
        served, deadline = 0, time.monotonic() + 10
        while served + refused < 80 - share // size and time.monotonic() < deadline:
            for socket in sockets:
                while socket.poll(50):
                    try:
                        protocol.decode_reply(protocol.Api.PRODUCE, socket.recv_multipart(), 2)
                    except BrokerError as error:
                        assert error.code == protocol.ErrorCode.REPLIES_NOT_READ, error
                        refused += 1
                    else:
                        served += 1
        assert served == 1  # within the client's first window
        assert refused == 80 - 1 - share // size  # the rest but a share held
        assert held() == share // size
    finally:
        quotas.quotas.delete(Kind.CLIENT, "hoarder")  # what is held drains
        for socket in sockets:
            socket.close(linger=0)
        context.term()


def test_what_a_closed_connection_held_for_its_quota_is_never_appended(
    broker: RunningBroker, quotas: Registry, topic: str
) -> None:
    """Issue 50, 2: with a 5 MB/s quota, held writes went on being appended 45 s after their
    client had gone. A connection that closes drops what its quota held: the quota taken away
    afterwards (which would serve them at once), nothing more is stored."""
    create(broker, topic, 1)
    set_quota(broker, quotas, "leaver", Quota(produce_bytes_per_s=1000))
    header = protocol.RequestHeader(protocol.Api.PRODUCE, 2, 0, "leaver")
    frames = protocol.encode_request(header, ProduceRequest(topic, 0, Ack.WRITTEN, MESSAGE_SET))
    context = zmq.Context()
    try:
        socket = context.socket(zmq.DEALER)
        socket.connect(broker.endpoint)
        for _ in range(10):
            socket.send_multipart(frames)
        assert socket.poll(10_000), "the first PRODUCE, within the window, is not answered"
        protocol.decode_reply(protocol.Api.PRODUCE, socket.recv_multipart(), 2)
        wait_until(lambda: broker.metrics()[("pylog_quota_held_requests", ())] == 9, 10, "9 held")
        socket.close(linger=0)
        wait_until(lambda: broker.metrics()[("pylog_quota_held_requests", ())] == 0, 10, "dropped")
    finally:
        quotas.quotas.delete(Kind.CLIENT, "leaver")
        context.term()
    assert "a connection closed: 9 requests held for it dropped" in broker.log_path.read_text()
    with Connection(broker.endpoint) as connection:
        reply = connection.request(FetchRequest(topic, 0, 0, 1 << 24, 0, 0))
    assert len(reply.message_set) == len(MESSAGE_SET)  # the first alone


def test_a_quota_changed_live_applies_within_a_second(
    broker: RunningBroker, quotas: Registry, topic: str
) -> None:
    create(broker, topic, 1)
    set_quota(broker, quotas, "hog-2", Quota(produce_bytes_per_s=1_000_000))
    hog = FlatOut(broker.endpoint, topic, "hog-2", seconds=9.0)
    hog.start()
    time.sleep(2.0)  # the hog runs at its quota meanwhile
    set_quota(broker, quotas, "hog-2", Quota(produce_bytes_per_s=3_000_000))
    raised = time.monotonic()
    time.sleep(3.5)
    set_quota(broker, quotas, "hog-2", Quota(produce_bytes_per_s=200_000))
    lowered = time.monotonic()
    hog.join(timeout=30)
    # Raised: from a second after the change on, the new rate (what it owed was paid at once,
    # and its first window spent within that second).
    assert hog.rate(raised + 1.0, raised + 3.5) == pytest.approx(3_000_000, rel=0.1)
    # Lowered: from a second after, no more than the new rate (it owes a window at the old
    # one, which it pays at the new rate first).
    assert hog.rate(lowered + 1.0, lowered + 3.5) <= 200_000 * 1.1


def test_a_consumer_over_its_fetch_quota_is_slowed_to_it(
    broker: RunningBroker, quotas: Registry, topic: str
) -> None:
    create(broker, topic, 1)
    end = fill(broker.endpoint, topic, 8)  # 8 MiB
    set_quota(broker, quotas, "reader-3", Quota(fetch_bytes_per_s=1_000_000))
    got: list[tuple[float, int, int]] = []
    offset = 0
    with Connection(broker.endpoint, client_id="reader-3", timeout_s=30.0) as connection:
        started = time.monotonic()
        while time.monotonic() - started < 4.0 and offset < end:
            request = FetchRequest(topic, 0, offset, 100_000, 0, 0)
            reply = connection.request(request)
            offset += len(reply.message_set)
            got.append((time.monotonic(), len(reply.message_set), reply.throttle_ms))
    fetched = sum(size for t, size, _ in got if started + 1.5 <= t < started + 4.0)
    assert fetched / 2.5 == pytest.approx(1_000_000, rel=0.1)
    assert max(throttle for *_, throttle in got) > 0
    # Another client id reads the same at full speed.
    with Connection(broker.endpoint, client_id="reader-4", timeout_s=30.0) as connection:
        started, position = time.monotonic(), 0
        while position < 4_000_000:
            reply = connection.request(FetchRequest(topic, 0, position, 1 << 20, 0, 0))
            assert reply.throttle_ms == 0
            position += len(reply.message_set)
        assert time.monotonic() - started < 2.0


def test_an_old_client_is_held_back_the_same_without_being_told(
    broker: RunningBroker, quotas: Registry, topic: str
) -> None:
    """A PRODUCE of version 1 has no throttle_ms in its reply: it waits all the same."""
    create(broker, topic, 1)
    set_quota(broker, quotas, "old-5", Quota(produce_bytes_per_s=100_000))
    request = ProduceRequest(topic, 0, Ack.WRITTEN, MESSAGE_SET)
    with Connection(broker.endpoint, client_id="old-5", timeout_s=30.0) as connection:
        started = time.monotonic()
        for _ in range(5):  # 250 KB: the last one waits until 250 - 50 - 100 KB are paid
            reply = connection._request_once(request, protocol.API_VERSION)
            assert isinstance(reply, ProduceReply) and reply.throttle_ms == 0
        took = time.monotonic() - started
    assert (200_000 / 100_000 - WINDOW_S) * 0.9 < took < 5.0


def test_pylogctl_says_that_the_broker_slowed_it(
    broker: RunningBroker, quotas: Registry, topic: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without -v pylogctl shows no library's log, but a quota's slowing it is said."""
    monkeypatch.setattr(  # a warning said by another test of this process within 10 s
        client_framing,
        "_throttle_log",
        RateLimitedLog(logging.getLogger(THROTTLE_LOGGER), THROTTLE_LOG_EVERY_S),
    )
    create(broker, topic, 1)
    set_quota(broker, quotas, DEFAULT_CLIENT_ID, Quota(produce_bytes_per_s=100_000))
    try:
        lines = b"".join(b"%0999d\n" % i for i in range(300))  # 300 KB, 100 KB ahead allowed
        result = CliRunner().invoke(
            cli, ["produce", topic, "--ack", "written", "-b", broker.endpoint], input=lines
        )
    finally:
        quotas.quotas.delete(Kind.CLIENT, DEFAULT_CLIENT_ID)
    assert result.exit_code == 0, result.output
    assert "pylogctl: the broker held a request back" in result.stderr
    assert "this client is over its quota" in result.stderr
