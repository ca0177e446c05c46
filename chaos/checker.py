"""The chaos checker: what a run's history says about safety.

A run's history (``history.jsonl``, one event per line; see docs/chaos.md)
records every write attempt with its outcome, every poll of the live
consumers, and a final read of every partition after all faults healed. This
module reads nothing else: it sees the system as its users do.

The anomalies are Jepsen's, from its Kafka and Redpanda analyses:

``lost``
    acknowledged (``ok``), but not in the final read.
``vanished``
    read by a live consumer (so it was committed), but not in the final read.
``duplicated``
    one value at more than one offset. It fails the run when the history's
    producers never retry (``retries`` 0 in the ``workload`` event's
    ``producer`` settings, or no settings given), since then only the broker
    can have written a value twice, and when they retry with idempotence on
    (``enable_idempotence``), which promises no duplicate however often the
    client retries; a producer that retries without idempotence may.
``unexpected``
    read, but never attempted, or attempted and definitely refused
    (``failed``: the broker said nothing was written).
``inconsistent``
    two different values at one offset (two reads disagree, or a read
    disagrees with the offset an acknowledgement named), or an acknowledged
    value found only somewhere other than where its acknowledgement said.
``reordered``
    one producer's acknowledged writes to one partition sit, in the final
    read, in a different order from the order they were sent.
``nonmonotonic``
    a consumer's successive records of a partition whose offsets do not
    increase.
``aborted_read`` (transactional workload)
    a value of a transaction its producer aborted, read by a read_committed
    consumer or the final read.
``partial_transaction`` (transactional workload)
    a transaction some of whose values are in the final read and others
    not: a transaction is visible entirely or not at all, across partitions.
``copy_not_exactly_once`` (transactional workload)
    the consume-transform-produce copier's output against the final read of
    its input and its group's committed offsets: every input record below
    the committed offset of its partition must be copied exactly once, and
    none at or above it (its copy committed without its offset), and no copy
    may name an input record that does not exist.
``skipped``
    a consumer's successive records of a partition that jump over offsets
    the final read holds (without compaction or transactions, offsets are
    contiguous, so a consumer must see every one); a consumer's first record
    after it started at an offset counts too. A final read that is not
    exactly the offsets from 0 to the high watermark it started from is
    reported here as well (with transactions, markers and aborted records
    leave gaps: then only records outside that range are).

``resource_growth``
    a node process whose resident memory, open file descriptors or open
    segment files at the end of its life exceed the bound of its early
    level (``chaos/resources.py``: judged only for processes that lived
    long enough, as in a soak). ``resources`` in the results has every
    process's readings summed up.

A history whose harness failed (``harness-error``, ``workload-error``) gets
the verdict ``unknown``: its final read, if any, cannot be trusted to be
complete, so a pass proves nothing and a failure may be the harness's.

Writes whose outcome is ``unknown`` (a timeout, a connection lost mid-
request, an error after the leader appended) may or may not be in the log;
either is fine. Those found are counted as ``recovered_unknown``.

``check(events)`` is a pure function of the history, so it is tested by
feeding it histories with planted anomalies (tests/unit/test_chaos_checker.py).
"""

from __future__ import annotations

import collections
import statistics
from collections import defaultdict
from collections.abc import Iterable
from typing import Any

from chaos import resources as resource_readings

#: Anomalies that always fail a run.
FAILING = ("lost", "vanished", "unexpected", "inconsistent", "reordered", "nonmonotonic",
           "skipped", "aborted_read", "partial_transaction", "copy_not_exactly_once",
           "resource_growth")
#: Fails the run only when the producers never retry (see the module doc).
DUPLICATED = "duplicated"
ANOMALIES = FAILING + (DUPLICATED,)
#: Examples kept per anomaly kind.
EXAMPLES_MAX = 10
#: Width of the buckets the availability figure counts.
BUCKET_S = 1.0

Position = tuple[int, int]  # (partition, offset)


class _Anomalies:
    def __init__(self) -> None:
        self.counts: dict[str, int] = {kind: 0 for kind in ANOMALIES}
        self.examples: dict[str, list[Any]] = {kind: [] for kind in ANOMALIES}

    def add(self, kind: str, example: Any) -> None:
        self.counts[kind] += 1
        if len(self.examples[kind]) < EXAMPLES_MAX:
            self.examples[kind].append(example)

    def as_dict(self) -> dict[str, dict]:
        return {kind: {"count": self.counts[kind], "examples": self.examples[kind]}
                for kind in ANOMALIES}


