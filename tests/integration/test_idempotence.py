"""Idempotent produce against real brokers: producer ids, duplicate retries,
refused sequences and epochs, and a producer whose leader is killed.

The leader's rules are unit-tested in tests/unit/test_producer_state.py;
here the same rules must hold through HTTP, across restarts and failover,
with the shipped client retrying on its own."""

from __future__ import annotations

import signal
import threading
import time

import pytest

from api.client import Admin, Consumer, NewTopic, Producer, TopicPartition
from chaos.cluster import FAST_SETTINGS, ProcessCluster, wait_until
from storage.batch import BatchBuilder
from tests.integration.test_broker_api import (assert_error, assert_serving, call,
                                               create_topic, post, produce, read_all)


def pbatch(pid: int, epoch: int, seq: int, values: list[bytes]) -> bytes:
    builder = BatchBuilder(producer_id=pid, producer_epoch=epoch, base_sequence=seq)
    for value in values:
        builder.append(None, value, timestamp_ms=int(time.time() * 1000))
    return builder.build()


def init_producer(url: str) -> tuple[int, int]:
    answer = call(url, "/v1/producers/init", {"transactional_id": None})
    return answer["producer_id"], answer["producer_epoch"]


def values_of(url: str, topic: str, partition: int = 0) -> list[bytes]:
    return [r[3] for r in read_all(url, topic, partition)]


def test_a_retried_batch_is_answered_with_its_original_offset_and_stored_once(url):
    create_topic(url, "idem-dup")
    pid, epoch = init_producer(url)
    first = pbatch(pid, epoch, 0, [b"a", b"b"])
    (one,) = produce(url, [("idem-dup", 0, first)], acks=-1)
    (two,) = produce(url, [("idem-dup", 0, pbatch(pid, epoch, 2, [b"c"]))], acks=-1)
    (again,) = produce(url, [("idem-dup", 0, first)], acks=-1)
    assert (one["error"], two["error"], again["error"]) == (None, None, None)
    assert (one["base_offset"], two["base_offset"], again["base_offset"]) == (0, 2, 0)
    assert values_of(url, "idem-dup") == [b"a", b"b", b"c"]


def test_gaps_old_epochs_and_malformed_batches_are_refused_and_nothing_is_appended(url):
    create_topic(url, "idem-bad")
    pid, epoch = init_producer(url)
    produce(url, [("idem-bad", 0, pbatch(pid, 1, 0, [b"a"]))], acks=-1)
    cases = [
        (pbatch(pid, 1, 5, [b"gap"]), "OUT_OF_ORDER_SEQUENCE_NUMBER"),
        (pbatch(pid, 0, 1, [b"old"]), "INVALID_PRODUCER_EPOCH"),
        (pbatch(pid, 2, 3, [b"new epoch, not at 0"]), "OUT_OF_ORDER_SEQUENCE_NUMBER"),
        (pbatch(pid, 1, 1, [b"x"]) + pbatch(pid, 1, 2, [b"y"]), "INVALID_RECORD"),
        (pbatch(pid, 1, -1, [b"no sequence"]), "INVALID_RECORD"),
    ]
    for records, code in cases:
        (result,) = produce(url, [("idem-bad", 0, records)], acks=-1)
        assert result["error"]["code"] == code, result
        assert result["error"]["message"]
    assert values_of(url, "idem-bad") == [b"a"]
    assert_serving(url)


def test_init_producer_id_hands_out_distinct_ids_across_blocks_and_checks_its_input(url):
    ids = [init_producer(url) for _ in range(1_100)]  # crosses a 1,000-id block
    assert len({pid for pid, _ in ids}) == 1_100 and {e for _, e in ids} == {0}
    assert_error(post(url, "/v1/producers/init", {"transaction_timeout_ms": -5}), 400,
                 "INVALID_REQUEST")
    assert_error(post(url, "/v1/producers/init", [1, 2]), 400, "INVALID_REQUEST")
    assert_serving(url)


