"""Disk errors on a real broker: one controller and three brokers on
loopback, the first broker with two log directories, the second of which
gets real I/O errors from ``chaos/faultyio.c`` (preloaded into that broker's
process: EIO on write, read or fsync, or ENOSPC on write).

What a Kafka user depends on (Kafka's log dir failure handling): the broker
takes the failed directory offline and keeps serving the other; it stops
leading the partitions that were in it and leaves their ISRs, so the
controller elects other leaders; ``/v1/brokers``, ``/v1/log-dirs`` and the
metrics say so; no acknowledged write is lost, duplicated or moved (acks=all
writes sent once each, read back from offset 0); and a restart with the
disk healthy brings the directory and its replicas back.
"""

from __future__ import annotations

import os
import signal

import pytest

from api.client import Admin, NewTopic
from chaos import faultyio
from chaos.cluster import ProcessCluster, http_json, metric, wait_until
from tests.integration.test_replication import (SETTINGS, Load, check_history, describe,
                                                read_everything, urls, wait_for_full_isr)

FAULTY = 2  # nodes: controller 1, brokers 2, 3, 4; broker 2's second dir fails
PARTITIONS = 4
# Broker 2 leads partitions 1 and 3 and follows 0 and 2; its logs are made
# in partition order, each in the emptier dir: 0, 2 in d0 and 1, 3 in d1.
ASSIGNMENTS = {0: [3, 2, 4], 1: [2, 3, 4], 2: [4, 2, 3], 3: [2, 4, 3]}


@pytest.fixture(scope="module")
def faulty(tmp_path_factory):
    base = str(tmp_path_factory.mktemp("disk-faults"))
    cluster = ProcessCluster(base, controllers=1, brokers=3, settings=SETTINGS, log_dirs=2)
    disk = faultyio.FaultyDir(cluster.log_dirs_of(FAULTY)[1], os.path.join(base, "faults"))
    cluster.env[FAULTY] = disk.env()
    with cluster:
        cluster.start()
        cluster.wait_for_brokers_running(timeout_s=30)
        yield cluster, disk


def broker_entry(cluster, broker_id: int) -> dict:
    """The broker as the metadata lists it (asked of a healthy broker)."""
    url = cluster.nodes[3].broker_url
    brokers = http_json(f"{url}/v1/brokers")[1]["brokers"]
    return next(b for b in brokers if b["id"] == broker_id)


def heal(cluster, disk: faultyio.FaultyDir) -> None:
    """The faulty broker running with a healthy disk and nothing offline."""
    disk.clear()
    if broker_entry(cluster, FAULTY)["offline_log_dirs"] or not cluster.nodes[FAULTY].running:
        cluster.kill(FAULTY, signal.SIGTERM, timeout_s=30)
        cluster.start([FAULTY])
    cluster.wait_for_brokers_running(timeout_s=30)
    wait_until(lambda: broker_entry(cluster, FAULTY)["offline_log_dirs"] == []
               and not broker_entry(cluster, FAULTY)["fenced"], 30,
               "the faulty broker registered again with every dir online")


def layout(cluster, topic: str) -> dict[str, list[int]]:
    """The faulty broker's log dir -> its partitions of ``topic`` there."""
    url = cluster.nodes[FAULTY].broker_url
    dirs = http_json(f"{url}/v1/log-dirs?local=true&partitions=true")[1]["log_dirs"]
    return {d["path"]: sorted(r["partition"] for r in d["replicas"] if r["topic"] == topic)
            for d in dirs}


def create(cluster, topic: str) -> None:
    with Admin(urls(cluster)) as admin:
        admin.create_topics([NewTopic(topic, replica_assignments=ASSIGNMENTS, configs={
            "min.insync.replicas": "2", "flush.ms": "100"})])
    wait_for_full_isr(cluster, topic, PARTITIONS)


