"""The follower's fetch transport (api/broker/fetcher.py) against stand-in
leaders on loopback: fetches to one leader share one WebSocket, each answer
goes to its own fetch, a fetch cancelled or timed out is failed or dropped
and never answered late, a stream that closes fails what it carried, and a
leader without the stream (an older broker) is fetched from by POST. And
the leader's side (``DataApi.handle_replica_stream``, its core stood in
for) against a follower that stops reading.

The broker's own side of the stream is tested against real nodes in
tests/integration/test_broker_api.py; every replication test uses both."""

import asyncio
import base64
import functools
import os
import socket
import struct

import msgpack
import pytest
from aiohttp import WSMsgType, web

from api.broker import fetcher
from api.broker.data_api import DataApi
from api.broker.fetcher import REPLICA_STREAM_PATH, STREAM_FETCHES_MAX, FollowerFetchSender
from api.broker.replication import SendFetch
from protocol import wire


class Replicas:
    """Stands for the ReplicaManager: records what the sender hands back."""

    broker_id = 2
    image = None

    def __init__(self) -> None:
        self.answered: dict[int, dict] = {}
        self.failed: list[int] = []
        self.changed = asyncio.Event()

    def fetch_answered(self, request_id: int, answer: dict) -> None:
        assert request_id not in self.answered and request_id not in self.failed
        self.answered[request_id] = answer
        self.changed.set()

    def fetch_failed(self, request_id: int) -> None:
        assert request_id not in self.answered and request_id not in self.failed
        self.failed.append(request_id)
        self.changed.set()

    async def until(self, done, timeout_s: float = 10.0) -> None:
        async with asyncio.timeout(timeout_s):
            while not done():
                self.changed.clear()
                await self.changed.wait()


class Leader:
    """A stand-in leader: a stream that answers each fetch when told to
    (``release``), echoing its partitions, or (``stream=False``) only
    POST /v1/fetch, as a broker from before the stream."""

    def __init__(self, stream: bool = True) -> None:
        self.held: dict[int, asyncio.Future] = {}
        self.streams_opened = 0
        self.posts = 0
        self.sockets: list[web.WebSocketResponse] = []
        app = web.Application()
        app.router.add_post("/v1/fetch", self.post)
        if stream:
            app.router.add_get(REPLICA_STREAM_PATH, self.stream)
        self.runner = web.AppRunner(app, shutdown_timeout=0.1)
        self.url = ""

    async def start(self) -> None:
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        self.url = "http://127.0.0.1:%d" % site._server.sockets[0].getsockname()[1]

    async def post(self, request: web.Request) -> web.Response:
        self.posts += 1
        body = msgpack.unpackb(await request.read())
        return web.Response(body=msgpack.packb({"partitions": body["partitions"], "by": "post"}))

    async def stream(self, request: web.Request) -> web.WebSocketResponse:
        self.streams_opened += 1
        socket = web.WebSocketResponse()
        await socket.prepare(request)
        self.sockets.append(socket)
        async for message in socket:
            assert message.type is WSMsgType.BINARY
            tagged = msgpack.unpackb(message.data)
            self.held[tagged["id"]] = asyncio.get_running_loop().create_future()
            asyncio.create_task(self._answer(socket, tagged))
        return socket

    async def _answer(self, socket, tagged) -> None:
        await self.held[tagged["id"]]
        await socket.send_bytes(msgpack.packb({"id": tagged["id"], "answer": {
            "partitions": tagged["fetch"]["partitions"], "by": "stream"}}))

    def release(self, request_id: int) -> None:
        self.held[request_id].set_result(None)

    async def until_held(self, *ids: int) -> None:
        async with asyncio.timeout(10):
            while not all(i in self.held for i in ids):
                await asyncio.sleep(0.01)


@pytest.fixture
async def setup(monkeypatch):
    made = []

    async def make(stream: bool = True):
        leader = Leader(stream)
        await leader.start()
        monkeypatch.setattr(fetcher, "broker_url", lambda image, leader_id: leader.url)
        replicas = Replicas()
        sender = FollowerFetchSender(replicas)
        made.append((leader, sender))
        return leader, replicas, sender
    yield make
    for leader, sender in made:
        await sender.stop()
        await leader.runner.cleanup()


def fetch(request_id: int, partition: int = 0, timeout_ms: int = 5000) -> SendFetch:
    return SendFetch(request_id, 1, {"replica_id": 2, "partitions": [
        {"topic": "t", "partition": partition, "offset": 0}]}, timeout_ms)


