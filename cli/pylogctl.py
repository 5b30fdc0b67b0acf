"""`pylogctl`: the admin command line of pylog.

Exit codes: 0 success, 1 the data checked is corrupt, or the broker answered with an error or
could not be reached, 2 bad usage or a path that cannot be used.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import signal
import sys
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import BinaryIO, TypeVar

import click

from broker.client import Ack, Admin, PartitionConsumer, Producer
from broker.client.consumer import Start
from broker.client.group import GroupConsumer, Record, Reset
from broker.errors import BrokerError, CorruptSegment, InvalidMessage, PylogError, Unavailable
from broker.log.message import Message
from broker.log.verify import (
    base_offset_of,
    check_partition,
    dump_segment,
    partition_dirs,
    set_aside_files,
)
from broker.registry import DEFAULT_CHROOT, Registry, partition_name

PREVIEW_BYTES = 40
EXIT_CORRUPT = 1
EXIT_BROKER = 1
DEFAULT_BROKER = "tcp://127.0.0.1:9092"
CLI_RETRIES = 1
"""Retries of a retriable error or a lost reply: one, so an unreachable broker is reported after
about two --timeout periods."""


@click.group()
@click.version_option(package_name="pylog")
def cli() -> None:
    """Administer pylog brokers and their data."""


@cli.group()
def log() -> None:
    """Inspect segment files and partition folders on disk (read-only)."""


def _text(data: bytes | None, limit: int | None = None) -> str | None:
    if data is None:
        return None
    shown = data if limit is None else data[:limit]
    text = shown.decode("utf-8", "backslashreplace")
    return text + "..." if limit is not None and len(data) > limit else text


def _message_record(message: Message) -> dict[str, object]:
    return {
        "offset": message.offset,
        "size": message.size,
        "timestamp_ms": message.timestamp_ms,
        "key": _text(message.key),
        "value_size": len(message.value),
        "value_preview": _text(message.value, PREVIEW_BYTES),
        "checksum_ok": message.checksum_ok,
    }


def _timestamp(ms: int) -> str:
    try:
        return datetime.datetime.fromtimestamp(ms / 1000, datetime.UTC).isoformat(
            timespec="milliseconds"
        )
    except (OverflowError, ValueError, OSError):
        return f"{ms}ms"


@log.command()
@click.argument("segment", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="One JSON object per line.")
def dump(segment: Path, as_json: bool) -> None:
    """Print every message of a SEGMENT file: offset, size, timestamp, key, value preview and
    whether its checksum is right. Offsets come from the file's 20-digit name.

    Exits 1 if any checksum is wrong or the framing breaks (reported with its file position)."""
    corrupt = False
    try:
        for message in dump_segment(segment):
            corrupt |= not message.checksum_ok
            if as_json:
                click.echo(json.dumps(_message_record(message)))
            else:
                key = "-" if message.key is None else repr(_text(message.key))
                click.echo(
                    f"offset {message.offset} size {message.size} "
                    f"time {_timestamp(message.timestamp_ms)} key {key} "
                    f"value {_text(message.value, PREVIEW_BYTES)!r} "
                    f"checksum {'ok' if message.checksum_ok else 'BAD'}"
                )
    except InvalidMessage as error:
        corrupt = True
        offset = base_offset_of(segment) + error.position
        if as_json:
            record = {"error": error.reason, "position": error.position, "offset": offset}
            click.echo(json.dumps(record))
        else:
            click.echo(f"framing broken at byte {error.position} (offset {offset}): {error.reason}")
    except OSError as error:
        raise click.FileError(str(segment), str(error)) from error
    if corrupt:
        sys.exit(EXIT_CORRUPT)


@log.command()
@click.argument("path", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="One JSON object per line.")
def verify(path: Path, as_json: bool) -> None:
    """Check every segment of a partition folder, or of every partition under a log dir:
    framing, checksums, that each segment starts where the one before it ended, and that each
    index written for a segment of its size (a clean close) agrees with the segment.

    Prints a line per segment as it is checked and a summary; exits 1 on any corruption,
    naming the file and byte position. Files set aside as *.bad are listed, not checked."""
    directories = partition_dirs(path)
    if not directories:
        raise click.UsageError(f"{path} holds no segment files, nor folders that do")
    corrupt = segments = messages = 0
    for directory in directories:
        for check in check_partition(directory):
            segments += 1
            messages += check.messages
            corrupt += not check.ok
            if as_json:
                record = {
                    "file": str(check.path),
                    "base_offset": check.base_offset,
                    "size": check.size,
                    "messages": check.messages,
                    "ok": check.ok,
                    "error": check.error,
                    "position": check.position,
                }
                click.echo(json.dumps(record))
            elif check.ok:
                click.echo(f"ok       {check.path} ({check.messages} messages, {check.size} bytes)")
            else:
                click.echo(f"CORRUPT  {check.path} at byte {check.position}: {check.error}")
        for bad in set_aside_files(directory):
            if as_json:
                click.echo(json.dumps({"file": str(bad), "set_aside": True}))
            else:
                click.echo(f"set aside {bad} (left by recovery; not part of the log)")
    summary = {"partitions": len(directories), "segments": segments, "messages": messages}
    if as_json:
        click.echo(json.dumps({"summary": {**summary, "corrupt_segments": corrupt}}))
    else:
        click.echo(
            f"{len(directories)} partitions, {segments} segments, {messages} messages: "
            + (f"{corrupt} corrupt segments" if corrupt else "all ok")
        )
    if corrupt:
        sys.exit(EXIT_CORRUPT)


# -- commands that talk to a broker ------------------------------------------------------------

F = TypeVar("F", bound=Callable[..., object])


def _broker_options(command: F) -> F:
    """--broker (or $PYLOG_BROKER) and --timeout, on every command that talks to a broker."""
    command = click.option(
        "--timeout",
        type=click.FloatRange(min=0, min_open=True),
        default=5.0,
        show_default=True,
        help="Seconds to wait for each reply before giving the broker up as unreachable.",
    )(command)
    return click.option(
        "--broker",
        envvar="PYLOG_BROKER",
        default=DEFAULT_BROKER,
        show_default=True,
        help="The broker's address, tcp://HOST:PORT (env PYLOG_BROKER).",
    )(command)


@contextlib.contextmanager
def _broker_errors(broker: str, what: str = "broker") -> Iterator[None]:
    """Turn what the broker answered, or its silence, into `pylogctl: ...` and exit 1
    (`what` names the server at `broker` in the message: "broker", "ZooKeeper")."""
    try:
        yield
    except BrokerError as error:
        click.echo(f"pylogctl: {error.name}: {error.message}", err=True)
        sys.exit(EXIT_BROKER)
    except Unavailable as error:
        click.echo(f"pylogctl: {what} {broker} unreachable: {error}", err=True)
        sys.exit(EXIT_BROKER)
    except PylogError as error:
        click.echo(f"pylogctl: {type(error).__name__}: {error}", err=True)
        sys.exit(EXIT_BROKER)


def _config_pair(
    ctx: click.Context, param: click.Parameter, pairs: tuple[str, ...]
) -> dict[str, str]:
    config: dict[str, str] = {}
    for pair in pairs:
        key, separator, value = pair.partition("=")
        if not separator or not key:
            raise click.BadParameter(f"{pair!r} is not KEY=VALUE", ctx, param)
        config[key] = value
    return config


@cli.group()
def topic() -> None:
    """Create, list, describe and delete topics on a broker."""


@topic.command("create")
@click.argument("name")
@click.option("--partitions", type=click.IntRange(min=1), default=1, show_default=True)
@click.option(
    "--config",
    "config",
    multiple=True,
    callback=_config_pair,
    metavar="KEY=VALUE",
    help="A topic setting (retention_ms, segment_bytes, ...); repeat for more.",
)
@_broker_options
def topic_create(
    name: str, partitions: int, config: dict[str, str], broker: str, timeout: float
) -> None:
    """Create topic NAME with its partitions on the broker."""
    with _broker_errors(broker), Admin(broker, timeout_s=timeout, retries=CLI_RETRIES) as admin:
        admin.create_topic(name, partitions, config)
    click.echo(f"created topic {name} with {partitions} partitions")


@topic.command("list")
@_broker_options
def topic_list(broker: str, timeout: float) -> None:
    """Print every topic of the broker, one name a line."""
    with _broker_errors(broker), Admin(broker, timeout_s=timeout, retries=CLI_RETRIES) as admin:
        names = admin.list_topics()
    for name in names:
        click.echo(name)


@topic.command("describe")
@click.argument("name")
@_broker_options
def topic_describe(name: str, broker: str, timeout: float) -> None:
    """Print each partition of topic NAME: the broker holding it, its log start offset and
    high watermark (offsets are byte positions), or that it is unavailable."""
    with _broker_errors(broker), Admin(broker, timeout_s=timeout, retries=CLI_RETRIES) as admin:
        partitions = admin.describe(name)
    click.echo(f"topic {name}: {len(partitions)} partitions")
    for p in partitions:
        if p.log_start_offset is None:
            click.echo(f"partition {p.partition} broker {p.broker_id} unavailable (broker down)")
            continue
        click.echo(
            f"partition {p.partition} broker {p.broker_id} "
            f"log_start {p.log_start_offset} high_watermark {p.high_watermark}"
        )


@topic.command("delete")
@click.argument("name")
@_broker_options
def topic_delete(name: str, broker: str, timeout: float) -> None:
    """Delete topic NAME and all of its data."""
    with _broker_errors(broker), Admin(broker, timeout_s=timeout, retries=CLI_RETRIES) as admin:
        admin.delete_topic(name)
    click.echo(f"deleted topic {name}")


_ACKS = {"none": Ack.NONE, "written": Ack.WRITTEN, "flushed": Ack.FLUSHED}


@cli.command()
@click.argument("topic_name", metavar="TOPIC")
@click.option(
    "--file",
    "source",
    type=click.File("rb"),
    default="-",
    help="Read messages from this file instead of stdin.",
)
@click.option(
    "--key-separator",
    help="Split each line at the first SEP into key and value (lines without it have no key).",
    metavar="SEP",
)
@click.option("--partition", type=click.IntRange(min=0), help="Send every message here.")
@click.option("--ack", type=click.Choice(list(_ACKS)), default="flushed", show_default=True)
@_broker_options
def produce(
    topic_name: str,
    source: BinaryIO,
    key_separator: str | None,
    partition: int | None,
    ack: str,
    broker: str,
    timeout: float,
) -> None:
    """Send each line of stdin (or --file) to TOPIC as one message, then print how many the
    broker acknowledged. Without --partition, keyed messages go to the partition of their
    key's hash and the others round robin."""
    separator = None if key_separator is None else key_separator.encode()
    if separator == b"":
        raise click.BadParameter("must not be empty", param_hint="--key-separator")
    with _broker_errors(broker):
        producer = Producer(
            broker, topic_name, ack=_ACKS[ack], retries=CLI_RETRIES, timeout_s=timeout
        )
        with producer:
            for line in source:
                value = line.removesuffix(b"\n").removesuffix(b"\r")
                key = None
                if separator is not None and separator in value:
                    key, _, value = value.partition(separator)
                producer.send(value, key=key, partition=partition)
        sent = producer.messages_sent
    if ack == "none":
        click.echo(f"sent {sent} messages (ack none: not acknowledged)")
    else:
        click.echo(f"{sent} messages acknowledged ({ack})")


