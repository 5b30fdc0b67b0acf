"""pylogd end to end: a real broker process, real ZooKeeper, real sockets on loopback.

The requests here are built with broker.protocol alone, as a client in another language would
build them from docs/protocol.md.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import zmq

from broker import protocol
from broker.client import Admin, Connection, Producer
from broker.errors import BrokerError, Unavailable
from broker.log import encode_message
from broker.protocol import Ack, Api
from broker.registry import Registry
from broker.supervisor import ZOOKEEPER_BACKOFF, ZOOKEEPER_START_ATTEMPTS
from broker.zookeeper import PrivateZooKeeper, free_port
from tests.conftest import single_box_flags, wait_until
from tests.pipes import PipeLines
from tests.proxies import FreezableProxy
from tests.pylogd import RunningBroker

FETCH_ALL = 1 << 20


class RawClient:
    """REQ socket, one request at a time, replies decoded by broker.protocol."""

    def __init__(self, endpoint: str, timeout_s: float = 10.0) -> None:
        self.endpoint = endpoint
        self.timeout_ms = int(timeout_s * 1000)
        self.context = zmq.Context()
        self.correlation_id = 0
        self.socket = self._connect()

    def _connect(self) -> zmq.Socket[bytes]:
        socket = self.context.socket(zmq.REQ)
        socket.setsockopt(zmq.LINGER, 0)
        socket.setsockopt(zmq.RCVTIMEO, self.timeout_ms)
        socket.connect(self.endpoint)
        return socket

    def send_frames(self, frames: list[bytes]) -> list[bytes]:
        self.socket.send_multipart(frames)
        try:
            return self.socket.recv_multipart()
        except zmq.Again:
            self.socket.close()
            self.socket = self._connect()
            raise Unavailable("no reply in time") from None

    def call(self, api: Api, request: protocol.Request) -> protocol.Reply:
        self.correlation_id += 1
        header = protocol.RequestHeader(api, 1, self.correlation_id, "tests")
        frames = [bytes(f) for f in protocol.encode_request(header, request)]
        return protocol.decode_reply(api, self.send_frames(frames))

    def create(self, topic: str, partitions: int) -> None:
        self.call(Api.CREATE_TOPIC, protocol.CreateTopicRequest(topic, partitions, {}))

    def produce(self, topic: str, partition: int, data: bytes, ack: Ack) -> protocol.ProduceReply:
        reply = self.call(Api.PRODUCE, protocol.ProduceRequest(topic, partition, ack, data))
        assert isinstance(reply, protocol.ProduceReply)
        return reply

    def fetch(
        self, topic: str, partition: int, offset: int, max_wait_ms: int = 0, min_bytes: int = 0
    ) -> protocol.FetchReply:
        request = protocol.FetchRequest(topic, partition, offset, FETCH_ALL, max_wait_ms, min_bytes)
        reply = self.call(Api.FETCH, request)
        assert isinstance(reply, protocol.FetchReply)
        return reply

    def read_all(self, topic: str, partition: int) -> bytes:
        """Every flushed byte of the partition, from offset 0."""
        out = b""
        while True:
            data = bytes(self.fetch(topic, partition, len(out)).message_set)
            if not data:
                return out
            out += data

    def close(self) -> None:
        self.context.destroy(linger=0)


@pytest.fixture
def client(pylogd: RunningBroker) -> Iterator[RawClient]:
    c = RawClient(pylogd.endpoint)
    yield c
    c.close()


def message_set(first: int, count: int) -> bytes:
    return b"".join(
        encode_message(b"value-%06d" % i, key=b"k%d" % i, timestamp_ms=1_700_000_000_000 + i)
        for i in range(first, first + count)
    )


def error_of(call: Callable[[], object]) -> str:
    with pytest.raises(BrokerError) as raised:
        call()
    return raised.value.name


def test_produce_with_each_ack_mode_reads_back_byte_exact_across_topics_and_workers(
    pylogd: RunningBroker, client: RawClient
) -> None:
    client.create("clicks", 4)
    client.create("views", 2)
    expected: dict[tuple[str, int], bytes] = {}
    for topic, partitions in (("clicks", 4), ("views", 2)):
        for p in range(partitions):
            written, flushed = message_set(0, 3), message_set(3, 2)
            assert client.produce(topic, p, written, Ack.WRITTEN).base_offset == 0
            reply = client.produce(topic, p, flushed, Ack.FLUSHED)
            assert (reply.base_offset, reply.count) == (len(written), 2)
            # ack=flushed: visible as soon as acked
            assert client.read_all(topic, p) == written + flushed
            expected[(topic, p)] = written + flushed
    # ack=none: no reply at all; the data shows up once flushed
    dealer = client.context.socket(zmq.DEALER)
    dealer.connect(pylogd.endpoint)
    header = protocol.RequestHeader(Api.PRODUCE, 1, 999, "tests")
    fire = message_set(5, 4)
    dealer.send_multipart(
        protocol.encode_request(header, protocol.ProduceRequest("views", 1, Ack.NONE, fire))
    )
    expected[("views", 1)] += fire
    wait_until(lambda: client.read_all("views", 1) == expected[("views", 1)], 10, "ack=none data")
    assert dealer.poll(200) == 0  # and no reply came
    for (topic, p), data in expected.items():
        assert client.read_all(topic, p) == data
    # the partitions really are spread over the two workers' log dirs
    folders = {d.parent.name for d in pylogd.data_dir.parent.glob("logs-*/*-*")}
    assert folders == {"logs-a", "logs-b"}


def test_long_poll_answers_as_soon_as_a_flush_lands(
    pylogd: RunningBroker, client: RawClient
) -> None:
    client.create("events", 1)
    poller = client.context.socket(zmq.DEALER)
    poller.connect(pylogd.endpoint)
    header = protocol.RequestHeader(Api.FETCH, 1, 7, "tests")
    long_poll = protocol.FetchRequest("events", 0, 0, FETCH_ALL, 60_000, 1)
    poller.send_multipart(protocol.encode_request(header, long_poll))  # DEALER: no delimiter
    assert poller.poll(300) == 0  # nothing to read yet: the broker holds the request
    data = message_set(0, 5)
    client.produce("events", 0, data, Ack.WRITTEN)
    assert poller.poll(10_000), "the long poll was not answered after the flush"
    frames = poller.recv_multipart()
    reply = protocol.decode_reply(Api.FETCH, frames)
    assert bytes(reply.message_set) == data
    # and with nothing arriving, max_wait_ms ends the wait with an empty answer
    empty = client.fetch("events", 0, len(data), max_wait_ms=100, min_bytes=1)
    assert bytes(empty.message_set) == b""


def test_bad_requests_get_their_error_and_change_nothing(
    pylogd: RunningBroker, client: RawClient
) -> None:
    client.create("orders", 2)
    good = message_set(0, 3)
    client.produce("orders", 0, good, Ack.FLUSHED)
    flipped = bytearray(message_set(10, 2))
    flipped[-3] ^= 0xFF
    oversize = encode_message(b"x" * (2 << 20))
    cases = {
        "INVALID_MESSAGE": lambda: client.produce("orders", 0, bytes(flipped), Ack.FLUSHED),
        "MESSAGE_TOO_LARGE": lambda: client.produce("orders", 0, oversize, Ack.FLUSHED),
        "UNKNOWN_TOPIC_OR_PARTITION": lambda: client.produce("nope", 0, good, Ack.FLUSHED),
        "INVALID_OFFSET": lambda: client.fetch("orders", 0, 5),
        "OFFSET_OUT_OF_RANGE": lambda: client.fetch("orders", 0, 10_000),
        "TOPIC_ALREADY_EXISTS": lambda: client.create("orders", 1),
        "INVALID_TOPIC": lambda: client.create("no/slash", 1),
    }
    for name, call in cases.items():
        assert error_of(call) == name, name
    assert error_of(lambda: client.produce("orders", 2, good, Ack.FLUSHED)) == (
        "UNKNOWN_TOPIC_OR_PARTITION"
    )
    header = protocol.RequestHeader(Api.FETCH, 1, 5, "tests")
    request = protocol.FetchRequest("orders", 0, 0, FETCH_ALL, 0, 0)
    (fetch,) = (bytes(f) for f in protocol.encode_request(header, request))
    raw_cases = {
        "MALFORMED_REQUEST": [b"\x00\x01"],
        "UNSUPPORTED_API": [b"\x00\x63" + fetch[2:]],
        "UNSUPPORTED_VERSION": [fetch[:2] + b"\x00\x09" + fetch[4:]],
    }
    for name, frames in raw_cases.items():
        reply = client.send_frames(frames)
        assert protocol.ErrorCode(protocol.decode_reply_header(reply).error_code).name == name
    # nothing stored changed, and the broker still serves
    assert client.read_all("orders", 0) == good
    client.produce("orders", 0, good, Ack.FLUSHED)
    assert client.read_all("orders", 0) == good + good


def test_metadata_names_the_broker_and_topics_and_zookeeper_has_them(
    pylogd: RunningBroker, client: RawClient, make_registry: Callable[..., Registry]
) -> None:
    client.create("metrics", 3)
    reply = client.call(Api.METADATA, protocol.MetadataRequest(()))
    assert isinstance(reply, protocol.MetadataReply)
    port = int(pylogd.endpoint.rsplit(":", 1)[1])
    assert [(b.broker_id, b.host, b.port) for b in reply.brokers] == [(0, "127.0.0.1", port)]
    (topic,) = reply.topics
    assert topic.topic == "metrics"
    assert topic.partitions == tuple(protocol.PartitionInfo(p, 0) for p in range(3))
    unknown = client.call(Api.METADATA, protocol.MetadataRequest(("ghost",)))
    assert isinstance(unknown, protocol.MetadataReply)
    assert unknown.topics[0].error_code == protocol.ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    registry = make_registry()
    assert registry.brokers.read()[0].port == port
    assert registry.topics.topic_configs()["metrics"].partitions == 3
    assert registry.topics.topic_brokers("metrics") == {0: (0, 1, 2)}


def test_advertised_port_is_what_zookeeper_and_metadata_give_others(
    make_pylogd: Callable[..., RunningBroker],
    tmp_path: Path,
    make_registry: Callable[..., Registry],
) -> None:
    """A broker behind a port forward or a proxy registers and answers the port others reach
    it by (broker.advertised_port), not the one it binds."""
    advertised = free_port()
    pylogd = make_pylogd(*single_box_flags(tmp_path), "--broker-advertised-port", str(advertised))
    bound = int(pylogd.endpoint.rsplit(":", 1)[1])
    assert bound != advertised
    client = RawClient(pylogd.endpoint)
    try:
        reply = client.call(Api.METADATA, protocol.MetadataRequest(()))
    finally:
        client.close()
    assert isinstance(reply, protocol.MetadataReply)
    assert [(b.host, b.port) for b in reply.brokers] == [("127.0.0.1", advertised)]
    assert make_registry().brokers.read()[0].port == advertised


def test_deleted_topic_is_gone_from_disk_and_zookeeper(
    pylogd: RunningBroker, client: RawClient, make_registry: Callable[..., Registry]
) -> None:
    client.create("temp", 2)
    client.produce("temp", 0, message_set(0, 1), Ack.FLUSHED)
    client.call(Api.DELETE_TOPIC, protocol.DeleteTopicRequest("temp"))
    wait_until(lambda: not list(pylogd.data_dir.parent.glob("logs-*/temp-*")), 10)
    assert "temp" not in make_registry().topics.topic_configs()
    assert error_of(lambda: client.fetch("temp", 0, 0)) == "UNKNOWN_TOPIC_OR_PARTITION"


def test_killed_worker_is_restarted_and_every_flushed_ack_survives_in_order(
    pylogd: RunningBroker, client: RawClient
) -> None:
    client.create("load", 2)
    acked: dict[int, list[tuple[int, bytes]]] = {0: [], 1: []}
    workers = pylogd.worker_pids()
    assert len(workers) == 2
    killed = False
    deadline = time.monotonic() + 60
    n = 0
    while n < 400 and time.monotonic() < deadline:
        partition = n % 2
        data = message_set(n * 10, 10)
        try:
            reply = client.produce("load", partition, data, Ack.FLUSHED)
        except BrokerError as error:
            assert error.retriable, error
            continue  # PARTITION_UNAVAILABLE while the worker restarts: retry the same batch
        except Unavailable:
            continue  # the request was in flight when the worker died
        acked[partition].append((reply.base_offset, data))
        n += 1
        if n == 100 and not killed:
            os.kill(workers[0], signal.SIGKILL)
            killed = True
    assert n == 400, "the load did not finish in time"
    wait_until(lambda: len(pylogd.worker_pids()) == 2, 20, "the worker to be restarted")
    assert set(pylogd.worker_pids()) != set(workers)
    for partition, batches in acked.items():
        stored = client.read_all("load", partition)
        offsets = [offset for offset, _ in batches]
        assert offsets == sorted(offsets)
        for offset, data in batches:  # each acked batch at the offset it was acked with
            assert stored[offset : offset + len(data)] == data
    assert "exited with -9" in pylogd.log_tail(200)


def test_sigterm_flushes_everything_and_exits_0(
    make_pylogd: Callable[..., RunningBroker],
) -> None:
    flags = (
        *("--log-flush-interval-ms", "3600000", "--log-flush-messages", "1000000"),
        *("--log-flush-when-idle", "false"),
    )
    broker = make_pylogd(*flags, name="b1")
    client = RawClient(broker.endpoint)
    client.create("audit", 1)
    data = message_set(0, 20)
    client.produce("audit", 0, data, Ack.WRITTEN)
    assert client.read_all("audit", 0) == b""  # written, not flushed: not visible yet
    client.close()
    assert broker.stop() == 0
    again = broker.restarted()
    try:
        client = RawClient(again.endpoint)
        assert client.read_all("audit", 0) == data
        client.close()
    finally:
        assert again.stop() == 0


def test_ctrl_c_stops_pylogd_cleanly_and_logs_no_error(
    zookeeper: PrivateZooKeeper, tmp_path: Path, registry_chroot: str
) -> None:
    """Ctrl-C in a terminal sends SIGINT to the whole process group, workers included: they
    exit at once, and that is the shutdown, not a crash to restart and log as an ERROR."""
    broker = RunningBroker(
        tmp_path / "b", zookeeper.connect_string, registry_chroot, *single_box_flags(tmp_path)
    ).start(own_session=True)
    assert broker.ctrl_c() == 0
    log = broker.log_path.read_text()
    assert "SIGINT: shutting down" in log
    assert ": ERROR " not in log, log


def test_json_logs_are_one_object_a_line_from_every_process(
    make_pylogd: Callable[..., RunningBroker], tmp_path: Path
) -> None:
    broker = make_pylogd(*single_box_flags(tmp_path), "--broker-log-format", "json")
    client = RawClient(broker.endpoint)
    client.create("logged", 1)
    client.close()
    assert broker.stop() == 0
    events = [json.loads(line) for line in broker.log_path.read_text().splitlines()]
    assert all({"time", "level", "logger", "pid", "message"} <= event.keys() for event in events)
    loggers = {event["logger"] for event in events}
    assert {"pylog.supervisor", "pylog.worker"} <= loggers
    assert len({event["pid"] for event in events}) >= 3  # the supervisor and both workers
    assert any("created topic 'logged'" in event["message"] for event in events)


@pytest.mark.broker
def test_an_unknown_log_format_is_a_usage_error(tmp_path: Path) -> None:
    pylogd = Path(sys.executable).with_name("pylogd")
    done = subprocess.run(
        [str(pylogd), "--broker-data-dir", str(tmp_path), "--broker-log-format", "xml"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert "broker_log_format must be one of text, json, not 'xml'" in done.stderr


def test_ack_flushed_is_answered_by_group_commit_not_after_the_flush_interval(
    make_pylogd: Callable[..., RunningBroker],
) -> None:
    flags = (
        *("--log-flush-interval-ms", "3600000", "--log-flush-messages", "1000000"),
        *("--log-flush-when-idle", "false"),
    )
    client = RawClient(make_pylogd(*flags).endpoint)
    client.create("orders", 1)
    written = message_set(0, 3)
    client.produce("orders", 0, written, Ack.WRITTEN)
    assert client.read_all("orders", 0) == b""  # no flush due for an hour
    flushed = message_set(3, 2)
    reply = client.produce("orders", 0, flushed, Ack.FLUSHED)  # answered within the timeout
    assert reply.base_offset == len(written)
    assert client.read_all("orders", 0) == written + flushed  # durable and visible: flushed
    client.close()


def running(pid: int) -> bool:
    """Whether the process exists and is not a zombie waiting to be reaped."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def test_workers_exit_when_the_supervisor_is_killed(pylogd: RunningBroker) -> None:
    workers = pylogd.worker_pids()
    assert len(workers) == 2
    os.kill(pylogd.pid, signal.SIGKILL)
    assert pylogd.process is not None
    pylogd.process.wait()
    wait_until(lambda: not any(running(pid) for pid in workers), 10, "orphaned workers to exit")


