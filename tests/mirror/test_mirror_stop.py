"""A mirror stopped (its task cancelled, as SIGTERM does) while an administration call waits on
the target: the call ends on the mirror's admin thread before the clients are closed there. A
ZeroMQ socket closed from another thread while a call waits on it can crash the process: CI
saw pylog-mirror end with SIGSEGV at SIGTERM while it retried a target it could not reach."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType

import zmq

from broker.client import Admin
from broker.mirror.config import MirrorConfig
from broker.mirror.mirror import Mirror
from tests.client.router import serving
from tests.mirror.conftest import mirror_config
from tests.pylogd import RunningBroker


@dataclass
class SilentBroker:
    """A played broker that takes every request and answers none (a target that hangs)."""

    endpoint: str = ""
    requests: list[bytes] = field(default_factory=list)

    def serve(self, socket: zmq.Socket[bytes], stop: threading.Event) -> None:
        while not stop.is_set():
            if socket.poll(20):
                self.requests.append(socket.recv_multipart()[-1])


class ConnectionUse:
    """Who uses and closes client connections, and when: a profile hook on every thread started
    while it is installed (threading.setprofile), watching `Connection._request_once` (calls
    and returns) and `Connection.close`. `overlaps` lists each close made while another thread
    was inside a request."""

    def __init__(self) -> None:
        self.inside: dict[int, int] = {}
        """Thread id -> how many requests it is inside now."""
        self.overlaps: list[str] = []
        self._lock = threading.Lock()

    def __call__(self, frame: FrameType, event: str, arg: object) -> None:
        code = frame.f_code
        if not code.co_filename.endswith("broker/client/connection.py"):
            return
        me = threading.get_ident()
        with self._lock:
            if code.co_name == "_request_once" and event in ("call", "return"):
                self.inside[me] = self.inside.get(me, 0) + (1 if event == "call" else -1)
            elif code.co_name == "close" and event == "call":
                busy = [t for t, n in self.inside.items() if n > 0 and t != me]
                if busy:
                    self.overlaps.append(f"closed on {me} while {busy} waited in a request")


def test_a_mirror_stopped_during_an_admin_call_closes_its_clients_once_the_call_ended(
    broker: RunningBroker, topic: str, tmp_path: Path
) -> None:
    with Admin(broker.endpoint) as admin:
        admin.create_topic(topic, 1)
    with serving(SilentBroker()) as target:
        path = tmp_path / "mirror.toml"
        path.write_text(mirror_config(broker.endpoint, target.endpoint, [topic], "timeout_s = 1\n"))
        config = MirrorConfig.load(path)

        async def stopped_during_a_call() -> None:
            mirror = Mirror(config)
            running = asyncio.create_task(mirror.run())
            deadline = time.monotonic() + 30
            while not target.requests and time.monotonic() < deadline:  # bounded: 30 s
                await asyncio.sleep(0.01)
            assert target.requests, "the mirror asked nothing of its target"
            running.cancel()  # what SIGTERM does in pylog-mirror
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.wait_for(running, 60)

        use = ConnectionUse()
        threading.setprofile(use)
        try:
            asyncio.run(stopped_during_a_call())
        finally:
            threading.setprofile(None)
    assert use.overlaps == []
