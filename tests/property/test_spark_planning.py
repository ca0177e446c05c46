"""Offset-planning guarantees over random inputs (spark_source.planning).

``limit_offsets``: each example draws 1-7 partitions, each with or without
a start offset (missing means 0) and 0-60 records waiting, sometimes a
partition known only to ``start``, and a limit of 1-250 (often more than
is waiting). Checked against exact arithmetic (fractions): the result has
the partitions of ``latest``, never moves backwards or past ``latest``,
moves exactly ``min(limit, waiting)`` records, gives every partition with
records one while the limit allows (else one each to the largest
backlogs), gives shares within one of proportional when nobody needed
that minimum, never gives a larger backlog less, and does not depend on
input order.

``split_ranges``: 0-6 ranges on distinct partitions (some empty or
backwards), optional ``min_partitions`` and ``max_records_per_partition``.
The pieces are sorted, non-empty, tile each non-empty range exactly and
respect the cap; with only the cap, each range is cut into the fewest
near-equal pieces; with only ``min_partitions``, nothing is cut when there
are enough ranges, and otherwise there are at least ``min_partitions``
pieces (or one per record), each range cut into near-equal pieces, at
least as many as its share of ``min_partitions`` rounded, and exactly that
many whenever the total went over.
"""

from __future__ import annotations

import math
from fractions import Fraction

from hypothesis import example, given, settings
from hypothesis import strategies as st

from spark_source.planning import OffsetRange, limit_offsets, split_ranges

SETTINGS = settings(max_examples=200, deadline=None)

TOPICS = ["a", "b", "c"]


@st.composite
def backlogs(draw):
    """``(start, latest, max_records)`` with ``latest >= start`` wherever a
    start is given (a log behind its start is a worked example instead)."""
    keys = draw(st.lists(st.tuples(st.sampled_from(TOPICS), st.integers(0, 3)),
                         min_size=1, max_size=7, unique=True))
    start, latest = {}, {}
    for tp in keys:
        base = 0
        if draw(st.booleans()):
            base = draw(st.integers(0, 1000))
            start[tp] = base
        latest[tp] = base + draw(st.one_of(st.integers(0, 60), st.sampled_from([0, 1, 2])))
    if draw(st.integers(0, 4)) == 0:
        start[("gone", 0)] = draw(st.integers(0, 50))
    total = sum(latest[tp] - start.get(tp, 0) for tp in latest)
    max_records = draw(st.one_of(st.integers(1, max(1, total)), st.integers(1, 250)))
    return start, latest, max_records


def analyse(start, latest, max_records):
    """Per partition with records: (waiting, grant, exact share)."""
    ends = limit_offsets(start, latest, max_records)
    waiting = {tp: latest[tp] - start.get(tp, 0) for tp in latest}
    total = sum(n for n in waiting.values() if n > 0)
    rows = {tp: (n, ends[tp] - start.get(tp, 0), Fraction(max_records * n, total))
            for tp, n in waiting.items() if n > 0}
    return ends, total, rows


@SETTINGS
@given(backlogs())
def test_limit_stays_between_start_and_latest(case):
    start, latest, max_records = case
    ends = limit_offsets(start, latest, max_records)
    assert set(ends) == set(latest)
    for tp, end in ends.items():
        assert start.get(tp, 0) <= end <= latest[tp]


@SETTINGS
@given(backlogs())
def test_limit_moves_exactly_min_of_limit_and_waiting(case):
    start, latest, max_records = case
    ends, total, _rows = analyse(start, latest, max_records)
    moved = sum(ends[tp] - start.get(tp, 0) for tp in latest)
    assert moved == min(max_records, total)
    if total <= max_records:
        assert ends == latest


@SETTINGS
@example(({}, {("a", 0): 1000, ("b", 0): 1, ("c", 0): 5}, 10))
@example(({}, {("a", 0): 1000, ("b", 0): 1, ("c", 0): 5}, 2))
@given(backlogs())
def test_limit_starves_nobody_the_limit_can_feed(case):
    """One each while the limit allows; else one each to the largest backlogs."""
    start, latest, max_records = case
    _ends, total, rows = analyse(start, latest, max_records)
    if total <= max_records:
        return
    if max_records >= len(rows):
        assert all(grant >= 1 for _n, grant, _s in rows.values())
    else:
        fed = [n for n, grant, _s in rows.values() if grant]
        starved = [n for n, grant, _s in rows.values() if not grant]
        assert len(fed) == max_records
        assert all(grant == 1 for _n, grant, _s in rows.values() if grant)
        assert min(fed) >= max(starved)


