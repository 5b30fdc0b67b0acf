"""MULTI_FETCH against a real pylogd of two workers: one request, many partitions, each part
answered as a FETCH of version 5 to its partition would be, one long poll for all
(docs/protocol.md, MULTI_FETCH).

The requests are built with broker.protocol alone, as a client in another language would build
them from the document."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator

import pytest
import zmq

from broker import protocol
from broker.errors import BrokerError
from broker.protocol import Ack, Api, FetchPart
from tests.broker.test_multi_produce import worker_of, worker_pid
from tests.broker.test_pylogd import RawClient, message_set
from tests.conftest import wait_until
from tests.pylogd import RunningBroker

ALL = 1 << 20


@pytest.fixture
def client(broker: RunningBroker) -> Iterator[RawClient]:
    c = RawClient(broker.endpoint)
    yield c
    c.close()


Answer = tuple[bytes, int] | str
"""A part's answer: (its message set, the high watermark), or its error's name."""


def answers(reply: protocol.Reply, parts: list[FetchPart]) -> list[Answer]:
    assert isinstance(reply, protocol.MultiFetchReply)
    assert [(p.topic, p.partition) for p in reply.parts] == [(p.topic, p.partition) for p in parts]
    out: list[Answer] = []
    for part in reply.parts:
        try:
            fetched = protocol.decode_fetch_part(part)
        except BrokerError as error:
            out.append(error.name)
            continue
        out.append((bytes(fetched.message_set), fetched.high_watermark))
    return out


def multi_fetch(
    client: RawClient,
    parts: list[FetchPart],
    max_wait_ms: int = 0,
    min_bytes: int = 0,
    max_bytes: int = ALL,
) -> list[Answer]:
    request = protocol.MultiFetchRequest(-1, max_wait_ms, min_bytes, max_bytes, tuple(parts))
    return answers(client.call(Api.MULTI_FETCH, request), parts)


class Dealer:
    """A MULTI_FETCH sent without waiting for its reply (a long poll to watch)."""

    def __init__(self, client: RawClient, endpoint: str) -> None:
        self.socket = client.context.socket(zmq.DEALER)
        self.socket.setsockopt(zmq.LINGER, 0)
        self.socket.connect(endpoint)

    def send(self, parts: list[FetchPart], max_wait_ms: int, min_bytes: int = 1) -> None:
        header = protocol.RequestHeader(Api.MULTI_FETCH, 1, 7, "tests")
        request = protocol.MultiFetchRequest(-1, max_wait_ms, min_bytes, ALL, tuple(parts))
        self.socket.send_multipart([bytes(f) for f in protocol.encode_request(header, request)])

    def reply(self, timeout_ms: int) -> protocol.MultiFetchReply:
        assert self.socket.poll(timeout_ms), f"no reply within {timeout_ms} ms"
        return protocol.decode_reply(Api.MULTI_FETCH, self.socket.recv_multipart())

    def close(self) -> None:
        self.socket.close()


def spread_topic(client: RawClient, broker: RunningBroker, topic: str, count: int) -> list[int]:
    """Create `topic` of `count` partitions: the worker of each, both workers among them."""
    client.create(topic, count)
    workers = [worker_of(broker, topic, p) for p in range(count)]
    assert sorted(set(workers)) == [0, 1], workers
    return workers


def test_each_part_is_answered_as_a_fetch_of_its_partition(
    client: RawClient, broker: RunningBroker, topic: str
) -> None:
    spread_topic(client, broker, topic, 4)
    sets = [message_set(10 * p, p + 1) for p in range(4)]
    for p in range(4):
        client.produce(topic, p, sets[p], Ack.FLUSHED)
    parts = [FetchPart(topic, p, 0, ALL) for p in range(4)]
    assert multi_fetch(client, parts) == [(sets[p], len(sets[p])) for p in range(4)]
    later = [FetchPart(topic, p, len(sets[p]), ALL) for p in range(4)]
    assert multi_fetch(client, later) == [(b"", len(sets[p])) for p in range(4)]


def test_an_error_on_one_part_leaves_the_other_parts_answered(
    client: RawClient, broker: RunningBroker, topic: str
) -> None:
    spread_topic(client, broker, topic, 3)
    data = message_set(0, 3)
    for p in range(3):
        client.produce(topic, p, data, Ack.FLUSHED)
    parts = [
        FetchPart(topic, 0, 0, ALL),
        FetchPart(topic, 9, 0, ALL),  # no such partition
        FetchPart(topic, 1, len(data) + 100, ALL),  # past the high watermark
        FetchPart("no-such-topic", 0, 0, ALL),
        FetchPart(topic, 2, 1, ALL),  # not a message boundary
        FetchPart(topic, 2, 0, 10),  # the first message does not fit
        FetchPart(topic, 1, 0, ALL),
    ]
    # An error answers at once, whatever the wait asked for: one the worker finds (an offset
    # out of range), or one the front finds before the parts reach their workers (a topic this
    # broker does not hold).
    started = time.monotonic()
    got = multi_fetch(client, parts, max_wait_ms=5_000, min_bytes=ALL)
    assert time.monotonic() - started < 4
    refused = [FetchPart(topic, p, len(data), ALL) for p in range(3)]
    refused.append(FetchPart("no-such-topic", 0, 0, ALL))
    started = time.monotonic()
    assert multi_fetch(client, refused, max_wait_ms=5_000, min_bytes=1) == [
        *[(b"", len(data))] * 3,
        "UNKNOWN_TOPIC_OR_PARTITION",
    ]
    assert time.monotonic() - started < 4
    assert got == [
        (data, len(data)),
        "UNKNOWN_TOPIC_OR_PARTITION",
        "OFFSET_OUT_OF_RANGE",
        "UNKNOWN_TOPIC_OR_PARTITION",
        "INVALID_OFFSET",
        "FETCH_SIZE_TOO_SMALL",
        (data, len(data)),
    ]


def test_the_reply_holds_at_most_max_bytes_but_a_first_message_whole(
    client: RawClient, broker: RunningBroker, topic: str
) -> None:
    workers = spread_topic(client, broker, topic, 6)
    same = [p for p in range(6) if workers[p] == workers[0]][:2]
    assert len(same) == 2, workers
    data = message_set(0, 4)  # 4 messages of the same size
    one = len(data) // 4
    for p in same:
        client.produce(topic, p, data, Ack.FLUSHED)
    parts = [FetchPart(topic, p, 0, ALL) for p in same]
    # Room for two messages and a half: two of the first part, none of the second.
    assert multi_fetch(client, parts, max_bytes=2 * one + one // 2) == [
        (data[: 2 * one], len(data)),
        (b"", len(data)),
    ]
    # Room for less than one: the first message whole, nothing of the second part.
    assert multi_fetch(client, parts, max_bytes=one // 2) == [
        (data[:one], len(data)),
        (b"", len(data)),
    ]


def test_a_long_poll_over_both_workers_ends_when_either_has_data(
    client: RawClient, broker: RunningBroker, topic: str
) -> None:
    workers = spread_topic(client, broker, topic, 6)
    parts = [FetchPart(topic, p, 0, ALL) for p in range(6)]
    dealer = Dealer(client, broker.endpoint)
    try:
        # Nothing to read: answered when the wait ends, every part empty.
        started = time.monotonic()
        dealer.send(parts, max_wait_ms=300)
        assert answers(dealer.reply(10_000), parts) == [(b"", 0)] * 6
        assert time.monotonic() - started >= 0.25
        # A message on one worker's partition answers the whole request, the other worker's
        # share woken: long before the 20 s wait.
        ends = [0] * 6
        for target in (max(range(6), key=lambda p: workers[p]), workers.index(0)):
            dealer.send(parts, max_wait_ms=20_000)
            assert not dealer.socket.poll(300), "answered with nothing to read"
            data = message_set(target, 1)
            client.produce(topic, target, data, Ack.FLUSHED)
            got = answers(dealer.reply(10_000), parts)
            assert got[target] == (data, len(data))
            assert all(got[p] == (b"", ends[p]) for p in range(6) if p != target)
            ends[target] = len(data)
            parts[target] = FetchPart(topic, target, len(data), ALL)
    finally:
        dealer.close()


@pytest.mark.parametrize(
    ("request_body", "problem"),
    [
        (protocol.MultiFetchRequest(-1, 0, 0, ALL, ()), "part_count is 0"),
        (protocol.MultiFetchRequest(-1, 0, 0, 0, (FetchPart("t", 0, 0, 1),)), "max_bytes is 0"),
        (protocol.MultiFetchRequest(-1, 0, 0, ALL, (FetchPart("t", 0, 0, 0),)), "max_bytes is 0"),
        (
            protocol.MultiFetchRequest(-1, 0, 0, ALL, (FetchPart("t", 0, 0, 1, -1, 5),)),
            "flushed_offset",
        ),
    ],
)
def test_a_malformed_request_is_refused_whole(
    client: RawClient, request_body: protocol.MultiFetchRequest, problem: str
) -> None:
    with pytest.raises(BrokerError) as raised:
        client.call(Api.MULTI_FETCH, request_body)
    assert raised.value.name == "MALFORMED_REQUEST"
    assert problem in raised.value.message


def test_parts_on_a_worker_killed_mid_request_are_answered_unavailable(
    pylogd: RunningBroker,
) -> None:
    client = RawClient(pylogd.endpoint, timeout_s=30)
    dealer = Dealer(client, pylogd.endpoint)
    try:
        workers = spread_topic(client, pylogd, "spread", 4)
        stopped = workers[0]
        running = [p for p in range(4) if workers[p] != stopped]
        data = message_set(0, 2)
        for p in running:
            client.produce("spread", p, data, Ack.FLUSHED)
        victim = worker_pid(pylogd, stopped)
        os.kill(victim, signal.SIGSTOP)  # its share is never answered
        parts = [FetchPart("spread", p, 0, ALL) for p in range(4)]
        dealer.send(parts, max_wait_ms=20_000)
        assert not dealer.socket.poll(300), "answered before every share was"
        os.kill(victim, signal.SIGKILL)
        got = answers(dealer.reply(10_000), parts)
        for p in range(4):
            expected = (data, len(data)) if p in running else "PARTITION_UNAVAILABLE"
            assert got[p] == expected, p

        def served_again() -> bool:
            try:
                return multi_fetch(client, parts) == [
                    (data, len(data)) if p in running else (b"", 0) for p in range(4)
                ]
            except BrokerError:
                return False

        wait_until(served_again, 30, "every part answered after the worker's restart")
    finally:
        dealer.close()
        client.close()
