"""Streaming admission and restarts: minOffsetsPerTrigger/maxTriggerDelay and
topic ids kept in the checkpoint.

  - the stream reader's reading of Spark's ReadLimit (no SparkSession: the
    pure rule itself is tested in tests/unit/test_spark_planning.py);
  - in a real SparkSession against real brokers: a micro-batch waits for
    minOffsetsPerTrigger offsets (the source reports them available while
    no batch runs), then runs once they are there; with fewer, it runs when
    maxTriggerDelay has passed; Trigger.AvailableNow is never held back;
  - a query stopped, its topic deleted and created again, then restarted
    from the same checkpoint: data loss, failing the query or (with
    failOnDataLoss=false) reading the new topic from its start.

Waits poll a condition with a deadline; none sleeps and hopes.
"""

from __future__ import annotations

import glob
import json
import os

import pytest
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows, ReadMinRows

from api.client import Admin, Producer
from chaos.cluster import wait_until
from spark_source.options import TOPIC_IDS_KEY, parse_options
from spark_source.source import KraftlogStreamReader
from tests.spark.test_source import (available_now_to_memory, create_topic, memory_rows, produce,
                                     rows_by_offset, stream, unique, wait_for_rows)

pytestmark = pytest.mark.slow


# -- the ReadLimit Spark hands back (no SparkSession) -------------------------------------------
def stream_reader(**options: str) -> KraftlogStreamReader:
    return KraftlogStreamReader(parse_options(
        {"kraftlog.bootstrap.servers": "http://127.0.0.1:1", "subscribe": "t", **options},
        streaming=True))


TP = ("t", 0)


def test_default_read_limit_follows_the_options():
    assert stream_reader().getDefaultReadLimit() == ReadAllAvailable()
    assert stream_reader(minOffsetsPerTrigger="7").getDefaultReadLimit() == ReadMinRows(7)
    # No composite limit for Python sources: the maximum goes to Spark, the
    # minimum is taken from the options.
    both = stream_reader(minOffsetsPerTrigger="7", maxOffsetsPerTrigger="9")
    assert both.getDefaultReadLimit() == ReadMaxRows(9)


def test_a_trigger_below_the_minimum_is_held_back_until_the_delay():
    reader = stream_reader(minOffsetsPerTrigger="10", maxTriggerDelay="1h")
    limit = reader.getDefaultReadLimit()
    assert not reader._hold_back({TP: 0}, {TP: 3}, limit)  # the first trigger: admitted
    assert reader._hold_back({TP: 0}, {TP: 3}, limit)
    assert not reader._hold_back({TP: 0}, {TP: 10}, limit)
    reader._last_admitted_ms -= 3_600_000  # an hour later
    assert not reader._hold_back({TP: 0}, {TP: 3}, limit)
    # With maxOffsetsPerTrigger too, Spark hands back ReadMaxRows: the
    # minimum still applies.
    both = stream_reader(minOffsetsPerTrigger="10", maxOffsetsPerTrigger="20")
    assert not both._hold_back({TP: 0}, {TP: 3}, both.getDefaultReadLimit())
    assert both._hold_back({TP: 0}, {TP: 3}, both.getDefaultReadLimit())


def test_nothing_is_held_back_under_available_now_or_read_all_available():
    reader = stream_reader(minOffsetsPerTrigger="10")
    assert not reader._hold_back({TP: 0}, {TP: 0}, ReadMinRows(10))  # first: admitted
    assert not reader._hold_back({TP: 0}, {TP: 3}, ReadAllAvailable())  # Trigger.Once
    assert reader._hold_back({TP: 0}, {TP: 3}, ReadMinRows(10))
    reader._target = {TP: 3}  # prepareForTriggerAvailableNow ran
    assert not reader._hold_back({TP: 0}, {TP: 3}, ReadMinRows(10))


def test_data_loss_is_never_held_back():
    reader = stream_reader(minOffsetsPerTrigger="10", maxTriggerDelay="1h")
    limit = reader.getDefaultReadLimit()
    assert not reader._hold_back({TP: 5}, {TP: 5}, limit)  # the first trigger
    assert reader._hold_back({TP: 5}, {TP: 6}, limit)
    assert not reader._hold_back({TP: 5}, {TP: 0}, limit)  # moved back (created again)
    assert not reader._hold_back({TP: 5, ("t", 1): 2}, {TP: 6}, limit)  # t-1 gone


