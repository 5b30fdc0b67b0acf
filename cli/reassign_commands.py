"""`pylogctl topic reassign` and `pylogctl topic elect-preferred`: what an operator asks of the
controller, through the registry (docs/replication.md, "Reassignment" and "Preferred-leader
election"). Both write a node under /admin in ZooKeeper, which the controller acts on, and
follow what it does until it is done."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Mapping, Sequence

import click

from broker.errors import PylogError
from broker.placement import assign_replicas
from broker.registry import (
    BrokerRegistration,
    Reassignment,
    ReassignmentInProgress,
    Registry,
    TopicConfig,
)
from broker.registry.states import PartitionState
from broker.replication.reassign import why_waiting
from cli.common import EXIT_BROKER, until_interrupted, usage_error
from cli.group_commands import admin_options, open_registry

POLL_S = 0.5
"""How often the registry is read while a command follows the controller's work."""


def _broker_list(ctx: click.Context, param: click.Parameter, text: str | None) -> tuple[int, ...]:
    if text is None:
        return ()
    try:
        replicas = tuple(int(part) for part in text.split(","))
    except ValueError:
        raise click.BadParameter(
            f"{text!r} is not broker ids separated by commas", ctx, param
        ) from None
    if any(b < 0 for b in replicas):
        raise click.BadParameter(f"{text!r}: broker ids are >= 0", ctx, param)
    return replicas


def _ids(brokers: Sequence[int]) -> str:
    return ",".join(map(str, brokers)) or "-"


def spread_plan(config: TopicConfig, racks: dict[int, str | None]) -> dict[int, tuple[int, ...]]:
    """The partitions whose replicas the placement of a new topic over the brokers of `racks`
    would choose otherwise (broker.placement.assign_replicas, each partition keeping its
    number of replicas), with those replicas. ValueError when a partition has more replicas
    than there are brokers."""
    plan = {}
    for count in sorted({len(replicas) for replicas in config.replicas}):
        placed = assign_replicas(config.partitions, racks, count)
        for p, replicas in enumerate(config.replicas):
            if len(replicas) == count and placed[p] != replicas:
                plan[p] = placed[p]
    return plan


