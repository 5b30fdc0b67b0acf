"""Connection against a scripted ROUTER on loopback: lost replies, retries, unreachable brokers.

The fake broker answers each request as its script says (drop it, or reply with an error code,
or with a METADATA body), so timeouts and retries can be provoked on purpose."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest
import zmq

from broker.aio.connection import AsyncConnection
from broker.client import Admin, Cluster, Connection, Producer
from broker.client.framing import Retry
from broker.errors import BrokerError, ConnectionRefused, Unavailable
from broker.protocol import (
    CREATE_WAIT_S,
    CreateTopicRequest,
    EmptyReply,
    ErrorCode,
    FetchPart,
    MetadataReply,
    MetadataRequest,
    MultiFetchReply,
    MultiFetchRequest,
    decode_request,
    encode_error,
    encode_reply,
)
from tests.client.router import serving
from tests.conftest import FakeClock

DROP = "drop"
EMPTY_METADATA = MetadataReply((), ())


@dataclass
class ScriptedBroker:
    """A ROUTER that answers the n-th request with script[n]: DROP (no reply), an ErrorCode,
    or success with an empty body (METADATA's, a CREATE_TOPIC's, a MULTI_FETCH's of no parts),
    `hold_s` after it came.
    Records each request's correlation id."""

    script: list[str | ErrorCode]
    endpoint: str = ""
    correlation_ids: list[int] = field(default_factory=list)
    hold_s: float = 0.0

    def serve(self, socket: zmq.Socket[bytes], stop: threading.Event) -> None:
        while not stop.is_set():
            if not socket.poll(20):
                continue
            identity, empty, *frames = socket.recv_multipart()
            header, request = decode_request(frames)
            self.correlation_ids.append(header.correlation_id)
            step = self.script[len(self.correlation_ids) - 1]
            if step == DROP or stop.wait(self.hold_s):
                continue
            if isinstance(step, ErrorCode):
                reply = encode_error(header.correlation_id, step, "scripted")
            elif isinstance(request, CreateTopicRequest):
                reply = encode_reply(header.correlation_id, EmptyReply())
            elif isinstance(request, MultiFetchRequest):  # nothing came within its wait
                reply = encode_reply(header.correlation_id, MultiFetchReply(()))
            else:
                reply = encode_reply(header.correlation_id, EMPTY_METADATA)
            socket.send_multipart([identity, empty, *reply])


@pytest.fixture
def scripted() -> Iterator[ScriptedBroker]:
    with serving(ScriptedBroker([])) as broker:
        yield broker


def test_lost_reply_raises_unavailable_and_the_next_request_gets_a_fresh_socket(
    scripted: ScriptedBroker,
) -> None:
    scripted.script += [DROP, "ok"]
    with Connection(scripted.endpoint, timeout_s=0.2) as connection:
        started = time.monotonic()
        with pytest.raises(
            Unavailable, match=r"no reply from tcp://127\.0\.0\.1:\d+ within 0\.2 s"
        ):
            connection.request(MetadataRequest())
        assert time.monotonic() - started < 2
        # A REQ socket that lost its reply could not send again: this works only if the
        # connection replaced it.
        assert connection.request(MetadataRequest()) == EMPTY_METADATA
    assert scripted.correlation_ids == [1, 2]


def test_call_retries_timeouts_and_retriable_errors_but_not_other_errors(
    scripted: ScriptedBroker,
) -> None:
    scripted.script += [DROP, ErrorCode.PARTITION_UNAVAILABLE, "ok", ErrorCode.INVALID_TOPIC]
    with Connection(scripted.endpoint, timeout_s=0.2) as connection:
        assert connection.call(MetadataRequest(), retries=2) == EMPTY_METADATA
        with pytest.raises(BrokerError) as raised:
            connection.call(MetadataRequest(), retries=5)
    assert raised.value.name == "INVALID_TOPIC" and not raised.value.retriable
    assert scripted.correlation_ids == [1, 2, 3, 4]


def test_retries_stop_at_their_count(scripted: ScriptedBroker) -> None:
    scripted.script += [ErrorCode.BROKER_SHUTTING_DOWN] * 3 + ["ok"]
    with (
        Connection(scripted.endpoint, timeout_s=1) as connection,
        pytest.raises(BrokerError) as raised,
    ):
        connection.call(MetadataRequest(), retries=1)
    assert raised.value.name == "BROKER_SHUTTING_DOWN"
    assert len(scripted.correlation_ids) == 2


def test_unreachable_broker_times_out_quickly() -> None:
    with Connection(unused_endpoint(), timeout_s=0.3) as connection:
        started = time.monotonic()
        with pytest.raises(Unavailable):
            connection.call(MetadataRequest(), retries=1)
        assert time.monotonic() - started < 3


def test_a_refused_connection_is_told_at_once_not_after_the_timeout() -> None:
    """Nothing listens at the address (the broker is down): the kernel refuses the connection,
    ZeroMQ's monitor says so, and the request ends at once saying why."""
    with Connection(unused_endpoint(), timeout_s=30) as connection:
        started = time.monotonic()
        with pytest.raises(Unavailable, match=r"refused.*nothing listens at tcp://127\.0\.0\.1:9"):
            connection.request(MetadataRequest())
        assert time.monotonic() - started < 5


def test_a_refused_connection_ends_an_asyncio_request_at_once() -> None:
    async def ask() -> None:
        connection = AsyncConnection(unused_endpoint(), timeout_s=30)
        try:
            with pytest.raises(Unavailable, match=r"refused.*nothing listens at"):
                await connection.request(MetadataRequest())
        finally:
            await connection.close()

    started = time.monotonic()
    asyncio.run(ask())
    assert time.monotonic() - started < 5


def test_a_down_broker_first_in_the_bootstrap_list_costs_no_timeout(
    scripted: ScriptedBroker,
) -> None:
    scripted.script += ["ok", "ok"]
    bootstrap = f"{unused_endpoint()},{scripted.endpoint}"
    with Cluster(bootstrap, timeout_s=30) as cluster:
        started = time.monotonic()
        assert cluster.metadata([]) == EMPTY_METADATA
        assert time.monotonic() - started < 5
    with Admin(bootstrap, timeout_s=30) as admin:
        started = time.monotonic()
        assert admin.list_topics() == []
        assert time.monotonic() - started < 5


def test_a_connection_raises_a_refusal_at_once_and_a_leaders_call_waits_it_out() -> None:
    """One endpoint that refuses has nothing to wait for: `call` raises at once, whatever its
    retries (a cluster asks its other brokers). A partition's leader that died refuses until
    the controller names another: a leader's call (Retry with refusals_within_time) tries
    again within its time, not counting the refusals."""
    with Connection(unused_endpoint(), timeout_s=30) as connection:
        started = time.monotonic()
        with pytest.raises(ConnectionRefused):
            connection.call(MetadataRequest(), retries=5)
        assert time.monotonic() - started < 5
    refused = ConnectionRefused(unused_endpoint())
    counted = Retry(1, 60, FakeClock())
    counted.wait_after(refused)
    with pytest.raises(ConnectionRefused):
        counted.wait_after(refused)
    waited_out = Retry(1, 60, FakeClock(), refusals_within_time=True)
    for _ in range(10):
        waited_out.wait_after(refused)
    waited_out.wait_after(Unavailable("no reply"))  # the one retry counted
    with pytest.raises(Unavailable, match="no reply"):
        waited_out.wait_after(Unavailable("no reply"))
    late = Retry(1, 0, FakeClock(), refusals_within_time=True)
    with pytest.raises(ConnectionRefused):
        late.wait_after(refused)  # past its time


def test_an_address_without_tcp_is_taken_and_a_bad_one_is_refused_at_once(
    scripted: ScriptedBroker,
) -> None:
    scripted.script += ["ok", "ok"]
    host_port = scripted.endpoint.removeprefix("tcp://")
    with Connection(host_port, timeout_s=1) as connection:
        assert connection.endpoint == scripted.endpoint
        assert connection.request(MetadataRequest()) == EMPTY_METADATA
    with Admin(f" {host_port} ,{unused_endpoint()}", timeout_s=1) as admin:
        assert admin.cluster.bootstrap[0] == scripted.endpoint
        assert admin.list_topics() == []
    for bad in (
        "localhost",
        "udp://127.0.0.1:9092",
        "tcp://127.0.0.1:0",
        "127.0.0.1:99999",
        "a b:1",
        "tcp://:9092",
        "127.0.0.1:9092/x",
    ):
        with pytest.raises(ValueError, match=r"use HOST:PORT or tcp://HOST:PORT"):
            Connection(bad)
        with pytest.raises(ValueError, match=r"use HOST:PORT or tcp://HOST:PORT"):
            Producer(f"{scripted.endpoint},{bad}", "topic")


def test_ctrl_c_while_waiting_for_a_pipelined_reply_is_one_keyboard_interrupt() -> None:
    """The user's Ctrl-C lands in the wait, not while handling the empty look before it: the
    traceback they see is the KeyboardInterrupt alone, not chained to a zmq.Again."""

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGALRM, interrupt)
    try:
        with (
            serving(ScriptedBroker([])) as silent,
            Connection(silent.endpoint, timeout_s=5) as connection,
        ):
            signal.setitimer(signal.ITIMER_REAL, 0.2)
            with pytest.raises(KeyboardInterrupt) as raised:
                connection.receive_pipelined(timeout_s=5)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    assert raised.value.__context__ is None


