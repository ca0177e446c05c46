"""The consumer group coordinator's pure core (the KIP-848 consumer protocol).

Pure: no I/O, no clocks, no asyncio. Every call gets the time as ``now_ms``
(and the cluster's topics as ``{topic: partition count}`` where it needs
them), and every call that changes state returns the records
(``records.py``) that express the change. The shell appends those records to
``__consumer_offsets`` before it answers; a coordinator that takes over
replays them (``replay``), then calls ``loaded(now_ms)`` to start everyone's
session afresh. Replaying the records of any sequence of calls rebuilds the
same state (timers aside), which ``check_invariants`` helps keep honest: it
fails if any state differs from what the records written so far say.

The protocol, in short (names as in KIP-848):

  - Members heartbeat. A heartbeat with epoch 0 joins (a new member id is
    given out), -1 leaves, -2 leaves for now (static members only: the
    member's slot and assignment are kept for one session so the same
    ``instance_id`` can come back to them).
  - The *group epoch* counts changes of what the assignment depends on:
    membership, subscriptions, the chosen assignor, the partition counts of
    subscribed topics. Each bump recomputes the *target assignment* at once
    (the assignor is synchronous), so ``assignment_epoch == group_epoch``
    after every call; the ``assigning`` state exists only to name the gap an
    asynchronous assignor would leave.
  - Each member converges on its target through its *member epoch*. A
    partition leaves a member first: when the target no longer gives it a
    partition, the partition moves from ``assigned`` to
    ``pending_revocation`` and the member keeps its old epoch until a
    heartbeat's ``owned_partitions`` shows it released; only then does the
    member advance to the assignment epoch and take target partitions, and
    only those no other member holds (assigned or pending). So a partition
    is never held by two members, even while the group moves.
  - Members that stop heartbeating for their session timeout, or that do
    not release revoked partitions within their rebalance timeout, are
    removed by ``tick`` (their partitions become free; the group epoch moves).

Committed offsets live in the same groups; a commit must come from a member
at its current (or previous: a lost response) epoch, or, when the group has
no members, from an admin/simple client (member id "" and epoch -1).
"""

from __future__ import annotations

import functools
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import regex

from api.broker.groups.assignors import DEFAULT_ASSIGNOR, MemberSpec
from api.broker.groups.assignors import assignor as find_assignor
from api.broker.groups.records import (GroupMetadataRecord, GroupTombstone, MemberRecord,
                                       MemberTombstone, OffsetCommitRecord, OffsetTombstone, Record,
                                       TargetAssignmentRecord, TargetAssignmentTombstone)
from protocol import TopicPartition

#: Member epochs a heartbeat may carry besides the member's own.
JOIN_EPOCH = 0
LEAVE_EPOCH = -1
STATIC_LEAVE_EPOCH = -2
#: The epoch an admin or simple consumer commits with (with member id "").
ADMIN_COMMIT_EPOCH = -1

#: describe() fields that depend on time rather than on the records.
TIMING_FIELDS = frozenset({"session_remaining_ms", "revocation_remaining_ms"})

UNKNOWN_MEMBER_ID = "UNKNOWN_MEMBER_ID"
FENCED_MEMBER_EPOCH = "FENCED_MEMBER_EPOCH"
STALE_MEMBER_EPOCH = "STALE_MEMBER_EPOCH"
UNRELEASED_INSTANCE_ID = "UNRELEASED_INSTANCE_ID"
INVALID_REQUEST = "INVALID_REQUEST"
GROUP_ID_NOT_FOUND = "GROUP_ID_NOT_FOUND"
NON_EMPTY_GROUP = "NON_EMPTY_GROUP"
UNSUPPORTED_ASSIGNOR = "UNSUPPORTED_ASSIGNOR"
GROUP_MAX_SIZE_REACHED = "GROUP_MAX_SIZE_REACHED"
INVALID_SESSION_TIMEOUT = "INVALID_SESSION_TIMEOUT"
CODES = frozenset({UNKNOWN_MEMBER_ID, FENCED_MEMBER_EPOCH, STALE_MEMBER_EPOCH,
                   UNRELEASED_INSTANCE_ID, INVALID_REQUEST, GROUP_ID_NOT_FOUND, NON_EMPTY_GROUP,
                   UNSUPPORTED_ASSIGNOR, GROUP_MAX_SIZE_REACHED})


#: How long one topic-name match of a member's regex may take. Python's own
#: ``re`` backtracks without limit (``(a+)+b`` against a long name of a's
#: takes seconds): the ``regex`` module's timeout keeps the broker responsive.
REGEX_MATCH_TIMEOUT_S = 0.01
#: A regex is tried against these at join time; too slow on any is refused.
REGEX_PROBES = ("a" * 40 + "!", "0" * 40 + "!", "_" * 40 + "!", "x-" * 20 + "!")


@functools.lru_cache(maxsize=1024)
def _compiled(pattern: str) -> Any:
    return regex.compile(pattern, flags=regex.VERSION0)


@functools.lru_cache(maxsize=65_536)
def regex_matches(pattern: str, topic: str) -> bool:
    """Whether ``topic`` wholly matches ``pattern``; a match that runs out of
    time counts as no match (it was refused at join; a topic name may still
    be worse than the probes)."""
    try:
        return _compiled(pattern).fullmatch(topic, timeout=REGEX_MATCH_TIMEOUT_S) is not None
    except TimeoutError:
        return False


def check_regex(pattern: str) -> None:
    """Raises for a pattern that does not compile, or that backtracks badly
    on simple names (``TimeoutError``)."""
    compiled = _compiled(pattern)
    for probe in REGEX_PROBES:
        compiled.fullmatch(probe, timeout=REGEX_MATCH_TIMEOUT_S)


class GroupError(Exception):
    """A request the coordinator refuses; ``code`` is Kafka's error name.

    Raised before any state changes: a refused call changes nothing and
    returns no records."""

    def __init__(self, code: str, message: str) -> None:
        assert code in CODES, code
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


class InvariantViolation(AssertionError):
    """check_invariants() found the core in a state it must never be in."""


@dataclass
class HeartbeatRequest:
    """One ConsumerGroupHeartbeat. ``None`` fields mean "unchanged since my
    last heartbeat" (on a join: "default"), as in KIP-848, so a steady
    member sends little."""

    member_id: str = ""                          # "" to join as a new member
    member_epoch: int = JOIN_EPOCH               # 0 join, -1 leave, -2 static leave, else own epoch
    instance_id: str | None = None               # static membership id
    rebalance_timeout_ms: int | None = None      # time allowed to release revoked partitions
    session_timeout_ms: int | None = None        # time allowed between heartbeats
    subscribed_topic_names: list[str] | None = None
    subscribed_topic_regex: str | None = None    # re.fullmatch over topic names; "" clears
    server_assignor: str | None = None           # "" clears the member's preference
    owned_partitions: list[TopicPartition] | None = None  # what the client holds now
    client_id: str | None = None
    client_host: str | None = None


