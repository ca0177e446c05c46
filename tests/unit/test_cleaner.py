"""The log cleaner on cases the state machine does not draw: transactions
(aborted records go, markers stay while their transaction has batches and
for delete.retention.ms after), idempotent producers' sequences surviving a
clean and a restart, a follower truncating a cleaned log, and the policy's
effect on retention."""

from __future__ import annotations

import glob
import os

import pytest

from storage import cleaner
from storage.batch import BatchBuilder, ControlType, iter_batches, iter_records
from storage.config import LogConfig
from storage.errors import InvalidRecordError
from storage.log import Log

RETENTION_MS = 1_000


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000

    def __call__(self) -> int:
        return self.now


def open_compacted(directory, clock, **overrides) -> Log:
    settings = dict(segment_bytes=1024, cleanup_policy="compact", flush_ms=-1,
                    min_cleanable_dirty_ratio=0.0, delete_retention_ms=RETENTION_MS)
    settings.update(overrides)
    return Log.open(str(directory), LogConfig(**settings), clock=clock)


def batch(records, *, producer_id=-1, epoch=-1, sequence=-1, transactional=False) -> bytes:
    builder = BatchBuilder(producer_id=producer_id, producer_epoch=epoch,
                           base_sequence=sequence, transactional=transactional)
    for key, value in records:
        builder.append(key, value, timestamp_ms=1_000)
    return builder.build()


def append_keyed(log: Log, count: int, keys: int) -> None:
    """``count`` one-record batches, record i keyed ``k<i % keys>``, valued ``v<i>``."""
    for i in range(count):
        log.append(batch([(b"k%d" % (i % keys), b"v%d" % i)]), leader_epoch=1)


def full_pass(log: Log, clock: Clock) -> cleaner.CleanResult:
    log.roll()
    log.flush()
    plan = cleaner.plan_clean(log, clock.now, force=True)
    assert plan is not None
    result = cleaner.clean(plan)
    assert cleaner.swap(log, result)
    log.check_invariants()
    leftovers = [name for name in os.listdir(log.directory)
                 if name.endswith((".cleaned", ".swap", ".deleted"))]
    assert not leftovers, leftovers  # the old segments' files were unlinked
    return result


def contents(log: Log) -> list[tuple[int, bytes | None, bytes | None]]:
    """Data records (not transaction markers), in offset order."""
    data = log.read(log.log_start_offset, 1 << 30)
    return [(r.offset, r.key, r.value) for header, view in iter_batches(data)
            if not header.is_control for r in iter_records(view)]


def control_offsets(log: Log) -> list[int]:
    data = log.read(log.log_start_offset, 1 << 30)
    return [h.base_offset for h, _ in iter_batches(data) if h.is_control]


def test_aborted_records_go_and_markers_stay_while_their_transaction_has_batches(tmp_path):
    clock = Clock()
    log = open_compacted(tmp_path / "t-0", clock)
    log.append(batch([(b"a", b"aborted"), (b"b", b"aborted")], producer_id=7, epoch=0,
                     sequence=0, transactional=True), leader_epoch=1)
    abort = log.append_marker(ControlType.ABORT, 7, 0, 0, 1).base_offset
    log.append(batch([(b"a", b"a1"), (b"c", b"c1")], producer_id=7, epoch=0, sequence=2,
                     transactional=True), leader_epoch=1)
    commit = log.append_marker(ControlType.COMMIT, 7, 0, 0, 1).base_offset
    log.append(batch([(b"b", b"b1")]), leader_epoch=1)

    full_pass(log, clock)
    assert contents(log) == [(3, b"a", b"a1"), (4, b"c", b"c1"), (6, b"b", b"b1")]
    # Just cleaned: both markers stay for delete.retention.ms.
    assert control_offsets(log) == [abort, commit]

    clock.now += RETENTION_MS + 1
    full_pass(log, clock)
    # The aborted transaction has no batch left: its marker may go. The
    # committed one still has records: its marker stays.
    assert control_offsets(log) == [commit]
    assert contents(log) == [(3, b"a", b"a1"), (4, b"c", b"c1"), (6, b"b", b"b1")]
    assert log.first_unstable_offset is None


