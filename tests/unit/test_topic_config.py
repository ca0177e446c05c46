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
    ("retention.ms", None, "a string, an integer or a boolean"),
    ("retention.ms", [1], "a string, an integer or a boolean"),
    ("segment.bytes", 10, "at least 1024"),
    ("min.insync.replicas", 0, "between 1 and"),
    ("min.insync.replicas", "two", "must be an integer"),
    ("unclean.leader.election.enable", 1, "true or false"),
    ("unclean.leader.election.enable", "yes", "true or false"),
    ("cleanup.policy", "compact", "compaction is not implemented"),
    ("cleanup.policy", "compact,delete", "compaction is not implemented"),
    ("cleanup.policy", "shred", "must be 'delete'"),
])
def test_bad_values_raise_kraft_invalid_config_naming_the_key(key, value, message):
    with pytest.raises(InvalidConfigError, match=message):
        tc.validate_topic_configs({key: value})


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
        "unclean.leader.election.enable": True, "log.cleanup.policy": "delete",
        "node.id": 1, "listeners": "BROKER://:9092"})
    assert defaults["retention.ms"] == str(2 * 3_600_000)
    assert defaults["segment.bytes"] == "2048"
    assert defaults["min.insync.replicas"] == "2"
    assert defaults["unclean.leader.election.enable"] == "true"
    assert set(defaults) == tc.TOPIC_CONFIG_KEYS
    assert tc.defaults_from_broker_config({}) == tc.builtin_defaults()


@pytest.mark.parametrize("node_settings", [
    {"log.retention.ms": "never"}, {"min.insync.replicas": 0},
    {"log.cleanup.policy": "compact"}, {"unclean.leader.election.enable": "maybe"},
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
