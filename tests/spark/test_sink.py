"""df.write / df.writeStream .format("kraftlog") in a real SparkSession against
real broker processes (the shared 3-broker cluster).

Every check reads the topic back with a read_committed consumer and compares
row by row. Covered:
  - the Kafka sink's contract: value/key as string or binary, keyed rows in
    Kafka's murmur2 partition, the partition and headers columns, the topic
    column and the topic option that overrides it;
  - bad schemas and options fail when the write starts, with Kafka's
    messages; an unknown topic fails the job with what to do;
  - a batch job that fails leaves nothing visible and nothing open;
  - a streaming copy A -> B is exactly once across a stop and restart
    from the checkpoint, with B's leader killed (SIGKILL) mid-query;
  - every micro-batch's first task attempt failing after it wrote rows
    (Spark retries it) still leaves each row exactly once;
  - a replayed micro-batch that was committed writes nothing again.
The driver killed with SIGKILL mid-batch is in test_example.py.
"""

from __future__ import annotations

import collections
import signal
import threading
import time

import pytest

from api.client import Admin, Consumer, Producer, TopicPartition
from chaos.cluster import wait_until
from protocol.partitioner import partition_for_key
from tests.spark.test_source import create_topic, stream, unique

pytestmark = pytest.mark.slow


def committed(bootstrap: str, topic: str, partitions: int, timeout_s: float = 60) -> list:
    """Every record of ``topic`` a read_committed consumer sees, up to the
    last stable offsets."""
    tps = [TopicPartition(topic, p) for p in range(partitions)]
    with Consumer(bootstrap, auto_offset_reset="earliest",
                  isolation_level="read_committed") as consumer:
        consumer.assign(tps)
        ends = consumer.end_offsets(tps)
        records = []
        deadline = time.monotonic() + timeout_s
        while any(consumer.position(tp) < ends[tp] for tp in tps):
            assert time.monotonic() < deadline, "reading the topic back took too long"
            records.extend(consumer.poll(300))
    return records


def open_transactions(bootstrap: str, prefix: str) -> list[str]:
    with Admin(bootstrap) as admin:
        return [t["transactional_id"] for t in admin.list_transactions()
                if t["transactional_id"].startswith(prefix) and t["state"] == "Ongoing"]


def sink(df, bootstrap: str, **options):
    """``df.write`` to kraftlog. Spark lets a Python data source be written
    in append (or overwrite) mode only, not in its default ErrorIfExists."""
    writer = (df.write.format("kraftlog").mode("append")
              .option("kafka.bootstrap.servers", bootstrap))
    for key, value in options.items():
        writer = writer.option(key, value)
    return writer


# -- batch writes -------------------------------------------------------------------------
def test_batch_write_keeps_the_kafka_sinks_contract(spark, bootstrap):
    topic = unique("sink-contract")
    create_topic(bootstrap, topic, 3)
    rows = [(f"k{i}", f"value-{i}".encode(), 2 if i % 10 == 0 else None,
             [("n", str(i).encode())] if i % 3 == 0 else None) for i in range(600)]
    df = spark.createDataFrame(
        rows, "key string, value binary, partition int, "
              "headers array<struct<key:string,value:binary>>").repartition(3)
    sink(df, bootstrap, topic=topic).save()
    got = committed(bootstrap, topic, 3)
    assert len(got) == 600
    by_key = {r.key.decode(): r for r in got}
    assert len(by_key) == 600, "a row was written twice"
    for key, value, partition, headers in rows:
        record = by_key[key]
        assert record.value == value
        expected = partition if partition is not None else partition_for_key(key.encode(), 3)
        assert record.partition == expected, key
        assert list(record.headers or ()) == (headers or [])


def test_batch_write_routes_by_topic_column_unless_the_option_says(spark, bootstrap):
    a, b = unique("sink-a"), unique("sink-b")
    create_topic(bootstrap, a, 1)
    create_topic(bootstrap, b, 1)
    df = spark.createDataFrame([(a if i % 2 else b, f"v{i}") for i in range(40)],
                               "topic string, value string")
    sink(df, bootstrap).save()
    assert sorted(r.value for r in committed(bootstrap, a, 1)) == sorted(
        f"v{i}".encode() for i in range(40) if i % 2)
    assert len(committed(bootstrap, b, 1)) == 20
    sink(df, bootstrap, topic=a).save()  # the option wins over the column
    assert len(committed(bootstrap, a, 1)) == 60
    assert len(committed(bootstrap, b, 1)) == 20


