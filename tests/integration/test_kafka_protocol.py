"""Real Kafka clients against kraftlog's KAFKA listener: one controller and
three brokers (real processes), each broker speaking Kafka's protocol
beside its HTTP API.

- kafka-python and confluent-kafka (librdkafka) produce and consume;
  what they read is what was written, byte for byte (keys, values,
  headers, timestamps, offsets), and so is what kraftlog's own client
  reads over HTTP, and the other way round: one log, two doors.
- Writes go on through a partition leader's kill -9; idempotent producers
  and consumers of both clients go on through one, exactly once and in
  order (the consumers checking their positions, KIP-320).
- Idempotent producers of both clients (InitProducerId) write each record
  once; three kafka-python consumers in a classic group, and a kafka-python
  member with a kraftlog member in one group, share the partitions; three
  librdkafka consumers in a KIP-848 group
  (``group.protocol=consumer``) share the partitions, commit, and take over
  a leaving member's partitions; kraftlog's admin client sees the commits.
- A librdkafka transactional producer commits, aborts, and copies a topic
  with its consumer offsets in each transaction: read_committed readers of
  both doors see each committed record once and none of the aborted.
- aiokafka produces (idempotent) and consumes in a group, committing; a
  quixstreams app counts words with changelog-backed state, exactly once;
- kcat lists, produces and consumes; the Kafka admin clients create, grow,
  describe and delete topics, alter topic configs, describe a broker's,
  and list and describe groups; a static member replaces its old self at
  once (the old one fenced); offsets of an open transaction are unstable
  to read_committed readers (KIP-447).
- Bad frames (a 2 GB size prefix, a short one, an unknown API, garbage, a
  client that stalls mid-frame) close that connection; other clients are
  served meanwhile and the broker lives on.
"""

from __future__ import annotations

import socket
import struct
import subprocess
import sys
import time
import urllib.request

import pytest

from api.client import Admin, Consumer, NewTopic, Producer, TopicPartition
from chaos.cluster import FAST_SETTINGS, REPO_ROOT, ProcessCluster

RECORDS = 300
#: A connection idle this long (or stalled mid-frame) is closed.
IDLE_MS = 5000


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with ProcessCluster(str(tmp_path_factory.mktemp("kafka")), controllers=1, brokers=3,
                        settings={**FAST_SETTINGS, "connections.max.idle.ms": IDLE_MS},
                        kafka=True) as running:
        running.start()
        running.wait_for_active_controller(30)
        running.wait_for_brokers_running(timeout_s=30)
        yield running


def http_bootstrap(cluster: ProcessCluster) -> list[str]:
    return [cluster.nodes[b].broker_url for b in cluster.broker_ids]


def create(cluster: ProcessCluster, name: str, partitions: int = 3, rf: int = 3) -> None:
    with Admin(http_bootstrap(cluster)) as admin:
        admin.create_topics([NewTopic(name, partitions, rf,
                                      configs={"min.insync.replicas": "2"})])


def expected(i: int) -> tuple[bytes | None, bytes, list]:
    key = None if i % 7 == 0 else b"key-%d" % i
    value = bytes([i % 256]) * (i % 50) + b"value-%d" % i
    headers = [("n", str(i).encode()), ("empty", b"")] if i % 3 == 0 else []
    return key, value, headers


def read_http(cluster: ProcessCluster, topic: str, partitions: int, count: int) -> list:
    with Consumer(http_bootstrap(cluster), auto_offset_reset="earliest",
                  consumer_timeout_ms=5000) as consumer:
        consumer.assign([TopicPartition(topic, p) for p in range(partitions)])
        got = []
        deadline = time.monotonic() + 30
        while len(got) < count and time.monotonic() < deadline:
            got += list(consumer)
    return sorted(((r.partition, r.offset, r.timestamp, r.key, r.value,
                    [tuple(h) for h in r.headers]) for r in got))


def read_kafka_python(cluster: ProcessCluster, topic: str, partitions: int, count: int) -> list:
    from kafka import KafkaConsumer
    from kafka import TopicPartition as KTP
    consumer = KafkaConsumer(bootstrap_servers=cluster.kafka_bootstrap,
                             auto_offset_reset="earliest", enable_auto_commit=False,
                             consumer_timeout_ms=3000)
    try:
        consumer.assign([KTP(topic, p) for p in range(partitions)])
        got = []
        deadline = time.monotonic() + 30
        while len(got) < count and time.monotonic() < deadline:
            got += list(consumer)
    finally:
        consumer.close()
    return sorted(((r.partition, r.offset, r.timestamp, r.key, r.value,
                    [tuple(h) for h in r.headers]) for r in got))


def read_confluent(cluster: ProcessCluster, topic: str, partitions: int, count: int) -> list:
    from confluent_kafka import Consumer as CKConsumer
    from confluent_kafka import TopicPartition as CKTP
    consumer = CKConsumer({"bootstrap.servers": cluster.kafka_bootstrap, "group.id": "unused",
                           "enable.auto.commit": False})
    try:
        consumer.assign([CKTP(topic, p, 0) for p in range(partitions)])
        got = []
        deadline = time.monotonic() + 30
        while len(got) < count and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is not None:
                assert message.error() is None, message.error()
                got.append(message)
    finally:
        consumer.close()
    return sorted(((m.partition(), m.offset(), m.timestamp()[1], m.key(), m.value(),
                    [tuple(h) for h in m.headers() or ()]) for m in got))


