"""The producer's record accumulator: records in, batches per partition out.

``RecordAccumulator.append`` (called by ``send``, from any thread) picks the
partition, appends the record to that partition's open ``BatchBuilder`` and
returns a ``RecordHandle``; ``drain`` (called by the ``Sender``) hands over
the batches that are ready. It does no I/O and takes one lock; time comes in
as arguments. ``RecordHandle``s resolve when their batch completes.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from api.client import bulk
from api.client._transport import monotonic_ms
from api.client._types import RecordMetadata
from api.client.errors import (BufferExhaustedError, ClientClosedError, KraftlogError,
                               MessageTooLargeError)
from api.client.idempotence import IdempotenceState
from protocol.partitioner import StickyPartitioner, murmur2
from storage.batch import BatchBuilder, Compression, EncodedBatchBuilder, with_producer

logger = logging.getLogger(__name__)

_time_ns = time.time_ns

#: Bytes a record costs beyond its key, value and headers: at least the
#: msgpack framing ``BatchBuilder.has_room_for`` assumes (34 bytes), so a
#: batch whose ``room_bytes`` covers a record surely has room for it.
RECORD_OVERHEAD_BYTES = 40
#: Per header beyond its key and value bytes (has_room_for assumes 10).
HEADER_OVERHEAD_BYTES = 16
#: Keys whose murmur2 hash is remembered; repeated keys skip the hashing.
KEY_HASH_CACHE_MAX = 65_536
#: Largest produce request body (the broker refuses more than 100 MiB).
MAX_REQUEST_BYTES_DEFAULT = 32 * 1024 * 1024
#: Extra time the HTTP request gets beyond the broker's own ``timeout_ms``,
#: so the broker's timeout answer arrives before the client gives up.
RESPONSE_MARGIN_MS = 1_000

Partitioner = Callable[[str, "bytes | None", int], int]
DeliveryCallback = Callable[["KraftlogError | None", "RecordMetadata | None"], Any]


def _to_bytes(data: Any, what: str) -> bytes:
    if isinstance(data, str):
        return data.encode("utf-8")
    if isinstance(data, (bytes, bytearray, memoryview)):
        return bytes(data)
    raise TypeError(f"record {what} must be bytes, str or None, not {type(data).__name__}")


def _normalize_headers(headers: Any) -> tuple[tuple[str, bytes | None], ...]:
    """Headers as ``(str, bytes or None)`` pairs, from pairs or a mapping."""
    items = headers.items() if isinstance(headers, Mapping) else headers
    out = []
    for item in items:
        try:
            hkey, hvalue = item
        except (TypeError, ValueError):
            raise TypeError(f"a header is a (str key, value) pair, not {item!r}") from None
        if not isinstance(hkey, str):
            raise TypeError(f"header key must be str, not {type(hkey).__name__}")
        out.append((hkey, None if hvalue is None else _to_bytes(hvalue, "header value")))
    return tuple(out)


def _headers_bytes(headers: tuple) -> int:
    return sum(len(k.encode("utf-8")) + (len(v) if v is not None else 0)
               + HEADER_OVERHEAD_BYTES for k, v in headers)


# ---------------------------------------------------------------------------
# Completion: what a RecordHandle waits on.
# ---------------------------------------------------------------------------
class _Completion:
    """Something records wait on: a batch, or a topic's pending group.

    Completed once, on the sender's loop: ``done`` becomes True, the
    threading event is set for sync waiters, asyncio waiters are woken on
    their own loops, then delivery callbacks run. A pending group completes
    either with an error or ``forwarded_to`` the batches its records moved
    into (their handles already point there).
    """

    __slots__ = ("done", "error", "_event", "_waiters", "callbacks", "forwarded_to",
                 "created_ms", "buffered_bytes")

    def __init__(self, created_ms: int) -> None:
        self.done = False
        self.error: KraftlogError | None = None
        #: Made by the first sync waiter (most batches have none: async
        #: senders, callbacks, ``flush``), not for every batch.
        self._event: threading.Event | None = None
        self._waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future]] | None = None
        self.callbacks: list[tuple[RecordHandle, DeliveryCallback]] | None = None
        self.forwarded_to: list[ProducerBatch] | None = None
        self.created_ms = created_ms
        self.buffered_bytes = 0

    def wait(self, timeout_s: float | None) -> bool:
        if self.done:
            return True
        event = self._event
        if event is None:
            with _EVENT_LOCK:
                event = self._event
                if event is None:
                    event = self._event = threading.Event()
            # ``_finish`` sets ``done`` and then reads ``_event``: finished
            # before the event was there, it set none, so look again.
            if self.done:
                event.set()
        return event.wait(timeout_s)

    async def wait_async(self) -> None:
        if self.done:
            return
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        if self._waiters is None:
            self._waiters = []
        self._waiters.append((loop, future))
        if self.done:  # completed on another thread while we registered
            _wake_future(future)
        await future

    def _finish(self) -> None:
        self.done = True
        event = self._event
        if event is not None:
            event.set()
        if self._waiters:
            for loop, future in self._waiters:
                if loop is _running_loop():
                    _wake_future(future)
                else:
                    loop.call_soon_threadsafe(_wake_future, future)
        if self.callbacks:
            for handle, callback in self.callbacks:
                _run_callback(handle, callback)


#: Guards the making of a completion's event by concurrent sync waiters.
_EVENT_LOCK = threading.Lock()


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


def _wake_future(future: asyncio.Future) -> None:
    if not future.done():
        future.set_result(None)


def _run_callback(handle: RecordHandle, callback: DeliveryCallback) -> None:
    batch = handle._batch
    try:
        if batch.error is not None:
            callback(batch.error, None)
        else:
            callback(None, batch.metadata(handle._index, handle.timestamp_ms))
    except Exception:  # a user's callback must not stop the producer
        logger.exception("delivery callback %r raised", callback)


class ProducerBatch(_Completion):
    """The records of one partition that travel (and succeed or fail)
    together. Its builder takes records until it is drained; when first
    sent, ``payload`` takes the built bytes (kept for retries) and
    ``builder`` becomes None."""

    __slots__ = ("topic", "partition", "builder", "room_bytes", "payload", "record_count",
                 "attempts", "retry_at_ms", "last_error", "base_offset", "log_append_time_ms",
                 "serial", "producer_id", "producer_epoch", "base_sequence")

    def __init__(self, topic: str, partition: int, builder: BatchBuilder,
                 created_ms: int, batch_size: int) -> None:
        super().__init__(created_ms)
        self.topic = topic
        self.partition = partition
        self.builder = builder
        #: Bytes surely free: records whose estimated size fits skip the
        #: exact ``has_room_for``. Invariant: room_bytes <= batch_size -
        #: builder.size_bytes, and estimates are at least has_room_for's.
        self.room_bytes = batch_size - builder.size_bytes
        self.payload: bytes | None = None
        self.record_count = 0
        self.attempts = 0
        self.retry_at_ms = 0
        self.last_error: KraftlogError | None = None
        self.base_offset = -1
        self.log_append_time_ms = -1
        #: Creation order within the producer: retries go back in this order.
        self.serial = 0
        # What an idempotent producer stamped on it when it first left.
        self.producer_id = -1
        self.producer_epoch = -1
        self.base_sequence = -1

    @property
    def count(self) -> int:
        return self.record_count if self.builder is None else self.builder.record_count

    def stamp(self, producer_id: int, epoch: int, base_sequence: int) -> None:
        """Carry an idempotent producer's id, epoch and sequence."""
        self.producer_id, self.producer_epoch, self.base_sequence = (
            producer_id, epoch, base_sequence)
        if self.builder is not None:
            self.builder.producer_id = producer_id
            self.builder.producer_epoch = epoch
            self.builder.base_sequence = base_sequence
        else:
            assert self.payload is not None
            self.payload = with_producer(self.payload, producer_id, epoch, base_sequence)

    def metadata(self, index: int, timestamp_ms: int) -> RecordMetadata:
        if self.error is not None:
            raise self.error
        offset = self.base_offset + index if self.base_offset >= 0 else -1
        if self.log_append_time_ms >= 0:
            timestamp_ms = self.log_append_time_ms
        return RecordMetadata(self.topic, self.partition, offset, timestamp_ms)

    def __repr__(self) -> str:
        count = self.record_count if self.builder is None else self.builder.record_count
        return f"ProducerBatch({self.topic}-{self.partition}, records={count}, done={self.done})"


