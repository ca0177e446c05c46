"""``kraftlog bench console``: what an open web console costs a broker.

One fresh combined node (shipped defaults). Rounds alternate between
producing with no console open and producing while a headless chromium
(Debian's, driven by Playwright) has the console's overview open, which
polls the broker every 2 s (cluster, topics, quorum, metrics). Each run
sends ``--records`` records of ``--record-size`` bytes through kraftlog's
Producer into a fresh topic. Figures are medians of the rounds; the goal is
the produce rate with a tab open >= 0.95x the rate without. A third case, a
blank tab in the same browser, measures the browser's own CPU on this
machine, so the console's cost to the broker shows apart from it. (With no tab
open the console costs nothing: its assets are only read when asked for.)
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
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


def _produce(url: str, args) -> float:
    from api.client import Producer

    topic = f"bench-console-{uuid.uuid4().hex[:8]}"
    _create_topic([url], topic, args.partitions)
    with Producer(bootstrap=[url], acks=1, batch_size=1024 * 1024, linger_ms=5) as producer:
        return _fill(producer, topic, args.records, args.record_size, "produce")["records_s"]


def run(args: argparse.Namespace) -> int:
    import os

    from playwright.sync_api import sync_playwright

    if not os.path.exists(CHROMIUM):
        raise SystemExit(f"{CHROMIUM} not found: install Debian's chromium "
                         "(apt-get install chromium; make test does)")
    samples: dict[str, list[float]] = {"no console": [], "blank tab": [], "console open": []}
    with tempfile.TemporaryDirectory(prefix="kraftlog-bench-console-") as base:
        _status("starting one node ...")
        with ProcessCluster(base, controllers=1, brokers=0, combined=True,
                            settings={}) as cluster, sync_playwright() as playwright:
            cluster.start()
            cluster.wait_for_brokers_running(timeout_s=60)
            url = cluster.nodes[1].broker_url
            browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            try:
                for round_no in range(args.rounds):
                    order = list(samples) if round_no % 2 == 0 else list(samples)[::-1]
                    for case in order:
                        if case == "no console":
                            samples[case].append(_produce(url, args))
                            continue
                        page = browser.new_page()
                        if case == "console open":
                            page.goto(url + "/ui/#/")
                            page.locator('[data-broker-state="1"]').wait_for(timeout=30_000)
                        else:  # the browser's own cost on this machine, no console
                            page.goto("about:blank")
                        try:
                            samples[case].append(_produce(url, args))
                        finally:
                            page.close()
            finally:
                browser.close()
    medians = {k: statistics.median(v) for k, v in samples.items()}
    ratio = medians["console open"] / medians["no console"]
    # What the console's polling costs the broker, the browser's own CPU on
    # this machine left out: the console against a blank tab.
    broker_ratio = medians["console open"] / medians["blank tab"]
    summary = {"bench": "console", "records": args.records, "record_size": args.record_size,
               "partitions": args.partitions, "rounds": args.rounds, "samples": samples,
               "medians": medians, "ratio": ratio, "broker_ratio": broker_ratio,
               "goal": GOAL}
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
    print(format_table(("run", "records/s (median)", "each round"), [
        (name, f"{medians[name]:,.0f}", " / ".join(f"{r:,.0f}" for r in samples[name]))
        for name in samples]))
    print()
    verdict = "met" if ratio >= GOAL else "NOT met"
    print(f"console open / no console = {ratio:.3f} (goal >= {GOAL}: {verdict})")
    print(f"console open / blank tab  = {broker_ratio:.3f} (the broker's share: the "
          "browser runs on this machine too)")
    return 0
