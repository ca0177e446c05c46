"""Unit tests of the record batch format (storage/batch.py): header layout,
building, validation, stamping, decoding, and refusal of bad bytes."""

from __future__ import annotations

import gzip
import struct
import time
import zlib

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from storage import batch as fmt
from storage.batch import (
    BatchBuilder,
    Compression,
    CorruptRecordError,
    InvalidRecordError,
    Record,
    RecordFormatError,
    RecordTooLargeError,
    UnsupportedCompressionTypeError,
    build_batch,
    decode_batches,
    iter_batches,
    iter_records,
    parse_header,
    stamped_prefix,
    validate_batches,
)

T0 = 1_700_000_000_000  # a plausible wall-clock timestamp in ms


# ---------------------------------------------------------------------------
# Helpers for building and forging batches.
# ---------------------------------------------------------------------------
def three_record_batch(compression: Compression = Compression.NONE) -> bytes:
    builder = BatchBuilder(compression=compression)
    builder.append(b"k0", b"v0", timestamp_ms=T0)
    builder.append(None, b"v1", timestamp_ms=T0 + 5)
    builder.append(b"k2", None, timestamp_ms=T0 + 2)
    return builder.build()


def recompute_crc(buf: bytearray) -> None:
    """Rewrite the CRC of the single batch in ``buf`` (CRC-32 over [ATTRIBUTES_OFFSET:])."""
    crc = zlib.crc32(bytes(buf[fmt.ATTRIBUTES_OFFSET:])) & 0xFFFFFFFF
    struct.pack_into(">I", buf, fmt.CRC_OFFSET, crc)


def patch_header(batch: bytes, *, fix_crc: bool = True, **fields) -> bytes:
    """``batch`` with some header fields replaced, CRC recomputed unless told not to."""
    header = parse_header(batch)._replace(**fields)
    out = bytearray(batch)
    fmt.HEADER.pack_into(out, 0, *header)
    if fix_crc:
        recompute_crc(out)
    return bytes(out)


def pack_record(timestamp_delta: int, offset_delta: int, key: bytes | None = b"k",
                value: bytes | None = b"v", headers=()) -> bytes:
    return msgpack.packb([timestamp_delta, offset_delta, key, value, [list(h) for h in headers]],
                         use_bin_type=True)


def gzip_bytes(data: bytes) -> bytes:
    deflater = zlib.compressobj(6, zlib.DEFLATED, 31)
    return deflater.compress(data) + deflater.flush()


def forge_batch(section: bytes, *, record_count: int, last_offset_delta: int,
                compression: int = Compression.NONE, base_offset: int = 0) -> bytes:
    """A batch with an arbitrary records section and a valid CRC."""
    out = bytearray(fmt.HEADER.pack(
        base_offset, fmt.HEADER_SIZE - fmt.LOG_OVERHEAD + len(section),
        fmt.NO_PARTITION_LEADER_EPOCH, fmt.MAGIC, 0, compression, last_offset_delta,
        T0, T0, fmt.NO_PRODUCER_ID, fmt.NO_PRODUCER_EPOCH, fmt.NO_SEQUENCE, record_count))
    out += section
    recompute_crc(out)
    return bytes(out)


def stamp(batch: bytes, base_offset: int, leader_epoch: int) -> bytes:
    """What a leader does on append: new prefix, rest of the bytes unchanged."""
    prefix = stamped_prefix(parse_header(batch), base_offset, leader_epoch)
    return prefix + batch[fmt.MAGIC_OFFSET:]


# ---------------------------------------------------------------------------
# Header layout.
# ---------------------------------------------------------------------------
def test_header_is_61_bytes_and_field_offsets_match_kafka_v2():
    assert fmt.HEADER_SIZE == fmt.HEADER.size == 61
    assert fmt.LOG_OVERHEAD == 12
    assert fmt.MIN_BATCH_LENGTH == 49
    assert (fmt.BASE_OFFSET_OFFSET, fmt.LENGTH_OFFSET, fmt.LEADER_EPOCH_OFFSET,
            fmt.MAGIC_OFFSET, fmt.CRC_OFFSET, fmt.ATTRIBUTES_OFFSET) == (0, 8, 12, 16, 17, 21)


