"""Producer(audit_topic=...): the running totals of what was acknowledged, per hour of the
messages' timestamps, published to the audit topic on flush and on the interval."""

from __future__ import annotations

import json

import pytest

from broker.client import Admin, PartitionConsumer, Producer
from broker.client.audit import DIGEST_MODULUS, WINDOW_MS, message_digest
from broker.protocol import Ack
from tests.pylogd import RunningBroker

TEN_FIFTEEN_MS = 1_763_806_500_000  # 2025-11-22 10:15 UTC
HOUR_10 = TEN_FIFTEEN_MS // WINDOW_MS * WINDOW_MS


def audit_records(endpoint: str, audit_topic: str) -> list[dict[str, object]]:
    consumer = PartitionConsumer(endpoint, audit_topic, 0, stop_at_end=True)
    return [json.loads(message.value) for message in consumer]


def stored_digests(endpoint: str, topic: str, partitions: int) -> dict[int, str]:
    """Hour start (ms) -> the sum of message_digest over what `topic` stores of that hour."""
    sums: dict[int, int] = {}
    for partition in range(partitions):
        for m in PartitionConsumer(endpoint, topic, partition, stop_at_end=True):
            hour = m.timestamp_ms // WINDOW_MS * WINDOW_MS
            digest = message_digest(partition, m.offset, m.timestamp_ms, m.key, m.value)
            sums[hour] = (sums.get(hour, 0) + digest) % DIGEST_MODULUS
    return {hour: f"{total:016x}" for hour, total in sums.items()}


@pytest.mark.parametrize("compression", ["none", "lz4"])
def test_a_producer_publishes_running_totals_and_digests_per_hour_of_what_was_acknowledged(
    broker: RunningBroker, topic: str, compression: str
) -> None:
    """Issue 51: besides the count, the sum of the digests of the messages acknowledged, equal
    to that of what the partitions store (compressed: each message has its set's offset)."""
    audit_topic = f"{topic}-audit"
    with Admin(broker.endpoint) as admin:
        admin.create_topic(topic, 2)
        admin.create_topic(audit_topic, 1)

    with Producer(
        broker.endpoint, topic, audit_topic=audit_topic, compression=compression
    ) as producer:
        for n in range(10):
            producer.send(b"a%d" % n, key=b"k%d" % n, timestamp_ms=TEN_FIFTEEN_MS + n)
        for n in range(5):
            producer.send(b"b", timestamp_ms=TEN_FIFTEEN_MS + WINDOW_MS + n)
        producer.flush()
        first = audit_records(broker.endpoint, audit_topic)
        digests = stored_digests(broker.endpoint, topic, 2)
        for _ in range(3):
            producer.send(b"c", timestamp_ms=TEN_FIFTEEN_MS)
    records = audit_records(broker.endpoint, audit_topic)

    assert first == [
        {
            "producer": first[0]["producer"],
            "topic": topic,
            "window_start_ms": HOUR_10,
            "window_ms": WINDOW_MS,
            "count": 10,
            "digest": digests[HOUR_10],
        },
        {
            "producer": first[0]["producer"],
            "topic": topic,
            "window_start_ms": HOUR_10 + WINDOW_MS,
            "window_ms": WINDOW_MS,
            "count": 5,
            "digest": digests[HOUR_10 + WINDOW_MS],
        },
    ]
    # close published again only the hour that changed, with its running totals
    after = stored_digests(broker.endpoint, topic, 2)
    assert records[2:] == [{**first[0], "count": 13, "digest": after[HOUR_10]}]
    assert after[HOUR_10] != digests[HOUR_10]


def test_a_producer_with_ack_none_counts_what_it_handed_over_and_publishes_on_the_interval(
    broker: RunningBroker, topic: str
) -> None:
    audit_topic = f"{topic}-audit"
    with Admin(broker.endpoint) as admin:
        admin.create_topic(topic, 1)
        admin.create_topic(audit_topic, 1)
    producer = Producer(
        broker.endpoint,
        topic,
        ack=Ack.NONE,
        batch_messages=1,
        audit_topic=audit_topic,
        audit_interval_s=0,
    )
    try:
        producer.send(b"x", timestamp_ms=TEN_FIFTEEN_MS)  # a full batch: sent, then published
        records = audit_records(broker.endpoint, audit_topic)
        assert [(r["count"], r["digest"]) for r in records] == [(1, None)]  # no offset known
    finally:
        producer.close()
