"""Where pylog reads the time, so that tests can move it on purpose.

`monotonic()` measures intervals (flush.interval.ms); `time()` is wall-clock seconds since the
Unix epoch, compared with file times and message timestamps (segment.ms, retention.ms).
A client's clock also sleeps (`WaitingClock`): its waits between retries, so that a client
on an in-memory transport with a fake clock waits for nothing (broker.client.transport).
"""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    def monotonic(self) -> float: ...

    def time(self) -> float: ...


class WaitingClock(Clock, Protocol):
    def sleep(self, seconds: float) -> None: ...


class SystemClock:
    """The operating system's clocks (the C functions themselves: a produce reads one)."""

    monotonic = staticmethod(time.monotonic)
    sleep = staticmethod(time.sleep)
    time = staticmethod(time.time)


SYSTEM_CLOCK = SystemClock()
