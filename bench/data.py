"""``kraftlog bench produce|consume|e2e|replication``: the data plane measured
as users see it.

Each run uses the Python client against real broker processes: a fresh
single combined node started in a temporary directory (or, with
``--brokers N``, a fresh cluster of one dedicated controller and N brokers;
or an existing cluster with ``--target``), and a fresh topic of
``--replication-factor`` replicas. It prints a progress bar while it works
and a summary: records/s, MB/s and latency percentiles, next to a reference
measured in the same run (the same bytes written to a plain file, with one
fsync at the end) so figures from different machines compare.

  produce  N records of SIZE bytes through ``Producer``; latency from
           ``send`` to acknowledgement, sampled on every 64th record.
  consume  fills the topic first (not timed), then reads every record back
           through ``Consumer`` from the beginning.
  e2e      a producer at a fixed rate in this process and a consumer in
           another; latency from ``send`` (stamped into the value) to the
           consumer's ``poll`` returning the record.
  replication  one fresh cluster of 1 controller + 3 brokers; the same
           produce run on a fresh topic per setting: RF=1 acks=1, RF=1
           acks=all, RF=3 acks=1 and RF=3 acks=all (min ISR 2); the
           reference is RF=1 acks=1 in the same run.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
import struct
import sys
import tempfile
import time
import urllib.request
import uuid
from typing import Any

from chaos.cluster import ProcessCluster, http_json, wait_until

LATENCY_SAMPLE_EVERY = 64
PROGRESS_INTERVAL_S = 0.5
BAR_WIDTH = 30
STAMP = struct.Struct(">d")  # send time, seconds since the epoch, at the start of a value
#: ``bench e2e`` keeps its rate by sleeping only once it is this far ahead
#: of its schedule, as Kafka's producer-perf-test (ThroughputThrottler's
#: MIN_SLEEP_NS) does: at 10,000 records/s a sleep per record costs the
#: producer's process more than its sends do, on the cores the cluster
#: needs. Each value is stamped as it is sent, so latency stays per record.
PACING_MIN_SLEEP_S = 0.002
#: ``--transport``: the clients' stream (their default), or a POST a request.
TRANSPORTS = ("stream", "post")


def add_arguments(parser: argparse.ArgumentParser, kind: str) -> None:
    """The flags of ``kraftlog bench KIND`` (produce, consume, e2e or replication)."""
    parser.add_argument("--records", type=int, default=1_000_000 if kind != "e2e" else 100_000,
                        help="records to send (default %(default)s)"
                             + (", in each of the four runs" if kind == "replication" else ""))
    parser.add_argument("--record-size", type=int, default=100,
                        help="value bytes per record (default %(default)s)")
    parser.add_argument("--partitions", type=int, default=4,
                        help="partitions of the benchmark topic (default %(default)s)")
    if kind not in ("replication", "idempotence"):
        parser.add_argument("--acks", default="1", choices=["0", "1", "all", "-1"],
                            help="producer acks (default %(default)s)")
    if kind != "idempotence":
        parser.add_argument("--idempotence", choices=("on", "off"),
                            help="the producer's enable_idempotence (default: the client's, "
                                 "on with acks=all)")
    parser.add_argument("--batch-size", type=int, default=1024 * 1024,
                        help="producer batch size in bytes (default %(default)s)")
    # A latency benchmark sends each record at once, as Kafka's own
    # EndToEndLatency tool does (linger.ms=0); throughput ones batch.
    parser.add_argument("--linger-ms", type=int, default=5 if kind != "e2e" else 0,
                        help="producer linger in ms (default %(default)s" + (
                            ", as Kafka's EndToEndLatency tool: each record sent at once)"
                            if kind == "e2e" else ")"))
    if kind not in ("replication", "idempotence"):
        parser.add_argument("--target", dest="cluster_url", metavar="URL",
                            help="use this running broker instead of starting a fresh node")
        parser.add_argument("--brokers", type=int, default=1,
                            help="1: a fresh single combined node (controller + broker); "
                                 "N > 1: a fresh cluster of one dedicated controller and N "
                                 "brokers (default %(default)s)")
        parser.add_argument("--replication-factor", type=int, default=1,
                            help="replicas of each partition of the benchmark topic; at most "
                                 "--brokers (default %(default)s)")
        parser.add_argument("--min-insync-replicas", type=int, default=1,
                            help="the topic's min.insync.replicas: acks=all writes are "
                                 "refused while fewer replicas are in sync (default "
                                 "%(default)s)")
    parser.add_argument("--dir", help="where the fresh node's temporary directory is made "
                                      "(removed after; default: the system's temporary "
                                      "directory)")
    if kind == "produce":
        parser.add_argument("--send-batch", type=int, default=0, metavar="N",
                            help="send through Producer.send_batch, N records per call (the "
                                 "bulk path), instead of one send() per record")
    if kind in ("produce", "replication", "idempotence"):
        parser.add_argument("--producers", type=int, default=1,
                            help="producer processes sending in parallel, each with its share "
                                 "of --records (default %(default)s)")
    if kind == "produce":
        parser.add_argument("--flush-each", action="store_true",
                            help="flush after every send: one record in flight at a time, so "
                                 "the latency is one record's round trip (give a small "
                                 "--records, for example 500)")
    if kind == "replication":
        parser.add_argument("--rounds", type=int, default=REPLICATION_ROUNDS,
                            help="rounds of the four runs, every other round in the "
                                 "opposite order; each run's figures are those of its median "
                                 "round, the verdict the median round's ratio (default "
                                 "%(default)s)")
    if kind == "e2e":
        parser.add_argument("--rate", type=int, default=10_000,
                            help="records per second the producer sends (default %(default)s)")
    if kind in ("produce", "consume", "e2e"):
        parser.add_argument("--transport", choices=TRANSPORTS, default="stream",
                            help="how the clients send produces and fetches: 'stream', tagged "
                                 "messages on one WebSocket per broker (GET /v1/stream, the "
                                 "clients' default; a request over 1 MiB, or one after an "
                                 "answer over 1 MiB, still goes by POST), or 'post', one HTTP "
                                 "POST each (default %(default)s)")
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")


def run(args: argparse.Namespace) -> int:
    kind = args.bench_kind
    if args.record_size < STAMP.size and kind == "e2e":
        print(f"--record-size must be at least {STAMP.size} for e2e", file=sys.stderr)
        return 2
    problem = _replication_flags_problem(args)
    if getattr(args, "send_batch", 0) < 0:
        problem = "--send-batch must be at least 1 (or 0: send one record a call)"
    if getattr(args, "send_batch", 0) and getattr(args, "flush_each", False):
        problem = "--flush-each sends one record at a time; it cannot be used with --send-batch"
    if problem:
        print(problem, file=sys.stderr)
        return 2
    target = _target(args)
    with target as bootstrap:
        topic = f"bench-{kind}-{uuid.uuid4().hex[:8]}"
        _create_topic(bootstrap, topic, args.partitions, args.replication_factor,
                      args.min_insync_replicas)
        if kind == "produce":
            summary = bench_produce(bootstrap, topic, args, cluster=target.cluster)
        elif kind == "consume":
            summary = bench_consume(bootstrap, topic, args, cluster=target.cluster)
        else:
            summary = bench_e2e(bootstrap, topic, args, cluster=target.cluster)
        summary["reference_disk_mb_s"] = _disk_reference_mb_s(
            args.records * args.record_size, args.dir)
        if "mb_s" in summary:
            summary["ratio_to_disk"] = summary["mb_s"] / summary["reference_disk_mb_s"]
    _print_summary(kind, args, summary)
    return 0


def _replication_flags_problem(args: argparse.Namespace) -> str | None:
    """Why --brokers, --replication-factor and --min-insync-replicas do not
    fit together, or None. With --target the cluster judges the topic."""
    if args.brokers < 1:
        return "--brokers must be at least 1"
    if args.cluster_url and args.brokers != 1:
        return "--brokers starts a fresh cluster; it cannot be used with --target"
    if args.replication_factor < 1:
        return "--replication-factor must be at least 1"
    if not args.cluster_url and args.replication_factor > args.brokers:
        return (f"--replication-factor {args.replication_factor} needs at least as many "
                f"brokers; add --brokers {args.replication_factor}")
    if not 1 <= args.min_insync_replicas <= args.replication_factor:
        return (f"--min-insync-replicas must be between 1 and the replication factor "
                f"({args.replication_factor}), not {args.min_insync_replicas}")
    return None


# -- the target cluster -----------------------------------------------------------
class _target:
    """Bootstrap URLs: the given one, a fresh single node's, or (``brokers``
    above 1) those of a fresh cluster of one controller and that many brokers.

    The fresh nodes run the shipped defaults (no settings of their own), so
    the figures are those of an out-of-the-box install."""

    def __init__(self, args: argparse.Namespace, brokers: int | None = None) -> None:
        self.args = args
        self.brokers = args.brokers if brokers is None else brokers
        self.cluster: ProcessCluster | None = None
        self.tmp: tempfile.TemporaryDirectory | None = None

    def __enter__(self) -> list[str]:
        if getattr(self.args, "cluster_url", None):
            return [self.args.cluster_url]
        # A fresh directory each run, removed after: a --dir given is where
        # it is made (a run must not start on, nor leave, another's data).
        if self.args.dir is not None:
            os.makedirs(self.args.dir, exist_ok=True)
        self.tmp = tempfile.TemporaryDirectory(prefix="kraftlog-bench-", dir=self.args.dir)
        base = self.tmp.name
        if self.brokers == 1:
            _status(f"starting a single node in {base} ...")
            self.cluster = ProcessCluster(base, controllers=1, brokers=0, combined=True,
                                          settings={})
        else:
            _status(f"starting 1 controller + {self.brokers} brokers in {base} ...")
            self.cluster = ProcessCluster(base, controllers=1, brokers=self.brokers,
                                          settings={})
        self.cluster.start()
        self.cluster.wait_for_brokers_running(timeout_s=60)
        return [self.cluster.nodes[b].broker_url for b in self.cluster.broker_ids]

    def __exit__(self, *exc: Any) -> None:
        if self.cluster is not None:
            self.cluster.stop()
        if self.tmp is not None:
            self.tmp.cleanup()


def _create_topic(bootstrap: list[str], topic: str, partitions: int,
                  replication_factor: int = 1, min_insync_replicas: int = 1,
                  security: dict | None = None) -> None:
    """Create the benchmark topic and wait (bounded) until every partition
    has a leader and all its replicas in sync, so no run times the start.
    ``security``: the client's TLS settings, for a TLS cluster."""
    from api.client import Admin, NewTopic

    with Admin(bootstrap=bootstrap, **(security or {})) as admin:
        admin.create_topics([NewTopic(
            topic, num_partitions=partitions, replication_factor=replication_factor,
            configs={"min.insync.replicas": str(min_insync_replicas)})])
        if security:  # the in-sync check below speaks plain HTTP: ask the client
            deadline = time.monotonic() + 60
            while any(p.leader < 0 for p in admin.describe_topics([topic])[topic]
                      .partitions):
                if time.monotonic() > deadline:
                    raise SystemExit(f"{topic}: no leader for every partition in 60 s")
                time.sleep(0.1)
            return
    _wait_for_replicas_in_sync(bootstrap, topic, partitions)


