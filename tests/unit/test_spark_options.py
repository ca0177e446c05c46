"""The Spark source's option parsing (spark_source.options), without Spark.

Every rule of ``parse_options``: the bootstrap servers (either spelling,
agreeing), exactly one of subscribe/subscribePattern/assign and how each is
read, starting/ending offsets (names, JSON, timestamps, their precedence and
the batch/streaming restrictions), the assigned-partitions check, the
numeric and boolean options with their defaults, and the refusal of unknown
and unsupported options. Messages are checked for what a user needs (the
option's name, the reason), not word for word. Also ``include_headers``,
the checkpoint offset layout (``offsets_to_dict``/``offsets_from_dict``,
with the topic ids under their reserved key), ``minOffsetsPerTrigger``/
``maxTriggerDelay`` (Spark's duration strings) and
``Subscription.matches``/``describe``.
"""

from __future__ import annotations

import json

import pytest

from spark_source.options import (
    EARLIEST,
    LATEST,
    MAX_TRIGGER_DELAY_MS_DEFAULT,
    POLL_TIMEOUT_MS_DEFAULT,
    TOPIC_IDS_KEY,
    InvalidOptionError,
    OffsetSpec,
    Subscription,
    include_headers,
    offsets_from_dict,
    offsets_to_dict,
    parse_duration_ms,
    parse_options,
    topic_ids_from_dict,
)

SERVERS = "http://127.0.0.1:9092"


def opts(**extra: str) -> dict[str, str]:
    """Lower-cased keys, as Spark hands them over; a minimal valid base
    (bootstrap + subscribe) unless ``extra`` replaces it (None removes)."""
    base = {"kraftlog.bootstrap.servers": SERVERS, "subscribe": "orders"}
    base.update({k.lower(): v for k, v in extra.items()})
    return {k: v for k, v in base.items() if v is not None}


def assign(mapping: dict) -> dict[str, str]:
    return opts(subscribe=None, assign=json.dumps(mapping))


def batch(options: dict[str, str]):
    return parse_options(options, streaming=False)


def stream(options: dict[str, str]):
    return parse_options(options, streaming=True)


def refused(options: dict[str, str], *fragments: str, streaming: bool = False) -> str:
    with pytest.raises(InvalidOptionError) as info:
        parse_options(options, streaming=streaming)
    message = str(info.value)
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} not in {message!r}"
    return message


def offsets_json(table: dict[str, dict[str, object]]) -> str:
    return json.dumps(table)


# -- bootstrap ---------------------------------------------------------------


def test_bootstrap_is_required():
    refused(opts(**{"kraftlog.bootstrap.servers": None}), "kraftlog.bootstrap.servers")


def test_blank_bootstrap_counts_as_missing():
    refused(opts(**{"kraftlog.bootstrap.servers": "  "}), "kraftlog.bootstrap.servers")


def test_bootstrap_is_trimmed():
    assert batch(opts(**{"kraftlog.bootstrap.servers": f" {SERVERS} "})).bootstrap == SERVERS


def test_kafka_bootstrap_servers_is_accepted():
    parsed = batch(opts(**{"kraftlog.bootstrap.servers": None,
                           "kafka.bootstrap.servers": SERVERS}))
    assert parsed.bootstrap == SERVERS


def test_both_bootstrap_spellings_with_the_same_value_are_fine():
    parsed = batch(opts(**{"kafka.bootstrap.servers": f"{SERVERS} "}))
    assert parsed.bootstrap == SERVERS


def test_conflicting_bootstrap_spellings_are_refused():
    message = refused(opts(**{"kafka.bootstrap.servers": "http://other:9092"}),
                      "kraftlog.bootstrap.servers", "kafka.bootstrap.servers")
    assert SERVERS in message and "http://other:9092" in message


def test_bootstrap_spellings_of_one_list_agree_and_are_normalised():
    parsed = batch(opts(**{"kraftlog.bootstrap.servers": "h:9092, http://g:9093/",
                           "kafka.bootstrap.servers": "http://h:9092,g:9093"}))
    assert parsed.bootstrap == "http://h:9092,http://g:9093"


@pytest.mark.parametrize("value", [",", " , "])
def test_bootstrap_of_only_commas_counts_as_missing(value):
    refused(opts(**{"kraftlog.bootstrap.servers": value}), "kraftlog.bootstrap.servers")


# -- subscription ------------------------------------------------------------


