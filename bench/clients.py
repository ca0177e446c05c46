"""``kraftlog bench clients``: one broker serving many clients at once.

One fresh cluster of real processes on loopback (chaos/cluster.py): a
dedicated controller and one broker, the shipped defaults. One topic of
``--partitions`` partitions, replication factor 1.

Two rounds on that broker, the same total load: ``--reference-clients``
clients (10), then ``--clients`` (1,000). Half the clients are
``AsyncProducer``s, half ``AsyncConsumer``s, spread over ``--processes``
worker processes (this module run with ``--worker``), each client with its
own connections. Producers together send ``--rate`` records/s of 100 bytes
(acks=1, each on a fixed schedule, not waiting for the last one, over the
partitions in turn), and the time from ``send`` to the acknowledgement is
each record's latency.
Consumers are each assigned one partition from its end and long-poll it
(``fetch_min_bytes`` 64 KiB, ``fetch_max_wait_ms`` 500) for the whole round.

Once every client has had its first answer, the round runs ``--seconds``;
midway the broker is measured: connections it holds
(``kraftlog_connections``), open file descriptors (/proc/<pid>/fd) and
resident memory (VmRSS); over the round, the CPU of the broker and of the
client processes (cores, from /proc), and the round's length (longer than
``--seconds`` when the clients fall behind their schedule). The broker's own
produce handling time over the round comes from its
``kraftlog_request_latency_seconds`` histogram (``/v1/produce``, by POST or
stream: from the request read to the answer written), and the time a
request waits before it is read from ``kraftlog_event_loop_lag_seconds``
(how late the broker's event loop runs a timer), together what Kafka's
``TotalTimeMs`` covers; p50 and p99 are histogram buckets' upper bounds.
The clients' latency includes their own wait for a core; these do not.

The target (issue 25): with 1,000 clients, p99 produce latency <= 50 ms at
10,000 records/s, descriptors and memory bounded. The 10-client round is
the reference: the slope from 10 to 1,000 clients is what the table shows.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import select
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from typing import Any

from api.table import format_table
from chaos.cluster import REPO_ROOT, ProcessCluster, process_cpu_seconds, wait_until

TOPIC = "bench-clients"
RECORD_VALUE = bytes(100)
TARGET_P99_MS = 50.0
#: Bounds of the waits.
READY_WAIT_S = 180.0
#: How long after its schedule a round may take to report (late clients).
RESULTS_WAIT_S = 600.0
CONSUMER_FETCH_MIN_BYTES = 64 * 1024
CONSUMER_FETCH_MAX_WAIT_MS = 500


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--clients", type=int, default=1000,
                        help="clients in the main round, half producers, half consumers "
                             "(default %(default)s)")
    parser.add_argument("--reference-clients", type=int, default=10,
                        help="clients in the reference round (default %(default)s)")
    parser.add_argument("--processes", type=int, default=10,
                        help="worker processes the clients are spread over "
                             "(default %(default)s)")
    parser.add_argument("--rate", type=int, default=10_000,
                        help="records/s all producers send together (default %(default)s)")
    parser.add_argument("--seconds", type=float, default=20.0,
                        help="length of each round once every client is connected "
                             "(default %(default)s)")
    parser.add_argument("--partitions", type=int, default=12,
                        help="partitions of the topic (default %(default)s)")
    parser.add_argument("--dir", default=None, help="work directory (default: a temporary one)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)


def run(args: argparse.Namespace) -> int:
    if args.worker is not None:
        return asyncio.run(_worker(json.loads(args.worker)))
    for name in ("clients", "reference_clients", "processes", "rate", "partitions"):
        if getattr(args, name) < 1:
            print(f"--{name.replace('_', '-')} must be at least 1", file=sys.stderr)
            return 2
    if args.clients < 2 or args.reference_clients < 2:
        print("a round needs at least 2 clients: a producer and a consumer", file=sys.stderr)
        return 2
    rounds = []
    with tempfile.TemporaryDirectory(prefix="kraftlog-bench-clients-", dir=args.dir) as work, \
            ProcessCluster(os.path.join(work, "cluster"), controllers=1, brokers=1) as cluster:
        cluster.start()
        cluster.wait_for_brokers_running(timeout_s=60)
        broker = cluster.nodes[cluster.broker_ids[0]]
        status, body = cluster.controller_call("/v1/controller/topics/create", {"topics": [{
            "name": TOPIC, "num_partitions": args.partitions, "replication_factor": 1}]})
        if status != 200 or body["topics"][0]["error"] is not None:
            print(f"cannot create {TOPIC}: {body}", file=sys.stderr)
            return 1
        wait_until(lambda: _hosted(broker.broker_url) >= args.partitions, 60, "partitions open")
        for clients in (args.reference_clients, args.clients):
            _progress(f"round of {clients} clients ...")
            rounds.append(_round(broker, clients, args))
    _progress("")
    result = {"rate": args.rate, "seconds": args.seconds, "partitions": args.partitions,
              "rounds": rounds, "target_p99_ms": TARGET_P99_MS}
    print(json.dumps(result, indent=2) if args.json else format_report(result))
    return 0


def _round(broker, clients: int, args: argparse.Namespace) -> dict:
    producers = clients // 2
    consumers = clients - producers
    processes = min(args.processes, clients)
    specs = []
    for i in range(processes):
        p = producers // processes + (1 if i < producers % processes else 0)
        c = consumers // processes + (1 if i < consumers % processes else 0)
        specs.append({"bootstrap": broker.broker_url, "topic": TOPIC,
                      "partitions": args.partitions, "producers": p, "consumers": c,
                      "rate_per_producer": args.rate / producers, "seconds": args.seconds,
                      "first_consumer": sum(s["consumers"] for s in specs), "seed": i})
    workers = [subprocess.Popen(
        [sys.executable, "-m", "api.cli", "bench", "clients", "--worker", json.dumps(spec)],
        cwd=REPO_ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        for spec in specs]
    try:
        deadline = time.monotonic() + READY_WAIT_S
        for worker in workers:  # each prints "ready" once all its clients were answered
            line = _read_line(worker, deadline)
            if line.strip() != "ready":
                raise RuntimeError(f"a worker did not get ready: {line!r}")
        pid = broker.process.pid
        histograms_before = _histograms(broker.broker_url)
        cpu_before = process_cpu_seconds(pid)
        workers_cpu_before = sum(process_cpu_seconds(w.pid) for w in workers)
        started = time.monotonic()
        for worker in workers:
            worker.stdin.write("go\n")
            worker.stdin.flush()
        time.sleep(args.seconds / 2)
        held = _metric(broker.broker_url, "kraftlog_connections")
        fds = len(os.listdir(f"/proc/{pid}/fd"))
        rss_mib = _rss_kib(pid) / 1024
        deadline = time.monotonic() + args.seconds + RESULTS_WAIT_S
        outputs = [json.loads(_read_line(worker, deadline)) for worker in workers]
        elapsed = time.monotonic() - started  # the schedule's length, or longer if late
        cpu = process_cpu_seconds(pid) - cpu_before
        workers_cpu = sum(process_cpu_seconds(w.pid) for w in workers) - workers_cpu_before
        histograms = {name: {le: n - histograms_before[name].get(le, 0)
                             for le, n in buckets.items()}
                      for name, buckets in _histograms(broker.broker_url).items()}
    finally:
        for worker in workers:
            try:
                worker.wait(timeout=30)
            except subprocess.TimeoutExpired:
                worker.kill()
    latencies = sorted(ms for out in outputs for ms in out["latencies_ms"])
    failed = sum(out["failed"] for out in outputs)
    consumed = sum(out["consumed"] for out in outputs)
    return {"clients": clients, "producers": producers, "consumers": consumers,
            "processes": processes, "connections": held, "broker_fds": fds,
            "broker_rss_mib": round(rss_mib, 1),
            "elapsed_s": round(elapsed, 1), "broker_cpu_share": round(cpu / elapsed, 2),
            "clients_cpu_share": round(workers_cpu / elapsed, 2),
            "produced": len(latencies), "produced_per_s": round(len(latencies) / elapsed),
            "consumed_per_s": round(consumed / elapsed), "failed": failed,
            **_percentiles(latencies),
            **_histogram_quantiles(histograms[PRODUCE_HISTOGRAM], "broker"),
            **_histogram_quantiles(histograms[LOOP_LAG_HISTOGRAM], "loop_lag")}


def _percentiles(values: list[float]) -> dict[str, float | None]:
    if not values:
        return {"p50_ms": None, "p99_ms": None, "max_ms": None}
    return {"p50_ms": round(statistics.median(values), 1),
            "p99_ms": round(values[min(len(values) - 1, int(len(values) * 0.99))], 1),
            "max_ms": round(values[-1], 1)}


def _histogram_quantiles(cumulative: dict[float, int], key: str) -> dict[str, Any]:
    """``{key}_count`` and p50 and p99 of a cumulative histogram (upper
    bound -> count) as the upper bounds of the buckets they fall in, in ms
    (None: no observation, inf: beyond the last bound)."""
    bounds = sorted(cumulative)
    total = cumulative[bounds[-1]] if bounds else 0
    out: dict[str, Any] = {f"{key}_count": total}
    for name, q in ((f"{key}_p50_ms", 0.5), (f"{key}_p99_ms", 0.99)):
        bound = next((b for b in bounds if total and cumulative[b] >= q * total), None)
        out[name] = None if bound is None else bound * 1000
    return out


def _bound(ms: float | None) -> str:
    if ms is None:
        return "-"
    return "> 10 s" if ms == float("inf") else f"<= {ms:g}"


def format_report(result: dict) -> str:
    rows = [[str(r["clients"]), f"{r['producers']}/{r['consumers']}", str(r["processes"]),
             str(int(r["connections"])), str(r["broker_fds"]), f"{r['broker_rss_mib']:.0f}",
             f"{r['broker_cpu_share']:.2f}", f"{r['clients_cpu_share']:.2f}",
             f"{r['elapsed_s']:.0f}", f"{r['produced_per_s']:,}",
             f"{r['consumed_per_s']:,}", str(r["failed"]), f"{r['p50_ms']}", f"{r['p99_ms']}",
             f"{r['max_ms']}", _bound(r.get("broker_p50_ms")), _bound(r.get("broker_p99_ms")),
             _bound(r.get("loop_lag_p99_ms"))]
            for r in result["rounds"]]
    lines = [f"kraftlog: one broker, many clients ({result['rate']:,} records/s of 100 bytes "
             f"in all, acks=1, {result['partitions']} partitions, {result['seconds']:.0f} s "
             "per round)", "",
             format_table(["clients", "prod/cons", "procs", "conns", "fds", "RSS MiB",
                           "broker CPU", "clients CPU", "round s", "produced/s",
                           "consumed/s", "failed", "p50 ms", "p99 ms", "max ms",
                           "broker p50 ms", "broker p99 ms", "loop lag p99 ms"], rows),
             "(p50/p99/max: each record's send to its acknowledgement, in the clients; broker "
             "p50/p99: the broker's produce handling time; loop lag: how late its event loop "
             "ran a timer, about what a request waits to be read; histogram buckets)"]
    reference, main = result["rounds"][0], result["rounds"][-1]
    if reference["p99_ms"] and main["p99_ms"]:
        verdict = "met" if main["p99_ms"] <= result["target_p99_ms"] else "NOT met"
        lines += ["", f"p99 with {main['clients']} clients: {main['p99_ms']} ms, "
                      f"{main['p99_ms'] / reference['p99_ms']:.1f}x the {reference['clients']}-"
                      f"client round's; target <= {result['target_p99_ms']:.0f} ms: {verdict}",
                  f"broker per connection: "
                  f"{_per(main, reference, 'broker_rss_mib') * 1024:.0f} KiB of memory, "
                  f"{_per(main, reference, 'broker_fds'):.2f} descriptors"]
    return "\n".join(lines)


def _per(main: dict, reference: dict, key: str) -> float:
    extra = main["connections"] - reference["connections"]
    return (main[key] - reference[key]) / extra if extra > 0 else 0.0


def _read_line(worker: subprocess.Popen, deadline: float) -> str:
    """The worker's next line, or an error once ``deadline`` passed (a
    worker prints one line at a time and then waits, so nothing is left in
    its pipe's buffer that ``select`` would miss)."""
    ready, _, _ = select.select([worker.stdout], [], [], max(0.0, deadline - time.monotonic()))
    if not ready:
        raise RuntimeError(f"worker {worker.pid} said nothing in time")
    line = worker.stdout.readline()
    if not line:
        raise RuntimeError(f"worker {worker.pid} exited")
    return line