def test_metadata_asks_a_silent_broker_once_a_round_and_then_after_the_others(
    scripted: ScriptedBroker,
) -> None:
    """A broker that answers nothing (down) costs one timeout, not one per retry, and is asked
    last from then on."""
    scripted.script += ["ok"] * 3
    with (
        serving(ScriptedBroker([DROP] * 5)) as silent,
        Cluster(f"{silent.endpoint},{scripted.endpoint}", timeout_s=0.3, retries=3) as cluster,
    ):
        assert cluster.metadata([]) == EMPTY_METADATA
        assert len(silent.correlation_ids) == 1  # asked once, then the next broker
        assert cluster.metadata([]) == EMPTY_METADATA
        assert len(silent.correlation_ids) == 1  # the others first now
    assert len(scripted.correlation_ids) == 2


UNUSED_PORT = 9
"""A loopback port nobody listens on (discard): below the range the kernel hands out for port 0,
so no server of another test (another xdist worker's) takes it meanwhile. A random free port
did get taken so: a curve broker then counted this test's plaintext connection as refused."""


def unused_endpoint() -> str:
    """The address of a loopback port nobody listens on (UNUSED_PORT)."""
    return f"tcp://127.0.0.1:{UNUSED_PORT}"


LEFT_TO_THE_COLLECTOR = """
import gc, sys
from {module} import {cls}

client = {cls}("tcp://127.0.0.1:9")  # a broker that never answers: its socket stays open
{use}
cycle = [client]
cycle.append(cycle)  # as a traceback's frames hold an Admin whose call raised
del client, cycle
gc.collect()
print("collected")
"""


