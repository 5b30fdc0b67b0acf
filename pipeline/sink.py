"""Writing a DataFrame into pylog: `df.write.format("pylog")` and `writeStream.format("pylog")`.

Columns: `value` (binary or string, not null) and, optionally, `key` (binary or string),
`topic` (string; the `topic` option, when given, overrides it), `partition` (an integer; without
it a keyed row goes to xxh32(key) % partitions and a keyless one round robin, as the Python
producer places them), `timestamp` (the message's timestamp; the time of sending without
it) and `headers` (array<struct<key: string, value: binary>>, as spark-sql-kafka's; null or
empty for none). Other columns are not written, as Spark's Kafka sink ignores them.

Delivery is at least once: each task sends its rows with ack FLUSHED (the `ack` option) and
returns only when every batch is acknowledged as flushed (durable and readable); a batch is
retried on a retriable error or a lost reply, so a retried task or batch may write a message
twice. With ack `written` a task returns once every batch is appended (not yet durable); with
`none` once every batch is sent, and the broker's errors are not seen at all. A task that fails
raises PipelineError naming the topic, chained to the broker's error, and Spark fails the write
with both in its message.
"""

from __future__ import annotations

import contextlib
import datetime
import logging
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Final

from pyspark.sql.datasource import DataSourceStreamWriter, DataSourceWriter, WriterCommitMessage
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    DataType,
    IntegerType,
    LongType,
    Row,
    ShortType,
    StringType,
    StructType,
    TimestampType,
)

from broker.client import Ack, Producer
from broker.client.consumer import timestamp_ms
from broker.errors import BrokerError, Unavailable
from broker.log.compression import CODECS
from broker.security import ClientKeys
from pipeline.cluster import CLIENT_ID, bootstrap_endpoint, client_keys
from pipeline.errors import OptionError, PipelineError
from pipeline.options import (
    CLUSTER_KAFKA_OPTIONS,
    CLUSTER_OPTIONS,
    boolean,
    check_known,
    positive_int,
)

log = logging.getLogger(__name__)

SINK_OPTIONS: Final = CLUSTER_OPTIONS | {"topic", "ack", "includeheaders"}
ACKS: Final = {ack.name.lower(): ack for ack in Ack}
"""The `ack` option's values: none, written, flushed, all (as pylogctl produce --ack)."""
KAFKA_ACKS: Final = {"0": Ack.NONE, "1": Ack.WRITTEN, "all": Ack.ALL, "-1": Ack.ALL}
"""kafka.acks, as pylog's nearest ack modes: 1, the leader appended it, is `written`."""
SINK_KAFKA_OPTIONS: Final = CLUSTER_KAFKA_OPTIONS | {
    "kafka.acks",
    "kafka.compression.type",
    "kafka.linger.ms",
    "kafka.batch.size",
    "kafka.enable.idempotence",
}
"""The kafka.* options that mean something to the sink; the rest are logged and ignored."""
SPARK_OPTIONS: Final = frozenset({"checkpointlocation", "path"})
"""Options Spark itself may pass along to a sink; they mean nothing to pylog."""
_COLUMN_TYPES: Final = {
    "value": (BinaryType, StringType),
    "key": (BinaryType, StringType),
    "topic": (StringType,),
    "partition": (IntegerType, LongType, ShortType),
    "timestamp": (TimestampType,),
}


@dataclass(frozen=True, slots=True)
class SinkOptions:
    bootstrap: str
    topic: str | None
    ack: Ack = Ack.FLUSHED
    keys: ClientKeys | None = None
    """What the tasks present to brokers serving Curve (keyFile and brokerKey)."""
    compression: str = "none"
    """kafka.compression.type: each batch a compressed set (docs/storage.md)."""
    linger_ms: float = 10
    """kafka.linger.ms."""
    batch_bytes: int = 1 << 20
    """kafka.batch.size."""
    idempotence: bool = True
    """kafka.enable.idempotence: each batch stored once however often it is sent (not with
    ack none)."""


