"""storage.sections: the cleaner's view of a records section (keys, offset
deltas, null values) and its cut of one (records copied byte for byte), the
C extension and the pure-Python equivalent agreeing with each other and with
storage.batch."""

from __future__ import annotations

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from storage import batch as batch_format
from storage import sections


def test_the_c_extension_is_built_by_the_install():
    # make test installs with a C compiler on this machine: the cleaner
    # measured and shipped is the accelerated one.
    assert sections.ACCELERATED


payloads = st.one_of(st.none(), st.binary(max_size=200))
headers = st.lists(st.tuples(st.text(max_size=8), st.one_of(st.none(), st.binary(max_size=20))),
                   max_size=2)
records = st.lists(st.tuples(payloads, payloads, headers), min_size=1, max_size=40)


def section_of(recs) -> tuple[bytes, bytes]:
    builder = batch_format.BatchBuilder()
    for key, value, hdrs in recs:
        builder.append(key, value, timestamp_ms=1000, headers=hdrs)
    built = builder.build()
    return built, built[batch_format.HEADER_SIZE:]


def both(function, *args):
    """``function``'s answer from the C extension and from the Python
    equivalent: a value, or the exception type."""
    answers = []
    for accelerated in (True, False):
        saved = sections._c
        if not accelerated:
            sections._c = None
        try:
            answers.append(function(*args))
        except ValueError:
            answers.append(ValueError)
        finally:
            sections._c = saved
    return answers


@settings(max_examples=200, deadline=None)
@given(records)
def test_scan_gives_each_records_key_and_null_value(recs):
    built, section = section_of(recs)
    fast, slow = both(sections.scan, section, len(recs), len(recs) - 1)
    assert fast == slow
    keys, deltas, nulls = fast
    assert keys == [key for key, _, _ in recs]
    assert deltas is None  # as every producer writes: 0..n-1
    expected_nulls = bytes(value is None for _, value, _ in recs)
    assert nulls == (expected_nulls if 1 in expected_nulls else None)


@settings(max_examples=200, deadline=None)
@given(records, st.data())
def test_pick_copies_the_chosen_records_byte_for_byte(recs, data):
    built, section = section_of(recs)
    chosen = sorted(data.draw(st.sets(st.integers(0, max(len(recs) - 1, 0)))
                              if recs else st.just(set())))
    fast, slow = both(sections.pick, section, len(recs), chosen)
    assert fast == slow
    assert fast == b"".join(_records_of(section, len(recs), chosen))
    # Each record keeps its own offset delta: the cut batch's offsets stay.
    kept = msgpack.Unpacker(raw=False, use_list=False)
    kept.feed(fast)
    assert [record[1] for record in kept] == chosen


def _records_of(section: bytes, count: int, chosen: list[int]) -> list[bytes]:
    unpacker = msgpack.Unpacker(raw=False)
    unpacker.feed(section)
    spans, start = [], 0
    for _ in range(count):
        unpacker.unpack()
        spans.append(section[start:unpacker.tell()])
        start = unpacker.tell()
    return [spans[i] for i in chosen]


def test_scan_reports_offset_deltas_that_are_not_0_to_n():
    records = [msgpack.packb((0, delta, b"k%d" % delta, b"v", ()), use_bin_type=True)
               for delta in (0, 3, 7)]
    section = b"".join(records)
    fast, slow = both(sections.scan, section, 3, 7)
    assert fast == slow == ([b"k0", b"k3", b"k7"], [0, 3, 7], None)
    # Past the batch's last offset delta, or out of order: refused by both.
    assert both(sections.scan, section, 3, 6) == [ValueError, ValueError]
    backwards = b"".join(reversed(records))
    assert both(sections.scan, backwards, 3, 7) == [ValueError, ValueError]


def test_a_key_stored_as_a_string_is_read_by_the_python_scan():
    section = msgpack.packb((0, 0, "text-key", None, ()), use_bin_type=True)
    with pytest.raises(ValueError):
        sections._c.scan(section, 1, 0)  # the C one takes bytes and nil only
    assert sections.scan(section, 1, 0) == (["text-key"], None, b"\x01")
    assert sections.pick(section, 1, [0]) == section


@pytest.mark.parametrize("count, chosen", [(2, [1, 0]), (2, [2]), (2, [0, 0]), (2, [-1])])
def test_pick_refuses_indexes_out_of_order_or_range(count, chosen):
    _, section = section_of([(b"a", b"1", []), (b"b", b"2", [])])
    assert both(sections.pick, section, count, chosen) == [ValueError, ValueError]


@settings(max_examples=300, deadline=None)
@given(records, st.data())
def test_malformed_sections_raise_value_error_in_both(recs, data):
    _, section = section_of(recs)
    cut = data.draw(st.integers(0, len(section)))
    flip = data.draw(st.integers(0, 255))
    where = data.draw(st.integers(0, max(cut - 1, 0)))
    mangled = bytearray(section[:cut])
    if mangled:
        mangled[where] ^= flip
    count = data.draw(st.integers(0, len(recs) + 1))
    mangled = bytes(mangled)
    fast, slow = both(sections.scan, mangled, count, count - 1)
    # The C scan refuses what it does not take (a string); the Python one
    # may read that, but never something the C one read differently.
    assert fast == slow or (fast is ValueError)
    fast, slow = both(sections.pick, mangled, count, list(range(count)))
    assert fast == slow or (fast is ValueError)
    if fast is not ValueError:
        assert fast == mangled
