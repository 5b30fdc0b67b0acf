"""The Python client in the shape of confluent-kafka-python, for programs written for Kafka.

A program that uses confluent-kafka's common subset runs against pylog with its import changed
to `from broker.client.kafka import Consumer, KafkaError, KafkaException, Producer,
TopicPartition` (docs/clients.md): the dictionary configuration, `Producer.produce / poll /
flush`, `Consumer.subscribe / poll / consume / commit / seek / assignment / position`, the
delivery callback `on_delivery(err, msg)` and messages read with `msg.value()`,
`msg.offset()`, `msg.error()`. Underneath are this package's Producer and GroupConsumer, with
their rules (at-least-once delivery, offsets as byte positions).

Configuration keys keep Kafka's meaning where pylog has the same concept; any other key is
refused at construction with KafkaException naming it and the keys taken (a key with no
pylog meaning is never silently dropped). The differences a Kafka user meets:

- Offsets are byte positions, not consecutive numbers: commit `msg.offset()` + 1 is wrong;
  commit the message (`commit(message=msg)`) or `TopicPartition(topic, partition,
  offset_after)` where `offset_after` is `position()`'s answer, or the next message's offset.
- The producer sends keyless messages to partitions in turn and keyed ones by their key's
  hash (pylog's partitioner, not Kafka's murmur2: the same key does not land on the
  partition Kafka would choose).
- `enable.idempotence` is true by default (as in Kafka's Java client since 3.0; librdkafka's
  default is false): a batch sent again is stored once, across leader changes too
  (docs/protocol.md, PRODUCE version 3). With `acks` 0 it is off, and true is refused.
- Each topic produced to has connections of its own; callbacks run in `poll()` and `flush()`,
  in the calling thread, as in confluent-kafka.

Beside it: `broker.client.kafka.admin` (AdminClient and its records), `broker.client.kafka.aio`
(AIOProducer, AIOConsumer) and `broker.client.kafka.model` (the records and enumerations both
share, re-exported here). What pylog does not have (transactions, share groups, manual
assignment) is refused in one line: docs/clients.md, "What pylog does not have".
"""

from __future__ import annotations

import builtins
import contextlib
import math
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, NoReturn, Self, cast

from broker.client.cluster import Cluster
from broker.client.connection import DEFAULT_CLIENT_ID
from broker.client.coordinator import GroupCalls
from broker.client.group import BrokerPartition, GroupConsumer
from broker.client.kafka.model import (
    ConsumerGroupState as ConsumerGroupState,
)
from broker.client.kafka.model import (
    ConsumerGroupTopicPartitions as ConsumerGroupTopicPartitions,
)
from broker.client.kafka.model import (
    ConsumerGroupType as ConsumerGroupType,
)
from broker.client.kafka.model import (
    ElectionType as ElectionType,
)
from broker.client.kafka.model import (
    IsolationLevel as IsolationLevel,
)
from broker.client.kafka.model import (
    Node as Node,
)
from broker.client.kafka.model import (
    TopicCollection as TopicCollection,
)
from broker.client.kafka.model import (
    TopicPartitionInfo as TopicPartitionInfo,
)
from broker.client.producer import DELIVERY_TIMEOUT_S, Batch
from broker.client.producer import Producer as _Producer
from broker.errors import (
    AuthenticationFailed,
    AuthorizationFailed,
    BrokerError,
    CorruptSegment,
    GroupNotEmptyError,
    InvalidMessage,
    InvalidTopic,
    MessageTooLarge,
    NotEnoughReplicas,
    NotLeaderForPartition,
    OffsetOutOfRange,
    PylogError,
    TopicAlreadyExists,
    Unavailable,
    UnknownGroup,
    UnknownTopicOrPartition,
)
from broker.log.compression import compressor_for
from broker.protocol import EARLIEST, LATEST, Ack, ErrorCode, OffsetsRequest, broker_error
from broker.security import ClientKeys, KeyFileError

OFFSET_BEGINNING: Final = -2
"""confluent-kafka's logical offset of a partition's first message (its log start here)."""
OFFSET_END: Final = -1
"""confluent-kafka's logical offset past a partition's last message (its high watermark)."""
OFFSET_STORED: Final = -1000
"""confluent-kafka's logical offset of a partition's committed offset."""
OFFSET_INVALID: Final = -1001
"""The offset of a message whose offset is not known (confluent-kafka's value): acks 0."""
TIMESTAMP_CREATE_TIME: Final = 1
"""A message's timestamp type (confluent-kafka's value): pylog timestamps are the producer's."""


