"""ACLs on a secure cluster: one controller and two brokers, BROKER
listeners SASL_SSL, the CONTROLLER listener SSL, the authorizer on, the
nodes' and the administrator's certificates super users.

- Every HTTP endpoint (from the broker's and the controller's rule tables,
  which each node checks against its router at start-up) is called with no
  credentials, a wrong password, a user without ACLs and a user with them:
  401, 401, a refusal that carries no data (or a listing without the
  resources), and an answer that is no authorization failure.
- The clients' view: a user without ACLs sees no topic, a named topic and a
  missing one answer alike; producers, consumers, groups and transactional
  producers are refused at once, with non-retriable errors, and work once
  `kraftlog acls add` allows them; a DENY wins over an ALLOW to everyone.
"""

from __future__ import annotations

import base64
import json
import os
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request

import msgpack
import pytest

from api import certs
from api.broker.authz import BROKER_ROUTE_RULES
from api.client import (AclBinding, AclBindingFilter, Admin, Consumer, KraftlogError, NewTopic,
                        Producer, TopicAuthorizationFailedError, TopicPartition)
from chaos.cluster import FAST_SETTINGS, REPO_ROOT, ProcessCluster, wait_until
from kraft.server import CONTROLLER_ROUTE_RULES
from protocol import acl, tls
from storage.batch import BatchBuilder

PASSWORD = "correct horse battery"
ALICE, MALLORY = "User:alice", "User:mallory"
#: What alice is allowed: everything named acl-*, and the cluster.
ALICE_GRANTS = [AclBinding(rtype, "acl-", acl.PREFIXED, ALICE, "*", acl.ALL, acl.ALLOW)
                for rtype in (acl.TOPIC, acl.GROUP, acl.TRANSACTIONAL_ID)] + [
    AclBinding(acl.CLUSTER, acl.CLUSTER_NAME, acl.LITERAL, ALICE, "*", acl.ALL, acl.ALLOW)]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    settings = {**FAST_SETTINGS,
                "listener.security.protocol.map": "BROKER:SASL_SSL,CONTROLLER:SSL"}
    with ProcessCluster(str(tmp_path_factory.mktemp("acls")), controllers=1, brokers=2,
                        settings=settings, tls=True, acls=True) as running:
        running.start()
        running.wait_for_active_controller(30)
        running.wait_for_brokers_running(timeout_s=30)
        with Admin(bootstrap(running), **running.client_security) as admin:
            for user in ("alice", "mallory", "bob", "dave"):
                admin.upsert_user(user, PASSWORD)
            admin.create_topics([NewTopic("acl-orders", 2, 2), NewTopic("acl-doomed", 1, 1),
                                 NewTopic("public", 1, 2), NewTopic("orders.eu", 1, 2),
                                 NewTopic("other", 1, 2), NewTopic("hidden-ledger", 1, 2)])
        for user in ("alice", "mallory", "bob", "dave"):
            wait_for_login(running, user)
        with Producer(bootstrap(running), **running.client_security) as producer:
            for i in range(10):
                producer.send("acl-orders", b"v%d" % i, partition=i % 2)
                producer.send("public", b"p%d" % i)
            producer.flush(30_000)
        with Admin(bootstrap(running), **running.client_security) as admin:
            admin.alter_consumer_group_offsets("acl-group", {
                TopicPartition("acl-orders", 0): 3})
        yield running


def bootstrap(cluster: ProcessCluster) -> str:
    return ",".join(cluster.nodes[b].broker_url for b in cluster.broker_ids)


def as_user(cluster: ProcessCluster, user: str, password: str = PASSWORD) -> dict:
    return {"security_protocol": "SASL_SSL", "ssl_cafile": cluster.certs["ca"].certfile,
            "sasl_mechanism": "SCRAM-SHA-512", "sasl_plain_username": user,
            "sasl_plain_password": password}


def wait_for_login(cluster: ProcessCluster, user: str) -> None:
    def everywhere() -> bool:
        for broker in cluster.broker_ids:
            status, _ = call(cluster, "GET", "/healthz", None, user=user,
                             broker=broker)
            if status != 200:
                return False
        return True
    wait_until(everywhere, 30, f"{user} accepted by every broker")


def grant(cluster: ProcessCluster, bindings: list[AclBinding]) -> None:
    """Create ACLs as the administrator and wait until every broker has them."""
    with Admin(bootstrap(cluster), **cluster.client_security) as admin:
        admin.create_acls(bindings)

    def everywhere() -> bool:
        for broker in cluster.broker_ids:
            with Admin(cluster.nodes[broker].broker_url, **cluster.client_security) as admin:
                if not set(bindings) <= set(admin.describe_acls()):
                    return False
        return True
    wait_until(everywhere, 30, "the ACLs on every broker")


def call(cluster: ProcessCluster, method: str, path: str, body, *, user: str | None = None,
         password: str = PASSWORD, broker: int | None = None, as_json: bool = False,
         certificate=None, url: str | None = None) -> tuple[int, dict]:
    """One HTTPS request: (status, decoded body)."""
    context = ssl.create_default_context(cafile=cluster.certs["ca"].certfile)
    if certificate is not None:
        context.load_cert_chain(certificate.certfile, certificate.keyfile)
    base = url or cluster.nodes[broker or cluster.broker_ids[0]].broker_url
    headers = {"Accept": "application/json" if as_json else "application/msgpack"}
    data = None
    if body is not None:
        if as_json:
            data, headers["Content-Type"] = json.dumps(body).encode(), "application/json"
        else:
            data = msgpack.packb(body, use_bin_type=True)
            headers["Content-Type"] = "application/msgpack"
    if user is not None:
        token = base64.b64encode(f"{user}:{password}".encode()).decode()
        headers["Authorization"] = f"Basic {token}"
    request = urllib.request.Request(base + path, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=30, context=context) as answer:
            status, raw, kind = answer.status, answer.read(), answer.headers.get_content_type()
    except urllib.error.HTTPError as exc:
        status, raw, kind = exc.code, exc.read(), exc.headers.get_content_type()
    if kind == "application/msgpack":
        return status, msgpack.unpackb(raw, raw=False)
    if kind == "application/json":
        return status, json.loads(raw)
    return status, {"text": raw.decode(errors="replace")}


