"""A batch's records section to and from columns, for readers and writers
that work in Arrow (the Spark source and sink).

The records section (``storage.batch``) is one msgpack array per record.
Going through one Python object per record is what bounded Spark's reads
and writes; these functions turn a whole section into columns, or columns
into a section, in one call each:

- ``decode(section, count)``, ``decode_batches(batches)``: ``Columns`` in
  Arrow's binary layout (int32 offsets, data, validity bitmap), ready for
  ``pyarrow.Array.from_buffers``, of one section or of many stored batches
  at once;
- ``encode(keys, values, rows)``: the records section of some rows of two
  Arrow-layout binary columns (``BinaryColumn``);
- ``murmur2(keys)``: Kafka's positive murmur2 of every key (the default
  partitioner's hash), -1 for null keys.

Each is the C extension ``protocol._columns`` when it is built (``pip
install`` builds it where a C compiler exists) and the pure Python below
otherwise: the same results (``tests/unit/test_columns.py`` checks them
against each other and against ``storage.batch``), the Python one slower.
Nothing here imports numpy or pyarrow: buffers in, bytes out.
"""

from __future__ import annotations

import itertools
from array import array
from typing import Any, NamedTuple

import msgpack

from protocol.partitioner import murmur2 as _murmur2_one
from storage import batch as _batch

try:
    from protocol import _columns as _c
except ImportError:  # not built (no C compiler at install): the Python below
    _c = None

#: Whether the C extension is in use.
ACCELERATED = _c is not None

#: The Python consumer's records of one batch, built in C and untracked by
#: the garbage collector (``records`` in _columns.c says how), or None when
#: the extension is not built (``api.client.fetcher.decode_batch`` then
#: builds them itself).
build_records = _c.records if _c is not None else None


class Columns(NamedTuple):
    """Records sections as columns. ``timestamps`` and ``offsets`` are int64
    (native order): the records' deltas plus their section's bases (zero
    for ``decode``); key/value offsets int32 (rows + 1); validity an Arrow
    bitmap or None (no nulls); ``headers`` None when no record has any, else
    one entry per record: a tuple of ``(str, bytes | None)`` pairs or None."""

    timestamps: bytes
    offsets: bytes
    key_offsets: bytes
    key_data: bytes
    key_validity: bytes | None
    value_offsets: bytes
    value_data: bytes
    value_validity: bytes | None
    headers: list | None


class BatchColumns(NamedTuple):
    """Stored batches' records as one set of columns (``decode_batches``):
    absolute offsets and timestamps, and each batch's record count and
    Kafka timestamp type (0 create time, 1 log-append time)."""

    columns: Columns
    counts: list[int]
    timestamp_types: list[int]


#: Bytes of a batch beyond its records section.
BATCH_HEADER_BYTES = _batch.HEADER_SIZE


class BinaryColumn(NamedTuple):
    """One Arrow binary column's buffers: int32 ``offsets`` (rows + 1, already
    at the array's offset), ``data``, ``validity`` bitmap or None, and the
    bitmap's ``bit_offset``."""

    offsets: Any
    data: Any
    validity: Any
    bit_offset: int = 0


#: The most bytes one column may hold: its offsets are int32.
COLUMN_BYTES_MAX = 2**31 - 1


def binary_column(items: Any) -> BinaryColumn:
    """``items`` as a ``BinaryColumn``: a sequence of bytes-like objects
    (``str`` is taken as UTF-8, ``None`` as null), or an Arrow array of
    binary or string type (pyarrow's ``Array``/``ChunkedArray``; its buffers
    are used as they are, no copy, except a cast from string or large
    types). TypeError for anything else; ValueError past 2 GiB."""
    if hasattr(items, "buffers") or hasattr(items, "combine_chunks"):
        return _arrow_column(items)
    if isinstance(items, (bytes, bytearray, memoryview, str)):
        raise TypeError("a column is a sequence of values, not one bytes or str value")
    if not hasattr(items, "__len__"):
        items = list(items)  # measured after joining: an iterator would be spent
    try:  # bytes-like values only: joined and measured in C
        data = b"".join(items)
        validity = None
        if len(data) != sum(map(len, items)):  # a buffer of wider items (array("i"))
            raise TypeError
    except TypeError:
        items, validity = _normalised(items)
        data = b"".join(items)
    if len(data) > COLUMN_BYTES_MAX:
        raise ValueError(f"a column holds at most {COLUMN_BYTES_MAX} bytes, not {len(data)}")
    offsets = array("i", itertools.accumulate(map(len, items), initial=0))
    return BinaryColumn(offsets, data, validity, 0)


