"""Offset arithmetic for the source, pure: which ranges a query reads.

The driver decides, per micro-batch (or once, for a batch query), an offset
range ``[from, until)`` for each topic-partition; executors then read those
ranges and nothing else, so a batch read twice (a restart from the
checkpoint) holds the same records. Two decisions live here:

- ``limit_offsets``: how far each partition may advance under
  ``maxOffsetsPerTrigger``. The limit is shared in proportion to what each
  partition has waiting, every partition with records gets one while the
  limit allows, and the total never exceeds the limit.
- ``split_ranges``: how ranges become Spark tasks. One task per range, but
  ranges are cut when ``minPartitions`` asks for more tasks than there are
  ranges (the largest ranges are cut, in proportion to size, until there
  are that many) and when ``maxRecordsPerPartition`` caps a task.

Offsets here are plain ints keyed by ``(topic, partition)``; a partition
missing from a start offset (added to the topic since) starts at 0.
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping
from typing import NamedTuple

TopicPartitionKey = tuple[str, int]


class OffsetRange(NamedTuple):
    """Records ``from_offset <= offset < until_offset`` of one partition."""

    topic: str
    partition: int
    from_offset: int
    until_offset: int

    @property
    def size(self) -> int:
        return self.until_offset - self.from_offset


def offsets_waiting(start: Mapping[TopicPartitionKey, int],
                    latest: Mapping[TopicPartitionKey, int]) -> int:
    """How many offsets lie between ``start`` and ``latest``, summed over
    the partitions of ``latest`` (a partition behind its start counts 0)."""
    return sum(max(0, end - start.get(tp, 0)) for tp, end in latest.items())


def hold_back_batch(waiting: int, min_offsets: int, max_delay_ms: int, now_ms: int,
                    last_admitted_ms: int | None) -> bool:
    """Whether a trigger is held back (plans no batch) under
    ``minOffsetsPerTrigger``: fewer than ``min_offsets`` offsets are
    ``waiting`` and less than ``max_delay_ms`` has passed since the last
    trigger that was not held back (``last_admitted_ms``; None before the
    first, which is therefore never held back).

    This is the rule of Spark's Kafka source: the caller sets
    ``last_admitted_ms = now_ms`` whenever this returns False, whether or
    not there was anything to read, so the delay runs from the last trigger
    that could have planned a batch.
    """
    assert min_offsets >= 1 and max_delay_ms >= 1
    if last_admitted_ms is None or now_ms - last_admitted_ms >= max_delay_ms:
        return False
    return waiting < min_offsets


def limit_offsets(start: Mapping[TopicPartitionKey, int],
                  latest: Mapping[TopicPartitionKey, int],
                  max_records: int) -> dict[TopicPartitionKey, int]:
    """The end offsets of a micro-batch reading at most ``max_records``
    (>= 1) of what lies between ``start`` and ``latest``.

    When everything waiting fits, every partition goes to ``latest``.
    Otherwise each partition with records waiting gets its share,
    ``max_records * waiting / total``, rounded by largest remainder, except
    that nobody starves: while the limit covers one record per partition
    with records, each gets at least one (taken from the partitions served
    most above their share); when it does not, the largest backlogs get one
    each. So the batch moves exactly ``max_records`` records, never past
    ``latest``; a larger backlog never gets less than a smaller one; and
    when no partition needed the minimum of one, every grant is within one
    of its share.
    """
    assert max_records >= 1
    waiting = {tp: end - start.get(tp, 0) for tp, end in latest.items()
               if end - start.get(tp, 0) > 0}
    total = sum(waiting.values())
    if total <= max_records:
        return dict(latest)
    if max_records < len(waiting):
        by_backlog = sorted(waiting, key=lambda tp: (-waiting[tp], tp))
        grant = {tp: 1 for tp in by_backlog[:max_records]}
    else:
        grant = _shares(waiting, total, max_records)
    ends = dict(latest)
    for tp in waiting:
        ends[tp] = start.get(tp, 0) + grant.get(tp, 0)
    return ends


def _shares(waiting: Mapping[TopicPartitionKey, int], total: int, limit: int
            ) -> dict[TopicPartitionKey, int]:
    """Largest-remainder shares of ``limit`` in proportion to ``waiting``,
    at least one each (``limit >= len(waiting)``). Shares are compared as
    ``limit * n`` against ``grant * total``: exact integers."""
    exact = {tp: limit * n for tp, n in waiting.items()}  # share * total
    grant = {tp: max(1, e // total) for tp, e in exact.items()}
    extra = sum(grant.values()) - limit
    if extra < 0:  # rounding down left some over: largest fractions first
        order = sorted(waiting, key=lambda tp: (-(exact[tp] - grant[tp] * total),
                                                -waiting[tp], tp))
        for tp in order[:-extra]:
            grant[tp] += 1
    elif extra > 0:  # the minimum of one overspent: take from the most served
        heap = [(-(grant[tp] * total - exact[tp]), waiting[tp], tp)
                for tp in waiting if grant[tp] > 1]
        heapq.heapify(heap)
        for _ in range(extra):
            _over, n, tp = heapq.heappop(heap)
            grant[tp] -= 1
            if grant[tp] > 1:
                heapq.heappush(heap, (-(grant[tp] * total - exact[tp]), n, tp))
    assert sum(grant.values()) == limit
    return grant


def split_ranges(ranges: list[OffsetRange], min_partitions: int | None = None,
                 max_records_per_partition: int | None = None) -> list[OffsetRange]:
    """Empty ranges dropped; then cut into at least ``min_partitions``
    ranges when there are fewer (or one per record, when there are fewer
    records than that), and into ranges of at most
    ``max_records_per_partition`` records. Order: by topic, partition,
    offset, so task numbers are stable for a given plan."""
    ranges = sorted(r for r in ranges if r.size > 0)
    if min_partitions is not None and 0 < len(ranges) < min_partitions:
        ranges = _cut_to(ranges, min_partitions)
    if max_records_per_partition is not None:
        capped = []
        for r in ranges:
            parts = -(-r.size // max_records_per_partition)
            capped.extend(_divide(r, parts))
        ranges = capped
    return ranges


def _cut_to(ranges: list[OffsetRange], wanted: int) -> list[OffsetRange]:
    """Cut ranges larger than the ideal size (total / wanted) into about
    size / ideal pieces, as Spark's Kafka source does, then keep cutting the
    range whose pieces are largest until there are ``wanted`` pieces (or one
    per record)."""
    total = sum(r.size for r in ranges)
    wanted = min(wanted, total)
    parts = [max(1, (r.size * wanted + total // 2) // total) for r in ranges]
    while sum(parts) < wanted:
        i = max(range(len(ranges)), key=lambda i: (ranges[i].size / parts[i], -i))
        parts[i] += 1
    cut = []
    for r, n in zip(ranges, parts):
        cut.extend(_divide(r, n))
    return cut


def _divide(r: OffsetRange, parts: int) -> list[OffsetRange]:
    """``r`` in ``parts`` contiguous pieces whose sizes differ by at most one."""
    parts = max(1, min(parts, r.size))
    step, extra = divmod(r.size, parts)
    pieces = []
    begin = r.from_offset
    for i in range(parts):
        end = begin + step + (1 if i < extra else 0)
        pieces.append(r._replace(from_offset=begin, until_offset=end))
        begin = end
    assert begin == r.until_offset
    return pieces
