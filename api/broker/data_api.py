"""Produce, fetch, list offsets and metadata: the broker's data plane over HTTP.

Handlers decode and shape-check the request (``kraft.fields.Fields``: a
wrong field fails the whole request with ``INVALID_REQUEST`` naming it),
then work partition by partition: each partition's outcome is its own, so
one bad partition never fails the others (Kafka's per-partition errors).
Batches are validated and appended without decoding records; fetches return
stored bytes unchanged. See docs/protocol.md for every field.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass

from aiohttp import web

from api.broker.errors import InvalidRequiredAcksError, NotLeaderOrFollowerError
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


class DataApi:
    def __init__(self, replicas: ReplicaManager, metrics: BrokerMetrics,
                 is_serving: Callable[[], str | None], cluster_id: str,
                 controller_id: Callable[[], int | None]) -> None:
        self.replicas = replicas
        self.metrics = metrics
        self.cluster_id = cluster_id
        self.controller_id = controller_id
        # Callable: None when the broker may serve data, else the reason it
        # may not (still fenced, stopping).
        self.is_serving = is_serving

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
        body.integer("timeout_ms", 0, PRODUCE_TIMEOUT_MS_MAX, default=30_000)
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
        for topic, partition, epoch, records in batches:
            result = {"topic": topic, "partition": partition, "error": None}
            try:
                if (topic, partition) in seen:
                    raise InvalidRequestError(
                        f"{topic}-{partition} appears more than once in the request; "
                        "put all its batches in one records field")
                seen.add((topic, partition))
                part = self._serving_partition(topic, partition, epoch)
                info = self.replicas.append(part, records)
                result.update(base_offset=info.base_offset, log_append_time_ms=-1,
                              log_start_offset=part.log_start_offset)
                self.metrics.bytes_in.inc(info.size_bytes, topic)
                self.metrics.messages_in.inc(info.record_count, topic)
            except Exception as exc:  # noqa: BLE001  each partition answers for itself
                result["error"] = self._partition_failure("produce", f"{topic}-{partition}",
                                                          exc)
            results.append(result)
        return wire.respond(request, {"partitions": [] if acks == 0 else results})

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
        specs = []
        for i, item in enumerate(body.sequence("partitions", PARTITIONS_PER_REQUEST_MAX)):
            fields = Fields(item, f"partitions[{i}]")
            specs.append(FetchSpec(
                TopicPartition(fields.string("topic", TOPIC_NAME_MAX_CHARS),
                               fields.integer("partition", 0, INT32_MAX)),
                fields.integer("offset", -INT64_MAX, INT64_MAX),
                fields.integer("max_bytes", 1, INT32_MAX,
                               default=PARTITION_FETCH_BYTES_DEFAULT),
                _leader_epoch(fields)))
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max_wait_ms / 1000
        tps = [spec.tp for spec in specs]
        while True:
            # Register before reading, so an append between the read and the
            # wait still wakes this fetch.
            waiter = self.replicas.data_waiter(tps)
            try:
                results, total_bytes, any_error = self._read_all(specs, max_bytes)
                remaining = deadline - loop.time()
                if total_bytes >= min_bytes or any_error or remaining <= 0:
                    break
                try:
                    await asyncio.wait_for(asyncio.shield(waiter), remaining)
                except asyncio.TimeoutError:
                    pass
            finally:
                self.replicas.forget_waiter(waiter, tps)
        for result in results:
            records = result["records"]
            if records:
                self.metrics.bytes_out.inc(len(records), result["topic"])
                self.metrics.messages_out.inc(
                    sum(header.record_count for header, _ in iter_batches(records)),
                    result["topic"])
        return wire.respond(request, {"partitions": results})

    def _read_all(self, specs: list[FetchSpec], max_bytes: int
                  ) -> tuple[list[dict], int, bool]:
        results = []
        total_bytes = 0
        any_error = False
        for spec in specs:
            result = {"topic": spec.tp.topic, "partition": spec.tp.partition, "error": None,
                      "high_watermark": -1, "log_start_offset": -1, "log_end_offset": -1,
                      "records": b""}
            try:
                part = self._serving_partition(spec.tp.topic, spec.tp.partition,
                                               spec.current_leader_epoch)
                high_watermark = part.high_watermark
                result.update(high_watermark=high_watermark,
                              log_start_offset=part.log_start_offset,
                              log_end_offset=part.log_end_offset)
                budget = min(spec.max_bytes, max_bytes - total_bytes)
                if spec.offset < part.log_start_offset or spec.offset > part.log_end_offset:
                    raise OffsetOutOfRangeError(spec.offset, part.log_start_offset,
                                                part.log_end_offset)
                if spec.offset < high_watermark and budget > 0:
                    # KIP-74: the first batch of the response comes whole even
                    # when larger than the limits, so a consumer always moves.
                    data = part.log.read(spec.offset, budget, high_watermark,
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
    async def handle_metadata(self, request: web.Request) -> web.Response:
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