def _wait_for_replicas_in_sync(bootstrap: list[str], topic: str, partitions: int,
                               timeout_s: float = 120.0) -> None:
    """Until every partition of ``topic`` has a leader, all its replicas in
    the ISR, and the same log end on each (GET /v1/topics/TOPIC)."""
    def in_sync() -> bool:
        for url in bootstrap:
            try:
                status, body = http_json(f"{url}/v1/topics/{topic}")
            except OSError:
                continue
            parts = body.get("partitions", []) if status == 200 else []
            return len(parts) == partitions and all(
                p["leader"] >= 0 and sorted(p["isr"]) == sorted(p["replicas"])
                and p["replica_states"] is not None
                and len({r["log_end_offset"] for r in p["replica_states"]}) == 1
                for p in parts)
        return False

    wait_until(in_sync, timeout_s, f"{topic}: every replica in sync", interval_s=0.1)


# -- produce ------------------------------------------------------------------------
def _producer(bootstrap: list[str], args: argparse.Namespace):
    from api.client import Producer

    acks = -1 if args.acks in ("all", "-1") else int(args.acks)
    idempotence = getattr(args, "idempotence", None)
    settings = {} if idempotence is None else {"enable_idempotence": idempotence == "on"}
    producer = Producer(bootstrap=bootstrap, acks=acks, batch_size=args.batch_size,
                        linger_ms=args.linger_ms, **settings)
    _set_transport(producer._producer, getattr(args, "transport", "stream"))
    return producer


