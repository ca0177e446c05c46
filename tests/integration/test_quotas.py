"""Client quotas on a real node: set with the admin client and the CLI,
stored in the metadata, enforced by holding answers back (the node's
``kraftlog_client_quota_throttle_ms_total`` counts it) while every record is
still written and read; a client whose requests take more than its
request_percentage of the broker is held back, answers saying so; other
clients go unthrottled; bad input refused with nothing stored. The same
quotas hold Kafka clients back on the KAFKA listener (ThrottleTimeMs)."""

from __future__ import annotations

import socket
import struct
import subprocess
import sys
import time
import urllib.request

import pytest

from api.client import Admin, Consumer, KraftlogError, NewTopic, Producer, TopicPartition
from api.broker.quotas import THROTTLE_HEADER
from chaos.cluster import FAST_SETTINGS, REPO_ROOT, ProcessCluster
from protocol.quotas import CLIENT_ID_HEADER

# A 2-sample window of 1 s: a test's few hundred KB are enough to go over.
SETTINGS = {**FAST_SETTINGS, "quota.window.num": 2, "quota.window.size.seconds": 1}
VALUE = b"q" * 1024


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with ProcessCluster(str(tmp_path_factory.mktemp("quotas")), controllers=1, brokers=0,
                        combined=True, settings=SETTINGS, kafka=True) as running:
        running.start()
        running.wait_for_brokers_running(timeout_s=30)
        yield running


@pytest.fixture(scope="module")
def node(cluster):
    return cluster.nodes[1].broker_url


def throttled_ms(url: str) -> dict[tuple[str, str], float]:
    import urllib.request
    with urllib.request.urlopen(url + "/metrics", timeout=5) as response:
        text = response.read().decode()
    found = {}
    for line in text.splitlines():
        if line.startswith("kraftlog_client_quota_throttle_ms_total{"):
            labels, value = line.rsplit(" ", 1)
            parts = dict(item.split("=", 1) for item in labels[labels.index("{") + 1:-1]
                         .split(","))
            found[(parts["quota"].strip('"'), parts["client_id"].strip('"'))] = float(value)
    return found


def produce(url: str, topic: str, count: int, client_id: str) -> None:
    with Producer(url, client_id=client_id, linger_ms=0, batch_size=64 * 1024) as producer:
        for i in range(count):
            producer.send(topic, VALUE, key=b"%d" % i)
        producer.flush(60_000)


def test_quotas_slow_a_client_down_without_losing_a_record(node):
    with Admin(node) as admin:
        admin.create_topics([NewTopic("quoted", 1, 1)])
        admin.alter_client_quotas({"client-id": "slow"}, {"producer_byte_rate": 100_000})
        admin.alter_client_quotas({"client-id": "<default>"}, {"consumer_byte_rate": 100_000})
        assert ({"client-id": "slow"}, {"producer_byte_rate": 100_000.0}) in \
            admin.describe_client_quotas()
    produce(node, "quoted", 400, "slow")     # ~400 KB at a 100 KB/s quota
    produce(node, "quoted", 400, "fast")     # no quota of its own, none by default
    held = throttled_ms(node)
    assert held.get(("producer_byte_rate", "slow"), 0) > 0
    assert ("producer_byte_rate", "fast") not in held

    # A consumer under the <default> client-id quota reads everything.
    with Consumer(node, client_id="reader", auto_offset_reset="earliest",
                  consumer_timeout_ms=5000) as consumer:
        consumer.assign([TopicPartition("quoted", 0)])
        values = [record.value for record in consumer]
    assert len(values) == 800 and set(values) == {VALUE}
    assert throttled_ms(node).get(("consumer_byte_rate", "reader"), 0) > 0

    # Removed: the slow client is free again.
    with Admin(node) as admin:
        admin.alter_client_quotas({"client-id": "slow"}, {"producer_byte_rate": None})
        assert all(entity != {"client-id": "slow"}
                   for entity, _ in admin.describe_client_quotas())
    before = throttled_ms(node)[("producer_byte_rate", "slow")]
    produce(node, "quoted", 400, "slow")
    assert throttled_ms(node)[("producer_byte_rate", "slow")] == before


def get(url: str, client_id: str):
    request = urllib.request.Request(url, headers={CLIENT_ID_HEADER: client_id})
    with urllib.request.urlopen(request, timeout=30) as response:
        response.read()
        return response.headers.get(THROTTLE_HEADER)


def test_request_percentage_holds_a_busy_client_back_and_only_it(node):
    # 0.5 % of the broker's event loop: a few hundred cheap requests are more.
    with Admin(node) as admin:
        admin.create_topics([NewTopic("busy", 1, 1)])
        admin.alter_client_quotas({"client-id": "busy"}, {"request_percentage": 0.5})
    throttles = []
    for _ in range(3000):  # bounded: far more than the quota allows in a window
        throttle = get(node + "/v1/topics", "busy")
        if throttle is not None:
            throttles.append(int(throttle))
            if len(throttles) == 3:
                break
    assert len(throttles) == 3 and all(0 < t <= 2000 for t in throttles), throttles
    assert throttled_ms(node).get(("request_percentage", "busy"), 0) >= sum(throttles)
    # Another client is not held back by it.
    assert all(get(node + "/v1/topics", "idle") is None for _ in range(200))
    assert ("request_percentage", "idle") not in throttled_ms(node)
    # Held, never refused: the busy client's records are all written and read.
    produce(node, "busy", 50, "busy")
    with Consumer(node, client_id="busy", auto_offset_reset="earliest",
                  consumer_timeout_ms=5000) as consumer:
        consumer.assign([TopicPartition("busy", 0)])
        assert len(list(consumer)) == 50
    with Admin(node) as admin:
        admin.alter_client_quotas({"client-id": "busy"}, {"request_percentage": None})


