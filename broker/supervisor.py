"""The pylogd supervisor: starts the pieces of a broker, runs its loop, and stops it cleanly.

    clients --tcp--> front ROUTER --(route by topic, partition)--> DEALER --ipc--> worker N

The pieces, each in its own module, imports pointing one way (supervisor -> front -> topics ->
pool, placement, registry):

- broker.front: the routing loop, the one hop every request takes: the front ROUTER socket,
  requests to workers, replies to clients, METADATA; nothing on it waits on anything slow;
- broker.pool: the worker processes (`workers_per_dir` per log dir), their DEALERs, their
  restarts with back-off;
- broker.topics: this broker's view of the cluster's topics (ZooKeeper's watches), topic
  creation and deletion, and every registry call after start, made off the loop;
- broker.placement: which worker holds each partition here (a pure function);
- broker.replication.controller: the controller service, on a thread of its own (started once
  the broker is registered, stopped before the registry).

With no zookeeper.connect, a private standalone ZooKeeper runs as a supervised child under
<data_dir>/zookeeper. One that dies is started again at once, then after 0.5 s doubling while
its starts fail; after ZOOKEEPER_START_ATTEMPTS failed starts in a row pylogd stops (exit 1).
Its starts run on a thread of their own, off the loop. A port in use at start (the front's or
ZooKeeper's) stops pylogd at once, naming the process that holds it. The registry
(broker.registry) survives a lost session by itself; while ZooKeeper is away the broker keeps
serving its partitions and only topic creation and deletion fail (REGISTRY_UNAVAILABLE).

On SIGTERM or SIGINT: tell systemd STOPPING, answer new requests with BROKER_SHUTTING_DOWN,
SIGTERM every worker (each flushes and closes its logs, answering producers waiting on that
flush), forward their last replies, then leave ZooKeeper and exit 0. With NOTIFY_SOCKET set it
sends READY=1 once serving and WATCHDOG=1 every half WATCHDOG_USEC.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import ipaddress
import logging
import math
import os
import shutil
import signal
import socket
import tempfile
import time
from collections import deque
from pathlib import Path
from types import FrameType
from wsgiref.simple_server import WSGIServer

import zmq

from broker import control
from broker.backoff import Backoff
from broker.config import BrokerConfig, with_live
from broker.errors import PylogError, ZooKeeperStartError
from broker.front import Front
from broker.groups.guard import RetentionGuard
from broker.groups.service import Coordinator
from broker.log.fsdir import make_directory
from broker.logs import set_log_level
from broker.metrics import BrokerStatistics, serve_metrics
from broker.pool import Answers, WorkerPool
from broker.processes import ensure_file_limit, segment_file_limit
from broker.quotas import QuotaConfig, describe_quotas
from broker.ratelog import RateLimitedLog
from broker.registry import BrokerRegistration, Registry
from broker.registry.settings import BrokerSettings, settings_for
from broker.registry_calls import RegistryCalls
from broker.replication.controller import ControllerService
from broker.security import (
    PRINCIPALS_FILE_CHECK_S,
    Acl,
    Authorizer,
    BrokerKeys,
    KeyFileError,
    Principals,
    ZapHandler,
    ZooKeeperAuth,
)
from broker.topics import Topics
from broker.zookeeper import PrivateZooKeeper

log = logging.getLogger("pylog.supervisor")

PRIVATE_REGISTRY_AUTH = "zookeeper.auth"
"""In <data_dir>: the brokers' ZooKeeper identity for a private ZooKeeper in curve mode."""
PRIVATE_REGISTRY_USER = "pylog-brokers"

WORKER_START_TIMEOUT_S = 60.0
ZOOKEEPER_BACKOFF = Backoff(0.5)
"""The wait before the second start of a dead private ZooKeeper, doubling for each next one
(its delay(n) only is used: no state)."""
ZOOKEEPER_START_ATTEMPTS = 5
"""Failed starts in a row after which pylogd stops."""


