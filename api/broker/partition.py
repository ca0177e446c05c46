"""One partition hosted by this broker: its log, its role, and the replication
state a leader keeps about its followers. A pure core: no I/O beyond the log,
time passed in as ``now_ms``; the broker's ``ReplicationCore``
(``replication.py``) owns every ``Partition`` and asks it what to do. Roles::

    FOLLOWER --image names this broker leader (new epoch)--> LEADER
    LEADER   --image names another leader or none-----------> FOLLOWER
    any      --topic deleted or replica removed------------> (log deleted)

**Leader.** Each follower's fetch says where its log ends (the offset it asks
for, once the fetch is validated against the leader's epochs, KIP-320) and
whether it was caught up: a fetch at the leader's log end, or at the log end
the leader had at the follower's previous fetch, means the follower was in
sync at that time (Kafka's ``lastCaughtUpTimeMs``). The high watermark is the
smallest log end offset over the ISR (followers not heard from count at the
current high watermark), and only ever moves up while this broker leads.

ISR changes are proposed here and made by the controller (AlterPartition,
checked against the partition epoch). While a proposal is in flight no other
is made, and the high watermark counts the *maximal* ISR (the current one plus
any member being added, KIP-497), so it never commits a record that a member
of either the old or the new ISR lacks:

  - shrink: followers not caught up for ``replica.lag.time.max.ms``;
  - expand: a replica outside the ISR whose log end reached both the high
    watermark and the start of this leader's epoch (it then holds every
    record this leader may have acknowledged), unless the leader is still
    recovering from an unclean election.

An expansion refused or lost (the shell's answer None) may have been applied
all the same: its answer lost, or a retried copy refused after the first was
applied. Its new members stay in the maximal ISR ("unconfirmed") until an
answer or the image shows a newer partition epoch, or, once they lag, the
controller answers a proposal of the unchanged ISR at this partition epoch.
A replica outside the ISR counts as caught up only on a fetch made since the
ISR's members last changed or a proposal was refused, lost or confirmed: it
may have restarted with less data since an older fetch. And every fetch
names the follower's broker epoch (KIP-903): caught-up state holds for that
registration only, a replica is proposed only if it matches the one in the
image, and the proposal names it, so the controller refuses a member that
registered again (restarted, maybe without its unflushed tail) while the
proposal was on its way.

**Follower.** Fetches from the leader at its log end, naming the epoch of its
last batch; a leader whose log differs answers with the diverging epoch and
where that epoch ends, and the follower truncates to the smaller of that and
its own end for the epoch (KIP-101, KIP-279, KIP-320) — never trusting its
own high watermark. Its high watermark is ``min(leader's, own log end)``.

Invariants (``check_invariants``):
  - ``log_start_offset <= high_watermark <= log_end_offset``;
  - ``high_watermark`` never decreases while this broker leads in one epoch;
  - a pending ISR proposal contains the leader.
"""

from __future__ import annotations

import dataclasses
import enum
import logging
from collections.abc import Mapping

from kraft.records import LEADER_RECOVERED, LEADER_RECOVERING
from storage.epoch_cache import UNDEFINED_EPOCH
from storage import cleaner
from storage.batch import HEADER_SIZE, parse_header
from storage.log import AppendInfo, Log
from storage.manager import TopicPartition

logger = logging.getLogger(__name__)


class Role(enum.Enum):
    LEADER = "leader"
    FOLLOWER = "follower"


# The members by plain names: on 3.11 reading ``Role.LEADER`` costs 6x a
# global's read, and the role is looked at per partition of every request.
LEADER, FOLLOWER = Role.LEADER, Role.FOLLOWER


@dataclasses.dataclass
class ReplicaState:
    """What a leader knows of one follower, from its fetches."""

    # Offset the follower's log ends at, as its last validated fetch said;
    # -1 until it has fetched in this leader epoch.
    log_end_offset: int = -1
    # When the follower was last known to hold everything the leader had.
    last_caught_up_ms: int = 0
    # The time of its previous fetch and the leader's log end then.
    last_fetch_ms: int = 0
    leader_end_offset_at_last_fetch: int = 0
    # The broker epoch (registration) the follower fetched with, KIP-903:
    # -1 until it names one. Its caught-up state holds for that
    # incarnation only, and an ISR expansion names it.
    broker_epoch: int = -1


