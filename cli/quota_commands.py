"""`pylogctl quota`: byte-rate quotas per principal (curve brokers) or client id (plaintext),
kept in ZooKeeper (broker.registry.quotas), where every broker watches them: a change applies
within a second, with no restart. A client over its quota is slowed, never refused
(docs/protocol.md, "Quotas")."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any, Final, TypeVar

import click

from broker.quotas import DEFAULT, Direction, Kind, Quota, QuotaConfig
from broker.registry.quotas import check_quota_name
from cli.common import usage_error
from cli.group_commands import admin_options, fail, open_registry, table

F = TypeVar("F", bound=Callable[..., Any])

_UNITS: Final = {
    "": 1,
    "b": 1,
    "k": 1000,
    "kb": 1000,
    "kib": 1 << 10,
    "m": 1000**2,
    "mb": 1000**2,
    "mib": 1 << 20,
    "g": 1000**3,
    "gb": 1000**3,
    "gib": 1 << 30,
}
_RATE: Final = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*(?:/s)?\s*")


class ByteRate(click.ParamType[int]):
    """Bytes a second: 1048576, 1MiB, 1MB (10^6), 512KiB, 2.5MiB; "/s" may follow."""

    name = "BYTES/S"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        if isinstance(value, int):
            return value
        match = _RATE.fullmatch(str(value))
        unit = _UNITS.get(match.group(2).lower()) if match else None
        if match is None or unit is None:
            self.fail(
                f"{value!r} is not a rate: bytes a second, as 1048576, 1MiB, 1MB or 512KiB", param
            )
        rate = int(float(match.group(1)) * unit)
        if rate < 1:
            self.fail(f"{value!r} is less than 1 byte a second", param)
        return rate


def entity_options(command: F) -> F:
    """--principal, --client, --default-principal, --default-client: whose quota."""
    for name, help_text in (
        ("--default-client", "The default of every client id without a quota of its own."),
        ("--default-principal", "The default of every principal without a quota of its own."),
    ):
        command = click.option(name, is_flag=True, help=help_text)(command)
    command = click.option(
        "--client", "client_id", help="A client id (plaintext brokers: the request's client_id)."
    )(command)
    return click.option("--principal", help="A principal (brokers in curve mode).")(command)


def _entity(
    principal: str | None, client_id: str | None, default_principal: bool, default_client: bool
) -> tuple[Kind, str]:
    """The one entity the options name, checked; a usage error for none or several."""
    given = [
        (Kind.PRINCIPAL, principal) if principal is not None else None,
        (Kind.CLIENT, client_id) if client_id is not None else None,
        (Kind.PRINCIPAL, DEFAULT) if default_principal else None,
        (Kind.CLIENT, DEFAULT) if default_client else None,
    ]
    named = [entity for entity in given if entity is not None]
    if len(named) != 1:
        usage_error(
            "name exactly one of --principal, --client, --default-principal, --default-client"
        )
    kind, name = named[0]
    try:
        check_quota_name(kind, name)
    except ValueError as error:
        usage_error(str(error))
    return kind, name


@click.group()
def quota() -> None:
    """Byte-rate quotas: produce and fetch bytes a second per principal (curve brokers) or per
    client id (plaintext), each broker applying them to what it serves. A client over its
    quota is slowed to it (its requests wait in the broker), never refused."""


@quota.command("set")
@entity_options
@click.option("--produce", "produce", type=ByteRate(), help="Produce bytes a second.")
@click.option("--fetch", "fetch", type=ByteRate(), help="Fetch bytes a second (as a consumer).")
@admin_options
def quota_set(
    principal: str | None,
    client_id: str | None,
    default_principal: bool,
    default_client: bool,
    produce: int | None,
    fetch: int | None,
    zookeeper: str | None,
    chroot: str | None,
    broker: str,
    timeout: float,
    as_json: bool,
) -> None:
    """Set a quota (a direction not given keeps what it had). Brokers apply it within a
    second, to each broker's share of the client's traffic: a client producing to three
    brokers may send three times its quota in all.

    \b
    Examples:
      pylogctl quota set --client spark-nightly --fetch 50MiB
      pylogctl quota set --default-principal --produce 10MiB --fetch 20MiB
      pylogctl quota set --principal web --produce 1MB"""
    kind, name = _entity(principal, client_id, default_principal, default_client)
    if produce is None and fetch is None:
        usage_error("give --produce, --fetch or both")
    with open_registry(zookeeper, chroot, broker, timeout) as registry:
        stored = registry.quotas.set(kind, name, Quota(produce, fetch))
    _say(as_json, kind, name, stored, "now")


@quota.command("delete")
@entity_options
@click.option("--produce", "produce", is_flag=True, help="Only the produce quota.")
@click.option("--fetch", "fetch", is_flag=True, help="Only the fetch quota.")
@admin_options
def quota_delete(
    principal: str | None,
    client_id: str | None,
    default_principal: bool,
    default_client: bool,
    produce: bool,
    fetch: bool,
    zookeeper: str | None,
    chroot: str | None,
    broker: str,
    timeout: float,
    as_json: bool,
) -> None:
    """Take a quota away (both directions unless --produce or --fetch): the client then has
    the default's, or none. Brokers apply it within a second.

    \b
    Example:
      pylogctl quota delete --client spark-nightly --fetch"""
    kind, name = _entity(principal, client_id, default_principal, default_client)
    chosen = [d for d, given in ((Direction.PRODUCE, produce), (Direction.FETCH, fetch)) if given]
    with open_registry(zookeeper, chroot, broker, timeout) as registry:
        try:
            left = registry.quotas.delete(kind, name, tuple(chosen or Direction))
        except KeyError:
            fail(f"no quota of {kind} {name}: pylogctl quota describe shows them")
    _say(as_json, kind, name, left, "now")


@quota.command("describe")
@click.option("--principal", help="Only the quota that applies to this principal.")
@click.option("--client", "client_id", help="Only the quota that applies to this client id.")
@admin_options
def quota_describe(
    principal: str | None,
    client_id: str | None,
    zookeeper: str | None,
    chroot: str | None,
    broker: str,
    timeout: float,
    as_json: bool,
) -> None:
    """Print the quotas set, or with --principal or --client the quota in force for that one
    (its own, else the default's, direction by direction).

    \b
    Examples:
      pylogctl quota describe
      pylogctl quota describe --client spark-nightly --json"""
    if principal is not None and client_id is not None:
        usage_error("give --principal or --client, not both")
    with open_registry(zookeeper, chroot, broker, timeout) as registry:
        config = registry.quotas.read()
    if principal is not None or client_id is not None:
        kind = Kind.PRINCIPAL if principal is not None else Kind.CLIENT
        name = principal if principal is not None else client_id
        assert name is not None
        _say(as_json, kind, name, _in_force(config, kind, name), "in force")
        return
    rows = [
        (kind, name, quota)
        for kind in Kind
        for name, quota in sorted(config.quotas.get(kind, {}).items())
    ]
    if as_json:
        for kind, name, quota in rows:
            click.echo(json.dumps(_record(kind, name, quota)))
        return
    table(
        ["KIND", "NAME", "PRODUCE B/S", "FETCH B/S"],
        [(k, n, q.produce_bytes_per_s, q.fetch_bytes_per_s) for k, n, q in rows],
        "quotas",
    )


def _in_force(config: QuotaConfig, kind: Kind, name: str) -> Quota:
    return Quota(*(config.rate(kind, name, direction) for direction in Direction))


def _record(kind: Kind, name: str, quota: Quota) -> dict[str, object]:
    return {
        "kind": kind.value,
        "name": name,
        "produce_bytes_per_s": quota.produce_bytes_per_s,
        "fetch_bytes_per_s": quota.fetch_bytes_per_s,
    }


def _say(as_json: bool, kind: Kind, name: str, quota: Quota | None, what: str) -> None:
    """One line: "quota of client alice now: produce 1048576 B/s, fetch -" (`what` "now" or
    "in force"), or "quota of client alice deleted" for None."""
    if as_json:
        click.echo(json.dumps(_record(kind, name, quota or Quota())))
    elif quota is None:
        click.echo(f"quota of {kind} {name} deleted")
    else:
        rates = [f"{d} {'-' if (r := quota.rate(d)) is None else f'{r} B/s'}" for d in Direction]
        click.echo(f"quota of {kind} {name} {what}: {', '.join(rates)}")