async def user_stream(session, cluster: ProcessCluster, broker: int, user: str, path: str):
    """A WebSocket to ``path`` on ``broker``, opened as ``user`` (with its
    password, over TLS)."""
    context = ssl.create_default_context(cafile=cluster.certs["ca"].certfile)
    token = base64.b64encode(f"{user}:{PASSWORD}".encode()).decode()
    return await session.ws_connect(cluster.nodes[broker].broker_url + path, ssl=context,
                                    headers={"Authorization": f"Basic {token}"})


def batch(value: bytes = b"x") -> bytes:
    builder = BatchBuilder()
    builder.append(None, value)
    return builder.build()


# -- the matrix -------------------------------------------------------------------------
TOPIC_REFUSED, GROUP_REFUSED, CLUSTER_REFUSED, TXN_REFUSED = (
    "TOPIC_AUTHORIZATION_FAILED", "GROUP_AUTHORIZATION_FAILED",
    "CLUSTER_AUTHORIZATION_FAILED", "TRANSACTIONAL_ID_AUTHORIZATION_FAILED")


def whole(code: str):
    """A whole-request refusal: 403 and a body that is the error alone."""
    def check(status: int, body: dict) -> None:
        assert status == 403 and set(body) == {"error"} and body["error"]["code"] == code, \
            (status, body)
    return check


def per_partition(key: str, code: str = TOPIC_REFUSED):
    """Each partition refused, with nothing of it told (no records, no offsets)."""
    def check(status: int, body: dict) -> None:
        assert status == 200 and body[key], (status, body)
        for entry in body[key]:
            assert entry["error"]["code"] == code, entry
            assert not entry.get("records") and entry.get("offset", -1) == -1
            assert entry.get("high_watermark", -1) == -1 and not entry.get("partitions")
            assert entry.get("topic_id") is None
    return check


def empty(key: str):
    """A listing with nothing in it."""
    def check(status: int, body: dict) -> None:
        assert status == 200 and body[key] == [], (status, body)
    return check


def served(status: int, body: dict) -> None:
    assert status == 200, (status, body)


def own_tokens_only(status: int, body: dict) -> None:
    """Tokens need no ACL: a user sees (and makes) only its own."""
    assert status == 200 and all(t["owner"] == MALLORY for t in body["tokens"]), body


def unknown_token(status: int, body: dict) -> None:
    assert status == 404 and set(body) == {"error"} and \
        body["error"]["code"] == "DELEGATION_TOKEN_NOT_FOUND", (status, body)


PRODUCE = {"acks": 1, "partitions": [{"topic": "acl-orders", "partition": 0,
                                      "records": batch()}]}
OFFSETS = [{"topic": "acl-orders", "partition": 0, "offset": 1}]
TXN = {"transactional_id": "acl-txn", "producer_id": 1, "producer_epoch": 0}
TXN_PARTS = [{"topic": "acl-orders", "partition": 0}]

def not_an_upgrade(status: int, body: dict) -> None:
    """Past authentication and the route's rule, refused for want of a
    WebSocket upgrade: a 400 saying so, not an authorization failure."""
    assert status == 400 and body["error"]["code"] == "INVALID_REQUEST", (status, body)


def console_asset(status: int, body) -> None:
    """A console asset: served (HTML, script or style; never data)."""
    assert status == 200 and "text" in body, (status, body)
    assert "AUTHORIZATION_FAILED" not in body["text"], body


