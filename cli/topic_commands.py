"""`pylogctl topic`: create, list, describe and delete topics."""

from __future__ import annotations

import click

from broker.client import Admin
from cli.common import CLI_RETRIES, broker_errors, broker_options, config_pair


@click.group()
def topic() -> None:
    """Create, list, describe and delete topics on a broker."""


@topic.command("create")
@click.argument("name")
@click.option("--partitions", type=click.IntRange(min=1), default=1, show_default=True)
@click.option(
    "--config",
    "config",
    multiple=True,
    callback=config_pair,
    metavar="KEY=VALUE",
    help="A topic setting (retention_ms, segment_bytes, ...); repeat for more.",
)
@broker_options
def topic_create(
    name: str, partitions: int, config: dict[str, str], broker: str, timeout: float
) -> None:
    """Create topic NAME with its partitions on the broker."""
    with broker_errors(broker), Admin(broker, timeout_s=timeout, retries=CLI_RETRIES) as admin:
        admin.create_topic(name, partitions, config)
    click.echo(f"created topic {name} with {partitions} partitions")


@topic.command("list")
@broker_options
def topic_list(broker: str, timeout: float) -> None:
    """Print every topic of the broker, one name a line."""
    with broker_errors(broker), Admin(broker, timeout_s=timeout, retries=CLI_RETRIES) as admin:
        names = admin.list_topics()
    for name in names:
        click.echo(name)


@topic.command("describe")
@click.argument("name")
@broker_options
def topic_describe(name: str, broker: str, timeout: float) -> None:
    """Print each partition of topic NAME: the broker holding it, its log start offset and
    high watermark (offsets are byte positions), or that it is unavailable."""
    with broker_errors(broker), Admin(broker, timeout_s=timeout, retries=CLI_RETRIES) as admin:
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
@broker_options
def topic_delete(name: str, broker: str, timeout: float) -> None:
    """Delete topic NAME and all of its data."""
    with broker_errors(broker), Admin(broker, timeout_s=timeout, retries=CLI_RETRIES) as admin:
        admin.delete_topic(name)
    click.echo(f"deleted topic {name}")