def null_column(count: int) -> BinaryColumn:
    """``count`` nulls (no keys)."""
    return BinaryColumn(bytes(4 * (count + 1)), b"", bytes((count + 7) // 8), 0)


def column_length(column: BinaryColumn) -> int:
    return len(memoryview(column.offsets).cast("B")) // 4 - 1


def _normalised(items: Any) -> tuple[list, bytes | None]:
    """Values with str encoded and None as empty, and the validity bitmap
    (None when nothing is null)."""
    out, nulls = [], []
    for i, item in enumerate(items):
        if item is None:
            nulls.append(i)
            out.append(b"")
        elif isinstance(item, str):
            out.append(item.encode())
        elif isinstance(item, (bytes, bytearray)):
            out.append(item)
        else:
            try:  # any other buffer: its bytes
                out.append(memoryview(item).cast("B").tobytes())
                continue
            except TypeError:
                pass
            raise TypeError(f"value {i} is {type(item).__name__}: give bytes, str or None")
    return out, _bitmap(nulls, len(out))


def _arrow_column(column: Any) -> BinaryColumn:
    import pyarrow as pa  # given an Arrow array, pyarrow is there

    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    if not (pa.types.is_binary(column.type) or pa.types.is_string(column.type)
            or pa.types.is_large_binary(column.type) or pa.types.is_large_string(column.type)):
        raise TypeError(f"an Arrow column of {column.type}: give binary or string values")
    if not pa.types.is_binary(column.type):
        column = column.cast(pa.binary())
    if len(column) == 0:
        return BinaryColumn(array("i", [0]), b"", None, 0)
    validity, offsets, data = column.buffers()
    at = column.offset
    offsets = memoryview(offsets).cast("B").cast("i")[at:at + len(column) + 1]
    return BinaryColumn(offsets, data if data is not None else b"",
                        validity if column.null_count else None, at)


#: No limit on a section's offset deltas (``decode``).
_NO_LAST_DELTA = 2**63 - 1


def decode(section, count: int) -> Columns:
    """An uncompressed records section of exactly ``count`` records, offset
    deltas increasing from 0 or more, as columns (of deltas: bases zero).
    ValueError if it is not that: the caller decodes it with
    ``storage.batch.iter_records``, which says what is wrong."""
    return _decode([(section, count, 0, 0, _NO_LAST_DELTA)])


def decode_batches(batches: list) -> BatchColumns:
    """Whole stored batches, ``(bytes, header)`` pairs (headers already
    checked, as the consumer checks them), as one set of columns, inflated
    where compressed: one call, no Python object per record, and no copy
    to join them after. ValueError for anything not well-formed batches of
    ordinary records (a reader decodes them one by one with the general
    decoder instead, which says what is wrong)."""
    sections = []
    for view, header in batches:
        try:
            section = _batch.decompress(header.compression,
                                        view[_batch.HEADER_SIZE:header.size_bytes],
                                        _batch.DEFAULT_MAX_DECOMPRESSED_BYTES)
        except _batch.RecordFormatError as exc:
            raise ValueError(str(exc)) from None
        sections.append((section, header.record_count, header.base_offset,
                         header.base_timestamp, header.last_offset_delta))
    return BatchColumns(_decode(sections), [h.record_count for _, h in batches],
                        [1 if h.attributes & _batch.TIMESTAMP_TYPE_BIT else 0
                         for _, h in batches])


def _decode(sections: list) -> Columns:
    if _c is None:
        return _py_decode(sections)
    ts, od, ko, kd, kv, vo, vd, vv, spans = _c.decode(sections)
    headers = None
    if spans is not None:
        positions = array("q", spans)
        views = [memoryview(section) for section, *_ in sections]
        headers = [None] * (len(positions) // 3)
        for i in range(len(headers)):
            which, start, end = positions[3 * i:3 * i + 3]
            if end - start > 1:  # (an empty array in a longer encoding: no headers)
                headers[i] = _headers(msgpack.unpackb(views[which][start:end], raw=False,
                                                      use_list=False)) or None
        if all(h is None for h in headers):
            headers = None
    return Columns(ts, od, ko, kd, kv, vo, vd, vv, headers)


def encode(keys: BinaryColumn, values: BinaryColumn, rows, room: int = 0) -> bytes | bytearray:
    """The records section of ``rows`` (an int64 buffer of row numbers) of
    ``keys`` and ``values``: record j is ``[0, j, key, value, []]``, exactly
    as ``BatchBuilder`` packs it. With ``room`` (``BATCH_HEADER_BYTES``), a
    bytearray whose first ``room`` bytes are left free for the batch header,
    written there in place (``EncodedBatchBuilder``) instead of copied in
    front."""
    if _c is not None:
        return _c.encode(keys.offsets, keys.data, keys.validity, keys.bit_offset,
                         values.offsets, values.data, values.validity, values.bit_offset, rows,
                         room)
    section = _py_encode(keys, values, rows)
    return bytearray(room) + section if room else section


def _py_encode(keys: BinaryColumn, values: BinaryColumn, rows) -> bytes:
    count = len(memoryview(keys.offsets).cast("B")) // 4 - 1
    if count != len(memoryview(values.offsets).cast("B")) // 4 - 1:
        raise ValueError("key and value columns differ in length")
    if any(not 0 <= row < count for row in memoryview(rows).cast("B").cast("q")):
        raise IndexError("row number out of range")
    key_at, value_at = row_reader(keys), row_reader(values)
    packer = msgpack.Packer(use_bin_type=True, autoreset=False)
    for j, row in enumerate(memoryview(rows).cast("B").cast("q")):
        packer.pack((0, j, key_at(row), value_at(row), []))
    return packer.bytes()


def murmur2(keys: BinaryColumn) -> bytes:
    """int32 ``murmur2(key) & 0x7fffffff`` of every key, -1 for null."""
    if _c is not None:
        return _c.murmur2(keys.offsets, keys.data, keys.validity, keys.bit_offset)
    return _py_murmur2(keys)


def _py_murmur2(keys: BinaryColumn) -> bytes:
    key_at = row_reader(keys)
    rows = len(memoryview(keys.offsets).cast("B")) // 4 - 1
    out = array("i", (-1 if (key := key_at(i)) is None else _murmur2_one(key) & 0x7FFFFFFF
                      for i in range(rows)))
    return out.tobytes()


# -- the pure-Python equivalents ------------------------------------------------------------
def _headers(entries) -> tuple:
    if not isinstance(entries, tuple) or not all(
            isinstance(e, tuple) and len(e) == 2 and isinstance(e[0], str)
            and (e[1] is None or isinstance(e[1], bytes)) for e in entries):
        raise ValueError("headers are not [str, bytes-or-nil] pairs")
    return entries


def _py_decode(sections: list) -> Columns:
    ts, od = array("q"), array("q")
    key_offsets, value_offsets = array("i", [0]), array("i", [0])
    key_data, value_data = bytearray(), bytearray()
    key_nulls, value_nulls, headers = [], [], []
    row = 0
    for section, count, base_offset, base_timestamp, last_delta in sections:
        view = memoryview(section)
        unpacker = msgpack.Unpacker(raw=False, use_list=False,
                                    max_buffer_size=max(len(view), 1), strict_map_key=False)
        unpacker.feed(view)
        previous = -1
        i = 0
        try:
            for i in range(count):
                record = unpacker.unpack()
                if not isinstance(record, tuple) or len(record) != 5:
                    raise ValueError(f"record {i}: not a 5-element array")
                td, delta, key, value, entries = record
                if not (type(td) is int and type(delta) is int  # noqa: E721 (not bool)
                        and -2**63 <= td < 2**63 and -2**63 <= delta < 2**63):
                    raise ValueError(f"record {i}: bad timestamp or offset delta")
                if not previous < delta <= last_delta:
                    raise ValueError(f"record {i}: offset deltas out of order or past the "
                                     "batch's last offset")
                previous = delta
                ts.append((base_timestamp + td + 2**63) % 2**64 - 2**63)  # as C wraps
                if base_offset + delta >= 2**63:
                    raise ValueError(f"record {i}: offset past 2**63")
                od.append(base_offset + delta)
                for item, data, offsets, nulls in (
                        (key, key_data, key_offsets, key_nulls),
                        (value, value_data, value_offsets, value_nulls)):
                    if item is None:
                        nulls.append(row)
                    elif isinstance(item, bytes):
                        data += item
                    else:
                        raise ValueError(f"record {i}: key or value not bytes or nil")
                    offsets.append(len(data))
                headers.append(_headers(entries) or None)
                row += 1
        except msgpack.OutOfData:
            raise ValueError(f"the section ends inside record {i}") from None
        except (msgpack.UnpackException, TypeError, OverflowError) as exc:
            raise ValueError(f"record {i}: {exc}") from None
        if unpacker.tell() != len(view):
            raise ValueError(f"record {count}: bytes after the last record")
    return Columns(ts.tobytes(), od.tobytes(), key_offsets.tobytes(), bytes(key_data),
                   _bitmap(key_nulls, row), value_offsets.tobytes(), bytes(value_data),
                   _bitmap(value_nulls, row),
                   headers if any(h is not None for h in headers) else None)


def _bitmap(nulls: list[int], count: int) -> bytes | None:
    if not nulls:
        return None
    bits = bytearray(b"\xff" * ((count + 7) // 8))
    for i in nulls:
        bits[i >> 3] &= ~(1 << (i & 7)) & 0xFF
    if count % 8:  # padding bits clear, as the C extension leaves them
        bits[-1] &= (1 << (count % 8)) - 1
    return bytes(bits)


def row_reader(column: BinaryColumn):
    """row -> the row's bytes or None, from Arrow-layout buffers."""
    offsets = memoryview(column.offsets).cast("B").cast("i")
    data = bytes(memoryview(column.data).cast("B"))
    valid = None if column.validity is None else bytes(memoryview(column.validity).cast("B"))
    bit = column.bit_offset

    def at(row: int) -> bytes | None:
        if valid is not None and not valid[(row + bit) >> 3] >> ((row + bit) & 7) & 1:
            return None
        return data[offsets[row]:offsets[row + 1]]
    return at

