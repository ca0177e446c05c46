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

Ordering: records of one partition are appended in ``send`` order, and
batches leave in that order, one request at a time per partition: requests
in flight to one broker travel over separate HTTP connections, so a second
request carrying the same partition could be appended first. Other
partitions' batches still go in parallel, up to ``max_in_flight`` requests
per broker. As in Kafka without idempotence, a retried batch can land after
a later one of its partition; set ``retries=0`` when order must survive
failures.

Records for a topic whose partition count is not known yet wait in a
per-topic pending group until the metadata arrives (then they are
partitioned in ``send`` order), or fail with the topic's error
(``UNKNOWN_TOPIC_OR_PARTITION``) after ``delivery_timeout_ms``.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from api.client._sync import LoopThread
from api.client._transport import DEFAULT_BOOTSTRAP, ClusterMetadata, Transport, monotonic_ms
from api.client._types import RecordMetadata
from api.client.errors import (METADATA_CODES, BufferExhaustedError, ClientClosedError,
                               KraftlogError, MessageTooLargeError, RequestTimedOutError,
                               error_from)
from protocol.partitioner import StickyPartitioner, murmur2
from storage.batch import BatchBuilder, Compression

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
        self._event = threading.Event()
        self._waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future]] | None = None
        self.callbacks: list[tuple[RecordHandle, DeliveryCallback]] | None = None
        self.forwarded_to: list[ProducerBatch] | None = None
        self.created_ms = created_ms
        self.buffered_bytes = 0

    def wait(self, timeout_s: float | None) -> bool:
        return self._event.wait(timeout_s)

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
        self._event.set()
        if self._waiters:
            for loop, future in self._waiters:
                if loop is _running_loop():
                    _wake_future(future)
                else:
                    loop.call_soon_threadsafe(_wake_future, future)
        if self.callbacks:
            for handle, callback in self.callbacks:
                _run_callback(handle, callback)


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
                 "attempts", "retry_at_ms", "last_error", "base_offset", "log_append_time_ms")

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
                 max_block_ms: int | None = None) -> None:
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
        self._queues: dict[tuple[str, int], deque[ProducerBatch]] = {}
        self._open: dict[tuple[str, int], ProducerBatch] = {}
        # Partitions with batches in a request now. Their next batches wait:
        # two requests in flight travel over separate connections, and the
        # later one could be appended first.
        self._sending: set[tuple[str, int]] = set()
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

    def _has_room(self, batch: ProducerBatch, key, value, headers) -> bool:
        """The exact check, for records the cheap ``room_bytes`` estimate
        does not cover; re-bases the estimate on the builder's real size."""
        if not batch.builder.has_room_for(key, value, self.batch_size, headers):
            return False
        batch.room_bytes = self.batch_size - batch.builder.size_bytes
        return True

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

    def _new_batch(self, tp: tuple[str, int]) -> ProducerBatch:
        topic, partition = tp
        if not isinstance(topic, str) or not topic:
            raise TypeError(f"topic must be a non-empty str, not {topic!r}")
        if not isinstance(partition, int) or partition < 0:
            raise ValueError(f"partition must be an int >= 0, not {partition!r}")
        batch = ProducerBatch(topic, partition, BatchBuilder(compression=self.compression),
                              self._clock_ms(), self.batch_size)
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
    def pending_topics(self) -> list[str]:
        with self.lock:
            return list(self._pending)

    def wanted_topics(self) -> set[str]:
        """Topics with records waiting: the metadata the sender needs."""
        with self.lock:
            return {tp[0] for tp, q in self._queues.items() if q} | set(self._pending)

    def has_unsent(self) -> bool:
        with self.lock:
            return bool(self._pending) or any(self._queues.values())

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
        with self.lock:
            urgent = self.flushing > 0 or self.closed
            for group in self._pending.values():
                wait = group.created_ms + self.delivery_timeout_ms - now_ms
                next_ms = wait if next_ms is None or wait < next_ms else next_ms
            for tp, queue in self._queues.items():
                if not queue:
                    continue
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
                if tp in self._sending:
                    continue  # its previous batches are in flight: keep the order
                url = leader_url(tp)
                if url is None:
                    missing.add(tp[0])
                    continue
                if url in busy_urls:
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
                    self._sending.add(tp)
                    request_bytes[url] += size
                    count = self.partition_counts.get(tp[0])
                    if count:
                        self._sticky.on_batch_closed(tp[0], tp[1], count)
                if not taken:
                    del out[url]
        if next_ms is not None and next_ms < 0:
            next_ms = 0
        return out, next_ms, missing

    def sent(self, batches: Iterable[ProducerBatch]) -> None:
        """The request carrying ``batches`` is over (answered, failed or
        abandoned): their partitions may send again."""
        with self.lock:
            self._sending.difference_update((b.topic, b.partition) for b in batches)

    def requeue(self, batches: list[ProducerBatch], retry_at_ms: int) -> None:
        """Put batches that failed retriably back at the front of their
        partitions' queues, in their original order."""
        with self.lock:
            for batch in reversed(batches):
                batch.retry_at_ms = retry_at_ms
                tp = (batch.topic, batch.partition)
                queue = self._queues.get(tp)
                if queue is None:
                    queue = self._queues[tp] = deque()
                queue.appendleft(batch)

    def expired(self, now_ms: int) -> list[_Completion]:
        """Remove and return the queued batches and pending groups older than
        ``delivery_timeout_ms``. The caller completes them with an error."""
        out: list[_Completion] = []
        deadline_ms = now_ms - self.delivery_timeout_ms
        with self.lock:
            for topic in [t for t, g in self._pending.items() if g.created_ms <= deadline_ms]:
                out.append(self._pending.pop(topic))
            for tp, queue in self._queues.items():
                while queue and queue[0].created_ms <= deadline_ms:
                    batch = queue.popleft()
                    if self._open.get(tp) is batch:
                        del self._open[tp]
                    out.append(batch)
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
                queue.clear()
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


