"""The client in confluent-kafka-python's shape (broker.client.kafka) against a real broker: a
program written for confluent-kafka runs with only its import changed, and each call Kafka
users lean on behaves as there (poll's timeout in seconds, commits of a message or offsets,
seek, position, deserializers, group members that need only a broker's address)."""

from __future__ import annotations

import contextlib
import gc
import logging
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from broker.client import Admin, PartitionConsumer
from broker.client.kafka import (
    OFFSET_BEGINNING,
    OFFSET_END,
    OFFSET_INVALID,
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    Producer,
    TopicPartition,
)
from tests.conftest import reply_waiting
from tests.pylogd import RunningBroker

CONFLUENT_IMPORT = "from confluent_kafka import Consumer, KafkaError, KafkaException, Producer"
PYLOG_IMPORT = "from broker.client.kafka import Consumer, KafkaError, KafkaException, Producer"

PROGRAM = f"""
import sys

{CONFLUENT_IMPORT}

bootstrap, topic, group, count = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
delivered, failed = [], []


def on_delivery(err, msg):
    if err is not None:
        failed.append(err)
    else:
        delivered.append((msg.topic(), msg.partition(), msg.offset()))


producer = Producer({{
    "bootstrap.servers": bootstrap,
    "client.id": "kafka-program",
    "acks": "all",
    "linger.ms": 5,
    "compression.type": "lz4",
}})
for i in range(count):
    producer.produce(topic, value=f"message {{i}}", key=str(i % 7), on_delivery=on_delivery,
                     headers={{"n": str(i)}})
    producer.poll(0)
remaining = producer.flush(30)
print("produced", len(delivered), "failed", len(failed), "remaining", remaining, flush=True)

consumer = Consumer({{
    "bootstrap.servers": bootstrap,
    "group.id": group,
    "auto.offset.reset": "earliest",
    "enable.auto.commit": False,
}})
consumer.subscribe([topic])
seen = set()
try:
    while len(seen) < count:
        msg = consumer.poll(timeout=1.0)
        if msg is None:
            continue
        if msg.error():
            if msg.error().code() == KafkaError._PARTITION_EOF:
                continue
            raise KafkaException(msg.error())
        assert msg.headers() == [("n", msg.value().decode().split()[1].encode())]
        seen.add(msg.value().decode())
        if len(seen) % 100 == 0:
            consumer.commit(asynchronous=False)
    consumer.commit(asynchronous=False)
finally:
    consumer.close()
print("consumed", len(seen), flush=True)

producer.produce(topic, value="after the commit", key="0")
producer.flush()
consumer = Consumer({{"bootstrap.servers": bootstrap, "group.id": group,
                      "auto.offset.reset": "earliest"}})
consumer.subscribe([topic])
try:
    msg = None
    while msg is None:
        msg = consumer.poll(1.0)
    print("next", msg.value().decode(), flush=True)
finally:
    consumer.close()
"""


