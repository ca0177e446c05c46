"""The chaos checker against histories with planted anomalies: each kind must
be found, counted exactly, and fail the run (or, for duplicates, be reported
without failing it); a clean history must pass."""

from __future__ import annotations

import pytest

from chaos import checker
from chaos.workload import classify
from api.client.errors import KraftlogError, error_from


def send(value: str, outcome: str = "ok", partition: int = 0, offset: int | None = None,
         producer: int = 0, seq: int | None = None, t: float = 1.0) -> dict:
    return {"type": "send", "t": t, "t_end": t + 0.005, "producer": producer,
            "seq": int(value.split("-")[1]) if seq is None else seq, "key": "k",
            "value": value, "outcome": outcome,
            "partition": partition if outcome == "ok" else None,
            "offset": offset if outcome == "ok" else None,
            "error": None if outcome == "ok" else "REQUEST_TIMED_OUT"}


def drain(partition: int, records: list[tuple[int, str]]) -> dict:
    return {"type": "drain", "t": 50.0, "partition": partition,
            "records": [list(r) for r in records]}


def final_read(**partitions: list[tuple[int, str]]) -> list[dict]:
    """A complete final read: ``p0=[(0, "0-0"), ...]``; each partition's high
    watermark is one past its last offset."""
    ends = {name[1:]: (records[-1][0] + 1 if records else 0)
            for name, records in partitions.items()}
    return [{"type": "drain-start", "t": 49.0, "ends": ends},
            *(drain(int(name[1:]), records) for name, records in partitions.items())]


def without_final_read(events: list[dict]) -> list[dict]:
    return [e for e in events if e["type"] not in ("drain", "drain-start")]


def poll(consumer: int, partition: int, records: list[tuple[int, str]], t: float = 2.0) -> dict:
    return {"type": "poll", "t": t, "consumer": consumer, "partition": partition,
            "records": [list(r) for r in records]}


def clean_history() -> list[dict]:
    """Producer 0 wrote 0-0..0-4 to partition 0 at offsets 0..4; one unknown
    write (0-5) landed, one (0-6) did not; one failed write (0-7)."""
    events = [{"type": "run", "t": 0.0, "scenario": "test", "seed": 3, "duration_s": 10}]
    events += [send(f"0-{i}", offset=i, t=1.0 + i) for i in range(5)]
    events += [send("0-5", "unknown", t=6.0), send("0-6", "unknown", t=7.0),
               send("0-7", "failed", t=8.0)]
    events.append(poll(0, 0, [(0, "0-0"), (1, "0-1")]))
    events.append(poll(0, 0, [(2, "0-2"), (3, "0-3"), (4, "0-4"), (5, "0-5")]))
    events += final_read(p0=[(i, f"0-{i}") for i in range(5)] + [(5, "0-5")], p1=[])
    return events


def anomalies(results: dict) -> dict[str, int]:
    return {kind: a["count"] for kind, a in results["anomalies"].items() if a["count"]}


def test_a_clean_history_passes_with_exact_counts():
    results = checker.check(clean_history())
    assert results["verdict"] == "pass", results["reason"]
    assert anomalies(results) == {}
    assert results["counts"] == {"attempted": 8, "ok": 5, "failed": 1, "unknown": 2,
                                 "recovered_unknown": 1, "read": 6, "final_records": 6}
    assert results["scenario"] == "test" and results["seed"] == 3
    assert results["latency_ms"]["p50"] == pytest.approx(5.0)


def test_a_lost_acknowledged_write_fails_the_run():
    events = [e for e in without_final_read(clean_history()) if e["type"] != "poll"]
    events += final_read(p0=[(0, "0-0"), (1, "0-1"), (2, "0-2"), (3, "0-3")])  # no 0-4
    results = checker.check(events)
    assert results["verdict"] == "fail"
    assert anomalies(results) == {"lost": 1}
    assert results["anomalies"]["lost"]["examples"][0]["value"] == "0-4"
    assert "1 lost" in results["reason"]


