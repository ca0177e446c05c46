"""The client's partitioner agrees with Kafka's: murmur2 test vectors from
Kafka's UtilsTest.testMurmur2, the positive-modulo mapping, and sticky
placement of keyless records."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from protocol.partitioner import StickyPartitioner, murmur2, partition_for_key

# Kafka's own vectors (clients/.../common/utils/UtilsTest.java, testMurmur2).
KAFKA_VECTORS = [
    (b"21", -973932308),
    (b"foobar", -790332482),
    (b"a-little-bit-long-string", -985981536),
    (b"a-little-bit-longer-string", -1486304829),
    (b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8", -58897971),
    (b"abc", 479470107),
]


@pytest.mark.parametrize("data, expected", KAFKA_VECTORS, ids=lambda v: repr(v)[:20])
def test_murmur2_matches_kafkas_vectors(data, expected):
    assert murmur2(data) == expected


def test_every_tail_length_is_hashed_and_changes_the_hash():
    base = b"abcdefgh"
    hashes = {murmur2(base + b"x" * tail) for tail in range(4)}
    assert len(hashes) == 4


@given(st.binary(max_size=64), st.integers(min_value=1, max_value=10_000))
def test_keys_map_to_a_partition_in_range_by_positive_modulo(key, partitions):
    p = partition_for_key(key, partitions)
    assert 0 <= p < partitions
    assert p == (murmur2(key) & 0x7FFFFFFF) % partitions
    assert -(2**31) <= murmur2(key) < 2**31


def test_a_key_goes_where_kafka_would_put_it():
    # murmur2("foobar") = -790332482; & 0x7fffffff = 1357151166 = 7 * 193878738
    assert partition_for_key(b"foobar", 7) == 0
    assert partition_for_key(b"foobar", 10) == 6
    with pytest.raises(ValueError):
        partition_for_key(b"k", 0)


def test_keyless_records_stick_until_their_batch_closes_then_move():
    choices = iter([2, 0, 2])
    partitioner = StickyPartitioner(choose=lambda n: next(choices))
    assert [partitioner.partition_for("t", None, 4) for _ in range(3)] == [2, 2, 2]
    partitioner.on_batch_closed("t", 1, 4)  # not the sticky one: no move
    assert partitioner.partition_for("t", None, 4) == 2
    partitioner.on_batch_closed("t", 2, 4)  # choose(3) -> 0, below 2: partition 0
    assert partitioner.partition_for("t", None, 4) == 0
    partitioner.on_batch_closed("t", 0, 4)  # choose(3) -> 2, at/after 0: partition 3
    assert partitioner.partition_for("t", None, 4) == 3
    assert partitioner.partition_for("t", b"foobar", 10) == 6  # keys ignore stickiness


def test_sticky_partition_is_rechosen_when_the_topic_shrinks_out_of_range():
    partitioner = StickyPartitioner(choose=lambda n: n - 1)
    assert partitioner.partition_for("t", None, 8) == 7
    assert partitioner.partition_for("t", None, 4) == 3
    partitioner.on_batch_closed("t", 0, 1)
    assert partitioner.partition_for("t", None, 1) == 0
