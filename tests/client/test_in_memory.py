"""The clients on a MemoryTransport (broker.client.transport): requests answered in memory by a
played broker, waits passed on a fake clock. No socket, no thread, no process, and no wait:
a lost reply costs its timeout on the clock, a retry its back-off, a batch its delivery
timeout, and the test takes milliseconds."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import zmq

from broker.client import Ack, Cluster, Connection, Producer
from broker.client.transport import MemoryChannel, MemoryTransport
from broker.errors import ConnectionRefused, Unavailable
from broker.log.message import Buffer, encode_message, iter_messages
from broker.protocol import (
    PRODUCE_IDEMPOTENT_VERSION,
    ErrorCode,
    MetadataBroker,
    MetadataReply,
    MetadataRequest,
    MultiProduceReply,
    MultiProduceRequest,
    PartitionInfo,
    PartReply,
    ProduceReply,
    ProduceRequest,
    Reply,
    TopicInfo,
    decode_request,
    encode_error,
    encode_reply,
    part_reply,
)
from tests.conftest import FakeClock

TIMEOUT_S = 5.0


@pytest.fixture(autouse=True)
def no_socket_and_no_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    """A ZeroMQ context, socket or thread made by a test here fails it."""

    def refused(*args: object, **kwargs: object) -> None:
        raise AssertionError("a client on a MemoryTransport made a context, socket or thread")

    monkeypatch.setattr(zmq.Context, "__init__", refused)
    monkeypatch.setattr(zmq.Context, "socket", refused)
    monkeypatch.setattr(threading.Thread, "start", refused)


def endpoint(broker_id: int) -> str:
    return f"tcp://broker-{broker_id}:9092"


@dataclass(frozen=True)
class Produced:
    """A set that reached a played broker (in a PRODUCE, or a part of a MULTI_PRODUCE)."""

    at: str
    partition: int
    producer_id: int
    sequence: int


@dataclass
class PlayedCluster:
    """Topic "t" of `partitions` partitions over `brokers` brokers (partition p led by broker
    p % brokers), played in memory: METADATA names them; a PRODUCE (or each part of a
    MULTI_PRODUCE) is appended to its partition's log and answered with its offset, once (a set
    sent again under its producer id and sequence is answered as the first time), unless `lose`
    says that the request's reply is lost."""

    brokers: int = 1
    partitions: int = 1
    lose: Callable[[], bool] = lambda: False
    produced: list[Produced] = field(default_factory=list)
    """Every set received, in order."""
    logs: dict[int, bytearray] = field(default_factory=dict)
    """The message sets stored, by partition."""
    sets: dict[tuple[int, int, int], ProduceReply] = field(default_factory=dict)
    """(partition, producer id, sequence) of an idempotent set -> its reply."""

    def answer(self, at: str, frames: list[bytes]) -> Sequence[Buffer] | None:
        header, request = decode_request(frames)
        reply: Reply
        if isinstance(request, MetadataRequest):
            brokers = tuple(MetadataBroker(b, f"broker-{b}", 9092) for b in range(self.brokers))
            layout = tuple(
                PartitionInfo(p, p % self.brokers, ErrorCode.NONE) for p in range(self.partitions)
            )
            reply = MetadataReply(brokers, (TopicInfo("t", ErrorCode.NONE, layout),))
        elif isinstance(request, ProduceRequest):
            reply = self._append(
                at, request.partition, request.message_set, request.producer_id, request.sequence
            )
        else:
            assert isinstance(request, MultiProduceRequest)
            reply = MultiProduceReply(
                tuple(
                    PartReply(
                        part.topic,
                        part.partition,
                        part_reply(
                            encode_reply(
                                0,
                                self._append(
                                    at,
                                    part.partition,
                                    part.message_set,
                                    request.producer_id,
                                    part.sequence,
                                ),
                                PRODUCE_IDEMPOTENT_VERSION,
                            )[0]
                        ),
                    )
                    for part in request.parts
                )
            )
        if not isinstance(reply, MetadataReply) and self.lose():
            return None
        return encode_reply(header.correlation_id, reply, header.version)

    def _append(
        self, at: str, partition: int, message_set: Buffer, producer_id: int, sequence: int
    ) -> ProduceReply:
        assert at == endpoint(partition % self.brokers), "sent to its leader"
        self.produced.append(Produced(at, partition, producer_id, sequence))
        known = self.sets.get((partition, producer_id, sequence))
        if known is not None:
            return known
        log = self.logs.setdefault(partition, bytearray())
        reply = ProduceReply(len(log), len(list(iter_messages(message_set))))
        log += message_set
        if producer_id:
            self.sets[partition, producer_id, sequence] = reply
        return reply

    def stored(self, partition: int) -> dict[int, bytes]:
        """The values stored in `partition`, by offset."""
        log = bytes(self.logs.get(partition, b""))
        return {message.offset: message.value for message in iter_messages(log)}


