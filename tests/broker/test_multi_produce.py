"""MULTI_PRODUCE against a real pylogd: one request, many partitions over two workers, each part
answered as a PRODUCE to its partition would be (docs/protocol.md, MULTI_PRODUCE).

The requests are built with broker.protocol alone, as a client in another language would build
them from the document."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
import zmq

from broker import protocol
from broker.errors import BrokerError
from broker.log import encode_message
from broker.protocol import Ack, Api, ProducePart
from tests.broker.test_pylogd import RawClient, message_set
from tests.conftest import wait_until
from tests.pylogd import RunningBroker

PRODUCER_ID = 0x1234_5678_9ABC


@pytest.fixture
def client(broker: RunningBroker) -> Iterator[RawClient]:
    c = RawClient(broker.endpoint)
    yield c
    c.close()


def multi_produce(
    client: RawClient, parts: list[ProducePart], ack: Ack = Ack.FLUSHED, producer_id: int = 0
) -> list[protocol.ProduceReply | BrokerError]:
    """Each part's answer: its ProduceReply, or the BrokerError it was answered with."""
    request = protocol.MultiProduceRequest(ack, tuple(parts), producer_id)
    reply = client.call(Api.MULTI_PRODUCE, request)
    assert isinstance(reply, protocol.MultiProduceReply)
    assert [(p.topic, p.partition) for p in reply.parts] == [(p.topic, p.partition) for p in parts]
    answers: list[protocol.ProduceReply | BrokerError] = []
    for part in reply.parts:
        try:
            answers.append(protocol.decode_part_reply(part))
        except BrokerError as error:
            answers.append(error)
    return answers


def worker_of(broker: RunningBroker, topic: str, partition: int) -> int:
    """The index of the worker holding a partition: the log dir its folder is in."""
    for index, folder in enumerate(("logs-a", "logs-b")):
        if (broker.data_dir.parent / folder / f"{topic}-{partition}").is_dir():
            return index
    raise AssertionError(f"no folder for {topic}-{partition}")


def worker_pid(broker: RunningBroker, index: int) -> int:
    for pid in broker.worker_pids():
        if Path(f"/proc/{pid}/comm").read_text().strip() == f"pylog-worker-{index}":
            return pid
    raise AssertionError(f"no worker {index}")


def test_each_part_is_appended_to_its_partition_and_answered(client: RawClient, topic: str) -> None:
    client.create(topic, 4)
    sets = [message_set(10 * p, p + 1) for p in range(4)]
    answers = multi_produce(client, [ProducePart(topic, p, sets[p]) for p in range(4)])
    assert answers == [protocol.ProduceReply(0, p + 1) for p in range(4)]
    assert [client.read_all(topic, p) for p in range(4)] == sets


def test_an_error_on_one_part_leaves_the_other_parts_stored_and_answered(
    client: RawClient, topic: str
) -> None:
    client.create(topic, 3)
    good = [message_set(0, 2), message_set(5, 3)]
    corrupt = bytearray(message_set(9, 1))
    corrupt[-1] ^= 0xFF  # its checksum no longer matches
    answers = multi_produce(
        client,
        [
            ProducePart(topic, 0, good[0]),
            ProducePart(topic, 7, good[0]),  # no such partition
            ProducePart(topic, 1, bytes(corrupt)),
            ProducePart("no-such-topic", 0, good[0]),
            ProducePart(topic, 2, good[1]),
        ],
    )
    names = [a.name if isinstance(a, BrokerError) else a for a in answers]
    assert names == [
        protocol.ProduceReply(0, 2),
        "UNKNOWN_TOPIC_OR_PARTITION",
        "INVALID_MESSAGE",
        "UNKNOWN_TOPIC_OR_PARTITION",
        protocol.ProduceReply(0, 3),
    ]
    assert client.read_all(topic, 0) == good[0]
    assert client.read_all(topic, 1) == b""
    assert client.read_all(topic, 2) == good[1]


def test_parts_of_one_partition_are_appended_in_their_order(client: RawClient, topic: str) -> None:
    client.create(topic, 1)
    sets = [message_set(i * 10, 2) for i in range(3)]
    answers = multi_produce(client, [ProducePart(topic, 0, s) for s in sets])
    offsets = [a.base_offset for a in answers if isinstance(a, protocol.ProduceReply)]
    assert offsets == [0, len(sets[0]), len(sets[0]) + len(sets[1])]
    assert client.read_all(topic, 0) == b"".join(sets)