def check(events: Iterable[dict]) -> dict[str, Any]:
    """The checker's verdict on a history: counts, anomalies, and ``verdict``
    ``pass``, ``fail`` (a failing anomaly occurred) or ``unknown`` (the
    harness failed, or there is no final read)."""
    sends: dict[str, dict] = {}
    polls: list[dict] = []
    final: dict[Position, str] = {}
    final_where: dict[str, list[Position]] = defaultdict(list)
    anomalies = _Anomalies()
    run: dict = {}
    drain_ends: dict[int, int] | None = None
    harness_errors: list[str] = []
    producer_settings: dict = {}
    copy_offsets: dict[int, int] | None = None
    copies: collections.Counter[str] = collections.Counter()
    readings: list[dict] = []
    for event in events:
        kind = event.get("type")
        if kind == "resources":
            readings.append(event)
        elif kind == "send":
            sends[event["value"]] = event
        elif kind in ("poll", "consumer-start"):
            polls.append(event)
        elif kind == "drain-start":
            drain_ends = {int(p): end for p, end in event["ends"].items()}
        elif kind == "drain":
            for offset, value in event["records"]:
                position = (event["partition"], offset)
                if position in final and final[position] != value:
                    anomalies.add("inconsistent", {"partition": position[0], "offset": offset,
                                                   "values": [final[position], value],
                                                   "seen_by": "final read, twice"})
                    continue
                if position not in final:
                    final[position] = value
                    final_where[value].append(position)
        elif kind == "copy-offsets":
            copy_offsets = {int(p): offset for p, offset in event["offsets"].items()}
        elif kind == "copy-drain":
            copies.update(value for _offset, value in event["records"])
        elif kind == "run":
            run = event
            producer_settings = event.get("producer") or producer_settings
        elif kind == "workload":
            producer_settings = event.get("producer") or producer_settings
        elif kind in ("harness-error", "workload-error"):
            harness_errors.append(event.get("error", kind))

    ok = [s for s in sends.values() if s["outcome"] == "ok"]
    transactional = bool(producer_settings.get("transactional_id"))
    if drain_ends is not None:
        _check_final_read_complete(drain_ends, final, anomalies, gaps_allowed=transactional)
    _check_transactions(sends, final_where, anomalies)
    if copy_offsets is not None:
        _check_copies(final, copy_offsets, copies, anomalies)
    _check_final_read(sends, ok, final, final_where, anomalies)
    polled = _check_polls(polls, sends, final, final_where, anomalies)
    _check_order(ok, final, final_where, anomalies)
    process_summaries, growth = resource_readings.judge(readings)
    for example in growth:
        anomalies.add("resource_growth", example)

    outcomes = {"ok": 0, "failed": 0, "unknown": 0}
    for send in sends.values():
        outcomes[send["outcome"]] += 1
    recovered = sum(1 for s in sends.values()
                    if s["outcome"] == "unknown" and s["value"] in final_where)
    failing = list(FAILING)
    if (not producer_settings.get("retries") or producer_settings.get("enable_idempotence")
            or transactional):
        failing.append(DUPLICATED)
    failing_found = [kind for kind in failing if anomalies.counts[kind]]
    if harness_errors:
        verdict = "unknown"
        reason = f"the harness failed, so the history may be incomplete: {harness_errors[0]}"
    elif drain_ends is None:
        verdict, reason = "unknown", "the history has no final read: nothing can be checked"
    elif failing_found:
        verdict = "fail"
        reason = "; ".join(f"{anomalies.counts[k]} {k}" for k in failing_found)
    else:
        verdict, reason = "pass", None
    return {
        "scenario": run.get("scenario"),
        "seed": run.get("seed"),
        "duration_s": run.get("duration_s"),
        "verdict": verdict,
        "reason": reason,
        "counts": {"attempted": len(sends), **outcomes, "recovered_unknown": recovered,
                   "read": polled, "final_records": len(final)},
        "anomalies": anomalies.as_dict(),
        "failing": failing,
        "resources": process_summaries,
        **_performance(ok),
    }


