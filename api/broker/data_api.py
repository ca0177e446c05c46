"""Produce, fetch, list offsets and metadata: the broker's data plane over HTTP.

Handlers decode and shape-check the request (``kraft.fields.Fields``: a
wrong field fails the whole request with ``INVALID_REQUEST`` naming it),
hand it to the replication core through the ``ReplicaManager``, and render
its answer: each partition's outcome is its own, so one bad partition never
fails the others (Kafka's per-partition errors). Batches are validated and
appended without decoding records; fetches return stored bytes unchanged.
See docs/protocol.md for every field.

What a produce waits for (``acks=all``: the high watermark), how a
follower's fetch is judged and how long a fetch long-polls are the core's
decisions (``api/broker/replication.py``), not this module's.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
import urllib.parse
from collections.abc import Callable
from typing import Any

import msgpack
from aiohttp import WSCloseCode, WSMsgType, web

from api.broker.metrics import BrokerMetrics
from api.broker.partition import Partition
from api.broker.quotas import (QuotaManager, client_id_of, exempt_from_request_quota,
                               run_counted)
from api.broker.replica_manager import ReplicaManager
from api.broker.replication import (PARTITIONS_PER_REQUEST_MAX, READ_COMMITTED,
                                    READ_UNCOMMITTED, FetchRequest, FetchSpec, MarkerItem,
                                    ProduceItem, broker_url, empty_fetch_result)
from api.broker.authz import topic_filter
from api.broker.fetcher import REPLICA_STREAM_PATH, STREAM_FETCHES_MAX
from kraft.authorizer import RequestAuth, auth_of
from kraft.image import TopicImage
from protocol import acl, wire
from protocol.quotas import CONSUMER_BYTE_RATE, PRODUCER_BYTE_RATE, REQUEST_PERCENTAGE
from protocol.tls import RECHECK_KEY, principal_of, require_node_or_plain
from protocol.errors import (ClusterAuthorizationFailedError, CodedError, InvalidRequestError,
                             InvalidRequiredAcksError, InvalidTopicError, KraftError,
                             SaslAuthenticationError, TransactionalIdAuthorizationFailedError)
from protocol.fetch_session import NO_SESSION
from protocol.fields import Fields
from protocol.stream import (CLIENT_STREAM_PATH, STREAM_CLOSE_S, STREAM_HEARTBEAT_S,
                             STREAMED_PATHS)
from storage.batch import RecordFormatError, count_records, iter_batches, iter_records
from storage.manager import TOPIC_NAME_MAX_CHARS, TopicPartition

logger = logging.getLogger(__name__)

INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1
INT16_MAX = 2**15 - 1
PRODUCE_TIMEOUT_MS_MAX = 300_000
#: A client's stream: at most this many of its requests are handled at
#: once; the broker reads no more of them meanwhile.
CLIENT_STREAM_REQUESTS_MAX = 64
#: Stopping, a client's stream gets this long for the requests it carries
#: to be answered before it is closed.
STREAM_DRAIN_S = 2.0
FETCH_MAX_BYTES_DEFAULT = 50 * 1024 * 1024
PARTITION_FETCH_BYTES_DEFAULT = 1024 * 1024
EARLIEST_TIMESTAMP = -2
LATEST_TIMESTAMP = -1


class _OpenStream:
    """A stream being served: the request that opened it, the requests it
    carries being answered, and their bytes."""

    __slots__ = ("request", "finish_requests", "answering", "bytes_in_flight", "last_message")

    def __init__(self, request: web.Request, finish_requests: bool) -> None:
        self.request = request
        self.finish_requests = finish_requests
        self.answering: set[asyncio.Task] = set()
        self.bytes_in_flight = 0
        self.last_message = time.monotonic()

    def done(self, room: asyncio.Semaphore, size: int, _task: asyncio.Task) -> None:
        self.bytes_in_flight -= size
        room.release()


def refuse_other_origins(request: web.Request) -> None:
    """A WebSocket handshake from a web page (it carries ``Origin``) is
    refused unless the page is the broker's own (its console): a browser
    opens a WebSocket to another origin without asking the server first
    (a POST of msgpack it asks about, CORS, and the broker never agrees), so
    any page a user visits could otherwise produce and fetch with the
    user's network reach and certificates."""
    origin = request.headers.get("Origin")
    if origin is not None and urllib.parse.urlsplit(origin).netloc != request.host:
        raise ClusterAuthorizationFailedError(
            f"a web page from {origin[:100]} may not open a stream to this broker; "
            "streams are for clients (a page of the broker's own origin may)")


async def still_authenticated(request: web.Request) -> bool:
    """Whether the credentials ``request`` was authenticated with still
    prove the same user (a stream's, checked at each request it carries,
    as each POST is authenticated). Certificates and plain listeners: yes."""
    recheck = request.get(RECHECK_KEY)
    if recheck is None:
        return True
    return await recheck() == principal_of(request)


def partition_error(exc: Exception, what: str = "request") -> dict:
    """The wire's error entry of one partition. An exception without a code
    is a failure of this broker (a disk error): logged, reported as
    KAFKA_STORAGE_ERROR."""
    if not isinstance(getattr(exc, "code", None), str):
        logger.error("%s failed", what, exc_info=exc)
        exc = _StorageFailure(f"{what} failed: {exc}")
    return wire.error_body(exc)["error"]


