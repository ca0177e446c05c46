"""Unit tests of the partition log: offsets, reads, rolls, truncation,
retention, epochs, flush policy and crash recovery."""

from __future__ import annotations

import logging
import os
import threading

import pytest

from storage import batch as fmt
from storage.batch import CorruptRecordError, RecordTooLargeError, decode_batches
from storage.config import LogConfig
from storage.errors import InvalidOffsetError, LogDirectoryError, OffsetOutOfRangeError
from storage.log import Log
from tests.helpers import make_batch, read_all

SMALL = LogConfig(segment_bytes=2048, index_interval_bytes=128, flush_ms=-1)


class FakeClock:
    def __init__(self, now_ms: int = 1_000_000) -> None:
        self.now_ms = now_ms

    def __call__(self) -> int:
        return self.now_ms


@pytest.fixture
def log_dir(tmp_path):
    return str(tmp_path / "orders-0")


def open_log(log_dir, config=SMALL, **kwargs) -> Log:
    return Log.open(log_dir, config, **kwargs)


# -- appending -------------------------------------------------------------
def test_append_assigns_contiguous_offsets_and_stamps_epoch(log_dir):
    log = open_log(log_dir)
    first = log.append(make_batch(3), leader_epoch=5)
    second = log.append(make_batch(2), leader_epoch=5)
    assert (first.base_offset, first.last_offset, first.record_count) == (0, 2, 3)
    assert (second.base_offset, second.last_offset) == (3, 4)
    assert log.log_end_offset == 5
    data = log.read(0, 10_000)
    headers = [h for h, _ in fmt.iter_batches(data)]
    assert [(h.base_offset, h.partition_leader_epoch) for h in headers] == [(0, 5), (3, 5)]
    # Re-stamped batches still pass full validation (CRC untouched).
    fmt.validate_batches(data, strict=False)
    assert [r.offset for r in decode_batches(data)] == [0, 1, 2, 3, 4]
    log.check_invariants()


def test_append_of_several_batches_in_one_request(log_dir):
    log = open_log(log_dir)
    info = log.append(make_batch(2) + make_batch(4) + make_batch(1), leader_epoch=0)
    assert (info.base_offset, info.last_offset, info.record_count) == (0, 6, 7)
    assert [r.offset for r in read_all(log)] == list(range(7))


@pytest.mark.parametrize("corrupt", ["crc", "truncated", "too_large"])
def test_bad_batch_in_a_request_appends_nothing(log_dir, corrupt):
    log = open_log(log_dir, LogConfig(max_message_bytes=400, flush_ms=-1))
    log.append(make_batch(2), leader_epoch=0)
    good = make_batch(2)
    if corrupt == "crc":
        bad = bytearray(make_batch(2))
        bad[-1] ^= 0xFF
        error = CorruptRecordError
    elif corrupt == "truncated":
        bad = make_batch(2)[:-5]
        error = CorruptRecordError
    else:
        bad = make_batch(5, value_bytes=200)
        error = RecordTooLargeError
    size_before = log.size_bytes
    with pytest.raises(error):
        log.append(good + bytes(bad), leader_epoch=0)
    assert log.log_end_offset == 2
    assert log.size_bytes == size_before == os.path.getsize(log.active_segment.log_path)
    log.check_invariants()


def test_follower_append_keeps_offsets_and_learns_epochs(tmp_path):
    leader = open_log(str(tmp_path / "t-0"))
    leader.append(make_batch(2), leader_epoch=1)
    leader.append(make_batch(3), leader_epoch=4)
    follower = open_log(str(tmp_path / "f-0"))
    follower.append_as_follower(leader.read(0, 100_000))
    assert follower.log_end_offset == 5
    assert follower.epoch_cache.entries == [(1, 0), (4, 2)]
    assert follower.read(0, 100_000) == leader.read(0, 100_000)


def test_follower_append_takes_a_gap_but_refuses_an_overlap(tmp_path):
    """A compacted leader's log has gaps, so a batch may start past the
    follower's end (as in Kafka); one starting below it is refused."""
    leader = open_log(str(tmp_path / "t-0"))
    leader.append(make_batch(2), leader_epoch=1)
    leader.append(make_batch(2), leader_epoch=1)
    leader.append(make_batch(2), leader_epoch=1)
    follower = open_log(str(tmp_path / "f-0"))
    follower.append_as_follower(leader.read(2, 100_000, upper_bound_offset=4))
    assert follower.log_end_offset == 4
    with pytest.raises(InvalidOffsetError):
        follower.append_as_follower(leader.read(2, 100_000))
    assert follower.log_end_offset == 4
    follower.check_invariants()


