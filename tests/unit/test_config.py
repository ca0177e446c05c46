"""Unit tests of per-log configuration (storage/config.py): Kafka's defaults
and key names, conversion from topic and broker settings, and validation."""

from __future__ import annotations

import dataclasses

import pytest

from storage.config import (
    BROKER_TO_TOPIC_KEYS,
    CLEANUP_POLICIES,
    MAX_MESSAGE_BYTES_DEFAULT,
    SEGMENT_BYTES_DEFAULT,
    TOPIC_KEYS,
    LogConfig,
)
from storage.errors import InvalidConfigError, StorageError

WEEK_MS = 7 * 24 * 3600 * 1000
DAY_MS = 24 * 3600 * 1000
LONG_MAX = 2**63 - 1


def test_defaults_are_kafkas_except_flush_ms():
    config = LogConfig()
    assert config.segment_bytes == SEGMENT_BYTES_DEFAULT == 1_073_741_824
    assert config.segment_ms == WEEK_MS
    assert config.index_interval_bytes == 4096
    assert config.retention_ms == WEEK_MS
    assert config.retention_bytes == -1
    assert config.flush_messages == -1
    assert config.flush_ms == 1000  # fsync at least once a second (Kafka: never)
    assert config.max_message_bytes == MAX_MESSAGE_BYTES_DEFAULT == 1_048_588
    assert config.cleanup_policy == "delete"
    assert config.min_cleanable_dirty_ratio == 0.5
    assert isinstance(config.min_cleanable_dirty_ratio, float)
    assert config.min_compaction_lag_ms == 0
    assert config.max_compaction_lag_ms == LONG_MAX
    assert config.delete_retention_ms == DAY_MS


def test_config_is_immutable():
    with pytest.raises(dataclasses.FrozenInstanceError):
        LogConfig().segment_bytes = 2048


def test_topic_keys_cover_every_field():
    assert sorted(TOPIC_KEYS.values()) == sorted(f.name for f in dataclasses.fields(LogConfig))


# ---------------------------------------------------------------------------
# from_mapping
# ---------------------------------------------------------------------------
def test_from_mapping_reads_kafka_topic_keys():
    config = LogConfig.from_mapping({
        "segment.bytes": 1_048_576,
        "segment.ms": 60_000,
        "index.interval.bytes": 0,
        "retention.ms": -1,
        "retention.bytes": 10**12,
        "flush.messages": 1,
        "flush.ms": 0,
        "max.message.bytes": 61,
    })
    assert config == LogConfig(
        segment_bytes=1_048_576, segment_ms=60_000, index_interval_bytes=0,
        retention_ms=-1, retention_bytes=10**12, flush_messages=1, flush_ms=0,
        max_message_bytes=61)


def test_from_mapping_accepts_integers_spelled_as_strings():
    config = LogConfig.from_mapping({"retention.ms": "86400000", "segment.bytes": " 2048 ",
                                     "flush.ms": "-1"})
    assert (config.retention_ms, config.segment_bytes, config.flush_ms) == (86_400_000, 2048, -1)


def test_from_mapping_keeps_unmentioned_settings_of_the_base():
    base = LogConfig(segment_bytes=4096, flush_ms=-1)
    config = LogConfig.from_mapping({"retention.ms": 5}, base=base)
    assert (config.segment_bytes, config.flush_ms, config.retention_ms) == (4096, -1, 5)
    assert base.retention_ms == WEEK_MS  # the base itself is untouched
    assert LogConfig.from_mapping({}) == LogConfig()


def test_unknown_key_is_refused_with_the_known_keys_listed():
    with pytest.raises(InvalidConfigError) as info:
        LogConfig.from_mapping({"retention.hours": 1})
    message = str(info.value)
    assert "'retention.hours'" in message
    assert "retention.ms" in message and "segment.bytes" in message


def test_broker_key_is_not_a_topic_key():
    with pytest.raises(InvalidConfigError, match="log.segment.bytes"):
        LogConfig.from_mapping({"log.segment.bytes": 2048})


