"""Who a connection is: the principals (a name per client key, in ZooKeeper or in the
principals file), and the broker's ZAP handler, which lets a Curve handshake in only with a
principal's key (docs/security.md). All of it runs on the front's loop (broker.front), which
never waits here.

ZapHandler answers ZeroMQ's authentication requests (ZAP, RFC 27) during each Curve handshake:
a client key that names a principal (Principals) is let in with that principal as its ZeroMQ
User-Id, any other is refused by ZeroMQ itself, before a request is read, and counted. A key of
the cluster (BrokerKeys: the brokers' own key pair, and security.broker_keys) is the cluster
principal, CLUSTER_PRINCIPAL: another broker, whose followers fetch as replicas.
HandshakeFailures counts the handshakes that fail before ZAP is asked.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Final

import zmq
import zmq.auth
from zmq.utils import z85

from broker.errors import InvalidTopic
from broker.protocol import check_topic_name
from broker.ratelog import RateLimitedLog
from broker.security.keys import (
    KeyFileError,
    check_key,
    check_not_writable_by_others,
)

log = logging.getLogger("pylog.security")

ZAP_ENDPOINT: Final = "inproc://zeromq.zap.01"
"""Where ZeroMQ sends the authentication requests of every socket of a context (RFC 27)."""
ZAP_VERSION: Final = b"1.0"
PRINCIPALS_FILE_CHECK_S: Final = 1.0
"""How often the principals file is looked at for a change (its mtime and size)."""
CLUSTER_PRINCIPAL: Final = "pylog:brokers"
"""The principal of the cluster's keys (BrokerKeys): the brokers. Its name is no principal
name (a colon), so no client principal, ACL or super user can name it."""


def check_principal_name(name: str) -> None:
    """ValueError unless `name` is 1-249 of A-Z a-z 0-9 . _ - (a principal's name goes into
    logs, ACLs and ZeroMQ's User-Id)."""
    try:
        check_topic_name(name)
    except InvalidTopic as error:
        raise ValueError(
            f"principal name {name!r}: {str(error).replace('topic name', 'name')}"
        ) from None


def read_principals_file(path: Path) -> dict[str, str]:
    """public key (Z85 text) -> principal from a principals file, which no one but its owner
    (this user, or root) may write: one `NAME KEY` a line, where KEY
    is the 40 Z85 characters of a client's public key (a name on two lines has two keys);
    blank lines and lines starting with `#` are passed over. KeyFileError naming the line for
    anything else, and for a key given twice."""
    check_not_writable_by_others(path)
    principals: dict[str, str] = {}
    for number, line in enumerate(path.read_text().splitlines(), 1):
        text = line.strip()
        if not text or text.startswith("#"):  # not after a key: Z85 has "#" in its alphabet
            continue
        parts = text.split()
        where = f"{path}:{number}"
        if len(parts) != 2:
            raise KeyFileError(f"{where}: write NAME KEY (the client's 40-character public key)")
        name, key = parts
        try:
            check_principal_name(name)
        except ValueError as error:
            raise KeyFileError(f"{where}: {error}") from None
        check_key(key.encode(), f"{where} key of {name}")
        if key in principals:
            raise KeyFileError(f"{where}: the key is given twice")
        principals[key] = name
    return principals


class Principals:
    """Which client key is which principal: the principals in ZooKeeper (`from_registry`,
    called by its watch, on a thread of kazoo's) and those of a principals file (looked at
    every PRINCIPALS_FILE_CHECK_S by `check_file`, from the loop). A key in both is
    ZooKeeper's. The cluster's keys (`cluster_keys`, BrokerKeys.cluster) are CLUSTER_PRINCIPAL,
    whatever else names them. Keys are Z85 text, as ZeroMQ's User-Id gives them. A lookup reads
    one dict, replaced whole on a change; changes are made under a lock (they come from two
    threads)."""

    def __init__(self, file: Path | None, cluster_keys: Iterable[bytes] = ()) -> None:
        self.file = file
        self._cluster = {key.decode(): CLUSTER_PRINCIPAL for key in cluster_keys}
        self._clients = 0
        self._lock = threading.Lock()
        self._file_log = RateLimitedLog(log, 60.0)
        self._file_stamp: tuple[float, int] | None = None
        self._from_file: dict[str, str] = {}
        self._from_registry: dict[str, str] = {}
        self._by_key: dict[str, str] = {}
        if file is not None:
            self._from_file = read_principals_file(file)  # at start a bad file stops pylogd
            self._file_stamp = _stamp(file)
        self._rebuild()

    def principal(self, key: str) -> str | None:
        """The principal of a client's public key (Z85 text), None for a key not let in."""
        return self._by_key.get(key)

    def __len__(self) -> int:
        """How many client keys are let in (the cluster's keys aside)."""
        return self._clients

    def from_registry(self, principals: Mapping[str, Iterable[bytes]]) -> None:
        by_key: dict[str, str] = {}
        for name, keys in principals.items():
            for key in keys:
                text = key.decode()
                if by_key.setdefault(text, name) != name:  # a hand edit in ZooKeeper
                    log.warning(
                        "a key is both %r's and %r's in ZooKeeper: %r it is",
                        by_key[text],
                        name,
                        by_key[text],
                    )
        with self._lock:
            self._from_registry = by_key
            self._rebuild()

    def check_file(self) -> None:
        """Read the principals file again if it changed; a file that cannot be read now keeps
        the principals it gave before (logged)."""
        if self.file is None:
            return
        try:
            stamp = _stamp(self.file)
        except OSError as error:
            self._file_log.log(logging.ERROR, "stat", f"principals file: {error}; kept as read")
            return
        if stamp == self._file_stamp:  # only this thread (the loop) reads and sets it
            return
        self._file_stamp = stamp
        try:
            from_file = read_principals_file(self.file)
        except (OSError, ValueError) as error:
            log.error("principals file not read again, its principals so far are kept: %s", error)
            return
        with self._lock:
            self._from_file = from_file
            self._rebuild()
        log.info("principals file %s read again: %d keys", self.file, len(from_file))

    def _rebuild(self) -> None:
        for key, name in self._from_registry.items():
            other = self._from_file.get(key, name)
            if other != name:
                log.warning("key of %r is %r's in the file: ZooKeeper's wins", name, other)
        clients = {**self._from_file, **self._from_registry}
        for key in clients.keys() & self._cluster.keys():
            log.warning(
                "principal %r names a key of the cluster (the brokers' own): it is taken for a "
                "broker's, and %r gets nothing by it",
                clients[key],
                clients[key],
            )
        self._clients = len(clients.keys() - self._cluster.keys())
        self._by_key = {**clients, **self._cluster}


def _stamp(path: Path) -> tuple[float, int]:
    info = path.stat()
    return info.st_mtime, info.st_size


class ZapHandler:
    """The broker's ZAP handler: a REP socket on ZAP_ENDPOINT of the front's context, read by
    the front's loop (`take` for each request). A CURVE handshake whose client key names
    a principal is accepted (status 200) with the principal as User-Id; any other is refused
    (400), and ZeroMQ closes that connection before a request of it is read."""

    def __init__(self, context: zmq.Context[zmq.Socket[bytes]], principals: Principals) -> None:
        self.principals = principals
        self.socket = context.socket(zmq.REP)
        self.socket.setsockopt(zmq.LINGER, 0)
        self.socket.bind(ZAP_ENDPOINT)
        self.accepted = 0
        """Handshakes let in (broker.metrics)."""
        self.refused = 0
        """Handshakes refused: an unknown key, or not CURVE (broker.metrics)."""
        self._refusals = RateLimitedLog(log, 10.0)

    def take(self, request: list[bytes]) -> None:
        """Answer one ZAP request read from `socket`."""
        self.socket.send_multipart(self._answer(request))

    def _answer(self, request: list[bytes]) -> list[bytes]:
        if len(request) < 6 or request[0] != ZAP_VERSION:
            request_id = request[1] if len(request) > 1 else b""
            return [ZAP_VERSION, request_id, b"500", b"malformed ZAP request", b"", b""]
        _, request_id, _, address, _, mechanism, *credentials = request
        if mechanism == b"CURVE" and len(credentials) == 1 and len(credentials[0]) == 32:
            key = z85.encode(credentials[0])
            if self.principals.principal(key.decode()) is not None:
                self.accepted += 1
                # The User-Id is the key, not the principal: each request looks the key up
                # anew, so a key removed stops its open connections too (broker.front).
                return [ZAP_VERSION, request_id, b"200", b"OK", key, b""]
            reason = f"unknown client key {key.decode()}"
        else:
            reason = f"mechanism {mechanism.decode(errors='replace')}, not CURVE"
        self.refused += 1
        self._refusals.log(
            logging.WARNING,
            "refused",
            f"refused a connection from {address.decode(errors='replace')}: {reason}",
        )
        return [ZAP_VERSION, request_id, b"400", reason.encode(), b"", b""]

    def close(self) -> None:
        self.socket.close(linger=0)


class HandshakeFailures:
    """Counts the Curve handshakes of a socket that fail before the ZAP handler is asked (read
    from the socket's monitor, polled by the front's loop): a client that does not speak Curve
    (plaintext), or one that holds another broker key. Refusals by the ZAP handler (an unknown
    client key) are ZapHandler's."""

    EVENTS: Final = zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
    REASONS: Final[dict[int, str]] = {
        zmq.PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH: "not_curve",
        zmq.PROTOCOL_ERROR_ZMTP_CRYPTOGRAPHIC: "wrong_broker_key",
    }
    """Why, by ZeroMQ's protocol error: the `reason` label of pylog_handshakes_failed_total."""
    TEXTS: Final = {
        "not_curve": "the client does not speak Curve (a plaintext client?)",
        "wrong_broker_key": "a cryptographic error (the client holds another broker key?)",
    }

    def __init__(self) -> None:
        self.failed = dict.fromkeys([*self.REASONS.values(), "other"], 0)
        """Failed handshakes by reason (REASONS' values, or "other"): every key there from the
        start, so that the metrics thread never sees the dict grow."""
        self._log = RateLimitedLog(log, 10.0)

    def take(self, event: int, value: int) -> None:
        """Count one of EVENTS, read from the front socket's monitor (broker.front)."""
        if event == zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL:  # value: an errno
            reason, text = "other", f"the connection broke ({os.strerror(value)})"
        else:  # value: a ZeroMQ protocol error
            reason = self.REASONS.get(value, "other")
            text = self.TEXTS.get(reason, f"ZeroMQ protocol error {value:#x}")
        self.failed[reason] += 1
        self._log.log(logging.WARNING, reason, f"a Curve handshake failed: {text}")
