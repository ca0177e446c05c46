"""protocol.wire.pack_pieces: a msgpack answer with its large byte strings
as pieces of their own is byte for byte what msgpack packs, and aiohttp
sends it whole."""

from __future__ import annotations

import msgpack
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol import wire

def _sized(n: int) -> bytes:
    return bytes(range(256)) * (n // 256) + b"x" * (n % 256)


# Around the piece threshold, and around msgpack's bin16/bin32 boundary.
sizes = st.one_of(st.integers(wire.PIECE_BYTES_MIN - 2, wire.PIECE_BYTES_MIN + 2),
                  st.integers(2**16 - 2, 2**16 + 2))
leaves = st.one_of(st.none(), st.booleans(), st.integers(-2**63, 2**64 - 1), st.text(max_size=5),
                   st.binary(max_size=10), sizes.map(_sized), sizes.map(_sized).map(bytearray))
bodies = st.recursive(leaves, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.lists(inner, max_size=4).map(tuple),
    st.dictionaries(st.one_of(st.text(max_size=4), st.binary(max_size=4)), inner, max_size=4)),
    max_leaves=12)


@settings(max_examples=150, deadline=None)
@given(bodies)
def test_pieces_join_to_what_msgpack_packs(body):
    pieces = wire.pack_pieces(body)
    assert b"".join(pieces) == msgpack.packb(body, use_bin_type=True)
    big = [b for b in _bytes_in(body) if len(b) >= wire.PIECE_BYTES_MIN]
    assert all(any(p is b for p in pieces) for b in big)  # sent as they are, not copied


def _bytes_in(body):
    if isinstance(body, dict):
        for value in body.values():
            yield from _bytes_in(value)
    elif isinstance(body, (list, tuple)):
        for value in body:
            yield from _bytes_in(value)
    elif isinstance(body, (bytes, bytearray)):
        yield body


async def _served(answer):
    """``answer`` as aiohttp serves it through ``wire.respond``: (status,
    headers, the body's bytes)."""

    async def handler(request: web.Request) -> web.Response:
        return wire.respond(request, answer)

    app = web.Application()
    app.router.add_post("/f", handler)
    async with TestClient(TestServer(app)) as client:
        response = await client.post("/f", data=msgpack.packb({}),
                                     headers={"Content-Type": wire.MSGPACK})
        return response.status, response.headers, await response.read()


async def test_a_pieced_answer_arrives_whole():
    answer = {"partitions": [{"records": bytes(range(256)) * 4096, "error": None}]}  # 1 MiB
    status, headers, raw = await _served(answer)
    assert status == 200 and headers["Content-Type"] == wire.MSGPACK
    assert int(headers["Content-Length"]) == len(msgpack.packb(answer))
    assert msgpack.unpackb(raw) == answer


async def test_an_answer_of_many_small_pieces_and_a_large_one_arrives_whole():
    """A fetch answer of many partitions: pieces of a few KB are joined into
    writes of about WRITE_CHUNK_BYTES, one larger than that goes in slices,
    and the bytes arrive in order."""
    small = [bytes([i]) * (wire.PIECE_BYTES_MIN + i) for i in range(200)]
    large = bytes(range(256)) * (wire.WRITE_CHUNK_BYTES // 256 + 7)
    answer = {"partitions": [{"records": r, "error": None} for r in small[:100]]
              + [{"records": large, "error": None}]
              + [{"records": r, "error": None} for r in small[100:]]}
    pieces = wire.pack_pieces(answer)
    assert len(pieces) > 400  # every record a piece of its own: none copied in packing
    status, headers, raw = await _served(answer)
    assert status == 200 and int(headers["Content-Length"]) == len(msgpack.packb(answer))
    assert msgpack.unpackb(raw) == answer
    writes: list[int] = []

    class Writer:
        async def write(self, chunk) -> None:
            writes.append(len(chunk))

    await wire.PiecesPayload(pieces, wire.MSGPACK).write(Writer())
    assert sum(writes) == len(msgpack.packb(answer))
    # A few writes of about WRITE_CHUNK_BYTES each, not one per piece.
    assert len(writes) < 20 and max(writes) < 2 * wire.WRITE_CHUNK_BYTES
