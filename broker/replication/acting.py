"""The controller's acts in one controller epoch (docs/replication.md, "The controller"), on the
calling thread (the controller service's): settling every partition after a change of the live
brokers or the topics (choose_leader), preferred-leader elections (choose_preferred) and the
steps of reassignments (broker.replication.reassign). Every write is
TopicNodes.write_partition_state conditional on the node's version read and on
/controller_epoch being at this controller's epoch: PartitionStateChanged reads the node again
and decides again (WRITE_ATTEMPTS times at most), ControllerMoved ends the acting.
"""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Literal

from broker.config import replica_setting
from broker.errors import PylogError, RegistryUnavailable, UnknownTopicOrPartition
from broker.registry import (
    NO_LEADER,
    BrokerRegistration,
    ControllerMoved,
    PartitionState,
    PartitionStateChanged,
    Reassignment,
    TopicConfig,
)
from broker.registry.admin import ReassignmentNodes
from broker.registry.brokers import Brokers
from broker.registry.topics import TopicNodes
from broker.replication.election import Choice, choose_leader, choose_preferred
from broker.replication.reassign import next_step, why_waiting

log = logging.getLogger("pylog.controller")

WRITE_ATTEMPTS = 5
"""How many times one partition's state is read and written again when others keep writing it
between the controller's read and its write (PartitionStateChanged), before the controller
leaves it for its next round (RETRY_MIN_S later)."""

WRITE_BATCH = 100
"""How many partitions' states the controller writes in one transaction
(TopicNodes.write_partition_states): a broker restarted that led 10,000 partitions has each
given a new leader epoch, which took seconds of ZooKeeper's and the supervisor's CPU written one
by one."""

READ_CHUNK = 1_000
"""How many partitions' states the controller reads at a time, its stop looked at between: a
topic's 10,000 states take seconds to read."""


class Counters:
    """What a controller service counts, across its epochs (ControllerStatistics)."""

    def __init__(self) -> None:
        self.elections = 0
        self.leaders_chosen = 0
        self.unclean_elections = 0
        self.offline_partitions = 0
        self.isr_removals = 0
        self.preferred_moves = 0
        self.preferred_runs = 0
        self.reassign_steps = 0
        self.reassignments_done = 0
        self.reassignments_waiting: dict[tuple[str, int], tuple[int, ...]] = {}
        """The reassignments waiting, each with what it waited for when last logged."""


Outcome = Literal["unchanged", "written", "left"]
Decide = Callable[[PartitionState], Choice | None]


@dataclass
class Settled:
    """A topic as the controller left it when it last settled every partition of it, in its
    epoch: its configuration, the live brokers (broker epochs) and the zxid that created its
    configuration's node then, and the leader each partition was left with. While the three stand,
    none of its partitions needs the controller: only the controller writes a state but for a
    leader's ISR changes, which never leave a partition to settle (a leader that is alive
    leads on), so a round need not read them again (20,000 states took seconds of reads each
    round: on every broker registering, every topic made or changed)."""

    config: TopicConfig
    alive: dict[int, int]
    created: int
    leaders: dict[int, int]


def unclean_allowed(config: TopicConfig) -> bool:
    """Whether the topic's unclean_leader_election is on (a live setting)."""
    return replica_setting(config.settings, "unclean_leader_election") == 1


def _changed(
    before: Settled | None, config: TopicConfig, alive: dict[int, int], created: int | None
) -> list[int] | None:
    """The partitions of a topic (`config` now, `alive` the live brokers now, `created` the
    zxid of its configuration's node now) to settle, given what was `before`: those added or
    given other replicas since, when the rest stands; None when every one must be."""
    if (
        before is None
        or created is None
        or before.created != created
        or before.alive != alive
        or unclean_allowed(before.config) != unclean_allowed(config)
    ):
        return None
    old = before.config
    return [
        p
        for p in range(config.partitions)
        if p >= old.partitions or tuple(config.replicas[p]) != tuple(old.replicas[p])
    ]


