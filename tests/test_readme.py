"""The README, run as written: every command of its code blocks and every Python block, in the
order a reader meets them, from a folder laid out like a clone (the checkout's files linked in,
`./data`, `./data-2`, `./data-3`, `./secure` and `./warehouse` its own), against the brokers its own
commands start.

A README that drifts from the code fails here. The few lines that are not run say why in
NOT_RUN; lines that run until stopped (brokers, `--follow`, `&` jobs, an endless loop) are
started, awaited on what they print or register, and stopped as the README says (Ctrl-C, kill),
each then checked for a clean exit. The README's ports (9092-9097, 19092, 2181, 2182) are
replaced by free ones this test chooses, in every command and Python block and in the mirror's
deploy/pylog-mirror.toml, the broker port a command implies written out first
(IMPLIED_BROKER_PORT), so that the test runs beside a broker started from the README, and beside
itself.
"""

from __future__ import annotations

import json
import os
import queue
import random
import re
import shlex
import shutil
import signal
import socket
import subprocess
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
README = ROOT / "README.md"
PORTS = (9092, 9093, 9094, 9095, 9096, 9097, 19092, 2181, 2182, 9180)
PORT_IN_TEXT = re.compile(r"(?<!\d)(" + "|".join(map(str, PORTS)) + r")(?!\d)")
# The README's broker port that its commands imply without writing it: scripts/start's front
# socket, and pylogctl's --broker ($PYLOG_BROKER). Written out, then substituted.
IMPLIED_BROKER_PORT = 9092
COMMAND_TIMEOUT_S = 180
READY_TIMEOUT_S = 120

# Lines of the README's command blocks that this test does not run, and why.
NOT_RUN = {"scripts/test": "the test command itself: it is running this test"}
# Sections whose indented blocks are not commands.
NOT_COMMANDS = {"Layout"}
# The one Python block that loops until stopped: the member joins the group "loaders" through
# its coordinator (the `group consume` members share the partitions with it), is given
# partitions, then gets Ctrl-C.
ENDLESS_PYTHON = "while True:"
PYTHON_GROUP = "loaders"


def _interruptible() -> None:
    """In a child before it runs: SIGINT's default disposition, as a terminal's foreground
    job has it, whatever this test run was started with. A run started as a background job
    (`cmd &`, nohup) ignores SIGINT, its children inherit that, and a Python program started
    so never raises KeyboardInterrupt: the README's Ctrl-C would not reach it."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@dataclass
class Block:
    section: str
    kind: str  # "shell" or "python"
    text: str


def readme_blocks(text: str) -> list[Block]:
    """The README's code blocks in order: ```python fences, and blocks indented by 4 spaces
    after a blank line (shell commands, continuation lines joined)."""
    blocks: list[Block] = []
    section = ""
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("## "):
            section = line[3:].strip()
        if line.startswith("```"):
            end = lines.index("```", i + 1)
            blocks.append(Block(section, line[3:].strip(), "\n".join(lines[i + 1 : end])))
            i = end + 1
            continue
        if line.startswith("    ") and i > 0 and not lines[i - 1].strip():
            body = []
            while i < len(lines) and (lines[i].startswith("    ") or not lines[i].strip()):
                body.append(lines[i][4:])
                i += 1
            if section not in NOT_COMMANDS:
                blocks.append(Block(section, "shell", "\n".join(body).strip()))
            continue
        i += 1
    return blocks


def commands(block: Block) -> list[str]:
    """A shell block's commands, one a line, `\\` continuations joined."""
    joined = re.sub(r"\\\n\s*", " ", block.text)
    return [line.strip() for line in joined.splitlines() if line.strip()]


def test_readme_blocks_are_found() -> None:
    blocks = readme_blocks(README.read_text())
    kinds = {block.kind for block in blocks}
    assert kinds == {"shell", "python"}, kinds
    sections = {block.section for block in blocks}
    for expected in (
        "Start a broker",
        "Operate a cluster",
        "Use pylog from Python",
        "Spark pipeline",
    ):
        assert expected in sections
    assert any(c == "scripts/start" for b in blocks if b.kind == "shell" for c in commands(b))


