"""``kraftlog bench scale``: how kraftlog's costs grow with the number of
partitions (issue 25).

One fresh cluster of real processes on loopback (chaos/cluster.py): a
dedicated controller and three brokers on the shipped defaults. Every
figure is taken twice in the same run, first with one topic of 12
partitions (the reference) and then with ``--partitions`` more (10,000 by
default, over topics of 1 to 1,000 partitions, replication factor 3, so
every broker holds a replica of each), and the report gives the ratio:

- **creation**: the admin calls for the whole layout (at most 1,000
  partitions each, the next once every broker holds the replicas of the
  last: ``/healthz`` ``partitions``), their time and the whole; against the
  same number of directories and files made by one plain process (the
  disk's reference: file creation is most of a new replica's cost);
- **metadata**: a change (a one-partition topic created at the active
  controller) from its commit to every broker's image (``/healthz``
  ``metadata_offset``), p50/p99 over ``--probes`` changes;
- **produce / consume**: the same ``--records`` records of 100 B spread
  evenly over the partitions (``Producer.send_batch``, one call per
  partition, acks=all), then read back by one consumer assigned them all,
  right away (the target's figure: the read shares the brokers with the
  background flush of what was just written); then the seconds from the
  end of the produce until every broker reports every log fsynced
  (``kraftlog_log_unflushed_logs`` 0), and the same read again after it;
- **tail**: one consumer assigned every partition at its end, long-polling
  (``fetch_max_wait_ms`` 500) for ``TAIL_S`` with nothing produced: the
  bytes of each fetch request after the first, and the brokers' CPU above
  what they use idle (``/proc``), in percent of a core (fetch sessions:
  flat, not O(partitions) per fetch); and that idle use itself, the
  brokers at rest once the load is read and flushed (checkpoints and
  timers over every partition they hold; the flush itself has a row of
  its own);
- **garbage collection**: the brokers' full collections during the
  produce and consume load (``kraftlog_gc_full_collection_seconds``): how
  many, their mean, and the bucket bound of the longest;
- **memory**: each broker's resident set (``/proc``), and its growth per
  partition replica once they are created and again after the load;
- **restart**: a broker stopped cleanly (SIGTERM) and started again: until
  it serves (``/healthz`` running) and until it is back in every ISR; and
  the same after kill -9 (recovery reads only what was not flushed);
- **failover**: leaderships moved back to the preferred replicas (the
  restarts took the restarted broker's), then kill -9 of the broker that
  leads the most partitions (about a third), until every partition it led
  has acknowledged an acks=all write from its new leader.

Targets (issue 25): metadata p99 <= 1 s; throughput over the many >= 0.7x
of the 12; clean restart <= 10 s; failover of 3,000 leaderships <= 5 s.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import sys
import tempfile
import time
import urllib.error
import urllib.request
from typing import Any

import msgpack

from api.table import format_table
from bench.failover import live_urls
from chaos.cluster import ProcessCluster, http_json, process_cpu_seconds, wait_until
from storage.batch import BatchBuilder

BROKERS = 3
REPLICATION_FACTOR = 3
REFERENCE_PARTITIONS = 12
REFERENCE_TOPIC = "scale-12"
#: The layout's topics: (partitions each, share of the total in such topics);
#: what is left over goes to one-partition topics.
LAYOUT_SHARES = ((1000, 0.5), (300, 0.3), (100, 0.1), (30, 0.06), (10, 0.03), (3, 0.009))
#: Partitions per create_topics call while building the layout.
CREATE_CALL_PARTITIONS = 1000
RECORD_VALUE = b"s" * 100
#: Targets (issue 25).
TARGET_METADATA_P99_MS = 1000
TARGET_THROUGHPUT_RATIO = 0.7
TARGET_CLEAN_RESTART_S = 10.0
TARGET_FAILOVER_S = 5.0
#: Bounds of the waits (seconds).
CREATE_WAIT_S = 600.0
RESTART_WAIT_S = 300.0
FAILOVER_WAIT_S = 120.0
FLUSH_WAIT_S = 180.0
#: How often the brokers' unflushed logs are read while waiting (seconds).
FLUSH_POLL_S = 1.0
UNFLUSHED_METRIC = "kraftlog_log_unflushed_logs"
PROBE_WAIT_S = 30.0
PRODUCE_TIMEOUT_MS = 2000
#: Seconds the idle tail (and the brokers' idle reference) is measured.
TAIL_S = 5.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--partitions", type=int, default=10_000,
                        help="partitions of the big layout (default %(default)s), over "
                             "topics of 1 to 1,000 partitions, replication factor 3")
    parser.add_argument("--records", type=int, default=1_000_000,
                        help="records of 100 B produced and consumed at each size "
                             "(default %(default)s)")
    parser.add_argument("--probes", type=int, default=30,
                        help="metadata changes timed at each size (default %(default)s)")
    parser.add_argument("--dir", default=None,
                        help="work directory (default: a temporary one, removed after)")
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")


def run(args: argparse.Namespace) -> int:
    if args.partitions < REFERENCE_PARTITIONS or args.records < 1 or args.probes < 1:
        print(f"--partitions must be at least {REFERENCE_PARTITIONS}, --records and --probes "
              "at least 1", file=sys.stderr)
        return 2
    layout = layout_topics(args.partitions)
    with tempfile.TemporaryDirectory(prefix="kraftlog-bench-", dir=args.dir) as work:
        with ProcessCluster(work, controllers=1, brokers=BROKERS, settings={}) as cluster:
            status(f"starting 1 controller + {BROKERS} brokers (shipped defaults) in {work} ...")
            cluster.start()
            cluster.wait_for_brokers_running(timeout_s=60)
            idle_rss = broker_rss(cluster)
            small = {REFERENCE_TOPIC: REFERENCE_PARTITIONS}
            reference = measure(cluster, "12", small, {}, args, idle_rss)
            big = measure(cluster, f"{args.partitions:,}", layout, small, args, idle_rss)
    summary = summarize(reference, big, layout, args)
    if args.json:
        print(json.dumps({"bench": "scale", **summary}, indent=2))
    else:
        print(format_report(summary))
    return 0


def status(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def layout_topics(total: int) -> dict[str, int]:
    """Topic name -> partitions, summing to ``total``: half in topics of
    1,000, then smaller ones, the rest in one-partition topics."""
    topics: dict[str, int] = {}
    left = total
    for size, share in LAYOUT_SHARES:
        for i in range(int(total * share) // size):
            if size <= left:
                topics[f"scale-{size}-{i}"] = size
                left -= size
    for i in range(left):
        topics[f"scale-1-{i}"] = 1
    return topics


# -- one size ---------------------------------------------------------------------
def measure(cluster: ProcessCluster, label: str, topics: dict[str, int],
            existing: dict[str, int], args: argparse.Namespace, idle_rss: dict[int, int]
            ) -> dict[str, Any]:
    """Every figure with ``topics`` created (on top of ``existing``)."""
    partitions = sum(topics.values())
    status(f"[{label}] creating {len(topics):,} topics, {partitions:,} partitions ...")
    figures: dict[str, Any] = {"partitions": partitions, "topics": len(topics)}
    figures.update(create_layout(cluster, topics, sum(existing.values())))
    figures["raw_create_s"] = raw_creation(cluster.base_dir, partitions * REPLICATION_FACTOR)
    held = partitions + sum(existing.values())
    rss = broker_rss(cluster)
    figures["rss_created_bytes"] = rss
    figures["rss_created_per_replica"] = {b: (rss[b] - idle_rss[b]) / held for b in rss}
    figures["metadata_ms"] = metadata_propagation(cluster, label, args.probes)
    figures["metadata_answer_ms"] = metadata_answers(cluster, args.probes)
    status(f"[{label}] metadata p99 {percentile(figures['metadata_ms'], 99):,.0f} ms; "
           f"producing {args.records:,} records ...")
    gc_before = gc_pauses(cluster)
    figures["produce_rps"] = produce_spread(cluster, topics, args.records)
    produced_at = time.monotonic()
    status(f"[{label}] produce {figures['produce_rps']:,.0f} records/s; consuming ...")
    figures["consume_rps"] = consume_all(cluster, topics, args.records)
    figures["gc"] = gc_during(gc_before, gc_pauses(cluster))
    status(f"[{label}] consume {figures['consume_rps']:,.0f} records/s; waiting for every "
           "log to be fsynced ...")
    # The same read again once the brokers' background flush of the load is
    # done: the read alone, not the read sharing the brokers with the flush.
    figures["flushed_s"] = wait_flushed(cluster, produced_at)
    figures["consume_flushed_rps"] = (consume_all(cluster, topics, args.records)
                                      if figures["flushed_s"] is not None else None)
    status(f"[{label}] every log fsynced "
           + (f"{figures['flushed_s']:.1f} s after the produce; consume then "
              f"{figures['consume_flushed_rps']:,.0f} records/s"
              if figures["flushed_s"] is not None else f"NOT within {FLUSH_WAIT_S:.0f} s")
           + "; tailing ...")
    figures["tail"] = tail_cost(cluster, {**existing, **topics})
    status(f"[{label}] tail: {figures['tail']['request_bytes']:,.0f} B per fetch, brokers "
           f"+{figures['tail']['broker_cpu_pct']:.1f}% of a core")
    rss = broker_rss(cluster)
    figures["rss_bytes"] = rss
    figures["rss_growth_per_replica"] = {b: (rss[b] - idle_rss[b]) / held for b in rss}
    every = {**existing, **topics}
    victim = cluster.broker_ids[-1]
    figures["clean_restart"] = restart(cluster, victim, signal.SIGTERM, every, label)
    figures["crash_restart"] = restart(cluster, victim, signal.SIGKILL, every, label)
    figures["failover"] = failover(cluster, every, label)
    return figures


def elect_preferred(cluster: ProcessCluster, topics: dict[str, int]) -> None:
    """Leaderships back to their preferred replicas (a restarted broker got
    none back), as Kafka's automatic rebalance would in time: so each broker
    leads about a third of the partitions again."""
    from api.client import Admin

    with Admin(live_urls(cluster), request_timeout_ms=120_000) as admin:
        admin.elect_leaders()

    def balanced() -> bool:
        state = partition_states(cluster, topics)
        return all(p["leader"] == p["replicas"][0] for p in state.values())
    wait_until(balanced, RESTART_WAIT_S, "every partition led by its preferred replica",
               interval_s=0.2)


def create_layout(cluster: ProcessCluster, topics: dict[str, int], existing: int
                  ) -> dict[str, float]:
    from api.client import Admin, NewTopic

    urls = live_urls(cluster)
    started = time.monotonic()
    calls: list[list[NewTopic]] = [[]]
    in_call = 0
    for name, count in topics.items():
        if in_call + count > CREATE_CALL_PARTITIONS and calls[-1]:
            calls.append([])
            in_call = 0
        calls[-1].append(NewTopic(name, count, REPLICATION_FACTOR))
        in_call += count
    held = existing  # RF 3 on 3 brokers: every broker holds a replica of each
    answered_s = 0.0
    with Admin(urls, request_timeout_ms=120_000) as admin:
        for call in calls:
            call_started = time.monotonic()
            admin.create_topics(call)
            answered_s += time.monotonic() - call_started
            # The next call once the brokers hold this one's replicas, as a
            # careful operator would: on this machine a broker making
            # thousands of files at once falls behind its followers' fetches.
            held += sum(t.num_partitions for t in call)
            wait_until(lambda: all((cluster.broker_health(b) or {}).get("partitions", 0)
                                   >= held for b in cluster.broker_ids),
                       CREATE_WAIT_S, f"every broker holding its {held:,} replicas",
                       interval_s=0.1)
    return {"create_answered_s": answered_s, "create_held_s": time.monotonic() - started}


def raw_creation(base_dir: str, replicas: int) -> float:
    """The reference for creation: what the brokers' file system work costs
    on this disk without kraftlog, one process making a directory and two
    files (the segment and the topic id) per replica, as the brokers do."""
    scratch = tempfile.mkdtemp(prefix="raw-create-", dir=base_dir)
    started = time.monotonic()
    for i in range(replicas):
        directory = os.path.join(scratch, f"p-{i}")
        os.mkdir(directory)
        for name in ("00000000000000000000.log", "partition.metadata"):
            os.close(os.open(os.path.join(directory, name), os.O_WRONLY | os.O_CREAT, 0o644))
    elapsed = time.monotonic() - started
    shutil.rmtree(scratch, ignore_errors=True)
    return elapsed


def metadata_propagation(cluster: ProcessCluster, label: str, probes: int) -> list[float]:
    """Commit -> every broker's image, per change, in ms."""
    times = []
    for i in range(probes):
        name = f"scale-probe-{label.replace(',', '')}-{i}"
        code, answer = cluster.controller_call("/v1/controller/topics/create", {"topics": [
            {"name": name, "num_partitions": 1, "replication_factor": REPLICATION_FACTOR,
             "configs": {}}]})
        committed_s = time.monotonic()
        assert code == 200 and not answer["topics"][0].get("error"), answer
        offset = answer["metadata_offset"]
        wait_until(lambda: all((cluster.broker_health(b) or {}).get("metadata_offset", -1)
                               >= offset for b in cluster.broker_ids),
                   PROBE_WAIT_S, f"metadata offset {offset} on every broker", interval_s=0.002)
        times.append((time.monotonic() - committed_s) * 1000)
    return times