def shared_objects(pid: int) -> set[str]:
    """The sockets and pipes process `pid` holds beyond stdin, stdout and stderr."""
    held = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        with contextlib.suppress(FileNotFoundError):
            target = os.readlink(fd)
            if int(fd.name) > 2 and target.startswith(("socket:", "pipe:")):
                held.add(target)
    return held


def test_workers_are_forks_named_for_ps_holding_none_of_the_supervisors_sockets(
    pylogd: RunningBroker,
) -> None:
    """A worker is a fork of the supervisor (no interpreter of its own to start), named for ps
    and top, that keeps none of the descriptors it inherited: the front's listening socket and
    the ZooKeeper connection among them, which a worker flushing for the last time after its
    supervisor was killed would otherwise hold."""
    workers = pylogd.worker_pids()
    names = {Path(f"/proc/{pid}/comm").read_text().strip() for pid in workers}
    assert names == {"pylog-worker-0", "pylog-worker-1"}
    supervisor_command = Path(f"/proc/{pylogd.pid}/cmdline").read_bytes()
    supervisor_holds = shared_objects(pylogd.pid)
    assert len(supervisor_holds) > 2  # the front's socket, ZooKeeper's, the workers' ipc...
    for pid in workers:
        assert Path(f"/proc/{pid}/cmdline").read_bytes() == supervisor_command  # a fork
        assert not shared_objects(pid) & supervisor_holds


