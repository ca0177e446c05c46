"""The metadata image: cluster state as of one metadata offset.

Pure and deterministic: it changes only through ``apply(record, offset)``,
never reads a clock, and two images that applied the same records at the same
offsets are equal. Every controller holds one (applied from the Raft log) and
every broker holds one (applied from the records it fetches).

A record inconsistent with the image (unknown broker epoch, duplicate topic,
ISR outside the replicas, ...) raises ``MetadataApplyError`` and leaves the
image unchanged. The controller validates requests before proposing records,
so this happens only for a bug or a corrupted record; since all replicas hold
the same image, all refuse the same record alike.

Invariants (``check_invariants``):
  - ``offset`` only grows;
  - every partition's replicas are distinct, ISR is a subset of replicas,
    the leader is NO_LEADER or one of the replicas;
  - a partition's adding and removing replicas are disjoint subsets of its
    replicas, and its leader recovery state is RECOVERED or RECOVERING;
  - its eligible leader replicas are distinct replicas outside the ISR, and
    its last known leader NO_LEADER or a replica;
  - topic names and ids map one-to-one.
"""

from __future__ import annotations

import collections
import collections.abc
import dataclasses
from typing import Any

import msgpack

from kraft.records import (LEADER_RECOVERED, LEADER_RECOVERY_STATES, NO_LEADER,
                           AccessControlEntryRecord, BrokerRegistrationChangeRecord,
                           ConfigRecord, DelegationTokenRecord, FenceBrokerRecord, NoOpRecord,
                           PartitionChangeRecord, PartitionRecord, ProducerIdsRecord, Record,
                           RegisterBrokerRecord, RemoveAccessControlEntryRecord,
                           RemoveDelegationTokenRecord, RemoveTopicRecord, TopicRecord,
                           UnfenceBrokerRecord, UnregisterBrokerRecord)
from protocol import acl, quotas, scram
from protocol.tokens import TokenInfo
from protocol.errors import InvalidRequestError, MetadataApplyError

TOPIC_RESOURCE = "topic"
BROKER_RESOURCE = "broker"
# Client quotas: name = the entity as canonical JSON (protocol/quotas.py).
CLIENT_QUOTA_RESOURCE = quotas.CLIENT_QUOTA_RESOURCE
# SCRAM credentials: name = the user, config name = the mechanism (protocol/scram.py).
USER_SCRAM_RESOURCE = scram.USER_SCRAM_RESOURCE



_MISSING = object()


class SharedMap(collections.abc.MutableMapping):
    """A dict that image copies share (``MetadataImage.copy``): a base dict
    that no one changes any more, and this map's own changes over it (keys
    overwritten, added, deleted). Sharing costs the changes, not the base:
    a controller copies its image for every batch it drafts and applies,
    and with 10,000 topics copying the topic maps cost most of a creation.
    Iterates in the order a dict would (a key deleted and set again comes
    last), so images compare and snapshot alike however they were made.
    Once the changes grow past ``FOLD_AT``, the next share folds them into a
    new base first (one copy for that many changes)."""

    __slots__ = ("_base", "_over", "_new", "_gone")

    #: Changes a map carries before its next share folds them into a base.
    FOLD_AT = 512

    def __init__(self, base: dict | None = None) -> None:
        self._base: dict = {} if base is None else base  # never changed once shared
        self._over: dict = {}  # base keys given another value here
        self._new: dict = {}  # keys added here, in order (deleted base keys set again too)
        self._gone: set = set()  # base keys deleted here

    def share(self) -> "SharedMap":
        """An independent map equal to this one, for an image's copy."""
        if len(self._over) + len(self._new) + len(self._gone) > self.FOLD_AT:
            self._fold()
        copy = SharedMap(self._base)
        copy._over, copy._new, copy._gone = dict(self._over), dict(self._new), set(self._gone)
        return copy

    def _fold(self) -> None:
        gone = self._gone
        base = ({key: value for key, value in self._base.items() if key not in gone}
                if gone else dict(self._base))
        base.update(self._over)  # existing keys: their places kept
        base.update(self._new)  # added at the end, in order
        self._base, self._over, self._new, self._gone = base, {}, {}, set()

    def __getitem__(self, key):
        value = self._new.get(key, _MISSING)
        if value is not _MISSING:
            return value
        if key in self._gone:
            raise KeyError(key)
        value = self._over.get(key, _MISSING)
        return self._base[key] if value is _MISSING else value

    def get(self, key, default=None):
        value = self._new.get(key, _MISSING)
        if value is not _MISSING:
            return value
        if key in self._gone:
            return default
        value = self._over.get(key, _MISSING)
        return self._base.get(key, default) if value is _MISSING else value

    def __contains__(self, key) -> bool:
        return key in self._new or (key in self._base and key not in self._gone)

    def __setitem__(self, key, value) -> None:
        if key in self._new or key in self._gone or key not in self._base:
            self._new[key] = value
        else:
            self._over[key] = value

    def __delitem__(self, key) -> None:
        if key in self._new:
            del self._new[key]
        elif key in self._base and key not in self._gone:
            self._gone.add(key)
            self._over.pop(key, None)
        else:
            raise KeyError(key)

    def __iter__(self):
        gone = self._gone
        if gone:
            for key in self._base:
                if key not in gone:
                    yield key
        else:
            yield from self._base
        yield from self._new

    def __len__(self) -> int:
        return len(self._base) - len(self._gone) + len(self._new)

    def __repr__(self) -> str:
        return f"SharedMap({dict(self.items())!r})"


