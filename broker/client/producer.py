"""A producer: messages to the partitions of one topic, in batches.

Placement: a message sent with an explicit partition goes there. Otherwise, with the "hash"
partitioner (the default), a keyed message goes to xxh32(key) % partitions, so one key always
lands on one partition while the partition count stays the same, and a keyless message goes
round robin; "round_robin" and "random" spread every message that way, keys ignored. Spread
messages go to the partitions being served (METADATA error_code NONE) while there are any, so
a broker that is down does not stop keyless sends.

Brokers: `endpoint` bootstraps (broker.client.cluster): each batch goes to its partition's
leader as last heard of, over that broker's connection. Once a batch is ready (full, or
lingered), every open batch whose partition the same broker leads goes with it, ready or not,
in one MULTI_PRODUCE (docs/protocol.md; Kafka's drain per broker): keys spread over many
partitions cost a request per broker a round, not one per partition. Each part is answered,
retried and deduplicated as its own PRODUCE would be; a broker that speaks no MULTI_PRODUCE
gets a PRODUCE a batch. NOT_LEADER_FOR_PARTITION naming a
broker the producer knows (leadership moved: docs/replication.md) sends the batch there next;
UNKNOWN_TOPIC_OR_PARTITION, any other retriable error (NOT_ENOUGH_REPLICAS with ack ALL: the
in-sync set is smaller than min_insync_replicas for now) or a timeout makes the producer ask
METADATA again before it resends. Either way after the back-off below, within the batch's
budget; max_in_flight=1 keeps the order.

Idempotence (`idempotence=True`, the default, with any ack but NONE): the producer draws a
random 63-bit producer id when it starts and numbers its batches to each partition 0, 1, 2,
...; each goes as PRODUCE version 3 with its number, kept when it is sent again, and the
partition stores it once: a batch whose reply was lost, or that a worker or broker restart
left unanswered, gets its first offset again (docs/protocol.md, PRODUCE). A batch that arrives
before one it follows is OUT_OF_ORDER_SEQUENCE, nothing stored: the producer sends the batches
the partition misses again first (their replies were lost), or, when it has none of them (one
failed for good), numbers the batch again under a new producer id; after a batch fails for
good, the next ones go under a new id too. A partition that forgot this producer id (idle 300
s while others needed its place) answers UNKNOWN_PRODUCER_ID: unless the producer's first batch
there still awaits its reply (the partition has just not stored it yet: it goes first, then
this one, as after OUT_OF_ORDER_SEQUENCE), a batch sent for the first time is numbered again
under a new id, and one sent before fails with MaybeStored, as an earlier sending may have
been stored (sending it again could store it twice). TOO_MANY_PRODUCERS (the partition has no
room for a new producer yet) is retried as any retriable error. The partition keeps the state
beside the log and its followers copy it, so a batch sent again after a leader change is
stored once too.
Without idempotence a batch the old leader stored may be stored twice (at least once, never
lost once acknowledged).

A fixed identity (`identity=(producer_id, producer_epoch)`, the Spark sink's, docs/pipeline.md)
is for a writer that may be run again on the same messages in the same order (a task Spark
retries): its batches are numbered from 0 under that identity, and another producer with it
that sends the same batches has them answered with their first offsets, stored once. For that
its batches must be the same each run: they close only when full (`batch_messages`,
`batch_bytes`) or at `flush`, never by linger nor drained with another partition's into one
MULTI_PRODUCE, and a keyless message goes round robin over every partition (not only those
being served). Where a producer would take a new id (a batch failed for good, a partition that
forgot it), a producer of a fixed identity fails the batch instead: under another id its
batches would be stored again.

Batching: each partition has one open batch (a message set being built with encode_message). A
batch is sent once it holds `batch_messages` messages or `batch_bytes` bytes, or when
`linger_ms` have passed since its first message, but that a batch not full whose partition's
last batch still awaits its ack goes on filling until that ack (Nagle's rule: over many
partitions each gets a message or two a linger, and would send them so); linger is checked on
`send` (at most every half linger: a batch leaves within half a linger after its own ended)
and on `flush`, there is no background thread.

Acknowledgements (ack WRITTEN or FLUSHED): up to `max_in_flight` requests (a PRODUCE of one
batch or a MULTI_PRODUCE of several) await their replies at once (pipelining, on the
connection's DEALER socket). A full batch waits for the oldest reply while that many do; a
lingered one does not go then, and goes on filling (looked at again a linger later), so that
batches grow while the broker is busy. `flush` waits for all. A batch that meets a retriable
error or no reply in time is sent again, so delivery is at least once; with more than one batch
in flight a batch sent again may land after batches sent later (max_in_flight=1 keeps the order
of a partition's batches). With ack NONE nothing is awaited and no error is ever seen.

Retry budget: a batch is sent again after each retriable error or lost reply, waiting 0.1 s
doubling to 2 s in between, for up to `delivery_timeout_s` (30 s by default, after Kafka's
delivery.timeout.ms) from its first sending, and at most `retries` times if that is given. It
spans a worker's restart: pylogd restarts a worker that died after 0.1 s doubling to 2 s
(broker.pool.MAX_BACKOFF_S; longer only in a crash loop), answering its partitions
PARTITION_UNAVAILABLE meanwhile. A batch whose budget runs out is dropped, and the last error
raised to the caller of `send` or `flush`. AuthenticationFailed (a Curve broker refused this
client's key, broker.client.connection) is no retriable error: it fails the batches at once.

Values and keys are bytes (bytearray and memoryview too): anything else, a str above all, is a
TypeError from `send` naming the argument, unless the producer was given a `serializer` (for
values) or `key_serializer` (for keys, not called for None), a callable returning bytes.

Delivery: `send` returns a Delivery, a handle on the message's fate shaped like a
concurrent.futures.Future of its offset: `done()`, `result(timeout=None)`,
`exception(timeout=None)`, `add_done_callback(fn)`. It costs one small object a message: it
points at its batch and at where the message starts in it, and the batch's outcome (its base
offset, or the error that failed it) is set once, when its acknowledgement or final error
arrives; no Future, lock or thread. Not done yet, `result` and `exception` send the handle's
batch (and any whose linger has passed) and take replies until it is done, up to `timeout`
seconds (None: until done), then raise TimeoutError; the producer has no thread of its own, so
this is the caller's thread running it. A batch that fails (its retry budget spent, or an error
that is not retriable, such as UnknownTopicOrPartition for a deleted topic or MessageTooLarge)
sets that error on exactly its messages' handles, and is raised from the `send` or `flush` that
met it, as before; an error met while a handle's `result` or `exception` drove the producer is
left to the handles of the batch it failed. With ack NONE the broker never says where a message
landed: the handle is done once its batch is handed to the socket, `result()` raises
DeliveryUnknown and `exception()` is None (or the error that kept the batch from being sent).

Not safe to share between threads.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import logging
import math
import random
import secrets
import time
from bisect import bisect_right
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Literal, Self

import xxhash

from broker.backoff import Backoff
from broker.client.audit import WINDOW_MS, ProducedCounts, message_digest
from broker.client.cluster import Cluster, partition_of
from broker.client.connection import Connection
from broker.client.framing import (
    DEFAULT_CLIENT_ID,
    MAX_RETRY_BACKOFF_S,
    RETRY_BACKOFF_S,
    noted,
    require_bytes,
    retriable,
)
from broker.clock import SYSTEM_CLOCK, Clock
from broker.errors import (
    AuthenticationFailed,
    BrokerError,
    MalformedReply,
    OutOfOrderSequence,
    PylogError,
    Unavailable,
    UnknownProducerId,
)
from broker.log.codec import compressed_sets, encode_message
from broker.log.compression import compressor_for
from broker.log.headers import HeaderItems
from broker.log.message import Buffer
from broker.protocol import (
    MAX_PARTS,
    Ack,
    Api,
    ErrorCode,
    MultiProduceRequest,
    PartitionInfo,
    ProducePart,
    ProduceReply,
    ProduceRequest,
    broker_error,
    decode_part_reply,
    decode_reply,
    request_version,
)
from broker.security import ClientKeys

DELIVERY_TIMEOUT_S = 30.0
"""How long a batch is sent again after retriable errors, by default: well above the longest wait
of pylogd before it restarts a worker (2 s, but in a crash loop) plus the worker's start."""
METADATA_RETRIES = 5
"""Retries of a METADATA request when `retries` is not given."""
METADATA_MAX_AGE_S = 60.0
"""How long a producer uses what METADATA said of its topic's partitions before it asks again
(Kafka's metadata.max.age.ms): partitions added to the topic are written to within this."""

