"""One self-contained HTML page for a chaos run: ``report.html``.

Why: after a chaos run people look at a picture, not at ``history.jsonl``.
The page answers three questions at a glance: did the run pass (a big
badge), what did the faults do to the clients (a timeline of writes/s,
reads/s and write latency with every fault window shaded and named), and
what exactly went wrong (the checker's anomalies with examples, the counts,
the fault log). The run's settings and links to the raw files sit at the
bottom for whoever has to dig further.

Inputs are the parsed lines of ``history.jsonl`` (``events``; ``t`` is
seconds since the run started) and the checker's ``results`` dict. Any key
may be missing (an older results file, a run that never got going): the page
renders what exists and never raises on odd data.

The page needs nothing but a browser: inline CSS and inline SVG, no
JavaScript, no fetches. Everything taken from the data is escaped.
Standard library only.
"""

from __future__ import annotations

import html
import json
import math
import os
import statistics
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

REPORT_FILE = "report.html"
HISTORY_FILE = "history.jsonl"
RESULTS_FILE = "results.json"

#: Above this many 1-second buckets the timeline uses wider buckets.
MAX_BUCKETS = 2000
#: Examples shown per anomaly kind; each cut to this many characters.
MAX_EXAMPLES = 5
MAX_EXAMPLE_CHARS = 400

OUTCOMES = ("ok", "failed", "unknown")
OUTCOME_COLORS = {"ok": "#2f9e44", "failed": "#f08c00", "unknown": "#e03131"}
READS_COLOR = "#1c7ed6"
P50_COLOR = "#5f3dc4"
MAX_COLOR = "#b9a7f5"
FAULT_COLOR = "#fab005"
FAULT_TEXT_COLOR = "#8a5a00"
PHASE_COLOR = "#495057"

#: The checker's anomaly kinds in the order the table lists them, with a
#: one-line hint for readers who do not know the checker by heart.
ANOMALY_HINTS = {
    "lost": "an acknowledged write is missing from the final log",
    "duplicated": "one value at more than one offset",
    "unexpected": "a record nobody wrote (or whose send failed) was read",
    "inconsistent": "two different values at one offset (in reads or acknowledgements)",
    "reordered": "a producer's writes appear out of send order in a partition",
    "nonmonotonic": "a consumer's successive offsets did not increase",
    "skipped": "a consumer jumped over offsets that hold records",
    "vanished": "a record read live is gone from the final log",
    "aborted_read": "a record of an aborted transaction was read (read_committed)",
    "partial_transaction": "a transaction is in the final log in part, not whole or not at all",
    "copy_not_exactly_once": "the copier's output is not each consumed record exactly once",
}

VERDICTS = {
    "pass": ("PASS", "pass"),
    "fail": ("FAIL", "fail"),
    "not-run": ("NOT RUN", "not-run"),
}


# -- small helpers ------------------------------------------------------------------


def _e(value: Any) -> str:
    """``value`` as text, escaped for HTML text and attribute values."""
    return html.escape(str(value), quote=True)


