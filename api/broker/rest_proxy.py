"""REST conveniences for curl users, shaped like Confluent REST Proxy v2.

  POST /topics/{topic}                              produce JSON or base64 records
  GET  /topics/{topic}/partitions/{p}/records       read records as JSON, from
                                                    ?offset= or ?timestamp= (ms)
  GET  /topics/{topic}/partitions/{p}/offsets       beginning and end offsets, or
                                                    with ?timestamp= the first
                                                    offset at or after it

Any broker answers: records are built into batches here and sent to each
partition's leader with the ordinary ``/v1/produce`` (and read with
``/v1/fetch``), the same path a client takes, so the proxy needs no special
powers. Embedded formats, chosen by ``Content-Type`` (produce) or
``Accept`` (read):

  application/vnd.kafka.json.v2+json    keys and values are JSON values,
                                        stored as their compact JSON text
                                        (also plain application/json)
  application/vnd.kafka.binary.v2+json  keys and values are base64 strings

Beyond REST Proxy v2, a record may carry ``headers``: a list of ``{"key":
name, "value": ...}``, the value a base64 string in the binary format and a
UTF-8 string in the JSON format (or null), on produce and on read.
"""

from __future__ import annotations

import base64
import binascii
import json
import random
from typing import Any, Protocol

import aiohttp
import msgpack
from aiohttp import web

from api.broker.replication import broker_url
from kraft.authorizer import auth_of
from protocol import acl, validate_topic_name, wire
from protocol.errors import (RETRIABLE_CODES, InvalidRequestError, KraftError,
                             LeaderNotAvailableError, UnknownTopicOrPartitionError)
from protocol.fields import Fields, printable
from protocol.partitioner import partition_for_key
from protocol.quotas import CLIENT_ID_HEADER
from storage.batch import BatchBuilder, iter_batches, iter_records, without_aborted

#: The client id the proxy's calls to partition leaders carry (client quotas).
REST_PROXY_CLIENT_ID = "rest-proxy"


class BrokerHost(Protocol):
    """What the REST proxy uses of the broker it runs in (``BrokerServer``):
    its metadata image, its log defaults and its HTTP client session."""

    lifecycle: Any  # .image: the broker's MetadataImage
    log_manager: Any  # .default_log_config
    session: aiohttp.ClientSession


JSON_V2 = "application/vnd.kafka.json.v2+json"
BINARY_V2 = "application/vnd.kafka.binary.v2+json"
RECORDS_PER_REQUEST_MAX = 10_000
READ_BYTES_DEFAULT = 1024 * 1024
HEADERS_PER_RECORD_MAX = 1000
HEADER_KEY_CHARS_MAX = 32_767
READ_WAIT_MS_MAX = 30_000
FORWARD_TIMEOUT_S = 35.0


