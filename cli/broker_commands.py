"""`pylogctl broker`: the brokers of the cluster."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, TypeVar

import click

from broker.client import Admin
from broker.config import LIVE_SETTINGS, setting_name
from broker.registry.settings import DEFAULT
from cli.common import (
    CLI_RETRIES,
    broker_errors,
    broker_options,
    client_keys,
    json_option,
    usage_error,
)
from cli.group_commands import admin_options, fail, open_registry

F = TypeVar("F", bound=Callable[..., Any])


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


@broker.group("config")
def broker_config() -> None:
    """Broker settings changed live, through ZooKeeper, for every broker or one: the topics'
    defaults ([log] flush_messages, retention_ms, ...), how often retention runs, flow
    control's ceilings, the log level. Every other setting is read at start only (pylogd.toml,
    whose comments say which are live)."""


def entry_option(command: F) -> F:
    return click.option(
        "--broker-id",
        type=click.IntRange(min=0),
        help="Only this broker (its own settings win over those for every broker); default: "
        "every broker.",
    )(command)


@broker_config.command("set")
@click.argument("pairs", nargs=-1, required=True, metavar="NAME=VALUE...")
@entry_option
@admin_options
def broker_config_set(
    pairs: tuple[str, ...],
    broker_id: int | None,
    zookeeper: str | None,
    chroot: str | None,
    broker: str,
    timeout: float,
    as_json: bool,
) -> None:
    """Set live settings (NAME as pylogd.toml names it, section.key): every broker (or the
    one of --broker-id) applies them within a second, over its file and flags, and keeps them
    through restarts.

    \b
    Examples:
      pylogctl broker config set log.retention_ms=86400000 log.flush_interval_ms=200
      pylogctl broker config set broker.log_level=debug --broker-id 2"""
    changes: dict[str, str] = {}
    for pair in pairs:
        name, equals, value = pair.partition("=")
        if not equals or not name:
            usage_error(f"{pair!r}: give NAME=VALUE, as log.retention_ms=86400000")
        changes[name] = value
    entry = DEFAULT if broker_id is None else str(broker_id)
    with open_registry(zookeeper, chroot, broker, timeout) as registry:
        try:
            stored = registry.settings.set(entry, changes)
        except ValueError as error:
            usage_error(str(error))
    _say_entry(entry, stored, as_json)


@broker_config.command("delete")
@click.argument("names", nargs=-1, metavar="[NAME...]")
@entry_option
@admin_options
def broker_config_delete(
    names: tuple[str, ...],
    broker_id: int | None,
    zookeeper: str | None,
    chroot: str | None,
    broker: str,
    timeout: float,
    as_json: bool,
) -> None:
    """Take live settings away (all of the entry's without NAME): the brokers go back to their
    file's and flags' values within a second.

    \b
    Example:
      pylogctl broker config delete log.flush_interval_ms"""
    entry = DEFAULT if broker_id is None else str(broker_id)
    with open_registry(zookeeper, chroot, broker, timeout) as registry:
        try:
            left = registry.settings.delete(entry, names)
        except KeyError as error:
            name, whom = error.args[0], _entry_text(entry)
            fail(f"{name} is not set for {whom}: pylogctl broker config describe shows what is")
    _say_entry(entry, left, as_json)


@broker_config.command("describe")
@admin_options
def broker_config_describe(
    zookeeper: str | None, chroot: str | None, broker: str, timeout: float, as_json: bool
) -> None:
    """Print the live settings set in ZooKeeper, for every broker and for each one; then every
    setting that can be changed live (the others are read at start only).

    \b
    Examples:
      $ pylogctl broker config describe
      every broker: log.retention_ms=86400000
      broker 2: broker.log_level=debug
      live settings: broker.log_level, broker.queued_reply_bytes, ...
      $ pylogctl broker config describe --json
      {"broker": null, "settings": {"log.retention_ms": "86400000"}}
      {"broker": 2, "settings": {"broker.log_level": "debug"}}"""
    with open_registry(zookeeper, chroot, broker, timeout) as registry:
        node = registry.settings.read()
    entries = sorted(node, key=lambda e: (e != DEFAULT, int(e) if e.isdecimal() else -1))
    if as_json:
        for entry in entries:
            click.echo(json.dumps({"broker": _entry_json(entry), "settings": node[entry]}))
        return
    for entry in entries:
        for name, value in sorted(node[entry].items()):
            click.echo(f"{_entry_text(entry)}: {name}={value}")
    if not entries:
        click.echo("no live settings set: every broker uses its file's and flags'")
    live = ", ".join(sorted(setting_name(name) for name in LIVE_SETTINGS))
    click.echo(f"live settings: {live}")


def _entry_text(entry: str) -> str:
    return "every broker" if entry == DEFAULT else f"broker {entry}"


def _entry_json(entry: str) -> int | None:
    return None if entry == DEFAULT else int(entry)


def _say_entry(entry: str, settings: dict[str, str], as_json: bool) -> None:
    if as_json:
        click.echo(json.dumps({"broker": _entry_json(entry), "settings": settings}))
        return
    text = ", ".join(f"{k}={v}" for k, v in sorted(settings.items())) or "none"
    click.echo(f"live settings of {_entry_text(entry)}: {text}")
