"""``kraftlog bench security``: what TLS, SCRAM and ACLs cost producers and
consumers.

Five fresh single nodes (shipped defaults) side by side: one plain, one
with both listeners SSL and client certificates required, one whose BROKER
listener is SASL_SSL, where the client authenticates as a SCRAM-SHA-512 user
(``ProcessCluster(tls=True)``: a CA and certificates made for the run), and
two more SASL_SSL ones with the authorizer on, holding 10 ACLs and
``--acls`` ACLs (70% literal topics, 20% prefixed, 10% groups and
transactional ids, over 50 principals; the bench user's own grants among
them). Rounds alternate between them, each round starting one node further on;
each produces ``--records`` records
into a fresh topic through the Python Producer, then reads them all back
through the Consumer. Figures are medians of the rounds. Goals: >= 0.7x
plaintext both ways for TLS+SCRAM, and no measurable drop from 10 ACLs to
``--acls`` ACLs.

First, in this process: the authorizer's cost per decision over 10 and
``--acls`` ACLs, from its cache and from its index alone.
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
BENCH_USER = "User:bench"
ACL_PRINCIPALS = 50


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--records", type=int, default=300_000,
                        help="records per run (default %(default)s)")
    parser.add_argument("--record-size", type=int, default=100,
                        help="value bytes per record (default %(default)s)")
    parser.add_argument("--partitions", type=int, default=4,
                        help="partitions of each run's topic (default %(default)s)")
    parser.add_argument("--rounds", type=int, default=ROUNDS,
                        help="alternating rounds (default %(default)s)")
    parser.add_argument("--acls", type=int, default=10_000,
                        help="ACLs of the large authorizer node (default %(default)s)")
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")


def acl_bindings(count: int) -> list:
    """``count`` ACLs: the bench user's grants (everything on topics named
    bench-*, idempotent writes), then 70% literal topics, 20% prefixed, 10%
    groups and transactional ids, for 50 other principals."""
    from protocol import acl
    mine = [acl.AclBinding(acl.TOPIC, "bench-", acl.PREFIXED, BENCH_USER, "*", acl.ALL,
                           acl.ALLOW),
            acl.AclBinding(acl.CLUSTER, acl.CLUSTER_NAME, acl.LITERAL, BENCH_USER, "*",
                           acl.IDEMPOTENT_WRITE, acl.ALLOW)]
    out = list(mine)
    ops = (acl.READ, acl.WRITE, acl.DESCRIBE)
    for i in range(max(0, count - len(mine))):
        principal = f"User:app-{i % ACL_PRINCIPALS}"
        kind = i % 10
        if kind < 7:
            binding = acl.AclBinding(acl.TOPIC, f"topic-{i}", acl.LITERAL, principal, "*",
                                     ops[i % 3], acl.ALLOW)
        elif kind < 9:
            binding = acl.AclBinding(acl.TOPIC, f"team-{i}.", acl.PREFIXED, principal, "*",
                                     ops[i % 3], acl.ALLOW if i % 2 else acl.DENY)
        elif i % 20 == 9:
            binding = acl.AclBinding(acl.GROUP, f"group-{i}", acl.LITERAL, principal, "*",
                                     acl.READ, acl.ALLOW)
        else:
            binding = acl.AclBinding(acl.TRANSACTIONAL_ID, f"txn-{i}", acl.LITERAL, principal,
                                     "*", acl.WRITE, acl.ALLOW)
        out.append(binding)
    return out[:max(count, len(mine))]


def bench_decisions(count: int, decisions: int = 200_000) -> dict:
    """ns per authorizer decision over 10 and ``count`` ACLs: cached (the
    hot path: the same caller and topic again) and from the index alone."""
    from kraft.authorizer import AclIndex, AclSettings, Authorizer, decide
    from kraft.image import MetadataImage
    from kraft.records import AccessControlEntryRecord
    from protocol import acl

    out = {}
    for n in (10, count):
        image = MetadataImage()
        for offset, binding in enumerate(acl_bindings(n)):
            image.apply(AccessControlEntryRecord(*binding), offset)
        authorizer = Authorizer(lambda: image, AclSettings(True))
        names = [f"bench-topic-{i % 64}" for i in range(decisions)]
        started = time.perf_counter()
        authorizer.authorize(BENCH_USER, "127.0.0.1", acl.WRITE, acl.TOPIC, "warm-up")
        build_ms = (time.perf_counter() - started) * 1000  # the index, after an ACL change
        started = time.perf_counter()
        for name in names:
            authorizer.authorize(BENCH_USER, "127.0.0.1", acl.WRITE, acl.TOPIC, name)
        cached = (time.perf_counter() - started) / decisions * 1e9
        index = AclIndex(image.acls)
        started = time.perf_counter()
        for name in names[:decisions // 4]:
            decide(index, BENCH_USER, "127.0.0.1", acl.WRITE, acl.TOPIC, name, False)
        uncached = (time.perf_counter() - started) / (decisions // 4) * 1e9
        out[n] = {"cached_ns": cached, "index_ns": uncached, "index_build_ms": build_ms}
    return out


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


def run(args: argparse.Namespace) -> int:
    few, many = "10 ACLs", f"{args.acls:,} ACLs"
    labels = ("plain", "TLS", "TLS+SCRAM", few, many)
    samples: dict[str, list[float]] = {f"{way} {label}": [] for way in ("produce", "consume")
                                       for label in labels}
    _status(f"the authorizer in this process: 10 and {args.acls:,} ACLs ...")
    decisions = bench_decisions(args.acls)
    with tempfile.TemporaryDirectory(prefix="kraftlog-bench-security-") as base:
        _status("starting five nodes: plain, TLS with client certificates, SASL_SSL "
                "(TLS + a SCRAM user's password), and SASL_SSL with ACLs (10, and "
                f"{args.acls:,}) ...")
        plain = ProcessCluster(os.path.join(base, "plain"), controllers=1, brokers=0,
                               combined=True, settings={})
        mtls = ProcessCluster(os.path.join(base, "tls"), controllers=1, brokers=0,
                              combined=True, settings={"ssl.client.auth": "required"},
                              tls=True)
        scram = ProcessCluster(os.path.join(base, "sasl"), controllers=1, brokers=0,
                               combined=True, tls=True, settings={
                                   "listener.security.protocol.map":
                                       "BROKER:SASL_SSL,CONTROLLER:SSL"})
        acl_nodes = {label: ProcessCluster(
            os.path.join(base, f"acls-{n}"), controllers=1, brokers=0, combined=True,
            tls=True, acls=True, settings={
                "listener.security.protocol.map": "BROKER:SASL_SSL,CONTROLLER:SSL"})
            for label, n in ((few, 10), (many, args.acls))}
        with plain, mtls, scram, acl_nodes[few], acl_nodes[many]:
            everyone = (plain, mtls, scram, *acl_nodes.values())
            for cluster in everyone:
                cluster.start()
            for cluster in everyone:
                cluster.wait_for_brokers_running(timeout_s=60)
            from api.client import Admin
            for cluster in (scram, *acl_nodes.values()):
                with Admin([cluster.nodes[1].broker_url], **cluster.client_security) as admin:
                    admin.upsert_user("bench", SCRAM_PASSWORD)
            for label, n in ((few, 10), (many, args.acls)):
                _status(f"creating {n:,} ACLs ...")
                cluster = acl_nodes[label]
                bindings = acl_bindings(n)
                with Admin([cluster.nodes[1].broker_url], **cluster.client_security) as admin:
                    for at in range(0, len(bindings), 1000):
                        admin.create_acls(bindings[at:at + 1000])
                    assert len(admin.describe_acls()) == len(bindings)

            def as_user(cluster: ProcessCluster) -> dict:
                return {"security_protocol": "SASL_SSL",
                        "ssl_cafile": cluster.certs["ca"].certfile,
                        "sasl_mechanism": "SCRAM-SHA-512", "sasl_plain_username": "bench",
                        "sasl_plain_password": SCRAM_PASSWORD}
            targets = [("plain", plain, {}), ("TLS", mtls, mtls.client_security),
                       ("TLS+SCRAM", scram, as_user(scram)),
                       *((label, cluster, as_user(cluster))
                         for label, cluster in acl_nodes.items())]
            for round_no in range(args.rounds):
                # Each round starts with the next node: none is always first or last.
                turn = round_no % len(targets)
                for label, cluster, security in targets[turn:] + targets[:turn]:
                    bootstrap = [cluster.nodes[1].broker_url]
                    topic = f"bench-security-{uuid.uuid4().hex[:8]}"
                    _create_topic(bootstrap, topic, args.partitions, security=security)
                    samples[f"produce {label}"].append(
                        _produce(bootstrap, security, topic, args, label))
                    samples[f"consume {label}"].append(
                        _consume(bootstrap, security, topic, args, label))
    medians = {k: statistics.median(v) for k, v in samples.items()}
    ratios = {f"{way} {label} / plain": medians[f"{way} {label}"] / medians[f"{way} plain"]
              for way in ("produce", "consume") for label in labels[1:4]}
    acl_ratios = {f"{way} {many} / {few}": medians[f"{way} {many}"] / medians[f"{way} {few}"]
                  for way in ("produce", "consume")}
    summary = {"bench": "security", "records": args.records, "record_size": args.record_size,
               "partitions": args.partitions, "rounds": args.rounds, "samples": samples,
               "medians": medians, "ratios": ratios, "goal": GOAL, "acls": args.acls,
               "acl_ratios": acl_ratios, "decisions_ns": decisions}
    if args.json:
        print(json.dumps(summary, indent=2))
        return 0
    from api.table import format_table

    print("kraftlog bench security")
    print(f"  nodes     five fresh single nodes: plain; TLS on both listeners with client "
          f"certificates required; SASL_SSL (TLS, a SCRAM-SHA-512 user's password); "
          f"SASL_SSL with the authorizer and 10 or {args.acls:,} ACLs; "
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
        print(f"{run_name}: {ratio:.2f} (goal >= {GOAL} for TLS+SCRAM: {verdict})"
              if "SCRAM" in run_name else f"{run_name}: {ratio:.2f}")
    for run_name, ratio in acl_ratios.items():
        print(f"{run_name}: {ratio:.2f} (goal: no measurable drop)")
    print()
    print(format_table(("authorizer, in process", "ns per decision, cached",
                        "ns per decision, index only", "index build after a change, ms"), [
        (f"{n:,} ACLs", f"{d['cached_ns']:,.0f}", f"{d['index_ns']:,.0f}",
         f"{d['index_build_ms']:,.1f}") for n, d in decisions.items()]))
    return 0