@click.command("reassign")
@click.argument("name", required=False)
@click.option("--partition", type=click.IntRange(min=0), help="The partition to move.")
@click.option(
    "--replicas",
    callback=_broker_list,
    metavar="ID,ID,...",
    help="The brokers to hold --partition, the first its preferred leader; brokers that are up.",
)
@click.option(
    "--spread",
    is_flag=True,
    help="Move every partition of NAME to where a new topic's would go over the brokers up "
    "now (a broker that joined gets its share), each keeping its number of replicas.",
)
@click.option("--dry-run", is_flag=True, help="Print what would move; move nothing.")
@click.option("--status", is_flag=True, help="Print the reassignments under way (of NAME).")
@click.option(
    "--cancel",
    is_flag=True,
    help="Stop the reassignment of NAME's --partition; the brokers added and not in sync leave "
    "its replicas again.",
)
@click.option("--no-wait", is_flag=True, help="Ask, and return without following it.")
@click.option(
    "--wait-timeout",
    type=click.FloatRange(min=0, min_open=True),
    help="Give up following after this many seconds (exit 1; the reassignment goes on).",
)
@admin_options
def reassign(
    name: str | None,
    partition: int | None,
    replicas: tuple[int, ...],
    spread: bool,
    dry_run: bool,
    status: bool,
    cancel: bool,
    no_wait: bool,
    wait_timeout: float | None,
    as_json: bool,
    zookeeper: str | None,
    chroot: str | None,
    broker: str,
    timeout: float,
) -> None:
    """Move partitions of topic NAME to other brokers, while they go on serving: the brokers
    added copy each partition from its leader; once they are all in sync, leadership moves to
    the first of them if its leader is removed, and the brokers removed delete their copies.
    Nothing acknowledged is lost. The controller does the work; this command asks it (through
    ZooKeeper: --zookeeper-auth-file gives the brokers' identity when the registry has ACLs)
    and prints each partition's progress until it is done (Ctrl-C stops following, not the
    move). A move waits for a broker that is down until it is back, and --status says what
    keeps a broker out of sync where the registry tells (down, or in a curve cluster a key
    the leader refuses). --cancel stops a move; the brokers it added that are not in sync
    leave the replicas again, so the partition is not left under-replicated.

    \b
    Examples:
      $ pylogctl topic reassign clicks --partition 0 --replicas 4,2,3
      clicks-0: replicas 1,2,3 -> 4,2,3
      clicks-0: copying to 4 (replicas 1,2,3,4 isr 1,2,3)
      clicks-0: done: replicas 4,2,3 leader 4 isr 2,3,4
      $ pylogctl topic reassign clicks --spread --dry-run
      clicks-1: replicas 2,3 -> 2,4
      $ pylogctl topic reassign --status
      clicks-0: replicas 1,2,3 -> 4,2,3: copying to 4 (isr 1,2,3)
    """
    if status:
        if partition is not None or replicas or spread or cancel:
            usage_error("--status takes no --partition, --replicas, --spread nor --cancel")
        with open_registry(zookeeper, chroot, broker, timeout) as registry:
            _print_status(registry, name, as_json)
        return
    if name is None:
        usage_error("give the topic NAME (or --status)")
    if cancel:
        if partition is None or replicas or spread:
            usage_error("--cancel takes --partition only")
        with open_registry(zookeeper, chroot, broker, timeout) as registry:
            cancelled = registry.reassignments.read().get((name, partition))
            registry.reassignments.cancel_reassignment(name, partition)
            removed, text = _remove_behind(registry, name, partition, cancelled)
        click.echo(
            json.dumps(
                {"topic": name, "partition": partition, "cancelled": True, "removed": removed}
            )
            if as_json
            else f"{name}-{partition}: reassignment cancelled: {text}"
        )
        return
    if spread == bool(replicas or partition is not None):
        usage_error("give --partition and --replicas, or --spread")
    if not spread and (partition is None or not replicas):
        usage_error("--partition and --replicas go together")
    with open_registry(zookeeper, chroot, broker, timeout) as registry:
        live = registry.brokers.read()
        config = registry.topics.topic_config(name)
        if spread:
            try:
                plan = spread_plan(config, {b: info.rack for b, info in live.items()})
            except ValueError as error:
                usage_error(f"--spread: {error}")
        else:
            assert partition is not None
            plan = {partition: replicas}
        if plan and not dry_run:  # before the plan is printed: one that cannot be asked is not
            registry.acls.check_may_change(registry.reassignments.reassign_path(name, min(plan)))
        for p, wanted in sorted(plan.items()):
            _echo(as_json, name, p, f"replicas {_ids(config.replicas_of(p))} -> {_ids(wanted)}")
        if not plan:
            _echo(as_json, name, None, "nothing to move")
        if dry_run or not plan:
            return
        started = {}
        for p, wanted in sorted(plan.items()):
            try:
                if (
                    registry.reassignments.start_reassignment(name, p, wanted, list(live))
                    is not None
                ):
                    started[p] = wanted
                else:
                    _echo(as_json, name, p, "has those replicas already")
            except ReassignmentInProgress as error:
                if not spread:
                    raise
                _echo(as_json, name, p, f"not moved: {error}")
        if no_wait or not started:
            return
        _follow(registry, name, started, wait_timeout, as_json)


