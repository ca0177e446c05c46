"""The sink: ``df.write.format("kraftlog")`` and ``df.writeStream.format(...)``.

Where each piece runs::

    executors (one Spark task per partition of the rows)   driver
    ────────────────────────────────────────────────────   ──────────────────────────
    write(Arrow batches) = write_task:                      commit(messages[, batch id])
      [exactly once: begin_task, init_transactions,           = commit.commit_batch
       begin_transaction]                                       (streaming) or commit
      rows -> Producer.send (murmur2 partition by key)          every prepared transaction
      [prepare_transaction] -> KraftlogCommitMessage          abort(messages): abort them

Spark hands a Python writer the rows as Arrow record batches. Without a
``headers`` column (the common case) no row becomes a Python object: keys
are hashed to partitions with Kafka's murmur2 over the whole column, the
rows are grouped by partition, and each group is encoded into whole batches
(up to ``batch.size`` bytes) in C (``protocol.columns``) and handed to the
producer as such (``Producer.send_encoded``). Rows with headers go one
``Producer.send`` each.

With ``exactlyOnce`` (the default) every task writes in a transaction it
leaves prepared, and the driver commits them (``spark_source.commit``):

- streaming: exactly once across driver and executor crashes, a replayed
  batch is not written again (KIP-939 two-phase transactions, the decision
  in the sink's registry);
- batch: all or nothing per job, unless the driver dies while committing
  (some tasks' transactions committed, the rest aborted by their timeout).

With ``exactlyOnce=false`` tasks write with an idempotent producer and
nothing is held back: at least once, as Spark's Kafka sink.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import repeat
from typing import Any

from pyspark.sql.datasource import (DataSourceArrowWriter, DataSourceStreamArrowWriter,
                                    WriterCommitMessage)

from spark_source.sink_options import SinkOptions

logger = logging.getLogger(__name__)

#: A streaming task's transaction is never aborted on a timeout (two-phase),
#: but the coordinator wants one; a batch job's are aborted after this if
#: the driver never commits them (it died).
STREAM_TXN_TIMEOUT_MS = 60_000
BATCH_TXN_TIMEOUT_MS = 900_000
#: The producer's settings unless ``kafka.*`` options say otherwise: large
#: batches, a short linger.
PRODUCER_DEFAULTS = {"acks": "all", "linger_ms": 5, "batch_size": 1024 * 1024}
#: Spark's local property naming the micro-batch (set on every task).
BATCH_ID_PROPERTY = "streaming.sql.batchId"
QUERY_ID_PROPERTY = "sql.streaming.queryId"


@dataclass
class KraftlogCommitMessage(WriterCommitMessage):
    """What one task tells the driver."""

    task: int
    rows: int
    #: The transactions' prefix (exactly once), so the driver knows it.
    prefix: str | None = None
    #: The task's prepared transaction; None: nothing written in one.
    prepared: Any = None
    #: The batch was decided before a restart: nothing written.
    skipped: bool = False


class SinkWriteError(RuntimeError):
    """Rows could not be written; the message says why and what to do."""


def _run(coro: Any) -> Any:
    return asyncio.run(coro)


async def _with_admin(options: SinkOptions, fn: Any) -> Any:
    from api.client.admin import AsyncAdmin

    admin = AsyncAdmin(options.bootstrap, **options.security)
    try:
        return await fn(admin)
    finally:
        await admin.close()


class KraftlogBatchWriter(DataSourceArrowWriter):
    """``df.write.format("kraftlog")``: one task per partition of ``df``;
    with exactlyOnce, the job's transactions are committed together."""

    def __init__(self, options: SinkOptions) -> None:
        self.options = options
        # One prefix per job (this object is made once, on the driver).
        self.prefix = (f"{options.transactional_id_prefix or 'kraftlog-spark'}-"
                       f"{uuid.uuid4().hex[:12]}") if options.exactly_once else None

    def write(self, iterator: Iterator) -> KraftlogCommitMessage:
        from pyspark import TaskContext

        task = TaskContext.get().partitionId()
        return write_task(self.options, iterator, task, self.prefix, two_phase=False)

    def commit(self, messages: list) -> None:
        prepared = [m.prepared for m in messages if m is not None and m.prepared is not None]
        rows = sum(m.rows for m in messages if m is not None)
        if prepared:
            from spark_source.commit import complete_all
            _run(_with_admin(self.options, lambda a: complete_all(a, prepared, commit=True)))
        logger.info("kraftlog batch write committed: %d rows, %d transactions", rows,
                    len(prepared))

    def abort(self, messages: list) -> None:
        _abort(self.options, self.prefix, messages, sweep=True)


