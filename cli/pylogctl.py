"""`pylogctl`: the admin command line of pylog.

Exit codes: 0 success, 1 the data checked is corrupt, or the broker answered with an error or
could not be reached, 2 bad usage or a path that cannot be used.
"""

from __future__ import annotations

import click

from cli.broker_commands import broker
from cli.console import consume, produce
from cli.group_commands import group
from cli.log_commands import log
from cli.topic_commands import topic


@click.group()
@click.version_option(package_name="pylog")
def cli() -> None:
    """Administer pylog brokers and their data."""


for command in (log, topic, broker, produce, consume, group):
    cli.add_command(command)


def main() -> None:
    cli()
