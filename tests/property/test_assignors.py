"""Assignor guarantees over random groups.

Each example draws 1-5 members with random subscriptions over 1-3 topics of
0-6 partitions (a subscribed topic may be missing from the metadata), and
random ``owned`` sets that may name partitions that do not exist, topics the
member does not subscribe to, or partitions another member also claims.

Both assignors: every subscribed partition is owned exactly once, only by a
subscriber, and the result does not depend on input order. Uniform, same
subscriptions: counts within one, and exactly the fewest partitions change
owner (checked against a quota formula and, for tiny groups, against every
possible assignment). Uniform, mixed subscriptions: locally balanced, and no
assignment has a smaller sum of squared counts (tiny groups, exhaustively).
"""

from __future__ import annotations

import itertools
from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from api.broker.groups.assignors import MemberSpec, RangeAssignor, UniformAssignor

uniform = UniformAssignor()
range_ = RangeAssignor()

TOPICS = ["t0", "t1", "t2"]
GHOST = "ghost"                       # subscribed to, never in the metadata
MEMBER_IDS = [f"m{i}" for i in range(8)]
BRUTE_FORCE_LIMIT = 4096              # assignments enumerated at most

SETTINGS = settings(max_examples=200, deadline=None)


@st.composite
def scenarios(draw, homogeneous: bool, mixed: bool = False):
    """A group and its topics' partition counts. ``mixed`` makes differing
    subscriptions likely: at least two topics, each with partitions."""
    topics = TOPICS[:draw(st.integers(2 if mixed else 1, 3))]
    partitions_per_topic = {t: draw(st.integers(1 if mixed else 0, 6)) for t in topics}
    if not mixed and draw(st.integers(0, 4)) == 0:
        del partitions_per_topic[draw(st.sampled_from(topics))]
    ids = draw(st.lists(st.sampled_from(MEMBER_IDS), min_size=2 if mixed else 1,
                        max_size=5, unique=True))
    choices = topics + [GHOST]
    shared = draw(st.frozensets(st.sampled_from(choices), min_size=1))
    subscription = {
        m: shared if homogeneous else draw(st.frozensets(st.sampled_from(choices)))
        for m in ids}
    # Owned sets: partly anything (a partition past the end, a topic not
    # subscribed to or not existing), plus either real partitions that
    # members often claim in common, or an earlier assignment: each real
    # partition with one owner or none, mostly a subscriber of its topic and
    # often lopsided (a favourite subscriber takes it where it can).
    anything = [(t, p) for t in choices for p in range(7)]
    real = [(t, p) for t, n in partitions_per_topic.items() for p in range(n)]
    owned = {m: set(draw(st.frozensets(st.sampled_from(anything), max_size=4))) for m in ids}
    if draw(st.booleans()):
        favourite = draw(st.permutations(ids))
        for tp in real:
            subscribers = [m for m in favourite if tp[0] in subscription[m]]
            how = draw(st.integers(0, 9))
            if subscribers and how < 6:
                owner = subscribers[0]                  # the favourite
            elif subscribers and how < 8:
                owner = draw(st.sampled_from(subscribers))
            else:
                owner = draw(st.sampled_from(ids + [None]))
            if owner is not None:
                owned[owner].add(tp)
    elif real:
        for m in ids:
            owned[m] |= draw(st.frozensets(st.sampled_from(real), max_size=8))
    members = {m: MemberSpec(m, subscription[m], frozenset(owned[m])) for m in ids}
    return members, partitions_per_topic



