"""The group coordinator's records, as kept in the internal topic
``__consumer_offsets``.

The coordinator's state is a pure function of these records: every change
the core makes is returned as records, the shell appends them to the group's
``__consumer_offsets`` partition, and a coordinator that takes the partition
over replays them into a fresh core. The topic is compacted by key, so each
record is a whole value for its key (never a delta): the latest value per
key wins and a ``None`` value (a tombstone) deletes the key. That is also
why replaying any order-preserving subset that holds the latest value of
every key (a compacted log) rebuilds the same state.

Encoding: key and value are msgpack. The key is an array
``[KEY_VERSION, kind, ...identity]``; the value a map with a ``"v"`` field
(the value schema version) and one entry per dataclass field. A reader
ignores map entries it does not know and refuses versions newer than its
own, so fields can be added without a version change and a version change
is reserved for incompatible ones.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Union

import msgpack

from protocol import TopicPartition

Partitions = tuple[TopicPartition, ...]   # sorted, no duplicates

#: Version of the key layout. Keys are compaction identities: changing their
#: layout would stop old values from being superseded, so this stays 0.
KEY_VERSION = 0
#: Version of the value layout this module writes and the newest it reads.
VALUE_VERSION = 0

GROUP = "group"
MEMBER = "member"
TARGET = "target"
OFFSET = "offset"


class RecordFormatError(ValueError):
    """A key or value this module cannot read (corrupt, or a newer format)."""


# ----------------------------------------------------------------------------
# values

@dataclass(frozen=True)
class GroupMetadataRecord:
    """The group exists; written whenever its epoch moves."""

    group_id: str                 # the group's name
    group_epoch: int              # bumped on every membership/subscription/metadata change
    assignor: str                 # the server assignor that computed the current target
    # The partition count of every existing topic the members subscribe to,
    # as of the last target computation: a change of these is what makes
    # tick() bump the epoch, so a new coordinator must know them too.
    subscribed_partition_counts: dict[str, int]


@dataclass(frozen=True)
class MemberRecord:
    """One member's whole persistent state; written whenever any of it changes."""

    group_id: str                            # the member's group
    member_id: str                           # coordinator-given id
    instance_id: str | None                  # static membership id, or None
    member_epoch: int                        # current epoch; -2 while a static member is away
    previous_member_epoch: int               # epoch before the last advance (own one while away)
    subscribed_topic_names: tuple[str, ...] | None  # sorted names; None: regex only
    subscribed_topic_regex: str | None       # full-match regex, or None
    server_assignor: str | None              # the assignor the member asks for, or None
    rebalance_timeout_ms: int                # how long it may take to release revoked partitions
    session_timeout_ms: int                  # how long it may stay silent
    assigned: Partitions                     # partitions it may own now
    pending_revocation: Partitions           # partitions it must release before advancing
    client_id: str | None                    # the client's self-given name, for describe
    client_host: str | None                  # where the client connects from, for describe


@dataclass(frozen=True)
class TargetAssignmentRecord:
    """The assignment the group converges on; written when it changes."""

    group_id: str                            # the group
    assignment_epoch: int                    # the group epoch it was computed at
    assignment: dict[str, Partitions]        # member_id -> its target partitions (sorted)


@dataclass(frozen=True)
class OffsetCommitRecord:
    """A committed offset of one partition."""

    group_id: str            # the group
    topic: str               # the partition's topic
    partition: int           # the partition's number
    offset: int              # the next offset to consume (>= 0)
    metadata: str            # the client's free-form string
    commit_ms: int           # when the coordinator accepted it


# ----------------------------------------------------------------------------
# tombstones (a None value under the key of the record they delete)

@dataclass(frozen=True)
class GroupTombstone:
    """The group was deleted (written with its member/target/offset tombstones)."""

    group_id: str            # the deleted group


@dataclass(frozen=True)
class MemberTombstone:
    """The member left or was removed."""

    group_id: str            # its group
    member_id: str           # the removed member


@dataclass(frozen=True)
class TargetAssignmentTombstone:
    """The group's target assignment is gone (only with a deleted group)."""

    group_id: str            # the deleted group


@dataclass(frozen=True)
class OffsetTombstone:
    """The committed offset of one partition was deleted."""

    group_id: str            # the group
    topic: str               # the partition's topic
    partition: int           # the partition's number


Record = Union[GroupMetadataRecord, MemberRecord, TargetAssignmentRecord, OffsetCommitRecord,
               GroupTombstone, MemberTombstone, TargetAssignmentTombstone, OffsetTombstone]


# ----------------------------------------------------------------------------
# encoding

def _key(*parts: Any) -> bytes:
    return msgpack.packb([KEY_VERSION, *parts], use_bin_type=True)


def _value(**fields: Any) -> bytes:
    return msgpack.packb({"v": VALUE_VERSION, **fields}, use_bin_type=True)


def _parts(partitions: Partitions) -> list[list]:
    return [[t, p] for t, p in partitions]


