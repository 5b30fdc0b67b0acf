"""`pylogctl keys`, `pylogctl principal`, `pylogctl acl`: CurveZMQ key pairs, the principals a
Curve broker lets in, and what each may do (docs/security.md). Principals and ACLs live in
ZooKeeper (broker.registry.security), where every broker of the cluster watches them: a change
applies within a second, with no restart."""

from __future__ import annotations

import json
import os
from pathlib import Path

import click

from broker.security import (
    ALL,
    SECRET_SUFFIX,
    Acl,
    KeyFileError,
    Operation,
    generate_keys,
    load_public_key,
    parse_operations,
)
from cli.common import EXIT_USAGE, json_option, usage_error
from cli.group_commands import admin_options, fail, open_registry, table

OPERATION_NAMES = [*(operation.value for operation in Operation), ALL]


@click.group()
def keys() -> None:
    """CurveZMQ key pairs, for a broker (security.key_file) or a client (--key-file)."""


@keys.command("generate")
@click.argument("name")
@click.option(
    "--dir",
    "directory",
    type=click.Path(file_okay=False, path_type=Path),
    default=".",
    show_default=True,
    help="Where to write NAME.key (public) and NAME.key_secret (mode 0600).",
)
@json_option("One JSON object.")
def keys_generate(name: str, directory: Path, as_json: bool) -> None:
    """Write a new key pair: NAME.key holds the public key (give it to the other side),
    NAME.key_secret the secret key too (keep it; mode 0600). An existing pair is never
    overwritten.

    \b
    Examples:
      pylogctl keys generate broker --dir /var/lib/pylog/keys   # the broker's default key_file
      pylogctl keys generate alice                              # a client's, here"""
    try:
        public_path, secret_path = generate_keys(directory, name)
    except (ValueError, OSError) as error:
        click.echo(f"pylogctl: {error}", err=True)
        raise SystemExit(EXIT_USAGE) from None
    public = load_public_key(public_path).decode()
    if as_json:
        record = {"public_key": public, "public": str(public_path), "secret": str(secret_path)}
        click.echo(json.dumps(record))
        return
    click.echo(f"public key  {public}")
    click.echo(f"wrote       {public_path} (public) and {secret_path} (secret, mode 0600)")


@keys.command("show")
@click.argument("path")
@json_option("One JSON object.")
def keys_show(path: str, as_json: bool) -> None:
    """Print the public key of a key file (either file of a pair): what a principals file or
    `pylogctl principal add` takes.

    \b
    Example:
      pylogctl keys show alice.key"""
    try:
        public = load_public_key(path).decode()
    except KeyFileError as error:
        usage_error(str(error))
    click.echo(json.dumps({"public_key": public}) if as_json else public)


@click.group()
def principal() -> None:
    """The principals a Curve broker lets in: a name for each client public key."""


@principal.command("add")
@click.argument("name")
@click.argument("key")
@admin_options
def principal_add(
    name: str,
    key: str,
    zookeeper: str | None,
    chroot: str | None,
    broker: str,
    timeout: float,
    as_json: bool,
) -> None:
    """Let the client whose public key is KEY (40 Z85 characters, or its NAME.key file) in as
    principal NAME. It may do nothing until an ACL grants it (pylogctl acl add), unless it is
    one of the brokers' security.super_users. Adding a second key to a principal is how its
    key is changed: add the new one, move its clients to it, remove the old one.

    \b
    Example:
      pylogctl principal add alice alice.key"""
    if os.fspath(key).endswith(SECRET_SUFFIX):
        usage_error(f"{key} is a secret key file: give the public one (.key), never the secret")
    try:
        public = load_public_key(key)
    except KeyFileError as error:
        usage_error(str(error))
    with open_registry(zookeeper, chroot, broker, timeout) as registry:
        try:
            added = registry.security.add_principal(name, public)
        except ValueError as error:
            fail(str(error))
    text = f"principal {name}: key {public.decode()} " + ("added" if added else "was there")
    _say(as_json, {"principal": name, "key": public.decode(), "added": added}, text)


@principal.command("remove")
@click.argument("name")
@click.option("--key", help="Only this key of NAME (40 Z85 characters, or its .key file).")
@admin_options
def principal_remove(
    name: str,
    key: str | None,
    zookeeper: str | None,
    chroot: str | None,
    broker: str,
    timeout: float,
    as_json: bool,
) -> None:
    """Stop letting NAME in (with --key, only with that key): new connections are refused;
    one already open stays open until it closes (remove its ACLs to stop its requests at
    once). Its ACLs are kept.

    \b
    Examples:
      pylogctl principal remove alice --key alice-old.key   # after moving to a new key
      pylogctl principal remove alice"""
    try:
        public = None if key is None else load_public_key(key)
    except KeyFileError as error:
        usage_error(str(error))
    with open_registry(zookeeper, chroot, broker, timeout) as registry:
        try:
            registry.security.remove_principal(name, public)
        except KeyError:
            fail(f"no principal {name!r}" + ("" if public is None else " with that key"))
    what = f"principal {name}" + ("" if public is None else f": key {public.decode()}")
    record = {"principal": name, "key": None if public is None else public.decode()}
    _say(as_json, {**record, "removed": True}, f"{what} removed")


