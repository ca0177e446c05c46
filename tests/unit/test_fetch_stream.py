"""The follower's fetch transport (api/broker/fetcher.py) against stand-in
leaders on loopback: fetches to one leader share one WebSocket, each answer
goes to its own fetch, a fetch cancelled or timed out is failed or dropped
and never answered late, a stream that closes fails what it carried, and a
leader without the stream (an older broker) is fetched from by POST.

The broker's own side of the stream is tested against real nodes in
tests/integration/test_broker_api.py; every replication test uses both."""

import asyncio

import msgpack
import pytest
from aiohttp import WSMsgType, web

from api.broker import fetcher
from api.broker.fetcher import REPLICA_STREAM_PATH, FollowerFetchSender
from api.broker.replication import SendFetch


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
