"""A real pylogd in curve mode for the tests of issue 16, started one way for every module.

`running_curve_broker` generates the key pairs (the broker's, and admin, alice and mallory's),
starts pylogd with --security-mode curve, its key file, admin as its super user and its
metrics on a free port, and adds admin and alice as principals through the Registry (alice has
no ACL; mallory has keys but is no principal). With `zookeeper_acls` its registry has ZooKeeper
digest ACLs: the brokers' identity file is `broker_auth`, and `member_auth` is another identity
(the one group members of earlier builds, or mirror processes, would present).
`curve_broker_fixture` makes a module's fixture of it (starting a broker
takes seconds: each module starts one, its tests use topics of their own).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import zmq
from click.testing import CliRunner

from broker import protocol
from broker.errors import BrokerError
from broker.protocol import DescribeClusterRequest, Request, RequestHeader
from broker.registry import Registry
from broker.security import ClientKeys, ZooKeeperAuth, generate_keys, load_public_key
from broker.zookeeper import PrivateZooKeeper
from cli.pylogctl import cli
from tests.conftest import single_box_flags, wait_until
from tests.pylogd import RunningBroker

SUPER_USER = "admin"
PRINCIPALS = (SUPER_USER, "alice")
STRANGER = "mallory"
"""Has a key pair, and is no principal."""

NO_REPLY_MS = 1500
"""How long a refused client waits to see that no reply comes."""


@dataclass(frozen=True)
class CurveBroker:
    broker: RunningBroker
    root: Path
    zookeeper: str
    chroot: str
    zookeeper_acls: bool = False
    """Whether its registry has ZooKeeper digest ACLs (the broker has `broker_auth`)."""

    @property
    def key_dir(self) -> Path:
        """`<name>.key` and `<name>.key_secret` of the broker and of each client."""
        return self.root / "keys"

    @property
    def broker_auth(self) -> Path:
        """The brokers' ZooKeeper identity file (zookeeper.auth_file), with zookeeper_acls."""
        return self.root / "brokers.auth"

    @property
    def member_auth(self) -> Path:
        """A ZooKeeper identity file other than the brokers' (an old member's, a mirror
        process's), with zookeeper_acls."""
        return self.root / "members.auth"

    def keys(self, name: str) -> ClientKeys:
        """The client keys of `name` (its key pair under key_dir) for this broker."""
        return ClientKeys.load(self.key_dir / f"{name}.key_secret", self.key_dir / "broker.key")

    def client(self, name: str | None) -> zmq.Socket[bytes]:
        """A DEALER connected to the broker as `name`, or in plaintext (None)."""
        socket: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.DEALER)
        socket.setsockopt(zmq.LINGER, 0)
        # A DEALER with no connection up blocks its send (a handshake the broker refused can
        # leave it so): bounded like the wait for the reply.
        socket.setsockopt(zmq.SNDTIMEO, NO_REPLY_MS)
        if name is not None:
            self.keys(name).apply(socket)
        socket.connect(self.broker.endpoint)
        return socket

    def call(self, name: str | None, request: Request) -> protocol.Reply | Exception | None:
        """The reply to `request` sent as `name`: a Reply, the BrokerError answered, or None
        when no reply came in NO_REPLY_MS."""
        socket = self.client(name)
        try:
            header = RequestHeader(request.api, protocol.API_VERSION, 7, "test-security")
            try:
                socket.send_multipart(protocol.encode_request(header, request))
            except zmq.Again:  # no connection to send on: no reply either
                return None
            if not socket.poll(NO_REPLY_MS):
                return None
            frames = socket.recv_multipart()
        finally:
            socket.close()
        try:
            return protocol.decode_reply(request.api, frames)
        except BrokerError as error:
            return error

    def pylogctl(self, *args: str) -> str:
        """pylogctl's output for a registry command (principal, acl), as the brokers' identity
        when the registry has ZooKeeper ACLs; it must succeed."""
        env = {"PYLOG_ZOOKEEPER_AUTH_FILE": str(self.broker_auth)} if self.zookeeper_acls else {}
        result = CliRunner().invoke(
            cli, [*args, "--zookeeper", self.zookeeper, "--chroot", self.chroot], env=env
        )
        assert result.exit_code == 0, result.output
        return result.output

    def counted(self, name: str, **labels: str) -> float:
        """The sum of the broker's samples of counter `name` with `labels` (0 when none)."""
        return sum(
            value
            for (sample, pairs), value in self.broker.metrics().items()
            if sample == name and labels.items() <= dict(pairs).items()
        )


