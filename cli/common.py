"""What pylogctl's commands share: the broker options (the Curve keys among them) and error
handling, and how messages are printed.

Exit codes: 0 success (Ctrl-C ends a long-running command with 0 too), 1 the data checked is
corrupt, or the broker answered with an error or could not be reached, 2 bad usage (a bad
--broker address among them) or a path that cannot be used. Errors are one line on stderr,
`pylogctl: ...`, naming the problem and what to do.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import re
import sys
from collections.abc import Callable, Iterable, Iterator
from typing import Final, NoReturn, TypeVar

import click
from click.core import ParameterSource
from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TextColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)

from broker.client.cluster import split_endpoints
from broker.client.consumer import Start
from broker.client.framing import DEFAULT_CLIENT_ID
from broker.client.records import Record
from broker.errors import BrokerError, PylogError, RegistryAccessDenied, Unavailable
from broker.log.message import Message
from broker.security import ClientKeys, KeyFileError
from cli.pipeline_commands import JOBS

PREVIEW_BYTES = 40
EXIT_CORRUPT = 1
EXIT_BROKER = 1
EXIT_USAGE = 2
DEFAULT_BROKER = "tcp://127.0.0.1:9092"
CLI_RETRIES = 0
"""Retries of a retriable error or a lost reply: none, so an unreachable broker is reported
after one --timeout period, the total the user waits."""

F = TypeVar("F", bound=Callable[..., object])


def text(data: bytes | None, limit: int | None = None) -> str | None:
    if data is None:
        return None
    shown = data if limit is None else data[:limit]
    text = shown.decode("utf-8", "backslashreplace")
    return text + "..." if limit is not None and len(data) > limit else text


def message_record(message: Message) -> dict[str, object]:
    return {
        "offset": message.offset,
        "size": message.size,
        "timestamp_ms": message.timestamp_ms,
        "key": text(message.key),
        "value_size": len(message.value),
        "value_preview": text(message.value, PREVIEW_BYTES),
        "headers": [[k, text(v)] for k, v in message.headers],
        "checksum_ok": message.checksum_ok,
    }


def timestamp(ms: int) -> str:
    try:
        return datetime.datetime.fromtimestamp(ms / 1000, datetime.UTC).isoformat(
            timespec="milliseconds"
        )
    except (OverflowError, ValueError, OSError):
        return f"{ms}ms"


def usage_error(message: str) -> NoReturn:
    """`pylogctl: message` on stderr, exit 2 (click's own usage errors take three lines)."""
    click.echo(f"pylogctl: {message}", err=True)
    sys.exit(EXIT_USAGE)


_GIVEN_FIRST: Final = "pylog.given_first"
"""Where the root command leaves the --broker and --json given before the subcommand (click's
Context.meta, which every subcommand's context shares): global_options."""
_KEY_OPTIONS: Final = "pylog.key_options"
"""--key-file and --broker-key as given (before or after the subcommand, or in the
environment), until client_keys loads them."""
BROKER_HELP: Final = (
    "The broker's address, HOST:PORT or tcp://HOST:PORT; several, comma-separated, for when "
    "one is down (env PYLOG_BROKER)."
)


def _normalized(value: str) -> str:
    """--broker as tcp://HOST:PORT[,...]; a bad address is a one-line usage error at once."""
    try:
        return ",".join(split_endpoints(value))
    except ValueError as error:
        usage_error(f"--broker {value!r}: {error}")


def _broker_address(ctx: click.Context, param: click.Parameter, value: str) -> str:
    """The command's --broker: as given after the command, else as given before it (which
    beats $PYLOG_BROKER), else $PYLOG_BROKER or the default."""
    assert param.name is not None
    if ctx.get_parameter_source(param.name) is not ParameterSource.COMMANDLINE:
        value = ctx.meta.get(_GIVEN_FIRST, {}).get("broker", value)
    return _normalized(value)


def _given_first(ctx: click.Context, param: click.Parameter, value: object) -> None:
    """Keep a global option given before the subcommand for the subcommand's own."""
    if value is not None and value is not False:
        assert param.name is not None
        given = _normalized(str(value)) if param.name == "broker" else value
        ctx.meta.setdefault(_GIVEN_FIRST, {})[param.name] = given


def _json(ctx: click.Context, param: click.Parameter, value: bool) -> bool:
    return value or bool(ctx.meta.get(_GIVEN_FIRST, {}).get("json"))


def json_option(help: str) -> Callable[[F], F]:
    """--json (helped by `help`), on for the command when given before it too."""
    return click.option("--json", "as_json", is_flag=True, callback=_json, help=help)


def _key_option(ctx: click.Context, param: click.Parameter, value: str | None) -> None:
    """--key-file or --broker-key as given after the command (or before it, or in the
    environment, for the root's): kept for client_keys."""
    if value is not None:
        assert param.name is not None
        ctx.meta.setdefault(_KEY_OPTIONS, {})[param.name] = value


_KEY_FLAGS: Final = (
    (
        "--key-file",
        "PATH",
        "PYLOG_KEY_FILE",
        "This client's secret key file (NAME.key_secret, mode 0600, from pylogctl keys "
        "generate), for a broker serving CurveZMQ (env PYLOG_KEY_FILE); with --broker-key.",
    ),
    (
        "--broker-key",
        "KEY|PATH",
        "PYLOG_BROKER_KEY",
        "The broker's public key, its 40 Z85 characters or the path of its .key file "
        "(env PYLOG_BROKER_KEY); with --key-file.",
    ),
)


def _key_options(root: bool) -> Callable[[F], F]:
    """--key-file and --broker-key: the root's read their environment variables and are
    passed to it (remember_keys); a command's are kept for client_keys when given."""

    def decorate(command: F) -> F:
        for flag, metavar, envvar, help in reversed(_KEY_FLAGS):
            command = click.option(
                flag,
                envvar=envvar if root else None,
                metavar=metavar,
                expose_value=root,
                callback=None if root else _key_option,
                help=help,
            )(command)
        return command

    return decorate


def broker_options(command: F) -> F:
    """--broker or -b (or $PYLOG_BROKER), --timeout, and the key options, on every command
    that talks to a broker. --broker, --json and the key options may come before the command
    too (global_options); given after it, they win."""
    command = _key_options(root=False)(command)
    command = click.option(
        "--timeout",
        type=click.FloatRange(min=0, min_open=True),
        default=5.0,
        show_default=True,
        help="Seconds to wait for the broker to answer before giving it up as unreachable: "
        "the whole wait when it does not answer.",
    )(command)
    return click.option(
        "-b",
        "--broker",
        envvar="PYLOG_BROKER",
        default=DEFAULT_BROKER,
        show_default=True,
        callback=_broker_address,
        help=BROKER_HELP,
    )(command)


def global_options(command: F) -> F:
    """pylogctl's options before the command: --broker or -b and --json, taken by the
    command as if given after it (the command's own win), and --key-file and --broker-key
    (or their environment variables: see remember_keys)."""
    command = _key_options(root=True)(command)
    command = click.option(
        "--json",
        is_flag=True,
        expose_value=False,
        callback=_given_first,
        help="JSON output, for every command that has it.",
    )(command)
    return click.option(
        "-b",
        "--broker",
        metavar="TEXT",
        expose_value=False,
        callback=_given_first,
        help=BROKER_HELP,
    )(command)


def log_options(command: F) -> F:
    """--log-format and -v/--verbose, on the programs that run until stopped (pylog-mirror,
    pylog-console): their logs as text or JSON, debug included or not."""
    command = click.option("-v", "--verbose", is_flag=True, help="Log debug messages too.")(command)
    return click.option(
        "--log-format",
        type=click.Choice(["text", "json"]),
        default="text",
        show_default=True,
        help="Log lines as text or as JSON objects (for journald and log shippers).",
    )(command)


def watch_options(watch_help: str) -> Callable[[F], F]:
    """--watch (helped by `watch_help`) and --interval, the seconds between its rounds."""

    def decorate(command: F) -> F:
        command = click.option(
            "--interval",
            type=click.FloatRange(min=0.1),
            default=2.0,
            show_default=True,
            help="Seconds between rounds, with --watch.",
        )(command)
        return click.option("--watch", is_flag=True, help=watch_help)(command)

    return decorate


_KEYS: Final = "pylog.client_keys"
"""Where client_keys keeps the keys it loaded (click's Context.meta)."""


def remember_keys(ctx: click.Context, key_file: str | None, broker_key: str | None) -> None:
    """Keep the root's --key-file and --broker-key (or their environment variables) for the
    command, which may give its own after it (client_keys reads the files when a command
    talks to a broker, so that a command that does not, such as pylogctl keys generate,
    works with them set in the environment). The Spark jobs (pylogctl load, audit) take them
    as their own --key-file and --broker-key."""
    for name, value in (("key_file", key_file), ("broker_key", broker_key)):
        if value is not None:
            ctx.meta.setdefault(_KEY_OPTIONS, {})[name] = value
    if key_file is not None and broker_key is not None:
        ctx.default_map = {
            **(ctx.default_map or {}),
            **{job: {"key_file": key_file, "broker_key": broker_key} for job in JOBS},
        }


def client_keys() -> ClientKeys | None:
    """The keys that --key-file and --broker-key name (None without them), read on first use;
    one without the other is a usage error, and so is a file that cannot be used (missing,
    malformed, readable by others): one line, exit 2."""
    ctx = click.get_current_context()
    loaded = ctx.meta.get(_KEYS)
    if loaded is not None:
        assert isinstance(loaded, ClientKeys)
        return loaded
    options = ctx.meta.get(_KEY_OPTIONS, {})
    key_file, broker_key = options.get("key_file"), options.get("broker_key")
    if key_file is None and broker_key is None:
        return None
    if key_file is None or broker_key is None:
        given, missing = (
            ("--key-file", "--broker-key") if key_file else ("--broker-key", "--key-file")
        )
        usage_error(
            f"{given} needs {missing} too: a Curve client presents its own key pair and "
            "checks the broker's public key"
        )
    try:
        keys = ClientKeys.load(key_file, broker_key)
    except KeyFileError as error:
        usage_error(str(error))
    ctx.meta[_KEYS] = keys
    return keys


@contextlib.contextmanager
def until_interrupted() -> Iterator[None]:
    """Ctrl-C (SIGINT) ends the block quietly, and the command goes on as if its work had
    ended (then exits 0): click would print "Aborted!" and exit 1."""
    with contextlib.suppress(KeyboardInterrupt):
        yield


def say_none(what: str) -> None:
    """An empty listing says so ("no topics"), on stderr: stdout stays the listing, empty, for
    scripts (--json prints nothing)."""
    click.echo(f"no {what}", err=True)


ZOOKEEPER_AUTH_META = "pylog.zookeeper_auth"
"""Where --zookeeper-auth-file's identity is kept in the command's context (click's meta)."""


@contextlib.contextmanager
def broker_errors(broker: str, what: str = "broker") -> Iterator[None]:
    """Turn what the broker answered, or its silence, into `pylogctl: ...` and exit 1
    (`what` names the server at `broker` in the message: "broker", "ZooKeeper")."""
    try:
        yield
    except BrokerError as error:
        click.echo(f"pylogctl: {error.name}: {error.message}", err=True)
        sys.exit(EXIT_BROKER)
    except Unavailable as error:
        click.echo(f"pylogctl: {what} {broker} unreachable: {error}", err=True)
        sys.exit(EXIT_BROKER)
    except RegistryAccessDenied as error:
        given = click.get_current_context().meta.get(ZOOKEEPER_AUTH_META) is not None
        needed = (
            "the identity of --zookeeper-auth-file may not make it (docs/security.md)"
            if given
            else "the registry has ACLs: give the cluster's ZooKeeper identity, "
            "--zookeeper-auth-file FILE (or PYLOG_ZOOKEEPER_AUTH_FILE; docs/security.md)"
        )
        click.echo(f"pylogctl: RegistryAccessDenied: {error}: {needed}", err=True)
        sys.exit(EXIT_BROKER)
    except PylogError as error:
        click.echo(f"pylogctl: {type(error).__name__}: {error}", err=True)
        sys.exit(EXIT_BROKER)


@contextlib.contextmanager
def progress(description: str, total_bytes: int | None) -> Iterator[Callable[[int], None]]:
    """A progress bar of bytes done out of `total_bytes` on stderr while the block runs, when
    stderr is a terminal (nothing when it is not, piped or a file, nor when the total is not
    known); yields the function to call with each count of bytes done. The bar is wiped when
    the block ends, so the terminal keeps only the command's own output."""
    if total_bytes is None or not sys.stderr.isatty():
        yield lambda done: None
        return
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        TimeRemainingColumn(),
        console=Console(stderr=True),
        transient=True,
        redirect_stdout=sys.stdout.isatty(),  # lines printed meanwhile go above the bar
        redirect_stderr=False,
    ) as bar:
        task = bar.add_task(description, total=total_bytes)
        yield lambda done: bar.advance(task, done)


