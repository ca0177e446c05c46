"""Record batch format: the one definition of the bytes a producer sends, a
broker stores and a consumer reads.

Modelled on Kafka's RecordBatch v2. A batch is a fixed 61-byte header followed
by the records section. The client builds a batch (``BatchBuilder``); the
broker validates the header and checksum *without decoding records*
(``validate_batches``), patches the base offset and partition leader epoch in
place (``stamped_prefix``) and appends the bytes unchanged; followers and
consumers receive the same bytes and decode them (``iter_records``).

Checksum range: CRC-32 (zlib's, the IEEE polynomial; Kafka uses CRC-32C) over
bytes ``[ATTRIBUTES_OFFSET, end of batch)``. The fields before the CRC (base
offset, batch length, partition leader epoch, magic) are outside it, so a
leader can assign offsets and stamp its epoch without recomputing it. A
consequence worth knowing: corruption of those fields is not caught by the CRC,
so readers check them for sanity (length bounds, magic, offset contiguity).

Records section: one msgpack array per record, concatenated, optionally
compressed as a whole::

    [timestamp_delta, offset_delta, key, value, headers]

``key`` and ``value`` are bytes or nil; ``headers`` is an array of
``[str key, bytes-or-nil value]``. Deltas are relative to the header's
``base_timestamp`` and ``base_offset``.

This module is imported by the client (``api/client``), so it depends on
nothing of ours but the optional C walk of batch headers in its own
package (``storage._records``), and does no I/O.
"""

from __future__ import annotations

import enum
import struct
import time
import zlib
from typing import Any, Iterator, NamedTuple, Sequence

import msgpack

try:  # a fetch answer's batches walked in C (storage/_records.c)
    from storage._records import scan_batches as _scan_batches
except ImportError:  # not built: the Python loop in scan_batches
    _scan_batches = None
try:  # CRC-32 with the CPU's carry-less multiply: over ten times zlib's speed
    from isal.isal_zlib import crc32
except ImportError:  # a platform without an isal wheel: same checksum, slower
    from zlib import crc32

# ---------------------------------------------------------------------------
# Header layout. Big-endian, no padding. Each line is one field.
# ---------------------------------------------------------------------------
HEADER = struct.Struct(
    ">"
    "q"  # base_offset: offset of the first record. Set by the leader on append.
    "i"  # batch_length: bytes after this field to the end of the batch.
    "i"  # partition_leader_epoch: epoch of the leader that appended it; set on append.
    "b"  # magic: format version, always MAGIC (2).
    "I"  # crc: CRC-32 of bytes [ATTRIBUTES_OFFSET, end of batch).
    "h"  # attributes: bits 0-2 compression, 3 timestamp type, 4 transactional, 5 control.
    "i"  # last_offset_delta: offset of the last record minus base_offset.
    "q"  # base_timestamp: timestamp (ms) of the first record; deltas are relative to it.
    "q"  # max_timestamp: largest record timestamp (ms) in the batch.
    "q"  # producer_id: idempotent/transactional producer id, -1 if none.
    "h"  # producer_epoch: producer epoch, -1 if none.
    "i"  # base_sequence: sequence number of the first record, -1 if none.
    "i"  # record_count: number of records in the records section.
)
HEADER_SIZE = 61
assert HEADER.size == HEADER_SIZE, HEADER.size

# Byte offsets of individual fields, derived from the layout above.
BASE_OFFSET_OFFSET = 0
LENGTH_OFFSET = BASE_OFFSET_OFFSET + struct.calcsize(">q")  # 8
LEADER_EPOCH_OFFSET = LENGTH_OFFSET + struct.calcsize(">i")  # 12
MAGIC_OFFSET = LEADER_EPOCH_OFFSET + struct.calcsize(">i")  # 16
CRC_OFFSET = MAGIC_OFFSET + struct.calcsize(">b")  # 17
ATTRIBUTES_OFFSET = CRC_OFFSET + struct.calcsize(">I")  # 21
assert (LENGTH_OFFSET, LEADER_EPOCH_OFFSET, MAGIC_OFFSET, CRC_OFFSET, ATTRIBUTES_OFFSET) == (
    8, 12, 16, 17, 21)