class KafkaError:
    """An error as confluent-kafka reports one: `code()`, `name()`, `str()`, `retriable()`,
    `fatal()`. Codes are Kafka's where pylog's error means the same, else _FAIL (the pylog
    error it stands for is `error`, its class names it)."""

    _FAIL: Final = -150
    _PARTITION_EOF: Final = -191
    _MSG_TIMED_OUT: Final = -192
    _TRANSPORT: Final = -195
    _AUTHENTICATION: Final = -169
    _INVALID_ARG: Final = -186
    _UNKNOWN_PARTITION: Final = -190
    _NOT_IMPLEMENTED: Final = -170
    OFFSET_OUT_OF_RANGE: Final = 1
    CORRUPT_MESSAGE: Final = 2
    UNKNOWN_TOPIC_OR_PART: Final = 3
    NOT_LEADER_FOR_PARTITION: Final = 6
    MSG_SIZE_TOO_LARGE: Final = 10
    NOT_ENOUGH_REPLICAS: Final = 19
    TOPIC_AUTHORIZATION_FAILED: Final = 29
    TOPIC_ALREADY_EXISTS: Final = 36
    INVALID_TOPIC_EXCEPTION: Final = 17
    NON_EMPTY_GROUP: Final = 68
    GROUP_ID_NOT_FOUND: Final = 69

    def __init__(
        self, code: int, reason: str, retriable: bool = False, error: PylogError | None = None
    ) -> None:
        self._code = code
        self._reason = reason
        self._retriable = retriable
        self.error = error
        """The pylog error reported, or None."""

    @classmethod
    def of(cls, error: PylogError) -> KafkaError:
        """`error` as Kafka would report it."""
        code = next((code for kind, code in _CODES if isinstance(error, kind)), cls._FAIL)
        retriable = (
            error.retriable if isinstance(error, BrokerError) else isinstance(error, Unavailable)
        )
        return cls(code, str(error), retriable, error)

    def code(self) -> int:
        return self._code

    def name(self) -> str:
        for attribute, value in vars(KafkaError).items():
            if attribute.lstrip("_").isupper() and value == self._code:
                return attribute
        return str(self._code)

    def str(self) -> str:
        return self._reason

    def retriable(self) -> bool:
        return self._retriable

    def fatal(self) -> bool:
        return False

    def __str__(self) -> builtins.str:
        return self._reason

    def __repr__(self) -> builtins.str:
        return f'KafkaError{{code={self.name()},val={self._code},str="{self._reason}"}}'

    def __eq__(self, other: object) -> bool:
        if isinstance(other, KafkaError):
            return self._code == other._code
        if isinstance(other, int):
            return self._code == other
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self._code)


_CODES: Final[tuple[tuple[type[PylogError], int], ...]] = (
    (OffsetOutOfRange, KafkaError.OFFSET_OUT_OF_RANGE),
    (CorruptSegment, KafkaError.CORRUPT_MESSAGE),
    (InvalidMessage, KafkaError.CORRUPT_MESSAGE),
    (UnknownTopicOrPartition, KafkaError.UNKNOWN_TOPIC_OR_PART),
    (NotLeaderForPartition, KafkaError.NOT_LEADER_FOR_PARTITION),
    (MessageTooLarge, KafkaError.MSG_SIZE_TOO_LARGE),
    (NotEnoughReplicas, KafkaError.NOT_ENOUGH_REPLICAS),
    (AuthorizationFailed, KafkaError.TOPIC_AUTHORIZATION_FAILED),
    (TopicAlreadyExists, KafkaError.TOPIC_ALREADY_EXISTS),
    (InvalidTopic, KafkaError.INVALID_TOPIC_EXCEPTION),
    (GroupNotEmptyError, KafkaError.NON_EMPTY_GROUP),
    (UnknownGroup, KafkaError.GROUP_ID_NOT_FOUND),
    (AuthenticationFailed, KafkaError._AUTHENTICATION),
    (Unavailable, KafkaError._TRANSPORT),
)
"""Kafka's code for each kind of pylog error that has one, the first match taken."""


class KafkaException(Exception):
    """What confluent-kafka raises: `args[0]` is the KafkaError."""

    def __init__(self, error: KafkaError | PylogError | str) -> None:
        if isinstance(error, PylogError):
            error = KafkaError.of(error)
        elif isinstance(error, str):
            error = KafkaError(KafkaError._INVALID_ARG, error)
        super().__init__(error)


class IllegalStateException(KafkaException):
    """confluent-kafka's, for a call made in the wrong state (its share consumer's)."""


class ConcurrentModificationException(KafkaException):
    """confluent-kafka's, for a client used from two threads at once (its share consumer's)."""


NO_TRANSACTIONS: Final = (
    "transactions: pylog has none (yet): no transactional.id, init_transactions or "
    "read_committed; its idempotent producer stores a batch sent again once "
    "(docs/clients.md, 'What pylog does not have')"
)


def _not_implemented(what: str) -> KafkaException:
    """The one-line refusal of a confluent-kafka feature pylog does not have."""
    return KafkaException(KafkaError(KafkaError._NOT_IMPLEMENTED, what))


class ShareConsumer:
    """confluent-kafka's share consumer (KIP-932's queues): pylog has no share groups; each
    partition of a pylog group is read by one member at a time."""

    def __init__(self, conf: Mapping[str, Any] | None = None, **kwargs: Any) -> None:
        raise _not_implemented(
            "share groups: pylog has none (KIP-932's queues); read with a Consumer in a group "
            "(docs/clients.md, 'What pylog does not have')"
        )


class TopicPartition:
    """A partition of a topic, with an offset where one is meant (the offset to read next),
    as confluent-kafka's: `topic`, `partition`, `offset`, `error`."""

    __slots__ = ("error", "offset", "partition", "topic")

    def __init__(self, topic: str, partition: int = -1, offset: int = OFFSET_INVALID) -> None:
        self.topic = topic
        self.partition = partition
        self.offset = offset
        self.error: KafkaError | None = None

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, TopicPartition):
            return NotImplemented
        return (self.topic, self.partition) == (other.topic, other.partition)

    def __hash__(self) -> int:
        return hash((self.topic, self.partition))

    def __lt__(self, other: TopicPartition) -> bool:
        return (self.topic, self.partition) < (other.topic, other.partition)

    def __repr__(self) -> str:
        return (
            f"TopicPartition{{topic={self.topic},partition={self.partition},offset={self.offset}}}"
        )


