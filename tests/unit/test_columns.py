"""protocol.columns: records sections to and from columns, the C extension
and the pure-Python equivalent agreeing with each other and with
storage.batch (the one definition of the format)."""

from __future__ import annotations

from array import array

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol.partitioner import murmur2 as murmur2_one
from storage import batch as batch_format
from tests.helpers import batch_and_section as section_of
from protocol import columns


def test_the_c_extension_is_built_by_the_install():
    # make test installs with a C compiler on this machine: the fast path
    # must be the one measured and shipped.
    assert columns.ACCELERATED


payloads = st.one_of(st.none(), st.binary(max_size=300))
headers = st.lists(st.tuples(st.text(max_size=8), st.one_of(st.none(), st.binary(max_size=20))),
                   max_size=3)
records = st.lists(st.tuples(payloads, payloads, headers,
                             st.integers(-2**40, 2**40)), min_size=1, max_size=60)


def py_decode(section, count):
    """The pure-Python decoder, called as ``columns.decode`` is."""
    return columns._py_decode([(section, count, 0, 0, columns._NO_LAST_DELTA)])


def as_rows(cols: columns.Columns, count: int) -> list:
    """Columns back to (ts_delta, offset_delta, key, value, headers) rows."""
    def binary(offsets, data, validity):
        o = array("i", offsets)
        return [None if validity is not None and not validity[i >> 3] >> (i & 7) & 1
                else data[o[i]:o[i + 1]] for i in range(count)]
    keys = binary(cols.key_offsets, cols.key_data, cols.key_validity)
    values = binary(cols.value_offsets, cols.value_data, cols.value_validity)
    hdrs = cols.headers or [None] * count
    return list(zip(array("q", cols.timestamps), array("q", cols.offsets), keys,
                    values, [tuple(h) if h else () for h in hdrs]))


@settings(max_examples=200, deadline=None)
@given(records)
def test_decode_gives_what_iter_records_gives(recs):
    built, section = section_of(recs)
    header = batch_format.parse_header(built)
    expected = [(r.timestamp - header.base_timestamp, r.offset, r.key, r.value,
                 tuple(tuple(h) for h in r.headers))
                for r in batch_format.iter_records(built)]
    fast = columns.decode(section, len(recs))
    slow = py_decode(section, len(recs))
    assert as_rows(fast, len(recs)) == expected == as_rows(slow, len(recs))
    assert fast == slow


@settings(max_examples=300, deadline=None)
@given(records, st.data())
def test_malformed_sections_raise_value_error_in_both(recs, data):
    _, section = section_of(recs)
    cut = data.draw(st.integers(0, len(section)))
    flip = data.draw(st.integers(0, 255))
    where = data.draw(st.integers(0, max(len(section) - 1, 0)))
    mangled = bytearray(section[:cut])
    if mangled and where < len(mangled):
        mangled[where] ^= flip
    count = data.draw(st.sampled_from([len(recs), len(recs) + 1, max(len(recs) - 1, 0)]))
    outcomes = []
    for decode in (columns.decode, py_decode):
        try:
            outcomes.append(("ok", decode(bytes(mangled), count)))
        except ValueError:
            outcomes.append(("error", None))
    # Both refuse, or both decode it the same (a flip can leave valid msgpack).
    assert outcomes[0][0] == outcomes[1][0]
    if outcomes[0][0] == "ok":
        assert as_rows(outcomes[0][1], count) == as_rows(outcomes[1][1], count)


def test_odd_but_valid_msgpack_decodes_or_is_refused_cleanly():
    # A str key (never written by our clients) is refused, not misread.
    odd = msgpack.packb([0, 0, "text", b"v", []], use_bin_type=True)
    for decode in (columns.decode, py_decode):
        with pytest.raises(ValueError):
            decode(odd, 1)
    # Every integer width for the deltas.
    wide = b"".join(msgpack.packb([td, od, None, b"", []], use_bin_type=True)
                    for td, od in [(-1, 0), (-200, 1), (-40000, 2), (-2**40, 3), (2**63 - 1, 4),
                                   (255, 70000), (65536, 2**33)])
    fast, slow = columns.decode(wide, 7), py_decode(wide, 7)
    assert fast == slow
    assert list(array("q", fast.timestamps)) == [-1, -200, -40000, -2**40, 2**63 - 1,
                                                         255, 65536]


def column_of(items: list) -> columns.BinaryColumn:
    offsets, data, nulls = array("i", [0]), bytearray(), []
    for i, item in enumerate(items):
        if item is None:
            nulls.append(i)
        else:
            data += item
        offsets.append(len(data))
    return columns.BinaryColumn(offsets.tobytes(), bytes(data),
                                columns._bitmap(nulls, len(items)))


# A value past 64 KiB (its length takes three varint bytes), made cheaply:
# hypothesis drawing 70,000 random bytes per example took most of this test's time.
_LARGE = st.tuples(st.integers(0, 255), st.integers(70000, 70001)).map(
    lambda fill: bytes([fill[0]]) * fill[1])


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(payloads, st.one_of(payloads, _LARGE)),
                min_size=1, max_size=40), st.data())
def test_encode_packs_exactly_as_the_batch_builder(pairs, data):
    keys = column_of([k for k, _ in pairs])
    values = column_of([v for _, v in pairs])
    rows = data.draw(st.lists(st.integers(0, len(pairs) - 1), max_size=50))
    builder = batch_format.BatchBuilder()
    for row in rows:
        builder.append(pairs[row][0], pairs[row][1], timestamp_ms=1000)
    expected = b"".join(builder._chunks)
    wanted = array("q", rows).tobytes()
    assert columns.encode(keys, values, wanted) == expected
    assert columns._py_encode(keys, values, wanted) == expected
    roomy = columns.encode(keys, values, wanted, columns.BATCH_HEADER_BYTES)
    assert isinstance(roomy, bytearray)
    assert roomy == bytes(columns.BATCH_HEADER_BYTES) + expected


