"""The tasks of a worker waiting for a partition's high watermark to reach an offset.

Long polls wait for offset + min_bytes, producers on ack=flushed for the end of their messages.
They wait in a heap by that offset, so a flush wakes only those it satisfies (FlushWaiters).
"""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass

import trio


@dataclass(frozen=True)
class FlushWaitersStatistics:
    waiting: int
    """Tasks waiting now."""
    entries: int
    """Entries held: the waiting and the cancelled ones not yet cleared out (at most about
    twice `waiting`)."""
    woken: int
    """Tasks woken so far (a cancelled one is not counted)."""


class _Waiter:
    __slots__ = ("cancelled", "event")

    def __init__(self) -> None:
        self.event = trio.Event()
        self.cancelled = False


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
        self._heap: list[tuple[int, int, _Waiter]] = []
        self._order = itertools.count()  # ties: first come, first woken; waiters never compared
        self._cancelled = 0
        self._woken = 0

    async def wait_high_watermark(self, offset: int) -> None:
        """Wait until `note_high_watermark` passes `offset` or more, or `wake_all`: the caller
        checks which (a deleted or offline partition is woken too)."""
        waiter = _Waiter()
        heapq.heappush(self._heap, (offset, next(self._order), waiter))
        try:
            await waiter.event.wait()
        finally:
            if not waiter.event.is_set():  # cancelled: leave nothing behind
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
                waiter.event.set()
                woken += 1
        self._woken += woken
        return woken

    def statistics(self) -> FlushWaitersStatistics:
        return FlushWaitersStatistics(
            waiting=len(self._heap) - self._cancelled, entries=len(self._heap), woken=self._woken
        )