# -- the broker, measured from outside ----------------------------------------------

def _hosted(url: str) -> int:
    try:
        with urllib.request.urlopen(url + "/healthz", timeout=5) as response:
            return json.loads(response.read())["partitions"]
    except (OSError, ValueError, KeyError):
        return 0


def _metric(url: str, name: str) -> float:
    with urllib.request.urlopen(url + "/metrics", timeout=10) as response:
        for line in response.read().decode().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[-1])
    return float("nan")


#: The broker's histograms a round reads: its produce handling time, and
#: how late its event loop runs (what a request waits before it is read).
PRODUCE_HISTOGRAM = 'kraftlog_request_latency_seconds_bucket{api="/v1/produce",le="'
LOOP_LAG_HISTOGRAM = 'kraftlog_event_loop_lag_seconds_bucket{le="'


def _histograms(url: str) -> dict[str, dict[float, int]]:
    """The broker's cumulative histograms above: name -> upper bound (s) ->
    observations within it."""
    out: dict[str, dict[float, int]] = {PRODUCE_HISTOGRAM: {}, LOOP_LAG_HISTOGRAM: {}}
    with urllib.request.urlopen(url + "/metrics", timeout=10) as response:
        for line in response.read().decode().splitlines():
            for prefix, buckets in out.items():
                if line.startswith(prefix):
                    le, _, value = line[len(prefix):].partition('"} ')
                    buckets[float(le.replace("+Inf", "inf"))] = int(float(value))
    return out


