"""The one exponential back-off of pylog: every retry and restart waits by a Backoff.

A wait starts at `first_s` and doubles after each failure up to `max_s`; a success resets it.
The loops that use one keep their own constants (a worker's restart, a follower's fetch, a
client's retry: each its own scale) but not their own arithmetic. No jitter: a broker's
retries are few and go to different peers; the clients' are bounded by their budgets.

A Backoff holds no clock and sleeps nothing: the caller waits the seconds it is given, on its
own clock (trio's, asyncio's, a thread's Event, or the injected broker.clock.Clock), so that a
test drives the waits with a fake clock.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field


@dataclass(slots=True)
class Backoff:
    """Waits of `first_s` doubling to `max_s` (math.inf: no ceiling). ValueError unless
    0 < first_s <= max_s."""

    first_s: float
    max_s: float = math.inf
    current_s: float = field(init=False)
    """The wait the next failure gets (`next`)."""

    def __post_init__(self) -> None:
        if not 0 < self.first_s <= self.max_s:
            raise ValueError(
                f"a back-off needs 0 < first_s <= max_s, not {self.first_s}, {self.max_s}"
            )
        self.current_s = self.first_s

    def next(self) -> float:
        """The wait after a failure: the current one, the next doubled (at most max_s)."""
        wait_s = self.current_s
        self.current_s = min(wait_s * 2, self.max_s)
        return wait_s

    def reset(self) -> None:
        """After a success: the next failure waits first_s again."""
        self.current_s = self.first_s

    def delay(self, failures: int) -> float:
        """The wait after `failures` failures in a row before this one (0: the first), for a
        caller that counts them itself; the state is left as it is."""
        return min(self.first_s * 2.0**failures, self.max_s)

    def waited(self, failures: int) -> float:
        """The waits of the first `failures` failures in a row, summed."""
        return sum(self.delay(i) for i in range(failures))