MULTI_PRODUCE_BYTES = 1 << 20
"""The most bytes of message sets one MULTI_PRODUCE carries (Kafka's max.request.size): a
batch that would take a request past it waits for the next (the first always goes)."""

_SEQUENCES = 2**32
"""A batch's sequence is a u32: after the last comes 0."""

Partitioner = Literal["hash", "round_robin", "random"]
Serializer = Callable[[Any], Buffer]
"""Turns what is given to Producer.send as a value (or key) into its bytes."""
_NO_SERIALIZER_FIX = "encode it (.encode()), or give the Producer a serializer"

log = logging.getLogger(__name__)


def _check_identity(
    identity: tuple[int, int], ack: Ack, idempotence: bool, partitioner: str
) -> None:
    """ValueError unless a producer of these settings may have the fixed `identity`."""
    producer_id, epoch = identity
    if not (0 < producer_id < 1 << 64 and 0 <= epoch < 1 << 16):
        raise ValueError(
            f"identity {identity!r}: a producer id from 1 to 2^64 - 1 and an epoch from 0 to 65535"
        )
    if ack is Ack.NONE or not idempotence:
        raise ValueError("a fixed identity needs idempotence, and an ack other than NONE")
    if partitioner == "random":
        raise ValueError("a fixed identity places messages the same each run: not at random")


def _new_producer_id() -> int:
    """A random idempotent producer id, 1 to 2**63 - 1 (0 means none)."""
    return secrets.randbits(63) or 1


class DeliveryUnknown(PylogError):
    """Delivery.result() of a message sent with ack NONE: the broker never answers such a
    request, so where (or whether) the message landed cannot be known."""


class MaybeStored(DeliveryUnknown):
    """A batch sent more than once, then answered UNKNOWN_PRODUCER_ID: its partition forgot
    this producer (docs/protocol.md, PRODUCE version 3), so an earlier sending may have been
    stored with its reply lost, or not; it is not sent again, which could store it twice."""


@dataclass(frozen=True, slots=True)
class ProduceAck:
    """A batch the broker acknowledged: its partition, the offset of its first message and how
    many messages it held."""

    partition: int
    base_offset: int
    count: int


class Batch:
    """A batch of one partition: encoded messages waiting to be sent while it is open, then its
    outcome, set once (`settle`): the offset of its first message (None with ack NONE), or the
    error that failed it. One is made for every batch: a plain class, cheaper to make than a
    dataclass with defaults."""

    __slots__ = (
        "audited",
        "base_offset",
        "callbacks",
        "done",
        "error",
        "messages",
        "partition",
        "sets",
        "size",
        "started",
    )

    def __init__(self, partition: int, started: float) -> None:
        self.partition = partition
        self.started = started
        self.messages: list[bytes] = []
        self.size = 0
        self.done = False
        self.base_offset: int | None = None
        self.error: PylogError | None = None
        self.callbacks: list[Callable[[], object]] | None = None
        self.audited: list[tuple[int, int, bytes | None, bytes]] | None = None
        """With auditing: each message's position in the batch, timestamp, key and value, for
        its digest once its offset is known (broker.client.audit)."""
        self.sets: tuple[list[int], list[int]] | None = None
        """Sent compressed: where each set's messages start in the batch, and where the set
        starts in the message set sent (`offset`)."""

    def settle(self, base_offset: int | None, error: PylogError | None = None) -> None:
        """Set the outcome and run the callbacks added meanwhile (one raising is logged, as a
        concurrent.futures.Future does)."""
        self.done, self.base_offset, self.error = True, base_offset, error
        if self.callbacks is not None:
            callbacks, self.callbacks = self.callbacks, None
            for callback in callbacks:
                try:
                    callback()
                except Exception:
                    log.exception("a Delivery's done callback raised")

    def offset(self, position: int) -> int:
        """The offset of the message at `position` of a done batch; raises its error, or
        DeliveryUnknown with ack NONE."""
        if self.error is not None:
            raise self.error
        if self.base_offset is None:
            raise DeliveryUnknown(
                "sent with ack NONE: the broker does not say where the message landed "
                "(use ack WRITTEN or FLUSHED to know)"
            )
        if self.sets is not None:  # a message of a compressed set has the set's offset
            starts, sent_at = self.sets
            return self.base_offset + sent_at[bisect_right(starts, position) - 1]
        return self.base_offset + position


class Handle:
    """What every delivery handle (this module's and broker.aio's) knows without waiting: its
    batch, and where its message starts in the batch's message set (its offset's delta)."""

    __slots__ = ("_batch", "_position")

    def __init__(self, batch: Batch, position: int) -> None:
        self._batch = batch
        self._position = position

    @property
    def partition(self) -> int:
        """The partition the message was sent to."""
        return self._batch.partition

    def done(self) -> bool:
        """Whether the outcome is known (for ack NONE: the message was handed to the socket)."""
        return self._batch.done

    def outcome(self) -> tuple[int | None, PylogError | None]:
        """A done handle's offset, or the error that failed its batch: (None, None) with ack
        NONE (the broker does not say where it landed). Not done: (None, None) too."""
        batch = self._batch
        if batch.error is not None or batch.base_offset is None:
            return None, batch.error
        return batch.offset(self._position), None

    def add_done_callback(self, fn: Callable[[Self], object]) -> None:
        """Call `fn(self)` once done: now if done already, else when the outcome arrives, in
        whatever drives the producer then (a send, flush or another handle's result)."""
        if self._batch.done:
            fn(self)
        else:
            if self._batch.callbacks is None:
                self._batch.callbacks = []
            self._batch.callbacks.append(lambda: fn(self))


