"""`pylogctl produce` and `pylogctl consume`: the console producer and consumer."""

from __future__ import annotations

import datetime
import json
import os
import signal
import stat
import sys
from collections.abc import Iterator
from types import FrameType
from typing import BinaryIO

import click

from broker.client import Ack, Producer
from broker.client.consumer import Start, timestamp_ms
from broker.client.records import Record
from broker.client.topic_consumer import Last, TopicConsumer
from broker.errors import CorruptSegment
from broker.log.compression import CODECS, compressor_for
from cli.common import (
    CLI_RETRIES,
    EXIT_CORRUPT,
    broker_errors,
    broker_options,
    client_id_option,
    client_keys,
    config_pair,
    json_option,
    output_options,
    position,
    print_messages,
    progress,
    skip_corrupt_option,
    until_interrupted,
    usage_error,
)

_ACKS = {"none": Ack.NONE, "written": Ack.WRITTEN, "flushed": Ack.FLUSHED, "all": Ack.ALL}


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
@click.option(
    "--header",
    "headers",
    multiple=True,
    metavar="KEY=VALUE",
    callback=config_pair,
    help="A header (KEY=VALUE, the value as UTF-8) on every message sent; repeat for more.",
)
@click.option(
    "--compression",
    type=click.Choice(list(CODECS)),
    default="none",
    show_default=True,
    help='Send each batch as one compressed set (docs/storage.md, "Compressed sets").',
)
@click.option(
    "--compression-level",
    type=int,
    help="The codec's level (zstd -7 to 22, lz4 0 to 16, gzip 0 to 9); default: the codec's.",
)
@json_option('The count as JSON: {"topic", "messages", "ack"}.')
@client_id_option
@broker_options
def produce(
    topic_name: str,
    source: BinaryIO,
    key_separator: str | None,
    partition: int | None,
    ack: str,
    headers: dict[str, str],
    compression: str,
    compression_level: int | None,
    as_json: bool,
    client_id: str,
    broker: str,
    timeout: float,
) -> None:
    """Send each line of stdin (or --file) to TOPIC as one message, then print how many the
    broker acknowledged. Without --partition, keyed messages go to the partition of their
    key's hash and the others round robin. Ctrl-C ends the input: the lines read are sent,
    and the command exits 0. Reading a file on a terminal, a progress bar is shown on stderr.

    \b
    Examples:
      printf 'user-1:hello\\nuser-2:world\\n' | pylogctl produce clicks --key-separator :
      pylogctl produce clicks --file events.txt --ack written
      pylogctl produce clicks --file access.log --compression zstd
      pylogctl produce clicks --header source=web --header schema=7
    """
    separator = None if key_separator is None else key_separator.encode()
    if separator == b"":
        raise click.BadParameter("must not be empty", param_hint="--key-separator")
    sent_headers = [(k, v.encode()) for k, v in headers.items()] or None
    try:
        compressor_for(compression, compression_level)
    except ValueError as error:
        raise click.BadParameter(str(error), param_hint="--compression-level") from None
    with broker_errors(broker):
        producer = Producer(
            broker,
            topic_name,
            ack=_ACKS[ack],
            retries=CLI_RETRIES,
            client_id=client_id,
            timeout_s=timeout,
            keys=client_keys(),
            compression=compression,
            compression_level=compression_level,
        )
        with producer, progress(f"produce {topic_name}", _file_size(source)) as done:
            for line in _lines_until_interrupted(source):
                done(len(line))
                value = line.removesuffix(b"\n").removesuffix(b"\r")
                key = None
                if separator is not None and separator in value:
                    key, _, value = value.partition(separator)
                producer.send(value, key=key, partition=partition, headers=sent_headers)
        sent = producer.messages_sent
    if as_json:
        click.echo(json.dumps({"topic": topic_name, "messages": sent, "ack": ack}))
    elif ack == "none":
        click.echo(f"sent {sent} messages (ack none: not acknowledged)")
    else:
        click.echo(f"{sent} messages acknowledged ({ack})")


def _file_size(source: BinaryIO) -> int | None:
    """The size of `source` when it is a regular file (a terminal or a pipe has none)."""
    try:
        status = os.fstat(source.fileno())
    except (OSError, ValueError):  # no file descriptor (tests pass a buffer)
        return None
    return status.st_size if stat.S_ISREG(status.st_mode) else None