def test_a_lost_reply_costs_the_connection_its_timeout_on_the_clock_and_a_new_channel(
    clock: FakeClock,
) -> None:
    """The first METADATA's reply is lost: the request raises Unavailable once the timeout has
    passed on the transport's clock (nobody waited), and its channel, which a REQ socket could
    not use again, is closed; the next request goes on a new one and is answered."""
    played = PlayedCluster()
    asked = 0

    def answer(at: str, frames: list[bytes]) -> Sequence[Buffer] | None:
        nonlocal asked
        asked += 1
        return None if asked == 1 else played.answer(at, frames)

    transport = MemoryTransport(answer, clock)
    started = clock.monotonic()
    with Connection(endpoint(0), timeout_s=TIMEOUT_S, transport=transport) as connection:
        with pytest.raises(Unavailable, match="no reply from tcp://broker-0:9092 within 5 s"):
            connection.request(MetadataRequest())
        assert clock.monotonic() - started == TIMEOUT_S
        assert connection.request(MetadataRequest()).brokers == (
            MetadataBroker(0, "broker-0", 9092),
        )
    first, second = transport.channels
    assert first.closed and not first.pipelined and second.closed  # closed with the connection
    assert clock.monotonic() - started == TIMEOUT_S


def test_a_call_backs_off_on_its_transports_clock(clock: FakeClock) -> None:
    """A call answered PARTITION_UNAVAILABLE twice is retried after 0.1 s, then 0.2 s: slept
    on the clock, which moves by exactly that."""
    played = PlayedCluster()
    answers = 0

    def answer(at: str, frames: list[bytes]) -> Sequence[Buffer] | None:
        nonlocal answers
        answers += 1
        if answers <= 2:
            correlation_id = decode_request(frames)[0].correlation_id
            return encode_error(correlation_id, ErrorCode.PARTITION_UNAVAILABLE, "not served yet")
        return played.answer(at, frames)

    started = clock.monotonic()
    transport = MemoryTransport(answer, clock)
    with Connection(endpoint(0), transport=transport) as connection:
        assert connection.call(MetadataRequest(), retries=3).topics[0].topic == "t"
    assert answers == 3
    assert clock.monotonic() - started == pytest.approx(0.1 + 0.2)


def test_a_refused_connection_is_raised_by_the_next_receive(clock: FakeClock) -> None:
    """A played broker that nothing listens for: ConnectionRefused at once, not after the
    timeout, and no retry of a connection's call (a cluster asks the next broker)."""

    def answer(at: str, frames: list[bytes]) -> Sequence[Buffer] | None:
        raise ConnectionRefused(at)

    started = clock.monotonic()
    with (
        Connection(endpoint(0), transport=MemoryTransport(answer, clock)) as connection,
        pytest.raises(ConnectionRefused),
    ):
        connection.call(MetadataRequest(), retries=3)
    assert clock.monotonic() == started


def test_a_producer_sends_each_broker_its_partitions_and_takes_every_ack(
    clock: FakeClock,
) -> None:
    """Keyed messages over 4 partitions led by 2 brokers: each batch goes to its leader on that
    broker's pipelined channel, the replies of both are taken as they come (the transport's
    wait_any), and every message is acknowledged where it was stored."""
    played = PlayedCluster(brokers=2, partitions=4)
    transport = MemoryTransport(played.answer, clock)
    with Producer(
        endpoint(0), "t", ack=Ack.FLUSHED, max_in_flight=8, transport=transport
    ) as producer:
        deliveries = [producer.send(f"v{n}".encode(), f"k{n}".encode()) for n in range(40)]
        producer.flush()
        offsets = [delivery.result(0) for delivery in deliveries]
    assert sum(len(played.stored(p)) for p in range(4)) == 40
    for n, (delivery, offset) in enumerate(zip(deliveries, offsets, strict=True)):
        assert played.stored(delivery.partition)[offset] == f"v{n}".encode()
    assert {produced.at for produced in played.produced} == {endpoint(0), endpoint(1)}
    pipelined = {
        c.endpoint for c in transport.channels if isinstance(c, MemoryChannel) and c.pipelined
    }
    assert pipelined == {endpoint(0), endpoint(1)}
    assert all(channel.closed for channel in transport.channels)