def _shared(value: dict | SharedMap) -> tuple[SharedMap, SharedMap]:
    """(the map the original keeps, the copy's): a plain dict becomes the
    frozen base of two ``SharedMap``s; a ``SharedMap`` is shared."""
    if isinstance(value, SharedMap):
        return value, value.share()
    return SharedMap(value), SharedMap(value)


@dataclasses.dataclass
class BrokerRegistration:
    broker_id: int
    incarnation_id: str
    broker_epoch: int  # offset of the registration record
    endpoints: dict[str, str]
    rack: str | None
    fenced: bool = True  # registered brokers start fenced until caught up
    in_controlled_shutdown: bool = False
    # Log directories the broker took offline after a disk error, and the
    # replicas whose logs were in them (topic id -> partitions): they may
    # neither lead nor join an ISR until the broker registers again.
    # Replaced, never changed in place (``copy`` shares them).
    offline_log_dirs: list[str] = dataclasses.field(default_factory=list)
    offline_replicas: dict[str, list[int]] = dataclasses.field(default_factory=dict)
    # Its own default min.insync.replicas, as it registered (None: not said).
    min_insync_replicas: int | None = None


def _copy_broker(broker: BrokerRegistration) -> BrokerRegistration:
    """A copy of ``broker`` with its own endpoints (its other containers
    are replaced, never changed in place): a third of the time of
    ``dataclasses.replace``, for every image copy the controller drafts on."""
    copy = object.__new__(BrokerRegistration)
    copy.__dict__.update(broker.__dict__)
    copy.endpoints = dict(broker.endpoints)
    return copy


@dataclasses.dataclass
class PartitionRegistration:
    """One partition as the metadata describes it. Never changed in place:
    ``apply`` replaces it (``MetadataImage.copy`` relies on that).

    While a reassignment is under way (KIP-455), ``replicas`` holds both the
    target replicas (first, in target order) and the original ones being
    removed; ``adding_replicas`` are the targets that were not replicas
    before, ``removing_replicas`` the originals that are not targets. Both
    are empty otherwise. Snapshots written before these fields existed load
    with the defaults."""

    replicas: list[int]
    isr: list[int]
    leader: int  # NO_LEADER while offline
    leader_epoch: int
    partition_epoch: int
    # Invariant: adding_replicas and removing_replicas are disjoint subsets of replicas.
    adding_replicas: list[int] = dataclasses.field(default_factory=list)
    removing_replicas: list[int] = dataclasses.field(default_factory=list)
    leader_recovery_state: int = LEADER_RECOVERED  # records.LEADER_RECOVERY_STATES
    # Eligible leader replicas (KIP-966): replicas that left the ISR while it
    # was below min.insync.replicas, when the high watermark stopped moving,
    # so they hold every committed record; a leader is elected from them
    # when no ISR member is left. ``last_known_leader``: while the partition
    # has no leader, the one it had last (Kafka keeps it in LastKnownElr),
    # elected only when the ISR and ELR are empty. Invariants: the ELR is
    # distinct replicas outside the ISR; the last known leader NO_LEADER or
    # a replica.
    elr: list[int] = dataclasses.field(default_factory=list)
    last_known_leader: int = NO_LEADER

    @property
    def reassigning(self) -> bool:
        """Whether a reassignment is under way."""
        return bool(self.adding_replicas or self.removing_replicas)

    @property
    def target_replicas(self) -> list[int]:
        """The replicas the partition will have once any reassignment is
        done (its replicas when none is under way)."""
        return [r for r in self.replicas if r not in self.removing_replicas]

    @property
    def original_replicas(self) -> list[int]:
        """The replicas before the reassignment under way, in their order in
        ``replicas`` (the replicas when none is under way)."""
        return [r for r in self.replicas if r not in self.adding_replicas]


