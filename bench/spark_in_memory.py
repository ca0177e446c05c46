"""A Python data source with no I/O, for ``kraftlog bench spark``: the
ceiling of PySpark's Python Data Source API on this machine, with rows handed
over as Arrow batches or as tuples.

Its own module because it imports pyspark, which ``kraftlog`` (and so
``bench.spark``, imported by the CLI) must not need.
"""

from __future__ import annotations

from typing import Any

from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition


class InMemorySource(DataSource):
    """The Python Data Source API's own ceiling: rows of the Kafka schema,
    made in memory (no I/O, no decoding), handed to Spark as Arrow batches
    or as tuples. What a Python source costs Spark before it reads
    anything, and what yielding Arrow saves over tuples."""

    @classmethod
    def name(cls) -> str:
        return "kraftlog_bench_in_memory"

    def schema(self) -> Any:
        from spark_source.schema import kafka_schema
        return kafka_schema(False)

    def reader(self, schema: Any) -> "_InMemoryReader":
        return _InMemoryReader(dict(self.options))


class _InMemoryReader(DataSourceReader):
    def __init__(self, options: dict) -> None:
        self.rows = options["rows"]
        self.records = int(options["records"])
        self.partitions_count = int(options["partitions"])
        self.record_size = int(options["record_size"])

    def partitions(self) -> list:
        return [InputPartition(p) for p in range(self.partitions_count)]

    def read(self, partition: Any) -> Any:
        import datetime

        import pyarrow as pa

        from spark_source.reader import arrow_schema

        count = self.records // self.partitions_count + (
            partition.value < self.records % self.partitions_count)
        rows, value = 8192, b"x" * self.record_size
        keys = [b"key-%04d" % (i % 1000) for i in range(rows)]
        now = datetime.datetime.now(datetime.timezone.utc)
        schema = arrow_schema(False)
        for start in range(0, count, rows):
            n = min(rows, count - start)
            if self.rows == "tuples":
                yield from ((keys[i], value, "topic", partition.value, start + i, now, 0)
                            for i in range(n))
                continue
            yield pa.RecordBatch.from_arrays([
                pa.array(keys[:n], pa.binary()), pa.array([value] * n, pa.binary()),
                pa.repeat(pa.scalar("topic", pa.string()), n),
                pa.repeat(pa.scalar(partition.value, pa.int32()), n),
                pa.array(range(start, start + n), pa.int64()),
                pa.repeat(pa.scalar(now, schema.field("timestamp").type), n),
                pa.repeat(pa.scalar(0, pa.int32()), n)], schema=schema)
