"""The Kafka listener: Kafka's binary protocol over TCP, beside the HTTP API,
so the clients and tools users already have (librdkafka and confluent-kafka,
kafka-python, aiokafka, kcat) work against a kraftlog broker.

One asyncio connection handler per client. A frame is a 4-byte size and a
request (header, then body) that the generated schemas decode
(``protocol/kafka``); requests on a connection are answered one at a time,
in order, as Kafka answers them. A handler turns the request into the same
calls the HTTP API makes on the broker (``ReplicaManager.produce`` and
``fetch``, the metadata image), so the two doors share one log: records are
converted between Kafka's RecordBatch v2 and kraftlog's batches at this
listener (``protocol/kafka/records.py``).

What is spoken (``SUPPORTED``): ApiVersions, Metadata, Produce, Fetch,
ListOffsets; the API versions listed there, each from the first that
carries RecordBatch v2. ApiVersions lists exactly these, so a client
degrades cleanly. Fetch sessions (KIP-227) are answered with session id 0,
Kafka's documented fallback: the client sends full fetch requests.

Bad input: a frame larger than ``socket.request.max.bytes`` or smaller than
a header, an API or version not listed, or a body that does not decode
closes the connection (Kafka's answer too), logged at debug level; a frame
must arrive within ``connections.max.idle.ms`` once its size is read (a
slow client cannot hold a handler forever), and an idle connection is
closed after it.

Security: only PLAINTEXT for now, and refused on a cluster with ACLs or
TLS (``kraft/config.py``): it would be a door without a lock.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import struct
from collections.abc import Callable
from typing import Any

from api.broker.data_api import offset_for
from api.broker.replication import (READ_COMMITTED, READ_UNCOMMITTED, FetchRequest, FetchSpec,
                                    ProduceItem)
from protocol import TopicPartition
from protocol.kafka import codec, messages
from protocol.kafka.records import kafka_to_native, native_to_kafka
from storage.batch import RecordFormatError

logger = logging.getLogger(__name__)

KAFKA_LISTENER = "KAFKA"
API_VERSIONS, METADATA, PRODUCE, FETCH, LIST_OFFSETS = 18, 3, 0, 1, 2
#: API key -> (lowest, highest) version spoken.
SUPPORTED: dict[int, tuple[int, int]] = {
    PRODUCE: (3, 9),        # 3: RecordBatch v2 and transactional ids
    FETCH: (4, 12),         # 4: RecordBatch v2 and isolation levels; 13+ name topics by id
    LIST_OFFSETS: (1, 7),
    METADATA: (1, 12),
    API_VERSIONS: (0, 3),
}
_SIZE = struct.Struct(">i")
_HEADER = struct.Struct(">hhi")
#: Kafka's smallest request header: key, version, correlation id, client id length.
FRAME_MIN = _HEADER.size + 2
EARLIEST, LATEST = -2, -1


def error_code(error: Any) -> int:
    """Kafka's number for a result's error (None: 0). An exception without
    a code is this broker's failure: KAFKA_STORAGE_ERROR."""
    if error is None:
        return 0
    name = getattr(error, "code", None)
    if isinstance(error, dict):
        name = error.get("code")
    if not isinstance(name, str):
        return messages.ERRORS["KAFKA_STORAGE_ERROR"]
    return messages.ERRORS.get(name, messages.ERRORS["UNKNOWN_SERVER_ERROR"])


def topic_uuid(topic_id: str | None) -> bytes:
    """kraftlog's topic id (16 random bytes, base64url) as Kafka's UUID."""
    if not topic_id:
        return codec.ZERO_UUID
    raw = base64.urlsafe_b64decode(topic_id + "=" * (-len(topic_id) % 4))
    return raw if len(raw) == 16 else codec.ZERO_UUID


