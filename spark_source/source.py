"""The PySpark data source ``kraftlog``: batch and streaming reads of topics.

Where each piece runs::

    driver (planning Python worker)              executors (Python workers)
    ───────────────────────────────              ──────────────────────────
    KraftlogDataSource.schema()     options
    KraftlogBatchReader.partitions() ─ ranges ─> read(OffsetRangePartition)
    KraftlogStreamReader                            = reader.read_range:
      initialOffset / latestOffset(start, limit)      Consumer -> leader,
      partitions(start, end)        ─ ranges ─>       Arrow batches

The driver only looks up partitions and offsets (``offsets.ClusterOffsets``);
the records go from each partition's leader straight to the executor that
reads the range. A streaming offset is ``{"topic": {"partition": next
offset}}``, the layout of Spark's Kafka source, kept by Spark in the query's
checkpoint: a restarted query re-plans the same ranges and reads the same
records, which is what makes an idempotent sink exactly-once.

Semantics follow Spark's Kafka source (docs/spark.md):
  - only committed records (below the high watermark) are read;
  - partitions that appear while a query runs (new topics matching the
    subscription, partitions added) are read from offset 0: from their
    start; a log start above 0 by then is data loss;
  - a partition that disappears, offsets retention deleted before they were
    read, and a log that ends before offsets already planned are data loss:
    the query fails (``failOnDataLoss=true``) or warns and goes on.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Sequence

from pyspark.sql.datasource import (DataSource, DataSourceReader, DataSourceStreamReader,
                                    DataSourceStreamWriter, DataSourceWriter, InputPartition)
from pyspark.sql.streaming.datasource import (ReadAllAvailable, ReadLimit, ReadMaxRows,
                                               ReadMinRows, SupportsTriggerAvailableNow)
from pyspark.sql.types import StructType

from spark_source.offsets import ClusterOffsets
from spark_source.options import (FORMAT, SourceOptions, TopicPartitionKey, include_headers,
                                  offsets_from_dict, offsets_to_dict, parse_options,
                                  topic_ids_from_dict)
from spark_source.planning import (OffsetRange, hold_back_batch, limit_offsets, offsets_waiting,
                                   split_ranges)
from spark_source.reader import read_range, report_data_loss
from spark_source.schema import kafka_schema

logger = logging.getLogger(__name__)

#: How long a partition must be missing from the metadata before it counts
#: as deleted (a broker that just restarted may briefly not know it).
VANISHED_GRACE_S = 5.0
#: How long a high watermark may stay below a query's position, while the
#: leader's log holds that position, before the records in between count as
#: lost (a new leader's high watermark catches up within a few fetches).
BEHIND_GRACE_S = 30.0
#: Under Trigger.AvailableNow, how often a partition in a grace period is
#: looked at again.
AVAILABLE_NOW_RECHECK_S = 0.5


class OffsetRangePartition(InputPartition):
    """One Spark task: one offset range of one topic-partition, and the id
    the topic had when the range was planned (None if unknown)."""

    def __init__(self, rng: OffsetRange, topic_id: str | None = None) -> None:
        super().__init__((*rng, topic_id))
        self.range = rng
        self.topic_id = topic_id


class KraftlogDataSource(DataSource):
    """``spark.read.format("kraftlog")`` and ``spark.readStream.format(...)``
    with the options of Spark's Kafka source, and ``df.write`` /
    ``df.writeStream`` ``.format("kraftlog")`` with its sink's
    (``spark_source.sink``). Register it once per session with
    ``spark_source.register(spark)``."""

    @classmethod
    def name(cls) -> str:
        return FORMAT

    def schema(self) -> StructType:
        return kafka_schema(include_headers(self.options))

    def reader(self, schema: StructType) -> "KraftlogBatchReader":
        options = parse_options(self.options, streaming=False)
        _check_schema(schema, options)
        return KraftlogBatchReader(options)

    def streamReader(self, schema: StructType) -> "KraftlogStreamReader":
        options = parse_options(self.options, streaming=True)
        _check_schema(schema, options)
        return KraftlogStreamReader(options)

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        from spark_source.sink import KraftlogBatchWriter
        from spark_source.sink_options import check_sink_schema, parse_sink_options

        if overwrite:
            raise ValueError("Save mode Overwrite not allowed for kraftlog: a topic is "
                             "appended to, never replaced. Use mode('append')")
        options = parse_sink_options(self.options)
        check_sink_schema(schema, options)
        return KraftlogBatchWriter(options)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        # Complete and update output modes append every row they emit, as
        # Spark's Kafka sink does.
        from spark_source.sink import KraftlogStreamWriter
        from spark_source.sink_options import check_sink_schema, parse_sink_options

        options = parse_sink_options(self.options)
        check_sink_schema(schema, options)
        return KraftlogStreamWriter(options)


def _check_schema(schema: StructType, options: SourceOptions) -> None:
    """The rows always have the Kafka source's schema; a user-given one
    (``.schema(...)``) is refused, as by the Kafka source."""
    if schema != kafka_schema(options.include_headers):
        raise ValueError(
            "format('kraftlog') has a fixed schema (the Kafka source's: key, value, topic, "
            "partition, offset, timestamp, timestampType[, headers]); remove .schema(...) "
            "and cast or parse the columns after load()")


def _plan(options: SourceOptions, start: dict[TopicPartitionKey, int],
          end: dict[TopicPartitionKey, int], topic_ids: dict[str, str]
          ) -> list[OffsetRangePartition]:
    ranges = [OffsetRange(topic, partition, start.get((topic, partition), 0), until)
              for (topic, partition), until in end.items()]
    return [OffsetRangePartition(r, topic_ids.get(r.topic)) for r in split_ranges(
        ranges, options.min_partitions, options.max_records_per_partition)]


class KraftlogBatchReader(DataSourceReader):
    """A batch query: the ranges between the starting and ending offsets,
    resolved once, when the query is planned."""

    def __init__(self, options: SourceOptions) -> None:
        self.options = options

    def partitions(self) -> Sequence[InputPartition]:
        cluster = ClusterOffsets(self.options)
        ending = self.options.ending
        assert ending is not None
        try:
            tps = cluster.partitions()
            _require_assigned(self.options, tps)
            start = cluster.resolve(self.options.starting, tps)
            end = cluster.resolve(ending, tps, ending=True)
            # Offsets the user gave must exist; "latest" is the end by definition.
            given = {tp for tp, o in (ending.offsets or {}).items()
                     if ending.kind == "offsets" and o >= 0}
            high_watermarks = cluster.latest(given)
            topic_ids = dict(cluster.topic_ids)
        finally:
            cluster.close()
        for tp in sorted(tps):
            if tp in given and end[tp] > high_watermarks[tp]:
                raise ValueError(
                    f"endingOffsets for {tp[0]}-{tp[1]} is {end[tp]}, after the end of its "
                    f"committed records ({high_watermarks[tp]}): use latest or an offset up to "
                    "the high watermark")
            if start[tp] > end[tp]:
                raise ValueError(
                    f"the starting offset of {tp[0]}-{tp[1]} ({start[tp]}) is after its ending "
                    f"offset ({end[tp]})")
        planned = _plan(self.options, start, end, topic_ids)
        logger.info("kraftlog batch read of %s: %d partitions, %d records in %d tasks",
                    self.options.subscription.describe(), len(tps),
                    sum(p.range.size for p in planned), len(planned))
        return planned

    def read(self, partition: InputPartition) -> Iterator:
        return _read(self.options, partition)


def _read(options: SourceOptions, partition: InputPartition) -> Iterator:
    # Spark plans one InputPartition(None) when a batch query has no range.
    if not isinstance(partition, OffsetRangePartition):
        return iter(())
    return read_range(options, partition.range, partition.topic_id)


def _require_assigned(options: SourceOptions, tps: set[TopicPartitionKey]) -> None:
    """Assigned partitions must exist when a query starts (``tps``: those
    of the subscription that do)."""
    if options.subscription.partitions is None:
        return
    missing = sorted(set(options.subscription.partitions) - tps)
    if missing:
        raise ValueError(
            f"assign names partitions that do not exist: "
            f"{', '.join(f'{t}-{p}' for t, p in missing)}")


class KraftlogStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """A streaming query. Offsets are planned on the driver: each micro-batch
    reads from the previous end to the high watermarks (at most
    ``maxOffsetsPerTrigger`` records), or, under ``Trigger.AvailableNow``,
    to the high watermarks seen when the query started. Under
    ``minOffsetsPerTrigger`` a trigger with fewer offsets waiting plans no
    batch, until ``maxTriggerDelay`` has passed (not under AvailableNow).

    Each offset carries the ids of its topics (``offsets_to_dict``), so a
    query restarted from its checkpoint notices a topic deleted and created
    again while it was stopped, as a running query does."""

    def __init__(self, options: SourceOptions) -> None:
        self.options = options
        self._cluster: ClusterOffsets | None = None
        #: Under Trigger.AvailableNow: the offsets to stop at.
        self._target: dict[TopicPartitionKey, int] | None = None
        #: Since when (monotonic s) each partition's high watermark has been
        #: below the query's position, and each partition of the position
        #: has been missing from the metadata (see ``_available``).
        self._behind_since: dict[TopicPartitionKey, float] = {}
        self._vanished_since: dict[TopicPartitionKey, float] = {}
        #: The high watermarks the last latestOffset saw.
        self._last_latest: dict[TopicPartitionKey, int] | None = None
        #: Every id each topic read has had while this run of the query ran,
        #: and the ids in the checkpoint it was restarted from.
        self._topic_ids: dict[str, set[str]] = {}
        #: Per topic the id of the incarnation the query's offsets refer to
        #: (written into each offset). Invariant: in ``_topic_ids[topic]``.
        self._current_ids: dict[str, str] = {}
        #: minOffsetsPerTrigger: when (monotonic ms) the last trigger that
        #: was not held back ran; None before the first.
        self._last_admitted_ms: int | None = None

    def __getstate__(self) -> dict:
        # Executors get the reader pickled; the driver's client stays here.
        state = self.__dict__.copy()
        state["_cluster"] = None
        return state

    @property
    def cluster(self) -> ClusterOffsets:
        if self._cluster is None:
            self._cluster = ClusterOffsets(self.options)
        return self._cluster

    def initialOffset(self) -> dict:
        tps = self.cluster.partitions()
        _require_assigned(self.options, tps)
        self._remember_topic_ids(self.cluster.topic_ids)
        start = self.cluster.resolve(self.options.starting, tps)
        logger.info("kraftlog stream of %s starts at %s", self.options.subscription.describe(),
                    start)
        return offsets_to_dict(start, self._current_ids)

    def getDefaultReadLimit(self) -> ReadLimit:
        """ReadMaxRows under maxOffsetsPerTrigger, else ReadMinRows under
        minOffsetsPerTrigger. Python sources have no composite limit, so
        with both options the minimum comes from the options (``_min_offsets``);
        Spark hands the limit back to ``latestOffset`` unchanged, or
        ReadAllAvailable when a trigger wants everything (Trigger.Once)."""
        if self.options.max_offsets_per_trigger is not None:
            return ReadMaxRows(self.options.max_offsets_per_trigger)
        if self.options.min_offsets_per_trigger is not None:
            return ReadMinRows(self.options.min_offsets_per_trigger)
        return super().getDefaultReadLimit()

    def prepareForTriggerAvailableNow(self) -> None:
        tps = self.cluster.partitions()
        self._target = self.cluster.latest(tps)
        logger.info("kraftlog Trigger.AvailableNow: reading up to %s", self._target)

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        begin = offsets_from_dict(start)
        # After a restart, the ids in the checkpoint are what the offsets
        # refer to: a topic with another id now was created again meanwhile.
        self._remember_topic_ids(topic_ids_from_dict(start))
        available, pending = self._available(begin)
        # Trigger.AvailableNow ends when nothing moves: a partition still in
        # a grace period would end the run unexamined, so wait it out here.
        deadline = time.monotonic() + max(VANISHED_GRACE_S, BEHIND_GRACE_S) + 1
        while pending and self._target is not None and time.monotonic() < deadline:
            time.sleep(AVAILABLE_NOW_RECHECK_S)
            available, pending = self._available(begin)
        if self._hold_back(begin, available, limit):
            return start  # the same offset: Spark plans no batch this trigger
        if isinstance(limit, ReadMaxRows):
            available = limit_offsets(begin, available, limit.max_rows)
        return offsets_to_dict(available, self._current_ids)

    def _min_offsets(self, limit: ReadLimit) -> int | None:
        """The minimum offsets a batch waits for, None when it never waits:
        under Trigger.AvailableNow (the run must reach its target and end)
        and when Spark asks for everything available."""
        if self._target is not None or isinstance(limit, ReadAllAvailable):
            return None
        if isinstance(limit, ReadMinRows):
            return limit.min_rows
        return self.options.min_offsets_per_trigger

    def _hold_back(self, begin: dict[TopicPartitionKey, int],
                   available: dict[TopicPartitionKey, int], limit: ReadLimit) -> bool:
        """Whether this trigger plans no batch, waiting for
        minOffsetsPerTrigger (``planning.hold_back_batch``). An offset that
        is not only new records (a partition gone, or moved back after data
        loss) is never held back: the batch that records it runs now."""
        min_offsets = self._min_offsets(limit)
        if min_offsets is None:
            return False
        if any(tp not in available or available[tp] < offset for tp, offset in begin.items()):
            return False
        now_ms = int(time.monotonic() * 1000)
        if hold_back_batch(offsets_waiting(begin, available), min_offsets,
                           self.options.max_trigger_delay_ms, now_ms, self._last_admitted_ms):
            return True
        self._last_admitted_ms = now_ms
        return False

    def _remember_topic_ids(self, topic_ids: dict[str, str]) -> None:
        """Ids the query's offsets refer to (from the cluster when the query
        starts, from the checkpoint when it restarts): seen, and current for
        a topic that has no current id yet."""
        for topic, topic_id in topic_ids.items():
            self._topic_ids.setdefault(topic, set()).add(topic_id)
            self._current_ids.setdefault(topic, topic_id)

    def reportLatestOffset(self) -> dict | None:
        # What the last latestOffset saw (asking again would double the
        # driver's lookups per trigger).
        return None if self._last_latest is None else offsets_to_dict(self._last_latest)

    def _available(self, begin: dict[TopicPartitionKey, int]
                   ) -> tuple[dict[TopicPartitionKey, int], bool]:
        """Per partition the offset up to which records may be read now (the
        high watermark, capped by the AvailableNow target), and whether some
        partition is in a grace period.

        Two observations may be passing, so each must last before it counts
        as data loss, and meanwhile the partition stays at its offset: a
        partition of ``begin`` missing from the metadata
        (``VANISHED_GRACE_S``: one stale answer) and a high watermark below
        the query's position while the leader's log still holds that
        position (``BEHIND_GRACE_S``: a new leader's high watermark catching
        up). A log that ends below the position (truncated) and a topic with
        a new id (created again) are data loss at once.
        """
        tps = self.cluster.partitions()
        latest = self.cluster.latest_of_existing(tps)
        self._last_latest = dict(latest)
        now = time.monotonic()
        ends, gone = {}, []
        for tp in sorted(set(begin) - set(latest)):
            if now - self._vanished_since.setdefault(tp, now) < VANISHED_GRACE_S:
                ends[tp] = begin[tp]
            else:
                gone.append(tp)
        for tp in [tp for tp in self._vanished_since if tp in latest or tp not in begin]:
            del self._vanished_since[tp]
        pending = bool(ends)
        if gone:
            for tp in gone:
                del self._vanished_since[tp]
            report_data_loss(self.options, "partition(s) "
                             + ", ".join(f"{t}-{p} (at offset {begin[(t, p)]})" for t, p in gone)
                             + " no longer exist")
        recreated = self._recreated_topics({tp[0] for tp in begin})
        for tp, hw in latest.items():
            offset = begin.get(tp, 0)
            if tp[0] in recreated:
                self._behind_since.pop(tp, None)
                if self._target is not None:
                    self._target[tp] = hw
                if tp in begin:
                    # failOnDataLoss=false: read the new topic from its start
                    # (an end below the start plans nothing; the next batch
                    # starts at 0).
                    ends[tp] = 0
                    continue
            if hw < offset:
                end = self._behind(tp, offset, hw, now)
                ends[tp] = end
                pending = pending or end == offset
                continue
            self._behind_since.pop(tp, None)
            if self._target is None:
                ends[tp] = hw
            elif tp in self._target:
                # Nothing past the target, and never behind the position.
                ends[tp] = max(offset, min(hw, self._target[tp]))
            elif tp in begin:
                ends[tp] = offset
            # else: appeared after the AvailableNow target: left for a later run.
        return ends, pending

    def _behind(self, tp: TopicPartitionKey, offset: int, hw: int, now: float) -> int:
        """The end for a partition whose high watermark ``hw`` is below the
        query's position ``offset``: ``offset`` (wait) while the leader's log
        holds the position, for up to ``BEHIND_GRACE_S``; otherwise data
        loss, and with failOnDataLoss=false the new end ``hw``."""
        since = self._behind_since.setdefault(tp, now)
        truncated = self.cluster.beyond_log_end(tp, offset)
        if not truncated and now - since < BEHIND_GRACE_S:
            return offset
        if truncated and self._has_new_topic_id(tp[0]):
            # The metadata this round was planned on predates the topic's
            # new incarnation (its leader already answered for the new one):
            # the next round sees it created again and says so.
            return offset
        del self._behind_since[tp]
        report_data_loss(self.options, f"{tp[0]}-{tp[1]}: the log ends at {hw}, before "
                                       f"offset {offset} the query had reached")
        return hw

    def _has_new_topic_id(self, topic: str) -> bool:
        """Whether fresh metadata names ``topic`` with an id this run has
        not seen (it was created again)."""
        self.cluster.partitions()
        topic_id = self.cluster.topic_ids.get(topic)
        seen = self._topic_ids.get(topic, set())
        return topic_id is not None and bool(seen) and topic_id not in seen

    def _recreated_topics(self, reading: set[str]) -> set[str]:
        """Topics of ``reading`` with an id this run has not seen before (in
        the cluster or in the checkpoint it restarted from): deleted and
        created again, so the records not yet read went with the old topic
        (data loss), and the new one is read from its start. Every id ever
        seen is kept, so a stale answer with an older id is not taken for
        yet another incarnation. A new id becomes the topic's current one."""
        recreated = {}
        for topic, topic_id in self.cluster.topic_ids.items():
            seen = self._topic_ids.setdefault(topic, set())
            if not seen or topic_id not in seen:
                if seen and topic in reading:
                    recreated[topic] = self._current_ids.get(topic)
                self._current_ids[topic] = topic_id
            seen.add(topic_id)
        if recreated:
            report_data_loss(self.options, "topic(s) " + ", ".join(
                f"{topic} (id {old} in the query's offsets, now {self._current_ids[topic]})"
                for topic, old in sorted(recreated.items()))
                + " were deleted and created again since the query read them (while it ran, "
                "or while it was stopped); records of the old topic not yet read are gone "
                "and the new topic is read from its start")
        return set(recreated)

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        begin = offsets_from_dict(start)
        until = offsets_from_dict(end)
        # A partition whose end fell below its start (failOnDataLoss=false
        # after truncation) reads nothing; the next batch starts at its end.
        if not self.cluster.topic_ids:  # re-planning a batch right after a restart
            self.cluster.partitions()
        # Tasks check the ids the batch was planned with (kept in its end
        # offset): a batch re-planned after a restart must not read a topic
        # created again meanwhile. Offsets without ids: the ids now.
        topic_ids = {**self.cluster.topic_ids, **topic_ids_from_dict(end)}
        return _plan(self.options, begin,
                     {tp: u for tp, u in until.items() if u >= begin.get(tp, 0)}, topic_ids)

    def read(self, partition: InputPartition) -> Iterator:
        return _read(self.options, partition)

    def commit(self, end: dict) -> None:
        """Nothing to do: the offsets live in Spark's checkpoint."""

    def stop(self) -> None:
        if self._cluster is not None:
            self._cluster.close()
            self._cluster = None
