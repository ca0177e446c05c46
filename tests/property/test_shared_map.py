"""kraft.image.SharedMap against a dict: under any sequence of sets,
deletes and shares (with folds, at a tiny FOLD_AT), every map holds what a
dict given the same operations holds, in the same order, and a share is
independent of the map it came from in both directions.

Order matters: images compare and snapshot in their topics' order, and a
controller's image (shared maps) must equal a broker's (plain dicts) that
applied the same records.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from kraft.image import MetadataImage, SharedMap
from kraft.records import PartitionRecord, RemoveTopicRecord, TopicRecord

KEYS = st.sampled_from([f"k{i}" for i in range(8)])
OPS = st.lists(st.one_of(
    st.tuples(st.just("set"), st.integers(0, 7), KEYS, st.integers(0, 99)),
    st.tuples(st.just("del"), st.integers(0, 7), KEYS),
    st.tuples(st.just("share"), st.integers(0, 7)),
), max_size=60)


def check(shared: SharedMap, model: dict) -> None:
    assert list(shared) == list(model)
    assert list(shared.items()) == list(model.items())
    assert len(shared) == len(model)
    for key in [f"k{i}" for i in range(8)]:
        assert (key in shared) == (key in model)
        assert shared.get(key, -1) == model.get(key, -1)
        if key in model:
            assert shared[key] == model[key]
    assert shared == model


@settings(max_examples=300, deadline=None)
@given(base=st.dictionaries(KEYS, st.integers(0, 99)), ops=OPS)
def test_shared_maps_behave_as_independent_dicts(base, ops):
    fold_at = SharedMap.FOLD_AT
    SharedMap.FOLD_AT = 2  # folds every few changes
    try:
        run(base, ops)
    finally:
        SharedMap.FOLD_AT = fold_at


def run(base: dict, ops: list) -> None:
    pairs = [(SharedMap(dict(base)), dict(base))]
    for op in ops:
        shared, model = pairs[op[1] % len(pairs)]
        if op[0] == "set":
            shared[op[2]] = op[3]
            model[op[2]] = op[3]
        elif op[0] == "del":
            if op[2] in model:
                del shared[op[2]]
                del model[op[2]]
            else:
                try:
                    del shared[op[2]]
                except KeyError:
                    pass
                else:
                    raise AssertionError(f"deleting the missing {op[2]} did not raise")
        else:
            pairs.append((shared.share(), dict(model)))
        for shared, model in pairs:
            check(shared, model)


def test_a_copied_image_equals_one_built_in_place_whatever_it_deleted():
    """A controller's image, copied for each batch, against a broker's that
    applied the same records in place: equal, snapshot for snapshot, with a
    topic deleted and created again (it goes last, as in a dict)."""
    in_place, copied = MetadataImage(), MetadataImage()
    records = []
    for i in range(4):
        records += [TopicRecord(f"t{i}", f"id-{i}"),
                    PartitionRecord(f"id-{i}", 0, [1], [1], 1, 0, 0)]
    records += [RemoveTopicRecord("id-1"), TopicRecord("t1", "id-1b"),
                PartitionRecord("id-1b", 0, [1], [1], 1, 0, 0)]
    for offset, record in enumerate(records):
        in_place.apply(record, offset)
        copied = copied.copy()
        copied.apply(record, offset)
    assert list(copied.topics) == list(in_place.topics) == ["t0", "t2", "t3", "t1"]
    assert copied.to_snapshot() == in_place.to_snapshot()
    copied.check_invariants()


def test_copying_an_image_does_not_copy_its_topic_maps():
    """The cost of a copy does not grow with the topics: the base dict of
    the copy is the original's, not a copy of it."""
    image = MetadataImage()
    for i in range(2000):
        image.apply(TopicRecord(f"t{i}", f"id-{i}"), 2 * i)
        image.apply(PartitionRecord(f"id-{i}", 0, [1], [1], 1, 0, 0), 2 * i + 1)
    first = image.copy()
    second = first.copy()
    assert second.topics._base is first.topics._base is image.topics._base
    assert len(second.topics) == 2000
