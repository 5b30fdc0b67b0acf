"""The pylogd supervisor: the front socket, the workers, the registry and systemd.

    clients --tcp--> front ROUTER --(route by topic, partition)--> DEALER --ipc--> worker N

The supervisor binds the front ROUTER socket and, for each worker, a DEALER on an ipc endpoint
under <data_dir>/run. It reads only a request's header and the start of its body
(protocol.peek_route) and forwards the request frame as it came, behind the ROUTER's identity
(tagged, see broker.transport), to the worker that owns the partition; replies come back the
same way. It answers METADATA, CREATE_TOPIC and DELETE_TOPIC itself. This loop is plain
blocking pyzmq with a poller: it is the one hop every request takes, and the same hop on the
trio adapter runs at two thirds of the rate (perf/README.md, bench_broker.py).

Cluster: every topic lives in ZooKeeper (/config/topics) with the broker that holds each
partition, dealt round robin over the live brokers when it is created. Watches on the topics
and on the brokers keep this process's view current (applied by the loop, never on kazoo's
threads). The loop never waits on ZooKeeper: every registry call after start (creating,
deleting and registering topics, checking a CREATE_TOPIC's progress) runs on one registry
thread, in the order asked, and its result comes back to the loop as an event, so produce and
fetch go on while ZooKeeper is slow or paused (a topic change then waits, or fails with
REGISTRY_UNAVAILABLE when the registry gives up). It opens the partitions assigned to it as
soon as it sees a new topic, deletes them when the topic is deleted through any broker, and
answers METADATA from that view. Requests for a partition held elsewhere get
UNKNOWN_TOPIC_OR_PARTITION naming the holder.

Partition placement (broker.placement): a partition whose folder exists in a log dir stays
there; a new one goes to the log dir holding the fewest partitions; within a dir,
`workers_per_dir` workers share the partitions by XXH32 of `<topic>-<partition>`.

Workers are child processes (`python -m broker.worker`). One that dies is restarted, logged
and counted, after a back-off of 0.1 s doubling to 2 s (MAX_BACKOFF_S); only a crash loop, more
than CRASH_LOOP_RESTARTS restarts in a row, waits longer, doubling to 30 s; 10 s of good
health start it again from 0.1 s. Meanwhile its partitions are answered with
PARTITION_UNAVAILABLE (retriable): clients retry for longer than that (the Python Producer's
delivery_timeout_s is 30 s). Requests in flight at the moment a worker dies get no reply:
clients time out and retry. Children die with pylogd, even when it is killed
(broker.processes).

With no zookeeper.connect, a private standalone ZooKeeper runs as a supervised child under
<data_dir>/zookeeper. One that dies is started again at once, then after 0.5 s doubling while
its starts fail; after ZOOKEEPER_START_ATTEMPTS failed starts in a row pylogd stops (exit 1).
A port in use at start (the front's or ZooKeeper's) stops pylogd at once, naming the process
that holds it. The registry (broker.registry) survives a lost session by itself; while
ZooKeeper is away the broker keeps serving its partitions and only topic creation and deletion
fail (REGISTRY_UNAVAILABLE).

On SIGTERM or SIGINT: tell systemd STOPPING, answer new requests with BROKER_SHUTTING_DOWN,
SIGTERM every worker (each flushes and closes its logs, answering producers waiting on that
flush), forward their last replies, then leave ZooKeeper and exit 0. With NOTIFY_SOCKET set it
sends READY=1 once serving and WATCHDOG=1 every half WATCHDOG_USEC.
"""

from __future__ import annotations

import concurrent.futures
import errno
import functools
import json
import logging
import math
import os
import queue
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import TypeVar

import zmq

from broker import protocol
from broker.config import BrokerConfig, topic_settings
from broker.errors import (
    BrokerShuttingDown,
    InvalidTopic,
    PartitionUnavailable,
    PylogError,
    RegistryUnavailable,
    TopicAlreadyExists,
    UnknownTopicOrPartition,
    UnsupportedApi,
    ZooKeeperStartError,
)
from broker.log.message import Buffer
from broker.placement import partition_folder, place_partitions
from broker.processes import port_holder
from broker.protocol import ErrorCode
from broker.registry import BrokerInfo, Registry, TopicConfig
from broker.transport import (
    COMMAND,
    STATE,
    json_frame,
    reply_envelope,
    requests_frame,
    tagged_identity,
)
from broker.zmqio import NOBLOCK, receive_routed, send_frames
from broker.zookeeper import PrivateZooKeeper

log = logging.getLogger("pylog.supervisor")

T = TypeVar("T")

