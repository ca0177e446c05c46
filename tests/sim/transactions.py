"""A seeded simulation of transactions: the shipped transaction coordinator
core and the shipped partition logs (producer state, markers, the aborted
index, the LSO) under coordinator and partition-leader crashes at any step.

What runs is the product's code: ``TransactionCoordinatorCore`` decides,
its records go to a real ``Log`` (the ``__transaction_state`` partition),
producers' transactional batches and the coordinator's markers go to real
``Log``s of data partitions, and read_committed readers use the logs' own
last stable offset and aborted-transaction index with the client's filter
(``storage.batch.without_aborted``). The simulation plays the network and
the shells: it decides, step by step and from the seed, which producer acts
(init, add partitions, produce, end), which marker is written, when logs are
fsynced, when the clock moves (timeouts), and when the coordinator or a
partition leader crashes (its log cut at its last fsync; the coordinator's
core rebuilt from its log with a new coordinator epoch, its marker progress
forgotten).

A write counts (is answered) only once fsynced, as acks=all only once
replicated; a produce may also be appended and its answer lost, and then
retried with the same sequence.

Invariants, after every step, for every data partition, reading committed
data (below the fsynced end and the LSO, through the aborted index):
  1. Every visible record belongs to a transaction the coordinator decided
     to COMMIT (its PREPARE_COMMIT is in the coordinator's durable log).
  2. A transaction is visible in a partition all or nothing: if one of its
     records there is visible, every record of it acknowledged there is.
  3. No record is visible twice.
  4. The logs' own invariants (producer state, aborted index) hold.
And at the end, after healing (no more crashes, every decided transaction's
markers written): every transaction whose commit was acknowledged to its
producer is visible whole in every partition it wrote to; no aborted one is.
"""

from __future__ import annotations

import collections
import dataclasses
import random
import shutil
from collections.abc import Callable

from api.broker.transactions.coordinator import (TransactionCoordinatorCore, TxnError,
                                                 TxnState, decode, encode)
from protocol import TopicPartition
from storage.batch import (BatchBuilder, ControlType, build_batch, iter_batches, iter_records,
                           without_aborted)
from storage.config import LogConfig
from storage.errors import StorageError
from storage.log import Log
from tests.sim.replication import SimulationFailure, _lose_unflushed, _scratch_root

PARTITIONS = 3
PRODUCERS = 3
TIMEOUT_MS = 4_000
CONFIG = LogConfig(segment_bytes=1 << 30, flush_ms=-1)
ACTIONS = (("producer", 40), ("marker", 18), ("flush", 10), ("tick", 6),
           ("crash_coordinator", 2.5), ("crash_leader", 3))


@dataclasses.dataclass
class Txn:
    key: tuple[str, int]  # (transactional id, number)
    partitions: set[int] = dataclasses.field(default_factory=set)
    #: partition -> [(offset, value)] acknowledged (fsynced) to the producer.
    acked: dict[int, list[tuple[int, str]]] = dataclasses.field(default_factory=dict)
    sent: dict[int, list[str]] = dataclasses.field(default_factory=dict)
    decision: str | None = None  # "commit"/"abort": the coordinator's durable PREPARE_*
    commit_acked: bool = False


@dataclasses.dataclass
class Producer:
    tid: str
    producer_id: int = -1
    epoch: int = -1
    state: str = "NEW"  # NEW, READY, IN_TXN, ENDING, FENCED
    seq: dict[int, int] = dataclasses.field(default_factory=dict)
    txn: Txn | None = None
    number: int = 0
    #: A batch appended whose answer was lost: (partition, bytes, values).
    unanswered: tuple[int, bytes, list[str]] | None = None
    end_commit: bool = True


