"""HTTP to the brokers, and the client's picture of who leads what.

``Transport`` is the one place the client touches the network: one aiohttp
``ClientSession`` per client (connections are pooled per broker), msgpack
bodies both ways, a deadline on every request, and every failure turned
into a ``KraftlogError``: an error body into its code, a refused or reset
connection into ``BROKER_NOT_AVAILABLE`` and a deadline into
``REQUEST_TIMED_OUT`` (both retriable), so callers branch on codes only.

``ClusterMetadata`` caches the answer of ``POST /v1/metadata``: broker URLs,
the leader and leader epoch of each partition, the partition count of each
topic. Its parsing (``apply``) and its learning from leadership errors
(``learn_leader``) are pure and take the time as an argument; only
``refresh`` does I/O. The cache is refreshed when asked (a request failed
with a metadata error, a partition has no known leader) and, in any case,
once it is older than ``metadata_max_age_ms``.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import ssl
import time
import urllib.parse
from collections.abc import Iterable
from typing import Any, NamedTuple

import aiohttp
import msgpack

from api.client.errors import (BrokerNotAvailableError, KraftlogError, RequestTimedOutError,
                               SslAuthenticationError, error_from)
from protocol import DEFAULT_BOOTSTRAP, tls, wire
from protocol.quotas import CLIENT_ID_CHARS_MAX, CLIENT_ID_HEADER
from protocol.stream import (CLIENT_STREAM_PATH, STREAM_CLOSE_S, STREAM_HEARTBEAT_S,
                             STREAM_IDLE_S, STREAMED_PATHS, StreamClosedError, TaggedStream)

MSGPACK = "application/msgpack"
#: Connections one client keeps open in all (aiohttp pools them per broker).
CONNECTIONS_MAX = 64
#: Largest response body read; a fetch answer is bounded by its max_bytes
#: (at most 50 MiB by default) plus framing, so this only stops runaways.
RESPONSE_BYTES_MAX = 256 * 1024 * 1024
#: Requests larger than this go by POST even to a broker with a stream:
#: a big one gains nothing from it, and a broker refuses a message over
#: its socket.request.max.bytes by closing the stream, where a POST is
#: answered MESSAGE_TOO_LARGE. And after an answer larger than this, the
#: next request to the same path goes by POST, until a POST's answer is
#: smaller again: a consumer catching up in bulk pays for an HTTP exchange
#: a few times a megabyte, and less than for copying each megabyte into
#: and out of one WebSocket message (5% of its throughput on this machine).
STREAM_REQUEST_BYTES_MAX = 1024 * 1024
#: A broker that refused the stream (an older one without it, or a
#: handshake refused: the POST then says why) is sent POSTs for this long.
POST_ONLY_S = 60.0


def monotonic_ms() -> int:
    return time.monotonic_ns() // 1_000_000


class Security:
    """How the client connects, in Kafka's names: ``security_protocol``
    ``PLAINTEXT`` (http) or ``SSL`` (https: TLS, verifying the brokers'
    certificates against ``ssl_cafile``, or the system's CAs without one,
    and their host names unless ``ssl_check_hostname`` is False), and the
    client's own certificate (``ssl_certfile``, ``ssl_keyfile``) for brokers
    that require one. A bootstrap URL with ``https://`` is TLS whatever the
    protocol says; ``host:port`` takes the protocol's scheme."""

    def __init__(self, security_protocol: str = tls.PLAINTEXT, ssl_cafile: str | None = None,
                 ssl_certfile: str | None = None, ssl_keyfile: str | None = None,
                 ssl_check_hostname: bool = True, sasl_mechanism: str | None = None,
                 sasl_plain_username: str | None = None,
                 sasl_plain_password: str | None = None,
                 sasl_oauth_token_provider: Any = None) -> None:
        protocol = str(security_protocol).upper()
        if protocol == tls.SASL_PLAINTEXT:
            raise ValueError("security_protocol SASL_PLAINTEXT would send the password in "
                             "clear: use SASL_SSL")
        if protocol not in tls.SECURITY_PROTOCOLS:
            raise ValueError(f"security_protocol must be PLAINTEXT, SSL or SASL_SSL, not "
                             f"{security_protocol!r}")
        self.security_protocol = protocol
        self.scheme = tls.scheme(protocol)
        self.authorization: str | None = None
        if protocol == tls.SASL_SSL:
            if sasl_mechanism is not None and sasl_mechanism not in SASL_MECHANISMS:
                raise ValueError(f"sasl_mechanism must be one of {', '.join(SASL_MECHANISMS)}, "
                                 f"not {sasl_mechanism!r}")
            if sasl_mechanism == OAUTHBEARER or sasl_oauth_token_provider is not None:
                token = _bearer_token(sasl_oauth_token_provider)
                self.authorization = "Bearer " + token
            elif sasl_plain_username and sasl_plain_password is not None:
                import base64
                self.authorization = "Basic " + base64.b64encode(
                    f"{sasl_plain_username}:{sasl_plain_password}".encode()).decode()
            elif not ssl_certfile:
                raise ValueError("security_protocol SASL_SSL needs sasl_plain_username and "
                                 "sasl_plain_password (a user made with `kraftlog users "
                                 "create`), a delegation token (sasl_mechanism OAUTHBEARER, "
                                 "sasl_oauth_token_provider), or a client certificate "
                                 "(ssl_certfile)")
        elif sasl_plain_username or sasl_plain_password or sasl_oauth_token_provider:
            raise ValueError("sasl_plain_username, sasl_plain_password and "
                             "sasl_oauth_token_provider are for security_protocol='SASL_SSL'")
        try:
            self.ssl_context = tls.client_context(
                ssl_cafile, ssl_certfile, ssl_keyfile, bool(ssl_check_hostname)) \
                if protocol in tls.TLS_PROTOCOLS or ssl_cafile or ssl_certfile else None
        except tls.TlsConfigError as exc:
            raise ValueError(str(exc)) from None


