"""Unit tests of the leader-epoch cache (storage/epoch_cache.py): KIP-101
truncation support and KIP-279 end-offset lookups, persisted through a
leader-epoch checkpoint."""

from __future__ import annotations

import logging

import pytest

from storage.batch import MAGIC_OFFSET, BatchBuilder, parse_header, stamped_prefix
from storage.checkpoint import LeaderEpochCheckpoint
from storage.epoch_cache import UNDEFINED_EPOCH, UNDEFINED_OFFSET, LeaderEpochCache

UNDEFINED = (UNDEFINED_EPOCH, UNDEFINED_OFFSET)


@pytest.fixture
def checkpoint(tmp_path):
    return LeaderEpochCheckpoint(str(tmp_path / "leader-epoch-checkpoint"))


def cache_with(entries, checkpoint=None) -> LeaderEpochCache:
    cache = LeaderEpochCache(checkpoint)
    for epoch, start in entries:
        assert cache.assign(epoch, start)
    return cache


def reopened(checkpoint: LeaderEpochCheckpoint) -> list[tuple[int, int]]:
    """Entries as a freshly opened cache sees them on disk."""
    return LeaderEpochCache(LeaderEpochCheckpoint(checkpoint.path)).entries


# ---------------------------------------------------------------------------
# assign
# ---------------------------------------------------------------------------
def test_new_cache_is_empty():
    cache = LeaderEpochCache(None)
    assert cache.entries == []
    assert cache.latest_epoch == UNDEFINED_EPOCH
    assert cache.earliest_entry is None


def test_assign_appends_newer_epochs():
    cache = LeaderEpochCache(None)
    assert cache.assign(0, 0)
    assert cache.assign(2, 10)
    assert cache.assign(5, 25)
    assert cache.entries == [(0, 0), (2, 10), (5, 25)]
    assert cache.latest_epoch == 5
    assert cache.earliest_entry == (0, 0)
    cache.check_invariants()


def test_assign_ignores_the_same_epoch_again():
    cache = cache_with([(1, 0), (3, 10)])
    assert not cache.assign(3, 10)
    assert not cache.assign(3, 50)  # later batches of the current epoch
    assert cache.entries == [(1, 0), (3, 10)]


def test_assign_ignores_a_stale_epoch(caplog):
    cache = cache_with([(1, 0), (3, 10)])
    with caplog.at_level(logging.WARNING, logger="storage.epoch_cache"):
        assert not cache.assign(2, 20)
    assert cache.entries == [(1, 0), (3, 10)]
    assert "ignoring leader epoch 2" in caplog.text


def test_assign_ignores_a_newer_epoch_starting_below_the_latest_start():
    cache = cache_with([(1, 0), (3, 10)])
    assert not cache.assign(4, 9)
    assert cache.entries == [(1, 0), (3, 10)]


def test_assign_replaces_an_epoch_that_never_held_a_record():
    # Epoch 3 started at 10 but epoch 4 starts there too: epoch 3 held no
    # record, so (as in Kafka) it is replaced rather than kept.
    cache = cache_with([(1, 0), (3, 10)])
    assert cache.assign(4, 10)
    assert cache.entries == [(1, 0), (4, 10)]
    assert cache.end_offset_for(3, log_end_offset=20) == (1, 10)
    cache.check_invariants()


def test_assign_ignores_negative_epochs():
    cache = LeaderEpochCache(None)
    assert not cache.assign(UNDEFINED_EPOCH, 0)
    assert cache.entries == []


def test_entries_is_a_copy():
    cache = cache_with([(1, 0)])
    cache.entries.append((9, 9))
    assert cache.entries == [(1, 0)]


# ---------------------------------------------------------------------------
# end_offset_for (KIP-279)
# ---------------------------------------------------------------------------
@pytest.fixture
def three_epochs():
    return cache_with([(2, 0), (4, 100), (7, 250)])


def test_end_offset_for_the_latest_epoch_is_the_log_end_offset(three_epochs):
    assert three_epochs.end_offset_for(7, log_end_offset=300) == (7, 300)
    assert three_epochs.end_offset_for(7, log_end_offset=251) == (7, 251)