#: (method, path) -> (path as called, body, JSON?, what a user without ACLs gets)
BROKER_CASES = {
    ("POST", "/v1/produce"): ("/v1/produce", PRODUCE, False, per_partition("partitions")),
    ("POST", "/v1/fetch"): ("/v1/fetch", {"max_wait_ms": 0, "partitions": [
        {"topic": "acl-orders", "partition": 0, "offset": 0}]}, False,
        per_partition("partitions")),
    # A follower's fetch stream: CLUSTER_ACTION, like a follower's fetch
    # (a plain GET past the checks is refused for want of an upgrade).
    ("GET", "/v1/replica/fetch-stream"): ("/v1/replica/fetch-stream", None, False,
                                          whole(CLUSTER_REFUSED)),
    # A client's stream: open to any user; each request on it is checked as
    # its POST is (a plain GET past the checks is refused for want of an
    # upgrade).
    ("GET", "/v1/stream"): ("/v1/stream", None, False, not_an_upgrade),
    ("POST", "/v1/offsets"): ("/v1/offsets", {"partitions": [
        {"topic": "acl-orders", "partition": 0, "timestamp": -1}]}, False,
        per_partition("partitions")),
    ("POST", "/v1/txn/markers"): ("/v1/txn/markers", {"markers": []}, False,
                                  whole(CLUSTER_REFUSED)),
    ("POST", "/v1/metadata"): ("/v1/metadata", {"topics": ["acl-orders", "acl-missing"]},
                               False, per_partition("topics")),
    ("GET", "/v1/metadata"): ("/v1/metadata", None, False, empty("topics")),
    ("POST", "/topics/{topic}"): ("/topics/acl-orders", {"records": [{"value": "x"}]}, True,
                                  whole(TOPIC_REFUSED)),
    ("GET", "/topics/{topic}/partitions/{partition}/records"): (
        "/topics/acl-orders/partitions/0/records", None, True, whole(TOPIC_REFUSED)),
    ("GET", "/topics/{topic}/partitions/{partition}/offsets"): (
        "/topics/acl-orders/partitions/0/offsets", None, True, whole(TOPIC_REFUSED)),
    ("POST", "/v1/groups/coordinator"): ("/v1/groups/coordinator", {"group_id": "acl-group"},
                                         False, whole(GROUP_REFUSED)),
    ("POST", "/v1/groups/heartbeat"): ("/v1/groups/heartbeat", {
        "group_id": "acl-group", "member_epoch": 0, "subscribed_topic_names": ["acl-orders"]},
        False, whole(GROUP_REFUSED)),
    ("POST", "/v1/groups/watch"): ("/v1/groups/watch", {
        "group_id": "acl-group", "member_id": "m", "max_wait_ms": 0}, False,
        whole(GROUP_REFUSED)),
    ("POST", "/v1/groups/offsets/commit"): ("/v1/groups/offsets/commit", {
        "group_id": "acl-group", "offsets": OFFSETS}, False, whole(GROUP_REFUSED)),
    ("POST", "/v1/groups/offsets/fetch"): ("/v1/groups/offsets/fetch",
                                           {"group_id": "acl-group"}, False,
                                           whole(GROUP_REFUSED)),
    ("POST", "/v1/groups/offsets/txn_commit"): ("/v1/groups/offsets/txn_commit", {
        **TXN, "group_id": "acl-group", "offsets": OFFSETS}, False, whole(TXN_REFUSED)),
    ("POST", "/v1/admin/groups/delete"): ("/v1/admin/groups/delete",
                                          {"group_id": "acl-nothing"}, False,
                                          whole(GROUP_REFUSED)),
    ("POST", "/v1/admin/groups/offsets/reset"): ("/v1/admin/groups/offsets/reset", {
        "group_id": "acl-group", "offsets": OFFSETS}, False, whole(GROUP_REFUSED)),
    ("GET", "/v1/groups"): ("/v1/groups", None, False, empty("groups")),
    ("GET", "/v1/groups/{group}"): ("/v1/groups/acl-group", None, False,
                                    whole(GROUP_REFUSED)),
    ("POST", "/v1/producers/init"): ("/v1/producers/init", {}, False, whole(CLUSTER_REFUSED)),
    ("POST", "/v1/transactions/coordinator"): ("/v1/transactions/coordinator",
                                               {"transactional_id": "acl-txn"}, False,
                                               whole(TXN_REFUSED)),
    ("POST", "/v1/transactions/add_partitions"): ("/v1/transactions/add_partitions", {
        **TXN, "partitions": TXN_PARTS}, False, whole(TXN_REFUSED)),
    ("POST", "/v1/transactions/end"): ("/v1/transactions/end", {**TXN, "committed": False},
                                       False, whole(TXN_REFUSED)),
    ("POST", "/v1/transactions/verify"): ("/v1/transactions/verify", {
        **TXN, "partitions": TXN_PARTS}, False, whole(CLUSTER_REFUSED)),
    ("POST", "/v1/admin/transactions/abort"): ("/v1/admin/transactions/abort",
                                               {"transactional_id": "acl-txn"}, False,
                                               whole(CLUSTER_REFUSED)),
    ("GET", "/v1/transactions"): ("/v1/transactions", None, False, empty("transactions")),
    ("GET", "/v1/transactions/{transactional_id}"): ("/v1/transactions/acl-txn", None, False,
                                                     whole(TXN_REFUSED)),
    ("POST", "/v1/admin/topics/create"): ("/v1/admin/topics/create", {
        "topics": [{"name": "acl-new", "num_partitions": 1, "replication_factor": 1}]}, False,
        whole(TOPIC_REFUSED)),
    ("POST", "/v1/admin/topics/delete"): ("/v1/admin/topics/delete",
                                          {"topics": ["acl-doomed"]}, False,
                                          whole(TOPIC_REFUSED)),
    ("POST", "/v1/admin/topics/describe"): ("/v1/admin/topics/describe",
                                            {"topics": ["acl-orders"]}, False,
                                            per_partition("topics")),
    ("POST", "/v1/admin/partitions/create"): ("/v1/admin/partitions/create", {
        "topics": [{"name": "acl-orders", "count": 2}]}, False, whole(TOPIC_REFUSED)),
    ("POST", "/v1/admin/configs/describe"): ("/v1/admin/configs/describe", {
        "resources": [{"type": "topic", "name": "acl-orders"}]}, False, whole(TOPIC_REFUSED)),
    ("POST", "/v1/admin/configs/alter"): ("/v1/admin/configs/alter", {
        "resources": [{"type": "topic", "name": "acl-orders", "ops": []}]}, False,
        whole(TOPIC_REFUSED)),
    ("POST", "/v1/admin/leaders/elect"): ("/v1/admin/leaders/elect", {"partitions": []},
                                          False, whole(CLUSTER_REFUSED)),
    ("POST", "/v1/admin/partitions/reassign"): ("/v1/admin/partitions/reassign",
                                                {"partitions": []}, False,
                                                whole(CLUSTER_REFUSED)),
    ("POST", "/v1/admin/partitions/reassignments"): ("/v1/admin/partitions/reassignments",
                                                     {}, False, whole(CLUSTER_REFUSED)),
    ("POST", "/v1/admin/quotas/alter"): ("/v1/admin/quotas/alter", {"entries": []}, False,
                                         whole(CLUSTER_REFUSED)),
    ("POST", "/v1/admin/quotas/describe"): ("/v1/admin/quotas/describe", {}, False,
                                            whole(CLUSTER_REFUSED)),
    ("POST", "/v1/admin/users/alter"): ("/v1/admin/users/alter", {"deletions": []}, False,
                                        whole(CLUSTER_REFUSED)),
    ("POST", "/v1/admin/users/describe"): ("/v1/admin/users/describe", {}, False,
                                           whole(CLUSTER_REFUSED)),
    ("POST", "/v1/admin/acls/create"): ("/v1/admin/acls/create", {"creations": []}, False,
                                        whole(CLUSTER_REFUSED)),
    ("POST", "/v1/admin/acls/delete"): ("/v1/admin/acls/delete", {"filters": []}, False,
                                        whole(CLUSTER_REFUSED)),
    ("POST", "/v1/admin/acls/describe"): ("/v1/admin/acls/describe", {}, False,
                                          whole(CLUSTER_REFUSED)),
    ("POST", "/v1/admin/tokens/create"): ("/v1/admin/tokens/create", {}, False, served),
    ("POST", "/v1/admin/tokens/renew"): ("/v1/admin/tokens/renew", {
        "token_id": "acl-nothing", "hmac": "x"}, False, unknown_token),
    ("POST", "/v1/admin/tokens/expire"): ("/v1/admin/tokens/expire", {
        "token_id": "acl-nothing", "hmac": "x"}, False, unknown_token),
    ("POST", "/v1/admin/tokens/describe"): ("/v1/admin/tokens/describe", {}, False,
                                            own_tokens_only),
    ("GET", "/healthz"): ("/healthz", None, True, served),
    # The web console's page, script and style: served to anyone, as they
    # hold no data (the page asks for credentials and sends them itself).
    ("GET", "/ui"): ("/ui", None, True, console_asset),
    ("GET", "/ui/"): ("/ui/", None, True, console_asset),
    ("GET", "/ui/static/{name}"): ("/ui/static/console.js", None, True, console_asset),
    ("GET", "/metrics"): ("/metrics", None, True, whole(CLUSTER_REFUSED)),
    ("GET", "/v1/cluster"): ("/v1/cluster", None, True, served),
    ("GET", "/v1/brokers"): ("/v1/brokers", None, True, served),
    ("GET", "/v1/topics"): ("/v1/topics", None, True, empty("topics")),
    ("GET", "/v1/topics/{topic}"): ("/v1/topics/acl-orders", None, True, whole(TOPIC_REFUSED)),
    ("GET", "/v1/quorum"): ("/v1/quorum", None, True, whole(CLUSTER_REFUSED)),
    ("GET", "/v1/log-dirs"): ("/v1/log-dirs", None, True, whole(CLUSTER_REFUSED)),
    ("GET", "/v1/metrics/topics"): ("/v1/metrics/topics", None, True,
                                    whole(CLUSTER_REFUSED)),
}


