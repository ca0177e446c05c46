"""Senders that stall or leave in the middle of a request, against a real
node: a stalled body is given up after connections.max.idle.ms, a client
that disconnects mid-body is normal traffic (no error logged), and the node
goes on serving."""

from __future__ import annotations

import json
import socket
import time
import urllib.parse
import urllib.request

import pytest

from chaos.cluster import FAST_SETTINGS, ProcessCluster

IDLE_MS = 1000


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    settings = {**FAST_SETTINGS, "connections.max.idle.ms": IDLE_MS}
    with ProcessCluster(str(tmp_path_factory.mktemp("limits")), controllers=1, brokers=0,
                        combined=True, settings=settings) as cluster:
        cluster.start()
        cluster.wait_for_brokers_running(timeout_s=20)
        yield cluster


def partial_request(url: str, declared: int, sent: bytes) -> socket.socket:
    """A POST /v1/produce whose body declares ``declared`` bytes but sends
    only ``sent`` so far."""
    where = urllib.parse.urlparse(url)
    conn = socket.create_connection((where.hostname, where.port), timeout=10)
    conn.sendall(f"POST /v1/produce HTTP/1.1\r\nHost: {where.netloc}\r\n"
                 f"Content-Type: application/json\r\nContent-Length: {declared}\r\n\r\n"
                 .encode() + sent)
    return conn


def healthy(url: str) -> bool:
    with urllib.request.urlopen(url + "/healthz", timeout=5) as answer:
        return answer.status == 200


def test_a_stalled_body_is_given_up_after_the_idle_limit(node):
    url = node.nodes[1].broker_url
    started = time.monotonic()
    with partial_request(url, 1000, b'{"acks": 1, ') as conn:
        head = conn.recv(65536).decode(errors="replace")
    waited = time.monotonic() - started
    status, _, rest = head.partition("\r\n")
    body = json.loads(rest.split("\r\n\r\n", 1)[1])
    assert " 503 " in status and body["error"]["code"] == "REQUEST_TIMED_OUT", head
    assert "connections.max.idle.ms" in body["error"]["message"]
    assert IDLE_MS / 1000 * 0.9 <= waited < 10, waited
    assert healthy(url)


def test_a_client_leaving_mid_body_is_normal_traffic(node):
    url = node.nodes[1].broker_url
    for _ in range(3):
        partial_request(url, 5000, b'{"acks": 1, "partitions": [').close()
    # Served after the three were dropped: the node has handled them by now
    # (one event loop, connections lost before this request arrived).
    assert healthy(url)
    with open(node.nodes[1].log_path, errors="replace") as log:
        text = log.read()
    assert "unexpected error" not in text and "Traceback" not in text, text[-2000:]