def metadata_answers(cluster: ProcessCluster, probes: int) -> list[float]:
    """A client's metadata request for every topic (msgpack, as the client
    asks), answered by one broker, per request, in ms."""
    url = live_urls(cluster)[0] + "/v1/metadata"
    body = msgpack.packb({"topics": None}, use_bin_type=True)
    times = []
    for _ in range(probes):
        request = urllib.request.Request(url, data=body, headers={
            "Content-Type": "application/msgpack", "Accept": "application/msgpack"})
        started = time.monotonic()
        with urllib.request.urlopen(request, timeout=30) as response:
            answer = msgpack.unpackb(response.read(), raw=False)
        times.append((time.monotonic() - started) * 1000)
        assert answer.get("topics"), answer
    return times


def produce_spread(cluster: ProcessCluster, topics: dict[str, int], records: int) -> float:
    from api.client import Producer

    partitions = [(t, p) for t, count in topics.items() for p in range(count)]
    each, extra = divmod(records, len(partitions))
    values = [RECORD_VALUE] * (each + 1)
    with Producer(live_urls(cluster), acks="all", linger_ms=5,
                  delivery_timeout_ms=300_000) as producer:
        for topic in topics:  # metadata first: not timed
            producer.partitions_for(topic)
        started = time.monotonic()
        for i, (topic, p) in enumerate(partitions):
            n = each + (1 if i < extra else 0)
            if n:
                producer.send_batch(topic, values[:n], partition=p)
        producer.flush(timeout_ms=300_000)
        return records / (time.monotonic() - started)


