"""How pylogd's processes (and pylog-mirror) log: to stderr (journald under systemd), one event
a line.

`broker.log_format` picks the form:
- "text" (the default), for people: `pylogd: LEVEL logger: message` (`pylog-mirror: ...`);
- "json", for log shippers: one JSON object a line with `time` (ISO 8601, UTC), `level`,
  `logger`, `pid`, `message`, and `exception` (the traceback, as one string) when there is one,
  so that even an error with a traceback stays one line.
"""

from __future__ import annotations

import datetime
import json
import logging
import sys
from collections.abc import Iterable

FORMATS = ("text", "json")
TEXT_FORMAT = "%(levelname)s %(name)s: %(message)s"
"""A text line after the program's name and a colon."""


class JsonFormatter(logging.Formatter):
    """A record as one line of JSON."""

    def format(self, record: logging.LogRecord) -> str:
        event = {
            "time": datetime.datetime.fromtimestamp(record.created, datetime.UTC).isoformat(
                timespec="milliseconds"
            ),
            "level": record.levelname,
            "logger": record.name,
            "pid": record.process,
            "message": record.getMessage(),
        }
        if record.exc_info:
            event["exception"] = self.formatException(record.exc_info)
        return json.dumps(event)


def configure_logging(log_format: str, level: str = "info", program: str = "pylogd") -> None:
    """Log `level` (debug, info, warning, error) and up to stderr in `log_format`, each text
    line after `program`'s name."""
    handler = logging.StreamHandler(sys.stderr)
    text = logging.Formatter(f"{program}: {TEXT_FORMAT}")
    handler.setFormatter(JsonFormatter() if log_format == "json" else text)
    logging.basicConfig(level=level.upper(), handlers=[handler])


def set_log_level(level: str) -> None:
    """Log `level` and up from now on (broker.log_level changed live)."""
    logging.getLogger().setLevel(level.upper())


def number_spans(numbers: Iterable[int]) -> str:
    """Numbers (partitions) for a line, runs as spans: [0, 1, 2, 5, 7, 8] -> "0-2, 5, 7-8", so
    that 10,000 partitions take a few characters, not 50,000."""
    spans: list[list[int]] = []
    for number in sorted(set(numbers)):
        if spans and number == spans[-1][1] + 1:
            spans[-1][1] = number
        else:
            spans.append([number, number])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in spans)