def _set_transport(client, transport: str) -> None:
    """``--transport``: an ``AsyncProducer`` or ``AsyncConsumer`` sends its
    produces or fetches on its stream (the default), or each by POST."""
    client._transport.streams_enabled = transport == "stream"


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


def _fill_bulk(producer, topic: str, count: int, size: int, per_call: int, label: str | None,
               latencies_ms: list[float] | None = None) -> dict:
    """``_fill`` through ``Producer.send_batch``, ``per_call`` records a
    call (one list, made before the clock starts, as a caller holding its
    records has them); latency sampled on every batch written."""
    value = os.urandom(size)
    values = [value] * per_call
    latencies_ms = [] if latencies_ms is None else latencies_ms
    perf = time.perf_counter
    progress = _Progress(label, count) if label is not None else _NoProgress()
    started = perf()
    sent = 0
    while sent < count:
        n = min(per_call, count - sent)
        called = perf()
        producer.send_batch(topic, values if n == per_call else values[:n],
                            on_delivery=lambda err, md, called=called: latencies_ms.append(
                                (perf() - called) * 1000) if err is None else None)
        sent += n
        progress.update(sent)
    producer.flush()
    elapsed = perf() - started
    progress.done(count)
    return {"records": count, "seconds": elapsed, "records_s": count / elapsed,
            "mb_s": count * size / elapsed / 1e6, **_percentiles(latencies_ms)}


