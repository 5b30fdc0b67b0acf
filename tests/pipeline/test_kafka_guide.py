"""Spark's Kafka integration guide (docs/streaming/structured-streaming-kafka-integration.md,
Spark 4), its 11 Python snippets run as written with `format("kafka")` changed to
`format("pylog")` and the guide's "host1:port1,host2:port2" to this broker's address, on the
topics the guide names (topic1, topic2: this module's broker has no others, so its pattern
`topic.*` means the same). Two things differ, both in docs/pipeline.md: a batch write needs
`.mode("append")` (Spark's own rule for Python data sources, which refuses the default mode
before pylog is asked), and the guide's numeric offsets 23 and 50 are Kafka's message numbers
where pylog's offsets are byte positions (the error says what to write instead)."""

from __future__ import annotations

import ast
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pyspark.errors import PySparkException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming.query import StreamingQuery

from broker.client import Admin, PartitionConsumer, Producer
from tests.conftest import wait_until
from tests.pylogd import RunningBroker

GUIDE_ADDRESS = "host1:port1,host2:port2"

STREAM_READS = {
    "Subscribe to 1 topic": """
df = spark \\
  .readStream \\
  .format("kafka") \\
  .option("kafka.bootstrap.servers", "host1:port1,host2:port2") \\
  .option("subscribe", "topic1") \\
  .load()
df.selectExpr("CAST(key AS STRING)", "CAST(value AS STRING)")
""",
    "Subscribe to 1 topic, with headers": """
df = spark \\
  .readStream \\
  .format("kafka") \\
  .option("kafka.bootstrap.servers", "host1:port1,host2:port2") \\
  .option("subscribe", "topic1") \\
  .option("includeHeaders", "true") \\
  .load()
df.selectExpr("CAST(key AS STRING)", "CAST(value AS STRING)", "headers")
""",
    "Subscribe to multiple topics": """
df = spark \\
  .readStream \\
  .format("kafka") \\
  .option("kafka.bootstrap.servers", "host1:port1,host2:port2") \\
  .option("subscribe", "topic1,topic2") \\
  .load()
df.selectExpr("CAST(key AS STRING)", "CAST(value AS STRING)")
""",
    "Subscribe to a pattern": """
df = spark \\
  .readStream \\
  .format("kafka") \\
  .option("kafka.bootstrap.servers", "host1:port1,host2:port2") \\
  .option("subscribePattern", "topic.*") \\
  .load()
df.selectExpr("CAST(key AS STRING)", "CAST(value AS STRING)")
""",
}

BATCH_READS = {
    "Subscribe to 1 topic defaults to the earliest and latest offsets": """
df = spark \\
  .read \\
  .format("kafka") \\
  .option("kafka.bootstrap.servers", "host1:port1,host2:port2") \\
  .option("subscribe", "topic1") \\
  .load()
df.selectExpr("CAST(key AS STRING)", "CAST(value AS STRING)")
""",
    "Subscribe to multiple topics, specifying explicit Kafka offsets": '''
df = spark \\
  .read \\
  .format("kafka") \\
  .option("kafka.bootstrap.servers", "host1:port1,host2:port2") \\
  .option("subscribe", "topic1,topic2") \\
  .option("startingOffsets", """{"topic1":{"0":23,"1":-2},"topic2":{"0":-2}}""") \\
  .option("endingOffsets", """{"topic1":{"0":50,"1":-1},"topic2":{"0":-1}}""") \\
  .load()
df.selectExpr("CAST(key AS STRING)", "CAST(value AS STRING)")
''',
    "Subscribe to a pattern, at the earliest and latest offsets": """
df = spark \\
  .read \\
  .format("kafka") \\
  .option("kafka.bootstrap.servers", "host1:port1,host2:port2") \\
  .option("subscribePattern", "topic.*") \\
  .option("startingOffsets", "earliest") \\
  .option("endingOffsets", "latest") \\
  .load()
df.selectExpr("CAST(key AS STRING)", "CAST(value AS STRING)")
""",
}

STREAM_WRITES = {
    "to a specific Kafka topic specified in an option": """
ds = df \\
  .selectExpr("CAST(key AS STRING)", "CAST(value AS STRING)") \\
  .writeStream \\
  .format("kafka") \\
  .option("kafka.bootstrap.servers", "host1:port1,host2:port2") \\
  .option("topic", "topic1") \\
  .start()
""",
    "to Kafka using a topic specified in the data": """
ds = df \\
  .selectExpr("topic", "CAST(key AS STRING)", "CAST(value AS STRING)") \\
  .writeStream \\
  .format("kafka") \\
  .option("kafka.bootstrap.servers", "host1:port1,host2:port2") \\
  .start()
""",
}