def test_builder_writes_each_field_at_its_kafka_v2_offset():
    builder = BatchBuilder(compression=Compression.GZIP, producer_id=0x0102030405060708,
                           producer_epoch=0x0A0B, base_sequence=0x11223344,
                           transactional=True)
    builder.append(b"a", b"b", timestamp_ms=T0 + 10)
    builder.append(b"c", b"d", timestamp_ms=T0 + 30)
    builder.append(b"e", b"f", timestamp_ms=T0)
    raw = stamp(builder.build(), 0x7FEEDDCCBBAA9988, 0x55667788)

    # Read each field straight from the bytes at Kafka's RecordBatch v2 offsets.
    def at(fmt_char: str, offset: int) -> int:
        return struct.unpack_from(">" + fmt_char, raw, offset)[0]

    assert at("q", 0) == 0x7FEEDDCCBBAA9988            # baseOffset
    assert at("i", 8) == len(raw) - 12                  # batchLength
    assert at("i", 12) == 0x55667788                    # partitionLeaderEpoch
    assert at("b", 16) == 2                             # magic
    assert at("I", 17) == zlib.crc32(raw[21:])          # crc over attributes..end
    assert at("h", 21) == Compression.GZIP | fmt.TRANSACTIONAL_BIT  # attributes
    assert at("i", 23) == 2                             # lastOffsetDelta
    assert at("q", 27) == T0 + 10                       # baseTimestamp (first record's)
    assert at("q", 35) == T0 + 30                       # maxTimestamp
    assert at("q", 43) == 0x0102030405060708            # producerId
    assert at("h", 51) == 0x0A0B                        # producerEpoch
    assert at("i", 53) == 0x11223344                    # baseSequence
    assert at("i", 57) == 3                             # recordCount


def test_parse_header_exposes_derived_properties():
    raw = stamp(three_record_batch(), 100, 4)
    header = parse_header(raw)
    assert header.size_bytes == len(raw)
    assert (header.base_offset, header.last_offset, header.next_offset) == (100, 102, 103)
    assert header.partition_leader_epoch == 4
    assert header.compression == Compression.NONE
    assert not header.is_transactional and not header.is_control


def test_builder_leaves_offset_and_epoch_for_the_leader_and_sets_control_bit():
    builder = BatchBuilder(control=True)
    builder.append(None, b"marker", timestamp_ms=T0)
    header = parse_header(builder.build())
    assert header.base_offset == 0
    assert header.partition_leader_epoch == fmt.NO_PARTITION_LEADER_EPOCH
    assert (header.producer_id, header.producer_epoch, header.base_sequence) == (-1, -1, -1)
    assert header.is_control and not header.is_transactional


# ---------------------------------------------------------------------------
# Round trips.
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("compression", [Compression.NONE, Compression.GZIP])
def test_build_validate_decode_round_trip(compression):
    builder = BatchBuilder(compression=compression)
    rows = [
        (b"key-0", b"value-0", T0 + 100, [("trace", b"abc"), ("empty", None)]),
        (None, b"value-1", T0 + 250, []),
        (b"key-2", None, T0 + 40, [("h", b"")]),  # earlier than the first: negative delta
        (None, None, T0 - 5_000, []),             # far earlier still
        (b"", b"", T0 + 100, [("\u00e9t\u00e9", b"\x00\xff")]),
    ]
    for delta, (key, value, ts, headers) in enumerate(rows):
        assert builder.append(key, value, timestamp_ms=ts, headers=headers) == delta
    raw = builder.build()

    [(position, header)] = validate_batches(raw)
    assert position == 0
    assert header.record_count == 5 and header.last_offset_delta == 4
    assert header.base_timestamp == T0 + 100
    assert header.max_timestamp == T0 + 250
    assert header.compression == compression

    records = list(iter_records(raw))
    assert records == [
        Record(offset, ts, key, value, tuple(tuple(h) for h in headers))
        for offset, (key, value, ts, headers) in enumerate(rows)
    ]
    assert list(decode_batches(raw)) == records


