"""A Curve broker from outside, as a client in any language meets it: a ZeroMQ DEALER with the
Curve socket options and the protocol's frames (docs/protocol.md, "Security"), real pylogd,
real ZooKeeper. Principals and ACLs are changed the way an operator does, with pylogctl."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import zmq
from click.testing import CliRunner

from broker import protocol
from broker.client import Admin, Producer
from broker.client.connection import Connection
from broker.errors import BrokerError, RegistryAccessDenied
from broker.log.message import encode_message
from broker.protocol import (
    Ack,
    AlterConfigRequest,
    CreatePartitionsRequest,
    CreateTopicRequest,
    DeleteTopicRequest,
    DescribeClusterRequest,
    DescribeConfigRequest,
    DescribePartitionRequest,
    ErrorCode,
    FetchRequest,
    MetadataRequest,
    MultiProduceRequest,
    OffsetsRequest,
    ProducePart,
    ProduceRequest,
    Request,
    RequestHeader,
)
from broker.registry import Registry
from broker.security import (
    Acl,
    ClientKeys,
    Operation,
    ZooKeeperAuth,
    generate_keys,
    load_public_key,
)
from broker.zookeeper import PrivateZooKeeper
from cli.pylogctl import cli
from cli.pylogd import EXIT_CANNOT_START
from tests.conftest import single_box_flags, wait_until
from tests.curve import NO_REPLY_MS, CurveBroker, curve_broker_fixture
from tests.dashboard import CURVE_ONLY, queried_metrics
from tests.pylogd import RunningBroker

secured = curve_broker_fixture("secured")
"""A Curve broker; principals admin (a super user) and alice (no ACL yet) are known, mallory
has keys but is no principal."""


@pytest.fixture
def topic(secured: CurveBroker, request: pytest.FixtureRequest) -> str:
    """A topic of this test's own, created by the super user."""
    name = f"sec.{request.node.name[5:40]}"
    assert secured.call("admin", CreateTopicRequest(name, 1, {})) == protocol.EmptyReply()
    return name


def one_message() -> bytes:
    return encode_message(b"hello")


def routed_requests(topic: str) -> dict[str, Request]:
    return {
        "produce": ProduceRequest(topic, 0, Ack.WRITTEN, one_message()),
        "fetch": FetchRequest(topic, 0, 0, 1 << 16, 0, 0),
        "offsets": OffsetsRequest(topic, 0, protocol.LATEST),
        "describe-partition": DescribePartitionRequest(topic, 0),
    }


def operator_requests(topic: str) -> dict[str, Request]:
    return {
        "describe-config": DescribeConfigRequest(topic),
        "alter-config": AlterConfigRequest(topic, {"retention_ms": "60000"}),
        "add-partitions": CreatePartitionsRequest(topic, 2),  # 1 to 2
        "delete": DeleteTopicRequest(topic),
        "create": CreateTopicRequest(topic + ".new", 1, {}),
    }


NEEDS = {
    "produce": "produce",
    "fetch": "fetch",
    "offsets": "describe",
    "describe-partition": "describe",
    "describe-config": "describe",
    "alter-config": "alter",
    "add-partitions": "alter",
    "delete": "delete",
    "create": "create",
}


def test_an_unknown_key_can_neither_produce_fetch_nor_read_metadata(
    secured: CurveBroker, topic: str
) -> None:
    before = secured.broker.metrics().get(("pylog_connections_refused_total", ()), 0.0)
    requests = routed_requests(topic)
    for request in (MetadataRequest(()), requests["produce"], requests["fetch"]):
        assert secured.call("mallory", request) is None, request
    assert secured.broker.metrics()[("pylog_connections_refused_total", ())] >= before + 3
    assert "unknown client key" in secured.broker.log_path.read_text()