@dataclass(frozen=True)
class HeartbeatResponse:
    member_id: str
    member_epoch: int
    heartbeat_interval_ms: int
    # The partitions the member may own now (sorted), or None if unchanged
    # since the last response. Owned partitions missing from it are to be
    # released (and the release shown in the next heartbeat's owned list).
    assignment: list[TopicPartition] | None


# ----------------------------------------------------------------------------
# state

class _Member:
    """One member as the coordinator sees it.

    Invariants (check_invariants):
      - ``assigned`` and ``pending_revocation`` are disjoint, and no
        partition is in two members' ``assigned | pending_revocation``;
      - ``assigned`` is within the member's target;
      - a member with pending revocations is behind: member_epoch <
        assignment_epoch, and it is not away;
      - away (left with -2): member_epoch == -2, previous_member_epoch holds
        the epoch it left at, nothing pending, and it has an instance_id;
      - otherwise 0 <= previous_member_epoch <= member_epoch <= assignment_epoch.
    """

    def __init__(self, member_id: str) -> None:
        self.member_id = member_id
        self.instance_id: str | None = None
        self.member_epoch = 0
        self.previous_member_epoch = 0
        self.subscribed_topic_names: tuple[str, ...] | None = None   # sorted, unique
        self.subscribed_topic_regex: str | None = None
        self.server_assignor: str | None = None
        self.rebalance_timeout_ms = 0
        self.session_timeout_ms = 0
        self.assigned: frozenset[TopicPartition] = frozenset()
        self.pending_revocation: frozenset[TopicPartition] = frozenset()
        self.client_id: str | None = None
        self.client_host: str | None = None
        # Timers and delivery bookkeeping: not persisted. None after a replay
        # until loaded()/tick() starts them afresh.
        self.last_heartbeat_ms: int | None = None
        self.revocation_deadline_ms: int | None = None
        # The assignment last sent to the client; None = unknown (send it).
        self.sent_assignment: frozenset[TopicPartition] | None = None

    @property
    def away(self) -> bool:
        """A static member that left with -2 and may come back."""
        return self.member_epoch == STATIC_LEAVE_EPOCH

    def record(self, group_id: str) -> MemberRecord:
        return MemberRecord(
            group_id=group_id, member_id=self.member_id, instance_id=self.instance_id,
            member_epoch=self.member_epoch, previous_member_epoch=self.previous_member_epoch,
            subscribed_topic_names=self.subscribed_topic_names,
            subscribed_topic_regex=self.subscribed_topic_regex,
            server_assignor=self.server_assignor,
            rebalance_timeout_ms=self.rebalance_timeout_ms,
            session_timeout_ms=self.session_timeout_ms,
            assigned=tuple(sorted(self.assigned)),
            pending_revocation=tuple(sorted(self.pending_revocation)),
            client_id=self.client_id, client_host=self.client_host)

    @classmethod
    def from_record(cls, r: MemberRecord) -> _Member:
        m = cls(r.member_id)
        m.instance_id = r.instance_id
        m.member_epoch = r.member_epoch
        m.previous_member_epoch = r.previous_member_epoch
        m.subscribed_topic_names = r.subscribed_topic_names
        m.subscribed_topic_regex = r.subscribed_topic_regex
        m.server_assignor = r.server_assignor
        m.rebalance_timeout_ms = r.rebalance_timeout_ms
        m.session_timeout_ms = r.session_timeout_ms
        m.assigned = frozenset(r.assigned)
        m.pending_revocation = frozenset(r.pending_revocation)
        m.client_id = r.client_id
        m.client_host = r.client_host
        return m

    def resolved_topics(self, topics: Mapping[str, int]) -> set[str]:
        """The existing topics the member subscribes to (names and regex)."""
        out = {t for t in self.subscribed_topic_names or () if t in topics}
        if self.subscribed_topic_regex:
            out.update(t for t in topics if regex_matches(self.subscribed_topic_regex, t))
        return out