# ---------------------------------------------------------------------------
# Configuration.
# ---------------------------------------------------------------------------
class ProducerConfig:
    """The producer's settings, checked once. Names as Kafka's, snake_case."""

    def __init__(self, *, bootstrap: str | Iterable[str] = DEFAULT_BOOTSTRAP,
                 acks: int | str = "all", linger_ms: int = 5,
                 batch_size: int = 16384 * 64, buffer_memory: int = 32 * 1024 * 1024,
                 max_block_ms: int = 60_000, compression_type: str | None = "none",
                 retries: int = 2**31 - 1, retry_backoff_ms: int = 100,
                 delivery_timeout_ms: int = 120_000, request_timeout_ms: int = 30_000,
                 max_in_flight: int = 5, max_request_bytes: int = MAX_REQUEST_BYTES_DEFAULT,
                 metadata_max_age_ms: int = 300_000,
                 partitioner: Partitioner | None = None) -> None:
        if acks == "all":
            acks = -1
        if acks not in (0, 1, -1):
            raise ValueError(f"acks must be 0, 1, -1 or 'all', not {acks!r}")
        try:
            compression = Compression[(compression_type or "none").upper()]
        except KeyError:
            raise ValueError(f"compression_type must be 'none' or 'gzip', "
                             f"not {compression_type!r}") from None
        if compression not in (Compression.NONE, Compression.GZIP):
            raise ValueError(f"compression_type {compression_type!r} is not supported; "
                             "use 'none' or 'gzip'")
        for name, value, low in (("linger_ms", linger_ms, 0), ("batch_size", batch_size, 1),
                                 ("buffer_memory", buffer_memory, 1),
                                 ("max_block_ms", max_block_ms, 0), ("retries", retries, 0),
                                 ("retry_backoff_ms", retry_backoff_ms, 0),
                                 ("request_timeout_ms", request_timeout_ms, 1),
                                 ("max_in_flight", max_in_flight, 1),
                                 ("max_request_bytes", max_request_bytes, 1)):
            if not isinstance(value, int) or value < low:
                raise ValueError(f"{name} must be an int >= {low}, not {value!r}")
        if delivery_timeout_ms < linger_ms + request_timeout_ms:
            raise ValueError(
                f"delivery_timeout_ms ({delivery_timeout_ms}) must be at least linger_ms + "
                f"request_timeout_ms ({linger_ms + request_timeout_ms}), as in Kafka: a "
                "batch needs time to wait and one request before it may expire")
        if partitioner is not None and not callable(partitioner):
            raise TypeError("partitioner must be callable(topic, key, num_partitions) -> int")
        self.bootstrap = bootstrap
        self.acks = acks
        self.linger_ms = linger_ms
        self.batch_size = batch_size
        self.buffer_memory = buffer_memory
        self.max_block_ms = max_block_ms
        self.compression = compression
        self.retries = retries
        self.retry_backoff_ms = retry_backoff_ms
        self.delivery_timeout_ms = delivery_timeout_ms
        self.request_timeout_ms = request_timeout_ms
        self.max_in_flight = max_in_flight
        self.max_request_bytes = max_request_bytes
        self.metadata_max_age_ms = metadata_max_age_ms
        self.partitioner = partitioner