def test_every_port_the_readme_names_is_substituted() -> None:
    text = README.read_text()
    named = {int(port) for port in re.findall(r"(?:127\.0\.0\.1:|-port )(\d+)", text)}
    assert named <= set(PORTS), f"ports {sorted(named - set(PORTS))} are missing from PORTS"
    ports = {port: 40000 + i for i, port in enumerate(PORTS)}
    assert not PORT_IN_TEXT.search(substituted(text, ports))
    assert implied("scripts/start --zookeeper-port 2181  # terminal 1") == (
        "scripts/start --broker-port 9092 --zookeeper-port 2181  # terminal 1"
    )
    assert implied(".venv/bin/pylogd --broker-port 9093") == ".venv/bin/pylogd --broker-port 9093"


def free_ports() -> dict[int, int]:
    """A port of 127.0.0.1 free now for each of the README's, all distinct, drawn below the
    kernel's range for port 0 and outgoing connections (net.ipv4.ip_local_port_range): the
    README binds some only minutes later, and meanwhile another test's free port (a ZooKeeper
    of its own) took one once (CI, 2026-12-01)."""
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    chosen: dict[int, int] = {}
    for port in random.sample(range(max(1024, low - 10_000), low), 200):
        if len(chosen) == len(PORTS):
            break
        if port in PORTS:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
        chosen[PORTS[len(chosen)]] = port
    assert len(chosen) == len(PORTS), f"no free ports below {low}: {chosen}"
    return chosen


def substituted(text: str, ports: dict[int, int]) -> str:
    """`text` with each of the README's ports replaced by its substitute in `ports`."""
    return PORT_IN_TEXT.sub(lambda found: str(ports[int(found.group())]), text)


def implied(command: str) -> str:
    """`command` with the broker port it implies written out: scripts/start's front socket."""
    if command.startswith("scripts/start") and "--broker-port" not in command:
        return command.replace(
            "scripts/start", f"scripts/start --broker-port {IMPLIED_BROKER_PORT}", 1
        )
    return command