def _rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def _progress(text: str) -> None:
    if sys.stderr.isatty():
        print(f"\r\033[2K{text}", end="", file=sys.stderr, flush=True)


# -- a worker process ----------------------------------------------------------------

async def _worker(spec: dict[str, Any]) -> int:
    from api.client import AsyncConsumer, AsyncProducer, TopicPartition

    rng = random.Random(spec["seed"])
    producers = [AsyncProducer(spec["bootstrap"], acks=1, linger_ms=0,
                               client_id=f"bench-clients-{spec['seed']}-p{i}")
                 for i in range(spec["producers"])]
    consumers = [AsyncConsumer(spec["bootstrap"], auto_offset_reset="latest",
                               fetch_min_bytes=CONSUMER_FETCH_MIN_BYTES,
                               fetch_max_wait_ms=CONSUMER_FETCH_MAX_WAIT_MS,
                               client_id=f"bench-clients-{spec['seed']}-c{i}")
                 for i in range(spec["consumers"])]
    for i, consumer in enumerate(consumers):
        consumer.assign([TopicPartition(spec["topic"],
                                        (spec["first_consumer"] + i) % spec["partitions"])])
    latencies: list[float] = []
    failed = 0
    consumed = 0
    try:
        # Connected: every producer has had an answer, every consumer a poll.
        await asyncio.gather(*(await_ack(p, spec["topic"]) for p in producers),
                             *(c.poll(timeout_ms=0) for c in consumers))
        print("ready", flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
        loop = asyncio.get_running_loop()
        end = loop.time() + spec["seconds"]
        interval = 1 / spec["rate_per_producer"]

        async def produce(producer: AsyncProducer) -> None:
            nonlocal failed
            pending = []
            next_at = loop.time() + rng.random() * interval
            partition = rng.randrange(spec["partitions"])
            while next_at < end:
                await asyncio.sleep(max(0.0, next_at - loop.time()))
                started = time.perf_counter()
                # Round robin: every partition (and so every consumer) gets its share.
                partition = (partition + 1) % spec["partitions"]
                handle = await producer.send(spec["topic"], RECORD_VALUE, partition=partition)
                pending.append(asyncio.ensure_future(timed(handle, started)))
                next_at += interval
            for outcome in await asyncio.gather(*pending, return_exceptions=True):
                if isinstance(outcome, float):
                    latencies.append(outcome)
                else:
                    failed += 1

        async def consume(consumer: AsyncConsumer) -> None:
            nonlocal consumed
            while loop.time() < end:
                records = await consumer.poll(timeout_ms=500)
                consumed += len(records)  # after the await: no update lost

        await asyncio.gather(*(produce(p) for p in producers),
                             *(consume(c) for c in consumers))
    finally:
        await asyncio.gather(*(p.close() for p in producers), *(c.close() for c in consumers),
                             return_exceptions=True)
    print(json.dumps({"latencies_ms": latencies, "failed": failed, "consumed": consumed}),
          flush=True)
    return 0


async def await_ack(producer, topic: str) -> None:
    await (await producer.send(topic, RECORD_VALUE))


async def timed(handle, started: float) -> float:
    await handle
    return (time.perf_counter() - started) * 1000
