"""An example pipeline: clicks per user per minute, from a kraftlog topic back
to kraftlog (exactly once) and to Parquet, with Spark Structured Streaming.

::

    make run                        # terminal 1: a node on 127.0.0.1:9092
    make spark-example              # terminal 2: .venv/bin/python -m spark_source.example
    make spark-example ARGS="--follow --produce 0"

What it does:

1. ``--produce N`` (default 10000): create the topic (``--topic``, default
   ``clicks``, 3 partitions) if it is missing and write N demo clicks: key
   the user id (``user-00`` .. ``user-19``), value a small JSON document
   ``{"page": ..., "user": ...}``, event times (the record timestamp, set with
   ``Producer.send(timestamp_ms=...)``) spread evenly over the last
   ``--minutes`` minutes, in increasing order.
2. Run two streaming queries over one plan: ``format("kraftlog")``,
   ``startingOffsets earliest``, the JSON value parsed (``from_json``),
   ``withWatermark("timestamp", ...)``, a count per user in 1-minute tumbling
   windows of the record timestamp; one query writes the counts to the
   kraftlog topic ``--out-topic`` (default ``clicks-per-minute``: key the
   user, value ``{"window_start": ms, "user": ..., "clicks": n}``) with the
   exactly-once sink, the other to Parquet (``--out``); both in append mode,
   each with its checkpoint under ``--checkpoint`` (side by side with
   ``--follow``; one after the other under AvailableNow). By default with
   ``Trigger.AvailableNow`` (read what is there, write, stop); with
   ``--follow`` every ``--trigger-seconds`` until Ctrl-C. A line per
   micro-batch of each query shows progress.
3. Print what the Parquet directory holds: window start, user, clicks, and
   how many counts the output topic holds for a read_committed consumer.

Killed at any moment (even ``kill -9``), a run started again with the same
``--checkpoint`` completes the output exactly once: the kraftlog sink's
transactions and Spark's checkpoint together (docs/spark.md).

Append mode writes a window once, when it is final: when the watermark (the
newest event time seen, minus ``--watermark-seconds``) has passed its end.
Spark then runs one more micro-batch without data to write those windows, so
a first run already shows every minute except the newest one or two; those
stay in the query's state (in the checkpoint) and are written by a later run
or micro-batch, once newer records move the watermark past their end.

A record whose event time is below the watermark when it arrives is late and
dropped, as in any watermarked query. So that re-running the example never
produces late records, new demo clicks start after the newest record already
in the topic.

Start again from scratch: delete ``./data/spark-example`` (the output and the
checkpoints; the topics keep their records, which a fresh checkpoint reads
from the beginning) and the output topic (``kraftlog topics delete
clicks-per-minute``).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import sys
import threading
import time
from typing import Any

import spark_source
from api.cli_support import ExamplesFormatter
from api.table import format_table

DEFAULT_BOOTSTRAP = "http://127.0.0.1:9092"
DEFAULT_DIR = os.path.join("data", "spark-example")
USERS = [f"user-{n:02d}" for n in range(20)]
PAGES = ["/", "/search", "/product", "/cart", "/checkout", "/help"]
PARTITIONS = 3
#: The most rows of the result table printed.
SHOW_ROWS = 200
#: After Ctrl-C, how long to wait for the micro-batch under way to finish.
STOP_WAIT_S = 30.0
#: Spark settings on top of ``spark_source.local_session``'s: no progress bars
#: between the example's own lines.
SPARK_CONFIG = {"spark.ui.showConsoleProgress": "false"}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m spark_source.example",
        formatter_class=ExamplesFormatter,
        description="Count clicks per user in 1-minute event-time windows with Spark "
                    "Structured Streaming reading a kraftlog topic (format(\"kraftlog\")), "
                    "and write the counts to Parquet in append mode. Needs a running node: "
                    "start one with `make run` first.",
        epilog="""\