def test_kafka_python_writes_what_every_reader_reads_byte_for_byte(cluster):
    from kafka import KafkaProducer
    create(cluster, "kp")
    producer = KafkaProducer(bootstrap_servers=cluster.kafka_bootstrap, acks="all",
                             enable_idempotence=False, linger_ms=5)
    sent = []
    try:
        futures = []
        for i in range(RECORDS):
            key, value, headers = expected(i)
            futures.append((i, producer.send("kp", key=key, value=value, headers=headers,
                                             partition=i % 3, timestamp_ms=1_700_000_000_000 + i)))
        producer.flush(30)
        for i, future in futures:
            meta = future.get(10)
            key, value, headers = expected(i)
            sent.append((meta.partition, meta.offset, 1_700_000_000_000 + i, key, value,
                         [tuple(h) for h in headers]))
    finally:
        producer.close()
    sent.sort()
    assert read_kafka_python(cluster, "kp", 3, RECORDS) == sent
    assert read_http(cluster, "kp", 3, RECORDS) == sent
    assert read_confluent(cluster, "kp", 3, RECORDS) == sent


def test_records_written_over_http_read_the_same_through_kafka_clients(cluster):
    create(cluster, "native")
    sent = []
    with Producer(http_bootstrap(cluster), acks="all") as producer:
        futures = []
        for i in range(RECORDS):
            key, value, headers = expected(i)
            futures.append((i, producer.send("native", value, key=key, headers=headers,
                                             partition=i % 3,
                                             timestamp_ms=1_600_000_000_000 + i)))
        producer.flush(30_000)
        for i, future in futures:
            meta = future.result(10)
            key, value, headers = expected(i)
            sent.append((meta.partition, meta.offset, 1_600_000_000_000 + i, key, value,
                         [tuple(h) for h in headers]))
    sent.sort()
    assert read_confluent(cluster, "native", 3, RECORDS) == sent
    assert read_kafka_python(cluster, "native", 3, RECORDS) == sent


def test_confluent_kafka_produces_through_a_leader_kill_without_losing_an_ack(cluster):
    from confluent_kafka import Producer as CKProducer
    create(cluster, "ck", partitions=1)
    acked: list[tuple[int, bytes]] = []
    failed = []

    def delivered(error, message):
        (failed if error else acked).append(
            error or (message.offset(), message.value()))
    producer = CKProducer({"bootstrap.servers": cluster.kafka_bootstrap, "acks": "all",
                           "linger.ms": 2, "message.timeout.ms": 30_000,
                           "topic.metadata.refresh.interval.ms": 1000})
    for i in range(200):
        producer.produce("ck", value=b"before-%d" % i, on_delivery=delivered)
    assert producer.flush(30) == 0 and len(acked) == 200 and not failed
    with Admin(http_bootstrap(cluster)) as admin:
        leader = admin.describe_topics(["ck"])["ck"].partitions[0].leader
    cluster.kill(leader)
    for i in range(200):
        producer.produce("ck", value=b"after-%d" % i, on_delivery=delivered)
        producer.poll(0)
    assert producer.flush(60) == 0, "deliveries outstanding after a leader change"
    cluster.start([leader])
    cluster.wait_for_brokers_running(timeout_s=30)
    # Every acknowledged write is there, once, where it was acknowledged.
    values = {offset: value for offset, value in acked}
    read = read_confluent(cluster, "ck", 1, len(acked))
    assert {offset: value for _, offset, _, _, value, _ in read if offset in values} == values
    assert len(failed) + len(acked) == 400


def test_idempotent_producers_and_consumers_of_both_clients_go_on_through_a_leader_kill(
        cluster):
    # Idempotence on, a leader killed mid-stream: each client's acknowledged
    # records are in the log exactly once and in the order sent, and a
    # consumer of each client reading all along (checking its position with
    # OffsetForLeaderEpoch after the leader change, KIP-320) reads exactly
    # them, byte for byte.
    from confluent_kafka import Consumer as CKConsumer
    from confluent_kafka import Producer as CKProducer
    from confluent_kafka import TopicPartition as CKTP
    from kafka import KafkaConsumer, KafkaProducer
    from kafka import TopicPartition as KPTopicPartition
    create(cluster, "idem-kill", partitions=1)
    consumer = KafkaConsumer(bootstrap_servers=cluster.kafka_bootstrap,
                             auto_offset_reset="earliest", enable_auto_commit=False,
                             metadata_max_age_ms=1000)
    consumer.assign([KPTopicPartition("idem-kill", 0)])
    ck_consumer = CKConsumer({"bootstrap.servers": cluster.kafka_bootstrap,
                              "group.id": "unused", "enable.auto.commit": False,
                              "topic.metadata.refresh.interval.ms": 1000})
    ck_consumer.assign([CKTP("idem-kill", 0, 0)])
    read: list[tuple[int, bytes]] = []
    ck_read: list[tuple[int, bytes]] = []

    def drain(ms: int = 200) -> None:
        for records in consumer.poll(timeout_ms=ms).values():
            read.extend((r.offset, r.value) for r in records)
        for message in ck_consumer.consume(num_messages=1000, timeout=ms / 1000):
            if message.error() is None:
                ck_read.append((message.offset(), message.value()))
    ck_acked: list[bytes] = []
    ck = CKProducer({"bootstrap.servers": cluster.kafka_bootstrap, "enable.idempotence": True,
                     "linger.ms": 2, "message.timeout.ms": 60_000,
                     "topic.metadata.refresh.interval.ms": 1000})

    def delivered(error, message) -> None:
        assert error is None, error
        ck_acked.append(message.value())
    kp = KafkaProducer(bootstrap_servers=cluster.kafka_bootstrap, enable_idempotence=True,
                       acks="all", metadata_max_age_ms=1000, request_timeout_ms=30_000)
    kp_futures = []
    try:
        for i in range(150):
            ck.produce("idem-kill", value=b"ck-%d" % i, on_delivery=delivered)
            kp_futures.append(kp.send("idem-kill", value=b"kp-%d" % i))
        assert ck.flush(30) == 0
        kp.flush(30)
        drain()
        with Admin(http_bootstrap(cluster)) as admin:
            leader = admin.describe_topics(["idem-kill"])["idem-kill"].partitions[0].leader
        cluster.kill(leader)
        for i in range(150, 300):
            ck.produce("idem-kill", value=b"ck-%d" % i, on_delivery=delivered)
            ck.poll(0)
            kp_futures.append(kp.send("idem-kill", value=b"kp-%d" % i))
            if i % 50 == 0:
                drain(50)
        assert ck.flush(60) == 0
        kp.flush(60)
        kp_acked = [future.get(timeout=60).offset for future in kp_futures]
    finally:
        kp.close()
    cluster.start([leader])
    cluster.wait_for_brokers_running(timeout_s=30)
    deadline = time.monotonic() + 60
    try:
        while (len(read) < 600 or len(ck_read) < 600) and time.monotonic() < deadline:
            drain()
    finally:
        consumer.close()
        ck_consumer.close()
    assert ck_read == read  # both clients read the same log
    assert len(kp_acked) == 300 and sorted(ck_acked) == sorted(b"ck-%d" % i for i in range(300))
    values = [value for _, value in read]
    assert len(values) == 600 and len(set(values)) == 600, "a record read twice or missed"
    assert [o for o, _ in read] == list(range(600))  # offsets in order, no gaps
    for prefix in (b"ck-", b"kp-"):  # each producer's records in the order sent
        assert [v for v in values if v.startswith(prefix)] == [b"%s%d" % (prefix, i)
                                                               for i in range(300)]


