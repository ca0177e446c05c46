"""Prometheus metrics of a broker, rendered in the text exposition format.

A few counters, gauges and histograms with labels, kept in plain dicts: the
broker updates them on the event loop (no locks), and ``/metrics`` renders
them. Gauges whose value lives elsewhere (partitions, leaders) are read at
scrape time through a callback, so they can never drift from the truth.
"""

from __future__ import annotations

import bisect
import functools
import math
from collections.abc import Callable, Iterable
from typing import Any

#: Full garbage collections' buckets in seconds: 5 ms to 5 s.
GC_BUCKETS_S = (0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0)
#: How often the broker measures its event loop's lag.
LOOP_LAG_PERIOD_S = 0.1
#: Request latency buckets in seconds: 0.5 ms to 10 s.
LATENCY_BUCKETS_S = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                     1.0, 2.5, 5.0, 10.0)


def _labels(names: tuple[str, ...], values: tuple, extra: str = "") -> str:
    parts = [f'{name}="{_escape(str(value))}"' for name, value in zip(names, values)]
    if extra:
        parts.append(extra)
    return "{" + ",".join(parts) + "}" if parts else ""


def _escape(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _number(value: float) -> str:
    if isinstance(value, int):
        return str(value)
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value))


class Counter:
    kind = "counter"

    def __init__(self, name: str, help_text: str, labels: tuple[str, ...] = ()) -> None:
        self.name, self.help, self.label_names = name, help_text, labels
        self.values: dict[tuple, float] = {}

    def inc(self, amount: float = 1, *labels) -> None:
        self.values[labels] = self.values.get(labels, 0) + amount

    def samples(self) -> Iterable[str]:
        for labels, value in sorted(self.values.items()):
            yield f"{self.name}{_labels(self.label_names, labels)} {_number(value)}"


class Gauge:
    """A value read at scrape time from ``read`` (``{label values: value}``)."""

    kind = "gauge"

    def __init__(self, name: str, help_text: str, read: Callable[[], dict[tuple, float]],
                 labels: tuple[str, ...] = ()) -> None:
        self.name, self.help, self.label_names, self.read = name, help_text, labels, read

    def samples(self) -> Iterable[str]:
        for labels, value in sorted(self.read().items()):
            yield f"{self.name}{_labels(self.label_names, labels)} {_number(value)}"


class Histogram:
    kind = "histogram"

    def __init__(self, name: str, help_text: str, labels: tuple[str, ...] = (),
                 buckets: tuple[float, ...] = LATENCY_BUCKETS_S) -> None:
        self.name, self.help, self.label_names = name, help_text, labels
        self.buckets = buckets
        # labels -> [count per bucket (non-cumulative, +Inf last), sum]
        self.values: dict[tuple, tuple[list[int], list[float]]] = {}

    def observe(self, value: float, *labels) -> None:
        entry = self.values.get(labels)
        if entry is None:
            entry = self.values[labels] = ([0] * (len(self.buckets) + 1), [0.0])
        entry[0][bisect.bisect_left(self.buckets, value)] += 1
        entry[1][0] += value

    def samples(self) -> Iterable[str]:
        for labels, (counts, total) in sorted(self.values.items()):
            running = 0
            for bound, count in zip(self.buckets + (math.inf,), counts):
                running += count
                le = 'le="' + _number(bound) + '"'
                yield f"{self.name}_bucket{_labels(self.label_names, labels, le)} {running}"
            yield f"{self.name}_sum{_labels(self.label_names, labels)} {_number(total[0])}"
            yield f"{self.name}_count{_labels(self.label_names, labels)} {running}"


class Registry:
    def __init__(self) -> None:
        self.metrics: list = []
        self.scrapes = 0

    def add(self, metric):
        self.metrics.append(metric)
        return metric

    def per_scrape(self, read: Callable[[], Any]) -> Callable[[], Any]:
        """``read`` called at most once per ``render``, however many gauges
        show its figures (a broker's replication figures walk every
        partition it holds: once a scrape, not once a gauge)."""
        taken: list = [-1, None]  # the scrape it was read in, its value

        def cached() -> Any:
            if taken[0] != self.scrapes:
                taken[1] = read()
                taken[0] = self.scrapes
            return taken[1]
        return cached

    def render(self) -> str:
        self.scrapes += 1
        lines = []
        for metric in self.metrics:
            lines.append(f"# HELP {metric.name} {metric.help}")
            lines.append(f"# TYPE {metric.name} {metric.kind}")
            lines.extend(metric.samples())
        return "\n".join(lines) + "\n"


