"""A producer's batches and what a message sent is given back: the Batch its messages go in,
its Delivery (a future of the message's offset), the acknowledgement of a batch, and a batch
in flight. Shared by Producer and broker.aio's AsyncProducer.

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
"""

from __future__ import annotations

import logging
from bisect import bisect_right
from collections import Counter
from collections.abc import Callable, KeysView
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, Self

from broker.client.framing import noted
from broker.errors import BrokerError, MalformedReply, PylogError
from broker.log.message import Buffer
from broker.protocol import (
    Api,
    ErrorCode,
    ProduceReply,
    ProduceRequest,
    decode_part_reply,
    decode_reply,
)

if TYPE_CHECKING:
    from broker.client.connection import Connection

log = logging.getLogger(__name__)


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


class Settles(Protocol):
    """What drives a Delivery's batch to its outcome: its producer (Producer._settle)."""

    def _settle(self, batch: Batch, timeout: float | None) -> None: ...


class Delivery(Handle):
    """The fate of one message given to Producer.send (see the module's text): `result()` is its
    offset, or raises the error that failed its batch."""

    __slots__ = ("_producer",)

    def __init__(self, producer: Settles, batch: Batch, position: int) -> None:
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
    """No sending again after this (its producer's clock): first sending + delivery_timeout_s."""
    attempts: int = 0
    looked_again: bool = False
    sends: int = 0
    """How many times it was sent: once more than once, an earlier sending may have been
    stored with its reply lost (UNKNOWN_PRODUCER_ID then fails it: `_renumber_unsent`)."""


class RequestsInFlight:
    """A producer's requests awaiting their replies, by (connection, correlation id): a
    PRODUCE's batch, or a MULTI_PRODUCE's batches in its parts' order (None for one taken out
    to be sent again alone); and how many each connection carries, kept as they change (the
    connections to wait on, without a walk of the table an ack). `len()` counts requests."""

    __slots__ = ("_alone", "_on", "_together")

    def __init__(self) -> None:
        self._alone: dict[tuple[Connection, int], InFlight] = {}
        self._together: dict[tuple[Connection, int], list[InFlight | None]] = {}
        self._on: Counter[Connection] = Counter()

    def __len__(self) -> int:
        return len(self._alone) + len(self._together)

    def batches(self) -> int:
        """How many batches await their replies."""
        together = sum(e is not None for entries in self._together.values() for e in entries)
        return len(self._alone) + together

    def connections(self) -> KeysView[Connection]:
        """The connections that carry a request awaiting its reply (a live view)."""
        return self._on.keys()

    def add(self, connection: Connection, correlation_id: int, entry: InFlight) -> None:
        self._alone[connection, correlation_id] = entry
        self._on[connection] += 1

    def add_together(
        self, connection: Connection, correlation_id: int, entries: list[InFlight]
    ) -> None:
        self._together[connection, correlation_id] = list(entries)
        self._on[connection] += 1

    def pop(
        self, connection: Connection, correlation_id: int
    ) -> InFlight | list[InFlight | None] | None:
        """Take out the request that reply `correlation_id` of `connection` answers: its batch,
        or its batches (a MULTI_PRODUCE's); None for a reply to none (a late one, to a request
        sent again after a timeout)."""
        key = (connection, correlation_id)
        found = self._together.pop(key, None) or self._alone.pop(key, None)
        if found is not None:
            self._landed(connection)
        return found

    def take(self, entry: InFlight) -> None:
        """Take `entry` out (to send it again): the answer to its request, when it comes, is
        passed over."""
        for key, waiting in self._alone.items():
            if waiting is entry:
                del self._alone[key]
                self._landed(key[0])
                return
        for entries in self._together.values():
            for i, together in enumerate(entries):
                if together is entry:
                    entries[i] = None
                    return

    def take_to(self, endpoint: str) -> list[InFlight]:
        """Take out every request to the broker at `endpoint`: their batches."""
        taken: list[InFlight] = []
        for key in [key for key in self._alone if key[0].endpoint == endpoint]:
            taken.append(self._alone.pop(key))
            self._landed(key[0])
        for key in [key for key in self._together if key[0].endpoint == endpoint]:
            taken += [e for e in self._together.pop(key) if e is not None]
            self._landed(key[0])
        return taken

    def take_all(self) -> list[InFlight]:
        """Take out every request: their batches, in the order they were sent."""
        taken = list(self._alone.values())
        taken += [e for entries in self._together.values() for e in entries if e is not None]
        self._alone.clear()
        self._together.clear()
        self._on.clear()
        return taken

    def _landed(self, connection: Connection) -> None:
        self._on[connection] -= 1
        if not self._on[connection]:
            del self._on[connection]


def multi_produce_answers(
    frames: list[Buffer], parts: int
) -> list[ProduceReply | BrokerError] | None:
    """Each part's answer in the reply to a MULTI_PRODUCE of `parts` parts: its ProduceReply,
    or the BrokerError it was answered (the request refused whole: each part that error); None
    when the broker speaks no MULTI_PRODUCE (UNSUPPORTED_API: nothing was stored).
    MalformedReply for a reply of another number of parts."""
    try:
        reply = noted(decode_reply(Api.MULTI_PRODUCE, frames))
    except BrokerError as error:
        if error.code == ErrorCode.UNSUPPORTED_API:
            return None
        return [error] * parts
    if len(reply.parts) != parts:
        raise MalformedReply(f"a MULTI_PRODUCE of {parts} parts was answered {len(reply.parts)}")
    answers: list[ProduceReply | BrokerError] = []
    for part in reply.parts:
        try:
            answers.append(decode_part_reply(part))
        except BrokerError as error:
            answers.append(error)
    return answers
