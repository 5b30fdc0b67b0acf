"""The clients act on an error reply's fields, never on its text (docs/protocol.md, "Reply
header"): against a fake partition on loopback whose error replies all read "x", they still
find message boundaries, grow their fetch to the size the reply gives, and skip damaged data.

The fake is a ROUTER serving one partition from a list of messages, with one damaged range
and one message larger than the clients' first fetch size; it records every FETCH."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest
import zmq

from broker import errors
from broker.client import PartitionConsumer
from broker.client.connection import Connection
from broker.client.lag import FETCH_BYTES, message_bounds, messages
from broker.errors import (
    CorruptSegment,
    FencedLeaderEpoch,
    FetchSizeTooSmall,
    InvalidOffset,
    NotEnoughReplicas,
    NotLeaderForPartition,
    OffsetOutOfRange,
    UnknownLeaderEpoch,
)
from broker.log.message import encode_message
from broker.protocol import (
    Ack,
    ErrorCode,
    FetchReply,
    FetchRequest,
    MetadataBroker,
    MetadataReply,
    PartitionInfo,
    ProduceRequest,
    RequestHeader,
    TopicInfo,
    encode_error,
    encode_reply,
)
from tests.client.router import answer_requests, serving

TOPIC = "t"
VALUES = [b"a" * 10, b"b" * 10, b"c" * 70_000, b"d" * 10]
"""The partition's messages; the second is damaged, the third is larger than the first fetch
of PartitionConsumer (FIRST_FETCH) and of lag.messages (64 KiB)."""
FIRST_FETCH = 1000
OFFSETS = [sum(len(encode_message(v)) for v in VALUES[:i]) for i in range(len(VALUES) + 1)]
DAMAGED = (OFFSETS[1], OFFSETS[2])
BIG = OFFSETS[3] - OFFSETS[2]
TEXT = "x"
"""The text of every error reply: no client may need more."""


@dataclass
class FakePartition:
    """Partition 0 of TOPIC, answered by one ROUTER: METADATA and FETCH only."""

    endpoint: str = ""
    fetches: list[FetchRequest] = field(default_factory=list)
    version: int = 1
    """The api_version of the request being answered (METADATA is asked version 2)."""

    def answer(self, correlation_id: int, request: object) -> list[bytes]:
        if not isinstance(request, FetchRequest):  # METADATA: this broker holds partition 0
            host, port = self.endpoint.removeprefix("tcp://").split(":")
            partition = PartitionInfo(0, 1, ErrorCode.NONE)
            topic = TopicInfo(TOPIC, ErrorCode.NONE, (partition,))
            reply = MetadataReply((MetadataBroker(1, host, int(port)),), (topic,))
            return [bytes(f) for f in encode_reply(correlation_id, reply, self.version)]
        self.fetches.append(request)
        error = self.error_for(request)
        if error is not None:
            return [bytes(f) for f in encode_error(correlation_id, error, TEXT)]
        start = OFFSETS.index(request.offset)
        end = start
        while end < len(VALUES) and OFFSETS[end + 1] - request.offset <= request.max_bytes:
            end += 1
            if OFFSETS[end] == DAMAGED[0]:  # a read stops before damage the broker knows
                break
        data = b"".join(encode_message(v) for v in VALUES[start:end])
        fetched = FetchReply(OFFSETS[-1], 0, data)
        return [bytes(f) for f in encode_reply(correlation_id, fetched, self.version)]

    @staticmethod
    def error_for(request: FetchRequest) -> Exception | None:
        offset = request.offset
        if offset > OFFSETS[-1]:
            return OffsetOutOfRange(offset, 0, OFFSETS[-1])
        if offset not in OFFSETS:
            around = max(o for o in OFFSETS if o < offset)
            return InvalidOffset(offset, around, OFFSETS[OFFSETS.index(around) + 1])
        if offset == DAMAGED[0]:
            return CorruptSegment(f"{TOPIC}-0", *DAMAGED, "a flipped bit")
        size = OFFSETS[OFFSETS.index(offset) + 1] - offset if offset < OFFSETS[-1] else 0
        if size > request.max_bytes:
            return FetchSizeTooSmall(offset, request.max_bytes, size)
        return None

    def serve(self, socket: zmq.Socket[bytes], stop: threading.Event) -> None:
        answer_requests(socket, stop, self._answered)

    def _answered(self, header: RequestHeader, request: object) -> list[bytes]:
        self.version = header.version
        return self.answer(header.correlation_id, request)


@dataclass
class FakeFollower(FakePartition):
    """Partition 0 of TOPIC on a broker that does not lead it (broker 2 does, at epoch 6): every
    FETCH, and a PRODUCE of any ack but 3, is NOT_LEADER_FOR_PARTITION; a PRODUCE with ack 3
    is NOT_ENOUGH_REPLICAS (1 in sync, 2 needed); a FETCH at offset 1 or 2 gets the epoch
    errors (epochs 6 and 4 here). Every text is TEXT."""

    def answer(self, correlation_id: int, request: object) -> list[bytes]:
        error: Exception
        if isinstance(request, ProduceRequest) and request.ack is Ack.ALL:
            error = NotEnoughReplicas(f"{TOPIC}-0", 1, 2)
        elif isinstance(request, FetchRequest) and request.offset == 1:
            error = FencedLeaderEpoch(f"{TOPIC}-0", 5, 6)
        elif isinstance(request, FetchRequest) and request.offset == 2:
            error = UnknownLeaderEpoch(f"{TOPIC}-0", 5, 4)
        elif isinstance(request, ProduceRequest | FetchRequest):
            error = NotLeaderForPartition(f"{TOPIC}-0", 2, 6)
        else:
            return super().answer(correlation_id, request)
        if isinstance(request, FetchRequest):
            self.fetches.append(request)
        return [bytes(f) for f in encode_error(correlation_id, error, TEXT)]


@pytest.fixture
def fake() -> Iterator[FakePartition]:
    with serving(FakePartition()) as partition:
        yield partition


@pytest.fixture
def follower() -> Iterator[FakePartition]:
    with serving(FakeFollower()) as partition:
        yield partition


def test_message_bounds_come_from_the_invalid_offset_fields(fake: FakePartition) -> None:
    inside = OFFSETS[2] + 7
    with Connection(fake.endpoint, timeout_s=5) as connection:
        assert message_bounds(connection, TOPIC, 0, inside) == (OFFSETS[2], OFFSETS[3])
        assert message_bounds(connection, TOPIC, 0, OFFSETS[2]) == (OFFSETS[2], OFFSETS[2])
        assert message_bounds(connection, TOPIC, 0, DAMAGED[0]) == (DAMAGED[0], DAMAGED[0])


def fetch_sizes(fake: FakePartition) -> list[int]:
    return [request.max_bytes for request in fake.fetches]


def test_lag_reads_past_damage_and_grows_its_fetch_to_the_needed_size(
    fake: FakePartition,
) -> None:
    damaged: list[CorruptSegment] = []
    with Connection(fake.endpoint, timeout_s=5) as connection:
        found = list(messages(connection, TOPIC, 0, 0, OFFSETS[-1], 0, damaged))
    assert [m.value for m in found] == [VALUES[0], VALUES[2], VALUES[3]]
    assert [(d.partition, d.start, d.end, d.reason) for d in damaged] == [
        (f"{TOPIC}-0", *DAMAGED, "a flipped bit")
    ]
    assert sorted(set(fetch_sizes(fake))) == [FETCH_BYTES, BIG]  # not doubled: 64 KiB, BIG


def test_the_spark_source_reads_past_damage_the_fields_give(fake: FakePartition) -> None:
    pytest.importorskip("pyspark")
    from pipeline.errors import DataLoss
    from pipeline.reader import OffsetRange, read_range

    whole = OffsetRange(TOPIC, 0, fake.endpoint, 0, OFFSETS[-1])
    rows = [v for batch in read_range(whole, False) for v in batch.column("value").to_pylist()]
    assert rows == [VALUES[0], VALUES[2], VALUES[3]]
    with pytest.raises(DataLoss) as raised:
        list(read_range(whole, True))
    assert (raised.value.start, raised.value.end) == DAMAGED
    assert "a flipped bit" in str(raised.value)


def test_a_partition_consumer_skips_damage_and_fetches_with_the_needed_size(
    fake: FakePartition,
) -> None:
    with PartitionConsumer(
        fake.endpoint, TOPIC, start=0, fetch_bytes=FIRST_FETCH, stop_at_end=True, skip_corrupt=True
    ) as consumer:
        assert [m.value for m in consumer] == [VALUES[0], VALUES[2], VALUES[3]]
        assert consumer.skipped == [DAMAGED]
        assert consumer.fetch_bytes == BIG
    assert sorted(set(fetch_sizes(fake))) == [FIRST_FETCH, BIG]  # not doubled: 1000, BIG


def test_a_partition_consumer_raises_the_damage_the_fields_give(fake: FakePartition) -> None:
    with (
        PartitionConsumer(fake.endpoint, TOPIC, start=DAMAGED[0]) as consumer,
        pytest.raises(CorruptSegment) as raised,
    ):
        consumer.poll()
    assert (raised.value.partition, raised.value.start, raised.value.end) == (
        f"{TOPIC}-0",
        *DAMAGED,
    )
    assert raised.value.reason == "a flipped bit"


def test_a_message_over_max_fetch_bytes_is_raised_at_once_not_fetched_again(
    fake: FakePartition,
) -> None:
    with (
        PartitionConsumer(
            fake.endpoint, TOPIC, start=OFFSETS[2], fetch_bytes=FIRST_FETCH, max_fetch_bytes=BIG - 1
        ) as c,
        pytest.raises(FetchSizeTooSmall) as raised,
    ):
        c.poll()
    assert raised.value.needed == BIG
    assert len(fake.fetches) == 1


def test_not_leader_for_partition_gives_the_leader_and_its_epoch(follower: FakePartition) -> None:
    with Connection(follower.endpoint, timeout_s=5) as connection:
        with pytest.raises(errors.BrokerNotLeaderForPartition) as fetched:
            connection.request(FetchRequest(TOPIC, 0, 0, 1000, 0, 0))
        with pytest.raises(errors.BrokerNotLeaderForPartition) as produced:
            connection.request(ProduceRequest(TOPIC, 0, Ack.FLUSHED, encode_message(b"v")))
    for raised in (fetched, produced):
        assert (raised.value.leader, raised.value.leader_epoch) == (2, 6)
        assert raised.value.retriable
        assert (raised.value.name, raised.value.message) == ("NOT_LEADER_FOR_PARTITION", TEXT)


def test_not_enough_replicas_gives_the_in_sync_count_and_the_minimum(
    follower: FakePartition,
) -> None:
    with (
        Connection(follower.endpoint, timeout_s=5) as connection,
        pytest.raises(errors.BrokerNotEnoughReplicas) as raised,
    ):
        connection.request(ProduceRequest(TOPIC, 0, Ack.ALL, encode_message(b"v")))
    assert (raised.value.isr_size, raised.value.min_insync_replicas) == (1, 2)
    assert raised.value.retriable


def test_the_epoch_errors_give_the_answering_broker_s_epoch(follower: FakePartition) -> None:
    with Connection(follower.endpoint, timeout_s=5) as connection:
        with pytest.raises(errors.BrokerFencedLeaderEpoch) as fenced:
            connection.request(FetchRequest(TOPIC, 0, 1, 1000, 0, 0))
        with pytest.raises(errors.BrokerUnknownLeaderEpoch) as unknown:
            connection.request(FetchRequest(TOPIC, 0, 2, 1000, 0, 0))
    assert (fenced.value.leader_epoch, fenced.value.retriable) == (6, False)
    assert (unknown.value.leader_epoch, unknown.value.retriable) == (4, True)


def test_a_retried_not_leader_keeps_its_fields(follower: FakePartition) -> None:
    """call() retries a retriable error (the same broker: no metadata refresh here) and
    raises the last one, fields and all."""
    with (
        Connection(follower.endpoint, timeout_s=5) as connection,
        pytest.raises(errors.BrokerNotLeaderForPartition) as raised,
    ):
        connection.call(FetchRequest(TOPIC, 0, 0, 1000, 0, 0), retries=1)
    assert (raised.value.leader, raised.value.leader_epoch) == (2, 6)
    assert len(follower.fetches) == 2
