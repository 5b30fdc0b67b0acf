"""What operators ask of the controller through the registry (docs/replication.md,
"Reassignment" and "Preferred-leader election"; docs/registry.md):

    /admin/reassign/<topic>-<p>     persistent  a reassignment of partition p under way
        {"version": 1, "replicas": [4, 2, 3], "from": [1, 2, 3]}
    /admin/preferred_election       persistent  a preferred-leader election asked
        {"version": 1, "topics": ["clicks"]}     (null: every topic)

pylogctl writes them (`topic reassign`, `topic elect-preferred`); the controller watches them,
does what they ask, and deletes them once done: a reassignment's node in the same ZooKeeper
transaction as its last step (Registry.finish_reassignment), the election's once it ran.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from kazoo.client import TransactionRequest

from broker.errors import InvalidTopic, PylogError, UnknownTopicOrPartition
from broker.protocol import check_topic_name
from broker.registry.controller import CONTROLLER_EPOCH, ControllerMoved
from broker.registry.nodes import decode, encode, int_list, validate_broker_id
from broker.registry.session import BadVersion, NodeExists, NoNode, Session
from broker.registry.states import PartitionState, PartitionStateChanged, epoch_moved
from broker.registry.topic_config import TopicConfig
from broker.registry.topics import TopicNodes

log = logging.getLogger(__name__)

REASSIGN = "/admin/reassign"
PREFERRED_ELECTION = "/admin/preferred_election"


class ReassignmentInProgress(PylogError):
    """A reassignment of the partition is under way already: wait for it to end (pylogctl
    topic reassign --status) before asking another. Nothing was written."""

    def __init__(self, topic: str, partition: int, wanted: tuple[int, ...]) -> None:
        super().__init__(
            f"partition {partition} of topic {topic!r} is being reassigned already"
            + (f", to replicas {list(wanted)}" if wanted else "")
            + ": wait for that to end"
        )


class ElectionInProgress(PylogError):
    """A preferred-leader election asked earlier has not been run by the controller yet."""

    def __init__(self) -> None:
        super().__init__(
            "a preferred-leader election asked earlier is still waiting for the controller"
        )


@dataclass(frozen=True)
class Reassignment:
    """What /admin/reassign/<topic>-<p> holds: the `replicas` wanted (the first the preferred
    leader once done) and those the partition had when it was asked (`from`)."""

    topic: str
    partition: int
    replicas: tuple[int, ...]
    original: tuple[int, ...]

    def to_json(self) -> bytes:
        return encode({"replicas": list(self.replicas), "from": list(self.original)})

    @classmethod
    def parse(cls, name: str, data: bytes) -> Reassignment:
        """From a node's name (<topic>-<p>) and data; ValueError when it is not one."""
        topic, _, number = name.rpartition("-")
        if not topic or not number.isascii() or not number.isdecimal():
            raise ValueError(f"{name!r} is not <topic>-<partition>")
        obj = decode(data)
        replicas, original = int_list(obj, "replicas"), int_list(obj, "from")
        if not replicas or len(set(replicas)) != len(replicas):
            raise ValueError(f"'replicas' must be distinct broker ids, not {list(replicas)}")
        return cls(topic, int(number), replicas, original)


def check_replicas(replicas: Sequence[int], live: Sequence[int]) -> tuple[int, ...]:
    """`replicas` as a tuple when they are distinct broker ids, each of a broker registered
    now (`live`); InvalidTopic else."""
    wanted = tuple(replicas)
    if not wanted:
        raise InvalidTopic("give at least one replica")
    for broker_id in wanted:
        try:
            validate_broker_id(broker_id)
        except ValueError as error:
            raise InvalidTopic(str(error)) from None
    if len(set(wanted)) != len(wanted):
        raise InvalidTopic(f"replicas must be distinct brokers, not {list(wanted)}")
    if missing := sorted(set(wanted) - set(live)):
        raise InvalidTopic(
            f"broker(s) {missing} are not registered (brokers up: {sorted(live)}): a replica "
            "must be on a broker that is up"
        )
    return wanted


