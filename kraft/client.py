"""Calling the active controller: brokers, the CLI and tests use this.

``ControllerClient.call(path, body)`` posts msgpack to the controller it
believes active and follows the way to the active one: a ``NOT_CONTROLLER``
answer names the leader (when known: its id and URL, so that a controller
that joined the quorum after this client started is found too) and the
call goes there; a controller that does not answer, or knows no leader,
makes the call try the next voter. Retries stop at ``timeout_ms``, when the
last error is raised. Errors the controller reports for the request itself
(bad input, stale epochs, ...) are raised at once as ``ControllerError``
with the controller's code.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import time
from collections.abc import Callable, Mapping
from typing import Any

import aiohttp
import msgpack

from protocol import tls
from protocol.errors import KraftError

logger = logging.getLogger(__name__)

#: Codes after which another controller (or a later try) may succeed.
RETRIABLE_CODES = frozenset({"NOT_CONTROLLER", "REQUEST_TIMED_OUT"})
#: Pause between rounds over all voters when none could answer.
RETRY_BACKOFF_MS = 100
#: Pause before following a new leader hint.
HINT_BACKOFF_MS = 5


class ControllerError(KraftError):
    """An error answered by a controller, with its code."""

    def __init__(self, code: str, message: str, body: Mapping[str, Any] | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.body = dict(body or {})


class ControllerUnavailableError(KraftError):
    """No controller could be reached, or none was active, in time."""

    code = "NOT_CONTROLLER"


class ControllerClient:
    """Finds and calls the active controller among ``voter_urls``."""

    def __init__(self, voter_urls: Mapping[int, str], *, timeout_ms: int = 10_000,
                 attempt_timeout_ms: int = 2_000,
                 session: aiohttp.ClientSession | None = None,
                 ssl_context: ssl.SSLContext | None = None) -> None:
        if not voter_urls:
            raise ValueError("at least one controller URL is needed")
        self.voter_urls = dict(voter_urls)
        self.timeout_ms = timeout_ms
        self.attempt_timeout_ms = attempt_timeout_ms
        # node id -> when it last failed to answer (monotonic seconds)
        self._failed_at: dict[int, float] = {}
        self._session = session
        self._owns_session = session is None
        self.ssl_context = ssl_context  # for controllers' SSL listeners
        self.leader_id: int | None = None

    async def __aenter__(self) -> "ControllerClient":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    async def close(self) -> None:
        if self._session is not None and self._owns_session:
            await self._session.close()
            self._session = None

    def _session_or_new(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = tls.session(self.ssl_context)
        return self._session

    def _candidates(self) -> list[int]:
        """Voters in the order to try: the believed leader, then the others,
        those that failed to answer most recently last (a paused controller
        accepts connections and never answers: it must not be tried first
        again and again)."""
        def key(node_id: int) -> tuple:
            return (node_id != self.leader_id, self._failed_at.get(node_id, 0.0), node_id)
        return sorted(self.voter_urls, key=key)

    def _learn_leader(self, error: Mapping[str, Any]) -> int | None:
        """The leader a NOT_CONTROLLER answer names, when it can be called.

        Its ``leader_url`` is taken as that controller's URL: a controller
        that joined the quorum after this client started (KIP-853) is in no
        static list, and one that moved has a new URL. ``voter_urls`` starts
        as the bootstrap list and grows with what the controllers say."""
        hint = error.get("leader_id")
        if not isinstance(hint, int) or isinstance(hint, bool):
            return None
        url = error.get("leader_url")
        if isinstance(url, str) and len(url) <= 300 and url.startswith(("http://", "https://")):
            url = url.rstrip("/")
            if self.voter_urls.get(hint) != url:
                logger.info("controller %d is at %s (named by a NOT_CONTROLLER answer)",
                            hint, url)
                self.voter_urls[hint] = url
            self._failed_at.pop(hint, None)
        return hint if hint in self.voter_urls else None

    async def call(self, path: str, body: Mapping[str, Any], *,
                   timeout_ms: int | None = None, request_timeout_ms: int | None = None
                   ) -> dict:
        """POST ``body`` to ``path`` on the active controller; its answer.

        ``timeout_ms`` bounds the whole call; ``request_timeout_ms`` bounds
        each HTTP exchange (default ``attempt_timeout_ms``; long-polls pass
        their wait plus a margin), so that one controller that does not
        answer leaves time to ask the others."""
        total_ms = self.timeout_ms if timeout_ms is None else timeout_ms
        attempt_s = (self.attempt_timeout_ms if request_timeout_ms is None
                     else request_timeout_ms) / 1000
        deadline = time.monotonic() + total_ms / 1000
        payload = msgpack.packb(dict(body), use_bin_type=True)
        last_error: Exception | None = None
        while True:
            hinted = False
            for node_id in self._candidates():
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                try:
                    answer = await self._post(self.voter_urls[node_id] + path, payload,
                                              min(remaining, attempt_s))
                except (aiohttp.ClientError, asyncio.TimeoutError, OSError, ValueError) as exc:
                    last_error = exc
                    self._failed_at[node_id] = time.monotonic()
                    if self.leader_id == node_id:
                        self.leader_id = None
                    continue
                error = answer.get("error") if isinstance(answer, dict) else None
                if error is None:
                    self.leader_id = node_id
                    self._failed_at.pop(node_id, None)
                    return answer
                last_error = ControllerError(error.get("code", "UNKNOWN_SERVER_ERROR"),
                                             error.get("message", ""), error)
                if last_error.code not in RETRIABLE_CODES:
                    raise last_error
                hint = self._learn_leader(error)
                if hint is not None and hint != node_id and hint != self.leader_id:
                    self.leader_id = hint
                    hinted = True
                    break  # restart the round at the hinted leader
            if time.monotonic() >= deadline:
                break
            # A new hint is followed almost at once; a round that found nobody
            # (an election under way) backs off longer.
            backoff_s = (HINT_BACKOFF_MS if hinted else RETRY_BACKOFF_MS) / 1000
            await asyncio.sleep(min(backoff_s, max(0.0, deadline - time.monotonic())))
        raise ControllerUnavailableError(
            f"no active controller answered {path} within {total_ms} ms "
            f"(voters {self.voter_urls}); last error: {last_error}")

    async def _post(self, url: str, payload: bytes, timeout_s: float) -> Any:
        session = self._session_or_new()
        async with session.post(
                url, data=payload, timeout=aiohttp.ClientTimeout(total=timeout_s),
                headers={"Content-Type": "application/msgpack",
                         "Accept": "application/msgpack"}) as response:
            raw = await response.read()
            if response.content_type != "application/msgpack":
                raise aiohttp.ClientResponseError(
                    response.request_info, response.history, status=response.status,
                    message=f"unexpected {response.content_type} answer: {raw[:200]!r}")
            return msgpack.unpackb(raw, raw=False, strict_map_key=False)

    async def hold(self, path: str, body: Mapping[str, Any], *,
                   release: Callable[[int], bool], opened: Callable[[int], None] | None = None,
                   connect_s: float = 1.0) -> None:
        """POST ``body`` to ``path`` on the active controller and keep the
        answer's stream open (``brokers/presence``) until the controller ends
        it (or its connection breaks) or ``release(node_id)`` says to let go,
        asked twice a second and after each byte. Silence alone never closes
        it: a closed stream is what tells the controller this process died.
        ``opened(node_id)`` is called once the controller has taken it.
        Tries the believed leader first and follows a not-the-leader hint at
        once; raises ``ControllerError`` for a refusal that retrying will
        not change, ``ControllerUnavailableError`` when no voter held it."""
        async def consume(node_id: int, content: aiohttp.StreamReader) -> None:
            if opened is not None:
                opened(node_id)
            while not release(node_id):
                try:
                    async with asyncio.timeout(0.5):  # (not wait_for: see protocol/aio.py)
                        chunk = await content.read(4096)
                except TimeoutError:
                    continue
                if not chunk:
                    return  # the controller ended it: no longer active

        await self._stream(path, lambda: body, consume, connect_s)

    async def follow(self, path: str, body: Callable[[], Mapping[str, Any]],
                     on_answer: Callable[[Any], bool], *, silence_s: float,
                     connect_s: float = 1.0) -> None:
        """POST ``body()`` to ``path`` on the active controller and hand each
        frame of the answer's stream (``metadata/stream``: a 4-byte
        big-endian length, then msgpack) to ``on_answer``, until the
        controller ends it, it breaks, ``on_answer`` returns False, or
        nothing comes for ``silence_s`` (that controller is then tried last
        next time: it may be paused). Finding the controller and refusals:
        as ``hold``."""
        async def consume(node_id: int, content: aiohttp.StreamReader) -> None:
            while True:
                try:
                    # (Not wait_for: on 3.11 it can swallow a cancellation that
                    # lands as a frame arrives, and a stopping broker would
                    # then follow on.)
                    async with asyncio.timeout(silence_s):
                        head = await content.readexactly(4)
                        frame = await content.readexactly(int.from_bytes(head, "big"))
                except asyncio.IncompleteReadError:
                    return  # the controller ended it: no longer active
                except asyncio.TimeoutError:
                    logger.info("controller %d sent nothing on %s for %.1f s; finding the "
                                "active controller again", node_id, path, silence_s)
                    self._failed_at[node_id] = time.monotonic()
                    if self.leader_id == node_id:
                        self.leader_id = None
                    return
                if not on_answer(msgpack.unpackb(frame, raw=False, strict_map_key=False)):
                    return

        await self._stream(path, body, consume, connect_s)

    async def _stream(self, path: str, body: Callable[[], Mapping[str, Any]],
                      consume: Callable[[int, aiohttp.StreamReader], Any],
                      connect_s: float) -> None:
        """``hold`` and ``follow``: POST ``body()`` to each voter in turn
        until one answers with a stream, then ``consume(node_id, content)``
        it; returns when that returns or the stream breaks."""
        tried: set[int] = set()
        last_error: Exception | None = None
        while True:
            node_id = next((n for n in self._candidates() if n not in tried), None)
            if node_id is None:
                raise ControllerUnavailableError(f"no active controller held {path} open; "
                                                 f"last error: {last_error}")
            tried.add(node_id)
            held = False
            try:
                async with self._session_or_new().post(
                        self.voter_urls[node_id] + path,
                        data=msgpack.packb(dict(body()), use_bin_type=True),
                        timeout=aiohttp.ClientTimeout(total=None, sock_connect=connect_s),
                        headers={"Content-Type": "application/msgpack",
                                 "Accept": "application/msgpack"}) as response:
                    if (response.status != 200
                            or response.content_type != "application/octet-stream"):
                        last_error = _refusal(response.status, response.content_type,
                                              await response.read())
                        if last_error.code not in RETRIABLE_CODES:
                            raise last_error
                        hint = self._learn_leader(last_error.body)
                        if hint is not None:
                            self.leader_id = hint
                        continue
                    held = True
                    self.leader_id = node_id
                    self._failed_at.pop(node_id, None)
                    await consume(node_id, response.content)
                    return
            except (aiohttp.ClientError, asyncio.TimeoutError, OSError, ValueError) as exc:
                if held:
                    return  # it broke: the caller opens it again at once
                last_error = exc
                self._failed_at[node_id] = time.monotonic()
                if self.leader_id == node_id:
                    self.leader_id = None

    async def get_json(self, node_id: int, path: str, timeout_s: float = 5.0) -> Any:
        """GET a JSON inspection endpoint of one controller."""
        session = self._session_or_new()
        async with session.get(self.voter_urls[node_id] + path,
                               timeout=aiohttp.ClientTimeout(total=timeout_s)) as response:
            return await response.json()


def _refusal(status: int, content_type: str, raw: bytes) -> ControllerError:
    """The error in a controller's answer that is not the stream asked for."""
    error: Any = None
    if content_type == "application/msgpack":
        try:
            answer = msgpack.unpackb(raw, raw=False)
            error = answer.get("error") if isinstance(answer, dict) else None
        except ValueError:
            error = None
    if not isinstance(error, dict):
        error = {"code": "UNKNOWN_SERVER_ERROR",
                 "message": f"HTTP {status} ({content_type}): {raw[:200]!r}"}
    return ControllerError(error.get("code", "UNKNOWN_SERVER_ERROR"), error.get("message", ""),
                           error)