async def test_fetches_to_one_leader_share_one_stream_and_each_gets_its_answer(setup):
    leader, replicas, sender = await setup()
    for request_id in (1, 2, 3):
        sender.send(fetch(request_id, partition=request_id))
    await leader.until_held(1, 2, 3)
    leader.release(3)
    leader.release(1)
    await replicas.until(lambda: len(replicas.answered) == 2)
    assert sorted(replicas.answered) == [1, 3]
    leader.release(2)
    await replicas.until(lambda: len(replicas.answered) == 3)
    for request_id, answer in replicas.answered.items():
        assert answer == {"by": "stream", "partitions": [
            {"topic": "t", "partition": request_id, "offset": 0}]}
    assert leader.streams_opened == 1 and leader.posts == 0


async def test_a_cancelled_fetch_is_never_answered_and_the_stream_carries_on(setup):
    leader, replicas, sender = await setup()
    sender.send(fetch(1))
    await leader.until_held(1)
    sender.cancel(1)
    leader.release(1)  # the answer arrives after the cancel: dropped
    sender.send(fetch(2))
    await leader.until_held(2)
    leader.release(2)
    await replicas.until(lambda: 2 in replicas.answered)
    assert 1 not in replicas.answered and replicas.failed == []
    assert leader.streams_opened == 1


async def test_a_stream_that_closes_fails_its_fetches_and_the_next_fetch_opens_another(setup):
    leader, replicas, sender = await setup()
    sender.send(fetch(1))
    sender.send(fetch(2))
    await leader.until_held(1, 2)
    await leader.sockets[0].close()
    await replicas.until(lambda: len(replicas.failed) == 2)
    assert sorted(replicas.failed) == [1, 2]
    sender.send(fetch(3))
    await leader.until_held(3)
    leader.release(3)
    await replicas.until(lambda: 3 in replicas.answered)
    assert leader.streams_opened == 2


async def test_a_fetch_past_its_timeout_fails_and_the_stream_is_replaced(setup):
    leader, replicas, sender = await setup()
    sender.send(fetch(1, timeout_ms=200))  # never released: a leader that hangs
    await replicas.until(lambda: replicas.failed == [1])
    sender.send(fetch(2))
    await leader.until_held(2)
    leader.release(2)
    await replicas.until(lambda: 2 in replicas.answered)
    assert leader.streams_opened == 2


async def test_the_cores_cancel_at_a_fetchs_deadline_replaces_the_stream(setup):
    """The core's own timer gives up on a fetch at its deadline, just before
    the transport's would: that cancel is a timeout too (the leader may be
    gone without a FIN), so the next fetch goes over a fresh stream."""
    leader, replicas, sender = await setup()
    sender.send(fetch(1, timeout_ms=300))  # never released: a leader that hangs
    await leader.until_held(1)
    await asyncio.sleep(0.25)  # the core's timer, firing at the deadline (less its slack)
    sender.cancel(1)
    sender.send(fetch(2))
    await leader.until_held(2)
    leader.release(2)
    await replicas.until(lambda: 2 in replicas.answered)
    assert 1 not in replicas.answered and leader.streams_opened == 2


async def test_a_stream_idle_for_a_minute_is_closed_when_another_is_opened(setup):
    """A leader this broker no longer fetches from (its partitions moved):
    its stream is closed once another leader's stream is opened, not kept
    (and pinged) for ever."""
    old, replicas, sender = await setup()
    sender.send(fetch(1))
    await old.until_held(1)
    old.release(1)
    await replicas.until(lambda: 1 in replicas.answered)
    (stream,) = sender._streams.values()
    stream.last_used -= fetcher.STREAM_IDLE_S + 1  # a minute without a fetch
    new = Leader()
    await new.start()
    try:
        fetcher.broker_url = lambda image, leader_id: new.url  # (restored by monkeypatch)
        sender.send(fetch(2))
        await new.until_held(2)
        assert list(sender._streams) == [new.url]
        async with asyncio.timeout(10):
            while not old.sockets[0].closed:
                await asyncio.sleep(0.01)
        new.release(2)
        await replicas.until(lambda: 2 in replicas.answered)
    finally:
        await sender.stop()
        await new.runner.cleanup()


async def test_a_leader_without_the_stream_is_fetched_from_by_post(setup):
    leader, replicas, sender = await setup(stream=False)
    sender.send(fetch(1))
    await replicas.until(lambda: 1 in replicas.answered)
    sender.send(fetch(2))
    await replicas.until(lambda: 2 in replicas.answered)
    assert replicas.answered[1]["by"] == replicas.answered[2]["by"] == "post"
    assert leader.posts == 2 and replicas.failed == []
    # It was offered the stream once, not before every fetch.
    assert len(sender._plain_until) == 1


# -- the leader's side: a follower that stops reading ---------------------------------------
class Answering:
    """Stands for the DataApi's core side: each fetch answered at once with
    ``size`` bytes of records, counted."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.calls = 0
        self._streams: dict = {}

    async def _answer_follower(self, fetch) -> dict:
        self.calls += 1
        return {"partitions": [{"records": b"x" * self.size}], "throttle_time_ms": 0}


def masked_frame(payload: bytes) -> bytes:
    """A client's binary WebSocket frame (RFC 6455: clients mask)."""
    mask = os.urandom(4)
    head = bytes([0x82]) + (bytes([0x80 | len(payload)]) if len(payload) < 126
                            else bytes([0x80 | 126]) + struct.pack("!H", len(payload)))
    return head + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload))


