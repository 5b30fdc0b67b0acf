"""Quotas in the registry: one node, so that every broker sees one consistent set and a change
is one conditional write (broker.quotas says what they do).

    /config/quotas  persistent  {"version": 1, "quotas": {
                                   "principal": {"<default>": {"produce_bytes_per_s": 1048576},
                                                 "loader": {"fetch_bytes_per_s": 52428800}},
                                   "client": {"spark-nightly": {"produce_bytes_per_s": 10485760,
                                                                "fetch_bytes_per_s": 10485760}}}}

Brokers watch it (watch_quotas) and apply a change within a second; `pylogctl quota` writes it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

from broker.quotas import DEFAULT, Direction, Kind, Quota, QuotaConfig
from broker.registry.nodes import decode, encode
from broker.registry.session import Session
from broker.security import check_principal_name

MAX_CLIENT_ID: Final = 255
"""The longest client id a quota may name, in characters."""
_FIELDS: Final = {direction: f"{direction.value}_bytes_per_s" for direction in Direction}


def check_quota_name(kind: Kind, name: str) -> None:
    """ValueError unless `name` may carry a quota of `kind`: DEFAULT, a principal's name, or a
    client id of 1 to MAX_CLIENT_ID printable characters."""
    if name == DEFAULT:
        return
    if kind is Kind.PRINCIPAL:
        check_principal_name(name)
    elif not 1 <= len(name) <= MAX_CLIENT_ID or not name.isprintable():
        raise ValueError(
            f"client id {name!r}: 1 to {MAX_CLIENT_ID} printable characters, or {DEFAULT}"
        )


def _quota(where: str, value: Any) -> Quota:
    if not isinstance(value, dict) or set(value) - set(_FIELDS.values()):
        raise ValueError(f"{where}: an object of {', '.join(_FIELDS.values())}")
    try:
        return Quota(value.get(_FIELDS[Direction.PRODUCE]), value.get(_FIELDS[Direction.FETCH]))
    except ValueError as error:
        raise ValueError(f"{where}: {error}") from None


def parse_quotas(data: bytes) -> QuotaConfig:
    """The node's data as a QuotaConfig (none set for b""); ValueError for anything else."""
    if not data:
        return QuotaConfig()
    value = decode(data).get("quotas")
    if not isinstance(value, dict):
        raise ValueError("'quotas' is not an object")
    out: dict[Kind, dict[str, Quota]] = {}
    for kind_name, named in value.items():
        try:
            kind = Kind(kind_name)
        except ValueError:
            raise ValueError(f"unknown kind of quota {kind_name!r}") from None
        if not isinstance(named, dict):
            raise ValueError(f"the {kind} quotas are not an object")
        for name, quota in named.items():
            check_quota_name(kind, name)
            out.setdefault(kind, {})[name] = _quota(f"quota of {kind} {name}", quota)
    return QuotaConfig(out)


def _quotas_json(config: QuotaConfig) -> bytes:
    return encode(
        {
            "quotas": {
                kind.value: {
                    name: {
                        _FIELDS[d]: rate for d in Direction if (rate := quota.rate(d)) is not None
                    }
                    for name, quota in named.items()
                }
                for kind, named in config.quotas.items()
                if named
            }
        }
    )


class Quotas:
    """The quotas in the registry, one node (/config/quotas), read and changed on `session`."""

    def __init__(self, session: Session) -> None:
        self._session = session
        self.path = f"{session.chroot}/config/quotas"

    def read(self) -> QuotaConfig:
        """Every quota set."""
        return self._session.read_node(self.path, parse_quotas)[0]

    def set(self, kind: Kind, name: str, quota: Quota) -> Quota:
        """Set the rates `quota` gives for `name` (DEFAULT: every one of `kind` without its
        own), keeping a direction it leaves None as it was. Returns the quota as stored."""
        check_quota_name(kind, name)
        stored = quota

        def change(config: QuotaConfig) -> QuotaConfig:
            nonlocal stored
            old = config.quotas.get(kind, {}).get(name, Quota())
            stored = Quota(
                *(
                    old.rate(d) if quota.rate(d) is None else quota.rate(d)
                    for d in (Direction.PRODUCE, Direction.FETCH)
                )
            )
            return _replaced(config, kind, name, stored)

        self._session.change(self.path, parse_quotas, change, _quotas_json)
        return stored

    def delete(
        self, kind: Kind, name: str, directions: tuple[Direction, ...] = tuple(Direction)
    ) -> Quota | None:
        """Take the quota of `name` away in `directions` (both by default). Returns what is
        left of it (None: nothing); KeyError when `name` has no quota of `kind`."""
        check_quota_name(kind, name)
        left: Quota | None = None

        def change(config: QuotaConfig) -> QuotaConfig:
            nonlocal left
            old = config.quotas.get(kind, {}).get(name)
            if old is None:
                raise KeyError(name)
            rates = [None if d in directions else old.rate(d) for d in Direction]
            left = None if rates == [None, None] else Quota(*rates)
            return _replaced(config, kind, name, left)

        self._session.change(self.path, parse_quotas, change, _quotas_json)
        return left

    def watch(self, callback: Callable[[QuotaConfig], None]) -> None:
        """Call `callback(read())` now and whenever they change, until the session stops."""
        self._session.watch_node(self.path, parse_quotas, callback)


def _replaced(config: QuotaConfig, kind: Kind, name: str, quota: Quota | None) -> QuotaConfig:
    """`config` with `name`'s quota of `kind` set to `quota` (None: removed)."""
    named = {k: v for k, v in config.quotas.get(kind, {}).items() if k != name}
    if quota is not None:
        named[name] = quota
    return QuotaConfig({**config.quotas, kind: named})
