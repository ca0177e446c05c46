"""Worked examples for the Spark source's offset arithmetic (spark_source.planning).

``limit_offsets``: exactly ``min(max_records, waiting)`` records in all,
never past ``latest`` nor behind ``start``, partitions missing from
``start`` starting at 0, shares in proportion with exact numbers, and
partitions whose share is below one getting one while the limit allows.
``split_ranges``: empty ranges dropped, sorted order, ``min_partitions``
cutting the larger ranges into near-equal contiguous pieces (and nothing
when there are enough ranges already), the ``max_records_per_partition``
cap, and both together; at least ``min_partitions`` pieces where per-range
rounding alone would give fewer. ``hold_back_batch`` and
``offsets_waiting``: minOffsetsPerTrigger/maxTriggerDelay, Spark's rule,
including a trigger sequence replayed against the clock.
"""

from __future__ import annotations

import pytest

from spark_source.planning import (OffsetRange, hold_back_batch, limit_offsets,
                                   offsets_waiting, split_ranges)


def tps(**sizes: int) -> dict[tuple[str, int], int]:
    """``a=5`` -> {("a", 0): 5}: one partition per topic name, for brevity."""
    return {(topic, 0): n for topic, n in sizes.items()}


def grants(start, latest, max_records) -> dict[str, int]:
    ends = limit_offsets(start, latest, max_records)
    return {topic: ends[(topic, p)] - start.get((topic, p), 0) for topic, p in ends}


def r(partition: int, begin: int, end: int, topic: str = "t") -> OffsetRange:
    return OffsetRange(topic, partition, begin, end)


def sizes(ranges: list[OffsetRange]) -> list[int]:
    return [x.size for x in ranges]


def covers(pieces: list[OffsetRange], whole: OffsetRange) -> bool:
    """``pieces`` of ``whole``'s partition are contiguous and tile it exactly."""
    own = [p for p in pieces if (p.topic, p.partition) == (whole.topic, whole.partition)]
    return (own[0].from_offset == whole.from_offset
            and own[-1].until_offset == whole.until_offset
            and all(a.until_offset == b.from_offset for a, b in zip(own, own[1:])))


# -- OffsetRange -------------------------------------------------------------


def test_offset_range_size():
    assert r(0, 3, 10).size == 7
    assert r(0, 4, 4).size == 0


# -- limit_offsets -----------------------------------------------------------


def test_everything_fits_reads_up_to_latest():
    start, latest = tps(a=2, b=0), tps(a=10, b=5)
    assert limit_offsets(start, latest, 13) == latest
    assert limit_offsets(start, latest, 1000) == latest


def test_result_is_a_copy():
    latest = tps(a=3)
    ends = limit_offsets({}, latest, 10)
    ends[("a", 0)] = 99
    assert latest == tps(a=3)


def test_proportional_exact_split():
    assert grants({}, tps(a=60, b=40), 10) == {"a": 6, "b": 4}


def test_rounding_leftover_goes_to_the_largest_fraction():
    # shares 3.5, 2.1, 1.4 -> floors 3, 2, 1 and one left for a (0.5)
    assert grants({}, tps(a=50, b=30, c=20), 7) == {"a": 4, "b": 2, "c": 1}


def test_leftover_goes_by_fraction_not_by_backlog():
    # shares 20/9 = 2.22, 15/9 = 1.67, 10/9 = 1.11: floors 2, 1, 1 = 4 and
    # the one left goes to b (fraction 0.67), not to a (the largest backlog)
    assert grants({}, tps(a=4, b=3, c=2), 5) == {"a": 2, "b": 2, "c": 1}


def test_ties_in_fractions_are_broken_by_partition():
    assert grants({}, tps(a=1, b=1, c=1), 2) == {"a": 1, "b": 1, "c": 0}
    assert grants({}, tps(x=5, y=5), 3) == {"x": 2, "y": 1}


def test_offsets_advance_from_start():
    start = {("a", 0): 100, ("b", 0): 40}
    ends = limit_offsets(start, {("a", 0): 160, ("b", 0): 80}, 10)
    assert ends == {("a", 0): 106, ("b", 0): 44}


def test_partition_missing_from_start_starts_at_zero():
    start = {("a", 0): 3}
    ends = limit_offsets(start, {("a", 0): 5, ("b", 0): 10}, 6)
    # waiting a=2, b=10: shares 1 and 5
    assert ends == {("a", 0): 4, ("b", 0): 5}


def test_partitions_with_nothing_waiting_stay_put():
    start = {("a", 0): 7, ("b", 0): 0}
    ends = limit_offsets(start, {("a", 0): 7, ("b", 0): 100}, 10)
    assert ends == {("a", 0): 7, ("b", 0): 10}


def test_never_beyond_latest_even_when_latest_is_behind_start():
    """A log truncated below the query's position (failOnDataLoss=false):
    the end is ``latest``, never more; the caller drops such ranges."""
    start = {("a", 0): 50, ("b", 0): 0}
    ends = limit_offsets(start, {("a", 0): 20, ("b", 0): 100}, 10)
    assert ends == {("a", 0): 20, ("b", 0): 10}