class RestProxy:
    def __init__(self, server: BrokerHost) -> None:
        self.server = server

    def add_routes(self, app: web.Application) -> None:
        app.router.add_post("/topics/{topic}", self.handle_produce)
        app.router.add_get("/topics/{topic}/partitions/{partition}/records", self.handle_read)
        app.router.add_get("/topics/{topic}/partitions/{partition}/offsets", self.handle_offsets)

    # -- produce -----------------------------------------------------------------
    async def handle_produce(self, request: web.Request) -> web.Response:
        content_type = request.content_type
        if content_type not in (JSON_V2, BINARY_V2, wire.JSON):
            raise InvalidRequestError(
                f"Content-Type must be {JSON_V2}, {BINARY_V2} or {wire.JSON}, "
                f"not {content_type or 'missing'}")
        binary = content_type == BINARY_V2
        body = Fields(await _read_json(request), "")
        topic = request.match_info["topic"]
        # Here, at the broker the client called: the leader sees this node.
        auth_of(request).require(acl.WRITE, acl.TOPIC, topic)
        items = body.sequence("records", RECORDS_PER_REQUEST_MAX)
        if not items:
            raise InvalidRequestError("records must hold at least one record")
        count = self._partition_count(topic)
        sticky = random.randrange(count)
        placed: dict[int, list[tuple[int, bytes | None, bytes | None, list]]] = {}
        for i, item in enumerate(items):
            fields = Fields(item, f"records[{i}]")
            key = _encode(fields.values.get("key"), binary, f"records[{i}].key")
            value = _encode(fields.values.get("value"), binary, f"records[{i}].value")
            headers = _headers(fields, binary, f"records[{i}].headers")
            partition = fields.integer("partition", 0, count - 1, default=None)
            if partition is None:
                partition = partition_for_key(key, count) if key is not None else sticky
            placed.setdefault(partition, []).append((i, key, value, headers))
        offsets: list[dict] = [{}] * len(items)
        batch_bytes_max = self._batch_bytes_max(topic)
        for partition, records in sorted(placed.items()):
            try:
                outcome = await self._produce(topic, partition, _batches(records, batch_bytes_max))
            except KraftError as exc:  # this partition's records fail, the others stand
                outcome = {"error": wire.error_body(exc)["error"]}
            error = outcome.get("error")
            for delta, (i, *_) in enumerate(records):
                offsets[i] = {"partition": partition,
                              "offset": None if error else outcome["base_offset"] + delta,
                              "error_code": _proxy_error_code(error),
                              "error": f"{error['code']}: {error['message']}" if error else None}
        return web.json_response({"key_schema_id": None, "value_schema_id": None,
                                  "offsets": offsets})

    def _partition_count(self, topic: str) -> int:
        validate_topic_name(topic)  # INVALID_TOPIC_EXCEPTION: no such name can ever exist
        found = self.server.lifecycle.image.topics.get(topic)
        if found is None or not found.partitions:
            raise UnknownTopicOrPartitionError(
                f"topic {topic!r} does not exist (create it with "
                f"`kraftlog topics create {topic}`)")
        return len(found.partitions)

    def _batch_bytes_max(self, topic: str) -> int:
        """The topic's max.message.bytes (else the broker's), which each
        batch the proxy builds must fit."""
        configured = self.server.lifecycle.image.topic_configs(topic).get("max.message.bytes")
        if configured is not None:
            return int(configured)
        return self.server.log_manager.default_log_config.max_message_bytes

    async def _produce(self, topic: str, partition: int, batch: bytes) -> dict:
        answer = await self._call_leader(topic, partition, "/v1/produce", {
            "acks": -1, "timeout_ms": 30_000,
            "partitions": [{"topic": topic, "partition": partition, "records": batch}]})
        return answer["partitions"][0]

    # -- read ----------------------------------------------------------------------
    async def handle_read(self, request: web.Request) -> web.Response:
        topic = request.match_info["topic"]
        auth_of(request).require(acl.READ, acl.TOPIC, topic)
        partition = _query_int(request.match_info["partition"], "partition", 0, 2**31 - 1)
        offset = _query_int(request.query.get("offset", "0"), "offset", 0, 2**63 - 1)
        timestamp = request.query.get("timestamp")
        if timestamp is not None and "offset" in request.query:
            raise InvalidRequestError("read from an offset or from a timestamp, not both")
        max_bytes = _query_int(request.query.get("max_bytes", str(READ_BYTES_DEFAULT)),
                               "max_bytes", 1, 2**31 - 1)
        wait_ms = _query_int(request.query.get("timeout", "0"), "timeout", 0, READ_WAIT_MS_MAX)
        isolation = _isolation(request)
        binary = BINARY_V2 in request.headers.get("Accept", "")
        self._partition_count(topic)
        if timestamp is not None:
            found = await self._offset_at(topic, partition, isolation, _query_int(
                timestamp, "timestamp", 0, 2**63 - 1))
            if found is None:  # no record at or after that time yet
                return web.json_response([], content_type=BINARY_V2 if binary else JSON_V2)
            offset = found
        answer = await self._call_leader(topic, partition, "/v1/fetch", {
            "max_wait_ms": wait_ms, "min_bytes": 1, "max_bytes": max_bytes,
            "isolation_level": isolation,
            "partitions": [{"topic": topic, "partition": partition, "offset": offset,
                            "max_bytes": max_bytes}]})
        result = answer["partitions"][0]
        if result.get("error"):
            raise _Relayed(result["error"])
        records = []
        batches = list(iter_batches(result["records"]))
        if isolation == "read_committed":
            batches = without_aborted(batches, result.get("aborted_transactions") or [])
        for header, batch in batches:
            if batch is None or header.is_control:
                continue  # an aborted transaction's, or a transaction marker
            for record in iter_records(batch):
                if record.offset < offset:
                    continue
                records.append({"topic": topic, "partition": partition,
                                "offset": record.offset, "timestamp": record.timestamp,
                                "key": _decode(record.key, binary),
                                "value": _decode(record.value, binary),
                                "headers": [{"key": k, "value": _header_out(v, binary)}
                                            for k, v in record.headers]})
        return web.json_response(records, content_type=BINARY_V2 if binary else JSON_V2)

    async def handle_offsets(self, request: web.Request) -> web.Response:
        """REST Proxy v2's beginning and end offsets of a partition; with
        ``?timestamp=MS`` (an extension), Kafka's offsetsForTimes: the first
        offset whose record is at or after that time, or null."""
        topic = request.match_info["topic"]
        auth_of(request).require(acl.DESCRIBE, acl.TOPIC, topic)
        partition = _query_int(request.match_info["partition"], "partition", 0, 2**31 - 1)
        isolation = _isolation(request)
        self._partition_count(topic)
        if "timestamp" in request.query:
            at = _query_int(request.query["timestamp"], "timestamp", 0, 2**63 - 1)
            return web.json_response({"offset": await self._offset_at(
                topic, partition, isolation, at)})
        answer = await self._call_leader(topic, partition, "/v1/offsets", {
            "isolation_level": isolation, "partitions": [
                {"topic": topic, "partition": partition, "timestamp": -2},
                {"topic": topic, "partition": partition, "timestamp": -1}]})
        first, last = answer["partitions"]
        for result in (first, last):
            if result.get("error"):
                raise _Relayed(result["error"])
        return web.json_response({"beginning_offset": first["offset"],
                                  "end_offset": last["offset"]})

    async def _offset_at(self, topic: str, partition: int, isolation: str,
                         timestamp: int) -> int | None:
        """The first offset whose timestamp is at or after ``timestamp``
        (Kafka's offsetsForTimes), asked of the leader; None if none is."""
        answer = await self._call_leader(topic, partition, "/v1/offsets", {
            "isolation_level": isolation,
            "partitions": [{"topic": topic, "partition": partition, "timestamp": timestamp}]})
        result = answer["partitions"][0]
        if result.get("error"):
            raise _Relayed(result["error"])
        return result["offset"] if result["offset"] >= 0 else None

    # -- forwarding ----------------------------------------------------------------
    async def _call_leader(self, topic: str, partition: int, path: str, body: dict) -> dict:
        image = self.server.lifecycle.image
        reg = image.partition(topic, partition)
        if reg is None:
            raise UnknownTopicOrPartitionError(f"{topic}-{partition} does not exist")
        url = broker_url(image, reg.leader) if reg.leader >= 0 else None
        if url is None:
            raise LeaderNotAvailableError(f"{topic}-{partition} has no leader right now; retry")
        try:
            async with self.server.session.post(
                    url + path, data=msgpack.packb(body, use_bin_type=True),
                    headers={"Content-Type": wire.MSGPACK, "Accept": wire.MSGPACK,
                             # The proxy is the leader's client, as Kafka's REST
                             # proxy is: its client quota applies.
                             CLIENT_ID_HEADER: REST_PROXY_CLIENT_ID},
                    timeout=aiohttp.ClientTimeout(total=FORWARD_TIMEOUT_S)) as response:
                answer = msgpack.unpackb(await response.read(), raw=False)
        except (aiohttp.ClientError, TimeoutError, ValueError, OSError) as exc:
            raise LeaderNotAvailableError(
                f"the leader of {topic}-{partition} ({url}) did not answer: {exc}; retry"
            ) from None
        if isinstance(answer, dict) and "error" in answer:
            raise _Relayed(answer["error"])
        return answer


