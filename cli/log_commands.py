"""`pylogctl log`: segment files and partition folders on disk, read-only."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from broker.errors import InvalidMessage
from broker.log.codec import set_messages
from broker.log.compression import Codec
from broker.log.message import CODEC_MASK, SET_CODECS, Message
from broker.log.recovery import SEGMENT_NAME
from broker.log.verify import (
    base_offset_of,
    check_partition,
    dump_segment,
    partition_dirs,
    set_aside_files,
)
from cli.common import (
    EXIT_CORRUPT,
    PREVIEW_BYTES,
    json_option,
    message_record,
    progress,
    text,
    timestamp,
)


@click.group()
def log() -> None:
    """Inspect segment files and partition folders on disk (read-only)."""


@log.command()
@click.argument("segment", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@json_option("One JSON object per line.")
def dump(segment: Path, as_json: bool) -> None:
    """Print every message of a SEGMENT file: offset, size, timestamp, key, value preview and
    whether its checksum is right. Offsets come from the file's 20-digit name. A compressed
    set is shown as a line that names its codec, then its messages indented (with --json,
    records with "in_set": the set's offset).

    Exits 1 if any checksum is wrong, a compressed set does not decompress into valid
    messages, or the framing breaks (reported with its file position).

    \b
    Examples:
      pylogctl log dump /var/lib/pylog/logs/clicks-0/00000000000000000000.log
      pylogctl log dump --json /var/lib/pylog/logs/clicks-0/00000000000000000000.log"""
    corrupt = False
    try:
        for message in dump_segment(segment):
            corrupt |= not message.checksum_ok
            codec = message.attributes & CODEC_MASK
            if codec not in SET_CODECS or not message.checksum_ok:
                _show_message(message, as_json)
                continue
            count, inner, failure = set_messages(message)
            _show_set(message, Codec(codec).name.lower(), count, failure, as_json)
            corrupt |= failure is not None
            for each in inner:
                _show_message(each, as_json, message.offset)
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


def _show_message(message: Message, as_json: bool, in_set: int | None = None) -> None:
    """One line of `log dump`: a message, indented when it is in the set at `in_set`."""
    if as_json:
        record = message_record(message)
        click.echo(json.dumps(record if in_set is None else {**record, "in_set": in_set}))
        return
    key = "-" if message.key is None else repr(text(message.key))
    click.echo(
        ("" if in_set is None else "    ") + f"offset {message.offset} size {message.size} "
        f"time {timestamp(message.timestamp_ms)} key {key} "
        f"value {text(message.value, PREVIEW_BYTES)!r} "
        f"checksum {'ok' if message.checksum_ok else 'BAD'}"
    )


def _show_set(
    wrapper: Message, codec: str, count: int, failure: InvalidMessage | None, as_json: bool
) -> None:
    """The line of `log dump` for a compressed set, before its messages."""
    if as_json:
        record = {
            "offset": wrapper.offset,
            "size": wrapper.size,
            "timestamp_ms": wrapper.timestamp_ms,
            "compression": codec,
            "compressed_size": len(wrapper.value),
            "messages": count,
            "checksum_ok": wrapper.checksum_ok,
            "error": None if failure is None else failure.reason,
        }
        click.echo(json.dumps(record))
        return
    click.echo(
        f"offset {wrapper.offset} size {wrapper.size} time {timestamp(wrapper.timestamp_ms)} "
        f"compressed set: {codec}, {len(wrapper.value)} bytes"
        + (f", {count} messages" if failure is None else f": BAD: {failure.reason}")
    )


@log.command()
@click.argument("path", type=click.Path(exists=True, file_okay=False, path_type=Path))
@json_option("One JSON object per line.")
@click.option(
    "--deep",
    is_flag=True,
    help="Also decompress every compressed set and check the messages inside it (slower: "
    "every set is read and expanded), counting those messages (without it, a set counts as "
    "one message, and the lines say how many are sets).",
)
def verify(path: Path, as_json: bool, deep: bool) -> None:
    """Check every segment of a partition folder, or of every partition under a log dir:
    framing, checksums, that each segment starts where the one before it ended, and that each
    index written for a segment of its size (a clean close) agrees with the segment.

    A compressed set's checksum covers its compressed bytes; --deep also opens every set and
    checks what is inside, as the broker does when a producer sends one.

    Prints a line per segment as it is checked and a summary; exits 1 on any corruption,
    naming the file and byte position. Files set aside as *.bad are listed, not checked. On a
    terminal, a progress bar of the bytes checked is shown on stderr meanwhile.

    \b
    Examples:
      pylogctl log verify /var/lib/pylog            # every partition of a log dir
      pylogctl log verify --json /var/lib/pylog/clicks-0
      pylogctl log verify --deep /var/lib/pylog/clicks-0"""
    directories = partition_dirs(path)
    if not directories:
        raise click.UsageError(f"{path} holds no segment files, nor folders that do")
    corrupt = segments = messages = sets = 0
    with progress(f"verify {path}", _segment_bytes(directories)) as done:
        for directory in directories:
            for check in check_partition(directory, deep):
                done(check.size)
                segments += 1
                messages += check.messages
                sets += check.sets
                corrupt += not check.ok
                if as_json:
                    record = {
                        "file": str(check.path),
                        "base_offset": check.base_offset,
                        "size": check.size,
                        "messages": check.messages,
                        "compressed_sets_unopened": check.sets,
                        "ok": check.ok,
                        "error": check.error,
                        "position": check.position,
                    }
                    click.echo(json.dumps(record))
                elif check.ok:
                    counted = _messages_text(check.messages, check.sets)
                    click.echo(f"ok       {check.path} ({counted}, {check.size} bytes)")
                else:
                    click.echo(f"CORRUPT  {check.path} at byte {check.position}: {check.error}")
            for bad in set_aside_files(directory):
                if as_json:
                    click.echo(json.dumps({"file": str(bad), "set_aside": True}))
                else:
                    click.echo(f"set aside {bad} (left by recovery; not part of the log)")
    summary = {"partitions": len(directories), "segments": segments, "messages": messages}
    if as_json:
        summary["compressed_sets_unopened"] = sets
        click.echo(json.dumps({"summary": {**summary, "corrupt_segments": corrupt}}))
    else:
        click.echo(
            f"{len(directories)} partitions, {segments} segments, "
            f"{_messages_text(messages, sets)}: "
            + (f"{corrupt} corrupt segments" if corrupt else "all ok")
        )
    if corrupt:
        sys.exit(EXIT_CORRUPT)


def _messages_text(messages: int, sets: int) -> str:
    """ "21 messages", or with compressed sets not opened (each counted as one) "3 messages,
    1 of them a compressed set (--deep counts what sets hold)"."""
    if not sets:
        return f"{messages} messages"
    which = "a compressed set" if sets == 1 else "compressed sets"
    return f"{messages} messages, {sets} of them {which} (--deep counts what sets hold)"


def _segment_bytes(directories: list[Path]) -> int:
    """The size of every segment file in `directories`: what verify reads."""
    return sum(
        p.stat().st_size for d in directories for p in d.iterdir() if SEGMENT_NAME.match(p.name)
    )