class Message(tuple[Any, ...]):
    """A message read or delivered, with confluent-kafka's accessors. A tuple underneath, of a
    group member's Record's layout (topic, partition, offset, timestamp_ms, key, value,
    headers, next_offset), so that a consumer's are made straight from the fetched bytes
    (broker.log.codec.decode_records) with nothing between; read it through its accessors."""

    __slots__ = ()

    @classmethod
    def of(
        cls,
        topic: str,
        partition: int,
        offset: int,
        key: Any,
        value: Any,
        timestamp_ms: int,
        headers: Iterable[tuple[str, bytes | None]] | None,
        next_offset: int = OFFSET_INVALID,
    ) -> Message:
        fields = (topic, partition, offset, timestamp_ms, key, value, tuple(headers or ()))
        return tuple.__new__(cls, (*fields, next_offset))

    def topic(self) -> str:
        return cast(str, self[0])

    def partition(self) -> int:
        return cast(int, self[1])

    def offset(self) -> int:
        """The message's offset: its byte position in the partition (not a count)."""
        return cast(int, self[2])

    def next_offset(self) -> int:
        """Where the next message starts: the offset to commit to have read this one (pylog's
        own; Kafka's is offset() + 1)."""
        return cast(int, self[7])

    def key(self) -> Any:
        return self[4]

    def value(self) -> Any:
        return self[5]

    def headers(self) -> list[tuple[str, bytes | None]] | None:
        return list(self[6]) or None

    def timestamp(self) -> tuple[int, int]:
        return TIMESTAMP_CREATE_TIME, self[3]

    def error(self) -> KafkaError | None:
        return None

    def __len__(self) -> int:
        """The value's length, as confluent-kafka's (not the tuple's)."""
        value = self[5]
        return 0 if value is None else len(value)

    def __repr__(self) -> str:
        return f"Message(topic={self[0]!r}, partition={self[1]}, offset={self[2]})"


DeliveryCallback = Callable[[KafkaError | None, Message], object]
_PENDING_FIELDS = 6
"""The items a message produced holds in its batch's `_Unreported` until reported."""


class _Unreported:
    """The messages of one batch produced and not yet reported, flat in `items`,
    _PENDING_FIELDS each: its callback, where it starts in the batch (its delivery's parts:
    broker.client.producer.Handle), key, value, timestamp, headers. Flat, so that a message
    waiting for its ack is references in a list, not an object of its own: with a tuple
    each, the garbage collector walked every message in flight, a tenth of the producer's
    time over 100 partitions (perf/README.md, "Keyed traffic over many partitions")."""

    __slots__ = ("batch", "items")

    def __init__(self, batch: Batch) -> None:
        self.batch = batch
        self.items: list[Any] = []


class _Event(Message):
    """An event a Consumer hands out as confluent-kafka's do, a Message with an error():
    the end of a partition reached (enable.partition.eof), at `offset()`."""

    __slots__ = ()

    @classmethod
    def partition_eof(cls, topic: str, partition: int, end: int) -> _Event:
        error = KafkaError(
            KafkaError._PARTITION_EOF, f"{topic} [{partition}] reached end at offset {end}"
        )
        return tuple.__new__(cls, (topic, partition, end, 0, None, None, (), end, error))

    def error(self) -> KafkaError | None:
        return cast(KafkaError, self[8])


@dataclass
class BrokerMetadata:
    """A broker of ClusterMetadata (confluent_kafka.admin's)."""

    id: int
    host: str
    port: int

    def __str__(self) -> str:
        return f"{self.host}:{self.port}/{self.id}"


@dataclass
class PartitionMetadata:
    """A partition of TopicMetadata (confluent_kafka.admin's): its leader (-1: none), replicas,
    in-sync replicas (`isrs`) and error (None, or why it is not served now)."""

    id: int
    leader: int
    replicas: list[int]
    isrs: list[int]
    error: KafkaError | None = None

    def __str__(self) -> str:
        return str(self.id)


@dataclass
class TopicMetadata:
    """A topic of ClusterMetadata (confluent_kafka.admin's)."""

    topic: str
    partitions: dict[int, PartitionMetadata]
    error: KafkaError | None = None

    def __str__(self) -> str:
        return self.topic


@dataclass
class ClusterMetadata:
    """What `list_topics` returns (confluent_kafka.admin's): the brokers and the topics asked
    for (every topic when none was). pylog has no cluster id, and METADATA does not name the
    controller: `cluster_id` None, `controller_id` -1."""

    brokers: dict[int, BrokerMetadata] = field(default_factory=dict)
    topics: dict[str, TopicMetadata] = field(default_factory=dict)
    cluster_id: str | None = None
    controller_id: int = -1
    orig_broker_id: int = -1
    orig_broker_name: str | None = None


def _error_of(code: int, what: str) -> KafkaError | None:
    if code == ErrorCode.NONE:
        return None
    return KafkaError.of(broker_error(code, what))


def _list_topics(cluster: Cluster, topic: str | None) -> ClusterMetadata:
    """METADATA of `topic` (every topic when None), as confluent-kafka's list_topics gives it;
    KafkaException when no broker answers."""
    try:
        reply = cluster.metadata(() if topic is None else (topic,))
    except PylogError as error:
        raise KafkaException(error) from None
    return ClusterMetadata(
        brokers={b.broker_id: BrokerMetadata(b.broker_id, b.host, b.port) for b in reply.brokers},
        topics={
            info.topic: TopicMetadata(
                info.topic,
                {
                    p.partition: PartitionMetadata(
                        p.partition,
                        p.broker_id,
                        list(p.replicas),
                        list(p.isr),
                        _error_of(p.error_code, f"{info.topic}-{p.partition} is not served now"),
                    )
                    for p in info.partitions
                },
                _error_of(info.error_code, f"topic {info.topic!r}"),
            )
            for info in reply.topics
        },
    )


@contextlib.contextmanager
def _as_kafka_errors() -> Iterator[None]:
    """A PylogError, or a ValueError (a partition this member does not own), raised as the
    KafkaException a confluent-kafka program catches."""
    try:
        yield
    except PylogError as error:
        raise KafkaException(error) from None
    except ValueError as error:
        raise KafkaException(str(error)) from None


