"""Reference control-plane figures for a peer system: NATS JetStream, 3 nodes.

What it measures, on this machine, on loopback:

* **Stream creations/s** -- N streams (default 200) created one after another,
  each replicated (``num_replicas=3``), file storage, one subject, through
  nats-py's ``JetStreamContext.add_stream``; creations/s and p50/p99 latency.
  Creating a stream is a proposal to JetStream's *meta* Raft group (the
  cluster-wide metadata log) followed by the start of the stream's own Raft
  group, which is what creating a topic is for kraftlog's controller quorum:
  this is the analogue of our "topic creations/s".

* **Meta-leader failover** -- K times (default 10): find the JetStream meta
  leader (``/jsz`` monitoring endpoint, ``meta_cluster.leader``), ``kill -9``
  it, and time until a client connected to the two survivors gets a stream
  creation acknowledged. The post-failover stream has ``num_replicas=1`` (an
  R=3 stream cannot be placed with one of three servers down; R=1 needs only
  the new meta leader and a quorum of 2/3 to commit the assignment, so it
  times the metadata layer and nothing else), and is pinned by a server tag
  to a survivor: in kraftlog's figure the killed process is a controller and
  the new topic goes to a live broker, while every NATS server is both, and
  NATS v2.9 does not learn for a long time (>40 s seen here) that a
  kill -9'd server is gone, so unpinned it may keep placing the stream on the
  dead server (``--placement any`` shows that). Attempts are launched every
  ~20 ms, each under a new name with its own short timeout, and the first
  acknowledgement stops the clock, so the resolution is ~20 ms. The time
  until a survivor's ``/jsz`` names a new meta leader is recorded alongside.
  Then the killed server is restarted with the same config and store, and
  the next round starts only once the cluster is whole again (every server's
  ``/healthz`` ok, both followers current in the meta group). This is the
  analogue of our "controller failover: kill -9 the active controller until
  a topic creation succeeds".

NATS' Raft timings are compiled-in defaults (server/raft.go: election timeout
randomised in 4-9 s, heartbeat 1 s); no server option changes them, so the
failover figure is dominated by that window. It is the figure a user of an
out-of-the-box NATS cluster gets, which is what our ratio is against.

Run it with the peers' venv (nats-py lives there; kraftlog never imports it):

    /tmp/peers-venv/bin/python bench/peer_nats.py [--creations N] [--failovers K] [--json]

Needs ``nats-server`` on PATH (Debian: ``apt-get install -y nats-server``) and
``python3 -m venv /tmp/peers-venv && /tmp/peers-venv/bin/pip install nats-py``.
Every server process and the temp dir are removed on exit, errors and Ctrl-C
included; every wait has a deadline.
"""

from __future__ import annotations

import argparse
import asyncio
import atexit
import ctypes
import json
import math
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

import nats
import nats.js.errors
from nats.js.api import Placement, StorageType

SERVERS = ("n1", "n2", "n3")
CLUSTER_NAME = "kraftlog-peer"
ATTEMPT_EVERY_S = 0.020  # failover probe: launch a creation attempt this often
ATTEMPT_TIMEOUT_S = 1.0  # ... each waiting at most this long for its reply
MAX_IN_FLIGHT = 50  # ... with at most this many outstanding
POST_REPLICAS = 1  # the stream created after a kill (R=3 cannot be placed with a server down)
FAILOVER_DEADLINE_S = 60.0  # give up on one failover after this
READY_DEADLINE_S = 60.0  # cluster start / whole again after a restart
CREATE_TIMEOUT_S = 10.0  # one stream creation in the creations phase


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def free_ports(n: int) -> list[int]:
    """n distinct free loopback TCP ports (bound together, then released)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def percentile(sorted_vals: list[float], q: float) -> float:
    """Nearest-rank percentile of an ascending list."""
    if not sorted_vals:
        return float("nan")
    k = max(0, min(len(sorted_vals) - 1, math.ceil(q * len(sorted_vals)) - 1))
    return sorted_vals[k]


def server_version() -> str:
    out = subprocess.run(["nats-server", "--version"], capture_output=True, text=True, timeout=10)
    text = (out.stdout or out.stderr).strip()
    return text.split()[-1] if text else "unknown"


def _die_with_parent() -> None:
    """In the child before exec: get SIGKILL if this script dies (Linux)."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except Exception:
        pass


