"""The registry of topic configs: which keys exist, how values are checked
and normalised, where defaults come from, and the unclean-election lookup."""

from __future__ import annotations

import pytest

from kraft import records as rec
from kraft import topic_config as tc
from kraft.image import MetadataImage
from protocol.errors import InvalidConfigError
from storage.config import TOPIC_KEYS, LogConfig


def test_registry_has_every_log_key_and_the_controller_keys():
    assert tc.TOPIC_CONFIG_KEYS == set(TOPIC_KEYS) | {
        "min.insync.replicas", "unclean.leader.election.enable", "cleanup.policy"}
    defaults = tc.builtin_defaults()
    log_defaults = LogConfig().to_mapping()
    assert all(defaults[key] == str(log_defaults[key]) for key in TOPIC_KEYS)
    assert (defaults["min.insync.replicas"], defaults["unclean.leader.election.enable"],
            defaults["cleanup.policy"]) == ("1", "false", "delete")
    assert (defaults["min.cleanable.dirty.ratio"], defaults["min.compaction.lag.ms"],
            defaults["max.compaction.lag.ms"], defaults["delete.retention.ms"]) == (
        "0.5", "0", "9223372036854775807", "86400000")
    # cleanup.policy is a log key now, with the broker key that sets its default.
    assert tc.TOPIC_CONFIGS["cleanup.policy"].broker_key == "log.cleanup.policy"
    assert tc.TOPIC_CONFIGS["min.cleanable.dirty.ratio"].broker_key == (
        "log.cleaner.min.cleanable.ratio")


@pytest.mark.parametrize("key, value, normalised", [
    ("retention.ms", 1000, "1000"),
    ("retention.ms", " 1_000 ", "1000"),
    ("retention.ms", "-1", "-1"),
    ("segment.bytes", "1048576", "1048576"),
    ("min.insync.replicas", "2", "2"),
    ("min.insync.replicas", 3, "3"),
    ("unclean.leader.election.enable", True, "true"),
    ("unclean.leader.election.enable", " FALSE ", "false"),
    ("cleanup.policy", "Delete", "delete"),
    ("cleanup.policy", "compact", "compact"),
    ("cleanup.policy", "compact,delete", "compact,delete"),
    ("cleanup.policy", "delete, COMPACT", "compact,delete"),
    ("cleanup.policy", ["delete", "compact"], "compact,delete"),
    ("min.cleanable.dirty.ratio", 0.5, "0.5"),
    ("min.cleanable.dirty.ratio", ".5", "0.5"),
    ("min.cleanable.dirty.ratio", "5e-1", "0.5"),
    ("min.cleanable.dirty.ratio", 0, "0.0"),
    ("min.cleanable.dirty.ratio", "1", "1.0"),
    ("min.cleanable.dirty.ratio", 0.00001, "0.00001"),  # never 1e-05
    ("min.cleanable.dirty.ratio", -0.0, "0.0"),
    ("min.compaction.lag.ms", "60_000", "60000"),
    ("max.compaction.lag.ms", 1, "1"),
    ("max.compaction.lag.ms", " 9223372036854775807 ", "9223372036854775807"),
    ("delete.retention.ms", 0, "0"),
])
def test_values_are_normalised_to_canonical_strings(key, value, normalised):
    assert tc.normalise_topic_config(key, value) == normalised
    assert tc.validate_topic_configs({key: value}) == {key: normalised}


@pytest.mark.parametrize("key, value, message", [
    ("no.such.key", "1", "unknown topic config"),
    (7, "1", "config names must be strings"),
    ("retention.ms", "soon", "retention.ms must be an integer"),
    ("retention.ms", True, "not a boolean"),
    ("retention.ms", -2, "-1 or more"),
    ("retention.ms", 2**63, "64-bit"),
    ("retention.ms", "9" * 30, "64-bit"),
    pytest.param("retention.ms", 10**5000, "64-bit", id="5000-digit int"),
    ("retention.ms", "1" * 1025, "limit is 1024"),
    ("retention.ms", None, "a string, a number, a boolean or a list of strings"),
    ("retention.ms", [1], "a string, a number, a boolean or a list of strings"),
    ("retention.ms", 1.5, "retention.ms must be an integer, got 1.5"),
    ("retention.ms", ["1"], "retention.ms must be an integer"),
    ("min.insync.replicas", 1.0, "must be an integer"),
    ("min.insync.replicas", ["1"], "must be an integer"),
    ("segment.bytes", 10, "at least 1024"),
    ("min.insync.replicas", 0, "between 1 and"),
    ("min.insync.replicas", "two", "must be an integer"),
    ("unclean.leader.election.enable", 1, "true or false"),
    ("unclean.leader.election.enable", "yes", "true or false"),
    ("cleanup.policy", "compress", "cleanup.policy = 'compress' is invalid: it must be "
                                   "delete, compact or compact,delete"),
    ("cleanup.policy", "", "cleanup.policy = '' is invalid"),
    ("cleanup.policy", "delete,delete,x", "cleanup.policy = 'delete,delete,x' is invalid"),
    ("cleanup.policy", 1, "cleanup.policy must be a string or a list of strings"),
    ("cleanup.policy", ["compact"] * 2, "is invalid"),
    ("cleanup.policy", ["x" * 600, "y" * 600], "characters long as a list; the limit is 1024"),
    ("min.cleanable.dirty.ratio", -0.1, "min.cleanable.dirty.ratio = -0.1 is invalid: it "
                                        "must be between 0 and 1"),
    ("min.cleanable.dirty.ratio", 1.5, "min.cleanable.dirty.ratio = 1.5 is invalid"),
    ("min.cleanable.dirty.ratio", "1.5", "must be between 0 and 1"),
    ("min.cleanable.dirty.ratio", "nan", "must be a finite number"),
    ("min.cleanable.dirty.ratio", True, "must be a number, not a boolean"),
    ("min.compaction.lag.ms", -1, "min.compaction.lag.ms = -1 is invalid: it must be "
                                  "non-negative"),
    ("min.compaction.lag.ms", "-5", "non-negative"),
    ("max.compaction.lag.ms", 0, "max.compaction.lag.ms = 0 is invalid: it must be at least 1"),
    ("max.compaction.lag.ms", 2**63, "64-bit"),
    ("delete.retention.ms", -1, "delete.retention.ms = -1 is invalid"),
])
def test_bad_values_raise_kraft_invalid_config_naming_the_key(key, value, message):
    with pytest.raises(InvalidConfigError, match=message):
        tc.validate_topic_configs({key: value})


