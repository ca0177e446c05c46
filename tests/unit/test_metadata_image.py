"""MetadataImage and metadata records: sequences of records applied and the
resulting image checked; malformed records refused; snapshots round-trip."""

from __future__ import annotations

import copy

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kraft import records as rec
from kraft.image import MetadataImage
from kraft.records import NO_LEADER
from protocol.errors import InvalidRecordError, MetadataApplyError


def apply_all(records, image=None, start=0) -> MetadataImage:
    image = image or MetadataImage()
    for i, record in enumerate(records):
        image.apply(rec.decode(record.encode()), start + i)  # through the wire form
    image.check_invariants()
    return image


def two_brokers_and_a_topic():
    return [
        rec.RegisterBrokerRecord(1, "inc-1", {"BROKER": "127.0.0.1:9092"}, "r1"),
        rec.RegisterBrokerRecord(2, "inc-2", {"BROKER": "127.0.0.1:9094"}, "r2"),
        rec.UnfenceBrokerRecord(1, 0),
        rec.UnfenceBrokerRecord(2, 1),
        rec.TopicRecord("orders", "tid-orders"),
        rec.PartitionRecord("tid-orders", 0, [1, 2], [1, 2], 1, 0, 0),
        rec.PartitionRecord("tid-orders", 1, [2, 1], [2, 1], 2, 0, 0),
    ]


def test_brokers_register_fenced_and_epoch_is_the_record_offset():
    image = apply_all(two_brokers_and_a_topic()[:2])
    assert image.brokers[1].fenced and image.brokers[1].broker_epoch == 0
    assert image.brokers[2].broker_epoch == 1
    assert image.unfenced_broker_ids() == set()
    image = apply_all(two_brokers_and_a_topic())
    assert image.unfenced_broker_ids() == {1, 2}
    assert image.offset == 6


def test_reregistration_gets_a_new_epoch_and_starts_fenced():
    image = apply_all(two_brokers_and_a_topic())
    image.apply(rec.RegisterBrokerRecord(1, "inc-1b", {"BROKER": "127.0.0.1:9092"}, "r1"), 7)
    assert image.brokers[1].broker_epoch == 7 and image.brokers[1].fenced
    with pytest.raises(MetadataApplyError, match="epoch"):
        image.apply(rec.UnfenceBrokerRecord(1, 0), 8)  # the old incarnation's epoch
    assert image.brokers[1].fenced and image.offset == 7


def test_topics_partitions_and_queries():
    image = apply_all(two_brokers_and_a_topic())
    assert image.partition("orders", 1).leader == 2
    assert image.partitions_led_by(1) == [("orders", 0)]
    assert image.partition("orders", 5) is None and image.partition("nope", 0) is None


def test_partition_change_bumps_epochs_as_kraft_does():
    image = apply_all(two_brokers_and_a_topic())
    image.apply(rec.PartitionChangeRecord("tid-orders", 0, isr=[1]), 7)
    p = image.partition("orders", 0)
    assert (p.isr, p.leader, p.leader_epoch, p.partition_epoch) == ([1], 1, 0, 1)
    image.apply(rec.PartitionChangeRecord("tid-orders", 0, leader=NO_LEADER), 8)
    p = image.partition("orders", 0)
    assert (p.leader, p.leader_epoch, p.partition_epoch) == (NO_LEADER, 1, 2)
    image.apply(rec.PartitionChangeRecord("tid-orders", 0, leader=2, isr=[2]), 9)
    p = image.partition("orders", 0)
    assert (p.leader, p.isr, p.leader_epoch, p.partition_epoch) == (2, [2], 2, 3)


@pytest.mark.parametrize("change", [
    rec.PartitionChangeRecord("tid-orders", 0, isr=[3]),            # ISR outside replicas
    rec.PartitionChangeRecord("tid-orders", 0, leader=3),           # leader not a replica
    rec.PartitionChangeRecord("tid-orders", 0, replicas=[1, 1]),    # duplicate replicas
    rec.PartitionChangeRecord("tid-orders", 0, replicas=[]),        # no replicas
    rec.PartitionChangeRecord("tid-orders", 9, isr=[1]),            # no such partition
    rec.PartitionChangeRecord("tid-nope", 0, isr=[1]),              # no such topic
    rec.PartitionRecord("tid-orders", 0, [1], [1], 1, 0, 0),        # partition exists
    rec.TopicRecord("orders", "tid-other"),                         # duplicate name
    rec.TopicRecord("other", "tid-orders"),                         # duplicate id
    rec.FenceBrokerRecord(9, 0),                                    # unknown broker
    rec.ConfigRecord("topic", "nope", "retention.ms", "1"),         # unknown topic
    rec.ConfigRecord("cluster", "", "x", "1"),                      # unknown resource type
    rec.ProducerIdsRecord(1, 0, 0),                                 # does not move forward
])
def test_inconsistent_records_are_refused_and_change_nothing(change):
    image = apply_all(two_brokers_and_a_topic())
    before = image.to_snapshot()
    with pytest.raises(MetadataApplyError):
        image.apply(change, 7)
    assert image.to_snapshot() == before


