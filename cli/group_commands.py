"""`pylogctl group`: consumer groups."""

from __future__ import annotations

import signal
import sys

import click

from broker.client.group import GroupConsumer, Reset
from broker.errors import CorruptSegment
from broker.registry import DEFAULT_CHROOT, Registry, partition_name
from cli.common import (
    EXIT_CORRUPT,
    F,
    broker_errors,
    output_options,
    print_messages,
    skip_corrupt_option,
)


@click.group()
def group() -> None:
    """Consumer groups: consume as a member, describe owners and committed offsets."""


def zookeeper_options(command: F) -> F:
    """--zookeeper (or $PYLOG_ZOOKEEPER) and --chroot: where the group registry is."""
    command = click.option(
        "--chroot",
        default=DEFAULT_CHROOT,
        show_default=True,
        help="The registry's ZooKeeper chroot (pylogd's zookeeper.chroot).",
    )(command)
    return click.option(
        "--zookeeper",
        envvar="PYLOG_ZOOKEEPER",
        required=True,
        help="The ZooKeeper ensemble, HOST:PORT[,HOST:PORT...] (env PYLOG_ZOOKEEPER); with "
        "the private ZooKeeper of `scripts/start`, see data/zookeeper/zoo.cfg for its port.",
    )(command)


@group.command("consume")
@click.argument("group_name", metavar="GROUP")
@click.argument("topics", metavar="TOPIC...", nargs=-1, required=True)
@click.option("--consumer-id", help="This member's id (default: host-pid-random).")
@click.option(
    "--reset",
    type=click.Choice(["earliest", "latest"]),
    default="earliest",
    show_default=True,
    help="Where to start a partition that the group has no committed offset for.",
)
@click.option(
    "--commit-interval",
    type=click.FloatRange(min=0, min_open=True),
    default=1.0,
    show_default=True,
    help="Seconds between auto-commits (also at rebalances and on exit).",
)
@skip_corrupt_option
@output_options
@zookeeper_options
def group_consume(
    group_name: str,
    topics: tuple[str, ...],
    consumer_id: str | None,
    reset: Reset,
    commit_interval: float,
    skip_corrupt: bool,
    max_messages: int | None,
    output: str,
    zookeeper: str,
    chroot: str,
) -> None:
    """Join GROUP for TOPIC... and print the messages of the partitions this member is given,
    until SIGINT / SIGTERM (or --max-messages); commits what it printed and leaves the group
    on exit (with --max-messages N, exactly N messages are committed)."""
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(0))
    with (
        broker_errors(zookeeper, "ZooKeeper"),
        GroupConsumer(
            zookeeper,
            group_name,
            topics,
            chroot=chroot,
            consumer_id=consumer_id,
            reset=reset,
            auto_commit_interval_s=commit_interval,
            skip_corrupt=skip_corrupt,
        ) as consumer,
    ):
        try:
            print_messages(consumer, output, max_messages)
        except CorruptSegment as error:
            click.echo(f"pylogctl: {error} (--skip-corrupt reads past it)", err=True)
            sys.exit(EXIT_CORRUPT)
        consumer.commit()  # the last message printed is processed too


@group.command("describe")
@click.argument("group_name", metavar="GROUP")
@click.argument("topic_name", metavar="TOPIC")
@zookeeper_options
def group_describe(group_name: str, topic_name: str, zookeeper: str, chroot: str) -> None:
    """Print the members of GROUP, and for each partition of TOPIC its owner and committed
    offset (a byte position; "-" when none)."""
    with broker_errors(zookeeper, "ZooKeeper"), Registry(zookeeper, chroot) as registry:
        members = registry.consumers(group_name)
        config = registry.topic_config(topic_name)
        owners = registry.partition_owners(group_name, topic_name)
        click.echo(f"group {group_name}: {len(members)} members")
        for member, subscribed in sorted(members.items()):
            click.echo(f"member {member} topics {','.join(subscribed)}")
        for number, holder in enumerate(config.brokers):
            name = partition_name(holder, number)
            committed = registry.committed_offset(group_name, topic_name, name)
            click.echo(
                f"partition {number} ({name}) owner {owners.get(name, '-')} "
                f"committed {'-' if committed is None else committed}"
            )