def test_the_lag_rule_holds_among_overrides_and_with_the_cluster_defaults():
    with pytest.raises(InvalidConfigError, match=r"max.compaction.lag.ms = 5 is invalid: it "
                       r"must be at least min.compaction.lag.ms \(10\)"):
        tc.validate_topic_configs({"min.compaction.lag.ms": 10, "max.compaction.lag.ms": 5})
    defaults = tc.defaults_from_broker_config({"log.cleaner.min.compaction.lag.ms": 10})
    assert tc.validate_topic_configs({"max.compaction.lag.ms": 5}) == {
        "max.compaction.lag.ms": "5"}  # alone it is fine
    with pytest.raises(InvalidConfigError, match="combined with the cluster's defaults"):
        tc.validate_topic_configs({"max.compaction.lag.ms": 5}, defaults)
    assert tc.validate_topic_configs({"max.compaction.lag.ms": 5, "min.compaction.lag.ms": 0},
                                     defaults) == {"max.compaction.lag.ms": "5",
                                                   "min.compaction.lag.ms": "0"}


def test_validate_refuses_a_non_mapping():
    with pytest.raises(InvalidConfigError, match="must be a map"):
        tc.validate_topic_configs([("retention.ms", 1)])


def test_validated_configs_come_back_sorted():
    assert list(tc.validate_topic_configs({"segment.ms": 5, "flush.ms": 1, "cleanup.policy":
                                           "delete"})) == ["cleanup.policy", "flush.ms",
                                                           "segment.ms"]


def test_defaults_from_broker_config_map_kafka_broker_keys():
    defaults = tc.defaults_from_broker_config({
        "log.retention.hours": 2, "log.segment.bytes": "2048", "min.insync.replicas": 2,
        "unclean.leader.election.enable": True, "log.cleanup.policy": "delete,Compact",
        "log.cleaner.min.cleanable.ratio": 0.1, "log.cleaner.min.compaction.lag.ms": "1000",
        "log.cleaner.max.compaction.lag.ms": 5000, "log.cleaner.delete.retention.ms": 0,
        "node.id": 1, "listeners": "BROKER://:9092"})
    assert (defaults["cleanup.policy"], defaults["min.cleanable.dirty.ratio"],
            defaults["min.compaction.lag.ms"], defaults["max.compaction.lag.ms"],
            defaults["delete.retention.ms"]) == ("compact,delete", "0.1", "1000", "5000", "0")
    assert defaults["retention.ms"] == str(2 * 3_600_000)
    assert defaults["segment.bytes"] == "2048"
    assert defaults["min.insync.replicas"] == "2"
    assert defaults["unclean.leader.election.enable"] == "true"
    assert set(defaults) == tc.TOPIC_CONFIG_KEYS
    assert tc.defaults_from_broker_config({}) == tc.builtin_defaults()


@pytest.mark.parametrize("node_settings", [
    {"log.retention.ms": "never"}, {"min.insync.replicas": 0},
    {"log.cleanup.policy": "compress"}, {"unclean.leader.election.enable": "maybe"},
    {"log.cleaner.min.cleanable.ratio": 2}, {"log.cleaner.delete.retention.ms": -1},
    {"log.cleaner.min.compaction.lag.ms": 10, "log.cleaner.max.compaction.lag.ms": 9},
])
def test_bad_broker_defaults_raise_kraft_invalid_config(node_settings):
    with pytest.raises(InvalidConfigError):
        tc.defaults_from_broker_config(node_settings)


def test_unclean_election_enabled_reads_the_topic_override_first():
    image = MetadataImage()
    for offset, record in enumerate([
            rec.TopicRecord("on", "id-on"), rec.TopicRecord("off", "id-off"),
            rec.TopicRecord("plain", "id-plain"), rec.TopicRecord("garbled", "id-garbled"),
            rec.ConfigRecord("topic", "on", "unclean.leader.election.enable", "true"),
            rec.ConfigRecord("topic", "off", "unclean.leader.election.enable", "false"),
            rec.ConfigRecord("topic", "garbled", "unclean.leader.election.enable", "perhaps")]):
        image.apply(record, offset)
    for default in (False, True):
        assert tc.unclean_election_enabled(image, "on", default) is True
        assert tc.unclean_election_enabled(image, "off", default) is False
        assert tc.unclean_election_enabled(image, "plain", default) is default
        assert tc.unclean_election_enabled(image, "garbled", default) is default
        assert tc.unclean_election_enabled(image, "missing", default) is default


@pytest.mark.parametrize("value, shown", [
    ("abc", "'abc'"),
    pytest.param(10**5000, "an integer of 19 or more digits", id="5000-digit int"),
    ([1, 2], "a list of 2 items"), ({"a": 1}, "a map of 1 items"),
    ("x" * 100, "'" + "x" * 56 + "..."),
])
def test_printable_never_raises_and_stays_short(value, shown):
    assert tc.printable(value) == shown