class Cluster:
    """Three nats-server processes with JetStream, on free loopback ports."""

    def __init__(self) -> None:
        self.dir = tempfile.mkdtemp(prefix="peer-nats.")
        ports = free_ports(3 * len(SERVERS))
        self.client_port = dict(zip(SERVERS, ports[0:3]))
        self.route_port = dict(zip(SERVERS, ports[3:6]))
        self.http_port = dict(zip(SERVERS, ports[6:9]))
        self.procs: dict[str, subprocess.Popen] = {}
        routes = ", ".join(f"nats-route://127.0.0.1:{self.route_port[s]}" for s in SERVERS)
        for s in SERVERS:
            with open(self.conf(s), "w") as f:
                f.write(
                    f"server_name: {s}\n"
                    f'server_tags: ["node:{s}"]\n'
                    f"listen: 127.0.0.1:{self.client_port[s]}\n"
                    f"http: 127.0.0.1:{self.http_port[s]}\n"
                    f'jetstream {{ store_dir: "{os.path.join(self.dir, "store-" + s)}" }}\n'
                    f"cluster {{\n  name: {CLUSTER_NAME}\n"
                    f"  listen: 127.0.0.1:{self.route_port[s]}\n"
                    f"  routes: [{routes}]\n}}\n"
                )

    def conf(self, s: str) -> str:
        return os.path.join(self.dir, f"{s}.conf")

    def url(self, s: str) -> str:
        return f"nats://127.0.0.1:{self.client_port[s]}"

    def start(self, s: str) -> None:
        logf = open(os.path.join(self.dir, f"{s}.log"), "ab")
        try:
            self.procs[s] = subprocess.Popen(
                ["nats-server", "-c", self.conf(s)],
                stdout=logf,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,  # Ctrl-C reaches us, and we stop them
                preexec_fn=_die_with_parent,
            )
        finally:
            logf.close()

    def kill9(self, s: str) -> None:
        p = self.procs.pop(s)
        p.send_signal(signal.SIGKILL)
        p.wait(timeout=10)

    def alive(self) -> list[str]:
        return [s for s in SERVERS if s in self.procs and self.procs[s].poll() is None]

    def stop(self, keep_dir: bool = False) -> None:
        """Stop every server this script started, then remove the temp dir."""
        for s, p in list(self.procs.items()):
            if p.poll() is None:
                p.send_signal(signal.SIGKILL)
        for s, p in list(self.procs.items()):
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                log(f"warning: nats-server {s} (pid {p.pid}) did not exit")
        self.procs.clear()
        if keep_dir:
            log(f"kept {self.dir}")
        else:
            shutil.rmtree(self.dir, ignore_errors=True)

    def tail_logs(self, lines: int = 15) -> str:
        out = []
        for s in SERVERS:
            try:
                with open(os.path.join(self.dir, f"{s}.log"), errors="replace") as f:
                    out.append(f"--- {s}.log (tail) ---\n" + "".join(f.readlines()[-lines:]))
            except OSError:
                pass
        return "\n".join(out)

    # --- monitoring endpoint -------------------------------------------------

    def http(self, s: str, path: str, timeout: float = 0.5) -> tuple[int, dict]:
        """(status, JSON body) of GET on s's monitoring port; (0, {}) if unreachable."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.http_port[s]}{path}", timeout=timeout) as r:
                return r.status, json.loads(r.read() or b"{}")
        except urllib.error.HTTPError as e:
            try:
                return e.code, json.loads(e.read() or b"{}")
            except ValueError:
                return e.code, {}
        except (OSError, ValueError):
            return 0, {}

    def meta(self, s: str) -> dict:
        return self.http(s, "/jsz")[1].get("meta_cluster") or {}

    def meta_leader(self) -> str | None:
        """The meta leader's server name, as a live server reports it."""
        for s in self.alive():
            leader = self.meta(s).get("leader")
            if leader:
                return leader
        return None

    def whole(self) -> bool:
        """All three up and healthy, agree on one meta leader, which sees both peers current."""
        if len(self.alive()) != len(SERVERS):
            return False
        leaders = {self.meta(s).get("leader") for s in SERVERS}
        if len(leaders) != 1 or None in leaders or "" in leaders:
            return False
        (leader,) = leaders
        if leader not in SERVERS:
            return False
        peers = {r.get("name"): r for r in (self.meta(leader).get("replicas") or [])}
        for s in SERVERS:
            if s == leader:
                continue
            r = peers.get(s)
            if not r or not r.get("current") or r.get("offline"):
                return False
        return all(self.http(s, "/healthz")[0] == 200 for s in SERVERS)

    def wait_whole(self, what: str, deadline_s: float = READY_DEADLINE_S) -> float:
        t0 = time.monotonic()
        deadline = t0 + deadline_s
        while time.monotonic() < deadline:
            for s in SERVERS:
                p = self.procs.get(s)
                if p is not None and p.poll() is not None:
                    raise RuntimeError(f"nats-server {s} exited ({p.returncode}) while waiting for {what}")
            if self.whole():
                return time.monotonic() - t0
            time.sleep(0.05)
        raise TimeoutError(f"cluster not whole within {deadline_s:.0f}s ({what})")


