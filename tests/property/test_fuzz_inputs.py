"""Property-based fuzzing of the inputs that do not come over HTTP (those
are ``kraftlog chaos fuzz``'s): metadata records as a controller or broker
reads them from the Raft log or a peer, and every node config value.

A metadata record of any shape either decodes or is refused with
``InvalidRecordError``; one that decodes is either applied to an image or
refused with ``MetadataApplyError`` (or another ``KraftError``), leaving the
image exactly as it was, and an applied one keeps the image's invariants.
A config value of any type, for any key, either makes a node config or is
refused with ``InvalidConfigError``, never another exception.
"""

from __future__ import annotations

import dataclasses

import msgpack
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kraft import records as rec
from kraft.config import node_config_from_settings
from kraft.config_schema import SCHEMA
from kraft.image import MetadataImage
from protocol.errors import InvalidConfigError, InvalidRecordError, KraftError

# Values of every msgpack type, the awkward ones often: big and negative
# ints, NaN, empty and odd strings, nesting.
SCALARS = st.one_of(
    st.none(), st.booleans(),
    st.integers(min_value=-2**63, max_value=2**64 - 1),
    st.sampled_from([0, -1, 1, 2**31 - 1, 2**31, 2**63 - 1, -2**31]),
    st.floats(allow_nan=True), st.text(max_size=20),
    st.sampled_from(["", "\x00", "t", "tid-0", "/d1", "-1", "9" * 30]),
    st.binary(max_size=8))
VALUES = st.recursive(SCALARS, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.one_of(st.text(max_size=8), SCALARS),
                                                 inner, max_size=4)), max_leaves=12)

TYPES = sorted(rec.RECORD_TYPES)


@st.composite
def record_bodies(draw) -> bytes:
    """[type, version, fields], mostly of a real type with its own field
    names, each field's value of any type."""
    if draw(st.integers(0, 9)) == 0:
        return msgpack.packb(draw(VALUES), use_bin_type=True)
    name = draw(st.sampled_from(TYPES))
    names = [f.name for f in dataclasses.fields(rec.RECORD_TYPES[name])]
    fields = {field: draw(VALUES) for field in names}
    if names and draw(st.booleans()):
        del fields[draw(st.sampled_from(names))]
    if draw(st.integers(0, 4)) == 0:
        fields[draw(st.text(max_size=6))] = draw(VALUES)
    version = draw(st.sampled_from([rec.RECORD_VERSION, rec.RECORD_VERSION, 1, "0", None]))
    return msgpack.packb([name, version, fields], use_bin_type=True)


@st.composite
def well_typed_records(draw) -> rec.Record:
    """Records that pass ``decode`` (right fields, right types), with
    values aimed at the image's ids: brokers 0-3, the topic id ``tid-0``,
    partitions -1 to 3."""
    name = draw(st.sampled_from(TYPES))
    cls = rec.RECORD_TYPES[name]
    hints = rec._HINTS[cls]
    small_ints = st.sampled_from([-1, 0, 1, 2, 3, 2**31 - 1])
    ids = st.sampled_from(["tid-0", "tid-1", "t", "broker", "topic", ""])

    def value_of(hint):
        origin = getattr(hint, "__origin__", None)
        if hint is int:
            return small_ints
        if hint is str:
            return ids
        if hint is bool:
            return st.booleans()
        if origin is list:
            return st.lists(value_of(hint.__args__[0]), max_size=4)
        if origin is dict:
            return st.dictionaries(value_of(hint.__args__[0]), value_of(hint.__args__[1]),
                                   max_size=3)
        args = [a for a in getattr(hint, "__args__", ()) if a is not type(None)]
        return st.one_of(st.none(), value_of(args[0]))

    values = {f.name: draw(value_of(hints[f.name])) for f in dataclasses.fields(cls)}
    return cls(**values)


def an_image() -> MetadataImage:
    image = MetadataImage()
    for broker in (1, 2, 3):
        image.apply(rec.RegisterBrokerRecord(broker, f"inc-{broker}", {"BROKER": "h:1"}, None),
                    image.offset + 1)
    image.apply(rec.TopicRecord("t", "tid-0"), image.offset + 1)
    for partition in range(3):
        image.apply(rec.PartitionRecord("tid-0", partition, [1, 2, 3], [1, 2, 3], 1, 0, 0),
                    image.offset + 1)
    return image


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(record_bodies())
def test_any_metadata_record_bytes_decode_or_are_refused(data):
    try:
        record = rec.decode(data)
    except InvalidRecordError:
        return
    assert isinstance(record, rec.Record)


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(well_typed_records(), min_size=1, max_size=6))
def test_any_well_typed_records_apply_or_are_refused_leaving_the_image_whole(records):
    image = an_image()
    for record in records:
        before = image.to_snapshot()
        try:
            image.apply(rec.decode(record.encode()), image.offset + 1)
        except KraftError:
            assert image.to_snapshot() == before, record
            continue
        image.check_invariants()
        assert MetadataImage.from_snapshot(image.to_snapshot()) == image


BASE = {"node.id": 1, "process.roles": "broker,controller",
        "controller.quorum.voters": "1@127.0.0.1:19093",
        "listeners": "BROKER://127.0.0.1:19092,CONTROLLER://127.0.0.1:19093",
        "log.dirs": "/tmp/kraftlog-fuzz-config"}


@settings(max_examples=800, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from([key.name for key in SCHEMA]), VALUES)
def test_any_value_of_any_config_key_makes_a_config_or_is_refused(key, value):
    try:
        node_config_from_settings({**BASE, key: value})
    except InvalidConfigError:
        pass
