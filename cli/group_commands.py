"""`pylogctl group`: consumer groups: consume as a member; list, describe (lag), reset and
delete them. The groups live in ZooKeeper (docs/registry.md); lag and reset also ask the
brokers holding the partitions, at the endpoints they register there."""

from __future__ import annotations

import contextlib
import json
import signal
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict
from typing import Any, NoReturn

import click

from broker.client import Cluster
from broker.client.admin import ZooKeeperAddress, zookeeper_of
from broker.client.coordinator import GroupCalls
from broker.client.group import GroupConsumer
from broker.client.group_fetch import Reset
from broker.client.lag import COUNT_BYTES, GroupLag, HolderUnavailable
from broker.errors import (
    BrokerGroupNotEmpty,
    BrokerUnknownGroup,
    CorruptSegment,
    UnknownTopicOrPartition,
)
from broker.groups.assignors import TopicPartition
from broker.groups.lag import GroupReader, ResetStep, Target
from broker.registry import DEFAULT_CHROOT, Registry
from broker.registry.brokers import Brokers
from broker.registry.groups import GroupNotEmpty
from broker.registry.nodes import check_name
from broker.security import KeyFileError, ZooKeeperAuth
from cli.common import (
    CLI_RETRIES,
    EXIT_BROKER,
    EXIT_CORRUPT,
    ZOOKEEPER_AUTH_META,
    F,
    broker_errors,
    broker_options,
    client_id_option,
    client_keys,
    json_option,
    output_options,
    position,
    print_messages,
    say_none,
    skip_corrupt_option,
    until_interrupted,
    usage_error,
    watch_options,
)


@click.group()
def group() -> None:
    """Consumer groups: consume as a member; list, describe with their lag, reset and delete
    them."""


"""Where --zookeeper-auth-file leaves the identity read (click's Context.meta)."""


def _read_zookeeper_auth(ctx: click.Context, param: click.Parameter, path: str | None) -> None:
    """--zookeeper-auth-file read at once: a file that cannot be used is one line, exit 2."""
    if path is not None:
        try:
            ctx.meta[ZOOKEEPER_AUTH_META] = ZooKeeperAuth.load(path)
        except KeyFileError as error:
            usage_error(f"--zookeeper-auth-file: {error}")


def zookeeper_auth() -> ZooKeeperAuth | None:
    """The ZooKeeper identity --zookeeper-auth-file gave, or None."""
    auth: ZooKeeperAuth | None = click.get_current_context().meta.get(ZOOKEEPER_AUTH_META)
    return auth


def zookeeper_options(command: F) -> F:
    """--zookeeper (or $PYLOG_ZOOKEEPER), --chroot and --zookeeper-auth-file (or
    $PYLOG_ZOOKEEPER_AUTH_FILE): where the group registry is, by default asked of --broker
    (with --timeout: broker_options; see registry_address), and the identity to present to
    it (zookeeper_auth)."""
    command = click.option(
        "--zookeeper-auth-file",
        envvar="PYLOG_ZOOKEEPER_AUTH_FILE",
        metavar="PATH",
        expose_value=False,
        callback=_read_zookeeper_auth,
        help="A file of one line user:password (mode 0600): the ZooKeeper digest identity to "
        "present to a registry with ACLs (env PYLOG_ZOOKEEPER_AUTH_FILE). A group's nodes "
        "belong to the identity that created them: the brokers' for a group its coordinator "
        "made.",
    )(command)
    command = click.option(
        "--chroot",
        help="The registry's ZooKeeper chroot (pylogd's zookeeper.chroot); default: the "
        f"broker's, or {DEFAULT_CHROOT} with --zookeeper.",
    )(command)
    command = click.option(
        "--zookeeper",
        envvar="PYLOG_ZOOKEEPER",
        help="The ZooKeeper ensemble, HOST:PORT[,HOST:PORT...] (env PYLOG_ZOOKEEPER); default: "
        "the one --broker uses.",
    )(command)
    return broker_options(command)