def test_ids_from_the_checkpoint_reveal_a_topic_created_again():
    from types import SimpleNamespace

    from spark_source.reader import DataLossError
    strict = stream_reader()
    strict._remember_topic_ids({"t": "old"})  # what a restarted query's start offset holds
    strict._cluster = SimpleNamespace(topic_ids={"t": "new"})  # what the cluster says now
    with pytest.raises(DataLossError, match="t [(]id old in the query's offsets, now new[)]"):
        strict._recreated_topics({"t"})

    lenient = stream_reader(failOnDataLoss="false")
    lenient._remember_topic_ids({"t": "old"})
    lenient._cluster = SimpleNamespace(topic_ids={"t": "new"})
    assert lenient._recreated_topics({"t"}) == {"t"}
    assert lenient._current_ids == {"t": "new"}  # the next offsets name the new topic
    lenient._cluster.topic_ids = {"t": "old"}  # a stale answer is no third incarnation
    assert lenient._recreated_topics({"t"}) == set()
    assert lenient._current_ids == {"t": "new"}
    # An offset without ids (an older checkpoint): the id now is taken as is.
    old_checkpoint = stream_reader()
    old_checkpoint._remember_topic_ids({})
    old_checkpoint._cluster = SimpleNamespace(topic_ids={"t": "now"})
    assert old_checkpoint._recreated_topics({"t"}) == set()
    assert old_checkpoint._current_ids == {"t": "now"}


# -- minOffsetsPerTrigger and maxTriggerDelay in a real query ----------------------------------
@pytest.fixture
def progress_every_trigger(spark):
    """Progress events also for triggers that run no batch (Spark reports
    those every 10 s by default): read when a query starts."""
    key = "spark.sql.streaming.noDataProgressEventInterval"
    before = spark.conf.get(key, None)
    spark.conf.set(key, "50ms")
    yield
    if before is None:
        spark.conf.unset(key)
    else:
        spark.conf.set(key, before)


def available_offsets(progress: dict) -> int:
    """The offsets the source reported available (its latestOffset) in a
    progress event, summed over partitions."""
    latest = progress["sources"][0].get("latestOffset")
    if not latest:
        return 0
    nested = json.loads(latest) if isinstance(latest, str) else latest
    return sum(offset for topic, partitions in nested.items() if topic != TOPIC_IDS_KEY
               for offset in partitions.values())


def batch_sizes(query) -> list[int]:
    return [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]


def produce_at_once(bootstrap: str, topic: str, count: int, start: int) -> None:
    """``count`` records in one batch to partition 0: they become visible
    together."""
    with Producer(bootstrap, linger_ms=1000) as producer:
        handles = [producer.send(topic, f"{topic}-v{i}".encode(), partition=0)
                   for i in range(start, start + count)]
        producer.flush()
        for handle in handles:
            handle.result(timeout=30)


def test_a_batch_waits_for_min_offsets_per_trigger(spark, bootstrap, progress_every_trigger):
    topic = unique("minoffsets")
    create_topic(bootstrap, topic, 2)
    name = topic.replace("-", "_")
    query = (stream(spark, bootstrap, subscribe=topic, startingOffsets="earliest",
                    minOffsetsPerTrigger="30", maxTriggerDelay="1h")
             .writeStream.format("memory").queryName(name)
             .trigger(processingTime="100 milliseconds").start())
    try:
        wait_until(lambda: len(query.recentProgress) > 0, 60, "the query's first trigger")
        produce_at_once(bootstrap, topic, 10, start=0)
        # The source sees the 10 offsets and holds every trigger back.
        wait_until(lambda: any(available_offsets(p) == 10 for p in query.recentProgress), 60,
                   "a trigger that saw 10 offsets available")
        assert query.exception() is None
        assert batch_sizes(query) == [] and memory_rows(spark, name) == []
        seen_at = len(query.recentProgress)
        wait_until(lambda: len(query.recentProgress) >= seen_at + 3, 60,
                   "three more triggers")
        assert batch_sizes(query) == [] and memory_rows(spark, name) == []
        produce_at_once(bootstrap, topic, 25, start=10)
        rows = wait_for_rows(spark, query, name, 35)
        assert len(rows) == 35
        # The sink's rows show before the batch's progress is posted.
        wait_until(lambda: batch_sizes(query), 60, "the batch's progress")
        assert batch_sizes(query) == [35]  # one batch, once 30 were there
    finally:
        query.stop()


def test_max_trigger_delay_runs_a_batch_below_the_minimum(spark, bootstrap,
                                                          progress_every_trigger):
    delay_ms = 6000
    topic = unique("maxdelay")
    create_topic(bootstrap, topic, 1)
    acked = produce(bootstrap, topic, 5)
    name = topic.replace("-", "_")
    query = (stream(spark, bootstrap, subscribe=topic, startingOffsets="earliest",
                    minOffsetsPerTrigger="1000", maxTriggerDelay=f"{delay_ms}ms")
             .writeStream.format("memory").queryName(name)
             .trigger(processingTime="100 milliseconds").start())
    try:
        # The first trigger of a run is never held back: the 5 are read.
        wait_for_rows(spark, query, name, 5)
        acked.update(produce(bootstrap, topic, 3, start=5))
        rows = wait_for_rows(spark, query, name, 8, timeout_s=60)
        assert rows_by_offset(rows) == acked
        # The sink holds a batch's rows a moment before its progress is out.
        wait_until(lambda: sum(p["numInputRows"] for p in query.recentProgress) >= 8, 30,
                   "the second batch's progress")
        progress = list(query.recentProgress)
        batches = [p for p in progress if p["numInputRows"]]
        assert [p["numInputRows"] for p in batches] == [5, 3]
        first, second = (_epoch_ms(p["timestamp"]) for p in batches)
        # Admitted no earlier than maxTriggerDelay after the first batch was
        # (a trigger starts a little before its admission check).
        assert second - first >= delay_ms - 1000, (first, second)
        held = [p for p in progress if not p["numInputRows"] and available_offsets(p) == 8]
        assert held, "no trigger reported the 3 records available and held them back"
    finally:
        query.stop()


