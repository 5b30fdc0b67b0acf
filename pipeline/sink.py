"""Writing a DataFrame into pylog: `df.write.format("pylog")` and `writeStream.format("pylog")`.

Columns: `value` (binary or string, not null) and, optionally, `key` (binary or string),
`topic` (string; the `topic` option, when given, overrides it), `partition` (an integer; without
it a keyed row goes to xxh32(key) % partitions and a keyless one round robin, as the Python
producer places them), `timestamp` (the message's timestamp; the time of sending without
it) and `headers` (array<struct<key: string, value: binary>>, as spark-sql-kafka's; null or
empty for none). Other columns are not written, as Spark's Kafka sink ignores them.

Delivery is exactly once (`exactlyOnce`, true by default; docs/pipeline.md says what it
needs): each task's producers have a fixed identity (broker.client.producer), derived from
what Spark gives a task run again (`identity`): for `df.write`, a write id drawn on the driver
and the task's partition; for `writeStream`, the query's id (kept in its checkpoint), the
batch id and the task's partition. Their batches are the same each run, so the sets a retried
task, a speculative copy of it or a replayed batch sends again are answered with their first
offsets and stored once. Only full batches: a Python writer's input ends as if whole when the
task fails upstream of it (an exception in a UDF: Spark gives the writer no error), so a task
cannot tell its last batches, not full, from a failed run's. It leaves them to the driver in
its commit message (`SinkCommit.tails`), with the sequence each would have had, and the driver
sends them (`send_tails`) under the task's identity once Spark commits the write or the
micro-batch: sent again when a replayed batch commits again, they are stored once too. Each task
sends its rows with ack FLUSHED (the `ack` option) and returns only when every batch it sent
is acknowledged as flushed (durable and readable); the driver's commit, when every tail is. With
`exactlyOnce` false (or without idempotence, or with ack `none`, where it cannot hold)
delivery is at least once: a task's producers take random ids, and a retried task or batch
writes its rows again. With ack `written` a task returns once every batch is appended (not yet
durable); with `none` once every batch is sent, and the broker's errors are not seen at all. A
task that fails raises PipelineError naming the topic, chained to the broker's error, and
Spark fails the write with both in its message.
"""

from __future__ import annotations

import contextlib
import datetime
import logging
import secrets
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Final

import xxhash
from pyspark import TaskContext
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

SINK_OPTIONS: Final = CLUSTER_OPTIONS | {"topic", "ack", "includeheaders", "exactlyonce"}
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
QUERY_ID: Final = "sql.streaming.queryId"
"""The local property that names a streaming query's task's query: its id, kept in its
checkpoint (StreamingQuery.id, not the run's)."""
BATCH_ID: Final = "streaming.sql.batchId"
"""The local property holding a micro-batch task's batch id."""
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
    exactly_once: bool = True
    """exactlyOnce: each task's producers have a fixed identity (`task_identity`)."""


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
    possible = idempotence and ack != "none"
    exactly_once = boolean(options, "exactlyOnce", possible)
    if exactly_once and not possible:
        raise OptionError(
            "exactlyOnce true needs idempotence and acks: not with "
            + ("ack none" if ack == "none" else "kafka.enable.idempotence false")
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
        exactly_once,
    )


@dataclass
class SinkCommit(WriterCommitMessage):
    """What one task wrote: topic -> messages sent and acknowledged as the ack option asks
    (with exactly once, its tails' included); and, with exactly once, its run and the
    batches it left to the driver: topic -> partition -> (sequence, encoded messages)
    (send_tails)."""

    messages: dict[str, int] = field(default_factory=dict)
    run: Run | None = None
    tails: dict[str, dict[int, tuple[int, list[bytes]]]] = field(default_factory=dict)


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


def identity(run: Run) -> tuple[int, int]:
    """The fixed identity (producer id, epoch) of the producers of `run`'s task (and of its
    tails, on the driver): the same in every run of the task; the batch id is the epoch
    (modulo 2^16, its higher bits go into the id), so that a copy of an earlier batch's task
    still running is fenced by the next batch's."""
    key = f"pylog sink {run.name} {run.partition} {run.batch_id >> 16}"
    return xxhash.xxh3_64_intdigest(key.encode()) >> 1 or 1, run.batch_id & 0xFFFF


def _task() -> TaskContext:
    context = TaskContext.get()
    if context is None:
        raise PipelineError("pylog sink: exactly once is for Spark tasks (no TaskContext)")
    return context