def _quiet_callbacks() -> dict:
    async def _noop(*_a) -> None:
        return None

    return {"error_cb": _noop, "disconnected_cb": _noop, "reconnected_cb": _noop, "closed_cb": _noop}


async def connect(urls: list[str]) -> nats.NATS:
    return await nats.connect(
        servers=urls,
        connect_timeout=2,
        allow_reconnect=True,
        reconnect_time_wait=0.05,
        max_reconnect_attempts=200,
        **_quiet_callbacks(),
    )


async def create_until_ok(js, name: str, subject: str, replicas: int, deadline_s: float) -> None:
    """Retry one stream creation until acknowledged (bounded)."""
    deadline = time.monotonic() + deadline_s
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            await js.add_stream(name=name, subjects=[subject], num_replicas=replicas, storage=StorageType.FILE)
            return
        except Exception as e:  # noqa: BLE001 - any failure is retried until the deadline
            last = e
            await asyncio.sleep(0.1)
    raise TimeoutError(f"creating stream {name} (R={replicas}) did not succeed within {deadline_s:.0f}s: {last!r}")


async def bench_creations(cluster: Cluster, n: int, keep: bool) -> dict:
    nc = await connect([cluster.url(s) for s in SERVERS])
    try:
        js = nc.jetstream(timeout=CREATE_TIMEOUT_S)
        # One creation that may retry while JetStream settles; not timed.
        await create_until_ok(js, "warmup", "warmup.x", 3, READY_DEADLINE_S)
        await js.delete_stream("warmup")
        lat: list[float] = []
        t_start = time.perf_counter()
        for i in range(n):
            t0 = time.perf_counter()
            await js.add_stream(name=f"ctl{i}", subjects=[f"ctl.{i}"], num_replicas=3, storage=StorageType.FILE)
            lat.append(time.perf_counter() - t0)
        elapsed = time.perf_counter() - t_start
        if not keep:
            for i in range(n):
                await js.delete_stream(f"ctl{i}")
    finally:
        await nc.close()
    lat.sort()
    return {
        "creations_per_s": n / elapsed,
        "creation_p50_ms": percentile(lat, 0.50) * 1e3,
        "creation_p99_ms": percentile(lat, 0.99) * 1e3,
        "creations_elapsed_s": elapsed,
    }


async def probe_until_created(js, prefix: str, replicas: int, placement: Placement | None
                              ) -> tuple[float, list[str]]:
    """Launch a creation attempt every ATTEMPT_EVERY_S until one is acknowledged.

    Returns the monotonic time of the first acknowledgement and the names tried.
    Each attempt has its own stream name: right after a kill -9 the new meta
    leader does not know yet that the dead server is gone and may place an R=1
    stream on it; that creation is committed but never answered, and a retry
    under the same name would only repeat that stuck assignment. A fresh name
    gets a fresh placement, as a client that retries with a new stream would.
    """
    deadline = time.monotonic() + FAILOVER_DEADLINE_S
    pending: set[asyncio.Task] = set()
    names: list[str] = []
    ok_at: float | None = None
    last_err: BaseException | None = None

    async def attempt(name: str) -> float:
        await js.add_stream(name=name, subjects=[f"{name}.x"], num_replicas=replicas,
                            storage=StorageType.FILE, placement=placement)
        return time.monotonic()

    try:
        while ok_at is None and time.monotonic() < deadline:
            if len(pending) < MAX_IN_FLIGHT:
                names.append(f"{prefix}_{len(names)}")
                pending.add(asyncio.create_task(attempt(names[-1])))
            done, _ = await asyncio.wait(pending, timeout=ATTEMPT_EVERY_S, return_when=asyncio.FIRST_COMPLETED)
            for t in done:
                pending.discard(t)
                if t.exception() is None:
                    ok_at = t.result() if ok_at is None else min(ok_at, t.result())
                else:
                    last_err = t.exception()
            # When attempts fail fast, pace them to ~ATTEMPT_EVERY_S anyway.
            if done and ok_at is None:
                await asyncio.sleep(ATTEMPT_EVERY_S)
    finally:
        for t in pending:
            t.cancel()
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)
    if ok_at is None:
        raise TimeoutError(f"no stream creation succeeded within {FAILOVER_DEADLINE_S:.0f}s after kill: {last_err!r}")
    return ok_at, names