# producer_id, producer_epoch, base_sequence: after attributes (h), last
# offset delta (i) and the two timestamps (qq).
PRODUCER_ID_OFFSET = ATTRIBUTES_OFFSET + struct.calcsize(">hiqq")  # 43
assert PRODUCER_ID_OFFSET == 43
# last_offset_delta: after attributes; record_count: the header's last field.
LAST_OFFSET_DELTA_OFFSET = ATTRIBUTES_OFFSET + struct.calcsize(">h")  # 23
RECORD_COUNT_OFFSET = HEADER_SIZE - struct.calcsize(">i")  # 57
_LENGTH = struct.Struct(">i")  # batch_length, last_offset_delta and record_count alike
_BASE_OFFSET = struct.Struct(">q")

# The two leading fields every batch has regardless of version; batch_length
# counts the bytes after them.
LOG_OVERHEAD = LEADER_EPOCH_OFFSET  # 12

# The fields a leader rewrites on append: base_offset, batch_length (unchanged
# but contiguous), partition_leader_epoch. All outside the CRC.
STAMP = struct.Struct(">qii")
assert STAMP.size == MAGIC_OFFSET

MAGIC = 2
NO_PARTITION_LEADER_EPOCH = -1
NO_PRODUCER_ID = -1
NO_PRODUCER_EPOCH = -1
NO_SEQUENCE = -1
#: Sequence numbers are int32 and wrap from this to 0.
SEQUENCE_MAX = 2**31 - 1
NO_TIMESTAMP = -1

# Attribute bits.
COMPRESSION_MASK = 0x07
TIMESTAMP_TYPE_BIT = 0x08  # 0 = CreateTime, 1 = LogAppendTime
TRANSACTIONAL_BIT = 0x10
CONTROL_BIT = 0x20

# Limits that hold whatever the configuration says.
MIN_BATCH_LENGTH = HEADER_SIZE - LOG_OVERHEAD  # a header with an empty records section
MAX_BATCH_BYTES = 2**31 - 1
DEFAULT_MAX_DECOMPRESSED_BYTES = 256 * 1024 * 1024  # guard against decompression bombs


class Compression(enum.IntEnum):
    """Compression codecs, numbered as Kafka numbers them. Only NONE and GZIP
    are implemented: zstd and lz4 would each add a dependency and are added
    only once measured faster for users."""

    NONE = 0
    GZIP = 1
    SNAPPY = 2
    LZ4 = 3
    ZSTD = 4


SUPPORTED_COMPRESSION = frozenset({Compression.NONE, Compression.GZIP})


# ---------------------------------------------------------------------------
# Errors. Each carries the stable code name the API reports.
# ---------------------------------------------------------------------------
class RecordFormatError(Exception):
    """Base class for errors in batch bytes received from the outside world."""

    code = "CORRUPT_MESSAGE"


class CorruptRecordError(RecordFormatError):
    """Bytes that are not a valid batch: bad CRC, torn header, bad length,
    record count that disagrees, undecodable records."""

    code = "CORRUPT_MESSAGE"


class RecordTooLargeError(RecordFormatError):
    """A batch larger than the configured maximum (``max.message.bytes``)."""

    code = "MESSAGE_TOO_LARGE"


class UnsupportedCompressionTypeError(RecordFormatError):
    """A codec this build cannot decode."""

    code = "UNSUPPORTED_COMPRESSION_TYPE"


class InvalidRecordError(RecordFormatError):
    """A well-formed batch the broker refuses (for example an empty one)."""

    code = "INVALID_RECORD"


# ---------------------------------------------------------------------------
# Parsed header.
# ---------------------------------------------------------------------------
class BatchHeader(NamedTuple):
    """The header fields of one batch, in layout order."""

    base_offset: int
    batch_length: int
    partition_leader_epoch: int
    magic: int
    crc: int
    attributes: int
    last_offset_delta: int
    base_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    record_count: int

    @property
    def size_bytes(self) -> int:
        """Bytes the whole batch occupies, header included."""
        return self.batch_length + LOG_OVERHEAD

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.last_offset_delta

    @property
    def next_offset(self) -> int:
        return self.base_offset + self.last_offset_delta + 1

    @property
    def compression(self) -> int:
        return self.attributes & COMPRESSION_MASK

    @property
    def is_transactional(self) -> bool:
        return bool(self.attributes & TRANSACTIONAL_BIT)

    @property
    def is_control(self) -> bool:
        return bool(self.attributes & CONTROL_BIT)


