"""The idempotent producer against a real pylogd (docs/protocol.md, PRODUCE version 3): a set
sent again, after a lost reply or a worker's restart, is stored once and answered with its
first offset; the Producer's batches are stored exactly once while its worker is killed; a
partition that forgot the producer is answered so, and a batch sent again then fails rather
than risk being stored twice (against a played broker)."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest
import zmq

from broker.aio import AsyncProducer
from broker.client import Ack, Admin, MaybeStored, PartitionConsumer, Producer
from broker.client.connection import Connection
from broker.errors import (
    BrokerError,
    OutOfOrderSequence,
    PartitionUnavailable,
    PylogError,
    Unavailable,
    UnknownProducerId,
)
from broker.log.message import encode_message, iter_messages
from broker.protocol import (
    PRODUCE_IDEMPOTENT_VERSION,
    Api,
    ErrorCode,
    MetadataBroker,
    MetadataReply,
    PartitionInfo,
    ProduceReply,
    ProduceRequest,
    RequestHeader,
    TopicInfo,
    decode_reply,
    encode_error,
    encode_reply,
)
from tests.client.router import answer_requests, in_memory, serving
from tests.conftest import FakeClock, wait_until
from tests.pylogd import RunningBroker

PRODUCER = 0x2F1E5D4C3B2A1908


def create(broker: RunningBroker, topic: str) -> None:
    with Admin(broker.endpoint) as admin:
        admin.create_topic(topic, 1)


def stored(broker: RunningBroker, topic: str) -> list[bytes]:
    with PartitionConsumer(broker.endpoint, topic, 0, stop_at_end=True) as consumer:
        return [bytes(message.value) for message in consumer]


def produce_once_served(connection: Connection, request: ProduceRequest) -> ProduceReply:
    """The reply to `request`, sent again while its worker restarts."""
    replies: list[ProduceReply] = []

    def answered() -> bool:
        try:
            replies.append(connection.request(request))
        except (PartitionUnavailable, Unavailable):
            return False
        return True

    wait_until(answered, timeout=30, what="the restarted worker to serve the partition")
    return replies[-1]


def test_a_set_sent_again_is_stored_once_even_after_its_worker_restarts(
    broker: RunningBroker, topic: str
) -> None:
    create(broker, topic)
    first = ProduceRequest(topic, 0, Ack.FLUSHED, encode_message(b"first"), PRODUCER, 0, 0)
    second = ProduceRequest(topic, 0, Ack.FLUSHED, encode_message(b"second"), PRODUCER, 0, 1)
    with Connection(broker.endpoint) as connection:
        # the first reply "lost": its client sends the set again, then the next one
        lost, again = connection.send_pipelined(first), connection.send_pipelined(first)
        answers = {
            correlation_id: decode_reply(Api.PRODUCE, frames, PRODUCE_IDEMPOTENT_VERSION)
            for correlation_id, frames in (connection.receive_pipelined(10) for _ in range(2))
        }
        assert answers.keys() == {lost, again}
        assert answers[lost] == answers[again]
        reply = connection.request(first)
        assert (reply.base_offset, reply.count) == (0, 1)
        for worker in broker.worker_pids():
            os.kill(worker, signal.SIGKILL)
        after_restart = produce_once_served(connection, first)
        assert (after_restart.base_offset, after_restart.count) == (0, 1)
        assert connection.request(second).base_offset > 0
        with pytest.raises(BrokerError) as out_of_order:
            connection.request(
                ProduceRequest(topic, 0, Ack.FLUSHED, encode_message(b"x"), PRODUCER, 0, 5)
            )
        assert out_of_order.value.code == ErrorCode.OUT_OF_ORDER_SEQUENCE
        assert out_of_order.value.retriable and out_of_order.value.expected == 2  # type: ignore[attr-defined]
        epoch_1 = ProduceRequest(topic, 0, Ack.FLUSHED, encode_message(b"x"), PRODUCER, 1, 0)
        assert connection.request(epoch_1).count == 1  # a new epoch starts anywhere
        with pytest.raises(BrokerError) as fenced:
            connection.request(
                ProduceRequest(topic, 0, Ack.FLUSHED, encode_message(b"y"), PRODUCER, 0, 2)
            )
        assert fenced.value.code == ErrorCode.INVALID_PRODUCER_EPOCH
        assert fenced.value.current_epoch == 1  # type: ignore[attr-defined]
    assert stored(broker, topic) == [b"first", b"second", b"x"]


def test_every_batch_is_stored_exactly_once_while_the_worker_is_killed_again_and_again(
    make_pylogd: Callable[..., RunningBroker], topic: str
) -> None:
    """As test_producer's kill test, with batches in flight when the worker dies: up to 4 of
    5 messages, ack ALL (flushed here), the kill after the 18th message of each round (3
    batches sent, their replies not all in)."""
    broker = make_pylogd("--log-flush-interval-ms", "50")
    create(broker, topic)
    values: list[bytes] = []
    with Producer(
        broker.endpoint, topic, ack=Ack.ALL, batch_messages=5, max_in_flight=4, timeout_s=2
    ) as producer:
        for kill in range(6):
            for n in range(40):
                values.append(b"kill %d message %d" % (kill, n))
                producer.send(values[-1])
                if n == 17:
                    (worker,) = broker.worker_pids()
                    os.kill(worker, signal.SIGKILL)
            producer.flush()

            def restarted(killed: int = worker) -> bool:
                return broker.worker_pids() not in ([], [killed])

            wait_until(restarted, what="the worker's restart")
    assert stored(broker, topic) == values  # each once, in order


def test_a_batch_after_one_the_partition_never_got_is_numbered_again_and_stored_once(
    broker: RunningBroker, topic: str
) -> None:
    """The partition expects a batch the producer no longer has (it failed for good, or the
    partition forgot the producer): told OUT_OF_ORDER_SEQUENCE, the producer numbers the
    batch again under a new producer id, and it is stored, once."""
    create(broker, topic)
    with Producer(broker.endpoint, topic, ack=Ack.FLUSHED, batch_messages=1) as producer:
        producer.send(b"first").result(10)
        first_id = producer._producer_id
        producer._sequences[0] = 7  # as if sets 1 to 6 had failed for good
        assert producer.send(b"second").result(10) > 0
        assert producer._producer_id != first_id
        producer.send(b"third").result(10)
    assert stored(broker, topic) == [b"first", b"second", b"third"]


def test_a_batch_whose_partition_knows_no_producer_of_it_is_numbered_again_and_stored_once(
    broker: RunningBroker, topic: str
) -> None:
    """A partition that forgot the producer (or never stored its first set) answers a set of
    sequence past 0 UNKNOWN_PRODUCER_ID: a batch sent for the first time is numbered again
    under a new producer id, and stored once."""
    create(broker, topic)
    with Producer(broker.endpoint, topic, ack=Ack.FLUSHED, batch_messages=1) as producer:
        producer.send(b"first").result(10)
        producer._producer_id, producer._sequences[0] = PRODUCER, 5  # as if forgotten
        assert producer.send(b"second").result(10) > 0
        assert producer._producer_id != PRODUCER
    assert stored(broker, topic) == [b"first", b"second"]
    with Connection(broker.endpoint) as connection:  # the answer itself
        request = ProduceRequest(topic, 0, Ack.FLUSHED, encode_message(b"x"), PRODUCER + 1, 0, 3)
        with pytest.raises(BrokerError, match="knows no set of producer") as raised:
            connection.request(request)
        assert raised.value.code == ErrorCode.UNKNOWN_PRODUCER_ID and not raised.value.retriable


@dataclass
class LateFirstSet:
    """Partition 0 of "t" on a played broker that keeps idempotent sets as a partition does:
    the first PRODUCE of all is lost (no reply, nothing stored: a worker died with it), then a
    set of a producer it does not know is UNKNOWN_PRODUCER_ID unless it is the producer's
    first (sequence 0), one out of order OUT_OF_ORDER_SEQUENCE, one stored already answered
    with its offset. `stored`: the sets kept, in order."""

    endpoint: str = ""
    stored: list[tuple[int, int, bytes]] = field(default_factory=list)
    requests: int = 0

    def serve(self, socket: zmq.Socket[bytes], stop: threading.Event) -> None:
        answer_requests(socket, stop, self.answer)

    def answer(self, header: RequestHeader, request: object) -> list[bytes] | None:
        if not isinstance(request, ProduceRequest):
            return ForgetfulPartition(self.endpoint).answer(header, request)
        self.requests += 1
        if self.requests == 1:
            return None  # lost with its worker
        producer, sequence = request.producer_id, request.sequence
        sets = [(p, q) for p, q, _ in self.stored]
        if (producer, sequence) in sets:
            offset = sets.index((producer, sequence))
            return [
                bytes(f)
                for f in encode_reply(
                    header.correlation_id, ProduceReply(offset, 1), header.version
                )
            ]
        expected = 1 + max((q for p, q in sets if p == producer), default=-1)
        error: PylogError | None = None
        if expected == 0 and sequence != 0:
            error = UnknownProducerId("t-0", producer, 0, sequence)
        elif sequence != expected:
            error = OutOfOrderSequence("t-0", producer, 0, sequence, expected)
        if error is not None:
            return [bytes(f) for f in encode_error(header.correlation_id, error)]
        self.stored.append((producer, sequence, bytes(request.message_set)))
        reply = ProduceReply(len(self.stored) - 1, 1)
        return [bytes(f) for f in encode_reply(header.correlation_id, reply, header.version)]


def test_a_batch_whose_producers_first_set_is_on_its_way_again_waits_for_it(
    clock: FakeClock,
) -> None:
    """A worker dies with a producer's first set (sequence 0); its second (sequence 1) then
    reaches the partition first, which knows no set of the producer: UNKNOWN_PRODUCER_ID. The
    first set is still the producer's to send, so the partition has not forgotten anything:
    the first goes again, then the second, under the same id, both stored once, in order
    (the second was numbered again as a new producer's first set, and stored before the first;
    or, sent twice already, failed MaybeStored: CI met that). In memory, on a fake clock."""
    fake = LateFirstSet()
    transport = in_memory(fake, clock)
    with Producer(
        fake.endpoint, "t", ack=Ack.FLUSHED, batch_messages=1, max_in_flight=2, transport=transport
    ) as producer:
        first, second = producer.send(b"first"), producer.send(b"second")
        assert first.result(20) < second.result(20)
    assert [m.value for _, _, data in fake.stored for m in iter_messages(data)] == [
        b"first",
        b"second",
    ]
    assert len({producer_id for producer_id, _, _ in fake.stored}) == 1


def test_the_async_producer_also_waits_for_its_first_set_on_its_way_again() -> None:
    """The same, by the asyncio producer (each batch a task of its own)."""

    async def produce(endpoint: str) -> tuple[int, int]:
        async with AsyncProducer(
            endpoint, "t", ack=Ack.FLUSHED, batch_messages=1, max_in_flight=2, timeout_s=0.5
        ) as producer:
            first, second = await producer.send(b"first"), await producer.send(b"second")
            await producer.flush()
            return await first.result(20), await second.result(20)

    with serving(LateFirstSet()) as fake:
        first, second = asyncio.run(asyncio.wait_for(produce(fake.endpoint), 30))
    assert first < second
    assert [m.value for _, _, data in fake.stored for m in iter_messages(data)] == [
        b"first",
        b"second",
    ]
    assert len({producer_id for producer_id, _, _ in fake.stored}) == 1


@dataclass
class ForgetfulPartition:
    """Partition 0 of "t" on a played broker: METADATA says it leads it; the first PRODUCE
    gets no reply (lost), every later one UNKNOWN_PRODUCER_ID (the partition forgot the
    producer meanwhile). Records the (producer_id, sequence) of each PRODUCE."""

    endpoint: str = ""
    produced: list[tuple[int, int]] = field(default_factory=list)

    def serve(self, socket: zmq.Socket[bytes], stop: threading.Event) -> None:
        answer_requests(socket, stop, self.answer)

    def answer(self, header: RequestHeader, request: object) -> list[bytes] | None:
        if isinstance(request, ProduceRequest):
            self.produced.append((request.producer_id, request.sequence))
            if len(self.produced) == 1:
                return None  # its reply lost
            error = UnknownProducerId("t-0", request.producer_id, 0, request.sequence)
            reply = encode_error(header.correlation_id, error)
        else:
            host, port = self.endpoint.removeprefix("tcp://").split(":")
            partition = PartitionInfo(0, 1, ErrorCode.NONE)
            metadata = MetadataReply(
                (MetadataBroker(1, host, int(port)),),
                (TopicInfo("t", ErrorCode.NONE, (partition,)),),
            )
            reply = encode_reply(header.correlation_id, metadata, header.version)
        return [bytes(f) for f in reply]


def test_a_batch_sent_again_that_its_partition_no_longer_knows_fails_as_maybe_stored(
    clock: FakeClock,
) -> None:
    """Its first sending's reply lost, a batch is sent again and answered UNKNOWN_PRODUCER_ID:
    the first sending may have been stored, so it is not numbered again (which would store it
    twice) but fails, MaybeStored, and goes no third time. In memory, on a fake clock."""
    fake = ForgetfulPartition()
    transport = in_memory(fake, clock)
    with Producer(
        fake.endpoint, "t", ack=Ack.FLUSHED, batch_messages=1, transport=transport
    ) as producer:
        delivery = producer.send(b"lost reply")
        with pytest.raises(MaybeStored, match="may have been stored"):
            delivery.result(20)
        assert len(fake.produced) == 2 and fake.produced[0] == fake.produced[1]


def test_others_new_producer_ids_never_make_a_live_producers_set_stored_twice(
    broker: RunningBroker, topic: str
) -> None:
    """Issue 50, 6, against a real broker: 5,000 PRODUCEs of new producer ids (another client,
    "churner", one set each) after a live producer stored its set; then the live producer
    sends its set again (its reply lost, say), and a third client starts a producer. The
    churner's client id got 3,071 places (3,072 producers in all), the rest were refused
    TOO_MANY_PRODUCERS (retriable) naming it; no one was forgotten; the set sent again is
    answered with its first offset (stored once), and the third client's new producer is let
    in: the last 1,024 places are kept for client ids that hold fewer. (Before, the churner
    took every place, 4,095, and the third client was refused for 300 s.)"""
    create(broker, topic)
    live = ProduceRequest(topic, 0, Ack.WRITTEN, encode_message(b"live"), PRODUCER, 0, 0)
    codes: list[int] = []
    refusals: set[str] = set()
    with Connection(broker.endpoint) as connection:
        first = connection.request(live)
        with Connection(broker.endpoint, client_id="churner") as churner:
            window, sent = 200, 0
            while len(codes) < 5_000:  # bounded: 5,000 requests, 200 in flight at most
                while sent < 5_000 and sent - len(codes) < window:
                    data = encode_message(b"other")
                    churner.send_pipelined(
                        ProduceRequest(topic, 0, Ack.WRITTEN, data, sent + 1, 0, 0)
                    )
                    sent += 1
                _, frames = churner.receive_pipelined(30)
                try:
                    decode_reply(Api.PRODUCE, frames, PRODUCE_IDEMPOTENT_VERSION)
                    codes.append(ErrorCode.NONE)
                except BrokerError as error:
                    codes.append(error.code)
                    refusals.add(str(error).split(": ", 1)[-1])
        assert codes.count(ErrorCode.NONE) == 3071
        assert codes.count(ErrorCode.TOO_MANY_PRODUCERS) == 5_000 - 3071
        (refusal,) = refusals
        assert "3072 idempotent producers, 3071 of them of client id 'churner'" in refusal
        again = connection.request(live)
        with Connection(broker.endpoint, client_id="newcomer") as newcomer:
            newcomer.request(
                ProduceRequest(topic, 0, Ack.WRITTEN, encode_message(b"new"), 9_999, 0, 0)
            )
    assert again.base_offset == first.base_offset
    assert stored(broker, topic).count(b"live") == 1
    assert stored(broker, topic).count(b"new") == 1
