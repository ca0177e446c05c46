"""The broker's metadata answer (``DataApi.metadata``): each topic's
partitions are rendered once and reused while its registrations stay the
same objects; any change of one shows in the next answer."""

import types

import msgpack

from api.broker.data_api import DataApi
from kraft.image import MetadataImage
from kraft.records import (PartitionChangeRecord, PartitionRecord, RegisterBrokerRecord,
                           RemoveTopicRecord, TopicRecord)


def answer_of(api: DataApi, names=None) -> dict:
    # As a client receives it: packed and unpacked (nothing shared leaks).
    return msgpack.unpackb(msgpack.packb(api.metadata(names), use_bin_type=True), raw=False)


def test_a_change_of_any_registration_shows_in_the_next_answer():
    image = MetadataImage()
    for b in (1, 2, 3):
        image.apply(RegisterBrokerRecord(b, f"inc-{b}", {"BROKER": f"127.0.0.1:{9000 + b}"},
                                         None), image.offset + 1)
    for name in ("a", "b"):
        image.apply(TopicRecord(name, f"id-{name}"), image.offset + 1)
        for p in range(3):
            image.apply(PartitionRecord(f"id-{name}", p, [1, 2, 3], [1, 2, 3], 1, 0, 0),
                        image.offset + 1)
    replicas = types.SimpleNamespace(image=image)
    api = DataApi(replicas, None, lambda: None, "cluster", lambda: 1)

    first = answer_of(api)
    assert [t["name"] for t in first["topics"]] == ["a", "b"]
    assert answer_of(api) == first  # the same image: the same answer
    assert api.metadata(None)["topics"][0]["partitions"] is \
        api.metadata(None)["topics"][0]["partitions"]  # rendered once

    image.apply(PartitionChangeRecord("id-b", 2, leader=3, isr=[3, 1]), image.offset + 1)
    changed = answer_of(api)
    (b2,) = [p for p in changed["topics"][1]["partitions"] if p["partition"] == 2]
    assert (b2["leader"], b2["isr"], b2["leader_epoch"]) == (3, [3, 1], 1)
    assert changed["topics"][0] == first["topics"][0]  # topic a as it was

    image.apply(PartitionRecord("id-a", 3, [2, 3, 1], [2, 3, 1], 2, 0, 0), image.offset + 1)
    assert [p["partition"] for p in answer_of(api, ["a"])["topics"][0]["partitions"]] == [
        0, 1, 2, 3]
    image.apply(RemoveTopicRecord("id-a"), image.offset + 1)
    (gone,) = answer_of(api, ["a"])["topics"]
    assert gone["error"]["code"] == "UNKNOWN_TOPIC_OR_PARTITION"
