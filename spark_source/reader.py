"""What one Spark task does: read one offset range, yield Arrow batches.

``read_range`` runs on an executor, in a Python worker that got the reader
pickled, so it opens its own client here (connections never cross a
pickle). It reads ``[from, until)`` of one partition with the kraftlog
``Consumer``: straight from the partition's leader, following leader
changes and retrying what a retry can cure, and only committed records
(fetches stop at the high watermark).

Rows leave as ``pyarrow.RecordBatch``es of about ``BATCH_ROWS`` records in
Spark's Kafka source schema, with no Python object per record: the consumer
hands over whole stored batches undecoded (``poll_batches``), a poll's
records sections become one set of Arrow-layout columns in one call
(``protocol.columns``, in C), and the columns become Arrow arrays without a
copy (``batches_to_arrow``). Batches the columnar decoder does not take go
through the consumer's general decoder instead, which also says what is
wrong with a corrupt one.

Data loss is what the range promised but the log no longer holds: offsets
below the log start (retention deleted them), a partition or topic that is
gone or was created again (a new topic id), or a log that ends before
``until`` (truncated). With ``failOnDataLoss`` (the default) the task fails with
``DataLossError``; otherwise it logs a warning and reads what is left.
"""

from __future__ import annotations

import gc
import logging
import time
from bisect import bisect_left
from collections.abc import Iterator
from operator import itemgetter

from spark_source.options import SourceOptions
from spark_source.planning import OffsetRange

logger = logging.getLogger(__name__)

#: Rows per Arrow batch handed to Spark, about: a poll's worth, decoded in
#: one call. Spark pays a fixed cost per batch: 2,048-row batches read at
#: 0.79 of the API's ceiling where 32,768 read at 0.84; 8,192 and 32,768
#: measured alike (0.84-0.87, medians of 8 runs each, 2026-11-26).
BATCH_ROWS = 32768
#: Ranges at least this long fetch FETCH_BYTES_MAX at a time, shorter ones less.
LARGE_RANGE_RECORDS = 131072
#: Longest single poll; the no-progress deadline is poll_timeout_ms.
POLL_MS = 500
#: Most bytes one fetch asks of a partition (ranges of few records ask less).
FETCH_BYTES_MAX = 8 * 1024 * 1024
#: Each request's deadline; the client retries within it.
REQUEST_TIMEOUT_MS = 30_000
#: While no record comes, how often a task checks its partition still exists.
EXISTS_CHECK_S = 2.0
#: A partition is gone (or its topic new) only if metadata says so this many
#: times, this far apart.
SAME_TOPIC_LOOKS = 3
SAME_TOPIC_PAUSE_S = 0.5

_offset_of = itemgetter(2)


class DataLossError(RuntimeError):
    """Records the query was to read are gone (retention, a deleted topic or
    partition, a truncated log). Raised only with failOnDataLoss=true."""


def report_data_loss(options: SourceOptions, message: str) -> None:
    """Fail the query or warn, as ``failOnDataLoss`` says."""
    if options.fail_on_data_loss:
        raise DataLossError(
            f"{message}. Some data may have been lost: it was deleted by retention, or the "
            "topic or partition was deleted or recreated. If that is acceptable, set the "
            "option failOnDataLoss=false to skip it with a warning instead")
    logger.warning("%s; skipped (failOnDataLoss=false)", message)


def arrow_schema(include_headers: bool):  # -> pa.Schema
    """The Arrow schema Spark expects for the source's rows (the Kafka
    source's columns), as Spark itself derives it."""
    from pyspark.sql.pandas.types import to_arrow_schema

    from spark_source.schema import kafka_schema
    return to_arrow_schema(kafka_schema(include_headers), timezone="UTC")


