"""``kraftlog bench console``: what an open web console costs a broker.

One fresh combined node (shipped defaults). Rounds alternate between
producing with no console open and producing while a headless chromium
(Debian's, driven by Playwright) has the console's overview open, which
polls the broker every 2 s (cluster, quorum, every broker's counters; the
metadata and log directories every 10 s). Each run sends ``--records``
records of ``--record-size`` bytes through kraftlog's Producer into a fresh
topic. Figures are medians of the rounds; the goal is the produce rate with
a tab open >= 0.95x the rate without. A third case, a blank tab in the same
browser, measures the browser's own cost on this machine. A tab is measured
open, not opening: a run starts once the new tab's start-up (up to a second
of CPU) is over. Each run also reports the CPU seconds the broker, the
producer and the browser spent in it (from /proc), so the console's work on
the broker shows apart from the browser sharing its cores. (With no tab
open the console costs nothing: its assets are only read when asked for.)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
import uuid

from bench.data import _create_topic, _fill, _status
from chaos.cluster import ProcessCluster

GOAL = 0.95
#: Debian's chromium, and the flags it needs here (and in the console's
#: browser tests): no sandbox as root, no calls to the internet.
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update",
                 "--disable-sync"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--records", type=int, default=300_000,
                        help="records per run (default %(default)s)")
    parser.add_argument("--record-size", type=int, default=100,
                        help="value bytes per record (default %(default)s)")
    parser.add_argument("--partitions", type=int, default=4,
                        help="partitions of each run's topic (default %(default)s)")
    parser.add_argument("--rounds", type=int, default=3,
                        help="alternating rounds (default %(default)s)")
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")


def _cpu_by_process() -> dict[int, tuple[int, str, float]]:
    """pid -> (parent pid, command name, CPU seconds so far) of every process."""
    ticks = os.sysconf("SC_CLK_TCK")
    out = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:  # gone meanwhile
            continue
        name = stat[stat.index("(") + 1:stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2:].split()
        # after the name: state ppid ... utime (11th) stime (12th)
        out[int(entry)] = (int(fields[1]), name, (int(fields[11]) + int(fields[12])) / ticks)
    return out


def _cpu_split(broker_pid: int) -> dict[str, float]:
    """CPU seconds so far of the broker, of this process (the producer), and
    of the browser: every other process descended from this one (chromium's
    processes and Playwright's driver)."""
    table = _cpu_by_process()
    me = os.getpid()
    browser = 0.0
    for pid, (_, _, cpu) in table.items():
        if pid in (me, broker_pid):
            continue
        ancestor, hops = table[pid][0], 0
        while ancestor not in (me, 0, 1) and ancestor in table and hops < 64:
            ancestor, hops = table[ancestor][0], hops + 1
        if ancestor == me:
            browser += cpu
    return {"broker": table.get(broker_pid, (0, "", 0.0))[2],
            "producer": table.get(me, (0, "", 0.0))[2], "browser": browser}


def _settle(broker_pid: int, deadline_s: float = 20.0) -> None:
    """Wait until a newly opened tab has finished starting (its renderer
    spends up to about a second of CPU), so a run measures an open tab in
    its steady state: two half-seconds in a row with the browser under a
    fifth of a core, or ``deadline_s``."""
    deadline = time.monotonic() + deadline_s
    quiet, before = 0, _cpu_split(broker_pid)["browser"]
    while quiet < 2 and time.monotonic() < deadline:
        time.sleep(0.5)
        now = _cpu_split(broker_pid)["browser"]
        quiet = quiet + 1 if now - before < 0.1 else 0
        before = now


def _produce(url: str, args, broker_pid: int) -> tuple[float, dict[str, float]]:
    """One run: its produce rate and the CPU seconds each party spent in it."""
    from api.client import Producer

    topic = f"bench-console-{uuid.uuid4().hex[:8]}"
    _create_topic([url], topic, args.partitions)
    with Producer(bootstrap=[url], acks=1, batch_size=1024 * 1024, linger_ms=5) as producer:
        before = _cpu_split(broker_pid)
        rate = _fill(producer, topic, args.records, args.record_size, "produce")["records_s"]
        after = _cpu_split(broker_pid)
    return rate, {k: after[k] - before[k] for k in before}


def run(args: argparse.Namespace) -> int:
    from playwright.sync_api import sync_playwright

    if not os.path.exists(CHROMIUM):
        raise SystemExit(f"{CHROMIUM} not found: install Debian's chromium "
                         "(apt-get install chromium; make test does)")
    samples: dict[str, list[float]] = {"no console": [], "blank tab": [], "console open": []}
    cpu: dict[str, list[dict[str, float]]] = {case: [] for case in samples}

    def measure(case: str) -> None:
        rate, spent = _produce(url, args, broker_pid)
        samples[case].append(rate)
        cpu[case].append(spent)

    with tempfile.TemporaryDirectory(prefix="kraftlog-bench-console-") as base:
        _status("starting one node ...")
        with ProcessCluster(base, controllers=1, brokers=0, combined=True,
                            settings={}) as cluster, sync_playwright() as playwright:
            cluster.start()
            cluster.wait_for_brokers_running(timeout_s=60)
            url = cluster.nodes[1].broker_url
            broker_pid = cluster.nodes[1].process.pid
            browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            try:
                for round_no in range(args.rounds):
                    order = list(samples) if round_no % 2 == 0 else list(samples)[::-1]
                    for case in order:
                        if case == "no console":
                            measure(case)
                            continue
                        page = browser.new_page()
                        if case == "console open":
                            page.goto(url + "/ui/#/")
                            page.locator('[data-broker-state="1"]').wait_for(timeout=30_000)
                        else:  # the browser's own cost on this machine, no console
                            page.goto("about:blank")
                        _settle(broker_pid)
                        try:
                            measure(case)
                        finally:
                            page.close()
            finally:
                browser.close()
    medians = {k: statistics.median(v) for k, v in samples.items()}
    cpu_medians = {case: {who: statistics.median(r[who] for r in runs) for who in runs[0]}
                   for case, runs in cpu.items()}
    ratio = medians["console open"] / medians["no console"]
    # What the console's polling costs the broker, the browser's own CPU on
    # this machine left out: the console against a blank tab.
    broker_ratio = medians["console open"] / medians["blank tab"]
    summary = {"bench": "console", "records": args.records, "record_size": args.record_size,
               "partitions": args.partitions, "rounds": args.rounds, "samples": samples,
               "medians": medians, "ratio": ratio, "broker_ratio": broker_ratio,
               "cpu_s": cpu, "cpu_s_medians": cpu_medians, "goal": GOAL}
    if args.json:
        print(json.dumps(summary, indent=2))
        return 0
    from api.table import format_table

    print("kraftlog bench console")
    print("  node      one fresh combined node, shipped defaults")
    print(f"  workload  {args.records:,} records of {args.record_size} B per run through "
          f"kraftlog's Producer, {args.partitions} partitions, acks=1; {args.rounds} "
          "alternating rounds, with and without a console tab (headless chromium on the "
          "overview, polling every 2 s)")
    print()
    print(format_table(
        ("run", "records/s (median)", "each round", "broker CPU s", "producer CPU s",
         "browser CPU s"),
        [(name, f"{medians[name]:,.0f}", " / ".join(f"{r:,.0f}" for r in samples[name]),
          *(f"{cpu_medians[name][who]:.2f}" for who in ("broker", "producer", "browser")))
         for name in samples]))
    print()
    verdict = "met" if ratio >= GOAL else "NOT met"
    print(f"console open / no console = {ratio:.3f} (goal >= {GOAL}: {verdict})")
    print(f"console open / blank tab  = {broker_ratio:.3f} (the broker's share: the "
          "browser runs on this machine too)")
    print("CPU seconds are medians per run (of the records above), from /proc: the broker "
          "process, this one (the producer), and chromium with Playwright's driver")
    return 0
