"""``kraftlog bench kafka``: Kafka's own clients through the KAFKA listener
against kraftlog's Python client through the HTTP/msgpack API, same node,
same records.

One fresh combined node (shipped defaults, a KAFKA listener added). Rounds
alternate between the two doors, each starting with the other one; each
run produces ``--records`` records of ``--record-size`` bytes into a fresh
topic (acks=1, batches up to 1 MiB, linger 5 ms on both clients), then
reads them all back from offset 0. The Kafka side is confluent-kafka
(librdkafka), the client Kafka users run for speed. Figures are medians of
the rounds; the goal is the Kafka listener at >= 0.7x the HTTP path's
records/s, both ways.

``--secure``: both doors SASL_SSL, both clients logging in as one SCRAM
user (SCRAM-SHA-512 on the Kafka listener, its password over TLS on HTTP):
what TLS and authentication cost each door.
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
BATCH_BYTES = 1024 * 1024


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--records", type=int, default=300_000,
                        help="records per run (default %(default)s)")
    parser.add_argument("--record-size", type=int, default=100,
                        help="value bytes per record (default %(default)s)")
    parser.add_argument("--partitions", type=int, default=4,
                        help="partitions of each run's topic (default %(default)s)")
    parser.add_argument("--rounds", type=int, default=ROUNDS,
                        help="alternating rounds (default %(default)s)")
    parser.add_argument("--secure", action="store_true",
                        help="both listeners SASL_SSL, both clients a SCRAM user over TLS")
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")


BENCH_USER, BENCH_PASSWORD = "bench", "bench-password-not-secret"


def _kafka_security(cluster: ProcessCluster | None) -> dict:
    """confluent-kafka's settings to log in to ``cluster`` (None: plain)."""
    if cluster is None:
        return {}
    return {"security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512",
            "sasl.username": BENCH_USER, "sasl.password": BENCH_PASSWORD,
            "ssl.ca.location": cluster.certs["ca"].certfile}


def _deadline(args) -> float:
    return time.perf_counter() + max(120.0, args.records / 5_000)


def _produce_http(url: str, topic: str, args, security: dict) -> float:
    from api.client import Producer

    with Producer(bootstrap=[url], acks=1, batch_size=BATCH_BYTES, linger_ms=5,
                  **security) as producer:
        return _fill(producer, topic, args.records, args.record_size,
                     "produce http")["records_s"]


def _produce_kafka(bootstrap: str, topic: str, args, security: dict) -> float:
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "acks": 1, "linger.ms": 5,
                         "batch.size": BATCH_BYTES, "compression.type": "none",
                         "queue.buffering.max.messages": 1_000_000,
                         "queue.buffering.max.kbytes": 1_048_576, **security})
    value = os.urandom(args.record_size)
    failed = []

    def delivered(error, _message) -> None:
        if error is not None:
            failed.append(error)
    progress = _Progress("produce kafka", args.records)
    started = time.perf_counter()
    deadline = _deadline(args)
    for i in range(args.records):
        while True:
            try:
                producer.produce(topic, value, on_delivery=delivered)
                break
            except BufferError:  # the local queue is full: let deliveries drain
                producer.poll(0.05)
                if time.perf_counter() > deadline:
                    raise SystemExit("produce kafka stalled: the local queue never drained")
        if i % 10_000 == 0:
            producer.poll(0)
            progress.update(i)
    left = producer.flush(max(1.0, deadline - time.perf_counter()))
    elapsed = time.perf_counter() - started
    progress.done(args.records)
    if left or failed:
        raise SystemExit(f"produce kafka: {left} records undelivered, {len(failed)} failed "
                         f"({failed[:1]})")
    return args.records / elapsed


def _consume_http(url: str, topic: str, args, security: dict) -> float:
    from api.client import Consumer, TopicPartition

    with Consumer(bootstrap=[url], auto_offset_reset="earliest", **security) as consumer:
        consumer.assign([TopicPartition(topic, p) for p in range(args.partitions)])
        progress = _Progress("consume http", args.records)
        got = 0
        started = time.perf_counter()
        deadline = _deadline(args)
        while got < args.records:
            if time.perf_counter() > deadline:
                raise SystemExit(f"consume http stalled at {got} of {args.records} records")
            got += len(consumer.poll(timeout_ms=1000))
            progress.update(got)
        elapsed = time.perf_counter() - started
        progress.done(got)
    return got / elapsed