def consume_all(cluster: ProcessCluster, topics: dict[str, int], records: int) -> float:
    from api.client import Consumer, TopicPartition

    tps = [TopicPartition(t, p) for t, count in topics.items() for p in range(count)]
    with Consumer(live_urls(cluster), auto_offset_reset="earliest") as consumer:
        consumer.assign(tps)
        started = time.monotonic()
        deadline = started + 600
        read = 0
        while read < records:
            if time.monotonic() > deadline:
                raise RuntimeError(f"read {read:,} of {records:,} records in 600 s")
            read += len(consumer.poll(timeout_ms=1000, max_records=100_000))
        return records / (time.monotonic() - started)


def unflushed(cluster: ProcessCluster) -> list[int]:
    """Each live broker's logs holding data not fsynced yet (-1: not told)."""
    counts = []
    for url in live_urls(cluster):
        with urllib.request.urlopen(url + "/metrics", timeout=10) as response:
            text = response.read().decode()
        values = [line.rsplit(" ", 1)[1] for line in text.splitlines()
                  if line.startswith(UNFLUSHED_METRIC + " ")]
        counts.append(int(float(values[0])) if values else -1)
    return counts


def wait_flushed(cluster: ProcessCluster, since: float,
                 timeout_s: float = FLUSH_WAIT_S) -> float | None:
    """Seconds from ``since`` (monotonic) until every broker reports every
    log fsynced; None if not within ``timeout_s`` of now."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if all(count == 0 for count in unflushed(cluster)):
            return time.monotonic() - since
        time.sleep(FLUSH_POLL_S)
    return None


def gc_pauses(cluster: ProcessCluster) -> list[dict[str, float]]:
    """Each live broker's ``kraftlog_gc_full_collection_seconds``: its
    cumulative buckets by bound (and "sum", "count")."""
    readings = []
    for url in live_urls(cluster):
        with urllib.request.urlopen(url + "/metrics", timeout=10) as response:
            text = response.read().decode()
        reading: dict[str, float] = {}
        for line in text.splitlines():
            if not line.startswith("kraftlog_gc_full_collection_seconds"):
                continue
            name, value = line.rsplit(" ", 1)
            if "_bucket" in name:
                reading[name.split('le="', 1)[1].rstrip('"}')] = float(value)
            else:
                reading[name.rsplit("_", 1)[1]] = float(value)
        readings.append(reading)
    return readings


def gc_during(before: list[dict[str, float]], after: list[dict[str, float]]
              ) -> dict[str, float]:
    """The brokers' full collections between two readings: how many, their
    mean (ms) and the smallest bucket bound holding the longest (ms)."""
    count = total = 0.0
    longest = 0.0
    for old, new in zip(before, after):
        count += new.get("count", 0) - old.get("count", 0)
        total += new.get("sum", 0) - old.get("sum", 0)
        bounds = sorted((float(b), b) for b in new if b not in ("sum", "count"))
        grown = [bound for bound, key in bounds
                 if new[key] - old.get(key, 0) == new.get("count", 0) - old.get("count", 0)]
        if new.get("count", 0) > old.get("count", 0) and grown:
            longest = max(longest, grown[0])
    return {"count": count, "mean_ms": total / count * 1000 if count else 0.0,
            "longest_ms_at_most": longest * 1000}


def brokers_cpu_s(cluster: ProcessCluster) -> float:
    """The brokers' CPU time so far (user + system, from /proc)."""
    return sum(process_cpu_seconds(cluster.nodes[broker].process.pid)
               for broker in cluster.broker_ids)