def registry_address(
    zookeeper: str | None, chroot: str | None, broker: str, timeout: float
) -> ZooKeeperAddress:
    """The ensemble and chroot the group commands use: --zookeeper (and --chroot, default
    /pylog), or else those --broker's cluster uses (DESCRIBE_CLUSTER), --chroot overriding."""
    if zookeeper is not None:
        return ZooKeeperAddress(zookeeper, chroot or DEFAULT_CHROOT)
    with broker_errors(broker):
        found = zookeeper_of(broker, timeout_s=timeout, retries=CLI_RETRIES, keys=client_keys())
    return ZooKeeperAddress(found.connect, chroot or found.chroot)


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
@json_option("--format json.")
@skip_corrupt_option
@output_options
@client_id_option
@broker_options
def group_consume(
    group_name: str,
    topics: tuple[str, ...],
    consumer_id: str | None,
    reset: Reset,
    commit_interval: float,
    as_json: bool,
    skip_corrupt: bool,
    max_messages: int | None,
    output: str,
    client_id: str,
    broker: str,
    timeout: float,
) -> None:
    """Join GROUP for TOPIC... and print the messages of the partitions this member is given,
    until SIGINT / SIGTERM (or --max-messages); commits what it printed and leaves the group
    on exit (with --max-messages N, exactly N messages are committed). The member joins
    through the group's coordinator, found through --broker.

    \b
    Examples:
      pylogctl group consume loaders events                  # until Ctrl-C
      pylogctl group consume loaders events clicks --json --max-messages 100"""
    if as_json:
        output = "json"
    options: dict[str, Any] = {
        "consumer_id": consumer_id,
        "reset": reset,
        "auto_commit_interval_s": commit_interval,
        "skip_corrupt": skip_corrupt,
        "client_id": client_id,
        "timeout_s": timeout,
        "keys": client_keys(),
    }
    with broker_errors(broker), GroupConsumer(broker, group_name, topics, **options) as consumer:
        for signum in (signal.SIGTERM, signal.SIGINT):  # leave quietly, committing: exit 0
            signal.signal(signum, lambda signum, frame: consumer.interrupt())
        try:
            print_messages(consumer, output, max_messages)
        except CorruptSegment as error:
            click.echo(f"pylogctl: {error} (--skip-corrupt reads past it)", err=True)
            sys.exit(EXIT_CORRUPT)
        consumer.commit()  # the last message printed is processed too


def admin_options(command: F) -> F:
    """zookeeper_options and --json, on the commands that administer groups."""
    command = json_option("One JSON object a line.")(command)
    return zookeeper_options(command)


def group_name(ctx: click.Context, param: click.Parameter, name: str) -> str:
    try:
        check_name("group", name)
    except ValueError as error:
        raise click.BadParameter(str(error), ctx, param) from None
    return name


def fail(message: str) -> NoReturn:
    """`pylogctl: message` on stderr, exit 1."""
    click.echo(f"pylogctl: {message}", err=True)
    sys.exit(EXIT_BROKER)


def members_text(members: Sequence[str], what: str = "member") -> str:
    """ "2 members (a, b)", "1 active member (a)", "0 members"."""
    return _count(len(members), what) + (f" ({', '.join(members)})" if members else "")


def table(header: Sequence[str], rows: Sequence[Sequence[object]], none: str = "") -> None:
    """Print aligned columns (None as "-"), the last one unpadded; with no rows and `none`
    given, say so instead (say_none)."""
    if not rows and none:
        say_none(none)
        return
    cells = [list(header)] + [["-" if c is None else str(c) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header) - 1)]
    for row in cells:
        padded = [cell.ljust(width) for cell, width in zip(row, widths, strict=False)]
        click.echo("  ".join([*padded, row[-1]]).rstrip())


@contextlib.contextmanager
def open_registry(
    zookeeper: str | None, chroot: str | None, broker: str, timeout: float
) -> Iterator[Registry]:
    """The registry (registry_address, with --zookeeper-auth-file's identity) for the duration
    of a command, turning failures into one line, exit 1."""
    address = registry_address(zookeeper, chroot, broker, timeout)
    with broker_errors(address.connect, "ZooKeeper"):
        registry = Registry(
            address.connect, address.chroot, request_timeout_s=timeout, auth=zookeeper_auth()
        )
        registry.start(timeout=timeout)
        try:
            yield registry
        finally:
            registry.stop()


@contextlib.contextmanager
def group_reader(
    zookeeper: str | None, chroot: str | None, broker: str, timeout: float
) -> Iterator[GroupReader]:
    """A GroupReader on the registry (open_registry)."""
    with (
        open_registry(zookeeper, chroot, broker, timeout) as registry,
        Cluster((), timeout_s=timeout, retries=CLI_RETRIES, keys=client_keys()) as cluster,
    ):
        yield GroupReader(registry.groups, registry.topics, registry.brokers, cluster, CLI_RETRIES)


