"""Metadata records: the only way cluster metadata changes.

The active controller turns requests into records, the Raft quorum orders
them, and every controller and broker applies them, in order, to its own
``MetadataImage``. Names follow KRaft's metadata records.

Wire form (msgpack, never pickle)::

    [type name, version, {field: value, ...}]

``decode`` is strict: an unknown type, a missing or extra field, or a value of
the wrong type raises ``InvalidRecordError``, so a malformed record is refused
before it reaches the quorum.
"""

import dataclasses
import typing
from collections.abc import Callable
from typing import Any, ClassVar, Optional

import msgpack

from protocol.errors import InvalidRecordError

NO_LEADER = -1
RECORD_VERSION = 0

# Leader recovery states of a partition (Kafka's LeaderRecoveryState, KIP-704).
# RECOVERED: the leader's log is the partition's agreed history.
# RECOVERING: the leader was elected uncleanly (from outside the ISR) and has
# not yet said it took over; until it does, no other replica may join the ISR.
LEADER_RECOVERED = 0
LEADER_RECOVERING = 1
LEADER_RECOVERY_STATES = (LEADER_RECOVERED, LEADER_RECOVERING)


@dataclasses.dataclass(frozen=True)
class Record:
    """Base class. Subclasses are frozen dataclasses with a ``TYPE`` name."""

    TYPE: ClassVar[str] = ""

    def encode(self) -> bytes:
        """The wire form. Optional fields still at their default (None) are
        left out: decoding restores them, and a record that uses no field
        added later encodes exactly as it did before that field existed, so
        nodes of the previous version can still read it."""
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                  if not (f.default is None and getattr(self, f.name) is None)}
        return msgpack.packb([self.TYPE, RECORD_VERSION, fields], use_bin_type=True)


@dataclasses.dataclass(frozen=True)
class RegisterBrokerRecord(Record):
    """A broker (re)registered. Its broker epoch is this record's offset."""

    TYPE: ClassVar[str] = "register_broker"
    broker_id: int
    incarnation_id: str  # new per process start: tells a restart from a duplicate
    endpoints: dict[str, str]  # listener name -> "host:port"
    rack: Optional[str]
    # The broker's own default min.insync.replicas (for topics without an
    # override): the controller keeps eligible leader replicas by the
    # smallest any broker uses, so none advances its high watermark while
    # the controller counts its ISR below it. None: not said (older brokers).
    min_insync_replicas: Optional[int] = None


@dataclasses.dataclass(frozen=True)
class UnregisterBrokerRecord(Record):
    TYPE: ClassVar[str] = "unregister_broker"
    broker_id: int
    broker_epoch: int


@dataclasses.dataclass(frozen=True)
class FenceBrokerRecord(Record):
    """The broker's lease lapsed: it may lead nothing until unfenced."""

    TYPE: ClassVar[str] = "fence_broker"
    broker_id: int
    broker_epoch: int


@dataclasses.dataclass(frozen=True)
class UnfenceBrokerRecord(Record):
    """The broker heartbeats and has caught up with metadata."""

    TYPE: ClassVar[str] = "unfence_broker"
    broker_id: int
    broker_epoch: int


@dataclasses.dataclass(frozen=True)
class BrokerRegistrationChangeRecord(Record):
    """The broker entered (or left) controlled shutdown, or reported log
    directories it took offline after a disk error. ``offline_log_dirs`` and
    ``offline_replicas`` (topic id -> partitions whose logs were in those
    directories), when set, replace what the registration held; None leaves
    it. They only grow within one registration: a directory comes back only
    with a restart, which registers anew with none offline."""

    TYPE: ClassVar[str] = "broker_registration_change"
    broker_id: int
    broker_epoch: int
    in_controlled_shutdown: bool
    offline_log_dirs: Optional[list[str]] = None
    offline_replicas: Optional[dict[str, list[int]]] = None


@dataclasses.dataclass(frozen=True)
class TopicRecord(Record):
    TYPE: ClassVar[str] = "topic"
    name: str
    topic_id: str


