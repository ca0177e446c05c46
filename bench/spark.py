"""``kraftlog bench spark``: the PySpark source (``format("kraftlog")``)
measured as a Spark user sees it.

One run, one local SparkSession (``spark_source.local_session``, local[2],
as the example pipeline's), against a fresh single combined node (or
``--target URL``):

1. A topic of ``--partitions`` partitions filled with ``--records`` records
   of ``--record-size`` value bytes and ``--keys`` distinct keys (not timed).
2. The whole topic copied once to a local Parquet directory (not timed;
   it also starts Spark's Python workers and fills the page cache) and the
   copy's row count checked against ``--records``.
3. Batch reads, each after one untimed warm-up read, in ``--repeats``
   rounds that read each source once in turn, fully materialised through
   the ``noop`` sink (every column of every
   row): first the topic through ``format("kraftlog")``, then the Parquet
   copy, the reference. Median and best records/s and MB/s (of value bytes,
   as ``bench consume``), and the same for an in-memory Python source
   handing Spark Arrow batches (``bench.spark_in_memory``), the API's own
   ceiling; the ratio kraftlog/ceiling of median records/s against the
   target, 0.9, and kraftlog/Parquet beside it.
4. Writes (``bench.spark_write``): the Parquet copy's key and value written
   by Spark to kraftlog (``format("kraftlog")``, exactly once, then with
   ``exactlyOnce=false``) and to a Parquet directory, each after one untimed
   warm-up, ``--repeats`` times; the ratio kraftlog/Parquet of median rows/s
   against the target, 0.5. The first exactly-once run's topic is counted
   back with a read_committed consumer.
5. Streaming latency: a producer thread writes ``--rate`` records/s for
   ``--seconds`` s to a second, empty topic while a streaming query
   (``startingOffsets latest``, micro-batches back to back or every
   ``--trigger-ms``) hands each micro-batch to ``foreachBatch``, which takes,
   per record, now minus the record's timestamp (the producer's create
   time, ``unix_millis(timestamp)``). The query starts before the first
   record is sent, so it must see exactly the records produced: checked.
   Latency p50/p99/max, and micro-batch durations (``triggerExecution``
   of each micro-batch with records, from the query's progress).

Progress goes to stderr; the summary, and lines to paste into BENCHMARKS.md,
to stdout; ``--json PATH`` also writes every figure to PATH. The exit status
is 1 when the streaming query did not see exactly the records produced.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import sys
import tempfile
import threading
import time
import uuid
from typing import Any

from api.table import format_table
from bench.data import _create_topic, _percentiles, _Progress, _status, _target
from chaos.cluster import wait_until

#: The issue's target: a batch read through format("kraftlog") at least this
#: share of the Python data source API's own ceiling (an in-memory source
#: handing Spark Arrow batches), measured in the same run (records/s).
CEILING_TARGET = 0.9
#: Bounds of the streaming phase's waits, past the production time.
STREAM_START_S = 120.0
STREAM_DRAIN_S = 120.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--records", type=int, default=1_000_000,
                        help="records in the topic read by the batch runs (default %(default)s)")
    parser.add_argument("--record-size", type=int, default=100,
                        help="value bytes per record (default %(default)s)")
    parser.add_argument("--keys", type=int, default=1000,
                        help="distinct record keys, used in turn (default %(default)s)")
    parser.add_argument("--partitions", type=int, default=4,
                        help="partitions of each benchmark topic (default %(default)s)")
    parser.add_argument("--repeats", type=int, default=3,
                        help="timed runs of each batch read; median and best are reported "
                             "(default %(default)s)")
    parser.add_argument("--rate", type=int, default=2000,
                        help="records per second produced during the streaming phase "
                             "(default %(default)s)")
    parser.add_argument("--seconds", type=float, default=30.0,
                        help="how long the streaming phase produces (default %(default)g)")
    parser.add_argument("--trigger-ms", type=int, default=0,
                        help="the streaming query's processing-time trigger; 0: Spark's "
                             "default, micro-batches back to back (default %(default)s)")
    parser.add_argument("--target", dest="cluster_url", metavar="URL",
                        help="use this running broker instead of starting a fresh node")
    parser.add_argument("--dir", help="where to make the run's temporary directory (the "
                                      "fresh node's data, the Parquet copy, the checkpoint; "
                                      "removed after; default: the system's)")
    parser.add_argument("--json", metavar="PATH", default=None,
                        help="also write the figures as JSON to PATH")


def _flags_problem(args: argparse.Namespace) -> str | None:
    for name in ("records", "keys", "partitions", "repeats", "rate"):
        if getattr(args, name) < 1:
            return f"--{name} must be at least 1"
    if args.record_size < 0:
        return "--record-size must be 0 or more"
    if args.seconds <= 0:
        return "--seconds must be more than 0"
    if args.trigger_ms < 0:
        return "--trigger-ms must be 0 or more"
    return None


def run(args: argparse.Namespace) -> int:
    problem = _flags_problem(args)
    if problem:
        print(problem, file=sys.stderr)
        return 2
    if importlib.util.find_spec("pyspark") is None:
        print("kraftlog bench spark needs pyspark: pip install -e '.[spark]' (or make "
              "install)", file=sys.stderr)
        return 2
    import spark_source
    from bench.storage import describe_machine, machine_facts
    from spark_source.example import SPARK_CONFIG

    with tempfile.TemporaryDirectory(prefix="kraftlog-bench-spark-", dir=args.dir) as work:
        facts = machine_facts(work)
        _status(describe_machine(facts))
        with _target(argparse.Namespace(**{**vars(args), "dir": work}), brokers=1) as bootstrap:
            topic = f"bench-spark-{uuid.uuid4().hex[:8]}"
            _create_topic(bootstrap, topic, args.partitions)
            _fill_keyed(bootstrap, topic, args)
            _status("starting Spark (local[2]) ...")
            spark = spark_source.local_session("kraftlog-bench-spark", config={
                **SPARK_CONFIG,
                # every micro-batch's progress kept, a stop bounded
                "spark.sql.streaming.numRecentProgressUpdates": "100000",
                "spark.sql.streaming.stopTimeout": "60000"})
            try:
                batch = bench_batch(spark, bootstrap, topic, work, args)
                from bench.spark_write import bench_write  # needs pyspark: imported late
                write = bench_write(spark, bootstrap, os.path.join(work, "parquet"), work, args)
                stream = bench_stream(spark, bootstrap, work, args)
            finally:
                spark.stop()
    summary = {"bench": "spark", "machine": facts, **_params(args),
               "cluster": args.cluster_url or "1 combined node", **batch, **write,
               "stream": stream}
    _print_summary(args, summary)
    if args.json:
        from bench.storage import write_json
        write_json(args.json, summary)
        print(f"figures written to {args.json}")
    return 0 if stream["records_match"] else 1


def _params(args: argparse.Namespace) -> dict:
    keys = ("records", "record_size", "keys", "partitions", "repeats", "rate", "seconds",
            "trigger_ms")
    return {key: getattr(args, key) for key in keys}


def _reader(spark: Any, bootstrap: list[str], topic: str) -> Any:
    return (spark.read.format("kraftlog")
            .option("kraftlog.bootstrap.servers", ",".join(bootstrap))
            .option("subscribe", topic))


def _record_parts(args: argparse.Namespace) -> tuple[bytes, list[bytes]]:
    """One random value of ``--record-size`` bytes; ``--keys`` keys
    ``key-0000``.., sent in turn."""
    return os.urandom(args.record_size), [b"key-%04d" % k for k in range(args.keys)]


def _fill_keyed(bootstrap: list[str], topic: str, args: argparse.Namespace) -> None:
    """``args.records`` records into ``topic``, with progress (not timed)."""
    from api.client import Producer

    value, keys = _record_parts(args)
    progress = _Progress("filling", args.records)
    with Producer(bootstrap, acks=1, batch_size=1024 * 1024, linger_ms=5) as producer:
        send = producer.send
        for i in range(args.records):
            send(topic, value, key=keys[i % args.keys])
            if i % 4096 == 0:
                progress.update(i)
        producer.flush()
    progress.done(args.records)


# -- batch: format("kraftlog") next to Parquet -----------------------------------------
def bench_batch(spark: Any, bootstrap: list[str], topic: str, work: str,
                args: argparse.Namespace) -> dict:
    kraftlog = _reader(spark, bootstrap, topic).load()
    parquet_dir = os.path.join(work, "parquet")
    _status("copying the topic to Parquet (not timed; warms Spark up) ...")
    kraftlog.write.parquet(parquet_dir)
    copied = spark.read.parquet(parquet_dir).count()
    if copied != args.records:
        raise SystemExit(f"the Parquet copy holds {copied:,} rows, not the {args.records:,} "
                         "records of the topic")
    from bench.spark_in_memory import InMemorySource  # needs pyspark: imported late

    spark.dataSource.register(InMemorySource)
    in_memory = {shape: (spark.read.format(InMemorySource.name()).option("rows", shape)
                         .option("records", str(args.records))
                         .option("partitions", str(args.partitions))
                         .option("record_size", str(args.record_size)).load())
                 for shape in ("arrow", "tuples")}
    runs = _timed_noop({
        "kraftlog": (kraftlog, 'format("kraftlog")'),
        "parquet": (spark.read.parquet(parquet_dir), "Parquet"),
        "ceiling_arrow": (in_memory["arrow"], "in-memory Python source, Arrow batches"),
        "ceiling_tuples": (in_memory["tuples"], "in-memory Python source, tuples")}, args)
    median = {name: r["records_s_median"] for name, r in runs.items()}
    return {"batch": runs, "parquet_rows_checked": copied,
            "ratio": median["kraftlog"] / median["parquet"],
            "ratio_to_ceiling": median["kraftlog"] / median["ceiling_arrow"],
            "ceiling_ratio": median["ceiling_arrow"] / median["parquet"],
            "arrow_over_tuples": median["ceiling_arrow"] / median["ceiling_tuples"],
            "ratio_to_ceiling_target": CEILING_TARGET}


def _timed_noop(frames: dict[str, tuple[Any, str]], args: argparse.Namespace) -> dict:
    """Each of ``frames`` (name -> (DataFrame, label)) written to the noop
    sink once untimed (each reader has its own warm-up: code generation,
    JIT, Python workers), then ``args.repeats`` timed rounds, each reading
    every frame once in turn: Spark keeps warming up for a while, and
    interleaving spreads that over all readers instead of favouring the last."""
    value_mb = args.records * args.record_size / 1e6
    for df, label in frames.values():
        _status(f"{label}: warm-up run (not timed) ...")
        df.write.format("noop").mode("overwrite").save()
    seconds: dict[str, list[float]] = {name: [] for name in frames}
    for i in range(args.repeats):
        for name, (df, label) in frames.items():
            started = time.perf_counter()
            df.write.format("noop").mode("overwrite").save()
            seconds[name].append(time.perf_counter() - started)
            _status(f"{label}: run {i + 1}/{args.repeats}: {seconds[name][-1]:.2f} s, "
                    f"{args.records / seconds[name][-1]:,.0f} records/s")
    out = {}
    for name, taken in seconds.items():
        median, best = statistics.median(taken), min(taken)
        out[name] = {"seconds": taken, "records_s_median": args.records / median,
                     "records_s_best": args.records / best, "mb_s_median": value_mb / median,
                     "mb_s_best": value_mb / best}
    return out


# -- streaming: latency at a steady rate -------------------------------------------------
class _Sink:
    """What ``foreachBatch`` saw: per record, now minus its timestamp (ms)."""

    def __init__(self) -> None:
        self.latencies_ms: list[float] = []

    def __call__(self, batch_df: Any, batch_id: int) -> None:
        from pyspark.sql import functions as F

        stamps = batch_df.select(F.unix_millis("timestamp").alias("ms")).collect()
        now_ms = time.time() * 1000
        self.latencies_ms.extend(now_ms - row.ms for row in stamps)


def bench_stream(spark: Any, bootstrap: list[str], work: str,
                 args: argparse.Namespace) -> dict:
    topic = f"bench-spark-stream-{uuid.uuid4().hex[:8]}"
    _create_topic(bootstrap, topic, args.partitions)
    sink = _Sink()
    writer = (spark.readStream.format("kraftlog")
              .option("kraftlog.bootstrap.servers", ",".join(bootstrap))
              .option("subscribe", topic).option("startingOffsets", "latest").load()
              .writeStream.foreachBatch(sink)
              .option("checkpointLocation", os.path.join(work, "checkpoint")))
    if args.trigger_ms:
        writer = writer.trigger(processingTime=f"{args.trigger_ms} milliseconds")
    query = writer.start()
    try:
        # The first micro-batch fixes the starting offsets (latest): after it
        # every record produced is one the query must see.
        wait_until(lambda: not query.isActive or query.lastProgress is not None,
                   STREAM_START_S, "the streaming query's first micro-batch")
        if not query.isActive:
            raise SystemExit(f"the streaming query failed: {query.exception()}")
        produced = _produce_paced(bootstrap, topic, args, sink)
        _status(f"stream: waiting for the query to see all {produced['records']:,} records ...")
        deadline = time.monotonic() + STREAM_DRAIN_S
        while (len(sink.latencies_ms) < produced["records"] and query.isActive
               and time.monotonic() < deadline):
            time.sleep(0.1)
        # Another micro-batch's time: records beyond the count would show.
        time.sleep(max(1.0, 2 * args.trigger_ms / 1000))
    finally:
        query.stop()
    if query.exception() is not None:
        raise SystemExit(f"the streaming query failed: {query.exception()}")
    durations = _percentiles([p["durationMs"]["triggerExecution"]
                              for p in query.recentProgress if p["numInputRows"]])
    seen = len(sink.latencies_ms)
    return {"records_produced": produced["records"], "records_seen": seen,
            "records_match": seen == produced["records"], "rate": args.rate,
            "produced_records_s": produced["records"] / produced["seconds"],
            "micro_batches": durations.get("latency_samples", 0),
            "micro_batch_ms_p50": durations.get("latency_ms_p50"),
            "micro_batch_ms_p99": durations.get("latency_ms_p99"),
            **_percentiles(sink.latencies_ms)}


def _produce_paced(bootstrap: list[str], topic: str, args: argparse.Namespace,
                   sink: _Sink) -> dict:
    """``args.rate`` records/s for ``args.seconds`` s from a thread (a bounded
    loop); progress of sent and seen records meanwhile."""
    from api.client import Producer

    total = int(args.rate * args.seconds)
    value, keys = _record_parts(args)
    done: dict[str, Any] = {"sent": 0}

    def produce() -> None:
        try:
            with Producer(bootstrap, acks=1, linger_ms=1) as producer:
                started = time.perf_counter()
                for i in range(total):
                    pause = started + i / args.rate - time.perf_counter()
                    if pause > 0:
                        time.sleep(pause)
                    producer.send(topic, value, key=keys[i % args.keys])
                    done["sent"] = i + 1
                producer.flush()
                done["seconds"] = time.perf_counter() - started
        except Exception as exc:  # reported by the caller
            done["error"] = exc

    thread = threading.Thread(target=produce, name="bench-spark-producer", daemon=True)
    progress = _Progress("seen", total)  # records the query saw, of those to produce
    thread.start()
    deadline = time.monotonic() + args.seconds + 60  # the loop ends by itself well before
    while thread.is_alive() and time.monotonic() < deadline:
        progress.update(len(sink.latencies_ms))
        thread.join(0.5)
    progress.done(len(sink.latencies_ms))
    if "error" in done or "seconds" not in done:
        raise SystemExit(f"the streaming phase's producer failed after {done['sent']:,} "
                         f"records: {done.get('error', 'it did not finish in time')}")
    return {"records": total, "seconds": done["seconds"]}


# -- reporting ----------------------------------------------------------------------------
def _print_summary(args: argparse.Namespace, summary: dict) -> None:
    from bench.storage import describe_machine, verdict

    runs, stream = summary["batch"], summary["stream"]
    trigger = f"processingTime {args.trigger_ms} ms" if args.trigger_ms else \
        "default (back to back)"
    print("kraftlog bench spark")
    print("  " + describe_machine(summary["machine"]).splitlines()[0])
    print(f"  workload  {args.records:,} records of {args.record_size} B, {args.keys:,} keys, "
          f"{args.partitions} partitions, {summary['cluster']}; Spark local[2], "
          f"{args.repeats} timed run{'s' if args.repeats != 1 else ''} per read")
    print()
    rows = [(label, f"{r['records_s_median']:,.0f}", f"{r['records_s_best']:,.0f}",
             f"{r['mb_s_median']:,.1f}", f"{r['mb_s_best']:,.1f}",
             " ".join(f"{s:.2f}" for s in r["seconds"]))
            for label, r in _batch_rows(runs)]
    print(format_table(("BATCH READ (noop sink)", "RECORDS/S MEDIAN", "BEST", "MB/S MEDIAN",
                        "BEST", "RUNS (S)"), rows))
    print(verdict(f"kraftlog / the Python source API's ceiling (in-memory Arrow), records/s "
                  f"median: {summary['ratio_to_ceiling']:.2f} (target >= {CEILING_TARGET:.2f})",
                  summary["ratio_to_ceiling"] >= CEILING_TARGET))
    print(f"  kraftlog / Parquet: {summary['ratio']:.2f}; the ceiling / Parquet: "
          f"{summary['ceiling_ratio']:.2f}; Arrow batches / tuples: "
          f"{summary['arrow_over_tuples']:.2f}x")
    print()
    writes = summary["write"]
    rows = [(label, f"{r['records_s_median']:,.0f}", f"{r['records_s_best']:,.0f}",
             f"{r['mb_s_median']:,.1f}", " ".join(f"{s:.2f}" for s in r["seconds"]))
            for label, r in _write_rows(writes)]
    print(format_table(("BATCH WRITE (same rows)", "ROWS/S MEDIAN", "BEST", "MB/S MEDIAN",
                        "RUNS (S)"), rows))
    print(verdict(f"kraftlog (exactly once) / Parquet rows/s (median): "
                  f"{summary['write_ratio']:.2f} (target >= {summary['write_ratio_target']:.2f})",
                  summary["write_ratio"] >= summary["write_ratio_target"]))
    print(f"  exactlyOnce=false / Parquet: {summary['write_ratio_at_least_once']:.2f}; rows "
          f"counted back read_committed: {summary['write_rows_checked']:,}")
    print()
    match = "ok" if stream["records_match"] else "MISMATCH"
    print(f"STREAMING  {args.rate:,} records/s for {args.seconds:g} s, trigger {trigger}")
    print(format_table(("FIGURE", "VALUE"), [
        ("records produced / seen", f"{stream['records_produced']:,} / "
                                    f"{stream['records_seen']:,} ({match})"),
        ("rate achieved", f"{stream['produced_records_s']:,.0f} records/s"),
        ("latency p50 / p99 / max", _ms(stream, "latency_ms_p50", "latency_ms_p99",
                                        "latency_ms_max")),
        ("micro-batches with records", str(stream["micro_batches"])),
        ("micro-batch duration p50 / p99", _ms(stream, "micro_batch_ms_p50",
                                               "micro_batch_ms_p99"))]))
    print()
    print("For BENCHMARKS.md:")
    for label, r in _batch_rows(runs):
        print(f"| batch read, {label} | {r['records_s_median']:,.0f} records/s median, "
              f"{r['records_s_best']:,.0f} best | {r['mb_s_median']:,.1f} MB/s median, "
              f"{r['mb_s_best']:,.1f} best |")
    met = summary["ratio_to_ceiling"] >= CEILING_TARGET
    print(f"| kraftlog / the API's ceiling (median records/s) | "
          f"**{summary['ratio_to_ceiling']:.2f}** | target >= {CEILING_TARGET:.2f}: "
          f"{'met' if met else 'NOT met'} |")
    print(f"| kraftlog / Parquet (median records/s) | {summary['ratio']:.2f} | |")
    for label, r in _write_rows(writes):
        print(f"| batch write, {label} | {r['records_s_median']:,.0f} rows/s median, "
              f"{r['records_s_best']:,.0f} best | {r['mb_s_median']:,.1f} MB/s median |")
    print(f"| kraftlog write / Parquet write (median rows/s) | **{summary['write_ratio']:.2f}** "
          f"| target >= {summary['write_ratio_target']:.2f}: "
          f"{'met' if summary['write_ratio'] >= summary['write_ratio_target'] else 'NOT met'} |")
    print(f"| streaming at {args.rate:,}/s, {args.seconds:g} s, trigger {trigger} | latency "
          f"p50/p99/max {_ms(stream, 'latency_ms_p50', 'latency_ms_p99', 'latency_ms_max')} "
          f"| micro-batch p50/p99 {_ms(stream, 'micro_batch_ms_p50', 'micro_batch_ms_p99')}; "
          f"{stream['records_seen']:,}/{stream['records_produced']:,} records seen |")


def _write_rows(runs: dict) -> list[tuple[str, dict]]:
    return [('format("kraftlog"), exactly once', runs["kraftlog"]),
            ('format("kraftlog"), exactlyOnce=false', runs["kraftlog_at_least_once"]),
            ("Parquet (reference)", runs["parquet"])]


def _batch_rows(runs: dict) -> list[tuple[str, dict]]:
    return [('format("kraftlog")', runs["kraftlog"]), ("Parquet copy", runs["parquet"]),
            ("in-memory Python source, Arrow", runs["ceiling_arrow"]),
            ("in-memory Python source, tuples", runs["ceiling_tuples"])]


def _ms(figures: dict, *keys: str) -> str:
    values = [figures.get(key) for key in keys]
    if any(v is None for v in values):
        return "-"
    return " / ".join(f"{v:,.0f}" for v in values) + " ms"
