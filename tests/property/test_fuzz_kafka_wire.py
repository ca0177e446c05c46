"""Property-based fuzzing of the Kafka wire listener's decoding: what a
Kafka client (or anything that connects to the KAFKA port) can send.

For every API and version the listener speaks, a request body of random
bytes, or a valid encoding cut, extended or with bytes flipped, either
decodes or is refused with ``KafkaDecodeError`` (the listener then closes
the connection, as Kafka does), never another exception; and record
batches in a produce request, random or mutated from a valid one, are
either converted or refused with a ``RecordFormatError`` (the partition's
error code), never another exception.
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from api.broker.kafka_listener import SUPPORTED
from protocol.kafka import codec, messages
from protocol.kafka.records import kafka_to_native, native_to_kafka
from storage.batch import RecordFormatError, build_batch

SPOKEN = sorted((api_key, version) for api_key, (low, high) in SUPPORTED.items()
                for version in range(low, high + 1))


@st.composite
def mutated(draw, valid: bytes) -> bytes:
    """``valid`` cut, extended, or with a few bytes changed."""
    data = bytearray(valid)
    for _ in range(draw(st.integers(1, 4))):
        how = draw(st.sampled_from(["flip", "cut", "extend", "insert"]))
        if how == "flip" and data:
            at = draw(st.integers(0, len(data) - 1))
            data[at] = draw(st.sampled_from([0x00, 0xFF, 0x7F, 0x80, data[at] ^ 0x01]))
        elif how == "cut" and data:
            data = data[:draw(st.integers(0, len(data) - 1))]
        elif how == "extend":
            data += draw(st.binary(max_size=16))
        else:
            at = draw(st.integers(0, len(data)))
            data[at:at] = draw(st.sampled_from([b"\xff\xff\xff\xff", b"\x7f\xff\xff\xff",
                                                b"\x80\x80\x80\x80\x08", b"\x00"]))
    return bytes(data)


@st.composite
def request_bodies(draw) -> tuple[int, int, bytes]:
    api_key, version = draw(st.sampled_from(SPOKEN))
    schema = messages.APIS[api_key][0]
    if draw(st.booleans()):
        return api_key, version, draw(st.binary(max_size=64))
    return api_key, version, draw(mutated(codec.encode(schema, version, {})))


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(request_bodies())
def test_any_request_body_decodes_or_is_refused(case):
    api_key, version, body = case
    try:
        codec.decode(messages.APIS[api_key][0], version, body)
    except codec.KafkaDecodeError:
        pass


# A Kafka RecordBatch v2 as a Kafka client sends it (the broker's own
# conversion of a native batch), which the test first checks converts.
VALID_BATCH = native_to_kafka(build_batch([(b"k", b"v"), (None, b"value two")]))
assert kafka_to_native(VALID_BATCH)


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(st.binary(max_size=128), mutated(VALID_BATCH)))
def test_any_produced_record_bytes_convert_or_are_refused(data):
    try:
        kafka_to_native(data)
    except RecordFormatError:
        pass
