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
ListOffsets, FindCoordinator, InitProducerId, the KIP-848 and the classic
consumer group APIs, OffsetCommit/OffsetFetch, CreateTopics, DeleteTopics,
CreatePartitions, DescribeCluster, and the transaction APIs
(AddPartitionsToTxn, AddOffsetsToTxn, EndTxn, TxnOffsetCommit); the API
versions listed there (produce
and fetch from the first that carries RecordBatch v2). ApiVersions lists
exactly these, so a client degrades cleanly. Fetch sessions (KIP-227) are
answered with session id 0, Kafka's documented fallback: the client sends
full fetch requests.

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
import time
from collections.abc import Callable
from typing import Any

from api.broker.data_api import PRODUCE_TIMEOUT_MS_MAX, offset_for
from api.broker.groups.service import OFFSETS_TOPIC
from api.broker.transactions.service import END_WAIT_S
from api.broker.replication import (READ_COMMITTED, READ_UNCOMMITTED, FetchRequest, FetchSpec,
                                    ProduceItem)
from protocol import TopicPartition
from protocol.fields import Fields
from protocol.kafka import codec, messages
from protocol.kafka.records import kafka_to_native, native_to_kafka
from protocol.errors import InvalidTopicError
from storage.batch import RecordFormatError, iter_batches

logger = logging.getLogger(__name__)