# ---------------------------------------------------------------------------
# The sender: the I/O shell around the accumulator.
# ---------------------------------------------------------------------------
class Sender:
    """Runs on one event loop: drains ready batches, sends produce requests,
    settles batches from the answers, refreshes metadata when needed."""

    def __init__(self, config: ProducerConfig, accumulator: RecordAccumulator,
                 metadata: ClusterMetadata, transport: Transport,
                 clock_ms: Callable[[], int] = monotonic_ms) -> None:
        self.config = config
        self.acc = accumulator
        self.metadata = metadata
        self.transport = transport
        self._clock_ms = clock_ms
        self._wakeup = asyncio.Event()
        #: Set whenever memory is released, for async senders waiting for room.
        self.space = asyncio.Event()
        self._in_flight: dict[str, int] = {}
        self._requests: set[asyncio.Task] = set()
        self._refresh_task: asyncio.Task | None = None
        self._last_refresh_ms = -(2**62)
        self._stopping = False
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run())

    def wake(self) -> None:
        self._wakeup.set()

    async def stop(self, abort: bool) -> None:
        """End the loop: after everything is delivered, or (``abort``) now,
        failing what is left with ``CLIENT_CLOSED``."""
        self._stopping = True
        if abort:
            error = ClientClosedError("the producer closed before these records were delivered")
            for done in self.acc.abort_all():
                self.acc.complete(done, error=error)
            for task in list(self._requests):
                task.cancel()
        self.wake()
        tasks = [t for t in (self._task, self._refresh_task) if t is not None]
        if abort and self._refresh_task is not None:
            self._refresh_task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        if self._requests:
            await asyncio.gather(*self._requests, return_exceptions=True)

    async def _run(self) -> None:
        while True:
            try:
                if not await self._round():
                    return
            except asyncio.CancelledError:
                raise
            except Exception:  # a bug must not leave every send hanging silently
                logger.exception("producer sender round failed")
                await asyncio.sleep(self.config.retry_backoff_ms / 1000)

    async def _round(self) -> bool:
        """One round: expire, drain, send, then wait for something to do.
        False once stopping and everything is settled."""
        self._wakeup.clear()
        now = self._clock_ms()
        self._expire(now)
        busy = {url for url, n in self._in_flight.items() if n >= self.config.max_in_flight}
        ready, next_ms, missing = self.acc.drain(
            now, self.metadata.leader_url, busy, self.config.max_request_bytes)
        if missing or self.acc.pending_topics():
            self.metadata.request_update()
        refresh_wait = self._maybe_refresh(now)
        if refresh_wait is not None:
            next_ms = refresh_wait if next_ms is None else min(next_ms, refresh_wait)
        for url, batches in ready.items():
            self._in_flight[url] = self._in_flight.get(url, 0) + 1
            task = asyncio.get_running_loop().create_task(self._produce(url, batches))
            self._requests.add(task)
            task.add_done_callback(self._requests.discard)
        if self._stopping and not self.acc.has_incomplete() and not self._requests:
            return False
        if ready:
            return True  # more may be ready (per-request byte cap): drain again at once
        try:
            timeout = None if next_ms is None else next_ms / 1000
            await asyncio.wait_for(self._wakeup.wait(), timeout)
        except asyncio.TimeoutError:
            pass
        return True

    # -- metadata ------------------------------------------------------------------
    def _maybe_refresh(self, now_ms: int) -> int | None:
        """Start a refresh if one is due and none runs; ms until the next may
        start when one is due but held back by ``retry_backoff_ms``."""
        if not self.metadata.needs_update(now_ms) or self._refresh_task is not None:
            return None
        if not self.acc.wanted_topics():
            return None
        wait = self._last_refresh_ms + self.config.retry_backoff_ms - now_ms
        if wait > 0:
            return wait
        self._last_refresh_ms = now_ms
        self._refresh_task = asyncio.get_running_loop().create_task(self._refresh())
        return None

    async def _refresh(self) -> None:
        try:
            await self.metadata.refresh(self.acc.wanted_topics())
        except KraftlogError as exc:
            logger.debug("metadata refresh failed: %s", exc)
        else:
            for topic in self.acc.pending_topics():
                error = self.metadata.topic_errors.get(topic)
                if error is not None and not error.retriable:
                    group = self.acc.fail_pending(topic)
                    if group is not None:
                        self.acc.complete(group, error=error)
                        self.space.set()
                    continue
                try:
                    group = self.acc.assign_pending(topic)
                except Exception as exc:  # the application's partitioner failed
                    group = self.acc.fail_pending(topic)
                    if group is not None:
                        self.acc.complete(group, error=KraftlogError(
                            "INVALID_PARTITIONS", f"the partitioner failed: {exc!r}",
                            retriable=False))
                        self.space.set()
                    continue
                if group is not None:
                    self.acc.finish_forwarded(group)
        finally:
            self._refresh_task = None
            self.wake()

    # -- expiry ----------------------------------------------------------------------
    def _expire(self, now_ms: int) -> None:
        expired = self.acc.expired(now_ms)
        for done in expired:
            self.acc.complete(done, error=self._expiry_error(done))
        if expired:
            self.space.set()

    def _expiry_error(self, done: _Completion) -> KraftlogError:
        timeout_ms = self.config.delivery_timeout_ms
        if isinstance(done, _PendingGroup):
            cause = self.metadata.topic_errors.get(done.topic)
            if cause is None or cause.code == "UNKNOWN_TOPIC_OR_PARTITION":
                return error_from({
                    "code": "UNKNOWN_TOPIC_OR_PARTITION",
                    "message": f"topic {done.topic!r} was not in the metadata within "
                               f"delivery_timeout_ms ({timeout_ms} ms); create it first"})
            where = f"topic {done.topic!r}"
        else:
            cause = done.last_error
            where = f"{done.topic}-{done.partition}"
            count = self.metadata.partition_counts.get(done.topic)
            if count is not None and done.partition >= count:
                return error_from({
                    "code": "UNKNOWN_TOPIC_OR_PARTITION",
                    "message": f"topic {done.topic!r} has {count} partitions, no partition "
                               f"{done.partition} (waited delivery_timeout_ms, {timeout_ms} ms)"})
            if cause is None and self.metadata.leader_url((done.topic, done.partition)) is None:
                cause = self.metadata.topic_errors.get(done.topic)
        if cause is None:
            return RequestTimedOutError(
                f"records for {where} expired: {timeout_ms} ms (delivery_timeout_ms) passed "
                "since the batch was created")
        return error_from({"code": cause.code, "message": (
            f"records for {where} expired after delivery_timeout_ms ({timeout_ms} ms); "
            f"last error: {cause.message}"), **cause.details})

    # -- one request -------------------------------------------------------------------
    async def _produce(self, url: str, batches: list[ProducerBatch]) -> None:
        config = self.config
        groups: dict[tuple[str, int], list[ProducerBatch]] = {}
        settled = False
        try:
            for batch in batches:
                if batch.payload is None:
                    await self._build(batch)
                batch.attempts += 1
                groups.setdefault((batch.topic, batch.partition), []).append(batch)
            body = {"acks": config.acks, "timeout_ms": config.request_timeout_ms,
                    "partitions": [
                        {"topic": topic, "partition": partition,
                         "records": bs[0].payload if len(bs) == 1
                         else b"".join(b.payload for b in bs)}
                        for (topic, partition), bs in groups.items()]}
            if config.acks == 0:
                # Nobody waits for the broker's answer: settle now (offset -1).
                for batch in batches:
                    self.acc.complete(batch)
                settled = True
            try:
                answer = await self.transport.request(
                    url, "/v1/produce", body,
                    timeout_ms=config.request_timeout_ms + RESPONSE_MARGIN_MS)
            except KraftlogError as exc:
                if exc.code == "BROKER_NOT_AVAILABLE":
                    self.metadata.forget_broker_url(url)
                if not settled:
                    for group in groups.values():
                        self._failed(group, exc)
                settled = True
                return
            if not settled:
                self._settle(url, groups, answer)
            settled = True
        except asyncio.CancelledError:
            if not settled:
                error = ClientClosedError("the producer closed while the request was in flight")
                for batch in batches:
                    self.acc.complete(batch, error=error)
            raise
        except Exception as exc:  # a bug or a malformed answer: fail, never hang
            logger.exception("produce request to %s failed", url)
            if not settled:
                error = KraftlogError("UNKNOWN_SERVER_ERROR", f"produce failed: {exc!r}",
                                      retriable=False)
                for batch in batches:
                    self.acc.complete(batch, error=error)
        finally:
            self._in_flight[url] -= 1
            self.acc.sent(batches)
            # Before waking: the loop must not see this task still in flight.
            self._requests.discard(asyncio.current_task())
            self.space.set()
            self.wake()

    async def _build(self, batch: ProducerBatch) -> None:
        """Turn a drained batch into its bytes (kept for retries) and drop the
        builder's copy. Compression runs in a worker thread: zlib releases
        the GIL, and a megabyte takes long enough to stall the loop."""
        builder = batch.builder
        batch.record_count = builder.record_count
        if builder.compression == Compression.NONE:
            batch.payload = builder.build()
        else:
            batch.payload = await asyncio.get_running_loop().run_in_executor(
                None, builder.build)
        batch.builder = None

    def _settle(self, url: str, groups: dict[tuple[str, int], list[ProducerBatch]],
                answer: dict) -> None:
        for entry in answer.get("partitions") or ():
            batches = groups.pop((entry.get("topic"), entry.get("partition")), None)
            if batches is None:
                continue
            error = error_from(entry.get("error"))
            if error is not None:
                self._failed(batches, error)
                continue
            offset = entry["base_offset"]
            append_time_ms = entry.get("log_append_time_ms", -1)
            if append_time_ms is None:
                append_time_ms = -1
            for batch in batches:
                self.acc.complete(batch, base_offset=offset, log_append_time_ms=append_time_ms)
                offset += batch.record_count
        for (topic, partition), batches in groups.items():
            self._failed(batches, KraftlogError(
                "UNKNOWN_SERVER_ERROR",
                f"{url} answered the produce request without partition {topic}-{partition}",
                retriable=True))

    def _failed(self, batches: list[ProducerBatch], error: KraftlogError) -> None:
        """Retry ``batches`` of one partition after a retriable error while
        retries and delivery time remain; else fail them."""
        now = self._clock_ms()
        head = batches[0]
        if error.code in METADATA_CODES:
            self.metadata.learn_leader(head.topic, head.partition, error)
        elif error.retriable:
            self.metadata.request_update()
        retry_at = now + self.config.retry_backoff_ms
        if (error.retriable and head.attempts <= self.config.retries
                and all(retry_at < b.created_ms + self.config.delivery_timeout_ms
                        for b in batches)):
            for batch in batches:
                batch.last_error = error
            self.acc.requeue(batches, retry_at)
            return
        for batch in batches:
            self.acc.complete(batch, error=error)