def test_no_subscription_is_refused():
    message = refused(opts(subscribe=None), "subscribe", "subscribePattern", "assign")
    assert "none" in message


@pytest.mark.parametrize("extra", [
    {"subscribePattern": "o.*"},
    {"assign": '{"orders": [0]}'},
])
def test_two_subscriptions_are_refused(extra):
    message = refused(opts(**extra), "exactly one")
    given = next(iter(extra))
    assert f"got subscribe, {given}" in message


def test_pattern_and_assign_together_are_refused():
    refused(opts(subscribe=None, subscribePattern="o.*", assign='{"orders": [0]}'),
            "got subscribePattern, assign")


def test_subscribe_trims_and_dedupes_in_order():
    parsed = batch(opts(subscribe=" orders, clicks ,orders,,clicks "))
    assert parsed.subscription == Subscription(topics=("orders", "clicks"))


@pytest.mark.parametrize("value", ["", "  ", ",", " , ,"])
def test_subscribe_without_topics_is_refused(value):
    refused(opts(subscribe=value), "subscribe")


def test_subscribe_pattern_is_kept_verbatim_after_trim():
    parsed = batch(opts(subscribe=None, subscribePattern=" orders-.* "))
    assert parsed.subscription == Subscription(pattern="orders-.*")


def test_bad_regex_is_refused():
    refused(opts(subscribe=None, subscribePattern="orders-[0-9"), "subscribePattern",
            "orders-[0-9", "regular expression")


def test_empty_pattern_is_refused():
    refused(opts(subscribe=None, subscribePattern=" "), "subscribePattern")


def test_assign_is_sorted_and_deduplicated():
    parsed = batch(assign({"orders": [1, 0, 1], "clicks": [2]}))
    assert parsed.subscription == Subscription(
        partitions=(("clicks", 2), ("orders", 0), ("orders", 1)))


@pytest.mark.parametrize("value, fragment", [
    ('{"orders": [0]', "not valid JSON"),
    ("orders", "not valid JSON"),
    ('[["orders", 0]]', "JSON object"),
    ('"orders"', "JSON object"),
])
def test_malformed_assign_is_refused(value, fragment):
    refused(opts(subscribe=None, assign=value), "assign", fragment)


@pytest.mark.parametrize("numbers", [0, "0", {"0": 1}, [], [-1], [True], [0, 1.5], ["0"], None])
def test_assign_needs_lists_of_partition_numbers(numbers):
    refused(assign({"orders": numbers}), "assign", "'orders'", "list of partition numbers")


def test_assign_without_partitions_is_refused():
    refused(assign({}), "assign", "at least one partition")


# -- startingOffsets / endingOffsets -----------------------------------------


def test_batch_defaults_read_earliest_to_latest():
    parsed = batch(opts())
    assert parsed.starting == OffsetSpec("earliest")
    assert parsed.ending == OffsetSpec("latest")


def test_streaming_defaults_start_at_latest_and_have_no_end():
    parsed = stream(opts())
    assert parsed.starting == OffsetSpec("latest")
    assert parsed.ending is None


@pytest.mark.parametrize("value, kind", [
    ("earliest", "earliest"), (" LATEST ", "latest"), ("Earliest", "earliest")])
def test_streaming_starting_names_are_case_insensitive(value, kind):
    assert stream(opts(startingOffsets=value)).starting == OffsetSpec(kind)


def test_starting_offsets_json_with_special_values():
    value = offsets_json({"orders": {"0": 23, "1": -2}, "clicks": {"0": -1}})
    parsed = stream(opts(startingOffsets=value))
    assert parsed.starting == OffsetSpec("offsets", offsets={
        ("orders", 0): 23, ("orders", 1): EARLIEST, ("clicks", 0): LATEST})


def test_batch_json_start_and_end():
    parsed = batch(opts(startingOffsets=offsets_json({"orders": {"0": -2, "1": 5}}),
                        endingOffsets=offsets_json({"orders": {"0": 10, "1": -1}})))
    assert parsed.starting.offsets == {("orders", 0): EARLIEST, ("orders", 1): 5}
    assert parsed.ending == OffsetSpec("offsets", offsets={("orders", 0): 10,
                                                           ("orders", 1): LATEST})


def test_batch_refuses_starting_latest():
    refused(opts(startingOffsets="latest"), "startingOffsets", "latest", "batch")


def test_batch_refuses_starting_json_latest():
    refused(opts(startingOffsets=offsets_json({"orders": {"0": 3, "1": -1}})),
            "startingOffsets", "batch")