KAFKA_LISTENER = "KAFKA"
API_VERSIONS, METADATA, PRODUCE, FETCH, LIST_OFFSETS = 18, 3, 0, 1, 2
FIND_COORDINATOR, OFFSET_COMMIT, OFFSET_FETCH, INIT_PRODUCER_ID = 10, 8, 9, 22
JOIN_GROUP, HEARTBEAT, LEAVE_GROUP, SYNC_GROUP = 11, 12, 13, 14
CREATE_TOPICS, DELETE_TOPICS, CREATE_PARTITIONS, DESCRIBE_CLUSTER = 19, 20, 37, 60
DESCRIBE_CONFIGS = 32
ADD_PARTITIONS_TO_TXN, ADD_OFFSETS_TO_TXN, END_TXN, TXN_OFFSET_COMMIT = 24, 25, 26, 28
CONSUMER_GROUP_HEARTBEAT = 68
#: API key -> (lowest, highest) version spoken.
SUPPORTED: dict[int, tuple[int, int]] = {
    PRODUCE: (3, 9),        # 3: RecordBatch v2 and transactional ids
    FETCH: (4, 12),         # 4: RecordBatch v2 and isolation levels; 13+ name topics by id
    LIST_OFFSETS: (1, 6),   # 7 adds the max-timestamp query (-3, KIP-734): not answered
    METADATA: (1, 12),
    OFFSET_COMMIT: (2, 9),
    OFFSET_FETCH: (1, 9),
    FIND_COORDINATOR: (0, 4),
    API_VERSIONS: (0, 3),
    INIT_PRODUCER_ID: (0, 4),
    # KIP-848's group protocol, which kraftlog's coordinator speaks (v1: the
    # member names itself, and may subscribe by regex).
    CONSUMER_GROUP_HEARTBEAT: (0, 1),
    # The classic protocol, mapped onto the same coordinator (ClassicGroups).
    JOIN_GROUP: (0, 9),
    SYNC_GROUP: (0, 5),
    HEARTBEAT: (0, 4),
    LEAVE_GROUP: (0, 5),
    # Admin: forwarded to the active controller, as the HTTP admin API does.
    CREATE_TOPICS: (2, 7),
    DELETE_TOPICS: (1, 6),
    CREATE_PARTITIONS: (0, 3),
    DESCRIBE_CLUSTER: (0, 1),
    DESCRIBE_CONFIGS: (0, 4),
    # Transactions, on kraftlog's transaction coordinator (KIP-890's part 1:
    # a partition's first transactional write is checked with it). Later
    # versions are the brokers' batched form and KIP-890's part 2.
    ADD_PARTITIONS_TO_TXN: (0, 3),
    ADD_OFFSETS_TO_TXN: (0, 3),
    END_TXN: (0, 4),
    TXN_OFFSET_COMMIT: (0, 3),
}
#: DescribeConfigs: Kafka's resource type of a topic, and its numbers for
#: where a config value comes from.
TOPIC_RESOURCE = 2
CONFIG_SOURCES = {"TOPIC_CONFIG": 1, "DEFAULT_CONFIG": 5}
#: FindCoordinator's key types.
GROUP_KEY, TRANSACTION_KEY = 0, 1
_SIZE = struct.Struct(">i")
_HEADER = struct.Struct(">hhi")
#: Kafka's smallest request header: key, version, correlation id, client id length.
FRAME_MIN = _HEADER.size + 2
#: Requests other than produce are small; a larger one is refused before it
#: is decoded (a few bytes per element would otherwise become many objects).
FRAME_BYTES_MAX_NOT_PRODUCE = 1024 * 1024
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
            FETCH: self.fetch, LIST_OFFSETS: self.list_offsets,
            FIND_COORDINATOR: self.find_coordinator, INIT_PRODUCER_ID: self.init_producer_id,
            CONSUMER_GROUP_HEARTBEAT: self.consumer_group_heartbeat,
            OFFSET_COMMIT: self.offset_commit, OFFSET_FETCH: self.offset_fetch,
            JOIN_GROUP: self.join_group, SYNC_GROUP: self.sync_group,
            HEARTBEAT: self.heartbeat, LEAVE_GROUP: self.leave_group,
            CREATE_TOPICS: self.create_topics, DELETE_TOPICS: self.delete_topics,
            CREATE_PARTITIONS: self.create_partitions, DESCRIBE_CLUSTER: self.describe_cluster,
            DESCRIBE_CONFIGS: self.describe_configs,
            ADD_PARTITIONS_TO_TXN: self.add_partitions_to_txn,
            ADD_OFFSETS_TO_TXN: self.add_offsets_to_txn, END_TXN: self.end_txn,
            TXN_OFFSET_COMMIT: self.txn_offset_commit}
        #: The classic members this broker's coordinators serve: (group,
        #: member id) -> what the member was told (``_Classic``).
        self._classic: dict[tuple[str, str], _Classic] = {}
        self._ids_at: int | None = None
        self._names_by_id: dict[bytes, str] = {}

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
                if size > FRAME_BYTES_MAX_NOT_PRODUCE and \
                        _HEADER.unpack_from(frame)[0] != PRODUCE:
                    logger.debug("kafka listener: %s sent a %d-byte request that is not a "
                                 "produce: closing", peer, size)
                    return
                answer = await self._answer(frame, peer)
                if answer is False:
                    return
                if answer is not None:
                    writer.write(_SIZE.pack(len(answer)))
                    writer.write(answer)
                    # A client that stops reading is cut off like an idle one
                    # (its answers would otherwise stay in memory).
                    await asyncio.wait_for(writer.drain(), self.idle_s)
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
        try:
            body = await self.handlers[api_key](request, version, header)
            if body is None:
                return None
            return self._respond(api_key, version, correlation_id, body)
        except Exception:  # noqa: BLE001  one request's failure, not the broker's
            # A request this listener could not make sense of, or its own
            # defect: logged whole, and the connection closed (the client
            # reconnects and retries), never the broker's other work.
            logger.exception("kafka listener: %s: API %d v%d failed", peer, api_key, version)
            return False

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
        # v10+: a topic may be asked for by id (a KIP-848 assignment names
        # topics by id), its name null.
        by_id = self._topic_names()
        wanted = [(name, None) for name in sorted(image.topics)] if requested is None else list(
            dict.fromkeys((t.get("Name") if t.get("Name") is not None
                           else by_id.get(t.get("TopicId")), t.get("TopicId"))
                          for t in requested))  # each topic answered once
        topics = []
        for name, asked_id in wanted:
            topic = image.topics.get(name) if name is not None else None
            if topic is None:
                unknown_id = name is None and asked_id not in (None, codec.ZERO_UUID)
                topics.append({"ErrorCode": messages.ERRORS[
                    "UNKNOWN_TOPIC_ID" if unknown_id else "UNKNOWN_TOPIC_OR_PARTITION"],
                    # A name is nullable from v12 only.
                    "Name": name if name is not None or version >= 12 else "",
                    "TopicId": asked_id or codec.ZERO_UUID, "Partitions": []})
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
        tid = request.get("TransactionalId")
        if tid is not None and items:
            # KIP-890: a transaction's first write to a partition led here is
            # checked with its coordinator, as the HTTP produce does.
            for tp, exc in (await data.verify_transaction(
                    Fields({"transactional_id": tid}, ""), items)).items():
                refused[tp] = error_code(exc)
            items = [item for item in items if item.tp not in refused]
        if acks not in (-1, 0, 1):
            results = [{"topic": i.tp.topic, "partition": i.tp.partition,
                        "error": messages.ERRORS["INVALID_REQUIRED_ACKS"]} for i in items]
        else:
            timeout_ms = min(max(0, request["TimeoutMs"]), PRODUCE_TIMEOUT_MS_MAX)
            results, appended = await data.replicas.produce(items, acks, timeout_ms)
            for result in results:
                result["error"] = error_code(result.get("error"))
            for topic, info in appended:  # the same metrics as the HTTP produce's
                data.metrics.bytes_in.inc(info.size_bytes, topic)
                data.metrics.messages_in.inc(info.record_count, topic)
        results += [{"topic": tp.topic, "partition": tp.partition, "error": code}
                    for tp, code in refused.items()]
        if acks == 0:
            # Nothing is answered; a failed write closes the connection, as
            # Kafka does, so the client notices (and refreshes its metadata).
            return False if any(r["error"] for r in results) else None
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
            stored = result.get("records") or b""
            if stored:  # the same metrics as the HTTP fetch's
                data.metrics.bytes_out.inc(len(stored), result["topic"])
                data.metrics.messages_out.inc(sum(h.record_count for h, _ in
                                                  iter_batches(stored)), result["topic"])
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
                **_kafka_records(result)})
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
                if part["Timestamp"] < EARLIEST:
                    answer["ErrorCode"] = messages.ERRORS["INVALID_REQUEST"]
                    partitions.append(answer)
                    continue
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

    # -- coordinators -----------------------------------------------------------------------
    def _node(self, broker_id: int) -> tuple[str, int]:
        broker = self.server.data.replicas.image.brokers.get(broker_id)
        address = broker.endpoints.get(KAFKA_LISTENER) if broker is not None else None
        if not address:
            return "", -1
        host, _, port = address.rpartition(":")
        return host.strip("[]"), int(port)

    async def _coordinator(self, key_type: int, key: str) -> dict:
        service = self.server.groups if key_type == GROUP_KEY else self.server.transactions
        answer = {"Key": key, "NodeId": -1, "Host": "", "Port": -1, "ErrorCode": 0,
                  "ErrorMessage": None}
        if key_type not in (GROUP_KEY, TRANSACTION_KEY):
            answer.update(ErrorCode=messages.ERRORS["INVALID_REQUEST"],
                          ErrorMessage=f"key type {key_type}: kraftlog has group (0) and "
                                       "transaction (1) coordinators")
            return answer
        try:
            found = await service.locate(key)
        except Exception as exc:  # noqa: BLE001  answered as its code
            answer.update(ErrorCode=error_code(exc), ErrorMessage=str(exc))
            return answer
        host, port = self._node(found["coordinator_id"])
        if port < 0:
            answer.update(ErrorCode=messages.ERRORS["COORDINATOR_NOT_AVAILABLE"],
                          ErrorMessage="the coordinator has no KAFKA listener")
            return answer
        answer.update(NodeId=found["coordinator_id"], Host=host, Port=port)
        return answer

    async def find_coordinator(self, request: dict, version: int, header: dict) -> dict:
        key_type = request.get("KeyType", GROUP_KEY)
        if version >= 4:
            return {"ThrottleTimeMs": 0, "Coordinators": [
                await self._coordinator(key_type, key) for key in request["CoordinatorKeys"]]}
        answer = await self._coordinator(key_type, request["Key"])
        answer.pop("Key")
        return {"ThrottleTimeMs": 0, **answer}

    async def init_producer_id(self, request: dict, version: int, header: dict) -> dict:
        tid = request["TransactionalId"]
        answer = {"ThrottleTimeMs": 0, "ErrorCode": 0, "ProducerId": -1, "ProducerEpoch": -1}
        try:
            if tid is None:  # an idempotent producer
                answer["ProducerId"] = await self.server.producer_api.ids.next_id()
                answer["ProducerEpoch"] = 0
            else:
                found = await self.server.transactions.init_producer_id(
                    tid, request["TransactionTimeoutMs"], request.get("ProducerId", -1),
                    request.get("ProducerEpoch", -1), False)
                if found.get("error"):
                    answer["ErrorCode"] = error_code(found["error"])
                else:
                    answer["ProducerId"] = found["producer_id"]
                    answer["ProducerEpoch"] = found["producer_epoch"]
        except Exception as exc:  # noqa: BLE001  answered as its code
            answer["ErrorCode"] = error_code(exc)
        return answer

    # -- consumer groups (KIP-848) ----------------------------------------------------------
    def _topic_names(self) -> dict[bytes, str]:
        image = self.server.data.replicas.image
        if self._ids_at != image.offset:
            self._names_by_id = {topic_uuid(t.topic_id): name
                                 for name, t in image.topics.items()}
            self._ids_at = image.offset
        return self._names_by_id

    async def consumer_group_heartbeat(self, request: dict, version: int, header: dict) -> dict:
        from api.broker.groups.coordinator import HeartbeatRequest

        names = self._topic_names()
        owned = request["TopicPartitions"]
        heartbeat = HeartbeatRequest(
            member_id=request["MemberId"], member_epoch=request["MemberEpoch"],
            instance_id=request["InstanceId"],
            rebalance_timeout_ms=None if request["RebalanceTimeoutMs"] < 0
            else request["RebalanceTimeoutMs"],
            subscribed_topic_names=request["SubscribedTopicNames"],
            subscribed_topic_regex=request.get("SubscribedTopicRegex"),
            server_assignor=request["ServerAssignor"],
            owned_partitions=None if owned is None else [
                TopicPartition(names[t["TopicId"]], p) for t in owned
                if t["TopicId"] in names for p in t["Partitions"]],
            client_id=header.get("ClientId"))
        service = self.server.groups
        try:
            response = await service.run(request["GroupId"], lambda core: core.heartbeat(
                service.clock_ms(), request["GroupId"], heartbeat, service.topics()))
        except Exception as exc:  # noqa: BLE001  answered as its code
            return {"ErrorCode": error_code(exc), "ErrorMessage": str(exc),
                    "MemberEpoch": -1, "HeartbeatIntervalMs": 0}
        assignment = None
        if response.assignment is not None:
            image = self.server.data.replicas.image
            by_topic: dict[str, list[int]] = {}
            for topic, partition in response.assignment:
                by_topic.setdefault(topic, []).append(partition)
            assignment = {"TopicPartitions": [
                {"TopicId": topic_uuid(image.topics[t].topic_id), "Partitions": ps}
                for t, ps in sorted(by_topic.items()) if t in image.topics]}
        return {"ErrorCode": 0, "MemberId": response.member_id,
                "MemberEpoch": response.member_epoch,
                "HeartbeatIntervalMs": response.heartbeat_interval_ms,
                "Assignment": assignment}

    async def offset_commit(self, request: dict, version: int, header: dict) -> dict:
        group_id = request["GroupId"]
        offsets = {TopicPartition(t["Name"], p["PartitionIndex"]):
                   (p["CommittedOffset"], p.get("CommittedMetadata") or "")
                   for t in request["Topics"] or () for p in t["Partitions"] or ()}
        service = self.server.groups
        member_id = request.get("MemberId", "")
        epoch = request.get("GenerationIdOrMemberEpoch", -1)
        classic = self._classic.get((group_id, member_id))
        if classic is not None and epoch == classic.generation:
            # A classic member commits under the generation it was told;
            # the coordinator knows the member's epoch, which heartbeats
            # may have moved on since without changing its partitions.
            epoch = classic.epoch
        answer = await _commit_answer(offsets, service.run(
            group_id, lambda core: core.commit_offsets(service.clock_ms(), group_id, member_id,
                                                       epoch, offsets)))
        if classic is not None or version < 9:  # a classic member: its words for it
            for topic in answer["Topics"]:
                for partition in topic["Partitions"]:
                    partition["ErrorCode"] = _classic_number(partition["ErrorCode"])
        return answer

    async def _committed(self, group_id: str, topics: list[dict] | None
                         ) -> tuple[int, list[dict]]:
        wanted = None if topics is None else [
            TopicPartition(t["Name"], p) for t in topics for p in t["PartitionIndexes"]]
        service = self.server.groups
        try:
            committed = await service.run(
                group_id, lambda core: (core.fetch_offsets(group_id, wanted), []))
        except Exception as exc:  # noqa: BLE001  answered as its code
            return error_code(exc), []
        by_topic: dict[str, list[dict]] = {}
        for topic, partition in (wanted if wanted is not None else sorted(committed)):
            found = committed.get((topic, partition))
            offset, metadata = found[:2] if found is not None else (-1, "")
            by_topic.setdefault(topic, []).append({
                "PartitionIndex": partition, "CommittedOffset": offset,
                "CommittedLeaderEpoch": -1, "Metadata": metadata, "ErrorCode": 0})
        return 0, [{"Name": name, "Partitions": parts} for name, parts in by_topic.items()]

    async def offset_fetch(self, request: dict, version: int, header: dict) -> dict:
        if version >= 8:
            groups = []
            for group in request["Groups"]:
                code, topics = await self._committed(group["GroupId"], group["Topics"])
                groups.append({"GroupId": group["GroupId"], "Topics": topics,
                               "ErrorCode": code})
            return {"ThrottleTimeMs": 0, "Groups": groups}
        code, topics = await self._committed(request["GroupId"], request["Topics"])
        return {"ThrottleTimeMs": 0, "Topics": topics, "ErrorCode": code}

    # -- consumer groups: the classic protocol ---------------------------------------------
    # kafka-python, aiokafka and librdkafka's default speak JoinGroup,
    # SyncGroup, Heartbeat and LeaveGroup, where a leader member computes
    # the assignment. Here, as in Kafka 4's groups of the consumer type, the
    # coordinator assigns (KIP-848) and a classic member is a member like
    # any other: JoinGroup joins it (its subscription from its metadata),
    # no member is made leader, SyncGroup hands it what the coordinator gave
    # it, and a heartbeat whose answer would change that asks it to rejoin
    # (REBALANCE_IN_PROGRESS), which revokes what it holds (the eager
    # protocol these clients use by default).
    async def _classic_beat(self, group_id: str, heartbeat) -> Any:
        service = self.server.groups
        return await service.run(group_id, lambda core: core.heartbeat(
            service.clock_ms(), group_id, heartbeat, service.topics()))

    async def join_group(self, request: dict, version: int, header: dict) -> dict:
        import uuid

        from api.broker.groups.coordinator import HeartbeatRequest

        group_id = request["GroupId"]
        answer = {"ThrottleTimeMs": 0, "ErrorCode": 0, "GenerationId": -1,
                  "ProtocolType": "consumer", "ProtocolName": None, "Leader": "",
                  "MemberId": request["MemberId"], "Members": []}
        protocols = request["Protocols"] or []
        if request["ProtocolType"] != "consumer" or not protocols:
            answer["ErrorCode"] = messages.ERRORS["INCONSISTENT_GROUP_PROTOCOL"]
            return answer
        try:
            topics = _subscription(protocols[0]["Metadata"])
        except codec.KafkaDecodeError:
            answer["ErrorCode"] = messages.ERRORS["INCONSISTENT_GROUP_PROTOCOL"]
            return answer
        member_id = request["MemberId"] or f"{header.get('ClientId') or 'consumer'}-" \
                                           f"{uuid.uuid4()}"
        rebalance = request.get("RebalanceTimeoutMs", request["SessionTimeoutMs"])
        heartbeat = HeartbeatRequest(
            member_id=member_id, member_epoch=0, instance_id=request.get("GroupInstanceId"),
            rebalance_timeout_ms=max(0, rebalance),
            session_timeout_ms=request["SessionTimeoutMs"], subscribed_topic_names=topics,
            owned_partitions=[], client_id=header.get("ClientId"))
        try:
            response = await self._classic_beat(group_id, heartbeat)
        except Exception as exc:  # noqa: BLE001  answered as its code
            answer["ErrorCode"] = _classic_code(exc)
            return answer
        self._forget_silent_members()
        self._classic[(group_id, member_id)] = _Classic(
            response.member_epoch, response.member_epoch,
            frozenset(map(tuple, response.assignment or ())), protocols[0]["Name"])
        answer.update(GenerationId=response.member_epoch, ProtocolName=protocols[0]["Name"],
                      Leader=CLASSIC_LEADER, MemberId=member_id)
        return answer

    def _forget_silent_members(self) -> None:
        """Past CLASSIC_MEMBERS_MAX, forget the members silent for an hour
        (a member that died without leaving; the coordinator dropped it
        long ago: it would have to rejoin anyway)."""
        if len(self._classic) < CLASSIC_MEMBERS_MAX:
            return
        horizon = time.monotonic() - CLASSIC_SILENT_S
        self._classic = {key: member for key, member in self._classic.items()
                         if member.seen >= horizon}

    async def sync_group(self, request: dict, version: int, header: dict) -> dict:
        group_id, member_id = request["GroupId"], request["MemberId"]
        answer = {"ThrottleTimeMs": 0, "ErrorCode": 0, "ProtocolType": "consumer",
                  "ProtocolName": None, "Assignment": b""}
        classic = self._classic.get((group_id, member_id))
        if classic is None:
            answer["ErrorCode"] = _unknown_here(member_id)
            return answer
        if request["GenerationId"] != classic.generation:
            answer["ErrorCode"] = messages.ERRORS["ILLEGAL_GENERATION"]
            return answer
        code = await self._beat_classic(group_id, member_id, classic, keep=False)
        answer.update(ErrorCode=code, ProtocolName=classic.protocol,
                      Assignment=_assignment(classic.assigned) if code == 0 else b"")
        return answer

    async def _beat_classic(self, group_id: str, member_id: str, classic: "_Classic",
                            keep: bool) -> int:
        """A heartbeat for a classic member holding ``classic.assigned``. With
        ``keep``, an answer that would change its partitions asks it to
        rejoin instead; without, the change is what it is told (SyncGroup)."""
        from api.broker.groups.coordinator import HeartbeatRequest

        classic.seen = time.monotonic()
        heartbeat = HeartbeatRequest(member_id=member_id, member_epoch=classic.epoch,
                                     owned_partitions=sorted(classic.assigned))
        try:
            response = await self._classic_beat(group_id, heartbeat)
        except Exception as exc:  # noqa: BLE001  answered as its code
            if error_code(exc) in (messages.ERRORS["UNKNOWN_MEMBER_ID"],
                                   messages.ERRORS["FENCED_MEMBER_EPOCH"]):
                self._classic.pop((group_id, member_id), None)
            return _classic_code(exc)
        classic.epoch = response.member_epoch
        if response.assignment is not None:
            given = frozenset(map(tuple, response.assignment))
            if given != classic.assigned:
                if keep:
                    return messages.ERRORS["REBALANCE_IN_PROGRESS"]
                classic.assigned = given
        return 0

    async def heartbeat(self, request: dict, version: int, header: dict) -> dict:
        group_id, member_id = request["GroupId"], request["MemberId"]
        classic = self._classic.get((group_id, member_id))
        if classic is None:
            code = _unknown_here(member_id)
        elif request["GenerationId"] != classic.generation:
            code = messages.ERRORS["ILLEGAL_GENERATION"]
        else:
            code = await self._beat_classic(group_id, member_id, classic, keep=True)
        return {"ThrottleTimeMs": 0, "ErrorCode": code}

    async def leave_group(self, request: dict, version: int, header: dict) -> dict:
        from api.broker.groups.coordinator import LEAVE_EPOCH, HeartbeatRequest

        group_id = request["GroupId"]
        leaving = ([{"MemberId": request["MemberId"], "GroupInstanceId": None}]
                   if version < 3 else request["Members"] or [])
        members = []
        for member in leaving:
            code = 0
            try:
                await self._classic_beat(group_id, HeartbeatRequest(
                    member_id=member["MemberId"], member_epoch=LEAVE_EPOCH))
            except Exception as exc:  # noqa: BLE001  answered as its code
                code = _classic_code(exc)
            self._classic.pop((group_id, member["MemberId"]), None)
            members.append({"MemberId": member["MemberId"],
                            "GroupInstanceId": member.get("GroupInstanceId"),
                            "ErrorCode": code})
        top = members[0]["ErrorCode"] if version < 3 and members else 0
        return {"ThrottleTimeMs": 0, "ErrorCode": top, "Members": members}


    # -- admin --------------------------------------------------------------------------------
    async def _admin(self, path: str, body: dict) -> tuple[dict | None, int, str | None]:
        """The controller's answer to an admin request (as the HTTP admin
        API forwards it), or the error that kept it from answering."""
        try:
            return await self.server.forward_admin(path, body), 0, None
        except Exception as exc:  # noqa: BLE001  answered as its code
            return None, error_code(exc), str(exc)

    @staticmethod
    def _entry_error(entry: dict) -> tuple[int, str | None]:
        error = entry.get("error")
        return (0, None) if not error else (error_code(error), error.get("message"))

    async def create_topics(self, request: dict, version: int, header: dict) -> dict:
        topics = request["Topics"] or []
        answer, code, message = await self._admin("/v1/controller/topics/create", {
            # Kafka's definition spells these two in lower camel case.
            "validate_only": bool(request.get("validateOnly")),
            "timeout_ms": max(0, request["timeoutMs"]),
            "topics": [{"name": t["Name"], "num_partitions": t["NumPartitions"],
                        "replication_factor": t["ReplicationFactor"],
                        "configs": {c["Name"]: c["Value"] for c in t["Configs"] or ()},
                        **({"assignments": {a["PartitionIndex"]: a["BrokerIds"]
                                            for a in t["Assignments"]}}
                           if t["Assignments"] else {})} for t in topics]})
        results = []
        by_name = {e["name"]: e for e in (answer or {}).get("topics") or ()}
        for t in topics:
            entry = by_name.get(t["Name"], {})
            entry_code, entry_message = (code, message) if answer is None \
                else self._entry_error(entry)
            results.append({
                "Name": t["Name"], "TopicId": topic_uuid(entry.get("topic_id")),
                "ErrorCode": entry_code, "ErrorMessage": entry_message,
                "NumPartitions": entry.get("num_partitions", -1),
                "ReplicationFactor": entry.get("replication_factor", -1),
                "Configs": None if entry_code else [
                    {"Name": k, "Value": None if v is None else str(v), "ReadOnly": False,
                     "ConfigSource": 5, "IsSensitive": False}  # 5: the cluster's default
                    for k, v in sorted((entry.get("configs") or {}).items())]})
        return {"ThrottleTimeMs": 0, "Topics": results}

    async def delete_topics(self, request: dict, version: int, header: dict) -> dict:
        names = (request["TopicNames"] or []) if version < 6 else [
            t["Name"] if t["Name"] is not None else self._topic_names().get(t["TopicId"])
            for t in request["Topics"] or ()]
        wanted = [n for n in names if n is not None]
        answer, code, message = await self._admin("/v1/controller/topics/delete",
                                                  {"topics": wanted})
        by_name = {e["name"]: e for e in (answer or {}).get("topics") or ()}
        results = []
        for name in names:
            if name is None:
                results.append({"Name": None, "ErrorCode": messages.ERRORS["UNKNOWN_TOPIC_ID"],
                                "ErrorMessage": "no topic has that id"})
                continue
            entry_code, entry_message = (code, message) if answer is None \
                else self._entry_error(by_name.get(name, {}))
            results.append({"Name": name, "ErrorCode": entry_code,
                            "ErrorMessage": entry_message})
        return {"ThrottleTimeMs": 0, "Responses": results}

    async def create_partitions(self, request: dict, version: int, header: dict) -> dict:
        topics = request["Topics"] or []
        answer, code, message = await self._admin("/v1/controller/partitions/create", {
            "validate_only": bool(request.get("ValidateOnly")),
            "topics": [{"name": t["Name"], "count": t["Count"]} for t in topics]})
        by_name = {e["name"]: e for e in (answer or {}).get("topics") or ()}
        results = []
        for t in topics:
            entry_code, entry_message = (code, message) if answer is None \
                else self._entry_error(by_name.get(t["Name"], {}))
            results.append({"Name": t["Name"], "ErrorCode": entry_code,
                            "ErrorMessage": entry_message})
        return {"ThrottleTimeMs": 0, "Results": results}

    async def describe_configs(self, request: dict, version: int, header: dict) -> dict:
        """Topics' configs (resource type 2), with where each value comes
        from; a broker's (4) are refused, saying so: kraftlog's node configs
        are read with ``kraftlog node --print-config``."""
        results = []
        for resource in request["Resources"] or ():
            kind, name = resource["ResourceType"], resource["ResourceName"]
            result = {"ErrorCode": 0, "ErrorMessage": None, "ResourceType": kind,
                      "ResourceName": name, "Configs": []}
            results.append(result)
            if kind != TOPIC_RESOURCE:
                result.update(ErrorCode=messages.ERRORS["INVALID_REQUEST"],
                              ErrorMessage=f"resource type {kind}: kraftlog describes topic "
                                           "configs (2) here; a node's are shown by "
                                           "`kraftlog node --print-config`")
                continue
            body: dict = {"type": "topic", "name": name}
            if resource["ConfigurationKeys"] is not None:
                body["keys"] = list(resource["ConfigurationKeys"])
            answer, code, message = await self._admin("/v1/controller/configs/describe",
                                                      {"resources": [body]})
            entries = (answer or {}).get("resources") or [{}]
            if answer is not None:
                code, message = self._entry_error(entries[0])
            if code:
                result.update(ErrorCode=code, ErrorMessage=message)
                continue
            for entry in entries[0].get("configs") or ():
                source = CONFIG_SOURCES.get(entry.get("source"), 0)
                value = entry.get("value")
                result["Configs"].append({
                    "Name": entry["name"], "Value": None if value is None else str(value),
                    "ReadOnly": bool(entry.get("read_only")), "IsDefault": source == 5,
                    "ConfigSource": source, "IsSensitive": False, "Synonyms": []})
        return {"ThrottleTimeMs": 0, "Results": results}

    async def describe_cluster(self, request: dict, version: int, header: dict) -> dict:
        image = self.server.data.replicas.image
        return {"ThrottleTimeMs": 0, "ErrorCode": 0, "ErrorMessage": None, "EndpointType": 1,
                "ClusterId": self.server.data.cluster_id,
                "ControllerId": self.server.config.node_id,
                "Brokers": [{"BrokerId": b["NodeId"], "Host": b["Host"], "Port": b["Port"],
                             "Rack": b["Rack"]} for b in self._brokers(image)],
                "ClusterAuthorizedOperations": -2147483648}


    # -- transactions ---------------------------------------------------------------------------
    async def _txn(self, tid: str, operation) -> int:
        try:
            await self.server.transactions.run(tid, operation)
        except Exception as exc:  # noqa: BLE001  answered as its code
            return error_code(exc)
        return 0

    async def add_partitions_to_txn(self, request: dict, version: int, header: dict) -> dict:
        tid = request["V3AndBelowTransactionalId"]
        pid, epoch = request["V3AndBelowProducerId"], request["V3AndBelowProducerEpoch"]
        topics = request["V3AndBelowTopics"] or []
        partitions = [TopicPartition(t["Name"], p) for t in topics for p in t["Partitions"]]
        service = self.server.transactions
        try:
            if any(tp.topic in self.server.data.internal_topics for tp in partitions):
                raise InvalidTopicError("the internal topics take no producer's writes")
            service.check_partitions(partitions)
            code = await self._txn(tid, lambda core: core.add_partitions(
                tid, pid, epoch, partitions, service.clock_ms()))
        except Exception as exc:  # noqa: BLE001  answered as its code
            code = error_code(exc)
        return {"ThrottleTimeMs": 0, "ResultsByTopicV3AndBelow": [
            {"Name": t["Name"], "ResultsByPartition": [
                {"PartitionIndex": p, "PartitionErrorCode": code} for p in t["Partitions"]]}
            for t in topics]}

    async def add_offsets_to_txn(self, request: dict, version: int, header: dict) -> dict:
        tid, group_id = request["TransactionalId"], request["GroupId"]
        service = self.server.transactions
        try:
            # The group's offsets partition joins the transaction (Kafka's
            # AddOffsetsToTxn); the offsets come with TxnOffsetCommit.
            found = await self.server.groups.locate(group_id)
            offsets = [TopicPartition(OFFSETS_TOPIC, found["partition"])]
            code = await self._txn(tid, lambda core: core.add_partitions(
                tid, request["ProducerId"], request["ProducerEpoch"], offsets,
                service.clock_ms()))
        except Exception as exc:  # noqa: BLE001  answered as its code
            code = error_code(exc)
        return {"ThrottleTimeMs": 0, "ErrorCode": code}

    async def end_txn(self, request: dict, version: int, header: dict) -> dict:
        tid = request["TransactionalId"]
        service = self.server.transactions
        code = await self._txn(tid, lambda core: core.end_txn(
            tid, request["ProducerId"], request["ProducerEpoch"], request["Committed"],
            service.clock_ms()))
        if code == 0:
            # Answered once the markers are written, as the HTTP API answers.
            await service.wait_markers(tid, END_WAIT_S)
        return {"ThrottleTimeMs": 0, "ErrorCode": code}

    async def txn_offset_commit(self, request: dict, version: int, header: dict) -> dict:
        offsets = {TopicPartition(t["Name"], p["PartitionIndex"]):
                   (p["CommittedOffset"], p.get("CommittedMetadata") or "")
                   for t in request["Topics"] or () for p in t["Partitions"] or ()}
        return await _commit_answer(offsets, self.server.groups.txn_commit(
            request["GroupId"], request["ProducerId"], request["ProducerEpoch"], offsets))