# Batch and streaming writes check their schema and options with the same
# code (spark_source/sink_options.py); a streaming query is started (3 s
# each) for one schema error, one missing option and one bad option value.
@pytest.mark.parametrize("columns, options, message, streaming", [
    ("key string", {"topic": "t"}, "Required attribute 'value' not found", True),
    ("value int", {"topic": "t"}, "value attribute type must be a string or binary", False),
    ("value string, key int", {"topic": "t"}, "key attribute type must be a string or binary",
     False),
    ("value string", {}, "Topic option required when no 'topic' attribute is present", True),
    ("value string, partition string", {"topic": "t"}, "partition attribute type must be",
     False),
    ("value string, headers string", {"topic": "t"}, "headers attribute type must be", False),
    ("value string", {"topic": "t", "kafka.acks": "1"}, "need kafka.acks=all", True),
    ("value string", {"topic": "t", "kafka.key.serializer": "x"}, "cast the key column", False),
    ("value string", {"topic": "t", "kafka.linger.ms": "soon"}, "must be an integer", False),
    ("value string", {"topic": "t", "subscribe": "t"}, "unknown option", False),
    ("value string", {"topic": "t", "exactlyOnce": "maybe"}, "must be true or false", False),
])
def test_bad_schema_or_options_fail_when_the_write_starts(spark, bootstrap, tmp_path, columns,
                                                          options, message, streaming):
    df = spark.createDataFrame([], columns)
    with pytest.raises(Exception, match=message):
        sink(df, bootstrap, **options).save()
    if not streaming:
        return
    with pytest.raises(Exception, match=message):
        # A streaming query fails when it starts, or with its first batch.
        query = (stream(spark, bootstrap, subscribe="none").selectExpr(
            *[f"CAST(NULL AS {kind}) AS {name}" for name, kind in
              (c.strip().split(" ") for c in columns.split(","))])
            .writeStream.format("kraftlog").option("kafka.bootstrap.servers", bootstrap)
            .option("checkpointLocation", str(tmp_path / "cp")).options(**options).start())
        try:
            query.awaitTermination(60)
        finally:
            query.stop()


def test_overwrite_and_unknown_topics_are_refused(spark, bootstrap):
    df = spark.createDataFrame([("x",)], "value string")
    with pytest.raises(Exception, match="Save mode Overwrite not allowed"):
        sink(df, bootstrap, topic="t").mode("overwrite").save()
    missing = unique("missing")
    with pytest.raises(Exception, match=f"topic '{missing}' does not exist"):
        sink(df, bootstrap, topic=missing).save()


def test_a_failed_batch_job_leaves_nothing_visible_and_nothing_open(spark, bootstrap):
    from pyspark.sql import functions as F

    topic, prefix = unique("sink-fail"), unique("failjob")
    create_topic(bootstrap, topic, 2)

    @F.udf("string")
    def fail_late(i):
        if i == 2900:  # late in the second task: it has sent rows by then
            raise ValueError("a task failing on purpose")
        return f"v{i}"

    df = spark.range(0, 3000, 1, 2).select(fail_late("id").alias("value"))
    previous = spark.conf.get("spark.sql.execution.arrow.maxRecordsPerBatch")
    # Rows reach the writer 50 at a time, so it sends some before the failure.
    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "50")
    try:
        with pytest.raises(Exception, match="a task failing on purpose"):
            sink(df, bootstrap, topic=topic, transactionalIdPrefix=prefix,
                 **{"kafka.linger.ms": "0"}).save()
    finally:
        spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", previous)
    assert committed(bootstrap, topic, 2) == []
    wait_until(lambda: open_transactions(bootstrap, prefix) == [], 30,
               "the failed job's transactions to be aborted")
    with Consumer(bootstrap, auto_offset_reset="earliest") as consumer:
        tps = [TopicPartition(topic, p) for p in range(2)]
        assert sum(consumer.end_offsets(tps).values()) > 0  # rows were written, then aborted


def test_at_least_once_mode_writes_without_transactions(spark, bootstrap):
    topic = unique("sink-alo")
    create_topic(bootstrap, topic, 2)
    df = spark.range(500).selectExpr("CAST(id AS STRING) AS key", "CAST(id AS STRING) AS value")
    sink(df, bootstrap, topic=topic, exactlyOnce="false", **{"kafka.acks": "1",
                                                           "kafka.linger.ms": "20"}).save()
    got = committed(bootstrap, topic, 2)
    assert sorted(int(r.value) for r in got) == list(range(500))


