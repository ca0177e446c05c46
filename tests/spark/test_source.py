"""format("kraftlog") in a real SparkSession against real broker processes.

Every check is record by record: what Spark returns is compared, by
(partition, offset), with what the producer was told was written, or with a
read of the log through the client. Covered:
  - the schema is Spark's Kafka source's, with and without headers;
  - batch reads between starting and ending offsets (JSON, -2/-1,
    timestamps), minPartitions splitting;
  - streaming with Trigger.AvailableNow into a memory sink; each
    micro-batch bounded by maxOffsetsPerTrigger;
  - a query stopped mid-stream and restarted from its checkpoint writes
    every record exactly once into a Parquet sink;
  - partitions and topics that appear mid-stream are read from their start;
  - failOnDataLoss both ways, after retention deleted offsets and after a
    topic was deleted;
  - a partition leader killed with SIGKILL mid-query does not fail it;
  - bad options fail the query when it starts, with the option named.

Streaming waits poll the sink with a deadline; none sleeps and hopes.
"""

from __future__ import annotations

import signal
import threading
import time
import uuid

import pytest

from api.client import Admin, Consumer, NewTopic, Producer, TopicPartition
from chaos.cluster import http_json, wait_until

pytestmark = pytest.mark.slow

# Record timestamps for tests that set them: an hour ago, well inside the
# default retention (an old timestamp would have retention delete the data).
BASE_TS = (int(time.time()) - 3600) * 1000


# -- helpers ------------------------------------------------------------------------------------
def unique(name: str) -> str:
    return f"{name}-{uuid.uuid4().hex[:6]}"


def create_topic(bootstrap: str, name: str, partitions: int, rf: int = 1, **configs) -> None:
    with Admin(bootstrap) as admin:
        admin.create_topics([NewTopic(name, partitions, rf,
                                      configs={k.replace("_", "."): str(v)
                                               for k, v in configs.items()})])


def produce(bootstrap: str, topic: str, count: int, *, partition: int | None = None,
            start: int = 0, timestamp_ms: int | None = None, headers: bool = False
            ) -> dict[tuple[int, int], bytes]:
    """Send ``count`` records; (partition, offset) -> value as acknowledged."""
    with Producer(bootstrap, linger_ms=5) as producer:
        handles = []
        for i in range(start, start + count):
            value = f"{topic}-v{i}".encode()
            handles.append((value, producer.send(
                topic, value, key=f"k{i % 5}".encode(), partition=partition,
                timestamp_ms=None if timestamp_ms is None else timestamp_ms + i,
                headers=[("n", str(i).encode()), ("none", None)] if headers and i % 2 else None)))
        producer.flush()
        acked = {}
        for value, handle in handles:
            meta = handle.result(timeout=30)
            acked[(meta.partition, meta.offset)] = value
    return acked


def read_log(bootstrap: str, topic: str, partitions: int) -> list:
    """Every committed record of ``topic`` (ConsumerRecords), read through
    the client up to the high watermarks."""
    tps = [TopicPartition(topic, p) for p in range(partitions)]
    with Consumer(bootstrap, auto_offset_reset="earliest") as consumer:
        consumer.assign(tps)
        ends = consumer.end_offsets(tps)
        records = []
        deadline = time.monotonic() + 30
        while any(consumer.position(tp) < ends[tp] for tp in tps):
            assert time.monotonic() < deadline, "reading the log back took over 30 s"
            records.extend(consumer.poll(500))
    return records


def log_contents(bootstrap: str, topic: str, partitions: int) -> dict[tuple[int, int], bytes]:
    """(partition, offset) -> value of every committed record of ``topic``."""
    return {(r.partition, r.offset): r.value for r in read_log(bootstrap, topic, partitions)}


def reader(spark, bootstrap: str, **options):
    source = spark.read.format("kraftlog").option("kraftlog.bootstrap.servers", bootstrap)
    for key, value in options.items():
        source = source.option(key, value)
    return source.load()


def stream(spark, bootstrap: str, **options):
    source = spark.readStream.format("kraftlog").option("kraftlog.bootstrap.servers", bootstrap)
    for key, value in options.items():
        source = source.option(key, value)
    return source.load()


