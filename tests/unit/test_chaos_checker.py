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
    events.append(drain(0, [(i, f"0-{i}") for i in range(5)] + [(5, "0-5")]))
    events.append(drain(1, []))
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
    events = [e for e in clean_history() if e["type"] != "drain"]
    events.append(drain(0, [(0, "0-0"), (1, "0-1"), (2, "0-2"), (3, "0-3")]))  # no 0-4
    events = [e for e in events if e["type"] != "poll"]
    results = checker.check(events)
    assert results["verdict"] == "fail"
    assert anomalies(results) == {"lost": 1}
    assert results["anomalies"]["lost"]["examples"][0]["value"] == "0-4"
    assert "1 lost" in results["reason"]


def test_a_duplicate_is_reported_without_failing_the_run():
    events = clean_history()
    events.append(drain(1, [(0, "0-3")]))  # 0-3 again, in partition 1
    results = checker.check(events)
    assert anomalies(results) == {"duplicated": 1}
    assert results["anomalies"]["duplicated"]["examples"][0]["positions"] == [(0, 3), (1, 0)]
    assert results["verdict"] == "pass"
    assert "duplicated" not in results["failing"]


def test_reordered_acknowledged_writes_fail_the_run():
    events = [{"type": "run", "t": 0.0}]
    events += [send("0-0", offset=0), send("0-1", offset=1), send("0-2", offset=2)]
    # The log holds 0-1 before 0-0: the acknowledgements named other offsets,
    # so this is also inconsistent; the order check is what this test is about.
    events.append(drain(0, [(0, "0-1"), (1, "0-0"), (2, "0-2")]))
    results = checker.check(events)
    assert results["anomalies"]["reordered"]["count"] == 1
    example = results["anomalies"]["reordered"]["examples"][0]
    assert example["sent_first"]["value"] == "0-0" and example["sent_later"]["value"] == "0-1"
    assert results["verdict"] == "fail"


def test_order_is_per_producer_and_partition():
    """Two producers interleaving in one partition is not reordering."""
    events = [{"type": "run", "t": 0.0},
              send("0-0", offset=1, producer=0), send("1-0", offset=0, producer=1),
              send("0-1", offset=2, producer=0), drain(0, [(0, "1-0"), (1, "0-0"), (2, "0-1")])]
    assert checker.check(events)["verdict"] == "pass"


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
              drain(0, [(0, "0-0"), (1, "0-1")])]
    results = checker.check(events)
    assert anomalies(results) == {"inconsistent": 1}


def test_unexpected_values_fail_the_run():
    events = clean_history()
    events.append(drain(1, [(0, "9-9"), (1, "0-7")]))  # never sent; definitely failed
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


def test_a_consumer_reset_starts_a_new_reading_session():
    events = clean_history()
    events.append(poll(1, 0, [(0, "0-0"), (1, "0-1")]))
    events.append({"type": "consumer-reset", "t": 3.0, "consumer": 1, "partition": 0})
    events.append(poll(1, 0, [(0, "0-0")]))
    assert checker.check(events)["verdict"] == "pass"


def test_without_a_final_read_nothing_is_proven():
    events = [e for e in clean_history() if e["type"] != "drain"]
    results = checker.check(events)
    assert results["verdict"] == "fail"
    assert "no final read" in results["reason"]


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
])
def test_write_outcomes_are_failed_only_when_nothing_was_written(error, outcome):
    assert classify(error)[0] == outcome
