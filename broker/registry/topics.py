"""Topics in the registry: each topic's configuration (/config/topics/<topic>, persistent),
the partitions each broker serves (/brokers/topics/<topic>/<broker_id>, ephemeral) and each
partition's state: its leader, leader epoch and in-sync replicas
(/brokers/topics/<topic>/partitions/<p>/state, persistent; docs/replication.md)."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from kazoo.client import TransactionRequest

from broker.errors import (
    InvalidTopic,
    PylogError,
    RegistryUnavailable,
    TopicAlreadyExists,
    UnknownTopicOrPartition,
)
from broker.placement import assign_replicas
from broker.protocol import check_topic_name
from broker.registry.brokers import Brokers
from broker.registry.controller import CONTROLLER_EPOCH, ControllerMoved
from broker.registry.nodes import (
    decode,
    encode,
    int_field,
    int_list,
    is_int,
    validate_broker_id,
)
from broker.registry.session import BadVersion, NodeExists, NoNode, NotEmpty

log = logging.getLogger(__name__)

ALTER_ATTEMPTS = 10
"""How many times alter_topic_settings reads and writes a configuration that others keep
changing between its read and its write, before it gives up."""

TRANSACTION_ATTEMPTS = 10
"""How many times creating or deleting a topic's nodes (one ZooKeeper transaction) is tried
again when the nodes it was built from changed before it was applied."""

NO_LEADER = -1
"""PartitionState.leader of a partition without a leader."""

Settings = Mapping[str, int | None]
Replicas = tuple[tuple[int, ...], ...]


class PartitionStateChanged(PylogError):
    """A conditional write of a partition's state node found another version of the node than
    the one it was given: someone wrote the node since it was read (the controller choosing a
    leader, or a leader changing the ISR). Nothing was written. The caller reads the node again
    (Topics.partition_state) and decides anew on what it finds (a leader that finds another
    leader or a higher leader epoch stops leading); it never repeats the same write."""

    def __init__(self, topic: str, partition: int, version: int) -> None:
        super().__init__(
            f"the state of partition {partition} of topic {topic!r} is no longer at version "
            f"{version}: it was written since it was read; read it again"
        )
        self.topic = topic
        self.partition = partition
        self.version = version


def _check_partition(partitions: int, partition: int) -> None:
    if not is_int(partition) or not 0 <= partition < partitions:
        raise UnknownTopicOrPartition(
            f"partition {partition!r} does not exist: the topic has partitions 0 to "
            f"{partitions - 1}"
        )


@dataclass(frozen=True)
class TopicConfig:
    """What /config/topics/<topic> holds: the topic's partition count, the replicas of each
    partition (`replicas[p]`: the brokers that hold partition p, in the order fixed by its
    assignment, the first the preferred leader), `brokers[p]` (the partition's name broker:
    its first replica at creation, fixed for ever after, since it names the partition's group
    nodes, `<brokers[p]>-<p>`; a reassignment changes `replicas[p]` only), and the topic's own
    settings
    (setting name -> integer, or None to switch that limit off); a setting left out takes the
    broker's [log] default.

    `replicas` left out (or empty) is read as one replica per partition, `brokers[p]` alone:
    a topic of a single copy, and every node written before replication had.
    """

    partitions: int
    brokers: tuple[int, ...]
    settings: Mapping[str, int | None] = field(default_factory=dict)
    replicas: Replicas = ()

    def __post_init__(self) -> None:
        if not self.replicas:
            object.__setattr__(self, "replicas", tuple((b,) for b in self.brokers))

    @classmethod
    def spread(
        cls,
        partitions: int,
        brokers: Iterable[int],
        settings: Mapping[str, int | None] | None = None,
        *,
        replication_factor: int = 1,
        racks: Mapping[int, str | None] | None = None,
    ) -> TopicConfig:
        """`partitions` partitions with `replication_factor` replicas each over `brokers`,
        placed by broker.placement.assign_replicas with each broker's rack from `racks`
        (broker id -> rack; a broker left out, or None, has no rack). With replication factor
        1 and no racks, partition p goes to the (p mod n)-th broker by id, as before
        replication. InvalidTopic when there is no broker, or the replication factor is not
        between 1 and the number of brokers."""
        ids = set(brokers)
        if not ids:
            raise InvalidTopic("no live broker to hold the topic's partitions")
        rack_of = {b: (racks or {}).get(b) for b in ids}
        try:
            replicas = assign_replicas(max(partitions, 0), rack_of, replication_factor)
        except ValueError as error:
            raise InvalidTopic(f"cannot place the topic's replicas: {error}") from None
        return cls(partitions, tuple(r[0] for r in replicas), dict(settings or {}), replicas)

    def partitions_of(self, broker_id: int) -> list[int]:
        """The partitions that `broker_id` holds, in order: every partition it is a replica of,
        whether it leads it or follows."""
        return [p for p, replicas in enumerate(self.replicas) if broker_id in replicas]

    def replicas_of(self, partition: int) -> tuple[int, ...]:
        """The replicas of `partition`, preferred leader first; UnknownTopicOrPartition when
        the topic has no such partition."""
        _check_partition(self.partitions, partition)
        return self.replicas[partition]

    def preferred_leader(self, partition: int) -> int:
        """The preferred leader of `partition`: its first replica (`brokers[partition]` until
        a reassignment changes it); UnknownTopicOrPartition when the topic has no such partition."""
        return self.replicas_of(partition)[0]

    def validate(self, topic: str) -> None:
        """Raise InvalidTopic when partitions is not >= 1, brokers does not name one broker
        per partition, replicas does not name distinct brokers for each partition, or a
        setting is not int | None."""
        if not is_int(self.partitions) or self.partitions < 1:
            raise InvalidTopic(f"topic {topic!r}: partitions must be >= 1, not {self.partitions!r}")
        if len(self.brokers) != self.partitions or not all(
            is_int(b) and b >= 0 for b in self.brokers
        ):
            raise InvalidTopic(
                f"topic {topic!r}: brokers must name one broker id per partition, "
                f"not {self.brokers!r}"
            )
        try:
            _check_replicas(self.brokers, self.replicas)
        except ValueError as error:
            raise InvalidTopic(f"topic {topic!r}: {error}") from None
        for name, value in self.settings.items():
            if not isinstance(name, str) or not (value is None or is_int(value)):
                raise InvalidTopic(
                    f"topic {topic!r}: setting {name!r} must be an integer or None, not {value!r}"
                )

    def to_json(self) -> bytes:
        return encode(
            {
                "partitions": self.partitions,
                "brokers": list(self.brokers),
                "replicas": [list(r) for r in self.replicas],
                "settings": dict(self.settings),
            }
        )

    @classmethod
    def from_json(cls, data: bytes) -> TopicConfig:
        """Parse node data; ValueError when it is not a topic configuration. A node without
        `replicas` (written before replication) reads as one replica per partition,
        `brokers[p]`."""
        obj = decode(data)
        settings = obj.get("settings", {})
        if not isinstance(settings, dict):
            raise ValueError("'settings' is not an object")
        if not all(v is None or is_int(v) for v in settings.values()):
            raise ValueError("a setting is not an integer or null")
        partitions = int_field(obj, "partitions")
        brokers = int_list(obj, "brokers")
        if len(brokers) != partitions:
            raise ValueError(f"'brokers' names {len(brokers)} brokers for {partitions} partitions")
        replicas: Replicas = tuple((b,) for b in brokers)
        if "replicas" in obj:
            value = obj["replicas"]
            if not isinstance(value, list) or not all(
                isinstance(r, list) and all(is_int(b) and b >= 0 for b in r) for r in value
            ):
                raise ValueError("'replicas' is not a list of lists of integers >= 0")
            replicas = tuple(tuple(r) for r in value)
            _check_replicas(brokers, replicas)
        return cls(partitions, brokers, settings, replicas)


def _check_replicas(brokers: Sequence[int], replicas: Replicas) -> None:
    """ValueError unless `replicas` names, for each partition of `brokers`, distinct broker
    ids >= 0. (The first is brokers[p] at creation; a reassignment changes replicas only.)"""
    if len(replicas) != len(brokers):
        raise ValueError(
            f"replicas must name the replicas of each of the {len(brokers)} partitions, "
            f"not {len(replicas)}"
        )
    for p, replica in enumerate(replicas):
        if (
            not isinstance(replica, tuple)
            or not replica
            or not all(is_int(b) and b >= 0 for b in replica)
            or len(set(replica)) != len(replica)
        ):
            raise ValueError(
                f"the replicas of partition {p} must be distinct broker ids, not {replica!r}"
            )


@dataclass(frozen=True)
class PartitionState:
    """What /brokers/topics/<topic>/partitions/<p>/state holds: the partition's `leader`
    (a broker id, or NO_LEADER, -1), the `leader_epoch` the controller gave it (raised at each
    choice of a leader), the in-sync replicas `isr` (the leader among them, when there is one)
    and the `controller_epoch` of the controller that last wrote the node (0: written when the
    topic was created, by no controller); `leader_broker_epoch`, the broker epoch of the
    leader's incarnation that was chosen (Brokers.broker_epochs; -1: not known, a node written
    before broker epochs): a leader whose broker registered again since (a restart) is not
    this one, and the controller chooses anew. ValueError when a field is out of its range."""

    leader: int
    leader_epoch: int
    isr: tuple[int, ...]
    controller_epoch: int
    leader_broker_epoch: int = -1

    def __post_init__(self) -> None:
        if not is_int(self.leader) or self.leader < NO_LEADER:
            raise ValueError(f"leader must be a broker id or {NO_LEADER}, not {self.leader!r}")
        for name in ("leader_epoch", "controller_epoch"):
            value = getattr(self, name)
            if not is_int(value) or value < 0:
                raise ValueError(f"{name} must be an integer >= 0, not {value!r}")
        isr = tuple(self.isr)
        if not all(is_int(b) and b >= 0 for b in isr) or len(set(isr)) != len(isr):
            raise ValueError(f"isr must be distinct broker ids, not {self.isr!r}")
        if not is_int(self.leader_broker_epoch) or self.leader_broker_epoch < -1:
            raise ValueError(
                f"leader_broker_epoch must be an integer >= -1, not {self.leader_broker_epoch!r}"
            )
        if self.leader != NO_LEADER and self.leader not in isr:
            raise ValueError(f"the leader {self.leader} is not in the ISR {list(isr)}")
        object.__setattr__(self, "isr", isr)

    @classmethod
    def initial(cls, replicas: Sequence[int], broker_epochs: Mapping[int, int]) -> PartitionState:
        """A new partition's state: led by its first replica (in its incarnation of
        `broker_epochs`, -1 when it is not registered) at leader epoch 0, every replica in
        sync, controller epoch 0."""
        return cls(replicas[0], 0, tuple(replicas), 0, broker_epochs.get(replicas[0], -1))

    def to_json(self) -> bytes:
        return encode(
            {
                "leader": self.leader,
                "leader_epoch": self.leader_epoch,
                "isr": list(self.isr),
                "controller_epoch": self.controller_epoch,
                "leader_broker_epoch": self.leader_broker_epoch,
            }
        )

    @classmethod
    def from_json(cls, data: bytes) -> PartitionState:
        """Parse node data; ValueError when it is not a partition state."""
        obj = decode(data)
        return cls(
            int_field(obj, "leader"),
            int_field(obj, "leader_epoch"),
            int_list(obj, "isr"),
            int_field(obj, "controller_epoch"),
            int_field(obj, "leader_broker_epoch") if "leader_broker_epoch" in obj else -1,
        )


def _partitions(data: bytes) -> tuple[int, ...]:
    return int_list(decode(data), "partitions")


class Topics(Brokers):
    """The registry's calls on topics: their configurations, who serves their partitions, and
    each partition's state (leader, leader epoch, ISR).

    A request that timed out may still be applied by the server later: the registrations are
    idempotent, and a create_topic_config retried after a timeout may answer
    TopicAlreadyExists for its own first attempt."""

    def topic_broker_path(self, topic: str, broker_id: int) -> str:
        return f"{self.chroot}/brokers/topics/{topic}/{broker_id}"

    def topic_config_path(self, topic: str) -> str:
        return f"{self.chroot}/config/topics/{topic}"

    def topic_node_path(self, topic: str) -> str:
        return f"{self.chroot}/brokers/topics/{topic}"

    def partition_states_path(self, topic: str) -> str:
        return f"{self.topic_node_path(topic)}/partitions"

    def partition_state_path(self, topic: str, partition: int) -> str:
        return f"{self.partition_states_path(topic)}/{partition}/state"

    # -- topic partitions on brokers ---------------------------------------------------------

    def register_topic_partitions(
        self, topic: str, broker_id: int, partitions: Iterable[int]
    ) -> None:
        """Create (or update) the ephemeral /brokers/topics/<topic>/<broker_id> saying that the
        broker holds (and serves) `partitions` of the topic, kept until stop() or unregister.

        On RegistryUnavailable the registration is remembered and made once connected."""
        check_topic_name(topic)
        validate_broker_id(broker_id)
        numbers = sorted(partitions)
        if not numbers or not all(is_int(p) and p >= 0 for p in numbers):
            raise InvalidTopic(f"topic {topic!r}: partitions must be numbers >= 0, not {numbers}")
        self._register(self.topic_broker_path(topic, broker_id), encode({"partitions": numbers}))

    def unregister_topic(self, topic: str, broker_id: int) -> None:
        """Delete /brokers/topics/<topic>/<broker_id> (and the topic's node once empty)."""
        check_topic_name(topic)
        validate_broker_id(broker_id)
        self._unregister(self.topic_broker_path(topic, broker_id))
        with contextlib.suppress(NoNode, NotEmpty):
            self._delete(self.topic_node_path(topic))

    def topic_brokers(self, topic: str) -> dict[int, tuple[int, ...]]:
        """Broker id -> the partitions of `topic` it serves, for the live brokers holding it.
        (Children of /brokers/topics/<topic> whose names are not numbers are not brokers'
        registrations: `partitions`, the partition states, is passed over.)"""
        check_topic_name(topic)
        path = self.topic_node_path(topic)
        try:
            children = self._children(path)
        except NoNode:
            return {}
        ids = [child for child in children if child.isascii() and child.isdecimal()]
        return self._read_each(path, ids, _partitions, int)

    # -- topic configurations ----------------------------------------------------------------

    def create_topic_config(self, topic: str, config: TopicConfig) -> None:
        """Create the persistent /config/topics/<topic> and, in the same ZooKeeper transaction
        (both or neither), the state node of each partition with its initial state
        (PartitionState.initial: led by replicas[p][0] at leader epoch 0, every replica in
        sync). TopicAlreadyExists if the configuration exists. State nodes left by a topic of
        the same name whose deletion was cut short are overwritten (their versions go on
        rising, so a write of the old topic's made on a version read before fails)."""
        check_topic_name(topic)
        config.validate(topic)
        epochs = self.broker_epochs()
        states = [PartitionState.initial(replicas, epochs) for replicas in config.replicas]
        folder = self.partition_states_path(topic)
        for _ in range(TRANSACTION_ATTEMPTS):
            listed = self._partition_nodes(topic)
            parents = [] if listed is not None else [folder]
            if listed is None and not self._exists(self.topic_node_path(topic)):
                parents.insert(0, self.topic_node_path(topic))
            found = listed or {}

            def build(
                transaction: TransactionRequest,
                found: dict[int, bool] = found,
                parents: list[str] = parents,
            ) -> None:
                transaction.create(self.topic_config_path(topic), config.to_json())
                for parent in parents:
                    transaction.create(parent)
                for p, state in enumerate(states):
                    path = self.partition_state_path(topic, p)
                    if p not in found:
                        transaction.create(f"{folder}/{p}")
                        transaction.create(path, state.to_json())
                    elif found[p]:
                        transaction.set_data(path, state.to_json())
                    else:
                        transaction.create(path, state.to_json())
                for p, has_state in found.items():
                    if p >= len(states):
                        if has_state:
                            transaction.delete(self.partition_state_path(topic, p))
                        transaction.delete(f"{folder}/{p}")

            try:
                self._commit(f"create topic {topic!r}", build)
                return
            except (NodeExists, NoNode, NotEmpty):
                if self._exists(self.topic_config_path(topic)):
                    raise TopicAlreadyExists(f"topic {topic!r} exists already") from None
                continue  # partition nodes changed since listed: list them again
        raise RegistryUnavailable(
            f"the nodes of topic {topic!r} changed under each of {TRANSACTION_ATTEMPTS} attempts "
            f"to create it: try again"
        )

    def delete_topic_config(self, topic: str) -> None:
        """Delete /config/topics/<topic> and, in the same ZooKeeper transaction, its partitions'
        state nodes (then /brokers/topics/<topic> too, once no broker's node is left under it);
        UnknownTopicOrPartition if there is no configuration."""
        check_topic_name(topic)
        folder = self.partition_states_path(topic)
        for _ in range(TRANSACTION_ATTEMPTS):
            found = self._partition_nodes(topic) or {}

            def build(transaction: TransactionRequest, found: dict[int, bool] = found) -> None:
                transaction.delete(self.topic_config_path(topic))
                for p, has_state in found.items():
                    if has_state:
                        transaction.delete(self.partition_state_path(topic, p))
                    transaction.delete(f"{folder}/{p}")

            try:
                self._commit(f"delete topic {topic!r}", build)
                break
            except (NoNode, NotEmpty):
                if not self._exists(self.topic_config_path(topic)):
                    raise UnknownTopicOrPartition(f"topic {topic!r} does not exist") from None
                continue  # partition nodes changed since listed: list them again
        else:
            raise RegistryUnavailable(
                f"the nodes of topic {topic!r} changed under each of {TRANSACTION_ATTEMPTS} "
                f"attempts to delete it: try again"
            )
        with contextlib.suppress(NoNode, NotEmpty):
            self._delete(folder)
        with contextlib.suppress(NoNode, NotEmpty):
            self._delete(self.topic_node_path(topic))

    def _exists(self, path: str) -> bool:
        try:
            self._get(path)
        except NoNode:
            return False
        return True

    def _partition_nodes(self, topic: str) -> dict[int, bool] | None:
        """Partition -> whether it has a state node, for each node under
        /brokers/topics/<topic>/partitions (None without that node)."""
        folder = self.partition_states_path(topic)
        try:
            children = self._children(folder)
        except NoNode:
            return None
        found = {}
        for child in children:
            if child.isascii() and child.isdecimal():
                try:
                    found[int(child)] = "state" in self._children(f"{folder}/{child}")
                except NoNode:
                    continue
        return found

    def topic_config(self, topic: str) -> TopicConfig:
        """The configuration of `topic`; UnknownTopicOrPartition if there is none."""
        check_topic_name(topic)
        return self._read_config(topic)[0]

    def _read_config(self, topic: str) -> tuple[TopicConfig, int]:
        """The configuration of `topic` and its node's version."""
        path = self.topic_config_path(topic)
        try:
            data, stat = self._get(path)
        except NoNode:
            raise UnknownTopicOrPartition(f"topic {topic!r} does not exist") from None
        try:
            return TopicConfig.from_json(data), stat.version
        except ValueError as error:
            raise RegistryUnavailable(f"{path} holds unreadable data: {error}") from None

    def alter_topic_settings(
        self, topic: str, change: Callable[[Settings], Settings]
    ) -> TopicConfig:
        """Replace the settings of `topic` with `change(settings)`, a conditional write on the
        version read, so that two changes at once both count (read again and retried, up to
        ALTER_ATTEMPTS times, when another write came between). Returns the new configuration.
        UnknownTopicOrPartition if there is none; what `change` raises, as it is."""
        check_topic_name(topic)
        path = self.topic_config_path(topic)
        for _ in range(ALTER_ATTEMPTS):
            config, version = self._read_config(topic)
            altered = dataclasses.replace(config, settings=dict(change(config.settings)))
            altered.validate(topic)
            try:
                self._set(path, altered.to_json(), version)
            except BadVersion:
                continue
            except NoNode:
                raise UnknownTopicOrPartition(f"topic {topic!r} does not exist") from None
            return altered
        raise RegistryUnavailable(
            f"{path} changed under each of {ALTER_ATTEMPTS} attempts to alter it: try again"
        )

    def watch_topic_config(
        self, topic: str, callback: Callable[[TopicConfig | None], bool]
    ) -> None:
        """Call `callback(config)` with the configuration of `topic` now and whenever its node's
        data changes, and None once the node is deleted, until stop() or the callback returns
        False. kazoo's DataWatch keeps the watch armed, across reconnections and session
        expiries (it reads the node again then, and calls back if it changed meanwhile); it
        is armed on a thread of kazoo's, so this call does not wait on ZooKeeper. The callback
        runs on kazoo's threads: it must only hand the value on. A node whose data cannot be
        read as a configuration is logged and passed over."""
        check_topic_name(topic)
        path = self.topic_config_path(topic)
        self._watch_data(path, TopicConfig.from_json, lambda config, _: callback(config))

    def topic_configs(self) -> dict[str, TopicConfig]:
        """Every topic's configuration: name -> TopicConfig (unreadable nodes are left out)."""
        return self._read_all(f"{self.chroot}/config/topics", TopicConfig.from_json, str)

    def watch_topic_configs(self, callback: Callable[[dict[str, TopicConfig]], None]) -> None:
        """Call `callback(topic_configs())` now and whenever a topic is created or deleted,
        until stop(). (A node's data is not watched here: watch_topic_config does that.)"""
        self._add_watch(f"{self.chroot}/config/topics", TopicConfig.from_json, str, callback)

    # -- partition states --------------------------------------------------------------------

    def create_partition_states(self, topic: str, config: TopicConfig) -> int:
        """Give each partition of `config` that has no state node one with its initial state
        (PartitionState.initial), leaving those that have one as they are: for a topic created
        before replication (create_topic_config makes them for a new topic). Returns how many
        were created."""
        check_topic_name(topic)
        config.validate(topic)
        created, epochs = 0, self.broker_epochs()
        for p, replicas in enumerate(config.replicas):
            path = self.partition_state_path(topic, p)
            initial = PartitionState.initial(replicas, epochs)
            with contextlib.suppress(NodeExists):
                self._create(path, initial.to_json(), makepath=True)
                created += 1
        return created

    def partition_state(self, topic: str, partition: int) -> tuple[PartitionState, int]:
        """The state of `partition` of `topic` and its node's version (for
        write_partition_state). UnknownTopicOrPartition when there is no state node: no such
        topic or partition, or a topic created before replication that nobody gave states
        yet (create_partition_states); RegistryUnavailable when the node holds unreadable
        data."""
        check_topic_name(topic)
        if not is_int(partition) or partition < 0:
            raise UnknownTopicOrPartition(f"partition {partition!r} does not exist")
        path = self.partition_state_path(topic, partition)
        try:
            data, stat = self._get(path)
        except NoNode:
            raise UnknownTopicOrPartition(
                f"partition {partition} of topic {topic!r} has no state node"
            ) from None
        try:
            return PartitionState.from_json(data), stat.version
        except ValueError as error:
            raise RegistryUnavailable(f"{path} holds unreadable data: {error}") from None

    def partition_states(self, topic: str) -> dict[int, tuple[PartitionState, int]]:
        """Partition -> (its state, its node's version) for each partition of `topic` that has
        a state node ({} for none); unreadable nodes are left out, with a warning."""
        check_topic_name(topic)
        states = {}
        for p, has_state in sorted((self._partition_nodes(topic) or {}).items()):
            if not has_state:
                continue
            path = self.partition_state_path(topic, p)
            try:
                data, stat = self._get(path)
                states[p] = PartitionState.from_json(data), stat.version
            except NoNode:
                continue  # deleted since listed
            except ValueError as error:
                log.warning("ignoring unreadable %s: %s", path, error)
        return states

    def write_partition_state(
        self,
        topic: str,
        partition: int,
        state: PartitionState,
        version: int,
        *,
        controller_epoch: int | None = None,
    ) -> int:
        """Replace the state of `partition` of `topic` with `state` if its node is still at
        `version` (as partition_state or watch_partition_state gave it); returns the node's
        new version. PartitionStateChanged when the node was written since (nothing written:
        read it again and decide anew); UnknownTopicOrPartition when it does not exist.

        The controller passes its `controller_epoch`: the write is then made in one
        transaction with a check that /controller_epoch is still at that epoch, and
        ControllerMoved (nothing written) when another controller was elected since.

        A request that timed out (RegistryUnavailable) may still be applied: read the node to
        know (the new version then holds `state`)."""
        check_topic_name(topic)
        if not is_int(partition) or partition < 0:
            raise UnknownTopicOrPartition(f"partition {partition!r} does not exist")
        if not is_int(version) or version < 0:
            raise ValueError(f"a node version is an integer >= 0, not {version!r}")
        if controller_epoch is not None and (not is_int(controller_epoch) or controller_epoch < 1):
            raise ValueError(f"a controller epoch is an integer >= 1, not {controller_epoch!r}")
        path = self.partition_state_path(topic, partition)
        data = state.to_json()
        epoch_path = self.chroot + CONTROLLER_EPOCH
        try:
            if controller_epoch is None:
                stat = self._request(
                    f"write {path}", lambda: self._client.set_async(path, data, version)
                )
            else:

                def build(transaction: TransactionRequest) -> None:
                    # /controller_epoch's version is its epoch - 1 (broker.registry.controller)
                    transaction.check(epoch_path, controller_epoch - 1)
                    transaction.set_data(path, data, version)

                stat = self._commit(f"write {path}", build)[1]
        except (BadVersion, NoNode) as error:
            if controller_epoch is not None and self._epoch_moved(epoch_path, controller_epoch):
                raise ControllerMoved(controller_epoch) from None
            if isinstance(error, BadVersion):
                raise PartitionStateChanged(topic, partition, version) from None
            raise UnknownTopicOrPartition(
                f"partition {partition} of topic {topic!r} has no state node"
            ) from None
        new_version: int = stat.version
        return new_version

    def _epoch_moved(self, epoch_path: str, epoch: int) -> bool:
        """Whether /controller_epoch is no longer at `epoch` (its version epoch - 1)."""
        try:
            return self._get(epoch_path)[1].version != epoch - 1
        except NoNode:
            return True

    def watch_partition_state(
        self,
        topic: str,
        partition: int,
        callback: Callable[[PartitionState | None, int], bool],
    ) -> None:
        """Call `callback(state, version)` with the state of `partition` of `topic` and its
        node's version now and whenever the node is written, and `callback(None, -1)` while
        the node does not exist (now, or once deleted), until stop() or the callback returns
        False. As watch_topic_config: kazoo's DataWatch keeps it armed across reconnections
        and session expiries (reading the node again then), this call does not wait on
        ZooKeeper, and the callback runs on kazoo's threads and must only hand the value on.
        Writes close together may be seen as the last one only. A node whose data cannot be
        read as a state is logged and passed over."""
        check_topic_name(topic)
        if not is_int(partition) or partition < 0:
            raise UnknownTopicOrPartition(f"partition {partition!r} does not exist")
        self._watch_data(
            self.partition_state_path(topic, partition), PartitionState.from_json, callback
        )