def _kafka_records(result: dict) -> dict:
    """A fetch result's batches in Kafka's format. A stored batch that does
    not convert (written over HTTP, whose produce checks batches, not each
    record) answers its partition CORRUPT_MESSAGE, with the batches before
    it; the request's other partitions are answered as usual."""
    records = result.get("records") or b""
    try:
        return {"Records": native_to_kafka(records)}
    except RecordFormatError as exc:
        good = bytearray()
        for _header, batch in iter_batches(records):
            try:
                good += native_to_kafka(batch)
            except RecordFormatError:
                break
        if good:
            return {"Records": bytes(good)}
        logger.warning("kafka listener: %s-%s: a stored batch does not convert: %s",
                       result.get("topic"), result.get("partition"), exc)
        return {"Records": b"", "ErrorCode": messages.ERRORS["CORRUPT_MESSAGE"]}


async def _commit_answer(offsets: dict, committing) -> dict:
    """OffsetCommit's (or TxnOffsetCommit's) answer: each partition's code
    from ``committing`` (a coroutine answering partition -> error code or
    None), or its refusal of the whole request for every partition."""
    try:
        codes = {tp: error_code(None if code is None else {"code": code})
                 for tp, code in (await committing).items()}
    except Exception as exc:  # noqa: BLE001  the whole request answered as its code
        codes = {tp: error_code(exc) for tp in offsets}
    by_topic: dict[str, list[dict]] = {}
    for (topic, partition), code in sorted(codes.items()):
        by_topic.setdefault(topic, []).append({"PartitionIndex": partition, "ErrorCode": code})
    return {"ThrottleTimeMs": 0, "Topics": [{"Name": name, "Partitions": parts}
                                            for name, parts in by_topic.items()]}