def encode(record: Record) -> tuple[bytes, bytes | None]:
    """``(key, value)`` of ``record``; the value is None for a tombstone."""
    r = record
    if isinstance(r, GroupMetadataRecord):
        return _key(GROUP, r.group_id), _value(
            group_epoch=r.group_epoch, assignor=r.assignor,
            subscribed_partition_counts=dict(r.subscribed_partition_counts))
    if isinstance(r, MemberRecord):
        return _key(MEMBER, r.group_id, r.member_id), _value(
            instance_id=r.instance_id, member_epoch=r.member_epoch,
            previous_member_epoch=r.previous_member_epoch,
            subscribed_topic_names=(None if r.subscribed_topic_names is None
                                    else list(r.subscribed_topic_names)),
            subscribed_topic_regex=r.subscribed_topic_regex, server_assignor=r.server_assignor,
            rebalance_timeout_ms=r.rebalance_timeout_ms, session_timeout_ms=r.session_timeout_ms,
            assigned=_parts(r.assigned), pending_revocation=_parts(r.pending_revocation),
            client_id=r.client_id, client_host=r.client_host)
    if isinstance(r, TargetAssignmentRecord):
        return _key(TARGET, r.group_id), _value(
            assignment_epoch=r.assignment_epoch,
            assignment={m: _parts(ps) for m, ps in r.assignment.items()})
    if isinstance(r, OffsetCommitRecord):
        return _key(OFFSET, r.group_id, r.topic, r.partition), _value(
            offset=r.offset, metadata=r.metadata, commit_ms=r.commit_ms)
    if isinstance(r, GroupTombstone):
        return _key(GROUP, r.group_id), None
    if isinstance(r, MemberTombstone):
        return _key(MEMBER, r.group_id, r.member_id), None
    if isinstance(r, TargetAssignmentTombstone):
        return _key(TARGET, r.group_id), None
    if isinstance(r, OffsetTombstone):
        return _key(OFFSET, r.group_id, r.topic, r.partition), None
    raise TypeError(f"not a group record: {record!r}")


def _tps(items: Any) -> Partitions:
    return tuple(sorted((str(t), int(p)) for t, p in items))


def decode(key: bytes, value: bytes | None) -> Record:
    """The record stored as ``(key, value)``; RecordFormatError if unreadable."""
    try:
        parts = msgpack.unpackb(key, raw=False)
    except Exception as e:
        raise RecordFormatError(f"unreadable group record key: {e}") from e
    if not isinstance(parts, list) or len(parts) < 3 or parts[0] != KEY_VERSION:
        raise RecordFormatError(f"unknown group record key layout: {parts!r}")
    kind, ident = parts[1], parts[2:]
    shape = {GROUP: 1, MEMBER: 2, TARGET: 1, OFFSET: 3}
    if shape.get(kind) != len(ident):
        raise RecordFormatError(f"unknown group record key: {parts!r}")
    if value is None:
        if kind == GROUP:
            return GroupTombstone(ident[0])
        if kind == MEMBER:
            return MemberTombstone(ident[0], ident[1])
        if kind == TARGET:
            return TargetAssignmentTombstone(ident[0])
        return OffsetTombstone(ident[0], ident[1], ident[2])
    try:
        v = msgpack.unpackb(value, raw=False, strict_map_key=False)
    except Exception as e:
        raise RecordFormatError(f"unreadable group record value: {e}") from e
    if not isinstance(v, dict) or not isinstance(v.get("v"), int):
        raise RecordFormatError(f"group record value without a version: {v!r}")
    if v["v"] > VALUE_VERSION:
        raise RecordFormatError(
            f"group record value version {v['v']} is newer than this reader's {VALUE_VERSION}")
    try:
        if kind == GROUP:
            return GroupMetadataRecord(
                group_id=ident[0], group_epoch=v["group_epoch"], assignor=v["assignor"],
                subscribed_partition_counts=dict(v.get("subscribed_partition_counts") or {}))
        if kind == MEMBER:
            names = v["subscribed_topic_names"]
            return MemberRecord(
                group_id=ident[0], member_id=ident[1], instance_id=v["instance_id"],
                member_epoch=v["member_epoch"], previous_member_epoch=v["previous_member_epoch"],
                subscribed_topic_names=None if names is None else tuple(names),
                subscribed_topic_regex=v["subscribed_topic_regex"],
                server_assignor=v["server_assignor"],
                rebalance_timeout_ms=v["rebalance_timeout_ms"],
                session_timeout_ms=v["session_timeout_ms"],
                assigned=_tps(v["assigned"]), pending_revocation=_tps(v["pending_revocation"]),
                client_id=v.get("client_id"), client_host=v.get("client_host"))
        if kind == TARGET:
            return TargetAssignmentRecord(
                group_id=ident[0], assignment_epoch=v["assignment_epoch"],
                assignment={m: _tps(ps) for m, ps in v["assignment"].items()})
        return OffsetCommitRecord(group_id=ident[0], topic=ident[1], partition=ident[2],
                                  offset=v["offset"], metadata=v["metadata"],
                                  commit_ms=v["commit_ms"])
    except (KeyError, TypeError, ValueError) as e:
        raise RecordFormatError(f"malformed {kind} record value {v!r}: {e}") from e
