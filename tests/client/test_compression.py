"""Compressed sets end to end on a real broker: producers (sync and asyncio) that compress,
consumers that read them as plain messages, a log that mixes plain messages and sets read
whole by a new reader, and an old reader (FETCH version 1) served up to the first set and
told UNSUPPORTED_FORMAT there."""

from __future__ import annotations

import asyncio

import pytest
from click.testing import CliRunner

from broker.aio import AsyncPartitionConsumer, AsyncProducer
from broker.client import Ack, Admin, Connection, PartitionConsumer, Producer
from broker.client.topic_consumer import Last, TopicConsumer
from broker.errors import BrokerError, UnsupportedFormat
from broker.log import codec
from broker.log import compression as log_compression
from broker.log.message import Message, iter_messages
from broker.protocol import LATEST, ErrorCode, FetchRequest, OffsetsRequest
from cli.pylogctl import cli
from tests.conftest import wait_until
from tests.pylogd import RunningBroker


def read_all(broker: RunningBroker, topic: str) -> list[Message]:
    with PartitionConsumer(broker.endpoint, topic, 0, stop_at_end=True) as consumer:
        return list(consumer)


@pytest.mark.parametrize("compression", ["gzip", "lz4", "zstd"])
def test_a_compressing_producer_is_read_back_whole_in_order(
    broker: RunningBroker, topic: str, compression: str
) -> None:
    with Admin(broker.endpoint) as admin:
        admin.create_topic(topic)
    sent = [(None if i % 3 else b"k%d" % i, b"line %d " % i * 20) for i in range(23)]
    with Producer(
        broker.endpoint, topic, ack=Ack.FLUSHED, batch_messages=10, compression=compression
    ) as producer:
        deliveries = [producer.send(value, key=key) for key, value in sent]
        acks = producer.flush()
    assert [a.count for a in acks] == [10, 10, 3]  # each set counted by what it holds
    assert acks[0].base_offset == 0
    offsets = [d.result() for d in deliveries]
    assert offsets == [acks[i // 10].base_offset for i in range(23)]  # a message: its set's
    read = read_all(broker, topic)
    assert [(m.key, m.value) for m in read] == sent
    assert [m.offset for m in read] == offsets
    ends = [m.next_offset for m in read]
    assert ends[9] == ends[10] == acks[1].base_offset  # the last of a set ends it; the rest: 0
    assert read[-1].next_offset < sum(len(v) + 30 for _, v in sent) // 3  # compressed on disk


def test_a_set_holds_at_most_max_set_messages_and_readers_stop_within_their_budget(
    broker: RunningBroker, topic: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 50, 5: a reader expanded every set of a fetch at once (4 sets of 2.5 million
    empty messages, 23 KB on the wire: 1.5 GiB). A producer's set holds at most
    MAX_SET_MESSAGES (the broker refuses more; pylog's producer and the broker's conversion
    make no more: tests/log/test_compression.py), and a reader stops expanding at a set's
    start once it holds READ_MESSAGES: the rest comes with the next fetch, each message read
    once (here with 4 and 5, in this process: the producer's and the reader's)."""
    monkeypatch.setattr(log_compression, "MAX_SET_MESSAGES", 4)
    monkeypatch.setattr(codec, "READ_MESSAGES", 5)
    with Admin(broker.endpoint) as admin:
        admin.create_topic(topic)
    with Producer(
        broker.endpoint, topic, ack=Ack.FLUSHED, batch_messages=10, compression="zstd"
    ) as producer:
        for i in range(30):
            producer.send(b"m%d" % i)
        acks = producer.flush()
    assert [a.count for a in acks] == [10, 10, 10]
    with PartitionConsumer(broker.endpoint, topic, 0, stop_at_end=True) as consumer:
        polls = [[m.value for m in consumer.poll()] for _ in range(6)]
    # 3 batches of 10: sets of 4, 4 and 2 each; a poll stops past 5 messages, at a set's start
    assert [len(p) for p in polls] == [8, 6, 6, 8, 2, 0]
    assert [value for poll in polls for value in poll] == [b"m%d" % i for i in range(30)]
    assert [m.value for m in read_all(broker, topic)] == [b"m%d" % i for i in range(30)]


def test_an_old_reader_is_served_up_to_the_first_set_and_a_new_one_reads_all(
    broker: RunningBroker, topic: str
) -> None:
    """A mixed log: plain messages, then compressed sets, then plain again, in one segment."""
    with Admin(broker.endpoint) as admin:
        admin.create_topic(topic)
    for compression, first in (("none", 0), ("zstd", 5), ("none", 10)):
        with Producer(
            broker.endpoint, topic, batch_messages=5, compression=compression
        ) as producer:
            for i in range(first, first + 5):
                producer.send(b"message %d" % i)
    read = read_all(broker, topic)
    assert [m.value for m in read] == [b"message %d" % i for i in range(15)]
    first_set = read[5].offset
    with Connection(broker.endpoint) as connection:
        old = connection.call(FetchRequest(topic, 0, 0, 1 << 20, 0, 0), version=1)
        assert len(old.message_set) == first_set
        assert [m.value for m in iter_messages(old.message_set)][-1] == b"message 4"
        for offset in (first_set, read[-1].offset):
            with pytest.raises(BrokerError) as refused:
                connection.call(FetchRequest(topic, 0, offset, 1 << 20, 0, 0), version=2)
            assert refused.value.code == ErrorCode.UNSUPPORTED_FORMAT
            assert isinstance(refused.value, UnsupportedFormat)
            assert f"from offset {first_set} on" in refused.value.message
        new = connection.call(FetchRequest(topic, 0, 0, 1 << 20, 0, 0))
        assert len(new.message_set) == read[-1].next_offset


def test_the_asyncio_producer_and_consumer_compress_and_expand(
    broker: RunningBroker, topic: str
) -> None:
    with Admin(broker.endpoint) as admin:
        admin.create_topic(topic)

    async def run() -> list[bytes]:
        async with AsyncProducer(
            broker.endpoint, topic, batch_messages=4, compression="lz4", compression_level=9
        ) as producer:
            deliveries = [await producer.send(b"async %d" % i) for i in range(9)]
            await producer.flush()
            offsets = [await d for d in deliveries]
        assert len(set(offsets)) == 3
        async with AsyncPartitionConsumer(broker.endpoint, topic, 0, stop_at_end=True) as consumer:
            return [m.value async for m in consumer]

    assert asyncio.run(run()) == [b"async %d" % i for i in range(9)]


def test_a_bad_compression_setting_is_refused_before_anything_is_sent(
    broker: RunningBroker, topic: str
) -> None:
    with pytest.raises(ValueError, match="unknown compression 'snappy'"):
        Producer(broker.endpoint, topic, compression="snappy")
    with pytest.raises(ValueError, match="zstd takes levels -7 to 22, not 40"):
        Producer(broker.endpoint, topic, compression="zstd", compression_level=40)
    with pytest.raises(ValueError, match="a compression level is for a compression other"):
        AsyncProducer(broker.endpoint, topic, compression_level=3)


def test_a_batch_over_the_bound_of_a_set_goes_as_several_sets(
    broker: RunningBroker, topic: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the bound made small: a batch that holds more goes as several sets in one
    request, each message at its own set's offset; a message over the bound alone goes
    plain (its checksum computed)."""
    monkeypatch.setattr(codec, "MAX_INNER_SET_BYTES", 500)
    with Admin(broker.endpoint) as admin:
        admin.create_topic(topic)
    values = [b"v%03d" % i + b"." * 90 for i in range(10)] + [b"big" * 300]
    with Producer(
        broker.endpoint, topic, batch_messages=len(values), compression="zstd"
    ) as producer:
        deliveries = [producer.send(value) for value in values]
        (ack,) = producer.flush()
    assert ack.count == len(values)
    offsets = [d.result() for d in deliveries]
    read = read_all(broker, topic)
    assert [m.value for m in read] == values
    assert [m.offset for m in read] == offsets
    assert offsets[0] == ack.base_offset and len(set(offsets)) == 4  # 4 + 4 + 2 + the big one
    assert read[-1].size == len(values[-1]) + 26  # plain: a message of its own size


@pytest.mark.parametrize("codec", ["gzip", "lz4", "zstd"])  # every codec docs/storage.md lists
def test_a_topic_whose_compression_is_a_codec_stores_a_plain_producers_sets_compressed(
    broker: RunningBroker, topic: str, codec: str
) -> None:
    """The topic setting, set at creation and altered live: a producer that does not
    compress is stored compressed, its acks and offsets those of what was stored."""
    with Admin(broker.endpoint) as admin:
        admin.create_topic(topic, 1, {"compression": codec})
        entries = {e.key: (e.value, e.overridden) for e in admin.topic_config(topic)}
        assert entries["compression"] == (codec, True)
    with Producer(broker.endpoint, topic, batch_messages=10) as producer:
        deliveries = [producer.send(b"line %d " % i * 20) for i in range(20)]
        acks = producer.flush()
    assert [a.count for a in acks] == [10, 10]
    read = read_all(broker, topic)
    assert [m.value for m in read] == [b"line %d " % i * 20 for i in range(20)]
    assert [m.offset for m in read] == [a.base_offset for a in acks for _ in range(10)]
    assert read[-1].next_offset < sum(len(m.value) + 26 for m in read) // 4
    assert deliveries[0].result() == 0
    with Connection(broker.endpoint) as connection, pytest.raises(UnsupportedFormat):
        connection.call(FetchRequest(topic, 0, 0, 1 << 20, 0, 0), version=1)
    with Admin(broker.endpoint) as admin:
        admin.alter_topic_config(topic, {"compression": "none"})
        wait_until(
            lambda: admin.describe_partition(topic, 0).config["compression"] == "none",
            what="compression none in effect",
        )
    with Producer(broker.endpoint, topic) as producer:
        producer.send(b"after")
    last = read_all(broker, topic)[-1]
    assert (last.value, last.size, last.offset) == (b"after", 26 + 5, read[-1].next_offset)


def test_the_last_n_messages_of_a_compressed_topic_are_n_messages(
    broker: RunningBroker, topic: str
) -> None:
    """`pylogctl consume --from -N` (TopicConsumer's Last): inside a set, its messages before
    the n-th from the end are passed over."""
    with Admin(broker.endpoint) as admin:
        admin.create_topic(topic)
    with Producer(broker.endpoint, topic, batch_messages=10, compression="lz4") as producer:
        for i in range(25):
            producer.send(b"m%d" % i)
    for count, first in ((3, 22), (10, 15), (15, 10), (25, 0), (40, 0)):
        with TopicConsumer(broker.endpoint, topic, start=Last(count)) as consumer:
            values = [record.value for record in consumer]
        assert values == [b"m%d" % i for i in range(first, 25)], count


@pytest.mark.parametrize("compression", ["gzip", "lz4", "zstd"])
def test_pylogctl_produce_compresses_and_consume_reads_back(
    broker: RunningBroker, topic: str, compression: str
) -> None:
    env = {"PYLOG_BROKER": broker.endpoint}
    runner = CliRunner()
    assert runner.invoke(cli, ["topic", "create", topic], env=env).exit_code == 0
    lines = "".join(f"GET /products/{i} HTTP/1.1 200\n" for i in range(300))
    sent = runner.invoke(
        cli, ["produce", topic, "--compression", compression], input=lines, env=env
    )
    assert sent.exit_code == 0, sent.output
    read = runner.invoke(cli, ["consume", topic], env=env)
    assert read.output == lines
    with Connection(broker.endpoint) as connection:
        stored = connection.call(OffsetsRequest(topic, 0, LATEST)).offset
    assert stored < len(lines) // 2  # 300 plain messages would be 300 x 26 bytes more
    level = runner.invoke(
        cli,
        ["produce", topic, "--compression", compression, "--compression-level", "99"],
        input="x\n",
        env=env,
    )
    assert level.exit_code == 2 and "takes levels" in level.output
