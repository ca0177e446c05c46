"""Follower fetches over HTTP: the transport of the replication core's ``SendFetch``.

The core (``replication.ReplicationCore``) decides which partitions a
follower fetches from which leader, what it asks for and what to do with the
answer (append, truncate, restart at the leader's log start, rest after an
error). This module only carries the request: the ordinary ``POST
/v1/fetch`` with ``replica_id`` to the leader's ``BROKER`` listener, and the
answer or the failure back to the ``ReplicaManager``. A ``CancelRequest``
cancels the request in flight (its answer would be void anyway).
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

logger = logging.getLogger(__name__)


class FollowerFetchSender:
    def __init__(self, replicas: ReplicaManager, peer_ssl: ssl.SSLContext | None = None) -> None:
        self.replicas = replicas
        self.peer_ssl = peer_ssl  # for leaders' SSL listeners
        self._requests = RequestTasks()
        self._session: aiohttp.ClientSession | None = None

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = tls.session(self.peer_ssl)
        return self._session

    def send(self, action: SendFetch) -> None:
        self._requests.start(action.request_id, self._fetch(action),
                             f"replica-fetch-{action.leader_id}-{action.request_id}")

    def cancel(self, request_id: int) -> None:
        self._requests.cancel(request_id)

    async def _fetch(self, action: SendFetch) -> None:
        url = broker_url(self.replicas.image, action.leader_id)
        try:
            if url is None:
                raise ValueError(f"broker {action.leader_id} has no BROKER listener in the "
                                 "metadata")
            answer = await self._post(url + "/v1/fetch", action.body, action.timeout_ms)
        except asyncio.CancelledError:
            raise
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError, ValueError,
                msgpack.UnpackException) as exc:
            logger.debug("broker %d: fetch from leader %d failed: %s", self.replicas.broker_id,
                         action.leader_id, exc)
            self.replicas.fetch_failed(action.request_id)
            return
        self.replicas.fetch_answered(action.request_id, answer)

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
        if self._session is not None:
            await self._session.close()
            self._session = None
