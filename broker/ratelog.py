"""A log line that a storm of the same event cannot turn into a storm of lines."""

from __future__ import annotations

import logging
import math

from broker.clock import SYSTEM_CLOCK


class RateLimitedLog:
    """Log a kind of message at most once per `every_s` seconds, counting those left out."""

    def __init__(self, logger: logging.Logger, every_s: float) -> None:
        self.logger = logger
        self.every_s = every_s
        self._logged_at: dict[str, float] = {}
        self._left_out: dict[str, int] = {}

    def log(self, level: int, kind: str, message: str) -> None:
        now = SYSTEM_CLOCK.monotonic()
        if now < self._logged_at.get(kind, -math.inf) + self.every_s:
            self._left_out[kind] = self._left_out.get(kind, 0) + 1
            return
        self._logged_at[kind] = now
        left_out = self._left_out.pop(kind, 0)
        more = f" ({left_out} more like it in the last {self.every_s:.0f} s)" if left_out else ""
        self.logger.log(level, "%s%s", message, more)
