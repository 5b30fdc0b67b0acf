"""Registry calls' events wake the supervisor's loop (broker.registry_calls): `wake_fd` is
readable as soon as an event waits, and no longer once `apply` ran them, so the loop polls it
and applies a result at once instead of at its next tick."""

from __future__ import annotations

import select

from broker.registry_calls import RegistryCalls


def readable(fd: int) -> bool:
    return bool(select.select([fd], [], [], 0)[0])


def test_an_event_wakes_the_loop_until_it_is_applied() -> None:
    calls = RegistryCalls()
    try:
        ran: list[int] = []
        assert not readable(calls.wake_fd)
        for i in range(3):
            calls.report(lambda i=i: ran.append(i))  # type: ignore[misc]
        assert readable(calls.wake_fd)
        calls.apply()
        assert ran == [0, 1, 2] and not readable(calls.wake_fd)
    finally:
        calls.shutdown()


def test_a_flood_of_events_never_blocks_the_thread_that_reports_them() -> None:
    """The socket pair's buffer fills: the byte is dropped (the loop is woken already)."""
    calls = RegistryCalls()
    try:
        ran: list[None] = []
        for _ in range(200_000):
            calls.report(lambda: ran.append(None))
        calls.apply()
        assert len(ran) == 200_000 and not readable(calls.wake_fd)
    finally:
        calls.shutdown()


def test_an_event_reported_after_shutdown_is_dropped_quietly() -> None:
    """A watch reports until the registry stops, after the calls shut down (Supervisor.shutdown):
    it logged EBADF from the closed socket pair as an error at every Ctrl-C."""
    calls = RegistryCalls()
    calls.shutdown()
    calls.report(lambda: None)
