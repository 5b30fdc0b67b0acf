"""How pylogd's processes log: to stderr (journald under systemd), one event a line.

`broker.log_format` picks the form:
- "text" (the default), for people: `pylogd: LEVEL logger: message`;
- "json", for log shippers: one JSON object a line with `time` (ISO 8601, UTC), `level`,
  `logger`, `pid`, `message`, and `exception` (the traceback, as one string) when there is one,
  so that even an error with a traceback stays one line.
"""

from __future__ import annotations

import datetime
import json
import logging
import sys

FORMATS = ("text", "json")
TEXT_FORMAT = "pylogd: %(levelname)s %(name)s: %(message)s"


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


def configure_logging(log_format: str, level: str = "info") -> None:
    """Log `level` (debug, info, warning, error) and up to stderr in `log_format`."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        JsonFormatter() if log_format == "json" else logging.Formatter(TEXT_FORMAT)
    )
    logging.basicConfig(level=level.upper(), handlers=[handler])


def set_log_level(level: str) -> None:
    """Log `level` and up from now on (broker.log_level changed live)."""
    logging.getLogger().setLevel(level.upper())