def _remove_behind(
    registry: Registry, topic: str, partition: int, cancelled: Reassignment | None
) -> tuple[list[int], str]:
    """After a cancel: the brokers the move added that are not in the ISR (they may never
    catch up: down, or refused by the leader) leave the partition's replicas again, by a
    reassignment to the others, which are all in sync, so the controller finishes it at its
    next round and the partition is not left under-replicated. Those removed, and what was
    done."""
    config = registry.topics.topic_config(topic)
    replicas = config.replicas_of(partition)
    state = registry.topics.partition_state(topic, partition)[0]
    now = f"replicas {_ids(replicas)} isr {_ids(state.isr)}"
    original = replicas if cancelled is None else cancelled.original
    behind = [b for b in replicas if b not in original and b not in state.isr]
    if not behind:
        return [], f"its replicas stay as they are ({now})"
    keep = tuple(b for b in replicas if b not in behind)
    if out := [b for b in keep if b not in state.isr]:
        return [], (
            f"broker(s) {_ids(behind)}, added and not in sync, stay replicas while "
            f"{_ids(out)} are out of the ISR too ({now}): ask another move to remove them"
        )
    try:
        registry.reassignments.start_reassignment(
            topic, partition, keep, list(registry.brokers.read())
        )
    except PylogError as error:
        return [], f"broker(s) {_ids(behind)}, added and not in sync, stay replicas: {error}"
    return behind, (
        f"broker(s) {_ids(behind)}, added and not in sync, leave its replicas again: "
        f"{_ids(replicas)} -> {_ids(keep)} (the controller's next round)"
    )


def _echo(as_json: bool, topic: str, partition: int | None, text: str, **fields: object) -> None:
    if as_json:
        click.echo(json.dumps({"topic": topic, "partition": partition, "event": text, **fields}))
    else:
        click.echo(f"{topic}-{partition}: {text}" if partition is not None else f"{topic}: {text}")


def _progress(
    reassignment: Reassignment,
    replicas: Sequence[int],
    state: PartitionState,
    brokers: Mapping[int, BrokerRegistration],
) -> tuple[str, list[str]]:
    """What the move is doing, and what keeps it from going on where the registrations of the
    live `brokers` tell (broker.replication.reassign.why_waiting)."""
    added = [b for b in reassignment.replicas if b not in reassignment.original]
    behind = [b for b in reassignment.replicas if b not in state.isr]
    if not set(reassignment.replicas) <= set(replicas):
        return f"adding {_ids(added)}", []
    if behind:
        why = why_waiting(behind, state.leader, brokers)
        text = f"copying to {_ids(behind)} (replicas {_ids(replicas)} isr {_ids(state.isr)})"
        return text + "".join(f": stuck, {reason}" for reason in why), why
    text = f"switching (replicas {_ids(replicas)} isr {_ids(state.isr)} leader {state.leader})"
    return text, []


def _follow(
    registry: Registry,
    topic: str,
    partitions: dict[int, tuple[int, ...]],
    wait_timeout: float | None,
    as_json: bool,
) -> None:
    """Print each partition's progress as it changes until every one is done (exit 1 when
    one ended elsewhere than asked: cancelled, or its topic deleted)."""
    deadline = None if wait_timeout is None else time.monotonic() + wait_timeout
    said: dict[int, str] = {}
    failed = False
    left = set(partitions)
    with until_interrupted():
        while left:
            pending = registry.reassignments.read()
            brokers = registry.brokers.read()
            for p in sorted(left):
                config = registry.topics.topic_config(topic)
                state = registry.topics.partition_state(topic, p)[0]
                reassignment = pending.get((topic, p))
                if reassignment is None:
                    left.discard(p)
                    replicas = config.replicas_of(p)
                    if replicas != partitions[p]:
                        click.echo(
                            f"pylogctl: {topic}-{p}: the reassignment ended without the move "
                            f"(cancelled?): replicas {_ids(replicas)}",
                            err=True,
                        )
                        failed = True
                        continue
                    text = (
                        f"done: replicas {_ids(replicas)} leader {state.leader} "
                        f"isr {_ids(state.isr)}"
                    )
                    _echo(as_json, topic, p, text, done=True)
                    continue
                text, why = _progress(reassignment, config.replicas_of(p), state, brokers)
                if said.get(p) != text:
                    said[p] = text
                    _echo(as_json, topic, p, text, **({"why": why} if why else {}))
            if not left:
                if failed:
                    sys.exit(EXIT_BROKER)
                return
            if deadline is not None and time.monotonic() > deadline:
                click.echo(
                    f"pylogctl: {len(left)} partition(s) not moved after {wait_timeout:g} s: the "
                    "reassignment goes on (pylogctl topic reassign --status follows it)",
                    err=True,
                )
                sys.exit(EXIT_BROKER)
            time.sleep(POLL_S)
        return
    click.echo(  # Ctrl-C
        "pylogctl: stopped following: the reassignment goes on (pylogctl topic reassign "
        "--status follows it)",
        err=True,
    )


