"""What a producer does without I/O (ProducerCore, shared by Producer and broker.aio's
AsyncProducer): its settings, values and keys, placement, the open batches and their linger,
the idempotent numbering of batches and the retry budget of one in flight.

Placement: a message sent with an explicit partition goes there. Otherwise, with the "hash"
partitioner (the default), a keyed message goes to xxh32(key) % partitions, so one key always
lands on one partition while the partition count stays the same, and a keyless message goes
round robin; "round_robin" and "random" spread every message that way, keys ignored. Spread
messages go to the partitions being served (METADATA error_code NONE) while there are any, so
a broker that is down does not stop keyless sends.

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

Values and keys are bytes (bytearray and memoryview too): anything else, a str above all, is a
TypeError from `send` naming the argument, unless the producer was given a `serializer` (for
values) or `key_serializer` (for keys, not called for None), a callable returning bytes.

Retry budget: a batch is sent again after each retriable error or lost reply, waiting 0.1 s
doubling to 2 s in between, for up to `delivery_timeout_s` (30 s by default, after Kafka's
delivery.timeout.ms) from its first sending, and at most `retries` times if that is given. It
spans a worker's restart: pylogd restarts a worker that died after 0.1 s doubling to 2 s
(broker.pool.MAX_BACKOFF_S; longer only in a crash loop), answering its partitions
PARTITION_UNAVAILABLE meanwhile. A batch whose budget runs out is dropped, and the last error
raised to the caller of `send` or `flush`. AuthenticationFailed (a Curve broker refused this
client's key, broker.client.connection) is no retriable error: it fails the batches at once.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import math
import random
import secrets
from collections.abc import Callable, Mapping
from typing import Any, Literal

import xxhash

from broker.backoff import Backoff
from broker.client.audit import WINDOW_MS, ProducedCounts, message_digest
from broker.client.batches import Batch, InFlight, MaybeStored, ProduceAck
from broker.client.cluster import partition_of
from broker.client.framing import (
    MAX_RETRY_BACKOFF_S,
    RETRY_BACKOFF_S,
    require_bytes,
)
from broker.clock import Clock
from broker.errors import (
    BrokerError,
    OutOfOrderSequence,
    PylogError,
    UnknownProducerId,
)
from broker.log.codec import compressed_sets, encode_message
from broker.log.compression import compressor_for
from broker.log.headers import HeaderItems
from broker.log.message import Buffer
from broker.protocol import (
    MAX_PARTS,
    Ack,
    ErrorCode,
    PartitionInfo,
    ProduceReply,
    ProduceRequest,
    broker_error,
)

DELIVERY_TIMEOUT_S = 30.0
"""How long a batch is sent again after retriable errors, by default: well above the longest wait
of pylogd before it restarts a worker (2 s, but in a crash loop) plus the worker's start."""
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


class ProducerCore:
    """What a producer does without I/O, shared by Producer and broker.aio's AsyncProducer:
    the settings, serializing and checking values and keys, placement, the open batches and
    their linger, the retry budget of a batch in flight, and the acknowledgements.

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
            timestamp_ms = int(self.clock.time() * 1000)  # counted in its window, as stored
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

    def _drain(
        self,
        partition: int,
        every: bool,
        leader_of: Callable[[str, int], object],
        holder: object,
    ) -> list[int]:
        """The partitions whose open batches go with `partition`'s in one request to its
        leader `holder`: `partition`, then each other partition with an open batch that
        `leader_of(topic, partition)` says `holder` leads (Kafka's drain per broker: once one
        batch is ready, every batch for that broker goes, full or not), but those whose last
        batch awaits its ack (`_busy`; all of them with `every`: flush), within
        MULTI_PRODUCE_BYTES and MAX_PARTS."""
        topic = self.topic
        group, size = [partition], self._batches[partition].size
        for other, batch in self._batches.items():
            if len(group) >= MAX_PARTS:
                break
            if other == partition or size + batch.size > MULTI_PRODUCE_BYTES:
                continue
            if not every and self._busy(other):
                continue
            if leader_of(topic, other) is holder:
                group.append(other)
                size += batch.size
        return group

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
        deadline = self.clock.monotonic() + self.delivery_timeout_s
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
        if spent or self.clock.monotonic() + backoff_s > entry.deadline:
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