def render_results(api: str, results: list[dict],
                   on_error: Callable[[str], None] = lambda code: None) -> list[dict]:
    """The core's per-partition results as the wire carries them: each
    exception becomes its error entry (``on_error`` sees its code)."""
    for result in results:
        error = result.get("error")
        if isinstance(error, Exception):
            what = f"{api} of {result.get('topic')}-{result.get('partition')}"
            result["error"] = partition_error(error, what)
            on_error(result["error"]["code"])
    return results


def decode_fetch(values: dict) -> FetchRequest:
    """A fetch request body (see docs/protocol.md) as the core's
    ``FetchRequest``; a wrong field fails it with INVALID_REQUEST naming it."""
    body = Fields(values, "")
    max_wait_ms = body.integer("max_wait_ms", 0, INT32_MAX, default=500)
    min_bytes = body.integer("min_bytes", 0, INT32_MAX, default=1)
    max_bytes = body.integer("max_bytes", 1, INT32_MAX, default=FETCH_MAX_BYTES_DEFAULT)
    replica_id = body.integer("replica_id", -1, INT32_MAX, default=-1)
    replica_epoch = body.integer("replica_epoch", -1, INT64_MAX, default=-1)
    isolation = _isolation_level(body)
    specs = []
    for i, item in enumerate(body.sequence("partitions", PARTITIONS_PER_REQUEST_MAX)):
        fields = Fields(item, f"partitions[{i}]")
        specs.append(FetchSpec(
            TopicPartition(fields.string("topic", TOPIC_NAME_MAX_CHARS),
                           fields.integer("partition", 0, INT32_MAX)),
            fields.integer("offset", -INT64_MAX, INT64_MAX),
            fields.integer("max_bytes", 1, INT32_MAX, default=PARTITION_FETCH_BYTES_DEFAULT),
            _leader_epoch(fields),
            fields.integer("last_fetched_epoch", -1, INT32_MAX, default=-1)))
    session_id = body.integer("session_id", 0, INT32_MAX, default=0)
    session_epoch = body.integer("session_epoch", NO_SESSION, INT32_MAX, default=NO_SESSION)
    forgotten = []
    for i, item in enumerate(body.sequence("forgotten", PARTITIONS_PER_REQUEST_MAX,
                                           default=[])):
        fields = Fields(item, f"forgotten[{i}]")
        forgotten.append(TopicPartition(fields.string("topic", TOPIC_NAME_MAX_CHARS),
                                        fields.integer("partition", 0, INT32_MAX)))
    fetcher = body.integer("fetcher", 0, INT32_MAX, default=0)
    return FetchRequest(replica_id, specs, max_wait_ms, min_bytes, max_bytes, isolation,
                        session_id, session_epoch, forgotten, fetcher, replica_epoch)


ISOLATION_LEVELS = {"read_uncommitted": READ_UNCOMMITTED, "read_committed": READ_COMMITTED,
                    READ_UNCOMMITTED: READ_UNCOMMITTED, READ_COMMITTED: READ_COMMITTED}


def _isolation_level(body: Fields) -> int:
    """``isolation_level``: "read_uncommitted" (default, as Kafka's) or
    "read_committed", or Kafka's numbers 0 and 1."""
    value = body.values.get("isolation_level", READ_UNCOMMITTED)
    if isinstance(value, bool) or value not in ISOLATION_LEVELS:
        raise InvalidRequestError(
            f"isolation_level must be \"read_uncommitted\" or \"read_committed\", not "
            f"{value!r}")
    return ISOLATION_LEVELS[value]


