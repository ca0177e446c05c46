"""The consumer's fetching: partition positions, fetches to leaders, the buffer.

A background task (``Fetcher.run``) groups the fetchable partitions by
leader and keeps one ``POST /v1/fetch`` in flight per broker, so the next
fetch overlaps the application's processing. Each broker's fetches go in a
fetch session (Kafka's KIP-227, ``FetchSession``): after the first, a fetch
names only the partitions whose position moved, and the broker answers
only those and the others with news, so a consumer of thousands of quiet
partitions sends and reads little per fetch. Answers go into the
``FetchBuffer`` as raw bytes; ``poll`` decodes one batch at a time
(``decode_batch``: one msgpack ``Unpacker`` per batch, checked against
``storage.batch.iter_records`` by a property test) and skips records below
the position (a fetch may start mid-batch). ``PartitionState`` is one
assigned partition: its position, the next offset to fetch, its high
watermark and any error ``poll`` must raise.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from bisect import bisect_left
from collections import deque
from collections.abc import Awaitable, Callable
from operator import itemgetter
from typing import NamedTuple

import msgpack

from api.client._transport import ClusterMetadata, Transport, monotonic_ms
from api.client._types import ConsumerRecord, TopicPartition
from api.client.config import ConsumerConfig
from api.client.errors import (METADATA_CODES, CorruptRecordError, KraftlogError,
                               OffsetOutOfRangeError, error_from)
from protocol.aio import wait_event
from protocol.fetch_session import (FETCH_SESSION_ERRORS, NO_SESSION, OPEN_SESSION,
                                     next_fetch_session_epoch)
from protocol.columns import build_records  # None if not built: see decode_batch
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
class FetchedBatch(NamedTuple):
    """One whole fetched batch for a reader that decodes batches itself
    (``poll_batches``): records below ``position`` were handed out before
    (a fetch may start inside a batch) and are to be skipped."""

    tp: TopicPartition
    header: batch_format.BatchHeader
    data: memoryview
    position: int


def check_batch(topic: str, partition: int, view: memoryview, *, check_crc: bool = True
                ) -> batch_format.BatchHeader:
    """The header of one whole batch, its sanity and (with ``check_crc``)
    checksum verified; ``CorruptRecordError`` if not."""
    header = batch_format.parse_header(view)
    try:
        batch_format.check_header(header, len(view), batch_format.MAX_BATCH_BYTES, strict=False)
        if check_crc and batch_format.compute_crc(view, 0, header.size_bytes) != header.crc:
            raise batch_format.CorruptRecordError(
                f"CRC mismatch in batch at offset {header.base_offset}")
    except batch_format.RecordFormatError as exc:
        raise CorruptRecordError(f"{topic}-{partition}: {exc}") from None
    return header


def decode_batch(topic: str, partition: int, view: memoryview, *, check_crc: bool = True,
                 include_headers: bool = True) -> list[ConsumerRecord]:
    """Every record of one whole batch, as ``ConsumerRecord``s.

    Uncompressed batches are decoded here with one ``Unpacker`` and no
    per-record function calls; compressed ones go through
    ``storage.batch.iter_records``, which also inflates them. Both check the
    header, the CRC (unless ``check_crc`` is off) and that the records
    section holds exactly ``record_count`` records and nothing else.
    """
    header = check_batch(topic, partition, view, check_crc=check_crc)
    end = header.size_bytes
    try:
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
        if build_records is not None:
            # In C, and each record untracked by the garbage collector (a
            # named tuple never is otherwise): a consumer holding a poll's
            # records made collections a quarter of its time.
            records = build_records(cls, unpacker, topic, partition, base_offset, base_timestamp,
                                 timestamp_type, include_headers)
        elif include_headers:
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


_state_serials = itertools.count()


class PartitionState:
    """What the consumer knows of one assigned partition.

    ``position`` is the next offset ``poll`` returns (None: to be reset with
    ``reset``); ``fetch_position`` the next offset to fetch, ahead of
    ``position`` by what the buffer holds. ``generation`` changes on every
    seek or reset, so fetches and buffered data from before are dropped.
    ``error`` is raised by ``poll`` until the application seeks.
    """

    __slots__ = ("tp", "position", "fetch_position", "generation", "reset", "error",
                 "high_watermark", "log_start_offset", "retry_at_ms", "fetch_entry", "serial")

    def __init__(self, tp: TopicPartition, reset: str) -> None:
        self.tp = tp
        #: Tells this state from an earlier one of the same partition (an
        #: assignment taken away and given back) as a plain int.
        self.serial = next(_state_serials)
        self.position: int | None = None
        self.fetch_position: int | None = None
        self.generation = 0
        self.reset = reset
        self.error: KraftlogError | None = None
        self.high_watermark = -1
        self.log_start_offset = -1
        self.retry_at_ms = 0
        #: Its entry in fetch requests, made once and updated (``Fetcher._fetch``).
        self.fetch_entry: dict | None = None

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
    """The records a fetch returned for one partition, its batches parsed
    and decoded one at a time as ``poll`` asks: what waits in the buffer is
    one object per partition and its bytes, not one per batch (a fetch of
    thousands of partitions held long enough for the garbage collector to
    move them all to its oldest generation, and collect that again)."""

    __slots__ = ("state", "generation", "data", "batches", "cursor", "end", "records",
                 "index", "batch_next_offset", "size_bytes", "current")

    def __init__(self, state: PartitionState, data: bytes, end: int,
                 batches: list[tuple[batch_format.BatchHeader, memoryview | None]] | None = None
                 ) -> None:
        self.state = state
        self.generation = state.generation
        self.data = data
        #: Parsed ahead only when some must be skipped unread (read_committed
        #: with aborted transactions); else taken from ``data`` at ``cursor``
        #: up to ``end`` (where the whole batches end).
        self.batches = None if batches is None else deque(batches)
        self.cursor = 0
        self.end = end
        self.records: list[ConsumerRecord] = []
        self.index = 0
        self.batch_next_offset = -1
        self.size_bytes = len(data)
        #: The batch ``records`` were decoded from, as (header, bytes).
        self.current: tuple | None = None

    def next_batch(self) -> tuple[batch_format.BatchHeader, memoryview | None] | None:
        """The next batch, as (header, bytes; None for one to skip unread),
        or None when none is left. Lengths were checked as it was buffered."""
        if self.batches is not None:
            return self.batches.popleft() if self.batches else None
        pos = self.cursor
        if pos >= self.end:
            return None
        header = batch_format.parse_header(self.data, pos)
        stop = self.cursor = pos + header.size_bytes
        return header, memoryview(self.data)[pos:stop]


class FetchBuffer:
    """Fetched, not yet polled data, bounded by bytes. Pure: no I/O."""

    def __init__(self, *, check_crcs: bool = True, include_headers: bool = True) -> None:
        self.check_crcs = check_crcs
        self.include_headers = include_headers
        self.buffered_bytes = 0
        self._fetches: deque[_CompletedFetch] = deque()

    def __len__(self) -> int:
        return len(self._fetches)

    def add(self, state: PartitionState, data: bytes, aborted: list[dict] | None = None
              ) -> int | None:
        """Buffer the record batches of a fetch answer; the offset after the
        last whole batch (the next fetch offset), or None if none was whole.
        ``aborted`` (read_committed): the answer's aborted transactions,
        whose batches are dropped here."""
        end, count, _records, next_offset = batch_format.scan_batches(data)
        if not count:
            return None
        batches = None
        if aborted:
            batches = batch_format.without_aborted(list(batch_format.iter_batches(data)),
                                                   aborted)
        self._fetches.append(_CompletedFetch(state, data, end, batches))
        self.buffered_bytes += len(data)
        return next_offset

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
        while len(out) < max_records and (fetch := self._live_head()) is not None:
            state = fetch.state
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

    def drain_batches(self, max_records: int) -> list[FetchedBatch]:
        """Whole batches holding up to about ``max_records`` records at their
        partitions' positions, undecoded (checked, CRC too), advancing the
        positions past them: ``drain`` for readers that decode batches
        themselves. Control batches, aborted transactions' (read_committed)
        and batches below the position are skipped; a corrupt batch sets
        its partition's ``error``."""
        out: list[FetchedBatch] = []
        records = 0
        while records < max_records and (fetch := self._live_head()) is not None:
            state = fetch.state
            if fetch.index < len(fetch.records):
                # Decoded by ``drain`` but not all handed out: the rest of it.
                header, view = fetch.current
                out.append(FetchedBatch(state.tp, header, view, state.position))
                records += len(fetch.records) - fetch.index
                fetch.records, fetch.index = [], 0
                state.position = max(state.position, header.next_offset)
                continue
            if fetch.batch_next_offset > state.position:
                state.position = fetch.batch_next_offset
            batch = fetch.next_batch()
            if batch is None:
                self._pop()
                continue
            header, view = batch
            if header.next_offset <= state.position or header.is_control or view is None:
                state.position = max(state.position, header.next_offset)
                continue
            try:
                check_batch(state.tp.topic, state.tp.partition, view, check_crc=self.check_crcs)
            except KraftlogError as exc:
                state.error = exc
                self._pop()
                continue
            out.append(FetchedBatch(state.tp, header, view, state.position))
            records += header.record_count
            state.position = header.next_offset
        return out

    def _live_head(self) -> _CompletedFetch | None:
        """The first buffered fetch its partition still wants (not from
        before a seek, not after an error), dropping those before it."""
        while self._fetches:
            fetch = self._fetches[0]
            state = fetch.state
            if (state.generation == fetch.generation and state.position is not None
                    and state.error is None):
                return fetch
            self._pop()
        return None

    def _decode_next(self, fetch: _CompletedFetch) -> bool:
        """Decode the next batch of ``fetch`` holding records at or after the
        position; False when none is left."""
        state = fetch.state
        while (batch := fetch.next_batch()) is not None:
            header, view = batch
            if header.next_offset <= state.position or header.is_control or view is None:
                # Below the position (a fetch may start mid-batch), a
                # control batch (transaction markers) or an aborted
                # transaction's (read_committed): nothing to return.
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
            fetch.current = (header, view)
            return True
        return False

    def _pop(self) -> None:
        fetch = self._fetches.popleft()
        self.buffered_bytes -= fetch.size_bytes