Append mode writes a window once the watermark (newest event time minus --watermark-seconds) \
has passed its end; the newest one or two windows stay in the query's state (in the \
checkpoint) until newer records arrive, and appear in a later run.

examples:
  make run                                   # in another terminal
  python -m spark_source.example             # 10000 clicks, one AvailableNow run
  python -m spark_source.example --produce 0 # just process what is new
  python -m spark_source.example --follow    # keep running; Ctrl-C stops
  printf 'user-03:{"page": "/"}\\n' | kraftlog produce clicks --key-separator :
                                             # (while following) one more click
  rm -rf data/spark-example                  # start the output over""")
    parser.add_argument("--bootstrap", default=os.environ.get("KRAFTLOG_BOOTSTRAP",
                                                              DEFAULT_BOOTSTRAP),
                        metavar="URL",
                        help="a broker of the running node (default: $KRAFTLOG_BOOTSTRAP or "
                             "%(default)s, where `make run` listens)")
    parser.add_argument("--topic", default="clicks", metavar="NAME",
                        help="the topic (default %(default)s)")
    parser.add_argument("--produce", type=int, default=10_000, metavar="N",
                        help="first create the topic if missing (3 partitions) and write N "
                             "demo clicks; 0 writes nothing (default %(default)s)")
    parser.add_argument("--minutes", type=float, default=5.0, metavar="M",
                        help="spread the demo clicks' event times over the last this many "
                             "minutes (default %(default)g)")
    parser.add_argument("--watermark-seconds", type=int, default=10, metavar="S",
                        help="the watermark's delay: how late a click may arrive and still "
                             "count (default %(default)s)")
    parser.add_argument("--out", default=os.path.join(DEFAULT_DIR, "counts"), metavar="DIR",
                        help="the Parquet output directory (default %(default)s)")
    parser.add_argument("--out-topic", default="clicks-per-minute", metavar="NAME",
                        help="the kraftlog topic the counts go to, exactly once; created "
                             "(3 partitions) if missing (default %(default)s)")
    parser.add_argument("--checkpoint", default=os.path.join(DEFAULT_DIR, "checkpoint"),
                        metavar="DIR",
                        help="the queries' checkpoints (DIR/kraftlog, DIR/parquet): offsets "
                             "read and open windows (default %(default)s)")
    parser.add_argument("--max-offsets-per-trigger", type=int, default=None, metavar="N",
                        help="read at most N records per micro-batch (default: all there "
                             "are)")
    parser.add_argument("--follow", action="store_true",
                        help="keep running, a micro-batch every --trigger-seconds, until "
                             "Ctrl-C (default: Trigger.AvailableNow, process what is there "
                             "and stop)")
    parser.add_argument("--trigger-seconds", type=float, default=5.0, metavar="S",
                        help="with --follow: the processing-time trigger (default %(default)g)")
    return parser


class ExampleError(Exception):
    """Something to tell the user in one line, no traceback."""