def test_batch_refuses_ending_earliest():
    refused(opts(endingOffsets="EARLIEST"), "endingOffsets", "earliest", "batch")


def test_batch_refuses_ending_json_earliest():
    refused(opts(endingOffsets=offsets_json({"orders": {"0": -2}})), "endingOffsets")


@pytest.mark.parametrize("key", ["endingOffsets", "endingTimestamp", "endingOffsetsByTimestamp"])
def test_streaming_refuses_ending_options(key):
    value = {"endingOffsets": "latest", "endingTimestamp": "1000",
             "endingOffsetsByTimestamp": offsets_json({"orders": {"0": 1000}})}[key]
    message = refused(opts(**{key: value}), key, "batch", streaming=True)
    assert "AvailableNow" in message


def test_streaming_names_every_ending_option_given():
    refused(opts(endingOffsets="latest", endingTimestamp="5"),
            "endingOffsets", "endingTimestamp", streaming=True)


@pytest.mark.parametrize("value", ["first", "0", "-2", "[1]", "orders:0:5"])
def test_offsets_that_are_neither_a_name_nor_json_are_refused(value):
    refused(opts(startingOffsets=value), "startingOffsets", "earliest, latest, or JSON")


def test_malformed_offsets_json_is_refused():
    refused(opts(startingOffsets='{"orders": {"0": 1}'), "startingOffsets", "not valid JSON")


@pytest.mark.parametrize("per_partition", [5, [5], {}, "0"])
def test_offsets_per_topic_must_be_a_non_empty_object(per_partition):
    refused(opts(startingOffsets=offsets_json({"orders": per_partition})),
            "startingOffsets", "'orders'")


@pytest.mark.parametrize("partition", ["x", "-1", "0.5", " 1", ""])
def test_non_digit_partition_keys_are_refused(partition):
    refused(opts(startingOffsets=offsets_json({"orders": {partition: 1}})),
            "startingOffsets", "partition", "not a partition number")


@pytest.mark.parametrize("offset", [1.5, "5", None, True, False, [1]])
def test_non_integer_offsets_are_refused(offset):
    refused(opts(endingOffsets=offsets_json({"orders": {"0": offset}})),
            "endingOffsets", "orders-0", "integer")


@pytest.mark.parametrize("offset", [-3, -100])
def test_offsets_below_minus_two_are_refused(offset):
    refused(opts(startingOffsets=offsets_json({"orders": {"0": offset}})),
            "startingOffsets", str(offset), "orders-0")


def test_offset_zero_is_a_real_offset():
    parsed = batch(opts(startingOffsets=offsets_json({"orders": {"0": 0}})))
    assert parsed.starting.offsets == {("orders", 0): 0}


# -- timestamps and their precedence -----------------------------------------


def test_starting_timestamp():
    parsed = stream(opts(startingTimestamp=" 1700000000000 "))
    assert parsed.starting == OffsetSpec("timestamp", timestamp=1_700_000_000_000)


def test_ending_timestamp_in_batch():
    parsed = batch(opts(endingTimestamp="0"))
    assert parsed.ending == OffsetSpec("timestamp", timestamp=0)


def test_offsets_by_timestamp():
    parsed = batch(opts(startingOffsetsByTimestamp=offsets_json({"orders": {"0": 5, "1": 6}}),
                        endingOffsetsByTimestamp=offsets_json({"orders": {"0": 9}})))
    assert parsed.starting == OffsetSpec("timestamps", offsets={("orders", 0): 5,
                                                                ("orders", 1): 6})
    assert parsed.ending == OffsetSpec("timestamps", offsets={("orders", 0): 9})


def test_starting_timestamp_wins_over_the_rest():
    parsed = stream(opts(startingTimestamp="100",
                         startingOffsetsByTimestamp=offsets_json({"orders": {"0": 5}}),
                         startingOffsets="earliest"))
    assert parsed.starting == OffsetSpec("timestamp", timestamp=100)


def test_offsets_by_timestamp_wins_over_offsets():
    parsed = stream(opts(startingOffsetsByTimestamp=offsets_json({"orders": {"0": 5}}),
                         startingOffsets="earliest"))
    assert parsed.starting.kind == "timestamps"