def test_a_plaintext_client_or_a_wrong_broker_key_gets_no_reply_and_is_counted(
    secured: CurveBroker, tmp_path: Path
) -> None:
    def failed(reason: str | None = None) -> float:
        """Failed handshakes counted, for one reason or all of them."""
        labels = {} if reason is None else {"reason": reason}
        return secured.counted("pylog_handshakes_failed_total", **labels)

    before, wrong_key = failed(), failed("wrong_broker_key")
    assert secured.call(None, MetadataRequest(())) is None
    # Each of ZeroMQ's tries (every 100 ms) fails: a mechanism mismatch (not_curve), or a
    # broken pipe (other) when the client hangs up first; which one is a race.
    wait_until(lambda: failed() > before, timeout=5)
    other_broker, _ = generate_keys(tmp_path, "other-broker")
    socket: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.DEALER)
    socket.setsockopt(zmq.LINGER, 0)
    keys = ClientKeys.load(secured.key_dir / "alice.key_secret", other_broker)
    keys.apply(socket)
    socket.connect(secured.broker.endpoint)
    try:
        header = RequestHeader(protocol.Api.DESCRIBE_CLUSTER, protocol.API_VERSION, 1, "t")
        socket.send_multipart(protocol.encode_request(header, DescribeClusterRequest()))
        assert not socket.poll(NO_REPLY_MS)
    finally:
        socket.close()
    wait_until(lambda: failed("wrong_broker_key") > wrong_key, timeout=5)
    assert "the client holds another broker key?" in secured.broker.log_path.read_text()


def test_the_dashboards_security_panels_query_what_a_curve_broker_serves(
    secured: CurveBroker,
) -> None:
    served = {name for name, _ in secured.broker.metrics()}
    assert queried_metrics() >= CURVE_ONLY and served >= CURVE_ONLY, CURVE_ONLY - served


def test_a_principal_without_acls_is_refused_each_operation(
    secured: CurveBroker, topic: str
) -> None:
    for name, request in {**routed_requests(topic), **operator_requests(topic)}.items():
        reply = secured.call("alice", request)
        assert isinstance(reply, BrokerError), (name, reply)
        assert reply.name == "AUTHORIZATION_FAILED", (name, reply)
        assert reply.operation == NEEDS[name], name  # type: ignore[attr-defined]
        assert reply.resource.startswith(topic), name  # type: ignore[attr-defined]
    asked = secured.call("alice", MetadataRequest((topic,)))
    assert isinstance(asked, protocol.MetadataReply)
    assert [(t.topic, t.error_code) for t in asked.topics] == [
        (topic, ErrorCode.AUTHORIZATION_FAILED)
    ]
    listed = secured.call("alice", MetadataRequest(()))
    assert isinstance(listed, protocol.MetadataReply)
    assert topic not in [t.topic for t in listed.topics]  # left out of a listing
    # The one api with no topic: which ZooKeeper, which brokers; any principal may ask.
    assert isinstance(
        secured.call("alice", DescribeClusterRequest()), protocol.DescribeClusterReply
    )


def test_the_clients_say_not_authorized_not_does_not_exist_for_a_topic_refused(
    secured: CurveBroker, topic: str
) -> None:
    """Topic names are no secret from principals (docs/security.md): a client refused a topic
    that exists is told it is not authorized (issue 32: it was told the topic did not
    exist); pylogctl says so in its one line."""
    keys = secured.keys("alice")
    endpoint = secured.broker.endpoint
    with Producer(endpoint, topic, keys=keys) as producer, pytest.raises(BrokerError) as refused:
        producer.send(b"never")
    assert refused.value.name == "AUTHORIZATION_FAILED"
    assert f"topic {topic!r}: this client's principal is not authorized to see it" in str(
        refused.value
    )
    with Admin(endpoint, keys=keys) as admin, pytest.raises(BrokerError) as described:
        admin.topic(topic)
    assert "not authorized to see it" in str(described.value)
    key_options = ["--key-file", str(secured.key_dir / "alice.key_secret")]
    key_options += ["--broker-key", str(secured.key_dir / "broker.key")]
    shown = CliRunner().invoke(cli, ["consume", topic, "-b", endpoint, *key_options])
    assert shown.exit_code == 1 and "not authorized to see it" in shown.stderr, shown.output


