"""TLS on every listener, with real processes and certificates.

One cluster of three combined nodes (controller and broker each), every
listener SSL, clients required to present a certificate
(``ssl.client.auth = required``), certificates from ``kraftlog certs
create``'s code. Brokers register with controllers over TLS, replicate
from each other over TLS (a topic of three replicas stays fully in sync),
and a client with the cluster's CA and a client certificate writes and
reads. Then what must fail, fails at once and says why (never a retry
until a timeout): a client that trusts another CA, one without a client
certificate, one with an expired certificate, TLS to a plain port and
plain HTTP to a TLS port. Last, a node's certificate replaced on disk is
served to new connections without a restart.
"""

from __future__ import annotations

import contextlib
import datetime
import http.server
import os
import socket
import ssl
import subprocess
import sys
import threading
import time

import pytest

from api import certs
from api.client import (Admin, Consumer, KraftlogError, NewTopic, Producer,
                        SslAuthenticationError, TopicPartition)
from chaos.cluster import FAST_SETTINGS, REPO_ROOT, ProcessCluster, http_json, wait_until

TOPIC = "secure-orders"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    base = tmp_path_factory.mktemp("tls")
    settings = {**FAST_SETTINGS, "ssl.client.auth": "required", "ssl.reload.interval.ms": 200,
                # Users are named by their certificate's CN; other subjects refused.
                "ssl.principal.mapping.rules": r"RULE:^CN=(client|node-\d+),O=.*$/$1/",
                "quota.window.num": 2, "quota.window.size.seconds": 1}
    with ProcessCluster(str(base / "cluster"), controllers=3, brokers=3, combined=True,
                        settings=settings, tls=True) as running:
        running.start()
        running.wait_for_active_controller(30)
        running.wait_for_brokers_running(timeout_s=30)
        yield running


def bootstrap(cluster: ProcessCluster) -> str:
    return ",".join(cluster.nodes[n].broker_url for n in cluster.broker_ids)


def test_a_tls_cluster_registers_replicates_and_serves_clients(cluster):
    assert all(url.startswith("https://") for url in bootstrap(cluster).split(","))
    security = cluster.client_security
    with Admin(bootstrap(cluster), **security) as admin:
        admin.create_topics([NewTopic(TOPIC, num_partitions=2, replication_factor=3)])
    with Producer(bootstrap(cluster), **security) as producer:
        for i in range(200):
            producer.send(TOPIC, b"order-%d" % i, key=b"k%d" % (i % 7))
        producer.flush(30_000)
    with Consumer(bootstrap(cluster), **security, auto_offset_reset="earliest",
                  consumer_timeout_ms=5000) as consumer:
        consumer.assign([TopicPartition(TOPIC, 0), TopicPartition(TOPIC, 1)])
        values = sorted(record.value for record in consumer)
    assert values == sorted(b"order-%d" % i for i in range(200))

    # Followers fetch from leaders over TLS: every partition has all three
    # replicas in sync, and the brokers' metadata names them by https URL.
    def fully_replicated() -> bool:
        status, topic = http_json(cluster.nodes[1].broker_url + f"/v1/topics/{TOPIC}",
                                  context=cluster.ssl_context)
        return status == 200 and all(len(p["isr"]) == 3 for p in topic["partitions"])
    wait_until(fully_replicated, 30, "three in-sync replicas over TLS")
    status, brokers = http_json(cluster.nodes[2].broker_url + "/v1/brokers",
                                context=cluster.ssl_context)
    assert status == 200
    assert all(b["url"].startswith("https://127.0.0.1:") for b in brokers["brokers"])


def test_the_cli_connects_with_its_tls_options(cluster):
    security = cluster.client_security
    base = [sys.executable, "-m", "api.cli", "--bootstrap",
            f"127.0.0.1:{cluster.nodes[1].broker_port}",
            "--security-protocol", "SSL", "--ssl-cafile", security["ssl_cafile"],
            "--ssl-certfile", security["ssl_certfile"], "--ssl-keyfile", security["ssl_keyfile"]]
    for args in (["topics", "create", "cli-secure", "--partitions", "1"], ["topics", "list"]):
        done = subprocess.run(base + args, cwd=REPO_ROOT, capture_output=True, text=True,
                              timeout=60)
        assert done.returncode == 0, done.stderr
    assert "cli-secure" in done.stdout.split()


def fails_fast(make_call, timeout_s: float = 10.0) -> KraftlogError:
    """The error ``make_call`` raises, checked to come well before a
    retry-until-timeout would have ended."""
    started = time.monotonic()
    with pytest.raises(KraftlogError) as caught:
        make_call()
    assert time.monotonic() - started < timeout_s
    return caught.value


def admin_call(url: str, request_timeout_ms: int = 20_000, **security) -> None:
    with Admin(url, request_timeout_ms=request_timeout_ms, **security) as admin:
        admin.list_topics()


def test_a_client_trusting_another_ca_is_refused_and_told_why(cluster, tmp_path):
    other = certs.CertificateAuthority.create(name="some other CA").save(str(tmp_path))
    error = fails_fast(lambda: admin_call(
        cluster.nodes[1].broker_url, **{**cluster.client_security, "ssl_cafile": other.certfile}))
    assert isinstance(error, SslAuthenticationError)
    assert error.code == "SSL_AUTHENTICATION_FAILED" and not error.retriable
    assert "certificate verify failed" in error.message and "ssl_cafile" in error.message


