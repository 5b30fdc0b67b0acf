"""Partition states in the registry: each partition's leader, leader epoch, in-sync replicas
and leader incarnation (/brokers/topics/<topic>/partitions/<p>/state, persistent;
docs/registry.md, docs/replication.md), written conditionally on their versions, the
controller's also on its epoch.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from kazoo.client import TransactionRequest

from broker.errors import PylogError, RegistryUnavailable, UnknownTopicOrPartition
from broker.protocol import check_topic_name
from broker.registry.brokers import Brokers
from broker.registry.controller import CONTROLLER_EPOCH, ControllerMoved
from broker.registry.nodes import decode, encode, int_field, int_list, is_int
from broker.registry.session import FAILED, BadVersion, NodeExists, NoNode, Session
from broker.registry.topic_config import TopicConfig

log = logging.getLogger(__name__)

NO_LEADER = -1
"""PartitionState.leader of a partition without a leader."""


class PartitionStateChanged(PylogError):
    """A conditional write of a partition's state node found another version of the node than
    the one it was given: someone wrote the node since it was read (the controller choosing a
    leader, or a leader changing the ISR). Nothing was written. The caller reads the node again
    (PartitionStates.partition_state) and decides anew on what it finds (a leader that finds another
    leader or a higher leader epoch stops leading); it never repeats the same write."""

    def __init__(self, topic: str, partition: int, version: int) -> None:
        super().__init__(
            f"the state of partition {partition} of topic {topic!r} is no longer at version "
            f"{version}: it was written since it was read; read it again"
        )
        self.topic = topic
        self.partition = partition
        self.version = version


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


class PartitionStates:
    """The partitions' state nodes in the registry, on `session`; `brokers` gives the epochs
    a topic's first states name."""

    def __init__(self, session: Session, brokers: Brokers) -> None:
        self._session = session
        self._brokers = brokers
        self.chroot = session.chroot

    def topic_node_path(self, topic: str) -> str:
        return f"{self.chroot}/brokers/topics/{topic}"

    def partition_states_path(self, topic: str) -> str:
        return f"{self.topic_node_path(topic)}/partitions"

    def partition_state_path(self, topic: str, partition: int) -> str:
        return f"{self.partition_states_path(topic)}/{partition}/state"

    def _partition_nodes(self, topic: str) -> dict[int, bool] | None:
        """Partition -> whether it has a state node, for each node under
        /brokers/topics/<topic>/partitions (None without that node)."""
        folder = self.partition_states_path(topic)
        try:
            children = self._session.children(folder)
        except NoNode:
            return None
        numbers = [child for child in children if child.isascii() and child.isdecimal()]
        listed = self._session.children_many(f"list {folder}/*", [f"{folder}/{n}" for n in numbers])
        found = {}
        for number, below in zip(numbers, listed, strict=True):
            if isinstance(below, NoNode):
                continue  # deleted since listed
            if isinstance(below, FAILED):
                raise below
            found[int(number)] = "state" in below
        return found

    # -- partition states --------------------------------------------------------------------

    def create_partition_states(self, topic: str, config: TopicConfig) -> int:
        """Give each partition of `config` that has no state node one with its initial state
        (PartitionState.initial), leaving those that have one as they are: for a topic created
        before replication (create_topic_config makes them for a new topic). Returns how many
        were created."""
        check_topic_name(topic)
        config.validate(topic)
        created, epochs = 0, self._brokers.epochs()
        for p, replicas in enumerate(config.replicas):
            path = self.partition_state_path(topic, p)
            initial = PartitionState.initial(replicas, epochs)
            with contextlib.suppress(NodeExists):
                self._session.create(path, initial.to_json(), makepath=True)
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
            data, stat = self._session.get(path)
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
        a state node ({} for none); unreadable nodes are left out, with a warning. One listing
        of the partitions' folder (partition_numbers), then a read of each state node together
        (read_partition_states): not a listing of each folder first, which doubled the requests
        of a controller round (20,000 for a topic of 10,000 partitions)."""
        return self.read_partition_states(topic, self.partition_numbers(topic))

    def partition_numbers(self, topic: str) -> list[int]:
        """The partitions of `topic` that have a folder under its partitions' node, in order
        ([] for none; a folder may not have its state node yet)."""
        check_topic_name(topic)
        try:
            children = self._session.children(self.partition_states_path(topic))
        except NoNode:
            return []
        return sorted(int(child) for child in children if child.isascii() and child.isdecimal())

    def read_partition_states(
        self, topic: str, partitions: Sequence[int]
    ) -> dict[int, tuple[PartitionState, int]]:
        """partition_states of `partitions` only (those without a state node, or whose node
        is unreadable, left out), their nodes read together."""
        check_topic_name(topic)
        paths = [self.partition_state_path(topic, p) for p in partitions]
        states = {}
        read = self._session.get_many(f"read {self.partition_states_path(topic)}/*/state", paths)
        for p, path, answer in zip(partitions, paths, read, strict=True):
            if isinstance(answer, NoNode):
                continue  # no state node (yet), or deleted since listed
            if isinstance(answer, FAILED):
                raise answer
            try:
                states[p] = PartitionState.from_json(answer[0]), answer[1].version
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
        try:
            if controller_epoch is None:
                path = self.partition_state_path(topic, partition)
                return self._session.set(path, state.to_json(), version)
            return self._commit_states(topic, [(partition, state, version)], controller_epoch)[0]
        except BadVersion:
            raise PartitionStateChanged(topic, partition, version) from None
        except NoNode:
            raise UnknownTopicOrPartition(
                f"partition {partition} of topic {topic!r} has no state node"
            ) from None

    def write_partition_states(
        self, topic: str, writes: Sequence[tuple[int, PartitionState, int]], controller_epoch: int
    ) -> list[int] | None:
        """The controller's write_partition_state of each (partition, state, version) of
        `writes`, in one transaction (with the check of /controller_epoch): every state written,
        and their nodes' new versions returned, or none. None when a node of them was written
        or deleted since it was read: nothing is written then, and the caller writes them one
        by one (write_partition_state), which tells which. ControllerMoved as
        write_partition_state. A round that writes thousands of states (a broker restarted
        that led them) takes a transaction for each WRITE_BATCH of them, not one each: 10,000
        states written one by one took 7.7 s and 6.8 s of CPU (the client's and ZooKeeper's)
        on the 2-core machine, in batches of 100 0.2 s and 0.2 s."""
        check_topic_name(topic)
        try:
            return self._commit_states(topic, writes, controller_epoch)
        except (BadVersion, NoNode):
            return None

    def _commit_states(
        self, topic: str, writes: Sequence[tuple[int, PartitionState, int]], controller_epoch: int
    ) -> list[int]:
        """Write `writes` in one transaction, checked against `controller_epoch`: their
        nodes' new versions. ControllerMoved when /controller_epoch moved, else BadVersion or
        NoNode as the transaction's failed write raised it (nothing written)."""
        if not is_int(controller_epoch) or controller_epoch < 1:
            raise ValueError(f"a controller epoch is an integer >= 1, not {controller_epoch!r}")
        epoch_path = self.chroot + CONTROLLER_EPOCH

        def build(transaction: TransactionRequest) -> None:
            # /controller_epoch's version is its epoch - 1 (broker.registry.controller)
            transaction.check(epoch_path, controller_epoch - 1)
            for partition, state, version in writes:
                path = self.partition_state_path(topic, partition)
                transaction.set_data(path, state.to_json(), version)

        try:
            results = self._session.commit(f"write {len(writes)} state(s) of topic {topic}", build)
        except (BadVersion, NoNode):
            if epoch_moved(self._session, epoch_path, controller_epoch):
                raise ControllerMoved(controller_epoch) from None
            raise
        return [stat.version for stat in results[1:]]

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
        self._session.watch_data(
            self.partition_state_path(topic, partition), PartitionState.from_json, callback
        )


def epoch_moved(session: Session, epoch_path: str, epoch: int) -> bool:
    """Whether /controller_epoch (`epoch_path`) is no longer at `epoch` (its version epoch - 1):
    what a controller's conditional write refused tells apart."""
    try:
        return session.get(epoch_path)[1].version != epoch - 1
    except NoNode:
        return True