def _round_trips(producer, topic: str, count: int, size: int, label: str | None,
                 latencies_ms: list[float] | None = None) -> dict:
    """``--flush-each``: send one record and flush, ``count`` times, after
    one untimed record (the metadata); each latency is one round trip."""
    value = os.urandom(size)
    latencies_ms = [] if latencies_ms is None else latencies_ms
    perf = time.perf_counter
    producer.send(topic, value).result(30)
    progress = _Progress(label, count) if label is not None else _NoProgress()
    started = perf()
    for i in range(count):
        sent = perf()
        producer.send(topic, value)
        producer.flush()
        latencies_ms.append((perf() - sent) * 1000)
        progress.update(i + 1)
    elapsed = perf() - started
    progress.done(count)
    return {"records": count, "seconds": elapsed, "records_s": count / elapsed,
            "mb_s": count * size / elapsed / 1e6, **_percentiles(latencies_ms)}


def _send_all(producer, topic: str, count: int, args: argparse.Namespace, label: str | None,
              latencies_ms: list[float] | None = None) -> dict:
    if getattr(args, "flush_each", False):
        return _round_trips(producer, topic, count, args.record_size, label, latencies_ms)
    per_call = getattr(args, "send_batch", 0)
    if per_call:
        return _fill_bulk(producer, topic, count, args.record_size, per_call, label,
                          latencies_ms)
    return _fill(producer, topic, count, args.record_size, label, latencies_ms)


def bench_produce(bootstrap: list[str], topic: str, args: argparse.Namespace,
                  label: str = "produce", cluster: ProcessCluster | None = None) -> dict:
    """Produce ``args.records``; with ``cluster``, the CPU of each process
    too (``cpu_s``, ``cores_busy``)."""
    if args.producers == 1:
        with _producer(bootstrap, args) as producer:
            window = _CpuWindow(cluster)
            cpu_started_s = time.process_time()  # this process, every thread
            figures = _send_all(producer, topic, args.records, args, label)
            client_cpu_s = time.process_time() - cpu_started_s
            cpu = window.figures({"producer": client_cpu_s}) if cluster is not None else {}
            return {**figures, "client_cpu_s": client_cpu_s, **cpu}
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
    _status(f"{label}: {args.producers} producer processes sending {args.records:,} "
            "records ...")
    window = _CpuWindow(cluster)
    started = time.time()
    go.set()
    results = [out.get(timeout=600) for _ in children]
    cpu = (window.figures({f"producer {i + 1}": figures["cpu_s"]
                           for i, (_, figures) in enumerate(results)})
           if cluster is not None else {})
    for child in children:
        child.join(10)
    elapsed = max(finished for finished, _ in results) - started
    latencies = [ms for _, figures in results for ms in figures.pop("latencies")]
    return {"records": args.records, "seconds": elapsed, "records_s": args.records / elapsed,
            "mb_s": args.records * args.record_size / elapsed / 1e6,
            "producers": args.producers, **_percentiles(latencies),
            "client_cpu_s": sum(figures["cpu_s"] for _, figures in results), **cpu}


def _produce_child(bootstrap: list[str], topic: str, args: argparse.Namespace, count: int,
                   ready, go, out) -> None:
    with _producer(bootstrap, args) as producer:
        producer.send(topic, b"warm-up").result(30)  # metadata fetched before the clock
        ready.wait(60)
        go.wait(60)
        latencies: list[float] = []
        cpu_started_s = time.process_time()
        _send_all(producer, topic, count, args, None, latencies)
        out.put((time.time(), {"latencies": latencies,
                               "cpu_s": time.process_time() - cpu_started_s}))