#: How long closing the consumer waits for each broker to drop its session.
SESSION_CLOSE_TIMEOUT_MS = 1000
#: After a broker refused sessions (an older version), how long before the
#: consumer offers one again (the broker may have been upgraded since).
SESSION_RETRY_MS = 300_000


class FetchSession:
    """The consumer's fetch session with one broker: its id (0: none), the
    epoch of the next fetch (0 opens one) and what the broker's session
    holds of each partition (``key``), so a fetch names only those whose
    position, leader epoch or state moved and forgets those no longer
    fetched there. Any fetch that fails or is cancelled starts it afresh
    (the broker may or may not have taken it), and a partition whose
    answer was an error or was dropped is named again by the next fetch
    (``untell``): the broker reads a partition it was not told of again
    only when something new happens to it."""

    __slots__ = ("session_id", "epoch", "told", "unsupported_until_ms")

    def __init__(self) -> None:
        self.session_id = 0
        self.epoch = OPEN_SESSION
        self.told: dict[TopicPartition, tuple | None] = {}
        #: Until then, fetches name every partition without a session (a
        #: broker of an older version refused one).
        self.unsupported_until_ms = 0

    @staticmethod
    def key(state: "PartitionState", entry: dict) -> tuple:
        # The state and its generation: a seek (even back to the offset
        # last named) or a new assignment names the partition again. Plain
        # values only: the collector stops tracking such a tuple, and one is
        # kept per partition from fetch to fetch.
        return (entry["offset"], entry.get("current_leader_epoch"), entry["max_bytes"],
                state.generation, state.serial)

    def untell(self, tp: TopicPartition) -> None:
        # Kept, with a key nothing matches: named again if still fetched
        # here, else listed in ``forgotten`` (the broker may still hold it).
        if tp in self.told:
            self.told[tp] = None

    def request(self, body: dict, entries: dict[TopicPartition, dict],
                keys: dict[TopicPartition, tuple]) -> dict:
        """``body`` with the session's fields and the partitions to name
        (all of ``entries`` when opening, else those whose ``keys`` changed)."""
        if self.unsupported_until_ms > monotonic_ms():
            body["partitions"] = list(entries.values())
            return body
        if self.epoch == OPEN_SESSION:
            partitions = list(entries.values())
            forgotten = []
        else:
            told = self.told
            partitions = [entry for tp, entry in entries.items() if told.get(tp) != keys[tp]]
            forgotten = [{"topic": tp.topic, "partition": tp.partition}
                         for tp in told if tp not in entries]
        body.update(session_id=self.session_id, session_epoch=self.epoch,
                    partitions=partitions, forgotten=forgotten)
        return body

    def answered(self, answer: dict, keys: dict[TopicPartition, tuple]) -> bool:
        """Take a fetch's answer: False if the broker refused the session
        (then opened afresh), else True with the session moved on (or still
        none: a broker without room answers ``session_id`` 0)."""
        error = answer.get("error")
        refused = isinstance(error, dict) and error.get("code") in FETCH_SESSION_ERRORS
        if refused:
            logger.info("fetch session %s: %s", self.session_id, error.get("message"))
        session_id = answer.get("session_id", 0)
        if refused or not isinstance(session_id, int) or session_id <= 0:
            self.session_id = 0
            self.reset()
            return not refused
        if self.epoch == OPEN_SESSION or session_id != self.session_id:
            self.session_id, self.epoch = session_id, 1
        else:
            self.epoch = next_fetch_session_epoch(self.epoch)
        self.told = keys
        return True

    def reset(self) -> None:
        """Open afresh at the next fetch (naming the old id, so the broker
        frees it)."""
        self.epoch = OPEN_SESSION
        self.told = {}


