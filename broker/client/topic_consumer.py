"""A consumer of every partition of a topic, or of some: what `pylogctl consume` reads.

Each partition is read by a PartitionConsumer, all of them over one Cluster's connections, in
turns: one fetch of each partition that is not done, then the next turn. Records come out in
offset order within a partition; partitions interleave.

Where each partition starts: as PartitionConsumer's `start` (earliest, latest, an offset, a
time), or `Last(n)`: its last n messages. Offsets are byte positions, so the n-th message from
the end can only be found by walking the partition's messages once, from its log start to its
high watermark (no more is kept than the n offsets). When it is inside a compressed set (whose
messages share its offset), the set is read from its start and its messages before the n-th
are passed over.

Where each stops: without `follow`, at the high watermark of its last fetch; with `until_ms`,
before its first message whose timestamp is at or after it (the rest of that partition is not
read); with `follow` and no `until_ms`, never. While following, a partition whose broker cannot be
reached, or answers a retriable error, is read again from its position once its broker answers
(METADATA is asked again, so a partition that moved to another broker is found there): tried
again after 0.1 s doubling to 2 s, for as long as it takes; other partitions are read
meanwhile. (A topic keeps the partitions it was created with: there are none to add.)

Not safe to share between threads.
"""

from __future__ import annotations

import collections
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from broker.backoff import Backoff
from broker.client.cluster import Cluster
from broker.client.consumer import PartitionConsumer, Start
from broker.client.framing import DEFAULT_CLIENT_ID, MAX_RETRY_BACKOFF_S, RETRY_BACKOFF_S
from broker.client.records import Record
from broker.client.transport import Transport
from broker.errors import BrokerError, Unavailable
from broker.lifecycle import Closing
from broker.log.message import Message
from broker.protocol import LATEST, ErrorCode, broker_error
from broker.security import ClientKeys


@dataclass(frozen=True, slots=True)
class Last:
    """Start each partition at its last `count` messages (all of them when it holds fewer)."""

    count: int

    def __post_init__(self) -> None:
        if self.count < 1:
            raise ValueError(f"Last({self.count}): the count must be at least 1")


@dataclass(slots=True)
class _Partition:
    """One partition being read: its consumer (None while its broker is away), its position,
    and when to try its broker again."""

    number: int
    position: int
    consumer: PartitionConsumer | None
    retry_at: float = 0.0
    backoff: Backoff = field(default_factory=lambda: Backoff(RETRY_BACKOFF_S, MAX_RETRY_BACKOFF_S))
    done: bool = False
    skip: int = 0
    """Messages to pass over first: those of a compressed set before where Last starts."""


