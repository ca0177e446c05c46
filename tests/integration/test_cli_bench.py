"""`kraftlog bench storage` as a user runs it: a real process, tiny sizes.

This checks the program works end to end and reports every phase; it asserts
no speed (figures belong in BENCHMARKS.md, measured at full size)."""

import argparse
import json
import os
import subprocess
import sys
import urllib.request

import pytest

from chaos.cluster import ProcessCluster, http_json, wait_until


def test_bench_storage_runs_every_phase_and_writes_json(tmp_path):
    out = tmp_path / "bench.json"
    work = tmp_path / "made" / "by-the-bench"  # a --dir that does not exist yet is made
    result = subprocess.run(
        [sys.executable, "-m", "api.cli", "bench", "storage", "--dir", str(work),
         "--log-mb", "4", "--small-mb", "2", "--batch-kb", "64", "--unflushed-mb", "1",
         "--lookups", "50", "--new-logs", "30", "--json", str(out)],
        capture_output=True, text=True, timeout=120,
        cwd=os.path.dirname(os.path.dirname(os.path.dirname(__file__))))
    assert result.returncode == 0, result.stderr
    for heading in ("Writes", "Sequential reads", "Random offset lookups", "Log.open",
                    "New logs"):
        assert heading in result.stdout
    report = json.loads(out.read_text())
    assert report["writes"]["append"]["bytes"] > 0
    assert report["recovery"]["lost_offsets"] == 0
    assert report["lookups"]["big"]["count"] == 50
    assert report["new_logs"]["count"] == 30 and report["new_logs"]["log_open_us"] > 0
    # The benchmark cleans up after itself, and leaves the --dir it made.
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bench.json", "made"]
    assert list(work.iterdir()) == []


def test_cli_help_lists_the_commands():
    result = subprocess.run([sys.executable, "-m", "api.cli", "--help"], capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0
    assert "bench" in result.stdout and "--bootstrap" in result.stdout


# -- bench produce|consume|e2e: the data plane, tiny sizes ---------------------------------
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
COMMON_FLAGS = ("--records", "--record-size", "--partitions", "--acks", "--batch-size",
                "--linger-ms", "--target", "--brokers", "--replication-factor",
                "--min-insync-replicas", "--dir", "--json")


@pytest.fixture(scope="module")
def node_url(tmp_path_factory):
    with ProcessCluster(str(tmp_path_factory.mktemp("bench-node")), controllers=1, brokers=0,
                        combined=True) as cluster:
        cluster.start()
        cluster.wait_for_brokers_running(timeout_s=30)
        yield cluster.nodes[1].broker_url


def bench_json(kind, *args, env=None):
    """``kraftlog bench KIND ... --json``: the summary it printed."""
    result = subprocess.run([sys.executable, "-m", "api.cli", "bench", kind, *args, "--json"],
                            capture_output=True, text=True, timeout=120, cwd=REPO_ROOT,
                            env=env)
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)  # stdout is the JSON alone; progress is on stderr
    assert summary["bench"] == kind
    return summary


def bench(kind, *args, env=None):
    summary = bench_json(kind, *args, env=env)
    assert summary["seconds"] > 0 and summary["records_s"] > 0
    assert summary["reference_disk_mb_s"] > 0
    return summary


def assert_latencies(summary, samples):
    assert summary["latency_samples"] == samples
    assert 0 < summary["latency_ms_p50"] <= summary["latency_ms_p99"] \
        <= summary["latency_ms_p999"] <= summary["latency_ms_max"]


def records_in(url, prefix):
    """Records in the one topic named ``prefix``-something (high watermarks summed)."""
    names = [t["name"] for t in http_json(url + "/v1/topics")[1]["topics"]
             if t["name"].startswith(prefix)]
    assert len(names) == 1, names
    topic = http_json(f"{url}/v1/topics/{names[0]}")[1]
    return len(topic["partitions"]), sum(p["high_watermark"] for p in topic["partitions"])