def _start(text: str) -> Start:
    if text in ("earliest", "latest"):
        return "earliest" if text == "earliest" else "latest"
    if text.isdigit():
        return int(text)
    try:
        return datetime.datetime.fromisoformat(text)
    except ValueError:
        raise click.BadParameter(
            f"{text!r}: use earliest, latest, an offset or an ISO time", param_hint="--from"
        ) from None


def _skip_corrupt_option(command: F) -> F:
    """--skip-corrupt, on the commands that consume."""
    return click.option(
        "--skip-corrupt",
        is_flag=True,
        help="Read past damaged data on the broker's disk, naming each range skipped on stderr "
        "(without it, damaged data stops the command with exit code 1).",
    )(command)


def _output_options(command: F) -> F:
    """--max-messages and --format, on the commands that print consumed messages."""
    command = click.option(
        "--format",
        "output",
        type=click.Choice(["text", "json"]),
        default="text",
        show_default=True,
        help="text: each value on a line; json: topic, partition, offset, timestamp, key, value.",
    )(command)
    return click.option("--max-messages", type=click.IntRange(min=1), help="Exit after this many.")(
        command
    )


def _print_messages(records: Iterable[Record], output: str, max_messages: int | None) -> None:
    """Print `records` until exhausted or `max_messages` were printed."""
    for count, record in enumerate(records, 1):
        if output == "json":
            line = {
                "topic": record.topic,
                "partition": record.partition,
                "offset": record.offset,
                "timestamp": record.timestamp_ms,
                "key": _text(record.key),
                "value": _text(record.value),
            }
            click.echo(json.dumps(line))
        else:
            click.echo(_text(record.value))
        if max_messages is not None and count >= max_messages:
            return