def test_end_offset_for_a_newer_epoch_than_known_is_undefined(three_epochs):
    # Kafka: a replica cannot vouch for an epoch it has never seen.
    assert three_epochs.end_offset_for(9, log_end_offset=300) == (UNDEFINED_EPOCH,
                                                                   UNDEFINED_OFFSET)


def test_end_offset_for_a_known_older_epoch_is_the_next_epochs_start(three_epochs):
    assert three_epochs.end_offset_for(2, log_end_offset=300) == (2, 100)
    assert three_epochs.end_offset_for(4, log_end_offset=300) == (4, 250)


def test_end_offset_for_an_epoch_between_known_ones_is_the_largest_below(three_epochs):
    # Epoch 3 was never seen here: answer with epoch 2, which ends where 4 starts.
    assert three_epochs.end_offset_for(3, log_end_offset=300) == (2, 100)
    assert three_epochs.end_offset_for(5, log_end_offset=300) == (4, 250)
    assert three_epochs.end_offset_for(6, log_end_offset=300) == (4, 250)


def test_end_offset_for_an_epoch_older_than_all_is_undefined(three_epochs):
    assert three_epochs.end_offset_for(1, log_end_offset=300) == UNDEFINED
    assert three_epochs.end_offset_for(0, log_end_offset=300) == UNDEFINED


def test_end_offset_for_undefined_epoch_or_empty_cache_is_undefined(three_epochs):
    assert three_epochs.end_offset_for(UNDEFINED_EPOCH, log_end_offset=300) == UNDEFINED
    assert LeaderEpochCache(None).end_offset_for(3, log_end_offset=300) == UNDEFINED


def test_epoch_for_offset(three_epochs):
    assert three_epochs.epoch_for_offset(0) == 2
    assert three_epochs.epoch_for_offset(99) == 2
    assert three_epochs.epoch_for_offset(100) == 4
    assert three_epochs.epoch_for_offset(10_000) == 7
    assert cache_with([(1, 5)]).epoch_for_offset(4) == UNDEFINED_EPOCH


# ---------------------------------------------------------------------------
# truncation and clear
# ---------------------------------------------------------------------------
def test_truncate_from_end_forgets_epochs_starting_at_or_after_the_offset(checkpoint):
    cache = cache_with([(2, 0), (4, 100), (7, 250)], checkpoint)
    cache.truncate_from_end(250)
    assert cache.entries == [(2, 0), (4, 100)]
    cache.truncate_from_end(101)
    assert cache.entries == [(2, 0), (4, 100)]
    assert reopened(checkpoint) == [(2, 0), (4, 100)]
    cache.truncate_from_end(0)
    assert cache.entries == []
    assert reopened(checkpoint) == []


def test_after_truncate_from_end_an_epoch_can_be_assigned_again():
    cache = cache_with([(2, 0), (4, 100), (7, 250)])
    cache.truncate_from_end(120)
    assert cache.latest_epoch == 4
    assert cache.end_offset_for(4, log_end_offset=120) == (4, 120)
    assert cache.assign(5, 120)
    assert cache.entries == [(2, 0), (4, 100), (5, 120)]


def test_truncate_from_start_drops_older_epochs_and_clamps_the_first(checkpoint):
    cache = cache_with([(2, 0), (4, 100), (7, 250)], checkpoint)
    cache.truncate_from_start(150)
    assert cache.entries == [(4, 150), (7, 250)]
    assert cache.earliest_entry == (4, 150)
    assert reopened(checkpoint) == [(4, 150), (7, 250)]


def test_truncate_from_start_at_an_epoch_boundary_keeps_that_epoch():
    cache = cache_with([(2, 0), (4, 100), (7, 250)])
    cache.truncate_from_start(100)
    assert cache.entries == [(4, 100), (7, 250)]


def test_truncate_from_start_past_every_epoch_keeps_the_latest_clamped():
    cache = cache_with([(2, 0), (4, 100), (7, 250)])
    cache.truncate_from_start(1_000)
    assert cache.entries == [(7, 1_000)]
    cache.check_invariants()