def parse_header(buf, pos: int = 0) -> BatchHeader:
    """Unpack the header at ``pos``. The caller guarantees HEADER_SIZE bytes."""
    return BatchHeader._make(HEADER.unpack_from(buf, pos))


def compute_crc(buf, start: int, end: int) -> int:
    """CRC of a batch occupying ``buf[start:end]`` (the checksummed range only)."""
    return crc32(memoryview(buf)[start + ATTRIBUTES_OFFSET:end]) & 0xFFFFFFFF


def check_header(header: BatchHeader, available: int, max_batch_bytes: int,
                 *, strict: bool) -> None:
    """Sanity checks on a header that need no record decoding.

    ``available`` is how many bytes of the buffer start at this batch.
    ``strict`` is for batches from producers: they must hold at least one
    record and their offsets must be dense (``last_offset_delta ==
    record_count - 1``). Replicated and stored batches may be sparse later
    (compaction), so for them only ``last_offset_delta >= record_count - 1``.
    """
    if header.batch_length < MIN_BATCH_LENGTH:
        raise CorruptRecordError(
            f"batch length {header.batch_length} is below the minimum {MIN_BATCH_LENGTH}")
    if header.size_bytes > max_batch_bytes:
        raise RecordTooLargeError(
            f"batch of {header.size_bytes} bytes exceeds the limit of {max_batch_bytes} bytes "
            "(max.message.bytes); send smaller batches or raise the topic's max.message.bytes")
    if header.size_bytes > available:
        raise CorruptRecordError(
            f"batch length {header.batch_length} overruns the {available} bytes available")
    if header.magic != MAGIC:
        raise CorruptRecordError(f"unsupported batch magic {header.magic}, expected {MAGIC}")
    if header.record_count < 0 or header.last_offset_delta < 0:
        raise CorruptRecordError(
            f"negative record count {header.record_count} or offset delta "
            f"{header.last_offset_delta}")
    if strict:
        if header.record_count == 0:
            raise InvalidRecordError("a produced batch must hold at least one record")
        if header.last_offset_delta != header.record_count - 1:
            raise CorruptRecordError(
                f"record count {header.record_count} disagrees with last offset delta "
                f"{header.last_offset_delta}")
    elif header.last_offset_delta < header.record_count - 1:
        raise CorruptRecordError(
            f"record count {header.record_count} exceeds last offset delta "
            f"{header.last_offset_delta} + 1")
    if header.compression not in SUPPORTED_COMPRESSION:
        raise UnsupportedCompressionTypeError(
            f"compression codec {header.compression} is not supported; use none or gzip")


def validate_batches(buf, max_batch_bytes: int = MAX_BATCH_BYTES, *,
                     strict: bool = True) -> list[tuple[int, BatchHeader]]:
    """Validate every batch in ``buf`` (one or more concatenated batches) and
    return ``(position, header)`` for each.

    Checks header sanity and the CRC; never decodes records. Raises a
    ``RecordFormatError`` for the first bad batch, so a caller that validates
    before writing never appends part of a request.
    """
    view = memoryview(buf)
    total = len(view)
    if total == 0:
        raise InvalidRecordError("no record batches in the request")
    out: list[tuple[int, BatchHeader]] = []
    pos = 0
    while pos < total:
        available = total - pos
        if available < HEADER_SIZE:
            raise CorruptRecordError(
                f"truncated batch header: {available} bytes at position {pos}, "
                f"need {HEADER_SIZE}")
        header = parse_header(view, pos)
        check_header(header, available, max_batch_bytes, strict=strict)
        end = pos + header.size_bytes
        crc = compute_crc(view, pos, end)
        if crc != header.crc:
            raise CorruptRecordError(
                f"CRC mismatch in batch at position {pos}: stored {header.crc:#010x}, "
                f"computed {crc:#010x}")
        out.append((pos, header))
        pos = end
    return out


