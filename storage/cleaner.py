"""Log compaction: keep at least the latest record of every key.

A log whose ``cleanup.policy`` includes ``compact`` is cleaned in passes.
Each pass has three steps, on two threads:

1. ``plan_clean`` (the log's owner thread, cheap): which segments may be
   cleaned and where the dirty section starts and ends. Only whole inactive
   segments below the first uncleanable offset: the active segment, the high
   watermark, the recovery point (only fsynced data is rewritten), the first
   open transaction, and ``min.compaction.lag.ms`` each stop the range.
2. ``clean`` (a cleaner process, niced, or any thread; never the event loop:
   it reads every record, much of it in C calls that hold the GIL the event
   loop needs): build the offset map
   (key -> last offset) over the dirty section, bounded by
   ``log.cleaner.dedupe.buffer.size``; if the dirty section has more keys
   than fit, the pass stops where the map filled and the next pass goes on
   from there. Then recopy every cleanable segment from the log start, in
   groups of up to ``segment.bytes``, into ``<base>.log.cleaned`` (and its
   ``.index.cleaned`` / ``.timeindex.cleaned``), fsynced.
3. ``swap`` (the owner thread): if the log's segments did not change
   meanwhile, Kafka's protocol: rename the ``.cleaned`` files to ``.swap``,
   fsync the directory, rename the old segments aside (``.deleted``, unlinked
   off the event loop), rename the ``.swap`` files to their final names,
   fsync the directory. ``complete_swaps`` (run when a log opens) finishes
   or undoes whatever a crash interrupted: ``.cleaned`` files are deleted
   (the old segments are intact), a ``<base>.log.swap`` replaces every
   segment in its offset range, ``.deleted`` files go.

What a pass keeps of a batch (offsets never change; a batch keeps its base
offset, offset range, leader epoch, producer id, epoch and base sequence):

- a record whose key appears again later in the dirty section goes;
- a tombstone (null value) goes once ``delete.retention.ms`` has passed since
  the pass that first cleaned it (``CleanerState.cleaned_at``), so consumers
  that read the log in that time see the delete;
- records of aborted transactions go; a transaction marker goes once no
  batch of its transaction is left and ``delete.retention.ms`` has passed
  since it was first cleaned;
- records without a key stay (nothing can supersede them);
- a batch left with no record is dropped, except the last batch of each
  rewritten segment (so segments still end where the next begins) and the
  last batch of an idempotent producer (so its sequences survive a restart),
  which stay as empty batches;
- a batch that keeps every record is copied byte for byte.

Each log's cleaning progress lives in ``cleaner-checkpoint`` in its
directory (``CleanerState``), written atomically after each swap; a crash
before that only makes the next pass redo work.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import threading
import time
from typing import Any, Callable, Iterator, Mapping, NamedTuple

from storage import batch as fmt
from storage import sections
from storage.checkpoint import fsync_directory, write_atomically
from storage.config import LONG_MAX
from storage.errors import InvalidConfigError
from storage.segment import (DELETED_SUFFIX, INDEX_SUFFIX, LOG_SUFFIX, TIME_INDEX_SUFFIX,
                             BatchMeta, Segment, file_stem)

log = logging.getLogger(__name__)

CLEANED_SUFFIX = ".cleaned"
SWAP_SUFFIX = ".swap"
STATE_FILE = "cleaner-checkpoint"
STATE_VERSION = 1
SEGMENT_SUFFIXES = (LOG_SUFFIX, INDEX_SUFFIX, TIME_INDEX_SUFFIX)

#: Bytes read from a segment at once.
READ_CHUNK_BYTES = 1024 * 1024
#: Bytes of cleaned batches written at once.
WRITE_CHUNK_BYTES = 1024 * 1024
#: Bytes of one entry of the C offset map's table (hash, offset, a key of
#: up to 15 bytes or its place in the arena of longer keys). The table
#: doubles when 70% full; what a map may hold is its memory, table and
#: arena, measured (``OffsetMap.used_bytes``), the old table included
#: while a doubling copies it.
MAP_ENTRY_BYTES = 32
#: What the pure-Python map, used where the C extension is not built,
#: counts per key beyond its length plus one (a dict slot, a key object
#: and an int: CPython, measured).
MAP_DICT_ENTRY_BYTES = 100
#: Share of the dedupe buffer the map may fill (Kafka's load factor).
MAP_LOAD_FACTOR = 0.9

DEDUPE_BUFFER_DEFAULT = 128 * 1024 * 1024
BACKOFF_MS_DEFAULT = 15_000


# ---------------------------------------------------------------------------
# Configuration (broker level; the per-topic settings are in LogConfig)
# ---------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class CleanerConfig:
    """The log cleaner's node settings, under Kafka's names."""

    # log.cleaner.enable
    enable: bool = True
    # log.cleaner.threads: logs cleaned at once
    threads: int = 1
    # log.cleaner.dedupe.buffer.size: memory for the offset maps, all threads
    dedupe_buffer_size: int = DEDUPE_BUFFER_DEFAULT
    # log.cleaner.io.max.bytes.per.second: read + write rate, all threads
    io_max_bytes_per_second: float = math.inf
    # log.cleaner.backoff.ms: sleep when no log needs cleaning
    backoff_ms: int = BACKOFF_MS_DEFAULT

    def __post_init__(self) -> None:
        if self.threads < 1:
            raise InvalidConfigError(f"log.cleaner.threads = {self.threads} must be at least 1")
        if self.dedupe_buffer_size < 1024 * 1024:
            raise InvalidConfigError(
                f"log.cleaner.dedupe.buffer.size = {self.dedupe_buffer_size} must be at least "
                "1048576 (1 MiB)")
        if not self.io_max_bytes_per_second > 0:
            raise InvalidConfigError(
                f"log.cleaner.io.max.bytes.per.second = {self.io_max_bytes_per_second} must "
                "be positive")
        if self.backoff_ms < 1:
            raise InvalidConfigError(f"log.cleaner.backoff.ms = {self.backoff_ms} must be >= 1")

    @classmethod
    def from_broker_config(cls, settings: Mapping[str, Any]) -> "CleanerConfig":
        enable = settings.get("log.cleaner.enable", cls.enable)
        if isinstance(enable, str):
            enable = enable.strip().lower() == "true"
        rate = settings.get("log.cleaner.io.max.bytes.per.second")
        return cls(
            enable=bool(enable),
            threads=int(settings.get("log.cleaner.threads", cls.threads)),
            dedupe_buffer_size=int(settings.get("log.cleaner.dedupe.buffer.size",
                                                cls.dedupe_buffer_size)),
            io_max_bytes_per_second=math.inf if rate is None else float(rate),
            backoff_ms=int(settings.get("log.cleaner.backoff.ms", cls.backoff_ms)),
        )


# ---------------------------------------------------------------------------
# Per-log progress, persisted
# ---------------------------------------------------------------------------
@dataclasses.dataclass
class CleanerState:
    """How far a log is cleaned, and when each part was first cleaned.

    ``first_dirty``: below it every key appears once (as of the last pass).
    ``cleaned_at``: ``[upto, ms]`` pairs, ``upto`` increasing: offsets below
    ``upto`` (and at or above the previous pair's) were first cleaned at
    ``ms``. Tombstones and markers there may go ``delete.retention.ms`` after.
    """

    directory: str
    first_dirty: int = 0
    cleaned_at: list[list[int]] = dataclasses.field(default_factory=list)
    last_clean_ms: int = -1
    #: When the oldest tombstone or marker kept by the last pass may go.
    due_ms: int | None = None

    @property
    def path(self) -> str:
        return os.path.join(self.directory, STATE_FILE)

    @classmethod
    def load(cls, directory: str) -> "CleanerState":
        state = cls(directory)
        try:
            with open(state.path, "rb") as f:
                raw = json.loads(f.read())
            if raw.get("version") != STATE_VERSION:
                raise ValueError(f"version {raw.get('version')}")
            state.first_dirty = int(raw["first_dirty"])
            state.cleaned_at = [[int(upto), int(ms)] for upto, ms in raw["cleaned_at"]]
            state.last_clean_ms = int(raw["last_clean_ms"])
            state.due_ms = None if raw.get("due_ms") is None else int(raw["due_ms"])
        except FileNotFoundError:
            pass
        except (ValueError, KeyError, TypeError) as exc:
            # Losing it costs a full pass and tombstones kept longer, never data.
            log.warning("%s: ignoring unreadable cleaner checkpoint: %s", directory, exc)
            state = cls(directory)
        return state

    def save(self) -> None:
        write_atomically(self.path, json.dumps({
            "version": STATE_VERSION, "first_dirty": self.first_dirty,
            "cleaned_at": self.cleaned_at, "last_clean_ms": self.last_clean_ms,
            "due_ms": self.due_ms}).encode())

    def cleaned_time(self, offset: int) -> int | None:
        """When ``offset`` was first cleaned, None if never."""
        for upto, ms in self.cleaned_at:
            if offset < upto:
                return ms
        return None

    def note_cleaned(self, upto: int, now_ms: int, retention_ms: int) -> None:
        """A pass cleaned everything below ``upto`` at ``now_ms``. Pairs
        whose time is past the horizon merge, so the list stays short."""
        if not self.cleaned_at or upto > self.cleaned_at[-1][0]:
            self.cleaned_at.append([upto, now_ms])
        horizon = now_ms - retention_ms
        merged: list[list[int]] = []
        for upto_i, ms in self.cleaned_at:
            if merged and merged[-1][1] <= horizon and ms <= horizon:
                merged[-1] = [upto_i, max(merged[-1][1], ms)]
            else:
                merged.append([upto_i, ms])
        self.cleaned_at = merged
        self.first_dirty = max(self.first_dirty, upto)
        self.last_clean_ms = now_ms

    def truncated(self, log_end_offset: int) -> None:
        """The log now ends at ``log_end_offset``: forget what lies past it."""
        self.first_dirty = min(self.first_dirty, log_end_offset)
        kept: list[list[int]] = []
        for upto, ms in self.cleaned_at:
            if kept and kept[-1][0] >= log_end_offset:
                break
            kept.append([min(upto, log_end_offset), ms])
        self.cleaned_at = kept

    def reset(self, start_offset: int) -> None:
        self.first_dirty = start_offset
        self.cleaned_at = []
        self.due_ms = None


# ---------------------------------------------------------------------------
# Step 1: the plan (owner thread)
# ---------------------------------------------------------------------------
class SegmentRef(NamedTuple):
    """A segment as the cleaner process sees it: by name, as planned."""

    base_offset: int
    next_offset: int
    size_bytes: int
    log_path: str


@dataclasses.dataclass
class CleanPlan:
    """What one pass cleans. Picklable: it crosses to the cleaner process;
    the ``Segment`` objects stay with the log (``segments``, not sent)."""

    directory: str
    config: Any  # LogConfig
    refs: list[SegmentRef]  # the cleanable segments, oldest first
    first_dirty: int
    dirty_end: int  # first uncleanable offset (a segment boundary)
    layout_version: int
    now_ms: int
    cleaned_at: list[list[int]]
    aborted: list  # AbortedTxn in the range
    producer_last_offsets: dict[int, int]
    #: The log's segment objects, for the swap (owner thread only).
    segments: list[Segment] = dataclasses.field(default_factory=list)

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["segments"] = []
        return state


@dataclasses.dataclass(frozen=True)
class Cleanability:
    """Why a compacted log does or does not need a pass now."""

    clean_bytes: int
    dirty_bytes: int
    dirty_end: int
    first_dirty: int
    cleanable_segments: int

    @property
    def dirty_ratio(self) -> float:
        total = self.clean_bytes + self.dirty_bytes
        return self.dirty_bytes / total if total else 0.0


def first_uncleanable_offset(part_log, now_ms: int, upper_bound: int | None) -> int:
    """The segment base below which ``part_log`` may be cleaned."""
    segments = part_log.segments
    limit = part_log.active_segment.base_offset
    limit = min(limit, part_log.recovery_point)
    if upper_bound is not None:
        limit = min(limit, upper_bound)
    unstable = part_log.first_unstable_offset
    if unstable is not None:
        limit = min(limit, unstable)
    lag = part_log.config.min_compaction_lag_ms
    end = segments[0].base_offset
    for segment in segments:
        if segment.next_offset > limit:
            break
        if lag > 0 and segment.max_timestamp > now_ms - lag:
            break
        end = segment.next_offset
    return end


def cleanability(part_log, now_ms: int, upper_bound: int | None = None) -> Cleanability:
    """Clean and dirty bytes of the cleanable range of ``part_log``."""
    state = part_log.cleaner_state
    dirty_end = first_uncleanable_offset(part_log, now_ms, upper_bound)
    first_dirty = min(max(state.first_dirty, part_log.log_start_offset), dirty_end)
    clean = dirty = count = 0
    for segment in part_log.segments:
        if segment.next_offset > dirty_end or segment.base_offset >= dirty_end:
            break
        count += 1
        if segment.next_offset <= first_dirty:
            clean += segment.size_bytes
        else:
            dirty += segment.size_bytes
    return Cleanability(clean, dirty, dirty_end, first_dirty, count)


def needs_cleaning(part_log, now_ms: int, upper_bound: int | None = None
                   ) -> Cleanability | None:
    """Whether a pass is due: the dirty ratio reached
    ``min.cleanable.dirty.ratio``, a dirty record is older than
    ``max.compaction.lag.ms``, or a kept tombstone or marker may now go."""
    config = part_log.config
    if not config.compact or part_log.closed:
        return None
    found = cleanability(part_log, now_ms, upper_bound)
    if found.cleanable_segments == 0:
        return None
    state = part_log.cleaner_state
    if found.dirty_bytes and found.dirty_ratio >= config.min_cleanable_dirty_ratio:
        return found
    if found.dirty_bytes:
        for segment in part_log.segments:
            if segment.next_offset > found.first_dirty:
                first_ts = segment.first_batch_timestamp
                if first_ts != fmt.NO_TIMESTAMP and now_ms - first_ts > \
                        config.max_compaction_lag_ms:
                    return found
                break
    if state.due_ms is not None and state.due_ms <= now_ms:
        return found
    return None


def plan_clean(part_log, now_ms: int, upper_bound: int | None = None,
               force: bool = False, found: Cleanability | None = None) -> CleanPlan | None:
    """What the next pass over ``part_log`` cleans, or None if nothing is
    due (with ``force``: nothing cleanable). ``found``: what
    ``needs_cleaning`` just said, not to be worked out again."""
    if found is None:
        found = (cleanability(part_log, now_ms, upper_bound) if force
                 else needs_cleaning(part_log, now_ms, upper_bound))
    if found is None or found.cleanable_segments == 0:
        return None
    segments = part_log.segments[:found.cleanable_segments]
    producers = {pid: entry.last_offset
                 for pid, entry in part_log.producer_state.producers.items()}
    return CleanPlan(
        directory=part_log.directory, config=part_log.config,
        refs=[SegmentRef(s.base_offset, s.next_offset, s.size_bytes, s.log_path)
              for s in segments], segments=segments, first_dirty=found.first_dirty,
        dirty_end=found.dirty_end, layout_version=part_log.layout_version, now_ms=now_ms,
        cleaned_at=[list(p) for p in part_log.cleaner_state.cleaned_at],
        aborted=part_log.collect_aborted(segments[0].base_offset, found.dirty_end),
        producer_last_offsets=producers)


# ---------------------------------------------------------------------------
# Step 2: the clean (a cleaner process, or any thread but the event loop)
# ---------------------------------------------------------------------------
class OffsetMap:
    """Key -> offset of its latest record, within a memory budget.

    Keys are held whole, so no two keys ever share an entry (Kafka's map
    keeps digests). The map is ``storage._records.OffsetMap`` where the C
    extension is built: filled from a whole section and asked which records
    of one stay, it makes no Python object per record, and its budget is
    the memory it holds. Otherwise, and for a section the C one does not
    take (a key stored as a string), the same in Python over
    ``sections.scan``, counting ``MAP_DICT_ENTRY_BYTES`` plus the key's
    length plus one per key.
    """

    def __init__(self, budget_bytes: int) -> None:
        self.budget = int(budget_bytes * MAP_LOAD_FACTOR)
        self._c = sections.offset_map()
        self._dict: dict[bytes | str, int] = {}
        self._key_bytes = 0  # of the Python map

    def __len__(self) -> int:
        return len(self._dict) if self._c is None else len(self._c)

    @property
    def used_bytes(self) -> int:
        if self._c is not None:
            return self._c.memory_bytes
        return len(self._dict) * MAP_DICT_ENTRY_BYTES + self._key_bytes

    def put(self, header: fmt.BatchHeader, section) -> bool:
        """Every keyed record of one batch (its uncompressed records
        section), if the map stays within its budget even were every key
        new; False, with nothing put, if not. An empty map takes any batch,
        so every pass makes progress."""
        count, last, base = header.record_count, header.last_offset_delta, header.base_offset
        budget = self.budget if len(self) else -1
        if self._c is not None:
            try:
                return self._c.put(section, count, last, base, budget)
            except ValueError:
                pass  # perhaps only what the C map does not take: the Python scan says
        keys, deltas, _ = _scan(header, section)
        keyed = [(key, offset) for key, offset in zip(keys, _offsets(base, keys, deltas))
                 if key is not None]
        if self._c is None:
            need = sum(MAP_DICT_ENTRY_BYTES + len(key) + 1 for key, _ in keyed)
        else:  # a table entry and arena room each, as the C map counts them
            need = sum(2 * MAP_ENTRY_BYTES + 2 * (len(key) + 4) for key, _ in keyed)
        if budget >= 0 and self.used_bytes + need > budget:
            return False
        for key, offset in keyed:
            if self._c is not None:
                self._c.put_key(key, offset)
            elif offset > self._dict.get(key, -1):
                if key not in self._dict:
                    self._key_bytes += len(key) + 1
                self._dict[key] = offset
        return True

    def get(self, key: bytes | str) -> int:
        """The latest offset of ``key``, or -1."""
        return self._dict.get(key, -1) if self._c is None else self._c.get(key)

    def keep(self, header: fmt.BatchHeader, section) -> tuple[list[int] | None, list | None]:
        """Which records of one batch stay: those without a key or at their
        key's latest offset. ``(keep, tombstones)``: ``keep`` None when all
        do, else their indexes; ``tombstones`` None, or ``(index, offset)``
        of each keyed record that stays with a null value."""
        count, last, base = header.record_count, header.last_offset_delta, header.base_offset
        if self._c is not None:
            try:
                return self._c.keep(section, count, last, base)
            except ValueError:
                pass
        keys, deltas, nulls = _scan(header, section)
        keep: list[int] = []
        tombstones = []
        for i, (key, offset) in enumerate(zip(keys, _offsets(base, keys, deltas))):
            if key is None or self.get(key) <= offset:
                keep.append(i)
                if key is not None and nulls is not None and nulls[i]:
                    tombstones.append((i, offset))
        return None if len(keep) == count else keep, tombstones or None


def _offsets(base_offset: int, keys: list, deltas: list[int] | None) -> Iterator[int]:
    if deltas is None:
        return iter(range(base_offset, base_offset + len(keys)))
    return map(base_offset.__add__, deltas)


class Throttler:
    """Keeps the cleaner's I/O under a rate shared by all its threads."""

    def __init__(self, bytes_per_second: float) -> None:
        self.rate = bytes_per_second
        self._lock = threading.Lock()
        self._start = time.monotonic()
        self._done = 0.0

    def account(self, count: int) -> None:
        if math.isinf(self.rate):
            return
        with self._lock:
            now = time.monotonic()
            if now - self._start > 1.0:  # a fresh window each second or so
                self._start, self._done = now, 0.0
            self._done += count
            wait = self._done / self.rate - (now - self._start)
        if wait > 0:
            time.sleep(min(wait, 1.0))


UNLIMITED = Throttler(math.inf)


@dataclasses.dataclass
class CleanedGroup:
    sources: list[int]  # indexes in the plan of the old segments it replaces
    base_offset: int
    end_offset: int  # the offset after its last batch (= the next segment's base)


@dataclasses.dataclass
class CleanResult:
    plan: CleanPlan
    groups: list[CleanedGroup]
    map_end: int  # the dirty section up to here was in the offset map
    bytes_read: int = 0
    bytes_written: int = 0
    records_read: int = 0
    records_kept: int = 0
    due_ms: int | None = None
    seconds: float = 0.0

    def discard(self) -> None:
        """Delete the pass's output (the log changed, or the pass failed)."""
        for group in self.groups:
            for suffix in SEGMENT_SUFFIXES:
                _unlink(_path(self.plan.directory, group.base_offset, suffix, CLEANED_SUFFIX))


def _path(directory: str, base: int, suffix: str, extra: str = "") -> str:
    return os.path.join(directory, file_stem(base) + suffix + extra)


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


class _SegmentReader:
    """Whole batches of one segment file, as far as it was planned. The file
    is opened by name: one deleted since the plan fails the pass (the swap
    would refuse it anyway), and one recreated under the same name changes
    the log's layout version, so its pass never swaps in either.

    With ``buffer``, chunks are read into it rather than into new ones, so
    a batch's view is valid only until the next batch: for callers that
    keep nothing of a batch."""

    def __init__(self, ref: SegmentRef, throttler: Throttler,
                 buffer: bytearray | None = None) -> None:
        self.fd = os.open(ref.log_path, os.O_RDONLY)
        self.size, self.throttler = ref.size_bytes, throttler
        self.buffer = buffer
        self.bytes_read = 0

    def __enter__(self) -> "_SegmentReader":
        return self

    def __exit__(self, *exc) -> None:
        os.close(self.fd)

    def batches(self) -> Iterator[tuple[fmt.BatchHeader, memoryview]]:
        pos = 0
        while pos < self.size:
            want = min(max(READ_CHUNK_BYTES, fmt.HEADER_SIZE), self.size - pos)
            chunk = self._read(want, pos)
            if len(chunk) < min(want, fmt.HEADER_SIZE):
                raise fmt.CorruptRecordError(f"segment shorter than planned at {pos}")
            header = fmt.parse_header(chunk)
            if header.size_bytes > len(chunk):
                chunk = self._read(header.size_bytes, pos)
            used = 0
            for header, view in fmt.iter_batches(chunk):
                yield header, view
                used += header.size_bytes
            if used == 0:
                raise fmt.CorruptRecordError(f"batch at {pos} does not fit in the segment")
            self.bytes_read += used
            self.throttler.account(used)
            pos += used

    def _read(self, count: int, pos: int) -> memoryview:
        """``count`` bytes at ``pos`` (fewer at the end of the file)."""
        if self.buffer is None or len(self.buffer) < count:
            buffer = bytearray(count)
            if self.buffer is not None:
                self.buffer = buffer
        else:
            buffer = self.buffer
        view = memoryview(buffer)[:count]
        return view[:os.preadv(self.fd, [view], pos)]


def _section(header: fmt.BatchHeader, batch: memoryview):
    """One batch's uncompressed records section, its CRC checked."""
    if fmt.compute_crc(batch, 0, header.size_bytes) != header.crc:
        raise fmt.CorruptRecordError(f"CRC mismatch in batch at offset {header.base_offset}")
    if header.compression == fmt.Compression.NONE:
        return batch[fmt.HEADER_SIZE:header.size_bytes]
    try:
        return fmt.decompress(header.compression, batch[fmt.HEADER_SIZE:],
                              fmt.DEFAULT_MAX_DECOMPRESSED_BYTES)
    except ValueError as exc:
        raise fmt.CorruptRecordError(
            f"records of batch at offset {header.base_offset} do not decompress: {exc}") from exc


def _scan(header: fmt.BatchHeader, section) -> tuple[list, list[int] | None, bytes | None]:
    """``sections.scan`` of one batch's records section: its keys, offset
    deltas and null values, checked as ``iter_records`` checks them (a bad
    offset delta would put a foreign offset in the offset map)."""
    if header.base_offset + header.last_offset_delta > LONG_MAX:
        raise fmt.CorruptRecordError(
            f"batch at offset {header.base_offset} reaches past the largest offset")
    try:
        return sections.scan(section, header.record_count, header.last_offset_delta)
    except ValueError as exc:
        raise fmt.CorruptRecordError(
            f"records of batch at offset {header.base_offset} do not decode or disagree "
            f"with its header: {exc}") from exc


def _rebuild(header: fmt.BatchHeader, section, keep: list[int]) -> bytes:
    """The batch with only the records at indexes ``keep``, each copied
    byte for byte, every header field but length, CRC and record count
    unchanged."""
    body = sections.pick(section, header.record_count, keep) if keep else b""
    return fmt.pack_batch(
        base_offset=header.base_offset, leader_epoch=header.partition_leader_epoch,
        attributes=header.attributes, last_offset_delta=header.last_offset_delta,
        base_timestamp=header.base_timestamp, max_timestamp=header.max_timestamp,
        producer_id=header.producer_id, producer_epoch=header.producer_epoch,
        base_sequence=header.base_sequence, record_count=len(keep),
        section=fmt.compress(header.compression, body))


class _Aborted:
    """Is a transactional batch part of an aborted transaction?"""

    def __init__(self, aborted: list) -> None:
        self._by_producer: dict[int, list[tuple[int, int]]] = {}
        for entry in aborted:
            self._by_producer.setdefault(entry.producer_id, []).append(
                (entry.first_offset, entry.last_offset))

    def __call__(self, header: fmt.BatchHeader) -> bool:
        for first, last in self._by_producer.get(header.producer_id, ()):
            if first <= header.base_offset < last:
                return True
        return False


def build_offset_map(plan: CleanPlan, budget_bytes: int, throttler: Throttler = UNLIMITED
                     ) -> tuple[OffsetMap, int, int]:
    """The offset map of the dirty section, and where it stops: the dirty
    end, or the first batch that did not fit. Also returns bytes read.

    Nothing of a batch is kept beyond its keys (in the map): the rewrite
    reads and scans again what it needs, which costs less than keeping it
    (memory not reused costs a page fault per 4 KiB)."""
    offsets = OffsetMap(budget_bytes)
    aborted = _Aborted(plan.aborted)
    read = 0
    buffer = bytearray(READ_CHUNK_BYTES)  # for every chunk, in turn
    for ref in plan.refs:
        if ref.next_offset <= plan.first_dirty:
            continue
        with _SegmentReader(ref, throttler, buffer) as reader:
            for header, batch in reader.batches():
                if header.next_offset <= plan.first_dirty or header.is_control:
                    continue
                if header.is_transactional and aborted(header):
                    continue
                if not offsets.put(header, _section(header, batch)):
                    return offsets, header.base_offset, read + reader.bytes_read
            read += reader.bytes_read
    return offsets, plan.dirty_end, read


def _groups(plan: CleanPlan, map_end: int) -> list[list[int]]:
    """Indexes of the segments to rewrite, grouped: consecutive segments
    whose sizes add up to at most ``segment.bytes`` and whose offsets fit a
    relative index entry become one."""
    groups: list[list[int]] = []
    size = 0
    for i, ref in enumerate(plan.refs):
        if ref.base_offset >= map_end:
            break
        if (groups and size + ref.size_bytes <= plan.config.segment_bytes
                and ref.next_offset - plan.refs[groups[-1][0]].base_offset < 2**31 - 1):
            groups[-1].append(i)
            size += ref.size_bytes
        else:
            groups.append([i])
            size = ref.size_bytes
    return groups


def clean(plan: CleanPlan, budget_bytes: int = DEDUPE_BUFFER_DEFAULT,
          throttler: Throttler = UNLIMITED) -> CleanResult:
    """Build the offset map and write the cleaned segments (``.cleaned``
    files, fsynced). Safe on any thread; touches no ``Log`` state."""
    started = time.monotonic()
    offsets, map_end, read = build_offset_map(plan, budget_bytes, throttler)
    result = CleanResult(plan, [], map_end, bytes_read=read)
    config = plan.config
    retention_ms = config.delete_retention_ms
    aborted = _Aborted(plan.aborted)
    now = plan.now_ms
    cleaned_at = plan.cleaned_at
    due: list[int] = []

    def removable(offset: int) -> bool:
        """A tombstone or marker at ``offset`` may go; else note when."""
        for upto, ms in cleaned_at:
            if offset < upto:
                if ms + retention_ms <= now:
                    return True
                due.append(ms + retention_ms)
                return False
        if offset < map_end:  # cleaned for the first time by this pass
            due.append(now + retention_ms)
        return False

    # Per producer: did this pass keep any batch of its open transaction?
    txn_kept: dict[int, bool] = {}
    out: Segment | None = None
    try:
        for group in _groups(plan, map_end):
            base, end = plan.refs[group[0]].base_offset, plan.refs[group[-1]].next_offset
            result.groups.append(CleanedGroup(group, base, end))
            out = Segment.create(plan.directory, base, config.index_interval_bytes,
                                 CLEANED_SUFFIX)
            pieces: list = []
            metas: list[BatchMeta] = []
            pending = 0
            for i in group:
                with _SegmentReader(plan.refs[i], throttler) as reader:
                    for header, batch in reader.batches():
                        kept = _clean_batch(header, batch, offsets, aborted, removable,
                                            plan.producer_last_offsets, txn_kept,
                                            header.next_offset == end, result)
                        if kept is None:
                            continue
                        pieces.append(kept)
                        metas.append(BatchMeta(header.base_offset, header.last_offset,
                                               header.max_timestamp, len(kept)))
                        pending += len(kept)
                        if pending >= WRITE_CHUNK_BYTES:
                            out.append(pieces, metas)
                            throttler.account(pending)
                            result.bytes_written += pending
                            pieces, metas, pending = [], [], 0
                    result.bytes_read += reader.bytes_read
            if pieces:
                out.append(pieces, metas)
                throttler.account(pending)
                result.bytes_written += pending
            if out.next_offset != end:
                raise fmt.CorruptRecordError(
                    f"cleaned segment {base} ends at {out.next_offset}, not {end}")
            out.write_index_entries()
            out.sync()
            out.close()
    except BaseException:
        if out is not None:
            out.close()  # a cleaner process lives on: never leak its descriptors
        result.discard()
        raise
    result.due_ms = min(due) if due else None
    result.seconds = time.monotonic() - started
    return result


def _clean_batch(header: fmt.BatchHeader, batch: memoryview, offsets: OffsetMap,
                 aborted: _Aborted, removable: Callable[[int], bool],
                 producer_last: dict[int, int], txn_kept: dict[int, bool],
                 is_last: bool, result: CleanResult):
    """What of one batch stays: the batch itself, a rebuilt batch with
    fewer (or no) records, or None."""
    pid = header.producer_id
    base = header.base_offset
    count = header.record_count
    if header.is_control:
        result.records_read += count
        open_txn_kept = txn_kept.pop(pid, False)
        if not is_last and not open_txn_kept and removable(base):
            return None
        result.records_kept += count
        return batch
    result.records_read += count
    section = None
    if header.is_transactional and aborted(header):
        keep: list[int] | None = []
    else:
        # Checked again (the bytes were read again, and a cut batch gets a
        # fresh CRC: corruption must not be sealed into it).
        section = _section(header, batch)
        keep, tombstones = offsets.keep(header, section)
        if tombstones:  # perhaps past their time
            gone = {i for i, offset in tombstones if removable(offset)}
            if gone:
                keep = [i for i in (range(count) if keep is None else keep) if i not in gone]
        if keep is None and not count:
            keep = []  # an empty batch stays only where it must
    if keep is None or (count and len(keep) == count):
        kept = batch
        result.records_kept += count
    elif keep or is_last or (pid >= 0 and producer_last.get(pid) == header.last_offset):
        kept = _rebuild(header, section, keep)
        result.records_kept += len(keep)
    else:
        return None
    if header.is_transactional:
        txn_kept[pid] = True
    return kept


# ---------------------------------------------------------------------------
# The cleaner processes
# ---------------------------------------------------------------------------
#: Scheduling priority of a cleaner process: background work, which the
#: broker's event loop (and its clients) win the CPU from.
CLEANER_NICE = 10
_process_throttler = UNLIMITED


def init_cleaner_process(bytes_per_second: float, broker_pid: int) -> None:
    """In each cleaner process, once: lower its priority, die with the
    broker (an orphan must never write ``.cleaned`` files into a log
    directory a restarted broker owns), and set its share of the I/O cap."""
    global _process_throttler
    try:
        os.nice(CLEANER_NICE)
    except OSError:
        pass
    try:
        import ctypes
        import signal
        libc = ctypes.CDLL(None, use_errno=True)
        pr_set_pdeathsig = 1
        libc.prctl(pr_set_pdeathsig, signal.SIGKILL)
    except (OSError, AttributeError):
        pass
    if os.getppid() != broker_pid:  # the broker died before prctl took effect
        os._exit(1)
    _process_throttler = Throttler(bytes_per_second)


def clean_in_process(plan: CleanPlan, budget_bytes: int) -> CleanResult:
    """``clean`` as a cleaner process runs it."""
    return clean(plan, budget_bytes, _process_throttler)


# ---------------------------------------------------------------------------
# Step 3: the swap (owner thread), and finishing one after a crash
# ---------------------------------------------------------------------------
def _no_crash(_step: str) -> None:
    pass


def swap(part_log, result: CleanResult, crash: Callable[[str], None] = _no_crash,
         delete_later: Callable[[list[str]], Any] | None = None) -> bool:
    """Put the cleaned segments in place of the old ones, if the log did
    not change since the plan (else discard them). The old segments' files
    are renamed aside (``.deleted``) and unlinked by ``delete_later`` (the
    broker: on a thread, as unlinking a large file can take a while), or
    here. ``crash`` is called between steps (tests stop there to simulate a
    crash). Returns whether the swap happened."""
    plan = result.plan
    current = part_log.segments
    if (part_log.closed or part_log.layout_version != plan.layout_version
            or not plan.segments or any(s.closed for s in plan.segments)
            or current[:len(plan.segments)] != plan.segments):
        log.info("%s: the log changed while it was cleaned; discarding the pass",
                 plan.directory)
        result.discard()
        return False
    directory = plan.directory
    try:
        part_log.mark_gaps_possible()  # durable before a gap reaches the disk
        for group in result.groups:
            # The log file last: a .log.swap means its indexes are ready too.
            for suffix in (INDEX_SUFFIX, TIME_INDEX_SUFFIX, LOG_SUFFIX):
                os.rename(_path(directory, group.base_offset, suffix, CLEANED_SUFFIX),
                          _path(directory, group.base_offset, suffix, SWAP_SUFFIX))
        crash("renamed-to-swap")
        fsync_directory(directory)
    except OSError:
        # Nothing old is touched yet: remove the pass's files, so no stale
        # .swap is ever completed by a later open, and keep the old log.
        for group in result.groups:
            for suffix in SEGMENT_SUFFIXES:
                for extra in (SWAP_SUFFIX, CLEANED_SUFFIX):
                    _unlink(_path(directory, group.base_offset, suffix, extra))
        raise
    crash("swap-durable")
    doomed: list[str] = []
    for group in result.groups:
        for i in group.sources:
            doomed += plan.segments[i].rename_for_deletion()
    fsync_directory(directory)  # the old names gone before the new ones appear
    crash("old-deleted")
    for group in result.groups:
        _finish_swap(directory, group.base_offset)
    fsync_directory(directory)
    crash("swapped")
    part_log.replace_segments(
        [([plan.segments[i] for i in group.sources],
          Segment.open_clean(directory, group.base_offset, plan.config.index_interval_bytes,
                             gaps_below=LONG_MAX))
         for group in result.groups])
    state = part_log.cleaner_state
    state.note_cleaned(result.map_end, plan.now_ms, plan.config.delete_retention_ms)
    state.due_ms = result.due_ms
    state.save()
    crash("checkpointed")
    (delete_later or unlink_all)(doomed)
    return True


def unlink_all(paths: list[str]) -> None:
    for path in paths:
        _unlink(path)


def _finish_swap(directory: str, base: int) -> None:
    """Rename a segment's ``.swap`` files to their final names: the log
    file first (its presence as ``.swap`` is what recovery looks for); an
    index without a ``.swap`` is deleted, to be rebuilt."""
    os.replace(_path(directory, base, LOG_SUFFIX, SWAP_SUFFIX),
               _path(directory, base, LOG_SUFFIX))
    for suffix in (INDEX_SUFFIX, TIME_INDEX_SUFFIX):
        swapped = _path(directory, base, suffix, SWAP_SUFFIX)
        if os.path.exists(swapped):
            os.replace(swapped, _path(directory, base, suffix))
        else:
            _unlink(_path(directory, base, suffix))


def complete_swaps(directory: str) -> list[str]:
    """At open: finish what a crash interrupted. ``.cleaned`` files go (the
    old segments are intact until a swap begins). A ``<base>.log.swap``
    replaces every segment whose base lies in its offset range; a ``.swap``
    index without its log file goes, with the index it would replace.
    Returns the directory's file names, as they are then."""
    names = os.listdir(directory)
    if not any(name.endswith((CLEANED_SUFFIX, DELETED_SUFFIX, SWAP_SUFFIX)) for name in names):
        return names  # nothing was interrupted: the usual open, one listing
    for name in names:
        if name.endswith((CLEANED_SUFFIX, DELETED_SUFFIX)):
            _unlink(os.path.join(directory, name))
    swaps = sorted(int(name[:20]) for name in names
                   if name.endswith(LOG_SUFFIX + SWAP_SUFFIX) and name[:20].isdigit())
    for base in swaps:
        end = _end_offset(_path(directory, base, LOG_SUFFIX, SWAP_SUFFIX))
        for name in names:
            if not name.endswith(LOG_SUFFIX) or not name[:20].isdigit():
                continue
            other = int(name[:20])
            if base < other < end:
                log.warning("%s: completing an interrupted clean: deleting segment %d, "
                            "which cleaned segment %d replaces", directory, other, base)
                for suffix in SEGMENT_SUFFIXES:
                    _unlink(_path(directory, other, suffix))
        _finish_swap(directory, base)
    for name in os.listdir(directory):
        if name.endswith(SWAP_SUFFIX) and name[:20].isdigit():
            # An index .swap whose log file was already renamed, or not yet.
            _unlink(os.path.join(directory, name))
            _unlink(os.path.join(directory, name[:-len(SWAP_SUFFIX)]))
    fsync_directory(directory)
    return os.listdir(directory)


def _end_offset(path: str) -> int:
    """The offset after the last batch of a (complete, fsynced) segment file."""
    end = 0
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        pos = 0
        while pos + fmt.HEADER_SIZE <= size:
            header = fmt.parse_header(os.pread(fd, fmt.HEADER_SIZE, pos))
            if header.batch_length < fmt.MIN_BATCH_LENGTH:
                break
            end = header.next_offset
            pos += header.size_bytes
    finally:
        os.close(fd)
    return end
