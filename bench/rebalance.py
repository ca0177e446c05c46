"""``kraftlog bench rebalance``: how long a large consumer group takes to
rebalance when one member joins or leaves.

One fresh cluster of real processes (a dedicated controller and three
brokers, ``chaos/cluster.py``) on the shipped defaults, so the group
heartbeat interval is 5 s. One topic of ``--partitions`` (1,000) partitions,
replication factor 3. ``--members`` (100) ``AsyncConsumer`` members of one
group, spread over ``--processes`` (10) worker processes, each member polling
every ``POLL_MS`` (partitions change hands inside ``poll``).

Then ``--trials`` times: a new member joins (in worker ``trial %
processes``), and later leaves (``close``). Each is timed from the command to
the worker until the group is stable again:

  - every partition owned by exactly one member, as the members themselves
    see it (``assignment()``, reported by the workers);
  - the coordinator (``GET /v1/groups/{group}``) says ``stable`` with the
    expected number of members.

Issue 25's target: p99 <= 2 s. No partition may be consumed by two members
at once: every member records, with the machine's monotonic clock (shared by
all processes), when each partition was given to it and when it gave it up
(its ``on_partitions_assigned`` / ``revoked`` / ``lost`` listeners, which
``poll`` calls before it returns records of a new partition and after the
last records of a revoked one); the benchmark fails if two members' holdings
of one partition overlap.
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
import urllib.parse
from typing import Any

from api.table import format_table
from bench.clients import _read_line
from chaos.cluster import REPO_ROOT, ProcessCluster, http_json, wait_until
from chaos.local_cluster import ClusterError, parse_settings

TOPIC = "bench-rebalance"
GROUP = "bench-rebalance"
BROKERS = 3
#: How often each member polls (a poll returns at least this often).
POLL_MS = 50
#: Issue 25: a rebalance after one member joins or leaves, p99.
TARGET_P99_MS = 2000
#: Bounds of the waits.
READY_WAIT_S = 300.0
STABLE_WAIT_S = 120.0
ANSWER_WAIT_S = 60.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--members", type=int, default=100,
                        help="members of the group (default %(default)s)")
    parser.add_argument("--processes", type=int, default=10,
                        help="worker processes the members are spread over "
                             "(default %(default)s)")
    parser.add_argument("--partitions", type=int, default=1000,
                        help="partitions of the topic (default %(default)s)")
    parser.add_argument("--trials", type=int, default=10,
                        help="joins and leaves to time (default %(default)s)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="a node setting for every node, e.g. "
                             "group.consumer.heartbeat.interval.ms=1000 (repeatable)")
    parser.add_argument("--dir", default=None, help="work directory (default: a temporary one)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)


def status(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def run(args: argparse.Namespace) -> int:
    if args.worker is not None:
        return asyncio.run(_worker(json.loads(args.worker)))
    for name in ("members", "processes", "partitions", "trials"):
        if getattr(args, name) < 1:
            print(f"--{name} must be at least 1", file=sys.stderr)
            return 2
    try:
        settings = parse_settings(args.set)
    except ClusterError as exc:
        print(exc, file=sys.stderr)
        return 2
    processes = min(args.processes, args.members)
    with tempfile.TemporaryDirectory(prefix="kraftlog-bench-rebalance-", dir=args.dir) as work, \
            ProcessCluster(os.path.join(work, "cluster"), controllers=1, brokers=BROKERS,
                           settings=settings) as cluster:
        status(f"starting 1 controller + {BROKERS} brokers in {work} ...")
        cluster.start()
        cluster.wait_for_brokers_running(timeout_s=60)
        urls = [cluster.nodes[b].broker_url for b in cluster.broker_ids]
        code, body = cluster.controller_call("/v1/controller/topics/create", {"topics": [{
            "name": TOPIC, "num_partitions": args.partitions, "replication_factor": BROKERS}]},
            timeout_s=60)
        if code != 200 or body["topics"][0]["error"] is not None:
            print(f"cannot create {TOPIC}: {body}", file=sys.stderr)
            return 1
        wait_until(lambda: _leaders(urls[0]) >= args.partitions, 120,
                   f"a leader for each of {args.partitions} partitions")
        group = Group(urls, processes, args.members, args.partitions)
        try:
            status(f"{args.members} members in {processes} processes joining ...")
            started = time.monotonic()
            group.wait_stable(args.members)
            formed_ms = (time.monotonic() - started) * 1000
            status(f"group formed in {formed_ms:,.0f} ms")
            joins: list[float] = []
            leaves: list[float] = []
            for trial in range(args.trials):
                worker = trial % processes
                started = time.monotonic()
                group.ask(worker, "join")
                group.wait_stable(args.members + 1)
                joins.append((time.monotonic() - started) * 1000)
                started = time.monotonic()
                group.ask(worker, "leave")
                group.wait_stable(args.members)
                leaves.append((time.monotonic() - started) * 1000)
                status(f"trial {trial + 1}/{args.trials}: join {joins[-1]:,.0f} ms, "
                       f"leave {leaves[-1]:,.0f} ms")
            overlaps = _overlaps(group.events())
        finally:
            group.stop()
    heartbeat_ms = int(settings.get("group.consumer.heartbeat.interval.ms", 5000))
    summary = {"members": args.members, "processes": processes,
               "partitions": args.partitions, "heartbeat_interval_ms": heartbeat_ms,
               "formed_ms": round(formed_ms), "join_ms": _stats(joins),
               "leave_ms": _stats(leaves), "overlaps": overlaps,
               "target_p99_ms": TARGET_P99_MS}
    if args.json:
        print(json.dumps({"bench": "rebalance", **summary}, indent=2))
    else:
        print(_report(summary))
    for overlap in overlaps:
        print(f"overlap: {overlap}", file=sys.stderr)
    return 1 if overlaps else 0


def _leaders(url: str) -> int:
    code, body = http_json(f"{url}/v1/topics/{TOPIC}", timeout_s=30)
    if code != 200:
        return 0
    return sum(1 for p in body["partitions"] if p["leader"] >= 0)


class Group:
    """The worker processes and the questions the benchmark asks them."""

    def __init__(self, urls: list[str], processes: int, members: int, partitions: int) -> None:
        self.url = urls[0]
        self.partitions = partitions
        self.workers = []
        for i in range(processes):
            spec = {"bootstrap": urls, "topic": TOPIC, "group": GROUP, "worker": i,
                    "members": members // processes + (1 if i < members % processes else 0)}
            self.workers.append(subprocess.Popen(
                [sys.executable, "-m", "api.cli", "bench", "rebalance", "--worker",
                 json.dumps(spec)], cwd=REPO_ROOT, stdin=subprocess.PIPE,
                stdout=subprocess.PIPE, text=True))
        deadline = time.monotonic() + READY_WAIT_S
        for worker in self.workers:
            line = _read_line(worker, deadline)
            if line.strip() != "ready":
                raise RuntimeError(f"a worker did not start: {line!r}")

    def ask(self, index: int, command: str) -> Any:
        worker = self.workers[index]
        worker.stdin.write(command + "\n")
        worker.stdin.flush()
        return json.loads(_read_line(worker, time.monotonic() + ANSWER_WAIT_S))

    def wait_stable(self, members: int) -> None:
        def stable() -> bool:
            owned: list[int] = []
            count = 0
            for i in range(len(self.workers)):
                held = self.ask(i, "owned")
                count += len(held)
                for partitions in held:
                    owned.extend(partitions)
            if count != members or len(owned) != self.partitions \
                    or len(set(owned)) != self.partitions:
                return False
            code, body = http_json(f"{self.url}/v1/groups/{urllib.parse.quote(GROUP)}",
                                   timeout_s=30)
            return (code == 200 and body["state"] == "stable"
                    and len(body["members"]) == members)

        wait_until(stable, STABLE_WAIT_S, f"group {GROUP} stable with {members} members",
                   interval_s=0.01)

    def events(self) -> list[list]:
        return [event for i in range(len(self.workers)) for event in self.ask(i, "events")]

    def stop(self) -> None:
        for worker in self.workers:
            try:
                worker.stdin.write("stop\n")
                worker.stdin.flush()
            except (BrokenPipeError, OSError):
                pass
        for worker in self.workers:
            try:
                worker.wait(timeout=60)
            except subprocess.TimeoutExpired:
                worker.kill()
                worker.wait()


def _overlaps(events: list[list]) -> list[str]:
    """Partitions held by two members at once: from every member's
    (time, member, "+"/"-", partitions) events."""
    holder: dict[int, str] = {}
    problems = []
    for at, member, kind, partitions in sorted(events, key=lambda e: (e[0], e[2] == "+")):
        for p in partitions:
            if kind == "+":
                if p in holder and holder[p] != member:
                    problems.append(f"partition {p}: given to {member} at {at:.6f} while "
                                    f"{holder[p]} held it")
                holder[p] = member
            elif holder.get(p) == member:
                del holder[p]
    return problems


def _stats(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    p99 = ordered[max(0, -(-len(ordered) * 99 // 100) - 1)]  # nearest rank
    return {"p50": round(statistics.median(ordered), 1), "p99": round(p99, 1),
            "max": round(ordered[-1], 1), "trials": len(ordered)}


def _report(summary: dict) -> str:
    rows = [(what, f"{s['p50']:,.0f}", f"{s['p99']:,.0f}", f"{s['max']:,.0f}", str(s["trials"]))
            for what, s in (("join", summary["join_ms"]), ("leave", summary["leave_ms"]))]
    worst = max(summary["join_ms"]["p99"], summary["leave_ms"]["p99"])
    lines = [f"{summary['members']} members in {summary['processes']} processes, "
             f"{summary['partitions']:,} partitions (RF {BROKERS}), heartbeat interval "
             f"{summary['heartbeat_interval_ms']:,} ms; the group formed in "
             f"{summary['formed_ms']:,} ms",
             format_table(("REBALANCE", "P50 MS", "P99 MS", "MAX MS", "TRIALS"), rows),
             f"target: p99 <= {summary['target_p99_ms']:,} ms: "
             f"{'met' if worst <= summary['target_p99_ms'] else 'NOT met'}",
             "a partition held by two members at once: "
             + ("never" if not summary["overlaps"] else
                f"{len(summary['overlaps'])} times, e.g. {summary['overlaps'][0]}")]
    return "\n".join(lines)


# -- a worker process ----------------------------------------------------------------

async def _worker(spec: dict[str, Any]) -> int:
    from api.client import AsyncConsumer

    events: list[list] = []
    members: list[tuple[str, AsyncConsumer, asyncio.Task]] = []
    names = iter(range(10**9))
    stopping = asyncio.Event()

    def listener(name: str, kind: str):
        def record(partitions: set) -> None:
            events.append([time.monotonic(), name, kind, sorted(tp.partition
                                                                for tp in partitions)])
        return record

    async def keep_polling(consumer: AsyncConsumer) -> None:
        while not stopping.is_set():
            await consumer.poll(timeout_ms=POLL_MS)

    def add() -> None:
        name = f"w{spec['worker']}-m{next(names)}"
        consumer = AsyncConsumer(spec["bootstrap"], group_id=spec["group"],
                                 auto_offset_reset="latest", enable_auto_commit=False,
                                 client_id=name)
        consumer.subscribe([spec["topic"]], on_partitions_assigned=listener(name, "+"),
                           on_partitions_revoked=listener(name, "-"),
                           on_partitions_lost=listener(name, "-"))
        members.append((name, consumer, asyncio.create_task(keep_polling(consumer))))

    async def remove() -> None:
        _, consumer, task = members.pop()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await consumer.close()  # calls its revoke listener before it leaves

    for _ in range(spec["members"]):
        add()
    loop = asyncio.get_running_loop()
    print("ready", flush=True)
    try:
        while True:
            line = (await loop.run_in_executor(None, sys.stdin.readline)).strip()
            if line in ("", "stop"):
                break
            if line == "owned":
                answer: Any = [sorted(tp.partition for tp in consumer.assignment())
                               for _, consumer, _ in members]
            elif line == "join":
                add()
                answer = "ok"
            elif line == "leave":
                await remove()
                answer = "ok"
            elif line == "events":
                answer = events
            else:
                answer = f"unknown command {line!r}"
            print(json.dumps(answer), flush=True)
    finally:
        stopping.set()
        while members:
            await remove()
    return 0
