"""Topics in the registry: each topic's configuration (/config/topics/<topic>, persistent),
the partitions each broker serves (/brokers/topics/<topic>/<broker_id>, ephemeral) and each
partition's state: its leader, leader epoch and in-sync replicas
(/brokers/topics/<topic>/partitions/<p>/state, persistent; docs/replication.md)."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from collections.abc import Callable, Iterable, Mapping

from kazoo.client import TransactionRequest

from broker.errors import (
    InvalidTopic,
    RegistryUnavailable,
    TopicAlreadyExists,
    UnknownTopicOrPartition,
)
from broker.placement import assign_replicas
from broker.protocol import check_topic_name
from broker.registry.nodes import decode, encode, int_list, is_int, validate_broker_id
from broker.registry.session import BadVersion, NodeExists, NoNode, NotEmpty
from broker.registry.states import PartitionState, PartitionStates
from broker.registry.topic_config import Settings, TopicConfig, check_log_starts

log = logging.getLogger(__name__)

ALTER_ATTEMPTS = 10
"""How many times alter_topic_settings reads and writes a configuration that others keep
changing between its read and its write, before it gives up."""

TRANSACTION_ATTEMPTS = 10
"""How many times creating, growing or deleting a topic's nodes is tried again when the nodes
it was built from changed before it was applied."""


def _partitions(data: bytes) -> tuple[int, ...]:
    return int_list(decode(data), "partitions")


class TopicNodes(PartitionStates):
    """The registry's calls on topics: their configurations, who serves their partitions, and
    (PartitionStates) each partition's state (leader, leader epoch, ISR).

    A request that timed out may still be applied by the server later: the registrations are
    idempotent, and a create_topic_config retried after a timeout may answer
    TopicAlreadyExists for its own first attempt."""

    def topic_broker_path(self, topic: str, broker_id: int) -> str:
        return f"{self.chroot}/brokers/topics/{topic}/{broker_id}"

    def topic_config_path(self, topic: str) -> str:
        return f"{self.chroot}/config/topics/{topic}"

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
        self._session.register(
            self.topic_broker_path(topic, broker_id), encode({"partitions": numbers})
        )

    def unregister_topic(self, topic: str, broker_id: int) -> None:
        """Delete /brokers/topics/<topic>/<broker_id> (and the topic's node once empty)."""
        check_topic_name(topic)
        validate_broker_id(broker_id)
        self._session.unregister(self.topic_broker_path(topic, broker_id))
        with contextlib.suppress(NoNode, NotEmpty):
            self._session.delete(self.topic_node_path(topic))

    def topic_brokers(self, topic: str) -> dict[int, tuple[int, ...]]:
        """Broker id -> the partitions of `topic` it serves, for the live brokers holding it.
        (Children of /brokers/topics/<topic> whose names are not numbers are not brokers'
        registrations: `partitions`, the partition states, is passed over.)"""
        check_topic_name(topic)
        path = self.topic_node_path(topic)
        try:
            children = self._session.children(path)
        except NoNode:
            return {}
        ids = [child for child in children if child.isascii() and child.isdecimal()]
        return self._session.read_each(path, ids, _partitions, int)

    # -- topic configurations ----------------------------------------------------------------

    def create_topic_config(self, topic: str, config: TopicConfig) -> None:
        """Create the topic: the state node of each partition with its initial state
        (PartitionState.initial: led by replicas[p][0] at leader epoch 0, every replica in
        sync), in transactions of at most TRANSACTION_BYTES, then the persistent
        /config/topics/<topic>, which publishes them (docs/registry.md, "Writing a topic":
        no reader looks at the state nodes of a topic without a configuration, so none sees
        a part of them). TopicAlreadyExists if the configuration exists, or another request
        is creating the topic now (it took the state nodes over from this one).

        State nodes left by a topic of the same name whose creation or deletion was cut
        short are taken over: overwritten (their versions go on rising, so a write of the
        old topic's made on a version read before fails), those past the new topic's
        partitions deleted. Cut short itself (a crash, a lost connection), it leaves such
        nodes and no configuration: the topic does not exist, and creating it again
        completes it."""
        check_topic_name(topic)
        config.validate(topic)
        epochs = self._brokers.epochs()
        states = [
            PartitionState.initial(replicas, epochs).to_json() for replicas in config.replicas
        ]
        folder = self.partition_states_path(topic)
        what = f"create topic {topic!r}"
        for _ in range(TRANSACTION_ATTEMPTS):
            try:
                claim = self._claim_states(topic, lambda: self._refuse_existing(topic))
            except BadVersion:
                raise self._being_created(topic) from None
            found = self._partition_nodes(topic) or {}

            def build(transaction: TransactionRequest, found: dict[int, bool] = found) -> None:
                for p, state in enumerate(states):
                    path = self.partition_state_path(topic, p)
                    if p not in found:
                        transaction.create(f"{folder}/{p}")
                        transaction.create(path, state)
                    elif found[p]:
                        transaction.set_data(path, state)
                    else:
                        transaction.create(path, state)
                for p, has_state in found.items():
                    if p >= len(states):
                        if has_state:
                            transaction.delete(self.partition_state_path(topic, p))
                        transaction.delete(f"{folder}/{p}")

            def fence(transaction: TransactionRequest, claim: int = claim) -> None:
                transaction.check(folder, claim)

            def publish(transaction: TransactionRequest, claim: int = claim) -> None:
                transaction.set_data(folder, b"", claim)
                transaction.create(self.topic_config_path(topic), config.to_json())

            try:
                self._session.commit_in_chunks(what, build, fence)
                self._session.commit(what, publish)
                return
            except BadVersion:
                self._refuse_existing(topic)
                raise self._being_created(topic) from None
            except (NodeExists, NoNode, NotEmpty):
                self._refuse_existing(topic)
                continue  # partition nodes changed since listed: list them again
        raise RegistryUnavailable(
            f"the nodes of topic {topic!r} changed under each of {TRANSACTION_ATTEMPTS} attempts "
            f"to create it: try again"
        )

    def _claim_states(self, topic: str, check: Callable[[], None]) -> int:
        """Make this call the one writer of the partition state nodes of `topic` that are not
        published yet (docs/registry.md, "Writing a topic"): read the version of
        /brokers/topics/<topic>/partitions (created if missing), call `check()` (which raises
        when there is nothing to write), then write the node at the version read. Returns its
        new version, the claim, which each of this writer's transactions checks: a writer that
        claims after it, or a publication, fences it. BadVersion when another writer claimed
        between the read and the write."""
        folder = self.partition_states_path(topic)
        self._session.ensure_path(folder)
        version = self._session.get(folder)[1].version
        check()
        return self._session.set(folder, b"", version)

    def _refuse_existing(self, topic: str) -> None:
        if self._exists(self.topic_config_path(topic)):
            raise TopicAlreadyExists(f"topic {topic!r} exists already")

    @staticmethod
    def _being_created(topic: str) -> TopicAlreadyExists:
        return TopicAlreadyExists(
            f"topic {topic!r} is being created by another request at the same time"
        )

    def add_partitions(
        self, topic: str, count: int, racks: Mapping[int, str | None] | None = None
    ) -> TopicConfig:
        """Give `topic` `count` partitions in all: the new ones placed over the brokers of
        `racks` (broker id -> rack, None for none; default: the brokers registered now, with
        their racks) as they would be in a new topic of `count` partitions (assign_replicas,
        so leadership goes on round robin), with the topic's replication factor (its
        partitions' largest number of replicas). Their
        state nodes are written first, in transactions of at most TRANSACTION_BYTES (past the
        configuration's partition count, no reader looks at them), then the configuration,
        conditionally on its version (read again and retried when another write came
        between), which publishes them. Returns the new configuration.
        UnknownTopicOrPartition if there is none; InvalidTopic when `count` is not above the
        partitions it has, is above MAX_PARTITIONS, or there are fewer brokers than the
        replication factor. Cut short, it leaves state nodes past the partition count, which
        the next add_partitions (or creation) takes over."""
        check_topic_name(topic)
        if racks is None:
            racks = {broker_id: info.rack for broker_id, info in self._brokers.read().items()}
        for _ in range(TRANSACTION_ATTEMPTS):
            config, version = self.read_config(topic)
            grown = self._grow(topic, config, version, count, racks)
            if grown is not None:
                return grown
        raise RegistryUnavailable(
            f"the nodes of topic {topic!r} changed under each of {TRANSACTION_ATTEMPTS} attempts "
            f"to add partitions to it: try again"
        )

    def _grow(
        self,
        topic: str,
        config: TopicConfig,
        version: int,
        count: int,
        racks: Mapping[int, str | None],
    ) -> TopicConfig | None:
        """One attempt of add_partitions on `config` as read at `version`: the new
        configuration, or None when another write came between."""
        if count <= config.partitions:
            raise InvalidTopic(
                f"topic {topic!r} has {config.partitions} partitions: partitions are only "
                f"added (ask for more than {config.partitions}), never taken away"
            )
        factor = max(len(replicas) for replicas in config.replicas)
        try:
            added = assign_replicas(count, racks, factor)[config.partitions :]
        except ValueError as error:
            raise InvalidTopic(f"topic {topic!r}: {error}") from None
        grown = dataclasses.replace(
            config,
            partitions=count,
            brokers=config.brokers + tuple(replicas[0] for replicas in added),
            replicas=config.replicas + added,
        )
        grown.validate(topic)
        epochs = self._brokers.epochs()
        folder = self.partition_states_path(topic)
        what = f"add partitions to topic {topic!r}"
        try:
            claim = self._claim_states(topic, lambda: None)
        except BadVersion:
            return None  # another writer claimed them meanwhile
        found = self._partition_nodes(topic) or {}

        def build(transaction: TransactionRequest) -> None:
            for p, replicas in enumerate(added, start=config.partitions):
                state = PartitionState.initial(replicas, epochs).to_json()
                if p not in found:
                    transaction.create(f"{folder}/{p}")
                if found.get(p):  # left by a deletion or an addition cut short
                    transaction.set_data(self.partition_state_path(topic, p), state)
                else:
                    transaction.create(self.partition_state_path(topic, p), state)

        def publish(transaction: TransactionRequest) -> None:
            transaction.set_data(folder, b"", claim)
            transaction.set_data(self.topic_config_path(topic), grown.to_json(), version)

        try:
            self._session.commit_in_chunks(what, build, lambda t: t.check(folder, claim))
            self._session.commit(what, publish)
        except (BadVersion, NodeExists, NoNode):
            return None  # another write came between, or the partition nodes changed
        return grown

    def delete_topic_config(self, topic: str) -> None:
        """Delete /config/topics/<topic>, which unpublishes the topic (every reader sees it
        gone at once), with, in the same transaction, a claim on its partition state nodes
        (_claim_states); then those nodes, in transactions of at most TRANSACTION_BYTES,
        each fenced by that claim; then /brokers/topics/<topic>/partitions, and
        /brokers/topics/<topic> once no broker's node is left under it.
        UnknownTopicOrPartition if there is no configuration.

        Cut short (a crash, a lost connection), the topic is deleted all the same: the state
        nodes left are read by no one (no configuration names them), and the next creation
        of a topic of that name takes them over. A creation that claims them while this
        deletion runs fences it: the rest is left to that creation."""
        check_topic_name(topic)
        folder = self.partition_states_path(topic)
        path = self.topic_config_path(topic)
        if not self._exists(path):
            raise UnknownTopicOrPartition(f"topic {topic!r} does not exist")
        self._session.ensure_path(folder)  # a topic created before replication may have none

        def unpublish(transaction: TransactionRequest) -> None:
            transaction.delete(path)
            transaction.set_data(folder, b"")

        try:
            claim: int = self._session.commit(f"delete topic {topic!r}", unpublish)[1].version
        except NoNode:
            if not self._exists(path):
                raise UnknownTopicOrPartition(f"topic {topic!r} does not exist") from None
            raise
        for _ in range(TRANSACTION_ATTEMPTS):
            found = self._partition_nodes(topic) or {}

            def build(transaction: TransactionRequest, found: dict[int, bool] = found) -> None:
                for p, has_state in found.items():
                    if has_state:
                        transaction.delete(self.partition_state_path(topic, p))
                    transaction.delete(f"{folder}/{p}")

            try:
                self._session.commit_in_chunks(
                    f"delete topic {topic!r}", build, lambda t: t.check(folder, claim)
                )
                self._session.delete(folder, claim)
                break
            except BadVersion:
                return  # a creation of the same name took the nodes over
            except (NoNode, NotEmpty):
                continue  # partition nodes changed since listed: list them again
            except RegistryUnavailable as error:
                log.warning(
                    "topic %r is deleted, but not all its partition state nodes: left to the "
                    "next creation of that name (%s)",
                    topic,
                    error,
                )
                return
        else:
            log.warning(
                "topic %r is deleted, but its partition state nodes changed under each of %d "
                "attempts to delete them: left to the next creation of that name",
                topic,
                TRANSACTION_ATTEMPTS,
            )
            return
        with contextlib.suppress(NoNode, NotEmpty):
            self._session.delete(self.topic_node_path(topic))

    def _exists(self, path: str) -> bool:
        try:
            self._session.get(path)
        except NoNode:
            return False
        return True

    def topic_config(self, topic: str) -> TopicConfig:
        """The configuration of `topic`; UnknownTopicOrPartition if there is none."""
        check_topic_name(topic)
        return self.read_config(topic)[0]

    def read_config(self, topic: str) -> tuple[TopicConfig, int]:
        """The configuration of `topic` and its node's version."""
        path = self.topic_config_path(topic)
        try:
            data, stat = self._session.get(path)
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
        return self._rewrite_config(
            topic,
            lambda config: dataclasses.replace(config, settings=dict(change(config.settings))),
        )

    def move_log_starts(self, topic: str, starts: Mapping[int, int]) -> TopicConfig:
        """Ask the partitions of `topic` in `starts` to start at those offsets (records before
        them deleted), each only forward: a start at or below the one asked already changes
        nothing. A conditional write on the version read, retried as alter_topic_settings
        does. Returns the new configuration; UnknownTopicOrPartition if there is none,
        InvalidTopic for a partition it does not have or an offset below 0."""

        def move(config: TopicConfig) -> TopicConfig:
            try:
                check_log_starts(config.partitions, starts)
            except ValueError as error:
                raise InvalidTopic(f"topic {topic!r}: {error}") from None
            moved = dict(config.log_starts)
            for partition, start in starts.items():
                moved[partition] = max(start, moved.get(partition, 0))
            return dataclasses.replace(config, log_starts=moved)

        return self._rewrite_config(topic, move)

    def _rewrite_config(
        self, topic: str, change: Callable[[TopicConfig], TopicConfig]
    ) -> TopicConfig:
        """Write `change(the configuration of topic)`, checked, as a conditional write on the
        version read (read again and retried, up to ALTER_ATTEMPTS times, when another write
        came between). UnknownTopicOrPartition if there is none; what `change` raises."""
        check_topic_name(topic)
        path = self.topic_config_path(topic)
        for _ in range(ALTER_ATTEMPTS):
            config, version = self.read_config(topic)
            altered = change(config)
            altered.validate(topic)
            try:
                self._session.set(path, altered.to_json(), version)
            except BadVersion:
                continue
            except NoNode:
                raise UnknownTopicOrPartition(f"topic {topic!r} does not exist") from None
            return altered
        raise RegistryUnavailable(
            f"{path} changed under each of {ALTER_ATTEMPTS} attempts to change it: try again"
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
        self._session.watch_data(path, TopicConfig.from_json, lambda config, _: callback(config))

    def config_created(self, topic: str) -> int | None:
        """The zxid that created /config/topics/<topic>: a topic deleted and made again under
        its name has another (its state nodes may be those the deletion left, taken over).
        None when the topic does not exist."""
        check_topic_name(topic)
        stat = self._session.exists(self.topic_config_path(topic))
        return None if stat is None else stat.czxid

    def topic_configs(self) -> dict[str, TopicConfig]:
        """Every topic's configuration: name -> TopicConfig (unreadable nodes are left out)."""
        return self._session.read_all(f"{self.chroot}/config/topics", TopicConfig.from_json, str)

    def watch_topic_names(self, callback: Callable[[list[str]], None]) -> None:
        """Call `callback` with the topics' names now and whenever a topic is created or
        deleted, until stop(); no configuration is read for it (Session.watch_children)."""
        self._session.watch_children(f"{self.chroot}/config/topics", callback)

    def watch_topic_configs(self, callback: Callable[[dict[str, TopicConfig]], None]) -> None:
        """Call `callback(topic_configs())` now and whenever a topic is created or deleted,
        until stop(). (A node's data is not watched here: watch_topic_config does that.)"""
        self._session.add_watch(
            f"{self.chroot}/config/topics", TopicConfig.from_json, str, callback
        )