def test_idempotent_producers_of_both_clients_write_each_record_once(cluster):
    from confluent_kafka import Producer as CKProducer
    from kafka import KafkaProducer
    create(cluster, "idem")
    ck = CKProducer({"bootstrap.servers": cluster.kafka_bootstrap, "enable.idempotence": True,
                     "linger.ms": 2})
    for i in range(500):
        ck.produce("idem", value=b"ck-%d" % i, partition=i % 3)
    assert ck.flush(30) == 0
    kp = KafkaProducer(bootstrap_servers=cluster.kafka_bootstrap, enable_idempotence=True,
                       acks="all")
    try:
        for i in range(500):
            kp.send("idem", value=b"kp-%d" % i, partition=i % 3)
        kp.flush(30)
    finally:
        kp.close()
    values = [r[4] for r in read_http(cluster, "idem", 3, 1000)]
    assert sorted(values) == sorted([b"ck-%d" % i for i in range(500)]
                                    + [b"kp-%d" % i for i in range(500)])


def _fill(cluster: ProcessCluster, topic: str, partitions: int, count: int) -> None:
    create(cluster, topic, partitions=partitions)
    with Producer(http_bootstrap(cluster), acks="all") as producer:
        for i in range(count):
            producer.send(topic, b"%s-%d" % (topic.encode(), i), partition=i % partitions)
        producer.flush(30_000)


def _owned(members) -> list[set[int]]:
    return [{tp.partition for tp in member.assignment()} for member in members]


def test_a_kip848_group_of_three_librdkafka_consumers_shares_rebalances_and_commits(cluster):
    from confluent_kafka import Consumer as CKConsumer
    create(cluster, "grp", partitions=6)
    with Producer(http_bootstrap(cluster), acks="all") as producer:
        for i in range(600):
            producer.send("grp", b"g-%d" % i, partition=i % 6)
        producer.flush(30_000)

    def member() -> CKConsumer:
        consumer = CKConsumer({"bootstrap.servers": cluster.kafka_bootstrap,
                               "group.id": "kip848", "group.protocol": "consumer",
                               "auto.offset.reset": "earliest", "enable.auto.commit": False})
        consumer.subscribe(["grp"])
        return consumer
    members = [member() for _ in range(3)]
    seen: set[bytes] = set()

    def drained() -> bool:
        """One member per partition, each partition read to its end by its
        member (so what each commits is the end)."""
        owned = _owned(members)
        if not (all(owned) and sum(map(len, owned)) == 6
                and set().union(*owned) == set(range(6))):
            return False
        return all(tp.offset == 100 for c in members for tp in c.position(c.assignment()))
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not drained():
            for consumer in members:
                message = consumer.poll(0.2)
                if message is not None and message.error() is None:
                    seen.add(message.value())
        assert drained(), (_owned(members), [c.position(c.assignment()) for c in members])
        # Every record read (at least once: a partition that moved before any
        # commit is read again by its new member, as in Kafka).
        assert seen == {b"g-%d" % i for i in range(600)}
        for consumer in members:
            consumer.commit(asynchronous=False)
        # One leaves: the others take its partitions.
        members.pop().close()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            for consumer in members:
                consumer.poll(0.2)
            owned = _owned(members)
            if sum(map(len, owned)) == 6 and set().union(*owned) == set(range(6)):
                break
        assert sum(map(len, owned)) == 6 and set().union(*owned) == set(range(6)), owned
    finally:
        for consumer in members:
            consumer.close()
    # What they committed is what kraftlog's own client sees for the group.
    with Admin(http_bootstrap(cluster)) as admin:
        committed = admin.list_consumer_group_offsets("kip848")
    assert sum(v.offset for v in committed.values()) == 600