# -- consume ------------------------------------------------------------------------
def bench_consume(bootstrap: list[str], topic: str, args: argparse.Namespace,
                  cluster: ProcessCluster | None = None) -> dict:
    from api.client import Consumer, TopicPartition

    with _producer(bootstrap, args) as producer:
        _fill(producer, topic, args.records, args.record_size, "filling")
    consumer = Consumer(bootstrap=bootstrap, auto_offset_reset="earliest")
    _set_transport(consumer._consumer, args.transport)
    try:
        consumer.assign([TopicPartition(topic, p) for p in range(args.partitions)])
        consumer.seek_to_beginning()
        progress = _Progress("consume", args.records)
        got = 0
        value_bytes = 0
        window = _CpuWindow(cluster)
        cpu_started_s = time.process_time()
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
        client_cpu_s = time.process_time() - cpu_started_s
        cpu = window.figures({"consumer": client_cpu_s}) if cluster is not None else {}
        progress.done(got)
    finally:
        consumer.close()
    return {"records": got, "seconds": elapsed, "records_s": got / elapsed,
            "mb_s": value_bytes / elapsed / 1e6, "client_cpu_s": client_cpu_s, **cpu}


# -- end to end -----------------------------------------------------------------------
def _e2e_consumer(bootstrap: list[str], topic: str, partitions: int, count: int,
                  transport: str, ready, out) -> None:
    """Runs in a child process: read ``count`` records, send back latencies
    and the CPU seconds the reading took."""
    from api.client import Consumer, TopicPartition

    consumer = Consumer(bootstrap=bootstrap, auto_offset_reset="earliest",
                        fetch_max_wait_ms=100)
    _set_transport(consumer._consumer, transport)
    consumer.assign([TopicPartition(topic, p) for p in range(partitions)])
    consumer.seek_to_beginning()
    ready.set()
    cpu_started_s = time.process_time()
    latencies_ms = []
    deadline = time.monotonic() + 120 + count / 1000
    while len(latencies_ms) < count and time.monotonic() < deadline:
        records = consumer.poll(timeout_ms=500)
        now = time.time()
        for record in records:
            latencies_ms.append((now - STAMP.unpack_from(record.value)[0]) * 1000)
    cpu_s = time.process_time() - cpu_started_s
    consumer.close()
    out.put((latencies_ms, cpu_s))


def bench_e2e(bootstrap: list[str], topic: str, args: argparse.Namespace,
              cluster: ProcessCluster | None = None) -> dict:
    context = multiprocessing.get_context("spawn")
    ready, out = context.Event(), context.Queue()
    child = context.Process(target=_e2e_consumer, daemon=True, args=(
        bootstrap, topic, args.partitions, args.records, args.transport, ready, out))
    child.start()
    if not ready.wait(60):
        child.kill()
        raise SystemExit("the consumer process did not start within 60 s")
    padding = os.urandom(args.record_size - STAMP.size)
    interval_s = 1 / args.rate
    progress = _Progress("e2e", args.records)
    with _producer(bootstrap, args) as producer:
        requests_before = _produce_requests(bootstrap)
        window = _CpuWindow(cluster)
        cpu_started_s = time.process_time()
        started = time.perf_counter()
        for i in range(args.records):
            target = started + i * interval_s
            pause = target - time.perf_counter()
            if pause >= PACING_MIN_SLEEP_S:
                time.sleep(pause)
            producer.send(topic, STAMP.pack(time.time()) + padding)
            if i % 1000 == 0:
                progress.update(i)
        producer.flush()
        sent_s = time.perf_counter() - started
        producer_cpu_s = time.process_time() - cpu_started_s
        latencies_ms, consumer_cpu_s = out.get(timeout=120 + args.records / 1000)
        cpu = (window.figures({"producer": producer_cpu_s, "consumer": consumer_cpu_s})
               if cluster is not None else {})
        requests = _produce_requests(bootstrap) - requests_before
    child.join(10)
    progress.done(len(latencies_ms))
    return {"records": len(latencies_ms), "seconds": sent_s,
            "records_s": args.records / sent_s, "target_rate": args.rate,
            "produce_requests_s": requests / sent_s, **_percentiles(latencies_ms), **cpu}


def _produce_requests(bootstrap: list[str]) -> int:
    """Produce requests the brokers at ``bootstrap`` have answered so far,
    every outcome (``kraftlog_requests_total`` in their /metrics)."""
    total = 0.0
    for url in bootstrap:
        with urllib.request.urlopen(url + "/metrics", timeout=10) as response:
            for line in response.read().decode().splitlines():
                if line.startswith("kraftlog_requests_total{") and 'api="/v1/produce"' in line:
                    total += float(line.rpartition(" ")[2])
    return int(total)


