"""How the console's pages show values: message keys, values and headers as text, JSON or hex
(at most SHOWN_BYTES of each), times, sizes and unknowns."""

from __future__ import annotations

import json
from dataclasses import dataclass

from cli.common import timestamp
from cli.group_commands import seconds_text

VIEWS = ("auto", "text", "json", "hex")
"""auto: JSON when the bytes parse as JSON, else text when they are UTF-8, else hex."""
SHOWN_BYTES = 4096


@dataclass(frozen=True)
class Shown:
    kind: str
    """"text", "json", "hex" or "null"."""
    text: str
    more: int = 0
    """Bytes left out past SHOWN_BYTES."""


def data(value: bytes | None, view: str = "auto") -> Shown:
    if value is None:
        return Shown("null", "null")
    more = max(0, len(value) - SHOWN_BYTES)
    head = value[:SHOWN_BYTES]
    if view in ("auto", "json") and not more:
        try:
            parsed = json.loads(value)
        except (ValueError, UnicodeDecodeError):
            pass
        else:
            return Shown("json", json.dumps(parsed, indent=2, ensure_ascii=False))
    if view in ("auto", "text", "json"):
        try:
            return Shown("text", head.decode(), more)
        except UnicodeDecodeError as error:
            if more and error.start >= len(head) - 3:  # a character cut at the limit
                return Shown("text", head[: error.start].decode(), len(value) - error.start)
            if view == "text":
                return Shown("text", head.decode("utf-8", "backslashreplace"), more)
    return Shown("hex", " ".join(f"{b:02x}" for b in head), more)


def when(ms: int | None) -> str:
    """A timestamp in ms since the epoch as ISO UTC, "-" for none (negative or None)."""
    return "-" if ms is None or ms < 0 else timestamp(ms)


def seconds(value: float | None) -> str:
    return seconds_text(value) or "-"


def duration(value: float | None) -> str:
    """Seconds as the tables show them under an hour, then in hours, then in days."""
    if value is None or value < 3600:
        return seconds(value) + ("" if value is None else " s")
    if value < 86400:
        return f"{value / 3600:.1f} h"
    return f"{value / 86400:.1f} d"


def known(value: object) -> object:
    """`value`, or "-" for None."""
    return "-" if value is None else value


def size(count: int | None) -> str:
    """Bytes as B, KiB, MiB, GiB (1024-based, one decimal), "-" for None."""
    if count is None:
        return "-"
    amount, unit = float(count), 0
    while amount >= 1024 and unit < len(UNITS) - 1:
        amount, unit = amount / 1024, unit + 1
    return f"{count} B" if unit == 0 else f"{amount:.1f} {UNITS[unit]}"


UNITS = ("B", "KiB", "MiB", "GiB", "TiB")