@group.command("list")
@admin_options
def group_list(
    zookeeper: str | None, chroot: str | None, broker: str, timeout: float, as_json: bool
) -> None:
    """Print every consumer group: its live members and its topics (those it has committed
    offsets for, or members consuming).

    \b
    Example:
        pylogctl group list --broker 10.0.0.7:9092
        GROUP    MEMBERS  TOPICS
        loaders  2        clicks,events
    """
    with group_reader(zookeeper, chroot, broker, timeout) as reader:
        groups = [
            (name, sorted(reader.groups.group_members(name)), reader.topics(name))
            for name in reader.groups.names()
        ]
    if as_json:
        for name, members, topics in groups:
            click.echo(json.dumps({"group": name, "members": members, "topics": topics}))
        return
    rows = [(name, len(members), ",".join(topics) or "-") for name, members, topics in groups]
    table(("GROUP", "MEMBERS", "TOPICS"), rows, "consumer groups")


@group.command("describe")
@click.argument("group_name", metavar="GROUP", callback=group_name)
@click.argument("topics", metavar="[TOPIC]...", nargs=-1)
@click.option(
    "--count-bytes",
    type=click.IntRange(min=1),
    default=COUNT_BYTES,
    show_default=True,
    help="Count the unread messages of a partition exactly up to this many bytes past the "
    "committed offset; estimate the rest from their average size (shown as ~N).",
)
@watch_options("Print it again every --interval until Ctrl-C.")
@admin_options
def group_describe(
    group_name: str,
    topics: tuple[str, ...],
    count_bytes: int,
    watch: bool,
    interval: float,
    zookeeper: str | None,
    chroot: str | None,
    broker: str,
    timeout: float,
    as_json: bool,
) -> None:
    """Print, for each partition of GROUP's topics (or of TOPIC...), the member owning it, the
    group's committed offset, the high watermark and the lag: in bytes, in messages (counted;
    ~N when estimated past --count-bytes) and in seconds (the age of the next unread message,
    by its producer's timestamp); then a summary line. Offsets are byte positions; "-" is
    unknown, the NOTE column says why.

    \b
    Example:
        pylogctl group describe loaders
        TOPIC   PARTITION  BROKER  OWNER  COMMITTED  HIGH_WATERMARK  LAG_BYTES  LAG_MESSAGES  ...
        events  0          1       a      3500       4200            700        20            ...
        group loaders: 1 member (a), 1 partition of 1 topic, lag 700 bytes, 20 messages, 1.5 s
    """
    with until_interrupted(), group_reader(zookeeper, chroot, broker, timeout) as reader:
        while True:
            lag = reader.describe(group_name, topics, count_bytes)
            if not (topics or lag.topics or lag.members) and (
                group_name not in reader.groups.names()
            ):
                fail(
                    f"no consumer group {group_name!r}: nothing committed, owned or consuming "
                    "(pylogctl group list shows the groups)"
                )
            if watch and not as_json and sys.stdout.isatty():
                click.clear()
            print_lag(lag, as_json)
            if not watch:
                return
            time.sleep(interval)  # the refresh period, not a wait for a condition
            if not as_json and not sys.stdout.isatty():
                click.echo()


def print_lag(lag: GroupLag, as_json: bool) -> None:
    if as_json:
        for p in lag.partitions:
            click.echo(json.dumps({"type": "partition", "group": lag.group, **asdict(p)}))
        summary = {
            "type": "group",
            "group": lag.group,
            "members": {m: list(t) for m, t in sorted(lag.members.items())},
            "topics": lag.topics,
            "partitions": len(lag.partitions),
            "lag_bytes": lag.lag_bytes,
            "lag_messages": lag.lag_messages,
            "lag_messages_estimated": lag.lag_messages_estimated,
            "lag_seconds": lag.lag_seconds,
            "retention_seconds": lag.retention_seconds,
        }
        click.echo(json.dumps(summary))
        return
    table(
        (
            *("TOPIC", "PARTITION", "BROKER", "OWNER", "COMMITTED", "HIGH_WATERMARK"),
            *("LAG_BYTES", "LAG_MESSAGES", "LAG_SECONDS", "RETENTION_S", "NOTE"),
        ),
        [
            (
                *(p.topic, p.partition, p.broker, p.owner, p.committed, p.high_watermark),
                *(p.lag_bytes, _messages(p.lag_messages, p.lag_messages_estimated)),
                *(seconds_text(p.lag_seconds), seconds_text(p.retention_seconds), p.note or ""),
            )
            for p in lag.partitions
        ],
    )
    messages = _messages(lag.lag_messages, lag.lag_messages_estimated)
    retention = lag.retention_seconds
    click.echo(
        f"group {lag.group}: {members_text(sorted(lag.members))}, "
        f"{_count(len(lag.partitions), 'partition')} of {_count(len(lag.topics), 'topic')}, "
        f"lag {lag.lag_bytes} bytes, {messages} messages"
        f"{' (estimated)' if lag.lag_messages_estimated else ''}, "
        f"{seconds_text(lag.lag_seconds) or '-'} s"
        + ("" if retention is None else f"; retention deletes unread data in {retention:.1f} s")
    )


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def _messages(count: int | None, estimated: bool) -> str | None:
    return None if count is None else f"~{count}" if estimated else str(count)