def test_producer_state_survives_a_clean_restart(single):
    url = single.nodes[1].broker_url
    create_topic(url, "idem-restart")
    pid, epoch = init_producer(url)
    batch = pbatch(pid, epoch, 0, [b"a"])
    produce(url, [("idem-restart", 0, batch)], acks=-1)
    single.kill(1, signal.SIGTERM)
    single.start([1])
    single.wait_for_brokers_running(timeout_s=30)
    # The broker remembers the batch: a retry after the restart is a duplicate.
    wait_until(lambda: produce(url, [("idem-restart", 0, batch)], acks=-1)[0]["error"] is None,
               15, "the partition to be writable again")
    assert values_of(url, "idem-restart") == [b"a"]


# -- failover with the real client ---------------------------------------------------

@pytest.fixture(scope="module")
def three(tmp_path_factory):
    settings = {**FAST_SETTINGS, "replica.lag.time.max.ms": 2000,
                "replica.fetch.wait.max.ms": 200}
    with ProcessCluster(str(tmp_path_factory.mktemp("idem3")), controllers=1, brokers=3,
                        settings=settings) as cluster:
        cluster.start()
        cluster.wait_for_brokers_running(timeout_s=30)
        yield cluster


def test_killing_leaders_under_an_idempotent_producer_loses_and_duplicates_nothing(three):
    urls = [three.nodes[b].broker_url for b in three.broker_ids]
    with Admin(urls) as admin:
        admin.create_topics([NewTopic("idem-kill", 2, 3, configs={"min.insync.replicas": "2"})])
    acked: dict[int, list[bytes]] = {0: [], 1: []}
    failed: list[Exception] = []
    stop = threading.Event()

    def load() -> None:
        with Producer(urls, linger_ms=2, request_timeout_ms=3000,
                      delivery_timeout_ms=60_000, retry_backoff_ms=50) as producer:
            # Until the test has killed and restarted both leaders (bounded in
            # time, not in records: a count runs out before the second kill
            # when the producer outpaces the restarts).
            i, deadline = 0, time.monotonic() + 120
            while not stop.is_set() and time.monotonic() < deadline:
                handles = []
                for _ in range(50):
                    value = b"%06d" % i
                    handles.append((i % 2, value, producer.send("idem-kill", value,
                                                                partition=i % 2)))
                    i += 1
                for partition, value, handle in handles:
                    try:
                        handle.result(70)
                        acked[partition].append(value)
                    except Exception as exc:  # noqa: BLE001  reported below
                        failed.append(exc)

    thread = threading.Thread(target=load)
    thread.start()
    try:
        wait_until(lambda: len(acked[0]) > 500, 30, "the load to start")
        for _ in range(2):
            leader = wait_until(lambda: _leader(urls, "idem-kill", 0), 20, "a leader")
            three.kill(leader)
            count = len(acked[0])
            wait_until(lambda: len(acked[0]) > count + 300, 30, "writes after the kill")
            three.start([leader])
            three.wait_for_brokers_running(timeout_s=30)
    finally:
        stop.set()
        thread.join(120)
    assert not thread.is_alive()
    assert not failed, failed[:3]
    with Consumer(urls) as consumer:
        for partition in (0, 1):
            tp = TopicPartition("idem-kill", partition)
            consumer.assign([tp])
            consumer.seek(tp, 0)
            seen: list[bytes] = []
            deadline = time.monotonic() + 30
            while len(seen) < len(acked[partition]) and time.monotonic() < deadline:
                seen.extend(r.value for r in consumer.poll(timeout_ms=500))
            # Every acknowledged record once, in send order; no duplicates.
            assert seen == acked[partition], (partition, len(seen), len(acked[partition]))


def _leader(urls: list[str], topic: str, partition: int) -> int | None:
    from chaos.cluster import http_json
    for base in urls:
        try:
            status, answer = http_json(f"{base}/v1/topics/{topic}")
        except OSError:
            continue
        if status == 200:
            for entry in answer["partitions"]:
                if entry["partition"] == partition and entry.get("leader", -1) >= 0:
                    return entry["leader"]
    return None