#: The same checks reached another way: one group's or transactional id's
#: description through the listing routes' ``?group_id=`` and
#: ``?transactional_id=`` (how the console asks, for ids like "..").
QUERY_CASES = {
    ("GET", "/v1/groups?group_id="): ("/v1/groups?group_id=acl-group", None, False,
                                      whole(GROUP_REFUSED)),
    ("GET", "/v1/transactions?transactional_id="): (
        "/v1/transactions?transactional_id=acl-txn", None, False, whole(TXN_REFUSED)),
}


def test_every_broker_route_has_a_matrix_case():
    # The nodes refuse to start with a route that has no rule
    # (check_routes_complete); a rule without a case here fails this test.
    assert set(BROKER_CASES) == set(BROKER_ROUTE_RULES)


def no_authorization_failure(status: int, body) -> None:
    assert status != 500, (status, body)  # a server bug (a 503 says: retry)
    if "text" in body:  # /metrics: counts of earlier refusals are in it
        assert status == 200, (status, body)
        return
    assert "AUTHORIZATION_FAILED" not in json.dumps(body, default=repr), (status, body)


def test_every_broker_route_refuses_strangers_and_users_without_acls(cluster):
    failures = []
    for (method, route), (path, body, as_json, check) in sorted(
            {**BROKER_CASES, **QUERY_CASES}.items()):
        for user, password, expected in ((None, PASSWORD, "SASL_AUTHENTICATION_FAILED"),
                                         ("mallory", "wrong password",
                                          "SASL_AUTHENTICATION_FAILED")):
            status, answer = call(cluster, method, path, body, user=user, password=password,
                                  as_json=as_json)
            if route in tls.PUBLIC_ROUTES:  # the console's assets: no credentials needed
                try:
                    console_asset(status, answer)
                except AssertionError:
                    failures.append((method, path, user, status, answer))
            elif status != 401 or answer.get("error", {}).get("code") != expected:
                failures.append((method, path, user, status, answer))
        try:
            check(*call(cluster, method, path, body, user="mallory", as_json=as_json))
        except AssertionError as exc:
            failures.append((method, path, "mallory", str(exc)))
    assert not failures, failures


def test_every_broker_route_serves_a_user_with_the_acls(cluster):
    grant(cluster, ALICE_GRANTS)
    failures = []
    for (method, _), (path, body, as_json, _check) in sorted(
            {**BROKER_CASES, **QUERY_CASES}.items()):
        status, answer = call(cluster, method, path, body, user="alice", as_json=as_json)
        try:
            no_authorization_failure(status, answer)
            assert status != 401, (status, answer)
        except AssertionError as exc:
            failures.append((method, path, str(exc)))
    assert not failures, failures
    # What was hidden from mallory is there for alice.
    _, topics = call(cluster, "GET", "/v1/topics", None, user="alice", as_json=True)
    assert {"acl-orders", "acl-new"} <= {t["name"] for t in topics["topics"]}
    assert "public" not in {t["name"] for t in topics["topics"]}
    _, groups = call(cluster, "GET", "/v1/groups", None, user="alice")
    assert "acl-group" in {g["group_id"] for g in groups["groups"]}


def test_every_controller_route_wants_a_node_or_an_administrator(cluster, tmp_path):
    ca = certs.CertificateAuthority.load(cluster.certs["ca"])
    stranger = ca.issue(str(tmp_path), "mallory", "mallory")
    url = cluster.nodes[cluster.controller_ids[0]].controller_url
    failures = []
    for method, path in sorted(CONTROLLER_ROUTE_RULES):
        body = None if method == "GET" else {}
        status, answer = call(cluster, method, path, body, url=url, as_json=True)
        if status != 401 or answer["error"]["code"] != "SSL_AUTHENTICATION_FAILED":
            failures.append((path, "no certificate", status, answer))
        status, answer = call(cluster, method, path, body, url=url, as_json=True,
                              certificate=stranger)
        expected = 200 if CONTROLLER_ROUTE_RULES[method, path].open else 403
        if status != expected or (expected == 403 and set(answer) != {"error"}):
            failures.append((path, "mallory's certificate", status, answer))
        status, answer = call(cluster, method, path, body, url=url, as_json=True,
                              certificate=cluster.certs["client"])
        if status in (401, 403):
            failures.append((path, "the administrator", status, answer))
    assert not failures, failures


