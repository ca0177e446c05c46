"""Transactions in the partition log: open transactions and the last stable
offset, markers, the aborted-transaction index, and all of it surviving
crash, clean close, truncation, replication and retention."""

from __future__ import annotations

import pytest

from storage.batch import BatchBuilder, ControlType, InvalidRecordError, build_control_batch
from storage.config import LogConfig
from storage.errors import (InvalidProducerEpochError, InvalidTxnStateError,
                            TransactionCoordinatorFencedError)
from storage.log import Log
from storage.txn_index import AbortedTxn
from tests.helpers import make_batch

SMALL = LogConfig(segment_bytes=2048, index_interval_bytes=128, flush_ms=-1)
ABORT, COMMIT = ControlType.ABORT, ControlType.COMMIT


def txn_batch(pid: int, epoch: int, seq: int, count: int = 2, *, transactional: bool = True
              ) -> bytes:
    builder = BatchBuilder(producer_id=pid, producer_epoch=epoch, base_sequence=seq,
                           transactional=transactional)
    for i in range(count):
        builder.append(None, f"p{pid}-{seq + i}".encode().ljust(60, b"."), timestamp_ms=1_000)
    return builder.build()


@pytest.fixture
def log(tmp_path):
    return Log.open(str(tmp_path / "t-0"), SMALL)


def shape(log: Log) -> tuple:
    return (dict(log.producer_state.ongoing), log.first_unstable_offset,
            log.aborted_txns.entries)


def test_an_open_transaction_holds_the_lso_until_its_marker(log):
    log.append(make_batch(2), leader_epoch=0)                       # 0-1
    log.append(txn_batch(7, 0, 0), leader_epoch=0)                  # 2-3
    log.append(txn_batch(8, 0, 0), leader_epoch=0)                  # 4-5
    log.append(txn_batch(7, 0, 2), leader_epoch=0)                  # 6-7
    assert log.first_unstable_offset == 2
    assert log.append_marker(COMMIT, 7, 0, 0, leader_epoch=0).base_offset == 8
    assert log.first_unstable_offset == 4
    log.append_marker(ABORT, 8, 0, 0, leader_epoch=0)               # 9
    assert log.first_unstable_offset is None
    assert log.aborted_txns.entries == [AbortedTxn(8, 4, 9, 10)]
    log.check_invariants()


def test_aborted_transactions_are_collected_for_overlapping_reads(log):
    log.append(txn_batch(7, 0, 0), leader_epoch=0)                  # 0-1
    log.append(txn_batch(8, 0, 0), leader_epoch=0)                  # 2-3
    log.append_marker(ABORT, 7, 0, 0, leader_epoch=0)               # 4
    log.append(make_batch(2), leader_epoch=0)                       # 5-6
    log.append_marker(ABORT, 8, 0, 0, leader_epoch=0)               # 7
    log.append(txn_batch(9, 0, 0), leader_epoch=0)                  # 8-9
    log.append_marker(ABORT, 9, 0, 0, leader_epoch=0)               # 10
    assert log.aborted_txns.entries == [AbortedTxn(7, 0, 4, 2), AbortedTxn(8, 2, 7, 8),
                                        AbortedTxn(9, 8, 10, 11)]
    assert [e.producer_id for e in log.collect_aborted(0, 11)] == [7, 8, 9]
    assert [e.producer_id for e in log.collect_aborted(5, 7)] == [8]
    assert [e.producer_id for e in log.collect_aborted(0, 1)] == [7]
    assert log.collect_aborted(11, 20) == []


def test_transaction_rules_refuse_and_append_nothing(log):
    log.append(txn_batch(7, 1, 0), leader_epoch=0)
    with pytest.raises(InvalidTxnStateError):
        log.append(txn_batch(7, 1, 2, transactional=False), leader_epoch=0)
    with pytest.raises(InvalidRecordError, match="transaction coordinator"):
        log.append(build_control_batch(COMMIT, 7, 1, 0, 1_000), leader_epoch=0)
    with pytest.raises(InvalidProducerEpochError):
        log.append_marker(COMMIT, 7, 0, 0, leader_epoch=0)
    log.append_marker(COMMIT, 7, 1, 5, leader_epoch=0)
    log.append(txn_batch(7, 1, 2), leader_epoch=0)
    with pytest.raises(TransactionCoordinatorFencedError):
        log.append_marker(COMMIT, 7, 1, 4, leader_epoch=0)
    assert log.log_end_offset == 5 and log.first_unstable_offset == 3
    log.check_invariants()


def test_a_coordinator_abort_with_a_bumped_epoch_fences_the_old_producer(log):
    log.append(txn_batch(7, 0, 0), leader_epoch=0)
    log.append_marker(ABORT, 7, 1, 0, leader_epoch=0)  # timed out: the epoch is bumped
    with pytest.raises(InvalidProducerEpochError):
        log.append(txn_batch(7, 0, 2), leader_epoch=0)  # the zombie


def busy(log: Log) -> None:
    """Several segments with committed, aborted and still open transactions."""
    for round_no in range(6):
        log.append(txn_batch(7, 0, round_no * 2), leader_epoch=0)
        log.append(txn_batch(8, 0, round_no * 2), leader_epoch=0)
        log.append(make_batch(1), leader_epoch=0)
        log.append_marker(COMMIT if round_no % 2 else ABORT, 7, 0, 0, leader_epoch=0)
        if round_no < 5:
            log.append_marker(ABORT if round_no % 2 else COMMIT, 8, 0, 0, leader_epoch=0)
    # Producer 8's last transaction stays open.


def test_transactions_survive_a_crash_and_a_clean_close(tmp_path):
    directory = str(tmp_path / "t-0")
    log = Log.open(directory, SMALL)
    busy(log)
    assert len(log.segments) > 2
    before = shape(log)
    assert before[1] is not None and len(before[2]) == 5
    log.flush()
    log.abandon()
    crashed = Log.open(directory, SMALL, recovery_point=0)
    assert shape(crashed) == before
    crashed.close()
    clean = Log.open(directory, SMALL, clean_shutdown=True)
    assert shape(clean) == before
    clean.check_invariants()


def test_truncation_reopens_a_transaction_whose_marker_is_cut(log):
    log.append(txn_batch(7, 0, 0), leader_epoch=0)                  # 0-1
    log.append_marker(ABORT, 7, 0, 0, leader_epoch=0)               # 2
    log.append(txn_batch(8, 0, 0), leader_epoch=0)                  # 3-4
    log.append_marker(ABORT, 8, 0, 0, leader_epoch=0)               # 5
    log.truncate_to(5)
    assert shape(log) == ({8: 3}, 3, [AbortedTxn(7, 0, 2, 3)])
    log.truncate_to(2)
    assert shape(log) == ({7: 0}, 0, [])
    log.check_invariants()


def test_a_follower_builds_the_same_transactions_and_index(tmp_path):
    leader = Log.open(str(tmp_path / "l-0"), SMALL)
    follower = Log.open(str(tmp_path / "f-0"), SMALL)
    busy(leader)
    while follower.log_end_offset < leader.log_end_offset:
        follower.append_as_follower(leader.read(follower.log_end_offset, 900))
    assert shape(follower) == shape(leader)
    follower.check_invariants()


def test_retention_drops_the_index_of_deleted_segments(log):
    busy(log)
    cut = log.segments[2].base_offset
    log.delete_records_before(cut)
    assert all(e.last_offset >= log.segments[0].base_offset for e in log.aborted_txns.entries)
    log.check_invariants()
