"""Fetch sessions (docs/protocol.md, MULTI_FETCH version 2) against a real leader of a
three-broker cluster, built from the document: a session begun with every partition is
answered with all of them; a next fetch that names none is answered with none (nothing new),
one that names a partition with it, and a partition produced to with it unnamed; forgotten
partitions leave the session; a session the broker does not hold, or an epoch out of turn,
is refused whole. A session's long poll ends with the bytes of a partition it does not name;
the real followers' sessions keep idle partitions in the ISR while another takes traffic."""

from __future__ import annotations

import time

import pytest
import zmq

from broker import protocol
from broker.client import Ack, Cluster, Connection, Producer
from broker.errors import BrokerError
from broker.protocol import FetchPart
from tests.client.test_leadership import create_replicated
from tests.conftest import wait_until
from tests.pylogd import ThreeBrokers

TOPIC = "sessions"
THREE_BROKERS_FLAGS = (
    "--broker-replica-lag-max-ms",
    "1000",
    "--broker-replica-fetch-wait-ms",
    "200",
)
"""A follower 1 s behind leaves the ISR."""


def session_fetch(
    connection: Connection,
    replica: int,
    parts: tuple[FetchPart, ...],
    session_id: int,
    epoch: int,
    forgotten: tuple[protocol.SessionPartition, ...] = (),
) -> protocol.MultiFetchReply:
    """A follower's MULTI_FETCH of version 2 that waits for nothing (max_wait_ms 0)."""
    request = protocol.MultiFetchRequest(
        replica, 0, 0, 1 << 20, parts, session_id, epoch, forgotten
    )
    reply = connection.call(request, retries=0, version=2)
    assert isinstance(reply, protocol.MultiFetchReply)
    return reply


def led_parts(
    endpoints: dict[int, str], topic: str, count: int
) -> tuple[int, list[int], int, tuple[FetchPart, ...]]:
    """`topic` created with `count` partitions at factor 3: the leader of its partition 0, the
    partitions it leads, a follower of them, and a fetch of each from offset 0."""
    create_replicated(endpoints, topic, count)
    with Cluster(endpoints[1]) as cluster:
        infos = cluster.partitions(topic)
    leader = infos[0].broker_id
    led = [info.partition for info in infos if info.broker_id == leader]
    follower = next(b for b in endpoints if b != leader)
    return leader, led, follower, tuple(FetchPart(topic, p, 0, 1 << 16, -1, 0) for p in led)


def named(reply: protocol.MultiFetchReply) -> list[int]:
    return [part.partition for part in reply.parts]


def test_a_fetch_session_answers_only_what_changed(
    shared_three_brokers: ThreeBrokers,
) -> None:
    endpoints = shared_three_brokers.endpoints
    leader, led, follower, parts = led_parts(endpoints, TOPIC, 6)
    with Connection(endpoints[leader]) as connection:
        begun = session_fetch(connection, follower, parts, 0, 0)
        assert begun.session_id > 0 and named(begun) == led
        session = begun.session_id
        assert named(session_fetch(connection, follower, (), session, 1)) == []  # nothing new
        assert named(session_fetch(connection, follower, parts[:1], session, 2)) == led[:1]
        with Producer(endpoints[leader], TOPIC, ack=Ack.ALL) as producer:
            producer.send(b"news", partition=led[0]).result(30)
        news = session_fetch(connection, follower, (), session, 3)
        assert named(news) == led[:1]  # its bytes, unnamed
        assert bytes(protocol.decode_fetch_part(news.parts[0]).message_set)
        gone = (protocol.SessionPartition(TOPIC, led[0]),)
        assert named(session_fetch(connection, follower, (), session, 4, gone)) == []
        with pytest.raises(BrokerError) as epoch:
            session_fetch(connection, follower, (), session, 4)  # its epoch again
        assert epoch.value.code == protocol.ErrorCode.INVALID_FETCH_SESSION_EPOCH
        with pytest.raises(BrokerError) as unknown:
            session_fetch(connection, follower, (), session, 5)  # dropped with the bad epoch
        assert unknown.value.code == protocol.ErrorCode.FETCH_SESSION_ID_NOT_FOUND


def test_a_session_long_poll_ends_with_bytes_of_a_partition_it_does_not_name(
    shared_three_brokers: ThreeBrokers,
) -> None:
    endpoints = shared_three_brokers.endpoints
    topic = "sessions-wake"
    leader, led, follower, parts = led_parts(endpoints, topic, 4)
    with Connection(endpoints[leader]) as connection:
        begun = session_fetch(connection, follower, parts, 0, 0)
    context = zmq.Context()
    socket = context.socket(zmq.REQ)
    socket.setsockopt(zmq.LINGER, 0)
    try:
        socket.connect(endpoints[leader])
        poll = protocol.MultiFetchRequest(follower, 10_000, 1, 1 << 20, (), begun.session_id, 1)
        header = protocol.RequestHeader(protocol.Api.MULTI_FETCH, 2, 7, "tests")
        socket.send_multipart([bytes(f) for f in protocol.encode_request(header, poll)])
        assert not socket.poll(300), "answered with nothing new"  # the long poll holds
        with Producer(endpoints[leader], topic, ack=Ack.ALL) as producer:
            producer.send(b"news", partition=led[-1]).result(30)
        sent = time.monotonic()
        assert socket.poll(10_000), "the long poll was not ended by the bytes"
        assert time.monotonic() - sent < 5  # well before its 10 s
        reply = protocol.decode_reply(protocol.Api.MULTI_FETCH, socket.recv_multipart(), 2)
        assert isinstance(reply, protocol.MultiFetchReply)
        assert named(reply) == led[-1:]
        assert bytes(protocol.decode_fetch_part(reply.parts[0]).message_set)
    finally:
        socket.close()
        context.term()


def test_idle_partitions_stay_in_sync_while_another_of_the_session_takes_traffic(
    shared_three_brokers: ThreeBrokers,
) -> None:
    """The followers' sessions are answered with the busy partition's bytes round after round;
    the leader still records where they are on the idle partitions (every partition of a
    session is checked at least every quarter of replica_lag_max_ms), so none leaves the
    ISR."""
    endpoints = shared_three_brokers.endpoints
    topic = "sessions-isr"
    create_replicated(endpoints, topic, 6)

    def isrs() -> dict[int, int]:
        with Cluster(endpoints[1]) as cluster:
            return {info.partition: len(info.isr) for info in cluster.partitions(topic)}

    wait_until(lambda: set(isrs().values()) == {3}, what="every ISR full")
    with Cluster(endpoints[1]) as cluster:
        busy = cluster.partitions(topic)[0]
    shrunk: list[dict[int, int]] = []
    with Producer(endpoints[busy.broker_id], topic, ack=Ack.ALL) as producer:
        start = time.monotonic()
        for _ in range(3000):  # bounded: about 3 s, three times replica_lag_max_ms
            if time.monotonic() - start > 3.0:
                break
            for _ in range(10):
                producer.send(b"x" * 100, partition=busy.partition)
            producer.flush(30)
            if set(now := isrs()) and set(now.values()) != {3}:
                shrunk.append(now)
    assert time.monotonic() - start > 3.0
    assert not shrunk, f"ISRs shrank: {shrunk[:3]}"
    assert set(isrs().values()) == {3}
