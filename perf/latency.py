"""The one summary every latency run reports, whatever the system, and the disk's own latency
measured beside it (DiskProbe)."""

from __future__ import annotations

import math
import os
import statistics
import threading
import time
from pathlib import Path
from types import TracebackType
from typing import Any


def latency_summary(delays_ms: list[float], expected: int) -> dict[str, Any]:
    """p50, p99 and max of produce-to-consume delays over the `expected` messages. A message
    that never arrived counts as an infinite delay, so that a partial run does not flatter the
    system (its p99 is infinite once more than 1% are lost); `lost` says how many. The run's
    figures are kept either way: one system losing messages does not end the harness."""
    lost = max(0, expected - len(delays_ms))
    ordered = sorted(delays_ms) + [math.inf] * lost
    return {
        "messages": expected,
        "lost": lost,
        "p50_ms": round(statistics.median(ordered), 2),
        "p99_ms": round(ordered[max(0, int(len(ordered) * 0.99) - 1)], 2),
        "max_ms": round(ordered[-1], 2),
    }


class DiskProbe:
    """What the disk did while a latency run was measured: a thread appends 200 bytes to a file
    in `directory` and fsyncs it every `interval_s`, timing each write and fsync. A system's
    delay of seconds while the probe's fsyncs took seconds too is the disk's stall, not the
    system's; a delay the probe did not see is the system's. The probe adds one small fsync
    per interval to the disk's load (100 a second by default)."""

    def __init__(self, directory: Path, interval_s: float = 0.01) -> None:
        self.path = directory / "disk-probe"
        self.interval_s = interval_s
        self.fsync_ms: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._probe, name="disk-probe", daemon=True)

    def __enter__(self) -> DiskProbe:
        self._thread.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self._stop.set()
        self._thread.join()
        self.path.unlink(missing_ok=True)

    def _probe(self) -> None:
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            while not self._stop.wait(self.interval_s):
                started = time.perf_counter()
                os.write(fd, b"x" * 200)
                os.fsync(fd)
                self.fsync_ms.append((time.perf_counter() - started) * 1000)
        finally:
            os.close(fd)

    def summary(self) -> dict[str, Any]:
        """p99 and max of the probe's write + fsync times (NaN before any)."""
        ordered = sorted(self.fsync_ms) or [math.nan]
        return {
            "disk_p99_ms": round(ordered[max(0, int(len(ordered) * 0.99) - 1)], 2),
            "disk_max_ms": round(ordered[-1], 2),
        }