def stamped_prefix(header: BatchHeader, base_offset: int, leader_epoch: int) -> bytes:
    """The first MAGIC_OFFSET bytes of a batch re-stamped with a new base offset
    and leader epoch. The remainder of the batch, CRC included, is unchanged."""
    return STAMP.pack(base_offset, header.batch_length, leader_epoch)


def scan_batches(buf) -> tuple[int, int, int, int]:
    """``(end, batches, records, next_offset)`` of the whole batches at the
    start of ``buf`` (a fetch answer's records), from their headers alone
    and making no object per batch: where they end, how many there are,
    their records and the offset after the last (-1 when none is whole). A
    partial batch at the end is left out, as ``iter_batches`` leaves it; a
    length below the header's raises ``CorruptRecordError``. In C when
    built: a broker counts every answer it sends, a consumer walks each."""
    if _scan_batches is not None:
        try:
            return _scan_batches(buf)
        except ValueError as exc:
            raise CorruptRecordError(str(exc)) from None
    view = memoryview(buf)
    total = len(view)
    pos = batches = records = 0
    next_offset = -1
    while total - pos >= HEADER_SIZE:
        length, = _LENGTH.unpack_from(view, pos + LENGTH_OFFSET)
        if length < MIN_BATCH_LENGTH:
            raise CorruptRecordError(f"batch length {length} below minimum at position {pos}")
        end = pos + LOG_OVERHEAD + length
        if end > total:
            break
        base, = _BASE_OFFSET.unpack_from(view, pos)
        next_offset = base + _LENGTH.unpack_from(view, pos + LAST_OFFSET_DELTA_OFFSET)[0] + 1
        records += _LENGTH.unpack_from(view, pos + RECORD_COUNT_OFFSET)[0]
        batches += 1
        pos = end
    return pos, batches, records, next_offset


def count_records(buf) -> int:
    """The records in the whole batches of ``buf`` (``scan_batches``)."""
    return scan_batches(buf)[2]


def iter_batches(buf, *, allow_partial_tail: bool = True
                 ) -> Iterator[tuple[BatchHeader, memoryview]]:
    """Yield ``(header, batch_view)`` for each whole batch in ``buf``.

    Checks sizes but not CRCs (see ``validate_batches`` and ``iter_records``).
    A fetch response may end in a partial batch when a byte limit cut it; with
    ``allow_partial_tail`` it is silently dropped, otherwise it raises.
    """
    view = memoryview(buf)
    total = len(view)
    pos = 0
    while pos < total:
        available = total - pos
        if available < HEADER_SIZE:
            if allow_partial_tail:
                return
            raise CorruptRecordError(f"truncated batch header at position {pos}")
        header = parse_header(view, pos)
        if header.batch_length < MIN_BATCH_LENGTH:
            raise CorruptRecordError(f"batch length {header.batch_length} below minimum")
        end = pos + header.size_bytes
        if end > total:
            if allow_partial_tail:
                return
            raise CorruptRecordError(f"batch at position {pos} overruns the buffer")
        yield header, view[pos:end]
        pos = end


# ---------------------------------------------------------------------------
# Records.
# ---------------------------------------------------------------------------
class Record(NamedTuple):
    """One decoded record, with absolute offset and timestamp."""

    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...]


def compress(codec: int, section: bytes, level: int = 6) -> bytes:
    """A records section compressed with ``codec`` (NONE: unchanged)."""
    if codec == Compression.GZIP:
        deflater = zlib.compressobj(level, zlib.DEFLATED, 31)
        return deflater.compress(section) + deflater.flush()
    return section


def pack_batch(*, base_offset: int, leader_epoch: int, attributes: int,
               last_offset_delta: int, base_timestamp: int, max_timestamp: int,
               producer_id: int, producer_epoch: int, base_sequence: int,
               record_count: int, section: bytes) -> bytes:
    """A whole batch: the header for ``section`` (already compressed as
    ``attributes`` say), with its length and CRC."""
    header = bytearray(HEADER.pack(
        base_offset, HEADER_SIZE - LOG_OVERHEAD + len(section), leader_epoch, MAGIC, 0,
        attributes, last_offset_delta, base_timestamp, max_timestamp, producer_id,
        producer_epoch, base_sequence, record_count))
    crc = crc32(section, crc32(memoryview(header)[ATTRIBUTES_OFFSET:]))
    struct.pack_into(">I", header, CRC_OFFSET, crc & 0xFFFFFFFF)
    return bytes(header) + section