def test_gzip_section_is_a_real_gzip_stream_of_the_uncompressed_records():
    plain = BatchBuilder()
    zipped = BatchBuilder(compression=Compression.GZIP)
    for i in range(50):
        for builder in (plain, zipped):
            builder.append(b"key", b"the same value again and again", timestamp_ms=T0 + i)
    plain_raw, zipped_raw = plain.build(), zipped.build()
    assert gzip.decompress(zipped_raw[fmt.HEADER_SIZE:]) == plain_raw[fmt.HEADER_SIZE:]
    assert len(zipped_raw) < len(plain_raw) // 4
    assert list(iter_records(zipped_raw)) == list(iter_records(plain_raw))


def test_uncompressed_size_bytes_is_exact():
    builder = BatchBuilder()
    assert builder.size_bytes == fmt.HEADER_SIZE
    builder.append(b"k", b"v" * 300, timestamp_ms=T0, headers=[("a", b"b")])
    builder.append(None, None, timestamp_ms=T0 - 1)
    assert len(builder.build()) == builder.size_bytes
    assert builder.record_count == 2


def test_bytes_like_keys_and_values_decode_as_bytes():
    builder = BatchBuilder()
    builder.append(bytearray(b"key"), memoryview(b"value"), timestamp_ms=T0,
                   headers=[("h", bytearray(b"x"))])
    [record] = iter_records(builder.build())
    assert (record.key, record.value, record.headers) == (b"key", b"value", (("h", b"x"),))


def test_build_batch_shares_one_timestamp():
    raw = build_batch([(b"a", b"1"), (None, b"2")], timestamp_ms=T0,
                      compression=Compression.GZIP)
    validate_batches(raw)
    assert [(r.offset, r.timestamp, r.key, r.value) for r in iter_records(raw)] == [
        (0, T0, b"a", b"1"), (1, T0, None, b"2")]


def test_first_record_with_no_timestamp_keeps_it():
    # -1 is Kafka's NO_TIMESTAMP; it must not be mistaken for "no record yet".
    builder = BatchBuilder()
    builder.append(b"a", b"1", timestamp_ms=fmt.NO_TIMESTAMP)
    builder.append(b"b", b"2", timestamp_ms=T0)
    raw = builder.build()
    assert [r.timestamp for r in iter_records(raw)] == [fmt.NO_TIMESTAMP, T0]
    header = parse_header(raw)
    assert (header.base_timestamp, header.max_timestamp) == (fmt.NO_TIMESTAMP, T0)


def test_max_timestamp_of_negative_timestamps_is_the_largest_of_them():
    builder = BatchBuilder()
    builder.append(None, b"x", timestamp_ms=-50)
    builder.append(None, b"y", timestamp_ms=-20)
    header = parse_header(builder.build())
    assert (header.base_timestamp, header.max_timestamp) == (-50, -20)


# ---------------------------------------------------------------------------
# Stamping by the leader.
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("compression", [Compression.NONE, Compression.GZIP])
def test_stamping_base_offset_and_epoch_keeps_crc_valid(compression):
    original = three_record_batch(compression)
    header = parse_header(original)
    prefix = stamped_prefix(header, 1_000, 7)
    assert len(prefix) == fmt.MAGIC_OFFSET
    stamped = prefix + original[fmt.MAGIC_OFFSET:]

    assert len(stamped) == len(original)
    assert stamped[fmt.MAGIC_OFFSET:] == original[fmt.MAGIC_OFFSET:]  # CRC untouched
    [(_, new_header)] = validate_batches(stamped)
    assert new_header.base_offset == 1_000
    assert new_header.partition_leader_epoch == 7
    assert new_header.crc == header.crc
    assert new_header.batch_length == header.batch_length

    before = list(iter_records(original))
    after = list(iter_records(stamped))
    assert [r.offset for r in before] == [0, 1, 2]
    assert [r.offset for r in after] == [1_000, 1_001, 1_002]
    assert [r._replace(offset=0) for r in after] == [r._replace(offset=0) for r in before]