# -- the clients' view ---------------------------------------------------------------------
def refused(call_it) -> KraftlogError:
    started = time.monotonic()
    with pytest.raises(KraftlogError) as caught:
        call_it()
    assert time.monotonic() - started < 10, "a refusal must not be retried until a timeout"
    assert not caught.value.retriable
    return caught.value


def test_a_user_without_acls_cannot_learn_that_a_topic_exists(cluster):
    with Admin(bootstrap(cluster), **as_user(cluster, "mallory")) as admin:
        assert admin.list_topics() == []
    _, answer = call(cluster, "POST", "/v1/metadata", {"topics": ["public", "no-such-topic"]},
                     user="mallory")
    assert [t["error"] for t in answer["topics"]] == [
        {"code": TOPIC_REFUSED, "message": "not authorized to describe topic 'public'"},
        {"code": TOPIC_REFUSED, "message": "not authorized to describe topic 'no-such-topic'"}]


def values_of(consumer: Consumer, count: int, timeout_s: float = 30) -> list[bytes]:
    """The values of the next ``count`` records (a subscribed consumer's
    polls return early while its group assigns partitions)."""
    values: list[bytes] = []
    deadline = time.monotonic() + timeout_s
    while len(values) < count:
        assert time.monotonic() < deadline, f"{len(values)} of {count} records in {timeout_s} s"
        values += [r.value for r in consumer.poll(timeout_ms=500)]
    return values


def test_producers_and_consumers_work_as_far_as_their_acls_go(cluster):
    grant(cluster, [
        AclBinding(acl.TOPIC, "orders.", acl.PREFIXED, "User:bob", "*", acl.WRITE, acl.ALLOW),
        AclBinding(acl.TOPIC, "orders.", acl.PREFIXED, "User:bob", "*", acl.READ, acl.ALLOW),
        AclBinding(acl.GROUP, "bob-readers", acl.LITERAL, "User:bob", "*", acl.READ, acl.ALLOW)])
    bob = as_user(cluster, "bob")
    with Producer(bootstrap(cluster), **bob) as producer:  # idempotent: WRITE on some topic
        producer.send("orders.eu", b"hello").result(30)
        error = refused(lambda: producer.send("other", b"nope").result(30))
        assert isinstance(error, TopicAuthorizationFailedError), error
    with Consumer(bootstrap(cluster), group_id="bob-readers", auto_offset_reset="earliest",
                  **bob) as consumer:
        consumer.subscribe(["orders.eu"])
        assert values_of(consumer, 1) == [b"hello"]
    with Consumer(bootstrap(cluster), group_id="other-readers", auto_offset_reset="earliest",
                  **bob) as consumer:
        consumer.subscribe(["orders.eu"])
        error = refused(lambda: consumer.poll(timeout_ms=5000))
        assert error.code == GROUP_REFUSED, error
    with Producer(bootstrap(cluster), transactional_id="bob-txn", **bob) as producer:
        error = refused(producer.init_transactions)
        assert error.code == TXN_REFUSED, error


def test_a_deny_wins_over_an_allow_to_everyone(cluster):
    grant(cluster, [
        AclBinding(acl.TOPIC, "public", acl.LITERAL, "User:*", "*", acl.READ, acl.ALLOW),
        AclBinding(acl.TOPIC, "public", acl.LITERAL, MALLORY, "*", acl.READ, acl.DENY)])
    parts = [TopicPartition("public", 0)]
    with Consumer(bootstrap(cluster), auto_offset_reset="earliest", consumer_timeout_ms=5000,
                  **as_user(cluster, "bob")) as consumer:
        consumer.assign(parts)
        assert len(list(consumer)) == 10
    with Consumer(bootstrap(cluster), auto_offset_reset="earliest", consumer_timeout_ms=5000,
                  **as_user(cluster, "mallory")) as consumer:
        consumer.assign(parts)
        error = refused(lambda: list(consumer))
        assert error.code == TOPIC_REFUSED, error


def test_the_cli_adds_lists_and_removes_acls(cluster):
    client = cluster.client_security

    def kraftlog(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "api.cli", "--bootstrap", bootstrap(cluster),
             "--security-protocol", "SSL", "--ssl-cafile", client["ssl_cafile"],
             "--ssl-certfile", client["ssl_certfile"], "--ssl-keyfile", client["ssl_keyfile"],
             *args], cwd=REPO_ROOT, capture_output=True, text=True, timeout=60,
            env={k: v for k, v in os.environ.items() if not k.startswith("KRAFTLOG_")})
    done = kraftlog("acls", "add", "--allow-principal", "User:carol", "--consumer",
                    "--topic", "sales", "--group", "reports")
    assert done.returncode == 0, done.stderr
    assert "3 ACLs in place" in done.stdout
    listed = kraftlog("acls", "list", "--topic", "sales")
    assert listed.returncode == 0, listed.stderr
    assert listed.stdout.count("User:carol") == 2 and "READ" in listed.stdout
    done = kraftlog("acls", "remove", "--allow-principal", "User:carol", "--topic", "sales")
    assert done.returncode == 1 and "--force" in done.stderr  # not a terminal: asks for it
    done = kraftlog("acls", "remove", "--allow-principal", "User:carol", "--topic", "sales",
                    "--group", "reports", "--force")
    assert done.returncode == 0, done.stderr
    assert "removed 3 ACLs" in done.stdout
    with Admin(bootstrap(cluster), **client) as admin:
        assert admin.describe_acls(AclBindingFilter(principal="User:carol")) == []
    bad = kraftlog("acls", "add", "--allow-principal", "carol", "--topic", "sales")
    assert bad.returncode == 1 and "User:<name>" in bad.stderr