@dataclasses.dataclass
class TopicImage:
    name: str
    topic_id: str
    partitions: dict[int, PartitionRegistration] = dataclasses.field(default_factory=dict)


def collision_key(topic: str) -> str:
    """Kafka's rule: '.' and '_' collide in metric names, so two topics may
    not differ only by them; topics with the same key collide."""
    return topic.replace(".", "_")


class MetadataImage:
    """Brokers, topics, partitions and configs as of ``offset``."""

    def __init__(self) -> None:
        # Offset of the last applied record; -1 before the first.
        self.offset = -1
        self.brokers: dict[int, BrokerRegistration] = {}
        self.topics: dict[str, TopicImage] = {}
        self.topic_names_by_id: dict[str, str] = {}
        # (resource type, resource name) -> {config name: value}
        self.configs: dict[tuple[str, str], dict[str, str]] = {}
        self.next_producer_id = 0
        # ACLs (protocol/acl.py). Shared between an image and its copies
        # until one of them changes its own (copy on write): most drafts
        # touch no ACL, and there may be tens of thousands.
        self.acls: set[acl.AclBinding] = set()
        self._acls_shared = False
        # Bumped on every ACL change: a key for caches of decisions, not state.
        self.acl_version = 0
        # Delegation tokens by id (protocol/tokens.py); copy-on-write like
        # ``acls`` (a cluster may hold many; most batches change none).
        self.delegation_tokens: dict[str, TokenInfo] = {}
        self._tokens_shared = False
        # Copy on write for topics and configs too: a copy shares every
        # TopicImage and config dict; the names below are the ones this
        # image made its own since (it may change those in place). Anything
        # not named may be shared, with the copy or with what it was copied
        # from, and is copied before its first change. The maps holding them
        # become ``SharedMap``s at the first copy. So ``copy`` costs neither
        # a copy of every partition map nor one of every topic.
        self._owned_topics: set[str] = set()
        self._owned_configs: set[tuple[str, str]] = set()
        # Kept up to date by ``apply``, so placing a new topic costs nothing
        # per existing partition: replicas and preferred leaderships (first
        # replicas) per broker id, and each topic's name by its
        # ``collision_key``.
        self.replica_counts: collections.Counter[int] = collections.Counter()
        self.preferred_leader_counts: collections.Counter[int] = collections.Counter()
        self.topics_by_collision_key: dict[str, str] = {}
        # How many topics have each key (more than one only in records from
        # before the rule): a deletion rescans only then.
        self._collision_key_topics: collections.Counter[str] = collections.Counter()
        # Bumped on every token change: a key for caches, not state.
        self.token_version = 0

    # -- applying ----------------------------------------------------------
    def apply(self, record: Record, offset: int) -> None:
        """Apply one record committed at ``offset`` (strictly increasing)."""
        assert offset > self.offset, f"metadata offset {offset} after {self.offset}"
        handler = self._HANDLERS.get(type(record))
        if handler is None:
            raise MetadataApplyError(f"no handler for record type {type(record).__name__}")
        handler(self, record, offset)  # validates fully before changing anything
        self.offset = offset

    def _register_broker(self, r: RegisterBrokerRecord, offset: int) -> None:
        if r.broker_id < 0:
            raise MetadataApplyError(f"broker id {r.broker_id} is negative")
        if r.min_insync_replicas is not None and r.min_insync_replicas < 1:
            raise MetadataApplyError(f"broker {r.broker_id}: min.insync.replicas "
                                     f"{r.min_insync_replicas} is below 1")
        self.brokers[r.broker_id] = BrokerRegistration(
            r.broker_id, r.incarnation_id, offset, dict(r.endpoints), r.rack,
            min_insync_replicas=r.min_insync_replicas)

    def _broker(self, broker_id: int, broker_epoch: int) -> BrokerRegistration:
        broker = self.brokers.get(broker_id)
        if broker is None:
            raise MetadataApplyError(f"broker {broker_id} is not registered")
        if broker.broker_epoch != broker_epoch:
            raise MetadataApplyError(
                f"broker {broker_id} epoch is {broker.broker_epoch}, record says {broker_epoch}")
        return broker

    def _unregister_broker(self, r: UnregisterBrokerRecord, offset: int) -> None:
        self._broker(r.broker_id, r.broker_epoch)
        del self.brokers[r.broker_id]

    def _fence_broker(self, r: FenceBrokerRecord, offset: int) -> None:
        broker = self._broker(r.broker_id, r.broker_epoch)
        broker.fenced = True

    def _unfence_broker(self, r: UnfenceBrokerRecord, offset: int) -> None:
        broker = self._broker(r.broker_id, r.broker_epoch)
        broker.fenced = False
        broker.in_controlled_shutdown = False

    def _change_registration(self, r: BrokerRegistrationChangeRecord, offset: int) -> None:
        broker = self._broker(r.broker_id, r.broker_epoch)
        broker.in_controlled_shutdown = r.in_controlled_shutdown
        if r.offline_log_dirs is not None:
            broker.offline_log_dirs = list(r.offline_log_dirs)
        if r.offline_replicas is not None:
            broker.offline_replicas = {topic_id: sorted(set(partitions)) for topic_id, partitions
                                       in r.offline_replicas.items()}

    def _topic(self, r: TopicRecord, offset: int) -> None:
        if r.name in self.topics:
            raise MetadataApplyError(f"topic {r.name!r} already exists")
        if r.topic_id in self.topic_names_by_id:
            raise MetadataApplyError(f"topic id {r.topic_id} already in use")
        self.topics[r.name] = TopicImage(r.name, r.topic_id)
        self._owned_topics.add(r.name)
        self.topics_by_collision_key[collision_key(r.name)] = r.name
        key = collision_key(r.name)
        self._collision_key_topics[key] = self._collision_key_topics.get(key, 0) + 1
        self.topic_names_by_id[r.topic_id] = r.name

    def _topic_by_id(self, topic_id: str) -> TopicImage:
        name = self.topic_names_by_id.get(topic_id)
        if name is None:
            raise MetadataApplyError(f"unknown topic id {topic_id}")
        return self.topics[name]

    def _count_replicas(self, replicas: list[int], sign: int) -> None:
        for broker_id in replicas:
            self.replica_counts[broker_id] += sign
        if replicas:
            self.preferred_leader_counts[replicas[0]] += sign

    def _own_topic(self, topic: TopicImage) -> TopicImage:
        """``topic``, this image's own to change (copied first if it may be shared)."""
        if topic.name not in self._owned_topics:
            topic = TopicImage(topic.name, topic.topic_id, dict(topic.partitions))
            self.topics[topic.name] = topic
            self._owned_topics.add(topic.name)
        return topic

    def _own_config(self, key: tuple[str, str]) -> dict[str, str]:
        """The configs of ``key``, this image's own to change (created if none)."""
        values = self.configs.get(key)
        if values is None or key not in self._owned_configs:
            values = self.configs[key] = dict(values or {})
            self._owned_configs.add(key)
        return values

    @staticmethod
    def _check_assignment(replicas: list[int], isr: list[int], leader: int, where: str) -> None:
        if not replicas or len(set(replicas)) != len(replicas):
            raise MetadataApplyError(f"{where}: replicas {replicas} must be distinct, non-empty")
        if len(set(isr)) != len(isr) or not set(isr) <= set(replicas):
            raise MetadataApplyError(f"{where}: ISR {isr} must be distinct replicas")
        if leader != NO_LEADER and leader not in replicas:
            raise MetadataApplyError(f"{where}: leader {leader} is not a replica")

    def _partition(self, r: PartitionRecord, offset: int) -> None:
        topic = self._topic_by_id(r.topic_id)
        where = f"{topic.name}-{r.partition}"
        if r.partition < 0 or r.partition in topic.partitions:
            raise MetadataApplyError(f"{where}: partition exists or is negative")
        self._check_assignment(r.replicas, r.isr, r.leader, where)
        self._count_replicas(r.replicas, 1)
        self._own_topic(topic).partitions[r.partition] = PartitionRegistration(
            list(r.replicas), list(r.isr), r.leader, r.leader_epoch, r.partition_epoch)

    @staticmethod
    def _check_eligible(replicas: list[int], isr: list[int], elr: list[int],
                        last_known_leader: int, where: str) -> None:
        if len(set(elr)) != len(elr) or not set(elr) <= set(replicas) or set(elr) & set(isr):
            raise MetadataApplyError(f"{where}: eligible leader replicas {elr} must be distinct "
                                     f"replicas outside the ISR {isr}")
        if last_known_leader != NO_LEADER and last_known_leader not in replicas:
            raise MetadataApplyError(
                f"{where}: last known leader {last_known_leader} is not a replica")

    @staticmethod
    def _check_reassignment(replicas: list[int], adding: list[int], removing: list[int],
                            leader_recovery_state: int, where: str) -> None:
        for name, members in (("adding", adding), ("removing", removing)):
            if len(set(members)) != len(members) or not set(members) <= set(replicas):
                raise MetadataApplyError(
                    f"{where}: {name} replicas {members} must be distinct replicas of "
                    f"{replicas}")
        if set(adding) & set(removing):
            raise MetadataApplyError(
                f"{where}: replicas {sorted(set(adding) & set(removing))} are both being "
                "added and removed")
        if leader_recovery_state not in LEADER_RECOVERY_STATES:
            raise MetadataApplyError(
                f"{where}: leader recovery state {leader_recovery_state} is not one of "
                f"{LEADER_RECOVERY_STATES}")

    def _partition_change(self, r: PartitionChangeRecord, offset: int) -> None:
        topic = self._topic_by_id(r.topic_id)
        where = f"{topic.name}-{r.partition}"
        current = topic.partitions.get(r.partition)
        if current is None:
            raise MetadataApplyError(f"{where}: no such partition")
        replicas = current.replicas if r.replicas is None else list(r.replicas)
        isr = current.isr if r.isr is None else list(r.isr)
        leader = current.leader if r.leader is None else r.leader
        adding = current.adding_replicas if r.adding_replicas is None else list(r.adding_replicas)
        removing = (current.removing_replicas if r.removing_replicas is None
                    else list(r.removing_replicas))
        recovery_state = (current.leader_recovery_state if r.leader_recovery_state is None
                          else r.leader_recovery_state)
        elr = current.elr if r.elr is None else list(r.elr)
        last_known_leader = (current.last_known_leader if r.last_known_leader is None
                             else r.last_known_leader)
        self._check_assignment(replicas, isr, leader, where)
        self._check_reassignment(replicas, adding, removing, recovery_state, where)
        self._check_eligible(replicas, isr, elr, last_known_leader, where)
        leader_epoch = current.leader_epoch + (1 if leader != current.leader else 0)
        if replicas != current.replicas:
            self._count_replicas(current.replicas, -1)
            self._count_replicas(replicas, 1)
        self._own_topic(topic).partitions[r.partition] = PartitionRegistration(
            replicas, isr, leader, leader_epoch, current.partition_epoch + 1,
            adding, removing, recovery_state, elr, last_known_leader)

    def _remove_topic(self, r: RemoveTopicRecord, offset: int) -> None:
        topic = self._topic_by_id(r.topic_id)
        for registration in topic.partitions.values():
            self._count_replicas(registration.replicas, -1)
        del self.topics[topic.name]
        self._owned_topics.discard(topic.name)
        key = collision_key(topic.name)
        self._collision_key_topics[key] -= 1
        if not self._collision_key_topics[key]:
            del self._collision_key_topics[key], self.topics_by_collision_key[key]
        elif self.topics_by_collision_key[key] == topic.name:
            # Another topic shares the key (records from before the rule, or
            # written by hand): it is now the one the key names.
            self.topics_by_collision_key[key] = next(
                name for name in self.topics if collision_key(name) == key)
        del self.topic_names_by_id[r.topic_id]
        self.configs.pop((TOPIC_RESOURCE, topic.name), None)
        self._owned_configs.discard((TOPIC_RESOURCE, topic.name))

    def _config(self, r: ConfigRecord, offset: int) -> None:
        if r.resource_type == TOPIC_RESOURCE:
            if r.resource_name not in self.topics:
                raise MetadataApplyError(f"config for unknown topic {r.resource_name!r}")
        elif r.resource_type not in (BROKER_RESOURCE, CLIENT_QUOTA_RESOURCE,
                                     USER_SCRAM_RESOURCE):
            raise MetadataApplyError(f"unknown config resource type {r.resource_type!r}")
        key = (r.resource_type, r.resource_name)
        if r.value is None:
            if r.name not in self.configs.get(key, ()):
                return
            values = self._own_config(key)
            del values[r.name]
            if not values:
                del self.configs[key]
                self._owned_configs.discard(key)
        else:
            self._own_config(key)[r.name] = r.value

    def _producer_ids(self, r: ProducerIdsRecord, offset: int) -> None:
        self._broker(r.broker_id, r.broker_epoch)
        if r.next_producer_id <= self.next_producer_id:
            raise MetadataApplyError(
                f"producer id block must move forward: {r.next_producer_id} <= "
                f"{self.next_producer_id}")
        self.next_producer_id = r.next_producer_id

    @staticmethod
    def _binding(r: AccessControlEntryRecord | RemoveAccessControlEntryRecord
                 ) -> acl.AclBinding:
        binding = acl.AclBinding(r.resource_type, r.resource_name, r.pattern_type, r.principal,
                                 r.host, r.operation, r.permission_type)
        try:
            acl.check_binding(binding)
        except InvalidRequestError as exc:
            raise MetadataApplyError(f"invalid ACL {binding}: {exc}") from None
        return binding

    def _own_acls(self) -> set[acl.AclBinding]:
        if self._acls_shared:
            self.acls = set(self.acls)
            self._acls_shared = False
        self.acl_version += 1
        return self.acls

    def _acl(self, r: AccessControlEntryRecord, offset: int) -> None:
        binding = self._binding(r)
        if binding in self.acls:
            raise MetadataApplyError(f"ACL {binding} already exists")
        self._own_acls().add(binding)

    def _remove_acl(self, r: RemoveAccessControlEntryRecord, offset: int) -> None:
        binding = self._binding(r)
        if binding not in self.acls:
            raise MetadataApplyError(f"ACL {binding} does not exist")
        self._own_acls().discard(binding)

    def _own_tokens(self) -> dict[str, TokenInfo]:
        if self._tokens_shared:
            self.delegation_tokens = dict(self.delegation_tokens)
            self._tokens_shared = False
        self.token_version += 1
        return self.delegation_tokens

    def _delegation_token(self, r: DelegationTokenRecord, offset: int) -> None:
        token = TokenInfo(r.token_id, r.owner, r.requester, tuple(r.renewers),
                          r.issue_timestamp_ms, r.expiration_timestamp_ms, r.max_timestamp_ms)
        _check_token(token)
        current = self.delegation_tokens.get(r.token_id)
        # A renewal (or an expiry set later) changes the expiry and nothing else.
        if current is not None and dataclasses.replace(
                current, expiration_timestamp_ms=token.expiration_timestamp_ms) != token:
            raise MetadataApplyError(f"delegation token {r.token_id} already exists: a "
                                     "record for it may change only its expiry")
        self._own_tokens()[r.token_id] = token

    def _remove_delegation_token(self, r: RemoveDelegationTokenRecord, offset: int) -> None:
        if r.token_id not in self.delegation_tokens:
            raise MetadataApplyError(f"no delegation token {r.token_id}")
        del self._own_tokens()[r.token_id]

    def _no_op(self, r: NoOpRecord, offset: int) -> None:
        pass

    _HANDLERS = {
        RegisterBrokerRecord: _register_broker,
        UnregisterBrokerRecord: _unregister_broker,
        FenceBrokerRecord: _fence_broker,
        UnfenceBrokerRecord: _unfence_broker,
        BrokerRegistrationChangeRecord: _change_registration,
        TopicRecord: _topic,
        PartitionRecord: _partition,
        PartitionChangeRecord: _partition_change,
        RemoveTopicRecord: _remove_topic,
        ConfigRecord: _config,
        ProducerIdsRecord: _producer_ids,
        AccessControlEntryRecord: _acl,
        RemoveAccessControlEntryRecord: _remove_acl,
        DelegationTokenRecord: _delegation_token,
        RemoveDelegationTokenRecord: _remove_delegation_token,
        NoOpRecord: _no_op,
    }

    def copy(self) -> "MetadataImage":
        """An independent image equal to this one, cheaply: the maps by
        topic are shared (``SharedMap``: each image keeps its own changes,
        so a copy costs what changed since the last fold, not the number of
        topics); topics, their partition maps and config dicts are shared
        and copied by whichever image changes one first;
        ``PartitionRegistration`` objects are shared because ``apply``
        replaces them and never changes one in place (brokers, which it does
        change, are copied). Used to apply or draft a batch all or nothing."""
        copy = MetadataImage()
        copy.offset = self.offset
        copy.brokers = {broker_id: _copy_broker(broker)
                        for broker_id, broker in self.brokers.items()}
        # The maps by topic (thousands of entries) are shared, each image
        # keeping its own changes (``SharedMap``); the TopicImages and config
        # dicts in them are shared too, and copied on write.
        self.topics, copy.topics = _shared(self.topics)
        self.topic_names_by_id, copy.topic_names_by_id = _shared(self.topic_names_by_id)
        self.configs, copy.configs = _shared(self.configs)
        self._owned_topics, self._owned_configs = set(), set()  # all shared now
        copy.replica_counts = self.replica_counts.copy()
        copy.preferred_leader_counts = self.preferred_leader_counts.copy()
        self.topics_by_collision_key, copy.topics_by_collision_key = _shared(
            self.topics_by_collision_key)
        self._collision_key_topics, copy._collision_key_topics = _shared(
            self._collision_key_topics)
        copy.next_producer_id = self.next_producer_id
        copy.acls = self.acls  # copied by whichever changes it first
        copy._acls_shared = self._acls_shared = True
        copy.acl_version = self.acl_version
        copy.delegation_tokens = self.delegation_tokens  # TokenInfo is frozen
        copy._tokens_shared = self._tokens_shared = True
        copy.token_version = self.token_version
        return copy

    # -- queries -----------------------------------------------------------
    def client_quotas(self) -> dict[str, dict[str, str]]:
        """Entity name (protocol/quotas.py) -> its quotas."""
        return {name: dict(values) for (kind, name), values in self.configs.items()
                if kind == CLIENT_QUOTA_RESOURCE}

    def scram_credentials(self, user: str) -> dict[str, str]:
        """Mechanism -> encoded SCRAM credential of ``user`` (empty: no such user)."""
        return dict(self.configs.get((USER_SCRAM_RESOURCE, user), {}))

    def scram_users(self) -> dict[str, dict[str, str]]:
        """User -> mechanism -> encoded credential."""
        return {name: dict(values) for (kind, name), values in self.configs.items()
                if kind == USER_SCRAM_RESOURCE}

    def acl_bindings(self) -> list[acl.AclBinding]:
        return sorted(self.acls)

    def topic_configs(self, name: str) -> dict[str, str]:
        return dict(self.configs.get((TOPIC_RESOURCE, name), {}))

    def partition(self, topic: str, partition: int) -> PartitionRegistration | None:
        image = self.topics.get(topic)
        return None if image is None else image.partitions.get(partition)

    def live_broker_ids(self) -> set[int]:
        """Brokers that may lead or join an ISR: unfenced and not in
        controlled shutdown (the controller and the brokers agree on it)."""
        return {b.broker_id for b in self.brokers.values()
                if not b.fenced and not b.in_controlled_shutdown}

    def live_broker_epochs(self) -> dict[int, int]:
        """``live_broker_ids`` with each one's registered broker epoch."""
        return {b.broker_id: b.broker_epoch for b in self.brokers.values()
                if not b.fenced and not b.in_controlled_shutdown}

    def brokers_offline_for(self, topic: str, partition: int) -> set[int]:
        """The brokers whose log of ``topic``-``partition`` is in a log
        directory they took offline: not eligible to lead or join its ISR."""
        holders = set()
        for broker in self.brokers.values():
            if broker.offline_replicas:
                topic_image = self.topics.get(topic)
                if (topic_image is not None and partition
                        in broker.offline_replicas.get(topic_image.topic_id, ())):
                    holders.add(broker.broker_id)
        return holders

    def unfenced_broker_ids(self) -> set[int]:
        return {b.broker_id for b in self.brokers.values() if not b.fenced}

    def partitions_led_by(self, broker_id: int) -> list[tuple[str, int]]:
        return sorted((t.name, p) for t in self.topics.values()
                      for p, reg in t.partitions.items() if reg.leader == broker_id)

    def check_invariants(self) -> None:
        assert set(self.topic_names_by_id.values()) == set(self.topics)
        replicas: collections.Counter[int] = collections.Counter()
        preferred: collections.Counter[int] = collections.Counter()
        for topic in self.topics.values():
            for reg in topic.partitions.values():
                replicas.update(reg.replicas)
                preferred.update(reg.replicas[:1])
        for counts in (self.replica_counts, self.preferred_leader_counts):
            assert min(counts.values(), default=0) >= 0, counts
        assert +self.replica_counts == replicas, (self.replica_counts, replicas)
        assert +self.preferred_leader_counts == preferred
        assert {collision_key(name) for name in self.topics} == set(
            self.topics_by_collision_key)
        for key, name in self.topics_by_collision_key.items():
            assert name in self.topics and collision_key(name) == key, (key, name)
        assert self._collision_key_topics == collections.Counter(
            collision_key(name) for name in self.topics)
        for topic_id, name in self.topic_names_by_id.items():
            assert self.topics[name].topic_id == topic_id
        for topic in self.topics.values():
            for p, reg in topic.partitions.items():
                self._check_assignment(reg.replicas, reg.isr, reg.leader, f"{topic.name}-{p}")
                self._check_reassignment(reg.replicas, reg.adding_replicas,
                                         reg.removing_replicas, reg.leader_recovery_state,
                                         f"{topic.name}-{p}")
                self._check_eligible(reg.replicas, reg.isr, reg.elr, reg.last_known_leader,
                                     f"{topic.name}-{p}")

    # -- snapshots ---------------------------------------------------------
    def to_snapshot(self) -> bytes:
        """The whole image as msgpack, for Raft snapshots and broker bootstrap."""
        return msgpack.packb({
            "offset": self.offset,
            "brokers": [_broker_snapshot(b) for b in self.brokers.values()],
            "topics": [{"name": t.name, "topic_id": t.topic_id,
                        "partitions": {p: _partition_snapshot(reg)
                                       for p, reg in t.partitions.items()}}
                       for t in self.topics.values()],
            "configs": [[rtype, rname, values] for (rtype, rname), values in
                        self.configs.items()],
            "next_producer_id": self.next_producer_id,
            "acls": sorted(list(binding) for binding in self.acls),
            "delegation_tokens": [t.to_wire() for _, t in sorted(self.delegation_tokens.items())],
        }, use_bin_type=True)

    @classmethod
    def from_snapshot(cls, data: bytes) -> "MetadataImage":
        raw: dict[str, Any] = msgpack.unpackb(data, raw=False, strict_map_key=False)
        image = cls()
        image.offset = raw["offset"]
        for b in raw["brokers"]:
            image.brokers[b["broker_id"]] = BrokerRegistration(**b)
        for t in raw["topics"]:
            topic = TopicImage(t["name"], t["topic_id"], {
                int(p): PartitionRegistration(**reg) for p, reg in t["partitions"].items()})
            image.topics[topic.name] = topic
            image.topic_names_by_id[topic.topic_id] = topic.name
            image.topics_by_collision_key[collision_key(topic.name)] = topic.name
            key = collision_key(topic.name)
            image._collision_key_topics[key] = image._collision_key_topics.get(key, 0) + 1
            for registration in topic.partitions.values():
                image._count_replicas(registration.replicas, 1)
        image.configs = {(rtype, rname): dict(values) for rtype, rname, values in raw["configs"]}
        image.next_producer_id = raw["next_producer_id"]
        # Snapshots written before ACLs existed have none.
        image.acls = {acl.AclBinding(*fields) for fields in raw.get("acls", ())}
        image.acl_version = 1 if image.acls else 0
        for t in raw.get("delegation_tokens", ()):
            try:
                token = TokenInfo(**{**t, "renewers": tuple(t["renewers"])})
            except (TypeError, KeyError) as exc:
                raise MetadataApplyError(f"snapshot: a delegation token is malformed: "
                                         f"{exc}") from None
            _check_token(token)
            image.delegation_tokens[token.token_id] = token
        image.check_invariants()
        return image

    def __eq__(self, other: object) -> bool:
        return isinstance(other, MetadataImage) and self.to_snapshot() == other.to_snapshot()

    def __repr__(self) -> str:
        return (f"MetadataImage(offset={self.offset}, brokers={sorted(self.brokers)}, "
                f"topics={sorted(self.topics)})")