def secret_file(path: Path, text: str) -> Path:
    path.write_text(text)
    os.chmod(path, 0o600)
    return path


@contextmanager
def running_curve_broker(
    zookeeper: PrivateZooKeeper,
    root: Path,
    *,
    zookeeper_acls: bool = False,
    flags: Sequence[str] = (),
) -> Iterator[CurveBroker]:
    """A real pylogd under `root` in curve mode (and `flags`), ready for PRINCIPALS (see the
    module's docstring); stopped on exit, its log's tail printed."""
    chroot = f"/test-curve-{os.getpid()}-{time.monotonic_ns()}"
    found = CurveBroker(
        RunningBroker(
            root / "broker",
            zookeeper.connect_string,
            chroot,
            *single_box_flags(root),
            "--security-mode",
            "curve",
            "--security-key-file",
            str(root / "keys" / "broker.key_secret"),
            "--security-super-users",
            SUPER_USER,
            "--metrics-enabled",
            "true",
            "--metrics-port",
            "0",
            *(
                ("--zookeeper-auth-file", str(root / "brokers.auth"))
                if zookeeper_acls
                else ("--security-allow-open-registry", "true")
            ),
            *flags,
        ),
        root,
        zookeeper.connect_string,
        chroot,
        zookeeper_acls,
    )
    for name in ("broker", *PRINCIPALS, STRANGER):
        generate_keys(found.key_dir, name)
    auth = None
    if zookeeper_acls:
        auth = ZooKeeperAuth.load(secret_file(found.broker_auth, "pylogd:broker-secret\n"))
        secret_file(found.member_auth, "loaders:member-secret\n")
    found.broker.start()
    try:
        with Registry(zookeeper.connect_string, chroot, auth=auth) as registry:
            for name in PRINCIPALS:
                registry.security.add_principal(
                    name, load_public_key(found.key_dir / f"{name}.key")
                )
        # The broker applies them from its watch, then says so: waited for so, not by trying
        # the keys. A key tried before the watch fired was refused, and that refusal, logged,
        # silenced the rate-limited log (a line per 10 s) for a test's own refusal after it.
        applied = f"principals in ZooKeeper: {len(PRINCIPALS)}"
        wait_until(lambda: applied in found.broker.log_path.read_text(), what=applied)
        for name in PRINCIPALS:
            reply = found.call(name, DescribeClusterRequest())
            assert reply is not None and not isinstance(reply, Exception), (name, reply)
        yield found
    finally:
        found.broker.stop()
        print(f"--- {found.broker.log_path}:\n{found.broker.log_tail()}")


def curve_broker_fixture(
    name: str = "curve_broker", **options: Any
) -> Callable[..., Iterator[CurveBroker]]:
    """A module-scoped fixture named `name`: a running_curve_broker(**options) for the module's
    tests (assign it to a module variable of that name)."""

    @pytest.fixture(scope="module", name=name)
    def curve_broker(
        zookeeper: PrivateZooKeeper, tmp_path_factory: pytest.TempPathFactory
    ) -> Iterator[CurveBroker]:
        with running_curve_broker(zookeeper, tmp_path_factory.mktemp("curve"), **options) as found:
            yield found

    return curve_broker