# -- rolling ---------------------------------------------------------------
def test_rolls_by_size_and_reads_across_segments(log_dir):
    log = open_log(log_dir)
    for _ in range(40):
        log.append(make_batch(3), leader_epoch=0)
    assert len(log.segments) > 3
    for segment in log.segments:
        assert segment.size_bytes <= SMALL.segment_bytes
    assert [r.offset for r in read_all(log)] == list(range(120))
    assert sorted(os.listdir(log_dir))[0] == "00000000000000000000.index"
    log.check_invariants()


def test_rolls_by_segment_ms_measured_on_record_timestamps(log_dir):
    log = open_log(log_dir, LogConfig(segment_ms=1000, flush_ms=-1))
    log.append(make_batch(1, timestamp_ms=10_000), leader_epoch=0)
    log.append(make_batch(1, timestamp_ms=10_900), leader_epoch=0)
    assert len(log.segments) == 1
    log.append(make_batch(1, timestamp_ms=11_001), leader_epoch=0)
    assert [s.base_offset for s in log.segments] == [0, 2]


# -- reading ---------------------------------------------------------------
def test_read_out_of_range_raises_and_end_is_empty(log_dir):
    log = open_log(log_dir)
    log.append(make_batch(3), leader_epoch=0)
    assert log.read(3, 1000) == b""
    with pytest.raises(OffsetOutOfRangeError) as info:
        log.read(4, 1000)
    assert info.value.code == "OFFSET_OUT_OF_RANGE"
    with pytest.raises(OffsetOutOfRangeError):
        log.read(-1, 1000)


def test_read_mid_batch_returns_the_whole_batch(log_dir):
    log = open_log(log_dir)
    log.append(make_batch(5), leader_epoch=0)
    assert [r.offset for r in decode_batches(log.read(3, 1000))] == [0, 1, 2, 3, 4]


def test_read_respects_max_bytes_but_returns_one_batch_at_least(log_dir):
    log = open_log(log_dir)
    for _ in range(5):
        log.append(make_batch(3), leader_epoch=0)
    batch_size = len(make_batch(3))
    assert len(log.read(0, 1)) == batch_size
    assert log.read(0, 1, min_one_batch=False) == b""
    assert len(log.read(0, 2 * batch_size + 10)) == 2 * batch_size


def test_read_never_returns_a_batch_reaching_the_upper_bound(log_dir):
    log = open_log(log_dir)
    for _ in range(4):
        log.append(make_batch(3), leader_epoch=0)
    # Upper bound (high watermark) 7 lies inside batch 6..8: only 0..5 visible.
    assert [r.offset for r in decode_batches(log.read(0, 10**6, upper_bound_offset=7))] == \
        list(range(6))
    assert log.read(6, 10**6, upper_bound_offset=7) == b""
    assert log.read(0, 10**6, upper_bound_offset=0) == b""


def test_offset_for_timestamp_finds_first_record_at_or_after(log_dir):
    log = open_log(log_dir)
    for i in range(30):
        log.append(make_batch(2, timestamp_ms=1_000 + 10 * i), leader_epoch=0)
    assert log.offset_for_timestamp(0) == 0
    assert log.offset_for_timestamp(1_000) == 0
    assert log.offset_for_timestamp(1_001) == 2
    assert log.offset_for_timestamp(1_150) == 30
    assert log.offset_for_timestamp(1_290) == 58
    assert log.offset_for_timestamp(1_291) is None


