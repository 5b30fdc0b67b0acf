"""PartitionConsumer against a real pylogd: where it starts, seek, large messages, long polls."""

from __future__ import annotations

import datetime
import threading
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from broker.client import Ack, Admin, PartitionConsumer, Producer
from broker.client.consumer import Start
from broker.errors import BrokerError, CorruptSegment
from broker.log.message import Message, encode_message
from cli.pylogctl import cli
from tests.conftest import reply_waiting
from tests.pylogd import RunningBroker

T0 = 1_700_000_000_000


def produce(broker: RunningBroker, topic: str, *values: bytes, t0: int = T0) -> int:
    """Produce `values` with timestamps t0, t0 + 1000, ...; the high watermark after them."""
    with Producer(broker.endpoint, topic, ack=Ack.FLUSHED) as producer:
        for i, value in enumerate(values):
            producer.send(value, timestamp_ms=t0 + 1000 * i)
        acks = producer.flush()
    return acks[-1].base_offset + sum(len(encode_message(v)) for v in values[-acks[-1].count :])


def values(messages: list[Message]) -> list[bytes]:
    return [message.value for message in messages]


def test_a_consumer_starts_at_earliest_latest_an_offset_or_a_time_and_can_seek(
    broker: RunningBroker, topic: str
) -> None:
    with Admin(broker.endpoint) as admin:
        admin.create_topic(topic)
    end = produce(broker, topic, b"m0", b"m1", b"m2", b"m3")
    size = len(encode_message(b"m0"))
    assert end == 4 * size

    def read(start: Start) -> list[bytes]:
        with PartitionConsumer(broker.endpoint, topic, start=start, stop_at_end=True) as c:
            return values(list(c))

    assert read("earliest") == [b"m0", b"m1", b"m2", b"m3"]
    assert read("latest") == []
    assert read(2 * size) == [b"m2", b"m3"]
    at_t2 = datetime.datetime.fromtimestamp((T0 + 2000) / 1000, datetime.UTC)
    assert read(at_t2) == [b"m2", b"m3"]
    assert read(at_t2 - datetime.timedelta(milliseconds=1)) == [b"m2", b"m3"]
    assert read(at_t2 + datetime.timedelta(milliseconds=1)) == [b"m3"]

    with PartitionConsumer(broker.endpoint, topic, start="latest", max_wait_ms=0) as consumer:
        assert consumer.position == end
        assert consumer.poll() == [] and consumer.at_end
        consumer.seek(size)
        polled = consumer.poll()
        assert values(polled) == [b"m1", b"m2", b"m3"]
        assert [m.offset for m in polled] == [size, 2 * size, 3 * size]
        assert consumer.position == end and consumer.high_watermark == end
        consumer.seek(size + 1)
        with pytest.raises(BrokerError) as raised:
            consumer.poll()
        assert raised.value.name == "INVALID_OFFSET"
        consumer.seek(end + size)
        with pytest.raises(BrokerError) as raised:
            consumer.poll()
        assert raised.value.name == "OFFSET_OUT_OF_RANGE"


def test_a_message_larger_than_the_fetch_size_is_read_by_growing_the_fetch_size(
    broker: RunningBroker, topic: str
) -> None:
    with Admin(broker.endpoint) as admin:
        admin.create_topic(topic)
    big = bytes(range(256)) * 1000  # 256 000 bytes
    produce(broker, topic, b"small", big, b"after")
    with PartitionConsumer(broker.endpoint, topic, fetch_bytes=1000, stop_at_end=True) as c:
        assert values(list(c)) == [b"small", big, b"after"]
        assert 256_000 < c.fetch_bytes <= 512_000
    with (
        PartitionConsumer(broker.endpoint, topic, fetch_bytes=1000, max_fetch_bytes=4000) as c,
        pytest.raises(BrokerError) as raised,
    ):
        c.seek(len(encode_message(b"small")))
        c.poll()
    assert raised.value.name == "FETCH_SIZE_TOO_SMALL"


def test_a_long_poll_returns_as_soon_as_a_message_arrives(
    broker: RunningBroker, topic: str
) -> None:
    with Admin(broker.endpoint) as admin:
        admin.create_topic(topic)
    polled: list[Message] = []
    with PartitionConsumer(broker.endpoint, topic, start="latest", max_wait_ms=30_000) as c:
        started = time.monotonic()
        poller = threading.Thread(target=lambda: polled.extend(c.poll()))
        poller.start()
        produce(broker, topic, b"wake up")
        poller.join(timeout=20)
        elapsed = time.monotonic() - started
    assert values(polled) == [b"wake up"]
    assert elapsed < 10  # far below max_wait_ms: the reply came with the flush, not the timeout


def test_an_empty_partition_read_to_its_end_yields_nothing_at_once(
    broker: RunningBroker, topic: str
) -> None:
    with Admin(broker.endpoint) as admin:
        admin.create_topic(topic)
    started = time.monotonic()
    with PartitionConsumer(broker.endpoint, topic, max_wait_ms=30_000, stop_at_end=True) as c:
        assert list(c) == []
    assert time.monotonic() - started < 10