# ---------------------------------------------------------------------------
# Buffers of several batches.
# ---------------------------------------------------------------------------
def test_multi_batch_buffer_validates_and_decodes_in_order():
    first = stamp(three_record_batch(), 0, 1)
    second = stamp(build_batch([(b"x", b"y")], timestamp_ms=T0), 3, 1)
    third = stamp(three_record_batch(Compression.GZIP), 4, 2)
    buf = first + second + third

    validated = validate_batches(buf)
    assert [pos for pos, _ in validated] == [0, len(first), len(first) + len(second)]
    assert [h.base_offset for _, h in validated] == [0, 3, 4]

    views = list(iter_batches(buf))
    assert [bytes(view) for _, view in views] == [first, second, third]
    assert [r.offset for r in decode_batches(buf)] == [0, 1, 2, 3, 4, 5, 6]
    assert [r.value for r in decode_batches(buf)] == [
        b"v0", b"v1", None, b"y", b"v0", b"v1", None]


def test_validate_accepts_bytearray_and_memoryview():
    raw = three_record_batch()
    for buf in (bytearray(raw), memoryview(raw)):
        assert [h.record_count for _, h in validate_batches(buf)] == [3]


# ---------------------------------------------------------------------------
# Refusing bad batches: every error is typed and nothing is half-accepted.
# ---------------------------------------------------------------------------
def flip_last_record_byte(raw: bytes) -> bytes:
    out = bytearray(raw)
    out[-1] ^= 0x01
    return bytes(out)


def flip_timestamp_byte(raw: bytes) -> bytes:
    out = bytearray(raw)
    out[30] ^= 0x80  # inside base_timestamp, which the CRC covers
    return bytes(out)


GOOD = three_record_batch()

BAD_BATCHES = {
    "record byte flipped (CRC)": (flip_last_record_byte(GOOD), CorruptRecordError, "CRC"),
    "header byte flipped (CRC)": (flip_timestamp_byte(GOOD), CorruptRecordError, "CRC"),
    "truncated header": (GOOD[:fmt.HEADER_SIZE - 1], CorruptRecordError, "truncated"),
    "length overruns buffer": (GOOD[:-1], CorruptRecordError, "overruns"),
    "length below minimum": (
        patch_header(GOOD, batch_length=fmt.MIN_BATCH_LENGTH - 1), CorruptRecordError,
        "below the minimum"),
    "negative length": (patch_header(GOOD, batch_length=-5), CorruptRecordError,
                        "below the minimum"),
    "wrong magic": (patch_header(GOOD, magic=1), CorruptRecordError, "magic"),
    "record count above last offset delta": (
        patch_header(GOOD, record_count=4), CorruptRecordError, "disagrees"),
    "record count below last offset delta": (
        patch_header(GOOD, record_count=2), CorruptRecordError, "disagrees"),
    "negative record count": (
        patch_header(GOOD, record_count=-1), CorruptRecordError, "negative"),
    "zstd": (patch_header(GOOD, attributes=Compression.ZSTD),
             UnsupportedCompressionTypeError, "codec 4"),
    "snappy": (patch_header(GOOD, attributes=Compression.SNAPPY),
               UnsupportedCompressionTypeError, "codec 2"),
    "no records": (forge_batch(b"", record_count=0, last_offset_delta=0),
                   InvalidRecordError, "at least one record"),
}


