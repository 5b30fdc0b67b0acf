"""`python -m pipeline.load`: copy topics into Parquet, partitioned by topic, date and hour.

Layout under OUTPUT (Hive-style, readable by spark.read.parquet and any Parquet engine):

    OUTPUT/topic=<topic>/date=<YYYY-MM-DD>/hour=<0-23>/part-*.parquet
    OUTPUT/_spark_metadata/     the log of committed files (Spark's file sink)
    OUTPUT/_checkpoint/         the offsets loaded so far (the stream's checkpoint)

Rows: key, value, partition, offset, timestamp, and the partition columns topic, date and
hour: the UTC date and hour of the message's timestamp (the producer's).

The load is a streaming query over the pylog source. By default (Trigger.AvailableNow) it
reads what each partition holds when it starts, writes it in micro-batches and stops; with
--follow it runs on (Trigger.ProcessingTime, a micro-batch every --interval seconds) until
SIGTERM or Ctrl-C, which stop it between batches. It prints a line per micro-batch (and on a
terminal a progress bar), and before Spark starts it checks that the broker answers and every
topic exists, so that either mistake is one line within seconds. Its offsets live
only in the checkpoint, so a rerun continues where the last one stopped. No message is loaded
twice: a batch's files count only once the file sink has logged them in _spark_metadata,
after which the checkpoint moves past the batch; a batch cut short by a crash is written again
by the next run, and its earlier, unlogged files are ignored by every reader that reads
OUTPUT through Spark (plain Parquet readers should read only the logged files). One OUTPUT
holds one load: run it with all the topics to load there (adding a topic later is fine: it is
read from its log start).
"""

from __future__ import annotations

import contextlib
import json
import logging
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

import click
from pyspark.errors import PySparkException
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming.listener import StreamingQueryProgress
from pyspark.sql.streaming.query import StreamingQuery
from pyspark.sql.types import DateType, IntegerType, StringType, StructField, StructType

from broker.errors import PylogError
from pipeline.cluster import DriverView, bootstrap_endpoint, client_keys
from pipeline.reader import SCHEMA
from pipeline.session import (
    cluster_options,
    failure_message,
    job_options,
    job_session,
    show_progress,
)

if TYPE_CHECKING:
    from click._termui_impl import ProgressBar

log = logging.getLogger("pipeline.load")  # not __name__: "__main__" under python -m

CHECKPOINT_DIR: Final = "_checkpoint"
PROGRESS_INTERVAL_S: Final = 1
PREFLIGHT_TIMEOUT_S: Final = 5
STOP_WAIT_S: Final = 60
EXIT_INTERRUPTED: Final = 130  # as a shell reports a command ended by Ctrl-C
MICROS_PER_HOUR: Final = 3600 * 1_000_000
MICROS_PER_DAY: Final = 24 * MICROS_PER_HOUR

