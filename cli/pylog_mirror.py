"""`pylog-mirror`: copy topics of one pylog cluster to another, at the same offsets, until
SIGTERM or SIGINT (docs/mirror.md). deploy/pylog-mirror.toml is a commented example of its
file; deploy/systemd/pylog-mirror.service runs it.

Exit codes: 0 after SIGTERM / SIGINT, 2 for a configuration that cannot be used, 1 when it
cannot start (its metrics port taken); the reason is the last line on stderr.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
from pathlib import Path

import click

from broker.logs import configure_logging
from broker.metrics import serve_collector
from broker.mirror import Mirror, MirrorCollector, MirrorConfig, MirrorConfigError
from broker.mirror.mirror import log as MIRROR_LOG
from cli.common import log_options

EXIT_CANNOT_START = 1


@click.command(context_settings={"max_content_width": 100})
@click.option(
    "--config",
    "config_path",
    required=True,
    type=click.Path(dir_okay=False, path_type=Path),
    help="The TOML file: [source], [target], [mirror] (deploy/pylog-mirror.toml).",
)
@log_options
@click.version_option(package_name="pylog")
def main(config_path: Path, log_format: str, verbose: bool) -> None:
    """Copy the topics named in the file's [mirror] topics from [source] to [target], each
    partition's bytes at the source's offsets, and new matching topics as they come, until
    SIGTERM or SIGINT. A line of progress a minute.

    \b
    Example:
      pylog-mirror --config /etc/pylog/mirror.toml"""
    try:
        config = MirrorConfig.load(config_path)
    except MirrorConfigError as error:
        raise click.UsageError(str(error)) from error
    configure_logging(log_format, "debug" if verbose else "info", "pylog-mirror")
    mirror = Mirror(config)
    settings = config.mirror
    if settings.metrics_port is not None:
        try:
            collector = MirrorCollector(mirror)
            serve_collector(collector, settings.metrics_host, settings.metrics_port, MIRROR_LOG)
        except OSError as error:
            click.echo(f"pylog-mirror: cannot start: {error}", err=True)
            sys.exit(EXIT_CANNOT_START)
    asyncio.run(_until_signalled(mirror))


async def _until_signalled(mirror: Mirror) -> None:
    task = asyncio.ensure_future(mirror.run())
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, task.cancel)
    with contextlib.suppress(asyncio.CancelledError):  # SIGTERM / SIGINT: a clean stop
        await task
