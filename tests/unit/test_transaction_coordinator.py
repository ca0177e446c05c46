"""The transaction coordinator's pure core: Kafka's state machine, fencing,
timeouts, expiry, and state rebuilt from its own records."""

from __future__ import annotations

import pytest

from api.broker.transactions.coordinator import (EPOCH_MAX, TransactionCoordinatorCore,
                                                 TxnError, TxnMetadata, TxnState, decode,
                                                 encode)
from protocol import TopicPartition

T0, T1 = TopicPartition("orders", 0), TopicPartition("orders", 1)


def core() -> TransactionCoordinatorCore:
    return TransactionCoordinatorCore(max_timeout_ms=60_000, id_expiration_ms=1_000_000)


def replayed(c: TransactionCoordinatorCore, records: list) -> TransactionCoordinatorCore:
    """A fresh core fed the records' wire form, as a new coordinator is."""
    fresh = core()
    for record in records:
        fresh.replay(decode(*encode(record)))
    return fresh


def state(c: TransactionCoordinatorCore, tid: str = "app") -> TxnMetadata:
    return c.txns[tid]


def test_a_transaction_goes_empty_ongoing_prepare_complete():
    c, log = core(), []
    answer, records = c.init_producer_id("app", 30_000, 100, now_ms=0)
    assert answer == {"producer_id": 100, "producer_epoch": 0}
    log += records
    log += c.add_partitions("app", 100, 0, [T1, T0], now_ms=10)[1]
    assert state(c).state == TxnState.ONGOING and state(c).partitions == (T0, T1)
    assert c.add_partitions("app", 100, 0, [T0], now_ms=11) == ({}, [])  # already in
    log += c.end_txn("app", 100, 0, commit=True, now_ms=20)[1]
    assert state(c).state == TxnState.PREPARE_COMMIT
    assert [t.transactional_id for t in c.pending_markers()] == ["app"]
    # A retry while the markers are written: come back later.
    error, records = c.end_txn("app", 100, 0, commit=True, now_ms=21)
    assert isinstance(error, TxnError) and error.code == "CONCURRENT_TRANSACTIONS" and not records
    log += c.complete("app", 0, now_ms=30)
    assert state(c).state == TxnState.COMPLETE_COMMIT and not c.pending_markers()
    assert c.end_txn("app", 100, 0, commit=True, now_ms=31) == ({}, [])  # the retry's answer
    with pytest.raises(TxnError, match="INVALID_TXN_STATE"):
        c.end_txn("app", 100, 0, commit=False, now_ms=32)
    assert replayed(c, log).txns == c.txns
    c.check_invariants()


def test_a_new_instance_bumps_the_epoch_and_aborts_what_the_old_one_left_open():
    c = core()
    c.init_producer_id("app", 30_000, 100, now_ms=0)
    c.add_partitions("app", 100, 0, [T0], now_ms=1)
    error, records = c.init_producer_id("app", 30_000, 101, now_ms=2)
    assert error.code == "CONCURRENT_TRANSACTIONS"
    assert (state(c).state, state(c).producer_epoch) == (TxnState.PREPARE_ABORT, 1)
    with pytest.raises(TxnError, match="PRODUCER_FENCED"):
        c.add_partitions("app", 100, 0, [T1], now_ms=3)  # the old instance
    c.complete("app", 1, now_ms=4)
    answer, _ = c.init_producer_id("app", 30_000, 102, now_ms=5)
    assert answer == {"producer_id": 100, "producer_epoch": 2}
    assert state(c).state == TxnState.EMPTY and state(c).partitions == ()


def test_a_transaction_open_past_its_timeout_is_aborted_with_a_bumped_epoch():
    c = core()
    c.init_producer_id("app", 1_000, 100, now_ms=0)
    c.add_partitions("app", 100, 0, [T0], now_ms=500)
    assert c.tick(now_ms=1_400) == []
    (record,) = c.tick(now_ms=1_501)
    assert (record.state, record.producer_epoch) == (TxnState.PREPARE_ABORT, 1)
    with pytest.raises(TxnError, match="PRODUCER_FENCED"):
        c.end_txn("app", 100, 0, commit=True, now_ms=1_600)