def config_pair(
    ctx: click.Context, param: click.Parameter, pairs: tuple[str, ...]
) -> dict[str, str]:
    config: dict[str, str] = {}
    for pair in pairs:
        key, separator, value = pair.partition("=")
        if not separator or not key:
            raise click.BadParameter(f"{pair!r} is not KEY=VALUE", ctx, param)
        config[key] = value
    return config


def client_id_option(command: F) -> F:
    """--client-id, on the commands that produce and consume: the client id the brokers see
    (their logs, and on a plaintext broker the client quotas: `pylogctl quota`)."""
    return click.option(
        "--client-id",
        default=DEFAULT_CLIENT_ID,
        show_default=True,
        help="The client id the brokers see: their logs, and on a plaintext broker the quota "
        "that holds this client (pylogctl quota set --client ID).",
    )(command)


def skip_corrupt_option(command: F) -> F:
    """--skip-corrupt, on the commands that consume."""
    return click.option(
        "--skip-corrupt",
        is_flag=True,
        help="Read past damaged data on the broker's disk, naming each range skipped on stderr "
        "(without it, damaged data stops the command with exit code 1).",
    )(command)


_FIELDS: dict[str, Callable[[Record], object]] = {
    "k": lambda r: text(r.key) or "",
    "v": lambda r: text(r.value),
    "p": lambda r: r.partition,
    "o": lambda r: r.offset,
    "T": lambda r: r.timestamp_ms,
    "t": lambda r: r.topic,
    "s": lambda r: len(r.value),
    "h": lambda r: ",".join(k if v is None else f"{k}={text(v)}" for k, v in r.headers),
}
_FORMAT_PART = re.compile(r"%(.)|\\(.)|[^%\\]+|(.)", re.DOTALL)
_ESCAPES = {"n": "\n", "t": "\t", "\\": "\\"}


