"""Memory with a ceiling: what pylogd holds for its clients is bounded in bytes, whatever they
do. A client that never takes its replies loses replies, not the broker's memory; a producer
faster than its worker is slowed (its sends block), and nothing it sent is lost; a FETCH reply
carries at most fetch_max_bytes, but always its first message whole."""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path

import pytest
import zmq

from broker import protocol
from broker.client import Admin
from broker.client.connection import Connection
from broker.errors import BrokerError
from broker.log import encode_message
from broker.protocol import Ack, Api, FetchRequest, OffsetsRequest, ProduceRequest
from broker.registry import Registry
from tests.conftest import single_box_flags, wait_until
from tests.pylogd import RunningBroker

MIB = 1 << 20


def own_memory(pid: int) -> int:
    """RssAnon of a process: its heap and stacks, not the page cache its mmaps touch."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("RssAnon:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no RssAnon for {pid}")


@contextlib.contextmanager
def dealer(endpoint: str, **options: int) -> Iterator[zmq.Socket[bytes]]:
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    socket = context.socket(zmq.DEALER)
    socket.setsockopt(zmq.LINGER, 0)
    for name, value in options.items():
        socket.setsockopt(getattr(zmq, name), value)
    socket.connect(endpoint)
    try:
        yield socket
    finally:
        socket.close()
        context.term()


def fill(endpoint: str, topic: str, megabytes: int) -> int:
    """`megabytes` MiB of 64 KiB messages in partition 0; the high watermark after them."""
    message = encode_message(b"m" * (64 * 1024 - 64))
    with Connection(endpoint, timeout_s=30.0) as connection:
        for _ in range(megabytes):
            request = ProduceRequest(topic, 0, Ack.FLUSHED, message * 16)
            connection.request(request)
        return connection.call(OffsetsRequest(topic, 0, protocol.LATEST)).offset


def fetches_taken(broker: RunningBroker) -> float:
    """The FETCHes the broker has taken: served by a worker, refused by the supervisor
    (REPLIES_NOT_READ) or parked in the front until their client reads its replies."""
    metrics = broker.metrics()
    return metrics[("pylog_front_parked_requests", ())] + sum(
        value
        for (name, labels), value in metrics.items()
        if (name == "pylog_requests_total" and ("api", "fetch") in labels)
        or (name == "pylog_request_errors_total" and ("worker", "supervisor") in labels)
    )


def request_frame(api: Api, correlation_id: int, body: protocol.Request) -> bytes:
    frames = protocol.encode_request(protocol.RequestHeader(api, 1, correlation_id, "t"), body)
    return b"".join(bytes(f) for f in frames)


@pytest.mark.parametrize(
    ("flags", "most_mib"),
    [((), 96), (("--broker-queued-replies-per-client", "8"), 24)],
    ids=["defaults", "8-replies"],
)
def test_a_client_that_never_takes_its_replies_does_not_grow_the_broker(
    make_pylogd: Callable[..., RunningBroker],
    tmp_path: Path,
    flags: tuple[str, ...],
    most_mib: int,
) -> None:
    """60 FETCHes of 16 MiB from a client that reads nothing (its receive queue holds one
    message): the broker used to hold every reply (~1 GB). Now a reply carries at most
    fetch_max_bytes (1 MiB), and the broker holds at most queued_replies_per_client of them
    for the client (ZeroMQ drops the rest); others are served meanwhile."""
    broker = make_pylogd(
        *single_box_flags(tmp_path), "--metrics-enabled", "true", "--metrics-port", "0", *flags
    )
    with Admin(broker.endpoint) as admin:
        admin.create_topic("big", 1)
    fill(broker.endpoint, "big", 32)
    before = own_memory(broker.pid)
    with dealer(broker.endpoint, RCVHWM=1, RCVBUF=64 * 1024) as stuck:
        for i in range(60):
            stuck.send(request_frame(Api.FETCH, i + 1, FetchRequest("big", 0, 0, 16 * MIB, 0, 0)))
        most = 0

        def all_served() -> bool:
            nonlocal most
            most = max(most, own_memory(broker.pid) - before)
            return fetches_taken(broker) >= 60

        wait_until(all_served, timeout=30, what="the 60 fetches to be served, refused or parked")
        with Connection(broker.endpoint, timeout_s=10.0) as other:  # others are still served
            reply = other.request(FetchRequest("big", 0, 0, 16 * MIB, 0, 0))
            assert 0 < len(reply.message_set) <= MIB  # fetch_max_bytes, 1 MiB by default
        all_served()
        assert most < most_mib * MIB, f"the supervisor grew by {most / MIB:.0f} MiB"


def test_clients_that_never_read_are_muted_under_one_ceiling_and_memory_returns(
    make_pylogd: Callable[..., RunningBroker], tmp_path: Path
) -> None:
    """Four clients that read nothing, each pipelining 100 FETCHes of 16 MiB, against a broker
    that holds 4 MiB of replies for one connection and 8 MiB for all: each was allowed up to
    1000 replies of 1 MiB (~400 MiB in all). Now each is muted at its share, or at the
    ceiling: its requests wait (parked) or are refused REPLIES_NOT_READ, as are the replies
    beyond; another client is served meanwhile; and once they hang up, the broker holds
    nothing and its memory is back near where it was."""
    broker = make_pylogd(
        *single_box_flags(tmp_path),
        *("--metrics-enabled", "true", "--metrics-port", "0"),
        *("--broker-queued-reply-bytes", str(8 * MIB)),
        *("--broker-queued-reply-bytes-per-client", str(4 * MIB)),
    )
    with Admin(broker.endpoint) as admin:
        admin.create_topic("big", 1)
    fill(broker.endpoint, "big", 32)
    before = own_memory(broker.pid)
    fetch = FetchRequest("big", 0, 0, 16 * MIB, 0, 0)
    most = 0

    def gauge(name: str) -> float:
        return broker.metrics()[(name, ())]

    with contextlib.ExitStack() as stack:
        clients = [
            stack.enter_context(dealer(broker.endpoint, RCVHWM=1, RCVBUF=64 * 1024))
            for _ in range(4)
        ]
        for i in range(100):
            for client in clients:
                client.send(request_frame(Api.FETCH, i + 1, fetch))

        def all_taken() -> bool:
            nonlocal most
            most = max(most, own_memory(broker.pid) - before)
            return fetches_taken(broker) >= 400

        wait_until(all_taken, timeout=60, what="the 400 fetches to be served, refused or parked")
        held = gauge("pylog_front_queued_reply_bytes")
        # The ceiling, and at most one reply (1 MiB) over it for a connection that held none.
        assert 0 < held <= 8 * MIB + 4 * MIB
        assert gauge("pylog_front_muted_connections") == 4
        assert gauge("pylog_front_replies_refused_total") > 0
        with Connection(broker.endpoint, timeout_s=10.0) as other:  # others are still served
            assert 0 < len(other.request(fetch).message_set) <= MIB
        all_taken()
        assert most < 48 * MIB, f"the supervisor grew by {most / MIB:.0f} MiB"

    def let_go() -> bool:
        return (
            gauge("pylog_front_queued_reply_bytes") == 0
            and gauge("pylog_front_muted_connections") == 0
            and gauge("pylog_front_parked_requests") == 0
        )

    wait_until(let_go, timeout=30, what="the replies of the clients gone to be let go")
    wait_until(
        lambda: own_memory(broker.pid) - before < 20 * MIB,
        timeout=30,
        what="the supervisor's memory to come back within 20 MiB of where it was",
    )


def test_a_muted_client_that_reads_again_gets_every_parked_request_answered(
    make_pylogd: Callable[..., RunningBroker], tmp_path: Path
) -> None:
    """A client that stops reading is muted at its share (4 MiB here); the requests it sends
    then wait in the broker. Once it reads again, every one of them is served, with no other
    traffic to move the broker along (they were once kept until a request or a command came
    for the worker: a lease renewal, every 2/3 of the ZooKeeper session, made long here)."""
    broker = make_pylogd(
        *single_box_flags(tmp_path),
        *("--zookeeper-session-timeout-ms", "60000"),
        *("--metrics-enabled", "true", "--metrics-port", "0"),
        *("--broker-queued-reply-bytes-per-client", str(4 * MIB)),
    )
    with Admin(broker.endpoint) as admin:
        admin.create_topic("big", 1)
    fill(broker.endpoint, "big", 32)

    def gauge(name: str) -> float:
        return broker.metrics()[(name, ())]

    fetch = FetchRequest("big", 0, 0, 16 * MIB, 0, 0)
    with dealer(broker.endpoint, RCVHWM=1, RCVBUF=64 * 1024) as client:
        for i in range(30):
            client.send(request_frame(Api.FETCH, i, fetch))
        wait_until(lambda: gauge("pylog_front_muted_connections") == 1, what="the mute")
        for i in range(30, 60):
            client.send(request_frame(Api.FETCH, i, fetch))
        # The second 30 wait (with those of the first the workers had not taken yet).
        wait_until(lambda: gauge("pylog_front_parked_requests") >= 30, what="30 parked")
        answered: dict[int, int] = {}
        for _ in range(60):
            assert client.poll(10_000), f"no reply after {len(answered)} of 60"
            header = protocol.decode_reply_header(client.recv_multipart())
            answered[header.correlation_id] = header.error_code
        assert sorted(answered) == list(range(60))
        assert set(answered.values()) <= {
            protocol.ErrorCode.NONE,
            protocol.ErrorCode.REPLIES_NOT_READ,
        }
    assert gauge("pylog_front_parked_requests") == 0


def test_a_producer_faster_than_its_worker_is_held_back_and_loses_nothing(
    make_pylogd: Callable[..., RunningBroker], tmp_path: Path
) -> None:
    """With the worker stopped (SIGSTOP: the slowest disk there is), ack=none PRODUCEs used to
    pile up without limit in the supervisor. Now the front stops reading once
    queued_request_bytes wait for the worker, so the producer's sends block (here: EAGAIN)
    and the supervisor holds little; once the worker goes on, every message sent is stored."""
    broker = make_pylogd(*single_box_flags(tmp_path), "--broker-queued-request-bytes", str(4 * MIB))
    with Admin(broker.endpoint) as admin:
        admin.create_topic("fast", 1)
    workers = broker.worker_pids()
    message_set = encode_message(b"p" * (64 * 1024 - 64)) * 4  # 256 KiB a request
    request = request_frame(Api.PRODUCE, 1, ProduceRequest("fast", 0, Ack.NONE, message_set))
    before = own_memory(broker.pid)
    sent = 0
    with dealer(broker.endpoint, SNDHWM=16, SNDBUF=256 * 1024) as producer:
        for worker in workers:
            os.kill(worker, signal.SIGSTOP)
        try:
            with contextlib.suppress(zmq.Again):
                while sent < 2000:  # 500 MiB: far more than any queue should take
                    if not producer.poll(1000, zmq.POLLOUT):
                        raise zmq.Again()
                    producer.send(request, zmq.NOBLOCK)
                    sent += 1
            grown = own_memory(broker.pid) - before
        finally:
            for worker in workers:
                os.kill(worker, signal.SIGCONT)
        assert sent < 2000, "the front took 500 MiB of requests for a stopped worker"
        assert grown < 48 * MIB, f"the supervisor grew by {grown / MIB:.0f} MiB"
        with Connection(broker.endpoint, timeout_s=30.0) as watcher:

            def stored() -> bool:
                latest = watcher.call(OffsetsRequest("fast", 0, protocol.LATEST)).offset
                return bool(latest == sent * len(message_set))

            wait_until(stored, timeout=60, what=f"all {sent} requests to be stored")


@pytest.mark.parametrize("cap", [100_000])
def test_a_fetch_reply_holds_at_most_fetch_max_bytes_but_a_whole_first_message(
    make_pylogd: Callable[..., RunningBroker], tmp_path: Path, cap: int
) -> None:
    broker = make_pylogd(*single_box_flags(tmp_path), "--broker-fetch-max-bytes", str(cap))
    with Admin(broker.endpoint) as admin:
        admin.create_topic("capped", 1)
    small = encode_message(b"s" * 30_000)
    large = encode_message(b"L" * 250_000)
    with Connection(broker.endpoint, timeout_s=10.0) as connection:
        connection.request(ProduceRequest("capped", 0, Ack.FLUSHED, small * 10))
        connection.request(ProduceRequest("capped", 0, Ack.FLUSHED, large))
        first = connection.request(FetchRequest("capped", 0, 0, 16 * MIB, 0, 0)).message_set
        assert len(first) == 3 * len(small)  # whole messages, no more than the cap
        at_large = 10 * len(small)
        whole = connection.request(FetchRequest("capped", 0, at_large, 16 * MIB, 0, 0))
        assert bytes(whole.message_set) == large  # larger than the cap, and not refused
        with pytest.raises(BrokerError, match="larger than max_bytes"):
            connection.request(FetchRequest("capped", 0, at_large, 1000, 0, 0))


FETCHES = 12


def test_a_ceiling_changed_live_mutes_at_the_new_share(
    make_pylogd: Callable[..., RunningBroker], tmp_path: Path, registry: Registry
) -> None:
    """broker.queued_reply_bytes_per_client set live (pylogctl broker config set): fetches of
    1 MiB that a client does not read mute it at 4 MiB, not at the 16 MiB it started with.

    12 fetches: loopback TCP takes up to about 4 MiB of replies off the broker (the kernel's
    send buffer grows to tcp_wmem's 4 MiB), so 8 could leave it holding less than 4 MiB; 12
    leave it at least 4 MiB to hold, and under the first share, 16 MiB, however few TCP took."""
    broker = make_pylogd(
        *single_box_flags(tmp_path),
        *("--zookeeper-session-timeout-ms", "60000"),
        *("--metrics-enabled", "true", "--metrics-port", "0"),
    )
    with Admin(broker.endpoint) as admin:
        admin.create_topic("big", 1)
    fill(broker.endpoint, "big", 16)

    def gauge(name: str) -> float:
        return broker.metrics()[(name, ())]

    def muted_is(count: int) -> bool:
        return gauge("pylog_front_muted_connections") == count

    fetch = FetchRequest("big", 0, 0, MIB, 0, 0)
    for muted in (0, 1):
        if muted:
            registry.settings.set("default", {"broker.queued_reply_bytes_per_client": str(4 * MIB)})
            wait_until(
                lambda: (
                    "live settings now: broker_queued_reply_bytes_per_client=4194304"
                    in broker.log_path.read_text()
                ),
                what="the new share in force",
            )
        with dealer(broker.endpoint, RCVHWM=1, RCVBUF=64 * 1024) as client:
            for i in range(FETCHES):
                client.send(request_frame(Api.FETCH, i, fetch))
            wait_until(
                lambda: gauge("pylog_front_queued_reply_bytes") >= 4 * MIB, what="replies held"
            )
            wait_until(partial(muted_is, muted), what="muted at the share in force")
            for _ in range(FETCHES):  # each answered: its reply, or REPLIES_NOT_READ
                assert client.poll(10_000)
                client.recv_multipart()
        wait_until(lambda: gauge("pylog_front_queued_reply_bytes") == 0, what="all taken")
