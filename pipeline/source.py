"""The "pylog" data source: one class that Spark instantiates for reads and writes."""

from __future__ import annotations

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
from pipeline.options import parse_source_options
from pipeline.reader import SCHEMA, PylogBatchReader, PylogStreamReader
from pipeline.sink import PylogStreamWriter, PylogWriter, parse_sink_options


class PylogDataSource(DataSource):
    """`format("pylog")` for spark.read, spark.readStream, df.write and df.writeStream
    (options and columns: docs/pipeline.md)."""

    @classmethod
    def name(cls) -> str:
        return "pylog"

    def schema(self) -> StructType:
        return SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        _check_schema(schema)
        return PylogBatchReader(parse_source_options(self.options, streaming=False))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        _check_schema(schema)
        return PylogStreamReader(parse_source_options(self.options, streaming=True))

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        _check_append(overwrite)
        return PylogWriter(parse_sink_options(self.options, schema))

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        _check_append(overwrite)
        return PylogStreamWriter(parse_sink_options(self.options, schema))


def _check_schema(schema: StructType) -> None:
    if schema != SCHEMA:
        raise OptionError(
            f"the pylog source has a fixed schema, {SCHEMA.simpleString()}; do not give "
            f"another ({schema.simpleString()})"
        )


def _check_append(overwrite: bool) -> None:
    if overwrite:
        raise OptionError("a log is only appended to: write with mode append, not overwrite")


def register(spark: SparkSession) -> None:
    """Make `format("pylog")` available in `spark` (once per session)."""
    spark.dataSource.register(PylogDataSource)