@pytest.mark.parametrize("name", sorted(BAD_BATCHES))
def test_validate_refuses_bad_batch_with_typed_error(name):
    raw, error, message = BAD_BATCHES[name]
    with pytest.raises(error, match=message):
        validate_batches(raw)


@pytest.mark.parametrize("name", sorted(BAD_BATCHES))
def test_bad_batch_after_good_ones_fails_the_whole_buffer(name):
    raw, error, _ = BAD_BATCHES[name]
    good = stamp(GOOD, 0, 0) + stamp(GOOD, 3, 0)
    with pytest.raises(error):
        validate_batches(good + raw)
    assert len(validate_batches(good)) == 2  # the good part alone is fine


def test_patched_forgeries_are_otherwise_valid():
    # Guard for the table above: each forgery breaks exactly the field under
    # test, so a patch with the original value validates.
    assert validate_batches(patch_header(GOOD, record_count=3))
    assert validate_batches(patch_header(GOOD, attributes=Compression.NONE))
    assert validate_batches(forge_batch(pack_record(0, 0), record_count=1,
                                        last_offset_delta=0))


def test_empty_buffer_is_an_invalid_request():
    with pytest.raises(InvalidRecordError, match="no record batches"):
        validate_batches(b"")


def test_batch_above_size_limit_is_too_large():
    raw = three_record_batch()
    assert validate_batches(raw, max_batch_bytes=len(raw))
    with pytest.raises(RecordTooLargeError, match="max.message.bytes") as info:
        validate_batches(raw, max_batch_bytes=len(raw) - 1)
    assert info.value.code == "MESSAGE_TOO_LARGE"
    assert str(len(raw)) in str(info.value)


def test_non_strict_validation_accepts_sparse_and_empty_batches():
    # Stored and replicated batches may be sparse after compaction.
    sparse = patch_header(GOOD, record_count=2)
    empty = forge_batch(b"", record_count=0, last_offset_delta=0)
    assert [h.record_count for _, h in validate_batches(sparse + empty, strict=False)] == [2, 0]
    assert list(iter_records(empty)) == []
    # ... but never more records than the offset range holds.
    with pytest.raises(CorruptRecordError, match="exceeds"):
        validate_batches(patch_header(GOOD, record_count=4), strict=False)


def test_error_classes_carry_stable_codes():
    assert all(issubclass(cls, RecordFormatError) for cls in (
        CorruptRecordError, RecordTooLargeError, UnsupportedCompressionTypeError,
        InvalidRecordError))
    assert CorruptRecordError.code == "CORRUPT_MESSAGE"
    assert RecordTooLargeError.code == "MESSAGE_TOO_LARGE"
    assert UnsupportedCompressionTypeError.code == "UNSUPPORTED_COMPRESSION_TYPE"
    assert InvalidRecordError.code == "INVALID_RECORD"


# ---------------------------------------------------------------------------
# Decoding records.
# ---------------------------------------------------------------------------
def test_iter_records_checks_crc_unless_told_not_to():
    bad = flip_timestamp_byte(GOOD)
    with pytest.raises(CorruptRecordError, match="CRC"):
        list(iter_records(bad))
    with pytest.raises(CorruptRecordError, match="CRC"):
        list(decode_batches(bad))
    assert len(list(iter_records(bad, verify_crc=False))) == 3


def test_iter_records_detects_fewer_records_than_the_header_says():
    # A sparse-looking header (count 2, offsets 0..2) whose section holds three.
    with pytest.raises(CorruptRecordError, match="holds 3 records, header says 2"):
        list(iter_records(patch_header(GOOD, record_count=2)))


def test_iter_records_detects_missing_records():
    section = pack_record(0, 0) + pack_record(0, 1)
    raw = forge_batch(section, record_count=3, last_offset_delta=2)
    with pytest.raises(CorruptRecordError, match="holds 2 records, header says 3"):
        list(iter_records(raw))