LOADED_SCHEMA: Final = StructType(
    [f for f in SCHEMA.fields if f.name not in ("topic", "timestampType")]
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


@dataclass(frozen=True, slots=True)
class MicroBatch:
    """One micro-batch written, from Spark's progress report: its rows, and the source's byte
    offsets summed over partitions where it started and ended and the latest the partitions
    had when it was planned (so `latest - end` bytes were still to load)."""

    batch_id: int
    rows: int
    start: int | None  # None on the first batch of a new checkpoint
    end: int
    latest: int


def _offset_sum(offsets: str | None) -> int | None:
    """The byte offsets of a source's progress JSON ({"topic": {"partition": offset}}), summed."""
    parsed = None if offsets is None else json.loads(offsets)
    if parsed is None:
        return None
    return sum(int(o) for partitions in parsed.values() for o in partitions.values())


def _batch(progress: StreamingQueryProgress) -> MicroBatch:
    (source,) = progress.sources
    return MicroBatch(
        progress.batchId,
        progress.numInputRows,
        _offset_sum(source.startOffset),
        _offset_sum(source.endOffset) or 0,
        _offset_sum(source.latestOffset) or 0,
    )


def load(
    spark: SparkSession,
    cluster: Mapping[str, str],
    topics: Sequence[str],
    output: str,
    checkpoint: str | None = None,
    max_bytes_per_trigger: int | None = None,
    fail_on_data_loss: bool = True,
    follow_interval_s: float | None = None,
    on_batch: Callable[[MicroBatch], None] = lambda batch: None,
    stop: threading.Event | None = None,
) -> LoadResult:
    """Load what `topics` hold now and was not loaded yet into `output` (see the module doc),
    calling `on_batch` for each micro-batch written. With `follow_interval_s`, go on loading
    new messages in a micro-batch every that many seconds. Either way, `stop` being set ends
    the load after the micro-batch under way."""
    options = {
        **cluster,
        "subscribe": ",".join(topics),
        "startingOffsets": "earliest",
        "failOnDataLoss": str(fail_on_data_loss).lower(),
    }
    if max_bytes_per_trigger is not None:
        options["maxBytesPerTrigger"] = str(max_bytes_per_trigger)
    rows = spark.readStream.format("pylog").options(**options).load()
    writer = (
        with_date_and_hour(rows)
        .select(*(f.name for f in LOADED_SCHEMA.fields))
        .writeStream.format("parquet")
        .option("path", output)
        .option("checkpointLocation", checkpoint or f"{output.rstrip('/')}/{CHECKPOINT_DIR}")
        .partitionBy("topic", "date", "hour")
    )
    if follow_interval_s is None:
        query = writer.trigger(availableNow=True).start()
    else:
        query = writer.trigger(processingTime=f"{follow_interval_s} seconds").start()
    seen: dict[int, int] = {}
    try:
        while True:
            done = query.awaitTermination(PROGRESS_INTERVAL_S)
            if not done and stop is not None and stop.is_set():
                _stop_between_batches(query)
                done = True
            for progress in query.recentProgress:
                if progress.batchId in seen or not progress.sources:
                    continue
                batch = _batch(progress)
                if batch.rows == 0 and batch.start == batch.end:
                    continue  # an idle trigger's report, numbered as the batch to come
                seen[batch.batch_id] = batch.rows
                on_batch(batch)
            if done:
                break
    finally:
        query.stop()  # at once, if an error ended the loop
    loaded = sum(seen.values())
    return LoadResult(sum(1 for n in seen.values() if n), loaded)


def _stop_between_batches(query: StreamingQuery) -> None:
    """Let the micro-batch under way finish (up to STOP_WAIT_S), so that stopping does not
    abort a write (which the next run would make again)."""
    log.info("stopping after the micro-batch under way")
    deadline = time.monotonic() + STOP_WAIT_S
    while query.isActive and query.status["isTriggerActive"] and time.monotonic() < deadline:
        time.sleep(0.1)  # polling Spark's status: there is no event to wait on
    query.stop()


def check_cluster(cluster: Mapping[str, str], topics: Sequence[str]) -> None:
    """Fail fast, before Spark starts: Unavailable when the broker does not answer within
    PREFLIGHT_TIMEOUT_S, OptionError naming a topic that does not exist."""
    options = {name.lower(): value for name, value in cluster.items()}
    keys = client_keys(options)
    with DriverView(bootstrap_endpoint(options), PREFLIGHT_TIMEOUT_S, 0, keys) as brokers:
        for topic in topics:
            brokers.holders(topic)


class LoadProgress:
    """What the load tells its user: a line per micro-batch (logged), and on a terminal a bar
    of bytes loaded out of those to load, drawn on stderr below the lines (with --follow, until
    the load has caught up)."""

    def __init__(self, follow: bool, as_json: bool) -> None:
        self.follow = follow
        self.as_json = as_json
        self.caught_up = False
        self.bar: ProgressBar[int] | None = None
        self.first: int | None = None  # the byte offsets (summed) the run started from

    def __enter__(self) -> LoadProgress:
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self.bar is not None:
            self.bar.render_finish()

    def batch(self, batch: MicroBatch) -> None:
        if self.first is None:
            self.first = batch.start if batch.start is not None else 0
        to_load = batch.latest - batch.end
        if self.as_json:
            fields = {"batch": batch.batch_id, "rows": batch.rows, "bytes_to_load": to_load}
            click.echo(json.dumps({"type": "batch", **fields}))
            return
        line = f"batch {batch.batch_id}: {batch.rows} rows, {to_load} bytes still to load"
        if self.bar is not None:
            click.echo("\r\033[K", nl=False, err=True)  # the line goes above the bar
        log.info(line)
        if self.caught_up or not sys.stderr.isatty():
            return
        if self.bar is None:
            self.bar = click.progressbar(
                length=max(batch.latest - self.first, 1), label="loading", file=sys.stderr
            )
        self.bar.update(batch.end - self.first - self.bar.pos)
        if self.follow and to_load == 0:  # caught up: lines only from here on
            self.bar.render_finish()
            self.bar, self.caught_up = None, True


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
@click.option(
    "--follow",
    is_flag=True,
    help="Run on, loading new messages every --interval seconds, until SIGTERM or Ctrl-C.",
)
@click.option(
    "--interval",
    type=click.FloatRange(min=0.1),
    default=60,
    show_default=True,
    help="With --follow: seconds between the starts of two micro-batches.",
)
@click.option("--json", "as_json", is_flag=True, help="One JSON object a line, on stdout.")
def main(
    broker: str | None,
    zookeeper: str | None,
    key_file: str | None,
    broker_key: str | None,
    master: str | None,
    conf: list[tuple[str, str]],
    topics: tuple[str, ...],
    output: str,
    checkpoint: str | None,
    max_bytes_per_trigger: int | None,
    fail_on_data_loss: bool,
    follow: bool,
    interval: float,
    as_json: bool,
) -> None:
    """Load pylog topics into Parquet, partitioned by topic, date and hour; a rerun loads only
    what is new. With --follow, run on as a service. A line per micro-batch on stderr (with
    --json, an object per batch on stdout), and what was loaded at the end.

    \b
    Examples:
      $ pylogctl load --topic clicks --output ./warehouse     # or: python -m pipeline.load
      loaded 800 messages of clicks into ./warehouse in 8 batches, 39.1 s
      $ pylogctl load --topic clicks --output ./warehouse --follow --interval 300
      $ pylogctl load --topic clicks --output ./warehouse --json
      {"type": "batch", "batch": 0, "rows": 106, "bytes_to_load": 0}
      {"type": "loaded", "topics": ["clicks"], "output": "./warehouse", "messages": 106, ...}
    """
    show_progress("load")
    cluster = cluster_options(broker, zookeeper, key_file, broker_key)
    started = time.monotonic()
    stop = threading.Event()
    try:
        check_cluster(cluster, topics)
        with (
            job_session("pylog-load", master, conf) as spark,
            LoadProgress(follow, as_json) as progress,
            _stopped_by_signals(stop),
        ):
            result = load(
                spark,
                cluster,
                topics,
                output,
                checkpoint,
                max_bytes_per_trigger,
                fail_on_data_loss,
                interval if follow else None,
                progress.batch,
                stop,
            )
    except (PylogError, PySparkException) as error:
        raise click.ClickException(failure_message(error)) from error
    if stop.is_set() and not follow:
        click.echo(f"interrupted: loaded {result.rows} messages; a rerun goes on", err=True)
        sys.exit(EXIT_INTERRUPTED)
    seconds = round(time.monotonic() - started, 1)
    if as_json:
        loaded = {"messages": result.rows, "batches": result.batches, "seconds": seconds}
        click.echo(json.dumps({"type": "loaded", "topics": topics, "output": output, **loaded}))
        return
    click.echo(
        f"loaded {result.rows} messages of {', '.join(topics)} into {output} in "
        f"{result.batches} batches, {seconds} s"
    )


@contextlib.contextmanager
def _stopped_by_signals(stop: threading.Event) -> Iterator[None]:
    """SIGTERM (systemd's stop) and Ctrl-C set `stop`, which ends the load between two
    micro-batches; the handlers before are put back after. Entered after the Spark session
    starts, since PySpark's SparkContext takes SIGINT for itself."""
    previous = {signum: signal.getsignal(signum) for signum in (signal.SIGTERM, signal.SIGINT)}
    for signum in previous:
        signal.signal(signum, lambda signum, frame: stop.set())
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


if __name__ == "__main__":
    main()