#: The leader a classic member is told of: never itself, so no member
#: computes an assignment (the coordinator does).
CLASSIC_LEADER = "kraftlog-coordinator"
#: Classic members remembered before silent ones are forgotten.
CLASSIC_MEMBERS_MAX = 10_000
CLASSIC_SILENT_S = 3600.0


class _Classic:
    """A classic member as this listener told it: its generation (the member
    epoch at its JoinGroup), the coordinator's epoch for it now, the
    partitions it was given, its protocol (assignor) name."""

    __slots__ = ("generation", "epoch", "assigned", "protocol", "seen")

    def __init__(self, generation: int, epoch: int, assigned: frozenset, protocol: str):
        self.generation, self.epoch, self.assigned = generation, epoch, assigned
        self.protocol = protocol
        self.seen = time.monotonic()


def _unknown_here(member_id: str) -> int:
    """A classic member this listener has not seen join: after a coordinator
    moved or restarted, a member the group still knows. Asked to rejoin
    keeping its id (REBALANCE_IN_PROGRESS), it takes back its place rather
    than waiting out its old session as a stranger."""
    return messages.ERRORS["REBALANCE_IN_PROGRESS" if member_id else "UNKNOWN_MEMBER_ID"]


def _classic_code(exc: Exception) -> int:
    return _classic_number(error_code(exc))


