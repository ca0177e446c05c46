"""Produce, fetch, list offsets and metadata: the broker's data plane over HTTP.

Handlers decode and shape-check the request (``kraft.fields.Fields``: a
wrong field fails the whole request with ``INVALID_REQUEST`` naming it),
then work partition by partition: each partition's outcome is its own, so
one bad partition never fails the others (Kafka's per-partition errors).
Batches are validated and appended without decoding records; fetches return
stored bytes unchanged. See docs/protocol.md for every field.

Replication rides on the same two calls:
  - ``acks=all`` produces wait, after appending, until the high watermark
    passes their last offset (the produce purgatory), the leadership moves,
    or ``timeout_ms`` ends;
  - a fetch with ``replica_id`` is a follower's: it is checked against the
    leader's epochs (``last_fetched_epoch``; a divergent follower gets
    ``diverging_epoch`` and no data), it tells the leader where the
    follower's log ends (moving the high watermark, maybe the ISR), and it
    reads up to the log end rather than the high watermark.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass

from aiohttp import web

from api.broker.errors import (CodedError, InvalidRequiredAcksError,
                               NotEnoughReplicasAfterAppendError, NotEnoughReplicasError,
                               NotLeaderOrFollowerError, ReplicationTimedOutError)
from api.broker.metrics import BrokerMetrics
from api.broker.partition import Partition
from api.broker.replica_manager import ReplicaManager, broker_url
from kraft import wire
from kraft.errors import InvalidRequestError, KraftError
from kraft.fields import Fields
from storage.batch import iter_batches, iter_records
from storage.errors import OffsetOutOfRangeError
from storage.manager import TOPIC_NAME_MAX_CHARS, TopicPartition

logger = logging.getLogger(__name__)

INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1
PARTITIONS_PER_REQUEST_MAX = 10_000
PRODUCE_TIMEOUT_MS_MAX = 300_000
FETCH_WAIT_MS_MAX = 30_000
FETCH_MAX_BYTES_DEFAULT = 50 * 1024 * 1024
PARTITION_FETCH_BYTES_DEFAULT = 1024 * 1024
EARLIEST_TIMESTAMP = -2
LATEST_TIMESTAMP = -1


def partition_error(exc: Exception) -> dict:
    return wire.error_body(exc)["error"]


@dataclass
class FetchSpec:
    tp: TopicPartition
    offset: int
    max_bytes: int
    current_leader_epoch: int | None
    last_fetched_epoch: int = -1


@dataclass
class PendingAck:
    """An acks=all write waiting for the high watermark to pass it."""

    result: dict
    part: Partition
    leader_epoch: int
    required_offset: int  # the high watermark that commits it


class DataApi:
    def __init__(self, replicas: ReplicaManager, metrics: BrokerMetrics,
                 is_serving: Callable[[], str | None], cluster_id: str,
                 controller_id: Callable[[], int | None],
                 follower_fetched: Callable[[Partition], None] = lambda part: None,
                 ack_before_replication: bool = False,
                 metadata_ready: Callable[[], bool] = lambda: True) -> None:
        self.replicas = replicas
        # unsafe.ack.before.replication: the chaos checker's broken broker
        # (acks=all treated as acks=1); see kraft/config.py.
        self.ack_before_replication = ack_before_replication
        # Called after a follower's fetch moved its state on a leader (the
        # ISR task decides whether the ISR should grow).
        self.follower_fetched = follower_fetched
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

    def add_routes(self, app: web.Application) -> None:
        app.router.add_post("/v1/produce", self.handle_produce)
        app.router.add_post("/v1/fetch", self.handle_fetch)
        app.router.add_post("/v1/offsets", self.handle_list_offsets)
        app.router.add_post("/v1/metadata", self.handle_metadata)
        app.router.add_get("/v1/metadata", self.handle_metadata)

    def _serving_partition(self, topic: str, partition: int,
                           current_leader_epoch: int | None) -> Partition:
        reason = self.is_serving()
        if reason is not None:
            raise NotLeaderOrFollowerError(
                f"broker {self.replicas.broker_id} is not serving data: {reason}")
        return self.replicas.leader_partition(topic, partition, current_leader_epoch)

    def _count_error(self, api: str, exc: Exception) -> None:
        self.metrics.partition_errors.inc(1, api, getattr(exc, "code", "UNKNOWN_SERVER_ERROR"))

    # -- produce ---------------------------------------------------------------
    async def handle_produce(self, request: web.Request) -> web.Response:
        body = Fields(await wire.read_body(request), "")
        acks = body.values.get("acks", 1)
        if acks == "all":
            acks = -1
        if acks not in (-1, 0, 1) or isinstance(acks, bool):
            raise InvalidRequiredAcksError(f"acks must be 0, 1, -1 or \"all\", got {acks!r}")
        if acks == -1 and self.ack_before_replication:
            acks = 1
        timeout_ms = body.integer("timeout_ms", 0, PRODUCE_TIMEOUT_MS_MAX, default=30_000)
        items = body.sequence("partitions", PARTITIONS_PER_REQUEST_MAX)
        batches = []
        for i, item in enumerate(items):
            fields = Fields(item, f"partitions[{i}]")
            records = fields.required("records")
            if not isinstance(records, (bytes, bytearray)):
                raise InvalidRequestError(
                    f"partitions[{i}].records must be binary (msgpack bin) record batches, "
                    f"got {type(records).__name__}")
            batches.append((fields.string("topic", TOPIC_NAME_MAX_CHARS),
                            fields.integer("partition", 0, INT32_MAX),
                            _leader_epoch(fields), records))
        seen: set[tuple[str, int]] = set()
        results = []
        pending: list[PendingAck] = []
        for topic, partition, epoch, records in batches:
            result = {"topic": topic, "partition": partition, "error": None}
            try:
                if (topic, partition) in seen:
                    raise InvalidRequestError(
                        f"{topic}-{partition} appears more than once in the request; "
                        "put all its batches in one records field")
                seen.add((topic, partition))
                part = self._serving_partition(topic, partition, epoch)
                if acks == -1 and len(part.isr) < part.min_insync_replicas:
                    raise NotEnoughReplicasError(
                        f"{topic}-{partition} has {len(part.isr)} in-sync replicas "
                        f"{part.isr}, fewer than its min.insync.replicas="
                        f"{part.min_insync_replicas}; nothing was written. Retry once a "
                        "replica has caught up, or produce with acks=1")
                info = self.replicas.append(part, records)
                result.update(base_offset=info.base_offset, log_append_time_ms=-1,
                              log_start_offset=part.log_start_offset)
                self.metrics.bytes_in.inc(info.size_bytes, topic)
                self.metrics.messages_in.inc(info.record_count, topic)
                if acks == -1:
                    pending.append(PendingAck(result, part, part.leader_epoch,
                                              info.last_offset + 1))
            except Exception as exc:  # noqa: BLE001  each partition answers for itself
                result["error"] = self._partition_failure("produce", f"{topic}-{partition}",
                                                          exc)
            results.append(result)
        if pending:
            await self._await_replication(pending, timeout_ms)
        return wire.respond(request, {"partitions": [] if acks == 0 else results})

    async def append_committed(self, part: Partition, records: bytes, timeout_ms: int) -> int:
        """Append ``records`` as leader and wait until they are committed, as
        an acks=all produce does (the group coordinator's writes to
        ``__consumer_offsets``); the base offset. Raises the produce error."""
        if len(part.isr) < part.min_insync_replicas:
            raise NotEnoughReplicasError(
                f"{part.tp} has {len(part.isr)} in-sync replicas {part.isr}, fewer than its "
                f"min.insync.replicas={part.min_insync_replicas}; nothing was written")
        info = self.replicas.append(part, records)
        result: dict = {"error": None}
        await self._await_replication(
            [PendingAck(result, part, part.leader_epoch, info.last_offset + 1)], timeout_ms)
        if result["error"] is not None:
            raise CodedError(result["error"]["code"], result["error"]["message"])
        return info.base_offset

    async def _await_replication(self, pending: list[PendingAck], timeout_ms: int) -> None:
        """The produce purgatory: wait until each write is committed (its
        partition's high watermark passed it) or fails, or ``timeout_ms``
        ends; failures go into each write's result."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_ms / 1000
        while pending:
            tps = [entry.part.tp for entry in pending]
            waiter = self.replicas.data_waiter(tps)
            try:
                waiting = []
                for entry in pending:
                    outcome = self._replication_outcome(entry)
                    if outcome is None:
                        waiting.append(entry)
                    elif isinstance(outcome, Exception):
                        self._fail_pending(entry, outcome)
                pending = waiting
                remaining = deadline - loop.time()
                if pending and remaining <= 0:
                    for entry in pending:
                        self._fail_pending(entry, ReplicationTimedOutError(
                            f"{entry.part.tp}: not every in-sync replica of {entry.part.isr} "
                            f"had the write within timeout_ms={timeout_ms} (high watermark "
                            f"{entry.part.high_watermark}, needed {entry.required_offset}); it "
                            "may still be committed"))
                    return
                if pending:
                    try:
                        await asyncio.wait_for(asyncio.shield(waiter), remaining)
                    except asyncio.TimeoutError:
                        pass
            finally:
                self.replicas.forget_waiter(waiter, tps)

    def _replication_outcome(self, entry: PendingAck) -> Exception | bool | None:
        """True once committed, an error if it never will be here, None to
        keep waiting."""
        part = entry.part
        if (self.replicas.partitions.get(part.tp) is not part or not part.is_leader
                or part.leader_epoch != entry.leader_epoch):
            return NotLeaderOrFollowerError(
                f"{part.tp}: this broker stopped leading (epoch {entry.leader_epoch}) before "
                "the write reached every in-sync replica; it may or may not be committed",
                leader_id=part.leader_id, leader_epoch=part.leader_epoch,
                leader_url=broker_url(self.replicas.image, part.leader_id))
        if part.high_watermark < entry.required_offset:
            return None
        if len(part.isr) < part.min_insync_replicas:
            return NotEnoughReplicasAfterAppendError(
                f"{part.tp}: the write reached the in-sync replicas {part.isr}, fewer than "
                f"min.insync.replicas={part.min_insync_replicas}, so it is not acknowledged")
        return True

    def _fail_pending(self, entry: PendingAck, exc: Exception) -> None:
        for key in ("base_offset", "log_append_time_ms", "log_start_offset"):
            entry.result.pop(key, None)
        where = f"{entry.part.tp.topic}-{entry.part.tp.partition}"
        entry.result["error"] = self._partition_failure("produce", where, exc)

    def _partition_failure(self, api: str, where: str, exc: Exception) -> dict:
        """The error entry of one partition. An exception without a code is
        a failure of this broker (a disk error): logged, reported as
        KAFKA_STORAGE_ERROR."""
        if not isinstance(getattr(exc, "code", None), str):
            logger.error("%s of %s failed", api, where, exc_info=exc)
            exc = _StorageFailure(f"{api} of {where} failed: {exc}")
        self._count_error(api, exc)
        return partition_error(exc)

    # -- fetch -----------------------------------------------------------------
    async def handle_fetch(self, request: web.Request) -> web.Response:
        if wire.response_type(request) != wire.MSGPACK:
            raise InvalidRequestError(
                "fetch answers with raw record batches, which only msgpack can carry: send "
                f"Accept: {wire.MSGPACK} (people can read records with GET "
                "/topics/{topic}/partitions/{p}/records)")
        body = Fields(await wire.read_body(request), "")
        max_wait_ms = body.integer("max_wait_ms", 0, INT32_MAX, default=500)
        max_wait_ms = min(max_wait_ms, FETCH_WAIT_MS_MAX)
        min_bytes = body.integer("min_bytes", 0, INT32_MAX, default=1)
        max_bytes = body.integer("max_bytes", 1, INT32_MAX, default=FETCH_MAX_BYTES_DEFAULT)
        replica_id = body.integer("replica_id", -1, INT32_MAX, default=-1)
        specs = []
        for i, item in enumerate(body.sequence("partitions", PARTITIONS_PER_REQUEST_MAX)):
            fields = Fields(item, f"partitions[{i}]")
            specs.append(FetchSpec(
                TopicPartition(fields.string("topic", TOPIC_NAME_MAX_CHARS),
                               fields.integer("partition", 0, INT32_MAX)),
                fields.integer("offset", -INT64_MAX, INT64_MAX),
                fields.integer("max_bytes", 1, INT32_MAX,
                               default=PARTITION_FETCH_BYTES_DEFAULT),
                _leader_epoch(fields),
                fields.integer("last_fetched_epoch", -1, INT32_MAX, default=-1)))
        loop = asyncio.get_running_loop()
        # A follower's fetch is judged once, on arrival: diverged, or where
        # its log ends. Only validated partitions are read.
        answered = self._follower_arrival(replica_id, specs) if replica_id >= 0 else {}
        specs_to_read = [spec for i, spec in enumerate(specs) if i not in answered]
        deadline = loop.time() + max_wait_ms / 1000
        tps = [spec.tp for spec in specs_to_read]
        while True:
            # Register before reading, so an append between the read and the
            # wait still wakes this fetch.
            waiter = self.replicas.data_waiter(tps)
            try:
                read, total_bytes, any_error = self._read_all(specs_to_read, max_bytes,
                                                              follower=replica_id >= 0)
                remaining = deadline - loop.time()
                if total_bytes >= min_bytes or any_error or answered or remaining <= 0:
                    break
                try:
                    await asyncio.wait_for(asyncio.shield(waiter), remaining)
                except asyncio.TimeoutError:
                    pass
            finally:
                self.replicas.forget_waiter(waiter, tps)
        unread = iter(read)
        results = [answered[i] if i in answered else next(unread) for i in range(len(specs))]
        for result in results if replica_id < 0 else ():
            records = result["records"]
            if records:
                self.metrics.bytes_out.inc(len(records), result["topic"])
                self.metrics.messages_out.inc(
                    sum(header.record_count for header, _ in iter_batches(records)),
                    result["topic"])
        return wire.respond(request, {"partitions": results})

    def _follower_arrival(self, replica_id: int, specs: list[FetchSpec]) -> dict:
        """Check each partition of follower ``replica_id``'s fetch against
        this leader's log and record where the follower's log ends. Returns
        the answers already decided (errors, diverging epochs) by position."""
        answered: dict[int, dict] = {}
        now_ms = self.replicas.clock_ms()
        for i, spec in enumerate(specs):
            try:
                part = self._serving_partition(spec.tp.topic, spec.tp.partition,
                                               spec.current_leader_epoch)
                if replica_id not in part.replicas or replica_id == part.broker_id:
                    raise NotLeaderOrFollowerError(
                        f"broker {replica_id} is not a follower of {spec.tp} (replicas "
                        f"{part.replicas})")
                diverging = part.diverging_epoch(spec.offset, spec.last_fetched_epoch)
                if diverging is not None:
                    result = _empty_fetch_result(spec)
                    result.update(high_watermark=part.high_watermark,
                                  log_start_offset=part.log_start_offset,
                                  log_end_offset=part.log_end_offset,
                                  diverging_epoch={"epoch": diverging[0],
                                                   "end_offset": diverging[1]})
                    answered[i] = result
                    continue
                if part.log_start_offset <= spec.offset <= part.log_end_offset:
                    if part.record_follower_fetch(replica_id, spec.offset, now_ms):
                        self.replicas.notify(part.tp)  # commits: acks=all and consumers
                    self.follower_fetched(part)
            except Exception as exc:  # noqa: BLE001  each partition answers for itself
                result = _empty_fetch_result(spec)
                result["error"] = self._partition_failure("fetch", str(spec.tp), exc)
                answered[i] = result
        return answered

    def _read_all(self, specs: list[FetchSpec], max_bytes: int, follower: bool = False
                  ) -> tuple[list[dict], int, bool]:
        results = []
        total_bytes = 0
        any_error = False
        for spec in specs:
            result = _empty_fetch_result(spec)
            try:
                part = self._serving_partition(spec.tp.topic, spec.tp.partition,
                                               spec.current_leader_epoch)
                high_watermark = part.high_watermark
                # Followers read everything the leader has; consumers only
                # what is committed.
                upper_bound = part.log_end_offset if follower else high_watermark
                result.update(high_watermark=high_watermark,
                              log_start_offset=part.log_start_offset,
                              log_end_offset=part.log_end_offset)
                budget = min(spec.max_bytes, max_bytes - total_bytes)
                if spec.offset < part.log_start_offset or spec.offset > part.log_end_offset:
                    raise OffsetOutOfRangeError(spec.offset, part.log_start_offset,
                                                part.log_end_offset)
                if spec.offset < upper_bound and budget > 0:
                    # KIP-74: the first batch of the response comes whole even
                    # when larger than the limits, so a consumer always moves.
                    data = part.log.read(spec.offset, budget, upper_bound,
                                         min_one_batch=total_bytes == 0)
                    result["records"] = data
                    total_bytes += len(data)
            except Exception as exc:  # noqa: BLE001  each partition answers for itself
                result["error"] = self._partition_failure("fetch", str(spec.tp), exc)
                any_error = True
            results.append(result)
        return results, total_bytes, any_error

    # -- list offsets ------------------------------------------------------------
    async def handle_list_offsets(self, request: web.Request) -> web.Response:
        body = Fields(await wire.read_body(request), "")
        results = []
        for i, item in enumerate(body.sequence("partitions", PARTITIONS_PER_REQUEST_MAX)):
            fields = Fields(item, f"partitions[{i}]")
            topic = fields.string("topic", TOPIC_NAME_MAX_CHARS)
            partition = fields.integer("partition", 0, INT32_MAX)
            timestamp = fields.integer("timestamp", -2, INT64_MAX)
            epoch = _leader_epoch(fields)
            result = {"topic": topic, "partition": partition, "error": None,
                      "offset": -1, "timestamp": -1}
            try:
                part = self._serving_partition(topic, partition, epoch)
                result["offset"], result["timestamp"] = _offset_for(part, timestamp)
            except Exception as exc:  # noqa: BLE001  each partition answers for itself
                result["error"] = self._partition_failure("offsets", f"{topic}-{partition}",
                                                          exc)
            results.append(result)
        return wire.respond(request, {"partitions": results})

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
        return wire.respond(request, self.metadata(names))

    def metadata(self, names: list[str] | None) -> dict:
        image = self.replicas.image
        brokers = [{"id": b.broker_id, "url": broker_url(image, b.broker_id), "rack": b.rack}
                   for _, b in sorted(image.brokers.items()) if not b.fenced]
        topics = []
        for name in (sorted(image.topics) if names is None else names):
            topic = image.topics.get(name)
            if topic is None:
                topics.append({"name": name, "topic_id": None, "partitions": [],
                               "error": {"code": "UNKNOWN_TOPIC_OR_PARTITION",
                                         "message": f"topic {name!r} does not exist"}})
                continue
            topics.append({"name": name, "topic_id": topic.topic_id, "error": None,
                           "partitions": [{"partition": p, "leader": reg.leader,
                                           "leader_epoch": reg.leader_epoch,
                                           "replicas": list(reg.replicas),
                                           "isr": list(reg.isr)}
                                          for p, reg in sorted(topic.partitions.items())]})
        return {"cluster_id": self.cluster_id, "controller_id": self.controller_id(),
                "metadata_offset": image.offset,
                "brokers": brokers, "topics": topics}


def _empty_fetch_result(spec: FetchSpec) -> dict:
    return {"topic": spec.tp.topic, "partition": spec.tp.partition, "error": None,
            "high_watermark": -1, "log_start_offset": -1, "log_end_offset": -1,
            "records": b""}


def _leader_epoch(fields: Fields) -> int | None:
    return fields.integer("current_leader_epoch", -1, INT32_MAX, default=None)


def _offset_for(part: Partition, timestamp: int) -> tuple[int, int]:
    """(offset, timestamp) answering a list-offsets query on a leader."""
    high_watermark = part.high_watermark
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