@pytest.mark.parametrize("value", [True, False])
def test_boolean_values_are_refused(value):
    with pytest.raises(InvalidConfigError,
                       match="flush.messages must be an integer, not a boolean"):
        LogConfig.from_mapping({"flush.messages": value})


@pytest.mark.parametrize("value", [1.5, 1000.0, "ten", "1.5", "", None, [1], b"100"])
def test_non_integer_values_are_refused(value):
    with pytest.raises(InvalidConfigError) as info:
        LogConfig.from_mapping({"segment.ms": value})
    assert "segment.ms must be an integer" in str(info.value)
    assert repr(value) in str(info.value)


@pytest.mark.parametrize("key, value, rule", [
    ("segment.bytes", 1023, "at least 1024"),
    ("segment.bytes", 2**31, "at most 2147483647"),
    ("segment.ms", 0, "at least 1"),
    ("index.interval.bytes", -1, "non-negative"),
    ("retention.ms", -2, "-1 or more"),
    ("retention.bytes", -2, "-1 or more"),
    ("flush.messages", 0, "-1 or at least 1"),
    ("flush.messages", -2, "-1 or at least 1"),
    ("flush.ms", -2, "-1 or non-negative"),
    ("max.message.bytes", 60, "between 61 and 2147483647"),
    ("max.message.bytes", 2**31, "between 61 and 2147483647"),
    ("segment.bytes", "100", "at least 1024"),  # string ints are range-checked too
])
def test_out_of_range_values_are_refused_naming_key_value_and_rule(key, value, rule):
    with pytest.raises(InvalidConfigError) as info:
        LogConfig.from_mapping({key: value})
    assert str(info.value).startswith(f"{key} = {int(value)} is invalid: it must be {rule}")


@pytest.mark.parametrize("key, value", [
    ("segment.bytes", 1024), ("segment.bytes", 2**31 - 1), ("segment.ms", 1),
    ("index.interval.bytes", 0), ("retention.ms", -1), ("retention.bytes", -1),
    ("flush.messages", -1), ("flush.messages", 1), ("flush.ms", -1), ("flush.ms", 0),
    ("max.message.bytes", 61), ("max.message.bytes", 2**31 - 1),
])
def test_boundary_values_are_accepted(key, value):
    assert LogConfig.from_mapping({key: value}).to_mapping()[key] == value


def test_direct_construction_is_validated_too():
    with pytest.raises(InvalidConfigError, match="segment.bytes"):
        LogConfig(segment_bytes=10)


def test_invalid_config_error_has_its_api_code():
    assert issubclass(InvalidConfigError, StorageError)
    assert InvalidConfigError.code == "INVALID_CONFIG"


# ---------------------------------------------------------------------------
# from_broker_config
# ---------------------------------------------------------------------------
def test_from_broker_config_maps_broker_names_to_log_settings():
    config = LogConfig.from_broker_config({
        "log.segment.bytes": 4096,
        "log.roll.ms": 3_600_000,
        "log.index.interval.bytes": 512,
        "log.retention.ms": "60000",
        "log.retention.bytes": 1_000_000,
        "log.flush.interval.messages": 10,
        "log.flush.interval.ms": 200,
        "message.max.bytes": 2_000_000,
        "log.cleanup.policy": "Delete,Compact",
        "log.cleaner.min.cleanable.ratio": "0.75",
        "log.cleaner.min.compaction.lag.ms": 1000,
        "log.cleaner.max.compaction.lag.ms": "2000",
        "log.cleaner.delete.retention.ms": 3000,
    })
    assert config == LogConfig(
        segment_bytes=4096, segment_ms=3_600_000, index_interval_bytes=512,
        retention_ms=60_000, retention_bytes=1_000_000, flush_messages=10, flush_ms=200,
        max_message_bytes=2_000_000, cleanup_policy="compact,delete",
        min_cleanable_dirty_ratio=0.75, min_compaction_lag_ms=1000,
        max_compaction_lag_ms=2000, delete_retention_ms=3000)


