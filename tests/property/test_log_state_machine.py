"""The partition log against a simple in-memory reference model.

Hypothesis drives random sequences of appends, reads, rolls, truncations,
log-start moves, retention, flushes, clean restarts and crashes. A crash
abandons the log without flushing and then damages the unflushed tail of the
active segment: it cuts the file at a random byte or flips a random byte.
After every step the log must agree with the model:

  - it never returns a corrupt batch (every read is CRC-checked and decoded);
  - it keeps every flushed batch, byte for byte, across crashes;
  - offsets stay contiguous from the log start to the log end;
  - its leader-epoch cache equals the model's.

The flipped byte is never inside a batch's partition-leader-epoch field: that
field sits outside the CRC by design (the leader stamps it, as in Kafka), so
no reader can detect its corruption; every other byte of a batch is covered
by the CRC or by a sanity check (length, magic, offset contiguity).
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import tempfile

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (RuleBasedStateMachine, initialize, invariant, precondition,
                                 rule)

from storage import batch as fmt
from storage.batch import BatchBuilder, decode_batches
from storage.config import LogConfig
from storage.log import Log


@dataclasses.dataclass
class ModelBatch:
    base_offset: int
    epoch: int
    records: list[tuple[bytes | None, bytes, int]]  # key, value, timestamp

    @property
    def next_offset(self) -> int:
        return self.base_offset + len(self.records)


class LogModel:
    """What the log should hold: batches, log start, flushed point, epochs."""

    def __init__(self) -> None:
        self.batches: list[ModelBatch] = []
        self.log_start = 0
        self.flushed = 0
        self.epochs: list[tuple[int, int]] = []

    @property
    def end(self) -> int:
        return self.batches[-1].next_offset if self.batches else self.log_start

    def append(self, batch: ModelBatch) -> None:
        self.batches.append(batch)
        if not self.epochs or batch.epoch > self.epochs[-1][0]:
            # An epoch that began where this batch does never held a record.
            while self.epochs and self.epochs[-1][1] >= batch.base_offset:
                self.epochs.pop()
            self.epochs.append((batch.epoch, batch.base_offset))

    def truncate_to(self, offset: int) -> None:
        """Drop batches whose last offset is >= offset (whole batches); an
        offset at or past the end changes nothing."""
        if offset >= self.end:
            return
        self.batches = [b for b in self.batches if b.next_offset <= offset]
        end = self.end
        self.epochs = [(e, s) for e, s in self.epochs if s < end]
        self.flushed = min(self.flushed, end)

    def move_start(self, offset: int) -> None:
        self.log_start = offset
        self.batches = [b for b in self.batches if b.next_offset > offset]
        kept = [(e, s) for e, s in self.epochs if s <= offset]
        later = [(e, s) for e, s in self.epochs if s > offset]
        # The latest epoch stays even when nothing is left after the start.
        self.epochs = ([(kept[-1][0], offset)] if kept else []) + later

    def records_from(self, offset: int) -> list[tuple[int, bytes | None, bytes, int]]:
        out = []
        for b in self.batches:
            for i, (key, value, ts) in enumerate(b.records):
                if b.base_offset + i >= offset:
                    out.append((b.base_offset + i, key, value, ts))
        return out

    def boundaries(self) -> list[int]:
        return [b.base_offset for b in self.batches] + [self.end]


def _epoch_field_bytes(data: bytes) -> set[int]:
    """Positions of the leader-epoch field of every whole batch in ``data``."""
    positions, pos = set(), 0
    for header, view in fmt.iter_batches(data):
        positions.update(range(pos + fmt.LEADER_EPOCH_OFFSET, pos + fmt.MAGIC_OFFSET))
        pos += len(view)
    return positions


class LogMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.root = tempfile.mkdtemp(prefix="kraftlog-sm-")
        self.dir = os.path.join(self.root, "topic-0")
        self.model = LogModel()
        self.epoch = 0
        self.log: Log | None = None
        self.config: LogConfig | None = None

    @initialize(segment_bytes=st.integers(1024, 6000), interval=st.integers(0, 700))
    def open_log(self, segment_bytes: int, interval: int) -> None:
        self.config = LogConfig(segment_bytes=segment_bytes, index_interval_bytes=interval,
                                flush_ms=-1, retention_ms=-1)
        self.log = Log.open(self.dir, self.config)

    def teardown(self) -> None:
        if self.log is not None:
            self.log.abandon()
        shutil.rmtree(self.root, ignore_errors=True)

    # -- operations ----------------------------------------------------------
    @rule(count=st.integers(1, 6), value_bytes=st.integers(0, 300), bump_epoch=st.booleans(),
          keyed=st.booleans(), ts_base=st.integers(0, 10_000))
    def append(self, count, value_bytes, bump_epoch, keyed, ts_base) -> None:
        if bump_epoch:
            self.epoch += 1
        builder = BatchBuilder()
        records = []
        for i in range(count):
            key = f"k{self.model.end + i}".encode() if keyed else None
            value = os.urandom(value_bytes)
            builder.append(key, value, timestamp_ms=ts_base + i * 7)
            records.append((key, value, ts_base + i * 7))
        info = self.log.append(builder.build(), leader_epoch=self.epoch)
        assert info.base_offset == self.model.end
        self.model.append(ModelBatch(info.base_offset, self.epoch, records))

    @rule(data=st.data(), max_bytes=st.integers(1, 5000))
    def read(self, data, max_bytes) -> None:
        offset = data.draw(st.integers(self.model.log_start, self.model.end))
        raw = self.log.read(offset, max_bytes)
        records = list(decode_batches(raw))
        if offset == self.model.end:
            assert raw == b""
            return
        assert records, "a read below the log end returns at least one batch"
        assert records[0].offset <= offset
        wanted = self.model.records_from(offset)
        got = [(r.offset, r.key, r.value, r.timestamp) for r in records if r.offset >= offset]
        assert got == wanted[:len(got)]
        batches = list(fmt.iter_batches(raw))
        assert len(raw) <= max_bytes or len(batches) == 1

    @rule()
    def roll(self) -> None:
        self.log.roll()

    @rule(data=st.data())
    def truncate(self, data) -> None:
        offset = data.draw(st.integers(self.model.log_start, self.model.end))
        self.log.truncate_to(offset)
        self.model.truncate_to(offset)
        self.epoch = max(self.epoch, self.model.epochs[-1][0] if self.model.epochs else 0)

    @rule(data=st.data())
    def delete_records_before(self, data) -> None:
        offset = data.draw(st.integers(self.model.log_start, self.model.end))
        self.log.delete_records_before(offset)
        self.model.move_start(max(offset, self.model.log_start))

    @rule(limit=st.integers(0, 8000))
    def retention_by_size(self, limit) -> None:
        before = [(s.base_offset, s.size_bytes) for s in self.log.segments]
        self.log.config = dataclasses.replace(self.config, retention_bytes=limit)
        deleted = self.log.delete_retained_segments()
        self.log.config = self.config
        if deleted:
            remaining = sum(size for _, size in before[deleted:])
            assert remaining + before[deleted - 1][1] > limit, "deleted one segment too many"
            new_start = max(self.model.log_start, before[deleted][0] if deleted < len(before)
                            else self.model.end)
            self.model.move_start(new_start)

    @rule()
    def flush(self) -> None:
        self.log.flush()
        self.model.flushed = self.model.end

    @rule()
    def clean_restart(self) -> None:
        self.log.close()
        self.log = Log.open(self.dir, self.config, log_start_offset=self.model.log_start,
                            clean_shutdown=True)
        assert self.log.recovery_point == self.model.end
        # Opening forgets epochs that hold no record (they start at the end).
        self.model.epochs = [(e, s) for e, s in self.model.epochs if s < self.model.end]

    @rule(mode=st.sampled_from(["none", "cut", "flip"]), where=st.floats(0, 1),
          bit=st.integers(0, 7))
    def crash(self, mode, where, bit) -> None:
        recovery_point = self.log.recovery_point
        assert recovery_point >= self.model.flushed or recovery_point >= self.model.log_start
        active = self.log.active_segment
        if active.base_offset >= recovery_point:
            flushed_pos = 0
        else:
            found = active.find_batch(recovery_point)
            flushed_pos = found[0] if found else active.size_bytes
        path, size = active.log_path, active.size_bytes
        self.log.abandon()
        if size > flushed_pos and mode != "none":
            with open(path, "r+b") as f:
                f.seek(flushed_pos)
                tail = f.read()
                target = flushed_pos + int(where * (len(tail) - 1))
                if mode == "cut":
                    f.truncate(target)
                else:
                    forbidden = {flushed_pos + p for p in _epoch_field_bytes(tail)}
                    while target in forbidden:
                        target += 1
                    if target < size:
                        f.seek(target)
                        f.write(bytes([tail[target - flushed_pos] ^ (1 << bit)]))
        self.log = Log.open(self.dir, self.config, recovery_point=recovery_point,
                            log_start_offset=self.model.log_start)
        new_end = self.log.log_end_offset
        assert new_end >= min(recovery_point, self.model.end), "lost flushed data"
        assert new_end <= self.model.end
        # Valid ends: a batch boundary, or the log start when a crash took
        # every visible record (the first batch may begin below it).
        valid_ends = {max(b, self.model.log_start) for b in self.model.boundaries()}
        assert new_end in valid_ends, "recovery stopped inside a batch"
        self.model.truncate_to(new_end)
        self.model.epochs = [(e, s) for e, s in self.model.epochs if s < self.model.end]
        self.model.flushed = new_end

    # -- invariants --------------------------------------------------------
    @invariant()
    def agrees_with_model(self) -> None:
        if self.log is None:
            return
        self.log.check_invariants()
        assert self.log.log_end_offset == self.model.end
        assert self.log.log_start_offset == self.model.log_start
        assert self.log.epoch_cache.entries == self.model.epochs
        assert self.log.recovery_point <= self.log.log_end_offset

    @precondition(lambda self: self.log is not None)
    @invariant()
    def contents_match(self) -> None:
        offset, got = self.model.log_start, []
        while offset < self.log.log_end_offset:
            records = [r for r in decode_batches(self.log.read(offset, 1 << 20))
                       if r.offset >= offset]
            assert records
            got.extend((r.offset, r.key, r.value, r.timestamp) for r in records)
            offset = records[-1].offset + 1
        assert got == self.model.records_from(self.model.log_start)
        assert [o for o, *_ in got] == list(range(self.model.log_start, self.model.end))


LogMachine.TestCase.settings = settings(
    max_examples=int(os.environ.get("KRAFTLOG_SM_EXAMPLES", "150")),
    stateful_step_count=40, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
TestLogStateMachine = LogMachine.TestCase