def seconds_text(seconds: float | None) -> str | None:
    """Seconds as the tables show them (to 0.1 s), None as None (printed "-")."""
    return None if seconds is None else f"{seconds:.1f}"


def reset_target(text: str | None, shift_by: int | None) -> Target:
    if (text is None) == (shift_by is None):
        raise click.UsageError("say where to with exactly one of --to and --shift-by")
    if shift_by is not None:
        return ("shift-by", shift_by)
    assert text is not None
    return position(text, "--to")


@group.command("reset")
@click.argument("group_name", metavar="GROUP", callback=group_name)
@click.option("--topic", required=True, help="The topic whose committed offsets to move.")
@click.option(
    "--to",
    "to",
    help="earliest (the log start), latest (the high watermark), an offset (the start of the "
    "message around it), or an ISO time, UTC unless it says otherwise (the first message at "
    "or after it).",
)
@click.option(
    "--shift-by",
    type=int,
    help="Move each committed offset N messages on (negative: back), within the log.",
)
@click.option(
    "--partition",
    "partitions",
    type=click.IntRange(min=0),
    multiple=True,
    help="Only this partition (repeat for more; default every one).",
)
@click.option("--execute", is_flag=True, help="Write the new offsets (default: only print).")
@click.option(
    "--force",
    is_flag=True,
    help="Write even while members consume the topic (each commits its own position over the "
    "reset: for members that are stuck). Not for a group its coordinator keeps: that one "
    "refuses while a member reads the topic.",
)
@admin_options
def group_reset(
    group_name: str,
    topic: str,
    to: str | None,
    shift_by: int | None,
    partitions: tuple[int, ...],
    execute: bool,
    force: bool,
    zookeeper: str | None,
    chroot: str | None,
    broker: str,
    timeout: float,
    as_json: bool,
) -> None:
    """Move GROUP's committed offsets of --topic: print each partition's offset before and
    after, and write them only with --execute. Every new offset is a message boundary; a
    partition without a committed offset gets one (a new group starts there), except with
    --shift-by. Refused while members consume the topic, unless --force.

    \b
    Examples:
        pylogctl group reset loaders --topic events --to earliest
        pylogctl group reset loaders --topic events --to 2026-11-23T01:00 --execute
        pylogctl group reset loaders --topic events --shift-by -100 --partition 0 --execute
    """
    target = reset_target(to, shift_by)
    with group_reader(zookeeper, chroot, broker, timeout) as reader:
        consumers = reader.groups.group_members(group_name)
        active = sorted(m for m, subscribed in consumers.items() if topic in subscribed)
        coordinated = reader.groups.coordinated(group_name)
        if active and execute and (coordinated or not force):
            fail(
                f"group {group_name} has {members_text(active, 'active member')} consuming "
                f"{topic}: stop {'it' if len(active) == 1 else 'them'} first"
                + (
                    " (its coordinator refuses a reset while a member reads the topic)"
                    if coordinated
                    else ", or add --force (a running member commits its own position over "
                    "the reset)"
                )
            )
        try:
            steps = reader.plan_reset(group_name, topic, target, partitions)
        except UnknownTopicOrPartition:
            fail(f"no topic {topic!r} (pylogctl topic list shows the topics)")
        except HolderUnavailable as error:
            fail(f"{error}: nothing was reset (every partition's broker must answer)")
        except ValueError as error:
            raise click.BadParameter(str(error), param_hint="--partition") from None
        if execute and coordinated:
            bootstrap = coordinator_bootstrap(reader.brokers, zookeeper, broker)
            reset_through_coordinator(group_name, steps, bootstrap, timeout)
        elif execute:
            reader.apply_reset(group_name, steps)
    print_reset(group_name, topic, steps, execute, as_json)
    if as_json:
        return
    if not execute:
        if active:
            unless = "" if coordinated else " unless --force"
            click.echo(
                f"group {group_name} has {members_text(active, 'active member')} consuming "
                f"{topic}: --execute will refuse{unless}"
            )
        click.echo("dry run: nothing changed (--execute applies it)")
        return
    applied = sum(step.after is not None for step in steps)
    click.echo(f"group {group_name}: {_count(applied, 'partition')} of {topic} reset")


