"""``kraftlog bench security``: what TLS and SCRAM cost producers and consumers.

Three fresh single nodes (shipped defaults) side by side: one plain, one
with both listeners SSL and client certificates required, one whose BROKER
listener is SASL_SSL, where the client authenticates as a SCRAM-SHA-512 user
(``ProcessCluster(tls=True)``: a CA and certificates made for the run).
Rounds alternate between them; each produces ``--records`` records into a
fresh topic through the Python Producer, then reads them all back through
the Consumer. Figures are medians of the rounds; the goal is >= 0.7x
plaintext, both ways.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
import uuid

from bench.data import _create_topic, _fill, _Progress, _status
from chaos.cluster import ProcessCluster

GOAL = 0.7
ROUNDS = 3
SCRAM_PASSWORD = "bench-password-1"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--records", type=int, default=300_000,
                        help="records per run (default %(default)s)")
    parser.add_argument("--record-size", type=int, default=100,
                        help="value bytes per record (default %(default)s)")
    parser.add_argument("--partitions", type=int, default=4,
                        help="partitions of each run's topic (default %(default)s)")
    parser.add_argument("--rounds", type=int, default=ROUNDS,
                        help="alternating rounds (default %(default)s)")
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")


def _produce(bootstrap: list[str], security: dict, topic: str, args, label: str) -> float:
    from api.client import Producer

    with Producer(bootstrap=bootstrap, acks=1, batch_size=1024 * 1024, linger_ms=5,
                  **security) as producer:
        return _fill(producer, topic, args.records, args.record_size,
                     f"produce {label}")["records_s"]


def _consume(bootstrap: list[str], security: dict, topic: str, args, label: str) -> float:
    from api.client import Consumer, TopicPartition

    with Consumer(bootstrap=bootstrap, auto_offset_reset="earliest", **security) as consumer:
        consumer.assign([TopicPartition(topic, p) for p in range(args.partitions)])
        progress = _Progress(f"consume {label}", args.records)
        got = 0
        started = time.perf_counter()
        deadline = started + max(60.0, args.records / 20_000)
        while got < args.records:
            if time.perf_counter() > deadline:
                raise SystemExit(f"consume stalled at {got} of {args.records} records")
            got += len(consumer.poll(timeout_ms=1000))
            progress.update(got)
        elapsed = time.perf_counter() - started
        progress.done(got)
    return got / elapsed


LABELS = ("plain", "TLS", "TLS+SCRAM")


def run(args: argparse.Namespace) -> int:
    samples: dict[str, list[float]] = {f"{way} {label}": [] for way in ("produce", "consume")
                                       for label in LABELS}
    with tempfile.TemporaryDirectory(prefix="kraftlog-bench-security-") as base:
        _status("starting three nodes: plain, TLS with client certificates, and SASL_SSL "
                "(TLS + a SCRAM user's password) ...")
        plain = ProcessCluster(os.path.join(base, "plain"), controllers=1, brokers=0,
                               combined=True, settings={})
        mtls = ProcessCluster(os.path.join(base, "tls"), controllers=1, brokers=0,
                              combined=True, settings={"ssl.client.auth": "required"},
                              tls=True)
        scram = ProcessCluster(os.path.join(base, "sasl"), controllers=1, brokers=0,
                               combined=True, tls=True, settings={
                                   "listener.security.protocol.map":
                                       "BROKER:SASL_SSL,CONTROLLER:SSL"})
        with plain, mtls, scram:
            for cluster in (plain, mtls, scram):
                cluster.start()
            for cluster in (plain, mtls, scram):
                cluster.wait_for_brokers_running(timeout_s=60)
            from api.client import Admin
            with Admin([scram.nodes[1].broker_url], **scram.client_security) as admin:
                admin.upsert_user("bench", SCRAM_PASSWORD)
            as_user = {"security_protocol": "SASL_SSL",
                       "ssl_cafile": scram.certs["ca"].certfile,
                       "sasl_mechanism": "SCRAM-SHA-512", "sasl_plain_username": "bench",
                       "sasl_plain_password": SCRAM_PASSWORD}
            targets = [("plain", plain, {}), ("TLS", mtls, mtls.client_security),
                       ("TLS+SCRAM", scram, as_user)]
            for _ in range(args.rounds):
                for label, cluster, security in targets:
                    bootstrap = [cluster.nodes[1].broker_url]
                    topic = f"bench-security-{uuid.uuid4().hex[:8]}"
                    _create_topic(bootstrap, topic, args.partitions, security=security)
                    samples[f"produce {label}"].append(
                        _produce(bootstrap, security, topic, args, label))
                    samples[f"consume {label}"].append(
                        _consume(bootstrap, security, topic, args, label))
    medians = {k: statistics.median(v) for k, v in samples.items()}
    ratios = {f"{way} {label}": medians[f"{way} {label}"] / medians[f"{way} plain"]
              for way in ("produce", "consume") for label in LABELS[1:]}
    summary = {"bench": "security", "records": args.records, "record_size": args.record_size,
               "partitions": args.partitions, "rounds": args.rounds, "samples": samples,
               "medians": medians, "ratios": ratios, "goal": GOAL}
    if args.json:
        print(json.dumps(summary, indent=2))
        return 0
    from api.table import format_table

    print("kraftlog bench security")
    print(f"  nodes     three fresh single nodes: plain; TLS on both listeners with client "
          f"certificates required; SASL_SSL (TLS, a SCRAM-SHA-512 user's password); "
          f"{args.rounds} alternating rounds")
    print(f"  workload  {args.records:,} records of {args.record_size} B per run, "
          f"{args.partitions} partitions, acks=1, batch 1 MiB, linger 5 ms")
    print()
    print(format_table(("run", "records/s (median)", "each round"), [
        (name, f"{medians[name]:,.0f}", " / ".join(f"{r:,.0f}" for r in samples[name]))
        for name in samples]))
    print()
    for run_name, ratio in ratios.items():
        verdict = "met" if ratio >= GOAL else "NOT met"
        print(f"{run_name} / plain: {ratio:.2f} (goal >= {GOAL}: {verdict})")
    return 0