@principal.command("list")
@admin_options
def principal_list(
    zookeeper: str | None, chroot: str | None, broker: str, timeout: float, as_json: bool
) -> None:
    """Print every principal in ZooKeeper and its public keys (a broker's principals_file adds
    its own, not listed here).

    \b
    Example:
      pylogctl principal list --json"""
    with open_registry(zookeeper, chroot, broker, timeout) as registry:
        principals = registry.security.principals()
    rows = [(name, key.decode()) for name, keys in sorted(principals.items()) for key in keys]
    if as_json:
        for name, key in rows:
            click.echo(json.dumps({"principal": name, "key": key}))
        return
    table(["PRINCIPAL", "KEY"], rows, "principals")


@click.group()
def acl() -> None:
    """What each principal may do on which topics: produce, fetch, describe, create, delete,
    alter (describe comes with every other one)."""


def acl_options(command: click.decorators.FC) -> click.decorators.FC:
    command = click.option(
        "--topic",
        "resource",
        required=True,
        help="A topic name, a prefix ending in * (logs.*: every topic whose name starts with "
        "'logs.'), or * for every topic.",
    )(command)
    return click.option(
        "--principal", "principal_name", required=True, help="The principal's name."
    )(command)


def _acl(principal_name: str, resource: str, operations: tuple[str, ...]) -> Acl:
    try:
        return Acl(principal_name, resource, parse_operations(operations or (ALL,)))
    except ValueError as error:
        usage_error(str(error))


@acl.command("add")
@acl_options
@click.option(
    "--operation",
    "operations",
    multiple=True,
    required=True,
    type=click.Choice(OPERATION_NAMES),
    help="An operation to grant (repeat the option for several; all: every one).",
)
@admin_options
def acl_add(
    principal_name: str,
    resource: str,
    operations: tuple[str, ...],
    zookeeper: str | None,
    chroot: str | None,
    broker: str,
    timeout: float,
    as_json: bool,
) -> None:
    """Grant --principal the operations on the topics --topic names (added to what an ACL of
    the same principal and --topic grants already).

    \b
    Examples:
      pylogctl acl add --principal loader --topic 'logs.*' --operation fetch
      pylogctl acl add --principal web --topic clicks --operation produce"""
    granted = _acl(principal_name, resource, operations)
    with open_registry(zookeeper, chroot, broker, timeout) as registry:
        stored = registry.security.add_acl(granted)
    _say(as_json, _acl_record(stored), f"ACL now: {_acl_text(stored)}")


@acl.command("remove")
@acl_options
@click.option(
    "--operation",
    "operations",
    multiple=True,
    type=click.Choice(OPERATION_NAMES),
    help="An operation to take away (repeat for several); default: all of them.",
)
@admin_options
def acl_remove(
    principal_name: str,
    resource: str,
    operations: tuple[str, ...],
    zookeeper: str | None,
    chroot: str | None,
    broker: str,
    timeout: float,
    as_json: bool,
) -> None:
    """Take operations away from --principal on --topic (exactly as it was added: removing
    `logs.*` does not touch an ACL on `logs.web`). Applies to its next request.

    \b
    Examples:
      pylogctl acl remove --principal web --topic clicks --operation produce
      pylogctl acl remove --principal loader --topic 'logs.*'   # every operation"""
    taken = _acl(principal_name, resource, operations)
    with open_registry(zookeeper, chroot, broker, timeout) as registry:
        try:
            left = registry.security.remove_acl(taken)
        except KeyError:
            fail(f"no ACL of {principal_name} on {resource!r}: pylogctl acl list shows them")
    if left is None:
        _say(
            as_json,
            {"principal": principal_name, "resource": resource, "operations": []},
            f"ACL removed: {principal_name} on {resource}",
        )
    else:
        _say(as_json, _acl_record(left), f"ACL now: {_acl_text(left)}")


@acl.command("list")
@click.option("--principal", "principal_name", help="Only this principal's ACLs.")
@admin_options
def acl_list(
    principal_name: str | None,
    zookeeper: str | None,
    chroot: str | None,
    broker: str,
    timeout: float,
    as_json: bool,
) -> None:
    """Print the ACLs: principal, topics, operations.

    \b
    Example:
      pylogctl acl list --principal web"""
    with open_registry(zookeeper, chroot, broker, timeout) as registry:
        acls = [a for a in registry.security.acls() if principal_name in (None, a.principal)]
    if as_json:
        for entry in acls:
            click.echo(json.dumps(_acl_record(entry)))
        return
    table(
        ["PRINCIPAL", "TOPIC", "OPERATIONS"],
        [(a.principal, a.resource, ",".join(sorted(a.operations))) for a in acls],
        "ACLs" if principal_name is None else f"ACLs of {principal_name}",
    )


def _acl_record(entry: Acl) -> dict[str, object]:
    return {
        "principal": entry.principal,
        "resource": entry.resource,
        "operations": sorted(entry.operations),
    }


def _acl_text(entry: Acl) -> str:
    return f"{entry.principal} may {','.join(sorted(entry.operations))} on {entry.resource}"


def _say(as_json: bool, record: dict[str, object], text: str) -> None:
    click.echo(json.dumps(record) if as_json else text)