def test_a_classic_group_of_three_kafka_python_consumers_shares_rebalances_and_commits(
        cluster):
    # kafka-python speaks the classic protocol (JoinGroup/SyncGroup/
    # Heartbeat/LeaveGroup); the coordinator assigns, as for KIP-848 members.
    from kafka import KafkaConsumer
    _fill(cluster, "classic", 6, 600)

    def member() -> KafkaConsumer:
        return KafkaConsumer("classic", bootstrap_servers=cluster.kafka_bootstrap,
                             group_id="classic-g", auto_offset_reset="earliest",
                             enable_auto_commit=False, heartbeat_interval_ms=500,
                             session_timeout_ms=10_000)
    members = [member() for _ in range(3)]

    def drained() -> bool:
        owned = _owned(members)
        if not (all(owned) and sum(map(len, owned)) == 6
                and set().union(*owned) == set(range(6))):
            return False
        return all(c.position(tp) == 100 for c in members for tp in c.assignment())
    try:
        seen: set[bytes] = set()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not drained():
            for consumer in members:
                for records in consumer.poll(timeout_ms=200).values():
                    seen.update(r.value for r in records)
        assert drained(), _owned(members)
        # Every record read (at least once: a partition that moved before any
        # commit is read again by its new member).
        assert seen == {b"classic-%d" % i for i in range(600)}
        # Each commits where its partitions end; one leaves, the others take over.
        for consumer in members:
            consumer.commit()
        members.pop().close()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            for consumer in members:
                consumer.poll(timeout_ms=200)
            owned = _owned(members)
            if sum(map(len, owned)) == 6 and set().union(*owned) == set(range(6)):
                break
        assert sum(map(len, owned)) == 6 and set().union(*owned) == set(range(6)), owned
    finally:
        for consumer in members:
            consumer.close()
    with Admin(http_bootstrap(cluster)) as admin:
        committed = admin.list_consumer_group_offsets("classic-g")
    assert sum(v.offset for v in committed.values()) == 600


def test_a_restarted_static_member_takes_its_place_back_at_once(cluster):
    # group.instance.id (KIP-345) through the classic protocol: a static
    # member that restarts (kafka-python sends no LeaveGroup for one) gets
    # its partitions back without waiting out its 60 s session; a process
    # still running with the old member id is fenced, not let back in.
    from kafka import KafkaConsumer
    from kafka.admin import KafkaAdminClient, MemberToRemove
    _fill(cluster, "static", 2, 20)

    def member() -> KafkaConsumer:
        return KafkaConsumer("static", bootstrap_servers=cluster.kafka_bootstrap,
                             group_id="static-g", group_instance_id="static-1",
                             auto_offset_reset="earliest", enable_auto_commit=False,
                             heartbeat_interval_ms=500, session_timeout_ms=60_000)

    def owns_both(consumer: KafkaConsumer, seconds: float) -> bool:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            consumer.poll(timeout_ms=200)
            if {tp.partition for tp in consumer.assignment()} == {0, 1}:
                return True
        return False
    first = member()
    assert owns_both(first, 30)
    first.close()  # a restart: the session is left to run out
    second = member()
    third = None
    try:
        assert owns_both(second, 20)  # well within the 60 s session
        third = member()  # the same instance id again, while the second runs
        assert owns_both(third, 20)
        # The second, still running, is fenced (its heartbeats stop): it
        # does not take the place back, for as long as both keep polling.
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            second.poll(timeout_ms=100)
            third.poll(timeout_ms=100)
        assert {tp.partition for tp in third.assignment()} == {0, 1}
        kp = KafkaAdminClient(bootstrap_servers=cluster.kafka_bootstrap)
        try:
            described = kp.describe_groups(["static-g"])["static-g"]
        finally:
            kp.close()
        assert [(m["group_instance_id"], m["member_id"]) for m in described["members"]] == [
            ("static-1", third._coordinator._generation.member_id)]
        # What the second's heartbeat is answered: FENCED_INSTANCE_ID (82).
        old_id = second._coordinator._generation.member_id.encode()
        # (kafka-python names the coordinator's connection "coordinator-<node id>")
        coordinator = cluster.nodes[int(str(second._coordinator.coordinator_id)
                                        .rsplit("-", 1)[-1])]
        body = b"".join((struct.pack(">h", 8), b"static-g", struct.pack(">i", 1),
                         struct.pack(">h", len(old_id)), old_id,
                         struct.pack(">h", 8), b"static-1"))
        frame = struct.pack(">hhih", 12, 3, 9, 4) + b"test" + body  # Heartbeat v3
        with socket.create_connection((coordinator.host, coordinator.kafka_port),
                                      timeout=10) as sock:
            sock.sendall(struct.pack(">i", len(frame)) + frame)
            (size,) = struct.unpack(">i", sock.recv(4, socket.MSG_WAITALL))
            answer = sock.recv(size, socket.MSG_WAITALL)
        assert struct.unpack_from(">ih", answer, 4)[1] == 82
        # An administrator removes the static member by its instance id
        # (LeaveGroup v3+ naming no member id): the group is empty.
        kp = KafkaAdminClient(bootstrap_servers=cluster.kafka_bootstrap)
        try:
            removed = kp.remove_group_members(
                "static-g", [MemberToRemove(group_instance_id="static-1")])
            assert [e.__name__ for e in removed.values()] == ["NoError"], removed
            assert kp.describe_groups(["static-g"])["static-g"]["members"] == []
        finally:
            kp.close()
    finally:
        second.close()
        if third is not None:
            third.close()


def test_a_kafka_python_member_and_a_kraftlog_member_share_one_group(cluster):
    # One namespace: the same group through both doors, the partitions split
    # between a classic Kafka member and kraftlog's own client.
    from kafka import KafkaConsumer
    _fill(cluster, "mixed", 4, 40)
    kafka_member = KafkaConsumer("mixed", bootstrap_servers=cluster.kafka_bootstrap,
                                 group_id="mixed-g", auto_offset_reset="earliest",
                                 enable_auto_commit=False, heartbeat_interval_ms=500)
    native = Consumer(http_bootstrap(cluster), group_id="mixed-g",
                      auto_offset_reset="earliest")
    try:
        native.subscribe(["mixed"])
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            kafka_member.poll(timeout_ms=200)
            native.poll(timeout_ms=200)
            theirs = {tp.partition for tp in kafka_member.assignment()}
            ours = {tp.partition for tp in native.assignment()}
            if theirs and ours and theirs | ours == set(range(4)) and not theirs & ours:
                break
        assert theirs and ours and theirs | ours == set(range(4)) and not theirs & ours, \
            (theirs, ours)
    finally:
        kafka_member.close()
        native.close()


