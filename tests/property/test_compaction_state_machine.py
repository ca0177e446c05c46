"""Log compaction against a reference model.

Hypothesis drives random sequences of keyed appends (a few keys, so they
repeat, and tombstones), rolls, flushes, clock moves, cleaner passes (some
with an offset map so small that the dirty section takes several passes),
passes interrupted by a crash at every step of the swap protocol, crashes
and restarts. After every step the log, read from its start, must agree
with what was appended:

  - every record it returns is the record appended at that offset (offsets
    never change, none is reused), in offset order;
  - the latest record of every key is there, unless it is a tombstone whose
    ``delete.retention.ms`` had passed at a pass after it was first cleaned;
  - after a pass whose offset map covered the whole dirty section, no key
    has an older record below the cleaned point (the log really is compacted);
  - a keyless record is refused and nothing is appended;
  - the log's own invariants hold (contiguous segments, indexes, epochs).
"""

from __future__ import annotations

import os
import shutil
import tempfile

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from storage import cleaner
from storage.batch import BatchBuilder, decode_batches
from storage.config import LogConfig
from storage.errors import InvalidRecordError
from storage.log import Log

KEYS = [b"a", b"b", b"c", b"d", b"e" * 40]  # the last one is hashed in the offset map
RETENTION_MS = 1_000
CRASH_STEPS = ["cleaned", "renamed-to-swap", "swap-durable", "old-deleted", "swapped",
               "checkpointed"]


class Crash(Exception):
    pass