def _check_final_read_complete(ends: dict[int, int], final: dict[Position, str],
                               anomalies: _Anomalies, gaps_allowed: bool = False) -> None:
    """The final read must hold exactly offsets 0 .. end - 1 of each
    partition (retention is off in chaos runs); with transactions, only
    offsets in that range."""
    by_partition: dict[int, set[int]] = defaultdict(set)
    for partition, offset in final:
        by_partition[partition].add(offset)
    for partition, end in sorted(ends.items()):
        offsets = by_partition.get(partition, set())
        missing = 0 if gaps_allowed else end - len([o for o in offsets if 0 <= o < end])
        extra = sorted(o for o in offsets if not 0 <= o < end)
        if missing or extra:
            anomalies.add("skipped", {"consumer": "final read", "partition": partition,
                                      "high_watermark": end, "missed": missing,
                                      "outside": extra[:10]})


def _check_transactions(sends: dict[str, dict], final_where: dict[str, list[Position]],
                        anomalies: _Anomalies) -> None:
    """Each transaction whole or not at all in the final read; nothing of
    an aborted one anywhere it was read (live reads are checked in
    ``_check_expected``)."""
    by_txn: dict[str, list[dict]] = defaultdict(list)
    for send in sends.values():
        if send.get("txn") is not None:
            by_txn[send["txn"]].append(send)
    for txn, members in sorted(by_txn.items()):
        present = [s["value"] for s in members if s["value"] in final_where]
        if present and len(present) < len(members):
            anomalies.add("partial_transaction", {
                "txn": txn, "outcome": members[0]["outcome"],
                "present": sorted(present)[:10],
                "absent": sorted(s["value"] for s in members
                                 if s["value"] not in final_where)[:10]})


def _check_copies(final: dict[Position, str], committed: dict[int, int],
                  copies: collections.Counter, anomalies: _Anomalies) -> None:
    """Consumed offsets and produced records committed atomically: each
    input record below its partition's committed offset copied once, none
    at or above it."""
    expected: set[str] = set()
    for (partition, offset), value in sorted(final.items()):
        copy = f"{partition}:{offset}:{value}"
        count = copies.get(copy, 0)
        below = offset < committed.get(partition, 0)
        if below:
            expected.add(copy)
        if (below and count != 1) or (not below and count):
            anomalies.add("copy_not_exactly_once", {
                "partition": partition, "offset": offset, "value": value, "copies": count,
                "committed_offset": committed.get(partition, 0)})
    for copy in sorted(set(copies) - expected):
        partition, offset, _ = copy.split(":", 2)
        if (int(partition), int(offset)) not in final:
            anomalies.add("copy_not_exactly_once", {"copy": copy,
                                                    "why": "no such input record"})


def _check_final_read(sends: dict[str, dict], ok: list[dict], final: dict[Position, str],
                      final_where: dict[str, list[Position]], anomalies: _Anomalies) -> None:
    for send in ok:
        value = send["value"]
        acked_at = (send["partition"], send["offset"])
        if value not in final_where:
            anomalies.add("lost", {"value": value, "partition": acked_at[0],
                                   "offset": acked_at[1], "acked_at_s": send.get("t_end")})
        elif final.get(acked_at) != value:
            anomalies.add("inconsistent", {
                "partition": acked_at[0], "offset": acked_at[1],
                "values": [value, final.get(acked_at)],
                "found_at": final_where[value],
                "seen_by": "acknowledgement vs final read"})
    for value, positions in final_where.items():
        if len(positions) > 1:
            anomalies.add("duplicated", {"value": value, "positions": positions})
        _check_expected(value, positions, "final read", sends, anomalies)


def _check_expected(value: str, positions: list[Position], seen_by: str,
                    sends: dict[str, dict], anomalies: _Anomalies) -> None:
    send = sends.get(value)
    if send is None:
        anomalies.add("unexpected", {"value": value, "positions": positions,
                                     "seen_by": seen_by, "why": "never attempted"})
    elif send["outcome"] == "failed" and send.get("txn") is not None:
        anomalies.add("aborted_read", {"value": value, "txn": send["txn"],
                                       "positions": positions, "seen_by": seen_by})
    elif send["outcome"] == "failed":
        anomalies.add("unexpected", {"value": value, "positions": positions,
                                     "seen_by": seen_by,
                                     "why": f"its write failed definitely ({send.get('error')})"})


