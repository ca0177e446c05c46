"""Seeded simulation of one partition's replication: the shipped broker cores
(``LifecycleCore``, ``ReplicationCore`` with its ``Partition``s over real
``storage`` logs) and controller core, a simulated network, time, crashes and
clients (see ``tests/sim/replication.py`` for what is modelled, the
durability assumption and the exact invariants, checked after every step).

Every seed is deterministic. A failure prints the seed, the step, the broken
invariant and the last events, and can be replayed with the full trace:

    python -m tests.unit.test_replication_simulation --seed 17 --brokers 3 --trace

More seeds or longer runs on demand (the defaults keep this file fast):

    KRAFTLOG_SIM_SEEDS=1000 KRAFTLOG_SIM_STEPS=3000 \\
        .venv/bin/python -m pytest tests/unit/test_replication_simulation.py -q
    python -m tests.unit.test_replication_simulation --seeds 1000 --brokers 5

Further tests plant known bugs (``Rules``) and check that the invariants
catch each of them within the fixed seeds, so a checker that silently stopped
checking would fail here too; and the bugs the simulation found in
``Partition`` are pinned by direct regression tests (seeds that found them
before the fix are named in their docstrings, for the simulator as it was
then).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time

import pytest

import shutil
import tempfile

from api.broker.partition import IsrProposal, Partition
from storage.batch import build_batch
from storage.log import Log
from storage.manager import TopicPartition
from storage.producer_state import ProducerStateManager
from tests.sim.replication import Rules, SimulationFailure, run_simulation

SEEDS_RF3 = int(os.environ.get("KRAFTLOG_SIM_SEEDS", "64"))
SEEDS_RF5 = int(os.environ.get("KRAFTLOG_SIM_SEEDS", "24"))
SEEDS_SYNC = int(os.environ.get("KRAFTLOG_SIM_SEEDS", "16"))
STEPS = int(os.environ.get("KRAFTLOG_SIM_STEPS", "2500"))
# The planted bugs are looked for in these seeds, stopping at the first catch.
BROKEN_RULE_SEEDS = range(40)
BROKEN_RULE_STEPS = 2500


@pytest.mark.parametrize("seed", range(SEEDS_RF3), ids=lambda seed: f"seed{seed}")
def test_three_replicas_keep_every_invariant(seed):
    run_simulation(seed, STEPS, broker_count=3)


@pytest.mark.parametrize("seed", range(SEEDS_RF5), ids=lambda seed: f"seed{seed}")
def test_five_replicas_keep_every_invariant(seed):
    run_simulation(seed, STEPS, broker_count=5)


@pytest.mark.parametrize("seed", range(SEEDS_SYNC), ids=lambda seed: f"seed{seed}")
def test_with_flush_messages_1_every_broker_losing_power_at_once_loses_nothing(seed):
    """docs/durability.md's promise for flush.messages=1: machine crashes of
    any broker at any time, and of every broker at once, lose nothing
    acknowledged (every invariant holds)."""
    sim = run_simulation(seed, STEPS, broker_count=3, rules=Rules(durability="sync"))
    assert sim.event_counts["machine crashes"] > 0, sim.summary()


@pytest.mark.parametrize("broker_count", [3, 5])
def test_machine_crashes_of_fewer_than_min_insync_replicas_brokers_lose_nothing(broker_count):
    """KIP-966's promise, docs/durability.md: with the default flush, any
    broker may lose its unflushed tail in a machine crash at any time, with
    no other fault held back, as long as at most min.insync.replicas - 1 are
    tainted by one at once: eligible leader replicas keep a clean copy
    electable (every invariant holds, over every seed)."""
    crashes = 0
    for seed in range(SEEDS_SYNC):
        sim = run_simulation(seed, STEPS, broker_count=broker_count,
                             rules=Rules(durability="elr"))
        crashes += sim.event_counts["machine crashes"]
    # Some seeds draw no crashes (swarm testing); together, many.
    assert crashes >= SEEDS_SYNC, crashes


# Seeds of a 10,000-seed sweep (5 brokers, 3,000 steps) that failed before
# their fix: 823 (KIP-903: a restarted follower added to the ISR on its old
# incarnation's fetch), 896 and 1493 (a truncation below the checkpointed
# recovery point: a restart learned the new epoch at the wrong offset),
# 1680 (INELIGIBLE_REPLICA taken as definite while another copy applied).
@pytest.mark.parametrize("seed", [823, 896, 1493, 1680], ids=lambda seed: f"seed{seed}")
def test_seeds_a_sweep_found_failing_pass(seed):
    run_simulation(seed, 3000, broker_count=5)


def test_a_seed_replays_exactly():
    traces = []
    for _ in range(2):
        lines: list[str] = []
        sim = run_simulation(7, 800, broker_count=3, trace=lines.append)
        traces.append((lines, sim.summary(), sim.committed, sim.acked))
    assert traces[0] == traces[1]
    assert traces[0][2], "the run committed nothing: the simulation is not exercising much"


def first_failure(rules: Rules) -> SimulationFailure | None:
    for seed in BROKEN_RULE_SEEDS:
        try:
            run_simulation(seed, BROKEN_RULE_STEPS, broker_count=3, rules=rules)
        except SimulationFailure as failure:
            return failure
    return None


@pytest.mark.parametrize("rules, caught_by", [
    # (a) No truncation on diverging_epoch: the follower asks again and again
    # and never catches up, so healing never converges.
    (Rules(follower_truncates_on_divergence=False), "5 (no acknowledged write lost)"),
    # (b) The leader commits what it has appended, ignoring its followers.
    (Rules(high_watermark_waits_for_followers=False), "4 (committed data is in the ISR)"),
    # (c) Pre-KIP-101: a follower cuts its log at its own high watermark on a
    # leader change, below records the ISR committed, and fetches unchecked.
    (Rules(follower_asks_leader=False), "4 (committed data is in the ISR)"),
    # Kafka before KIP-966 (eligible.leader.replicas.enable=false): a broker
    # that lost its unflushed tail stays the last ISR member and leads
    # cleanly once back, though another replica held everything.
    (Rules(durability="noelr"), "4 (committed data is in the ISR)"),
    # Every broker losing power at once with the default, background flush:
    # what docs/durability.md says is not promised, caught.
    (Rules(durability="power"), "4 (committed data is in the ISR)"),
], ids=["a-no-truncation", "b-hw-ignores-followers", "c-pre-kip-101", "no-kip-966",
        "power-loss-default-flush"])
def test_the_invariants_catch_a_planted_bug(rules, caught_by):
    failure = first_failure(rules)
    assert failure is not None, f"no seed in {BROKEN_RULE_SEEDS} caught {rules}"
    message = str(failure)
    assert f"invariant broken: {caught_by}" in message, message
    assert "seed=" in message and "last " in message and "replay: python -m" in message


def test_the_idempotence_invariant_catches_a_broker_that_forgets_to_dedupe(monkeypatch):
    # Planted: the leader appends every retry as if it were new.
    monkeypatch.setattr(ProducerStateManager, "check", lambda self, header: None)
    failure = first_failure(Rules())
    assert failure is not None, f"no seed in {BROKEN_RULE_SEEDS} caught the missing dedupe"
    assert "invariant broken: 6 (idempotent producer: no duplicate, no reorder)" in str(failure)


# -- regressions the simulation found in Partition (fixed in api/broker/partition.py) ------
TP = TopicPartition("t", 0)
LEADER, F1, F2 = 1, 2, 3
LAG_MS = 1000


def new_log() -> Log:
    """A real, empty partition log in a directory removed at exit."""
    directory = tempfile.mkdtemp(prefix="kraftlog-partition-")
    _dirs.append(directory)
    return Log.open(directory)


_dirs: list[str] = []


@pytest.fixture(autouse=True)
def _remove_logs():
    yield
    while _dirs:
        shutil.rmtree(_dirs.pop(), ignore_errors=True)


def records(count: int) -> bytes:
    return build_batch([(None, b"v")] * count, timestamp_ms=0)


def leader_with_f2_caught_up() -> tuple[Partition, IsrProposal]:
    """A leader with ISR [LEADER, F1] whose log ends at 5, where F2 has
    caught up: it proposes adding F2 at partition epoch 0."""
    part = Partition(TP, new_log(), LEADER, "id")
    part.update(LEADER, 0, 0, [LEADER, F1, F2], [LEADER, F1], 0)
    part.append_as_leader(records(5))
    part.record_follower_fetch(F1, 5, 1)
    part.record_follower_fetch(F2, 5, 1)
    proposal = part.isr_proposal(1, LAG_MS)
    assert (proposal.new_isr, proposal.partition_epoch) == ([LEADER, F1, F2], 0)
    return part, proposal


def answer(partition_epoch: int, isr: list[int]) -> dict:
    return {"leader_epoch": 0, "partition_epoch": partition_epoch, "isr": isr,
            "leader_recovery_state": 0}


def test_a_late_answer_does_not_settle_a_newer_proposal_of_the_same_isr():
    """Seed 274 (before the fix): the image showed the first expansion, then
    F2 was fenced out; the leader proposed F2 again, and the first proposal's
    late answer cleared the second one's pending state, so the high
    watermark passed what F2 had while the controller added it again."""
    part, first = leader_with_f2_caught_up()
    part.update(LEADER, 0, 1, [LEADER, F1, F2], [LEADER, F1, F2], 2)
    part.update(LEADER, 0, 2, [LEADER, F1, F2], [LEADER, F1], 3)
    part.record_follower_fetch(F2, 5, 3)
    second = part.isr_proposal(3, LAG_MS)
    assert (second.new_isr, second.partition_epoch) == ([LEADER, F1, F2], 2)
    assert not part.isr_change_done(first, answer(1, [LEADER, F1, F2]))
    assert part.pending_isr == [LEADER, F1, F2], "still waiting for the second answer"
    part.append_as_leader(records(5))
    part.record_follower_fetch(F1, 10, 4)
    assert part.high_watermark == 5, "F2, maybe joining, holds it back"


def test_a_refused_expansion_counts_its_member_until_the_image_says_more():
    """Seeds 68, 90, 123, 128 (before the fix): the controller applied the
    expansion, the client's retry was refused (INVALID_UPDATE_VERSION), the
    shell handed None, and the leader committed records F2 lacked although F2
    was in the ISR."""
    part, proposal = leader_with_f2_caught_up()
    assert not part.isr_change_done(proposal, None)
    assert part.pending_isr is None and part.unconfirmed_isr == [F2]
    assert part.maximal_isr == [LEADER, F1, F2]
    part.append_as_leader(records(5))
    part.record_follower_fetch(F1, 10, 2)
    assert part.high_watermark == 5
    part.update(LEADER, 0, 1, [LEADER, F1, F2], [LEADER, F1, F2], 3)  # it was applied
    assert part.unconfirmed_isr == [] and part.high_watermark == 5
    part.record_follower_fetch(F2, 10, 4)
    assert part.high_watermark == 10
    part.check_invariants()


def test_a_lagging_unconfirmed_member_is_confirmed_out_by_the_unchanged_isr():
    """The way out when the refusal was real and F2 went away: once F2 lags,
    the leader proposes the ISR as it is; the controller answering it at the
    same partition epoch confirms F2 was never added."""
    part, proposal = leader_with_f2_caught_up()
    part.isr_change_done(proposal, None)
    part.append_as_leader(records(5))
    part.record_follower_fetch(F1, 10, LAG_MS)
    assert part.high_watermark == 5
    confirm = part.isr_proposal(LAG_MS + 2, LAG_MS)
    assert (confirm.new_isr, confirm.partition_epoch) == ([LEADER, F1], 0)
    assert part.isr_change_done(confirm, answer(0, [LEADER, F1])), "the high watermark moved"
    assert part.unconfirmed_isr == [] and part.high_watermark == 10


def test_a_follower_that_left_the_isr_fetches_again_before_it_rejoins():
    """Seeds 721 and 995 (RF 5, 3000 steps, before the fix): a follower lost
    its unflushed records in a machine crash, registered again (fenced, out
    of the ISR), was unfenced, and the leader proposed it back at once on the
    log end its last fetch before the crash had shown."""
    part = Partition(TP, new_log(), LEADER, "id")
    part.update(LEADER, 0, 0, [LEADER, F1, F2], [LEADER, F1, F2], 0)
    part.append_as_leader(records(10))
    part.record_follower_fetch(F1, 10, 1)
    part.record_follower_fetch(F2, 10, 1)
    assert part.high_watermark == 10
    part.update(LEADER, 0, 1, [LEADER, F1, F2], [LEADER, F1], 2)  # F2 fenced
    assert part.isr_proposal(3, LAG_MS) is None, "a fetch from before does not count"
    part.record_follower_fetch(F2, 4, 4)  # the restarted F2, with less data
    assert part.isr_proposal(4, LAG_MS) is None
    part.record_follower_fetch(F2, 10, 5)
    assert part.isr_proposal(5, LAG_MS).new_isr == [LEADER, F1, F2]


def test_a_replica_outside_the_isr_fetches_again_once_the_isr_changes():
    """Seed 2921 (3000 steps, before the fix): F2, outside the ISR, fetched
    up to the leader's end while another proposal was pending, then lost
    records in a machine crash; once that proposal was applied and F2's new
    incarnation was unfenced, the leader proposed F2 on the old fetch."""
    part = Partition(TP, new_log(), LEADER, "id")
    part.update(LEADER, 0, 0, [LEADER, F1, F2], [LEADER], 0)
    part.append_as_leader(records(5))
    part.record_follower_fetch(F1, 5, 1)
    assert part.isr_proposal(1, LAG_MS).new_isr == [LEADER, F1]
    part.record_follower_fetch(F2, 5, 2)  # caught up, but a proposal is pending
    part.update(LEADER, 0, 1, [LEADER, F1, F2], [LEADER, F1], 3)  # the image shows it applied
    assert part.isr_proposal(4, LAG_MS) is None, "F2's fetch from before does not count"
    part.record_follower_fetch(F2, 3, 5)  # F2 restarted with less data
    assert part.isr_proposal(5, LAG_MS) is None


def test_an_expansion_names_the_registration_each_member_fetched_with():  # KIP-903
    """The leader proposes a member only on fetches of the registration the
    image shows, and names that broker epoch, so the controller can refuse
    a member that registered again while the proposal was on its way."""
    part = Partition(TP, new_log(), LEADER, "id")
    part.update(LEADER, 0, 0, [LEADER, F1, F2], [LEADER], 0)
    part.append_as_leader(records(5))
    part.record_follower_fetch(F1, 5, 1, broker_epoch=40)
    part.record_follower_fetch(F2, 5, 1, broker_epoch=41)
    # F2 registered again (epoch 77) since the fetch the leader saw.
    proposal = part.isr_proposal(2, LAG_MS, eligible={LEADER: 10, F1: 40, F2: 77})
    assert proposal.new_isr == [LEADER, F1] and proposal.broker_epochs == (-1, 40)
    part.isr_change_done(proposal, answer(1, [LEADER, F1]))
    part.record_follower_fetch(F2, 5, 3, broker_epoch=77)  # the new one, caught up
    proposal = part.isr_proposal(3, LAG_MS, eligible={LEADER: 10, F1: 40, F2: 77})
    assert proposal.new_isr == [LEADER, F1, F2] and proposal.broker_epochs == (-1, 40, 77)


def test_a_fetch_of_a_new_incarnation_does_not_inherit_the_old_ones_catch_up():  # KIP-903
    """Caught up "at the previous fetch" holds for one registration: a
    restarted follower's first fetch says where its new log ends, not that
    it held what the leader had when its previous self fetched."""
    part = Partition(TP, new_log(), LEADER, "id")
    part.update(LEADER, 0, 0, [LEADER, F1], [LEADER], 0)
    part.append_as_leader(records(5))
    part.record_follower_fetch(F1, 3, 1000, broker_epoch=40)  # behind; leader at 5
    part.append_as_leader(records(2))
    # A restarted F1 (epoch 41) fetches at 5, the leader's end as of the old
    # incarnation's fetch: that is no proof it held those records then.
    part.record_follower_fetch(F1, 5, 3000, broker_epoch=41)
    assert part.replica_states[F1].last_caught_up_ms == 0
    part.record_follower_fetch(F1, 7, 3001, broker_epoch=41)
    assert part.replica_states[F1].last_caught_up_ms == 3001


# -- replaying and sweeping from the command line ---------------------------------------
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.unit.test_replication_simulation",
        description="Run the replication simulation for one seed (with --trace to print "
                    "every event) or sweep seeds 0..N-1.")
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--seed", type=int, help="run this seed")
    which.add_argument("--seeds", type=int,
                       help="run N seeds (0..N-1, or from --first) and report failures")
    parser.add_argument("--first", type=int, default=0,
                        help="with --seeds: start the sweep at this seed (split a long sweep "
                             "over processes)")
    parser.add_argument("--steps", type=int, default=STEPS)
    parser.add_argument("--brokers", type=int, default=3, choices=(3, 5))
    parser.add_argument("--trace", action="store_true", help="print every event")
    parser.add_argument("--rule", choices=("a", "b", "c", "brief", "sync", "power", "elr",
                                           "noelr"),
                        help="plant a known bug (see the tests above), or 'sync': "
                             "flush.messages=1 under power losses of every broker at once, "
                             "or 'elr': machine crashes of up to min.insync.replicas - 1 "
                             "brokers at once ('noelr': the same without KIP-966, planted)")
    args = parser.parse_args(argv)
    # The product's own warnings (truncations, ignored epochs) go with the trace.
    logging.basicConfig(level=logging.WARNING if args.trace else logging.ERROR,
                        format="        product %(levelname)s %(name)s: %(message)s")
    rules = {None: Rules(), "a": Rules(follower_truncates_on_divergence=False),
             "b": Rules(high_watermark_waits_for_followers=False),
             "c": Rules(follower_asks_leader=False),
             "brief": Rules(durability="brief"), "sync": Rules(durability="sync"),
             "power": Rules(durability="power"), "elr": Rules(durability="elr"),
             "noelr": Rules(durability="noelr")}[args.rule]
    seeds = [args.seed] if args.seed is not None else range(args.first,
                                                             args.first + args.seeds)
    failed = []
    started = time.monotonic()
    for seed in seeds:
        try:
            sim = run_simulation(seed, args.steps, args.brokers, rules,
                                 trace=print if args.trace else None)
        except SimulationFailure as failure:
            failed.append(seed)
            print(failure, file=sys.stderr)
            continue
        if args.seed is not None:
            print(sim.summary())
    print(f"{len(seeds) - len(failed)}/{len(seeds)} seeds passed in "
          f"{time.monotonic() - started:.1f} s" + (f"; failed: {failed}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
