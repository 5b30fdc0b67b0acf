"""`python -m pipeline.audit`: messages per hour in pylog against those loaded into Parquet.

The Kafka paper's audit: for one topic and a time window, count the messages of each hour
(UTC, by message timestamp) in the topic and in a load's output (pipeline.load), print both
side by side, and exit 1 if any hour differs, 0 if none does.

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

import datetime
import json
import logging
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

import click
from pyspark.errors import AnalysisException, PySparkException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import LongType, StringType, StructField, StructType

from broker.client.audit import WINDOW_MS
from broker.client.consumer import timestamp_ms
from broker.errors import PylogError
from pipeline.load import LOADED_SCHEMA, MICROS_PER_HOUR, epoch_micros, whole
from pipeline.session import (
    cluster_options,
    failure_message,
    job_options,
    job_session,
    show_progress,
)

log = logging.getLogger("pipeline.audit")  # not __name__: "__main__" under python -m

EXIT_DIFFERENCE: Final = 1
_DATE_FORMATS: Final = ["%Y-%m-%dT%H:%M:%S", "%Y-%m-%dT%H:%M", "%Y-%m-%d %H:%M", "%Y-%m-%d"]


STAGES: Final = {
    "source": "producers -> source",
    "mirror": "source -> mirror target",
    "load": "mirror target -> Parquet",
}
"""The stages a message passes, as the report names them."""


@dataclass(frozen=True, slots=True)
class HourCount:
    """Messages of one hour (starting at `hour`, UTC) in pylog and in Parquet, what the
    producers said they produced (None when no audit topic was read) and what the mirror's
    target holds (None when no mirror was named)."""

    hour: datetime.datetime
    in_pylog: int
    loaded: int
    produced: int | None = None
    mirrored: int | None = None

    @property
    def difference(self) -> int:
        """Loaded minus what the load read: the mirror's target when there is one."""
        return self.loaded - (self.in_pylog if self.mirrored is None else self.mirrored)

    @property
    def lost(self) -> dict[str, int]:
        """Stage -> the messages it lost (negative: it has more than it was given), for the
        stages counted."""
        lost = {} if self.produced is None else {"source": self.produced - self.in_pylog}
        if self.mirrored is not None:
            lost["mirror"] = self.in_pylog - self.mirrored
        return {**lost, "load": -self.difference}

    @property
    def differs(self) -> bool:
        return any(self.lost.values())


AUDIT_RECORD: Final = StructType(
    [
        StructField("producer", StringType()),
        StructField("topic", StringType()),
        StructField("window_start_ms", LongType()),
        StructField("window_ms", LongType()),
        StructField("count", LongType()),
    ]
)
"""broker.client.audit.AuditRecord, as the JSON value of an audit topic's messages."""