def _format_parts(output: str) -> list[str | Callable[[Record], object]]:
    """A format string as text and fields to print in turn; BadParameter for a % or \\ that
    is not one of those documented in output_options."""
    parts: list[str | Callable[[Record], object]] = []
    for match in _FORMAT_PART.finditer(output):
        field, escape, lone = match.groups()
        if field is not None and (field in _FIELDS or field == "%"):
            parts.append(_FIELDS.get(field, "%"))
        elif escape is not None and escape in _ESCAPES:
            parts.append(_ESCAPES[escape])
        elif field is None and escape is None and lone is None:
            parts.append(match[0])
        else:
            raise click.BadParameter(
                f"{match[0]!r} in {output!r} is not a field (%k %v %p %o %T %t %s %h %%) nor an "
                "escape (\\n \\t \\\\)",
                param_hint="--format",
            )
    return parts


def _output_format(ctx: click.Context, param: click.Parameter, output: str) -> str:
    if output not in ("text", "json"):
        _format_parts(output)
    return output


def output_options(command: F) -> F:
    """--max-messages and --format, on the commands that print consumed messages."""
    command = click.option(
        "--format",
        "output",
        default="text",
        show_default=True,
        callback=_output_format,
        metavar="text|json|FORMAT",
        help="text: each message on a line, its key and a tab before the value when it has a "
        "key; json: an object a line (topic, partition, offset, timestamp, key, value, headers "
        "as [key, value] pairs); or a FORMAT after kcat's -f: %k key, %v value, %p partition, "
        "%o offset, %T timestamp (ms), %t topic, %s value size (bytes), %h headers "
        "(key=value,... ; a key alone for a null value), %% a %, \\n newline, \\t tab (put "
        "\\n where a message ends).",
    )(command)
    return click.option("--max-messages", type=click.IntRange(min=1), help="Exit after this many.")(
        command
    )