def _clean_env() -> dict[str, str]:
    """The environment of a new terminal: nothing of this test run's pylog or Spark settings."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYLOG_", "PYSPARK_"))}
    env.pop("SPARK_LOCAL_IP", None)
    return env


class Running:
    """A command left running, what it prints (stdout and stderr merged) read by a thread."""

    def __init__(self, command: str, process: subprocess.Popen[str]) -> None:
        self.command = command
        self.process = process
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.output: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def wait_for(self, wanted: Callable[[str], bool], timeout_s: float) -> str:
        """The first line printed that `wanted` accepts."""
        deadline = time.monotonic() + timeout_s
        while (left := deadline - time.monotonic()) > 0:
            try:
                line = self.lines.get(timeout=left)
            except queue.Empty:
                break
            if line is None:
                break
            self.output.append(line)
            if wanted(line):
                return line
        pytest.fail(f"{self.command!r} did not print what was awaited:\n{''.join(self.output)}")

    def stop(self, sig: signal.Signals | None, timeout_s: float = 60) -> str:
        """Send `sig` (Ctrl-C is SIGINT; None: it was sent already), wait for the exit, and
        return all it printed."""
        if sig is not None and self.process.poll() is None:
            self.process.send_signal(sig)
        try:
            self.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.process.kill()  # reaped, not left running after the test
            self.process.wait()
            pytest.fail(f"{self.command!r} did not exit within {timeout_s} s of its signal: killed")
        while (line := self.lines.get(timeout=timeout_s)) is not None:
            self.output.append(line)
        self.lines.put(None)  # a second stop finds the end again
        return "".join(self.output)


class Reader:
    """Runs the README's blocks in a folder laid out like a clone."""

    def __init__(self, folder: Path, ports: dict[int, int]) -> None:
        self.folder = folder
        self.ports = ports
        self.env = _clean_env()
        # pylogctl's default broker, written out (the README's commands without --broker).
        self.env["PYLOG_BROKER"] = f"tcp://127.0.0.1:{ports[IMPLIED_BROKER_PORT]}"
        self.servers: list[Running] = []
        self.jobs: list[Running] = []  # the shell's `&` jobs: %1 is jobs[0]
        self.members: list[Running] = []  # the Python group members

    def spawn(self, argv: list[str]) -> Running:
        """`argv` started as from a terminal, to be stopped by Ctrl-C (SIGINT) later."""
        process = subprocess.Popen(
            argv,
            cwd=self.folder,
            env=self.env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            preexec_fn=_interruptible,
        )
        return Running(" ".join(argv), process)

    def run(self, argv: list[str], what: str, stdin: str | None = None) -> str:
        done = subprocess.run(
            argv,
            cwd=self.folder,
            env=self.env,
            input=stdin,
            capture_output=True,
            text=True,
            timeout=COMMAND_TIMEOUT_S,
        )
        assert done.returncode == 0, (
            f"README {what} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
        )
        return done.stdout

    def shell(self, command: str) -> None:
        if command in NOT_RUN:
            return
        command = substituted(implied(command), self.ports)
        words = shlex.split(command, comments=True)
        if words[0] in ("scripts/start", ".venv/bin/pylogd"):
            self.start_broker(command)
        elif words[0] == "kill":
            for job in words[1:]:
                self.jobs[int(job.removeprefix("%")) - 1].process.send_signal(signal.SIGTERM)
            for job in words[1:]:  # what a reader does next needs them gone
                running = self.jobs[int(job.removeprefix("%")) - 1]
                output = running.stop(None)
                assert running.process.returncode == 0, f"{running.command}:\n{output}"
        elif command.split("#")[0].rstrip().endswith("&"):
            background = command.split("#")[0].rstrip().removesuffix("&")
            self.jobs.append(self.spawn(["bash", "-c", background]))
            if words[0].endswith("pylog-console"):
                self.open_console(self.jobs[-1])
        elif "--follow" in words:
            follow = self.spawn(["bash", "-c", command])
            follow.wait_for(lambda line: line.strip() != "", COMMAND_TIMEOUT_S)
            output = follow.stop(signal.SIGINT)  # Ctrl-C ends any command with exit 0
            assert follow.process.returncode == 0, f"{command}:\n{output}"
        else:
            self.run(["bash", "-o", "pipefail", "-c", command], repr(command))

    def open_console(self, console: Running) -> None:
        """Wait for pylog-console to serve, then open its cluster page as a browser would:
        the three brokers the README started, each up."""
        ready = console.wait_for(lambda line: "pylog-console ready on" in line, READY_TIMEOUT_S)
        url = ready.split("ready on", 1)[1].strip()
        with urllib.request.urlopen(url + "/", timeout=COMMAND_TIMEOUT_S) as page:
            text = page.read().decode()
        assert page.status == 200 and text.count('<td class="state">up</td>') == 3, text

    def start_broker(self, command: str) -> None:
        if command.startswith("scripts/start"):
            # One scripts/start at a time: the README stops the first session's broker (Ctrl-C,
            # which must flush and exit 0) before it starts the next.
            for server in [s for s in self.servers if "scripts/start" in s.command]:
                output = server.stop(signal.SIGINT)
                assert server.process.returncode == 0, output
                self.servers.remove(server)
        server = self.spawn(["bash", "-c", "exec " + command.split("#")[0].strip()])
        self.servers.append(server)
        server.wait_for(lambda line: "pylogd ready on" in line, READY_TIMEOUT_S)

    def python(self, code: str) -> None:
        python = str(self.folder / ".venv" / "bin" / "python")
        code = substituted(code, self.ports)
        if ENDLESS_PYTHON not in code:
            self.run([python, "-"], "Python block", stdin=code)
            return
        before = self.group_members()
        member = self.spawn([python, "-c", code])
        self.members.append(member)  # stopped by stop_all if this fails on the way
        deadline = time.monotonic() + COMMAND_TIMEOUT_S
        while self.group_members() <= before:  # it joined the group and was given partitions
            assert member.process.poll() is None, member.stop(signal.SIGINT)
            assert time.monotonic() < deadline, "the group member never joined"
            time.sleep(0.2)
        output = member.stop(signal.SIGINT)
        # Ctrl-C in a plain Python script: KeyboardInterrupt, and no other error.
        assert output.rstrip().endswith("KeyboardInterrupt"), output
        assert output.count("Traceback") == 1, output

    def group_members(self) -> set[str]:
        pylogctl = str(self.folder / ".venv" / "bin" / "pylogctl")
        described = self.run(
            [pylogctl, "group", "describe", PYTHON_GROUP, "events", "--json"], "describe"
        )
        rows = [json.loads(line) for line in described.splitlines()]
        return {row["owner"] for row in rows if row.get("owner")}

    def stop_all(self) -> list[str]:
        """Ctrl-C every broker, job and group member still running (killed if it does not
        end); what each that did not exit 0 printed."""
        failed = []
        for running in [*self.members, *self.jobs, *reversed(self.servers)]:
            if running.process.poll() is None or running in self.servers:
                try:
                    output = running.stop(signal.SIGINT)
                except pytest.fail.Exception as killed:  # reaped; the others are stopped too
                    failed.append(str(killed))
                    continue
                if running.process.returncode != 0:
                    failed.append(
                        f"{running.command} exited {running.process.returncode}:\n{output}"
                    )
        return failed