TICK_MS = 100
FIRST_BACKOFF_S = 0.1
MAX_BACKOFF_S = 2.0
"""The longest wait before a worker's restart, but in a crash loop: well within the retry budget
of clients (the Producer's delivery_timeout_s, 30 s by default)."""
CRASH_LOOP_RESTARTS = 10
"""Restarts in a row (none after HEALTHY_AFTER_S of good health) that make a crash loop..."""
CRASH_LOOP_MAX_BACKOFF_S = 30.0
"""... whose waits go on doubling, up to this."""
HEALTHY_AFTER_S = 10.0
MAX_PARTITIONS = 10_000
WORKER_START_TIMEOUT_S = 60.0
ZOOKEEPER_BACKOFF_S = 0.5
"""The wait before the second start of a dead private ZooKeeper, doubling for each next one."""
ZOOKEEPER_START_ATTEMPTS = 5
"""Failed starts in a row after which pylogd stops."""
CREATE_WAIT_S = 10.0
"""How long CREATE_TOPIC waits for every broker holding a partition to serve it."""


@dataclass
class WorkerHandle:
    """A worker process, the DEALER that talks to it, and its restart state."""

    index: int
    log_dir: Path
    socket: zmq.Socket[bytes] | None = None
    endpoint: str = ""
    process: subprocess.Popen[bytes] | None = None
    connected: bool = False
    restarts: int = 0
    crashes: int = 0
    """Restarts in a row, since it last ran HEALTHY_AFTER_S."""
    backoff_s: float = FIRST_BACKOFF_S
    start_at: float = 0.0
    started_at: float = 0.0
    outbox: list[Buffer] = field(default_factory=list)
    """Requests routed to it and not sent yet: tagged identity, request frame, ..."""


@dataclass
class TopicState:
    """A topic with partitions here: its settings, and the worker of each partition held here."""

    settings: dict[str, int | None]
    workers: dict[int, int]
    served: set[int] = field(default_factory=set)
    """The partitions here that their worker has opened: those registered as served."""


@dataclass
class _PendingCreate:
    """A CREATE_TOPIC to answer once every holder serves its partitions."""

    topic: str
    config: TopicConfig
    tagged: bytes
    correlation_id: int
    deadline: float
    opening: set[int]
    """Its partitions held here that their worker has not yet opened nor failed to open."""
    failure: tuple[int, str] | None = None
    """The error code and message of a partition here that could not be created."""


