"""The transaction simulation (tests/sim/transactions.py) over many seeds,
and proof that its invariants catch planted bugs.

Replay or run more seeds from the command line::

    python -m tests.unit.test_txn_simulation --seeds 2000 --first 0
    python -m tests.unit.test_txn_simulation --seed 17 --trace
"""

from __future__ import annotations

import argparse
import sys
import time

import pytest

from storage.log import Log
from storage.txn_index import AbortedTxns
from tests.sim.replication import SimulationFailure
from tests.sim.transactions import run_txn_simulation

STEPS = 600
CI_SEEDS = range(40)


@pytest.mark.parametrize("seed", CI_SEEDS)
def test_transactions_keep_every_invariant(seed):
    sim = run_txn_simulation(seed, STEPS)
    assert sim.txns, "the run began no transaction: the simulation is not exercising much"


def test_the_runs_commit_abort_crash_and_fence():
    """Across the CI seeds every path is taken: commits and aborts decided,
    coordinator and leader crashes, duplicates of lost answers, timeouts."""
    totals: dict[str, int] = {}
    decided: dict[str | None, int] = {}
    for seed in range(10):
        sim = run_txn_simulation(seed, STEPS)
        for key, value in sim.counts.items():
            totals[key] = totals.get(key, 0) + value
        for txn in sim.txns.values():
            decided[txn.decision] = decided.get(txn.decision, 0) + 1
    assert decided.get("commit", 0) > 20 and decided.get("abort", 0) > 10, decided
    for what in ("crash_coordinator", "crash_leader", "markers", "duplicate retries"):
        assert totals.get(what, 0) > 0, (what, totals)
    assert any(k.startswith("produce refused INVALID_PRODUCER_EPOCH") for k in totals), totals


def first_failure(seeds=range(40)) -> SimulationFailure | None:
    for seed in seeds:
        try:
            run_txn_simulation(seed, STEPS)
        except SimulationFailure as failure:
            return failure
    return None


def test_a_reader_that_ignores_the_aborted_index_is_caught(monkeypatch):
    monkeypatch.setattr(AbortedTxns, "collect", lambda self, start, upper: [])
    failure = first_failure()
    assert failure is not None
    assert "invariant broken: 1 (only committed transactions are visible)" in str(failure)


def test_a_log_without_a_last_stable_offset_is_caught(monkeypatch):
    # Reading past open transactions shows a transaction's records before
    # its decision (or part of them).
    monkeypatch.setattr(Log, "first_unstable_offset", property(lambda self: None))
    failure = first_failure()
    assert failure is not None
    assert "invariant broken: 1" in str(failure) or "invariant broken: 2" in str(failure)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Run the transaction simulation.")
    parser.add_argument("--seeds", type=int, default=100, help="how many seeds")
    parser.add_argument("--first", type=int, default=0, help="the first seed")
    parser.add_argument("--seed", type=int, help="run only this seed")
    parser.add_argument("--steps", type=int, default=STEPS, help="steps per seed")
    parser.add_argument("--trace", action="store_true", help="print every event")
    args = parser.parse_args(argv)
    seeds = [args.seed] if args.seed is not None else range(args.first, args.first + args.seeds)
    started = time.monotonic()
    failed = 0
    for seed in seeds:
        try:
            sim = run_txn_simulation(seed, args.steps, print if args.trace else None)
            if args.seed is not None:
                print(sim.summary())
        except SimulationFailure as failure:
            failed += 1
            print(failure, file=sys.stderr)
    total = len(seeds)
    print(f"{total - failed}/{total} seeds passed in {time.monotonic() - started:.1f} s")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
