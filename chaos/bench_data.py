"""``kraftlog bench produce|consume|e2e``: the data plane measured as users see it.

Each run uses the Python client against real broker processes: a fresh
single combined node started in a temporary directory (or an existing
cluster with ``--bootstrap``), and a fresh topic. It prints a progress bar
while it works and a summary: records/s, MB/s and latency percentiles, next
to a reference measured in the same run (the same bytes written to a plain
file, with one fsync at the end) so figures from different machines compare.

  produce  N records of SIZE bytes through ``Producer``; latency from
           ``send`` to acknowledgement, sampled on every 64th record.
  consume  fills the topic first (not timed), then reads every record back
           through ``Consumer`` from the beginning.
  e2e      a producer at a fixed rate in this process and a consumer in
           another; latency from ``send`` (stamped into the value) to the
           consumer's ``poll`` returning the record.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import struct
import sys
import tempfile
import time
import uuid
from typing import Any

from chaos.cluster import ProcessCluster

LATENCY_SAMPLE_EVERY = 64
PROGRESS_INTERVAL_S = 0.5
BAR_WIDTH = 30
STAMP = struct.Struct(">d")  # send time, seconds since the epoch, at the start of a value


def add_arguments(parser: argparse.ArgumentParser, kind: str) -> None:
    parser.add_argument("--records", type=int, default=1_000_000 if kind != "e2e" else 100_000,
                        help="records to send (default %(default)s)")
    parser.add_argument("--record-size", type=int, default=100,
                        help="value bytes per record (default %(default)s)")
    parser.add_argument("--partitions", type=int, default=4,
                        help="partitions of the benchmark topic (default %(default)s)")
    parser.add_argument("--acks", default="1", choices=["0", "1", "all", "-1"],
                        help="producer acks (default %(default)s)")
    parser.add_argument("--batch-size", type=int, default=1024 * 1024,
                        help="producer batch size in bytes (default %(default)s)")
    parser.add_argument("--linger-ms", type=int, default=5 if kind != "e2e" else 1,
                        help="producer linger in ms (default %(default)s)")
    parser.add_argument("--target", dest="cluster_url", metavar="URL",
                        help="use this running broker instead of starting a fresh node")
    parser.add_argument("--dir", help="where the fresh node keeps its data "
                                      "(default: a temporary directory, removed after)")
    if kind == "produce":
        parser.add_argument("--producers", type=int, default=1,
                            help="producer processes sending in parallel, each with its share "
                                 "of --records (default %(default)s)")
    if kind == "e2e":
        parser.add_argument("--rate", type=int, default=10_000,
                            help="records per second the producer sends (default %(default)s)")
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")


def run(args: argparse.Namespace) -> int:
    kind = args.bench_kind
    if args.record_size < STAMP.size and kind == "e2e":
        print(f"--record-size must be at least {STAMP.size} for e2e", file=sys.stderr)
        return 2
    with _target(args) as bootstrap:
        topic = f"bench-{kind}-{uuid.uuid4().hex[:8]}"
        _create_topic(bootstrap, topic, args.partitions)
        if kind == "produce":
            summary = bench_produce(bootstrap, topic, args)
        elif kind == "consume":
            summary = bench_consume(bootstrap, topic, args)
        else:
            summary = bench_e2e(bootstrap, topic, args)
        summary["reference_disk_mb_s"] = _disk_reference_mb_s(
            args.records * args.record_size, args.dir)
        if "mb_s" in summary:
            summary["ratio_to_disk"] = summary["mb_s"] / summary["reference_disk_mb_s"]
    _print_summary(kind, args, summary)
    return 0


# -- the target cluster -----------------------------------------------------------
class _target:
    """A bootstrap URL: the given one, or a fresh single node's."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.cluster: ProcessCluster | None = None
        self.tmp: tempfile.TemporaryDirectory | None = None

    def __enter__(self) -> str:
        if self.args.cluster_url:
            return self.args.cluster_url
        base = self.args.dir
        if base is None:
            self.tmp = tempfile.TemporaryDirectory(prefix="kraftlog-bench-")
            base = self.tmp.name
        _status(f"starting a single node in {base} ...")
        self.cluster = ProcessCluster(base, controllers=1, brokers=0, combined=True,
                                      settings={})
        self.cluster.start()
        self.cluster.wait_for_brokers_running(timeout_s=60)
        return self.cluster.nodes[1].broker_url

    def __exit__(self, *exc: Any) -> None:
        if self.cluster is not None:
            self.cluster.stop()
        if self.tmp is not None:
            self.tmp.cleanup()


