"""The write half of ``kraftlog bench spark``: the same rows written by Spark
to kraftlog (``df.write.format("kraftlog")``, exactly once and at least
once) and to Parquet, in one run.

The rows are the Parquet copy of the read phase's topic, ``key`` and
``value`` only (``--records`` rows of ``--record-size`` value bytes), read
from local Parquet by each run: what differs between the runs is the sink.
Each kraftlog run writes into a fresh topic of ``--partitions`` partitions;
each Parquet run into a fresh directory. One untimed warm-up per sink, then
``--repeats`` timed runs; the rows of the first timed exactly-once run are
counted back with a read_committed consumer.
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

    def to_kraftlog(exactly_once: bool) -> Any:
        def write() -> str:
            topic = f"bench-spark-write-{uuid.uuid4().hex[:8]}"
            _create_topic(bootstrap, topic, args.partitions)
            (rows.write.format("kraftlog").mode("append")
             .option("kafka.bootstrap.servers", ",".join(bootstrap))
             .option("topic", topic).option("exactlyOnce", str(exactly_once).lower())
             .save())
            return topic
        return write

    def to_parquet() -> str:
        path = os.path.join(work, f"write-{next(counter)}")
        rows.write.parquet(path)
        return path

    runs = {"kraftlog": _timed(to_kraftlog(True), args, 'format("kraftlog"), exactly once'),
            "kraftlog_at_least_once": _timed(to_kraftlog(False), args,
                                             'format("kraftlog"), exactlyOnce=false'),
            "parquet": _timed(to_parquet, args, "Parquet")}
    counted = _count_committed(bootstrap, runs["kraftlog"]["targets"][0], args.partitions)
    if counted != args.records:
        raise SystemExit(f"an exactly-once write left {counted:,} rows for read_committed "
                         f"consumers, not {args.records:,}")
    median = {name: r["records_s_median"] for name, r in runs.items()}
    return {"write": runs, "write_rows_checked": counted,
            "write_ratio": median["kraftlog"] / median["parquet"],
            "write_ratio_at_least_once": median["kraftlog_at_least_once"] / median["parquet"],
            "write_ratio_target": WRITE_RATIO_TARGET}


def _timed(write: Any, args: argparse.Namespace, label: str) -> dict:
    _status(f"write to {label}: warm-up run (not timed) ...")
    write()
    seconds, targets = [], []
    for i in range(args.repeats):
        started = time.perf_counter()
        targets.append(write())
        seconds.append(time.perf_counter() - started)
        _status(f"write to {label}: run {i + 1}/{args.repeats}: {seconds[-1]:.2f} s, "
                f"{args.records / seconds[-1]:,.0f} rows/s")
    median, best = statistics.median(seconds), min(seconds)
    value_mb = args.records * args.record_size / 1e6
    return {"seconds": seconds, "records_s_median": args.records / median,
            "records_s_best": args.records / best, "mb_s_median": value_mb / median,
            "mb_s_best": value_mb / best, "targets": targets}


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