def test_kafka_admin_clients_create_grow_describe_and_delete_topics(cluster):
    from confluent_kafka.admin import AdminClient, NewPartitions
    from confluent_kafka.admin import NewTopic as CKNewTopic
    from kafka.admin import KafkaAdminClient
    from kafka.admin import NewTopic as KPNewTopic

    admin = AdminClient({"bootstrap.servers": cluster.kafka_bootstrap})
    futures = admin.create_topics([CKNewTopic("adm-1", 2, 2, config={"retention.ms": "60000"})])
    futures["adm-1"].result(30)
    with Admin(http_bootstrap(cluster)) as native:
        described = native.describe_topics(["adm-1"])["adm-1"]
        assert len(described.partitions) == 2
        assert native.describe_configs("adm-1", ["retention.ms"])["retention.ms"].value == "60000"
    # A topic that exists: Kafka's error, not a broken connection.
    with pytest.raises(Exception, match="TOPIC_ALREADY_EXISTS|already exists"):
        admin.create_topics([CKNewTopic("adm-1", 1, 1)])["adm-1"].result(30)
    admin.create_partitions([NewPartitions("adm-1", 4)])["adm-1"].result(30)
    cluster_meta = admin.describe_cluster().result(30)
    assert sorted(node.id for node in cluster_meta.nodes) == sorted(cluster.broker_ids)
    admin.delete_topics(["adm-1"])["adm-1"].result(30)
    kp = KafkaAdminClient(bootstrap_servers=cluster.kafka_bootstrap)
    try:
        kp.create_topics([KPNewTopic("adm-2", 3, 1)])
        assert "adm-2" in kp.list_topics()
        kp.delete_topics(["adm-2"])
    finally:
        kp.close()
    with Admin(http_bootstrap(cluster)) as native:
        names = native.list_topics()
    assert "adm-1" not in names and "adm-2" not in names


def test_kafka_admin_clients_alter_topic_configs(cluster):
    from confluent_kafka.admin import (AdminClient, AlterConfigOpType, ConfigEntry,
                                       ConfigResource)
    from kafka.admin import ConfigResource as KPConfigResource
    from kafka.admin import ConfigResourceType, KafkaAdminClient

    create(cluster, "cfg-1", partitions=1, rf=2)
    admin = AdminClient({"bootstrap.servers": cluster.kafka_bootstrap})

    def configs() -> dict:
        with Admin(http_bootstrap(cluster)) as native:
            found = native.describe_configs("cfg-1", ["retention.ms", "cleanup.policy",
                                                      "min.insync.replicas"])
        return {k: (v.value, v.source) for k, v in found.items()}
    # IncrementalAlterConfigs: SET one, DELETE another (back to its default).
    resource = ConfigResource("topic", "cfg-1", incremental_configs=[
        ConfigEntry("retention.ms", "120000", incremental_operation=AlterConfigOpType.SET),
        ConfigEntry("min.insync.replicas", None,
                    incremental_operation=AlterConfigOpType.DELETE)])
    admin.incremental_alter_configs([resource])[resource].result(30)
    after = configs()
    assert after["retention.ms"] == ("120000", "TOPIC_CONFIG")
    assert after["min.insync.replicas"][1] == "DEFAULT_CONFIG"
    # An unknown config and APPEND (for list configs) are refused, each saying why.
    bad = ConfigResource("topic", "cfg-1", incremental_configs=[
        ConfigEntry("no.such.config", "1", incremental_operation=AlterConfigOpType.SET)])
    with pytest.raises(Exception, match="no.such.config"):
        admin.incremental_alter_configs([bad])[bad].result(30)
    append = ConfigResource("topic", "cfg-1", incremental_configs=[
        ConfigEntry("cleanup.policy", "compact", incremental_operation=AlterConfigOpType.APPEND)])
    with pytest.raises(Exception, match="SET it"):
        admin.incremental_alter_configs([append])[append].result(30)
    assert configs() == after
    # AlterConfigs (kafka-python, told not to use the incremental API; it
    # sends the topic's other configs along, to keep them).
    kp = KafkaAdminClient(bootstrap_servers=cluster.kafka_bootstrap)
    try:
        kp.alter_configs([KPConfigResource(ConfigResourceType.TOPIC, "cfg-1",
                                           configs={"cleanup.policy": "compact"})],
                         incremental=False)
        described = kp.describe_configs([KPConfigResource(ConfigResourceType.TOPIC, "cfg-1")])
    finally:
        kp.close()
    assert configs()["cleanup.policy"] == ("compact", "TOPIC_CONFIG")
    assert configs()["retention.ms"] == ("120000", "TOPIC_CONFIG")
    text = repr(described)
    assert "cleanup.policy" in text and "compact" in text
    # AlterConfigs as it is (confluent-kafka's): the configs given replace
    # the topic's own; one not given returns to its default.
    plain = ConfigResource("topic", "cfg-1", set_config={"cleanup.policy": "delete"})
    admin.alter_configs([plain])[plain].result(30)
    final = configs()
    assert final["cleanup.policy"] == ("delete", "TOPIC_CONFIG")
    assert final["retention.ms"][1] == "DEFAULT_CONFIG"