def with_a_duplicate() -> list[dict]:
    events = without_final_read(clean_history())
    events += final_read(p0=[(i, f"0-{i}") for i in range(6)], p1=[(0, "0-3")])
    return events


def test_a_duplicate_fails_a_run_whose_producers_never_retry():
    results = checker.check(with_a_duplicate())
    assert anomalies(results) == {"duplicated": 1}
    assert results["anomalies"]["duplicated"]["examples"][0]["positions"] == [(0, 3), (1, 0)]
    assert results["verdict"] == "fail"


def test_a_duplicate_is_only_reported_when_producers_retry_without_idempotence():
    events = with_a_duplicate()
    events[0]["producer"] = {"retries": 5}
    results = checker.check(events)
    assert anomalies(results) == {"duplicated": 1}
    assert results["verdict"] == "pass"
    assert "duplicated" not in results["failing"]


def test_a_duplicate_fails_a_run_whose_producers_retry_with_idempotence():
    # The idempotent workload: the client retries as much as it likes, and
    # not one value may land twice (Jepsen found this in Redpanda 21.10).
    events = with_a_duplicate()
    events[0]["producer"] = {"retries": 2**31 - 1, "enable_idempotence": True}
    results = checker.check(events)
    assert anomalies(results) == {"duplicated": 1}
    assert results["verdict"] == "fail" and "duplicated" in results["failing"]


def test_reordered_acknowledged_writes_fail_the_run():
    events = [{"type": "run", "t": 0.0}]
    events += [send("0-0", offset=0), send("0-1", offset=1), send("0-2", offset=2)]
    # The log holds 0-1 before 0-0: the acknowledgements named other offsets,
    # so this is also inconsistent; the order check is what this test is about.
    events += final_read(p0=[(0, "0-1"), (1, "0-0"), (2, "0-2")])
    results = checker.check(events)
    assert results["anomalies"]["reordered"]["count"] == 1
    example = results["anomalies"]["reordered"]["examples"][0]
    assert example["sent_first"]["value"] == "0-0" and example["sent_later"]["value"] == "0-1"
    assert results["verdict"] == "fail"


def test_order_is_per_producer_and_partition():
    """Two producers interleaving in one partition is not reordering."""
    events = [{"type": "run", "t": 0.0},
              send("0-0", offset=1, producer=0), send("1-0", offset=0, producer=1),
              send("0-1", offset=2, producer=0),
              *final_read(p0=[(0, "1-0"), (1, "0-0"), (2, "0-1")])]
    assert checker.check(events)["verdict"] == "pass"


def test_a_copy_does_not_hide_reordering():
    """0-0 acknowledged at 2 and 0-1 at 1 (reordered); an extra copy of 0-0
    at offset 0 must not make 0-0 look first."""
    events = [{"type": "run", "t": 0.0}, send("0-0", offset=2), send("0-1", offset=1),
              *final_read(p0=[(0, "0-0"), (1, "0-1"), (2, "0-0")])]
    results = checker.check(events)
    assert results["anomalies"]["reordered"]["count"] == 1
    assert results["anomalies"]["duplicated"]["count"] == 1


def test_an_inconsistent_read_fails_the_run():
    events = clean_history()
    events.append(poll(1, 0, [(2, "0-6")]))  # consumer 1 saw 0-6 where the log has 0-2
    results = checker.check(events)
    assert anomalies(results) == {"inconsistent": 1}
    example = results["anomalies"]["inconsistent"]["examples"][0]
    assert (example["partition"], example["offset"], example["values"]) == (0, 2,
                                                                            ["0-6", "0-2"])
    assert results["verdict"] == "fail"


def test_an_acknowledgement_naming_another_offset_is_inconsistent():
    events = [{"type": "run", "t": 0.0}, send("0-0", offset=0), send("0-1", offset=0),
              *final_read(p0=[(0, "0-0"), (1, "0-1")])]
    results = checker.check(events)
    assert anomalies(results) == {"inconsistent": 1}


