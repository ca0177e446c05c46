"""Log compaction with real processes: one controller, three brokers.

- A compacted topic with RF=3 takes keyed writes while its leader is killed
  (the cleaners run every few hundred milliseconds on small segments, so
  passes are under way when it dies); after a final round that gives every
  key a known last value (some a tombstone), every replica's log, read from
  its files, holds exactly that latest value per key, each key once in the
  part it has cleaned, at the offsets the leader assigned.
- A consumer group's committed offsets survive a restart of every broker
  once ``__consumer_offsets`` has been compacted.
- Bad input: an unknown policy, a negative ratio, a keyless record on a
  compacted topic are refused with clear errors and nothing is appended.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
import urllib.request

import pytest

from api.client import Admin, Consumer, KraftlogError, NewTopic, Producer, TopicPartition
from chaos.cluster import FAST_SETTINGS, ProcessCluster, http_json, wait_until
from storage.batch import decode_batches
from storage.config import LogConfig
from storage.log import Log

SETTINGS = {**FAST_SETTINGS, "replica.lag.time.max.ms": 2000,
            "replica.fetch.wait.max.ms": 200, "log.cleaner.backoff.ms": 200,
            "offsets.topic.segment.bytes": 16 * 1024, "offsets.topic.num.partitions": 1,
            "log.flush.interval.ms": 200}
COMPACTED = {"cleanup.policy": "compact", "segment.bytes": "8192",
             "min.cleanable.dirty.ratio": "0.01", "delete.retention.ms": "3600000",
             "min.insync.replicas": "2"}
KEYS = [b"key-%02d" % i for i in range(40)]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with ProcessCluster(str(tmp_path_factory.mktemp("compaction")), controllers=1, brokers=3,
                        settings=SETTINGS) as cluster:
        cluster.start()
        cluster.wait_for_brokers_running(timeout_s=30)
        yield cluster


def urls(cluster) -> list[str]:
    return [cluster.nodes[b].broker_url for b in cluster.broker_ids
            if cluster.nodes[b].running]


def describe(cluster, topic: str, broker: int | None = None) -> list[dict]:
    targets = [cluster.nodes[broker].broker_url] if broker is not None else urls(cluster)
    for url in targets:
        try:
            suffix = "?local=true" if broker is not None else ""
            return http_json(f"{url}/v1/topics/{topic}{suffix}")[1]["partitions"]
        except OSError:
            continue
    raise AssertionError("no broker answered")


def full_isr(cluster, topic: str) -> bool:
    parts = describe(cluster, topic)
    return bool(parts) and all(
        p["leader"] >= 0 and sorted(p["isr"]) == sorted(cluster.broker_ids)
        and p["replica_states"] is not None
        and len({r["log_end_offset"] for r in p["replica_states"]}) == 1 for p in parts)


def replica_records(cluster, broker: int, topic: str) -> list:
    """Every record of partition 0 in ``broker``'s own files (the broker is
    stopped), through the storage engine, as a recovering broker reads it."""
    directory = os.path.join(cluster.base_dir, f"data-{broker}", f"{topic}-0")
    log = Log.open(directory, LogConfig(cleanup_policy="compact"))
    try:
        return list(decode_batches(log.read(log.log_start_offset, 1 << 30))), \
            log.cleaner_state.first_dirty
    finally:
        log.abandon()


def test_every_replica_compacts_to_the_latest_value_per_key_across_a_leader_kill(cluster):
    topic = "table"
    with Admin(urls(cluster)) as admin:
        admin.create_topics([NewTopic(topic, 1, 3, configs=COMPACTED)])
    wait_until(lambda: full_isr(cluster, topic), 30, "the topic's ISR is full")

    stop = threading.Event()
    sent = [0]

    def load() -> None:
        with Producer(urls(cluster), acks="all", linger_ms=2, request_timeout_ms=5000,
                      delivery_timeout_ms=20_000) as producer:
            while not stop.is_set():
                handles = [producer.send(topic, b"v%d" % (sent[0] + i) * 20,
                                         key=KEYS[(sent[0] + i) % len(KEYS)])
                           for i in range(100)]
                sent[0] += 100
                for handle in handles:
                    try:
                        handle.result(timeout=30)
                    except KraftlogError:
                        pass  # the final round below fixes every key's last value

    thread = threading.Thread(target=load, daemon=True)
    thread.start()
    leader = describe(cluster, topic)[0]["leader"]
    # Passes happen on the leader before it dies.
    wait_until(lambda: (describe(cluster, topic, leader)[0].get("cleaner") or {})
               .get("last_clean_ms") is not None, 60, "a first pass on the leader")
    cluster.kill(leader)
    wait_until(lambda: describe(cluster, topic)[0]["leader"] not in (-1, leader), 30,
               "a new leader")
    time.sleep(1.0)  # more writes (and passes) under the new leader
    cluster.start([leader])
    cluster.wait_for_brokers_running(timeout_s=30)
    stop.set()
    thread.join(60)
    assert not thread.is_alive()
    wait_until(lambda: full_isr(cluster, topic), 60, "the ISR is full again")

    # The final round: every key's last value is known (a few are deleted).
    latest: dict[bytes, tuple[int, bytes | None]] = {}
    with Producer(urls(cluster), acks="all", linger_ms=5) as producer:
        for round_ in range(3):
            handles = []
            for i, key in enumerate(KEYS):
                value = None if round_ == 2 and i % 5 == 0 else b"final-%d-%d" % (round_, i)
                handles.append((key, value, producer.send(topic, value, key=key)))
            for key, value, handle in handles:
                latest[key] = (handle.result(timeout=30).offset, value)
        # Roll past the final round so it can be cleaned: filler on other keys.
        filler = [producer.send(topic, b"x" * 500, key=b"filler-%d" % (i % 3))
                  for i in range(60)]
        for handle in filler:
            handle.result(timeout=30)
    wait_until(lambda: full_isr(cluster, topic), 30, "equal log ends")
    last_final = max(offset for offset, _ in latest.values())

    def cleaned_past_final(broker: int) -> bool:
        part = describe(cluster, topic, broker)[0]
        return part["cleaner"]["first_dirty_offset"] > last_final

    for broker in cluster.broker_ids:
        wait_until(lambda b=broker: cleaned_past_final(b), 60,
                   f"broker {broker} cleaned past the final round")
    for broker in cluster.broker_ids:
        cluster.kill(broker)
    try:
        for broker in cluster.broker_ids:
            records, first_dirty = replica_records(cluster, broker, topic)
            view = {}
            for record in records:
                view[record.key] = (record.offset, record.value)
            for key, expected in latest.items():
                assert view[key] == expected, (broker, key, view.get(key), expected)
            cleaned_keys = [r.key for r in records if r.offset < first_dirty]
            assert len(cleaned_keys) == len(set(cleaned_keys)), (
                f"broker {broker}: a key appears twice below its cleaned point {first_dirty}")
            assert len(records) < sent[0] / 4, (broker, len(records), sent[0])
    finally:
        cluster.start(cluster.broker_ids)
        cluster.wait_for_brokers_running(timeout_s=30)


def test_a_group_resumes_from_a_compacted_consumer_offsets_after_every_broker_restarts(cluster):
    topic, group = "events", "compacted-group"
    with Admin(urls(cluster)) as admin:
        admin.create_topics([NewTopic(topic, 2, 3)])
    with Producer(urls(cluster), acks="all") as producer:
        for i in range(400):
            producer.send(topic, b"e%d" % i, partition=i % 2)
        producer.flush()
    tps = [TopicPartition(topic, 0), TopicPartition(topic, 1)]
    with Consumer(urls(cluster), group_id=group, enable_auto_commit=False,
                  auto_offset_reset="earliest", fetch_max_wait_ms=100) as consumer:
        consumer.subscribe([topic])
        deadline = time.monotonic() + 30
        while consumer.assignment() != set(tps):
            assert time.monotonic() < deadline, "the member got no assignment"
            consumer.poll(timeout_ms=200)
        for n in range(1, 201):  # 400 commits: many superseded records per key
            consumer.commit({tps[0]: n, tps[1]: 2 * n - 1})
            consumer.commit({tps[0]: n, tps[1]: 2 * n - (n % 2)})
        expected = consumer.committed(tps)
    assert expected == {tps[0]: 200, tps[1]: 400}

    def offsets_compacted() -> bool:
        """The leader's log holds far less than the 800 records committed
        (about 56 KB): the cleaner removed the superseded commits."""
        leader = describe(cluster, "__consumer_offsets")[0]["leader"]
        local = describe(cluster, "__consumer_offsets", leader)[0]
        return (local["cleaner"]["last_clean_ms"] is not None
                and local["size_bytes"] < 30_000)

    wait_until(offsets_compacted, 60, "__consumer_offsets was compacted")

    for broker in cluster.broker_ids:
        cluster.kill(broker)
    cluster.start(cluster.broker_ids)
    cluster.wait_for_brokers_running(timeout_s=30)

    def committed():
        try:
            with Consumer(urls(cluster), group_id=group, enable_auto_commit=False,
                          request_timeout_ms=3000) as consumer:
                consumer.subscribe([topic])
                return consumer.committed(tps)
        except KraftlogError:
            return None

    wait_until(lambda: committed() == expected, 60,
               "the group's offsets are back after the restart")


def test_bad_compaction_configs_and_keyless_records_are_refused(cluster):
    with Admin(urls(cluster)) as admin:
        for configs, words in (({"cleanup.policy": "compress"}, "cleanup.policy"),
                               ({"min.cleanable.dirty.ratio": "-0.5"}, "min.cleanable"),
                               ({"min.cleanable.dirty.ratio": "1.5"}, "min.cleanable"),
                               ({"delete.retention.ms": "-1"}, "delete.retention.ms")):
            with pytest.raises(KraftlogError) as refused:
                admin.create_topics([NewTopic("bad-compaction", 1, 1, configs=configs)])
            assert refused.value.code == "INVALID_CONFIG", refused.value
            assert words in str(refused.value)
        admin.create_topics([NewTopic("keyed-only", 1, 3, configs=COMPACTED)])
    wait_until(lambda: full_isr(cluster, "keyed-only"), 30, "the topic's ISR is full")
    with Producer(urls(cluster), acks="all", retries=0) as producer:
        with pytest.raises(KraftlogError) as refused:
            producer.send("keyed-only", b"no key").result(timeout=30)
        assert refused.value.code == "INVALID_RECORD", refused.value
        assert "key" in str(refused.value)
        producer.send("keyed-only", b"v", key=b"k").result(timeout=30)
    end = describe(cluster, "keyed-only")[0]["log_end_offset"]
    assert end == 1, "the keyless record was appended"


def test_reads_inside_a_removed_range_resume_at_the_next_record(cluster):
    """Offsets whose records compaction removed: the consumer, the REST
    read and the CLI all go on from the next record that is left."""
    topic = "gaps"
    with Admin(urls(cluster)) as admin:
        admin.create_topics([NewTopic(topic, 1, 3, configs=COMPACTED)])
    wait_until(lambda: full_isr(cluster, topic), 30, "the topic's ISR is full")
    with Producer(urls(cluster), acks="all") as producer:
        for round_ in range(2):  # the second round supersedes the first
            for i in range(10):
                producer.send(topic, b"r%d" % round_, key=b"k%d" % i).result(timeout=30)
        for i in range(40):  # roll the rounds out of the active segment
            producer.send(topic, b"f" * 400, key=b"filler").result(timeout=30)
    leader = describe(cluster, topic)[0]["leader"]
    wait_until(lambda: describe(cluster, topic, leader)[0]["cleaner"]["first_dirty_offset"]
               > 20, 60, "the rounds were compacted")

    url = cluster.nodes[leader].broker_url
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as response:
        metrics = dict(line.rsplit(" ", 1) for line in response.read().decode().splitlines()
                       if line.startswith("kraftlog_cleaner_"))
    assert float(metrics["kraftlog_cleaner_passes_total"]) >= 1, metrics
    assert float(metrics["kraftlog_cleaner_bytes_cleaned_total"]) > 0, metrics
    assert 0 <= float(metrics["kraftlog_cleaner_recopy_percent"]) <= 100, metrics
    assert 0 <= float(metrics["kraftlog_cleaner_max_dirty_percent"]) <= 100, metrics
    assert float(metrics["kraftlog_cleaner_time_since_last_run_seconds"]) >= 0, metrics
    status, body = http_json(f"{url}/topics/{topic}/partitions/0/records?offset=3")
    assert status == 200, body
    assert [r["offset"] for r in body][:3] == [10, 11, 12], body[:3]

    tp = TopicPartition(topic, 0)
    with Consumer(urls(cluster), fetch_max_wait_ms=100) as consumer:
        consumer.assign([tp])
        consumer.seek(tp, 3)
        end = consumer.end_offsets([tp])[tp]
        seen = []
        deadline = time.monotonic() + 30
        while consumer.position(tp) < end:
            assert time.monotonic() < deadline, f"stuck at {consumer.position(tp)} of {end}"
            seen += [(r.offset, r.key, r.value) for r in consumer.poll(timeout_ms=500)]
    assert seen[:10] == [(10 + i, b"k%d" % i, b"r1") for i in range(10)]
    assert [o for o, _, _ in seen] == sorted({o for o, _, _ in seen})

    result = subprocess.run([sys.executable, "-m", "api.cli", "--bootstrap", url, "topics",
                             "describe", topic], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    header = next(line for line in lines if line.startswith("PARTITION"))
    row = lines[lines.index(header) + 1:][-1]
    assert "CLEANABLE" in header and "LAST-CLEAN" in header, result.stdout
    assert "never" not in row and "%" in row, result.stdout


def test_an_internal_topic_created_before_compaction_becomes_compacted(cluster):
    """A cluster upgraded from a version without compaction has an
    uncompacted __consumer_offsets (retention off): the group coordinator
    makes it compacted the first time it is used."""
    with Admin(urls(cluster)) as admin:
        admin.create_topics([NewTopic("upgrade-events", 1, 3)])
    with Consumer(urls(cluster), group_id="upgrade-check") as consumer:
        consumer.subscribe(["upgrade-events"])  # the coordinator creates its topic
        consumer.committed([TopicPartition("upgrade-events", 0)])
    with Admin(urls(cluster)) as admin:
        admin.alter_configs("__consumer_offsets", {"cleanup.policy": "delete",
                                                   "retention.ms": "-1",
                                                   "retention.bytes": "-1"})
    for broker in cluster.broker_ids:  # a new process: the check runs once per process
        cluster.kill(broker)
    cluster.start(cluster.broker_ids)
    cluster.wait_for_brokers_running(timeout_s=30)

    def configs() -> dict:
        return http_json(f"{urls(cluster)[0]}/v1/topics/__consumer_offsets")[1]["configs"]

    assert configs()["cleanup.policy"] == "delete"

    def upgraded() -> bool:
        try:
            with Consumer(urls(cluster), group_id="upgrade-check",
                          request_timeout_ms=3000) as consumer:
                consumer.subscribe(["upgrade-events"])
                consumer.committed([TopicPartition("upgrade-events", 0)])
        except KraftlogError:
            return False
        found = configs()
        return found.get("cleanup.policy") == "compact" and "retention.ms" not in found

    wait_until(upgraded, 60, "__consumer_offsets made compacted")