def test_an_idempotent_producers_sequence_survives_a_clean_and_a_restart(tmp_path):
    clock = Clock()
    log = open_compacted(tmp_path / "t-0", clock)
    first = batch([(b"x", b"old")], producer_id=9, epoch=0, sequence=0)
    log.append(first, leader_epoch=1)
    log.append(batch([(b"x", b"new")]), leader_epoch=1)  # supersedes producer 9's record
    full_pass(log, clock)
    assert contents(log) == [(1, b"x", b"new")]
    # The producer's batch stays, empty, so its sequence is known after a
    # restart that replays the log (no producer snapshot).
    log.abandon()
    for path in glob.glob(os.path.join(log.directory, "*.snapshot")):
        os.unlink(path)
    log = open_compacted(tmp_path / "t-0", clock)
    again = log.append(first, leader_epoch=1)
    assert again.duplicate and again.base_offset == 0
    log.check_invariants()


def test_a_follower_truncating_a_cleaned_log_keeps_a_consistent_cleaner_state(tmp_path):
    clock = Clock()
    log = open_compacted(tmp_path / "t-0", clock)
    append_keyed(log, 30, 3)
    full_pass(log, clock)
    assert log.cleaner_state.first_dirty == 30
    log.truncate_to(12)
    assert log.cleaner_state.first_dirty <= log.log_end_offset <= 12
    log.check_invariants()
    # Offsets past the cut are new records, never "cleaned before".
    assert log.cleaner_state.cleaned_time(log.log_end_offset) is None
    log.append(batch([(b"k0", None)]), leader_epoch=2)
    full_pass(log, clock)
    assert (log.log_end_offset - 1, b"k0", None) in contents(log)


def test_compact_only_logs_are_not_trimmed_by_retention_and_keyless_records_are_refused(
        tmp_path):
    clock = Clock()
    log = open_compacted(tmp_path / "t-0", clock, retention_ms=10)
    log.append(batch([(b"k", b"v")]), leader_epoch=1)
    log.roll()
    clock.now += 10_000
    assert log.delete_retained_segments() == 0 and contents(log) == [(0, b"k", b"v")]
    with pytest.raises(InvalidRecordError, match="no key"):
        log.append(batch([(b"k", b"v"), (None, b"keyless")]), leader_epoch=1)
    assert log.log_end_offset == 1
    log.config = LogConfig(segment_bytes=1024, cleanup_policy="compact,delete",
                           retention_ms=10, flush_ms=-1)
    assert log.delete_retained_segments() == 1 and contents(log) == []


def test_a_broker_unlinks_replaced_segments_later_and_a_reopen_removes_what_it_did_not(
        tmp_path):
    clock = Clock()
    log = open_compacted(tmp_path / "t-0", clock)
    append_keyed(log, 40, 4)
    log.roll()
    log.flush()
    later: list[list[str]] = []
    result = cleaner.clean(cleaner.plan_clean(log, clock.now, force=True))
    assert cleaner.swap(log, result, delete_later=later.append)
    doomed = later[0]
    assert doomed and all(path.endswith(".deleted") and os.path.exists(path)
                          for path in doomed)
    before = contents(log)
    log.abandon()  # a crash before the unlinks ran
    log = open_compacted(tmp_path / "t-0", clock)
    assert not any(os.path.exists(path) for path in doomed)
    assert contents(log) == before
    log.check_invariants()