class Delivery(Handle):
    """The fate of one message given to Producer.send (see the module's text): `result()` is its
    offset, or raises the error that failed its batch."""

    __slots__ = ("_producer",)

    def __init__(self, producer: Producer, batch: Batch, position: int) -> None:
        self._producer = producer
        self._batch = batch
        self._position = position

    def result(self, timeout: float | None = None) -> int:
        """The message's offset; raises the error that failed its batch, TimeoutError when
        not done within `timeout` seconds, DeliveryUnknown with ack NONE."""
        return self._settled(timeout).offset(self._position)

    def exception(self, timeout: float | None = None) -> PylogError | None:
        """The error that failed the message's batch, or None; TimeoutError as `result`."""
        return self._settled(timeout).error

    def _settled(self, timeout: float | None) -> Batch:
        if not self._batch.done:
            self._producer._settle(self._batch, timeout)
            if not self._batch.done:
                raise TimeoutError(f"the message's batch was not acknowledged in {timeout} s")
        return self._batch


@dataclass(slots=True)
class InFlight:
    """A batch sent and not yet acknowledged."""

    request: ProduceRequest
    batch: Batch
    sequence: int
    """The order in which batches were first sent: acks are returned in it."""
    deadline: float
    """No sending again after this (time.monotonic): its first sending + delivery_timeout_s."""
    attempts: int = 0
    looked_again: bool = False
    sends: int = 0
    """How many times it was sent: once more than once, an earlier sending may have been
    stored with its reply lost (UNKNOWN_PRODUCER_ID then fails it: `_renumber_unsent`)."""