def available_now_to_memory(spark, bootstrap: str, name: str, checkpoint: str, **options):
    """Run a Trigger.AvailableNow query into the memory sink ``name`` until
    it ends (120 s at most); the finished query."""
    query = (stream(spark, bootstrap, **options)
             .writeStream.format("memory").queryName(name)
             .option("checkpointLocation", checkpoint)
             .trigger(availableNow=True).start())
    try:
        assert query.awaitTermination(120), "the AvailableNow query did not finish in 120 s"
    finally:
        query.stop()
    return query


def streaming_to_memory(spark, bootstrap: str, name: str, **options):
    """Start a query into the memory sink ``name``, a micro-batch every
    100 ms; the caller stops it."""
    return (stream(spark, bootstrap, **options)
            .writeStream.format("memory").queryName(name)
            .trigger(processingTime="100 milliseconds").start())


def rows_by_offset(rows) -> dict[tuple[int, int], bytes]:
    found: dict[tuple[int, int], bytes] = {}
    for row in rows:
        key = (row["partition"], row["offset"])
        assert key not in found, f"record {key} read twice"
        found[key] = bytes(row["value"])
    return found


def memory_rows(spark, name: str) -> list:
    return spark.sql(f"SELECT partition, offset, value FROM {name}").collect()


def wait_for_rows(spark, query, name: str, count: int, timeout_s: float = 60) -> list:
    """The memory sink's rows once it holds ``count``; fails at once if the
    query fails, and after ``timeout_s`` otherwise."""
    deadline = time.monotonic() + timeout_s
    while True:
        error = query.exception()
        assert error is None, f"the query failed: {error}"
        rows = memory_rows(spark, name)
        if len(rows) >= count:
            return rows
        assert time.monotonic() < deadline, (
            f"timed out after {timeout_s} s waiting for {count} rows in {name} "
            f"(have {len(rows)})")
        time.sleep(0.25)


# -- schema ---------------------------------------------------------------------------------------
def test_schema_is_the_kafka_sources(spark, bootstrap):
    from pyspark.sql.types import (
        ArrayType, BinaryType, IntegerType, LongType, StringType, StructField, StructType,
        TimestampType)

    # Spark's Kafka source (KafkaRecordToRowConverter.kafkaSchema), field for field.
    kafka = StructType([
        StructField("key", BinaryType()), StructField("value", BinaryType()),
        StructField("topic", StringType()), StructField("partition", IntegerType()),
        StructField("offset", LongType()), StructField("timestamp", TimestampType()),
        StructField("timestampType", IntegerType())])
    with_headers = StructType(kafka.fields + [StructField("headers", ArrayType(StructType([
        StructField("key", StringType()), StructField("value", BinaryType())])))])
    assert reader(spark, bootstrap, subscribe="any").schema == kafka
    assert stream(spark, bootstrap, subscribe="any").schema == kafka
    assert reader(spark, bootstrap, subscribe="any", includeHeaders="true").schema == with_headers
    assert stream(spark, bootstrap, subscribe="any", includeHeaders="True").schema == with_headers


# -- transactions ---------------------------------------------------------------------------------
def test_read_committed_reads_committed_transactions_only(spark, bootstrap, tmp_path):
    from api.client import Producer
    topic = unique("txn")
    create_topic(bootstrap, topic, 2)
    with Producer(bootstrap.split(","), transactional_id=unique("spark-txn")) as producer:
        producer.init_transactions()
        for round_no, commit in enumerate((True, False, True, False, True)):
            producer.begin_transaction()
            for i in range(6):
                producer.send(topic, f"r{round_no}-{i}", partition=i % 2)
            if commit:
                producer.commit_transaction()
            else:
                producer.flush()
                producer.abort_transaction()
    committed = sorted(f"r{r}-{i}" for r in (0, 2, 4) for i in range(6))
    batch = reader(spark, bootstrap, subscribe=topic, **{"kafka.isolation.level":
                                                         "read_committed"})
    assert sorted(bytes(r["value"]).decode() for r in batch.collect()) == committed
    everything = reader(spark, bootstrap, subscribe=topic).collect()
    assert len(everything) == 30  # read_uncommitted: aborted records too, never markers
    name = "txn_stream_" + uuid.uuid4().hex[:6]
    query = (stream(spark, bootstrap, subscribe=topic, startingOffsets="earliest",
                    **{"kafka.isolation.level": "read_committed"})
             .writeStream.format("memory").queryName(name)
             .option("checkpointLocation", str(tmp_path / "ckpt"))
             .trigger(availableNow=True).start())
    assert query.awaitTermination(120)
    rows = spark.sql(f"SELECT value FROM {name}").collect()
    assert sorted(bytes(r["value"]).decode() for r in rows) == committed


