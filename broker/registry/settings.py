"""Live broker settings in the registry: one node, so that a change is one conditional write
and every broker sees one consistent set.

    /config/brokers  persistent  {"version": 1, "brokers": {
                                    "default": {"log.flush_interval_ms": "200"},
                                    "2": {"broker.log_level": "debug"}}}

Each broker takes "default", then its own id's (which wins), over what its file and flags say,
for the settings broker.config.LIVE_SETTINGS names, and applies a change within a second
(broker.supervisor); `pylogctl broker config` writes the node. Values are kept as the text a
flag takes, checked (broker.config.with_live) before they are written.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Final

from broker.config import BrokerConfig, with_live
from broker.registry.nodes import decode, encode
from broker.registry.session import Session

DEFAULT: Final = "default"
"""The entry of the node that applies to every broker."""
BrokerSettings = dict[str, dict[str, str]]
"""Entry ("default", or a broker id as text) -> dotted setting name -> its text."""


def parse_broker_settings(data: bytes) -> BrokerSettings:
    """The node's data (nothing set for b""); ValueError for anything not as described."""
    if not data:
        return {}
    value = decode(data).get("brokers")
    if not isinstance(value, dict):
        raise ValueError("'brokers' is not an object")
    out: BrokerSettings = {}
    for entry, settings in value.items():
        _check_entry(entry)
        if not isinstance(settings, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in settings.items()
        ):
            raise ValueError(f"the settings of {entry!r} are not an object of texts")
        out[entry] = dict(settings)
    return out


def settings_for(node: Mapping[str, Mapping[str, str]], broker_id: int) -> dict[str, str]:
    """What applies to broker `broker_id`: the default entry, then its own (which wins)."""
    return {**node.get(DEFAULT, {}), **node.get(str(broker_id), {})}


def _settings_json(node: BrokerSettings) -> bytes:
    return encode({"brokers": {entry: dict(sorted(s.items())) for entry, s in node.items() if s}})


class BrokerSettingsNode:
    """The live broker settings in the registry, one node (/config/brokers), read and changed
    on `session`."""

    def __init__(self, session: Session) -> None:
        self._session = session
        self.path = f"{session.chroot}/config/brokers"

    def read(self) -> BrokerSettings:
        return self._session.read_node(self.path, parse_broker_settings)[0]

    def set(self, entry: str, changes: Mapping[str, str]) -> dict[str, str]:
        """Set `changes` (dotted name -> text) for `entry` (DEFAULT or a broker id as text),
        each checked against the built-in defaults with what the entry sets already
        (ValueError naming the first that is unknown, read at start only or out of range).
        Returns the entry's settings as stored."""
        _check_entry(entry)
        stored: dict[str, str] = {}

        def change(node: BrokerSettings) -> BrokerSettings:
            nonlocal stored
            stored = {**node.get(entry, {}), **changes}
            with_live(BrokerConfig(), stored)
            return {**node, entry: stored}

        self._session.change(self.path, parse_broker_settings, change, _settings_json)
        return stored

    def delete(self, entry: str, names: tuple[str, ...]) -> dict[str, str]:
        """Take `names` (all, when empty) off `entry`: the brokers go back to their file's and
        flags' values. Returns what the entry sets still; KeyError naming one not set."""
        _check_entry(entry)
        left: dict[str, str] = {}

        def change(node: BrokerSettings) -> BrokerSettings:
            nonlocal left
            current = node.get(entry, {})
            if missing := [name for name in names if name not in current]:
                raise KeyError(missing[0])
            left = {k: v for k, v in current.items() if names and k not in names}
            return {**node, entry: left}

        self._session.change(self.path, parse_broker_settings, change, _settings_json)
        return left

    def watch(self, callback: Callable[[BrokerSettings], None]) -> None:
        """Call `callback(read())` now and whenever they change, until the session stops."""
        self._session.watch_node(self.path, parse_broker_settings, callback)


def _check_entry(entry: str) -> None:
    if entry != DEFAULT and not (entry.isascii() and entry.isdecimal()):
        raise ValueError(f"entry {entry!r} is neither {DEFAULT!r} nor a broker id")
