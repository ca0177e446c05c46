"""Replication with real processes: one controller and three brokers on
loopback, topics with RF=3, ``acks=all`` and ``min.insync.replicas=2``.

Each test starts a load of unique values, hurts the cluster (kill -9 of the
leader, of two of three brokers, SIGSTOP of a follower), heals it, and then
reads every partition from the beginning. Writes are sent once (the
producer does not retry), so an acknowledged value must be read exactly once,
at the very offset its acknowledgement named; a refused or timed-out one may
or may not be there. The replicas' logs must end up the same size: a broker
that returns truncates whatever the new leader does not have."""

from __future__ import annotations

import signal
import threading
import time
from dataclasses import dataclass, field

import pytest

from api.client import Admin, Consumer, NewTopic, Producer, TopicPartition
from chaos.cluster import FAST_SETTINGS, ProcessCluster, http_json, metric, wait_until

LAG_TIME_MAX_MS = 2000
FETCH_WAIT_MAX_MS = 200
SETTINGS = {**FAST_SETTINGS, "replica.lag.time.max.ms": LAG_TIME_MAX_MS,
            "replica.fetch.wait.max.ms": FETCH_WAIT_MAX_MS,
            "replica.high.watermark.checkpoint.interval.ms": 500}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with ProcessCluster(str(tmp_path_factory.mktemp("replication")), controllers=1, brokers=3,
                        settings=SETTINGS) as cluster:
        cluster.start()
        cluster.wait_for_brokers_running(timeout_s=30)
        yield cluster


@pytest.fixture
def healed(cluster):
    """Every broker running again after the test, whatever it did."""
    yield cluster
    for broker in cluster.broker_ids:
        node = cluster.nodes[broker]
        if node.paused:
            cluster.resume(broker)
        if not node.running:
            cluster.start([broker])
    cluster.wait_for_brokers_running(timeout_s=30)


def urls(cluster) -> list[str]:
    return [cluster.nodes[b].broker_url for b in cluster.broker_ids
            if cluster.nodes[b].running and not cluster.nodes[b].paused]


def create_topic(cluster, name: str, partitions: int) -> None:
    with Admin(urls(cluster)) as admin:
        admin.create_topics([NewTopic(name, partitions, 3,
                                      configs={"min.insync.replicas": "2"})])
    wait_for_full_isr(cluster, name, partitions)


def describe(cluster, name: str) -> list[dict]:
    for url in urls(cluster):
        try:
            return http_json(f"{url}/v1/topics/{name}")[1]["partitions"]
        except OSError:
            continue
    raise AssertionError("no broker answered")


def wait_for_full_isr(cluster, name: str, partitions: int, timeout_s: float = 30) -> None:
    """Until every partition has a leader and all three replicas in sync,
    with equal log ends on every replica."""
    def full() -> bool:
        parts = describe(cluster, name)
        return len(parts) == partitions and all(
            p["leader"] >= 0 and sorted(p["isr"]) == sorted(cluster.broker_ids)
            and p["replica_states"] is not None
            and len({r["log_end_offset"] for r in p["replica_states"]}) == 1
            for p in parts)
    wait_until(full, timeout_s, f"{name}: full ISR and equal log ends on every replica")


def leader_of(cluster, name: str, partition: int) -> int:
    return next(p["leader"] for p in describe(cluster, name) if p["partition"] == partition)


@dataclass
class Load:
    """Unique values sent once each with acks=all; the outcome of each."""

    topic: str
    bootstrap: list[str]
    acked: dict[bytes, tuple[int, int]] = field(default_factory=dict)  # value -> (p, offset)
    failed: dict[bytes, str] = field(default_factory=dict)
    stop: threading.Event = field(default_factory=threading.Event)
    thread: threading.Thread | None = None

    def start(self) -> "Load":
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        return self

    def _run(self) -> None:
        with Producer(self.bootstrap, acks="all", retries=0, linger_ms=2,
                      request_timeout_ms=5000, delivery_timeout_ms=10_000) as producer:
            n = 0
            while not self.stop.is_set():
                handles = []
                for _ in range(50):
                    value = b"%s-%d" % (self.topic.encode(), n)
                    n += 1
                    handles.append((value, producer.send(self.topic, value, key=value)))
                for value, handle in handles:
                    try:
                        meta = handle.result(timeout=30)
                        self.acked[value] = (meta.partition, meta.offset)
                    except Exception as exc:  # noqa: BLE001  every outcome is recorded
                        self.failed[value] = getattr(exc, "code", type(exc).__name__)
                time.sleep(0.01)

    def acked_since(self, count: int) -> int:
        return len(self.acked) - count

    def finish(self) -> None:
        self.stop.set()
        assert self.thread is not None
        self.thread.join(60)
        assert not self.thread.is_alive(), "the load did not stop"


