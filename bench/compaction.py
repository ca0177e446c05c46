"""``kraftlog bench compaction``: what the log cleaner costs and how fast it is.

Two measurements, each against a reference taken in the same run:

1. Cleaner throughput. A compacted log of ``--mb`` MiB is built (not timed)
   from keyed records: ``--keys`` distinct keys drawn at random, values of
   ``--value-bytes``, so most records are superseded. Then, alternating, in
   ``--rounds`` rounds on fresh copies of that log:
   - raw reference: read every segment file sequentially and write the same
     bytes to a new file, then fsync (what a cleaner that removed nothing
     and decoded nothing would cost at least);
   - the cleaner: one whole pass (plan, offset map, rewrite with fsync,
     swap), in this process, as a broker's cleaner process runs it.
   MiB/s are the log's bytes over the time; the goal is a ratio >= 0.3.
2. Produce while the cleaner runs. A fresh single node (the shipped
   defaults, but the cleaner's backoff at 100 ms) gets a ``--dirty-mb`` MiB
   topic written with cleanup.policy=delete; producing ``--records`` records
   to another topic is timed while nothing is cleaned, then right after the
   dirty topic is switched to compact (so a pass runs during the produce:
   the run samples the cleaner's running gauge and prints the share of the
   produce it overlapped), then idle again. The goal is the produce rate
   while cleaning >= 0.8x the mean idle rate.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import sys
import tempfile
import threading
import time

from bench.storage import MiB, Progress, format_table, machine_facts, print_section, ratio
from storage import cleaner
from storage.batch import BatchBuilder
from storage.config import LogConfig
from storage.log import Log

CLEANER_GOAL = 0.3
PRODUCE_GOAL = 0.8
SEGMENT_BYTES = 64 * MiB
BATCH_BYTES = 256 * 1024
COPY_CHUNK = MiB
DIRTY_SEGMENT_BYTES = 16 * MiB
DIRTY_KEYS = 100_000


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--mb", type=int, default=256,
                        help="MiB of log the cleaner compacts (default %(default)s)")
    parser.add_argument("--keys", type=int, default=100_000,
                        help="distinct keys in it (default %(default)s)")
    parser.add_argument("--value-bytes", type=int, default=1024,
                        help="value bytes per record (default %(default)s)")
    parser.add_argument("--rounds", type=int, default=5,
                        help="raw-copy and cleaner runs, alternating (default %(default)s)")
    parser.add_argument("--records", type=int, default=500_000,
                        help="records produced per produce run (default %(default)s)")
    parser.add_argument("--record-size", type=int, default=100,
                        help="value bytes per produced record (default %(default)s)")
    parser.add_argument("--dirty-mb", type=int, default=256,
                        help="MiB of the topic cleaned while producing (default %(default)s)")
    parser.add_argument("--only", choices=("cleaner", "produce"),
                        help="run one of the two measurements")
    parser.add_argument("--dir", default=None,
                        help="where the data goes (default: a temporary directory)")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON too")


def run(args: argparse.Namespace) -> int:
    for name in ("mb", "keys", "value_bytes", "rounds", "records", "record_size", "dirty_mb"):
        if getattr(args, name) < 1:
            print(f"kraftlog bench compaction: --{name.replace('_', '-')} must be at least 1",
                  file=sys.stderr)
            return 2
    base = tempfile.mkdtemp(prefix="kraftlog-bench-compaction-", dir=args.dir)
    summary: dict = {"machine": machine_facts(base), "args": vars_of(args)}
    try:
        if args.only in (None, "cleaner"):
            summary["cleaner"] = bench_cleaner(args, base)
            _print_cleaner(summary["cleaner"])
        if args.only in (None, "produce"):
            summary["produce"] = bench_produce_while_cleaning(args, base)
            _print_produce(summary["produce"])
    finally:
        shutil.rmtree(base, ignore_errors=True)
    if args.json:
        print(json.dumps(summary, indent=2))
    return 0


def vars_of(args: argparse.Namespace) -> dict:
    return {k: v for k, v in vars(args).items() if isinstance(v, (int, str, float, type(None)))}


# -- 1. the cleaner against a raw copy ----------------------------------------------------
def _build_log(directory: str, args: argparse.Namespace) -> tuple[int, int]:
    """The pristine log; returns its bytes and records."""
    config = LogConfig(segment_bytes=SEGMENT_BYTES, cleanup_policy="compact", flush_ms=-1,
                       min_cleanable_dirty_ratio=0.0)
    log = Log.open(directory, config)
    rng = random.Random(7)
    value = os.urandom(args.value_bytes)
    target = args.mb * MiB
    per_batch = max(1, BATCH_BYTES // (args.value_bytes + 20))
    progress = Progress("building the log", target)
    total = records = 0
    now = int(time.time() * 1000)
    while total < target:
        builder = BatchBuilder()
        for _ in range(per_batch):
            builder.append(b"key-%09d" % rng.randrange(args.keys), value, timestamp_ms=now)
        total += log.append(builder.build(), leader_epoch=0).size_bytes
        records += per_batch
        progress.update(total)
    progress.finish()
    log.roll()
    log.close()
    return total, records


def _raw_copy(directory: str, out_path: str) -> float:
    """Seconds to read every segment file and write it to one file, fsynced."""
    names = sorted(n for n in os.listdir(directory) if n.endswith(".log"))
    started = time.perf_counter()
    out = os.open(out_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        for name in names:
            fd = os.open(os.path.join(directory, name), os.O_RDONLY)
            try:
                while True:
                    chunk = os.read(fd, COPY_CHUNK)
                    if not chunk:
                        break
                    view = memoryview(chunk)
                    while view:
                        view = view[os.write(out, view):]
            finally:
                os.close(fd)
        os.fsync(out)
    finally:
        os.close(out)
    return time.perf_counter() - started


def _one_pass(directory: str) -> tuple[float, cleaner.CleanResult]:
    """Seconds of one whole cleaner pass over the log in ``directory``."""
    log = Log.open(directory, LogConfig(segment_bytes=SEGMENT_BYTES, cleanup_policy="compact",
                                        flush_ms=-1, min_cleanable_dirty_ratio=0.0),
                   clean_shutdown=True)
    try:
        started = time.perf_counter()
        plan = cleaner.plan_clean(log, log.clock(), force=True)
        assert plan is not None, "nothing to clean"
        result = cleaner.clean(plan, cleaner.DEDUPE_BUFFER_DEFAULT)
        # As a broker swaps: the replaced segments are unlinked afterwards,
        # off the pass (on its flush thread).
        doomed: list[str] = []
        assert cleaner.swap(log, result, delete_later=doomed.extend), "the pass did not swap in"
        seconds = time.perf_counter() - started
        cleaner.unlink_all(doomed)
        return seconds, result
    finally:
        log.close()


def bench_cleaner(args: argparse.Namespace, base: str) -> dict:
    print_section(f"Cleaner throughput: a {args.mb} MiB compacted log, {args.keys:,} keys, "
                  f"{args.value_bytes}-byte values")
    pristine = os.path.join(base, "pristine")
    size, records = _build_log(pristine, args)
    rounds = []
    for n in range(args.rounds):
        work = os.path.join(base, f"round-{n}")
        shutil.copytree(pristine, work)
        raw_s = _raw_copy(work, os.path.join(base, "raw-copy"))
        os.unlink(os.path.join(base, "raw-copy"))
        clean_s, result = _one_pass(work)
        shutil.rmtree(work)
        rounds.append({"raw_mib_s": size / MiB / raw_s, "cleaner_mib_s": size / MiB / clean_s,
                       "cleaner_s": clean_s, "records_read": result.records_read,
                       "records_kept": result.records_kept,
                       "bytes_written": result.bytes_written})
        print(f"  round {n + 1}: raw copy {size / MiB / raw_s:8.1f} MiB/s, cleaner "
              f"{size / MiB / clean_s:8.1f} MiB/s", file=sys.stderr)
    raw = statistics.median(r["raw_mib_s"] for r in rounds)
    cleaned = statistics.median(r["cleaner_mib_s"] for r in rounds)
    return {"log_bytes": size, "records": records, "rounds": rounds, "raw_mib_s": raw,
            "cleaner_mib_s": cleaned, "ratio": ratio(cleaned, raw), "goal": CLEANER_GOAL,
            "kept_percent": 100.0 * rounds[0]["records_kept"] / max(1, records),
            "recopy_percent": 100.0 * rounds[0]["bytes_written"] / size}


def _print_cleaner(figures: dict) -> None:
    print(format_table(("", "MiB/s"), [
        ("raw read + write + fsync", f"{figures['raw_mib_s']:.1f}"),
        ("cleaner pass", f"{figures['cleaner_mib_s']:.1f}")]))
    print(f"cleaner / raw: {figures['ratio']:.2f} (goal >= {CLEANER_GOAL}); "
          f"{figures['records']:,} records, {figures['kept_percent']:.1f}% kept, "
          f"recopy {figures['recopy_percent']:.1f}%")


# -- 2. produce while cleaning ----------------------------------------------------------
def bench_produce_while_cleaning(args: argparse.Namespace, base: str) -> dict:
    from api.client import Admin, NewTopic, Producer
    from bench.data import _fill, _wait_for_replicas_in_sync
    from chaos.cluster import ProcessCluster, metric, wait_until

    print_section(f"Produce while the cleaner runs: {args.records:,} records of "
                  f"{args.record_size} B, a {args.dirty_mb} MiB topic compacted meanwhile")
    cluster = ProcessCluster(os.path.join(base, "node"), controllers=1, brokers=0,
                             combined=True, settings={"log.cleaner.backoff.ms": 100})
    try:
        cluster.start()
        cluster.wait_for_brokers_running(timeout_s=60)
        url = cluster.nodes[cluster.broker_ids[0]].broker_url
        bootstrap = [url]
        topics = ["produce-idle-1", "produce-cleaning", "produce-idle-2"]
        with Admin(bootstrap) as admin:
            admin.create_topics([NewTopic(t, 4, 1) for t in topics] + [NewTopic(
                "dirty", 1, 1, configs={"segment.bytes": str(DIRTY_SEGMENT_BYTES)})])
        for topic in topics:
            _wait_for_replicas_in_sync(bootstrap, topic, 4)
        _fill_dirty(bootstrap, args.dirty_mb)

        def produce(topic: str, label: str) -> float:
            with Producer(bootstrap, acks=1) as producer:
                producer.send(topic, b"warm-up").result(30)
                return _fill(producer, topic, args.records, args.record_size,
                             label)["records_s"]

        idle_1 = produce(topics[0], "idle")
        with Admin(bootstrap) as admin:
            admin.alter_configs("dirty", {"cleanup.policy": "compact"})
        wait_until(lambda: metric(url, "kraftlog_cleaner_running_passes") >= 1, 30,
                   "the cleaner to start")
        sampler = _Sampler(url)
        sampler.start()
        cleaning = produce(topics[1], "cleaning")
        overlap = sampler.stop()
        wait_until(lambda: metric(url, "kraftlog_cleaner_running_passes") == 0, 600,
                   "the cleaner to finish")
        idle_2 = produce(topics[2], "idle")
        idle = (idle_1 + idle_2) / 2
        return {"idle_records_s": [idle_1, idle_2], "cleaning_records_s": cleaning,
                "ratio": ratio(cleaning, idle), "goal": PRODUCE_GOAL,
                "cleaner_overlap": overlap,
                "cleaner_passes": metric(url, "kraftlog_cleaner_passes_total"),
                "cleaner_bytes_read": metric(url, "kraftlog_cleaner_bytes_read_total")}
    finally:
        cluster.stop()


def _fill_dirty(bootstrap: list[str], mib: int) -> None:
    from api.client import Producer

    rng = random.Random(11)
    value = os.urandom(200)
    target = mib * MiB
    progress = Progress("filling the dirty topic", target)
    with Producer(bootstrap, acks=1, linger_ms=5) as producer:
        sent = 0
        while sent < target:
            for _ in range(1000):
                producer.send("dirty", value, key=b"key-%09d" % rng.randrange(DIRTY_KEYS))
            sent += 1000 * (len(value) + 14)
            progress.update(sent)
        producer.flush()
    progress.finish()


def _running(url: str) -> bool:
    from chaos.cluster import metric

    return metric(url, "kraftlog_cleaner_running_passes") >= 1


class _Sampler:
    """Samples the cleaner's running gauge while a produce run lasts."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.samples: list[bool] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.05):
            try:
                self.samples.append(_running(self.url))
            except OSError:
                pass

    def stop(self) -> float:
        """The share of samples in which a pass was running."""
        self._stop.set()
        self._thread.join(10)
        return sum(self.samples) / len(self.samples) if self.samples else 0.0


def _print_produce(figures: dict) -> None:
    idle_1, idle_2 = figures["idle_records_s"]
    print(format_table(("produce run", "records/s"), [
        ("idle (before)", f"{idle_1:,.0f}"),
        ("while cleaning", f"{figures['cleaning_records_s']:,.0f}"),
        ("idle (after)", f"{idle_2:,.0f}")]))
    print(f"while cleaning / idle: {figures['ratio']:.2f} (goal >= {PRODUCE_GOAL}); a pass "
          f"was running during {100 * figures['cleaner_overlap']:.0f}% of the cleaning run")
