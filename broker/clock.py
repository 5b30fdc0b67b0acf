"""Where pylog reads the time, so that tests can move it on purpose.

`monotonic()` measures intervals (flush.interval.ms); `time()` is wall-clock seconds since the
Unix epoch, compared with file times and message timestamps (segment.ms, retention.ms).
"""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    def monotonic(self) -> float: ...

    def time(self) -> float: ...


class SystemClock:
    """The operating system's clocks (the C functions themselves: a produce reads one)."""

    monotonic = staticmethod(time.monotonic)
    time = staticmethod(time.time)


SYSTEM_CLOCK = SystemClock()
