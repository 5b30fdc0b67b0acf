"""A producer: messages to the partitions of one topic, in batches.

Brokers: `endpoint` bootstraps (broker.client.cluster): each batch goes to its partition's
leader as last heard of, over that broker's connection. Once a batch is ready (full, or
lingered), every open batch whose partition the same broker leads goes with it, ready or not,
in one MULTI_PRODUCE (docs/protocol.md; Kafka's drain per broker): keys spread over many
partitions cost a request per broker a round, not one per partition. Each part is answered,
retried and deduplicated as its own PRODUCE would be; a broker that speaks no MULTI_PRODUCE
gets a PRODUCE a batch. NOT_LEADER_FOR_PARTITION naming a broker the producer knows (leadership
moved: docs/replication.md) sends the batch there next; UNKNOWN_TOPIC_OR_PARTITION, any other
retriable error (NOT_ENOUGH_REPLICAS with ack ALL: the in-sync set is smaller than
min_insync_replicas for now) or a timeout makes the producer ask METADATA again before it
resends. Either way after the back-off of its retry budget (broker.client.producer_core),
within that budget; max_in_flight=1 keeps the order.

Acknowledgements (ack WRITTEN or FLUSHED): up to `max_in_flight` requests (a PRODUCE of one
batch or a MULTI_PRODUCE of several) await their replies at once (pipelining, on the
connection's pipelined channel). A full batch waits for the oldest reply while that many do; a
lingered one does not go then, and goes on filling (looked at again a linger later), so that
batches grow while the broker is busy. `flush` waits for all. A batch that meets a retriable
error or no reply in time is sent again, so delivery is at least once; with more than one batch
in flight a batch sent again may land after batches sent later (max_in_flight=1 keeps the order
of a partition's batches). With ack NONE nothing is awaited and no error is ever seen.

Idempotence, a fixed identity, batching, and values and keys are the producer's core's
(broker.client.producer_core, shared with broker.aio's AsyncProducer); a message's Delivery
and the batches in flight are broker.client.batches'.

Not safe to share between threads.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Mapping, Sequence
from types import TracebackType
from typing import Any, Self

from broker.client.audit import AuditPublisher, ProducedCounts
from broker.client.batches import (
    Batch,
    Delivery,
    InFlight,
    ProduceAck,
    RequestsInFlight,
    multi_produce_answers,
)
from broker.client.cluster import Cluster, partition_of
from broker.client.connection import Connection
from broker.client.framing import DEFAULT_CLIENT_ID, noted, retriable
from broker.client.producer_core import (
    DELIVERY_TIMEOUT_S,
    METADATA_MAX_AGE_S,
    Partitioner,
    ProducerCore,
    Serializer,
)
from broker.client.transport import Transport
from broker.clock import Clock
from broker.errors import (
    AuthenticationFailed,
    BrokerError,
    OutOfOrderSequence,
    PylogError,
    Unavailable,
    UnknownProducerId,
)
from broker.log.headers import HeaderItems
from broker.log.message import Buffer
from broker.protocol import (
    Ack,
    Api,
    MultiProduceRequest,
    PartitionInfo,
    ProducePart,
    ProduceReply,
    ProduceRequest,
    decode_reply,
    request_version,
)
from broker.security import ClientKeys

METADATA_RETRIES = 5
"""Retries of a METADATA request when `retries` is not given."""


class Producer(ProducerCore):
    """Send messages to `topic` on the cluster that `endpoint` (one or more, comma-separated)
    belongs to.

    `send()` returns a Delivery: its `result(timeout)` is the message's offset (see the module's
    text). `flush()` sends every open batch and returns the acknowledgements received since the
    last flush (every batch sent meanwhile, by `send` too); `close()` flushes first.

    `transport` carries the requests (broker.client.transport; default: ZeroMQ sockets of its
    own; a MemoryTransport answers them in memory, for unit tests). `clock` measures linger,
    the layout's age and delivery_timeout_s (default: the transport's clock, which times the
    waits for replies and between retries).

    A batch that meets a retriable error or no reply within `timeout_s` is sent again until
    `delivery_timeout_s` have passed since its first sending (no new attempt starts later; the
    last one still gets its `timeout_s`), and at most `retries` times when that is not None
    (`pylogctl produce` gives 1, to fail fast). The default outlasts a worker's restart by
    pylogd (producer_core's "Retry budget"); a shorter one fails sends while a worker restarts.

    `audit_topic`: count the messages acknowledged (handed over, with ack NONE) per hour of
    their timestamps, and publish the running totals to that topic (broker.client.audit) every
    `audit_interval_s`, checked when a batch is sent, and on every flush and close, for
    `pipeline.audit --audit-topic` to compare with what was stored and loaded.

    `keys` (broker.security.ClientKeys: the client's key pair and the broker's public key)
    reach brokers serving CurveZMQ (docs/security.md), the audit topic's too; without them
    the producer speaks plaintext.
    """

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
        clock: Clock | None = None,
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
        transport: Transport | None = None,
    ) -> None:
        metadata_retries = METADATA_RETRIES if retries is None else retries
        self.cluster = Cluster(
            endpoint, client_id, timeout_s, metadata_retries, keys=keys, transport=transport
        )
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
            self.cluster.clock if clock is None else clock,
            serializer,
            key_serializer,
            compression,
            compression_level,
            metadata_max_age_s,
            idempotence,
            identity,
        )
        self._requests = RequestsInFlight()
        self._one_by_one: set[str] = set()
        """Endpoints that answered MULTI_PRODUCE UNSUPPORTED_API (older): a PRODUCE a batch."""
        self._audit: AuditPublisher | None = None
        if audit_topic is not None:
            if audit_topic == topic:
                raise ValueError(f"audit_topic {audit_topic!r} is the topic audited")
            self.produced = ProducedCounts(topic)
            sink = Producer(
                endpoint,
                audit_topic,
                client_id=client_id,
                timeout_s=timeout_s,
                keys=keys,
                transport=transport,  # a given one is shared; else the sink has its own
            )
            self._audit = AuditPublisher(sink, self.produced, audit_interval_s, self.clock)

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
        if self.ack is not Ack.NONE and len(self._requests):
            self._take_acks_there()  # which batches are answered: _busy
            if len(self._requests) >= self.max_in_flight:
                self._linger_deadline = now + self.linger_s
                return
        for lingering in self._lingering():
            if lingering in self._batches:  # not sent with another's already
                self._send_batch(lingering)

    def _settle(self, batch: Batch, timeout: float | None) -> None:
        """Send `batch` if still open, and any whose linger has passed, then take replies until
        it is done, nothing is in flight or `timeout` seconds have passed. An error met on the
        way is left to the handles of the batches it failed."""
        with contextlib.suppress(PylogError):
            if self._batches.get(batch.partition) is batch:
                self._send_batch(batch.partition)
            self._send_lingering()
            self._take_replies(lambda: batch.done, timeout)

    def _take_replies(self, done: Callable[[], bool], timeout_s: float | None) -> None:
        """Take replies until `done()`, none is in flight or `timeout_s` (None: ever) passed."""
        waits = self.cluster.clock
        deadline = math.inf if timeout_s is None else waits.monotonic() + timeout_s
        while not done() and len(self._requests) and (left := deadline - waits.monotonic()) > 0:
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
        if self._audit is not None and self._audit.due():
            self._audit.publish()

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
        """The connection to `partition`'s leader and the partitions to send it together
        (ProducerCore._drain); None when there is no other, or the leader is not known now,
        or speaks no MULTI_PRODUCE."""
        if len(self._batches) < 2 or self.identity is not None:  # fixed: full batches only
            return None
        holder = self.cluster.known_leader_connection(self.topic, partition)
        if holder is None or holder.endpoint in self._one_by_one:
            return None
        group = self._drain(partition, every, self.cluster.known_leader_connection, holder)
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
        self._requests.add_together(connection, correlation_id, entries)
        for entry in entries:
            entry.sends += 1

    def _wait_for_room(self) -> None:
        """Before a request goes: while max_in_flight await their replies, take replies (a
        full batch waits so; a lingered one does not come here: _send_lingering)."""
        if len(self._requests) >= self.max_in_flight:
            while len(self._requests) >= self.max_in_flight:
                self._receive_ack()
            self._take_acks_there()

    def _take_acks_there(self) -> None:
        """Take every ack already received, without waiting: the acks of one flush come
        together, and the batches their room lets go then leave together too (one wake-up of
        this client's, and the broker's, I/O threads for them all), not one per ack."""
        while waiting := len(self._requests):
            self._receive_ack(0)
            if len(self._requests) >= waiting:  # none there (a late reply, sent again)
                return

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
                    self.cluster.clock.sleep(self._retry_wait(entry, error))
                    self.cluster.learn_from(self.topic, entry.request.partition, error)
                try:
                    connection = self._holder(entry.request.partition)
                except (BrokerError, Unavailable) as failure:
                    if not retriable(failure):
                        raise
                    error = failure
                    continue
                self._requests.add(connection, connection.send_pipelined(entry.request), entry)
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
        connections = self._requests.connections()
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
        entry = self._requests.pop(connection, correlation_id)
        if entry is None:
            return  # the late reply to a batch already sent again after a timeout
        if isinstance(entry, list):
            self._answered_together(connection, entry, frames)
            return
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
                    self._requests.take(lost)
                    self._dispatch(lost)
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
        answers = multi_produce_answers(frames, len(entries))
        if answers is None:  # an older broker: nothing was stored
            self._one_by_one.add(connection.endpoint)
            for entry in entries:
                if entry is not None:
                    self._dispatch(entry)
            return
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

    def _fail_in_flight(self, error: AuthenticationFailed) -> None:
        """Fail every batch in flight to the broker that refused this client's handshake."""
        for entry in self._requests.take_to(error.endpoint):
            self._give_up(entry, error)

    def _send_lost_again(self, error: Unavailable) -> None:
        """After no reply in time, send every batch in flight again (they may be lost); raise
        the first error of those whose budget ran out once the others are sent."""
        lost = self._requests.take_all()
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
        return self._requests.batches()

    def poll(self, timeout_s: float = 0.0) -> list[ProduceAck]:
        """Send the batches whose linger has passed, take the acknowledgements that came
        (waiting up to `timeout_s` for one when none has and a batch is in flight), and return
        those received since the last poll or flush, in the order their batches were sent: a
        loop that sends and polls runs the Deliveries' done callbacks without waiting on any.
        Raises what sending raises (the batches it failed have the error too)."""
        self._send_lingering()
        waiting = len(self._requests)
        if waiting:
            self._take_acks_there()
            if len(self._requests) == waiting and timeout_s > 0:
                self._receive_ack(timeout_s)
                self._take_acks_there()
        return self._take_acks()

    def flush(self, timeout_s: float | None = None) -> list[ProduceAck]:
        """Send every open batch, wait for every acknowledgement (for at most `timeout_s`,
        when given: batches still in flight then are left in flight), and return those
        received since the last poll or flush, in the order their batches were sent."""
        for partition in list(self._batches):
            if partition in self._batches:  # not sent with another's already
                self._send_batch(partition, every=True)
        self._take_replies(lambda: False, timeout_s)
        if self._audit is not None and not len(self._requests):
            self._audit.publish()
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
