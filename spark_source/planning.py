"""Offset arithmetic for the source, pure: which ranges a query reads.

The driver decides, per micro-batch (or once, for a batch query), an offset
range ``[from, until)`` for each topic-partition; executors then read those
ranges and nothing else, so a batch read twice (a restart from the
checkpoint) holds the same records. Two decisions live here:

- ``limit_offsets``: how far each partition may advance under
  ``maxOffsetsPerTrigger``. The limit is shared in proportion to what each
  partition has waiting, every partition with records gets at least one
  while the limit allows, and the total never exceeds the limit.
- ``split_ranges``: how ranges become Spark tasks. One task per range, but
  ranges are cut when ``minPartitions`` asks for more tasks than there are
  ranges (the largest ranges are cut, in proportion to size, as Spark's
  Kafka source does) and when ``maxRecordsPerPartition`` caps a task.

Offsets here are plain ints keyed by ``(topic, partition)``; a partition
missing from a start offset (added to the topic since) starts at 0.
"""

from __future__ import annotations

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


def limit_offsets(start: Mapping[TopicPartitionKey, int],
                  latest: Mapping[TopicPartitionKey, int],
                  max_records: int) -> dict[TopicPartitionKey, int]:
    """The end offsets of a micro-batch reading at most ``max_records``
    (>= 1) of what lies between ``start`` and ``latest``.

    Each partition with records waiting gets ``max_records * waiting /
    total`` rounded down; partitions with records but a share below one get
    one each first (largest backlog first) while the limit allows, and what
    rounding left over goes to the largest fractions. The result never
    exceeds ``latest`` and moves by ``min(max_records, total)`` records in
    all, so every micro-batch makes progress.
    """
    assert max_records >= 1
    waiting = {tp: end - start.get(tp, 0) for tp, end in latest.items()
               if end - start.get(tp, 0) > 0}
    total = sum(waiting.values())
    ends = dict(latest)
    if total <= max_records:
        return ends
    grant: dict[TopicPartitionKey, int] = {}
    remainders: list[tuple[int, TopicPartitionKey]] = []
    for tp, size in waiting.items():
        # Integer arithmetic: the shares' fractions (remainder / total) add
        # up to exactly what rounding down left over.
        grant[tp], remainder = divmod(max_records * size, total)
        remainders.append((remainder, tp))
    left = max_records - sum(grant.values())
    # Nobody starves: a partition with records but no whole share gets one
    # (largest backlog first) before fractions are rounded up.
    for tp in sorted((tp for tp, n in grant.items() if n == 0),
                     key=lambda tp: (-waiting[tp], tp)):
        if left == 0:
            break
        grant[tp] = 1
        left -= 1
    for _fraction, tp in sorted(remainders, key=lambda item: (-item[0], item[1])):
        if left == 0:
            break
        if grant[tp] < waiting[tp]:
            grant[tp] += 1
            left -= 1
    for tp in latest:
        ends[tp] = start.get(tp, 0) + grant.get(tp, 0) if tp in waiting else latest[tp]
    return ends


def split_ranges(ranges: list[OffsetRange], min_partitions: int | None = None,
                 max_records_per_partition: int | None = None) -> list[OffsetRange]:
    """Empty ranges dropped; then cut into at least ``min_partitions``
    ranges (if asked and there are fewer) and into ranges of at most
    ``max_records_per_partition`` records. Order: by topic, partition,
    offset, so task numbers are stable for a given plan."""
    ranges = sorted(r for r in ranges if r.size > 0)
    if min_partitions is not None and 0 < len(ranges) < min_partitions:
        total = sum(r.size for r in ranges)
        ideal = total / min_partitions
        cut = []
        for r in ranges:
            parts = max(1, round(r.size / ideal)) if r.size > ideal else 1
            cut.extend(_divide(r, parts))
        ranges = cut
    if max_records_per_partition is not None:
        capped = []
        for r in ranges:
            parts = -(-r.size // max_records_per_partition)
            capped.extend(_divide(r, parts))
        ranges = capped
    return ranges


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