def test_ending_precedence_is_the_same():
    parsed = batch(opts(endingTimestamp="7",
                        endingOffsetsByTimestamp=offsets_json({"orders": {"0": 5}}),
                        endingOffsets="latest"))
    assert parsed.ending == OffsetSpec("timestamp", timestamp=7)
    parsed = batch(opts(endingOffsetsByTimestamp=offsets_json({"orders": {"0": 5}}),
                        endingOffsets="latest"))
    assert parsed.ending.kind == "timestamps"


def test_overridden_starting_offsets_are_not_checked_for_batch():
    """startingOffsets=latest would be refused in a batch query, but a
    startingTimestamp takes precedence, so it is never used."""
    parsed = batch(opts(startingTimestamp="100", startingOffsets="latest"))
    assert parsed.starting.kind == "timestamp"


@pytest.mark.parametrize("key", ["startingTimestamp", "endingTimestamp"])
@pytest.mark.parametrize("value, fragment", [("-1", ">= 0"), ("soon", "integer"),
                                             ("1.5", "integer"), ("", "integer")])
def test_bad_timestamps_are_refused(key, value, fragment):
    refused(opts(**{key: value}), key, fragment)


@pytest.mark.parametrize("key", ["startingOffsetsByTimestamp", "endingOffsetsByTimestamp"])
def test_negative_timestamps_per_partition_are_refused(key):
    refused(opts(**{key: offsets_json({"orders": {"0": 5, "1": -1}})}), key, "orders-1",
            ">= 0")


@pytest.mark.parametrize("value", [offsets_json({"orders": {"0": 1.5}}),
                                   offsets_json({"orders": {"x": 1}}), "[]", "{"])
def test_malformed_offsets_by_timestamp_are_refused(value):
    refused(opts(startingOffsetsByTimestamp=value), "startingOffsetsByTimestamp")


# -- offsets with assign -----------------------------------------------------


def test_assign_with_offsets_for_exactly_its_partitions():
    options = assign({"orders": [0, 1]})
    options["startingoffsets"] = offsets_json({"orders": {"1": 4, "0": -2}})
    options["endingoffsets"] = offsets_json({"orders": {"0": 9, "1": -1}})
    parsed = batch(options)
    assert parsed.starting.offsets == {("orders", 0): EARLIEST, ("orders", 1): 4}
    assert parsed.ending.offsets == {("orders", 0): 9, ("orders", 1): LATEST}


def test_assign_with_named_offsets_needs_no_table():
    parsed = batch(assign({"orders": [0, 1]}) | {"startingoffsets": "earliest"})
    assert parsed.starting == OffsetSpec("earliest")


def test_assign_starting_offsets_missing_a_partition():
    options = assign({"orders": [0, 1]}) | {
        "startingoffsets": offsets_json({"orders": {"0": 4}})}
    message = refused(options, "startingOffsets", "missing orders-1")
    assert "not assigned" not in message


def test_assign_ending_offsets_with_an_extra_partition():
    options = assign({"orders": [0]}) | {
        "endingoffsets": offsets_json({"orders": {"0": 4}, "clicks": {"0": 1}})}
    message = refused(options, "endingOffsets", "not assigned clicks-0")
    assert "missing" not in message


def test_assign_offsets_both_missing_and_extra():
    options = assign({"orders": [0, 1]}) | {
        "startingoffsets": offsets_json({"orders": {"0": 4, "2": 1}})}
    refused(options, "startingOffsets", "missing orders-1", "not assigned orders-2",
            streaming=True)


def test_subscribe_offsets_need_not_name_every_partition():
    parsed = stream(opts(startingOffsets=offsets_json({"orders": {"3": 4}})))
    assert parsed.starting.offsets == {("orders", 3): 4}


def test_assign_offsets_by_timestamp_mismatch_names_the_option_given():
    options = assign({"orders": [0]}) | {
        "startingoffsetsbytimestamp": offsets_json({"orders": {"1": 5}})}
    refused(options, "startingOffsetsByTimestamp")


# -- startingOffsetsByTimestampStrategy --------------------------------------


def test_timestamp_strategy_defaults_to_error():
    assert batch(opts()).timestamp_strategy == "error"


@pytest.mark.parametrize("value, expected", [("error", "error"), ("LATEST", "latest"),
                                             (" Latest ", "latest")])
def test_timestamp_strategy_values(value, expected):
    parsed = stream(opts(startingOffsetsByTimestampStrategy=value))
    assert parsed.timestamp_strategy == expected


@pytest.mark.parametrize("value", ["earliest", "", "none"])
def test_bad_timestamp_strategy_is_refused(value):
    refused(opts(startingOffsetsByTimestampStrategy=value),
            "startingOffsetsByTimestampStrategy", "'error' or 'latest'")