#: Kafka's SASL mechanism names a client may give: the broker checks a
#: password against the user's SCRAM credential whichever it is; OAUTHBEARER
#: sends a delegation token (``Admin.create_delegation_token``) instead.
OAUTHBEARER = "OAUTHBEARER"
SASL_MECHANISMS = ("SCRAM-SHA-256", "SCRAM-SHA-512", "PLAIN", OAUTHBEARER)


def _bearer_token(provider: Any) -> str:
    """The token of ``sasl_oauth_token_provider``: a string (a delegation
    token's ``<id>.<hmac>``), or, as kafka-python takes it, an object whose
    ``token()`` returns one (asked once, when the client is made)."""
    token = provider.token() if hasattr(provider, "token") else provider
    if not isinstance(token, str) or not token or any(c.isspace() for c in token):
        raise ValueError("sasl_mechanism OAUTHBEARER needs sasl_oauth_token_provider: a "
                         "delegation token (DelegationToken.value, `kraftlog tokens create`) "
                         "or an object whose token() returns one")
    return token
PLAINTEXT_SECURITY = Security()
_client_numbers = itertools.count(1)


def default_client_id(kind: str) -> str:
    """Kafka's default client.id: ``producer-1``, ``consumer-2``, ..."""
    return f"{kind}-{next(_client_numbers)}"


def bootstrap_urls(bootstrap: str | Iterable[str], scheme: str = "http") -> list[str]:
    """Normalise ``bootstrap`` (a URL, ``"a,b"``, or a list) to URLs without
    a trailing slash; ``host:port`` gets ``scheme``. With ``https`` (an SSL
    client), an ``http://`` URL (the default bootstrap, say) becomes
    ``https://``: such a client never sends plaintext."""
    if isinstance(bootstrap, str):
        items = bootstrap.split(",")
    else:
        items = list(bootstrap)
    urls = []
    for item in items:
        url = str(item).strip().rstrip("/")
        if not url:
            continue
        if "://" not in url:
            url = f"{scheme}://{url}"
        elif scheme == "https" and url.startswith("http://"):
            url = "https://" + url[len("http://"):]
        if url not in urls:
            urls.append(url)
    if not urls:
        raise ValueError(f"no bootstrap URL in {bootstrap!r}")
    return urls


