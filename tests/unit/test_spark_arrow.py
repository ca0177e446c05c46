"""The Spark reader's columnar path (``batch_to_arrow``: a stored batch to
an Arrow RecordBatch through ``protocol.columns``) gives exactly the rows
the consumer's record-by-record decoder gives."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from api.client import TopicPartition
from api.client.fetcher import FetchedBatch, decode_batch
from spark_source.reader import _to_arrow, arrow_schema, batches_to_arrow
from storage.batch import (TIMESTAMP_TYPE_BIT, BatchBuilder, Compression, parse_header,
                           stamped_prefix)

TP = TopicPartition("orders", 3)

records = st.lists(st.tuples(
    st.one_of(st.none(), st.binary(max_size=30)), st.one_of(st.none(), st.binary(max_size=300)),
    st.integers(min_value=0, max_value=10**6),
    st.lists(st.tuples(st.text(max_size=5), st.one_of(st.none(), st.binary(max_size=5))),
             max_size=2)), min_size=1, max_size=40)


def stored(recs, base_offset, compression, log_append_time=False) -> bytes:
    builder = BatchBuilder(compression=compression)
    for key, value, ts, headers in recs:
        builder.append(key, value, timestamp_ms=1_700_000_000_000 + ts, headers=headers)
    data = bytearray(builder.build())
    if log_append_time:  # as a topic with LogAppendTime stores it
        data = bytearray(_with_attribute(bytes(data), TIMESTAMP_TYPE_BIT))
    data[:16] = stamped_prefix(parse_header(data), base_offset, 0)
    return bytes(data)


def _with_attribute(batch: bytes, bit: int) -> bytes:
    import struct

    from storage.batch import ATTRIBUTES_OFFSET, CRC_OFFSET, compute_crc
    data = bytearray(batch)
    (attributes,) = struct.unpack_from(">h", data, ATTRIBUTES_OFFSET)
    struct.pack_into(">h", data, ATTRIBUTES_OFFSET, attributes | bit)
    struct.pack_into(">I", data, CRC_OFFSET, compute_crc(data, 0, len(data)))
    return bytes(data)


@settings(max_examples=120, deadline=None)
@given(st.lists(st.tuples(records, st.sampled_from([Compression.NONE, Compression.GZIP]),
                          st.booleans()), min_size=1, max_size=3),
       st.integers(0, 2**40), st.booleans(), st.data())
def test_batches_to_arrow_equals_the_record_by_record_path(specs, base, headers, data):
    fetched, everything = [], []
    next_offset = base
    for recs, compression, log_append in specs:
        raw = memoryview(stored(recs, next_offset, compression, log_append))
        fetched.append(FetchedBatch(TP, parse_header(raw), raw, next_offset))
        everything += decode_batch(TP.topic, TP.partition, raw, include_headers=headers)
        next_offset += len(recs)
    position = base + data.draw(st.integers(0, len(everything)))
    until = base + data.draw(st.integers(0, len(everything) + 2))
    fetched[0] = fetched[0]._replace(position=position)
    fetched = [f._replace(position=max(f.position, position)) for f in fetched]
    schema = arrow_schema(headers)
    got = batches_to_arrow(fetched, schema, until, headers)
    wanted = [r for r in everything if position <= r.offset < until]
    assert got.schema == schema
    if not wanted:
        assert got.num_rows == 0
        return
    assert got.to_pylist() == _to_arrow(wanted, headers, schema).to_pylist()


def test_a_corrupt_batch_among_good_ones_is_reported_by_the_general_decoder():
    import pytest

    from api.client import CorruptRecordError
    from storage.batch import HEADER_SIZE

    good = memoryview(stored([(b"k", b"v", 0, [])], 0, Compression.NONE))
    bad = bytearray(stored([(b"k", b"v", 0, [])], 1, Compression.NONE))
    assert bad[HEADER_SIZE] == 0x95  # the record's 5-element array
    bad[HEADER_SIZE] = 0x94  # now 4 elements: no decoder takes it (the CRC is not checked here)
    bad_view = memoryview(bytes(bad))
    fetched = [FetchedBatch(TP, parse_header(good), good, 0),
               FetchedBatch(TP, parse_header(bad_view), bad_view, 1)]
    with pytest.raises(CorruptRecordError, match="orders-3"):
        batches_to_arrow(fetched, arrow_schema(False), 10, False)
