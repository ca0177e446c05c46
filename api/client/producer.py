"""The producer: records in, batches per partition, one request per broker.

How a record travels::

    send() ──> RecordAccumulator ──> Sender ──> POST /v1/produce ──> RecordHandle
               (per partition:        (per round: ready batches,
                BatchBuilders)          grouped by leader broker)

``send`` picks the partition (explicit; else murmur2 of the key, exactly as
Kafka's Java client; else the sticky partition), appends the record to that
partition's open ``BatchBuilder`` and returns a ``RecordHandle``. It does no
I/O and takes one lock: the synchronous ``Producer`` calls it straight from
the user's thread, with no hop to the event loop per record.

The ``Sender`` runs on the event loop (the caller's for ``AsyncProducer``, a
daemon thread's for ``Producer``). Each round it drains the batches that are
ready — full, older than ``linger_ms``, or flushed — groups them by leader
and sends one produce request per broker, up to ``max_in_flight`` requests
per broker. Retriable errors refresh metadata and put the batch back (at
the front of its partition's queue) after ``retry_backoff_ms``, until
``retries`` or ``delivery_timeout_ms`` run out; other errors fail the batch.

Ordering and duplicates: records of one partition are appended in ``send``
order. With ``acks="all"`` the producer is idempotent by default
(``enable_idempotence``, ``idempotence.py``): each batch carries the
producer id and a sequence number, up to 5 requests per partition are in
flight, and the leader refuses one that overtook an earlier one (it is
retried in order) and answers a retry of a batch it already has with the
original offsets, so nothing is written twice or out of order. Without
idempotence a partition has one request in flight at a time (requests to
one broker travel over separate HTTP connections, so a second one could be
appended first), and, as in Kafka, a retried batch can land twice or after a
later one.

Transactions (``transactional_id``, ``transactions.py``):
``init_transactions``, ``begin_transaction``,
``send_offsets_to_transaction``, ``commit_transaction``,
``abort_transaction``; see docs/exactly-once.md.

Records for a topic whose partition count is not known yet wait in a
per-topic pending group until the metadata arrives (then they are
partitioned in ``send`` order), or fail with the topic's error
(``UNKNOWN_TOPIC_OR_PARTITION``) after ``delivery_timeout_ms``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable
from typing import Any

from api.client._sync import LoopThread
from api.client.bulk import BulkRecords
from api.client._transport import DEFAULT_BOOTSTRAP, ClusterMetadata, Transport, monotonic_ms
from api.client._types import PreparedTransaction, RecordMetadata
from api.client.accumulator import (DeliveryCallback, ProducerBatch, RecordAccumulator,
                                    RecordHandle, flush_targets)
from api.client.config import ProducerConfig
from api.client.errors import BufferExhaustedError, KraftlogError
from api.client.idempotence import IdempotenceState
from api.client.transactions import (ABORTABLE_ERROR, FATAL_ERROR, IN_TRANSACTION, PREPARED,
                                     READY, TransactionManager)
from api.client.sender import Sender
from protocol.aio import wait_event

logger = logging.getLogger(__name__)


class AsyncProducer:
    """An asyncio producer.

    ::

        async with AsyncProducer(bootstrap="http://127.0.0.1:9092") as producer:
            handle = await producer.send("orders", b"value", key=b"k")
            metadata = await handle          # RecordMetadata(topic, partition, offset, ts)

    ``send`` awaits only when ``buffer_memory`` is full (at most
    ``max_block_ms``, then ``BUFFER_EXHAUSTED``); the returned handle
    resolves once the broker acknowledged the record (``acks``). See the
    module docstring for batching, retries and ordering.

    Settings (Kafka's names, snake_case): ``bootstrap`` (URL, "a,b" or a
    list), ``acks`` (0, 1, -1/"all"), ``linger_ms``, ``batch_size`` (bytes per
    batch), ``buffer_memory``, ``max_block_ms``, ``compression_type``
    ("none"/"gzip"), ``retries``, ``retry_backoff_ms``,
    ``delivery_timeout_ms``, ``request_timeout_ms``, ``max_in_flight`` (per
    broker; at most 5 with idempotence), ``max_request_bytes``,
    ``metadata_max_age_ms``, ``partitioner`` (``f(topic, key_bytes,
    num_partitions) -> partition``, called under the producer's lock: keep it
    quick), ``enable_idempotence`` (default: on with acks="all"),
    ``transactional_id`` and ``transaction_timeout_ms`` (a transactional
    producer); TLS: ``security_protocol`` ("PLAINTEXT" or "SSL"),
    ``ssl_cafile``, ``ssl_certfile``, ``ssl_keyfile``, ``ssl_check_hostname``;
    ``client_id`` (Kafka's client.id, sent with every request: client quotas
    apply per client id; default ``producer-<n>``).
    """

    def __init__(self, bootstrap: str | Iterable[str] = DEFAULT_BOOTSTRAP, **settings: Any
                 ) -> None:
        self.config = config = ProducerConfig(bootstrap=bootstrap, **settings)
        self._transport = Transport(request_timeout_ms=config.request_timeout_ms,
                                    security=config.security, client_id=config.client_id)
        self._metadata = ClusterMetadata(
            self._transport, config.bootstrap, metadata_max_age_ms=config.metadata_max_age_ms,
            request_timeout_ms=config.request_timeout_ms)
        self._acc = RecordAccumulator(
            batch_size=config.batch_size, buffer_memory=config.buffer_memory,
            linger_ms=config.linger_ms, delivery_timeout_ms=config.delivery_timeout_ms,
            compression=config.compression, partition_counts=self._metadata.partition_counts,
            partitioner=config.partitioner, wake=self._wake,
            idempotence=(IdempotenceState(config.max_in_flight)
                         if config.enable_idempotence else None),
            transactional=config.transactional_id is not None)
        self._sender = Sender(config, self._acc, self._metadata, self._transport)
        self._txn: TransactionManager | None = None
        if config.transactional_id is not None:
            assert self._acc.idempotence is not None
            self._txn = TransactionManager(
                config.transactional_id, config.transaction_timeout_ms, self._metadata,
                self._transport, self._acc.idempotence, max_block_ms=config.max_block_ms,
                retry_backoff_ms=config.retry_backoff_ms,
                request_timeout_ms=config.request_timeout_ms,
                two_phase=config.transaction_two_phase_commit)
            self._txn.on_change = self._wake
            self._sender.txn = self._txn
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closed = False
        #: Set by the sync Producer: wakes the sender from other threads.
        self._threadsafe_wake = False
        self._wake_scheduled = False
        #: A batch was created: ``send`` lets the sender run once. A loop of
        #: sends never suspends otherwise, and batches would wait for the
        #: buffer to fill before any left.
        self._yield_soon = False

    # -- lifecycle --------------------------------------------------------------------
    async def start(self) -> None:
        """Start the sender (``send`` does it too). Metadata is fetched on
        demand, so starting needs no reachable broker."""
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
            self._sender.start()

    async def __aenter__(self) -> "AsyncProducer":
        await self.start()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    def _wake(self) -> None:
        if not self._threadsafe_wake:
            self._sender.wake()
            self._yield_soon = True
            return
        if not self._wake_scheduled:
            self._wake_scheduled = True
            self._loop.call_soon_threadsafe(self._wake_in_loop)

    def _wake_in_loop(self) -> None:
        self._wake_scheduled = False
        self._sender.wake()

    # -- sending ------------------------------------------------------------------------
    async def send(self, topic: str, value: Any = None, key: Any = None,
                   partition: int | None = None, timestamp_ms: int | None = None,
                   headers: Any = None, on_delivery: DeliveryCallback | None = None
                   ) -> RecordHandle:
        """Queue one record; returns its handle (``await handle`` for the
        ``RecordMetadata``). ``value``/``key``: bytes, str (UTF-8) or None;
        ``headers``: ``[(str, bytes|str|None)]`` or a mapping;
        ``on_delivery(error, metadata)`` runs on the event loop when the
        record is acknowledged or fails."""
        if self._loop is None:
            await self.start()
        handle = self._acc.append(topic, value, key, partition, timestamp_ms, headers,
                                  on_delivery)
        if handle is None:
            handle = await self._send_when_room(topic, value, key, partition, timestamp_ms,
                                                headers, on_delivery)
        if self._yield_soon:
            self._yield_soon = False
            await asyncio.sleep(0)
        return handle

    async def send_encoded(self, topic: str, partition: int, section: bytes | bytearray,
                           record_count: int, timestamp_ms: int | None = None,
                           on_delivery: DeliveryCallback | None = None, *,
                           header_room: bool = False) -> RecordHandle:
        """Queue one whole batch whose records section is already encoded
        (``protocol.columns.encode``: record ``j`` at offset delta ``j``, all
        at ``timestamp_ms``) for ``partition``; the bulk path of writers
        that hold columns (the Spark sink). ``header_room``: ``section`` is
        a bytearray that starts with room for the batch header (``encode``
        with ``room``), written there without copying the records.
        Idempotence and transactions apply as to ``send``. Returns the first
        record's handle."""
        if self._loop is None:
            await self.start()
        args = (topic, partition, section, record_count, timestamp_ms, on_delivery,
                header_room)
        handle = self._acc.append_encoded(*args)
        if handle is None:
            handle = await self._when_room(self._acc.append_encoded, *args)
        return handle

    async def send_batch(self, topic: str, values: Any, keys: Any = None,
                         partition: int | None = None, timestamp_ms: int | None = None,
                         on_delivery: DeliveryCallback | None = None) -> list[RecordHandle]:
        """Queue many records in a few calls: ``values`` (and ``keys``, one
        per value) a sequence of bytes, str (UTF-8) or None, or an Arrow
        binary/string array. Placed as ``send`` places them (``partition``;
        else by key; else keyless records a whole batch to a partition),
        cut into batches of at most ``batch_size`` bytes, each encoded in
        one call, all records at ``timestamp_ms`` (default now), no headers.
        Returns one handle per batch, in order: its first record's (the
        batch's records follow its offset in order); ``on_delivery`` runs
        once per batch, with that record's metadata. If it raises partway
        (say ``BufferExhaustedError`` after ``max_block_ms``), the batches
        queued before stay queued and may be written: calling it again with
        the same records can write those twice."""
        if self._loop is None:
            await self.start()
        records = BulkRecords(values, keys)
        count = len(await self.partitions_for(topic))
        _check_partition(topic, partition, count)
        deadline = time.monotonic() + self.config.max_block_ms / 1000
        while self._acc.has_pending(topic):  # earlier sends waiting for metadata
            if time.monotonic() > deadline:
                raise BufferExhaustedError(f"earlier records of {topic} waited for its "
                                           "metadata for max_block_ms")
            await asyncio.sleep(0.001)
        handles = []
        for target, section, records_in in self._acc.bulk_batches(topic, records, count,
                                                                  partition):
            handles.append(await self.send_encoded(topic, target, section, records_in,
                                                   timestamp_ms, on_delivery,
                                                   header_room=True))
            await asyncio.sleep(0)  # the sender may start on what is queued
        return handles

    async def _send_when_room(self, *record: Any) -> RecordHandle:
        return await self._when_room(self._acc.append, *record)

    async def _when_room(self, append: Callable[..., RecordHandle | None], *record: Any
                         ) -> RecordHandle:
        deadline_ms = monotonic_ms() + self.config.max_block_ms
        while True:
            remaining_ms = deadline_ms - monotonic_ms()
            if remaining_ms <= 0:
                raise BufferExhaustedError(
                    f"buffer_memory ({self.config.buffer_memory} bytes) stayed full for "
                    f"max_block_ms ({self.config.max_block_ms} ms)")
            self._sender.space.clear()
            handle = append(*record)
            if handle is not None:
                return handle
            await wait_event(self._sender.space, remaining_ms / 1000)

    async def send_and_wait(self, topic: str, value: Any = None, key: Any = None,
                            partition: int | None = None, timestamp_ms: int | None = None,
                            headers: Any = None) -> RecordMetadata:
        handle = await self.send(topic, value, key, partition, timestamp_ms, headers)
        return await handle

    async def flush(self, timeout_ms: int | None = None) -> None:
        """Send everything queued now and wait until each record sent before
        this call is acknowledged or failed. Raises ``TimeoutError`` after
        ``timeout_ms``."""
        await asyncio.wait_for(self._flush(), None if timeout_ms is None else timeout_ms / 1000)

    async def _flush(self) -> None:
        if self._loop is None:
            await self.start()
        targets = self._acc.begin_flush()
        self._sender.wake()
        try:
            for target in flush_targets(targets):
                await target.wait_async()
        finally:
            self._acc.end_flush()

    # -- transactions (producers with a transactional_id) ---------------------------------
    def _transactions(self) -> TransactionManager:
        if self._txn is None:
            raise KraftlogError("INVALID_TXN_STATE", "this producer has no transactional_id",
                                retriable=False)
        return self._txn

    async def init_transactions(self) -> None:
        """Take the transactional id: its producer id and a new epoch. Any
        older producer with the same id is fenced, and a transaction it left
        open is aborted first. Call once, before the first transaction."""
        if self._loop is None:
            await self.start()
        await self._transactions().init()

    def begin_transaction(self) -> None:
        """Open a transaction: records sent until ``commit_transaction`` or
        ``abort_transaction`` become visible to read_committed consumers all
        together, or never."""
        self._transactions().begin()
        self._acc.txn_open = True

    async def _send_transaction(self, action: str) -> None:
        """Close the open transaction to new records, send what is queued and
        wait for every record; raises if one failed (then the transaction
        can only be aborted)."""
        txn = self._transactions()
        txn._require(IN_TRANSACTION, ABORTABLE_ERROR, action=action)
        self._acc.txn_open = False
        await self._flush()
        if txn.state != IN_TRANSACTION:
            error = txn.error
            raise KraftlogError(
                "TRANSACTION_ABORTABLE", f"a record of the transaction failed ({error}); call "
                "abort_transaction()", retriable=False) if txn.state == ABORTABLE_ERROR \
                else KraftlogError(error.code if error else "PRODUCER_FENCED", str(error),
                                   retriable=False)

    async def commit_transaction(self) -> None:
        """Send what is queued, wait for every record of the transaction,
        and commit it; returns once the commit markers are written. If a
        record failed, raises and the transaction can only be aborted."""
        txn = self._transactions()
        await self._send_transaction("commit_transaction")
        try:
            await txn.end(commit=True)
        except KraftlogError:
            if txn.state != FATAL_ERROR:
                txn.state = ABORTABLE_ERROR
            raise

    async def prepare_transaction(self) -> PreparedTransaction | None:
        """KIP-939's first phase: send what is queued and wait for every
        record of the transaction, then leave it open for another process
        to commit or abort with ``Admin.complete_transaction``, given what
        this returns (None: the transaction wrote nothing, there is nothing
        to complete). With ``transaction_two_phase_commit`` the coordinator
        never aborts it on its timeout. This producer can do nothing more
        with the transaction; close it."""
        txn = self._transactions()
        await self._send_transaction("prepare_transaction")
        if not txn.added:
            txn.state = READY
            return None
        txn.state = PREPARED
        return PreparedTransaction(txn.transactional_id, self._acc.idempotence.producer_id,
                                   self._acc.idempotence.epoch)

    async def send_offsets_to_transaction(self, offsets: Any, group: Any) -> None:
        """Commit a consumer group's offsets within the open transaction
        (Kafka's consume-transform-produce loop): they become the group's
        committed offsets if, and when, the transaction commits. ``offsets``:
        ``{TopicPartition: next offset to consume}``; ``group``: the group id,
        or the consumer's ``group_metadata()``."""
        group_id = group if isinstance(group, str) else getattr(group, "group_id", None)
        if not group_id:
            raise ValueError("group must be a group id or a consumer's group_metadata()")
        await self._transactions().send_offsets(
            {(tp[0], tp[1]): int(getattr(o, "offset", o)) for tp, o in offsets.items()},
            group_id)

    async def abort_transaction(self) -> None:
        """Abort the open transaction: records not sent yet are dropped
        (their handles fail with TRANSACTION_ABORTED), those sent are marked
        aborted, and read_committed consumers never see any of them."""
        txn = self._transactions()
        txn._require(IN_TRANSACTION, ABORTABLE_ERROR, action="abort_transaction")
        self._acc.txn_open = False
        error = KraftlogError("TRANSACTION_ABORTED", "the transaction was aborted",
                              retriable=False)
        for done in self._acc.abort_all():
            if isinstance(done, ProducerBatch) and done.base_sequence >= 0:
                self._acc.idempotence.given_up((done.topic, done.partition),
                                               done.producer_epoch, True)
            self._acc.complete(done, error=error)
        await self._flush()  # what is in flight comes back
        await txn.end(commit=False)
        if self._acc.idempotence.bump_needed:
            await txn.init()  # KIP-360: a new epoch restarts the sequences

    async def partitions_for(self, topic: str) -> set[int]:
        """The partitions of ``topic`` (asks the brokers when not cached);
        raises the topic's error (e.g. unknown) if there is one."""
        if self._metadata.partition_counts.get(topic) is None:
            await self._metadata.refresh([topic], only=True)
        partitions = self._metadata.partitions(topic)
        if partitions is None:
            raise self._metadata.topic_errors.get(topic) or KraftlogError(
                "UNKNOWN_TOPIC_OR_PARTITION", f"topic {topic!r} has no metadata")
        return partitions

    async def close(self, timeout_ms: int | None = None) -> None:
        """Flush (for at most ``timeout_ms``; None waits for
        ``delivery_timeout_ms`` to settle everything), then stop. Records
        still undelivered at the timeout fail with ``CLIENT_CLOSED``."""
        if self._closed:
            return
        self._closed = True
        self._acc.close()
        abort = False
        if self._loop is not None:
            try:
                await self.flush(timeout_ms)
            except (asyncio.TimeoutError, TimeoutError):
                abort = True
            await self._sender.stop(abort)
        await self._transport.close()