@pytest.fixture
def ports() -> dict[int, int]:
    return free_ports()


@pytest.fixture
def clone(tmp_path: Path, ports: dict[int, int]) -> Iterator[Path]:
    """A folder that looks like a clone: every top-level entry of the checkout linked in, but
    none of what the README's commands write (data, data-2, data-3, data-target, secure,
    warehouse), and deploy/pylog-mirror.toml with the ports substituted."""
    folder = tmp_path / "pylog"
    folder.mkdir()
    for entry in ROOT.iterdir():
        if entry.name not in (
            "data",
            "data-2",
            "data-3",
            "data-target",
            "secure",
            "warehouse",
            ".git",
            "deploy",
        ):
            (folder / entry.name).symlink_to(entry)
    (folder / "deploy").mkdir()
    for entry in (ROOT / "deploy").iterdir():
        if entry.name == "pylog-mirror.toml":
            (folder / "deploy" / entry.name).write_text(substituted(entry.read_text(), ports))
        else:
            (folder / "deploy" / entry.name).symlink_to(entry)
    yield folder


@pytest.mark.cluster  # the README starts brokers of three clusters: scheduled early
@pytest.mark.slow  # ~3-4 min: three clusters, three Spark programs, one after another
def test_readme_runs_as_written(clone: Path, ports: dict[int, int]) -> None:
    reader = Reader(clone, ports)
    try:
        for block in readme_blocks(README.read_text()):
            if block.kind == "python":
                reader.python(block.text)
            else:
                for command in commands(block):
                    reader.shell(command)
    finally:
        failed = reader.stop_all()
    assert not failed, "\n".join(failed)
    written = sorted(
        p.name + "/" * p.is_dir()
        for p in clone.iterdir()
        if not p.is_symlink() and p.name != "deploy"
    )
    assert written, "the README's commands wrote nothing at the top of the clone?"
    for name in written:  # what a user's `git status` would list after pasting the README
        ignored = subprocess.run(
            ["git", "check-ignore", "--quiet", "--no-index", name], cwd=ROOT, timeout=30
        )
        assert ignored.returncode == 0, f"{name}, written by the README, is not in .gitignore"


VENV_SIZE = re.compile(r"its `broker` extra only:\s+(\d+) MB")
"""Where the README says how much `scripts/start` puts in `.venv`."""


@pytest.mark.slow  # a pip install from the index: a minute or two
@pytest.mark.broker  # it starts scripts/setup
def test_the_venv_size_the_readme_gives_is_what_scripts_start_installs(tmp_path: Path) -> None:
    said = VENV_SIZE.search(" ".join(README.read_text().split()))
    assert said, "the README no longer says how big scripts/start's .venv is"
    checkout = tmp_path / "pylog"
    left_out = ("__pycache__", "*.so", "*.egg-info", "build")
    top_level = (".git", ".venv", "data*", "warehouse", "secure", ".*_cache", ".hypothesis")
    shutil.copytree(ROOT, checkout, ignore=shutil.ignore_patterns(*left_out, *top_level))
    setup = subprocess.run(
        ["scripts/setup", "--broker-only"],
        cwd=checkout,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert setup.returncode == 0, setup.stdout + setup.stderr
    used = sum(p.lstat().st_blocks * 512 for p in (checkout / ".venv").rglob("*"))  # as du
    megabytes = used / 1e6
    assert abs(megabytes - int(said.group(1))) <= 0.15 * megabytes, f"{megabytes:.0f} MB"
