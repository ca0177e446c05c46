"""``ControllerClient.follow`` (the brokers' metadata stream) against a
stand-in controller on a real socket: frames handed on in order, the end
of a stream, silence, refusals, and a cancelled follow that ends at once
even while frames keep coming."""

import asyncio

import msgpack
import pytest
from aiohttp import web

from kraft.client import ControllerClient, ControllerError
from tests.helpers import served


def frame(answer) -> bytes:
    body = msgpack.packb(answer, use_bin_type=True)
    return len(body).to_bytes(4, "big") + body


@pytest.fixture
async def controller():
    """/stream: frames offset 1.. (``count`` of them, then the end; None:
    forever, as fast as the socket takes them); /quiet: one frame, then
    silence; /refuse: OFFSET_OUT_OF_RANGE."""
    settings = {"count": 3}

    async def stream(request):
        asked = msgpack.unpackb(await request.read())
        response = web.StreamResponse(headers={"Content-Type": "application/octet-stream"})
        await response.prepare(request)
        offset = asked["after_offset"]
        while settings["count"] is None or offset < asked["after_offset"] + settings["count"]:
            offset += 1
            await response.write(frame({"offset": offset, "records": [[offset, b"r"]]}))
            await asyncio.sleep(0)
        return response

    async def quiet(request):
        response = web.StreamResponse(headers={"Content-Type": "application/octet-stream"})
        await response.prepare(request)
        await response.write(frame({"offset": 0, "records": []}))
        await asyncio.sleep(30)
        return response

    async def refuse(request):
        return web.Response(body=msgpack.packb({"error": {
            "code": "OFFSET_OUT_OF_RANGE", "message": "beyond the end"}}), status=400,
            content_type="application/msgpack")

    app = web.Application()
    app.router.add_post("/stream", stream)
    app.router.add_post("/quiet", quiet)
    app.router.add_post("/refuse", refuse)
    async with served(app) as url:
        yield url, settings


async def test_frames_are_handed_on_in_order_until_the_stream_ends(controller):
    url, _ = controller
    seen = []
    async with ControllerClient({1: url}) as client:
        await asyncio.wait_for(client.follow("/stream", lambda: {"after_offset": 10},
                                             lambda a: seen.append(a) or True,
                                             silence_s=5), 10)
    assert [a["offset"] for a in seen] == [11, 12, 13]
    assert seen[0]["records"] == [[11, b"r"]]


async def test_on_answer_returning_false_ends_the_stream(controller):
    url, settings = controller
    settings["count"] = None
    seen = []
    async with ControllerClient({1: url}) as client:
        await asyncio.wait_for(client.follow("/stream", lambda: {"after_offset": 0},
                                             lambda a: seen.append(a) or len(seen) < 5,
                                             silence_s=5), 10)
    assert len(seen) == 5


async def test_a_silent_controller_is_left_and_tried_last_next_time(controller):
    url, _ = controller
    async with ControllerClient({1: url, 2: "http://127.0.0.1:9"}) as client:
        client.leader_id = 1
        await asyncio.wait_for(client.follow("/quiet", lambda: {}, lambda a: True,
                                             silence_s=0.3), 10)
        assert client.leader_id is None
        assert client._candidates()[-1] == 1


async def test_a_refusal_that_retrying_cannot_change_is_raised(controller):
    url, _ = controller
    async with ControllerClient({1: url}) as client:
        with pytest.raises(ControllerError) as caught:
            await asyncio.wait_for(client.follow("/refuse", lambda: {"after_offset": 99},
                                                 lambda a: True, silence_s=5), 10)
    assert caught.value.code == "OFFSET_OUT_OF_RANGE"


async def test_a_cancelled_follow_ends_even_while_frames_keep_coming(controller):
    # A stopping broker cancels its metadata loop; a cancellation that lands
    # as a frame arrives must still end it (3.11's wait_for could swallow it).
    url, settings = controller
    settings["count"] = None
    async with ControllerClient({1: url}) as client:
        for _ in range(30):
            arrived = asyncio.Event()
            task = asyncio.create_task(client.follow(
                "/stream", lambda: {"after_offset": 0},
                lambda a: arrived.set() or True, silence_s=5))
            await asyncio.wait_for(arrived.wait(), 10)
            task.cancel()
            done, _ = await asyncio.wait({task}, timeout=5)
            assert done, "the follow went on after it was cancelled"
            assert task.cancelled()


class _Quorum:
    """What ``ControllerServer._metadata_since`` asks of the quorum: a
    history that no longer reaches back, and a snapshot that counts how
    often it is packed."""

    def __init__(self) -> None:
        self.packed = 0

    def records_after(self, after):
        return None, 42

    def snapshot(self):
        self.packed += 1
        return b"packed image", 42


def test_a_reader_shown_the_image_does_not_pay_for_a_packed_snapshot():
    from types import SimpleNamespace

    from kraft.server import ControllerServer

    quorum = _Quorum()
    server = SimpleNamespace(quorum=quorum)
    answer, after = ControllerServer._metadata_since(server, -1)
    assert answer == {"offset": 42, "snapshot": b"packed image"} and after == 42
    assert quorum.packed == 1
    answer, after = ControllerServer._metadata_since(server, -1, packed_snapshot=False)
    assert answer == {"offset": 42, "snapshot": None} and after == 42
    assert quorum.packed == 1
