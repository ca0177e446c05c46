"""The client's metadata cache (pure: answers and leadership errors in,
leader URLs out) and its HTTP transport against a real aiohttp server on
loopback: error bodies, refused connections and deadlines all arrive as
KraftlogErrors with the right codes."""

import asyncio

import msgpack
import pytest
from aiohttp import web

from api.client._transport import ClusterMetadata, Transport, bootstrap_urls
from api.client.errors import KraftlogError, NotLeaderError

A, B = "http://127.0.0.1:9001", "http://127.0.0.1:9002"


def answer(*topics, brokers=((1, A), (2, B))):
    return {"cluster_id": "c", "controller_id": 1,
            "brokers": [{"id": i, "url": url, "rack": None} for i, url in brokers],
            "topics": list(topics)}


def topic(name, leaders, epoch=0):
    return {"name": name, "topic_id": "id-" + name, "error": None,
            "partitions": [{"partition": p, "leader": leader, "leader_epoch": epoch,
                            "replicas": [leader], "isr": [leader]}
                           for p, leader in enumerate(leaders)]}


def unknown(name):
    return {"name": name, "topic_id": None, "partitions": [],
            "error": {"code": "UNKNOWN_TOPIC_OR_PARTITION", "message": "no such topic"}}


def metadata(**kwargs):
    return ClusterMetadata(Transport(), "http://127.0.0.1:9001", **kwargs)


def test_bootstrap_urls_accept_strings_lists_and_bare_host_ports():
    assert bootstrap_urls("http://a:1/, b:2") == ["http://a:1", "http://b:2"]
    assert bootstrap_urls(["http://a:1", "http://a:1"]) == ["http://a:1"]
    with pytest.raises(ValueError):
        bootstrap_urls(" , ")


def test_an_answer_gives_leader_urls_and_partition_counts():
    md = metadata()
    md.apply(answer(topic("t", [1, 2, -1])), now_ms=1000)
    assert md.partition_counts == {"t": 3}
    assert md.leader_url(("t", 0)) == A
    assert md.leader_url(("t", 1)) == B
    assert md.leader_url(("t", 2)) is None  # no leader yet
    assert md.leader_url(("t", 9)) is None and md.leader_url(("other", 0)) is None
    assert md.partitions("t") == {0, 1, 2}


def test_a_leader_on_a_fenced_broker_has_no_url():
    md = metadata()
    md.apply(answer(topic("t", [2]), brokers=[(1, A)]), now_ms=0)
    assert md.leader("t", 0).leader_id == 2
    assert md.leader_url(("t", 0)) is None


def test_unknown_topics_keep_their_error_and_lose_their_partitions():
    md = metadata()
    md.apply(answer(topic("t", [1])), now_ms=0)
    md.apply(answer(unknown("t")), now_ms=1)
    assert "t" not in md.partition_counts
    assert md.topic_errors["t"].code == "UNKNOWN_TOPIC_OR_PARTITION"
    assert md.leader_url(("t", 0)) is None
    md.apply(answer(topic("t", [2])), now_ms=2)
    assert "t" not in md.topic_errors and md.leader_url(("t", 0)) == B


def test_partial_answers_keep_other_topics_and_full_ones_drop_deleted_topics():
    md = metadata()
    md.apply(answer(topic("a", [1]), topic("b", [2])), now_ms=0)
    md.apply(answer(topic("a", [2])), now_ms=1)
    assert md.leader_url(("b", 0)) == B and md.leader_url(("a", 0)) == B
    md.apply(answer(topic("a", [1])), now_ms=2, all_topics=True)
    assert "b" not in md.partition_counts and md.leader_url(("b", 0)) is None


def test_refresh_is_due_when_asked_for_or_older_than_max_age():
    md = metadata(metadata_max_age_ms=1000)
    assert md.needs_update(0)  # never refreshed
    md.apply(answer(), now_ms=5000)
    assert not md.needs_update(5999)
    assert md.needs_update(6000)
    md.apply(answer(), now_ms=6000)
    md.request_update()
    assert md.needs_update(6001)
    # An answer about a new topic alone leaves the refresh of all due.
    md.apply(answer(topic("new", [1])), now_ms=6002, partial=True)
    assert md.needs_update(6003) and md.leader_url(("new", 0)) == A


def test_a_not_leader_hint_moves_the_leader_at_once():
    md = metadata()
    md.apply(answer(topic("t", [1], epoch=4)), now_ms=0)
    md.learn_leader("t", 0, NotLeaderError("not me", leader_id=2, leader_epoch=5,
                                           leader_url=B + "/"))
    assert md.leader_url(("t", 0)) == B
    assert md.leader("t", 0) == (2, 5, B)
    assert md.needs_update(1)  # and a refresh confirms it