class Acting:
    """The controller's acts in one controller epoch, on the calling thread."""

    def __init__(
        self,
        brokers: Brokers,
        topics: TopicNodes,
        reassignments: ReassignmentNodes,
        epoch: int,
        counters: Counters,
        stopping: Callable[[], bool],
        known: dict[str, Settled] | None = None,
    ) -> None:
        self.brokers = brokers
        self.topics = topics
        self.reassignments = reassignments
        self.epoch = epoch
        self.counters = counters
        self.stopping = stopping
        self.known: dict[str, Settled] = {} if known is None else known
        """The topics settled in this epoch (Settled), kept across its rounds by the service."""

    def settle(self) -> tuple[bool, list[str]]:
        """Settle every partition of every topic (choose_leader), those of a topic that did not
        change since it was settled excepted (Settled). Returns whether every one is settled
        (False: some left for the next round, or stopped meanwhile, which it looks at before
        each READ_CHUNK of partitions read and each WRITE_BATCH written) and the topics seen.
        RegistryUnavailable and ControllerMoved as they come."""
        alive = self.brokers.epochs()
        configs = self.topics.topic_configs()
        for gone in set(self.known) - set(configs):
            del self.known[gone]
        settled, offline = True, 0
        for topic, config in sorted(configs.items()):
            unclean = unclean_allowed(config)

            def decide_of(
                partition: int, config: TopicConfig = config, unclean: bool = unclean
            ) -> Decide:
                return functools.partial(
                    choose_leader,
                    replicas=config.replicas[partition],
                    alive=alive,
                    unclean=unclean,
                    controller_epoch=self.epoch,
                )

            created = self.topics.config_created(topic)
            before = self.known.pop(topic, None)
            changed = _changed(before, config, alive, created)
            outcomes = self._settle_topic(topic, config, decide_of, changed)
            if outcomes is not None and changed is None and len(outcomes) < config.partitions:
                made = self.topics.create_partition_states(topic, config)
                if made:
                    log.info("topic %r: %d partition state node(s) created", topic, made)
                outcomes = self._settle_topic(topic, config, decide_of, None)
            if outcomes is None:
                return False, []
            leaders = {} if before is None or changed is None else before.leaders
            leaders.update((p, final.leader) for p, (_, final) in outcomes.items())
            left = any(outcome == "left" for outcome, _ in outcomes.values())
            settled = settled and not left
            offline += sum(leader == NO_LEADER for leader in leaders.values())
            # a partition without a readable state is read again next round, logged again
            if not left and len(leaders) == config.partitions and created is not None:
                self.known[topic] = Settled(config, alive, created, leaders)
        self.counters.offline_partitions = offline
        return settled, list(configs)

    def elect_preferred(self, topics: Iterable[str] | None) -> int:
        """Move leadership to each partition's preferred leader where choose_preferred says so;
        how many moved. Of a topic settled and unchanged since (Settled), only the partitions
        it left led by another broker are read. UnknownTopicOrPartition for a topic of
        `topics` that does not exist (nothing moved then). Stops, as settle, once the service
        is stopping."""
        if isinstance(topics, str):
            raise TypeError("topics is a collection of topic names, not one name")
        if topics is None:
            configs = self.topics.topic_configs()
        else:
            configs = {topic: self.topics.topic_config(topic) for topic in topics}
        alive = self.brokers.epochs()
        moved = 0
        for topic, config in sorted(configs.items()):

            def decide_of(partition: int, config: TopicConfig = config) -> Decide:
                return functools.partial(
                    choose_preferred,
                    replicas=config.replicas[partition],
                    alive=alive,
                    controller_epoch=self.epoch,
                )

            before = self.known.get(topic)
            led_elsewhere = None
            if before is not None and before.config == config:
                led_elsewhere = [
                    p for p, leader in before.leaders.items() if leader != config.replicas[p][0]
                ]
            outcomes = self._settle_topic(topic, config, decide_of, led_elsewhere)
            if outcomes is None:
                break
            moved += sum(outcome == "written" for outcome, _ in outcomes.values())
            if before is not None:
                before.leaders.update((p, final.leader) for p, (_, final) in outcomes.items())
        return moved

    def _settle_topic(
        self,
        topic: str,
        config: TopicConfig,
        decide_of: Callable[[int], Decide],
        partitions: list[int] | None,
    ) -> dict[int, tuple[Outcome, PartitionState]] | None:
        """Write, for each of `partitions` of `topic` (`config`; None: every one) that has a
        state node, what `decide_of(partition)` chooses: the states read READ_CHUNK at a time,
        the choices written WRITE_BATCH to a transaction (a batch refused, a state of it
        written since it was read, is written one by one: _settle_one). What came of each
        partition, and the state it is left in; None once the service is stopping (looked at
        before each read and each write)."""
        outcomes: dict[int, tuple[Outcome, PartitionState]] = {}
        if partitions is None:
            partitions = self.topics.partition_numbers(topic)
        numbers = [p for p in partitions if p < config.partitions]
        for start in range(0, len(numbers), READ_CHUNK):
            if self.stopping():
                return None
            states = self.topics.read_partition_states(topic, numbers[start : start + READ_CHUNK])
            chosen: list[tuple[int, PartitionState, int, Decide, Choice]] = []
            for partition, (state, version) in states.items():
                decide = decide_of(partition)
                choice = decide(state)
                if choice is None:
                    outcomes[partition] = ("unchanged", state)
                else:
                    chosen.append((partition, state, version, decide, choice))
            for first in range(0, len(chosen), WRITE_BATCH):
                if self.stopping():
                    return None
                outcomes.update(self._write_batch(topic, chosen[first : first + WRITE_BATCH]))
        return outcomes

    def _write_batch(
        self, topic: str, chosen: list[tuple[int, PartitionState, int, Decide, Choice]]
    ) -> dict[int, tuple[Outcome, PartitionState]]:
        """Write the choices of `chosen` (partition, its state and version read, its decide
        and its choice) in one transaction, or, when it is refused, one by one (_settle_one):
        what came of each partition, and the state it is left in."""
        writes = [(partition, choice.state, version) for partition, _, version, _, choice in chosen]
        if self.topics.write_partition_states(topic, writes, self.epoch) is None:
            return {
                partition: self._settle_one(topic, partition, state, version, decide)
                for partition, state, version, decide, _ in chosen
            }
        for partition, state, _, _, choice in chosen:
            self._report(topic, partition, state, choice)
        return {partition: ("written", choice.state) for partition, *_, choice in chosen}

    def reassign(self) -> bool:
        """Take the next step of every reassignment under way (broker.replication.reassign);
        whether any waits for its new replicas (to be looked at again REASSIGN_CHECK_S
        later). RegistryUnavailable and ControllerMoved as they come."""
        pending = self.reassignments.read()
        waiting = self.counters.reassignments_waiting
        for key in [key for key in waiting if key not in pending]:
            del waiting[key]
        if not pending:
            return False
        brokers, alive = self.brokers.read(), self.brokers.epochs()
        for _, reassignment in sorted(pending.items()):
            if self.stopping():
                return True
            self._reassign_one(reassignment, brokers, alive)
        return bool(waiting)

    def _reassign_one(
        self,
        reassignment: Reassignment,
        brokers: dict[int, BrokerRegistration],
        alive: Mapping[int, int],
    ) -> None:
        """Take the steps of one reassignment that can be taken now (`brokers`: those up,
        `alive`: their broker epochs)."""
        counters = self.counters
        topic, partition = reassignment.topic, reassignment.partition
        key = (topic, partition)
        for _ in range(WRITE_ATTEMPTS + 2):  # an expand, then a finish, each maybe raced
            try:
                config, version, (state, state_version) = self.reassignments.reassignment_view(
                    topic, partition
                )
            except UnknownTopicOrPartition as error:
                log.warning("%s-%d: reassignment dropped: %s", topic, partition, error)
                with contextlib.suppress(UnknownTopicOrPartition):
                    self.reassignments.cancel_reassignment(topic, partition)
                counters.reassignments_waiting.pop(key, None)
                return
            current = config.replicas[partition]
            step = next_step(reassignment.replicas, current, state, alive, self.epoch)
            if step.kind == "wait":
                missing = step.waiting_for
                if counters.reassignments_waiting.get(key) != missing:
                    down = sorted(b for b in missing if b not in alive)
                    why = why_waiting([b for b in missing if b in alive], state.leader, brokers)
                    log.log(
                        logging.WARNING if why else logging.INFO,
                        "%s-%d: reassignment to %s waits for %s to join the ISR %s%s%s",
                        topic,
                        partition,
                        list(reassignment.replicas),
                        list(missing) or "a leader",
                        list(state.isr),
                        f" (broker(s) {down} not up)" if down else "",
                        "".join(f"; it cannot end while {reason}" for reason in why),
                    )
                counters.reassignments_waiting[key] = missing
                return
            final = None if step.state is None else (step.state, state_version)
            try:
                self.reassignments.write_reassignment_step(
                    reassignment, config, version, step.replicas, self.epoch, final
                )
            except PartitionStateChanged:
                continue  # read again
            except UnknownTopicOrPartition:
                continue  # gone: the next read drops it
            except (ControllerMoved, RegistryUnavailable):
                raise
            except PylogError as error:  # this one only: the others and the rounds go on
                log.error("%s-%d: reassignment step refused: %s", topic, partition, error)
                counters.reassignments_waiting[key] = ()
                return
            counters.reassign_steps += 1
            if step.kind == "expand":
                log.info(
                    "%s-%d: reassignment to %s: replicas %s -> %s, new ones copying",
                    topic,
                    partition,
                    list(reassignment.replicas),
                    list(current),
                    list(step.replicas),
                )
                continue
            assert step.state is not None
            counters.reassignments_done += 1
            counters.reassignments_waiting.pop(key, None)
            log.info(
                "%s-%d: reassigned: replicas %s -> %s, leader %d -> %d, leader epoch %d, ISR %s",
                topic,
                partition,
                list(current),
                list(step.replicas),
                state.leader,
                step.state.leader,
                step.state.leader_epoch,
                list(step.state.isr),
            )
            return
        log.warning(
            "%s-%d: its configuration or state changed under each attempt at its reassignment; "
            "tried again shortly",
            topic,
            partition,
        )
        counters.reassignments_waiting[key] = ()

    def _settle_one(
        self, topic: str, partition: int, state: PartitionState, version: int, decide: Decide
    ) -> tuple[Outcome, PartitionState]:
        """Write what `decide` chooses for the partition, conditionally; on PartitionStateChanged
        read the node again and decide again, WRITE_ATTEMPTS times at most. Returns what came
        of it and the state the partition is left in."""
        for _ in range(WRITE_ATTEMPTS):
            choice = decide(state)
            if choice is None:
                return "unchanged", state
            try:
                self.topics.write_partition_state(
                    topic, partition, choice.state, version, controller_epoch=self.epoch
                )
            except PartitionStateChanged:
                try:
                    state, version = self.topics.partition_state(topic, partition)
                except UnknownTopicOrPartition:
                    return "unchanged", state  # deleted meanwhile
                continue
            except UnknownTopicOrPartition:
                return "unchanged", state  # deleted meanwhile
            self._report(topic, partition, state, choice)
            return "written", choice.state
        log.warning(
            "%s-%d: its state changed under each of %d attempts to write it; tried again in the "
            "next round",
            topic,
            partition,
            WRITE_ATTEMPTS,
        )
        return "left", state

    def _report(self, topic: str, partition: int, old: PartitionState, choice: Choice) -> None:
        """Log and count a state written."""
        new, counters = choice.state, self.counters
        if choice.kind == "leader":
            counters.leaders_chosen += 1
            log.info(
                "%s-%d: leader %d -> %d, leader epoch %d, ISR %s (controller epoch %d)",
                topic,
                partition,
                old.leader,
                new.leader,
                new.leader_epoch,
                list(new.isr),
                self.epoch,
            )
        elif choice.kind == "unclean":
            counters.unclean_elections += 1
            log.warning(
                "%s-%d: UNCLEAN leader election: no replica of the ISR %s is alive, so broker "
                "%d, outside it, leads (leader epoch %d): what only the ISR held is lost",
                topic,
                partition,
                list(old.isr),
                new.leader,
                new.leader_epoch,
            )
        elif choice.kind == "offline":
            log.error(
                "%s-%d: no replica of the ISR %s is alive (leader %d gone): the partition has "
                "no leader until one of them returns (unclean_leader_election is off)",
                topic,
                partition,
                list(old.isr),
                old.leader,
            )
        elif choice.kind == "isr":
            gone = sorted(set(old.isr) - set(new.isr))
            counters.isr_removals += 1
            log.info(
                "%s-%d: broker(s) %s, dead or no longer replicas, leave the ISR, now %s",
                topic,
                partition,
                gone,
                list(new.isr),
            )
        else:
            counters.preferred_moves += 1
            log.info(
                "%s-%d: leadership back to the preferred leader %d (from %d), leader epoch %d",
                topic,
                partition,
                new.leader,
                old.leader,
                new.leader_epoch,
            )
