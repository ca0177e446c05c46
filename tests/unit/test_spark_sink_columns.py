"""The Spark sink's columnar path (``_send_columns``): rows to Kafka's
partitions for whole columns, grouped, cut into batches under batch.size,
encoded exactly as the per-record producer would, with a producer that
records what it is handed."""

from __future__ import annotations

from array import array

import pyarrow as pa
import pytest

from protocol import columns
from protocol.partitioner import partition_for_key
from spark_source.sink import SinkWriteError, _send_columns


class RecordingProducer:
    def __init__(self):
        self.sent = []  # (topic, partition, [(key, value)])
        self.sizes = []  # of each batch as built

    def send_encoded(self, topic, partition, section, count, timestamp_ms, on_delivery,
                     header_room=False):
        if header_room:  # room for the batch header, zeroed, before the records
            assert section[:columns.BATCH_HEADER_BYTES] == bytes(columns.BATCH_HEADER_BYTES)
            section = bytes(section[columns.BATCH_HEADER_BYTES:])
        self.sizes.append(len(section) + columns.BATCH_HEADER_BYTES)
        cols = columns.decode(section, count)
        assert list(array("q", cols.offsets)) == list(range(count))

        def values(offsets, data, validity):
            o = array("i", offsets)
            return [None if validity is not None and not validity[i >> 3] >> (i & 7) & 1
                    else data[o[i]:o[i + 1]] for i in range(count)]
        pairs = list(zip(values(cols.key_offsets, cols.key_data, cols.key_validity),
                         values(cols.value_offsets, cols.value_data, cols.value_validity)))
        self.sent.append((topic, partition, pairs))


def send(batch, topic_option="t", counts=None, batch_size=1 << 20, producer=None):
    producer = producer or RecordingProducer()
    index = {name: i for i, name in enumerate(batch.schema.names)}
    topics = ({topic_option} if topic_option is not None
              else set(batch.column(index["topic"]).to_pylist()))
    _send_columns(producer, batch, index, topic_option, topics, counts or {"t": 4}, None,
                  batch_size)
    return producer.sent


def test_keyed_rows_land_in_kafkas_partition_in_their_order():
    keys = [b"k%d" % i for i in range(200)]
    batch = pa.record_batch({"key": pa.array(keys, pa.binary()),
                             "value": pa.array([b"v%d" % i for i in range(200)], pa.binary())})
    sent = send(batch)
    got = {(p, k): v for _, p, pairs in sent for k, v in pairs}
    assert len(got) == 200
    for i, key in enumerate(keys):
        assert got[(partition_for_key(key, 4), key)] == b"v%d" % i
    for _, _, pairs in sent:  # each partition's rows keep the input order
        numbers = [int(k[1:]) for k, _ in pairs]
        assert numbers == sorted(numbers)


def test_strings_nulls_an_explicit_partition_and_keyless_rows():
    batch = pa.record_batch({
        "key": pa.array(["a", None, "c", None], pa.string()),
        "value": pa.array(["1", "2", None, "4"], pa.string()),
        "partition": pa.array([None, 3, 0, None], pa.int32())})
    sent = send(batch)
    placed = {v: (p, k) for _, p, pairs in sent for k, v in pairs}
    assert placed[b"1"] == (partition_for_key(b"a", 4), b"a")  # null partition: the key decides
    assert placed[b"2"] == (3, None)  # the column decides
    assert placed[None] == (0, b"c")  # a null value (a tombstone) stays null
    assert placed[b"4"][1] is None and 0 <= placed[b"4"][0] < 4  # keyless: a sticky partition


@pytest.mark.parametrize("value_bytes, rows, batch_size", [
    (1000, 100, 10_000), (600_000, 12, 1 << 20), (300_000, 12, 1 << 20), (7, 5000, 4096)])
def test_rows_are_cut_into_batches_within_batch_size(value_bytes, rows, batch_size):
    batch = pa.record_batch({"value": pa.array([b"x" * value_bytes] * rows, pa.binary()),
                             "partition": pa.array([1] * rows, pa.int32())})
    producer = RecordingProducer()
    sent = send(batch, batch_size=batch_size, producer=producer)
    assert sum(len(pairs) for _, _, pairs in sent) == rows
    assert all(p == 1 for _, p, _ in sent)
    assert max(producer.sizes) <= batch_size  # the batch as built, header included
    assert sum(producer.sizes) > batch_size * (len(sent) - 1) / 2  # and not cut needlessly


def test_a_row_larger_than_a_batch_goes_alone():
    batch = pa.record_batch({"value": pa.array([b"s", b"x" * 5000, b"t"], pa.binary()),
                             "partition": pa.array([0, 0, 0], pa.int32())})
    sent = send(batch, batch_size=1000)
    assert [[v for _, v in pairs] for _, _, pairs in sent] == [[b"s"], [b"x" * 5000], [b"t"]]


def test_rows_go_to_the_topic_column_s_topics():
    batch = pa.record_batch({"topic": pa.array(["a", "b", "a"]),
                             "key": pa.array([b"1", b"2", b"3"], pa.binary()),
                             "value": pa.array([b"x", b"y", b"z"], pa.binary())})
    sent = send(batch, topic_option=None, counts={"a": 2, "b": 5})
    by_topic = {}
    for topic, partition, pairs in sent:
        by_topic.setdefault(topic, []).extend(pairs)
        assert partition < {"a": 2, "b": 5}[topic]
    assert sorted(by_topic["a"]) == [(b"1", b"x"), (b"3", b"z")]
    assert by_topic["b"] == [(b"2", b"y")]


@pytest.mark.parametrize("partition", [4, -1])
def test_a_partition_the_topic_does_not_have_is_refused(partition):
    batch = pa.record_batch({"value": pa.array([b"x", b"y"], pa.binary()),
                             "partition": pa.array([None, partition], pa.int32())})
    with pytest.raises(SinkWriteError,
                       match=f"partition {partition} is not a partition of topic 't'"):
        send(batch)


def test_a_sliced_arrow_batch_sends_only_its_rows():
    whole = pa.record_batch({"key": pa.array([b"a", None, b"c", b"d"], pa.binary()),
                             "value": pa.array([b"1", b"2", b"3", b"4"], pa.binary())})
    sent = send(whole.slice(1, 2))
    assert sorted(v for _, _, pairs in sent for _, v in pairs) == [b"2", b"3"]
    assert {k for _, _, pairs in sent for k, _ in pairs} == {None, b"c"}


def test_spark_batches_are_joined_in_order_until_they_hold_enough_bytes():
    from spark_source.sink import _coalesced

    def batch(start: int, count: int) -> pa.RecordBatch:
        return pa.RecordBatch.from_pydict({
            "key": [b"k%d" % i for i in range(start, start + count)],
            "value": [b"v" * 100 for _ in range(count)]})

    given = [batch(0, 10), batch(10, 0), batch(10, 30), batch(40, 5), batch(45, 50),
             batch(95, 1)]
    wanted = 40 * given[0].nbytes // 10  # about 40 rows' worth
    joined = list(_coalesced(iter(given), wanted))
    rows = [k for b in joined for k in b.column(0).to_pylist()]
    assert rows == [b"k%d" % i for i in range(96)]  # every row, in order, once
    assert [b.num_rows for b in joined] == [40, 55, 1]  # the last holds what is left
    assert all(b.nbytes >= wanted for b in joined[:-1])
    assert joined[0].schema == given[0].schema
    (alone,) = _coalesced(iter([given[3]]), wanted)
    assert alone is given[3]  # a lone batch goes as it is, not copied