def _num(value: Any) -> float | None:
    """``value`` as a finite float, or None (bools and junk are not numbers)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def _dict(value: Any) -> dict:
    return value if isinstance(value, dict) else {}


def _list(value: Any) -> list:
    return value if isinstance(value, list) else []


def _json(value: Any, limit: int = MAX_EXAMPLE_CHARS) -> str:
    """Compact JSON for a table cell, cut to ``limit`` characters."""
    try:
        text = json.dumps(value, default=str, ensure_ascii=False, separators=(", ", ": "))
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= limit else text[:limit - 1] + "…"


def _fmt_s(seconds: float | None) -> str:
    if seconds is None:
        return "—"
    return f"{seconds:.1f} s" if abs(seconds) < 100 else f"{seconds:.0f} s"


def _fmt_ms(ms: float | None) -> str:
    if ms is None:
        return "—"
    if ms >= 1000:
        return f"{ms / 1000:.2f} s"
    return f"{ms:.1f} ms" if ms < 100 else f"{ms:.0f} ms"


def _fmt_decade(ms: float) -> str:
    """A log-axis tick: 0.1 ms, 1 ms, 10 ms, 100 ms, 1 s, 10 s."""
    return f"{ms / 1000:g} s" if ms >= 1000 else f"{ms:g} ms"


def _fmt_num(value: Any) -> str:
    number = _num(value)
    if number is None:
        return "—" if value is None else _e(value)
    return f"{number:,.0f}" if number == int(number) else f"{number:,.2f}"


def _fmt_targets(targets: Any) -> str:
    if isinstance(targets, list):
        return ", ".join(str(t) for t in targets) or "—"
    return "—" if targets is None else str(targets)


def _events(events: Iterable[Any], kind: str) -> list[dict]:
    """The events of one ``type`` with a usable ``t``, in time order."""
    found = [e for e in events if isinstance(e, dict) and e.get("type") == kind
             and _num(e.get("t")) is not None]
    return sorted(found, key=lambda e: e["t"])


# -- the run's shape: its end, its faults, its phases ---------------------------------


@dataclass
class FaultWindow:
    fault: str
    start: float
    end: float | None  # None: never ended, so lasts to the end of the run
    targets: Any = None
    detail: str = ""


def run_info(events: list[dict]) -> dict:
    """The ``run`` event (the first one), or {}."""
    for event in events:
        if isinstance(event, dict) and event.get("type") == "run":
            return event
    return {}


def run_end(events: list[dict], results: dict) -> float:
    """Where the time axis ends: the last thing that happened, at least the
    planned duration, and at least one second."""
    end = 1.0
    for value in (results.get("duration_s"), run_info(events).get("duration_s")):
        if _num(value) is not None:
            end = max(end, _num(value))
    for event in events:
        if isinstance(event, dict):
            for key in ("t", "t_end"):
                if _num(event.get(key)) is not None:
                    end = max(end, _num(event[key]))
    for fault in fault_windows(events, results):
        end = max(end, fault.start, fault.end or 0.0)
    return end


def fault_windows(events: list[dict], results: dict) -> list[FaultWindow]:
    """The fault windows: the checker's list when it has one, else paired up
    from the nemesis start/end events."""
    listed = results.get("faults")
    if isinstance(listed, list):
        windows = []
        for item in listed:
            item = _dict(item)
            start = _num(item.get("start"))
            if start is None:
                continue
            windows.append(FaultWindow(str(item.get("fault", "fault")), start,
                                       _num(item.get("end")), item.get("targets"),
                                       str(item.get("detail") or "")))
        return windows
    return windows_from_nemesis(events)


def windows_from_nemesis(events: list[dict]) -> list[FaultWindow]:
    """Pair each nemesis ``start`` with the next ``end`` of the same fault and
    targets; a start that never ends stays open."""
    windows: list[FaultWindow] = []
    open_windows: dict[str, list[FaultWindow]] = {}
    for event in _events(events, "nemesis"):
        key = _json([event.get("fault"), event.get("targets")], limit=10_000)
        phase = event.get("phase")
        if phase == "start":
            window = FaultWindow(str(event.get("fault", "fault")), event["t"], None,
                                 event.get("targets"), str(event.get("detail") or ""))
            windows.append(window)
            open_windows.setdefault(key, []).append(window)
        elif phase == "end" and open_windows.get(key):
            window = open_windows[key].pop(0)
            window.end = event["t"]
            end_detail = str(event.get("detail") or "")
            if end_detail and end_detail != window.detail:
                window.detail = f"{window.detail} → {end_detail}" if window.detail else end_detail
    return windows


def phase_marks(events: list[dict]) -> list[tuple[float, str]]:
    return [(e["t"], str(e.get("name", "phase"))) for e in _events(events, "phase")]


# -- bucketing ----------------------------------------------------------------------


@dataclass
class Buckets:
    """Per-bucket series for the timeline; bucket i covers
    [i * width, (i + 1) * width) seconds."""
    width: float
    count: int
    writes: dict[str, list[int]] = field(default_factory=dict)  # outcome -> counts
    reads: list[int] = field(default_factory=list)
    latencies: list[list[float]] = field(default_factory=list)  # ms, ok writes only

    def rate(self, counts: list[int]) -> list[float]:
        return [c / self.width for c in counts]

    @property
    def span(self) -> float:
        return self.count * self.width


def bucket_width(span: float, max_buckets: int = MAX_BUCKETS) -> float:
    """1 second, or the smallest 1-2-5 step that keeps the buckets at most
    ``max_buckets``."""
    if span / 1.0 <= max_buckets:
        return 1.0
    return nice_step(span / max_buckets, round_up=True)


def bucket_events(events: list[dict], span: float) -> Buckets:
    """Writes by outcome (by completion time ``t_end``), records read by live
    consumers (by poll time) and ok-write latencies, per bucket."""
    width = bucket_width(span)
    count = max(1, math.ceil(span / width - 1e-9))
    buckets = Buckets(width, count, {o: [0] * count for o in OUTCOMES}, [0] * count,
                      [[] for _ in range(count)])

    def index(t: float) -> int:
        return min(count - 1, max(0, int(t // width)))

    for send in _events(events, "send"):
        done = _num(send.get("t_end"))
        done = send["t"] if done is None else done
        outcome = send.get("outcome")
        if outcome not in OUTCOMES:
            outcome = "unknown"
        i = index(done)
        buckets.writes[outcome][i] += 1
        if outcome == "ok":
            buckets.latencies[i].append(max(0.0, done - send["t"]) * 1000.0)
    for poll in _events(events, "poll"):
        buckets.reads[index(poll["t"])] += len(_list(poll.get("records")))
    return buckets


# -- scales -------------------------------------------------------------------------


def nice_step(raw: float, round_up: bool = False) -> float:
    """A 1, 2 or 5 times a power of ten near ``raw`` (at least ``raw`` if
    ``round_up``)."""
    if raw <= 0:
        return 1.0
    power = 10 ** math.floor(math.log10(raw))
    for mult in (1, 2, 5, 10):
        if (round_up and mult * power >= raw - 1e-12) or \
                (not round_up and mult * power >= raw / 1.5):
            return mult * power
    return 10 * power


@dataclass
class LinearScale:
    lo: float
    hi: float
    out_lo: float
    out_hi: float

    def __call__(self, value: float) -> float:
        span = (self.hi - self.lo) or 1.0
        return self.out_lo + (value - self.lo) / span * (self.out_hi - self.out_lo)

    def ticks(self, target: int = 8) -> list[float]:
        step = nice_step((self.hi - self.lo) / target)
        first = math.ceil(self.lo / step - 1e-9)
        return [round(k * step, 10) for k in range(first, int(self.hi / step + 1e-9) + 1)]


@dataclass
class LogScale:
    lo: float  # powers of ten
    hi: float
    out_lo: float
    out_hi: float

    def __call__(self, value: float) -> float:
        value = min(max(value, self.lo), self.hi)
        frac = (math.log10(value) - math.log10(self.lo)) / (math.log10(self.hi / self.lo) or 1.0)
        return self.out_lo + frac * (self.out_hi - self.out_lo)

    def ticks(self) -> list[float]:
        first, last = round(math.log10(self.lo)), round(math.log10(self.hi))
        return [10.0 ** k for k in range(first, last + 1)]


def latency_range(values: list[float]) -> tuple[float, float]:
    """Decades that hold every latency, at least 1 ms .. 1 s, so a 5 ms
    write and a 10 s timeout share one readable axis."""
    positive = [v for v in values if v > 0]
    lo, hi = 1.0, 1000.0
    if positive:
        lo = min(lo, 10.0 ** math.floor(math.log10(min(positive))))
        hi = max(hi, 10.0 ** math.ceil(math.log10(max(positive))))
    return max(lo, 0.01), hi


def linear_max(value: float) -> float:
    """A round axis top at or above ``value``."""
    if value <= 0:
        return 1.0
    step = nice_step(value / 5, round_up=True)
    return math.ceil(value / step - 1e-9) * step


# -- svg helpers --------------------------------------------------------------------


def _attrs(attrs: dict[str, Any]) -> str:
    parts = []
    for key, value in attrs.items():
        if value is None:
            continue
        if isinstance(value, float):
            value = f"{value:.1f}"
        parts.append(f'{key.rstrip("_").replace("_", "-")}="{_e(value)}"')
    return " ".join(parts)


def svg_el(tag: str, content: str | None = None, **attrs: Any) -> str:
    """One SVG element; ``content`` is markup (escape text before passing)."""
    opening = f"<{tag} {_attrs(attrs)}" if attrs else f"<{tag}"
    return f"{opening}/>" if content is None else f"{opening}>{content}</{tag}>"


def svg_text(x: float, y: float, text: str, **attrs: Any) -> str:
    return svg_el("text", _e(text), x=x, y=y, **attrs)


def _pt(x: float, y: float) -> str:
    return f"{x:.1f},{y:.1f}"


def step_area(xs: list[tuple[float, float]], bottoms: list[float], tops: list[float]) -> str:
    """Path data for a stepped band between ``bottoms`` and ``tops``, one
    flat step per bucket (``xs`` holds each bucket's left and right x)."""
    upper = [f"{_pt(x0, y)} {_pt(x1, y)}" for (x0, x1), y in zip(xs, tops)]
    lower = [f"{_pt(x1, y)} {_pt(x0, y)}" for (x0, x1), y in reversed(list(zip(xs, bottoms)))]
    return "M" + " L".join(upper + lower) + " Z"


def broken_line(points: list[tuple[float, float] | None]) -> tuple[str, list[tuple[float, float]]]:
    """Path data joining consecutive points, broken where a point is None;
    also the isolated points, which a line alone would not show."""
    runs: list[list[tuple[float, float]]] = [[]]
    for point in points:
        if point is None:
            if runs[-1]:
                runs.append([])
        else:
            runs[-1].append(point)
    path = " ".join("M" + " L".join(_pt(*p) for p in run) for run in runs if len(run) > 1)
    lonely = [run[0] for run in runs if len(run) == 1]
    return path, lonely


# -- the timeline figure ------------------------------------------------------------

WIDTH = 1000
LEFT, RIGHT = 70, 16
PANEL_A_H, PANEL_B_H, PANEL_GAP = 160, 140, 30
LANE_H = 15


def _label_lanes(windows: list[FaultWindow], x: LinearScale) -> list[int]:
    """A text row for each fault label so overlapping windows' names do not
    print over each other."""
    lane_ends: list[float] = []
    lanes = []
    for window in windows:
        left = x(window.start) + 3
        right = left + 6.5 * len(window.fault) + 6
        for lane, end in enumerate(lane_ends):
            if end <= left:
                lane_ends[lane] = right
                lanes.append(lane)
                break
        else:
            lane_ends.append(right)
            lanes.append(len(lane_ends) - 1)
    return lanes


def _legend(y: float) -> str:
    items = [("rect", OUTCOME_COLORS["ok"], "writes ok"),
             ("rect", OUTCOME_COLORS["failed"], "failed"),
             ("rect", OUTCOME_COLORS["unknown"], "unknown"),
             ("line", READS_COLOR, "reads (live)"),
             ("line", P50_COLOR, "latency p50"),
             ("line", MAX_COLOR, "latency max"),
             ("fault", FAULT_COLOR, "fault window"),
             ("dash", PHASE_COLOR, "phase")]
    parts, x = [], LEFT
    for kind, color, label in items:
        if kind == "rect":
            parts.append(svg_el("rect", x=x, y=y - 9, width=12, height=10, fill=color))
        elif kind == "fault":
            parts.append(svg_el("rect", x=x, y=y - 9, width=12, height=10, fill=color,
                                fill_opacity=0.3, stroke=color))
        else:
            parts.append(svg_el("line", x1=x, y1=y - 4, x2=x + 12, y2=y - 4, stroke=color,
                                stroke_width=1.5 if kind == "dash" else 2.5,
                                stroke_dasharray="4 3" if kind == "dash" else None))
        parts.append(svg_text(x + 16, y, label, class_="legend"))
        x += 16 + 6.6 * len(label) + 18
    return "".join(parts)


def _writes_panel(b: Buckets, xs: list[tuple[float, float]], top: float) -> tuple[str, LinearScale]:
    """Panel (a): stacked writes/s by outcome and the reads/s line."""
    bottom = top + PANEL_A_H
    rates = {o: b.rate(b.writes[o]) for o in OUTCOMES}
    reads = b.rate(b.reads)
    stacked = [sum(rates[o][i] for o in OUTCOMES) for i in range(b.count)]
    y = LinearScale(0.0, linear_max(max(stacked + reads + [0.0])), bottom, top)
    parts = [_y_grid(y, y.ticks(4), lambda v: f"{v:g}")]
    base = [0.0] * b.count
    for outcome in OUTCOMES:
        if not any(rates[outcome]):
            continue
        new = [base[i] + rates[outcome][i] for i in range(b.count)]
        parts.append(svg_el("path", d=step_area(xs, [y(v) for v in base], [y(v) for v in new]),
                            fill=OUTCOME_COLORS[outcome], fill_opacity=0.85,
                            class_=f"writes-{outcome}"))
        base = new
    if any(reads):
        points = " ".join(f"{_pt(x0, y(r))} {_pt(x1, y(r))}" for (x0, x1), r in zip(xs, reads))
        parts.append(svg_el("polyline", points=points, fill="none", stroke=READS_COLOR,
                            stroke_width=1.2, class_="reads"))
    if not any(stacked) and not any(reads):
        parts.append(svg_text((xs[0][0] + xs[-1][1]) / 2, (top + bottom) / 2,
                              "no writes or reads recorded", class_="empty", text_anchor="middle"))
    parts.append(_y_title(top, bottom, "ops / s"))
    return "".join(parts), y


def _latency_panel(b: Buckets, xs: list[tuple[float, float]], top: float) -> str:
    """Panel (b): per-bucket p50 and max latency of acknowledged writes."""
    bottom = top + PANEL_B_H
    every = [v for bucket in b.latencies for v in bucket]
    lo, hi = latency_range(every)
    y = LogScale(lo, hi, bottom, top)
    parts = [_y_grid(y, y.ticks(), _fmt_decade)]
    for name, pick, color, width in (("latency-max", max, MAX_COLOR, 1.5),
                                     ("latency-p50", statistics.median, P50_COLOR, 2.0)):
        points = [((x0 + x1) / 2, y(pick(vals))) if vals else None
                  for (x0, x1), vals in zip(xs, b.latencies)]
        path, lonely = broken_line(points)
        if path:
            parts.append(svg_el("path", d=path, fill="none", stroke=color, stroke_width=width,
                                stroke_linejoin="round", class_=name))
        parts.extend(svg_el("circle", cx=px, cy=py, r=2.2, fill=color) for px, py in lonely)
    if not every:
        parts.append(svg_text((xs[0][0] + xs[-1][1]) / 2, (top + bottom) / 2,
                              "no acknowledged writes", class_="empty", text_anchor="middle"))
    parts.append(_y_title(top, bottom, "write latency (log)"))
    return "".join(parts)


def _y_grid(y: LinearScale | LogScale, ticks: list[float], fmt) -> str:
    parts = []
    for value in ticks:
        py = y(value)
        parts.append(svg_el("line", x1=LEFT, y1=py, x2=WIDTH - RIGHT, y2=py, class_="grid"))
        parts.append(svg_text(LEFT - 6, py + 3.5, fmt(value), class_="tick", text_anchor="end"))
    return "".join(parts)


def _y_title(top: float, bottom: float, text: str) -> str:
    cy = (top + bottom) / 2
    return svg_text(16, cy, text, class_="axis-title", text_anchor="middle",
                    transform=f"rotate(-90 16 {cy:.1f})")


def _x_axis(x: LinearScale, y0: float) -> str:
    parts = [svg_el("line", x1=LEFT, y1=y0, x2=WIDTH - RIGHT, y2=y0, class_="axis")]
    for value in x.ticks(10):
        px = x(value)
        parts.append(svg_el("line", x1=px, y1=y0, x2=px, y2=y0 + 4, class_="axis"))
        parts.append(svg_text(px, y0 + 16, f"{value:g}", class_="tick", text_anchor="middle"))
    parts.append(svg_text((LEFT + WIDTH - RIGHT) / 2, y0 + 34, "seconds since the run started",
                          class_="axis-title", text_anchor="middle"))
    return "".join(parts)


def _fault_layer(windows: list[FaultWindow], x: LinearScale, run_stop: float,
                 strip_top: float, bottom: float) -> str:
    """Shaded rectangles across both panels, each named in the strip above."""
    lanes = _label_lanes(windows, x)
    parts = []
    for window, lane in zip(windows, lanes):
        end = run_stop if window.end is None else max(window.end, window.start)
        x0, x1 = x(window.start), x(end)
        ends = "(never ended)" if window.end is None else f"– {window.end:.1f} s"
        tip = f"{window.fault} [{_fmt_targets(window.targets)}] {window.start:.1f} s {ends}"
        if window.detail:
            tip += f": {window.detail}"
        ly = strip_top + LANE_H * (lane + 1) - 4
        parts.append(svg_el(
            "rect", svg_el("title", _e(tip)), x=x0, y=ly - 10, width=max(x1 - x0, 1.5),
            height=bottom - (ly - 10), class_="fault-window", data_fault=window.fault,
            data_start=f"{window.start:g}", data_end=f"{end:g}",
            data_open="true" if window.end is None else None))
        label = window.fault + ("  →" if window.end is None else "")
        parts.append(svg_text(x0 + 3, ly, label, class_="fault-label"))
    return "".join(parts)


def _phase_layer(phases: list[tuple[float, str]], x: LinearScale, a_top: float,
                 a_bottom: float, bottom: float) -> str:
    """Dashed lines at phase changes, named in the gap between the panels: to
    the right of the line, or to its left where the plot ends; in the first
    of two rows with room, else only in the line's tooltip."""
    parts: list[str] = []
    taken: list[list[tuple[float, float]]] = [[], []]  # label spans per row
    for t, name in phases:
        px = x(t)
        parts.append(svg_el("line", svg_el("title", _e(f"{name} at {t:.1f} s")),
                            x1=px, y1=a_top, x2=px, y2=bottom, class_="phase-line"))
        width = 6.0 * len(name) + 4
        right_side = px + 3 + width <= WIDTH - 2  # the right margin may hold it
        span = (px + 3, px + 3 + width) if right_side else (px - 3 - width, px - 3)
        for row, spans in enumerate(taken):
            if all(span[1] <= lo or span[0] >= hi for lo, hi in spans):
                spans.append(span)
                parts.append(svg_text(px + 3 if right_side else px - 3, a_bottom + 11 + 11 * row,
                                      name, class_="phase-label",
                                      text_anchor=None if right_side else "end"))
                break
    return "".join(parts)


def render_timeline(events: list[dict], results: dict) -> str:
    """The figure: (a) writes/s by outcome and reads/s, (b) write latency,
    sharing one time axis; fault windows shaded, phases dashed."""
    stop = run_end(events, results)
    buckets = bucket_events(events, stop)
    windows = fault_windows(events, results)
    x = LinearScale(0.0, buckets.span, LEFT, WIDTH - RIGHT)
    lanes = max([lane + 1 for lane in _label_lanes(windows, x)] + [1])

    strip_top = 26
    a_top = strip_top + LANE_H * lanes + 4
    a_bottom = a_top + PANEL_A_H
    b_top = a_bottom + PANEL_GAP
    b_bottom = b_top + PANEL_B_H
    height = b_bottom + 44

    xs = [(x(i * buckets.width), x((i + 1) * buckets.width)) for i in range(buckets.count)]
    writes, _ = _writes_panel(buckets, xs, a_top)
    width_note = "" if buckets.width == 1 else f"{buckets.width:g}-second buckets"
    body = [
        svg_el("rect", x=0, y=0, width=WIDTH, height=height, fill="#ffffff"),
        _legend(14),
        svg_el("rect", x=LEFT, y=a_top, width=WIDTH - LEFT - RIGHT, height=PANEL_A_H,
               class_="panel"),
        svg_el("rect", x=LEFT, y=b_top, width=WIDTH - LEFT - RIGHT, height=PANEL_B_H,
               class_="panel"),
        writes,
        _latency_panel(buckets, xs, b_top),
        _fault_layer(windows, x, stop, strip_top, b_bottom),
        _phase_layer(phase_marks(events), x, a_top, a_bottom, b_bottom),
        _x_axis(x, b_bottom),
    ]
    if width_note:
        body.append(svg_text(WIDTH - RIGHT, height - 10, width_note, class_="tick",
                             text_anchor="end"))
    return svg_el("svg", "".join(body), xmlns="http://www.w3.org/2000/svg",
                  viewBox=f"0 0 {WIDTH} {height}", class_="timeline", role="img",
                  aria_label="writes, reads and latency over time, with fault windows")


# -- tables -------------------------------------------------------------------------


def _table(headers: list[str], rows: list[str], cls: str = "") -> str:
    head = "".join(f"<th>{_e(h)}</th>" for h in headers)
    attr = f' class="{_e(cls)}"' if cls else ""
    return f"<table{attr}><thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>"


def _row(cells: list[str]) -> str:
    """A table row; cells are markup already (escape data before passing)."""
    return "<tr>" + "".join(c if c.startswith("<td") else f"<td>{c}</td>" for c in cells) + "</tr>"


def anomaly_table(results: dict) -> str:
    anomalies = _dict(results.get("anomalies"))
    failing = {str(k) for k in _list(results.get("failing"))}
    kinds = [k for k in ANOMALY_HINTS if k in anomalies or k in failing]
    kinds += sorted(str(k) for k in anomalies if k not in ANOMALY_HINTS)
    kinds += sorted(k for k in failing if k not in kinds)
    if not kinds:
        return '<p class="muted">The results hold no anomaly counts.</p>'
    rows = []
    for kind in kinds:
        entry = _dict(anomalies.get(kind))
        count = _num(entry.get("count"))
        examples = _list(entry.get("examples"))
        fails = kind in failing
        bad = fails and bool(count)
        shown = "".join(f"<li><code>{_e(_json(ex))}</code></li>"
                        for ex in examples[:MAX_EXAMPLES])
        more = (count or len(examples)) - min(len(examples), MAX_EXAMPLES)
        if shown and more > 0:
            shown += f'<li class="muted">… and {more:,.0f} more</li>'
        hint = ANOMALY_HINTS.get(kind, "")
        rows.append(_row([
            f'<td class="kind"><b>{_e(kind)}</b><br><span class="muted">{_e(hint)}</span></td>',
            f'<td class="num{" bad" if bad else ""}">{_fmt_num(entry.get("count"))}</td>',
            '<td class="bad">yes</td>' if bad else ("yes" if fails else "no"),
            f'<td class="examples"><ul>{shown}</ul></td>' if shown else "<td></td>",
        ]))
    return _table(["anomaly", "count", "fails the run", "examples"], rows, "anomalies")


def summary_cards(results: dict) -> str:
    """Counts, latency, throughput and unavailability as labelled figures."""
    counts = _dict(results.get("counts"))
    latency = _dict(results.get("latency_ms"))
    throughput = _dict(results.get("throughput"))
    groups = [
        ("writes", [("attempted", _fmt_num(counts.get("attempted"))),
                    ("ok", _fmt_num(counts.get("ok"))),
                    ("failed", _fmt_num(counts.get("failed"))),
                    ("unknown", _fmt_num(counts.get("unknown"))),
                    ("unknown, later found", _fmt_num(counts.get("recovered_unknown")))]),
        ("reads", [("read live", _fmt_num(counts.get("read"))),
                   ("final records", _fmt_num(counts.get("final_records")))]),
        ("latency (ok writes)", [("p50", _e(_fmt_ms(_num(latency.get("p50"))))),
                                 ("p99", _e(_fmt_ms(_num(latency.get("p99"))))),
                                 ("max", _e(_fmt_ms(_num(latency.get("max")))))]),
        ("availability", [("ok writes / s", _fmt_num(throughput.get("ok_per_s"))),
                          ("unavailable", _e(_fmt_s(_num(results.get("unavailable_s")))))]),
    ]
    html_groups = []
    for title, items in groups:
        cells = "".join(f'<div class="stat"><div class="value">{value}</div>'
                        f'<div class="label">{_e(label)}</div></div>' for label, value in items)
        html_groups.append(f'<div class="group"><h3>{_e(title)}</h3>'
                           f'<div class="stats">{cells}</div></div>')
    return f'<div class="groups">{"".join(html_groups)}</div>'


def fault_table(events: list[dict], results: dict) -> str:
    stop = run_end(events, results)
    rows = []
    for w in sorted(fault_windows(events, results), key=lambda w: w.start):
        if w.end is None:
            end, duration = "never ended", f"≥ {_fmt_s(stop - w.start)}"
        else:
            end, duration = _fmt_s(w.end), _fmt_s(w.end - w.start)
        rows.append(_row([_e(_fmt_s(w.start)), _e(end), _e(duration), f"<b>{_e(w.fault)}</b>",
                          _e(_fmt_targets(w.targets)), _e(w.detail)]))
    parts = [_table(["start", "end", "duration", "fault", "targets", "detail"], rows, "faults")
             if rows else '<p class="muted">No faults were injected.</p>']
    notes = [e for e in _events(events, "nemesis") if e.get("phase") == "info"]
    if notes:
        note_rows = [_row([_e(_fmt_s(e["t"])), _e(e.get("fault", "")),
                           _e(_fmt_targets(e.get("targets"))), _e(e.get("detail", ""))])
                     for e in notes]
        parts.append("<h3>Nemesis notes</h3>")
        parts.append(_table(["at", "fault", "targets", "detail"], note_rows, "notes"))
    return "".join(parts)


def settings_table(run: dict, results: dict) -> str:
    """The run event's fields and settings; without a run event (a run that
    never started) the ``config`` the results carry."""
    rows = []
    for key in ("scenario", "seed", "duration_s", "topic", "partitions", "layout", "started_at"):
        if key in run:
            value = run[key] if isinstance(run[key], str) else _json(run[key])
            rows.append(_row([f"<code>{_e(key)}</code>", _e(value)]))
    settings = _dict(run.get("settings")) if run else _dict(results.get("config"))
    for key, value in sorted(settings.items(), key=lambda kv: str(kv[0])):
        shown = value if isinstance(value, str) else _json(value)
        rows.append(_row([f"<code>{_e(key)}</code>", _e(shown)]))
    if not rows:
        return '<p class="muted">No run settings recorded.</p>'
    return _table(["setting", "value"], rows, "settings")


# -- the page -----------------------------------------------------------------------

CSS = """
:root { color-scheme: light; }
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif;
       color: #212529; margin: 0; background: #f1f3f5; }
main { max-width: 1100px; margin: 0 auto; padding: 20px 24px 40px; background: #fff; }
h1 { font-size: 22px; margin: 0; }
h2 { font-size: 17px; margin: 28px 0 10px; border-bottom: 1px solid #dee2e6; padding-bottom: 4px; }
h3 { font-size: 13px; margin: 14px 0 6px; color: #495057; text-transform: uppercase;
     letter-spacing: .04em; }
header { display: flex; align-items: center; gap: 18px; flex-wrap: wrap; }
.badge { font-size: 26px; font-weight: 800; letter-spacing: .06em; color: #fff;
         padding: 6px 18px; border-radius: 8px; }
.badge.pass { background: #2f9e44; } .badge.fail { background: #e03131; }
.badge.not-run, .badge.none { background: #868e96; }
.reason { margin: 10px 0 0; padding: 8px 12px; border-left: 4px solid #868e96;
          background: #f8f9fa; white-space: pre-wrap; }
.reason.fail { border-color: #e03131; background: #fff5f5; }
.reason.pass { border-color: #2f9e44; background: #ebfbee; }
.sub { color: #495057; margin: 6px 0 0; }
.muted { color: #868e96; }
svg.timeline { width: 100%; height: auto; display: block; margin-top: 8px; }
svg .panel { fill: none; stroke: #ced4da; }
svg .grid { stroke: #e9ecef; }
svg .axis { stroke: #868e96; }
svg text { font-family: system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; }
svg .tick { font-size: 11px; fill: #495057; }
svg .legend { font-size: 11.5px; fill: #343a40; }
svg .axis-title { font-size: 12px; fill: #343a40; }
svg .empty { font-size: 13px; fill: #adb5bd; }
svg .fault-window { fill: @FAULT@; fill-opacity: .16; stroke: @FAULT@; stroke-opacity: .8; }
svg .fault-label { font-size: 11.5px; font-weight: 600; fill: @FAULT_TEXT@; }
svg .phase-line { stroke: @PHASE@; stroke-width: 1.2; stroke-dasharray: 5 4; }
svg .phase-label { font-size: 10.5px; fill: @PHASE@; font-style: italic; }
table { border-collapse: collapse; width: 100%; font-size: 13px; }
th, td { text-align: left; vertical-align: top; padding: 5px 8px; border-bottom: 1px solid #e9ecef; }
th { background: #f8f9fa; font-weight: 600; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
td.bad { background: #ffe3e3; color: #c92a2a; font-weight: 700; }
td.examples ul { margin: 0; padding-left: 16px; }
td.examples code { word-break: break-all; font-size: 12px; }
td.kind { width: 30%; }
table.settings { width: auto; } table.settings td { padding: 2px 10px; }
.groups { display: flex; flex-wrap: wrap; gap: 12px 28px; }
.group h3 { margin-top: 0; }
.stats { display: flex; gap: 18px; }
.stat .value { font-size: 20px; font-weight: 700; font-variant-numeric: tabular-nums; }
.stat .label { font-size: 12px; color: #868e96; }
footer { margin-top: 30px; font-size: 12px; color: #495057; }
footer a { color: #1c7ed6; }
""".replace("@FAULT_TEXT@", FAULT_TEXT_COLOR).replace("@FAULT@", FAULT_COLOR).replace(
    "@PHASE@", PHASE_COLOR)


def _header(run: dict, results: dict) -> tuple[str, str]:
    scenario = results.get("scenario", run.get("scenario", "unknown scenario"))
    seed = results.get("seed", run.get("seed"))
    title = f"kraftlog chaos — {scenario}" + (f" (seed {seed})" if seed is not None else "")
    verdict = str(results.get("verdict", "")).lower()
    label, cls = VERDICTS.get(verdict, ("NO VERDICT", "none"))
    facts = []
    duration = _num(results.get("duration_s", run.get("duration_s")))
    if duration is not None:
        facts.append(f"{duration:g} s run")
    if run.get("layout"):
        facts.append(str(run["layout"]))
    if run.get("topic") is not None:
        parts = run.get("partitions")
        facts.append(f"topic {run['topic']}" + (f", {parts} partitions" if parts is not None else ""))
    if run.get("started_at"):
        facts.append(f"started {run['started_at']}")
    reason = results.get("reason")
    out = [f'<header><h1>{_e(title)}</h1><span class="badge {cls}">{_e(label)}</span></header>']
    if facts:
        out.append(f'<p class="sub">{_e(" · ".join(facts))}</p>')
    if reason:
        out.append(f'<p class="reason {cls}">{_e(reason)}</p>')
    return "".join(out), title


def render_report(events: list[dict], results: dict) -> str:
    """The whole page as HTML text."""
    events = [e for e in (events or []) if isinstance(e, dict)]
    results = _dict(results)
    run = run_info(events)
    header, title = _header(run, results)
    sections = [
        header,
        "<h2>Timeline</h2>",
        render_timeline(events, results),
        "<h2>Checker results</h2>",
        anomaly_table(results),
        "<h2>Counts</h2>",
        summary_cards(results),
        "<h2>Fault log</h2>",
        fault_table(events, results),
        "<h2>Run settings</h2>",
        settings_table(run, results),
        f'<footer>Raw data: <a href="{HISTORY_FILE}">{HISTORY_FILE}</a> (every operation, '
        f'one JSON object a line) · <a href="{RESULTS_FILE}">{RESULTS_FILE}</a> '
        f"(the checker's verdict)</footer>",
    ]
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
            f"<title>{_e(title)}</title><style>{CSS}</style></head>"
            f"<body><main>{''.join(sections)}</main></body></html>\n")


def write_report(out_dir: str, events: list[dict], results: dict) -> str:
    """Write ``out_dir/report.html``; return its path."""
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, REPORT_FILE)
    text = render_report(events, results)
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
    return path
