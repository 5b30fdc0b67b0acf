"""Watching a socket's CurveZMQ handshakes: its monitor, made before it connects, and closing
the two together. Clients (broker.client, broker.aio) and the broker's own client sockets (a
follower's fetcher) and its front read handshakes this way."""

from __future__ import annotations

import itertools
import os
from typing import Any, Final, TypeVar

import zmq

HANDSHAKE_EVENTS: Final = (
    zmq.EVENT_HANDSHAKE_SUCCEEDED
    | zmq.EVENT_HANDSHAKE_FAILED_AUTH
    | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
    | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
)
"""The events of a broker's client socket's monitor (a follower's fetcher)."""
CLIENT_EVENTS: Final = HANDSHAKE_EVENTS | zmq.EVENT_CONNECTED | zmq.EVENT_CONNECT_RETRIED
"""The events of a client's socket's monitor (a socket without keys has one until its first
handshake succeeds: Connection._checked): its handshakes, and its connections made and
refused (broker.client.connection.Handshakes)."""
_monitor_numbers = itertools.count(1)
_Socket = TypeVar("_Socket", bound=zmq.Socket[Any])


def monitor_handshakes(socket: _Socket, events: int = HANDSHAKE_EVENTS) -> _Socket:
    """A PAIR socket receiving `socket`'s `events` (made before it connects, so that no event
    is missed), on an inproc address of its own; close it when `socket` is closed."""
    address = f"inproc://pylog-handshakes-{os.getpid()}-{next(_monitor_numbers)}"
    return socket.get_monitor_socket(events, address)


def close_monitored(socket: _Socket, monitor: _Socket, linger_ms: int | None = None) -> None:
    """Close `socket` (with its own linger when `linger_ms` is None) and `monitor`, its monitor
    (monitor_handshakes), the monitoring stopped first. libzmq's I/O thread hands a socket's
    events to its monitor with a blocking send: an event after the monitor's PAIR is closed (a
    handshake that ends while the socket is closed, or lingers) would block that thread for
    ever, and with it every socket of the context."""
    socket.disable_monitor()
    monitor.close(linger=0)
    socket.close(linger_ms)