# ---------------------------------------------------------------------------
# The public producers.
# ---------------------------------------------------------------------------
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
    broker; 1 keeps order across retries), ``max_request_bytes``,
    ``metadata_max_age_ms``, ``partitioner`` (``f(topic, key_bytes,
    num_partitions) -> partition``, called under the producer's lock: keep it
    quick).
    """

    def __init__(self, bootstrap: str | Iterable[str] = DEFAULT_BOOTSTRAP, **settings: Any
                 ) -> None:
        self.config = config = ProducerConfig(bootstrap=bootstrap, **settings)
        self._transport = Transport(request_timeout_ms=config.request_timeout_ms)
        self._metadata = ClusterMetadata(
            self._transport, config.bootstrap, metadata_max_age_ms=config.metadata_max_age_ms,
            request_timeout_ms=config.request_timeout_ms)
        self._acc = RecordAccumulator(
            batch_size=config.batch_size, buffer_memory=config.buffer_memory,
            linger_ms=config.linger_ms, delivery_timeout_ms=config.delivery_timeout_ms,
            compression=config.compression, partition_counts=self._metadata.partition_counts,
            partitioner=config.partitioner, wake=self._wake)
        self._sender = Sender(config, self._acc, self._metadata, self._transport)
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

    async def _send_when_room(self, *record: Any) -> RecordHandle:
        deadline_ms = monotonic_ms() + self.config.max_block_ms
        while True:
            remaining_ms = deadline_ms - monotonic_ms()
            if remaining_ms <= 0:
                raise BufferExhaustedError(
                    f"buffer_memory ({self.config.buffer_memory} bytes) stayed full for "
                    f"max_block_ms ({self.config.max_block_ms} ms)")
            self._sender.space.clear()
            handle = self._acc.append(*record)
            if handle is not None:
                return handle
            try:
                await asyncio.wait_for(self._sender.space.wait(), remaining_ms / 1000)
            except asyncio.TimeoutError:
                pass

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

    async def partitions_for(self, topic: str) -> set[int]:
        """The partitions of ``topic`` (asks the brokers when not cached);
        raises the topic's error (e.g. unknown) if there is one."""
        if self._metadata.partition_counts.get(topic) is None:
            await self._metadata.refresh([topic])
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

    def close(self, timeout_ms: int | None = None) -> None:
        """As ``AsyncProducer.close``; then stops the loop thread."""
        if self._closed:
            return
        self._closed = True
        try:
            self._thread.run(self._producer.close(timeout_ms))
        finally:
            self._thread.stop()