def test_kafka_admin_clients_describe_a_brokers_configs(cluster):
    from confluent_kafka.admin import AdminClient, ConfigResource, ConfigSource

    broker = cluster.broker_ids[0]
    admin = AdminClient({"bootstrap.servers": cluster.kafka_bootstrap})
    resource = ConfigResource("broker", str(broker))
    configs = admin.describe_configs([resource])[resource].result(30)
    assert configs["node.id"].value == str(broker)
    # From its config file, or the default.
    assert configs["node.id"].source == ConfigSource.STATIC_BROKER_CONFIG.value
    assert configs["ssl.client.auth"].value == "none"
    assert configs["ssl.client.auth"].is_default
    assert configs["ssl.client.auth"].source == ConfigSource.DEFAULT_CONFIG.value
    assert all(c.is_read_only for c in configs.values())
    assert configs["connections.max.idle.ms"].value == str(IDLE_MS)
    # Changing one is refused, saying a broker's configs are read only.
    with pytest.raises(Exception, match="read only"):
        changed = ConfigResource("broker", str(broker), set_config={"num.partitions": "9"})
        admin.alter_configs([changed])[changed].result(30)


def test_kafka_admin_clients_list_and_describe_groups(cluster):
    from confluent_kafka import ConsumerGroupState
    from confluent_kafka.admin import AdminClient
    from kafka import KafkaConsumer
    from kafka.admin import KafkaAdminClient

    _fill(cluster, "listed", 2, 20)
    member = KafkaConsumer("listed", bootstrap_servers=cluster.kafka_bootstrap,
                           group_id="listed-g", client_id="lister",
                           auto_offset_reset="earliest", heartbeat_interval_ms=500)
    try:
        deadline = time.monotonic() + 60
        while len(member.assignment()) < 2 and time.monotonic() < deadline:
            member.poll(timeout_ms=200)
        assert len(member.assignment()) == 2
        admin = AdminClient({"bootstrap.servers": cluster.kafka_bootstrap})
        listed = admin.list_consumer_groups().result(30)
        groups = {g.group_id: g for g in listed.valid}
        assert groups["listed-g"].state == ConsumerGroupState.STABLE
        assert listed.errors == []
        described = admin.describe_consumer_groups(["listed-g"])["listed-g"].result(30)
        assert described.state == ConsumerGroupState.STABLE
        [one] = described.members
        assert one.client_id == "lister"
        assert sorted((tp.topic, tp.partition) for tp in one.assignment.topic_partitions) == [
            ("listed", 0), ("listed", 1)]
        kp = KafkaAdminClient(bootstrap_servers=cluster.kafka_bootstrap)
        try:
            assert {"group_id": "listed-g", "protocol_type": "consumer",
                    "group_state": "Stable", "group_type": "consumer"} in kp.list_groups()
            info = kp.describe_groups(["listed-g"])["listed-g"]
            assert (info["group_state"], info["protocol_type"], info["error"]) == (
                "Stable", "consumer", None)
            [kp_member] = info["members"]
            assert kp_member["client_id"] == "lister"
            assert kp_member["client_host"] == "/127.0.0.1"
            assert kp_member["member_metadata"]["topics"] == ["listed"]
            assert kp_member["member_assignment"]["assigned_partitions"] == [
                {"topic": "listed", "partitions": [0, 1]}]
        finally:
            kp.close()
    finally:
        member.close()


def test_librdkafka_transactions_commit_abort_and_copy_exactly_once(cluster):
    # A transactional producer commits one transaction and aborts another;
    # a consume-transform-produce loop copies a topic with its offsets in
    # the transaction; read_committed readers of either door see the
    # committed records once and nothing of the aborted ones.
    from confluent_kafka import Consumer as CKConsumer
    from confluent_kafka import Producer as CKProducer
    _fill(cluster, "txin", 2, 100)
    create(cluster, "txout", partitions=2)
    producer = CKProducer({"bootstrap.servers": cluster.kafka_bootstrap,
                           "transactional.id": "ck-tx-1", "linger.ms": 1})
    producer.init_transactions(30)
    producer.begin_transaction()
    for i in range(50):
        producer.produce("txout", value=b"committed-%d" % i, partition=i % 2)
    producer.commit_transaction(30)
    producer.begin_transaction()
    for i in range(50):
        producer.produce("txout", value=b"aborted-%d" % i, partition=i % 2)
    producer.abort_transaction(30)

    consumer = CKConsumer({"bootstrap.servers": cluster.kafka_bootstrap, "group.id": "txg",
                           "group.protocol": "consumer", "auto.offset.reset": "earliest",
                           "enable.auto.commit": False, "isolation.level": "read_committed"})
    consumer.subscribe(["txin"])
    copied = 0
    try:
        deadline = time.monotonic() + 60
        while copied < 100 and time.monotonic() < deadline:
            messages = consumer.consume(num_messages=100, timeout=0.5)
            messages = [m for m in messages if m.error() is None]
            if not messages:
                continue
            producer.begin_transaction()
            for message in messages:
                producer.produce("txout", value=b"copy-" + message.value(),
                                 partition=message.partition())
            producer.send_offsets_to_transaction(
                consumer.position(consumer.assignment()), consumer.consumer_group_metadata(),
                30)
            producer.commit_transaction(30)
            copied += len(messages)
    finally:
        consumer.close()
    assert copied == 100
    expected = {b"committed-%d" % i for i in range(50)} | {
        b"copy-txin-%d" % i for i in range(100)}
    with Consumer(http_bootstrap(cluster), auto_offset_reset="earliest",
                  isolation_level="read_committed", consumer_timeout_ms=5000) as reader:
        reader.assign([TopicPartition("txout", p) for p in range(2)])
        values = [r.value for r in reader]
    assert sorted(values) == sorted(expected)  # once each, nothing aborted
    ck_reader = CKConsumer({"bootstrap.servers": cluster.kafka_bootstrap, "group.id": "unused",
                            "isolation.level": "read_committed", "enable.auto.commit": False})
    from confluent_kafka import TopicPartition as CKTP
    try:
        ck_reader.assign([CKTP("txout", p, 0) for p in range(2)])
        seen = []
        deadline = time.monotonic() + 30
        while len(seen) < len(expected) and time.monotonic() < deadline:
            message = ck_reader.poll(0.5)
            if message is not None and message.error() is None:
                seen.append(message.value())
    finally:
        ck_reader.close()
    assert sorted(seen) == sorted(expected)
    with Admin(http_bootstrap(cluster)) as admin:
        committed = admin.list_consumer_group_offsets("txg")
    assert sum(v.offset for v in committed.values()) == 100


