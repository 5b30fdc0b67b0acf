"""A real pylogd in a child process, for end-to-end tests (see the `pylogd` fixture)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from broker.processes import orphan_proof
from broker.registry import Registry
from perf.pylog_runs import metrics_of
from tests.pipes import PipeLines

READY_PREFIX = "pylogd ready on "


class RunningBroker:
    """`pylogd` started with a data dir and a ZooKeeper chroot of its own; stderr goes to
    `<data_dir>/pylogd.log`. `endpoint` is the front socket's tcp address. With `zookeeper`
    empty, pylogd runs its private ZooKeeper (under <data_dir>/zookeeper)."""

    def __init__(self, data_dir: Path, zookeeper: str, chroot: str, *flags: str) -> None:
        self.data_dir = data_dir
        self.arguments = (zookeeper, chroot, *flags)
        self.log_path = data_dir / "pylogd.log"
        data_dir.mkdir(parents=True, exist_ok=True)
        self.command = [
            str(Path(sys.executable).with_name("pylogd")),
            "--broker-data-dir",
            str(data_dir),
            "--broker-port",
            "0",
            *(("--zookeeper-connect", zookeeper) if zookeeper else ()),
            "--zookeeper-chroot",
            chroot,
            "--zookeeper-session-timeout-ms",
            "2000",
            *flags,
        ]
        self.process: subprocess.Popen[str] | None = None
        self.endpoint = ""
        self.successor: RunningBroker | None = None
        """The broker `restarted` started in its place, stopped with it at a test's end."""

    def start(self, timeout: float = 30.0, own_session: bool = False) -> RunningBroker:
        """own_session: in a process group of its own, as a shell runs a command (the group
        then gets a Ctrl-C's SIGINT: os.killpg(broker.pid, SIGINT))."""
        return self.launch(own_session).wait_ready(timeout)

    def launch(self, own_session: bool = False) -> RunningBroker:
        """The process started, not waited for: `wait_ready` next (several brokers launched
        first start side by side: see start_all). It gets SIGTERM when the thread that
        launched it ends (broker.processes.orphan_proof): a test process killed, or
        interrupted past its teardown, leaves no broker running; launch from a thread that
        lasts as long as the broker should."""
        with open(self.log_path, "a") as log:
            self.process = subprocess.Popen(
                orphan_proof(self.command),  # SIGTERM when the test's process dies, killed
                stdout=subprocess.PIPE,
                stderr=log,
                text=True,
                start_new_session=own_session,
            )
        return self

    def wait_ready(self, timeout: float = 30.0) -> RunningBroker:
        """Until the launched process says it is ready (its endpoint then set); killed, and a
        RuntimeError, if it exits or stays silent `timeout` seconds."""
        assert self.process is not None and self.process.stdout is not None
        printed = PipeLines(self.process.stdout)
        deadline = time.monotonic() + timeout
        while line := printed.next_line(deadline):
            if line.startswith(READY_PREFIX):
                self.endpoint = "tcp://" + line[len(READY_PREFIX) :].strip()
                return self
        self.process.kill()
        self.process.wait()
        raise RuntimeError(f"pylogd did not start:\n{self.log_tail()}")

    def restarted(self) -> RunningBroker:
        """A new broker process on the same data dir, ZooKeeper chroot and flags, started (and
        its `successor`, so that the fixture that started this one stops it too)."""
        return self.relaunched().wait_ready()

    def relaunched(self) -> RunningBroker:
        """As `restarted`, but launched only: `wait_ready` next."""
        self.successor = RunningBroker(self.data_dir, *self.arguments)
        return self.successor.launch()

    def metrics(self) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        """Every sample of its metrics endpoint (started with --metrics-enabled true), by name
        and sorted labels, scraped over HTTP and parsed as Prometheus would."""
        return metrics_of(self.log_path)

    def log_tail(self, lines: int = 40) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def children(self) -> dict[int, str]:
        """The supervisor's child processes and their command lines (none once it is gone)."""
        pids = []  # each thread's: pylogd restarts its ZooKeeper from a thread of its own
        for task in Path(f"/proc/{self.pid}/task").glob("*"):
            with contextlib.suppress(FileNotFoundError):
                pids += (task / "children").read_text().split()
        out = {}
        for pid in pids:
            with contextlib.suppress(FileNotFoundError):
                out[int(pid)] = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
        return {pid: cmdline.decode(errors="replace") for pid, cmdline in out.items()}

    def worker_pids(self) -> list[int]:
        """Its workers: the children it forked, named pylog-worker-<index> (broker.pool)."""
        pids = []
        for pid in self.children():
            with contextlib.suppress(FileNotFoundError):
                if Path(f"/proc/{pid}/comm").read_text().startswith("pylog-worker-"):
                    pids.append(pid)
        return sorted(pids)

    def workers_open_files(self) -> list[str]:
        """What its workers' open file descriptors point at."""
        targets = []
        for pid in self.worker_pids():
            with contextlib.suppress(FileNotFoundError):  # a process or descriptor gone meanwhile
                for fd in Path(f"/proc/{pid}/fd").iterdir():
                    with contextlib.suppress(FileNotFoundError):
                        targets.append(os.readlink(fd))
        return targets

    def zookeeper_pid(self) -> int | None:
        """The private ZooKeeper's pid, if pylogd runs one."""
        return next((p for p, cmd in self.children().items() if "QuorumPeerMain" in cmd), None)

    def stop(self, timeout: float = 60.0) -> int:
        """SIGTERM, and the exit code once it has exited."""
        assert self.process is not None
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            raise

    def ctrl_c(self, timeout: float = 60.0) -> int:
        """SIGINT to its process group (started with own_session), as Ctrl-C in its terminal;
        the exit code once it has exited (the group SIGKILLed after `timeout`, and raised)."""
        assert self.process is not None
        try:
            os.killpg(self.pid, signal.SIGINT)
            return self.process.wait(timeout)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.pid, signal.SIGKILL)

    def kill(self) -> None:
        """SIGKILL the supervisor and its workers, as a crash would."""
        for pid in [*self.worker_pids(), self.pid]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        assert self.process is not None
        self.process.wait()


