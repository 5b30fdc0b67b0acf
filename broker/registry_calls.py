"""Registry calls made off the supervisor's loop (broker.front): each runs on a thread that may
wait on ZooKeeper, and its result, like what a watch saw, comes back as an event that the loop
applies (`apply`, from Topics.tick), never on kazoo's threads. Each event also writes a byte to
`wake_fd`'s socket pair, which the loop polls: an event is applied at once, not at the loop's
next tick (a group member's heartbeat waits for its write's)."""

from __future__ import annotations

import concurrent.futures
import contextlib
import functools
import logging
import queue
import socket
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

from broker.errors import PylogError, RegistryUnavailable

if TYPE_CHECKING:  # annotations only: a worker imports this module, and no kazoo
    from broker.registry import Registry

log = logging.getLogger("pylog.supervisor")

T = TypeVar("T")


class RegistryCalls:
    """Registry calls made off the loop, and the events that bring back their results and what
    the watches saw; the loop applies them with `apply()`. `registry` is set once started."""

    def __init__(self) -> None:
        self.registry: Registry | None = None
        self._events: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        self._thread = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="registry")
        """The one thread that makes registry calls for the loop."""
        self._wake_read, self._wake_write = socket.socketpair()
        self._wake_read.setblocking(False)
        self._wake_write.setblocking(False)

    @property
    def wake_fd(self) -> int:
        """Readable when events wait to be applied (the loop polls it; `apply` empties it)."""
        return self._wake_read.fileno()

    def _put(self, event: Callable[[], None]) -> None:
        self._events.put(event)
        # BlockingIOError: the pair is full, the loop is woken already. Another OSError: shut
        # down, and a watch still reports until the registry stops (nothing applies it).
        with contextlib.suppress(OSError):
            self._wake_write.send(b"\0")

    def call(
        self,
        call: Callable[[Registry], T],
        done: Callable[[T], None],
        failed: Callable[[PylogError], None],
        thread: concurrent.futures.Executor | None = None,
    ) -> None:
        """Run `call(registry)` on the registry thread (or `thread`), then `done(result)` or,
        if it raised a PylogError, `failed(error)` on the loop (as an event)."""
        registry = self.registry
        assert registry is not None
        put = self._put

        def run() -> None:
            try:
                result = call(registry)
            except PylogError as error:
                put(functools.partial(failed, error))
            except Exception as error:  # a bug: logged, and the caller told it failed
                log.exception("registry call failed")
                unexpected = RegistryUnavailable(f"registry call failed: {error}")
                put(functools.partial(failed, unexpected))
            else:
                put(functools.partial(done, result))

        (thread or self._thread).submit(run)

    def report(self, event: Callable[[], None]) -> None:
        """Have the loop run `event` (from any thread: a watch's)."""
        self._put(event)

    def apply(self) -> None:
        """Run the events reported so far, in order, on the calling (the loop's) thread."""
        with contextlib.suppress(BlockingIOError):
            while self._wake_read.recv(4096):
                pass
        while True:
            try:
                apply = self._events.get_nowait()
            except queue.Empty:
                return
            apply()

    def shutdown(self) -> None:
        """Wait for the call under way; drop those not started."""
        self._thread.shutdown(wait=True, cancel_futures=True)
        self._wake_read.close()
        self._wake_write.close()