@pytest.mark.parametrize("section", [
    b"\xc1",                                         # a byte msgpack never uses
    msgpack.packb([0, 0, b"k"], use_bin_type=True),  # too few fields
    msgpack.packb(7),                                # not an array at all
    msgpack.packb([0, "zero", b"k", b"v", []]),      # offset delta not an int
    pack_record(0, 0)[:-2],                          # record cut short
    pack_record(0, 0) + b"\x95\x00",                 # trailing partial record
], ids=["reserved-byte", "short-array", "not-array", "str-delta", "cut-short",
        "trailing-partial"])
def test_iter_records_refuses_undecodable_records(section):
    raw = forge_batch(section, record_count=1, last_offset_delta=0)
    validate_batches(raw)  # the header and CRC are fine: only decoding can tell
    with pytest.raises(CorruptRecordError):
        list(iter_records(raw))


@pytest.mark.parametrize("deltas", [(1, 0), (0, 0), (0, 3)],
                         ids=["descending", "repeated", "beyond-last-delta"])
def test_iter_records_refuses_bad_offset_deltas(deltas):
    section = b"".join(pack_record(0, d) for d in deltas)
    raw = forge_batch(section, record_count=2, last_offset_delta=2)
    with pytest.raises(CorruptRecordError, match="offset delta"):
        list(iter_records(raw))


def test_iter_records_yields_sparse_offsets_of_a_compacted_batch():
    section = pack_record(0, 0, value=b"a") + pack_record(3, 2, value=b"c")
    raw = stamp(forge_batch(section, record_count=2, last_offset_delta=2), 10, 0)
    assert [(r.offset, r.timestamp, r.value) for r in iter_records(raw)] == [
        (10, T0, b"a"), (12, T0 + 3, b"c")]


def test_iter_records_refuses_unsupported_codec():
    with pytest.raises(UnsupportedCompressionTypeError):
        list(iter_records(patch_header(GOOD, attributes=Compression.ZSTD)))


def test_iter_records_refuses_truncated_or_wrong_buffers():
    with pytest.raises(CorruptRecordError, match="truncated"):
        list(iter_records(GOOD[:fmt.HEADER_SIZE - 1]))
    with pytest.raises(CorruptRecordError, match="overruns"):
        list(iter_records(GOOD[:-1]))
    with pytest.raises(CorruptRecordError, match="magic"):
        list(iter_records(patch_header(GOOD, magic=0)))


def test_gzip_section_that_does_not_inflate_is_corrupt():
    raw = forge_batch(b"this is not gzip", record_count=1, last_offset_delta=0,
                      compression=Compression.GZIP)
    with pytest.raises(CorruptRecordError, match="decompress"):
        list(iter_records(raw))


def test_truncated_gzip_stream_is_corrupt():
    # The records decode, but the stream lacks its end (and gzip's own CRC).
    section = gzip_bytes(pack_record(0, 0))[:-4]
    raw = forge_batch(section, record_count=1, last_offset_delta=0,
                      compression=Compression.GZIP)
    with pytest.raises(CorruptRecordError):
        list(iter_records(raw))


def test_gzip_decompression_bomb_is_stopped_at_the_limit():
    builder = BatchBuilder(compression=Compression.GZIP)
    builder.append(None, bytes(2_000_000), timestamp_ms=T0)
    uncompressed = builder.size_bytes - fmt.HEADER_SIZE
    raw = builder.build()
    assert len(raw) < 10_000  # two megabytes of zeros squeeze into a few kilobytes

    with pytest.raises(CorruptRecordError, match="more than 100000 bytes"):
        list(iter_records(raw, max_decompressed_bytes=100_000))
    with pytest.raises(CorruptRecordError):
        list(iter_records(raw, max_decompressed_bytes=uncompressed - 1))
    [record] = iter_records(raw, max_decompressed_bytes=uncompressed)
    assert record.value == bytes(2_000_000)