BATCH_WRITES = {
    "to a specific Kafka topic specified in an option": """
df.selectExpr("CAST(key AS STRING)", "CAST(value AS STRING)") \\
  .write \\
  .format("kafka") \\
  .option("kafka.bootstrap.servers", "host1:port1,host2:port2") \\
  .option("topic", "topic1") \\
  .save()
""",
    "to Kafka using a topic specified in the data": """
df.selectExpr("topic", "CAST(key AS STRING)", "CAST(value AS STRING)") \\
  .write \\
  .format("kafka") \\
  .option("kafka.bootstrap.servers", "host1:port1,host2:port2") \\
  .save()
""",
}


def as_pylog(snippet: str, broker: RunningBroker) -> str:
    """The guide's `snippet` with its format and address changed, and nothing else."""
    changed = snippet.replace('.format("kafka")', '.format("pylog")')
    changed = changed.replace(GUIDE_ADDRESS, broker.endpoint.removeprefix("tcp://"))
    differing = [
        (old, new)
        for old, new in zip(snippet.splitlines(), changed.splitlines(), strict=True)
        if old != new
    ]
    assert [old.strip() for old, _ in differing] == [
        '.format("kafka") \\',
        '.option("kafka.bootstrap.servers", "host1:port1,host2:port2") \\',
    ]
    return changed


def run_snippet(snippet: str, broker: RunningBroker, **names: Any) -> dict[str, Any]:
    """Run the guide's `snippet` (as_pylog) with `names` (spark, df) defined: what it
    defined, and `_` the value of its last statement when that is an expression."""
    tree = ast.parse(as_pylog(snippet, broker))
    scope: dict[str, Any] = dict(names)
    *body, last = tree.body
    exec(compile(ast.Module(body, []), "<guide>", "exec"), scope)
    if isinstance(last, ast.Expr):
        scope["_"] = eval(compile(ast.Expression(last.value), "<guide>", "eval"), scope)
    else:
        exec(compile(ast.Module([last], []), "<guide>", "exec"), scope)
    return scope


def stored(broker: RunningBroker, topic: str) -> list[tuple[int, int, bytes]]:
    """(partition, offset, value) of every message of `topic`, as a consumer reads them."""
    with Admin(broker.endpoint) as admin:
        partitions = len(admin.topic(topic).partitions)
    found = []
    for partition in range(partitions):
        with PartitionConsumer(broker.endpoint, topic, partition, stop_at_end=True) as reader:
            found += [(partition, m.offset, m.value) for m in reader]
    return found


def send(broker: RunningBroker, topic: str, partition: int, *values: str) -> None:
    with Producer(broker.endpoint, topic) as producer:
        for value in values:
            producer.send(value.encode(), b"k", partition=partition, headers=[("h", b"v")])


@pytest.fixture(scope="module")
def guide_topics(broker: RunningBroker) -> Iterator[None]:
    """topic1 (2 partitions) and topic2 (1), a few messages in each."""
    with Admin(broker.endpoint) as admin:
        admin.create_topic("topic1", 2)
        admin.create_topic("topic2", 1)
    for n in range(4):
        send(broker, "topic1", 0, f"t1p0-{n}")
        send(broker, "topic1", 1, f"t1p1-{n}")
    send(broker, "topic2", 0, "t2p0-0", "t2p0-1")
    yield


def values_of(frame: DataFrame) -> list[str]:
    return sorted(row.value for row in frame.collect())


def test_the_guides_batch_reads_run_with_the_format_and_address_changed(
    spark: SparkSession, broker: RunningBroker, guide_topics: None
) -> None:
    everything = {t: stored(broker, t) for t in ("topic1", "topic2")}
    first, multiple, pattern = BATCH_READS.values()

    assert values_of(run_snippet(first, broker, spark=spark)["_"]) == sorted(
        v.decode() for _, _, v in everything["topic1"]
    )
    assert values_of(run_snippet(pattern, broker, spark=spark)["_"]) == sorted(
        v.decode() for t in everything.values() for _, _, v in t
    )

    # As written: Kafka's message numbers, which are not where pylog's messages start
    with pytest.raises(PySparkException) as refused:
        run_snippet(multiple, broker, spark=spark)["_"].collect()
    assert "offset 23 is not a message boundary (offsets are byte positions" in str(refused.value)
    assert "startingOffsetsByTimestamp" in str(refused.value)
    # Translated as docs/pipeline.md says: byte offsets a read returned
    starts = [offset for partition, offset, _ in everything["topic1"] if partition == 0]
    translated = multiple.replace('"0":23', f'"0":{starts[1]}').replace(
        '"0":50', f'"0":{starts[3]}'
    )
    read = values_of(run_snippet(translated, broker, spark=spark)["_"])
    assert read == sorted(
        [
            *(
                v.decode()
                for p, o, v in everything["topic1"]
                if p == 1 or starts[1] <= o < starts[3]
            ),
            *(v.decode() for _, _, v in everything["topic2"]),
        ]
    )


