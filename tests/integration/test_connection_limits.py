"""Kafka's connection limits on a real node, from real sockets on distinct
loopback addresses (127.0.0.x): ``max.connections.per.ip`` (and its
overrides) and ``max.connections``, counted over the HTTP and the Kafka
listener together, and ``connections.max.idle.ms`` for a connection that
never sends a request. A refused connection is closed on arrival; the node
goes on serving everyone else."""

from __future__ import annotations

import contextlib
import socket
import urllib.request

import pytest

from chaos.cluster import FAST_SETTINGS, ProcessCluster, wait_until

IDLE_MS = 4000
#: How long a refused connection may take to be closed: well under IDLE_MS,
#: so a close seen within it is the limit's, not the idle rule's.
REFUSED_WITHIN_S = 1.5
MAX_CONNECTIONS = 6
LIMITED_IP = "127.0.0.2"  # max.connections.per.ip.overrides gives it 2


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    settings = {**FAST_SETTINGS, "connections.max.idle.ms": IDLE_MS,
                "max.connections": MAX_CONNECTIONS,
                "max.connections.per.ip.overrides": f"{LIMITED_IP}:2"}
    with ProcessCluster(str(tmp_path_factory.mktemp("connections")), controllers=1, brokers=0,
                        combined=True, settings=settings, kafka=True) as cluster:
        cluster.start()
        cluster.wait_for_brokers_running(timeout_s=20)
        yield cluster.nodes[cluster.broker_ids[0]]


def connect(port: int, source: str) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.settimeout(5)
    sock.bind((source, 0))
    sock.connect(("127.0.0.1", port))
    return sock


def serves(sock: socket.socket) -> bool:
    """A keep-alive GET /healthz on ``sock`` is answered."""
    try:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        return sock.recv(4096).startswith(b"HTTP/1.1 200")
    except OSError:
        return False


def closed_by_peer(sock: socket.socket, within_s: float = REFUSED_WITHIN_S) -> bool:
    """The node closed ``sock`` within ``within_s`` (end of stream or a reset)."""
    sock.settimeout(within_s)
    try:
        return sock.recv(4096) == b""
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


def metric(node, name: str) -> float:
    with urllib.request.urlopen(node.broker_url + "/metrics", timeout=5) as response:
        text = response.read().decode()
    (value,) = [line.split()[-1] for line in text.splitlines() if line.startswith(name + " ")]
    return float(value)


def settle(node) -> None:
    """Until the node holds no connection but the one asking."""
    wait_until(lambda: metric(node, "kraftlog_connections") <= 1, 10, "connections released")


def test_an_address_over_its_limit_is_refused_on_both_listeners_and_others_are_served(node):
    settle(node)
    refused_before = metric(node, "kraftlog_connections_refused_total")
    with contextlib.ExitStack() as held:
        first, second = (held.enter_context(connect(node.broker_port, LIMITED_IP))
                         for _ in range(2))
        assert serves(first) and serves(second)
        third = held.enter_context(connect(node.broker_port, LIMITED_IP))
        assert closed_by_peer(third)
        # Counted over the listeners: the Kafka listener refuses it too.
        kafka = held.enter_context(connect(node.kafka_port, LIMITED_IP))
        assert closed_by_peer(kafka)
        other = held.enter_context(connect(node.broker_port, "127.0.0.3"))
        assert serves(other)  # another address is not held back
        assert metric(node, "kraftlog_connections_refused_total") == refused_before + 2
        first.close()

        def reconnect():
            sock = held.enter_context(connect(node.broker_port, LIMITED_IP))
            return serves(sock)

        wait_until(reconnect, 10, "a connection from the address once one closed")


def test_the_broker_wide_limit_refuses_the_next_connection_from_anywhere(node):
    settle(node)
    refused_before = metric(node, "kraftlog_connections_refused_total")
    with contextlib.ExitStack() as held:
        socks = [held.enter_context(connect(node.broker_port, f"127.0.0.{10 + i}"))
                 for i in range(MAX_CONNECTIONS)]
        assert all(serves(sock) for sock in socks)
        extra = held.enter_context(connect(node.broker_port, "127.0.0.40"))
        assert closed_by_peer(extra)
    settle(node)  # all released: the node serves again
    assert metric(node, "kraftlog_connections_refused_total") == refused_before + 1


def test_a_connection_that_never_sends_a_request_is_closed_after_the_idle_time(node):
    settle(node)
    before = metric(node, "kraftlog_connections_idle_closed_total")
    silent = connect(node.broker_port, "127.0.0.5")
    wait_until(lambda: closed_by_peer(silent, 0.5), 10 + IDLE_MS / 1000,
               "the silent connection closed")
    silent.close()
    assert metric(node, "kraftlog_connections_idle_closed_total") == before + 1


def test_a_clients_stream_with_no_request_for_the_idle_time_is_closed(node):
    """A client's stream (GET /v1/stream) is one long request, so the idle
    rule for connections between requests never sees it: the broker closes
    it itself (1000) once no request came on it for connections.max.idle.ms.
    Pings do not count; a long-polling fetch in flight keeps it open."""
    import asyncio
    import time

    import aiohttp
    import msgpack

    from api.client import Admin, NewTopic

    with Admin(node.broker_url) as admin:
        admin.create_topics([NewTopic("idle-poll", 1, 1)])
    settle(node)
    url = node.broker_url
    poll_ms = IDLE_MS + 2000

    async def talk() -> tuple:
        async with aiohttp.ClientSession() as session:
            # The client's own pings every second: not requests.
            quiet = await session.ws_connect(url + "/v1/stream", heartbeat=1.0)
            busy = await session.ws_connect(url + "/v1/stream")
            started = time.monotonic()
            await busy.send_bytes(msgpack.packb({"id": 1, "path": "/v1/fetch", "body": {
                "max_wait_ms": poll_ms, "partitions": [{"topic": "idle-poll", "partition": 0,
                                                        "offset": 0}]}}))
            closing = await quiet.receive(timeout=IDLE_MS / 1000 + 10)
            quiet_after = time.monotonic() - started
            answer = await busy.receive(timeout=poll_ms / 1000 + 10)
            busy_answered = time.monotonic() - started
            busy_closing = await busy.receive(timeout=IDLE_MS / 1000 + 10)
            # (the codes the broker sent)
            return (closing.type, closing.data, quiet_after, answer, busy_answered,
                    busy_closing.type, busy_closing.data)

    kind, code, quiet_s, answer, answered_s, busy_kind, busy_code = asyncio.run(talk())
    assert kind is aiohttp.WSMsgType.CLOSE and code == 1000, (kind, code)
    assert quiet_s >= IDLE_MS / 1000 - 0.5, quiet_s  # not before its idle time
    # The long poll outlived the idle time on an open stream, and was answered.
    assert answer.type is aiohttp.WSMsgType.BINARY, answer
    tagged = msgpack.unpackb(answer.data, raw=False)
    assert tagged["id"] == 1 and tagged["status"] == 200, tagged
    assert answered_s >= poll_ms / 1000 - 0.5, answered_s
    assert busy_kind is aiohttp.WSMsgType.CLOSE and busy_code == 1000
