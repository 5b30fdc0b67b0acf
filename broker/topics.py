"""Topic management: this broker's view of the cluster's topics, and their creation and deletion.

Every topic lives in ZooKeeper (/config/topics) with the broker that holds each partition,
dealt round robin over the live brokers when it is created. Watches on the topics and on the
brokers keep this view current. Nothing here waits on ZooKeeper: every registry call after
start (creating, deleting and registering topics, checking a CREATE_TOPIC's progress) runs on
one registry thread (RegistryCalls), in the order asked, and its result, like what a watch saw,
comes back as an event that the loop applies (`tick`), never on kazoo's threads. So
produce and fetch go on while ZooKeeper is slow or paused (a topic change then waits, or fails
with REGISTRY_UNAVAILABLE when the registry gives up).

This broker opens the partitions assigned to it (placed on its workers by broker.placement) as
soon as it sees a new topic, registers each as served once its worker says it opened it, and
deletes them when the topic is deleted through any broker. Requests for a partition held
elsewhere get UNKNOWN_TOPIC_OR_PARTITION naming the holder. A topic's settings changed through
any broker (ALTER_CONFIG) reach this broker through a watch on the data of the topic's node,
one per topic held here, and go to the workers holding its partitions, which apply them live.

It also answers DESCRIBE_CLUSTER (from what the watches said) and DESCRIBE_CONFIG (reading
the topic's node). Topic management never calls into the front: replies it owes (CREATE_TOPIC,
DELETE_TOPIC, DESCRIBE_CONFIG, ALTER_CONFIG) go to `answers`, the queue the front sends from on
its loop; workers get their commands through the pool.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import logging
import shutil
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from broker import control, protocol
from broker.config import (
    REPLICA_SETTINGS,
    TOPIC_SETTINGS,
    BrokerConfig,
    replica_setting,
    topic_settings,
)
from broker.errors import (
    InvalidTopic,
    PylogError,
    RegistryUnavailable,
    TopicAlreadyExists,
    UnknownTopicOrPartition,
)
from broker.placement import partition_folder, place_partitions
from broker.pool import Answers, WorkerHandle, WorkerPool
from broker.protocol import ErrorCode
from broker.registry import (
    BrokerInfo,
    PartitionState,
    PartitionStateChanged,
    Registry,
    TopicConfig,
)
from broker.registry_calls import RegistryCalls
from broker.replication.lease import Lease, LeaseKeeper

log = logging.getLogger("pylog.supervisor")

T = TypeVar("T")

MAX_PARTITIONS = 10_000
CREATE_WAIT_S = 10.0
"""How long CREATE_TOPIC waits for every broker holding a partition to serve it."""
CREATE_CHECK_S = 0.1
"""How often, at most, ZooKeeper is asked whether pending CREATE_TOPICs are served."""
VERSION = importlib.metadata.version("pylog")
"""The pylog version this broker runs, registered for DESCRIBE_CLUSTER."""


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


class Topics:
    """The topics of the cluster as this broker sees them, and those it holds."""

    def __init__(
        self, config: BrokerConfig, pool: WorkerPool, calls: RegistryCalls, answers: Answers
    ) -> None:
        self.config = config
        self.me = config.broker_id
        self.log_dirs = config.log_dir_paths
        self.pool = pool
        self.calls = calls
        self.answers = answers
        self.held: dict[str, TopicState] = {}
        """The topics with partitions on this broker."""
        self.configs: dict[str, TopicConfig] = {}
        """Every topic of the cluster, as ZooKeeper last said (kept by a watch)."""
        self.live_brokers: dict[int, BrokerInfo] = {}
        """The registered brokers, as ZooKeeper last said (kept by a watch)."""
        self.partition_errors: dict[tuple[str, int], tuple[int, str]] = {}
        """Partitions held here that their worker could not open: error code and message."""
        self._creating: set[str] = set()
        """Topics whose CREATE_TOPIC is being recorded in ZooKeeper."""
        self._creates_checking = False
        self._creates_checked_at = 0.0
        self._pending_creates: list[_PendingCreate] = []
        self.states: dict[tuple[str, int], tuple[PartitionState, int]] = {}
        """The state node (leader, epoch, ISR) and its version of each replicated partition
        held here, as its watch last said."""
        self._state_watches: dict[str, object] = {}
        self.isr_changes: Counter[str] = Counter()
        """ISR changes written as a leader, by kind: shrink, expand (broker.metrics)."""
        self.leases = LeaseKeeper(
            calls, self.me, config.zookeeper_session_timeout_ms / 1000, self._send_lease
        )
        """The leaders' lease, renewed from ZooKeeper and sent to every worker."""
        """The replicated topics held here whose partitions' state nodes are watched, each
        with its watches' token."""
        self._config_watches: dict[str, object] = {}
        """The topics whose node's data is watched (every topic: a reassignment may give this
        broker partitions of any), each with its watch's token (so that what a watch of a
        topic dropped since reports is passed over)."""

    # -- start -----------------------------------------------------------------------------

    def load(self) -> None:
        """Topics from ZooKeeper (those with partitions here), plus any partition folders on
        disk that ZooKeeper does not know of (adopted: recorded as held by this broker). At
        start, before the loop: these registry calls wait."""
        registry = self.calls.registry
        assert registry is not None
        me = self.me
        configs = registry.topic_configs()
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
                    registry.create_topic_config(topic, config)
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
            if mine := config.partitions_of(me):
                self._place(topic, config, mine)

    def watch(self) -> None:
        """Keep the view of brokers and topics current from ZooKeeper's watches."""
        registry = self.calls.registry
        assert registry is not None
        calls = self.calls
        registry.watch_brokers(lambda brokers: calls.report(lambda: self._on_brokers(brokers)))
        registry.watch_topic_configs(
            lambda configs: calls.report(lambda: self._on_topic_configs(configs))
        )
        for topic in self.configs:
            self._watch_config(topic)
            self._watch_states(topic)

    def registration(self, port: int) -> BrokerInfo:
        """What this broker registers in ZooKeeper: its front's address (`port` as bound, or
        broker.advertised_port), workers, log dirs and version."""
        return BrokerInfo(
            self.config.endpoint_host,
            self.config.endpoint_port(port),
            len(self.pool.workers),
            tuple(str(d) for d in self.log_dirs),
            VERSION,
            self.config.broker_rack or None,
        )

    def _watch_config(self, topic: str) -> None:
        """Watch the data of the node of `topic`: its settings change live, its partitions'
        replicas by reassignment."""
        if topic in self._config_watches:
            return
        registry = self.calls.registry
        assert registry is not None
        token = self._config_watches[topic] = object()
        calls = self.calls

        def changed(config: TopicConfig | None) -> bool:  # on kazoo's thread: hand it on
            calls.report(lambda: self._on_config(topic, token, config))
            return config is not None and self._config_watches.get(topic) is token

        registry.watch_topic_config(topic, changed)

    def _watch_states(self, topic: str) -> None:
        """Watch the state nodes of the partitions of `topic`, if it is replicated (every
        partition's: METADATA names their leaders): each change of a partition held here goes
        to the worker holding it as its role (_send_role)."""
        config = self.configs.get(topic)
        if topic in self._state_watches or config is None or not _replicated(config):
            return
        registry = self.calls.registry
        assert registry is not None
        token = self._state_watches[topic] = object()
        calls = self.calls
        for number in range(config.partitions):

            def changed(state: PartitionState | None, version: int, number: int = number) -> bool:
                calls.report(lambda: self._on_state(topic, number, token, state, version))
                return self._state_watches.get(topic) is token

            registry.watch_partition_state(topic, number, changed)

    def _on_state(
        self, topic: str, number: int, token: object, state: PartitionState | None, version: int
    ) -> None:
        if self._state_watches.get(topic) is not token:
            return  # a watch of a topic dropped since
        if state is None:
            self.states.pop((topic, number), None)
            return
        old = self.states.get((topic, number))
        self.states[(topic, number)] = (state, version)
        if old is None or old[0] != state:
            log.info(
                "%s-%d: leader %d, epoch %d, ISR %s",
                topic,
                number,
                state.leader,
                state.leader_epoch,
                list(state.isr),
            )
        self._send_role(topic, number)

    def _send_role(self, topic: str, number: int) -> None:
        """Tell the worker holding a replicated partition its role, from the partition's
        state node: lead, follow the leader at its endpoint, or neither (no leader, or the
        leader's broker not registered yet: sent again when it is)."""
        known = self.states.get((topic, number))
        config = self.configs.get(topic)
        held = self.held.get(topic)
        if known is None or config is None or held is None or number not in held.served:
            return  # sent once all of them are known
        w = held.workers[number]
        state = known[0]
        leader = self.live_brokers.get(state.leader)
        endpoint = None if leader is None else f"tcp://{leader.host}:{leader.port}"
        role = control.PartitionRole(
            topic,
            number,
            state.leader,
            state.leader_epoch,
            state.leader_broker_epoch,
            state.isr,
            config.replicas[number],
            endpoint,
            None if leader is None else leader.curve_key,
            replica_setting(config.settings, "min_insync_replicas"),
            known[1],
        )
        handle = self.pool.workers[w]
        if handle.connected:
            self.pool.send(handle, control.encode(role))

    def under_replicated(self) -> int:
        """How many replicated partitions led here have an ISR smaller than their replicas
        (read by the metrics thread: a copy of the states is taken first)."""
        me, configs = self.me, self.configs
        return sum(
            1
            for (topic, number), (state, _) in list(self.states.items())
            if state.leader == me
            and topic in configs
            and len(state.isr) < len(configs[topic].replicas[number])
        )

    def change_isr(self, topic: str, number: int, epoch: int, isr: list[int]) -> None:
        """A worker leading a partition asks for its ISR to be `isr`: written to the state node
        if this broker still leads it in `epoch`, conditionally on the node's version as last
        seen (another write since, the controller's, wins: the leader learns it from the
        watch). The watch brings the written state back to the worker."""
        known = self.states.get((topic, number))
        if known is None:
            return
        state, version = known
        if state.leader != self.me or state.leader_epoch != epoch or list(state.isr) == isr:
            return
        changed = dataclasses.replace(state, isr=tuple(isr))
        kind = "shrink" if len(isr) < len(state.isr) else "expand"

        def written(_: int) -> None:
            self.isr_changes[kind] += 1
            log.info("%s-%d: ISR %s -> %s (%s)", topic, number, list(state.isr), isr, kind)

        def refused(error: PylogError) -> None:
            level = logging.INFO if isinstance(error, PartitionStateChanged) else logging.ERROR
            log.log(level, "%s-%d: ISR change to %s not made: %s", topic, number, isr, error)

        self.calls.call(
            lambda registry: registry.write_partition_state(topic, number, changed, version),
            written,
            refused,
        )

    def _place(self, topic: str, config: TopicConfig, numbers: list[int]) -> None:
        """Choose a worker for each of `numbers`, partitions of `topic` that this broker
        holds (added to those it holds already)."""
        per_dir = self.config.broker_workers_per_dir
        held = [0] * len(self.log_dirs)
        for state in self.held.values():
            for w in state.workers.values():
                held[w // per_dir] += 1
        found = {}
        for number in numbers:
            folder = partition_folder(topic, number)
            for d, log_dir in enumerate(self.log_dirs):
                if (log_dir / folder).is_dir():
                    found[number] = d
                    break
        workers = place_partitions(topic, numbers, held, found, per_dir)
        state = self.held.setdefault(topic, TopicState(dict(config.settings), {}))
        state.workers.update(workers)

    # -- routing ---------------------------------------------------------------------------

    def route(self, topic: str, number: int) -> WorkerHandle:
        """The worker of a partition held here: UnknownTopicOrPartition if it is not held
        here, its error if its worker could not open it."""
        state = self.held.get(topic)
        w = None if state is None else state.workers.get(number)
        if w is None:
            raise UnknownTopicOrPartition(self._not_here(topic, number))
        if self.partition_errors and (topic, number) in self.partition_errors:
            raise protocol.broker_error(*self.partition_errors[(topic, number)])
        return self.pool.workers[w]

    def _not_here(self, topic: str, number: int) -> str:
        config = self.configs.get(topic)
        if config is None:
            return f"unknown topic {topic!r}"
        if not 0 <= number < config.partitions:
            return f"topic {topic!r} has partitions 0 to {config.partitions - 1}, not {number}"
        return (
            f"partition {number} of {topic!r} is held by broker {config.brokers[number]}, not "
            f"by broker {self.me}: send it there (METADATA says where)"
        )

    def metadata(self, topics: tuple[str, ...] | list[str], port: int) -> protocol.MetadataReply:
        """From what the watches last said: no ZooKeeper request on the loop. `port`: the
        front's."""
        me = self.me
        live = dict(self.live_brokers)
        live[me] = self.registration(port)
        brokers = tuple(
            protocol.BrokerInfo(broker_id, info.host, info.port, info.rack or "")
            for broker_id, info in sorted(live.items())
        )
        infos = []
        for topic in dict.fromkeys(topics) or sorted(self.configs):  # each topic asked once
            config = self.configs.get(topic)
            if config is None:
                infos.append(
                    protocol.TopicInfo(topic, protocol.ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, ())
                )
                continue
            state = self.held.get(topic)
            partitions = []
            for number, replicas in enumerate(config.replicas):
                # A replicated partition's leader is its state node's; a partition without
                # replicas is led by its one holder.
                known = self.states.get((topic, number))
                leader, epoch, isr = replicas[0], -1, replicas
                if known is not None:
                    leader, epoch, isr = known[0].leader, known[0].leader_epoch, known[0].isr
                failure = self.partition_errors.get((topic, number))
                if leader == me:
                    w = None if state is None else state.workers.get(number)
                    serving = w is not None and self.pool.workers[w].connected
                else:
                    serving = leader in live
                if failure is not None and leader == me:  # could not open it (disk full...)
                    code = ErrorCode(failure[0])
                else:
                    code = ErrorCode.NONE if serving else ErrorCode.PARTITION_UNAVAILABLE
                partitions.append(
                    protocol.PartitionInfo(number, leader, code, epoch, replicas, isr)
                )
            infos.append(protocol.TopicInfo(topic, protocol.ErrorCode.NONE, tuple(partitions)))
        return protocol.MetadataReply(brokers, tuple(infos))

    # -- workers ---------------------------------------------------------------------------

    def worker_report(self, worker: WorkerHandle, report: control.Report) -> None:
        """A worker's report (broker.control) but its statistics (the front keeps those)."""
        match report:
            case control.WorkerHello():  # connected: the lease, then its partitions
                worker.connected = True
                self.pool.send(worker, _lease_command(self.leases.lease))
                self._open_partitions(worker)
            case control.AskIsr(topic, number, leader_epoch, isr):
                self.change_isr(topic, number, leader_epoch, list(isr))
            case control.PartitionsOpened(opened, failed):
                self._opened(worker, opened, failed)
            case control.PartitionsDeleted():
                pass  # its folders are gone: nothing waits for it
            case control.WorkerStats():
                pass  # kept by the front

    def _opened(
        self,
        worker: WorkerHandle,
        opened: Sequence[tuple[str, int]],
        failed: Sequence[tuple[str, int, int, str]],
    ) -> None:
        """The partitions a worker opened (registered as served, and given their roles), and
        those it could not."""
        registered: set[str] = set()
        for topic, number in opened:
            self.partition_errors.pop((topic, number), None)
            self._note_opened(topic, number, None)
            held = self.held.get(topic)
            if held is not None and number not in held.served:
                held.served.add(number)
                registered.add(topic)
        for topic in sorted(registered):
            self._register_served(topic)
        for topic, number in opened:
            self._send_role(topic, number)
        for topic, number, code, message in failed:
            log.error("worker %d cannot open %s-%d: %s", worker.index, topic, number, message)
            self.partition_errors[(topic, number)] = (code, message)
            self._note_opened(topic, number, (code, message))

    def _open_partitions(self, worker: WorkerHandle, topics: list[str] | None = None) -> None:
        """Tell a connected worker to open its partitions (of `topics`, default all; those
        open already stay as they are). A partition of a topic whose states are watched
        opens replicated: it serves no client until its role says it leads."""
        entries: list[control.PartitionToOpen] = []
        for topic in topics or list(self.held):
            state = self.held[topic]
            config = self.configs.get(topic)
            replicated = topic in self._state_watches or (
                config is not None and _replicated(config)
            )
            for number, w in state.workers.items():
                if w == worker.index:
                    entries.append(
                        control.PartitionToOpen(
                            topic, number, str(worker.log_dir), state.settings, replicated
                        )
                    )
        if entries:  # a worker that is gone gets them all when it says hello again
            self.pool.send(worker, control.encode(control.OpenPartitions(tuple(entries))))

    def _register_served(self, topic: str) -> None:
        """Register in ZooKeeper the partitions of `topic` that are open here."""
        partitions = sorted(self.held[topic].served)
        me = self.me
        self.calls.call(  # on RegistryUnavailable the registry registers it once connected
            lambda registry: registry.register_topic_partitions(topic, me, partitions),
            lambda _: None,
            _log_registry_failure(f"topic {topic!r}: registration deferred"),
        )

    def _hold_topic(self, topic: str, config: TopicConfig) -> None:
        """Open this broker's partitions of a topic (nothing if none); each is registered as
        served once its worker says it opened it."""
        if topic not in self.held:
            self._hold_partitions(topic, config, config.partitions_of(self.me))

    def _hold_partitions(self, topic: str, config: TopicConfig, numbers: list[int]) -> None:
        """Open partitions `numbers` of `topic` here (placed on workers first), as at the
        topic's creation or when a reassignment adds this broker to their replicas."""
        if not numbers:
            return
        self._place(topic, config, numbers)
        for worker in self.pool.workers:
            if worker.connected:
                self._open_partitions(worker, [topic])

    def _drop_topic(self, topic: str) -> None:
        """Delete this broker's partitions of `topic`, with their data, and their registration."""
        self._state_watches.pop(topic, None)
        self._config_watches.pop(topic, None)
        for key in [key for key in self.states if key[0] == topic]:
            del self.states[key]
        state = self.held.get(topic)
        if state is not None:
            self._drop_partitions(topic, list(state.workers))

    def _drop_partitions(self, topic: str, numbers: list[int]) -> None:
        """Delete partitions `numbers` of `topic` here, with their data, and register what
        is left of the topic here (or unregister it when nothing is): at the topic's deletion,
        or when a reassignment removed this broker from their replicas."""
        state = self.held[topic]
        workers = {number: state.workers.pop(number) for number in numbers}
        for number in numbers:
            state.served.discard(number)
            self.partition_errors.pop((topic, number), None)
        me = self.me
        if not state.workers:
            del self.held[topic]
            self.calls.call(  # on RegistryUnavailable: deleted at the next reconnection
                lambda registry: registry.unregister_topic(topic, me),
                lambda _: None,
                _log_registry_failure(f"topic {topic!r}: unregistration deferred"),
            )
        else:
            self._register_served(topic)
        for worker in self.pool.workers:
            folders = {
                number: worker.log_dir / partition_folder(topic, number)
                for number, w in workers.items()
                if w == worker.index
            }
            if not folders:
                continue
            partitions = tuple((number, str(folder)) for number, folder in folders.items())
            command = control.encode(control.DeletePartitions(topic, partitions))
            if not self.pool.send(worker, command):
                for folder in folders.values():  # not running: nobody has the folders open
                    shutil.rmtree(folder, True)

    # -- create and delete -----------------------------------------------------------------

    def _connected_registry(self) -> Registry:
        """The registry, if connected now. Its calls wait for a connection, and the loop
        routes every request: while ZooKeeper is away, fail at once instead."""
        registry = self.calls.registry
        assert registry is not None
        if not registry.connected:
            raise RegistryUnavailable(
                "ZooKeeper is not connected: topics can be created and deleted once it is back"
            )
        return registry

    def create(
        self, request: protocol.CreateTopicRequest, tagged: bytes, correlation_id: int
    ) -> None:
        """Record the topic in ZooKeeper with its partitions dealt over the live brokers, open
        the ones held here, and answer once every holder has registered its partitions (or
        after CREATE_WAIT_S: a holder that died meanwhile leaves its partitions unavailable).
        A request refused at once raises its error."""
        protocol.check_topic_name(request.topic)
        if not 1 <= request.partitions <= MAX_PARTITIONS:
            raise InvalidTopic(
                f"partitions must be from 1 to {MAX_PARTITIONS}, not {request.partitions}"
            )
        settings = topic_settings(dict(request.config))
        topic = request.topic
        replication_factor = _checked(self.config, topic, settings)
        if topic in self.configs or topic in self._creating:
            raise TopicAlreadyExists(f"topic {topic!r} exists")
        self._connected_registry()  # fail at once while ZooKeeper is away
        me, rack = self.me, self.config.broker_rack or None

        def record(registry: Registry) -> TopicConfig:
            live = registry.brokers()  # now, not as last watched
            racks = {broker_id: info.rack for broker_id, info in live.items()}
            racks[me] = rack
            config = TopicConfig.spread(
                request.partitions,
                racks,
                settings,
                replication_factor=replication_factor,
                racks=racks,
            )
            registry.create_topic_config(topic, config)
            return config

        def refused(error: PylogError) -> None:
            self._creating.discard(topic)
            self.answers.append((tagged, protocol.encode_error(correlation_id, error)))

        self._creating.add(topic)
        self.calls.call(
            record, lambda config: self._created(topic, config, tagged, correlation_id), refused
        )

    def _created(self, topic: str, config: TopicConfig, tagged: bytes, correlation_id: int) -> None:
        """A new topic is recorded in ZooKeeper: open its partitions here and answer once every
        holder serves its own (see _answer_creates)."""
        self._creating.discard(topic)
        self.configs[topic] = config
        self._hold_topic(topic, config)
        here = set(config.partitions_of(self.me))
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

    def tick(self) -> None:
        """On every turn of the loop: apply the registry's events, renew the leaders' lease
        when due, then answer creates."""
        self.calls.apply()
        if self.calls.registry is not None:
            self.leases.tick()
        self._answer_creates()

    def _send_lease(self, lease: Lease) -> None:
        """Give every worker the lease just renewed (broker.replication.lease)."""
        command = _lease_command(lease)
        for worker in self.pool.workers:
            if worker.connected:
                self.pool.send(worker, command)

    def _answer_creates(self) -> None:
        """Answer CREATE_TOPIC requests whose partitions every holder now serves (asked of
        ZooKeeper on the registry thread, every CREATE_CHECK_S at most), and those that failed
        here."""
        for pending in [p for p in self._pending_creates if p.failure is not None]:
            self._pending_creates.remove(pending)
            self._undo_create(pending)
        now = time.monotonic()
        if (
            not self._pending_creates
            or self._creates_checking
            or now < self._creates_checked_at + CREATE_CHECK_S
        ):
            return
        self._creates_checked_at = now
        self._creates_checking = True
        topics = [pending.topic for pending in self._pending_creates]
        self.calls.call(
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
            self.answers.append((pending.tagged, reply))
        self._pending_creates = waiting

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
            self.answers.append((pending.tagged, error))

        def not_undone(failure: PylogError) -> None:
            log.error("topic %r: cannot undo its creation: %s", topic, failure)
            self.answers.append((pending.tagged, error))

        self.calls.call(lambda registry: registry.delete_topic_config(topic), undone, not_undone)

    def delete(self, topic: str, tagged: bytes, correlation_id: int) -> None:
        """Delete the topic's config in ZooKeeper, then its partitions here (every holder
        deletes its own when its watch sees the config gone), then answer. A request refused
        at once raises its error."""
        if topic not in self.configs:
            raise UnknownTopicOrPartition(f"unknown topic {topic!r}")
        self._connected_registry()  # fail at once while ZooKeeper is away

        def deleted(_: None) -> None:
            if self.configs.pop(topic, None) is not None:
                self._drop_topic(topic)
                log.info("deleted topic %r", topic)
            reply = protocol.encode_reply(correlation_id, protocol.EmptyReply())
            self.answers.append((tagged, reply))

        refused = self._refuse(tagged, correlation_id)
        self.calls.call(lambda registry: registry.delete_topic_config(topic), deleted, refused)

    # -- describe and alter ----------------------------------------------------------------

    def describe_cluster(self, port: int) -> protocol.DescribeClusterReply:
        """Every broker registered or holding partitions, from what the watches last said, and
        the ZooKeeper this broker uses. `port`: the front's."""
        registry = self.calls.registry
        assert registry is not None
        live = {**self.live_brokers, self.me: self.registration(port)}
        held = Counter(holder for config in self.configs.values() for holder in config.brokers)
        brokers = []
        for broker_id in sorted(live.keys() | held.keys()):
            info = live.get(broker_id)
            if info is None:
                brokers.append(
                    protocol.ClusterBroker(broker_id, False, "", 0, "", (), held[broker_id])
                )
                continue
            brokers.append(
                protocol.ClusterBroker(
                    broker_id,
                    True,
                    info.host,
                    info.port,
                    info.software_version,
                    info.log_dirs,
                    held[broker_id],
                )
            )
        chroot = registry.chroot or "/"
        return protocol.DescribeClusterReply(registry.connect_string, chroot, tuple(brokers))

    def describe_config(self, topic: str, tagged: bytes, correlation_id: int) -> None:
        """Answer with every setting of `topic`: its own, read from ZooKeeper now (off the
        loop), or this broker's default."""
        self._connected_registry()  # fail at once while ZooKeeper is away

        def read(config: TopicConfig) -> None:
            effective = self.config.log_config(config.settings)
            settings: dict[str, int | None] = {k: getattr(effective, k) for k in TOPIC_SETTINGS}
            settings.update((k, replica_setting(config.settings, k)) for k in REPLICA_SETTINGS)
            values = protocol.settings_text(settings)
            entries = tuple(
                protocol.ConfigEntry(key, value, key in config.settings)
                for key, value in values.items()
            )
            reply = protocol.DescribeConfigReply(entries)
            self.answers.append((tagged, protocol.encode_reply(correlation_id, reply)))

        refused = self._refuse(tagged, correlation_id)
        self.calls.call(lambda registry: registry.topic_config(topic), read, refused)

    def alter_config(
        self, request: protocol.AlterConfigRequest, tagged: bytes, correlation_id: int
    ) -> None:
        """Change the settings of a topic in ZooKeeper, then answer; the brokers holding its
        partitions apply them when their watch sees the change (this one too). A request
        refused at once raises its error."""
        topic = request.topic
        changes = topic_settings(request.set)  # InvalidTopic for unknown keys and bad values
        if "replication_factor" in changes or "replication_factor" in request.delete:
            raise InvalidTopic(
                f"topic {topic!r}: replication_factor is fixed at creation (reassign the "
                "partitions' replicas to change it)"
            )
        for key in request.delete:
            if key not in TOPIC_SETTINGS and key not in REPLICA_SETTINGS:
                raise InvalidTopic(
                    f"unknown topic setting {key!r}: one of {', '.join(TOPIC_SETTINGS)}"
                )
        self._connected_registry()  # fail at once while ZooKeeper is away
        broker_config = self.config

        def change(settings: Mapping[str, int | None]) -> dict[str, int | None]:
            altered = {k: v for k, v in settings.items() if k not in request.delete}
            altered.update(changes)
            _checked(broker_config, topic, altered)
            return altered

        def altered(config: TopicConfig) -> None:
            log.info("topic %r: settings changed to %s", topic, dict(config.settings))
            self.answers.append(
                (tagged, protocol.encode_reply(correlation_id, protocol.EmptyReply()))
            )

        self.calls.call(
            lambda registry: registry.alter_topic_settings(topic, change),
            altered,
            self._refuse(tagged, correlation_id),
        )

    def _refuse(self, tagged: bytes, correlation_id: int) -> Callable[[PylogError], None]:
        """Answer a request with the error a registry call failed with."""
        return lambda error: self.answers.append(
            (tagged, protocol.encode_error(correlation_id, error))
        )

    # -- what the watches saw --------------------------------------------------------------

    def _on_config(self, topic: str, token: object, config: TopicConfig | None) -> None:
        """What the watch on the node of `topic` saw: changed replicas open or delete
        partitions here (_on_replicas); new settings go to the workers holding its partitions
        here; a deleted node ends the watch (the topic is dropped through
        `_on_topic_configs`)."""
        if self._config_watches.get(topic) is not token:
            return  # a watch of a topic dropped since
        if config is None:
            del self._config_watches[topic]
            return
        old = self.configs.get(topic)
        if old is None:
            return  # dropped meanwhile
        self.configs[topic] = config
        if old.replicas != config.replicas:
            self._on_replicas(topic, old, config)
        state = self.held.get(topic)
        if state is None or state.settings == dict(config.settings):
            return
        state.settings = dict(config.settings)
        log.info("topic %r: applying settings %s", topic, state.settings)
        command = control.encode(control.ConfigureTopic(topic, state.settings))
        for worker in set(state.workers.values()):
            handle = self.pool.workers[worker]
            if handle.connected:  # one restarting gets them when it opens its partitions
                self.pool.send(handle, command)
        for number in state.workers:  # min_insync_replicas may have changed
            self._send_role(topic, number)

    def _on_replicas(self, topic: str, old: TopicConfig, new: TopicConfig) -> None:
        """A reassignment changed the replicas of partitions of `topic`
        (docs/replication.md, "Reassignment"): those this broker became a replica of open here
        and follow their leader; those it no longer is are deleted here, with their data; the
        leaders here learn their partitions' new replicas."""
        self._watch_states(topic)
        me = self.me
        before, now = set(old.partitions_of(me)), set(new.partitions_of(me))
        if added := sorted(now - before):
            log.info("topic %r: partitions %s reassigned here: copying them", topic, added)
            self._hold_partitions(topic, new, added)
        held = self.held.get(topic)
        if held is not None and (removed := sorted(p for p in before - now if p in held.workers)):
            log.info("topic %r: partitions %s reassigned away: deleting them here", topic, removed)
            self._drop_partitions(topic, removed)
        for number in sorted(before & now):
            if old.replicas[number] != new.replicas[number]:
                self._send_role(topic, number)

    def _on_brokers(self, brokers: dict[int, BrokerInfo]) -> None:
        before, self.live_brokers = self.live_brokers, brokers
        for (topic, number), (state, _) in list(self.states.items()):
            if state.leader != self.me and before.get(state.leader) != brokers.get(state.leader):
                self._send_role(topic, number)  # its leader's endpoint came, went or moved

    def _on_topic_configs(self, configs: dict[str, TopicConfig]) -> None:
        """Topics created or deleted. A topic known already keeps the configuration its own
        watch last gave (_on_config): this one may be older."""
        for topic, config in configs.items():
            if topic not in self.configs:
                self.configs[topic] = config
            self._watch_config(topic)
            self._watch_states(topic)
            self._hold_topic(topic, self.configs[topic])
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

        self.calls.call(lambda registry: registry.topic_config(topic), lambda _: None, gone)


def _lease_command(lease: Lease) -> list[bytes]:
    return control.encode(control.RenewLease(lease.until, lease.broker_epoch))


def _replicated(config: TopicConfig) -> bool:
    """Whether a partition of the topic has, or had when created, more than one replica: its
    brokers then follow its partitions' state nodes."""
    return replica_setting(config.settings, "replication_factor") > 1 or any(
        len(replicas) > 1 for replicas in config.replicas
    )


def _checked(config: BrokerConfig, topic: str, settings: Mapping[str, int | None]) -> int:
    """The replication factor of `topic`, whose own `settings` must fit together with this
    broker's defaults for the rest (LogConfig.check_relations) and min_insync_replicas be at
    most replication_factor; InvalidTopic else."""
    try:
        config.checked_log_config(settings)
    except ValueError as error:
        raise InvalidTopic(f"topic {topic!r}: {error}") from None
    replication_factor = replica_setting(settings, "replication_factor")
    min_insync = replica_setting(settings, "min_insync_replicas")
    if min_insync > replication_factor:
        raise InvalidTopic(
            f"topic {topic!r}: min_insync_replicas {min_insync} is more than its "
            f"replication_factor {replication_factor}: ack=all could never be answered"
        )
    return replication_factor


def _log_registry_failure(what: str) -> Callable[[PylogError], None]:
    return lambda error: log.warning("%s: %s", what, error)
