"""`pylogctl topic`: create, list, describe, alter and delete topics."""

from __future__ import annotations

import json

import click

from broker.client import Admin
from broker.client.admin import PartitionDescription
from broker.protocol import ConfigEntry, DescribePartitionReply
from broker.registry import MAX_PARTITIONS
from cli.common import (
    CLI_RETRIES,
    broker_errors,
    broker_options,
    client_keys,
    config_pair,
    json_option,
    say_none,
    timestamp,
)

JSON_OPTION = json_option("One JSON object a line.")


@click.group()
def topic() -> None:
    """Create, list, describe, alter and delete topics on a broker."""


@topic.command("create")
@click.argument("name")
@click.option(
    "--partitions",
    type=click.IntRange(min=1, max=MAX_PARTITIONS),
    default=1,
    show_default=True,
    help=f'How many partitions: 1 to {MAX_PARTITIONS:,} (docs/registry.md, "Writing a topic").',
)
@click.option(
    "--config",
    "config",
    multiple=True,
    callback=config_pair,
    metavar="KEY=VALUE",
    help="A topic setting (retention_ms, segment_bytes, ...); repeat for more.",
)
@JSON_OPTION
@broker_options
def topic_create(
    name: str,
    partitions: int,
    config: dict[str, str],
    as_json: bool,
    broker: str,
    timeout: float,
) -> None:
    """Create topic NAME, its partitions dealt over the brokers up; settings not given take
    the brokers' defaults (topic describe shows them all, topic alter changes them).

    \b
    Example:
      $ pylogctl topic create clicks --partitions 4 --config retention_ms=86400000
      created topic clicks with 4 partitions
    """
    with (
        broker_errors(broker),
        Admin(broker, timeout_s=timeout, retries=CLI_RETRIES, keys=client_keys()) as admin,
    ):
        admin.create_topic(name, partitions, config)
    if as_json:
        click.echo(json.dumps({"topic": name, "partitions": partitions, "config": config}))
    else:
        click.echo(f"created topic {name} with {partitions} partitions")


@topic.command("list")
@JSON_OPTION
@broker_options
def topic_list(as_json: bool, broker: str, timeout: float) -> None:
    """Print every topic of the cluster, one name a line (--json: name and partition count).

    \b
    Example:
      $ pylogctl topic list --json
      {"topic": "clicks", "partitions": 4}
    """
    with (
        broker_errors(broker),
        Admin(broker, timeout_s=timeout, retries=CLI_RETRIES, keys=client_keys()) as admin,
    ):
        topics = sorted(admin.metadata().topics, key=lambda t: t.topic)
    if not topics and not as_json:
        say_none("topics")
    for info in topics:
        if as_json:
            click.echo(json.dumps({"topic": info.topic, "partitions": len(info.partitions)}))
        else:
            click.echo(info.topic)


@topic.command("describe")
@click.argument("name")
@json_option("The whole description as one JSON object.")
@broker_options
def topic_describe(name: str, as_json: bool, broker: str, timeout: float) -> None:
    """Print every setting of topic NAME, the topic's own or the broker's default, then each
    partition: its leader (the broker serving it), the leader's epoch, its replicas (the
    preferred leader first) and in-sync replicas, then as its leader has it: its log start
    offset and high watermark (offsets are byte positions), the bytes of its segment files (and
    how many of them are records deleted before the log start, kept until their segment goes
    whole), how many segments, and the timestamp of its oldest message (UTC); or that it is
    unavailable (its leader down, or none: broker -1). A partition whose leader has not applied
    a changed setting yet (topic alter) says which. A broker older than replication gives no
    epoch, replicas nor ISR: those are left out.

    \b
    Example:
      $ pylogctl topic describe clicks
      topic clicks: 2 partitions
      setting flush_messages 10000 default
      setting retention_ms 86400000 topic
      ...
      partition 0 broker 1 epoch 2 replicas 1,2,3 isr 1,3 log_start 0 high_watermark 0 ...
      partition 1 broker -1 epoch 4 replicas 2,3,1 isr 2 unavailable (no leader)
    """
    with (
        broker_errors(broker),
        Admin(broker, timeout_s=timeout, retries=CLI_RETRIES, keys=client_keys()) as admin,
    ):
        settings = admin.topic_config(name)
        partitions = admin.describe_partitions(name)
    if as_json:
        described = {
            "topic": name,
            "settings": {e.key: {"value": e.value, "overridden": e.overridden} for e in settings},
            "partitions": [_partition_json(p, settings) for p in partitions],
        }
        click.echo(json.dumps(described))
        return
    click.echo(f"topic {name}: {len(partitions)} partitions")
    for entry in settings:
        source = "topic" if entry.overridden else "default"
        click.echo(f"setting {entry.key} {entry.value} {source}")
    for p in partitions:
        where = f"partition {p.partition} broker {p.broker_id}{_replication_text(p)}"
        if p.state is None:
            why = "no leader" if p.broker_id < 0 else "broker down"
            click.echo(f"{where} unavailable ({why})")
            continue
        state = p.state
        oldest = "-" if state.oldest_timestamp < 0 else timestamp(state.oldest_timestamp)
        size = f"size_bytes {state.size_bytes}"
        if deleted := _deleted_on_disk(state):
            size += f" ({deleted} deleted, on disk until their segment goes)"
        line = (
            f"{where} log_start {state.log_start_offset} "
            f"high_watermark {state.high_watermark} {size} "
            f"segments {state.segments} oldest {oldest}"
        )
        if pending := _not_applied(p, settings):
            line += f" (applying {', '.join(pending)})"
        click.echo(line)