class ReassignmentNodes:
    """The reassignments and preferred-leader elections asked in the registry (/admin), on
    `session`; `topics` holds the configurations and states they change."""

    def __init__(self, session: Session, topics: TopicNodes) -> None:
        self._session = session
        self._topics = topics
        self.chroot = session.chroot

    def reassign_path(self, topic: str, partition: int) -> str:
        return f"{self.chroot}{REASSIGN}/{topic}-{partition}"

    # -- asked by pylogctl -------------------------------------------------------------------

    def start_reassignment(
        self, topic: str, partition: int, replicas: Sequence[int], live: Sequence[int]
    ) -> Reassignment | None:
        """Ask the controller to move `partition` of `topic` to `replicas` (the first its
        preferred leader once done). None when it has those replicas already (nothing
        written). UnknownTopicOrPartition for no such topic or partition; InvalidTopic for
        replicas that are not distinct brokers of `live` (those registered);
        ReassignmentInProgress when one is under way for the partition."""
        check_topic_name(topic)
        wanted = check_replicas(replicas, live)
        config = self._topics.topic_config(topic)
        current = config.replicas_of(partition)
        if current == wanted:
            return None
        min_insync = int(config.settings.get("min_insync_replicas") or 1)
        if len(wanted) < min_insync:
            raise InvalidTopic(
                f"{len(wanted)} replica(s) for partition {partition} of topic {topic!r}, below "
                f"its min_insync_replicas {min_insync}: ack=all could never be answered"
            )
        reassignment = Reassignment(topic, partition, wanted, current)
        path = self.reassign_path(topic, partition)
        try:
            self._session.create(path, reassignment.to_json(), makepath=True)
        except NodeExists:
            under_way = self.read().get((topic, partition))
            raise ReassignmentInProgress(
                topic, partition, () if under_way is None else under_way.replicas
            ) from None
        return reassignment

    def read(self) -> dict[tuple[str, int], Reassignment]:
        """Every reassignment under way: (topic, partition) -> Reassignment (unreadable nodes
        are left out, with a warning)."""
        found = self._session.read_all(f"{self.chroot}{REASSIGN}", bytes, str)
        result = {}
        for name, data in found.items():
            try:
                reassignment = Reassignment.parse(name, data)
            except ValueError as error:
                log.warning("ignoring unreadable %s%s/%s: %s", self.chroot, REASSIGN, name, error)
                continue
            result[(reassignment.topic, reassignment.partition)] = reassignment
        return result

    def watch_reassignments(self, callback: Callable[[list[str]], None]) -> None:
        """Call `callback` with the names of the reassignments' nodes ("<topic>-<partition>")
        now and whenever a reassignment is asked or ends, until stop(); no node is read for it
        (Session.watch_children): read() reads them."""
        self._session.watch_children(f"{self.chroot}{REASSIGN}", callback)

    def ask_preferred_election(self, topics: Sequence[str] | None) -> None:
        """Ask the controller for a preferred-leader election over `topics` (None: every
        topic). ElectionInProgress while one asked earlier waits; UnknownTopicOrPartition for
        a topic that does not exist."""
        for topic in topics or ():
            self._topics.topic_config(topic)
        data = encode({"topics": None if topics is None else list(topics)})
        try:
            self._session.create(self.chroot + PREFERRED_ELECTION, data, makepath=True)
        except NodeExists:
            raise ElectionInProgress() from None

    def preferred_election_asked(self) -> tuple[bool, list[str] | None]:
        """Whether a preferred-leader election is asked, and over which topics (None: all)."""
        try:
            data, _ = self._session.get(self.chroot + PREFERRED_ELECTION)
        except NoNode:
            return False, None
        try:
            topics = decode(data).get("topics")
        except ValueError:
            topics = None
        if not isinstance(topics, list) or not all(isinstance(t, str) for t in topics):
            return True, None
        return True, topics

    def end_preferred_election(self) -> None:
        """The asked election ran: its node goes (no error when it is gone already)."""
        with contextlib.suppress(NoNode):
            self._session.delete(self.chroot + PREFERRED_ELECTION)

    def watch_preferred_election(self, callback: Callable[[bool], bool]) -> None:
        """Call `callback(asked)` now and whenever /admin/preferred_election is created or
        deleted, until stop() or the callback returns False."""
        self._session.watch_data(
            self.chroot + PREFERRED_ELECTION, lambda _: True, lambda v, _: callback(v is not None)
        )

    # -- the controller's steps -----------------------------------------------------------

    def write_reassignment_step(
        self,
        reassignment: Reassignment,
        config: TopicConfig,
        config_version: int,
        replicas: Sequence[int],
        controller_epoch: int,
        state: tuple[PartitionState, int] | None = None,
    ) -> None:
        """One step of `reassignment`, as the controller of `controller_epoch`, in one
        ZooKeeper transaction: the partition's replicas become `replicas` in the topic's
        configuration (written only if its node is still at `config_version`), and, with
        `state` (a state and the version of the state node it replaces), its state node is
        written too and the reassignment's node deleted: the reassignment is over.
        ControllerMoved when another controller was elected since; PartitionStateChanged
        when the configuration or the state node was written since it was read (nothing
        written: read them again); UnknownTopicOrPartition when the topic is gone."""
        topic, partition = reassignment.topic, reassignment.partition
        changed = list(config.replicas)
        changed[partition] = tuple(replicas)
        new_config = dataclasses.replace(config, replicas=tuple(changed))
        new_config.validate(topic)
        epoch_path = self.chroot + CONTROLLER_EPOCH

        def build(transaction: TransactionRequest) -> None:
            transaction.check(epoch_path, controller_epoch - 1)  # its version: epoch - 1
            config_path = self._topics.topic_config_path(topic)
            transaction.set_data(config_path, new_config.to_json(), config_version)
            if state is not None:
                transaction.set_data(
                    self._topics.partition_state_path(topic, partition),
                    state[0].to_json(),
                    state[1],
                )
                transaction.delete(self.reassign_path(topic, partition))

        try:
            self._session.commit(f"reassign {topic}-{partition}", build)
        except (BadVersion, NoNode):
            if epoch_moved(self._session, epoch_path, controller_epoch):
                raise ControllerMoved(controller_epoch) from None
            self._topics.topic_config(topic)  # UnknownTopicOrPartition when it went
            raise PartitionStateChanged(topic, partition, config_version) from None

    def reassignment_view(
        self, topic: str, partition: int
    ) -> tuple[TopicConfig, int, tuple[PartitionState, int]]:
        """What the controller decides a reassignment's next step from: the topic's
        configuration and its node's version, and the partition's state and its node's version.
        UnknownTopicOrPartition when the topic, the partition or its state node is missing."""
        config, version = self._topics.read_config(topic)
        config.replicas_of(partition)
        return config, version, self._topics.partition_state(topic, partition)

    def cancel_reassignment(self, topic: str, partition: int) -> None:
        """Forget the reassignment of `partition` of `topic` (a wanted broker that will not
        come back): the controller stops it where it is; brokers added already stay replicas
        (ask another reassignment to remove them). UnknownTopicOrPartition when none is under
        way."""
        check_topic_name(topic)
        try:
            self._session.delete(self.reassign_path(topic, partition))
        except NoNode:
            raise UnknownTopicOrPartition(
                f"no reassignment of partition {partition} of topic {topic!r} is under way"
            ) from None