def test_a_map_too_small_for_the_dirty_section_cleans_it_in_passes(tmp_path):
    clock = Clock()
    log = open_compacted(tmp_path / "t-0", clock)
    for i in range(400):
        log.append(batch([(b"key-%03d" % (i % 100), b"v%d" % i)]), leader_epoch=1)
    log.roll()
    log.flush()
    ends = []
    while True:
        plan = cleaner.plan_clean(log, clock.now)
        if plan is None or plan.first_dirty >= plan.dirty_end:
            break
        result = cleaner.clean(plan, budget_bytes=30 * cleaner.MAP_ENTRY_BYTES)
        assert cleaner.swap(log, result)
        ends.append(result.map_end)
        assert len(ends) < 50, "no progress"
    assert len(ends) > 1 and ends == sorted(ends)
    records = contents(log)
    assert sorted(k for _, k, _ in records) == sorted(b"key-%03d" % i for i in range(100))
    assert all(v == b"v%d" % (300 + int(k[4:])) for _, k, v in records)


def test_long_keys_and_batches_emptied_by_an_earlier_pass(tmp_path):
    """Long keys (held whole in the offset map, as every key); a later pass
    meets the empty batches an earlier one left (a segment's last batch)."""
    clock = Clock()
    log = open_compacted(tmp_path / "t-0", clock)
    long_keys = [b"customer-%02d-" % i + b"x" * 40 for i in range(4)]
    for round_ in range(3):
        for i in range(40):
            log.append(batch([(long_keys[i % 4], b"r%d-%d" % (round_, i))]), leader_epoch=1)
        full_pass(log, clock)
    data = log.read(log.log_start_offset, 1 << 30)
    assert any(h.record_count == 0 for h, _ in iter_batches(data)), "no emptied batch kept"
    records = contents(log)
    assert sorted(k for _, k, _ in records) == sorted(long_keys)
    assert {k: v for _, k, v in records} == {long_keys[i % 4]: b"r2-%d" % i
                                             for i in range(36, 40)}


def test_compaction_lags_bound_when_a_log_may_and_must_be_cleaned(tmp_path):
    clock = Clock()
    log = open_compacted(tmp_path / "t-0", clock, min_cleanable_dirty_ratio=0.99,
                         min_compaction_lag_ms=5_000, max_compaction_lag_ms=60_000)
    for i in range(10):
        builder = BatchBuilder()
        builder.append(b"k%d" % (i % 2), b"v%d" % i, timestamp_ms=clock.now)
        log.append(builder.build(), leader_epoch=1)
        log.roll()
    log.flush()
    # Younger than min.compaction.lag.ms: nothing may be cleaned yet.
    assert cleaner.cleanability(log, clock.now).cleanable_segments == 0
    clock.now += 6_000
    found = cleaner.cleanability(log, clock.now)
    assert found.cleanable_segments == 10 and found.dirty_ratio == 1.0
    # Never cleaned, the log is all dirty: the ratio makes it due. After a
    # pass, a little new dirty data is due only once max.compaction.lag.ms
    # has passed.
    assert cleaner.needs_cleaning(log, clock.now) is not None
    full_pass(log, clock)
    builder = BatchBuilder()
    builder.append(b"k0", b"late", timestamp_ms=clock.now)
    log.append(builder.build(), leader_epoch=1)
    log.roll()
    log.flush()
    clock.now += 6_000
    assert cleaner.needs_cleaning(log, clock.now) is None  # ratio below 0.99, lag not passed
    clock.now += 60_000
    assert cleaner.needs_cleaning(log, clock.now) is not None  # max.compaction.lag.ms passed


def test_the_io_cap_paces_the_cleaner(monkeypatch):
    now = [100.0]
    waits = []

    def sleep(seconds: float) -> None:  # a clock that moves only when slept on
        waits.append(seconds)
        now[0] += seconds

    monkeypatch.setattr(cleaner.time, "sleep", sleep)
    monkeypatch.setattr(cleaner.time, "monotonic", lambda: now[0])
    throttler = cleaner.Throttler(1_000_000)  # 1 MB/s
    for _ in range(10):
        throttler.account(50_000)
    # Half a megabyte at 1 MB/s: half a second of waiting, asked in steps.
    assert sum(waits) == pytest.approx(0.5), waits
    assert cleaner.UNLIMITED.account(10**9) is None and len(waits) == 10


