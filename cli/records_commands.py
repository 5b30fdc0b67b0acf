"""`pylogctl topic delete-records`: drop a partition's oldest records now, without waiting for
retention (`kafka-delete-records`, `rpk topic trim-prefix`).

The new log start of each partition is found at its leader (a message boundary: the first
message at or after a time, or an offset checked to be one), then written to the topic's node
in ZooKeeper (`log_starts`, broker.registry.topics), where every replica of the partition reads
it, now and whenever it opens the partition again: the records are gone on every replica, and
stay gone through restarts and leader changes. The command waits until each leader has moved
its log start."""

from __future__ import annotations

import datetime
import json
import time
from dataclasses import dataclass
from typing import Final

import click

from broker.client import Admin
from broker.client.connection import Connection
from broker.client.consumer import Start, timestamp_ms
from broker.client.framing import Retry
from broker.client.lag import log_range, message_bounds
from broker.errors import BrokerError, Unavailable
from broker.protocol import OffsetsRequest
from cli.common import CLI_RETRIES, broker_errors, client_keys, position, usage_error
from cli.group_commands import admin_options, fail, open_registry

LEADER_RETRIES: Final = 10
"""How often a partition's offsets are asked again after a retriable error (within --timeout):
a leader that just moved answers NOT_LEADER_FOR_PARTITION until every broker has heard."""
APPLIED_WITHIN_S: Final = 30.0
"""How long the command waits for the leaders to move their log starts."""


@dataclass(frozen=True)
class Trim:
    """A partition's log start before and after (None: nothing to delete), and why not."""

    partition: int
    start: int
    high_watermark: int
    after: int | None
    note: str = ""


def _plan(admin: Admin, topic: str, number: int, before: Start) -> Trim:
    """Where partition `number` of `topic` is to start: `before` resolved at its leader, asked
    again of the leader found then after a retriable error (its leader moved, and the broker
    asked has not heard yet, say), 0.1 s doubling apart, none starting after the timeout
    (Retry)."""
    cluster = admin.cluster
    retry = Retry(LEADER_RETRIES, cluster.timeout_s, cluster.clock)
    while True:
        try:
            return _plan_at(cluster.leader_connection(topic, number), topic, number, before)
        except (BrokerError, Unavailable) as error:
            wait_s = retry.wait_after(error)
            cluster.learn_from(topic, number, error)
        cluster.clock.sleep(wait_s)


def _plan_at(connection: Connection, topic: str, number: int, before: Start) -> Trim:
    """_plan at the partition's leader, reached at `connection`."""
    start, end = log_range(connection, topic, number, 0)
    if before == "latest":
        target = end
    elif isinstance(before, datetime.datetime):
        request = OffsetsRequest(topic, number, timestamp_ms(before))
        target = connection.call(request, 0).offset
    elif isinstance(before, int):
        if before > end:
            usage_error(
                f"partition {number}: offset {before} is past its high watermark {end}: "
                f"at most {end} (delete every record: --before latest)"
            )
        around, following = message_bounds(connection, topic, number, before, 0)
        if before >= start and around != before:
            usage_error(
                f"partition {number}: offset {before} is inside the message [{around}, "
                f"{following}): give {around} (keep it) or {following} (delete it)"
            )
        target = before
    else:  # earliest
        target = start
    if target <= start:
        return Trim(number, start, end, None, f"nothing before {target} (log start {start})")
    return Trim(number, start, end, target)


