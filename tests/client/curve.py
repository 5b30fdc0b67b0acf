"""CurveZMQ servers for the clients' tests: a Curve front relaying to a real plaintext pylogd,
and a real pylogd in curve mode.

`CurveRelay` is a ROUTER with curve_server on 127.0.0.1, its own key pair, and a ZAP handler
of its own (RFC 27, on the relay's context) that lets in the client keys in `allowed` and
refuses any other, recording each decision in `seen`. Each request let through is sent to the
real broker (a DEALER, one request at a time) and its reply sent back; a METADATA reply names
the relay as every broker, so that a client reaches the partitions through the relay too.
ZeroMQ asks the ZAP handler only when a handshake got that far: a client with a wrong broker
key, or without keys, is dropped before (`seen` stays empty), and gets no reply at all.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import zmq
from zmq.utils import z85

from broker.protocol import (
    Ack,
    Api,
    BrokerInfo,
    MetadataReply,
    ProduceRequest,
    decode_reply,
    decode_reply_header,
    decode_request,
    encode_reply,
)
from broker.security import ClientKeys, generate_keys, load_key_pair
from broker.zookeeper import PrivateZooKeeper
from tests.conftest import single_box_flags
from tests.pylogd import RunningBroker

ZAP_ENDPOINT = "inproc://zeromq.zap.01"
BROKER_REPLY_TIMEOUT_MS = 10_000


@dataclass
class CurveRelay:
    broker_endpoint: str
    """The real (plaintext) pylogd the requests go to."""
    public: bytes
    secret: bytes
    allowed: set[bytes]
    """Z85 public keys of the clients let in."""
    endpoint: str = ""
    seen: list[tuple[bytes, bool]] = field(default_factory=list)
    """Each ZAP request answered: the client's Z85 public key, and whether it was let in."""
    relayed: list[Api] = field(default_factory=list)
    """The api of each request relayed to the broker."""
    ready: threading.Event = field(default_factory=threading.Event)
    """Set once the front is bound (`endpoint` known)."""

    def serve(self, context: zmq.Context[zmq.Socket[bytes]], stop: threading.Event) -> None:
        zap = context.socket(zmq.REP)
        zap.bind(ZAP_ENDPOINT)
        front = context.socket(zmq.ROUTER)
        front.curve_server = True
        front.curve_publickey = self.public
        front.curve_secretkey = self.secret
        port = front.bind_to_random_port("tcp://127.0.0.1")
        self.endpoint = f"tcp://127.0.0.1:{port}"
        back = context.socket(zmq.DEALER)
        back.connect(self.broker_endpoint)
        self.ready.set()
        poller = zmq.Poller()
        poller.register(zap, zmq.POLLIN)
        poller.register(front, zmq.POLLIN)
        try:
            while not stop.is_set():
                ready = dict(poller.poll(20))
                if zap in ready:
                    self._authenticate(zap)
                if front in ready:
                    self._relay(front, back, port)
        finally:
            for socket in (zap, front, back):
                socket.close(linger=0)

    def _authenticate(self, zap: zmq.Socket[bytes]) -> None:
        version, request_id, _domain, _address, _identity, mechanism, *credentials = (
            zap.recv_multipart()
        )
        key = z85.encode(credentials[0]) if mechanism == b"CURVE" else b""
        allowed = key in self.allowed
        self.seen.append((key, allowed))
        status = (b"200", b"OK") if allowed else (b"400", b"unknown client key")
        zap.send_multipart([version, request_id, *status, key, b""])

    def _relay(self, front: zmq.Socket[bytes], back: zmq.Socket[bytes], port: int) -> None:
        identity, *frames = front.recv_multipart()
        envelope = [identity]
        if frames and frames[0] == b"":  # a REQ client's delimiter
            envelope.append(frames.pop(0))
        header, request = decode_request(frames)
        self.relayed.append(header.api)
        back.send_multipart(frames)
        if isinstance(request, ProduceRequest) and request.ack is Ack.NONE:
            return
        while True:  # replies to requests given up on by now are dropped
            if not back.poll(BROKER_REPLY_TIMEOUT_MS):
                raise RuntimeError(f"the broker did not answer {header.api.name}")
            reply = back.recv_multipart()
            if decode_reply_header(reply).correlation_id == header.correlation_id:
                break
        if header.api is Api.METADATA:
            metadata = decode_reply(Api.METADATA, reply)
            brokers = tuple(BrokerInfo(b.broker_id, "127.0.0.1", port) for b in metadata.brokers)
            body = encode_reply(header.correlation_id, MetadataReply(brokers, metadata.topics))
            reply = [bytes(part) for part in body]
        front.send_multipart([*envelope, *reply])


@contextmanager
def curve_relay(broker_endpoint: str, directory: Path) -> Iterator[tuple[CurveRelay, ClientKeys]]:
    """A running CurveRelay to `broker_endpoint` with key files under `directory`
    (`broker.key`, `client.key_secret`, ...), and the keys of a client it lets in."""
    broker_public, broker_secret = generate_keys(directory, "broker")
    _, client_secret = generate_keys(directory, "client")
    keys = ClientKeys.load(client_secret, broker_public)
    relay = CurveRelay(broker_endpoint, *load_key_pair(broker_secret), allowed={keys.public})
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    stop = threading.Event()
    thread = threading.Thread(target=relay.serve, args=(context, stop), daemon=True)
    thread.start()
    try:
        if not relay.ready.wait(10):
            raise RuntimeError("the Curve relay did not start")
        yield relay, keys
    finally:
        stop.set()
        thread.join(10)
        context.term()


@dataclass(frozen=True)
class CurveBroker:
    broker: RunningBroker
    keys: ClientKeys
    """Those of principal app, a super user."""
    key_dir: Path
    zookeeper: str
    chroot: str
    member_auth: Path
    """A ZooKeeper identity file for the group members, other than the brokers'."""
    broker_auth: Path
    """The brokers' ZooKeeper identity file (zookeeper.auth_file)."""


def _secret_file(path: Path, text: str) -> Path:
    path.write_text(text)
    os.chmod(path, 0o600)
    return path


@contextmanager
def running_curve_broker(zookeeper: PrivateZooKeeper, root: Path) -> Iterator[CurveBroker]:
    """A real pylogd under `root` in curve mode (principal app, from a principals file, its
    super user), whose registry has ZooKeeper ACLs (the brokers' identity pylogd)."""
    key_dir = root / "keys"
    generate_keys(key_dir, "broker")
    generate_keys(key_dir, "app")
    keys = ClientKeys.load(key_dir / "app.key_secret", key_dir / "broker.key")
    principals = _secret_file(root / "principals", f"app {keys.public.decode()}\n")
    chroot = f"/test-curve-client-{os.getpid()}-{time.monotonic_ns()}"
    running = RunningBroker(
        root / "broker",
        zookeeper.connect_string,
        chroot,
        *single_box_flags(root),
        "--security-mode",
        "curve",
        "--security-key-file",
        str(key_dir / "broker.key_secret"),
        "--security-principals-file",
        str(principals),
        "--security-super-users",
        "app",
        "--zookeeper-auth-file",
        str(broker_auth := _secret_file(root / "brokers.auth", "pylogd:broker-secret\n")),
    ).start()
    member_auth = _secret_file(root / "members.auth", "loaders:member-secret\n")
    try:
        yield CurveBroker(
            running, keys, key_dir, zookeeper.connect_string, chroot, member_auth, broker_auth
        )
    finally:
        running.stop()
        print(f"--- {running.log_path}:\n{running.log_tail()}")
