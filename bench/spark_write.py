"""The write half of ``kraftlog bench spark``: the same rows written by Spark
to kraftlog (``df.write.format("kraftlog")``, exactly once and at least
once) and to Parquet, in one run.

The rows are the Parquet copy of the read phase's topic, ``key`` and
``value`` only (``--records`` rows of ``--record-size`` value bytes), read
from local Parquet by each run: what differs between the runs is the sink.
Each kraftlog run writes into a fresh topic of ``--partitions`` partitions;
each Parquet run into a fresh directory, made before the clock starts. One
untimed warm-up per sink, then ``--repeats`` timed rounds writing to each
sink in turn; the rows of the first timed exactly-once run are counted back
with a read_committed consumer.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
import uuid
from typing import Any

from bench.data import _create_topic, _status

#: The issue's target: writing through format("kraftlog") at least this share
#: of writing the same rows to local Parquet (rows/s, medians).
WRITE_RATIO_TARGET = 0.5


def bench_write(spark: Any, bootstrap: list[str], parquet_dir: str, work: str,
                args: argparse.Namespace) -> dict:
    rows = spark.read.parquet(parquet_dir).select("key", "value")
    counter = iter(range(1_000_000))

    def to_kraftlog(exactly_once: bool) -> tuple[Any, Any]:
        def prepare() -> str:
            topic = f"bench-spark-write-{uuid.uuid4().hex[:8]}"
            _create_topic(bootstrap, topic, args.partitions)
            return topic

        def write(topic: str) -> None:
            (rows.write.format("kraftlog").mode("append")
             .option("kafka.bootstrap.servers", ",".join(bootstrap))
             .option("topic", topic).option("exactlyOnce", str(exactly_once).lower())
             .save())
        return prepare, write

    def to_parquet() -> tuple[Any, Any]:
        return (lambda: os.path.join(work, f"write-{next(counter)}")), rows.write.parquet

    runs = _timed({"kraftlog": (to_kraftlog(True), 'format("kraftlog"), exactly once'),
                   "kraftlog_at_least_once": (to_kraftlog(False),
                                              'format("kraftlog"), exactlyOnce=false'),
                   "parquet": (to_parquet(), "Parquet")}, args)
    counted = _count_committed(bootstrap, runs["kraftlog"]["targets"][0], args.partitions)
    if counted != args.records:
        raise SystemExit(f"an exactly-once write left {counted:,} rows for read_committed "
                         f"consumers, not {args.records:,}")
    median = {name: r["records_s_median"] for name, r in runs.items()}
    return {"write": runs, "write_rows_checked": counted,
            "write_ratio": median["kraftlog"] / median["parquet"],
            "write_ratio_at_least_once": median["kraftlog_at_least_once"] / median["parquet"],
            "write_ratio_target": WRITE_RATIO_TARGET}


def _timed(sinks: dict[str, tuple[tuple[Any, Any], str]], args: argparse.Namespace) -> dict:
    """Each sink (name -> ((prepare, write), label)) written once untimed,
    then ``args.repeats`` timed rounds writing to each sink in turn (Spark
    keeps warming up; interleaving spreads that over every sink). Each write
    goes to a fresh target made by ``prepare`` before the clock starts (a
    new topic, a new directory)."""
    for (prepare, write), label in sinks.values():
        _status(f"write to {label}: warm-up run (not timed) ...")
        write(prepare())
    seconds: dict[str, list[float]] = {name: [] for name in sinks}
    targets: dict[str, list[str]] = {name: [] for name in sinks}
    for i in range(args.repeats):
        for name, ((prepare, write), label) in sinks.items():
            target = prepare()
            started = time.perf_counter()
            write(target)
            seconds[name].append(time.perf_counter() - started)
            targets[name].append(target)
            _status(f"write to {label}: run {i + 1}/{args.repeats}: {seconds[name][-1]:.2f} s, "
                    f"{args.records / seconds[name][-1]:,.0f} rows/s")
    value_mb = args.records * args.record_size / 1e6
    out = {}
    for name, taken in seconds.items():
        median, best = statistics.median(taken), min(taken)
        out[name] = {"seconds": taken, "records_s_median": args.records / median,
                     "records_s_best": args.records / best, "mb_s_median": value_mb / median,
                     "mb_s_best": value_mb / best, "targets": targets[name]}
    return out


def _count_committed(bootstrap: list[str], topic: str, partitions: int) -> int:
    """Records of ``topic`` a read_committed consumer sees."""
    from api.client import Consumer, TopicPartition

    tps = [TopicPartition(topic, p) for p in range(partitions)]
    count = 0
    with Consumer(bootstrap, isolation_level="read_committed", auto_offset_reset="earliest",
                  enable_auto_commit=False, max_poll_records=65536,
                  max_partition_fetch_bytes=8 * 1024 * 1024) as consumer:
        consumer.assign(tps)
        ends = consumer.end_offsets(tps)
        deadline = time.monotonic() + 300
        while any(consumer.position(tp) < ends[tp] for tp in tps):
            if time.monotonic() > deadline:
                raise SystemExit(f"counting {topic} back took over 300 s")
            count += len(consumer.poll(500))
    return count
