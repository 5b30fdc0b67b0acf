"""What every registry node holds: compact UTF-8 JSON with sorted keys and a format version,
and the checks on the names and numbers that become paths or values."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

FORMAT_VERSION = 1
"""The "version" written into every node; readers accept nodes of this version or newer."""

_NAME = re.compile(r"[A-Za-z0-9._-]{1,249}")


def validate_broker_id(broker_id: int) -> None:
    if isinstance(broker_id, bool) or not isinstance(broker_id, int) or broker_id < 0:
        raise ValueError(f"a broker id is an integer >= 0, not {broker_id!r}")


def check_name(kind: str, name: str) -> None:
    """A group name or consumer id becomes a ZooKeeper path element: 1-249 of A-Z a-z 0-9 . _ -"""
    if not isinstance(name, str) or not _NAME.fullmatch(name) or name in (".", ".."):
        raise ValueError(f"{kind} {name!r}: use 1 to 249 of A-Z a-z 0-9 . _ - (not . or ..)")


def is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def int_field(obj: Mapping[str, Any], key: str) -> int:
    value = obj.get(key)
    if not isinstance(value, int) or isinstance(value, bool):
        raise ValueError(f"{key!r} is missing or not an integer")
    return value


def int_list(obj: Mapping[str, Any], key: str) -> tuple[int, ...]:
    value = obj.get(key)
    if not isinstance(value, list) or not all(is_int(v) and v >= 0 for v in value):
        raise ValueError(f"{key!r} is missing or not a list of integers >= 0")
    return tuple(value)


def encode(obj: Mapping[str, object]) -> bytes:
    return json.dumps(
        {"version": FORMAT_VERSION, **obj}, sort_keys=True, separators=(",", ":")
    ).encode()


def decode(data: bytes) -> dict[str, Any]:
    """A node's JSON object; ValueError (as json.loads raises it) for data that is not one of
    a known format version, including JSON nested past the parser's depth."""
    try:
        obj = json.loads(data)
    except RecursionError:
        raise ValueError("JSON nested too deeply") from None
    if not isinstance(obj, dict):
        raise ValueError("not a JSON object")
    if int_field(obj, "version") < FORMAT_VERSION:
        raise ValueError(f"unknown format version {obj['version']!r}")
    return obj