def _batches(records: list[tuple[int, bytes | None, bytes | None, list]],
             limit_bytes: int) -> bytes:
    """The records as consecutive batches, each within ``limit_bytes`` (a
    single record larger than that is left for the leader to refuse)."""
    out = []
    builder = BatchBuilder()
    for _, key, value, headers in records:
        if not builder.has_room_for(key, value, limit_bytes, headers):
            out.append(builder.build())
            builder = BatchBuilder()
        builder.append(key, value, headers=headers)
    out.append(builder.build())
    return b"".join(out)


class _Relayed(KraftError):
    """An error answered by the partition leader, passed on unchanged."""

    def __init__(self, error: dict) -> None:
        super().__init__(str(error.get("message")))
        self.code = str(error.get("code", "UNKNOWN_SERVER_ERROR"))


async def _read_json(request: web.Request) -> Any:
    try:
        raw = await request.read()
    except web.HTTPRequestEntityTooLarge as exc:
        raise wire.BodyTooLargeError(f"request body too large: {exc.text}") from None
    try:
        return json.loads(raw, parse_constant=_refuse_constant)
    except (ValueError, RecursionError) as exc:
        raise InvalidRequestError(
            f"request body is not valid JSON (or nests too deeply): {exc}") from None


def _refuse_constant(token: str) -> Any:
    """NaN and Infinity are not JSON (RFC 8259), though Python's parser
    takes them: refuse them, so everything stored reads back as JSON."""
    raise ValueError(f"{token} is not a JSON value")