@pytest.mark.broker
@pytest.mark.parametrize(
    ("module", "cls", "use"),
    [
        ("broker.client.connection", "Connection", "client.send_pipelined(MetadataRequest())"),
        (
            "broker.client",
            "Cluster",
            "client.connect('tcp://127.0.0.1:9').send_pipelined(MetadataRequest())",
        ),
        (
            "broker.aio.connection",
            "AsyncConnection",
            "import asyncio\nasync def use(): client._dealer()\nasyncio.run(use())",
        ),
    ],
    ids=["Connection", "Cluster", "AsyncConnection"],
)
def test_a_client_left_to_the_garbage_collector_does_not_hang_the_program(
    module: str, cls: str, use: str
) -> None:
    # pyzmq's Context.__del__ terminates the context, and CPython clears its weak set of
    # sockets first when they are garbage together: it waited for ever for the socket it no
    # longer knew. The README's `Admin(...).create_topic(...)` under `except TopicAlreadyExists`
    # left such a cycle, and the program hung when the collector ran (seen under xdist).
    program = "from broker.protocol import MetadataRequest\n" + LEFT_TO_THE_COLLECTOR.format(
        module=module, cls=cls, use=use
    )
    ran = subprocess.run(
        [sys.executable, "-W", "ignore::ResourceWarning", "-c", program],
        capture_output=True,
        text=True,
        timeout=20,
    )
    assert ran.stdout == "collected\n" and ran.returncode == 0, ran.stderr


@pytest.mark.broker
def test_a_program_that_never_closes_its_client_exits() -> None:
    program = (
        "from broker.client import Admin\n"
        "from broker.protocol import MetadataRequest\n"
        "admin = Admin('tcp://127.0.0.1:9')\n"
        "admin.cluster.connect('tcp://127.0.0.1:9').send_pipelined(MetadataRequest())\n"
    )
    ran = subprocess.run(
        [sys.executable, "-W", "ignore::ResourceWarning", "-c", program],
        capture_output=True,
        text=True,
        timeout=20,
    )
    assert ran.returncode == 0, ran.stderr


def test_a_create_topic_is_waited_for_as_long_as_the_broker_may_hold_it() -> None:
    # The timeout (0.2 s) is for a broker that does not answer; a CREATE_TOPIC may be held up
    # to CREATE_WAIT_S on top of it, as a FETCH its max_wait_ms: pylogctl's 5 s timeout
    # called a broker creating 10,000 partitions unreachable.
    with (
        serving(ScriptedBroker(["ok"], hold_s=0.6)) as creator,
        Connection(creator.endpoint, timeout_s=0.2) as c,
    ):
        started = time.monotonic()
        assert c.request(CreateTopicRequest("big", 10_000, {})) == EmptyReply()
        assert time.monotonic() - started >= 0.6
    assert CREATE_WAIT_S >= 10


def test_a_multi_fetch_is_waited_for_as_long_as_its_long_poll() -> None:
    # As a FETCH: a broker holds a MULTI_FETCH up to its max_wait_ms, on top of the timeout.
    with (
        serving(ScriptedBroker(["ok"], hold_s=0.6)) as poller,
        Connection(poller.endpoint, timeout_s=0.2) as c,
    ):
        request = MultiFetchRequest(-1, 1000, 1, 1 << 20, (FetchPart("t", 0, 0, 1 << 20),))
        started = time.monotonic()
        assert c.request(request) == MultiFetchReply(())
        assert time.monotonic() - started >= 0.6
