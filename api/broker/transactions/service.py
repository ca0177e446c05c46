"""The transaction coordinator's shell: ``__transaction_state``, markers,
and the HTTP endpoints of transactional producers.

The state machine is ``coordinator.py`` (pure). ``ShardedCoordinator``
(``api/broker/coordinator_shards.py``) gives it what the group coordinator
has: a core per led partition of ``__transaction_state`` (transactional id
``t`` lives in partition ``abs(javaHash(t)) % transaction.state.log.num.
partitions``), replayed from the log when this broker becomes its leader,
each change committed before it is answered.

Markers
    Once a transaction's ``PREPARE_COMMIT``/``PREPARE_ABORT`` is committed,
    its outcome is decided. A marker task per such transaction writes the
    COMMIT or ABORT marker to every partition of the transaction (``POST
    /v1/txn/markers`` to each partition's leader, stamped with the
    coordinator epoch, the leader epoch of this ``__transaction_state``
    partition), retrying until each is committed, then records
    ``COMPLETE_*``. A coordinator that takes the partition over finds the
    decided transactions in the log and writes their markers again
    (harmless where they were written: the producer has no open transaction
    there any more). The loop that starts marker tasks also runs the core's
    timers (timeouts abort, idle ids expire).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import quote

import aiohttp
from aiohttp import web

from api.broker.coordinator_shards import Shard, ShardedCoordinator, partition_for
from api.broker.groups.service import OFFSETS_TOPIC
from api.broker.producers import ProducerIdManager
from api.broker.replication import broker_url
from api.broker.authz import require_topics, topic_filter
from api.broker.transactions import coordinator as txn
from kraft.authorizer import RequestAuth, auth_of
from protocol import TopicPartition, acl, tls, wire
from protocol.errors import (CodedError, CoordinatorNotAvailableError, InvalidRequestError,
                             UnknownTopicOrPartitionError)
from protocol.fields import Fields

logger = logging.getLogger(__name__)

TRANSACTION_TOPIC = "__transaction_state"
TRANSACTIONAL_ID_CHARS_MAX = 255
PARTITIONS_MAX = 10_000
INT16_MAX = 2**15 - 1
INT64_MAX = 2**63 - 1
#: Pause before writing a marker again after a partition refused it.
MARKER_RETRY_S = 0.2
MARKER_TIMEOUT_MS = 10_000
#: How long EndTxn waits for the markers before it answers anyway.
END_WAIT_S = 5.0
PEER_TIMEOUT_S = 5.0


class TransactionService(ShardedCoordinator):
    TOPIC = TRANSACTION_TOPIC
    WHAT = "transactional id"
    FIND_PATH = "/v1/transactions/coordinator"
    ERROR_TYPE = txn.TxnError

    def __init__(self, broker_id: int, replicas: Any, data: Any,
                 controller_call: Callable[..., Any], image: Callable[[], Any],
                 settings: Mapping[str, Any], clock_ms: Callable[[], int],
                 producer_ids: ProducerIdManager) -> None:
        super().__init__(broker_id, replicas, data, controller_call, image, clock_ms,
                         settings["transaction.state.log.num.partitions"],
                         settings["transaction.state.log.replication.factor"],
                         settings["transaction.state.log.segment.bytes"])
        self.max_timeout_ms = settings["transaction.max.timeout.ms"]
        self.id_expiration_ms = settings["transactional.id.expiration.ms"]
        self.producer_ids = producer_ids
        # (partition, transactional id, epoch) -> its marker task.
        self._markers: dict[tuple[int, str, int], asyncio.Task] = {}
        self._session: aiohttp.ClientSession | None = None

    # -- ShardedCoordinator -------------------------------------------------------------
    def new_core(self) -> txn.TransactionCoordinatorCore:
        return txn.TransactionCoordinatorCore(max_timeout_ms=self.max_timeout_ms,
                                              id_expiration_ms=self.id_expiration_ms)

    def decode(self, key: bytes | None, value: bytes | None) -> Any:
        return txn.decode(key or b"", value)

    def encode(self, record: Any) -> tuple[bytes | None, bytes | None]:
        return txn.encode(record)

    def tick_core(self, shard: Shard, now_ms: int) -> list:
        records = shard.core.tick(now_ms)
        self._start_markers(shard)
        return records

    def on_loaded(self, shard: Shard) -> None:
        self._start_markers(shard)

    async def stop(self) -> None:
        tasks = list(self._markers.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._markers.clear()
        await super().stop()
        if self._session is not None:
            await self._session.close()
            self._session = None

    # -- markers ---------------------------------------------------------------------
    def _start_markers(self, shard: Shard) -> None:
        """A marker task for each decided transaction that has none."""
        if self.shards.get(shard.partition) is not shard or not shard.loaded:
            return
        for pending in shard.core.pending_markers():
            key = (shard.partition, pending.transactional_id, pending.producer_epoch)
            if key not in self._markers:
                self._markers[key] = asyncio.create_task(
                    self._complete(shard, pending, key),
                    name=f"txn-markers-{pending.transactional_id}")

    async def _complete(self, shard: Shard, decided: txn.TxnMetadata, key: tuple) -> None:
        try:
            if not await self._write_markers(shard, decided):
                return  # another coordinator takes over
            async with shard.lock:
                if self.shards.get(shard.partition) is not shard:
                    return
                records = shard.core.complete(decided.transactional_id,
                                              decided.producer_epoch, self.clock_ms())
                if records:
                    await self.write(shard, records)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001  the next tick starts it again
            logger.info("broker %d: completing transaction %r: %s", self.broker_id,
                        decided.transactional_id, exc)
        finally:
            self._markers.pop(key, None)

    async def _write_markers(self, shard: Shard, decided: txn.TxnMetadata) -> bool:
        """Write the decided outcome's marker to every partition, retrying
        each until its leader has committed it, while this broker still
        coordinates the transaction (False once it does not)."""
        committed = decided.state == txn.TxnState.PREPARE_COMMIT
        left = set(decided.partitions)
        while left:
            if self.shards.get(shard.partition) is not shard:
                return False
            image = self.image()
            by_url: dict[str, list[TopicPartition]] = {}
            for tp in left:
                reg = image.partition(tp.topic, tp.partition)
                if reg is None:
                    left.discard(tp)  # the topic was deleted: nothing to mark
                    continue
                url = broker_url(image, reg.leader) if reg.leader >= 0 else None
                if url is not None:
                    by_url.setdefault(url, []).append(tp)
            done = await asyncio.gather(*(
                self._send_markers(url, tps, decided, committed, shard.leader_epoch)
                for url, tps in by_url.items()))
            for written in done:
                left -= written
            if left:
                await asyncio.sleep(MARKER_RETRY_S)
        return True

    async def _send_markers(self, url: str, tps: list[TopicPartition],
                            decided: txn.TxnMetadata, committed: bool,
                            coordinator_epoch: int) -> set[TopicPartition]:
        body = {"timeout_ms": MARKER_TIMEOUT_MS, "markers": [
            {"topic": tp.topic, "partition": tp.partition,
             "producer_id": decided.producer_id, "producer_epoch": decided.producer_epoch,
             "coordinator_epoch": coordinator_epoch, "committed": committed} for tp in tps]}
        if self._session is None:
            self._session = tls.session(self.peer_ssl)
        written: set[TopicPartition] = set()
        try:
            async with self._session.post(
                    f"{url}/v1/txn/markers", json=body,
                    headers={"Accept": wire.JSON},
                    timeout=aiohttp.ClientTimeout(total=MARKER_TIMEOUT_MS / 1000 + 2)) as reply:
                answer = await reply.json()
        except (aiohttp.ClientError, asyncio.TimeoutError, ValueError, OSError) as exc:
            logger.debug("markers to %s: %s", url, exc)
            return written
        for entry in answer.get("markers") or ():
            error = entry.get("error")
            tp = TopicPartition(entry.get("topic"), entry.get("partition"))
            if error is None or error.get("code") in ("INVALID_PRODUCER_EPOCH",
                                                      "TRANSACTION_COORDINATOR_FENCED"):
                # Fenced: a newer epoch or coordinator has written past this one.
                written.add(tp)
            else:
                logger.debug("marker for %s at %s: %s", tp, url, error)
        return written

    def kick(self, tid: str) -> asyncio.Task | None:
        """Start the markers of ``tid`` now rather than at the next tick;
        the task writing them, if any."""
        try:
            shard = self.shard_for(tid)
        except Exception:  # noqa: BLE001  moved: its new coordinator does it
            return None
        self._start_markers(shard)
        return next((task for (partition, key_tid, _), task in self._markers.items()
                     if partition == shard.partition and key_tid == tid), None)

    async def wait_markers(self, tid: str, timeout_s: float) -> None:
        """Start ``tid``'s markers and wait (at most ``timeout_s``) until
        they are written and the transaction is complete."""
        task = self.kick(tid)
        if task is not None:
            await asyncio.wait([task], timeout=timeout_s)

    # -- operations ------------------------------------------------------------------
    async def init_producer_id(self, tid: str, timeout_ms: int, producer_id: int,
                               producer_epoch: int, two_phase: bool = False) -> dict:
        self.shard_for(tid)  # before taking an id: NOT_COORDINATOR costs nothing
        fresh = await self.producer_ids.next_id()
        now = self.clock_ms()
        answer = await self.run(tid, lambda core: core.init_producer_id(
            tid, timeout_ms, fresh, now, producer_id, producer_epoch, two_phase))
        return answer

    async def verify(self, tid: str, producer_id: int, producer_epoch: int,
                     partitions: list[TopicPartition]) -> None:
        """KIP-890 for a partition leader: here if this broker coordinates
        ``tid``, else asked of its coordinator. Raises if not verified."""
        count = self.partition_count()
        if count is not None and partition_for(tid, count) in self.shards:
            shard = self.shard_for(tid)
            try:
                shard.core.verify(tid, producer_id, producer_epoch, partitions)
            except txn.TxnError as exc:
                raise CodedError(exc.code, exc.message) from None
            return
        where = await self.locate(tid)
        url = where.get("coordinator_url")
        if url is None:
            raise CoordinatorNotAvailableError(f"the coordinator of {tid!r} is unknown; retry")
        if self._session is None:
            self._session = tls.session(self.peer_ssl)
        body = {"transactional_id": tid, "producer_id": producer_id,
                "producer_epoch": producer_epoch,
                "partitions": [{"topic": tp.topic, "partition": tp.partition}
                               for tp in partitions]}
        try:
            async with self._session.post(f"{url}/v1/transactions/verify", json=body,
                                          headers={"Accept": wire.JSON},
                                          timeout=aiohttp.ClientTimeout(
                                              total=PEER_TIMEOUT_S)) as reply:
                answer = await reply.json()
        except (aiohttp.ClientError, asyncio.TimeoutError, ValueError) as exc:
            raise CoordinatorNotAvailableError(
                f"the coordinator of {tid!r} did not answer ({exc}); retry") from None
        error = answer.get("error") if isinstance(answer, dict) else None
        if error:
            raise CodedError(error.get("code", "UNKNOWN_SERVER_ERROR"), error.get("message", ""))

    def check_partitions(self, partitions: list[TopicPartition]) -> None:
        image = self.image()
        for tp in partitions:
            if image.partition(tp.topic, tp.partition) is None:
                raise UnknownTopicOrPartitionError(
                    f"{tp.topic}-{tp.partition} does not exist: a transaction can only write "
                    "to existing partitions")


class TransactionApi:
    """The endpoints of transactional producers and of ``kraftlog
    transactions``."""

    def __init__(self, service: TransactionService, peers: Callable[[], dict[int, str]]) -> None:
        self.service = service
        self.peers = peers

    def add_routes(self, app: web.Application) -> None:
        app.router.add_post("/v1/transactions/coordinator", self.handle_find_coordinator)
        app.router.add_post("/v1/transactions/add_partitions", self.handle_add_partitions)
        app.router.add_post("/v1/transactions/end", self.handle_end)
        app.router.add_post("/v1/transactions/verify", self.handle_verify)
        app.router.add_post("/v1/admin/transactions/abort", self.handle_abort)
        app.router.add_get("/v1/transactions", self.handle_list)
        app.router.add_get("/v1/transactions/{transactional_id}", self.handle_describe)

    async def handle_find_coordinator(self, request: web.Request) -> web.Response:
        body = Fields(await wire.read_body(request), "")
        tid = _transactional_id(body)
        auth_of(request).require(acl.DESCRIBE, acl.TRANSACTIONAL_ID, tid)
        return wire.respond(request, {"transactional_id": tid,
                                      **await self.service.locate(tid)})

    async def handle_add_partitions(self, request: web.Request) -> web.Response:
        body = Fields(await wire.read_body(request), "")
        tid, pid, epoch = _producer(body)
        partitions = _partitions(body)
        if not partitions:
            raise InvalidRequestError("partitions must name at least one partition")
        auth = auth_of(request)
        auth.require(acl.WRITE, acl.TRANSACTIONAL_ID, tid)
        # The offsets topic joins a transaction for send_offsets_to_transaction
        # (Kafka's AddOffsetsToTxn): WRITE on the transactional id is all that
        # takes, as in Kafka; committing the offsets needs READ on the group
        # (TxnOffsetCommit). Nobody writes that topic but its coordinator.
        require_topics(auth, acl.WRITE, sorted({tp.topic for tp in partitions
                                                if tp.topic != OFFSETS_TOPIC}),
                       "adding it to a transaction")
        self.service.check_partitions(partitions)
        now = self.service.clock_ms()
        await self.service.run(tid, lambda core: core.add_partitions(tid, pid, epoch,
                                                                     partitions, now))
        return wire.respond(request, {"transactional_id": tid, "error": None})

    async def handle_verify(self, request: web.Request) -> web.Response:
        """KIP-890's check, for partition leaders."""
        if not auth_of(request).enabled:  # with ACLs: CLUSTER_ACTION, by the middleware
            tls.require_node_or_plain(request, "a KIP-890 transaction check")
        body = Fields(await wire.read_body(request), "")
        tid, pid, epoch = _producer(body)
        partitions = _partitions(body)
        shard = self.service.shard_for(tid)
        try:
            shard.core.verify(tid, pid, epoch, partitions)
        except txn.TxnError as exc:
            raise CodedError(exc.code, exc.message) from None
        return wire.respond(request, {"transactional_id": tid, "error": None})

    async def handle_end(self, request: web.Request) -> web.Response:
        body = Fields(await wire.read_body(request), "")
        tid, pid, epoch = _producer(body)
        auth_of(request).require(acl.WRITE, acl.TRANSACTIONAL_ID, tid)
        committed = body.boolean("committed")
        now = self.service.clock_ms()
        await self.service.run(tid, lambda core: core.end_txn(tid, pid, epoch, committed, now))
        # Answer once the markers are in (usually milliseconds), so the
        # producer's commit returns with its records readable; a retry
        # finds the state it reached meanwhile.
        await self.service.wait_markers(tid, END_WAIT_S)
        return wire.respond(request, {"transactional_id": tid, "error": None})

    async def handle_abort(self, request: web.Request) -> web.Response:
        """An operator's abort, on any broker (forwarded to the coordinator)."""
        body = Fields(await wire.read_body(request), "")
        tid = _transactional_id(body)
        if not self._coordinates(tid):
            return wire.respond(request, await self._forward(
                "POST", tid, "/v1/admin/transactions/abort", {"transactional_id": tid}))
        now = self.service.clock_ms()
        await self.service.run(tid, lambda core: core.abort(tid, now))
        self.service.kick(tid)
        return wire.respond(request, {"transactional_id": tid, "error": None})

    def _coordinates(self, tid: str) -> bool:
        count = self.service.partition_count()
        return count is not None and partition_for(tid, count) in self.service.shards

    async def _forward(self, method: str, tid: str, path: str, body: dict | None) -> dict:
        where = await self.service.locate(tid)
        url = where.get("coordinator_url")
        if url is None or where.get("coordinator_id") == self.service.broker_id:
            self.service.shard_for(tid)  # raises: loading, or no coordinator yet
        async with tls.session(self.service.peer_ssl) as session:
            try:
                async with session.request(
                        method, f"{url}{path}", json=body, headers={"Accept": wire.JSON},
                        timeout=aiohttp.ClientTimeout(total=PEER_TIMEOUT_S)) as reply:
                    answer = await reply.json()
            except (aiohttp.ClientError, asyncio.TimeoutError, ValueError) as exc:
                raise CoordinatorNotAvailableError(
                    f"the coordinator of {tid!r} at {url} did not answer ({exc}); "
                    "retry shortly") from None
        if isinstance(answer, dict) and isinstance(answer.get("error"), dict) and \
                set(answer) == {"error"}:
            error = answer["error"]
            raise CodedError(error.get("code", "UNKNOWN_SERVER_ERROR"), error.get("message", ""))
        return answer

    async def handle_describe(self, request: web.Request) -> web.Response:
        """One transactional id, on any broker (asked of its coordinator)."""
        return await self._describe(request, request.match_info["transactional_id"])

    async def _describe(self, request: web.Request, tid: str) -> web.Response:
        auth = auth_of(request)
        auth.require(acl.DESCRIBE, acl.TRANSACTIONAL_ID, tid)
        if not self._coordinates(tid):
            return wire.respond(request, _visible_topics(auth, await self._forward(
                "GET", tid, f"/v1/transactions?transactional_id={quote(tid, safe='')}",
                None)))
        shard = self.service.shard_for(tid)
        described = shard.core.describe(tid)
        if described is None:
            return wire.respond(request, {"error": {
                "code": "TRANSACTIONAL_ID_NOT_FOUND",
                "message": f"no transactional id {tid!r}"}}, 404)
        return wire.respond(request, _visible_topics(
            auth, {**described, "coordinator_id": self.service.broker_id}))

    async def handle_list(self, request: web.Request) -> web.Response:
        """Every broker's transactional ids (``?local=true``: this one's),
        those the caller may DESCRIBE; ``?transactional_id=ID``: that one,
        as ``GET /v1/transactions/{ID}`` (for ids like "." and "..", which
        browsers and URL libraries drop from a path)."""
        if "transactional_id" in request.query:
            return await self._describe(request, request.query["transactional_id"])
        auth = auth_of(request)

        def visible(found: list[dict]) -> list[dict]:
            if not auth.enabled:
                return found
            return [t for t in found if auth.allowed(
                acl.DESCRIBE, acl.TRANSACTIONAL_ID, t.get("transactional_id", ""))]

        if request.query.get("local") in ("1", "true"):
            return wire.respond(request, {"transactions": visible(self.local())})
        out = self.local()
        async with tls.session(self.service.peer_ssl) as session:
            async def ask(url: str) -> list[dict]:
                try:
                    async with session.get(f"{url}/v1/transactions", params={"local": "true"},
                                           headers={"Accept": wire.JSON},
                                           timeout=aiohttp.ClientTimeout(
                                               total=PEER_TIMEOUT_S)) as reply:
                        return (await reply.json()).get("transactions") or []
                except (aiohttp.ClientError, asyncio.TimeoutError, ValueError):
                    return []
            others = [url for bid, url in self.peers().items()
                      if bid != self.service.broker_id]
            for found in await asyncio.gather(*(ask(url) for url in others)):
                out.extend(found)
        return wire.respond(request, {"transactions": sorted(
            visible(out), key=lambda t: t["transactional_id"])})

    def local(self) -> list[dict]:
        out = []
        for shard in self.service.shards.values():
            if shard.loaded:
                out.extend({**t, "coordinator_id": self.service.broker_id}
                           for t in shard.core.list_transactions())
        return out


def _visible_topics(auth: RequestAuth, described: dict) -> dict:
    """A described transaction without the partitions of topics the caller
    may not DESCRIBE."""
    if auth.enabled and isinstance(described.get("partitions"), list):
        visible = topic_filter(auth)
        described["partitions"] = [p for p in described["partitions"]
                                   if not isinstance(p, dict) or visible(p.get("topic", ""))]
    return described


def _transactional_id(body: Fields) -> str:
    return body.string("transactional_id", TRANSACTIONAL_ID_CHARS_MAX)


def _partitions(body: Fields) -> list[TopicPartition]:
    """``partitions``: ``[{"topic", "partition"}, ...]``."""
    out = []
    for i, item in enumerate(body.sequence("partitions", PARTITIONS_MAX)):
        fields = Fields(item, f"partitions[{i}]")
        out.append(TopicPartition(fields.string("topic", 249),
                                  fields.integer("partition", 0, 2**31 - 1)))
    return out


def _producer(body: Fields) -> tuple[str, int, int]:
    return (_transactional_id(body), body.integer("producer_id", 0, INT64_MAX),
            body.integer("producer_epoch", 0, INT16_MAX))