def _consume_kafka(bootstrap: str, topic: str, args, security: dict) -> float:
    from confluent_kafka import Consumer, TopicPartition

    # librdkafka pauses fetching for fetch.queue.backoff.ms (1 s) once it holds
    # queued.min.messages (100,000) the application has not taken yet; a
    # Python loop taking 10,000 at a time trips that, so both are raised.
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench-unused",
                         "enable.auto.commit": False, "fetch.max.bytes": 50 * BATCH_BYTES,
                         "max.partition.fetch.bytes": 4 * BATCH_BYTES,
                         "queued.min.messages": 1_000_000, "fetch.queue.backoff.ms": 10,
                         **security})
    try:
        consumer.assign([TopicPartition(topic, p, 0) for p in range(args.partitions)])
        progress = _Progress("consume kafka", args.records)
        got = 0
        started = time.perf_counter()
        deadline = _deadline(args)
        while got < args.records:
            if time.perf_counter() > deadline:
                raise SystemExit(f"consume kafka stalled at {got} of {args.records} records")
            for message in consumer.consume(num_messages=10_000, timeout=1.0):
                if message.error() is None:
                    got += 1
            progress.update(got)
        elapsed = time.perf_counter() - started
        progress.done(got)
    finally:
        consumer.close()
    return got / elapsed


def run(args: argparse.Namespace) -> int:
    from protocol.kafka.records import ACCELERATED

    doors = ("http", "kafka")
    samples: dict[str, list[float]] = {f"{way} {door}": [] for way in ("produce", "consume")
                                       for door in doors}
    with tempfile.TemporaryDirectory(prefix="kraftlog-bench-kafka-") as base:
        _status("starting one node with a KAFKA listener ...")
        with ProcessCluster(base, controllers=1, brokers=0, combined=True, settings={},
                            kafka=True, tls=args.secure, sasl=args.secure) as cluster:
            cluster.start()
            cluster.wait_for_brokers_running(timeout_s=60)
            url = cluster.nodes[1].broker_url
            http_security, kafka_security = {}, {}
            if args.secure:
                cluster.add_user(BENCH_USER, BENCH_PASSWORD)
                http_security = cluster.user_security(BENCH_USER, BENCH_PASSWORD)
                kafka_security = _kafka_security(cluster)
            for round_no in range(args.rounds):
                for door in (doors if round_no % 2 == 0 else doors[::-1]):
                    topic = f"bench-kafka-{uuid.uuid4().hex[:8]}"
                    _create_topic([url], topic, args.partitions,
                                  security=cluster.client_security or None)
                    if door == "http":
                        samples["produce http"].append(
                            _produce_http(url, topic, args, http_security))
                        samples["consume http"].append(
                            _consume_http(url, topic, args, http_security))
                    else:
                        samples["produce kafka"].append(_produce_kafka(
                            cluster.kafka_bootstrap, topic, args, kafka_security))
                        samples["consume kafka"].append(_consume_kafka(
                            cluster.kafka_bootstrap, topic, args, kafka_security))
    medians = {k: statistics.median(v) for k, v in samples.items()}
    ratios = {way: medians[f"{way} kafka"] / medians[f"{way} http"]
              for way in ("produce", "consume")}
    summary = {"bench": "kafka", "records": args.records, "record_size": args.record_size,
               "partitions": args.partitions, "rounds": args.rounds, "secure": args.secure,
               "samples": samples,
               "medians": medians, "ratios": ratios, "goal": GOAL,
               "conversion_in_c": ACCELERATED}
    if args.json:
        print(json.dumps(summary, indent=2))
        return 0
    from api.table import format_table

    print("kraftlog bench kafka")
    print("  node      one fresh combined node, shipped defaults, a KAFKA listener added; "
          f"records converted in {'C' if ACCELERATED else 'Python (the extension is not built)'}")
    print(f"  workload  {args.records:,} records of {args.record_size} B per run, "
          f"{args.partitions} partitions, acks=1, batches up to 1 MiB, linger 5 ms; "
          f"{args.rounds} alternating rounds")
    print("  clients   http: kraftlog's Producer/Consumer; kafka: confluent-kafka "
          "(librdkafka) through the KAFKA listener")
    if args.secure:
        print("  security  both listeners SASL_SSL (TLS); both clients log in as one SCRAM "
              "user (Kafka: SCRAM-SHA-512 once per connection; HTTP: its password on each "
              "request, derived once and then checked from a cache)")
    print()
    print(format_table(("run", "records/s (median)", "each round"), [
        (name, f"{medians[name]:,.0f}", " / ".join(f"{r:,.0f}" for r in samples[name]))
        for name in samples]))
    print()
    for way, ratio in ratios.items():
        verdict = "met" if ratio >= GOAL else "NOT met"
        print(f"{way}: kafka / http = {ratio:.2f} (goal >= {GOAL}: {verdict})")
    return 0