def test_kafka_clients_are_held_to_the_same_quotas(cluster, node):
    # Over the KAFKA listener: producer and consumer byte rates and
    # request_percentage, per client id, told to the client as ThrottleTimeMs.
    import json

    from confluent_kafka import Producer as KafkaProducer
    from kafka import KafkaConsumer
    from kafka import TopicPartition as KafkaTopicPartition

    with Admin(node) as admin:
        admin.create_topics([NewTopic("kquoted", 1, 1)])
        admin.alter_client_quotas({"client-id": "kafka-slow"}, {"producer_byte_rate": 100_000})
        admin.alter_client_quotas({"client-id": "kafka-reader"},
                                  {"consumer_byte_rate": 100_000})
        admin.alter_client_quotas({"client-id": "kafka-busy"}, {"request_percentage": 0.5})
    bootstrap = cluster.nodes[1].kafka_address
    stats: list = []
    producer = KafkaProducer({"bootstrap.servers": bootstrap, "client.id": "kafka-slow",
                              "linger.ms": 5, "statistics.interval.ms": 200,
                              "stats_cb": stats.append})
    for i in range(400):  # ~400 KB at a 100 KB/s quota
        producer.produce("kquoted", VALUE, b"%d" % i, partition=0)
        producer.poll(0)
    assert producer.flush(60) == 0
    deadline = time.monotonic() + 10
    seen_throttle = 0
    while time.monotonic() < deadline and not seen_throttle:
        producer.poll(0.2)
        seen_throttle = max([b.get("throttle", {}).get("max", 0) for raw in stats
                             for b in json.loads(raw)["brokers"].values()] or [0])
    assert seen_throttle > 0  # the client was told ThrottleTimeMs
    assert throttled_ms(node).get(("producer_byte_rate", "kafka-slow"), 0) > 0

    consumer = KafkaConsumer(bootstrap_servers=bootstrap, client_id="kafka-reader",
                             auto_offset_reset="earliest", consumer_timeout_ms=5000)
    consumer.assign([KafkaTopicPartition("kquoted", 0)])
    values = [record.value for record in consumer]
    consumer.close()
    assert len(values) == 400 and set(values) == {VALUE}
    assert throttled_ms(node).get(("consumer_byte_rate", "kafka-reader"), 0) > 0

    # Metadata v4 asked again and again by a client over 0.5 % of the broker.
    host, port = bootstrap.rsplit(":", 1)
    client = b"kafka-busy"
    header = struct.pack(">hhih", 3, 4, 1, len(client)) + client
    frame = header + struct.pack(">i?", -1, False)
    throttles = []
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        reader = sock.makefile("rb")
        for _ in range(3000):  # bounded: far more than the quota allows
            sock.sendall(struct.pack(">i", len(frame)) + frame)
            (size,) = struct.unpack(">i", reader.read(4))
            answer = reader.read(size)
            throttle = struct.unpack_from(">i", answer, 4)[0]  # after the correlation id
            if throttle:
                throttles.append(throttle)
                if len(throttles) == 3:
                    break
    assert len(throttles) == 3 and all(0 < t <= 2000 for t in throttles), throttles
    assert throttled_ms(node).get(("request_percentage", "kafka-busy"), 0) >= sum(throttles)
    with Admin(node) as admin:
        for client_id, key in (("kafka-slow", "producer_byte_rate"),
                               ("kafka-reader", "consumer_byte_rate"),
                               ("kafka-busy", "request_percentage")):
            admin.alter_client_quotas({"client-id": client_id}, {key: None})


@pytest.mark.parametrize("entity, quotas, message", [
    ({"client-id": "x"}, {"request_percentage": 0}, "positive"),
    ({"client-id": "x"}, {"producer_byte_rate": -1}, "positive"),
    ({"group": "x"}, {"producer_byte_rate": 1}, "unknown entity type"),
    ({"client-id": "x"}, {"producer_byte_rate": "fast"}, "a number"),
])
def test_bad_quotas_are_refused_and_nothing_is_stored(node, entity, quotas, message):
    with Admin(node) as admin:
        before = admin.describe_client_quotas()
        with pytest.raises(KraftlogError, match=message) as caught:
            admin.alter_client_quotas(entity, quotas)
        assert caught.value.code == "INVALID_REQUEST"
        assert admin.describe_client_quotas() == before


def test_the_cli_sets_lists_and_removes_quotas(node):
    def cli(*args: str) -> str:
        done = subprocess.run([sys.executable, "-m", "api.cli", "--bootstrap", node, *args],
                              cwd=REPO_ROOT, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        return done.stdout
    cli("quotas", "set", "--user", "User:CN=etl,O=acme", "--client-id", "nightly",
        "--producer-byte-rate", "5e6", "--consumer-byte-rate", "1048576",
        "--request-percentage", "12.5")
    listing = cli("quotas", "list")
    assert "User:CN=etl,O=acme" in listing and "5,000,000" in listing \
        and "1,048,576" in listing and "12.5%" in listing and "REQUEST-PERCENTAGE" in listing
    cli("quotas", "remove", "--user", "User:CN=etl,O=acme", "--client-id", "nightly",
        "--producer-byte-rate", "--consumer-byte-rate", "--request-percentage")
    assert "User:CN=etl,O=acme" not in cli("quotas", "list")