def test_bench_produce_starts_its_own_node_and_reports_json(tmp_path):
    summary = bench("produce", "--records", "2000", "--partitions", "2",
                    env={**os.environ, "TMPDIR": str(tmp_path)})
    assert (summary["records"], summary["partitions"], summary["record_size"]) == (
        2000, 2, 100)
    assert summary["mb_s"] > 0 and summary["ratio_to_disk"] > 0
    assert_latencies(summary, samples=2000 // 64 + 1)  # every 64th record, from the first
    # The fresh node and the disk reference lived in a temporary directory,
    # removed after.
    assert list(tmp_path.iterdir()) == []


def test_bench_produce_in_a_given_dir_starts_fresh_and_leaves_nothing_behind(tmp_path):
    """`--dir` is where the fresh node's temporary directory is made (and
    the dir itself if missing): a second run does not start on the first's
    data, and nothing is left in the dir after either."""
    given = tmp_path / "made" / "here"
    for _ in range(2):
        summary = bench("produce", "--records", "500", "--partitions", "1",
                        "--dir", str(given))
        assert summary["records"] == 500
        assert list(given.iterdir()) == []


def test_bench_produce_with_several_producer_processes(node_url):
    summary = bench("produce", "--records", "2000", "--partitions", "2", "--producers", "2",
                    "--target", node_url)
    assert (summary["records"], summary["producers"]) == (2000, 2)
    assert summary["mb_s"] > 0
    assert_latencies(summary, samples=2 * (1000 // 64 + 1))


def test_bench_consume_reads_back_every_record(node_url):
    summary = bench("consume", "--records", "2000", "--target", node_url)
    assert summary["records"] == 2000 and summary["mb_s"] > 0
    assert "latency_ms_p50" not in summary  # consume measures throughput only
    assert records_in(node_url, "bench-consume-") == (4, 2000)  # default: 4 partitions


def test_bench_e2e_reports_latency_at_the_requested_rate(node_url):
    summary = bench("e2e", "--records", "500", "--rate", "2000", "--target", node_url)
    assert (summary["records"], summary["target_rate"], summary["rate"]) == (500, 2000, 2000)
    assert summary["records_s"] <= 2000 * 1.05  # paced, not flooded
    # The producer's requests the broker counted: at least one, at most one a record.
    assert 0 < summary["produce_requests_s"] * summary["seconds"] <= 500
    assert_latencies(summary, samples=500)  # every record, as the consumer polled it
    assert records_in(node_url, "bench-e2e-") == (4, 500)


def test_bench_produce_flush_each_times_round_trips_and_reports_each_process_cpu(tmp_path):
    summary = bench("produce", "--records", "40", "--flush-each", "--transport", "post",
                    "--acks", "all", env={**os.environ, "TMPDIR": str(tmp_path)})
    assert (summary["flush_each"], summary["transport"]) == (True, "post")
    assert_latencies(summary, samples=40)  # every record is one round trip
    # Its own node: the CPU of the node process and of the producer, and
    # the cores both kept busy.
    assert sorted(summary["cpu_s"]) == ["node 1 (broker+controller)", "producer"]
    assert all(seconds > 0 for seconds in summary["cpu_s"].values())
    assert 0 < summary["cores_busy"] <= summary["cores"] * 1.5


def streams_open(url):
    with urllib.request.urlopen(url + "/metrics", timeout=10) as response:
        lines = response.read().decode().splitlines()
    return next(float(line.rpartition(" ")[2]) for line in lines
                if line.startswith("kraftlog_client_streams "))


@pytest.mark.parametrize("transport, streams", [("stream", 1), ("post", 0)])
def test_bench_transport_flag_chooses_how_the_clients_send(node_url, transport, streams):
    """``--transport post`` makes the bench's clients send each request by
    POST, so a broker counts no stream of theirs; the default uses one."""
    from bench.data import _create_topic, _producer

    _create_topic([node_url], f"bench-transport-{transport}", 1)
    # No stream of an earlier test's client is still counted.
    wait_until(lambda: streams_open(node_url) == 0, 10, "earlier clients' streams closed")
    args = argparse.Namespace(acks="1", batch_size=16384, linger_ms=0, transport=transport)
    with _producer([node_url], args) as producer:
        producer.send(f"bench-transport-{transport}", b"x").result(30)
        assert streams_open(node_url) == streams


def test_bench_flush_each_and_send_batch_are_refused_together():
    result = subprocess.run([sys.executable, "-m", "api.cli", "bench", "produce", "--flush-each",
                             "--send-batch", "100"], capture_output=True, text=True, timeout=60,
                            cwd=REPO_ROOT)
    assert result.returncode == 2
    assert "--flush-each" in result.stderr and "--send-batch" in result.stderr


def test_bench_data_help_explains_each_flag():
    for kind, extra, absent in (("produce", ("--producers", "acknowledgement", "--flush-each",
                                             "--transport"), "--rate"),
                                ("consume", ("read", "--transport"), "--rate"),
                                ("e2e", ("--rate", "latency", "--transport"), "--producers")):
        result = subprocess.run([sys.executable, "-m", "api.cli", "bench", kind, "--help"],
                                capture_output=True, text=True, timeout=60, cwd=REPO_ROOT)
        assert result.returncode == 0, result.stderr
        for text in COMMON_FLAGS + extra:
            assert text in result.stdout, (kind, text)
        assert absent not in result.stdout, (kind, absent)


# -- replication: RF=3 next to RF=1, and the window after a leader kill ----------------------
def test_bench_produce_on_a_fresh_replicated_cluster(tmp_path):
    summary = bench("produce", "--records", "2000", "--partitions", "2", "--brokers", "3",
                    "--replication-factor", "3", "--min-insync-replicas", "2", "--acks", "all",
                    env={**os.environ, "TMPDIR": str(tmp_path)})
    assert (summary["brokers"], summary["replication_factor"], summary["min_insync_replicas"],
            summary["acks"]) == (3, 3, 2, "all")
    assert summary["records"] == 2000 and summary["mb_s"] > 0
    assert_latencies(summary, samples=2000 // 64 + 1)
    assert list(tmp_path.iterdir()) == []


def test_bench_produce_refuses_replication_flags_that_do_not_fit():
    for flags, complaint in (
            (("--replication-factor", "3"), "--brokers 3"),
            (("--brokers", "3", "--replication-factor", "2", "--min-insync-replicas", "3"),
             "--min-insync-replicas"),
            (("--brokers", "2", "--target", "http://127.0.0.1:1"), "--target")):
        result = subprocess.run([sys.executable, "-m", "api.cli", "bench", "produce", *flags],
                                capture_output=True, text=True, timeout=60, cwd=REPO_ROOT)
        assert result.returncode == 2, (flags, result.stderr)
        assert complaint in result.stderr, (flags, result.stderr)


def test_bench_replication_measures_rf3_acks_all_next_to_rf1(tmp_path):
    summary = bench_json("replication", "--records", "2000", "--partitions", "2",
                         "--rounds", "2", env={**os.environ, "TMPDIR": str(tmp_path)})
    runs = {run["label"]: run for run in summary["runs"]}
    assert list(runs) == ["RF=1 acks=1", "RF=1 acks=all", "RF=3 acks=1", "RF=3 acks=all"]
    rf3 = runs["RF=3 acks=all"]
    assert (rf3["replication_factor"], rf3["min_insync_replicas"], rf3["acks"]) == (3, 2, "all")
    for run in runs.values():
        assert run["records"] == 2000 and run["records_s"] > 0 and run["mb_s"] > 0
        assert_latencies(run, samples=2000 // 64 + 1)
        # Two rounds each; the figures are the median (here the faster) round's.
        assert len(run["records_s_all"]) == 2
        assert run["records_s"] == sorted(run["records_s_all"])[1]
    assert summary["reference"] == "RF=1 acks=1"
    assert runs["RF=1 acks=1"]["ratio_to_reference"] == 1
    assert summary["rounds"] == 2 and len(summary["ratio_each_round"]) == 2
    # The verdict pairs each round's two runs: the median of those ratios.
    first, last = runs["RF=1 acks=1"]["records_s_all"], rf3["records_s_all"]
    each_round = [mine / theirs for mine, theirs in zip(last, first)]
    assert summary["ratio_each_round"] == each_round
    assert summary["ratio_rf3_acks_all_to_rf1"] == sum(each_round) / 2
    assert summary["ratio_of_medians"] == rf3["ratio_to_reference"] > 0
    for run in runs.values():  # each process's CPU, the cluster's together
        assert run["cluster_cpu_s"] == sum(seconds for name, seconds in run["cpu_s"].items()
                                           if name.startswith("node "))
        assert run["cores_busy"] > 0
    assert (summary["brokers"], summary["ratio_target"]) == (3, 0.8)
    assert list(tmp_path.iterdir()) == []


def test_bench_failover_times_a_leader_kill(tmp_path):
    """With the shipped defaults: the killed leader is fenced on the evidence
    of its closed connection, long before its 9 s session would lapse."""
    summary = bench_json("failover", "--trials", "1", "--dir", str(tmp_path))
    (trial,) = summary["trials"]
    assert trial["new_leader"] != trial["killed_broker"]
    assert trial["new_leader_epoch"] > trial["killed_leader_epoch"]
    assert 0 < trial["window_ms"] < summary["session_timeout_ms"] == 9000
    assert sum(trial["failed_writes"].values()) > 0  # the writer kept trying meanwhile
    assert trial["rejoin_ms"] > 0
    assert (summary["window_ms_p50"] == summary["window_ms_p99"] == summary["window_ms_max"]
            == trial["window_ms"])
    assert (summary["target_p50_ms"], summary["target_p99_ms"]) == (2000, 3000)
    assert summary["shipped_defaults"] is True
    assert summary["writes_acknowledged"] > 0
    assert list(tmp_path.iterdir()) == []


def test_bench_flush_times_rounds_and_waits_until_every_log_is_fsynced(tmp_path):
    """A small run: 40 partitions, two rounds, every flush through syncfs:
    each round's throughput and the brokers' CPU, then every broker reports
    every log fsynced, and the cluster's files are gone."""
    summary = bench_json("flush", "--partitions", "40", "--records", "4000", "--rounds", "2",
                         "--set", "log.flush.syncfs.min.logs=2", "--dir", str(tmp_path))
    assert summary["settings"] == {"log.flush.syncfs.min.logs": 2}
    assert len(summary["rounds"]) == 2
    assert all(r["records_per_s"] > 0 and r["broker_user_s"] >= 0 and r["broker_system_s"] >= 0
               for r in summary["rounds"])
    # /proc counts CPU in 10 ms ticks: one small round's user time can read
    # 0 (it did once in CI), the two rounds' time together cannot.
    assert sum(r["broker_user_s"] + r["broker_system_s"] for r in summary["rounds"]) > 0
    assert summary["flushed_after_s"] is not None and summary["unflushed_left"] == [0, 0, 0]
    assert list(tmp_path.iterdir()) == []


def test_bench_cores_carries_every_round_through_the_shipped_cores(tmp_path):
    """A small run: every produce round is answered with the followers holding
    every partition's batch once and the new high watermark (the program
    checks the latter and fails otherwise); every consumer round reads every
    partition; the logs are gone after."""
    summary = bench_json("cores", "--partitions", "30", "--rounds", "2",
                         "--records-per-partition", "10", "--dir", str(tmp_path))
    assert summary["partitions"] == 30 and len(summary["produce_rounds"]) == 2
    for produced in summary["produce_rounds"]:
        assert produced["with_records"] == 2 * 30  # each follower fetched each batch once
        assert produced["entries"] >= produced["with_records"] and produced["answers"] > 0
        assert produced["leader_ms"] > 0 and all(ms > 0 for ms in produced["follower_ms"])
    assert [c["with_records"] for c in summary["consumer_rounds"]] == [30, 30]
    assert list(tmp_path.iterdir()) == []
    refused = subprocess.run([sys.executable, "-m", "api.cli", "bench", "cores",
                              "--partitions", "0"], capture_output=True, text=True,
                             timeout=60, cwd=REPO_ROOT)
    assert refused.returncode == 2 and "--partitions must be at least 1" in refused.stderr


def test_bench_rebalance_times_joins_and_leaves_of_a_group_in_several_processes(tmp_path):
    """A small run of the program: members in two processes, every
    partition owned once after each join and leave, no overlap seen."""
    summary = bench_json("rebalance", "--members", "4", "--processes", "2", "--partitions",
                         "12", "--trials", "2", "--dir", str(tmp_path))
    assert (summary["members"], summary["processes"], summary["partitions"]) == (4, 2, 12)
    for what in ("join_ms", "leave_ms"):
        stats = summary[what]
        assert stats["trials"] == 2 and 0 < stats["p50"] <= stats["p99"] <= stats["max"]
    assert summary["overlaps"] == [] and summary["heartbeat_interval_ms"] == 5000
    assert summary["target_p99_ms"] == 2000
    assert list(tmp_path.iterdir()) == []


def test_bench_rebalance_overlap_check_catches_a_partition_held_twice():
    from bench.rebalance import _overlaps

    handed_over = [[1.0, "a", "+", [0, 1]], [2.0, "a", "-", [1]], [2.0, "b", "+", [1]]]
    assert _overlaps(handed_over) == []
    held_twice = [[1.0, "a", "+", [0, 1]], [2.0, "b", "+", [1]], [2.5, "a", "-", [1]]]
    (problem,) = _overlaps(held_twice)
    assert problem.startswith("partition 1: given to b at 2.000000 while a held it")


def test_bench_replication_and_failover_help():
    for kind, texts in (("replication", ("--records", "--producers", "RF=3 acks=all",
                                         "min.insync.replicas=2", "0.80", "--rounds",
                                         "median")),
                        ("failover", ("--trials", "--session-timeout-ms",
                                      "Kill -9 the partition leader", "p99 <= 3 s",
                                      "--json"))):
        result = subprocess.run([sys.executable, "-m", "api.cli", "bench", kind, "--help"],
                                capture_output=True, text=True, timeout=60, cwd=REPO_ROOT)
        assert result.returncode == 0, result.stderr
        help_text = " ".join(result.stdout.split())  # argparse wraps lines
        for text in texts:
            assert text in help_text, (kind, text)


def test_bench_spark_help():
    # Only the help: a run starts a SparkSession, which the suite leaves to its own tests.
    result = subprocess.run([sys.executable, "-m", "api.cli", "bench", "spark", "--help"],
                            capture_output=True, text=True, timeout=60, cwd=REPO_ROOT)
    assert result.returncode == 0, result.stderr
    help_text = " ".join(result.stdout.split())  # argparse wraps lines
    for text in ("--records", "--record-size", "--keys", "--partitions", "--repeats", "--rate",
                 "--seconds", "--trigger-ms", "--target", "--dir", "--json PATH",
                 'format("kraftlog")', "Parquet", "at least 0.5", "foreachBatch"):
        assert text in help_text, text


def test_bench_compaction_measures_the_cleaner_and_produce_while_it_runs(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "api.cli", "bench", "compaction", "--dir", str(tmp_path),
         "--mb", "4", "--keys", "500", "--rounds", "1", "--records", "20000",
         "--dirty-mb", "16", "--json"],
        capture_output=True, text=True, timeout=300, cwd=REPO_ROOT)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "cleaner / raw" in result.stdout and "while cleaning / idle" in result.stdout
    report = json.loads(result.stdout[result.stdout.index("\n{") + 1:])
    cleaner, produce = report["cleaner"], report["produce"]
    assert cleaner["records"] > 0 and 0 < cleaner["kept_percent"] < 100
    assert produce["cleaner_passes"] >= 1 and produce["cleaning_records_s"] > 0
    assert list(tmp_path.iterdir()) == []  # it cleans up after itself


def _processes_under(directory: str) -> list[int]:
    """Pids of processes whose command line names ``directory``."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                if directory.encode() in f.read():
                    found.append(int(entry))
        except OSError:
            continue
    return found


def test_a_benchmark_killed_with_sigterm_stops_the_cluster_it_started(tmp_path):
    """`kill` of a running benchmark must not leave its nodes running (they
    would take the machine's CPU from whatever runs next)."""
    import signal
    import time

    bench = subprocess.Popen(
        [sys.executable, "-m", "api.cli", "bench", "failover", "--trials", "1",
         "--dir", str(tmp_path)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        cwd=os.path.dirname(os.path.dirname(os.path.dirname(__file__))))
    try:
        deadline = time.monotonic() + 60
        while len([p for p in _processes_under(str(tmp_path)) if p != bench.pid]) < 4:
            assert time.monotonic() < deadline, "the benchmark's cluster never started"
            assert bench.poll() is None, "the benchmark ended early"
            time.sleep(0.1)
        bench.send_signal(signal.SIGTERM)
        assert bench.wait(timeout=60) != 0
        deadline = time.monotonic() + 30
        while _processes_under(str(tmp_path)):
            assert time.monotonic() < deadline, "nodes left running after the benchmark"
            time.sleep(0.1)
    finally:
        if bench.poll() is None:
            bench.kill()
            bench.wait()


# -- bench clients --------------------------------------------------------------------------
def test_bench_clients_reports_the_clients_and_the_brokers_own_produce_latency(tmp_path):
    """Both rounds of `kraftlog bench clients` on a real broker, small: each
    round's records acknowledged in the clients, and the broker's own
    produce handling time read from its latency histogram over the round
    (a bucket bound, at most as many requests as records), and its
    event loop's lag."""
    result = subprocess.run(
        [sys.executable, "-m", "api.cli", "bench", "clients", "--clients", "4",
         "--reference-clients", "2", "--processes", "2", "--seconds", "2", "--rate", "100",
         "--dir", str(tmp_path), "--json"],
        capture_output=True, text=True, timeout=180,
        cwd=os.path.dirname(os.path.dirname(os.path.dirname(__file__))))
    assert result.returncode == 0, result.stderr
    rounds = json.loads(result.stdout)["rounds"]
    assert [r["clients"] for r in rounds] == [2, 4]
    for r in rounds:
        produced = r["produced"]
        assert r["failed"] == 0 and produced > 0 and r["p99_ms"] is not None
        # The histogram saw the round's produce requests and no other: one
        # per send at linger 0, fewer when a loaded machine lets records
        # gather behind a request in flight (189 requests for 200 records
        # in one CI run), never more.
        assert 0 < r["broker_count"] <= produced, r
        assert 0 < r["broker_p50_ms"] <= r["broker_p99_ms"] < float("inf")
        # The event loop's lag, measured every 100 ms through the round.
        assert r["loop_lag_count"] >= 10 and r["loop_lag_p99_ms"] < float("inf")


# -- bench controller -----------------------------------------------------------------------
def test_bench_controller_creations_on_a_cluster_that_already_holds_topics(tmp_path):
    """The write-rate runs of `kraftlog bench controller` after
    ``--existing-topics`` made first: both runs answered, each role's CPU
    per creation reported, the report says how many topics were there."""
    from bench import controller
    from chaos.cluster import FAST_SETTINGS

    results = controller.topic_creations(str(tmp_path), dict(FAST_SETTINGS), count=4,
                                         clients=2, existing=6)
    assert results.pop("topics_at_end") == 6 + 4 + 4
    assert sorted(results) == ["concurrent", "sequential"]
    for run in results.values():
        assert run["count"] == 4 and run["creations_per_s"] > 0
        assert set(run["cpu_ms_per_creation"]) == {"active controller", "other controllers",
                                                   "each broker"}
    report = controller.format_report({
        "settings": {}, "raft_secret": True, "existing_topics": 6, "topic_creations": results,
        "fsync": {"fsyncs_per_s": 1000.0, "fsync_ms": 1.0},
        "controller_failover": {key: {"p50_ms": 1.0, "max_ms": 1.0, "count": 1}
                                for key in ("to_active", "to_topic_created")},
        "broker_failover": {"to_new_leaders": {"p50_ms": 1.0, "max_ms": 1.0, "count": 1},
                            "session_timeout_ms": 3000}})
    assert "on a cluster already holding 6 topics:" in report


def test_bench_controller_times_a_failover_and_pauses_a_follower_without_an_election(tmp_path):
    """`kraftlog bench controller`'s failover part on a real cluster: one
    kill -9 of the active controller timed, then a follower paused for five
    election timeouts, which causes no election: a controller is active
    throughout the four election timeouts watched after it."""
    from bench import controller
    from chaos.cluster import FAST_SETTINGS

    result = controller.controller_failover(str(tmp_path), dict(FAST_SETTINGS), rounds=1,
                                            pauses=1)
    assert result["to_active"]["count"] == result["to_topic_created"]["count"] == 1
    pauses = result["follower_pauses"]
    assert pauses["count"] == 1 and pauses["elections"] == 0
    assert pauses["paused_s"] == 5 * FAST_SETTINGS["controller.quorum.election.timeout.ms"] / 1000
    assert pauses["without_active"]["count"] == 1
    assert pauses["without_active"]["max_ms"] == 0
    report = controller.format_report({
        "settings": {}, "raft_secret": True, "fsync": {"fsyncs_per_s": 1000.0, "fsync_ms": 1.0},
        "topic_creations": {"sequential": {"clients": 1, "creations_per_s": 1.0, "p50_ms": 1.0,
                                           "p99_ms": 1.0}},
        "controller_failover": result,
        "broker_failover": {"to_new_leaders": {"p50_ms": 1.0, "max_ms": 1.0, "count": 1},
                            "session_timeout_ms": 3000}})
    assert "follower paused: no active controller" in report
    assert "elections caused: 0 of 1" in report


def test_bench_controller_creates_topics_on_a_flooded_disk_and_reports_the_raft_threads_stalls(
        tmp_path, monkeypatch):
    """`kraftlog bench controller`'s disk-flood part, short: creations keep
    succeeding while another process writes and fsyncs files beside the
    cluster, the flood's files are gone after, and each controller reports
    the longest its Raft thread went without reading its sockets."""
    from bench import controller
    from chaos.cluster import FAST_SETTINGS

    monkeypatch.setattr(controller, "FLOOD_FILE_MB", 16)
    result = controller.disk_flood(str(tmp_path), dict(FAST_SETTINGS), seconds=2)
    assert result["creations"]["count"] >= 1
    assert {"elections", "failed", "file_mb"} <= set(result) and result["file_mb"] == 16
    stalls = result["busy_max_ms"]
    assert len(stalls) == 3 and all(ms > 0 for ms in stalls.values()), stalls
    assert os.listdir(tmp_path / "flood-files") == []
    report = controller.format_report({
        "settings": {}, "raft_secret": True, "fsync": {"fsyncs_per_s": 1000.0, "fsync_ms": 1.0},
        "topic_creations": {"sequential": {"clients": 1, "creations_per_s": 1.0, "p50_ms": 1.0,
                                           "p99_ms": 1.0}},
        "controller_failover": {key: {"p50_ms": 1.0, "max_ms": 1.0, "count": 1}
                                for key in ("to_active", "to_topic_created")},
        "broker_failover": {"to_new_leaders": {"p50_ms": 1.0, "max_ms": 1.0, "count": 1},
                            "session_timeout_ms": 3000},
        "disk_flood": result})
    assert "disk flooded for 2 s (another process writing 16 MiB files" in report
    assert "longest a Raft thread went without reading its sockets: controller" in report


def test_bench_controller_refuses_a_negative_existing_topics():
    result = subprocess.run([sys.executable, "-m", "api.cli", "bench", "controller",
                             "--existing-topics", "-1"], capture_output=True, text=True,
                            timeout=60, cwd=REPO_ROOT)
    assert result.returncode == 2 and "--existing-topics must be 0 or more" in result.stderr