def print_messages(records: Iterable[Record], output: str, max_messages: int | None) -> None:
    """Print `records` (as --format says) until exhausted or `max_messages` were printed."""
    parts = None if output in ("text", "json") else _format_parts(output)
    for count, record in enumerate(records, 1):
        if parts is not None:
            click.echo(
                "".join(p if isinstance(p, str) else str(p(record)) for p in parts), nl=False
            )
        elif output == "json":
            line = {
                "topic": record.topic,
                "partition": record.partition,
                "offset": record.offset,
                "timestamp": record.timestamp_ms,
                "key": text(record.key),
                "value": text(record.value),
                "headers": [[k, text(v)] for k, v in record.headers],
            }
            click.echo(json.dumps(line))
        elif record.key is None:
            click.echo(text(record.value))
        else:
            click.echo(f"{text(record.key)}\t{text(record.value)}")
        if max_messages is not None and count >= max_messages:
            return


def position(
    text: str, option: str, choices: str = "earliest, latest, an offset or an ISO time"
) -> Start:
    """Where to read or reset to, as an option gives it: earliest, latest, an offset (a byte
    position), or an ISO time (UTC unless it says otherwise); a usage error naming `option`
    and the `choices` otherwise."""
    if text in ("earliest", "latest"):
        return "earliest" if text == "earliest" else "latest"
    if text.isdigit():
        return int(text)
    try:
        return datetime.datetime.fromisoformat(text)
    except ValueError:
        raise click.BadParameter(f"{text!r}: use {choices}", param_hint=option) from None