class Transport:
    """msgpack over HTTP with one session per client. Create it anywhere;
    the session is opened on first use, inside the running loop."""

    def __init__(self, *, request_timeout_ms: int = 30_000,
                 connections_max: int = CONNECTIONS_MAX,
                 security: Security = PLAINTEXT_SECURITY, client_id: str = "") -> None:
        if request_timeout_ms <= 0:
            raise ValueError(f"request_timeout_ms must be positive, not {request_timeout_ms}")
        if not isinstance(client_id, str) or len(client_id) > CLIENT_ID_CHARS_MAX \
                or not client_id.isprintable():
            raise ValueError(f"client_id must be printable text of at most "
                             f"{CLIENT_ID_CHARS_MAX} characters, not {client_id!r}")
        self.request_timeout_ms = request_timeout_ms
        self.security = security
        #: Kafka's client.id: sent with every request (quotas apply per client id).
        self.client_id = client_id
        self.connections_max = connections_max
        self._session: aiohttp.ClientSession | None = None
        self._closed = False
        #: Produces and fetches go over one WebSocket per broker
        #: (protocol/stream.py) unless False: each by POST.
        self.streams_enabled = True
        self._streams: dict[str, TaggedStream] = {}  # by broker URL
        self._opening: dict[str, asyncio.Lock] = {}
        self._post_until: dict[str, float] = {}  # broker URL -> loop time
        self._stream_ids = itertools.count(1)
        self._bulk: set[str] = set()  # URLs whose last answer was big: by POST
        self._closing: set[asyncio.Task] = set()  # streams being closed

    def _session_or_new(self) -> aiohttp.ClientSession:
        if self._closed:
            raise KraftlogError("CLIENT_CLOSED", "the client is closed")
        if self._session is None:
            connector = aiohttp.TCPConnector(limit=self.connections_max, limit_per_host=0,
                                             ssl=self.security.ssl_context or True)
            headers = {"Accept": MSGPACK}
            if self.security.authorization:
                headers["Authorization"] = self.security.authorization
            if self.client_id:
                headers[CLIENT_ID_HEADER] = self.client_id
            self._session = aiohttp.ClientSession(
                connector=connector, skip_auto_headers=("User-Agent",), headers=headers)
        return self._session

    async def request(self, base_url: str, path: str, body: Any = None, *,
                      timeout_ms: int | None = None, method: str = "POST",
                      pieces: bool = True) -> Any:
        """Send ``body`` (msgpack) to ``base_url + path``; the decoded answer.
        ``pieces``: as ``wire.msgpack_body`` takes it.

        Raises ``KraftlogError``: the broker's error for a non-2xx answer,
        ``BROKER_NOT_AVAILABLE`` when the connection fails,
        ``REQUEST_TIMED_OUT`` when ``timeout_ms`` (default the client's
        ``request_timeout_ms``) passes.
        """
        session = self._session_or_new()
        timeout_s = (timeout_ms or self.request_timeout_ms) / 1000
        url = base_url + path
        if self.security.scheme == "https" and url.startswith("http://"):
            # A URL the cluster handed out (a broker, a coordinator, a
            # leader) that is plain: never send an SSL client's data there.
            raise SslAuthenticationError(
                f"{url} is a plain HTTP listener, and this client is configured for "
                "security_protocol='SSL': it sends nothing unencrypted. Every broker's "
                "listener must be SSL (listener.security.protocol.map)")
        if method == "POST" and path in STREAMED_PATHS and self.streams_enabled \
                and url not in self._bulk and _records_bytes(body) <= STREAM_REQUEST_BYTES_MAX:
            request_id = next(self._stream_ids)
            data = msgpack.packb({"id": request_id, "path": path, "body": body},
                                 use_bin_type=True)
            if len(data) <= STREAM_REQUEST_BYTES_MAX:
                stream = await self._stream(base_url, timeout_s)
                if stream is not None:
                    return await self._call(stream, base_url, url, request_id, data, timeout_s)
        data = None
        headers = None
        if method == "POST":
            # Batches of megabytes go as they are, not copied into the body.
            data = wire.msgpack_body(body, pieces)
            headers = {"Content-Type": MSGPACK}
        try:
            async with session.request(method, url, data=data, headers=headers,
                                       timeout=aiohttp.ClientTimeout(total=timeout_s)) as resp:
                if resp.content_length is not None and resp.content_length > RESPONSE_BYTES_MAX:
                    raise KraftlogError("UNKNOWN_SERVER_ERROR",
                                        f"{url} answered {resp.content_length} bytes, more "
                                        f"than the client's limit of {RESPONSE_BYTES_MAX}")
                raw = await resp.read()
                status = resp.status
                content_type = resp.content_type
        except asyncio.TimeoutError:
            raise RequestTimedOutError(
                f"{method} {url} got no answer within {timeout_s * 1000:.0f} ms") from None
        except (aiohttp.ClientSSLError, aiohttp.ClientConnectorCertificateError) as exc:
            if not _refused_handshake(exc):  # the broker went away mid-handshake: retriable
                raise BrokerNotAvailableError(
                    f"{method} {url} failed during the TLS handshake: {exc}") from None
            raise SslAuthenticationError(
                f"{method} {url}: the TLS handshake failed: {exc}. Check that the broker's "
                "listener is SSL, that ssl_cafile holds the CA that signed its certificate, "
                "that the certificate has not expired and names this host, and that "
                "ssl_certfile is set if the broker requires client certificates") from None
        except aiohttp.ServerDisconnectedError as exc:
            refusal = await _plain_to_tls(url)  # a misconfiguration: not worth retrying
            if refusal is not None:
                raise refusal from None
            raise BrokerNotAvailableError(
                f"{method} {url} failed: {type(exc).__name__}: {exc}") from None
        except (aiohttp.ClientError, OSError) as exc:
            raise BrokerNotAvailableError(
                f"{method} {url} failed: {type(exc).__name__}: {exc}") from None
        if url in self._bulk and len(raw) <= STREAM_REQUEST_BYTES_MAX:
            self._bulk.discard(url)  # small again: back to the stream
        answer = _decode(raw, content_type)
        if 200 <= status < 300:
            if answer is _UNDECODABLE:
                raise KraftlogError("UNKNOWN_SERVER_ERROR",
                                    f"{url} answered {status} with an undecodable "
                                    f"{content_type or 'untyped'} body")
            return answer
        raise _status_error(url, status, answer, raw)

    async def _stream(self, base_url: str, timeout_s: float) -> TaggedStream | None:
        """The open stream to the broker at ``base_url``, opened if need
        be; None for one to send POSTs to instead. A stream unused for
        STREAM_IDLE_S is replaced (the broker may be closing it as idle)."""
        loop = asyncio.get_running_loop()
        stream = self._streams.get(base_url)
        if stream is not None and stream.open and (
                stream.waiting or loop.time() - stream.last_used < STREAM_IDLE_S):
            return stream
        if self._post_until.get(base_url, 0.0) > loop.time():
            return None
        async with self._opening.setdefault(base_url, asyncio.Lock()):
            stream = self._streams.get(base_url)
            if stream is not None and stream.open and (
                    stream.waiting or loop.time() - stream.last_used < STREAM_IDLE_S):
                return stream
            self._drop(base_url)
            try:
                async with asyncio.timeout(timeout_s):
                    socket = await self._session_or_new().ws_connect(
                        base_url + CLIENT_STREAM_PATH, compress=0,
                        max_msg_size=RESPONSE_BYTES_MAX, autoping=True,
                        heartbeat=STREAM_HEARTBEAT_S,
                        timeout=aiohttp.ClientWSTimeout(ws_close=STREAM_CLOSE_S))
            except aiohttp.WSServerHandshakeError:
                # No stream there (404: an older broker) or refused (401,
                # 403, 503...): POSTs, whose answers say why in full.
                self._post_until[base_url] = loop.time() + POST_ONLY_S
                return None
            except asyncio.TimeoutError:
                raise RequestTimedOutError(
                    f"opening the stream to {base_url} took more than "
                    f"{timeout_s * 1000:.0f} ms") from None
            except (aiohttp.ClientError, OSError):
                return None  # the POST meets the same failure and names it
            stream = self._streams[base_url] = TaggedStream(socket, "client-stream")
            return stream

    def _forget(self, base_url: str, stream: TaggedStream) -> None:
        """``stream`` failed: closed, and no longer the one to ``base_url``
        (unless another has replaced it already)."""
        if self._streams.get(base_url) is stream:
            del self._streams[base_url]
        self._close_later(stream)

    def _close_later(self, stream: TaggedStream) -> None:
        task = asyncio.get_running_loop().create_task(stream.close())
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    async def _call(self, stream: TaggedStream, base_url: str, url: str, request_id: int,
                    data: bytes, timeout_s: float) -> Any:
        """One request over ``stream``: its answer, or the error a POST of
        it would have raised."""
        try:
            async with asyncio.timeout(timeout_s):
                tagged, size = await stream.call(request_id, data)
        except asyncio.TimeoutError:
            # This request only: the others on the stream go on (a broker
            # gone is noticed by the stream's heartbeat).
            raise RequestTimedOutError(
                f"POST {url} (over the stream) got no answer within {timeout_s * 1000:.0f} ms"
            ) from None
        except StreamClosedError as exc:
            if exc.close_code == aiohttp.WSCloseCode.MESSAGE_TOO_BIG:
                # Over the broker's socket.request.max.bytes: sent again by
                # POST, it is answered MESSAGE_TOO_LARGE, by name.
                self._post_until[base_url] = asyncio.get_running_loop().time() + POST_ONLY_S
            raise BrokerNotAvailableError(f"POST {url} (over the stream) failed: {exc}") from None
        except (aiohttp.ClientError, OSError) as exc:
            self._forget(base_url, stream)
            raise BrokerNotAvailableError(
                f"POST {url} (over the stream) failed: {type(exc).__name__}: {exc}") from None
        if size > STREAM_REQUEST_BYTES_MAX:
            self._bulk.add(url)
        status, answer = tagged.get("status"), tagged.get("answer")
        if isinstance(status, int) and 200 <= status < 300 and isinstance(answer, dict):
            return answer
        raise _status_error(url, status if isinstance(status, int) else 0, answer,
                            repr(tagged).encode())

    def _drop(self, base_url: str) -> None:
        stream = self._streams.pop(base_url, None)
        if stream is not None:
            self._close_later(stream)

    async def close(self) -> None:
        self._closed = True
        streams, self._streams = list(self._streams.values()), {}
        await asyncio.gather(*self._closing, *(stream.close() for stream in streams),
                             return_exceptions=True)
        if self._session is not None:
            session, self._session = self._session, None
            await session.close()


