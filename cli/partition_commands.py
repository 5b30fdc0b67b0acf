"""`pylogctl topic add-partitions`: more partitions for a topic (`kafka-topics --alter
--partitions`, `rpk topic add-partitions`).

The new partitions are placed over the brokers up now, racks included, as a new topic's would
be (broker.placement): their state nodes written to ZooKeeper first, then the topic's node,
which publishes them (broker.registry.topics; docs/registry.md, "Writing a topic"); every
broker watches the node and opens those it holds. Producers and group members pick them up
(docs/replication.md, "Placement")."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Final

import click

from broker.client import Admin
from broker.clock import SYSTEM_CLOCK, WaitingClock
from broker.errors import InvalidTopic
from broker.logs import number_spans
from broker.protocol import ErrorCode
from broker.registry import MAX_PARTITIONS, TopicConfig
from cli.common import CLI_RETRIES, broker_errors, client_keys, usage_error
from cli.group_commands import admin_options, fail, open_registry

SERVED_WITHIN_S: Final = 30.0
"""How long the command waits for one more of the new partitions to be served: it gives up
when none came up for that long (their broker down), not while they are coming up (thousands
take a broker some seconds: docs/replication.md, "Adding partitions")."""

POLL_S: Final = 0.5
"""How often it asks for the topic's metadata meanwhile (one reply lists every partition)."""

PROGRESS_S: Final = 5.0
"""How often it says on stderr how many are served, when it waits longer."""


@click.command("add-partitions")
@click.argument("name")
@click.option(
    "--partitions",
    "count",
    type=click.IntRange(min=2, max=MAX_PARTITIONS),
    required=True,
    help=f"How many partitions the topic is to have in all: more than it has, at most "
    f"{MAX_PARTITIONS:,}.",
)
@admin_options
def add_partitions(
    name: str,
    count: int,
    zookeeper: str | None,
    chroot: str | None,
    broker: str,
    timeout: float,
    as_json: bool,
) -> None:
    """Give topic NAME --partitions partitions in all: the new ones are placed over the
    brokers up now (racks apart, leadership round robin, as in a new topic), with the topic's
    replication factor and settings, and served within seconds. Partitions are never taken
    away.

    Keys move: a keyed producer puts a key in partition hash(key) mod the partition count, so
    from now on most keys go to another partition than before, and a key's messages written
    before and after the change are in two partitions, in no order between them. Producers see
    the new partitions within their metadata_max_age_s (60 s by default), group members at once
    (they rebalance).

    \b
    Example:
      pylogctl topic add-partitions clicks --partitions 8"""
    with open_registry(zookeeper, chroot, broker, timeout) as registry:
        try:
            before = registry.topics.topic_config(name).partitions
            grown = registry.topics.add_partitions(name, count)
        except InvalidTopic as error:  # not more than it has, or too few brokers
            usage_error(str(error))
    with (
        broker_errors(broker),
        Admin(broker, timeout_s=timeout, retries=CLI_RETRIES, keys=client_keys()) as admin,
    ):
        _wait_served(lambda: _unserved(admin, name, before, count), count - before)
    _say(name, grown, before, as_json)


def _wait_served(
    unserved: Callable[[], list[int]], count: int, clock: WaitingClock = SYSTEM_CLOCK
) -> None:
    """Until `unserved` (the new partitions METADATA does not show served) is empty, saying how
    many are served every PROGRESS_S; exit 1 once none more came up for SERVED_WITHIN_S (they
    are in ZooKeeper all the same, and served once their brokers are up)."""
    waiting = unserved()
    started = progressed = said = clock.monotonic()
    while waiting:
        now = clock.monotonic()
        if now - progressed > SERVED_WITHIN_S:
            fail(
                f"{len(waiting)} of the {count} new partitions are in ZooKeeper but not served "
                f"after {SERVED_WITHIN_S:.0f} s without one more: partitions "
                f"{number_spans(waiting)}; they will be once their brokers are up (pylogctl "
                "cluster health)"
            )
        if now - said >= PROGRESS_S:
            click.echo(
                f"{count - len(waiting)} of {count} new partitions served after "
                f"{now - started:.0f} s",
                err=True,
            )
            said = now
        clock.sleep(POLL_S)
        before, waiting = len(waiting), unserved()
        if len(waiting) < before:
            progressed = clock.monotonic()


def _unserved(admin: Admin, topic: str, before: int, count: int) -> list[int]:
    """The partitions past `before` of the `count` `topic` is to have that METADATA does not
    show served."""
    partitions = admin.metadata([topic]).topics[0].partitions
    missing = list(range(len(partitions), count))
    return [
        p.partition
        for p in partitions[before:]
        if p.error_code != ErrorCode.NONE or p.broker_id < 0
    ] + missing


def _say(topic: str, config: TopicConfig, before: int, as_json: bool) -> None:
    if as_json:
        record = {
            "topic": topic,
            "partitions_before": before,
            "partitions": config.partitions,
            "added": {str(p): list(config.replicas[p]) for p in range(before, config.partitions)},
        }
        click.echo(json.dumps(record))
        return
    click.echo(f"topic {topic}: {before} -> {config.partitions} partitions")
    for p in range(before, config.partitions):
        replicas = ",".join(map(str, config.replicas[p]))
        click.echo(f"partition {p} replicas {replicas} (leader {config.replicas[p][0]})")
