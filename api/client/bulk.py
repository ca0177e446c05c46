"""``Producer.send_batch``: many records in a few calls.

``send`` pays a Python call and an append per record, which bounds one
producer process at several hundred thousand records a second. A caller
that already holds its records as a list (or an Arrow array) hands them over
whole: the values (and keys) become two binary columns, rows go to
partitions (an explicit one; else Kafka's murmur2 of the key; else, keyless,
a sticky partition per batch, as ``send`` places them), each partition's
rows are cut into batches of at most ``batch_size`` bytes, and each batch's
records are encoded in one C call (``protocol.columns.encode``) and queued
as a whole batch (``append_encoded``). Within a partition the records keep
their order, and they follow what ``send`` queued for it before.
"""

from __future__ import annotations

import bisect
import itertools
from array import array
from collections.abc import Callable, Iterator
from typing import Any

from protocol import columns

#: Keyed rows are placed this many at a time.
CHUNK_ROWS = 65_536
#: msgpack framing of one record beyond its key and value, at most (what
#: ``protocol.columns.encode`` adds): array, two ints, two bin headers, headers.
RECORD_FRAMING = 1 + 1 + 5 + 5 + 5 + 1


class BulkRecords:
    """Values and keys of one ``send_batch`` call, as columns."""

    __slots__ = ("values", "keys", "count")

    def __init__(self, values: Any, keys: Any = None) -> None:
        self.values = columns.binary_column(values)
        self.count = columns.column_length(self.values)
        if keys is None:
            self.keys = None
        else:
            self.keys = columns.binary_column(keys)
            if columns.column_length(self.keys) != self.count:
                raise ValueError(f"{columns.column_length(self.keys)} keys for "
                                 f"{self.count} values: give one key per value (or None)")


def plan(records: BulkRecords, partitions: int, partition: int | None, batch_size: int,
         keyless_partition: Callable[[], int],
         partitioner: Callable[[bytes | None, int], int] | None = None
         ) -> Iterator[tuple[int, bytearray, int]]:
    """(partition, encoded section with room for the batch header, record
    count) of every batch to queue, in order. ``keyless_partition()``: the
    partition for the next batch of keyless records (called once per batch
    of them, and once per call for the null keys among keyed records, which
    then go there in order with the rest); ``partitioner(key, partitions)``:
    a custom one, per record."""
    count = records.count
    if count == 0:
        return
    room = max(batch_size - columns.BATCH_HEADER_BYTES, 1)
    keys = records.keys
    values = records.values
    if partition is not None:
        yield from _contiguous(records, room, lambda: partition)
        return
    if keys is None and partitioner is None:
        yield from _contiguous(records, room, keyless_partition)
        return
    # Keyed (or a custom partitioner): each row to its partition, in order,
    # a chunk of rows at a time (encoding checks the columns it is given:
    # whole columns for every batch would cost rows x batches).
    vo = memoryview(values.offsets).cast("B").cast("i")
    ko = None if keys is None else memoryview(keys.offsets).cast("B").cast("i")
    null_target: int | None = None  # every keyless row of the call: one partition
    for first in range(0, count, CHUNK_ROWS):
        end = min(count, first + CHUNK_ROWS)
        chunk_values = _slice(values, vo, first, end)
        chunk_keys = (columns.null_column(end - first) if keys is None
                      else _slice(keys, ko, first, end))
        buckets: list[list[int]] = [[] for _ in range(partitions)]
        if partitioner is None:
            for row, hashed in enumerate(memoryview(columns.murmur2(chunk_keys)).cast("i")):
                if hashed < 0:
                    if null_target is None:
                        null_target = keyless_partition()
                    buckets[null_target].append(row)
                else:
                    buckets[hashed % partitions].append(row)
        else:
            key_at = columns.row_reader(chunk_keys)
            for row in range(end - first):
                chosen = partitioner(key_at(row), partitions)
                if not isinstance(chosen, int) or not 0 <= chosen < partitions:
                    raise ValueError(f"partitioner chose {chosen!r} of {partitions} partitions")
                buckets[chosen].append(row)
        for target, rows in enumerate(buckets):
            yield from _scattered(chunk_keys, chunk_values, rows, room, target)


def _contiguous(records: BulkRecords, room: int, partition_for: Callable[[], int]
                ) -> Iterator[tuple[int, bytearray, int]]:
    """Rows 0..count in order, cut where a batch is full: each batch's
    columns are slices, so encoding one does not go over the others."""
    values = records.values
    keys = records.keys
    vo = memoryview(values.offsets).cast("B").cast("i")
    ko = None if keys is None else memoryview(keys.offsets).cast("B").cast("i")

    def size(first: int, end: int) -> int:  # section bytes of rows first..end-1
        total = vo[end] - vo[first] + (end - first) * RECORD_FRAMING
        return total if ko is None else total + ko[end] - ko[first]

    first, count = 0, records.count
    while first < count:
        # The most rows that fit (at least one: the broker says if it is too large).
        low, high = first + 1, count
        while low < high:
            middle = (low + high + 1) // 2
            if size(first, middle) <= room:
                low = middle
            else:
                high = middle - 1
        end = low
        piece_values = _slice(values, vo, first, end)
        piece_keys = (columns.null_column(end - first) if keys is None
                      else _slice(keys, ko, first, end))
        section = columns.encode(piece_keys, piece_values, array("q", range(end - first)),
                                 columns.BATCH_HEADER_BYTES)
        yield partition_for(), section, end - first
        first = end


def _slice(column: columns.BinaryColumn, offsets: memoryview, first: int, end: int
           ) -> columns.BinaryColumn:
    """Rows first..end-1 of ``column``: offsets still into the whole data;
    the validity bitmap shifted by ``first`` bits."""
    return columns.BinaryColumn(offsets[first:end + 1], column.data, column.validity,
                                column.bit_offset + first)


def _scattered(keys: columns.BinaryColumn, values: columns.BinaryColumn, rows: list[int],
               room: int, target: int) -> Iterator[tuple[int, bytearray, int]]:
    """Rows ``rows`` (in this order), cut where a batch is full."""
    if not rows:
        return
    vo = memoryview(values.offsets).cast("B").cast("i")
    ko = memoryview(keys.offsets).cast("B").cast("i")
    filled = list(itertools.accumulate(
        vo[r + 1] - vo[r] + ko[r + 1] - ko[r] + RECORD_FRAMING for r in rows))
    first, used = 0, 0
    while first < len(rows):
        end = max(bisect.bisect_right(filled, used + room), first + 1)
        section = columns.encode(keys, values, array("q", rows[first:end]),
                                 columns.BATCH_HEADER_BYTES)
        yield target, section, end - first
        used = filled[end - 1]
        first = end