class _Asked(NamedTuple):
    """A fetch's partitions: ``index`` by partition into ``states``, and
    the generation and position each was asked at."""
    index: dict[TopicPartition, int]
    states: list[PartitionState]
    generations: list[int]
    offsets: list[int]


class Fetcher:
    """The consumer's background fetching: one fetch in flight per leader
    broker while the buffer has room, answers into the ``FetchBuffer``,
    positions reset and metadata refreshed as needed. It shares the
    consumer's partition states, buffer, metadata and events (``wakeup``: look
    again now; ``data``: records or an error arrived for ``poll``); the
    consumer owns the task running ``run``."""

    def __init__(self, config: ConsumerConfig, metadata: ClusterMetadata, transport: Transport,
                 buffer: FetchBuffer, states: dict[TopicPartition, PartitionState],
                 wakeup: asyncio.Event, data: asyncio.Event,
                 reset_positions: Callable[..., Awaitable[None]],
                 refresh_metadata: Callable[..., Awaitable[None]]) -> None:
        self.config = config
        self.metadata = metadata
        self.transport = transport
        self.buffer = buffer
        self.states = states
        self.wakeup = wakeup
        self.data = data
        self.reset_positions = reset_positions
        self.refresh_metadata = refresh_metadata
        self.in_flight: dict[str, asyncio.Task] = {}
        self._by_leader: dict[str | None, list[PartitionState]] | None = None
        self._by_leader_version = -1
        # The partitions each in-flight fetch asks for, by leader URL.
        self.in_flight_tps: dict[str, frozenset[TopicPartition]] = {}
        #: Each broker's fetch session, by URL.
        self.sessions: dict[str, FetchSession] = {}
        self.refresh_task: asyncio.Task | None = None
        self.last_refresh_ms = -(2**62)
        self.closed = False

    def tasks(self) -> list[asyncio.Task]:
        """Its tasks now (fetches and a metadata refresh), to cancel on close."""
        return [t for t in (self.refresh_task, *self.in_flight.values()) if t is not None]

    async def run(self) -> None:
        """Keep one fetch in flight per leader while the buffer has room;
        reset positions and refresh metadata as needed."""
        config = self.config
        while not self.closed:
            self.wakeup.clear()
            now = monotonic_ms()
            next_ms: int | None = None
            try:
                unpositioned = [s for s in self.states.values()
                                if s.position is None and s.error is None
                                and s.retry_at_ms <= now]
                if unpositioned:
                    await self.reset_positions(unpositioned, None)
                    now = monotonic_ms()
                if self.buffer.buffered_bytes < config.max_buffered_bytes:
                    next_ms = self._start_fetches(now)
                refresh_wait = self._maybe_refresh(now)
                if refresh_wait is not None:
                    next_ms = refresh_wait if next_ms is None else min(next_ms, refresh_wait)
            except asyncio.CancelledError:
                raise
            except Exception:  # never let the fetcher die silently
                logger.exception("consumer fetch loop error")
                next_ms = config.retry_backoff_ms
            await wait_event(self.wakeup, None if next_ms is None else max(next_ms, 1) / 1000)

    def assignment_changed(self) -> None:
        """The consumer's partitions changed (``states``, edited in place)."""
        self._by_leader = None

    def _leader_groups(self) -> dict[str | None, list[PartitionState]]:
        """The assigned partitions by their leader's URL (None: unknown),
        grouped again only when the metadata or the assignment changed."""
        version = self.metadata.version
        if self._by_leader is None or self._by_leader_version != version:
            groups: dict[str | None, list[PartitionState]] = {}
            url_of = self.metadata.leader_url
            for state in self.states.values():
                url = url_of(state.tp)
                group = groups.get(url)
                if group is None:
                    groups[url] = [state]
                else:
                    group.append(state)
            self._by_leader, self._by_leader_version = groups, version
        return self._by_leader

    def _start_fetches(self, now_ms: int) -> int | None:
        """Start a fetch to each leader that has none in flight; ms until a
        partition backing off may be fetched again. The partitions of a
        leader with a fetch in flight are not looked at: they wait for it
        anyway, and its end wakes the loop (so a consumer of thousands of
        partitions does not walk them all each time it looks)."""
        by_url: dict[str, list[PartitionState]] = {}
        next_ms = None
        for url, group in self._leader_groups().items():
            if url is not None and url in self.in_flight:
                continue
            ready = []
            for state in group:
                if not state.fetchable(now_ms):
                    if state.retry_at_ms > now_ms and state.error is None:
                        wait = state.retry_at_ms - now_ms
                        next_ms = wait if next_ms is None else min(next_ms, wait)
                    continue
                ready.append(state)
            if not ready:
                continue
            if url is None:
                self.metadata.request_update()
                continue
            by_url[url] = ready
        for url, states in by_url.items():
            self.in_flight_tps[url] = frozenset(state.tp for state in states)
            task = asyncio.get_running_loop().create_task(self._fetch(url, states))
            task.add_done_callback(lambda done, url=url: self._fetch_done(url, done))
            self.in_flight[url] = task
        return next_ms

    async def close_sessions(self) -> None:
        """Ask each broker to drop this consumer's fetch session (so its
        slot is free at once, not after two idle minutes); best effort,
        bounded by ``SESSION_CLOSE_TIMEOUT_MS``."""
        open_ = [(url, s.session_id) for url, s in self.sessions.items() if s.session_id > 0]
        self.sessions.clear()

        async def close(url: str, session_id: int) -> None:
            body = {"max_wait_ms": 0, "session_id": session_id, "session_epoch": NO_SESSION,
                    "partitions": []}
            try:
                await self.transport.request(url, "/v1/fetch", body, pieces=False,
                                             timeout_ms=SESSION_CLOSE_TIMEOUT_MS)
            except KraftlogError:
                pass  # the broker closes it when it has been idle long enough

        if open_:
            await asyncio.gather(*(close(url, session_id) for url, session_id in open_))

    def abandon(self, tps: set[TopicPartition]) -> None:
        """Cancel the fetches in flight that ask for any of ``tps`` (just
        moved by a seek). Their answers would be dropped anyway, and one
        waiting at the old position (a long poll at the log end, up to
        ``fetch_max_wait_ms``) would hold back the fetch from the new one:
        one fetch at a time goes to each leader. The other partitions in it
        are asked for again from the same positions. (Each cancelled fetch
        costs its connection: aiohttp closes a request it abandons.)"""
        for url, asked in list(self.in_flight_tps.items()):
            task = self.in_flight.get(url)
            if task is not None and not asked.isdisjoint(tps):
                task.cancel()

    def _maybe_refresh(self, now_ms: int) -> int | None:
        if (not self.states or self.refresh_task is not None
                or not self.metadata.needs_update(now_ms)):
            return None
        wait = self.last_refresh_ms + self.config.retry_backoff_ms - now_ms
        if wait > 0:
            return wait
        self.last_refresh_ms = now_ms
        self.refresh_task = asyncio.get_running_loop().create_task(self._refresh())
        return None

    async def _refresh(self) -> None:
        try:
            await self.refresh_metadata({tp.topic for tp in self.states})
        except KraftlogError as exc:
            logger.warning("metadata refresh failed: %s", exc)
        finally:
            self.refresh_task = None
            self.wakeup.set()

    async def _fetch(self, url: str, states: list[PartitionState]) -> None:
        config = self.config
        # What each partition was asked from, by index: no object per
        # partition lives while the fetch is out.
        asked = _Asked({state.tp: i for i, state in enumerate(states)}, states,
                       [state.generation for state in states],
                       [state.fetch_position for state in states])
        entries: dict[TopicPartition, dict] = {}
        # Each partition's entry is one map, updated in place: a fetch of
        # thousands of partitions makes none afresh, so none lives on for
        # the garbage collector to scan (the request is packed before the
        # first await: a later fetch's updates cannot reach this one's).
        for state in states:
            entry = state.fetch_entry
            if entry is None:
                entry = state.fetch_entry = {
                    "topic": state.tp.topic, "partition": state.tp.partition, "offset": 0,
                    "max_bytes": config.max_partition_fetch_bytes}
            entry["offset"] = state.fetch_position
            leader = self.metadata.leader(*state.tp)
            if leader is not None and leader.leader_epoch >= 0:
                entry["current_leader_epoch"] = leader.leader_epoch
            elif "current_leader_epoch" in entry:
                del entry["current_leader_epoch"]
            entries[state.tp] = entry
        room = config.max_buffered_bytes - self.buffer.buffered_bytes
        body = {"max_wait_ms": config.fetch_max_wait_ms, "min_bytes": config.fetch_min_bytes,
                "max_bytes": max(1, min(config.fetch_max_bytes, room)),
                "isolation_level": config.isolation_level}
        session = self.sessions.get(url)
        if session is None:
            session = self.sessions[url] = FetchSession()
        key = FetchSession.key
        keys = {state.tp: key(state, state.fetch_entry) for state in states}
        body = session.request(body, entries, keys)
        try:
            try:
                answer = await self.transport.request(
                    url, "/v1/fetch", body, pieces=False,
                    timeout_ms=config.request_timeout_ms + config.fetch_max_wait_ms)
            except BaseException as exc:
                session.reset()  # the broker may or may not have taken it
                if (body.get("session_epoch", NO_SESSION) != NO_SESSION
                        and isinstance(exc, KraftlogError)
                        and exc.code == "INVALID_REQUEST" and "fetch session" in str(exc)):
                    logger.info("%s does not keep consumers' fetch sessions (an older "
                                "version): fetching without for %d s", url,
                                SESSION_RETRY_MS // 1000)
                    session.unsupported_until_ms = monotonic_ms() + SESSION_RETRY_MS
                    return  # _fetch_done wakes the loop: it fetches again at once
                raise
            if not session.answered(answer, keys):
                return  # _fetch_done wakes the loop: it opens a new session at once
            self._take_fetch_answer(url, asked, answer, session)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            session.reset()  # an answer not wholly taken: what the broker holds is unsure
            if not isinstance(exc, KraftlogError):  # a malformed answer, or a bug
                logger.exception("fetch from %s failed", url)
                exc = KraftlogError("UNKNOWN_SERVER_ERROR", f"fetch from {url} failed: {exc!r}",
                                    retriable=True)
            retry_at = monotonic_ms() + config.retry_backoff_ms
            if exc.code == "BROKER_NOT_AVAILABLE":
                self.metadata.forget_broker_url(url)
            for state, generation in zip(asked.states, asked.generations):
                if state.generation != generation:
                    continue
                if exc.retriable:
                    self.metadata.request_update()
                    state.retry_at_ms = retry_at
                else:
                    state.error = exc
                    self.data.set()

    def _fetch_done(self, url: str, task: asyncio.Task) -> None:
        """A fetch ended (answered, failed or cancelled, even before it
        started: a coroutine's own ``finally`` would not run then): the
        leader may be fetched from again."""
        if self.in_flight.get(url) is task:
            del self.in_flight[url]
            del self.in_flight_tps[url]
        self.wakeup.set()

    def _take_fetch_answer(self, url: str, asked: "_Asked", answer: dict,
                           session: FetchSession | None = None) -> None:
        now = monotonic_ms()
        got_data = False
        index = asked.index
        for entry in answer.get("partitions") or ():
            tp = TopicPartition(entry.get("topic"), entry.get("partition"))
            i = index.get(tp)
            if i is None:
                continue
            state = asked.states[i]
            if (self.states.get(tp) is not state or state.generation != asked.generations[i]
                    or state.fetch_position != asked.offsets[i]):
                if session is not None:
                    session.untell(tp)  # what it answered was dropped: name it again
                continue  # seeked or unassigned while the fetch was in flight
            if entry.get("high_watermark", -1) >= 0:
                state.high_watermark = entry["high_watermark"]
            if entry.get("log_start_offset", -1) >= 0:
                state.log_start_offset = entry["log_start_offset"]
            error = error_from(entry.get("error"))
            if error is not None:
                if session is not None:
                    session.untell(tp)  # the broker's session may not hold it: name it again
                self._fetch_error(state, error, entry, now)
                got_data = got_data or state.error is not None
                continue
            records = entry.get("records")
            if records:
                aborted = (entry.get("aborted_transactions") or []
                           if self.config.isolation_level == "read_committed" else None)
                next_offset = self.buffer.add(state, records, aborted)
                if next_offset is None:
                    if session is not None:
                        session.untell(tp)
                    state.error = KraftlogError(
                        "RECORD_TOO_LARGE", f"{url} answered {len(records)} bytes for "
                        f"{tp.topic}-{tp.partition} holding no whole batch", retriable=False)
                else:
                    state.fetch_position = max(next_offset, state.fetch_position)
                got_data = True
        if got_data:
            self.data.set()

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
            self.buffer.discard(tp)
            if isinstance(offset, int) and offset >= 0:
                state.seek(offset)
            else:
                state.seek(None, reset)
            return
        if error.code in METADATA_CODES:
            self.metadata.learn_leader(tp.topic, tp.partition, error)
        if error.retriable:
            state.retry_at_ms = now_ms + self.config.retry_backoff_ms
            return
        state.error = error
