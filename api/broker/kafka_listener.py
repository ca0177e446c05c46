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
ListOffsets, OffsetForLeaderEpoch, FindCoordinator, InitProducerId, the
KIP-848 and the classic consumer group APIs (static members included),
OffsetCommit/OffsetFetch, ListGroups/DescribeGroups, CreateTopics,
DeleteTopics, CreatePartitions, DescribeConfigs, AlterConfigs,
IncrementalAlterConfigs, DescribeCluster, the transaction APIs
(AddPartitionsToTxn, AddOffsetsToTxn, EndTxn, TxnOffsetCommit) and, on a
SASL_SSL listener, SaslHandshake/SaslAuthenticate; the API versions listed
there (produce and fetch from the first that carries RecordBatch v2). ApiVersions lists
exactly these, so a client degrades cleanly. Fetch sessions (KIP-227) are
answered with session id 0, Kafka's documented fallback: the client sends
full fetch requests.

Bad input: a frame larger than ``socket.request.max.bytes`` or smaller than
a header, an API or version not listed, or a body that does not decode
closes the connection (Kafka's answer too), logged at debug level; a frame
must arrive within ``connections.max.idle.ms`` once its size is read (a
slow client cannot hold a handler forever), and an idle connection is
closed after it.

Security, as a Kafka listener of the same protocol: ``PLAINTEXT`` (every
client ``User:ANONYMOUS``), ``SSL`` (TLS with the node's certificate; a
client's certificate names it, through ``ssl.principal.mapping.rules``) or
``SASL_SSL`` (TLS, then SaslHandshake and SaslAuthenticate before anything
but ApiVersions: SCRAM-SHA-256, SCRAM-SHA-512 or PLAIN, all checked against
the SCRAM users of the metadata; a client that fails is answered
SASL_AUTHENTICATION_FAILED and disconnected). Every API is then authorized
as Kafka authorizes it, over the same ACLs as the HTTP API (``Caller``).
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import logging
import struct
import time
from collections.abc import Callable
from typing import Any

from api.broker.data_api import PRODUCE_TIMEOUT_MS_MAX, offset_for
from api.broker.quotas import OnLoopTime
from kraft.authorizer import RequestAuth
from protocol import acl, scram, tls
from protocol.quotas import (CLIENT_ID_CHARS_MAX, CONSUMER_BYTE_RATE, PRODUCER_BYTE_RATE,
                             REQUEST_PERCENTAGE)
from api.broker.groups.service import OFFSETS_TOPIC
from api.broker.transactions.service import END_WAIT_S
from api.broker.replication import (READ_COMMITTED, READ_UNCOMMITTED, FetchRequest, FetchSpec,
                                    ProduceItem)
from protocol import TopicPartition
from protocol.fields import Fields
from protocol.kafka import codec, messages
from protocol.kafka.records import kafka_to_native, native_to_kafka
from protocol.errors import InvalidTopicError, KraftError, SslAuthenticationError
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
SASL_HANDSHAKE, SASL_AUTHENTICATE = 17, 36
ALTER_CONFIGS, INCREMENTAL_ALTER_CONFIGS = 33, 44
LIST_GROUPS, DESCRIBE_GROUPS = 16, 15
OFFSET_FOR_LEADER_EPOCH = 23
#: What a client may ask before it has authenticated on a SASL_SSL listener.
BEFORE_AUTHENTICATION = frozenset({API_VERSIONS, SASL_HANDSHAKE, SASL_AUTHENTICATE})
#: The SASL mechanisms a SASL_SSL listener offers: SCRAM's (the password
#: never crosses the wire), and PLAIN (inside TLS) checked against the same
#: SCRAM credential.
SASL_MECHANISMS = ("SCRAM-SHA-512", "SCRAM-SHA-256", "PLAIN")
#: How long an authentication waits for a starting broker's metadata (its
#: users) before it is refused, saying to retry.
SASL_READY_WAIT_S = 10.0
#: API key -> (lowest, highest) version spoken.
SUPPORTED: dict[int, tuple[int, int]] = {
    PRODUCE: (3, 9),        # 3: RecordBatch v2 and transactional ids
    FETCH: (4, 12),         # 4: RecordBatch v2 and isolation levels; 13+ name topics by id
    LIST_OFFSETS: (1, 6),   # 7 adds the max-timestamp query (-3, KIP-734): not answered
    # KIP-320: a consumer checks its position after a leader change.
    OFFSET_FOR_LEADER_EPOCH: (0, 4),
    METADATA: (1, 12),
    OFFSET_COMMIT: (2, 9),
    OFFSET_FETCH: (2, 9),   # 2: a group's error has its own field
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
    # SASL_SSL listeners only: after a v1 handshake the exchange is carried
    # in SaslAuthenticate, after a v0 one in bare size-prefixed frames.
    SASL_HANDSHAKE: (0, 1),
    SASL_AUTHENTICATE: (0, 2),
    ALTER_CONFIGS: (0, 2),
    INCREMENTAL_ALTER_CONFIGS: (0, 1),
    LIST_GROUPS: (0, 5),
    DESCRIBE_GROUPS: (0, 5),
}
SASL_APIS = frozenset({SASL_HANDSHAKE, SASL_AUTHENTICATE})
#: DescribeConfigs: Kafka's resource type of a topic, and its numbers for
#: where a config value comes from.
TOPIC_RESOURCE, BROKER_RESOURCE = 2, 4
CONFIG_SOURCES = {"TOPIC_CONFIG": 1, "STATIC_BROKER_CONFIG": 4, "DEFAULT_CONFIG": 5}
#: Kafka's config types (DescribeConfigs v3+) of kraftlog's schema types.
CONFIG_TYPES = {"bool": 1, "str": 2, "int": 5, "float": 6, "dirs": 7}
#: FindCoordinator's key types.
GROUP_KEY, TRANSACTION_KEY = 0, 1
_SIZE = struct.Struct(">i")
_HEADER = struct.Struct(">hhi")
#: Kafka's smallest request header: key, version, correlation id, client id length.
FRAME_MIN = _HEADER.size + 2
#: Requests other than produce are small; a larger one is refused before it
#: is decoded (a few bytes per element would otherwise become many objects).
FRAME_BYTES_MAX_NOT_PRODUCE = 1024 * 1024
#: Before a client has authenticated: ApiVersions and SASL messages only.
FRAME_BYTES_MAX_BEFORE_AUTHENTICATION = 64 * 1024
EARLIEST, LATEST = -2, -1


def error_code(error: Any) -> int:
    """Kafka's number for a result's error (None: 0). An exception without
    a code is this broker's failure: KAFKA_STORAGE_ERROR."""
    if error is None:
        return 0
    if isinstance(error, int):  # already Kafka's number
        return error
    name = getattr(error, "code", None)
    if isinstance(error, dict):
        name = error.get("code")
    if not isinstance(name, str):
        return messages.ERRORS["KAFKA_STORAGE_ERROR"]
    return messages.ERRORS.get(name, messages.ERRORS["UNKNOWN_SERVER_ERROR"])


def host_port(address: str) -> tuple[str, int]:
    """A registered listener address (``host:port``, or an SSL listener's
    ``https://host:port``) as Kafka's host and port."""
    host, _, port = address.partition("://")[2].rpartition(":") if "://" in address \
        else address.rpartition(":")
    return host.strip("[]"), int(port)


def topic_uuid(topic_id: str | None) -> bytes:
    """kraftlog's topic id (16 random bytes, base64url) as Kafka's UUID."""
    if not topic_id:
        return codec.ZERO_UUID
    raw = base64.urlsafe_b64decode(topic_id + "=" * (-len(topic_id) % 4))
    return raw if len(raw) == 16 else codec.ZERO_UUID


class _Refused(Exception):
    """A resource of an admin request that cannot be done: its Kafka error
    code and why."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


class _SaslFailed(Exception):
    """A client refused by its SASL exchange (the message says why)."""


class _SaslRetry(Exception):
    """An exchange this broker cannot judge now (its users still loading,
    too many password checks at once): the connection is closed without
    an answer, so the client reconnects and tries again (an answered
    SASL_AUTHENTICATION_FAILED would be final to it)."""


class Caller:
    """One connection's client: who it is (``principal``: None until a
    SASL_SSL client has authenticated), from where, and ``auth``, its
    checks against the ACLs. ``header`` is the request being answered
    (a connection's requests are answered one at a time)."""

    __slots__ = ("peer", "host", "principal", "auth", "header", "mechanism", "scram",
                 "close_after", "bare_sasl")

    def __init__(self, peer: Any, principal: str | None, authorizer: Any) -> None:
        self.peer = peer
        self.host = peer[0] if isinstance(peer, tuple) and peer else ""
        self.principal: str | None = None
        self.auth: RequestAuth | None = None
        self.header: dict = {}
        self.mechanism: str | None = None  # chosen by SaslHandshake
        self.scram: scram.ScramServer | None = None
        #: Answer this request, then close (a failed authentication).
        self.close_after = False
        #: A v0 SaslHandshake: the exchange comes in bare frames, no headers.
        self.bare_sasl = False
        if principal is not None:
            self.authenticated(principal, authorizer)

    @property
    def client_host(self) -> str:
        """The client's address as Kafka's group APIs show it: ``/<ip>``."""
        return "/" + self.host

    def authenticated(self, principal: str, authorizer: Any) -> None:
        self.principal = principal
        self.auth = RequestAuth(authorizer, principal, self.host)

    def may(self, operation: str, rtype: str, name: str = acl.CLUSTER_NAME) -> bool:
        """Whether the caller may; not while this broker's ACLs are not
        loaded yet (a starting broker's), unless it is a super user."""
        try:
            return self.auth.allowed(operation, rtype, name)
        except Exception:  # noqa: BLE001  the authorizer's metadata is behind
            return False

    def refused(self, operation: str, rtype: str, name: str = acl.CLUSTER_NAME) -> int:
        """0 if the caller may, else the resource type's
        AUTHORIZATION_FAILED (or the authorizer's own error: its metadata
        not loaded yet) as Kafka's number."""
        try:
            return 0 if self.auth.allowed(operation, rtype, name) else error_code(
                self.auth.refusal(operation, rtype, name))
        except Exception as exc:  # noqa: BLE001  answered as its code
            return error_code(exc)


class KafkaListener:
    """Serves Kafka's protocol for one broker (``server``: its BrokerServer)
    on ``endpoint`` (its KAFKA listener: PLAINTEXT, SSL or SASL_SSL)."""

    def __init__(self, server: Any, endpoint: Any, frame_bytes_max: int, idle_ms: int) -> None:
        self.server = server
        self.endpoint = endpoint
        self.frame_bytes_max = frame_bytes_max
        self.idle_s = idle_ms / 1000
        self._server: asyncio.base_events.Server | None = None
        self._connections: set[asyncio.Task] = set()
        config = server.config
        node_tls = config.tls if endpoint.tls else None
        if endpoint.tls and node_tls is None:
            raise RuntimeError(f"the KAFKA listener {endpoint} is SSL but the node has no TLS")
        self._ssl = node_tls.server if node_tls is not None else None
        self._mapper = node_tls.mapper if node_tls is not None else None
        #: An SSL (not SASL) listener's clients must present a certificate.
        self._certificate_required = node_tls is not None and not endpoint.sasl and (
            config.settings.get("ssl.client.auth") == "required" or node_tls.sasl)
        self.supported = {key: span for key, span in SUPPORTED.items()
                          if endpoint.sasl or key not in SASL_APIS}
        self._passwords = tls.PasswordVerifier(
            lambda user: server.lifecycle.image.scram_credentials(user),
            lambda: server.lifecycle.metadata_caught_up) if endpoint.sasl else None
        # The unknown users' made-up SCRAM salts: the same on every broker
        # of a cluster with a shared secret (delegation.token.secret.key.file).
        self._pepper = hmac.new(config.token_secret, b"kraftlog scram decoy salts",
                                hashlib.sha256).digest() if config.token_secret \
            else scram.new_salt()
        self.handlers: dict[int, Callable] = {
            API_VERSIONS: self.api_versions, METADATA: self.metadata, PRODUCE: self.produce,
            FETCH: self.fetch, LIST_OFFSETS: self.list_offsets,
            FIND_COORDINATOR: self.find_coordinator, INIT_PRODUCER_ID: self.init_producer_id,
            OFFSET_FOR_LEADER_EPOCH: self.offset_for_leader_epoch,
            CONSUMER_GROUP_HEARTBEAT: self.consumer_group_heartbeat,
            OFFSET_COMMIT: self.offset_commit, OFFSET_FETCH: self.offset_fetch,
            JOIN_GROUP: self.join_group, SYNC_GROUP: self.sync_group,
            HEARTBEAT: self.heartbeat, LEAVE_GROUP: self.leave_group,
            LIST_GROUPS: self.list_groups, DESCRIBE_GROUPS: self.describe_groups,
            CREATE_TOPICS: self.create_topics, DELETE_TOPICS: self.delete_topics,
            CREATE_PARTITIONS: self.create_partitions, DESCRIBE_CLUSTER: self.describe_cluster,
            DESCRIBE_CONFIGS: self.describe_configs, ALTER_CONFIGS: self.alter_configs,
            INCREMENTAL_ALTER_CONFIGS: self.incremental_alter_configs,
            ADD_PARTITIONS_TO_TXN: self.add_partitions_to_txn,
            ADD_OFFSETS_TO_TXN: self.add_offsets_to_txn, END_TXN: self.end_txn,
            TXN_OFFSET_COMMIT: self.txn_offset_commit,
            SASL_HANDSHAKE: self.sasl_handshake, SASL_AUTHENTICATE: self.sasl_authenticate}
        #: The classic members this broker's coordinators serve: (group,
        #: member id) -> what the member was told (``_Classic``).
        self._classic: dict[tuple[str, str], _Classic] = {}
        self._ids_at: int | None = None
        self._names_by_id: dict[bytes, str] = {}

    async def start(self) -> None:
        self._server = await asyncio.start_server(
            self._connection, self.endpoint.host, self.endpoint.port, limit=2**16,
            ssl=self._ssl, ssl_handshake_timeout=self.idle_s if self._ssl else None)

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            for task in list(self._connections):
                task.cancel()
            await asyncio.gather(*self._connections, return_exceptions=True)
            await self._server.wait_closed()

    # -- connections --------------------------------------------------------------
    def _caller(self, writer: asyncio.StreamWriter) -> Caller | None:
        """Who a new connection's client is, or None to refuse it: an SSL
        listener's client without a certificate where one is required, or
        with one no ``ssl.principal.mapping.rules`` rule names (a SASL_SSL
        client is named by its authentication, later)."""
        peer = writer.get_extra_info("peername")
        authorizer = self.server.authorizer
        if self.endpoint.sasl:
            return Caller(peer, None, authorizer)
        if self._ssl is None:
            return Caller(peer, tls.ANONYMOUS, authorizer)
        cert = writer.get_extra_info("peercert")
        if not cert:
            if self._certificate_required:
                logger.info("kafka listener: %s has no client certificate, which this "
                            "listener requires (ssl.client.auth): closing", peer)
                return None
            return Caller(peer, tls.ANONYMOUS, authorizer)
        try:
            return Caller(peer, tls.certificate_principal(cert, self._mapper), authorizer)
        except SslAuthenticationError as exc:
            logger.info("kafka listener: %s: %s: closing", peer, exc)
            return None

    async def _connection(self, reader: asyncio.StreamReader,
                          writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        self._connections.add(task)
        limiter = self.server.connections
        if not limiter.admit(task, writer.get_extra_info("peername")):
            self._connections.discard(task)
            writer.close()  # max.connections or max.connections.per.ip reached
            return
        try:
            caller = self._caller(writer)
            while caller is not None:
                # (asyncio.timeout, not wait_for: no task per read, see protocol/aio.py)
                async with asyncio.timeout(self.idle_s):
                    size_bytes = await reader.readexactly(4)
                (size,) = _SIZE.unpack(size_bytes)
                if not (0 if caller.bare_sasl else FRAME_MIN) <= size <= self.frame_bytes_max:
                    logger.debug("kafka listener: %s sent a frame of %d bytes: closing",
                                 caller.peer, size)
                    return
                if caller.principal is None and size > FRAME_BYTES_MAX_BEFORE_AUTHENTICATION:
                    logger.debug("kafka listener: %s sent %d bytes before authenticating: "
                                 "closing", caller.peer, size)
                    return
                async with asyncio.timeout(self.idle_s):
                    frame = await reader.readexactly(size)
                if size > FRAME_BYTES_MAX_NOT_PRODUCE and \
                        _HEADER.unpack_from(frame)[0] != PRODUCE:
                    logger.debug("kafka listener: %s sent a %d-byte request that is not a "
                                 "produce: closing", caller.peer, size)
                    return
                answer = await (self._bare_sasl(frame, caller) if caller.bare_sasl
                                else self._answer(frame, caller))
                if answer is False:
                    return
                if answer is not None:
                    writer.write(_SIZE.pack(len(answer)))
                    writer.write(answer)
                    # A client that stops reading is cut off like an idle one
                    # (its answers would otherwise stay in memory).
                    async with asyncio.timeout(self.idle_s):
                        await writer.drain()
                if caller.close_after:
                    return
        except (asyncio.IncompleteReadError, asyncio.TimeoutError, OSError):
            pass  # the client went, stalled, or broke TLS (ssl.SSLError is an OSError)
        except Exception:  # noqa: BLE001  one connection's failure, never the listener's
            logger.exception("kafka listener: a connection failed")
        finally:
            limiter.release(task)
            self._connections.discard(task)
            writer.close()

    async def _bare_sasl(self, frame: bytes, caller: Caller) -> bytes | bool:
        """After a v0 SaslHandshake: a frame is the client's SASL message,
        answered with the server's bare (an empty frame once authenticated);
        a failure closes the connection."""
        try:
            answer = await self._sasl_step(caller, frame)
        except (_SaslFailed, _SaslRetry):
            return False
        if caller.principal is not None:
            caller.bare_sasl = False  # Kafka's requests from here on
        return answer

    async def _answer(self, frame: bytes, caller: Caller) -> bytes | None | bool:
        """The response frame (without its size), None for none (acks=0), or
        False to close the connection."""
        peer = caller.peer
        api_key, version, correlation_id = _HEADER.unpack_from(frame)
        span = self.supported.get(api_key)
        if api_key == API_VERSIONS and (span is None or version > span[1]):
            # Kafka's rule: answer a too-new ApiVersions in v0 with the
            # versions, so the client retries with one it shares.
            body = self._versions_body(messages.ERRORS["UNSUPPORTED_VERSION"])
            return self._respond(API_VERSIONS, 0, correlation_id, body)
        if span is None or not span[0] <= version <= span[1]:
            logger.debug("kafka listener: %s asked for API %d v%d, not spoken: closing",
                         peer, api_key, version)
            return False
        if caller.principal is None and api_key not in BEFORE_AUTHENTICATION:
            # Kafka's answer too: the client did not authenticate first.
            logger.info("kafka listener: %s sent API %d before authenticating (this "
                        "listener is SASL_SSL): closing", peer, api_key)
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
            caller.header = header
            quotas = self.server.quotas
            if api_key in BEFORE_AUTHENTICATION or quotas is None:
                body = await self.handlers[api_key](request, version, caller)
            else:
                body = await self._within_quotas(
                    quotas, api_key, len(frame),
                    lambda: self.handlers[api_key](request, version, caller), caller)
            if body is None or body is False:  # nothing to answer; or close
                return body
            return self._respond(api_key, version, correlation_id, body)
        except Exception:  # noqa: BLE001  one request's failure, not the broker's
            # A request this listener could not make sense of, or its own
            # defect: logged whole, and the connection closed (the client
            # reconnects and retries), never the broker's other work.
            logger.exception("kafka listener: %s: API %d v%d failed", peer, api_key, version)
            return False

    async def _within_quotas(self, quotas: Any, api_key: int, size: int,
                             handling: Callable[[], Any], caller: Caller) -> dict | None | bool:
        """``handling()`` (a request's handler) under the client's
        quotas, as the HTTP API applies them: it waits out its (user, client
        id)'s last throttle first; its time on the event loop counts against
        ``request_percentage``, a produce's request bytes against
        ``producer_byte_rate``, a fetch's records against
        ``consumer_byte_rate``; the answer's ThrottleTimeMs says how long
        the next request will wait (KIP-219: clients back off that long)."""
        user = caller.principal or tls.ANONYMOUS
        client_id = (caller.header.get("ClientId") or "")[:CLIENT_ID_CHARS_MAX]
        byte_key = PRODUCER_BYTE_RATE if api_key == PRODUCE else \
            CONSUMER_BYTE_RATE if api_key == FETCH else None
        timed_key = quotas.resolve(REQUEST_PERCENTAGE, user, client_id) is not None
        if not timed_key and (byte_key is None or quotas.resolve(byte_key, user, client_id)
                              is None):
            return await handling()  # no quota: a cached lookup or two
        wait_s = quotas.hold_for(REQUEST_PERCENTAGE, user, client_id)
        if byte_key is not None:
            wait_s = max(wait_s, quotas.hold_for(byte_key, user, client_id))
        if wait_s > 0:
            await asyncio.sleep(wait_s)
        timed = OnLoopTime(handling())
        try:
            body = await timed
        finally:
            throttle_ms = quotas.record(REQUEST_PERCENTAGE, user, client_id,
                                        timed.busy_s * 100) if timed_key else 0
        if byte_key == PRODUCER_BYTE_RATE:
            throttle_ms = max(throttle_ms, quotas.record(byte_key, user, client_id, size))
        elif byte_key == CONSUMER_BYTE_RATE and isinstance(body, dict):
            sent = sum(len(p.get("Records") or b"") for t in body["Responses"]
                       for p in t["Partitions"])
            throttle_ms = max(throttle_ms, quotas.record(byte_key, user, client_id, sent))
        if isinstance(body, dict) and throttle_ms:
            body["ThrottleTimeMs"] = throttle_ms
        return body

    @staticmethod
    def _respond(api_key: int, version: int, correlation_id: int, body: dict) -> bytes:
        out = bytearray()
        codec.encode(messages.ResponseHeader, codec.response_header_version(api_key, version),
                     {"CorrelationId": correlation_id}, out)
        codec.encode(messages.APIS[api_key][1], version, body, out)
        return bytes(out)

    # -- ApiVersions ---------------------------------------------------------------------
    def _versions_body(self, error: int = 0) -> dict:
        return {"ErrorCode": error, "ApiKeys": [
            {"ApiKey": key, "MinVersion": low, "MaxVersion": high}
            for key, (low, high) in sorted(self.supported.items())]}

    async def api_versions(self, request: dict, version: int, caller: "Caller") -> dict:
        return self._versions_body()

    # -- SASL (a SASL_SSL listener's) ------------------------------------------------------
    async def sasl_handshake(self, request: dict, version: int, caller: Caller) -> dict:
        mechanism = request["Mechanism"]
        answer = {"ErrorCode": 0, "Mechanisms": list(SASL_MECHANISMS)}
        if caller.principal is not None or caller.mechanism is not None:
            answer["ErrorCode"] = messages.ERRORS["ILLEGAL_SASL_STATE"]
            caller.close_after = True
        elif mechanism not in SASL_MECHANISMS:
            answer["ErrorCode"] = messages.ERRORS["UNSUPPORTED_SASL_MECHANISM"]
            caller.close_after = True
        else:
            caller.mechanism = mechanism
            caller.bare_sasl = version == 0
            if mechanism in scram.MECHANISMS:
                caller.scram = scram.ScramServer(
                    mechanism, lambda user: self._scram_credential(user, mechanism),
                    self._pepper)
        return answer

    def _scram_credential(self, user: str, mechanism: str) -> scram.ScramCredential | None:
        try:
            scram.check_user_name(user)
        except ValueError:
            return None
        value = (self.server.lifecycle.image.scram_credentials(user) or {}).get(mechanism)
        return scram.decode(value) if value else None

    async def _users_loaded(self) -> bool:
        """Whether this broker's metadata (its users) has caught up, waiting
        up to SASL_READY_WAIT_S for a starting broker's."""
        deadline = time.monotonic() + SASL_READY_WAIT_S
        while not self.server.lifecycle.metadata_caught_up:
            if time.monotonic() >= deadline:
                return False
            await asyncio.sleep(0.05)
        return True

    async def sasl_authenticate(self, request: dict, version: int,
                                caller: Caller) -> dict | bool:
        """One step of the exchange SaslHandshake chose: PLAIN's one, or
        SCRAM's two (client-first, then client-final with the proof). A
        refusal answers SASL_AUTHENTICATION_FAILED and closes the
        connection, as Kafka does."""
        answer = {"ErrorCode": 0, "ErrorMessage": None, "AuthBytes": b"",
                  "SessionLifetimeMs": 0}
        if caller.mechanism is None or caller.principal is not None or caller.bare_sasl:
            caller.close_after = True
            answer.update(ErrorCode=messages.ERRORS["ILLEGAL_SASL_STATE"],
                          ErrorMessage="SaslAuthenticate comes after a v1 SaslHandshake, once")
            return answer
        try:
            answer["AuthBytes"] = await self._sasl_step(caller, request["AuthBytes"] or b"")
        except _SaslRetry as exc:
            logger.info("kafka listener: %s: %s; closing so it retries", caller.peer, exc)
            return False
        except _SaslFailed as exc:
            caller.close_after = True
            answer.update(ErrorCode=messages.ERRORS["SASL_AUTHENTICATION_FAILED"],
                          ErrorMessage=str(exc))
        return answer

    async def _sasl_step(self, caller: Caller, data: bytes) -> bytes:
        """The server's answer to one message of the client's, or
        ``_SaslFailed`` saying why the client is refused."""
        if not await self._users_loaded():
            raise _SaslRetry("this broker is still loading the cluster's users")
        try:
            if caller.scram is None:  # PLAIN: authzid NUL user NUL password
                authzid, user, password = data.decode().split("\0")
                if authzid not in ("", user):
                    raise scram.ScramError("an authorization id other than the user's own "
                                           "is not allowed")
                if await self._passwords.check_password(user, password) is None:
                    raise scram.ScramError("wrong user name or password")
                caller.authenticated("User:" + user, self.server.authorizer)
                return b""
            if not caller.scram.started:
                return caller.scram.first(data)
            answer = caller.scram.final(data)
            caller.authenticated("User:" + caller.scram.user, self.server.authorizer)
            return answer
        except (scram.ScramError, ValueError, UnicodeDecodeError) as exc:
            logger.info("kafka listener: %s failed %s authentication: %s", caller.peer,
                        caller.mechanism, exc)
            raise _SaslFailed(
                f"{caller.mechanism} authentication failed: {exc} (a kraftlog user made with "
                "`kraftlog users create`, its password, and a mechanism it has credentials "
                "for)") from None
        except KraftError as exc:  # the broker's trouble (its users not loaded, too busy)
            raise _SaslRetry(str(exc)) from None
        except Exception as exc:  # noqa: BLE001  a defect: logged whole, then retried
            logger.exception("kafka listener: %s: SASL step failed", caller.peer)
            raise _SaslRetry(str(exc)) from None

    # -- Metadata ------------------------------------------------------------------------
    def _brokers(self, image) -> list[dict]:
        brokers = []
        for broker_id, broker in sorted(image.brokers.items()):
            address = broker.endpoints.get(KAFKA_LISTENER)
            if broker.fenced or not address:
                continue
            host, port = host_port(address)
            brokers.append({"NodeId": broker_id, "Host": host, "Port": port,
                            "Rack": broker.rack})
        return brokers

    async def metadata(self, request: dict, version: int, caller: "Caller") -> dict:
        data = self.server.data
        image = data.replicas.image
        requested = request.get("Topics")
        # v10+: a topic may be asked for by id (a KIP-848 assignment names
        # topics by id), its name null.
        by_id = self._topic_names()
        everyone = not caller.auth.enabled  # no ACLs: every topic is visible
        wanted = [(name, None) for name in sorted(image.topics)
                  if everyone or caller.may(acl.DESCRIBE, acl.TOPIC, name)
                  ] if requested is None else list(
            dict.fromkeys((t.get("Name") if t.get("Name") is not None
                           else by_id.get(t.get("TopicId")), t.get("TopicId"))
                          for t in requested))  # each topic answered once
        topics = []
        for name, asked_id in wanted:
            if requested is not None and name is not None and not everyone:
                refused = caller.refused(acl.DESCRIBE, acl.TOPIC, name)
                if refused:  # whether or not it exists
                    # Asked by id, its name is not told (null, or "" before v12).
                    by_name = asked_id in (None, codec.ZERO_UUID) or by_id.get(asked_id) != name
                    topics.append({"ErrorCode": refused,
                                   "Name": name if by_name else None if version >= 12 else "",
                                   "TopicId": asked_id or codec.ZERO_UUID, "Partitions": []})
                    continue
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
    async def produce(self, request: dict, version: int, caller: "Caller") -> dict | None:
        data = self.server.data
        acks = request["Acks"]
        items: list[ProduceItem] = []
        refused: dict[TopicPartition, int] = {}
        for topic in request["TopicData"] or ():
            for part in topic["PartitionData"] or ():
                tp = TopicPartition(topic["Name"], part["Index"])
                try:
                    records = kafka_to_native(part["Records"] or b"")
                except RecordFormatError as exc:
                    refused[tp] = error_code(exc)
                    continue
                items.append(ProduceItem(tp, None, records))
        tid = request.get("TransactionalId")
        # The HTTP produce's rules: the internal topics are their
        # coordinators', and with ACLs, WRITE on the transactional id, then
        # on each topic.
        try:
            for tp, exc in data.refused_writes(caller.auth, tid, items).items():
                refused[tp] = error_code(exc)
        except Exception as exc:  # noqa: BLE001  the whole request refused
            refused.update((item.tp, error_code(exc)) for item in items)
        items = [item for item in items if item.tp not in refused]
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
    async def fetch(self, request: dict, version: int, caller: "Caller") -> dict:
        data = self.server.data
        specs = []
        refused: list[dict] = []
        for topic in request["Topics"] or ():
            code = caller.refused(acl.READ, acl.TOPIC, topic["Topic"])
            for part in topic["Partitions"] or ():
                if code:
                    refused.append({"topic": topic["Topic"], "partition": part["Partition"],
                                    "error": code})
                    continue
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
        answered = (await data.replicas.fetch(fetch) if specs else []) + refused
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
    async def list_offsets(self, request: dict, version: int, caller: "Caller") -> dict:
        replicas = self.server.data.replicas
        isolation = READ_COMMITTED if request.get("IsolationLevel") == 1 else READ_UNCOMMITTED
        topics = []
        for topic in request["Topics"] or ():
            partitions = []
            code = caller.refused(acl.DESCRIBE, acl.TOPIC, topic["Name"])
            for part in topic["Partitions"] or ():
                answer = {"PartitionIndex": part["PartitionIndex"], "ErrorCode": code,
                          "Timestamp": -1, "Offset": -1, "LeaderEpoch": -1}
                epoch = part.get("CurrentLeaderEpoch", -1)
                if code:
                    partitions.append(answer)
                    continue
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

    # -- OffsetForLeaderEpoch (KIP-320) -------------------------------------------------
    async def offset_for_leader_epoch(self, request: dict, version: int,
                                      caller: Caller) -> dict:
        """Where each asked-for leader epoch ends in the leader's log (its
        epoch cache, as followers truncate by it): a consumer whose
        position is past it lost records to a truncation; otherwise it goes
        on after a leader change. Followers replicate over HTTP: this is
        for consumers (DESCRIBE on the topic)."""
        replicas = self.server.data.replicas
        topics = []
        for topic in request["Topics"] or ():
            code = caller.refused(acl.DESCRIBE, acl.TOPIC, topic["Topic"])
            partitions = []
            for part in topic["Partitions"] or ():
                answer = {"ErrorCode": code, "Partition": part["Partition"],
                          "LeaderEpoch": -1, "EndOffset": -1}
                partitions.append(answer)
                if code:
                    continue
                current = part.get("CurrentLeaderEpoch", -1)
                try:
                    leader = replicas.leader_partition(topic["Topic"], part["Partition"],
                                                       None if current < 0 else current)
                    asked = part["LeaderEpoch"]
                    epoch, end = leader.log.end_offset_for_epoch(asked)
                    earliest = leader.log.epoch_cache.earliest_entry
                    if epoch < 0 and asked >= 0 and earliest is not None \
                            and asked < earliest[0]:
                        # Older than every epoch kept (retention removed its
                        # records): it ended where the earliest kept one
                        # starts, Kafka's answer, so the consumer goes on.
                        epoch, end = asked, earliest[1]
                    answer.update(LeaderEpoch=epoch, EndOffset=end)
                except Exception as exc:  # noqa: BLE001  each partition answers for itself
                    answer["ErrorCode"] = error_code(exc)
            topics.append({"Topic": topic["Topic"], "Partitions": partitions})
        return {"ThrottleTimeMs": 0, "Topics": topics}

    # -- coordinators -----------------------------------------------------------------------
    def _node(self, broker_id: int) -> tuple[str, int]:
        broker = self.server.data.replicas.image.brokers.get(broker_id)
        address = broker.endpoints.get(KAFKA_LISTENER) if broker is not None else None
        if not address:
            return "", -1
        return host_port(address)

    async def _coordinator(self, key_type: int, key: str, caller: Caller) -> dict:
        service = self.server.groups if key_type == GROUP_KEY else self.server.transactions
        answer = {"Key": key, "NodeId": -1, "Host": "", "Port": -1, "ErrorCode": 0,
                  "ErrorMessage": None}
        if key_type not in (GROUP_KEY, TRANSACTION_KEY):
            answer.update(ErrorCode=messages.ERRORS["INVALID_REQUEST"],
                          ErrorMessage=f"key type {key_type}: kraftlog has group (0) and "
                                       "transaction (1) coordinators")
            return answer
        refused = caller.refused(acl.DESCRIBE, acl.GROUP if key_type == GROUP_KEY
                                 else acl.TRANSACTIONAL_ID, key)
        if refused:
            answer.update(ErrorCode=refused, ErrorMessage=f"{caller.principal} may not "
                                                          f"DESCRIBE {key!r}")
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

    async def find_coordinator(self, request: dict, version: int, caller: "Caller") -> dict:
        key_type = request.get("KeyType", GROUP_KEY)
        if version >= 4:
            return {"ThrottleTimeMs": 0, "Coordinators": [
                await self._coordinator(key_type, key, caller)
                for key in request["CoordinatorKeys"]]}
        answer = await self._coordinator(key_type, request["Key"], caller)
        answer.pop("Key")
        return {"ThrottleTimeMs": 0, **answer}

    async def init_producer_id(self, request: dict, version: int, caller: "Caller") -> dict:
        tid = request["TransactionalId"]
        answer = {"ThrottleTimeMs": 0, "ErrorCode": 0, "ProducerId": -1, "ProducerEpoch": -1}
        try:
            if tid is not None:
                caller.auth.require(acl.WRITE, acl.TRANSACTIONAL_ID, tid)
            elif not (caller.may(acl.IDEMPOTENT_WRITE, acl.CLUSTER)
                      or caller.auth.allowed_any(acl.WRITE, acl.TOPIC)):
                # An idempotent producer (KIP-679): IDEMPOTENT_WRITE on the
                # cluster, or WRITE on some topic.
                raise caller.auth.refusal(acl.IDEMPOTENT_WRITE, acl.CLUSTER, acl.CLUSTER_NAME)
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

    async def consumer_group_heartbeat(self, request: dict, version: int, caller: "Caller") -> dict:
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
            client_id=caller.header.get("ClientId"), client_host=caller.client_host)
        service = self.server.groups
        try:
            # The HTTP heartbeat's checks: READ on the group, DESCRIBE on
            # the topics named, the whole cluster's for a regex.
            caller.auth.require(acl.READ, acl.GROUP, request["GroupId"])
            for topic in heartbeat.subscribed_topic_names or ():
                caller.auth.require(acl.DESCRIBE, acl.TOPIC, topic, "a subscription")
            if heartbeat.subscribed_topic_regex is not None:
                caller.auth.require(acl.DESCRIBE, acl.CLUSTER, acl.CLUSTER_NAME,
                                    "a regex subscription, which may match any topic")
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

    async def offset_commit(self, request: dict, version: int, caller: "Caller") -> dict:
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
        refused = _unreadable(caller, offsets)
        group_refused = caller.refused(acl.READ, acl.GROUP, group_id)
        if group_refused:
            refused = dict.fromkeys(offsets, group_refused)
        allowed = {tp: o for tp, o in offsets.items() if tp not in refused}
        answer = await _commit_answer(allowed, service.run(
            group_id, lambda core: core.commit_offsets(service.clock_ms(), group_id, member_id,
                                                       epoch, allowed)), refused)
        if classic is not None or version < 9:  # a classic member: its words for it
            unknown = messages.ERRORS["UNKNOWN_MEMBER_ID"]
            fenced = any(p["ErrorCode"] == unknown for t in answer["Topics"]
                         for p in t["Partitions"]) and await self._replaced(
                group_id, member_id, request.get("GroupInstanceId"))
            for topic in answer["Topics"]:
                for partition in topic["Partitions"]:
                    partition["ErrorCode"] = messages.ERRORS["FENCED_INSTANCE_ID"] \
                        if fenced and partition["ErrorCode"] == unknown \
                        else _classic_number(partition["ErrorCode"])
        return answer

    async def _committed(self, group_id: str, topics: list[dict] | None, caller: Caller,
                         require_stable: bool = False) -> tuple[int, list[dict]]:
        """A group's committed offsets: of ``topics``' partitions (those of a
        topic the caller may not DESCRIBE answered TOPIC_AUTHORIZATION_FAILED),
        or of every partition (those left out). With ``require_stable``
        (KIP-447), a partition whose offsets wait on an open transaction is
        answered UNSTABLE_OFFSET_COMMIT, which the client retries."""
        refused = caller.refused(acl.DESCRIBE, acl.GROUP, group_id)
        if refused:
            return refused, []
        wanted = None if topics is None else [
            TopicPartition(t["Name"], p) for t in topics for p in t["PartitionIndexes"]]
        hidden = {}
        for topic in {tp.topic for tp in wanted or ()}:
            hidden[topic] = caller.refused(acl.DESCRIBE, acl.TOPIC, topic)
        service = self.server.groups
        try:
            committed, unstable = await service.run(
                group_id, lambda core: ((core.fetch_offsets(group_id, wanted),
                                         core.unstable_offsets(group_id)
                                         if require_stable else set()), []))
        except Exception as exc:  # noqa: BLE001  answered as its code
            return error_code(exc), []
        by_topic: dict[str, list[dict]] = {}
        for topic, partition in (wanted if wanted is not None else sorted(committed)):
            code = hidden.get(topic) if wanted is not None \
                else caller.refused(acl.DESCRIBE, acl.TOPIC, topic)
            if code and wanted is None:
                continue
            if not code and (topic, partition) in unstable:
                code = messages.ERRORS["UNSTABLE_OFFSET_COMMIT"]
            found = None if code else committed.get((topic, partition))
            offset, metadata = found[:2] if found is not None else (-1, "")
            by_topic.setdefault(topic, []).append({
                "PartitionIndex": partition, "CommittedOffset": offset,
                "CommittedLeaderEpoch": -1, "Metadata": metadata, "ErrorCode": code or 0})
        return 0, [{"Name": name, "Partitions": parts} for name, parts in by_topic.items()]

    async def offset_fetch(self, request: dict, version: int, caller: "Caller") -> dict:
        if version >= 8:
            groups = []
            for group in request["Groups"]:
                code, topics = await self._committed(group["GroupId"], group["Topics"], caller,
                                                     bool(request.get("RequireStable")))
                groups.append({"GroupId": group["GroupId"], "Topics": topics,
                               "ErrorCode": code})
            return {"ThrottleTimeMs": 0, "Groups": groups}
        code, topics = await self._committed(request["GroupId"], request["Topics"], caller,
                                             bool(request.get("RequireStable")))
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

    async def join_group(self, request: dict, version: int, caller: "Caller") -> dict:
        import uuid

        from api.broker.groups.coordinator import GroupError, HeartbeatRequest

        group_id = request["GroupId"]
        answer = {"ThrottleTimeMs": 0, "ErrorCode": 0, "GenerationId": -1,
                  "ProtocolType": "consumer", "ProtocolName": None, "Leader": "",
                  "MemberId": request["MemberId"], "Members": []}
        protocols = request["Protocols"] or []
        refused = caller.refused(acl.READ, acl.GROUP, group_id)
        if refused:
            answer["ErrorCode"] = refused
            return answer
        if request["ProtocolType"] != "consumer" or not protocols:
            answer["ErrorCode"] = messages.ERRORS["INCONSISTENT_GROUP_PROTOCOL"]
            return answer
        try:
            topics = _subscription(protocols[0]["Metadata"])
        except codec.KafkaDecodeError:
            answer["ErrorCode"] = messages.ERRORS["INCONSISTENT_GROUP_PROTOCOL"]
            return answer
        if caller.auth.enabled:
            # A topic the member may not see is not subscribed to, as a
            # classic leader assigns only the topics its metadata shows.
            topics = [t for t in topics if caller.may(acl.DESCRIBE, acl.TOPIC, t)]
        member_id = request["MemberId"] or f"{caller.header.get('ClientId') or 'consumer'}-" \
                                           f"{uuid.uuid4()}"
        rebalance = request.get("RebalanceTimeoutMs", request["SessionTimeoutMs"])
        heartbeat = HeartbeatRequest(
            member_id=member_id, member_epoch=0, instance_id=request.get("GroupInstanceId"),
            rebalance_timeout_ms=max(0, rebalance),
            session_timeout_ms=request["SessionTimeoutMs"], subscribed_topic_names=topics,
            owned_partitions=[], client_id=caller.header.get("ClientId"),
            client_host=caller.client_host)
        service = self.server.groups
        instance_id = request.get("GroupInstanceId")

        def join(core) -> tuple:
            # Static membership (group.instance.id), Kafka's classic rules: a
            # new member (no member id) replaces the one holding its
            # instance id, at once; a known member id whose instance id
            # another member now holds was replaced, and is fenced.
            replaced, records = None, []
            if instance_id:
                holder = core.instance_member(group_id, instance_id)
                if request["MemberId"] and holder not in (None, member_id):
                    return _FENCED, []
                if not request["MemberId"]:
                    replaced, records = core.release_instance(service.clock_ms(), group_id,
                                                              heartbeat)
            try:
                response, more = core.heartbeat(service.clock_ms(), group_id, heartbeat,
                                                service.topics())
            except GroupError as exc:  # refused after the release: write that, then raise
                return exc, records
            return (response, replaced), records + more
        try:
            joined = await service.run(group_id, join)
        except Exception as exc:  # noqa: BLE001  answered as its code
            answer["ErrorCode"] = _classic_code(exc)
            return answer
        if joined is _FENCED:
            answer["ErrorCode"] = messages.ERRORS["FENCED_INSTANCE_ID"]
            return answer
        response, replaced = joined
        if replaced is not None:
            self._classic.pop((group_id, replaced), None)
        self._forget_silent_members()
        self._classic[(group_id, member_id)] = _Classic(
            response.member_epoch, response.member_epoch,
            frozenset(map(tuple, response.assignment or ())), protocols[0]["Name"],
            instance_id)
        answer.update(GenerationId=response.member_epoch, ProtocolName=protocols[0]["Name"],
                      Leader=CLASSIC_LEADER, MemberId=member_id)
        return answer

    async def _unknown_here(self, group_id: str, member_id: str,
                            instance_id: str | None) -> int:
        """A classic member this listener has not seen join: after a
        coordinator moved or restarted, a member the group still knows.
        Asked to rejoin keeping its id (REBALANCE_IN_PROGRESS), it takes back
        its place rather than waiting out its old session as a stranger. A
        static member another process replaced is fenced."""
        if await self._replaced(group_id, member_id, instance_id):
            return messages.ERRORS["FENCED_INSTANCE_ID"]
        return messages.ERRORS["REBALANCE_IN_PROGRESS" if member_id else "UNKNOWN_MEMBER_ID"]

    async def _replaced(self, group_id: str, member_id: str, instance_id: str | None) -> bool:
        """Whether another member now holds ``member_id``'s static instance
        id (the group's coordinator says; it survives a failover)."""
        if not instance_id or not member_id:
            return False
        try:
            holder = await self.server.groups.run(
                group_id, lambda core: (core.instance_member(group_id, instance_id), []))
        except Exception:  # noqa: BLE001  not known: not fenced
            return False
        return holder is not None and holder != member_id

    def _forget_silent_members(self) -> None:
        """Past CLASSIC_MEMBERS_MAX, forget the members silent for an hour
        (a member that died without leaving; the coordinator dropped it
        long ago: it would have to rejoin anyway)."""
        if len(self._classic) < CLASSIC_MEMBERS_MAX:
            return
        horizon = time.monotonic() - CLASSIC_SILENT_S
        self._classic = {key: member for key, member in self._classic.items()
                         if member.seen >= horizon}

    async def sync_group(self, request: dict, version: int, caller: "Caller") -> dict:
        group_id, member_id = request["GroupId"], request["MemberId"]
        answer = {"ThrottleTimeMs": 0, "ErrorCode": 0, "ProtocolType": "consumer",
                  "ProtocolName": None, "Assignment": b""}
        classic = self._classic.get((group_id, member_id))
        refused = caller.refused(acl.READ, acl.GROUP, group_id)
        if refused:
            answer["ErrorCode"] = refused
            return answer
        if classic is None:
            answer["ErrorCode"] = await self._unknown_here(group_id, member_id,
                                                           request.get("GroupInstanceId"))
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
                if await self._replaced(group_id, member_id, classic.instance_id):
                    return messages.ERRORS["FENCED_INSTANCE_ID"]
            return _classic_code(exc)
        classic.epoch = response.member_epoch
        if response.assignment is not None:
            given = frozenset(map(tuple, response.assignment))
            if given != classic.assigned:
                if keep:
                    return messages.ERRORS["REBALANCE_IN_PROGRESS"]
                classic.assigned = given
        return 0

    async def heartbeat(self, request: dict, version: int, caller: "Caller") -> dict:
        group_id, member_id = request["GroupId"], request["MemberId"]
        classic = self._classic.get((group_id, member_id))
        refused = caller.refused(acl.READ, acl.GROUP, group_id)
        if refused:
            code = refused
        elif classic is None:
            code = await self._unknown_here(group_id, member_id, request.get("GroupInstanceId"))
        elif request["GenerationId"] != classic.generation:
            code = messages.ERRORS["ILLEGAL_GENERATION"]
        else:
            code = await self._beat_classic(group_id, member_id, classic, keep=True)
        return {"ThrottleTimeMs": 0, "ErrorCode": code}

    async def leave_group(self, request: dict, version: int, caller: "Caller") -> dict:
        from api.broker.groups.coordinator import LEAVE_EPOCH, HeartbeatRequest

        group_id = request["GroupId"]
        leaving = ([{"MemberId": request["MemberId"], "GroupInstanceId": None}]
                   if version < 3 else request["Members"] or [])
        members = []
        refused = caller.refused(acl.READ, acl.GROUP, group_id)
        if refused:
            return {"ThrottleTimeMs": 0, "ErrorCode": refused, "Members": [
                {"MemberId": m["MemberId"], "GroupInstanceId": m.get("GroupInstanceId"),
                 "ErrorCode": refused} for m in leaving]}
        for member in leaving:
            code = 0
            member_id = member["MemberId"]
            instance_id = member.get("GroupInstanceId")
            try:
                if not member_id and instance_id:
                    # An admin removing a static member names its instance id
                    # (Kafka's removeMembersFromConsumerGroup).
                    member_id = await self.server.groups.run(
                        group_id, lambda core: (core.instance_member(group_id, instance_id),
                                                [])) or ""
                    if not member_id:
                        raise _Refused(messages.ERRORS["UNKNOWN_MEMBER_ID"], "")
                await self._classic_beat(group_id, HeartbeatRequest(
                    member_id=member_id, member_epoch=LEAVE_EPOCH))
            except _Refused as exc:
                code = exc.code
            except Exception as exc:  # noqa: BLE001  answered as its code
                code = _classic_code(exc)
            self._classic.pop((group_id, member_id), None)
            members.append({"MemberId": member["MemberId"],
                            "GroupInstanceId": member.get("GroupInstanceId"),
                            "ErrorCode": code})
        top = members[0]["ErrorCode"] if version < 3 and members else 0
        return {"ThrottleTimeMs": 0, "ErrorCode": top, "Members": members}


    # -- groups: listing and describing -------------------------------------------------------
    async def list_groups(self, request: dict, version: int, caller: Caller) -> dict:
        """The groups this broker coordinates (Kafka's admin clients ask every
        broker), those the caller may DESCRIBE, filtered by state (v4) and
        type (v5: kraftlog's groups are all of the consumer type)."""
        states = {s.lower() for s in request.get("StatesFilter") or ()}
        types = {t.lower() for t in request.get("TypesFilter") or ()}
        everything = not caller.auth.enabled or caller.may(acl.DESCRIBE, acl.CLUSTER)
        groups = []
        if not types or "consumer" in types:
            for group in self.server.groups.list_local():
                state = _group_state(group["state"])
                if states and state.lower() not in states:
                    continue
                if everything or caller.may(acl.DESCRIBE, acl.GROUP, group["group_id"]):
                    groups.append({"GroupId": group["group_id"], "ProtocolType": "consumer",
                                   "GroupState": state, "GroupType": "consumer"})
        return {"ThrottleTimeMs": 0, "ErrorCode": 0, "Groups": groups}

    async def describe_groups(self, request: dict, version: int, caller: Caller) -> dict:
        """Each group as its coordinator (this broker) knows it, members'
        subscriptions and assignments in the consumer protocol's encoding."""
        service = self.server.groups
        described = []
        for group_id in request["Groups"] or ():
            answer = {"ErrorCode": 0, "GroupId": group_id, "GroupState": "Dead",
                      "ProtocolType": "", "ProtocolData": "", "Members": [],
                      "AuthorizedOperations": -2147483648}
            described.append(answer)
            refused = caller.refused(acl.DESCRIBE, acl.GROUP, group_id)
            if refused:
                answer["ErrorCode"] = refused
                continue
            try:
                group = await service.run(group_id, lambda core, g=group_id: (
                    core.describe(g, service.clock_ms()), []))
            except Exception as exc:  # noqa: BLE001  answered as its code
                answer["ErrorCode"] = error_code(exc)
                continue
            if group["state"] == "dead":
                continue
            members = []
            seen: dict[str, bool] = {}

            def visible(topic: str) -> bool:
                """A topic the caller may DESCRIBE (else left out, as the
                HTTP API's description leaves it out)."""
                if not caller.auth.enabled:
                    return True
                if topic not in seen:
                    seen[topic] = caller.may(acl.DESCRIBE, acl.TOPIC, topic)
                return seen[topic]
            for member in group["members"]:
                classic = self._classic.get((group_id, member["member_id"]))
                members.append({
                    "MemberId": member["member_id"], "GroupInstanceId": member["instance_id"],
                    "ClientId": member.get("client_id") or "",
                    "ClientHost": member.get("client_host") or "",
                    "MemberMetadata": _subscription_bytes(
                        [t for t in member["subscribed_topic_names"] or () if visible(t)]),
                    "MemberAssignment": _assignment(frozenset(
                        tuple(tp) for tp in member["assigned"] if visible(tp[0])))})
                if classic is not None and not answer["ProtocolData"]:
                    answer["ProtocolData"] = classic.protocol
            answer.update(GroupState=_group_state(group["state"]), ProtocolType="consumer",
                          ProtocolData=answer["ProtocolData"] or group["assignor"] or "",
                          Members=members)
        return {"ThrottleTimeMs": 0, "Groups": described}

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

    @staticmethod
    def _topic_refusals(caller: Caller, operation: str, names, cluster_too: bool = False
                        ) -> dict[str, int]:
        """name -> TOPIC_AUTHORIZATION_FAILED for each topic the caller may
        not ``operation`` (for CreateTopics, CREATE on the cluster allows
        every topic). Kafka answers them so and does the others."""
        if not caller.auth.enabled or (cluster_too and caller.may(operation, acl.CLUSTER)):
            return {}
        return {name: code for name in dict.fromkeys(names)
                if (code := caller.refused(operation, acl.TOPIC, name))}

    async def create_topics(self, request: dict, version: int, caller: Caller) -> dict:
        topics = request["Topics"] or []
        refused = self._topic_refusals(caller, acl.CREATE, (t["Name"] for t in topics),
                                       cluster_too=True)
        asked = [t for t in topics if t["Name"] not in refused]
        answer, code, message = await self._admin("/v1/controller/topics/create", {
            # Kafka's definition spells these two in lower camel case.
            "validate_only": bool(request.get("validateOnly")),
            "timeout_ms": max(0, request["timeoutMs"]),
            "topics": [{"name": t["Name"], "num_partitions": t["NumPartitions"],
                        "replication_factor": t["ReplicationFactor"],
                        "configs": {c["Name"]: c["Value"] for c in t["Configs"] or ()},
                        **({"assignments": {a["PartitionIndex"]: a["BrokerIds"]
                                            for a in t["Assignments"]}}
                           if t["Assignments"] else {})} for t in asked]}) if asked \
            else ({}, 0, None)
        results = []
        by_name = {e["name"]: e for e in (answer or {}).get("topics") or ()}
        for t in topics:
            entry = by_name.get(t["Name"], {})
            entry_code, entry_message = (code, message) if answer is None \
                else self._entry_error(entry)
            if t["Name"] in refused:
                entry_code, entry_message = refused[t["Name"]], "not authorized to CREATE it"
            # Its configs and shape are told only to a caller who may
            # DESCRIBE_CONFIGS it (Kafka's rule).
            configs_refused = 0 if entry_code else caller.refused(
                acl.DESCRIBE_CONFIGS, acl.TOPIC, t["Name"])
            shown = not entry_code and not configs_refused
            results.append({
                "Name": t["Name"], "TopicId": topic_uuid(entry.get("topic_id")),
                "ErrorCode": entry_code, "ErrorMessage": entry_message,
                "TopicConfigErrorCode": configs_refused,
                "NumPartitions": entry.get("num_partitions", -1) if shown else -1,
                "ReplicationFactor": entry.get("replication_factor", -1) if shown else -1,
                "Configs": None if not shown else [
                    {"Name": k, "Value": None if v is None else str(v), "ReadOnly": False,
                     "ConfigSource": 5, "IsSensitive": False}  # 5: the cluster's default
                    for k, v in sorted((entry.get("configs") or {}).items())]})
        return {"ThrottleTimeMs": 0, "Topics": results}

    async def delete_topics(self, request: dict, version: int, caller: Caller) -> dict:
        by_id = self._topic_names()
        # (name, id asked for or None); v6 names a topic or gives its id.
        asked = [(n, None) for n in request["TopicNames"] or []] if version < 6 else [
            (t["Name"], None) if t["Name"] is not None
            else (by_id.get(t["TopicId"]), t["TopicId"]) for t in request["Topics"] or ()]
        names = [n for n, _ in asked if n is not None]
        refused = self._topic_refusals(caller, acl.DELETE, names)
        # Kafka's rule: a topic asked for by id whose name the caller may not
        # DESCRIBE is answered without its name.
        hidden = {n for n, topic_id in asked if topic_id is not None and n in refused
                  and caller.refused(acl.DESCRIBE, acl.TOPIC, n)}
        wanted = [n for n in dict.fromkeys(names) if n not in refused]
        answer, code, message = await self._admin("/v1/controller/topics/delete",
                                                  {"topics": wanted}) if wanted \
            else ({}, 0, None)
        by_name = {e["name"]: e for e in (answer or {}).get("topics") or ()}
        ids = {name: topic_id for topic_id, name in by_id.items()}
        results = []
        for name, topic_id in asked:
            if name is None:
                results.append({"Name": None, "TopicId": topic_id,
                                "ErrorCode": messages.ERRORS["UNKNOWN_TOPIC_ID"],
                                "ErrorMessage": "no topic has that id"})
                continue
            entry_code, entry_message = (code, message) if answer is None \
                else self._entry_error(by_name.get(name, {}))
            if name in refused:
                entry_code, entry_message = refused[name], "not authorized to DELETE it"
            results.append({"Name": None if name in hidden else name,
                            "TopicId": topic_id or ids.get(name, codec.ZERO_UUID),
                            "ErrorCode": entry_code, "ErrorMessage": entry_message})
        return {"ThrottleTimeMs": 0, "Responses": results}

    async def create_partitions(self, request: dict, version: int, caller: Caller) -> dict:
        topics = request["Topics"] or []
        refused = self._topic_refusals(caller, acl.ALTER, (t["Name"] for t in topics))
        asked = [t for t in topics if t["Name"] not in refused]
        answer, code, message = await self._admin("/v1/controller/partitions/create", {
            "validate_only": bool(request.get("ValidateOnly")),
            "topics": [{"name": t["Name"], "count": t["Count"]} for t in asked]}) if asked \
            else ({}, 0, None)
        by_name = {e["name"]: e for e in (answer or {}).get("topics") or ()}
        results = []
        for t in topics:
            entry_code, entry_message = (code, message) if answer is None \
                else self._entry_error(by_name.get(t["Name"], {}))
            if t["Name"] in refused:
                entry_code, entry_message = refused[t["Name"]], "not authorized to ALTER it"
            results.append({"Name": t["Name"], "ErrorCode": entry_code,
                            "ErrorMessage": entry_message})
        return {"ThrottleTimeMs": 0, "Results": results}

    @staticmethod
    def _topic_resource(resource: dict, caller: Caller, operation: str) -> tuple[int, str]:
        """(0, "") for a topic resource the caller may ``operation``, else
        the code and message its result is answered with."""
        kind, name = resource["ResourceType"], resource["ResourceName"]
        if kind != TOPIC_RESOURCE:
            return messages.ERRORS["INVALID_REQUEST"], (
                f"resource type {kind}: only topics' configs (2) change here; a broker's are "
                "read only, set in its config file (`kraftlog node --print-config` shows them)")
        refused = caller.refused(operation, acl.TOPIC, name)
        if refused:
            return refused, f"not authorized to {operation} it"
        return 0, ""

    async def describe_configs(self, request: dict, version: int, caller: Caller) -> dict:
        """Topics' configs (resource type 2), with where each value comes
        from, and this broker's own (4: its config file's and defaults, read
        only: kraftlog has no dynamic broker configs)."""
        results = []
        for resource in request["Resources"] or ():
            kind, name = resource["ResourceType"], resource["ResourceName"]
            result = {"ErrorCode": 0, "ErrorMessage": None, "ResourceType": kind,
                      "ResourceName": name, "Configs": []}
            results.append(result)
            if kind == BROKER_RESOURCE:
                result.update(self._broker_configs(name, resource["ConfigurationKeys"], caller,
                                                   bool(request.get("IncludeDocumentation"))))
                continue
            code, message = self._topic_resource(resource, caller, acl.DESCRIBE_CONFIGS)
            if code:
                result.update(ErrorCode=code, ErrorMessage=message)
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

    def _broker_configs(self, name: str, keys: list[str] | None, caller: Caller,
                        documentation: bool = False) -> dict:
        """DescribeConfigs of this broker (``name``: its id, or "" for the
        defaults a broker has): every node config, where it comes from (the
        node's config file, or the default), read only."""
        from kraft.config_schema import SCHEMA

        config = self.server.config
        refused = caller.refused(acl.DESCRIBE_CONFIGS, acl.CLUSTER)
        if refused:
            return {"ErrorCode": refused, "ErrorMessage": "a broker's configs need "
                                                          "DESCRIBE_CONFIGS on the cluster"}
        if name not in ("", str(config.node_id)):
            return {"ErrorCode": messages.ERRORS["INVALID_REQUEST"],
                    "ErrorMessage": f"this is broker {config.node_id}: ask broker {name} for "
                                    "its own configs"}
        wanted = None if keys is None else set(keys)
        configs = []
        for key in SCHEMA:
            if wanted is not None and key.name not in wanted:
                continue
            value = config.settings.get(key.name)
            is_default = config.sources.get(key.name, "default") == "default"
            source = CONFIG_SOURCES["DEFAULT_CONFIG" if is_default else "STATIC_BROKER_CONFIG"]
            configs.append({"Name": key.name, "Value": _config_text(value), "ReadOnly": True,
                            "IsDefault": is_default, "ConfigSource": source,
                            "IsSensitive": False, "Synonyms": [],
                            "ConfigType": CONFIG_TYPES.get(key.type, 0),
                            "Documentation": key.doc if documentation else None})
        return {"Configs": configs}

    async def _alter_configs(self, resources: list[dict], validate_only: bool,
                             caller: Caller, ops_of: Callable[[dict], list[dict]]) -> list[dict]:
        """Each topic resource's changes (``ops_of``: kraftlog's set/delete
        operations of one resource), sent to the controller one resource at
        a time, as the HTTP admin API sends them; each answered for itself."""
        results = []
        counts: dict[tuple, int] = {}
        for resource in resources:
            key = (resource["ResourceType"], resource["ResourceName"])
            counts[key] = counts.get(key, 0) + 1
        for resource in resources:
            kind, name = resource["ResourceType"], resource["ResourceName"]
            result = {"ErrorCode": 0, "ErrorMessage": None, "ResourceType": kind,
                      "ResourceName": name}
            results.append(result)
            if counts[(kind, name)] > 1:  # Kafka refuses a resource named twice
                result.update(ErrorCode=messages.ERRORS["INVALID_REQUEST"],
                              ErrorMessage="the resource is named more than once")
                continue
            code, message = self._topic_resource(resource, caller, acl.ALTER_CONFIGS)
            if not code:
                try:
                    ops = ops_of(resource)
                except _Refused as exc:
                    code, message = exc.code, str(exc)
                except ValueError as exc:
                    code, message = messages.ERRORS["INVALID_REQUEST"], str(exc)
            if not code:
                answer, code, message = await self._admin("/v1/controller/configs/alter", {
                    "resources": [{"type": "topic", "name": name, "ops": ops}],
                    "validate_only": validate_only})
                if answer is not None:
                    code, message = self._entry_error(
                        ((answer or {}).get("resources") or [{}])[0])
            result.update(ErrorCode=code, ErrorMessage=message or None)
        return results

    async def alter_configs(self, request: dict, version: int, caller: Caller) -> dict:
        """AlterConfigs: each resource's configs replaced by those given (a
        config not named returns to its default), as Kafka's old API does."""
        described: dict[str, set[str] | _Refused] = {}
        for resource in request["Resources"] or ():
            if resource["ResourceType"] == TOPIC_RESOURCE and not self._topic_resource(
                    resource, caller, acl.ALTER_CONFIGS)[0]:
                described[resource["ResourceName"]] = await self._topic_overrides(
                    resource["ResourceName"])

        def ops_of(resource: dict) -> list[dict]:
            overrides = described.get(resource["ResourceName"], set())
            if isinstance(overrides, _Refused):  # its current configs could not be read
                raise overrides
            given = {c["Name"]: c["Value"] for c in resource["Configs"] or ()}
            ops = [{"name": k, "op": "delete"} if v is None else
                   {"name": k, "op": "set", "value": v} for k, v in given.items()]
            return ops + [{"name": k, "op": "delete"} for k in sorted(overrides)
                          if k not in given]
        return {"ThrottleTimeMs": 0, "Responses": await self._alter_configs(
            request["Resources"] or [], bool(request["ValidateOnly"]), caller, ops_of)}

    async def _topic_overrides(self, topic: str) -> set[str] | _Refused:
        """The configs a topic sets itself (not its defaults), or why they
        could not be read."""
        answer, code, message = await self._admin(
            "/v1/controller/configs/describe", {"resources": [{"type": "topic",
                                                                "name": topic}]})
        entries = (answer or {}).get("resources") or [{}]
        if answer is not None:
            code, message = self._entry_error(entries[0])
        if code:
            return _Refused(code, message or "the topic's configs could not be read")
        return {e["name"] for e in entries[0].get("configs") or ()
                if e.get("source") == "TOPIC_CONFIG"}

    async def incremental_alter_configs(self, request: dict, version: int,
                                        caller: Caller) -> dict:
        """IncrementalAlterConfigs: SET (0) and DELETE (1) each named config;
        APPEND (2) and SUBTRACT (3), for list configs, are refused: no topic
        config of kraftlog's is a list."""
        def ops_of(resource: dict) -> list[dict]:
            ops = []
            names = [config["Name"] for config in resource["Configs"] or ()]
            if len(set(names)) != len(names):
                raise ValueError("a config is named more than once")
            for config in resource["Configs"] or ():
                op = config["ConfigOperation"]
                if op == 0:
                    if config["Value"] is None:
                        raise ValueError(f"SET {config['Name']} needs a value")
                    ops.append({"name": config["Name"], "op": "set", "value": config["Value"]})
                elif op == 1:
                    ops.append({"name": config["Name"], "op": "delete"})
                else:
                    raise ValueError(f"{config['Name']}: operation {op} (APPEND or SUBTRACT) "
                                     "is for list configs, and no topic config of kraftlog's "
                                     "is a list: SET it")
            return ops
        return {"ThrottleTimeMs": 0, "Responses": await self._alter_configs(
            request["Resources"] or [], bool(request["ValidateOnly"]), caller, ops_of)}

    async def describe_cluster(self, request: dict, version: int, caller: "Caller") -> dict:
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

    async def add_partitions_to_txn(self, request: dict, version: int, caller: "Caller") -> dict:
        tid = request["V3AndBelowTransactionalId"]
        pid, epoch = request["V3AndBelowProducerId"], request["V3AndBelowProducerEpoch"]
        topics = request["V3AndBelowTopics"] or []
        partitions = [TopicPartition(t["Name"], p) for t in topics for p in t["Partitions"]]
        service = self.server.transactions
        # Kafka's checks: WRITE on the transactional id (else every
        # partition refused), then on each topic (a refused one fails the
        # request: the others are answered OPERATION_NOT_ATTEMPTED).
        refused = {name: code for name, code in self._topic_refusals(
            caller, acl.WRITE, (t["Name"] for t in topics)).items()}
        code = caller.refused(acl.WRITE, acl.TRANSACTIONAL_ID, tid)
        if not code and refused:
            code = messages.ERRORS["OPERATION_NOT_ATTEMPTED"]
        elif not code:
            try:
                if any(tp.topic in self.server.data.internal_topics for tp in partitions):
                    raise InvalidTopicError("the internal topics take no producer's writes")
                service.check_partitions(partitions)
                code = await self._txn(tid, lambda core: core.add_partitions(
                    tid, pid, epoch, partitions, service.clock_ms()))
            except Exception as exc:  # noqa: BLE001  answered as its code
                code = error_code(exc)
        else:
            refused = {}
        return {"ThrottleTimeMs": 0, "ResultsByTopicV3AndBelow": [
            {"Name": t["Name"], "ResultsByPartition": [
                {"PartitionIndex": p, "PartitionErrorCode": refused.get(t["Name"], code)}
                for p in t["Partitions"]]}
            for t in topics]}

    async def add_offsets_to_txn(self, request: dict, version: int, caller: "Caller") -> dict:
        tid, group_id = request["TransactionalId"], request["GroupId"]
        service = self.server.transactions
        refused = caller.refused(acl.WRITE, acl.TRANSACTIONAL_ID, tid) or caller.refused(
            acl.READ, acl.GROUP, group_id)
        if refused:
            return {"ThrottleTimeMs": 0, "ErrorCode": refused}
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

    async def end_txn(self, request: dict, version: int, caller: "Caller") -> dict:
        tid = request["TransactionalId"]
        service = self.server.transactions
        refused = caller.refused(acl.WRITE, acl.TRANSACTIONAL_ID, tid)
        if refused:
            return {"ThrottleTimeMs": 0, "ErrorCode": refused}
        code = await self._txn(tid, lambda core: core.end_txn(
            tid, request["ProducerId"], request["ProducerEpoch"], request["Committed"],
            service.clock_ms()))
        if code == 0:
            # Answered once the markers are written, as the HTTP API answers.
            await service.wait_markers(tid, END_WAIT_S)
        return {"ThrottleTimeMs": 0, "ErrorCode": code}

    async def txn_offset_commit(self, request: dict, version: int, caller: "Caller") -> dict:
        offsets = {TopicPartition(t["Name"], p["PartitionIndex"]):
                   (p["CommittedOffset"], p.get("CommittedMetadata") or "")
                   for t in request["Topics"] or () for p in t["Partitions"] or ()}
        tid, group_id = request["TransactionalId"], request["GroupId"]
        refused = _unreadable(caller, offsets)
        whole = caller.refused(acl.WRITE, acl.TRANSACTIONAL_ID, tid) or caller.refused(
            acl.READ, acl.GROUP, group_id)
        if whole:
            refused = dict.fromkeys(offsets, whole)
        allowed = {tp: o for tp, o in offsets.items() if tp not in refused}
        return await _commit_answer(allowed, self.server.groups.txn_commit(
            group_id, request["ProducerId"], request["ProducerEpoch"], allowed), refused)


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


async def _commit_answer(offsets: dict, committing, refused: dict | None = None) -> dict:
    """OffsetCommit's (or TxnOffsetCommit's) answer: each partition's code
    from ``committing`` (a coroutine answering partition -> error code or
    None), or its refusal of the whole request for every partition, and
    ``refused``'s codes (partitions not asked for: not authorized)."""
    codes = dict(refused or {})
    if not offsets:  # nothing to commit: only refusals
        if asyncio.iscoroutine(committing):
            committing.close()
    else:
        try:
            codes.update((tp, error_code(None if code is None else {"code": code}))
                         for tp, code in (await committing).items())
        except Exception as exc:  # noqa: BLE001  the whole request answered as its code
            codes.update((tp, error_code(exc)) for tp in offsets)
    by_topic: dict[str, list[dict]] = {}
    for (topic, partition), code in sorted(codes.items()):
        by_topic.setdefault(topic, []).append({"PartitionIndex": partition, "ErrorCode": code})
    return {"ThrottleTimeMs": 0, "Topics": [{"Name": name, "Partitions": parts}
                                            for name, parts in by_topic.items()]}


def _unreadable(caller: Caller, offsets: dict) -> dict:
    """The partitions of ``offsets`` whose topic the caller may not READ
    (their commits refused, as Kafka refuses them), with the code."""
    codes: dict = {}
    for tp in offsets:
        code = caller.refused(acl.READ, acl.TOPIC, tp.topic)
        if code:
            codes[tp] = code
    return codes


#: A classic join refused because another member holds its instance id.
_FENCED = object()
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

    __slots__ = ("generation", "epoch", "assigned", "protocol", "instance_id", "seen")

    def __init__(self, generation: int, epoch: int, assigned: frozenset, protocol: str,
                 instance_id: str | None = None):
        self.generation, self.epoch, self.assigned = generation, epoch, assigned
        self.protocol, self.instance_id = protocol, instance_id
        self.seen = time.monotonic()


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


def _config_text(value: Any) -> str | None:
    """A config value as Kafka shows it: ``true``/``false``, lists
    comma-separated, None as null."""
    if value is None:
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return ",".join(map(str, value))
    return str(value)


def _group_state(state: str) -> str:
    """kraftlog's group state as Kafka names it (``Stable``, ``Empty``...)."""
    return state.capitalize()


def _subscription_bytes(topics: list[str] | None) -> bytes:
    """ConsumerProtocolSubscription v0 of ``topics``."""
    out = bytearray(struct.pack(">h", 0))
    codec.encode(messages.ConsumerProtocolSubscription, 0,
                 {"Topics": list(topics or ()), "UserData": None}, out)
    return bytes(out)


def _assignment(partitions: frozenset) -> bytes:
    """ConsumerProtocolAssignment v0 of ``partitions``."""
    by_topic: dict[str, list[int]] = {}
    for topic, partition in sorted(partitions):
        by_topic.setdefault(topic, []).append(partition)
    out = bytearray(struct.pack(">h", 0))
    codec.encode(messages.ConsumerProtocolAssignment, 0, {"AssignedPartitions": [
        {"Topic": t, "Partitions": ps} for t, ps in by_topic.items()], "UserData": None}, out)
    return bytes(out)
