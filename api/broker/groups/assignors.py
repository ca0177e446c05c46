"""Server-side partition assignors for consumer groups (KIP-848 style).

In the KIP-848 consumer protocol the group coordinator, not a consumer,
decides which member of a group reads which partition. Whenever the group
changes (a member joins, leaves or changes its subscription, or a subscribed
topic gains partitions) the coordinator runs an assignor to compute the new
*target assignment*; members then converge on it by revoking what they no
longer own and taking up what they were given. An assignor is a pure
function: it sees each member's resolved subscription and its current
target assignment, and the partition count of every topic, and returns a set
of partitions per member. It does no I/O and keeps no state between calls.

Guarantees of every assignor here:

  - the result has an entry for every member (possibly empty);
  - every partition of every topic that at least one member subscribes to
    (and that appears in ``partitions_per_topic``; other topics are
    ignored) goes to exactly one member, and only ever to a member that
    subscribes to its topic;
  - the result depends only on the input's contents, never on the order of
    a mapping or a set: members are ordered by ``member_id``, topics by
    name, partitions by number wherever an order is needed.

``uniform`` (sticky and balanced, after Kafka's ``uniform`` assignor):

  - when every member has the same subscription, partition counts differ by
    at most one, and the number of partitions that change owner is the
    least any such balanced result allows (subscriptions are compared by
    the topics that exist; a member whose topics have no partitions simply
    gets none);
  - with different subscriptions the result minimises the sum of the
    squared per-member counts (no chain of moves between eligible members
    would even it out further). In particular it is locally balanced: if
    member ``a`` holds at least two partitions more than ``b``, none of
    ``a``'s partitions is of a topic ``b`` subscribes to;
  - a member keeps the partitions it already owns (``MemberSpec.owned``)
    unless balance needs them elsewhere. An owned partition is only kept if
    it still exists and the member still subscribes to its topic; if two
    members claim one partition, the member whose id sorts first keeps it.

``range`` (after Kafka's range assignor): each topic on its own; its
subscribers, sorted by member id, get contiguous ranges of partitions, the
first ``n % m`` of them one more. It ignores current ownership.

``uniform`` is the default: a rebalance under it moves only the partitions
it must, so members keep their fetch positions and caches, and revocations
(which pause consumption of the partition until the new owner picks it up)
stay few; and it spreads the whole group's load evenly, while ``range``
balances each topic separately and so piles the extra partitions of every
topic on the same first members.

``MemberSpec.instance_id`` (static membership) is carried for callers; an
assignor does not use it: a static member that rejoins keeps its member id
and its owned partitions, which is what stickiness works from.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Protocol

from protocol import TopicPartition


@dataclass(frozen=True)
class MemberSpec:
    member_id: str
    topics: frozenset[str]                 # subscribed topics, regexes already resolved
    owned: frozenset[TopicPartition] = frozenset()   # current target assignment
    instance_id: str | None = None


class Assignor(Protocol):
    name: str

    def assign(self, members: Mapping[str, MemberSpec],
               partitions_per_topic: Mapping[str, int]
               ) -> dict[str, frozenset[TopicPartition]]: ...


# --------------------------------------------------------------------------
# shared input handling

class _Input:
    """The validated, ordered view of one assignment request."""

    def __init__(self, members: Mapping[str, MemberSpec],
                 partitions_per_topic: Mapping[str, int]) -> None:
        for topic, count in partitions_per_topic.items():
            if isinstance(count, bool) or not isinstance(count, int):
                raise TypeError(f"partition count of topic {topic!r} is not an int: {count!r}")
            if count < 0:
                raise ValueError(f"topic {topic!r} has a negative partition count ({count})")
        for key, spec in members.items():
            if key != spec.member_id:
                raise ValueError(f"member key {key!r} differs from its member_id {spec.member_id!r}")
        self.member_ids: list[str] = sorted(members)
        self.specs = members
        # The topics each member subscribes to that exist and have partitions.
        self.eligible: dict[str, frozenset[str]] = {
            m: frozenset(t for t in members[m].topics if partitions_per_topic.get(t, 0) > 0)
            for m in self.member_ids}
        self.topics: list[str] = sorted(set().union(*self.eligible.values()))
        self.counts: dict[str, int] = {t: partitions_per_topic[t] for t in self.topics}
        self.subscribers: dict[str, list[str]] = {
            t: [m for m in self.member_ids if t in self.eligible[m]] for t in self.topics}

    def partitions(self) -> list[TopicPartition]:
        return [(t, p) for t in self.topics for p in range(self.counts[t])]

    def valid_owned(self) -> dict[str, list[TopicPartition]]:
        """Each member's owned partitions that it may keep, sorted; a partition
        claimed by several members goes to the one whose id sorts first."""
        claimed: set[TopicPartition] = set()
        kept: dict[str, list[TopicPartition]] = {}
        for m in self.member_ids:
            mine = []
            for tp in sorted(self.specs[m].owned):
                topic, partition = tp
                if (topic in self.eligible[m] and 0 <= partition < self.counts[topic]
                        and tp not in claimed):
                    claimed.add(tp)
                    mine.append(tp)
            kept[m] = mine
        return kept


def _freeze(member_ids: Iterable[str],
            assignment: Mapping[str, Iterable[TopicPartition]]) -> dict[str, frozenset[TopicPartition]]:
    return {m: frozenset(assignment.get(m, ())) for m in member_ids}


# --------------------------------------------------------------------------
# uniform

class UniformAssignor:
    """Sticky and balanced; see the module docstring."""

    name = "uniform"

    def assign(self, members: Mapping[str, MemberSpec],
               partitions_per_topic: Mapping[str, int]
               ) -> dict[str, frozenset[TopicPartition]]:
        inp = _Input(members, partitions_per_topic)
        active = [m for m in inp.member_ids if inp.eligible[m]]
        if not active:
            return _freeze(inp.member_ids, {})
        if len({inp.eligible[m] for m in active}) == 1:
            result = self._homogeneous(inp, active)
        else:
            result = self._general(inp, active)
        return _freeze(inp.member_ids, result)

    @staticmethod
    def _homogeneous(inp: _Input, active: list[str]) -> dict[str, list[TopicPartition]]:
        """Every active member may take every partition: give each a quota of
        floor or ceil of the average, the ceil quotas to the members owning
        the most, keep owned partitions up to the quota, and deal out the
        rest round-robin to members below their quota."""
        owned = inp.valid_owned()
        total = sum(inp.counts.values())
        base, extra = divmod(total, len(active))
        by_owned = sorted(active, key=lambda m: (-len(owned[m]), m))
        quota = {m: base + (1 if i < extra else 0) for i, m in enumerate(by_owned)}

        result: dict[str, list[TopicPartition]] = {}
        taken: set[TopicPartition] = set()
        for m in active:
            result[m] = owned[m][:quota[m]]
            taken.update(result[m])
        free = deque(tp for tp in inp.partitions() if tp not in taken)
        hungry = deque(m for m in active if len(result[m]) < quota[m])
        while free:
            m = hungry.popleft()
            result[m].append(free.popleft())
            if len(result[m]) < quota[m]:
                hungry.append(m)
        return result

    @staticmethod
    def _general(inp: _Input, active: list[str]) -> dict[str, list[TopicPartition]]:
        """Different subscriptions: keep what is owned, give each remaining
        partition to its least-loaded eligible member (topics with the fewest
        subscribers first), then move partitions along chains of eligible
        members, from a member to one holding at least two fewer, until no
        such chain is left."""
        owned = inp.valid_owned()
        raw_owned = {m: inp.specs[m].owned for m in active}
        held: dict[str, set[TopicPartition]] = {m: set(owned[m]) for m in active}
        per_topic: dict[str, Counter[str]] = {m: Counter(t for t, _ in owned[m]) for m in active}
        taken = {tp for m in active for tp in owned[m]}

        free = [tp for tp in inp.partitions() if tp not in taken]
        free.sort(key=lambda tp: (len(inp.subscribers[tp[0]]), tp))
        for tp in free:
            m = min(inp.subscribers[tp[0]], key=lambda x: (len(held[x]), x))
            held[m].add(tp)
            per_topic[m][tp[0]] += 1

        def move(src: str, dst: str) -> None:
            # Which partition of ``src`` goes to ``dst``: one ``dst`` owned
            # before, else one ``src`` did not own before, else the first.
            options = [tp for tp in held[src] if tp[0] in inp.eligible[dst]]
            tp = min(options, key=lambda tp: (tp not in raw_owned[dst],
                                              tp in raw_owned[src], tp))
            held[src].remove(tp)
            per_topic[src][tp[0]] -= 1
            held[dst].add(tp)
            per_topic[dst][tp[0]] += 1

        def chain_from(src: str) -> list[str] | None:
            """Shortest chain src -> ... -> dst where each member holds a
            partition the next may take and dst holds <= len(src) - 2;
            among the shortest, the least-loaded dst."""
            limit = len(held[src]) - 2
            parent: dict[str, str | None] = {src: None}
            layer = [src]
            while layer:
                nxt: list[str] = []
                for x in layer:
                    for t in sorted(t for t, c in per_topic[x].items() if c > 0):
                        for y in inp.subscribers[t]:
                            if y not in parent:
                                parent[y] = x
                                nxt.append(y)
                targets = [y for y in nxt if len(held[y]) <= limit]
                if targets:
                    dst = min(targets, key=lambda y: (len(held[y]), y))
                    path = [dst]
                    while parent[path[-1]] is not None:
                        path.append(parent[path[-1]])  # type: ignore[arg-type]
                    return path[::-1]
                layer = sorted(nxt)
            return None

        # Each chain lowers the sum of squared counts by at least 2, so this ends.
        while True:
            path = None
            for src in sorted(active, key=lambda m: (-len(held[m]), m)):
                if len(held[src]) < 2:
                    break
                path = chain_from(src)
                if path is not None:
                    break
            if path is None:
                break
            for a, b in zip(path, path[1:]):
                move(a, b)
        return {m: sorted(held[m]) for m in active}


# --------------------------------------------------------------------------
# range

class RangeAssignor:
    """Per topic, contiguous ranges over its subscribers in member-id order."""

    name = "range"

    def assign(self, members: Mapping[str, MemberSpec],
               partitions_per_topic: Mapping[str, int]
               ) -> dict[str, frozenset[TopicPartition]]:
        inp = _Input(members, partitions_per_topic)
        result: dict[str, list[TopicPartition]] = {m: [] for m in inp.member_ids}
        for topic in inp.topics:
            subs = inp.subscribers[topic]
            base, extra = divmod(inp.counts[topic], len(subs))
            start = 0
            for i, m in enumerate(subs):
                size = base + (1 if i < extra else 0)
                result[m].extend((topic, p) for p in range(start, start + size))
                start += size
        return _freeze(inp.member_ids, result)


# --------------------------------------------------------------------------
# registry

ASSIGNORS: dict[str, Assignor] = {
    UniformAssignor.name: UniformAssignor(),
    RangeAssignor.name: RangeAssignor(),
}

DEFAULT_ASSIGNOR = UniformAssignor.name


def assignor(name: str) -> Assignor:
    """The assignor called ``name``; ValueError naming the known ones if none is."""
    try:
        return ASSIGNORS[name]
    except KeyError:
        known = ", ".join(sorted(ASSIGNORS))
        raise ValueError(f"unknown assignor {name!r} (known: {known})") from None