# -- numbers and booleans ----------------------------------------------------


def test_numeric_defaults():
    parsed = stream(opts())
    assert parsed.max_offsets_per_trigger is None
    assert parsed.min_partitions is None
    assert parsed.max_records_per_partition is None
    assert parsed.poll_timeout_ms == POLL_TIMEOUT_MS_DEFAULT == 120_000
    assert parsed.fetch_offset_retries == 3
    assert parsed.fetch_offset_retry_interval_ms == 1000
    assert parsed.min_offsets_per_trigger is None
    assert parsed.max_trigger_delay_ms == MAX_TRIGGER_DELAY_MS_DEFAULT == 15 * 60 * 1000


POSITIVE = [("maxOffsetsPerTrigger", "max_offsets_per_trigger"),
            ("minOffsetsPerTrigger", "min_offsets_per_trigger"),
            ("minPartitions", "min_partitions"),
            ("maxRecordsPerPartition", "max_records_per_partition"),
            ("kafkaConsumer.pollTimeoutMs", "poll_timeout_ms")]


@pytest.mark.parametrize("key, field", POSITIVE)
def test_positive_ints_are_parsed(key, field):
    assert getattr(stream(opts(**{key: " 17 "})), field) == 17
    assert getattr(stream(opts(**{key: "1"})), field) == 1


@pytest.mark.parametrize("key, field", POSITIVE)
@pytest.mark.parametrize("value, fragment", [("0", ">= 1"), ("-5", ">= 1"),
                                             ("ten", "integer"), ("1.5", "integer"),
                                             ("", "integer")])
def test_positive_ints_refuse_the_rest(key, field, value, fragment):
    refused(opts(**{key: value}), key, fragment, streaming=True)


# -- minOffsetsPerTrigger and maxTriggerDelay ---------------------------------


@pytest.mark.parametrize("value, expected_ms", [
    ("15m", 900_000), ("30s", 30_000), ("500ms", 500), ("2h", 7_200_000), ("1d", 86_400_000),
    ("3min", 180_000), ("250", 250), (" 10S ", 10_000), ("1500us", 1), ("007s", 7_000)])
def test_durations_are_spark_time_strings(value, expected_ms):
    assert parse_duration_ms("maxTriggerDelay", value) == expected_ms
    parsed = stream(opts(minOffsetsPerTrigger="10", maxTriggerDelay=value))
    assert parsed.max_trigger_delay_ms == expected_ms


@pytest.mark.parametrize("value", ["", "m", "15 m", "1.5s", "-5s", "15x", "15mins", "ten",
                                   "s15", "1e3"])
def test_bad_durations_are_refused(value):
    refused(opts(minOffsetsPerTrigger="10", maxTriggerDelay=value), "maxTriggerDelay",
            "duration", "15m", streaming=True)


@pytest.mark.parametrize("value", ["0", "0s", "0ms", "999us"])
def test_durations_below_one_ms_are_refused(value):
    refused(opts(minOffsetsPerTrigger="10", maxTriggerDelay=value), "maxTriggerDelay",
            "at least 1ms", "remove minOffsetsPerTrigger", streaming=True)


def test_min_and_max_offsets_together():
    parsed = stream(opts(minOffsetsPerTrigger="100", maxOffsetsPerTrigger="100",
                         maxTriggerDelay="1m"))
    assert (parsed.min_offsets_per_trigger, parsed.max_offsets_per_trigger) == (100, 100)
    assert parsed.max_trigger_delay_ms == 60_000
    refused(opts(minOffsetsPerTrigger="101", maxOffsetsPerTrigger="100"),
            "minOffsetsPerTrigger (101)", "maxOffsetsPerTrigger (100)", streaming=True)


def test_max_trigger_delay_alone_is_accepted_but_still_checked():
    # As in Spark: it only matters with minOffsetsPerTrigger, but a bad
    # value fails the query even without it.
    parsed = stream(opts(maxTriggerDelay="5s"))
    assert parsed.min_offsets_per_trigger is None and parsed.max_trigger_delay_ms == 5000
    refused(opts(maxTriggerDelay="soon"), "maxTriggerDelay", streaming=True)


def test_trigger_options_are_accepted_and_unused_in_batch():
    parsed = batch(opts(minOffsetsPerTrigger="5", maxTriggerDelay="1s"))
    assert parsed.min_offsets_per_trigger == 5 and parsed.max_trigger_delay_ms == 1000


