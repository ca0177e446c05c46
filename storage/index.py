"""Sparse indexes of a segment: offset -> file position, timestamp -> offset.

Both are sorted arrays of fixed-size entries, held in memory (binary search
with ``bisect``) and appended to a file at flush. An entry is added at most
once per ``index.interval.bytes`` of log, so a 1 GiB segment at the default
4 KiB interval has at most 262 144 entries (4 MiB of memory for both arrays).

On-disk entry layouts (big-endian)::

    .index       ">iI"  relative offset (base offset of a batch minus the
                        segment's base offset), file position of that batch
    .timeindex   ">qi"  largest timestamp seen so far in the segment, relative
                        offset of the batch that holds it

The files are a cache: recovery rebuilds them from the log when they fail the
sanity checks or may be stale (``Segment`` decides).

Invariants (``check_invariants``): keys strictly increasing; values
non-decreasing; ``persisted_count <= len``.
"""

from __future__ import annotations

import array
import bisect
import errno
import os
import struct
import threading

OFFSET_ENTRY = struct.Struct(">iI")  # relative offset, position
TIME_ENTRY = struct.Struct(">qi")  # timestamp ms, relative offset
assert OFFSET_ENTRY.size == 8 and TIME_ENTRY.size == 12


class IndexCorruptError(ValueError):
    """The index file fails a sanity check; the segment rebuilds it."""


class SparseIndex:
    """Sorted ``(key, value)`` pairs persisted as fixed-size entries.

    Owned by one thread (the log's owner) except ``sync``, which a flush
    worker calls under ``lock``; ``close`` takes the same lock.

    The file is opened only for each write, read and fsync, never kept
    open: a broker of 10,000 partitions would otherwise hold three
    descriptors per partition (the segment, its two indexes) and run out
    of them (30,000 against a common limit of 20,000 or less), where it
    holds one. Entries are written at flush, once per
    ``index.interval.bytes`` of log, so the opens cost little.
    """

    def __init__(self, path: str, entry: struct.Struct, *, lazy: bool = False) -> None:
        self.path = path
        self._entry = entry
        self._keys = array.array("q")
        self._values = array.array("q")
        # Entries [0, persisted_count) are in the file (maybe not yet fsynced).
        self._persisted_count = 0
        self.lock = threading.Lock()
        # Whether the file exists (made here or found by ``load``). ``lazy``:
        # it is created when the first entry is written, so a segment that
        # never gets one, as most of a quiet partition's do not, costs one
        # file instead of three.
        self._exists = False
        self._closed = False
        # Changes written to the file, and how many of them the last fsync
        # covered (``sync`` skips a file with nothing new).
        self._writes = 0
        self._synced_writes = 0
        if not lazy:
            self._write_at(b"", 0)

    def _write_at(self, data: bytes, position: int) -> None:
        """Write ``data`` at ``position``, creating the file if need be (not
        once closed: its segment let go of it, and the path may be gone)."""
        self._check_open()
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT, 0o644)
        try:
            if data:
                os.pwrite(fd, data, position)
        finally:
            os.close(fd)
        self._exists = True
        self._writes += 1

    def _check_open(self) -> None:
        if self._closed:
            raise OSError(errno.EBADF, f"{self.path}: the index is closed")

    # -- loading ---------------------------------------------------------
    def load(self) -> None:
        """Read the file into memory. Raises ``IndexCorruptError`` when the
        file is not a whole number of entries or not sorted."""
        try:
            fd = os.open(self.path, os.O_RDONLY)
        except FileNotFoundError:
            return  # never written: no entries (a lost one is rebuilt alike)
        try:
            self._exists = True
            size = os.fstat(fd).st_size
            if size % self._entry.size:
                raise IndexCorruptError(
                    f"{self.path}: size {size} is not a multiple of {self._entry.size}")
            data = os.pread(fd, size, 0)
        finally:
            os.close(fd)
        keys, values = array.array("q"), array.array("q")
        for key, value in self._entry.iter_unpack(data):
            if keys and (key <= keys[-1] or value < values[-1]):
                raise IndexCorruptError(f"{self.path}: entries out of order at key {key}")
            keys.append(key)
            values.append(value)
        self._keys, self._values = keys, values
        self._persisted_count = len(keys)

    # -- queries ---------------------------------------------------------
    def __len__(self) -> int:
        return len(self._keys)

    def entry(self, i: int) -> tuple[int, int]:
        return self._keys[i], self._values[i]

    def last(self) -> tuple[int, int] | None:
        return (self._keys[-1], self._values[-1]) if self._keys else None

    def floor(self, key: int) -> int:
        """Index of the last entry with key <= ``key``, or -1."""
        return bisect.bisect_right(self._keys, key) - 1

    def lower(self, key: int) -> int:
        """Index of the last entry with key < ``key``, or -1."""
        return bisect.bisect_left(self._keys, key) - 1

    def floor_value(self, value: int) -> int:
        """Index of the last entry with value <= ``value``, or -1 (values are
        sorted too, so this is a binary search as well)."""
        return bisect.bisect_right(self._values, value) - 1

    # -- changes ---------------------------------------------------------
    def append(self, key: int, value: int) -> None:
        assert not self._keys or key > self._keys[-1], (self.path, key, self._keys[-1])
        assert not self._values or value >= self._values[-1], (self.path, value)
        self._keys.append(key)
        self._values.append(value)

    def truncate_entries(self, count: int) -> None:
        """Keep only the first ``count`` entries, in memory and in the file."""
        if count >= len(self._keys):
            return
        del self._keys[count:]
        del self._values[count:]
        if self._persisted_count > count:
            self._check_open()
            self._persisted_count = count
            os.truncate(self.path, count * self._entry.size)
            self._writes += 1

    def clear(self) -> None:
        self.truncate_entries(0)
        try:  # (a leftover file of this name, if not made here)
            os.truncate(self.path, 0)
        except FileNotFoundError:
            return
        self._exists = True
        self._writes += 1

    def write_pending(self) -> bool:
        """Write entries not yet in the file (to the page cache; ``sync``
        makes them durable). True if that created the file: its name is
        durable only once its directory is fsynced."""
        start = self._persisted_count
        end = len(self._keys)
        if start == end:
            return False
        created = not self._exists
        pack = self._entry.pack
        data = b"".join(pack(self._keys[i], self._values[i]) for i in range(start, end))
        self._write_at(data, start * self._entry.size)
        self._persisted_count = end
        return created

    @property
    def on_disk(self) -> bool:
        """Whether the file exists (made here, or found by ``load``)."""
        return self._exists

    def sync(self) -> None:
        """fsync what was written to the file since the last sync (any
        thread). A file gone meanwhile (its segment deleted or truncated
        away) has nothing left to keep."""
        with self.lock:
            writes = self._writes
            if self._closed or not self._exists or writes == self._synced_writes:
                return
            try:
                fd = os.open(self.path, os.O_RDONLY)
            except FileNotFoundError:
                return
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
            self._synced_writes = writes

    def close(self) -> None:
        with self.lock:
            self._closed = True

    def check_invariants(self) -> None:
        assert len(self._keys) == len(self._values)
        assert self._persisted_count <= len(self._keys)
        for i in range(1, len(self._keys)):
            assert self._keys[i] > self._keys[i - 1], (self.path, i)
            assert self._values[i] >= self._values[i - 1], (self.path, i)