# -- batch ----------------------------------------------------------------------------------------
def test_batch_reads_between_starting_and_ending_offsets(spark, bootstrap):
    topic = unique("batch")
    create_topic(bootstrap, topic, 2)
    acked = produce(bootstrap, topic, 50, partition=0, timestamp_ms=BASE_TS, headers=True)
    acked.update(produce(bootstrap, topic, 40, partition=1, timestamp_ms=BASE_TS))

    everything = reader(spark, bootstrap, subscribe=topic).collect()
    assert rows_by_offset(everything) == acked

    df = reader(spark, bootstrap, assign=f'{{"{topic}": [0, 1]}}', includeHeaders="true",
                startingOffsets=f'{{"{topic}": {{"0": 10, "1": -2}}}}',
                endingOffsets=f'{{"{topic}": {{"0": 40, "1": -1}}}}')
    rows = df.selectExpr("key", "value", "topic", "partition", "offset",
                         "unix_millis(timestamp) AS ts", "timestampType", "headers").collect()
    expected = {tp: v for tp, v in acked.items() if tp[0] == 1 or 10 <= tp[1] < 40}
    assert rows_by_offset(rows) == expected
    for row in rows:
        i = int(bytes(row["value"]).decode().rsplit("v", 1)[1])
        assert bytes(row["key"]) == f"k{i % 5}".encode()
        assert row["topic"] == topic and row["timestampType"] == 0
        assert row["ts"] == BASE_TS + i
        if row["partition"] == 0 and i % 2:
            assert [(h["key"], h["value"]) for h in row["headers"]] == [
                ("n", str(i).encode()), ("none", None)]
        else:
            assert row["headers"] is None  # no headers: null, as the Kafka source


def test_batch_starting_timestamp_and_min_partitions(spark, bootstrap):
    topic = unique("times")
    create_topic(bootstrap, topic, 2)
    acked = produce(bootstrap, topic, 60, partition=0, timestamp_ms=BASE_TS)
    acked.update(produce(bootstrap, topic, 60, partition=1, start=60, timestamp_ms=BASE_TS))

    # Partition 0 has timestamps BASE_TS+0..59, partition 1 BASE_TS+60..119.
    rows = reader(spark, bootstrap, subscribe=topic,
                  startingTimestamp=str(BASE_TS + 30)).collect()
    assert rows_by_offset(rows) == {tp: v for tp, v in acked.items()
                                    if tp[0] == 1 or tp[1] >= 30}

    by_ts = reader(spark, bootstrap, subscribe=topic, startingOffsetsByTimestamp=(
        f'{{"{topic}": {{"0": {BASE_TS + 55}, "1": {BASE_TS + 1000}}}}}'),
        startingOffsetsByTimestampStrategy="latest")
    assert sorted((r["partition"], r["offset"]) for r in by_ts.collect()) == [
        (0, o) for o in range(55, 60)]
    with pytest.raises(Exception, match="startingOffsetsByTimestampStrategy=latest"):
        reader(spark, bootstrap, subscribe=topic, startingOffsetsByTimestamp=(
            f'{{"{topic}": {{"0": {BASE_TS}, "1": {BASE_TS + 1000}}}}}')).collect()

    split = reader(spark, bootstrap, subscribe=topic, minPartitions="7")
    assert split.rdd.getNumPartitions() >= 7
    assert rows_by_offset(split.collect()) == acked
    capped = reader(spark, bootstrap, subscribe=topic, maxRecordsPerPartition="25")
    assert capped.rdd.getNumPartitions() == 6  # 60 records each: 3 tasks per partition
    assert rows_by_offset(capped.collect()) == acked


