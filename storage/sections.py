"""What the log cleaner needs of a records section, without decoding it.

A cleaner pass reads every record's key and, of most records, nothing else;
it keeps some records of a batch and drops the rest. Building a Python tuple,
value and headers object per record (``msgpack.unpackb``) was most of a
pass's time, so these two functions do only that work:

- ``scan(section, count, last_offset_delta)``: the keys, the offset deltas
  (``None`` when they are ``0..count-1``) and which values are null;
- ``pick(section, count, indexes)``: the records at ``indexes`` copied byte
  for byte, the records section of a batch that keeps only those;
- ``offset_map()``: the C offset map (``storage._records.OffsetMap``: key ->
  latest offset, filled from and asked about whole sections), which
  ``storage.cleaner.OffsetMap`` uses when it exists.

Each is the C extension ``storage._records`` when it is built and takes the
section, and the Python below otherwise (the extension refuses a key or
value stored as a msgpack string, which the Python one reads as ``str``).
Both raise ``ValueError`` for a section that is not ``count`` well-formed
records with increasing offset deltas up to ``last_offset_delta``;
``tests/unit/test_sections.py`` checks them against each other.
"""

from __future__ import annotations

import os

import msgpack

try:
    from storage import _records as _c
except ImportError:  # not built (no C compiler at install): the Python below
    _c = None

#: Whether the C extension is in use.
ACCELERATED = _c is not None

_CRC32C_TABLE: list[int] = []


def crc32c(data, crc: int = 0) -> int:
    """CRC-32C (Castagnoli) of ``data``, continuing ``crc``: Kafka's
    RecordBatch v2 checksum (protocol/kafka/records.py). In C when built
    (about 2 GB/s); the Python below is bytewise and slow."""
    if _c is not None:
        return _c.crc32c(data, crc)
    if not _CRC32C_TABLE:
        for n in range(256):
            c = n
            for _ in range(8):
                c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
            _CRC32C_TABLE.append(c)
    crc ^= 0xFFFFFFFF
    for byte in bytes(data):
        crc = _CRC32C_TABLE[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def offset_map():
    """A new C offset map with a random hash seed, or None when the
    extension is not built."""
    return None if _c is None else _c.OffsetMap(int.from_bytes(os.urandom(8), "little"))


#: The smallest record, ``[0, 0, nil, nil, []]`` (storage/_records.h).
MIN_RECORD_BYTES = 6

_ERRORS = (ValueError, TypeError, IndexError, msgpack.UnpackException)


def scan(section, count: int, last_offset_delta: int
         ) -> tuple[list, list[int] | None, bytes | None]:
    """``(keys, deltas, nulls)`` of an uncompressed records section: keys
    (bytes, or str for a key stored as a string, or None), offset deltas or
    None when they are 0..count-1 (and ``last_offset_delta`` is count - 1),
    and None when no value is null, else one 0/1 flag per record."""
    if _c is not None:
        try:
            return _c.scan(section, count, last_offset_delta)
        except ValueError:
            pass  # perhaps only what the C one does not take: the Python one says
    records = _py_records(section, count)
    keys = [record[2] for record in records]
    deltas = [record[1] for record in records]
    if not all(isinstance(d, int) for d in deltas) or (
            deltas and not (0 <= deltas[0] and deltas[-1] <= last_offset_delta
                            and all(a < b for a, b in zip(deltas, deltas[1:])))):
        raise ValueError("offset deltas out of order or past the batch's last offset")
    flags = bytes(record[3] is None for record in records)
    return (keys,
            None if last_offset_delta == count - 1 and deltas == list(range(count)) else deltas,
            flags if 1 in flags else None)


def pick(section, count: int, indexes: list[int]) -> bytes:
    """The records at ``indexes`` (increasing, below ``count``), byte for
    byte as they are in ``section``."""
    if _c is not None:
        try:
            return _c.pick(section, count, indexes)
        except ValueError:
            pass
    _check_count(section, count)
    unpacker = _unpacker(section)
    pieces = []
    wanted = iter(indexes)
    want = next(wanted, None)
    data = bytes(section)
    start = 0
    try:
        for i in range(count):
            record = unpacker.unpack()
            _check_record(record)
            end = unpacker.tell()
            if want is not None and want < i:
                break
            if i == want:
                pieces.append(data[start:end])
                want = next(wanted, None)
            start = end
    except _ERRORS as exc:
        raise ValueError(f"records do not decode: {exc}") from exc
    if want is not None:
        raise ValueError("index out of order or range")
    if start != len(data):
        raise ValueError("bytes after the last record")
    return b"".join(pieces)


def _check_count(section, count: int) -> None:
    if not 0 <= count <= len(section) // MIN_RECORD_BYTES:
        raise ValueError(f"record 0: count out of range ({count} in {len(section)} bytes)")


def _unpacker(section) -> msgpack.Unpacker:
    # Strings that are not UTF-8 (in headers, say) are read, not refused:
    # the cleaner copies records, it does not judge their text.
    unpacker = msgpack.Unpacker(raw=False, use_list=False, unicode_errors="surrogateescape",
                                max_buffer_size=max(1, len(section)))
    unpacker.feed(section)
    return unpacker


def _check_record(record) -> None:
    if not (isinstance(record, tuple) and len(record) == 5 and isinstance(record[1], int)
            and isinstance(record[0], int) and isinstance(record[4], tuple)):
        raise ValueError("a record is not [timestamp_delta, offset_delta, key, value, headers]")
    for field in record[2:4]:
        if field is not None and not isinstance(field, (bytes, str)):
            raise ValueError("a key or value is not bytes, a string or nil")


def _py_records(section, count: int) -> list[tuple]:
    """The ``count`` records of ``section`` as tuples; ValueError unless
    that is exactly what it holds."""
    unpacker = _unpacker(section)
    try:
        records = [unpacker.unpack() for _ in range(count)]
        for record in records:
            _check_record(record)
        extra = unpacker.tell() != len(section)
    except _ERRORS as exc:
        raise ValueError(f"records do not decode or disagree with the count: {exc}") from exc
    if extra:
        raise ValueError("bytes after the last record")
    return records