def read_everything(cluster, topic: str, partitions: int) -> dict[tuple[int, int], bytes]:
    """(partition, offset) -> value for every committed record."""
    tps = [TopicPartition(topic, p) for p in range(partitions)]
    with Consumer(urls(cluster), auto_offset_reset="earliest") as consumer:
        ends = consumer.end_offsets(tps)
        consumer.assign(tps)
        seen: dict[tuple[int, int], bytes] = {}
        deadline = time.monotonic() + 60
        while any(consumer.position(tp) < ends[tp] for tp in tps):
            assert time.monotonic() < deadline, "reading back took too long"
            for record in consumer.poll(timeout_ms=500):
                assert (record.partition, record.offset) not in seen
                seen[(record.partition, record.offset)] = record.value
    return seen


def check_history(load: Load, seen: dict[tuple[int, int], bytes]) -> None:
    """Acknowledged: read exactly once, where the acknowledgement said.
    Nothing read that was never sent; no value twice."""
    where: dict[bytes, list[tuple[int, int]]] = {}
    for position, value in seen.items():
        where.setdefault(value, []).append(position)
    duplicated = {v: ps for v, ps in where.items() if len(ps) > 1}
    assert not duplicated, f"values read at several offsets: {list(duplicated.items())[:5]}"
    sent = load.acked.keys() | load.failed.keys()
    unexpected = [v for v in where if v not in sent]
    assert not unexpected, f"read but never sent: {unexpected[:5]}"
    lost = [v for v in load.acked if v not in where]
    assert not lost, f"{len(lost)} acknowledged values lost, e.g. {lost[:5]}"
    moved = [(v, load.acked[v], where[v][0]) for v in load.acked if where[v][0] != load.acked[v]]
    assert not moved, f"acknowledged values read at other offsets: {moved[:5]}"


def replica_sizes(cluster, topic: str) -> dict[int, dict[int, tuple[int, int]]]:
    """partition -> broker -> (log end offset, size in bytes), as each
    replica sees its own log."""
    sizes: dict[int, dict[int, tuple[int, int]]] = {}
    for broker in cluster.broker_ids:
        local = http_json(f"{cluster.nodes[broker].broker_url}/v1/topics/{topic}?local=true")[1]
        for p in local["partitions"]:
            sizes.setdefault(p["partition"], {})[broker] = (p["log_end_offset"],
                                                            p["size_bytes"])
    return sizes


def wait_for_identical_replicas(cluster, topic: str, partitions: int) -> None:
    wait_for_full_isr(cluster, topic, partitions)
    wait_until(lambda: all(len(set(by_broker.values())) == 1 and len(by_broker) == 3
                           for by_broker in replica_sizes(cluster, topic).values()),
               30, f"{topic}: the same log end and size on every replica")


# -- tests ---------------------------------------------------------------------------

def test_follower_logs_are_byte_for_byte_copies_and_acks_wait_for_the_isr(healed):
    cluster = healed
    create_topic(cluster, "copies", 3)
    load = Load("copies", urls(cluster)).start()
    wait_until(lambda: len(load.acked) >= 2000, 30, "2000 acknowledged writes")
    load.finish()
    assert not load.failed, list(load.failed.items())[:5]
    wait_for_identical_replicas(cluster, "copies", 3)
    for p in describe(cluster, "copies"):
        # Every acknowledged write is below the high watermark.
        acked_here = [o for part, o in load.acked.values() if part == p["partition"]]
        assert p["high_watermark"] > max(acked_here)
        assert all(r["lag"] == 0 for r in p["replica_states"])
    check_history(load, read_everything(cluster, "copies", 3))


