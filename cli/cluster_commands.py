"""`pylogctl cluster health`: is the cluster healthy, and if not, what is wrong.

What it reads is the registry in ZooKeeper (docs/registry.md), as the controller does: the
brokers registered, the controller, every topic's replicas and each partition's state node
(leader and in-sync replicas); and each topic's min_insync_replicas as the brokers have it
(DESCRIBE_CONFIG, which knows their defaults).
"""

from __future__ import annotations

import datetime
import json
import sys
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from typing import Any

import click

from broker.client import Admin
from broker.errors import PylogError, Unavailable
from broker.registry import NO_LEADER, Registry, TopicConfig
from cli.common import (
    CLI_RETRIES,
    EXIT_BROKER,
    client_keys,
    json_option,
    until_interrupted,
    watch_options,
)
from cli.group_commands import open_registry, zookeeper_options


@dataclass(frozen=True)
class PartitionProblem:
    """A partition that is leaderless, under-replicated or under its min ISR."""

    topic: str
    partition: int
    leader: int
    replicas: tuple[int, ...]
    isr: tuple[int, ...]
    min_insync_replicas: int | None

    def text(self) -> str:
        ids = ",".join
        line = f"  {self.topic}-{self.partition} leader {self.leader} "
        line += f"replicas {ids(map(str, self.replicas))} isr {ids(map(str, self.isr)) or '-'}"
        if self.min_insync_replicas is not None:
            line += f" min_insync_replicas {self.min_insync_replicas}"
        return line


@dataclass(frozen=True)
class Health:
    """What `check` found. `error` is set, and nothing else known, when the registry could
    not be read."""

    zookeeper: str
    chroot: str
    controller: int | None = None
    controller_epoch: int | None = None
    brokers_up: tuple[int, ...] = ()
    brokers_down: tuple[int, ...] = ()
    leaderless: tuple[PartitionProblem, ...] = ()
    under_replicated: tuple[PartitionProblem, ...] = ()
    under_min_isr: tuple[PartitionProblem, ...] = ()
    unknown_min_isr: tuple[str, ...] = ()
    """Topics whose min_insync_replicas no broker could say (none reachable)."""
    error: str | None = None

    @property
    def healthy(self) -> bool:
        return (
            self.error is None
            and self.controller is not None
            and not self.brokers_down
            and not self.leaderless
            and not self.under_replicated
            and not self.under_min_isr
        )


def check(registry: Registry, admin: Admin, zookeeper: str, chroot: str) -> Health:
    """The cluster's health as the registry has it now (and the brokers' min ISR settings)."""
    try:
        up = set(registry.brokers.read())
        controller = registry.controller.current()
        configs = registry.topics.topic_configs()
        states = {topic: registry.topics.partition_states(topic) for topic in configs}
    except PylogError as error:
        return Health(zookeeper, chroot, error=f"the registry could not be read: {error}")
    holding = {b for config in configs.values() for replicas in config.replicas for b in replicas}
    leaderless: list[PartitionProblem] = []
    under_replicated: list[PartitionProblem] = []
    under_min_isr: list[PartitionProblem] = []
    min_isrs = _min_insync_replicas(admin, configs)
    for topic, config in sorted(configs.items()):
        min_isr = min_isrs.get(topic)
        for p, replicas in enumerate(config.replicas):
            if p in states[topic]:
                state = states[topic][p][0]
                leader, isr = state.leader, tuple(state.isr)
            else:  # a node written before replication: its one replica leads, when up
                leader = replicas[0] if replicas[0] in up else NO_LEADER
                isr = (leader,) if leader != NO_LEADER else ()
            problem = PartitionProblem(topic, p, leader, tuple(replicas), isr, min_isr)
            if leader == NO_LEADER or leader not in up:
                leaderless.append(problem)
            if len(isr) < len(replicas):
                under_replicated.append(problem)
            if min_isr is not None and len(isr) < min_isr:
                under_min_isr.append(problem)
    return Health(
        zookeeper,
        chroot,
        controller=None if controller is None else controller.broker_id,
        controller_epoch=None if controller is None else controller.epoch,
        brokers_up=tuple(sorted(up)),
        brokers_down=tuple(sorted(holding - up)),
        leaderless=tuple(leaderless),
        under_replicated=tuple(under_replicated),
        under_min_isr=tuple(under_min_isr),
        unknown_min_isr=tuple(sorted(set(configs) - set(min_isrs))),
    )


