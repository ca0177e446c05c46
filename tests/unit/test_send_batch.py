"""Producer.send_batch's planning (api.client.bulk): rows to partitions as
``send`` places them, order kept, batches within batch_size, every record
encoded exactly as the per-record path encodes it."""

import pyarrow as pa
import pytest

from api.client.bulk import BulkRecords, plan
from protocol.partitioner import partition_for_key
from storage.batch import HEADER_SIZE, BatchBuilder, EncodedBatchBuilder, iter_records

KEYLESS = 7  # what the keyless chooser answers, to tell its batches apart


def batches(values, keys=None, partitions=4, partition=None, batch_size=1 << 20,
            partitioner=None):
    """[(partition, [(key, value), ...])] of every planned batch."""
    out = []
    for target, section, count in plan(BulkRecords(values, keys), partitions, partition,
                                       batch_size, lambda: KEYLESS, partitioner):
        assert isinstance(section, bytearray) and section[:HEADER_SIZE] == bytes(HEADER_SIZE)
        assert len(section) <= batch_size or count == 1
        built = bytes(EncodedBatchBuilder(section, count, 1000, header_room=True).build())
        rows = [(r.key, r.value) for r in iter_records(built)]
        assert len(rows) == count
        # The same bytes as the per-record path builds.
        builder = BatchBuilder()
        for key, value in rows:
            builder.append(key, value, timestamp_ms=1000)
        assert builder.build() == built
        out.append((target, rows))
    return out


def test_keyed_rows_go_where_send_puts_them_in_order():
    keys = [b"k%d" % (i % 50) for i in range(1000)]
    values = [b"v%d" % i for i in range(1000)]
    planned = batches(values, keys, partitions=5)
    seen = []
    for target, rows in planned:
        for key, value in rows:
            assert target == partition_for_key(key, 5)
            seen.append(value)
    assert sorted(seen) == sorted(values)
    for target in range(5):  # each partition's records in the order given
        mine = [v for t, rows in planned if t == target for _, v in rows]
        assert mine == [v for k, v in zip(keys, values) if partition_for_key(k, 5) == target]


def test_keyless_rows_stay_contiguous_and_fill_batches_up_to_batch_size():
    values = [bytes([i % 256]) * 100 for i in range(3000)]
    planned = batches(values, batch_size=16384)
    assert all(target == KEYLESS for target, _ in planned)
    assert [v for _, rows in planned for _, v in rows] == values
    assert len(planned) > 10  # cut, and each batch as full as batch_size allows
    sizes = [len(rows) for _, rows in planned]
    assert min(sizes[:-1]) > 100


def test_an_explicit_partition_takes_everything_and_a_huge_record_goes_alone():
    values = [b"a" * 10, b"b" * 5000, b"c" * 10]
    planned = batches(values, partition=2, batch_size=1024)
    assert [t for t, _ in planned] == [2, 2, 2]
    assert [v for _, rows in planned for _, v in rows] == values


def test_nulls_and_str_and_arrow_arrays():
    planned = batches(["é", None, b"x"], [None, "k", None], partitions=8)
    rows = {v: (t, k) for t, rs in planned for k, v in rs}
    assert rows["é".encode()] == (KEYLESS, None) and rows[b"x"] == (KEYLESS, None)
    assert rows[None] == (partition_for_key(b"k", 8), b"k")
    arrow = pa.array([b"p", None, b"q", b"r"]).slice(1)  # an offset into the buffers
    planned = batches(arrow, pa.chunked_array([["x", "y"], [None]]), partitions=8)
    got = sorted((v or b"", k or b"") for _, rs in planned for k, v in rs)
    assert got == [(b"", b"x"), (b"q", b"y"), (b"r", b"")]


def test_null_keys_among_keyed_ones_keep_their_place_in_the_partition():
    target = partition_for_key(b"k", 8)
    planned = []
    for where, section, count in plan(BulkRecords([b"v0", b"v1", b"v2", b"v3"],
                                                  [None, b"k", None, b"k"]),
                                      8, None, 1 << 20, lambda: target):
        built = bytes(EncodedBatchBuilder(section, count, 1000, header_room=True).build())
        planned += [(where, r.value) for r in iter_records(built)]
    assert planned == [(target, b"v0"), (target, b"v1"), (target, b"v2"), (target, b"v3")]


def test_many_keyed_rows_are_placed_a_chunk_at_a_time_in_order(monkeypatch):
    import api.client.bulk as bulk

    monkeypatch.setattr(bulk, "CHUNK_ROWS", 7)
    keys = [b"k%d" % (i % 5) for i in range(100)]
    values = [b"v%d" % i for i in range(100)]
    planned = batches(values, keys, partitions=3)
    assert sorted(v for _, rows in planned for _, v in rows) == sorted(values)
    for target in range(3):
        mine = [v for t, rows in planned if t == target for _, v in rows]
        assert mine == [v for k, v in zip(keys, values) if partition_for_key(k, 3) == target]


def test_a_custom_partitioner_is_asked_per_record():
    planned = batches([b"1", b"2", b"3"], [b"a", None, b"c"], partitions=3,
                      partitioner=lambda key, n: 0 if key is None else n - 1)
    assert {v: t for t, rs in planned for _, v in rs} == {b"1": 2, b"2": 0, b"3": 2}
    with pytest.raises(ValueError, match="partitioner chose 9"):
        batches([b"1"], partitions=3, partitioner=lambda key, n: 9)


@pytest.mark.parametrize("values, keys, message", [
    ([b"a", b"b"], [b"k"], "1 keys for 2 values"),
    ([b"a", 3], None, "value 1 is int"),
    (b"abc", None, "not one bytes or str value"),
    (pa.array([1, 2]), None, "Arrow column of int64"),
])
def test_bad_columns_are_refused_with_what_to_give(values, keys, message):
    with pytest.raises((TypeError, ValueError), match=message):
        BulkRecords(values, keys)


def test_nothing_to_send_plans_nothing():
    assert batches([]) == []
    assert batches(pa.array([], pa.binary())) == []
    assert batches(pa.array([], pa.string()), pa.array([], pa.string())) == []


def test_any_buffer_is_its_bytes_whatever_its_item_size():
    from array import array

    planned = batches([array("i", [1, 2]), memoryview(b"ab")], partition=0)
    assert [v for _, rows in planned for _, v in rows] == [array("i", [1, 2]).tobytes(), b"ab"]
