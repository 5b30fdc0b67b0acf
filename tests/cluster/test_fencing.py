"""Fencing on three real brokers (docs/replication.md, "Fencing"): a leader that may have been
replaced acknowledges nothing and serves no FETCH, and a leader that restarts within its
ZooKeeper session is a new incarnation, with a new leader epoch and a high watermark that never
reads lower than it did before."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Iterator

import zmq

from broker import protocol
from broker.client import Admin, Producer
from broker.client.connection import Connection
from broker.errors import BrokerError, PylogError
from broker.log.message import encode_message
from broker.protocol import Ack, ErrorCode
from broker.registry import PartitionState
from tests.conftest import wait_until
from tests.pylogd import RunningBroker, ThreeBrokers

THREE_BROKERS_FLAGS = (
    *("--broker-replica-lag-max-ms", "1000", "--broker-replica-fetch-wait-ms", "200"),
)
"""A follower behind for 1 s leaves the ISR; the brokers' sessions expire 2 s after they fall
silent (tests/pylogd.py), then the controller chooses another leader."""

REPLICATED = {"replication_factor": "3", "min_insync_replicas": "2"}


def leader_acks(endpoint: str, topic: str) -> bool:
    """Whether the broker at `endpoint` acknowledges an ack=all send now."""
    with Producer(endpoint, topic, ack=Ack.ALL, retries=0, timeout_s=5) as producer:
        producer.send(b"before")
        try:
            producer.flush()
        except PylogError:
            return False
    return True


def led_topic(three: ThreeBrokers, topic: str) -> tuple[PartitionState, RunningBroker]:
    """`topic` created with one partition at REPLICATED, once its leader acks: its first
    state and its leader."""
    with Admin(three.brokers[1].endpoint) as admin:
        admin.create_topic(topic, 1, REPLICATED)
    state = three.registry.topics.partition_state(topic, 0)[0]
    leader = three.brokers[state.leader]
    wait_until(lambda: leader_acks(leader.endpoint, topic), 30, "the leader's first ack")
    return state, leader


@contextlib.contextmanager
def frozen(broker: RunningBroker) -> Iterator[None]:
    """The broker's supervisor and workers stopped (SIGSTOP), as a long pause of the machine
    or the process would; resumed (SIGCONT) at the end of the block."""
    pids = [broker.pid, *broker.worker_pids()]
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)


class Pipeline:
    """A DEALER to one broker that sends requests without waiting for their replies (they
    queue in the socket buffers while the broker is frozen) and collects the replies."""

    def __init__(self, context: zmq.Context[zmq.Socket[bytes]], endpoint: str) -> None:
        self.socket = context.socket(zmq.DEALER)
        self.socket.setsockopt(zmq.LINGER, 0)
        self.socket.connect(endpoint)
        self.sent: dict[int, protocol.Api] = {}

    def send(self, request: protocol.Request) -> None:
        correlation_id = len(self.sent) + 1
        header = protocol.RequestHeader(request.api, protocol.API_VERSION, correlation_id, "t")
        self.socket.send_multipart([b"", *protocol.encode_request(header, request)])
        self.sent[correlation_id] = request.api

    def replies(self, timeout_s: float) -> dict[int, tuple[protocol.Api, int]]:
        """Each request's api and the error code of its reply (NONE: a success), waiting up
        to `timeout_s` for all of them."""
        got: dict[int, tuple[protocol.Api, int]] = {}
        deadline = time.monotonic() + timeout_s
        while len(got) < len(self.sent) and time.monotonic() < deadline:
            if self.socket.poll(100):
                frames = self.socket.recv_multipart()[1:]
                header = protocol.decode_reply_header(frames)
                got[header.correlation_id] = (self.sent[header.correlation_id], header.error_code)
        return got


def test_a_leader_frozen_past_its_session_acks_nothing_and_serves_no_fetch_once_resumed(
    own_three_brokers: ThreeBrokers,
) -> None:
    three, registry = own_three_brokers, own_three_brokers.registry
    old, leader = led_topic(three, "deposed")
    message_set = encode_message(b"lost if acked")
    fetch = protocol.FetchRequest("deposed", 0, 0, 1 << 20, 0, 0)
    requests: list[protocol.Request] = [
        *(protocol.ProduceRequest("deposed", 0, ack, message_set) for ack in Ack if ack),
        fetch,
    ]
    with zmq.Context() as context:
        pipeline = Pipeline(context, leader.endpoint)
        pipeline.send(fetch)  # connected, and answered, before the freeze
        assert pipeline.replies(10) == {1: (protocol.Api.FETCH, ErrorCode.NONE)}
        pipeline.sent.clear()
        with frozen(leader):
            for request in requests:  # queued while it was frozen, still leading
                pipeline.send(request)

            def replaced() -> bool:
                state = registry.topics.partition_state("deposed", 0)[0]
                return (
                    state.leader not in (old.leader, -1) and state.leader_epoch > old.leader_epoch
                )

            wait_until(replaced, 30, "another broker to lead")
            for request in requests:  # queued after another was chosen
                pipeline.send(request)
        replies = pipeline.replies(30)
    assert len(replies) == len(pipeline.sent) == 8
    answered = {(api.name, ErrorCode(code).name) for api, code in replies.values()}
    assert answered <= {
        ("PRODUCE", "NOT_LEADER_FOR_PARTITION"),
        ("FETCH", "NOT_LEADER_FOR_PARTITION"),
    }, answered
    # Nothing of it reached the new leader's log: it was never acknowledged, nor copied.
    logs: list[bytes] = []

    def read_the_leader() -> bool:
        leader_now = three.brokers[registry.topics.partition_state("deposed", 0)[0].leader]
        with (
            Connection(leader_now.endpoint, timeout_s=2) as connection,
            contextlib.suppress(BrokerError),
        ):
            logs.append(bytes(connection.request(fetch).message_set))
        return bool(logs)

    wait_until(read_the_leader, 30, "the new leader to serve a fetch")
    assert b"lost if acked" not in logs[0]


def test_a_leader_restarted_within_its_session_gets_a_new_epoch_and_keeps_its_high_watermark(
    own_three_brokers: ThreeBrokers,
) -> None:
    three, registry = own_three_brokers, own_three_brokers.registry
    old, leader = led_topic(three, "reborn")
    with Producer(leader.endpoint, "reborn", ack=Ack.ALL, batch_messages=10) as producer:
        for i in range(200):
            producer.send(b"value-%d" % i)
        producer.flush()
    latest = protocol.OffsetsRequest("reborn", 0, protocol.LATEST)
    with Connection(leader.endpoint) as connection:
        before = connection.request(latest).offset
    assert before > 0
    leader.kill()
    three.restart(old.leader)  # at once: its session has not expired
    restarted = three.brokers[old.leader]
    # Every broker that answers OFFSETS as the leader, from the restart on, answers at least
    # what the leader answered before the kill.
    answers: list[tuple[int, int]] = []

    def sample() -> bool:
        for broker_id, broker in three.brokers.items():
            with (
                Connection(broker.endpoint, timeout_s=2) as connection,
                contextlib.suppress(BrokerError),
            ):
                answers.append((broker_id, connection.request(latest).offset))
        state = registry.topics.partition_state("reborn", 0)[0]
        from_leader = [offset for broker_id, offset in answers if broker_id == state.leader]
        return state.leader_epoch > old.leader_epoch and len(from_leader) >= 10

    wait_until(sample, 30, "a new leader epoch, and its leader answering ten times")
    assert answers and min(offset for _, offset in answers) >= before, (before, answers)
    assert registry.topics.partition_state("reborn", 0)[0].leader_epoch > old.leader_epoch
    assert restarted.process is not None and restarted.process.poll() is None