@dataclasses.dataclass(frozen=True)
class PartitionRecord(Record):
    """A new partition with its replica assignment and first leader."""

    TYPE: ClassVar[str] = "partition"
    topic_id: str
    partition: int
    replicas: list[int]
    isr: list[int]
    leader: int  # NO_LEADER when offline
    leader_epoch: int
    partition_epoch: int


@dataclasses.dataclass(frozen=True)
class PartitionChangeRecord(Record):
    """A change to an existing partition; None fields are unchanged.

    Applying it bumps the partition epoch, and the leader epoch too when the
    leader changes, so every replica derives the same epochs. A leader change
    leaves ``leader_recovery_state`` as it was unless the record sets it: the
    controller decides it (RECOVERING after an unclean election).

    The reassignment, recovery and eligible-leader fields came later;
    records written before them decode with None (unchanged)."""

    TYPE: ClassVar[str] = "partition_change"
    topic_id: str
    partition: int
    leader: Optional[int] = None
    isr: Optional[list[int]] = None
    replicas: Optional[list[int]] = None
    adding_replicas: Optional[list[int]] = None  # replicas a reassignment brings in
    removing_replicas: Optional[list[int]] = None  # replicas a reassignment takes out
    leader_recovery_state: Optional[int] = None  # LEADER_RECOVERED or LEADER_RECOVERING
    # Eligible leader replicas (KIP-966): out of the ISR, yet known to hold
    # every committed record; and the leader before the partition went
    # offline (the last resort when no eligible replica is left).
    elr: Optional[list[int]] = None
    last_known_leader: Optional[int] = None


@dataclasses.dataclass(frozen=True)
class RemoveTopicRecord(Record):
    TYPE: ClassVar[str] = "remove_topic"
    topic_id: str


@dataclasses.dataclass(frozen=True)
class ConfigRecord(Record):
    """Set (or, with value None, delete) one config of a topic or broker.
    ``resource_name`` is a topic name, or a broker id as a string ("" for the
    cluster-wide broker default)."""

    TYPE: ClassVar[str] = "config"
    resource_type: str  # "topic" or "broker"
    resource_name: str
    name: str
    value: Optional[str]


@dataclasses.dataclass(frozen=True)
class ProducerIdsRecord(Record):
    """A block of producer ids handed to a broker: ids below
    ``next_producer_id`` are taken."""

    TYPE: ClassVar[str] = "producer_ids"
    broker_id: int
    broker_epoch: int
    next_producer_id: int


@dataclasses.dataclass(frozen=True)
class AccessControlEntryRecord(Record):
    """An ACL (protocol/acl.py) was created. Its identity is all of its
    fields, as in Kafka's StandardAcl: the same binding twice is one."""

    TYPE: ClassVar[str] = "acl"
    resource_type: str
    resource_name: str
    pattern_type: str
    principal: str
    host: str
    operation: str
    permission_type: str


@dataclasses.dataclass(frozen=True)
class RemoveAccessControlEntryRecord(AccessControlEntryRecord):
    """An ACL was deleted (the same fields)."""

    TYPE: ClassVar[str] = "remove_acl"


@dataclasses.dataclass(frozen=True)
class DelegationTokenRecord(Record):
    """A delegation token (protocol/tokens.py) made or renewed: the whole
    token, its HMAC excepted (nodes derive it from the cluster's secret)."""

    TYPE: ClassVar[str] = "delegation_token"
    token_id: str
    owner: str
    requester: str
    renewers: list[str]
    issue_timestamp_ms: int
    expiration_timestamp_ms: int
    max_timestamp_ms: int


@dataclasses.dataclass(frozen=True)
class RemoveDelegationTokenRecord(Record):
    """A delegation token expired (or was expired by its owner)."""

    TYPE: ClassVar[str] = "remove_delegation_token"
    token_id: str


@dataclasses.dataclass(frozen=True)
class NoOpRecord(Record):
    """Written by a newly active controller so its term commits an entry."""

    TYPE: ClassVar[str] = "no_op"