def test_configs_set_delete_and_go_with_their_topic():
    image = apply_all(two_brokers_and_a_topic() + [
        rec.ConfigRecord("topic", "orders", "retention.ms", "1000"),
        rec.ConfigRecord("topic", "orders", "segment.bytes", "4096"),
        rec.ConfigRecord("broker", "1", "log.retention.ms", "5"),
        rec.ConfigRecord("topic", "orders", "segment.bytes", None),
    ])
    assert image.topic_configs("orders") == {"retention.ms": "1000"}
    image.apply(rec.RemoveTopicRecord("tid-orders"), 20)
    assert "orders" not in image.topics and image.topic_configs("orders") == {}
    assert image.configs == {("broker", "1"): {"log.retention.ms": "5"}}
    image.apply(rec.TopicRecord("orders", "tid-orders-2"), 21)  # the name is free again
    image.check_invariants()


def test_producer_id_blocks_and_unregistration():
    image = apply_all(two_brokers_and_a_topic() + [rec.ProducerIdsRecord(1, 0, 1000),
                                                    rec.UnregisterBrokerRecord(2, 1)])
    assert image.next_producer_id == 1000 and set(image.brokers) == {1}


def test_snapshot_round_trips_exactly():
    image = apply_all(two_brokers_and_a_topic() + [
        rec.ConfigRecord("topic", "orders", "retention.ms", "1000"),
        rec.BrokerRegistrationChangeRecord(1, 0, True)])
    restored = MetadataImage.from_snapshot(image.to_snapshot())
    assert restored == image
    assert restored.partition("orders", 1).replicas == [2, 1]
    assert restored.brokers[1].in_controlled_shutdown


@pytest.mark.parametrize("data, message", [
    (b"\xc1", "not valid msgpack"),
    (msgpack.packb({"a": 1}), "must be"),
    (msgpack.packb(["nope", 0, {}]), "unknown metadata record type"),
    (msgpack.packb(["topic", 7, {"name": "t", "topic_id": "x"}]), "version"),
    (msgpack.packb(["topic", 0, {"name": "t"}]), "lacks field"),
    (msgpack.packb(["topic", 0, {"name": "t", "topic_id": "x", "extra": 1}]), "unknown fields"),
    (msgpack.packb(["topic", 0, {"name": 5, "topic_id": "x"}]), "topic.name must be str"),
    (msgpack.packb(["partition", 0, {"topic_id": "x", "partition": True, "replicas": [1],
                                     "isr": [1], "leader": 1, "leader_epoch": 0,
                                     "partition_epoch": 0}]), "partition.partition"),
    (msgpack.packb(["partition", 0, {"topic_id": "x", "partition": 0, "replicas": ["1"],
                                     "isr": [1], "leader": 1, "leader_epoch": 0,
                                     "partition_epoch": 0}]), "replicas"),
    (msgpack.packb(["register_broker", 0, {"broker_id": 1, "incarnation_id": "i",
                                           "endpoints": {"B": 1}, "rack": None}]), "endpoints"),
])
def test_malformed_records_are_refused_with_a_reason(data, message):
    with pytest.raises(InvalidRecordError, match=message) as info:
        rec.decode(data)
    assert info.value.code == "INVALID_RECORD"


def test_optional_fields_may_be_omitted_and_round_trip():
    change = rec.PartitionChangeRecord("t", 0, isr=[1])
    assert rec.decode(change.encode()) == change
    data = msgpack.packb(["partition_change", 0, {"topic_id": "t", "partition": 0}])
    assert rec.decode(data) == rec.PartitionChangeRecord("t", 0)


# -- reassignment and leader recovery fields --------------------------------
def test_reassignment_fields_apply_and_leader_changes_keep_the_recovery_state():
    image = apply_all(two_brokers_and_a_topic())
    image.apply(rec.PartitionChangeRecord("tid-orders", 0, replicas=[3, 1, 2], adding_replicas=[3],
                                          removing_replicas=[2]), 7)
    p = image.partition("orders", 0)
    assert (p.replicas, p.adding_replicas, p.removing_replicas) == ([3, 1, 2], [3], [2])
    assert (p.target_replicas, p.original_replicas, p.reassigning) == ([3, 1], [1, 2], True)
    image.apply(rec.PartitionChangeRecord("tid-orders", 0, leader=2, isr=[2],
                                          leader_recovery_state=rec.LEADER_RECOVERING), 8)
    image.apply(rec.PartitionChangeRecord("tid-orders", 0, leader=1, isr=[1]), 9)
    p = image.partition("orders", 0)
    # The leader changed without saying: the state stays (the controller sets it).
    assert (p.leader, p.leader_epoch, p.leader_recovery_state) == (1, 2, rec.LEADER_RECOVERING)
    assert p.adding_replicas == [3]  # unchanged fields stay as they were
    image.apply(rec.PartitionChangeRecord("tid-orders", 0, replicas=[3, 1], adding_replicas=[],
                                          removing_replicas=[], leader_recovery_state=0), 10)
    p = image.partition("orders", 0)
    assert (p.replicas, p.reassigning, p.leader_recovery_state) == ([3, 1], False, 0)
    image.check_invariants()