class KraftlogStreamWriter(DataSourceStreamArrowWriter):
    """``df.writeStream.format("kraftlog")``: each micro-batch's tasks
    prepare, the driver's ``commit`` decides (``spark_source.commit``)."""

    def __init__(self, options: SinkOptions) -> None:
        # Spark makes one per micro-batch, twice (to plan the tasks and to
        # commit): nothing here may do I/O.
        self.options = options

    def write(self, iterator: Iterator) -> KraftlogCommitMessage:
        from pyspark import TaskContext

        context = TaskContext.get()
        task = context.partitionId()
        if not self.options.exactly_once:
            return write_task(self.options, iterator, task, None, two_phase=False)
        batch_id = int(context.getLocalProperty(BATCH_ID_PROPERTY))
        prefix = self.options.transactional_id_prefix or \
            f"kraftlog-sink-{context.getLocalProperty(QUERY_ID_PROPERTY)}"
        from spark_source.commit import begin_task
        if not _run(_with_admin(self.options,
                                lambda a: begin_task(a, prefix, task, batch_id))):
            for _ in iterator:  # Spark's worker expects its input read
                pass
            logger.warning("kraftlog sink %s: batch %d was committed before a restart; task %d "
                           "writes nothing", prefix, batch_id, task)
            return KraftlogCommitMessage(task, 0, prefix, None, skipped=True)
        return write_task(self.options, iterator, task, prefix, two_phase=True)

    def commit(self, messages: list, batchId: int) -> None:
        if not self.options.exactly_once:
            return
        done = [m for m in messages if m is not None]
        prefix = self.options.transactional_id_prefix or next(
            (m.prefix for m in done if m.prefix), None)
        if prefix is None:
            return  # no task ran: nothing written, nothing to decide
        from spark_source.commit import commit_batch
        prepared = {m.task: m.prepared for m in done if m.prepared is not None}
        what = _run(_with_admin(self.options, lambda a: commit_batch(
            a, prefix, batchId, prepared, [m.task for m in done])))
        logger.info("kraftlog sink %s: %s", prefix, what)

    def abort(self, messages: list, batchId: int) -> None:
        if self.options.exactly_once:
            prefix = self.options.transactional_id_prefix or next(
                (m.prefix for m in messages if m is not None and m.prefix), None)
            _abort(self.options, prefix, messages)


#: After a failed batch job, when its ids are swept again: Spark cancels the
#: tasks still running, but a cancelled task may take its id (and open a
#: transaction) after the first sweep, before its worker is stopped.
ABORT_SWEEPS_S = (2.0, 5.0)


def _abort(options: SinkOptions, prefix: str | None, messages: list,
           sweep: bool = False) -> None:
    """The job failed: abort the prepared transactions, and whatever the
    failed tasks' ids hold open; with ``sweep`` (a batch job, whose ids are
    never used again) every task's id, again after ``ABORT_SWEEPS_S``. Best
    effort: what fails here is aborted by the next attempt's tasks (same
    ids) or, for a batch job, by the transaction timeout."""
    if prefix is None:
        return
    from spark_source.commit import abort_strays, complete_all

    prepared = [m.prepared for m in messages if m is not None and m.prepared is not None]
    failed = [i for i, m in enumerate(messages) if m is None]

    async def abort(admin: Any) -> None:
        await complete_all(admin, prepared, commit=False)
        await abort_strays(admin, prefix, failed)
        if sweep:
            waited = 0.0
            for at in ABORT_SWEEPS_S:
                await asyncio.sleep(at - waited)
                waited = at
                await abort_strays(admin, prefix, range(len(messages)))
    try:
        _run(_with_admin(options, abort))
    except Exception:  # the job has failed already; say so, do not mask it
        logger.exception("kraftlog sink %s: aborting the failed job's transactions", prefix)