def test_an_idempotent_request_sent_again_is_stored_once_and_answered_with_its_offsets(
    client: RawClient, topic: str
) -> None:
    client.create(topic, 3)
    sets = [message_set(p, 2) for p in range(3)]
    parts = [ProducePart(topic, p, sets[p], sequence=0) for p in range(3)]
    first = multi_produce(client, parts, producer_id=PRODUCER_ID)
    again = multi_produce(client, parts, producer_id=PRODUCER_ID)  # its reply was "lost"
    assert [getattr(a, "base_offset", a) for a in again] == [
        getattr(a, "base_offset", a) for a in first
    ]
    assert [client.read_all(topic, p) for p in range(3)] == sets
    # a part out of order is refused alone; the others go on
    answers = multi_produce(
        client,
        [ProducePart(topic, 0, sets[0], sequence=1), ProducePart(topic, 1, sets[1], sequence=5)],
        producer_id=PRODUCER_ID,
    )
    assert isinstance(answers[0], protocol.ProduceReply)
    assert isinstance(answers[1], BrokerError) and answers[1].name == "OUT_OF_ORDER_SEQUENCE"
    assert getattr(answers[1], "expected", None) == 1
    assert client.read_all(topic, 1) == sets[1]


def test_with_ack_none_nothing_is_answered_and_every_part_is_stored(
    client: RawClient, broker: RunningBroker, topic: str
) -> None:
    client.create(topic, 2)
    sets = [message_set(0, 3), message_set(3, 4)]
    header = protocol.RequestHeader(Api.MULTI_PRODUCE, 1, 99, "tests")
    request = protocol.MultiProduceRequest(
        Ack.NONE, (ProducePart(topic, 0, sets[0]), ProducePart(topic, 1, sets[1]))
    )
    dealer = client.context.socket(zmq.DEALER)
    dealer.setsockopt(zmq.LINGER, 0)
    dealer.connect(broker.endpoint)
    dealer.send_multipart([bytes(f) for f in protocol.encode_request(header, request)])
    wait_until(
        lambda: [client.read_all(topic, p) for p in range(2)] == sets, 10, "both parts stored"
    )
    assert not dealer.poll(200)  # and no reply came
    dealer.close()


@pytest.mark.parametrize(
    "request_body, problem",
    [
        (protocol.MultiProduceRequest(Ack.FLUSHED, ()), "part_count is 0"),
        (
            protocol.MultiProduceRequest(
                Ack.FLUSHED, (ProducePart("t", 0, encode_message(b"x"), sequence=3),)
            ),
            "producer_id is 0",
        ),
    ],
)
def test_a_malformed_request_is_refused_whole(
    client: RawClient, request_body: protocol.MultiProduceRequest, problem: str
) -> None:
    with pytest.raises(BrokerError) as raised:
        client.call(Api.MULTI_PRODUCE, request_body)
    assert raised.value.name == "MALFORMED_REQUEST"
    assert problem in raised.value.message


def test_parts_on_a_worker_killed_mid_request_are_answered_unavailable_and_stored_once_after(
    pylogd: RunningBroker, tmp_path: Path
) -> None:
    client = RawClient(pylogd.endpoint, timeout_s=30)
    try:
        client.create("spread", 4)
        workers = [worker_of(pylogd, "spread", p) for p in range(4)]
        assert sorted(set(workers)) == [0, 1], workers  # the topic spans both workers
        stopped = workers[0]
        sets = [message_set(10 * p, 2) for p in range(4)]
        parts = [ProducePart("spread", p, sets[p], sequence=0) for p in range(4)]
        victim = worker_pid(pylogd, stopped)
        os.kill(victim, signal.SIGSTOP)  # its parts wait, the other worker's are stored
        header = protocol.RequestHeader(Api.MULTI_PRODUCE, 1, 5, "tests")
        request = protocol.MultiProduceRequest(Ack.FLUSHED, tuple(parts), PRODUCER_ID)
        dealer = client.context.socket(zmq.DEALER)
        dealer.setsockopt(zmq.LINGER, 0)
        dealer.connect(pylogd.endpoint)
        dealer.send_multipart([bytes(f) for f in protocol.encode_request(header, request)])
        others = [p for p in range(4) if workers[p] != stopped]
        wait_until(
            lambda: all(client.read_all("spread", p) == sets[p] for p in others),
            10,
            "the running worker's parts stored",
        )
        assert not dealer.poll(100)  # the reply waits for every part
        os.kill(victim, signal.SIGKILL)
        assert dealer.poll(10_000), "no reply once the worker died"
        reply = protocol.decode_reply(Api.MULTI_PRODUCE, dealer.recv_multipart())
        dealer.close()
        for p, part in enumerate(reply.parts):
            if workers[p] == stopped:
                with pytest.raises(BrokerError) as raised:
                    protocol.decode_part_reply(part)
                assert raised.value.name == "PARTITION_UNAVAILABLE"
            else:
                assert protocol.decode_part_reply(part).base_offset == 0

        def sent_again() -> bool:  # once the worker is back: the same parts, the same ids
            try:
                answers = multi_produce(client, parts, producer_id=PRODUCER_ID)
            except BrokerError:
                return False
            return all(isinstance(a, protocol.ProduceReply) for a in answers)

        wait_until(sent_again, 30, "every part answered after the worker's restart")
        assert [client.read_all("spread", p) for p in range(4)] == sets  # each stored once
    finally:
        client.close()
