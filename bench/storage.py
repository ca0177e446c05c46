"""Storage benchmark: ``kraftlog bench storage`` (or ``python -m bench.storage``).

One run measures, on the local disk, with pre-built ~1 MiB batches of small
records (built before any timing starts, reused from a pool of distinct ones):

1. raw reference: ``os.write`` of the very same batch bytes to a plain file,
   then one fsync;
2. ``Log.append`` of ``--log-mb`` MiB, then ``Log.flush`` (fsync), against
   the raw reference (target: at least 0.80 of it). Steps 1 and 2 alternate
   in 64 MiB rounds, each with its own clock, so that a drift in page-cache
   write speed during the run favours neither;
3. sequential ``Log.read`` of the whole log, without decoding records, plus a
   short read-and-decode run to show what decoding costs a client;
4. random offset lookups (``Log.read(offset, max_bytes=1)``) on a small and
   the big log: p50/p99/mean latency (target: big within 2x of small);
5. opening after an unclean shutdown with ``--unflushed-mb`` MiB not yet
   fsynced, for the small and the big log, then twice as much unflushed, and
   a clean open, each 3 times: recovery time should follow unflushed bytes,
   not log size;
6. ``Log.open`` of ``--new-logs`` new partitions (each a directory of its
   own, as a broker makes for every partition it is given), against the
   least a new log's files take: ``os.mkdir`` and one empty segment file.
   It runs first, on a quiet disk, and is printed last.

Sizes are in MiB (2**20 bytes) and rates in MiB/s throughout. Nothing drops
the page cache: the logs fit in RAM, so reads are mostly served from memory
and the output says so. Data goes to a fresh temporary directory (inside
``--dir``, default the current directory), deleted at the end unless
``--keep``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import platform
import random
import shutil
import statistics
import sys
import tempfile
import time
from typing import Callable, Iterable, Sequence

from api import table
from storage import batch as fmt
from storage.config import MAX_MESSAGE_BYTES_DEFAULT, SEGMENT_BYTES_DEFAULT, LogConfig
from storage.log import Log

MiB = 1024 * 1024
READ_MAX_BYTES = MiB  # max_bytes of each sequential Log.read
DECODE_SAMPLE_MIB = 64  # size of the read+decode sample
POOL_BATCHES = 8  # distinct pre-built batches, appended in turn
APPEND_TARGET_RATIO = 0.80  # append MiB/s over raw write MiB/s, at least
LOOKUP_TARGET_RATIO = 2.0  # big-log over small-log lookup latency, at most
MAX_WRITE_CALLS_PER_BUFFER = 1000  # bound on short-write retries
WRITE_ROUND_BYTES = 64 * MiB  # raw writes and appends alternate in rounds of this size
RECOVERY_ROUNDS = 3  # each open scenario is timed this many times per log
NEW_LOGS_ROUND = 250  # new logs made by each side before the other's turn (phase 6)


# ---------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------
def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``kraftlog bench storage``."""
    parser.add_argument("--dir", default=None,
                        help="parent of the fresh temporary data directory "
                             "(default: the current directory)")
    parser.add_argument("--keep", action="store_true",
                        help="keep the data directory instead of deleting it")
    parser.add_argument("--log-mb", type=_positive_int, default=2048,
                        help="size of the big log, MiB (default 2048)")
    parser.add_argument("--small-mb", type=_positive_int, default=10,
                        help="size of the small log for lookups and recovery, MiB (default 10)")
    parser.add_argument("--record-bytes", type=_positive_int, default=100,
                        help="value size of each record, bytes; keys are None (default 100)")
    parser.add_argument("--batch-kb", type=_positive_int, default=1024,
                        help="target batch size, KiB (default 1024)")
    parser.add_argument("--lookups", type=_positive_int, default=2000,
                        help="random offset lookups per log (default 2000)")
    parser.add_argument("--unflushed-mb", type=_positive_int, default=64,
                        help="MiB left unflushed before a simulated crash (default 64); "
                             "recovery is also measured with twice as much")
    parser.add_argument("--new-logs", type=_positive_int, default=2000,
                        help="new partition logs made by Log.open in phase 6 (default 2000)")
    parser.add_argument("--seed", type=int, default=1,
                        help="seed of the record values and lookup offsets (default 1)")
    parser.add_argument("--json", metavar="PATH", default=None,
                        help="also write the results as JSON to PATH")


def _positive_int(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text}")
    return value


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.storage",
                                     description="Benchmark the storage engine (storage.log).")
    add_arguments(parser)
    return run(parser.parse_args(argv))