@st.composite
def lines(draw):
    """Members in a line, each sharing one topic with the next, as in
    {t0}, {t0, t1}, {t1, t2}, {t2}; the partitions lopsidedly owned. Evening
    these out can take a chain of moves: from an end member to its
    neighbour, from that neighbour to the next, and so on."""
    n = draw(st.integers(2, 4))                   # members
    ids = draw(st.permutations(MEMBER_IDS))[:n]
    topics = TOPICS[:n - 1]
    ppt = {t: draw(st.integers(0, 4)) for t in topics}
    subscription = {m: frozenset(TOPICS[max(i - 1, 0):min(i + 1, n - 1)])
                    for i, m in enumerate(ids)}
    owned: dict[str, set] = {m: set() for m in ids}
    for t in topics:
        subscribers = [m for m in ids if t in subscription[m]]
        heavy = draw(st.sampled_from(subscribers))
        for p in range(ppt[t]):
            owned[heavy if draw(st.integers(0, 3)) else draw(st.sampled_from(subscribers))].add((t, p))
    return {m: MemberSpec(m, subscription[m], frozenset(owned[m])) for m in ids}, ppt

# --- references, written apart from the implementation ----------------------

def subscribed_partitions(members, ppt) -> set[tuple[str, int]]:
    topics = set().union(*(s.topics for s in members.values()))
    return {(t, p) for t in topics if t in ppt for p in range(ppt[t])}


def eligible(members, ppt, tp) -> list[str]:
    return sorted(m for m, s in members.items() if tp[0] in s.topics)


def previous_owner(members, ppt) -> dict[tuple[str, int], str]:
    """Who validly owned each partition before: a subscriber claiming it
    (the smallest member id if several do)."""
    prev = {}
    for tp in subscribed_partitions(members, ppt):
        claimants = [m for m in eligible(members, ppt, tp) if tp in members[m].owned]
        if claimants:
            prev[tp] = claimants[0]
    return prev


def moves(members, ppt, result) -> int:
    now = {tp: m for m, parts in result.items() for tp in parts}
    return sum(1 for tp, m in previous_owner(members, ppt).items() if now[tp] != m)


def quota_min_moves(members, ppt) -> int:
    """Same subscriptions: the active members (those whose subscription has
    partitions) must end with floor or ceil of the average. A member keeps at
    most its quota of what it owned; the `extra` ceil quotas are worth one more
    kept partition each to members owning more than the floor."""
    parts = subscribed_partitions(members, ppt)
    if not parts:
        return 0
    active = [m for m in members if any(tp[0] in members[m].topics for tp in parts)]
    had = Counter(previous_owner(members, ppt).values())
    base, extra = divmod(len(parts), len(active))
    kept = sum(min(had[m], base) for m in active)
    kept += min(extra, sum(1 for m in active if had[m] > base))
    return sum(had.values()) - kept


def brute_force(members, ppt):
    """Every assignment of the subscribed partitions to eligible members, or
    None if there are too many."""
    parts = sorted(subscribed_partitions(members, ppt))
    options = [eligible(members, ppt, tp) for tp in parts]
    size = 1
    for o in options:
        size *= len(o)
    if size > BRUTE_FORCE_LIMIT:
        return None
    out = []
    for choice in itertools.product(*options):
        result = {m: set() for m in members}
        for tp, m in zip(parts, choice):
            result[m].add(tp)
        out.append(result)
    return out


def counts(result) -> list[int]:
    return [len(p) for p in result.values()]


# --- checks ----------------------------------------------------------------

def check_valid(members, ppt, result):
    assert set(result) == set(members)
    seen = Counter(tp for parts in result.values() for tp in parts)
    assert set(seen) == subscribed_partitions(members, ppt)
    assert all(n == 1 for n in seen.values()), "a partition assigned twice"
    for m, parts in result.items():
        for topic, _ in parts:
            assert topic in members[m].topics, f"{m} got {topic} without subscribing"


def check_order_independent(assignor, members, ppt, result, data):
    order = data.draw(st.permutations(sorted(members)))
    shuffled = {
        m: MemberSpec(m, frozenset(sorted(members[m].topics, reverse=True)),
                      frozenset(sorted(members[m].owned, reverse=True)),
                      members[m].instance_id)
        for m in order}
    topic_order = data.draw(st.permutations(sorted(ppt)))
    shuffled_ppt = {t: ppt[t] for t in topic_order}
    assert assignor.assign(shuffled, shuffled_ppt) == result
    assert assignor.assign(members, ppt) == result


