"""The "pylog" data source: one class that Spark instantiates for reads and writes."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator, Sequence
from typing import Any

from pyspark.sql import SparkSession
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
    InputPartition,
)
from pyspark.sql.streaming.datasource import ReadLimit
from pyspark.sql.types import StructType

from pipeline.errors import OptionError
from pipeline.options import boolean, parse_source_options
from pipeline.reader import SCHEMA, SCHEMA_WITH_HEADERS, PylogBatchReader
from pipeline.sink import PylogStreamWriter, PylogWriter, parse_sink_options
from pipeline.stream_reader import PylogStreamReader


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
        try:
            options = parse_source_options(self.options, streaming=True)
            _check_schema(schema, _schema(options.headers))
        except OptionError as error:
            return RefusedStreamReader(error)
        return PylogStreamReader(options)

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        _check_append(overwrite)
        return PylogWriter(parse_sink_options(self.options, schema))

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        _check_append(overwrite)
        return PylogStreamWriter(parse_sink_options(self.options, schema))


class RefusedStreamReader(DataSourceStreamReader):
    """The reader of a stream whose options were refused: it raises their OptionError when
    Spark first asks it for anything. streamReader cannot raise it itself: PySpark 4's stream
    runner then stops a reader it never made, and reports an UnboundLocalError of its own after
    the error (issue 32)."""

    def __init__(self, error: OptionError) -> None:
        self.error = error

    def initialOffset(self) -> dict[str, Any]:
        raise self.error

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        raise self.error

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        raise self.error

    def read(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
        raise self.error


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


@contextlib.contextmanager
def workers_with_pylog(spark: SparkSession) -> Iterator[None]:
    """Within: Python code given to `spark` (a data source, a function of mapInArrow) runs in
    worker processes started with an interpreter that has pylog.

    Spark records the interpreter when the code is given: PySpark's own choice is
    PYSPARK_PYTHON, else whatever `python3` is on the PATH, which may lack pyarrow and pylog
    (the `spark.pyspark.python` setting reaches it only through spark-submit). Within, it is
    `spark.pyspark.python` if the session has it, else PYSPARK_PYTHON, else this process's
    interpreter: a venv with pylog just works. Code given outside keeps PySpark's choice."""
    context = spark.sparkContext
    pyspark_choice = context.pythonExec
    context.pythonExec = (
        spark.conf.get("spark.pyspark.python", None)
        or os.environ.get("PYSPARK_PYTHON")
        or sys.executable
    )
    try:
        yield
    finally:
        context.pythonExec = pyspark_choice


def register(spark: SparkSession) -> None:
    """Make `format("pylog")` available in `spark` (once per session), its code run by an
    interpreter that has pylog (`workers_with_pylog`)."""
    with workers_with_pylog(spark):
        spark.dataSource.register(PylogDataSource)