def run(args: argparse.Namespace) -> int:
    """Run every phase, print the tables, write JSON if asked. Returns 0, or
    1 when the disk lacks room (targets missed are reported, not fatal)."""
    parent = os.path.abspath(args.dir or os.getcwd())
    os.makedirs(parent, exist_ok=True)
    needed = bytes_needed(args)
    free = shutil.disk_usage(parent).free
    if free < needed:
        print(f"error: {parent} has {free / MiB:.0f} MiB free, the benchmark needs "
              f"about {needed / MiB:.0f} MiB", file=sys.stderr)
        return 1
    workdir = tempfile.mkdtemp(prefix="kraftlog-bench-", dir=parent)
    try:
        results = run_phases(args, workdir)
    finally:
        if args.keep:
            print(f"data kept in {workdir}", flush=True)
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    if args.json:
        write_json(args.json, results)
        print(f"results written to {args.json}", flush=True)
    return 0


def bytes_needed(args: argparse.Namespace) -> int:
    """Disk the run occupies at its peak (the raw file is kept until the
    end), with 10% and a few batches to spare."""
    grown = 2 * args.unflushed_mb  # at most 2K unflushed MiB on a log at a time
    total_mib = 2 * args.log_mb + args.small_mb + 2 * grown
    return int(total_mib * MiB * 1.1) + 4 * args.batch_kb * 1024


# ---------------------------------------------------------------------------
# Measurements and their presentation
# ---------------------------------------------------------------------------
@dataclasses.dataclass
class Throughput:
    """Bytes and records moved in some seconds."""

    bytes: int
    records: int
    seconds: float
    sync_seconds: float = 0.0  # part of ``seconds`` spent in the final fsync

    @property
    def mib_per_s(self) -> float:
        return self.bytes / MiB / self.seconds if self.seconds > 0 else math.inf

    @property
    def records_per_s(self) -> float:
        return self.records / self.seconds if self.seconds > 0 else math.inf

    def to_json(self) -> dict:
        return {"bytes": self.bytes, "records": self.records, "seconds": self.seconds,
                "sync_seconds": self.sync_seconds, "mib_per_s": self.mib_per_s,
                "records_per_s": self.records_per_s}


@dataclasses.dataclass
class Latency:
    """Summary of latencies, microseconds."""

    count: int
    p50_us: float
    p99_us: float
    mean_us: float
    max_us: float

    @classmethod
    def of(cls, samples_us: list[float]) -> "Latency":
        ordered = sorted(samples_us)
        return cls(len(ordered), percentile(ordered, 50), percentile(ordered, 99),
                   sum(ordered) / len(ordered), ordered[-1])


def percentile(ordered: list[float], pct: float) -> float:
    """Nearest-rank percentile of an already sorted, non-empty list."""
    rank = max(1, math.ceil(pct / 100 * len(ordered)))
    return ordered[rank - 1]


