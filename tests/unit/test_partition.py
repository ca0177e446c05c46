"""The replication core of one partition (``api/broker/partition.py``) on real
logs: the leader's view of its followers, the high watermark, ISR proposals,
and a follower's divergence and truncation (KIP-101/279/320)."""

from __future__ import annotations

import pytest

from api.broker.partition import LEADER_RECOVERED, LEADER_RECOVERING, Partition
from storage.batch import build_batch, iter_batches
from storage.log import Log
from storage.manager import TopicPartition

TP = TopicPartition("t", 0)
LEADER, F1, F2 = 1, 2, 3
LAG_MS = 1000


def open_log(tmp_path, name: str) -> Log:
    return Log.open(str(tmp_path / name / "t-0"))


def records(count: int, tag: str = "v") -> bytes:
    return build_batch([(None, f"{tag}{i}".encode()) for i in range(count)])


def leader(tmp_path, isr=(LEADER, F1, F2), epoch: int = 0, now_ms: int = 0,
           recovery: int = LEADER_RECOVERED) -> Partition:
    part = Partition(TP, open_log(tmp_path, "leader"), LEADER, "id")
    part.update(LEADER, epoch, 0, [LEADER, F1, F2], list(isr), now_ms, recovery)
    return part


def follower(tmp_path, name: str, broker: int, leader_id: int = LEADER, epoch: int = 0
             ) -> Partition:
    part = Partition(TP, open_log(tmp_path, name), broker, "id")
    part.update(leader_id, epoch, 0, [LEADER, F1, F2], [LEADER, F1, F2])
    return part


def replicate(source: Partition, target: Partition) -> None:
    """What a follower's fetch does: everything the source has past the
    target's end, appended unchanged."""
    data = source.log.read(target.log_end_offset, 1 << 20, source.log_end_offset)
    target.append_as_follower(data, source.high_watermark)


# -- leader: high watermark ------------------------------------------------------------

def test_high_watermark_is_the_smallest_log_end_over_the_isr(tmp_path):
    part = leader(tmp_path)
    part.append_as_leader(records(10))
    assert part.high_watermark == 0, "followers not heard from hold it back"
    assert not part.record_follower_fetch(F1, 10, now_ms=1)
    assert part.high_watermark == 0
    assert part.record_follower_fetch(F2, 4, now_ms=1)
    assert part.high_watermark == 4
    part.record_follower_fetch(F2, 10, now_ms=2)
    assert part.high_watermark == 10
    part.check_invariants()


def test_high_watermark_never_moves_back_while_leading(tmp_path):
    part = leader(tmp_path)
    part.append_as_leader(records(10))
    part.record_follower_fetch(F1, 10, 1)
    part.record_follower_fetch(F2, 10, 1)
    assert part.high_watermark == 10
    part.record_follower_fetch(F2, 3, 2)  # a follower that truncated says less
    assert part.high_watermark == 10


def test_a_sole_isr_leader_commits_at_once(tmp_path):
    part = leader(tmp_path, isr=(LEADER,))
    part.append_as_leader(records(5))
    assert part.high_watermark == 5


def test_below_min_insync_replicas_the_high_watermark_stands_still(tmp_path):
    """KIP-966's strict rule: with the ISR below min.insync.replicas nothing
    new is committed, so a replica that left it then holds everything
    committed (an eligible leader replica). acks=1 records wait for the ISR."""
    part = leader(tmp_path, isr=(LEADER,))
    part.min_insync_replicas = 2
    part.append_as_leader(records(5))
    assert part.high_watermark == 0
    part.update(LEADER, 0, 1, [LEADER, F1, F2], [LEADER, F1], 1)
    part.record_follower_fetch(F1, 5, 1)
    assert part.high_watermark == 5


def test_replicas_outside_the_isr_do_not_hold_the_high_watermark_back(tmp_path):
    part = leader(tmp_path, isr=(LEADER, F1))
    part.append_as_leader(records(5))
    part.record_follower_fetch(F1, 5, 1)
    assert part.high_watermark == 5


