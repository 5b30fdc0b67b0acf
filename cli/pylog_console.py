"""`pylog-console`: a web console for operators, serving the cluster's brokers, topics,
groups and their lag, messages, mirrors, quotas and live settings (docs/console.md), until
SIGTERM or SIGINT; deploy/systemd/pylog-console.service runs it.

Exit codes: 0 after SIGTERM / SIGINT, 2 for options that cannot be used (bound beyond this
machine without a token among them), 1 when it cannot start (its port taken); the reason is the
last line on stderr.
"""

from __future__ import annotations

import contextlib
import signal
import socket
import sys
from collections.abc import Iterator
from pathlib import Path

import click
import uvicorn

from broker.logs import configure_logging
from broker.security import KeyFileError
from broker.security.keys import check_private
from cli.common import client_keys, log_options, usage_error
from cli.group_commands import zookeeper_auth, zookeeper_options
from cli.web.app import Console, Settings, is_loopback
from cli.web.reads import Reads, Target

EXIT_CANNOT_START = 1
DEFAULT_PORT = 9180


class _Server(uvicorn.Server):
    """uvicorn's server, saying on stdout where it serves once its socket listens, and
    exiting 0 after SIGTERM or SIGINT, as pylogd does (uvicorn raises the signal again once
    it has shut down, which kills the process by it)."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        """uvicorn's handler of SIGINT and SIGTERM (a graceful shutdown), not raised again."""
        signals = (signal.SIGINT, signal.SIGTERM)
        previous = {signum: signal.signal(signum, self.handle_exit) for signum in signals}
        try:
            yield
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if self.started:
            host, port = self.servers[0].sockets[0].getsockname()[:2]
            shown = f"[{host}]" if ":" in host else host
            click.echo(f"pylog-console ready on http://{shown}:{port}")


def _token(path: Path | None) -> str | None:
    if path is None:
        return None
    try:
        check_private(path)
        token = path.read_text().strip()
    except (KeyFileError, OSError, UnicodeDecodeError) as error:
        usage_error(f"--token-file: {error}")
    if len(token) < 16 or any(c.isspace() for c in token):
        usage_error(f"--token-file: {path} must hold one token of 16 or more characters")
    return token


@click.command(context_settings={"max_content_width": 100})
@click.option(
    "--host",
    default="127.0.0.1",
    show_default=True,
    help="The address to serve on. Any but a loopback address needs --token-file.",
)
@click.option(
    "--port",
    type=click.IntRange(0, 65535),
    default=DEFAULT_PORT,
    show_default=True,
    help="The port to serve on (0: a free one, said on the ready line).",
)
@click.option(
    "--token-file",
    envvar="PYLOG_CONSOLE_TOKEN_FILE",
    type=click.Path(dir_okay=False, path_type=Path),
    help="A file (mode 0600) of one token of 16 or more characters: the browser logs in with "
    "any user name and the token as its password (env PYLOG_CONSOLE_TOKEN_FILE).",
)
@click.option(
    "--mirror-config",
    "mirror_configs",
    multiple=True,
    type=click.Path(dir_okay=False, path_type=Path),
    help="A mirror's file (pylog-mirror --config): its lag is shown on the Mirrors page. "
    "Repeat for more.",
)
@click.option(
    "--allow-changes",
    is_flag=True,
    help="Let the settings page change quotas and live broker settings (each change logged "
    "with its author). Read-only without it.",
)
@click.option(
    "--refresh",
    type=click.FloatRange(min=1),
    default=5.0,
    show_default=True,
    help="Seconds between a page's live updates.",
)
@click.option(
    "--page-timeout",
    type=click.FloatRange(min=1),
    default=15.0,
    show_default=True,
    help="Seconds a page waits for the cluster before showing that it did not answer.",
)
@click.option(
    "--history-interval",
    type=click.FloatRange(min=0),
    default=30.0,
    show_default=True,
    help="Seconds between samples of a watched group's lag (for its chart; 0: only when its "
    "page is read).",
)
@log_options
@zookeeper_options
@click.version_option(package_name="pylog")
def main(
    host: str,
    port: int,
    token_file: Path | None,
    mirror_configs: tuple[Path, ...],
    allow_changes: bool,
    refresh: float,
    page_timeout: float,
    history_interval: float,
    log_format: str,
    verbose: bool,
    zookeeper: str | None,
    chroot: str | None,
    broker: str,
    timeout: float,
) -> None:
    """Serve a web console of the cluster that --broker belongs to, on 127.0.0.1:9180 by
    default: brokers and health, topics and partitions, consumer groups with their lag,
    messages page by page, mirrors, quotas and live settings, updated live. Read-only unless
    --allow-changes.

    \b
    Examples:
      pylog-console --broker 127.0.0.1:9092
      pylog-console -b 10.0.0.7:9092 --key-file ops.key_secret --broker-key broker.key \\
          --host 0.0.0.0 --token-file /etc/pylog/console.token"""
    token = _token(token_file)
    if token is None and not is_loopback(host):
        usage_error(
            f"--host {host}: serving beyond this machine needs a login: give --token-file "
            "(docs/console.md, Security)"
        )
    configure_logging(log_format, "debug" if verbose else "info", "pylog-console")
    target = Target(
        broker, timeout, client_keys(), zookeeper, chroot, zookeeper_auth(), mirror_configs
    )
    settings = Settings(refresh, page_timeout, history_interval, allow_changes, token)
    console = Console(Reads(target), settings)
    config = uvicorn.Config(
        console.app(),
        host=host,
        port=port,
        log_level="debug" if verbose else "warning",
        timeout_graceful_shutdown=5,
        server_header=False,
    )
    try:
        _Server(config).run()
    except SystemExit:  # uvicorn's, when it cannot listen, after logging why (a port taken)
        click.echo(f"pylog-console: cannot start: cannot listen on {host}:{port}", err=True)
        sys.exit(EXIT_CANNOT_START)