def test_from_broker_config_ignores_keys_of_other_node_parts():
    config = LogConfig.from_broker_config({
        "node.id": 1,
        "listeners": "PLAINTEXT://:9092",
        "log.dirs": "/var/lib/kraftlog",
        "controller.quorum.voters": "1@localhost:9093",
        "segment.bytes": 2048,  # a topic-level key has no meaning in a node config
        "log.segment.bytes": 8192,
    })
    assert config == LogConfig(segment_bytes=8192)


def test_from_broker_config_validates_what_it_picks():
    with pytest.raises(InvalidConfigError, match="segment.bytes = 10"):
        LogConfig.from_broker_config({"log.segment.bytes": 10})
    with pytest.raises(InvalidConfigError, match="must be an integer"):
        LogConfig.from_broker_config({"log.retention.ms": "forever"})


def test_every_broker_key_maps_to_a_topic_key():
    assert set(BROKER_TO_TOPIC_KEYS.values()) == set(TOPIC_KEYS)


# ---------------------------------------------------------------------------
# to_mapping
# ---------------------------------------------------------------------------
def test_to_mapping_uses_kafka_keys():
    assert LogConfig(segment_bytes=2048, flush_ms=-1).to_mapping() == {
        "segment.bytes": 2048,
        "segment.ms": WEEK_MS,
        "index.interval.bytes": 4096,
        "retention.ms": WEEK_MS,
        "retention.bytes": -1,
        "flush.messages": -1,
        "flush.ms": -1,
        "max.message.bytes": 1_048_588,
        "cleanup.policy": "delete",
        "min.cleanable.dirty.ratio": 0.5,
        "min.compaction.lag.ms": 0,
        "max.compaction.lag.ms": LONG_MAX,
        "delete.retention.ms": DAY_MS,
    }


@pytest.mark.parametrize("config", [
    LogConfig(),
    LogConfig(segment_bytes=1024, segment_ms=1, index_interval_bytes=0, retention_ms=-1,
              retention_bytes=5, flush_messages=3, flush_ms=0, max_message_bytes=61),
    LogConfig(cleanup_policy="compact,delete", min_cleanable_dirty_ratio=0.1 + 0.2,
              min_compaction_lag_ms=5, max_compaction_lag_ms=5, delete_retention_ms=0),
    LogConfig(cleanup_policy="compact", min_cleanable_dirty_ratio=1.0),
])
def test_to_mapping_round_trips(config):
    assert LogConfig.from_mapping(config.to_mapping()) == config
    as_strings = {key: str(value) for key, value in config.to_mapping().items()}
    assert LogConfig.from_mapping(as_strings) == config


def test_broker_hours_and_minutes_keys_are_honoured_with_kafkas_precedence():
    assert LogConfig.from_broker_config({"log.retention.hours": 2}).retention_ms == 7_200_000
    assert LogConfig.from_broker_config({"log.retention.minutes": 3}).retention_ms == 180_000
    assert LogConfig.from_broker_config(
        {"log.retention.hours": 2, "log.retention.minutes": 3}).retention_ms == 180_000
    assert LogConfig.from_broker_config(
        {"log.retention.hours": 2, "log.retention.ms": 5}).retention_ms == 5
    assert LogConfig.from_broker_config({"log.retention.hours": -1}).retention_ms == -1
    assert LogConfig.from_broker_config({"log.roll.hours": 1}).segment_ms == 3_600_000
    with pytest.raises(InvalidConfigError):
        LogConfig.from_broker_config({"log.retention.hours": "two"})


