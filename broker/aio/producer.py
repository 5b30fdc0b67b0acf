"""A producer on asyncio: broker.client.Producer's rules, awaited.

Serializing, placement, batching, the retry budget of a batch and acknowledgements are
broker.client.producer_core's (ProducerCore), so are the settings and their defaults. What differs:

- `send` is a coroutine: it may ask METADATA, and when `max_in_flight` batches are in flight
  it waits for the oldest (back-pressure). It returns an AsyncDelivery: `await delivery` (or
  `await delivery.result(timeout)`) is the message's offset, or raises the error that failed
  its batch; DeliveryUnknown with ack NONE, as the sync handle.
- Each batch sent is a task of its own that waits for its reply and sends it again after a
  retriable error or a timeout (0.1 s doubling to 2 s, within `delivery_timeout_s` and
  `retries`), so batches of different partitions wait in parallel; a batch's outcome is set on
  its messages' handles when the task ends.
- Linger is a timer: an open batch is sent `linger_ms` after its first message even if nothing
  else is sent (the sync producer checks linger on each send and flush); it waits for room
  while `max_in_flight` batches are in flight, so that max_in_flight=1 keeps the order of a
  partition's batches, as the sync producer's does.
- Each batch goes to its partition's leader as last heard of (AsyncCluster.leader_connection);
  NOT_LEADER_FOR_PARTITION naming a known broker sends it there next, any other retriable
  error (NOT_ENOUGH_REPLICAS, no reply in time, ...) asks METADATA again first.
- `send` (when it waits for room) and `flush` raise the error of a failed batch, once, as the
  sync producer raises what it meets; the handles of that batch hold it too. Cancelling a
  `send`, `flush` or `await delivery` cancels the wait only, never a batch in flight.

Not safe to share between event loops (or threads).
"""

from __future__ import annotations

import asyncio
from collections.abc import Generator, Mapping
from types import TracebackType
from typing import Any, Self

from broker.aio.connection import AsyncCluster, AsyncConnection
from broker.client.batches import Batch, Handle, InFlight, ProduceAck
from broker.client.framing import DEFAULT_CLIENT_ID, noted
from broker.client.producer import METADATA_RETRIES
from broker.client.producer_core import (
    DELIVERY_TIMEOUT_S,
    METADATA_MAX_AGE_S,
    Partitioner,
    ProducerCore,
    Serializer,
)
from broker.clock import SYSTEM_CLOCK
from broker.errors import (
    BrokerError,
    OutOfOrderSequence,
    PylogError,
    Unavailable,
    UnknownProducerId,
)
from broker.log.headers import HeaderItems
from broker.protocol import Ack, Api, PartitionInfo, ProduceReply, decode_reply, request_version
from broker.security import ClientKeys


class AsyncDelivery(Handle):
    """The fate of one message given to AsyncProducer.send: `await delivery` is its offset, or
    raises the error that failed its batch. `done()`, `partition` and `add_done_callback(fn)`
    as the sync Delivery."""

    __slots__ = ("_producer",)

    def __init__(self, producer: AsyncProducer, batch: Batch, position: int) -> None:
        self._producer = producer
        self._batch = batch
        self._position = position

    async def result(self, timeout: float | None = None) -> int:
        """The message's offset (its batch is sent now if still open); raises the error that
        failed its batch, TimeoutError when not done within `timeout` seconds,
        DeliveryUnknown with ack NONE."""
        return (await self._settled(timeout)).offset(self._position)

    async def exception(self, timeout: float | None = None) -> PylogError | None:
        """The error that failed the message's batch, or None; TimeoutError as `result`."""
        return (await self._settled(timeout)).error

    def __await__(self) -> Generator[Any, None, int]:
        return self.result().__await__()

    async def _settled(self, timeout: float | None) -> Batch:
        if not self._batch.done:
            await self._producer._settle(self._batch, timeout)
            if not self._batch.done:
                raise TimeoutError(f"the message's batch was not acknowledged in {timeout} s")
        return self._batch