def test_an_acl_grants_its_operations_and_its_removal_applies_within_a_second(
    secured: CurveBroker, topic: str
) -> None:
    secured.pylogctl(
        "acl", "add", "--principal", "alice", "--topic", topic, "--operation", "produce"
    )
    produce = routed_requests(topic)["produce"]
    wait_until(
        lambda: isinstance(secured.call("alice", produce), protocol.ProduceReply),
        timeout=5,
        what="the ACL to apply",
    )
    fetched = secured.call("alice", routed_requests(topic)["fetch"])
    assert isinstance(fetched, BrokerError) and fetched.name == "AUTHORIZATION_FAILED"
    # produce implies describe: METADATA, OFFSETS and DESCRIBE_PARTITION are allowed
    for name in ("offsets", "describe-partition"):
        assert not isinstance(secured.call("alice", routed_requests(topic)[name]), Exception)
    asked = secured.call("alice", MetadataRequest((topic,)))
    assert isinstance(asked, protocol.MetadataReply)
    assert asked.topics[0].error_code == ErrorCode.NONE

    secured.pylogctl("acl", "remove", "--principal", "alice", "--topic", topic)
    removed_at = time.monotonic()
    wait_until(
        lambda: isinstance(secured.call("alice", produce), BrokerError),
        timeout=1.0,
        what="the ACL's removal to apply within a second",
    )
    assert time.monotonic() - removed_at < 1.0


def test_a_prefix_acl_covers_the_topics_it_names_only(secured: CurveBroker, topic: str) -> None:
    other = secured.call("admin", CreateTopicRequest("other." + topic, 1, {}))
    assert other == protocol.EmptyReply()
    prefix = topic.rsplit("_", 1)[0] + "*"
    secured.pylogctl(
        "acl", "add", "--principal", "alice", "--topic", prefix, "--operation", "fetch"
    )
    fetch = routed_requests(topic)["fetch"]
    wait_until(lambda: isinstance(secured.call("alice", fetch), protocol.FetchReply), timeout=5)
    elsewhere = secured.call("alice", routed_requests("other." + topic)["fetch"])
    assert isinstance(elsewhere, BrokerError) and elsewhere.name == "AUTHORIZATION_FAILED"
    secured.pylogctl("acl", "remove", "--principal", "alice", "--topic", prefix)


def test_a_multi_produce_is_authorized_part_by_part(secured: CurveBroker, topic: str) -> None:
    # alice may produce to `topic` but not to `other`: her MULTI_PRODUCE to both is stored
    # where she may, and the part she may not is answered AUTHORIZATION_FAILED alone.
    other = "other." + topic
    assert secured.call("admin", CreateTopicRequest(other, 1, {})) == protocol.EmptyReply()
    secured.pylogctl(
        "acl", "add", "--principal", "alice", "--topic", topic, "--operation", "produce"
    )
    produce = routed_requests(topic)["produce"]
    wait_until(lambda: isinstance(secured.call("alice", produce), protocol.ProduceReply), 5)
    parts = (ProducePart(topic, 0, one_message()), ProducePart(other, 0, one_message()))
    reply = secured.call("alice", MultiProduceRequest(Ack.FLUSHED, parts))
    assert isinstance(reply, protocol.MultiProduceReply), reply
    assert isinstance(protocol.decode_part_reply(reply.parts[0]), protocol.ProduceReply)
    with pytest.raises(BrokerError) as raised:
        protocol.decode_part_reply(reply.parts[1])
    assert raised.value.name == "AUTHORIZATION_FAILED"
    assert (getattr(raised.value, "operation", None), getattr(raised.value, "resource", None)) == (
        "produce",
        other,
    )
    secured.pylogctl("acl", "remove", "--principal", "alice", "--topic", topic)


