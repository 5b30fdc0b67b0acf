"""broker.zmqio.monitor_event reads a socket monitor's events as pyzmq's parse_monitor_message
does (without importing asyncio, as pyzmq's module does), from a real monitor on loopback."""

from __future__ import annotations

from typing import Any

import pytest
import zmq
from zmq.utils.monitor import parse_monitor_message

from broker.zmqio import monitor_event


def test_a_monitor_event_reads_as_pyzmq_reads_it() -> None:
    context: zmq.Context[zmq.Socket[Any]] = zmq.Context()
    try:
        server = context.socket(zmq.ROUTER)
        server.setsockopt(zmq.LINGER, 0)
        port = server.bind_to_random_port("tcp://127.0.0.1")
        client = context.socket(zmq.DEALER)
        client.setsockopt(zmq.LINGER, 0)
        monitor = client.get_monitor_socket(zmq.EVENT_CONNECTED | zmq.EVENT_HANDSHAKE_SUCCEEDED)
        monitor.setsockopt(zmq.RCVTIMEO, 10_000)
        client.connect(f"tcp://127.0.0.1:{port}")
        seen = []
        for _ in range(2):
            frames = monitor.recv_multipart()
            event = parse_monitor_message(frames)
            assert monitor_event(frames) == (event["event"], int(event["value"]))
            seen.append(event["event"])
        assert seen == [zmq.EVENT_CONNECTED, zmq.EVENT_HANDSHAKE_SUCCEEDED]
        with pytest.raises(ValueError, match="not a ZeroMQ monitor event"):
            monitor_event([b"\x00" * 5, b"tcp://x"])
        client.disable_monitor()
    finally:
        context.destroy(linger=0)