def tail_cost(cluster: ProcessCluster, topics: dict[str, int]) -> dict[str, float]:
    """A consumer of every partition waiting at their ends: its fetch
    requests' mean size after the first, and the brokers' CPU above idle."""
    from api.client import Consumer, TopicPartition
    from protocol import wire

    started = brokers_cpu_s(cluster)
    time.sleep(TAIL_S)
    idle = (brokers_cpu_s(cluster) - started) / TAIL_S
    tps = [TopicPartition(t, p) for t, count in topics.items() for p in range(count)]
    sizes: list[int] = []
    with Consumer(live_urls(cluster), auto_offset_reset="latest",
                  fetch_max_wait_ms=500) as consumer:
        fetcher = consumer._consumer._fetch
        transport = fetcher.transport
        request = transport.request

        async def measured(url: str, path: str, body: Any = None, **kwargs: Any) -> Any:
            if path == "/v1/fetch":
                packed = wire.msgpack_body(body, False)
                sizes.append(len(packed) if isinstance(packed, bytes) else -1)
            return await request(url, path, body, **kwargs)

        fetcher.transport = type("Measured", (), {"request": staticmethod(measured)})()
        consumer.assign(tps)
        deadline = time.monotonic() + 60
        while len(sizes) < len(cluster.broker_ids) and time.monotonic() < deadline:
            consumer.poll(timeout_ms=200)  # the opening fetches, to every leader
        opened = len(sizes)
        started, begun = brokers_cpu_s(cluster), time.monotonic()
        while time.monotonic() - begun < TAIL_S:
            consumer.poll(timeout_ms=500)
        busy = (brokers_cpu_s(cluster) - started) / (time.monotonic() - begun)
    later = [size for size in sizes[opened:] if size >= 0] or [0]
    return {"request_bytes": statistics.mean(later),
            "broker_cpu_pct": max(0.0, busy - idle) * 100, "idle_cpu_pct": idle * 100}