def test_a_super_user_may_do_anything_without_acls(secured: CurveBroker, topic: str) -> None:
    for name, request in {**routed_requests(topic), **operator_requests(topic)}.items():
        assert not isinstance(secured.call("admin", request), Exception), name


def test_a_removed_principal_is_refused_at_once_even_on_its_open_connection(
    secured: CurveBroker, topic: str
) -> None:
    generate_keys(secured.key_dir, "bob")
    secured.pylogctl("principal", "add", "bob", str(secured.key_dir / "bob.key"))
    secured.pylogctl("acl", "add", "--principal", "bob", "--topic", topic, "--operation", "all")
    describe = DescribePartitionRequest(topic, 0)
    wait_until(
        lambda: isinstance(secured.call("bob", describe), protocol.DescribePartitionReply),
        timeout=5,
    )
    connection = Connection(secured.broker.endpoint, timeout_s=5, keys=secured.keys("bob"))
    with connection:
        assert isinstance(connection.call(describe), protocol.DescribePartitionReply)
        secured.pylogctl("principal", "remove", "bob")  # its ACLs stay

        def refused() -> bool:
            try:
                connection.call(describe)
            except BrokerError as error:
                assert error.name == "AUTHORIZATION_FAILED"
                assert "is no principal's (removed?)" in error.message
                return True
            return False

        wait_until(refused, timeout=1.0, what="the open connection refused within a second")
    assert secured.call("bob", DescribeClusterRequest()) is None  # and no new connection


# -- starting a broker: what it refuses, and what it says --------------------------------


