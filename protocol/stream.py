"""Requests over one WebSocket: the caller's end of a tagged-message stream.

An HTTP exchange costs both ends far more CPU than the work of a small
produce or fetch (on this machine 235 µs for a POST round trip, 33 µs for a
WebSocket message pair). So the calls made most often travel as binary
WebSocket messages on one connection per broker, each a msgpack map tagged
with a request id, answered in any order by a map with the same id:

- a follower's fetches to its leader, ``GET /v1/replica/fetch-stream``
  (``{"id", "fetch"}`` -> ``{"id", "answer"}``; api/broker/fetcher.py);
- a client's produces and fetches, ``GET /v1/stream``
  (``{"id", "path", "body"}`` -> ``{"id", "status", "answer"}``, the body and
  answer of ``POST <path>`` and the HTTP status it would have; the client's
  ``Transport``).

The broker answers both in ``api/broker/data_api.py``. ``TaggedStream`` is
what both callers share: it sends, matches answers to waiting calls and
fails every waiting call when the connection ends.
"""

from __future__ import annotations

import asyncio

import aiohttp
import msgpack

#: A client's stream, and the requests it may carry (``POST`` bodies).
CLIENT_STREAM_PATH = "/v1/stream"
STREAMED_PATHS = frozenset({"/v1/produce", "/v1/fetch"})
#: How long closing a stream waits for the other side's closing frame.
STREAM_CLOSE_S = 1.0
#: Both sides ping a quiet stream this often and close it when no answer
#: comes within half of it: a connection cut without a FIN (a host gone, a
#: NAT's table dropped) is noticed in seconds, not TCP's minutes.
STREAM_HEARTBEAT_S = 5.0
#: A stream that carried nothing for this long is closed when its owner
#: next looks (the broker closes a client's after connections.max.idle.ms).
STREAM_IDLE_S = 60.0


class StreamClosedError(ConnectionError):
    """The stream closed before the call's answer came. ``close_code`` is
    the WebSocket close code the other side gave, if any."""

    def __init__(self, reason: str, close_code: int | None = None) -> None:
        super().__init__(reason)
        self.close_code = close_code


class TaggedStream:
    """One WebSocket carrying any number of calls at once, each answer
    matched to its call by the ``id`` of the map it is."""

    def __init__(self, socket: aiohttp.ClientWebSocketResponse, name: str) -> None:
        self.socket = socket
        self.waiting: dict[int, asyncio.Future] = {}
        self.reader = asyncio.create_task(self._read(), name=name)
        self.last_used = asyncio.get_running_loop().time()
        self.closed_because: str | None = None  # set once the reader stops
        self.close_code: int | None = None

    @property
    def open(self) -> bool:
        return (self.closed_because is None and not self.socket.closed
                and not self.reader.done())

    async def call(self, request_id: int, data: bytes) -> tuple[dict, int]:
        """Send ``data`` (a packed map whose ``id`` is ``request_id``, which
        no other waiting call has); the map answering it and its size in
        bytes. Raises ``StreamClosedError`` if the stream ends first."""
        if self.closed_because is not None:  # nothing would answer it
            raise StreamClosedError(self.closed_because, self.close_code)
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self.waiting[request_id] = future
        self.last_used = loop.time()
        try:
            await self.socket.send_bytes(data)
            answer = await future
        finally:
            self.waiting.pop(request_id, None)
        return answer

    async def _read(self) -> None:
        reason = "the other side closed the stream"
        try:
            async for message in self.socket:
                if message.type is not aiohttp.WSMsgType.BINARY:
                    reason = f"unexpected {message.type.name} message on the stream"
                    break
                tagged = msgpack.unpackb(message.data, raw=False)
                future = (self.waiting.pop(tagged.get("id"), None)
                          if isinstance(tagged, dict) else None)
                if future is not None and not future.done():
                    future.set_result((tagged, len(message.data)))
            else:
                self.close_code = self.socket.close_code
                if self.close_code is not None:
                    reason = f"the other side closed the stream (close code {self.close_code})"
        except (aiohttp.ClientError, msgpack.UnpackException, ValueError, TypeError,
                OSError) as exc:
            reason = f"the stream failed: {exc}"
        finally:
            self.closed_because = reason
            waiting, self.waiting = self.waiting, {}
            for future in waiting.values():
                if not future.done():
                    future.set_exception(StreamClosedError(reason, self.close_code))
            if not self.socket.closed:
                await self.socket.close()

    async def close(self) -> None:
        self.reader.cancel()
        await asyncio.gather(self.reader, return_exceptions=True)
        await self.socket.close()
