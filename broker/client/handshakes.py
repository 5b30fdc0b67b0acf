"""A client socket's handshakes with a broker, read from its ZeroMQ monitor: a Curve key
refused, a broker that serves Curve to a client without keys (or plaintext to one with them),
nothing listening at the address. Each becomes the error a client raises (AuthenticationFailed,
ConnectionRefused) with what to do about it (docs/security.md)."""

from __future__ import annotations

import os
from typing import Final

import zmq

from broker.clock import SYSTEM_CLOCK
from broker.errors import AuthenticationFailed, ConnectionRefused
from broker.security.monitor import CLIENT_EVENTS, monitor_handshakes
from broker.zmqio import monitor_event

BROKEN_HANDSHAKES: Final = 3
"""Handshakes in a row that the broker breaks off without a reason before the client gives up:
what a client holding another broker key meets (the broker cannot read its HELLO and hangs up),
and often one of a plaintext broker (which may hang up before the client has read that it
speaks no Curve); ZeroMQ tries again every 0.1 s or so. One alone may be a broker stopping."""
ZAP_STATUS: Final = {
    300: "a temporary error",
    400: "the key is no principal's: pylogctl principal add",
    500: "an internal error of the broker's",
}
"""What a broker's ZAP status code (RFC 27) says about a refused key."""
PROTOCOL_ERRORS: Final[dict[int, str]] = {
    zmq.PROTOCOL_ERROR_ZMTP_CRYPTOGRAPHIC: (
        "a cryptographic error (is the broker key the broker's public key?)"
    ),
    zmq.PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH: (
        "the broker does not speak Curve (a plaintext broker: connect without keys)"
    ),
}
"""What ZeroMQ's protocol error (ZMQ_PROTOCOL_ERROR_*) says about a failed Curve handshake."""
NO_KEYS: Final = (
    "the broker at {endpoint} serves CurveZMQ (encrypted and authenticated){how} and this "
    "client has no keys: give it its secret key file and the broker's public key (Python: "
    "keys=ClientKeys.load(...); pylogctl: --key-file and --broker-key; docs/security.md)"
)
"""A client without keys at a broker serving Curve (Handshakes, curve False); `how` is empty
when ZeroMQ said the mechanisms differ, else how the broker's hanging up showed it."""
NOT_A_BROKER: Final = (
    "; or no pylog broker listens there (ZooKeeper's address given as a broker's?)"
)
"""Said after NO_KEYS when the peer hung up before its greeting, as ZooKeeper does too."""