def test_the_next_fetch_is_on_its_way_while_a_poll_decodes_and_a_seek_leaves_it_unused(
    broker: RunningBroker, topic: str
) -> None:
    with Admin(broker.endpoint) as admin:
        admin.create_topic(topic)
    names = [b"m%d" % i for i in range(5)]
    produce(broker, topic, *names)
    size = len(encode_message(b"m0"))
    with PartitionConsumer(broker.endpoint, topic, fetch_bytes=size, max_wait_ms=0) as consumer:
        assert values(consumer.poll()) == [b"m0"]
        # More is stored past it: the fetch of m1 was sent before m0 was decoded.
        assert reply_waiting(consumer.connection, 5)
        assert values(consumer.poll()) == [b"m1"]
        consumer.seek(0)  # the fetch sent ahead (of m2) is not for this position
        assert values(consumer.poll()) == [b"m0"]
        rest = [consumer.poll() for _ in range(4)]
        assert [values(batch) for batch in rest] == [[b"m1"], [b"m2"], [b"m3"], [b"m4"]]
        assert [batch[0].offset for batch in rest] == [size, 2 * size, 3 * size, 4 * size]
        assert consumer.at_end
        assert not reply_waiting(consumer.connection, 0.1)  # nothing sent past the end


# -- damaged data on the broker's disk (issue 11) --------------------------------------------

TEN = [b"value-%d" % i for i in range(10)]
SIZE = len(encode_message(TEN[0]))


def first_segment(broker: RunningBroker, topic: str) -> Path:
    """The first segment file of partition 0 of `topic`, in whichever log dir holds it."""
    (folder,) = broker.data_dir.parent.glob(f"logs-*/{topic}-0")
    return folder / f"{0:020d}.log"


def flip_value_byte(segment: Path, message: int) -> None:
    """Flip the last byte of the value of the `message`-th message of TEN: framing intact."""
    with open(segment, "r+b") as f:
        f.seek((message + 1) * SIZE - 1)
        byte = f.read(1)
        f.seek((message + 1) * SIZE - 1)
        f.write(bytes([byte[0] ^ 0x01]))


def read_until_error(consumer: PartitionConsumer) -> tuple[list[bytes], CorruptSegment]:
    got: list[bytes] = []
    with pytest.raises(CorruptSegment) as raised:
        for message in consumer:
            got.append(message.value)
    return got, raised.value


def test_a_damaged_message_served_as_stored_is_a_clear_error_and_skip_corrupt_reads_past_it(
    broker: RunningBroker, topic: str
) -> None:
    with Admin(broker.endpoint) as admin:
        admin.create_topic(topic)
    produce(broker, topic, *TEN)
    flip_value_byte(first_segment(broker, topic), 4)  # not known to the broker: served as is
    with PartitionConsumer(broker.endpoint, topic, stop_at_end=True) as consumer:
        got, error = read_until_error(consumer)
        assert got == TEN[:4]
        assert (error.partition, error.start, error.end) == (f"{topic}-0", 4 * SIZE, 5 * SIZE)
        assert str(error).endswith(f"fetch from offset {5 * SIZE} to skip them")
        assert consumer.position == 4 * SIZE
        with pytest.raises(CorruptSegment):  # the same error again, not a different one
            consumer.poll()
        consumer.seek(error.end)
        assert values(list(consumer)) == TEN[5:]
    with PartitionConsumer(broker.endpoint, topic, stop_at_end=True, skip_corrupt=True) as c:
        assert values(list(c)) == TEN[:4] + TEN[5:]
        assert c.skipped == [(4 * SIZE, 5 * SIZE)]


def test_pylogctl_consume_names_damaged_data_and_skips_it_with_skip_corrupt(
    broker: RunningBroker, topic: str
) -> None:
    with Admin(broker.endpoint) as admin:
        admin.create_topic(topic)
    produce(broker, topic, *TEN)
    flip_value_byte(first_segment(broker, topic), 7)
    runner = CliRunner()
    env = {"PYLOG_BROKER": broker.endpoint}
    failed = runner.invoke(cli, ["consume", topic], env=env)
    assert failed.exit_code == 1
    assert failed.stdout.splitlines() == [v.decode() for v in TEN[:7]]
    assert f"offsets [{7 * SIZE}, {8 * SIZE}) are damaged" in failed.stderr
    assert "--skip-corrupt" in failed.stderr
    skipped = runner.invoke(cli, ["consume", topic, "--skip-corrupt"], env=env)
    assert skipped.exit_code == 0, skipped.output
    assert skipped.stdout.splitlines() == [v.decode() for v in TEN[:7] + TEN[8:]]
    assert f"skipped damaged offsets [{7 * SIZE}, {8 * SIZE})" in skipped.stderr


def test_a_damaged_message_found_by_recovery_is_answered_corrupt_segment_and_skippable(
    pylogd: RunningBroker, topic: str
) -> None:
    with Admin(pylogd.endpoint) as admin:
        admin.create_topic(topic)
    produce(pylogd, topic, *TEN)
    assert pylogd.stop() == 0
    flip_value_byte(first_segment(pylogd, topic), 2)  # the newest segment: scanned on start
    broker = pylogd.restarted()
    try:
        assert f"offsets [{2 * SIZE}, {3 * SIZE}) damaged, kept in place" in broker.log_tail(200)
        with PartitionConsumer(broker.endpoint, topic, stop_at_end=True) as consumer:
            got, error = read_until_error(consumer)
            assert got == TEN[:2]
            assert isinstance(error.__cause__, BrokerError)
            assert error.__cause__.name == "CORRUPT_SEGMENT"
            assert (error.start, error.end) == (2 * SIZE, 3 * SIZE)
        with PartitionConsumer(broker.endpoint, topic, stop_at_end=True, skip_corrupt=True) as c:
            assert values(list(c)) == TEN[:2] + TEN[3:]
            assert c.skipped == [(2 * SIZE, 3 * SIZE)]
        produce(broker, topic, b"after")  # appended after the damage, at a new offset
        with PartitionConsumer(broker.endpoint, topic, start=10 * SIZE, stop_at_end=True) as c:
            assert values(list(c)) == [b"after"]
    finally:
        broker.stop()