# -- streaming ------------------------------------------------------------------------------------
def test_available_now_and_max_offsets_per_trigger(spark, bootstrap, tmp_path):
    topic = unique("avail")
    create_topic(bootstrap, topic, 3)
    acked = produce(bootstrap, topic, 1000)
    name = topic.replace("-", "_")
    query = available_now_to_memory(spark, bootstrap, name, str(tmp_path / "cp"),
                                    subscribe=topic, startingOffsets="earliest",
                                    maxOffsetsPerTrigger="150")
    assert query.exception() is None
    assert rows_by_offset(memory_rows(spark, name)) == acked
    sizes = [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]
    assert sum(sizes) == 1000
    assert all(size <= 150 for size in sizes), sizes
    assert len(sizes) == 7, sizes  # ceil(1000 / 150): every batch as full as allowed


def test_restart_from_checkpoint_writes_every_record_exactly_once(spark, bootstrap, tmp_path):
    topic = unique("restart")
    create_topic(bootstrap, topic, 3)
    acked = produce(bootstrap, topic, 600)
    out, checkpoint = str(tmp_path / "out"), str(tmp_path / "cp")

    def start(**trigger):
        return (stream(spark, bootstrap, subscribe=topic, startingOffsets="earliest",
                       maxOffsetsPerTrigger="100")
                .selectExpr("partition", "offset", "value")
                .writeStream.format("parquet").option("path", out)
                .option("checkpointLocation", checkpoint).trigger(**trigger).start())

    first = start(processingTime="100 milliseconds")
    try:
        wait_until(lambda: (first.lastProgress or {}).get("batchId", -1) >= 1, 60,
                   "two micro-batches of the first run")
    finally:
        first.stop()
    assert first.exception() is None
    written = spark.read.parquet(out).count()
    assert 200 <= written < 600, f"the first run wrote {written} of 600 records"
    acked.update(produce(bootstrap, topic, 400, start=600))

    second = start(availableNow=True)
    try:
        assert second.awaitTermination(120), "the restarted query did not finish in 120 s"
    finally:
        second.stop()
    assert second.exception() is None
    assert rows_by_offset(spark.read.parquet(out).collect()) == acked


def test_partitions_and_topics_added_mid_stream_are_read_from_their_start(spark, bootstrap):
    prefix = unique("grow")
    first, second = f"{prefix}-a", f"{prefix}-b"
    create_topic(bootstrap, first, 1)
    acked = {(first, *k): v for k, v in produce(bootstrap, first, 30).items()}
    name = prefix.replace("-", "_")
    query = streaming_to_memory(spark, bootstrap, name, subscribePattern=f"{prefix}-.*",
                                startingOffsets="earliest")
    try:
        wait_for_rows(spark, query, name, 30)
        with Admin(bootstrap) as admin:
            admin.create_partitions({first: 2})
        create_topic(bootstrap, second, 2)
        acked.update({(first, *k): v for k, v in
                      produce(bootstrap, first, 20, partition=1, start=30).items()})
        acked.update({(second, *k): v for k, v in produce(bootstrap, second, 25).items()})
        wait_for_rows(spark, query, name, len(acked))
        rows = spark.sql(f"SELECT topic, partition, offset, value FROM {name}").collect()
        found = {(r["topic"], r["partition"], r["offset"]): bytes(r["value"]) for r in rows}
        assert len(found) == len(rows) == len(acked)
        assert found == acked
    finally:
        query.stop()


