"""What pylogctl's commands share: the broker options and error handling, and how messages
are printed."""

from __future__ import annotations

import contextlib
import datetime
import json
import sys
from collections.abc import Callable, Iterable, Iterator
from typing import TypeVar

import click

from broker.client.group import Record
from broker.errors import BrokerError, PylogError, Unavailable
from broker.log.message import Message

PREVIEW_BYTES = 40
EXIT_CORRUPT = 1
EXIT_BROKER = 1
DEFAULT_BROKER = "tcp://127.0.0.1:9092"
CLI_RETRIES = 1
"""Retries of a retriable error or a lost reply: one, so an unreachable broker is reported after
about two --timeout periods."""

F = TypeVar("F", bound=Callable[..., object])


def text(data: bytes | None, limit: int | None = None) -> str | None:
    if data is None:
        return None
    shown = data if limit is None else data[:limit]
    text = shown.decode("utf-8", "backslashreplace")
    return text + "..." if limit is not None and len(data) > limit else text


def message_record(message: Message) -> dict[str, object]:
    return {
        "offset": message.offset,
        "size": message.size,
        "timestamp_ms": message.timestamp_ms,
        "key": text(message.key),
        "value_size": len(message.value),
        "value_preview": text(message.value, PREVIEW_BYTES),
        "checksum_ok": message.checksum_ok,
    }


def timestamp(ms: int) -> str:
    try:
        return datetime.datetime.fromtimestamp(ms / 1000, datetime.UTC).isoformat(
            timespec="milliseconds"
        )
    except (OverflowError, ValueError, OSError):
        return f"{ms}ms"


def broker_options(command: F) -> F:
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
def broker_errors(broker: str, what: str = "broker") -> Iterator[None]:
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


def config_pair(
    ctx: click.Context, param: click.Parameter, pairs: tuple[str, ...]
) -> dict[str, str]:
    config: dict[str, str] = {}
    for pair in pairs:
        key, separator, value = pair.partition("=")
        if not separator or not key:
            raise click.BadParameter(f"{pair!r} is not KEY=VALUE", ctx, param)
        config[key] = value
    return config


def skip_corrupt_option(command: F) -> F:
    """--skip-corrupt, on the commands that consume."""
    return click.option(
        "--skip-corrupt",
        is_flag=True,
        help="Read past damaged data on the broker's disk, naming each range skipped on stderr "
        "(without it, damaged data stops the command with exit code 1).",
    )(command)


def output_options(command: F) -> F:
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


def print_messages(records: Iterable[Record], output: str, max_messages: int | None) -> None:
    """Print `records` until exhausted or `max_messages` were printed."""
    for count, record in enumerate(records, 1):
        if output == "json":
            line = {
                "topic": record.topic,
                "partition": record.partition,
                "offset": record.offset,
                "timestamp": record.timestamp_ms,
                "key": text(record.key),
                "value": text(record.value),
            }
            click.echo(json.dumps(line))
        else:
            click.echo(text(record.value))
        if max_messages is not None and count >= max_messages:
            return