async def test_aiokafka_produces_and_consumes_in_a_group(cluster):
    # aiokafka: asyncio, its own protocol code, the classic group protocol.
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
    create(cluster, "aio", partitions=2)
    producer = AIOKafkaProducer(bootstrap_servers=cluster.kafka_bootstrap,
                                enable_idempotence=True)
    await producer.start()
    try:
        for i in range(100):
            await producer.send("aio", value=b"aio-%d" % i, key=b"k%d" % i,
                                headers=[("n", b"%d" % i)], partition=i % 2)
        await producer.flush()
    finally:
        await producer.stop()
    consumer = AIOKafkaConsumer("aio", bootstrap_servers=cluster.kafka_bootstrap,
                                group_id="aio-g", auto_offset_reset="earliest",
                                enable_auto_commit=False)
    await consumer.start()
    seen = []
    try:
        deadline = time.monotonic() + 60
        while len(seen) < 100 and time.monotonic() < deadline:
            batches = await consumer.getmany(timeout_ms=500)
            for records in batches.values():
                seen += [(r.key, r.value, list(r.headers)) for r in records]
        await consumer.commit()
    finally:
        await consumer.stop()
    assert sorted(seen) == sorted((b"k%d" % i, b"aio-%d" % i, [("n", b"%d" % i)])
                                  for i in range(100))
    with Admin(http_bootstrap(cluster)) as admin:
        committed = admin.list_consumer_group_offsets("aio-g")
    assert sum(v.offset for v in committed.values()) == 100


def test_offsets_of_an_open_transaction_are_unstable_to_read_committed_readers(cluster):
    # KIP-447: while a transaction holding a group's offsets is open, a
    # read_committed consumer (RequireStable) is told to retry instead of
    # reading the offset from before it; once committed, it reads the new one.
    from confluent_kafka import Consumer as CKConsumer
    from confluent_kafka import KafkaException, Producer as CKProducer
    from confluent_kafka import TopicPartition as CKTP

    create(cluster, "stable-in", partitions=1)
    producer = CKProducer({"bootstrap.servers": cluster.kafka_bootstrap,
                           "transactional.id": "stable-tx"})
    producer.init_transactions(30)
    group = CKConsumer({"bootstrap.servers": cluster.kafka_bootstrap, "group.id": "stable-g",
                        "enable.auto.commit": False})

    def committed(isolation: str, timeout_s: float) -> int:
        reader = CKConsumer({"bootstrap.servers": cluster.kafka_bootstrap,
                             "group.id": "stable-g", "isolation.level": isolation,
                             "enable.auto.commit": False})
        try:
            return reader.committed([CKTP("stable-in", 0)], timeout=timeout_s)[0].offset
        finally:
            reader.close()
    try:
        producer.begin_transaction()
        producer.send_offsets_to_transaction([CKTP("stable-in", 0, 5)],
                                             group.consumer_group_metadata(), 30)
        assert committed("read_uncommitted", 30) < 0  # nothing committed yet
        with pytest.raises(KafkaException, match="UNSTABLE_OFFSET_COMMIT|[Tt]imed out"):
            committed("read_committed", 3)  # retried until the bound: never the old offset
        producer.commit_transaction(30)
        assert committed("read_committed", 30) == 5
    finally:
        group.close()