def test_pylogd_tells_systemd_ready_watchdog_and_stopping(
    make_pylogd: Callable[..., RunningBroker], monkeypatch: pytest.MonkeyPatch
) -> None:
    with tempfile.TemporaryDirectory(dir="/tmp") as short:  # a unix socket path is <= 107 bytes
        path = str(Path(short) / "notify")
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as notify:
            notify.bind(path)
            notify.settimeout(10)
            monkeypatch.setenv("NOTIFY_SOCKET", path)
            monkeypatch.setenv("WATCHDOG_USEC", "200000")
            broker = make_pylogd()

            def next_states(until: str) -> list[str]:
                states: list[str] = []
                while not any(line.startswith(until) for line in states):
                    states += notify.recv(4096).decode().splitlines()
                return states

            assert "READY=1" in next_states("READY=")
            assert "WATCHDOG=1" in next_states("WATCHDOG=")
            assert broker.stop() == 0
            assert "STOPPING=1" in next_states("STOPPING=")


def test_pylogd_runs_its_private_zookeeper_and_survives_its_crash(
    make_pylogd: Callable[..., RunningBroker],
) -> None:
    broker = make_pylogd(zookeeper="")
    zookeeper = broker.zookeeper_pid()
    assert zookeeper is not None
    client = RawClient(broker.endpoint)
    client.create("private", 1)
    data = message_set(0, 3)
    client.produce("private", 0, data, Ack.FLUSHED)
    os.kill(zookeeper, signal.SIGKILL)
    # the broker keeps serving its partitions while ZooKeeper is down
    client.produce("private", 0, data, Ack.FLUSHED)
    assert client.read_all("private", 0) == data + data
    # it restarts ZooKeeper, and topic admin works again once the registry is back
    wait_until(lambda: broker.zookeeper_pid() not in (None, zookeeper), 30, "a new ZooKeeper")

    def created() -> bool:
        try:
            client.create("after-crash", 1)
        except BrokerError as error:
            assert error.name == "REGISTRY_UNAVAILABLE", error
            return False
        return True

    wait_until(created, 30, "topic creation to work again")
    client.close()
    restarted = broker.zookeeper_pid()
    assert restarted is not None
    assert broker.stop() == 0
    assert not running(restarted)  # stopped before pylogd exited