@pytest.mark.parametrize("found_at", [(0, 3), (1, 0)])
def test_an_acknowledged_value_found_only_elsewhere_is_inconsistent(found_at):
    """Acknowledged at partition 0 offset 5; the log has it only at another
    offset or in another partition, and nothing at 0/5."""
    if found_at == (0, 3):
        logs = {"p0": [(o, "0-0" if o == 3 else f"1-{o}") for o in range(5)], "p1": []}
    else:
        logs = {"p0": [], "p1": [(0, "0-0")]}
    events = [{"type": "run", "t": 0.0}, send("0-0", offset=5)]
    events += [send(f"1-{o}", "unknown", t=2.0) for o in range(5)]
    events += final_read(**logs)
    results = checker.check(events)
    assert anomalies(results) == {"inconsistent": 1}, results["anomalies"]
    assert results["anomalies"]["inconsistent"]["examples"][0]["found_at"] == [found_at]


def test_a_final_read_with_a_hole_fails_the_run():
    events = without_final_read(clean_history())
    events = [e for e in events if e["type"] != "poll"]
    events += final_read(p0=[(0, "0-0"), (1, "0-1"), (2, "0-2"), (3, "0-3"), (4, "0-4"),
                             (6, "0-6")])  # offset 5 missing below the high watermark
    results = checker.check(events)
    assert anomalies(results) == {"skipped": 1}
    assert results["anomalies"]["skipped"]["examples"][0]["missed"] == 1


def test_unexpected_values_fail_the_run():
    events = without_final_read(clean_history())
    events += final_read(p0=[(i, f"0-{i}") for i in range(6)],
                         p1=[(0, "9-9"), (1, "0-7")])  # never sent; definitely failed
    results = checker.check(events)
    assert anomalies(results) == {"unexpected": 2}
    whys = sorted(e["why"] for e in results["anomalies"]["unexpected"]["examples"])
    assert whys[0] == "its write failed definitely (REQUEST_TIMED_OUT)"
    assert whys[1] == "never attempted"


def test_a_read_that_vanished_from_the_log_fails_the_run():
    """0-6 (unknown outcome) was read live, so it was committed; the final
    read must still hold it."""
    events = clean_history()
    events.append(poll(1, 0, [(6, "0-6")]))
    results = checker.check(events)
    assert anomalies(results) == {"vanished": 1}


def test_nonmonotonic_and_skipping_consumers_fail_the_run():
    events = clean_history()
    events.append(poll(1, 0, [(0, "0-0"), (1, "0-1")]))
    events.append(poll(1, 0, [(1, "0-1")]))               # went back
    events.append(poll(1, 0, [(4, "0-4")]))               # jumped over 2 and 3
    results = checker.check(events)
    assert anomalies(results) == {"nonmonotonic": 1, "skipped": 1}
    assert results["anomalies"]["skipped"]["examples"][0]["missed"] == 2


def test_a_consumer_start_begins_a_new_reading_session():
    events = clean_history()
    events.append(poll(1, 0, [(0, "0-0"), (1, "0-1")]))
    events.append({"type": "consumer-start", "t": 3.0, "consumer": 1, "positions": {"0": 0}})
    events.append(poll(1, 0, [(0, "0-0")]))
    assert checker.check(events)["verdict"] == "pass"


def test_a_consumer_whose_first_record_skips_its_start_fails_the_run():
    events = clean_history()
    events.append({"type": "consumer-start", "t": 3.0, "consumer": 1,
                   "positions": {"0": 0, "1": 0}})
    events.append(poll(1, 0, [(3, "0-3")]))  # offsets 0..2 exist
    results = checker.check(events)
    assert anomalies(results) == {"skipped": 1}


def test_a_read_offset_missing_from_the_log_vanished_even_if_the_value_is_elsewhere():
    events = clean_history()
    events.append(poll(1, 0, [(7, "0-0")]))  # the log ends at 5; 0-0 is at 0
    results = checker.check(events)
    assert anomalies(results) == {"vanished": 1}


def test_without_a_final_read_nothing_is_proven():
    results = checker.check(without_final_read(clean_history()))
    assert results["verdict"] == "unknown"
    assert "no final read" in results["reason"]


