"""`pylogctl broker`: the brokers of the cluster."""

from __future__ import annotations

import json

import click

from broker.client import Admin
from cli.common import CLI_RETRIES, broker_errors, broker_options, client_keys, json_option


@click.group()
def broker() -> None:
    """The brokers of the cluster."""


@broker.command("list")
@json_option("One JSON object a line.")
@broker_options
def broker_list(as_json: bool, broker: str, timeout: float) -> None:
    """Print every broker of the cluster: id, endpoint, up or down, the pylog version it runs,
    its log dirs and how many partitions it holds. A broker is down when it holds partitions
    but is not registered in ZooKeeper (stopped, or cut off). The last line names the
    ZooKeeper the cluster uses (the one group commands find through --broker); --json prints
    the brokers alone, one object a line.

    \b
    Example:
      $ pylogctl broker list --broker 127.0.0.1:9092
      broker 1 up   tcp://127.0.0.1:9092 version 0.1.0 partitions 3 log_dirs /d1
      broker 2 down partitions 1
      zookeeper 127.0.0.1:2181 chroot /pylog
    """
    with (
        broker_errors(broker),
        Admin(broker, timeout_s=timeout, retries=CLI_RETRIES, keys=client_keys()) as admin,
    ):
        cluster = admin.describe_cluster()
    for b in cluster.brokers:
        endpoint = f"tcp://{b.host}:{b.port}" if b.up else None
        if as_json:
            line = {
                "broker_id": b.broker_id,
                "up": b.up,
                "endpoint": endpoint,
                "version": b.version or None,
                "log_dirs": list(b.log_dirs),
                "partitions": b.partitions,
            }
            click.echo(json.dumps(line))
        elif b.up:
            click.echo(
                f"broker {b.broker_id} up   {endpoint} version {b.version or 'unknown'} "
                f"partitions {b.partitions} log_dirs {','.join(b.log_dirs)}"
            )
        else:
            click.echo(f"broker {b.broker_id} down partitions {b.partitions}")
    if not as_json:
        click.echo(f"zookeeper {cluster.zookeeper_connect} chroot {cluster.zookeeper_chroot}")
