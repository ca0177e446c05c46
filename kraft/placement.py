"""Where replicas go and who leads: the active controller's placement rules.

Pure functions, no I/O, no clock, no randomness: the controller calls them
while it builds the records of a CreateTopics / CreatePartitions request or
reacts to a broker being fenced, and writes the answers into the metadata
log. Because every controller replica may be asked to recompute a decision
(and tests replay them), the same inputs always give the same output.

Who calls what:
  - ``place_replicas``: CreateTopics / CreatePartitions, over the brokers
    that are registered and unfenced, with the replica and leader counts the
    metadata image already holds for them.
  - ``elect_leader``: whenever a partition's leader goes away (fenced,
    shut down, removed from the ISR).
  - ``preferred_leader_election``: the periodic / requested move of
    leadership back to each partition's first replica.
  - ``isr_after_fencing``: the ISR a partition keeps when a broker is fenced.

Racks. A broker's ``rack`` is its ``broker.rack`` setting or None. A broker
without a rack is placed as if its rack were named ``""`` (``UNRACKED``).
So when no broker has a rack there is a single rack and placement is simply
rack-unaware (as in Kafka); when some brokers have racks and some do not,
the rackless ones together form one more rack. (Kafka refuses that mixed
case unless forced; we accept it because refusing would make one
misconfigured broker block every topic creation.) A broker whose rack is
the explicit string ``""`` is in the same rack as the rackless ones.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction

from protocol.errors import InvalidPartitionsError, InvalidReplicationFactorError

NO_LEADER = -1  # Kafka's LeaderConstants.NO_LEADER: the partition is offline.
UNRACKED = ""  # The rack name a broker without ``rack`` is placed in.


@dataclass(frozen=True)
class BrokerInfo:
    """What placement needs to know about one broker that may take replicas
    (registered and unfenced). ``rack`` is ``broker.rack``, None if unset."""

    broker_id: int
    rack: str | None = None


def place_replicas(
    brokers: Sequence[BrokerInfo],
    num_partitions: int,
    replication_factor: int,
    *,
    existing_replica_counts: Mapping[int, int] | None = None,
    existing_leader_counts: Mapping[int, int] | None = None,
) -> list[list[int]]:
    """Replica lists for ``num_partitions`` new partitions; the first replica
    of each list is its preferred leader.

    ``existing_replica_counts`` / ``existing_leader_counts`` give, per broker,
    the replicas / preferred leaderships it already holds (missing brokers
    hold none; counts for brokers not in ``brokers`` are ignored, since no
    new replica can go there anyway). A broker's *replica total* is its
    existing count plus the new replicas given to it so far; likewise its
    *leader total*.

    Algorithm (greedy, one partition after another, one slot after another):
      1. Leader slot: the broker with the smallest leader total; ties go to
         the smallest replica total, then the least loaded rack (replica
         total per broker of the rack), then the smallest broker id.
      2. Each following slot: among the *eligible* brokers, the one with the
         smallest replica total; ties go to the least loaded rack, then to
         the broker with the most leaders (brokers with few leaders will soon
         take a leader slot, which also adds a replica), then the smallest id.
         A broker is eligible if it is not yet in this partition and taking
         it still lets the partition reach its rack spread (below): once the
         slots left equal the racks still missing, only brokers of a missing
         rack are eligible.
    Tie-breaks only choose among equal totals, never override them. Rack
    load keeps each rack's replicas in proportion to its size, so that later
    partitions, forced into a small rack, find its brokers no busier than
    the rest. Preferring followers that already lead keeps the brokers due a
    leadership (which brings a replica with it) from being topped up first.
    Each tie-break is pinned by a cluster in the tests that is unbalanced
    without it.

    Guarantees (tested in tests/unit/test_placement.py):
      - the replicas of a partition are distinct brokers;
      - rack spread: each partition's replicas span
        ``min(replication_factor, number of racks)`` racks: one replica per
        rack while there are racks enough, every rack otherwise;
      - leaders: every new leader has, when chosen, the smallest leader total
        of all brokers. So if the existing leader counts are equal, the
        final leader totals differ by at most one, whatever the racks;
      - replicas: every follower has, when chosen, the smallest replica total
        of the eligible brokers, and every leader the smallest replica total
        among the brokers of smallest leader total. Without racks, and with
        equal existing replica counts and equal existing leader counts, the
        final replica totals differ by at most one (checked exhaustively for
        up to 12 brokers and 60 partitions, not proven);
      - placing ``a`` then ``b`` partitions (passing the first call's counts
        into the second) gives the same lists as placing ``a + b`` at once;
      - the result does not depend on the order of ``brokers``.

    What it does not promise: with racks, balance is best effort. Rack
    spread is a hard rule and balance yields to it: with racks {a: [1, 2, 3],
    b: [4]} and replication factor 2, broker 4 is in every partition. And the
    leader slot favours leader balance over replica balance: when the
    existing counts disagree (a broker with few leaders but many replicas),
    the new leadership still goes to it.

    Raises, in this order of checks:
      ValueError: duplicate broker ids or negative existing counts (bugs of
        the caller, not of the request);
      InvalidPartitionsError: ``num_partitions < 1``;
      InvalidReplicationFactorError: ``replication_factor < 1``, no brokers,
        or more replicas than brokers.
    """
    _check_placement_request(brokers, num_partitions, replication_factor,
                             existing_replica_counts, existing_leader_counts)
    load = _ClusterLoad(brokers, existing_replica_counts or {}, existing_leader_counts or {})
    racks_required = min(replication_factor, load.rack_count)
    placement = [load.place_partition(replication_factor, racks_required)
                 for _ in range(num_partitions)]
    load.check_invariants()
    return placement


def elect_leader(
    replicas: Sequence[int],
    isr: Sequence[int],
    live_brokers: Collection[int],
    *,
    unclean_allowed: bool,
) -> tuple[int, bool]:
    """The new leader of a partition and whether the election was unclean.

    Clean: the first replica, in replica order, that is in the ISR and live;
    replica order (not ISR order) so that leadership lands on the preferred
    leader when it can. If there is none and ``unclean_allowed``
    (``unclean.leader.election.enable``), the first live replica, which may
    lack committed records, so the result says ``was_unclean=True`` and the
    caller must reset the ISR to that leader alone. Otherwise, or if no
    replica is live, ``(NO_LEADER, False)``: the partition goes offline
    until an ISR member comes back.
    """
    in_sync = set(isr)
    for replica in replicas:
        if replica in in_sync and replica in live_brokers:
            return replica, False
    if unclean_allowed:
        for replica in replicas:
            if replica in live_brokers:
                return replica, True
    return NO_LEADER, False


def preferred_leader_election(
    replicas: Sequence[int],
    isr: Sequence[int],
    live_brokers: Collection[int],
    current_leader: int,
) -> int | None:
    """The preferred leader (first replica) if leadership should move to it
    now: it is live, in the ISR, and not already the leader. None means no
    change; a preferred leader that is not in sync is never forced in, since
    that would be an unclean election."""
    if not replicas:
        return None
    preferred = replicas[0]
    if preferred == current_leader or preferred not in live_brokers or preferred not in isr:
        return None
    return preferred


def isr_after_fencing(isr: Sequence[int], fenced_broker: int) -> list[int]:
    """The ISR once ``fenced_broker`` is fenced: the same members in the same
    order without it, except that the last member stays even when fenced.

    Why keep it: an empty ISR would forget which replica holds every
    committed record. Keeping the last member lets the partition come back
    with a clean election when that broker returns (the partition is
    leaderless meanwhile unless an unclean election is allowed).
    Kafka's controller does the same without eligible leader replicas
    (KIP-966): it never writes an empty ISR. With them (the default, see
    ``kraft.controller._isr_without``) the last member joins the ELR instead.
    """
    remaining = [broker for broker in isr if broker != fenced_broker]
    return remaining if remaining else list(isr)


def _check_placement_request(
    brokers: Sequence[BrokerInfo],
    num_partitions: int,
    replication_factor: int,
    existing_replica_counts: Mapping[int, int] | None,
    existing_leader_counts: Mapping[int, int] | None,
) -> None:
    """Raise the error ``place_replicas`` documents for a bad request."""
    broker_ids = [broker.broker_id for broker in brokers]
    if len(set(broker_ids)) != len(broker_ids):
        raise ValueError(f"duplicate broker ids in {sorted(broker_ids)}")
    for counts in (existing_replica_counts or {}, existing_leader_counts or {}):
        negative = {broker: count for broker, count in counts.items() if count < 0}
        if negative:
            raise ValueError(f"negative existing counts {negative}")
    if num_partitions < 1:
        raise InvalidPartitionsError(
            f"number of partitions must be at least 1, not {num_partitions}")
    if replication_factor < 1:
        raise InvalidReplicationFactorError(
            f"replication factor must be at least 1, not {replication_factor}")
    if not brokers:
        raise InvalidReplicationFactorError(
            f"replication factor {replication_factor} is larger than the 0 available brokers"
            " (no broker can take replicas)")
    if replication_factor > len(brokers):
        raise InvalidReplicationFactorError(
            f"replication factor {replication_factor} is larger than the"
            f" {len(brokers)} available brokers")


class _ClusterLoad:
    """The replica and leader totals of every candidate broker while one
    ``place_replicas`` call runs; ``place_partition`` adds to them.

    Invariants (``check_invariants``):
      - ``replica_total[b]`` is b's existing replica count plus the replicas
        placed on it by this call; ``leader_total[b]`` likewise for leaders;
      - ``rack_replica_total[r] == sum(replica_total[b] for b in rack r)``.
    """

    def __init__(self, brokers: Sequence[BrokerInfo],
                 existing_replica_counts: Mapping[int, int],
                 existing_leader_counts: Mapping[int, int]) -> None:
        # Every choice key ends in the broker id, so no result depends on
        # the order of ``brokers``; sorting only makes the state easy to read.
        self.broker_ids = sorted(broker.broker_id for broker in brokers)
        self.rack_of = {broker.broker_id: broker.rack if broker.rack is not None else UNRACKED
                        for broker in brokers}
        self.rack_size: dict[str, int] = {}
        for rack in self.rack_of.values():
            self.rack_size[rack] = self.rack_size.get(rack, 0) + 1
        self.replica_total = {b: existing_replica_counts.get(b, 0) for b in self.broker_ids}
        self.leader_total = {b: existing_leader_counts.get(b, 0) for b in self.broker_ids}
        self.rack_replica_total = {rack: 0 for rack in self.rack_size}
        for broker, total in self.replica_total.items():
            self.rack_replica_total[self.rack_of[broker]] += total

    @property
    def rack_count(self) -> int:
        return len(self.rack_size)

    def place_partition(self, replication_factor: int, racks_required: int) -> list[int]:
        """Choose one partition's replicas (leader first) and count them."""
        leader = min(self.broker_ids, key=self._leader_key)
        replicas = [leader]
        racks_used = {self.rack_of[leader]}
        self._add(leader, is_leader=True)
        for slot in range(1, replication_factor):
            slots_left = replication_factor - slot  # including this one
            must_add_rack = racks_required - len(racks_used) >= slots_left
            eligible = [b for b in self.broker_ids
                        if b not in replicas
                        and not (must_add_rack and self.rack_of[b] in racks_used)]
            assert eligible, "replication_factor <= brokers leaves a candidate for every slot"
            follower = min(eligible, key=self._follower_key)
            replicas.append(follower)
            racks_used.add(self.rack_of[follower])
            self._add(follower, is_leader=False)
        assert len(racks_used) >= racks_required
        return replicas

    def check_invariants(self) -> None:
        for rack in self.rack_size:
            assert self.rack_replica_total[rack] == sum(
                self.replica_total[b] for b in self.broker_ids if self.rack_of[b] == rack)

    def _rack_load(self, broker: int) -> Fraction:
        """Replicas per broker in ``broker``'s rack (exact, so ties are ties)."""
        rack = self.rack_of[broker]
        return Fraction(self.rack_replica_total[rack], self.rack_size[rack])

    def _leader_key(self, broker: int) -> tuple:
        return (self.leader_total[broker], self.replica_total[broker],
                self._rack_load(broker), broker)

    def _follower_key(self, broker: int) -> tuple:
        return (self.replica_total[broker], self._rack_load(broker),
                -self.leader_total[broker], broker)

    def _add(self, broker: int, *, is_leader: bool) -> None:
        self.replica_total[broker] += 1
        self.rack_replica_total[self.rack_of[broker]] += 1
        if is_leader:
            self.leader_total[broker] += 1
