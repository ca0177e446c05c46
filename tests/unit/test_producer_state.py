"""Idempotent producer state: the leader's duplicate / sequence / epoch
rules, and the state surviving roll, clean close, crash, truncation,
retention and replication exactly as the log holds it."""

from __future__ import annotations

import os

import pytest

from storage import batch as fmt
from storage.batch import BatchBuilder, InvalidRecordError, with_producer
from storage.config import LogConfig
from storage.errors import InvalidProducerEpochError, OutOfOrderSequenceError
from storage.log import Log
from storage.producer_state import (BATCHES_KEPT, SEQUENCE_MAX, next_sequence,
                                    snapshot_offsets)
from tests.helpers import make_batch, read_all

SMALL = LogConfig(segment_bytes=2048, index_interval_bytes=128, flush_ms=-1)


def pbatch(pid: int, epoch: int, seq: int, count: int = 3, *, ts: int = 1_000,
           tag: str = "r") -> bytes:
    builder = BatchBuilder(producer_id=pid, producer_epoch=epoch, base_sequence=seq)
    for i in range(count):
        builder.append(None, f"{tag}{seq + i}".encode().ljust(40, b"."), timestamp_ms=ts)
    return builder.build()


@pytest.fixture
def log_dir(tmp_path):
    return str(tmp_path / "orders-0")


def state_of(log: Log) -> dict:
    return {e.producer_id: (e.epoch, e.last_seq, e.last_offset)
            for e in log.producer_state.producers.values()}


# -- the leader's rules ------------------------------------------------------------
def test_in_sequence_batches_append_and_a_retry_gets_the_original_offsets(log_dir):
    log = Log.open(log_dir, SMALL)
    first = log.append(pbatch(7, 0, 0), leader_epoch=1)
    second = log.append(pbatch(7, 0, 3), leader_epoch=1)
    assert (first.base_offset, second.base_offset) == (0, 3)
    retry = log.append(pbatch(7, 0, 0), leader_epoch=1)
    assert retry.duplicate and (retry.base_offset, retry.last_offset) == (0, 2)
    assert retry.record_count == 0 and log.log_end_offset == 6
    assert [r.value[:2] for r in read_all(log)] == [b"r0", b"r1", b"r2", b"r3", b"r4", b"r5"]
    log.check_invariants()


def test_only_the_last_five_batches_are_recognised_as_duplicates(log_dir):
    log = Log.open(log_dir, SMALL)
    for i in range(BATCHES_KEPT + 1):
        log.append(pbatch(7, 0, i * 2, count=2), leader_epoch=0)
    # The oldest fell out of the window: it is neither a duplicate nor next.
    with pytest.raises(OutOfOrderSequenceError):
        log.append(pbatch(7, 0, 0, count=2), leader_epoch=0)
    assert log.append(pbatch(7, 0, 2, count=2), leader_epoch=0).duplicate


def test_a_gap_in_the_sequence_is_refused_and_nothing_is_written(log_dir):
    log = Log.open(log_dir, SMALL)
    log.append(pbatch(7, 0, 0), leader_epoch=0)
    with pytest.raises(OutOfOrderSequenceError, match="expected 3"):
        log.append(pbatch(7, 0, 4), leader_epoch=0)
    assert log.log_end_offset == 3


def test_an_older_epoch_is_fenced_and_a_new_epoch_restarts_at_zero(log_dir):
    log = Log.open(log_dir, SMALL)
    log.append(pbatch(7, 0, 0), leader_epoch=0)
    log.append(pbatch(7, 1, 0), leader_epoch=0)
    with pytest.raises(InvalidProducerEpochError):
        log.append(pbatch(7, 0, 3), leader_epoch=0)
    with pytest.raises(OutOfOrderSequenceError, match="new epoch"):
        log.append(pbatch(7, 2, 5), leader_epoch=0)
    assert log.log_end_offset == 6
    assert state_of(log) == {7: (1, 2, 5)}


def test_an_unknown_producer_is_accepted_at_any_sequence(log_dir):
    # Its state may have gone with retention or expiry (KIP-360).
    log = Log.open(log_dir, SMALL)
    assert log.append(pbatch(9, 3, 1234), leader_epoch=0).base_offset == 0
    assert state_of(log) == {9: (3, 1236, 2)}


def test_sequences_wrap_past_int32_max():
    assert next_sequence(SEQUENCE_MAX) == 0
    assert next_sequence(SEQUENCE_MAX - 1, 3) == 1


def test_a_wrapping_batch_continues_at_zero(log_dir):
    log = Log.open(log_dir, SMALL)
    log.append(pbatch(7, 0, SEQUENCE_MAX - 1, count=2), leader_epoch=0)
    assert log.append(pbatch(7, 0, 0), leader_epoch=0).base_offset == 2


def test_malformed_idempotent_requests_are_refused(log_dir):
    log = Log.open(log_dir, SMALL)
    with pytest.raises(InvalidRecordError, match="travel alone"):
        log.append(pbatch(7, 0, 0) + pbatch(7, 0, 3), leader_epoch=0)
    with pytest.raises(InvalidRecordError, match="base sequence"):
        log.append(pbatch(7, 0, -1), leader_epoch=0)
    with pytest.raises(InvalidRecordError, match="producer epoch"):
        log.append(pbatch(7, -1, 0), leader_epoch=0)
    assert log.log_end_offset == 0 and state_of(log) == {}
    # Plain batches still travel together.
    assert log.append(make_batch(2) + make_batch(2), leader_epoch=0).last_offset == 3


