"""The Spark sink's options and input schema (spark_source.sink_options), pure."""

from __future__ import annotations

import pytest

from spark_source.options import InvalidOptionError
from spark_source.sink_options import check_sink_schema, parse_sink_options

URL = "http://127.0.0.1:9092"


def parse(**options):
    return parse_sink_options({"kafka.bootstrap.servers": URL, **options})


def test_defaults_and_producer_settings():
    options = parse(topic="t")
    assert (options.bootstrap, options.topic, options.exactly_once) == (URL, "t", True)
    assert options.transactional_id_prefix is None and options.producer == {}
    tuned = parse(**{"kafka.linger.ms": "20", "kafka.batch.size": "65536",
                     "kafka.compression.type": "GZIP", "kafka.acks": "-1",
                     "transactionalIdPrefix": "orders-sink", "checkpointLocation": "/x",
                     "queryName": "q"})
    assert tuned.producer == {"linger_ms": 20, "batch_size": 65536,
                              "compression_type": "gzip", "acks": "all"}
    assert tuned.transactional_id_prefix == "orders-sink"
    loose = parse(exactlyOnce="false", **{"kafka.acks": "1"})
    assert not loose.exactly_once and loose.producer["acks"] == 1
    # Either bootstrap name; Spark lower-cases option names.
    assert parse_sink_options({"kraftlog.bootstrap.servers": "h:1"}).bootstrap == "http://h:1"
    assert parse_sink_options({"exactlyonce": "FALSE", "kafka.bootstrap.servers": URL}
                              ).exactly_once is False


@pytest.mark.parametrize("options, message", [
    ({}, "kraftlog.bootstrap.servers is required"),
    ({"kafka.bootstrap.servers": URL, "kafka.acks": "1"}, "need kafka.acks=all"),
    ({"kafka.bootstrap.servers": URL, "kafka.acks": "2"}, "must be all, -1, 0 or 1"),
    ({"kafka.bootstrap.servers": URL, "kafka.linger.ms": "-1"}, "must be >= 0"),
    ({"kafka.bootstrap.servers": URL, "kafka.batch.size": "big"}, "must be an integer"),
    ({"kafka.bootstrap.servers": URL, "kafka.value.serializer": "x"}, "cast the value"),
    ({"kafka.bootstrap.servers": URL, "kafka.transactional.id": "x"}, "transactionalIdPrefix"),
    ({"kafka.bootstrap.servers": URL, "kafka.fetch.min.bytes": "1"}, "unknown option"),
    ({"kafka.bootstrap.servers": URL, "topic": " "}, "must name a topic"),
    ({"kafka.bootstrap.servers": URL, "transactionalIdPrefix": "a b"}, "letters, digits"),
    ({"kafka.bootstrap.servers": URL, "transactionalIdPrefix": "p", "exactlyOnce": "false"},
     "only applies with exactlyOnce=true"),
])
def test_bad_options_say_what_to_do(options, message):
    with pytest.raises(InvalidOptionError, match=message):
        parse_sink_options(options)


def test_schema_checks():
    from pyspark.sql.types import (ArrayType, BinaryType, DoubleType, IntegerType, LongType,
                                   StringType, StructField, StructType)

    header = ArrayType(StructType([StructField("key", StringType()),
                                   StructField("value", BinaryType())]))
    kinds = {"string": StringType(), "binary": BinaryType(), "int": IntegerType(),
             "long": LongType(), "double": DoubleType(), "headers": header,
             "array<int>": ArrayType(IntegerType()),
             "bad-headers": ArrayType(StructType([StructField("key", StringType()),
                                                  StructField("value", StringType())]))}

    def schema(columns: str) -> StructType:
        return StructType([StructField(name, kinds[kind]) for name, kind in
                           (c.split() for c in columns.split(","))])

    with_topic, no_topic = parse(topic="t"), parse()
    check_sink_schema(schema("value binary, key string, partition int, extra double, "
                             "headers headers"), with_topic)
    check_sink_schema(schema("topic string, value string"), no_topic)
    for columns, options, message in [
            ("key string", with_topic, "Required attribute 'value' not found"),
            ("value string", no_topic, "Topic option required"),
            ("topic int, value string", no_topic, "topic type must be a string"),
            ("value array<int>", with_topic, "value attribute type"),
            ("value string, partition long", with_topic, "partition attribute type must be"),
            ("value string, headers bad-headers", with_topic, "headers attribute type")]:
        with pytest.raises(InvalidOptionError, match=message):
            check_sink_schema(schema(columns), options)