def main(argv: list[str] | None = None, spark: Any = None) -> int:
    """The command line; ``spark``: a session to run in (left running), or
    None for a local one of its own (stopped at the end)."""
    args = build_parser().parse_args(argv)
    try:
        if args.produce < 0:
            raise ExampleError("--produce must be 0 or more")
        prepare_topic(args)
        return run_query(args, spark)
    except ExampleError as exc:
        print(f"spark example: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


# -- the demo data -----------------------------------------------------------------------
def prepare_topic(args: argparse.Namespace) -> None:
    """Check the node answers; create the topics and write the demo clicks."""
    from api.client import Admin, KraftlogError, NewTopic, TopicAlreadyExistsError

    try:
        with Admin(args.bootstrap, request_timeout_ms=5000) as admin:
            topics = admin.list_topics()
            if args.topic not in topics:
                if not args.produce:
                    raise ExampleError(
                        f"topic {args.topic!r} does not exist at {args.bootstrap}; run with "
                        "--produce N to create it and write demo clicks")
                try:
                    admin.create_topics([NewTopic(args.topic, num_partitions=PARTITIONS)])
                    print(f"created topic {args.topic} ({PARTITIONS} partitions)")
                except TopicAlreadyExistsError:
                    pass  # created meanwhile: fine
            if args.out_topic not in topics:
                try:
                    admin.create_topics([NewTopic(args.out_topic, num_partitions=PARTITIONS)])
                    print(f"created topic {args.out_topic} ({PARTITIONS} partitions)")
                except TopicAlreadyExistsError:
                    pass
        if args.produce:
            produce_clicks(args)
    except KraftlogError as exc:
        raise ExampleError(
            f"cannot reach a kraftlog node at {args.bootstrap} ({exc.__class__.__name__}). "
            "Start one first with `make run` (in another terminal), or point --bootstrap "
            "at a running broker") from None


def produce_clicks(args: argparse.Namespace) -> None:
    """Write ``args.produce`` clicks, event times evenly spread over the last
    ``args.minutes`` minutes but after the topic's newest record (so a re-run
    writes nothing the watermark already passed)."""
    from api.client import Producer

    now_ms = int(time.time() * 1000)
    first_ms = max(now_ms - int(args.minutes * 60_000), newest_timestamp_ms(args) + 1)
    first_ms = min(first_ms, now_ms)
    step = (now_ms - first_ms) / max(args.produce - 1, 1)
    rng = random.Random()
    with Producer(args.bootstrap, acks=1) as producer:
        for i in range(args.produce):
            user = rng.choice(USERS)
            value = json.dumps({"page": rng.choice(PAGES), "user": user}).encode()
            producer.send(args.topic, value, key=user.encode(),
                          timestamp_ms=first_ms + int(i * step))
        producer.flush()
    print(f"wrote {args.produce:,} clicks to {args.topic}, event times "
          f"{_clock(first_ms)} .. {_clock(now_ms)}")


def newest_timestamp_ms(args: argparse.Namespace) -> int:
    """The timestamp of the newest record in the topic (the last of each
    partition), or 0 for an empty topic."""
    from api.client import Consumer, TopicPartition

    newest = 0
    with Consumer(args.bootstrap, auto_offset_reset="earliest",
                  enable_auto_commit=False) as consumer:
        tps = [TopicPartition(args.topic, p) for p in consumer.partitions_for_topic(args.topic)]
        ends = {tp: end for tp, end in consumer.end_offsets(tps).items() if end > 0}
        if not ends:
            return 0
        consumer.assign(list(ends))
        for tp, end in ends.items():
            consumer.seek(tp, end - 1)
        waiting = set(ends)
        deadline = time.monotonic() + 10
        while waiting and time.monotonic() < deadline:
            for record in consumer.poll(500):
                tp = TopicPartition(record.topic, record.partition)
                if record.offset == ends[tp] - 1:
                    waiting.discard(tp)
                    newest = max(newest, record.timestamp)
    return newest


# -- the query ----------------------------------------------------------------------------
def counts_per_minute(spark: Any, args: argparse.Namespace) -> Any:
    """Clicks per user per 1-minute event-time window, from the topic."""
    from pyspark.sql import functions as F

    clicks = (spark.readStream.format("kraftlog")
              .option("kraftlog.bootstrap.servers", args.bootstrap)
              .option("subscribe", args.topic)
              .option("startingOffsets", "earliest"))
    if args.max_offsets_per_trigger:
        clicks = clicks.option("maxOffsetsPerTrigger", str(args.max_offsets_per_trigger))
    parsed = (clicks.load()
              .select("timestamp", F.from_json(F.col("value").cast("string"),
                                               "page string, user string").alias("click"))
              .where(F.col("click.user").isNotNull()))
    return (parsed
            .withWatermark("timestamp", f"{args.watermark_seconds} seconds")
            .groupBy(F.window("timestamp", "1 minute"), F.col("click.user").alias("user"))
            .count()
            .select(F.col("window.start").alias("window_start"),
                    F.col("window.end").alias("window_end"), "user",
                    F.col("count").alias("clicks")))


def run_query(args: argparse.Namespace, spark: Any = None) -> int:
    own_session = spark is None
    if own_session:
        try:
            spark = spark_source.local_session("kraftlog-spark-example", config=SPARK_CONFIG)
        except ImportError:
            raise ExampleError("pyspark is not installed: run `make install` (it installs "
                               "the spark extra), or pip install -e '.[spark]'") from None
    from pyspark.sql import functions as F

    counts = counts_per_minute(spark, args)
    to_kraftlog = (counts.select(
                       F.col("user").alias("key"),
                       F.to_json(F.struct(F.unix_millis("window_start").alias("window_start"),
                                          "user", "clicks")).alias("value"))
                   .writeStream.format("kraftlog").outputMode("append")
                   .option("kafka.bootstrap.servers", args.bootstrap)
                   .option("topic", args.out_topic)
                   .option("checkpointLocation", os.path.join(args.checkpoint, "kraftlog"))
                   .queryName("counts_to_kraftlog"))
    to_parquet = (counts.writeStream.format("parquet").outputMode("append")
                  .option("path", args.out)
                  .option("checkpointLocation", os.path.join(args.checkpoint, "parquet"))
                  .queryName("counts_to_parquet"))
    writers = [to_kraftlog, to_parquet]
    if args.follow:
        writers = [w.trigger(processingTime=f"{args.trigger_seconds} seconds") for w in writers]
    else:
        writers = [w.trigger(availableNow=True) for w in writers]
    how = (f"a micro-batch every {args.trigger_seconds:g} s until Ctrl-C" if args.follow
           else "Trigger.AvailableNow: what is there, then stop")
    print(f"streaming {args.topic} from {args.bootstrap} into topic {args.out_topic} and "
          f"{args.out} ({how}) ...", flush=True)
    # Following, both queries run side by side; with AvailableNow one after
    # the other (each ends by itself), so two queries never plan their first
    # jobs at once (Spark 4.3 has failed here deserialising a task when two
    # restarted queries started together).
    groups = [writers] if args.follow else [[w] for w in writers]
    queries: list = []
    batches = 0
    try:
        for group in groups:
            started = [w.start() for w in group]
            queries.extend(started)
            batches += watch(started)
            # Still running after watch: Ctrl-C; failed: reported below.
            if any(q.isActive or q.exception() is not None for q in started):
                break
        if not batches:
            print("  no micro-batch: nothing new in the topic since the last run (windows "
                  "still open wait in the checkpoint for newer records, e.g. --produce N)")
    finally:
        for query in queries:
            if query.isActive:
                query.stop()
    for query in queries:
        failure = query.exception()
        if failure is not None:
            if own_session:
                spark.stop()
            lines = [line for line in str(failure).splitlines() if line.strip()]
            raise ExampleError(f"the streaming query {query.name} failed: "
                               f"{lines[0] if lines else failure}")
    watermark = (queries[-1].lastProgress or {}).get("eventTime", {}).get("watermark")
    show_output(spark, args, watermark)
    if own_session:
        spark.stop()
    return 0


def watch(queries: list) -> int:
    """Print one line per micro-batch of each query until they all end
    (AvailableNow), one fails, or Ctrl-C; the number of micro-batches.

    Ctrl-C only sets a flag here: PySpark's own SIGINT handler calls into the
    JVM, which fails noisily when the signal lands during another call."""
    interrupted = threading.Event()
    previous = signal.signal(signal.SIGINT, lambda *_: interrupted.set())
    printed: set[tuple[str, str]] = set()
    try:
        while not interrupted.is_set():
            active = [query.isActive for query in queries]
            for query in queries:
                for progress in query.recentProgress:
                    # Idle triggers report progress too, without addBatch.
                    key = (query.name, progress["timestamp"])
                    if key in printed or "addBatch" not in progress["durationMs"]:
                        continue
                    printed.add(key)
                    state = sum(op.get("numRowsTotal", 0) for op in progress["stateOperators"])
                    written = progress.get("sink", {}).get("numOutputRows", -1)
                    print(f"  {query.name} micro-batch {progress['batchId']}: "
                          f"{progress['numInputRows']} records read"
                          + (f", {written} counts written" if written >= 0 else "")
                          + f", watermark {progress.get('eventTime', {}).get('watermark', '-')}"
                          f", open (window, user) counts in state: {state}", flush=True)
            if not all(active) and (not any(active) or any(
                    q.exception() is not None for q in queries)):
                return len(printed)
            interrupted.wait(0.5)
        # Let the micro-batches under way finish (bounded): stopping in the
        # middle of one aborts its writes, noisily (the next run redoes them
        # from the checkpoint).
        print("\nstopping after the micro-batches under way ...", flush=True)
        deadline = time.monotonic() + STOP_WAIT_S
        while any(q.isActive and q.status["isTriggerActive"] for q in queries) \
                and time.monotonic() < deadline:
            time.sleep(0.2)
    finally:
        signal.signal(signal.SIGINT, previous)
    return len(printed)


def show_output(spark: Any, args: argparse.Namespace, watermark: str | None) -> None:
    """Print the Parquet directory's windows as a table."""
    from pyspark.sql.utils import AnalysisException

    try:
        rows = (spark.read.parquet(args.out)
                .orderBy("window_start", "user").collect())
    except AnalysisException:
        rows = []
    where = os.path.abspath(args.out)
    if rows:
        shown = rows[:SHOW_ROWS]
        print(format_table(("WINDOW START", "USER", "CLICKS"),
                           [(str(r.window_start), r.user, str(r.clicks)) for r in shown]))
        if len(rows) > SHOW_ROWS:
            print(f"... and {len(rows) - SHOW_ROWS} more rows")
        windows = len({r.window_start for r in rows})
        print(f"{len(rows)} rows: {windows} one-minute windows, "
              f"{sum(r.clicks for r in rows):,} clicks counted")
    else:
        print("no windows written yet")
    print(f"Parquet files: {where}  (read them with spark.read.parquet({args.out!r}))")
    print(f"topic {args.out_topic}: {committed_count(args):,} counts for read_committed "
          f"consumers  (kraftlog consume {args.out_topic} --from-beginning "
          "--isolation-level read_committed)")
    print(f"checkpoint:    {os.path.abspath(args.checkpoint)}")
    if watermark:
        print(f"watermark {watermark}: windows ending after it are still open and kept in "
              "the checkpoint; a later run writes them once newer records move the "
              "watermark past their end.")


def committed_count(args: argparse.Namespace) -> int:
    """How many records of the output topic a read_committed consumer sees."""
    from api.client import Consumer, TopicPartition

    with Consumer(args.bootstrap, isolation_level="read_committed",
                  enable_auto_commit=False) as consumer:
        tps = [TopicPartition(args.out_topic, p)
               for p in consumer.partitions_for_topic(args.out_topic)]
        # Up to the last stable offsets: the records, minus transaction markers.
        return sum(len(batch) for batch in _read_all(consumer, tps))


def _read_all(consumer: Any, tps: list) -> Any:
    ends = consumer.end_offsets(tps)
    consumer.assign(tps)
    consumer.seek_to_beginning(tps)
    deadline = time.monotonic() + 30
    while any(consumer.position(tp) < ends[tp] for tp in tps) and time.monotonic() < deadline:
        yield consumer.poll(300)


def _clock(epoch_ms: int) -> str:
    return time.strftime("%H:%M:%S", time.localtime(epoch_ms / 1000))


if __name__ == "__main__":
    sys.exit(main())
