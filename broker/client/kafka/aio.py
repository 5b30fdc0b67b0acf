"""confluent_kafka.aio's shape: `AIOProducer` and `AIOConsumer`, the Kafka-shaped Producer and
Consumer of broker.client.kafka awaited from asyncio, for programs written for
confluent-kafka's asyncio clients.

Each client runs its Producer or Consumer in one thread of its own (its ZeroMQ sockets belong
to that thread), one call after another in the order made; awaiting a call never blocks the
event loop. `await producer.produce(...)` returns an asyncio future that resolves to the
delivered Message (or raises KafkaException with the delivery's error): the thread serves
the delivery reports whenever messages are waiting for theirs. A consumer's rebalance
callbacks (`on_assign`, `on_revoke`, `on_lost`) are coroutine functions run on the event loop
while its poll waits for them; the calls they await on the consumer (incremental_assign,
pause, commit, ...) run in the consumer's thread meanwhile, as confluent-kafka's do.

Transactions are refused at once, as by the Producer (pylog has none: docs/clients.md).
"""

from __future__ import annotations

import asyncio
import inspect
import queue
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Final, NoReturn, Self, TypeVar

from broker.client.kafka.consumer import Consumer
from broker.client.kafka.errors import NO_TRANSACTIONS, KafkaError, KafkaException, not_implemented
from broker.client.kafka.messages import ClusterMetadata, DeliveryCallback, Message, TopicPartition
from broker.client.kafka.producer import Producer

T = TypeVar("T")

_Job = tuple[
    Callable[..., Any],
    tuple[Any, ...],
    dict[str, Any],
    asyncio.AbstractEventLoop,
    asyncio.Future[Any],
]
"""A call for the client's thread: the function, its arguments, and the loop and future its
outcome goes to."""

DELIVERY_WAIT_S: Final = 0.005
"""How long the producer's thread waits for acknowledgements at a time while messages wait for
theirs, between the calls it is given."""