# -- what a task runs ----------------------------------------------------------------------
def write_task(options: SinkOptions, batches: Iterator, task: int, prefix: str | None,
               two_phase: bool) -> KraftlogCommitMessage:
    """Write the task's rows (Arrow record batches); with ``prefix``, in a
    transaction of ``<prefix>-<task>`` left prepared for the driver."""
    from api.client import KraftlogError, Producer
    from protocol.malloc import SPARK_KEEP_BYTES, keep_freed_memory

    from spark_source.commit import transactional_id

    keep_freed_memory(SPARK_KEEP_BYTES)  # each encoded batch lands in reused memory

    settings: dict[str, Any] = {**PRODUCER_DEFAULTS, **options.producer}
    if prefix is not None:
        settings.update(transactional_id=transactional_id(prefix, task),
                        transaction_two_phase_commit=two_phase)
        settings.setdefault("transaction_timeout_ms",
                            STREAM_TXN_TIMEOUT_MS if two_phase else BATCH_TXN_TIMEOUT_MS)
    errors: list = []
    try:
        producer = Producer(options.bootstrap, **settings, **options.security)
    except ValueError as exc:  # a kafka.* setting the producer refuses
        raise SinkWriteError(f"the kraftlog sink's producer settings are invalid: {exc}") \
            from None
    try:
        if prefix is not None:
            producer.init_transactions()
            producer.begin_transaction()
            on_delivery = None  # a failed record fails prepare_transaction
        else:
            def on_delivery(error: Any, _metadata: Any) -> None:
                if error is not None and not errors:
                    errors.append(error)
        rows = _send_rows(producer, batches, options.topic, on_delivery,
                          settings.get("batch_size", PRODUCER_DEFAULTS["batch_size"]))
        prepared = None
        if prefix is not None:
            prepared = producer.prepare_transaction()
        else:
            producer.flush()
            if errors:
                raise errors[0]
        return KraftlogCommitMessage(task, rows, prefix, prepared)
    except KraftlogError as exc:
        raise SinkWriteError(f"task {task}: writing to kraftlog failed: {exc}") from exc
    finally:
        producer.close()


#: Spark hands a task Arrow batches of spark.sql.execution.arrow.maxRecordsPerBatch
#: rows (10,000: about 1 MB of 100-byte values), which spread over a topic's
#: partitions would make batches of a fraction of batch.size. They are joined
#: until they hold this many batch.size worth of bytes, so that each partition
#: gets full batches (fewer, larger appends on the broker).
COALESCE_BATCHES = 8


def _coalesced(batches: Iterator, min_bytes: int) -> Iterator:
    """``batches`` (Arrow record batches of one schema) joined into batches
    of at least ``min_bytes`` (the last may be smaller), rows in order."""
    import pyarrow as pa

    held: list = []
    size = 0
    for batch in batches:
        if not batch.num_rows:
            continue
        held.append(batch)
        size += batch.nbytes
        if size >= min_bytes:
            yield _joined(pa, held)
            held, size = [], 0
    if held:
        yield _joined(pa, held)


def _joined(pa: Any, batches: list) -> Any:
    if len(batches) == 1:
        return batches[0]
    return pa.Table.from_batches(batches).combine_chunks().to_batches()[0]


def _send_rows(producer: Any, batches: Iterator, topic_option: str | None,
               on_delivery: Any, batch_size: int) -> int:
    """Every row of ``batches`` (Arrow record batches) sent; the count."""
    import pyarrow.compute as pc

    send = producer.send
    checked: dict[str, int] = {}
    rows = 0
    for batch in _coalesced(batches, COALESCE_BATCHES * batch_size):
        count = batch.num_rows
        if not count:
            continue
        index = {name.lower(): i for i, name in enumerate(batch.schema.names)}
        if topic_option is not None:
            wanted = {topic_option}
        else:
            column = batch.column(index["topic"])
            if column.null_count:
                raise SinkWriteError("null topic present in the data. Use the topic option "
                                     "for setting a topic.")
            wanted = set(pc.unique(column).to_pylist())
        for topic in wanted - checked.keys():
            checked[topic] = _check_topic(producer, topic)
        rows += count
        if "headers" not in index or batch.column(index["headers"]).null_count == count:
            _send_columns(producer, batch, index, topic_option, wanted, checked, on_delivery,
                          batch_size)
            continue
        # Headers: one send per row.
        topics = (repeat(topic_option, count) if topic_option is not None
                  else batch.column(index["topic"]).to_pylist())
        values = _bytes(batch.column(index["value"]))
        keys = _bytes(batch.column(index["key"])) if "key" in index else repeat(None, count)
        partitions = (batch.column(index["partition"]).to_pylist() if "partition" in index
                      else repeat(None, count))
        headers = _headers(batch.column(index["headers"]))
        for topic, key, value, partition, header in zip(topics, keys, values, partitions,
                                                        headers):
            send(topic, value, key, partition, None, header, on_delivery)
    return rows


