"""Reading what a process prints, line by line, as it comes, with a deadline.

A file object's readline() reads the pipe a chunk at a time and keeps what follows the line in
a buffer of its own, which select() on the pipe does not see: two lines printed together, and
the second one waits there unseen until the deadline (how test_follow_reads_on_through_a_
broker_restart missed a record the consumer had printed). So the lines are read here with
os.read on the pipe's descriptor, and split here: select then tells the truth."""

from __future__ import annotations

import os
import select
import time
from typing import IO


class PipeLines:
    """The lines written to `pipe` (a process's stdout or stderr, text or bytes), read from
    its descriptor: do not read the pipe's file object as well (communicate() after the
    last line read here is fine)."""

    def __init__(self, pipe: IO[str] | IO[bytes]) -> None:
        self._fd = pipe.fileno()
        self._pending = b""
        self._ended = False

    def next_line(self, deadline: float) -> str | None:
        """The next whole line, newline included, as text; the last bytes without one when
        the pipe ends ("" once nothing is left); None when no line is whole by `deadline`
        (time.monotonic())."""
        while b"\n" not in self._pending and not self._ended:
            wait = max(0.0, deadline - time.monotonic())
            if not select.select([self._fd], [], [], wait)[0]:
                return None
            chunk = os.read(self._fd, 65536)
            self._pending += chunk
            self._ended = not chunk
        line, newline, self._pending = self._pending.partition(b"\n")
        return (line + newline).decode()

    def lines(self, count: int, timeout: float) -> list[str]:
        """The next `count` lines, fewer if the pipe ends or `timeout` seconds pass first."""
        deadline = time.monotonic() + timeout
        got: list[str] = []
        while len(got) < count:
            line = self.next_line(deadline)
            if not line:
                break
            got.append(line)
        return got