def _offset_at(cluster: Cluster, topic: str, partition: int, time: int) -> int:
    """OFFSETS of `partition` of `topic` at `time` (EARLIEST, LATEST or ms), from its leader."""
    return cluster.call_leader(OffsetsRequest(topic, partition, time), 3).offset


_ACKS: Final = {"0": Ack.NONE, "1": Ack.WRITTEN, "-1": Ack.ALL, "all": Ack.ALL}
_TRUE: Final = frozenset({"true", "1", "yes"})
_FALSE: Final = frozenset({"false", "0", "no"})
_ISOLATIONS: Final = {"read_committed": True, "read_uncommitted": True}
"""Both the same in pylog: it has no transactions, so every message stored is committed."""
_RESETS: Final = {
    "earliest": "earliest",
    "smallest": "earliest",
    "beginning": "earliest",
    "latest": "latest",
    "largest": "latest",
    "end": "latest",
}


def _flag(key: str, value: Any) -> bool:
    text = str(value).lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise KafkaException(f"{key}: {value!r} is not a boolean (true or false)")


def _number(key: str, value: Any) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        number = math.nan
    if not number >= 0:
        raise KafkaException(f"{key}: {value!r} is not a number of 0 or more")
    return number


def _choice(key: str, value: Any, choices: Mapping[str, Any]) -> Any:
    chosen = choices.get(str(value).lower())
    if chosen is None:
        raise KafkaException(f"{key}: {value!r} is not one of {', '.join(choices)}")
    return chosen


def _settings(conf: Mapping[str, Any], known: Iterable[str], kind: str) -> dict[str, Any]:
    """`conf` checked: every key one of `known`, `bootstrap.servers` given."""
    if not isinstance(conf, Mapping):
        raise TypeError(f"a {kind} takes its configuration as a dict, not {type(conf).__name__}")
    taken = set(known)
    unknown = sorted(set(conf) - taken)
    if unknown:
        raise KafkaException(
            f"{', '.join(map(repr, unknown))}: not a pylog {kind} setting (taken: "
            f"{', '.join(sorted(taken))}; docs/clients.md says why the others are not)"
        )
    if not conf.get("bootstrap.servers"):
        raise KafkaException("bootstrap.servers: a broker's host:port (several, comma-separated)")
    return dict(conf)


def _keys(conf: Mapping[str, Any]) -> ClientKeys | None:
    """The Curve keys of `pylog.key.file` and `pylog.broker.key`, checked against
    `security.protocol`: PLAINTEXT without them, CURVE (or SSL / SASL_SSL, taken as asking
    for encryption) with them."""
    key_file, broker_key = conf.get("pylog.key.file"), conf.get("pylog.broker.key")
    protocol = str(conf.get("security.protocol", "")).upper()
    if (key_file is None) != (broker_key is None):
        raise KafkaException(
            "pylog.key.file and pylog.broker.key go together: the client's secret key file and "
            "the brokers' public key (or its file)"
        )
    if key_file is None:
        if protocol not in ("", "PLAINTEXT"):
            raise KafkaException(
                f"security.protocol {protocol}: pylog encrypts with CurveZMQ; give "
                "pylog.key.file and pylog.broker.key (docs/security.md), or PLAINTEXT"
            )
        return None
    if protocol in ("PLAINTEXT", "SASL_PLAINTEXT"):
        raise KafkaException(
            f"security.protocol {protocol} with Curve keys: say CURVE, or leave it out"
        )
    try:
        return ClientKeys.load(str(key_file), str(broker_key))
    except KeyFileError as error:
        raise KafkaException(f"pylog.key.file / pylog.broker.key: {error}") from None


_COMMON: Final = (
    "bootstrap.servers",
    "client.id",
    "security.protocol",
    "pylog.key.file",
    "pylog.broker.key",
    "request.timeout.ms",
    "logger",
)
PRODUCER_KEYS: Final = (
    *_COMMON,
    "acks",
    "request.required.acks",
    "enable.idempotence",
    "compression.type",
    "compression.codec",
    "compression.level",
    "linger.ms",
    "queue.buffering.max.ms",
    "batch.num.messages",
    "batch.size",
    "delivery.timeout.ms",
    "message.timeout.ms",
    "retries",
    "max.in.flight.requests.per.connection",
    "max.in.flight",
    "on_delivery",
)
"""The keys a Producer takes (docs/clients.md has what each maps to)."""
CONSUMER_KEYS: Final = (
    *_COMMON,
    "group.id",
    "group.instance.id",
    "auto.offset.reset",
    "enable.auto.commit",
    "enable.auto.offset.store",
    "auto.commit.interval.ms",
    "session.timeout.ms",
    "max.poll.interval.ms",
    "group.remote.assignor",
    "fetch.wait.max.ms",
    "fetch.max.bytes",
    "max.partition.fetch.bytes",
    "enable.partition.eof",
    "isolation.level",
    "key.deserializer",
    "value.deserializer",
)
"""The keys a Consumer takes."""


def _encoded(what: str, data: Any) -> bytes | None:
    """A value, key or header value as confluent-kafka takes it: bytes as they are, str as
    UTF-8, None as None."""
    if data is None or isinstance(data, bytes):
        return data
    if isinstance(data, str):
        return data.encode()
    if isinstance(data, bytearray | memoryview):
        return bytes(data)
    raise TypeError(f"{what} is bytes or str, not {type(data).__name__}")


