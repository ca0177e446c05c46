"""Where a group lives: partition ``abs(hash(group)) % N`` of
``__consumer_offsets`` with Java's String.hashCode, as Kafka places it, so a
group lands on the same partition number in both systems."""

from api.broker.groups.service import java_string_hash, partition_for


def test_java_string_hash_matches_java():
    # Values of "…".hashCode() in Java.
    assert java_string_hash("") == 0
    assert java_string_hash("hello") == 99162322
    assert java_string_hash("polygenelubricants") == -(2**31)  # Integer.MIN_VALUE
    # UTF-16 code units, the surrogate pair included: (233 * 31 + 0xD83D) * 31 + 0xDE42
    assert java_string_hash("é🙂") == 1996878


def test_partition_for_uses_kafkas_abs_of_the_hash():
    assert partition_for("polygenelubricants", 50) == 0  # Utils.abs(MIN_VALUE) == 0
    assert partition_for("hello", 50) == 99162322 % 50
    assert {partition_for(f"group-{i}", 10) for i in range(200)} == set(range(10))
