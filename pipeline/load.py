"""`python -m pipeline.load`: copy topics into Parquet, partitioned by topic, date and hour.

Layout under OUTPUT (Hive-style, readable by spark.read.parquet and any Parquet engine):

    OUTPUT/topic=<topic>/date=<YYYY-MM-DD>/hour=<0-23>/part-*.parquet
    OUTPUT/_spark_metadata/     the log of committed files (Spark's file sink)
    OUTPUT/_checkpoint/         the offsets loaded so far (the stream's checkpoint)

Rows: key, value, partition, offset, timestamp, and the partition columns topic, date and
hour: the UTC date and hour of the message's timestamp (the producer's).

The load is a streaming query with Trigger.AvailableNow over the pylog source: it reads what
each partition holds when it starts, writes it in micro-batches and stops. Its offsets live
only in the checkpoint, so a rerun continues where the last one stopped. No message is loaded
twice: a batch's files count only once the file sink has logged them in _spark_metadata,
after which the checkpoint moves past the batch; a batch cut short by a crash is written again
by the next run, and its earlier, unlogged files are ignored by every reader that reads
OUTPUT through Spark (plain Parquet readers should read only the logged files). One OUTPUT
holds one load: run it with all the topics to load there (adding a topic later is fine: it is
read from its log start).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final

import click
from pyspark.errors import PySparkException
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import DateType, IntegerType, StringType, StructField, StructType

from broker.errors import PylogError
from pipeline.reader import SCHEMA
from pipeline.session import (
    cluster_options,
    failure_message,
    job_options,
    job_session,
    show_progress,
)

log = logging.getLogger(__name__)

CHECKPOINT_DIR: Final = "_checkpoint"
PROGRESS_INTERVAL_S: Final = 1
MICROS_PER_HOUR: Final = 3600 * 1_000_000
MICROS_PER_DAY: Final = 24 * MICROS_PER_HOUR

LOADED_SCHEMA: Final = StructType(
    [f for f in SCHEMA.fields if f.name != "topic"]
    + [
        StructField("topic", StringType(), True),
        StructField("date", DateType(), True),
        StructField("hour", IntegerType(), True),
    ]
)
"""The schema of a load's output, partition columns last, as spark.read.parquet gives it."""


def epoch_micros(timestamp: str) -> Column:
    """A timestamp column as microseconds since the epoch (independent of the session's time
    zone, like everything computed from it here)."""
    return F.unix_micros(F.col(timestamp))


def whole(timestamp: str, unit_micros: int) -> Column:
    """Whole `unit_micros` (hours, days) since the epoch, in exact integer arithmetic."""
    return F.expr(f"unix_micros(`{timestamp}`) div {unit_micros}")


def with_date_and_hour(rows: DataFrame) -> DataFrame:
    """`rows` with the UTC date and hour of their timestamp."""
    epoch = F.lit("1970-01-01").cast(DateType())
    return rows.withColumn(
        "date", F.date_add(epoch, whole("timestamp", MICROS_PER_DAY).cast(IntegerType()))
    ).withColumn("hour", (whole("timestamp", MICROS_PER_HOUR) % 24).cast(IntegerType()))


@dataclass(frozen=True, slots=True)
class LoadResult:
    """What one run loaded: micro-batches and rows."""

    batches: int
    rows: int


def load(
    spark: SparkSession,
    cluster: Mapping[str, str],
    topics: Sequence[str],
    output: str,
    checkpoint: str | None = None,
    max_bytes_per_trigger: int | None = None,
    fail_on_data_loss: bool = True,
) -> LoadResult:
    """Load what `topics` hold now and was not loaded yet into `output` (see the module doc)."""
    options = {
        **cluster,
        "subscribe": ",".join(topics),
        "startingOffsets": "earliest",
        "failOnDataLoss": str(fail_on_data_loss).lower(),
    }
    if max_bytes_per_trigger is not None:
        options["maxBytesPerTrigger"] = str(max_bytes_per_trigger)
    rows = spark.readStream.format("pylog").options(**options).load()
    query = (
        with_date_and_hour(rows)
        .select(*(f.name for f in LOADED_SCHEMA.fields))
        .writeStream.format("parquet")
        .option("path", output)
        .option("checkpointLocation", checkpoint or f"{output.rstrip('/')}/{CHECKPOINT_DIR}")
        .partitionBy("topic", "date", "hour")
        .trigger(availableNow=True)
        .start()
    )
    seen: dict[int, int] = {}
    while True:
        done = query.awaitTermination(PROGRESS_INTERVAL_S)
        for progress in query.recentProgress:
            if progress.batchId not in seen:
                seen[progress.batchId] = progress.numInputRows
                log.info("batch %d: %d rows", progress.batchId, progress.numInputRows)
        if done:
            break
    loaded = sum(seen.values())
    return LoadResult(sum(1 for n in seen.values() if n), loaded)


@click.command()
@job_options
@click.option("--topic", "topics", multiple=True, required=True, help="A topic; repeat for more.")
@click.option("--output", required=True, help="The Parquet directory (a path or a URL).")
@click.option("--checkpoint", help=f"Where to keep the offsets (default OUTPUT/{CHECKPOINT_DIR}).")
@click.option(
    "--max-bytes-per-trigger",
    type=click.IntRange(min=1),
    help="Bytes of messages per micro-batch (default: all in one).",
)
@click.option(
    "--fail-on-data-loss/--no-fail-on-data-loss",
    default=True,
    show_default=True,
    help="Fail when messages not yet loaded were deleted by retention (else skip them).",
)
def main(
    broker: str | None,
    zookeeper: str | None,
    master: str | None,
    conf: list[tuple[str, str]],
    topics: tuple[str, ...],
    output: str,
    checkpoint: str | None,
    max_bytes_per_trigger: int | None,
    fail_on_data_loss: bool,
) -> None:
    """Load pylog topics into Parquet, partitioned by topic, date and hour; a rerun loads only
    what is new."""
    show_progress("load")
    cluster = cluster_options(broker, zookeeper)
    started = time.monotonic()
    try:
        with job_session("pylog-load", master, conf) as spark:
            result = load(
                spark,
                cluster,
                topics,
                output,
                checkpoint,
                max_bytes_per_trigger,
                fail_on_data_loss,
            )
    except (PylogError, PySparkException) as error:
        raise click.ClickException(failure_message(error)) from error
    click.echo(
        f"loaded {result.rows} messages of {', '.join(topics)} into {output} in "
        f"{result.batches} batches, {time.monotonic() - started:.1f} s"
    )


if __name__ == "__main__":
    main()
