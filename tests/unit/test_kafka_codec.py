"""Kafka's protocol pieces, checked against an independent implementation
(kafka-python's codec and record batches) and against bad input: the
generated schemas' codec, RecordBatch v2 <-> kraftlog batches, CRC-32C."""

from __future__ import annotations

import random
import struct

import pytest
from kafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder

from protocol.kafka import codec, messages
from protocol.kafka.records import kafka_to_native, native_to_kafka
from storage import sections
from storage.batch import (BatchBuilder, ControlType, CorruptRecordError,
                           UnsupportedCompressionTypeError, build_control_batch, decode_batches)


def test_crc32c_matches_the_published_check_values_in_c_and_in_python():
    for accelerated in (True, False):
        saved = sections._c
        if not accelerated:
            sections._c = None
        try:
            assert sections.crc32c(b"123456789") == 0xE3069283  # RFC 3720's check value
            assert sections.crc32c(bytes(32)) == 0x8A9136AA
            assert sections.crc32c(b"456789", sections.crc32c(b"123")) == 0xE3069283
        finally:
            sections._c = saved
    data = random.Random(1).randbytes(10_001)
    assert sections.crc32c(data) == sections.crc32c(data[7:], sections.crc32c(data[:7]))


def kafka_batch(records, *, compression=0, producer=(-1, -1, -1), transactional=False,
                base_offset=0) -> bytes:
    builder = DefaultRecordBatchBuilder(2, compression, transactional, *producer,
                                        batch_size=1 << 20)
    for i, (key, value, headers, timestamp) in enumerate(records):
        builder.append(base_offset + i, timestamp=timestamp, key=key, value=value,
                       headers=headers)
    return bytes(builder.build())


RECORDS = [(b"k0", b"v0", [("h", b"x"), ("empty", None)], 1_000),
           (None, b"no key", [], 1_005),
           (b"k2", None, [], 999),  # a tombstone, older than the first
           (b"", b"\x00" * 3000, [("bin", bytes(range(256)))], 2_000)]


@pytest.mark.parametrize("compression", [0, 1])  # none, gzip
def test_a_kafka_batch_becomes_a_kraftlog_batch_with_the_same_records(compression):
    batch = kafka_batch(RECORDS, compression=compression, producer=(7, 1, 40))
    native = kafka_to_native(batch)
    decoded = list(decode_batches(native))
    assert [(r.offset, r.timestamp, r.key, r.value, [list(h) for h in r.headers])
            for r in decoded] == [(i, ts, k, v, [list(h) for h in hs])
                                  for i, (k, v, hs, ts) in enumerate(RECORDS)]
    # Same header fields (producer id, epoch, sequence), stored uncompressed.
    again = DefaultRecordBatch(native_to_kafka(native))
    assert (again.producer_id, again.producer_epoch, again.base_sequence) == (7, 1, 40)
    assert again.compression_type == 0 and again.validate_crc()
    assert [(r.offset, r.timestamp, r.key, r.value, r.headers) for r in again] == [
        (i, ts, k, v, hs) for i, (k, v, hs, ts) in enumerate(RECORDS)]


def test_an_uncompressed_kafka_batch_survives_both_conversions_byte_for_byte():
    batch = kafka_batch(RECORDS)
    assert native_to_kafka(kafka_to_native(batch)) == batch


def test_kraftlog_batches_and_markers_read_as_kafka_batches():
    builder = BatchBuilder(producer_id=9, producer_epoch=2, base_sequence=0, transactional=True)
    builder.append(b"k", b"v", timestamp_ms=5, headers=[("a", b"b")])
    marker = build_control_batch(ControlType.COMMIT, 9, 2, 3, 6)
    out = native_to_kafka(builder.build() + marker + builder.build()[:30])  # a partial tail
    first_size = struct.unpack_from(">i", out, 8)[0] + 12
    first, second = DefaultRecordBatch(out[:first_size]), DefaultRecordBatch(out[first_size:])
    assert first.validate_crc() and first.is_transactional and not first.is_control_batch
    assert [(r.key, r.value, r.headers) for r in first] == [(b"k", b"v", [("a", b"b")])]
    assert second.validate_crc() and second.is_control_batch
    assert len(out) == first_size + len(bytes(second._buffer))  # the partial tail left out