# ---------------------------------------------------------------------------
# compaction: cleanup.policy, the dirty ratio, the lags, tombstone retention
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("value, canonical, compact, delete", [
    ("delete", "delete", False, True),
    ("compact", "compact", True, False),
    ("compact,delete", "compact,delete", True, True),
    ("delete,compact", "compact,delete", True, True),
    (" Compact , DELETE ", "compact,delete", True, True),
    ("DELETE", "delete", False, True),
    (["delete", "compact"], "compact,delete", True, True),
    (("compact",), "compact", True, False),
    ([" Delete "], "delete", False, True),
])
def test_cleanup_policy_is_normalised_to_its_canonical_spelling(value, canonical, compact,
                                                                delete):
    config = LogConfig.from_mapping({"cleanup.policy": value})
    assert config.cleanup_policy == canonical and canonical in CLEANUP_POLICIES
    assert (config.compact, config.delete) == (compact, delete)
    assert config.to_mapping()["cleanup.policy"] == canonical
    # Built directly, the same spelling gives the same config.
    assert LogConfig(cleanup_policy=value) == config


@pytest.mark.parametrize("value", ["compress", "", " ", "delete,delete,x", "delete,delete",
                                   "delete,", ",compact", "compact;delete", [], ["shred"],
                                   ["compact", "compact"]])
def test_an_unknown_or_malformed_cleanup_policy_is_refused_naming_the_accepted_ones(value):
    with pytest.raises(InvalidConfigError) as info:
        LogConfig.from_mapping({"cleanup.policy": value})
    assert str(info.value) == (
        f"cleanup.policy = {value!r} is invalid: it must be delete, compact or "
        "compact,delete (also delete,compact; any case; or a list of those words)")


@pytest.mark.parametrize("value", [None, 1, True, ["compact", 1], {"compact": 1}, b"compact"])
def test_a_cleanup_policy_of_another_type_is_refused(value):
    with pytest.raises(InvalidConfigError,
                       match="cleanup.policy must be a string or a list of strings"):
        LogConfig.from_mapping({"cleanup.policy": value})


def test_a_bad_policy_built_directly_is_refused_too():
    with pytest.raises(InvalidConfigError, match="cleanup.policy = 'compacted' is invalid"):
        LogConfig(cleanup_policy="compacted")


@pytest.mark.parametrize("value, ratio", [
    (0, 0.0), (1, 1.0), (0.25, 0.25), ("0.5", 0.5), (" .75 ", 0.75), ("1e-1", 0.1),
    ("0", 0.0), ("1.0", 1.0), (-0.0, 0.0), ("-0", 0.0),
])
def test_min_cleanable_dirty_ratio_takes_numbers_and_becomes_a_float(value, ratio):
    config = LogConfig.from_mapping({"min.cleanable.dirty.ratio": value})
    got = config.to_mapping()["min.cleanable.dirty.ratio"]
    assert got == ratio and type(got) is float
    assert str(got) != "-0.0"


@pytest.mark.parametrize("value, message", [
    (-0.01, "min.cleanable.dirty.ratio = -0.01 is invalid: it must be between 0 and 1"),
    ("-1", "min.cleanable.dirty.ratio = -1.0 is invalid: it must be between 0 and 1"),
    (1.5, "min.cleanable.dirty.ratio = 1.5 is invalid: it must be between 0 and 1"),
    (2, "min.cleanable.dirty.ratio = 2.0 is invalid: it must be between 0 and 1"),
    (True, "min.cleanable.dirty.ratio must be a number, not a boolean"),
    (False, "min.cleanable.dirty.ratio must be a number, not a boolean"),
    (float("nan"), "min.cleanable.dirty.ratio must be a finite number, got nan"),
    ("NaN", "min.cleanable.dirty.ratio must be a finite number, got 'NaN'"),
    (float("inf"), "min.cleanable.dirty.ratio must be a finite number, got inf"),
    ("-Infinity", "min.cleanable.dirty.ratio must be a finite number, got '-Infinity'"),
    ("1e400", "min.cleanable.dirty.ratio must be a finite number, got '1e400'"),
    (10**400, "min.cleanable.dirty.ratio must be a finite number, got an integer too large"),
    ("half", "min.cleanable.dirty.ratio must be a number, got 'half'"),
    ("", "min.cleanable.dirty.ratio must be a number, got ''"),
    (None, "min.cleanable.dirty.ratio must be a number, got None"),
    ([0.5], "min.cleanable.dirty.ratio must be a number, got [0.5]"),
])
def test_a_bad_dirty_ratio_is_refused_with_a_clear_message(value, message):
    with pytest.raises(InvalidConfigError) as info:
        LogConfig.from_mapping({"min.cleanable.dirty.ratio": value})
    assert str(info.value).startswith(message)