# -- truncation --------------------------------------------------------------
def test_truncate_to_across_segments_and_mid_batch(log_dir):
    log = open_log(log_dir)
    for epoch in range(30):
        log.append(make_batch(3), leader_epoch=epoch // 10)
    log.truncate_to(40)  # batch 39..41 holds 40: it goes whole
    assert log.log_end_offset == 39
    assert [r.offset for r in read_all(log)] == list(range(39))
    assert log.epoch_cache.entries == [(0, 0), (1, 30)]
    log.append(make_batch(1), leader_epoch=3)
    assert log.log_end_offset == 40
    log.check_invariants()


def test_truncate_to_segment_boundary_and_to_zero(log_dir):
    log = open_log(log_dir)
    for _ in range(30):
        log.append(make_batch(3), leader_epoch=0)
    boundary = log.segments[2].base_offset
    log.truncate_to(boundary)
    assert log.log_end_offset == boundary
    log.check_invariants()
    log.truncate_to(0)
    assert log.log_end_offset == 0 and log.size_bytes == 0
    assert log.epoch_cache.entries == []
    log.check_invariants()


def test_truncate_fully_and_start_at(log_dir):
    log = open_log(log_dir)
    log.append(make_batch(3), leader_epoch=2)
    log.truncate_fully_and_start_at(100)
    assert (log.log_start_offset, log.log_end_offset) == (100, 100)
    assert log.append(make_batch(1), leader_epoch=3).base_offset == 100
    log.close()
    reopened = open_log(log_dir, log_start_offset=100, clean_shutdown=True)
    assert (reopened.log_start_offset, reopened.log_end_offset) == (100, 101)
    assert reopened.epoch_cache.entries == [(3, 100)]


# -- log start and retention ------------------------------------------------
def test_delete_records_before_moves_log_start_and_drops_segments(log_dir):
    log = open_log(log_dir)
    for _ in range(30):
        log.append(make_batch(3), leader_epoch=0)
    segments_before = len(log.segments)
    assert log.delete_records_before(50) == 50
    assert log.log_start_offset == 50
    assert len(log.segments) < segments_before
    with pytest.raises(OffsetOutOfRangeError):
        log.read(49, 100)
    assert read_all(log)[0].offset == 50
    with pytest.raises(OffsetOutOfRangeError):
        log.delete_records_before(91)
    assert log.delete_records_before(90) == 90  # everything: the log stays usable
    assert log.size_bytes == 0
    assert log.append(make_batch(1), leader_epoch=0).base_offset == 90
    log.check_invariants()


def test_retention_by_time_deletes_old_segments_only_below_the_bound(log_dir):
    clock = FakeClock(100_000)
    log = open_log(log_dir, LogConfig(segment_bytes=2048, retention_ms=10_000, flush_ms=-1),
                   clock=clock)
    for i in range(30):
        log.append(make_batch(3, timestamp_ms=50_000 + i), leader_epoch=0)
    for i in range(30):
        log.append(make_batch(3, timestamp_ms=95_000 + i), leader_epoch=0)
    old_segments = [s for s in log.segments if s.max_timestamp < 90_000]
    assert old_segments
    # An upper bound (high watermark) at offset 10 protects everything above.
    assert log.delete_retained_segments(upper_bound_offset=10) == 0
    deleted = log.delete_retained_segments()
    assert deleted == len(old_segments)
    assert log.log_start_offset == log.segments[0].base_offset
    assert all(r.timestamp >= 95_000 or r.offset >= log.log_start_offset for r in read_all(log))
    log.check_invariants()


def test_retention_by_time_can_empty_the_log(log_dir):
    clock = FakeClock(100_000)
    log = open_log(log_dir, LogConfig(retention_ms=1_000, flush_ms=-1), clock=clock)
    log.append(make_batch(3, timestamp_ms=1_000), leader_epoch=0)
    assert log.delete_retained_segments() == 1
    assert (log.log_start_offset, log.log_end_offset, log.size_bytes) == (3, 3, 0)
    log.check_invariants()


def test_retention_by_size_keeps_the_log_under_the_limit(log_dir):
    config = LogConfig(segment_bytes=2048, retention_bytes=5000, retention_ms=-1, flush_ms=-1)
    log = open_log(log_dir, config)
    for _ in range(60):
        log.append(make_batch(3), leader_epoch=0)
    total = log.size_bytes
    deleted = log.delete_retained_segments()
    assert deleted > 0
    assert log.size_bytes <= 5000 + config.segment_bytes
    assert log.size_bytes < total
    # Deleting one more segment would have gone under the limit needlessly.
    assert log.size_bytes - log.segments[0].size_bytes < 5000
    log.check_invariants()


# -- epochs ------------------------------------------------------------------
def test_end_offset_for_epoch_follows_kip_279(log_dir):
    log = open_log(log_dir)
    log.append(make_batch(3), leader_epoch=1)
    log.append(make_batch(3), leader_epoch=3)
    log.append(make_batch(3), leader_epoch=3)
    assert log.end_offset_for_epoch(3) == (3, 9)
    assert log.end_offset_for_epoch(2) == (1, 3)
    assert log.end_offset_for_epoch(1) == (1, 3)
    assert log.end_offset_for_epoch(0) == (-1, -1)


# -- flushing --------------------------------------------------------------
def test_flush_policy_by_messages_and_by_time(log_dir):
    """flush.messages is met inside the append that reaches it (Kafka's
    rule: the append fsyncs before it returns); flush.ms is the background
    flush's to meet."""
    clock = FakeClock()
    log = open_log(log_dir, LogConfig(flush_messages=5, flush_ms=1_000), clock=clock)
    assert not log.flush_due()
    log.append(make_batch(3), leader_epoch=0)
    assert not log.flush_due() and log.recovery_point == 0
    log.append(make_batch(2), leader_epoch=0)
    assert log.recovery_point == 5 and not log.flush_due()
    log.append(make_batch(1), leader_epoch=0)
    clock.now_ms += 999
    assert not log.flush_due()
    clock.now_ms += 1
    assert log.flush_due()


def test_flush_messages_1_fsyncs_every_append_before_it_returns(log_dir, monkeypatch):
    """The fsyncs themselves, not only the recovery point: the segment's
    file before the append returns, and after a roll its directory (the new
    segment's name) too."""
    synced: list[str] = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (
        synced.append(os.readlink(f"/proc/self/fd/{fd}")), real_fsync(fd)))
    log = open_log(log_dir, LogConfig(flush_messages=1))
    log.append(make_batch(3), leader_epoch=0)
    assert log.recovery_point == 3
    assert log.active_segment.log_path in synced
    follower = open_log(os.path.join(log_dir, "follower"), LogConfig(flush_messages=1))
    synced.clear()
    follower.append_as_follower(log.read(0, 1 << 20))
    assert follower.recovery_point == 3 and follower.active_segment.log_path in synced
    log.roll()
    synced.clear()
    log.append(make_batch(1), leader_epoch=0)
    assert log.active_segment.log_path in synced and log_dir in synced


