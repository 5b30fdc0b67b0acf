"""Issue 50, 4: the compressed sets a client sends cost the worker that opens them time, not
wire bytes (a few KB of zstd expand to 64 MiB, about 45 ms to open and check). A worker opens
them one client's at a time, in turn, each client's requests in order, and serves the other
requests between them: one client's sets never hold another client's produce behind all of
them."""

from __future__ import annotations

import zmq

from broker import protocol
from broker.client import Admin
from broker.client.connection import Connection
from broker.log import codec, compression
from broker.log.compression import Codec, Compressor
from broker.protocol import Ack, Api, MultiProduceRequest, ProducePart, ProduceRequest
from tests.broker.test_flow_control import dealer
from tests.pylogd import RunningBroker

CLIENTS = 4
SETS_EACH = 10
VALUE_BYTES = 512 * 1024 - 64
NONE = protocol.ErrorCode.NONE


def bomb() -> bytes:
    """A zstd set of 127 messages of 512 KiB of zeros: 63.5 MiB opened, a few KB sent."""
    inner = codec.encode_message(bytes(VALUE_BYTES), None, 1, True) * 127
    assert len(inner) <= compression.MAX_INNER_SET_BYTES
    return Compressor(Codec.ZSTD).wrap(inner, 1)


def test_a_clients_sets_to_open_do_not_hold_back_another_clients_produce(
    broker: RunningBroker, topic: str
) -> None:
    """Four clients pipeline ten such sets each to partition 0; once the worker opens the
    first, a fifth client's small produce to another partition of that worker is answered after
    at most a turn of the four (it waited behind all forty before: FIFO); every set is stored."""
    with Admin(broker.endpoint) as admin:
        admin.create_topic(topic, 4)
    (first_dir,) = {p.parent for p in broker.data_dir.parent.glob(f"logs-*/{topic}-0")}
    (other,) = [n for n in range(1, 4) if (first_dir / f"{topic}-{n}").is_dir()][:1]
    message_set = bomb()
    with (
        dealer(broker.endpoint) as a,
        dealer(broker.endpoint) as b,
        dealer(broker.endpoint) as c,
        dealer(broker.endpoint) as d,
    ):
        sockets = [a, b, c, d]
        assert len(sockets) == CLIENTS
        for number in range(SETS_EACH):
            for socket in sockets:
                request = ProduceRequest(topic, 0, Ack.WRITTEN, message_set)
                socket.send(protocol.encode_produce(number + 1, "expands", request)[0])
        replies = [0] * CLIENTS

        def take(client: int) -> None:  # stored, and each client's answered in order
            header = protocol.decode_reply_header(sockets[client].recv_multipart())
            assert (header.error_code, header.correlation_id) == (NONE, replies[client] + 1)
            replies[client] += 1

        poller = zmq.Poller()
        for socket in sockets:
            poller.register(socket, zmq.POLLIN)
        assert poller.poll(60_000), "no set answered in 60 s"  # the worker opens them
        with Connection(broker.endpoint, timeout_s=60.0) as victim:
            small = codec.encode_message(b"small")
            victim.call(ProduceRequest(topic, other, Ack.WRITTEN, small))
        for client, socket in enumerate(sockets):
            while socket.poll(0):
                take(client)
        before = sum(replies)
        assert before <= 2 * CLIENTS + 1, f"{before} of {CLIENTS * SETS_EACH} sets first"
        for client, socket in enumerate(sockets):  # and every one of them is stored
            while replies[client] < SETS_EACH:
                assert socket.poll(60_000), "a set was never answered"
                take(client)


def test_a_clients_multi_produces_keep_its_order_when_a_part_waits_its_turn(
    broker: RunningBroker, topic: str
) -> None:
    """An idempotent producer pipelines two MULTI_PRODUCEs to one partition: a compressed set
    (sequence 0), then a plain one (sequence 1). The first waits its turn to be opened; the
    second, of the same connection, waits behind it (a part's tag names its connection), so
    both are stored in order (served first, sequence 1 was refused: UNKNOWN_PRODUCER_ID)."""
    with Admin(broker.endpoint) as admin:
        admin.create_topic(topic, 1)
    producer_id = 0x5EED_0001
    compressed = ProducePart(topic, 0, bomb(), 0)
    plain = ProducePart(topic, 0, codec.encode_message(b"after"), 1)
    with Connection(broker.endpoint, timeout_s=60.0) as connection:
        sent = [
            connection.send_pipelined(MultiProduceRequest(Ack.WRITTEN, (part,), producer_id))
            for part in (compressed, plain)
        ]
        answers: dict[int, protocol.ProduceReply] = {}
        while len(answers) < len(sent):
            correlation_id, frames = connection.receive_pipelined(60.0)
            reply = protocol.decode_reply(Api.MULTI_PRODUCE, frames)
            (part,) = reply.parts
            answers[correlation_id] = protocol.decode_part_reply(part)  # raises an error
    first, second = (answers[correlation_id] for correlation_id in sent)
    assert first.base_offset < second.base_offset
