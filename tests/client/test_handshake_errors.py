"""A client whose Curve handshake fails says so (issue 16): against a real pylogd in curve mode
(tests/curve.py), a client whose key is no principal's, or that holds another broker key than
the broker's, raises AuthenticationFailed, which nothing retries, as soon as its handshake
fails (it timed out as Unavailable, retried for delivery_timeout_s); so does a client without
keys; pylogctl shows it as one line. A right key still works; a plaintext connection keeps no
monitor socket once its handshake succeeded."""

from __future__ import annotations

import asyncio
import re
import time
from pathlib import Path

import pytest
import zmq
from click.testing import CliRunner

from broker.aio import AsyncProducer
from broker.aio.connection import AsyncConnection
from broker.client import Admin, Connection, PartitionConsumer, Producer
from broker.client.cluster import topic_info
from broker.client.group import GroupConsumer
from broker.client.handshakes import NO_KEYS, NOT_A_BROKER
from broker.client.transport import ZmqTransport
from broker.errors import AuthenticationFailed, AuthorizationFailed
from broker.protocol import MetadataRequest
from broker.security import ClientKeys, generate_keys, load_key_pair
from cli.pylogctl import cli
from tests.conftest import wait_until
from tests.curve import STRANGER, SUPER_USER, CurveBroker, curve_broker_fixture
from tests.pylogd import RunningBroker

curve_broker = curve_broker_fixture()

TIMEOUT_S = 3.0
"""Reply timeouts of the clients below that do not keep the default (10 s)."""


def refused(curve: CurveBroker) -> str:
    """What AuthenticationFailed says when the broker's ZAP handler refuses a key."""
    return re.escape(
        f"the broker at {curve.broker.endpoint} refused this client's key (ZAP 400: the key "
        "is no principal's: pylogctl principal add)"
    )


def wrong_broker_key(curve: CurveBroker, tmp_path: Path) -> ClientKeys:
    """admin's key pair with the public key of another broker."""
    keys = curve.keys(SUPER_USER)
    impostor, _ = load_key_pair(generate_keys(tmp_path / "other", "impostor")[1])
    return ClientKeys(keys.public, keys.secret, impostor)


def open_sockets(context: zmq.Context[zmq.Socket[bytes]]) -> int:
    return sum(not socket.closed for socket in context._sockets)


def test_a_producer_with_an_unknown_key_fails_at_once(curve_broker: CurveBroker) -> None:
    endpoint = curve_broker.broker.endpoint
    # The defaults: a 10 s reply timeout, retried for 30 s (delivery_timeout_s).
    with (
        Producer(endpoint, "any", keys=curve_broker.keys(STRANGER)) as producer,
        pytest.raises(AuthenticationFailed, match=refused(curve_broker)) as raised,
    ):
        producer.send(b"never")
    assert raised.value.endpoint == endpoint


def test_a_producer_holding_another_broker_key_fails_at_once(
    curve_broker: CurveBroker, tmp_path: Path
) -> None:
    endpoint = curve_broker.broker.endpoint
    wrong = wrong_broker_key(curve_broker, tmp_path)
    with (
        Producer(endpoint, "any", keys=wrong) as producer,
        pytest.raises(
            AuthenticationFailed,
            match=re.escape(f"the Curve handshake with {endpoint} failed: the broker broke it off")
            + r".*\(is the broker key the broker's public key\?\)",
        ),
    ):
        producer.send(b"never")


def test_a_partition_consumer_with_an_unknown_key_fails_at_once(
    curve_broker: CurveBroker,
) -> None:
    with pytest.raises(AuthenticationFailed, match=refused(curve_broker)):
        PartitionConsumer(
            curve_broker.broker.endpoint,
            "any",
            timeout_s=TIMEOUT_S,
            keys=curve_broker.keys(STRANGER),
        )


def test_a_group_member_with_an_unknown_key_fails_at_once(
    curve_broker: CurveBroker, topic: str
) -> None:
    """Refused by the coordinator's broker at its join: its first poll says so (its heartbeat
    thread died of it silently, and every poll returned nothing)."""
    with Admin(curve_broker.broker.endpoint, keys=curve_broker.keys(SUPER_USER)) as admin:
        admin.create_topic(topic)
    with (
        GroupConsumer(
            curve_broker.broker.endpoint,
            f"g-{topic[-8:]}",
            [topic],
            timeout_s=TIMEOUT_S,
            keys=curve_broker.keys(STRANGER),
        ) as member,
        pytest.raises(AuthenticationFailed, match=refused(curve_broker)),
    ):
        deadline = time.monotonic() + 3 * TIMEOUT_S
        while time.monotonic() < deadline:  # bounded: the join's answer, then the raise
            member.poll(100)


