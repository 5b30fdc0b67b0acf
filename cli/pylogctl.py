"""`pylogctl`: the admin command line of pylog.

Exit codes: 0 success (Ctrl-C, or SIGTERM, ends a long-running command with 0 too), 1 the
data checked is corrupt, or the broker answered with an error or could not be reached, 2 bad
usage or a path that cannot be used (cli/common.py).
"""

from __future__ import annotations

import logging
import signal

import click

from broker.client.framing import THROTTLE_LOGGER
from cli.broker_commands import broker
from cli.cluster_commands import cluster
from cli.common import global_options, remember_keys
from cli.console import consume, produce
from cli.group_commands import group
from cli.log_commands import log
from cli.mirror_commands import mirror
from cli.partition_commands import add_partitions
from cli.pipeline_commands import WithJobs
from cli.quota_commands import quota
from cli.reassign_commands import elect_preferred, reassign
from cli.records_commands import delete_records
from cli.security_commands import acl, keys, principal
from cli.topic_commands import topic

_LEVELS = {0: logging.CRITICAL + 1, 1: logging.WARNING, 2: logging.INFO}


@click.group(cls=WithJobs)
@click.version_option(package_name="pylog")
@click.option(
    "-v",
    "--verbose",
    count=True,
    help="Show the logs of pylog's client and its libraries (kazoo, ...) on stderr: -v "
    "warnings, -vv information, -vvv everything.",
)
@global_options
@click.pass_context
def cli(ctx: click.Context, verbose: int, key_file: str | None, broker_key: str | None) -> None:
    """Administer pylog brokers and their data.

    --broker (-b), --json and the key options may be given before the command or after it
    (after it, they win): pylogctl -b 10.0.0.7:9092 topic list is topic list -b 10.0.0.7:9092.
    A broker serving CurveZMQ is reached with --key-file and --broker-key (or
    $PYLOG_KEY_FILE and $PYLOG_BROKER_KEY):
    pylogctl --key-file alice.key_secret --broker-key broker.key topic list."""
    _quiet_libraries(ctx, verbose)
    remember_keys(ctx, key_file, broker_key)


def _quiet_libraries(ctx: click.Context, verbose: int) -> None:
    """Without -v no library logs a line (kazoo logs every failed attempt to reach
    ZooKeeper): errors reach the user as the one `pylogctl: ...` line of the command; but that
    a broker slowed this client for its quota is said (`pylogctl: the broker held a request
    back ...`, at most every 10 s: broker.client.connection.noted). The loggers are put back
    as they were when the command ends (tests run commands in-process)."""
    root = logging.getLogger()
    previous = root.level
    if not verbose:
        _say_throttling(ctx)
    if verbose and not root.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("pylogctl: %(levelname)s %(name)s: %(message)s"))
        root.addHandler(handler)
        ctx.call_on_close(lambda: root.removeHandler(handler))
    root.setLevel(_LEVELS.get(verbose, logging.DEBUG))
    ctx.call_on_close(lambda: root.setLevel(previous))


def _say_throttling(ctx: click.Context) -> None:
    """The client's quota warnings on stderr, as `pylogctl: ...` lines, for this command."""
    throttling = logging.getLogger(THROTTLE_LOGGER)
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("pylogctl: %(message)s"))
    handler.setLevel(logging.WARNING)
    throttling.addHandler(handler)
    level, propagate = throttling.level, throttling.propagate
    throttling.setLevel(logging.WARNING)
    throttling.propagate = False

    def put_back() -> None:
        throttling.removeHandler(handler)
        throttling.setLevel(level)
        throttling.propagate = propagate

    ctx.call_on_close(put_back)


for command in (
    *(log, topic, broker, cluster, produce, consume, group),
    *(keys, principal, acl, quota, mirror),
):
    cli.add_command(command)
topic.add_command(reassign)  # they speak to the controller through ZooKeeper, as group does
topic.add_command(elect_preferred)
topic.add_command(add_partitions)
topic.add_command(delete_records)


def main() -> None:
    _interruptible()
    cli()


def _interruptible() -> None:
    """SIGINT and SIGTERM end pylogctl as Ctrl-C does (KeyboardInterrupt: a long-running
    command stops quietly with exit 0), whatever dispositions it inherited: a background job
    of a script or nohup starts with SIGINT ignored, and Python then installs no handler for
    it, so `consume --follow` could be stopped by SIGKILL only; SIGTERM killed it without
    its ending. A command may still take them for itself (group consume commits first)."""
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, signal.default_int_handler)