def test_flush_ticket_syncs_on_another_thread_while_appending(log_dir):
    log = open_log(log_dir)
    for _ in range(10):
        log.append(make_batch(3), leader_epoch=0)
    ticket = log.begin_flush()
    worker = threading.Thread(target=ticket.sync)
    worker.start()
    for _ in range(10):
        log.append(make_batch(3), leader_epoch=0)
    worker.join(timeout=30)
    assert not worker.is_alive()
    log.end_flush(ticket)
    assert log.recovery_point == 30  # what the ticket covered, not the appends after it
    log.check_invariants()


# -- restart and recovery ---------------------------------------------------
def fill(log, batches: int, epoch: int = 0) -> None:
    for _ in range(batches):
        log.append(make_batch(3), leader_epoch=epoch)


def test_clean_restart_keeps_everything(log_dir):
    log = open_log(log_dir)
    fill(log, 30, epoch=2)
    expected = read_all(log)
    log.close()
    reopened = open_log(log_dir, clean_shutdown=True)
    assert read_all(reopened) == expected
    assert reopened.recovery_point == reopened.log_end_offset == 90
    assert reopened.epoch_cache.entries == [(2, 0)]
    reopened.check_invariants()


def test_torn_tail_is_truncated_and_logged(log_dir, caplog):
    log = open_log(log_dir)
    fill(log, 10)
    log.flush()
    flushed = log.recovery_point
    fill(log, 3)
    path = log.active_segment.log_path
    log.abandon()
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) - 7)  # cut the last batch in half
    with caplog.at_level(logging.WARNING):
        reopened = open_log(log_dir, recovery_point=flushed)
    assert reopened.log_end_offset == 36
    assert "truncating" in caplog.text and "torn or corrupt" in caplog.text
    assert [r.offset for r in read_all(reopened)] == list(range(36))
    reopened.check_invariants()


def test_corrupt_byte_in_unflushed_data_truncates_there(log_dir):
    log = open_log(log_dir)
    fill(log, 10)
    log.flush()
    flushed = log.recovery_point
    fill(log, 10)
    segment = log.active_segment
    pos = segment.find_batch(45)[0]
    path = segment.log_path
    log.abandon()
    with open(path, "r+b") as f:
        f.seek(pos + fmt.HEADER_SIZE + 2)
        byte = f.read(1)
        f.seek(pos + fmt.HEADER_SIZE + 2)
        f.write(bytes([byte[0] ^ 0x40]))
    reopened = open_log(log_dir, recovery_point=flushed)
    assert reopened.log_end_offset == 45
    assert reopened.recovery_point == 45  # what recovery kept is now fsynced
    reopened.check_invariants()


def test_corruption_deletes_later_segments(log_dir):
    log = open_log(log_dir)
    fill(log, 40)
    segments = log.segments
    assert len(segments) >= 3
    victim = segments[1]
    log.abandon()
    with open(victim.log_path, "r+b") as f:
        f.seek(fmt.HEADER_SIZE + 1)
        f.write(b"\xff\xff")
    reopened = open_log(log_dir, recovery_point=0)
    assert reopened.log_end_offset == victim.base_offset
    assert len(reopened.segments) == 2  # segment 0, and the emptied victim
    assert [r.offset for r in read_all(reopened)] == list(range(victim.base_offset))
    reopened.check_invariants()