class _Group:
    """One consumer group.

    Invariants (check_invariants):
      - group_epoch >= assignment_epoch >= 0;
      - ``target`` has exactly one entry per member, and targets are disjoint;
      - ``holders`` maps each partition some member holds (assigned or
        pending revocation) to that member, and nothing else;
      - instance ids are unique among members;
      - what the records written so far say (``persisted_*``) equals the
        state: nothing changed without a record.
    """

    def __init__(self, group_id: str) -> None:
        self.group_id = group_id
        self.group_epoch = 0
        self.assignor = DEFAULT_ASSIGNOR
        # Partition counts of the existing subscribed topics at the last
        # target computation; tick() bumps the epoch when they change.
        self.partition_counts: dict[str, int] = {}
        self.assignment_epoch = 0
        self.target: dict[str, frozenset[TopicPartition]] = {}
        self.members: dict[str, _Member] = {}
        self.offsets: dict[TopicPartition, tuple[int, str, int]] = {}
        self.holders: dict[TopicPartition, str] = {}
        # The latest records written for this group's keys: each operation
        # writes exactly the records whose value differs from these.
        self.persisted_group: GroupMetadataRecord | None = None
        self.persisted_members: dict[str, MemberRecord] = {}
        self.persisted_target = TargetAssignmentRecord(group_id, 0, {})
        self.dirty_members: set[str] = set()
        self.target_dirty = False

    # -- holdings (keep ``holders`` in step) ----------------------------------------
    def set_assigned(self, m: _Member, partitions: frozenset[TopicPartition]) -> None:
        for tp in m.assigned - partitions:
            if self.holders.get(tp) == m.member_id:
                del self.holders[tp]
        for tp in partitions - m.assigned:
            self.holders[tp] = m.member_id
        m.assigned = partitions
        self.dirty_members.add(m.member_id)

    def set_pending(self, m: _Member, partitions: frozenset[TopicPartition]) -> None:
        for tp in m.pending_revocation - partitions:
            if self.holders.get(tp) == m.member_id:
                del self.holders[tp]
        for tp in partitions - m.pending_revocation:
            self.holders[tp] = m.member_id
        m.pending_revocation = partitions
        if not partitions:
            m.revocation_deadline_ms = None
        self.dirty_members.add(m.member_id)

    def add_member(self, m: _Member) -> None:
        self.members[m.member_id] = m
        for tp in m.assigned | m.pending_revocation:
            self.holders[tp] = m.member_id
        self.dirty_members.add(m.member_id)

    def drop_member(self, member_id: str) -> _Member | None:
        m = self.members.pop(member_id, None)
        if m is not None:
            for tp in m.assigned | m.pending_revocation:
                if self.holders.get(tp) == member_id:
                    del self.holders[tp]
        self.dirty_members.discard(member_id)
        return m

    def instance_holder(self, instance_id: str) -> _Member | None:
        for m in self.members.values():
            if m.instance_id == instance_id:
                return m
        return None

    # -- records ----------------------------------------------------------------------
    def metadata_record(self) -> GroupMetadataRecord:
        return GroupMetadataRecord(self.group_id, self.group_epoch, self.assignor,
                                   dict(sorted(self.partition_counts.items())))

    def target_record(self) -> TargetAssignmentRecord:
        return TargetAssignmentRecord(
            self.group_id, self.assignment_epoch,
            {mid: tuple(sorted(ps)) for mid, ps in sorted(self.target.items())})

    def flush(self) -> list[Record]:
        """The records of everything changed since the last flush."""
        out: list[Record] = []
        group = self.metadata_record()
        if group != self.persisted_group:
            out.append(group)
            self.persisted_group = group
        for mid in sorted(self.persisted_members.keys() - self.members.keys()):
            out.append(MemberTombstone(self.group_id, mid))
            del self.persisted_members[mid]
        for mid in sorted(self.dirty_members):
            record = self.members[mid].record(self.group_id)
            if record != self.persisted_members.get(mid):
                out.append(record)
                self.persisted_members[mid] = record
        self.dirty_members.clear()
        if self.target_dirty:
            target = self.target_record()
            if target != self.persisted_target:
                out.append(target)
                self.persisted_target = target
            self.target_dirty = False
        return out

    # -- views ------------------------------------------------------------------------
    def member_state(self, m: _Member) -> str:
        if m.away:
            return "away"
        if m.pending_revocation:
            return "revoking"
        if m.member_epoch < self.assignment_epoch:
            return "behind"              # will advance at its next heartbeat
        if m.assigned != self.target.get(m.member_id, frozenset()):
            return "unreleased"          # waiting for partitions others still hold
        return "stable"

    def state(self) -> str:
        if not self.members:
            return "empty"
        if self.group_epoch > self.assignment_epoch:
            return "assigning"
        if any(self.member_state(m) not in ("stable", "away") for m in self.members.values()):
            return "reconciling"
        return "stable"


def _sorted_parts(partitions: Iterable[TopicPartition]) -> list[TopicPartition]:
    return sorted(partitions)


def _is_partition(tp: Any) -> bool:
    return (isinstance(tp, (tuple, list)) and len(tp) == 2 and isinstance(tp[0], str)
            and bool(tp[0]) and isinstance(tp[1], int) and not isinstance(tp[1], bool)
            and tp[1] >= 0)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _offset_value(value: Any) -> tuple[Any, Any]:
    """``(offset, metadata)`` of a commit's value: a pair, or a bare offset;
    anything else comes out as an invalid offset."""
    if _is_int(value):
        return value, ""
    if isinstance(value, (tuple, list)) and len(value) == 2:
        return value[0], value[1]
    return None, None


# ----------------------------------------------------------------------------
# the core

def _checked_offsets(offsets: Mapping[TopicPartition, Any]
                     ) -> tuple[dict[TopicPartition, str | None],
                                dict[TopicPartition, tuple[int, str]]]:
    """Per partition None (valid) or INVALID_REQUEST, and the valid ones as
    ``(offset, metadata)``."""
    results: dict[TopicPartition, str | None] = {}
    accepted: dict[TopicPartition, tuple[int, str]] = {}
    for tp, value in offsets.items():
        offset, metadata = _offset_value(value)
        if (not _is_partition(tp) or not _is_int(offset) or offset < 0
                or not (metadata is None or isinstance(metadata, str))):
            results[tp] = INVALID_REQUEST
        else:
            results[(tp[0], tp[1])] = None
            accepted[(tp[0], tp[1])] = (offset, metadata or "")
    return results, accepted