def _one(read: Callable[[], dict[str, float]], key: str) -> Callable[[], dict[tuple, float]]:
    """A gauge's reader of one figure of ``read()``, without labels."""
    return lambda: {(): read()[key]}


class BrokerMetrics:
    """Every metric a broker exports. ``partitions`` and ``leaders`` read the
    replica manager at scrape time."""

    def __init__(self, read_partitions: Callable[[], dict[tuple, float]],
                 read_leaders: Callable[[], dict[tuple, float]],
                 read_replication: Callable[[], dict[str, float]] | None = None) -> None:
        r = self.registry = Registry()
        self.requests = r.add(Counter(
            "kraftlog_requests_total", "Requests handled, by API and outcome code.",
            ("api", "code")))
        self.latency = r.add(Histogram(
            "kraftlog_request_latency_seconds", "Request handling time, by API.", ("api",)))
        self.bytes_in = r.add(Counter(
            "kraftlog_bytes_in_total", "Record batch bytes appended by produce.", ("topic",)))
        self.bytes_out = r.add(Counter(
            "kraftlog_bytes_out_total", "Record batch bytes returned by fetch.", ("topic",)))
        self.messages_in = r.add(Counter(
            "kraftlog_messages_in_total", "Records appended by produce.", ("topic",)))
        self.messages_out = r.add(Counter(
            "kraftlog_messages_out_total", "Records in batches returned by fetch.", ("topic",)))
        self.partition_errors = r.add(Counter(
            "kraftlog_partition_errors_total", "Per-partition errors, by API and code.",
            ("api", "code")))
        self.loop_lag = r.add(Histogram(
            "kraftlog_event_loop_lag_seconds", "How late the broker's event loop ran a timer "
            f"due every {LOOP_LAG_PERIOD_S:g} s: about as long as a request that arrives then "
            "waits before the loop reads it."))
        self.gc_full_pauses = r.add(Histogram(
            "kraftlog_gc_full_collection_seconds", "Full (oldest-generation) garbage "
            "collections of the broker process and how long each stopped it.",
            buckets=GC_BUCKETS_S))
        r.add(Gauge("kraftlog_partitions", "Partitions hosted by this broker.",
                    read_partitions))
        r.add(Gauge("kraftlog_leader_partitions", "Partitions this broker leads.",
                    read_leaders))
        if read_replication is not None:
            self._add_replication(r, read_replication)

    def topic_counters(self) -> dict[str, dict[str, float]]:
        """Per topic: records and bytes appended by produce and returned by
        fetch since this broker started (the ``*_in_total`` and
        ``*_out_total`` counters)."""
        out: dict[str, dict[str, float]] = {}
        for key, counter in (("messages_in", self.messages_in),
                             ("messages_out", self.messages_out),
                             ("bytes_in", self.bytes_in), ("bytes_out", self.bytes_out)):
            for (topic,), value in counter.values.items():
                out.setdefault(topic, {"messages_in": 0, "messages_out": 0, "bytes_in": 0,
                                       "bytes_out": 0})[key] = value
        return out

    def add_cleaner_gauges(self, read: Callable[[], dict[str, float]]) -> None:
        """The log cleaner (compacted topics), read at scrape time."""
        r = self.registry
        one = functools.partial(_one, r.per_scrape(read))
        r.add(Gauge("kraftlog_cleaner_max_dirty_percent",
                    "Highest share of a compacted log not cleaned yet, in percent.",
                    one("max_dirty_percent")))
        r.add(Gauge("kraftlog_cleaner_recopy_percent",
                    "Bytes the last pass wrote, as a percent of the bytes it read.",
                    one("recopy_percent")))
        r.add(Gauge("kraftlog_cleaner_time_since_last_run_seconds",
                    "Seconds since the last cleaner pass ended (-1: none yet).",
                    one("time_since_last_run")))
        r.add(Gauge("kraftlog_cleaner_last_pass_seconds", "How long the last pass took.",
                    one("last_pass_seconds")))
        r.add(Gauge("kraftlog_cleaner_running_passes", "Cleaner passes under way now.",
                    one("running")))
        for key, help_text in (("passes", "Cleaner passes completed."),
                               ("bytes_read", "Bytes the cleaner read."),
                               ("bytes_cleaned", "Bytes the cleaner wrote (cleaned segments)."),
                               ("passes_failed", "Cleaner passes that failed."),
                               ("passes_discarded", "Cleaner passes dropped because the log "
                                "changed meanwhile (truncation, retention, a delete).")):
            counter = r.add(Gauge(f"kraftlog_cleaner_{key}_total", help_text, one(key)))
            counter.kind = "counter"

    def add_quota_gauges(self, throttled: Callable[[], dict[tuple, float]]) -> None:
        """Client quotas: how long answers were held back, per quota and client id."""
        self.registry.add(Gauge(
            "kraftlog_client_quota_throttle_ms_total",
            "Milliseconds answers were held back for clients over their quota "
            "(producer_byte_rate, consumer_byte_rate or request_percentage), per client id.",
            throttled, ("quota", "client_id")))

    def add_connection_gauges(self, read: Callable[[], dict[str, float]]) -> None:
        """Connections held and closed by the limits (api/broker/connections.py)."""
        r = self.registry
        one = functools.partial(_one, r.per_scrape(read))
        r.add(Gauge("kraftlog_connections", "Connections this broker holds now, over all its "
                    "listeners.", one("total")))
        r.add(Gauge("kraftlog_connections_refused_total",
                    "Connections closed on arrival because max.connections or "
                    "max.connections.per.ip was reached.", one("refused")))
        r.add(Gauge("kraftlog_connections_idle_closed_total",
                    "Connections closed for sending no request within "
                    "connections.max.idle.ms.", one("idle_closed")))

    def add_group_gauges(self, members: Callable[[], dict[tuple, float]],
                         lags: Callable[[], dict[tuple, float]]) -> None:
        """Consumer groups coordinated by this broker (refreshed every few
        seconds, not at scrape time: lag needs the partition leaders)."""
        r = self.registry
        r.add(Gauge("kraftlog_group_members", "Members of each group this broker coordinates.",
                    members, ("group",)))
        r.add(Gauge("kraftlog_group_lag", "High watermark minus committed offset, per group "
                    "partition (groups this broker coordinates).", lags,
                    ("group", "topic", "partition")))

    @staticmethod
    def _add_replication(r: Registry, read: Callable[[], dict[str, float]]) -> None:
        one = functools.partial(_one, r.per_scrape(read))

        r.add(Gauge("kraftlog_under_replicated_partitions",
                    "Partitions this broker leads whose ISR is smaller than their replicas.",
                    one("under_replicated")))
        r.add(Gauge("kraftlog_under_min_isr_partitions",
                    "Partitions this broker leads whose ISR is below min.insync.replicas "
                    "(acks=all writes are refused).", one("under_min_isr")))
        r.add(Gauge("kraftlog_offline_partitions",
                    "Partitions of the cluster without a leader (from the metadata).",
                    one("offline")))
        r.add(Gauge("kraftlog_log_dirs_offline",
                    "This broker's log directories taken offline after disk errors (until a "
                    "restart).", one("log_dirs_offline")))
        r.add(Gauge("kraftlog_log_unflushed_logs",
                    "This broker's logs holding data not fsynced yet (waiting for flush.ms, "
                    "or for the flush thread to get to them).", one("unflushed_logs")))
        r.add(Gauge("kraftlog_offline_replicas",
                    "This broker's replicas whose logs are in an offline log directory.",
                    one("offline_replicas")))
        shrinks = r.add(Gauge("kraftlog_isr_shrinks_total",
                              "ISR shrinks this broker made as leader.", one("isr_shrinks")))
        expands = r.add(Gauge("kraftlog_isr_expands_total",
                              "ISR expansions this broker made as leader.", one("isr_expands")))
        shrinks.kind = expands.kind = "counter"
        r.add(Gauge("kraftlog_client_streams",
                    "Clients' streams (GET /v1/stream: produces and fetches over one "
                    "WebSocket) open on this broker now.", one("client_streams")))
        r.add(Gauge("kraftlog_follower_fetch_streams",
                    "Followers' fetch streams (GET /v1/replica/fetch-stream) open on this "
                    "broker now.", one("follower_streams")))
        r.add(Gauge("kraftlog_consumer_fetch_sessions",
                    "Consumers' fetch sessions this broker keeps (at most "
                    "max.incremental.fetch.session.cache.slots).", one("consumer_sessions")))
        r.add(Gauge("kraftlog_consumer_fetch_session_partitions",
                    "Partitions held by consumers' fetch sessions.",
                    one("consumer_session_partitions")))
        r.add(Gauge("kraftlog_follower_fetch_sessions",
                    "Followers' fetch sessions on this broker as leader.",
                    one("follower_sessions")))
        evictions = r.add(Gauge("kraftlog_fetch_session_evictions_total",
                                "Consumers' fetch sessions closed to make room for a bigger one.",
                                one("session_evictions")))
        evictions.kind = "counter"

    def render(self) -> str:
        return self.registry.render()
