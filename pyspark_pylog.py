"""`format("pylog")` found by PySpark itself, with no `pipeline.register(spark)`: PySpark looks
for top-level modules named `pyspark_*` that have a `DefaultSource` (a DataSource) in the Python
its workers run (pyspark.sql.worker.lookup_data_sources), when a session first reads or writes
through a Python data source. That Python must have pylog installed: PYSPARK_PYTHON, or
spark.pyspark.python under spark-submit; else PySpark's own choice, `python3` on the PATH
(docs/pipeline.md, "Register the source")."""

from pipeline.source import PylogDataSource as DefaultSource

__all__ = ["DefaultSource"]
