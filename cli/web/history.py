"""Each consumer group's lag over the last hour, for its page's chart.

A sample is taken each time the group is read (its page and the page's refreshes) and, by the
console's sampler (cli.web.app), every `--history-interval` seconds while the group is watched:
for an hour after its page was last opened. So the chart of a group starts when its page is
first opened; the console keeps nothing on disk (a restart starts every chart again).
Bounded: a sample at most every MIN_SPACING_S a group (one sooner is not kept), so at most
MAX_POINTS a group, and MAX_GROUPS groups, the least recently viewed dropped first.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass

from markupsafe import Markup, escape

from broker.client.lag import GroupLag

WINDOW_S = 3600.0
MIN_SPACING_S = 1.0
MAX_POINTS = 3600
"""Samples kept a group: one a second over the hour."""
MAX_GROUPS = 100
MIN_SPAN_S = 300.0
"""The chart's shortest time span: a few minutes of samples are not stretched over it all."""


@dataclass(frozen=True, slots=True)
class Sample:
    at: float
    """When, in seconds since the Unix epoch."""
    lag_bytes: int
    lag_messages: int
    lag_seconds: float | None


class LagHistory:
    """The samples of each group, within `window_s` of the clock; safe to share between the
    page threads and the sampler."""

    def __init__(self, window_s: float = WINDOW_S, clock: Callable[[], float] = time.time) -> None:
        self.window_s = window_s
        self.clock = clock
        self._samples: OrderedDict[str, deque[Sample]] = OrderedDict()
        self._viewed: dict[str, float] = {}
        self._lock = threading.Lock()

    def record(self, lag: GroupLag, viewed: bool = False) -> None:
        """Keep `lag`'s totals as a sample of now; `viewed`: taken for its page, which keeps
        the group watched for another window."""
        now = self.clock()
        sample = Sample(now, lag.lag_bytes, lag.lag_messages, lag.lag_seconds)
        with self._lock:
            if viewed:
                self._viewed[lag.group] = now
            samples = self._samples.setdefault(lag.group, deque(maxlen=MAX_POINTS))
            self._samples.move_to_end(lag.group)
            if not samples or now - samples[-1].at >= MIN_SPACING_S:
                samples.append(sample)
            while samples and samples[0].at < now - self.window_s:
                samples.popleft()
            while len(self._samples) > MAX_GROUPS:
                dropped, _ = self._samples.popitem(last=False)
                self._viewed.pop(dropped, None)

    def samples(self, group: str) -> list[Sample]:
        """The group's samples within the window, oldest first."""
        since = self.clock() - self.window_s
        with self._lock:
            return [s for s in self._samples.get(group, ()) if s.at >= since]

    def watched(self) -> list[str]:
        """The groups whose page was opened within the window (the sampler reads them)."""
        since = self.clock() - self.window_s
        with self._lock:
            for group in [g for g, at in self._viewed.items() if at < since]:
                del self._viewed[group]
            return sorted(self._viewed)


def chart(samples: list[Sample], now: float, window_s: float = WINDOW_S) -> Markup:
    """An SVG line of the samples' lag in messages up to `now` (time from left to right, 0 at
    the bottom), over the time since the first sample (at least MIN_SPAN_S, at most
    `window_s`), with its greatest value and its span as labels; a note when there are fewer
    than two samples."""
    if len(samples) < 2:
        return Markup('<p class="note">The chart fills in as the console samples the group.</p>')
    span = min(window_s, max(MIN_SPAN_S, now - samples[0].at))
    width, height, top = 600, 120, 12
    greatest = max(s.lag_messages for s in samples)
    points = " ".join(
        f"{max(0.0, width * (1 - (now - s.at) / span)):.1f},"
        f"{top + (height - top) * (1 - s.lag_messages / max(greatest, 1)):.1f}"
        for s in samples
    )
    minutes = round(span / 60)
    return Markup(
        f'<svg class="chart" viewBox="0 0 {width} {height + 16}" role="img" '
        f'aria-label="lag in messages over the last {minutes} minutes">'
        f'<polyline fill="none" stroke="currentColor" stroke-width="2" points="{points}"/>'
        f'<line x1="0" y1="{height}" x2="{width}" y2="{height}" stroke="#999"/>'
        f'<text x="2" y="10">{escape(f"{greatest:,} messages")}</text>'
        f'<text x="2" y="{height + 14}">-{minutes} min</text>'
        f'<text x="{width - 2}" y="{height + 14}" text-anchor="end">now</text></svg>'
    )
