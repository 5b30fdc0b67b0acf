"""broker.supervisor.sd_notify: the states pylogd sends systemd (Type=notify)."""

from __future__ import annotations

import socket
import tempfile
import threading
from pathlib import Path

import pytest

from broker.supervisor import sd_notify


def send(times: int) -> None:
    for _ in range(times):
        sd_notify("WATCHDOG=1")


def test_a_receiver_that_does_not_read_never_blocks_the_sender(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # pylogd sends WATCHDOG=1 from its loop while it waits for its workers; a receiver that
    # reads only once pylogd is READY (as tests/broker/test_pylogd.py's did) filled its queue
    # (net.unix.max_dgram_qlen, 10 by default) and the next send blocked pylogd for ever.
    with tempfile.TemporaryDirectory(dir="/tmp") as short:  # a unix socket path is <= 107 bytes
        path = str(Path(short) / "notify")
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as receiver:
            receiver.bind(path)
            monkeypatch.setenv("NOTIFY_SOCKET", path)
            sent = threading.Thread(target=lambda: send(100))
            sent.start()
            sent.join(10)
            blocked = sent.is_alive()
            receiver.close()  # a blocked send ends with an error now
            sent.join(10)
    assert not blocked, "sd_notify blocked on a receiver that does not read"
    assert "sd_notify 'WATCHDOG=1' dropped" in caplog.text
