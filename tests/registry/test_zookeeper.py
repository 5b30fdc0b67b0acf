"""The private standalone ZooKeeper: a real JVM child process on 127.0.0.1."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from broker.errors import ZooKeeperStartError
from broker.zookeeper import PrivateZooKeeper
from tests.broker.test_pylogd import running
from tests.conftest import ZOOKEEPER_TICK_MS, wait_until

# /proc/net/tcp{,6} local addresses of loopback: 127.0.0.1, ::ffff:127.0.0.1, ::1
LOOPBACK_HEX = {"0100007F", "0000000000000000FFFF00000100007F", "00000000000000000000000001000000"}
TCP_LISTEN = "0A"


def listening_addresses(port: int) -> set[str]:
    """The local addresses (kernel hex) of every TCP socket listening on `port`."""
    addresses = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as file:
            next(file)
            for line in file:
                fields = line.split()
                address, port_hex = fields[1].split(":")
                if int(port_hex, 16) == port and fields[3] == TCP_LISTEN:
                    addresses.add(address)
    return addresses


def process_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_private_zookeeper_answers_srvr(zookeeper: PrivateZooKeeper) -> None:
    assert zookeeper.alive
    assert "Zookeeper version: 3." in zookeeper.command("srvr")
    assert f"tickTime={ZOOKEEPER_TICK_MS}" in zookeeper.command("conf")


def test_private_zookeeper_listens_on_loopback_only(zookeeper: PrivateZooKeeper) -> None:
    assert zookeeper.connect_string == f"127.0.0.1:{zookeeper.port}"
    addresses = listening_addresses(zookeeper.port)
    assert addresses, "nothing listens on the client port"
    assert addresses <= LOOPBACK_HEX


def test_missing_jar_is_a_clear_error(tmp_path: Path) -> None:
    server = PrivateZooKeeper(tmp_path, jar=tmp_path / "no-such-zookeeper.jar")
    with pytest.raises(
        ZooKeeperStartError, match=r"run scripts/setup.*apt-get install libzookeeper-java"
    ):
        server.start()
    assert server.pid is None


def test_missing_java_is_a_clear_error(tmp_path: Path) -> None:
    server = PrivateZooKeeper(tmp_path, java="no-such-java-binary")
    with pytest.raises(ZooKeeperStartError, match=r"no-such-java-binary.*run scripts/setup"):
        server.start()
    assert server.pid is None


@pytest.mark.broker
def test_server_that_exits_during_start_is_reported_with_its_log(tmp_path: Path) -> None:
    server = PrivateZooKeeper(tmp_path, jvm_options=["-XX:+NoSuchJvmOption"])
    with pytest.raises(ZooKeeperStartError, match=r"(?s)exited with status 1.*NoSuchJvmOption"):
        server.start()
    assert server.pid is None
    assert not server.alive


@pytest.mark.broker
def test_restart_keeps_the_port_and_stop_leaves_no_process(tmp_path: Path) -> None:
    server = PrivateZooKeeper(tmp_path, tick_time_ms=ZOOKEEPER_TICK_MS)
    with server:
        first_pid, port = server.pid, server.port
        assert first_pid is not None
        server.restart()
        assert server.port == port
        assert server.pid != first_pid
        assert not process_exists(first_pid)
        assert "Zookeeper version" in server.command("srvr")
        last_pid = server.pid
        assert last_pid is not None
    assert server.pid is None
    assert not process_exists(last_pid)
    assert not listening_addresses(port)
    assert server.stop() is None  # idempotent
    assert (tmp_path / "zookeeper.log").stat().st_size > 0


@pytest.mark.broker
def test_poll_tells_a_supervisor_that_the_server_died(tmp_path: Path) -> None:
    server = PrivateZooKeeper(tmp_path, tick_time_ms=ZOOKEEPER_TICK_MS)
    with server:
        assert server.poll() is None
        pid = server.pid
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        wait_until(lambda: not server.alive, what="the killed server to be noticed")
        assert server.poll() == -signal.SIGKILL
        server.start()  # what a supervisor does next
        assert server.alive
        assert "Zookeeper version" in server.command("srvr")


def test_a_port_in_use_is_one_clear_error_naming_its_holder_and_nothing_is_launched(
    tmp_path: Path,
) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        server = PrivateZooKeeper(tmp_path, port, tick_time_ms=ZOOKEEPER_TICK_MS)
        with pytest.raises(ZooKeeperStartError) as raised:
            server.start()
    assert str(raised.value).startswith(
        f"the private ZooKeeper cannot listen on 127.0.0.1:{port}: port {port} is already in use "
        f"by pid {os.getpid()} ("
    )
    assert server.pid is None
    assert not (tmp_path / "zookeeper.log").exists()  # no JVM was launched


@pytest.mark.broker
def test_the_server_exits_when_the_process_that_started_it_is_killed(tmp_path: Path) -> None:
    starter = subprocess.Popen(
        [sys.executable, "-c", STARTER, str(tmp_path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert starter.stdout is not None
    pid, port = map(int, starter.stdout.readline().split())
    os.kill(starter.pid, signal.SIGKILL)  # no chance to stop its server
    starter.wait()
    try:
        wait_until(lambda: not running(pid), 30, "the orphaned server to exit")
        # its threads may still be closing its files for a moment after it is a zombie
        wait_until(lambda: not listening_addresses(port), 30, "its port to be free")
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


STARTER = """
import sys
from pathlib import Path
from broker.zookeeper import PrivateZooKeeper
server = PrivateZooKeeper(Path(sys.argv[1]), tick_time_ms=100)
server.start()
print(server.pid, server.port, flush=True)
sys.stdin.read()
"""
