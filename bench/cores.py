"""``kraftlog bench cores``: what the replication path costs per partition,
measured on the shipped cores alone (issue 25).

Three brokers' ``ReplicationCore``s (with their ``LifecycleCore``,
``Partition``s and real ``storage`` logs under ``--dir``) in this one
process, wired as the simulator wires them (tests/sim/replication.py): each
``SendFetch`` a follower's core emits is packed as the broker packs a
request, handed to the leader's core, and the leader's answer packed as the
broker packs it (``protocol.wire.pack_pieces``) and handed back. No sockets,
no event loop, no other process: the figures are the cores' own, and move
run to run far less than ``bench scale``'s, which sees the same path
through three real brokers sharing two cores.

One topic of ``--partitions`` partitions, replication factor 3, all led by
broker 1 and followed by 2 and 3: by default 3,333, the share of 10,000
each broker of ``bench scale`` leads. Each produce round is one request of
one batch of ``--records-per-partition`` records of 100 B for every
partition, acks=all, carried until it is answered and the followers have
fetched the new high watermark: the CPU each core spent
(``time.process_time`` around each call into it, and around the packing
and unpacking its side of the wire does), its microseconds per partition,
and how many answers and per-partition entries the followers got. Then
consumer rounds: a fetch opening a session over every partition from
offset 0 (50 MiB at most), unpacked, answered and packed: the leader's
CPU. A full garbage collection runs before each round, outside it.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import tempfile
import time
from collections import deque
from typing import Any, Callable

import msgpack

from api.broker.data_api import decode_fetch, render_results
from api.broker.lifecycle_core import BrokerState, LifecycleCore, LifecycleSettings
from api.broker.replica_manager import DiskLogs
from api.broker.replication import (ProduceItem, ReplicationCore, ReplicationSettings, Respond,
                                    SendFetch)
from api.table import format_table
from kraft.image import MetadataImage
from kraft.records import PartitionRecord, RegisterBrokerRecord, TopicRecord
from protocol.wire import pack_pieces
from storage.batch import build_batch
from storage.config import LogConfig
from storage.manager import LogManager, LogManagerConfig, TopicPartition

LEADER, FOLLOWERS = 1, (2, 3)
BROKERS = (LEADER, *FOLLOWERS)
TOPIC = "bench-cores"
RECORD = b"x" * 100
#: A consumer round's fetch: what ``Consumer`` asks by default.
CONSUMER_MAX_BYTES = 50 * 1024 * 1024
PARTITION_MAX_BYTES = 1024 * 1024
#: Simulated milliseconds past a fetch's longest wait: parked fetches expire.
SETTLE_MS = 600


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--partitions", type=int, default=3333,
                        help="partitions led by broker 1 and followed by 2 and 3 (default "
                             "%(default)s: the share of 10,000 one broker of bench scale leads)")
    parser.add_argument("--rounds", type=int, default=5,
                        help="produce rounds, then as many consumer rounds (default "
                             "%(default)s)")
    parser.add_argument("--records-per-partition", type=int, default=100,
                        help="records of 100 B per partition per produce round, one batch "
                             "(default %(default)s: 1,000,000 over 10,000 partitions)")
    parser.add_argument("--dir", default=None,
                        help="where the three brokers' logs go (default: a temporary "
                             "directory, removed after)")
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")


def status(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


class Cores:
    """The three cores, the simulated clock and the fetches in flight."""

    def __init__(self, work: str, partitions: int) -> None:
        self.partitions = partitions
        self.tps = [TopicPartition(TOPIC, p) for p in range(partitions)]
        image = MetadataImage()
        for broker in BROKERS:
            image.apply(RegisterBrokerRecord(broker, f"inc-{broker}",
                                             {"BROKER": f"127.0.0.1:{9000 + broker}"}, None),
                        image.offset + 1)
        image.apply(TopicRecord(TOPIC, "id-bench"), image.offset + 1)
        for p in range(partitions):
            image.apply(PartitionRecord("id-bench", p, list(BROKERS), list(BROKERS), LEADER,
                                        0, 0), image.offset + 1)
        self.now_ms = 0
        self.cpu = dict.fromkeys(BROKERS, 0.0)
        self.logs: list[LogManager] = []
        self.cores: dict[int, ReplicationCore] = {}
        self.queue: deque[tuple[int, Any]] = deque()  # (broker, action) to carry
        # leader's request id -> (follower, the follower's request id)
        self.in_flight: dict[int, tuple[int, int]] = {}
        self.counts = {"answers": 0, "entries": 0, "with_records": 0}
        for broker in BROKERS:
            logs = LogManager(LogManagerConfig((os.path.join(work, f"broker-{broker}"),)),
                              LogConfig())
            logs.startup()
            self.logs.append(logs)
            lifecycle = LifecycleCore(LifecycleSettings(broker, f"inc-{broker}", {}, None,
                                                        1000, 3000), 0)
            lifecycle.broker_epoch = image.brokers[broker].broker_epoch
            lifecycle.state = BrokerState.RUNNING
            lifecycle.metadata_caught_up = True
            core = ReplicationCore(broker, DiskLogs(broker, logs), lifecycle,
                                   ReplicationSettings())
            core.apply_image(image, self.now_ms)
            self.cores[broker] = core
        # New logs are opened a few per pass, each pass on a timer.
        while any(len(core.partitions) < partitions for core in self.cores.values()):
            self.now_ms += 1
            for broker, core in self.cores.items():
                core.tick(self.now_ms)
                self.queue.extend((broker, action) for action in core.ready())
            if self.now_ms > partitions + 1000:
                raise RuntimeError("the cores did not open every log")
        self.carry()

    def close(self) -> None:
        for logs in self.logs:
            logs.shutdown()

    def call(self, broker: int, fn: Callable[[], Any]) -> Any:
        started = time.process_time()
        try:
            return fn()
        finally:
            self.cpu[broker] += time.process_time() - started

    def ready(self, broker: int) -> None:
        core = self.cores[broker]
        self.queue.extend((broker, action) for action in self.call(broker, core.ready))

    def carry(self) -> list[tuple[int, Respond]]:
        """Carry every fetch and answer until none is left; the answers to
        anything else (produce requests), by broker."""
        for broker in BROKERS:
            self.ready(broker)
        others = []
        while self.queue:
            broker, action = self.queue.popleft()
            if isinstance(action, SendFetch):
                self._fetch(broker, action)
            elif isinstance(action, Respond):
                target = self.in_flight.pop(action.request_id, None) \
                    if broker == LEADER else None
                if target is None:
                    others.append((broker, action))
                else:
                    self._answer(action, *target)
        return others

    def _fetch(self, follower: int, fetch: SendFetch) -> None:
        leader = self.cores[fetch.leader_id]
        # Packed by the follower, unpacked by the leader, as on the wire.
        packed = self.call(follower, lambda: msgpack.packb(fetch.body, use_bin_type=True))
        body = self.call(fetch.leader_id, lambda: msgpack.unpackb(packed))
        request_id = self.call(fetch.leader_id, leader.new_request_id)
        self.in_flight[request_id] = (follower, fetch.request_id)
        self.call(fetch.leader_id,
                  lambda: leader.fetch(request_id, decode_fetch(body), self.now_ms))
        self.ready(fetch.leader_id)

    def pack_answer(self, respond: Respond) -> bytes:
        """``respond`` as the leader packs it (charged to the leader); the
        pieces joined as the socket would carry them (charged to no one)."""
        return b"".join(self.call(LEADER, lambda: pack_pieces(
            {"partitions": render_results("fetch", respond.results), **respond.fields})))

    def _answer(self, respond: Respond, follower: int, request_id: int) -> None:
        packed = self.pack_answer(respond)
        answer = self.call(follower, lambda: msgpack.unpackb(packed))
        entries = answer.get("partitions") or []
        self.counts["answers"] += 1
        self.counts["entries"] += len(entries)
        self.counts["with_records"] += sum(1 for entry in entries if entry.get("records"))
        core = self.cores[follower]
        self.call(follower, lambda: core.fetch_answered(request_id, answer, self.now_ms))
        self.ready(follower)

    def tick(self, ms: int) -> None:
        self.now_ms += ms
        for broker, core in self.cores.items():
            self.call(broker, lambda core=core: core.tick(self.now_ms))

    def reset_counts(self) -> None:
        self.cpu = dict.fromkeys(BROKERS, 0.0)
        self.counts = dict.fromkeys(self.counts, 0)


def produce_round(cores: Cores, batch: bytes) -> dict[str, Any]:
    gc.collect()  # a full collection now, not inside the round
    cores.reset_counts()
    leader = cores.cores[LEADER]
    cores.tick(10)
    request_id = cores.call(LEADER, leader.new_request_id)
    items = [ProduceItem(tp, None, batch) for tp in cores.tps]
    cores.call(LEADER, lambda: leader.produce(request_id, items, -1, 30_000, cores.now_ms))
    answer = None
    for _ in range(100):
        for broker, respond in cores.carry():
            if broker == LEADER and respond.request_id == request_id:
                answer = respond
        if answer is not None:
            break
        cores.tick(1)
    if answer is None:
        raise RuntimeError("the produce request was not answered")
    failed = [r for r in answer.results if r.get("error") is not None]
    if failed:
        raise RuntimeError(f"{len(failed)} partitions refused the write: {failed[0]}")
    for _ in range(2):  # the followers' waiting fetches end; they learn the high watermark
        cores.tick(SETTLE_MS)
        cores.carry()
    lagging = [tp for tp in cores.tps for f in FOLLOWERS
               if cores.cores[f].partitions[tp].high_watermark
               != leader.partitions[tp].high_watermark]
    if lagging:
        raise RuntimeError(f"{len(lagging)} follower replicas behind the high watermark")
    return {"leader_ms": cores.cpu[LEADER] * 1000,
            "follower_ms": [cores.cpu[f] * 1000 for f in FOLLOWERS],
            "us_per_partition": sum(cores.cpu.values()) / cores.partitions * 1e6,
            **cores.counts}


def consumer_round(cores: Cores, session_id: int) -> tuple[dict[str, Any], int]:
    """A consumer's fetch opening a session over every partition from 0
    (closing the one before, as a new consumer of the same owner would)."""
    gc.collect()  # a full collection now, not inside the round
    cores.reset_counts()
    leader = cores.cores[LEADER]
    request = msgpack.packb({
        "max_wait_ms": 0, "min_bytes": 1, "max_bytes": CONSUMER_MAX_BYTES,
        "session_id": session_id, "session_epoch": 0,
        "partitions": [{"topic": tp.topic, "partition": tp.partition, "offset": 0,
                        "max_bytes": PARTITION_MAX_BYTES, "current_leader_epoch": 0}
                       for tp in cores.tps]})
    body = cores.call(LEADER, lambda: msgpack.unpackb(request))
    request_id = cores.call(LEADER, leader.new_request_id)
    cores.call(LEADER, lambda: leader.fetch(request_id, decode_fetch(body), cores.now_ms))
    actions = cores.call(LEADER, leader.ready)
    (respond,) = [a for a in actions if isinstance(a, Respond) and a.request_id == request_id]
    cores.queue.extend((LEADER, a) for a in actions if a is not respond)
    packed = cores.pack_answer(respond)
    answer = msgpack.unpackb(packed)
    entries = answer.get("partitions") or []
    return ({"leader_ms": cores.cpu[LEADER] * 1000,
             "us_per_partition": cores.cpu[LEADER] / cores.partitions * 1e6,
             "with_records": sum(1 for entry in entries if entry.get("records")),
             "bytes": len(packed)}, answer.get("session_id", 0))


def run(args: argparse.Namespace) -> int:
    for name in ("partitions", "rounds", "records_per_partition"):
        if getattr(args, name) < 1:
            print(f"--{name.replace('_', '-')} must be at least 1", file=sys.stderr)
            return 2
    batch = build_batch([(None, RECORD)] * args.records_per_partition)
    with tempfile.TemporaryDirectory(prefix="kraftlog-bench-cores-", dir=args.dir) as work:
        status(f"opening {args.partitions:,} partitions on each of 3 cores in {work} ...")
        try:
            cores = Cores(work, args.partitions)
        except RuntimeError as exc:
            print(f"bench cores: {exc}", file=sys.stderr)
            return 1
        try:
            produce, consume = [], []
            for number in range(1, args.rounds + 1):
                status(f"produce round {number}/{args.rounds} ...")
                produce.append(produce_round(cores, batch))
            session_id = 0
            for number in range(1, args.rounds + 1):
                status(f"consumer round {number}/{args.rounds} ...")
                result, session_id = consumer_round(cores, session_id)
                consume.append(result)
        except RuntimeError as exc:  # a round that did not complete: say which way
            print(f"bench cores: {exc}", file=sys.stderr)
            return 1
        finally:
            cores.close()
    summary = {"bench": "cores", "partitions": args.partitions,
               "records_per_partition": args.records_per_partition,
               "produce_rounds": produce, "consumer_rounds": consume}
    print(json.dumps(summary, indent=2) if args.json else format_report(summary))
    return 0


def format_report(summary: dict[str, Any]) -> str:
    lines = ["kraftlog bench cores",
             f"  cores    3 replication cores in one process: {summary['partitions']:,} "
             "partitions led by broker 1, followed by 2 and 3 (no sockets, no event loop)",
             f"  load     one batch of {summary['records_per_partition']:,} records of 100 B "
             "per partition per produce round, acks=all", ""]
    rows = [(str(i), f"{r['leader_ms']:.0f}", " / ".join(f"{ms:.0f}" for ms in r["follower_ms"]),
             f"{r['us_per_partition']:.1f}", f"{r['answers']:,}", f"{r['entries']:,}",
             f"{r['with_records']:,}")
            for i, r in enumerate(summary["produce_rounds"], 1)]
    lines.append(format_table(("produce round", "leader ms", "followers ms", "us/partition",
                               "answers", "entries", "with records"), rows,
                              numbers_right=True))
    lines.append("")
    rows = [(str(i), f"{r['leader_ms']:.0f}", f"{r['us_per_partition']:.1f}",
             f"{r['with_records']:,}", f"{r['bytes'] / 1e6:.1f}")
            for i, r in enumerate(summary["consumer_rounds"], 1)]
    lines.append(format_table(("consumer round", "leader ms", "us/partition",
                               "with records", "answer MB"), rows, numbers_right=True))
    return "\n".join(lines)