def _create_topic(bootstrap: str, topic: str, partitions: int) -> None:
    from api.client import Admin, NewTopic

    with Admin(bootstrap=bootstrap) as admin:
        admin.create_topics([NewTopic(topic, num_partitions=partitions)])


# -- produce ------------------------------------------------------------------------
def _producer(bootstrap: str, args: argparse.Namespace):
    from api.client import Producer

    acks = -1 if args.acks in ("all", "-1") else int(args.acks)
    return Producer(bootstrap=bootstrap, acks=acks, batch_size=args.batch_size,
                    linger_ms=args.linger_ms)


def _fill(producer, topic: str, count: int, size: int, label: str | None,
          latencies_ms: list[float] | None = None) -> dict:
    """Send ``count`` records; latency samples of every 64th. Returns figures.
    ``label`` None: no progress bar (a child process)."""
    value = os.urandom(size)
    latencies_ms = [] if latencies_ms is None else latencies_ms
    send = producer.send
    perf = time.perf_counter
    progress = _Progress(label, count) if label is not None else _NoProgress()
    started = perf()
    for i in range(count):
        if i % LATENCY_SAMPLE_EVERY == 0:
            sent = perf()
            send(topic, value, on_delivery=lambda err, md, sent=sent: latencies_ms.append(
                (perf() - sent) * 1000) if err is None else None)
            progress.update(i)
        else:
            send(topic, value)
    producer.flush()
    elapsed = perf() - started
    progress.done(count)
    return {"records": count, "seconds": elapsed, "records_s": count / elapsed,
            "mb_s": count * size / elapsed / 1e6, **_percentiles(latencies_ms)}


def bench_produce(bootstrap: str, topic: str, args: argparse.Namespace) -> dict:
    if args.producers == 1:
        with _producer(bootstrap, args) as producer:
            return _fill(producer, topic, args.records, args.record_size, "produce")
    # Several producer processes (as several producer-perf-test runs would
    # be): each sends its share once all are ready; the figure is the total
    # over the wall time from the start signal to the last flush.
    context = multiprocessing.get_context("spawn")
    ready, go, out = context.Barrier(args.producers + 1), context.Event(), context.Queue()
    shares = [args.records // args.producers + (i < args.records % args.producers)
              for i in range(args.producers)]
    children = [context.Process(target=_produce_child, daemon=True,
                                args=(bootstrap, topic, args, share, ready, go, out))
                for share in shares]
    for child in children:
        child.start()
    ready.wait(60)
    _status(f"{args.producers} producer processes sending {args.records:,} records ...")
    started = time.time()
    go.set()
    results = [out.get(timeout=600) for _ in children]
    for child in children:
        child.join(10)
    elapsed = max(finished for finished, _ in results) - started
    latencies = [ms for _, figures in results for ms in figures.pop("latencies")]
    return {"records": args.records, "seconds": elapsed, "records_s": args.records / elapsed,
            "mb_s": args.records * args.record_size / elapsed / 1e6,
            "producers": args.producers, **_percentiles(latencies)}


def _produce_child(bootstrap: str, topic: str, args: argparse.Namespace, count: int,
                   ready, go, out) -> None:
    with _producer(bootstrap, args) as producer:
        producer.send(topic, b"warm-up").result(30)  # metadata fetched before the clock
        ready.wait(60)
        go.wait(60)
        latencies: list[float] = []
        _fill(producer, topic, count, args.record_size, None, latencies)
        out.put((time.time(), {"latencies": latencies}))