@pytest.mark.parametrize("key, value, rule", [
    ("min.compaction.lag.ms", -1, "non-negative"),
    ("max.compaction.lag.ms", 0, "at least 1"),
    ("max.compaction.lag.ms", -5, "at least 1"),
    ("delete.retention.ms", -1, "non-negative"),
    ("delete.retention.ms", "-10", "non-negative"),
])
def test_compaction_times_out_of_range_are_refused(key, value, rule):
    with pytest.raises(InvalidConfigError) as info:
        LogConfig.from_mapping({key: value})
    assert str(info.value) == f"{key} = {int(value)} is invalid: it must be {rule}"


@pytest.mark.parametrize("key", ["min.compaction.lag.ms", "max.compaction.lag.ms",
                                 "delete.retention.ms"])
@pytest.mark.parametrize("value", [True, 1.5, "soon", None])
def test_compaction_times_must_be_integers(key, value):
    with pytest.raises(InvalidConfigError, match=f"{key} must be an integer"):
        LogConfig.from_mapping({key: value})


@pytest.mark.parametrize("key, value", [
    ("min.compaction.lag.ms", 0), ("min.compaction.lag.ms", LONG_MAX),
    ("max.compaction.lag.ms", 1), ("max.compaction.lag.ms", LONG_MAX),
    ("delete.retention.ms", 0), ("delete.retention.ms", "86400000"),
])
def test_compaction_time_boundaries_are_accepted(key, value):
    assert LogConfig.from_mapping({key: value}).to_mapping()[key] == int(value)


def test_max_compaction_lag_must_be_at_least_the_min():
    with pytest.raises(InvalidConfigError) as info:
        LogConfig.from_mapping({"min.compaction.lag.ms": 10_000,
                                "max.compaction.lag.ms": 9_999})
    assert str(info.value) == ("max.compaction.lag.ms = 9999 is invalid: it must be at least "
                               "min.compaction.lag.ms (10000)")
    equal = LogConfig.from_mapping({"min.compaction.lag.ms": 5, "max.compaction.lag.ms": 5})
    assert (equal.min_compaction_lag_ms, equal.max_compaction_lag_ms) == (5, 5)
    # The rule holds against the base's value of the key not given, too.
    base = LogConfig(min_compaction_lag_ms=100)
    with pytest.raises(InvalidConfigError, match="at least min.compaction.lag.ms \\(100\\)"):
        LogConfig.from_mapping({"max.compaction.lag.ms": 50}, base=base)
    with pytest.raises(InvalidConfigError, match="max.compaction.lag.ms"):
        LogConfig(min_compaction_lag_ms=2, max_compaction_lag_ms=1)


def test_broker_compaction_keys_are_reported_under_their_broker_names():
    with pytest.raises(InvalidConfigError, match="log.cleanup.policy = 'shred' is invalid"):
        LogConfig.from_broker_config({"log.cleanup.policy": "shred"})
    with pytest.raises(InvalidConfigError,
                       match="log.cleaner.min.cleanable.ratio must be a number"):
        LogConfig.from_broker_config({"log.cleaner.min.cleanable.ratio": "most"})
    with pytest.raises(InvalidConfigError, match="min.cleanable.dirty.ratio = 1.5"):
        LogConfig.from_broker_config({"log.cleaner.min.cleanable.ratio": 1.5})
    with pytest.raises(InvalidConfigError, match="at least min.compaction.lag.ms"):
        LogConfig.from_broker_config({"log.cleaner.min.compaction.lag.ms": 10,
                                      "log.cleaner.max.compaction.lag.ms": 1})
