"""The PySpark side of pylog: a data source and sink, and the load and audit jobs.

    register(spark)           makes format("pylog") available to spark.read / readStream and
                              df.write / writeStream (source.py, reader.py, sink.py)
    SCHEMA                    the source's rows: key, value, topic, partition, offset, timestamp,
                              timestampType (Spark's Kafka source's columns)
    python -m pipeline.load   topics into Parquet, by topic, date and hour (load.py)
    python -m pipeline.audit  messages per hour in pylog against those loaded (audit.py)

Options, offsets and failure behaviour: docs/pipeline.md. Errors: pipeline/errors.py.
"""

from pipeline.reader import SCHEMA
from pipeline.source import PylogDataSource, register

__all__ = ["SCHEMA", "PylogDataSource", "register"]