def _send_columns(producer: Any, batch: Any, index: dict[str, int], topic_option: str | None,
                  topics: set[str], partition_counts: dict[str, int], on_delivery: Any,
                  batch_size: int) -> None:
    """One Arrow batch without headers sent as whole encoded batches: rows
    to partitions (the ``partition`` column, else murmur2 of the key, else
    one sticky partition per (joined) Arrow batch; ``topics``: the batch's topics),
    grouped by partition, cut into batches of at most ``batch_size`` bytes.
    Keys are placed by the
    partition count the task saw first (``partition_counts``): partitions
    added while a task writes get keyed rows from the next task on."""
    import random

    import numpy as np
    import pyarrow.compute as pc

    from api.client.bulk import RECORD_FRAMING
    from protocol import columns

    count = batch.num_rows
    room = max(batch_size - columns.BATCH_HEADER_BYTES, 1)  # section bytes per batch
    values = columns.binary_column(batch.column(index["value"]))
    keys = columns.binary_column(batch.column(index["key"])) if "key" in index else None
    key_column = keys or columns.null_column(count)
    sizes = np.diff(np.frombuffer(values.offsets, np.int32)).astype(np.int64) + RECORD_FRAMING
    if keys is not None:
        sizes += np.diff(np.frombuffer(keys.offsets, np.int32))
        hashes = np.frombuffer(columns.murmur2(keys), np.int32)
    explicit = given_at = None
    if "partition" in index:
        column = batch.column(index["partition"])
        explicit = np.asarray(column.fill_null(0), np.int64)
        given_at = np.asarray(column.is_valid())  # a null partition: the key decides
    if topic_option is not None:
        by_topic = [(topic_option, None)]
    else:
        topic_column = batch.column(index["topic"])
        by_topic = [(t, np.flatnonzero(np.asarray(pc.equal(topic_column, t))))
                    for t in sorted(topics)]
    for topic, rows in by_topic:
        partitions_count = partition_counts[topic]
        picked = np.full(count if rows is None else len(rows), -1, np.int64)
        if keys is not None:
            hashed = hashes if rows is None else hashes[rows]
            keyed = hashed >= 0
            picked[keyed] = hashed[keyed] % partitions_count
        if explicit is not None:
            given = explicit if rows is None else explicit[rows]
            valid = given_at if rows is None else given_at[rows]
            wrong = valid & ((given < 0) | (given >= partitions_count))
            if wrong.any():
                raise SinkWriteError(f"partition {int(given[wrong][0])} is not a partition of "
                                     f"topic {topic!r} (it has {partitions_count}: 0 to "
                                     f"{partitions_count - 1})")
            picked = np.where(valid, given, picked)
        picked[picked < 0] = random.randrange(partitions_count)  # keyless: sticky
        all_rows = np.arange(count, dtype=np.int64) if rows is None else rows.astype(np.int64)
        order = np.argsort(picked, kind="stable")
        picked, all_rows = picked[order], all_rows[order]
        starts = np.flatnonzero(np.r_[True, picked[1:] != picked[:-1]])
        for start, end in zip(starts, np.r_[starts[1:], len(picked)]):
            group = all_rows[start:end]
            filled = np.cumsum(sizes[group])
            first, used = 0, 0
            while first < len(group):
                # As many rows as fit in the batch; a row larger than a
                # batch goes alone (the broker says if it is too large).
                last = max(int(np.searchsorted(filled, used + room, side="right")), first + 1)
                piece = group[first:last]
                producer.send_encoded(topic, int(picked[start]),
                                      columns.encode(key_column, values, piece.tobytes(),
                                                     columns.BATCH_HEADER_BYTES),
                                      len(piece), None, on_delivery, header_room=True)
                used = int(filled[last - 1])
                first = last


def _bytes(column: Any) -> list:
    """A string or binary Arrow column as a list of bytes (None for null)."""
    import pyarrow as pa

    if pa.types.is_string(column.type) or pa.types.is_large_string(column.type):
        column = column.cast(pa.binary() if pa.types.is_string(column.type)
                             else pa.large_binary())
    return column.to_pylist()


def _headers(column: Any) -> list:
    return [None if entries is None else [(h["key"], h["value"]) for h in entries]
            for entries in column.to_pylist()]


def _check_topic(producer: Any, topic: str) -> int:
    """The topic's partition count; a clear error if it does not exist."""
    from api.client import KraftlogError

    try:
        return len(producer.partitions_for(topic))
    except KraftlogError as exc:
        if exc.code in ("UNKNOWN_TOPIC_OR_PARTITION", "INVALID_TOPIC_EXCEPTION"):
            raise SinkWriteError(f"topic {topic!r} does not exist in kraftlog: create it first "
                                 f"(kraftlog topics create {topic} --partitions N)") from None
        raise
