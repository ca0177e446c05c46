"""``kraftlog bench flush``: produce over many partitions in rounds, back to
back, and how long the brokers take to make it durable (issue 25).

One fresh cluster of real processes on loopback (chaos/cluster.py): a
dedicated controller and three brokers, replication factor 3, the shipped
defaults plus ``--set``. ``--partitions`` partitions in ``bench scale``'s
layout (topics of 1 to 1,000 partitions), each broker leading a third.
Then ``--rounds`` rounds, each ``--records`` records of 100 B spread evenly
over every partition (``Producer.send_batch``, acks=all), one right after
the other: records/s and the brokers' CPU of each. The first round writes
to new logs, whose first flush also writes their leader-epoch checkpoint
and names; later rounds share the disk with the flushes of the ones before.

After the last round: the seconds until every broker reports every log
fsynced (``kraftlog_log_unflushed_logs`` 0 on ``/metrics``, polled every
second), bounded by ``--tail``, and the brokers' CPU (user and system)
meanwhile. With the default ``flush.ms`` (1 s) that is how far the disk's
durability lags the acknowledgements, and its price.

Compare flush settings by running it twice, e.g. with
``--set log.flush.syncfs.min.logs=8`` and without.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from typing import Any

from api.table import format_table
from bench.scale import (create_layout, elect_preferred, layout_topics, produce_spread,
                         unflushed, wait_flushed)
from chaos.cluster import ProcessCluster, process_cpu_times
from chaos.local_cluster import ClusterError, parse_settings

BROKERS = 3


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--partitions", type=int, default=10_000,
                        help="partitions, over topics of 1 to 1,000 partitions, replication "
                             "factor 3 (default %(default)s)")
    parser.add_argument("--records", type=int, default=1_000_000,
                        help="records of 100 B per round (default %(default)s)")
    parser.add_argument("--rounds", type=int, default=4,
                        help="produce rounds, back to back (default %(default)s)")
    parser.add_argument("--tail", type=float, default=120.0, metavar="SECONDS",
                        help="longest wait for every log to be fsynced after the last round "
                             "(default %(default)s)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="a node setting for every node, e.g. "
                             "log.flush.syncfs.min.logs=8 (repeatable)")
    parser.add_argument("--dir", default=None,
                        help="work directory (default: a temporary one, removed after)")
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")


def status(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def run(args: argparse.Namespace) -> int:
    for name in ("partitions", "records", "rounds"):
        if getattr(args, name) < 1:
            print(f"--{name} must be at least 1", file=sys.stderr)
            return 2
    if args.tail <= 0:
        print("--tail must be positive", file=sys.stderr)
        return 2
    try:
        settings = parse_settings(args.set)
    except ClusterError as exc:
        print(exc, file=sys.stderr)
        return 2
    layout = layout_topics(args.partitions)
    with tempfile.TemporaryDirectory(prefix="kraftlog-bench-flush-", dir=args.dir) as work, \
            ProcessCluster(work, controllers=1, brokers=BROKERS, settings=settings) as cluster:
        status(f"starting 1 controller + {BROKERS} brokers in {work} ...")
        cluster.start()
        cluster.wait_for_brokers_running(timeout_s=60)
        status(f"creating {args.partitions:,} partitions ...")
        create_layout(cluster, layout, 0)
        elect_preferred(cluster, layout)
        rounds = []
        for number in range(1, args.rounds + 1):
            status(f"round {number}/{args.rounds}: {args.records:,} records ...")
            cpu_before = brokers_cpu(cluster)
            rps = produce_spread(cluster, layout, args.records)
            user, system = cpu_since(cluster, cpu_before)
            rounds.append({"records_per_s": rps, "broker_user_s": user,
                           "broker_system_s": system})
        status("waiting for every log to be fsynced ...")
        cpu_before = brokers_cpu(cluster)
        flushed_s = wait_flushed(cluster, time.monotonic(), args.tail)
        left = unflushed(cluster)
        user, system = cpu_since(cluster, cpu_before)
    summary = {"bench": "flush", "partitions": args.partitions, "records": args.records,
               "settings": settings, "rounds": rounds, "flushed_after_s": flushed_s,
               "unflushed_left": left, "flush_user_s": user, "flush_system_s": system,
               "tail_s": args.tail}
    print(json.dumps(summary, indent=2) if args.json else format_report(summary))
    return 0 if flushed_s is not None else 1


def brokers_cpu(cluster: ProcessCluster) -> list[tuple[float, float]]:
    """Each broker's (user, system) CPU seconds so far."""
    return [process_cpu_times(cluster.nodes[broker].process.pid)
            for broker in cluster.broker_ids]


def cpu_since(cluster: ProcessCluster, before: list[tuple[float, float]]
              ) -> tuple[float, float]:
    after = brokers_cpu(cluster)
    return (sum(a[0] - b[0] for a, b in zip(after, before)),
            sum(a[1] - b[1] for a, b in zip(after, before)))


def format_report(summary: dict[str, Any]) -> str:
    settings = ", ".join(f"{k}={v}" for k, v in sorted(summary["settings"].items()))
    lines = ["kraftlog bench flush",
             f"  cluster  1 controller + {BROKERS} brokers, replication factor 3, shipped "
             f"defaults{' + ' + settings if settings else ''}",
             f"  load     {summary['records']:,} records of 100 B per round over "
             f"{summary['partitions']:,} partitions, rounds back to back", ""]
    rows = [(str(i), f"{r['records_per_s']:,.0f}", f"{r['broker_user_s']:.2f}",
             f"{r['broker_system_s']:.2f}") for i, r in enumerate(summary["rounds"], 1)]
    lines.append(format_table(("round", "records/s", "brokers' user CPU s",
                               "brokers' system CPU s"), rows, numbers_right=True))
    lines.append("")
    if summary["flushed_after_s"] is None:
        lines.append(f"NOT every log fsynced within {summary['tail_s']:.0f} s after the last "
                     f"round: unflushed logs per broker {summary['unflushed_left']}")
    else:
        lines.append(f"every log fsynced {summary['flushed_after_s']:.1f} s after the last "
                     "round")
    lines.append(f"the brokers' CPU meanwhile: {summary['flush_user_s']:.2f} s user, "
                 f"{summary['flush_system_s']:.2f} s system")
    return "\n".join(lines)