# -- streaming writes ---------------------------------------------------------------------
def copy_query(spark, bootstrap: str, source: str, target: str, checkpoint: str,
               transform=None, **trigger):
    df = stream(spark, bootstrap, subscribe=source, startingOffsets="earliest",
                maxOffsetsPerTrigger="300").selectExpr("key", "value")
    if transform is not None:
        df = transform(df)
    return (df.writeStream.format("kraftlog").option("kafka.bootstrap.servers", bootstrap)
            .option("topic", target).option("checkpointLocation", checkpoint)
            .trigger(**(trigger or {"processingTime": "200 milliseconds"})).start())


def produce_values(bootstrap: str, topic: str, values: list[str]) -> None:
    with Producer(bootstrap, linger_ms=5) as producer:
        for value in values:
            producer.send(topic, value, key=value)
        producer.flush()


def assert_exactly_once(bootstrap: str, target: str, partitions: int, values: list[str]):
    got = collections.Counter(r.value.decode() for r in committed(bootstrap, target,
                                                                   partitions))
    missing = set(values) - set(got)
    repeated = {v: n for v, n in got.items() if n > 1}
    assert not missing and not repeated and set(got) == set(values), (
        f"{len(missing)} rows missing (e.g. {sorted(missing)[:3]}), {len(repeated)} repeated "
        f"(e.g. {sorted(repeated.items())[:3]}), {len(set(got) - set(values))} unexpected")


def wait_copied(bootstrap, query, target, partitions, count, timeout_s=120):
    def done():
        error = query.exception()
        assert error is None, f"the query failed: {error}"
        return len(committed(bootstrap, target, partitions)) >= count
    wait_until(done, timeout_s, f"{count} rows copied to {target}")


def test_streaming_copy_is_exactly_once_across_a_restart_and_a_leader_kill(
        spark, bootstrap, cluster, tmp_path):
    source, target = unique("copy-a"), unique("copy-b")
    create_topic(bootstrap, source, 3, rf=3, min_insync_replicas=2)
    create_topic(bootstrap, target, 3, rf=3, min_insync_replicas=2)
    values = [f"row-{i}" for i in range(3000)]
    produce_values(bootstrap, source, values[:1500])
    checkpoint = str(tmp_path / "cp")
    query = copy_query(spark, bootstrap, source, target, checkpoint)
    killed = None
    try:
        wait_copied(bootstrap, query, target, 3, 300)
        with Admin(bootstrap) as admin:
            killed = admin.describe_topics([target])[target].partitions[0].leader
        cluster.kill(killed, signal.SIGKILL)
        produce_values(bootstrap, source, values[1500:2200])
        wait_copied(bootstrap, query, target, 3, 1800)
    finally:
        query.stop()
        if killed is not None:
            cluster.start([killed])
            cluster.wait_for_brokers_running(timeout_s=30)
    assert query.exception() is None
    produce_values(bootstrap, source, values[2200:])
    again = copy_query(spark, bootstrap, source, target, checkpoint, availableNow=True)
    try:
        assert again.awaitTermination(120), "the restarted query did not finish in 120 s"
    finally:
        again.stop()
    assert again.exception() is None
    assert_exactly_once(bootstrap, target, 3, values)
    # Keyed rows keep Kafka's partitioning in the copy.
    for record in committed(bootstrap, target, 3)[:200]:
        assert record.partition == partition_for_key(record.key, 3)


def test_task_attempts_failing_after_writing_are_retried_exactly_once(spark, bootstrap,
                                                                      tmp_path):
    """The session retries a failed task once (local[2,2]); here every
    micro-batch's first attempt of its first task fails after its producer
    sent rows in the transaction."""
    from pyspark.sql import functions as F

    source, target = unique("retry-a"), unique("retry-b")
    create_topic(bootstrap, source, 2)
    create_topic(bootstrap, target, 2)
    values = [f"r-{i}" for i in range(1200)]
    produce_values(bootstrap, source, values)

    @F.udf("binary")
    def fail_first_attempt(value, offset):
        from pyspark import TaskContext

        context = TaskContext.get()
        if context.attemptNumber() == 0 and context.partitionId() == 0 and offset % 300 >= 250:
            raise ValueError("first attempt failing on purpose")
        return value

    previous = spark.conf.get("spark.sql.execution.arrow.maxRecordsPerBatch")
    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "50")
    try:
        query = (stream(spark, bootstrap, subscribe=source, startingOffsets="earliest",
                        maxOffsetsPerTrigger="600")
                 .select("key", fail_first_attempt("value", "offset").alias("value"))
                 .writeStream.format("kraftlog").option("kafka.bootstrap.servers", bootstrap)
                 .option("topic", target).option("checkpointLocation", str(tmp_path / "cp"))
                 .trigger(availableNow=True).start())
        try:
            assert query.awaitTermination(180), "the query did not finish in 180 s"
        finally:
            query.stop()
    finally:
        spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", previous)
    assert query.exception() is None
    assert_exactly_once(bootstrap, target, 2, values)
    with Consumer(bootstrap, auto_offset_reset="earliest") as consumer:
        tps = [TopicPartition(target, p) for p in range(2)]
        written = sum(consumer.end_offsets(tps).values())
    assert written > len(values), "no failed attempt had written anything before failing"