def test_a_broker_bound_to_a_host_name_starts_and_serves(
    make_pylogd: Callable[..., RunningBroker], tmp_path: Path
) -> None:
    """broker.host may be a name: what reaches the broker's own front (its retention guard)
    takes it as it is."""
    broker = make_pylogd(*single_box_flags(tmp_path), "--broker-host", "localhost")
    assert broker.endpoint.startswith("tcp://localhost:")
    with Admin(broker.endpoint) as admin:
        admin.create_topic("named", 1)
        assert admin.list_topics() == ["named"]


def test_a_broker_whose_zookeeper_is_gone_stops_in_a_second_or_two(
    make_pylogd: Callable[..., RunningBroker], tmp_path: Path
) -> None:
    """SIGTERM with ZooKeeper gone (issue 53, item 9): the registry calls of the shutdown do
    not wait for a connection that will not come (they waited 5 s each: 10 s in all)."""
    with PrivateZooKeeper(tmp_path / "zk", tick_time_ms=100) as zookeeper:
        zookeeper.start()
        broker = make_pylogd(zookeeper=zookeeper.connect_string)
        zookeeper.stop()
        wait_until(
            lambda: "lost its ZooKeeper connection" in broker.log_path.read_text(),
            30,
            "the broker to lose its ZooKeeper connection",
        )
        started = time.monotonic()
        assert broker.stop(timeout=60) == 0
        assert time.monotonic() - started < 4.5, broker.log_tail()