@SETTINGS
@example(({}, {("a", 0): 2, ("b", 0): 3, ("c", 0): 4}, 4))
@example(({}, {("a", 0): 50, ("b", 0): 30, ("c", 0): 20}, 7))
@given(backlogs())
def test_limit_shares_in_proportion_and_monotone(case):
    """A larger backlog never gets less; when every share is at least one
    (nobody needed the minimum), each grant is within one of its share."""
    start, latest, max_records = case
    _ends, total, rows = analyse(start, latest, max_records)
    if total <= max_records:
        return
    for n, grant, share in rows.values():
        assert all(grant >= g for m, g, _s in rows.values() if m < n)
        if all(s >= 1 for _m, _g, s in rows.values()):
            assert math.floor(share) <= grant <= math.ceil(share)


@SETTINGS
@given(backlogs(), st.randoms(use_true_random=False))
def test_limit_does_not_depend_on_order(case, rnd):
    start, latest, max_records = case
    shuffled_latest = list(latest.items())
    shuffled_start = list(start.items())
    rnd.shuffle(shuffled_latest)
    rnd.shuffle(shuffled_start)
    assert limit_offsets(dict(shuffled_start), dict(shuffled_latest), max_records) == \
        limit_offsets(start, latest, max_records)


# -- split_ranges ------------------------------------------------------------


@st.composite
def range_lists(draw):
    keys = draw(st.lists(st.tuples(st.sampled_from(TOPICS), st.integers(0, 5)),
                         max_size=6, unique=True))
    ranges = []
    for topic, partition in keys:
        begin = draw(st.integers(0, 1000))
        ranges.append(OffsetRange(topic, partition, begin,
                                  begin + draw(st.integers(-3, 80))))
    return ranges


min_partitions_st = st.one_of(st.none(), st.integers(1, 24))
cap_st = st.one_of(st.none(), st.integers(1, 40))


def by_partition(pieces):
    out: dict[tuple[str, int], list[OffsetRange]] = {}
    for p in pieces:
        out.setdefault((p.topic, p.partition), []).append(p)
    return out


@SETTINGS
@given(range_lists(), min_partitions_st, cap_st)
def test_split_pieces_tile_each_range(ranges, min_partitions, cap):
    pieces = split_ranges(ranges, min_partitions, cap)
    assert pieces == sorted(pieces)
    assert all(p.size >= 1 for p in pieces)
    if cap is not None:
        assert all(p.size <= cap for p in pieces)
    non_empty = [r for r in ranges if r.size > 0]
    assert len(pieces) >= len(non_empty)
    grouped = by_partition(pieces)
    assert set(grouped) == {(r.topic, r.partition) for r in non_empty}
    for r in non_empty:
        own = grouped[(r.topic, r.partition)]
        assert own[0].from_offset == r.from_offset
        assert own[-1].until_offset == r.until_offset
        assert all(x.until_offset == y.from_offset for x, y in zip(own, own[1:]))


@SETTINGS
@given(range_lists(), st.randoms(use_true_random=False), min_partitions_st, cap_st)
def test_split_does_not_depend_on_input_order(ranges, rnd, min_partitions, cap):
    shuffled = list(ranges)
    rnd.shuffle(shuffled)
    assert split_ranges(shuffled, min_partitions, cap) == split_ranges(ranges, min_partitions,
                                                                        cap)


@SETTINGS
@given(range_lists(), st.integers(1, 40))
def test_cap_alone_cuts_into_the_fewest_near_equal_pieces(ranges, cap):
    grouped = by_partition(split_ranges(ranges, max_records_per_partition=cap))
    for r in ranges:
        if r.size > 0:
            own = [p.size for p in grouped[(r.topic, r.partition)]]
            assert len(own) == -(-r.size // cap)
            assert max(own) - min(own) <= 1


@SETTINGS
@given(range_lists(), min_partitions_st)
def test_no_cut_without_need(ranges, min_partitions):
    non_empty = sorted(r for r in ranges if r.size > 0)
    if min_partitions is None or len(non_empty) >= min_partitions:
        assert split_ranges(ranges, min_partitions) == non_empty


@SETTINGS
@example([OffsetRange("a", 0, 0, 3), OffsetRange("a", 1, 0, 3)], 5)
@example([OffsetRange("a", 0, 0, 5), OffsetRange("a", 1, 0, 9)], 7)
@given(range_lists(), st.integers(2, 24))
def test_min_partitions_cuts_in_proportion_to_at_least_the_minimum(ranges, min_partitions):
    non_empty = [r for r in ranges if r.size > 0]
    if not 0 < len(non_empty) < min_partitions:
        return
    total = sum(r.size for r in non_empty)
    wanted = min(min_partitions, total)
    pieces = split_ranges(ranges, min_partitions)
    assert len(pieces) >= wanted
    grouped = by_partition(pieces)
    for r in non_empty:
        own = [p.size for p in grouped[(r.topic, r.partition)]]
        assert max(own) - min(own) <= 1
        rounded = max(1, math.floor(Fraction(r.size * wanted, total) + Fraction(1, 2)))
        assert len(own) >= rounded
        if len(pieces) > wanted:  # nothing was added to reach the minimum
            assert len(own) == rounded
