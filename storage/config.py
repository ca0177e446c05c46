"""Per-log configuration, validated once.

Keys are spelled as Kafka spells the topic-level settings (``segment.bytes``,
``retention.ms``, ``cleanup.policy``, ...). A broker's defaults use Kafka's
broker-level names (``log.segment.bytes``, ``log.retention.ms``,
``log.cleanup.policy``, ...); ``BROKER_TO_TOPIC_KEYS`` maps one to the other
so a node config and a topic override mean the same.

Each key has one parser (``_PARSERS``) that turns a value as a config file or
a request carries it (an int, a float, a string) into the field's type, so
``to_mapping`` gives typed values: ints, the dirty ratio as a float, the
cleanup policy as its canonical string.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Mapping

from storage.errors import InvalidConfigError

# Kafka's defaults, except flush.ms: Kafka leaves fsync to the OS and relies on
# replication; we fsync at least once a second so a single-node deployment
# (the default) loses at most one second of acknowledged acks=1 writes on a
# power failure, like Redis's appendfsync everysec.
SEGMENT_BYTES_DEFAULT = 1024 * 1024 * 1024
MAX_MESSAGE_BYTES_DEFAULT = 1024 * 1024 + 12  # Kafka's 1048588
NO_LIMIT = -1
LONG_MAX = 2**63 - 1

# cleanup.policy: what happens to data that is old or superseded. "delete"
# removes whole segments past retention.ms / retention.bytes; "compact" keeps
# at least the newest record of every key; "compact,delete" does both.
CLEANUP_POLICY_DELETE = "delete"
CLEANUP_POLICY_COMPACT = "compact"
CLEANUP_POLICY_COMPACT_DELETE = "compact,delete"
#: The canonical spellings; every accepted value normalises to one of these.
CLEANUP_POLICIES = (CLEANUP_POLICY_DELETE, CLEANUP_POLICY_COMPACT,
                    CLEANUP_POLICY_COMPACT_DELETE)
_CLEANUP_POLICY_WORDS = (CLEANUP_POLICY_COMPACT, CLEANUP_POLICY_DELETE)  # canonical order
_CLEANUP_POLICY_RULE = ("delete, compact or compact,delete (also delete,compact; any case; "
                        "or a list of those words)")


@dataclasses.dataclass(frozen=True)
class LogConfig:
    """Settings of one partition log. Units are in the names.

    Invariants (checked in ``__post_init__``): every field within its range;
    ``cleanup_policy`` is one of ``CLEANUP_POLICIES``;
    ``min_cleanable_dirty_ratio`` is a float in [0, 1];
    ``min_compaction_lag_ms <= max_compaction_lag_ms``.
    """

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
    # "delete", "compact" or "compact,delete" (canonical spelling; see above).
    cleanup_policy: str = CLEANUP_POLICY_DELETE
    # Compact a log only once this fraction of it (dirty bytes / all bytes
    # after the last cleaned offset's start) has not been cleaned yet.
    min_cleanable_dirty_ratio: float = 0.5
    # A record stays uncompacted for at least this long after it was written.
    min_compaction_lag_ms: int = 0
    # A record stays uncompacted for at most this long (the dirty ratio aside).
    max_compaction_lag_ms: int = LONG_MAX
    # Compaction keeps a tombstone (a record with a null value) this long after
    # its segment was cleaned, so consumers see the delete before it goes.
    delete_retention_ms: int = 24 * 3600 * 1000

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
        # Built directly, the two non-int fields are normalised like parsed
        # ones, so equal settings are equal configs.
        object.__setattr__(self, "cleanup_policy",
                           _as_cleanup_policy("cleanup.policy", self.cleanup_policy))
        ratio = _as_ratio("min.cleanable.dirty.ratio", self.min_cleanable_dirty_ratio)
        object.__setattr__(self, "min_cleanable_dirty_ratio", ratio)
        _require(0.0 <= ratio <= 1.0, "min.cleanable.dirty.ratio", ratio,
                 "between 0 and 1 (a fraction of the log)")
        _require(self.min_compaction_lag_ms >= 0, "min.compaction.lag.ms",
                 self.min_compaction_lag_ms, "non-negative")
        _require(self.max_compaction_lag_ms >= 1, "max.compaction.lag.ms",
                 self.max_compaction_lag_ms, "at least 1")
        _require(self.max_compaction_lag_ms >= self.min_compaction_lag_ms,
                 "max.compaction.lag.ms", self.max_compaction_lag_ms,
                 f"at least min.compaction.lag.ms ({self.min_compaction_lag_ms})")
        _require(self.delete_retention_ms >= 0, "delete.retention.ms",
                 self.delete_retention_ms, "non-negative")

    @property
    def compact(self) -> bool:
        """The cleaner keeps the newest record of each key ("compact" or
        "compact,delete")."""
        return self.cleanup_policy in (CLEANUP_POLICY_COMPACT, CLEANUP_POLICY_COMPACT_DELETE)

    @property
    def delete(self) -> bool:
        """Retention deletes old segments ("delete" or "compact,delete")."""
        return self.cleanup_policy in (CLEANUP_POLICY_DELETE, CLEANUP_POLICY_COMPACT_DELETE)

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
            changes[field] = _PARSERS[key](key, value)
        return dataclasses.replace(base or cls(), **changes)

    @classmethod
    def from_broker_config(cls, settings: Mapping[str, Any]) -> "LogConfig":
        """Defaults from a node config: picks the ``log.*`` keys it knows and
        ignores every other key (those belong to other parts of the node). A
        value that does not parse is reported under its broker-level name."""
        picked = {topic_key: _PARSERS[topic_key](key, value)
                  for key, value in settings.items()
                  if (topic_key := BROKER_TO_TOPIC_KEYS.get(key)) is not None}
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

    def to_mapping(self) -> dict[str, int | float | str]:
        """Every topic-level key with its typed value (ints, the ratio as a
        float, the policy as its canonical string)."""
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
    "cleanup.policy": "cleanup_policy",
    "min.cleanable.dirty.ratio": "min_cleanable_dirty_ratio",
    "min.compaction.lag.ms": "min_compaction_lag_ms",
    "max.compaction.lag.ms": "max_compaction_lag_ms",
    "delete.retention.ms": "delete_retention_ms",
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
    "log.cleanup.policy": "cleanup.policy",
    "log.cleaner.min.cleanable.ratio": "min.cleanable.dirty.ratio",
    "log.cleaner.min.compaction.lag.ms": "min.compaction.lag.ms",
    "log.cleaner.max.compaction.lag.ms": "max.compaction.lag.ms",
    "log.cleaner.delete.retention.ms": "delete.retention.ms",
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


def _as_ratio(key: str, value: Any) -> float:
    """A finite number (int, float, or either spelled as a string) as a
    float; the range is the caller's to check. -0.0 becomes 0.0."""
    if isinstance(value, bool):
        raise InvalidConfigError(f"{key} must be a number, not a boolean")
    if isinstance(value, str):
        try:
            number = float(value.strip())
        except ValueError:
            raise InvalidConfigError(f"{key} must be a number, got {value!r}") from None
    elif isinstance(value, (int, float)):
        try:
            number = float(value)
        except OverflowError:  # an int too large for a float (and to print)
            raise InvalidConfigError(f"{key} must be a finite number, got an integer too "
                                     "large for a float") from None
    else:
        raise InvalidConfigError(f"{key} must be a number, got {value!r}")
    if not math.isfinite(number):
        raise InvalidConfigError(f"{key} must be a finite number, got {value!r}")
    return number + 0.0


