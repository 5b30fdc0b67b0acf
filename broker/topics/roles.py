"""Role dispatch on the supervisor's loop (broker.topics; docs/replication.md): the state nodes
of the replicated partitions held here, watched, each change sent to the worker holding the
partition as its role (control.PartitionRole); the ISR changes its leaders ask for, written to
the state node conditionally on its version; and the leaders' lease (broker.replication.lease),
renewed and sent to every worker.
"""

from __future__ import annotations

import dataclasses
import logging
from collections import Counter
from typing import TYPE_CHECKING

from broker import control
from broker.config import BrokerConfig, replica_setting
from broker.errors import PylogError
from broker.registry import PartitionState, PartitionStateChanged, TopicConfig
from broker.registry_calls import RegistryCalls
from broker.replication.lease import Lease, LeaseKeeper

if TYPE_CHECKING:
    from broker.topics import Topics

log = logging.getLogger("pylog.supervisor")


class Roles:
    """The roles of the replicated partitions of `view` held here, and the lease."""

    def __init__(self, view: Topics, config: BrokerConfig, calls: RegistryCalls) -> None:
        self.view = view
        self.me = config.broker_id
        self.calls = calls
        self.states: dict[tuple[str, int], tuple[PartitionState, int]] = {}
        """The state node (leader, epoch, ISR) and its version of each replicated partition
        held here, as its watch last said."""
        self.state_watches: dict[str, object] = {}
        """The replicated topics held here whose partitions' state nodes are watched, each
        with its watches' token."""
        self._watched: dict[str, int] = {}
        """How many partitions of each topic of state_watches are watched (partitions added
        to a topic are watched as they come)."""
        self.isr_changes: Counter[str] = Counter()
        """ISR changes written as a leader, by kind: shrink, expand (broker.metrics)."""
        self.leases = LeaseKeeper(
            calls, self.me, config.zookeeper_session_timeout_ms / 1000, self.send_lease
        )
        """The leaders' lease, renewed from ZooKeeper and sent to every worker."""

    def lease_command(self) -> list[bytes]:
        """The last lease renewed, as the command that gives it to a worker."""
        return _lease_command(self.leases.lease)

    def forget(self, topic: str) -> None:
        """A topic dropped here: its state watches end, its states are forgotten."""
        self.state_watches.pop(topic, None)
        self._watched.pop(topic, None)
        for key in [key for key in self.states if key[0] == topic]:
            del self.states[key]

    def watch_states(self, topic: str) -> None:
        """Watch the state nodes of the partitions of `topic`, if it is replicated (every
        partition's: METADATA names their leaders), those of partitions added since too: each
        change of a partition held here goes to the worker holding it as its role
        (_send_role)."""
        config = self.view.configs.get(topic)
        if config is None or not replicated(config):
            return
        first = self._watched.get(topic, 0)
        if first >= config.partitions:
            return
        registry = self.calls.registry
        assert registry is not None
        token = self.state_watches.setdefault(topic, object())
        self._watched[topic] = config.partitions
        calls = self.calls
        for number in range(first, config.partitions):

            def changed(state: PartitionState | None, version: int, number: int = number) -> bool:
                calls.report(lambda: self._on_state(topic, number, token, state, version))
                return self.state_watches.get(topic) is token

            registry.topics.watch_partition_state(topic, number, changed)

    def _on_state(
        self, topic: str, number: int, token: object, state: PartitionState | None, version: int
    ) -> None:
        if self.state_watches.get(topic) is not token:
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
        self.send_role(topic, number)

    def send_role(self, topic: str, number: int) -> None:
        """Tell the worker holding a replicated partition its role, from the partition's
        state node: lead, follow the leader at its endpoint, or neither (no leader, or the
        leader's broker not registered yet: sent again when it is)."""
        known = self.states.get((topic, number))
        config = self.view.configs.get(topic)
        held = self.view.held.get(topic)
        if known is None or config is None or held is None or number not in held.served:
            return  # sent once all of them are known
        w = held.workers[number]
        state = known[0]
        leader = self.view.live_brokers.get(state.leader)
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
        handle = self.view.pool.workers[w]
        if handle.connected:
            self.view.pool.send(handle, control.encode(role))

    def under_replicated(self) -> int:
        """How many replicated partitions led here have an ISR smaller than their replicas
        (read by the metrics thread: a copy of the states is taken first)."""
        me, configs = self.me, self.view.configs
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
            lambda registry: registry.topics.write_partition_state(topic, number, changed, version),
            written,
            refused,
        )

    def send_lease(self, lease: Lease) -> None:
        """Give every worker the lease just renewed (broker.replication.lease)."""
        command = _lease_command(lease)
        for worker in self.view.pool.workers:
            if worker.connected:
                self.view.pool.send(worker, command)


def _lease_command(lease: Lease) -> list[bytes]:
    return control.encode(control.RenewLease(lease.until, lease.broker_epoch))


def replicated(config: TopicConfig) -> bool:
    """Whether a partition of the topic has, or had when created, more than one replica: its
    brokers then follow its partitions' state nodes."""
    return replica_setting(config.settings, "replication_factor") > 1 or any(
        len(replicas) > 1 for replicas in config.replicas
    )