def coordinator_bootstrap(brokers: Brokers, zookeeper: str | None, broker: str) -> str:
    """Where to find a coordinated group's coordinator: --broker, which named the registry;
    or, the registry given by --zookeeper, the brokers registered in it (--broker's default
    may be another cluster's, or nobody's)."""
    if zookeeper is None:
        return broker
    registered = brokers.read().values()
    if not registered:
        fail("no broker is registered in that ZooKeeper: a coordinated group needs one up")
    return ",".join(f"{b.host}:{b.port}" for b in registered)


def reset_through_coordinator(
    group_name: str, steps: list[ResetStep], broker: str, timeout: float
) -> None:
    """Commit a reset without a member (OFFSET_COMMIT) through the group's coordinator, which
    keeps the group's offsets in memory: written behind it in ZooKeeper, they would not be
    what its members are given."""
    offsets = {
        TopicPartition(step.topic, step.partition): step.after
        for step in steps
        if step.after is not None
    }
    if not offsets:
        return
    with (
        broker_errors(broker),
        GroupCalls(broker, group_name, timeout_s=timeout, keys=client_keys()) as calls,
    ):
        try:
            outcome = calls.commit(offsets)
        except BrokerGroupNotEmpty as error:
            fail(f"the group's coordinator refused the reset: {error}: stop them first")
    refused = sorted(f"{tp.topic}/{tp.partition}" for tp, code in outcome.items() if code)
    if refused:
        fail(f"the group's coordinator refused the reset of {', '.join(refused)}")


def delete_through_coordinator(group_name: str, broker: str, timeout: float) -> bool:
    """Delete a coordinated group through its coordinator; False when it knows no such group.
    GroupNotEmpty while it has members."""
    members: list[str] | None = None
    with (
        broker_errors(broker),
        GroupCalls(broker, group_name, timeout_s=timeout, keys=client_keys()) as calls,
    ):
        try:
            calls.delete()
        except BrokerUnknownGroup:
            return False
        except BrokerGroupNotEmpty as error:
            members = [m.member_id for m in calls.describe().members] or [error.message]
    if members is not None:
        raise GroupNotEmpty(group_name, members)
    return True


def print_reset(
    group_name: str, topic: str, steps: list[ResetStep], execute: bool, as_json: bool
) -> None:
    if as_json:
        for s in steps:
            line = {"group": group_name, "topic": topic, "partition": s.partition}
            line |= {"before": s.before, "after": s.after, "note": s.note}
            click.echo(json.dumps(line | {"applied": execute and s.after is not None}))
        return
    rows = [(s.topic, s.partition, s.before, s.after, s.note or "") for s in steps]
    table(("TOPIC", "PARTITION", "BEFORE", "AFTER", "NOTE"), rows)


@group.command("delete")
@click.argument("group_name", metavar="GROUP", callback=group_name)
@admin_options
def group_delete(
    group_name: str,
    zookeeper: str | None,
    chroot: str | None,
    broker: str,
    timeout: float,
    as_json: bool,
) -> None:
    """Delete GROUP and its committed offsets; refused while it has members. A group a
    coordinator has claimed is deleted through it (DELETE_GROUP: it keeps the group in
    memory), another (pylog-mirror's) in ZooKeeper. A group started again afterwards reads
    from its members' --reset position.

    \b
    Example:
        pylogctl group delete loaders
    """
    with group_reader(zookeeper, chroot, broker, timeout) as reader:
        try:
            if reader.groups.coordinated(group_name):
                bootstrap = coordinator_bootstrap(reader.brokers, zookeeper, broker)
                deleted = delete_through_coordinator(group_name, bootstrap, timeout)
            else:
                deleted = reader.groups.delete_group(group_name)
        except GroupNotEmpty as error:
            fail(
                f"group {group_name} has {members_text(error.members)}: stop "
                f"{'it' if len(error.members) == 1 else 'them'} first (a member that died "
                "leaves when its session ends)"
            )
    if not deleted:
        fail(f"no consumer group {group_name!r} (pylogctl group list shows the groups)")
    if as_json:
        click.echo(json.dumps({"group": group_name, "deleted": True}))
    else:
        click.echo(f"deleted group {group_name}")