def start_all(brokers: list[RunningBroker], timeout: float = 30.0) -> list[RunningBroker]:
    """Start `brokers` side by side (each one's start is mostly its own imports and its
    workers' on a core of their own: three take little longer than one), every one ready."""
    for broker in brokers:
        broker.launch()
    return [broker.wait_ready(timeout) for broker in brokers]


def stop_all(brokers: list[RunningBroker], timeout: float = 60.0) -> None:
    """SIGTERM every broker still running among `brokers` and those restarted in their place
    (`successor`), all at once, then wait for each (SIGKILL after `timeout`)."""
    running = []
    for first in brokers:
        broker: RunningBroker | None = first
        while broker is not None:
            if broker.process is not None and broker.process.poll() is None:
                broker.process.send_signal(signal.SIGTERM)
                running.append(broker)
            broker = broker.successor
    for broker in running:
        broker.stop(timeout)


def broker_flags(root: Path, broker_id: int) -> tuple[str, ...]:
    """One log dir (one worker) per broker, 50 ms flushes: three brokers fit on two cores."""
    return (
        "--broker-id",
        str(broker_id),
        "--broker-log-dirs",
        str(root / f"broker-{broker_id}" / "logs"),
        "--log-flush-interval-ms",
        "50",
    )


@dataclass
class ThreeBrokers:
    """Brokers 1, 2 and 3 of one cluster (data dirs <root>/broker-<id>, broker_flags under
    `root`, one ZooKeeper chroot), and a registry on that chroot to read and write what the
    controller would. See tests/conftest.py: running_three and its fixtures."""

    root: Path
    chroot: str
    registry: Registry
    brokers: dict[int, RunningBroker]
    """By broker id: the one running now (`restart` puts a restarted one in its place)."""

    @property
    def endpoints(self) -> dict[int, str]:
        return {i: broker.endpoint for i, broker in self.brokers.items()}

    def restart(self, *broker_ids: int) -> None:
        """Brokers `broker_ids` started again (side by side) on their data dirs, after a kill,
        say, each in its place."""
        for broker_id in broker_ids:
            self.brokers[broker_id] = self.brokers[broker_id].relaunched()
        for broker_id in broker_ids:
            self.brokers[broker_id].wait_ready()

    def heal(self) -> None:
        """Restart each broker whose process has exited (a test that failed before it
        restarted the one it killed), so that the next test finds all three serving."""
        exited = [i for i, b in self.brokers.items() if b.process and b.process.poll() is not None]
        self.restart(*exited)