@pytest.mark.parametrize("key, field", [("fetchOffset.numRetries", "fetch_offset_retries"),
                                        ("fetchOffset.retryIntervalMs",
                                         "fetch_offset_retry_interval_ms")])
def test_fetch_offset_settings_allow_zero(key, field):
    assert getattr(batch(opts(**{key: "0"})), field) == 0
    assert getattr(batch(opts(**{key: "25"})), field) == 25
    refused(opts(**{key: "-1"}), key, ">= 0")
    refused(opts(**{key: "many"}), key, "integer")


def test_boolean_defaults():
    parsed = batch(opts())
    assert parsed.fail_on_data_loss is True
    assert parsed.include_headers is False


@pytest.mark.parametrize("key, field", [("failOnDataLoss", "fail_on_data_loss"),
                                        ("includeHeaders", "include_headers")])
@pytest.mark.parametrize("value, expected", [("true", True), ("TRUE", True), (" True ", True),
                                             ("false", False), ("False", False)])
def test_booleans_are_case_insensitive(key, field, value, expected):
    assert getattr(batch(opts(**{key: value})), field) is expected


@pytest.mark.parametrize("key", ["failOnDataLoss", "includeHeaders"])
@pytest.mark.parametrize("value", ["yes", "1", "0", "", "t"])
def test_booleans_refuse_the_rest(key, value):
    refused(opts(**{key: value}), key, "true or false")


def test_include_headers_alone():
    assert include_headers({}) is False
    assert include_headers({"includeheaders": "TRUE"}) is True
    assert include_headers({"IncludeHeaders": "true"}) is True
    assert include_headers({"includeHeaders": "false", "subscribe": "x"}) is False
    with pytest.raises(InvalidOptionError, match="includeHeaders"):
        include_headers({"includeheaders": "on"})


# -- unknown and unsupported options -----------------------------------------


def test_unknown_options_are_named():
    message = refused(opts(startingOffset="earliest", colour="blue"),
                      "startingoffset", "colour", "Supported:")
    assert "kafka client" not in message.lower()
    assert message.index("colour") < message.index("startingoffset")  # sorted


def test_kafka_client_properties_get_a_hint():
    message = refused(opts(**{"kafka.max.poll.records": "5"}),
                      "kafka.max.poll.records", "not a Kafka client")
    assert "Kafka client properties (kafka.max.poll.records)" in message


def test_unknown_options_are_refused_in_streaming_too():
    refused(opts(maxFilesPerTrigger="5"), "maxfilespertrigger", streaming=True)


@pytest.mark.parametrize("key, fragment", [
    ("groupIdPrefix", "groupIdPrefix"),
    ("kafka.group.id", "kafka.group.id"),
    ("path", "subscribe"),
])
def test_unsupported_kafka_options_say_why(key, fragment):
    message = refused(opts(**{key: "x"}), fragment, "remove" if key != "path" else "path")
    assert "unknown option" not in message


def test_consumer_group_options_explain_the_checkpoint():
    refused(opts(groupIdPrefix="app"), "consumer groups", "checkpoint")
    refused(opts(**{"kafka.group.id": "app"}), "consumer groups", "checkpoint")


def test_mixed_case_keys_work():
    parsed = parse_options({"KRAFTLOG.BOOTSTRAP.SERVERS": SERVERS,
                            "SubscribePattern": "orders.*",
                            "startingOffsets": "Earliest",
                            "ENDINGOFFSETS": "latest",
                            "maxRecordsPerPartition": "10",
                            "FailOnDataLoss": "false",
                            "kafkaConsumer.pollTimeoutMs": "500"}, streaming=False)
    assert parsed.bootstrap == SERVERS
    assert parsed.subscription.pattern == "orders.*"
    assert parsed.starting.kind == "earliest"
    assert parsed.ending.kind == "latest"
    assert parsed.max_records_per_partition == 10
    assert parsed.fail_on_data_loss is False
    assert parsed.poll_timeout_ms == 500


def test_mixed_case_keys_are_refused_under_their_own_name():
    refused({"kraftlog.bootstrap.servers": SERVERS, "subscribe": "x", "MinPartitions": "0"},
            "minPartitions", streaming=True)
    refused({"kraftlog.bootstrap.servers": SERVERS, "subscribe": "x",
             "GroupIdPrefix": "a"}, "groupIdPrefix")


