"""`pylogctl topic add-partitions`: more partitions for a topic (`kafka-topics --alter
--partitions`, `rpk topic add-partitions`).

The new partitions are placed over the brokers up now, racks included, as a new topic's would
be (broker.placement): their state nodes written to ZooKeeper first, then the topic's node,
which publishes them (broker.registry.topics; docs/registry.md, "Writing a topic"); every
broker watches the node and opens those it holds. Producers and group members pick them up
(docs/replication.md, "Placement")."""

from __future__ import annotations

import json
import time
from typing import Final

import click

from broker.client import Admin
from broker.errors import InvalidTopic
from broker.protocol import ErrorCode
from broker.registry import MAX_PARTITIONS, TopicConfig
from cli.common import CLI_RETRIES, broker_errors, client_keys, usage_error
from cli.group_commands import admin_options, fail, open_registry

SERVED_WITHIN_S: Final = 30.0
"""How long the command waits for the new partitions to be served."""


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
        _wait_served(admin, name, before, count)
    _say(name, grown, before, as_json)


def _wait_served(admin: Admin, topic: str, before: int, count: int) -> None:
    """Until METADATA shows the new partitions served (exit 1 after SERVED_WITHIN_S: they are
    in ZooKeeper all the same, and served once their brokers are up)."""
    deadline = time.monotonic() + SERVED_WITHIN_S
    while True:
        partitions = admin.metadata([topic]).topics[0].partitions
        waiting = [
            p.partition
            for p in partitions[before:]
            if p.error_code != ErrorCode.NONE or p.broker_id < 0
        ]
        if len(partitions) == count and not waiting:
            return
        if time.monotonic() > deadline:
            fail(
                f"topic {topic} has {count} partitions in ZooKeeper, but partitions "
                f"{waiting or list(range(len(partitions), count))} are not served after "
                f"{SERVED_WITHIN_S:.0f} s: they will be once their brokers are up "
                "(pylogctl cluster health)"
            )
        time.sleep(0.1)


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