def test_gaps_survive_a_full_recovery_whatever_config_the_log_is_opened_with(tmp_path):
    """A broker opens every log with its default config (cleanup.policy
    delete) before it learns the topic's: the gaps of a cleaned log, and
    those a follower copied from its leader, are still not corruption."""
    clock = Clock()
    leader = open_compacted(tmp_path / "t-0", clock)
    append_keyed(leader, 60, 3)
    full_pass(leader, clock)
    for i in range(5):
        leader.append(batch([(b"k%d" % i, b"w%d" % i)]), leader_epoch=1)
    follower = open_compacted(tmp_path / "f-0", clock)
    follower.append_as_follower(leader.read(0, 1 << 30))
    expected = contents(leader)
    assert contents(follower) == expected and len(expected) < 60
    for log in (leader, follower):
        directory = log.directory
        log.flush()
        log.abandon()  # a crash; then recovery validates every batch from offset 0
        reopened = Log.open(directory, LogConfig(flush_ms=-1), recovery_point=0,
                            clock=clock)
        assert contents(reopened) == expected, directory
        reopened.check_invariants()
        reopened.abandon()


def test_a_key_equal_to_another_keys_digest_supersedes_nothing(tmp_path):
    # Keys are held whole: a key crafted to equal a digest of another (as
    # an offset map of digests would store it) is just another key.
    import hashlib

    clock = Clock()
    log = open_compacted(tmp_path / "t-0", clock)
    long_key = b"L" * 40
    lookalike = hashlib.blake2b(long_key, digest_size=16).digest()
    log.append(batch([(long_key, b"long")]), leader_epoch=1)
    log.append(batch([(lookalike, b"raw")]), leader_epoch=1)
    full_pass(log, clock)
    assert contents(log) == [(0, long_key, b"long"), (1, lookalike, b"raw")]


def test_a_swap_failing_before_it_touches_the_old_segments_leaves_no_swap_file(
        tmp_path, monkeypatch):
    clock = Clock()
    log = open_compacted(tmp_path / "t-0", clock)
    append_keyed(log, 30, 3)
    log.roll()
    log.flush()
    before = contents(log)
    result = cleaner.clean(cleaner.plan_clean(log, clock.now, force=True))

    def failing_fsync(path):
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(cleaner, "fsync_directory", failing_fsync)
    with pytest.raises(OSError):
        cleaner.swap(log, result)
    assert not [n for n in os.listdir(log.directory) if n.endswith((".swap", ".cleaned"))]
    assert contents(log) == before
    log.abandon()
    assert contents(open_compacted(tmp_path / "t-0", clock)) == before


def expected_after_cleaning(records):
    """What a clean with no tombstone yet past its time keeps of ``records``
    ((offset, key, value) in offset order): every keyless record, and the
    latest record of each key (a tombstone too)."""
    latest = {key: offset for offset, key, _ in records if key is not None}
    return [(o, k, v) for o, k, v in records if k is None or latest[k] == o]