def _check_polls(polls: list[dict], sends: dict[str, dict], final: dict[Position, str],
                 final_where: dict[str, list[Position]], anomalies: _Anomalies) -> int:
    """Consumers' reads against the final read and against themselves; the
    number of records the live consumers read."""
    last_offset: dict[tuple[Any, int], int] = {}
    reported_values: set[str] = set()
    count = 0
    for poll in polls:
        consumer = poll["consumer"]
        if poll["type"] == "consumer-start":
            # A reading session starts: its next record of each partition
            # must be the one at its starting position.
            for partition, offset in poll["positions"].items():
                last_offset[(consumer, int(partition))] = offset - 1
            continue
        partition = poll["partition"]
        stream = (consumer, partition)
        for offset, value in poll["records"]:
            count += 1
            position = (partition, offset)
            previous = last_offset.get(stream)
            if previous is not None and offset <= previous:
                anomalies.add("nonmonotonic", {"consumer": consumer, "partition": partition,
                                               "offset": offset, "after": previous,
                                               "t": poll.get("t")})
            elif previous is not None and offset > previous + 1:
                missed = [o for o in range(previous + 1, offset) if (partition, o) in final]
                if missed:
                    anomalies.add("skipped", {"consumer": consumer, "partition": partition,
                                              "from": previous, "to": offset,
                                              "missed": len(missed), "t": poll.get("t")})
            last_offset[stream] = offset if previous is None else max(previous, offset)
            if value in reported_values:
                continue
            if position in final and final[position] != value:
                reported_values.add(value)
                anomalies.add("inconsistent", {
                    "partition": partition, "offset": offset,
                    "values": [value, final[position]],
                    "seen_by": f"consumer {consumer} at t={poll.get('t')} vs final read"})
            elif value not in final_where:
                reported_values.add(value)
                if value in sends and sends[value]["outcome"] != "failed":
                    if sends[value]["outcome"] != "ok":  # ok ones are already "lost"
                        anomalies.add("vanished", {"value": value, "partition": partition,
                                                   "offset": offset, "consumer": consumer,
                                                   "t": poll.get("t")})
                else:
                    _check_expected(value, [position], f"consumer {consumer}", sends,
                                    anomalies)
            elif position not in final:
                # Read here, and it is in the log, but elsewhere: the offset
                # the consumer read is gone.
                reported_values.add(value)
                anomalies.add("vanished", {"value": value, "partition": partition,
                                           "offset": offset, "consumer": consumer,
                                           "now_at": final_where[value], "t": poll.get("t")})
    return count


def _check_order(ok: list[dict], final: dict[Position, str],
                 final_where: dict[str, list[Position]], anomalies: _Anomalies) -> None:
    """Each producer's acknowledged writes to a partition, in send order,
    must sit at increasing offsets of the final read."""
    streams: dict[tuple[Any, int], list[dict]] = defaultdict(list)
    for send in ok:
        streams[(send["producer"], send["partition"])].append(send)
    for (producer, partition), writes in streams.items():
        writes.sort(key=lambda s: s["seq"])
        previous: tuple[dict, int] | None = None
        for send in writes:
            if final.get((partition, send["offset"])) == send["value"]:
                offset = send["offset"]  # where it was acknowledged, whatever copies exist
            else:
                offsets = [o for p, o in final_where.get(send["value"], ()) if p == partition]
                if not offsets:
                    continue  # lost, or only in another partition: both reported already
                offset = min(offsets)
            if previous is not None and offset < previous[1]:
                earlier, earlier_offset = previous
                anomalies.add("reordered", {
                    "producer": producer, "partition": partition,
                    "sent_first": {"seq": earlier["seq"], "value": earlier["value"],
                                   "offset": earlier_offset},
                    "sent_later": {"seq": send["seq"], "value": send["value"],
                                   "offset": offset}})
            if previous is None or offset > previous[1]:
                previous = (send, offset)


def _performance(ok: list[dict]) -> dict[str, Any]:
    """Latency of acknowledged writes, their rate, and the seconds of the
    run in which no write was acknowledged."""
    if not ok:
        return {"latency_ms": {}, "throughput": {"ok_per_s": 0.0}, "unavailable_s": None}
    latencies = sorted((s["t_end"] - s["t"]) * 1000 for s in ok)
    first = min(s["t"] for s in ok)
    last = max(s["t_end"] for s in ok)
    span = max(last - first, 1e-9)
    busy = {int(s["t_end"] // BUCKET_S) for s in ok}
    buckets = range(int(first // BUCKET_S), int(last // BUCKET_S) + 1)
    return {
        "latency_ms": {"p50": round(statistics.median(latencies), 2),
                       "p99": round(latencies[min(len(latencies) - 1,
                                                  int(len(latencies) * 0.99))], 2),
                       "max": round(latencies[-1], 2)},
        "throughput": {"ok_per_s": round(len(ok) / span, 1)},
        "unavailable_s": sum(BUCKET_S for b in buckets if b not in busy),
    }
