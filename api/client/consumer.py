"""The consumer: assigned partitions, prefetched batches, records on poll.

Without consumer groups (they come later): the application ``assign``s
partitions and, optionally, ``seek``s; each partition then has a
*position*, the offset of the next record ``poll`` returns.

How records travel::

    fetcher (per leader broker:       FetchBuffer (bounded by      poll()
    one POST /v1/fetch in flight) ──> max_buffered_bytes, raw  ──> decodes a
                                      batches, decoded lazily)     batch at a time

A background task groups the fetchable partitions by leader and keeps one
fetch in flight per broker, so the next fetch overlaps the application's
processing. Responses go into the ``FetchBuffer`` as raw bytes; ``poll``
decodes one batch at a time (one msgpack ``Unpacker`` per batch), skips
records below the position (a fetch may start mid-batch), and returns at
most ``max_poll_records``.

Errors: ``NOT_LEADER_OR_FOLLOWER`` and other metadata errors refresh the
metadata and fetching carries on with the new leader. ``OFFSET_OUT_OF_RANGE``
applies ``auto_offset_reset``: "earliest" moves to the log start offset,
"latest" to the high watermark, "none" makes ``poll`` raise
``OffsetOutOfRangeError`` until the application seeks. A partition without a
position is reset the same way (with "none": ``NoOffsetForPartitionError``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from bisect import bisect_left
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from operator import itemgetter
from typing import Any

import msgpack

from api.client._sync import LoopThread
from api.client._transport import (
    DEFAULT_BOOTSTRAP, ClusterMetadata, Transport, monotonic_ms)
from api.client._types import (
    ConsumerRecord, OffsetAndTimestamp, TopicMetadata, TopicPartition, as_topic_partition)
from api.client.errors import (
    METADATA_CODES, CorruptRecordError, KraftlogError, NoOffsetForPartitionError,
    OffsetOutOfRangeError, RequestTimedOutError, UnknownTopicOrPartitionError, error_from)
from api.client.group import GroupMember
from storage import batch as batch_format

logger = logging.getLogger(__name__)

EARLIEST = -2
LATEST = -1
_RESET_TIMESTAMPS = {"earliest": EARLIEST, "latest": LATEST}
_new_tuple = tuple.__new__
_record_offset = itemgetter(2)


# ---------------------------------------------------------------------------
# Decoding: the consumer's hot path.
# ---------------------------------------------------------------------------
def decode_batch(topic: str, partition: int, view: memoryview, *, check_crc: bool = True,
                 include_headers: bool = True) -> list[ConsumerRecord]:
    """Every record of one whole batch, as ``ConsumerRecord``s.

    Uncompressed batches are decoded here with one ``Unpacker`` and no
    per-record function calls; compressed ones go through
    ``storage.batch.iter_records``, which also inflates them. Both check the
    header, the CRC (unless ``check_crc`` is off) and that the records
    section holds exactly ``record_count`` records and nothing else.
    """
    header = batch_format.parse_header(view)
    try:
        batch_format.check_header(header, len(view), batch_format.MAX_BATCH_BYTES, strict=False)
        end = header.size_bytes
        if check_crc and batch_format.compute_crc(view, 0, end) != header.crc:
            raise batch_format.CorruptRecordError(
                f"CRC mismatch in batch at offset {header.base_offset}")
        timestamp_type = 1 if header.attributes & batch_format.TIMESTAMP_TYPE_BIT else 0
        if header.compression != batch_format.Compression.NONE:
            return [ConsumerRecord(topic, partition, r.offset, r.timestamp, r.key, r.value,
                                   r.headers if include_headers else (), timestamp_type)
                    for r in batch_format.iter_records(view, verify_crc=False)]
        section = view[batch_format.HEADER_SIZE:end]
        unpacker = msgpack.Unpacker(raw=False, use_list=False,
                                    max_buffer_size=max(len(section), 1))
        unpacker.feed(section)
        base_offset = header.base_offset
        base_timestamp = header.base_timestamp
        cls = ConsumerRecord
        if include_headers:
            records = [_new_tuple(cls, (topic, partition, base_offset + od, base_timestamp + td,
                                        k, v, h, timestamp_type))
                       for td, od, k, v, h in unpacker]
        else:
            records = [_new_tuple(cls, (topic, partition, base_offset + od, base_timestamp + td,
                                        k, v, (), timestamp_type))
                       for td, od, k, v, _h in unpacker]
        if unpacker.tell() != len(section) or len(records) != header.record_count:
            raise batch_format.CorruptRecordError(
                f"batch at offset {base_offset} holds {len(records)} decodable records in "
                f"{unpacker.tell()} of {len(section)} bytes; its header says "
                f"{header.record_count}")
        return records
    except batch_format.RecordFormatError as exc:
        raise CorruptRecordError(f"{topic}-{partition}: {exc}") from None
    except (ValueError, TypeError, msgpack.UnpackException) as exc:
        raise CorruptRecordError(
            f"{topic}-{partition}: records of batch at offset {header.base_offset} do not "
            f"decode: {exc}") from None


class PartitionState:
    """What the consumer knows of one assigned partition.

    ``position`` is the next offset ``poll`` returns (None: to be reset with
    ``reset``); ``fetch_position`` the next offset to fetch, ahead of
    ``position`` by what the buffer holds. ``generation`` changes on every
    seek or reset, so fetches and buffered data from before are dropped.
    ``error`` is raised by ``poll`` until the application seeks.
    """

    __slots__ = ("tp", "position", "fetch_position", "generation", "reset", "error",
                 "high_watermark", "log_start_offset", "retry_at_ms")

    def __init__(self, tp: TopicPartition, reset: str) -> None:
        self.tp = tp
        self.position: int | None = None
        self.fetch_position: int | None = None
        self.generation = 0
        self.reset = reset
        self.error: KraftlogError | None = None
        self.high_watermark = -1
        self.log_start_offset = -1
        self.retry_at_ms = 0

    def seek(self, offset: int | None, reset: str | None = None) -> None:
        self.position = self.fetch_position = offset
        if reset is not None:
            self.reset = reset
        self.generation += 1
        self.error = None
        self.retry_at_ms = 0

    def fetchable(self, now_ms: int) -> bool:
        return (self.fetch_position is not None and self.error is None
                and self.retry_at_ms <= now_ms)


class _CompletedFetch:
    """The records a fetch returned for one partition, decoded a batch at a
    time as ``poll`` asks."""

    __slots__ = ("state", "generation", "data", "batches", "records", "index",
                 "batch_next_offset", "size_bytes")

    def __init__(self, state: PartitionState, data: bytes,
                 batches: list[tuple[batch_format.BatchHeader, memoryview]]) -> None:
        self.state = state
        self.generation = state.generation
        self.data = data
        self.batches = deque(batches)
        self.records: list[ConsumerRecord] = []
        self.index = 0
        self.batch_next_offset = -1
        self.size_bytes = len(data)


class FetchBuffer:
    """Fetched, not yet polled data, bounded by bytes. Pure: no I/O."""

    def __init__(self, *, check_crcs: bool = True, include_headers: bool = True) -> None:
        self.check_crcs = check_crcs
        self.include_headers = include_headers
        self.buffered_bytes = 0
        self._fetches: deque[_CompletedFetch] = deque()

    def __len__(self) -> int:
        return len(self._fetches)

    def add(self, state: PartitionState, data: bytes) -> int | None:
        """Buffer the record batches of a fetch answer; the offset after the
        last whole batch (the next fetch offset), or None if none was whole."""
        batches = list(batch_format.iter_batches(data))
        if not batches:
            return None
        self._fetches.append(_CompletedFetch(state, data, batches))
        self.buffered_bytes += len(data)
        return batches[-1][0].next_offset

    def discard(self, tp: TopicPartition | None = None) -> None:
        """Drop buffered data of ``tp`` (all data for None)."""
        keep = deque(f for f in self._fetches if tp is not None and f.state.tp != tp)
        self.buffered_bytes = sum(f.size_bytes for f in keep)
        self._fetches = keep

    def drain(self, max_records: int) -> list[ConsumerRecord]:
        """Up to ``max_records`` records at their partitions' positions,
        advancing the positions. A batch that does not decode sets its
        partition's ``error`` and drops the partition's buffered data."""
        out: list[ConsumerRecord] = []
        fetches = self._fetches
        while fetches and len(out) < max_records:
            fetch = fetches[0]
            state = fetch.state
            if (state.generation != fetch.generation or state.position is None
                    or state.error is not None):
                self._pop()
                continue
            if fetch.index >= len(fetch.records):
                if fetch.batch_next_offset > state.position:
                    state.position = fetch.batch_next_offset
                if not self._decode_next(fetch):
                    self._pop()
                continue
            wanted = max_records - len(out)
            records = fetch.records
            start = fetch.index
            stop = min(len(records), start + wanted)
            out.extend(records[start:stop] if start or stop < len(records) else records)
            fetch.index = stop
            state.position = records[stop - 1][2] + 1
        return out

    def _decode_next(self, fetch: _CompletedFetch) -> bool:
        """Decode the next batch of ``fetch`` holding records at or after the
        position; False when none is left."""
        state = fetch.state
        while fetch.batches:
            header, view = fetch.batches.popleft()
            if header.next_offset <= state.position or header.is_control:
                # Below the position (a fetch may start mid-batch), or a
                # control batch (transaction markers): nothing to return.
                state.position = max(state.position, header.next_offset)
                continue
            try:
                records = decode_batch(state.tp.topic, state.tp.partition, view,
                                       check_crc=self.check_crcs,
                                       include_headers=self.include_headers)
            except KraftlogError as exc:
                state.error = exc
                return False
            start = 0
            if records and records[0][2] < state.position:
                start = bisect_left(records, state.position, key=_record_offset)
            fetch.records = records
            fetch.index = start
            fetch.batch_next_offset = header.next_offset
            return True
        return False

    def _pop(self) -> None:
        fetch = self._fetches.popleft()
        self.buffered_bytes -= fetch.size_bytes


# ---------------------------------------------------------------------------
# Configuration.
# ---------------------------------------------------------------------------
class ConsumerConfig:
    """The consumer's settings, checked once. Names as Kafka's, snake_case."""

    def __init__(self, *, bootstrap: str | Iterable[str] = DEFAULT_BOOTSTRAP,
                 auto_offset_reset: str = "latest", fetch_min_bytes: int = 1,
                 fetch_max_wait_ms: int = 500, fetch_max_bytes: int = 50 * 1024 * 1024,
                 max_partition_fetch_bytes: int = 1024 * 1024, max_poll_records: int = 500,
                 max_buffered_bytes: int = 64 * 1024 * 1024, request_timeout_ms: int = 30_000,
                 retry_backoff_ms: int = 100, metadata_max_age_ms: int = 300_000,
                 check_crcs: bool = True, include_headers: bool = True,
                 consumer_timeout_ms: int | None = None, group_id: str | None = None,
                 group_instance_id: str | None = None, session_timeout_ms: int = 45_000,
                 rebalance_timeout_ms: int = 300_000, enable_auto_commit: bool = True,
                 auto_commit_interval_ms: int = 5000,
                 group_remote_assignor: str | None = None) -> None:
        if auto_offset_reset not in ("earliest", "latest", "none"):
            raise ValueError(f"auto_offset_reset must be 'earliest', 'latest' or 'none', "
                             f"not {auto_offset_reset!r}")
        for name, value, low, high in (
                ("fetch_min_bytes", fetch_min_bytes, 0, 2**31 - 1),
                ("fetch_max_wait_ms", fetch_max_wait_ms, 0, 30_000),
                ("fetch_max_bytes", fetch_max_bytes, 1, 2**31 - 1),
                ("max_partition_fetch_bytes", max_partition_fetch_bytes, 1, 2**31 - 1),
                ("max_poll_records", max_poll_records, 1, 10_000_000),
                ("max_buffered_bytes", max_buffered_bytes, 1, 2**40),
                ("request_timeout_ms", request_timeout_ms, 1, 2**31 - 1),
                ("retry_backoff_ms", retry_backoff_ms, 0, 2**31 - 1),
                ("session_timeout_ms", session_timeout_ms, 1, 2**31 - 1),
                ("rebalance_timeout_ms", rebalance_timeout_ms, 0, 2**31 - 1),
                ("auto_commit_interval_ms", auto_commit_interval_ms, 1, 2**31 - 1)):
            if not isinstance(value, int) or not low <= value <= high:
                raise ValueError(f"{name} must be an int in [{low}, {high}], not {value!r}")
        self.bootstrap = bootstrap
        self.auto_offset_reset = auto_offset_reset
        self.fetch_min_bytes = fetch_min_bytes
        self.fetch_max_wait_ms = fetch_max_wait_ms
        self.fetch_max_bytes = fetch_max_bytes
        self.max_partition_fetch_bytes = max_partition_fetch_bytes
        self.max_poll_records = max_poll_records
        self.max_buffered_bytes = max_buffered_bytes
        self.request_timeout_ms = request_timeout_ms
        self.retry_backoff_ms = retry_backoff_ms
        self.metadata_max_age_ms = metadata_max_age_ms
        self.check_crcs = check_crcs
        self.include_headers = include_headers
        self.consumer_timeout_ms = consumer_timeout_ms
        if group_id is not None and (not isinstance(group_id, str) or not group_id):
            raise ValueError(f"group_id must be a non-empty str, not {group_id!r}")
        self.group_id = group_id
        self.group_instance_id = group_instance_id
        self.session_timeout_ms = session_timeout_ms
        self.rebalance_timeout_ms = rebalance_timeout_ms
        self.enable_auto_commit = bool(enable_auto_commit)
        self.auto_commit_interval_ms = auto_commit_interval_ms
        self.group_remote_assignor = group_remote_assignor


def first_offsets(records: Iterable[ConsumerRecord]) -> dict[TopicPartition, int]:
    """Per partition, the offset of the first of ``records`` (records taken
    from a poll but not yet handed to the application: where it really is)."""
    firsts: dict[TopicPartition, int] = {}
    for record in records:
        firsts.setdefault(TopicPartition(record.topic, record.partition), record.offset)
    return firsts


# ---------------------------------------------------------------------------
# The asyncio consumer.
# ---------------------------------------------------------------------------
class AsyncConsumer:
    """An asyncio consumer of assigned partitions.

    ::

        async with AsyncConsumer(bootstrap=url, auto_offset_reset="earliest") as consumer:
            consumer.assign([TopicPartition("orders", 0)])
            async for record in consumer:
                print(record.offset, record.value)

    Settings (Kafka's names, snake_case): ``bootstrap``, ``auto_offset_reset``
    ("earliest" | "latest" | "none"), ``fetch_min_bytes``,
    ``fetch_max_wait_ms`` (the long poll), ``fetch_max_bytes`` (per fetch),
    ``max_partition_fetch_bytes``, ``max_poll_records``,
    ``max_buffered_bytes`` (prefetched data; may be passed by one batch),
    ``request_timeout_ms`` (per request, and the bound on ``position`` and the
    offset lookups), ``retry_backoff_ms``, ``metadata_max_age_ms``,
    ``check_crcs``, ``include_headers``, ``consumer_timeout_ms`` (iteration
    ends after this long without records; None: never).
    """

    def __init__(self, bootstrap: str | Iterable[str] = DEFAULT_BOOTSTRAP, **settings: Any
                 ) -> None:
        self.config = config = ConsumerConfig(bootstrap=bootstrap, **settings)
        self._transport = Transport(request_timeout_ms=config.request_timeout_ms)
        self._metadata = ClusterMetadata(
            self._transport, config.bootstrap, metadata_max_age_ms=config.metadata_max_age_ms,
            request_timeout_ms=config.request_timeout_ms)
        self._buffer = FetchBuffer(check_crcs=config.check_crcs,
                                   include_headers=config.include_headers)
        self._states: dict[TopicPartition, PartitionState] = {}
        self._wakeup = asyncio.Event()
        self._data = asyncio.Event()
        self._in_flight: dict[str, asyncio.Task] = {}
        self._refresh_task: asyncio.Task | None = None
        self._last_refresh_ms = -(2**62)
        self._fetcher: asyncio.Task | None = None
        self._iter_records: deque[ConsumerRecord] = deque()
        self._closed = False
        self._group: GroupMember | None = None

    # -- lifecycle ----------------------------------------------------------------
    async def start(self) -> None:
        """Start the background fetcher (``poll`` does it too)."""
        self._check_open()
        if self._fetcher is None:
            self._fetcher = asyncio.get_running_loop().create_task(self._fetch_loop())

    async def __aenter__(self) -> "AsyncConsumer":
        await self.start()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    async def close(self) -> None:
        if self._closed:
            return
        if self._group is not None:
            await self._group.close()  # commits (auto-commit) and leaves the group
        self._closed = True
        tasks = [t for t in (self._fetcher, self._refresh_task, *self._in_flight.values())
                 if t is not None]
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        self._buffer.discard()
        await self._transport.close()

    def _check_open(self) -> None:
        if self._closed:
            raise KraftlogError("CLIENT_CLOSED", "the consumer is closed")

    # -- assignment and positions --------------------------------------------------------
    def assign(self, partitions: Iterable[TopicPartition | tuple[str, int]]) -> None:
        """Consume exactly ``partitions`` from now on. Partitions kept from
        the previous assignment keep their positions; new ones start without
        one (resolved by ``auto_offset_reset`` unless you ``seek``)."""
        self._check_open()
        if self._group is not None:
            raise ValueError("this consumer subscribed to topics: its group assigns its "
                             "partitions (use assign() on a consumer without subscribe())")
        self._assign(partitions)

    # -- groups ---------------------------------------------------------------------------
    def subscribe(self, topics: Iterable[str] | None = None, pattern: str | None = None, *,
                  on_partitions_revoked: Callable | None = None,
                  on_partitions_assigned: Callable | None = None,
                  on_partitions_lost: Callable | None = None) -> None:
        """Join ``group_id`` and consume what the group assigns: the
        partitions of ``topics``, or of every topic whose whole name matches
        ``pattern`` (a regular expression; new matching topics are picked
        up). The listeners get sets of partitions (may be coroutine
        functions); they run inside ``poll``. ``on_partitions_lost`` (default:
        ``on_partitions_revoked``) is called without a commit when the
        member was removed from the group."""
        self._check_open()
        config = self.config
        if config.group_id is None:
            raise ValueError("subscribe() needs a group_id: Consumer(..., group_id='my-app')")
        if (topics is None) == (pattern is None):
            raise ValueError("give exactly one of topics and pattern")
        if topics is not None:
            topics = [topics] if isinstance(topics, str) else list(topics)
            if not topics or not all(isinstance(t, str) and t for t in topics):
                raise ValueError(f"topics must be non-empty topic names, not {topics!r}")
        if self._group is None:
            self._group = GroupMember(
                self, config.group_id, instance_id=config.group_instance_id,
                session_timeout_ms=config.session_timeout_ms,
                rebalance_timeout_ms=config.rebalance_timeout_ms,
                auto_commit=config.enable_auto_commit,
                auto_commit_interval_ms=config.auto_commit_interval_ms,
                assignor=config.group_remote_assignor, retry_backoff_ms=config.retry_backoff_ms)
        self._group.subscribe(topics, pattern, on_partitions_revoked, on_partitions_assigned,
                              on_partitions_lost)

    def _member(self) -> GroupMember:
        if self._group is None:
            raise ValueError("commit and committed need a group member: set group_id and "
                             "subscribe() first")
        return self._group

    async def commit(self, offsets: Mapping[Any, int] | None = None) -> None:
        """Commit ``offsets`` (tp -> next offset to read), or the positions of
        everything ``poll`` returned so far. Raises ``CommitFailedError`` when
        the group refuses (the member's partitions moved)."""
        self._check_open()
        group = self._member()
        if offsets is None:
            positions = self._consumed_positions(group.owned)
        else:
            positions = {as_topic_partition(tp): offset for tp, offset in offsets.items()}
        await group.commit(positions)

    async def committed(self, tps: Iterable[Any]) -> dict[TopicPartition, int | None]:
        """The group's committed offsets (None where nothing is committed)."""
        self._check_open()
        wanted = [as_topic_partition(tp) for tp in tps]
        found = await self._member().fetch_committed(wanted)
        return {tp: found.get(tp) for tp in wanted}

    def _assign_for_group(self, partitions: Iterable[TopicPartition],
                          committed: Mapping[TopicPartition, int] | None = None) -> None:
        """The group changed this member's partitions: new ones start at their
        committed offset, or by ``auto_offset_reset``."""
        self._assign(partitions)
        for tp, offset in (committed or {}).items():
            state = self._states.get(tp)
            if state is not None and offset >= 0:
                state.seek(offset)
                self._moved([state])

    def _consumed_positions(self, tps: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        """Where the application is in each partition: the offset after the
        last record ``poll`` handed it."""
        held = first_offsets(self._iter_records)  # taken for iteration, not handed out
        out = {}
        for tp in tps:
            state = self._states.get(tp)
            if tp in held:
                out[tp] = held[tp]
            elif state is not None and state.position is not None:
                out[tp] = state.position
        return out

    def _assign(self, partitions: Iterable[TopicPartition | tuple[str, int]]) -> None:
        wanted = [as_topic_partition(tp) for tp in partitions]
        states = {}
        for tp in wanted:
            states[tp] = self._states.get(tp) or PartitionState(tp, self.config.auto_offset_reset)
        for tp in self._states.keys() - states.keys():
            self._buffer.discard(tp)
        self._iter_records = deque(r for r in self._iter_records
                                   if TopicPartition(r.topic, r.partition) in states)
        self._states = states
        self._metadata.topics_wanted = {tp.topic for tp in states}
        self._metadata.request_update()
        self._wakeup.set()

    def assignment(self) -> set[TopicPartition]:
        return set(self._states)

    def _state(self, tp: Any) -> PartitionState:
        tp = as_topic_partition(tp)
        state = self._states.get(tp)
        if state is None:
            raise ValueError(f"{tp.topic}-{tp.partition} is not assigned to this consumer")
        return state

    def seek(self, tp: TopicPartition | tuple[str, int], offset: int) -> None:
        """Make ``offset`` the next offset ``poll`` returns for ``tp``."""
        if not isinstance(offset, int) or offset < 0:
            raise ValueError(f"offset must be an int >= 0, not {offset!r}")
        state = self._state(tp)
        state.seek(offset)
        self._moved([state])

    def _seek_reset(self, tps: Iterable[Any] | None, reset: str) -> None:
        states = list(self._states.values()) if tps is None else [self._state(tp) for tp in tps]
        for state in states:
            state.seek(None, reset)
        self._moved(states)

    def _moved(self, states: list[PartitionState]) -> None:
        """Drop what was fetched, or taken for iteration, before a seek."""
        moved = {state.tp for state in states}
        for tp in moved:
            self._buffer.discard(tp)
        self._iter_records = deque(r for r in self._iter_records
                                   if TopicPartition(r.topic, r.partition) not in moved)
        self._wakeup.set()

    def seek_to_beginning(self, tps: Iterable[Any] | None = None) -> None:
        """Move to the log start offset (of every assigned partition for
        None); resolved lazily, by the fetcher or ``position``."""
        self._seek_reset(tps, "earliest")

    def seek_to_end(self, tps: Iterable[Any] | None = None) -> None:
        """Move to the high watermark: only records produced from now on."""
        self._seek_reset(tps, "latest")

    async def position(self, tp: TopicPartition | tuple[str, int]) -> int:
        """The next offset ``poll`` returns for ``tp``, looked up now when the
        partition has none (``NoOffsetForPartitionError`` with "none")."""
        self._check_open()
        state = self._state(tp)
        for record in self._iter_records:  # taken for iteration, not yet handed out
            if (record.topic, record.partition) == state.tp:
                return record.offset
        deadline_ms = monotonic_ms() + self.config.request_timeout_ms
        while state.position is None:
            if state.error is not None:
                raise state.error
            await self._reset_positions([state], deadline_ms)
        return state.position

    async def _reset_positions(self, states: list[PartitionState],
                               deadline_ms: int | None) -> None:
        """Give ``states`` (without a position) one by their reset strategy.
        With a deadline, retriable failures are retried until it; without,
        one attempt is made and failures wait for the next round."""
        query: dict[TopicPartition, int] = {}
        generations = {}
        for state in states:
            if state.reset == "none":
                state.error = NoOffsetForPartitionError(
                    f"{state.tp.topic}-{state.tp.partition} has no position and "
                    "auto_offset_reset is 'none': seek() first",
                    partitions={state.tp: None})
                self._data.set()
                continue
            if deadline_ms is None and self._metadata.leader_url(state.tp) is None:
                # No leader known yet: the refresh this asks for wakes the
                # fetch loop, which tries again then (no backoff needed).
                self._metadata.request_update()
                continue
            query[state.tp] = _RESET_TIMESTAMPS[state.reset]
            generations[state.tp] = state.generation
        if not query:
            return
        if deadline_ms is None:
            found, errors = await self._list_offsets_once(query)
        else:
            found, errors = await self._list_offsets(query, deadline_ms), {}
        for tp, (offset, _timestamp) in found.items():
            state = self._states.get(tp)
            if state is not None and state.generation == generations[tp] and offset >= 0:
                state.seek(offset)
        now = monotonic_ms()
        for tp, error in errors.items():
            state = self._states.get(tp)
            if state is None or state.generation != generations[tp]:
                continue
            if error.retriable:
                state.retry_at_ms = now + self.config.retry_backoff_ms
            else:
                state.error = error
                self._data.set()

    # -- offsets lookups -------------------------------------------------------------------
    async def _list_offsets_once(self, query: Mapping[TopicPartition, int]
                                 ) -> tuple[dict[TopicPartition, tuple[int, int]],
                                            dict[TopicPartition, KraftlogError]]:
        """One ``/v1/offsets`` round to each leader: (answers, errors)."""
        by_url: dict[str, list[TopicPartition]] = {}
        errors: dict[TopicPartition, KraftlogError] = {}
        for tp in query:
            url = self._metadata.leader_url(tp)
            if url is None:
                errors[tp] = self._metadata.topic_errors.get(tp.topic) or KraftlogError(
                    "LEADER_NOT_AVAILABLE", f"no known leader for {tp.topic}-{tp.partition}")
                self._metadata.request_update()
            else:
                by_url.setdefault(url, []).append(tp)

        async def ask(url: str, tps: list[TopicPartition]) -> Any:
            try:
                return await self._transport.request(url, "/v1/offsets", {"partitions": [
                    {"topic": tp.topic, "partition": tp.partition, "timestamp": query[tp]}
                    for tp in tps]})
            except KraftlogError as exc:
                return exc

        answers = await asyncio.gather(*(ask(url, tps) for url, tps in by_url.items()))
        found: dict[TopicPartition, tuple[int, int]] = {}
        for (url, tps), answer in zip(by_url.items(), answers):
            if isinstance(answer, KraftlogError):
                if answer.code == "BROKER_NOT_AVAILABLE":
                    self._metadata.forget_broker_url(url)
                for tp in tps:
                    errors[tp] = answer
                continue
            asked = set(tps)
            for entry in answer.get("partitions") or ():
                tp = TopicPartition(entry.get("topic"), entry.get("partition"))
                if tp not in asked:
                    continue
                asked.discard(tp)
                error = error_from(entry.get("error"))
                if error is not None:
                    if error.code in METADATA_CODES:
                        self._metadata.learn_leader(tp.topic, tp.partition, error)
                    errors[tp] = error
                else:
                    found[tp] = (entry["offset"], entry.get("timestamp", -1))
            for tp in asked:
                errors[tp] = KraftlogError("UNKNOWN_SERVER_ERROR",
                                           f"{url} did not answer for {tp}", retriable=True)
        return found, errors

    async def _list_offsets(self, query: Mapping[TopicPartition, int], deadline_ms: int
                            ) -> dict[TopicPartition, tuple[int, int]]:
        """Offsets for ``query`` (tp -> timestamp or EARLIEST/LATEST),
        retrying retriable errors until ``deadline_ms``."""
        remaining = dict(query)
        found: dict[TopicPartition, tuple[int, int]] = {}
        topics = {tp.topic for tp in remaining}
        if any(self._metadata.leader_url(tp) is None for tp in remaining):
            await self._refresh_metadata(topics)
        while True:
            answers, errors = await self._list_offsets_once(remaining)
            found.update(answers)
            for tp in answers:
                remaining.pop(tp)
            if not remaining:
                return found
            fatal = [e for e in errors.values() if not e.retriable]
            if fatal:
                raise fatal[0]
            wait_ms = min(self.config.retry_backoff_ms, deadline_ms - monotonic_ms())
            if wait_ms <= 0:
                error = next(iter(errors.values()), None)
                raise RequestTimedOutError(
                    f"offsets of {sorted(remaining)} not found within request_timeout_ms "
                    f"({self.config.request_timeout_ms} ms); last error: {error}",
                    **({"last_code": error.code} if error else {}))
            await asyncio.sleep(wait_ms / 1000)
            await self._refresh_metadata(topics)

    async def _refresh_metadata(self, topics: Iterable[str] | None = None) -> None:
        try:
            await self._metadata.refresh(topics)
        except KraftlogError as exc:
            if not exc.retriable:
                raise
            logger.debug("metadata refresh failed: %s", exc)

    async def _offsets(self, tps: Iterable[Any], timestamp: int) -> dict[TopicPartition, int]:
        self._check_open()
        query = {as_topic_partition(tp): timestamp for tp in tps}
        found = await self._list_offsets(query, monotonic_ms() + self.config.request_timeout_ms)
        return {tp: offset for tp, (offset, _ts) in found.items()}

    async def beginning_offsets(self, tps: Iterable[Any]) -> dict[TopicPartition, int]:
        """The log start offset of each partition (assigned or not)."""
        return await self._offsets(tps, EARLIEST)

    async def end_offsets(self, tps: Iterable[Any]) -> dict[TopicPartition, int]:
        """The high watermark of each partition: the offset the next
        committed record gets."""
        return await self._offsets(tps, LATEST)

    async def offsets_for_times(self, timestamps: Mapping[Any, int]
                                ) -> dict[TopicPartition, OffsetAndTimestamp | None]:
        """Per partition, the first record whose timestamp is at or after the
        given ms, or None when there is none (Kafka's answer)."""
        self._check_open()
        query = {}
        for tp, ts in timestamps.items():
            if not isinstance(ts, int) or ts < 0:
                raise ValueError(f"timestamp for {tp} must be an int >= 0 (ms), not {ts!r}")
            query[as_topic_partition(tp)] = ts
        found = await self._list_offsets(query, monotonic_ms() + self.config.request_timeout_ms)
        return {tp: (OffsetAndTimestamp(offset, ts) if offset >= 0 else None)
                for tp, (offset, ts) in found.items()}

    async def partitions_for_topic(self, topic: str) -> set[int]:
        """The partitions of ``topic``; raises ``UnknownTopicOrPartitionError``
        for a topic that does not exist."""
        self._check_open()
        await self._metadata.refresh([topic])
        partitions = self._metadata.partitions(topic)
        if partitions is None:
            raise self._metadata.topic_errors.get(topic) or UnknownTopicOrPartitionError(
                f"topic {topic!r} does not exist")
        return partitions

    async def topics(self) -> set[str]:
        """The names of every topic in the cluster."""
        self._check_open()
        answer = await self._metadata.request_any("/v1/metadata", {"topics": None})
        return {t["name"] for t in answer.get("topics") or () if t.get("error") is None}

    async def list_topics(self) -> dict[str, TopicMetadata]:
        """Every topic in the cluster with its id and partition numbers, in
        one metadata request (``topics`` and ``partitions_for_topic`` at
        once)."""
        self._check_open()
        answer = await self._metadata.request_any("/v1/metadata", {"topics": None})
        return {t["name"]: TopicMetadata(t["name"], t.get("topic_id"), frozenset(
                    p["partition"] for p in t.get("partitions") or ()))
                for t in answer.get("topics") or () if t.get("error") is None}

    # -- polling ----------------------------------------------------------------------------
    async def poll(self, timeout_ms: int = 0, max_records: int | None = None
                   ) -> list[ConsumerRecord]:
        """Records from the assigned partitions, at most ``max_records``
        (default ``max_poll_records``), waiting up to ``timeout_ms`` for the
        first. Raises a partition's error (e.g. ``OffsetOutOfRangeError``
        with ``auto_offset_reset="none"``) until the application seeks."""
        self._check_open()
        if self._fetcher is None:
            await self.start()
        max_records = max_records or self.config.max_poll_records
        deadline = time.monotonic() + timeout_ms / 1000
        if self._group is not None:
            await self._group.reconcile()
        while True:
            self._raise_partition_error()
            self._data.clear()
            records = self._buffer.drain(max_records)
            if records:
                self._wakeup.set()  # buffer space freed: the fetcher may go on
                return records
            self._raise_partition_error()
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return []
            self._wakeup.set()
            try:
                await asyncio.wait_for(self._data.wait(), remaining)
            except asyncio.TimeoutError:
                return []

    def _raise_partition_error(self) -> None:
        for state in self._states.values():
            if state.error is not None:
                raise state.error

    def __aiter__(self) -> "AsyncConsumer":
        return self

    async def __anext__(self) -> ConsumerRecord:
        pending = self._iter_records
        while not pending:
            timeout_ms = self.config.consumer_timeout_ms
            pending = deque(await self.poll(1000 if timeout_ms is None else timeout_ms))
            self._iter_records = pending
            if not pending and timeout_ms is not None:
                raise StopAsyncIteration
        return pending.popleft()

    # -- fetching -----------------------------------------------------------------------------
    async def _fetch_loop(self) -> None:
        """Keep one fetch in flight per leader while the buffer has room;
        reset positions and refresh metadata as needed."""
        config = self.config
        while not self._closed:
            self._wakeup.clear()
            now = monotonic_ms()
            next_ms: int | None = None
            try:
                unpositioned = [s for s in self._states.values()
                                if s.position is None and s.error is None
                                and s.retry_at_ms <= now]
                if unpositioned:
                    await self._reset_positions(unpositioned, None)
                    now = monotonic_ms()
                if self._buffer.buffered_bytes < config.max_buffered_bytes:
                    next_ms = self._start_fetches(now)
                refresh_wait = self._maybe_refresh(now)
                if refresh_wait is not None:
                    next_ms = refresh_wait if next_ms is None else min(next_ms, refresh_wait)
            except asyncio.CancelledError:
                raise
            except Exception:  # never let the fetcher die silently
                logger.exception("consumer fetch loop error")
                next_ms = config.retry_backoff_ms
            try:
                await asyncio.wait_for(self._wakeup.wait(),
                                       None if next_ms is None else max(next_ms, 1) / 1000)
            except asyncio.TimeoutError:
                pass

    def _start_fetches(self, now_ms: int) -> int | None:
        """Start a fetch to each leader that has none in flight; ms until a
        partition backing off may be fetched again."""
        by_url: dict[str, list[PartitionState]] = {}
        next_ms = None
        for state in self._states.values():
            if not state.fetchable(now_ms):
                if state.retry_at_ms > now_ms and state.error is None:
                    wait = state.retry_at_ms - now_ms
                    next_ms = wait if next_ms is None else min(next_ms, wait)
                continue
            url = self._metadata.leader_url(state.tp)
            if url is None:
                self._metadata.request_update()
                continue
            if url not in self._in_flight:
                by_url.setdefault(url, []).append(state)
        for url, states in by_url.items():
            self._in_flight[url] = asyncio.get_running_loop().create_task(
                self._fetch(url, states))
        return next_ms

    def _maybe_refresh(self, now_ms: int) -> int | None:
        if (not self._states or self._refresh_task is not None
                or not self._metadata.needs_update(now_ms)):
            return None
        wait = self._last_refresh_ms + self.config.retry_backoff_ms - now_ms
        if wait > 0:
            return wait
        self._last_refresh_ms = now_ms
        self._refresh_task = asyncio.get_running_loop().create_task(self._refresh())
        return None

    async def _refresh(self) -> None:
        try:
            await self._refresh_metadata({tp.topic for tp in self._states})
        except KraftlogError as exc:
            logger.warning("metadata refresh failed: %s", exc)
        finally:
            self._refresh_task = None
            self._wakeup.set()

    async def _fetch(self, url: str, states: list[PartitionState]) -> None:
        config = self.config
        asked = {state.tp: (state, state.generation, state.fetch_position) for state in states}
        partitions = []
        for state in states:
            entry = {"topic": state.tp.topic, "partition": state.tp.partition,
                     "offset": state.fetch_position,
                     "max_bytes": config.max_partition_fetch_bytes}
            leader = self._metadata.leader(*state.tp)
            if leader is not None and leader.leader_epoch >= 0:
                entry["current_leader_epoch"] = leader.leader_epoch
            partitions.append(entry)
        room = config.max_buffered_bytes - self._buffer.buffered_bytes
        body = {"max_wait_ms": config.fetch_max_wait_ms, "min_bytes": config.fetch_min_bytes,
                "max_bytes": max(1, min(config.fetch_max_bytes, room)),
                "partitions": partitions}
        try:
            answer = await self._transport.request(
                url, "/v1/fetch", body,
                timeout_ms=config.request_timeout_ms + config.fetch_max_wait_ms)
            self._take_fetch_answer(url, asked, answer)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            if not isinstance(exc, KraftlogError):  # a malformed answer, or a bug
                logger.exception("fetch from %s failed", url)
                exc = KraftlogError("UNKNOWN_SERVER_ERROR", f"fetch from {url} failed: {exc!r}",
                                    retriable=True)
            retry_at = monotonic_ms() + config.retry_backoff_ms
            if exc.code == "BROKER_NOT_AVAILABLE":
                self._metadata.forget_broker_url(url)
            for state, generation, _offset in asked.values():
                if state.generation != generation:
                    continue
                if exc.retriable:
                    self._metadata.request_update()
                    state.retry_at_ms = retry_at
                else:
                    state.error = exc
                    self._data.set()
        finally:
            del self._in_flight[url]
            self._wakeup.set()

    def _take_fetch_answer(self, url: str, asked: dict, answer: dict) -> None:
        now = monotonic_ms()
        got_data = False
        for entry in answer.get("partitions") or ():
            tp = TopicPartition(entry.get("topic"), entry.get("partition"))
            if tp not in asked:
                continue
            state, generation, offset = asked[tp]
            if (self._states.get(tp) is not state or state.generation != generation
                    or state.fetch_position != offset):
                continue  # seeked or unassigned while the fetch was in flight
            if entry.get("high_watermark", -1) >= 0:
                state.high_watermark = entry["high_watermark"]
            if entry.get("log_start_offset", -1) >= 0:
                state.log_start_offset = entry["log_start_offset"]
            error = error_from(entry.get("error"))
            if error is not None:
                self._fetch_error(state, error, entry, now)
                got_data = got_data or state.error is not None
                continue
            records = entry.get("records")
            if records:
                next_offset = self._buffer.add(state, records)
                if next_offset is None:
                    state.error = KraftlogError(
                        "RECORD_TOO_LARGE", f"{url} answered {len(records)} bytes for "
                        f"{tp.topic}-{tp.partition} holding no whole batch", retriable=False)
                else:
                    state.fetch_position = max(next_offset, state.fetch_position)
                got_data = True
        if got_data:
            self._data.set()

    def _fetch_error(self, state: PartitionState, error: KraftlogError, entry: dict,
                     now_ms: int) -> None:
        tp = state.tp
        if error.code == "OFFSET_OUT_OF_RANGE":
            reset = self.config.auto_offset_reset
            if reset == "none":
                state.error = OffsetOutOfRangeError(
                    f"offset {state.fetch_position} of {tp.topic}-{tp.partition} is out of "
                    f"range [{entry.get('log_start_offset')}, {entry.get('high_watermark')}] "
                    "and auto_offset_reset is 'none': seek() to a valid offset",
                    partitions={tp: state.fetch_position})
                return
            offset = entry.get("log_start_offset" if reset == "earliest" else "high_watermark")
            logger.info("%s-%d: offset %s out of range, resetting to %s (%s)", tp.topic,
                        tp.partition, state.fetch_position, offset, reset)
            self._buffer.discard(tp)
            if isinstance(offset, int) and offset >= 0:
                state.seek(offset)
            else:
                state.seek(None, reset)
            return
        if error.code in METADATA_CODES:
            self._metadata.learn_leader(tp.topic, tp.partition, error)
        if error.retriable:
            state.retry_at_ms = now_ms + self.config.retry_backoff_ms
            return
        state.error = error


class Consumer:
    """The synchronous consumer: the same settings and methods as
    ``AsyncConsumer``, blocking; it runs an ``AsyncConsumer`` on a daemon
    thread's event loop.

    ::

        with Consumer(bootstrap=url, auto_offset_reset="earliest") as consumer:
            consumer.assign([("orders", 0), ("orders", 1)])
            for record in consumer:          # stops after consumer_timeout_ms idle
                print(record.partition, record.offset, record.value)
    """

    def __init__(self, bootstrap: str | Iterable[str] = DEFAULT_BOOTSTRAP, **settings: Any
                 ) -> None:
        self._thread = LoopThread("kraftlog-consumer")
        try:
            self._consumer: AsyncConsumer = self._thread.run(self._create(bootstrap, settings))
        except BaseException:
            self._thread.stop()
            raise
        self.config = self._consumer.config
        self._pending: deque[ConsumerRecord] = deque()
        # The group generation the held records came from (see _drop_pending_if_lost).
        self._pending_generation = 0
        # commit_async tasks not yet answered (touched on the loop thread only).
        self._async_commits: set[asyncio.Future] = set()
        self._closed = False

    @staticmethod
    async def _create(bootstrap: Any, settings: dict) -> AsyncConsumer:
        consumer = AsyncConsumer(bootstrap, **settings)
        await consumer.start()
        return consumer

    def __enter__(self) -> "Consumer":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _call(self, fn: Callable, *args: Any) -> Any:
        return self._thread.call(fn, *args)

    def assign(self, partitions: Iterable[TopicPartition | tuple[str, int]]) -> None:
        partitions = [as_topic_partition(tp) for tp in partitions]
        self._call(self._consumer.assign, partitions)
        kept = set(partitions)
        self._pending = deque(r for r in self._pending
                              if TopicPartition(r.topic, r.partition) in kept)

    def assignment(self) -> set[TopicPartition]:
        return self._call(self._consumer.assignment)

    def subscribe(self, topics: Iterable[str] | None = None, pattern: str | None = None,
                  **listeners: Callable | None) -> None:
        """As ``AsyncConsumer.subscribe``. The listeners run on the consumer's
        own thread while ``poll`` waits for them: they must not call this
        consumer's blocking methods (with ``enable_auto_commit`` the consumer
        commits revoked partitions itself)."""
        topics = [topics] if isinstance(topics, str) else (
            None if topics is None else list(topics))
        self._call(lambda: self._consumer.subscribe(topics, pattern, **listeners))

    def commit(self, offsets: Mapping[Any, int] | None = None) -> None:
        """As ``AsyncConsumer.commit``; records this consumer still holds for
        iteration count as not yet consumed."""
        if offsets is None and self._pending:
            offsets = self._thread.run(self._positions_for_commit())
        self._thread.run(self._consumer.commit(offsets))

    def commit_async(self, offsets: Mapping[Any, int] | None = None,
                     callback: Callable[[dict, Exception | None], Any] | None = None) -> None:
        """Commit without waiting (Kafka's commitAsync): ``callback(offsets,
        error)`` runs on the consumer's thread once the coordinator answered.
        A failed async commit is not retried: a later commit covers it."""
        if offsets is None:
            offsets = self._thread.run(self._positions_for_commit())
        chosen = {as_topic_partition(tp): offset for tp, offset in offsets.items()}

        async def commit() -> None:
            error: Exception | None = None
            try:
                await self._consumer.commit(chosen)
            except Exception as exc:  # noqa: BLE001  handed to the callback
                error = exc
                if callback is None:
                    logger.warning("async commit failed: %s", exc)
            if callback is not None:
                try:
                    callback(chosen, error)
                except Exception:
                    logger.exception("commit callback %r failed", callback)

        def start() -> None:
            task = asyncio.ensure_future(commit())
            self._async_commits.add(task)  # held until done; close() waits for them
            task.add_done_callback(self._async_commits.discard)

        self._thread.call_soon(start)

    async def _finish_async_commits(self) -> None:
        if self._async_commits:
            await asyncio.gather(*self._async_commits, return_exceptions=True)

    async def _rewind_to_pending(self) -> None:
        assigned = self._consumer.assignment()
        for tp, offset in first_offsets(self._pending).items():
            if tp in assigned:
                self._consumer.seek(tp, offset)
        self._pending.clear()

    async def _positions_for_commit(self) -> dict[TopicPartition, int]:
        positions = self._consumer._consumed_positions(self._consumer.assignment())
        positions.update(first_offsets(self._pending))  # held records come before those
        return positions

    def committed(self, tps: Iterable[Any]) -> dict[TopicPartition, int | None]:
        return self._thread.run(self._consumer.committed(list(tps)))

    def seek(self, tp: TopicPartition | tuple[str, int], offset: int) -> None:
        self._call(self._consumer.seek, tp, offset)
        self._drop_pending([tp])

    def seek_to_beginning(self, tps: Iterable[Any] | None = None) -> None:
        tps = None if tps is None else list(tps)
        self._call(self._consumer.seek_to_beginning, tps)
        self._drop_pending(tps)

    def seek_to_end(self, tps: Iterable[Any] | None = None) -> None:
        tps = None if tps is None else list(tps)
        self._call(self._consumer.seek_to_end, tps)
        self._drop_pending(tps)

    def _drop_pending(self, tps: list | None) -> None:
        """Records the iterator holds for partitions just moved are stale."""
        if tps is None:
            self._pending.clear()
            return
        moved = {tuple(as_topic_partition(tp)) for tp in tps}
        self._pending = deque(r for r in self._pending if (r.topic, r.partition) not in moved)

    def position(self, tp: TopicPartition | tuple[str, int]) -> int:
        tp = as_topic_partition(tp)
        held = [r.offset for r in self._pending if r.topic == tp.topic
                and r.partition == tp.partition]
        if held:  # records the iterator took but has not handed out yet
            return held[0]
        return self._thread.run(self._consumer.position(tp))

    def _drop_pending_if_lost(self) -> None:
        """Records held for iteration from partitions the group took away
        (the member was fenced or lost its session) must not be handed out."""
        group = self._consumer._group
        if self._pending and group is not None and group.generation != self._pending_generation:
            self._pending.clear()

    def _held_generation(self) -> int:
        group = self._consumer._group
        return group.generation if group is not None else 0

    def poll(self, timeout_ms: int = 0, max_records: int | None = None
             ) -> list[ConsumerRecord]:
        max_records = max_records or self.config.max_poll_records
        self._drop_pending_if_lost()
        if self._pending:
            out = [self._pending.popleft() for _ in range(min(max_records, len(self._pending)))]
            return out
        return self._thread.run(self._consumer.poll(timeout_ms, max_records))

    def __iter__(self) -> "Consumer":
        return self

    def __next__(self) -> ConsumerRecord:
        timeout_ms = self.config.consumer_timeout_ms
        self._drop_pending_if_lost()
        while not self._pending:
            records = self._thread.run(self._consumer.poll(
                1000 if timeout_ms is None else timeout_ms))
            self._pending_generation = self._held_generation()
            self._pending.extend(records)
            if not records and timeout_ms is not None:
                raise StopIteration
        return self._pending.popleft()

    def beginning_offsets(self, tps: Iterable[Any]) -> dict[TopicPartition, int]:
        return self._thread.run(self._consumer.beginning_offsets(list(tps)))

    def end_offsets(self, tps: Iterable[Any]) -> dict[TopicPartition, int]:
        return self._thread.run(self._consumer.end_offsets(list(tps)))

    def offsets_for_times(self, timestamps: Mapping[Any, int]
                          ) -> dict[TopicPartition, OffsetAndTimestamp | None]:
        return self._thread.run(self._consumer.offsets_for_times(dict(timestamps)))

    def partitions_for_topic(self, topic: str) -> set[int]:
        return self._thread.run(self._consumer.partitions_for_topic(topic))

    def topics(self) -> set[str]:
        return self._thread.run(self._consumer.topics())

    def list_topics(self) -> dict[str, TopicMetadata]:
        return self._thread.run(self._consumer.list_topics())

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self._thread.run(self._finish_async_commits())
            if self._pending:
                # Held records were never handed out: the commit on close
                # must not count them as consumed.
                self._thread.run(self._rewind_to_pending())
            self._thread.run(self._consumer.close())
        finally:
            self._thread.stop()
