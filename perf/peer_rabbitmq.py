"""RabbitMQ's side of the paper's experiments: a private RabbitMQ node, and the producer,
consumer and latency runs against it through pika, a durable queue and persistent messages.

The paper (Kreps et al., NetDB'11, section 5) compares Kafka with ActiveMQ and RabbitMQ on one
producer sending 10M messages of 200 bytes, one at a time and in batches of 50, and on one
consumer reading them back. Here the peer is Debian's rabbitmq-server 3.10 (a classic durable
queue, delivery_mode=2 messages, the default exchange) and the client is pika's
BlockingConnection, the fastest practical synchronous Python client; the pylog side is
perf/pylog_runs.py. Every body is 200 bytes, built in the timed loop.

- `produce`: one connection publishes N messages, `batch` at a time. AMQP 0-9-1 has no batched
  publish: a batch is `batch` basic.publish frames written with one socket flush, then, with
  `confirm`, a wait for the broker's publisher confirms (the channel is in confirm mode;
  RabbitMQ confirms a persistent message to a durable queue once it is on disk) until at most
  `in_flight` - 1 batches await theirs: with the default 1, of the whole batch. That is the
  closest AMQP comes to the paper's batches of 50; batch 1 with confirms and one in flight is
  one round trip (and one wait for the disk) per message. Without `confirm` (like the paper's
  producer, which never waits) the run ends when the broker holds all N: `queue.declare`
  (passive) reports N messages.
- `consume`: the queue is filled first (untimed, confirmed batches, so everything is on disk),
  then one consumer (basic.consume, prefetch 1000) reads the N messages, computes zlib.crc32 of
  every body and acknowledges every prefetch/2 messages with multiple=True. The crc stands for
  the per-message check that pylog's consumer makes (it verifies each message's XXH3 checksum),
  so both clients pay a comparable per-message cost; RabbitMQ itself sends no checksum.
- `latency`: a producer thread publishes at a fixed rate (each body starts with its
  time.monotonic_ns() send time; every message due is published, then the socket is flushed; no
  confirms), a consumer on its own connection in the main thread records receive - send time.
  The paper reports no latency; this is the end-to-end figure an operator asks for next.

Each result is a dict: messages, seconds, client_cpu_s (this process during the timed part,
time.process_time(): pika runs in this thread) and broker_cpu_s (the node's beam.smp and its
helpers, perf/cpu.py; None when no pids are given); `produce` adds visible_after_s, the time
from the last publish to the end (all held, or all confirmed); latency gives messages, p50_ms,
p99_ms, max_ms.

The node (`PrivateRabbitMQ`) runs as a child process with everything private: a free AMQP port
on 127.0.0.1, its own epmd on a free port (127.0.0.1), its own distribution port, data, logs,
config and cookie under one directory, no plugins. It starts in 5-7 s on 2 cores.
scripts/perf-setup installs rabbitmq-server (without starting Debian's service) and pika.
"""

from __future__ import annotations

import contextlib
import ctypes
import itertools
import logging
import os
import shutil
import signal
import socket
import struct
import subprocess
import tempfile
import threading
import time
import zlib
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import IO, Any

import pika
import pika.exceptions

from broker.lifecycle import Running
from broker.zookeeper import free_port
from perf.cpu import cpu_seconds, tree_pids
from perf.latency import latency_summary

__all__ = [
    "MESSAGE_BYTES",
    "RABBITMQ_BIN",
    "PrivateRabbitMQ",
    "RabbitMQStartError",
    "consume",
    "installed",
    "latency",
    "produce",
]

log = logging.getLogger(__name__)

RABBITMQ_BIN = Path("/usr/lib/rabbitmq/bin")
"""Debian's real scripts. /usr/sbin/rabbitmq-server is a wrapper that, run as root, switches
to the `rabbitmq` user and /var/lib/rabbitmq; these run as whoever calls them."""

