"""What each node process holds while a chaos run goes on, and whether it
keeps growing: a soak's leak check.

``Sampler`` reads, every ``interval_s``, for every running node process:
its resident memory (``VmRSS`` in ``/proc/<pid>/status``), its open file
descriptors (``/proc/<pid>/fd``) and, among them, the segment files
(``*.log``) it has open. Each reading is a ``resources`` event in the
history, so ``kraftlog chaos check`` judges it again from the file alone.

``judge`` (called by the checker) looks at each process (a node id and a
pid: a restarted node is a new process) that lived long enough to judge:
its level early on (the highest reading in the first quarter of its life,
once its first ``WARM_UP_S`` are over) against its level at the end (the
median of its last quarter). Growth past ``rss_bound``, ``fd_bound`` or
``segment_bound`` is a ``resource_growth`` anomaly. The bounds are
generous on purpose: a log that grows holds more index entries and
segments, and caches warm up; a leak grows without end, and an hour's run
shows it.
"""

from __future__ import annotations

import os
import statistics
import threading
from collections import defaultdict
from collections.abc import Callable, Iterable

#: Seconds between readings.
INTERVAL_S = 10.0
#: A process's first seconds are start-up (logs loaded, caches filled): not judged.
WARM_UP_S = 30.0
#: Processes that lived less than this after warm-up are too short to judge.
JUDGE_SPAN_MIN_S = 120.0
#: Readings a judged process needs after warm-up.
SAMPLES_MIN = 8


def rss_bound(early_kb: int) -> int:
    """Resident memory allowed at the end: half again as much, plus 64 MiB."""
    return int(early_kb * 1.5) + 64 * 1024


def fd_bound(early: int) -> int:
    return early + 64


def segment_bound(early: int) -> int:
    return early * 2 + 16


def read_process(pid: int, data_root: str) -> dict | None:
    """One reading of process ``pid`` (None once it is gone)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            rss_kb = next((int(line.split()[1]) for line in f if line.startswith("VmRSS:")), 0)
        fds = os.listdir(f"/proc/{pid}/fd")
    except (OSError, ValueError):
        return None
    segments = 0
    for fd in fds:
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue  # closed meanwhile
        if target.endswith(".log") and target.startswith(data_root):
            segments += 1
    return {"rss_kb": rss_kb, "fds": len(fds), "segments_open": segments}


class Sampler:
    """A thread recording ``resources`` events until ``stop``."""

    def __init__(self, processes: Callable[[], dict[int, int]], data_root: str,
                 record: Callable[[dict], None], interval_s: float = INTERVAL_S) -> None:
        self._processes = processes  # node id -> pid of its running process
        self._data_root = data_root
        self._record = record
        self._interval_s = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="chaos-resources", daemon=True)

    def start(self) -> "Sampler":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def _run(self) -> None:
        while not self._stop.wait(self._interval_s):
            for node_id, pid in sorted(self._processes().items()):
                reading = read_process(pid, self._data_root)
                if reading is not None:
                    self._record({"type": "resources", "node": node_id, "pid": pid, **reading})


def judge(events: Iterable[dict]) -> tuple[list[dict], list[dict]]:
    """(per-process summaries, growth anomalies) from ``resources`` events."""
    series: dict[tuple[int, int], list[dict]] = defaultdict(list)
    for event in events:
        series[(event["node"], event["pid"])].append(event)
    summaries, anomalies = [], []
    for (node, pid), readings in sorted(series.items()):
        born = readings[0]["t"]
        settled = [r for r in readings if r["t"] - born >= WARM_UP_S]
        summary = {"node": node, "pid": pid, "samples": len(readings),
                   "span_s": round(readings[-1]["t"] - born, 1),
                   "rss_kb_max": max(r["rss_kb"] for r in readings),
                   "fds_max": max(r["fds"] for r in readings),
                   "segments_open_max": max(r["segments_open"] for r in readings),
                   "judged": False}
        summaries.append(summary)
        if (len(settled) < SAMPLES_MIN
                or settled[-1]["t"] - settled[0]["t"] < JUDGE_SPAN_MIN_S):
            continue
        quarter = max(2, len(settled) // 4)
        early, late = settled[:quarter], settled[-quarter:]
        summary["judged"] = True
        for key, bound in (("rss_kb", rss_bound), ("fds", fd_bound),
                           ("segments_open", segment_bound)):
            start = max(r[key] for r in early)
            end = int(statistics.median(r[key] for r in late))
            summary[f"{key}_early"], summary[f"{key}_end"] = start, end
            summary[f"{key}_bound"] = bound(start)
            if end > bound(start):
                anomalies.append({"node": node, "pid": pid, "resource": key, "early": start,
                                  "end": end, "bound": bound(start)})
    return summaries, anomalies
