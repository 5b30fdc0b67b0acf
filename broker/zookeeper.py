"""A private standalone ZooKeeper server, run as a child process.

A single-machine pylog needs no ZooKeeper set up by hand: when no `zookeeper.connect` is
configured, pylogd runs Debian's ZooKeeper 3.8 through this class, and the registry tests do
the same (scripts/setup installs libzookeeper-java, which holds the server jar, and a headless
JRE). Nothing starts a service; the server is the plain JVM command

    java -cp CONF:/usr/share/java/zookeeper.jar[:slf4j-simple.jar] \\
        org.apache.zookeeper.server.quorum.QuorumPeerMain CONF/zoo.cfg

Layout under the directory it is given (created if missing):

    <directory>/conf/zoo.cfg                    written on every start
    <directory>/conf/simplelogger.properties    slf4j-simple log format
    <directory>/data/                           ZooKeeper's dataDir (version-2/ snapshots, logs)
    <directory>/zookeeper.log                   the server's stdout and stderr, appended

The server listens on 127.0.0.1 only (clientPortAddress); the admin HTTP server is off (it
would take :8080); every four-letter command is allowed (kazoo uses `envi`, readiness uses
`srvr`). A port of 0 or None picks a free one on the first start; restarts keep it, so clients
reconnect to the same address. The data directory survives stop and restart: sessions and
persistent nodes come back with the server, and a session whose client stays away longer than
its timeout expires.

Crash behaviour: the server writes its transaction log before it answers, so a killed server
loses nothing it acknowledged. The JVM is started through broker.processes.orphan_proof: if
this (parent) process dies without calling stop(), even by SIGKILL, the kernel sends the JVM
SIGTERM, so no server is left behind holding the port and the data directory; and it runs in
a process group of its own, so that a Ctrl-C meant for pylogd does not stop it before pylogd
has left the registry (the next start would find the old session's nodes). The kernel does
so when the thread that started it ends: call start() from a thread that lasts as long as the
process (pylogd's main thread, or the thread that restarts it, which ends after stop()).
`poll()` and `alive` tell a supervisor that the child died, `start()` runs it again. Not safe
to share between threads without a lock.

Ports: start() first binds the port itself, as the JVM will: if that fails (another program,
or a server left there by an earlier pylogd), it raises ZooKeeperStartError naming the port and
its holder, in one line, and launches nothing. A server that answers is taken for this one only
if this process's child is what listens on the port.

This module runs a program only; the ZooKeeper client side (kazoo) lives in broker.registry.
"""

from __future__ import annotations

import errno
import logging
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path
from typing import IO

from broker.errors import ZooKeeperStartError
from broker.lifecycle import Running
from broker.processes import listening_pids, orphan_proof, port_holder

__all__ = [
    "DEFAULT_JVM_OPTIONS",
    "SLF4J_SIMPLE_JAR",
    "ZOOKEEPER_JAR",
    "PrivateZooKeeper",
    "free_port",
]

log = logging.getLogger(__name__)

ZOOKEEPER_JAR = Path("/usr/share/java/zookeeper.jar")
"""From Debian's libzookeeper-java; its manifest Class-Path names every jar it needs."""

SLF4J_SIMPLE_JAR = Path("/usr/share/java/slf4j-simple.jar")
"""Debian's libslf4j-java: without a binding ZooKeeper logs nothing at all."""

MAIN_CLASS = "org.apache.zookeeper.server.quorum.QuorumPeerMain"

DEFAULT_JVM_OPTIONS: tuple[str, ...] = (
    "-Xmx512m",
    "-XX:+UseSerialGC",  # two cores: no parallel GC threads for a small heap
    "-XX:TieredStopAtLevel=1",  # C1 only: ready in ~1.1 s instead of ~1.9 s
    "-XX:+ExitOnOutOfMemoryError",  # die and be restarted rather than limp on
)