def test_an_asyncio_producer_with_an_unknown_key_fails_at_once(curve_broker: CurveBroker) -> None:
    async def send() -> None:
        keys = curve_broker.keys(STRANGER)
        async with AsyncProducer(
            curve_broker.broker.endpoint, "any", timeout_s=TIMEOUT_S, keys=keys
        ) as producer:
            await (await producer.send(b"never"))

    with pytest.raises(AuthenticationFailed, match=refused(curve_broker)):
        asyncio.run(send())


def test_an_asyncio_request_sent_after_the_refusal_is_told_too(curve_broker: CurveBroker) -> None:
    """Once a DEALER's handshake is refused, ZeroMQ drops its only pipe and a send on it waits
    for ever; the connection drops that socket, and a request caught sending is told why."""

    async def requests() -> None:
        keys = curve_broker.keys(STRANGER)
        connection = AsyncConnection(curve_broker.broker.endpoint, timeout_s=TIMEOUT_S, keys=keys)
        try:
            with pytest.raises(AuthenticationFailed, match=refused(curve_broker)):
                await connection.exchange(MetadataRequest())
            # A new socket, refused before the loop reads its monitor: nowhere to send to. In
            # most runs, not all: after a refusal ZeroMQ sometimes keeps the pipe, its engine
            # gone (zeromq/libzmq#3519; seen once in a loaded run): the request is told then
            # too, by the monitor's event alone.
            socket = connection._dealer()
            deadline = time.monotonic() + 10
            while int(socket.get(zmq.EVENTS)) & zmq.POLLOUT and time.monotonic() < deadline:
                time.sleep(0.01)  # the loop must not run meanwhile: it would read the monitor
            with pytest.raises(AuthenticationFailed, match=refused(curve_broker)):
                await connection.exchange(MetadataRequest())
        finally:
            await connection.close()

    asyncio.run(requests())


def test_pylogctl_says_the_key_was_refused_in_one_line(curve_broker: CurveBroker) -> None:
    key_dir = curve_broker.key_dir
    result = CliRunner().invoke(
        cli,
        ["topic", "list", "--timeout", str(TIMEOUT_S)],
        env={
            "PYLOG_BROKER": curve_broker.broker.endpoint,
            "PYLOG_KEY_FILE": str(key_dir / f"{STRANGER}.key_secret"),
            "PYLOG_BROKER_KEY": str(key_dir / "broker.key"),
        },
    )
    assert result.exit_code == 1
    assert re.fullmatch(f"pylogctl: AuthenticationFailed: {refused(curve_broker)}\n", result.stderr)


def test_a_connection_refused_once_gets_through_when_its_key_is_added(
    curve_broker: CurveBroker, tmp_path: Path
) -> None:
    """The refused socket is dropped: the next request makes a new handshake."""
    public, secret = generate_keys(tmp_path, "carol")
    keys = ClientKeys.load(secret, curve_broker.key_dir / "broker.key")
    with Connection(curve_broker.broker.endpoint, timeout_s=TIMEOUT_S, keys=keys) as connection:
        with pytest.raises(AuthenticationFailed, match=refused(curve_broker)):
            connection.request(MetadataRequest())
        curve_broker.pylogctl("principal", "add", "carol", str(public))

        def let_in() -> bool:
            try:
                connection.request(MetadataRequest())
            except AuthenticationFailed:
                return False
            return True

        wait_until(let_in, what="carol let in")


def test_batches_to_a_broker_that_refuses_their_socket_fail_with_their_handles(
    curve_broker: CurveBroker, tmp_path: Path, topic: str
) -> None:
    """The producer's METADATA got through; its key was removed before its first batch's
    socket (the pipelined one) made its handshake."""
    endpoint = curve_broker.broker.endpoint
    with Admin(endpoint, keys=curve_broker.keys(SUPER_USER)) as admin:
        admin.create_topic(topic)
    public, secret = generate_keys(tmp_path, "dave")
    keys = ClientKeys.load(secret, curve_broker.key_dir / "broker.key")
    curve_broker.pylogctl("principal", "add", "dave", str(public))
    curve_broker.pylogctl(
        "acl", "add", "--principal", "dave", "--topic", topic, "--operation", "produce"
    )

    def let_in(connection: Connection) -> bool:
        # Shut out: refused at the handshake, or, when the handshake came before the broker
        # applied the removal, answered AUTHORIZATION_FAILED (each request looks its key up).
        # Let in means the topic too: the broker learns the principal and its ACL one after
        # the other, and until the ACL arrives METADATA answers the topic AUTHORIZATION_FAILED.
        try:
            topic_info(connection.request(MetadataRequest((topic,))), topic)
        except (AuthenticationFailed, AuthorizationFailed):
            return False
        return True

    with Producer(endpoint, topic, timeout_s=TIMEOUT_S, keys=keys) as producer:
        wait_until(lambda: let_in(producer.cluster.connect(endpoint)), what="dave let in")
        assert producer.partitions == 1
        curve_broker.pylogctl("principal", "remove", "dave")
        with Connection(endpoint, timeout_s=TIMEOUT_S, keys=keys) as another:
            wait_until(lambda: not let_in(another), what="dave shut out")
        delivery = producer.send(b"late")
        with pytest.raises(AuthenticationFailed, match=refused(curve_broker)):
            producer.flush()
        assert isinstance(delivery.exception(0), AuthenticationFailed)