def check_locally_balanced(members, result):
    for a, b in itertools.permutations(result, 2):
        if len(result[a]) >= len(result[b]) + 2:
            stealable = [tp for tp in result[a] if tp[0] in members[b].topics]
            assert not stealable, f"{b} could take {stealable} from {a}"


# --- properties --------------------------------------------------------------

@SETTINGS
@given(scenario=st.one_of(scenarios(homogeneous=True), scenarios(homogeneous=False)),
       data=st.data())
def test_range_valid_and_deterministic(scenario, data):
    members, ppt = scenario
    result = range_.assign(members, ppt)
    check_valid(members, ppt, result)
    check_order_independent(range_, members, ppt, result, data)
    # Per topic: contiguous ranges in member-id order, sizes non-increasing
    # and within one of each other.
    for topic in ppt:
        owner = [m for p in range(ppt[topic]) for m, parts in result.items()
                 if (topic, p) in parts]
        assert owner == sorted(owner)
        sizes = [owner.count(m) for m in eligible(members, ppt, (topic, 0))]
        assert sizes == sorted(sizes, reverse=True)
        assert not sizes or max(sizes) - min(sizes) <= 1


@SETTINGS
@given(scenario=scenarios(homogeneous=True), data=st.data())
def test_uniform_same_subscriptions(scenario, data):
    members, ppt = scenario
    result = uniform.assign(members, ppt)
    check_valid(members, ppt, result)
    check_order_independent(uniform, members, ppt, result, data)

    parts = subscribed_partitions(members, ppt)
    if parts:
        assert max(counts(result)) - min(counts(result)) <= 1
    else:
        assert not any(counts(result))
    assert moves(members, ppt, result) == quota_min_moves(members, ppt)

    everything = brute_force(members, ppt)
    if everything is not None:
        balanced = [r for r in everything if max(counts(r)) - min(counts(r)) <= 1]
        assert moves(members, ppt, result) == min(moves(members, ppt, r) for r in balanced)


@SETTINGS
@given(scenario=st.one_of(scenarios(homogeneous=False),
                         scenarios(homogeneous=False, mixed=True), lines()),
       data=st.data())
def test_uniform_mixed_subscriptions(scenario, data):
    members, ppt = scenario
    result = uniform.assign(members, ppt)
    check_valid(members, ppt, result)
    check_order_independent(uniform, members, ppt, result, data)
    check_locally_balanced(members, result)

    everything = brute_force(members, ppt)
    if everything is not None:
        best = min(sum(c * c for c in counts(r)) for r in everything)
        assert sum(c * c for c in counts(result)) == best


@SETTINGS
@given(scenario=st.one_of(scenarios(homogeneous=True), scenarios(homogeneous=False)))
def test_uniform_keeps_its_own_result(scenario):
    """Run again with its result as what each member owns: nothing moves."""
    members, ppt = scenario
    result = uniform.assign(members, ppt)
    again = {m: MemberSpec(m, s.topics, result[m], s.instance_id) for m, s in members.items()}
    assert uniform.assign(again, ppt) == result


@SETTINGS
@given(scenario=st.one_of(scenarios(homogeneous=True), scenarios(homogeneous=False),
                          scenarios(homogeneous=False, mixed=True), lines()),
       data=st.data())
def test_uniform_leaves_a_balanced_assignment_alone(scenario, data):
    """Members that already own one of the best-balanced assignments (least
    sum of squared counts; counts within one for same subscriptions) keep it:
    no partition moves."""
    members, ppt = scenario
    everything = brute_force(members, ppt)
    if everything is None:
        return
    best = min(sum(c * c for c in counts(r)) for r in everything)
    target = data.draw(st.sampled_from(
        [r for r in everything if sum(c * c for c in counts(r)) == best]))
    owning = {m: MemberSpec(m, s.topics, frozenset(target[m])) for m, s in members.items()}
    assert uniform.assign(owning, ppt) == {m: frozenset(p) for m, p in target.items()}