async def watch_leader(cluster: Cluster, survivors: list[str]) -> float | None:
    """Monotonic time at which a survivor's /jsz first names a surviving meta leader."""
    deadline = time.monotonic() + FAILOVER_DEADLINE_S
    while time.monotonic() < deadline:
        for s in survivors:
            if (await asyncio.to_thread(cluster.meta, s)).get("leader") in survivors:
                return time.monotonic()
        await asyncio.sleep(ATTEMPT_EVERY_S)
    return None


async def delete_quietly(js, names: list[str]) -> int:
    """Delete those of names that exist; returns how many were deleted."""
    deleted = 0
    for name in names:
        try:
            if await js.delete_stream(name):
                deleted += 1
        except nats.js.errors.NotFoundError:
            pass
        except Exception as e:  # noqa: BLE001 - cosmetic; the stream only stays in the metadata
            log(f"  (could not delete {name}: {e!r})")
    return deleted


async def bench_failovers(cluster: Cluster, k: int, replicas: int, pin: bool) -> list[dict]:
    rounds = []
    for i in range(k):
        leader = None
        deadline = time.monotonic() + READY_DEADLINE_S
        while leader is None and time.monotonic() < deadline:
            leader = await asyncio.to_thread(cluster.meta_leader)
            if leader is None:
                await asyncio.sleep(0.05)
        if leader not in SERVERS:
            raise RuntimeError(f"no meta leader found before failover {i + 1} (got {leader!r})")
        survivors = [s for s in SERVERS if s != leader]
        nc = await connect([cluster.url(s) for s in survivors])
        try:
            js = nc.jetstream(timeout=ATTEMPT_TIMEOUT_S)
            # Pinned: on a surviving server by tag, as kraftlog's controller
            # places a new topic on a live broker (see the module docstring).
            placement = Placement(tags=[f"node:{survivors[0]}"]) if pin else None
            t_kill = time.monotonic()
            cluster.kill9(leader)
            watcher = asyncio.create_task(watch_leader(cluster, survivors))
            try:
                ok_at, names = await probe_until_created(js, f"after{i}", replicas, placement)
            finally:
                if not watcher.done():
                    # The client can succeed before /jsz shows the leader: poll a little longer.
                    try:
                        await asyncio.wait_for(asyncio.shield(watcher), 2)
                    except asyncio.TimeoutError:
                        pass
                    watcher.cancel()
            ms = (ok_at - t_kill) * 1e3
            elected_at = None if watcher.cancelled() else watcher.result()
            leader_ms = None if elected_at is None else (elected_at - t_kill) * 1e3
            new_leader = await asyncio.to_thread(cluster.meta_leader)
            cluster.start(leader)
            whole_s = await asyncio.to_thread(cluster.wait_whole, f"restart of {leader} after failover {i + 1}")
            # Leave the metadata as it was for the next round (this includes any
            # attempt that was placed on the killed server and came up on restart).
            deleted = await delete_quietly(nc.jetstream(timeout=5), names)
        finally:
            await nc.close()
        await asyncio.to_thread(cluster.wait_whole, f"clean-up after failover {i + 1}")
        rounds.append({"killed": leader, "new_leader": new_leader, "failover_ms": ms, "leader_ms": leader_ms,
                       "rejoin_s": whole_s,
                       "attempts": len(names), "created": deleted})
        shown = "?" if leader_ms is None else f"{leader_ms:.0f}"
        log(f"  failover {i + 1}/{k}: killed {leader}, new leader {new_leader} in /jsz after {shown} ms, "
            f"creation ok after {ms:.0f} ms "
            f"({len(names)} attempts, {deleted} streams to clean up); {leader} back and current in {whole_s:.1f}s")
    return rounds


