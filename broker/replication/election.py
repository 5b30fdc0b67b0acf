"""The controller's choices for one partition (docs/replication.md, "The controller"), as pure
functions of the partition's state, its replicas and the live brokers with their broker epochs:
no ZooKeeper, no time. broker.replication.acting writes what they choose.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Literal

from broker.registry import NO_LEADER, PartitionState

Kind = Literal["leader", "unclean", "offline", "isr", "preferred"]


@dataclass(frozen=True)
class Choice:
    """A new state for a partition and why: `leader` (a replica of the ISR chosen), `unclean`
    (a replica outside the ISR chosen), `offline` (no replica may lead: leader -1), `isr` (dead
    followers removed from the ISR), `preferred` (leadership moved to the preferred leader)."""

    state: PartitionState
    kind: Kind


def choose_leader(
    state: PartitionState,
    replicas: Iterable[int],
    alive: Mapping[int, int],
    *,
    unclean: bool,
    controller_epoch: int,
) -> Choice | None:
    """What the controller writes for a partition in `state`, with `replicas` (preferred leader
    first) and the live brokers `alive`; None when the state stands.

    - The leader alive: the ISR without the dead brokers and those no longer replicas (a
      reassignment removed them; `isr`), None when there are none.
    - The leader dead or -1: the first replica, in `replicas` order, alive and in the ISR leads,
      with leader epoch + 1 and the ISR's alive members (`leader`); with none, and `unclean`,
      the first alive replica leads, alone in the ISR (`unclean`); with none, leader -1 and
      leader epoch + 1, the ISR left as it was: the replicas that may lead when their brokers
      return (`offline`; None when the leader is -1 already).
    """
    order = tuple(replicas)
    if leads(state, alive):
        isr = tuple(b for b in state.isr if b in alive and (b in order or b == state.leader))
        if isr == state.isr:
            return None
        return Choice(replace(state, isr=isr, controller_epoch=controller_epoch), "isr")
    epoch = state.leader_epoch + 1
    for broker in order:
        if broker in alive and broker in state.isr:
            isr = tuple(b for b in state.isr if b in alive and b in order)
            chosen = PartitionState(broker, epoch, isr, controller_epoch, alive[broker])
            return Choice(chosen, "leader")
    if unclean:
        for broker in order:
            if broker in alive:
                chosen = PartitionState(broker, epoch, (broker,), controller_epoch, alive[broker])
                return Choice(chosen, "unclean")
    if state.leader == NO_LEADER:
        return None
    return Choice(PartitionState(NO_LEADER, epoch, state.isr, controller_epoch), "offline")


def leads(state: PartitionState, alive: Mapping[int, int]) -> bool:
    """Whether the partition's leader is alive in the incarnation that was chosen (its broker
    epoch in `alive`, live broker -> broker epoch, the one the state names): a leader whose
    broker restarted since, even within its ZooKeeper session, does not lead (KIP-380)."""
    return state.leader in alive and alive[state.leader] == state.leader_broker_epoch


def choose_preferred(
    state: PartitionState,
    replicas: Iterable[int],
    alive: Mapping[int, int],
    *,
    controller_epoch: int,
) -> Choice | None:
    """Leadership moved to the preferred leader (the first of `replicas`) with leader epoch + 1,
    the ISR unchanged, when it does not lead and is alive and in the ISR; else None."""
    preferred = next(iter(replicas))
    if state.leader == preferred or preferred not in alive or preferred not in state.isr:
        return None
    epoch = state.leader_epoch + 1
    moved = PartitionState(preferred, epoch, state.isr, controller_epoch, alive[preferred])
    return Choice(moved, "preferred")
