"""What each node process holds while a chaos run goes on, and whether it
keeps growing: a soak's leak check.

``Sampler`` reads, every ``interval_s``, for every running node process:
its resident memory (``VmRSS`` in ``/proc/<pid>/status``), its open file
descriptors (``/proc/<pid>/fd``), among them the segment files (``*.log``)
it has open, and the files it holds open that were deleted (a segment
retention, compaction or truncation removed, still held: the leak that
fills a disk invisibly). Each reading is a ``resources`` event in the
history, so ``kraftlog chaos check`` judges it again from the file alone.

``judge`` (called by the checker) looks at each process (a node id and a
pid: a restarted node is a new process) that lived long enough to judge:
its level early on (the highest reading in the first quarter of its life,
once its first ``WARM_UP_S`` are over) against its level at the end (the
median of its last quarter). A ``resource_growth`` anomaly is: resident
memory past ``rss_bound``; descriptors other than the data files (sockets,
pipes, whatever else) past ``fd_bound``; more than ``DELETED_OPEN_MAX``
deleted files held at the end. Open data files (segments and their
indexes) are reported, not bounded: a partition's log keeps its segments
open, so they grow with the data retention keeps. The bounds are generous on purpose (a log that grows
holds more index entries, caches warm up); a leak grows without end, and
an hour's run shows it.
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


#: Deleted files a process may still hold at the end (a segment whose
#: deletion is under way, ``LogManager._unlink_later``).
DELETED_OPEN_MAX = 16


def read_process(pid: int, data_root: str) -> dict | None:
    """One reading of process ``pid`` (None once it is gone)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            rss_kb = next((int(line.split()[1]) for line in f if line.startswith("VmRSS:")), 0)
        fds = os.listdir(f"/proc/{pid}/fd")
    except (OSError, ValueError):
        return None
    data_files = segments = deleted = 0
    for fd in fds:
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue  # closed meanwhile
        if not target.startswith(data_root):
            continue
        if target.endswith(" (deleted)"):
            deleted += 1
            continue
        data_files += 1
        if target.endswith(".log"):
            segments += 1
    return {"rss_kb": rss_kb, "fds": len(fds), "data_files_open": data_files,
            "segments_open": segments, "deleted_open": deleted}


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
        measures: dict[str, Callable[[dict], int]] = {
            "rss_kb": lambda r: r["rss_kb"],
            "other_fds": lambda r: (r["fds"] - r.get("data_files_open", r["segments_open"])
                                    - r.get("deleted_open", 0)),
            "segments_open": lambda r: r["segments_open"]}
        bounds: dict[str, Callable[[int], int]] = {"rss_kb": rss_bound, "other_fds": fd_bound}
        for key, measure in measures.items():
            start = max(measure(r) for r in early)
            end = int(statistics.median(measure(r) for r in late))
            summary[f"{key}_early"], summary[f"{key}_end"] = start, end
            if key in bounds:
                summary[f"{key}_bound"] = bounds[key](start)
                if end > bounds[key](start):
                    anomalies.append({"node": node, "pid": pid, "resource": key,
                                      "early": start, "end": end, "bound": bounds[key](start)})
        if all("deleted_open" in r for r in late):  # (histories from before it: not judged)
            held = int(statistics.median(r["deleted_open"] for r in late))
            summary["deleted_open_end"] = held
            if held > DELETED_OPEN_MAX:
                anomalies.append({"node": node, "pid": pid, "resource": "deleted_open",
                                  "early": 0, "end": held, "bound": DELETED_OPEN_MAX})
    return summaries, anomalies
