"""In curve mode the registry is closed to strangers by default (docs/security.md, step 2): a
broker with its private ZooKeeper makes the brokers' ZooKeeper identity itself on its first
start, and an anonymous ZooKeeper client can then read pylog's nodes but create, change or
delete none (but a consumer group's, which is its creator's); against an external ZooKeeper
without zookeeper.auth_file a curve broker does not start, unless told to with
security.allow_open_registry. Real pylogd processes and a real ZooKeeper."""

from __future__ import annotations

import re
import stat
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from kazoo.client import KazooClient
from kazoo.exceptions import NoAuthError

from broker.client import Admin
from broker.security import ClientKeys, generate_keys, load_public_key
from broker.zookeeper import PrivateZooKeeper
from tests.pylogd import RunningBroker
from tests.security.test_security import start_failure

CURVE = ("--security-mode", "curve", "--security-super-users", "ops")


def curve_flags(root: Path) -> tuple[str, ...]:
    """Curve mode with the broker's key pair and the operator's generated under `root`."""
    keys = root / "keys"
    if not (keys / "broker.key_secret").exists():
        generate_keys(keys, "broker")
        generate_keys(keys, "ops")
        (root / "principals").write_text(f"ops {load_public_key(keys / 'ops.key').decode()}\n")
    return (
        *CURVE,
        *("--security-key-file", str(keys / "broker.key_secret")),
        *("--security-principals-file", str(root / "principals")),
    )


@pytest.fixture
def anonymous() -> Iterator[Callable[[str], KazooClient]]:
    """Plain kazoo clients, without any identity, stopped at the end."""
    clients: list[KazooClient] = []

    def connect(hosts: str) -> KazooClient:
        client = KazooClient(hosts)
        client.start(timeout=10)
        clients.append(client)
        return client

    yield connect
    for client in clients:
        client.stop()
        client.close()


def nodes(client: KazooClient, path: str) -> Iterator[str]:
    yield path
    for child in client.get_children(path):
        yield from nodes(client, f"{path}/{child}")


def test_a_curve_broker_on_its_private_zookeeper_closes_the_registry_to_strangers(
    make_pylogd: Callable[..., RunningBroker],
    anonymous: Callable[[str], KazooClient],
    tmp_path: Path,
    registry_chroot: str,
) -> None:
    broker = make_pylogd(*curve_flags(tmp_path), name="secure", zookeeper="")
    auth = tmp_path / "secure" / "zookeeper.auth"
    assert stat.S_IMODE(auth.stat().st_mode) == 0o600
    identity = auth.read_text()
    assert identity.startswith("pylog-brokers:")
    log = broker.log_path.read_text()
    assert f"registry: the brokers' ZooKeeper identity written to {auth}" in log
    keys = ClientKeys.load(tmp_path / "keys" / "ops.key_secret", tmp_path / "keys" / "broker.key")
    with Admin(broker.endpoint, keys=keys) as admin:
        admin.create_topic("clicks", 1)

    (hosts,) = re.findall(r"private ZooKeeper on (\S+) \(pid", log)
    stranger = anonymous(hosts)
    root = registry_chroot
    seen = list(nodes(stranger, root))
    assert f"{root}/config/topics/clicks" in seen and f"{root}/brokers/ids/0" in seen
    for path in seen:
        if path.startswith(f"{root}/consumers"):  # a group's node is its creator's (registry.md)
            continue
        stranger.get(path)  # anyone reads
        with pytest.raises(NoAuthError):
            stranger.set(path, b"{}")
        with pytest.raises(NoAuthError):
            stranger.create(f"{path}/stranger", b"{}")
    for path in (f"{root}/config/topics/clicks", f"{root}/brokers/ids/0"):
        with pytest.raises(NoAuthError):
            stranger.delete(path)

    broker.stop()
    again = broker.restarted()  # the same identity, not a new one: its nodes stay its own
    assert auth.read_text() == identity
    with Admin(again.endpoint, keys=keys) as admin:
        admin.delete_topic("clicks")


def test_a_curve_broker_refuses_an_external_zookeeper_without_an_identity(
    zookeeper: PrivateZooKeeper, registry_chroot: str, tmp_path: Path
) -> None:
    connect = zookeeper.connect_string
    error = start_failure(
        tmp_path,
        *curve_flags(tmp_path),
        *("--zookeeper-connect", connect, "--zookeeper-chroot", registry_chroot),
        *("--broker-port", "0"),
    )
    (line,) = [line for line in error.splitlines() if "is open" in line]
    assert f"security.mode is curve but the registry at {connect} is open" in line
    assert "zookeeper.auth_file" in line and "security.allow_open_registry" in line


def test_allow_open_registry_starts_a_curve_broker_on_an_open_registry_with_a_warning(
    make_pylogd: Callable[..., RunningBroker], tmp_path: Path
) -> None:
    flags = (*curve_flags(tmp_path), "--security-allow-open-registry", "true")
    broker = make_pylogd(*flags, name="open")
    assert "WARNING" in broker.log_path.read_text().split("is OPEN (allow_open_registry")[0][-200:]