def _as_cleanup_policy(key: str, value: Any) -> str:
    """``"compact"``, ``" Delete , COMPACT "``, ``["delete", "compact"]``...
    -> one of ``CLEANUP_POLICIES``. Each word once, none empty or unknown."""
    if isinstance(value, str):
        words = value.split(",")
    elif isinstance(value, (list, tuple)) and all(isinstance(word, str) for word in value):
        words = list(value)
    else:
        raise InvalidConfigError(
            f"{key} must be a string or a list of strings, got {value!r}")
    words = [word.strip().lower() for word in words]
    if (not words or len(set(words)) != len(words)
            or not set(words) <= set(_CLEANUP_POLICY_WORDS)):
        raise InvalidConfigError(
            f"{key} = {value!r} is invalid: it must be {_CLEANUP_POLICY_RULE}")
    return ",".join(word for word in _CLEANUP_POLICY_WORDS if word in words)


# One parser per topic-level key: (key as the caller spells it, value) -> typed value.
_PARSERS: dict[str, Callable[[str, Any], Any]] = {key: _as_int for key in TOPIC_KEYS}
_PARSERS["cleanup.policy"] = _as_cleanup_policy
_PARSERS["min.cleanable.dirty.ratio"] = _as_ratio


def _require(ok: bool, key: str, value: int | float, rule: str) -> None:
    if not ok:
        raise InvalidConfigError(f"{key} = {value} is invalid: it must be {rule}")