class Handshakes:
    """The handshakes of one client socket, from its monitor's events (`take`, CLIENT_EVENTS).
    `failure` is the AuthenticationFailed to raise when the last handshake was refused by the
    broker's ZAP handler, failed ZeroMQ's protocol, or was broken off BROKEN_HANDSHAKES times in
    a row; None before the first handshake and after one succeeded. A client without keys
    (`curve` False) learns only that the broker serves Curve: its handshake fails at once on
    the mechanism, and the broker never answers it otherwise.

    `refused` is the ConnectionRefused to raise when a connection attempt failed without
    connecting (ZeroMQ tries again after its reconnect interval, CONNECT_RETRIED with no
    CONNECTED since the last one: nothing listens there), until taken (`take_refusal`); a
    connection that was made and then dropped (a handshake broken off) is not a refusal."""

    def __init__(self, endpoint: str, curve: bool = True) -> None:
        self.endpoint = endpoint
        self.curve = curve
        self.failure: AuthenticationFailed | None = None
        self.succeeded = False
        """Whether the last handshake taken succeeded."""
        self._broken = 0
        self.refused: ConnectionRefused | None = None
        self._connected = False
        """Whether a connection was made since the last attempt that ZeroMQ tries again."""

    def take_refusal(self) -> ConnectionRefused | None:
        """The refusal met since the last call, if any (then forgotten: the next attempt,
        ZeroMQ's reconnect interval later, may find the broker back)."""
        refused, self.refused = self.refused, None
        return refused

    def take(self, frames: list[bytes]) -> None:
        """Take one event of the monitor."""
        kind, value = monitor_event(frames)
        if kind == zmq.EVENT_CONNECTED:
            self._connected = True
            return
        if kind == zmq.EVENT_CONNECT_RETRIED:
            if not self._connected:
                self.refused = ConnectionRefused(self.endpoint)
            self._connected = False
            return
        self.succeeded = kind == zmq.EVENT_HANDSHAKE_SUCCEEDED
        if self.succeeded:
            self.failure, self._broken = None, 0
        elif kind == zmq.EVENT_HANDSHAKE_FAILED_AUTH:  # value: the ZAP status code
            cause = ZAP_STATUS.get(value, "see the broker's log")
            self._fail(
                f"the broker at {self.endpoint} refused this client's key (ZAP {value}: {cause})"
            )
        elif kind == zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL:  # value: a ZMQ_PROTOCOL_ERROR_*
            if not self.curve:
                if value == zmq.PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH:
                    self._fail(NO_KEYS.format(endpoint=self.endpoint, how=""))
                return
            cause = PROTOCOL_ERRORS.get(
                value, f"ZeroMQ protocol error {value:#x} (is a pylog broker at that address?)"
            )
            self._fail(f"the Curve handshake with {self.endpoint} failed: {cause}")
        elif kind == zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL:  # value: an errno
            self._broken += 1
            if self._broken < BROKEN_HANDSHAKES:
                return
            broken = f"{self._broken} times in a row ({os.strerror(value)})"
            if not self.curve:  # the peer hung up before this client read its greeting
                how = f" (it broke off the handshake {broken})"
                self._fail(NO_KEYS.format(endpoint=self.endpoint, how=how) + NOT_A_BROKER)
                return
            self._fail(
                f"the Curve handshake with {self.endpoint} failed: the broker broke it off "
                f"{broken}, as one does that cannot read the client's hello (is the broker key "
                "the broker's public key?) or that serves plaintext"
            )

    def _fail(self, message: str) -> None:
        self.failure = AuthenticationFailed(self.endpoint, message)


class HandshakeMonitor(Handshakes):
    """The handshakes of a blocking client socket, read from its monitor without waiting, and
    a poller of the socket and its monitor together."""

    def __init__(self, socket: zmq.Socket[bytes], endpoint: str, curve: bool = True) -> None:
        super().__init__(endpoint, curve)
        self.socket: zmq.Socket[bytes] = monitor_handshakes(socket, CLIENT_EVENTS)
        self._watched = socket
        self._poller = zmq.Poller()
        self._poller.register(socket, zmq.POLLIN)
        self._poller.register(self.socket, zmq.POLLIN)

    def check(self) -> None:
        """Take every event waiting (never waits); raise `failure` if there is one."""
        # EVENTS, not a NOBLOCK recv: half the cost when nothing waits (3 us, not 6.5)
        while int(self.socket.getsockopt(zmq.EVENTS)) & zmq.POLLIN:
            self.take(self.socket.recv_multipart())
        if self.failure is not None:
            raise self.failure

    def wait_readable(self, timeout_s: float) -> bool:
        """Whether the socket has a message to read within `timeout_s`; AuthenticationFailed
        as soon as a handshake fails, ConnectionRefused as soon as a connection is refused
        (the monitor is read when it has events, and at the timeout)."""
        deadline = SYSTEM_CLOCK.monotonic() + timeout_s  # a socket's wait: real time
        timeout_ms = poll_ms(timeout_s)
        while True:
            if self._watched in dict(self._poller.poll(timeout_ms)):
                return True
            self.check()
            refused = self.take_refusal()
            if refused is not None:
                raise refused
            timeout_ms = round((deadline - SYSTEM_CLOCK.monotonic()) * 1000)
            if timeout_ms <= 0:
                return False


def poll_ms(timeout_s: float) -> int:
    """A poll's timeout in ms for `timeout_s`: 0 for 0 (only look), else at least 1 ms, so that
    a wait of a fraction of a millisecond waits rather than spins."""
    return 0 if timeout_s <= 0 else max(1, round(timeout_s * 1000))