# -- restart and failover ----------------------------------------------------------
def restart(cluster: ProcessCluster, victim: int, sig: int, topics: dict[str, int],
            label: str) -> dict[str, float]:
    how = "clean stop (SIGTERM)" if sig == signal.SIGTERM else "kill -9"
    status(f"[{label}] {how} of broker {victim}, then start it ...")
    stop_started = time.monotonic()
    cluster.kill(victim, sig, timeout_s=RESTART_WAIT_S)
    stopped_s = time.monotonic() - stop_started
    started = time.monotonic()
    cluster.start([victim])
    wait_until(lambda: (cluster.broker_health(victim) or {}).get("state") == "running",
               RESTART_WAIT_S, f"broker {victim} running", interval_s=0.05)
    serving_s = time.monotonic() - started
    wait_for_full_isr(cluster, topics, RESTART_WAIT_S)
    in_isr_s = time.monotonic() - started
    # Watched again before the next step's kill (untimed): a broker killed
    # before the controller holds its presence stream is noticed only when
    # its session lapses, which is not what the next figure measures.
    cluster.wait_for_brokers_running([victim], RESTART_WAIT_S)
    status(f"[{label}] broker {victim}: serving after {serving_s:.1f} s, in every ISR after "
           f"{in_isr_s:.1f} s")
    return {"stop_s": stopped_s, "serving_s": serving_s, "in_isr_s": in_isr_s}


