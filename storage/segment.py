"""One segment of a partition log: ``<base offset>.log`` plus its indexes.

A segment holds whole batches back to back, from ``base_offset`` up to (not
including) ``next_offset``. Only the last segment of a log (the active one)
is appended to. Files are named by the base offset in 20 digits, as Kafka
names them, so a directory listing sorts in offset order.

Threading: the log's owner thread does everything except ``sync`` (fsync),
which a flush worker may run concurrently; ``close`` waits for a running sync.

Batches are in offset order. In a segment the log cleaner rewrote
(``storage/cleaner.py``) they have gaps between them, and its first batch may
start above ``base_offset``; the cleaner keeps each rewritten segment's last
batch (emptied if need be), so a segment still ends where the next begins.

Invariants (``check_invariants``):
  - ``base_offset <= next_offset``; the segment is empty iff they are equal;
  - the file is exactly ``size_bytes`` long and ends on a batch boundary;
  - index entries lie inside the file and below ``next_offset``.
"""

from __future__ import annotations

import bisect
import logging
import os
import threading
from typing import Callable, Iterator, NamedTuple

from storage import batch as fmt
from storage.batch import BatchHeader, CorruptRecordError, RecordFormatError
from storage.index import OFFSET_ENTRY, TIME_ENTRY, IndexCorruptError, SparseIndex

log = logging.getLogger(__name__)

LOG_SUFFIX = ".log"
INDEX_SUFFIX = ".index"
TIME_INDEX_SUFFIX = ".timeindex"
DELETED_SUFFIX = ".deleted"  # a segment file waiting to be unlinked

SCAN_CHUNK_MIN_BYTES = 4 * 1024  # first read-ahead when walking batch headers
SCAN_CHUNK_BYTES = 64 * 1024  # largest read-ahead when walking batch headers
#: A segment remembers where its latest batches (appended since it was
#: opened, this many at least) start: a read at or near the log end, a
#: follower's or a tailing consumer's, finds its batch at once instead of
#: walking up to index.interval.bytes of headers from the last index entry
#: (over half the leader's core work for a one-record produce, by cProfile).
RECENT_BATCHES = 8
#: Positions of offsets further back that ``Segment.position_of`` keeps: the
#: offsets long-polling consumers wait at (forgotten all at once when full).
LOOKED_UP_POSITIONS = 64
RECOVERY_CHUNK_BYTES = 4 * 1024 * 1024  # read size when validating whole batches
IOV_MAX = 512  # pieces per writev call, well under Linux's 1024


def file_stem(base_offset: int) -> str:
    return f"{base_offset:020d}"


class BatchMeta(NamedTuple):
    """What a segment needs to know about a batch it appends."""

    base_offset: int
    last_offset: int
    max_timestamp: int
    size_bytes: int


class IndexMissingError(IndexCorruptError):
    """A segment big enough to have index entries has no index file."""


