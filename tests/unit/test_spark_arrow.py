"""The Spark reader's columnar path (``batch_to_arrow``: a stored batch to
an Arrow RecordBatch through ``protocol.columns``) gives exactly the rows
the consumer's record-by-record decoder gives."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from api.client import TopicPartition
from api.client.fetcher import FetchedBatch, decode_batch
from spark_source.reader import _to_arrow, arrow_schema, batch_to_arrow
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
@given(records, st.sampled_from([Compression.NONE, Compression.GZIP]),
       st.integers(0, 2**40), st.booleans(), st.booleans(), st.data())
def test_batch_to_arrow_equals_the_record_by_record_path(recs, compression, base, headers,
                                                          log_append, data):
    raw = stored(recs, base, compression, log_append)
    position = base + data.draw(st.integers(0, len(recs)))
    until = base + data.draw(st.integers(0, len(recs) + 2))
    schema = arrow_schema(headers)
    view = memoryview(raw)
    fetched = FetchedBatch(TP, parse_header(view), view, position)
    got = batch_to_arrow(fetched, schema, until, headers)
    wanted = [r for r in decode_batch(TP.topic, TP.partition, view, include_headers=headers)
              if position <= r.offset < until]
    assert got.schema == schema
    if not wanted:
        assert got.num_rows == 0
        return
    assert got.to_pylist() == _to_arrow(wanted, headers, schema).to_pylist()