def pack_header_into(batch: bytearray, *, base_offset: int, leader_epoch: int,
                     attributes: int, last_offset_delta: int, base_timestamp: int,
                     max_timestamp: int, producer_id: int, producer_epoch: int,
                     base_sequence: int, record_count: int) -> bytearray:
    """``pack_batch`` in place: ``batch`` holds HEADER_SIZE free bytes, then
    the (uncompressed) section; the header and CRC are written into it."""
    HEADER.pack_into(batch, 0, base_offset, len(batch) - LOG_OVERHEAD, leader_epoch, MAGIC, 0,
                     attributes, last_offset_delta, base_timestamp, max_timestamp, producer_id,
                     producer_epoch, base_sequence, record_count)
    crc = crc32(memoryview(batch)[ATTRIBUTES_OFFSET:])
    struct.pack_into(">I", batch, CRC_OFFSET, crc & 0xFFFFFFFF)
    return batch


def decompress(codec: int, data, limit_bytes: int) -> bytes:
    if codec == Compression.NONE:
        return data
    if codec == Compression.GZIP:
        inflater = zlib.decompressobj(wbits=31)
        try:
            out = inflater.decompress(data, limit_bytes)
        except zlib.error as exc:
            raise CorruptRecordError(f"gzip records section does not decompress: {exc}") from exc
        if inflater.unconsumed_tail or (not inflater.eof and len(out) >= limit_bytes):
            raise CorruptRecordError(
                f"records section decompresses to more than {limit_bytes} bytes")
        if not inflater.eof:
            raise CorruptRecordError("gzip records section is truncated")
        return out
    raise UnsupportedCompressionTypeError(f"compression codec {codec} is not supported")


def iter_records(batch, *, verify_crc: bool = True,
                 max_decompressed_bytes: int = DEFAULT_MAX_DECOMPRESSED_BYTES
                 ) -> Iterator[Record]:
    """Decode the records of one whole batch (bytes of exactly one batch).

    Raises ``CorruptRecordError`` when the CRC is wrong, the records do not
    decode, or their number or offset deltas disagree with the header.
    """
    view = memoryview(batch)
    if len(view) < HEADER_SIZE:
        raise CorruptRecordError("truncated batch header")
    header = parse_header(view)
    check_header(header, len(view), MAX_BATCH_BYTES, strict=False)
    end = header.size_bytes
    if verify_crc and compute_crc(view, 0, end) != header.crc:
        raise CorruptRecordError(f"CRC mismatch in batch at offset {header.base_offset}")
    section = decompress(header.compression, view[HEADER_SIZE:end], max_decompressed_bytes)
    unpacker = msgpack.Unpacker(raw=False, use_list=False,
                                max_buffer_size=max(len(section), 1))
    unpacker.feed(section)
    base_offset = header.base_offset
    base_timestamp = header.base_timestamp
    count = 0
    last_delta = -1
    decoded_bytes = 0  # end of the last whole record (tell() also counts a partial one)
    try:
        for item in unpacker:
            decoded_bytes = unpacker.tell()
            timestamp_delta, offset_delta, key, value, headers = item
            if offset_delta <= last_delta or offset_delta > header.last_offset_delta:
                raise CorruptRecordError(
                    f"record offset delta {offset_delta} out of order in batch at "
                    f"offset {base_offset}")
            last_delta = offset_delta
            count += 1
            yield Record(base_offset + offset_delta, base_timestamp + timestamp_delta,
                         key, value, headers)
    except (ValueError, TypeError, msgpack.UnpackException) as exc:
        raise CorruptRecordError(
            f"records of batch at offset {base_offset} do not decode: {exc}") from exc
    if decoded_bytes != len(section):
        raise CorruptRecordError(
            f"records of batch at offset {base_offset} end in "
            f"{len(section) - decoded_bytes} undecodable bytes")
    if count != header.record_count:
        raise CorruptRecordError(
            f"batch at offset {base_offset} holds {count} records, header says "
            f"{header.record_count}")