def format_table(headers: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    """Benchmark figures: the first column to the left, the numbers right."""
    return table.format_table(headers, rows, numbers_right=True, rule=True)


def print_section(title: str) -> None:
    print(f"\n{title}\n{'=' * len(title)}", flush=True)


def ratio(numerator: float, denominator: float) -> float:
    return numerator / denominator if denominator > 0 else math.inf


class Progress:
    """``label 37%`` on stderr: rewritten in place on a terminal, one line per
    25% otherwise, so logs of non-interactive runs stay short."""

    def __init__(self, label: str, total: int) -> None:
        self.label = label
        self.total = max(total, 1)
        self.tty = sys.stderr.isatty()
        self.step = 1 if self.tty else 25
        self.shown = 0

    def update(self, done: int) -> None:
        pct = min(100, done * 100 // self.total)
        mark = pct - pct % self.step
        if mark <= self.shown:
            return
        self.shown = mark
        if self.tty:
            sys.stderr.write(f"\r{self.label} {mark:3d}%")
        else:
            sys.stderr.write(f"{self.label} {mark}%\n")
        sys.stderr.flush()

    def finish(self) -> None:
        if self.tty:
            sys.stderr.write("\r" + " " * (len(self.label) + 5) + "\r")
            sys.stderr.flush()


# ---------------------------------------------------------------------------
# Machine facts
# ---------------------------------------------------------------------------
def machine_facts(directory: str) -> dict:
    ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    fs_type, device = filesystem_of(directory)
    usage = shutil.disk_usage(directory)
    return {"cpu_count": os.cpu_count(), "ram_bytes": ram,
            "python": f"{platform.python_version()} ({platform.python_implementation()})",
            "platform": platform.platform(), "directory": directory,
            "filesystem": fs_type, "device": device, "free_bytes": usage.free}


def filesystem_of(path: str) -> tuple[str, str]:
    """(type, device) of the mount holding ``path``, from /proc/mounts."""
    path = os.path.realpath(path)
    best_mount, best = "", ("unknown", "unknown")
    try:
        with open("/proc/mounts", encoding="utf-8") as f:
            lines = f.read().splitlines()
    except OSError:
        return best
    for line in lines:
        fields = line.split()
        if len(fields) < 3:
            continue
        device, mount, fs_type = fields[0], fields[1].replace("\\040", " "), fields[2]
        inside = path == mount or path.startswith(mount.rstrip("/") + "/")
        if inside and len(mount) >= len(best_mount):
            best_mount, best = mount, (fs_type, device)
    return best


def describe_machine(facts: dict) -> str:
    return (f"machine: {facts['cpu_count']} CPUs, {facts['ram_bytes'] / 2**30:.1f} GiB RAM, "
            f"Python {facts['python']}, {facts['platform']}\n"
            f"data:    {facts['directory']} on {facts['filesystem']} ({facts['device']}), "
            f"{facts['free_bytes'] / 2**30:.1f} GiB free")


# ---------------------------------------------------------------------------
# Workload: pre-built batches
# ---------------------------------------------------------------------------
def build_batch_pool(rng: random.Random, record_bytes: int, batch_bytes: int,
                     count: int = POOL_BATCHES) -> list[bytes]:
    """``count`` distinct batches of random values (key None), each filled up
    to ``batch_bytes``."""
    return [build_one_batch(rng, record_bytes, batch_bytes) for _ in range(count)]


def build_one_batch(rng: random.Random, record_bytes: int, batch_bytes: int) -> bytes:
    builder = fmt.BatchBuilder()
    timestamp_ms = int(time.time() * 1000)
    max_records = max(1, batch_bytes // record_bytes)  # bounds the loop
    for _ in range(max_records):
        value = rng.randbytes(record_bytes)
        if builder.record_count and not builder.has_room_for(None, value, batch_bytes):
            break
        builder.append(None, value, timestamp_ms=timestamp_ms)
    return builder.build()


def batches_for(pool: Sequence[bytes], total_bytes: int) -> list[bytes]:
    """The pool's batches in turn, as many as come closest to ``total_bytes``
    (at least one)."""
    mean_bytes = sum(map(len, pool)) / len(pool)
    count = max(1, round(total_bytes / mean_bytes))
    return [pool[i % len(pool)] for i in range(count)]


def records_in(batches: Iterable[bytes]) -> int:
    return sum(fmt.parse_header(b).record_count for b in batches)


def log_config(pool: Sequence[bytes]) -> LogConfig:
    """1 GiB segments, batches of any pool size accepted, no periodic flush."""
    largest = max(len(b) for b in pool)
    return LogConfig(segment_bytes=SEGMENT_BYTES_DEFAULT, flush_ms=-1,
                     max_message_bytes=max(MAX_MESSAGE_BYTES_DEFAULT, largest))


# ---------------------------------------------------------------------------
# 1-2. Writes
# ---------------------------------------------------------------------------
def measure_writes(raw_path: str, log_dir: str, config: LogConfig,
                   batches: Sequence[bytes]) -> tuple[Log, Throughput, Throughput]:
    """The same ``batches`` written twice: sequential os.write to a new plain
    file (then one fsync), and Log.append to a new log (then Log.flush).

    The two alternate in rounds of ``WRITE_ROUND_BYTES``, the first of each
    round alternating too, and each side's clock runs only during its own
    writes and fsync: page-cache write speed drifts within a run (on a VM,
    whichever writer comes first can be twice as fast), and interleaving
    exposes both sides to the same conditions. Returns the log (flushed,
    open), the raw and the append figures."""
    per_round = max(1, WRITE_ROUND_BYTES // len(batches[0]))
    fd = os.open(raw_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    log = Log.open(log_dir, config)
    writers = {"raw": lambda data: write_fully(fd, data),
               "append": lambda data: log.append(data, leader_epoch=0)}
    seconds = {"raw": 0.0, "append": 0.0}
    progress = Progress("raw write + append", len(batches))
    try:
        for round_no, start in enumerate(range(0, len(batches), per_round)):
            group = batches[start:start + per_round]
            for name in ("raw", "append") if round_no % 2 == 0 else ("append", "raw"):
                seconds[name] += seconds_to_run(writers[name], group)
            progress.update(start + len(group))
        raw_sync = seconds_to_run(os.fsync, [fd])
        append_sync = seconds_to_run(lambda _: log.flush(), [None])
    finally:
        os.close(fd)
        progress.finish()
    total, records = sum(map(len, batches)), records_in(batches)
    return (log, Throughput(total, records, seconds["raw"] + raw_sync, raw_sync),
            Throughput(total, records, seconds["append"] + append_sync, append_sync))


def seconds_to_run(function: Callable[[object], object], items: Sequence) -> float:
    """Wall-clock seconds of ``function(item)`` for each item in turn."""
    start = time.perf_counter()
    for item in items:
        function(item)
    return time.perf_counter() - start


def write_fully(fd: int, data: bytes) -> None:
    view = memoryview(data)
    for _ in range(MAX_WRITE_CALLS_PER_BUFFER):
        if not view:
            return
        view = view[os.write(fd, view):]
    raise OSError(f"os.write made no progress: {len(view)} bytes left")


def append_all(log: Log, batches: Sequence[bytes]) -> None:
    """``Log.append`` each batch as the leader of epoch 0 (no flush)."""
    for data in batches:
        log.append(data, leader_epoch=0)


def build_log(directory: str, config: LogConfig, batches: Sequence[bytes]) -> Log:
    """A new log holding ``batches``, flushed (untimed)."""
    log = Log.open(directory, config)
    append_all(log, batches)
    log.flush()
    return log


# ---------------------------------------------------------------------------
# 3. Sequential reads
# ---------------------------------------------------------------------------
def read_chunks(log: Log, limit_bytes: int, label: str | None = None) -> Iterable[bytes]:
    """``Log.read`` from the log start, ``READ_MAX_BYTES`` at a time, until
    the log end or ``limit_bytes``; the next offset comes from the last
    batch header of each chunk."""
    offset, end = log.log_start_offset, log.log_end_offset
    progress = Progress(label, limit_bytes) if label else None
    done = 0
    max_reads = limit_bytes // fmt.HEADER_SIZE + 2  # each read returns >= 1 batch
    for _ in range(max_reads):
        if offset >= end or done >= limit_bytes:
            break
        data = log.read(offset, READ_MAX_BYTES)
        offset = next_offset_after(data, offset)
        done += len(data)
        if progress:
            progress.update(done)
        yield data
    else:
        raise RuntimeError(f"sequential read did not reach the log end within {max_reads} reads")
    if progress:
        progress.finish()


def next_offset_after(data: bytes, offset: int) -> int:
    """Offset after the last whole batch of a ``Log.read(offset, ...)``
    answer, which must start with the batch holding ``offset`` and be
    contiguous from there."""
    headers = [header for header, _view in fmt.iter_batches(data)]
    spans = [(h.base_offset, h.last_offset) for h in headers]
    contiguous = all(b.base_offset == a.next_offset for a, b in zip(headers, headers[1:]))
    if not headers or not spans[0][0] <= offset <= spans[0][1] or not contiguous:
        raise RuntimeError(f"Log.read({offset}) returned {len(data)} bytes holding batches "
                           f"{spans[:4]}{'...' if len(spans) > 4 else ''}, not the "
                           "contiguous batches from the one holding the offset")
    return headers[-1].next_offset


def measure_sequential_read(log: Log) -> Throughput:
    """Read the whole log; count records from batch headers only."""
    total = records = 0
    start = time.perf_counter()
    for data in read_chunks(log, log.size_bytes, "read"):
        total += len(data)
        records += sum(header.record_count for header, _ in fmt.iter_batches(data))
    seconds = time.perf_counter() - start
    return Throughput(total, records, seconds)


def measure_read_decode(log: Log, limit_bytes: int) -> Throughput:
    """Read about ``limit_bytes`` from the start and decode every record (CRC
    checked), as a consumer does."""
    total = records = 0
    start = time.perf_counter()
    for data in read_chunks(log, limit_bytes):
        total += len(data)
        for _record in fmt.decode_batches(data):
            records += 1
    seconds = time.perf_counter() - start
    return Throughput(total, records, seconds)


# ---------------------------------------------------------------------------
# 4. Random lookups
# ---------------------------------------------------------------------------
def random_offsets(log: Log, rng: random.Random, count: int) -> list[int]:
    return [rng.randrange(log.log_start_offset, log.log_end_offset) for _ in range(count)]


def timed_lookup_us(log: Log, offset: int) -> float:
    """Time ``Log.read(offset, max_bytes=1)`` (the one batch holding the
    offset); the answer is checked after the clock stops."""
    start = time.perf_counter_ns()
    data = log.read(offset, 1)
    elapsed_us = (time.perf_counter_ns() - start) / 1000
    check_holds_offset(data, offset)
    return elapsed_us


def measure_lookup_latencies(logs: dict[str, Log], offsets: dict[str, list[int]]
                             ) -> dict[str, Latency]:
    """One lookup in each log in turn, so that both logs are measured under
    the same conditions (clock speed, background writeback, other load)."""
    count = min(len(o) for o in offsets.values())
    progress = Progress("lookups", count)
    samples: dict[str, list[float]] = {name: [] for name in logs}
    for i in range(count):
        for name, log in logs.items():
            samples[name].append(timed_lookup_us(log, offsets[name][i]))
        progress.update(i + 1)
    progress.finish()
    return {name: Latency.of(values) for name, values in samples.items()}


def check_holds_offset(data: bytes, offset: int) -> None:
    header = fmt.parse_header(data) if len(data) >= fmt.HEADER_SIZE else None
    if header is None or not header.base_offset <= offset <= header.last_offset:
        found = None if header is None else (header.base_offset, header.last_offset)
        raise RuntimeError(f"Log.read({offset}, 1) returned batch {found}, not the one "
                           "holding the offset")


# ---------------------------------------------------------------------------
# 5. Recovery
# ---------------------------------------------------------------------------
@dataclasses.dataclass
class OpenResult:
    """One timed ``Log.open``."""

    clean: bool
    log_name: str
    log_bytes: int
    unflushed_bytes: int
    seconds: float
    lost_offsets: int  # log end expected minus log end after open; 0 when intact

    @property
    def key(self) -> tuple[bool, int, bool]:
        """Sort and group key: unclean by unflushed bytes, then clean; small first."""
        return self.clean, self.unflushed_bytes, self.log_name != "small"


def crash_with_unflushed(log: Log, batches: Sequence[bytes]) -> tuple[int, int, int]:
    """Roll, append ``batches`` without flushing, then close the files
    without a flush (what a crash leaves, minus lost page cache). Returns the
    recovery point to reopen with, the log end offset and the log size.

    Why roll: the big log's active segment is full, so its unflushed data
    lands in a new segment anyway; rolling the small log too gives both the
    same recovery path and the same file state. That matters on ext4
    (auto_da_alloc): closing a file that was truncated to 0 since it was
    opened (Segment.create does that) starts its writeback, so the fsync
    that recovery ends with finds less to do. Without the roll the small log
    paid that fsync in full and the big one did not."""
    if log.recovery_point != log.log_end_offset:
        raise RuntimeError(f"log not flushed before the crash: recovery point "
                           f"{log.recovery_point}, log end {log.log_end_offset}")
    log.roll()
    append_all(log, batches)
    recovery_point, end, size = log.recovery_point, log.log_end_offset, log.size_bytes
    log.abandon()
    return recovery_point, end, size


def measure_unclean_open(directory: str, config: LogConfig, log: Log,
                         batches: Sequence[bytes], log_name: str) -> tuple[Log, OpenResult]:
    recovery_point, end, size = crash_with_unflushed(log, batches)
    start = time.perf_counter()
    reopened = Log.open(directory, config, recovery_point=recovery_point, clean_shutdown=False)
    seconds = time.perf_counter() - start
    return reopened, OpenResult(False, log_name, size, sum(map(len, batches)), seconds,
                                end - reopened.log_end_offset)


def measure_clean_open(directory: str, config: LogConfig, log: Log, log_name: str
                       ) -> tuple[Log, OpenResult]:
    end, size = log.log_end_offset, log.size_bytes
    log.close()
    start = time.perf_counter()
    reopened = Log.open(directory, config, clean_shutdown=True)
    seconds = time.perf_counter() - start
    return reopened, OpenResult(True, log_name, size, 0, seconds,
                                end - reopened.log_end_offset)


def measure_recovery_round(directory: str, config: LogConfig, log: Log, log_name: str,
                           pool: Sequence[bytes], unflushed_bytes: int
                           ) -> tuple[Log, list[OpenResult]]:
    """Unclean open with K, then 2K unflushed, then a clean open. After each
    crash the log is cut back (untimed) to its size before, so every round
    crashes a log of the same size."""
    base_end = log.log_end_offset
    results = []
    for unflushed in (unflushed_bytes, 2 * unflushed_bytes):
        log, opened = measure_unclean_open(directory, config, log,
                                           batches_for(pool, unflushed), log_name)
        results.append(opened)
        log.truncate_to(base_end)
        log.flush()
    log, clean = measure_clean_open(directory, config, log, log_name)
    return log, results + [clean]


@dataclasses.dataclass
class OpenSummary:
    """Repeats of one open scenario on one log."""

    clean: bool
    log_name: str
    log_bytes: int
    unflushed_bytes: int
    median_s: float
    min_s: float
    max_s: float
    repeats: int
    lost_offsets: int

    @property
    def scenario(self) -> str:
        if self.clean:
            return "clean shutdown"
        return f"unclean, {self.unflushed_bytes / MiB:.0f} MiB unflushed"

    @classmethod
    def of(cls, results: list[OpenResult]) -> "OpenSummary":
        first, times = results[0], sorted(r.seconds for r in results)
        return cls(first.clean, first.log_name, max(r.log_bytes for r in results),
                   first.unflushed_bytes, statistics.median(times), times[0], times[-1],
                   len(times), sum(r.lost_offsets for r in results))


def summarize_opens(results: list[OpenResult]) -> list[OpenSummary]:
    groups: dict[tuple, list[OpenResult]] = {}
    for result in sorted(results, key=lambda r: r.key):
        groups.setdefault(result.key, []).append(result)
    return [OpenSummary.of(group) for group in groups.values()]


# ---------------------------------------------------------------------------
# The run
# ---------------------------------------------------------------------------
def run_phases(args: argparse.Namespace, workdir: str) -> dict:
    rng = random.Random(args.seed)
    facts = machine_facts(workdir)
    print("kraftlog storage benchmark", flush=True)
    print(describe_machine(facts), flush=True)
    pool = build_batch_pool(rng, args.record_bytes, args.batch_kb * 1024)
    config = log_config(pool)
    print_workload(args, pool, config)
    print_page_cache_note(facts, args.log_mb)
    results: dict = {"machine": facts, "params": params_json(args, pool)}
    # First, on a quiet disk: the phases after it leave writeback behind
    # that slows every metadata operation several times.
    results["new_logs"] = run_new_logs_phase(workdir, config, args.new_logs)
    big_dir, small_dir = os.path.join(workdir, "big-0"), os.path.join(workdir, "small-0")
    big_batches = batches_for(pool, args.log_mb * MiB)
    results["writes"], big = run_write_phase(workdir, config, big_batches, big_dir)
    small = build_log(small_dir, config, batches_for(pool, args.small_mb * MiB))
    logs = {"small": small, "big": big}
    try:
        results["reads"] = run_read_phase(big)
        results["lookups"] = run_lookup_phase(logs, rng, args.lookups,
                                              max(len(b) for b in pool))
        results["recovery"] = run_recovery_phase(logs, {"small": small_dir, "big": big_dir},
                                                 config, pool, args.unflushed_mb * MiB)
    finally:
        for log in logs.values():
            log.close()
    print_new_logs(results["new_logs"])
    return results


def print_workload(args: argparse.Namespace, pool: Sequence[bytes], config: LogConfig) -> None:
    sizes = [len(b) for b in pool]
    records = [fmt.parse_header(b).record_count for b in pool]
    print(f"workload: {args.record_bytes}-byte random values, key None; batches of "
          f"{min(sizes):,}-{max(sizes):,} bytes ({min(records):,}-{max(records):,} records), "
          f"{len(pool)} distinct pre-built batches appended in turn\n"
          f"          big log {args.log_mb} MiB, small log {args.small_mb} MiB, "
          f"segment.bytes {config.segment_bytes // MiB} MiB, index.interval.bytes "
          f"{config.index_interval_bytes}, flush.ms {config.flush_ms}, seed {args.seed}",
          flush=True)


def print_page_cache_note(facts: dict, log_mib: int) -> None:
    print(f"note:    page cache not dropped; the {log_mib} MiB log fits in "
          f"{facts['ram_bytes'] / 2**30:.1f} GiB RAM, so reads below are likely served "
          "from memory, not the disk. Write figures include the final fsync.", flush=True)


def params_json(args: argparse.Namespace, pool: Sequence[bytes]) -> dict:
    return {"log_mib": args.log_mb, "small_mib": args.small_mb,
            "record_bytes": args.record_bytes, "batch_kib": args.batch_kb,
            "batch_bytes": [len(b) for b in pool], "lookups": args.lookups,
            "unflushed_mib": args.unflushed_mb, "new_logs": args.new_logs, "seed": args.seed,
            "segment_bytes": SEGMENT_BYTES_DEFAULT, "read_max_bytes": READ_MAX_BYTES}


def run_write_phase(workdir: str, config: LogConfig, batches: Sequence[bytes],
                    big_dir: str) -> tuple[dict, Log]:
    """Raw reference and the big log's appends; returns the log (open and
    flushed). The raw file goes with the work directory at the end, not
    now: deleting it (discards) could slow what follows."""
    raw_path = os.path.join(workdir, "raw-reference.bin")
    log, raw, append = measure_writes(raw_path, big_dir, config, batches)
    append_ratio = ratio(append.mib_per_s, raw.mib_per_s)
    print_section(f"1-2. Writes: raw os.write vs Log.append of the same batches, alternating "
                  f"in {WRITE_ROUND_BYTES // MiB} MiB rounds, each timed up to its fsync")
    print(format_table(
        ["phase", "MiB", "seconds", "of which fsync", "MiB/s", "records/s", "vs raw"],
        [[name, f"{t.bytes / MiB:.0f}", f"{t.seconds:.2f}", f"{t.sync_seconds:.2f}",
          f"{t.mib_per_s:.0f}", f"{t.records_per_s:,.0f}",
          f"{ratio(t.mib_per_s, raw.mib_per_s):.2f}"]
         for name, t in [("raw os.write + fsync", raw), ("Log.append + flush", append)]]),
        flush=True)
    print(verdict(f"append / raw = {append_ratio:.2f}, target >= {APPEND_TARGET_RATIO:.2f}",
                  append_ratio >= APPEND_TARGET_RATIO), flush=True)
    return {"raw_write": raw.to_json(), "append": append.to_json(),
            "write_round_bytes": WRITE_ROUND_BYTES, "append_ratio_to_raw": append_ratio,
            "append_target_ratio": APPEND_TARGET_RATIO,
            "append_meets_target": append_ratio >= APPEND_TARGET_RATIO}, log


def verdict(text: str, ok: bool) -> str:
    return f"{text}: {'met' if ok else 'NOT MET'}"


def run_read_phase(log: Log) -> dict:
    sequential = measure_sequential_read(log)
    if sequential.bytes != log.size_bytes or sequential.records != log.log_end_offset:
        raise RuntimeError(f"sequential read saw {sequential.bytes} bytes / "
                           f"{sequential.records} records, log has {log.size_bytes} / "
                           f"{log.log_end_offset}")
    decoded = measure_read_decode(log, DECODE_SAMPLE_MIB * MiB)
    print_section(f"3. Sequential reads: Log.read(offset, max_bytes={READ_MAX_BYTES // MiB} MiB)"
                  " from offset 0 (page cache)")
    print(format_table(
        ["phase", "MiB", "seconds", "MiB/s", "records/s"],
        [[name, f"{t.bytes / MiB:.0f}", f"{t.seconds:.2f}", f"{t.mib_per_s:.0f}",
          f"{t.records_per_s:,.0f}"]
         for name, t in [("read, no decoding", sequential),
                         ("read + decode_batches", decoded)]]), flush=True)
    return {"sequential": sequential.to_json(), "read_decode": decoded.to_json()}


def run_lookup_phase(logs: dict[str, Log], rng: random.Random, count: int,
                     batch_bytes: int) -> dict:
    offsets = {name: random_offsets(log, rng, count) for name, log in logs.items()}
    latencies = measure_lookup_latencies(logs, offsets)
    small, big = latencies["small"], latencies["big"]
    ratios = {"p50": ratio(big.p50_us, small.p50_us), "p99": ratio(big.p99_us, small.p99_us),
              "mean": ratio(big.mean_us, small.mean_us)}
    print_section(f"4. Random offset lookups: Log.read(offset, max_bytes=1), {count} per log, "
                  "alternating between the logs")
    rows = [[name, f"{logs[name].size_bytes / MiB:.0f}", f"{logs[name].log_end_offset:,}",
             f"{lat.p50_us:.0f}", f"{lat.p99_us:.0f}", f"{lat.mean_us:.0f}",
             f"{lat.max_us:.0f}"] for name, lat in latencies.items()]
    rows.append(["big / small", "", "", f"{ratios['p50']:.2f}", f"{ratios['p99']:.2f}",
                 f"{ratios['mean']:.2f}", ""])
    print(format_table(["log", "MiB", "offsets", "p50 us", "p99 us", "mean us", "max us"],
                       rows), flush=True)
    ok = max(ratios.values()) <= LOOKUP_TARGET_RATIO
    print(f"(each lookup returns, so copies, the whole batch holding the offset, up to "
          f"{batch_bytes / 1024:.0f} KiB here: the copy dominates the latency)", flush=True)
    print(verdict(f"big / small latency (p50, p99, mean) <= {LOOKUP_TARGET_RATIO:.1f}x", ok),
          flush=True)
    return {name: dataclasses.asdict(lat) for name, lat in latencies.items()} | {
        "ratio_big_small": ratios, "target_ratio_max": LOOKUP_TARGET_RATIO, "meets_target": ok}


def run_recovery_phase(logs: dict[str, Log], dirs: dict[str, str], config: LogConfig,
                       pool: Sequence[bytes], unflushed_bytes: int) -> dict:
    """Rounds alternate between the logs. Mutates ``logs``: each entry is
    replaced by the reopened log."""
    results: list[OpenResult] = []
    for _ in range(RECOVERY_ROUNDS):
        for name in ("small", "big"):
            logs[name], opened = measure_recovery_round(dirs[name], config, logs[name], name,
                                                        pool, unflushed_bytes)
            results.extend(opened)
    rows = summarize_opens(results)
    print_section(f"5. Log.open after a crash (unclean) and after a clean shutdown, "
                  f"{RECOVERY_ROUNDS} rounds")
    print(format_table(
        ["scenario", "log", "log MiB", "unflushed MiB", "median s", "min s", "max s",
         "lost offsets"],
        [[r.scenario, r.log_name, f"{r.log_bytes / MiB:.0f}", f"{r.unflushed_bytes / MiB:.0f}",
          f"{r.median_s:.3f}", f"{r.min_s:.3f}", f"{r.max_s:.3f}", str(r.lost_offsets)]
         for r in rows]), flush=True)
    summary = recovery_summary(rows)
    for line in summary["lines"]:
        print(line, flush=True)
    return {"opens": [dataclasses.asdict(r) for r in results],
            "summary": [dataclasses.asdict(r) for r in rows],
            "rounds": RECOVERY_ROUNDS} | summary["ratios"]


def run_new_logs_phase(workdir: str, config: LogConfig, count: int) -> dict:
    """``count`` new partition logs by ``Log.open`` (each in a directory of
    its own, in one parent, as a broker's log dir holds them), against
    ``os.mkdir`` and one empty segment file per directory, alternating in
    rounds of NEW_LOGS_ROUND, each side first every other round, so that
    neither gets the emptier parent directory."""
    parent = os.path.join(workdir, "new-logs")
    os.mkdir(parent)
    raw_s = log_s = 0.0

    def raw(names: range) -> float:
        started = time.perf_counter()
        for i in names:
            directory = os.path.join(parent, f"raw-{i}")
            os.mkdir(directory)
            os.close(os.open(os.path.join(directory, "00000000000000000000.log"),
                             os.O_RDWR | os.O_CREAT, 0o644))
        return time.perf_counter() - started

    def logs(names: range) -> float:
        started = time.perf_counter()
        opened = [Log.open(os.path.join(parent, f"topic-{i}"), config) for i in names]
        seconds = time.perf_counter() - started
        for log in opened:  # untimed; without the flush of a clean close, as the raw side
            log.abandon()
        return seconds

    for r in range(math.ceil(count / NEW_LOGS_ROUND)):
        names = range(r * NEW_LOGS_ROUND, min(count, (r + 1) * NEW_LOGS_ROUND))
        if r % 2 == 0:  # each side goes first every other round
            raw_s += raw(names)
            log_s += logs(names)
        else:
            log_s += logs(names)
            raw_s += raw(names)
    raw_us, log_us = raw_s / count * 1e6, log_s / count * 1e6
    return {"count": count, "raw_us": raw_us, "log_open_us": log_us,
            "log_open_over_raw": ratio(log_us, raw_us)}


def print_new_logs(figures: dict) -> None:
    count, raw_us, log_us = figures["count"], figures["raw_us"], figures["log_open_us"]
    print_section(f"6. New logs: Log.open of {count:,} new partitions vs mkdir + one empty "
                  "file each")
    print(format_table(["what", "per log µs", "logs/s"],
                       [["os.mkdir + an empty .log file", f"{raw_us:.0f}",
                         f"{1e6 / raw_us:,.0f}"],
                        ["Log.open of a new partition", f"{log_us:.0f}",
                         f"{1e6 / log_us:,.0f}"]]), flush=True)
    print(f"Log.open / the least a new log takes: {figures['log_open_over_raw']:.2f}x "
          "(measured before the other phases, on a quiet disk)", flush=True)


def recovery_summary(rows: list[OpenSummary]) -> dict:
    def median(log_name: str, unflushed: int) -> float:
        return next(r.median_s for r in rows
                    if not r.clean and r.log_name == log_name and r.unflushed_bytes == unflushed)

    # Both logs get the same batches, so the unflushed sizes match exactly.
    sizes = sorted({r.unflushed_bytes for r in rows if not r.clean})
    k, k2 = sizes[0], sizes[-1]
    same_k = ratio(median("big", k), median("small", k))
    same_2k = ratio(median("big", k2), median("small", k2))
    growth = {name: ratio(median(name, k2), median(name, k)) for name in ("small", "big")}
    lost = sum(r.lost_offsets for r in rows)
    lines = [f"unclean open, same unflushed bytes, big / small (medians): {same_k:.2f} (K), "
             f"{same_2k:.2f} (2K)  -- about 1: bounded by unflushed bytes, not log size",
             f"unclean open, 2K / K unflushed (medians): small {growth['small']:.2f}, "
             f"big {growth['big']:.2f}  -- about 2: proportional to unflushed bytes",
             "(an unclean open validates the unflushed batches (CRC) and fsyncs them. The "
             "unflushed data is in a new segment in both logs; after each crash the log is "
             "cut back to its size before, untimed)"]
    if lost:
        lines.append(f"WARNING: {lost} offsets written before the simulated crash were "
                     "missing after recovery (no data was actually lost from the page cache)")
    return {"lines": lines,
            "ratios": {"unclean_big_over_small_k": same_k, "unclean_big_over_small_2k": same_2k,
                       "unclean_2k_over_k": growth, "lost_offsets": lost}}


def write_json(path: str, results: dict) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(results, f, indent=2, sort_keys=True)
        f.write("\n")


if __name__ == "__main__":
    sys.exit(main())
