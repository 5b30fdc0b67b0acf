"""Reassignment's steps (docs/replication.md, "Reassignment"): how the controller moves a
partition's replicas to the brokers an operator asked for, without a moment where fewer
replicas than the ISR hold it.

1. **expand**: the partition's replicas become the old ones followed by the wanted ones not
   among them (one conditional write of the topic's configuration). The brokers added open the
   partition and follow its leader, copying from its log start.
2. **wait**: until every wanted replica is in the ISR (the leader takes each in once caught
   up) and the partition has a leader.
3. **finish**, in one ZooKeeper transaction: the replicas become the wanted ones, in their
   order; the state node keeps its leader if wanted, else the first wanted replica, alive and
   in the ISR, leads (leader epoch + 1); the ISR loses the brokers removed; the reassignment's
   node is deleted. The brokers removed delete their copies when they see the configuration.

Each step is decided from what ZooKeeper holds when it is taken (next_step), so a controller
that dies between two steps leaves nothing its successor cannot go on from.

A wait that cannot end says why where it can tell (cannot_follow): in security.mode curve a
wanted broker whose key its leader does not let in, or that does not trust the leader's key,
never joins the ISR; their registrations (public keys, broker.registry.brokers) show it, so the
controller's log and `pylogctl topic reassign --status` name it.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Literal

from broker.registry import NO_LEADER, BrokerRegistration, PartitionState

StepKind = Literal["expand", "wait", "finish"]


@dataclass(frozen=True)
class Step:
    """The next step of a reassignment: `replicas` to write as the partition's (expand,
    finish), the `state` to write with them (finish), and what it waits for (wait)."""

    kind: StepKind
    replicas: tuple[int, ...]
    state: PartitionState | None = None
    waiting_for: tuple[int, ...] = ()
    """The wanted replicas not in the ISR yet (wait; empty while the partition has no
    leader)."""


def next_step(
    wanted: tuple[int, ...],
    current: tuple[int, ...],
    state: PartitionState,
    alive: Mapping[int, int],
    controller_epoch: int,
) -> Step:
    """The step a reassignment of a partition with replicas `current` and state `state` to
    `wanted` takes now, with the live brokers `alive` (broker id -> broker epoch)."""
    if not set(wanted) <= set(current):
        return Step("expand", (*current, *(b for b in wanted if b not in current)))
    missing = tuple(b for b in wanted if b not in state.isr)
    if state.leader == NO_LEADER or missing:
        return Step("wait", current, waiting_for=missing)
    leader, broker_epoch = state.leader, state.leader_broker_epoch
    if leader not in wanted:
        choices = [b for b in wanted if b in alive]  # all in the ISR: none missing
        if not choices:
            return Step("wait", current, waiting_for=wanted)
        leader, broker_epoch = choices[0], alive[choices[0]]
    epoch = state.leader_epoch + (leader != state.leader)
    isr = tuple(b for b in state.isr if b in wanted)
    finished = PartitionState(leader, epoch, isr, controller_epoch, broker_epoch)
    return Step("finish", wanted, finished)


def cannot_follow(
    replica: int, follower: BrokerRegistration, leader_id: int, leader: BrokerRegistration
) -> str | None:
    """Why broker `replica` cannot copy from leader `leader_id`, as their registrations show
    (their security modes and keys), None when nothing in them stops it (it may still be
    copying, or stopped for a reason its own log tells)."""
    if follower.curve_key is None and leader.curve_key is None:
        return None  # plaintext both
    if leader.curve_key is None:
        return f"broker {replica} serves curve and leader {leader_id} plaintext"
    if follower.curve_key is None:
        return f"broker {replica} serves plaintext and leader {leader_id} curve: it has no key"
    if follower.curve_key not in leader.cluster_keys:
        return (
            f"leader {leader_id} refuses broker {replica}'s key {follower.curve_key}: it is "
            "none of the leader's cluster keys (security.key_file, security.broker_keys)"
        )
    if leader.curve_key not in follower.cluster_keys:
        return (
            f"broker {replica} does not take leader {leader_id}'s key {leader.curve_key} for a "
            "broker's: it is none of its cluster keys (security.key_file, security.broker_keys)"
        )
    return None


def why_waiting(
    waiting_for: Collection[int], leader_id: int, brokers: Mapping[int, BrokerRegistration]
) -> list[str]:
    """What keeps the brokers of `waiting_for` out of the ISR of a partition led by
    `leader_id`, as far as the registrations of the live `brokers` tell: down, or unable to
    follow (cannot_follow). Empty when nothing is known to stop them."""
    reasons = []
    leader = brokers.get(leader_id)
    for replica in waiting_for:
        info = brokers.get(replica)
        if info is None:
            reasons.append(f"broker {replica} is down")
        elif leader is not None and (why := cannot_follow(replica, info, leader_id, leader)):
            reasons.append(why)
    return reasons