def _deleted_on_disk(state: DescribePartitionReply) -> int:
    """The bytes of `size_bytes` before the log start: records deleted (`topic delete-records`,
    or a log start moved past them) whose segment file holds later ones too, so that it stays
    until retention removes it whole. Offsets are byte positions: the segments on disk hold
    the bytes from the oldest one's base offset to the log end."""
    return max(0, state.size_bytes - (state.log_end_offset - state.log_start_offset))


def _replication_text(partition: PartitionDescription) -> str:
    """ " epoch E replicas 1,2,3 isr 1,3" (METADATA version 2; epoch "-" for none known, as a
    partition without a state node has; isr "-" for none), or "" from an older broker."""
    if not partition.replicas:
        return ""
    replicas = ",".join(map(str, partition.replicas))
    isr = ",".join(map(str, partition.isr)) or "-"
    epoch = partition.leader_epoch if partition.leader_epoch >= 0 else "-"  # none known
    return f" epoch {epoch} replicas {replicas} isr {isr}"


def _not_applied(partition: PartitionDescription, settings: tuple[ConfigEntry, ...]) -> list[str]:
    """The topic's own log settings that the partition's broker does not use yet (those it
    reports in effect: replication_factor and min_insync_replicas are the cluster's, never a
    partition's, and so never pending)."""
    if partition.state is None:
        return []
    in_effect = partition.state.config
    return [
        e.key
        for e in settings
        if e.overridden and e.key in in_effect and in_effect[e.key] != e.value
    ]


def _partition_json(
    partition: PartitionDescription, settings: tuple[ConfigEntry, ...]
) -> dict[str, object]:
    described: dict[str, object] = {
        "partition": partition.partition,
        "broker_id": partition.broker_id,
        "leader_epoch": None if partition.leader_epoch < 0 else partition.leader_epoch,
        "replicas": list(partition.replicas),
        "isr": list(partition.isr),
        "available": partition.state is not None,
    }
    if partition.state is not None:
        state = partition.state
        described |= {
            "log_start_offset": state.log_start_offset,
            "high_watermark": state.high_watermark,
            "log_end_offset": state.log_end_offset,
            "size_bytes": state.size_bytes,
            "deleted_bytes_on_disk": _deleted_on_disk(state),
            "segments": state.segments,
            "oldest_timestamp": None if state.oldest_timestamp < 0 else state.oldest_timestamp,
            "settings_in_effect": dict(state.config),
            "applying": _not_applied(partition, settings),
        }
    return described


@topic.command("alter")
@click.argument("name")
@click.option(
    "--set",
    "set_pairs",
    multiple=True,
    callback=config_pair,
    metavar="KEY=VALUE",
    help="Set a topic setting (decimal, or none for no limit); repeat for more.",
)
@click.option(
    "--delete",
    "deleted",
    multiple=True,
    metavar="KEY",
    help="Put a setting back to the brokers' default; repeat for more.",
)
@JSON_OPTION
@broker_options
def topic_alter(
    name: str,
    set_pairs: dict[str, str],
    deleted: tuple[str, ...],
    as_json: bool,
    broker: str,
    timeout: float,
) -> None:
    """Change settings of topic NAME live, without restarting a broker: flush_messages and
    flush_interval_ms apply at once, segment_bytes and segment_ms from the next append,
    retention_ms and retention_bytes at the next retention check, max_message_bytes to the
    next produce. The change is stored in ZooKeeper and applied by the brokers holding the
    partitions moments later (topic describe shows a partition still applying it).

    \b
    Example:
      $ pylogctl topic alter clicks --set retention_ms=86400000 --set segment_bytes=104857600
      altered topic clicks: set retention_ms=86400000 segment_bytes=104857600
      $ pylogctl topic alter clicks --delete retention_ms
      altered topic clicks: default retention_ms
    """
    if not set_pairs and not deleted:
        raise click.UsageError("nothing to change: give --set KEY=VALUE or --delete KEY")
    with (
        broker_errors(broker),
        Admin(broker, timeout_s=timeout, retries=CLI_RETRIES, keys=client_keys()) as admin,
    ):
        admin.alter_topic_config(name, set_pairs, deleted)
    if as_json:
        click.echo(json.dumps({"topic": name, "set": set_pairs, "deleted": list(deleted)}))
        return
    changes = [f"set {' '.join(f'{k}={v}' for k, v in set_pairs.items())}"] if set_pairs else []
    changes += [f"default {' '.join(deleted)}"] if deleted else []
    click.echo(f"altered topic {name}: {'; '.join(changes)}")


@topic.command("delete")
@click.argument("name")
@JSON_OPTION
@broker_options
def topic_delete(name: str, as_json: bool, broker: str, timeout: float) -> None:
    """Delete topic NAME and all of its data, on every broker.

    \b
    Example:
      $ pylogctl topic delete clicks
      deleted topic clicks
    """
    with (
        broker_errors(broker),
        Admin(broker, timeout_s=timeout, retries=CLI_RETRIES, keys=client_keys()) as admin,
    ):
        admin.delete_topic(name)
    click.echo(json.dumps({"topic": name, "deleted": True}) if as_json else f"deleted topic {name}")
