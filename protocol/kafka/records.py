"""Kafka's RecordBatch v2 <-> kraftlog's batches, at the Kafka listener.

The two formats share the 61-byte batch header field for field (offsets,
epochs, attributes, timestamps, producer id, epoch and sequence, count), so
idempotence, transactions and control markers mean the same on both sides.
They differ in two places, which is all a conversion touches:

- the checksum: Kafka's is CRC-32C, kraftlog's CRC-32 (``storage/batch.py``);
- the records: Kafka encodes each as varints (length, attributes, timestamp
  delta, offset delta, key, value, headers), kraftlog as a msgpack array
  ``[timestamp_delta, offset_delta, key, value, headers]``.

A produced batch is checked (magic 2, CRC-32C, lengths, record count),
decompressed if the client compressed it (gzip; other codecs are refused
with UNSUPPORTED_COMPRESSION_TYPE, saying which) and stored uncompressed;
a fetched batch is re-encoded the other way. ARCHITECTURE.md ("Kafka
listener") says why the log keeps kraftlog's format.
"""

from __future__ import annotations

import struct
from typing import Iterator

import msgpack

from storage import batch as native
from storage.sections import crc32c

try:
    from protocol import _kafka as _c
except ImportError:  # not built (no C compiler at install): the Python below
    _c = None

#: Whether the records are converted in C.
ACCELERATED = _c is not None

_CRC = struct.Struct(">I")
_HEADER = native.HEADER
_CODEC_NAMES = {2: "snappy", 3: "lz4", 4: "zstd"}


def _zigzag(value: int) -> int:
    return (value << 1) ^ (value >> 63)


def _write_varint(out: bytearray, value: int) -> None:
    value = _zigzag(value) & 0xFFFFFFFFFFFFFFFF
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)


def _write_field(out: bytearray, field: bytes | None) -> None:
    """A Kafka record field: its length as a varint (-1: null), its bytes."""
    if field is None:
        _write_varint(out, -1)
    else:
        _write_varint(out, len(field))
        out += field