RECORD_TYPES: dict[str, type[Record]] = {
    cls.TYPE: cls for cls in (
        RegisterBrokerRecord, UnregisterBrokerRecord, FenceBrokerRecord, UnfenceBrokerRecord,
        BrokerRegistrationChangeRecord, TopicRecord, PartitionRecord, PartitionChangeRecord,
        RemoveTopicRecord, ConfigRecord, ProducerIdsRecord, AccessControlEntryRecord,
        RemoveAccessControlEntryRecord, DelegationTokenRecord, RemoveDelegationTokenRecord,
        NoOpRecord)
}
_HINTS = {cls: typing.get_type_hints(cls) for cls in RECORD_TYPES.values()}


def decode(data: bytes) -> Record:
    """Bytes -> record, refusing anything not exactly one of ours."""
    try:
        decoded = msgpack.unpackb(data, raw=False, strict_map_key=True)
    except Exception as exc:  # msgpack raises several unrelated types
        raise InvalidRecordError(f"metadata record is not valid msgpack: {exc}") from None
    if not (isinstance(decoded, list) and len(decoded) == 3):
        raise InvalidRecordError("metadata record must be [type, version, fields]")
    type_name, version, fields = decoded
    cls = RECORD_TYPES.get(type_name) if isinstance(type_name, str) else None
    if cls is None:
        raise InvalidRecordError(f"unknown metadata record type {type_name!r}")
    if version != RECORD_VERSION:
        raise InvalidRecordError(f"unsupported {type_name} record version {version!r}")
    return from_fields(cls, fields)


def from_fields(cls: type[Record], fields: Any) -> Record:
    """Build ``cls`` from a field dict, checking names and types."""
    if not isinstance(fields, dict):
        raise InvalidRecordError(f"{cls.TYPE} record fields must be a map")
    names, checks = _CHECKS[cls]
    if not names.issuperset(fields):
        unknown = set(fields) - names
        raise InvalidRecordError(f"{cls.TYPE} record has unknown fields {sorted(unknown)}")
    for name, required, check in checks:
        if name not in fields:
            if required:
                raise InvalidRecordError(f"{cls.TYPE} record lacks field {name!r}")
            continue
        if not check(fields[name]):
            hint = _HINTS[cls][name]
            raise InvalidRecordError(
                f"{cls.TYPE}.{name} must be {_type_name(hint)}, got {fields[name]!r}")
    return cls(**fields)


def _checker(hint: Any) -> Callable[[Any], bool]:
    """A function telling whether a decoded value has the type ``hint``
    names (bool is not an int here), built once per field: every broker
    and controller checks every metadata record it reads."""
    origin = typing.get_origin(hint)
    if origin is typing.Union:
        args = typing.get_args(hint)
        if len(args) == 2 and type(None) in args:  # Optional[X]: the common case
            inner = _checker(next(a for a in args if a is not type(None)))
            return lambda v: v is None or inner(v)
        checks = [_checker(arg) for arg in args]
        return lambda v: any(check(v) for check in checks)
    if hint is type(None):
        return lambda v: v is None
    if hint is int:
        return lambda v: isinstance(v, int) and not isinstance(v, bool)
    if hint in (str, bool):
        return lambda v: isinstance(v, hint)
    if origin is list:
        (item,) = typing.get_args(hint)
        check_item = _checker(item)
        return lambda v: isinstance(v, list) and all(check_item(x) for x in v)
    if origin is dict:
        key, item = typing.get_args(hint)
        check_key, check_value = _checker(key), _checker(item)
        return lambda v: isinstance(v, dict) and all(
            check_key(k) and check_value(x) for k, x in v.items())
    raise TypeError(f"unsupported field type {hint!r}")  # a bug in a record definition


#: Per record type: its field names, and each field's (name, required, check).
_CHECKS = {
    cls: (frozenset(f.name for f in dataclasses.fields(cls)),
          [(f.name, f.default is dataclasses.MISSING, _checker(_HINTS[cls][f.name]))
           for f in dataclasses.fields(cls)])
    for cls in RECORD_TYPES.values()}


def _type_name(hint: Any) -> str:
    return getattr(hint, "__name__", None) or str(hint).replace("typing.", "")