# -- leader: ISR proposals ----------------------------------------------------------------

def test_a_follower_silent_for_the_lag_time_is_proposed_out(tmp_path):
    part = leader(tmp_path, now_ms=0)
    part.append_as_leader(records(3))
    part.record_follower_fetch(F1, 3, now_ms=900)
    assert part.isr_proposal(LAG_MS, LAG_MS) is None
    proposal = part.isr_proposal(LAG_MS + 1, LAG_MS)
    assert proposal.new_isr == [LEADER, F1] and str(F2) in proposal.reason
    assert part.isr_proposal(LAG_MS + 2, LAG_MS) is None, "one proposal in flight at a time"


def test_a_follower_that_keeps_fetching_but_never_catches_up_is_proposed_out(tmp_path):
    part = leader(tmp_path, now_ms=0)
    for t in range(1, 30):
        part.append_as_leader(records(10))  # the leader runs ahead between fetches
        part.record_follower_fetch(F1, part.log_end_offset, t * 100)
        part.record_follower_fetch(F2, (t - 1) * 5, t * 100)
    proposal = part.isr_proposal(2900, LAG_MS)
    assert proposal is not None and proposal.new_isr == [LEADER, F1]


def test_fetching_at_the_previous_log_end_counts_as_caught_up_then(tmp_path):
    part = leader(tmp_path, now_ms=0)
    part.append_as_leader(records(5))
    part.record_follower_fetch(F2, 0, now_ms=600)  # the leader's end is 5 then
    part.append_as_leader(records(5))
    part.record_follower_fetch(F2, 5, now_ms=1200)  # reached it: in sync as of t=600
    part.record_follower_fetch(F1, 10, now_ms=1200)
    assert part.isr_proposal(1500, LAG_MS) is None
    assert part.isr_proposal(1601, LAG_MS).new_isr == [LEADER, F1]


def test_a_caught_up_replica_is_proposed_in_and_counts_for_the_high_watermark_meanwhile(
        tmp_path):
    part = leader(tmp_path, isr=(LEADER, F1))
    part.append_as_leader(records(10))
    part.record_follower_fetch(F1, 10, 1)
    assert part.high_watermark == 10
    part.append_as_leader(records(10))
    part.record_follower_fetch(F2, 10, 2)
    proposal = part.isr_proposal(2, LAG_MS)
    assert proposal.new_isr == [LEADER, F1, F2]
    # While the expansion is in flight F2 counts (the maximal ISR): nothing
    # F2 lacks may be committed.
    part.record_follower_fetch(F1, 20, 3)
    assert part.high_watermark == 10
    assert part.isr_change_done(proposal, {"leader_epoch": 0, "partition_epoch": 1,
                                           "isr": [LEADER, F1, F2]})
    assert (part.isr, part.partition_epoch, part.pending_isr) == ([LEADER, F1, F2], 1, None)
    part.record_follower_fetch(F2, 20, 4)
    assert part.high_watermark == 20


def test_a_replica_below_the_start_of_the_leaders_epoch_is_not_caught_up(tmp_path):
    part = leader(tmp_path, isr=(LEADER,))
    part.append_as_leader(records(10))
    part.update(LEADER, 1, 1, [LEADER, F1, F2], [LEADER])  # a new epoch starting at 10
    assert part.leader_epoch_start_offset == 10
    part.record_follower_fetch(F1, 9, 1)
    assert part.isr_proposal(1, LAG_MS) is None
    part.record_follower_fetch(F1, 10, 2)
    assert part.isr_proposal(2, LAG_MS).new_isr == [LEADER, F1]


