"""One partition hosted by this broker: its log and its replica role.

A ``Partition`` is plain synchronous state, changed only by the
``ReplicaManager`` (which follows the metadata image) and by appends. Roles::

    FOLLOWER --image names this broker leader (new epoch)--> LEADER
    LEADER   --image names another leader or none-----------> FOLLOWER
    any      --topic deleted or replica removed------------> (log deleted)

The high watermark is the offset below which records are committed: the
smallest log end offset over the ISR. Until followers replicate (the
replication issue), only a leader that is its partition's sole ISR member can
advance it; a leader with other ISR members keeps accepted records
uncommitted, never visible to consumers.

Invariants (``check_invariants``):
  - ``log_start_offset <= high_watermark <= log_end_offset``;
  - ``high_watermark`` never decreases while this broker leads in one epoch.
"""

from __future__ import annotations

import enum

from storage.log import AppendInfo, Log
from storage.manager import TopicPartition


class Role(enum.Enum):
    LEADER = "leader"
    FOLLOWER = "follower"


class Partition:
    def __init__(self, tp: TopicPartition, log: Log, broker_id: int, topic_id: str) -> None:
        self.tp = tp
        self.log = log
        self.broker_id = broker_id
        self.topic_id = topic_id
        self.role = Role.FOLLOWER
        self.leader_id = -1
        self.leader_epoch = -1
        self.partition_epoch = -1
        self.replicas: list[int] = []
        self.isr: list[int] = []
        # Log end offsets of the other ISR members, as they report them.
        self.replica_end_offsets: dict[int, int] = {}
        # Invariant: log_start_offset <= high_watermark <= log_end_offset.
        self.high_watermark = log.log_start_offset

    # -- role changes (ReplicaManager) ----------------------------------------
    def update(self, leader: int, leader_epoch: int, partition_epoch: int,
               replicas: list[int], isr: list[int]) -> bool:
        """Take the registration from the metadata image; True when this
        broker just became the leader (a new epoch, or a first role). An
        older registration than the one held (an image replaying history) is
        ignored: epochs never go back."""
        if (leader_epoch, partition_epoch) < (self.leader_epoch, self.partition_epoch):
            return False
        became_leader = leader == self.broker_id and (
            self.role is not Role.LEADER or leader_epoch != self.leader_epoch)
        self.leader_id = leader
        self.leader_epoch = leader_epoch
        self.partition_epoch = partition_epoch
        self.replicas = list(replicas)
        self.isr = list(isr)
        self.role = Role.LEADER if leader == self.broker_id else Role.FOLLOWER
        if became_leader:
            self.replica_end_offsets = {}
        self.maybe_advance_high_watermark()
        return became_leader

    @property
    def is_leader(self) -> bool:
        return self.role is Role.LEADER

    # -- data ----------------------------------------------------------------
    @property
    def log_end_offset(self) -> int:
        return self.log.log_end_offset

    @property
    def log_start_offset(self) -> int:
        return self.log.log_start_offset

    def append_as_leader(self, records) -> AppendInfo:
        assert self.is_leader, f"{self.tp}: append on a follower"
        info = self.log.append(records, self.leader_epoch)
        self.maybe_advance_high_watermark()
        return info

    def maybe_advance_high_watermark(self) -> bool:
        """Move the high watermark up to the smallest log end offset over the
        ISR (this broker's own counts for itself); never down. True if it
        moved."""
        if not self.is_leader:
            return False
        ends = [self.log_end_offset if member == self.broker_id
                else self.replica_end_offsets.get(member, self.high_watermark)
                for member in self.isr]
        if not ends:
            return False
        candidate = min(ends)
        # Retention can pass the high watermark only for committed data.
        candidate = max(candidate, self.log_start_offset)
        if candidate > self.high_watermark:
            self.high_watermark = candidate
            return True
        if self.high_watermark < self.log_start_offset:
            self.high_watermark = self.log_start_offset
            return True
        return False

    def check_invariants(self) -> None:
        assert self.log_start_offset <= self.high_watermark <= self.log_end_offset, (
            f"{self.tp}: log start {self.log_start_offset}, high watermark "
            f"{self.high_watermark}, log end {self.log_end_offset}")

    def describe(self) -> dict:
        return {"partition": self.tp.partition, "role": self.role.value,
                "leader": self.leader_id, "leader_epoch": self.leader_epoch,
                "log_start_offset": self.log_start_offset,
                "high_watermark": self.high_watermark,
                "log_end_offset": self.log_end_offset,
                "size_bytes": self.log.size_bytes,
                "segments": len(self.log.segments)}