def _min_insync_replicas(admin: Admin, configs: dict[str, TopicConfig]) -> dict[str, int]:
    """Each topic's min_insync_replicas: its own setting, else the brokers' default as one of
    them says (DESCRIBE_CONFIG). Left out: topics no broker could say it for (once one is
    unreachable, no other is asked: each would wait --timeout) or deleted meanwhile."""
    found: dict[str, int] = {}
    reachable = True
    for topic, config in configs.items():
        own = config.settings.get("min_insync_replicas")
        if own is not None:
            found[topic] = int(own)
            continue
        if not reachable:
            continue
        try:
            entries = admin.topic_config(topic)
        except Unavailable:
            reachable = False
            continue
        except PylogError:  # the topic deleted since the registry was read
            continue
        for entry in entries:
            if entry.key == "min_insync_replicas":
                found[topic] = int(entry.value)
    return found


def report(health: Health) -> list[str]:
    """The lines `cluster health` prints for `health`."""
    lines = [f"healthy: {'yes' if health.healthy else 'no'}"]
    lines.append(f"zookeeper: {health.zookeeper} chroot {health.chroot}")
    if health.error is not None:
        return [*lines, f"error: {health.error}"]
    if health.controller is None:
        lines.append("controller: none (no broker is the controller)")
    else:
        lines.append(f"controller: broker {health.controller} epoch {health.controller_epoch}")
    up = ",".join(map(str, health.brokers_up)) or "-"
    down = ",".join(map(str, health.brokers_down)) or "-"
    lines.append(f"brokers up: {up}")
    lines.append(f"brokers down: {down}")
    for name, problems in (
        ("leaderless partitions", health.leaderless),
        ("under-replicated partitions", health.under_replicated),
        ("under min ISR partitions", health.under_min_isr),
    ):
        lines.append(f"{name}: {len(problems)}")
        lines.extend(problem.text() for problem in problems)
    if health.unknown_min_isr:
        topics = ", ".join(health.unknown_min_isr)
        lines.append(f"min_insync_replicas unknown (no broker answered): {topics}")
    return lines


def json_record(health: Health) -> dict[str, Any]:
    fields = asdict(health)
    fields["healthy"] = health.healthy
    return fields


@click.group()
def cluster() -> None:
    """The cluster as a whole."""


@cluster.command("health")
@json_option("One JSON object a report.")
@watch_options(
    "Check again every --interval seconds and print the report each time it changes, until "
    "Ctrl-C (exit 0)."
)
@zookeeper_options
def health(
    as_json: bool,
    watch: bool,
    interval: float,
    zookeeper: str | None,
    chroot: str | None,
    broker: str,
    timeout: float,
) -> None:
    """Say whether the cluster is healthy, and if not, what is wrong: no controller, brokers
    down (holding replicas but not registered), leaderless partitions (no leader, or its
    broker down), under-replicated partitions (fewer in-sync replicas than replicas) and
    partitions under their min_insync_replicas (producers at ack=all are refused there).
    Exit 0 when healthy, 1 when not (for scripts and monitoring checks).

    \b
    Example:
      $ pylogctl cluster health --broker 127.0.0.1:9092
      healthy: no
      zookeeper: 127.0.0.1:2181 chroot /pylog
      controller: broker 1 epoch 3
      brokers up: 1,2
      brokers down: 3
      leaderless partitions: 0
      under-replicated partitions: 1
        clicks-0 leader 1 replicas 1,2,3 isr 1,2 min_insync_replicas 2
      under min ISR partitions: 0
    """
    with (
        open_registry(zookeeper, chroot, broker, timeout) as registry,
        Admin(broker, timeout_s=timeout, retries=CLI_RETRIES, keys=client_keys()) as admin,
    ):
        address = (registry.session.connect_string, registry.session.chroot)
        if watch:
            with until_interrupted():
                _print_changes(
                    (check(registry, admin, *address) for _ in _every(interval)), as_json
                )
            return
        if not _print_changes(iter([check(registry, admin, *address)]), as_json):
            sys.exit(EXIT_BROKER)


def _every(interval: float) -> Iterator[None]:
    """Now, then every `interval` seconds, for ever."""
    while True:
        yield
        time.sleep(interval)


def _print_changes(checks: Iterator[Health], as_json: bool) -> bool:
    """Print each report that differs from the one before (the first always; with several,
    each after a line with the time); whether the last was healthy."""
    last: Health | None = None
    for found in checks:
        if found == last:
            continue
        now = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
        if as_json:
            click.echo(json.dumps({**json_record(found), "time": now}))
        else:
            if last is not None:
                click.echo(f"--- {now}")
            for line in report(found):
                click.echo(line)
        last = found
    return last is not None and last.healthy