class KafkaListener:
    """Serves Kafka's protocol for one broker (``server``: its BrokerServer)."""

    def __init__(self, server: Any, frame_bytes_max: int, idle_ms: int) -> None:
        self.server = server
        self.frame_bytes_max = frame_bytes_max
        self.idle_s = idle_ms / 1000
        self._server: asyncio.base_events.Server | None = None
        self._connections: set[asyncio.Task] = set()
        self.handlers: dict[int, Callable] = {
            API_VERSIONS: self.api_versions, METADATA: self.metadata, PRODUCE: self.produce,
            FETCH: self.fetch, LIST_OFFSETS: self.list_offsets}

    async def start(self, host: str, port: int) -> None:
        self._server = await asyncio.start_server(self._connection, host, port,
                                                  limit=2**16)

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            for task in list(self._connections):
                task.cancel()
            await asyncio.gather(*self._connections, return_exceptions=True)
            await self._server.wait_closed()

    # -- connections --------------------------------------------------------------
    async def _connection(self, reader: asyncio.StreamReader,
                          writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        self._connections.add(task)
        peer = writer.get_extra_info("peername")
        try:
            while True:
                size_bytes = await asyncio.wait_for(reader.readexactly(4), self.idle_s)
                (size,) = _SIZE.unpack(size_bytes)
                if not FRAME_MIN <= size <= self.frame_bytes_max:
                    logger.debug("kafka listener: %s sent a frame of %d bytes: closing",
                                 peer, size)
                    return
                frame = await asyncio.wait_for(reader.readexactly(size), self.idle_s)
                answer = await self._answer(frame, peer)
                if answer is False:
                    return
                if answer is not None:
                    writer.write(_SIZE.pack(len(answer)) + answer)
                    await writer.drain()
        except (asyncio.IncompleteReadError, asyncio.TimeoutError, ConnectionError):
            pass
        finally:
            self._connections.discard(task)
            writer.close()

    async def _answer(self, frame: bytes, peer: Any) -> bytes | None | bool:
        """The response frame (without its size), None for none (acks=0), or
        False to close the connection."""
        api_key, version, correlation_id = _HEADER.unpack_from(frame)
        span = SUPPORTED.get(api_key)
        if api_key == API_VERSIONS and (span is None or version > span[1]):
            # Kafka's rule: answer a too-new ApiVersions in v0 with the
            # versions, so the client retries with one it shares.
            body = self._versions_body(messages.ERRORS["UNSUPPORTED_VERSION"])
            return self._respond(API_VERSIONS, 0, correlation_id, body)
        if span is None or not span[0] <= version <= span[1]:
            logger.debug("kafka listener: %s asked for API %d v%d, not spoken: closing",
                         peer, api_key, version)
            return False
        try:
            header, pos = codec.decode(
                messages.RequestHeader, codec.request_header_version(api_key, version), frame)
            request, end = codec.decode(messages.APIS[api_key][0], version, frame, pos)
        except codec.KafkaDecodeError as exc:
            logger.debug("kafka listener: %s sent a malformed %d v%d: %s", peer, api_key,
                         version, exc)
            return False
        body = await self.handlers[api_key](request, version, header)
        if body is None:
            return None
        return self._respond(api_key, version, correlation_id, body)

    @staticmethod
    def _respond(api_key: int, version: int, correlation_id: int, body: dict) -> bytes:
        out = bytearray()
        codec.encode(messages.ResponseHeader, codec.response_header_version(api_key, version),
                     {"CorrelationId": correlation_id}, out)
        codec.encode(messages.APIS[api_key][1], version, body, out)
        return bytes(out)

    # -- ApiVersions ---------------------------------------------------------------------
    @staticmethod
    def _versions_body(error: int = 0) -> dict:
        return {"ErrorCode": error, "ApiKeys": [
            {"ApiKey": key, "MinVersion": low, "MaxVersion": high}
            for key, (low, high) in sorted(SUPPORTED.items())]}

    async def api_versions(self, request: dict, version: int, header: dict) -> dict:
        return self._versions_body()

    # -- Metadata ------------------------------------------------------------------------
    def _brokers(self, image) -> list[dict]:
        brokers = []
        for broker_id, broker in sorted(image.brokers.items()):
            address = broker.endpoints.get(KAFKA_LISTENER)
            if broker.fenced or not address:
                continue
            host, _, port = address.rpartition(":")
            brokers.append({"NodeId": broker_id, "Host": host.strip("[]"), "Port": int(port),
                            "Rack": broker.rack})
        return brokers

    async def metadata(self, request: dict, version: int, header: dict) -> dict:
        data = self.server.data
        image = data.replicas.image
        requested = request.get("Topics")
        names = sorted(image.topics) if requested is None else [
            t.get("Name") for t in requested]
        topics = []
        for name in names:
            topic = image.topics.get(name) if name is not None else None
            if topic is None:
                topics.append({"ErrorCode": messages.ERRORS["UNKNOWN_TOPIC_OR_PARTITION"],
                               "Name": name, "Partitions": []})
                continue
            partitions = []
            for index, reg in sorted(topic.partitions.items()):
                partitions.append({
                    "ErrorCode": 0 if reg.leader >= 0 else messages.ERRORS[
                        "LEADER_NOT_AVAILABLE"],
                    "PartitionIndex": index, "LeaderId": reg.leader,
                    "LeaderEpoch": reg.leader_epoch, "ReplicaNodes": list(reg.replicas),
                    "IsrNodes": list(reg.isr), "OfflineReplicas": []})
            topics.append({"ErrorCode": 0, "Name": name, "TopicId": topic_uuid(topic.topic_id),
                           "IsInternal": name in data.internal_topics,
                           "Partitions": partitions})
        return {"Brokers": self._brokers(image), "ClusterId": data.cluster_id,
                # Admin requests go to a broker, which forwards them (KRaft's answer).
                "ControllerId": self.server.config.node_id, "Topics": topics}

    # -- Produce ---------------------------------------------------------------------------
    async def produce(self, request: dict, version: int, header: dict) -> dict | None:
        data = self.server.data
        acks = request["Acks"]
        items: list[ProduceItem] = []
        refused: dict[TopicPartition, int] = {}
        for topic in request["TopicData"] or ():
            for part in topic["PartitionData"] or ():
                tp = TopicPartition(topic["Name"], part["Index"])
                if tp.topic in data.internal_topics:
                    refused[tp] = messages.ERRORS["INVALID_TOPIC_EXCEPTION"]
                    continue
                try:
                    records = kafka_to_native(part["Records"] or b"")
                except RecordFormatError as exc:
                    refused[tp] = error_code(exc)
                    continue
                items.append(ProduceItem(tp, None, records))
        if acks not in (-1, 0, 1):
            results = [{"topic": i.tp.topic, "partition": i.tp.partition,
                        "error": messages.ERRORS["INVALID_REQUIRED_ACKS"]} for i in items]
        else:
            results, _appended = await data.replicas.produce(items, acks, request["TimeoutMs"])
            for result in results:
                result["error"] = error_code(result.get("error"))
        results += [{"topic": tp.topic, "partition": tp.partition, "error": code}
                    for tp, code in refused.items()]
        if acks == 0:
            return None
        by_topic: dict[str, list[dict]] = {}
        for result in results:
            by_topic.setdefault(result["topic"], []).append({
                "Index": result["partition"], "ErrorCode": result["error"],
                "BaseOffset": result.get("base_offset", -1),
                "LogAppendTimeMs": result.get("log_append_time_ms", -1),
                "LogStartOffset": result.get("log_start_offset", -1)})
        return {"Responses": [{"Name": name, "PartitionResponses": parts}
                              for name, parts in by_topic.items()], "ThrottleTimeMs": 0}

    # -- Fetch -------------------------------------------------------------------------------
    async def fetch(self, request: dict, version: int, header: dict) -> dict:
        data = self.server.data
        specs = []
        for topic in request["Topics"] or ():
            for part in topic["Partitions"] or ():
                epoch = part.get("CurrentLeaderEpoch", -1)
                specs.append(FetchSpec(TopicPartition(topic["Topic"], part["Partition"]),
                                       part["FetchOffset"], max(1, part["PartitionMaxBytes"]),
                                       None if epoch < 0 else epoch,
                                       part.get("LastFetchedEpoch", -1)))
        isolation = READ_COMMITTED if request.get("IsolationLevel") == 1 else READ_UNCOMMITTED
        # Always a consumer's fetch: followers replicate over HTTP.
        fetch = FetchRequest(-1, specs, max(0, request["MaxWaitMs"]),
                             max(0, request["MinBytes"]), max(1, request.get("MaxBytes", 1)),
                             isolation)
        answered = await data.replicas.fetch(fetch) if specs else []
        by_topic: dict[str, list[dict]] = {}
        for result in answered:
            aborted = result.get("aborted_transactions")
            by_topic.setdefault(result["topic"], []).append({
                "PartitionIndex": result["partition"],
                "ErrorCode": error_code(result.get("error")),
                "HighWatermark": result.get("high_watermark", -1),
                "LastStableOffset": result.get("last_stable_offset",
                                               result.get("high_watermark", -1)),
                "LogStartOffset": result.get("log_start_offset", -1),
                "AbortedTransactions": None if aborted is None else [
                    {"ProducerId": a["producer_id"], "FirstOffset": a["first_offset"]}
                    for a in aborted],
                "PreferredReadReplica": -1,
                "Records": native_to_kafka(result.get("records") or b"")})
        return {"ThrottleTimeMs": 0, "ErrorCode": 0, "SessionId": 0,
                "Responses": [{"Topic": name, "Partitions": parts}
                              for name, parts in by_topic.items()]}

    # -- ListOffsets --------------------------------------------------------------------------
    async def list_offsets(self, request: dict, version: int, header: dict) -> dict:
        replicas = self.server.data.replicas
        isolation = READ_COMMITTED if request.get("IsolationLevel") == 1 else READ_UNCOMMITTED
        topics = []
        for topic in request["Topics"] or ():
            partitions = []
            for part in topic["Partitions"] or ():
                answer = {"PartitionIndex": part["PartitionIndex"], "ErrorCode": 0,
                          "Timestamp": -1, "Offset": -1, "LeaderEpoch": -1}
                epoch = part.get("CurrentLeaderEpoch", -1)
                try:
                    leader = replicas.leader_partition(topic["Name"], part["PartitionIndex"],
                                                       None if epoch < 0 else epoch)
                    answer["Offset"], answer["Timestamp"] = offset_for(
                        leader, part["Timestamp"], isolation)
                    answer["LeaderEpoch"] = leader.leader_epoch
                except Exception as exc:  # noqa: BLE001  each partition answers for itself
                    answer["ErrorCode"] = error_code(exc)
                partitions.append(answer)
            topics.append({"Name": topic["Name"], "Partitions": partitions})
        return {"ThrottleTimeMs": 0, "Topics": topics}