def test_zookeeper_outage_keeps_partitions_served_and_the_broker_registers_again(
    make_pylogd: Callable[..., RunningBroker],
    tmp_path: Path,
    registry_chroot: str,
) -> None:
    with PrivateZooKeeper(tmp_path / "zk", tick_time_ms=100) as zookeeper:
        zookeeper.start()
        broker = make_pylogd(zookeeper=zookeeper.connect_string)
        client = RawClient(broker.endpoint)
        client.create("steady", 1)
        data = message_set(0, 2)
        zookeeper.stop()
        client.produce("steady", 0, data, Ack.FLUSHED)
        assert client.read_all("steady", 0) == data
        started = time.monotonic()
        assert error_of(lambda: client.create("blocked", 1)) == "REGISTRY_UNAVAILABLE"
        # refused once the wait for the connection (half the session timeout: 1 s) is over
        assert time.monotonic() - started < 5
        zookeeper.start()
        with Registry(zookeeper.connect_string, registry_chroot) as registry:
            wait_until(lambda: 0 in registry.brokers.read(), 30, "the broker to register again")
            wait_until(
                lambda: registry.topics.topic_brokers("steady") == {0: (0,)}, 30, "its topic"
            )
        client.produce("steady", 0, data, Ack.FLUSHED)
        assert client.read_all("steady", 0) == data + data
        client.close()
        assert broker.stop() == 0