def test_bad_kafka_batches_are_refused_with_kafkas_error_names():
    good = bytearray(kafka_batch(RECORDS))
    corrupt = bytearray(good)
    corrupt[-1] ^= 0xFF
    with pytest.raises(CorruptRecordError, match="CRC-32C"):
        kafka_to_native(bytes(corrupt))
    old_magic = bytearray(good)
    old_magic[16] = 1
    with pytest.raises(CorruptRecordError, match="magic 1"):
        kafka_to_native(bytes(old_magic))
    with pytest.raises(CorruptRecordError):
        kafka_to_native(bytes(good[:-5]))  # truncated
    snappy = bytearray(good)
    struct.pack_into(">h", snappy, 21, 2)
    struct.pack_into(">I", snappy, 17, sections.crc32c(bytes(snappy[21:])))
    with pytest.raises(UnsupportedCompressionTypeError, match="snappy") as caught:
        kafka_to_native(bytes(snappy))
    assert caught.value.code == "UNSUPPORTED_COMPRESSION_TYPE"
    # A count that promises more records than the batch holds.
    short = bytearray(good)
    struct.pack_into(">i", short, 57, 5)
    struct.pack_into(">I", short, 17, sections.crc32c(bytes(short[21:])))
    with pytest.raises(CorruptRecordError):
        kafka_to_native(bytes(short))


def test_random_damage_to_a_kafka_batch_never_escapes_as_anything_but_a_record_error():
    rng = random.Random(7)
    good = kafka_batch(RECORDS)
    body = bytearray(good)
    for _ in range(2000):
        damaged = bytearray(body)
        for _ in range(rng.randint(1, 4)):
            damaged[rng.randrange(61, len(damaged))] = rng.randrange(256)
        # With the checksum fixed up, the records themselves are parsed.
        struct.pack_into(">I", damaged, 17, sections.crc32c(bytes(damaged[21:])))
        try:
            kafka_to_native(bytes(damaged))
        except CorruptRecordError:
            pass


# -- the codec, against kafka-python's ----------------------------------------------------
def _ours(api_key: int, version: int, values: dict, kind: int = 0) -> bytes:
    return bytes(codec.encode(messages.APIS[api_key][kind], version, values))


@pytest.mark.parametrize("version", [1, 4, 8, 9, 10, 12])
def test_metadata_requests_encode_as_kafka_python_encodes_them(version):
    from kafka.protocol.metadata import MetadataRequest
    theirs = MetadataRequest(version=version, topics=[
        MetadataRequest.MetadataRequestTopic(name="orders", version=version)],
        allow_auto_topic_creation=False, include_topic_authorized_operations=False)
    ours = _ours(3, version, {"Topics": [{"Name": "orders"}],
                              "AllowAutoTopicCreation": False})
    assert ours == bytes(theirs.encode())
    decoded, end = codec.decode(messages.MetadataRequest, version, ours)
    assert end == len(ours) and decoded["Topics"][0]["Name"] == "orders"


@pytest.mark.parametrize("version", [4, 9, 12])
def test_api_versions_and_fetch_responses_round_trip_with_tagged_fields(version):
    response = {"ThrottleTimeMs": 5, "ErrorCode": 0, "SessionId": 0, "Responses": [
        {"Topic": "t", "Partitions": [{
            "PartitionIndex": 1, "ErrorCode": 0, "HighWatermark": 10, "LastStableOffset": 9,
            "LogStartOffset": 0, "AbortedTransactions": [{"ProducerId": 4, "FirstOffset": 2}],
            "PreferredReadReplica": -1, "Records": b"\x01\x02",
            # Tagged in flexible versions: written only when not the default.
            "CurrentLeader": {"LeaderId": 3, "LeaderEpoch": 7}}]}]}
    encoded = codec.encode(messages.FetchResponse, version, response)
    decoded, end = codec.decode(messages.FetchResponse, version, bytes(encoded))
    assert end == len(encoded)
    partition = decoded["Responses"][0]["Partitions"][0]
    assert partition["Records"] == b"\x01\x02" and partition["HighWatermark"] == 10
    assert partition["AbortedTransactions"] == [{"ProducerId": 4, "FirstOffset": 2}]
    if version >= 12:
        assert partition["CurrentLeader"] == {"LeaderId": 3, "LeaderEpoch": 7}
    from kafka.protocol.consumer import FetchResponse
    theirs = FetchResponse.decode(bytes(encoded), version=version)
    assert theirs.responses[0].partitions[0].high_watermark == 10


