"""`python -m pipeline.audit`: messages per hour in pylog against those loaded into Parquet.

The Kafka paper's audit: for one topic and a time window, count the messages of each hour
(UTC, by message timestamp) in the topic and in a load's output (pipeline.load), print both
side by side, and exit 1 if any hour differs, 0 if none does. Each side's hour also has the sum
of its messages' digests (broker.client.audit.message_digest): where the counts agree and the
sums do not, the content differs (a message changed, replaced, moved, or one lost and another
added), and the two sides are compared place by place (partition, offset) to name where it
first does.

Across clusters (`--mirror-broker`: the target of pylog-mirror, docs/mirror.md), each hour is
counted at every stage the messages pass: what producers counted (`--audit-topic`), what the
source cluster stored, what the mirror's target stored, and what was loaded into Parquet (from
the target, the warehouse-side cluster); the report says which stage lost (or added) how many:
`source` (producers -> source), `mirror` (source -> target), `load` (target -> Parquet).

The topic is read from the first offset at or after the window's start in each partition
(OFFSETS by time: every message before it is older) to its high watermark, since producers'
timestamps need not grow with offsets. Audit a window that has been loaded in full (messages
produced into it after the last load count as missing) and that retention has not touched
yet (deleted messages count as extra). A Parquet file that is logged as loaded but gone is
counted as missing, not an error: that is what an audit is for.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import logging
import sys
from collections.abc import Iterator, Mapping
from typing import Final

import click
import pyarrow as pa
from pyspark.errors import AnalysisException, PySparkException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import LongType, StringType, StructField, StructType

from broker.client.audit import DIGEST_MODULUS, WINDOW_MS, message_digest
from broker.client.consumer import timestamp_ms
from broker.errors import PylogError
from pipeline.audit_report import (
    HourCount,
    Where,
    format_stages,
    format_table,
    hour_fields,
    mirror_totals,
)
from pipeline.load import LOADED_SCHEMA, MICROS_PER_HOUR, epoch_micros
from pipeline.session import (
    cluster_options,
    failure_message,
    job_options,
    job_session,
    show_progress,
)
from pipeline.source import workers_with_pylog

log = logging.getLogger("pipeline.audit")  # not __name__: "__main__" under python -m

EXIT_DIFFERENCE: Final = 1
_DATE_FORMATS: Final = ["%Y-%m-%dT%H:%M:%S", "%Y-%m-%dT%H:%M", "%Y-%m-%d %H:%M", "%Y-%m-%d"]


AUDIT_RECORD: Final = StructType(
    [
        StructField("producer", StringType()),
        StructField("topic", StringType()),
        StructField("window_start_ms", LongType()),
        StructField("window_ms", LongType()),
        StructField("count", LongType()),
        StructField("digest", StringType()),
    ]
)
"""broker.client.audit.AuditRecord, as the JSON value of an audit topic's messages."""

PerHour = dict[int, tuple[int, int | None]]
"""Hours since the epoch -> (messages, the sum of their digests modulo 2**64, or None)."""


def produced_per_hour(
    spark: SparkSession,
    cluster: Mapping[str, str],
    audit_topic: str,
    topic: str,
    start_ms: int,
    end_ms: int,
) -> PerHour:
    """Messages of `topic` that producers counted as produced, per hour in [start_ms, end_ms),
    with their digests: each producer's largest running total of each hour (and that record's
    digest), summed over producers; an hour's digest is None when a record of it has none
    (ack NONE, or a producer of an older pylog). Records that are not audit records are
    counted and logged."""
    records = (
        spark.read.format("pylog")
        .options(**cluster, subscribe=audit_topic)
        .load()
        .select(F.from_json(F.col("value").cast("string"), AUDIT_RECORD).alias("r"))
        .select("r.*")
        .cache()
    )
    malformed = records.where(F.col("count").isNull() | (F.col("window_ms") != WINDOW_MS)).count()
    if malformed:
        log.warning(
            "%d records of %s are not hourly audit records: left out", malformed, audit_topic
        )
    totals = (
        records.where(
            (F.col("topic") == topic)
            & (F.col("window_ms") == WINDOW_MS)
            & (F.col("window_start_ms") >= start_ms)
            & (F.col("window_start_ms") < end_ms)
        )
        .groupBy("producer", "window_start_ms")
        .agg(F.max("count").alias("count"), F.max_by("digest", "count").alias("digest"))
        .collect()
    )
    records.unpersist()
    produced: dict[int, tuple[int, int | None]] = {}
    for row in totals:
        hour = int(row["window_start_ms"]) // WINDOW_MS
        count, digest = produced.get(hour, (0, 0))
        mine = None if row["digest"] is None else int(row["digest"], 16)
        digest = None if digest is None or mine is None else (digest + mine) % DIGEST_MODULUS
        produced[hour] = (count + int(row["count"]), digest)
    return produced