@dataclass(frozen=True, slots=True)
class Run:
    """What names a task's run for exactly once: the write's id or the query's, its batch id
    (0 for a write), and the task's Spark partition."""

    name: str
    batch_id: int
    partition: int


def write_rows(options: SinkOptions, rows: Iterator[Row], run: Run | None = None) -> SinkCommit:
    """Send `rows` and wait until every message is acknowledged as the `ack` option asks (a
    task's body); with `run` (exactly once), under its identity, and the batches not full
    left in the commit message, unsent.
    A producer per topic places each message and sends it to the broker holding its
    partition."""
    producers: dict[str, Producer] = {}
    sent: dict[str, int] = {}
    tails: dict[str, dict[int, tuple[int, list[bytes]]]] = {}
    fixed = None if run is None else identity(run)
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
                            identity=fixed,
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
                if run is None:
                    producer.flush()
                else:
                    tails[topic] = producer.take_unsent()
        except (BrokerError, Unavailable) as error:
            raise PipelineError(
                f"pylog sink: writing to topic {topic!r} failed: {error}"
            ) from error
    return SinkCommit(sent, run, tails)


def send_tails(options: SinkOptions, messages: list[WriterCommitMessage | None]) -> None:
    """On the driver, once Spark commits: send each task's batches not full (its commit
    message's tails), under its run's identity, one set a partition at the sequence it would
    have had in the task; raises PipelineError when one is not stored."""
    for message in messages:
        if not isinstance(message, SinkCommit) or message.run is None:
            continue
        run = message.run
        fixed = identity(run)
        for topic, unsent in message.tails.items():
            try:
                with Producer(
                    options.bootstrap,
                    topic,
                    ack=options.ack,
                    client_id=CLIENT_ID,
                    keys=options.keys,
                    compression=options.compression,
                    identity=fixed,
                ) as producer:
                    for partition, (sequence, encoded) in sorted(unsent.items()):
                        producer.send_set(partition, encoded, sequence)
            except (BrokerError, Unavailable) as error:
                raise PipelineError(
                    f"pylog sink: writing the last rows of Spark partition {run.partition} "
                    f"to topic {topic!r} failed: {error}"
                ) from error


def _committed(messages: list[WriterCommitMessage | None]) -> int:
    return sum(sum(m.messages.values()) for m in messages if isinstance(m, SinkCommit))


class PylogWriter(DataSourceWriter):
    """`df.write.format("pylog")`: each task writes its rows (see the module doc); made on the
    driver once a write, with the write's id (`write_id`), which every run of its tasks gets."""

    def __init__(self, options: SinkOptions) -> None:
        self.options = options
        self.write_id = secrets.token_hex(16)

    def write(self, iterator: Iterator[Row]) -> SinkCommit:
        run = None
        if self.options.exactly_once:
            run = Run(self.write_id, 0, _task().partitionId())
        return write_rows(self.options, iterator, run)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        send_tails(self.options, messages)
        log.info("pylog sink: %d messages written", _committed(messages))

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        log.warning(
            "pylog sink: write failed; %d messages of the tasks that succeeded were written "
            "and stay in the log (writing the DataFrame again writes them again)",
            _committed(messages),
        )


class PylogStreamWriter(DataSourceStreamWriter):
    """`writeStream.format("pylog")`: each micro-batch as `PylogWriter` writes a DataFrame."""

    def __init__(self, options: SinkOptions) -> None:
        self.options = options

    def write(self, iterator: Iterator[Row]) -> SinkCommit:
        run = None
        if self.options.exactly_once:
            context = _task()
            query = context.getLocalProperty(QUERY_ID)
            batch = context.getLocalProperty(BATCH_ID)
            if not query or not batch:
                raise PipelineError(
                    "pylog sink: exactly once needs the streaming query's id and batch id, "
                    "which this Spark did not give the task; set exactlyOnce false"
                )
            run = Run(query, int(batch), context.partitionId())
        return write_rows(self.options, iterator, run)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        send_tails(self.options, messages)
        log.info("pylog sink: batch %d: %d messages written", batchId, _committed(messages))

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        log.warning(
            "pylog sink: batch %d failed; %d messages of its tasks that succeeded stay in the "
            "log (the batch run again is stored once, with exactlyOnce)",
            batchId,
            _committed(messages),
        )
