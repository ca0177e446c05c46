"""Spark and Kafka's clients on one log: records a Kafka client writes
through a broker's KAFKA listener are what the Spark source reads (keys,
values, headers, timestamps, partitions, offsets), and what the Spark sink
writes is what a Kafka client reads, byte for byte."""

from __future__ import annotations

import time
import uuid

import pytest

from api.client import Admin, NewTopic

pytestmark = pytest.mark.slow

BASE_TS = (int(time.time()) - 3600) * 1000


def _topic(bootstrap: str, prefix: str, partitions: int) -> str:
    name = f"{prefix}-{uuid.uuid4().hex[:6]}"
    with Admin(bootstrap) as admin:
        admin.create_topics([NewTopic(name, partitions, 1)])
    return name


def test_the_spark_source_reads_what_a_kafka_client_wrote(spark, bootstrap, cluster):
    from confluent_kafka import Producer

    topic = _topic(bootstrap, "kafka-to-spark", 2)
    producer = Producer({"bootstrap.servers": cluster.kafka_bootstrap, "linger.ms": 5})
    acked: dict[tuple[int, int], tuple] = {}
    headers = {}  # value -> the headers it was sent with (delivery reports omit them)

    def delivered(error, message) -> None:
        assert error is None, error
        acked[(message.partition(), message.offset())] = (
            message.key(), message.value(), headers[message.value()], message.timestamp()[1])
    for i in range(200):
        value = b"v-%d" % i + bytes([i % 256])
        headers[value] = [("n", str(i).encode()), ("empty", b"")] if i % 3 == 0 else None
        producer.produce(topic, value=value, key=None if i % 7 == 0 else b"k-%d" % i,
                         partition=i % 2, timestamp=BASE_TS + i, headers=headers[value],
                         on_delivery=delivered)
    assert producer.flush(30) == 0 and len(acked) == 200

    rows = (spark.read.format("kraftlog").option("kraftlog.bootstrap.servers", bootstrap)
            .option("subscribe", topic).option("includeHeaders", "true").load()
            .selectExpr("key", "value", "partition", "offset", "unix_millis(timestamp) AS ts",
                        "headers").collect())
    got = {(r["partition"], r["offset"]): (
        None if r["key"] is None else bytes(r["key"]), bytes(r["value"]),
        None if r["headers"] is None else [(h["key"], bytes(h["value"]))
                                           for h in r["headers"]], r["ts"]) for r in rows}
    assert got == acked


def test_a_kafka_client_reads_what_the_spark_sink_wrote(spark, bootstrap, cluster):
    from confluent_kafka import Consumer, TopicPartition

    topic = _topic(bootstrap, "spark-to-kafka", 1)
    rows = [(f"k{i}", f"value-{i}".encode(), [("n", str(i).encode())] if i % 2 else None)
            for i in range(100)]
    df = spark.createDataFrame(rows, "key string, value binary, "
                                     "headers array<struct<key:string,value:binary>>")
    (df.coalesce(1).write.format("kraftlog").mode("append")
     .option("kafka.bootstrap.servers", bootstrap).option("topic", topic).save())
    consumer = Consumer({"bootstrap.servers": cluster.kafka_bootstrap, "group.id": "unused",
                         "enable.auto.commit": False})
    try:
        consumer.assign([TopicPartition(topic, 0, 0)])
        got = []
        deadline = time.monotonic() + 30
        while len(got) < 100 and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is not None and message.error() is None:
                got.append((message.key().decode(), message.value(), message.headers()))
    finally:
        consumer.close()
    assert sorted(got) == sorted(rows)