@click.command("delete-records")
@click.argument("topic_name", metavar="TOPIC")
@click.option(
    "--before",
    "before_text",
    required=True,
    metavar="OFFSET|TIME|latest",
    help="Delete every record before this: an offset (a message boundary), the first message "
    "at or after an ISO time (UTC unless it says otherwise), or latest (every record now "
    "readable).",
)
@click.option(
    "--partition",
    "partitions",
    type=click.IntRange(min=0),
    multiple=True,
    help="Only this partition (repeat for several); default: every one. An OFFSET is a byte "
    "position of one partition: give it with --partition.",
)
@click.option("--dry-run", is_flag=True, help="Say what would be deleted, delete nothing.")
@admin_options
def delete_records(
    topic_name: str,
    before_text: str,
    partitions: tuple[int, ...],
    dry_run: bool,
    zookeeper: str | None,
    chroot: str | None,
    broker: str,
    timeout: float,
    as_json: bool,
) -> None:
    """Delete the records of TOPIC before an offset or a time, now: each partition's log
    start moves there on every replica (for good: through restarts and leader changes), its
    segments wholly before it are removed, and a consumer fetching before it is answered
    OFFSET_OUT_OF_RANGE (its reset policy then applies). Waits until each leader has applied it.

    \b
    Examples:
      pylogctl topic delete-records clicks --before 2026-11-28T09:00 --dry-run
      pylogctl topic delete-records clicks --before 2026-11-28T09:00
      pylogctl topic delete-records clicks --partition 0 --before 104857
      pylogctl topic delete-records clicks --before latest   # every record now readable"""
    before = position(before_text, "--before", "an offset, an ISO time or latest")
    if isinstance(before, int) and len(partitions) != 1:
        usage_error("an OFFSET is a byte position of one partition: give one --partition")
    with (
        broker_errors(broker),
        Admin(broker, timeout_s=timeout, retries=CLI_RETRIES, keys=client_keys()) as admin,
    ):
        count = len(admin.topic(topic_name).partitions)
        if unknown := sorted(set(partitions) - set(range(count))):
            usage_error(f"topic {topic_name} has partitions 0 to {count - 1}, not {unknown}")
        plan = [_plan(admin, topic_name, n, before) for n in partitions or range(count)]
        starts = {t.partition: t.after for t in plan if t.after is not None}
        if starts and not dry_run:
            with open_registry(zookeeper, chroot, broker, timeout) as registry:
                registry.topics.move_log_starts(topic_name, starts)
            _wait_applied(admin, topic_name, starts)
    for trim in plan:
        _say(topic_name, trim, dry_run, as_json)


def _wait_applied(admin: Admin, topic: str, starts: dict[int, int]) -> None:
    """Until each partition's leader starts at (or past) what was asked; exit 1 after
    APPLIED_WITHIN_S (the start is asked in ZooKeeper all the same: it applies once the
    leader is back)."""
    deadline = time.monotonic() + APPLIED_WITHIN_S
    waiting = dict(starts)
    while waiting:
        for number, asked in list(waiting.items()):
            if admin.describe_partition(topic, number).log_start_offset >= asked:
                del waiting[number]
        if waiting and time.monotonic() > deadline:
            fail(
                f"the log starts of {topic} partitions {sorted(waiting)} are asked in ZooKeeper "
                f"but their leaders have not moved them in {APPLIED_WITHIN_S:.0f} s: they will "
                "once they serve them (pylogctl topic describe shows it)"
            )
        if waiting:
            time.sleep(0.1)


def _say(topic: str, trim: Trim, dry_run: bool, as_json: bool) -> None:
    if as_json:
        record = {
            "topic": topic,
            "partition": trim.partition,
            "log_start_before": trim.start,
            "log_start_after": trim.start if trim.after is None else trim.after,
            "deleted_bytes": 0 if trim.after is None else trim.after - trim.start,
            "dry_run": dry_run,
        }
        click.echo(json.dumps(record))
        return
    name = f"{topic}-{trim.partition}"
    if trim.after is None:
        click.echo(f"{name}: {trim.note}: nothing deleted")
        return
    verb = "would move" if dry_run else "moved"
    click.echo(
        f"{name}: log start {verb} {trim.start} -> {trim.after} "
        f"({trim.after - trim.start} bytes of records {'would be ' if dry_run else ''}deleted)"
    )