class TxnSimulation:
    def __init__(self, seed: int, trace: Callable[[str], None] | None = None) -> None:
        self.seed = seed
        self.rng = random.Random(seed)
        self.trace = trace
        self.root = _scratch_root()
        self.now_ms = 0
        self.step_no = 0
        self.logs: dict[str, Log] = {}
        for name in ["txn-0"] + [f"d-{p}" for p in range(PARTITIONS)]:
            self.logs[name] = Log.open(f"{self.root}/{name}", CONFIG, clock=self.clock)
        self.coordinator_epoch = 0
        self.core = self._new_core()
        self.next_producer_id = 1000
        self.producers = [Producer(f"app-{i}") for i in range(PRODUCERS)]
        self.txns: dict[tuple[str, int], Txn] = {}
        self.current: dict[str, Txn] = {}  # tid -> the transaction its coordinator state is about
        self.markers_done: dict[tuple[str, int], set[int]] = {}  # marker progress (volatile)
        self.pending_marker_flush: list[tuple[str, int, int]] = []
        self.counts: collections.Counter[str] = collections.Counter()

    def clock(self) -> int:
        return self.now_ms

    def _new_core(self) -> TransactionCoordinatorCore:
        return TransactionCoordinatorCore(max_timeout_ms=60_000, id_expiration_ms=10**9)

    def note(self, text: str) -> None:
        if self.trace is not None:
            self.trace(f"[{self.step_no}] {text}")

    def fail(self, invariant: str, details: str) -> None:
        raise SimulationFailure(
            f"transaction simulation: seed={self.seed} step={self.step_no}\n"
            f"invariant broken: {invariant}\n{details}\n"
            f"replay: python -m tests.unit.test_txn_simulation --seed {self.seed} --trace")

    # -- the coordinator's durable writes ------------------------------------------------
    def _persist(self, records: list) -> None:
        """Append the coordinator's records and fsync them: answered only then."""
        if not records:
            return
        log = self.logs["txn-0"]
        log.append(build_batch([encode(r) for r in records], timestamp_ms=self.now_ms),
                   leader_epoch=self.coordinator_epoch)
        log.flush()
        for record in records:
            if isinstance(record, tuple):
                continue
            txn = self.current.get(record.transactional_id)
            if txn is not None and record.state.preparing and txn.decision is None:
                txn.decision = "commit" if record.state == TxnState.PREPARE_COMMIT else "abort"
                self.note(f"{record.transactional_id}: decided {txn.decision} "
                          f"(epoch {record.producer_epoch})")

    def _coordinate(self, call: Callable[[TransactionCoordinatorCore], tuple]) -> dict | None:
        """Run a core operation; persist its records; its answer, or None
        for a refusal (retriable or not)."""
        try:
            answer, records = call(self.core)
        except TxnError as exc:
            self.counts[f"refused {exc.code}"] += 1
            return None
        self._persist(records)
        if isinstance(answer, TxnError):
            self.counts[f"refused {answer.code}"] += 1
            return None
        return answer

    # -- steps -------------------------------------------------------------------------
    def run(self, steps: int) -> None:
        try:
            for _ in range(steps):
                self.step_no += 1
                self.step()
                self.check()
            self.heal()
        finally:
            self.close()

    def step(self) -> None:
        names, weights = zip(*ACTIONS)
        action = self.rng.choices(names, weights)[0]
        self.counts[action] += 1
        getattr(self, f"_act_{action}")()

    def _act_producer(self) -> None:
        p = self.rng.choice(self.producers)
        if p.state in ("NEW", "FENCED"):
            answer = self._coordinate(lambda c: c.init_producer_id(
                p.tid, TIMEOUT_MS, self._fresh_id(), self.now_ms))
            if answer is not None:
                p.producer_id, p.epoch = answer["producer_id"], answer["producer_epoch"]
                p.state, p.seq, p.unanswered = "READY", {}, None
                self.note(f"{p.tid}: producer {p.producer_id} epoch {p.epoch}")
        elif p.state == "READY":
            parts = self.rng.sample(range(PARTITIONS), self.rng.randint(1, PARTITIONS))
            p.number += 1
            txn = Txn((p.tid, p.number))
            answer = self._coordinate(lambda c: c.add_partitions(
                p.tid, p.producer_id, p.epoch, [TopicPartition("d", x) for x in parts],
                self.now_ms))
            if answer is None:
                p.state = "FENCED"
                return
            txn.partitions = set(parts)
            self.txns[txn.key] = txn
            self.current[p.tid] = txn
            p.txn, p.state = txn, "IN_TXN"
            p.end_commit = self.rng.random() < 0.7
        elif p.state == "IN_TXN":
            # A client ends a transaction only once every send is answered.
            if self.rng.random() < 0.25 and p.txn.acked and p.unanswered is None:
                p.state = "ENDING"
                return
            self._produce(p)
        elif p.state == "ENDING":
            answer = self._coordinate(lambda c: c.end_txn(
                p.tid, p.producer_id, p.epoch, p.end_commit, self.now_ms))
            if answer is None:
                if self.core.txns.get(p.tid) is not None and \
                        self.core.txns[p.tid].producer_epoch != p.epoch:
                    p.state = "FENCED"  # timed out and aborted meanwhile
                return
            if p.end_commit:
                p.txn.commit_acked = True
            self.note(f"{p.tid}: end {'commit' if p.end_commit else 'abort'} answered")
            p.state = "WAITING"
        elif p.state == "WAITING":
            # The client retries EndTxn until the markers are written.
            state = self.core.txns.get(p.tid)
            if state is None or state.producer_epoch != p.epoch:
                p.state = "FENCED"
            elif state.state.complete:
                p.state, p.txn = "READY", None

    def _fresh_id(self) -> int:
        self.next_producer_id += 1
        return self.next_producer_id

    def _produce(self, p: Producer) -> None:
        """Send a batch of the open transaction, or again the one whose
        answer was lost (the client sends in order: that one first)."""
        txn = p.txn
        retry = p.unanswered is not None
        if retry:
            partition, batch, values = p.unanswered
        else:
            partition = self.rng.choice(sorted(txn.partitions))
            count = self.rng.randint(1, 3)
            start = len(txn.sent.get(partition, []))  # values numbered per partition
            values = [f"{p.tid}:{txn.key[1]}:{partition}:{start + i}" for i in range(count)]
            seq = p.seq.get(partition, 0)
            p.seq[partition] = seq + count  # assigned when the batch first leaves
            builder = BatchBuilder(producer_id=p.producer_id, producer_epoch=p.epoch,
                                   base_sequence=seq, transactional=True)
            for value in values:
                builder.append(None, value.encode(), timestamp_ms=self.now_ms)
            batch = builder.build()
            txn.sent.setdefault(partition, []).extend(values)
        log = self.logs[f"d-{partition}"]
        try:
            info = log.append(batch, leader_epoch=0)
        except StorageError as exc:
            self.counts[f"produce refused {exc.code}"] += 1
            if exc.code == "INVALID_PRODUCER_EPOCH":
                p.state = "FENCED"
            return
        if info.duplicate:
            self.counts["duplicate retries"] += 1
        if not retry and self.rng.random() < 0.1:
            p.unanswered = (partition, batch, values)  # appended; the answer is lost
            return
        log.flush()
        p.unanswered = None
        txn.acked.setdefault(partition, []).extend(
            (info.base_offset + i, value) for i, value in enumerate(values))

    def _act_marker(self) -> None:
        pending = self.core.pending_markers()
        if not pending:
            return
        decided = self.rng.choice(pending)
        key = (decided.transactional_id, decided.producer_epoch)
        done = self.markers_done.setdefault(key, set())
        left = sorted({tp.partition for tp in decided.partitions} - done)
        if not left:
            self._persist(self.core.complete(decided.transactional_id, decided.producer_epoch,
                                             self.now_ms))
            self.markers_done.pop(key, None)
            return
        partition = self.rng.choice(left)
        log = self.logs[f"d-{partition}"]
        control = (ControlType.COMMIT if decided.state == TxnState.PREPARE_COMMIT
                   else ControlType.ABORT)
        try:
            log.append_marker(control, decided.producer_id, decided.producer_epoch,
                              self.coordinator_epoch, leader_epoch=0)
        except StorageError as exc:
            self.counts[f"marker refused {exc.code}"] += 1
            done.add(partition)  # fenced: a newer epoch or coordinator wrote past it
            return
        if self.rng.random() < 0.8:
            log.flush()
            done.add(partition)  # the leader answered: committed
        self.counts["markers"] += 1

    def _act_flush(self) -> None:
        self.logs[self.rng.choice(sorted(self.logs))].flush()

    def _act_tick(self) -> None:
        self.now_ms += self.rng.choice((50, 200, 1_000, 3_000))
        self._persist(self.core.tick(self.now_ms))

    def _act_crash_coordinator(self) -> None:
        self._crash("txn-0")
        self.coordinator_epoch += 1
        self.core = self._new_core()
        log = self.logs["txn-0"]
        for _header, batch in iter_batches(log.read(0, 1 << 30) if log.log_end_offset else b""):
            for record in iter_records(batch):
                self.core.replay(decode(record.key, record.value))
        self.markers_done.clear()
        self.note(f"coordinator crashed; epoch {self.coordinator_epoch}, "
                  f"{len(self.core.pending_markers())} decided transactions to finish")

    def _act_crash_leader(self) -> None:
        partition = self.rng.randrange(PARTITIONS)
        lost = self._crash(f"d-{partition}")
        self.note(f"leader of d-{partition} crashed, {lost} unflushed records lost")

    def _crash(self, name: str) -> int:
        log = self.logs[name]
        point = log.recovery_point
        lost = _lose_unflushed(log)
        self.logs[name] = Log.open(f"{self.root}/{name}", CONFIG, recovery_point=point,
                                   clock=self.clock)
        return lost

    # -- checking ------------------------------------------------------------------------
    def stable_end(self, partition: int) -> int:
        """How far a read_committed consumer reads: the fsynced end (the
        high watermark's stand-in) or the LSO, if lower."""
        log = self.logs[f"d-{partition}"]
        first = log.first_unstable_offset
        return log.recovery_point if first is None else min(first, log.recovery_point)

    def committed_view(self, partition: int) -> list[tuple[int, str]]:
        """What a read_committed consumer reads: below ``stable_end``,
        aborted transactions filtered out, markers skipped."""
        log = self.logs[f"d-{partition}"]
        upper = self.stable_end(partition)
        if upper <= log.log_start_offset:
            return []
        data = log.read(log.log_start_offset, 1 << 30, upper_bound_offset=upper)
        aborted = [{"producer_id": t.producer_id, "first_offset": t.first_offset}
                   for t in log.collect_aborted(log.log_start_offset, upper)]
        out = []
        for header, batch in without_aborted(list(iter_batches(data)), aborted):
            if batch is None or header.is_control:
                continue
            out.extend((r.offset, r.value.decode()) for r in iter_records(batch)
                       if r.offset < upper)
        return out

    def check(self) -> None:
        for partition in range(PARTITIONS):
            self.logs[f"d-{partition}"].check_invariants()
            visible = self.committed_view(partition)
            values = [v for _, v in visible]
            if len(values) != len(set(values)):
                dup = [v for v, n in collections.Counter(values).items() if n > 1]
                self.fail("3 (no record visible twice)", f"d-{partition}: {dup[:5]}")
            by_txn: dict[tuple[str, int], set[str]] = collections.defaultdict(set)
            for value in values:
                tid, number, _p, _i = value.split(":")
                by_txn[(tid, int(number))].add(value)
            for key, seen in by_txn.items():
                txn = self.txns[key]
                if txn.decision != "commit":
                    self.fail("1 (only committed transactions are visible)",
                              f"d-{partition}: {key} (decision {txn.decision}) shows "
                              f"{sorted(seen)[:5]}")
                # Records past the stable end are not readable yet (another
                # transaction, still open, holds the LSO before them).
                stable = self.stable_end(partition)
                missing = {v for o, v in txn.acked.get(partition, []) if o < stable} - seen
                if missing:
                    self.fail("2 (all or nothing per partition)",
                              f"d-{partition}: {key} shows {len(seen)} records but not the "
                              f"acknowledged {sorted(missing)[:5]} (stable end {stable})")
        self.logs["txn-0"].check_invariants()
        self.core.check_invariants()

    def heal(self) -> None:
        """No more crashes: flush everything, let every open transaction time
        out (abandoned ones are aborted), write every decided transaction's
        markers; then the final checks."""
        self.now_ms += 2 * TIMEOUT_MS + 1
        self._persist(self.core.tick(self.now_ms))
        for _ in range(2_000):
            for log in self.logs.values():
                log.flush()
            if not self.core.pending_markers():
                break
            self.step_no += 1
            self._act_marker()
            self.check()
        if self.core.pending_markers():
            self.fail("5 (healing converges)", "decided transactions never completed")
        for log in self.logs.values():
            log.flush()
        self.check()
        views = {p: {v for _, v in self.committed_view(p)} for p in range(PARTITIONS)}
        for key, txn in self.txns.items():
            if txn.commit_acked:
                if txn.decision != "commit":
                    self.fail("5 (no committed transaction lost)",
                              f"{key}: commit acknowledged, decision {txn.decision}")
                for partition, acked in txn.acked.items():
                    missing = {v for _o, v in acked} - views[partition]
                    if missing:
                        self.fail("5 (no committed transaction lost)",
                                  f"{key}: acknowledged {sorted(missing)[:5]} missing from "
                                  f"d-{partition}")
            if txn.decision == "abort":
                for partition in txn.partitions:
                    shown = {v for v in views[partition] if v.startswith(f"{key[0]}:{key[1]}:")}
                    if shown:
                        self.fail("1 (only committed transactions are visible)",
                                  f"{key}: aborted, yet d-{partition} shows {sorted(shown)[:5]}")

    def close(self) -> None:
        for log in self.logs.values():
            log.abandon()
        shutil.rmtree(self.root, ignore_errors=True)

    def summary(self) -> str:
        decided = collections.Counter(t.decision for t in self.txns.values())
        return (f"seed={self.seed} steps={self.step_no} transactions={len(self.txns)} "
                f"decided={dict(decided)} commits acknowledged="
                f"{sum(t.commit_acked for t in self.txns.values())}\n"
                f"  {dict(sorted(self.counts.items()))}")


def run_txn_simulation(seed: int, steps: int, trace: Callable[[str], None] | None = None
                       ) -> TxnSimulation:
    sim = TxnSimulation(seed, trace)
    sim.run(steps)
    return sim