def test_a_two_phase_transaction_never_times_out_and_survives_a_reload():
    from api.broker.transactions.coordinator import decode, encode

    c = core()
    c.init_producer_id("sink-0", 1_000, 100, now_ms=0, two_phase=True)
    c.add_partitions("sink-0", 100, 0, [T0], now_ms=0)
    assert c.tick(now_ms=10_000_000) == []  # prepared for an outside coordinator
    assert c.describe("sink-0")["two_phase_commit"] is True
    reloaded = core()
    for record in (c.txns["sink-0"],):
        reloaded.replay(decode(*encode(record)))
    assert reloaded.tick(now_ms=10_000_000) == []
    reloaded.end_txn("sink-0", 100, 0, commit=True, now_ms=10_000_001)
    assert state(reloaded, "sink-0").state == TxnState.PREPARE_COMMIT
    # A later init without two-phase commit turns the timeout back on.
    c.end_txn("sink-0", 100, 0, commit=True, now_ms=1)
    c.complete("sink-0", 0, now_ms=2)
    c.init_producer_id("sink-0", 1_000, 100, now_ms=3)
    c.add_partitions("sink-0", 100, 1, [T0], now_ms=3)
    (aborted,) = c.tick(now_ms=1_004)
    assert aborted.state == TxnState.PREPARE_ABORT


def test_idle_ids_expire_and_open_ones_do_not():
    c = TransactionCoordinatorCore(max_timeout_ms=60_000, id_expiration_ms=1_000)
    c.init_producer_id("idle", 30_000, 100, now_ms=0)
    c.init_producer_id("busy", 30_000, 101, now_ms=0)
    c.add_partitions("busy", 101, 0, [T0], now_ms=0)
    records = c.tick(now_ms=1_001)
    assert ("idle", None) in records and "idle" not in c.txns
    assert state(c, "busy").state == TxnState.ONGOING  # within its 30 s timeout


def test_requests_from_strangers_and_bad_timeouts_are_refused():
    c = core()
    with pytest.raises(TxnError, match="INVALID_TRANSACTION_TIMEOUT"):
        c.init_producer_id("app", 60_001, 100, now_ms=0)
    with pytest.raises(TxnError, match="INVALID_PRODUCER_ID_MAPPING"):
        c.add_partitions("app", 100, 0, [T0], now_ms=0)
    c.init_producer_id("app", 30_000, 100, now_ms=0)
    with pytest.raises(TxnError, match="INVALID_PRODUCER_ID_MAPPING"):
        c.end_txn("app", 999, 0, commit=True, now_ms=1)
    with pytest.raises(TxnError, match="INVALID_TXN_STATE"):
        c.end_txn("app", 100, 0, commit=True, now_ms=1)  # nothing begun
    with pytest.raises(TxnError, match="PRODUCER_FENCED"):
        c.init_producer_id("app", 30_000, 101, now_ms=2, producer_id=100, producer_epoch=7)
    assert state(c).state == TxnState.EMPTY


def test_the_last_epoch_rolls_over_to_a_new_producer_id():
    c = core()
    c.init_producer_id("app", 30_000, 100, now_ms=0)
    c.replay(TxnMetadata("app", 100, EPOCH_MAX - 1, 30_000, TxnState.COMPLETE_COMMIT, (), -1, 0))
    answer, _ = c.init_producer_id("app", 30_000, 555, now_ms=1)
    assert answer == {"producer_id": 555, "producer_epoch": 0}


def test_an_operator_abort_fences_and_aborts_an_open_transaction():
    c = core()
    c.init_producer_id("app", 30_000, 100, now_ms=0)
    with pytest.raises(TxnError, match="INVALID_TXN_STATE"):
        c.abort("app", now_ms=1)
    c.add_partitions("app", 100, 0, [T0], now_ms=1)
    c.abort("app", now_ms=2)
    assert (state(c).state, state(c).producer_epoch) == (TxnState.PREPARE_ABORT, 1)
    with pytest.raises(TxnError, match="TRANSACTIONAL_ID_NOT_FOUND"):
        c.abort("nobody", now_ms=3)


def test_verification_confirms_only_partitions_of_the_open_transaction():
    # KIP-890: what a partition leader asks before a transaction's first
    # write to it.
    c = core()
    c.init_producer_id("app", 30_000, 100, now_ms=0)
    with pytest.raises(TxnError, match="INVALID_TXN_STATE"):
        c.verify("app", 100, 0, [T0])  # no transaction open
    c.add_partitions("app", 100, 0, [T0], now_ms=1)
    c.verify("app", 100, 0, [T0])
    with pytest.raises(TxnError, match="INVALID_TXN_STATE"):
        c.verify("app", 100, 0, [T1])
    with pytest.raises(TxnError, match="PRODUCER_FENCED"):
        c.verify("app", 100, 1, [T0])
    c.end_txn("app", 100, 0, commit=True, now_ms=2)
    with pytest.raises(TxnError, match="INVALID_TXN_STATE"):
        c.verify("app", 100, 0, [T0])  # decided: no new write may open it
