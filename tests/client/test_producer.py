"""Producer against a real pylogd: ack modes, placement by key, batching."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import xxhash

from broker import protocol
from broker.client import Ack, Admin, PartitionConsumer, ProduceAck, Producer
from broker.client.connection import Connection
from broker.client.framing import MAX_RETRY_BACKOFF_S
from broker.errors import BrokerError
from broker.log.message import Message, encode_message
from broker.protocol import ErrorCode
from tests.conftest import FakeClock, wait_until
from tests.pylogd import RunningBroker

TIMESTAMP_MS = 1_700_000_000_000


def create(broker: RunningBroker, topic: str, partitions: int = 1) -> None:
    with Admin(broker.endpoint) as admin:
        admin.create_topic(topic, partitions)


def read_all(broker: RunningBroker, topic: str, partition: int = 0) -> list[Message]:
    with PartitionConsumer(broker.endpoint, topic, partition, stop_at_end=True) as consumer:
        return list(consumer)


def sample(n: int, tag: bytes) -> list[tuple[bytes | None, bytes]]:
    """Keys and values with every byte value, empty values and keyless messages among them."""
    return [
        (None if i % 3 == 0 else b"key-%d" % i, tag + bytes(range(256))[: i * 17] + b"\n\x00")
        for i in range(n)
    ]


@pytest.mark.parametrize("ack", [Ack.WRITTEN, Ack.FLUSHED, Ack.NONE], ids=lambda ack: ack.name)
def test_each_ack_mode_delivers_messages_byte_exact_at_the_acked_offsets(
    broker: RunningBroker, topic: str, ack: Ack
) -> None:
    create(broker, topic)
    messages = sample(12, ack.name.encode())
    with Producer(broker.endpoint, topic, ack=ack, batch_messages=5, linger_ms=60_000) as producer:
        for i, (key, value) in enumerate(messages):
            producer.send(value, key=key, timestamp_ms=TIMESTAMP_MS + i)
        acks = producer.flush()
        assert producer.messages_sent == 12
    if ack is Ack.FLUSHED:
        assert len(read_all(broker, topic)) == 12  # visible as soon as acknowledged
    else:
        # WRITTEN acknowledges before the flush, NONE not at all: visible after the next flush.
        wait_until(lambda: len(read_all(broker, topic)) == 12, what="12 messages flushed")
    assert [a.count for a in acks] == ([] if ack is Ack.NONE else [5, 5, 2])
    read = read_all(broker, topic)
    assert [(m.key, m.value, m.timestamp_ms) for m in read] == [
        (key, value, TIMESTAMP_MS + i) for i, (key, value) in enumerate(messages)
    ]
    # Offsets are byte positions: each batch starts where the one before it ended.
    sizes = [len(encode_message(v, k, TIMESTAMP_MS + i)) for i, (k, v) in enumerate(messages)]
    assert [m.offset for m in read] == [sum(sizes[:i]) for i in range(12)]
    if ack is not Ack.NONE:
        assert [a.base_offset for a in acks] == [read[0].offset, read[5].offset, read[10].offset]


def test_a_key_always_lands_on_the_partition_of_its_hash_and_keyless_ones_go_round_robin(
    broker: RunningBroker, topic: str
) -> None:
    create(broker, topic, partitions=4)
    keys = [b"user-%d" % (i % 7) for i in range(40)]
    with Producer(broker.endpoint, topic) as producer:
        for i, key in enumerate(keys):
            producer.send(b"keyed-%d" % i, key=key)
        for i in range(8):
            producer.send(b"keyless-%d" % i)
    by_partition = {p: read_all(broker, topic, p) for p in range(4)}
    for partition, read in by_partition.items():
        for message in read:
            if message.key is not None:
                assert xxhash.xxh32_intdigest(message.key) % 4 == partition
    keyless = {p: [m.value for m in read if m.key is None] for p, read in by_partition.items()}
    assert keyless == {p: [b"keyless-%d" % p, b"keyless-%d" % (p + 4)] for p in range(4)}
    assert sum(len(read) for read in by_partition.values()) == 48


def test_a_batch_is_sent_when_it_reaches_batch_messages_or_batch_bytes(
    broker: RunningBroker, topic: str
) -> None:
    create(broker, topic)
    value = b"x" * 974  # 1000 bytes a message, keyless
    assert len(encode_message(value)) == 1000
    with Producer(
        broker.endpoint, topic, ack=Ack.WRITTEN, batch_messages=4, batch_bytes=2500, linger_ms=1e9
    ) as producer:
        for _ in range(3):
            producer.send(value)  # the 3rd message makes 3000 bytes: over batch_bytes
        assert producer.messages_sent == 3
        producer.batch_bytes = 1 << 20
        for _ in range(4):
            producer.send(value)  # the 4th makes batch_messages
        assert producer.messages_sent == 7
        producer.send(value)
        assert producer.messages_sent == 7  # still open: neither full nor lingering
        acks = producer.flush()
    assert acks == [ProduceAck(0, 0, 3), ProduceAck(0, 3000, 4), ProduceAck(0, 7000, 1)]


def test_a_batch_is_sent_once_its_first_message_has_lingered_linger_ms(
    broker: RunningBroker, topic: str
) -> None:
    create(broker, topic, partitions=2)
    clock = FakeClock()
    with Producer(broker.endpoint, topic, ack=Ack.WRITTEN, linger_ms=100, clock=clock) as producer:
        producer.send(b"a", partition=0)
        clock.advance(0.099)
        assert producer.messages_sent == 0
        clock.advance(0.001)
        producer.send(b"b", partition=0)  # partition 0's batch has lingered 100 ms now
        assert producer.messages_sent == 2
        producer.send(b"c", partition=0)
        clock.advance(0.099)
        producer.send(b"d", partition=0)
        assert producer.messages_sent == 2
        two = 2 * len(encode_message(b"a"))
        assert producer.flush() == [ProduceAck(0, 0, 2), ProduceAck(0, two, 2)]


def test_a_ready_batch_takes_along_every_open_batch_of_its_broker_in_one_request(
    broker: RunningBroker, topic: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Kafka's drain per broker: partition 0's batch has lingered, partition 1's has not, and
    # both go in one MULTI_PRODUCE, each acked as its own PRODUCE would be.
    create(broker, topic, partitions=3)
    clock = FakeClock()
    sent: list[str] = []
    with Producer(broker.endpoint, topic, ack=Ack.WRITTEN, linger_ms=100, clock=clock) as producer:
        producer.send(b"warm up", partition=2)
        producer.flush()
        real = Connection.send_pipelined

        def spy(connection: Connection, request: protocol.Request) -> int:
            sent.append(type(request).__name__)
            return real(connection, request)

        monkeypatch.setattr(Connection, "send_pipelined", spy)
        producer.send(b"a", partition=0)
        clock.advance(0.099)
        producer.send(b"b", partition=1)
        producer.send(b"c", partition=1)
        assert producer.messages_sent == 1
        clock.advance(0.001)
        producer.send(b"d", partition=0)  # partition 0's batch has lingered: it goes, with 1's
        assert producer.messages_sent == 5
        assert sent == ["MultiProduceRequest"]
        assert producer.flush() == [ProduceAck(0, 0, 2), ProduceAck(1, 0, 2)]


def test_producing_to_a_missing_topic_or_partition_is_unknown_topic_or_partition(
    broker: RunningBroker, topic: str
) -> None:
    with Producer(broker.endpoint, topic) as producer, pytest.raises(BrokerError) as raised:
        producer.send(b"lost")
    assert raised.value.name == "UNKNOWN_TOPIC_OR_PARTITION"
    create(broker, topic, partitions=2)
    with Producer(broker.endpoint, topic) as producer, pytest.raises(BrokerError) as raised:
        producer.send(b"lost", partition=2)
    assert raised.value.name == "UNKNOWN_TOPIC_OR_PARTITION"


def test_with_no_room_in_flight_a_lingered_batch_keeps_filling_instead_of_waiting(
    pylogd: RunningBroker, topic: str
) -> None:
    # max_in_flight requests await replies (the worker is stopped: none comes). A batch whose
    # linger has passed goes on taking messages, and send() returns at once; it went and
    # waited for room before (here, for the stopped worker: timeout after timeout).
    create(pylogd, topic)
    clock = FakeClock()
    (worker,) = [pid for pid in pylogd.worker_pids() if worker_holds(pylogd, pid, topic)]
    with Producer(
        pylogd.endpoint, topic, ack=Ack.FLUSHED, linger_ms=100, max_in_flight=1, clock=clock
    ) as producer:
        producer.send(b"warm up").result(timeout=10)
        os.kill(worker, signal.SIGSTOP)
        try:
            producer.send(b"first")
            clock.advance(0.1)
            producer.send(b"second")  # lingered: sent, the one request allowed in flight
            assert (producer.messages_sent, producer.in_flight) == (3, 1)
            clock.advance(0.1)
            started = time.monotonic()
            for i in range(10):
                producer.send(b"more %d" % i)  # lingered, but no room: the batch fills
            assert time.monotonic() - started < 1.0
            assert (producer.messages_sent, producer.in_flight) == (3, 1)
        finally:
            os.kill(worker, signal.SIGCONT)
        acks = producer.flush()
    assert [ack.count for ack in acks] == [1, 2, 10]
    assert [m.value for m in read_all(pylogd, topic)][-10:] == [b"more %d" % i for i in range(10)]


def worker_holds(broker: RunningBroker, pid: int, topic: str) -> bool:
    """Whether worker `pid` holds partition 0 of `topic`: its log dir holds the folder."""
    index = int(Path(f"/proc/{pid}/comm").read_text().strip().rsplit("-", 1)[1])
    return (broker.data_dir.parent / ("logs-a", "logs-b")[index] / f"{topic}-0").is_dir()


def test_no_send_is_lost_while_the_worker_is_killed_again_and_again(
    make_pylogd: Callable[..., RunningBroker], topic: str
) -> None:
    """Each kill comes once the worker restarted after the previous one has served the
    producer: the supervisor's restart back-off grows with each, and every batch must still
    be acknowledged within the producer's default retry budget (today 52 of 1,150 sends
    failed: the back-off reached 30 s, the producer gave up after ~3 s)."""
    broker = make_pylogd("--log-flush-interval-ms", "50")
    create(broker, topic)
    values = []
    acked = 0
    with Producer(broker.endpoint, topic, ack=Ack.FLUSHED, timeout_s=2) as producer:
        for kill in range(8):
            (worker,) = broker.worker_pids()
            os.kill(worker, signal.SIGKILL)
            for n in range(10):  # one at a time, the first while the worker is down
                values.append(b"kill %d message %d" % (kill, n))
                producer.send(values[-1])
                acked += sum(ack.count for ack in producer.flush())
            assert broker.worker_pids() != [worker]  # served again: restarted
    assert acked == len(values) == 80
    stored = {message.value for message in read_all(broker, topic)}
    assert stored >= set(values)  # at least once: a batch resent after a lost reply may repeat
    assert broker.log_tail(300).count("exited with -9") == 8


def test_a_batch_is_retried_for_its_delivery_timeout_then_its_error_is_raised(
    make_pylogd: Callable[..., RunningBroker], topic: str, tmp_path: Path
) -> None:
    one, two = (
        make_pylogd(
            "--broker-id", str(i), "--broker-log-dirs", str(tmp_path / f"logs-{i}"), name=f"b{i}"
        )
        for i in (1, 2)
    )
    with Admin(one.endpoint) as admin:
        admin.create_topic(topic, 2)  # partition 1 on broker 2
        two.kill()

        def unavailable() -> set[int]:
            (info,) = admin.metadata([topic]).topics
            return {p.partition for p in info.partitions if p.error_code != ErrorCode.NONE}

        wait_until(lambda: unavailable() == {1}, what="broker 2's partition to go")
    with (
        Producer(one.endpoint, topic, delivery_timeout_s=8) as producer,
        pytest.raises(BrokerError) as refused,
    ):
        started = time.monotonic()
        producer.send(b"for broker 2", partition=1)
        producer.flush()
    seconds = time.monotonic() - started
    assert refused.value.code == ErrorCode.PARTITION_UNAVAILABLE
    # retried 0.1 s doubling to 2 s apart while 8 s last: 7 times, over 7.1 s
    assert 8 - MAX_RETRY_BACKOFF_S <= seconds <= 8 + 1