def failover(cluster: ProcessCluster, topics: dict[str, int], label: str) -> dict[str, Any]:
    elect_preferred(cluster, topics)
    state = partition_states(cluster, topics)
    led: dict[int, list[tuple[str, int]]] = {}
    for tp, p in state.items():
        led.setdefault(p["leader"], []).append(tp)
    victim = max(led, key=lambda b: len(led[b]))
    pending = set(led[victim])
    status(f"[{label}] kill -9 of broker {victim}, leader of {len(pending):,} partitions ...")
    killed = time.monotonic()
    cluster.kill(victim)
    writable_at: list[float] = []
    rounds = 0
    while pending:
        if time.monotonic() - killed > FAILOVER_WAIT_S:
            raise RuntimeError(f"{len(pending):,} partitions not writable "
                               f"{FAILOVER_WAIT_S:.0f} s after the kill")
        rounds += 1
        for tp in probe_writes(cluster, pending, victim):
            pending.discard(tp)
            writable_at.append(time.monotonic() - killed)
    window = max(writable_at)
    status(f"[{label}] every one of the {len(writable_at):,} partitions writable after "
           f"{window:.2f} s")
    cluster.start([victim])
    cluster.wait_for_brokers_running([victim], timeout_s=RESTART_WAIT_S)
    wait_for_full_isr(cluster, topics, RESTART_WAIT_S)
    return {"broker": victim, "leaderships": len(writable_at), "all_writable_s": window,
            "half_writable_s": statistics.median(writable_at), "rounds": rounds}


def probe_writes(cluster: ProcessCluster, pending: set[tuple[str, int]], victim: int
                 ) -> list[tuple[str, int]]:
    """One acks=all record to each pending partition, at the leader the
    metadata names (one request per leader); the partitions acknowledged."""
    topics = sorted({t for t, _ in pending})
    body = metadata(cluster, topics)
    if body is None:
        time.sleep(0.01)
        return []
    urls = {b["id"]: b["url"] for b in body["brokers"]}
    by_leader: dict[int, list[dict]] = {}
    batch = BatchBuilder()
    batch.append(None, RECORD_VALUE)
    records = batch.build()
    for topic in body["topics"]:
        for p in topic.get("partitions") or ():
            tp = (topic["name"], p["partition"])
            if tp in pending and p["leader"] != victim and p["leader"] in urls:
                by_leader.setdefault(p["leader"], []).append(
                    {"topic": tp[0], "partition": tp[1],
                     "current_leader_epoch": p["leader_epoch"], "records": records})
    done = []
    for leader, parts in by_leader.items():
        request = urllib.request.Request(
            urls[leader] + "/v1/produce",
            data=msgpack.packb({"acks": -1, "timeout_ms": PRODUCE_TIMEOUT_MS,
                                "partitions": parts}, use_bin_type=True),
            headers={"Content-Type": "application/msgpack", "Accept": "application/msgpack"})
        try:
            with urllib.request.urlopen(request, timeout=PRODUCE_TIMEOUT_MS / 1000 + 5) as r:
                answer = msgpack.unpackb(r.read(), raw=False)
        except (OSError, ValueError, urllib.error.HTTPError):
            continue
        done += [(r["topic"], r["partition"]) for r in answer.get("partitions") or ()
                 if r.get("error") is None]
    if not done:
        time.sleep(0.01)
    return done


# -- the cluster ------------------------------------------------------------------
def metadata(cluster: ProcessCluster, topics: list[str] | None = None) -> dict | None:
    """The clients' view (GET /v1/metadata) from the first live broker that answers."""
    query = "" if topics is None else "?topics=" + ",".join(topics)
    for url in live_urls(cluster):
        try:
            code, body = http_json(f"{url}/v1/metadata{query}", timeout_s=30.0)
        except (OSError, ValueError):
            continue
        if code == 200:
            return body
    return None


def partition_states(cluster: ProcessCluster, topics: dict[str, int]
                     ) -> dict[tuple[str, int], dict]:
    body = metadata(cluster) or {"topics": []}
    return {(t["name"], p["partition"]): p for t in body["topics"] if t["name"] in topics
            for p in t.get("partitions") or ()}


def wait_for_full_isr(cluster: ProcessCluster, topics: dict[str, int], timeout_s: float
                      ) -> None:
    want = sum(topics.values())

    def full() -> bool:
        state = partition_states(cluster, topics)
        return len(state) == want and all(len(p["isr"]) == REPLICATION_FACTOR
                                          for p in state.values())
    wait_until(full, timeout_s, f"every one of {want:,} partitions' ISR full", interval_s=0.2)