def test_a_failed_harness_proves_nothing():
    events = clean_history() + [{"type": "harness-error", "t": 60.0,
                                 "error": "TimeoutError: brokers [4] running"}]
    results = checker.check(events)
    assert results["verdict"] == "unknown"
    assert "TimeoutError" in results["reason"]


@pytest.mark.parametrize("error, outcome", [
    (None, "ok"),
    (error_from({"code": "NOT_ENOUGH_REPLICAS", "message": "x"}), "failed"),
    (error_from({"code": "NOT_ENOUGH_REPLICAS_AFTER_APPEND", "message": "x"}), "unknown"),
    (error_from({"code": "NOT_LEADER_OR_FOLLOWER", "message": "x"}), "unknown"),
    (error_from({"code": "REQUEST_TIMED_OUT", "message": "x"}), "unknown"),
    (KraftlogError("BROKER_NOT_AVAILABLE", "POST http://h/v1/produce failed: "
                   "ClientConnectorError: Cannot connect to host h:1"), "failed"),
    (KraftlogError("BROKER_NOT_AVAILABLE", "POST http://h/v1/produce failed: "
                   "ServerDisconnectedError: Server disconnected"), "unknown"),
    (KraftlogError("CLIENT_CLOSED", "the producer closed with the request in flight"),
     "unknown"),
])
def test_write_outcomes_are_failed_only_when_nothing_was_written(error, outcome):
    assert classify(error)[0] == outcome


# -- the transactional workload ----------------------------------------------------------
def txn_history(final_p0, final_p1, outcomes=("ok", "failed")):
    """Two transactions of two values each over partitions 0 and 1: txn 0-1
    with outcome[0], txn 0-2 with outcome[1]; then a final read."""
    events = [{"type": "run", "t": 0.0},
              {"type": "workload", "producer": {"transactional_id": "chaos-1",
                                                "retries": 2**31 - 1}}]
    offsets = {0: 0, 1: 0}
    for seq, (value, partition, txn, outcome) in enumerate((
            ("0-0", 0, "0-1", outcomes[0]), ("0-1", 1, "0-1", outcomes[0]),
            ("0-2", 0, "0-2", outcomes[1]), ("0-3", 1, "0-2", outcomes[1]))):
        ok = outcome == "ok"
        events.append({"type": "send", "t": 1.0, "t_end": 1.1, "producer": 0, "seq": seq,
                       "key": "k", "value": value, "txn": txn, "outcome": outcome,
                       "partition": partition if ok else None,
                       "offset": offsets[partition] if ok else None,
                       "error": None if ok else "TRANSACTION_ABORTED"})
        offsets[partition] += 1
    events.append({"type": "drain-start", "t": 2.0, "ends": {"0": 4, "1": 4}})
    events.append({"type": "drain", "t": 2.0, "partition": 0, "records": final_p0})
    events.append({"type": "drain", "t": 2.0, "partition": 1, "records": final_p1})
    return events


def test_a_clean_transactional_history_passes_with_gaps_for_markers():
    # Committed 0-0/0-1 at offset 0 of each partition; markers and the
    # aborted transaction's records leave the rest of the offsets empty.
    results = checker.check(txn_history([[0, "0-0"]], [[0, "0-1"]]))
    assert results["verdict"] == "pass", results["reason"]


def test_an_aborted_read_fails_the_run():
    results = checker.check(txn_history([[0, "0-0"], [2, "0-2"]], [[0, "0-1"], [2, "0-3"]]))
    assert anomalies(results)["aborted_read"] == 2
    assert results["verdict"] == "fail"


def test_a_transaction_visible_in_part_fails_the_run():
    # The second transaction's outcome is unknown: whole or nothing is fine,
    # half of it is not.
    events = txn_history([[0, "0-0"], [2, "0-2"]], [[0, "0-1"]], outcomes=("ok", "unknown"))
    results = checker.check(events)
    assert anomalies(results) == {"partial_transaction": 1}
    assert results["verdict"] == "fail"
    whole = txn_history([[0, "0-0"], [2, "0-2"]], [[0, "0-1"], [2, "0-3"]],
                        outcomes=("ok", "unknown"))
    assert checker.check(whole)["verdict"] == "pass"