def test_what_the_acls_hide_stays_hidden_in_groups_and_internal_topics(cluster):
    """A group's description leaves out the topics the caller may not see;
    a regex subscription needs DESCRIBE on the cluster; and no one, not even
    a super user, writes to an internal topic."""
    grant(cluster, [b._replace(principal="User:dave") for b in ALICE_GRANTS[:2]])
    # dave: ALL on acl-* topics and groups, nothing on the cluster
    tps = {TopicPartition("acl-orders", 0), TopicPartition("acl-orders", 1),
           TopicPartition("hidden-ledger", 0)}
    with Consumer(bootstrap(cluster), group_id="acl-mixed", auto_offset_reset="earliest",
                  **cluster.client_security) as consumer:
        consumer.subscribe(["acl-orders", "hidden-ledger"])
        deadline = time.monotonic() + 30
        while consumer.assignment() != tps:
            assert time.monotonic() < deadline, "the member got no assignment"
            consumer.poll(timeout_ms=200)
        consumer.commit({TopicPartition("hidden-ledger", 0): 1,
                         TopicPartition("acl-orders", 0): 1})
        for broker in cluster.broker_ids:
            status, described = call(cluster, "GET", "/v1/groups/acl-mixed", None,
                                     user="dave", as_json=True, broker=broker)
            assert status == 200 and described["members"], described
            assert "acl-orders" in json.dumps(described)
            assert "hidden-ledger" not in json.dumps(described), described
    with Consumer(bootstrap(cluster), group_id="acl-regex", **as_user(cluster, "dave")) \
            as consumer:
        consumer.subscribe(pattern="acl-.*")
        error = refused(lambda: consumer.poll(timeout_ms=5000))
        assert error.code == CLUSTER_REFUSED and "regex" in error.message, error
    status, answer = call(cluster, "POST", "/v1/produce", {
        "acks": 1, "partitions": [{"topic": "__consumer_offsets", "partition": 0,
                                   "records": batch()}]},
        certificate=cluster.certs["client"], user=None)
    assert status == 200 and answer["partitions"][0]["error"]["code"] == \
        "INVALID_TOPIC_EXCEPTION", answer


# -- delegation tokens ---------------------------------------------------------------------
def test_a_delegation_token_is_its_owner_until_it_expires(cluster, tmp_path):
    """A user makes a token; a job with only the token is that user (its
    ACLs and nothing more); tokens cannot make tokens; the owner or a
    renewer renews it; expired, it is refused at once."""
    from api.client import DelegationToken, SaslAuthenticationError
    grant(cluster, [AclBinding(acl.TOPIC, "token-", acl.PREFIXED, "User:erin", "*", acl.ALL,
                               acl.ALLOW)])
    with Admin(bootstrap(cluster), **cluster.client_security) as admin:
        admin.upsert_user("erin", PASSWORD)
        admin.create_topics([NewTopic("token-jobs", 1, 2)])
    wait_for_login(cluster, "erin")
    with Admin(bootstrap(cluster), **as_user(cluster, "erin")) as admin:
        token = admin.create_delegation_token(["User:bob"])
        assert token.owner == "User:erin" and token.renewers == ("User:bob",)
        assert token.issue_timestamp_ms < token.expiration_timestamp_ms <= \
            token.max_timestamp_ms
        assert [t.token_id for t in admin.describe_delegation_token()] == [token.token_id]
    with Admin(bootstrap(cluster), **as_user(cluster, "mallory")) as admin:
        # not mallory's (who has one of her own, from the route matrix)
        assert token.token_id not in {t.token_id for t in admin.describe_delegation_token()}
        error = refused(lambda: admin.renew_delegation_token(token))
        assert error.code == "DELEGATION_TOKEN_OWNER_MISMATCH", error

    job = {"security_protocol": "SASL_SSL", "ssl_cafile": cluster.certs["ca"].certfile,
           "sasl_mechanism": "OAUTHBEARER", "sasl_oauth_token_provider": token.value}

    wait_until(lambda: all(_bearer_status(cluster, b, token.value) == 200
                           for b in cluster.broker_ids), 30, "the token known everywhere")
    with Producer(bootstrap(cluster), **job) as producer:
        producer.send("token-jobs", b"from a job").result(30)
        error = refused(lambda: producer.send("acl-orders", b"no").result(30))
        assert error.code == TOPIC_REFUSED  # erin's ACLs, no more
    with Admin(bootstrap(cluster), **job) as admin:
        visible = admin.list_topics()
        assert "token-jobs" in visible and "acl-orders" not in visible
        error = refused(lambda: admin.create_delegation_token())
        assert error.code == "DELEGATION_TOKEN_REQUEST_NOT_ALLOWED", error

    forged = DelegationToken(token.token_id, "A" * len(token.hmac), *token[2:])
    for bad in (forged.value, "no-dot-here", token.token_id + ".x"):
        assert _bearer_status(cluster, cluster.broker_ids[0], bad) == 401
    with Admin(bootstrap(cluster), **as_user(cluster, "bob")) as admin:  # a renewer
        assert admin.renew_delegation_token(token) >= token.expiration_timestamp_ms
    with Admin(bootstrap(cluster), **as_user(cluster, "erin")) as admin:
        admin.expire_delegation_token(token)
    wait_until(lambda: all(_bearer_status(cluster, b, token.value) == 401
                           for b in cluster.broker_ids), 30, "the token refused everywhere")
    with Admin(bootstrap(cluster), **job) as admin:
        error = refused(admin.list_topics)
        assert isinstance(error, SaslAuthenticationError), error
    token_file = tmp_path / "job.token"
    client = cluster.client_security
    made = subprocess.run(
        [sys.executable, "-m", "api.cli", "--bootstrap", bootstrap(cluster),
         "--security-protocol", "SASL_SSL", "--ssl-cafile", client["ssl_cafile"],
         "--sasl-username", "erin", "tokens", "create"], cwd=REPO_ROOT, capture_output=True,
        text=True, timeout=60, env={**{k: v for k, v in os.environ.items()
                                       if not k.startswith("KRAFTLOG_")},
                                    "KRAFTLOG_SASL_PASSWORD": PASSWORD})
    assert made.returncode == 0, made.stderr
    token_file.write_text(made.stdout)
    listed = subprocess.run(
        [sys.executable, "-m", "api.cli", "--bootstrap",
         cluster.nodes[cluster.broker_ids[0]].broker_url,
         "--security-protocol", "SASL_SSL", "--ssl-cafile", client["ssl_cafile"],
         "--sasl-token-file", str(token_file), "topics", "list"], cwd=REPO_ROOT,
        capture_output=True, text=True, timeout=60,
        env={k: v for k, v in os.environ.items() if not k.startswith("KRAFTLOG_")})
    assert listed.returncode == 0 and "token-jobs" in listed.stdout, listed.stderr


