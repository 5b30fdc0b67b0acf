"""The "pylog" data source: one class that Spark instantiates for reads and writes."""

from __future__ import annotations

import os
import sys

from pyspark.sql import SparkSession
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
)
from pyspark.sql.types import StructType

from pipeline.errors import OptionError
from pipeline.options import boolean, parse_source_options
from pipeline.reader import SCHEMA, SCHEMA_WITH_HEADERS, PylogBatchReader, PylogStreamReader
from pipeline.sink import PylogStreamWriter, PylogWriter, parse_sink_options


class PylogDataSource(DataSource):
    """`format("pylog")` for spark.read, spark.readStream, df.write and df.writeStream
    (options and columns: docs/pipeline.md)."""

    @classmethod
    def name(cls) -> str:
        return "pylog"

    def schema(self) -> StructType:
        """The source's rows: SCHEMA, with its headers column with includeHeaders true."""
        options = {key.lower(): value for key, value in self.options.items()}
        return _schema(boolean(options, "includeHeaders", False))

    def reader(self, schema: StructType) -> DataSourceReader:
        options = parse_source_options(self.options, streaming=False)
        _check_schema(schema, _schema(options.headers))
        return PylogBatchReader(options)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        options = parse_source_options(self.options, streaming=True)
        _check_schema(schema, _schema(options.headers))
        return PylogStreamReader(options)

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        _check_append(overwrite)
        return PylogWriter(parse_sink_options(self.options, schema))

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        _check_append(overwrite)
        return PylogStreamWriter(parse_sink_options(self.options, schema))


def _schema(headers: bool) -> StructType:
    return SCHEMA_WITH_HEADERS if headers else SCHEMA


def _check_schema(schema: StructType, expected: StructType) -> None:
    if schema != expected:
        raise OptionError(
            f"the pylog source has a fixed schema, {expected.simpleString()} (includeHeaders "
            f"true adds headers); do not give another ({schema.simpleString()})"
        )


def _check_append(overwrite: bool) -> None:
    if overwrite:
        raise OptionError("a log is only appended to: write with mode append, not overwrite")


def register(spark: SparkSession) -> None:
    """Make `format("pylog")` available in `spark` (once per session).

    Spark runs the source's code (planning on the driver, reading in the tasks) in Python
    worker processes, started with the interpreter recorded when the source is registered:
    PySpark's own choice is PYSPARK_PYTHON, else whatever `python3` is on the PATH, which may
    lack pyarrow and pylog (the `spark.pyspark.python` setting reaches it only through
    spark-submit). The source is registered with `spark.pyspark.python` if the session has it,
    else PYSPARK_PYTHON, else this process's interpreter: a venv with pylog just works. Python
    functions registered otherwise keep PySpark's choice."""
    context = spark.sparkContext
    pyspark_choice = context.pythonExec
    context.pythonExec = (
        spark.conf.get("spark.pyspark.python", None)
        or os.environ.get("PYSPARK_PYTHON")
        or sys.executable
    )
    try:
        spark.dataSource.register(PylogDataSource)
    finally:
        context.pythonExec = pyspark_choice