def test_leader_killed_under_load_a_new_leader_serves_and_nothing_acknowledged_is_lost(healed):
    cluster = healed
    create_topic(cluster, "failover", 3)
    load = Load("failover", urls(cluster)).start()
    wait_until(lambda: len(load.acked) >= 1000, 30, "1000 acknowledged writes")
    victim = leader_of(cluster, "failover", 0)
    cluster.kill(victim, signal.SIGKILL)
    killed_at = len(load.acked)
    wait_until(lambda: leader_of(cluster, "failover", 0) not in (victim, -1), 15,
               f"a new leader of failover-0 other than broker {victim}")
    wait_until(lambda: any(p == 0 for p, _ in list(load.acked.values())[killed_at:]), 20,
               "an acknowledged write on the new leader of partition 0")
    cluster.start([victim])  # it returns as a follower and truncates if it must
    cluster.wait_for_brokers_running(timeout_s=30)
    wait_until(lambda: load.acked_since(killed_at) >= 1000, 30, "writes going on")
    load.finish()
    wait_for_identical_replicas(cluster, "failover", 3)
    check_history(load, read_everything(cluster, "failover", 3))


def test_two_of_three_brokers_killed_writes_are_refused_never_acknowledged_then_lost(healed):
    cluster = healed
    create_topic(cluster, "minority", 1)
    load = Load("minority", urls(cluster)).start()
    wait_until(lambda: len(load.acked) >= 500, 30, "500 acknowledged writes")
    load.finish()
    survivor = leader_of(cluster, "minority", 0)
    victims = [b for b in cluster.broker_ids if b != survivor]
    for broker in victims:
        cluster.kill(broker, signal.SIGKILL)
    wait_until(lambda: describe(cluster, "minority")[0]["isr"] == [survivor], 15,
               f"the ISR shrunk to broker {survivor}")
    survivor_url = cluster.nodes[survivor].broker_url
    assert metric(survivor_url, "kraftlog_under_min_isr_partitions") >= 1
    assert metric(survivor_url, "kraftlog_under_replicated_partitions") >= 1
    with Producer(urls(cluster), acks="all", retries=0, request_timeout_ms=3000,
                  delivery_timeout_ms=5000) as producer:
        handles = [producer.send("minority", b"refused-%d" % i) for i in range(20)]
        codes = set()
        for handle in handles:
            with pytest.raises(Exception) as refused:
                handle.result(timeout=30)
            codes.add(getattr(refused.value, "code", None))
    assert codes == {"NOT_ENOUGH_REPLICAS"}, codes
    cluster.start(victims)
    cluster.wait_for_brokers_running(timeout_s=30)
    wait_for_identical_replicas(cluster, "minority", 1)
    seen = read_everything(cluster, "minority", 1)
    check_history(load, {pos: v for pos, v in seen.items() if not v.startswith(b"refused")})
    assert not [v for v in seen.values() if v.startswith(b"refused")]


def test_a_paused_follower_leaves_the_isr_writes_go_on_and_it_rejoins(healed):
    cluster = healed
    create_topic(cluster, "paused", 1)
    leader = leader_of(cluster, "paused", 0)
    follower = next(b for b in cluster.broker_ids if b != leader)
    leader_url = cluster.nodes[leader].broker_url
    load = Load("paused", urls(cluster)).start()
    wait_until(lambda: len(load.acked) >= 300, 30, "300 acknowledged writes")
    cluster.pause(follower)
    wait_until(lambda: follower not in describe(cluster, "paused")[0]["isr"], 15,
               f"broker {follower} out of the ISR")
    assert metric(leader_url, "kraftlog_under_replicated_partitions") >= 1
    paused_at = len(load.acked)
    wait_until(lambda: load.acked_since(paused_at) >= 500, 30,
               "acks=all writes going on with two in-sync replicas")
    cluster.resume(follower)
    wait_until(lambda: follower in describe(cluster, "paused")[0]["isr"], 30,
               f"broker {follower} back in the ISR")
    load.finish()
    wait_for_identical_replicas(cluster, "paused", 1)
    assert metric(leader_url, "kraftlog_isr_expands_total") >= 1
    check_history(load, read_everything(cluster, "paused", 1))


