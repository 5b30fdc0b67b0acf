"""Every client takes Curve keys (issue 16): through a CurveZMQ server with a ZAP handler
(tests/client/curve.py: a Curve front relaying to a real pylogd), a client with the right keys
gets through, and one with an unknown key, a wrong broker key or no keys gets no reply. Against
a real pylogd in curve mode whose registry has ZooKeeper ACLs, the group consumers (sync and
asyncio) and pylogctl's group commands take keys and a ZooKeeper identity."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from broker.aio import AsyncGroupConsumer, AsyncPartitionConsumer, AsyncProducer
from broker.client import Admin, Connection, PartitionConsumer, Producer, TopicConsumer
from broker.client.group import GroupConsumer, Record
from broker.errors import RegistryAccessDenied, Unavailable
from broker.protocol import Api, MetadataRequest
from broker.security import ClientKeys, ZooKeeperAuth, generate_keys, load_key_pair
from broker.zookeeper import PrivateZooKeeper
from cli.pylogctl import cli
from tests.client.curve import CurveBroker, CurveRelay, curve_relay, running_curve_broker
from tests.pylogd import RunningBroker

SHORT_TIMEOUT_S = 0.5


@pytest.fixture
def relay(broker: RunningBroker, tmp_path: Path) -> Iterator[tuple[CurveRelay, ClientKeys]]:
    with curve_relay(broker.endpoint, tmp_path / "keys") as running:
        yield running


def test_producer_and_consumers_with_keys_get_through_a_curve_server(
    relay: tuple[CurveRelay, ClientKeys], topic: str
) -> None:
    server, keys = relay
    with Admin(server.endpoint, keys=keys) as admin:
        admin.create_topic(topic, 2)
    with Producer(server.endpoint, topic, partitioner="round_robin", keys=keys) as producer:
        offsets = [producer.send(b"m-%d" % i).result(10) for i in range(4)]
    assert len(offsets) == 4
    with PartitionConsumer(server.endpoint, topic, 1, stop_at_end=True, keys=keys) as consumer:
        assert [m.value for m in consumer] == [b"m-1", b"m-3"]
    with TopicConsumer(server.endpoint, topic, keys=keys) as every:
        values = set()
        for record in every:
            values.add(record.value)
            if len(values) == 4:
                break
    assert values == {b"m-0", b"m-1", b"m-2", b"m-3"}
    assert {Api.CREATE_TOPIC, Api.PRODUCE, Api.FETCH} <= set(server.relayed)
    assert server.seen and all(seen == (keys.public, True) for seen in server.seen)


def test_asyncio_clients_with_keys_get_through_a_curve_server(
    relay: tuple[CurveRelay, ClientKeys], topic: str
) -> None:
    server, keys = relay
    with Admin(server.endpoint, keys=keys) as admin:
        admin.create_topic(topic)

    async def produce_and_consume() -> list[bytes]:
        async with AsyncProducer(server.endpoint, topic, keys=keys) as producer:
            for i in range(3):
                await (await producer.send(b"a-%d" % i))
        async with AsyncPartitionConsumer(
            server.endpoint, topic, stop_at_end=True, keys=keys
        ) as consumer:
            return [message.value async for message in consumer]

    assert asyncio.run(produce_and_consume()) == [b"a-0", b"a-1", b"a-2"]
    assert server.seen and all(seen == (keys.public, True) for seen in server.seen)


def test_an_unknown_client_key_is_refused_by_the_zap_handler(
    relay: tuple[CurveRelay, ClientKeys], tmp_path: Path
) -> None:
    server, keys = relay
    _, secret = generate_keys(tmp_path / "other", "stranger")
    stranger = ClientKeys.load(secret, keys.broker)
    with (
        Connection(server.endpoint, timeout_s=SHORT_TIMEOUT_S, keys=stranger) as connection,
        pytest.raises(Unavailable, match=r"within 0\.5 s .*this client's key not allowed\?"),
    ):
        connection.request(MetadataRequest())
    assert server.seen and all(seen == (stranger.public, False) for seen in server.seen)
    assert server.relayed == []


def test_a_wrong_broker_key_gets_no_reply(
    relay: tuple[CurveRelay, ClientKeys], tmp_path: Path
) -> None:
    server, keys = relay
    impostor, _ = load_key_pair(generate_keys(tmp_path / "other", "impostor")[1])
    wrong = ClientKeys(keys.public, keys.secret, impostor)
    with (
        Connection(server.endpoint, timeout_s=SHORT_TIMEOUT_S, keys=wrong) as connection,
        pytest.raises(Unavailable, match=r"within 0\.5 s"),
    ):
        connection.request(MetadataRequest())
    # The server could not read the client's HELLO: it never got as far as asking ZAP.
    assert server.seen == [] and server.relayed == []


def test_a_client_without_keys_gets_no_reply(relay: tuple[CurveRelay, ClientKeys]) -> None:
    server, _ = relay
    with (
        Connection(server.endpoint, timeout_s=SHORT_TIMEOUT_S) as connection,
        pytest.raises(Unavailable, match=r"within 0\.5 s .*\(broker down or unreachable\?\)"),
    ):
        connection.request(MetadataRequest())
    with (
        Producer(server.endpoint, "any", timeout_s=SHORT_TIMEOUT_S, retries=0) as producer,
        pytest.raises(Unavailable),
    ):
        producer.partitions  # noqa: B018 (METADATA, refused)
    assert server.seen == [] and server.relayed == []


# -- a real pylogd in curve mode, its registry with ZooKeeper ACLs ------------------------------


@pytest.fixture(scope="module")
def curve_broker(
    zookeeper: PrivateZooKeeper, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[CurveBroker]:
    with running_curve_broker(zookeeper, tmp_path_factory.mktemp("curve")) as running:
        yield running


def _fill(curve: CurveBroker, topic: str, count: int) -> None:
    with Admin(curve.broker.endpoint, keys=curve.keys) as admin:
        admin.create_topic(topic, 2)
    with Producer(curve.broker.endpoint, topic, keys=curve.keys) as producer:
        for i in range(count):
            producer.send(b"g-%d" % i, key=b"k-%d" % i)


def test_a_producer_publishes_its_audit_records_to_a_curve_broker_with_its_keys(
    curve_broker: CurveBroker, topic: str
) -> None:
    endpoint, keys = curve_broker.broker.endpoint, curve_broker.keys
    with Admin(endpoint, keys=keys) as admin:
        admin.create_topic(topic)
        admin.create_topic(f"{topic}.audit")
    with Producer(endpoint, topic, audit_topic=f"{topic}.audit", keys=keys) as producer:
        for i in range(3):
            producer.send(b"a-%d" % i)
    with PartitionConsumer(endpoint, f"{topic}.audit", stop_at_end=True, keys=keys) as audit:
        records = [json.loads(m.value) for m in audit]
    assert max(r["count"] for r in records if r["topic"] == topic) == 3


def test_group_members_with_keys_and_a_zookeeper_identity_consume_from_a_curve_broker(
    curve_broker: CurveBroker, topic: str
) -> None:
    _fill(curve_broker, topic, 6)
    auth = ZooKeeperAuth.load(curve_broker.member_auth)
    options: dict[str, Any] = {
        "chroot": curve_broker.chroot,
        "keys": curve_broker.keys,
        "zookeeper_auth": auth,
    }
    seen: list[Record] = []
    with GroupConsumer(curve_broker.zookeeper, "loaders", [topic], **options) as member:
        for record in member:
            seen.append(record)
            if len(seen) == 3:
                break
        member.commit()  # the three, the one in hand included

    async def the_rest() -> list[Record]:
        found: list[Record] = []
        async with AsyncGroupConsumer(curve_broker.zookeeper, "loaders", [topic], **options) as m:
            async for record in m:
                found.append(record)
                if len(seen) + len(found) == 6:
                    break
        return found

    seen += asyncio.run(the_rest())
    assert sorted(r.value for r in seen) == [b"g-%d" % i for i in range(6)]

    # The group's nodes are the members' identity's: a member without it is refused.
    with pytest.raises(RegistryAccessDenied):
        GroupConsumer(curve_broker.zookeeper, "loaders", [topic], chroot=curve_broker.chroot)


def test_pylogctl_group_commands_take_keys_and_a_zookeeper_auth_file(
    curve_broker: CurveBroker, topic: str
) -> None:
    _fill(curve_broker, topic, 4)
    env = {
        "PYLOG_BROKER": curve_broker.broker.endpoint,
        "PYLOG_KEY_FILE": str(curve_broker.key_dir / "app.key_secret"),
        "PYLOG_BROKER_KEY": str(curve_broker.key_dir / "broker.key"),
        "PYLOG_ZOOKEEPER_AUTH_FILE": str(curve_broker.member_auth),
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
    without = {k: v for k, v in env.items() if k != "PYLOG_ZOOKEEPER_AUTH_FILE"}
    refused = runner.invoke(
        cli, ["group", "reset", group, "--topic", topic, "--to", "latest", "--execute"], env=without
    )
    assert refused.exit_code == 1
    assert refused.stderr.startswith("pylogctl: RegistryAccessDenied: "), refused.output


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