@cli.command()
@click.argument("topic_name", metavar="TOPIC")
@click.option("--partition", type=click.IntRange(min=0), default=0, show_default=True)
@click.option(
    "--from",
    "start",
    default="earliest",
    show_default=True,
    help="earliest, latest, an offset, or an ISO time, UTC unless it says otherwise (the first "
    "message at or after it).",
)
@click.option(
    "--follow/--no-follow",
    default=False,
    show_default=True,
    help="Wait for new messages at the end instead of exiting.",
)
@_skip_corrupt_option
@_output_options
@_broker_options
def consume(
    topic_name: str,
    partition: int,
    start: str,
    follow: bool,
    skip_corrupt: bool,
    max_messages: int | None,
    output: str,
    broker: str,
    timeout: float,
) -> None:
    """Print the messages of one partition of TOPIC, from --from to its end (or on, with
    --follow). Keys and values are shown as UTF-8, other bytes escaped."""
    where = _start(start)
    with (
        _broker_errors(broker),
        PartitionConsumer(
            broker,
            topic_name,
            partition,
            where,
            stop_at_end=not follow,
            retries=CLI_RETRIES,
            timeout_s=timeout,
            skip_corrupt=skip_corrupt,
        ) as consumer,
    ):
        try:
            _print_messages(_consumed(consumer), output, max_messages)
        except CorruptSegment as error:
            click.echo(f"pylogctl: {error} (--skip-corrupt reads past it)", err=True)
            sys.exit(EXIT_CORRUPT)