def test_result_has_exactly_the_partitions_of_latest():
    ends = limit_offsets({("gone", 0): 5, ("a", 0): 0}, {("a", 0): 10}, 3)
    assert ends == {("a", 0): 3}


def test_a_small_partition_gets_one_when_the_leftover_allows():
    # a: 1000/1001 * 10 = 9.99 -> 9; b: 0.0099 -> 0, gets the one left over
    assert grants({}, tps(a=1000, b=1), 10) == {"a": 9, "b": 1}


def test_small_partitions_get_one_largest_backlog_first():
    # shares: a 1.99, b 0.006, c 0.003 -> floors 1, 0, 0: one left, for b
    assert grants({}, tps(a=1000, b=3, c=1), 2) == {"a": 1, "b": 1, "c": 0}


def test_limit_of_one_moves_one_record():
    assert grants({}, tps(a=5, b=50, c=5), 1) == {"a": 0, "b": 1, "c": 0}


def test_total_is_exactly_the_limit():
    latest = {("t", p): n for p, n in enumerate([7, 1, 13, 2, 0, 40, 3])}
    for limit in range(1, sum(latest.values()) + 3):
        ends = limit_offsets({}, latest, limit)
        assert sum(ends.values()) == min(limit, sum(latest.values()))
        assert all(0 <= ends[tp] <= latest[tp] for tp in latest)


def test_every_partition_with_records_gets_one_when_the_limit_allows():
    got = grants({}, tps(a=1000, b=1, c=5), 10)
    assert sum(got.values()) == 10
    assert min(got.values()) >= 1


def test_larger_backlog_never_gets_less():
    # shares 8/9, 12/9, 16/9: proportional is a=1, b=1, c=2
    assert grants({}, tps(a=2, b=3, c=4), 4) == {"a": 1, "b": 1, "c": 2}


# -- split_ranges: ordering and empties --------------------------------------


def test_nothing_in_nothing_out():
    assert split_ranges([]) == []
    assert split_ranges([], min_partitions=4, max_records_per_partition=2) == []


def test_empty_and_backwards_ranges_are_dropped():
    assert split_ranges([r(0, 5, 5), r(1, 9, 3)], min_partitions=3) == []
    assert split_ranges([r(0, 5, 5), r(1, 0, 2)]) == [r(1, 0, 2)]


def test_ranges_come_out_sorted():
    ranges = [r(2, 0, 5, "b"), r(10, 0, 5, "a"), r(2, 0, 5, "a"), r(0, 0, 5, "b")]
    assert split_ranges(ranges) == [r(2, 0, 5, "a"), r(10, 0, 5, "a"),
                                    r(0, 0, 5, "b"), r(2, 0, 5, "b")]


def test_input_is_not_modified():
    ranges = [r(1, 0, 10), r(0, 0, 10)]
    split_ranges(ranges, min_partitions=8, max_records_per_partition=3)
    assert ranges == [r(1, 0, 10), r(0, 0, 10)]


# -- split_ranges: min_partitions --------------------------------------------


def test_one_range_cut_into_min_partitions_near_equal_pieces():
    pieces = split_ranges([r(0, 100, 110)], min_partitions=4)
    assert pieces == [r(0, 100, 103), r(0, 103, 106), r(0, 106, 108), r(0, 108, 110)]


def test_one_range_smaller_than_min_partitions_becomes_single_records():
    pieces = split_ranges([r(0, 0, 3)], min_partitions=8)
    assert pieces == [r(0, 0, 1), r(0, 1, 2), r(0, 2, 3)]


def test_larger_ranges_are_cut_in_proportion():
    # total 40, 4 wanted: ideal 10; a (30) in 3 pieces, b (10) left whole
    pieces = split_ranges([r(1, 0, 10), r(0, 0, 30)], min_partitions=4)
    assert pieces == [r(0, 0, 10), r(0, 10, 20), r(0, 20, 30), r(1, 0, 10)]


def test_small_ranges_are_left_whole():
    # total 102, 6 wanted: ideal 17; the 100 in round(5.88) = 6, the 1s whole
    pieces = split_ranges([r(0, 0, 100), r(1, 0, 1), r(2, 0, 1)], min_partitions=6)
    assert sizes(pieces) == [17, 17, 17, 17, 16, 16, 1, 1]
    assert covers(pieces, r(0, 0, 100))


def test_pieces_are_contiguous_and_cover_each_range():
    ranges = [r(0, 5, 78), r(1, 1000, 1031), r(2, 0, 4)]
    pieces = split_ranges(ranges, min_partitions=9)
    assert len(pieces) >= 9
    for whole in ranges:
        assert covers(pieces, whole)
    assert sum(sizes(pieces)) == sum(sizes(ranges))
    for whole in ranges:
        own = [p.size for p in pieces if p.partition == whole.partition]
        assert max(own) - min(own) <= 1


def test_no_cut_when_there_are_enough_ranges():
    ranges = [r(0, 0, 1000), r(1, 0, 1), r(2, 0, 1)]
    assert split_ranges(ranges, min_partitions=3) == ranges
    assert split_ranges(ranges, min_partitions=2) == ranges