class _ClientThread:
    """The one thread a client's sync Producer or Consumer is used from. `idle()`, when given,
    runs while no call is waiting, as long as it returns True (it has more to wait for)."""

    def __init__(self, name: str, idle: Callable[[], bool] | None = None) -> None:
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._nested: queue.SimpleQueue[_Job | None] | None = None
        """While a rebalance callback runs on the loop: where the calls it makes go, taken by
        the thread that waits for the callback (its poll)."""
        self._idle = idle
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    async def call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """`fn(*args, **kwargs)` in the thread, awaited."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        (self._nested or self._jobs).put((fn, args, kwargs, loop, future))
        return await future

    def _run(self) -> None:
        busy = False
        while True:
            try:
                job = self._jobs.get_nowait() if busy else self._jobs.get()
            except queue.Empty:
                busy = self._idle is not None and self._idle()
                continue
            if job is None:
                return
            self._do(job)
            busy = self._idle is not None

    @staticmethod
    def _do(job: _Job) -> None:
        fn, args, kwargs, loop, future = job
        try:
            outcome = fn(*args, **kwargs)
        except BaseException as error:
            loop.call_soon_threadsafe(_settle, future, None, error)
        else:
            loop.call_soon_threadsafe(_settle, future, outcome, None)

    def run_callback(self, loop: asyncio.AbstractEventLoop, callback: Awaitable[object]) -> object:
        """In the thread: run `callback` on `loop`, doing the calls it makes meanwhile, and
        return its outcome."""
        nested: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        outer, self._nested = self._nested, nested

        async def guarded() -> object:
            try:
                return await callback
            finally:  # on the loop, before any other task can queue a call there
                self._nested = outer
                nested.put(None)

        outcome = asyncio.run_coroutine_threadsafe(guarded(), loop)
        while (job := nested.get()) is not None:
            self._do(job)
        return outcome.result()

    def stop(self) -> None:
        """End the thread once the calls queued are done."""
        self._jobs.put(None)


def _settle(future: asyncio.Future[Any], outcome: Any, error: BaseException | None) -> None:
    if future.done():  # its awaiting task was cancelled
        return
    if error is None:
        future.set_result(outcome)
    else:
        future.set_exception(error)


def _workers(max_workers: int, executor: object) -> None:
    if executor is not None:
        raise KafkaException(
            "executor: a pylog client runs in one thread of its own (its sockets belong to it)"
        )
    if max_workers < 1:
        raise ValueError("max_workers must be at least 1")


@dataclass(slots=True)
class _Produced:
    """A message given to AIOProducer.produce, until handed to the Producer."""

    topic: str
    value: Any
    key: Any
    partition: int
    on_delivery: DeliveryCallback | None
    timestamp: int
    headers: Any
    delivered: asyncio.Future[Message]


class AIOProducer:
    """confluent_kafka.aio.AIOProducer's shape over broker.client.kafka.Producer (module
    docstring). `max_workers` is taken (1 or more) and `batch_size` bounds how many messages
    produced meanwhile are handed to the thread at once; messages never wait in a buffer of
    this class (`buffer_timeout` taken for that reason): the Producer's `linger.ms` batches
    them."""

    def __init__(
        self,
        producer_conf: dict[str, Any],
        max_workers: int = 4,
        executor: object = None,
        batch_size: int = 1000,
        buffer_timeout: float = 1.0,
    ) -> None:
        _workers(max_workers, executor)
        if batch_size < 1:
            raise ValueError("batch_size must be at least 1")
        self._loop = asyncio.get_running_loop()
        self._producer = Producer(producer_conf)
        self._batch_size = batch_size
        self._waiting: list[_Produced] = []
        """Messages produced and not yet handed to the thread."""
        self._handing = False
        self._lock = threading.Lock()
        self._thread = _ClientThread("pylog-aio-producer", self._serve_deliveries)
        self._closed = False

    def _serve_deliveries(self) -> bool:
        self._producer.poll(DELIVERY_WAIT_S)
        return len(self._producer) > 0

    async def produce(
        self,
        topic: str,
        value: Any = None,
        key: Any = None,
        partition: int = -1,
        on_delivery: DeliveryCallback | None = None,
        timestamp: int = 0,
        headers: Any = None,
        *,
        callback: DeliveryCallback | None = None,
    ) -> asyncio.Future[Message]:
        """Produce a message as Producer.produce does; returns a future of the delivered
        Message, whose error is the KafkaException of its delivery report (or of a refusal: an
        unknown topic, a bad value). `on_delivery` (or `callback`) also runs, in the client's
        thread."""
        self._check_open()
        delivered: asyncio.Future[Message] = self._loop.create_future()
        message = _Produced(
            topic, value, key, partition, on_delivery or callback, timestamp, headers, delivered
        )
        with self._lock:
            self._waiting.append(message)
            start = not self._handing
            self._handing = True
            full = len(self._waiting) >= self._batch_size
        if start or full:
            await self._thread.call(self._hand_over)
        return delivered

    def _hand_over(self) -> None:
        """In the thread: produce what waits, each message's report settling its future."""
        with self._lock:
            waiting, self._waiting = self._waiting, []
            self._handing = False
        for m in waiting:
            try:
                self._producer.produce(
                    m.topic,
                    m.value,
                    m.key,
                    m.partition,
                    self._report(m.delivered, m.on_delivery),
                    m.timestamp,
                    m.headers,
                )
            except (KafkaException, TypeError, ValueError) as error:
                self._loop.call_soon_threadsafe(_settle, m.delivered, None, error)

    def _report(
        self,
        delivered: asyncio.Future[Message],
        callback: DeliveryCallback | None,
    ) -> DeliveryCallback:
        def report(error: KafkaError | None, message: Message) -> None:
            if callback is not None:
                callback(error, message)
            failure = None if error is None else KafkaException(error)
            self._loop.call_soon_threadsafe(_settle, delivered, message, failure)

        return report

    async def poll(self, timeout: float = 0) -> int:
        """Serve delivery reports, waiting up to `timeout` seconds for one (they are served
        anyway while messages wait: their futures resolve without it)."""
        return await self._thread.call(self._producer.poll, timeout)

    async def flush(self, timeout: float | None = None) -> int:
        """Hand over and deliver every message produced; how many are still waiting."""
        await self._thread.call(self._hand_over)
        return await self._thread.call(self._producer.flush, timeout)

    def __len__(self) -> int:
        return len(self._waiting) + len(self._producer)

    async def list_topics(self, topic: str | None = None, timeout: float = -1) -> ClusterMetadata:
        return await self._thread.call(self._producer.list_topics, topic, timeout)

    async def _no_transactions(self, *args: Any, **kwargs: Any) -> NoReturn:
        raise not_implemented(NO_TRANSACTIONS)

    init_transactions = begin_transaction = commit_transaction = abort_transaction = (
        send_offsets_to_transaction
    ) = _no_transactions

    async def close(self) -> None:
        """Flush, then close (as the end of an `async with` block)."""
        if self._closed:
            return
        try:
            await self.flush()
        finally:
            self._closed = True
            await self._thread.call(self._producer.close)
            self._thread.stop()

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("AIOProducer closed")

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


