"""Follower fetches to leaders: the transport of the replication core's ``SendFetch``.

The core (``replication.ReplicationCore``) decides which partitions a
follower fetches from which leader, what it asks for and what to do with the
answer (append, truncate, restart at the leader's log start, rest after an
error). This module only carries the request to the leader's ``BROKER``
listener and the answer or the failure back to the ``ReplicaManager``. A
``CancelRequest`` cancels the request in flight (its answer would be void
anyway).

The fetches to one leader travel over one WebSocket (``GET
/v1/replica/fetch-stream``, answered by ``DataApi.handle_replica_stream``;
``protocol.stream.TaggedStream``): a message each way per fetch, tagged
with the request id, instead of an HTTP exchange each. On this machine an
HTTP round trip costs 235 µs of CPU and a message pair 33 µs, and a
follower fetches after every append it is woken for. A leader that has no
stream (an older broker, during a rolling upgrade) is asked by ``POST
/v1/fetch`` with ``replica_id``, the same fetch, and offered the stream
again a minute later.
"""

from __future__ import annotations

import asyncio
import logging
import ssl

import aiohttp
import msgpack

from api.broker.replica_manager import ReplicaManager, RequestTasks
from api.broker.replication import SendFetch, broker_url
from protocol import tls, wire
from protocol.stream import STREAM_CLOSE_S, STREAM_HEARTBEAT_S, STREAM_IDLE_S, TaggedStream

logger = logging.getLogger(__name__)

REPLICA_STREAM_PATH = "/v1/replica/fetch-stream"
#: A leader that refused the stream (it has no such route) gets plain
#: fetches for this long, then is offered the stream again.
PLAIN_FETCH_S = 60.0
#: The leader answers at most this many fetches of one stream at once (a
#: follower sends one per fetcher); it reads no more meanwhile.
STREAM_FETCHES_MAX = 16
#: A cancel this close to a fetch's deadline is its timeout (the core's
#: timer fires first): the stream it waited on is replaced.
DEADLINE_SLACK_S = 0.1


class FollowerFetchSender:
    def __init__(self, replicas: ReplicaManager, peer_ssl: ssl.SSLContext | None = None) -> None:
        self.replicas = replicas
        self.peer_ssl = peer_ssl  # for leaders' SSL listeners
        self._requests = RequestTasks()
        self._session: aiohttp.ClientSession | None = None
        self._streams: dict[str, TaggedStream] = {}  # by leader URL
        self._opening: dict[str, asyncio.Lock] = {}
        self._plain_until: dict[str, float] = {}  # leader URL -> loop time
        # Fetches out on a stream: request id -> (leader URL, deadline).
        self._out: dict[int, tuple[str, float]] = {}

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = tls.session(self.peer_ssl)
        return self._session

    def send(self, action: SendFetch) -> None:
        self._requests.start(action.request_id, self._fetch(action),
                             f"replica-fetch-{action.leader_id}-{action.request_id}")

    def cancel(self, request_id: int) -> None:
        out = self._out.pop(request_id, None)
        if out is not None and asyncio.get_running_loop().time() >= out[1] - DEADLINE_SLACK_S:
            self._drop(out[0])  # the core gave up waiting: the leader may be gone
        self._requests.cancel(request_id)

    async def _fetch(self, action: SendFetch) -> None:
        url = broker_url(self.replicas.image, action.leader_id)
        try:
            if url is None:
                raise ValueError(f"broker {action.leader_id} has no BROKER listener in the "
                                 "metadata")
            async with asyncio.timeout(action.timeout_ms / 1000):
                answer = await self._ask(url, action)
        except asyncio.CancelledError:
            raise
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError, ValueError,
                msgpack.UnpackException) as exc:
            logger.debug("broker %d: fetch from leader %d failed: %s", self.replicas.broker_id,
                         action.leader_id, exc)
            if isinstance(exc, asyncio.TimeoutError):
                self._drop(url)  # the leader may be gone; a fresh stream next time
            self.replicas.fetch_failed(action.request_id)
            return
        self.replicas.fetch_answered(action.request_id, answer)

    async def _ask(self, url: str, action: SendFetch) -> dict:
        stream = await self._stream(url)
        if stream is None:
            return await self._post(url + "/v1/fetch", action.body, action.timeout_ms)
        deadline = asyncio.get_running_loop().time() + action.timeout_ms / 1000
        self._out[action.request_id] = (url, deadline)
        try:
            tagged, _ = await stream.call(action.request_id, msgpack.packb(
                {"id": action.request_id, "fetch": action.body}, use_bin_type=True))
        finally:
            self._out.pop(action.request_id, None)
        answer = tagged.get("answer")
        if not isinstance(answer, dict):
            raise ValueError(f"fetch answer is not a map: {answer!r:.100}")
        return answer

    async def _stream(self, url: str) -> TaggedStream | None:
        """The open stream to the leader at ``url``, opened if need be;
        None for a leader without one (asked by POST instead)."""
        stream = self._streams.get(url)
        if stream is not None and stream.open:
            return stream
        loop = asyncio.get_running_loop()
        if self._plain_until.get(url, 0.0) > loop.time():
            return None
        async with self._opening.setdefault(url, asyncio.Lock()):
            stream = self._streams.get(url)
            if stream is not None and stream.open:
                return stream
            if self._plain_until.get(url, 0.0) > loop.time():
                return None
            try:
                socket = await self.session.ws_connect(
                    url + REPLICA_STREAM_PATH, compress=0, max_msg_size=0, autoping=True,
                    heartbeat=STREAM_HEARTBEAT_S,
                    timeout=aiohttp.ClientWSTimeout(ws_close=STREAM_CLOSE_S),
                    headers={"Accept": wire.MSGPACK})
            except aiohttp.WSServerHandshakeError as exc:
                if exc.status in (404, 405):
                    logger.info("broker %d: leader at %s has no fetch stream (an older "
                                "version?): fetching by POST /v1/fetch",
                                self.replicas.broker_id, url)
                    self._plain_until[url] = loop.time() + PLAIN_FETCH_S
                    return None
                # Refused (403: this broker's principal lacks CLUSTER_ACTION):
                # said as the core says a refused fetch, at each attempt.
                logger.info("broker %d: leader at %s refused the fetch stream: %d %s",
                            self.replicas.broker_id, url, exc.status, exc.message)
                raise
            stream = self._streams[url] = TaggedStream(socket, "replica-fetch-stream")
            idle_since = loop.time() - STREAM_IDLE_S
            for other, idle in list(self._streams.items()):
                if idle.last_used < idle_since and not idle.waiting:
                    self._drop(other)
            return stream

    def _drop(self, url: str | None) -> None:
        stream = self._streams.pop(url, None) if url is not None else None
        if stream is not None:
            self._requests.start(-id(stream), stream.close(), "replica-fetch-stream-close")

    async def _post(self, url: str, body: dict, timeout_ms: int) -> dict:
        async with self.session.post(
                url, data=msgpack.packb(body, use_bin_type=True),
                headers={"Content-Type": wire.MSGPACK, "Accept": wire.MSGPACK},
                timeout=aiohttp.ClientTimeout(total=timeout_ms / 1000)) as response:
            answer = msgpack.unpackb(await response.read(), raw=False)
        if not isinstance(answer, dict):
            raise ValueError(f"fetch answer is not a map: {answer!r:.100}")
        return answer

    async def stop(self) -> None:
        await self._requests.stop()
        streams, self._streams = list(self._streams.values()), {}
        await asyncio.gather(*(stream.close() for stream in streams), return_exceptions=True)
        if self._session is not None:
            await self._session.close()
            self._session = None