def broker_rss(cluster: ProcessCluster) -> dict[int, int]:
    """Each running broker's resident set, in bytes."""
    sizes = {}
    for b in cluster.broker_ids:
        node = cluster.nodes[b]
        if not node.running:
            continue
        with open(f"/proc/{node.process.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    sizes[b] = int(line.split()[1]) * 1024
    return sizes


# -- the report -------------------------------------------------------------------
def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q / 100 * len(ordered)))]


def summarize(reference: dict, big: dict, layout: dict[str, int],
              args: argparse.Namespace) -> dict[str, Any]:
    def sizes(figures: dict) -> dict[str, Any]:
        rss = figures["rss_bytes"]
        growth = figures["rss_growth_per_replica"]
        return {
            "partitions": figures["partitions"], "topics": figures["topics"],
            "create_answered_s": round(figures["create_answered_s"], 2),
            "create_held_s": round(figures["create_held_s"], 2),
            "raw_create_s": round(figures["raw_create_s"], 2),
            "metadata_ms_p50": round(statistics.median(figures["metadata_ms"]), 1),
            "metadata_ms_p99": round(percentile(figures["metadata_ms"], 99), 1),
            "metadata_answer_ms_p50": round(statistics.median(figures["metadata_answer_ms"]), 1),
            "produce_rps": round(figures["produce_rps"]),
            "consume_rps": round(figures["consume_rps"]),
            "flushed_s": (round(figures["flushed_s"], 1) if figures["flushed_s"] is not None
                          else None),
            "consume_flushed_rps": (round(figures["consume_flushed_rps"])
                                    if figures["consume_flushed_rps"] is not None else None),
            "gc_full_collections": round(figures["gc"]["count"]),
            "gc_full_mean_ms": round(figures["gc"]["mean_ms"], 1),
            "gc_full_longest_ms_at_most": figures["gc"]["longest_ms_at_most"],
            "tail_request_bytes": round(figures["tail"]["request_bytes"]),
            "tail_broker_cpu_pct": round(figures["tail"]["broker_cpu_pct"], 1),
            "at_rest_broker_cpu_pct": round(figures["tail"]["idle_cpu_pct"], 1),
            "broker_rss_mib": round(statistics.mean(rss.values()) / 2**20, 1),
            "created_kib_per_replica": round(
                statistics.mean(figures["rss_created_per_replica"].values()) / 1024, 2),
            "rss_growth_kib_per_replica": round(statistics.mean(growth.values()) / 1024, 2),
            "clean_restart": {k: round(v, 2) for k, v in figures["clean_restart"].items()},
            "crash_restart": {k: round(v, 2) for k, v in figures["crash_restart"].items()},
            "failover": {k: round(v, 2) if isinstance(v, float) else v
                         for k, v in figures["failover"].items()},
        }
    small, many = sizes(reference), sizes(big)
    targets = {
        "metadata_p99": many["metadata_ms_p99"] <= TARGET_METADATA_P99_MS,
        "produce_ratio": many["produce_rps"] / small["produce_rps"] >= TARGET_THROUGHPUT_RATIO,
        "consume_ratio": many["consume_rps"] / small["consume_rps"] >= TARGET_THROUGHPUT_RATIO,
        "clean_restart": many["clean_restart"]["serving_s"] <= TARGET_CLEAN_RESTART_S,
        "failover": many["failover"]["all_writable_s"] <= TARGET_FAILOVER_S,
    }
    return {"brokers": BROKERS, "replication_factor": REPLICATION_FACTOR,
            "records": args.records, "probes": args.probes,
            "layout_topic_sizes": sorted(set(layout.values()), reverse=True),
            "reference": small, "many": many, "targets_met": targets}


