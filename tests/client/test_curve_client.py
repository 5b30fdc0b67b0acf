"""Every client takes Curve keys (issue 16), against a real pylogd in curve mode whose registry
has ZooKeeper ACLs (tests/curve.py): a client with the right keys gets through, and one with an
unknown key, a wrong broker key or no keys gets no reply, which the broker counts and logs (and
the client is told); the
group consumers (sync and asyncio) take keys, and need no ZooKeeper identity (their group's
coordinator writes the group's nodes with the brokers'), and pylogctl's group commands take keys
and, for those that write the registry, a ZooKeeper identity."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from click.testing import CliRunner

from broker.aio import AsyncGroupConsumer, AsyncPartitionConsumer, AsyncProducer
from broker.client import Admin, Connection, PartitionConsumer, Producer, TopicConsumer
from broker.client.coordinator import GroupCalls
from broker.client.group import GroupConsumer
from broker.client.records import Record
from broker.errors import AuthenticationFailed, PylogError, RegistryAccessDenied
from broker.groups.assignors import TopicPartition
from broker.protocol import MetadataRequest
from broker.registry import Registry
from broker.security import ClientKeys, ZooKeeperAuth, generate_keys, load_key_pair
from cli.pylogctl import cli
from tests.conftest import wait_until
from tests.curve import STRANGER, SUPER_USER, CurveBroker, curve_broker_fixture

SHORT_TIMEOUT_S = 0.5

curve_broker = curve_broker_fixture(zookeeper_acls=True)

ACCEPTED = "pylog_connections_accepted_total"
REFUSED = "pylog_connections_refused_total"
"""By the ZAP handler: an unknown client key."""
FAILED = "pylog_handshakes_failed_total"
"""Before the ZAP handler is asked: a wrong broker key, a plaintext client."""
REQUESTS = "pylog_front_requests_total"


@contextmanager
def refused(curve: CurveBroker, counter: str, **labels: str) -> Iterator[None]:
    """The block's clients get no reply: the broker counts them in `counter` (samples with
    `labels`), the front reads no request of theirs, the ZAP handler lets none in, and refuses
    none unless `counter` is its REFUSED."""
    others = [name for name in (REQUESTS, ACCEPTED, REFUSED) if name != counter]
    before, counted = [curve.counted(name) for name in others], curve.counted(counter, **labels)
    yield
    wait_until(lambda: curve.counted(counter, **labels) > counted, what=f"{counter} to grow")
    assert [curve.counted(name) for name in others] == before, others


def request_metadata(curve: CurveBroker, keys: ClientKeys | None) -> None:
    """A METADATA request from a Connection with `keys`. Refused, it raises a PylogError: which
    one a refused key gets, and its message, tests/client/test_handshake_errors.py says."""
    with Connection(curve.broker.endpoint, timeout_s=SHORT_TIMEOUT_S, keys=keys) as connection:
        connection.request(MetadataRequest())


@contextmanager
def none_refused(curve: CurveBroker) -> Iterator[None]:
    """The block's clients are let in: the ZAP handler accepts their connections and refuses
    none, and no handshake fails."""
    accepted, refusals, failed = (curve.counted(name) for name in (ACCEPTED, REFUSED, FAILED))
    yield
    assert curve.counted(ACCEPTED) > accepted
    assert (curve.counted(REFUSED), curve.counted(FAILED)) == (refusals, failed)


def test_producer_and_consumers_with_keys_get_through_a_curve_broker(
    curve_broker: CurveBroker, topic: str
) -> None:
    endpoint, keys = curve_broker.broker.endpoint, curve_broker.keys(SUPER_USER)
    with none_refused(curve_broker):
        with Admin(endpoint, keys=keys) as admin:
            admin.create_topic(topic, 2)
        with Producer(endpoint, topic, partitioner="round_robin", keys=keys) as producer:
            offsets = [producer.send(b"m-%d" % i).result(10) for i in range(4)]
        assert len(offsets) == 4
        with PartitionConsumer(endpoint, topic, 1, stop_at_end=True, keys=keys) as consumer:
            assert [m.value for m in consumer] == [b"m-1", b"m-3"]
        with TopicConsumer(endpoint, topic, keys=keys) as every:
            values = set()
            for record in every:
                values.add(record.value)
                if len(values) == 4:
                    break
    assert values == {b"m-0", b"m-1", b"m-2", b"m-3"}


def test_asyncio_clients_with_keys_get_through_a_curve_broker(
    curve_broker: CurveBroker, topic: str
) -> None:
    endpoint, keys = curve_broker.broker.endpoint, curve_broker.keys(SUPER_USER)

    async def produce_and_consume() -> list[bytes]:
        async with AsyncProducer(endpoint, topic, keys=keys) as producer:
            for i in range(3):
                await (await producer.send(b"a-%d" % i))
        async with AsyncPartitionConsumer(endpoint, topic, stop_at_end=True, keys=keys) as consumer:
            return [message.value async for message in consumer]

    with none_refused(curve_broker):
        with Admin(endpoint, keys=keys) as admin:
            admin.create_topic(topic)
        assert asyncio.run(produce_and_consume()) == [b"a-0", b"a-1", b"a-2"]


def test_an_unknown_client_key_is_refused_by_the_zap_handler(curve_broker: CurveBroker) -> None:
    stranger = curve_broker.keys(STRANGER)
    with refused(curve_broker, REFUSED), pytest.raises(PylogError):
        request_metadata(curve_broker, stranger)
    # The one test of this module whose key is unknown: its refusal is logged, not rate-limited
    # (the ZAP handler counts it, then logs it: the line may follow the counter by a moment).
    refusal = f"refused a connection from 127.0.0.1: unknown client key {stranger.public.decode()}"
    wait_until(
        lambda: refusal in curve_broker.broker.log_path.read_text(), what="the refusal's log line"
    )


def test_a_wrong_broker_key_gets_no_reply(curve_broker: CurveBroker, tmp_path: Path) -> None:
    keys = curve_broker.keys(SUPER_USER)
    impostor, _ = load_key_pair(generate_keys(tmp_path / "other", "impostor")[1])
    # The broker cannot read the client's HELLO: it never gets as far as asking ZAP.
    with (
        refused(curve_broker, FAILED, reason="wrong_broker_key"),
        pytest.raises(PylogError),
    ):
        request_metadata(curve_broker, ClientKeys(keys.public, keys.secret, impostor))
    log = curve_broker.broker.log_path.read_text()
    assert "a Curve handshake failed: a cryptographic error" in log


def test_a_client_without_keys_gets_no_reply(curve_broker: CurveBroker) -> None:
    # A mechanism mismatch (not_curve), or a broken pipe (other) when the client hung up first;
    # the client is told (tests/client/test_handshake_errors.py).
    # Told within the handshake, not the reply timeout: the default (10 s), so that a loaded
    # machine cannot make it the timeout's Unavailable.
    with refused(curve_broker, FAILED):
        with (
            Connection(curve_broker.broker.endpoint) as connection,
            pytest.raises(AuthenticationFailed, match="serves CurveZMQ"),
        ):
            connection.request(MetadataRequest())
        with (
            Producer(curve_broker.broker.endpoint, "any", retries=0) as producer,
            pytest.raises(AuthenticationFailed, match="serves CurveZMQ"),
        ):
            producer.partitions  # noqa: B018 (METADATA, refused)
    assert "a Curve handshake failed: " in curve_broker.broker.log_path.read_text()


def _fill(curve: CurveBroker, topic: str, count: int) -> None:
    keys = curve.keys(SUPER_USER)
    with Admin(curve.broker.endpoint, keys=keys) as admin:
        admin.create_topic(topic, 2)
    with Producer(curve.broker.endpoint, topic, keys=keys) as producer:
        for i in range(count):
            producer.send(b"g-%d" % i, key=b"k-%d" % i)


def test_a_producer_publishes_its_audit_records_to_a_curve_broker_with_its_keys(
    curve_broker: CurveBroker, topic: str
) -> None:
    endpoint, keys = curve_broker.broker.endpoint, curve_broker.keys(SUPER_USER)
    with Admin(endpoint, keys=keys) as admin:
        admin.create_topic(topic)
        admin.create_topic(f"{topic}.audit")
    with Producer(endpoint, topic, audit_topic=f"{topic}.audit", keys=keys) as producer:
        for i in range(3):
            producer.send(b"a-%d" % i)
    with PartitionConsumer(endpoint, f"{topic}.audit", stop_at_end=True, keys=keys) as audit:
        records = [json.loads(m.value) for m in audit]
    assert max(r["count"] for r in records if r["topic"] == topic) == 3


def test_group_members_with_keys_consume_from_a_curve_broker_without_any_zookeeper_identity(
    curve_broker: CurveBroker, topic: str
) -> None:
    """The members present their keys only: the group's coordinator writes the group's nodes
    in ZooKeeper with the brokers' identity, which anyone reads and no other identity changes."""
    _fill(curve_broker, topic, 6)
    endpoint, keys = curve_broker.broker.endpoint, curve_broker.keys(SUPER_USER)
    seen: list[Record] = []
    with none_refused(curve_broker):
        with GroupConsumer(endpoint, "loaders", [topic], keys=keys, max_wait_ms=200) as member:
            deadline = time.monotonic() + 30
            while len(seen) < 3 and time.monotonic() < deadline:  # bounded: three records
                seen += member.poll_records(3 - len(seen))
            member.commit()  # the three
        assert len(seen) == 3

        async def the_rest() -> list[Record]:
            found: list[Record] = []
            async with AsyncGroupConsumer(
                endpoint, "loaders", [topic], keys=keys, max_wait_ms=200
            ) as m:
                async with asyncio.timeout(30):
                    async for record in m:  # bounded: three records, 30 s
                        found.append(record)
                        if len(seen) + len(found) == 6:
                            break
            return found

        seen += asyncio.run(the_rest())
    assert sorted(r.value for r in seen) == [b"g-%d" % i for i in range(6)]

    # What the group committed, in ZooKeeper: read by a client without any identity, changed
    # by none but the brokers' (not by the identity the members of the paper's protocol had)
    with GroupCalls(endpoint, "loaders", keys=keys) as calls:
        committed = calls.committed([topic])
    expected = {str(tp.partition): offset for tp, offset in committed.items()}
    assert len(expected) == 2, committed
    member_auth = ZooKeeperAuth.load(curve_broker.member_auth)
    with (
        Registry(curve_broker.zookeeper, curve_broker.chroot) as plain,
        Registry(curve_broker.zookeeper, curve_broker.chroot, auth=member_auth) as other,
    ):

        def in_zookeeper() -> dict[str, int]:
            offsets = plain.groups.committed_offsets("loaders").get(topic, {})
            return {name.split("-")[1]: offset for name, offset in offsets.items()}

        wait_until(lambda: in_zookeeper() == expected, what="the offsets in ZooKeeper")
        (name, _), *_ = plain.groups.committed_offsets("loaders")[topic].items()
        for registry in (plain, other):
            with pytest.raises(RegistryAccessDenied):
                registry.groups.commit_offset("loaders", topic, name, 0)
        assert in_zookeeper() == expected