def _lines_until_interrupted(source: BinaryIO) -> Iterator[bytes]:
    """The lines of `source` until its end or Ctrl-C. SIGINT ends a read at once; one that
    comes while the caller handles a line (sends it) lets that line go out, then ends."""
    interrupted = reading = False

    def on_sigint(signum: int, frame: FrameType | None) -> None:
        nonlocal interrupted
        interrupted = True
        if reading:
            raise KeyboardInterrupt

    previous = signal.signal(signal.SIGINT, on_sigint)
    try:
        while not interrupted:
            reading = True
            try:
                line = source.readline()
            except KeyboardInterrupt:
                return
            finally:
                reading = False
            if not line:
                return
            yield line
    finally:
        signal.signal(signal.SIGINT, previous)


def _moment(text: str, option: str) -> datetime.datetime:
    try:
        return datetime.datetime.fromisoformat(text)
    except ValueError:
        raise click.BadParameter(f"{text!r} is not an ISO time", param_hint=option) from None


def _start(text: str) -> Start | Last:
    if text.startswith("-") and text[1:].isdigit() and int(text[1:]) > 0:
        return Last(int(text[1:]))
    return position(text, "--from", "earliest, latest, -N, an offset or an ISO time")


@click.command()
@click.argument("topic_name", metavar="TOPIC")
@click.option(
    "--partition",
    "partitions",
    type=click.IntRange(min=0),
    multiple=True,
    help="Read this partition only (repeat for more); default: every partition.",
)
@click.option(
    "--from",
    "start",
    default="earliest",
    show_default=True,
    help="Where each partition starts: earliest, latest, -N (its last N messages), an offset "
    "(with --partition: offsets are byte positions of one partition), or an ISO time, UTC "
    "unless it says otherwise (its first message at or after it).",
)
@click.option(
    "--until",
    help="end: stop at each partition's end (the default without --follow); or an ISO time: "
    "stop each partition before its first message at or after it.",
)
@click.option(
    "--follow/--no-follow",
    default=False,
    show_default=True,
    help="At the end, wait for new messages instead of exiting, through broker restarts (a "
    "topic keeps the partitions it was created with); Ctrl-C exits 0.",
)
@json_option("--format json.")
@skip_corrupt_option
@output_options
@client_id_option
@broker_options
def consume(
    topic_name: str,
    partitions: tuple[int, ...],
    start: str,
    until: str | None,
    follow: bool,
    as_json: bool,
    skip_corrupt: bool,
    max_messages: int | None,
    output: str,
    client_id: str,
    broker: str,
    timeout: float,
) -> None:
    """Print the messages of TOPIC, every partition or those of --partition, from --from to
    their end (or on, with --follow). Keys and values are shown as UTF-8, other bytes
    escaped.

    \b
    Examples:
      pylogctl consume clicks --from -10                 # the last 10 of each partition
      pylogctl consume clicks --partition 1 --from 2026-11-23T08:00 --until 2026-11-23T09:00
      pylogctl consume clicks --follow --format '%p %o %T %k=%v\\n'
    """
    where = _start(start)
    if isinstance(where, int) and not partitions:
        usage_error(
            f"--from {start}: an offset is a byte position in one partition: pick it with "
            "--partition"
        )
    until_ms = None
    if until == "end":
        if follow:
            usage_error("--until end and --follow contradict each other: drop one")
    elif until is not None:
        until_ms = timestamp_ms(_moment(until, "--until"))
    with (
        broker_errors(broker),
        TopicConsumer(
            broker,
            topic_name,
            partitions or None,
            where,
            until_ms,
            follow,
            skip_corrupt,
            retries=CLI_RETRIES,
            client_id=client_id,
            timeout_s=timeout,
            keys=client_keys(),
        ) as consumer,
        until_interrupted(),
    ):
        try:
            print_messages(_consumed(consumer), "json" if as_json else output, max_messages)
        except CorruptSegment as error:
            click.echo(f"pylogctl: {error} (--skip-corrupt reads past it)", err=True)
            sys.exit(EXIT_CORRUPT)


def _consumed(consumer: TopicConsumer) -> Iterator[Record]:
    """The consumer's records, saying on stderr which damaged ranges it skipped
    (consumer.skipped) as it goes."""
    reported = 0
    for record in consumer:
        reported = _report_skipped(consumer, reported)
        yield record
    _report_skipped(consumer, reported)


def _report_skipped(consumer: TopicConsumer, reported: int) -> int:
    """Name on stderr the ranges skipped since the first `reported`; the count reported now."""
    for partition, start, end in consumer.skipped[reported:]:
        where = f"{consumer.topic}-{partition}"
        click.echo(f"pylogctl: skipped damaged offsets [{start}, {end}) of {where}", err=True)
    return len(consumer.skipped)