def format_report(summary: dict) -> str:
    small, many = summary["reference"], summary["many"]

    def row(what: str, a: float, b: float, fmt: str, target: str = "") -> tuple:
        ratio = f"{b / a:.2f}" if a else "-"
        return (what, format(a, fmt), format(b, fmt), ratio, target)

    def optional_row(what: str, a: float | None, b: float | None, fmt: str,
                     missing: str) -> tuple:
        if a is None or b is None:
            return (what, missing if a is None else format(a, fmt),
                    missing if b is None else format(b, fmt), "-", "")
        return row(what, a, b, fmt)

    t = summary["targets_met"]

    def verdict(key: str, text: str) -> str:
        return f"{text}: {'met' if t[key] else 'NOT met'}"
    rows = [
        row("create: in admin calls (s)", small["create_answered_s"],
            many["create_answered_s"], ",.2f"),
        row("create: until every replica held (s)", small["create_held_s"], many["create_held_s"],
            ",.2f"),
        row("  raw: mkdir + 2 files per replica (s)", small["raw_create_s"],
            many["raw_create_s"], ",.2f", "the disk's reference"),
        row("metadata change to every broker p50 (ms)", small["metadata_ms_p50"],
            many["metadata_ms_p50"], ",.1f"),
        row("metadata change to every broker p99 (ms)", small["metadata_ms_p99"],
            many["metadata_ms_p99"], ",.1f", verdict("metadata_p99", "<= 1,000 ms")),
        row("metadata answer, every topic, p50 (ms)", small["metadata_answer_ms_p50"],
            many["metadata_answer_ms_p50"], ",.1f"),
        row("produce, acks=all (records/s)", small["produce_rps"], many["produce_rps"], ",.0f",
            verdict("produce_ratio", ">= 0.7x")),
        row("consume, right after the produce (records/s)", small["consume_rps"],
            many["consume_rps"], ",.0f", verdict("consume_ratio", ">= 0.7x")),
        optional_row("every log fsynced, after the produce (s)", small["flushed_s"],
                     many["flushed_s"], ",.1f", f"not within {FLUSH_WAIT_S:.0f} s"),
        optional_row("consume, every log fsynced (records/s)", small["consume_flushed_rps"],
                     many["consume_flushed_rps"], ",.0f", "-"),
        row("full GCs of the brokers during the load", small["gc_full_collections"],
            many["gc_full_collections"], ",.0f"),
        row("  their mean (ms)", small["gc_full_mean_ms"], many["gc_full_mean_ms"], ",.1f"),
        row("  the longest, at most (ms)", small["gc_full_longest_ms_at_most"],
            many["gc_full_longest_ms_at_most"], ",.0f"),
        row("tail: fetch request, idle (bytes)", small["tail_request_bytes"],
            many["tail_request_bytes"], ",.0f"),
        row("tail: brokers' CPU above idle (% of a core)", small["tail_broker_cpu_pct"],
            many["tail_broker_cpu_pct"], ",.1f"),
        row("brokers at rest after the load (% of a core, all)",
            small["at_rest_broker_cpu_pct"], many["at_rest_broker_cpu_pct"], ",.1f"),
        row("broker resident set (MiB)", small["broker_rss_mib"], many["broker_rss_mib"],
            ",.1f"),
        ("memory per partition replica, created (KiB)", "",
         f"{many['created_kib_per_replica']:,.2f}", "", "report"),
        ("memory per partition replica, after the load (KiB)", "",
         f"{many['rss_growth_kib_per_replica']:,.2f}", "", "report"),
        row("clean restart: serving (s)", small["clean_restart"]["serving_s"],
            many["clean_restart"]["serving_s"], ",.2f", verdict("clean_restart", "<= 10 s")),
        row("clean restart: in every ISR (s)", small["clean_restart"]["in_isr_s"],
            many["clean_restart"]["in_isr_s"], ",.2f"),
        row("kill -9 restart: serving (s)", small["crash_restart"]["serving_s"],
            many["crash_restart"]["serving_s"], ",.2f"),
        row("kill -9 restart: in every ISR (s)", small["crash_restart"]["in_isr_s"],
            many["crash_restart"]["in_isr_s"], ",.2f"),
        row("failover: leaderships moved", small["failover"]["leaderships"],
            many["failover"]["leaderships"], ",.0f"),
        row("failover: every one writable (s)", small["failover"]["all_writable_s"],
            many["failover"]["all_writable_s"], ",.2f", verdict("failover", "<= 5 s")),
    ]
    return "\n".join([
        "kraftlog bench scale",
        f"  cluster  1 controller + {summary['brokers']} brokers, shipped defaults; "
        f"replication factor {summary['replication_factor']}",
        f"  load     {summary['records']:,} records of 100 B per size; "
        f"{summary['probes']} metadata changes per size; layout topics of "
        + ", ".join(str(s) for s in summary["layout_topic_sizes"]) + " partitions",
        "",
        format_table(("", f"{small['partitions']:,} partitions",
                      f"{many['partitions']:,} partitions", "ratio", "target"), rows),
    ])