def read_range(options: SourceOptions, rng: OffsetRange, topic_id: str | None = None
               ) -> Iterator:
    """The records of ``rng`` as Arrow batches, in offset order; with
    ``topic_id``, only if the topic still has that id (a topic created again
    under the same name holds other records at the same offsets)."""
    from api.client import Consumer, KraftlogError, OffsetOutOfRangeError, TopicPartition
    from protocol.malloc import SPARK_KEEP_BYTES, keep_freed_memory

    keep_freed_memory(SPARK_KEEP_BYTES)  # each fetch's megabytes land in reused memory

    if rng.size <= 0:
        return
    schema = arrow_schema(options.include_headers)
    constants = ConstantColumns(rng.topic, rng.partition)
    tp = TopicPartition(rng.topic, rng.partition)
    name = f"{rng.topic}-{rng.partition}"
    position = rng.from_offset
    # Decoding makes millions of short-lived tuples; with the cyclic garbage
    # collector on, its passes over them cost more than the decoding itself
    # (reads ran over twice as fast without, measured ad hoc). Nothing read
    # here forms cycles worth collecting, so it is paused while the range is
    # read, then restored.
    gc_was_enabled = gc.isenabled()
    gc.disable()
    consumer = None
    # A small range fetches small: the consumer prefetches up to this much.
    fetch_bytes = FETCH_BYTES_MAX if rng.size > LARGE_RANGE_RECORDS else FETCH_BYTES_MAX // 8
    try:
        consumer = Consumer(options.bootstrap, auto_offset_reset="none",
                            isolation_level=options.isolation_level,
                            enable_auto_commit=False, include_headers=options.include_headers,
                            max_poll_records=BATCH_ROWS, max_partition_fetch_bytes=fetch_bytes,
                            max_buffered_bytes=4 * fetch_bytes, fetch_max_wait_ms=100,
                            request_timeout_ms=REQUEST_TIMEOUT_MS, **options.security)
        if not _same_topic(consumer, options, tp, topic_id, rng):
            return
        consumer.assign([tp])
        consumer.seek(tp, position)
        progress_at = checked_at = time.monotonic()
        while position < rng.until_offset:
            try:
                fetched = consumer.poll_batches(POLL_MS, BATCH_ROWS)
            except OffsetOutOfRangeError:
                position = _after_out_of_range(consumer, options, tp, name, position, rng)
                if position >= rng.until_offset:
                    return
                consumer.seek(tp, position)
                progress_at = time.monotonic()
                continue
            rows = (batches_to_arrow(fetched, schema, rng.until_offset,
                                     options.include_headers, constants) if fetched else None)
            if rows is None or not rows.num_rows:
                moved = consumer.position(tp)
                if moved > position:
                    # Past batches with nothing to return: transaction
                    # markers, and aborted records with read_committed.
                    position = moved
                    progress_at = time.monotonic()
                    continue
                now = time.monotonic()
                if now - checked_at >= EXISTS_CHECK_S:
                    # The consumer retries an unknown partition forever: ask.
                    checked_at = now
                    if not _same_topic(consumer, options, tp, topic_id,
                                       rng._replace(from_offset=position)):
                        return
                if now - progress_at > options.poll_timeout_ms / 1000:
                    _no_progress(consumer, options, tp, name, position, rng)
                    return
                continue
            progress_at = time.monotonic()
            first = rows.column(OFFSET_COLUMN)[0].as_py()
            if first > position:
                _check_gap(consumer, options, tp, name, position, first)
            yield rows
            position = max(position, fetched[-1].header.next_offset)
    except KraftlogError as exc:
        raise RuntimeError(f"reading {name} offsets {rng.from_offset} to "
                           f"{rng.until_offset - 1} from kraftlog failed: {exc}") from exc
    finally:
        if consumer is not None:
            consumer.close()
        if gc_was_enabled:
            gc.enable()


def _same_topic(consumer, options: SourceOptions, tp, topic_id: str | None,
                rng: OffsetRange) -> bool:
    """Whether the partition still exists (with ``topic_id``, if given);
    data loss if not. Only an answer given ``SAME_TOPIC_LOOKS`` times in a
    row counts (a broker may not have learned of a new topic yet); a
    metadata request that fails says nothing: True."""
    from api.client import KraftlogError

    for look in range(SAME_TOPIC_LOOKS):
        if look:
            time.sleep(SAME_TOPIC_PAUSE_S)
        try:
            topic = consumer.list_topics().get(tp.topic)
        except KraftlogError as exc:
            if exc.retriable:
                return True
            raise
        if topic is None or tp.partition not in topic.partitions:
            problem = f"{tp.topic}-{tp.partition} no longer exists"
        elif topic_id is not None and topic.topic_id not in (None, topic_id):
            problem = (f"{tp.topic} was deleted and created again (its id is now "
                       f"{topic.topic_id}, not {topic_id})")
        else:
            return True
    report_data_loss(options, f"{problem}; offsets {rng.from_offset} to "
                              f"{rng.until_offset - 1} were not read")
    return False