# -- replication: RF=3 acks=all next to RF=1 -------------------------------------------
#: The runs of ``kraftlog bench replication``, in the order they run:
#: (label, replication factor, min.insync.replicas, acks). The first is the
#: reference the others are divided by.
REPLICATION_RUNS = (
    ("RF=1 acks=1", 1, 1, "1"),
    ("RF=1 acks=all", 1, 1, "all"),
    ("RF=3 acks=1", 3, 2, "1"),
    ("RF=3 acks=all", 3, 2, "all"),
)
REPLICATION_BROKERS = 3
#: Issue 25's target (issue 17's was 0.5): RF=3 acks=all keeps at least
#: this share of the RF=1 acks=1 throughput.
REPLICATION_RATIO_TARGET = 0.8
#: ``--rounds`` by default: each run's figure is its median round's.
REPLICATION_ROUNDS = 3


def run_replication(args: argparse.Namespace) -> int:
    """``kraftlog bench replication``: ``--rounds`` rounds of every run of
    ``REPLICATION_RUNS`` on one fresh cluster, each on a fresh topic of the
    same shape; each run's figures are its median round's. Every other
    round runs them in the opposite order, so a drift in the machine's speed
    during the benchmark (this 2-core VM's producers vary by a third from
    minute to minute, and each run leaves its data behind) reaches every
    run alike."""
    if args.rounds < 1:
        print("--rounds must be at least 1", file=sys.stderr)
        return 2
    samples: dict[str, list[dict]] = {label: [] for label, *_ in REPLICATION_RUNS}
    target = _target(args, brokers=REPLICATION_BROKERS)
    with target as bootstrap:
        for round_no in range(args.rounds):
            # Every other round backwards: each run comes early and late alike
            # (the runs slow as the disk and the page cache fill).
            order = REPLICATION_RUNS if round_no % 2 == 0 else REPLICATION_RUNS[::-1]
            for label, replication_factor, min_insync, acks in order:
                topic = (f"bench-replication-rf{replication_factor}-acks{acks}-"
                         f"{uuid.uuid4().hex[:8]}")
                _create_topic(bootstrap, topic, args.partitions, replication_factor,
                              min_insync)
                run_args = argparse.Namespace(**{**vars(args), "acks": acks})
                figures = bench_produce(
                    bootstrap, topic, run_args,
                    label=label if args.rounds == 1 else
                    f"{label} ({round_no + 1}/{args.rounds})", cluster=target.cluster)
                # After an acks=1 run the followers may still be copying; the
                # next run must not pay for it (not timed, bounded).
                _wait_for_replicas_in_sync(bootstrap, topic, args.partitions)
                samples[label].append(figures)
    runs = []
    for label, replication_factor, min_insync, acks in REPLICATION_RUNS:
        ordered = sorted(samples[label], key=lambda run: run["records_s"])
        runs.append({"label": label, "replication_factor": replication_factor,
                     "min_insync_replicas": min_insync, "acks": acks,
                     "records_s_all": [run["records_s"] for run in samples[label]],
                     **ordered[len(ordered) // 2]})
    for entry in runs:
        entry["ratio_to_reference"] = entry["records_s"] / runs[0]["records_s"]
    reference, last = samples[runs[0]["label"]], samples[runs[-1]["label"]]
    # The verdict pairs the two runs of each round (the medians of the runs
    # may come from different rounds) and takes the median round.
    each_round = [mine["records_s"] / theirs["records_s"]
                  for mine, theirs in zip(last, reference)]
    summary = {"bench": "replication", **vars_subset(args), "brokers": REPLICATION_BROKERS,
               "reference": runs[0]["label"], "runs": runs,
               "ratio_rf3_acks_all_to_rf1": statistics.median(each_round),
               "ratio_each_round": each_round,
               "ratio_of_medians": runs[-1]["ratio_to_reference"],
               "ratio_target": REPLICATION_RATIO_TARGET}
    _print_replication(args, summary)
    return 0


#: ``kraftlog bench idempotence``: (label, enable_idempotence), acks=all both.
IDEMPOTENCE_RUNS = (("acks=all", "off"), ("acks=all idempotent", "on"))
IDEMPOTENCE_RATIO_TARGET = 0.9
#: Each pair of runs is repeated; the figure per run is the median.
IDEMPOTENCE_ROUNDS = 3


def run_idempotence(args: argparse.Namespace) -> int:
    """``kraftlog bench idempotence``: acks=all produce without and with
    idempotence on one fresh node, alternating, each on a fresh topic."""
    samples: dict[str, list[dict]] = {label: [] for label, _ in IDEMPOTENCE_RUNS}
    args = argparse.Namespace(**{**vars(args), "cluster_url": None,
                                 "replication_factor": 1, "min_insync_replicas": 1})
    with _target(args, brokers=1) as bootstrap:
        for round_no in range(IDEMPOTENCE_ROUNDS):
            for label, idempotence in IDEMPOTENCE_RUNS:
                topic = f"bench-idempotence-{idempotence}-{uuid.uuid4().hex[:8]}"
                _create_topic(bootstrap, topic, args.partitions, 1, 1)
                run_args = argparse.Namespace(**{**vars(args), "acks": "all",
                                                 "idempotence": idempotence})
                samples[label].append(bench_produce(
                    bootstrap, topic, run_args,
                    label=f"{label} ({round_no + 1}/{IDEMPOTENCE_ROUNDS})"))
    runs = []
    for label, idempotence in IDEMPOTENCE_RUNS:
        ordered = sorted(samples[label], key=lambda run: run["records_s"])
        median = ordered[len(ordered) // 2]
        runs.append({"label": label, "enable_idempotence": idempotence == "on",
                     "records_s_all": [run["records_s"] for run in samples[label]],
                     **median})
    ratio = runs[1]["records_s"] / runs[0]["records_s"]
    summary = {"bench": "idempotence", **vars_subset(args), "runs": runs,
               "ratio_idempotent_to_plain": ratio, "ratio_target": IDEMPOTENCE_RATIO_TARGET}
    if args.json:
        import json
        print(json.dumps(summary, indent=2))
        return 0
    from api.table import format_table
    rows = [(run["label"], f"{run['records_s']:,.0f}",
             " / ".join(f"{r:,.0f}" for r in run["records_s_all"]), f"{run['mb_s']:,.1f}",
             f"{run.get('latency_ms_p50', float('nan')):.1f}",
             f"{run.get('latency_ms_p99', float('nan')):.1f}") for run in runs]
    print("kraftlog bench idempotence")
    print(f"  node      one fresh combined node (shipped defaults), a fresh topic per run, "
          f"{IDEMPOTENCE_ROUNDS} alternating rounds")
    print(f"  workload  {args.records:,} records of {args.record_size} B, {args.partitions} "
          f"partitions, batch {args.batch_size} B, linger {args.linger_ms} ms, acks=all")
    print()
    print(format_table(("run", "records/s (median)", "each round", "MB/s", "p50 ms",
                        "p99 ms"), rows))
    print()
    verdict = "met" if ratio >= IDEMPOTENCE_RATIO_TARGET else "NOT met"
    print(f"idempotent / plain acks=all throughput: {ratio:.2f} "
          f"(target >= {IDEMPOTENCE_RATIO_TARGET:.2f}: {verdict})")
    return 0


class _CpuWindow:
    """The CPU each process of a run used from its start to ``figures()``:
    every node process of ``cluster`` (from /proc) and the clients' own
    figures, with the cores they kept busy together over the wall time."""

    def __init__(self, cluster: ProcessCluster | None) -> None:
        self.cluster = cluster
        self.before = cluster.cpu_seconds() if cluster is not None else None
        self.started = time.perf_counter()

    def figures(self, clients_s: dict[str, float]) -> dict:
        """``cpu_s`` by process, ``cpu_wall_s``, ``cores``; with the node
        processes' figures (a cluster of ours, /proc), ``cluster_cpu_s``
        (theirs together) and ``cores_busy`` (everyone's over the wall)."""
        wall_s = time.perf_counter() - self.started
        after = self.cluster.cpu_seconds() if self.cluster is not None else None
        nodes = {}
        if self.before is not None and after is not None:
            for node_id, seconds in sorted(after.items()):
                roles = "+".join(self.cluster.nodes[node_id].roles)
                nodes[f"node {node_id} ({roles})"] = seconds - self.before.get(node_id, 0.0)
        cpu_s = {**nodes, **clients_s}
        figures = {"cpu_s": cpu_s, "cpu_wall_s": wall_s, "cores": os.cpu_count()}
        if nodes:
            figures.update(cluster_cpu_s=sum(nodes.values()),
                           cores_busy=sum(cpu_s.values()) / wall_s)
        return figures


def _print_replication(args: argparse.Namespace, summary: dict) -> None:
    if args.json:
        import json
        print(json.dumps(summary, indent=2))
        return
    from api.table import format_table

    def cpu(run: dict, key: str, unit: str) -> str:
        return f"{run[key]:.1f}{unit}" if key in run else "-"

    rows = [(run["label"], str(run["min_insync_replicas"]), f"{run['records_s']:,.0f}",
             " / ".join(f"{r:,.0f}" for r in run["records_s_all"]),
             f"{run['mb_s']:,.1f}", f"{run.get('latency_ms_p50', float('nan')):.1f}",
             f"{run.get('latency_ms_p99', float('nan')):.1f}",
             f"{run['ratio_to_reference']:.2f}", cpu(run, "cluster_cpu_s", " s"),
             cpu(run, "client_cpu_s", " s"),
             cpu(run, "cores_busy", f" of {run.get('cores')}"))
            for run in summary["runs"]]
    ratio = summary["ratio_rf3_acks_all_to_rf1"]
    verdict = "met" if ratio >= REPLICATION_RATIO_TARGET else "NOT met"
    print("kraftlog bench replication")
    print(f"  cluster   1 controller + {REPLICATION_BROKERS} brokers (shipped defaults), "
          "a fresh topic per run")
    print(f"  workload  {args.records:,} records of {args.record_size} B, {args.partitions} "
          f"partitions, batch {args.batch_size} B, linger {args.linger_ms} ms, "
          f"{args.producers} producer process{'es' if args.producers > 1 else ''}, "
          f"{args.rounds} round{'s' if args.rounds > 1 else ''} of the four runs")
    print()
    print(format_table(("run", "min ISR", "records/s (median)", "each round", "MB/s",
                        "p50 ms", "p99 ms",
                        f"vs {summary['reference']} (medians)", "cluster CPU", "client CPU",
                        "cores busy"), rows))
    print()
    print("Each run's figures are those of its median round. CPU: seconds used during the "
          "timed run by the four node processes and by the producer(s); cores busy = both "
          "over the run's wall time.")
    print(f"RF=3 acks=all / {summary['reference']} throughput, each round: "
          + ", ".join(f"{r:.2f}" for r in summary["ratio_each_round"])
          + f" (of the runs' medians: {summary['ratio_of_medians']:.2f})")
    print(f"RF=3 acks=all / {summary['reference']} throughput, the median round: {ratio:.2f} "
          f"(target >= {REPLICATION_RATIO_TARGET:.2f}: {verdict})")


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
            ("cluster", args.cluster_url or ("1 combined node" if args.brokers == 1 else
                                             f"1 controller + {args.brokers} brokers")),
            ("replication", f"RF={args.replication_factor}, min.insync.replicas="
                            f"{args.min_insync_replicas}"),
            ("acks / batch / linger", f"{args.acks} / {args.batch_size} B / {args.linger_ms} ms"),
            ("sending", f"send_batch, {args.send_batch:,} records a call"
                        if getattr(args, "send_batch", 0) else
                        "send + flush, one record in flight a producer"
                        if getattr(args, "flush_each", False)
                        else "send, one call a record"),
            ("transport", "one WebSocket per broker (GET /v1/stream; requests over 1 MiB "
                          "by POST)" if args.transport == "stream" else "a POST a request"),
            ("records/s", f"{summary['records_s']:,.0f}")]
    if summary.get("producers"):
        rows.append(("producer processes", str(summary["producers"])))
    if kind == "e2e":
        rows.append(("target rate", f"{summary['target_rate']:,} records/s"))
        rows.append(("produce requests/s", f"{summary['produce_requests_s']:,.0f} (all "
                                           "brokers; a request carries a batch per partition)"))
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
    for process, seconds in summary.get("cpu_s", {}).items():
        rows.append((f"CPU {process}", f"{seconds:.2f} s ({seconds / summary['cpu_wall_s']:.2f} "
                                       "cores)"))
    if summary.get("cores_busy") is not None:
        rows.append(("cores busy", f"{summary['cores_busy']:.2f} of {summary['cores']}"))
    width = max(len(label) for label, _ in rows)
    print(f"kraftlog bench {kind}")
    for label, value in rows:
        print(f"  {label.ljust(width)}  {value}")


def vars_subset(args: argparse.Namespace) -> dict:
    keys = ("records", "record_size", "partitions", "acks", "batch_size", "linger_ms", "rate",
            "rounds", "producers", "brokers", "replication_factor", "min_insync_replicas",
            "send_batch", "flush_each", "transport")
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