def _read_varint(data: bytes, pos: int, end: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= end:
            raise native.CorruptRecordError("a record's varint runs past its batch")
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            value &= 0xFFFFFFFFFFFFFFFF  # a tenth byte's high bits fall off, as in C and Java
            return (value >> 1) ^ -(value & 1), pos
        shift += 7
        if shift > 63:
            raise native.CorruptRecordError("a record's varint is longer than 10 bytes")


def _read_bytes(data: bytes, pos: int, end: int) -> tuple[bytes | None, int]:
    size, pos = _read_varint(data, pos, end)
    if size < 0:
        if size != -1:
            raise native.CorruptRecordError(f"a record field of length {size}")
        return None, pos
    if pos + size > end:
        raise native.CorruptRecordError("a record field runs past its record")
    return data[pos:pos + size], pos + size


def iter_kafka_batches(data: bytes) -> Iterator[tuple[native.BatchHeader, memoryview]]:
    """The whole batches of a Kafka ``records`` field (a fetch may end in a
    partial one; a produce may not, which the caller checks by length)."""
    yield from native.iter_batches(data, allow_partial_tail=False)


def kafka_to_native(data: bytes, max_decompressed_bytes: int = native.DEFAULT_MAX_DECOMPRESSED_BYTES
                    ) -> bytes:
    """A produce request's Kafka record batches as kraftlog batches (same
    header fields, records re-encoded, uncompressed). Raises a
    ``storage.batch.RecordFormatError`` (its ``code`` is Kafka's error
    name) for anything that is not a valid v2 batch."""
    out = bytearray()
    view = memoryview(data)
    for header, batch in iter_kafka_batches(view):
        if header.magic != native.MAGIC:
            raise native.CorruptRecordError(
                f"record batch magic {header.magic}: kraftlog takes RecordBatch v2 (magic 2), "
                "which every Kafka client since 0.11 sends")
        codec = header.compression
        if codec in _CODEC_NAMES:
            raise native.UnsupportedCompressionTypeError(
                f"{_CODEC_NAMES[codec]} compression is not supported: send uncompressed or gzip "
                "batches (compression.type=none or gzip)")
        # Lengths, count and offset deltas sane before anything is made of them.
        native.check_header(header, len(batch), native.MAX_BATCH_BYTES, strict=True)
        end = header.size_bytes
        if crc32c(batch[native.ATTRIBUTES_OFFSET:end]) != header.crc:
            raise native.CorruptRecordError(
                f"CRC-32C mismatch in the batch at offset {header.base_offset}")
        section = bytes(native.decompress(codec, batch[native.HEADER_SIZE:end],
                                          max_decompressed_bytes))
        records = _to_msgpack(section, header)
        out += native.pack_batch(
            base_offset=header.base_offset, leader_epoch=header.partition_leader_epoch,
            attributes=header.attributes & ~native.COMPRESSION_MASK,
            last_offset_delta=header.last_offset_delta, base_timestamp=header.base_timestamp,
            max_timestamp=header.max_timestamp, producer_id=header.producer_id,
            producer_epoch=header.producer_epoch, base_sequence=header.base_sequence,
            record_count=header.record_count, section=records)
    return bytes(out)


def _to_msgpack(section: bytes, header: native.BatchHeader) -> bytes:
    if header.record_count > len(section):  # every record takes bytes
        raise native.CorruptRecordError(
            f"the batch at offset {header.base_offset} says {header.record_count} records "
            f"in {len(section)} bytes")
    if _c is not None:
        try:
            return _c.kafka_to_msgpack(section, header.record_count, header.last_offset_delta)
        except ValueError as exc:
            raise native.CorruptRecordError(
                f"the batch at offset {header.base_offset}: {exc}") from None
    return _py_to_msgpack(section, header)


def _py_to_msgpack(section: bytes, header: native.BatchHeader) -> bytes:
    pack = msgpack.Packer(use_bin_type=True).pack
    out = bytearray()
    pos, total = 0, len(section)
    for _ in range(header.record_count):
        length, pos = _read_varint(section, pos, total)
        end = pos + length
        if length < 0 or end > total:
            raise native.CorruptRecordError("a record runs past its batch")
        pos += 1  # attributes: unused by Kafka's v2 records
        timestamp_delta, pos = _read_varint(section, pos, end)
        offset_delta, pos = _read_varint(section, pos, end)
        key, pos = _read_bytes(section, pos, end)
        value, pos = _read_bytes(section, pos, end)
        count, pos = _read_varint(section, pos, end)
        if count < 0 or count > end - pos:
            raise native.CorruptRecordError(f"a record with {count} headers")
        headers = []
        for _ in range(count):
            name, pos = _read_bytes(section, pos, end)
            header_value, pos = _read_bytes(section, pos, end)
            if name is None:
                raise native.CorruptRecordError("a record header without a name")
            try:
                headers.append([name.decode(), header_value])
            except UnicodeDecodeError:
                raise native.CorruptRecordError("a record header name is not UTF-8") from None
        if pos != end:
            raise native.CorruptRecordError("a record's length disagrees with its fields")
        if not 0 <= offset_delta <= header.last_offset_delta:
            raise native.CorruptRecordError(f"record offset delta {offset_delta} out of range")
        out += pack([timestamp_delta, offset_delta, key, value, headers])
    if pos != total:
        raise native.CorruptRecordError(
            f"the batch holds more than its record count ({header.record_count}) says")
    return bytes(out)


def native_to_kafka(data: bytes | memoryview) -> bytes:
    """kraftlog batches (a fetch's answer) as Kafka RecordBatch v2 bytes,
    uncompressed; a partial batch at the end is left out."""
    out = bytearray()
    for header, batch in native.iter_batches(data):
        raw = native.decompress(header.compression, batch[native.HEADER_SIZE:header.size_bytes],
                                native.DEFAULT_MAX_DECOMPRESSED_BYTES)
        if _c is not None:
            try:
                section = _c.msgpack_to_kafka(raw, header.record_count)
            except ValueError as exc:
                raise native.CorruptRecordError(
                    f"the batch at offset {header.base_offset}: {exc}") from None
        else:
            section = _py_to_kafka(raw, header)
        start = len(out)
        out += _HEADER.pack(
            header.base_offset, native.HEADER_SIZE - native.LOG_OVERHEAD + len(section),
            header.partition_leader_epoch, native.MAGIC, 0,
            header.attributes & ~native.COMPRESSION_MASK, header.last_offset_delta,
            header.base_timestamp, header.max_timestamp, header.producer_id,
            header.producer_epoch, header.base_sequence, header.record_count)
        out += section
        crc = crc32c(memoryview(out)[start + native.ATTRIBUTES_OFFSET:])
        _CRC.pack_into(out, start + native.CRC_OFFSET, crc)
    return bytes(out)


def _py_to_kafka(raw: bytes, header: native.BatchHeader) -> bytes:
    section = bytearray()
    unpacker = msgpack.Unpacker(raw=False, use_list=False, max_buffer_size=max(len(raw), 1))
    unpacker.feed(raw)
    count = 0
    try:
        for timestamp_delta, offset_delta, key, value, headers in unpacker:
            count += 1
            if not all(-2**63 <= n < 2**63 for n in (timestamp_delta, offset_delta)):
                raise ValueError("a delta outside int64")
            body = bytearray(b"\0")  # attributes
            _write_varint(body, timestamp_delta)
            _write_varint(body, offset_delta)
            _write_field(body, key)
            _write_field(body, value)
            _write_varint(body, len(headers))
            for name, value_ in headers:
                _write_field(body, name.encode() if isinstance(name, str) else bytes(name))
                _write_field(body, value_)
            _write_varint(section, len(body))
            section += body
    except (ValueError, TypeError, msgpack.UnpackException) as exc:
        raise native.CorruptRecordError(
            f"the batch at offset {header.base_offset} does not decode: {exc}") from None
    if count != header.record_count or unpacker.tell() != len(raw):
        raise native.CorruptRecordError(
            f"the batch at offset {header.base_offset} holds {count} whole records, its "
            f"header says {header.record_count}")
    return bytes(section)