def produced_per_hour(
    spark: SparkSession,
    cluster: Mapping[str, str],
    audit_topic: str,
    topic: str,
    start_ms: int,
    end_ms: int,
) -> dict[int, int]:
    """Messages of `topic` that producers counted as produced, per hour in [start_ms, end_ms)
    (hours since the epoch -> messages): each producer's largest running total of each hour,
    summed over producers. Records that are not audit records are counted and logged."""
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
        .agg(F.max("count").alias("count"))
        .groupBy("window_start_ms")
        .agg(F.sum("count").alias("count"))
        .collect()
    )
    records.unpersist()
    return {int(row["window_start_ms"]) // WINDOW_MS: int(row["count"]) for row in totals}


def _per_hour(rows: DataFrame, start_us: int, end_us: int) -> dict[int, int]:
    micros = epoch_micros("timestamp")
    counted = (
        rows.where((micros >= start_us) & (micros < end_us))
        .groupBy(whole("timestamp", MICROS_PER_HOUR).alias("hour"))
        .count()
        .collect()
    )
    return {int(row["hour"]): int(row["count"]) for row in counted}


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
    produced: dict[int, int] | None = None
    if audit_topic is not None:
        if start_us % MICROS_PER_HOUR or end_us % MICROS_PER_HOUR:
            raise ValueError(
                f"with an audit topic the window starts and ends on whole hours (producers "
                f"count per hour): {start:%Y-%m-%d %H:%M} to {end:%Y-%m-%d %H:%M} does not"
            )
        produced = produced_per_hour(
            spark, cluster, audit_topic, topic, start_us // 1000, end_us // 1000
        )
    in_pylog = stored_per_hour(spark, cluster, topic, start, end)
    mirrored = None if mirror is None else stored_per_hour(spark, mirror, topic, start, end)
    try:
        parquet = (
            spark.read.schema(LOADED_SCHEMA)
            .option("ignoreMissingFiles", "true")
            .parquet(output)
            .where(F.col("topic") == topic)
            .where(F.col("date").between(start.date(), end.date()))
        )
        loaded = _per_hour(parquet, start_us, end_us)
    except AnalysisException as error:
        if error.getCondition() != "PATH_NOT_FOUND":
            raise
        log.warning("%s does not exist: nothing was loaded there", output)
        loaded = {}
    return [
        HourCount(
            datetime.datetime.fromtimestamp(hour * 3600, datetime.UTC),
            in_pylog.get(hour, 0),
            loaded.get(hour, 0),
            None if produced is None else produced.get(hour, 0),
            None if mirrored is None else mirrored.get(hour, 0),
        )
        for hour in sorted(
            in_pylog.keys() | loaded.keys() | (produced or {}).keys() | (mirrored or {}).keys()
        )
    ]


def stored_per_hour(
    spark: SparkSession,
    cluster: Mapping[str, str],
    topic: str,
    start: datetime.datetime,
    end: datetime.datetime,
) -> dict[int, int]:
    """The messages of `topic` in `cluster` per hour of [start, end) (hours since the epoch),
    read from the first offset at or after `start` of each partition."""
    rows = (
        spark.read.format("pylog")
        .options(**cluster, subscribe=topic, startingTimestamp=str(timestamp_ms(start)))
        .load()
    )
    return _per_hour(rows, timestamp_ms(start) * 1000, timestamp_ms(end) * 1000)


def format_table(topic: str, counts: list[HourCount], with_produced: bool = False) -> str:
    """The audit's table: one line per hour, a total, and OK or the differences; the
    producers' counts in a first column `with_produced`."""
    produced_head = f" {'produced':>12}" if with_produced else ""
    lines = [
        f"{'hour (UTC)':<17}{produced_head} {'in pylog':>12} {'loaded':>12} {'difference':>12}"
    ]
    for count in counts:
        mark = "  <-- differs" if count.differs else ""
        produced = f" {count.produced:>12}" if with_produced else ""
        lines.append(
            f"{count.hour:%Y-%m-%d %H:00} {produced} {count.in_pylog:>12} {count.loaded:>12} "
            f"{count.difference:>+12}{mark}"
        )
    total_pylog = sum(c.in_pylog for c in counts)
    total_loaded = sum(c.loaded for c in counts)
    total_produced = f" {sum(c.produced or 0 for c in counts):>12}" if with_produced else ""
    lines.append(
        f"{'total':<17}{total_produced} {total_pylog:>12} {total_loaded:>12} "
        f"{total_loaded - total_pylog:>+12}"
    )
    differing = sum(1 for c in counts if c.differs)
    lines.append(
        f"{topic}: OK, every hour matches"
        if not differing
        else f"{topic}: {differing} hour(s) differ"
    )
    return "\n".join(lines)


def format_stages(topic: str, counts: list[HourCount], with_produced: bool = False) -> str:
    """The audit's table across clusters: per hour, each stage's count and what each stage
    lost (or added), a total, and OK or the losses of each stage."""
    heads = [*(["produced"] if with_produced else []), "in source", "mirrored", "loaded"]
    lines = [f"{'hour (UTC)':<17}" + "".join(f" {head:>12}" for head in heads) + "  lost at"]
    for count in counts:
        mark = "  <-- differs" if count.differs else ""
        lines.append(f"{count.hour:%Y-%m-%d %H:00} " + _stage_cells(count, with_produced) + mark)
    total = HourCount(
        counts[0].hour if counts else datetime.datetime.now(datetime.UTC),
        sum(c.in_pylog for c in counts),
        sum(c.loaded for c in counts),
        sum(c.produced or 0 for c in counts) if with_produced else None,
        sum(c.mirrored or 0 for c in counts),
    )
    lines.append(f"{'total':<17}" + _stage_cells(total, with_produced))
    differing = sum(1 for c in counts if c.differs)
    if not differing:
        lines.append(f"{topic}: OK, every stage holds every message of every hour")
    else:
        losses = [f"the {stage} ({STAGES[stage]}) {said}" for stage, said in _losses(counts)]
        lines.append(f"{topic}: {differing} hour(s) differ: " + "; ".join(losses))
    return "\n".join(lines)


def _losses(counts: list[HourCount]) -> list[tuple[str, str]]:
    """(stage, what it lost and what it added over the hours) for each stage that did: one
    hour's loss and another hour's extra messages are both said, not netted out."""
    losses = []
    for stage in STAGES:
        per_hour = [count.lost.get(stage, 0) for count in counts]
        lost, extra = sum(n for n in per_hour if n > 0), sum(n for n in per_hour if n < 0)
        said = [_lost_text(n) for n in (lost, extra) if n]
        if said:
            losses.append((stage, " and ".join(said)))
    return losses


def _stage_cells(count: HourCount, with_produced: bool) -> str:
    values = [*([count.produced] if with_produced else []), count.in_pylog, count.mirrored]
    cells = "".join(f" {value:>12}" for value in [*values, count.loaded])
    lost = ", ".join(f"{stage} {_lost_text(n)}" for stage, n in count.lost.items() if n)
    return f"{cells}  {lost}".rstrip()


def _lost_text(count: int) -> str:
    return f"{count} lost" if count > 0 else f"{-count} extra"


def _hour_fields(count: HourCount, with_produced: bool) -> dict[str, object]:
    mirrored = count.mirrored is not None
    return {
        "hour": count.hour.isoformat(),
        **({"produced": count.produced} if with_produced else {}),
        "in_pylog": count.in_pylog,
        **({"mirrored": count.mirrored, "lost": count.lost} if mirrored else {}),
        "loaded": count.loaded,
        "difference": count.difference,
    }


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
    pylog-mirror's target holds); exit 1 if any hour differs.

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
            fields = _hour_fields(count, with_produced)
            click.echo(json.dumps({"type": "hour", "topic": topic, **fields}))
        totals = {
            **({"produced": sum(c.produced or 0 for c in counts)} if with_produced else {}),
            "in_pylog": sum(c.in_pylog for c in counts),
            **(_mirror_totals(counts) if mirror is not None else {}),
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


def _mirror_totals(counts: list[HourCount]) -> dict[str, object]:
    lost: dict[str, int] = {}
    for count in counts:
        for stage, n in count.lost.items():
            lost[stage] = lost.get(stage, 0) + n
    return {"mirrored": sum(c.mirrored or 0 for c in counts), "lost": lost}


if __name__ == "__main__":
    main()