@contextlib.contextmanager
def creation_waiting_for_zookeeper(
    broker: RunningBroker, proxy: FreezableProxy
) -> Iterator[list[str]]:
    """`broker`'s ZooKeeper connection (through `proxy`) frozen until the broker has lost it,
    then a CREATE_TOPIC of 'blip' sent from a thread: yields its outcome's list (empty, then
    the error code's name, an error's text, or "created") once the creation waits for
    ZooKeeper; at the block's end the proxy thaws and the thread is waited for."""
    proxy.freeze()
    wait_until(
        lambda: "lost its ZooKeeper connection" in broker.log_path.read_text(),
        10,
        "the broker to lose its ZooKeeper connection",
    )
    outcomes: list[str] = []

    def create() -> None:
        with contextlib.closing(RawClient(broker.endpoint, timeout_s=60)) as client:
            try:
                client.create("blip", 1)
            except BrokerError as error:
                outcomes.append(error.name)
            except Unavailable as error:
                outcomes.append(str(error))
            else:
                outcomes.append("created")

    creating = threading.Thread(target=create)
    creating.start()
    try:
        wait_until(
            lambda: outcomes or "create topic 'blip' waits" in broker.log_path.read_text(),
            10,
            "the creation to wait for ZooKeeper",
        )
        yield outcomes
    finally:
        proxy.thaw()
        creating.join(60)


def test_a_topic_request_waits_for_a_dropped_zookeeper_connection_to_come_back(
    make_pylogd: Callable[..., RunningBroker], zookeeper: PrivateZooKeeper
) -> None:
    """A connection to ZooKeeper that drops and comes back at once (a paused server, a busy
    machine: kazoo gives up on a ping after 2/3 of the session timeout) is no outage: the
    requests that came meanwhile wait for it instead of being refused at once."""
    proxy = FreezableProxy(("127.0.0.1", zookeeper.port))
    try:
        broker = make_pylogd(zookeeper=f"127.0.0.1:{proxy.port}")
        with creation_waiting_for_zookeeper(broker, proxy) as outcomes:
            pass  # ZooKeeper comes back as the block ends
        assert outcomes == ["created"]
        assert broker.stop() == 0  # while ZooKeeper is reachable: it leaves the registry
    finally:
        proxy.close()


def test_a_request_waiting_for_zookeeper_is_told_the_broker_shuts_down(
    make_pylogd: Callable[..., RunningBroker], zookeeper: PrivateZooKeeper
) -> None:
    """A request that waits for ZooKeeper when the broker stops is answered
    BROKER_SHUTTING_DOWN, not left to its client's timeout (issue 53, item 4); the requests
    answered before are not answered again."""
    proxy = FreezableProxy(("127.0.0.1", zookeeper.port))
    try:
        broker = make_pylogd(zookeeper=f"127.0.0.1:{proxy.port}")
        answered = Connection(broker.endpoint)
        for name in ("made", "bad name!"):
            answered.send_pipelined(protocol.CreateTopicRequest(name, 1, {}))
        answered.send_pipelined(protocol.DescribeGroupRequest("bad group!"))  # refused at once
        said = []
        for _ in range(3):
            frames = answered.receive_pipelined(30)[1]
            try:
                protocol.decode_reply(Api.CREATE_TOPIC, frames, 1)
                said.append("created")
            except BrokerError as error:
                said.append(error.name)
        assert sorted(said) == ["INVALID_GROUP", "INVALID_TOPIC", "created"]
        with creation_waiting_for_zookeeper(broker, proxy) as outcomes:
            assert broker.process is not None
            broker.process.send_signal(signal.SIGTERM)
            wait_until(lambda: outcomes, 30, "the creation's answer")
        assert outcomes == ["BROKER_SHUTTING_DOWN"]
        assert broker.stop() == 0
        with pytest.raises(Unavailable):  # no second reply to either request answered before
            answered.receive_pipelined(1)
        answered.close()
    finally:
        proxy.close()


# -- processes: nothing outlives pylogd, a port in use is one clear error --------------------