def test_a_refused_or_lost_proposal_is_forgotten_and_a_new_epoch_clears_it(tmp_path):
    part = leader(tmp_path, now_ms=0)
    proposal = part.isr_proposal(LAG_MS + 1, LAG_MS)
    assert not part.isr_change_done(proposal, None)
    assert part.pending_isr is None and part.isr == [LEADER, F1, F2]
    proposal = part.isr_proposal(LAG_MS + 1, LAG_MS)
    part.update(LEADER, 0, 1, [LEADER, F1, F2], [LEADER, F1], LAG_MS + 2)
    assert part.pending_isr is None
    assert not part.isr_change_done(proposal, {"leader_epoch": 0, "partition_epoch": 1,
                                               "isr": [LEADER]}), "overtaken by the image"
    assert part.isr == [LEADER, F1]


def test_an_unclean_leader_first_reports_itself_recovered_and_only_then_grows_the_isr(
        tmp_path):
    part = leader(tmp_path, isr=(LEADER,), recovery=LEADER_RECOVERING)
    part.record_follower_fetch(F1, 0, 1)
    proposal = part.isr_proposal(1, LAG_MS)
    assert (proposal.new_isr, proposal.leader_recovery_state) == ([LEADER], LEADER_RECOVERED)
    part.isr_change_done(proposal, {"leader_epoch": 0, "partition_epoch": 1, "isr": [LEADER],
                                    "leader_recovery_state": LEADER_RECOVERED})
    assert part.isr_proposal(2, LAG_MS).new_isr == [LEADER, F1]


# -- followers: divergence and truncation ---------------------------------------------------

def test_a_follower_in_step_is_not_diverging(tmp_path):
    lead = leader(tmp_path)
    lead.append_as_leader(records(5))
    f1 = follower(tmp_path, "f1", F1)
    replicate(lead, f1)
    assert lead.diverging_epoch(f1.log_end_offset, f1.last_fetched_epoch) is None
    assert lead.diverging_epoch(0, -1) is None, "an empty follower names no epoch"


def test_a_deposed_leaders_extra_records_are_truncated_kip_101(tmp_path):
    old = leader(tmp_path, epoch=0)
    old.append_as_leader(records(5, "committed"))
    f1 = follower(tmp_path, "f1", F1)
    replicate(old, f1)
    old.append_as_leader(records(3, "stranded"))  # never fetched: old leader dies
    # F1 leads epoch 1 and writes other records at the same offsets.
    f1.update(F1, 1, 1, [LEADER, F1, F2], [F1, F2])
    f1.append_as_leader(records(4, "new"))
    # The old leader comes back as a follower of epoch 1.
    old.update(F1, 1, 1, [LEADER, F1, F2], [F1, F2])
    assert (old.log_end_offset, old.last_fetched_epoch) == (8, 0)
    diverging = f1.diverging_epoch(old.log_end_offset, old.last_fetched_epoch)
    assert diverging == (0, 5)
    old.truncate_to(old.truncation_offset(*diverging), "test")
    assert old.log_end_offset == 5
    assert f1.diverging_epoch(old.log_end_offset, old.last_fetched_epoch) is None
    replicate(f1, old)
    assert old.log.read(0, 1 << 20, 9) == f1.log.read(0, 1 << 20, 9)


def test_a_follower_with_an_epoch_the_leader_never_had_truncates_to_where_it_began(tmp_path):
    # F2 led epoch 1 briefly and wrote 2 records nobody fetched; F1 leads epoch 2.
    f1 = follower(tmp_path, "f1", F1)
    f2 = follower(tmp_path, "f2", F2)
    base = leader(tmp_path)
    base.append_as_leader(records(4))
    replicate(base, f1)
    replicate(base, f2)
    f2.update(F2, 1, 1, [LEADER, F1, F2], [F2])
    f2.append_as_leader(records(2, "lonely"))
    f1.update(F1, 2, 2, [LEADER, F1, F2], [F1])
    f1.append_as_leader(records(1, "two"))
    f2.update(F1, 2, 2, [LEADER, F1, F2], [F1])
    # The new leader's epoch 2 began at its log end then (4), even before a
    # record of epoch 2 existed: so it can say where epoch 0 ended.
    diverging = f1.diverging_epoch(f2.log_end_offset, f2.last_fetched_epoch)
    assert diverging == (0, 4)
    f2.truncate_to(f2.truncation_offset(*diverging), "test")
    assert f2.log_end_offset == 4
    assert f1.diverging_epoch(f2.log_end_offset, f2.last_fetched_epoch) is None


