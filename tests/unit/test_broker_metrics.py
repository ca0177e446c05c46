"""api/broker/metrics.py: the Prometheus text a broker's /metrics serves."""

import math
import re

from api.broker.metrics import (LATENCY_BUCKETS_S, BrokerMetrics, Counter, Gauge, Histogram,
                                Registry)

SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{.*\})? (\S+)$')


def samples(text: str) -> list[tuple[str, str, str]]:
    out = []
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        match = SAMPLE.match(line)
        assert match, f"not a Prometheus sample line: {line!r}"
        out.append((match.group(1), match.group(2) or "", match.group(3)))
    return out


def test_counters_add_per_label_set_and_render_sorted():
    counter = Counter("c_total", "Things.", ("api", "code"))
    counter.inc(1, "/b", "200")
    counter.inc(2, "/a", "400")
    counter.inc(3, "/b", "200")
    assert list(counter.samples()) == ['c_total{api="/a",code="400"} 2',
                                       'c_total{api="/b",code="200"} 4']
    unlabelled = Counter("u_total", "No labels.")
    unlabelled.inc(0.5)
    assert list(unlabelled.samples()) == ["u_total 0.5"]


def test_label_values_are_escaped():
    counter = Counter("c_total", "Things.", ("topic",))
    counter.inc(1, 'a"b\\c\nd')
    (line,) = counter.samples()
    assert line == 'c_total{topic="a\\"b\\\\c\\nd"} 1'


def test_gauges_read_their_value_at_scrape_time():
    value = {"n": 1}
    gauge = Gauge("g", "A gauge.", lambda: {(): value["n"]})
    assert list(gauge.samples()) == ["g 1"]
    value["n"] = 7
    assert list(gauge.samples()) == ["g 7"]


def test_histogram_buckets_are_cumulative_with_inclusive_bounds():
    histogram = Histogram("h_seconds", "Latency.", ("api",), buckets=(0.1, 1.0))
    for value in (0.05, 0.1, 0.5, 1.0, 3.0):
        histogram.observe(value, "/x")
    lines = list(histogram.samples())
    assert lines == ['h_seconds_bucket{api="/x",le="0.1"} 2',
                     'h_seconds_bucket{api="/x",le="1.0"} 4',
                     'h_seconds_bucket{api="/x",le="+Inf"} 5',
                     f'h_seconds_sum{{api="/x"}} {0.05 + 0.1 + 0.5 + 1.0 + 3.0!r}',
                     'h_seconds_count{api="/x"} 5']


def test_registry_renders_help_and_type_before_each_metric():
    registry = Registry()
    registry.add(Counter("a_total", "Counted.")).inc(1)
    registry.add(Gauge("b", "Gauged.", lambda: {(): 2}))
    text = registry.render()
    assert text.endswith("\n")
    assert text.splitlines() == ["# HELP a_total Counted.", "# TYPE a_total counter", "a_total 1",
                                 "# HELP b Gauged.", "# TYPE b gauge", "b 2"]


def test_broker_metrics_render_every_documented_family():
    metrics = BrokerMetrics(lambda: {(): 3}, lambda: {(): 2})
    metrics.requests.inc(1, "/v1/produce", "200")
    metrics.latency.observe(0.003, "/v1/produce")
    metrics.bytes_in.inc(100, "orders")
    metrics.messages_in.inc(5, "orders")
    metrics.messages_out.inc(4, "orders")
    text = metrics.render()
    for family, kind in (("kraftlog_requests_total", "counter"),
                         ("kraftlog_request_latency_seconds", "histogram"),
                         ("kraftlog_bytes_in_total", "counter"),
                         ("kraftlog_bytes_out_total", "counter"),
                         ("kraftlog_messages_in_total", "counter"),
                         ("kraftlog_messages_out_total", "counter"),
                         ("kraftlog_partition_errors_total", "counter"),
                         ("kraftlog_partitions", "gauge"),
                         ("kraftlog_leader_partitions", "gauge")):
        assert f"# TYPE {family} {kind}\n" in text
    found = {(name, labels): value for name, labels, value in samples(text)}
    assert found[("kraftlog_requests_total", '{api="/v1/produce",code="200"}')] == "1"
    assert found[("kraftlog_messages_in_total", '{topic="orders"}')] == "5"
    assert found[("kraftlog_partitions", "")] == "3"
    assert found[("kraftlog_leader_partitions", "")] == "2"
    buckets = [(labels, int(value)) for name, labels, value in samples(text)
               if name == "kraftlog_request_latency_seconds_bucket"]
    assert len(buckets) == len(LATENCY_BUCKETS_S) + 1
    assert buckets[-1] == ('{api="/v1/produce",le="+Inf"}', 1)
    counts = [count for _, count in buckets]
    assert counts == sorted(counts)  # cumulative
    assert all(count == (1 if bound >= 0.003 else 0)
               for (_, count), bound in zip(buckets, LATENCY_BUCKETS_S + (math.inf,)))


def test_the_replication_figures_are_read_once_per_scrape_not_once_per_gauge():
    """They walk every partition the broker holds (146 ms a scrape at
    10,000 partitions when each of their gauges read them anew): once per
    scrape, and anew at the next."""
    reads = []
    figures = {"under_replicated": 1, "under_min_isr": 0, "offline": 0, "isr_shrinks": 2,
               "isr_expands": 3, "log_dirs_offline": 0, "unflushed_logs": 7,
               "offline_replicas": 0}

    class Figures(dict):
        def __missing__(self, key):
            return 0

    def read():
        reads.append(1)
        return Figures(figures)
    metrics = BrokerMetrics(lambda: {(): 3}, lambda: {(): 2}, read)
    text = metrics.render()
    assert len(reads) == 1
    found = {(name, labels): value for name, labels, value in samples(text)}
    assert found[("kraftlog_log_unflushed_logs", "")] == "7"
    assert found[("kraftlog_under_replicated_partitions", "")] == "1"
    figures["unflushed_logs"] = 0
    text = metrics.render()
    assert len(reads) == 2
    assert ("kraftlog_log_unflushed_logs", "", "0") in samples(text)