class DataApi:
    def __init__(self, replicas: ReplicaManager, metrics: BrokerMetrics,
                 is_serving: Callable[[], str | None], cluster_id: str,
                 controller_id: Callable[[], int | None],
                 metadata_ready: Callable[[], bool] = lambda: True) -> None:
        self.replicas = replicas
        self.metrics = metrics
        self.cluster_id = cluster_id
        self.controller_id = controller_id
        # Callable: None when the broker may serve data, else the reason it
        # may not (still fenced, stopping).
        self.is_serving = is_serving
        # Callable: whether the metadata image has caught up with the
        # controller's log since start-up. Before that the image is partial
        # (topics missing), and a client would take it for the cluster's.
        self.metadata_ready = metadata_ready
        #: Told of every marker this broker appended and committed (the group
        #: coordinator materialises transactional offsets on COMMIT).
        self.marker_listeners: list[Callable[[MarkerItem], None]] = []
        #: Client quotas (api/broker/quotas.py); None: none enforced.
        self.quotas: QuotaManager | None = None
        #: Topics only their coordinators write (set by the server).
        self.internal_topics: frozenset[str] = frozenset()
        #: KIP-890: ``verify_txn(transactional_id, producer_id, epoch, tps)``
        #: asks the transaction coordinator whether the partitions are in the
        #: producer's open transaction (raises if not). Set by the server.
        self.verify_txn: Callable[..., Any] | None = None
        # (topic, eligible) -> (its registrations, its partitions rendered):
        # ``_partitions_of``'s cache.
        self._rendered: dict[tuple[str, bool], tuple[tuple, list[dict]]] = {}
        #: Streams open now (followers' and clients'), each with the
        #: request that opened it (closed when the broker stops).
        self._streams: dict[web.WebSocketResponse, _OpenStream] = {}

    async def wait_turn(self, request: web.Request, key: str) -> None:
        """Hold a produce (or a consumer's fetch) until its quota entity's
        last throttle is over: the longer of its byte-rate (``key``) and
        request-time holds (the middleware leaves these routes' holding here)."""
        if self.quotas is not None:
            user, client_id = principal_of(request), client_id_of(request)
            wait_s = max(self.quotas.hold_for(key, user, client_id),
                         self.quotas.hold_for(REQUEST_PERCENTAGE, user, client_id))
            if wait_s > 0:
                await asyncio.sleep(wait_s)

    def throttle(self, request: web.Request, key: str, amount: float) -> int:
        """Count ``amount`` against the client's quota ``key``: the
        milliseconds its next request will wait (the data is already
        appended or read: nothing is dropped)."""
        if self.quotas is None or amount <= 0:
            return 0
        return self.quotas.record(key, principal_of(request), client_id_of(request), amount)

    def add_routes(self, app: web.Application) -> None:
        app.router.add_post("/v1/produce", self.handle_produce)
        app.router.add_post("/v1/fetch", self.handle_fetch)
        app.router.add_post("/v1/offsets", self.handle_list_offsets)
        app.router.add_post("/v1/txn/markers", self.handle_write_markers)
        app.router.add_post("/v1/metadata", self.handle_metadata)
        app.router.add_get("/v1/metadata", self.handle_metadata)
        app.router.add_get(REPLICA_STREAM_PATH, self.handle_replica_stream)
        app.router.add_get(CLIENT_STREAM_PATH, self.handle_client_stream)
        app.on_shutdown.append(self._close_streams)

    def _render(self, api: str, results: list[dict]) -> list[dict]:
        return render_results(
            api, results, lambda code: self.metrics.partition_errors.inc(1, api, code))

    # -- produce ---------------------------------------------------------------
    async def handle_produce(self, request: web.Request) -> web.Response:
        await self.wait_turn(request, PRODUCER_BYTE_RATE)
        return wire.respond(request, await self.produce(request, await wire.read_body(request)))

    async def produce(self, request: web.Request, raw_body: dict) -> dict:
        """The answer to a produce whose body is ``raw_body``, from the
        client that made ``request`` (its POST, or the handshake of its
        stream), its quota's hold already waited out."""
        body = Fields(raw_body, "")
        acks = body.values.get("acks", 1)
        if acks == "all":
            acks = -1
        if acks not in (-1, 0, 1) or isinstance(acks, bool):
            raise InvalidRequiredAcksError(f"acks must be 0, 1, -1 or \"all\", got {acks!r}")
        timeout_ms = body.integer("timeout_ms", 0, PRODUCE_TIMEOUT_MS_MAX, default=30_000)
        items = []
        for i, item in enumerate(body.sequence("partitions", PARTITIONS_PER_REQUEST_MAX)):
            fields = Fields(item, f"partitions[{i}]")
            records = fields.required("records")
            if not isinstance(records, (bytes, bytearray)):
                raise InvalidRequestError(
                    f"partitions[{i}].records must be binary (msgpack bin) record batches, "
                    f"got {type(records).__name__}")
            items.append(ProduceItem(
                TopicPartition(fields.string("topic", TOPIC_NAME_MAX_CHARS),
                               fields.integer("partition", 0, INT32_MAX)),
                _leader_epoch(fields), records))
        refused = self.refused_writes(auth_of(request), body.values.get("transactional_id"),
                                      items)
        refused.update(await self.verify_transaction(
            body, [item for item in items if item.tp not in refused]))
        results, appended = await self.replicas.produce(
            [item for item in items if item.tp not in refused], acks, timeout_ms)
        results += [{"topic": tp.topic, "partition": tp.partition, "error": error}
                    for tp, error in refused.items()]
        for topic, info in appended:
            self.metrics.bytes_in.inc(info.size_bytes, topic)
            self.metrics.messages_in.inc(info.record_count, topic)
        throttle_ms = self.throttle(request, PRODUCER_BYTE_RATE,
                                    sum(len(item.records) for item in items))
        return {"partitions": self._render("produce", results), "throttle_time_ms": throttle_ms}

    def refused_writes(self, auth: RequestAuth, tid: Any, items: list[ProduceItem]
                       ) -> dict[TopicPartition, Exception]:
        """What a produce may not write. The internal topics take only their
        coordinators' writes, whoever asks (as Kafka refuses them). With
        ACLs, Kafka's order: transactional records need WRITE on the
        transactional id they come with (or the whole request is refused),
        then each topic needs WRITE (its partitions are refused, the others
        appended). ``tid``: the transactional id the request names, if any
        (the Kafka listener asks too)."""
        refused: dict[TopicPartition, Exception] = {
            item.tp: InvalidTopicError(f"{item.tp.topic} is an internal topic: only its "
                                       "coordinator writes to it")
            for item in items if item.tp.topic in self.internal_topics}
        if not auth.enabled:
            return refused
        if any(map(_has_transactional_batch, items)):
            if not isinstance(tid, str) or not tid:
                raise TransactionalIdAuthorizationFailedError(
                    "transactional records come with the transactional_id they are written "
                    "under, which the caller must be allowed to WRITE")
            auth.require(acl.WRITE, acl.TRANSACTIONAL_ID, tid)
        may_write = topic_filter(auth, acl.WRITE)
        for item in items:
            if item.tp not in refused and not may_write(item.tp.topic):
                refused[item.tp] = auth.refusal(acl.WRITE, acl.TOPIC, item.tp.topic)
        return refused

    async def verify_transaction(self, body: Fields, items: list[ProduceItem]
                                  ) -> dict[TopicPartition, Exception]:
        """KIP-890: before a transaction's first write to a partition led
        here, ask its coordinator that the partition is in the producer's
        open transaction, and guard the partition (the marker clears the
        guard). Returns the partitions refused, with why."""
        opening: dict[tuple[int, int], list[ProduceItem]] = {}
        for item in items:
            part = self.replicas.partitions.get(item.tp)
            if part is None or not part.is_leader:
                continue
            needed = part.needs_verification(item.records)
            if needed is not None and part.txn_guards.get(needed[0]) != needed[1]:
                opening.setdefault(needed, []).append(item)
        if not opening:
            return {}
        tid = body.values.get("transactional_id")
        refused: dict[TopicPartition, Exception] = {}
        for (pid, epoch), group in opening.items():
            if not isinstance(tid, str) or not tid or self.verify_txn is None:
                continue  # refused by the core, which names what is missing
            try:
                await self.verify_txn(tid, pid, epoch, [item.tp for item in group])
            except Exception as exc:  # noqa: BLE001  each partition answers for itself
                for item in group:
                    refused[item.tp] = exc
                continue
            for item in group:
                part = self.replicas.partitions.get(item.tp)
                if part is not None:
                    part.txn_guards[pid] = epoch
        return refused

    # -- transaction markers (from transaction coordinators) ----------------------
    async def handle_write_markers(self, request: web.Request) -> web.Response:
        """WriteTxnMarkers: append a COMMIT or ABORT marker for a producer in
        each partition this broker leads, answered once committed."""
        if not auth_of(request).enabled:  # with ACLs: CLUSTER_ACTION, by the middleware
            require_node_or_plain(request, "writing transaction markers")
        body = Fields(await wire.read_body(request), "")
        timeout_ms = body.integer("timeout_ms", 0, PRODUCE_TIMEOUT_MS_MAX, default=30_000)
        items = []
        for i, item in enumerate(body.sequence("markers", PARTITIONS_PER_REQUEST_MAX)):
            fields = Fields(item, f"markers[{i}]")
            items.append(MarkerItem(
                TopicPartition(fields.string("topic", TOPIC_NAME_MAX_CHARS),
                               fields.integer("partition", 0, INT32_MAX)),
                fields.integer("producer_id", 0, INT64_MAX),
                fields.integer("producer_epoch", 0, INT16_MAX),
                fields.integer("coordinator_epoch", 0, INT32_MAX),
                fields.boolean("committed")))
        results = await self.replicas.write_markers(items, timeout_ms)
        for item, result in zip(items, results):
            if result["error"] is None:
                for listener in self.marker_listeners:
                    listener(item)
        return wire.respond(request, {"markers": self._render("markers", results)})

    async def append_committed(self, part: Partition, records: bytes, timeout_ms: int,
                               coordinator: bool = False) -> int:
        """Append ``records`` as leader and wait until they are committed, as
        an acks=all produce does (the group coordinator's writes to
        ``__consumer_offsets``); the base offset. Raises the produce error."""
        result, info = await self.replicas.append_committed(part, records, timeout_ms,
                                                            coordinator)
        if result["error"] is not None:
            error = partition_error(result["error"], f"write to {part.tp}")
            raise CodedError(error["code"], error["message"])
        return info.base_offset

    # -- fetch -----------------------------------------------------------------
    async def handle_fetch(self, request: web.Request) -> web.Response:
        if wire.response_type(request) != wire.MSGPACK:
            raise InvalidRequestError(
                "fetch answers with raw record batches, which only msgpack can carry: send "
                f"Accept: {wire.MSGPACK} (people can read records with GET "
                "/topics/{topic}/partitions/{p}/records)")
        fetch = decode_fetch(await wire.read_body(request))
        if fetch.replica_id < 0:
            await self.wait_turn(request, CONSUMER_BYTE_RATE)
            return wire.respond(request, await self.consumer_fetch(request, fetch))
        self._require_follower(request)
        exempt_from_request_quota(request)
        return wire.respond(request, await self._answer_follower(fetch))

    @staticmethod
    def _require_follower(request: web.Request) -> None:
        """A follower's fetch (unthrottled, and it reads past the high
        watermark) is for the cluster's nodes: CLUSTER_ACTION with ACLs;
        without, no password user."""
        auth = auth_of(request)
        if auth.enabled:
            auth.require(acl.CLUSTER_ACTION, acl.CLUSTER, what="a follower's fetch")
        else:
            require_node_or_plain(request, "a follower's fetch (replica_id >= 0)")

    async def consumer_fetch(self, request: web.Request, fetch: FetchRequest) -> dict:
        """The answer to a consumer's ``fetch`` from the client that made
        ``request`` (its POST, or the handshake of its stream), its quota's
        hold already waited out."""
        auth = auth_of(request)
        refused: list[dict] = []
        may_read = None
        # A consumer's fetch session is its own: another client naming its
        # id finds none.
        fetch.owner = f"{principal_of(request)}\0{client_id_of(request)}"
        if auth.enabled:
            may_read = topic_filter(auth, acl.READ)
            for spec in fetch.specs:
                if not may_read(spec.tp.topic):
                    refused.append(dict(empty_fetch_result(spec), error=auth.refusal(
                        acl.READ, acl.TOPIC, spec.tp.topic)))
            if refused:
                fetch.specs = [s for s in fetch.specs if may_read(s.tp.topic)]
        fields: dict = {}
        if fetch.session_epoch != NO_SESSION:
            if may_read is not None:
                # The session's partitions not named this time are judged
                # again by the core as it answers them (an ACL removed since
                # counts): the records of one refused go, and so does it.
                fetch.refusal = lambda topic: None if may_read(topic) else auth.refusal(
                    acl.READ, acl.TOPIC, topic)
            answered, fields = await self.replicas.fetch_in_session(fetch)
        else:
            answered = await self.replicas.fetch(fetch) if fetch.specs or not refused else []
        results = self._render("fetch", answered + refused)
        fetched = 0
        for result in results:
            records = result["records"]
            if records:
                fetched += len(records)
                self.metrics.bytes_out.inc(len(records), result["topic"])
                self.metrics.messages_out.inc(count_records(records), result["topic"])
        throttle_ms = self.throttle(request, CONSUMER_BYTE_RATE, fetched)
        return {"partitions": results, "throttle_time_ms": throttle_ms, **fields}

    async def _answer_follower(self, fetch: FetchRequest) -> dict:
        """A follower's fetch answered (unthrottled: client quotas are for
        clients), over POST /v1/fetch or the follower's stream."""
        fields: dict = {}
        if fetch.session_epoch != NO_SESSION:  # a follower's session: answered whatever
            answered, fields = await self.replicas.fetch_in_session(fetch)
        else:
            answered = await self.replicas.fetch(fetch)
        return {"partitions": self._render("fetch", answered), "throttle_time_ms": 0, **fields}

    # -- followers' fetch stream -------------------------------------------------
    async def handle_replica_stream(self, request: web.Request) -> web.StreamResponse:
        """GET /v1/replica/fetch-stream: a follower's fetches from this
        leader over one WebSocket. Each binary message is msgpack
        ``{"id": int, "fetch": <the body of POST /v1/fetch>}``, answered by
        ``{"id": int, "answer": <what POST /v1/fetch answers>}`` once the
        fetch is answered, in any order. The same fetches as POST
        /v1/fetch with ``replica_id``, without an HTTP exchange each (a
        seventh of its CPU on this machine). Who may open it: as for a
        follower's fetch (with ACLs, CLUSTER_ACTION, checked by the
        middleware at the handshake and again at each fetch). A message of
        any other shape closes the stream."""
        auth = auth_of(request)
        if not auth.enabled:
            require_node_or_plain(request, "a follower's fetch stream")
        exempt_from_request_quota(request)
        # A follower sends one fetch per fetcher at once.
        return await self._serve_stream(
            request, lambda stream, data: self._stream_fetch(stream, data, auth),
            STREAM_FETCHES_MAX, idle_s=None, finish_requests=False)

    def stream_counts(self) -> dict[str, int]:
        """Streams open now: clients' and followers'."""
        clients = sum(1 for open_ in self._streams.values() if open_.finish_requests)
        return {"client_streams": clients, "follower_streams": len(self._streams) - clients}

    async def _serve_stream(self, request: web.Request, answer: Callable[..., Any],
                            in_flight_max: int, idle_s: float | None,
                            finish_requests: bool) -> web.WebSocketResponse:
        """Accept the WebSocket ``request`` asks for and hand each binary
        message to ``answer(stream, data)``, at most ``in_flight_max`` at
        once and, together, at most socket.request.max.bytes of them: a
        caller that sends more (or stops reading the answers) waits, instead
        of the broker buffering for it. A message of another type closes the
        stream, and so does ``idle_s`` without a message (None: never). A
        handshake from a web page of another origin is refused (browsers
        open WebSockets across origins without asking). When the stream
        closes, the requests still being answered are cancelled, or with
        ``finish_requests`` carried out (as a POST whose client left is:
        appended, counted against quotas), their answers dropped."""
        refuse_other_origins(request)
        bytes_max = request.app[wire.BODY_BYTES_MAX_KEY]
        stream = web.WebSocketResponse(compress=False, max_msg_size=bytes_max,
                                       heartbeat=STREAM_HEARTBEAT_S)
        await stream.prepare(request)
        open_ = _OpenStream(request, finish_requests)
        self._streams[stream] = open_
        answering = open_.answering
        room = asyncio.Semaphore(in_flight_max)
        watch = None if idle_s is None else asyncio.create_task(
            self._close_when_idle(stream, open_, idle_s))
        try:
            async for message in stream:
                if message.type is not WSMsgType.BINARY:
                    await stream.close(code=WSCloseCode.UNSUPPORTED_DATA,
                                       message=b"binary msgpack messages only")
                    break
                open_.last_message = time.monotonic()
                size = len(message.data)
                while answering and open_.bytes_in_flight + size > bytes_max:
                    await asyncio.wait(list(answering), return_when=asyncio.FIRST_COMPLETED)
                await room.acquire()
                open_.bytes_in_flight += size
                task = asyncio.create_task(answer(stream, message.data))
                answering.add(task)
                task.add_done_callback(answering.discard)
                task.add_done_callback(functools.partial(open_.done, room, size))
        finally:
            self._streams.pop(stream, None)
            if watch is not None:
                watch.cancel()
            if not finish_requests:
                for task in answering:
                    task.cancel()
            await asyncio.gather(*answering, return_exceptions=True)
        return stream

    @staticmethod
    async def _close_when_idle(stream: web.WebSocketResponse, open_: "_OpenStream",
                               idle_s: float) -> None:
        """Close ``stream`` once it has had no message for ``idle_s`` and
        answers none (its pings do not count): connections.max.idle.ms, as
        for an HTTP connection between requests."""
        while not stream.closed:
            await asyncio.sleep(max(0.0, open_.last_message + idle_s - time.monotonic()))
            if not open_.answering and time.monotonic() - open_.last_message >= idle_s:
                await stream.close(code=WSCloseCode.OK,
                                   message=b"idle for connections.max.idle.ms")
                return
            if open_.answering:
                open_.last_message = time.monotonic()  # busy: idle from now at the earliest

    # -- clients' stream -------------------------------------------------------
    async def handle_client_stream(self, request: web.Request) -> web.StreamResponse:
        """GET /v1/stream: a client's produces and consumer fetches over one
        WebSocket. Each binary message is msgpack ``{"id": int, "path":
        "/v1/produce" | "/v1/fetch", "body": <the body of POST <path>>}``,
        answered by ``{"id": int, "status": <the HTTP status POST <path>
        would have>, "answer": <what it would answer>}`` once it is answered,
        in any order. The same requests, checked the same way (the caller's
        credentials again, ACLs, quotas and limits, at each request),
        without an HTTP exchange each. A message that is not such a map
        closes the stream (1003), one over socket.request.max.bytes too
        (1009), credentials no longer valid (1008), and so does
        connections.max.idle.ms without one (1000)."""
        return await self._serve_stream(
            request, lambda stream, data: self._stream_request(stream, data, request),
            CLIENT_STREAM_REQUESTS_MAX,
            idle_s=request.app.get(wire.BODY_IDLE_MS_KEY, wire.BODY_IDLE_MS_DEFAULT) / 1000,
            finish_requests=True)

    async def _stream_request(self, stream: web.WebSocketResponse, data: bytes,
                              request: web.Request) -> None:
        """One message off a client's stream, its time on the event loop
        (decoding and encoding too) counted against the caller's
        request_percentage, as an HTTP request's is."""
        handling = self._stream_message(stream, data, request)
        if self.quotas is None:
            await handling
        else:
            await run_counted(self.quotas, principal_of(request), client_id_of(request),
                              handling)

    async def _stream_message(self, stream: web.WebSocketResponse, data: bytes,
                              request: web.Request) -> None:
        started = time.perf_counter()
        try:
            message = msgpack.unpackb(data, raw=False, strict_map_key=False)
        except (msgpack.UnpackException, ValueError):
            message = None
        request_id = message.get("id") if isinstance(message, dict) else None
        if not isinstance(request_id, int) or isinstance(request_id, bool):
            await stream.close(code=WSCloseCode.UNSUPPORTED_DATA, message=(
                b'each message is a msgpack map {"id": int, "path": str, "body": map}'))
            return
        path = message.get("path")
        api = path if path in STREAMED_PATHS else "unmatched"
        refused = False
        try:
            refused = not await still_authenticated(request)
            if refused:
                raise SaslAuthenticationError(
                    "the credentials this stream was opened with are no longer valid (a "
                    "password changed, a user or delegation token deleted or expired): "
                    "connect again with valid ones")
            if api == "unmatched":
                raise InvalidRequestError(
                    f"the stream carries {' and '.join(sorted(STREAMED_PATHS))}, not "
                    f"{path!r:.100}; send the others by POST")
            body = message.get("body")
            if not isinstance(body, dict):
                raise InvalidRequestError(
                    f"body must be a map (the body of POST {path}), got {type(body).__name__}")
            answer = await self._streamed(request, path, body)
            status = 200
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001  answered as POST <path> would be
            answer, status = wire.error_answer(exc)
            if status == 500:
                logger.exception("a client's %s over its stream failed", path)
        self.metrics.requests.inc(1, api, str(status))
        self.metrics.latency.observe(time.perf_counter() - started, api)
        if not stream.closed:
            try:
                await stream.send_bytes(msgpack.packb(
                    {"id": request_id, "status": status, "answer": answer}, use_bin_type=True))
                if refused:
                    await stream.close(code=WSCloseCode.POLICY_VIOLATION,
                                       message=b"credentials no longer valid")
            except ConnectionError:
                pass  # the client went away; it asks again over a new stream or by POST

    async def _streamed(self, request: web.Request, path: str, body: dict) -> dict:
        """A produce or a fetch off a client's stream: held for its quota,
        then answered, as its POST would be."""
        if path == "/v1/produce":
            await self.wait_turn(request, PRODUCER_BYTE_RATE)
            return await self.produce(request, body)
        fetch = decode_fetch(body)
        if fetch.replica_id >= 0:  # as over POST: a node's
            self._require_follower(request)
            return await self._answer_follower(fetch)
        await self.wait_turn(request, CONSUMER_BYTE_RATE)
        return await self.consumer_fetch(request, fetch)

    async def _stream_fetch(self, stream: web.WebSocketResponse, data: bytes,
                            auth: RequestAuth) -> None:
        try:
            message = msgpack.unpackb(data, raw=False)
        except (msgpack.UnpackException, ValueError):
            message = None
        request_id = message.get("id") if isinstance(message, dict) else None
        if not isinstance(request_id, int) or isinstance(request_id, bool):
            await stream.close(code=WSCloseCode.UNSUPPORTED_DATA,
                               message=b'each message is a msgpack map {"id": int, "fetch": map}')
            return
        try:
            if auth.enabled:  # each fetch, as over POST: an ACL removed since counts
                auth.require(acl.CLUSTER_ACTION, acl.CLUSTER, what="a follower's fetch")
            fetch = decode_fetch(message.get("fetch"))
            if fetch.replica_id < 0:
                raise InvalidRequestError("the fetch stream carries followers' fetches "
                                          "(replica_id >= 0); consumers POST /v1/fetch")
            answer = await self._answer_follower(fetch)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001  answered as POST /v1/fetch would be
            if not isinstance(getattr(exc, "code", None), str):
                logger.exception("a follower's fetch over its stream failed")
            answer = wire.error_body(exc)
        if not stream.closed:
            try:
                await stream.send_bytes(msgpack.packb({"id": request_id, "answer": answer},
                                                      use_bin_type=True))
            except ConnectionError:
                pass  # the follower went away; it asks again over a new stream

    async def _close_streams(self, app: web.Application) -> None:
        """Stopping: close the streams, which would otherwise hold the
        server's shutdown (followers and clients ask again elsewhere or
        later). A client's stream first gets up to STREAM_DRAIN_S for the
        requests it carries to be answered, as an HTTP request in progress
        gets the server's shutdown timeout. A caller that does not read
        (paused) is cut off after a second."""
        async def close(stream: web.WebSocketResponse, open_: _OpenStream) -> None:
            request = open_.request
            if open_.finish_requests and open_.answering:
                await asyncio.wait(list(open_.answering), timeout=STREAM_DRAIN_S)
            try:
                await asyncio.wait_for(stream.close(code=WSCloseCode.GOING_AWAY,
                                                    message=b"the broker is stopping"),
                                       STREAM_CLOSE_S)
            except (asyncio.TimeoutError, ConnectionError):
                if request.transport is not None:
                    request.transport.abort()
        await asyncio.gather(*(close(stream, open_)
                               for stream, open_ in list(self._streams.items())),
                             return_exceptions=True)

    # -- list offsets ------------------------------------------------------------
    async def handle_list_offsets(self, request: web.Request) -> web.Response:
        body = Fields(await wire.read_body(request), "")
        auth = auth_of(request)
        may_describe = topic_filter(auth)
        results = []
        for i, item in enumerate(body.sequence("partitions", PARTITIONS_PER_REQUEST_MAX)):
            fields = Fields(item, f"partitions[{i}]")
            topic = fields.string("topic", TOPIC_NAME_MAX_CHARS)
            partition = fields.integer("partition", 0, INT32_MAX)
            timestamp = fields.integer("timestamp", -2, INT64_MAX)
            epoch = _leader_epoch(fields)
            isolation = _isolation_level(body)
            result = {"topic": topic, "partition": partition, "error": None,
                      "offset": -1, "timestamp": -1}
            try:
                if not may_describe(topic):
                    raise auth.refusal(acl.DESCRIBE, acl.TOPIC, topic)
                part = self.replicas.leader_partition(topic, partition, epoch)
                result["offset"], result["timestamp"] = offset_for(part, timestamp, isolation)
            except Exception as exc:  # noqa: BLE001  each partition answers for itself
                result["error"] = exc
            results.append(result)
        return wire.respond(request, {"partitions": self._render("offsets", results)},
                            pieces=False)

    # -- metadata ----------------------------------------------------------------
    def check_metadata_current(self) -> None:
        """Refuse to describe the cluster from an image that may be wrong: a
        partial one (still replaying the metadata log after a start) or a
        stale one (fenced: cut off from the controller). Clients move on to
        another broker on BROKER_NOT_AVAILABLE."""
        if not self.metadata_ready():
            raise CodedError("BROKER_NOT_AVAILABLE",
                             f"broker {self.replicas.broker_id} is still loading the cluster "
                             "metadata; ask another broker or retry shortly")
        reason = self.is_serving()
        if reason is not None:
            raise CodedError("BROKER_NOT_AVAILABLE",
                             f"broker {self.replicas.broker_id} may have stale metadata: "
                             f"{reason}; ask another broker")

    async def handle_metadata(self, request: web.Request) -> web.Response:
        self.check_metadata_current()
        if request.method == "GET":
            raw = request.query.get("topics")
            names = [n for n in raw.split(",") if n] if raw else None
        else:
            body = Fields(await wire.read_body(request), "")
            names = body.strings("topics", PARTITIONS_PER_REQUEST_MAX, TOPIC_NAME_MAX_CHARS,
                                 default=None)
        # No records in it: packed whole, in C (wire.pack_pieces walks a body
        # in Python to send large byte strings uncopied).
        return wire.respond(request, self.metadata(names, topic_filter(auth_of(request))),
                            pieces=False)

    def metadata(self, names: list[str] | None,
                 may_describe: Callable[[str], bool] = lambda _name: True,
                 eligible: bool = False) -> dict:
        """Brokers and topics; a topic the caller may not describe is left
        out of a listing and, named, answers TOPIC_AUTHORIZATION_FAILED
        whether it exists or not (Kafka's rule). ``eligible``: each
        partition's ``elr`` and ``last_known_leader`` too (KIP-966 keeps them
        out of the clients' Metadata, in the admin's describe)."""
        image = self.replicas.image
        brokers = [{"id": b.broker_id, "url": broker_url(image, b.broker_id), "rack": b.rack}
                   for _, b in sorted(image.brokers.items()) if not b.fenced]
        topics = []
        listing = names is None
        for name in (sorted(image.topics) if listing else names):
            if not may_describe(name):
                if not listing:
                    topics.append({"name": name, "topic_id": None, "partitions": [],
                                   "error": {"code": "TOPIC_AUTHORIZATION_FAILED",
                                             "message": f"not authorized to describe topic "
                                                        f"{name!r}"}})
                continue
            topic = image.topics.get(name)
            if topic is None:
                topics.append({"name": name, "topic_id": None, "partitions": [],
                               "error": {"code": "UNKNOWN_TOPIC_OR_PARTITION",
                                         "message": f"topic {name!r} does not exist"}})
                continue
            topics.append({"name": name, "topic_id": topic.topic_id, "error": None,
                           "partitions": self._partitions_of(name, topic, eligible)})
        return {"cluster_id": self.cluster_id, "controller_id": self.controller_id(),
                "metadata_offset": image.offset,
                "brokers": brokers, "topics": topics}

    def _partitions_of(self, name: str, topic: TopicImage, eligible: bool) -> list[dict]:
        """The partitions of ``topic`` as a metadata answer lists them:
        rendered again only when a registration changed (the image replaces a
        ``PartitionRegistration`` on every change, never edits one), so a
        client asking for 10,000 partitions costs a comparison of the same
        objects, not 10,000 new maps. Shared between answers: not to be
        changed by a caller."""
        registrations = tuple(topic.partitions.items())
        key = (name, eligible)
        cached = self._rendered.get(key)
        if cached is not None and cached[0] == registrations:
            return cached[1]
        rendered = [{"partition": p, "leader": reg.leader, "leader_epoch": reg.leader_epoch,
                     "replicas": list(reg.replicas), "isr": list(reg.isr),
                     **({"elr": list(reg.elr), "last_known_leader": reg.last_known_leader}
                        if eligible else {})}
                    for p, reg in sorted(registrations)]
        if len(self._rendered) > 2 * len(self.replicas.image.topics) + 64:
            self._rendered.clear()  # deleted topics' renderings go
        self._rendered[key] = (registrations, rendered)
        return rendered