@pytest.mark.parametrize("change", [
    rec.PartitionChangeRecord("tid-orders", 0, adding_replicas=[3]),  # not a replica
    rec.PartitionChangeRecord("tid-orders", 0, removing_replicas=[3]),
    rec.PartitionChangeRecord("tid-orders", 0, adding_replicas=[2, 2]),  # twice
    rec.PartitionChangeRecord("tid-orders", 0, adding_replicas=[2], removing_replicas=[2]),
    rec.PartitionChangeRecord("tid-orders", 0, leader_recovery_state=2),
])
def test_inconsistent_reassignment_fields_are_refused(change):
    image = apply_all(two_brokers_and_a_topic())
    before = image.to_snapshot()
    with pytest.raises(MetadataApplyError):
        image.apply(change, 7)
    assert image.to_snapshot() == before


def test_replicas_may_not_drop_one_a_reassignment_still_adds():
    image = apply_all(two_brokers_and_a_topic() + [rec.PartitionChangeRecord(
        "tid-orders", 1, replicas=[3, 2, 1], adding_replicas=[3], removing_replicas=[1])])
    with pytest.raises(MetadataApplyError, match="adding replicas"):
        image.apply(rec.PartitionChangeRecord("tid-orders", 1, replicas=[2, 1]), 8)


def test_snapshot_round_trips_the_new_fields():
    image = apply_all(two_brokers_and_a_topic() + [
        rec.PartitionChangeRecord("tid-orders", 0, replicas=[3, 1, 2], adding_replicas=[3],
                                  removing_replicas=[2], leader_recovery_state=1)])
    restored = MetadataImage.from_snapshot(image.to_snapshot())
    assert restored == image
    p = restored.partition("orders", 0)
    assert (p.adding_replicas, p.removing_replicas, p.leader_recovery_state) == ([3], [2], 1)


def test_a_snapshot_from_before_the_new_fields_loads_with_defaults():
    image = apply_all(two_brokers_and_a_topic())
    raw = msgpack.unpackb(image.to_snapshot(), raw=False, strict_map_key=False)
    for topic in raw["topics"]:
        for registration in topic["partitions"].values():
            for field in ("adding_replicas", "removing_replicas", "leader_recovery_state"):
                del registration[field]
    restored = MetadataImage.from_snapshot(msgpack.packb(raw, use_bin_type=True))
    assert restored == image
    p = restored.partition("orders", 1)
    assert (p.adding_replicas, p.removing_replicas, p.leader_recovery_state) == ([], [], 0)


def test_partition_changes_from_before_the_new_fields_decode_and_new_ones_leave_them_out():
    # As the previous version wrote it: every field, the optional ones as None.
    old = msgpack.packb(["partition_change", 0, {"topic_id": "t", "partition": 0,
                                                 "leader": 2, "isr": [2], "replicas": None}])
    assert rec.decode(old) == rec.PartitionChangeRecord("t", 0, leader=2, isr=[2])
    # Unused optional fields are not written, so the previous version can read
    # a record that does not use the new ones.
    _, _, fields = msgpack.unpackb(rec.PartitionChangeRecord("t", 0, isr=[1]).encode())
    assert fields == {"topic_id": "t", "partition": 0, "isr": [1]}
    change = rec.PartitionChangeRecord("t", 0, adding_replicas=[], leader_recovery_state=0)
    assert rec.decode(change.encode()) == change
    # A required field that happens to be None is still written.
    _, _, fields = msgpack.unpackb(rec.ConfigRecord("topic", "t", "a", None).encode())
    assert fields["value"] is None