def test_empty_ranges_do_not_count_towards_min_partitions():
    pieces = split_ranges([r(0, 0, 10), r(1, 4, 4)], min_partitions=2)
    assert pieces == [r(0, 0, 5), r(0, 5, 10)]


def test_min_partitions_of_one_or_none_changes_nothing():
    ranges = [r(0, 0, 50)]
    assert split_ranges(ranges, min_partitions=1) == ranges
    assert split_ranges(ranges, min_partitions=None) == ranges


@pytest.mark.parametrize("range_sizes, wanted", [((3, 3), 5), ((2, 2, 2), 4), ((5, 9), 7)])
def test_at_least_min_partitions_when_there_are_enough_records(range_sizes, wanted):
    ranges = [r(p, 0, n) for p, n in enumerate(range_sizes)]
    assert len(split_ranges(ranges, min_partitions=wanted)) >= wanted


# -- split_ranges: max_records_per_partition ---------------------------------


def test_cap_cuts_into_the_fewest_near_equal_pieces():
    pieces = split_ranges([r(0, 10, 20)], max_records_per_partition=4)
    assert pieces == [r(0, 10, 14), r(0, 14, 17), r(0, 17, 20)]


def test_cap_leaves_small_ranges_alone():
    ranges = [r(0, 0, 4), r(1, 0, 1)]
    assert split_ranges(ranges, max_records_per_partition=4) == ranges


def test_cap_of_one_gives_single_records():
    assert split_ranges([r(0, 7, 10)], max_records_per_partition=1) == [
        r(0, 7, 8), r(0, 8, 9), r(0, 9, 10)]


def test_exact_multiple_of_the_cap():
    assert sizes(split_ranges([r(0, 0, 12)], max_records_per_partition=4)) == [4, 4, 4]


# -- split_ranges: both ------------------------------------------------------


def test_min_partitions_then_cap():
    # 2 ranges, 3 wanted: ideal 10; a (20) in 2 pieces of 10, then each capped at 4
    pieces = split_ranges([r(0, 0, 20), r(1, 0, 10)], min_partitions=3,
                          max_records_per_partition=4)
    assert sizes(pieces) == [4, 3, 3, 4, 3, 3, 4, 3, 3]
    assert covers(pieces, r(0, 0, 20)) and covers(pieces, r(1, 0, 10))
    assert pieces == sorted(pieces)


def test_cap_alone_can_meet_min_partitions():
    pieces = split_ranges([r(0, 0, 9), r(1, 0, 9), r(2, 0, 9)], min_partitions=2,
                          max_records_per_partition=3)
    assert sizes(pieces) == [3] * 9


# -- minOffsetsPerTrigger / maxTriggerDelay --------------------------------------


def test_offsets_waiting_sums_what_lies_ahead():
    start = {("a", 0): 10, ("a", 1): 5}
    latest = {("a", 0): 15, ("a", 1): 5, ("b", 0): 7}  # b-0 is new: from 0
    assert offsets_waiting(start, latest) == 5 + 0 + 7
    # A partition behind its start (data loss) adds nothing, subtracts nothing.
    assert offsets_waiting({("a", 0): 10}, {("a", 0): 4, ("b", 0): 3}) == 3
    assert offsets_waiting({}, {}) == 0


def test_the_first_trigger_is_never_held_back():
    assert not hold_back_batch(0, 100, 60_000, now_ms=5, last_admitted_ms=None)


@pytest.mark.parametrize("waiting, held", [(0, True), (99, True), (100, False), (5000, False)])
def test_within_the_delay_a_batch_waits_for_the_minimum(waiting, held):
    assert hold_back_batch(waiting, 100, 60_000, now_ms=1000, last_admitted_ms=0) is held


@pytest.mark.parametrize("elapsed_ms, held", [(59_999, True), (60_000, False), (10**9, False)])
def test_the_delay_releases_a_batch_below_the_minimum(elapsed_ms, held):
    assert hold_back_batch(3, 100, 60_000, now_ms=10**10 + elapsed_ms,
                           last_admitted_ms=10**10) is held


def test_a_trigger_sequence_against_the_clock():
    """min 10 offsets, delay 1000 ms; the caller records every admitted
    trigger, as the stream reader does: (now ms, offsets waiting) -> held."""
    script = [(0, 0, False),      # first trigger: admitted (nothing to read)
              (100, 3, True),     # 3 < 10, 100 ms since the last admitted
              (900, 9, True),
              (950, 12, False),   # the minimum is reached: a batch
              (1000, 2, True),    # the clock restarted at 950
              (1949, 2, True),
              (1950, 2, False),   # 1000 ms after 950: a batch of 2
              (2500, 0, True),    # nothing waiting: held (no batch anyway)
              (2950, 0, False),   # the delay passes with nothing to read ...
              (3000, 4, True)]    # ... and restarts the clock, as in Spark
    last = None
    for now_ms, waiting, expected in script:
        held = hold_back_batch(waiting, 10, 1000, now_ms, last)
        assert held is expected, (now_ms, waiting)
        if not held:
            last = now_ms