def _epoch_ms(timestamp: str) -> int:
    from datetime import datetime
    return int(datetime.fromisoformat(timestamp.replace("Z", "+00:00")).timestamp() * 1000)


def test_available_now_is_not_held_back_by_min_offsets(spark, bootstrap, tmp_path):
    topic = unique("availmin")
    create_topic(bootstrap, topic, 2)
    acked = produce(bootstrap, topic, 40)
    name = topic.replace("-", "_")
    query = available_now_to_memory(spark, bootstrap, name, str(tmp_path / "cp"),
                                    subscribe=topic, startingOffsets="earliest",
                                    minOffsetsPerTrigger="1000", maxTriggerDelay="1h",
                                    maxOffsetsPerTrigger="1000")
    assert query.exception() is None
    assert rows_by_offset(memory_rows(spark, name)) == acked


# -- a topic created again while the query was stopped ------------------------------------------
def last_checkpoint_offset(checkpoint: str) -> dict:
    """The source's offset in the newest file of the checkpoint's offset log
    (a version line, the batch metadata, then one line per source)."""
    directory = os.path.join(checkpoint, "offsets")
    newest = max((f for f in os.listdir(directory) if f.isdigit()), key=int)
    with open(os.path.join(directory, newest)) as log:
        return json.loads(log.read().splitlines()[2])


@pytest.mark.parametrize("fail_on_data_loss", [True, False])
def test_topic_created_again_while_the_query_was_stopped(spark, bootstrap, tmp_path,
                                                         fail_on_data_loss):
    topic = unique("stopped")
    create_topic(bootstrap, topic, 1)
    produce(bootstrap, topic, 20)
    checkpoint = str(tmp_path / "cp")

    def start(out: str):
        # A file sink: the memory sink cannot restart from a checkpoint.
        return (stream(spark, bootstrap, subscribe=topic, startingOffsets="earliest",
                       failOnDataLoss=str(fail_on_data_loss).lower())
                .selectExpr("partition", "offset", "value")
                .writeStream.format("parquet").option("path", out)
                .option("checkpointLocation", checkpoint)
                .trigger(processingTime="100 milliseconds").start())

    def written(out: str) -> list:
        # The files themselves: the second run's sink log starts at a later
        # batch id, which Spark's reader of the log refuses.
        files = glob.glob(os.path.join(out, "*.parquet"))
        return spark.read.parquet(*files).collect() if files else []

    first = start(str(tmp_path / "out1"))
    try:
        wait_until(lambda: len(written(str(tmp_path / "out1"))) == 20, 60, "the 20 records")
    finally:
        first.stop()
    assert first.exception() is None
    offset = last_checkpoint_offset(checkpoint)
    assert offset[topic] == {"0": 20}
    old_id = offset[TOPIC_IDS_KEY][topic]

    with Admin(bootstrap) as admin:
        admin.delete_topics([topic])
        wait_until(lambda: topic not in admin.list_topics(), 30, f"{topic} deleted")
    create_topic(bootstrap, topic, 1)
    # Fewer records than the query read: offsets alone cannot tell.
    new = produce(bootstrap, topic, 5, start=100)

    # The second run writes elsewhere, to tell its rows from the first's.
    out = str(tmp_path / "out2")
    second = start(out)
    try:
        if fail_on_data_loss:
            wait_until(lambda: second.exception() is not None, 60,
                       "the restarted query failing on the recreated topic")
            message = str(second.exception())
            assert "created again" in message and topic in message, message
            assert old_id in message and "failOnDataLoss=false" in message, message
        else:
            def five() -> bool:
                assert second.exception() is None, second.exception()
                return len(written(out)) >= 5
            wait_until(five, 60, "the 5 records of the new topic")
            assert rows_by_offset(written(out)) == new  # the new topic, from offset 0
            assert second.isActive
            wait_until(lambda: last_checkpoint_offset(checkpoint)[TOPIC_IDS_KEY][topic]
                       != old_id, 30, "the checkpoint taking the new topic id")
            assert last_checkpoint_offset(checkpoint)[topic] == {"0": 5}
    finally:
        second.stop()