class AsyncProducer(ProducerCore):
    """Send messages to `topic` on the cluster that `endpoint` (one or more, comma-separated)
    belongs to, on asyncio: `async with AsyncProducer(...) as producer: delivery = await
    producer.send(b"x")`. Settings as broker.client.Producer's (linger is a timer of the event
    loop; `keys` reach brokers serving CurveZMQ; `compression` and `compression_level` make
    each batch one compressed set)."""

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
        serializer: Serializer | None = None,
        key_serializer: Serializer | None = None,
        *,
        keys: ClientKeys | None = None,
        compression: str = "none",
        compression_level: int | None = None,
        metadata_max_age_s: float = METADATA_MAX_AGE_S,
        idempotence: bool = True,
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
            SYSTEM_CLOCK,
            serializer,
            key_serializer,
            compression,
            compression_level,
            metadata_max_age_s,
            idempotence,
        )
        metadata_retries = METADATA_RETRIES if retries is None else retries
        self.cluster = AsyncCluster(endpoint, client_id, timeout_s, metadata_retries, keys=keys)
        self._sending: dict[Batch, asyncio.Task[None]] = {}
        """Each batch sent and not yet reaped (its error raised), in the order sent."""
        self._room = asyncio.Semaphore(max_in_flight)
        """Taken by a batch's task while it is in flight, first come first served: a batch
        sent by its linger waits for room too, so max_in_flight=1 keeps a partition's batches
        in order even when one is sent again (after NOT_LEADER_FOR_PARTITION, ...)."""

    async def partitions(self) -> int:
        """How many partitions the topic has (asked once, then again after errors)."""
        return len(await self._partition_layout())

    async def _partition_layout(self) -> tuple[PartitionInfo, ...]:
        layout = self._fresh_layout()
        if layout is None:
            return self._learn_layout(await self.cluster.partitions(self.topic))
        return layout

    async def send(
        self,
        value: Any,
        key: Any = None,
        timestamp_ms: int | None = None,
        partition: int | None = None,
        headers: HeaderItems | Mapping[str, bytes | None] | None = None,
    ) -> AsyncDelivery:
        """Add a message to its partition's batch and return its AsyncDelivery; send the batch
        if it is full, then wait while `max_in_flight` batches are in flight. Raises the error
        of a failed batch met while waiting, and TypeError, nothing sent, for a value or key
        that is not bytes (nor made bytes by the serializers). `headers` as Producer.send's."""
        layout = await self._partition_layout()
        batch, position, full = self._add(layout, value, key, timestamp_ms, partition, headers)
        if full:
            self._launch(batch.partition)
            await self._reap(self.max_in_flight - 1)
        elif position == 0:
            asyncio.get_running_loop().call_later(self.linger_s, self._lingered, batch)
        return AsyncDelivery(self, batch, position)

    def _lingered(self, batch: Batch) -> None:
        if self._batches.get(batch.partition) is batch:
            self._launch(batch.partition)

    def _launch(self, partition: int) -> None:
        """Send `partition`'s open batch, in a task of its own."""
        entry = self._close_batch(partition)
        self._sending[entry.batch] = asyncio.get_running_loop().create_task(self._deliver(entry))

    async def _reap(self, keep: int) -> None:
        """Wait until at most `keep` batches are in flight, forgetting those done; raises the
        error of the first failed one met."""
        while self._sending:
            batch, task = next(iter(self._sending.items()))
            if len(self._sending) <= keep and not task.done():
                return
            await asyncio.wait([task])  # a cancelled wait leaves the batch's task running
            del self._sending[batch]
            task.result()

    async def _settle(self, batch: Batch, timeout: float | None) -> None:
        """Send `batch` if still open, then wait up to `timeout` seconds for its outcome."""
        if self._batches.get(batch.partition) is batch:
            self._launch(batch.partition)
        task = self._sending.get(batch)
        if task is not None:
            await asyncio.wait([task], timeout=timeout)

    async def _deliver(self, entry: InFlight) -> None:
        """Send a batch until acknowledged, or its budget is spent; its outcome on its
        handles."""
        async with self._room:
            await self._deliver_in_room(entry)

    async def _deliver_in_room(self, entry: InFlight) -> None:
        batch = entry.batch
        try:
            if self.ack is Ack.NONE:
                request = entry.request
                await (await self._holder(request.partition)).send_nowait(request)
                batch.settle(None)
                return
            error: PylogError | None = None
            while True:
                request = entry.request  # numbered again after OUT_OF_ORDER_SEQUENCE, maybe
                if error is not None:
                    await asyncio.sleep(self._retry_wait(entry, error))
                    self.cluster.learn_from(self.topic, request.partition, error)
                connection: AsyncConnection | None = None
                try:
                    connection = await self._holder(request.partition)
                    entry.sends += 1
                    frames = await connection.exchange(request)
                    reply: ProduceReply = noted(
                        decode_reply(Api.PRODUCE, frames, request_version(Api.PRODUCE))
                    )
                except BrokerError as failure:
                    if isinstance(failure, UnknownProducerId):
                        # numbered again, it goes at once; else after its first set, sent again
                        error = failure if self._unknown_producer(entry, failure) else None
                        continue
                    if self._look_again_after(entry, failure):
                        if request.partition < len(await self._partition_layout()):
                            error = None  # still there: send once more
                            continue
                        raise
                    if isinstance(failure, OutOfOrderSequence) and not self._out_of_order(
                        entry, failure
                    ):
                        error = None  # numbered again: it goes at once
                        continue
                    error = failure  # the batches it follows are being sent again
                    continue
                except Unavailable as failure:
                    if connection is not None:  # no reply: ask METADATA of others first
                        self.cluster.note_silent(connection.endpoint)
                    error = failure
                    continue
                self._acked(entry, reply)
                return
        except PylogError as failure:
            self._give_up(entry, failure)
            raise

    async def _holder(self, partition: int) -> AsyncConnection:
        """The connection to `partition`'s leader as last heard of
        (AsyncCluster.leader_connection)."""
        return await self.cluster.leader_connection(self.topic, partition)

    async def flush(self) -> list[ProduceAck]:
        """Send every open batch, wait for every acknowledgement, and return those received
        since the last flush, in the order their batches were sent."""
        for partition in list(self._batches):
            self._launch(partition)
        await self._reap(0)
        return self._take_acks()

    async def close(self) -> None:
        """Flush, then close the connections."""
        try:
            await self.flush()
        finally:
            await self.cluster.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if exc is None:
            await self.close()
            return
        for task in self._sending.values():
            task.cancel()
        await self.cluster.close()