def test_unclean_restart_validates_only_unflushed_batches(log_dir, monkeypatch):
    log = open_log(log_dir, LogConfig(segment_bytes=64 * 1024, flush_ms=-1))
    fill(log, 300)
    log.flush()
    flushed = log.recovery_point
    fill(log, 5)
    log.abandon()
    checked = []
    real_crc = fmt.compute_crc

    def counting_crc(buf, start, end):
        checked.append(end - start)
        return real_crc(buf, start, end)

    monkeypatch.setattr(fmt, "compute_crc", counting_crc)
    reopened = open_log(log_dir, LogConfig(segment_bytes=64 * 1024, flush_ms=-1),
                        recovery_point=flushed)
    assert reopened.log_end_offset == flushed + 15
    assert len(checked) == 5  # the unflushed batches, not the 300 flushed ones


def test_stale_index_files_are_rebuilt(log_dir):
    log = open_log(log_dir)
    fill(log, 12)
    log.close()
    index_path = log.segments[0].offset_index.path
    with open(index_path, "r+b") as f:
        f.truncate(5)  # not a whole number of entries
    reopened = open_log(log_dir, clean_shutdown=True)
    assert [r.offset for r in read_all(reopened)] == list(range(36))
    reopened.check_invariants()


def test_epoch_cache_survives_restart_and_follows_recovery(log_dir):
    log = open_log(log_dir)
    fill(log, 5, epoch=1)
    log.flush()
    flushed = log.recovery_point
    fill(log, 5, epoch=2)
    path = log.active_segment.log_path
    log.abandon()
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) - 3)
    reopened = open_log(log_dir, recovery_point=flushed)
    assert reopened.log_end_offset == 27
    assert reopened.epoch_cache.entries == [(1, 0), (2, 15)]
    reopened.truncate_to(15)
    assert reopened.epoch_cache.entries == [(1, 0)]


def test_a_new_epochs_checkpoint_is_written_by_the_next_flush_and_relearned_if_lost(log_dir):
    """Becoming leader writes no file: the next flush writes the epoch
    checkpoint durably (on its thread) before the recovery point passes the
    epoch, and an entry a crash loses is learned again from the batches
    recovery re-reads."""
    log = open_log(log_dir)
    checkpoint = os.path.join(log_dir, "leader-epoch-checkpoint")
    fill(log, 5, epoch=1)
    log.flush()
    flushed = log.recovery_point
    with open(checkpoint, "rb") as f:
        durable = f.read()  # what a crash from here on leaves, at worst
    assert durable.split(b"\n")[2:] == [b"1 0", b""]
    fill(log, 5, epoch=2)
    with open(checkpoint, "rb") as f:
        assert f.read() == durable  # nothing written on the append path
    ticket = log.begin_flush()
    assert ticket.epoch_write is not None
    log.end_flush(ticket)  # (not synced: a crash before the sync loses epoch 2's entry)
    fill(log, 5, epoch=3)
    log.abandon()
    reopened = open_log(log_dir, recovery_point=flushed)
    assert reopened.epoch_cache.entries == [(1, 0), (2, 15), (3, 30)]
    assert reopened.end_offset_for_epoch(2) == (2, 30)


def test_the_flush_writes_the_epoch_checkpoint_and_never_over_a_newer_truncation(log_dir):
    log = open_log(log_dir)
    checkpoint = os.path.join(log_dir, "leader-epoch-checkpoint")
    fill(log, 5, epoch=1)
    fill(log, 5, epoch=2)
    ticket = log.begin_flush()
    ticket.sync()
    log.end_flush(ticket)
    with open(checkpoint, "rb") as f:
        assert f.read().split(b"\n")[2:] == [b"1 0", b"2 15", b""]
    assert log.begin_flush().epoch_write is None  # nothing new to write
    fill(log, 5, epoch=3)
    stale = log.begin_flush()  # holds [(1, 0), (2, 15), (3, 30)]
    log.truncate_to(20)  # written at once: [(1, 0), (2, 15)]
    stale.sync()  # taken before the truncation: must not bring epoch 3 back
    with open(checkpoint, "rb") as f:
        assert f.read().split(b"\n")[2:] == [b"1 0", b"2 15", b""]
    log.close()
    assert open_log(log_dir, clean_shutdown=True).epoch_cache.entries == [(1, 0), (2, 15)]