class TopicConsumer(Closing):
    """Read `partitions` of `topic` (every partition when None) from the cluster that
    `endpoint` belongs to; iterating yields Records. `skipped` lists the damaged ranges read
    past with `skip_corrupt` as (partition, start, end). See the module's text.

    `keys` (broker.security.ClientKeys: the client's key pair and the broker's public key)
    reach brokers serving CurveZMQ (docs/security.md); without them it speaks plaintext.
    `transport` carries the requests (broker.client.transport; default: ZeroMQ sockets); its
    clock times the waits for a broker that is away."""

    def __init__(
        self,
        endpoint: str,
        topic: str,
        partitions: Sequence[int] | None = None,
        start: Start | Last = "earliest",
        until_ms: int | None = None,
        follow: bool = False,
        skip_corrupt: bool = False,
        max_wait_ms: int = 500,
        retries: int = 5,
        client_id: str = DEFAULT_CLIENT_ID,
        timeout_s: float = 10.0,
        *,
        keys: ClientKeys | None = None,
        transport: Transport | None = None,
    ) -> None:
        self.topic = topic
        self.until_ms = until_ms
        self.follow = follow
        self.skip_corrupt = skip_corrupt
        self.max_wait_ms = max_wait_ms
        self.retries = retries
        self.skipped: list[tuple[int, int, int]] = []
        self.cluster = Cluster(
            endpoint, client_id, timeout_s, retries, keys=keys, transport=transport
        )
        self._partitions: dict[int, _Partition] = {}
        try:
            count = len(self.cluster.partitions(topic))
            for number in range(count) if partitions is None else partitions:
                if not 0 <= number < count:
                    raise broker_error(
                        ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                        f"topic {topic!r} has partitions 0 to {count - 1}, not {number}",
                    )
                self._add(number, start)
        except BaseException:
            self.close()
            raise

    def _consumer(self, number: int, start: Start) -> PartitionConsumer:
        return PartitionConsumer(
            ",".join(self.cluster.bootstrap),
            self.topic,
            number,
            start,
            max_wait_ms=self.max_wait_ms,
            retries=self.retries,
            skip_corrupt=self.skip_corrupt,
            cluster=self.cluster,
        )

    def _add(self, number: int, start: Start | Last) -> None:
        consumer = self._consumer(number, "earliest" if isinstance(start, Last) else start)
        skip = 0
        if isinstance(start, Last):
            offset, skip = self._last(consumer, start.count)
            consumer.seek(offset)
        self._partitions[number] = _Partition(number, consumer.position, consumer, skip=skip)

    def _last(self, consumer: PartitionConsumer, count: int) -> tuple[int, int]:
        """The offset of the count-th message before the high watermark (read from the
        consumer's position, the log start), or the high watermark; and how many messages at
        that offset come before it (those of its compressed set)."""
        end = consumer.offset_for_time(LATEST)
        offsets: collections.deque[int] = collections.deque(maxlen=count)
        earlier: collections.deque[int] = collections.deque(maxlen=count)
        before = 0  # the messages before this one that have its offset (in its set)
        while consumer.position < end:
            for message in consumer.poll(0):
                if message.offset < end:
                    same = bool(offsets) and offsets[-1] == message.offset
                    before = before + 1 if same else 0
                    offsets.append(message.offset)
                    earlier.append(before)
            self._note_skipped(consumer)
        return (offsets[0], earlier[0]) if offsets else (end, 0)

    def _note_skipped(self, consumer: PartitionConsumer) -> None:
        self.skipped += [(consumer.partition, start, end) for start, end in consumer.skipped]
        consumer.skipped.clear()

    def __iter__(self) -> Iterator[Record]:
        """Records of each partition in turn, until every partition is done (never, when
        following without `until_ms`)."""
        got = True
        while True:
            reading = [p for p in self._partitions.values() if not p.done]
            if not reading:
                return
            clock = self.cluster.clock
            waiting = [p for p in reading if p.retry_at <= clock.monotonic()]
            if not waiting:  # every partition's broker is away: wait for the first retry
                clock.sleep(max(0.0, min(p.retry_at for p in reading) - clock.monotonic()))
                continue
            wait_ms = 0 if got or not self.follow else max(1, self.max_wait_ms // len(waiting))
            got = False
            for partition in waiting:
                for message in self._poll(partition, wait_ms):
                    got = True
                    if partition.skip:
                        partition.skip -= 1
                        continue
                    if self.until_ms is not None and message.timestamp_ms >= self.until_ms:
                        partition.done = True
                        break
                    yield Record(
                        self.topic,
                        partition.number,
                        message.offset,
                        message.timestamp_ms,
                        message.key,
                        message.value,
                        message.headers,
                        message.next_offset,
                    )

    def _poll(self, partition: _Partition, wait_ms: int) -> list[Message]:
        """One fetch of `partition`; while following, a broker that is away is noted and
        tried again later (the partition's position is kept)."""
        try:
            if partition.consumer is None:
                partition.consumer = self._consumer(partition.number, partition.position)
            messages = partition.consumer.poll(wait_ms)
        except (BrokerError, Unavailable) as error:
            if not self.follow or (isinstance(error, BrokerError) and not error.retriable):
                raise
            if partition.consumer is not None:
                partition.consumer.close()
                partition.consumer = None
            partition.retry_at = self.cluster.clock.monotonic() + partition.backoff.next()
            return []
        consumer = partition.consumer
        partition.position = consumer.position
        partition.backoff.reset()
        self._note_skipped(consumer)
        partition.done = not self.follow and consumer.at_end
        return messages

    def close(self) -> None:
        for partition in self._partitions.values():
            if partition.consumer is not None:
                partition.consumer.close()
        self.cluster.close()
