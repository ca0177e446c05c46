"""``kraftlog bench transactions``: what exactly-once costs.

On one fresh node (shipped defaults):

1. Transactions of ``--small`` (100) and ``--large`` (10,000) records, each
   run sending ``--records`` records in all through one transactional
   producer: records/s, and the latency of ``commit_transaction`` (flush of
   the last records, EndTxn, the markers written) p50/p99.
2. Reading back everything the runs wrote (markers included), with a
   ``read_uncommitted`` and a ``read_committed`` consumer, alternately, three
   rounds: records/s each and the ratio (target >= 0.9).
"""

from __future__ import annotations

import argparse
import statistics
import time
import uuid

from bench.data import _create_topic, _percentiles, _Progress, _status, _target

TRANSACTION_SIZES_DEFAULT = (100, 10_000)
CONSUME_ROUNDS = 3
READ_COMMITTED_RATIO_TARGET = 0.9


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--records", type=int, default=200_000,
                        help="records per transaction size (default %(default)s)")
    parser.add_argument("--record-size", type=int, default=100,
                        help="value bytes per record (default %(default)s)")
    parser.add_argument("--partitions", type=int, default=4,
                        help="partitions of the benchmark topic (default %(default)s)")
    parser.add_argument("--small", type=int, default=TRANSACTION_SIZES_DEFAULT[0],
                        help="records in a small transaction (default %(default)s)")
    parser.add_argument("--large", type=int, default=TRANSACTION_SIZES_DEFAULT[1],
                        help="records in a large transaction (default %(default)s)")
    parser.add_argument("--dir", help="where the fresh node's temporary directory is made "
                                      "(removed after; default: the system's temporary "
                                      "directory)")
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")


def run(args: argparse.Namespace) -> int:
    args = argparse.Namespace(**{**vars(args), "cluster_url": None, "brokers": 1})
    with _target(args, brokers=1) as bootstrap:
        topic = f"bench-transactions-{uuid.uuid4().hex[:8]}"
        _create_topic(bootstrap, topic, args.partitions, 1, 1)
        reference = _produce_plain(bootstrap, topic, args)
        runs = [_produce_transactions(bootstrap, topic, args, size)
                for size in (args.small, args.large)]
        for entry in runs:
            entry["ratio_to_plain"] = entry["records_s"] / reference["records_s"]
        total = reference["records"] + sum(run["records"] for run in runs)
        reads: dict[str, list[float]] = {"read_uncommitted": [], "read_committed": []}
        for round_no in range(CONSUME_ROUNDS):
            for isolation in reads:
                reads[isolation].append(_consume(bootstrap, topic, args.partitions, total,
                                                 isolation, round_no))
    consume = {isolation: statistics.median(rates) for isolation, rates in reads.items()}
    ratio = consume["read_committed"] / consume["read_uncommitted"]
    summary = {"bench": "transactions", "records": args.records,
               "record_size": args.record_size, "partitions": args.partitions,
               "reference": reference, "produce": runs, "consume_records_s": consume,
               "consume_records_s_all": reads, "ratio_read_committed": ratio,
               "ratio_target": READ_COMMITTED_RATIO_TARGET}
    if args.json:
        import json
        print(json.dumps(summary, indent=2))
        return 0
    from api.table import format_table
    print("kraftlog bench transactions")
    print(f"  node      one fresh combined node (shipped defaults), topic of {args.partitions} "
          f"partitions, records of {args.record_size} B")
    print()
    print(format_table(
        ("transaction", "transactions", "records/s", "MB/s", "vs no transactions",
         "commit p50 ms", "commit p99 ms"),
        [("none (idempotent)", "-", f"{reference['records_s']:,.0f}",
          f"{reference['mb_s']:,.1f}", "1.00", "-", "-")]
        + [(f"{run['size']:,} records", f"{run['transactions']:,}", f"{run['records_s']:,.0f}",
            f"{run['mb_s']:,.1f}", f"{run['ratio_to_plain']:.2f}", f"{run['commit_ms_p50']:.1f}",
            f"{run['commit_ms_p99']:.1f}") for run in runs]))
    print()
    print(format_table(("consumer", "records/s (median)", "each round"), [
        (isolation, f"{consume[isolation]:,.0f}", " / ".join(f"{r:,.0f}" for r in rates))
        for isolation, rates in reads.items()]))
    print()
    verdict = "met" if ratio >= READ_COMMITTED_RATIO_TARGET else "NOT met"
    print(f"read_committed / read_uncommitted consume: {ratio:.2f} "
          f"(target >= {READ_COMMITTED_RATIO_TARGET:.2f}: {verdict})")
    return 0


def _produce_plain(bootstrap: list[str], topic: str, args: argparse.Namespace) -> dict:
    """The reference: the same records through an idempotent acks=all
    producer without transactions."""
    from api.client import Producer

    value = b"x" * args.record_size
    progress = _Progress("no transactions", args.records)
    with Producer(bootstrap, linger_ms=5, batch_size=1024 * 1024) as producer:
        started = time.perf_counter()
        for i in range(args.records):
            producer.send(topic, value)
            if i % 10_000 == 0:
                progress.update(i)
        producer.flush()
        elapsed = time.perf_counter() - started
    progress.done(args.records)
    return {"records": args.records, "seconds": elapsed, "records_s": args.records / elapsed,
            "mb_s": args.records * args.record_size / elapsed / 1e6}


def _produce_transactions(bootstrap: list[str], topic: str, args: argparse.Namespace,
                          size: int) -> dict:
    from api.client import Producer

    count = max(1, args.records // size)
    value = b"x" * args.record_size
    commit_ms: list[float] = []
    progress = _Progress(f"transactions of {size:,}", count * size)
    with Producer(bootstrap, transactional_id=f"bench-{uuid.uuid4().hex[:8]}",
                  linger_ms=5, batch_size=1024 * 1024) as producer:
        producer.init_transactions()
        started = time.perf_counter()
        for i in range(count):
            producer.begin_transaction()
            for _ in range(size):
                producer.send(topic, value)
            committing = time.perf_counter()
            producer.commit_transaction()
            commit_ms.append((time.perf_counter() - committing) * 1000)
            progress.update((i + 1) * size)
        elapsed = time.perf_counter() - started
    progress.done(count * size)
    latency = _percentiles(commit_ms)
    return {"size": size, "transactions": count, "records": count * size,
            "seconds": elapsed, "records_s": count * size / elapsed,
            "mb_s": count * size * args.record_size / elapsed / 1e6,
            "commit_ms_p50": latency["latency_ms_p50"],
            "commit_ms_p99": latency["latency_ms_p99"]}


def _consume(bootstrap: list[str], topic: str, partitions: int, total: int, isolation: str,
             round_no: int) -> float:
    from api.client import Consumer, TopicPartition

    label = f"{isolation} ({round_no + 1}/{CONSUME_ROUNDS})"
    with Consumer(bootstrap, auto_offset_reset="earliest", isolation_level=isolation) as c:
        c.assign([TopicPartition(topic, p) for p in range(partitions)])
        c.seek_to_beginning()
        progress = _Progress(label, total)
        got = 0
        started = time.perf_counter()
        deadline = started + max(60.0, total / 20_000)
        while got < total:
            if time.perf_counter() > deadline:
                _status(f"{label}: stalled at {got} of {total} records")
                raise SystemExit(1)
            got += len(c.poll(timeout_ms=1000))
            progress.update(got)
        elapsed = time.perf_counter() - started
        progress.done(got)
    return got / elapsed
