"""Index lookups against a linear scan of the same segment.

The sparse offset index and the time index only let a segment skip ahead; a
lookup must always give the answer a scan of every batch would give. Each
example builds one segment from random batches (random sizes, timestamps that
go up and down), then checks every offset, a spread of timestamps, and reads
with random byte limits and upper bounds — before and after reopening the
segment from its files.
"""

from __future__ import annotations

import os
import tempfile

from hypothesis import given, settings
from hypothesis import strategies as st

from storage import batch as fmt
from storage.batch import BatchBuilder
from storage.segment import BatchMeta, Segment

BASE_OFFSET = 1000

batch_specs = st.lists(
    st.tuples(st.integers(1, 5),                # records in the batch
              st.integers(0, 400),              # value size
              st.lists(st.integers(0, 5000), min_size=5, max_size=5)),  # timestamps
    min_size=1, max_size=40)


# Batches larger than the header walk's read-ahead (4-64 KiB) take other
# paths through the chunked walk; fewer of them keep examples fast.
big_batch_specs = st.lists(
    st.tuples(st.integers(1, 3), st.integers(0, 90_000),
              st.lists(st.integers(0, 5000), min_size=5, max_size=5)),
    min_size=1, max_size=12)


def build_segment(directory: str, specs, interval: int):
    """A segment holding ``specs``; returns it with the reference list of
    ``(position, base_offset, next_offset, size, [(offset, timestamp)])``."""
    segment = Segment.create(directory, BASE_OFFSET, interval)
    reference, offset, pos = [], BASE_OFFSET, 0
    for count, value_bytes, stamps in specs:
        builder = BatchBuilder()
        for i in range(count):
            builder.append(None, b"v" * value_bytes, timestamp_ms=stamps[i])
        raw = builder.build()
        header = fmt.parse_header(raw)
        stamped = fmt.stamped_prefix(header, offset, 0) + raw[fmt.MAGIC_OFFSET:]
        segment.append([stamped], [BatchMeta(offset, offset + count - 1,
                                             max(stamps[:count]), len(stamped))])
        records = [(offset + i, stamps[i]) for i in range(count)]
        reference.append((pos, offset, offset + count, len(stamped), records))
        offset += count
        pos += len(stamped)
    return segment, reference


def linear_find(reference, offset):
    for pos, base, next_offset, _size, _records in reference:
        if next_offset - 1 >= offset:
            return pos, base
    return None


def linear_timestamp(reference, target):
    for *_rest, records in reference:
        for offset, ts in records:
            if ts >= target:
                return offset
    return None


def linear_read(reference, offset, max_bytes, upper):
    """Expected ``(start_pos, end_pos)`` of ``Segment.read``."""
    chosen = [r for r in reference if r[2] - 1 >= offset]
    if not chosen or chosen[0][2] - 1 >= upper:
        return None
    start, end = chosen[0][0], chosen[0][0]
    for pos, _base, next_offset, size, _records in chosen:
        if pos + size - start > max_bytes or next_offset - 1 >= upper:
            break
        end = pos + size
    if end == start:
        end = start + chosen[0][3]  # at least one batch
    return start, end


def check_lookups(segment, reference, data, max_read_bytes=4000):
    last_offset = reference[-1][2]
    for offset in range(BASE_OFFSET - 1, last_offset + 2):
        found = segment.find_batch(offset)
        expected = linear_find(reference, offset)
        assert (None if found is None else (found[0], found[1].base_offset)) == expected
    for target in data.draw(st.lists(st.integers(-1, 5002), min_size=1, max_size=25)):
        assert segment.find_offset_by_timestamp(target, BASE_OFFSET) == \
            linear_timestamp(reference, target)
    for _ in range(10):
        offset = data.draw(st.integers(BASE_OFFSET, last_offset - 1))
        max_bytes = data.draw(st.integers(1, max_read_bytes))
        upper = data.draw(st.integers(offset, last_offset + 1))
        got, _next = segment.read(offset, max_bytes, upper, min_one_batch=True)
        expected = linear_read(reference, offset, max_bytes, upper)
        if expected is None:
            assert got == b""
        else:
            start, end = expected
            assert len(got) == end - start
            with open(segment.log_path, "rb") as f:
                f.seek(start)
                assert got == f.read(end - start)


@settings(max_examples=120, deadline=None)
@given(specs=batch_specs, interval=st.integers(0, 1500), data=st.data())
def test_index_lookups_match_a_linear_scan(specs, interval, data):
    with tempfile.TemporaryDirectory() as directory:
        segment, reference = build_segment(directory, specs, interval)
        check_lookups(segment, reference, data)
        segment.write_index_entries()
        segment.close()
        reopened = Segment.open_clean(directory, BASE_OFFSET, interval)
        assert reopened.next_offset == reference[-1][2]
        assert reopened.max_timestamp == max(ts for *_r, recs in reference for _o, ts in recs)
        check_lookups(reopened, reference, data)
        reopened.check_invariants()
        reopened.close()


@settings(max_examples=40, deadline=None)
@given(specs=big_batch_specs, interval=st.integers(0, 200_000), data=st.data())
def test_lookups_over_batches_larger_than_the_read_ahead(specs, interval, data):
    with tempfile.TemporaryDirectory() as directory:
        segment, reference = build_segment(directory, specs, interval)
        check_lookups(segment, reference, data, max_read_bytes=400_000)
        segment.close()


@settings(max_examples=60, deadline=None)
@given(specs=batch_specs, interval=st.integers(0, 1500), data=st.data())
def test_lookups_after_truncation_match_a_linear_scan(specs, interval, data):
    with tempfile.TemporaryDirectory() as directory:
        segment, reference = build_segment(directory, specs, interval)
        cut = data.draw(st.integers(BASE_OFFSET, reference[-1][2]))
        segment.truncate_to(cut)
        kept = [r for r in reference if r[2] - 1 < cut]
        assert segment.next_offset == (kept[-1][2] if kept else BASE_OFFSET)
        assert os.path.getsize(segment.log_path) == sum(r[3] for r in kept)
        segment.check_invariants()
        if kept:
            check_lookups(segment, kept, data)
        segment.close()