class _PendingGroup(_Completion):
    """Records of a topic whose partition count is not known yet, in send
    order: ``(key, value, partition or None, timestamp_ms, headers, size,
    handle, callback)``. Records with an explicit partition queue here too
    while the group exists, so none overtakes an earlier record."""

    __slots__ = ("topic", "records")

    def __init__(self, topic: str, created_ms: int) -> None:
        super().__init__(created_ms)
        self.topic = topic
        self.records: list[tuple] = []

    def metadata(self, index: int, timestamp_ms: int) -> RecordMetadata:
        assert self.error is not None, "a pending group completes with an error or forwards"
        raise self.error


class RecordHandle:
    """The future of one sent record: ``result(timeout_s)`` blocks (sync),
    ``await handle`` waits (async); both give ``RecordMetadata`` or raise the
    record's ``KraftlogError``.

    Deliberately not an ``asyncio.Future``: the producer makes one per
    record, so it is three slots pointing at the batch, which completes all
    its records at once.
    """

    __slots__ = ("_batch", "_index", "timestamp_ms")

    def __init__(self, batch: _Completion, index: int, timestamp_ms: int) -> None:
        self._batch = batch
        self._index = index
        self.timestamp_ms = timestamp_ms

    def done(self) -> bool:
        batch = self._batch
        return batch.done and batch.forwarded_to is None

    def result(self, timeout: float | None = None) -> RecordMetadata:
        """Wait up to ``timeout`` seconds (None: forever); raises
        ``TimeoutError`` when it passes."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            batch = self._batch
            if not batch.done:
                remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
                if not batch.wait(remaining):
                    raise TimeoutError(f"record not acknowledged within {timeout} s")
            if self._batch is batch:
                return batch.metadata(self._index, self.timestamp_ms)

    def exception(self, timeout: float | None = None) -> KraftlogError | None:
        try:
            self.result(timeout)
        except KraftlogError as exc:
            return exc
        return None

    async def _wait(self) -> RecordMetadata:
        while True:
            batch = self._batch
            await batch.wait_async()
            if self._batch is batch:
                return batch.metadata(self._index, self.timestamp_ms)

    def __await__(self):
        return self._wait().__await__()

    def __repr__(self) -> str:
        return f"RecordHandle({self._batch!r}, index={self._index})"


# ---------------------------------------------------------------------------
# The accumulator: pure, thread-safe, no I/O. Time comes in as arguments.
# ---------------------------------------------------------------------------
class RecordAccumulator:
    """Per-partition queues of batches, the pending groups of topics without
    metadata, and the memory account.

    Shared by the user's threads (``append``) and the sender (everything
    else); ``lock`` guards every field below. The sender is told of new
    batches through ``wake`` (called outside the lock).

    Invariants: a partition's open batch (the one taking records) is the
    last of its queue; ``buffered_bytes`` is the sum of ``buffered_bytes``
    over incomplete batches and pending groups, and at most
    ``buffer_memory``.
    """

    def __init__(self, *, batch_size: int, buffer_memory: int, linger_ms: int,
                 delivery_timeout_ms: int, compression: Compression = Compression.NONE,
                 partition_counts: Mapping[str, int] | None = None,
                 partitioner: Partitioner | None = None,
                 sticky: StickyPartitioner | None = None,
                 clock_ms: Callable[[], int] = monotonic_ms,
                 wake: Callable[[], None] = lambda: None,
                 max_block_ms: int | None = None,
                 idempotence: IdempotenceState | None = None,
                 transactional: bool = False) -> None:
        self.batch_size = batch_size
        self.buffer_memory = buffer_memory
        self.linger_ms = linger_ms
        self.delivery_timeout_ms = delivery_timeout_ms
        self.compression = compression
        #: topic -> partition count; read here, written by the metadata owner.
        self.partition_counts = partition_counts if partition_counts is not None else {}
        self.lock = threading.Lock()
        self.space = threading.Condition(self.lock)
        self.closed = False
        self.flushing = 0
        self.buffered_bytes = 0
        #: None: ``append`` answers None when the buffer is full (the async
        #: producer awaits room itself). Else it blocks up to this long.
        self.max_block_ms = max_block_ms
        #: The event loop's thread, which must never block in ``append``.
        self.loop_thread_id: int | None = None
        self._clock_ms = clock_ms
        self._wake = wake
        self._custom_partitioner = partitioner
        self._sticky = sticky or StickyPartitioner()
        self._key_hashes: dict[bytes, int] = {}
        #: The partitions with batches queued, and only those (a queue
        #: drained empty goes): a sender's round walks them, so it costs
        #: the partitions with records waiting, not every one written to.
        self._queues: dict[tuple[str, int], deque[ProducerBatch]] = {}
        self._open: dict[tuple[str, int], ProducerBatch] = {}
        # Requests in flight per partition. Without idempotence a partition's
        # next batches wait for its one request: two requests in flight
        # travel over separate connections, and the later one could be
        # appended first. With it, ``idempotence.may_send`` decides: the
        # broker's sequence check keeps the order.
        self._sending: dict[tuple[str, int], int] = {}
        self.idempotence = idempotence
        self._serial = 0
        #: A transactional producer's batches carry the transactional bit,
        #: and records are taken only while a transaction is open.
        self.transactional = transactional
        self.txn_open = False
        self._pending: dict[str, _PendingGroup] = {}
        self._incomplete: set[_Completion] = set()

    # -- the hot path -----------------------------------------------------------
    def append(self, topic: str, value: Any = None, key: Any = None,
               partition: int | None = None, timestamp_ms: int | None = None,
               headers: Any = None, on_delivery: DeliveryCallback | None = None
               ) -> RecordHandle | None:
        """Add one record and return its handle. When the buffer is full it
        blocks up to ``max_block_ms`` (then raises ``BUFFER_EXHAUSTED``) or,
        with ``max_block_ms`` None, returns None for the caller to wait."""
        if self.transactional and not self.txn_open:
            raise KraftlogError("INVALID_TXN_STATE",
                                "a transactional producer sends only inside a transaction: "
                                "call begin_transaction() first", retriable=False)
        if value is not None and value.__class__ is not bytes:
            value = _to_bytes(value, "value")
        if key is not None and key.__class__ is not bytes:
            key = _to_bytes(key, "key")
        size = RECORD_OVERHEAD_BYTES
        if value is not None:
            size += len(value)
        if key is not None:
            size += len(key)
        if headers:
            headers = _normalize_headers(headers)
            size += _headers_bytes(headers)
        else:
            headers = ()
        if timestamp_ms is None:
            timestamp_ms = _time_ns() // 1_000_000
        elif timestamp_ms.__class__ is not int:
            raise TypeError(f"timestamp_ms must be an int (ms), not {timestamp_ms!r}")
        created = False
        lock = self.lock
        lock.acquire()  # not ``with``: measurably cheaper on this path
        try:
            if self.closed:
                raise ClientClosedError("send on a closed producer")
            if self.buffered_bytes + size > self.buffer_memory and not self._wait_for_room(size):
                return None
            if partition is None:
                count = self.partition_counts.get(topic)
                if count is None or topic in self._pending:
                    return self._append_pending(topic, key, value, None, timestamp_ms,
                                                headers, size, on_delivery)
                if key is None and self._custom_partitioner is None:
                    partition = self._sticky.partition_for(topic, None, count)
                else:
                    partition = self._choose_partition(topic, key, count)
            elif self._pending and topic in self._pending:
                # Behind the topic's pending records, to keep send order.
                return self._append_pending(topic, key, value, partition, timestamp_ms,
                                            headers, size, on_delivery)
            tp = (topic, partition)
            batch = self._open.get(tp)
            if batch is None or (size > batch.room_bytes
                                 and not self._has_room(batch, key, value, headers)):
                batch = self._new_batch(tp)
                created = True
            index = batch.builder.append(key, value, timestamp_ms=timestamp_ms, headers=headers)
            batch.room_bytes -= size
            batch.buffered_bytes += size
            self.buffered_bytes += size
            handle = RecordHandle(batch, index, timestamp_ms)
            if on_delivery is not None:
                _add_callback(batch, handle, on_delivery)
        finally:
            lock.release()
        if created:
            self._wake()
        return handle

    def append_encoded(self, topic: str, partition: int, section: bytes | bytearray,
                       record_count: int, timestamp_ms: int | None = None,
                       on_delivery: DeliveryCallback | None = None,
                       header_room: bool = False) -> RecordHandle | None:
        """Add one whole batch of ``record_count`` records whose section is
        already encoded (``EncodedBatchBuilder``), to an explicit partition;
        ready to send at once, after the partition's earlier records. The
        handle is the batch's first record's. Blocks for buffer room as
        ``append`` does."""
        if self.transactional and not self.txn_open:
            raise KraftlogError("INVALID_TXN_STATE",
                                "a transactional producer sends only inside a transaction: "
                                "call begin_transaction() first", retriable=False)
        if timestamp_ms is None:
            timestamp_ms = _time_ns() // 1_000_000
        builder = EncodedBatchBuilder(section, record_count, timestamp_ms,
                                      compression=self.compression,
                                      transactional=self.transactional,
                                      header_room=header_room)
        size = builder.size_bytes
        tp = (topic, partition)
        with self.lock:
            if self.closed:
                raise ClientClosedError("send on a closed producer")
            if self.buffered_bytes + size > self.buffer_memory and not self._wait_for_room(size):
                return None
            if self._pending and topic in self._pending:
                raise KraftlogError("INVALID_REQUEST", f"records of {topic} are waiting for "
                                    "its metadata; send encoded batches after they went",
                                    retriable=False)
            batch = self._new_batch(tp, builder)
            del self._open[tp]  # full: nothing joins it, and it goes without lingering
            batch.buffered_bytes += size
            self.buffered_bytes += size
            handle = RecordHandle(batch, 0, timestamp_ms)
            if on_delivery is not None:
                _add_callback(batch, handle, on_delivery)
        self._wake()
        return handle

    def _has_room(self, batch: ProducerBatch, key, value, headers) -> bool:
        """The exact check, for records the cheap ``room_bytes`` estimate
        does not cover; re-bases the estimate on the builder's real size."""
        if not batch.builder.has_room_for(key, value, self.batch_size, headers):
            return False
        batch.room_bytes = self.batch_size - batch.builder.size_bytes
        return True

    def has_pending(self, topic: str) -> bool:
        """Whether records of ``topic`` wait for its metadata."""
        return topic in self._pending

    def bulk_batches(self, topic: str, records: bulk.BulkRecords, count: int,
                     partition: int | None) -> Iterator[tuple[int, bytearray, int]]:
        """``bulk.plan`` with this producer's batch size and partitioners:
        keyless batches each to the sticky partition, which moves on after
        each (a whole batch closed), as ``append`` would have placed them."""
        custom = self._custom_partitioner

        def keyless_partition() -> int:
            with self.lock:
                chosen = self._sticky.partition_for(topic, None, count)
                self._sticky.on_batch_closed(topic, chosen, count)
            return chosen

        return bulk.plan(records, count, partition, self.batch_size, keyless_partition,
                         None if custom is None else lambda key, n: custom(topic, key, n))

    def _choose_partition(self, topic: str, key: bytes | None, count: int) -> int:
        if self._custom_partitioner is not None:
            partition = self._custom_partitioner(topic, key, count)
            if not isinstance(partition, int) or not 0 <= partition < count:
                raise ValueError(f"partitioner chose {partition!r} for topic {topic!r} "
                                 f"of {count} partitions")
            return partition
        if key is None:
            return self._sticky.partition_for(topic, None, count)
        hashed = self._key_hashes.get(key)
        if hashed is None:
            hashed = murmur2(key) & 0x7FFFFFFF
            if len(self._key_hashes) >= KEY_HASH_CACHE_MAX:
                self._key_hashes.clear()
            self._key_hashes[key] = hashed
        return hashed % count

    def _wait_for_room(self, size: int) -> bool:
        """Called with the lock held and the buffer full: wait (releasing
        the lock) until ``size`` bytes fit. False: the caller should wait
        itself (async); raises when ``max_block_ms`` passes."""
        if size > self.buffer_memory:
            raise MessageTooLargeError(
                f"a record of about {size} bytes is larger than buffer_memory "
                f"({self.buffer_memory} bytes)")
        if self.max_block_ms is None:
            return False
        # In the loop's own thread (a delivery callback) nothing can free
        # memory while it waits: fail at once instead of deadlocking.
        timeout_s = (0 if threading.get_ident() == self.loop_thread_id
                     else self.max_block_ms / 1000)
        if not self.space.wait_for(
                lambda: self.closed or self.buffered_bytes + size <= self.buffer_memory,
                timeout_s):
            raise BufferExhaustedError(
                f"buffer_memory ({self.buffer_memory} bytes) stayed full for "
                f"max_block_ms ({self.max_block_ms} ms)")
        if self.closed:
            raise ClientClosedError("send on a closed producer")
        return True

    def _new_batch(self, tp: tuple[str, int], builder: Any = None) -> ProducerBatch:
        topic, partition = tp
        if not isinstance(topic, str) or not topic:
            raise TypeError(f"topic must be a non-empty str, not {topic!r}")
        if not isinstance(partition, int) or partition < 0:
            raise ValueError(f"partition must be an int >= 0, not {partition!r}")
        if builder is None:
            builder = BatchBuilder(compression=self.compression,
                                   transactional=self.transactional)
        batch = ProducerBatch(topic, partition, builder, self._clock_ms(), self.batch_size)
        self._serial += 1
        batch.serial = self._serial
        self._open[tp] = batch
        queue = self._queues.get(tp)
        if queue is None:
            queue = self._queues[tp] = deque()
        queue.append(batch)
        self._incomplete.add(batch)
        return batch

    def _append_pending(self, topic, key, value, partition, timestamp_ms, headers, size,
                        on_delivery) -> RecordHandle:
        if not isinstance(topic, str) or not topic:
            raise TypeError(f"topic must be a non-empty str, not {topic!r}")
        if partition is not None and (not isinstance(partition, int) or partition < 0):
            raise ValueError(f"partition must be an int >= 0, not {partition!r}")
        group = self._pending.get(topic)
        created = group is None
        if created:
            group = self._pending[topic] = _PendingGroup(topic, self._clock_ms())
            self._incomplete.add(group)
        handle = RecordHandle(group, len(group.records), timestamp_ms)
        group.records.append((key, value, partition, timestamp_ms, headers, size, handle,
                              on_delivery))
        group.buffered_bytes += size
        self.buffered_bytes += size
        if on_delivery is not None:
            _add_callback(group, handle, on_delivery)
        if created:
            self._wake()  # under the lock; wake only schedules
        return handle

    # -- the sender's side ----------------------------------------------------------
    def partitions_with_data(self) -> list[tuple[str, int]]:
        """Partitions with a queued batch."""
        with self.lock:
            return list(self._queues)

    def pending_topics(self) -> list[str]:
        with self.lock:
            return list(self._pending)

    def wanted_topics(self) -> set[str]:
        """Topics with records waiting: the metadata the sender needs."""
        with self.lock:
            return {tp[0] for tp in self._queues} | set(self._pending)

    def has_unsent(self) -> bool:
        with self.lock:
            return bool(self._pending) or bool(self._queues)

    def has_incomplete(self) -> bool:
        with self.lock:
            return bool(self._incomplete)

    def assign_pending(self, topic: str) -> _PendingGroup | None:
        """Partition the pending records of ``topic`` now that its partition
        count is known. Returns the forwarded group; the caller completes it
        (``finish``) outside the lock."""
        with self.lock:
            count = self.partition_counts.get(topic)
            group = self._pending.get(topic)
            if group is None or count is None:
                return None
            # Partition everything first: a custom partitioner that raises
            # leaves the group untouched (the caller fails it).
            partitions = [self._choose_partition(topic, record[0], count)
                          if record[2] is None else record[2] for record in group.records]
            del self._pending[topic]
            self._incomplete.discard(group)
            self.buffered_bytes -= group.buffered_bytes
            forwarded = {}
            for partition, (key, value, _, timestamp_ms, headers, size, handle, callback) in zip(
                    partitions, group.records):
                tp = (topic, partition)
                batch = self._open.get(tp)
                if batch is None or (size > batch.room_bytes
                                     and not self._has_room(batch, key, value, headers)):
                    batch = self._new_batch(tp)
                handle._index = batch.builder.append(
                    key, value, timestamp_ms=timestamp_ms, headers=headers)
                batch.room_bytes -= size
                handle._batch = batch
                batch.buffered_bytes += size
                self.buffered_bytes += size
                if callback is not None:
                    _add_callback(batch, handle, callback)
                forwarded[id(batch)] = batch
            group.forwarded_to = list(forwarded.values())
            group.callbacks = None  # moved to the batches
            return group

    def drain(self, now_ms: int, leader_url: Callable[[tuple[str, int]], str | None],
              busy_urls: set[str] | frozenset = frozenset(),
              max_request_bytes: int = MAX_REQUEST_BYTES_DEFAULT
              ) -> tuple[dict[str, list[ProducerBatch]], int | None, set[str]]:
        """Take the batches ready to go, grouped by leader URL.

        A partition's head batch is ready when it is full (another batch
        follows it), older than ``linger_ms``, or a flush or close is under
        way; and not backing off a retry. Ready batches of one partition go
        together, in order. A request stays under ``max_request_bytes``
        (uncompressed sizes), except that it always takes one batch.

        Returns ``(batches by URL, ms until the next batch may be ready or
        expire (None: nothing waits), topics with a batch ready but no known
        leader)``.
        """
        out: dict[str, list[ProducerBatch]] = {}
        request_bytes: dict[str, int] = {}
        next_ms: int | None = None
        missing: set[str] = set()
        linger_ms = self.linger_ms
        idem = self.idempotence
        with self.lock:
            urgent = self.flushing > 0 or self.closed
            for group in self._pending.values():
                wait = group.created_ms + self.delivery_timeout_ms - now_ms
                next_ms = wait if next_ms is None or wait < next_ms else next_ms
            emptied = []
            for tp, queue in self._queues.items():
                head = queue[0]
                expiry = head.created_ms + self.delivery_timeout_ms - now_ms
                if next_ms is None or expiry < next_ms:
                    next_ms = expiry
                if head.retry_at_ms > now_ms:
                    wait = head.retry_at_ms - now_ms
                    next_ms = wait if wait < next_ms else next_ms
                    continue
                if not (urgent or len(queue) > 1 or head is not self._open.get(tp)):
                    wait = head.created_ms + linger_ms - now_ms
                    if wait > 0:
                        next_ms = wait if wait < next_ms else next_ms
                        continue
                if idem is None and tp in self._sending:
                    continue  # its previous batches are in flight: keep the order
                url = leader_url(tp)
                if url is None:
                    missing.add(tp[0])
                    continue
                if url in busy_urls:
                    continue
                if idem is not None and not idem.may_send(tp, url, head.base_sequence >= 0):
                    continue
                taken = out.get(url)
                if taken is None:
                    taken = out[url] = []
                    request_bytes[url] = 0
                while queue:
                    batch = queue[0]
                    size = (len(batch.payload) if batch.builder is None
                            else batch.builder.size_bytes)
                    if taken and request_bytes[url] + size > max_request_bytes:
                        break
                    if batch.retry_at_ms > now_ms:
                        break
                    if batch is self._open.get(tp):
                        wait = batch.created_ms + linger_ms - now_ms
                        if not urgent and wait > 0:
                            next_ms = wait if next_ms is None or wait < next_ms else next_ms
                            break
                        del self._open[tp]
                    queue.popleft()
                    taken.append(batch)
                    self._sending[tp] = self._sending.get(tp, 0) + 1
                    request_bytes[url] += size
                    count = self.partition_counts.get(tp[0])
                    if count:
                        self._sticky.on_batch_closed(tp[0], tp[1], count)
                    if idem is not None:
                        # One batch per partition per request (the broker
                        # dedupes batch by batch), stamped as it leaves.
                        stamp = idem.stamp(tp, batch.count, batch.producer_epoch,
                                           batch.base_sequence, batch.producer_id)
                        if stamp is not None:
                            batch.stamp(*stamp)
                        idem.sending(tp, url)
                        break
                if not queue:
                    emptied.append(tp)
                if not taken:
                    del out[url]
            for tp in emptied:
                del self._queues[tp]
        if next_ms is not None and next_ms < 0:
            next_ms = 0
        return out, next_ms, missing

    def sent(self, batches: Iterable[ProducerBatch]) -> None:
        """The request carrying ``batches`` is over (answered, failed or
        abandoned): their partitions may send again."""
        with self.lock:
            for b in batches:
                tp = (b.topic, b.partition)
                left = self._sending.get(tp, 0) - 1
                if left > 0:
                    self._sending[tp] = left
                else:
                    self._sending.pop(tp, None)

    def requeue(self, batches: list[ProducerBatch], retry_at_ms: int) -> None:
        """Put batches that failed retriably back into their partitions'
        queues, in creation order: a batch retried after a later one failed
        too still goes first (its sequence is lower)."""
        with self.lock:
            for batch in batches:
                batch.retry_at_ms = retry_at_ms
                tp = (batch.topic, batch.partition)
                queue = self._queues.get(tp)
                if queue is None:
                    queue = self._queues[tp] = deque()
                index = 0
                while index < len(queue) and queue[index].serial < batch.serial:
                    index += 1
                queue.insert(index, batch)

    def expired(self, now_ms: int) -> list[_Completion]:
        """Remove and return the queued batches and pending groups older than
        ``delivery_timeout_ms``. The caller completes them with an error."""
        out: list[_Completion] = []
        deadline_ms = now_ms - self.delivery_timeout_ms
        with self.lock:
            for topic in [t for t, g in self._pending.items() if g.created_ms <= deadline_ms]:
                out.append(self._pending.pop(topic))
            emptied = []
            for tp, queue in self._queues.items():
                while queue and queue[0].created_ms <= deadline_ms:
                    batch = queue.popleft()
                    if self._open.get(tp) is batch:
                        del self._open[tp]
                    out.append(batch)
                if not queue:
                    emptied.append(tp)
            for tp in emptied:
                del self._queues[tp]
        return out

    def fail_pending(self, topic: str) -> _PendingGroup | None:
        """Remove the pending group of a topic the metadata refuses (e.g. an
        invalid name); the caller completes it with the topic's error."""
        with self.lock:
            return self._pending.pop(topic, None)

    def abort_all(self) -> list[_Completion]:
        """Remove every queued batch and pending group (forced close)."""
        with self.lock:
            out: list[_Completion] = list(self._pending.values())
            self._pending.clear()
            for queue in self._queues.values():
                out.extend(queue)
            self._queues.clear()
            self._open.clear()
            return out

    def complete(self, done: _Completion, *, base_offset: int = -1,
                 log_append_time_ms: int = -1, error: KraftlogError | None = None) -> None:
        """Settle a batch (or fail a pending group): release its memory, then
        wake its waiters and run its callbacks (outside the lock)."""
        with self.lock:
            if done not in self._incomplete:
                return
            self._incomplete.discard(done)
            self.buffered_bytes -= done.buffered_bytes
            self.space.notify_all()
        if isinstance(done, ProducerBatch):
            done.base_offset = base_offset
            done.log_append_time_ms = log_append_time_ms
        done.error = error
        done._finish()

    def finish_forwarded(self, group: _PendingGroup) -> None:
        """Complete a group whose records ``assign_pending`` moved."""
        assert group.forwarded_to is not None
        group._finish()

    def begin_flush(self) -> list[_Completion]:
        """Make every batch ready now; what a flush waits for."""
        with self.lock:
            self.flushing += 1
            return list(self._incomplete)

    def end_flush(self) -> None:
        with self.lock:
            self.flushing -= 1

    def close(self) -> None:
        with self.lock:
            self.closed = True
            self.space.notify_all()


def _add_callback(done: _Completion, handle: RecordHandle, callback: DeliveryCallback) -> None:
    if done.callbacks is None:
        done.callbacks = []
    done.callbacks.append((handle, callback))


def flush_targets(targets: Iterable[_Completion]) -> Iterable[_Completion]:
    """Expand forwarded pending groups into the batches they forwarded to
    (generator: call again after waiting, as groups forward late)."""
    for target in targets:
        yield target
        if target.forwarded_to:
            yield from flush_targets(target.forwarded_to)