# -- property: apply is deterministic and all-or-nothing --------------------
record_strategy = st.one_of(
    st.builds(rec.RegisterBrokerRecord, st.integers(0, 3), st.sampled_from(["a", "b"]),
              st.just({"BROKER": "h:1"}), st.sampled_from([None, "r1", "r2"])),
    st.builds(rec.FenceBrokerRecord, st.integers(0, 3), st.integers(0, 30)),
    st.builds(rec.UnfenceBrokerRecord, st.integers(0, 3), st.integers(0, 30)),
    st.builds(rec.TopicRecord, st.sampled_from(["t1", "t2", "t.1", "t_1"]),
              st.sampled_from(["i1", "i2"])),
    st.builds(rec.PartitionRecord, st.sampled_from(["i1", "i2"]), st.integers(0, 2),
              st.lists(st.integers(0, 3), max_size=3), st.lists(st.integers(0, 3), max_size=3),
              st.integers(-1, 3), st.just(0), st.just(0)),
    st.builds(rec.PartitionChangeRecord, st.sampled_from(["i1", "i2"]), st.integers(0, 2),
              st.one_of(st.none(), st.integers(-1, 3)),
              st.one_of(st.none(), st.lists(st.integers(0, 3), max_size=3)),
              st.one_of(st.none(), st.lists(st.integers(0, 3), max_size=3)),
              st.one_of(st.none(), st.lists(st.integers(0, 3), max_size=2)),
              st.one_of(st.none(), st.lists(st.integers(0, 3), max_size=2)),
              st.sampled_from([None, 0, 1, 2])),
    st.builds(rec.RemoveTopicRecord, st.sampled_from(["i1", "i2"])),
    st.builds(rec.ConfigRecord, st.sampled_from(["topic", "broker"]), st.sampled_from(["t1", "1"]),
              st.sampled_from(["a", "b"]), st.one_of(st.none(), st.sampled_from(["1", "2"]))),
)


@settings(max_examples=200, deadline=None)
@given(st.lists(record_strategy, max_size=40))
def test_apply_is_deterministic_and_refusals_change_nothing(records):
    first, second = MetadataImage(), MetadataImage()
    for offset, record in enumerate(records):
        before = copy.deepcopy(first.to_snapshot())
        try:
            first.apply(record, offset)
        except MetadataApplyError:
            assert first.to_snapshot() == before
            with pytest.raises(MetadataApplyError):
                second.apply(rec.decode(record.encode()), offset)
            continue
        second.apply(rec.decode(record.encode()), offset)
        first.check_invariants()
    assert first == second
    assert MetadataImage.from_snapshot(first.to_snapshot()) == first


def _apply_valid(image: MetadataImage, records, start: int) -> list:
    """Apply what ``image`` accepts; the records it accepted."""
    accepted = []
    for offset, record in enumerate(records, start):
        try:
            image.apply(record, offset)
        except MetadataApplyError:
            continue
        accepted.append((offset, record))
    return accepted


@settings(max_examples=200, deadline=None)
@given(st.lists(record_strategy, max_size=25), st.lists(record_strategy, max_size=25),
       st.lists(record_strategy, max_size=25))
def test_a_copy_and_its_original_change_independently(common, for_original, for_copy):
    """``copy`` shares topics and configs copy-on-write: whatever either
    image applies afterwards, the other never sees it, and both keep their
    derived counts exact (check_invariants recomputes them)."""
    original = MetadataImage()
    _apply_valid(original, common, 0)
    copied = original.copy()
    start = len(common)
    original_log = _apply_valid(original, for_original, start)
    copy_log = _apply_valid(copied, for_copy, start)
    for image, log in ((original, original_log), (copied, copy_log)):
        image.check_invariants()
        expected = MetadataImage()
        _apply_valid(expected, common, 0)
        for offset, record in log:
            expected.apply(record, offset)
        assert image == expected


def test_offline_log_dirs_round_trip_and_a_snapshot_without_any_leaves_them_out():
    """A snapshot names a broker's offline dirs and replicas only when it has
    some, so a cluster that never had a disk error writes snapshots the
    version before these fields reads too."""
    image = apply_all(two_brokers_and_a_topic())
    for broker in msgpack.unpackb(image.to_snapshot(), raw=False,
                                  strict_map_key=False)["brokers"]:
        assert "offline_log_dirs" not in broker and "offline_replicas" not in broker
    image.apply(rec.BrokerRegistrationChangeRecord(
        1, 0, False, offline_log_dirs=["/d1"], offline_replicas={"tid-orders": [1, 0, 1]}), 30)
    assert image.brokers_offline_for("orders", 0) == {1} == image.brokers_offline_for("orders", 1)
    assert image.brokers_offline_for("orders", 2) == set()
    restored = MetadataImage.from_snapshot(image.to_snapshot())
    assert restored == image
    assert (restored.brokers[1].offline_log_dirs, restored.brokers[1].offline_replicas) == (
        ["/d1"], {"tid-orders": [0, 1]})
    # A later change that names no offline fields leaves them.
    restored.apply(rec.BrokerRegistrationChangeRecord(1, 0, True), 31)
    assert restored.brokers[1].offline_log_dirs == ["/d1"]