def test_a_replayed_committed_batch_is_not_written_again(spark, bootstrap, tmp_path):
    """Spark replays the last micro-batch whose commit it did not record;
    here its record is deleted from the checkpoint after the query stops,
    as when the driver dies between the sink's commit and Spark's."""
    import os

    source, target = unique("replay-a"), unique("replay-b")
    create_topic(bootstrap, source, 2)
    create_topic(bootstrap, target, 2)
    values = [f"p-{i}" for i in range(400)]
    produce_values(bootstrap, source, values)
    checkpoint = str(tmp_path / "cp")
    query = copy_query(spark, bootstrap, source, target, checkpoint, availableNow=True)
    assert query.awaitTermination(120)
    query.stop()
    assert query.exception() is None
    commits = sorted(int(n) for n in os.listdir(os.path.join(checkpoint, "commits"))
                     if n.isdigit())
    for name in (str(commits[-1]), f".{commits[-1]}.crc"):
        path = os.path.join(checkpoint, "commits", name)
        if os.path.exists(path):
            os.remove(path)
    again = copy_query(spark, bootstrap, source, target, checkpoint, availableNow=True)
    assert again.awaitTermination(120)
    again.stop()
    assert again.exception() is None
    assert_exactly_once(bootstrap, target, 2, values)


# -- chaos: brokers killed in turn under a streaming copy ---------------------------------
def test_streaming_copy_while_brokers_are_killed_in_turn(spark, bootstrap, cluster, tmp_path):
    """Jepsen-style: a producer writes A (acks=all) while a streaming query
    copies A to B and each broker in turn is killed with SIGKILL and
    restarted (partition leaders, the transaction and group coordinators go
    with them). Checker: B, read_committed, holds every record of A exactly
    once: no loss, no duplicate."""
    source, target = unique("chaos-a"), unique("chaos-b")
    create_topic(bootstrap, source, 3, rf=3, min_insync_replicas=2)
    create_topic(bootstrap, target, 3, rf=3, min_insync_replicas=2)
    acked: list[str] = []
    errors: list[BaseException] = []
    stop = threading.Event()

    def write() -> None:
        """Paced writes (about 500/s) until told to stop; at most 30,000."""
        try:
            with Producer(bootstrap, acks="all", linger_ms=5, delivery_timeout_ms=60_000
                          ) as producer:
                handles = []
                for i in range(30_000):
                    if stop.is_set():
                        break
                    value = f"c-{i}"
                    handles.append((value, producer.send(source, value, key=value)))
                    if i % 50 == 49:
                        time.sleep(0.1)
                producer.flush()
                acked.extend(v for v, h in handles if h.exception(60) is None)
        except BaseException as exc:  # noqa: BLE001  reported by the test
            errors.append(exc)

    writer = threading.Thread(target=write)
    query = copy_query(spark, bootstrap, source, target, str(tmp_path / "cp"))
    writer.start()
    try:
        wait_copied(bootstrap, query, target, 3, 200)
        for broker in cluster.broker_ids:
            cluster.kill(broker, signal.SIGKILL)
            time.sleep(2)  # the cluster runs without it for a while
            cluster.start([broker])
            cluster.wait_for_brokers_running(timeout_s=60)
            assert query.exception() is None, f"the query failed: {query.exception()}"
        stop.set()
        writer.join(120)
        assert not writer.is_alive() and not errors, errors
        wait_copied(bootstrap, query, target, 3, len(acked), timeout_s=180)
    finally:
        stop.set()
        query.stop()
    assert query.exception() is None
    in_source = [r.value.decode() for r in committed(bootstrap, source, 3)]
    assert set(acked) <= set(in_source), "an acknowledged record is missing from A"
    assert_exactly_once(bootstrap, target, 3, in_source)