def decode_batches(buf, *, verify_crc: bool = True) -> Iterator[Record]:
    """Decode every record of every whole batch in ``buf`` (a fetch response)."""
    for _header, view in iter_batches(buf):
        yield from iter_records(view, verify_crc=verify_crc)


# ---------------------------------------------------------------------------
# Building batches (client side).
# ---------------------------------------------------------------------------
_BYTES_LIKE = (bytes, bytearray, memoryview)


def _check_bytes(name: str, value) -> None:
    if value is not None and not isinstance(value, _BYTES_LIKE):
        raise TypeError(f"record {name} must be bytes or None, not {type(value).__name__}")


def _supported(compression: int) -> Compression:
    """``compression`` as a ``Compression`` a producer may build with."""
    compression = Compression(compression)
    if compression not in SUPPORTED_COMPRESSION:
        raise UnsupportedCompressionTypeError(
            f"compression {compression.name.lower()} is not supported; use none or gzip")
    return compression


class BatchBuilder:
    """Accumulates records for one partition and builds one batch.

    The batch leaves the builder with base offset 0 and no leader epoch; the
    partition leader stamps both. Records are packed as they are appended, so
    ``size_bytes`` is exact before compression and ``has_room_for`` can keep a
    batch under the broker's limit.
    """

    # msgpack framing per record beyond key and value: array header, two ints,
    # two bin headers and an empty header array, at most.
    _RECORD_OVERHEAD_BYTES_MAX = 1 + 9 + 9 + 5 + 5 + 5

    def __init__(self, *, compression: Compression = Compression.NONE,
                 compression_level: int = 6,
                 producer_id: int = NO_PRODUCER_ID,
                 producer_epoch: int = NO_PRODUCER_EPOCH,
                 base_sequence: int = NO_SEQUENCE,
                 transactional: bool = False,
                 control: bool = False) -> None:
        self.compression = _supported(compression)
        self.compression_level = compression_level
        self.producer_id = producer_id
        self.producer_epoch = producer_epoch
        self.base_sequence = base_sequence
        self.transactional = transactional
        self.control = control
        self._packer = msgpack.Packer(use_bin_type=True, autoreset=True)
        self._chunks: list[bytes] = []
        self._section_bytes = 0
        self._base_timestamp = NO_TIMESTAMP
        self._max_timestamp = NO_TIMESTAMP

    @property
    def record_count(self) -> int:
        return len(self._chunks)

    @property
    def size_bytes(self) -> int:
        """Size of the batch if built now, before compression."""
        return HEADER_SIZE + self._section_bytes

    def has_room_for(self, key, value, limit_bytes: int, headers=()) -> bool:
        """Whether one more record keeps the (uncompressed) batch within
        ``limit_bytes``. An empty builder always has room: a single record
        larger than the limit is the broker's to refuse, with a clear error."""
        if not self._chunks:
            return True
        estimate = self._RECORD_OVERHEAD_BYTES_MAX
        estimate += len(key) if key is not None else 0
        estimate += len(value) if value is not None else 0
        for hkey, hvalue in headers:
            # Header keys are packed as UTF-8: count bytes, not characters.
            estimate += 10 + len(hkey.encode("utf-8")) + (
                len(hvalue) if hvalue is not None else 0)
        return self.size_bytes + estimate <= limit_bytes

    def append(self, key: bytes | None, value: bytes | None, *,
               timestamp_ms: int | None = None,
               headers: Sequence[tuple[str, bytes | None]] = ()) -> int:
        """Add a record; returns its offset delta within the batch."""
        _check_bytes("key", key)
        _check_bytes("value", value)
        for hkey, hvalue in headers:
            if not isinstance(hkey, str):
                raise TypeError(f"header key must be str, not {type(hkey).__name__}")
            _check_bytes("header value", hvalue)
        if timestamp_ms is None:
            timestamp_ms = int(time.time() * 1000)
        if not self._chunks:
            # The first record fixes the base; test the count, not the value,
            # since NO_TIMESTAMP (-1) is itself a timestamp a record may carry.
            self._base_timestamp = self._max_timestamp = timestamp_ms
        elif timestamp_ms > self._max_timestamp:
            self._max_timestamp = timestamp_ms
        offset_delta = len(self._chunks)
        packed = self._packer.pack(
            (timestamp_ms - self._base_timestamp, offset_delta, key, value,
             [list(h) for h in headers]))
        self._chunks.append(packed)
        self._section_bytes += len(packed)
        return offset_delta

    def build(self) -> bytes:
        """Return the finished batch bytes (base offset 0, leader epoch unset)."""
        if not self._chunks:
            raise InvalidRecordError("cannot build an empty batch")
        section = compress(self.compression, b"".join(self._chunks), self.compression_level)
        attributes = int(self.compression)
        if self.transactional:
            attributes |= TRANSACTIONAL_BIT
        if self.control:
            attributes |= CONTROL_BIT
        count = len(self._chunks)
        return pack_batch(
            base_offset=0, leader_epoch=NO_PARTITION_LEADER_EPOCH, attributes=attributes,
            last_offset_delta=count - 1, base_timestamp=self._base_timestamp,
            max_timestamp=self._max_timestamp, producer_id=self.producer_id,
            producer_epoch=self.producer_epoch, base_sequence=self.base_sequence,
            record_count=count, section=section)