def memory_query(frame: DataFrame, name: str) -> StreamingQuery:
    writer = frame.writeStream.format("memory").queryName(name)
    return writer.trigger(processingTime="100 milliseconds").start()


READS_TOPICS = {
    "Subscribe to 1 topic": {"topic1"},
    "Subscribe to 1 topic, with headers": {"topic1"},
    "Subscribe to multiple topics": {"topic1", "topic2"},
    "Subscribe to a pattern": {"topic1", "topic2"},
}
"""The topics each streaming snippet reads."""


@pytest.mark.parametrize("title", list(STREAM_READS))
def test_the_guides_stream_reads_run_with_the_format_and_address_changed(
    spark: SparkSession, broker: RunningBroker, guide_topics: None, title: str
) -> None:
    frame = run_snippet(STREAM_READS[title], broker, spark=spark)["_"]
    name = "guide_" + "".join(c if c.isalnum() else "_" for c in title)
    query = memory_query(frame, name)
    try:  # the guide's streams start at latest: what is sent once one started is read
        wait_until(lambda: query.lastProgress is not None, what="the stream's first batch")
        marker = f"{name}-{time.monotonic_ns()}"
        send(broker, "topic1", 1, f"{marker}-topic1")
        send(broker, "topic2", 0, f"{marker}-topic2")

        def read() -> list[Any]:
            return spark.sql(f"SELECT * FROM {name}").collect()

        wanted = {f"{marker}-{topic}" for topic in READS_TOPICS[title]}
        wait_until(lambda: {r.value for r in read()} >= wanted, what=f"{title}: {wanted}")
        rows = read()
        assert {r.value for r in rows} == wanted  # nothing from before it, nor other topics
        assert all(r.key == "k" for r in rows)
        if "headers" in STREAM_READS[title]:
            assert [(h.key, bytes(h.value)) for h in rows[0].headers] == [("h", b"v")]
    finally:
        query.stop()


@pytest.fixture
def checkpoints(spark: SparkSession, tmp_path: Path) -> Iterator[None]:
    """Spark's session-wide checkpoint location, which the guide's stream writes rely on (they
    name none), set for one test."""
    spark.conf.set("spark.sql.streaming.checkpointLocation", str(tmp_path))
    yield
    spark.conf.unset("spark.sql.streaming.checkpointLocation")


@pytest.mark.parametrize("title", list(STREAM_WRITES))
def test_the_guides_stream_writes_run_with_the_format_and_address_changed(
    spark: SparkSession, broker: RunningBroker, guide_topics: None, checkpoints: None, title: str
) -> None:
    source = f"source-{len(title)}"  # not topic.*
    with Admin(broker.endpoint) as admin:
        admin.create_topic(source, 1)
    marker = f"written-{time.monotonic_ns()}"
    send(broker, source, 0, f"{marker}-a", f"{marker}-b")
    df = (  # the guide's df is the user's: here a stream of `source`, its rows for topic2
        spark.readStream.format("pylog")
        .options(broker=broker.endpoint, subscribe=source, startingOffsets="earliest")
        .load()
        .selectExpr("key", "value", "'topic2' AS topic")
    )
    query: StreamingQuery = run_snippet(STREAM_WRITES[title], broker, spark=spark, df=df)["ds"]
    try:
        query.processAllAvailable()
    finally:
        query.stop()
    target = "topic1" if '"topic1"' in STREAM_WRITES[title] else "topic2"
    got = sorted(v.decode() for _, _, v in stored(broker, target) if v.startswith(b"written"))
    assert got == [f"{marker}-a", f"{marker}-b"]


@pytest.mark.parametrize("title", list(BATCH_WRITES))
def test_the_guides_batch_writes_run_in_append_mode_as_docs_pipeline_says(
    spark: SparkSession, broker: RunningBroker, guide_topics: None, title: str
) -> None:
    marker = f"batch-{time.monotonic_ns()}"
    df = spark.createDataFrame(
        [("k", f"{marker}-{n}", "topic2") for n in range(3)],
        "key string, value string, topic string",
    )
    snippet = BATCH_WRITES[title]
    with pytest.raises(PySparkException, match="UNSUPPORTED_DATA_SOURCE_SAVE_MODE"):
        run_snippet(snippet, broker, df=df)  # as written: Spark refuses its default mode
    assert not [v for _, _, v in stored(broker, "topic2") if v.startswith(marker.encode())]

    run_snippet(snippet.replace(".save()", '.mode("append").save()'), broker, df=df)
    target = "topic1" if '"topic1"' in snippet else "topic2"
    got = sorted(v.decode() for _, _, v in stored(broker, target) if v.startswith(marker.encode()))
    assert got == [f"{marker}-{n}" for n in range(3)]
