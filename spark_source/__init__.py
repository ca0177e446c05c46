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

from spark_source.options import FORMAT

__all__ = ["FORMAT", "local_session", "register"]


def register(spark: Any) -> None:
    """Make ``format("kraftlog")`` available in ``spark`` (a SparkSession)."""
    from spark_source.source import KraftlogDataSource
    spark.dataSource.register(KraftlogDataSource)


def local_session(app_name: str = "kraftlog", master: str = "local[2]",
                  config: dict[str, str] | None = None) -> Any:
    """A SparkSession with ``format("kraftlog")`` registered, for scripts,
    examples and tests on one machine.

    Spark starts its Python workers with ``python3`` from PATH unless told
    otherwise; here they run this interpreter (``PYSPARK_PYTHON``), which
    has kraftlog and pyarrow installed: a venv that is not activated works.
    Spark's driver listens on 127.0.0.1 only; ``config`` adds settings.
    """
    import os
    import sys

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    # One machine: keep Spark's own sockets on loopback.
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    builder = (SparkSession.builder.master(master).appName(app_name)
               .config("spark.ui.enabled", "false")
               .config("spark.driver.host", "127.0.0.1")
               .config("spark.driver.bindAddress", "127.0.0.1")
               .config("spark.sql.shuffle.partitions", "4"))
    for key, value in (config or {}).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    return spark


__all__ = ["FORMAT", "local_session", "register"]