def start_failure(tmp_path: Path, *flags: str) -> str:
    """pylogd's stderr when it refuses to start with `flags` (it must exit EXIT_CANNOT_START,
    quickly)."""
    result = subprocess.run(
        [
            str(Path(sys.executable).with_name("pylogd")),
            "--broker-data-dir",
            str(tmp_path / "d"),
            *flags,
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == EXIT_CANNOT_START, result
    return result.stderr


@pytest.mark.broker
def test_plaintext_on_an_address_that_is_not_loopback_is_refused(tmp_path: Path) -> None:
    error = start_failure(tmp_path, "--broker-host", "0.0.0.0", "--broker-port", "0")
    assert "security.mode is plaintext and broker.host 0.0.0.0 is not a loopback" in error


@pytest.mark.broker
def test_curve_without_a_key_file_is_refused_with_one_line(tmp_path: Path) -> None:
    error = start_failure(tmp_path, "--security-mode", "curve", "--broker-port", "0")
    assert "broker.key_secret" in error and "Traceback" not in error


@pytest.mark.broker
def test_a_secret_key_others_may_read_is_refused(tmp_path: Path) -> None:
    _, secret = generate_keys(tmp_path / "keys", "broker")
    secret.chmod(0o644)
    error = start_failure(
        tmp_path,
        "--security-mode",
        "curve",
        "--security-key-file",
        str(secret),
        "--broker-port",
        "0",
    )
    assert "chmod 600" in error


@pytest.mark.broker
@pytest.mark.parametrize(
    ("text", "mode", "problem"),
    [
        ("alice {key}\n", 0o666, "may be written by others"),
        ("alice\n", 0o644, "write NAME KEY"),
        ("al/ice {key}\n", 0o644, "principal name"),
    ],
)
def test_a_principals_file_others_may_write_or_that_does_not_read_is_refused(
    tmp_path: Path, text: str, mode: int, problem: str
) -> None:
    _, secret = generate_keys(tmp_path / "keys", "broker")
    key = load_public_key(generate_keys(tmp_path / "keys", "alice")[0]).decode()
    principals = tmp_path / "principals"
    principals.write_text(text.format(key=key))
    principals.chmod(mode)
    flags = ("--security-mode", "curve", "--security-key-file", str(secret))
    error = start_failure(
        tmp_path, *flags, "--security-principals-file", str(principals), "--broker-port", "0"
    )
    assert problem in error and "Traceback" not in error, error


@pytest.mark.broker
def test_a_super_user_that_cannot_be_a_principal_is_a_usage_error(tmp_path: Path) -> None:
    result = subprocess.run(
        [str(Path(sys.executable).with_name("pylogd")), "--security-super-users", "a b"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2 and "security_super_users" in result.stderr, result


def test_the_log_says_which_mode_a_broker_serves(
    make_pylogd: Callable[..., RunningBroker], tmp_path: Path
) -> None:
    plain = make_pylogd(*single_box_flags(tmp_path / "p"), name="plain")
    assert (
        "security: plaintext on 127.0.0.1: no authentication, no ACLs" in plain.log_path.read_text()
    )
    remote = make_pylogd(
        *single_box_flags(tmp_path / "r"),
        "--broker-host",
        "0.0.0.0",
        "--security-allow-plaintext-remote",
        "true",
        name="remote",
    )
    assert "security: PLAINTEXT on 0.0.0.0, which is not loopback" in remote.log_path.read_text()
    assert (tmp_path / "plain" / "run").stat().st_mode & 0o777 == 0o700


def test_a_principals_file_lets_its_keys_in_and_is_read_again_when_changed(
    make_pylogd: Callable[..., RunningBroker], tmp_path: Path
) -> None:
    keys = tmp_path / "keys"
    for name in ("broker", "carol", "dave"):
        generate_keys(keys, name)
    principals = tmp_path / "principals"
    carol = (keys / "carol.key").read_text().split('public-key = "')[1][:40]
    dave = (keys / "dave.key").read_text().split('public-key = "')[1][:40]
    principals.write_text(f"# name key\ncarol {carol}\n")
    running = make_pylogd(
        *single_box_flags(tmp_path),
        "--security-mode",
        "curve",
        "--security-key-file",
        str(keys / "broker.key_secret"),
        "--security-principals-file",
        str(principals),
        *("--security-allow-open-registry", "true"),
        name="filed",
    )
    started = running.log_path.read_text()  # issue 53, 7: it said "1 keys from <file>"
    assert f"1 client keys from {principals}, and the principals in ZooKeeper" in started
    found = CurveBroker(running, tmp_path, "", "")
    assert isinstance(found.call("carol", DescribeClusterRequest()), protocol.DescribeClusterReply)
    assert found.call("dave", DescribeClusterRequest()) is None
    principals.write_text(f"carol {carol}\ndave {dave}\n")
    wait_until(
        lambda: isinstance(
            found.call("dave", DescribeClusterRequest()), protocol.DescribeClusterReply
        ),
        timeout=5,
    )


def test_a_broker_with_a_zookeeper_identity_keeps_its_registry_to_itself(
    make_pylogd: Callable[..., RunningBroker], zookeeper: PrivateZooKeeper, tmp_path: Path
) -> None:
    auth_file = tmp_path / "zookeeper-auth"
    auth_file.write_text("pylog-brokers:s3cret\n")
    auth_file.chmod(0o600)
    running = make_pylogd(*single_box_flags(tmp_path), "--zookeeper-auth-file", str(auth_file))
    assert "registry: ZooKeeper digest ACLs as 'pylog-brokers'" in running.log_path.read_text()
    chroot = running.arguments[1]
    with Registry(zookeeper.connect_string, chroot) as stranger:
        assert stranger.brokers.read()  # anyone may read
        with pytest.raises(RegistryAccessDenied):
            stranger.security.add_principal(
                "eve", load_public_key(generate_keys(tmp_path, "eve")[0])
            )
        with pytest.raises(RegistryAccessDenied):
            stranger.security.add_acl(Acl("eve", "*", frozenset(Operation)))
    with Registry(zookeeper.connect_string, chroot, auth=ZooKeeperAuth.load(auth_file)) as own:
        own.security.add_acl(Acl("eve", "*", frozenset({Operation.FETCH})))
        assert own.security.acls() == [Acl("eve", "*", frozenset({Operation.FETCH}))]

    # pylogctl without the identity says what it needs (issue 53, 2: it said only NoAuth)
    add = ["acl", "add", "--principal", "bob", "--topic", "logs", "--operation", "fetch"]
    refused = CliRunner().invoke(cli, [*add, "--broker", running.endpoint])
    assert refused.exit_code == 1
    assert refused.output.rstrip().endswith(
        "the registry has ACLs: give the cluster's ZooKeeper identity, --zookeeper-auth-file "
        "FILE (or PYLOG_ZOOKEEPER_AUTH_FILE; docs/security.md)"
    ), refused.output
    granted = CliRunner().invoke(
        cli, [*add, "--broker", running.endpoint, "--zookeeper-auth-file", str(auth_file)]
    )
    assert granted.exit_code == 0, granted.output

    # a command that cannot write says so before it prints what it would do (issue 53, 2)
    with Admin(running.endpoint) as admin:
        admin.create_topic("moved", 1, {})
        holder = admin.topic("moved").partitions[0].broker_id
    move = ["topic", "reassign", "moved", "--partition", "0", "--replicas", str(holder)]
    refused = CliRunner().invoke(cli, [*move, "--broker", running.endpoint])
    assert refused.exit_code == 1
    assert "->" not in refused.output, refused.output  # no plan printed
    assert "refused by ZooKeeper's ACLs (NoAuth)" in refused.output
    assert "--zookeeper-auth-file" in refused.output
    planned = CliRunner().invoke(cli, [*move, "--dry-run", "--broker", running.endpoint])
    assert (planned.exit_code, planned.output) == (0, f"moved-0: replicas {holder} -> {holder}\n")
    moved = CliRunner().invoke(
        cli, [*move, "--broker", running.endpoint, "--zookeeper-auth-file", str(auth_file)]
    )
    assert moved.exit_code == 0, moved.output


def test_a_broker_without_the_identity_is_told_so_by_zookeeper(
    make_pylogd: Callable[..., RunningBroker], tmp_path: Path
) -> None:
    """A broker left without zookeeper.auth_file when the others got it: its registry writes
    answer REGISTRY_ACCESS_DENIED, and it cannot start again."""
    auth_file = tmp_path / "zookeeper-auth"
    auth_file.write_text("pylog-brokers:s3cret\n")
    auth_file.chmod(0o600)
    old = make_pylogd(*single_box_flags(tmp_path / "old"), "--broker-id", "1", name="old")
    make_pylogd(
        *single_box_flags(tmp_path / "new"),
        "--broker-id",
        "2",
        "--zookeeper-auth-file",
        str(auth_file),
        name="new",
    )  # secures the registry the old broker made
    with Connection(old.endpoint) as connection, pytest.raises(BrokerError) as refused:
        connection.call(CreateTopicRequest("refused", 1, {}))
    assert refused.value.name == "REGISTRY_ACCESS_DENIED"
    assert "refused by ZooKeeper (NoAuth)" in refused.value.message
    old.stop()
    with pytest.raises(RuntimeError, match=r"refused by ZooKeeper \(NoAuth\)"):
        old.restarted()


def test_a_principal_changes_its_key_without_a_gap(secured: CurveBroker) -> None:
    for name in ("carl-old", "carl-new"):
        generate_keys(secured.key_dir, name)
    ask = DescribeClusterRequest()
    secured.pylogctl("principal", "add", "carl", str(secured.key_dir / "carl-old.key"))
    wait_until(lambda: secured.call("carl-old", ask) is not None, timeout=5)
    secured.pylogctl("principal", "add", "carl", str(secured.key_dir / "carl-new.key"))
    wait_until(lambda: secured.call("carl-new", ask) is not None, timeout=5)
    assert secured.call("carl-old", ask) is not None  # both keys, while clients move over
    assert "carl" in secured.pylogctl("principal", "list")
    secured.pylogctl("principal", "remove", "carl", "--key", str(secured.key_dir / "carl-old.key"))
    wait_until(lambda: secured.call("carl-old", ask) is None, timeout=5)
    assert secured.call("carl-new", ask) is not None
