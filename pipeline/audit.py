"""`python -m pipeline.audit`: messages per hour in pylog against those loaded into Parquet.

The Kafka paper's audit: for one topic and a time window, count the messages of each hour
(UTC, by message timestamp) in the topic and in a load's output (pipeline.load), print both
side by side, and exit 1 if any hour differs, 0 if none does.

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


@dataclass(frozen=True, slots=True)
class HourCount:
    """Messages of one hour (starting at `hour`, UTC) in pylog and in Parquet."""

    hour: datetime.datetime
    in_pylog: int
    loaded: int

    @property
    def difference(self) -> int:
        return self.loaded - self.in_pylog


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
) -> list[HourCount]:
    """Per-hour counts of `topic` in [start, end) (UTC when naive), in pylog and in the load
    at `output`: every hour that has messages on either side, in order."""
    start, end = (m if m.tzinfo else m.replace(tzinfo=datetime.UTC) for m in (start, end))
    if end <= start:
        raise ValueError(f"the window ends ({end}) before it starts ({start})")
    start_us, end_us = timestamp_ms(start) * 1000, timestamp_ms(end) * 1000
    in_pylog = _per_hour(
        spark.read.format("pylog")
        .options(**cluster, subscribe=topic, startingTimestamp=str(timestamp_ms(start)))
        .load(),
        start_us,
        end_us,
    )
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
        )
        for hour in sorted(in_pylog.keys() | loaded.keys())
    ]


def format_table(topic: str, counts: list[HourCount]) -> str:
    """The audit's table: one line per hour, a total, and OK or the differences."""
    lines = [f"{'hour (UTC)':<17} {'in pylog':>12} {'loaded':>12} {'difference':>12}"]
    for count in counts:
        mark = "" if count.difference == 0 else "  <-- differs"
        lines.append(
            f"{count.hour:%Y-%m-%d %H:00}  {count.in_pylog:>12} {count.loaded:>12} "
            f"{count.difference:>+12}{mark}"
        )
    total_pylog = sum(c.in_pylog for c in counts)
    total_loaded = sum(c.loaded for c in counts)
    lines.append(
        f"{'total':<17} {total_pylog:>12} {total_loaded:>12} {total_loaded - total_pylog:>+12}"
    )
    differing = sum(1 for c in counts if c.difference)
    lines.append(
        f"{topic}: OK, every hour matches"
        if not differing
        else f"{topic}: {differing} hour(s) differ"
    )
    return "\n".join(lines)


def _hour_fields(count: HourCount) -> dict[str, object]:
    return {
        "hour": count.hour.isoformat(),
        "in_pylog": count.in_pylog,
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
    "--json", "as_json", is_flag=True, help="One JSON object a line: each hour, then the total."
)
def main(
    broker: str | None,
    zookeeper: str | None,
    master: str | None,
    conf: list[tuple[str, str]],
    topic: str,
    output: str,
    start: datetime.datetime,
    end: datetime.datetime,
    as_json: bool,
) -> None:
    """Count a topic's messages per hour in pylog and in a load's Parquet output; exit 1 if
    any hour differs.

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
    """
    show_progress("audit")
    if end <= start:
        raise click.BadParameter(f"--end {end} is not after --start {start}")
    cluster = cluster_options(broker, zookeeper)
    try:
        with job_session("pylog-audit", master, conf) as spark:
            counts = audit(spark, cluster, topic, output, start, end)
    except (PylogError, PySparkException) as error:
        raise click.ClickException(failure_message(error)) from error
    if as_json:
        for count in counts:
            click.echo(json.dumps({"type": "hour", "topic": topic, **_hour_fields(count)}))
        totals = {
            "in_pylog": sum(c.in_pylog for c in counts),
            "loaded": sum(c.loaded for c in counts),
            "differing_hours": sum(1 for c in counts if c.difference),
        }
        click.echo(json.dumps({"type": "audit", "topic": topic, **totals}))
    else:
        click.echo(format_table(topic, counts))
    if any(c.difference for c in counts):
        sys.exit(EXIT_DIFFERENCE)


if __name__ == "__main__":
    main()
