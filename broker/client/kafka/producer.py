"""confluent-kafka's Producer over pylog's (broker.client.producer): produce, poll, flush and
the delivery callbacks, run in the caller's thread."""

from __future__ import annotations

import contextlib
import math
from collections import deque
from collections.abc import Iterable, Mapping
from typing import Any, NoReturn, Self

from broker.client.cluster import Cluster
from broker.client.framing import DEFAULT_CLIENT_ID
from broker.client.kafka.errors import NO_TRANSACTIONS, KafkaError, KafkaException, not_implemented
from broker.client.kafka.messages import (
    OFFSET_INVALID,
    PENDING_FIELDS,
    ClusterMetadata,
    DeliveryCallback,
    Message,
    Unreported,
    list_topics,
)
from broker.client.kafka.settings import (
    ACKS,
    PRODUCER_KEYS,
    checked_settings,
    choice,
    client_keys,
    encoded,
    flag,
    number,
)
from broker.client.producer import Producer as _Producer
from broker.client.producer_core import DELIVERY_TIMEOUT_S
from broker.client.transport import ZmqTransport
from broker.errors import PylogError
from broker.log.compression import compressor_for
from broker.protocol import Ack


class Producer:
    """confluent_kafka.Producer's shape over pylog's Producer: not bound to a topic."""

    def __init__(self, conf: Mapping[str, Any] | None = None, **kwargs: Any) -> None:
        conf = {**(conf or {}), **kwargs}
        if "transactional.id" in conf:
            raise not_implemented(NO_TRANSACTIONS)
        conf = checked_settings(conf, PRODUCER_KEYS, "producer")
        ack = choice("acks", conf.get("acks", conf.get("request.required.acks", "all")), ACKS)
        idempotence = flag("enable.idempotence", conf.get("enable.idempotence", True))
        if idempotence and ack is Ack.NONE:
            if "enable.idempotence" in conf:
                raise KafkaException(
                    "enable.idempotence: acks 0 is never answered, so a batch is never sent "
                    "again: set acks to 1 or all, or enable.idempotence to false"
                )
            idempotence = False
        compression = str(conf.get("compression.type", conf.get("compression.codec", "none")))
        if compression.lower() == "snappy":
            raise KafkaException("compression.type snappy: pylog has none, gzip, lz4 and zstd")
        linger = conf.get("linger.ms", conf.get("queue.buffering.max.ms", 5))
        timeout = conf.get("delivery.timeout.ms", conf.get("message.timeout.ms"))
        level = conf.get("compression.level")
        self._options: dict[str, Any] = {
            "ack": ack,
            "linger_ms": number("linger.ms", linger),
            "batch_messages": int(
                number("batch.num.messages", conf.get("batch.num.messages", 10_000))
            ),
            "batch_bytes": int(number("batch.size", conf.get("batch.size", 1_000_000))),
            "delivery_timeout_s": (
                DELIVERY_TIMEOUT_S
                if timeout is None
                else number("delivery.timeout.ms", timeout) / 1000
            ),
            "retries": None if "retries" not in conf else int(number("retries", conf["retries"])),
            "max_in_flight": int(
                number(
                    "max.in.flight.requests.per.connection",
                    conf.get("max.in.flight.requests.per.connection", conf.get("max.in.flight", 5)),
                )
            ),
            "client_id": str(conf.get("client.id", DEFAULT_CLIENT_ID)),
            "timeout_s": number("request.timeout.ms", conf.get("request.timeout.ms", 10_000))
            / 1000,
            "compression": compression.lower(),
            "compression_level": None if level is None or int(level) == -1 else int(level),
            "keys": client_keys(conf),
            "idempotence": idempotence,
        }
        if self._options["batch_messages"] < 1 or self._options["max_in_flight"] < 1:
            raise KafkaException("batch.num.messages and max.in.flight take 1 or more")
        try:
            compressor_for(self._options["compression"], self._options["compression_level"])
        except ValueError as error:
            raise KafkaException(f"compression.type: {error}") from None
        self._endpoint = str(conf["bootstrap.servers"])
        self._on_delivery: DeliveryCallback | None = conf.get("on_delivery")
        self._producers: dict[str, _Producer] = {}
        self._pending: dict[tuple[str, int], deque[Unreported]] = {}
        """The messages produced and not yet reported, by partition, in the order produced,
        a record a batch: a partition's are settled in that order (its batches are
        acknowledged in order), so `_report` takes each partition's settled ones from the
        front. No Message or callback is made before then (a Message and a closure each cost
        the producer 40% of its rate)."""
        self._waiting = 0

    def _producer(self, topic: str) -> _Producer:
        producer = self._producers.get(topic)
        if producer is None:
            try:
                producer = _Producer(self._endpoint, topic, **self._options)
            except PylogError as error:
                raise KafkaException(error) from None
            self._producers[topic] = producer
        return producer

    def produce(
        self,
        topic: str,
        value: Any = None,
        key: Any = None,
        partition: int = -1,
        on_delivery: DeliveryCallback | None = None,
        timestamp: int = 0,
        headers: Mapping[str, Any] | Iterable[tuple[str, Any]] | None = None,
        *,
        callback: DeliveryCallback | None = None,
    ) -> None:
        """Send a message to `topic` (batched: it leaves with its batch, by `linger.ms` or
        `batch.num.messages`); `on_delivery(err, msg)` (or `callback`, or the configuration's
        `on_delivery`) runs in a later `poll()` or `flush()` with its offset or its error.
        `value` and `key` are bytes or str (UTF-8); a value of None (Kafka's tombstone) is
        refused: a pylog message always has a value (b"" is empty). `partition` -1 lets the
        partitioner choose; `timestamp` 0 is now; `headers` a dict or (key, value) pairs.
        KafkaException only for what refuses this message (an unknown topic, a partition it
        does not have); a broker's error met sending a batch, this one's or an earlier one's,
        goes to the callbacks of the messages of the batches it failed (a delivery report)."""
        data = value if type(value) is bytes else encoded("value", value)
        if data is None:
            raise TypeError("value: a pylog message has a value (no tombstones): give b'' for none")
        pairs = None
        if headers is not None:
            items = headers.items() if isinstance(headers, Mapping) else headers
            pairs = [(name, encoded(f"header {name!r}", item)) for name, item in items]
        key_bytes = key if key is None or type(key) is bytes else encoded("key", key)
        producer = self._producers.get(topic) or self._producer(topic)
        try:
            batch, position = producer.add(
                data,
                key_bytes,
                timestamp or None,
                None if partition == -1 else partition,
                pairs,
            )
        except PylogError as error:
            raise KafkaException(error) from None
        report = on_delivery or callback or self._on_delivery
        self._waiting += 1
        placed = (topic, batch.partition)
        pending = self._pending.get(placed)
        if pending is None:
            pending = self._pending[placed] = deque()
        if pending and pending[-1].batch is batch:
            unreported = pending[-1]
        else:
            unreported = Unreported(batch)
            pending.append(unreported)
        unreported.items += (report, position, key_bytes, data, timestamp, pairs)

    def poll(self, timeout: float | None = None) -> int:
        """Send what lingered, take the acknowledgements that came (waiting up to `timeout`
        seconds for one, None or -1: until one comes) and run the delivery callbacks of the
        messages they settled; returns how many ran. Errors go to the callbacks."""
        wait = math.inf if timeout is None or timeout < 0 else timeout
        clock = ZmqTransport.clock  # its producers' transport's
        deadline = clock.monotonic() + wait
        while True:
            for producer in self._producers.values():
                with contextlib.suppress(PylogError):  # the batches it failed carry it
                    producer.poll(0.0)
            ran = self._report()
            if ran or not self._waiting:
                return ran
            left = deadline - clock.monotonic()
            if left <= 0:
                return 0
            busy = next((p for p in self._producers.values() if p.in_flight), None)
            if busy is None:  # only batches lingering: the next turn sends them
                clock.sleep(min(left, self._options["linger_ms"] / 1000))
                continue
            with contextlib.suppress(PylogError):
                busy.poll(min(left, 0.1))

    def _report(self) -> int:
        """Run the delivery callbacks of the messages settled (each partition's, in the order
        produced); returns how many ran. A callback may produce again; one that raises leaves
        the messages after its own to the next call."""
        ran = 0
        for (topic, partition), pending in list(self._pending.items()):
            while pending and pending[0].batch.done:
                unreported = pending.popleft()
                batch, items = unreported.batch, unreported.items
                error = batch.error
                for at in range(0, len(items), PENDING_FIELDS):
                    report, position, key, value, timestamp, headers = items[
                        at : at + PENDING_FIELDS
                    ]
                    self._waiting -= 1
                    if report is None:
                        continue
                    offset = (  # none with acks 0, nor for an error: OFFSET_INVALID
                        OFFSET_INVALID
                        if error is not None or batch.base_offset is None
                        else batch.offset(position)
                    )
                    message = Message.of(topic, partition, offset, key, value, timestamp, headers)
                    try:
                        report(None if error is None else KafkaError.of(error), message)
                    except BaseException:
                        if at + PENDING_FIELDS < len(items):
                            unreported.items = items[at + PENDING_FIELDS :]
                            pending.appendleft(unreported)
                        raise
                    ran += 1
        return ran

    def flush(self, timeout: float | None = None) -> int:
        """Send every message, wait for their acknowledgements (up to `timeout` seconds; None
        or -1: until all came), run their callbacks; returns how many are still waiting."""
        wait = None if timeout is None or timeout < 0 else timeout
        clock = ZmqTransport.clock  # its producers' transport's
        deadline = math.inf if wait is None else clock.monotonic() + wait
        for producer in list(self._producers.values()):
            while True:  # each error raised failed (settled) a batch: the next call goes on
                left = None if wait is None else max(0.0, deadline - clock.monotonic())
                try:
                    producer.flush(left)
                    break
                except PylogError:  # reported to the callbacks of that batch's messages
                    if left == 0.0:
                        break
        self._report()
        return self._waiting

    def __len__(self) -> int:
        """How many messages produced are not yet delivered (nor failed)."""
        return self._waiting

    def list_topics(self, topic: str | None = None, timeout: float = -1) -> ClusterMetadata:
        """The cluster's brokers and `topic` (every topic when None), as confluent-kafka's
        (`timeout` is taken; the client's request.timeout.ms bounds each ask)."""
        options = self._options
        with Cluster(
            self._endpoint, options["client_id"], options["timeout_s"], keys=options["keys"]
        ) as cluster:
            return list_topics(cluster, topic)

    def _no_transactions(self, *args: Any, **kwargs: Any) -> NoReturn:
        raise not_implemented(NO_TRANSACTIONS)

    init_transactions = begin_transaction = commit_transaction = abort_transaction = (
        send_offsets_to_transaction
    ) = _no_transactions

    def close(self) -> None:
        """Close every connection (what is not flushed is not sent)."""
        for producer in self._producers.values():
            producer.cluster.close()
        self._producers.clear()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        """Flush what was produced (its delivery reports served), then close, as
        confluent-kafka's Producer does at the end of a `with` block."""
        try:
            self.flush()
        finally:
            self.close()
