"""`pylogctl mirror describe`: how far pylog-mirror's target is behind its source, read from
both clusters with the mirror's own file (broker.mirror.lag; docs/mirror.md, "Watching it")."""

from __future__ import annotations

import json
import sys
import time
from dataclasses import asdict
from pathlib import Path

import click

from broker.client.lag import COUNT_BYTES
from broker.mirror import MirrorConfig, MirrorConfigError
from broker.mirror.lag import MirrorLag, describe_mirror, mirror_clusters
from cli.common import (
    CLI_RETRIES,
    broker_errors,
    json_option,
    until_interrupted,
    usage_error,
    watch_options,
)
from cli.group_commands import seconds_text, table


@click.group()
def mirror() -> None:
    """pylog-mirror: how far its target is behind its source."""


@mirror.command("describe")
@click.argument("topics", metavar="[TOPIC]...", nargs=-1)
@click.option(
    "--config",
    "config_path",
    required=True,
    type=click.Path(dir_okay=False, path_type=Path),
    help="The mirror's file (its [source], [target] and topics).",
)
@click.option(
    "--count-bytes",
    type=click.IntRange(min=1),
    default=COUNT_BYTES,
    show_default=True,
    help="Count the messages not copied yet exactly up to this many bytes; estimate the rest "
    "from their average size (shown as ~N).",
)
@click.option(
    "--timeout",
    type=click.FloatRange(min=0.1),
    default=10.0,
    show_default=True,
    help="Seconds to wait for each cluster's reply.",
)
@click.option(
    "--wait",
    type=click.FloatRange(min=0),
    default=0.0,
    show_default=True,
    help="While a matching partition is not being copied yet (a mirror just started makes "
    "the target's topics within its discover_interval_s), look again for up to this many "
    "seconds before printing.",
)
@watch_options("Print it again every --interval until Ctrl-C.")
@json_option("One JSON object a line.")
def mirror_describe(
    topics: tuple[str, ...],
    config_path: Path,
    count_bytes: int,
    timeout: float,
    wait: float,
    watch: bool,
    interval: float,
    as_json: bool,
) -> None:
    """Print, for each partition of the topics the mirror's file names (or of TOPIC...), the
    log start and high watermark on each side, the lag in bytes, in
    messages and in seconds (the age of the first message not copied yet), and the mirror
    process that copies it; then a summary line. Read from the clusters: true whether the
    mirror runs or not.

    \b
    Example:
        pylogctl mirror describe --config /etc/pylog/pylog-mirror.toml
        TOPIC   PARTITION  SOURCE_START  SOURCE_HW  TARGET_START  TARGET_HW  LAG_BYTES  ...
        clicks  0          0             4200       0             3500       700        ...
        mirror: 1 partition of 1 topic, lag 700 bytes, 20 messages, 1.5 s"""
    try:
        config = MirrorConfig.load(config_path)
    except MirrorConfigError as error:
        usage_error(str(error))
    source_address, target_address = config.source, config.target
    with (
        until_interrupted(),
        broker_errors(f"{source_address.bootstrap} or {target_address.bootstrap}"),
        mirror_clusters(config, timeout, CLI_RETRIES) as (source, target, registry),
    ):
        waited = time.monotonic() + wait
        while True:
            lags = describe_mirror(config, source, target, registry, topics, count_bytes)
            if any(_not_copied(lag) for lag in lags) and time.monotonic() < waited:
                time.sleep(WAIT_STEP_S)  # a condition polled: the target's topics made
                continue
            if watch and not as_json and sys.stdout.isatty():
                click.clear()
            stalled = _print(lags, as_json)
            if not watch:
                if stalled:
                    sys.exit(EXIT_NOT_COPIED)
                return
            time.sleep(interval)  # the refresh period, not a wait for a condition


WAIT_STEP_S = 0.25
"""How often --wait looks again."""
EXIT_NOT_COPIED = 1
"""mirror describe's exit code while a partition that matches is not being copied."""
NOT_COPIED = ("not on the target (yet)", "the source's partition is not served now")
"""The notes of a partition that is not being copied (the source deleted what it lacks is
another: `_not_copied`)."""


def _not_copied(lag: MirrorLag) -> bool:
    note = lag.note or ""
    return note in NOT_COPIED or note.startswith("the source deleted")


def _print(lags: list[MirrorLag], as_json: bool) -> list[MirrorLag]:
    """Print the table (or JSON) and the summary; returns the partitions not being copied."""
    stalled = [lag for lag in lags if _not_copied(lag)]
    if as_json:
        for lag in lags:
            click.echo(json.dumps({"type": "partition", **asdict(lag)}))
    else:
        table(
            (
                *("TOPIC", "PARTITION", "SOURCE_START", "SOURCE_HW", "TARGET_START"),
                *("TARGET_HW", "LAG_BYTES"),
                *("LAG_MESSAGES", "LAG_SECONDS", "RETENTION_S", "COPIED_BY", "NOTE"),
            ),
            [
                (
                    *(lag.topic, lag.partition, lag.source_log_start, lag.source_high_watermark),
                    *(lag.target_log_start, lag.target_high_watermark, lag.lag_bytes),
                    *(_messages(lag), lag.lag_seconds, seconds_text(lag.retention_seconds)),
                    *(lag.owner, lag.note or ""),
                )
                for lag in lags
            ],
        )
    topics = len({lag.topic for lag in lags})
    lag_bytes = sum(lag.lag_bytes or 0 for lag in lags)
    messages = sum(lag.lag_messages or 0 for lag in lags)
    seconds = max((lag.lag_seconds for lag in lags if lag.lag_seconds is not None), default=None)
    retention = min(
        (lag.retention_seconds for lag in lags if lag.retention_seconds is not None), default=None
    )
    if as_json:
        summary = {
            "type": "mirror",
            "partitions": len(lags),
            "topics": topics,
            "lag_bytes": lag_bytes,
            "lag_messages": messages,
            "lag_seconds": seconds,
            "retention_seconds": retention,
            "not_copied": [f"{lag.topic}-{lag.partition}" for lag in stalled],
        }
        click.echo(json.dumps(summary))
        return stalled
    click.echo(
        f"mirror: {len(lags)} partitions of {topics} topics, lag {lag_bytes} bytes, "
        f"{'~' if any(lag.lag_messages_estimated for lag in lags) else ''}{messages} messages, "
        f"{'-' if seconds is None else f'{seconds:.1f}'} s"
        + ("" if retention is None else f"; retention deletes uncopied data in {retention:.1f} s")
        + _stalled_text(stalled)
    )
    return stalled


def _stalled_text(stalled: list[MirrorLag]) -> str:
    """What the summary says of the partitions not being copied ("" for none)."""
    if not stalled:
        return ""
    why: dict[str, list[str]] = {}
    for lag in stalled:
        why.setdefault(lag.note or "", []).append(f"{lag.topic}-{lag.partition}")
    said = "; ".join(f"{', '.join(names)}: {note}" for note, names in why.items())
    return f"; NOT COPIED: {len(stalled)} partition{'' if len(stalled) == 1 else 's'} ({said})"


def _messages(lag: MirrorLag) -> str | None:
    if lag.lag_messages is None:
        return None
    return f"~{lag.lag_messages}" if lag.lag_messages_estimated else str(lag.lag_messages)
