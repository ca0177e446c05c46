"""Worked examples for the server-side partition assignors."""

from __future__ import annotations

import pytest

from api.broker.groups.assignors import (
    ASSIGNORS,
    DEFAULT_ASSIGNOR,
    MemberSpec,
    RangeAssignor,
    UniformAssignor,
    assignor,
)

uniform = UniformAssignor()
range_ = RangeAssignor()


def group(*specs: MemberSpec) -> dict[str, MemberSpec]:
    return {s.member_id: s for s in specs}


def member(mid: str, *topics: str, owned=()) -> MemberSpec:
    return MemberSpec(mid, frozenset(topics), frozenset(owned))


def tps(topic: str, *partitions: int) -> frozenset[tuple[str, int]]:
    return frozenset((topic, p) for p in partitions)


def owners(result) -> dict[tuple[str, int], str]:
    out = {}
    for m, parts in result.items():
        for tp in parts:
            assert tp not in out, f"{tp} assigned twice"
            out[tp] = m
    return out


def moved(before: dict, after: dict) -> int:
    """Partitions whose previous owner no longer owns them."""
    prev = owners(before)
    now = owners(after)
    return sum(1 for tp, m in prev.items() if now.get(tp) != m)


# --- registry --------------------------------------------------------------

def test_registry_and_default():
    assert set(ASSIGNORS) == {"uniform", "range"}
    assert DEFAULT_ASSIGNOR == "uniform"
    assert assignor("uniform").name == "uniform"
    assert assignor("range").name == "range"
    assert isinstance(assignor(DEFAULT_ASSIGNOR), UniformAssignor)


def test_unknown_assignor_names_the_known_ones():
    with pytest.raises(ValueError) as e:
        assignor("cooperative-sticky")
    assert "range" in str(e.value) and "uniform" in str(e.value)


@pytest.mark.parametrize("a", [uniform, range_])
def test_negative_partition_count_is_rejected(a):
    with pytest.raises(ValueError, match="negative"):
        a.assign(group(member("a", "t")), {"t": -1})


@pytest.mark.parametrize("a", [uniform, range_])
def test_member_key_must_match_member_id(a):
    with pytest.raises(ValueError):
        a.assign({"a": member("b", "t")}, {"t": 3})


@pytest.mark.parametrize("a", [uniform, range_])
def test_empty_group(a):
    assert a.assign({}, {"t": 3}) == {}


# --- the seeds' cases ------------------------------------------------------

@pytest.mark.parametrize("a", [uniform, range_])
@pytest.mark.parametrize("n, expected", [
    (1, [3]), (2, [2, 1]), (3, [1, 1, 1]), (4, [1, 1, 1, 0]),
])
def test_three_partitions_over_one_to_four_consumers(a, n, expected):
    members = group(*(member(f"c{i}", "t") for i in range(1, n + 1)))
    result = a.assign(members, {"t": 3})
    assert set(result) == set(members)
    assert [len(result[f"c{i}"]) for i in range(1, n + 1)] == expected
    assert set().union(*result.values()) == tps("t", 0, 1, 2)
    if n == 4:
        assert result["c4"] == frozenset()


def test_uniform_growing_from_two_to_three_moves_one_partition():
    before = {"a": tps("t", 0, 1), "b": tps("t", 2, 3)}
    members = group(member("a", "t", owned=before["a"]),
                    member("b", "t", owned=before["b"]),
                    member("c", "t"))
    after = uniform.assign(members, {"t": 4})
    assert sorted(len(p) for p in after.values()) == [1, 1, 2]
    assert len(after["c"]) == 1
    assert after["a"] <= before["a"] and after["b"] <= before["b"]
    # A balanced result over 3 members must take one of the 4 from a or b:
    # the minimum is 1 move, and that is what happens.
    assert moved(before, after) == 1


def test_uniform_member_leaving_moves_only_its_partitions():
    before = {"a": tps("t", 0, 1), "b": tps("t", 2, 3), "c": tps("t", 4, 5)}
    members = group(member("a", "t", owned=before["a"]),
                    member("b", "t", owned=before["b"]))
    after = uniform.assign(members, {"t": 6})
    assert after["a"] >= before["a"] and after["b"] >= before["b"]
    assert after["a"] | after["b"] == tps("t", *range(6))
    assert len(after["a"]) == len(after["b"]) == 3