def parse_sink_options(options: Mapping[str, str], schema: StructType) -> SinkOptions:
    """Check the sink's options and the DataFrame's columns; OptionError names the problem."""
    options = {key.lower(): value for key, value in options.items()}
    check_known(options, SINK_OPTIONS | SPARK_OPTIONS, "sink", SINK_KAFKA_OPTIONS)
    columns = {f.name.lower(): f.dataType for f in schema.fields}
    for name, data_type in columns.items():
        allowed = _COLUMN_TYPES.get(name)
        if name == "headers":
            if not _headers_type(data_type):
                raise OptionError(
                    f"column 'headers' is {data_type.simpleString()}; it must be "
                    "array<struct<key:string,value:binary>> (value may be a string too), as "
                    "Spark's Kafka sink takes it"
                )
            continue
        if allowed is None:
            continue  # not written, as Spark's Kafka sink ignores them (a read's offset, ...)
        if not isinstance(data_type, allowed):
            raise OptionError(
                f"column {name!r} is {data_type.simpleString()}; it must be one of "
                f"{', '.join(t().simpleString() for t in allowed)}"
            )
    if "value" not in columns:
        raise OptionError("the sink needs a value column (binary or string)")
    topic = options.get("topic")
    if topic is None and "topic" not in columns:
        raise OptionError("say where to write: a topic option or a topic column")
    ack = options.get("ack", "flushed").strip().lower()
    if ack not in ACKS:
        raise OptionError(f"ack {ack!r}: use {', '.join(ACKS)}")
    if "kafka.acks" in options:
        kafka_ack = options["kafka.acks"].strip().lower()
        if kafka_ack not in KAFKA_ACKS:
            raise OptionError(f"kafka.acks {kafka_ack!r}: use 0, 1, all or -1")
        if "ack" in options and ACKS[ack] is not KAFKA_ACKS[kafka_ack]:
            raise OptionError(f"ack {ack} and kafka.acks {kafka_ack} say different things")
        ack = KAFKA_ACKS[kafka_ack].name.lower()
    compression = options.get("kafka.compression.type", "none").strip().lower()
    if compression not in CODECS:
        raise OptionError(
            f"kafka.compression.type {compression!r}: pylog takes {', '.join(CODECS)}"
            + (" (snappy's nearest equal here is lz4)" if compression == "snappy" else "")
        )
    linger = options.get("kafka.linger.ms", "10").strip()
    if not linger.isdigit():
        raise OptionError(f"kafka.linger.ms {linger!r}: a whole number of ms, 0 or more")
    idempotence = boolean(options, "kafka.enable.idempotence", True)
    if idempotence and "kafka.enable.idempotence" in options and ack == "none":
        raise OptionError(
            "kafka.enable.idempotence true with ack none: a batch never answered is never "
            "sent again; use kafka.acks 1 or all, or kafka.enable.idempotence false"
        )
    return SinkOptions(
        bootstrap_endpoint(options),
        topic,
        ACKS[ack],
        client_keys(options),
        compression,
        int(linger),
        positive_int(options, "kafka.batch.size") or 1 << 20,
        idempotence,
    )


@dataclass
class SinkCommit(WriterCommitMessage):
    """What one task wrote: topic -> messages sent and acknowledged as the ack option asks."""

    messages: dict[str, int] = field(default_factory=dict)


def _headers_type(data_type: DataType) -> bool:
    """Whether a headers column's type is spark-sql-kafka's (a string value taken as UTF-8)."""
    if not isinstance(data_type, ArrayType) or not isinstance(data_type.elementType, StructType):
        return False
    fields = {f.name.lower(): f.dataType for f in data_type.elementType.fields}
    return (
        len(fields) == 2
        and isinstance(fields.get("key"), StringType)
        and isinstance(fields.get("value"), BinaryType | StringType)
    )