EPMD = "epmd"
_PR_SET_PDEATHSIG = 1
MESSAGE_BYTES = 200
PERSISTENT = 2  # delivery_mode of a message written to disk by a durable queue

_node_numbers = itertools.count()


class RabbitMQStartError(RuntimeError):
    """The private node did not start: not installed, exited, or no AMQP within the deadline."""


def installed() -> bool:
    """Whether Debian's rabbitmq-server and an epmd are there (scripts/perf-setup)."""
    return (RABBITMQ_BIN / "rabbitmq-server").exists() and shutil.which(EPMD) is not None


class PrivateRabbitMQ(Running):
    """One RabbitMQ node on 127.0.0.1, run as a child process; a context manager.

    Layout under `directory` (a new temporary directory, removed on stop, when None):

        home/                 HOME: the node's and rabbitmqctl's .erlang.cookie
        rabbitmq.conf         listeners.tcp.1 = 127.0.0.1:PORT, written on start
        enabled_plugins       "[]." (no management plugin)
        rabbitmq-env.conf     empty: Debian's /etc/rabbitmq/rabbitmq-env.conf is not read
        mnesia/               RABBITMQ_MNESIA_BASE: queues and messages
        log/                  RABBITMQ_LOG_BASE: <nodename>.log
        rabbitmq.out          the scripts' stdout and stderr; epmd.out likewise

    Running as root: Debian's /usr/sbin wrappers `su` to the rabbitmq user; the scripts in
    RABBITMQ_BIN do not, and run the node as the caller with HOME in the directory. The node
    is `sh rabbitmq-server` -> beam.smp (-> erl_child_setup, inet_gethost), in a session of
    its own; our own epmd runs beside it (`epmd -port P -address 127.0.0.1`), so a system
    epmd on 4369 is neither used nor started (epmd adds ::1 by itself: loopback too). The
    Erlang distribution listens on 127.0.0.1 only. Starting takes 5-7 s on 2 cores
    (`start_seconds`), nearly all of it the node's boot.

    stop() sends SIGTERM to the script, whose trap stops beam.smp gracefully (rabbit's signal
    handler: the same path as `rabbitmqctl stop`, without the CLI's own 2-3 s Erlang start;
    about 1 s), SIGKILLs whatever is left of the process tree after stop_timeout_s, then
    stops epmd: nothing is left. Both children get SIGTERM if the thread that started them
    ends (PR_SET_PDEATHSIG), so a benchmark killed before stop() leaves no node behind: start
    the node from the thread that outlives the runs (the main one).

    Not safe to share between threads. The node's data is thrown away with a temporary
    directory; in a given directory it is kept under mnesia/<nodename>, which is new for every
    PrivateRabbitMQ object (a restart of the same object finds its queues again).
    """

    def __init__(
        self,
        directory: Path | None = None,
        *,
        start_timeout_s: float = 60.0,
        stop_timeout_s: float = 30.0,
    ) -> None:
        self._own_directory = directory is None
        self.directory = Path(directory or tempfile.mkdtemp(prefix="pylog-rabbitmq-")).absolute()
        self.start_timeout_s = start_timeout_s
        self.stop_timeout_s = stop_timeout_s
        self.nodename = f"pylogbench-{os.getpid()}-{next(_node_numbers)}@localhost"
        self.port = 0
        self.start_seconds = 0.0
        """How long the last start took, from spawning epmd to the first AMQP connection."""
        self._epmd_port = 0
        self._env: dict[str, str] = {}
        self._node: subprocess.Popen[bytes] | None = None
        self._epmd: subprocess.Popen[bytes] | None = None
        self._outputs: list[IO[bytes]] = []

    # -- what it is --------------------------------------------------------------------------

    @property
    def url(self) -> str:
        """amqp://guest:guest@127.0.0.1:PORT/%2F (guest may log in from loopback only)."""
        if not self.port:
            raise RuntimeError("the private RabbitMQ has not been started: no port yet")
        return f"amqp://guest:guest@127.0.0.1:{self.port}/%2F"

    @property
    def alive(self) -> bool:
        return self._node is not None and self._node.poll() is None

    def pids(self) -> list[int]:
        """The node's processes now (the script, beam.smp, its helpers); [] when stopped."""
        return tree_pids(self._node.pid) if self._node is not None else []

    def all_pids(self) -> list[int]:
        """pids() and our epmd: every process this object started that still runs."""
        epmd = tree_pids(self._epmd.pid) if self._epmd is not None else []
        return self.pids() + epmd

    def __repr__(self) -> str:
        state = "running" if self.alive else "stopped"
        return f"<PrivateRabbitMQ {self.nodename} port={self.port} {state}>"

    # -- lifetime ----------------------------------------------------------------------------

    def start(self) -> None:
        """Write the configuration, run epmd and the node, return once AMQP answers.

        Raises RabbitMQStartError (after stopping what it started), with the log's tail."""
        if self.alive:
            return
        if not installed():
            raise RabbitMQStartError(
                f"cannot run a private RabbitMQ: {RABBITMQ_BIN}/rabbitmq-server or epmd is "
                "missing; run scripts/perf-setup (or: apt-get install rabbitmq-server)"
            )
        started = time.monotonic()
        self._prepare()
        try:
            self._spawn()
            self._wait_ready(started)
        except BaseException:
            self._terminate()
            raise
        self.start_seconds = time.monotonic() - started
        log.info(
            "private RabbitMQ %s ready on 127.0.0.1:%d in %.2f s",
            self.nodename,
            self.port,
            self.start_seconds,
        )

    def stop(self) -> None:
        """Stop the node gracefully (SIGTERM, then SIGKILL after stop_timeout_s) and its epmd,
        then remove a temporary directory. Idempotent."""
        self._terminate()
        if self._own_directory and self.directory.exists():
            shutil.rmtree(self.directory, ignore_errors=True)

    def rabbitmqctl(self, *args: str, timeout: float = 60.0) -> str:
        """Run rabbitmqctl against this node (same environment); its stdout.

        Raises subprocess.CalledProcessError or TimeoutExpired."""
        result = subprocess.run(
            [str(RABBITMQ_BIN / "rabbitmqctl"), *args],
            env=self._env,
            cwd=self.directory,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=timeout,
            check=True,
        )
        return result.stdout.decode("utf-8", "replace")

    def log_tail(self, lines: int = 30) -> str:
        """The last lines of the scripts' output and of the node's own log."""
        tails = []
        for path in (self.directory / "rabbitmq.out", self._node_log()):
            try:
                text = path.read_bytes()[-64 * 1024 :].decode("utf-8", "replace")
            except FileNotFoundError:
                continue
            tails.append(f"--- {path}\n" + "\n".join(text.splitlines()[-lines:]))
        return "\n".join(tails)

    # -- steps -------------------------------------------------------------------------------

    def _node_log(self) -> Path:
        return self.directory / "log" / f"{self.nodename}.log"

    def _prepare(self) -> None:
        self.port, dist_port, self._epmd_port = _free_ports(3)
        home = self.directory / "home"
        for sub in (home, self.directory / "mnesia", self.directory / "log"):
            sub.mkdir(parents=True, exist_ok=True)
        config = self.directory / "rabbitmq.conf"
        config.write_text(
            "# Written by pylog (perf/peer_rabbitmq.py) on every start: edits are lost.\n"
            f"listeners.tcp.1 = 127.0.0.1:{self.port}\n"
            "loopback_users.guest = true\n"
            "log.file.level = info\n"
        )
        plugins = self.directory / "enabled_plugins"
        plugins.write_text("[].\n")
        env_file = self.directory / "rabbitmq-env.conf"
        env_file.write_text("")
        self._env = {
            "PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin"),
            "LANG": "C.UTF-8",
            "HOME": str(home),
            "RABBITMQ_NODENAME": self.nodename,
            "RABBITMQ_USE_LONGNAME": "false",
            "RABBITMQ_CONF_ENV_FILE": str(env_file),
            "RABBITMQ_CONFIG_FILE": str(config),
            "RABBITMQ_ADVANCED_CONFIG_FILE": str(self.directory / "advanced.config"),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(plugins),
            "RABBITMQ_MNESIA_BASE": str(self.directory / "mnesia"),
            "RABBITMQ_LOG_BASE": str(self.directory / "log"),
            "RABBITMQ_PID_FILE": str(self.directory / "rabbitmq.pid"),
            "RABBITMQ_DIST_PORT": str(dist_port),
            "RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS": "-kernel inet_dist_use_interface {127,0,0,1}",
            "ERL_EPMD_PORT": str(self._epmd_port),
            "ERL_EPMD_ADDRESS": "127.0.0.1",
        }

    def _spawn(self) -> None:
        epmd_out = (self.directory / "epmd.out").open("ab")
        node_out = (self.directory / "rabbitmq.out").open("ab")
        self._outputs = [epmd_out, node_out]
        self._epmd = subprocess.Popen(
            [EPMD, "-port", str(self._epmd_port), "-address", "127.0.0.1"],
            env=self._env,
            stdin=subprocess.DEVNULL,
            stdout=epmd_out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=_die_with_parent,
        )
        self._wait_epmd()
        node_out.write(f"=== pylog: starting {self.nodename} on port {self.port}\n".encode())
        node_out.flush()
        self._node = subprocess.Popen(
            [str(RABBITMQ_BIN / "rabbitmq-server")],
            env=self._env,
            cwd=self.directory,
            stdin=subprocess.DEVNULL,
            stdout=node_out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # out of the terminal's group: Ctrl-C goes to us only
            preexec_fn=_die_with_parent,
        )

    def _wait_epmd(self) -> None:
        """epmd accepts connections within milliseconds; the node must not start before."""
        assert self._epmd is not None
        deadline = time.monotonic() + 10
        while True:
            if self._epmd.poll() is not None:
                raise RabbitMQStartError(
                    f"epmd on port {self._epmd_port} exited with status {self._epmd.returncode}"
                    f": {(self.directory / 'epmd.out').read_text(errors='replace')[-2000:]}"
                )
            try:
                with _connect(self._epmd_port):
                    return
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RabbitMQStartError(f"epmd did not listen on port {self._epmd_port}")
            time.sleep(0.02)

    def _wait_ready(self, started: float) -> None:
        node = self._node
        assert node is not None
        deadline = started + self.start_timeout_s
        parameters = pika.URLParameters(self.url + "?connection_attempts=1&socket_timeout=2")
        while True:
            if node.poll() is not None:
                raise RabbitMQStartError(
                    f"the private RabbitMQ exited with status {node.returncode} during start-up"
                    f" (port {self.port}, {self.directory}):\n{self.log_tail()}"
                )
            try:
                with _connect(self.port):
                    pass
                pika.BlockingConnection(parameters).close()
                return
            except (OSError, pika.exceptions.AMQPError):
                pass
            if time.monotonic() > deadline:
                raise RabbitMQStartError(
                    f"the private RabbitMQ did not accept AMQP on 127.0.0.1:{self.port} within "
                    f"{self.start_timeout_s:.0f} s ({self.directory}):\n{self.log_tail()}"
                )
            time.sleep(0.1)

    def _terminate(self) -> None:
        node, self._node = self._node, None
        if node is not None:
            _stop_group(node, signal.SIGTERM, self.stop_timeout_s, "RabbitMQ")
        epmd, self._epmd = self._epmd, None
        if epmd is not None:
            _stop_group(epmd, signal.SIGTERM, 5.0, "epmd")
        for output in self._outputs:
            output.close()
        self._outputs = []