def test_truncated_or_random_frames_raise_only_decode_errors():
    rng = random.Random(3)
    frame = _ours(3, 12, {"Topics": [{"Name": "orders"}, {"Name": "x" * 300}]})
    for cut in range(len(frame)):
        with pytest.raises(codec.KafkaDecodeError):
            codec.decode(messages.MetadataRequest, 12, frame[:cut])
    for _ in range(3000):
        junk = rng.randbytes(rng.randrange(0, 64))
        for schema, version in ((messages.ProduceRequest, 9), (messages.FetchRequest, 12),
                                (messages.MetadataRequest, 1), (messages.RequestHeader, 2)):
            try:
                codec.decode(schema, version, junk)
            except codec.KafkaDecodeError:
                pass


def test_a_huge_length_or_count_is_refused_before_anything_is_made_of_it():
    # Topics: a count of 2**31 - 1 in a 10-byte frame.
    frame = struct.pack(">i", 2**31 - 1) + b"\x00" * 6
    with pytest.raises(codec.KafkaDecodeError, match="elements"):
        codec.decode(messages.MetadataRequest, 1, frame)
    with pytest.raises(codec.KafkaDecodeError, match="past the end"):
        codec.decode(messages.ApiVersionsRequest, 3, b"\xff\xff\xff\x7f")


def test_every_generated_schema_plans_at_every_version_and_covers_the_listener():
    from api.broker.kafka_listener import SUPPORTED
    for request, response in messages.APIS.values():
        for schema in (request, response):
            low, high = schema["valid"]
            for version in range(low, high + 1):
                # Every field's default, encoded from nothing and read back.
                encoded = codec.encode(schema, version, {})
                assert codec.decode(schema, version, bytes(encoded))[1] == len(encoded)
    for api_key, (low, high) in SUPPORTED.items():
        request, response = messages.APIS[api_key]
        assert request["valid"][0] <= low <= high <= request["valid"][1]
    # Every struct type is resolved, wherever in the message it is defined
    # (an empty array of it would encode without its fields).
    primitive = {"int8", "int16", "int32", "int64", "uint16", "uint32", "float64", "string",
                 "bytes", "records", "bool", "uuid"}

    def unresolved(fields: tuple) -> list:
        out = []
        for name, kind, *_, sub, _flexible in fields:
            element = kind[2:] if kind.startswith("[]") else kind
            if sub is None and element not in primitive:
                out.append((name, kind))
            out += unresolved(sub or ())
        return out
    for request, response in messages.APIS.values():
        assert unresolved(request["fields"]) == [] and unresolved(response["fields"]) == []
    assert messages.ERRORS["NOT_LEADER_OR_FOLLOWER"] == 6
    assert messages.SOURCE.startswith("apache/kafka@")


def test_a_nullable_struct_is_marked_present_or_null_by_a_byte():
    # ConsumerGroupHeartbeatResponse.Assignment: -1 for "unchanged", 1 then the struct.
    base = {"ErrorCode": 0, "MemberId": "m", "MemberEpoch": 3, "HeartbeatIntervalMs": 5000}
    schema = messages.ConsumerGroupHeartbeatResponse
    null = bytes(codec.encode(schema, 1, {**base, "Assignment": None}))
    present = bytes(codec.encode(schema, 1, {**base, "Assignment": {"TopicPartitions": [
        {"TopicId": b"\x01" * 16, "Partitions": [0, 2]}]}}))
    assert null[-2:] == b"\xff\x00"  # the null marker, then no tagged fields
    assert present[len(null) - 2] == 1
    assert codec.decode(schema, 1, null)[0]["Assignment"] is None
    assert codec.decode(schema, 1, present)[0]["Assignment"]["TopicPartitions"] == [
        {"TopicId": b"\x01" * 16, "Partitions": [0, 2]}]


def test_a_null_where_a_version_allows_none_is_written_empty():
    """JoinGroup's ProtocolName is nullable from v7 only: an error answer
    to v2 once went out with a null there, a frame no client can read
    (found by the KAFKA listener's fuzz campaign). A null where the
    version has no null is written as the empty string, bytes or list."""
    answer = {"ThrottleTimeMs": 0, "ErrorCode": 15, "GenerationId": -1,
              "ProtocolType": None, "ProtocolName": None, "Leader": "", "MemberId": "",
              "Members": None}
    for version in (2, 6, 7):
        encoded = bytes(codec.encode(messages.JoinGroupResponse, version, answer))
        decoded = codec.decode(messages.JoinGroupResponse, version, encoded)[0]
        assert decoded["ProtocolName"] == (None if version >= 7 else "")
        assert decoded["Members"] == []


# -- the C conversion against the Python one ------------------------------------------------
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from protocol.kafka import records as kafka_records  # noqa: E402
from storage.batch import parse_header  # noqa: E402

