"""The tasks of a worker waiting for a partition's high watermark to reach an offset.

Long polls wait for offset + min_bytes, producers on ack=flushed for the end of their messages.
They wait in a heap by that offset, so a flush wakes only those it satisfies (FlushWaiters).
"""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass
from typing import Protocol

import trio


class Settable(Protocol):
    """What a waiter sets when woken: a trio.Event, or a fetch session's mark of a partition
    (broker.fetch_sessions)."""

    def set(self) -> None: ...


@dataclass(frozen=True)
class FlushWaitersStatistics:
    waiting: int
    """Tasks waiting now."""
    entries: int
    """Entries held: the waiting and the cancelled ones not yet cleared out (at most about
    twice `waiting`)."""
    woken: int
    """Tasks woken so far (a cancelled one is not counted)."""


class Waiter:
    """An entry of one heap: the event it sets (a MULTI_FETCH's long poll shares one among the
    heaps of its partitions), and whether it left the heap (woken) or is to be skipped."""

    __slots__ = ("cancelled", "event", "popped")

    def __init__(self, event: Settable) -> None:
        self.event = event
        self.cancelled = False
        self.popped = False


class FlushWaiters:
    """The tasks waiting for a partition's high watermark to reach an offset: long polls (the
    offset plus min_bytes) and producers waiting on ack=flushed (the end of their messages).

    A heap ordered by the offset each needs, so that a flush wakes only those it satisfies,
    in O(log n) each: with thousands of long polls far ahead, a flush that brings them
    nothing costs nothing (every flush woke every waiter before, each to find it had to wait
    on). A waiter cancelled (its max_wait_ms passed) is marked and skipped, and the heap is
    rebuilt without the marked ones once they are more than half of it, so its size stays
    within about twice the number waiting. Not safe to share between trio runs or threads.
    """

    def __init__(self) -> None:
        self._heap: list[tuple[int, int, Waiter]] = []
        self._order = itertools.count()  # ties: first come, first woken; waiters never compared
        self._cancelled = 0
        self._woken = 0

    async def wait_high_watermark(self, offset: int) -> None:
        """Wait until `note_high_watermark` passes `offset` or more, or `wake_all`: the caller
        checks which (a deleted or offline partition is woken too)."""
        event = trio.Event()
        waiter = self.enter(offset, event)
        try:
            await event.wait()
        finally:
            self.leave(waiter)

    def enter(self, offset: int, event: Settable) -> Waiter:
        """Set `event` once `note_high_watermark` passes `offset` or more, or `wake_all`, unless
        `leave` comes first: for a task that waits on several partitions at once."""
        waiter = Waiter(event)
        heapq.heappush(self._heap, (offset, next(self._order), waiter))
        return waiter

    def leave(self, waiter: Waiter) -> None:
        """Forget `waiter` if it is still in the heap (its wait is over: leave nothing
        behind)."""
        if waiter.popped or waiter.cancelled:
            return
        waiter.cancelled = True
        self._cancelled += 1
        if self._cancelled * 2 > len(self._heap):
            self._heap = [entry for entry in self._heap if not entry[2].cancelled]
            heapq.heapify(self._heap)
            self._cancelled = 0

    def note_high_watermark(self, high_watermark: int) -> int:
        """Wake the waiters for offsets up to `high_watermark`; returns how many."""
        woken = 0
        heap = self._heap
        while heap and heap[0][0] <= high_watermark:
            waiter = heapq.heappop(heap)[2]
            if waiter.cancelled:
                self._cancelled -= 1
            else:
                waiter.popped = True
                waiter.event.set()
                woken += 1
        self._woken += woken
        return woken

    def wake_all(self) -> int:
        """Wake every waiter, whatever it waits for; returns how many."""
        heap, self._heap, self._cancelled = self._heap, [], 0
        woken = 0
        for _, _, waiter in heap:
            if not waiter.cancelled:
                waiter.popped = True
                waiter.event.set()
                woken += 1
        self._woken += woken
        return woken

    def statistics(self) -> FlushWaitersStatistics:
        return FlushWaitersStatistics(
            waiting=len(self._heap) - self._cancelled, entries=len(self._heap), woken=self._woken
        )