def test_a_batch_whose_reply_was_lost_goes_again_after_the_timeout_with_its_sequence(
    clock: FakeClock,
) -> None:
    """The first PRODUCE's reply is lost: once the timeout has passed on the clock, the batch
    goes again under the same producer id and sequence (the broker stores a set sent again
    once), and is acknowledged."""
    played = PlayedCluster(lose=lambda: len(played.produced) == 1)
    transport = MemoryTransport(played.answer, clock)
    started = clock.monotonic()
    with Producer(
        endpoint(0), "t", batch_messages=1, timeout_s=TIMEOUT_S, transport=transport
    ) as producer:
        assert producer.send(b"once").result() == 0
    first, again = played.produced
    assert first == again and first.producer_id > 0
    assert list(played.stored(0).values()) == [b"once"]
    assert TIMEOUT_S <= clock.monotonic() - started < TIMEOUT_S + 1


def test_a_batch_never_answered_fails_at_its_delivery_timeout_on_the_clock(
    clock: FakeClock,
) -> None:
    """A broker that never answers: the batch is sent again after each timeout, backed off,
    until delivery_timeout_s have passed on the clock, then fails with Unavailable; no attempt
    starts after that, and nothing waited in real time."""
    played = PlayedCluster(lose=lambda: True)
    transport = MemoryTransport(played.answer, clock)
    started = clock.monotonic()
    producer = Producer(
        endpoint(0), "t", delivery_timeout_s=30, timeout_s=TIMEOUT_S, transport=transport
    )
    delivery = producer.send(b"lost")
    with pytest.raises(Unavailable, match="no reply"):
        delivery.result()
    spent = clock.monotonic() - started
    assert 30 <= spent <= 30 + TIMEOUT_S
    assert 2 <= len(played.produced) <= 30 // TIMEOUT_S + 1
    assert set(played.produced) == {played.produced[0]}  # the same set each time
    producer.cluster.close()


def test_linger_is_measured_on_the_producers_clock(clock: FakeClock) -> None:
    """A batch lingers 100 ms on the clock: a send before then sends nothing; one after it
    sends the batch."""
    played = PlayedCluster()
    with Producer(
        endpoint(0), "t", linger_ms=100, transport=MemoryTransport(played.answer, clock)
    ) as producer:
        producer.send(b"a")
        clock.advance(0.099)
        producer.send(b"b")
        assert played.produced == []
        clock.advance(0.001)
        producer.send(b"c")
        assert [produced.partition for produced in played.produced] == [0]
        assert list(played.stored(0).values()) == [b"a", b"b", b"c"]


def test_a_cluster_asks_the_next_broker_when_one_is_refused(clock: FakeClock) -> None:
    """Two bootstrap brokers, the first refusing: METADATA comes from the second at once."""
    played = PlayedCluster(brokers=2)

    def answer(at: str, frames: list[bytes]) -> Sequence[Buffer] | None:
        if at == endpoint(0):
            raise ConnectionRefused(at)
        return played.answer(at, frames)

    started = clock.monotonic()
    with Cluster(
        f"{endpoint(0)},{endpoint(1)}", transport=MemoryTransport(answer, clock)
    ) as cluster:
        assert [p.broker_id for p in cluster.partitions("t")] == [0]
    assert clock.monotonic() == started


def test_the_docs_example_runs_as_written(capsys: pytest.CaptureFixture[str]) -> None:
    """docs/clients.md, "Unit tests without a broker": its program, pasted, produces two
    messages to its played broker and prints their offsets, with no socket and no thread."""
    text = (Path(__file__).parents[2] / "docs" / "clients.md").read_text()
    section = text.split("## Unit tests without a broker", 1)[1]
    program = section.split("```python\n", 1)[1].split("```\n", 1)[0]
    exec(compile(program, "docs/clients.md", "exec"), {})
    assert capsys.readouterr().out == f"0 {len(encode_message(b'hello'))}\n"