# ---------------------------------------------------------------------------
# Iterating whole batches of a fetch response.
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("tail_bytes", [1, fmt.HEADER_SIZE - 1, fmt.HEADER_SIZE,
                                        len(GOOD) - 1])
def test_iter_batches_drops_a_partial_tail_by_default(tail_bytes):
    whole = stamp(GOOD, 0, 0)
    buf = whole + stamp(GOOD, 3, 0)[:tail_bytes]
    assert [bytes(view) for _, view in iter_batches(buf)] == [whole]
    assert [r.offset for r in decode_batches(buf)] == [0, 1, 2]
    with pytest.raises(CorruptRecordError):
        list(iter_batches(buf, allow_partial_tail=False))


def test_iter_batches_strict_mode_accepts_whole_batches():
    buf = stamp(GOOD, 0, 0) + stamp(GOOD, 3, 0)
    assert [h.base_offset for h, _ in iter_batches(buf, allow_partial_tail=False)] == [0, 3]
    assert list(iter_batches(b"")) == []


def test_iter_batches_refuses_a_length_below_minimum_even_when_lenient():
    buf = GOOD + patch_header(GOOD, batch_length=10)
    with pytest.raises(CorruptRecordError, match="below minimum"):
        list(iter_batches(buf))


@pytest.mark.parametrize("accelerated", [True, False], ids=["c", "python"])
@pytest.mark.parametrize("tail_bytes", [0, 1, fmt.HEADER_SIZE - 1, fmt.HEADER_SIZE,
                                        len(GOOD) - 1])
def test_scan_batches_sees_the_whole_batches_iter_batches_sees(
        accelerated, tail_bytes, monkeypatch):
    if not accelerated:
        monkeypatch.setattr(fmt, "_scan_batches", None)
    else:
        assert fmt._scan_batches is not None, "the C extension is built by make install"
    five = build_batch([(None, b"v%d" % i) for i in range(5)])
    whole = stamp(GOOD, 0, 0) + stamp(five, 3, 0)
    buf = whole + stamp(GOOD, 8, 0)[:tail_bytes]
    headers = [header for header, _ in iter_batches(buf)]
    assert fmt.scan_batches(buf) == (len(whole), 2, 8, headers[-1].next_offset) == (
        len(whole), len(headers), sum(h.record_count for h in headers), 8)
    assert fmt.scan_batches(memoryview(buf)) == fmt.scan_batches(buf)
    assert fmt.count_records(buf) == 8
    assert fmt.scan_batches(b"") == (0, 0, 0, -1)
    assert fmt.scan_batches(stamp(GOOD, 2**40, 0)) == (len(GOOD), 1, 3, 2**40 + 3)
    with pytest.raises(CorruptRecordError, match="below minimum"):
        fmt.scan_batches(GOOD + patch_header(GOOD, batch_length=10))


# ---------------------------------------------------------------------------
# BatchBuilder input checks and sizing.
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("kwargs", [
    dict(key="text", value=b"v"),
    dict(key=b"k", value="text"),
    dict(key=b"k", value=b"v", headers=[(b"bytes-key", b"v")]),
    dict(key=b"k", value=b"v", headers=[(1, b"v")]),
    dict(key=b"k", value=b"v", headers=[("h", "text")]),
    dict(key=5, value=b"v"),
], ids=["str-key", "str-value", "bytes-header-key", "int-header-key", "str-header-value",
        "int-key"])
def test_builder_rejects_wrong_types_without_changing(kwargs):
    builder = BatchBuilder()
    builder.append(b"ok", b"ok", timestamp_ms=T0)
    size = builder.size_bytes
    with pytest.raises(TypeError):
        builder.append(kwargs["key"], kwargs["value"], timestamp_ms=T0,
                       headers=kwargs.get("headers", ()))
    assert (builder.record_count, builder.size_bytes) == (1, size)
    assert len(list(iter_records(builder.build()))) == 1