def _print_status(registry: Registry, topic: str | None, as_json: bool) -> None:
    pending = registry.reassignments.read()
    brokers = registry.brokers.read()
    shown = 0
    for (name, p), reassignment in sorted(pending.items()):
        if topic is not None and name != topic:
            continue
        shown += 1
        config = registry.topics.topic_config(name)
        state = registry.topics.partition_state(name, p)[0]
        progress, why = _progress(reassignment, config.replicas_of(p), state, brokers)
        moving = f"replicas {_ids(reassignment.original)} -> {_ids(reassignment.replicas)}"
        _echo(as_json, name, p, f"{moving}: {progress}", **({"why": why} if why else {}))
    if not shown and not as_json:
        click.echo("no reassignment under way" + (f" for topic {topic}" if topic else ""))


@click.command("elect-preferred")
@click.argument("names", metavar="[NAME...]", nargs=-1)
@click.option("--no-wait", is_flag=True, help="Ask, and return without waiting for it.")
@admin_options
def elect_preferred(
    names: tuple[str, ...],
    no_wait: bool,
    as_json: bool,
    zookeeper: str | None,
    chroot: str | None,
    broker: str,
    timeout: float,
) -> None:
    """Move each partition's leadership back to its preferred leader (its first replica)
    where that broker is up and in sync, for topics NAME... (default: every topic); the
    controller also does so by itself every broker.leader_rebalance_interval_ms. Then print
    the partitions still led by another broker, and why.

    \b
    Example:
      $ pylogctl topic elect-preferred clicks
      clicks: 4 partitions led by their preferred leader
      clicks-2: led by 3, preferred leader 1 is not in sync (isr 2,3)
    """
    with open_registry(zookeeper, chroot, broker, timeout) as registry:
        registry.reassignments.ask_preferred_election(list(names) or None)
        if no_wait:
            return
        deadline = time.monotonic() + max(timeout, 1.0) * 6
        while registry.reassignments.preferred_election_asked()[0]:
            if time.monotonic() > deadline:
                click.echo(
                    "pylogctl: the controller has not run the election yet (is a broker up?); "
                    "it stays asked",
                    err=True,
                )
                sys.exit(EXIT_BROKER)
            time.sleep(POLL_S / 5)
        live = set(registry.brokers.read())
        configs = registry.topics.topic_configs()
        for name in names or sorted(configs):
            config = configs.get(name)
            if config is None:
                continue
            preferred = 0
            for p, (state, _) in sorted(registry.topics.partition_states(name).items()):
                first = config.replicas_of(p)[0]
                if state.leader == first:
                    preferred += 1
                    continue
                why = (
                    "is down"
                    if first not in live
                    else f"is not in sync (isr {_ids(state.isr)})"
                    if first not in state.isr
                    else "was not moved (try again)"
                )
                _echo(as_json, name, p, f"led by {state.leader}, preferred leader {first} {why}")
            _echo(as_json, name, None, f"{preferred} partitions led by their preferred leader")