@pytest.mark.parametrize("fault", ["write", "enospc", "fsync", "read"])
def test_a_disk_error_takes_one_log_dir_offline_and_nothing_acknowledged_is_lost(faulty, fault):
    cluster, disk = faulty
    heal(cluster, disk)
    topic = f"disk-{fault}"
    create(cluster, topic)
    good, bad = cluster.log_dirs_of(FAULTY)
    placed = layout(cluster, topic)
    assert placed == {good: [0, 2], bad: [1, 3]}, f"the test's premise: {placed}"
    url = cluster.nodes[FAULTY].broker_url
    dirs = {d["path"]: d for d in http_json(f"{url}/v1/log-dirs?local=true")[1]["log_dirs"]}
    # This topic's two each, and earlier tests' topics'.
    in_bad, in_good = dirs[bad]["partitions"], dirs[good]["partitions"]
    load = Load(topic, urls(cluster)).start()
    try:
        wait_until(lambda: len(load.acked) >= 300, 30, "writes acknowledged before the fault")
        # Reads: followers fetch partitions 1 and 3 from broker 2's failing
        # dir all the time; writes: it appends to them as their leader;
        # fsync: flush.ms=100 fsyncs them within a few hundred ms.
        disk.inject(fault)
        # Its heartbeats report the dir, and the replicas in it, offline.
        wait_until(lambda: (entry := broker_entry(cluster, FAULTY))["offline_log_dirs"] == [bad]
                   and entry["offline_replicas"] == in_bad, 30,
                   f"broker {FAULTY} reports {bad} and its {in_bad} replicas offline after "
                   f"a {fault} fault")
        assert not broker_entry(cluster, FAULTY)["fenced"]

        def moved() -> bool:
            parts = {p["partition"]: p for p in describe(cluster, topic)}
            return all(parts[p]["leader"] not in (FAULTY, -1) and FAULTY not in parts[p]["isr"]
                       for p in (1, 3)) and all(FAULTY in parts[p]["isr"] for p in (0, 2))
        wait_until(moved, 30, "partitions 1 and 3 led elsewhere without broker 2 in their ISR; "
                              "broker 2 still in sync for 0 and 2")
        assert metric(url, "kraftlog_log_dirs_offline") == 1
        assert metric(url, "kraftlog_offline_replicas") == in_bad
        dirs = {d["path"]: d for d in http_json(f"{url}/v1/log-dirs?local=true")[1]["log_dirs"]}
        assert dirs[bad]["offline"] and "offline after a disk error" in dirs[bad]["error"]
        assert not dirs[good]["offline"] and dirs[good]["partitions"] == in_good
        acked = len(load.acked)
        wait_until(lambda: len(load.acked) >= acked + 300, 30,
                   "writes go on being acknowledged with the dir offline")
    finally:
        load.finish()
    assert cluster.nodes[FAULTY].running, "one dir is still online: the broker runs on"
    check_history(load, read_everything(cluster, topic, PARTITIONS))


def test_a_restart_with_the_disk_healthy_brings_the_dir_and_its_replicas_back(faulty):
    cluster, disk = faulty
    heal(cluster, disk)
    topic = "disk-restart"
    create(cluster, topic)
    bad = cluster.log_dirs_of(FAULTY)[1]
    disk.inject("write")
    # A write to broker 2's leaderships in that dir meets the error.
    load = Load(topic, urls(cluster)).start()
    try:
        wait_until(lambda: broker_entry(cluster, FAULTY)["offline_log_dirs"] == [bad], 30,
                   "the dir offline")
    finally:
        load.finish()
    heal(cluster, disk)
    wait_for_full_isr(cluster, topic, PARTITIONS)  # broker 2 back in every ISR
    assert layout(cluster, topic)[bad] == [1, 3]
    check_history(load, read_everything(cluster, topic, PARTITIONS))


def test_a_broker_whose_every_log_dir_fails_stops_with_status_1(faulty):
    """With no log dir left online the broker can neither lead nor follow:
    it stops (Kafka halts too) and says why; its partitions are led by the
    other replicas meanwhile, and a restart with the disk healthy brings it
    back."""
    cluster, disk = faulty
    heal(cluster, disk)
    topic = "disk-all"
    create(cluster, topic)
    node = cluster.nodes[FAULTY]
    whole = faultyio.FaultyDir(os.path.join(cluster.base_dir, f"data-{FAULTY}"),
                               os.path.join(cluster.base_dir, "faults-whole"))
    cluster.kill(FAULTY, signal.SIGTERM, timeout_s=30)
    cluster.env[FAULTY] = whole.env()
    try:
        cluster.start([FAULTY])
        cluster.wait_for_brokers_running(timeout_s=30)
        wait_for_full_isr(cluster, topic, PARTITIONS)
        whole.inject("write")
        load = Load(topic, urls(cluster)).start()
        try:
            wait_until(lambda: not node.running, 30, "the broker stopped")
        finally:
            load.finish()
        assert node.process.returncode == 1
        assert "every log dir is offline after disk errors" in cluster.log_tail(FAULTY, 60)
        check_history(load, read_everything(cluster, topic, PARTITIONS))
    finally:
        cluster.env[FAULTY] = disk.env()
        whole.clear()
    heal(cluster, disk)
    wait_for_full_isr(cluster, topic, PARTITIONS)