def test_non_string_values_are_read_as_strings():
    parsed = parse_options({"kraftlog.bootstrap.servers": SERVERS, "subscribe": "x",
                            "maxoffsetspertrigger": 5, "failondataloss": False},
                           streaming=True)
    assert parsed.max_offsets_per_trigger == 5
    assert parsed.fail_on_data_loss is False


def test_unicode_digit_partition_key_is_refused_as_an_option_error():
    with pytest.raises(ValueError) as info:
        batch(opts(startingOffsets=offsets_json({"orders": {"²": 1}})))
    assert isinstance(info.value, InvalidOptionError), repr(info.value)


# -- offsets in the checkpoint -----------------------------------------------


def test_offsets_to_dict_nests_by_topic_with_string_partitions():
    offsets = {("orders", 1): 5, ("orders", 0): 23, ("clicks", 10): -1}
    nested = offsets_to_dict(offsets)
    assert nested == {"clicks": {"10": -1}, "orders": {"0": 23, "1": 5}}
    assert list(nested) == ["clicks", "orders"]
    assert list(nested["orders"]) == ["0", "1"]


def test_offsets_round_trip_through_json():
    offsets = {("orders", 0): 23, ("orders", 7): 0, ("a.b-c", 3): 2**40}
    assert offsets_from_dict(json.loads(json.dumps(offsets_to_dict(offsets)))) == offsets
    assert offsets_from_dict(offsets_to_dict({})) == {}


@pytest.mark.parametrize("nested", [
    [], "orders", 5, None,
    {"orders": 5}, {"orders": [1]},
    {"orders": {"x": 1}}, {"orders": {"-1": 1}},
    {"orders": {"0": "5"}}, {"orders": {"0": 1.5}}, {"orders": {"0": None}},
])
def test_offsets_from_dict_refuses_other_shapes(nested):
    with pytest.raises(ValueError):
        offsets_from_dict(nested)


def test_topic_ids_go_last_under_the_reserved_key():
    offsets = {("orders", 1): 5, ("clicks", 0): 2}
    nested = offsets_to_dict(offsets, {"orders": "id-o", "clicks": "id-c", "other": "id-x"})
    assert list(nested) == ["clicks", "orders", TOPIC_IDS_KEY]
    # Only topics of the offset; per-partition offsets keep the Kafka layout.
    assert nested[TOPIC_IDS_KEY] == {"clicks": "id-c", "orders": "id-o"}
    assert nested["orders"] == {"1": 5}
    text = json.dumps(nested)
    assert json.dumps(offsets_to_dict(offsets, {"clicks": "id-c", "orders": "id-o"})) == text
    assert offsets_from_dict(json.loads(text)) == offsets
    assert topic_ids_from_dict(json.loads(text)) == {"clicks": "id-c", "orders": "id-o"}


def test_topic_ids_are_left_out_when_unknown():
    assert offsets_to_dict({("orders", 0): 1}, {}) == {"orders": {"0": 1}}
    assert offsets_to_dict({("orders", 0): 1}, {"orders": None}) == {"orders": {"0": 1}}
    assert offsets_to_dict({}, {"orders": "id"}) == {}


def test_an_offset_without_ids_reads_as_before():
    # What a checkpoint written before topic ids were kept holds.
    old = json.loads('{"orders": {"0": 23, "1": 5}}')
    assert offsets_from_dict(old) == {("orders", 0): 23, ("orders", 1): 5}
    assert topic_ids_from_dict(old) == {}


def test_the_reserved_key_cannot_be_a_topic_name():
    from storage.errors import InvalidTopicError
    from storage.names import validate_topic_name
    with pytest.raises(InvalidTopicError):
        validate_topic_name(TOPIC_IDS_KEY)


@pytest.mark.parametrize("ids", [[], "id", {"orders": 5}, {"orders": ""}, {"orders": None}])
def test_malformed_topic_ids_are_refused(ids):
    nested = {"orders": {"0": 1}, TOPIC_IDS_KEY: ids}
    with pytest.raises(ValueError, match="topic names to ids"):
        offsets_from_dict(nested)
    with pytest.raises(ValueError):
        topic_ids_from_dict(nested)


# -- Subscription ------------------------------------------------------------


def test_subscribe_matches_exactly_the_topics():
    sub = Subscription(topics=("orders", "__internal"))
    assert sub.matches("orders") and sub.matches("__internal")
    assert not sub.matches("order") and not sub.matches("orders2")