def test_a_curve_client_of_a_plaintext_broker_is_told_so(
    broker: RunningBroker, tmp_path: Path
) -> None:
    """ZeroMQ says the mechanisms differ, or the broker hangs up before the client reads that:
    either way the client is told."""
    public, secret = generate_keys(tmp_path, "client")
    keys = ClientKeys.load(secret, public)  # any key: the broker has none
    mismatch = re.escape(
        "the broker does not speak Curve (a plaintext broker: connect without keys)"
    )
    broken = r"the broker broke it off 3 times in a row \(.+\), as one .* or that serves plaintext"
    with (
        Connection(broker.endpoint, timeout_s=TIMEOUT_S, keys=keys) as connection,
        pytest.raises(
            AuthenticationFailed,
            match=re.escape(f"the Curve handshake with {broker.endpoint} failed: ")
            + f"({mismatch}|{broken})$",
        ),
    ):
        connection.request(MetadataRequest())


def no_keys(curve: CurveBroker) -> str:
    """What AuthenticationFailed says to a client without keys at a Curve broker: ZeroMQ says
    the mechanisms differ, or the broker hangs up before the client reads that (which a server
    that is not a broker does too, so that is said as well)."""
    told, broken = NO_KEYS.format(endpoint=curve.broker.endpoint, how="@").split("@")
    how = r" \(it broke off the handshake 3 times in a row \(.+\)\)"
    hung_up = how + re.escape(broken + NOT_A_BROKER)
    return re.escape(told) + f"({hung_up}|{re.escape(broken)})"


def test_clients_without_keys_at_a_curve_broker_are_told_to_give_keys_at_once(
    curve_broker: CurveBroker,
) -> None:
    """ZeroMQ tells a plaintext client at once that the mechanisms differ (issue 32: it waited
    for its reply timeout and was told the broker was unreachable): every client raises
    AuthenticationFailed, not Unavailable after the default 10 s, and pylogctl says it in one
    line."""
    endpoint = curve_broker.broker.endpoint
    with (
        Connection(endpoint) as connection,
        pytest.raises(AuthenticationFailed, match=no_keys(curve_broker)),
    ):
        connection.request(MetadataRequest())
    with (
        Producer(endpoint, "any") as producer,
        pytest.raises(AuthenticationFailed, match=no_keys(curve_broker)),
    ):
        producer.send(b"never")  # its METADATA, for the partition, is refused

    async def exchange() -> None:
        connection = AsyncConnection(endpoint)
        try:
            await connection.exchange(MetadataRequest())
        finally:
            await connection.close()

    with pytest.raises(AuthenticationFailed, match=no_keys(curve_broker)):
        asyncio.run(exchange())
    result = CliRunner().invoke(cli, ["topic", "list"], env={"PYLOG_BROKER": endpoint})
    assert result.exit_code == 1
    assert re.fullmatch(f"pylogctl: AuthenticationFailed: {no_keys(curve_broker)}\n", result.stderr)


def test_a_right_key_gets_through_with_a_monitor_closed_with_its_socket(
    curve_broker: CurveBroker,
) -> None:
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    keys = curve_broker.keys(SUPER_USER)
    transport = ZmqTransport(context)
    try:
        with Connection(curve_broker.broker.endpoint, transport=transport, keys=keys) as connection:
            assert connection.request(MetadataRequest()).brokers
            assert open_sockets(context) == 2  # the REQ socket and its monitor
        assert open_sockets(context) == 0
    finally:
        context.destroy(linger=0)  # after a failed assertion, what was left open


def test_a_plaintext_connection_has_no_monitor_once_its_handshake_succeeded(
    broker: RunningBroker,
) -> None:
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    try:
        with Connection(broker.endpoint, transport=ZmqTransport(context)) as connection:
            assert connection.request(MetadataRequest()).brokers
            assert open_sockets(context) == 1  # the REQ socket alone
            correlation_id = connection.send_pipelined(MetadataRequest())
            assert connection.receive_pipelined(10)[0] == correlation_id
            assert open_sockets(context) == 2  # and the DEALER, its monitor gone too
    finally:
        context.destroy(linger=0)