def test_a_flush_fsyncs_the_log_directory_once_for_new_files_and_the_epoch_checkpoint(
        log_dir, monkeypatch):
    """A new log's first flush makes its new segment files' names and its
    epoch checkpoint's durable with one fsync of the directory (10,000 new
    partitions' first flushes: 10,000 fsyncs fewer); a flush with no new
    file still makes the checkpoint's name durable itself. Either way the
    checkpoint's name is synced after it was written."""
    import storage.checkpoint as checkpoint_module
    import storage.log as log_module

    log = open_log(log_dir)
    synced = []
    for module in (checkpoint_module, log_module):
        real = module.fsync_directory
        monkeypatch.setattr(module, "fsync_directory", lambda path, real=real: (
            synced.append(os.path.exists(os.path.join(path, "leader-epoch-checkpoint"))),
            real(path))[1])
    fill(log, 5, epoch=1)
    ticket = log.begin_flush()
    assert ticket.directory is not None and ticket.epoch_write is not None
    ticket.sync()
    log.end_flush(ticket)
    assert synced == [True]
    fill(log, 5, epoch=2)  # a new epoch, no new file
    synced.clear()
    ticket = log.begin_flush()
    assert ticket.directory is None and ticket.epoch_write is not None
    ticket.sync()
    log.end_flush(ticket)
    assert synced == [True]
    log.close()
    assert open_log(log_dir, clean_shutdown=True).epoch_cache.entries == [(1, 0), (2, 15)]


def test_unreadable_epoch_checkpoint_is_rebuilt_from_the_log(log_dir):
    log = open_log(log_dir)
    fill(log, 3, epoch=1)
    fill(log, 3, epoch=5)
    log.close()
    with open(os.path.join(log_dir, "leader-epoch-checkpoint"), "w") as f:
        f.write("0\n2\n5 9\n1 0\n")  # out of order
    reopened = open_log(log_dir, clean_shutdown=True)
    assert reopened.epoch_cache.entries == [(1, 0), (5, 9)]
    assert reopened.end_offset_for_epoch(1) == (1, 9)


def test_torn_index_entry_at_the_recovery_point_does_not_mislead_recovery(log_dir):
    # Power loss can keep an index entry written with unflushed data but tear
    # it. Recovery must derive the flushed end from flushed headers instead.
    config = LogConfig(segment_bytes=1 << 20, index_interval_bytes=0, flush_ms=-1)
    log = open_log(log_dir, config)
    fill(log, 10)
    log.flush()
    flushed = log.recovery_point
    fill(log, 3)
    segment = log.active_segment
    segment.write_index_entries()  # entries for the unflushed batches reach the file
    index_path = segment.offset_index.path
    log.abandon()
    from storage.index import OFFSET_ENTRY
    with open(index_path, "r+b") as f:
        entries = [OFFSET_ENTRY.unpack(chunk) for chunk in iter(lambda: f.read(8), b"")]
        i = next(n for n, (rel, _pos) in enumerate(entries) if rel == flushed)
        f.seek(i * OFFSET_ENTRY.size)
        f.write(OFFSET_ENTRY.pack(flushed, entries[i][1] + 5))  # torn position
    reopened = open_log(log_dir, config, recovery_point=flushed)
    assert reopened.log_end_offset == 39
    assert [r.offset for r in read_all(reopened)] == list(range(39))
    reopened.check_invariants()


def test_flush_ticket_never_vouches_for_data_written_after_a_truncation(log_dir):
    # A follower truncates while the flush thread is fsyncing, then appends
    # past the ticket's offset: those new bytes were never fsynced, so the
    # recovery point must not move over them.
    log = open_log(log_dir)
    fill(log, 10)
    ticket = log.begin_flush()  # covers offsets below 30
    log.truncate_to(15)
    fill(log, 10)  # log end 45: offsets 15..29 are new, unflushed bytes
    ticket.sync()
    log.end_flush(ticket)
    assert log.recovery_point <= 15
    log.flush()
    assert log.recovery_point == 45


def test_a_failed_write_leaves_offsets_and_epochs_unchanged_and_takes_the_log_offline(
        log_dir, monkeypatch):
    """A disk error (here ENOSPC) refuses the append with
    KAFKA_STORAGE_ERROR, tells the owner once, and leaves the log offline:
    every later read or write is refused, as its files may hold a torn
    write."""
    log = open_log(log_dir)
    fill(log, 2, epoch=1)
    told = []
    log.on_io_error = lambda exc, what: told.append((exc.errno, what))

    def disk_full(pieces, metas):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(log.active_segment, "append", disk_full)
    with pytest.raises(LogDirectoryError, match="No space left") as refused:
        log.append(make_batch(3), leader_epoch=2)
    assert refused.value.code == "KAFKA_STORAGE_ERROR"
    assert log.log_end_offset == 6
    assert log.epoch_cache.entries == [(1, 0)]
    assert told == [(28, "append")] and log.offline
    for call in (lambda: log.append(make_batch(3), leader_epoch=2),
                 lambda: log.read(0, 1 << 20), log.flush, lambda: log.truncate_to(3)):
        with pytest.raises(LogDirectoryError, match="offline"):
            call()
    assert told == [(28, "append")]
    log.close()  # closes the files without flushing
    assert log.closed