def _has_transactional_batch(item: ProduceItem) -> bool:
    """Whether any batch of the item is transactional (corrupt bytes are
    the core's to refuse)."""
    try:
        return any(header.is_transactional for header, _ in iter_batches(item.records))
    except RecordFormatError:
        return False


def _leader_epoch(fields: Fields) -> int | None:
    return fields.integer("current_leader_epoch", -1, INT32_MAX, default=None)


def offset_for(part: Partition, timestamp: int, isolation: int = READ_UNCOMMITTED
                ) -> tuple[int, int]:
    """(offset, timestamp) answering a list-offsets query on a leader;
    read_committed readers' end is the last stable offset."""
    high_watermark = (part.last_stable_offset if isolation == READ_COMMITTED
                      else part.high_watermark)
    if timestamp == EARLIEST_TIMESTAMP:
        return part.log_start_offset, -1
    if timestamp == LATEST_TIMESTAMP:
        return high_watermark, -1
    found = part.log.offset_for_timestamp(timestamp)
    if found is None or found >= high_watermark:
        return -1, -1
    # The time index points at a batch; the answer is the first committed
    # record in it at or after the timestamp (decoding one batch).
    data = part.log.read(found, 1, high_watermark)
    for _header, batch in iter_batches(data):
        for record in iter_records(batch, verify_crc=False):
            if record.offset >= found and record.timestamp >= timestamp:
                return record.offset, record.timestamp
    return found, -1


class _StorageFailure(KraftError):
    code = "KAFKA_STORAGE_ERROR"