def test_a_compacted_topics_gaps_are_read_over_and_are_not_data_loss(spark, bootstrap):
    """Compaction removes superseded records and leaves their offsets
    empty: the source reads what is left, at its offsets, also from a
    starting offset inside a removed range, and failOnDataLoss (on by
    default) does not fire."""
    topic = unique("compacted")
    create_topic(bootstrap, topic, 1, cleanup_policy="compact", segment_bytes=1024,
                 min_cleanable_dirty_ratio=0.01)
    for start in range(0, 100, 10):  # five keys, twenty records each, in ten batches
        produce(bootstrap, topic, 10, partition=0, start=start)
    url = bootstrap.split(",")[0]

    def cleaned() -> bool:
        part = http_json(f"{url}/v1/topics/{topic}")[1]["partitions"][0]
        return (part.get("cleaner") or {}).get("first_dirty_offset", 0) > 50

    wait_until(cleaned, 60, "the topic was compacted")
    left = log_contents(bootstrap, topic, 1)
    assert len(left) < 60 and max(o for _, o in left) == 99, sorted(left)

    assert rows_by_offset(reader(spark, bootstrap, subscribe=topic).collect()) == left
    rows = reader(spark, bootstrap, subscribe=topic,
                  startingOffsets=f'{{"{topic}": {{"0": 3}}}}').collect()
    assert rows_by_offset(rows) == {tp: v for tp, v in left.items() if tp[1] >= 3}


# -- failOnDataLoss -------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def aged_topic(bootstrap):
    """A topic whose first records retention has deleted: (name, log start,
    high watermark, the records left)."""
    topic = unique("aged")
    # Records 30 days old, then new ones in later segments: time retention
    # (7 days by default) deletes exactly the old ones.
    create_topic(bootstrap, topic, 1, segment_bytes=1024)
    produce(bootstrap, topic, 100, timestamp_ms=BASE_TS - 30 * 86_400_000)
    produce(bootstrap, topic, 100, start=100)
    tp = TopicPartition(topic, 0)
    with Consumer(bootstrap) as consumer:
        def deleted() -> bool:
            return consumer.beginning_offsets([tp])[tp] == 100
        wait_until(deleted, 30, f"retention deleting the 100 old records of {topic}")
        start = consumer.beginning_offsets([tp])[tp]
        end = consumer.end_offsets([tp])[tp]
    left = log_contents(bootstrap, topic, 1)
    assert (start, end) == (100, 200) and sorted(left) == [(0, o) for o in range(100, 200)]
    return topic, start, end, left


def test_fail_on_data_loss_true_fails_a_query_reading_deleted_offsets(spark, bootstrap,
                                                                      aged_topic, tmp_path):
    topic, _start, _end, _left = aged_topic
    from_zero = f'{{"{topic}": {{"0": 0}}}}'
    with pytest.raises(Exception, match="failOnDataLoss=false"):
        reader(spark, bootstrap, subscribe=topic, startingOffsets=from_zero).collect()
    query = (stream(spark, bootstrap, subscribe=topic, startingOffsets=from_zero)
             .writeStream.format("memory").queryName(topic.replace("-", "_") + "_fail")
             .option("checkpointLocation", str(tmp_path / "cp"))
             .trigger(availableNow=True).start())
    try:
        with pytest.raises(Exception, match="below the log start offset"):
            query.awaitTermination(120)
    finally:
        query.stop()


def test_fail_on_data_loss_false_skips_deleted_offsets(spark, bootstrap, aged_topic,
                                                       tmp_path):
    topic, start, end, left = aged_topic
    from_zero = f'{{"{topic}": {{"0": 0}}}}'
    rows = reader(spark, bootstrap, subscribe=topic, startingOffsets=from_zero,
                  failOnDataLoss="false").collect()
    assert rows_by_offset(rows) == left
    name = topic.replace("-", "_") + "_skip"
    query = available_now_to_memory(spark, bootstrap, name, str(tmp_path / "cp"),
                                    subscribe=topic, startingOffsets=from_zero,
                                    failOnDataLoss="false")
    assert query.exception() is None
    assert rows_by_offset(memory_rows(spark, name)) == left
    assert sorted(o for _p, o in left) == list(range(start, end))