def _broker_snapshot(broker: BrokerRegistration) -> dict:
    """A broker as a snapshot holds it. The offline fields only when set:
    a snapshot of a cluster without disk errors loads on the version
    before them too (a rolling upgrade or downgrade)."""
    fields = dataclasses.asdict(broker)
    for name in ("offline_log_dirs", "offline_replicas", "min_insync_replicas"):
        if not fields[name]:
            del fields[name]
    return fields


def _partition_snapshot(registration: PartitionRegistration) -> dict:
    """A partition as a snapshot holds it; its eligible leader replicas only
    when it has some, for the same reason as ``_broker_snapshot``."""
    fields = dataclasses.asdict(registration)
    if not fields["elr"]:
        del fields["elr"]
    if fields["last_known_leader"] == NO_LEADER:
        del fields["last_known_leader"]
    return fields


def _check_token(token: TokenInfo) -> None:
    """A delegation token as a record or a snapshot gives it: typed fields,
    and its times in order (issue <= expiry <= maximum)."""
    texts = (token.token_id, token.owner, token.requester, *token.renewers)
    times = (token.issue_timestamp_ms, token.expiration_timestamp_ms, token.max_timestamp_ms)
    if not all(isinstance(t, str) and t for t in texts) or not all(
            isinstance(t, int) and not isinstance(t, bool) for t in times):
        raise MetadataApplyError(f"delegation token {token.token_id!r} is malformed")
    if not times[0] <= times[1] <= times[2]:
        raise MetadataApplyError(
            f"delegation token {token.token_id}: its times must be issue <= expiry <= max")