class CompactionMachine(RuleBasedStateMachine):
    @initialize()
    def open_log(self) -> None:
        self.dir = tempfile.mkdtemp(prefix="kraftlog-compact-sm-")
        self.now = 1_000_000
        self.config = LogConfig(segment_bytes=1024, index_interval_bytes=128,
                                cleanup_policy="compact", min_cleanable_dirty_ratio=0.0,
                                delete_retention_ms=RETENTION_MS, flush_ms=-1)
        self.log = Log.open(self.dir, self.config, clock=lambda: self.now)
        self.appended: dict[int, tuple[bytes, bytes | None]] = {}  # offset -> key, value
        self.cleaned_time: dict[int, int] = {}  # offset -> when a pass first covered it
        self.may_be_gone: set[int] = set()  # tombstones a pass was allowed to remove
        self.compacted_below = 0  # a full pass left every key once below this

    def teardown(self) -> None:
        if not self.log.closed:
            self.log.abandon()
        shutil.rmtree(self.dir, ignore_errors=True)

    # -- the log's life ------------------------------------------------------
    @rule(records=st.lists(st.tuples(st.sampled_from(KEYS),
                                     st.one_of(st.none(), st.binary(min_size=1, max_size=60))),
                           min_size=1, max_size=5))
    def append(self, records) -> None:
        builder = BatchBuilder()
        for key, value in records:
            builder.append(key, value, timestamp_ms=self.now)
        info = self.log.append(builder.build(), leader_epoch=1)
        for i, (key, value) in enumerate(records):
            self.appended[info.base_offset + i] = (key, value)

    @rule()
    def keyless_is_refused(self) -> None:
        builder = BatchBuilder()
        builder.append(b"k", b"v", timestamp_ms=self.now)
        builder.append(None, b"no key", timestamp_ms=self.now)
        end = self.log.log_end_offset
        try:
            self.log.append(builder.build(), leader_epoch=1)
        except InvalidRecordError as exc:
            assert "no key" in str(exc)
        else:
            raise AssertionError("a keyless record was appended to a compacted log")
        assert self.log.log_end_offset == end

    @rule()
    def roll(self) -> None:
        self.log.roll()

    @rule()
    def flush(self) -> None:
        self.log.flush()

    @rule(ms=st.sampled_from([10, 400, 1_500]))
    def tick(self, ms: int) -> None:
        self.now += ms

    @rule(small_map=st.booleans())
    def clean(self, small_map: bool) -> None:
        self._clean(small_map, crash_at=None)

    @rule(small_map=st.booleans(), step=st.sampled_from(CRASH_STEPS))
    def clean_and_crash(self, small_map: bool, step: str) -> None:
        self._clean(small_map, crash_at=step)

    @rule()
    def restart(self) -> None:
        start = self.log.log_start_offset
        self.log.close()
        self.log = Log.open(self.dir, self.config, recovery_point=self.log.recovery_point,
                            log_start_offset=start, clean_shutdown=True, clock=lambda: self.now)

    @rule()
    def crash(self) -> None:
        self._crash_and_reopen()

    # -- helpers ---------------------------------------------------------------
    def _clean(self, small_map: bool, crash_at: str | None) -> None:
        self.log.flush()  # only fsynced data is cleaned
        plan = cleaner.plan_clean(self.log, self.now, force=True)
        if plan is None:
            return
        budget = 300 if small_map else 1 << 20
        result = cleaner.clean(plan, budget_bytes=budget)

        def hook(step: str) -> None:
            if step == crash_at:
                raise Crash(step)

        try:
            hook("cleaned")
            swapped = cleaner.swap(self.log, result, hook)
        except Crash:
            if crash_at != "cleaned":
                # Once a .log.swap exists, reopening completes the swap.
                self._note_pass(plan, result)
            self._crash_and_reopen()
            return
        assert swapped
        self._note_pass(plan, result)

    def _note_pass(self, plan, result) -> None:
        for offset in self.appended:
            if offset < result.map_end:
                self.cleaned_time.setdefault(offset, plan.now_ms)
        for offset, (_key, value) in self.appended.items():
            first = self.cleaned_time.get(offset)
            if value is None and first is not None and first + RETENTION_MS <= plan.now_ms:
                self.may_be_gone.add(offset)
        if result.map_end == plan.dirty_end:
            self.compacted_below = max(self.compacted_below, result.map_end)

    def _crash_and_reopen(self) -> None:
        point, start = self.log.recovery_point, self.log.log_start_offset
        self.log.abandon()
        self.log = Log.open(self.dir, self.config, recovery_point=point,
                            log_start_offset=start, clean_shutdown=False,
                            clock=lambda: self.now)
        # Only flushed records must survive a crash: forget the rest.
        end = self.log.log_end_offset
        self.appended = {o: r for o, r in self.appended.items() if o < end}

    def _read_all(self):
        data = self.log.read(self.log.log_start_offset, 1 << 30)
        return list(decode_batches(data))

    # -- what must always hold -----------------------------------------------------------
    @invariant()
    def agrees_with_the_model(self) -> None:
        if not hasattr(self, "log"):
            return
        self.log.check_invariants()
        records = self._read_all()
        offsets = [r.offset for r in records]
        assert offsets == sorted(set(offsets)), "offsets out of order or repeated"
        for record in records:
            assert (record.key, record.value) == self.appended[record.offset], record
        present = set(offsets)
        latest: dict[bytes, int] = {}
        for offset in sorted(self.appended):
            latest[self.appended[offset][0]] = offset
        for key, offset in latest.items():
            if offset not in present:
                assert offset in self.may_be_gone, (
                    f"the latest record of {key!r} (offset {offset}) is gone")
        for record in records:
            if record.offset < self.compacted_below:
                newest = max(o for o in self.appended if o < self.compacted_below
                             and self.appended[o][0] == record.key)
                assert record.offset == newest, (
                    f"{record.key!r} at {record.offset} survived a full pass; newest "
                    f"below {self.compacted_below} is {newest}")


CompactionMachine.TestCase.settings = settings(
    max_examples=int(os.environ.get("KRAFTLOG_SM_EXAMPLES", "100")),
    stateful_step_count=40, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
TestCompactionStateMachine = CompactionMachine.TestCase