def _headers(column: list[Row] | None) -> list[tuple[str, bytes | None]] | None:
    """A row's headers column as Producer.send takes it; None for no headers."""
    if not column:
        return None
    pairs = []
    for entry in column:
        fields = {name.lower(): value for name, value in entry.asDict().items()}
        key = fields["key"]
        if key is None:
            raise OptionError("a row has a header with a null key")
        pairs.append((key, _bytes(fields["value"])))
    return pairs


def _bytes(value: bytes | bytearray | str | None) -> bytes | None:
    if value is None or isinstance(value, bytes):
        return value
    return value.encode() if isinstance(value, str) else bytes(value)


def _ms(moment: datetime.datetime | None) -> int | None:
    """A timestamp column's value in ms since the epoch: PySpark gives a naive datetime in the
    worker's local time zone."""
    if moment is None:
        return None
    return timestamp_ms(moment.astimezone(datetime.UTC))


def write_rows(options: SinkOptions, rows: Iterator[Row]) -> SinkCommit:
    """Send `rows` and wait until every message is acknowledged as the `ack` option asks (a
    task's body).
    A producer per topic places each message and sends it to the broker holding its
    partition."""
    producers: dict[str, Producer] = {}
    sent: dict[str, int] = {}
    topic = options.topic
    with contextlib.ExitStack() as stack:  # on an error, producers close without flushing
        try:
            for row in rows:
                fields = {name.lower(): value for name, value in row.asDict().items()}
                topic = options.topic or fields.get("topic")
                if topic is None:
                    raise OptionError("a row has a null topic and there is no topic option")
                value = _bytes(fields["value"])
                if value is None:
                    raise OptionError(f"a row for topic {topic!r} has a null value")
                producer = producers.get(topic)
                if producer is None:
                    producer = producers[topic] = stack.enter_context(
                        Producer(
                            options.bootstrap,
                            topic,
                            ack=options.ack,
                            batch_messages=1000,
                            batch_bytes=options.batch_bytes,
                            linger_ms=options.linger_ms,
                            client_id=CLIENT_ID,
                            keys=options.keys,
                            compression=options.compression,
                            idempotence=options.idempotence,
                        )
                    )
                producer.send(
                    value,
                    _bytes(fields.get("key")),
                    _ms(fields.get("timestamp")),
                    fields.get("partition"),
                    _headers(fields.get("headers")),
                )
                sent[topic] = sent.get(topic, 0) + 1
            for producer in producers.values():
                topic = producer.topic
                producer.flush()
        except (BrokerError, Unavailable) as error:
            raise PipelineError(
                f"pylog sink: writing to topic {topic!r} failed: {error}"
            ) from error
    return SinkCommit(sent)


def _committed(messages: list[WriterCommitMessage | None]) -> int:
    return sum(sum(m.messages.values()) for m in messages if isinstance(m, SinkCommit))


class PylogWriter(DataSourceWriter):
    """`df.write.format("pylog")`: each task writes its rows (see the module doc)."""

    def __init__(self, options: SinkOptions) -> None:
        self.options = options

    def write(self, iterator: Iterator[Row]) -> SinkCommit:
        return write_rows(self.options, iterator)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        log.info("pylog sink: %d messages written", _committed(messages))

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        log.warning(
            "pylog sink: write failed; %d messages of the tasks that succeeded were written "
            "and stay in the log (at-least-once)",
            _committed(messages),
        )


class PylogStreamWriter(DataSourceStreamWriter):
    """`writeStream.format("pylog")`: each micro-batch as `PylogWriter` writes a DataFrame."""

    def __init__(self, options: SinkOptions) -> None:
        self.options = options

    def write(self, iterator: Iterator[Row]) -> SinkCommit:
        return write_rows(self.options, iterator)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        log.info("pylog sink: batch %d: %d messages written", batchId, _committed(messages))

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        log.warning(
            "pylog sink: batch %d failed; %d messages of its tasks that succeeded stay in the "
            "log (at-least-once)",
            batchId,
            _committed(messages),
        )