# -- consume ------------------------------------------------------------------------
def bench_consume(bootstrap: str, topic: str, args: argparse.Namespace) -> dict:
    from api.client import Consumer, TopicPartition

    with _producer(bootstrap, args) as producer:
        _fill(producer, topic, args.records, args.record_size, "filling")
    consumer = Consumer(bootstrap=bootstrap, auto_offset_reset="earliest")
    try:
        consumer.assign([TopicPartition(topic, p) for p in range(args.partitions)])
        consumer.seek_to_beginning()
        progress = _Progress("consume", args.records)
        got = 0
        value_bytes = 0
        started = time.perf_counter()
        deadline = started + max(60.0, args.records / 50_000)
        while got < args.records:
            if time.perf_counter() > deadline:
                raise SystemExit(f"consume stalled at {got} of {args.records} records")
            records = consumer.poll(timeout_ms=1000)
            got += len(records)
            for record in records:
                value_bytes += len(record.value)
            progress.update(got)
        elapsed = time.perf_counter() - started
        progress.done(got)
    finally:
        consumer.close()
    return {"records": got, "seconds": elapsed, "records_s": got / elapsed,
            "mb_s": value_bytes / elapsed / 1e6}


# -- end to end -----------------------------------------------------------------------
def _e2e_consumer(bootstrap: str, topic: str, partitions: int, count: int,
                  ready, out) -> None:
    """Runs in a child process: read ``count`` records, send back latencies."""
    from api.client import Consumer, TopicPartition

    consumer = Consumer(bootstrap=bootstrap, auto_offset_reset="earliest",
                        fetch_max_wait_ms=100)
    consumer.assign([TopicPartition(topic, p) for p in range(partitions)])
    consumer.seek_to_beginning()
    ready.set()
    latencies_ms = []
    deadline = time.monotonic() + 120 + count / 1000
    while len(latencies_ms) < count and time.monotonic() < deadline:
        records = consumer.poll(timeout_ms=500)
        now = time.time()
        for record in records:
            latencies_ms.append((now - STAMP.unpack_from(record.value)[0]) * 1000)
    consumer.close()
    out.put(latencies_ms)


def bench_e2e(bootstrap: str, topic: str, args: argparse.Namespace) -> dict:
    context = multiprocessing.get_context("spawn")
    ready, out = context.Event(), context.Queue()
    child = context.Process(target=_e2e_consumer, daemon=True, args=(
        bootstrap, topic, args.partitions, args.records, ready, out))
    child.start()
    if not ready.wait(60):
        child.kill()
        raise SystemExit("the consumer process did not start within 60 s")
    padding = os.urandom(args.record_size - STAMP.size)
    interval_s = 1 / args.rate
    progress = _Progress("e2e", args.records)
    with _producer(bootstrap, args) as producer:
        started = time.perf_counter()
        for i in range(args.records):
            target = started + i * interval_s
            pause = target - time.perf_counter()
            if pause > 0:
                time.sleep(pause)
            producer.send(topic, STAMP.pack(time.time()) + padding)
            if i % 1000 == 0:
                progress.update(i)
        producer.flush()
        sent_s = time.perf_counter() - started
    latencies_ms = out.get(timeout=120 + args.records / 1000)
    child.join(10)
    progress.done(len(latencies_ms))
    return {"records": len(latencies_ms), "seconds": sent_s,
            "records_s": args.records / sent_s, "target_rate": args.rate,
            **_percentiles(latencies_ms)}


# -- reporting ------------------------------------------------------------------------
def _percentiles(samples_ms: list[float]) -> dict:
    if not samples_ms:
        return {}
    ordered = sorted(samples_ms)

    def at(q: float) -> float:
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]

    return {"latency_ms_p50": at(0.50), "latency_ms_p99": at(0.99),
            "latency_ms_p999": at(0.999), "latency_ms_max": ordered[-1],
            "latency_samples": len(ordered)}