def test_an_empty_epoch_at_the_log_end_is_forgotten_so_fetching_makes_progress(tmp_path):
    f2 = follower(tmp_path, "f2", F2)
    f2.update(F2, 1, 1, [LEADER, F1, F2], [F2])  # led epoch 1, wrote nothing
    assert f2.last_fetched_epoch == 1
    f2.update(F1, 2, 2, [LEADER, F1, F2], [F1])
    f2.truncate_to(f2.truncation_offset(0, 0), "test")
    assert f2.last_fetched_epoch == -1


def test_follower_high_watermark_is_the_leaders_capped_by_its_log_end(tmp_path):
    lead = leader(tmp_path, isr=(LEADER,))
    lead.append_as_leader(records(10))
    f1 = follower(tmp_path, "f1", F1)
    data = lead.log.read(0, 1 << 20, 10)
    first = next(iter_batches(data))[0]
    assert first.last_offset == 9
    f1.append_as_follower(b"", 10)
    assert f1.high_watermark == 0
    f1.append_as_follower(data, 10)
    assert f1.high_watermark == 10
    f1.truncate_to(6, "test")
    assert f1.high_watermark <= f1.log_end_offset
    f1.check_invariants()


def test_a_checkpointed_high_watermark_is_clamped_to_the_recovered_log(tmp_path):
    log = open_log(tmp_path, "leader")
    log.append(records(5), 0)
    assert Partition(TP, log, LEADER, "id", high_watermark=3).high_watermark == 3
    assert Partition(TP, log, LEADER, "id", high_watermark=50).high_watermark == 5


@pytest.mark.parametrize("describe_now", [None, 10])
def test_describe_shows_each_replicas_log_end_and_lag(tmp_path, describe_now):
    part = leader(tmp_path)
    part.append_as_leader(records(10))
    part.record_follower_fetch(F1, 7, now_ms=5)
    states = {r["broker"]: r for r in part.describe(describe_now)["replica_states"]}
    assert (states[F1]["log_end_offset"], states[F1]["lag"]) == (7, 3)
    assert (states[F2]["log_end_offset"], states[F2]["lag"]) == (None, None)
    assert states[LEADER]["lag"] == 0


def test_only_live_brokers_are_proposed_and_a_definite_refusal_leaves_no_trace(tmp_path):
    part = leader(tmp_path, isr=(LEADER, F1))
    part.append_as_leader(records(4))
    part.record_follower_fetch(F1, 4, 1, broker_epoch=0)
    part.record_follower_fetch(F2, 4, 1, broker_epoch=0)
    assert part.isr_proposal(2, LAG_MS, eligible={LEADER: 0, F1: 0}) is None, "F2 is fenced"
    proposal = part.isr_proposal(2, LAG_MS, eligible={LEADER: 0, F1: 0, F2: 0})
    assert proposal.new_isr == [LEADER, F1, F2]
    part.isr_change_done(proposal, None, refused=True)
    assert part.maximal_isr == [LEADER, F1], "a refused member does not hold the HW back"
    part.append_as_leader(records(2))
    part.record_follower_fetch(F1, 6, 3)
    assert part.high_watermark == 6


def test_an_answer_that_also_completed_a_reassignment_waits_for_the_image(tmp_path):
    part = leader(tmp_path, isr=(LEADER, F1))
    part.record_follower_fetch(F2, 0, 1)
    proposal = part.isr_proposal(1, LAG_MS)
    assert not part.isr_change_done(proposal, {"leader_epoch": 0, "partition_epoch": 2,
                                               "isr": [F1, F2], "leader": F1})
    assert part.isr == [LEADER, F1] and F2 in part.maximal_isr