def _check_partition(topic: str, partition: int | None, count: int) -> None:
    if partition is not None and (partition.__class__ is not int or not 0 <= partition < count):
        raise KraftlogError("UNKNOWN_TOPIC_OR_PARTITION",
                            f"partition {partition!r} is not a partition of topic {topic!r} "
                            f"(it has {count}: 0 to {count - 1})", retriable=False)


class Producer:
    """The synchronous producer: the same settings as ``AsyncProducer``.

    ::

        with Producer(bootstrap="http://127.0.0.1:9092") as producer:
            handle = producer.send("orders", b"value", key="k")
            producer.flush()
            print(handle.result().offset)

    ``send`` appends to the accumulator in the calling thread (any thread;
    it blocks only while ``buffer_memory`` is full, up to ``max_block_ms``);
    a daemon thread's event loop sends the batches and runs ``on_delivery``
    callbacks. Callbacks must not call ``flush`` or ``close`` (they would
    wait on the thread that runs them).
    """

    def __init__(self, bootstrap: str | Iterable[str] = DEFAULT_BOOTSTRAP, **settings: Any
                 ) -> None:
        self._thread = LoopThread("kraftlog-producer")
        try:
            self._producer = self._thread.run(self._create(bootstrap, settings))
        except BaseException:
            self._thread.stop()
            raise
        self.config = self._producer.config
        acc = self._producer._acc
        acc.max_block_ms = self.config.max_block_ms
        acc.loop_thread_id = self._thread.thread_id
        # ``send`` is the accumulator's ``append`` itself (which blocks when
        # the buffer is full): a wrapper call per record costs ~7% of send.
        self.send = acc.append
        self._closed = False

    @staticmethod
    async def _create(bootstrap: Any, settings: dict) -> AsyncProducer:
        producer = AsyncProducer(bootstrap, **settings)
        await producer.start()
        producer._threadsafe_wake = True
        return producer

    def __enter__(self) -> "Producer":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def send(self, topic: str, value: Any = None, key: Any = None,
             partition: int | None = None, timestamp_ms: int | None = None,
             headers: Any = None, on_delivery: DeliveryCallback | None = None
             ) -> RecordHandle:
        """Queue one record; returns its handle (``handle.result(timeout)``).
        Arguments as ``AsyncProducer.send``. (Replaced per instance by the
        accumulator's ``append``, which this documents.)"""
        return self._producer._acc.append(topic, value, key, partition, timestamp_ms,
                                          headers, on_delivery)

    def send_encoded(self, topic: str, partition: int, section: bytes | bytearray,
                     record_count: int, timestamp_ms: int | None = None,
                     on_delivery: DeliveryCallback | None = None, *,
                     header_room: bool = False) -> RecordHandle:
        """As ``AsyncProducer.send_encoded``; blocks up to ``max_block_ms``
        for buffer room."""
        return self._producer._acc.append_encoded(topic, partition, section, record_count,
                                                  timestamp_ms, on_delivery, header_room)

    def send_batch(self, topic: str, values: Any, keys: Any = None,
                   partition: int | None = None, timestamp_ms: int | None = None,
                   on_delivery: DeliveryCallback | None = None) -> list[RecordHandle]:
        """As ``AsyncProducer.send_batch``: the bulk path, for records held
        as a list or an Arrow array (one call for thousands of records
        instead of one ``send`` each); blocks up to ``max_block_ms`` for
        buffer room."""
        records = BulkRecords(values, keys)
        acc = self._producer._acc
        count = acc.partition_counts.get(topic)
        if count is None:
            count = len(self.partitions_for(topic))
        _check_partition(topic, partition, count)
        deadline = time.monotonic() + self.config.max_block_ms / 1000
        while acc.has_pending(topic):  # earlier sends waiting for metadata
            if time.monotonic() > deadline:
                raise BufferExhaustedError(f"earlier records of {topic} waited for its "
                                           "metadata for max_block_ms")
            time.sleep(0.001)
        return [acc.append_encoded(topic, target, section, records_in, timestamp_ms,
                                   on_delivery, True)
                for target, section, records_in in acc.bulk_batches(topic, records, count,
                                                                    partition)]

    def flush(self, timeout_ms: int | None = None) -> None:
        """As ``AsyncProducer.flush``, waiting in the calling thread."""
        if self._thread.in_loop_thread:
            raise RuntimeError("flush() from a delivery callback would deadlock")
        acc = self._producer._acc
        deadline = None if timeout_ms is None else time.monotonic() + timeout_ms / 1000
        targets = acc.begin_flush()
        self._producer._wake()
        try:
            for target in flush_targets(targets):
                remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
                if not target.wait(remaining):
                    raise TimeoutError(f"flush did not finish within {timeout_ms} ms")
        finally:
            acc.end_flush()

    def partitions_for(self, topic: str) -> set[int]:
        return self._thread.run(self._producer.partitions_for(topic))

    def init_transactions(self) -> None:
        """As ``AsyncProducer.init_transactions``."""
        self._thread.run(self._producer.init_transactions())

    def begin_transaction(self) -> None:
        self._thread.call(self._producer.begin_transaction)

    def commit_transaction(self) -> None:
        """As ``AsyncProducer.commit_transaction``."""
        self._thread.run(self._producer.commit_transaction())

    def prepare_transaction(self) -> PreparedTransaction | None:
        """As ``AsyncProducer.prepare_transaction``."""
        return self._thread.run(self._producer.prepare_transaction())

    def send_offsets_to_transaction(self, offsets: Any, group: Any) -> None:
        """As ``AsyncProducer.send_offsets_to_transaction``."""
        self._thread.run(self._producer.send_offsets_to_transaction(offsets, group))

    def abort_transaction(self) -> None:
        """As ``AsyncProducer.abort_transaction``."""
        self._thread.run(self._producer.abort_transaction())

    def close(self, timeout_ms: int | None = None) -> None:
        """As ``AsyncProducer.close``; then stops the loop thread."""
        if self._closed:
            return
        self._closed = True
        try:
            self._thread.run(self._producer.close(timeout_ms))
        finally:
            self._thread.stop()