_LOGGER_PROPERTIES = """\
org.slf4j.simpleLogger.defaultLogLevel=info
org.slf4j.simpleLogger.showDateTime=true
org.slf4j.simpleLogger.dateTimeFormat=yyyy-MM-dd HH:mm:ss.SSS
"""


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free on `host` a moment ago (the kernel's pick for port 0)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


class PrivateZooKeeper(Running):
    """One standalone ZooKeeper server on 127.0.0.1, run as a child process.

    `tick_time_ms` is ZooKeeper's tickTime: session timeouts are clamped to 2-20 ticks, so a
    test that wants sessions of a second or two uses 100-200 ms; 2000 ms is the production
    default (sessions of 4-40 s). `port` 0 or None picks a free port on the first start.
    """

    def __init__(
        self,
        directory: Path,
        port: int | None = None,
        *,
        tick_time_ms: int = 2000,
        java: str = "java",
        jar: Path = ZOOKEEPER_JAR,
        log_jars: Sequence[Path] = (SLF4J_SIMPLE_JAR,),
        jvm_options: Sequence[str] = DEFAULT_JVM_OPTIONS,
        start_timeout_s: float = 30.0,
        stop_timeout_s: float = 10.0,
    ) -> None:
        if tick_time_ms <= 0:
            raise ValueError(f"tick_time_ms must be positive, not {tick_time_ms}")
        self.directory = Path(directory).absolute()
        self.conf_dir = self.directory / "conf"
        self.data_dir = self.directory / "data"
        self.log_path = self.directory / "zookeeper.log"
        self.tick_time_ms = tick_time_ms
        self.java = java
        self.jar = Path(jar)
        self.log_jars = tuple(Path(j) for j in log_jars)
        self.jvm_options = tuple(jvm_options)
        self.start_timeout_s = start_timeout_s
        self.stop_timeout_s = stop_timeout_s
        self._port: int | None = port or None
        self._process: subprocess.Popen[bytes] | None = None
        self._log_file: IO[bytes] | None = None

    # -- what it is --------------------------------------------------------------------------

    @property
    def port(self) -> int:
        """The client port; known once started (or given to the constructor)."""
        if self._port is None:
            raise RuntimeError("the private ZooKeeper has not been started: no port yet")
        return self._port

    @property
    def connect_string(self) -> str:
        """What a ZooKeeper client connects to: "127.0.0.1:PORT"."""
        return f"127.0.0.1:{self.port}"

    @property
    def pid(self) -> int | None:
        """The server's process id while it runs (or until its death is noticed)."""
        return self._process.pid if self._process is not None else None

    @property
    def alive(self) -> bool:
        """Whether the server process runs now."""
        return self._process is not None and self._process.poll() is None

    def poll(self) -> int | None:
        """The exit status if the server process has ended, None while it runs.

        Raises RuntimeError when it was never started (there is nothing to poll)."""
        if self._process is None:
            raise RuntimeError("the private ZooKeeper has not been started")
        return self._process.poll()

    def __repr__(self) -> str:
        state = "running" if self.alive else "stopped"
        return f"<PrivateZooKeeper {self.directory} port={self._port} {state}>"

    # -- lifetime ----------------------------------------------------------------------------

    def start(self) -> None:
        """Write the configuration, run the server and return once it answers `srvr`.

        Raises ZooKeeperStartError (after stopping what it started) when java or the jar is
        missing, when the port is in use (naming its holder), when the server exits, or when
        it does not answer within start_timeout_s. A port picked here that turns out to be
        taken is replaced by another one, twice."""
        if self.alive:
            return
        if self._process is not None:
            self._forget_process()  # it died: start again
        self._check_installed()
        pick = self._port is None
        attempts = 3 if pick else 1
        for attempt in range(1, attempts + 1):
            port = free_port() if pick else self.port
            try:
                self._start_on(port)
            except ZooKeeperStartError as error:
                if pick:
                    self._port = None
                if pick and attempt < attempts and "already in use" in str(error):
                    log.warning("port %d was taken before ZooKeeper bound it; another one", port)
                    continue
                raise
            return

    def stop(self) -> int | None:
        """Stop the server: SIGTERM, wait up to stop_timeout_s, then SIGKILL.

        Returns its exit status, or None if it was not running. Idempotent."""
        process = self._process
        if process is None:
            return None
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(self.stop_timeout_s)
            except subprocess.TimeoutExpired:
                log.warning(
                    "ZooKeeper pid %d ignored SIGTERM for %.0f s: killing it",
                    process.pid,
                    self.stop_timeout_s,
                )
                process.kill()
                process.wait()
        self._forget_process()
        return process.returncode

    def kill(self) -> None:
        """Kill the server at once (SIGKILL), as a crash would; for fault-injection tests."""
        process = self._process
        if process is None:
            return
        if process.poll() is None:
            process.kill()
            process.wait()
        self._forget_process()

    def restart(self) -> None:
        """Stop and start again on the same port and data directory."""
        self.stop()
        self.start()

    # -- talking to it -----------------------------------------------------------------------

    def command(self, word: str, timeout: float = 2.0) -> str:
        """Send a four-letter command ("srvr", "conf", "mntr", ...) and return the answer.

        Raises OSError when the server cannot be reached."""
        if len(word) != 4:
            raise ValueError(f"a four-letter command has four letters, not {word!r}")
        with socket.create_connection(("127.0.0.1", self.port), timeout=timeout) as sock:
            sock.sendall(word.encode("ascii"))
            chunks = []
            while chunk := sock.recv(65536):
                chunks.append(chunk)
        return b"".join(chunks).decode("utf-8", "replace")

    def log_tail(self, lines: int = 30) -> str:
        """The last lines of the server's log ("" when there is no log yet)."""
        try:
            with self.log_path.open("rb") as file:
                file.seek(0, os.SEEK_END)
                file.seek(max(0, file.tell() - 64 * 1024))
                text = file.read().decode("utf-8", "replace")
        except FileNotFoundError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    # -- steps -------------------------------------------------------------------------------

    def _check_installed(self) -> None:
        if shutil.which(self.java) is None:
            raise ZooKeeperStartError(
                f"cannot run the private ZooKeeper: {self.java!r} was not found on PATH; "
                "run scripts/setup (or: apt-get install default-jre-headless)"
            )
        if not self.jar.is_file():
            raise ZooKeeperStartError(
                f"cannot run the private ZooKeeper: {self.jar} does not exist; "
                "run scripts/setup (or: apt-get install libzookeeper-java)"
            )

    def _write_config(self, port: int) -> Path:
        self.conf_dir.mkdir(parents=True, exist_ok=True)
        self.data_dir.mkdir(parents=True, exist_ok=True)
        config = "\n".join(
            [
                "# Written by pylog (broker/zookeeper.py) on every start: edits are lost.",
                f"tickTime={self.tick_time_ms}",
                f"dataDir={self.data_dir}",
                f"clientPort={port}",
                "clientPortAddress=127.0.0.1",
                "admin.enableServer=false",
                "4lw.commands.whitelist=*",
                # every client of a private server comes from 127.0.0.1: no per-address limit
                "maxClientCnxns=0",
                # keep the data directory from growing without end
                "autopurge.snapRetainCount=3",
                "autopurge.purgeInterval=1",
                "",
            ]
        )
        path = self.conf_dir / "zoo.cfg"
        path.write_text(config)
        (self.conf_dir / "simplelogger.properties").write_text(_LOGGER_PROPERTIES)
        return path

    def _command_line(self, config: Path) -> list[str]:
        classpath = [str(self.conf_dir), str(self.jar)]
        classpath += [str(jar) for jar in self.log_jars if jar.is_file()]
        return [
            self.java,
            *self.jvm_options,
            "-cp",
            ":".join(classpath),
            MAIN_CLASS,
            str(config),
        ]

    def _check_port(self, port: int) -> None:
        """Bind the port as the JVM will (SO_REUSEADDR): a port in use would kill it, and a
        ZooKeeper left listening there would answer in its place."""
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind(("127.0.0.1", port))
            except OSError as error:
                if error.errno == errno.EADDRINUSE:
                    raise self._port_in_use(port) from None
                raise ZooKeeperStartError(
                    f"the private ZooKeeper cannot listen on 127.0.0.1:{port}: {error}"
                ) from error

    @staticmethod
    def _port_in_use(port: int) -> ZooKeeperStartError:
        return ZooKeeperStartError(
            f"the private ZooKeeper cannot listen on 127.0.0.1:{port}: port {port} is "
            f"already in use by {port_holder(port)}"
        )

    def _start_on(self, port: int) -> None:
        self._check_port(port)
        self._port = port
        config = self._write_config(port)
        command = orphan_proof(self._command_line(config))
        self._log_file = self.log_path.open("ab")
        self._log_file.write(f"=== pylog: starting {' '.join(command)}\n".encode())
        self._log_file.flush()
        log.info("starting private ZooKeeper on 127.0.0.1:%d in %s", port, self.directory)
        try:
            self._process = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=self._log_file,
                stderr=subprocess.STDOUT,
                cwd=self.directory,
                # A group of its own: a Ctrl-C in pylogd's terminal reaches pylogd's group
                # only, and pylogd stops ZooKeeper once it has left the registry (it still
                # dies with pylogd: orphan_proof).
                process_group=0,
            )
        except OSError as error:
            self._forget_process()
            raise ZooKeeperStartError(f"cannot run {self.java}: {error}") from error
        try:
            self._wait_ready()
        except BaseException:
            self.kill()
            raise

    def _wait_ready(self) -> None:
        process = self._process
        assert process is not None
        started = time.monotonic()
        deadline = started + self.start_timeout_s
        while True:
            status = process.poll()
            if status is not None:
                raise ZooKeeperStartError(
                    f"the private ZooKeeper exited with status {status} during start-up "
                    f"(port {self._port}, log {self.log_path}):\n{self.log_tail()}"
                )
            try:
                if "Zookeeper version" in self.command("srvr", timeout=1.0):
                    break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise ZooKeeperStartError(
                    f"the private ZooKeeper did not answer srvr on port {self._port} within "
                    f"{self.start_timeout_s:.0f} s (log {self.log_path}):\n{self.log_tail()}"
                )
            time.sleep(0.05)
        # Another process could have taken the port since it was checked: make sure the
        # server that answered is this one.
        if process.pid not in listening_pids(self.port):
            raise self._port_in_use(self.port)
        log.info(
            "private ZooKeeper pid %d ready on 127.0.0.1:%d in %.2f s",
            process.pid,
            self._port,
            time.monotonic() - started,
        )

    def _forget_process(self) -> None:
        self._process = None
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None