_payloads = st.one_of(st.none(), st.binary(max_size=300))
_headers = st.lists(st.tuples(st.text(max_size=20), _payloads), max_size=3)
_records = st.lists(st.tuples(_payloads, _payloads, _headers,
                              st.integers(-2**40, 2**40)), min_size=1, max_size=30)


def _native(recs) -> bytes:
    builder = BatchBuilder()
    for key, value, headers, ts in recs:
        builder.append(key, value, timestamp_ms=10**12 + ts, headers=headers)
    return builder.build()


def test_the_c_conversion_is_built():
    # `make test` builds protocol/_kafka.c; without it the listener converts
    # in Python, ten times slower, and the comparisons below could not run.
    assert kafka_records.ACCELERATED


@settings(max_examples=300, deadline=None)
@given(_records)
def test_c_and_python_convert_records_to_the_same_bytes_both_ways(recs):
    batch = _native(recs)
    header = parse_header(batch)
    section = batch[61:]
    kafka_c = kafka_records._c.msgpack_to_kafka(section, header.record_count)
    assert kafka_c == kafka_records._py_to_kafka(section, header)
    back_c = kafka_records._c.kafka_to_msgpack(kafka_c, header.record_count,
                                               header.last_offset_delta)
    assert back_c == kafka_records._py_to_msgpack(kafka_c, header)
    assert list(decode_batches(kafka_to_native(native_to_kafka(batch)))) == \
        list(decode_batches(batch))


def test_c_and_python_refuse_the_same_damaged_records():
    rng = random.Random(11)
    batch = _native([(b"k%d" % i, b"v" * i, [("h", b"x")] if i % 2 else [], i)
                     for i in range(20)])
    header = parse_header(batch)
    kafka = kafka_records._c.msgpack_to_kafka(batch[61:], header.record_count)
    refused = 0
    for _ in range(3000):
        damaged = bytearray(kafka)
        for _ in range(rng.randint(1, 3)):
            damaged[rng.randrange(len(damaged))] = rng.randrange(256)
        outcomes = []
        for convert in (lambda: kafka_records._c.kafka_to_msgpack(
                            bytes(damaged), header.record_count, header.last_offset_delta),
                        lambda: kafka_records._py_to_msgpack(bytes(damaged), header)):
            try:
                outcomes.append(convert())
            except (ValueError, CorruptRecordError):
                outcomes.append(None)
        assert outcomes[0] == outcomes[1]
        refused += outcomes[0] is None
    assert refused > 100  # the damage was found, not waved through


def test_classic_member_metadata_and_assignments_read_and_write_as_kafka_python_does():
    from kafka.protocol.consumer.metadata import ConsumerProtocolAssignment
    from kafka.protocol.consumer.metadata import ConsumerProtocolSubscription

    from api.broker.kafka_listener import _assignment, _subscription
    for version in (0, 1, 3):
        theirs = ConsumerProtocolSubscription(version=version, topics=["a", "b"],
                                              user_data=None, owned_partitions=[])
        assert _subscription(bytes(theirs.encode())) == ["a", "b"]
    with pytest.raises(codec.KafkaDecodeError):
        _subscription(b"\x00")
    ours = _assignment(frozenset({("a", 2), ("a", 0), ("b", 1)}))
    decoded = ConsumerProtocolAssignment.decode(ours)
    assert sorted(decoded.partitions()) == sorted([("a", 0), ("a", 2), ("b", 1)])


def test_a_message_of_many_tiny_elements_is_refused_before_it_is_built():
    # 10 million empty topic names would be 20 MB on the wire and gigabytes
    # of objects; a message holds at most ELEMENTS_MAX array elements.
    many = codec.ELEMENTS_MAX + 1
    frame = struct.pack(">i", many) + b"\x00\x00" * many
    with pytest.raises(codec.KafkaDecodeError, match="array elements"):
        codec.decode(messages.MetadataRequest, 1, frame)
    fits = struct.pack(">i", 1000) + b"\x00\x00" * 1000
    assert len(codec.decode(messages.MetadataRequest, 1, fits)[0]["Topics"]) == 1000


def test_the_compatibility_table_in_the_docs_is_what_the_listener_speaks():
    import pathlib
    import re

    from api.broker.kafka_listener import SUPPORTED
    doc = (pathlib.Path(__file__).parents[2] / "docs" / "kafka-protocol.md").read_text()
    rows = {int(key): (int(low), int(high)) for key, low, high in
            re.findall(r"^\| (\d+) \| \w+ \| (\d+)-(\d+) \|", doc, flags=re.MULTILINE)}
    assert rows == SUPPORTED