class GroupCoordinatorCore:
    """All groups of one ``__consumer_offsets`` partition."""

    def __init__(self, *, session_timeout_ms: int = 45000, heartbeat_interval_ms: int = 5000,
                 rebalance_timeout_ms: int = 300000, max_group_size: int = 1000,
                 session_timeout_ms_min: int = 1, session_timeout_ms_max: int = 2**31 - 1,
                 id_factory: Callable[[], str] | None = None) -> None:
        self.session_timeout_ms = session_timeout_ms
        #: The session a member may ask for (group.min/max.session.timeout.ms).
        self.session_timeout_ms_min = session_timeout_ms_min
        self.session_timeout_ms_max = session_timeout_ms_max
        self.heartbeat_interval_ms = heartbeat_interval_ms
        #: Used for members whose join does not name one.
        self.rebalance_timeout_ms = rebalance_timeout_ms
        self.max_group_size = max_group_size
        self.id_factory = id_factory or (lambda: uuid.uuid4().hex)
        self.groups: dict[str, _Group] = {}
        #: Transactional offset commits awaiting their transaction's marker,
        #: per producer id.
        self.pending_txn_offsets: dict[int, list[OffsetCommitRecord]] = {}

    # -- heartbeat ----------------------------------------------------------------------
    def heartbeat(self, now_ms: int, group_id: str, req: HeartbeatRequest,
                  topics: Mapping[str, int]) -> tuple[HeartbeatResponse, list[Record]]:
        """Join, stay, leave: one ConsumerGroupHeartbeat."""
        self._check_request(group_id, req)
        if req.member_epoch == LEAVE_EPOCH:
            return self._leave(now_ms, group_id, req, topics)
        if req.member_epoch == STATIC_LEAVE_EPOCH:
            return self._static_leave(now_ms, group_id, req)
        if req.member_epoch == JOIN_EPOCH:
            return self._join(now_ms, group_id, req, topics)
        return self._beat(now_ms, group_id, req, topics)

    def leave(self, now_ms: int, group_id: str, member_id: str, *, static: bool = False,
              topics: Mapping[str, int] | None = None) -> list[Record]:
        """A leave heartbeat (-1, or -2 if ``static``), for callers without one."""
        req = HeartbeatRequest(member_id=member_id,
                               member_epoch=STATIC_LEAVE_EPOCH if static else LEAVE_EPOCH)
        return self.heartbeat(now_ms, group_id, req, topics or {})[1]

    def has_news(self, group_id: str, member_id: str) -> bool:
        """Would a heartbeat of this member now tell it something: a changed
        assignment (revocations started, partitions given), or a new member
        epoch? Changes nothing; raises ``UNKNOWN_MEMBER_ID`` for a member
        that is gone (its next heartbeat must find that out). A watching
        client heartbeats at once when this turns true, so a rebalance
        moves at the speed of requests rather than heartbeat intervals."""
        group, m = self._member(group_id, member_id)
        if m.away:
            return False
        if m.sent_assignment is None or m.assigned != m.sent_assignment:
            return True
        if m.pending_revocation:
            return False                   # the client releases; its heartbeat says so
        if m.member_epoch != group.assignment_epoch:
            return True
        return any(tp not in group.holders
                   for tp in group.target.get(member_id, frozenset()) - m.assigned)

    def instance_member(self, group_id: str, instance_id: str) -> str | None:
        """The member id holding static ``instance_id`` in the group, if any."""
        group = self.groups.get(group_id)
        holder = group.instance_holder(instance_id) if group is not None else None
        return None if holder is None else holder.member_id

    def release_instance(self, now_ms: int, group_id: str, req: HeartbeatRequest
                         ) -> tuple[str | None, list[Record]]:
        """The classic protocol's static membership: a new member (one that
        named no member id) joining with ``req.instance_id`` takes the place
        of the live member holding it, at once, as Kafka's classic groups
        replace it. The holder leaves for now (-2), so the join ``req`` then
        makes takes over its slot. ``req`` is checked first: a join that
        would be refused releases nobody. Returns the holder's member id
        (None: no such holder) and the records."""
        self._check_request(group_id, req)
        group = self.groups.get(group_id)
        holder = group.instance_holder(req.instance_id) \
            if group is not None and req.instance_id else None
        if holder is None or holder.away or holder.member_id == req.member_id:
            return None, []
        return holder.member_id, self.leave(now_ms, group_id, holder.member_id, static=True)

    def _check_request(self, group_id: str, req: HeartbeatRequest) -> None:
        """Shape checks that need no state (all before anything changes)."""
        def bad(why: str) -> GroupError:
            return GroupError(INVALID_REQUEST, why)

        if not isinstance(group_id, str) or not group_id:
            raise bad("group id must be a non-empty string")
        if not isinstance(req.member_id, str):
            raise bad("member id must be a string")
        if not _is_int(req.member_epoch) or req.member_epoch < STATIC_LEAVE_EPOCH:
            raise bad(f"member epoch {req.member_epoch!r} is not valid")
        if req.member_epoch != JOIN_EPOCH and not req.member_id:
            raise bad("member id is required unless joining (epoch 0)")
        if req.instance_id is not None and (not isinstance(req.instance_id, str)
                                            or not req.instance_id):
            raise bad("instance id must be a non-empty string")
        if req.rebalance_timeout_ms is not None and (not _is_int(req.rebalance_timeout_ms)
                                                     or req.rebalance_timeout_ms < 0):
            raise bad("rebalance timeout must be >= 0")
        if req.session_timeout_ms is not None and (not _is_int(req.session_timeout_ms)
                                                   or req.session_timeout_ms <= 0):
            raise bad("session timeout must be > 0")
        if req.session_timeout_ms is not None and not (
                self.session_timeout_ms_min <= req.session_timeout_ms
                <= self.session_timeout_ms_max):
            raise GroupError(INVALID_SESSION_TIMEOUT, (
                f"session timeout {req.session_timeout_ms} ms is outside what this cluster "
                f"allows, [{self.session_timeout_ms_min}, {self.session_timeout_ms_max}] ms "
                "(group.min.session.timeout.ms, group.max.session.timeout.ms)"))
        if req.subscribed_topic_names is not None:
            if isinstance(req.subscribed_topic_names, str) or not all(
                    isinstance(t, str) and t for t in req.subscribed_topic_names):
                raise bad("subscribed topic names must be non-empty strings")
        if req.subscribed_topic_regex:
            if not isinstance(req.subscribed_topic_regex, str):
                raise bad("subscribed topic regex must be a string")
            try:
                check_regex(req.subscribed_topic_regex)
            except (regex.error, OverflowError, RecursionError, TimeoutError) as e:
                raise bad(f"invalid subscribed topic regex "
                          f"{req.subscribed_topic_regex!r}: {e}") from None
        if req.server_assignor:
            try:
                find_assignor(req.server_assignor)
            except ValueError as e:
                raise GroupError(UNSUPPORTED_ASSIGNOR, str(e)) from None
        if req.owned_partitions is not None:
            if not all(_is_partition(tp) for tp in req.owned_partitions):
                raise bad("owned partitions must be (topic, partition >= 0) pairs")
        if req.member_epoch == JOIN_EPOCH:
            if req.subscribed_topic_names is None and not req.subscribed_topic_regex:
                raise bad("a joining member must subscribe to topic names or a regex")
            if req.owned_partitions:
                raise bad("a joining member owns no partitions")

    def _member(self, group_id: str, member_id: str) -> tuple[_Group, _Member]:
        group = self.groups.get(group_id)
        member = group.members.get(member_id) if group is not None else None
        if member is None:
            raise GroupError(UNKNOWN_MEMBER_ID,
                             f"member {member_id!r} is not in group {group_id!r}")
        return group, member  # type: ignore[return-value]

    def _join(self, now_ms: int, group_id: str, req: HeartbeatRequest,
              topics: Mapping[str, int]) -> tuple[HeartbeatResponse, list[Record]]:
        group = self.groups.get(group_id)
        bump = False
        if req.member_id and group is not None and req.member_id in group.members:
            # A member that lost its state (fenced, or restarted keeping its
            # id) joins again: it owns nothing now, so whatever the group
            # thought it held is free, and it converges on its target afresh.
            group, member = self._member(group_id, req.member_id)
            if req.instance_id != member.instance_id:
                raise GroupError(INVALID_REQUEST,
                                 f"member {member.member_id!r} has instance id "
                                 f"{member.instance_id!r}, not {req.instance_id!r}")
            if member.away:
                member.member_epoch = member.previous_member_epoch
            else:
                group.set_pending(member, frozenset())
                group.set_assigned(member, frozenset())
                member.previous_member_epoch = member.member_epoch = 0
            group.dirty_members.add(member.member_id)
        else:
            holder = (group.instance_holder(req.instance_id)
                      if group is not None and req.instance_id is not None else None)
            if holder is not None and not holder.away:
                raise GroupError(UNRELEASED_INSTANCE_ID,
                                 f"instance id {req.instance_id!r} is held by live member "
                                 f"{holder.member_id!r}")
            expired = holder is not None and self._session_over(holder, now_ms)
            size = len(group.members) if group is not None else 0
            if (holder is None or expired) and size - expired >= self.max_group_size:
                raise GroupError(GROUP_MAX_SIZE_REACHED,
                                 f"group {group_id!r} has {size} members, the most allowed")
            if group is None:
                group = self.groups[group_id] = _Group(group_id)
            # KIP-848 v1: a client names itself (a UUID it made); v0 and
            # kraftlog's client leave it to the coordinator.
            member = _Member(req.member_id or self._new_member_id(group))
            member.instance_id = req.instance_id
            if holder is not None and not expired:
                # The static member is back (as a new process): it takes the
                # old slot, its assignment and its epoch; the others see no change.
                member.member_epoch = member.previous_member_epoch = holder.previous_member_epoch
                for field in ("subscribed_topic_names", "subscribed_topic_regex",
                              "server_assignor", "rebalance_timeout_ms", "session_timeout_ms",
                              "client_id", "client_host"):
                    setattr(member, field, getattr(holder, field))
                group.drop_member(holder.member_id)
                member.assigned = holder.assigned
                group.target[member.member_id] = group.target.pop(holder.member_id, frozenset())
                group.target_dirty = True
            else:
                if holder is not None:
                    group.drop_member(holder.member_id)       # its session is over
                    group.target.pop(holder.member_id, None)
                member.rebalance_timeout_ms = self.rebalance_timeout_ms
                member.session_timeout_ms = self.session_timeout_ms
                group.target[member.member_id] = frozenset()
                bump = True
            group.add_member(member)
        bump |= self._apply_fields(group, member, req)
        if bump:
            self._bump(group, now_ms, topics)
        member.last_heartbeat_ms = now_ms
        self._reconcile(group, member, frozenset(), now_ms)
        return self._respond(group, member, req, frozenset(), always=True)

    def _beat(self, now_ms: int, group_id: str, req: HeartbeatRequest,
              topics: Mapping[str, int]) -> tuple[HeartbeatResponse, list[Record]]:
        group, member = self._member(group_id, req.member_id)
        if req.instance_id is not None and req.instance_id != member.instance_id:
            raise GroupError(INVALID_REQUEST,
                             f"member {member.member_id!r} has instance id "
                             f"{member.instance_id!r}, not {req.instance_id!r}")
        owned = None if req.owned_partitions is None else frozenset(
            (t, p) for t, p in req.owned_partitions)
        epoch = req.member_epoch
        if member.away:
            raise GroupError(FENCED_MEMBER_EPOCH,
                             f"static member {member.member_id!r} left; rejoin with epoch 0")
        if epoch != member.member_epoch:
            # The previous epoch is fine: the response that moved the member
            # on was lost. But only if the client holds nothing it may not.
            previous_ok = (epoch == member.previous_member_epoch
                           and epoch < member.member_epoch
                           and (owned is None
                                or owned <= member.assigned | member.pending_revocation))
            if not previous_ok:
                raise GroupError(FENCED_MEMBER_EPOCH,
                                 f"member {member.member_id!r} is at epoch "
                                 f"{member.member_epoch}, not {epoch}; rejoin with epoch 0")
        if self._apply_fields(group, member, req):
            self._bump(group, now_ms, topics)
        member.last_heartbeat_ms = now_ms
        self._reconcile(group, member, owned, now_ms)
        return self._respond(group, member, req, owned, always=False)

    def _leave(self, now_ms: int, group_id: str, req: HeartbeatRequest,
               topics: Mapping[str, int]) -> tuple[HeartbeatResponse, list[Record]]:
        group, member = self._member(group_id, req.member_id)
        self._remove(group, member)
        self._bump(group, now_ms, topics)
        return (HeartbeatResponse(member.member_id, LEAVE_EPOCH, self.heartbeat_interval_ms,
                                  None), group.flush())

    def _static_leave(self, now_ms: int, group_id: str,
                      req: HeartbeatRequest) -> tuple[HeartbeatResponse, list[Record]]:
        """The member stops for now and is expected back: keep its slot and
        assignment for a session so the group need not rebalance twice.
        A leaving client has stopped consuming, so it holds nothing:
        revocations it owed are done, and it gets nothing new while away."""
        group, member = self._member(group_id, req.member_id)
        if member.instance_id is None:
            raise GroupError(INVALID_REQUEST, "only a static member (with an instance id) "
                                              "can leave with epoch -2")
        if req.instance_id is not None and req.instance_id != member.instance_id:
            raise GroupError(INVALID_REQUEST,
                             f"member {member.member_id!r} has instance id "
                             f"{member.instance_id!r}, not {req.instance_id!r}")
        if not member.away:
            group.set_pending(member, frozenset())
            member.previous_member_epoch = member.member_epoch
            member.member_epoch = STATIC_LEAVE_EPOCH
            member.sent_assignment = None
            group.dirty_members.add(member.member_id)
        member.last_heartbeat_ms = now_ms
        return (HeartbeatResponse(member.member_id, STATIC_LEAVE_EPOCH,
                                  self.heartbeat_interval_ms, None), group.flush())

    def _apply_fields(self, group: _Group, m: _Member, req: HeartbeatRequest) -> bool:
        """Take the request's changed fields; True if the target depends on
        what changed (subscription or assignor)."""
        bump = False
        if req.subscribed_topic_names is not None:
            names = tuple(sorted(set(req.subscribed_topic_names)))
            if names != m.subscribed_topic_names:
                m.subscribed_topic_names, bump = names, True
        if req.subscribed_topic_regex is not None:
            regex = req.subscribed_topic_regex or None
            if regex != m.subscribed_topic_regex:
                m.subscribed_topic_regex, bump = regex, True
        if req.server_assignor is not None:
            name = req.server_assignor or None
            if name != m.server_assignor:
                m.server_assignor, bump = name, True
        if req.rebalance_timeout_ms is not None:
            m.rebalance_timeout_ms = req.rebalance_timeout_ms
        if req.session_timeout_ms is not None:
            m.session_timeout_ms = req.session_timeout_ms
        if req.client_id is not None:
            m.client_id = req.client_id
        if req.client_host is not None:
            m.client_host = req.client_host
        group.dirty_members.add(m.member_id)
        return bump

    def _respond(self, group: _Group, m: _Member, req: HeartbeatRequest,
                 owned: frozenset[TopicPartition] | None,
                 always: bool) -> tuple[HeartbeatResponse, list[Record]]:
        """Send the assignment when the client may not have it: on a join,
        when it changed since the last response, when the client is an epoch
        behind (lost response), or when what it owns differs from it."""
        send = (always or m.assigned != m.sent_assignment or req.member_epoch != m.member_epoch
                or (owned is not None and owned != m.assigned))
        if send:
            m.sent_assignment = m.assigned
        return (HeartbeatResponse(m.member_id, m.member_epoch, self.heartbeat_interval_ms,
                                  _sorted_parts(m.assigned) if send else None), group.flush())

    def _new_member_id(self, group: _Group) -> str:
        while True:
            member_id = self.id_factory()
            if member_id and member_id not in group.members:
                return member_id

    # -- assignment ---------------------------------------------------------------------
    def _choose_assignor(self, group: _Group) -> str:
        """The assignor most members ask for (ties: the first by name);
        the default if nobody asks."""
        wanted = Counter(m.server_assignor for m in group.members.values() if m.server_assignor)
        if not wanted:
            return DEFAULT_ASSIGNOR
        return min(wanted, key=lambda name: (-wanted[name], name))

    def _subscribed_counts(self, group: _Group, topics: Mapping[str, int]) -> dict[str, int]:
        wanted: set[str] = set()
        for m in group.members.values():
            wanted |= m.resolved_topics(topics)
        return {t: topics[t] for t in sorted(wanted)}

    def _bump(self, group: _Group, now_ms: int, topics: Mapping[str, int]) -> None:
        """A new group epoch: compute the target afresh (sticky: each member's
        current target is what it "owns" for the assignor) and start the
        revocations it implies."""
        name = self._choose_assignor(group)
        resolved = {mid: m.resolved_topics(topics) for mid, m in group.members.items()}
        counts = {t: topics[t] for t in sorted(set().union(*resolved.values()))}
        specs = {mid: MemberSpec(mid, frozenset(resolved[mid]),
                                 group.target.get(mid, frozenset()), m.instance_id)
                 for mid, m in group.members.items()}
        result = find_assignor(name).assign(specs, counts)

        group.group_epoch += 1
        group.assignor = name
        group.partition_counts = counts
        group.target = {mid: frozenset(result.get(mid, ())) for mid in group.members}
        group.assignment_epoch = group.group_epoch
        group.target_dirty = True
        for mid, m in group.members.items():
            gone = m.assigned - group.target[mid]
            if not gone:
                continue
            group.set_assigned(m, m.assigned - gone)
            if not m.away:                       # an away member holds nothing
                if not m.pending_revocation:
                    m.revocation_deadline_ms = now_ms + m.rebalance_timeout_ms
                group.set_pending(m, m.pending_revocation | gone)

    def _reconcile(self, group: _Group, m: _Member, owned: frozenset[TopicPartition] | None,
                   now_ms: int) -> None:
        """Move the member towards its target as far as is safe now."""
        if m.pending_revocation and owned is not None:
            # Released partitions are free at once (even if others are not yet).
            still = m.pending_revocation & owned
            if still != m.pending_revocation:
                group.set_pending(m, still)
        if m.pending_revocation:
            return                              # no new epoch, nothing new, until released
        if m.member_epoch != group.assignment_epoch:
            m.previous_member_epoch = m.member_epoch
            m.member_epoch = group.assignment_epoch
            group.dirty_members.add(m.member_id)
        free = frozenset(tp for tp in group.target.get(m.member_id, frozenset()) - m.assigned
                         if tp not in group.holders)
        if free:
            group.set_assigned(m, m.assigned | free)

    def _remove(self, group: _Group, m: _Member) -> None:
        group.drop_member(m.member_id)
        group.target.pop(m.member_id, None)
        group.target_dirty = True

    def _session_over(self, m: _Member, now_ms: int) -> bool:
        return (m.last_heartbeat_ms is not None
                and now_ms - m.last_heartbeat_ms > m.session_timeout_ms)

    # -- timers -------------------------------------------------------------------------
    def loaded(self, now_ms: int) -> None:
        """After replay: every member's session (and revocation deadline)
        starts now, as timers are not persisted."""
        for group in self.groups.values():
            for m in group.members.values():
                m.last_heartbeat_ms = now_ms
                if m.pending_revocation:
                    m.revocation_deadline_ms = now_ms + m.rebalance_timeout_ms

    def tick(self, now_ms: int, topics: Mapping[str, int]) -> list[Record]:
        """Remove members whose session is over or who did not release
        revoked partitions in time; bump groups whose subscribed topics'
        partition counts changed (new partitions, new topics matching a
        regex, deleted topics). One epoch bump per group at most."""
        out: list[Record] = []
        for group_id in sorted(self.groups):
            group = self.groups[group_id]
            changed = False
            for m in list(group.members.values()):
                if m.last_heartbeat_ms is None:          # replayed, not loaded()
                    m.last_heartbeat_ms = now_ms
                if m.pending_revocation and m.revocation_deadline_ms is None:
                    m.revocation_deadline_ms = now_ms + m.rebalance_timeout_ms
                overdue = (bool(m.pending_revocation)
                           and now_ms > m.revocation_deadline_ms)  # type: ignore[operator]
                if self._session_over(m, now_ms) or overdue:
                    self._remove(group, m)
                    changed = True
            if group.members and self._subscribed_counts(group, topics) != group.partition_counts:
                changed = True
            if changed:
                self._bump(group, now_ms, topics)
                out.extend(group.flush())
        return out

    # -- offsets ------------------------------------------------------------------------
    def commit_offsets(self, now_ms: int, group_id: str, member_id: str, member_epoch: int,
                       offsets: Mapping[TopicPartition, tuple[int, str | None]]
                       ) -> tuple[dict[TopicPartition, str | None], list[Record]]:
        """Commit offsets; per partition None (done) or an error code. A
        refusal of the whole request (who is committing) raises GroupError."""
        group = self.groups.get(group_id)
        if not isinstance(group_id, str) or not group_id:
            raise GroupError(INVALID_REQUEST, "group id must be a non-empty string")
        if member_id == "":
            if member_epoch != ADMIN_COMMIT_EPOCH:
                raise GroupError(INVALID_REQUEST, "a commit without member id must use epoch -1")
            if group is not None and group.members:
                raise GroupError(UNKNOWN_MEMBER_ID, f"group {group_id!r} has members: only "
                                                    "they may commit")
        else:
            group, member = self._member(group_id, member_id)
            if member.away or member_epoch > member.member_epoch:
                raise GroupError(FENCED_MEMBER_EPOCH,
                                 f"member {member_id!r} is at epoch {member.member_epoch}, "
                                 f"not {member_epoch}")
            if member_epoch not in (member.member_epoch, member.previous_member_epoch):
                raise GroupError(STALE_MEMBER_EPOCH,
                                 f"member {member_id!r} is at epoch {member.member_epoch}, "
                                 f"not {member_epoch}")
        results, accepted = _checked_offsets(offsets)
        return results, self._write_offsets(now_ms, group_id, accepted)

    def _write_offsets(self, now_ms: int, group_id: str,
                       accepted: Mapping[TopicPartition, tuple[int, str]]) -> list[Record]:
        if not accepted:
            return []
        group = self.groups.get(group_id)
        if group is None:                    # simple consumers' groups come into being so
            group = self.groups[group_id] = _Group(group_id)
        out = group.flush()
        for (topic, partition), (offset, metadata) in sorted(accepted.items()):
            group.offsets[(topic, partition)] = (offset, metadata, now_ms)
            out.append(OffsetCommitRecord(group_id, topic, partition, offset, metadata, now_ms))
        return out

    # -- transactional offsets (TxnOffsetCommit, KIP-98) ----------------------------------
    def txn_offset_records(self, now_ms: int, group_id: str,
                           offsets: Mapping[TopicPartition, tuple[int, str | None]]
                           ) -> tuple[dict[TopicPartition, str | None], list[Record]]:
        """The records of a transactional offset commit, changing nothing:
        the shell writes them in the producer's transactional batch, then
        ``replay_txn`` holds them until the transaction's marker."""
        if not isinstance(group_id, str) or not group_id:
            raise GroupError(INVALID_REQUEST, "group id must be a non-empty string")
        results, accepted = _checked_offsets(offsets)
        return results, [OffsetCommitRecord(group_id, topic, partition, offset, metadata, now_ms)
                         for (topic, partition), (offset, metadata) in sorted(accepted.items())]

    def replay_txn(self, producer_id: int, record: Record) -> None:
        """A transactional offset commit of producer ``producer_id``: held
        until its transaction ends."""
        if isinstance(record, OffsetCommitRecord):
            self.pending_txn_offsets.setdefault(producer_id, []).append(record)

    def complete_txn(self, producer_id: int, committed: bool) -> None:
        """The transaction's marker: its offsets become the group's
        committed offsets (COMMIT) or are dropped (ABORT)."""
        for record in self.pending_txn_offsets.pop(producer_id, []):
            if committed:
                self.replay(record)

    def unstable_offsets(self, group_id: str) -> set[TopicPartition]:
        """The group's partitions with a transactional offset commit whose
        transaction has not ended (KIP-447: a reader asking for stable
        offsets is told to retry)."""
        return {TopicPartition(r.topic, r.partition)
                for records in self.pending_txn_offsets.values() for r in records
                if r.group_id == group_id}

    def fetch_offsets(self, group_id: str, partitions: Iterable[TopicPartition] | None = None
                      ) -> dict[TopicPartition, tuple[int, str, int]]:
        """Committed ``(offset, metadata, commit_ms)``; partitions without a
        commit (and unknown groups) are left out."""
        group = self.groups.get(group_id)
        if group is None:
            return {}
        if partitions is None:
            return dict(sorted(group.offsets.items()))
        return {(t, p): group.offsets[(t, p)] for t, p in partitions if (t, p) in group.offsets}

    def reset_offsets(self, now_ms: int, group_id: str,
                      offsets: Mapping[TopicPartition, int | tuple[int, str | None]]
                      ) -> list[Record]:
        """Set committed offsets by hand; only while nobody consumes (a member
        would overwrite them with its next commit)."""
        group = self.groups.get(group_id)
        if group is not None and group.members:
            raise GroupError(NON_EMPTY_GROUP, f"group {group_id!r} has "
                                              f"{len(group.members)} members")
        if not isinstance(group_id, str) or not group_id:
            raise GroupError(INVALID_REQUEST, "group id must be a non-empty string")
        accepted: dict[TopicPartition, tuple[int, str]] = {}
        for tp, value in offsets.items():
            offset, metadata = _offset_value(value)
            if (not _is_partition(tp) or not _is_int(offset) or offset < 0
                    or not (metadata is None or isinstance(metadata, str))):
                raise GroupError(INVALID_REQUEST, f"bad offset {value!r} for {tp!r}")
            accepted[(tp[0], tp[1])] = (offset, metadata or "")
        return self._write_offsets(now_ms, group_id, accepted)

    def delete_group(self, group_id: str) -> list[Record]:
        """Forget an empty group and its offsets (tombstones for every key)."""
        group = self.groups.get(group_id)
        if group is None:
            raise GroupError(GROUP_ID_NOT_FOUND, f"group {group_id!r} does not exist")
        if group.members:
            raise GroupError(NON_EMPTY_GROUP, f"group {group_id!r} has "
                                              f"{len(group.members)} members")
        out: list[Record] = [MemberTombstone(group_id, mid)
                             for mid in sorted(group.persisted_members)]
        out += [OffsetTombstone(group_id, t, p) for t, p in sorted(group.offsets)]
        out += [TargetAssignmentTombstone(group_id), GroupTombstone(group_id)]
        del self.groups[group_id]
        return out

    # -- views --------------------------------------------------------------------------
    def list_groups(self) -> list[dict]:
        return [{"group_id": g.group_id, "state": g.state(), "members": len(g.members),
                 "group_epoch": g.group_epoch}
                for g in (self.groups[gid] for gid in sorted(self.groups))]

    def describe(self, group_id: str, now_ms: int) -> dict:
        """Everything about one group; an unknown (or deleted) group is "dead"."""
        group = self.groups.get(group_id)
        if group is None:
            return {"group_id": group_id, "state": "dead", "group_epoch": 0,
                    "assignment_epoch": 0, "assignor": None, "subscribed_partition_counts": {},
                    "members": [], "offsets": []}
        members = []
        for mid in sorted(group.members):
            m = group.members[mid]
            members.append({
                "member_id": mid, "instance_id": m.instance_id, "state": group.member_state(m),
                "member_epoch": m.member_epoch, "previous_member_epoch": m.previous_member_epoch,
                "subscribed_topic_names": (None if m.subscribed_topic_names is None
                                           else list(m.subscribed_topic_names)),
                "subscribed_topic_regex": m.subscribed_topic_regex,
                "server_assignor": m.server_assignor,
                "assigned": _sorted_parts(m.assigned),
                "pending_revocation": _sorted_parts(m.pending_revocation),
                "target": _sorted_parts(group.target.get(mid, ())),
                "rebalance_timeout_ms": m.rebalance_timeout_ms,
                "session_timeout_ms": m.session_timeout_ms,
                "client_id": m.client_id, "client_host": m.client_host,
                "session_remaining_ms": (None if m.last_heartbeat_ms is None else
                                         m.last_heartbeat_ms + m.session_timeout_ms - now_ms),
                "revocation_remaining_ms": (None if m.revocation_deadline_ms is None
                                            else m.revocation_deadline_ms - now_ms),
            })
        return {
            "group_id": group_id, "state": group.state(), "group_epoch": group.group_epoch,
            "assignment_epoch": group.assignment_epoch, "assignor": group.assignor,
            "subscribed_partition_counts": dict(group.partition_counts),
            "members": members,
            "offsets": [{"topic": t, "partition": p, "offset": o, "metadata": md,
                         "commit_ms": ms}
                        for (t, p), (o, md, ms) in sorted(group.offsets.items())],
        }

    # -- replay -------------------------------------------------------------------------
    def replay(self, record: Record) -> None:
        """Apply one record read back from ``__consumer_offsets``. Records are
        whole values per key, so any order-preserving sequence holding the
        latest value of every key (the log, compacted or not) rebuilds the
        same state."""
        r = record
        if isinstance(r, GroupTombstone):
            self.groups.pop(r.group_id, None)
            return
        if isinstance(r, (MemberTombstone, TargetAssignmentTombstone, OffsetTombstone)):
            group = self.groups.get(r.group_id)
            if group is None:
                return
            if isinstance(r, MemberTombstone):
                group.drop_member(r.member_id)
                group.persisted_members.pop(r.member_id, None)
            elif isinstance(r, TargetAssignmentTombstone):
                group.target, group.assignment_epoch = {}, 0
                group.persisted_target = group.target_record()
            else:
                group.offsets.pop((r.topic, r.partition), None)
            return
        group = self.groups.get(r.group_id)
        if group is None:
            group = self.groups[r.group_id] = _Group(r.group_id)
        if isinstance(r, GroupMetadataRecord):
            group.group_epoch = r.group_epoch
            group.assignor = r.assignor
            group.partition_counts = dict(r.subscribed_partition_counts)
            group.persisted_group = r
        elif isinstance(r, MemberRecord):
            group.drop_member(r.member_id)
            group.add_member(_Member.from_record(r))
            group.dirty_members.discard(r.member_id)
            group.persisted_members[r.member_id] = r
        elif isinstance(r, TargetAssignmentRecord):
            group.assignment_epoch = r.assignment_epoch
            group.target = {mid: frozenset(ps) for mid, ps in r.assignment.items()}
            group.persisted_target = r
        elif isinstance(r, OffsetCommitRecord):
            group.offsets[(r.topic, r.partition)] = (r.offset, r.metadata, r.commit_ms)
        else:
            raise TypeError(f"not a group record: {record!r}")

    # -- invariants ---------------------------------------------------------------------
    def check_invariants(self) -> None:
        """Raise InvariantViolation if any documented invariant fails."""
        def fail(group: _Group, why: str) -> None:
            raise InvariantViolation(f"group {group.group_id!r}: {why}")

        for group_id, group in self.groups.items():
            if group.group_id != group_id:
                fail(group, "filed under another id")
            if not 0 <= group.assignment_epoch <= group.group_epoch:
                fail(group, f"epochs: assignment {group.assignment_epoch}, "
                            f"group {group.group_epoch}")
            if group.target.keys() != group.members.keys():
                fail(group, f"target members {sorted(group.target)} != "
                            f"members {sorted(group.members)}")
            seen_target: dict[TopicPartition, str] = {}
            for mid, ps in group.target.items():
                for tp in ps:
                    if tp in seen_target:
                        fail(group, f"{tp} is in the targets of {seen_target[tp]} and {mid}")
                    seen_target[tp] = mid
            held: dict[TopicPartition, str] = {}
            instances: dict[str, str] = {}
            for mid, m in group.members.items():
                if m.member_id != mid:
                    fail(group, f"member {mid} filed under another id")
                if m.assigned & m.pending_revocation:
                    fail(group, f"{mid}: assigned and pending overlap")
                for tp in m.assigned | m.pending_revocation:
                    if tp in held:
                        fail(group, f"{tp} held by both {held[tp]} and {mid}")
                    held[tp] = mid
                if not m.assigned <= group.target.get(mid, frozenset()):
                    fail(group, f"{mid}: assigned {sorted(m.assigned)} beyond its target")
                if m.instance_id is not None:
                    if m.instance_id in instances:
                        fail(group, f"instance {m.instance_id!r} held by "
                                    f"{instances[m.instance_id]} and {mid}")
                    instances[m.instance_id] = mid
                if m.away:
                    if m.instance_id is None or m.pending_revocation:
                        fail(group, f"{mid}: away but not static, or pending revocations")
                    if not 0 <= m.previous_member_epoch <= group.assignment_epoch:
                        fail(group, f"{mid}: away with epoch {m.previous_member_epoch}")
                else:
                    if not (0 <= m.previous_member_epoch <= m.member_epoch
                            <= group.assignment_epoch):
                        fail(group, f"{mid}: epochs previous {m.previous_member_epoch}, "
                                    f"member {m.member_epoch}, assignment "
                                    f"{group.assignment_epoch}")
                    if m.pending_revocation and m.member_epoch >= group.assignment_epoch:
                        fail(group, f"{mid}: revoking at the assignment epoch")
            if held != group.holders:
                fail(group, "holders index out of step")
            if len(group.members) > self.max_group_size:
                fail(group, f"{len(group.members)} members, more than {self.max_group_size}")
            for tp, (offset, _metadata, _ms) in group.offsets.items():
                if offset < 0:
                    fail(group, f"negative offset committed for {tp}")
            # Nothing changed without a record saying so.
            if group.dirty_members or group.target_dirty:
                fail(group, "changes not flushed to records")
            if group.persisted_group != group.metadata_record():
                fail(group, "group record differs from the state")
            if group.persisted_target != group.target_record():
                fail(group, "target record differs from the state")
            if group.persisted_members.keys() != group.members.keys():
                fail(group, "member records differ from the members")
            for mid, m in group.members.items():
                if group.persisted_members[mid] != m.record(group_id):
                    fail(group, f"member record of {mid} differs from the state")
