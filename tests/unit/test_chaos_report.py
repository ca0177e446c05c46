"""chaos/report.py: the HTML page of a chaos run, from a synthetic history."""

from __future__ import annotations

import os
import re

from chaos.report import (Buckets, bucket_events, bucket_width, fault_windows, render_report,
                          run_end, write_report)

SCRIPT = "<script>alert('pwned')</script>"


def synthetic_history() -> list[dict]:
    """A 30 s run: 300 sends (one every 0.1 s, 2..24 ms each); those sent in
    the kill-leader window 10..15 s come back unknown (timeout, 10 s) or
    failed, those sent just before it are acknowledged only at 15.3 s;
    a partition fault from 20 s that never ends; live polls; phases; a drain."""
    events: list[dict] = [{
        "type": "run", "t": 0.0, "scenario": "kill-leader", "seed": 7, "duration_s": 30,
        "topic": "chaos", "partitions": 3, "layout": "3 controllers + 3 brokers",
        "started_at": "2026-11-21T10:00:00Z",
        "settings": {"acks": "all", "request.timeout.ms": 10000, "note": "<b>bold</b>"},
    }, {"type": "phase", "t": 0.0, "name": "workload"}]
    offsets = [0, 0, 0]
    for seq in range(300):
        t = seq * 0.1
        partition = seq % 3
        send = {"type": "send", "t": t, "producer": seq % 2, "seq": seq, "key": f"k{seq % 7}",
                "value": f"{seq % 2}-{seq}", "partition": partition}
        if 10.0 <= t < 15.0 and seq % 2 == 0:
            send.update(t_end=t + 10.0, outcome="unknown", offset=None, error="REQUEST_TIMED_OUT")
        elif 10.0 <= t < 15.0:
            send.update(t_end=t + 0.5, outcome="failed", offset=None,
                        error="NOT_LEADER_OR_FOLLOWER")
        elif 9.5 <= t < 10.0:  # acknowledged only after the failover
            send.update(t_end=15.3, outcome="ok", offset=offsets[partition], error=None)
            offsets[partition] += 1
        else:  # 2 .. 24 ms
            send.update(t_end=t + 0.002 + (seq * 37 % 23) / 1000, outcome="ok",
                        offset=offsets[partition], error=None)
            offsets[partition] += 1
        events.append(send)
    for step in range(60):
        events.append({"type": "poll", "t": step * 0.5 + 0.25, "consumer": 0,
                       "partition": step % 3, "records": [[step, f"0-{step}"], [step + 1, "x"]]})
    events += [
        {"type": "nemesis", "t": 10.0, "phase": "start", "fault": "kill-leader", "targets": [4],
         "detail": "killed broker 4 (leader of chaos-0)"},
        {"type": "nemesis", "t": 12.0, "phase": "info", "fault": "kill-leader", "targets": [4],
         "detail": "new leader of chaos-0 is broker 5"},
        {"type": "nemesis", "t": 15.0, "phase": "end", "fault": "kill-leader", "targets": [4],
         "detail": "restarted broker 4"},
        {"type": "nemesis", "t": 20.0, "phase": "start", "fault": "partition", "targets": [5, 6],
         "detail": "cut brokers 5, 6 off from the controllers"},
        {"type": "phase", "t": 30.0, "name": "heal"},
        {"type": "phase", "t": 31.0, "name": "recover"},
        {"type": "phase", "t": 33.0, "name": "drain"},
        {"type": "drain", "t": 33.5, "partition": 0, "records": [[0, "0-0"], [1, "1-3"]]},
        {"type": "phase", "t": 34.0, "name": "check"},
        {"type": "something-new", "t": 34.5, "whatever": [1, 2]},
    ]
    return events


def synthetic_results(**overrides) -> dict:
    results = {
        "scenario": "kill-leader", "seed": 7, "duration_s": 30.0, "verdict": "fail",
        "reason": "2 acknowledged writes lost",
        "counts": {"attempted": 300, "ok": 250, "failed": 25, "unknown": 25,
                   "recovered_unknown": 3, "read": 120, "final_records": 251},
        "anomalies": {
            "lost": {"count": 2, "examples": [{"value": SCRIPT, "offset": 41},
                                              {"value": "1-99", "offset": 42}]},
            "duplicated": {"count": 1, "examples": ["0-12"]},
            "unexpected": {"count": 0, "examples": []},
            "reordered": {"count": 0, "examples": []},
        },
        "failing": ["lost", "unexpected", "inconsistent", "reordered"],
        "faults": [
            {"fault": "kill-leader", "start": 10.0, "end": 15.0, "targets": [4],
             "detail": "killed broker 4 (leader of chaos-0)"},
            {"fault": "partition", "start": 20.0, "end": None, "targets": [5, 6],
             "detail": "cut brokers 5, 6 off from the controllers"},
        ],
        "latency_ms": {"p50": 5.0, "p99": 9.8, "max": 10000.0},
        "throughput": {"ok_per_s": 8.3},
        "unavailable_s": 5.2,
    }
    results.update(overrides)
    return results