def test_with_producer_restamps_a_built_batch_with_a_valid_crc():
    original = pbatch(7, 0, 10)
    restamped = with_producer(original, 8, 1, 0)
    header = fmt.validate_batches(restamped)[0][1]
    assert (header.producer_id, header.producer_epoch, header.base_sequence) == (8, 1, 0)
    assert restamped[fmt.HEADER_SIZE:] == original[fmt.HEADER_SIZE:]


# -- the state survives ------------------------------------------------------------
def fill(log: Log, batches: int = 12) -> None:
    """Interleave two producers and plain batches across several segments."""
    for i in range(batches):
        log.append(pbatch(7, 0, i * 3), leader_epoch=0)
        log.append(make_batch(2), leader_epoch=0)
        log.append(pbatch(8, 2, i * 3), leader_epoch=0)


def test_a_roll_takes_a_snapshot_and_a_clean_reopen_reads_no_batch(log_dir, monkeypatch):
    log = Log.open(log_dir, SMALL)
    fill(log)
    assert len(log.segments) > 2
    assert snapshot_offsets(log_dir)[:len(log.segments) - 1] == [
        s.base_offset for s in log.segments[1:]]
    before = state_of(log)
    log.close()
    assert snapshot_offsets(log_dir)[-1] == log.log_end_offset
    from storage.segment import Segment
    monkeypatch.setattr(Segment, "iter_batch_headers", lambda *a: pytest.fail("scanned"))
    reopened = Log.open(log_dir, SMALL, clean_shutdown=True)
    assert state_of(reopened) == before
    assert reopened.append(pbatch(7, 0, 33), leader_epoch=0).duplicate
    reopened.check_invariants()


def test_after_a_crash_the_state_is_the_newest_snapshot_plus_the_tail(log_dir):
    log = Log.open(log_dir, SMALL)
    fill(log)
    log.flush()
    before = state_of(log)
    log.abandon()
    reopened = Log.open(log_dir, SMALL, recovery_point=0)
    assert state_of(reopened) == before
    reopened.check_invariants()


def test_damaged_or_missing_snapshots_fall_back_to_reading_headers(log_dir):
    log = Log.open(log_dir, SMALL)
    fill(log)
    before = state_of(log)
    log.close()
    offsets = snapshot_offsets(log_dir)
    with open(os.path.join(log_dir, f"{offsets[-1]:020d}.snapshot"), "r+b") as f:
        f.seek(6)
        f.write(b"\xff\xff")  # a flipped byte: the CRC catches it
    for offset in offsets[:-1]:
        os.unlink(os.path.join(log_dir, f"{offset:020d}.snapshot"))
    reopened = Log.open(log_dir, SMALL, clean_shutdown=True)
    assert state_of(reopened) == before
    assert snapshot_offsets(log_dir) == []  # the damaged one is gone
    reopened.check_invariants()


def test_truncation_rebuilds_the_state_as_of_the_new_end(log_dir):
    log = Log.open(log_dir, SMALL)
    fill(log, 4)
    # Producer 7's batch at sequence 6 starts at offset 16.
    log.truncate_to(16)
    assert state_of(log) == {7: (0, 5, 10), 8: (2, 5, 15)}
    assert all(o <= 16 for o in snapshot_offsets(log_dir))
    assert log.append(pbatch(7, 0, 6), leader_epoch=1).base_offset == 16
    log.truncate_fully_and_start_at(100)
    assert state_of(log) == {} and snapshot_offsets(log_dir) == []
    log.check_invariants()


def test_followers_build_the_same_state_from_replicated_batches(tmp_path):
    leader = Log.open(str(tmp_path / "l-0"), SMALL)
    follower = Log.open(str(tmp_path / "f-0"), SMALL)
    fill(leader, 6)
    offset = 0
    while offset < leader.log_end_offset:
        data = leader.read(offset, 700)
        follower.append_as_follower(data)
        offset = follower.log_end_offset
    assert state_of(follower) == state_of(leader)
    # A new leader dedupes a retry the old one appended.
    assert follower.append(pbatch(8, 2, 15), leader_epoch=1).duplicate
    follower.check_invariants()


def test_retention_keeps_producers_and_drops_old_snapshots(log_dir):
    log = Log.open(log_dir, SMALL)
    fill(log)
    before = state_of(log)
    log.delete_records_before(log.segments[2].base_offset)
    assert state_of(log) == before
    assert min(snapshot_offsets(log_dir)) >= log.segments[0].base_offset
    log.check_invariants()


def test_producers_expire_after_their_last_batch_is_old_enough(log_dir):
    log = Log.open(log_dir, SMALL)
    log.append(pbatch(7, 0, 0, ts=1_000), leader_epoch=0)
    log.append(pbatch(8, 0, 0, ts=5_000), leader_epoch=0)
    assert log.producer_state.remove_expired(now_ms=7_000, expiration_ms=3_000) == [7]
    assert set(state_of(log)) == {8}
    # An expired producer is unknown: it may continue at any sequence.
    assert log.append(pbatch(7, 0, 3), leader_epoch=0).base_offset == 6


def test_the_log_manager_expires_silent_producers_in_every_log(tmp_path):
    from storage.manager import LogManager, LogManagerConfig, TopicPartition
    manager = LogManager(LogManagerConfig((str(tmp_path),), producer_id_expiration_ms=3_000),
                         SMALL, clock=lambda: 7_000)
    manager.startup()
    for partition, ts in ((0, 1_000), (1, 5_000)):
        log = manager.get_or_create_log(TopicPartition("t", partition))
        log.append(pbatch(7, 0, 0, ts=ts), leader_epoch=0)
    assert manager.expire_producers() == 1
    assert [state_of(manager.get_log(TopicPartition("t", p))) for p in (0, 1)] == [
        {}, {7: (0, 2, 2)}]
    manager.shutdown()