def test_a_client_without_a_certificate_is_refused_where_one_is_required(cluster):
    security = dict(cluster.client_security)
    del security["ssl_certfile"], security["ssl_keyfile"]
    error = fails_fast(lambda: admin_call(cluster.nodes[1].broker_url, **security))
    assert isinstance(error, SslAuthenticationError) and not error.retriable
    assert "requires a client certificate" in error.message


def test_expired_certificates_are_refused_on_both_sides(cluster, tmp_path):
    ca = _cluster_ca(cluster)
    long_ago = datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(days=30)
    # A client's own expired certificate: refused before it connects.
    expired = ca.issue(str(tmp_path), "expired-client", "client", (), days=1,
                       not_before=long_ago)
    with pytest.raises(ValueError, match="expired on"):
        Admin(cluster.nodes[1].broker_url, **{**cluster.client_security,
                                              "ssl_certfile": expired.certfile,
                                              "ssl_keyfile": expired.keyfile})
    # A server whose certificate expired: the client will not talk to it.
    served = ca.issue(str(tmp_path), "expired-server", "node", certs.DEFAULT_HOSTS, days=1,
                      not_before=long_ago)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(served.certfile, served.keyfile)
    with _serving(context) as port:
        error = fails_fast(lambda: admin_call(f"https://127.0.0.1:{port}",
                                              **cluster.client_security))
    assert isinstance(error, SslAuthenticationError)
    assert "certificate has expired" in error.message


@contextlib.contextmanager
def _serving(context: ssl.SSLContext | None = None):
    """A plain (or, with ``context``, TLS) HTTP server on a free port."""
    server = http.server.HTTPServer(("127.0.0.1", 0), http.server.BaseHTTPRequestHandler)
    if context is not None:
        server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_port
    finally:
        server.shutdown()
        server.server_close()


def test_tls_to_a_plain_port_and_plain_http_to_a_tls_port(cluster):
    # Plain HTTP to an SSL listener: the connection is closed, and the
    # error says what to change.
    plain = cluster.nodes[1].broker_url.replace("https://", "http://")
    error = fails_fast(lambda: admin_call(plain))
    assert isinstance(error, SslAuthenticationError)
    assert "speaks TLS" in error.message and "https://" in error.message
    # TLS to a port that speaks plain HTTP.
    with _serving() as port:
        error = fails_fast(lambda: admin_call(f"https://127.0.0.1:{port}",
                                              **cluster.client_security))
    assert isinstance(error, SslAuthenticationError)
    assert "listener is SSL" in error.message


def _cluster_ca(cluster: ProcessCluster) -> certs.CertificateAuthority:
    return certs.CertificateAuthority.load(cluster.certs["ca"])


def _served_serial(port: int, context: ssl.SSLContext) -> int:
    from cryptography import x509
    with socket.create_connection(("127.0.0.1", port), timeout=5) as raw:
        with context.wrap_socket(raw, server_hostname="127.0.0.1") as tls_sock:
            der = tls_sock.getpeercert(binary_form=True)
    return x509.load_der_x509_certificate(der).serial_number


def test_a_replaced_certificate_is_served_without_a_restart(cluster, tmp_path):
    node = cluster.nodes[3]
    port = node.broker_port
    before = _served_serial(port, cluster.ssl_context)
    ca = _cluster_ca(cluster)
    fresh = ca.issue(str(tmp_path), "node-3-new", "node-3", certs.DEFAULT_HOSTS)
    own = cluster.certs["node-3"]
    # Replace key and certificate atomically, as a rotation tool would.
    for new, old in ((fresh.keyfile, own.keyfile), (fresh.certfile, own.certfile)):
        os.replace(new, old)
    wait_until(lambda: _served_serial(port, cluster.ssl_context) != before, 15,
               "the new certificate on new connections")
    assert node.running
    with Admin(node.broker_url, **cluster.client_security) as admin:
        assert TOPIC in admin.list_topics()


def test_a_certificate_no_mapping_rule_matches_is_refused(cluster, tmp_path):
    stranger = _cluster_ca(cluster).issue(str(tmp_path), "stranger", "stranger")
    security = {**cluster.client_security, "ssl_certfile": stranger.certfile,
                "ssl_keyfile": stranger.keyfile}
    error = fails_fast(lambda: admin_call(cluster.nodes[1].broker_url, **security))
    assert isinstance(error, SslAuthenticationError) and not error.retriable
    assert "no ssl.principal.mapping.rules rule matches" in error.message
    assert "CN=stranger" in error.message


def test_a_user_quota_applies_to_the_certificates_user(cluster):
    """The client certificate's CN, mapped by the rule, is the user a quota
    names: User:client."""
    url = cluster.nodes[2].broker_url
    with Admin(url, **cluster.client_security) as admin:
        admin.create_topics([NewTopic("user-quota", 1, 3)])
        admin.alter_client_quotas({"user": "User:client"}, {"producer_byte_rate": 50_000})
    with Producer(bootstrap(cluster), client_id="by-user", linger_ms=0,
                  batch_size=64 * 1024, **cluster.client_security) as producer:
        for i in range(200):
            producer.send("user-quota", b"u" * 1024)
        producer.flush(60_000)
    held = 0.0
    for node in cluster.nodes.values():
        text = _get_text(node.broker_url + "/metrics", cluster.ssl_context)
        for line in text.splitlines():
            if line.startswith("kraftlog_client_quota_throttle_ms_total{") \
                    and 'client_id="by-user"' in line:
                held += float(line.rsplit(" ", 1)[1])
    assert held > 0


def _get_text(url: str, context: ssl.SSLContext) -> str:
    import urllib.request
    with urllib.request.urlopen(url, timeout=5, context=context) as response:
        return response.read().decode()
