"""``kraftlog bench controller``: the control plane measured on real processes.

Three figures, each on a fresh cluster of ``kraftlog node`` processes on
loopback (chaos/cluster.py), next to references measured in the same run:

1. Controller failover: kill -9 the active controller and time until
   another one is active, and until a topic creation succeeds through it.
   Repeated ``--failovers`` times; the killed controller is restarted and
   caught up before the next kill. Then, ``--pauses`` times, a follower
   controller is paused (SIGSTOP) for five election timeouts and resumed:
   for four election timeouts after SIGCONT, whether the term changed (an
   election: none should, with pre-vote) and the longest time no controller
   was active (what an election costs the clients of the control plane).
2. Broker failure to new leader: a topic with replication factor 3, kill -9
   the broker leading its partition 0, and time until every partition it
   led has a new leader. Bounded below by the session timeout (the lease
   must lapse), so the figure is given next to it.
3. Metadata writes: topic creations per second, one client at a time and
   ``--clients`` at once, with latency percentiles.
4. Metadata writes while the disk is flooded: for ``--disk-flood``
   seconds another process writes large files to the disk the cluster
   lives on (fsynced, removed, again), as brokers flushing their logs do,
   while one client creates a topic every 50 ms. Whether the leadership
   moved (an election: a leader's Raft thread held up by a slow disk past
   the election timeout looks dead to its followers), the creations'
   latency, and the longest each controller's Raft thread went without
   reading its sockets (``busy_max_ms`` of ``/v1/quorum``).

References: the raw fsync rate of the disk the metadata log lives on (each
committed metadata write waits for the leader's and a follower's fsync, so it
is a ceiling for sequential writes), and, with ``--nats-python``, the same
failover and creation measurements of a 3-node NATS JetStream cluster
(bench/peer_nats.py: meta-leader failover and stream creations).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

import aiohttp
import msgpack

from chaos.cluster import FAST_SETTINGS, ProcessCluster, http_json, wait_until

CREATE_PATH = "/v1/controller/topics/create"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--failovers", type=int, default=10,
                        help="controller kills to time (default %(default)s)")
    parser.add_argument("--pauses", type=int, default=5,
                        help="follower controller pauses of five election timeouts each "
                             "(default %(default)s)")
    parser.add_argument("--broker-failovers", type=int, default=5,
                        help="broker kills to time (default %(default)s)")
    parser.add_argument("--creations", type=int, default=500,
                        help="topics to create for the write rate (default %(default)s)")
    parser.add_argument("--clients", type=int, default=8,
                        help="concurrent clients for the second write-rate run")
    parser.add_argument("--existing-topics", type=int, default=0, metavar="N",
                        help="create N topics (1 partition, RF 3) before the write-rate runs, "
                             "untimed, to measure creations on a cluster that already holds "
                             "many (default %(default)s)")
    parser.add_argument("--disk-flood", type=float, default=20, metavar="SECONDS",
                        help="seconds of topic creations while another process floods the "
                             "cluster's disk with writes; 0 skips it (default %(default)s)")
    parser.add_argument("--session-timeout-ms", type=int, default=3000,
                        help="broker.session.timeout.ms of the bench cluster")
    parser.add_argument("--election-timeout-ms", type=int, default=500,
                        help="controller.quorum.election.timeout.ms of the bench cluster")
    parser.add_argument("--dir", default=None,
                        help="work directory (default: a temporary one, removed after)")
    parser.add_argument("--nats-python", default=None, metavar="PYTHON",
                        help="a python with nats-py (e.g. /tmp/peers-venv/bin/python) to "
                             "measure NATS JetStream alongside; see ../shared/peers/run.sh")
    parser.add_argument("--raft-secret", choices=("on", "off"), default="on",
                        help="authenticate and encrypt the controllers' Raft traffic with a "
                             "shared secret, as every multi-controller cluster should "
                             "(default on; off measures what it costs)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")


def run(args: argparse.Namespace) -> int:
    for name in ("failovers", "broker_failovers", "creations", "clients"):
        if getattr(args, name) < 1:
            print(f"--{name.replace('_', '-')} must be at least 1", file=sys.stderr)
            return 2
    for name in ("existing_topics", "pauses", "disk_flood"):
        if getattr(args, name) < 0:
            print(f"--{name.replace('_', '-')} must be 0 or more", file=sys.stderr)
            return 2
    settings = dict(FAST_SETTINGS)
    settings["broker.session.timeout.ms"] = args.session_timeout_ms
    settings["broker.heartbeat.interval.ms"] = max(1, args.session_timeout_ms // 6)
    settings["controller.quorum.election.timeout.ms"] = args.election_timeout_ms
    settings["controller.quorum.fetch.timeout.ms"] = max(2000, 2 * args.election_timeout_ms)
    with tempfile.TemporaryDirectory(prefix="kraftlog-bench-", dir=args.dir) as work:
        results: dict[str, Any] = {"settings": {k: settings[k] for k in sorted(settings)
                                                if k.startswith(("broker.", "controller."))}}
        results["fsync"] = measure_fsync(work)
        secret = args.raft_secret == "on"
        results["raft_secret"] = secret
        results["controller_failover"] = controller_failover(work, settings, args.failovers,
                                                             secret, args.pauses)
        results["broker_failover"] = broker_failover(work, settings, args.broker_failovers,
                                                     secret)
        results["topic_creations"] = topic_creations(work, settings, args.creations,
                                                     args.clients, secret, args.existing_topics)
        results["existing_topics"] = args.existing_topics
        if args.disk_flood:
            results["disk_flood"] = disk_flood(work, settings, args.disk_flood, secret)
    if args.nats_python:
        results["nats"] = run_nats_reference(args.nats_python, args.creations, args.failovers)
    if args.json:
        print(json.dumps(results, indent=2))
    else:
        print(format_report(results))
    return 0


def progress(message: str) -> None:
    print(f"\r\x1b[2K{message}", end="", file=sys.stderr, flush=True)


def summary_ms(values_s: list[float]) -> dict[str, float]:
    ms = sorted(v * 1000 for v in values_s)
    return {"p50_ms": round(statistics.median(ms), 1),
            "p99_ms": round(ms[min(len(ms) - 1, int(len(ms) * 0.99))], 1),
            "max_ms": round(ms[-1], 1), "min_ms": round(ms[0], 1), "count": len(ms)}


# -- references -----------------------------------------------------------

def measure_fsync(work: str, count: int = 200) -> dict[str, float]:
    """Sequential 4 KiB write + fsync, as the metadata journal does per entry."""
    path = os.path.join(work, "fsync-probe")
    block = os.urandom(4096)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        started = time.perf_counter()
        for _ in range(count):
            os.write(fd, block)
            os.fsync(fd)
        elapsed = time.perf_counter() - started
    finally:
        os.close(fd)
        os.unlink(path)
    return {"fsyncs_per_s": round(count / elapsed, 1), "fsync_ms": round(elapsed / count * 1000, 3)}


def run_nats_reference(python: str, creations: int, failovers: int) -> dict | None:
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "peer_nats.py")
    progress("nats reference: running bench/peer_nats.py ...")
    try:
        out = subprocess.run([python, script, "--creations", str(creations), "--failovers",
                              str(failovers), "--json"], capture_output=True, text=True,
                             timeout=900, check=True).stdout
        return json.loads(out[out.index("{"):])
    except (subprocess.SubprocessError, ValueError, OSError) as exc:
        print(f"\nnats reference failed: {exc}", file=sys.stderr)
        return None


# -- 1. controller failover -------------------------------------------------

def try_create(cluster: ProcessCluster, name: str, timeout_s: float = 0.5) -> bool:
    """One attempt on every live controller; True once a creation succeeded."""
    for node_id in cluster.controller_ids:
        node = cluster.nodes[node_id]
        if not node.running:
            continue
        try:
            status, body = http_json(node.controller_url + CREATE_PATH, {"topics": [
                {"name": name, "num_partitions": 1, "replication_factor": 1}]},
                timeout_s=timeout_s)
        except OSError:
            continue
        if status == 200:
            error = body["topics"][0]["error"]
            if error is None or error["code"] == "TOPIC_ALREADY_EXISTS":
                return True
    return False


def wait_for_full_quorum(cluster: ProcessCluster, timeout_s: float = 20) -> None:
    def whole() -> bool:
        active = cluster.active_controller()
        status = active and cluster.quorum(active)
        return bool(status) and all(v["connected"] and v["lag"] == 0
                                    for v in status["voters"])
    wait_until(whole, timeout_s, "every controller connected and caught up")


def controller_failover(work: str, settings: dict, rounds: int, raft_secret: bool = True,
                        pauses: int = 0) -> dict:
    durations_active, durations_created = [], []
    paused_s = 5 * settings["controller.quorum.election.timeout.ms"] / 1000
    elections, stretches_without_active = 0, []
    with ProcessCluster(os.path.join(work, "controllers"), controllers=3, brokers=1,
                        settings=settings, raft_secret=raft_secret) as cluster:
        cluster.start()
        cluster.wait_for_brokers_running(timeout_s=30)
        for i in range(rounds):
            wait_for_full_quorum(cluster)
            old = cluster.wait_for_active_controller()
            cluster.kill(old)
            killed = time.monotonic()
            wait_until(lambda: cluster.active_controller() not in (None, old), 30,
                       "a new active controller", interval_s=0.01)
            durations_active.append(time.monotonic() - killed)
            wait_until(lambda: try_create(cluster, f"failover-{i}"), 30,
                       "a topic creation after failover", interval_s=0.01)
            durations_created.append(time.monotonic() - killed)
            progress(f"controller failover {i + 1}/{rounds}: active after "
                     f"{durations_active[-1] * 1000:.0f} ms, topic created after "
                     f"{durations_created[-1] * 1000:.0f} ms")
            cluster.start([old])
        for i in range(pauses):
            wait_for_full_quorum(cluster)
            active = cluster.wait_for_active_controller()
            term = cluster.quorum(active)["term"]
            follower = next(c for c in cluster.controller_ids if c != active)
            cluster.pause(follower)
            time.sleep(paused_s)
            cluster.resume(follower)
            window_end = time.monotonic() + 4 * paused_s / 5
            without = longest = 0.0
            last = time.monotonic()
            while (now := time.monotonic()) < window_end:
                without = 0.0 if cluster.active_controller() is not None else \
                    without + (now - last)
                longest = max(longest, without)
                last = now
                time.sleep(0.01)
            stretches_without_active.append(longest)
            now_term = cluster.quorum(cluster.wait_for_active_controller())["term"]
            elections += now_term != term
            progress(f"follower pause {i + 1}/{pauses}: {paused_s:.1f} s, "
                     f"{'an election' if now_term != term else 'no election'}, "
                     f"{longest * 1000:.0f} ms without an active controller")
    progress("")
    result = {"to_active": summary_ms(durations_active),
              "to_topic_created": summary_ms(durations_created)}
    if pauses:
        result["follower_pauses"] = {"paused_s": paused_s, "count": pauses,
                                     "elections": elections,
                                     "without_active": summary_ms(stretches_without_active)}
    return result


# -- 2. broker failure to new leader ---------------------------------------

def broker_failover(work: str, settings: dict, rounds: int, raft_secret: bool = True
                    ) -> dict:
    durations = []
    with ProcessCluster(os.path.join(work, "brokers"), controllers=3, brokers=3,
                        settings=settings, raft_secret=raft_secret) as cluster:
        cluster.start()
        cluster.wait_for_brokers_running(timeout_s=30)
        for i in range(rounds):
            topic = f"leaders-{i}"
            status, body = cluster.controller_call(CREATE_PATH, {"topics": [
                {"name": topic, "num_partitions": 6, "replication_factor": 3}]})
            assert status == 200 and body["topics"][0]["error"] is None, body
            active = cluster.wait_for_active_controller()

            def partitions() -> dict[int, dict]:
                (t,) = [t for t in cluster.metadata(active)["topics"] if t["name"] == topic]
                return {p["partition"]: p for p in t["partitions"]}

            before = partitions()
            victim = before[0]["leader"]
            led = [p for p, reg in before.items() if reg["leader"] == victim]
            cluster.kill(victim)
            killed = time.monotonic()
            wait_until(lambda: all(partitions()[p]["leader"] not in (victim, -1) for p in led),
                       60, "new leaders", interval_s=0.01)
            durations.append(time.monotonic() - killed)
            progress(f"broker failover {i + 1}/{rounds}: {len(led)} leaderships moved after "
                     f"{durations[-1] * 1000:.0f} ms")
            cluster.start([victim])
            cluster.wait_for_brokers_running(timeout_s=60)
    progress("")
    return {"session_timeout_ms": settings["broker.session.timeout.ms"],
            "to_new_leaders": summary_ms(durations)}


# -- 3. metadata writes ----------------------------------------------------

async def _create_many(url: str, names: list[str], clients: int) -> list[float]:
    latencies: list[float] = []
    queue = list(reversed(names))
    async with aiohttp.ClientSession() as session:
        async def client() -> None:
            while queue:
                name = queue.pop()
                body = msgpack.packb({"topics": [{"name": name, "num_partitions": 1,
                                                  "replication_factor": 3}]})
                started = time.perf_counter()
                async with session.post(url, data=body, headers={
                        "Content-Type": "application/msgpack",
                        "Accept": "application/msgpack"}) as response:
                    answer = msgpack.unpackb(await response.read())
                latencies.append(time.perf_counter() - started)
                if response.status != 200 or answer["topics"][0]["error"] is not None:
                    raise RuntimeError(f"creating {name} failed: {answer}")
        await asyncio.gather(*(client() for _ in range(clients)))
    return latencies


def topic_creations(work: str, settings: dict, count: int, clients: int,
                    raft_secret: bool = True, existing: int = 0) -> dict:
    """Creations per second, one client at a time and ``clients`` at once,
    on a cluster already holding ``existing`` topics (made first, untimed)."""
    results = {}
    with ProcessCluster(os.path.join(work, "writes"), controllers=3, brokers=3,
                        settings=settings, raft_secret=raft_secret) as cluster:
        cluster.start()
        cluster.wait_for_brokers_running(timeout_s=30)
        active = cluster.wait_for_active_controller()
        url = cluster.nodes[active].controller_url + CREATE_PATH
        if existing:
            progress(f"creating {existing} existing topics (untimed) ...")
            asyncio.run(_create_many(url, [f"existing-{i}" for i in range(existing)],
                                     clients))
        for label, n_clients in (("sequential", 1), ("concurrent", clients)):
            progress(f"topic creations: {count} with {n_clients} client(s) ...")
            names = [f"{label}-{i}" for i in range(count)]
            cpu_before = cluster.cpu_seconds()
            started = time.perf_counter()
            latencies = asyncio.run(_create_many(url, names, n_clients))
            elapsed = time.perf_counter() - started
            results[label] = {"clients": n_clients, "creations_per_s": round(count / elapsed, 1),
                              **summary_ms(latencies),
                              **_cpu_per_creation(cluster, active, cpu_before, count)}
        results["topics_at_end"] = len(cluster.metadata(active)["topics"])
    progress("")
    return results


def _cpu_per_creation(cluster: ProcessCluster, active: int, before: dict[int, float] | None,
                      count: int) -> dict:
    """CPU ms per creation (from /proc) of the active controller, of the
    other controllers (their mean) and of the brokers (their mean)."""
    after = cluster.cpu_seconds()
    if before is None or after is None:
        return {}

    def mean_ms(node_ids: list[int]) -> float:
        spent = [after[n] - before[n] for n in node_ids if n in before and n in after]
        return round(sum(spent) / len(spent) / count * 1000, 3) if spent else 0.0

    return {"cpu_ms_per_creation": {
        "active controller": mean_ms([active]),
        "other controllers": mean_ms([n for n in cluster.nodes
                                      if n != active and n not in cluster.broker_ids]),
        "each broker": mean_ms(list(cluster.broker_ids))}}


# -- 4. metadata writes on a flooded disk ---------------------------------

#: The flood: files of FLOOD_FILE_MB written 4 MiB at a time, fsynced and
#: removed, one after another, until the deadline (argv: dir, seconds).
FLOOD_FILE_MB = 1024
_FLOOD = """
import os, sys, time
where, deadline = sys.argv[1], time.monotonic() + float(sys.argv[2])
block = b"\\0" * (4 << 20)
n = 0
while time.monotonic() < deadline:
    path = os.path.join(where, f"flood-{n}")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        for _ in range(int(sys.argv[3]) // 4):
            if time.monotonic() >= deadline:
                break
            os.write(fd, block)
        os.fsync(fd)
    finally:
        os.close(fd)
        os.unlink(path)
    n += 1
"""


def disk_flood(work: str, settings: dict, seconds: float, raft_secret: bool = True) -> dict:
    latencies, failed = [], 0
    with ProcessCluster(os.path.join(work, "flood"), controllers=3, brokers=1,
                        settings=settings, raft_secret=raft_secret) as cluster:
        cluster.start()
        cluster.wait_for_brokers_running(timeout_s=30)
        wait_for_full_quorum(cluster)
        term = cluster.quorum(cluster.wait_for_active_controller())["term"]
        flood_dir = os.path.join(work, "flood-files")
        os.makedirs(flood_dir, exist_ok=True)
        flood = subprocess.Popen([sys.executable, "-c", _FLOOD, flood_dir, str(seconds),
                                  str(FLOOD_FILE_MB)])
        try:
            deadline = time.monotonic() + seconds
            i = 0
            while time.monotonic() < deadline:
                started = time.monotonic()
                created = try_create(cluster, f"flood-{i}", timeout_s=10)
                if created:
                    latencies.append(time.monotonic() - started)
                else:
                    failed += 1
                i += 1
                progress(f"disk flood: {i} creations, {failed} failed")
                time.sleep(0.05)
        finally:
            try:  # it stops by itself at the same deadline, removing its file
                flood.wait(timeout=30)
            except subprocess.TimeoutExpired:
                flood.kill()
                flood.wait()
            for leftover in os.listdir(flood_dir):  # killed, or failed half way
                os.unlink(os.path.join(flood_dir, leftover))
        statuses = {c: cluster.quorum(c) for c in cluster.controller_ids}
        active = cluster.wait_for_active_controller()
        terms = cluster.quorum(active)["term"] - term
    progress("")
    return {"seconds": seconds, "file_mb": FLOOD_FILE_MB, "elections": terms, "failed": failed,
            "creations": summary_ms(latencies) if latencies else None,
            "busy_max_ms": {c: (s or {}).get("busy_max_ms") for c, s in statuses.items()}}


# -- report ----------------------------------------------------------------

def format_report(r: dict) -> str:
    cf, bf, tc, fs = (r["controller_failover"], r["broker_failover"], r["topic_creations"],
                      r["fsync"])
    lines = [
        "kraftlog control plane (3 controllers; brokers: 1 for failover, 3 otherwise)",
        f"  settings: {r['settings']}; Raft secret: {'on' if r['raft_secret'] else 'off'}",
        "",
        f"{'measure':44} {'p50':>9} {'max':>9} {'n':>4}",
        f"{'controller kill -9 -> new active':44} {cf['to_active']['p50_ms']:>7.0f}ms "
        f"{cf['to_active']['max_ms']:>7.0f}ms {cf['to_active']['count']:>4}",
        f"{'controller kill -9 -> topic created':44} {cf['to_topic_created']['p50_ms']:>7.0f}ms "
        f"{cf['to_topic_created']['max_ms']:>7.0f}ms {cf['to_topic_created']['count']:>4}",
        f"{'broker kill -9 -> new partition leaders':44} "
        f"{bf['to_new_leaders']['p50_ms']:>7.0f}ms {bf['to_new_leaders']['max_ms']:>7.0f}ms "
        f"{bf['to_new_leaders']['count']:>4}   (session timeout {bf['session_timeout_ms']} ms)",
    ]
    pauses = cf.get("follower_pauses")
    if pauses:
        back = pauses["without_active"]
        lines += [
            f"{'follower paused: no active controller':44} {back['p50_ms']:>7.0f}ms "
            f"{back['max_ms']:>7.0f}ms {back['count']:>4}   (paused "
            f"{pauses['paused_s']:.1f} s; elections caused: {pauses['elections']} of "
            f"{pauses['count']})"]
    lines += [
        "",
        f"{'topic creations (1 partition, RF 3)':44} {'per s':>9} {'p50':>9} {'p99':>9}",
    ]
    if r.get("existing_topics"):
        lines.insert(-1, f"on a cluster already holding {r['existing_topics']} topics:")
    runs = {label: v for label, v in tc.items() if isinstance(v, dict)}
    for label, v in runs.items():
        lines.append(f"{'  ' + label + ' (' + str(v['clients']) + ' clients)':44} "
                     f"{v['creations_per_s']:>9.0f} {v['p50_ms']:>7.1f}ms {v['p99_ms']:>7.1f}ms")
    for label, v in runs.items():
        if v.get("cpu_ms_per_creation"):
            lines.append(f"  CPU per creation, {label}: " + ", ".join(
                f"{who} {ms:.2f} ms" for who, ms in v["cpu_ms_per_creation"].items()))
    flood = r.get("disk_flood")
    if flood:
        made = flood["creations"] or {}
        lines += [
            "",
            f"disk flooded for {flood['seconds']:g} s (another process writing "
            f"{flood.get('file_mb', FLOOD_FILE_MB)} MiB files and fsyncing them):",
            f"  topic creations: {made.get('count', 0)} (p50 {made.get('p50_ms', 0):.0f} ms, "
            f"p99 {made.get('p99_ms', 0):.0f} ms, max {made.get('max_ms', 0):.0f} ms), "
            f"{flood['failed']} failed; elections: {flood['elections']}",
            "  longest a Raft thread went without reading its sockets: " + ", ".join(
                f"controller {c} {ms:.0f} ms" for c, ms in flood["busy_max_ms"].items()
                if ms is not None)]
    lines += ["", f"reference: raw 4 KiB write+fsync {fs['fsyncs_per_s']:.0f}/s "
                  f"({fs['fsync_ms']:.2f} ms each); sequential creations are "
                  f"{tc['sequential']['creations_per_s'] / fs['fsyncs_per_s']:.2f}x that rate"]
    nats = r.get("nats")
    if nats:
        lines += [
            f"reference: NATS JetStream {nats.get('version', '')} (3 nodes): meta-leader "
            f"failover p50 {nats['failover_p50_ms']:.0f} ms, max {nats['failover_max_ms']:.0f} ms;"
            f" {nats['creations_per_s']:.0f} stream creations/s (R=3)",
            f"  ratios kraftlog/NATS: failover p50 "
            f"{cf['to_topic_created']['p50_ms'] / nats['failover_p50_ms']:.2f}x (lower is "
            f"better), creations/s "
            f"{tc['sequential']['creations_per_s'] / nats['creations_per_s']:.2f}x "
            "(higher is better)",
        ]
    return "\n".join(lines)