def _disk_reference_mb_s(total_bytes: int, directory: str | None) -> float:
    """The same number of bytes written sequentially in 1 MiB writes to a
    plain file, with one fsync at the end."""
    chunk = os.urandom(1024 * 1024)
    with tempfile.NamedTemporaryFile(dir=directory, prefix="kraftlog-bench-ref-") as f:
        started = time.perf_counter()
        written = 0
        while written < total_bytes:
            f.write(chunk[:min(len(chunk), total_bytes - written)])
            written += len(chunk)
        f.flush()
        os.fsync(f.fileno())
        elapsed = time.perf_counter() - started
    return total_bytes / elapsed / 1e6


def _print_summary(kind: str, args: argparse.Namespace, summary: dict) -> None:
    if args.json:
        import json
        print(json.dumps({"bench": kind, **vars_subset(args), **summary}, indent=2))
        return
    rows = [("records", f"{summary['records']:,}"),
            ("record size", f"{args.record_size} B"),
            ("partitions", str(args.partitions)),
            ("acks / batch / linger", f"{args.acks} / {args.batch_size} B / {args.linger_ms} ms"),
            ("records/s", f"{summary['records_s']:,.0f}")]
    if summary.get("producers"):
        rows.append(("producer processes", str(summary["producers"])))
    if kind == "e2e":
        rows.append(("target rate", f"{summary['target_rate']:,} records/s"))
    if "mb_s" in summary:
        rows.append(("MB/s", f"{summary['mb_s']:,.1f}"))
    for key, label in (("latency_ms_p50", "latency p50"), ("latency_ms_p99", "latency p99"),
                       ("latency_ms_p999", "latency p99.9"), ("latency_ms_max", "latency max")):
        if key in summary:
            rows.append((label, f"{summary[key]:.2f} ms"))
    rows.append(("disk reference", f"{summary['reference_disk_mb_s']:,.1f} MB/s "
                                   "(same bytes, sequential write + fsync)"))
    if "ratio_to_disk" in summary:
        rows.append(("ratio to disk", f"{summary['ratio_to_disk']:.2f}"))
    width = max(len(label) for label, _ in rows)
    print(f"kraftlog bench {kind}")
    for label, value in rows:
        print(f"  {label.ljust(width)}  {value}")


def vars_subset(args: argparse.Namespace) -> dict:
    keys = ("records", "record_size", "partitions", "acks", "batch_size", "linger_ms", "rate",
            "producers")
    return {key: getattr(args, key) for key in keys if hasattr(args, key)}


def _status(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


class _NoProgress:
    def update(self, done: int) -> None:
        pass

    def done(self, done: int) -> None:
        pass


class _Progress:
    """A one-line progress bar on stderr (plain lines when not a terminal)."""

    def __init__(self, label: str, total: int) -> None:
        self.label, self.total = label, max(total, 1)
        self.started = time.perf_counter()
        self.last = 0.0
        self.tty = sys.stderr.isatty()

    def update(self, done: int) -> None:
        now = time.perf_counter()
        if now - self.last < PROGRESS_INTERVAL_S:
            return
        self.last = now
        self._show(done, now)

    def done(self, done: int) -> None:
        self._show(done, time.perf_counter())
        if self.tty:
            sys.stderr.write("\n")

    def _show(self, done: int, now: float) -> None:
        fraction = min(done / self.total, 1.0)
        filled = int(fraction * BAR_WIDTH)
        rate = done / max(now - self.started, 1e-9)
        line = (f"{self.label:8} [{'#' * filled}{'.' * (BAR_WIDTH - filled)}] "
                f"{fraction:6.1%} {done:,}/{self.total:,} {rate:,.0f} rec/s")
        sys.stderr.write(("\r" + line) if self.tty else line + "\n")
        sys.stderr.flush()