class Supervisor:
    """Runs pylogd until a signal stops it. `run()` returns the process exit code."""

    def __init__(self, config: BrokerConfig) -> None:
        self.config = config
        self.data_dir = Path(config.broker_data_dir)
        self.run_dir = run_dir_for(self.data_dir)
        self.log_dirs = config.log_dir_paths
        self.context = zmq.Context()
        poller = zmq.Poller()
        answers: Answers = deque()
        self.calls = RegistryCalls()
        self.pool = WorkerPool(config, self.context, poller, self.run_dir, answers)
        self.topics = Topics(config, self.pool, self.calls, answers)
        self.groups = Coordinator(config, self.topics, self.calls, answers)
        self.front = Front(
            config, self.context, poller, self.pool, self.topics, self.groups, answers
        )
        self._zookeeper_starts = concurrent.futures.ThreadPoolExecutor(
            1, thread_name_prefix="zookeeper-start"
        )
        """Where the private ZooKeeper is started again (not behind registry calls that wait
        for it). The JVM dies with the thread that forked it (broker.processes), so this thread
        ends only after the ZooKeeper is stopped (shutdown)."""
        self._zookeeper_starting = False
        self.zookeeper: PrivateZooKeeper | None = None
        self._zookeeper_failures = 0
        """Failed starts of the private ZooKeeper since it last ran."""
        self._zookeeper_start_at = 0.0
        self.registry: Registry | None = None
        self.controller = ControllerService()
        """The controller service (docs/replication.md): started once registered."""
        self.metrics: WSGIServer | None = None
        self._signal_received: int | None = None
        self._watchdog_every = _watchdog_interval()
        self._watchdog_at = 0.0
        self.zap: ZapHandler | None = None
        self.broker_keys: BrokerKeys | None = None
        """This broker's keys among brokers (curve mode)."""
        self.guard: RetentionGuard | None = None
        """The retention guard, once serving (broker.groups.guard)."""
        self.authorizer: Authorizer | None = None
        self._principals_check_at = 0.0

    # -- start -----------------------------------------------------------------------------

    def statistics(self) -> BrokerStatistics:
        """The broker's figures now, for its metrics endpoint (read on the endpoint's thread)."""
        registry = self.registry
        return BrokerStatistics(
            self.config.broker_id,
            self.front.statistics(),
            self.pool.statistics(),
            self.topics.statistics(),
            registry is not None and registry.session.connected,
            {} if self.guard is None else self.guard.forecasts(),
        )

    def start(self) -> None:
        """Everything up to READY: front socket and metrics endpoint (first, so that a port in
        use stops pylogd before anything is started), ZooKeeper, registry, topics, workers."""
        open_files = segment_file_limit(self.config.log_max_open_files)
        ensure_file_limit(open_files)
        if self.config.log_max_open_files is None:
            log.info("a worker keeps up to %d segment files open (the limits')", open_files)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        for directory in (self.data_dir, *self.log_dirs):  # what they hold survives a power loss
            make_directory(directory)
        self.run_dir.chmod(0o700)  # the workers' ipc sockets: no other user may connect them
        self._secure()
        self.front.bind()
        if self.config.metrics_enabled:  # as early: a port in use stops pylogd before anything
            self.metrics, _ = serve_metrics(
                self.statistics, self.config.metrics_host, self.config.metrics_port
            )
        connect = self.config.zookeeper_connect
        if not connect:
            self.zookeeper = PrivateZooKeeper(
                self.data_dir / "zookeeper",
                self.config.zookeeper_port or None,
                tick_time_ms=self.config.zookeeper_tick_time_ms,
            )
            self.zookeeper.start()
            connect = self.zookeeper.connect_string
            log.info("private ZooKeeper on %s (pid %s)", connect, self.zookeeper.pid)
        auth = self._registry_auth(connect)
        self.registry = Registry(
            connect,
            self.config.zookeeper_chroot,
            session_timeout_s=self.config.zookeeper_session_timeout_ms / 1000,
            auth=auth,
        )
        self.registry.start(timeout=max(10.0, self.config.zookeeper_session_timeout_ms / 1000))
        if auth is not None:
            secured = self.registry.acls.secure_tree()
            log.info(
                "registry: ZooKeeper digest ACLs as %r (%d nodes secured now)", auth.user, secured
            )
        self.calls.registry = self.registry
        self._watch_security(self.registry)
        self._watch_quotas(self.registry)
        self._watch_broker_settings(self.registry)
        self.topics.load()
        self.pool.start()
        self._wait_for_workers()
        self.front.open()
        self.registry.brokers.register(self.config.broker_id, self._registration())
        self.topics.watch()
        self.controller.start(
            self.registry,
            self.config.broker_id,
            leader_rebalance_interval_ms=self.config.broker_leader_rebalance_interval_ms,
        )
        host = self.config.broker_host
        log.info(
            "pylogd %d serving on %s:%d with %d workers over %d log dirs",
            self.config.broker_id,
            host,
            self.front.port,
            len(self.pool.workers),
            len(self.log_dirs),
        )
        self._guard_retention(host)
        print(f"pylogd ready on {host}:{self.front.port}", flush=True)
        sd_notify(f"READY=1\nSTATUS=serving on {host}:{self.front.port}")

    def _guard_retention(self, host: str) -> None:
        """Start the retention guard (broker.groups.guard), a client of this broker's front:
        at its address (an IP address or a name), or loopback's where it binds every one."""
        assert self.registry is not None
        config = self.config
        reach = "127.0.0.1" if _is_wildcard(host) else host
        keys = None if self.broker_keys is None else self.broker_keys.to_leader(None)
        self.guard = RetentionGuard(
            config.broker_id,
            self.registry.brokers,
            self.registry.groups,
            f"tcp://{reach}:{self.front.port}",
            config.broker_retention_guard_interval_ms / 1000,
            config.broker_retention_warning_ms / 1000,
            keys,
        )
        self.guard.start()

    def _registry_auth(self, connect: str) -> ZooKeeperAuth | None:
        """The brokers' ZooKeeper identity (docs/security.md, step 2): zookeeper.
        auth_file's; in curve mode without one, that of the private ZooKeeper (made on first
        start, PRIVATE_REGISTRY_AUTH), so that a stranger cannot write the registry. An
        external ZooKeeper without one stops a curve broker (OSError) unless
        security.allow_open_registry, which starts it with a warning."""
        config = self.config
        auth_file = config.zookeeper_auth_file
        try:
            if auth_file:
                return ZooKeeperAuth.load(auth_file)
            if config.security_mode != "curve":
                return None
            if not config.zookeeper_connect:
                path = self.data_dir / PRIVATE_REGISTRY_AUTH
                auth, created = ZooKeeperAuth.load_or_create(path, PRIVATE_REGISTRY_USER)
                if created:
                    log.info("registry: the brokers' ZooKeeper identity written to %s", path)
                return auth
        except (KeyFileError, OSError) as error:
            raise OSError(f"zookeeper.auth_file: {error}") from error
        if not config.security_allow_open_registry:
            raise OSError(
                f"security.mode is curve but the registry at {connect} is open: anyone who "
                "reaches ZooKeeper could add a principal, grant it every ACL and delete topics. "
                "Give the brokers a ZooKeeper identity, zookeeper.auth_file = a file of one "
                "line user:password, mode 0600 (docs/security.md, step 2), or set "
                "security.allow_open_registry = true to start anyway"
            )
        log.warning(
            "security: the registry at %s is OPEN (allow_open_registry, no zookeeper.auth_file): "
            "anyone who reaches ZooKeeper may add principals, grant ACLs and delete topics",
            connect,
        )
        return None

    def _secure(self) -> None:
        """Make the front a Curve server (security.mode curve), or check that plaintext is
        allowed where it listens; either way, say in the log which it is."""
        config = self.config
        host = config.broker_host
        if config.security_mode != "curve":
            if _is_loopback(host):
                log.info("security: plaintext on %s: no authentication, no ACLs", host)
                return
            if not config.security_allow_plaintext_remote:
                raise OSError(
                    f"security.mode is plaintext and broker.host {host} is not a loopback "
                    "address: anyone who reaches it could produce, fetch and delete topics. "
                    "Set security.mode = curve (docs/security.md), or "
                    "security.allow_plaintext_remote = true"
                )
            log.warning(
                "security: PLAINTEXT on %s, which is not loopback (allow_plaintext_remote): "
                "anyone who reaches port %s may produce, fetch and delete topics, and read "
                "the traffic",
                host,
                config.broker_port,
            )
            return
        try:
            keys = BrokerKeys.load(config.key_file_path, config.security_broker_keys)
            principals_file = config.security_principals_file
            principals = Principals(
                Path(principals_file) if principals_file else None, keys.cluster
            )
        except (KeyFileError, OSError) as error:
            raise OSError(f"security: {error}") from error
        self.broker_keys = keys
        self.zap = ZapHandler(self.context, principals)
        self.authorizer = Authorizer(config.security_super_users)
        self.front.secure(keys.secret, self.zap, self.authorizer)
        from_file = (
            f"{len(principals)} client keys from {principals_file}"
            if principals_file
            else "no principals file (security.principals_file)"
        )
        log.info(
            "security: curve on %s, broker public key %s; %s, and the principals in ZooKeeper "
            "(pylogctl principal add); super users: %s; %d cluster key(s) let in as brokers",
            host,
            keys.public.decode(),
            from_file,
            ", ".join(config.security_super_users) or "none",
            len(keys.cluster),
        )

    def _registration(self) -> BrokerRegistration:
        """What this broker registers in ZooKeeper (broker.topics), with, in curve mode, its
        public key and the cluster's keys it lets in: public data, which followers and
        `pylogctl topic reassign --status` read."""
        info = self.topics.registration(self.front.port)
        keys = self.broker_keys
        if keys is None:
            return info
        cluster = tuple(sorted(key.decode() for key in keys.cluster))
        return dataclasses.replace(info, curve_key=keys.public.decode(), cluster_keys=cluster)

    def _watch_broker_settings(self, registry: Registry) -> None:
        """The live settings ZooKeeper gives this broker (`pylogctl broker config`), over the
        file's and the flags': read once before the workers start (they start with them),
        then watched; a change is applied on the loop (_apply_live). A set that does not check
        is logged and passed over, the settings in force kept."""
        base = BrokerConfig(dict(self.config.values))
        me = self.config.broker_id

        def changed(node: BrokerSettings) -> None:
            try:
                live = with_live(base, settings_for(node, me))
            except ValueError as error:
                log.error("live settings in ZooKeeper refused, those in force kept: %s", error)
                return
            self._apply_live(live)

        changed(registry.settings.read())
        registry.settings.watch(lambda node: self.calls.report(lambda: changed(node)))

    def _apply_live(self, live: BrokerConfig) -> None:
        """Take the live settings of `live`: into the config every part reads, the front's
        ceilings, the log level here and in every worker (with the topics' new defaults)."""
        taken = self.config.take_live(live)
        if not taken:
            return
        log.info("live settings now: %s", ", ".join(f"{k}={v}" for k, v in taken.items()))
        set_log_level(self.config.broker_log_level)
        self.front.take_limits()
        command = control.encode(control.ReconfigureBroker(taken))
        for worker in self.pool.workers:
            if worker.connected:  # one starting later is forked with the config as it is now
                self.pool.send(worker, command)

    def _watch_quotas(self, registry: Registry) -> None:
        """Quotas from ZooKeeper: read once (so that the first request is held to them), then
        watched; a change applies from the front's next turn."""
        throttle = self.front.throttle

        def quotas_changed(config: QuotaConfig) -> None:
            throttle.update(config)
            log.info("quotas in ZooKeeper: %s", describe_quotas(config))

        throttle.update(registry.quotas.read())  # said in the log by the watch's first call
        registry.quotas.watch(quotas_changed)

    def _watch_security(self, registry: Registry) -> None:
        """Principals and ACLs from ZooKeeper: read once (so that the first request is decided
        by them), then watched; a change applies to the next connection (principals) or
        request (ACLs)."""
        zap, authorizer = self.zap, self.authorizer
        if zap is None or authorizer is None:
            return

        def principals_changed(principals: dict[str, tuple[bytes, ...]]) -> None:
            zap.principals.from_registry(principals)
            log.info("principals in ZooKeeper: %d", len(principals))

        def acls_changed(acls: list[Acl]) -> None:
            authorizer.update(acls)
            log.info("ACLs in ZooKeeper: %d", len(acls))

        zap.principals.from_registry(registry.security.principals())
        authorizer.update(registry.security.acls())
        registry.security.watch_principals(principals_changed)
        registry.security.watch_acls(acls_changed)

    def _wait_for_workers(self) -> None:
        """Until every worker has said hello (it then gets its partitions, in order)."""
        deadline = time.monotonic() + WORKER_START_TIMEOUT_S
        while not self.pool.all_connected():
            if time.monotonic() > deadline or self._signal_received is not None:
                missing = [w.index for w in self.pool.workers if not w.connected]
                raise OSError(f"workers {missing} did not start in {WORKER_START_TIMEOUT_S} s")
            self._turn()

    # -- the loop --------------------------------------------------------------------------

    def run(self) -> int:
        """Start, serve until SIGTERM / SIGINT, shut down cleanly. Returns the exit code."""
        previous = {s: signal.signal(s, self._on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
        try:
            self.start()
            self._serve()
            return 0
        finally:
            self.shutdown()
            for s, handler in previous.items():
                signal.signal(s, handler)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self._signal_received = signum
        # At once, before the loop sees the signal: a Ctrl-C reaches the workers too, and a
        # worker that exits for it is the shutdown, not a crash to restart (and log as one).
        self.pool.stopping = True

    def _serve(self) -> None:
        deadline = math.inf
        while True:
            if self._signal_received is not None and not self.front.stopping:
                log.info("%s: shutting down", signal.Signals(self._signal_received).name)
                sd_notify("STOPPING=1")
                if self.guard is not None:  # before the front refuses the guard's requests
                    self.guard.stop()
                self.front.stopping = True
                self.pool.terminate()
                deadline = time.monotonic() + self.config.broker_shutdown_timeout_ms / 1000
            if self.front.stopping:
                if self.pool.all_exited():
                    self.front.drain()
                    return
                if time.monotonic() > deadline:
                    self.pool.kill()
            self._turn()

    def _turn(self) -> None:
        """A turn of the front's loop, then the supervisor's own housekeeping."""
        self.front.poll_once()
        self._check_zookeeper()
        self._tick_watchdog()
        if self.zap is not None and time.monotonic() >= self._principals_check_at:
            self.zap.principals.check_file()
            self._principals_check_at = time.monotonic() + PRINCIPALS_FILE_CHECK_S

    def _check_zookeeper(self) -> None:
        """Start the private ZooKeeper again once it has died (off the loop): at once, then,
        while its starts fail, after ZOOKEEPER_BACKOFF; ZooKeeperStartError (pylogd
        stops) after ZOOKEEPER_START_ATTEMPTS failed starts in a row."""
        zk = self.zookeeper
        if zk is None or self._zookeeper_starting or zk.alive or self.front.stopping:
            return
        if time.monotonic() < self._zookeeper_start_at:
            return
        if not self._zookeeper_failures:
            log.error("the private ZooKeeper exited (%s); restarting it", zk.poll())

        def start(_: Registry) -> None:
            try:
                zk.start()
            except OSError as error:
                raise ZooKeeperStartError(str(error)) from error

        self._zookeeper_starting = True
        self.calls.call(
            start, self._zookeeper_started, self._zookeeper_failed, self._zookeeper_starts
        )

    def _zookeeper_started(self, _: None) -> None:
        zk = self.zookeeper
        assert zk is not None
        self._zookeeper_starting = False
        self._zookeeper_failures = 0
        log.info("private ZooKeeper restarted on %s (pid %s)", zk.connect_string, zk.pid)

    def _zookeeper_failed(self, error: PylogError) -> None:
        self._zookeeper_starting = False
        self._zookeeper_failures += 1
        failures = self._zookeeper_failures
        if failures >= ZOOKEEPER_START_ATTEMPTS:
            waited_s = ZOOKEEPER_BACKOFF.waited(failures - 1)
            raise ZooKeeperStartError(
                f"the private ZooKeeper could not be restarted ({failures} failed starts "
                f"in a row over {waited_s:g} s), so pylogd stops: {error}"
            ) from error
        wait_s = ZOOKEEPER_BACKOFF.delay(failures - 1)
        self._zookeeper_start_at = time.monotonic() + wait_s
        log.error(
            "cannot restart the private ZooKeeper (failed start %d of %d; next in %.1f s): %s",
            failures,
            ZOOKEEPER_START_ATTEMPTS,
            wait_s,
            error,
        )

    def _tick_watchdog(self) -> None:
        if self._watchdog_every and time.monotonic() >= self._watchdog_at:
            sd_notify("WATCHDOG=1")
            self._watchdog_at = time.monotonic() + self._watchdog_every

    def shutdown(self) -> None:
        """Stop workers (if still running), leave the registry, stop ZooKeeper, close sockets.
        Registry calls no longer wait for a ZooKeeper that is gone (Registry.wind_down)."""
        if self.registry is not None:
            self.registry.session.wind_down()
        self.pool.stop(self.config.broker_shutdown_timeout_ms / 1000)
        if self.metrics is not None:
            self.metrics.shutdown()
        if self.guard is not None:
            self.guard.stop()
            self.guard.join()
        self.calls.shutdown()
        self.groups.close()
        self.topics.roles.leases.shutdown()
        self.controller.stop()  # resigns, if the controller, before the session ends
        if self.registry is not None:
            self.registry.stop()
        if self.zookeeper is not None:
            self._zookeeper_starts.shutdown(wait=True, cancel_futures=True)  # a start ends first
            self.zookeeper.stop()
        self._zookeeper_starts.shutdown(wait=True)
        self.front.close()
        self.context.destroy(linger=1000)
        self.pool.remove_endpoints()
        if self.run_dir != self.data_dir / "run":  # a folder of its own in the temp dir
            shutil.rmtree(self.run_dir, ignore_errors=True)


_NOTIFY_LOG = RateLimitedLog(log, 60.0)


IPC_PATH_MAX = 107
"""The longest path of a unix socket (sizeof(sockaddr_un.sun_path) less its NUL, on Linux)."""


def run_dir_for(data_dir: Path) -> Path:
    """Where the workers' ipc sockets go: <data_dir>/run; or, when a socket's path there would
    be longer than a unix socket's may be (a deep data dir), a new folder of the system's temp
    dir that only this user may enter (made by mkdtemp; removed at shutdown)."""
    run_dir = data_dir.absolute() / "run"
    if len(f"{run_dir}/worker-999-999999.sock") <= IPC_PATH_MAX:  # 1,000 workers, 1e6 restarts
        return data_dir / "run"
    return Path(tempfile.mkdtemp(prefix="pylog-run-"))


def sd_notify(state: str) -> None:
    """Send a state line to systemd when NOTIFY_SOCKET is set (Type=notify); else nothing.
    Never waits: a line the receiver has no room for (it is not reading) is dropped, and said
    (once a minute at most), so that pylogd's loop never stops on it."""
    address = os.environ.get("NOTIFY_SOCKET")
    if not address:
        return
    if address.startswith("@"):
        address = "\0" + address[1:]
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        try:
            sock.sendto(state.encode(), socket.MSG_DONTWAIT, address)
        except BlockingIOError:
            why = "the receiver is not reading"
            _NOTIFY_LOG.log(logging.WARNING, "full", f"sd_notify {state!r} dropped: {why}")
        except OSError as error:
            log.warning("sd_notify %r failed: %s", state, error)


def _is_loopback(host: str) -> bool:
    """Whether `host` (broker.host) is a loopback address; a name other than localhost, or an
    interface, is taken as not."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _is_wildcard(host: str) -> bool:
    """Whether `host` (broker.host) binds every address: "*", 0.0.0.0 or ::."""
    try:
        return host == "*" or ipaddress.ip_address(host.strip("[]")).is_unspecified
    except ValueError:  # a name
        return False


def _watchdog_interval() -> float:
    usec = os.environ.get("WATCHDOG_USEC", "")
    return int(usec) / 2e6 if usec.isdigit() and int(usec) > 0 else 0.0


def run_pylogd(config: BrokerConfig) -> int:
    return Supervisor(config).run()