class Segment:
    """A ``.log`` file with its offset and time indexes."""

    def __init__(self, directory: str, base_offset: int, index_interval_bytes: int,
                 suffix: str = "", *, gaps_below: int = 0) -> None:
        self.directory = directory
        #: Recovery accepts a gap between batches only where it starts below
        #: this offset (a compacted log, or its part the cleaner rewrote):
        #: elsewhere offsets are dense, and a jump means a corrupt base offset.
        self.gaps_below = gaps_below
        self.base_offset = base_offset
        self.index_interval_bytes = index_interval_bytes
        stem = os.path.join(directory, file_stem(base_offset))
        # ``suffix`` names a segment the cleaner is writing (``.cleaned``).
        self.log_path = stem + LOG_SUFFIX + suffix
        self._fd = os.open(self.log_path, os.O_RDWR | os.O_CREAT, 0o644)
        self._lock = threading.Lock()  # guards _fd against close during sync
        # A live segment's index files appear with their first entry; the
        # cleaner's output (``suffix``) has them at once, for its swap.
        lazy = not suffix
        self.offset_index = SparseIndex(stem + INDEX_SUFFIX + suffix, OFFSET_ENTRY, lazy=lazy)
        self.time_index = SparseIndex(stem + TIME_INDEX_SUFFIX + suffix, TIME_ENTRY, lazy=lazy)
        self.size_bytes = 0
        # Offset after the last batch. Invariant: base_offset <= next_offset.
        self.next_offset = base_offset
        # Largest record timestamp in the segment (-1 when empty) and the base
        # offset of the batch holding it.
        self.max_timestamp = fmt.NO_TIMESTAMP
        self.offset_of_max_timestamp = base_offset
        # Max timestamp of the first batch: segment.ms rolls are measured from it.
        self.first_batch_timestamp = fmt.NO_TIMESTAMP
        self._bytes_since_index_entry = 0
        # The last offsets and positions of the latest batches appended,
        # contiguous up to the end of the file; every batch before them
        # ends at or below ``_recent_floor`` (None: nothing remembered).
        self._recent_last: list[int] = []
        self._recent_pos: list[int] = []
        self._recent_floor: int | None = None
        #: Positions ``position_of`` found by walking, by offset (None: none).
        self._looked_up: dict[int, int] | None = None

    # -- opening ---------------------------------------------------------
    @classmethod
    def create(cls, directory: str, base_offset: int, index_interval_bytes: int,
               suffix: str = "", *, gaps_below: int = 0, fresh: bool = False) -> "Segment":
        """A new, empty segment. Leftover files of the same name (from a
        truncation that removed this segment earlier) are emptied, unless
        ``fresh`` says the directory was just made (there are none)."""
        segment = cls(directory, base_offset, index_interval_bytes, suffix,
                      gaps_below=gaps_below)
        if not fresh:
            os.ftruncate(segment._fd, 0)
            segment.offset_index.clear()
            segment.time_index.clear()
        return segment

    @classmethod
    def open_clean(cls, directory: str, base_offset: int, index_interval_bytes: int,
                   *, gaps_below: int = 0) -> "Segment":
        """Open a segment that was fully flushed: trust the data, load the
        indexes (rebuilding them if they fail the sanity checks) and re-read
        only the batches after the last index entry."""
        segment = cls(directory, base_offset, index_interval_bytes, gaps_below=gaps_below)
        try:
            segment._load_indexes()
            segment._restore_prefix_state(os.fstat(segment._fd).st_size)
        except (IndexCorruptError, CorruptRecordError) as exc:
            # A missing index is ordinary (a segment too small for an entry
            # has none, a crash may lose a new one's name): no warning.
            (log.debug if isinstance(exc, IndexMissingError) else log.warning)(
                "rebuilding indexes of %s: %s", segment.log_path, exc)
            segment.recover(0)
        return segment

    @classmethod
    def open_for_recovery(cls, directory: str, base_offset: int, index_interval_bytes: int,
                          from_offset: int,
                          on_batch: Callable[[BatchHeader], None], *, gaps_below: int = 0
                          ) -> tuple["Segment", bool]:
        """Open a segment that may hold unflushed data from ``from_offset`` on:
        trust what precedes it, validate every batch from there, truncate at
        the first bad byte. Returns the segment and whether it was truncated."""
        segment = cls(directory, base_offset, index_interval_bytes, gaps_below=gaps_below)
        start_pos = 0
        if from_offset > base_offset:
            try:
                segment._load_indexes()
                start_pos = segment._trusted_position(from_offset)
                segment._restore_prefix_state(start_pos)
            except (IndexCorruptError, CorruptRecordError) as exc:
                log.warning("%s: cannot locate offset %d in the flushed prefix (%s); "
                            "validating the whole segment", segment.log_path, from_offset, exc)
                start_pos = 0
        truncated = segment.recover(start_pos, on_batch)
        return segment, truncated

    def _load_indexes(self) -> None:
        self.offset_index.load()
        self.time_index.load()
        size = os.fstat(self._fd).st_size
        if size > self.index_interval_bytes and not (self.offset_index.on_disk
                                                     and self.time_index.on_disk):
            # Index files appear with their first entry (lazy), and a crash
            # may lose a new one's name: a segment this big had entries.
            raise IndexMissingError(f"{self.log_path}: an index file is missing")

    def _trusted_position(self, offset: int) -> int:
        """File position where the batch starting at ``offset`` begins (or the
        end of the data, if ``offset`` is the end of the flushed prefix).
        Walks headers from the nearest index entry and never reads a header
        at or past ``offset``, which may be torn. Raises when ``offset`` is
        not a batch boundary."""
        file_size = os.fstat(self._fd).st_size
        # Only entries strictly below ``offset``: they describe flushed batches.
        # An entry at ``offset`` itself was written with unflushed data and
        # may be torn, so the position is derived from flushed headers.
        i = self.offset_index.floor(offset - self.base_offset - 1)
        pos, expected = 0, self.base_offset
        if i >= 0:
            rel, pos = self.offset_index.entry(i)
            expected = self.base_offset + rel
        while expected < offset:
            if pos + fmt.HEADER_SIZE > file_size:
                raise CorruptRecordError(f"flushed prefix ends before offset {offset}")
            header = self._header_at(pos)
            if not self._follows(header.base_offset, expected) \
                    or header.batch_length < fmt.MIN_BATCH_LENGTH:
                raise CorruptRecordError(
                    f"batch at {pos} has offset {header.base_offset}, expected {expected}")
            pos += header.size_bytes
            expected = header.next_offset
        if expected != offset or pos > file_size:
            raise CorruptRecordError(f"offset {offset} is not a batch boundary")
        return pos

    def _restore_prefix_state(self, end_pos: int) -> None:
        """Make the in-memory state describe exactly the batches in
        ``[0, end_pos)`` (``end_pos`` a trusted batch boundary): drop index
        entries past it and re-derive next offset, max timestamp and index
        spacing from the last index entry plus a short walk of headers."""
        self.forget_recent_batches()
        self.offset_index.truncate_entries(self.offset_index.floor_value(end_pos - 1) + 1)
        last = self.offset_index.last()
        start_pos, self.next_offset = (0, self.base_offset) if last is None else (
            last[1], self.base_offset + last[0])
        self.max_timestamp = fmt.NO_TIMESTAMP
        self.offset_of_max_timestamp = self.base_offset
        for pos, header in self._iter_headers(start_pos, end_pos):
            if not self._follows(header.base_offset, self.next_offset):
                raise CorruptRecordError(
                    f"{self.log_path}: batch at {pos} has offset {header.base_offset}, "
                    f"expected {self.next_offset}")
            self._note_batch(header.base_offset, header.next_offset, header.max_timestamp)
        # A time entry names the batch holding the maximum so far, which may
        # precede the indexed batch; keep those that name a batch we keep.
        count = len(self.time_index)
        while count and self.base_offset + self.time_index.entry(count - 1)[1] >= self.next_offset:
            count -= 1
        self.time_index.truncate_entries(count)
        last_time = self.time_index.last()
        if last_time is not None and last_time[0] > self.max_timestamp:
            self.max_timestamp = last_time[0]
            self.offset_of_max_timestamp = self.base_offset + last_time[1]
        self._bytes_since_index_entry = end_pos - start_pos
        self.first_batch_timestamp = (self._header_at(0).max_timestamp if end_pos
                                      else fmt.NO_TIMESTAMP)
        self.size_bytes = end_pos

    # -- recovery --------------------------------------------------------
    def recover(self, start_pos: int,
                on_batch: Callable[[BatchHeader], None] | None = None) -> bool:
        """Validate every batch from ``start_pos``, rebuild the index entries
        for them and truncate the file at the first invalid byte. Returns
        whether anything was truncated. ``start_pos`` is 0 or a trusted batch
        boundary the in-memory state already describes
        (``_restore_prefix_state``)."""
        if start_pos == 0:
            self._reset_state()
        assert self.size_bytes == start_pos, (self.size_bytes, start_pos)
        pos = start_pos
        bad_reason = None
        for pos, header, error in self._iter_validated(start_pos):
            if error is None and not self._follows(header.base_offset, self.next_offset):
                error = (f"offset {header.base_offset} does not follow "
                         f"{self.next_offset - 1}")
            if error is not None:
                bad_reason = error
                break
            self._index_batch(pos, header.base_offset, header.next_offset,
                              header.max_timestamp, header.size_bytes)
            self.size_bytes = pos + header.size_bytes
            if on_batch is not None:
                on_batch(header)
        else:
            pos = self.size_bytes
        file_size = os.fstat(self._fd).st_size
        if pos < file_size:
            log.warning("%s: truncating %d bytes of torn or corrupt data at position %d "
                        "(offset %d): %s", self.log_path, file_size - pos, pos,
                        self.next_offset, bad_reason or "incomplete batch")
            os.ftruncate(self._fd, pos)
            self.size_bytes = pos
            return True
        return False

    def _follows(self, base_offset: int, expected: int) -> bool:
        """May a batch at ``base_offset`` follow one that ended at ``expected``?"""
        return base_offset == expected or expected < base_offset and expected < self.gaps_below

    def _reset_state(self) -> None:
        self.forget_recent_batches()
        self.offset_index.clear()
        self.time_index.clear()
        self.size_bytes = 0
        self.next_offset = self.base_offset
        self.max_timestamp = fmt.NO_TIMESTAMP
        self.offset_of_max_timestamp = self.base_offset
        self.first_batch_timestamp = fmt.NO_TIMESTAMP
        self._bytes_since_index_entry = 0

    def _iter_validated(self, start_pos: int
                        ) -> Iterator[tuple[int, BatchHeader | None, str | None]]:
        """Yield ``(pos, header, None)`` for each valid batch from ``start_pos``
        and finally ``(pos, None, reason)`` for the first invalid one."""
        file_size = os.fstat(self._fd).st_size
        pos = start_pos
        buf = b""
        buf_pos = pos
        while pos < file_size:
            available = file_size - pos
            if available < fmt.HEADER_SIZE:
                yield pos, None, f"{available} trailing bytes, less than a batch header"
                return
            if pos + fmt.HEADER_SIZE > buf_pos + len(buf):
                buf = os.pread(self._fd, RECOVERY_CHUNK_BYTES, pos)
                buf_pos = pos
            header = fmt.parse_header(buf, pos - buf_pos)
            try:
                fmt.check_header(header, available, fmt.MAX_BATCH_BYTES, strict=False)
            except RecordFormatError as exc:
                yield pos, None, str(exc)
                return
            end = pos + header.size_bytes
            if end > buf_pos + len(buf):
                buf = os.pread(self._fd, max(RECOVERY_CHUNK_BYTES, header.size_bytes), pos)
                buf_pos = pos
            rel = pos - buf_pos
            if fmt.compute_crc(buf, rel, rel + header.size_bytes) != header.crc:
                yield pos, None, "CRC mismatch"
                return
            yield pos, header, None
            pos = end

    # -- appending -------------------------------------------------------
    @property
    def is_empty(self) -> bool:
        return self.size_bytes == 0

    def append(self, pieces: list, metas: list[BatchMeta]) -> None:
        """Write ``pieces`` (the bytes of the batches described by ``metas``,
        in order) at the end of the file and index them."""
        pos = self.size_bytes
        total = sum(meta.size_bytes for meta in metas)
        written = 0
        for i in range(0, len(pieces), IOV_MAX):
            group = pieces[i:i + IOV_MAX]
            expected = sum(len(p) for p in group)
            n = os.pwritev(self._fd, group, pos + written)
            if n != expected:  # short write: finish byte by byte-range
                rest = memoryview(b"".join(bytes(p) for p in group))[n:]
                while rest:
                    rest = rest[os.pwrite(self._fd, rest, pos + written + n):]
                    n = expected - len(rest)
            written += expected
        assert written == total, (written, total)
        recent_last, recent_pos = self._recent_last, self._recent_pos
        if not recent_last:  # from here on: what follows the batches already here
            self._recent_floor = self.next_offset - 1
        for meta in metas:
            self._index_batch(pos, meta.base_offset, meta.last_offset + 1,
                              meta.max_timestamp, meta.size_bytes)
            recent_last.append(meta.last_offset)
            recent_pos.append(pos)
            pos += meta.size_bytes
        self.size_bytes = pos
        if len(recent_last) > 2 * RECENT_BATCHES:
            cut = len(recent_last) - RECENT_BATCHES
            self._recent_floor = recent_last[cut - 1]
            del recent_last[:cut], recent_pos[:cut]

    def forget_recent_batches(self) -> None:
        """Drop what ``append`` remembered (a segment rolled over: reads
        near the log end go to the next one), and the positions looked up
        (a truncation may put other batches there)."""
        self._recent_last, self._recent_pos, self._recent_floor = [], [], None
        self._looked_up = None

    def _index_batch(self, pos: int, base_offset: int, next_offset: int,
                     max_timestamp: int, size_bytes: int) -> None:
        if self._bytes_since_index_entry > self.index_interval_bytes:
            self._note_batch(base_offset, next_offset, max_timestamp)
            self.offset_index.append(base_offset - self.base_offset, pos)
            last_time = self.time_index.last()
            if last_time is None or self.max_timestamp > last_time[0]:
                self.time_index.append(self.max_timestamp,
                                       self.offset_of_max_timestamp - self.base_offset)
            self._bytes_since_index_entry = 0
        else:
            self._note_batch(base_offset, next_offset, max_timestamp)
        if pos == 0:
            self.first_batch_timestamp = max_timestamp
        self._bytes_since_index_entry += size_bytes

    def _note_batch(self, base_offset: int, next_offset: int, max_timestamp: int) -> None:
        self.next_offset = next_offset
        if max_timestamp > self.max_timestamp:
            self.max_timestamp = max_timestamp
            self.offset_of_max_timestamp = base_offset

    # -- reading ---------------------------------------------------------
    def _header_at(self, pos: int) -> BatchHeader:
        data = os.pread(self._fd, fmt.HEADER_SIZE, pos)
        if len(data) < fmt.HEADER_SIZE:
            raise CorruptRecordError(f"{self.log_path}: short header at position {pos}")
        return fmt.parse_header(data)

    def _iter_headers(self, start_pos: int, end_pos: int | None = None
                      ) -> Iterator[tuple[int, BatchHeader]]:
        """Walk batch headers from ``start_pos`` (a batch boundary) to
        ``end_pos`` (default: the end of the data), reading ahead in chunks."""
        end = self.size_bytes if end_pos is None else end_pos
        pos = start_pos
        buf = b""
        buf_pos = pos
        # Start small (a lookup usually needs one header), grow for long walks.
        chunk_bytes = SCAN_CHUNK_MIN_BYTES
        while pos < end:
            if pos + fmt.HEADER_SIZE > buf_pos + len(buf):
                buf = os.pread(self._fd, chunk_bytes, pos)
                buf_pos = pos
                chunk_bytes = min(chunk_bytes * 4, SCAN_CHUNK_BYTES)
                if len(buf) < fmt.HEADER_SIZE:
                    raise CorruptRecordError(f"{self.log_path}: short header at {pos}")
            header = fmt.parse_header(buf, pos - buf_pos)
            if header.batch_length < fmt.MIN_BATCH_LENGTH or pos + header.size_bytes > end:
                raise CorruptRecordError(f"{self.log_path}: bad batch length at {pos}")
            yield pos, header
            pos += header.size_bytes

    def iter_batch_headers(self, start_pos: int = 0) -> Iterator[tuple[int, BatchHeader]]:
        """``(position, header)`` of every batch from ``start_pos`` (a batch
        boundary), in order (no CRC checks)."""
        return self._iter_headers(start_pos)

    def _recent_position(self, offset: int) -> int | None:
        """For an offset among the latest batches appended, or past them:
        the position of the batch holding it (or of the next), the end of
        the data when none does; None for an offset further back."""
        floor = self._recent_floor
        if floor is None or offset <= floor:
            return None
        j = bisect.bisect_left(self._recent_last, offset)
        return self._recent_pos[j] if j < len(self._recent_last) else self.size_bytes

    def find_batch(self, offset: int) -> tuple[int, BatchHeader] | None:
        """Position and header of the first batch whose last offset is
        >= ``offset`` (the batch holding it, or the next one), else None."""
        pos = self._recent_position(offset)
        if pos is not None:
            return None if pos == self.size_bytes else (pos, self._header_at(pos))
        i = self.offset_index.floor(offset - self.base_offset)
        start = self.offset_index.entry(i)[1] if i >= 0 else 0
        for pos, header in self._iter_headers(start):
            if header.last_offset >= offset:
                return pos, header
        return None

    def position_of(self, offset: int) -> int:
        """Where a read from ``offset`` starts: the position of the first
        batch whose last offset is >= ``offset``, or the end of the data.
        Among the latest batches a lookup in memory, without reading."""
        pos = self._recent_position(offset)
        if pos is not None:
            return pos
        looked_up = self._looked_up
        if looked_up is not None:
            pos = looked_up.get(offset)
            if pos is not None:
                return pos
        found = self.find_batch(offset)
        if found is None:
            return self.size_bytes
        # A batch's position holds until a truncation (which forgets these):
        # fetches waiting at the same offsets ask again at every append.
        if looked_up is None or len(looked_up) >= LOOKED_UP_POSITIONS:
            looked_up = self._looked_up = {}
        looked_up[offset] = found[0]
        return found[0]

    def read(self, offset: int, max_bytes: int, upper_bound_offset: int,
             min_one_batch: bool) -> tuple[bytes, int]:
        """Whole batches from the one holding ``offset``, at most ``max_bytes``
        (but at least one batch if ``min_one_batch``), none reaching
        ``upper_bound_offset``. Returns the bytes and the offset after them."""
        found = self.find_batch(offset)
        if found is None:
            return b"", self.next_offset
        start_pos, first = found
        if first.last_offset >= upper_bound_offset:
            return b"", first.base_offset
        if first.size_bytes > max_bytes:  # a lookup, or one big batch: no walk needed
            end_pos, end_offset = start_pos, first.base_offset
        else:
            end_pos, end_offset = self._last_boundary(start_pos, start_pos + max_bytes,
                                                      upper_bound_offset)
        if end_pos == start_pos:
            if not min_one_batch:
                return b"", first.base_offset
            end_pos, end_offset = start_pos + first.size_bytes, first.next_offset
        return os.pread(self._fd, end_pos - start_pos, start_pos), end_offset

    def _last_boundary(self, start_pos: int, limit_pos: int, upper_bound_offset: int
                       ) -> tuple[int, int]:
        """The furthest batch boundary at or before ``limit_pos`` such that
        every batch before it ends below ``upper_bound_offset``, with the
        offset that starts there. Uses the index to skip, then walks."""
        if self.size_bytes <= limit_pos and self.next_offset <= upper_bound_offset:
            return self.size_bytes, self.next_offset
        i = min(self.offset_index.floor_value(limit_pos),
                self.offset_index.floor(upper_bound_offset - self.base_offset))
        pos, offset = start_pos, None
        if i >= 0:
            rel, entry_pos = self.offset_index.entry(i)
            if entry_pos > start_pos:
                pos, offset = entry_pos, self.base_offset + rel
        if offset is None:
            offset = self._header_at(start_pos).base_offset
        for pos_i, header in self._iter_headers(pos):
            if pos_i + header.size_bytes > limit_pos or header.last_offset >= upper_bound_offset:
                return pos_i, header.base_offset
            pos, offset = pos_i + header.size_bytes, header.next_offset
        return pos, offset

    def read_batch_at(self, pos: int, header: BatchHeader) -> bytes:
        return os.pread(self._fd, header.size_bytes, pos)

    def find_offset_by_timestamp(self, timestamp_ms: int, start_offset: int) -> int | None:
        """Offset of the first record at or after ``start_offset`` whose
        timestamp is >= ``timestamp_ms``, or None if the segment has none."""
        if self.max_timestamp < timestamp_ms:
            return None
        i = self.time_index.lower(timestamp_ms)
        scan_from = self.base_offset + self.time_index.entry(i)[1] if i >= 0 else self.base_offset
        found = self.find_batch(max(scan_from, start_offset))
        if found is None:
            return None
        for pos, header in self._iter_headers(found[0]):
            if header.max_timestamp < timestamp_ms:
                continue
            for record in fmt.iter_records(self.read_batch_at(pos, header)):
                if record.offset >= start_offset and record.timestamp >= timestamp_ms:
                    return record.offset
        return None

    # -- truncation ------------------------------------------------------
    def truncate_to(self, offset: int) -> int:
        """Remove every batch whose last offset is >= ``offset``; a batch
        holding ``offset`` goes whole, so the segment may end below it.
        Returns the bytes removed."""
        found = self.find_batch(offset)
        if found is None:
            return 0
        pos = found[0]
        removed = self.size_bytes - pos
        os.ftruncate(self._fd, pos)
        if pos == 0:
            self._reset_state()
        else:
            self._restore_prefix_state(pos)
        return removed

    # -- durability and lifecycle ---------------------------------------
    def write_index_entries(self) -> bool:
        """Write pending index entries to their files (page cache). True if
        that created an index file (its directory wants an fsync)."""
        created = self.offset_index.write_pending()
        return self.time_index.write_pending() or created

    def sync(self) -> None:
        """fsync the log and both index files. Safe from a worker thread."""
        with self._lock:
            if self._fd < 0:
                return
            os.fsync(self._fd)
        self.offset_index.sync()
        self.time_index.sync()

    def close(self) -> None:
        with self._lock:
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1
        self.offset_index.close()
        self.time_index.close()

    @property
    def closed(self) -> bool:
        return self._fd < 0

    def rename_for_deletion(self) -> list[str]:
        """Close the segment and rename its files to ``<name>.deleted``
        (a rename is cheap where an unlink of a big file is not); returns
        the new paths, for the caller to unlink off the event loop."""
        self.close()
        renamed = []
        for path in (self.log_path, self.offset_index.path, self.time_index.path):
            try:
                os.rename(path, path + DELETED_SUFFIX)
                renamed.append(path + DELETED_SUFFIX)
            except FileNotFoundError:
                pass
        return renamed

    def delete(self) -> None:
        self.close()
        for path in (self.log_path, self.offset_index.path, self.time_index.path):
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass

    def check_invariants(self) -> None:
        assert self.base_offset <= self.next_offset, (self.base_offset, self.next_offset)
        assert (self.size_bytes == 0) == (self.next_offset == self.base_offset), self.log_path
        assert os.fstat(self._fd).st_size == self.size_bytes, self.log_path
        self.offset_index.check_invariants()
        self.time_index.check_invariants()
        last = self.offset_index.last()
        if last is not None:
            assert last[1] < self.size_bytes and last[0] + self.base_offset < self.next_offset

    def __repr__(self) -> str:
        return (f"Segment(base={self.base_offset}, next={self.next_offset}, "
                f"size={self.size_bytes})")
