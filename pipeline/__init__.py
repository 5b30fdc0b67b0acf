"""The PySpark side of pylog: a data source and sink, and the load and audit jobs.

    register(spark)           makes format("pylog") available to spark.read / readStream and
                              df.write / writeStream (source.py, reader.py,
                              stream_reader.py, sink.py)
    SCHEMA                    the source's rows: key, value, topic, partition, offset, timestamp,
                              timestampType (Spark's Kafka source's columns)
    python -m pipeline.load   topics into Parquet, by topic, date and hour (load.py)
    python -m pipeline.audit  messages per hour in pylog against those loaded
                              (audit.py, its report audit_report.py)

Options, offsets and failure behaviour: docs/pipeline.md. Errors: pipeline/errors.py.
"""

try:  # every module here needs them: say so once, as pylogctl load does
    import pyarrow  # noqa: F401
    import pyspark  # noqa: F401
except ModuleNotFoundError as missing:
    raise ModuleNotFoundError(
        f"pylog's Spark pipeline (python -m pipeline.load, pipeline.audit) needs its pipeline "
        f"extra ({missing.name} is missing): scripts/setup installs it, or pip install "
        "'pylog[pipeline]' into this environment; and Java 17",
        name=missing.name,
    ) from None

from pipeline.reader import SCHEMA
from pipeline.source import PylogDataSource, register

__all__ = ["SCHEMA", "PylogDataSource", "register"]