def test_encode_refuses_rows_out_of_range_and_bad_offsets():
    keys = column_of([b"a", b"b"])
    with pytest.raises(IndexError):
        columns.encode(keys, keys, array("q", [2]).tobytes())
    backwards = columns.BinaryColumn(array("i", [0, 2, 1]).tobytes(), b"ab", None)
    with pytest.raises(ValueError):
        columns.encode(backwards, backwards, array("q", [0]).tobytes())


@settings(max_examples=200, deadline=None)
@given(st.lists(payloads, min_size=1, max_size=50))
def test_murmur2_matches_the_partitioner(keys):
    column = column_of(keys)
    expected = [-1 if k is None else murmur2_one(k) & 0x7FFFFFFF for k in keys]
    assert list(array("i", columns.murmur2(column))) == expected
    assert list(array("i", columns._py_murmur2(column))) == expected


def test_murmur2_of_kafkas_own_test_vectors():
    # Kafka's UtilsTest.testMurmur2 inputs and outputs (signed, before the mask).
    vectors = {b"21": -973932308, b"foobar": -790332482, b"a-little-bit-long-string":
               -985981536, b"a-little-bit-longer-string": -1486304829,
               b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8": -58897971,
               bytes([ord("a"), ord("b"), ord("c")]): 479470107}
    column = column_of(list(vectors))
    assert list(array("i", columns.murmur2(column))) == [v & 0x7FFFFFFF
                                                          for v in vectors.values()]


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(records, st.integers(0, 2**40), st.booleans()), min_size=1,
                max_size=4))
def test_decode_batches_joins_stored_batches_with_absolute_offsets(specs):
    from storage.batch import Compression, parse_header, stamped_prefix

    stored, expected = [], []
    for recs, base, gzip in specs:
        builder = batch_format.BatchBuilder(
            compression=Compression.GZIP if gzip else Compression.NONE)
        for key, value, hdrs, ts in recs:
            builder.append(key, value, timestamp_ms=ts, headers=hdrs)
        data = bytearray(builder.build())
        data[:16] = stamped_prefix(parse_header(data), base, 0)
        view = memoryview(bytes(data))
        stored.append((view, parse_header(view)))
        expected += [(r.timestamp, r.offset, r.key, r.value, tuple(tuple(h) for h in r.headers))
                     for r in batch_format.iter_records(view)]
    joined = columns.decode_batches(stored)
    assert joined.counts == [len(recs) for recs, _, _ in specs]
    assert as_rows(joined.columns, len(expected)) == expected
    slow = columns._py_decode([(batch_format.decompress(
        h.compression, v[batch_format.HEADER_SIZE:h.size_bytes], 1 << 30), h.record_count,
        h.base_offset, h.base_timestamp, h.last_offset_delta) for v, h in stored])
    assert slow == joined.columns


def test_decode_batches_refuses_offset_deltas_past_the_header():
    from storage.batch import parse_header

    built, section = section_of([(b"k", b"v", [], 0), (b"k", b"w", [], 0)])
    header = parse_header(built)._replace(last_offset_delta=0)
    for decode in (lambda: columns.decode_batches([(memoryview(built), header)]),
                   lambda: columns._py_decode([(section, 2, 0, 0, 0)])):
        with pytest.raises(ValueError):
            decode()


def test_odd_deltas_and_headers_decode_alike_in_both():
    packed = [
        b"\x95\xc3\x00\xc0\xc0\x90",  # a bool for a timestamp delta
        b"\x95\xcf\x80\x00\x00\x00\x00\x00\x00\x00\x00\xc0\xc0\x90",  # a delta of 2**63
    ]
    for section in packed:
        for decode in (columns.decode, py_decode):
            with pytest.raises(ValueError):
                decode(section, 1)
    empty_long_headers = b"\x95\x00\x00\xc0\xc0\xdc\x00\x00"  # [] as array16
    assert columns.decode(empty_long_headers, 1) == py_decode(empty_long_headers, 1)
    assert columns.decode(empty_long_headers, 1).headers is None


@settings(max_examples=100, deadline=None)
@given(st.lists(payloads, min_size=1, max_size=30), st.integers(0, 15), st.data())
def test_columns_at_a_bit_offset_encode_and_hash_as_their_rows(items, skip, data):
    # Arrow slices keep their parent's buffers: offsets start past 0, and the
    # validity bitmap at a bit offset.
    whole = column_of([b"pad"] * skip + items)
    offsets = array("i", whole.offsets)[skip:]
    sliced = columns.BinaryColumn(offsets.tobytes(), whole.data, whole.validity, skip)
    expected = column_of(items)
    rows = array("q", data.draw(st.lists(st.integers(0, len(items) - 1), max_size=20)))
    for encode in (columns.encode, columns._py_encode):
        assert encode(sliced, sliced, rows.tobytes()) == encode(expected, expected,
                                                                  rows.tobytes())
    for murmur2 in (columns.murmur2, columns._py_murmur2):
        assert murmur2(sliced) == murmur2(expected)


def test_the_python_encoder_refuses_rows_out_of_range_too():
    keys = column_of([b"a", b"b"])
    for row in (2, -1):
        with pytest.raises(IndexError):
            columns._py_encode(keys, keys, array("q", [row]).tobytes())
