"""HTTP bodies and errors, shared by the controller's and the broker's servers.

Bodies are msgpack (``application/msgpack``), or JSON (``application/json``)
where a human may call. A response uses the format the caller asked for in
``Accept``, else the format of its request body, else JSON for GETs.

Every error leaves as ``{"error": {"code": NAME, "message": text, ...}}``
with an HTTP status from ``STATUS_BY_CODE``: the code is what programs
branch on, the message is for people. ``error_middleware`` turns every
exception into such a body, so a handler never answers a bare 500: a
``KraftError`` (or anything with a ``code``) is the caller's problem,
anything else is logged with its traceback as ``UNKNOWN_SERVER_ERROR``.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

import aiohttp
import msgpack
from aiohttp import web

from protocol.errors import InvalidRequestError, KraftError

logger = logging.getLogger(__name__)

MSGPACK = "application/msgpack"
JSON = "application/json"
#: Request bodies above this are refused (socket.request.max.bytes, Kafka's default).
REQUEST_BYTES_MAX_DEFAULT = 100 * 1024 * 1024

STATUS_BY_CODE = {
    "SSL_AUTHENTICATION_FAILED": 401,
    "SASL_AUTHENTICATION_FAILED": 401,
    "CLUSTER_AUTHORIZATION_FAILED": 403,
    "TOPIC_AUTHORIZATION_FAILED": 403,
    "GROUP_AUTHORIZATION_FAILED": 403,
    "TRANSACTIONAL_ID_AUTHORIZATION_FAILED": 403,
    "SECURITY_DISABLED": 400,
    "DELEGATION_TOKEN_NOT_FOUND": 404,
    "DELEGATION_TOKEN_EXPIRED": 400,
    "DELEGATION_TOKEN_OWNER_MISMATCH": 403,
    "DELEGATION_TOKEN_AUTH_DISABLED": 400,
    "DELEGATION_TOKEN_REQUEST_NOT_ALLOWED": 403,
    "RESOURCE_NOT_FOUND": 404,
    "INVALID_REQUEST": 400,
    "INVALID_REQUIRED_ACKS": 400,
    "INVALID_RECORD": 400,
    "CORRUPT_MESSAGE": 400,
    "INVALID_TOPIC_EXCEPTION": 400,
    "INVALID_PARTITIONS": 400,
    "INVALID_REPLICATION_FACTOR": 400,
    "INVALID_CONFIG": 400,
    "UNSUPPORTED_COMPRESSION_TYPE": 400,
    "UNKNOWN_TOPIC_OR_PARTITION": 404,
    # Controller membership (KIP-853).
    "DUPLICATE_VOTER": 409,
    "VOTER_NOT_FOUND": 404,
    "REBALANCE_IN_PROGRESS": 409,
    "TOPIC_ALREADY_EXISTS": 409,
    "BROKER_ID_NOT_REGISTERED": 409,
    "STALE_BROKER_EPOCH": 409,
    "DUPLICATE_BROKER_REGISTRATION": 409,
    "INVALID_UPDATE_VERSION": 409,
    "FENCED_LEADER_EPOCH": 409,
    "UNKNOWN_LEADER_EPOCH": 409,
    "INELIGIBLE_REPLICA": 409,
    "NO_REASSIGNMENT_IN_PROGRESS": 409,
    # Idempotent and transactional producers.
    "OUT_OF_ORDER_SEQUENCE_NUMBER": 409,
    "INVALID_PRODUCER_EPOCH": 409,
    "UNKNOWN_PRODUCER_ID": 409,
    "PRODUCER_FENCED": 409,
    "INVALID_TXN_STATE": 409,
    "INVALID_PRODUCER_ID_MAPPING": 409,
    "CONCURRENT_TRANSACTIONS": 409,
    "TRANSACTION_COORDINATOR_FENCED": 409,
    "INVALID_TRANSACTION_TIMEOUT": 400,
    "TRANSACTIONAL_ID_NOT_FOUND": 404,
    "OFFSET_OUT_OF_RANGE": 416,
    "MESSAGE_TOO_LARGE": 413,
    "RECORD_TOO_LARGE": 413,
    # "Ask someone else": the body names who.
    "NOT_CONTROLLER": 421,
    "NOT_LEADER_OR_FOLLOWER": 421,
    "REQUEST_TIMED_OUT": 503,
    "NETWORK_EXCEPTION": 400,
    "NOT_ENOUGH_REPLICAS": 503,
    "NOT_ENOUGH_REPLICAS_AFTER_APPEND": 503,
    "LEADER_NOT_AVAILABLE": 503,
    "BROKER_NOT_AVAILABLE": 503,
    "KAFKA_STORAGE_ERROR": 503,
    "NOT_FOUND": 404,
    # Consumer groups.
    "INVALID_GROUP_ID": 400,
    "UNSUPPORTED_ASSIGNOR": 400,
    "INVALID_SESSION_TIMEOUT": 400,
    "GROUP_ID_NOT_FOUND": 404,
    "UNKNOWN_MEMBER_ID": 409,
    "FENCED_MEMBER_EPOCH": 409,
    "STALE_MEMBER_EPOCH": 409,
    "UNRELEASED_INSTANCE_ID": 409,
    "NON_EMPTY_GROUP": 409,
    "GROUP_MAX_SIZE_REACHED": 409,
    "NOT_COORDINATOR": 421,
    "COORDINATOR_LOAD_IN_PROGRESS": 503,
    "COORDINATOR_NOT_AVAILABLE": 503,
    "UNKNOWN_SERVER_ERROR": 500,
}


def encode(body: Any, content_type: str) -> bytes:
    if content_type == MSGPACK:
        return msgpack.packb(body, use_bin_type=True)
    return json.dumps(body, separators=(",", ":")).encode()


#: Byte strings at least this long (a fetch answer's records) leave as
#: pieces of their own instead of being copied into the packed answer. A
#: fetch answer of 10,000 partitions of 10 KB each is 10,000 pieces: walking
#: it costs less than packing it whole, whose growing buffer copies and
#: faults in every byte again at each doubling.
PIECE_BYTES_MIN = 4 * 1024

#: Containers and byte strings: what ``pack_pieces`` looks inside.
_WALKED = (dict, list, tuple, bytes, bytearray)


def msgpack_body(body: Any, pieces: bool = True) -> Any:
    """``body`` packed for aiohttp: bytes, or a ``PiecesPayload`` when it
    holds large byte strings (a produce request's batches, a fetch answer's
    records), which are then sent as they are instead of being copied.
    ``pieces`` False: a body known to hold none (a metadata answer, a fetch
    request naming thousands of partitions), packed in one call, in C."""
    if not pieces:
        return msgpack.packb(body, use_bin_type=True)
    parts = pack_pieces(body)
    if len(parts) > 1:
        if sum(len(part) for part in parts) <= WRITE_CHUNK_BYTES:
            return b"".join(parts)  # small: one write is cheaper
        return PiecesPayload(parts, MSGPACK)
    return parts[0] if parts else b""


def _bin_header(size: int) -> bytes:
    """msgpack's header of a byte string of ``size`` bytes (bin 16 or 32,
    as msgpack packs one of ``PIECE_BYTES_MIN`` or more)."""
    if size < 2**16:
        return b"\xc5" + size.to_bytes(2, "big")
    return b"\xc6" + size.to_bytes(4, "big")


def pack_pieces(body: Any) -> list:
    """``body`` as msgpack, in pieces whose concatenation is exactly
    ``msgpack.packb(body, use_bin_type=True)``: every ``bytes`` or
    ``bytearray`` value of ``PIECE_BYTES_MIN`` or more is a piece itself
    (behind its bin header), not a copy. A fetch answer of megabytes costs
    no packing copy."""
    packer = msgpack.Packer(use_bin_type=True, autoreset=False)
    pack = packer.pack
    pieces: list = []

    def walk(item: Any) -> None:
        # Scalars are packed where they are met, not by a call of walk each.
        if isinstance(item, dict):
            packer.pack_map_header(len(item))
            for key, value in item.items():
                pack(key)
                if isinstance(value, _WALKED):
                    walk(value)
                else:
                    pack(value)
        elif isinstance(item, (list, tuple)):
            packer.pack_array_header(len(item))
            for value in item:
                if isinstance(value, _WALKED):
                    walk(value)
                else:
                    pack(value)
        elif isinstance(item, (bytes, bytearray)) and len(item) >= PIECE_BYTES_MIN:
            pieces.append(packer.bytes() + _bin_header(len(item)))
            packer.reset()
            pieces.append(item)
        else:
            pack(item)

    walk(body)
    pieces.append(packer.bytes())
    return [piece for piece in pieces if piece]


#: Large pieces are handed to the socket this much at a time.
WRITE_CHUNK_BYTES = 256 * 1024


class PiecesPayload(aiohttp.payload.Payload):
    """A request or response body written piece by piece (``pack_pieces``),
    its length known up front."""

    def __init__(self, pieces: list, content_type: str) -> None:
        super().__init__(pieces, content_type=content_type)
        self._size = sum(len(piece) for piece in pieces)

    def decode(self, encoding: str = "utf-8", errors: str = "replace") -> str:
        return b"".join(self._value).decode(encoding, errors)

    async def as_bytes(self, encoding: str = "utf-8", errors: str = "strict") -> bytes:
        return b"".join(self._value)

    async def write(self, writer: Any) -> None:
        # Small pieces are joined into writes of about WRITE_CHUNK_BYTES (one
        # copy each, of memory still warm); large ones go in slices of it:
        # what the socket does not take at once is copied into the
        # transport's buffer, a slice at a time, not megabytes.
        run: list = []
        run_bytes = 0
        for piece in self._value:
            if len(piece) < WRITE_CHUNK_BYTES:
                run.append(piece)
                run_bytes += len(piece)
                if run_bytes >= WRITE_CHUNK_BYTES:
                    await writer.write(b"".join(run))
                    run, run_bytes = [], 0
                continue
            if run:
                await writer.write(b"".join(run))
                run, run_bytes = [], 0
            view = memoryview(piece)
            for start in range(0, len(view), WRITE_CHUNK_BYTES):
                await writer.write(view[start:start + WRITE_CHUNK_BYTES])
        if run:
            await writer.write(b"".join(run))


def response_type(request: web.Request) -> str:
    accept = request.headers.get("Accept", "")
    if MSGPACK in accept:
        return MSGPACK
    if JSON in accept:
        return JSON
    if request.content_type == MSGPACK:
        return MSGPACK
    return JSON


def respond(request: web.Request, body: Any, status: int = 200, *,
            pieces: bool = True) -> web.Response:
    """``body`` in the type the request accepts. ``pieces``: large byte
    strings in it leave uncopied (``msgpack_body``); False for a body known
    to hold none (a metadata answer), packed in one call, faster."""
    content_type = response_type(request)
    if content_type == MSGPACK:
        packed = msgpack_body(body, pieces)
        if isinstance(packed, PiecesPayload):
            return web.Response(body=packed, status=status)
        return web.Response(body=packed, status=status, content_type=content_type)
    return web.Response(body=encode(body, content_type), status=status,
                        content_type=content_type)


def error_body(exc: Exception) -> dict:
    error = {"code": getattr(exc, "code", "UNKNOWN_SERVER_ERROR"), "message": str(exc)}
    for extra in ("leader_id", "leader_epoch", "leader_url", "log_start_offset",
                  "log_end_offset", "coordinator_id", "coordinator_url"):
        if getattr(exc, extra, None) is not None:
            error[extra] = getattr(exc, extra)
    return {"error": error}


def error_response(request: web.Request, exc: Exception) -> web.Response:
    body = error_body(exc)
    return respond(request, body, STATUS_BY_CODE.get(body["error"]["code"], 400))


def error_answer(exc: Exception) -> tuple[dict, int]:
    """(error body, HTTP status) for ``exc`` raised by a request's handler,
    as ``error_middleware`` answers it: an error with a code is the
    caller's (its status from ``STATUS_BY_CODE``), anything else is 500
    UNKNOWN_SERVER_ERROR. For answers that are not HTTP responses (a
    request off a client's stream)."""
    if isinstance(getattr(exc, "code", None), str):
        body = error_body(exc)
        return body, STATUS_BY_CODE.get(body["error"]["code"], 400)
    return {"error": {"code": "UNKNOWN_SERVER_ERROR",
                      "message": f"internal error: {type(exc).__name__}: {exc}"}}, 500


async def read_body(request: web.Request) -> dict:
    """The request body as a map. Refuses (INVALID_REQUEST) a body that is not
    msgpack or JSON as its Content-Type says, or is not a map."""
    content_type = request.content_type
    if content_type not in (MSGPACK, JSON):
        raise InvalidRequestError(
            f"Content-Type must be {MSGPACK} or {JSON}, not {content_type or 'missing'}")
    raw = await read_raw_body(request)
    if not raw:
        raise InvalidRequestError("request body is empty; send a map")
    try:
        if content_type == MSGPACK:
            body = msgpack.unpackb(raw, raw=False, strict_map_key=False)
        else:
            body = json.loads(raw)
    except Exception as exc:  # both libraries raise several unrelated types
        fmt = "msgpack" if content_type == MSGPACK else "JSON"
        reason = str(exc) or type(exc).__name__
        raise InvalidRequestError(f"request body is not valid {fmt}: {reason}") from None
    if not isinstance(body, dict):
        raise InvalidRequestError(f"request body must be a map, got {type(body).__name__}")
    if content_type == JSON:
        try:  # JSON escapes can spell lone surrogates, which no UTF-8 can carry on
            json.dumps(body, ensure_ascii=False).encode()
        except UnicodeEncodeError as exc:
            raise InvalidRequestError(
                f"request body holds a string that is not valid Unicode: {exc.reason}") from None
    return body


class BodyTooLargeError(KraftError):
    code = "MESSAGE_TOO_LARGE"


class BodyStalledError(KraftError):
    """The sender stopped sending its body: the request is abandoned, so a
    slow or stalled client cannot hold the server's resources forever."""

    code = "REQUEST_TIMED_OUT"


class ClientGoneError(KraftError):
    """The client closed its connection in the middle of its request: normal
    traffic (a client timed out or was stopped), not a server fault."""

    code = "NETWORK_EXCEPTION"


#: App keys the servers set: the largest body they read, and how long a body
#: may stall (``connections.max.idle.ms``).
BODY_BYTES_MAX_KEY = web.AppKey("body_bytes_max", int)
BODY_IDLE_MS_KEY = web.AppKey("body_idle_ms", int)
#: Used when a server sets no limit of its own.
BODY_IDLE_MS_DEFAULT = 600_000
BODY_CHUNK_BYTES = 256 * 1024


async def read_raw_body(request: web.Request) -> bytes:
    """The whole body, read chunk by chunk: each chunk must arrive within
    the idle limit, and the total may not pass the size limit."""
    limit = request.app.get(BODY_BYTES_MAX_KEY, REQUEST_BYTES_MAX_DEFAULT)
    idle_s = request.app.get(BODY_IDLE_MS_KEY, BODY_IDLE_MS_DEFAULT) / 1000
    declared = request.content_length
    content = request.content
    chunks, size = [], 0
    try:
        while True:
            # What has arrived is taken at once (a small body is usually all
            # there): only a wait for more arms the idle timer.
            chunk = content.read_nowait(BODY_CHUNK_BYTES)
            if not chunk:
                if content.at_eof():
                    break
                try:
                    async with asyncio.timeout(idle_s):
                        chunk = await content.read(BODY_CHUNK_BYTES)
                except TimeoutError:
                    raise BodyStalledError(
                        f"the request body stalled: nothing arrived for {idle_s * 1000:.0f} ms "
                        f"after {size} bytes{f' of {declared}' if declared is not None else ''} "
                        "(connections.max.idle.ms)") from None
                if not chunk:
                    break
            size += len(chunk)
            if size > limit:
                raise BodyTooLargeError(
                    f"request body passes {limit} bytes (socket.request.max.bytes); send "
                    "smaller requests")
            chunks.append(chunk)
    except (ConnectionResetError, aiohttp.ClientConnectionResetError) as exc:
        logger.debug("%s %s: the client went away mid-body: %s", request.method, request.path,
                     exc)
        raise ClientGoneError(f"the client closed the connection mid-body ({exc})") from None
    if declared is not None and size < declared:
        raise ClientGoneError(f"the body ended after {size} of {declared} bytes")
    return b"".join(chunks)


@web.middleware
async def error_middleware(request: web.Request, handler: Any) -> web.StreamResponse:
    try:
        return await handler(request)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        if exc.status == 413:
            return error_response(request, BodyTooLargeError(exc.text or "body too large"))
        if exc.status == 404:
            code, message = "NOT_FOUND", f"no endpoint {request.method} {request.path}"
        elif exc.status == 405:
            code, message = "INVALID_REQUEST", f"{request.method} is not allowed on {request.path}"
        else:
            code, message = "INVALID_REQUEST", exc.text or exc.reason
        return respond(request, {"error": {"code": code, "message": message}}, exc.status)
    except KraftError as exc:
        return error_response(request, exc)
    except ConnectionResetError as exc:  # the client left: normal traffic, said quietly
        logger.debug("%s %s: the client went away: %s", request.method, request.path, exc)
        return error_response(request, ClientGoneError(str(exc)))
    except Exception as exc:  # storage errors carry codes too
        body, status = error_answer(exc)
        if status == 500:
            logger.exception("unexpected error handling %s %s", request.method, request.path)
        return respond(request, body, status)