def _encode(value: Any, binary: bool, where: str) -> bytes | None:
    if value is None:
        return None
    if binary:
        if not isinstance(value, str):
            raise InvalidRequestError(f"{where} must be a base64 string, got "
                                      f"{printable(value)}")
        try:
            return base64.b64decode(value, validate=True)
        except (binascii.Error, ValueError):
            raise InvalidRequestError(f"{where} is not valid base64") from None
    try:
        return json.dumps(value, separators=(",", ":"), ensure_ascii=False,
                          allow_nan=False).encode()
    except RecursionError:
        raise InvalidRequestError(f"{where} nests too deeply") from None
    except UnicodeEncodeError:
        raise InvalidRequestError(f"{where} holds a string that is not valid Unicode") from None


def _headers(fields: Fields, binary: bool, where: str) -> list[tuple[str, bytes | None]]:
    """A record's ``headers``: ``[{"key": name, "value": ...}]``, the value
    base64 (binary format) or a string (JSON format), or null."""
    out = []
    for j, item in enumerate(fields.sequence("headers", HEADERS_PER_RECORD_MAX, default=None)
                             or ()):
        header = Fields(item, f"{where}[{j}]")
        name = header.string("key", HEADER_KEY_CHARS_MAX, min_chars=0)
        value = header.values.get("value")
        if value is not None and not binary and not isinstance(value, str):
            raise InvalidRequestError(f"{where}[{j}].value must be a string or null, "
                                      f"got {printable(value)}")
        try:
            name.encode()
            if value is not None:
                value = _encode(value, True, f"{where}[{j}].value") if binary \
                    else value.encode()
        except UnicodeEncodeError:
            raise InvalidRequestError(f"{where}[{j}] holds a string that is not valid "
                                      "Unicode") from None
        out.append((name, value))
    return out


def _header_out(value: bytes | None, binary: bool) -> str | None:
    if value is None:
        return None
    return base64.b64encode(value).decode() if binary else value.decode("utf-8", "replace")


def _decode(value: bytes | None, binary: bool) -> Any:
    if value is None:
        return None
    if binary:
        return base64.b64encode(value).decode()
    try:
        return json.loads(value, parse_constant=_refuse_constant)
    except (ValueError, RecursionError):
        return value.decode("utf-8", errors="replace")


def _isolation(request: web.Request) -> str:
    isolation = request.query.get("isolation_level", "read_uncommitted")
    if isolation not in ("read_uncommitted", "read_committed"):
        raise InvalidRequestError(f"isolation_level must be read_uncommitted or "
                                  f"read_committed, not {isolation[:100]!r}")
    return isolation


def _query_int(text: str, name: str, minimum: int, maximum: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise InvalidRequestError(f"{name} must be an integer, got {text!r}") from None
    if not minimum <= value <= maximum:
        raise InvalidRequestError(f"{name} must be from {minimum} to {maximum}, got {value}")
    return value


def _proxy_error_code(error: dict | None) -> int | None:
    """Confluent REST Proxy v2's per-record ``error_code``: 2 when a retry
    may succeed, 1 when it cannot; the error's name goes in ``error``."""
    if error is None:
        return None
    return 2 if error["code"] in RETRIABLE_CODES else 1