DIGESTED: Final = "partition int, offset long, micros long, digest_low long, digest_high long"
"""Each message's place and time and its digest, in two 32-bit halves (Spark adds longs)."""


def _digested(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """Rows of (partition, offset, micros, key, value) with each message's digest
    (broker.client.audit.message_digest), in Spark's Python workers."""
    for batch in batches:
        columns = batch.to_pydict()
        digests = [
            message_digest(partition, offset, micros // 1000, key, value)
            for partition, offset, micros, key, value in zip(
                columns["partition"],
                columns["offset"],
                columns["micros"],
                columns["key"],
                columns["value"],
                strict=True,
            )
        ]
        yield pa.RecordBatch.from_pydict(
            {
                "partition": columns["partition"],
                "offset": columns["offset"],
                "micros": columns["micros"],
                "digest_low": [d & 0xFFFFFFFF for d in digests],
                "digest_high": [d >> 32 for d in digests],
            },
            schema=pa.schema(
                [
                    ("partition", pa.int32()),
                    ("offset", pa.int64()),
                    ("micros", pa.int64()),
                    ("digest_low", pa.int64()),
                    ("digest_high", pa.int64()),
                ]
            ),
        )


def _digests(rows: DataFrame, start_us: int, end_us: int) -> DataFrame:
    """DIGESTED of `rows` (the source's or the load's) whose timestamps are in [start_us,
    end_us)."""
    micros = epoch_micros("timestamp")
    selected = rows.where((micros >= start_us) & (micros < end_us)).select(
        "partition", "offset", micros.alias("micros"), "key", "value"
    )
    with workers_with_pylog(rows.sparkSession):  # _digested needs pylog and pyarrow
        return selected.mapInArrow(_digested, DIGESTED)


def _summed(low: int | None, high: int | None) -> int:
    """Sums of digests' halves as one sum modulo 2**64."""
    return (((high or 0) << 32) + (low or 0)) % DIGEST_MODULUS


def _per_hour(rows: DataFrame, start_us: int, end_us: int) -> PerHour:
    counted = (
        _digests(rows, start_us, end_us)
        .groupBy(F.expr(f"micros div {MICROS_PER_HOUR}").alias("hour"))
        .agg(
            F.count("*").alias("count"),
            F.sum("digest_low").alias("low"),
            F.sum("digest_high").alias("high"),
        )
        .collect()
    )
    return {
        int(row["hour"]): (int(row["count"]), _summed(row["low"], row["high"])) for row in counted
    }


def first_difference(before: DataFrame, after: DataFrame, hour: int) -> Where | None:
    """Where two sides' messages of `hour` first differ: the places (partition, offset) whose
    messages (how many, and their digests) are not the same on both; None when none is."""
    start_us = hour * MICROS_PER_HOUR

    def places(rows: DataFrame) -> DataFrame:
        return (
            _digests(rows, start_us, start_us + MICROS_PER_HOUR)
            .groupBy("partition", "offset")
            .agg(
                F.count("*").alias("n"),
                F.sum("digest_low").alias("low"),
                F.sum("digest_high").alias("high"),
            )
        )

    left, right = places(before).alias("l"), places(after).alias("r")
    joined = left.join(right, ["partition", "offset"], "full_outer")
    same = (
        F.col("l.n").eqNullSafe(F.col("r.n"))
        & F.col("l.low").eqNullSafe(F.col("r.low"))
        & F.col("l.high").eqNullSafe(F.col("r.high"))
    )
    differing = joined.where(~same).select("partition", "offset").cache()
    try:
        places_differing = differing.count()
        if not places_differing:
            return None
        first = differing.orderBy("partition", "offset").first()
        assert first is not None
        return Where(int(first["partition"]), int(first["offset"]), places_differing)
    finally:
        differing.unpersist()


def audit(
    spark: SparkSession,
    cluster: Mapping[str, str],
    topic: str,
    output: str,
    start: datetime.datetime,
    end: datetime.datetime,
    audit_topic: str | None = None,
    mirror: Mapping[str, str] | None = None,
) -> list[HourCount]:
    """Per-hour counts of `topic` in [start, end) (UTC when naive), in pylog and in the load
    at `output`, with `audit_topic` what its producers counted (start and end must then be
    whole hours; the audit topic is read from `cluster`), and with `mirror` (the options of
    pylog-mirror's target cluster) what the target holds: every hour that has messages on
    any side, in order."""
    start, end = (m if m.tzinfo else m.replace(tzinfo=datetime.UTC) for m in (start, end))
    if end <= start:
        raise ValueError(f"the window ends ({end}) before it starts ({start})")
    start_us, end_us = timestamp_ms(start) * 1000, timestamp_ms(end) * 1000
    produced: PerHour | None = None
    if audit_topic is not None:
        if start_us % MICROS_PER_HOUR or end_us % MICROS_PER_HOUR:
            raise ValueError(
                f"with an audit topic the window starts and ends on whole hours (producers "
                f"count per hour): {start:%Y-%m-%d %H:%M} to {end:%Y-%m-%d %H:%M} does not"
            )
        produced = produced_per_hour(
            spark, cluster, audit_topic, topic, start_us // 1000, end_us // 1000
        )
    sides: dict[str, DataFrame] = {"in_pylog": stored_rows(spark, cluster, topic, start)}
    if mirror is not None:
        sides["mirrored"] = stored_rows(spark, mirror, topic, start)
    counted = {name: _per_hour(rows, start_us, end_us) for name, rows in sides.items()}
    try:
        parquet = (
            spark.read.schema(LOADED_SCHEMA)
            .option("ignoreMissingFiles", "true")
            .parquet(output)
            .where(F.col("topic") == topic)
            .where(F.col("date").between(start.date(), end.date()))
        )
        counted["loaded"] = _per_hour(parquet, start_us, end_us)
        sides["loaded"] = parquet
    except AnalysisException as error:
        if error.getCondition() != "PATH_NOT_FOUND":
            raise
        log.warning("%s does not exist: nothing was loaded there", output)
        counted["loaded"] = {}
    if produced is not None:
        counted["produced"] = produced
    counts = []
    for hour in sorted(set().union(*counted.values())):
        count = HourCount(
            datetime.datetime.fromtimestamp(hour * 3600, datetime.UTC),
            counted["in_pylog"].get(hour, (0, 0))[0],
            counted["loaded"].get(hour, (0, 0))[0],
            None if produced is None else produced.get(hour, (0, 0))[0],
            None if mirror is None else counted["mirrored"].get(hour, (0, 0))[0],
            {name: per_hour.get(hour, (0, 0))[1] for name, per_hour in counted.items()},
        )
        where = {stage: _where(sides, count, stage, hour) for stage in count.changed}
        counts.append(dataclasses.replace(count, where=where))
    return counts


def _where(sides: Mapping[str, DataFrame], count: HourCount, stage: str, hour: int) -> Where | None:
    """Where `stage`'s content first differs in `hour` (None for the producers' stage: their
    records say no offsets)."""
    if stage == "source":
        return None
    before = "in_pylog" if stage == "mirror" or count.mirrored is None else "mirrored"
    after = "mirrored" if stage == "mirror" else "loaded"
    return first_difference(sides[before], sides[after], hour)


def stored_rows(
    spark: SparkSession, cluster: Mapping[str, str], topic: str, start: datetime.datetime
) -> DataFrame:
    """The messages of `topic` in `cluster` from the first offset at or after `start` of each
    partition."""
    return (
        spark.read.format("pylog")
        .options(**cluster, subscribe=topic, startingTimestamp=str(timestamp_ms(start)))
        .load()
    )


@click.command()
@job_options
@click.option("--topic", required=True, help="The topic to audit.")
@click.option("--output", required=True, help="The load's Parquet directory.")
@click.option(
    "--start",
    type=click.DateTime(_DATE_FORMATS),
    required=True,
    help="The window's start (UTC), e.g. 2026-11-22T13:00.",
)
@click.option(
    "--end", type=click.DateTime(_DATE_FORMATS), required=True, help="The window's end (UTC)."
)
@click.option(
    "--audit-topic",
    help="Also compare with what producers counted as produced, from the audit records they "
    "publish to this topic (Producer(audit_topic=...)); --start and --end on whole hours.",
)
@click.option(
    "--mirror-broker",
    metavar="ADDRESS",
    help="Also count the topic in pylog-mirror's target cluster (a broker of it): the report "
    "says which stage lost what (producers -> source -> mirror target -> Parquet, the load "
    "read from the target).",
)
@click.option(
    "--mirror-zookeeper", help="Find the mirror's target in ZooKeeper instead (as --zookeeper)."
)
@click.option(
    "--mirror-key-file", metavar="PATH", help="--key-file for the mirror's target cluster."
)
@click.option(
    "--mirror-broker-key", metavar="KEY|PATH", help="--broker-key of the mirror's target cluster."
)
@click.option(
    "--json", "as_json", is_flag=True, help="One JSON object a line: each hour, then the total."
)
def main(
    broker: str | None,
    zookeeper: str | None,
    key_file: str | None,
    broker_key: str | None,
    master: str | None,
    conf: list[tuple[str, str]],
    topic: str,
    output: str,
    start: datetime.datetime,
    end: datetime.datetime,
    audit_topic: str | None,
    mirror_broker: str | None,
    mirror_zookeeper: str | None,
    mirror_key_file: str | None,
    mirror_broker_key: str | None,
    as_json: bool,
) -> None:
    """Count a topic's messages per hour in pylog and in a load's Parquet output (and with
    --audit-topic, what its producers counted as produced; with --mirror-broker, what
    pylog-mirror's target holds), and compare their content by digest; exit 1 if any hour
    differs, naming the stage, partition and offset where content first changed.

    \b
    Examples:
      $ pylogctl audit --topic clicks --output ./warehouse \\
            --start 2026-11-22T10:00 --end 2026-11-22T12:00   # or: python -m pipeline.audit
      hour (UTC)            in pylog       loaded   difference
      2026-11-22 10:00            12           12           +0
      2026-11-22 11:00             8            4           -4  <-- differs
      total                       20           16           -4
      clicks: 1 hour(s) differ
      $ pylogctl audit --topic clicks --output ./warehouse --start 2026-11-22 \\
            --end 2026-11-23 --json
      {"type": "hour", "topic": "clicks", "hour": "2026-11-22T10:00:00+00:00", "in_pylog": 12, ...}
      {"type": "audit", "topic": "clicks", "in_pylog": 20, "loaded": 16, "differing_hours": 1}
      $ pylogctl audit --topic clicks --output ./warehouse --audit-topic _audit \\
            --start 2026-11-22T10:00 --end 2026-11-22T11:00
      hour (UTC)            produced     in pylog       loaded   difference
      2026-11-22 10:00            12           12           12           +0
      total                       12           12           12           +0
      clicks: OK, every hour matches
      $ pylogctl audit --topic clicks --output ./warehouse --mirror-broker 10.0.2.5:9092 \\
            --start 2026-11-22T10:00 --end 2026-11-22T12:00
      hour (UTC)           in source     mirrored       loaded  lost at
      2026-11-22 10:00            12           12           12
      2026-11-22 11:00             8            5            5  mirror 3 lost  <-- differs
      total                       20           17           17  mirror 3 lost
      clicks: 1 hour(s) differ: the mirror (source -> mirror target) 3 lost
    """
    show_progress("audit")
    if end <= start:
        raise click.BadParameter(f"--end {end} is not after --start {start}")
    cluster = cluster_options(broker, zookeeper, key_file, broker_key)
    mirror = None
    if mirror_broker or mirror_zookeeper:
        mirror = cluster_options(
            mirror_broker, mirror_zookeeper, mirror_key_file, mirror_broker_key, "mirror-"
        )
    elif mirror_key_file or mirror_broker_key:
        raise click.UsageError(
            "--mirror-key-file and --mirror-broker-key need --mirror-broker or --mirror-zookeeper"
        )
    try:
        with job_session("pylog-audit", master, conf) as spark:
            counts = audit(spark, cluster, topic, output, start, end, audit_topic, mirror)
    except ValueError as error:
        raise click.BadParameter(str(error)) from error
    except (PylogError, PySparkException) as error:
        raise click.ClickException(failure_message(error)) from error
    with_produced = audit_topic is not None
    if as_json:
        for count in counts:
            fields = hour_fields(count, with_produced)
            click.echo(json.dumps({"type": "hour", "topic": topic, **fields}))
        totals = {
            **({"produced": sum(c.produced or 0 for c in counts)} if with_produced else {}),
            "in_pylog": sum(c.in_pylog for c in counts),
            **(mirror_totals(counts) if mirror is not None else {}),
            "loaded": sum(c.loaded for c in counts),
            "differing_hours": sum(1 for c in counts if c.differs),
        }
        click.echo(json.dumps({"type": "audit", "topic": topic, **totals}))
    elif mirror is not None:
        click.echo(format_stages(topic, counts, with_produced))
    else:
        click.echo(format_table(topic, counts, with_produced))
    if any(c.differs for c in counts):
        sys.exit(EXIT_DIFFERENCE)


if __name__ == "__main__":
    main()