def test_a_quixstreams_app_counts_words_exactly_once(cluster, tmp_path):
    # quixstreams (on librdkafka): a stateful app whose state lives in a
    # changelog topic it creates, writing exactly once through transactions.
    import json
    words = ["kafka", "log", "kafka", "raft", "log", "kafka"] * 20
    create(cluster, "words", partitions=2)
    create(cluster, "counts", partitions=2)
    with Producer(http_bootstrap(cluster), acks="all") as producer:
        for word in words:
            producer.send("words", json.dumps({"word": word}).encode(), key=word.encode())
        producer.flush(30_000)
    done = subprocess.run(
        [sys.executable, "-m", "tests.integration.apps.quix_wordcount",
         cluster.kafka_bootstrap, "words", "counts", "quix-wc", str(tmp_path / "state"),
         str(len(words))], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    with Consumer(http_bootstrap(cluster), auto_offset_reset="earliest",
                  isolation_level="read_committed", consumer_timeout_ms=5000) as reader:
        reader.assign([TopicPartition("counts", p) for p in range(2)])
        counts = [json.loads(r.value) for r in reader]
    final = {}
    for entry in counts:
        final[entry["word"]] = max(final.get(entry["word"], 0), entry["count"])
    assert len(counts) == len(words)  # one output per input, none twice
    assert final == {"kafka": 60, "log": 40, "raft": 20}
    with Admin(http_bootstrap(cluster)) as admin:
        assert any(name.startswith("changelog__") for name in admin.list_topics())


def _kcat(cluster: ProcessCluster, *args: str, stdin: str | None = None) -> str:
    done = subprocess.run(["kcat", "-b", cluster.kafka_bootstrap, *args], input=stdin,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_kcat_lists_produces_and_consumes(cluster):
    # kcat (librdkafka 2.0, Debian's package, installed by make test).
    create(cluster, "kcat", partitions=1)
    listing = _kcat(cluster, "-L")
    assert "3 brokers:" in listing and 'topic "kcat" with 1 partitions' in listing
    lines = [f"key-{i}:value {i}" for i in range(50)]
    _kcat(cluster, "-P", "-t", "kcat", "-K:", stdin="\n".join(lines) + "\n")
    read = read_http(cluster, "kcat", 1, 50)
    assert [(r[3], r[4]) for r in read] == [
        (f"key-{i}".encode(), f"value {i}".encode()) for i in range(50)]
    out = _kcat(cluster, "-C", "-t", "kcat", "-o", "beginning", "-e", "-f", "%o %k=%s\n")
    assert out.splitlines() == [f"{i} key-{i}=value {i}" for i in range(50)]


# -- bad frames ----------------------------------------------------------------------------
def _connect(cluster: ProcessCluster) -> socket.socket:
    node = cluster.nodes[cluster.broker_ids[0]]
    return socket.create_connection((node.host, node.kafka_port), timeout=10)


def _closed(sock: socket.socket) -> bool:
    """Whether the broker closed the connection (within the socket timeout)."""
    try:
        return sock.recv(1) == b""
    except (ConnectionResetError, BrokenPipeError):
        return True


def _api_versions(sock: socket.socket, version: int = 0) -> tuple[int, bytes]:
    body = struct.pack(">hhih", 18, version, 42, 4) + b"test"
    sock.sendall(struct.pack(">i", len(body)) + body)
    (size,) = struct.unpack(">i", sock.recv(4, socket.MSG_WAITALL))
    answer = sock.recv(size, socket.MSG_WAITALL)
    (correlation,) = struct.unpack_from(">i", answer)
    return correlation, answer[4:]


@pytest.mark.parametrize("frame", [
    struct.pack(">i", 2**31 - 1),                        # a 2 GB frame announced
    struct.pack(">i", -5),                               # a negative size
    struct.pack(">i", 3) + b"abc",                       # shorter than a header
    struct.pack(">i", 10) + struct.pack(">hhih", 999, 0, 1, -1),       # an unknown API
    struct.pack(">i", 10) + struct.pack(">hhih", 3, 99, 1, -1),        # Metadata v99
    struct.pack(">i", 14) + struct.pack(">hhih", 3, 12, 1, -1) + b"\xff" * 4,  # garbage body
    # A 1 MiB metadata request (only produces are that large): 500,000 names.
    struct.pack(">i", 14 + 2**20) + struct.pack(">hhihi", 3, 1, 1, -1, 2**19) + bytes(2**20),
])
def test_a_bad_frame_closes_its_connection_and_nothing_else(cluster, frame):
    with _connect(cluster) as bad, _connect(cluster) as good:
        bad.sendall(frame)
        assert _closed(bad)
        assert _api_versions(good)[0] == 42  # another client is served as before


def test_a_stored_batch_kafka_cannot_read_fails_its_partition_only(cluster):
    # The HTTP produce checks batches, not each record: a record with a
    # string key is stored. Through the KAFKA listener its partition answers
    # CORRUPT_MESSAGE; the fetch's other partitions are served as usual.
    import msgpack

    from protocol import wire
    from storage.batch import pack_batch
    create(cluster, "unreadable", partitions=1)
    _fill(cluster, "readable", 1, 20)
    section = msgpack.packb([0, 0, "a str key", b"v", []], use_bin_type=True)
    batch = pack_batch(base_offset=0, leader_epoch=-1, attributes=0, last_offset_delta=0,
                       base_timestamp=1000, max_timestamp=1000, producer_id=-1,
                       producer_epoch=-1, base_sequence=-1, record_count=1, section=section)
    with Admin(http_bootstrap(cluster)) as admin:
        leader = admin.describe_topics(["unreadable"])["unreadable"].partitions[0].leader
    body = msgpack.packb({"acks": 1, "partitions": [
        {"topic": "unreadable", "partition": 0, "records": batch}]}, use_bin_type=True)
    request = urllib.request.Request(cluster.nodes[leader].broker_url + "/v1/produce",
                                     data=body, headers={"Content-Type": wire.MSGPACK,
                                                         "Accept": wire.MSGPACK})
    with urllib.request.urlopen(request, timeout=30) as answer:
        assert msgpack.unpackb(answer.read())["partitions"][0]["error"] is None
    from confluent_kafka import Consumer as CKConsumer
    from confluent_kafka import TopicPartition as CKTP
    consumer = CKConsumer({"bootstrap.servers": cluster.kafka_bootstrap, "group.id": "unused",
                           "enable.auto.commit": False})
    good, errors = [], []
    try:
        consumer.assign([CKTP("readable", 0, 0), CKTP("unreadable", 0, 0)])
        deadline = time.monotonic() + 30
        while (len(good) < 20 or not errors) and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is None:
                continue
            if message.error() is None:
                good.append(message.value())
            elif message.topic() == "unreadable":
                errors.append(message.error())
    finally:
        consumer.close()
    assert sorted(good) == sorted(b"readable-%d" % i for i in range(20))
    assert errors, "the unreadable partition should report its error"


def test_a_too_new_api_versions_request_gets_the_versions_to_retry_with(cluster):
    with _connect(cluster) as sock:
        correlation, body = _api_versions(sock, version=99)
        assert correlation == 42
        (error,) = struct.unpack_from(">h", body)
        assert error == 35  # UNSUPPORTED_VERSION, with the list: the client retries lower


def test_a_client_that_stalls_mid_frame_holds_up_no_one(cluster):
    with _connect(cluster) as slow:
        slow.sendall(struct.pack(">i", 1000) + b"\x00\x12")  # 2 of 1000 bytes, then nothing
        with _connect(cluster) as other:  # served meanwhile (its socket times out at 10 s)
            assert _api_versions(other)[0] == 42
        # The stalled connection is closed once connections.max.idle.ms passes.
        slow.settimeout(IDLE_MS / 1000 + 10)
        assert _closed(slow)
    assert cluster.broker_health(cluster.broker_ids[0]) is not None