def test_a_hint_older_than_what_is_known_is_ignored():
    md = metadata()
    md.apply(answer(topic("t", [1], epoch=7)), now_ms=0)
    md.learn_leader("t", 0, NotLeaderError("", leader_id=2, leader_epoch=6, leader_url=B))
    assert md.leader_url(("t", 0)) == A


def test_a_leadership_error_without_hint_forgets_the_leader_until_refresh():
    md = metadata()
    md.apply(answer(topic("t", [1, 1])), now_ms=0)
    md.learn_leader("t", 0, NotLeaderError("no idea"))
    assert md.leader_url(("t", 0)) is None
    assert md.leader_url(("t", 1)) == A
    md.forget_broker_url(A)
    assert md.leader_url(("t", 1)) is None
    md.apply(answer(topic("t", [2, 2])), now_ms=1)
    assert md.leader_url(("t", 0)) == md.leader_url(("t", 1)) == B


# -- the transport against a real HTTP server ---------------------------------------
@pytest.fixture
async def server():
    """A broker stand-in: /ok echoes, /error answers a protocol error,
    /slow never answers in time, /html answers a non-protocol 502."""
    async def ok(request):
        body = msgpack.unpackb(await request.read())
        assert request.headers["Content-Type"] == "application/msgpack"
        assert "application/msgpack" in request.headers["Accept"]
        return web.Response(body=msgpack.packb({"echo": body, "bin": b"\x00\x01"}),
                            content_type="application/msgpack")

    async def error(request):
        return web.Response(body=msgpack.packb({"error": {
            "code": "NOT_LEADER_OR_FOLLOWER", "message": "ask 2", "leader_id": 2,
            "leader_url": B}}), status=421, content_type="application/msgpack")

    release = asyncio.Event()

    async def slow(request):
        await release.wait()
        return web.Response(text="late")

    async def html(request):
        return web.Response(text="<html>bad gateway</html>", status=502,
                            content_type="text/html")

    app = web.Application()
    app.router.add_post("/ok", ok)
    app.router.add_post("/error", error)
    app.router.add_post("/slow", slow)
    app.router.add_post("/html", html)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    yield f"http://127.0.0.1:{port}"
    release.set()
    await runner.cleanup()


async def test_msgpack_goes_both_ways_with_bytes_intact(server):
    transport = Transport()
    try:
        assert await transport.request(server, "/ok", {"a": [1, b"x"]}) == {
            "echo": {"a": [1, b"x"]}, "bin": b"\x00\x01"}
    finally:
        await transport.close()


async def test_error_bodies_raise_their_code_with_hints(server):
    transport = Transport()
    try:
        with pytest.raises(NotLeaderError) as caught:
            await transport.request(server, "/error", {})
        assert caught.value.leader_url == B and caught.value.retriable
        with pytest.raises(KraftlogError) as caught:
            await transport.request(server, "/html", {})
        assert caught.value.code == "BROKER_NOT_AVAILABLE" and "502" in caught.value.message
    finally:
        await transport.close()


async def test_deadlines_and_refused_connections_are_retriable_errors(server):
    transport = Transport()
    try:
        with pytest.raises(KraftlogError) as caught:
            await transport.request(server, "/slow", {}, timeout_ms=100)
        assert caught.value.code == "REQUEST_TIMED_OUT" and caught.value.retriable
        with pytest.raises(KraftlogError) as caught:
            await transport.request("http://127.0.0.1:1", "/ok", {})
        assert caught.value.code == "BROKER_NOT_AVAILABLE" and caught.value.retriable
    finally:
        await transport.close()


async def test_a_closed_transport_refuses_requests(server):
    transport = Transport()
    await transport.close()
    with pytest.raises(KraftlogError) as caught:
        await transport.request(server, "/ok", {})
    assert caught.value.code == "CLIENT_CLOSED"


async def test_metadata_refresh_skips_unreachable_bootstrap_urls(server):
    async def metadata_handler(request):
        asked = msgpack.unpackb(await request.read())["topics"]
        return web.Response(body=msgpack.packb(answer(*[topic(t, [1]) for t in asked])),
                            content_type="application/msgpack")

    app = web.Application()
    app.router.add_post("/v1/metadata", metadata_handler)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"
    transport = Transport()
    md = ClusterMetadata(transport, ["http://127.0.0.1:1", url])
    try:
        await md.refresh(["t"])
        await md.refresh(["u"])  # remembers "t": asks for both
        assert md.partition_counts == {"t": 1, "u": 1}
    finally:
        await transport.close()
        await runner.cleanup()