class EncodedBatchBuilder:
    """A batch whose records section is already encoded (record ``j`` at
    offset delta ``j``, every record at ``timestamp_ms``, e.g. by
    ``protocol.columns.encode``): ``BatchBuilder``'s interface for a
    producer that hands over whole sections, with no room for more."""

    def __init__(self, section: bytes | bytearray, record_count: int, timestamp_ms: int, *,
                 compression: Compression = Compression.NONE,
                 compression_level: int = 6, transactional: bool = False,
                 header_room: bool = False) -> None:
        compression = _supported(compression)
        if record_count < 1:
            raise InvalidRecordError("cannot build an empty batch")
        if header_room and not (isinstance(section, bytearray) and len(section) >= HEADER_SIZE):
            raise ValueError("a section with header room is a bytearray of at least "
                             f"{HEADER_SIZE} bytes")
        #: With ``header_room``: a bytearray whose first HEADER_SIZE bytes
        #: take the header in place (no copy of the records to prepend it).
        self.section = section
        self.header_room = header_room
        self.record_count = record_count
        self.timestamp_ms = timestamp_ms
        self.compression = compression
        self.compression_level = compression_level
        self.transactional = transactional
        self.producer_id = NO_PRODUCER_ID
        self.producer_epoch = NO_PRODUCER_EPOCH
        self.base_sequence = NO_SEQUENCE

    @property
    def size_bytes(self) -> int:
        return len(self.section) + (0 if self.header_room else HEADER_SIZE)

    def has_room_for(self, key, value, limit_bytes: int, headers=()) -> bool:
        return False

    def build(self) -> bytes | bytearray:
        attributes = int(self.compression) | (TRANSACTIONAL_BIT if self.transactional else 0)
        fields = dict(
            base_offset=0, leader_epoch=NO_PARTITION_LEADER_EPOCH, attributes=attributes,
            last_offset_delta=self.record_count - 1, base_timestamp=self.timestamp_ms,
            max_timestamp=self.timestamp_ms, producer_id=self.producer_id,
            producer_epoch=self.producer_epoch, base_sequence=self.base_sequence,
            record_count=self.record_count)
        if self.header_room and self.compression == Compression.NONE:
            return pack_header_into(self.section, **fields)
        section = memoryview(self.section)[HEADER_SIZE:] if self.header_room else self.section
        return pack_batch(**fields, section=compress(self.compression, section,
                                                     self.compression_level))


class ControlType(enum.IntEnum):
    """What a control batch (attribute bit 5) marks, as Kafka numbers it: the
    end of a producer's transaction in this partition."""

    ABORT = 0
    COMMIT = 1