def test_builder_refuses_unsupported_codecs_and_empty_batches():
    for codec in (Compression.SNAPPY, Compression.LZ4, Compression.ZSTD):
        with pytest.raises(UnsupportedCompressionTypeError):
            BatchBuilder(compression=codec)
    with pytest.raises(InvalidRecordError):
        BatchBuilder().build()


def test_append_without_timestamp_uses_the_clock():
    before = int(time.time() * 1000)
    builder = BatchBuilder()
    builder.append(b"k", b"v")
    after = int(time.time() * 1000)
    [record] = iter_records(builder.build())
    assert before <= record.timestamp <= after


def test_has_room_for_always_true_on_an_empty_builder():
    assert BatchBuilder().has_room_for(b"k", b"v" * 10_000, limit_bytes=0)


def test_has_room_for_refuses_once_the_limit_is_reached():
    builder = BatchBuilder()
    builder.append(b"k", b"v" * 100, timestamp_ms=T0)
    assert not builder.has_room_for(None, None, limit_bytes=builder.size_bytes)
    assert not builder.has_room_for(b"k", b"v" * 100, limit_bytes=builder.size_bytes + 100)
    assert builder.has_room_for(b"k", b"v" * 100, limit_bytes=builder.size_bytes + 200)


@pytest.mark.parametrize("key, value, headers", [
    (b"k", b"v" * 100, []),
    (None, None, []),
    (b"k" * 300, b"v" * 70_000, [("trace-id", b"x" * 40), ("n", None)]),
    (b"k", b"v", [("\u00e9" * 100, b"x")]),            # two UTF-8 bytes per character
    (b"k", b"v", [("\U0001f600" * 50, None)] * 3),      # four UTF-8 bytes per character
], ids=["plain", "nones", "large", "latin-header-key", "emoji-header-keys"])
def test_has_room_for_never_lets_a_batch_exceed_the_limit(key, value, headers):
    builder = BatchBuilder()
    builder.append(b"first", b"record", timestamp_ms=T0)
    # The tightest limit for which the builder says the record fits...
    limit = next(n for n in range(builder.size_bytes, builder.size_bytes + 200_000)
                 if builder.has_room_for(key, value, n, headers=headers))
    # ... must really hold it, whatever its timestamp delta.
    builder.append(key, value, timestamp_ms=T0 - 2**40, headers=headers)
    assert builder.size_bytes <= limit
    assert len(builder.build()) <= limit


# ---------------------------------------------------------------------------
# Property: arbitrary records round-trip exactly.
# ---------------------------------------------------------------------------
optional_bytes = st.none() | st.binary(max_size=64)
record_rows = st.lists(
    st.tuples(
        optional_bytes,
        optional_bytes,
        st.lists(st.tuples(st.text(max_size=12), st.none() | st.binary(max_size=16)),
                 max_size=3),
        # -1 is Kafka's NO_TIMESTAMP; otherwise any non-negative millisecond time.
        st.integers(min_value=-1, max_value=2**62),
    ),
    min_size=1, max_size=30,
)


@pytest.mark.parametrize("compression", [Compression.NONE, Compression.GZIP])
@settings(deadline=None, max_examples=150)
@given(rows=record_rows, base_offset=st.integers(0, 2**62), epoch=st.integers(0, 2**31 - 1))
def test_property_records_round_trip_exactly(compression, rows, base_offset, epoch):
    builder = BatchBuilder(compression=compression)
    for key, value, headers, ts in rows:
        builder.append(key, value, timestamp_ms=ts, headers=headers)
    raw = stamp(builder.build(), base_offset, epoch)

    [(_, header)] = validate_batches(raw)
    assert header.record_count == len(rows)
    assert header.base_timestamp == rows[0][3]
    assert header.max_timestamp == max(ts for *_, ts in rows)
    assert list(iter_records(raw)) == [
        Record(base_offset + i, ts, key, value, tuple(tuple(h) for h in headers))
        for i, (key, value, headers, ts) in enumerate(rows)
    ]