class Supervisor:
    """Runs pylogd until a signal stops it. `run()` returns the process exit code."""

    def __init__(self, config: BrokerConfig) -> None:
        self.config = config
        self.data_dir = Path(config.broker_data_dir)
        self.run_dir = self.data_dir / "run"
        self.log_dirs = config.log_dir_paths
        self.context = zmq.Context()
        self.front: zmq.Socket[bytes] | None = None
        self.poller = zmq.Poller()
        self.workers: list[WorkerHandle] = []
        self.topics: dict[str, TopicState] = {}
        """The topics with partitions on this broker."""
        self.configs: dict[str, TopicConfig] = {}
        """Every topic of the cluster, as ZooKeeper last said (kept by a watch)."""
        self.live_brokers: dict[int, BrokerInfo] = {}
        """The registered brokers, as ZooKeeper last said (kept by a watch)."""
        self._registry_events: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        """What the registry's watch threads saw and what its calls returned, applied by the
        loop."""
        self._registry_calls = concurrent.futures.ThreadPoolExecutor(
            1, thread_name_prefix="registry"
        )
        """The one thread that makes registry calls for the loop (see _off_loop)."""
        self._zookeeper_starts = concurrent.futures.ThreadPoolExecutor(
            1, thread_name_prefix="zookeeper-start"
        )
        """Where the private ZooKeeper is started again (not behind registry calls that wait
        for it). The JVM dies with the thread that forked it (broker.processes), so this thread
        ends only after the ZooKeeper is stopped (shutdown)."""
        self._zookeeper_starting = False
        self._creating: set[str] = set()
        """Topics whose CREATE_TOPIC is being recorded in ZooKeeper."""
        self._creates_checking = False
        self._pending_creates: list[_PendingCreate] = []
        self.partition_errors: dict[tuple[str, int], tuple[int, str]] = {}
        """Partitions held here that their worker could not open: error code and message."""
        self._creates_checked_at = 0.0
        self.zookeeper: PrivateZooKeeper | None = None
        self._zookeeper_failures = 0
        """Failed starts of the private ZooKeeper since it last ran."""
        self._zookeeper_start_at = 0.0
        self.registry: Registry | None = None
        self.port = int(config.broker_port)
        self.stopping = False
        self.worker_restarts = 0
        self._signal_received: int | None = None
        self._watchdog_every = _watchdog_interval()
        self._watchdog_at = 0.0

    # -- start -----------------------------------------------------------------------------

    def start(self) -> None:
        """Everything up to READY: front socket (first, so that a port in use stops pylogd
        before anything is started), ZooKeeper, registry, topics, workers."""
        for directory in (self.data_dir, self.run_dir, *self.log_dirs):
            directory.mkdir(parents=True, exist_ok=True)
        for stale in self.run_dir.glob("worker-*.sock"):
            stale.unlink()
        self.front = self.context.socket(zmq.ROUTER)
        self.front.setsockopt(zmq.LINGER, 1000)
        self.front.setsockopt(zmq.ROUTER_MANDATORY, 0)
        try:
            if self.port == 0:
                self.port = self.front.bind_to_random_port(f"tcp://{self.config.broker_host}")
            else:
                self.front.bind(f"tcp://{self.config.broker_host}:{self.port}")
        except zmq.ZMQError as error:
            reason = str(error)
            if error.errno == errno.EADDRINUSE:
                reason = f"port {self.port} is already in use by {port_holder(self.port)}"
            raise OSError(
                f"cannot listen on {self.config.broker_host}:{self.port}: {reason}"
            ) from error
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
        self.registry = Registry(
            connect,
            self.config.zookeeper_chroot,
            session_timeout_s=self.config.zookeeper_session_timeout_ms / 1000,
        )
        self.registry.start(timeout=max(10.0, self.config.zookeeper_session_timeout_ms / 1000))
        for d, log_dir in enumerate(self.log_dirs):
            for k in range(self.config.broker_workers_per_dir):
                index = d * self.config.broker_workers_per_dir + k
                self.workers.append(WorkerHandle(index, log_dir))
        self._load_topics()
        for worker in self.workers:
            self._start_worker(worker)
        self._wait_for_workers()
        self.poller.register(self.front, zmq.POLLIN)
        self.registry.register_broker(
            self.config.broker_id,
            BrokerInfo(
                self.config.endpoint_host,
                self.port,
                len(self.workers),
                tuple(str(d) for d in self.log_dirs),
            ),
        )
        events = self._registry_events
        self.registry.watch_brokers(lambda brokers: events.put(lambda: self._on_brokers(brokers)))
        self.registry.watch_topic_configs(
            lambda configs: events.put(lambda: self._on_topic_configs(configs))
        )
        log.info(
            "pylogd %d serving on %s:%d with %d workers over %d log dirs",
            self.config.broker_id,
            self.config.broker_host,
            self.port,
            len(self.workers),
            len(self.log_dirs),
        )
        print(f"pylogd ready on {self.config.broker_host}:{self.port}", flush=True)
        sd_notify(f"READY=1\nSTATUS=serving on {self.config.broker_host}:{self.port}")

    def _load_topics(self) -> None:
        """Topics from ZooKeeper (those with partitions here), plus any partition folders on
        disk that ZooKeeper does not know of (adopted: recorded as held by this broker)."""
        assert self.registry is not None
        me = self.config.broker_id
        configs = self.registry.topic_configs()
        on_disk: dict[str, set[int]] = {}
        for log_dir in self.log_dirs:
            for folder in log_dir.iterdir():
                topic, _, number = folder.name.rpartition("-")
                if folder.is_dir() and topic and number.isdigit():
                    on_disk.setdefault(topic, set()).add(int(number))
        for topic, numbers in sorted(on_disk.items()):
            config = configs.get(topic)
            if config is None:
                partitions = max(numbers) + 1
                log.warning("adopting topic %r found on disk with %d partitions", topic, partitions)
                config = TopicConfig(partitions, (me,) * partitions)
                try:
                    self.registry.create_topic_config(topic, config)
                except PylogError as error:
                    log.error("cannot record adopted topic %r in ZooKeeper: %s", topic, error)
                configs[topic] = config
            elif strays := sorted(numbers - set(config.partitions_of(me))):
                log.warning(
                    "topic %r: partition folders %s on disk are placed elsewhere by ZooKeeper "
                    "(or do not exist there): left alone, not served",
                    topic,
                    strays,
                )
        self.configs = configs
        for topic, config in configs.items():
            if config.partitions_of(me):
                self._place_topic(topic, config)

    def _place_topic(self, topic: str, config: TopicConfig) -> None:
        """Choose a worker for each partition of `topic` that this broker holds."""
        per_dir = self.config.broker_workers_per_dir
        held = [0] * len(self.log_dirs)
        for state in self.topics.values():
            for w in state.workers.values():
                held[w // per_dir] += 1
        numbers = config.partitions_of(self.config.broker_id)
        found = {}
        for number in numbers:
            folder = partition_folder(topic, number)
            for d, log_dir in enumerate(self.log_dirs):
                if (log_dir / folder).is_dir():
                    found[number] = d
                    break
        workers = place_partitions(topic, numbers, held, found, per_dir)
        self.topics[topic] = TopicState(dict(config.settings), workers)

    # -- workers ---------------------------------------------------------------------------

    def _start_worker(self, worker: WorkerHandle) -> None:
        if worker.socket is not None:
            self.poller.unregister(worker.socket)
            worker.socket.close(linger=0)  # requests queued for the dead worker are dropped
        worker.restarts += worker.process is not None
        worker.endpoint = f"ipc://{self.run_dir}/worker-{worker.index}-{worker.restarts}.sock"
        worker.socket = self.context.socket(zmq.DEALER)
        worker.socket.setsockopt(zmq.SNDHWM, 0)
        worker.socket.setsockopt(zmq.RCVHWM, 0)
        worker.socket.bind(worker.endpoint)
        self.poller.register(worker.socket, zmq.POLLIN)
        worker.connected = False
        worker.started_at = time.monotonic()
        worker.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "broker.worker",
                "--index",
                str(worker.index),
                "--endpoint",
                worker.endpoint,
                "--config",
                json.dumps(dict(self.config.values)),
                "--supervisor-pid",
                str(os.getpid()),
            ],
            start_new_session=False,
        )
        log.info("started worker %d (pid %d)", worker.index, worker.process.pid)

    def _open_partitions(self, worker: WorkerHandle, topics: list[str] | None = None) -> None:
        """Tell a connected worker to open its partitions (of `topics`, default all)."""
        entries = []
        for topic in topics or list(self.topics):
            state = self.topics[topic]
            for number, w in state.workers.items():
                if w == worker.index:
                    entries.append([topic, number, str(worker.log_dir), state.settings])
        if entries:  # a worker that is gone gets them all when it says hello again
            self._send_to_worker(
                worker, [COMMAND, json_frame({"op": "open", "partitions": entries})]
            )

    def _send_to_worker(self, worker: WorkerHandle, frames: Sequence[Buffer]) -> bool:
        """Send without blocking, after the requests waiting in the worker's outbox (a command
        never overtakes them). A DEALER whose worker has gone has no peer and would block for
        ever; then the worker counts as not connected (its exit is seen on the next tick) and
        this says False."""
        self._flush_outbox(worker)
        if not worker.connected or worker.socket is None:
            return False
        try:
            send_frames(worker.socket, frames, NOBLOCK)
        except zmq.Again:
            worker.connected = False
            return False
        return True

    def _flush_outbox(self, worker: WorkerHandle) -> None:
        """Send the requests routed to `worker` since the last flush as one REQUESTS message
        (broker.transport). If the worker is gone, answer each PARTITION_UNAVAILABLE (but those
        with ack none, which get no answer)."""
        outbox = worker.outbox
        if not outbox:
            return
        worker.outbox = []
        if self._send_to_worker(worker, [requests_frame(len(outbox) // 2), *outbox]):
            return
        error = PartitionUnavailable(f"worker {worker.index} is restarting; retry shortly")
        for tagged, request in zip(outbox[::2], outbox[1::2], strict=True):
            if not protocol.is_fire_and_forget([request]):
                correlation_id = protocol.peek_correlation_id([request])
                self._answer(bytes(tagged), protocol.encode_error(correlation_id, error))

    def _check_workers(self) -> None:
        now = time.monotonic()
        for worker in self.workers:
            process = worker.process
            if process is not None and process.poll() is not None and worker.start_at <= 0:
                worker.connected = False
                if self.stopping:
                    continue
                self.worker_restarts += 1
                if now - worker.started_at > HEALTHY_AFTER_S:
                    worker.backoff_s = FIRST_BACKOFF_S
                    worker.crashes = 0
                worker.crashes += 1
                worker.start_at = now + worker.backoff_s
                log.error(
                    "worker %d (pid %d) exited with %s; restarting in %.1f s (restart %d)",
                    worker.index,
                    process.pid,
                    process.returncode,
                    worker.backoff_s,
                    self.worker_restarts,
                )
                crash_loop = worker.crashes >= CRASH_LOOP_RESTARTS
                longest = CRASH_LOOP_MAX_BACKOFF_S if crash_loop else MAX_BACKOFF_S
                worker.backoff_s = min(worker.backoff_s * 2, longest)
            if worker.start_at > 0 and now >= worker.start_at and not self.stopping:
                worker.start_at = 0.0
                self._start_worker(worker)

    def _from_worker(self, worker: WorkerHandle, first: bytes, rest: list[zmq.Frame]) -> None:
        if first != STATE:  # a reply, behind the tagged identity of its client: forwarded
            assert self.front is not None  # as zmq.Frames, not copied
            send_frames(self.front, [*reply_envelope(first), *rest])
            return
        state = json.loads(rest[0].bytes)
        if "hello" in state:
            worker.connected = True
            self._open_partitions(worker)
        opened: set[str] = set()
        for topic, number in state.get("opened", []):
            self.partition_errors.pop((topic, number), None)
            self._note_opened(topic, number, None)
            held = self.topics.get(topic)
            if held is not None and number not in held.served:
                held.served.add(number)
                opened.add(topic)
        for topic in sorted(opened):
            self._register_served(topic)
        for topic, number, code, message in state.get("failed", []):
            log.error("worker %d cannot open %s-%d: %s", worker.index, topic, number, message)
            self.partition_errors[(topic, number)] = (code, message)
            self._note_opened(topic, number, (code, message))

    # -- requests --------------------------------------------------------------------------

    def _from_client(self, identity: bytes, frames: list[zmq.Frame]) -> None:
        tagged, request_frames = tagged_identity(identity, frames)
        try:
            if self.stopping:
                raise BrokerShuttingDown("the broker is shutting down")
            route = protocol.peek_route(request_frames)
            if route is not None:  # the hot path: forwarded as it came, nothing else read
                self._route(tagged, request_frames[0], *route)
                return
            header, request = protocol.decode_request(request_frames)
            if isinstance(request, protocol.MetadataRequest):
                reply: protocol.Reply = self._metadata(request.topics)
            elif isinstance(request, protocol.CreateTopicRequest):
                self._create_topic(request, tagged, header.correlation_id)
                return  # answered once every broker holding a partition serves it
            elif isinstance(request, protocol.DeleteTopicRequest):
                self._delete_topic(request.topic, tagged, header.correlation_id)
                return  # answered once ZooKeeper has deleted it
            else:
                raise UnsupportedApi(f"{type(request).__name__} is not served by the front")
            self._answer(tagged, protocol.encode_reply(header.correlation_id, reply))
        except Exception as error:
            if not isinstance(error, PylogError):
                log.exception("unexpected error serving a request")
            if not protocol.is_fire_and_forget(request_frames):
                correlation_id = protocol.peek_correlation_id(request_frames)
                self._answer(tagged, protocol.encode_error(correlation_id, error))

    def _answer(self, tagged: bytes, frames: list[Buffer]) -> None:
        assert self.front is not None
        send_frames(self.front, [*reply_envelope(tagged), *frames])

    def _route(self, tagged: bytes, request: memoryview, topic: str, number: int) -> None:
        state = self.topics.get(topic)
        w = None if state is None else state.workers.get(number)
        if w is None:
            raise UnknownTopicOrPartition(self._not_here(topic, number))
        if self.partition_errors and (topic, number) in self.partition_errors:
            raise protocol.broker_error(*self.partition_errors[(topic, number)])
        worker = self.workers[w]
        if not worker.connected:
            raise PartitionUnavailable(
                f"the worker for {topic}-{number} is restarting; retry shortly"
            )
        worker.outbox += (tagged, request)  # sent with the others drained in this turn

    def _not_here(self, topic: str, number: int) -> str:
        config = self.configs.get(topic)
        if config is None:
            return f"unknown topic {topic!r}"
        if not 0 <= number < config.partitions:
            return f"topic {topic!r} has partitions 0 to {config.partitions - 1}, not {number}"
        return (
            f"partition {number} of {topic!r} is held by broker {config.brokers[number]}, not "
            f"by broker {self.config.broker_id}: send it there (METADATA says where)"
        )

    def _connected_registry(self) -> Registry:
        """The registry, if connected now. Its calls wait for a connection, and this loop
        routes every request: while ZooKeeper is away, fail at once instead."""
        assert self.registry is not None
        if not self.registry.connected:
            raise RegistryUnavailable(
                "ZooKeeper is not connected: topics can be created and deleted once it is back"
            )
        return self.registry

    def _off_loop(
        self,
        call: Callable[[Registry], T],
        done: Callable[[T], None],
        failed: Callable[[PylogError], None],
        thread: concurrent.futures.Executor | None = None,
    ) -> None:
        """Run `call(registry)` on the registry thread (or `thread`), then `done(result)` or,
        if it raised a PylogError, `failed(error)` on this loop (as a registry event)."""
        registry = self.registry
        assert registry is not None
        events = self._registry_events

        def run() -> None:
            try:
                result = call(registry)
            except PylogError as error:
                events.put(functools.partial(failed, error))
            except Exception as error:  # a bug: logged, and the caller told it failed
                log.exception("registry call failed")
                unexpected = RegistryUnavailable(f"registry call failed: {error}")
                events.put(functools.partial(failed, unexpected))
            else:
                events.put(functools.partial(done, result))

        (thread or self._registry_calls).submit(run)

    def _log_registry_failure(self, what: str) -> Callable[[PylogError], None]:
        return lambda error: log.warning("%s: %s", what, error)

    # -- topics ----------------------------------------------------------------------------

    def _create_topic(
        self, request: protocol.CreateTopicRequest, tagged: bytes, correlation_id: int
    ) -> None:
        """Record the topic in ZooKeeper with its partitions dealt over the live brokers, open
        the ones held here, and answer once every holder has registered its partitions (or
        after CREATE_WAIT_S: a holder that died meanwhile leaves its partitions unavailable)."""
        protocol.check_topic_name(request.topic)
        if not 1 <= request.partitions <= MAX_PARTITIONS:
            raise InvalidTopic(
                f"partitions must be from 1 to {MAX_PARTITIONS}, not {request.partitions}"
            )
        settings = topic_settings(dict(request.config))
        topic = request.topic
        if topic in self.configs or topic in self._creating:
            raise TopicAlreadyExists(f"topic {topic!r} exists")
        self._connected_registry()  # fail at once while ZooKeeper is away
        me = self.config.broker_id

        def record(registry: Registry) -> TopicConfig:
            holders = {*registry.brokers(), me}  # now, not as last watched
            config = TopicConfig.spread(request.partitions, holders, settings)
            registry.create_topic_config(topic, config)
            return config

        def refused(error: PylogError) -> None:
            self._creating.discard(topic)
            self._answer(tagged, protocol.encode_error(correlation_id, error))

        self._creating.add(topic)
        self._off_loop(
            record, lambda config: self._created(topic, config, tagged, correlation_id), refused
        )

    def _created(self, topic: str, config: TopicConfig, tagged: bytes, correlation_id: int) -> None:
        """A new topic is recorded in ZooKeeper: open its partitions here and answer once every
        holder serves its own (see _answer_creates)."""
        self._creating.discard(topic)
        self.configs[topic] = config
        self._hold_topic(topic, config)
        here = set(config.partitions_of(self.config.broker_id))
        log.info(
            "created topic %r with %d partitions over brokers %s",
            topic,
            config.partitions,
            sorted(set(config.brokers)),
        )
        deadline = time.monotonic() + CREATE_WAIT_S
        self._pending_creates.append(
            _PendingCreate(topic, config, tagged, correlation_id, deadline, here)
        )

    def _note_opened(self, topic: str, number: int, failure: tuple[int, str] | None) -> None:
        """A worker opened a partition here (failure None) or could not (its error code and
        message): the CREATE_TOPIC waiting for it learns so."""
        for pending in self._pending_creates:
            if pending.topic == topic:
                pending.opening.discard(number)
                pending.failure = pending.failure or failure

    def _undo_create(self, pending: _PendingCreate) -> None:
        """A topic one of whose partitions here could not be created is not created: its
        config is deleted from ZooKeeper and its partitions (and folders) here are dropped, then
        the CREATE_TOPIC is answered with the partition's error. If ZooKeeper cannot be
        reached, the topic stays, with that partition's error in METADATA."""
        topic = pending.topic
        assert pending.failure is not None
        code, message = pending.failure
        log.error("topic %r is not created: %s", topic, message)
        error = protocol.encode_error(pending.correlation_id, ErrorCode(code), message)

        def undone(_: None) -> None:
            self.configs.pop(topic, None)
            self._drop_topic(topic)
            self._answer(pending.tagged, error)

        def not_undone(failure: PylogError) -> None:
            log.error("topic %r: cannot undo its creation: %s", topic, failure)
            self._answer(pending.tagged, error)

        self._off_loop(lambda registry: registry.delete_topic_config(topic), undone, not_undone)

    def _hold_topic(self, topic: str, config: TopicConfig) -> None:
        """Open this broker's partitions of a topic (nothing if none); each is registered as
        served once its worker says it opened it."""
        if topic in self.topics or not config.partitions_of(self.config.broker_id):
            return
        self._place_topic(topic, config)
        for worker in self.workers:
            if worker.connected:
                self._open_partitions(worker, [topic])

    def _register_served(self, topic: str) -> None:
        """Register in ZooKeeper the partitions of `topic` that are open here."""
        partitions = sorted(self.topics[topic].served)
        me = self.config.broker_id
        self._off_loop(  # on RegistryUnavailable the registry registers it once connected
            lambda registry: registry.register_topic_partitions(topic, me, partitions),
            lambda _: None,
            self._log_registry_failure(f"topic {topic!r}: registration deferred"),
        )

    def _delete_topic(self, topic: str, tagged: bytes, correlation_id: int) -> None:
        """Delete the topic's config in ZooKeeper, then its partitions here (every holder
        deletes its own when its watch sees the config gone), then answer."""
        if topic not in self.configs:
            raise UnknownTopicOrPartition(f"unknown topic {topic!r}")
        self._connected_registry()  # fail at once while ZooKeeper is away

        def deleted(_: None) -> None:
            if self.configs.pop(topic, None) is not None:
                self._drop_topic(topic)
                log.info("deleted topic %r", topic)
            self._answer(tagged, protocol.encode_reply(correlation_id, protocol.EmptyReply()))

        def refused(error: PylogError) -> None:
            self._answer(tagged, protocol.encode_error(correlation_id, error))

        self._off_loop(lambda registry: registry.delete_topic_config(topic), deleted, refused)

    def _drop_topic(self, topic: str) -> None:
        """Delete this broker's partitions of `topic`, with their data, and their registration."""
        state = self.topics.pop(topic, None)
        if state is None:
            return
        for number in state.workers:
            self.partition_errors.pop((topic, number), None)
        me = self.config.broker_id
        self._off_loop(  # on RegistryUnavailable: deleted at the next reconnection
            lambda registry: registry.unregister_topic(topic, me),
            lambda _: None,
            self._log_registry_failure(f"topic {topic!r}: unregistration deferred"),
        )
        for worker in self.workers:
            folders = {
                number: worker.log_dir / f"{topic}-{number}"
                for number, w in state.workers.items()
                if w == worker.index
            }
            if not folders:
                continue
            partitions = [[number, str(folder)] for number, folder in folders.items()]
            command = {"op": "delete", "topic": topic, "partitions": partitions}
            if not self._send_to_worker(worker, [COMMAND, json_frame(command)]):
                for folder in folders.values():  # not running: nobody has the folders open
                    shutil.rmtree(folder, True)

    def _apply_registry_events(self) -> None:
        """Apply what the watches saw (brokers that came or went, topics created or deleted
        through other brokers) and what registry calls made off the loop returned."""
        while True:
            try:
                apply = self._registry_events.get_nowait()
            except queue.Empty:
                return
            apply()

    def _on_brokers(self, brokers: dict[int, BrokerInfo]) -> None:
        self.live_brokers = brokers

    def _on_topic_configs(self, configs: dict[str, TopicConfig]) -> None:
        for topic, config in configs.items():
            self.configs[topic] = config
            self._hold_topic(topic, config)
        for topic in [t for t in self.configs if t not in configs and t not in self._creating]:
            self._drop_if_deleted(topic)

    def _drop_if_deleted(self, topic: str) -> None:
        """Drop the topic once ZooKeeper confirms /config/topics/<topic> is gone (a watch also
        leaves out unreadable nodes, and data is deleted only for a topic that is)."""

        def gone(error: PylogError) -> None:
            if not isinstance(error, UnknownTopicOrPartition):
                log.warning(
                    "topic %r missing from a watch but not confirmed gone: %s", topic, error
                )
            elif self.configs.pop(topic, None) is not None:
                self._drop_topic(topic)
                log.info("topic %r was deleted through another broker", topic)

        self._off_loop(lambda registry: registry.topic_config(topic), lambda _: None, gone)

    def _answer_creates(self) -> None:
        """Answer CREATE_TOPIC requests whose partitions every holder now serves (asked of
        ZooKeeper on the registry thread, once a tick at most), and those that failed here."""
        for pending in [p for p in self._pending_creates if p.failure is not None]:
            self._pending_creates.remove(pending)
            self._undo_create(pending)
        now = time.monotonic()
        if (
            not self._pending_creates
            or self._creates_checking
            or now < self._creates_checked_at + TICK_MS / 1000
        ):
            return
        self._creates_checked_at = now
        self._creates_checking = True
        topics = [pending.topic for pending in self._pending_creates]
        self._off_loop(
            lambda registry: {topic: registry.topic_brokers(topic) for topic in topics},
            self._on_served,
            lambda _: self._on_served({}),
        )

    def _on_served(self, registered: dict[str, dict[int, tuple[int, ...]]]) -> None:
        """What ZooKeeper says each pending CREATE_TOPIC's holders serve: answer those served
        (or past CREATE_WAIT_S)."""
        self._creates_checking = False
        now = time.monotonic()
        waiting = []
        for pending in self._pending_creates:
            served = {
                p for partitions in registered.get(pending.topic, {}).values() for p in partitions
            }
            unserved = len(served) < pending.config.partitions or pending.opening
            if pending.failure is not None or (unserved and now < pending.deadline):
                waiting.append(pending)
                continue
            if len(served) < pending.config.partitions:
                log.warning(
                    "topic %r: partitions %s not served yet after %.0f s (their broker down?)",
                    pending.topic,
                    sorted(set(range(pending.config.partitions)) - served),
                    CREATE_WAIT_S,
                )
            reply = protocol.encode_reply(pending.correlation_id, protocol.EmptyReply())
            self._answer(pending.tagged, reply)
        self._pending_creates = waiting

    def _metadata(self, topics: tuple[str, ...] | list[str]) -> protocol.MetadataReply:
        """From what the watches last said: no ZooKeeper request on this loop."""
        me = self.config.broker_id
        live = dict(self.live_brokers)
        live[me] = BrokerInfo(self.config.endpoint_host, self.port)
        brokers = tuple(
            protocol.BrokerInfo(broker_id, info.host, info.port)
            for broker_id, info in sorted(live.items())
        )
        infos = []
        for topic in topics or sorted(self.configs):
            config = self.configs.get(topic)
            if config is None:
                infos.append(
                    protocol.TopicInfo(topic, protocol.ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, ())
                )
                continue
            state = self.topics.get(topic)
            partitions = []
            for number, holder in enumerate(config.brokers):
                failure = self.partition_errors.get((topic, number))
                if holder == me:
                    w = None if state is None else state.workers.get(number)
                    serving = w is not None and self.workers[w].connected
                else:
                    serving = holder in live
                if failure is not None:  # its worker could not open it (disk full, EMFILE...)
                    code = ErrorCode(failure[0])
                else:
                    code = ErrorCode.NONE if serving else ErrorCode.PARTITION_UNAVAILABLE
                partitions.append(protocol.PartitionInfo(number, holder, code))
            infos.append(protocol.TopicInfo(topic, protocol.ErrorCode.NONE, tuple(partitions)))
        return protocol.MetadataReply(brokers, tuple(infos))

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

    def _serve(self) -> None:
        deadline = math.inf
        while True:
            if self._signal_received is not None and not self.stopping:
                log.info("%s: shutting down", signal.Signals(self._signal_received).name)
                sd_notify("STOPPING=1")
                self.stopping = True
                for worker in self.workers:
                    if worker.process is not None and worker.process.poll() is None:
                        worker.process.send_signal(signal.SIGTERM)
                deadline = time.monotonic() + self.config.broker_shutdown_timeout_ms / 1000
            if self.stopping:
                if all(w.process is None or w.process.poll() is not None for w in self.workers):
                    self._drain_workers()
                    return
                if time.monotonic() > deadline:
                    for worker in self.workers:
                        if worker.process is not None and worker.process.poll() is None:
                            log.error("worker %d did not exit in time: killing it", worker.index)
                            worker.process.kill()
            self._poll_once()

    def _poll_once(self) -> None:
        """Serve what the sockets hold (a bounded amount of each), then housekeeping."""
        for sock, _ in self.poller.poll(TICK_MS):
            worker = next((w for w in self.workers if w.socket is sock), None)
            for _ in range(256):  # bounded, so the other sockets and housekeeping get a turn
                try:
                    first, rest = receive_routed(sock, NOBLOCK)
                except zmq.Again:
                    break
                if worker is None:
                    self._from_client(first, rest)
                else:
                    self._from_worker(worker, first, rest)
            if worker is None:
                for each in self.workers:
                    self._flush_outbox(each)
        self._apply_registry_events()
        self._answer_creates()
        self._check_workers()
        self._check_zookeeper()
        self._tick_watchdog()

    def _wait_for_workers(self) -> None:
        """Until every worker has said hello (it then gets its partitions, in order)."""
        deadline = time.monotonic() + WORKER_START_TIMEOUT_S
        while not all(w.connected for w in self.workers):
            if time.monotonic() > deadline or self._signal_received is not None:
                missing = [w.index for w in self.workers if not w.connected]
                raise OSError(f"workers {missing} did not start in {WORKER_START_TIMEOUT_S} s")
            self._poll_once()

    def _drain_workers(self) -> None:
        """Forward the replies workers sent before they exited."""
        for worker in self.workers:
            while worker.socket is not None:
                try:
                    first, rest = receive_routed(worker.socket, NOBLOCK)
                except zmq.Again:
                    break
                self._from_worker(worker, first, rest)

    def _check_zookeeper(self) -> None:
        """Start the private ZooKeeper again once it has died (off the loop): at once, then,
        while its starts fail, after ZOOKEEPER_BACKOFF_S doubling; ZooKeeperStartError (pylogd
        stops) after ZOOKEEPER_START_ATTEMPTS failed starts in a row."""
        zk = self.zookeeper
        if zk is None or self._zookeeper_starting or zk.alive or self.stopping:
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
        self._off_loop(
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
            waited_s = ZOOKEEPER_BACKOFF_S * (2 ** (failures - 1) - 1)
            raise ZooKeeperStartError(
                f"the private ZooKeeper could not be restarted ({failures} failed starts "
                f"in a row over {waited_s:g} s), so pylogd stops: {error}"
            ) from error
        wait_s = ZOOKEEPER_BACKOFF_S * 2 ** (failures - 1)
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
        """Stop workers (if still running), leave the registry, stop ZooKeeper, close sockets."""
        for worker in self.workers:
            process = worker.process
            if process is not None and process.poll() is None:
                process.send_signal(signal.SIGTERM)
                try:
                    process.wait(self.config.broker_shutdown_timeout_ms / 1000)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()
        self._registry_calls.shutdown(wait=True, cancel_futures=True)
        if self.registry is not None:
            self.registry.stop()
        if self.zookeeper is not None:
            self._zookeeper_starts.shutdown(wait=True, cancel_futures=True)  # a start ends first
            self.zookeeper.stop()
        self._zookeeper_starts.shutdown(wait=True)
        self.context.destroy(linger=1000)
        for stale in self.run_dir.glob("worker-*.sock"):
            stale.unlink(missing_ok=True)


def sd_notify(state: str) -> None:
    """Send a state line to systemd when NOTIFY_SOCKET is set (Type=notify); else nothing."""
    address = os.environ.get("NOTIFY_SOCKET")
    if not address:
        return
    if address.startswith("@"):
        address = "\0" + address[1:]
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        try:
            sock.sendto(state.encode(), address)
        except OSError as error:
            log.warning("sd_notify %r failed: %s", state, error)


def _watchdog_interval() -> float:
    usec = os.environ.get("WATCHDOG_USEC", "")
    return int(usec) / 2e6 if usec.isdigit() and int(usec) > 0 else 0.0


def run_pylogd(config: BrokerConfig) -> int:
    return Supervisor(config).run()
