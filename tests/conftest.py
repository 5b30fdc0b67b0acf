"""Fixtures shared by the whole test suite."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
import uuid
import warnings
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import zmq
from hypothesis import settings

from broker.client.connection import Connection
from broker.registry import Registry
from broker.zookeeper import PrivateZooKeeper
from tests.pylogd import RunningBroker, ThreeBrokers, broker_flags, start_all, stop_all

settings.register_profile("deterministic", derandomize=True, database=None)
settings.register_profile("explore", derandomize=False)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "deterministic"))
"""Property tests draw the same examples at every run (a run is deterministic, as the suite's
standard asks); HYPOTHESIS_PROFILE=explore draws new ones, to look for failures."""

_LEFT_TO_THE_COLLECTOR: list[zmq.Context[Any]] = []


def _keep_unterminated(context: zmq.Context[Any]) -> None:
    """zmq.Context.__del__ for the test run. A test that fails leaves its clients to the
    garbage collector (its traceback's frames hold them in a cycle), and CPython clears a
    context's weak set of sockets before finalizers run: pyzmq's __del__ then closes no socket
    and terminates the context, which waits for ever for the sockets collected with it. The
    run hung so, instead of reporting the failure. Such a context is kept instead, never
    terminated (pyzmq does not at exit), its sockets closed by their own finalizers."""
    if not context._shadow and not context.closed:
        _LEFT_TO_THE_COLLECTOR.append(context)
        warnings.warn(
            f"{context!r} was left to the garbage collector", ResourceWarning, stacklevel=2
        )


zmq.Context.__del__ = _keep_unterminated  # type: ignore[method-assign]


# -- tiers and where xdist runs each test ---------------------------------------------------

TIERS = ("unit", "broker", "cluster", "spark")
"""The markers of the suite's tiers, each test in exactly one, given by the fixtures it uses
(see `tier`) unless its module says otherwise (`pytestmark = pytest.mark.broker`)."""

TIERS_HEAVIEST_FIRST = ("spark", "cluster", "broker", "unit")

CLUSTER_FIXTURES = frozenset(
    {"three_brokers", "module_three_brokers", "own_three_brokers", "curve_cluster", "cluster"}
)
"""Fixtures that start several brokers: tests/cluster's three, the CLI's, Curve's."""

PROCESS_FIXTURES = frozenset(
    {"zookeeper", "make_pylogd", "clusters", "make_mirror", "console", "browser"}
)
"""Fixtures that start a process: ZooKeeper (every broker fixture uses it), a broker or a
mirror of their own ZooKeeper, pylog-console and the browser of its tests (tests/console)."""


def tier(fixtures: Iterable[str]) -> str:
    """A test's tier from the names of the fixtures it uses (all of them, those fixtures use
    included): `spark` with a SparkSession, `cluster` with several brokers, `broker` with any
    process, `unit` with none."""
    names = set(fixtures)
    if "spark" in names:
        return "spark"
    if names & CLUSTER_FIXTURES:
        return "cluster"
    if names & PROCESS_FIXTURES:
        return "broker"
    return "unit"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "unit: starts no process (scripts/test --fast runs these)")
    config.addinivalue_line("markers", "broker: starts processes: ZooKeeper, pylogd, tools")
    config.addinivalue_line("markers", "cluster: starts several brokers of one cluster")
    config.addinivalue_line("markers", "spark: uses the session's SparkSession")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Give each test its tier marker, and order the tests heaviest tier first (stably: a
    module's tests of one tier stay together): xdist hands out work in this order, and
    Spark's minutes on one worker must not start last."""
    for item in items:
        marked = {mark.name for mark in item.iter_markers()} & set(TIERS)
        if len(marked) > 1:
            raise pytest.UsageError(f"{item.nodeid} is in several tiers: {sorted(marked)}")
        if not marked:
            item.add_marker(tier(getattr(item, "fixturenames", ())))
    items.sort(key=lambda item: TIERS_HEAVIEST_FIRST.index(tier_of(item)))


SPARK_TESTS = "tests/pipeline/"
"""Where the tests of the Spark tier are (with a few of the pipeline's that need no Spark)."""


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """With `--dist loadscope` (scripts/test): xdist's scheduling by module (so that a module's
    shared broker or brokers start once), except that the Spark tests are one scope, so that
    one worker starts a SparkSession (10-25 s and a JVM of 1 GiB each), not every worker."""
    if config.getvalue("dist") != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class SparkOnOneWorker(LoadScopeScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::", 1)[0]
            return SPARK_TESTS if module.startswith(SPARK_TESTS) else module

    return SparkOnOneWorker(config, log)


def tier_of(item: pytest.Item) -> str:
    return next(mark.name for mark in item.iter_markers() if mark.name in TIERS)


@pytest.fixture(autouse=True)
def _unit_tests_start_no_process(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A test of the unit tier that starts a process fails, naming the command: its module is
    to say its tier (`pytestmark = pytest.mark.broker`), so that the unit tier stays fast."""
    if request.node.get_closest_marker("unit") is None:
        return
    nodeid = request.node.nodeid

    def refused(self: subprocess.Popen[Any], args: Any, *rest: Any, **options: Any) -> None:
        raise AssertionError(
            f"{nodeid} is in the unit tier but starts a process ({args!r}): mark its module "
            "pytestmark = pytest.mark.broker"
        )

    monkeypatch.setattr(subprocess.Popen, "__init__", refused)


# -- no process outlives the run ------------------------------------------------------------

RUN_VARIABLE = "TEST_RUN_OF_PYLOG"
"""Set to an id of this test process's own when its first test starts: every process its tests
start inherits it (tests/test_readme.py's clean environment drops PYLOG_* only), orphans too, so
that the end of the session finds those still running however they were started."""

LEFT_RUNNING_GRACE_S = 5.0
"""How long the end of the session waits for processes that are still exiting."""


def processes_of_this_run() -> dict[int, str]:
    """pid -> command line of each running process of this run (see process_of_this_run)."""
    found: dict[int, str] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            command = process_of_this_run(int(entry.name))
            if command is not None:
                found[int(entry.name)] = command
    return found


def process_of_this_run(pid: int) -> str | None:
    """The command line of process `pid` if it runs with this process's RUN_VARIABLE or is
    this process's own running child, else None. A child can be caught in its exec: Popen
    returns once the old program is gone, before the kernel has set the new one's environment
    (/proc/<pid>/environ reads empty until then: seen after a third of Popen calls here)."""
    wanted = f"{RUN_VARIABLE}={os.environ[RUN_VARIABLE]}".encode()
    entry = Path(f"/proc/{pid}")
    try:
        state, parent = (entry / "stat").read_text().rpartition(")")[2].split()[:2]
        running_child = int(parent) == os.getpid() and state != "Z"
        if running_child or wanted in (entry / "environ").read_bytes().split(b"\0"):
            return (
                (entry / "cmdline")
                .read_bytes()
                .replace(b"\0", b" ")
                .decode(errors="replace")
                .strip()
            )
    except OSError:  # ended meanwhile, or not ours to read
        pass
    return None


@pytest.fixture(scope="session", autouse=True)
def _no_process_outlives_the_run() -> Iterator[None]:
    """At the end of the session (after every other fixture's end: this one starts first),
    kill (SIGKILL) each process the tests started that is still running, and fail naming
    them: a test stops what it starts, even when it fails, and a process left behind holds
    ports, files and the next run's CPU. Each xdist worker checks its own."""
    os.environ[RUN_VARIABLE] = uuid.uuid4().hex
    yield
    deadline = time.monotonic() + LEFT_RUNNING_GRACE_S
    while (left := processes_of_this_run()) and time.monotonic() < deadline:
        time.sleep(0.1)
    for pid in left:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    if left:
        named = "\n".join(f"  {pid}: {command[:300]}" for pid, command in sorted(left.items()))
        pytest.fail(f"killed {len(left)} process(es) the tests left running:\n{named}")


def synced_paths(monkeypatch: pytest.MonkeyPatch, owner: object, name: str) -> list[str]:
    """The paths of the descriptors `owner.name` (os.fdatasync, say: a function of a
    descriptor) is called with from now on, read as each call is made (the calls go through)."""
    paths: list[str] = []
    real = getattr(owner, name)

    def spy(fd: int) -> None:
        paths.append(os.readlink(f"/proc/self/fd/{fd}"))
        real(fd)

    monkeypatch.setattr(owner, name, spy)
    return paths


@dataclass
class FakeClock:
    """A clock that moves only when a test says so (see broker.clock.Clock)."""

    now_monotonic: float = 1000.0
    now_time: float = 1_700_000_000.0

    def monotonic(self) -> float:
        return self.now_monotonic

    def time(self) -> float:
        return self.now_time

    def advance(self, seconds: float) -> None:
        self.now_monotonic += seconds
        self.now_time += seconds

    def sleep(self, seconds: float) -> None:
        """A sleep that waits for nothing: the clock moves on by `seconds`."""
        self.advance(seconds)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


# -- ZooKeeper and the registry: a real server, no mocks ------------------------------------

ZOOKEEPER_TICK_MS = 100
"""tickTime of the test ZooKeeper: session timeouts are clamped to 0.2-2 s."""

SESSION_TIMEOUT_S = 2.0
REQUEST_TIMEOUT_S = 2.0


WAIT_UNTIL_S = 60.0
"""How long wait_until waits by default: a bound for a condition a busy machine is slow to
make true, not a measure of speed (issue 53, 10: a 10 s slice failed a test under load)."""


def wait_until(
    condition: Callable[[], object], timeout: float = WAIT_UNTIL_S, what: str = ""
) -> None:
    """Poll `condition` until it is true; fail the test after `timeout` seconds.

    For conditions that another thread or process makes true (a reconnection, a watch): the
    deadline bounds the wait, the condition decides, no sleep is trusted for correctness."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout} s waiting for {what or condition}")
        time.sleep(0.01)


def reply_waiting(connection: Connection, timeout_s: float) -> bool:
    """Whether a reply waits on `connection`'s pipelined channel within `timeout_s`, left
    unread."""
    return connection.transport.wait_any([connection.pipelined_channel], timeout_s) is not None


@pytest.fixture(scope="session")
def zookeeper(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrivateZooKeeper]:
    """One private ZooKeeper for the whole test session, on a free port of 127.0.0.1."""
    server = PrivateZooKeeper(tmp_path_factory.mktemp("zookeeper"), tick_time_ms=ZOOKEEPER_TICK_MS)
    with server:
        yield server


@pytest.fixture
def registry_chroot() -> str:
    """A chroot of this test's own, so that tests never see each other's nodes."""
    return f"/test-{uuid.uuid4().hex[:16]}"


@pytest.fixture
def make_registry(
    zookeeper: PrivateZooKeeper, registry_chroot: str
) -> Iterator[Callable[..., Registry]]:
    """Start registries on this test's chroot (several act as several brokers); all are
    stopped when the test ends. Keyword arguments go to Registry (`of`: a subclass of it to
    start instead)."""
    started: list[Registry] = []

    def make(of: type[Registry] = Registry, **options: Any) -> Registry:
        options.setdefault("session_timeout_s", SESSION_TIMEOUT_S)
        options.setdefault("request_timeout_s", REQUEST_TIMEOUT_S)
        registry = of(zookeeper.connect_string, registry_chroot, **options)
        started.append(registry)
        registry.start(timeout=10)
        return registry

    yield make
    for registry in started:
        registry.stop()


@pytest.fixture
def registry(make_registry: Callable[..., Registry]) -> Registry:
    """A started registry on this test's own chroot."""
    return make_registry()


@pytest.fixture
def make_pylogd(
    zookeeper: PrivateZooKeeper, tmp_path: Path, registry_chroot: str
) -> Iterator[Callable[..., RunningBroker]]:
    session_zookeeper = zookeeper
    """Start real pylogd processes against the session's ZooKeeper, each under its own data
    dir; all are stopped (and their logs shown on failure) at the end of the test."""
    started: list[RunningBroker] = []

    def make(*flags: str, name: str = "broker", zookeeper: str | None = None) -> RunningBroker:
        """zookeeper: the ensemble (default: the session's); "" for pylogd's private one."""
        connect = session_zookeeper.connect_string if zookeeper is None else zookeeper
        broker = RunningBroker(tmp_path / name, connect, registry_chroot, *flags)
        started.append(broker)
        return broker.start()

    yield make
    for first in started:
        broker: RunningBroker | None = first
        while broker is not None:  # and each restarted in its place
            if broker.process is not None and broker.process.poll() is None:
                broker.stop()
            broker = broker.successor
        print(f"--- {first.log_path}:\n{first.log_tail()}")


def single_box_flags(root: Path) -> tuple[str, ...]:
    """The test brokers' flags: two log dirs under `root` (so two workers), 50 ms flushes."""
    return (
        "--broker-log-dirs",
        f"{root / 'logs-a'},{root / 'logs-b'}",
        "--log-flush-interval-ms",
        "50",
    )


@pytest.fixture
def pylogd(make_pylogd: Callable[..., RunningBroker], tmp_path: Path) -> RunningBroker:
    """One running broker of this test's own, with single_box_flags."""
    return make_pylogd(*single_box_flags(tmp_path))


@pytest.fixture(scope="module")
def broker(
    request: pytest.FixtureRequest,
    zookeeper: PrivateZooKeeper,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[RunningBroker]:
    """A running broker shared by the tests of one module (starting one takes seconds), with
    single_box_flags, the module's BROKER_FLAGS if it has any, and a ZooKeeper chroot of its
    own; each test uses topics of its own (see `topic`). Tests that stop, kill or restart a
    broker use `pylogd` instead."""
    data_dir = tmp_path_factory.mktemp("pylogd")
    running = RunningBroker(
        data_dir / "broker",
        zookeeper.connect_string,
        f"/test-{uuid.uuid4().hex[:16]}",
        *single_box_flags(data_dir),
        *getattr(request.module, "BROKER_FLAGS", ()),
    )
    running.start()
    yield running
    running.stop()
    print(f"--- {running.log_path}:\n{running.log_tail()}")


@pytest.fixture
def topic(request: pytest.FixtureRequest) -> str:
    """A topic name of this test's own (not created)."""
    return f"{request.node.name[:40]}-{uuid.uuid4().hex[:8]}".replace("[", "-").replace("]", "")


# -- three brokers of one cluster ------------------------------------------------------------


@contextlib.contextmanager
def running_three(
    zookeeper: PrivateZooKeeper, root: Path, chroot: str, *flags: str
) -> Iterator[ThreeBrokers]:
    """Brokers 1, 2 and 3 with broker_flags(root, i) and `flags`, started side by side; at
    the end all stopped side by side (those restarted in their place too), logs shown."""
    connect = zookeeper.connect_string
    brokers = [
        RunningBroker(root / f"broker-{i}", connect, chroot, *broker_flags(root, i), *flags)
        for i in (1, 2, 3)
    ]
    registry = Registry(
        connect, chroot, session_timeout_s=SESSION_TIMEOUT_S, request_timeout_s=REQUEST_TIMEOUT_S
    )
    try:
        start_all(brokers)
        registry.start(timeout=10)
        yield ThreeBrokers(root, chroot, registry, dict(zip((1, 2, 3), brokers, strict=True)))
    finally:
        registry.stop()
        stop_all(brokers)
        for broker in brokers:
            print(f"--- {broker.log_path}:\n{broker.log_tail()}")


def three_brokers_flags(request: pytest.FixtureRequest) -> tuple[str, ...]:
    """The test module's THREE_BROKERS_FLAGS: its brokers' flags besides broker_flags."""
    return tuple(getattr(request.module, "THREE_BROKERS_FLAGS", ()))


@pytest.fixture(scope="module")
def module_three_brokers(
    request: pytest.FixtureRequest,
    zookeeper: PrivateZooKeeper,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[ThreeBrokers]:
    """Three brokers shared by the tests of one module (three take seconds to start and
    stop), with the module's THREE_BROKERS_FLAGS, on a chroot of their own. Tests take
    `shared_three_brokers`."""
    root = tmp_path_factory.mktemp("three-brokers")
    chroot = f"/test-{uuid.uuid4().hex[:16]}"
    with running_three(zookeeper, root, chroot, *three_brokers_flags(request)) as three:
        yield three


@pytest.fixture
def shared_three_brokers(module_three_brokers: ThreeBrokers) -> ThreeBrokers:
    """The module's three brokers, each one running. A test that shares them uses topic and
    group names of its own, leaves every broker serving (restarts one it killed with
    `restart`, resumes one it stopped with SIGSTOP), and reads a broker's counters only as
    changes."""
    module_three_brokers.heal()
    return module_three_brokers


@pytest.fixture
def own_three_brokers(
    request: pytest.FixtureRequest,
    zookeeper: PrivateZooKeeper,
    tmp_path: Path,
    registry_chroot: str,
) -> Iterator[ThreeBrokers]:
    """Three brokers of this test's own (under tmp_path, on registry_chroot: `registry` and
    `make_member` see them), with the module's THREE_BROKERS_FLAGS, started side by side."""
    flags = three_brokers_flags(request)
    with running_three(zookeeper, tmp_path, registry_chroot, *flags) as three:
        yield three
