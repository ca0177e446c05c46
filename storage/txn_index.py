"""Aborted transactions of a partition: what a ``read_committed`` consumer
must skip.

When an ABORT marker is appended for a producer whose transaction began at
``first_offset``, the log records ``AbortedTxn(producer_id, first_offset,
last_offset=marker offset, last_stable_offset)`` in the ``.txnindex`` file of
the segment holding the marker (Kafka's layout, one fixed-size entry each).
A ``read_committed`` fetch returns, with its batches, the aborted
transactions that overlap them; the consumer drops those producers' records
between ``first_offset`` and their marker.

``last_stable_offset`` is the partition's LSO just after the abort: every
transaction completed later began at or after it, so a scan for the
transactions overlapping ``[start, upper)`` may stop at the first entry
whose LSO reaches ``upper``.

Entries are appended in marker order and fsynced at once (aborts are rare,
and a lost entry would let a read_committed consumer see aborted data).
"""

from __future__ import annotations

import bisect
import os
import struct
from typing import NamedTuple

TXN_INDEX_SUFFIX = ".txnindex"
ENTRY = struct.Struct(">qqqq")  # producer_id, first_offset, last_offset, last_stable_offset


class AbortedTxn(NamedTuple):
    producer_id: int
    first_offset: int
    last_offset: int  # the ABORT marker's offset
    last_stable_offset: int


def txn_index_path(directory: str, base_offset: int) -> str:
    return os.path.join(directory, f"{base_offset:020d}{TXN_INDEX_SUFFIX}")


class AbortedTxns:
    """Every aborted transaction of one log, in marker order, in memory and
    in the ``.txnindex`` file of the segment that holds each marker."""

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self._entries: list[AbortedTxn] = []
        self._last_offsets: list[int] = []  # each entry's marker offset, for bisecting
        self._segment_of: list[int] = []  # base offset of each entry's segment

    def load(self, segment_bases: list[int], log_end_offset: int) -> None:
        """Read the index files of ``segment_bases`` (at open); entries at or
        past the log end (a crash cut the log below them) and torn tails are
        dropped from the files."""
        self._entries, self._last_offsets, self._segment_of = [], [], []
        for base in segment_bases:
            path = txn_index_path(self.directory, base)
            try:
                with open(path, "rb") as f:
                    data = f.read()
            except FileNotFoundError:
                continue
            whole = len(data) - len(data) % ENTRY.size
            dropped = whole != len(data)
            for pos in range(0, whole, ENTRY.size):
                entry = AbortedTxn(*ENTRY.unpack_from(data, pos))
                if entry.last_offset < log_end_offset:
                    self._keep(entry, base)
                else:
                    dropped = True
            if dropped:
                self._rewrite(base)

    def _keep(self, entry: AbortedTxn, segment_base: int) -> None:
        self._entries.append(entry)
        self._last_offsets.append(entry.last_offset)
        self._segment_of.append(segment_base)

    @property
    def entries(self) -> list[AbortedTxn]:
        return list(self._entries)

    def append(self, entry: AbortedTxn, segment_base: int) -> None:
        if self._last_offsets and entry.last_offset <= self._last_offsets[-1]:
            return  # already recorded (replayed after a crash)
        self._keep(entry, segment_base)
        fd = os.open(txn_index_path(self.directory, segment_base),
                     os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            os.write(fd, ENTRY.pack(*entry))
            os.fsync(fd)
        finally:
            os.close(fd)

    def collect(self, start_offset: int, upper_offset: int) -> list[AbortedTxn]:
        """The aborted transactions with records in ``[start_offset,
        upper_offset)``: marker at or after the start, first offset before
        the upper bound."""
        out = []
        for entry in self._entries[bisect.bisect_left(self._last_offsets, start_offset):]:
            if entry.first_offset < upper_offset:
                out.append(entry)
            if entry.last_stable_offset >= upper_offset:
                break
        return out

    def truncate_to(self, offset: int) -> None:
        """Forget entries whose marker is at or past ``offset``."""
        keep = bisect.bisect_left(self._last_offsets, offset)
        if keep == len(self._entries):
            return
        touched = set(self._segment_of[keep:])
        del self._entries[keep:], self._last_offsets[keep:], self._segment_of[keep:]
        for base in touched:
            self._rewrite(base)

    def drop_segments_below(self, base_offset: int) -> None:
        """Segments below ``base_offset`` were deleted: forget their entries
        and remove their files."""
        keep = bisect.bisect_left(self._segment_of, base_offset)
        for base in set(self._segment_of[:keep]):
            _unlink(txn_index_path(self.directory, base))
        del self._entries[:keep], self._last_offsets[:keep], self._segment_of[:keep]

    def merge_segments(self, bases: list[int], into: int) -> None:
        """The cleaner merged the segments at ``bases`` into the one at
        ``into``: their entries move to its file. (A crash before this
        loses those entries with their files, which is harmless: a clean
        removes every record of an aborted transaction.)"""
        merged = set(bases)
        self._segment_of = [into if base in merged else base for base in self._segment_of]
        self._rewrite(into)
        for base in merged:
            _unlink(txn_index_path(self.directory, base))

    def clear(self) -> None:
        for base in set(self._segment_of):
            _unlink(txn_index_path(self.directory, base))
        self._entries, self._last_offsets, self._segment_of = [], [], []

    def _rewrite(self, base: int) -> None:
        data = b"".join(ENTRY.pack(*e) for e, b in zip(self._entries, self._segment_of)
                        if b == base)
        path = txn_index_path(self.directory, base)
        if not data:
            _unlink(path)
            return
        tmp = path + ".tmp"
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
