"""The rows' schema: column for column, Spark's Kafka source's.

Spark's Kafka source (``KafkaRecordToRowConverter``) reads every record as
key binary, value binary, topic string, partition int, offset long,
timestamp timestamp, timestampType int, and, with ``includeHeaders``,
headers array<struct<key string, value binary>> (null for a record without
headers); every field nullable. A
pipeline written against ``format("kafka")`` therefore runs unchanged.
``timestampType`` is Kafka's id: 0 CreateTime, 1 LogAppendTime.
"""

from __future__ import annotations

from pyspark.sql.types import (
    ArrayType, BinaryType, IntegerType, LongType, StringType, StructField, StructType,
    TimestampType)

HEADERS_TYPE = ArrayType(StructType([
    StructField("key", StringType()),
    StructField("value", BinaryType()),
]))


def kafka_schema(include_headers: bool = False) -> StructType:
    fields = [
        StructField("key", BinaryType()),
        StructField("value", BinaryType()),
        StructField("topic", StringType()),
        StructField("partition", IntegerType()),
        StructField("offset", LongType()),
        StructField("timestamp", TimestampType()),
        StructField("timestampType", IntegerType()),
    ]
    if include_headers:
        fields.append(StructField("headers", HEADERS_TYPE))
    return StructType(fields)