def fault_rects(page: str) -> list[str]:
    return re.findall(r'<rect [^>]*class="fault-window"[^>]*>', page)


def attr(tag: str, name: str) -> str:
    return re.search(rf'{name}="([^"]*)"', tag).group(1)


def test_write_report_writes_one_page_with_timeline_fault_windows_and_fail_badge(tmp_path):
    path = write_report(str(tmp_path / "run"), synthetic_history(), synthetic_results())

    assert path == os.path.join(str(tmp_path / "run"), "report.html")
    page = open(path, encoding="utf-8").read()
    assert page.startswith("<!DOCTYPE html>")
    assert page.count("<svg") == 1 and "</svg>" in page
    assert "kraftlog chaos — kill-leader (seed 7)" in page
    assert '<span class="badge fail">FAIL</span>' in page
    assert "2 acknowledged writes lost" in page
    rects = fault_rects(page)
    assert [attr(r, "data-fault") for r in rects] == ["kill-leader", "partition"]
    assert (attr(rects[0], "data-start"), attr(rects[0], "data-end")) == ("10", "15")
    # The partition never ended: it is shaded to the end of the run (the last
    # event, the unknown type at 34.5 s), and flagged open.
    assert (attr(rects[1], "data-start"), attr(rects[1], "data-end")) == ("20", "34.5")
    assert 'data-open="true"' in rects[1] and "data-open" not in rects[0]
    assert page.count('class="fault-label"') == 2
    assert ">kill-leader</text>" in page and ">partition  →</text>" in page
    assert page.count('class="phase-line"') == 5
    # No JavaScript, no fetches.
    assert "<script" not in page.lower()
    assert "http://" not in page.replace('xmlns="http://www.w3.org/2000/svg"', "")
    assert "https://" not in page
    assert 'href="history.jsonl"' in page and 'href="results.json"' in page


def test_data_is_escaped_everywhere():
    page = render_report(synthetic_history(), synthetic_results())

    assert "<script" not in page.lower()
    assert "&lt;script&gt;alert(&#x27;pwned&#x27;)&lt;/script&gt;" in page
    assert "<b>bold</b>" not in page and "&lt;b&gt;bold&lt;/b&gt;" in page


def test_anomaly_table_marks_only_failing_nonzero_counts():
    page = render_report(synthetic_history(), synthetic_results())
    table = page[page.index('<table class="anomalies">'):]
    table = table[:table.index("</table>")]
    rows = re.findall(r"<tr>(.*?)</tr>", table)[1:]
    kinds = [re.search(r"<b>(.*?)</b>", row).group(1) for row in rows]

    # Present kinds and failing kinds, in the checker's order.
    assert kinds == ["lost", "duplicated", "unexpected", "inconsistent", "reordered"]
    bad = [k for k, row in zip(kinds, rows) if 'class="num bad"' in row]
    assert bad == ["lost"]
    assert table.count("<li><code>") == 3
    lost = rows[0]
    assert '<td class="num bad">2</td>' in lost and '<td class="bad">yes</td>' in lost
    duplicated = rows[1]
    assert '<td class="num">1</td>' in duplicated and "<td>no</td>" in duplicated


def test_examples_are_capped_at_five_with_a_note_of_the_rest():
    examples = [{"offset": i} for i in range(8)]
    results = synthetic_results(anomalies={"lost": {"count": 12, "examples": examples}})
    page = render_report(synthetic_history(), results)

    assert page.count("<li><code>") == 5
    assert "… and 7 more" in page


def test_faults_come_from_nemesis_events_when_results_have_none():
    events = synthetic_history()
    results = synthetic_results()
    del results["faults"]
    windows = fault_windows(events, results)

    assert [(w.fault, w.start, w.end, w.targets) for w in windows] == [
        ("kill-leader", 10.0, 15.0, [4]), ("partition", 20.0, None, [5, 6])]
    assert windows[0].detail == "killed broker 4 (leader of chaos-0) → restarted broker 4"
    page = render_report(events, results)
    assert len(fault_rects(page)) == 2
    assert "never ended" in page
    assert "new leader of chaos-0 is broker 5" in page  # the info line, in the notes table


