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

It answers METADATA and DESCRIBE_CLUSTER from what the watches said. Its parts: `admin`
(broker.topics.admin: CREATE_TOPIC, DELETE_TOPIC, DESCRIBE_CONFIG, ALTER_CONFIG) and `roles`
(broker.topics.roles: the replicated partitions' state nodes, their roles, ISR changes, the
leaders' lease). Topic management never calls into the front: replies it owes go to
`answers`, the queue the front sends from on its loop; workers get their commands
(broker.control) through the pool.
"""

from __future__ import annotations

import importlib.metadata
import logging
import os
import shutil
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from broker import control, protocol
from broker.clock import SYSTEM_CLOCK, Clock
from broker.config import BrokerConfig
from broker.errors import PylogError, UnknownTopicOrPartition
from broker.log.config import SettingValue
from broker.placement import partition_folder, place_partitions
from broker.pool import Answers, WorkerHandle, WorkerPool
from broker.protocol import ErrorCode
from broker.registry import BrokerRegistration, TopicConfig
from broker.registry_calls import RegistryCalls
from broker.topics.admin import TopicAdmin
from broker.topics.roles import Roles, replicated

log = logging.getLogger("pylog.supervisor")

VERSION = importlib.metadata.version("pylog")
"""The pylog version this broker runs, registered for DESCRIBE_CLUSTER."""


@dataclass
class TopicState:
    """A topic with partitions here: its settings, and the worker of each partition held here."""

    settings: dict[str, SettingValue]
    workers: dict[int, int]
    served: set[int] = field(default_factory=set)
    """The partitions here that their worker has opened: those registered as served."""


@dataclass(frozen=True, slots=True)
class TopicsStatistics:
    """The partitions' figures (broker.metrics): those this broker holds, the in-sync set
    changes it made as a leader, and the replicated partitions it leads whose in-sync set is
    smaller than their replicas."""

    partitions: int
    isr_shrinks: int
    isr_expands: int
    under_replicated: int


class Topics:
    """The topics of the cluster as this broker sees them, and those it holds."""

    def __init__(
        self,
        config: BrokerConfig,
        pool: WorkerPool,
        calls: RegistryCalls,
        answers: Answers,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.config = config
        self.clock = clock
        """The timers' clock (how long a CREATE_TOPIC waits for its partitions' holders)."""
        self.me = config.broker_id
        self.log_dirs = config.log_dir_paths
        self.pool = pool
        self.calls = calls
        self.answers = answers
        self.held: dict[str, TopicState] = {}
        """The topics with partitions on this broker."""
        self.configs: dict[str, TopicConfig] = {}
        """Every topic of the cluster, as ZooKeeper last said (kept by a watch)."""
        self.live_brokers: dict[int, BrokerRegistration] = {}
        """The registered brokers, as ZooKeeper last said (kept by a watch)."""
        self.partition_errors: dict[tuple[str, int], tuple[int, str]] = {}
        """Partitions held here that their worker could not open: error code and message."""
        self.admin = TopicAdmin(self, config, calls, answers)
        self.roles = Roles(self, config, calls)
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
        configs = registry.topics.topic_configs()
        on_disk: dict[str, dict[int, int]] = {}
        """Topic -> partition -> the log dir its folder is in (one listing of each log dir,
        which _place is given: no look for each of 20,000 folders again)."""
        for d, log_dir in enumerate(self.log_dirs):
            with os.scandir(log_dir) as entries:
                for entry in entries:
                    topic, _, number = entry.name.rpartition("-")
                    if topic and number.isdigit() and entry.is_dir():
                        on_disk.setdefault(topic, {}).setdefault(int(number), d)
        for topic, numbers in sorted(on_disk.items()):
            config = configs.get(topic)
            if config is None:
                partitions = max(numbers) + 1
                log.warning("adopting topic %r found on disk with %d partitions", topic, partitions)
                config = TopicConfig(partitions, (me,) * partitions)
                try:
                    registry.topics.create_topic_config(topic, config)
                except PylogError as error:
                    log.error("cannot record adopted topic %r in ZooKeeper: %s", topic, error)
                configs[topic] = config
            elif strays := sorted(set(numbers) - set(config.partitions_of(me))):
                log.warning(
                    "topic %r: partition folders %s on disk are placed elsewhere by ZooKeeper "
                    "(or do not exist there): left alone, not served",
                    topic,
                    strays,
                )
        self.configs = configs
        for topic, config in configs.items():
            if mine := config.partitions_of(me):
                self._place(topic, config, mine, on_disk.get(topic, {}))

    def watch(self) -> None:
        """Keep the view of brokers and topics current from ZooKeeper's watches."""
        registry = self.calls.registry
        assert registry is not None
        calls = self.calls
        registry.brokers.watch(lambda brokers: calls.report(lambda: self._on_brokers(brokers)))
        registry.topics.watch_topic_configs(
            lambda configs: calls.report(lambda: self._on_topic_configs(configs))
        )
        for topic in self.configs:
            self._watch_config(topic)
            self.roles.watch_states(topic)

    def statistics(self) -> TopicsStatistics:
        """The figures now (read by the metrics thread: the states are copied first)."""
        held = sum(len(state.workers) for state in list(self.held.values()))
        changes = self.roles.isr_changes
        return TopicsStatistics(
            held, changes["shrink"], changes["expand"], self.roles.under_replicated()
        )

    def registration(self, port: int) -> BrokerRegistration:
        """What this broker registers in ZooKeeper: its front's address (`port` as bound, or
        broker.advertised_port), workers, log dirs and version."""
        return BrokerRegistration(
            self.config.endpoint_host,
            self.config.endpoint_port(port),
            len(self.pool.workers),
            tuple(str(d.absolute()) for d in self.log_dirs),  # not relative to where it started
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

        registry.topics.watch_topic_config(topic, changed)

    def _place(
        self,
        topic: str,
        config: TopicConfig,
        numbers: list[int],
        found: Mapping[int, int] | None = None,
    ) -> None:
        """Choose a worker for each of `numbers`, partitions of `topic` that this broker
        holds (added to those it holds already), in the log dir where its folder is (`found`:
        partition -> log dir, when the caller listed them; None: looked for here)."""
        per_dir = self.config.broker_workers_per_dir
        held = [0] * len(self.log_dirs)
        for state in self.held.values():
            for w in state.workers.values():
                held[w // per_dir] += 1
        if found is None:
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
            protocol.MetadataBroker(broker_id, info.host, info.port, info.rack or "")
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
            led_by_state = replicated(config)
            partitions = []
            for number, replicas in enumerate(config.replicas):
                # A replicated partition's leader is its state node's (none while the node is
                # not read yet); a partition of one replica is led by it.
                known = self.roles.states.get((topic, number))
                leader, epoch, isr = replicas[0], -1, replicas
                if known is not None:
                    leader, epoch, isr = known[0].leader, known[0].leader_epoch, known[0].isr
                elif led_by_state:
                    leader, isr = -1, ()
                failure = self.partition_errors.get((topic, number))
                if leader == me:  # served once its worker opened it (not while opening)
                    w = None if state is None else state.workers.get(number)
                    serving = (
                        w is not None
                        and self.pool.workers[w].connected
                        and state is not None
                        and number in state.served
                    )
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
                self.pool.send(worker, self.roles.lease_command())
                self._open_partitions(worker)
            case control.AskIsr(topic, number, leader_epoch, isr):
                self.roles.change_isr(topic, number, leader_epoch, list(isr))
            case control.PartitionsOpened(opened, failed):
                self._opened(worker, opened, failed)
            case control.PartitionsDeleted():
                pass  # its folders are gone: nothing waits for it
            case control.StatsReport():
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
            self.admin.note_opened(topic, number, None)
            held = self.held.get(topic)
            if held is not None and number not in held.served:
                held.served.add(number)
                registered.add(topic)
        for topic in sorted(registered):
            self._register_served(topic)
        for topic, number in opened:
            self.roles.send_role(topic, number)
        for topic, number, code, message in failed:
            log.error("worker %d cannot open %s-%d: %s", worker.index, topic, number, message)
            self.partition_errors[(topic, number)] = (code, message)
            self.admin.note_opened(topic, number, (code, message))

    def _open_partitions(self, worker: WorkerHandle, topics: list[str] | None = None) -> None:
        """Tell a connected worker to open its partitions (of `topics`, default all; those
        open already stay as they are). A partition of a topic whose states are watched
        opens replicated: it serves no client until its role says it leads."""
        entries: list[control.PartitionToOpen] = []
        for topic in topics or list(self.held):
            state = self.held[topic]
            config = self.configs.get(topic)
            is_replicated = topic in self.roles.state_watches or (
                config is not None and replicated(config)
            )
            starts = {} if config is None else config.log_starts
            for number, w in state.workers.items():
                if w == worker.index:
                    entries.append(
                        control.PartitionToOpen(
                            topic,
                            number,
                            str(worker.log_dir),
                            state.settings,
                            is_replicated,
                            starts.get(number, 0),
                        )
                    )
        if entries:  # a worker that is gone gets them all when it says hello again
            self.pool.send(worker, control.encode(control.OpenPartitions(tuple(entries))))

    def _register_served(self, topic: str) -> None:
        """Register in ZooKeeper the partitions of `topic` that are open here."""
        partitions = sorted(self.held[topic].served)
        me = self.me
        self.calls.call(  # on RegistryUnavailable the registry registers it once connected
            lambda registry: registry.topics.register_topic_partitions(topic, me, partitions),
            lambda _: None,
            _log_registry_failure(f"topic {topic!r}: registration deferred"),
        )

    def hold_topic(self, topic: str, config: TopicConfig) -> None:
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

    def drop_topic(self, topic: str) -> None:
        """Delete this broker's partitions of `topic`, with their data, and their registration."""
        self.roles.forget(topic)
        self._config_watches.pop(topic, None)
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
                lambda registry: registry.topics.unregister_topic(topic, me),
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

    def tick(self) -> None:
        """On every turn of the loop: apply the registry's events, renew the leaders' lease
        when due, send (or refuse) the topic requests waiting for ZooKeeper, then answer
        creates."""
        self.calls.apply()
        if self.calls.registry is not None:
            self.roles.leases.tick()
            self.admin.resume_awaiting()
        self.admin.answer_creates()

    # -- describe and alter ----------------------------------------------------------------

    def describe_cluster(self, port: int) -> protocol.DescribeClusterReply:
        """Every broker registered or holding partitions, from what the watches last said, and
        the ZooKeeper this broker uses. `port`: the front's."""
        registry = self.calls.registry
        assert registry is not None
        live = {**self.live_brokers, self.me: self.registration(port)}
        held = Counter(  # every replica, as a follower holds its partition too
            holder
            for config in self.configs.values()
            for replicas in config.replicas
            for holder in replicas
        )
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
        chroot = registry.session.chroot or "/"
        return protocol.DescribeClusterReply(
            registry.session.connect_string, chroot, tuple(brokers)
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
        if state is not None and old.log_starts != config.log_starts:
            self._move_starts(topic, state, config)
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
            self.roles.send_role(topic, number)

    def _move_starts(self, topic: str, state: TopicState, config: TopicConfig) -> None:
        """Records of `topic` deleted: the workers holding its partitions here move their log
        starts (a worker restarting gets them when it opens its partitions)."""
        log.info("topic %r: log starts asked %s", topic, dict(config.log_starts))
        for worker in set(state.workers.values()):
            starts = tuple(
                (number, config.log_starts[number])
                for number, holder in sorted(state.workers.items())
                if holder == worker and number in config.log_starts
            )
            handle = self.pool.workers[worker]
            if starts and handle.connected:
                self.pool.send(handle, control.encode(control.MoveLogStarts(topic, starts)))

    def _on_replicas(self, topic: str, old: TopicConfig, new: TopicConfig) -> None:
        """A reassignment changed the replicas of partitions of `topic`
        (docs/replication.md, "Reassignment"): those this broker became a replica of open here
        and follow their leader; those it no longer is are deleted here, with their data; the
        leaders here learn their partitions' new replicas."""
        self.roles.watch_states(topic)
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
                self.roles.send_role(topic, number)

    def _on_brokers(self, brokers: dict[int, BrokerRegistration]) -> None:
        before, self.live_brokers = self.live_brokers, brokers
        for (topic, number), (state, _) in list(self.roles.states.items()):
            if state.leader != self.me and before.get(state.leader) != brokers.get(state.leader):
                self.roles.send_role(topic, number)  # its leader's endpoint came, went or moved

    def _on_topic_configs(self, configs: dict[str, TopicConfig]) -> None:
        """Topics created or deleted. A topic known already keeps the configuration its own
        watch last gave (_on_config): this one may be older."""
        for topic, config in configs.items():
            if topic not in self.configs:
                self.configs[topic] = config
            self._watch_config(topic)
            self.roles.watch_states(topic)
            self.hold_topic(topic, self.configs[topic])
        for topic in [t for t in self.configs if t not in configs and t not in self.admin.creating]:
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
                self.drop_topic(topic)
                log.info("topic %r was deleted through another broker", topic)

        self.calls.call(lambda registry: registry.topics.topic_config(topic), lambda _: None, gone)


def _log_registry_failure(what: str) -> Callable[[PylogError], None]:
    return lambda error: log.warning("%s: %s", what, error)