def test_a_confluent_kafka_program_runs_with_only_its_import_changed(
    broker: RunningBroker, topic: str, tmp_path: Path
) -> None:
    with Admin(broker.endpoint) as admin:
        admin.create_topic(topic, partitions=3)
    program = PROGRAM.replace(CONFLUENT_IMPORT, PYLOG_IMPORT)
    changed = [
        (old, new)
        for old, new in zip(PROGRAM.splitlines(), program.splitlines(), strict=True)
        if old != new
    ]
    assert changed == [(CONFLUENT_IMPORT, PYLOG_IMPORT)]
    script = tmp_path / "kafka_program.py"
    script.write_text(program)
    address = broker.endpoint.removeprefix("tcp://")
    done = subprocess.run(
        [sys.executable, str(script), address, topic, "program-readers", "500"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=Path(__file__).parents[2],
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "produced 500 failed 0 remaining 0",
        "consumed 500",
        "next after the commit",
    ]


@pytest.fixture
def kafka_topic(broker: RunningBroker, topic: str) -> str:
    with Admin(broker.endpoint) as admin:
        admin.create_topic(topic, partitions=2)
    return topic


def bootstrap(broker: RunningBroker) -> dict[str, Any]:
    return {"bootstrap.servers": broker.endpoint.removeprefix("tcp://")}


def produce(broker: RunningBroker, topic: str, values: list[str], partition: int = 0) -> list[int]:
    """Produce `values` to `partition`; their offsets, from the delivery callbacks."""
    offsets: list[int] = []
    errors: list[KafkaError] = []

    def report(err: KafkaError | None, msg: Message) -> None:
        if err is None:
            offsets.append(msg.offset())
        else:
            errors.append(err)

    producer = Producer({**bootstrap(broker), "on_delivery": report})
    for value in values:
        producer.produce(topic, value, partition=partition)
    assert producer.flush(30) == 0
    assert len(producer) == 0
    producer.close()
    assert errors == []
    return sorted(offsets)


def test_delivery_callbacks_run_in_poll_with_each_offset(
    broker: RunningBroker, kafka_topic: str
) -> None:
    reports: list[tuple[str, int, int, bytes]] = []
    # acks all: what is acknowledged is flushed, so visible to the consumer below (acks 1 is
    # an ack of the write: a consumer stopping at the high watermark could read it or not)
    producer = Producer(
        {**bootstrap(broker), "linger.ms": 0, "acks": "all", "batch.num.messages": 1}
    )
    for i in range(5):
        producer.produce(
            kafka_topic,
            b"v%d" % i,
            partition=1,
            callback=lambda err, msg: reports.append(
                (msg.topic(), msg.partition(), msg.offset(), msg.value())
            ),
        )
    deadline = time.monotonic() + 30
    while len(reports) < 5 and time.monotonic() < deadline:  # bounded: five acks
        producer.poll(1.0)
    producer.close()
    assert [r[3] for r in reports] == [b"v%d" % i for i in range(5)]
    with PartitionConsumer(broker.endpoint, kafka_topic, 1, stop_at_end=True) as consumer:
        stored = [(m.offset, m.value) for m in consumer]
    assert [(r[2], r[3]) for r in reports] == stored


def test_a_delivery_callback_may_produce_again_and_each_partition_reports_in_order(
    broker: RunningBroker, kafka_topic: str
) -> None:
    # A callback that produces (a follow-up message, as programs do) while reports run, to a
    # partition the producer had not sent to: its report comes too, in its order.
    reports: list[tuple[int, bytes]] = []
    producer = Producer({**bootstrap(broker), "linger.ms": 0, "acks": "all"})

    def report(err: KafkaError | None, msg: Message) -> None:
        assert err is None, err
        reports.append((msg.partition(), msg.value()))
        if msg.partition() == 0:
            follow_up = b"then" + msg.value()[5:]
            producer.produce(kafka_topic, follow_up, partition=1, on_delivery=report)

    for i in range(5):
        producer.produce(kafka_topic, b"first%d" % i, partition=0, on_delivery=report)
    deadline = time.monotonic() + 30
    while len(reports) < 10 and time.monotonic() < deadline:  # bounded: ten acks
        producer.poll(1.0)
    assert producer.flush(30) == 0
    producer.close()
    assert [v for p, v in reports if p == 0] == [b"first%d" % i for i in range(5)]
    assert [v for p, v in reports if p == 1] == [b"then%d" % i for i in range(5)]


def test_messages_awaiting_their_report_hold_no_object_of_their_own(
    broker: RunningBroker, kafka_topic: str
) -> None:
    # A message waiting for its delivery report is kept as references in its batch's record,
    # not as an object of its own that the garbage collector tracks: with one each, a producer
    # over 100 partitions (more messages waiting their acks) spent a tenth of its time in
    # collections that walked them all (perf/README.md, "Keyed traffic over many partitions").
    producer = Producer({**bootstrap(broker), "linger.ms": 60_000, "batch.num.messages": 10_000})
    producer.produce(kafka_topic, b"first", partition=0, on_delivery=on_delivery_ignored)
    gc.collect()
    before = len(gc.get_objects())
    for i in range(5_000):
        producer.produce(kafka_topic, b"v%d" % i, partition=i % 2, on_delivery=on_delivery_ignored)
    gc.collect()
    assert len(gc.get_objects()) - before < 100
    assert len(producer) == 5_001
    assert producer.flush(30) == 0
    producer.close()


def on_delivery_ignored(err: KafkaError | None, msg: Message) -> None:
    assert err is None, err


def test_a_callback_that_raises_leaves_the_messages_after_it_to_the_next_poll(
    broker: RunningBroker, kafka_topic: str
) -> None:
    # The exception comes out of poll() (as confluent-kafka's does), and no report is lost
    # with it: the next poll() reports the messages after, in order.
    reported: list[bytes] = []

    def report(err: KafkaError | None, msg: Message) -> None:
        assert err is None, err
        reported.append(msg.value())
        if msg.value() == b"v1":
            raise RuntimeError("the handler failed on v1")

    producer = Producer({**bootstrap(broker), "linger.ms": 60_000, "batch.num.messages": 4})
    for i in range(4):  # one batch, sent full
        producer.produce(kafka_topic, b"v%d" % i, partition=0, on_delivery=report)
    with pytest.raises(RuntimeError, match="on v1"):
        producer.flush(30)
    assert reported == [b"v0", b"v1"] and len(producer) == 2
    assert producer.poll(0) == 2
    assert reported == [b"v0", b"v1", b"v2", b"v3"] and len(producer) == 0
    producer.close()


def test_a_delivery_that_fails_reports_its_error_to_the_callback(
    broker: RunningBroker, topic: str
) -> None:
    with Admin(broker.endpoint) as admin:
        admin.create_topic(topic, config={"max_message_bytes": "1024"})
    reports: list[tuple[KafkaError | None, bytes]] = []
    producer = Producer({**bootstrap(broker), "linger.ms": 0})
    producer.produce(topic, b"x" * 2000, on_delivery=lambda e, m: reports.append((e, m.value())))
    for connection in producer._producers[topic]._requests.connections():  # its refusal, unread:
        assert reply_waiting(connection, 10)
    # the next produce takes it, and leaves it to the callback of the message it failed
    producer.produce(topic, b"small", on_delivery=lambda e, m: reports.append((e, m.value())))
    assert producer.flush(30) == 0
    errors = {len(value): error for error, value in reports}
    assert errors[len(b"small")] is None  # a batch of its own, stored
    error = errors[2000]
    assert error is not None and error.code() == KafkaError.MSG_SIZE_TOO_LARGE
    assert not error.retriable() and "1024" in error.str()
    with pytest.raises(KafkaException) as raised:
        producer.produce("no-such-topic-here", b"x")
    assert raised.value.args[0].code() == KafkaError.UNKNOWN_TOPIC_OR_PART
    producer.close()


def test_poll_waits_its_timeout_in_seconds_and_returns_one_message(
    broker: RunningBroker, kafka_topic: str
) -> None:
    consumer = Consumer({**bootstrap(broker), "group.id": "poll-seconds"})  # reset latest
    consumer.subscribe([kafka_topic])
    try:
        started = time.monotonic()
        assert consumer.poll(1.5) is None
        assert time.monotonic() - started >= 1.4  # seconds, not milliseconds
        assert sorted(tp.partition for tp in consumer.assignment()) == [0, 1]
        produce(broker, kafka_topic, ["one", "two"])
        first = consumer.poll(30)
        second = consumer.poll(30)
        assert first is not None and second is not None
        assert (first.value(), second.value()) == (b"one", b"two")
        assert first.error() is None and first.timestamp()[0] == 1
    finally:
        consumer.close()
    with pytest.raises(RuntimeError):
        consumer.poll(0)


@contextlib.contextmanager
def subscribed(settings: dict[str, Any], topic: str) -> Iterator[Consumer]:
    """A Consumer of `settings` subscribed to `topic`, closed after."""
    consumer = Consumer(settings)
    consumer.subscribe([topic])
    try:
        yield consumer
    finally:
        consumer.close()


def test_commit_of_a_message_or_offsets_and_seek_and_position(
    broker: RunningBroker, kafka_topic: str
) -> None:
    offsets = produce(broker, kafka_topic, [f"m{i}" for i in range(6)])
    settings = {
        **bootstrap(broker),
        "group.id": "commits",
        "auto.offset.reset": "earliest",
        "enable.auto.commit": False,
        "value.deserializer": lambda data: data.decode().upper(),
    }
    with subscribed(settings, kafka_topic) as consumer:
        got = consumer.consume(3, timeout=30)
        assert [m.value() for m in got] == ["M0", "M1", "M2"]
        assert got[1].next_offset() == offsets[2]
        consumer.commit(message=got[1])  # the message after it is read next by the group
        [position] = consumer.position([TopicPartition(kafka_topic, 0)])
        assert position.offset == offsets[2]
        stored = consumer.committed(
            [TopicPartition(kafka_topic, 0), TopicPartition(kafka_topic, 1)], timeout=10
        )
        assert [(tp.partition, tp.offset) for tp in stored] == [
            (0, offsets[2]),
            (1, OFFSET_INVALID),  # none committed
        ]
        consumer.seek(TopicPartition(kafka_topic, 0, offsets[4]))
        [again] = consumer.consume(1, timeout=30)
        assert (again.value(), again.offset()) == ("M4", offsets[4])
        with pytest.raises(KafkaException, match="not assigned"):
            consumer.seek(TopicPartition(kafka_topic, 7, 0))
    with subscribed(settings, kafka_topic) as consumer:
        [resumed] = consumer.consume(1, timeout=30)
        assert resumed.value() == "M2"  # from the committed message
        committed = consumer.commit(
            offsets=[TopicPartition(kafka_topic, 0, offsets[5])], asynchronous=False
        )
        assert committed == [TopicPartition(kafka_topic, 0)]
    with subscribed(settings, kafka_topic) as consumer:
        [last] = consumer.consume(1, timeout=30)
        assert last.value() == "M5"
        assert consumer.position([TopicPartition("elsewhere", 0)])[0].offset == OFFSET_INVALID


def test_keyword_settings_with_blocks_and_logical_offsets_as_confluents_examples_use_them(
    broker: RunningBroker, kafka_topic: str
) -> None:
    """Issue 52: `Producer(**conf)` failed (a positional `conf` was required), neither client
    was a context manager, and there was no OFFSET_BEGINNING or OFFSET_END to seek to."""
    conf = bootstrap(broker)
    with Producer(**conf) as producer:
        for number in range(3):
            producer.produce(kafka_topic, value=f"v{number}".encode(), partition=0)
    # the with block flushed: all three are stored
    settings = {**conf, "group.id": "shapes", "auto.offset.reset": "earliest"}
    with Consumer(**settings) as consumer:
        consumer.subscribe([kafka_topic])
        got = consumer.consume(3, timeout=30)
        assert [m.value() for m in got] == [b"v0", b"v1", b"v2"]
        consumer.seek(TopicPartition(kafka_topic, 0, OFFSET_BEGINNING))
        [first] = consumer.consume(1, timeout=30)
        assert first.value() == b"v0"
        consumer.seek(TopicPartition(kafka_topic, 0, OFFSET_END))
        [end] = consumer.position([TopicPartition(kafka_topic, 0)])
        assert end.offset == got[-1].next_offset()
    with pytest.raises(RuntimeError):  # closed by its with block
        consumer.poll(0)


def test_the_tutorials_reset_assigns_its_partitions_from_the_beginning_in_on_assign(
    broker: RunningBroker, kafka_topic: str
) -> None:
    """Issue 52: the confluent-kafka tutorial's consumer with --reset sets each assigned
    partition's offset to OFFSET_BEGINNING in on_assign and calls assign(partitions): there
    was no assign. A partition the group did not give is refused, naming it."""
    produce(broker, kafka_topic, ["a", "b", "c"])
    settings = {**bootstrap(broker), "group.id": "tutorial", "auto.offset.reset": "earliest"}
    with subscribed(settings, kafka_topic) as consumer:
        assert len(consumer.consume(3, timeout=30)) == 3
        consumer.commit(asynchronous=False)  # the group has read them all

    def reset_offset(consumer: Consumer, partitions: list[TopicPartition]) -> None:
        for p in partitions:
            p.offset = OFFSET_BEGINNING
        consumer.assign(partitions)

    with Consumer(settings) as consumer:
        consumer.subscribe([kafka_topic], on_assign=reset_offset)
        got = consumer.consume(3, timeout=30)
        assert [m.value() for m in got] == [b"a", b"b", b"c"]  # not from the committed end
        with pytest.raises(KafkaException, match=f"{kafka_topic}/7 not given to this member"):
            consumer.assign([TopicPartition(kafka_topic, 7, 0)])


def test_with_auto_offset_store_off_only_stored_offsets_are_committed(
    broker: RunningBroker, kafka_topic: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 52: confluent-kafka's consumer example sets enable.auto.offset.store false, gives
    the Consumer its own `logger`, and calls store_offsets(msg) after each message it
    processed: none of the three was taken."""
    produce(broker, kafka_topic, ["m0", "m1", "m2"])
    logger = logging.getLogger("the-examples-consumer")
    caplog.set_level(logging.INFO, logger.name)
    settings = {
        **bootstrap(broker),
        "group.id": "stores",
        "auto.offset.reset": "earliest",
        "enable.auto.offset.store": False,
        "logger": logger,
    }
    with subscribed(settings, kafka_topic) as consumer:
        got = consumer.consume(3, timeout=30)
        assert [m.value() for m in got] == [b"m0", b"m1", b"m2"]
        consumer.store_offsets(got[0])  # m1 and m2 handed out, not processed
        with pytest.raises(KafkaException, match="not assigned"):
            consumer.store_offsets(offsets=[TopicPartition(kafka_topic, 9, 0)])
    # closed: auto-commit recorded what was stored
    with subscribed(settings, kafka_topic) as consumer:
        [resumed] = consumer.consume(1, timeout=30)
        assert resumed.value() == b"m1"
    assert any(  # the member logs to the logger given: its rebalances, its warnings
        r.name == logger.name and "was given 2 partitions" in r.getMessage() for r in caplog.records
    )


def test_a_paused_partition_is_not_read_until_resumed_and_goes_on_where_it_was(
    broker: RunningBroker, kafka_topic: str
) -> None:
    """Issue 52: no pause or resume."""
    produce(broker, kafka_topic, ["a0", "a1"], partition=0)
    settings = {**bootstrap(broker), "group.id": "pauses", "auto.offset.reset": "earliest"}
    with subscribed(settings, kafka_topic) as consumer:
        [first] = consumer.consume(1, timeout=30)
        paused = TopicPartition(kafka_topic, first.partition())
        consumer.pause([paused])
        other = 1 - first.partition()
        produce(broker, kafka_topic, ["b0"], partition=other)
        got = consumer.consume(1, timeout=30)
        assert [(m.partition(), m.value()) for m in got] == [(other, b"b0")]
        assert consumer.consume(1, timeout=0.5) == []  # the paused one holds more, unread
        consumer.resume([paused])
        [after] = consumer.consume(1, timeout=30)
        assert (after.partition(), after.offset()) == (first.partition(), first.next_offset())
        with pytest.raises(KafkaException, match=f"{kafka_topic}/9 not assigned"):
            consumer.pause([TopicPartition(kafka_topic, 9)])


def test_list_topics_and_watermarks_as_the_get_watermark_offsets_example_uses_them(
    broker: RunningBroker, kafka_topic: str
) -> None:
    """Issue 52: neither client had list_topics, nor the Consumer get_watermark_offsets."""
    offsets = produce(broker, kafka_topic, ["a", "bb"])
    conf = bootstrap(broker)
    with Producer(conf) as producer:
        listed = producer.list_topics(kafka_topic, timeout=10)
    assert set(listed.topics) == {kafka_topic} and len(listed.brokers) == 1
    topic = listed.topics[kafka_topic]
    assert topic.error is None and sorted(topic.partitions) == [0, 1]
    assert all(p.leader in listed.brokers and p.error is None for p in topic.partitions.values())
    with Consumer(conf, **{"group.id": "watermarks"}) as consumer:
        every = consumer.list_topics(timeout=10)
        assert kafka_topic in every.topics
        low, high = consumer.get_watermark_offsets(TopicPartition(kafka_topic, 0), timeout=10)
        assert (low, high) == (0, offsets[-1] + 28)  # bytes: the second message is 28 on disk
        stamps = [TopicPartition(kafka_topic, 0, t) for t in (0, int(time.time() * 1000) + 60_000)]
        assert [tp.offset for tp in consumer.offsets_for_times(stamps, timeout=10)] == [
            0,  # the first message is after time 0
            OFFSET_END,  # none is a minute from now
        ]
        missing = consumer.list_topics("no-such-topic", timeout=10).topics["no-such-topic"]
        assert missing.error is not None and missing.error.name() == "UNKNOWN_TOPIC_OR_PART"


@pytest.mark.parametrize(
    ("settings", "said"),
    [
        ({"group.id": "g", "fetch.min.bytes": 1}, "'fetch.min.bytes': not a pylog consumer"),
        ({}, "group.id"),
        ({"group.id": "g", "auto.offset.reset": "none"}, "auto.offset.reset"),
        ({"group.id": "g", "enable.partition.eof": "sometimes"}, "enable.partition.eof"),
        ({"group.id": "g", "isolation.level": "serializable"}, "isolation.level"),
        ({"group.id": "g", "security.protocol": "SASL_SSL"}, "CurveZMQ"),
    ],
)
def test_consumer_settings_without_a_pylog_meaning_are_refused_by_name(
    settings: dict[str, Any], said: str
) -> None:
    with pytest.raises(KafkaException, match=said) as raised:
        Consumer({"bootstrap.servers": "127.0.0.1:1", **settings})
    assert raised.value.args[0].code() == KafkaError._INVALID_ARG


@pytest.mark.parametrize(
    ("settings", "said"),
    [
        ({"queue.buffering.max.kbytes": 10}, "'queue.buffering.max.kbytes': not a pylog"),
        ({"enable.idempotence": True, "acks": 0}, "acks 0 is never answered"),
        ({"compression.type": "snappy"}, "snappy"),
        ({"compression.type": "brotli"}, "compression.type"),
        ({"acks": 2}, "acks"),
        ({"linger.ms": -1}, "linger.ms"),
        ({"pylog.key.file": "/nowhere"}, "go together"),
    ],
)
def test_producer_settings_without_a_pylog_meaning_are_refused_by_name(
    settings: dict[str, Any], said: str
) -> None:
    with pytest.raises(KafkaException, match=said):
        Producer({"bootstrap.servers": "127.0.0.1:1", **settings})


def test_values_and_keys_are_bytes_or_str_and_a_tombstone_is_refused(
    broker: RunningBroker, kafka_topic: str
) -> None:
    producer = Producer(bootstrap(broker))
    with pytest.raises(TypeError, match="no tombstones"):
        producer.produce(kafka_topic, None, key="k")
    with pytest.raises(TypeError, match="value is bytes or str"):
        producer.produce(kafka_topic, 7)
    delivered: list[tuple[bytes, bytes]] = []
    producer.produce(
        kafka_topic,
        "café",
        key="k",
        partition=0,
        on_delivery=lambda err, msg: delivered.append((msg.key(), msg.value())),
    )
    assert producer.flush(30) == 0
    assert delivered == [(b"k", "café".encode())]  # as stored, as confluent-kafka reports it
    producer.close()
    with PartitionConsumer(broker.endpoint, kafka_topic, 0, stop_at_end=True) as consumer:
        assert [(m.key, m.value) for m in consumer] == [(b"k", "café".encode())]


def test_on_revoke_commits_as_close_gives_the_partitions_up_and_unassign_works_only_there(
    broker: RunningBroker, kafka_topic: str
) -> None:
    """The asyncio example's on_revoke commits; at close() that failed "not subscribed" (the
    member was dropped before it gave its partitions up), so what the program read was read
    again by the next member. confluent-kafka's eager examples call unassign() in on_revoke:
    there it is taken, elsewhere refused in one line."""
    offsets = produce(broker, kafka_topic, ["a", "b", "c"])
    revoked: list[list[TopicPartition]] = []

    def on_revoke(consumer: Consumer, partitions: list[TopicPartition]) -> None:
        consumer.commit(asynchronous=False)
        consumer.unassign()
        revoked.append(partitions)

    settings = {
        **bootstrap(broker),
        "group.id": "revokers",
        "auto.offset.reset": "earliest",
        "enable.auto.commit": False,
    }
    consumer = Consumer(settings)
    consumer.subscribe([kafka_topic], on_revoke=on_revoke)
    got = consumer.consume(2, timeout=30)
    assert [m.value() for m in got] == [b"a", b"b"]
    with pytest.raises(KafkaException, match="not being revoked"):
        consumer.unassign()
    consumer.close()
    assert revoked == [[TopicPartition(kafka_topic, 0), TopicPartition(kafka_topic, 1)]]
    with subscribed(settings, kafka_topic) as again:
        [next_one] = again.consume(1, timeout=30)
        assert (next_one.value(), next_one.offset()) == (b"c", offsets[2])


def test_with_enable_partition_eof_each_partition_read_to_its_end_gives_one_event(
    broker: RunningBroker, kafka_topic: str
) -> None:
    """confluent-kafka's eos_transactions example and others set enable.partition.eof and
    skip the _PARTITION_EOF events (msg.error().code()); the setting was refused."""
    offsets = produce(broker, kafka_topic, ["a", "b"], partition=0)
    settings = {
        **bootstrap(broker),
        "group.id": "ends",
        "auto.offset.reset": "earliest",
        "enable.partition.eof": True,
    }

    def events(consumer: Consumer, count: int) -> list[tuple[int, int, bytes | None, int | None]]:
        seen: list[tuple[int, int, bytes | None, int | None]] = []
        deadline = time.monotonic() + 30
        while len(seen) < count and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is not None:
                error = msg.error()
                code = None if error is None else error.code()
                seen.append((msg.partition(), msg.offset(), msg.value(), code))
        return seen

    size = offsets[1] - offsets[0]  # messages of one size
    end = offsets[1] + size
    eof = KafkaError._PARTITION_EOF
    with subscribed(settings, kafka_topic) as consumer:
        got = events(consumer, 4)
        assert sorted(got, key=lambda e: (e[0], e[1])) == [
            (0, offsets[0], b"a", None),
            (0, offsets[1], b"b", None),
            (0, end, None, eof),  # after its last message
            (1, 0, None, eof),  # empty
        ]
        assert got.index((0, end, None, eof)) > got.index((0, offsets[1], b"b", None))
        assert consumer.poll(1.0) is None  # told once for each end
        later = produce(broker, kafka_topic, ["c"], partition=0)
        assert events(consumer, 2) == [(0, later[0], b"c", None), (0, later[0] + size, None, eof)]


def test_committed_is_answered_without_joining_the_group_as_the_watermarks_example_asks(
    broker: RunningBroker, kafka_topic: str
) -> None:
    """confluent-kafka's get_watermark_offsets.py makes a Consumer that never subscribes and
    asks committed() of its group: it failed 'not subscribed'."""
    offsets = produce(broker, kafka_topic, ["a", "b"])
    settings = {**bootstrap(broker), "group.id": "watchers", "auto.offset.reset": "earliest"}
    with subscribed(settings, kafka_topic) as member:
        [first] = member.consume(1, timeout=30)
        member.commit(message=first, asynchronous=False)
        with Consumer(settings) as onlooker:
            asked = [TopicPartition(kafka_topic, 0), TopicPartition(kafka_topic, 1)]
            found = onlooker.committed(asked, timeout=10)
            assert [(tp.partition, tp.offset) for tp in found] == [
                (0, offsets[1]),
                (1, OFFSET_INVALID),
            ]
            assert onlooker.assignment() == []  # it did not join: the member keeps both
        assert len(member.assignment()) == 2
