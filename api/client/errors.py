"""Errors the client raises, keyed by the broker's stable error codes.

Every error the broker answers carries a ``code`` (Kafka's names where the
meaning is the same) and a ``message`` for people; see docs/protocol.md. The
client turns each into a ``KraftlogError`` whose ``code`` is what programs
branch on and whose ``retriable`` says whether trying again (after a
metadata refresh) may succeed. Codes that programs commonly handle get their
own subclass so ``except NotLeaderError`` reads naturally; any other code
still arrives as a plain ``KraftlogError`` with that code.

Client-side conditions use codes of their own: ``BUFFER_EXHAUSTED`` (the
producer's memory stayed full for ``max_block_ms``), ``CLIENT_CLOSED`` (a
call on a closed client).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from protocol.errors import RETRIABLE_CODES

#: Codes after which the client's idea of who leads a partition is wrong.
METADATA_CODES = frozenset({
    "NOT_LEADER_OR_FOLLOWER",
    "UNKNOWN_TOPIC_OR_PARTITION",
    "LEADER_NOT_AVAILABLE",
    "FENCED_LEADER_EPOCH",
    "UNKNOWN_LEADER_EPOCH",
    "BROKER_NOT_AVAILABLE",
    "KAFKA_STORAGE_ERROR",
})


class KraftlogError(Exception):
    """An error with a stable ``code``, a human ``message`` and whether a
    retry may succeed. ``details`` keeps the other fields of the broker's
    error body (``leader_id``, ``log_start_offset``, ...)."""

    def __init__(self, code: str, message: str = "", retriable: bool | None = None,
                 **details: Any) -> None:
        super().__init__(f"{code}: {message}" if message else code)
        self.code = code
        self.message = message
        self.retriable = code in RETRIABLE_CODES if retriable is None else retriable
        self.details = details

    def __reduce__(self):  # keep pickling (multiprocessing, pytest-xdist) working
        return (_rebuild, (type(self), self.code, self.message, self.retriable, self.details))


def _rebuild(cls, code, message, retriable, details):
    error = KraftlogError.__new__(cls)
    KraftlogError.__init__(error, code, message, retriable, **details)
    return error


class _CodedError(KraftlogError):
    """A subclass bound to one code: constructed from a message alone."""

    CODE = "UNKNOWN_SERVER_ERROR"

    def __init__(self, message: str = "", retriable: bool | None = None,
                 **details: Any) -> None:
        super().__init__(self.CODE, message, retriable, **details)


class UnknownTopicOrPartitionError(_CodedError):
    CODE = "UNKNOWN_TOPIC_OR_PARTITION"


class NotLeaderError(_CodedError):
    """The broker asked does not lead the partition. ``leader_id``,
    ``leader_url`` and ``leader_epoch`` say who does, when the broker knows."""

    CODE = "NOT_LEADER_OR_FOLLOWER"

    @property
    def leader_id(self) -> int | None:
        return self.details.get("leader_id")

    @property
    def leader_url(self) -> str | None:
        return self.details.get("leader_url")

    @property
    def leader_epoch(self) -> int | None:
        return self.details.get("leader_epoch")


class LeaderNotAvailableError(_CodedError):
    CODE = "LEADER_NOT_AVAILABLE"


class OffsetOutOfRangeError(_CodedError):
    """A fetch offset outside ``[log_start_offset, high_watermark]``, or
    (``NoOffsetForPartitionError``) no position at all, with
    ``auto_offset_reset="none"``. ``partitions`` maps each affected
    ``TopicPartition`` to the offset that was asked for (or None)."""

    CODE = "OFFSET_OUT_OF_RANGE"

    @property
    def partitions(self) -> dict:
        return self.details.get("partitions", {})


class NoOffsetForPartitionError(OffsetOutOfRangeError):
    """A partition has no position and ``auto_offset_reset`` is ``"none"``:
    the application must ``seek`` first."""


class RequestTimedOutError(_CodedError):
    CODE = "REQUEST_TIMED_OUT"


class BrokerNotAvailableError(_CodedError):
    """A broker could not be reached (refused, reset, unreachable)."""

    CODE = "BROKER_NOT_AVAILABLE"


class SslAuthenticationError(_CodedError):
    """The TLS handshake with a broker failed: an untrusted or expired
    certificate, a host name it does not name, TLS spoken to a plain
    listener, or no client certificate where one is required. Not
    retriable (Kafka's ``SslAuthenticationException``): it fails the same
    way until the configuration changes."""

    CODE = "SSL_AUTHENTICATION_FAILED"


class SaslAuthenticationError(_CodedError):
    """A SASL_SSL listener refused the user name and password (or got
    none). Not retriable (Kafka's ``SaslAuthenticationException``)."""

    CODE = "SASL_AUTHENTICATION_FAILED"


class AuthorizationError(_CodedError):
    """An ACL refused the call (Kafka's ``AuthorizationException``). Not
    retriable: it fails the same way until an administrator allows it
    (the message says with which ``kraftlog acls add``)."""


class TopicAuthorizationFailedError(AuthorizationError):
    CODE = "TOPIC_AUTHORIZATION_FAILED"


class GroupAuthorizationFailedError(AuthorizationError):
    CODE = "GROUP_AUTHORIZATION_FAILED"


class ClusterAuthorizationFailedError(AuthorizationError):
    CODE = "CLUSTER_AUTHORIZATION_FAILED"


class TransactionalIdAuthorizationFailedError(AuthorizationError):
    CODE = "TRANSACTIONAL_ID_AUTHORIZATION_FAILED"


class MessageTooLargeError(_CodedError):
    CODE = "MESSAGE_TOO_LARGE"


class CorruptRecordError(_CodedError):
    CODE = "CORRUPT_MESSAGE"


class TopicAlreadyExistsError(_CodedError):
    CODE = "TOPIC_ALREADY_EXISTS"


class InvalidTopicError(_CodedError):
    CODE = "INVALID_TOPIC_EXCEPTION"


class NotEnoughReplicasError(_CodedError):
    """An ``acks=all`` write refused, before appending, because fewer
    replicas than ``min.insync.replicas`` are in sync."""

    CODE = "NOT_ENOUGH_REPLICAS"


class NotEnoughReplicasAfterAppendError(NotEnoughReplicasError):
    """An ``acks=all`` write appended while the ISR shrank below
    ``min.insync.replicas``: not acknowledged; a retry may duplicate it."""

    CODE = "NOT_ENOUGH_REPLICAS_AFTER_APPEND"


class BufferExhaustedError(_CodedError):
    """The producer's ``buffer_memory`` stayed full for ``max_block_ms``:
    the broker is slower than the application, or unreachable."""

    CODE = "BUFFER_EXHAUSTED"


class ClientClosedError(_CodedError):
    """A call on a client that was closed (or records a closing producer
    could not deliver in its close timeout)."""

    CODE = "CLIENT_CLOSED"


#: code -> class; codes missing here become a plain KraftlogError.
ERROR_BY_CODE: dict[str, type[_CodedError]] = {
    cls.CODE: cls for cls in (
        UnknownTopicOrPartitionError, NotLeaderError, LeaderNotAvailableError,
        OffsetOutOfRangeError, RequestTimedOutError, BrokerNotAvailableError,
        MessageTooLargeError, CorruptRecordError, TopicAlreadyExistsError,
        InvalidTopicError, NotEnoughReplicasError, NotEnoughReplicasAfterAppendError,
        BufferExhaustedError, ClientClosedError, SslAuthenticationError,
        SaslAuthenticationError, TopicAuthorizationFailedError, GroupAuthorizationFailedError,
        ClusterAuthorizationFailedError, TransactionalIdAuthorizationFailedError)
}


def error_from(body: Mapping[str, Any] | None) -> KraftlogError | None:
    """The error for an ``{"code", "message", ...}`` body (None for None).

    Accepts the whole-request shape ``{"error": {...}}`` too. A body that is
    not a map with a code becomes ``UNKNOWN_SERVER_ERROR`` quoting it, so a
    malformed answer is reported, never swallowed.
    """
    if body is None:
        return None
    if isinstance(body, Mapping) and isinstance(body.get("error"), Mapping):
        body = body["error"]
    if not isinstance(body, Mapping) or not isinstance(body.get("code"), str):
        return KraftlogError("UNKNOWN_SERVER_ERROR", f"malformed error body {body!r:.200}")
    code = body["code"]
    message = str(body.get("message") or "")
    details = {k: v for k, v in body.items()
               if isinstance(k, str) and k.isidentifier()
               and k not in ("code", "message", "retriable")}
    cls = ERROR_BY_CODE.get(code)
    if cls is None:
        return KraftlogError(code, message, **details)
    return cls(message, **details)
