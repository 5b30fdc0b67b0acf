"""`format("pylog")` with no `register(spark)` (issue 52): PySpark finds the data source by
itself, in the top-level module pyspark_pylog, when the Python its workers run has pylog
installed. In a Spark of its own (the session's tests register the source)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.pipeline.conftest import create_topic
from tests.pylogd import RunningBroker

PROGRAM = """
import os, sys
os.environ["PYSPARK_PYTHON"] = sys.executable
os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
from pyspark.sql import SparkSession

spark = (
    SparkSession.builder.master("local[1]")
    .config("spark.ui.enabled", "false")
    .config("spark.driver.host", "127.0.0.1")
    .getOrCreate()
)
broker, topic = sys.argv[1:]
rows = spark.range(5).selectExpr("CAST(id AS STRING) AS value")
rows.write.format("pylog").mode("append").options(broker=broker, topic=topic).save()
read = spark.read.format("pylog").options(broker=broker, subscribe=topic).load()
print(sorted(r.value.decode() for r in read.collect()))
spark.stop()
"""


@pytest.mark.slow  # ~45 s: a Spark of its own
def test_format_pylog_is_found_without_register(broker: RunningBroker, topic: str) -> None:
    create_topic(broker.endpoint, topic, 1)
    done = subprocess.run(
        [sys.executable, "-c", PROGRAM, broker.endpoint, topic],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.splitlines()[-1] == "['0', '1', '2', '3', '4']"
