"""Read kraftlog topics from PySpark: a drop-in for Spark's Kafka source.

::

    import spark_source
    spark_source.register(spark)          # once per SparkSession
    df = (spark.readStream.format("kraftlog")
          .option("kraftlog.bootstrap.servers", "http://127.0.0.1:9092")
          .option("subscribe", "orders")
          .load())

Options, schema and semantics are those of ``format("kafka")``; see
docs/spark.md. ``source`` holds the data source and its readers, ``options``
the option parsing, ``planning`` the offset arithmetic, ``offsets`` the
driver's lookups and ``reader`` what each Spark task runs.
"""

from __future__ import annotations

from typing import Any

#: The name to use in ``format(...)``.
FORMAT = "kraftlog"


def register(spark: Any) -> None:
    """Make ``format("kraftlog")`` available in ``spark`` (a SparkSession)."""
    from spark_source.source import KraftlogDataSource
    spark.dataSource.register(KraftlogDataSource)


__all__ = ["FORMAT", "register"]