def test_index_files_appear_with_their_first_entry_and_a_lost_one_is_rebuilt(log_dir):
    """A new log is one file (its .log): a partition that is never written
    to holds one descriptor, not three. The index files are created when a
    flush first writes an entry, and a log whose index file a crash lost
    (created but its name not yet durable) reads exactly as before."""
    log = open_log(log_dir)
    files = {name for name in os.listdir(log_dir) if name.startswith("0000")}
    assert files == {"00000000000000000000.log"}
    fill(log, 4, epoch=1)  # past index_interval_bytes: entries in memory
    log.flush()
    files = {name for name in os.listdir(log_dir) if name.startswith("0000")}
    assert "00000000000000000000.index" in files and "00000000000000000000.timeindex" in files
    expected = read_all(log)
    log.abandon()
    os.unlink(os.path.join(log_dir, "00000000000000000000.index"))
    os.unlink(os.path.join(log_dir, "00000000000000000000.timeindex"))
    entries = len(log.segments[0].offset_index)
    assert entries > 0
    reopened = open_log(log_dir, recovery_point=log.recovery_point)
    assert read_all(reopened) == expected
    assert len(reopened.segments[0].offset_index) == entries  # rebuilt, not left empty
    assert reopened.offset_for_timestamp(0) is not None
    reopened.check_invariants()


def test_a_flush_that_creates_an_index_file_fsyncs_its_directory(log_dir):
    log = open_log(log_dir)
    fill(log, 1, epoch=1)
    log.flush()  # one small batch: no index entry, no index file yet
    assert not os.path.exists(log.segments[0].offset_index.path)
    fill(log, 3, epoch=1)
    ticket = log.begin_flush()
    assert os.path.exists(log.segments[0].offset_index.path)
    assert ticket.directory == log_dir  # the new file's name made durable
    ticket.sync()
    log.end_flush(ticket)


def test_a_flush_while_another_is_out_syncs_what_that_one_took(log_dir):
    """A ticket on the flush thread took the directory's new names and a
    producer snapshot; a flush() on the log's thread meanwhile (one that
    flush.messages asks for, before an acknowledgement) syncs them again
    instead of counting on the ticket still out. Once that ticket ends,
    later ones sync only what is new."""
    log = open_log(log_dir)
    log.append(make_batch(3), leader_epoch=0)
    log.roll()  # a new segment file's name and a producer snapshot to sync
    out = log.begin_flush()  # taken, not yet synced (the flush thread's)
    assert out.directory == log.directory and out.files
    log.append(make_batch(1), leader_epoch=0)
    meanwhile = log.begin_flush()
    assert meanwhile.directory == log.directory
    assert set(out.files) <= set(meanwhile.files)
    meanwhile.sync()
    log.end_flush(meanwhile)
    out.sync()
    log.end_flush(out)
    log.append(make_batch(1), leader_epoch=0)
    after = log.begin_flush()
    assert after.directory is None and after.files == []
    log.close()


def test_an_epoch_write_taken_before_its_log_let_go_never_lands_after(log_dir):
    """A flush ticket's leader-epoch write runs on the flush thread; if the
    log was deleted meanwhile and a new one made at the same path (the topic
    recreated), the old write must not land in the new log's file."""
    log = open_log(log_dir)
    log.append(make_batch(2), leader_epoch=7)
    ticket = log.begin_flush()
    assert ticket.epoch_write is not None
    log.abandon()  # as deleting it does
    path = os.path.join(log_dir, "leader-epoch-checkpoint")
    with open(path, "w") as f:
        f.write("the new log's\n")
    ticket.epoch_write()
    with open(path) as f:
        assert f.read() == "the new log's\n"