def _after_out_of_range(consumer, options: SourceOptions, tp, name: str, position: int,
                        rng: OffsetRange) -> int:
    """The position after ``position`` was refused as out of range: the log
    start when retention moved past it (data loss); ``until`` when the log
    now ends before ``position`` (data loss too)."""
    start = consumer.beginning_offsets([tp])[tp]
    if start > position:
        last = min(start, rng.until_offset) - 1
        report_data_loss(options, f"{name}: offsets {position} to {last} are below the log "
                                  f"start offset {start}")
        return start
    end = consumer.end_offsets([tp])[tp]
    report_data_loss(options, f"{name}: the log ends at {end}, before offset {position} the "
                              f"query was to read (up to {rng.until_offset - 1})")
    return rng.until_offset


def _no_progress(consumer, options: SourceOptions, tp, name: str, position: int,
                 rng: OffsetRange) -> None:
    """No record for ``poll_timeout_ms``: data loss if the log ends before
    ``until``, otherwise a broker that does not answer (an error)."""
    end = consumer.end_offsets([tp])[tp]
    if end < rng.until_offset:
        report_data_loss(options, f"{name}: the log ends at {end}, before the offsets "
                                  f"{max(end, position)} to {rng.until_offset - 1} the query was "
                                  "to read")
        return
    raise TimeoutError(
        f"no record of {name} from offset {position} within kafkaConsumer.pollTimeoutMs "
        f"({options.poll_timeout_ms} ms) although the high watermark is {end}; are the "
        "partition's brokers up?")


def _check_gap(consumer, options: SourceOptions, tp, name: str, position: int,
               first: int) -> None:
    """Records resumed at ``first`` instead of ``position``: lost if the log
    start moved past ``position`` meanwhile; a gap inside the log (records
    removed by compaction, transaction markers) is not loss."""
    start = consumer.beginning_offsets([tp])[tp]
    if start > position:
        report_data_loss(options, f"{name}: offsets {position} to {first - 1} were deleted "
                                  f"while reading (the log start offset is now {start})")


#: Where the offset column is in the Kafka source schema.
OFFSET_COLUMN = 4


class ConstantColumns:
    """The columns every row of a partition shares (topic, partition,
    timestamp type), made once per range and handed out as zero-copy
    slices: repeating a string per batch costs more than decoding it."""

    def __init__(self, topic: str, partition: int) -> None:
        self.topic = topic
        self.partition = partition
        self._made: dict[int, tuple] = {}
        self._rows = 0

    def get(self, count: int, timestamp_type: int) -> tuple:
        """(topic, partition, timestamp type) arrays of ``count`` rows."""
        import pyarrow as pa

        if count > self._rows:
            self._rows = max(count, 2 * self._rows, 16384)
            self._made.clear()
        made = self._made.get(timestamp_type)
        if made is None:
            made = self._made[timestamp_type] = (
                pa.repeat(pa.scalar(self.topic, pa.string()), self._rows),
                pa.repeat(pa.scalar(self.partition, pa.int32()), self._rows),
                pa.repeat(pa.scalar(timestamp_type, pa.int32()), self._rows))
        return tuple(column.slice(0, count) for column in made)