@dataclasses.dataclass(frozen=True)
class IsrProposal:
    """An AlterPartition to send: what the leader asks the controller for."""

    tp: TopicPartition
    leader_epoch: int
    partition_epoch: int
    new_isr: list[int]
    leader_recovery_state: int
    reason: str
    #: Per member of ``new_isr``, the broker epoch the leader saw it fetch
    #: with (-1: none known, and -1 for the leader itself): the controller
    #: refuses to add a member registered since (KIP-903).
    broker_epochs: tuple[int, ...] = ()


class Partition:
    def __init__(self, tp: TopicPartition, log: Log, broker_id: int, topic_id: str,
                 high_watermark: int | None = None) -> None:
        self.tp = tp
        self.log = log
        self.broker_id = broker_id
        self.topic_id = topic_id
        #: KIP-890 verification guards: producer id -> the epoch the
        #: transaction coordinator confirmed has this partition in its open
        #: transaction. A transaction's first write here needs one; its
        #: marker removes it (so a write that was verified before the
        #: transaction ended cannot open a hanging one).
        self.txn_guards: dict[int, int] = {}
        self.role = FOLLOWER
        #: ``role is LEADER``, kept beside it (asked per partition of each request).
        self.is_leader = False
        self.leader_id = -1
        self.leader_epoch = -1
        self.partition_epoch = -1
        self.replicas: list[int] = []
        self.isr: list[int] = []
        self.leader_recovery_state = LEADER_RECOVERED
        # The topic's min.insync.replicas (set by the ReplicaManager).
        self.min_insync_replicas = 1
        # Leader only: the followers' states, and the log end offset when this
        # broker became leader (its first offset in its own epoch).
        self.replica_states: dict[int, ReplicaState] = {}
        self.leader_epoch_start_offset = -1
        # Leader only: the ISR asked of the controller and not yet answered.
        # Invariant: contains broker_id when set.
        self.pending_isr: list[int] | None = None
        # Leader only: members a refused or lost expansion would have added,
        # at the current partition epoch. Invariant: a subset of replicas.
        self.unconfirmed_isr: list[int] = []
        # Invariant: log_start_offset <= high_watermark <= log_end_offset.
        # A checkpointed value past the recovered log end is clamped.
        start = log.log_start_offset
        self.high_watermark = min(max(start, high_watermark or 0), log.log_end_offset)

    # -- role changes (ReplicaManager) ----------------------------------------
    def update(self, leader: int, leader_epoch: int, partition_epoch: int,
               replicas: list[int], isr: list[int], now_ms: int = 0,
               leader_recovery_state: int = LEADER_RECOVERED) -> bool:
        """Take the registration from the metadata image; True when this
        broker just became the leader (a new epoch, or a first role). An
        older registration than the one held (an image replaying history) is
        ignored: epochs never go back."""
        if (leader_epoch, partition_epoch) < (self.leader_epoch, self.partition_epoch):
            return False
        became_leader = leader == self.broker_id and (
            self.role is not LEADER or leader_epoch != self.leader_epoch)
        members_changed = sorted(isr) != sorted(self.isr)
        if partition_epoch != self.partition_epoch:
            self.pending_isr = None  # answered, or overtaken by another change
            self.unconfirmed_isr = []  # the image says what became of them
        self.leader_id = leader
        self.leader_epoch = leader_epoch
        self.partition_epoch = partition_epoch
        self.replicas = list(replicas)
        self.isr = list(isr)
        self.leader_recovery_state = leader_recovery_state
        self.is_leader = leader == self.broker_id
        self.role = LEADER if self.is_leader else FOLLOWER
        if became_leader:
            self._become_leader(now_ms)
        elif not self.is_leader:
            self.replica_states = {}
        if self.is_leader:
            # Replicas added by a reassignment get a state; removed ones lose it.
            self.replica_states = {
                r: self.replica_states.get(r) or ReplicaState(last_caught_up_ms=now_ms)
                for r in self.replicas if r != self.broker_id}
            if members_changed:
                self._forget_fetches_outside_isr()
        self.maybe_advance_high_watermark()
        return became_leader

    def _become_leader(self, now_ms: int) -> None:
        # Every follower starts unheard-of; ISR members get a full lag
        # allowance from now before they can be shrunk out (Kafka does too).
        self.replica_states = {r: ReplicaState(last_caught_up_ms=now_ms)
                               for r in self.replicas if r != self.broker_id}
        self.pending_isr = None
        self.leader_epoch_start_offset = self.log_end_offset
        # The epoch starts at the log end even before it holds a record, so a
        # follower with data of an epoch between the previous one and this
        # one learns where to truncate (Kafka's makeLeader does the same).
        self.log.epoch_cache.assign(self.leader_epoch, self.log_end_offset)

    # -- data ----------------------------------------------------------------
    @property
    def log_end_offset(self) -> int:
        return self.log.log_end_offset

    @property
    def log_start_offset(self) -> int:
        return self.log.log_start_offset

    @property
    def last_stable_offset(self) -> int:
        """The LSO: the high watermark, or the first offset of the oldest
        open transaction if that is lower."""
        first = self.log.first_unstable_offset
        return self.high_watermark if first is None else min(first, self.high_watermark)

    def needs_verification(self, records) -> tuple[int, int] | None:
        """``(producer id, epoch)`` of a transactional batch that would open
        its producer's transaction here, else None."""
        header = parse_header(records) if len(records) >= HEADER_SIZE else None
        if header is None or not header.is_transactional or header.producer_id < 0:
            return None
        entry = self.log.producer_state.producers.get(header.producer_id)
        if entry is not None and entry.txn_first_offset >= 0 and \
                entry.epoch == header.producer_epoch:
            return None
        return header.producer_id, header.producer_epoch

    def append_as_leader(self, records, coordinator: bool = False) -> AppendInfo:
        assert self.is_leader, f"{self.tp}: append on a follower"
        info = self.log.append(records, self.leader_epoch, coordinator=coordinator)
        self.maybe_advance_high_watermark()
        return info

    # -- leader: high watermark and followers ------------------------------------
    @property
    def maximal_isr(self) -> list[int]:
        """The ISR the high watermark must respect: the current one plus any
        member a pending proposal adds or an unconfirmed one may have added."""
        extra = [r for r in (self.pending_isr or []) + self.unconfirmed_isr if r not in self.isr]
        return self.isr + list(dict.fromkeys(extra))

    def maybe_advance_high_watermark(self) -> bool:
        """Move the high watermark up to the smallest log end offset over the
        maximal ISR (this broker's own counts for itself); never down. True
        if it moved.

        Not while the ISR is below min.insync.replicas (KIP-966's strict
        rule): a replica that leaves the ISR then holds every committed
        record for as long as it lasts, which makes it an eligible leader
        replica. Records written with acks=0 or 1 meanwhile become visible
        once the ISR is back."""
        if not self.is_leader or len(self.isr) < self.min_insync_replicas:
            return False
        ends = [self.log_end_offset]
        for member in self.maximal_isr:
            if member != self.broker_id:
                state = self.replica_states.get(member)
                known = state.log_end_offset if state is not None else -1
                ends.append(known if known >= 0 else self.high_watermark)
        # Retention can pass the high watermark only for committed data.
        candidate = max(min(ends), self.log_start_offset)
        if candidate > self.high_watermark:
            self.high_watermark = candidate
            return True
        return False

    def diverging_epoch(self, fetch_offset: int, last_fetched_epoch: int
                        ) -> tuple[int, int] | None:
        """For a follower's fetch: ``(epoch, end_offset)`` if its log differs
        from this one at or before ``fetch_offset`` (it must truncate), else
        None. A follower that names no epoch (empty log) is not checked."""
        if last_fetched_epoch < 0:
            return None
        epoch, end_offset = self.log.end_offset_for_epoch(last_fetched_epoch)
        if epoch != last_fetched_epoch or end_offset < fetch_offset:
            return epoch, end_offset
        return None

    def record_follower_fetch(self, replica_id: int, fetch_offset: int, now_ms: int,
                              broker_epoch: int = -1) -> bool:
        """A validated fetch from follower ``replica_id`` at ``fetch_offset``
        (its log end), sent by its registration ``broker_epoch`` (-1: not
        named). Updates its state; True if the high watermark moved."""
        state = self.replica_states.get(replica_id)
        if state is None or not self.is_leader:
            return False
        leader_end = self.log_end_offset
        # A fetch of another incarnation says nothing of this one's past.
        same_incarnation = broker_epoch == state.broker_epoch
        if fetch_offset >= leader_end:
            state.last_caught_up_ms = max(state.last_caught_up_ms, now_ms)
        elif same_incarnation and fetch_offset >= state.leader_end_offset_at_last_fetch:
            state.last_caught_up_ms = max(state.last_caught_up_ms, state.last_fetch_ms)
        state.broker_epoch = broker_epoch
        state.log_end_offset = fetch_offset
        state.last_fetch_ms = now_ms
        state.leader_end_offset_at_last_fetch = leader_end
        return self.maybe_advance_high_watermark()

    def isr_proposal(self, now_ms: int, lag_time_max_ms: int,
                     eligible: Mapping[int, int] | None = None) -> IsrProposal | None:
        """The AlterPartition this leader should send now, if any: finish an
        unclean leader's recovery, shrink lagging followers out, or expand
        caught-up replicas in — only those in ``eligible`` (live, unfenced
        brokers and their registered broker epochs; None: any) whose
        fetches named that registration: a fetch that names none (a broker
        between registrations) proves nothing about the incarnation the
        controller would add. None while a proposal is in flight."""
        if not self.is_leader or self.pending_isr is not None:
            return None
        if self.leader_recovery_state == LEADER_RECOVERING:
            return self._propose(list(self.isr), "recovered from an unclean election",
                                 LEADER_RECOVERED)
        # Lagging unconfirmed members make this a proposal of the unchanged
        # ISR, whose answer confirms they were not added.
        lagging = [r for r in self.isr + self.unconfirmed_isr if r != self.broker_id
                   and now_ms - self._state(r).last_caught_up_ms > lag_time_max_ms]
        if lagging:
            return self._propose([r for r in self.isr if r not in lagging],
                                 f"replicas {lagging} lag more than {lag_time_max_ms} ms")
        joining = [r for r in self.replicas if r not in self.isr and self._caught_up(r)
                   and (eligible is None or self._state(r).broker_epoch == eligible.get(r, -2))]
        if joining:
            return self._propose(self.isr + joining, f"replicas {joining} caught up")
        return None

    def _state(self, replica_id: int) -> ReplicaState:
        return self.replica_states.get(replica_id) or ReplicaState()

    def _caught_up(self, replica_id: int) -> bool:
        end = self._state(replica_id).log_end_offset
        return end >= self.high_watermark and end >= self.leader_epoch_start_offset

    def _propose(self, new_isr: list[int], reason: str,
                 recovery_state: int | None = None) -> IsrProposal:
        assert self.broker_id in new_isr, f"{self.tp}: proposed ISR {new_isr} lacks the leader"
        self.pending_isr = list(new_isr)
        return IsrProposal(self.tp, self.leader_epoch, self.partition_epoch, list(new_isr),
                           self.leader_recovery_state if recovery_state is None
                           else recovery_state, reason,
                           tuple(-1 if r == self.broker_id else self._state(r).broker_epoch
                                 for r in new_isr))

    def isr_change_done(self, proposal: IsrProposal, answer: dict | None,
                        refused: bool = False) -> bool:
        """The controller's answer to ``proposal`` (None: refused or lost).
        ``refused`` means the controller certainly did not apply it (it
        refused the request at a check that comes before any write, such as
        an ineligible replica), so its new members need not count.
        An accepted change is applied at once, without waiting for the image
        to show it; True if it was, or if an answer confirming the ISR as it
        is moved the high watermark."""
        if (self.pending_isr != proposal.new_isr or self.leader_epoch != proposal.leader_epoch
                or self.partition_epoch != proposal.partition_epoch):
            return False  # answers an earlier proposal, or a newer registration arrived
        self.pending_isr = None
        if refused:
            return False
        if (answer is not None and answer.get("leader_epoch") == self.leader_epoch
                and answer.get("partition_epoch", -1) > self.partition_epoch + 1):
            # The same batch changed more (a reassignment completed: other
            # replicas, maybe another leader): the image will say what.
            self.unconfirmed_isr += [r for r in proposal.new_isr
                                     if r not in self.isr and r not in self.unconfirmed_isr]
            return False
        if (answer is not None and answer.get("leader_epoch") == self.leader_epoch
                and answer.get("partition_epoch") == self.partition_epoch
                and answer.get("isr") == self.isr):
            self.unconfirmed_isr = []  # the controller holds this ISR at this epoch
            self._forget_fetches_outside_isr()
            return self.maybe_advance_high_watermark()
        if (answer is None or answer.get("leader_epoch") != self.leader_epoch
                or answer.get("partition_epoch", -1) <= self.partition_epoch):
            self.unconfirmed_isr += [r for r in proposal.new_isr
                                     if r not in self.isr and r not in self.unconfirmed_isr]
            self._forget_fetches_outside_isr()
            return False
        self.unconfirmed_isr = []
        members_changed = sorted(answer["isr"]) != sorted(self.isr)
        self.isr = list(answer["isr"])
        if members_changed:
            self._forget_fetches_outside_isr()
        self.partition_epoch = answer["partition_epoch"]
        self.leader_recovery_state = answer.get("leader_recovery_state",
                                                self.leader_recovery_state)
        self.maybe_advance_high_watermark()
        return True

    def _forget_fetches_outside_isr(self) -> None:
        """Until their next fetch the log ends of replicas outside the ISR
        are unknown: they cannot join it, and any the maximal ISR still
        counts hold the high watermark where it is."""
        for replica_id, state in self.replica_states.items():
            if replica_id not in self.isr:
                state.log_end_offset = -1

    # -- follower --------------------------------------------------------------
    @property
    def last_fetched_epoch(self) -> int:
        """The epoch of this replica's last batch (what its fetches name)."""
        return self.log.latest_epoch

    def truncation_offset(self, leader_epoch: int, leader_end_offset: int) -> int:
        """Where to cut this log given a leader's diverging ``(epoch, end)``:
        the smaller of the leader's end for that epoch and this log's end for
        the largest epoch it has at or below it (another round follows if
        that still diverges)."""
        if leader_epoch == UNDEFINED_EPOCH or leader_end_offset < 0:
            # The leader holds none of our epochs: keep nothing it lacks.
            return self.log_start_offset
        epoch, end_offset = self.log.end_offset_for_epoch(leader_epoch)
        if epoch == UNDEFINED_EPOCH:
            return min(leader_end_offset, self.log_start_offset)
        return min(leader_end_offset, end_offset)

    def truncate_to(self, offset: int, reason: str) -> None:
        """Drop records at and above ``offset``; loud when committed-looking
        records (below this replica's high watermark) go."""
        end = self.log_end_offset
        if offset >= end:
            # Nothing to cut, but an epoch that starts at the log end holds no
            # record; forgetting it lets the next fetch name an epoch the
            # leader can vouch for instead of asking about this one forever.
            self.log.epoch_cache.truncate_from_end(end)
            return
        if offset < self.high_watermark:
            logger.warning("%s: truncating records [%d, %d) below this replica's high watermark "
                           "%d (%s): they were lost by an unclean leader election",
                           self.tp, offset, end, self.high_watermark, reason)
        else:
            logger.info("%s: truncating uncommitted records [%d, %d) (%s)", self.tp, offset,
                        end, reason)
        self.log.truncate_to(offset)
        self.high_watermark = min(self.high_watermark, self.log_end_offset)

    def restart_at(self, offset: int) -> None:
        """Empty the log and continue at ``offset`` (the leader's log start
        passed this replica's log end)."""
        logger.info("%s: restarting the log at the leader's log start %d", self.tp, offset)
        self.log.truncate_fully_and_start_at(offset)
        self.high_watermark = offset

    def append_as_follower(self, records, leader_high_watermark: int) -> AppendInfo | None:
        info = self.log.append_as_follower(records) if records else None
        self.update_follower_high_watermark(leader_high_watermark)
        return info

    def update_follower_high_watermark(self, leader_high_watermark: int) -> bool:
        if self.is_leader:
            return False
        candidate = min(leader_high_watermark, self.log_end_offset)
        if candidate > self.high_watermark:
            self.high_watermark = candidate
            return True
        return False

    # -- inspection --------------------------------------------------------------
    @property
    def under_replicated(self) -> bool:
        return self.is_leader and len(self.isr) < len(self.replicas)

    @property
    def under_min_isr(self) -> bool:
        return self.is_leader and len(self.isr) < self.min_insync_replicas

    def check_invariants(self) -> None:
        assert self.log_start_offset <= self.high_watermark <= self.log_end_offset, (
            f"{self.tp}: log start {self.log_start_offset}, high watermark "
            f"{self.high_watermark}, log end {self.log_end_offset}")
        assert self.pending_isr is None or self.broker_id in self.pending_isr
        assert set(self.unconfirmed_isr) <= set(self.replicas), self.unconfirmed_isr

    def describe(self, now_ms: int | None = None, producers: bool = False) -> dict:
        """This replica as the JSON inspection endpoints show it; with
        ``producers``, the idempotent producers its log knows."""
        entry = {"partition": self.tp.partition, "role": self.role.value,
                 "leader": self.leader_id, "leader_epoch": self.leader_epoch,
                 "log_start_offset": self.log_start_offset,
                 "high_watermark": self.high_watermark,
                 "last_stable_offset": self.last_stable_offset,
                 "log_end_offset": self.log_end_offset,
                 "size_bytes": self.log.size_bytes,
                 "segments": len(self.log.segments)}
        if self.log.config.compact:
            entry["cleaner"] = self._describe_cleaner(now_ms)
        if self.is_leader:
            entry["replica_states"] = [self._describe_replica(r, now_ms) for r in self.replicas]
        if producers:
            entry["producers"] = self.log.producer_state.describe()
        return entry

    def _describe_cleaner(self, now_ms: int | None) -> dict:
        """How far compaction got in this replica's log (each replica
        cleans its own)."""
        now_ms = self.log.clock() if now_ms is None else now_ms
        found = cleaner.cleanability(self.log, now_ms, self.high_watermark)
        state = self.log.cleaner_state
        return {"cleanable_ratio": round(found.dirty_ratio, 4),
                "first_dirty_offset": found.first_dirty,
                "clean_bytes": found.clean_bytes, "dirty_bytes": found.dirty_bytes,
                "last_clean_ms": state.last_clean_ms if state.last_clean_ms >= 0 else None}

    def _describe_replica(self, replica_id: int, now_ms: int | None) -> dict:
        if replica_id == self.broker_id:
            return {"broker": replica_id, "log_end_offset": self.log_end_offset, "lag": 0,
                    "in_isr": replica_id in self.isr, "caught_up_ms_ago": 0}
        state = self._state(replica_id)
        end = state.log_end_offset
        return {"broker": replica_id, "log_end_offset": end if end >= 0 else None,
                "lag": self.log_end_offset - end if end >= 0 else None,
                "in_isr": replica_id in self.isr,
                "caught_up_ms_ago": (now_ms - state.last_caught_up_ms
                                     if now_ms is not None and state.last_caught_up_ms else None)}