async def test_a_follower_that_stops_reading_holds_few_answers_and_never_the_shutdown():
    """A paused (or hostile) follower sends 200 fetches and reads nothing:
    the leader answers at most STREAM_FETCHES_MAX of them (the rest wait
    unread, not buffered), and stopping the broker is not held by the
    answers it cannot deliver."""
    api = Answering(4 << 20)
    app = web.Application()
    app[wire.BODY_BYTES_MAX_KEY] = 1 << 20
    app.router.add_get(REPLICA_STREAM_PATH, functools.partial(DataApi.handle_replica_stream, api))
    app.on_shutdown.append(functools.partial(DataApi._close_streams, api))
    api._stream_fetch = functools.partial(DataApi._stream_fetch, api)
    api._serve_stream = functools.partial(DataApi._serve_stream, api)
    runner = web.AppRunner(app, shutdown_timeout=2.0)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    listening = site._server.sockets[0]
    port = listening.getsockname()[1]
    # Small fixed socket buffers on both ends (an accepted socket takes the
    # listener's): the kernel's autotuned ones (megabytes on loopback, more
    # under load) could take in a whole 4 MiB answer and free its slot.
    listening.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 256 << 10)
    client = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 << 10)
    client.setblocking(False)
    await asyncio.get_running_loop().sock_connect(client, ("127.0.0.1", port))
    reader, writer = await asyncio.open_connection(sock=client)
    key = base64.b64encode(os.urandom(16)).decode()
    writer.write(f"GET {REPLICA_STREAM_PATH} HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\n"
                 f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
                 "Sec-WebSocket-Version: 13\r\n\r\n".encode())
    assert (await asyncio.wait_for(reader.readline(), 10)).startswith(b"HTTP/1.1 101")
    body = {"replica_id": 2, "max_wait_ms": 0,
            "partitions": [{"topic": "t", "partition": 0, "offset": 0}]}
    for request_id in range(200):
        writer.write(masked_frame(msgpack.packb({"id": request_id, "fetch": body})))
    await writer.drain()
    async with asyncio.timeout(10):
        while api.calls < STREAM_FETCHES_MAX:
            await asyncio.sleep(0.01)
    await asyncio.sleep(0.5)  # time for more, were there room
    assert api.calls == STREAM_FETCHES_MAX
    await asyncio.wait_for(runner.cleanup(), 10)  # (it hung, before the bound)
    writer.close()


# -- a stream that closes with requests in flight -------------------------------------------
class Holding:
    """Stands for the DataApi: each request on a stream is held until
    ``release`` is set, then counted as finished (or as cancelled)."""

    def __init__(self) -> None:
        self._streams: dict = {}
        self.release = asyncio.Event()
        self.finished = 0
        self.cancelled = 0

    async def answer(self, stream, data: bytes) -> None:
        try:
            await self.release.wait()
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        self.finished += 1


@pytest.mark.parametrize("finish_requests", [True, False])
async def test_requests_in_flight_when_a_stream_closes_finish_or_are_cancelled_as_told(
        finish_requests):
    """A client's stream (finish_requests) carries its requests out after
    the client closes it, as a POST whose client left is (a produce
    appended is charged to its quotas); a follower's stream cancels its
    fetches (their answers would be void)."""
    import aiohttp

    api = Holding()
    app = web.Application()
    app[wire.BODY_BYTES_MAX_KEY] = 1 << 20

    async def handler(request: web.Request) -> web.StreamResponse:
        return await DataApi._serve_stream(api, request, api.answer, 16, idle_s=None,
                                           finish_requests=finish_requests)
    app.router.add_get("/stream", handler)
    runner = web.AppRunner(app, shutdown_timeout=2.0)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    try:
        async with aiohttp.ClientSession() as session:
            stream = await session.ws_connect(f"http://127.0.0.1:{port}/stream")
            for _ in range(3):
                await stream.send_bytes(b"a request")
            async with asyncio.timeout(10):
                while sum(len(s.answering) for s in api._streams.values()) < 3:
                    await asyncio.sleep(0.01)
            await stream.close()
        async with asyncio.timeout(10):
            while api._streams:  # the broker saw the stream end
                await asyncio.sleep(0.01)
        api.release.set()
        async with asyncio.timeout(10):
            while api.finished + api.cancelled < 3:
                await asyncio.sleep(0.01)
        assert (api.finished, api.cancelled) == ((3, 0) if finish_requests else (0, 3))
    finally:
        await asyncio.wait_for(runner.cleanup(), 10)