def batches_to_arrow(fetched: list, schema, until_offset: int, include_headers: bool,
                     constants: ConstantColumns | None = None):
    """Consecutive fetched stored batches of one partition (one poll's
    ``FetchedBatch`` list) -> one RecordBatch of their records in
    ``[fetched[0].position, until_offset)``, in ``schema``: every records
    section decoded into one set of columns in one call, and those wrapped
    as Arrow arrays without a copy. What the columnar decoder refuses goes
    batch by batch through the consumer's general decoder."""
    import numpy as np
    import pyarrow as pa

    from protocol import columns

    first = fetched[0]
    try:
        decoded = columns.decode_batches([(f.data, f.header) for f in fetched])
    except ValueError:
        parts = [_general(f, schema, until_offset, include_headers) for f in fetched]
        return pa.concat_batches(parts) if len(parts) > 1 else parts[0]
    cols = decoded.columns
    count = sum(decoded.counts)
    if constants is None:
        constants = ConstantColumns(first.tp.topic, first.tp.partition)
    kinds = decoded.timestamp_types
    topics, partitions, timestamp_types = constants.get(count, kinds[0])
    if kinds.count(kinds[0]) != len(kinds):  # a topic's timestamp type changed
        timestamp_types = pa.array(np.repeat(kinds, decoded.counts), pa.int32())
    offsets = np.frombuffer(cols.offsets, np.int64)
    arrays = [
        _binary(count, cols.key_validity, cols.key_offsets, cols.key_data),
        _binary(count, cols.value_validity, cols.value_offsets, cols.value_data),
        topics,
        partitions,
        pa.array(offsets, pa.int64()),
        pa.array(np.frombuffer(cols.timestamps, np.int64) * 1000, pa.int64()).view(
            schema.field("timestamp").type),
        timestamp_types,
    ]
    if include_headers:
        field = schema.field("headers").type
        arrays.append(pa.nulls(count, field) if cols.headers is None
                      else pa.array(cols.headers, field))
    out = pa.RecordBatch.from_arrays(arrays, schema=schema)
    # Offsets rise through the batches: the records asked for are one run.
    start = int(np.searchsorted(offsets, first.position))
    end = int(np.searchsorted(offsets, until_offset))
    return out if start == 0 and end == count else out.slice(start, max(end - start, 0))


def _general(fetched, schema, until_offset: int, include_headers: bool):  # -> pa.RecordBatch
    """One batch through the consumer's record-by-record decoder, which
    raises ``CorruptRecordError`` saying what is wrong with a bad one."""
    import pyarrow as pa

    from api.client.fetcher import decode_batch

    records = decode_batch(fetched.tp.topic, fetched.tp.partition, fetched.data,
                           check_crc=False, include_headers=include_headers)
    start = bisect_left(records, fetched.position, key=_offset_of)
    end = bisect_left(records, until_offset, key=_offset_of)
    if start >= end:
        return pa.RecordBatch.from_pylist([], schema=schema)
    return _to_arrow(records[start:end], include_headers, schema)


def _binary(count: int, validity: bytes | None, offsets: bytes, data: bytes):  # -> pa.Array
    import pyarrow as pa

    return pa.Array.from_buffers(
        pa.binary(), count,
        [None if validity is None else pa.py_buffer(validity), pa.py_buffer(offsets),
         pa.py_buffer(data)], null_count=0 if validity is None else -1)


def _to_arrow(records: list, include_headers: bool, schema):  # -> pa.RecordBatch
    """ConsumerRecords of one partition -> one RecordBatch in ``schema``."""
    import pyarrow as pa
    import pyarrow.compute as pc

    count = len(records)
    first = records[0]
    columns = list(zip(*records))  # topic, partition, offset, timestamp, key, value, headers, type
    timestamps_us = pc.multiply(pa.array(columns[3], pa.int64()), 1000)
    types = columns[7]
    arrays = [
        pa.array(columns[4], pa.binary()),
        pa.array(columns[5], pa.binary()),
        pa.repeat(pa.scalar(first.topic, pa.string()), count),
        pa.repeat(pa.scalar(first.partition, pa.int32()), count),
        pa.array(columns[2], pa.int64()),
        timestamps_us.cast(schema.field("timestamp").type),
        (pa.repeat(pa.scalar(types[0], pa.int32()), count) if types.count(types[0]) == count
         else pa.array(types, pa.int32())),
    ]
    if include_headers:
        # A record without headers has null there, not [] (as Spark's Kafka source).
        arrays.append(pa.array([h or None for h in columns[6]], schema.field("headers").type))
    return pa.RecordBatch.from_arrays(arrays, schema=schema)