def _classic_number(code: int) -> int:
    """A coordinator refusal in the classic protocol's words: KIP-848's
    epoch errors become ILLEGAL_GENERATION, which makes the member rejoin."""
    if code in (messages.ERRORS["FENCED_MEMBER_EPOCH"], messages.ERRORS["STALE_MEMBER_EPOCH"]):
        return messages.ERRORS["ILLEGAL_GENERATION"]
    return code


def _subscription(metadata: bytes) -> list[str]:
    """The topics of a classic member's ConsumerProtocolSubscription (an
    int16 version, then the struct at that version, newer read as the
    newest known)."""
    if len(metadata) < 2:
        raise codec.KafkaDecodeError("a subscription without its version")
    (version,) = struct.unpack_from(">h", metadata)
    schema = messages.ConsumerProtocolSubscription
    version = max(0, min(version, schema["valid"][1]))
    decoded, _ = codec.decode(schema, version, metadata, 2)
    return [t for t in decoded["Topics"] or () if t]


def _assignment(partitions: frozenset) -> bytes:
    """ConsumerProtocolAssignment v0 of ``partitions``."""
    by_topic: dict[str, list[int]] = {}
    for topic, partition in sorted(partitions):
        by_topic.setdefault(topic, []).append(partition)
    out = bytearray(struct.pack(">h", 0))
    codec.encode(messages.ConsumerProtocolAssignment, 0, {"AssignedPartitions": [
        {"Topic": t, "Partitions": ps} for t, ps in by_topic.items()], "UserData": None}, out)
    return bytes(out)
