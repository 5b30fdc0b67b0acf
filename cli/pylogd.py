"""`pylogd`: start a pylog broker (the supervisor, its workers and, by default, a private
ZooKeeper). Every setting of the TOML file is also a flag: `[log] flush_messages` is
`--log-flush-messages`; flags win over the file.

Exit codes: 0 after a clean shutdown (SIGTERM / SIGINT), 2 for a bad configuration, 1 when the
broker cannot start (port taken, ZooKeeper unreachable, a log dir that cannot be used) or
when its private ZooKeeper cannot be started again (after a clean shutdown); the reason is the
last line on stderr.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from broker.config import SETTINGS, load_config
from broker.errors import PylogError, ZooKeeperStartError
from broker.logs import configure_logging
from broker.supervisor import run_pylogd

EXIT_CANNOT_START = 1


def _setting_options(command: Callable[..., Any]) -> Callable[..., Any]:
    for setting in reversed(SETTINGS):
        default = "none" if setting.default is None else setting.default
        if setting.kind is list:
            default = ",".join(setting.default) or "-"
        command = click.option(
            setting.flag,
            setting.name,
            default=None,
            metavar="LIST" if setting.kind is list else setting.kind.__name__.upper(),
            help=f"[{setting.section}] {setting.key}: {setting.help} (default: {default})",
        )(command)
    return command


@click.command(context_settings={"max_content_width": 100})
@click.option(
    "--config",
    "config_path",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="TOML settings file (deploy/pylogd.toml is a commented example).",
)
@click.option("-v", "--verbose", is_flag=True, help="Log debug messages too.")
@_setting_options
@click.version_option(package_name="pylog")
def main(config_path: Path | None, verbose: bool, **flags: str | None) -> None:
    """Run a pylog broker until SIGTERM or SIGINT."""
    overrides = {name: value for name, value in flags.items() if value is not None}
    if verbose:
        overrides["broker_log_level"] = "debug"
    try:
        config = load_config(config_path, overrides)
    except ValueError as error:
        raise click.UsageError(str(error)) from error
    configure_logging(config.broker_log_format, config.broker_log_level)
    try:
        code = run_pylogd(config)
    except ZooKeeperStartError as error:  # at start, or later after failed restarts
        click.echo(f"pylogd: {error}", err=True)
        sys.exit(EXIT_CANNOT_START)
    except (PylogError, OSError) as error:
        click.echo(f"pylogd: cannot start: {error}", err=True)
        sys.exit(EXIT_CANNOT_START)
    sys.exit(code)