def _bearer_status(cluster: ProcessCluster, broker: int, value: str) -> int:
    context = ssl.create_default_context(cafile=cluster.certs["ca"].certfile)
    request = urllib.request.Request(cluster.nodes[broker].broker_url + "/v1/topics",
                                     headers={"Authorization": f"Bearer {value}",
                                              "Accept": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=10, context=context) as answer:
            return answer.status
    except urllib.error.HTTPError as exc:
        return exc.code


def test_a_fetch_stream_stops_serving_once_its_cluster_action_acl_is_removed(cluster):
    """A follower's fetch stream is checked at each fetch, as POST /v1/fetch
    is: an ACL removed while the stream is open refuses its next fetch."""
    import asyncio

    import aiohttp

    with Admin(bootstrap(cluster), **cluster.client_security) as admin:
        admin.upsert_user("erin", PASSWORD)
    wait_for_login(cluster, "erin")
    cluster_action = AclBinding(acl.CLUSTER, acl.CLUSTER_NAME, acl.LITERAL, "User:erin", "*",
                                acl.CLUSTER_ACTION, acl.ALLOW)
    grant(cluster, [cluster_action])
    broker = cluster.broker_ids[0]
    fetch = {"replica_id": cluster.broker_ids[1], "max_wait_ms": 0,
             "partitions": [{"topic": "acl-orders", "partition": 0, "offset": 0}]}

    def revoke() -> None:
        with Admin(bootstrap(cluster), **cluster.client_security) as admin:
            admin.delete_acls([AclBindingFilter(principal="User:erin")])

        def gone() -> bool:
            with Admin(cluster.nodes[broker].broker_url, **cluster.client_security) as admin:
                return cluster_action not in admin.describe_acls()
        wait_until(gone, 30, "erin's ACL gone from the broker")

    async def talk() -> list[dict]:
        answers = []
        async with aiohttp.ClientSession() as session:
            stream = await user_stream(session, cluster, broker, "erin", "/v1/replica/fetch-stream")
            for request_id in (1, 2):
                if request_id == 2:
                    await asyncio.get_running_loop().run_in_executor(None, revoke)
                await stream.send_bytes(msgpack.packb({"id": request_id, "fetch": fetch}))
                message = await stream.receive(timeout=15)
                answers.append(msgpack.unpackb(message.data, raw=False)["answer"])
            await stream.close()
        return answers

    served, refused_after = asyncio.run(talk())
    assert "error" not in served and len(served["partitions"]) == 1, served
    assert refused_after["error"]["code"] == "CLUSTER_AUTHORIZATION_FAILED", refused_after


def test_a_clients_stream_checks_write_at_each_produce(cluster):
    """A client's stream (GET /v1/stream) is opened by any user; each
    produce on it is checked as POST /v1/produce is: refused per partition
    without WRITE, served with it, refused again once it is removed."""
    import asyncio

    import aiohttp

    with Admin(bootstrap(cluster), **cluster.client_security) as admin:
        admin.upsert_user("grace", PASSWORD)
    wait_for_login(cluster, "grace")
    write = AclBinding(acl.TOPIC, "acl-orders", acl.LITERAL, "User:grace", "*", acl.WRITE,
                       acl.ALLOW)
    with Admin(bootstrap(cluster), **cluster.client_security) as admin:
        broker = admin.describe_topics(["acl-orders"])["acl-orders"].partitions[0].leader

    def in_broker(present: bool) -> None:
        def seen() -> bool:
            with Admin(cluster.nodes[broker].broker_url, **cluster.client_security) as admin:
                return (write in admin.describe_acls()) == present
        wait_until(seen, 30, f"grace's ACL {'on' if present else 'gone from'} the broker")

    def allow() -> None:
        grant(cluster, [write])
        in_broker(True)

    def revoke() -> None:
        with Admin(bootstrap(cluster), **cluster.client_security) as admin:
            admin.delete_acls([AclBindingFilter(principal="User:grace")])
        in_broker(False)

    async def talk() -> list[tuple[int, dict]]:
        answers = []
        async with aiohttp.ClientSession() as session:
            stream = await user_stream(session, cluster, broker, "grace", "/v1/stream")
            for request_id, before in ((1, None), (2, allow), (3, revoke)):
                if before is not None:
                    await asyncio.get_running_loop().run_in_executor(None, before)
                await stream.send_bytes(msgpack.packb(
                    {"id": request_id, "path": "/v1/produce", "body": PRODUCE},
                    use_bin_type=True))
                message = await stream.receive(timeout=15)
                tagged = msgpack.unpackb(message.data, raw=False)
                assert tagged["id"] == request_id, tagged
                answers.append((tagged["status"], tagged["answer"]))
            await stream.close()
        return answers

    codes = [(status, [p["error"] and p["error"]["code"] for p in answer["partitions"]])
             for status, answer in asyncio.run(talk())]
    assert codes == [(200, [TOPIC_REFUSED]), (200, [None]), (200, [TOPIC_REFUSED])], codes


def test_a_consumers_fetch_session_stops_serving_a_topic_once_its_read_acl_is_removed(cluster):
    """A consumer's fetch session answers partitions the fetch does not name
    (their position did not move): each is judged at each fetch, so records
    written after READ was taken away are refused, not served through it."""
    with Admin(bootstrap(cluster), **cluster.client_security) as admin:
        admin.create_topics([NewTopic("acl-revoked", 1, 2)])
        admin.upsert_user("frank", PASSWORD)
    wait_for_login(cluster, "frank")
    read = AclBinding(acl.TOPIC, "acl-revoked", acl.LITERAL, "User:frank", "*", acl.READ,
                      acl.ALLOW)
    grant(cluster, [read])
    with Producer(bootstrap(cluster), **cluster.client_security) as producer:
        producer.send("acl-revoked", b"before").result(30)
    with Consumer(bootstrap(cluster), auto_offset_reset="earliest", fetch_max_wait_ms=100,
                  **as_user(cluster, "frank")) as consumer:
        consumer.assign([TopicPartition("acl-revoked", 0)])
        assert values_of(consumer, 1) == [b"before"]
        assert consumer.poll(timeout_ms=300) == []  # in its session, named no more
        with Admin(bootstrap(cluster), **cluster.client_security) as admin:
            admin.delete_acls([AclBindingFilter(principal="User:frank")])

            def gone() -> bool:
                for broker in cluster.broker_ids:
                    with Admin(cluster.nodes[broker].broker_url,
                               **cluster.client_security) as one:
                        if read in one.describe_acls():
                            return False
                return True
            wait_until(gone, 30, "frank's ACL gone from every broker")
        with Producer(bootstrap(cluster), **cluster.client_security) as producer:
            producer.send("acl-revoked", b"after").result(30)
        deadline = time.monotonic() + 15
        with pytest.raises(KraftlogError) as caught:
            while time.monotonic() < deadline:
                assert [r.value for r in consumer.poll(timeout_ms=300)] == []
        assert caught.value.code == TOPIC_REFUSED, caught.value


def test_a_partition_refused_at_its_first_fetch_is_served_once_read_is_granted(cluster):
    """A partition refused when first named never joined the broker's fetch
    session: once READ is granted and the application seeks, the consumer
    names it again and reads it."""
    with Admin(bootstrap(cluster), **cluster.client_security) as admin:
        admin.create_topics([NewTopic("acl-late", 1, 2)])
        admin.upsert_user("gina", PASSWORD)
    wait_for_login(cluster, "gina")
    grant(cluster, [AclBinding(acl.TOPIC, "acl-late", acl.LITERAL, "User:gina", "*",
                               acl.DESCRIBE, acl.ALLOW)])
    with Producer(bootstrap(cluster), **cluster.client_security) as producer:
        producer.send("acl-late", b"x").result(30)
    tp = TopicPartition("acl-late", 0)
    with Consumer(bootstrap(cluster), auto_offset_reset="earliest", fetch_max_wait_ms=100,
                  **as_user(cluster, "gina")) as consumer:
        consumer.assign([tp])
        deadline = time.monotonic() + 15
        with pytest.raises(KraftlogError) as caught:
            while time.monotonic() < deadline:
                consumer.poll(timeout_ms=300)
        assert caught.value.code == TOPIC_REFUSED, caught.value
        grant(cluster, [AclBinding(acl.TOPIC, "acl-late", acl.LITERAL, "User:gina", "*",
                                   acl.READ, acl.ALLOW)])
        consumer.seek(tp, 0)
        assert values_of(consumer, 1, timeout_s=15) == [b"x"]


def test_a_clients_stream_stops_serving_once_its_user_is_deleted(cluster):
    """A stream is opened with a password, and each request on it is
    authenticated again, as each POST is: once the user is deleted the next
    request is answered 401 SASL_AUTHENTICATION_FAILED and the stream is
    closed (1008)."""
    import asyncio

    import aiohttp

    with Admin(bootstrap(cluster), **cluster.client_security) as admin:
        admin.upsert_user("heidi", PASSWORD)
    wait_for_login(cluster, "heidi")
    broker = cluster.broker_ids[0]
    fetch = {"max_wait_ms": 0, "partitions": [{"topic": "acl-orders", "partition": 0,
                                               "offset": 0}]}

    def delete() -> None:
        with Admin(bootstrap(cluster), **cluster.client_security) as admin:
            admin.delete_user("heidi")

        def refused() -> bool:
            return call(cluster, "GET", "/healthz", None, user="heidi", broker=broker)[0] == 401
        wait_until(refused, 30, "heidi refused by the broker")

    async def talk() -> tuple[list, int | None]:
        answers = []
        async with aiohttp.ClientSession() as session:
            stream = await user_stream(session, cluster, broker, "heidi", "/v1/stream")
            for request_id in (1, 2):
                if request_id == 2:
                    await asyncio.get_running_loop().run_in_executor(None, delete)
                await stream.send_bytes(msgpack.packb(
                    {"id": request_id, "path": "/v1/fetch", "body": fetch}, use_bin_type=True))
                tagged = msgpack.unpackb((await stream.receive(timeout=15)).data, raw=False)
                answers.append((tagged["status"], tagged["answer"]))
            closing = await stream.receive(timeout=15)
            assert closing.type is aiohttp.WSMsgType.CLOSE, closing
            return answers, closing.data  # the code the broker closed with

    (first, second), close_code = asyncio.run(talk())
    assert first[0] == 200 and "error" not in first[1], first
    assert second[0] == 401 and second[1]["error"]["code"] == "SASL_AUTHENTICATION_FAILED"
    assert close_code == 1008
