"""A producer: messages to the partitions of one topic, in batches.

Placement: a message sent with an explicit partition goes there. Otherwise, with the "hash"
partitioner (the default), a keyed message goes to xxh32(key) % partitions, so one key always
lands on one partition while the partition count stays the same, and a keyless message goes
round robin; "round_robin" and "random" spread every message that way, keys ignored.

Batching: each partition has one open batch (a message set being built with encode_message). A
batch is sent once it holds `batch_messages` messages or `batch_bytes` bytes, or when
`linger_ms` have passed since its first message; linger is checked on every `send` and on
`flush`, there is no background thread. Sending waits for the broker's acknowledgement (ack
WRITTEN or FLUSHED) and retries retriable errors, so delivery is at least once; with ack NONE
nothing is awaited and no error is ever seen. A batch whose sending fails (after its retries)
is dropped, and the error raised to the caller of `send` or `flush`.

Not safe to share between threads.
"""

from __future__ import annotations

import itertools
import math
import random
from dataclasses import dataclass, field
from types import TracebackType
from typing import Literal, Self

import xxhash

from broker.client.connection import DEFAULT_CLIENT_ID, Connection
from broker.clock import SYSTEM_CLOCK, Clock
from broker.errors import BrokerError
from broker.log.message import encode_message
from broker.protocol import (
    Ack,
    ErrorCode,
    MetadataRequest,
    ProduceRequest,
    broker_error,
)

Partitioner = Literal["hash", "round_robin", "random"]


@dataclass(frozen=True, slots=True)
class ProduceAck:
    """A batch the broker acknowledged: its partition, the offset of its first message and how
    many messages it held."""

    partition: int
    base_offset: int
    count: int


@dataclass(slots=True)
class _Batch:
    """The open batch of one partition: encoded messages waiting to be sent."""

    messages: list[bytes] = field(default_factory=list)
    size: int = 0
    started: float = 0.0


class Producer:
    """Send messages to `topic` on the broker at `endpoint`.

    `flush()` sends every open batch and returns the acknowledgements received since the last
    flush (every batch sent meanwhile, by `send` too); `close()` flushes first. `clock` measures
    linger (tests pass a fake one)."""

    def __init__(
        self,
        endpoint: str,
        topic: str,
        ack: Ack = Ack.FLUSHED,
        partitioner: Partitioner = "hash",
        batch_messages: int = 50,
        batch_bytes: int = 256 * 1024,
        linger_ms: float = 10,
        retries: int = 5,
        client_id: str = DEFAULT_CLIENT_ID,
        timeout_s: float = 10.0,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        if partitioner not in ("hash", "round_robin", "random"):
            raise ValueError(f"partitioner {partitioner!r}: use hash, round_robin or random")
        if batch_messages < 1 or batch_bytes < 1 or linger_ms < 0:
            raise ValueError("batch_messages and batch_bytes must be >= 1, linger_ms >= 0")
        self.topic = topic
        self.ack = ack
        self.partitioner: Partitioner = partitioner
        self.batch_messages = batch_messages
        self.batch_bytes = batch_bytes
        self.linger_s = linger_ms / 1000
        self.retries = retries
        self.clock = clock
        self.connection = Connection(endpoint, client_id, timeout_s)
        self._partitions: int | None = None
        self._round_robin = itertools.count()
        self._batches: dict[int, _Batch] = {}
        self._linger_deadline = math.inf
        """When the oldest open batch's linger ends (clock.monotonic), checked on each send."""
        self._acks: list[ProduceAck] = []
        self._sent = 0

    @property
    def partitions(self) -> int:
        """How many partitions the topic has on this broker (asked once, then on
        UNKNOWN_TOPIC_OR_PARTITION)."""
        if self._partitions is None:
            self._partitions = self._fetch_partition_count()
        return self._partitions

    @property
    def messages_sent(self) -> int:
        """Messages handed to the broker so far (acknowledged unless ack is NONE)."""
        return self._sent

    def _fetch_partition_count(self) -> int:
        reply = self.connection.call(MetadataRequest((self.topic,)), self.retries)
        for info in reply.topics:
            if info.topic == self.topic:
                if info.error_code != ErrorCode.NONE:
                    raise broker_error(info.error_code, f"topic {self.topic!r} does not exist")
                if not info.partitions:
                    break
                return len(info.partitions)
        raise broker_error(
            ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"no partitions of {self.topic!r} here"
        )

    def partition_for(self, key: bytes | None) -> int:
        """The partition a message with `key` goes to (keyless ones: the next of the spread)."""
        partitions = self.partitions
        if key is not None and self.partitioner == "hash":
            return xxhash.xxh32_intdigest(key) % partitions
        if self.partitioner == "random":
            return random.randrange(partitions)
        return next(self._round_robin) % partitions

    def send(
        self,
        value: bytes,
        key: bytes | None = None,
        timestamp_ms: int | None = None,
        partition: int | None = None,
    ) -> None:
        """Add a message to its partition's batch; send the batch if it is full, and any batch
        whose linger has passed. Raises what sending raises (BrokerError, Unavailable)."""
        if partition is None:
            partition = self.partition_for(key)
        elif not 0 <= partition < self.partitions:
            raise broker_error(
                ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                f"topic {self.topic!r} has partitions 0 to {self.partitions - 1}, not {partition}",
            )
        message = encode_message(value, key, timestamp_ms)
        batch = self._batches.get(partition)
        if batch is None:
            batch = self._batches[partition] = _Batch(started=self.clock.monotonic())
            self._linger_deadline = min(self._linger_deadline, batch.started + self.linger_s)
        batch.messages.append(message)
        batch.size += len(message)
        if len(batch.messages) >= self.batch_messages or batch.size >= self.batch_bytes:
            self._send_batch(partition)
        if self._batches and self.clock.monotonic() >= self._linger_deadline:
            self._send_lingering()

    def _send_lingering(self) -> None:
        """Send every batch whose linger has passed; note when the next one's will."""
        now = self.clock.monotonic()
        for partition, batch in list(self._batches.items()):
            if now - batch.started >= self.linger_s:
                self._send_batch(partition)
        self._linger_deadline = min(
            (b.started + self.linger_s for b in self._batches.values()), default=math.inf
        )

    def _send_batch(self, partition: int) -> None:
        batch = self._batches.pop(partition)
        message_set = b"".join(batch.messages)
        request = ProduceRequest(self.topic, partition, self.ack, message_set)
        if self.ack is Ack.NONE:
            self.connection.send_nowait(request)
        else:
            try:
                reply = self.connection.call(request, self.retries)
            except BrokerError as error:
                if error.code != ErrorCode.UNKNOWN_TOPIC_OR_PARTITION:
                    raise
                # The topic may have been re-created with other partitions: look again, and
                # retry once if the partition still exists.
                self._partitions = None
                if partition >= self.partitions:
                    raise
                reply = self.connection.call(request, self.retries)
            self._acks.append(ProduceAck(partition, reply.base_offset, reply.count))
        self._sent += len(batch.messages)

    def flush(self) -> list[ProduceAck]:
        """Send every open batch, wait for their acknowledgements, and return every
        acknowledgement received since the last flush, in the order they came."""
        for partition in list(self._batches):
            self._send_batch(partition)
        acks, self._acks = self._acks, []
        return acks

    def close(self) -> None:
        """Flush, then close the connection (fire-and-forget sets get a moment to go out)."""
        try:
            self.flush()
        finally:
            self.connection.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if exc is None:
            self.close()
        else:
            self.connection.close()