async def run(args: argparse.Namespace, cluster: Cluster) -> dict:
    version = server_version()
    for s in SERVERS:
        cluster.start(s)
    t_ready = await asyncio.to_thread(cluster.wait_whole, "initial start")
    log(f"nats-server {version}: 3-node JetStream cluster ready in {t_ready:.1f}s (dir {cluster.dir})")

    log(f"creating {args.creations} R=3 file streams, one at a time...")
    cre = await bench_creations(cluster, args.creations, args.keep_streams)
    log(f"  {cre['creations_per_s']:.1f} creations/s, p50 {cre['creation_p50_ms']:.1f} ms, "
        f"p99 {cre['creation_p99_ms']:.1f} ms")
    if not args.keep_streams:
        await asyncio.to_thread(cluster.wait_whole, "after deleting the benchmark streams")

    log(f"meta-leader failover x{args.failovers} (kill -9, then R={POST_REPLICAS} creation)...")
    rounds = await bench_failovers(cluster, args.failovers, POST_REPLICAS, args.placement == "survivor")
    fo = [r["failover_ms"] for r in rounds]
    el = [r["leader_ms"] for r in rounds if r["leader_ms"] is not None]

    settings = (
        "3 nats-server nodes on loopback, one machine, default server options (Raft election timeout "
        "4-9 s and 1 s heartbeat are compiled-in); JetStream file storage; "
        f"creations: {args.creations} sequential add_stream, num_replicas=3, 1 subject each, "
        "one nats-py client connected to all 3; "
        f"failover: kill -9 of the meta leader (from /jsz meta_cluster.leader), clock stops at the first "
        f"acknowledged add_stream with num_replicas={POST_REPLICAS} from a client connected to the "
        f"2 survivors, "
        + ("placed on a survivor by server tag, " if args.placement == "survivor" else "placement left to NATS, ")
        + f"attempts (each a new stream name) launched every {ATTEMPT_EVERY_S * 1e3:.0f} ms with "
        f"{ATTEMPT_TIMEOUT_S:.1f} s timeout each; killed node restarted with same config/store and cluster whole (all /healthz ok, "
        "meta peers current) before the next round; "
        + ("benchmark streams kept during failovers" if args.keep_streams
           else "benchmark streams deleted before the failovers")
    )
    return {
        "system": "nats-jetstream",
        "version": version,
        "creations": args.creations,
        "creations_per_s": round(cre["creations_per_s"], 2),
        "creation_p50_ms": round(cre["creation_p50_ms"], 2),
        "creation_p99_ms": round(cre["creation_p99_ms"], 2),
        "failovers": args.failovers,
        "failover_ms": [round(x, 1) for x in fo],
        "failover_p50_ms": round(statistics.median(fo), 1) if fo else None,
        "failover_max_ms": round(max(fo), 1) if fo else None,
        "leader_elected_ms": [round(x, 1) for x in el],
        "leader_elected_p50_ms": round(statistics.median(el), 1) if el else None,
        "settings": settings,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--creations", type=int, default=200, help="streams to create (default 200)")
    ap.add_argument("--failovers", type=int, default=10, help="meta-leader kills (default 10)")
    ap.add_argument("--placement", choices=("survivor", "any"), default="survivor",
                    help="post-failover R=1 stream: pinned to a surviving server by tag (default), or "
                         "left to NATS, which in v2.9 may keep choosing the dead server (diagnostic)")
    ap.add_argument("--keep-streams", action="store_true",
                    help="keep the N benchmark streams during the failovers (default: delete them)")
    ap.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    ap.add_argument("--keep-dir", action="store_true",
                    help="debugging: leave the temp dir (configs, logs, stores) behind")
    args = ap.parse_args()
    if args.creations < 1 or args.failovers < 0:
        ap.error("--creations must be >= 1 and --failovers >= 0")
    if shutil.which("nats-server") is None:
        log("nats-server not found on PATH (apt-get install -y nats-server)")
        return 2

    cluster = Cluster()
    atexit.register(cluster.stop, args.keep_dir)  # backstop; the finally below is the normal path

    def _on_term(signum, _frame):
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, _on_term)
    signal.signal(signal.SIGHUP, _on_term)
    try:
        result = asyncio.run(run(args, cluster))
    except KeyboardInterrupt:
        log("interrupted")
        return 130
    except Exception as e:
        log(f"error: {e!r}")
        log(cluster.tail_logs())
        return 1
    finally:
        cluster.stop(args.keep_dir)

    if args.json:
        print(json.dumps(result))
    else:
        print(f"NATS JetStream {result['version']}, 3 nodes, loopback")
        print(f"  stream creations (R=3, file): {result['creations_per_s']:.1f}/s  "
              f"p50 {result['creation_p50_ms']:.1f} ms  p99 {result['creation_p99_ms']:.1f} ms  "
              f"(n={result['creations']})")
        if result["failover_ms"]:
            print(f"  meta-leader failover (kill -9 -> R={POST_REPLICAS} stream created): "
                  f"p50 {result['failover_p50_ms']:.0f} ms  max {result['failover_max_ms']:.0f} ms  "
                  f"(k={result['failovers']}: {', '.join(f'{x:.0f}' for x in result['failover_ms'])})")
        if result["leader_elected_ms"]:
            print(f"  ... of which a new meta leader shown in /jsz: p50 {result['leader_elected_p50_ms']:.0f} ms")
        print(f"  settings: {result['settings']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
