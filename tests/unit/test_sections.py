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
from tests.helpers import batch_and_section as section_of
from storage import sections


def test_the_c_extension_is_built_by_the_install():
    # make test installs with a C compiler on this machine: the cleaner
    # measured and shipped is the accelerated one.
    assert sections.ACCELERATED


payloads = st.one_of(st.none(), st.binary(max_size=200))
headers = st.lists(st.tuples(st.text(max_size=8), st.one_of(st.none(), st.binary(max_size=20))),
                   max_size=2)
records = st.lists(st.tuples(payloads, payloads, headers), min_size=1, max_size=40)


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


# -- the offset map (storage.cleaner.OffsetMap), C and Python ---------------------------
keys_drawn = st.one_of(st.none(), st.sampled_from([b"a", b"b", b"", b"long-" + b"x" * 60]),
                       st.binary(max_size=40))
batches = st.lists(st.lists(st.tuples(keys_drawn, st.one_of(st.none(), st.binary(max_size=8))),
                            min_size=1, max_size=12), min_size=1, max_size=12)


def offset_maps(budget: int = 1 << 20):
    from storage import cleaner
    fast = cleaner.OffsetMap(budget)
    saved = sections._c
    sections._c = None
    try:
        slow = cleaner.OffsetMap(budget)
    finally:
        sections._c = saved
    assert fast._c is not None and slow._c is None
    return fast, slow


def with_python(function, *args):
    saved = sections._c
    sections._c = None
    try:
        return function(*args)
    finally:
        sections._c = saved


@settings(max_examples=150, deadline=None)
@given(batches)
def test_the_c_and_python_offset_maps_keep_the_latest_record_of_each_key(batch_list):
    fast, slow = offset_maps()
    built = []
    base = 0
    for recs in batch_list:
        b = batch_format.BatchBuilder()
        for key, value in recs:
            b.append(key, value, timestamp_ms=1)
        raw = bytearray(b.build())
        raw[:8] = base.to_bytes(8, "big")
        header = batch_format.parse_header(bytes(raw))
        section = bytes(raw[batch_format.HEADER_SIZE:])
        assert fast.put(header, section) and with_python(slow.put, header, section)
        built.append((header, section, recs))
        base += len(recs)
    assert len(fast) == len(slow)
    latest = {}
    offset = 0
    for recs in batch_list:
        for key, _ in recs:
            if key is not None:
                latest[key] = offset
            offset += 1
    for key, at in latest.items():
        assert fast.get(key) == slow.get(key) == at
    for header, section, recs in built:
        answer = fast.keep(header, section)
        assert answer == with_python(slow.keep, header, section)
        keep, tombstones = answer
        stays = [i for i, (key, _) in enumerate(recs)
                 if key is None or latest[key] == header.base_offset + i]
        assert (keep if keep is not None else list(range(len(recs)))) == stays
        expected = [(i, header.base_offset + i) for i in stays
                    if recs[i][0] is not None and recs[i][1] is None]
        assert (tombstones or []) == expected


def keyed_batch(base: int, keys: list[bytes]):
    b = batch_format.BatchBuilder()
    for key in keys:
        b.append(key, b"v", timestamp_ms=1)
    raw = bytearray(b.build())
    raw[:8] = base.to_bytes(8, "big")
    return batch_format.parse_header(bytes(raw)), bytes(raw[batch_format.HEADER_SIZE:])


@pytest.mark.parametrize("accelerated", [True, False])
def test_an_offset_map_refuses_a_batch_that_may_not_fit_and_puts_nothing_of_it(accelerated):
    from storage import cleaner
    saved = sections._c
    if not accelerated:
        sections._c = None
    try:
        if accelerated:
            # Its memory: a 16-entry table (512 bytes) holds 11 keys; 20
            # would double it, and the old and new tables together take 1,536.
            budget, fits = 1000, 1
        else:  # room for 15 keys of 3 bytes, counted as 100 + 4 each
            budget, fits = 15 * (cleaner.MAP_DICT_ENTRY_BYTES + 4), 4
        offsets = cleaner.OffsetMap(int(budget / cleaner.MAP_LOAD_FACTOR) + 1)
        keys = [b"k%02d" % i for i in range(10)]
        assert offsets.put(*keyed_batch(0, keys))
        # Ten more records may be ten new keys: no room for them, though
        # they are the same keys again. Nothing of the batch is put.
        assert not offsets.put(*keyed_batch(10, keys))
        assert len(offsets) == 10 and offsets.get(b"k00") == 0
        assert offsets.put(*keyed_batch(20, keys[:fits]))
        assert offsets.get(b"k00") == 20 and offsets.get(b"k09") == 9
        assert offsets.used_bytes <= offsets.budget
        # An empty map takes any batch: every pass makes progress.
        assert cleaner.OffsetMap(1).put(*keyed_batch(0, keys))
    finally:
        sections._c = saved


