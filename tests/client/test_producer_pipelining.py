"""Producer pipelining against a scripted broker on loopback: how many batches are in flight,
and what a retriable error does to one of them."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest
import zmq

from broker.client import Producer
from broker.log import iter_messages
from broker.protocol import (
    Ack,
    ErrorCode,
    MetadataBroker,
    MetadataReply,
    MetadataRequest,
    PartitionInfo,
    ProduceReply,
    ProduceRequest,
    RequestHeader,
    TopicInfo,
    decode_request,
    encode_error,
    encode_reply,
)

TOPIC = "pipelined"


@dataclass
class HoldingBroker:
    """Answers METADATA with one partition; holds PRODUCE replies until `hold` requests are
    waiting (or none came for `quiet_ms`), then answers them all (the first `fail_first` with
    PARTITION_UNAVAILABLE). Records the values of every PRODUCE it saw, in order."""

    hold: int
    fail_first: int = 0
    quiet_ms: int = 20
    endpoint: str = ""
    produced: list[list[bytes]] = field(default_factory=list)
    most_waiting: int = 0

    def serve(self, socket: zmq.Socket[bytes], stop: threading.Event) -> None:
        waiting: list[tuple[list[bytes], RequestHeader, ProduceRequest]] = []
        offset = 0
        while not stop.is_set():
            if not socket.poll(self.quiet_ms):
                if waiting:  # nothing more is coming: answer what waits
                    self.most_waiting = max(self.most_waiting, len(waiting))
                    offset = self._answer(socket, waiting, offset)
                continue
            identity, *rest = socket.recv_multipart()
            envelope = [identity, b""] if rest[0] == b"" else [identity]
            header, request = decode_request(rest[len(envelope) - 1 :])
            if isinstance(request, MetadataRequest):
                itself = MetadataBroker(0, "127.0.0.1", int(self.endpoint.rpartition(":")[2]))
                partition = PartitionInfo(0, itself.broker_id)
                reply = MetadataReply((itself,), (TopicInfo(TOPIC, 0, (partition,)),))
                frames = encode_reply(header.correlation_id, reply, header.version)
                socket.send_multipart([*envelope, *frames])
                continue
            assert isinstance(request, ProduceRequest)
            self.produced.append([m.value for m in iter_messages(request.message_set)])
            waiting.append((envelope, header, request))
            if len(waiting) >= self.hold:
                self.most_waiting = max(self.most_waiting, len(waiting))
                offset = self._answer(socket, waiting, offset)

    def _answer(
        self,
        socket: zmq.Socket[bytes],
        waiting: list[tuple[list[bytes], RequestHeader, ProduceRequest]],
        offset: int,
    ) -> int:
        for envelope, header, request in waiting:
            if self.fail_first > 0:
                self.fail_first -= 1
                frames = encode_error(
                    header.correlation_id, ErrorCode.PARTITION_UNAVAILABLE, "later"
                )
            else:
                count = sum(1 for _ in iter_messages(request.message_set))
                reply = ProduceReply(offset, count)
                frames = encode_reply(header.correlation_id, reply, header.version)
                offset += len(request.message_set)
            socket.send_multipart([*envelope, *frames])
        waiting.clear()
        return offset


@pytest.fixture
def holding() -> Iterator[HoldingBroker]:
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    socket = context.socket(zmq.ROUTER)
    port = socket.bind_to_random_port("tcp://127.0.0.1")
    broker = HoldingBroker(hold=3, endpoint=f"tcp://127.0.0.1:{port}")
    stop = threading.Event()
    thread = threading.Thread(target=broker.serve, args=(socket, stop), daemon=True)
    thread.start()
    yield broker
    stop.set()
    thread.join()
    socket.close(linger=0)
    context.term()


def test_max_in_flight_batches_are_sent_before_the_producer_waits(
    holding: HoldingBroker,
) -> None:
    with Producer(
        holding.endpoint, TOPIC, ack=Ack.WRITTEN, batch_messages=1, max_in_flight=3, timeout_s=5
    ) as producer:
        for i in range(6):
            producer.send(b"m%d" % i)
        acks = producer.flush()
    assert holding.most_waiting == 3  # one at a time, the broker would never have answered
    assert [a.base_offset for a in acks] == sorted(a.base_offset for a in acks)
    assert [values for values in holding.produced] == [[b"m%d" % i] for i in range(6)]


def test_a_batch_refused_with_a_retriable_error_is_sent_again(holding: HoldingBroker) -> None:
    holding.hold, holding.fail_first = 1, 1
    with Producer(
        holding.endpoint, TOPIC, ack=Ack.FLUSHED, batch_messages=2, max_in_flight=2, timeout_s=5
    ) as producer:
        for i in range(4):
            producer.send(b"m%d" % i)
        acks = producer.flush()
        assert not producer._requests.connections()  # waited on, kept as batches land
    assert sum(a.count for a in acks) == 4  # every message acknowledged once
    # both batches went out before the first reply; the refused one went out again after
    assert holding.produced == [[b"m0", b"m1"], [b"m2", b"m3"], [b"m0", b"m1"]]


def test_a_partitions_next_batch_fills_while_its_last_awaits_its_ack(
    holding: HoldingBroker,
) -> None:
    """Nagle's rule (Producer._busy): with linger 0 every message would leave alone; while the
    first batch awaits its ack, the next ones fill one batch, which flush sends."""
    holding.hold, holding.quiet_ms = 100, 2000  # answered 2 s after the last request
    with Producer(
        holding.endpoint, TOPIC, ack=Ack.WRITTEN, linger_ms=0, max_in_flight=5, timeout_s=10
    ) as producer:
        for i in range(4):
            producer.send(b"m%d" % i)
        producer.flush()
    assert holding.produced == [[b"m0"], [b"m1", b"m2", b"m3"]]