def test_writes_are_bucketed_per_second_by_completion_time():
    events = synthetic_history()
    buckets = bucket_events(events, run_end(events, {}))

    assert isinstance(buckets, Buckets) and buckets.width == 1.0
    assert buckets.count == 35  # 0 .. 34.5 s
    assert sum(buckets.writes["ok"]) == 250
    assert sum(buckets.writes["failed"]) == 25 and sum(buckets.writes["unknown"]) == 25
    # Unknowns sent in 10..15 s time out 10 s later: they land in 20..24.
    assert [i for i, n in enumerate(buckets.writes["unknown"]) if n] == [20, 21, 22, 23, 24]
    assert [i for i, n in enumerate(buckets.writes["failed"]) if n] == [10, 11, 12, 13, 14, 15]
    assert buckets.writes["ok"][5] == 10 and buckets.writes["ok"][12] == 0
    assert buckets.writes["ok"][9] == 5 and buckets.writes["ok"][15] == 15
    assert sum(buckets.reads) == 120
    assert len(buckets.latencies[3]) == 10
    assert all(2.0 - 1e-6 <= v <= 24.0 + 1e-6 for v in buckets.latencies[3])
    late = sorted(round(v) for v in buckets.latencies[15])[-5:]
    assert late == [5400, 5500, 5600, 5700, 5800]


def test_long_runs_use_wider_buckets():
    assert bucket_width(30) == 1.0
    assert bucket_width(2000) == 1.0
    assert bucket_width(2001) == 2.0
    assert bucket_width(9000) == 5.0
    events = [{"type": "run", "t": 0.0, "duration_s": 9000},
              {"type": "send", "t": 8999.0, "t_end": 8999.1, "outcome": "ok"}]
    buckets = bucket_events(events, run_end(events, {}))
    assert (buckets.width, buckets.count) == (5.0, 1800)
    assert buckets.writes["ok"][-1] == 1
    assert "5-second buckets" in render_report(events, {"verdict": "pass"})


def test_empty_history_and_sparse_results_still_render(tmp_path):
    events = [{"type": "run", "t": 0.0, "scenario": "none", "seed": 1, "duration_s": 10}]
    path = write_report(str(tmp_path), events, {"verdict": "pass"})
    page = open(path, encoding="utf-8").read()

    assert "<svg" in page
    assert '<span class="badge pass">PASS</span>' in page
    assert "kraftlog chaos — none (seed 1)" in page
    assert fault_rects(page) == []
    assert "no writes or reads recorded" in page and "no acknowledged writes" in page
    assert "No faults were injected." in page
    assert "The results hold no anomaly counts." in page


def test_garbage_and_missing_keys_do_not_crash():
    events = [{"type": "send", "t": "soon"}, "not a dict", {"type": "send", "t": 1.0},
              {"type": "poll", "t": 2.0, "records": None},
              {"type": "nemesis", "t": 3.0, "phase": "end", "fault": "x", "targets": [1]},
              {"type": "nemesis", "t": 3.0, "phase": "start", "targets": {"odd": True}}]
    results = {"counts": {"ok": "many"}, "anomalies": {"lost": None, "odd": {"count": "?"}},
               "failing": "lost", "faults": [{"fault": "f"}, {"start": 1, "end": 2}, None],
               "latency_ms": [], "verdict": None}
    page = render_report(events, results)

    assert '<span class="badge none">NO VERDICT</span>' in page
    assert len(fault_rects(page)) == 1  # the one fault with a start
    assert render_report([], {}).count("<svg") == 1


def test_not_run_verdict_shows_its_reason():
    page = render_report([{"type": "run", "t": 0.0, "scenario": "kill-leader", "seed": 3}],
                         {"scenario": "kill-leader", "seed": 3, "verdict": "not-run",
                          "reason": "cluster did not start: no active controller in 30 s"})

    assert '<span class="badge not-run">NOT RUN</span>' in page
    assert "cluster did not start: no active controller in 30 s" in page
    assert "FAIL" not in page and "PASS" not in page


def test_a_run_that_never_started_shows_the_config_from_its_results():
    page = render_report([], {"verdict": "not-run", "reason": "no netns",
                              "config": {"scenario": "partition", "brokers": 3}})

    assert '<span class="badge not-run">NOT RUN</span>' in page and "no netns" in page
    assert "<code>brokers</code></td><td>3</td>" in page
    assert "<code>scenario</code></td><td>partition</td>" in page
    assert "No run settings recorded." in render_report([], {})