TEST_PROCESS = """
import sys, time
from pathlib import Path
from tests.pylogd import RunningBroker
broker = RunningBroker(Path(sys.argv[1]), sys.argv[2], sys.argv[3]).start()
print(broker.pid, flush=True)
time.sleep(120)
"""


def test_a_test_process_killed_leaves_no_broker_running(
    zookeeper: PrivateZooKeeper, registry_chroot: str, tmp_path: Path
) -> None:
    """A test's process killed (pytest interrupted past its teardown, a worker killed) takes
    its brokers with it (issue 53, item 9: two brokers outlived an interrupted run)."""
    arguments = [str(tmp_path / "broker"), zookeeper.connect_string, registry_chroot]
    test = subprocess.Popen(
        [sys.executable, "-c", TEST_PROCESS, *arguments],
        cwd=Path(__file__).parents[2],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert test.stdout is not None
        pid = int(PipeLines(test.stdout).next_line(time.monotonic() + 60) or "0")
        assert pid and running(pid)
        test.kill()
        test.wait(10)
        wait_until(lambda: not running(pid), 30, "the broker to go with its test's process")
    finally:
        test.kill()
        test.wait(10)
        kill_left_behind(tmp_path)


def held_port(port: int = 0) -> socket.socket:
    """A TCP socket listening on `port` of 127.0.0.1 (0: a free one), SO_REUSEADDR as servers
    set it (so it binds beside the TIME_WAIT connections a killed server leaves)."""
    holder = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    holder.bind(("127.0.0.1", port))
    holder.listen()
    return holder


def zookeeper_launches(data_dir: Path) -> int:
    """How many times a ZooKeeper JVM was launched under `data_dir`/zookeeper."""
    log = data_dir / "zookeeper" / "zookeeper.log"
    return log.read_text(errors="replace").count("=== pylog: starting") if log.exists() else 0


def kill_left_behind(root: Path, spare: int | None = None) -> None:
    """SIGKILL any process but `spare` whose command line names `root` (what a failed test
    leaves)."""
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if str(root).encode() in cmdline.read_bytes() and cmdline.parent.name != str(spare):
                os.kill(int(cmdline.parent.name), signal.SIGKILL)
        except (FileNotFoundError, ProcessLookupError):
            continue


def start_failure(
    broker: RunningBroker, timeout: float = 30.0, spare: int | None = None
) -> tuple[int, str, float]:
    """Run `broker`'s pylogd expecting it not to start: its exit code, its stderr and how long
    it ran. The test fails if it still runs after `timeout` s. Then no process but `spare` is
    left running from its data dir."""
    started = time.monotonic()
    try:
        result = subprocess.run(broker.command, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        pytest.fail(f"pylogd still running after {timeout} s instead of exiting")
    finally:
        kill_left_behind(broker.data_dir, spare)
    return result.returncode, result.stderr, time.monotonic() - started


def test_private_zookeeper_exits_when_the_supervisor_is_killed(
    make_pylogd: Callable[..., RunningBroker],
) -> None:
    broker = make_pylogd(zookeeper="")
    zookeeper = broker.zookeeper_pid()
    assert zookeeper is not None
    os.kill(broker.pid, signal.SIGKILL)
    assert broker.process is not None
    broker.process.wait()
    try:
        wait_until(lambda: not running(zookeeper), 30, "the orphaned ZooKeeper to exit")
    finally:
        kill_left_behind(broker.data_dir)


@pytest.mark.broker
def test_front_port_in_use_stops_pylogd_at_once_naming_its_holder(tmp_path: Path) -> None:
    with held_port() as holder:
        port = holder.getsockname()[1]
        broker = RunningBroker(tmp_path / "b", "", "/pylog", "--broker-port", str(port))
        code, stderr, seconds = start_failure(broker)
    assert code == 1
    last = stderr.splitlines()[-1]
    assert last.startswith(f"pylogd: cannot start: cannot listen on 127.0.0.1:{port}: "), stderr
    assert f"port {port} is already in use by pid {os.getpid()} " in last
    assert zookeeper_launches(broker.data_dir) == 0  # checked before the JVM is started
    assert seconds < 10


@pytest.mark.broker
def test_zookeeper_port_in_use_stops_pylogd_at_once_naming_its_holder(tmp_path: Path) -> None:
    with held_port() as holder:
        port = holder.getsockname()[1]
        broker = RunningBroker(tmp_path / "b", "", "/pylog", "--zookeeper-port", str(port))
        code, stderr, seconds = start_failure(broker)
    assert code == 1
    last = stderr.splitlines()[-1]  # one line, no JVM log after it
    listen = f"pylogd: the private ZooKeeper cannot listen on 127.0.0.1:{port}: port {port} "
    assert last.startswith(f"{listen}is already in use by pid {os.getpid()} ("), stderr
    assert zookeeper_launches(broker.data_dir) == 0
    assert seconds < 10


@pytest.mark.broker
def test_a_zookeeper_left_on_the_port_is_not_taken_for_pylogd_own(tmp_path: Path) -> None:
    """A JVM left behind by a killed pylogd answers on the port, from the same data dir: today
    it passed for the new one, which died on the port it held and was relaunched again and
    again (32 launches in 8 s)."""
    port = free_port()
    with PrivateZooKeeper(tmp_path / "b" / "zookeeper", port, tick_time_ms=100) as left:
        broker = RunningBroker(tmp_path / "b", "", "/pylog", "--zookeeper-port", str(port))
        code, stderr, seconds = start_failure(broker, 20, left.pid)
        assert code == 1
        last = stderr.splitlines()[-1]
        listen = f"pylogd: the private ZooKeeper cannot listen on 127.0.0.1:{port}: port {port} "
        assert last.startswith(f"{listen}is already in use by pid {left.pid} (java "), stderr
        assert zookeeper_launches(broker.data_dir) == 1  # the one left behind, no other
        assert seconds < 10
        assert "Zookeeper version" in left.command("srvr")  # left alone


@pytest.mark.slow  # ~17 s: the back-off's real waits between ZooKeeper restarts
def test_a_zookeeper_that_cannot_restart_is_retried_with_back_off_then_pylogd_stops(
    make_pylogd: Callable[..., RunningBroker],
) -> None:
    port = free_port()
    broker = make_pylogd("--zookeeper-port", str(port), zookeeper="")
    zookeeper = broker.zookeeper_pid()
    assert zookeeper is not None and broker.process is not None
    client = RawClient(broker.endpoint)
    client.create("kept", 1)
    data = message_set(0, 3)
    client.produce("kept", 0, data, Ack.WRITTEN)
    client.close()
    holders = []

    def take_port() -> bool:
        with contextlib.suppress(OSError):  # until the killed JVM's last thread has gone
            holders.append(held_port(port))
        return bool(holders)

    os.kill(broker.pid, signal.SIGSTOP)  # so the port is taken before it can restart
    try:
        os.kill(zookeeper, signal.SIGKILL)
        wait_until(take_port, 10, "the killed ZooKeeper's port to be free")
    finally:
        started = time.monotonic()
        os.kill(broker.pid, signal.SIGCONT)
    with holders[0]:
        try:
            code = broker.process.wait(40)
        except subprocess.TimeoutExpired:
            pytest.fail("pylogd kept relaunching its ZooKeeper instead of giving up")
        seconds = time.monotonic() - started
    log = broker.log_tail(100)
    assert code == 1, log
    assert zookeeper_launches(broker.data_dir) == 1  # the port was checked before each start
    assert (
        log.count(f"port {port} is already in use by pid {os.getpid()} ")
        == ZOOKEEPER_START_ATTEMPTS
    )
    assert seconds >= ZOOKEEPER_BACKOFF.waited(ZOOKEEPER_START_ATTEMPTS - 1)
    last = log.splitlines()[-1]
    assert last.startswith("pylogd: the private ZooKeeper could not be restarted"), log
    again = broker.restarted()  # it stopped cleanly: what it had written was flushed
    try:
        assert RawClient(again.endpoint).read_all("kept", 0) == data
    finally:
        again.stop()


@pytest.mark.broker
def test_ctrl_c_on_a_broker_with_its_private_zookeeper_leaves_nothing_to_warn_about(
    tmp_path: Path, registry_chroot: str
) -> None:
    """Ctrl-C reaches the whole process group: the private ZooKeeper, when it shared the group,
    died under pylogd while it shut down (kazoo's "Connection dropped" warnings), before
    pylogd left the registry, so the next start replaced the partitions' nodes of the old
    session, each with a warning. In a group of its own, it is stopped after pylogd has left."""
    first = RunningBroker(tmp_path / "b", "", registry_chroot).start(own_session=True)
    try:
        with Admin(first.endpoint) as admin:
            admin.create_topic("clicks", 2)
        with Producer(first.endpoint, "clicks") as producer:
            producer.send(b"one")
    finally:
        stopped = first.ctrl_c()
    assert stopped == 0
    second = first.restarted()
    try:
        with Admin(second.endpoint) as admin:
            assert admin.metadata(["clicks"]).topics[0].error_code == 0
    finally:
        assert second.stop() == 0
    log = first.log_path.read_text()  # both runs: the same data dir, the same log
    assert "SIGINT: shutting down" in log
    assert " WARNING " not in log, log