def test_pylogctl_group_commands_of_a_coordinated_group_take_keys_only(
    curve_broker: CurveBroker, topic: str
) -> None:
    """`group consume`, `describe`, `reset` and `delete` of a group whose members joined through
    its coordinator need keys only: the reset and the delete go through the coordinator
    (OFFSET_COMMIT, DELETE_GROUP), which writes ZooKeeper with the brokers' identity. The
    delete needs `delete` on every topic (a super user here): alice, a principal without that
    ACL, is refused."""
    _fill(curve_broker, topic, 4)
    env = {
        "PYLOG_BROKER": curve_broker.broker.endpoint,
        "PYLOG_KEY_FILE": str(curve_broker.key_dir / f"{SUPER_USER}.key_secret"),
        "PYLOG_BROKER_KEY": str(curve_broker.key_dir / "broker.key"),
    }
    group = f"g-{topic[-8:]}"
    runner = CliRunner()
    consumed = runner.invoke(
        cli, ["group", "consume", group, topic, "--max-messages", "4"], env=env
    )
    assert consumed.exit_code == 0, consumed.output
    values = sorted(line.split("\t")[1] for line in consumed.stdout.splitlines())
    assert values == [f"g-{i}" for i in range(4)]
    described = runner.invoke(cli, ["group", "describe", group, "--json"], env=env)
    assert described.exit_code == 0, described.output
    reset = runner.invoke(
        cli, ["group", "reset", group, "--topic", topic, "--to", "earliest", "--execute"], env=env
    )
    assert reset.exit_code == 0, reset.output
    with GroupCalls(curve_broker.broker.endpoint, group, keys=curve_broker.keys(SUPER_USER)) as c:
        assert c.committed([topic]) == {TopicPartition(topic, p): 0 for p in (0, 1)}
    delete = ["group", "delete", group]
    alice = {"PYLOG_KEY_FILE": str(curve_broker.key_dir / "alice.key_secret")}
    refused = runner.invoke(cli, delete, env=env | alice)
    assert refused.exit_code == 1, refused.output
    assert "AUTHORIZATION_FAILED" in refused.stderr, refused.output
    deleted = runner.invoke(cli, delete, env=env)
    assert deleted.exit_code == 0, deleted.output
    with GroupCalls(curve_broker.broker.endpoint, group, keys=curve_broker.keys(SUPER_USER)) as c:
        assert c.committed([topic]) == {}


def test_pylogctl_principal_add_presents_the_zookeeper_auth_file(
    curve_broker: CurveBroker, tmp_path: Path
) -> None:
    public, _ = generate_keys(tmp_path, "bob")
    registry = ("--zookeeper", curve_broker.zookeeper, "--chroot", curve_broker.chroot)
    add = ["principal", "add", "bob", str(public), *registry]
    refused = CliRunner().invoke(cli, add)
    assert refused.exit_code == 1
    assert refused.stderr.startswith("pylogctl: RegistryAccessDenied: "), refused.output
    env = {"PYLOG_ZOOKEEPER_AUTH_FILE": str(curve_broker.broker_auth)}
    added = CliRunner().invoke(cli, add, env=env)
    assert added.exit_code == 0, added.output
