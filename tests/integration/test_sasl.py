"""SASL_SSL: SCRAM users authenticate with a name and a password inside TLS.

A cluster (one controller, two brokers) whose BROKER listeners are SASL_SSL
and whose CONTROLLER listener is SSL; the nodes call each other with their
certificates (registration, replication). Users are made with the admin
client and the CLI; the cluster keeps only salted, iterated keys. A client
with only the CA and a user's password writes and reads; a wrong password,
an unknown user, a deleted user and no credentials at all are each refused
at once with SASL_AUTHENTICATION_FAILED; a new password replaces the old.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest

from api.client import (Admin, Consumer, KraftlogError, NewTopic, Producer,
                        SaslAuthenticationError, TopicPartition)
from chaos.cluster import FAST_SETTINGS, REPO_ROOT, ProcessCluster, wait_until

PASSWORD = "correct horse battery"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    settings = {**FAST_SETTINGS, "listener.security.protocol.map": "BROKER:SASL_SSL,CONTROLLER:SSL"}
    with ProcessCluster(str(tmp_path_factory.mktemp("sasl")), controllers=1, brokers=2,
                        settings=settings, tls=True) as running:
        running.start()
        running.wait_for_active_controller(30)
        running.wait_for_brokers_running(timeout_s=30)
        yield running


def bootstrap(cluster: ProcessCluster) -> str:
    return ",".join(cluster.nodes[b].broker_url for b in cluster.broker_ids)


def as_user(cluster: ProcessCluster, user: str, password: str) -> dict:
    return {"security_protocol": "SASL_SSL", "ssl_cafile": cluster.certs["ca"].certfile,
            "sasl_mechanism": "SCRAM-SHA-512", "sasl_plain_username": user,
            "sasl_plain_password": password}


def wait_for_login(cluster: ProcessCluster, user: str, works: bool = True) -> None:
    """Until logging in as ``user`` (with PASSWORD) works (or is refused) on
    every broker: each applies the metadata change on its own."""
    def on_every_broker() -> bool:
        for broker in cluster.broker_ids:
            try:
                with Admin(cluster.nodes[broker].broker_url, request_timeout_ms=5000,
                           **as_user(cluster, user, PASSWORD)) as admin:
                    admin.list_topics()
                logged_in = True
            except SaslAuthenticationError:
                logged_in = False
            if logged_in != works:
                return False
        return True
    wait_until(on_every_broker, 30, f"{user} {'accepted' if works else 'refused'} everywhere")


def refused(call) -> KraftlogError:
    started = time.monotonic()
    with pytest.raises(KraftlogError) as caught:
        call()
    assert time.monotonic() - started < 10, "a refusal must not be retried until a timeout"
    return caught.value


def list_topics(cluster: ProcessCluster, **security) -> list[str]:
    with Admin(bootstrap(cluster), request_timeout_ms=20_000, **security) as admin:
        return admin.list_topics()


def test_a_user_writes_and_reads_with_a_password_and_nodes_with_certificates(cluster):
    with Admin(bootstrap(cluster), **cluster.client_security) as admin:  # a certificate
        admin.upsert_user("etl", PASSWORD)
        admin.create_topics([NewTopic("sasl-orders", 2, 2)])
        assert admin.describe_users()["etl"] == {"SCRAM-SHA-512": 8192}
    wait_for_login(cluster, "etl")
    etl = as_user(cluster, "etl", PASSWORD)
    with Producer(bootstrap(cluster), **etl) as producer:
        for i in range(100):
            producer.send("sasl-orders", b"v%d" % i, key=b"%d" % i)
        producer.flush(30_000)
    with Consumer(bootstrap(cluster), auto_offset_reset="earliest", consumer_timeout_ms=5000,
                  **etl) as consumer:
        consumer.assign([TopicPartition("sasl-orders", p) for p in range(2)])
        assert sorted(r.value for r in consumer) == sorted(b"v%d" % i for i in range(100))

    # Replication between the brokers (their certificates, on SASL_SSL).
    def in_sync() -> bool:
        with Admin(bootstrap(cluster), **etl) as admin:
            parts = admin.describe_topics(["sasl-orders"])["sasl-orders"].partitions
        return all(len(p.isr) == 2 for p in parts)
    wait_until(in_sync, 30, "both replicas in sync over SASL_SSL")


def test_wrong_unknown_missing_and_deleted_credentials_are_refused(cluster):
    with Admin(bootstrap(cluster), **cluster.client_security) as admin:
        admin.upsert_user("temp", PASSWORD)
    wait_for_login(cluster, "temp")
    assert list_topics(cluster, **as_user(cluster, "temp", PASSWORD)) is not None
    for user, password in (("temp", "wrong password"), ("nobody", PASSWORD)):
        error = refused(lambda: list_topics(cluster, **as_user(cluster, user, password)))
        assert isinstance(error, SaslAuthenticationError) and not error.retriable
        assert "SCRAM user" in error.message
    with Admin(bootstrap(cluster), **cluster.client_security) as admin:
        admin.delete_user("temp")
    wait_for_login(cluster, "temp", works=False)
    error = refused(lambda: list_topics(cluster, **as_user(cluster, "temp", PASSWORD)))
    assert isinstance(error, SaslAuthenticationError)
    # No credentials at all (a plain HTTPS request): 401, nothing served.
    import ssl
    context = ssl.create_default_context(cafile=cluster.certs["ca"].certfile)
    with pytest.raises(urllib.error.HTTPError) as caught:
        urllib.request.urlopen(cluster.nodes[2].broker_url + "/v1/topics", timeout=5,
                               context=context)
    assert caught.value.code == 401
    assert json.load(caught.value)["error"]["code"] == "SASL_AUTHENTICATION_FAILED"


def test_the_cli_manages_users_and_authenticates_as_one(cluster, tmp_path):
    secret = tmp_path / "secret"
    secret.write_text("first password\n")
    certificate = cluster.client_security

    def cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "api.cli", "--bootstrap",
             cluster.nodes[cluster.broker_ids[0]].broker_url, *args],
            cwd=REPO_ROOT, capture_output=True, text=True, timeout=60,
            env={k: v for k, v in {**os.environ, **(env or {})}.items()
                 if not k.startswith("KRAFTLOG_") or k in (env or {})})
    as_admin = ["--security-protocol", "SASL_SSL", "--ssl-cafile", certificate["ssl_cafile"],
                "--ssl-certfile", certificate["ssl_certfile"],
                "--ssl-keyfile", certificate["ssl_keyfile"]]
    done = cli(*as_admin, "users", "create", "analyst", "--password-file", str(secret))
    assert done.returncode == 0, done.stderr
    assert "analyst" in cli(*as_admin, "users", "list").stdout

    as_analyst = ["--security-protocol", "SASL_SSL", "--ssl-cafile", certificate["ssl_cafile"],
                  "--sasl-username", "analyst", "--sasl-password-file", str(secret)]
    done = cli(*as_analyst, "topics", "list")
    assert done.returncode == 0, done.stderr
    secret.write_text("second password\n")
    assert cli(*as_analyst, "topics", "list").returncode == 1  # the old one is still set
    done = cli(*as_admin, "users", "set-password", "analyst", "--password-file", str(secret))
    assert done.returncode == 0, done.stderr
    done = cli(*as_analyst, "topics", "list")
    assert done.returncode == 0, done.stderr
    done = cli(*as_admin, "users", "create", "short", env={"KRAFTLOG_NEW_PASSWORD": "abc"})
    assert done.returncode == 1 and "at least 8 characters" in done.stderr


def test_scram_users_may_not_manage_users_and_the_controller_wants_a_certificate(cluster):
    """Until ACLs: a SCRAM user cannot make users, change passwords or set
    quotas; the CONTROLLER listener (SSL) of a cluster with SASL_SSL
    listeners serves no anonymous client."""
    with Admin(bootstrap(cluster), **cluster.client_security) as admin:
        admin.upsert_user("clerk", PASSWORD)
    wait_for_login(cluster, "clerk")
    with Admin(bootstrap(cluster), **as_user(cluster, "clerk", PASSWORD)) as admin:
        for call in (lambda: admin.upsert_user("clerk2", PASSWORD),
                     lambda: admin.upsert_user("etl", "taken over!"),
                     lambda: admin.alter_client_quotas({"client-id": "x"},
                                                       {"producer_byte_rate": 1e9})):
            error = refused(call)
            assert error.code == "CLUSTER_AUTHORIZATION_FAILED", error
    import ssl
    context = ssl.create_default_context(cafile=cluster.certs["ca"].certfile)
    controller = cluster.nodes[cluster.controller_ids[0]].controller_url
    with pytest.raises(urllib.error.HTTPError) as caught:
        urllib.request.urlopen(controller + "/v1/quorum", timeout=5, context=context)
    assert caught.value.code == 401
    assert json.load(caught.value)["error"]["code"] == "SSL_AUTHENTICATION_FAILED"


def test_a_password_user_may_not_pose_as_a_node(cluster):
    """A follower's fetch (unthrottled, past the high watermark), its fetch
    stream, transaction markers and KIP-890 checks come from nodes, with
    certificates: a SCRAM user gets 403 CLUSTER_AUTHORIZATION_FAILED for
    each (the stream's handshake is refused with 403)."""
    import asyncio

    import aiohttp

    from api.client._transport import Security, Transport
    with Admin(bootstrap(cluster), **cluster.client_security) as admin:
        admin.upsert_user("poser", PASSWORD)
    wait_for_login(cluster, "poser")
    settings = as_user(cluster, "poser", PASSWORD)
    del settings["security_protocol"]
    transport = Transport(security=Security("SASL_SSL", **settings))
    url = cluster.nodes[cluster.broker_ids[0]].broker_url
    calls = [("/v1/fetch", {"replica_id": cluster.broker_ids[1], "max_wait_ms": 0,
                            "partitions": [{"topic": "sasl-orders", "partition": 0,
                                            "offset": 0}]}),
             ("/v1/txn/markers", {"markers": []}),
             ("/v1/transactions/verify", {"transactional_id": "t", "producer_id": 1,
                                          "producer_epoch": 0, "partitions": []})]

    async def send_all() -> list[str]:
        codes = []
        try:
            for path, body in calls:
                try:
                    await transport.request(url, path, body)
                    codes.append("served")
                except KraftlogError as exc:
                    codes.append(exc.code)
            try:
                stream = await transport._session_or_new().ws_connect(
                    url + "/v1/replica/fetch-stream")
                await stream.close()
                codes.append("served")
            except aiohttp.WSServerHandshakeError as exc:
                codes.append(exc.status)
        finally:
            await transport.close()
        return codes
    assert asyncio.run(send_all()) == ["CLUSTER_AUTHORIZATION_FAILED"] * 3 + [403]