@pytest.mark.parametrize("fail_on_data_loss", [True, False])
def test_deleted_topic(spark, bootstrap, fail_on_data_loss):
    gone, kept = unique("gone"), unique("kept")
    create_topic(bootstrap, gone, 1)
    create_topic(bootstrap, kept, 1)
    produce(bootstrap, gone, 10)
    acked = produce(bootstrap, kept, 10)
    name = gone.replace("-", "_")
    query = streaming_to_memory(spark, bootstrap, name, subscribe=f"{gone},{kept}",
                                startingOffsets="earliest",
                                failOnDataLoss=str(fail_on_data_loss).lower())
    try:
        wait_for_rows(spark, query, name, 20)
        with Admin(bootstrap) as admin:
            admin.delete_topics([gone])
        if fail_on_data_loss:
            wait_until(lambda: query.exception() is not None, 60,
                       "the query failing on the deleted topic")
            assert "no longer exist" in str(query.exception())
            assert gone in str(query.exception())
        else:
            acked.update(produce(bootstrap, kept, 15, start=10))
            rows = wait_for_rows(spark, query, name, 35)
            kept_rows = spark.sql(
                f"SELECT partition, offset, value FROM {name} WHERE topic = '{kept}'").collect()
            assert rows_by_offset(kept_rows) == acked
            assert len(rows) == 35 and query.isActive
    finally:
        query.stop()


@pytest.mark.parametrize("fail_on_data_loss", [True, False])
def test_topic_deleted_and_created_again(spark, bootstrap, fail_on_data_loss):
    """A new incarnation of a topic (a new topic id) is data loss for what
    the old one held unread; with failOnDataLoss=false the new one is read
    from its start, not from the old one's offsets."""
    topic = unique("again")
    create_topic(bootstrap, topic, 1)
    old = set(produce(bootstrap, topic, 20).values())
    name = topic.replace("-", "_")
    query = streaming_to_memory(spark, bootstrap, name, subscribe=topic,
                                startingOffsets="earliest",
                                failOnDataLoss=str(fail_on_data_loss).lower())
    try:
        wait_for_rows(spark, query, name, 20)
        with Admin(bootstrap) as admin:
            admin.delete_topics([topic])
            wait_until(lambda: topic not in admin.list_topics(), 30, f"{topic} deleted")
        create_topic(bootstrap, topic, 1)
        # Fewer records than the old topic had: offsets alone cannot tell.
        new = set(produce(bootstrap, topic, 5, start=100).values())
        if fail_on_data_loss:
            wait_until(lambda: query.exception() is not None, 60,
                       "the query failing on the recreated topic")
            # Seen as created again, or (missing for over 5 s first) as gone.
            message = str(query.exception())
            assert "created again" in message or "no longer exist" in message, message
        else:
            rows = wait_for_rows(spark, query, name, 25)
            assert sorted(bytes(r["value"]) for r in rows) == sorted(old | new)
            assert query.isActive
    finally:
        query.stop()


# -- a leader killed mid-query ------------------------------------------------------------------
def test_leader_killed_mid_query_does_not_fail_it(spark, bootstrap, cluster):
    topic = unique("ha")
    create_topic(bootstrap, topic, 2, rf=3, min_insync_replicas=2)
    name = topic.replace("-", "_")
    query = streaming_to_memory(spark, bootstrap, name, subscribe=topic,
                                startingOffsets="earliest", maxOffsetsPerTrigger="200")
    acked: dict[tuple[int, int], bytes] = {}
    errors: list[BaseException] = []
    stop, killed_event = threading.Event(), threading.Event()

    def write() -> None:
        """Paced writes until 1,000 records after the kill (at most 20,000,
        which at 1,000 records/s bounds it at 20 s)."""
        try:
            with Producer(bootstrap, acks="all", linger_ms=5) as producer:
                handles = []
                after_kill = 0
                for i in range(20_000):
                    if stop.is_set() or after_kill >= 1000:
                        break
                    after_kill += killed_event.is_set()
                    value = f"ha-{i}".encode()
                    handles.append((value, producer.send(topic, value)))
                    if i % 100 == 99:
                        time.sleep(0.1)
                producer.flush()
                for value, handle in handles:
                    meta = handle.result(timeout=60)
                    acked[(meta.partition, meta.offset)] = value
        except BaseException as exc:  # noqa: BLE001  reported by the test
            errors.append(exc)

    writer = threading.Thread(target=write)
    killed = None
    try:
        writer.start()
        wait_for_rows(spark, query, name, 300)
        with Admin(bootstrap) as admin:
            killed = admin.describe_topics([topic])[topic].partitions[0].leader
        cluster.kill(killed, signal.SIGKILL)
        killed_event.set()
        writer.join(120)
        assert not writer.is_alive(), "the producer did not finish in 120 s"
        assert not errors, f"the producer failed: {errors[0]!r}"
        assert len(acked) >= 1300  # 300 read before the kill, 1,000 sent after it
        log = log_contents(bootstrap, topic, 2)
        assert set(acked.items()) <= set(log.items()), "an acknowledged record is not in the log"
        rows = wait_for_rows(spark, query, name, len(log), timeout_s=120)
        assert rows_by_offset(rows) == log
        assert query.isActive and query.exception() is None
    finally:
        stop.set()
        query.stop()
        if killed is not None:
            cluster.start([killed])
            cluster.wait_for_brokers_running(timeout_s=30)