class ProducerCore:
    """What a producer does without I/O, shared by Producer and broker.aio's AsyncProducer:
    the settings, serializing and checking values and keys, placement, the open batches and
    their linger, the retry budget of a batch in flight, and the acknowledgements."""

    def __init__(
        self,
        topic: str,
        ack: Ack,
        partitioner: Partitioner,
        batch_messages: int,
        batch_bytes: int,
        linger_ms: float,
        retries: int | None,
        delivery_timeout_s: float,
        max_in_flight: int,
        clock: Clock,
        serializer: Serializer | None,
        key_serializer: Serializer | None,
        compression: str = "none",
        compression_level: int | None = None,
        metadata_max_age_s: float = METADATA_MAX_AGE_S,
        idempotence: bool = True,
        identity: tuple[int, int] | None = None,
    ) -> None:
        self._compressor = compressor_for(compression, compression_level)
        self._inner = self._compressor is not None
        """Whether messages are encoded for a compressed set (checksum field 0)."""
        if partitioner not in ("hash", "round_robin", "random"):
            raise ValueError(f"partitioner {partitioner!r}: use hash, round_robin or random")
        if batch_messages < 1 or batch_bytes < 1 or linger_ms < 0 or max_in_flight < 1:
            raise ValueError(
                "batch_messages, batch_bytes and max_in_flight must be >= 1, linger_ms >= 0"
            )
        if delivery_timeout_s < 0 or (retries is not None and retries < 0):
            raise ValueError("delivery_timeout_s and retries must be >= 0")
        if not metadata_max_age_s > 0:
            raise ValueError(f"metadata_max_age_s must be > 0, not {metadata_max_age_s!r}")
        if identity is not None:
            _check_identity(identity, ack, idempotence, partitioner)
            linger_ms = math.inf  # batches close when full: the same ones each run
        self.topic = topic
        self.ack = ack
        self.partitioner: Partitioner = partitioner
        self.batch_messages = batch_messages
        self.batch_bytes = batch_bytes
        self.linger_s = linger_ms / 1000
        self.retries = retries
        self.delivery_timeout_s = delivery_timeout_s
        self.max_in_flight = max_in_flight
        self.serializer = serializer
        self.key_serializer = key_serializer
        self.clock = clock
        self.metadata_max_age_s = metadata_max_age_s
        self._layout: tuple[PartitionInfo, ...] | None = None
        self._layout_expires = math.inf
        """When the layout is to be asked again (clock.monotonic), checked as batches close."""
        self._served: list[int] = []
        """The partitions being served at the last look: where spread messages go."""
        self._round_robin = itertools.count()
        self._batches: dict[int, Batch] = {}
        self._sent_last: dict[int, Batch] = {}
        """Each partition's last batch sent (_busy while it awaits its ack)."""
        self._linger_deadline = math.inf
        """When the oldest open batch's linger ends (clock.monotonic), checked on each send."""
        self._acks: list[tuple[int, ProduceAck]] = []
        """Acknowledgements since the last flush, each with its batch's send sequence."""
        self._batches_sent = itertools.count()
        self._sent = 0
        self.produced: ProducedCounts | None = None
        """With auditing, what was acknowledged per window (set by the producer)."""
        self.idempotence = idempotence and ack is not Ack.NONE
        """Whether each set carries this producer's id and its sequence (PRODUCE version 3),
        so that a set sent again is stored once (never with ack NONE: nothing is sent again)."""
        self.identity = identity
        """The fixed (producer id, epoch), if given (see the module's text)."""
        self._producer_id = _new_producer_id() if self.idempotence else 0
        self._producer_epoch = 0
        if identity is not None:
            self._producer_id, self._producer_epoch = identity
        self._sequences: dict[int, int] = {}
        """The sequence of the next set to each partition under _producer_id."""
        self._unsettled: dict[tuple[int, int], dict[int, InFlight]] = {}
        """The batches sent and not yet acknowledged nor failed, by (producer id, partition)
        and sequence: those a partition may say it misses (OUT_OF_ORDER_SEQUENCE)."""

    @property
    def messages_sent(self) -> int:
        """Messages handed to the broker so far (acknowledged unless ack is NONE)."""
        return self._sent

    def _learn_layout(self, layout: tuple[PartitionInfo, ...]) -> tuple[PartitionInfo, ...]:
        if not layout:
            raise broker_error(
                ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"no partitions of {self.topic!r}"
            )
        self._layout = layout
        self._layout_expires = self.clock.monotonic() + self.metadata_max_age_s
        self._served = [p.partition for p in layout if p.error_code == ErrorCode.NONE]
        return layout

    def _fresh_layout(self) -> tuple[PartitionInfo, ...] | None:
        """The layout METADATA gave, or None once it is metadata_max_age_s old (forgotten)."""
        if self._layout_expires <= self.clock.monotonic():
            self._layout = None
        return self._layout

    def _add(
        self,
        layout: tuple[PartitionInfo, ...],
        value: Any,
        key: Any,
        timestamp_ms: int | None,
        partition: int | None,
        headers: HeaderItems | Mapping[str, bytes | None] | None = None,
    ) -> tuple[Batch, int, bool]:
        """Encode a message and add it to its partition's open batch: the batch, where the
        message starts in it, and whether the batch is full now. TypeError, nothing added, for
        a value or key that is not bytes (nor made bytes by the serializers). One call on the
        path of every message: Producer.send's cost a message is mostly this (the encoding is
        broker.log.codec's, in C when built; bytes, the usual value, skip require_bytes)."""
        if self.serializer is not None:
            value = require_bytes("Producer.send: the serializer's result", self.serializer(value))
        elif type(value) is not bytes:
            value = require_bytes("Producer.send: value", value, _NO_SERIALIZER_FIX)
        if key is not None:
            if self.key_serializer is not None:
                key = require_bytes(
                    "Producer.send: the key_serializer's result", self.key_serializer(key)
                )
            elif type(key) is not bytes:
                key = require_bytes("Producer.send: key", key, _NO_SERIALIZER_FIX)
        if partition is None:
            partition = self._place(layout, key)
        elif not 0 <= partition < len(layout):
            partition_of(layout, self.topic, partition)  # raises, naming the range
        produced = self.produced
        if produced is not None and timestamp_ms is None:
            timestamp_ms = time.time_ns() // 1_000_000  # counted in its window, as stored
        if headers is None:  # the path of every message without headers: nothing more
            message = encode_message(value, key, timestamp_ms, self._inner)
        else:
            items = headers.items() if isinstance(headers, Mapping) else headers
            message = encode_message(value, key, timestamp_ms, self._inner, items)
        batch = self._batches.get(partition)
        if batch is None:
            batch = self._batches[partition] = Batch(partition, self.clock.monotonic())
            self._linger_deadline = min(self._linger_deadline, batch.started + self.linger_s)
        if produced is not None:
            assert timestamp_ms is not None
            if batch.audited is None:
                batch.audited = []
            audited_key = None if key is None else bytes(key)
            batch.audited.append((batch.size, timestamp_ms, audited_key, bytes(value)))
        messages = batch.messages
        messages.append(message)
        position = batch.size
        size = batch.size = position + len(message)
        return batch, position, len(messages) >= self.batch_messages or size >= self.batch_bytes

    def _place(self, layout: tuple[PartitionInfo, ...], key: Buffer | None) -> int:
        """The partition of a message not sent to a given one: by key, or spread (keyless:
        the next of the spread, over the partitions being served if any is)."""
        if key is not None and self.partitioner == "hash":
            return xxhash.xxh32_intdigest(key) % len(layout)
        spread = self._served if self._served and self.identity is None else range(len(layout))
        if self.partitioner == "random":
            return random.choice(spread)
        return spread[next(self._round_robin) % len(spread)]

    def _lingering(self) -> list[int]:
        """The partitions whose open batch's linger has passed and whose last batch sent is
        not awaiting its ack (`_busy`), noting when to look again: at the next one's linger,
        or a linger from now for one that waits on its ack, but not within half a linger (a
        look goes over every open batch: over many partitions their lingers end one after
        another, and it ran every few messages)."""
        now = self.clock.monotonic()
        linger_s = self.linger_s
        due, waiting = [], []
        for p, batch in self._batches.items():
            if now - batch.started < linger_s:
                waiting.append(batch.started + linger_s)
            elif self._busy(p):
                waiting.append(now + linger_s)
            else:
                due.append(p)
        self._linger_deadline = max(min(waiting, default=math.inf), now + linger_s / 2)
        return due

    def _busy(self, partition: int) -> bool:
        """Whether `partition`'s last batch sent awaits its ack: its next batch, not full,
        goes on filling until then (Nagle's rule for small segments): over many partitions
        with acks that take a flush, a partition's batches grow to what it is sent in a round
        trip instead of leaving with a message or two each."""
        last = self._sent_last.get(partition)
        return last is not None and not last.done

    def _close_batch(self, partition: int) -> InFlight:
        """Take `partition`'s open batch out, as the request that sends it, its retry budget
        starting now."""
        batch = self._batches.pop(partition)
        self._sent_last[partition] = batch
        self._fresh_layout()  # asked again by the next message once old: partitions may be added
        if self._compressor is None:
            message_set = b"".join(batch.messages)
        else:
            message_set = self._compressed(batch)
        producer_id = self._producer_id
        sequence = self._next_sequence(partition) if producer_id else 0
        request = ProduceRequest(
            self.topic,
            partition,
            self.ack,
            message_set,
            producer_id,
            self._producer_epoch if producer_id else 0,
            sequence,
        )
        self._sent += len(batch.messages)
        batch.messages = []  # the request holds them now; handles keep only the outcome
        deadline = time.monotonic() + self.delivery_timeout_s
        entry = InFlight(request, batch, next(self._batches_sent), deadline)
        if producer_id:
            self._unsettled.setdefault((producer_id, partition), {})[sequence] = entry
        return entry

    def _next_sequence(self, partition: int) -> int:
        """The sequence of the next batch to `partition` under this producer's id."""
        sequence = self._sequences.get(partition, 0)
        self._sequences[partition] = (sequence + 1) % _SEQUENCES
        return sequence

    def _settled(self, entry: InFlight) -> None:
        """`entry` is acknowledged or failed: no longer one a partition may miss."""
        request = entry.request
        if request.producer_id:
            key = (request.producer_id, request.partition)
            waiting = self._unsettled.get(key)
            if waiting is not None:
                waiting.pop(request.sequence, None)
                if not waiting:
                    del self._unsettled[key]

    def _out_of_order(self, entry: InFlight, error: OutOfOrderSequence) -> list[InFlight]:
        """After OUT_OF_ORDER_SEQUENCE for `entry`: the batches not yet settled that its
        partition misses before it (from `error.expected` on), in their order, to be sent
        again first (their replies lost: to a worker that died, say). When none is, the
        partition will never get what it expects (the batch failed for good, or the partition
        forgot this producer id): `entry` is numbered again, under a new producer id, and
        goes alone (it was not stored: an out-of-order batch never is)."""
        missing = self._missing_before(entry, error.expected)
        if not missing:
            self._renumber(entry, error)
        return missing

    def _missing_before(self, entry: InFlight, expected: int) -> list[InFlight]:
        """The batches not yet settled that `entry`'s partition misses before it, from
        sequence `expected` on, in their order."""
        request = entry.request
        waiting = self._unsettled.get((request.producer_id, request.partition), {})
        behind = (request.sequence - expected) % _SEQUENCES
        missing = sorted(
            (
                ((sequence - expected) % _SEQUENCES, other)
                for sequence, other in waiting.items()
                if (sequence - expected) % _SEQUENCES < behind
            ),
            key=lambda pair: pair[0],
        )
        return [other for _, other in missing]

    def _unknown_producer(self, entry: InFlight, error: UnknownProducerId) -> list[InFlight]:
        """After UNKNOWN_PRODUCER_ID for `entry`: when this producer's first set there
        (sequence 0), sent before `entry`, is not yet settled, the partition has not stored it
        yet (sent again after a worker's death, it may come after `entry`), and the batches it
        misses before `entry` are returned, to go first, `entry` after them under the same id.
        Else the partition forgot this producer (or its first set failed for good):
        `_renumber_unsent`."""
        missing = self._missing_before(entry, 0)
        if missing and missing[0].request.sequence == 0:
            return missing
        self._renumber_unsent(entry, error)
        return []

    def _renumber_unsent(self, entry: InFlight, error: UnknownProducerId) -> None:
        """After UNKNOWN_PRODUCER_ID for `entry` (its partition forgot this producer, or never
        stored its first set there): numbered again under a new producer id when it was never
        sent before (nothing of it was stored); else `error` is raised, and it fails: an
        earlier sending may have been stored, its reply lost, and numbered again it would be
        stored twice."""
        if entry.sends > 1:
            raise MaybeStored(
                f"a batch to partition {entry.request.partition} was sent {entry.sends} "
                f"times, then the partition forgot this producer ({error}): an earlier "
                "sending may have been stored, or not; it is not sent again (that could store "
                "it twice)"
            ) from error
        self._renumber(entry, error)

    def _renumber(self, entry: InFlight, error: PylogError) -> None:
        """Number `entry` again under a new producer id (its partition can never take it under
        this one, as `error` said), as the first set of its partition there; `error` raised
        instead for a producer of a fixed identity."""
        if self.identity is not None:
            raise error
        request = entry.request
        self._settled(entry)
        if request.producer_id == self._producer_id:
            self._producer_id = _new_producer_id()
            self._sequences.clear()
        producer_id, partition = self._producer_id, request.partition
        sequence = self._next_sequence(partition)
        entry.request = dataclasses.replace(request, producer_id=producer_id, sequence=sequence)
        self._unsettled.setdefault((producer_id, partition), {})[sequence] = entry

    def _compressed(self, batch: Batch) -> bytes:
        """The message set of `batch`, whose messages were encoded for a compressed set: one
        set, or several when they hold more than a set's bound (codec.compressed_sets),
        noting where each starts."""
        assert self._compressor is not None
        message_set, starts, sent_at = compressed_sets(self._compressor, batch.messages)
        batch.sets = starts, sent_at
        return message_set

    def _retry_wait(self, entry: InFlight, error: PylogError) -> float:
        """The back-off before sending `entry` again after `error` (0.1 s doubling to 2 s),
        counted as an attempt, the partition's holder to be looked up again; raises `error`
        when the batch's budget (retries, delivery_timeout_s) is spent."""
        backoff_s = Backoff(RETRY_BACKOFF_S, MAX_RETRY_BACKOFF_S).delay(entry.attempts)
        spent = self.retries is not None and entry.attempts >= self.retries
        if spent or time.monotonic() + backoff_s > entry.deadline:
            raise error
        entry.attempts += 1
        self._layout = None  # the partition's broker may have gone: look again
        return backoff_s

    def _look_again_after(self, entry: InFlight, error: BrokerError) -> bool:
        """Whether `error` answered to `entry` calls for asking where its partition is once
        (UNKNOWN_TOPIC_OR_PARTITION: the topic may have been re-created with other
        partitions); raises `error` when it is neither that nor retriable."""
        if error.code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION and not entry.looked_again:
            entry.looked_again = True
            self._layout = None
            return True
        if not error.retriable:
            raise error
        return False

    def _give_up(self, entry: InFlight, error: PylogError) -> None:
        """Fail `entry`'s batch with `error`, for good. Its partition may never get it: the
        next batches go under a new producer id (those in flight after it are numbered again
        when the partition says it misses it, `_out_of_order`)."""
        entry.batch.settle(None, error)
        self._settled(entry)
        if entry.request.producer_id == self._producer_id and self.identity is None:
            self._producer_id = _new_producer_id()
            self._sequences.clear()

    def _acked(self, entry: InFlight, reply: ProduceReply) -> None:
        self._settled(entry)
        ack = ProduceAck(entry.request.partition, reply.base_offset, reply.count)
        self._acks.append((entry.sequence, ack))
        batch = entry.batch
        if batch.callbacks is None:  # settle's work without its call: once a batch
            batch.done, batch.base_offset = True, reply.base_offset
        else:
            batch.settle(reply.base_offset)
        self._count_produced(batch)

    def _count_produced(self, batch: Batch) -> None:
        """Count a settled `batch`'s messages as produced: acknowledged, each with its digest,
        or handed over with ack NONE (no offsets: digests unknown)."""
        produced, audited = self.produced, batch.audited
        if audited is None or produced is None:
            return
        known = batch.base_offset is not None
        for position, timestamp_ms, key, value in audited:
            digest = None
            if known:
                offset = batch.offset(position)
                digest = message_digest(batch.partition, offset, timestamp_ms, key, value)
            produced.add(timestamp_ms // WINDOW_MS, digest)

    def _take_acks(self) -> list[ProduceAck]:
        """The acknowledgements since the last call, in the order their batches were sent."""
        acks, self._acks = [ack for _, ack in sorted(self._acks)], []
        return acks


class Producer(ProducerCore):
    """Send messages to `topic` on the cluster that `endpoint` (one or more, comma-separated)
    belongs to.

    `send()` returns a Delivery: its `result(timeout)` is the message's offset (see the module's
    text). `flush()` sends every open batch and returns the acknowledgements received since the
    last flush (every batch sent meanwhile, by `send` too); `close()` flushes first. `clock`
    measures linger (tests pass a fake one).

    A batch that meets a retriable error or no reply within `timeout_s` is sent again until
    `delivery_timeout_s` have passed since its first sending (no new attempt starts later; the
    last one still gets its `timeout_s`), and at most `retries` times when that is not None
    (`pylogctl produce` gives 1, to fail fast). The default outlasts a worker's restart by
    pylogd (see the module doc); a shorter one fails sends while a worker restarts.

    `audit_topic`: count the messages acknowledged (handed over, with ack NONE) per hour of
    their timestamps, and publish the running totals to that topic (broker.client.audit) every
    `audit_interval_s`, checked when a batch is sent, and on every flush and close, for
    `pipeline.audit --audit-topic` to compare with what was stored and loaded.

    `keys` (broker.security.ClientKeys: the client's key pair and the broker's public key)
    reach brokers serving CurveZMQ (docs/security.md), the audit topic's too; without them
    the producer speaks plaintext.

    `compression` ("none", "gzip", "lz4" or "zstd", at `compression_level`, None for the
    codec's default: zstd 3, lz4 0, gzip 6) sends each batch as one compressed set
    (docs/storage.md, "Compressed sets"): every message of it then has the set's offset, which
    is what `Delivery.result()` gives. `batch_bytes` counts the bytes before compression. A
    batch over the 64 MiB bound of a set goes as several sets (a message over it alone, as a
    plain message).

    `metadata_max_age_s`: how long what METADATA said of the topic's partitions is used before
    it is asked again (partitions added to the topic are written to within it; a key's
    partition then changes, docs/replication.md "Placement").

    `idempotence` (on by default): each batch carries this producer's id and its number, so
    that a batch sent again is stored once (see the module's text); False sends PRODUCE as
    before it (version 3 without a producer id). `identity`: a fixed (producer id, epoch) in
    place of a random id, for a writer run again on the same messages (see the module's text;
    `linger_ms` is then not used)."""

    def __init__(
        self,
        endpoint: str,
        topic: str,
        ack: Ack = Ack.FLUSHED,
        partitioner: Partitioner = "hash",
        batch_messages: int = 50,
        batch_bytes: int = 256 * 1024,
        linger_ms: float = 10,
        retries: int | None = None,
        delivery_timeout_s: float = DELIVERY_TIMEOUT_S,
        max_in_flight: int = 5,
        client_id: str = DEFAULT_CLIENT_ID,
        timeout_s: float = 10.0,
        clock: Clock = SYSTEM_CLOCK,
        serializer: Serializer | None = None,
        key_serializer: Serializer | None = None,
        audit_topic: str | None = None,
        audit_interval_s: float = 60.0,
        *,
        keys: ClientKeys | None = None,
        compression: str = "none",
        compression_level: int | None = None,
        metadata_max_age_s: float = METADATA_MAX_AGE_S,
        idempotence: bool = True,
        identity: tuple[int, int] | None = None,
    ) -> None:
        super().__init__(
            topic,
            ack,
            partitioner,
            batch_messages,
            batch_bytes,
            linger_ms,
            retries,
            delivery_timeout_s,
            max_in_flight,
            clock,
            serializer,
            key_serializer,
            compression,
            compression_level,
            metadata_max_age_s,
            idempotence,
            identity,
        )
        self._in_flight: dict[tuple[Connection, int], InFlight] = {}
        self._sent_together: dict[tuple[Connection, int], list[InFlight | None]] = {}
        """MULTI_PRODUCE requests awaiting their reply: their batches in their parts' order
        (None for one taken out to be sent again alone)."""
        self._in_flight_on: Counter[Connection] = Counter()
        """How many requests of _in_flight and _sent_together each connection carries (none:
        not there), kept as they change: the connections to wait on, without a walk of
        _in_flight an ack."""
        self._one_by_one: set[str] = set()
        """The endpoints of brokers that answered a MULTI_PRODUCE UNSUPPORTED_API (older):
        they get a PRODUCE a batch."""
        metadata_retries = METADATA_RETRIES if retries is None else retries
        self.cluster = Cluster(endpoint, client_id, timeout_s, metadata_retries, keys=keys)
        self._audit: Producer | None = None
        self._audit_interval_s = audit_interval_s
        self._audit_due = math.inf
        if audit_topic is not None:
            if audit_topic == topic:
                raise ValueError(f"audit_topic {audit_topic!r} is the topic audited")
            self.produced = ProducedCounts(topic)
            self._audit = Producer(
                endpoint, audit_topic, client_id=client_id, timeout_s=timeout_s, keys=keys
            )
            self._audit_due = self.clock.monotonic() + audit_interval_s

    @property
    def partitions(self) -> int:
        """How many partitions the topic has (asked once, then again after errors)."""
        return len(self._partition_layout())

    def _partition_layout(self) -> tuple[PartitionInfo, ...]:
        layout = self._fresh_layout()
        if layout is None:
            return self._learn_layout(self.cluster.partitions(self.topic))
        return layout

    def partition_for(self, key: bytes | None) -> int:
        """The partition a message with `key` goes to (keyless ones: the next of the spread,
        over the partitions being served if any is)."""
        return self._place(self._partition_layout(), key)

    def send(
        self,
        value: Any,
        key: Any = None,
        timestamp_ms: int | None = None,
        partition: int | None = None,
        headers: HeaderItems | Mapping[str, bytes | None] | None = None,
    ) -> Delivery:
        """Add a message to its partition's batch and return its Delivery; send the batch if it
        is full, and any batch whose linger has passed. Raises what sending raises (BrokerError,
        Unavailable, AuthenticationFailed), and TypeError, nothing sent, for a value or key that
        is not bytes (nor made bytes by the producer's serializer or key_serializer).
        `headers`: (key, value) pairs, keys str and values bytes or None, in order (a mapping
        gives its items), stored with the message (format 2: docs/storage.md)."""
        layout = self._layout or self._partition_layout()
        batch, position, full = self._add(layout, value, key, timestamp_ms, partition, headers)
        if full or (self._batches and self.clock.monotonic() >= self._linger_deadline):
            self._sent_some(batch.partition, full)
        return Delivery(self, batch, position)

    def add(
        self,
        value: Any,
        key: Any = None,
        timestamp_ms: int | None = None,
        partition: int | None = None,
        headers: HeaderItems | Mapping[str, bytes | None] | None = None,
    ) -> tuple[Batch, int]:
        """`send` without its Delivery: the message's batch and where it starts in it (its
        Handle's parts), for a caller that keeps them itself (broker.client.kafka, whose
        callbacks need no handle a message). Raises only what refuses this message: an error
        met sending it, or others, or taking their acks, fails the batches it concerns and
        stays with them (a Kafka delivery report), never with the next message added."""
        layout = self._layout or self._partition_layout()
        batch, position, full = self._add(layout, value, key, timestamp_ms, partition, headers)
        if full or (self._batches and self.clock.monotonic() >= self._linger_deadline):
            try:  # noqa: SIM105 (suppress costs 0.3 µs; most messages past a linger pass here)
                self._sent_some(batch.partition, full)
            except PylogError:  # the batches it failed carry it
                pass
        return batch, position

    def take_unsent(self) -> dict[int, tuple[int, list[bytes]]]:
        """Wait until every batch sent is acknowledged (raising as `flush` does), and take out
        the batches still open, unsent: by partition, the sequence the batch would have had
        and its messages, encoded (for another producer's `send_set`: the Spark sink's tasks
        leave them to the driver). Their messages' deliveries never settle."""
        unsent, self._batches = self._batches, {}
        self._linger_deadline = math.inf
        self.flush()
        return {
            partition: (self._sequences.get(partition, 0), batch.messages)
            for partition, batch in unsent.items()
        }

    def send_set(self, partition: int, messages: Sequence[bytes], sequence: int) -> None:
        """Send `messages`, encoded as this producer encodes them (`take_unsent`'s, of a
        producer of the same compression and identity), to `partition` as one batch of
        sequence `sequence` (the next the partition expects of this identity: the sequences
        of the batches after it follow it); `flush` waits for its acknowledgement. Only for
        a producer of a fixed identity with no batch of `partition` open."""
        partition_of(self._partition_layout(), self.topic, partition)  # raises, naming the range
        if self.identity is None or partition in self._batches:
            raise ValueError("send_set: a producer of a fixed identity, the partition's first")
        self._sequences[partition] = sequence
        batch = self._batches[partition] = Batch(partition, self.clock.monotonic())
        batch.messages = list(messages)
        batch.size = sum(len(message) for message in batch.messages)
        self._send_batch(partition)

    def _sent_some(self, partition: int, full: bool) -> None:
        """After a message was added (`send`, `add`): its batch sent when `full`, and the
        batches whose linger has passed (the checks are inline at the callers: they run for
        every message)."""
        if full:
            self._send_batch(partition)
        if self._batches and self.clock.monotonic() >= self._linger_deadline:
            self._send_lingering()

    def _send_lingering(self) -> None:
        """Send every batch whose linger has passed, if a request may go: with max_in_flight
        awaiting replies (none of them there yet), the batches go on filling instead, and
        are looked at again a linger later, or when a batch is full (Kafka's accumulator:
        under load, batches grow while the broker is busy, and each request carries more)."""
        now = self.clock.monotonic()
        if not self._batches or now < self._linger_deadline:
            return
        if self.ack is not Ack.NONE and self._requests_in_flight():
            self._take_acks_there()  # which batches are answered: _busy
            if self._requests_in_flight() >= self.max_in_flight:
                self._linger_deadline = now + self.linger_s
                return
        for lingering in self._lingering():
            if lingering in self._batches:  # not sent with another's already
                self._send_batch(lingering)

    def _settle(self, batch: Batch, timeout: float | None) -> None:
        """Send `batch` if still open, and any whose linger has passed, then take replies until
        it is done, nothing is in flight or `timeout` seconds have passed. An error met on the
        way is left to the handles of the batches it failed."""
        deadline = math.inf if timeout is None else time.monotonic() + timeout
        with contextlib.suppress(PylogError):
            if self._batches.get(batch.partition) is batch:
                self._send_batch(batch.partition)
            self._send_lingering()
            while not batch.done and self._requests_in_flight():
                left = deadline - time.monotonic()
                if left <= 0:
                    return
                self._receive_ack(left)

    def _send_batch(self, partition: int, every: bool = False) -> None:
        """Send `partition`'s batch: with the open batches of the other partitions its leader
        leads, in one MULTI_PRODUCE, when there are any (_drained_with; `every`: those of busy
        partitions too); else alone."""
        if self.ack is not Ack.NONE:
            self._wait_for_room()
        drained = self._drained_with(partition, every)
        if drained is not None:
            self._send_together(*drained)
        else:
            entry = self._close_batch(partition)
            if self.ack is Ack.NONE:
                self._sent_unanswered(self._holder(partition), entry.request, [entry])
            else:
                self._dispatch(entry)
        if self.clock.monotonic() >= self._audit_due:
            self._publish_audit()

    def _sent_unanswered(
        self,
        connection: Connection,
        request: ProduceRequest | MultiProduceRequest,
        entries: list[InFlight],
    ) -> None:
        """Send `request`, of ack NONE, and settle its batches: done once sent (the broker
        answers none), or failed with the error that kept it from going, raised."""
        try:
            connection.send_nowait(request)
        except PylogError as error:
            for entry in entries:
                entry.batch.settle(None, error)
            raise
        for entry in entries:
            entry.batch.settle(None)
            self._count_produced(entry.batch)

    def _drained_with(
        self, partition: int, every: bool = False
    ) -> tuple[Connection, list[int]] | None:
        """The connection to `partition`'s leader and the partitions to send it together:
        `partition`, then each other partition with an open batch that the same broker leads as
        last heard of (Kafka's drain per broker: once one batch is ready, every batch for that
        broker goes, full or not), but those whose last batch awaits its ack (`_busy`; all of
        them with `every`: flush), within MULTI_PRODUCE_BYTES and MAX_PARTS. None when there
        is no other, or the leader is not known now, or speaks no MULTI_PRODUCE."""
        if len(self._batches) < 2 or self.identity is not None:  # fixed: full batches only
            return None
        topic, cluster = self.topic, self.cluster
        holder = cluster.known_leader_connection(topic, partition)
        if holder is None or holder.endpoint in self._one_by_one:
            return None
        group, size = [partition], self._batches[partition].size
        for other, batch in self._batches.items():
            if len(group) >= MAX_PARTS:
                break
            if other == partition or size + batch.size > MULTI_PRODUCE_BYTES:
                continue
            if not every and self._busy(other):
                continue
            if cluster.known_leader_connection(topic, other) is holder:
                group.append(other)
                size += batch.size
        return (holder, group) if len(group) > 1 else None

    def _send_together(self, connection: Connection, partitions: list[int]) -> None:
        """Send the batches of `partitions` to `connection`, their leader, in one MULTI_PRODUCE
        (docs/protocol.md): each part is answered as its PRODUCE would be (_answered_together)."""
        entries = [self._close_batch(p) for p in partitions]
        request = MultiProduceRequest(
            self.ack,
            tuple(
                ProducePart(r.topic, r.partition, r.message_set, r.sequence)
                for r in (entry.request for entry in entries)
            ),
            entries[0].request.producer_id,
            entries[0].request.producer_epoch,
        )
        if self.ack is Ack.NONE:
            self._sent_unanswered(connection, request, entries)
            return
        try:
            correlation_id = connection.send_pipelined(request)
        except PylogError as error:  # AuthenticationFailed: none ever will reach that broker
            for entry in entries:
                self._give_up(entry, error)
            raise
        self._sent_together[connection, correlation_id] = list(entries)
        self._in_flight_on[connection] += 1
        for entry in entries:
            entry.sends += 1

    def _requests_in_flight(self) -> int:
        """How many requests (PRODUCE and MULTI_PRODUCE) await their reply."""
        return len(self._in_flight) + len(self._sent_together)

    def _wait_for_room(self) -> None:
        """Before a request goes: while max_in_flight await their replies, take replies (a
        full batch waits so; a lingered one does not come here: _send_lingering)."""
        if self._requests_in_flight() >= self.max_in_flight:
            while self._requests_in_flight() >= self.max_in_flight:
                self._receive_ack()
            self._take_acks_there()

    def _take_acks_there(self) -> None:
        """Take every ack already received, without waiting: the acks of one flush come
        together, and the batches their room lets go then leave together too (one wake-up of
        this client's, and the broker's, I/O threads for them all), not one per ack."""
        while waiting := self._requests_in_flight():
            self._receive_ack(0)
            if self._requests_in_flight() >= waiting:  # none there (a late reply, sent again)
                return

    def _publish_audit(self) -> None:
        """Send the audit records of the windows whose counts changed, acknowledged as flushed
        (every `audit_interval_s`, checked when a batch is sent, and on flush)."""
        assert self._audit is not None and self.produced is not None
        for record in self.produced.take_changed():
            self._audit.send(record.encode(), record.producer.encode())
        self._audit.flush()
        self._audit_due = self.clock.monotonic() + self._audit_interval_s

    def _holder(self, partition: int) -> Connection:
        """The connection to `partition`'s leader as last heard of (Cluster.leader_connection:
        a NOT_LEADER_FOR_PARTITION naming the new leader moves it there, any other error makes
        it ask METADATA)."""
        return self.cluster.leader_connection(self.topic, partition)

    def _dispatch(self, entry: InFlight, error: PylogError | None = None) -> None:
        """Send `entry` to the broker holding its partition. After `error`, or while that
        broker cannot be found (down), back off (0.1 s doubling to 2 s) and look again, while
        the batch's retry budget lasts; then fail the batch with the last error and raise it."""
        try:
            while True:
                if error is not None:
                    time.sleep(self._retry_wait(entry, error))
                    self.cluster.learn_from(self.topic, entry.request.partition, error)
                try:
                    connection = self._holder(entry.request.partition)
                except (BrokerError, Unavailable) as failure:
                    if not retriable(failure):
                        raise
                    error = failure
                    continue
                self._in_flight[connection, connection.send_pipelined(entry.request)] = entry
                self._in_flight_on[connection] += 1
                entry.sends += 1
                return
        except PylogError as failure:
            self._give_up(entry, failure)
            raise

    def _receive_ack(self, wait_s: float | None = None) -> None:
        """Wait for the next reply to a batch in flight. What a retriable error or a timeout
        lost is sent again, with a doubling back-off, while its retry budget lasts; a batch
        whose budget ran out is failed, and the first such error raised once every other lost
        batch is sent again. A `wait_s` shorter than the timeout that ends with no reply only
        returns (a Delivery's result(timeout) ran out, not the batch's reply)."""
        connections = self._in_flight_on.keys()
        timeout_s = (
            self.cluster.timeout_s if wait_s is None else min(wait_s, self.cluster.timeout_s)
        )
        try:
            connection, correlation_id, frames = self.cluster.receive_pipelined(
                connections, timeout_s
            )
        except Unavailable as error:  # no reply in time: every batch in flight may be lost
            if timeout_s < self.cluster.timeout_s:
                return
            for connection in list(connections):  # ask METADATA of others first
                self.cluster.note_silent(connection.endpoint)
            self._send_lost_again(error)
            return
        except AuthenticationFailed as error:  # none reached that broker; none ever will
            self._fail_in_flight(error)
            raise
        together = self._sent_together.pop((connection, correlation_id), None)
        if together is not None:
            self._landed(connection)
            self._answered_together(connection, together, frames)
            return
        if (connection, correlation_id) not in self._in_flight:
            return  # the late reply to a batch already sent again after a timeout
        entry = self._in_flight.pop((connection, correlation_id))
        self._landed(connection)
        try:
            reply = noted(decode_reply(Api.PRODUCE, frames, request_version(Api.PRODUCE)))
        except BrokerError as error:
            self._refused(entry, error)
            return
        self._acked(entry, reply)

    def _refused(self, entry: InFlight, error: BrokerError) -> None:
        """After `entry`'s partition answered `error`: send it again (where its partition is
        now, the batches its partition misses first), or fail it and raise."""
        try:
            if isinstance(error, UnknownProducerId | OutOfOrderSequence):
                missing = (
                    self._unknown_producer(entry, error)
                    if isinstance(error, UnknownProducerId)
                    else self._out_of_order(entry, error)
                )
                for lost in missing:  # first, at once
                    self._dispatch(self._take_in_flight(lost))
                self._dispatch(entry, error if missing else None)
                return
            if self._look_again_after(entry, error):
                if entry.request.partition < self.partitions:  # still there: send once more
                    self._dispatch(entry)
                    return
                raise error from None
            self._dispatch(entry, error)
        except PylogError as failure:
            if not entry.batch.done:
                self._give_up(entry, failure)
            raise

    def _answered_together(
        self, connection: Connection, entries: list[InFlight | None], frames: list[Buffer]
    ) -> None:
        """Take the reply to a MULTI_PRODUCE: each part's answer is its batch's, as a PRODUCE's
        reply would be. A broker that speaks no MULTI_PRODUCE gets the batches again one
        PRODUCE each, from now on; an error of the whole request is each batch's. Raises the
        first error that failed a batch for good, once every part is taken."""
        answers: list[ProduceReply | BrokerError]
        try:
            reply = noted(decode_reply(Api.MULTI_PRODUCE, frames))
        except BrokerError as error:
            if error.code == ErrorCode.UNSUPPORTED_API:  # an older broker: nothing was stored
                self._one_by_one.add(connection.endpoint)
                for entry in entries:
                    if entry is not None:
                        self._dispatch(entry)
                return
            answers = [error] * len(entries)
        else:
            if len(reply.parts) != len(entries):
                raise MalformedReply(
                    f"a MULTI_PRODUCE of {len(entries)} parts was answered {len(reply.parts)}"
                )
            answers = []
            for part in reply.parts:
                try:
                    answers.append(decode_part_reply(part))
                except BrokerError as error:
                    answers.append(error)
        failure: PylogError | None = None
        for entry, answer in zip(entries, answers, strict=True):
            if entry is None:  # taken out and sent again alone (it missed a sequence)
                continue
            if isinstance(answer, ProduceReply):
                self._acked(entry, answer)
                continue
            try:
                self._refused(entry, answer)
            except PylogError as error:
                failure = failure or error
        if failure is not None:
            raise failure

    def _take_in_flight(self, entry: InFlight) -> InFlight:
        """Take `entry` out of the batches awaiting a reply (to send it again)."""
        for key, waiting in self._in_flight.items():
            if waiting is entry:
                del self._in_flight[key]
                self._landed(key[0])
                return entry
        for entries in self._sent_together.values():
            for i, together in enumerate(entries):
                if together is entry:
                    entries[i] = None  # its part's answer, when it comes, is passed over
                    return entry
        return entry

    def _landed(self, connection: Connection) -> None:
        """Count one batch in flight on `connection` less."""
        self._in_flight_on[connection] -= 1
        if not self._in_flight_on[connection]:
            del self._in_flight_on[connection]

    def _fail_in_flight(self, error: AuthenticationFailed) -> None:
        """Fail every batch in flight to the broker that refused this client's handshake."""
        for key, entry in list(self._in_flight.items()):
            if key[0].endpoint == error.endpoint:
                del self._in_flight[key]
                self._landed(key[0])
                self._give_up(entry, error)
        for key, entries in list(self._sent_together.items()):
            if key[0].endpoint == error.endpoint:
                del self._sent_together[key]
                self._landed(key[0])
                for together in entries:
                    if together is not None:
                        self._give_up(together, error)

    def _send_lost_again(self, error: Unavailable) -> None:
        """After no reply in time, send every batch in flight again (they may be lost); raise
        the first error of those whose budget ran out once the others are sent."""
        lost = list(self._in_flight.values())
        lost += [e for entries in self._sent_together.values() for e in entries if e is not None]
        self._in_flight.clear()
        self._sent_together.clear()
        self._in_flight_on.clear()
        self._layout = None  # a broker may be down: ask where partitions are again
        failure: PylogError | None = None
        for entry in lost:
            try:
                self._dispatch(entry, error)
            except PylogError as spent:
                failure = failure or spent
        if failure is not None:
            raise failure

    @property
    def in_flight(self) -> int:
        """How many batches are sent and not yet acknowledged."""
        together = sum(e is not None for entries in self._sent_together.values() for e in entries)
        return len(self._in_flight) + together

    def poll(self, timeout_s: float = 0.0) -> list[ProduceAck]:
        """Send the batches whose linger has passed, take the acknowledgements that came
        (waiting up to `timeout_s` for one when none has and a batch is in flight), and return
        those received since the last poll or flush, in the order their batches were sent: a
        loop that sends and polls runs the Deliveries' done callbacks without waiting on any.
        Raises what sending raises (the batches it failed have the error too)."""
        self._send_lingering()
        waiting = self._requests_in_flight()
        if waiting:
            self._take_acks_there()
            if self._requests_in_flight() == waiting and timeout_s > 0:
                self._receive_ack(timeout_s)
                self._take_acks_there()
        return self._take_acks()

    def flush(self, timeout_s: float | None = None) -> list[ProduceAck]:
        """Send every open batch, wait for every acknowledgement (for at most `timeout_s`,
        when given: batches still in flight then are left in flight), and return those
        received since the last poll or flush, in the order their batches were sent."""
        deadline = math.inf if timeout_s is None else time.monotonic() + timeout_s
        for partition in list(self._batches):
            if partition in self._batches:  # not sent with another's already
                self._send_batch(partition, every=True)
        while self._requests_in_flight():
            left = deadline - time.monotonic()
            if left <= 0:
                return self._take_acks()
            self._receive_ack(None if left == math.inf else left)
        if self._audit is not None:
            self._publish_audit()
        return self._take_acks()

    def close(self) -> None:
        """Flush, then close the connection (fire-and-forget sets get a moment to go out)."""
        try:
            self.flush()
        finally:
            self.cluster.close()
            if self._audit is not None:
                self._audit.close()

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
            self.cluster.close()