RebalanceCallback = Callable[["AIOConsumer", list[TopicPartition]], Awaitable[object]]


class AIOConsumer:
    """confluent_kafka.aio.AIOConsumer's shape over broker.client.kafka.Consumer (module
    docstring): every Consumer call, awaited."""

    def __init__(
        self, consumer_conf: dict[str, Any], max_workers: int = 2, executor: object = None
    ) -> None:
        _workers(max_workers, executor)
        self._consumer = Consumer(consumer_conf)
        self._thread = _ClientThread("pylog-aio-consumer")

    async def subscribe(
        self,
        topics: list[str],
        on_assign: RebalanceCallback | None = None,
        on_revoke: RebalanceCallback | None = None,
        on_lost: RebalanceCallback | None = None,
    ) -> None:
        """Consumer.subscribe, the callbacks coroutine functions taking this AIOConsumer."""
        loop = asyncio.get_running_loop()
        wrapped = {
            name: None if callback is None else self._in_loop(loop, name, callback)
            for name, callback in (
                ("on_assign", on_assign),
                ("on_revoke", on_revoke),
                ("on_lost", on_lost),
            )
        }
        await self._thread.call(self._consumer.subscribe, topics, **wrapped)

    def _in_loop(
        self, loop: asyncio.AbstractEventLoop, name: str, callback: RebalanceCallback
    ) -> Callable[[Consumer, list[TopicPartition]], object]:
        if not inspect.iscoroutinefunction(callback):
            raise TypeError(f"{name}: AIOConsumer takes a coroutine function (async def)")

        def call(_: Consumer, partitions: list[TopicPartition]) -> object:
            return self._thread.run_callback(loop, callback(self, partitions))

        return call

    async def _call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        return await self._thread.call(fn, *args, **kwargs)

    async def poll(self, timeout: float | None = None) -> Message | None:
        return await self._call(self._consumer.poll, timeout)

    async def consume(self, num_messages: int = 1, timeout: float | None = -1) -> list[Message]:
        return await self._call(self._consumer.consume, num_messages, timeout)

    async def unsubscribe(self) -> None:
        await self._call(self._consumer.unsubscribe)

    async def commit(self, *args: Any, **kwargs: Any) -> list[TopicPartition] | None:
        return await self._call(self._consumer.commit, *args, **kwargs)

    async def store_offsets(self, *args: Any, **kwargs: Any) -> None:
        await self._call(self._consumer.store_offsets, *args, **kwargs)

    async def committed(self, *args: Any, **kwargs: Any) -> list[TopicPartition]:
        return await self._call(self._consumer.committed, *args, **kwargs)

    async def seek(self, partition: TopicPartition) -> None:
        await self._call(self._consumer.seek, partition)

    async def pause(self, partitions: list[TopicPartition]) -> None:
        await self._call(self._consumer.pause, partitions)

    async def resume(self, partitions: list[TopicPartition]) -> None:
        await self._call(self._consumer.resume, partitions)

    async def assign(self, partitions: list[TopicPartition]) -> None:
        await self._call(self._consumer.assign, partitions)

    async def incremental_assign(self, partitions: list[TopicPartition]) -> None:
        await self._call(self._consumer.incremental_assign, partitions)

    async def unassign(self) -> None:
        await self._call(self._consumer.unassign)

    async def incremental_unassign(self, partitions: list[TopicPartition]) -> None:
        await self._call(self._consumer.incremental_unassign, partitions)

    async def assignment(self) -> list[TopicPartition]:
        return await self._call(self._consumer.assignment)

    async def position(self, partitions: list[TopicPartition]) -> list[TopicPartition]:
        return await self._call(self._consumer.position, partitions)

    async def list_topics(self, topic: str | None = None, timeout: float = -1) -> ClusterMetadata:
        return await self._call(self._consumer.list_topics, topic, timeout)

    async def get_watermark_offsets(self, *args: Any, **kwargs: Any) -> tuple[int, int]:
        return await self._call(self._consumer.get_watermark_offsets, *args, **kwargs)

    async def offsets_for_times(self, *args: Any, **kwargs: Any) -> list[TopicPartition]:
        return await self._call(self._consumer.offsets_for_times, *args, **kwargs)

    async def close(self) -> None:
        """Leave the group and close (as the end of an `async with` block)."""
        try:
            await self._call(self._consumer.close)
        finally:
            self._thread.stop()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
