"""Per-log configuration, validated once.

Keys are spelled as Kafka spells the topic-level settings (``segment.bytes``,
``retention.ms``, ...). A broker's defaults use Kafka's broker-level names
(``log.segment.bytes``, ``log.retention.ms``, ...); ``BROKER_TO_TOPIC_KEYS``
maps one to the other so a node config and a topic override mean the same.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

from storage.errors import InvalidConfigError

# Kafka's defaults, except flush.ms: Kafka leaves fsync to the OS and relies on
# replication; we fsync at least once a second so a single-node deployment
# (the default) loses at most one second of acknowledged acks=1 writes on a
# power failure, like Redis's appendfsync everysec.
SEGMENT_BYTES_DEFAULT = 1024 * 1024 * 1024
MAX_MESSAGE_BYTES_DEFAULT = 1024 * 1024 + 12  # Kafka's 1048588
NO_LIMIT = -1


@dataclasses.dataclass(frozen=True)
class LogConfig:
    """Settings of one partition log. Units are in the names."""

    # Roll to a new segment once the active one would exceed this size.
    segment_bytes: int = SEGMENT_BYTES_DEFAULT
    # Roll once the active segment's first record is this old.
    segment_ms: int = 7 * 24 * 3600 * 1000
    # Bytes of log between two sparse index entries.
    index_interval_bytes: int = 4096
    # Delete segments whose newest record is older than this; -1 keeps forever.
    retention_ms: int = 7 * 24 * 3600 * 1000
    # Delete oldest segments while the log is larger than this; -1 = no limit.
    retention_bytes: int = NO_LIMIT
    # fsync after this many messages since the last flush; -1 = never by count.
    flush_messages: int = NO_LIMIT
    # fsync when the oldest unflushed data is this old; -1 = never by time.
    flush_ms: int = 1000
    # Largest batch accepted (bytes, header included).
    max_message_bytes: int = MAX_MESSAGE_BYTES_DEFAULT

    def __post_init__(self) -> None:
        _require(self.segment_bytes >= 1024, "segment.bytes", self.segment_bytes,
                 "at least 1024")
        _require(self.segment_bytes <= 2**31 - 1, "segment.bytes", self.segment_bytes,
                 "at most 2147483647 (index positions are 32-bit)")
        _require(self.segment_ms >= 1, "segment.ms", self.segment_ms, "at least 1")
        _require(self.index_interval_bytes >= 0, "index.interval.bytes",
                 self.index_interval_bytes, "non-negative")
        _require(self.retention_ms >= -1, "retention.ms", self.retention_ms, "-1 or more")
        _require(self.retention_bytes >= -1, "retention.bytes", self.retention_bytes,
                 "-1 or more")
        _require(self.flush_messages == NO_LIMIT or self.flush_messages >= 1,
                 "flush.messages", self.flush_messages, "-1 or at least 1")
        _require(self.flush_ms == NO_LIMIT or self.flush_ms >= 0, "flush.ms",
                 self.flush_ms, "-1 or non-negative")
        _require(61 <= self.max_message_bytes <= 2**31 - 1, "max.message.bytes",
                 self.max_message_bytes, "between 61 and 2147483647")

    # -- conversion from Kafka-spelled keys ------------------------------
    @classmethod
    def from_mapping(cls, settings: Mapping[str, Any], base: "LogConfig | None" = None
                     ) -> "LogConfig":
        """Build from topic-level keys (``{"retention.ms": 1000}``), starting from
        ``base``. Unknown keys and ill-typed values raise ``InvalidConfigError``."""
        changes = {}
        for key, value in settings.items():
            field = TOPIC_KEYS.get(key)
            if field is None:
                raise InvalidConfigError(
                    f"unknown log config {key!r}; known: {', '.join(sorted(TOPIC_KEYS))}")
            changes[field] = _as_int(key, value)
        return dataclasses.replace(base or cls(), **changes)

    @classmethod
    def from_broker_config(cls, settings: Mapping[str, Any]) -> "LogConfig":
        """Defaults from a node config: picks the ``log.*`` keys it knows and
        ignores every other key (those belong to other parts of the node)."""
        picked = {BROKER_TO_TOPIC_KEYS[key]: value for key, value in settings.items()
                  if key in BROKER_TO_TOPIC_KEYS}
        # Kafka also takes hours and minutes; the finest unit given wins.
        for topic_key, coarse in COARSE_TIME_KEYS.items():
            if topic_key in picked:
                continue
            for key, unit_ms in coarse:
                if key in settings:
                    value = _as_int(key, settings[key])
                    picked[topic_key] = value * unit_ms if value >= 0 else NO_LIMIT
                    break
        return cls.from_mapping(picked)

    def to_mapping(self) -> dict[str, int]:
        return {key: getattr(self, field) for key, field in TOPIC_KEYS.items()}


TOPIC_KEYS = {
    "segment.bytes": "segment_bytes",
    "segment.ms": "segment_ms",
    "index.interval.bytes": "index_interval_bytes",
    "retention.ms": "retention_ms",
    "retention.bytes": "retention_bytes",
    "flush.messages": "flush_messages",
    "flush.ms": "flush_ms",
    "max.message.bytes": "max_message_bytes",
}

BROKER_TO_TOPIC_KEYS = {
    "log.segment.bytes": "segment.bytes",
    "log.roll.ms": "segment.ms",
    "log.index.interval.bytes": "index.interval.bytes",
    "log.retention.ms": "retention.ms",
    "log.retention.bytes": "retention.bytes",
    "log.flush.interval.messages": "flush.messages",
    "log.flush.interval.ms": "flush.ms",
    "message.max.bytes": "max.message.bytes",
}


COARSE_TIME_KEYS = {
    "retention.ms": (("log.retention.minutes", 60_000), ("log.retention.hours", 3_600_000)),
    "segment.ms": (("log.roll.hours", 3_600_000),),
}


def _as_int(key: str, value: Any) -> int:
    if isinstance(value, bool):
        raise InvalidConfigError(f"{key} must be an integer, not a boolean")
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        try:
            return int(value.strip())
        except ValueError:
            pass
    raise InvalidConfigError(f"{key} must be an integer, got {value!r}")


def _require(ok: bool, key: str, value: int, rule: str) -> None:
    if not ok:
        raise InvalidConfigError(f"{key} = {value} is invalid: it must be {rule}")