def test_a_key_stored_as_a_string_is_not_the_same_key_as_its_bytes():
    from storage import cleaner
    as_text = msgpack.packb((0, 0, "key", b"v", ()), use_bin_type=True)
    as_bytes = msgpack.packb((0, 0, b"key", b"v", ()), use_bin_type=True)
    for offsets in offset_maps():
        for base, section in ((0, as_text), (1, as_bytes)):
            header = batch_format.BatchHeader(
                base_offset=base, batch_length=0, partition_leader_epoch=0, magic=2, crc=0,
                attributes=0, last_offset_delta=0, base_timestamp=0, max_timestamp=0,
                producer_id=-1, producer_epoch=-1, base_sequence=-1, record_count=1)
            assert offsets.put(header, section)
        assert offsets.get("key") == 0 and offsets.get(b"key") == 1
    assert isinstance(cleaner.OffsetMap(1 << 20)._c, sections._c.OffsetMap)


def test_the_c_offset_map_grows_and_keeps_every_key_short_and_long():
    from storage import cleaner
    offsets = cleaner.OffsetMap(1 << 30)
    keys = [b"k%d" % i if i % 3 else b"a-long-key-of-more-than-15-bytes-%d" % i
            for i in range(20_000)]
    base = 0
    for start in range(0, len(keys), 500):  # 40 batches: the table grows several times
        assert offsets.put(*keyed_batch(base, keys[start:start + 500]))
        base += 500
    assert len(offsets) == len(keys)
    assert [offsets.get(key) for key in keys] == list(range(len(keys)))
    assert offsets.get(b"absent") == -1 and offsets.get("k1") == -1
    # Its memory: the table (32768 entries for 20,000 keys, at most 70%
    # full) and the arena of keys over 15 bytes (a length and the bytes).
    arena = sum(4 + len(key) for key in keys if len(key) > 15)
    assert offsets.used_bytes - 32768 * cleaner.MAP_ENTRY_BYTES in range(arena, 2 * arena + 1)


def test_what_no_record_holds_is_refused_by_both():
    # A header that is a map (the C reader refuses every map; the Python
    # one, keys it cannot use), a negative count, more records than bytes.
    with_map = msgpack.packb((0, 0, b"k", b"v", ({1: 2},)), use_bin_type=True)
    assert both(sections.scan, with_map, 1, 0) == [ValueError, ValueError]
    assert both(sections.pick, with_map, 1, [0]) == [ValueError, ValueError]
    _, section = section_of([(b"a", b"1", [])])
    for count in (-1, len(section)):
        assert both(sections.scan, section, count, count - 1) == [ValueError, ValueError]
        assert both(sections.pick, section, count, []) == [ValueError, ValueError]


@pytest.mark.parametrize("accelerated", [True, False])
def test_a_batch_reaching_past_the_largest_offset_is_corrupt(accelerated):
    from storage import cleaner
    saved = sections._c
    if not accelerated:
        sections._c = None
    try:
        offsets = cleaner.OffsetMap(1 << 20)
        header, section = keyed_batch(0, [b"a", b"b", b"c"])
        header = header._replace(base_offset=2**63 - 2)
        for call in (offsets.put, offsets.keep):
            with pytest.raises(batch_format.CorruptRecordError, match="largest offset"):
                call(header, section)
        assert len(offsets) == 0
    finally:
        sections._c = saved


def test_the_c_offset_map_holds_no_more_memory_than_its_budget():
    from storage import cleaner
    offsets = cleaner.OffsetMap(200_000)
    base, filled = 0, 0
    while True:
        keys = [b"a-key-of-more-than-fifteen-bytes-%06d" % (base + i) for i in range(50)]
        if not offsets.put(*keyed_batch(base, keys)):
            break
        base += 50
        assert offsets.used_bytes <= offsets.budget
        filled += 50
    assert filled == len(offsets) > 1000  # it filled up, then refused
