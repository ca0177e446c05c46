"""Spark reads and writes a TLS cluster that requires client certificates,
with Kafka's option names (PEM truststore and keystore): the sink writes a
DataFrame exactly once, the source reads it back row for row. Without the
options the write fails at once, saying what to set."""

from __future__ import annotations

import os

import pytest

from api.client import Admin, NewTopic
from chaos.cluster import FAST_SETTINGS, ProcessCluster
from tests.spark.test_source import unique

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def tls_cluster(tmp_path_factory):
    with ProcessCluster(str(tmp_path_factory.mktemp("spark-tls")), controllers=1, brokers=0,
                        combined=True, tls=True,
                        settings={**FAST_SETTINGS, "ssl.client.auth": "required"}) as cluster:
        cluster.start()
        cluster.wait_for_brokers_running(timeout_s=30)
        yield cluster


def tls_options(cluster: ProcessCluster, directory) -> dict[str, str]:
    """Kafka's client TLS properties; the keystore is one PEM file holding
    the client's certificate and key, as Kafka's PEM keystore is."""
    keystore = os.path.join(directory, "client-keystore.pem")
    with open(keystore, "wb") as out:
        for path in (cluster.certs["client"].certfile, cluster.certs["client"].keyfile):
            with open(path, "rb") as f:
                out.write(f.read())
    return {"kafka.bootstrap.servers": f"127.0.0.1:{cluster.nodes[1].broker_port}",
            "kafka.security.protocol": "SSL",
            "kafka.ssl.truststore.type": "PEM",
            "kafka.ssl.truststore.location": cluster.certs["ca"].certfile,
            "kafka.ssl.keystore.type": "PEM",
            "kafka.ssl.keystore.location": keystore}


def test_spark_writes_and_reads_a_tls_cluster(spark, tls_cluster, tmp_path):
    topic = unique("tls")
    with Admin(tls_cluster.nodes[1].broker_url, **tls_cluster.client_security) as admin:
        admin.create_topics([NewTopic(topic, 2, 1)])
    options = tls_options(tls_cluster, tmp_path)
    rows = [(f"k{i % 5}", f"v{i}") for i in range(300)]
    writer = spark.createDataFrame(rows, "key string, value string").write \
        .format("kraftlog").mode("append").option("topic", topic)
    for key, value in options.items():
        writer = writer.option(key, value)
    writer.save()

    reader = spark.read.format("kraftlog").option("subscribe", topic) \
        .option("kafka.isolation.level", "read_committed")
    for key, value in options.items():
        reader = reader.option(key, value)
    got = reader.load().selectExpr("CAST(key AS STRING)", "CAST(value AS STRING)").collect()
    assert sorted((r[0], r[1]) for r in got) == sorted(rows)

    # The same write without the TLS options: refused with what to do.
    plain = spark.createDataFrame(rows[:1], "key string, value string").write \
        .format("kraftlog").mode("append").option("topic", topic) \
        .option("kafka.bootstrap.servers", options["kafka.bootstrap.servers"])
    with pytest.raises(Exception, match="speaks TLS"):
        plain.save()