def _die_with_parent() -> None:
    """In the child before exec: SIGTERM it when the thread that started it ends (a benchmark
    killed without stop() leaves no node behind; the script's trap stops beam.smp)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def _free_ports(count: int) -> list[int]:
    ports: list[int] = []
    for _ in range(100):
        if len(ports) == count:
            break
        port = free_port()
        if port not in ports:
            ports.append(port)
    return ports


def _connect(port: int) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=1.0)


def _stop_group(process: subprocess.Popen[bytes], sig: int, timeout: float, what: str) -> None:
    """Signal the process, wait up to `timeout`, then SIGKILL whatever is left of its tree.

    The tree is taken before the signal: beam.smp's erl_child_setup starts a session of its
    own, so killing the process group alone would miss it and its helpers."""
    tree = _identities(tree_pids(process.pid))
    if process.poll() is None:
        process.send_signal(sig)
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            log.warning(
                "%s pid %d ignored signal %d for %.0f s: killing", what, process.pid, sig, timeout
            )
    for pid, started in tree.items():
        if _identities([pid]).get(pid) == started:  # the same process, not a reused pid
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    process.wait()


def _identities(pids: Iterable[int]) -> dict[int, str]:
    """pid -> start time (field 22 of /proc/<pid>/stat), which tells a reused pid apart."""
    identities = {}
    for pid in pids:
        try:
            text = Path(f"/proc/{pid}/stat").read_text()
        except (FileNotFoundError, ProcessLookupError):
            continue
        identities[pid] = text[text.rindex(")") + 2 :].split()[19]
    return identities


# -- the experiments --------------------------------------------------------------------------


def _body(i: int) -> bytes:
    return b"%012d" % i + b"x" * (MESSAGE_BYTES - 12)


def _connection(url: str) -> Any:
    return pika.BlockingConnection(pika.URLParameters(url))


def _fresh_queue(channel: Any, queue: str) -> None:
    channel.queue_delete(queue)
    channel.queue_declare(queue, durable=True)


def _flush(connection: Any, until: Callable[[], bool] | None = None) -> None:
    """Write out everything buffered, then read and dispatch input until `until()` is true.

    This is BlockingConnection._flush_output, the wait every blocking pika call makes
    (BlockingChannel.basic_publish is `_impl.basic_publish` + `_flush_output()`). The public
    process_data_events() returns only for events meant for BlockingChannel callbacks, so it
    would sleep its whole time limit while confirms arrive on the underlying channel."""
    if until is None:
        connection._flush_output()
    else:
        connection._flush_output(until)


def _held(channel: Any, queue: str) -> int:
    count: int = channel.queue_declare(queue, passive=True).method.message_count
    return count


class _Confirms:
    """Publisher confirms counted on the channel's underlying pika.channel.Channel.

    BlockingChannel.confirm_delivery() waits for the confirm of every message before the next
    publish, which would make batches of 50 into batches of 1; the underlying channel takes an
    ack/nack callback and lets a batch be in flight (this reaches into `_impl`, pika's
    documented asynchronous Channel behind the blocking one)."""

    def __init__(self, channel: Any) -> None:
        self.published = 0
        self.confirmed = 0
        self.nacked = 0
        self._pending: set[int] = set()
        selected: list[bool] = []
        channel._impl.confirm_delivery(
            ack_nack_callback=self._on_confirm, callback=lambda _frame: selected.append(True)
        )
        deadline = time.monotonic() + 30
        _flush(channel.connection, lambda: bool(selected) or time.monotonic() > deadline)
        if not selected:
            raise TimeoutError("RabbitMQ did not answer confirm.select in 30 s")

    def sent(self) -> None:
        self.published += 1
        self._pending.add(self.published)

    def _on_confirm(self, frame: Any) -> None:
        method = frame.method
        tag: int = method.delivery_tag
        done = {t for t in self._pending if t <= tag} if method.multiple else {tag}
        self._pending -= done
        if isinstance(method, pika.spec.Basic.Nack):
            self.nacked += len(done)
        else:
            self.confirmed += len(done)

    def wait(self, connection: Any, deadline: float, at_most: int = 0) -> None:
        """Wait until at most `at_most` publishes await their confirms."""
        _flush(connection, lambda: len(self._pending) <= at_most or time.monotonic() > deadline)
        if len(self._pending) > at_most:
            raise TimeoutError(f"{len(self._pending)} publishes not confirmed in time")
        if self.nacked:
            raise RuntimeError(f"RabbitMQ nacked {self.nacked} messages")


def produce(
    url: str,
    queue: str,
    messages: int,
    batch: int,
    confirm: bool,
    *,
    pids: Iterable[int] = (),
    keep: bool = False,
    limit_s: float = 600.0,
    in_flight: int = 1,
) -> dict[str, Any]:
    """Publish `messages` persistent 200-byte messages to a fresh durable queue, `batch` per
    socket flush, with `confirm` up to `in_flight` batches awaiting their confirms (waiting for
    the oldest before the next); see the module docstring.

    `pids` are the broker's processes (PrivateRabbitMQ.pids()) for broker_cpu_s. The queue is
    deleted afterwards unless `keep`. Raises TimeoutError past `limit_s`."""
    if messages < 1 or batch < 1:
        raise ValueError(f"messages and batch must be positive, not {messages} and {batch}")
    pids = list(pids)
    properties = pika.BasicProperties(delivery_mode=PERSISTENT)
    connection = _connection(url)
    try:
        channel = connection.channel()
        _fresh_queue(channel, queue)
        confirms = _Confirms(channel) if confirm else None
        publish = channel._impl.basic_publish  # frames to the buffer; flushed per batch below
        broker_cpu = cpu_seconds(pids) if pids else 0.0
        client_cpu = time.process_time()
        start = time.perf_counter()
        deadline = time.monotonic() + limit_s
        for first in range(0, messages, batch):
            for i in range(first, min(first + batch, messages)):
                publish("", queue, _body(i), properties)
                if confirms is not None:
                    confirms.sent()
            if confirms is not None:
                confirms.wait(connection, deadline, (in_flight - 1) * batch)
            else:
                _flush(connection)  # write the batch out
            if time.monotonic() > deadline:
                raise TimeoutError(f"published {first + batch} of {messages} in {limit_s} s")
        sent = time.perf_counter()
        if confirms is not None:
            confirms.wait(connection, deadline)
        else:
            while (held := _held(channel, queue)) < messages:  # the broker holds all N
                if time.monotonic() > deadline:
                    raise TimeoutError(f"RabbitMQ held {held} of {messages} messages")
                time.sleep(0.001)
        end = time.perf_counter()
        result = {
            "messages": messages,
            "seconds": end - start,
            "visible_after_s": end - sent,
            "client_cpu_s": time.process_time() - client_cpu,
            "broker_cpu_s": cpu_seconds(pids) - broker_cpu if pids else None,
        }
        if not keep:
            channel.queue_delete(queue)
        return result
    finally:
        _close(connection)


def consume(
    url: str,
    queue: str,
    messages: int,
    prefetch: int = 1000,
    *,
    pids: Iterable[int] = (),
    limit_s: float = 600.0,
) -> dict[str, Any]:
    """Fill a fresh durable queue with `messages` (untimed, confirmed), then read them all
    with basic.consume: zlib.crc32 of every body, standing for the per-message checksum that
    pylog's consumer verifies, and one multiple ack every prefetch/2 messages. The queue is
    deleted afterwards. Raises TimeoutError past `limit_s`."""
    if messages < 1 or prefetch < 2:
        raise ValueError("messages must be positive and prefetch at least 2")
    pids = list(pids)
    produce(
        url, queue, messages, batch=min(1000, messages), confirm=True, keep=True, limit_s=limit_s
    )
    ack_every = prefetch // 2
    connection = _connection(url)
    try:
        channel = connection.channel()
        channel.basic_qos(prefetch_count=prefetch)
        state = {"count": 0, "unacked": 0, "crc": 0}

        def on_message(ch: Any, method: Any, _properties: Any, body: bytes) -> None:
            state["crc"] ^= zlib.crc32(body)
            state["count"] += 1
            state["unacked"] += 1
            if state["unacked"] >= ack_every or state["count"] >= messages:
                ch.basic_ack(method.delivery_tag, multiple=True)
                state["unacked"] = 0

        broker_cpu = cpu_seconds(pids) if pids else 0.0
        client_cpu = time.process_time()
        start = time.perf_counter()
        deadline = time.monotonic() + limit_s
        tag = channel.basic_consume(queue, on_message)
        while state["count"] < messages:
            if time.monotonic() > deadline:
                raise TimeoutError(f"consumed {state['count']} of {messages} in {limit_s} s")
            connection.process_data_events(time_limit=1)
        seconds = time.perf_counter() - start
        result = {
            "messages": state["count"],
            "seconds": seconds,
            "client_cpu_s": time.process_time() - client_cpu,
            "broker_cpu_s": cpu_seconds(pids) - broker_cpu if pids else None,
        }
        channel.basic_cancel(tag)
        channel.queue_delete(queue)
        return result
    finally:
        _close(connection)


_SENT_AT = struct.Struct(">q")


def latency(
    url: str, queue: str, rate: int = 10_000, seconds: float = 10.0, *, prefetch: int = 1000
) -> dict[str, Any]:
    """Publish at `rate` msg/s for `seconds` (persistent, no confirms) from a thread while
    this thread consumes; per message, receive time - send time (time.monotonic_ns)."""
    total = int(rate * seconds)
    if total < 1:
        raise ValueError(f"rate * seconds must be at least one message, not {total}")
    delays: list[float] = []
    failure: list[BaseException] = []
    stop = threading.Event()

    def send() -> None:
        try:
            connection = _connection(url)
        except BaseException as error:
            failure.append(error)
            return
        try:
            channel = connection.channel()
            publish = channel._impl.basic_publish
            properties = pika.BasicProperties(delivery_mode=PERSISTENT)
            padding = b"x" * (MESSAGE_BYTES - _SENT_AT.size)
            start = time.monotonic()
            i = 0
            while i < total and not stop.is_set():
                due_now = min(total, int((time.monotonic() - start) * rate) + 1)
                while i < due_now:  # every message due now, then one flush
                    publish("", queue, _SENT_AT.pack(time.monotonic_ns()) + padding, properties)
                    i += 1
                _flush(connection)
                pause = start + i / rate - time.monotonic()
                if pause > 0:
                    time.sleep(pause)
        except BaseException as error:
            failure.append(error)
        finally:
            _close(connection)

    connection = _connection(url)
    try:
        channel = connection.channel()
        _fresh_queue(channel, queue)
        channel.basic_qos(prefetch_count=prefetch)
        ack_every = max(1, prefetch // 2)
        unacked = [0]

        def on_message(ch: Any, method: Any, _properties: Any, body: bytes) -> None:
            delays.append((time.monotonic_ns() - _SENT_AT.unpack_from(body)[0]) / 1e6)
            unacked[0] += 1
            if unacked[0] >= ack_every or len(delays) >= total:
                ch.basic_ack(method.delivery_tag, multiple=True)
                unacked[0] = 0

        tag = channel.basic_consume(queue, on_message)
        sender = threading.Thread(target=send, name="rabbitmq-latency-producer", daemon=True)
        sender.start()
        deadline = time.monotonic() + seconds + 30
        try:
            while len(delays) < total and time.monotonic() < deadline and not failure:
                connection.process_data_events(time_limit=0.1)
        finally:
            stop.set()
            sender.join(30)
        if failure:
            raise RuntimeError(f"the latency producer failed: {failure[0]!r}") from failure[0]
        channel.basic_cancel(tag)
        channel.queue_delete(queue)
    finally:
        _close(connection)
    return latency_summary(delays, total)


def _close(connection: Any) -> None:
    try:
        if connection.is_open:
            connection.close()
    except pika.exceptions.AMQPError:
        pass