#: A control record's key: version, type; its value: version, the
#: transaction coordinator's epoch (Kafka's EndTransactionMarker).
CONTROL_KEY = struct.Struct(">hh")
CONTROL_VALUE = struct.Struct(">hi")


def build_control_batch(control_type: ControlType, producer_id: int, producer_epoch: int,
                        coordinator_epoch: int, timestamp_ms: int) -> bytes:
    """A transaction marker: one control record in a transactional control
    batch of the producer's, written by the transaction coordinator."""
    builder = BatchBuilder(producer_id=producer_id, producer_epoch=producer_epoch,
                           transactional=True, control=True)
    builder.append(CONTROL_KEY.pack(0, int(control_type)),
                   CONTROL_VALUE.pack(0, coordinator_epoch), timestamp_ms=timestamp_ms)
    return builder.build()


def without_aborted(batches: list[tuple[BatchHeader, Any]], aborted: Sequence[dict]
                    ) -> list[tuple[BatchHeader, Any]]:
    """Kafka's read_committed filter over a fetch answer's batches, given
    its ``aborted_transactions`` (``{"producer_id", "first_offset"}``): from
    an aborted transaction's first offset up to its producer's next marker,
    that producer's transactional batches, and the marker itself, get
    ``None`` for their bytes (the reader moves past them, returning nothing)."""
    pending = sorted((txn["first_offset"], txn["producer_id"]) for txn in aborted)
    index = 0
    aborting: set[int] = set()
    out = []
    for header, view in batches:
        while index < len(pending) and pending[index][0] <= header.last_offset:
            aborting.add(pending[index][1])
            index += 1
        if header.producer_id in aborting:
            if header.is_control:
                aborting.discard(header.producer_id)  # its transaction ends here
                view = None
            elif header.is_transactional:
                view = None
        out.append((header, view))
    return out


def parse_control_batch(batch) -> tuple[ControlType, int]:
    """``(type, coordinator epoch)`` of a control batch (its one record)."""
    records = list(iter_records(batch, verify_crc=False))
    if len(records) != 1 or records[0].key is None or len(records[0].key) != CONTROL_KEY.size:
        raise CorruptRecordError("a control batch holds one control record")
    _version, kind = CONTROL_KEY.unpack(records[0].key)
    value = records[0].value or b""
    coordinator_epoch = (CONTROL_VALUE.unpack(value)[1] if len(value) == CONTROL_VALUE.size
                         else -1)
    try:
        return ControlType(kind), coordinator_epoch
    except ValueError:
        raise CorruptRecordError(f"unknown control record type {kind}") from None


def next_sequence(sequence: int, increment: int = 1) -> int:
    """``sequence + increment``, wrapping past ``SEQUENCE_MAX`` to 0 as Kafka's do."""
    return (sequence + increment) % (SEQUENCE_MAX + 1)


def with_producer(batch: bytes, producer_id: int, producer_epoch: int,
                  base_sequence: int) -> bytes:
    """A copy of one built batch stamped with another producer id, epoch and
    base sequence (inside the CRC, so it is recomputed over the header only
    and combined with the unchanged records section's). The idempotent
    producer re-sequences a batch this way after an epoch bump."""
    header = bytearray(batch[:HEADER_SIZE])
    struct.pack_into(">qhi", header, PRODUCER_ID_OFFSET, producer_id, producer_epoch,
                     base_sequence)
    section = memoryview(batch)[HEADER_SIZE:]
    crc = crc32(section, crc32(memoryview(header)[ATTRIBUTES_OFFSET:]))
    struct.pack_into(">I", header, CRC_OFFSET, crc & 0xFFFFFFFF)
    return bytes(header) + bytes(section)


def build_batch(records: Sequence[tuple[bytes | None, bytes | None]], *,
                timestamp_ms: int | None = None,
                compression: Compression = Compression.NONE) -> bytes:
    """Convenience: one batch from ``(key, value)`` pairs sharing a timestamp."""
    builder = BatchBuilder(compression=compression)
    if timestamp_ms is None:
        timestamp_ms = int(time.time() * 1000)
    for key, value in records:
        builder.append(key, value, timestamp_ms=timestamp_ms)
    return builder.build()