# -- bad options ---------------------------------------------------------------------------------
def test_bad_options_fail_when_the_query_starts(spark, bootstrap):
    query = (stream(spark, bootstrap, subscribe="t", endingOffsets="latest")
             .writeStream.format("memory").queryName("bad_end").start())
    try:
        with pytest.raises(Exception, match="endingOffsets only apply to batch"):
            query.awaitTermination(30)
    finally:
        query.stop()
    with pytest.raises(Exception, match="fixed schema"):
        (spark.read.format("kraftlog").schema("value STRING")
         .option("kraftlog.bootstrap.servers", bootstrap).option("subscribe", "t")
         .load().collect())
    with pytest.raises(Exception, match="not a Kafka client"):
        reader(spark, bootstrap, subscribe="t", **{"kafka.max.poll.records": "5"}).collect()
    with pytest.raises(Exception, match="exactly one of subscribe, subscribePattern or assign"):
        reader(spark, bootstrap, subscribe="t", assign='{"t": [0]}').collect()
    with pytest.raises(Exception, match="kraftlog.bootstrap.servers is required"):
        spark.read.format("kraftlog").option("subscribe", "t").load().collect()
    topic = unique("exists")
    create_topic(bootstrap, topic, 1)
    with pytest.raises(Exception, match=f"do not exist: {topic}-3"):
        reader(spark, bootstrap, assign=f'{{"{topic}": [0, 3]}}').collect()


# -- the example pipeline -----------------------------------------------------------------------
def test_example_pipeline_counts_every_click_of_closed_windows(spark, bootstrap, tmp_path,
                                                                capsys):
    """`make spark-example` (spark_source.example) in the shared session: the
    Parquet output holds, for every window the watermark closed, exactly the
    clicks per user that the log holds."""
    from collections import Counter

    from spark_source import example

    topic = unique("clicks")
    out, checkpoint = str(tmp_path / "out"), str(tmp_path / "cp")
    assert example.main(["--bootstrap", bootstrap, "--topic", topic, "--produce", "2000",
                         "--minutes", "3", "--out", out, "--checkpoint", checkpoint,
                         "--out-topic", topic + "-counts"], spark=spark) == 0
    printed = capsys.readouterr().out
    assert "wrote 2,000 clicks" in printed and "clicks counted" in printed
    rows = spark.read.parquet(out).selectExpr(
        "unix_millis(window_start) AS start", "unix_millis(window_end) AS end", "user",
        "clicks").collect()
    assert rows, "no window was written"
    closed_until = max(r["end"] for r in rows)
    clicks = [(r.timestamp, r.key.decode()) for r in read_log(bootstrap, topic, 3)]
    assert len(clicks) == 2000
    expected = Counter((ts - ts % 60_000, user) for ts, user in clicks if ts < closed_until)
    assert {(r["start"], r["user"]): r["clicks"] for r in rows} == dict(expected)