def _records_bytes(body: Any) -> int:
    """The bytes of record batches in a produce body (0 for anything
    else): a lower bound of its packed size, known without packing it."""
    partitions = body.get("partitions") if isinstance(body, dict) else None
    if not isinstance(partitions, list):
        return 0
    return sum(len(p.get("records") or b"") for p in partitions if isinstance(p, dict))


_UNDECODABLE = object()
#: How long ``_plain_to_tls`` gives its probe.
TLS_PROBE_TIMEOUT_S = 2.0


def _refused_handshake(exc: Exception) -> bool:
    """Whether a failed TLS handshake was a refusal (a certificate that
    does not verify, an alert from the server, TLS spoken to a plain port),
    which will fail the same way again, rather than the connection going
    away in the middle (a broker killed or restarting)."""
    if isinstance(exc, aiohttp.ClientConnectorCertificateError):
        return True
    cause = getattr(exc, "os_error", None) or exc.__cause__ or exc
    reason = (getattr(cause, "reason", None) or str(cause)).upper()
    return ("CERTIFICATE" in reason or "ALERT" in reason or "WRONG_VERSION" in reason
            or "UNKNOWN_PROTOCOL" in reason or "RECORD_LAYER" in reason
            or "HTTP_REQUEST" in reason)


async def _plain_to_tls(url: str) -> SslAuthenticationError | None:
    """After a plain HTTP connection to ``url`` was closed: if the port
    speaks TLS (a handshake with it completes), the error that says so;
    None otherwise (a broker going away, say: worth retrying)."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme != "http":
        return None
    probe = ssl.create_default_context()
    probe.check_hostname, probe.verify_mode = False, ssl.CERT_NONE
    try:
        _, writer = await asyncio.wait_for(
            asyncio.open_connection(parts.hostname, parts.port or 80, ssl=probe),
            TLS_PROBE_TIMEOUT_S)
    except (OSError, asyncio.TimeoutError, ssl.SSLError):
        return None
    writer.close()
    return SslAuthenticationError(
        f"{url} speaks TLS (its listener is SSL) and closed this plain HTTP connection: "
        "use https:// or security_protocol='SSL' with ssl_cafile")


def _decode(raw: bytes, content_type: str) -> Any:
    try:
        if content_type == MSGPACK:
            return msgpack.unpackb(raw, raw=False, strict_map_key=False)
        if content_type == "application/json":
            return json.loads(raw)
    except Exception:  # both libraries raise several unrelated types
        return _UNDECODABLE
    return _UNDECODABLE


def _status_error(url: str, status: int, answer: Any, raw: bytes) -> KraftlogError:
    if isinstance(answer, dict) and isinstance(answer.get("error"), dict):
        return error_from(answer)
    text = raw[:200].decode("utf-8", "replace")
    if status in (502, 503, 504):
        return BrokerNotAvailableError(f"{url} answered HTTP {status}: {text}")
    return KraftlogError("UNKNOWN_SERVER_ERROR", f"{url} answered HTTP {status}: {text}")


class PartitionLeader(NamedTuple):
    """Who leads a partition, as far as the client knows. ``url`` is None
    while it has no (live) leader."""

    leader_id: int
    leader_epoch: int
    url: str | None


class ClusterMetadata:
    """The client's cache of brokers, leaders and partition counts.

    Owned by one client and used from its event loop. ``partition_counts``
    is also read (never written) by the producer's ``send`` in user threads:
    ``apply`` updates each entry in place, so a reader never sees a topic
    vanish and reappear.
    """

    def __init__(self, transport: Transport, bootstrap: str | Iterable[str] = DEFAULT_BOOTSTRAP,
                 *, metadata_max_age_ms: int = 300_000,
                 request_timeout_ms: int | None = None) -> None:
        if metadata_max_age_ms <= 0:
            raise ValueError(f"metadata_max_age_ms must be positive, not {metadata_max_age_ms}")
        self.transport = transport
        self.bootstrap_urls = bootstrap_urls(bootstrap, transport.security.scheme)
        self.metadata_max_age_ms = metadata_max_age_ms
        self.request_timeout_ms = request_timeout_ms
        self.cluster_id: str | None = None
        self.controller_id: int | None = None
        self.brokers: dict[int, str] = {}
        self.partition_counts: dict[str, int] = {}
        #: Topics whose last metadata answer was an error (e.g. unknown).
        self.topic_errors: dict[str, KraftlogError] = {}
        #: Topics the client cares about; each refresh asks for all of them.
        self.topics_wanted: set[str] = set()
        #: Bumped by every ``apply`` and ``learn_leader``: "something changed".
        self.version = 0
        self.updated_ms: int | None = None
        self._leaders: dict[str, dict[int, PartitionLeader]] = {}
        self._update_requested = False
        self._refresh_lock = asyncio.Lock()
        self._next_url = 0

    # -- queries --------------------------------------------------------------
    def leader(self, topic: str, partition: int) -> PartitionLeader | None:
        return self._leaders.get(topic, {}).get(partition)

    def leader_url(self, tp: tuple[str, int]) -> str | None:
        leader = self._leaders.get(tp[0], {}).get(tp[1])
        return leader.url if leader is not None else None

    def partitions(self, topic: str) -> set[int] | None:
        count = self.partition_counts.get(topic)
        return None if count is None else set(range(count))

    def needs_update(self, now_ms: int) -> bool:
        """Whether a refresh is due: asked for, never done, or too old."""
        return (self._update_requested or self.updated_ms is None
                or now_ms - self.updated_ms >= self.metadata_max_age_ms)

    def request_update(self) -> None:
        self._update_requested = True

    # -- pure updates -----------------------------------------------------------
    def apply(self, answer: dict, now_ms: int, *, all_topics: bool = False,
              partial: bool = False) -> None:
        """Take in a ``/v1/metadata`` answer. Topics it does not mention keep
        their entries unless ``all_topics`` says the answer lists every topic
        (then they were deleted). A ``partial`` answer (some topics only)
        leaves the refresh that is due, due."""
        brokers = {}
        for broker in answer.get("brokers") or ():
            brokers[broker["id"]] = str(broker["url"]).rstrip("/")
        self.brokers = brokers
        self.cluster_id = answer.get("cluster_id", self.cluster_id)
        self.controller_id = answer.get("controller_id", self.controller_id)
        seen = set()
        for topic in answer.get("topics") or ():
            name = topic["name"]
            seen.add(name)
            error = error_from(topic.get("error"))
            if error is not None:
                self.topic_errors[name] = error
                self._forget(name)
                continue
            self.topic_errors.pop(name, None)
            partitions = topic.get("partitions") or ()
            leaders = {}
            for p in partitions:
                leader = p.get("leader", -1)
                url = brokers.get(leader) if leader is not None and leader >= 0 else None
                leaders[p["partition"]] = PartitionLeader(
                    -1 if leader is None else leader, p.get("leader_epoch", -1), url)
            self._leaders[name] = leaders
            self.partition_counts[name] = len(partitions)
        if all_topics:
            for name in [n for n in self.partition_counts if n not in seen]:
                self._forget(name)
        if not partial:
            self.updated_ms = now_ms
            self._update_requested = False
        self.version += 1

    def _forget(self, topic: str) -> None:
        self.partition_counts.pop(topic, None)
        self._leaders.pop(topic, None)

    def learn_leader(self, topic: str, partition: int, error: KraftlogError) -> None:
        """Use what a leadership error says about the current leader.

        With a ``leader_url`` hint the partition's leader moves there at once
        (unless the hint's epoch is older than what is known); without one
        the leader is forgotten, so requests wait for the refresh this asks
        for rather than hitting the same wrong broker again.
        """
        self._update_requested = True
        leaders = self._leaders.setdefault(topic, {})
        current = leaders.get(partition)
        details = error.details
        url = details.get("leader_url")
        leader_id = details.get("leader_id")
        epoch = details.get("leader_epoch")
        if isinstance(url, str) and url:
            url = url.rstrip("/")
            if current is not None and epoch is not None and epoch < current.leader_epoch:
                return
            if isinstance(leader_id, int) and leader_id >= 0:
                self.brokers.setdefault(leader_id, url)
            leaders[partition] = PartitionLeader(
                leader_id if isinstance(leader_id, int) else -1,
                epoch if isinstance(epoch, int) else
                (current.leader_epoch if current is not None else -1), url)
        elif current is not None:
            leaders[partition] = current._replace(url=None)
        self.version += 1

    def forget_broker_url(self, url: str) -> None:
        """A broker did not answer: its partitions have no usable leader until
        the next refresh says where they went."""
        self._update_requested = True
        for leaders in self._leaders.values():
            for partition, leader in list(leaders.items()):
                if leader.url == url:
                    leaders[partition] = leader._replace(url=None)
        self.version += 1

    # -- I/O ---------------------------------------------------------------------
    def _candidate_urls(self) -> list[str]:
        """Known brokers first (they are live), then the bootstrap list;
        rotated so a dead first broker is not asked first every time."""
        urls = list(dict.fromkeys([*self.brokers.values(), *self.bootstrap_urls]))
        start = self._next_url % len(urls)
        return urls[start:] + urls[:start]

    async def request_any(self, path: str, body: Any = None, *, method: str = "POST",
                          timeout_ms: int | None = None, retry_timeouts: bool = True) -> Any:
        """Send to the first broker that answers: an unreachable broker (or,
        with ``retry_timeouts``, one that timed out: fine for reads, not for
        writes that may have been applied) moves on to the next one. Other
        errors are raised at once."""
        skip = ("BROKER_NOT_AVAILABLE", "REQUEST_TIMED_OUT") if retry_timeouts else (
            "BROKER_NOT_AVAILABLE",)
        last: KraftlogError | None = None
        for url in self._candidate_urls():
            try:
                return await self.transport.request(
                    url, path, body, method=method,
                    timeout_ms=timeout_ms or self.request_timeout_ms)
            except KraftlogError as exc:
                if exc.code not in skip:
                    raise
                self._next_url += 1
                last = exc
        assert last is not None
        raise last

    async def refresh(self, topics: Iterable[str] | None = None, *,
                      all_topics: bool = False, only: bool = False) -> None:
        """Ask a broker for the metadata of ``topics`` plus every topic
        wanted before (or of all topics), and apply the answer. ``only``:
        of ``topics`` alone, as Kafka's clients learn a new topic (KIP-526),
        so a client taking up topics one at a time does not ask again for
        all it knows each time; the periodic refresh still asks for all."""
        if topics is not None:
            topics = set(topics)
            self.topics_wanted.update(topics)
        async with self._refresh_lock:
            if only and topics:
                wanted = sorted(topics)
            else:
                wanted = None if all_topics else sorted(self.topics_wanted)
            answer = await self.request_any("/v1/metadata", {"topics": wanted})
            self.apply(answer, monotonic_ms(), all_topics=all_topics,
                       partial=only and bool(topics))