def _consumed(consumer: PartitionConsumer) -> Iterator[Record]:
    """The consumer's messages as Records, saying on stderr which damaged ranges it skipped
    (consumer.skipped) as it goes."""
    reported = 0
    for m in consumer:
        reported = _report_skipped(consumer, reported)
        yield Record(consumer.topic, consumer.partition, m.offset, m.timestamp_ms, m.key, m.value)
    _report_skipped(consumer, reported)


def _report_skipped(consumer: PartitionConsumer, reported: int) -> int:
    """Name on stderr the ranges skipped since the first `reported`; the count reported now."""
    for start, end in consumer.skipped[reported:]:
        where = f"{consumer.topic}-{consumer.partition}"
        click.echo(f"pylogctl: skipped damaged offsets [{start}, {end}) of {where}", err=True)
    return len(consumer.skipped)


@cli.group()
def group() -> None:
    """Consumer groups: consume as a member, describe owners and committed offsets."""


def _zookeeper_options(command: F) -> F:
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
@_skip_corrupt_option
@_output_options
@_zookeeper_options
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
        _broker_errors(zookeeper, "ZooKeeper"),
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
            _print_messages(consumer, output, max_messages)
        except CorruptSegment as error:
            click.echo(f"pylogctl: {error} (--skip-corrupt reads past it)", err=True)
            sys.exit(EXIT_CORRUPT)
        consumer.commit()  # the last message printed is processed too


@group.command("describe")
@click.argument("group_name", metavar="GROUP")
@click.argument("topic_name", metavar="TOPIC")
@_zookeeper_options
def group_describe(group_name: str, topic_name: str, zookeeper: str, chroot: str) -> None:
    """Print the members of GROUP, and for each partition of TOPIC its owner and committed
    offset (a byte position; "-" when none)."""
    with _broker_errors(zookeeper, "ZooKeeper"), Registry(zookeeper, chroot) as registry:
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


def main() -> None:
    cli()