def test_truncate_from_start_below_the_first_epoch_changes_nothing(checkpoint):
    cache = cache_with([(2, 10), (4, 100)], checkpoint)
    cache.truncate_from_start(5)
    assert cache.entries == [(2, 10), (4, 100)]
    LeaderEpochCache(None).truncate_from_start(5)  # empty: nothing to do, no error


def test_clear_forgets_everything_and_persists(checkpoint):
    cache = cache_with([(2, 0), (4, 100)], checkpoint)
    cache.clear()
    assert cache.entries == []
    assert cache.latest_epoch == UNDEFINED_EPOCH
    assert reopened(checkpoint) == []
    assert cache.assign(1, 0)  # usable afterwards


# ---------------------------------------------------------------------------
# persistence
# ---------------------------------------------------------------------------
def test_every_change_is_written_through_to_the_checkpoint(checkpoint):
    cache = LeaderEpochCache(checkpoint)
    cache.assign(0, 0)
    assert checkpoint.read() == [(0, 0)]
    cache.assign(3, 42)
    assert checkpoint.read() == [(0, 0), (3, 42)]
    with open(checkpoint.path) as f:
        assert f.read() == "0\n2\n0 0\n3 42\n"  # Kafka's leader-epoch-checkpoint layout


def test_reopened_cache_answers_like_the_original(checkpoint):
    original = cache_with([(2, 0), (4, 100), (7, 250)], checkpoint)
    again = LeaderEpochCache(LeaderEpochCheckpoint(checkpoint.path))
    assert again.entries == original.entries
    assert again.latest_epoch == 7
    for epoch in range(-1, 10):
        assert again.end_offset_for(epoch, 300) == original.end_offset_for(epoch, 300)


def test_no_op_changes_do_not_rewrite_the_checkpoint(checkpoint, monkeypatch):
    cache = cache_with([(2, 0), (4, 10)], checkpoint)
    writes = []
    monkeypatch.setattr(checkpoint, "write", lambda entries, **_: writes.append(list(entries)))
    assert not cache.assign(4, 15)       # same epoch
    assert not cache.assign(1, 20)       # stale epoch
    cache.truncate_from_end(11)          # nothing starts at or after 11
    cache.truncate_from_start(0)         # first epoch already starts at 0
    assert writes == []
    assert cache.assign(5, 20)
    assert writes == [[(2, 0), (4, 10), (5, 20)]]


def test_cache_without_checkpoint_works_in_memory():
    cache = cache_with([(1, 0), (2, 5)])
    cache.truncate_from_end(5)
    assert cache.entries == [(1, 0)]


# ---------------------------------------------------------------------------
# learn_from_recovery
# ---------------------------------------------------------------------------
def batch_header(base_offset: int, leader_epoch: int):
    builder = BatchBuilder()
    builder.append(b"k", b"v", timestamp_ms=0)
    raw = builder.build()
    stamped = stamped_prefix(parse_header(raw), base_offset, leader_epoch) + raw[MAGIC_OFFSET:]
    return parse_header(stamped)


def test_learn_from_recovery_assigns_epochs_newer_than_known(checkpoint, caplog):
    cache = cache_with([(2, 0)], checkpoint)
    caplog.set_level(logging.WARNING, logger="storage.epoch_cache")
    cache.learn_from_recovery(batch_header(10, 2))   # same epoch: nothing new
    cache.learn_from_recovery(batch_header(15, 3))   # new epoch starts here
    cache.learn_from_recovery(batch_header(16, 3))   # later batch of it
    cache.learn_from_recovery(batch_header(20, 1))   # older epoch: ignored
    cache.learn_from_recovery(batch_header(25, 6))
    assert cache.entries == [(2, 0), (3, 15), (6, 25)]
    assert reopened(checkpoint) == [(2, 0), (3, 15), (6, 25)]
    # Recovery replays every batch: old epochs are expected there, not warned about.
    assert caplog.records == []


def test_learn_from_recovery_ignores_batches_without_an_epoch():
    cache = LeaderEpochCache(None)
    cache.learn_from_recovery(batch_header(0, UNDEFINED_EPOCH))
    assert cache.entries == []
    cache.learn_from_recovery(batch_header(0, 0))
    assert cache.entries == [(0, 0)]