def with_copies(copies: list[str], committed: dict[str, int]) -> list[dict]:
    """The clean transactional history plus the copier's output and offsets."""
    events = txn_history([[0, "0-0"]], [[0, "0-1"]])
    events.append({"type": "copy-offsets", "t": 3.0, "offsets": committed})
    events.append({"type": "copy-drain", "t": 3.0, "partition": 0,
                   "records": [[i, c] for i, c in enumerate(copies)]})
    return events


def test_copies_of_exactly_the_committed_input_pass():
    results = checker.check(with_copies(["0:0:0-0", "1:0:0-1"], {"0": 1, "1": 1}))
    assert results["verdict"] == "pass", results["reason"]
    # Nothing consumed yet (offsets 0) and nothing copied: fine too.
    assert checker.check(with_copies([], {"0": 0, "1": 0}))["verdict"] == "pass"


def test_a_copy_twice_missing_or_without_its_offset_fails_the_run():
    twice = checker.check(with_copies(["0:0:0-0", "0:0:0-0", "1:0:0-1"], {"0": 1, "1": 1}))
    missing = checker.check(with_copies(["0:0:0-0"], {"0": 1, "1": 1}))
    ahead = checker.check(with_copies(["0:0:0-0", "1:0:0-1"], {"0": 1, "1": 0}))
    invented = checker.check(with_copies(["0:0:0-0", "1:0:0-1", "0:7:0-9"],
                                         {"0": 1, "1": 1}))
    for results in (twice, missing, ahead, invented):
        assert anomalies(results) == {"copy_not_exactly_once": 1}, anomalies(results)
        assert results["verdict"] == "fail"


def readings(node: int, pid: int, rss_kb: list[int], fds: int = 50, every_s: float = 10.0,
             segments: int = 4, deleted: int = 0):
    return [{"type": "resources", "t": i * every_s, "node": node, "pid": pid,
             "rss_kb": rss, "fds": fds + 2 * (segments + i) + deleted,
             "data_files_open": 2 * (segments + i), "segments_open": segments + i,
             "deleted_open": deleted} for i, rss in enumerate(rss_kb)]


def test_a_process_whose_memory_keeps_growing_fails_the_run():
    """A soak's leak check: a node process's memory at the end past the
    bound of its early level is resource_growth; a flat one, a restarted
    one (a new pid) and one too short-lived to judge are not."""
    flat = readings(4, 100, [200_000] * 40)
    leaking = readings(5, 200, [200_000 + 20_000 * i for i in range(40)])
    short = readings(6, 300, [100_000, 900_000, 2_000_000])
    results = checker.check(clean_history() + flat + leaking + short)
    assert results["verdict"] == "fail" and results["anomalies"]["resource_growth"]["count"] == 1
    (example,) = results["anomalies"]["resource_growth"]["examples"]
    assert (example["node"], example["pid"], example["resource"]) == (5, 200, "rss_kb")
    judged = {p["node"]: p["judged"] for p in results["resources"]}
    assert judged == {4: True, 5: True, 6: False}
    assert checker.check(clean_history() + flat + short)["verdict"] == "pass"


def test_held_deleted_files_fail_the_run_and_growing_segments_do_not():
    """Open segments grow with the data a log keeps (one per segment, each
    reading here one more): reported, not a failure. Deleted files still
    held open at the end (a segment retention removed) are a leak."""
    growing = readings(4, 100, [200_000] * 40)
    holding = readings(5, 200, [200_000] * 40, deleted=40)
    results = checker.check(clean_history() + growing + holding)
    (example,) = results["anomalies"]["resource_growth"]["examples"]
    assert (example["node"], example["resource"], example["end"]) == (5, "deleted_open", 40)
    summary = {p["node"]: p for p in results["resources"]}
    assert summary[4]["segments_open_end"] > summary[4]["segments_open_early"]