def random_batches(rng, count: int, keys: list[bytes], keyless: bool):
    """``count`` batches of 1-12 records: keys drawn from ``keys`` (and
    None, with ``keyless``), a tenth of the values tombstones."""
    drawn = keys + [None] if keyless else keys
    return [[(rng.choice(drawn), None if rng.random() < 0.1 else b"v%d" % rng.randrange(10**6))
             for _ in range(rng.randint(1, 12))] for _ in range(count)]


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("budget", [40 * cleaner.MAP_ENTRY_BYTES, 1 << 20])
def test_multi_record_batches_keep_exactly_the_latest_record_of_each_key(
        tmp_path, seed, budget):
    """Batches of many records, some kept whole, some dropped whole, most
    cut (the rewrite reads what stays of those off the offset map); keyless
    records written before the topic became compacted; long keys;
    tombstones; a map too small for the dirty section (passes); and a
    replica's copy of the cleaned log, whose batches have offset gaps, cleaned
    again with more records on top: each keeps exactly what the model says."""
    import random
    rng = random.Random(seed)
    keys = [b"k%02d" % i for i in range(25)] + [b"long-%02d-" % i + b"x" * 40 for i in range(3)]
    clock = Clock()
    directory = tmp_path / "t-0"
    log = Log.open(str(directory), LogConfig(segment_bytes=2048, cleanup_policy="delete",
                                             flush_ms=-1), clock=clock)
    for records in random_batches(rng, 15, keys, keyless=True):
        log.append(batch(records), leader_epoch=1)
    log.close()
    log = open_compacted(directory, clock, segment_bytes=2048)
    for records in random_batches(rng, 40, keys, keyless=False):
        log.append(batch(records), leader_epoch=1)
    written = contents(log)
    log.roll()
    log.flush()
    for _ in range(60):
        plan = cleaner.plan_clean(log, clock.now)
        if plan is None:
            break
        assert cleaner.swap(log, cleaner.clean(plan, budget_bytes=budget))
        log.check_invariants()
    else:
        raise AssertionError("the cleaner made no progress")
    assert contents(log) == expected_after_cleaning(written)
    kept = contents(log)

    # A new replica fetches the cleaned log from its start: its dirty
    # section is batches with offset gaps, then fresh records.
    replica = open_compacted(tmp_path / "replica-0", clock, segment_bytes=2048)
    for header, view in iter_batches(log.read(log.log_start_offset, 1 << 30)):
        replica.append_as_follower(bytes(view))
    for records in random_batches(rng, 20, keys, keyless=False):
        replica.append(batch(records), leader_epoch=2)
    copied = contents(replica)
    assert copied[:len(contents(log))] == contents(log)
    full_pass(replica, clock)
    assert contents(replica) == expected_after_cleaning(copied)
    replica.close()

    # The pass noted when its tombstones may go; then a pass is due, and
    # removes them, only them.
    assert any(v is None for _, _, v in kept)
    assert log.cleaner_state.due_ms == clock.now + RETENTION_MS
    clock.now += RETENTION_MS
    plan = cleaner.plan_clean(log, clock.now)
    assert plan is not None, "no pass was due to remove the tombstones"
    assert cleaner.swap(log, cleaner.clean(plan, budget_bytes=budget))
    assert contents(log) == [(o, k, v) for o, k, v in kept if v is not None or k is None]
    log.close()


def test_a_batch_whose_offset_deltas_disagree_with_its_header_fails_the_pass(tmp_path):
    """A batch with a valid CRC whose records' offset deltas repeat (as a
    bug elsewhere could write) must not reach the offset map."""
    import msgpack

    from storage import batch as fmt
    clock = Clock()
    log = open_compacted(tmp_path / "t-0", clock)
    log.append(batch([(b"a", b"1"), (b"b", b"2"), (b"c", b"3")]), leader_epoch=1)
    records = [[0, 0, b"a", b"4", []], [0, 0, b"b", b"5", []], [0, 2, b"c", b"6", []]]
    section = b"".join(msgpack.packb(r, use_bin_type=True) for r in records)
    bad = fmt.pack_batch(base_offset=3, leader_epoch=1, attributes=0, last_offset_delta=2,
                         base_timestamp=1_000, max_timestamp=1_000, producer_id=-1,
                         producer_epoch=-1, base_sequence=-1, record_count=3, section=section)
    log.append_as_follower(bad)
    log.roll()
    log.flush()
    plan = cleaner.plan_clean(log, clock.now, force=True)
    with pytest.raises(fmt.CorruptRecordError, match="out of order"):
        cleaner.clean(plan)
    assert not [n for n in os.listdir(log.directory) if n.endswith(".cleaned")]
    log.close()