def test_uniform_is_stable_on_its_own_output():
    members = group(*(member(m, "t", "u") for m in "abcd"))
    first = uniform.assign(members, {"t": 5, "u": 6})
    again = uniform.assign(
        group(*(member(m, "t", "u", owned=first[m]) for m in "abcd")), {"t": 5, "u": 6})
    assert again == first


@pytest.mark.parametrize("a", [uniform, range_])
def test_two_topics_with_different_subscribers(a):
    members = group(member("a", "t1"), member("b", "t1", "t2"), member("c", "t2"))
    result = a.assign(members, {"t1": 3, "t2": 3})
    assert {t for t, _ in result["a"]} <= {"t1"}
    assert {t for t, _ in result["c"]} <= {"t2"}
    assert set(owners(result)) == tps("t1", 0, 1, 2) | tps("t2", 0, 1, 2)
    if a is uniform:
        assert sorted(len(p) for p in result.values()) == [2, 2, 2]


def test_uniform_evens_out_along_a_chain():
    # c (t2 only) holds 3, a (t1 only) holds 1: c cannot give to a directly,
    # but one t2 partition can go c -> b while one t1 partition goes b -> a.
    members = group(member("a", "t1", owned=tps("t1", 2)),
                    member("b", "t1", "t2", owned=tps("t1", 0, 1)),
                    member("c", "t2", owned=tps("t2", 0, 1, 2)))
    result = uniform.assign(members, {"t1": 3, "t2": 3})
    assert {m: len(p) for m, p in result.items()} == {"a": 2, "b": 2, "c": 2}
    assert result["a"] > tps("t1", 2)
    assert result["c"] < tps("t2", 0, 1, 2)
    assert len(result["b"] & tps("t1", 0, 1)) == 1


# --- ownership that cannot be kept -----------------------------------------

def test_uniform_drops_invalid_owned_partitions():
    members = group(
        member("a", "t", owned={("t", 0), ("t", 9), ("gone", 0), ("u", 0)}),
        member("b", "t", "u", owned={("t", 1)}))
    result = uniform.assign(members, {"t": 2, "u": 1, "gone": 1})
    # ("t", 9) does not exist, a does not subscribe to u, and nobody
    # subscribes to "gone" (so it is not assigned at all).
    assert result["a"] == tps("t", 0)
    assert result["b"] == tps("t", 1) | tps("u", 0)


def test_uniform_double_claim_goes_to_first_member_id():
    members = group(member("b", "t", owned=tps("t", 0)),
                    member("a", "t", owned=tps("t", 0)))
    result = uniform.assign(members, {"t": 2})
    assert result == {"a": tps("t", 0), "b": tps("t", 1)}


@pytest.mark.parametrize("a", [uniform, range_])
def test_topics_missing_from_metadata_are_ignored(a):
    members = group(member("a", "t", "missing"), member("b", "missing"))
    result = a.assign(members, {"t": 2})
    assert result == {"a": tps("t", 0, 1), "b": frozenset()}


@pytest.mark.parametrize("a", [uniform, range_])
def test_topic_with_zero_partitions(a):
    members = group(member("a", "t"), member("b", "t"))
    assert a.assign(members, {"t": 0}) == {"a": frozenset(), "b": frozenset()}


# --- range -----------------------------------------------------------------

def test_range_seven_over_three():
    members = group(member("m3", "t"), member("m1", "t"), member("m2", "t"))
    result = range_.assign(members, {"t": 7})
    assert result == {"m1": tps("t", 0, 1, 2), "m2": tps("t", 3, 4), "m3": tps("t", 5, 6)}


def test_range_is_per_topic_and_ignores_ownership():
    members = group(member("a", "t", "u", owned=tps("t", 2)),
                    member("b", "t", "u"),
                    member("c", "u"))
    result = range_.assign(members, {"t": 3, "u": 4})
    assert result == {
        "a": tps("t", 0, 1) | tps("u", 0, 1),
        "b": tps("t", 2) | tps("u", 2),
        "c": tps("u", 3),
    }
