"""`pylogctl produce` and `pylogctl consume`: the console producer and consumer."""

from __future__ import annotations

import datetime
import sys
from collections.abc import Iterator
from typing import BinaryIO

import click

from broker.client import Ack, PartitionConsumer, Producer
from broker.client.consumer import Start
from broker.client.group import Record
from broker.errors import CorruptSegment
from cli.common import (
    CLI_RETRIES,
    EXIT_CORRUPT,
    broker_errors,
    broker_options,
    output_options,
    print_messages,
    skip_corrupt_option,
)

_ACKS = {"none": Ack.NONE, "written": Ack.WRITTEN, "flushed": Ack.FLUSHED}


@click.command()
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
@broker_options
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
    with broker_errors(broker):
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


@click.command()
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
@skip_corrupt_option
@output_options
@broker_options
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
        broker_errors(broker),
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
            print_messages(_consumed(consumer), output, max_messages)
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