def test_pattern_must_match_the_whole_name():
    sub = Subscription(pattern="ord.*s")
    assert sub.matches("orders") and sub.matches("ords")
    assert not sub.matches("orders-eu") and not sub.matches("xorders")
    assert not Subscription(pattern="ord").matches("orders")


def test_pattern_excludes_internal_topics():
    sub = Subscription(pattern=".*")
    assert sub.matches("orders") and sub.matches("_single")
    assert not sub.matches("__consumer_offsets")
    assert not Subscription(pattern="__.*").matches("__x")


def test_assign_matches_the_topics_of_its_partitions():
    sub = Subscription(partitions=(("orders", 1), ("clicks", 0)))
    assert sub.matches("orders") and sub.matches("clicks")
    assert not sub.matches("views")


def test_describe():
    assert Subscription(topics=("a", "b")).describe() == "subscribe=a,b"
    assert Subscription(pattern="a.*").describe() == "subscribePattern=a.*"
    described = Subscription(partitions=(("b", 0), ("a", 1), ("a", 0))).describe()
    assert described.startswith("assign=")
    assert json.loads(described.removeprefix("assign=")) == {"a": [1, 0], "b": [0]}
    parsed = batch(assign({"b": [0], "a": [1, 0]})).subscription.describe()
    assert parsed == 'assign={"a": [0, 1], "b": [0]}'


# -- TLS ----------------------------------------------------------------------

def test_kafkas_tls_properties_become_the_clients_settings():
    parsed = batch(opts(**{"kraftlog.bootstrap.servers": "h:9092,g:9093",
                           "kafka.security.protocol": "ssl",
                           "kafka.ssl.truststore.type": "PEM",
                           "kafka.ssl.truststore.location": "/certs/ca.pem",
                           "kafka.ssl.keystore.location": "/certs/client.pem",
                           "kafka.ssl.endpoint.identification.algorithm": ""}))
    assert parsed.bootstrap == "https://h:9092,https://g:9093"
    assert parsed.security == {"security_protocol": "SSL", "ssl_cafile": "/certs/ca.pem",
                               "ssl_certfile": "/certs/client.pem",
                               "ssl_check_hostname": False}
    assert batch(opts()).security == {}


@pytest.mark.parametrize("extra, fragment", [
    ({"kafka.security.protocol": "SASL_PLAINTEXT"}, "password in clear"),
    ({"kafka.security.protocol": "SASL_SSL"}, "needs kafka.sasl.jaas.config"),
    ({"kafka.sasl.jaas.config": "x"}, "needs kafka.security.protocol=SASL_SSL"),
    ({"kafka.security.protocol": "TLS"}, "PLAINTEXT, SSL or SASL_SSL"),
    ({"kafka.ssl.truststore.type": "JKS"}, "must be PEM, not JKS"),
    ({"kafka.ssl.keystore.type": "PKCS12"}, "must be PEM, not PKCS12"),
    ({"kafka.ssl.endpoint.identification.algorithm": "dns"}, "https or empty"),
])
def test_tls_properties_it_cannot_use_are_refused(extra, fragment):
    refused(opts(**extra), fragment)


def test_the_sink_takes_the_same_tls_properties():
    from spark_source.sink_options import parse_sink_options
    parsed = parse_sink_options({"kafka.bootstrap.servers": "h:9092", "topic": "t",
                                 "kafka.security.protocol": "SSL",
                                 "kafka.ssl.truststore.location": "/certs/ca.pem"})
    assert parsed.bootstrap == "https://h:9092"
    assert parsed.security == {"security_protocol": "SSL", "ssl_cafile": "/certs/ca.pem"}


def test_a_scram_user_comes_from_kafkas_jaas_config():
    parsed = batch(opts(**{
        "kafka.security.protocol": "SASL_SSL", "kafka.sasl.mechanism": "SCRAM-SHA-512",
        "kafka.ssl.truststore.location": "/certs/ca.pem",
        "kafka.sasl.jaas.config": 'org.apache.kafka.common.security.scram.ScramLoginModule '
                                  'required username="etl" password="p\\"w";'}))
    assert parsed.security == {"security_protocol": "SASL_SSL", "ssl_cafile": "/certs/ca.pem",
                               "sasl_plain_username": "etl", "sasl_plain_password": 'p"w',
                               "sasl_mechanism": "SCRAM-SHA-512"}
    assert 'p"w' not in repr(parsed)
    assert parsed.bootstrap.startswith("https://")