def test_reads_near_the_end_find_the_batch_a_walk_of_the_headers_finds(log_dir):
    """A segment remembers where its latest batches start, so a read at the
    log end skips the walk from the last index entry: at every offset it
    finds the batch that walk finds, while appending, after truncations,
    across a roll and after a restart."""
    config = LogConfig(segment_bytes=64 * 1024, index_interval_bytes=4096, flush_ms=-1)
    log = open_log(log_dir, config)

    def agree() -> None:
        for segment in log.segments:
            walked = list(segment.iter_batch_headers())
            for offset in range(segment.base_offset, segment.next_offset + 3):
                expected = next(((pos, h) for pos, h in walked if h.last_offset >= offset), None)
                assert segment.find_batch(offset) == expected, (segment, offset)

    def append(batches: int) -> None:
        for i in range(batches):
            log.append(make_batch(1 + i % 3, value_bytes=5), leader_epoch=0)

    append(100)
    agree()
    log.truncate_to(log.log_end_offset - 7)  # into the remembered batches
    agree()
    append(5)
    agree()
    log.truncate_to(log.log_end_offset - 150)  # past them
    agree()
    append(40)
    log.roll()
    append(30)
    agree()
    log.close()
    log = open_log(log_dir, config)
    agree()
    append(30)
    agree()
    assert read_all(log)[-1].offset == log.log_end_offset - 1


def test_a_log_opened_where_nothing_was_is_fresh_and_reopened_is_not(log_dir, monkeypatch):
    """``Log.open`` making the directory reads nothing from it (there is
    nothing: not even a leader-epoch checkpoint is looked for), and says so
    (``fresh``: the broker then writes the topic id without looking for
    one); the same log opened again reads what it wrote, its epochs too,
    and is not fresh."""
    from storage.checkpoint import LeaderEpochCheckpoint

    reads = []
    real_read = LeaderEpochCheckpoint.read
    monkeypatch.setattr(LeaderEpochCheckpoint, "read",
                        lambda self: (reads.append(self.path), real_read(self))[1])
    log = open_log(log_dir)
    assert log.fresh and log.log_end_offset == 0 and reads == []
    fill(log, 3)
    epochs = log.epoch_cache.entries
    assert epochs
    log.close()
    again = open_log(log_dir)
    assert not again.fresh and again.log_end_offset == 9
    assert len(reads) == 1 and again.epoch_cache.entries == epochs
    assert [r.offset for r in read_all(again)] == list(range(9))
    again.close()
    os.makedirs(log_dir + "-empty")  # made by someone else: looked at, not fresh
    assert not open_log(log_dir + "-empty").fresh


def test_bytes_between_counts_what_a_read_would_return_without_reading_it(log_dir):
    """A waiting fetch asks how many bytes a read would bring at every
    append; the answer from positions is the length of that read, for every
    start and upper bound, across segments, near the end and far from it
    (a restarted log has no recent batches in memory), after a truncation
    and new batches in its place, and refuses the offsets a read refuses."""
    config = LogConfig(segment_bytes=2048, index_interval_bytes=256, flush_ms=-1)
    log = open_log(log_dir, config)

    def agree() -> None:
        end = log.log_end_offset
        for offset in range(log.log_start_offset, end + 1):
            for upper in range(offset - 1, end + 2, 3):
                expected = len(log.read(offset, 10**9, upper_bound_offset=upper))
                assert log.bytes_between(offset, upper) == expected, (offset, upper)

    for i in range(60):
        log.append(make_batch(1 + i % 4, value_bytes=7), leader_epoch=0)
    assert len(log.segments) > 3
    agree()
    log.truncate_to(log.log_end_offset - 5)
    agree()
    for i in range(6):  # other batch boundaries where the truncated ones were
        log.append(make_batch(5 - i % 4, value_bytes=3), leader_epoch=0)
    agree()
    # Positions found by a walk are kept; a truncation forgets them.
    single = open_log(log_dir + "-single", LogConfig(index_interval_bytes=256, flush_ms=-1))
    for _ in range(30):
        single.append(make_batch(1, value_bytes=7), leader_epoch=0)
    walked = {o: single.bytes_between(o, 30) for o in range(30)}
    single.truncate_to(10)
    for _ in range(30):  # past what the segment remembers of its latest batches
        single.append(make_batch(3, value_bytes=1), leader_epoch=0)
    for offset in range(10, 100):
        assert single.bytes_between(offset, 100) == len(single.read(offset, 10**9)), offset
    assert walked[11] != single.bytes_between(11, 30)
    log.close()
    log = open_log(log_dir, config)
    agree()
    log.delete_records_before(20)
    agree()
    with pytest.raises(OffsetOutOfRangeError):
        log.bytes_between(log.log_end_offset + 1, log.log_end_offset + 1)
    with pytest.raises(OffsetOutOfRangeError):
        log.bytes_between(log.log_start_offset - 1, log.log_end_offset)