def test_acks_all_is_not_acknowledged_while_an_isr_member_lacks_the_write(healed):
    cluster = healed
    create_topic(cluster, "waiting", 1)
    leader = leader_of(cluster, "waiting", 0)
    followers = [b for b in cluster.broker_ids if b != leader]
    leader_url = cluster.nodes[leader].broker_url
    for broker in followers:  # shorter than the session: both stay in the ISR
        cluster.pause(broker)
    try:
        with Producer([leader_url], acks="all", retries=0, request_timeout_ms=600,
                      delivery_timeout_ms=5000) as producer:
            handle = producer.send("waiting", b"unreplicated")
            with pytest.raises(Exception) as timed_out:
                handle.result(timeout=10)
        assert getattr(timed_out.value, "code", None) == "REQUEST_TIMED_OUT", timed_out.value
    finally:
        for broker in followers:
            cluster.resume(broker)
    # Once the followers have it, the write is committed after all (an
    # unknown outcome, as Kafka's timeouts are), and acks=all works again.
    with Producer([leader_url], acks="all", retries=0) as producer:
        assert producer.send("waiting", b"replicated").result(timeout=30).offset == 1
    wait_for_identical_replicas(cluster, "waiting", 1)


def test_a_returning_leader_truncates_records_the_new_leader_never_had(healed):
    """KIP-101's case: the old leader appended records no follower fetched,
    died, and comes back after a follower took over. It must drop them, not
    keep them beside the new leader's records at the same offsets."""
    cluster = healed
    create_topic(cluster, "diverge", 1)
    old_leader = leader_of(cluster, "diverge", 0)
    followers = [b for b in cluster.broker_ids if b != old_leader]
    old_url = cluster.nodes[old_leader].broker_url
    with Producer([old_url], acks="all", retries=0) as producer:
        acked = [producer.send("diverge", b"before-%d" % i) for i in range(100)]
        producer.flush()
        assert [h.result(10).offset for h in acked] == list(range(100))
    for broker in followers:
        cluster.pause(broker)
    try:
        # A paused follower's fetch already waiting at the leader would still
        # be answered (into its socket) with the next records; let those
        # long-polls run out first (the leader ends them after
        # replica.fetch.wait.max.ms), so the next records reach no follower.
        time.sleep(2.5 * FETCH_WAIT_MAX_MS / 1000)
        with Producer([old_url], acks="all", retries=0, request_timeout_ms=300,
                      delivery_timeout_ms=5000) as producer:
            stranded = [producer.send("diverge", b"stranded-%d" % i) for i in range(5)]
            for handle in stranded:
                with pytest.raises(Exception):
                    handle.result(timeout=10)
        cluster.kill(old_leader, signal.SIGKILL)
    finally:
        for broker in followers:
            cluster.resume(broker)
    wait_until(lambda: leader_of(cluster, "diverge", 0) in followers, 15,
               "a follower leading diverge-0")
    with Producer(urls(cluster), acks="all", retries=3) as producer:
        after = [producer.send("diverge", b"after-%d" % i) for i in range(50)]
        producer.flush()
        offsets = [h.result(10).offset for h in after]
    assert offsets == list(range(100, 150))  # the stranded offsets were reused
    cluster.start([old_leader])
    cluster.wait_for_brokers_running(timeout_s=30)
    wait_for_identical_replicas(cluster, "diverge", 1)
    values = read_everything(cluster, "diverge", 1)
    assert [values[(0, o)] for o in range(150)] == \
        [b"before-%d" % i for i in range(100)] + [b"after-%d" % i for i in range(50)]


def test_partitions_added_to_a_live_topic_are_replicated_too(healed):
    cluster = healed
    create_topic(cluster, "growing", 1)
    with Admin(urls(cluster)) as admin:
        admin.create_partitions({"growing": 3})
    wait_for_full_isr(cluster, "growing", 3)
    load = Load("growing", urls(cluster)).start()
    wait_until(lambda: {p for p, _ in list(load.acked.values())} == {0, 1, 2}, 30,
               "acknowledged writes on every partition")
    load.finish()
    wait_for_identical_replicas(cluster, "growing", 3)
    check_history(load, read_everything(cluster, "growing", 3))