class Producer:
    """confluent_kafka.Producer's shape over pylog's Producer: not bound to a topic."""

    def __init__(self, conf: Mapping[str, Any] | None = None, **kwargs: Any) -> None:
        conf = {**(conf or {}), **kwargs}
        if "transactional.id" in conf:
            raise _not_implemented(NO_TRANSACTIONS)
        conf = _settings(conf, PRODUCER_KEYS, "producer")
        ack = _choice("acks", conf.get("acks", conf.get("request.required.acks", "all")), _ACKS)
        idempotence = _flag("enable.idempotence", conf.get("enable.idempotence", True))
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
            "linger_ms": _number("linger.ms", linger),
            "batch_messages": int(
                _number("batch.num.messages", conf.get("batch.num.messages", 10_000))
            ),
            "batch_bytes": int(_number("batch.size", conf.get("batch.size", 1_000_000))),
            "delivery_timeout_s": (
                DELIVERY_TIMEOUT_S
                if timeout is None
                else _number("delivery.timeout.ms", timeout) / 1000
            ),
            "retries": None if "retries" not in conf else int(_number("retries", conf["retries"])),
            "max_in_flight": int(
                _number(
                    "max.in.flight.requests.per.connection",
                    conf.get("max.in.flight.requests.per.connection", conf.get("max.in.flight", 5)),
                )
            ),
            "client_id": str(conf.get("client.id", DEFAULT_CLIENT_ID)),
            "timeout_s": _number("request.timeout.ms", conf.get("request.timeout.ms", 10_000))
            / 1000,
            "compression": compression.lower(),
            "compression_level": None if level is None or int(level) == -1 else int(level),
            "keys": _keys(conf),
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
        self._pending: dict[tuple[str, int], deque[_Unreported]] = {}
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
        data = value if type(value) is bytes else _encoded("value", value)
        if data is None:
            raise TypeError("value: a pylog message has a value (no tombstones): give b'' for none")
        pairs = None
        if headers is not None:
            items = headers.items() if isinstance(headers, Mapping) else headers
            pairs = [(name, _encoded(f"header {name!r}", item)) for name, item in items]
        key_bytes = key if key is None or type(key) is bytes else _encoded("key", key)
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
            unreported = _Unreported(batch)
            pending.append(unreported)
        unreported.items += (report, position, key_bytes, data, timestamp, pairs)

    def poll(self, timeout: float | None = None) -> int:
        """Send what lingered, take the acknowledgements that came (waiting up to `timeout`
        seconds for one, None or -1: until one comes) and run the delivery callbacks of the
        messages they settled; returns how many ran. Errors go to the callbacks."""
        wait = math.inf if timeout is None or timeout < 0 else timeout
        deadline = time.monotonic() + wait
        while True:
            for producer in self._producers.values():
                with contextlib.suppress(PylogError):  # the batches it failed carry it
                    producer.poll(0.0)
            ran = self._report()
            if ran or not self._waiting:
                return ran
            left = deadline - time.monotonic()
            if left <= 0:
                return 0
            busy = next((p for p in self._producers.values() if p.in_flight), None)
            if busy is None:  # only batches lingering: the next turn sends them
                time.sleep(min(left, self._options["linger_ms"] / 1000))
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
                for at in range(0, len(items), _PENDING_FIELDS):
                    report, position, key, value, timestamp, headers = items[
                        at : at + _PENDING_FIELDS
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
                        if at + _PENDING_FIELDS < len(items):
                            unreported.items = items[at + _PENDING_FIELDS :]
                            pending.appendleft(unreported)
                        raise
                    ran += 1
        return ran

    def flush(self, timeout: float | None = None) -> int:
        """Send every message, wait for their acknowledgements (up to `timeout` seconds; None
        or -1: until all came), run their callbacks; returns how many are still waiting."""
        wait = None if timeout is None or timeout < 0 else timeout
        deadline = math.inf if wait is None else time.monotonic() + wait
        for producer in list(self._producers.values()):
            while True:  # each error raised failed (settled) a batch: the next call goes on
                left = None if wait is None else max(0.0, deadline - time.monotonic())
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
            return _list_topics(cluster, topic)

    def _no_transactions(self, *args: Any, **kwargs: Any) -> NoReturn:
        raise _not_implemented(NO_TRANSACTIONS)

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


def _partitions(owned: Iterable[BrokerPartition]) -> list[TopicPartition]:
    return sorted(TopicPartition(tp.topic, tp.partition) for tp in owned)


class Consumer:
    """confluent_kafka.Consumer's shape over pylog's GroupConsumer: a member of `group.id`,
    through the group's coordinator, found through `bootstrap.servers`."""

    def __init__(self, conf: Mapping[str, Any] | None = None, **kwargs: Any) -> None:
        conf = _settings({**(conf or {}), **kwargs}, CONSUMER_KEYS, "consumer")
        if not conf.get("group.id"):
            raise KafkaException("group.id: a consumer reads as a member of a group; name it")
        self._eof = _flag("enable.partition.eof", conf.get("enable.partition.eof", False))
        self._ends_told: dict[BrokerPartition, int] = {}
        """With enable.partition.eof: the end each owned partition's last EOF event gave."""
        self._conf = conf
        self._reset = _choice("auto.offset.reset", conf.get("auto.offset.reset", "latest"), _RESETS)
        self._auto_commit_s: float | None = None
        if _flag("enable.auto.commit", conf.get("enable.auto.commit", True)):
            self._auto_commit_s = (
                _number("auto.commit.interval.ms", conf.get("auto.commit.interval.ms", 5000)) / 1000
            )
        self._session_s = _number("session.timeout.ms", conf.get("session.timeout.ms", 6000)) / 1000
        self._wait_ms = int(_number("fetch.wait.max.ms", conf.get("fetch.wait.max.ms", 500)))
        fetch = conf.get("max.partition.fetch.bytes", conf.get("fetch.max.bytes"))
        self._fetch_bytes = None if fetch is None else int(_number("fetch.max.bytes", fetch))
        self._timeout_s = (
            _number("request.timeout.ms", conf.get("request.timeout.ms", 10_000)) / 1000
        )
        self._keys = _keys(conf)
        self._deserializers = (conf.get("key.deserializer"), conf.get("value.deserializer"))
        self._max_poll_s = (
            _number("max.poll.interval.ms", conf.get("max.poll.interval.ms", 300_000)) / 1000
        )
        self._auto_store = _flag(
            "enable.auto.offset.store", conf.get("enable.auto.offset.store", True)
        )
        _choice("isolation.level", conf.get("isolation.level", "read_committed"), _ISOLATIONS)
        self._member: GroupConsumer[Message] | None = None
        self._revoking: frozenset[tuple[str, int]] = frozenset()
        """The partitions on_revoke or on_lost is being called for, while it runs."""
        self._closed = False

    def subscribe(
        self,
        topics: list[str],
        on_assign: Callable[[Consumer, list[TopicPartition]], object] | None = None,
        on_revoke: Callable[[Consumer, list[TopicPartition]], object] | None = None,
        on_lost: Callable[[Consumer, list[TopicPartition]], object] | None = None,
    ) -> None:
        """Join the group for `topics` (whole names; a name starting with ^ is a pattern in
        Kafka, refused here), leaving any subscription before. `on_assign(consumer,
        partitions)` and `on_revoke(consumer, partitions)` run in poll() around rebalances;
        `on_lost(consumer, partitions)` (default: `on_revoke`) when they were lost without a
        commit, as in confluent-kafka."""
        if isinstance(topics, str):
            raise TypeError("subscribe takes a list of topics, not a str")
        patterns = [topic for topic in topics if topic.startswith("^")]
        if patterns:
            raise KafkaException(f"{', '.join(patterns)}: pylog groups subscribe to topics by name")
        self._check_open()
        self.unsubscribe()
        member_options: dict[str, Any] = {}
        if self._fetch_bytes is not None:
            member_options["fetch_bytes"] = self._fetch_bytes
        try:
            self._member = GroupConsumer(
                str(self._conf["bootstrap.servers"]),
                str(self._conf["group.id"]),
                topics,
                instance_id=self._conf.get("group.instance.id"),
                assignor=self._conf.get("group.remote.assignor"),
                max_poll_interval_s=self._max_poll_s,
                store_processed=self._auto_store,
                logger=self._conf.get("logger"),
                reset=self._reset,
                auto_commit_interval_s=self._auto_commit_s,
                on_assigned=None
                if on_assign is None
                else lambda owned: on_assign(self, _partitions(owned)),
                on_revoked=None if on_revoke is None else self._revoked(on_revoke),
                on_lost=None if on_lost is None else self._revoked(on_lost),
                max_wait_ms=self._wait_ms,
                session_timeout_s=self._session_s,
                client_id=str(self._conf.get("client.id", DEFAULT_CLIENT_ID)),
                timeout_s=self._timeout_s,
                keys=self._keys,
                record_type=Message,
                **member_options,
            )
        except PylogError as error:
            raise KafkaException(error) from None
        except ValueError as error:  # a setting out of its bounds (max.poll.interval.ms)
            raise KafkaException(str(error)) from None

    def _revoked(
        self, callback: Callable[[Consumer, list[TopicPartition]], object]
    ) -> Callable[[Iterable[BrokerPartition]], None]:
        """`callback` as the group member calls it for partitions going away, noting them
        for `incremental_unassign` while it runs."""

        def call(owned: Iterable[BrokerPartition]) -> None:
            partitions = _partitions(owned)
            self._revoking = frozenset((tp.topic, tp.partition) for tp in partitions)
            try:
                callback(self, partitions)
            finally:
                self._revoking = frozenset()

        return call

    def committed(
        self, partitions: list[TopicPartition], timeout: float | None = None
    ) -> list[TopicPartition]:
        """`partitions` with the group's committed offset of each (OFFSET_INVALID for one with
        none), asked of the coordinator: by the group member, or, before subscribe(), as one
        who does not join (confluent-kafka's get_watermark_offsets example asks so)."""
        self._check_open()
        asked = [(tp.topic, tp.partition) for tp in partitions]
        found: Mapping[tuple[str, int], int]
        with _as_kafka_errors():
            if self._member is not None:
                found = self._member.committed(asked)
            else:
                with GroupCalls(
                    str(self._conf["bootstrap.servers"]),
                    str(self._conf["group.id"]),
                    str(self._conf.get("client.id", DEFAULT_CLIENT_ID)),
                    self._timeout_s,
                    keys=self._keys,
                ) as calls:
                    topics = sorted({topic for topic, _ in asked})
                    found = {
                        (tp.topic, tp.partition): o for tp, o in calls.committed(topics).items()
                    }
        return [
            TopicPartition(
                tp.topic, tp.partition, found.get((tp.topic, tp.partition), OFFSET_INVALID)
            )
            for tp in partitions
        ]

    def list_topics(self, topic: str | None = None, timeout: float = -1) -> ClusterMetadata:
        """The cluster's brokers and `topic` (every topic when None), as confluent-kafka's
        (`timeout` is taken; the client's request.timeout.ms bounds each ask)."""
        with self._cluster() as cluster:
            return _list_topics(cluster, topic)

    def get_watermark_offsets(
        self, partition: TopicPartition, timeout: float | None = None, cached: bool = False
    ) -> tuple[int, int]:
        """(low, high): the log start and the high watermark of `partition`, asked of its
        leader (`cached` data pylog does not keep: asked either way). Offsets are byte
        positions, so `high - low` is bytes, not messages."""
        topic, number = partition.topic, partition.partition
        with self._cluster() as cluster, _as_kafka_errors():
            return (
                _offset_at(cluster, topic, number, EARLIEST),
                _offset_at(cluster, topic, number, LATEST),
            )

    def offsets_for_times(
        self, partitions: list[TopicPartition], timeout: float | None = None
    ) -> list[TopicPartition]:
        """For each of `partitions`, whose offset is a time in ms since the epoch, the offset
        of the first message whose timestamp is at or after it (OFFSETS), or OFFSET_END when
        no message is, as confluent-kafka gives them."""
        found = []
        with self._cluster() as cluster, _as_kafka_errors():
            for tp in partitions:
                at = _offset_at(cluster, tp.topic, tp.partition, tp.offset)
                end = _offset_at(cluster, tp.topic, tp.partition, LATEST)
                found.append(
                    TopicPartition(tp.topic, tp.partition, OFFSET_END if at >= end else at)
                )
        return found

    def _cluster(self) -> Cluster:
        """A cluster of its own for a one-off ask, closed by the caller."""
        return Cluster(
            str(self._conf["bootstrap.servers"]),
            str(self._conf.get("client.id", DEFAULT_CLIENT_ID)),
            self._timeout_s,
            keys=self._keys,
        )

    def _joined(self) -> GroupConsumer[Message]:
        self._check_open()
        if self._member is None:
            raise KafkaException("not subscribed: call subscribe(topics) first")
        return self._member

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("Consumer closed")

    def poll(self, timeout: float | None = None) -> Message | None:
        """The next message, waiting up to `timeout` seconds (None or -1: until one comes);
        None when none came. The message returned before counts as processed (auto-commit
        commits it). KafkaException for an error that stops reading (damaged data,
        authorization)."""
        member = self._joined()
        deadline = math.inf if timeout is None or timeout < 0 else time.monotonic() + timeout
        while True:
            if self._eof and (event := self._end_reached(member)) is not None:
                return event
            left = deadline - time.monotonic()
            wait_ms = (
                self._wait_ms
                if left == math.inf
                else max(0, min(self._wait_ms, round(left * 1000)))
            )
            try:
                record = member.poll_record(wait_ms)
            except PylogError as error:
                raise KafkaException(error) from None
            if record is not None:
                return self._deserialized(record)
            if time.monotonic() >= deadline:
                return self._end_reached(member) if self._eof else None

    def _end_reached(self, member: GroupConsumer[Message]) -> Message | None:
        """With enable.partition.eof: the event of an owned partition read to an end not told
        before (confluent-kafka's _PARTITION_EOF), or None."""
        ends = member.at_end()
        self._ends_told = {tp: end for tp, end in self._ends_told.items() if tp in ends}
        for tp, end in ends.items():
            if self._ends_told.get(tp) != end:
                self._ends_told[tp] = end
                return _Event.partition_eof(tp.topic, tp.partition, end)
        return None

    def consume(self, num_messages: int = 1, timeout: float | None = -1) -> list[Message]:
        """Up to `num_messages` messages, waiting up to `timeout` seconds (-1 or None: until
        that many came) in all."""
        if num_messages < 1:
            raise ValueError("num_messages is 1 or more")
        member = self._joined()
        deadline = math.inf if timeout is None or timeout < 0 else time.monotonic() + timeout
        messages: list[Message] = []
        while len(messages) < num_messages:
            left = deadline - time.monotonic()
            wait_ms = (
                self._wait_ms
                if left == math.inf
                else max(0, min(self._wait_ms, round(left * 1000)))
            )
            try:  # what a fetch brought, at once: the group's bookkeeping once, not a message
                records = member.poll_records(num_messages - len(messages), wait_ms)
            except PylogError as error:
                raise KafkaException(error) from None
            if self._deserializers != (None, None):
                records = [self._deserialized(record) for record in records]
            messages += records
            if not records and self._eof and (event := self._end_reached(member)) is not None:
                messages.append(event)
            if time.monotonic() >= deadline:
                break
        return messages

    def _deserialized(self, message: Message) -> Message:
        """`message` with its key and value through `key.deserializer` and
        `value.deserializer`, when the consumer has them."""
        key_deserializer, value_deserializer = self._deserializers
        if key_deserializer is None and value_deserializer is None:
            return message
        key, value = message.key(), message.value()
        if key_deserializer is not None and key is not None:
            key = key_deserializer(key)
        if value_deserializer is not None:
            value = value_deserializer(value)
        return Message.of(
            message.topic(),
            message.partition(),
            message.offset(),
            key,
            value,
            message.timestamp()[1],
            message.headers(),
            message.next_offset(),
        )

    def commit(
        self,
        message: Message | None = None,
        offsets: list[TopicPartition] | None = None,
        asynchronous: bool = True,
    ) -> list[TopicPartition] | None:
        """Commit, with the group's coordinator, every message returned so far (no argument);
        or `message` (the offset after it); or `offsets` (each the offset to read next). The
        commit is made before this returns, whatever `asynchronous` says; it returns the
        partitions committed when `asynchronous` is False, as confluent-kafka does."""
        member = self._joined()
        if message is not None and offsets is not None:
            raise ValueError("commit takes a message or offsets, not both")
        with _as_kafka_errors():
            if message is not None:
                chosen = {(message.topic(), message.partition()): message.next_offset()}
                member.commit(chosen)
                committed = [
                    TopicPartition(message.topic(), message.partition(), message.next_offset())
                ]
            elif offsets is not None:
                member.commit({(tp.topic, tp.partition): tp.offset for tp in offsets})
                committed = list(offsets)
            else:
                member.commit()
                committed = self.position(self.assignment())
        return None if asynchronous else committed

    def assignment(self) -> list[TopicPartition]:
        """The partitions this member owns now."""
        if self._member is None:
            return []
        return _partitions(self._member.assignment)

    def position(self, partitions: list[TopicPartition]) -> list[TopicPartition]:
        """`partitions` with the offset each is read from next (OFFSET_INVALID for one not
        owned)."""
        member = self._joined()
        positions = {(tp.topic, tp.partition): offset for tp, offset in member.positions().items()}
        return [
            TopicPartition(
                tp.topic, tp.partition, positions.get((tp.topic, tp.partition), OFFSET_INVALID)
            )
            for tp in partitions
        ]

    def seek(self, partition: TopicPartition) -> None:
        """Read `partition.partition` of `partition.topic` from `partition.offset` next (an
        offset where a message starts, or OFFSET_BEGINNING or OFFSET_END: the log start or
        the high watermark, asked of its leader); KafkaException when not owned."""
        member = self._joined()
        topic, number, offset = partition.topic, partition.partition, partition.offset
        with _as_kafka_errors():
            if offset in (OFFSET_BEGINNING, OFFSET_END):  # OFFSETS' own EARLIEST and LATEST
                offset = _offset_at(member.cluster, topic, number, offset)
            member.seek(topic, number, offset)

    def assign(self, partitions: list[TopicPartition]) -> None:
        """Where the partitions this member was given are read from: each with an offset
        (where a message starts, OFFSET_BEGINNING or OFFSET_END) is read from it next, as
        `seek`; OFFSET_INVALID and OFFSET_STORED leave it where the group's committed offset
        put it. The confluent-kafka tutorial's reset, `consumer.assign(partitions)` in
        `on_assign`, works so. pylog's consumer reads as a member of its group only: a
        partition the group did not give it is a KafkaException, not a manual assignment."""
        if self._member is None and not self._closed:
            raise KafkaException(
                "assign: pylog has no manual assignment: a consumer reads as a member of its "
                "group (subscribe(topics) first), and assign() sets where the partitions the "
                "group gave it are read from (docs/clients.md)"
            )
        member = self._joined()
        owned = {(tp.topic, tp.partition) for tp in member.assignment}
        others = sorted(
            f"{tp.topic}/{tp.partition}"
            for tp in partitions
            if (tp.topic, tp.partition) not in owned
        )
        if others:
            raise KafkaException(
                f"assign: {', '.join(others)} not given to this member by group "
                f"{self._conf['group.id']!r}: pylog reads as a member of a group (subscribe), "
                "and assign() only sets where its own partitions are read from"
            )
        for tp in partitions:
            if tp.offset not in (OFFSET_INVALID, OFFSET_STORED):
                self.seek(tp)

    incremental_assign = assign

    def incremental_unassign(self, partitions: list[TopicPartition]) -> None:
        """Give up `partitions`: in on_revoke or on_lost, for the partitions it was called
        with, as confluent-kafka's examples do (the member gives them up when the callback
        returns, whether or not this was called). Elsewhere a KafkaException: a pylog member
        owns what its group gives it until the group moves it; pause() stops reading one."""
        asked = {(tp.topic, tp.partition) for tp in partitions}
        others = sorted(f"{topic}/{number}" for topic, number in asked - self._revoking)
        if others:
            raise KafkaException(
                f"unassign: {', '.join(others)} not being revoked: a pylog member gives up "
                "partitions when its group moves them (in on_revoke); pause() stops reading one"
            )

    def unassign(self) -> None:
        """Give up every partition, in on_revoke or on_lost (incremental_unassign)."""
        revoking = [TopicPartition(topic, number) for topic, number in sorted(self._revoking)]
        self.incremental_unassign(revoking or self.assignment())

    def store_offsets(
        self, message: Message | None = None, offsets: list[TopicPartition] | None = None
    ) -> None:
        """What the next commit (or auto-commit) records: after `message` (its next offset),
        or `offsets` (each partition's offset to read next), for a consumer with
        enable.auto.offset.store false, as confluent-kafka's; KafkaException for a partition
        not owned."""
        if (message is None) == (offsets is None):
            raise TypeError("store_offsets takes a message or offsets")
        stored = (
            {(message.topic(), message.partition()): message.next_offset()}
            if message is not None
            else {(tp.topic, tp.partition): tp.offset for tp in offsets or ()}
        )
        with _as_kafka_errors():
            self._joined().store(stored)

    def pause(self, partitions: list[TopicPartition]) -> None:
        """Stop reading `partitions` of this member's, keeping them (what was fetched for them
        and not handed out is dropped: after `resume` the next message is the one after the
        last one handed out); KafkaException for one not owned."""
        with _as_kafka_errors():
            self._joined().pause((tp.topic, tp.partition) for tp in partitions)

    def resume(self, partitions: list[TopicPartition]) -> None:
        """Read `partitions` again after `pause`; KafkaException for one not owned."""
        with _as_kafka_errors():
            self._joined().resume((tp.topic, tp.partition) for tp in partitions)

    def unsubscribe(self) -> None:
        """Leave the group (committing with auto-commit); on_revoke runs for the partitions
        given up, and may commit them."""
        if self._member is not None:
            try:
                self._member.close()
            finally:
                self._member = None

    def close(self) -> None:
        """Leave the group and close; poll() raises RuntimeError after."""
        if not self._closed:
            self.unsubscribe()
            self._closed = True

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        """Close (leaving the group), as confluent-kafka's Consumer does at the end of a
        `with` block."""
        self.close()
