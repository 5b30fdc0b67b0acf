"""The Spark source keeps its checkpoint semantics when a batch fails: the micro-batch whose
processing raised is read again by the next run, and nothing after the last committed batch is
skipped (the group consumer's at-least-once rule, on the Spark side)."""

from __future__ import annotations

from pathlib import Path

import pytest
from pyspark.errors import StreamingQueryException
from pyspark.sql import DataFrame, Row, SparkSession

from tests.pipeline.conftest import create_topic, produce
from tests.pipeline.test_stream import QUERY_TIMEOUT_S, run_available_now, values
from tests.pylogd import RunningBroker


def test_a_batch_whose_processing_raised_is_read_again_and_nothing_is_skipped(
    spark: SparkSession, broker: RunningBroker, topic: str, tmp_path: Path
) -> None:
    create_topic(broker.endpoint, topic, 2)
    sent = produce(broker.endpoint, topic, 2, 40, value_bytes=100)
    options = {
        "broker": broker.endpoint,
        "subscribe": topic,
        "startingOffsets": "earliest",
        "maxBytesPerTrigger": "1000",  # about 6 batches
    }
    processed: list[list[Row]] = []

    def fail_on_the_third(frame: DataFrame, batch_id: int) -> None:
        rows = frame.collect()
        if len(processed) == 2:
            raise RuntimeError(f"handler failed on batch {batch_id}")
        processed.append(rows)

    query = (
        spark.readStream.format("pylog")
        .options(**options)
        .load()
        .writeStream.foreachBatch(fail_on_the_third)
        .option("checkpointLocation", str(tmp_path))
        .trigger(availableNow=True)
        .start()
    )
    with pytest.raises(StreamingQueryException, match="handler failed on batch 2"):
        query.awaitTermination(QUERY_TIMEOUT_S)
    assert len(processed) == 2 and all(processed)

    rest = run_available_now(spark, tmp_path, **options)
    assert sorted(values(processed) + values(rest)) == sorted(s.value for s in sent)
