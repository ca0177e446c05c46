"""The active controller's pure core: requests in, metadata records out.

Who calls what. The I/O shell (``kraft/server.py``) runs on the Raft leader.
It decodes each HTTP request into a plain dict, takes its write lock (so calls
into this core are serialised), calls one method here with the current
``MetadataImage``, proposes the returned records as ONE atomic batch, waits
until they are committed, and answers with the returned response. The shell
guarantees the batch is applied on exactly the image the core saw (else it is
rejected and the request retried), so the records of a batch land at offsets
``image.offset + 1``, ``image.offset + 2``, ... in order; a
``RegisterBrokerRecord`` at batch index i gives the broker epoch
``image.offset + 1 + i``, which the response reports.

Purity. No I/O, threads, sleeps or wall clock: time comes in as ``now_ms``
(monotonic milliseconds) and topic ids from the injected ``id_factory``.
The core never mutates the image it is given: it builds each batch against a
scratch copy (``_Draft``), applying every record as it is emitted, so later
decisions in the same batch see earlier ones and every returned record is
known to apply. Its only own state is not replicated and is rebuilt by
``become_active``: the broker leases (time of the last heartbeat) and the time
of the last periodic preferred-leader check.

Errors. A request that is refused as a whole raises a ``KraftError``
subclass. A malformed body (wrong type, missing field, out-of-range number,
over a limit) raises ``InvalidRequestError`` naming the field. Batch requests
(create/delete topics, create partitions, describe/alter configs, elect
leaders, reassign partitions) report errors that depend on the cluster per
item as ``{"code": ..., "message": ...}`` and go on with the other items.

Liveness. A broker is *live* when it is registered, unfenced and not in
controlled shutdown; only live brokers take new replicas, lead, or join an ISR.

Reassignment (Kafka's KIP-455). ``alter_partition_reassignments`` gives a
partition a target replica list. Until every target replica is in the ISR,
the partition has both the target and the original replicas (the new ones
in ``adding_replicas``, the leaving ones in ``removing_replicas``), so the
new replicas copy the log from the leader like any follower. Every change
of a partition ends with ``_complete_reassignment_if_caught_up``: the batch
that brings the last target into the ISR (an AlterPartition, or an unclean
election) also drops the leaving replicas.

Leader recovery (Kafka's KIP-704). An unclean election (a leader from
outside the ISR, only where ``unclean.leader.election.enable`` allows it)
marks the partition RECOVERING and logs a warning, since records the old
ISR acknowledged may be gone. While RECOVERING the ISR is only the leader:
it cannot grow until the leader's AlterPartition says RECOVERED. A clean
election ends it too: while RECOVERING the ISR holds only the unclean
leader, so a clean election can only pick that broker again, whose log is by
then the partition's history anyway. The warning is logged when the core
decides, so a batch the shell then fails to commit (and recomputes) may log
it once more.
"""

from __future__ import annotations

import base64
import collections
import dataclasses
import logging
import secrets
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from kraft.config import NodeConfig
from kraft.image import (TOPIC_RESOURCE, BrokerRegistration, MetadataImage, PartitionRegistration,
                         collision_key)
from kraft.placement import (BrokerInfo, elect_leader, isr_after_fencing, place_replicas,
                             preferred_leader_election)
from kraft.records import (LEADER_RECOVERED, LEADER_RECOVERING, NO_LEADER,
                           AccessControlEntryRecord, BrokerRegistrationChangeRecord, ConfigRecord,
                           DelegationTokenRecord, FenceBrokerRecord,
                           RemoveDelegationTokenRecord, PartitionChangeRecord, PartitionRecord,
                           ProducerIdsRecord, Record, RegisterBrokerRecord,
                           RemoveAccessControlEntryRecord, RemoveTopicRecord, TopicRecord,
                           UnfenceBrokerRecord)
from kraft.topic_config import (MIN_INSYNC_REPLICAS, TOPIC_CONFIGS,
                                UNCLEAN_LEADER_ELECTION_ENABLE, builtin_defaults,
                                defaults_from_broker_config, normalise_topic_config, printable,
                                unclean_election_enabled, validate_topic_configs)
from protocol import acl, quotas, scram
from protocol.errors import (BrokerIdNotRegisteredError, DelegationTokenExpiredError,
                             DelegationTokenNotFoundError, DelegationTokenOwnerMismatchError,
                             DuplicateBrokerRegistrationError,
                             FencedLeaderEpochError, IneligibleReplicaError, InvalidConfigError,
                             InvalidPartitionsError, InvalidReplicationFactorError,
                             InvalidRequestError, InvalidTopicError, InvalidUpdateVersionError,
                             KraftError, NoReassignmentInProgressError, NotLeaderOrFollowerError,
                             ResourceNotFoundError,
                             StaleBrokerEpochError, TopicAlreadyExistsError,
                             UnknownLeaderEpochError, UnknownServerError,
                             UnknownTopicOrPartitionError)
from protocol.fields import Fields, as_int, as_str
from protocol.tokens import new_token_id
from storage import errors as storage_errors
from storage.manager import validate_topic_name

logger = logging.getLogger(__name__)

# -- limits (a limit on everything) -------------------------------------------
TOPICS_PER_REQUEST_MAX = 1000  # topics or config resources in one request
#: ACLs a cluster may hold (each is in every node's memory).
ACLS_MAX = 100_000
#: Delegation tokens a cluster may hold (each is a metadata record, and
#: every node keeps them all in memory).
TOKENS_MAX = 100_000
TOKEN_RENEWERS_MAX = 100
PARTITIONS_PER_TOPIC_MAX = 10_000
PARTITIONS_PER_REQUEST_MAX = 10_000  # partitions created, or named, by one request
REPLICAS_PER_PARTITION_MAX = 1000  # replica list / ISR length in a request
CONFIGS_PER_RESOURCE_MAX = 1000  # config entries or ops per topic in a request
CONFIG_LIST_ITEMS_MAX = 16  # words of a list-typed config value (cleanup.policy)
NAME_CHARS_MAX = 1024  # any name in a request; the Kafka rule (249) is checked per item
INCARNATION_ID_CHARS_MAX = 64
ENDPOINTS_MAX = 16
ENDPOINT_CHARS_MAX = 300  # "host:port" and listener names
RACK_CHARS_MAX = 255
TOPIC_ID_ATTEMPTS_MAX = 16  # fresh ids drawn before giving up on a colliding factory
LOG_DIRS_MAX = 256  # log directories a broker reports offline in one heartbeat
LOG_DIR_CHARS_MAX = 4096
OFFLINE_REPLICAS_MAX = 1_000_000  # partitions a broker reports offline in one heartbeat

INT32_MAX = 2**31 - 1  # broker ids, partitions, epochs (Kafka int32)
INT64_MAX = 2**63 - 1  # metadata offsets and broker epochs (Kafka int64)

#: Producer ids a broker takes from the controller at a time (Kafka's block).
PRODUCER_ID_BLOCK_SIZE = 1000
#: Producer ids are int64; the last block must end by then.
PRODUCER_ID_MAX = 2**63 - 1

CONFIG_SOURCE_TOPIC = "TOPIC_CONFIG"
CONFIG_SOURCE_DEFAULT = "DEFAULT_CONFIG"
PREFERRED_LEADER_NOT_AVAILABLE = "PREFERRED_LEADER_NOT_AVAILABLE"
ELECTION_NOT_NEEDED = "ELECTION_NOT_NEEDED"
ELIGIBLE_LEADERS_NOT_AVAILABLE = "ELIGIBLE_LEADERS_NOT_AVAILABLE"
#: ElectLeaders' election_type (names, and Kafka's numbers) -> whether unclean.
ELECTION_TYPES = {"preferred": False, "unclean": True, 0: False, 1: True}


def _int_setting(name: str, value: Any, minimum: int, maximum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not minimum <= value <= maximum:
        raise InvalidConfigError(
            f"{name} must be an integer from {minimum} to {maximum}, got {printable(value)}")


@dataclasses.dataclass(frozen=True)
class ControllerSettings:
    """The controller's settings, with the Kafka setting each comes from.

    ``unclean_leader_election_enable`` is the cluster default of the topic
    config ``unclean.leader.election.enable``; it always wins over that key in
    ``topic_config_defaults``, which is normalised (values as canonical
    strings) when the settings are built.
    """

    session_timeout_ms: int = 9000  # broker.session.timeout.ms
    heartbeat_interval_ms: int = 2000  # broker.heartbeat.interval.ms
    default_num_partitions: int = 1  # num.partitions
    default_replication_factor: int = 1  # default.replication.factor
    unclean_leader_election_enable: bool = False  # unclean.leader.election.enable
    auto_leader_rebalance_enable: bool = True  # auto.leader.rebalance.enable
    # leader.imbalance.check.interval.seconds * 1000
    leader_imbalance_check_interval_ms: int = 300_000
    # Topic key -> default value, from the node's broker-level settings.
    topic_config_defaults: Mapping[str, str] = dataclasses.field(default_factory=dict)
    token_expiry_ms: int = 86_400_000  # delegation.token.expiry.time.ms
    token_max_lifetime_ms: int = 604_800_000  # delegation.token.max.lifetime.ms
    # eligible.leader.replicas.enable: KIP-966 (Kafka's eligible.leader.replicas.version=1).
    eligible_leader_replicas: bool = True

    def __post_init__(self) -> None:
        _int_setting("broker.session.timeout.ms", self.session_timeout_ms, 1, INT32_MAX)
        # A broker must get several heartbeats in before its session lapses.
        _int_setting("broker.heartbeat.interval.ms (below broker.session.timeout.ms)",
                     self.heartbeat_interval_ms, 1, self.session_timeout_ms - 1)
        _int_setting("num.partitions", self.default_num_partitions, 1, PARTITIONS_PER_TOPIC_MAX)
        _int_setting("default.replication.factor", self.default_replication_factor, 1,
                     REPLICAS_PER_PARTITION_MAX)
        _int_setting("leader.imbalance.check.interval.ms",
                     self.leader_imbalance_check_interval_ms, 1, INT64_MAX)
        for name in ("unclean_leader_election_enable", "auto_leader_rebalance_enable",
                     "eligible_leader_replicas"):
            if not isinstance(getattr(self, name), bool):
                raise InvalidConfigError(f"{name} must be a boolean")
        defaults = validate_topic_configs(self.topic_config_defaults)
        defaults[UNCLEAN_LEADER_ELECTION_ENABLE] = (
            "true" if self.unclean_leader_election_enable else "false")
        object.__setattr__(self, "topic_config_defaults", defaults)

    @classmethod
    def from_node(cls, config: NodeConfig) -> "ControllerSettings":
        """The settings of a node's config (already parsed and checked by
        kraft/config.py); topic defaults from its broker-level keys."""
        return cls(
            session_timeout_ms=config.session_timeout_ms,
            heartbeat_interval_ms=config.heartbeat_interval_ms,
            default_num_partitions=config.num_partitions,
            default_replication_factor=config.default_replication_factor,
            unclean_leader_election_enable=config.unclean_leader_election_enable,
            auto_leader_rebalance_enable=config.auto_leader_rebalance_enable,
            leader_imbalance_check_interval_ms=config.leader_imbalance_check_interval_ms,
            topic_config_defaults=defaults_from_broker_config(config.settings),
            token_expiry_ms=config.settings.get("delegation.token.expiry.time.ms", 86_400_000),
            token_max_lifetime_ms=config.settings.get("delegation.token.max.lifetime.ms",
                                                      604_800_000),
            eligible_leader_replicas=config.settings.get("eligible.leader.replicas.enable",
                                                         True),
        )


@dataclasses.dataclass
class ControllerResult:
    """What a write request produced: records to propose as one atomic batch
    (possibly none) and the response body to send once they are committed."""

    records: list[Record]
    response: dict


def random_topic_id() -> str:
    """The default ``id_factory``: 16 random bytes as unpadded base64url (22
    characters), Kafka's topic id form. Like Kafka, ids that start with '-'
    are drawn again, so they never look like a command-line option."""
    while True:
        topic_id = base64.urlsafe_b64encode(secrets.token_bytes(16)).rstrip(b"=").decode()
        if not topic_id.startswith("-"):
            return topic_id


class Controller:
    """The controller core. One instance lives in the active controller's
    shell; ``become_active`` is called each time this node wins leadership.

    Non-replicated state (rebuilt by ``become_active``):
      - ``_lease_start_ms[b]``: when broker b last heartbeated or registered
        (or when this controller first noticed it). Its lease lapses at
        ``_lease_start_ms[b] + session_timeout_ms``.
      - ``_last_preferred_check_ms``: when ``tick`` last ran the periodic
        preferred-leader election.
    """

    def __init__(self, settings: ControllerSettings,
                 id_factory: Callable[[], str] | None = None) -> None:
        self.settings = settings
        self._id_factory = id_factory or random_topic_id
        self._lease_start_ms: dict[int, int] = {}
        self._last_preferred_check_ms: int | None = None
        self._config_defaults = builtin_defaults()
        self._config_defaults.update(settings.topic_config_defaults)
        #: (the tokens dict, its version, the earliest expiry among them).
        self._token_expiry_cache: tuple[Any, int, int] = (None, -1, 0)

    # -- leadership and leases ----------------------------------------------
    def become_active(self, image: MetadataImage, now_ms: int) -> None:
        """This node just became the Raft leader. Every registered broker gets
        a fresh lease starting now (the previous controller's view of its
        heartbeats is lost, so each gets a full session of grace); fenced and
        unregistered brokers get none; the preferred-election timer restarts."""
        # Fenced brokers get none: nothing depends on their liveness, and a
        # restarted process may take over their id at once.
        self._lease_start_ms = {broker_id: now_ms for broker_id, broker in image.brokers.items()
                                if not broker.fenced}
        self._last_preferred_check_ms = now_ms
        for warning in self.unwritable_topics(image):
            logger.warning(warning)

    def unwritable_topics(self, image: MetadataImage) -> list[str]:
        """A warning per topic no acks=all write could reach: fewer replicas
        than its min.insync.replicas, typically after the cluster default
        was raised (a topic's own override cannot get there: it is refused)."""
        default = self.settings.topic_config_defaults.get(MIN_INSYNC_REPLICAS, "1")
        warnings = []
        for name, topic in sorted(image.topics.items()):
            min_isr = int(image.topic_configs(name).get(MIN_INSYNC_REPLICAS, default))
            replication = min((len(reg.replicas) for reg in topic.partitions.values()),
                              default=min_isr)
            if replication < min_isr:
                warnings.append(
                    f"topic {name!r} has {replication} replicas, fewer than its "
                    f"min.insync.replicas={min_isr}: every acks=all write to it fails, and "
                    f"no other becomes readable (the high watermark waits for that many); set "
                    f"`kraftlog topics alter {name} --config min.insync.replicas="
                    f"{replication}` or lower the cluster default")
        return warnings

    def lease_expiry_ms(self, broker_id: int) -> int | None:
        """When the broker's lease lapses (monotonic ms), None if it has none."""
        start_ms = self._lease_start_ms.get(broker_id)
        return None if start_ms is None else start_ms + self.settings.session_timeout_ms

    def _lease_is_live(self, broker_id: int, now_ms: int) -> bool:
        # A broker this controller has no lease for gets one starting now.
        start_ms = self._lease_start_ms.setdefault(broker_id, now_ms)
        return now_ms - start_ms < self.settings.session_timeout_ms

    def end_lease(self, image: MetadataImage, broker_id: int, broker_epoch: int,
                  closed_ms: int | None = None) -> bool:
        """Certain evidence that broker ``broker_id``'s process of
        ``broker_epoch`` is gone: the connection it holds open to the active
        controller closed and was not reopened (a process that dies has its
        sockets closed by its kernel; a paused or partitioned one does not).
        Its lease ends now, so the next ``tick`` fences it exactly as if the
        lease had lapsed, without waiting out ``session_timeout_ms``. False
        (nothing changes) for a fenced or unknown broker or another epoch:
        a registration's later process, or one already gone; and for a
        broker that heartbeated after ``closed_ms``, when the connection
        closed: it is alive, whatever its connection did."""
        broker = image.brokers.get(broker_id)
        if broker is None or broker.fenced or broker.broker_epoch != broker_epoch:
            return False
        if closed_ms is not None and self._lease_start_ms.get(broker_id, closed_ms) > closed_ms:
            return False
        self._lease_start_ms[broker_id] = -(2**62)
        return True

    def _holds_session(self, broker: BrokerRegistration, now_ms: int) -> bool:
        """Whether a registration still belongs to a live process: an
        unfenced broker until its lease lapses; a fenced one only while it
        keeps heartbeating (it has a lease only if it heartbeated since this
        controller became active, and none once its controlled shutdown is
        complete)."""
        if not broker.fenced:
            return self._lease_is_live(broker.broker_id, now_ms)
        start_ms = self._lease_start_ms.get(broker.broker_id)
        return start_ms is not None and now_ms - start_ms < self.settings.session_timeout_ms

    def tick(self, image: MetadataImage, now_ms: int) -> list[Record]:
        """Periodic work, called by the shell on a timer. Fences every
        unfenced broker whose lease lapsed (``now_ms - last heartbeat >=
        session_timeout_ms``), all in one batch, by broker id. Then, when
        ``auto_leader_rebalance_enable`` and the check interval elapsed,
        moves leadership back to each partition's preferred leader wherever
        that one is live and in sync.

        Unlike ZooKeeper-mode Kafka (and like KRaft's controller) there is no
        ``leader.imbalance.per.broker.percentage`` threshold: every partition
        whose preferred leader is eligible moves. Returns [] when idle."""
        lapsed = [broker_id for broker_id, broker in sorted(image.brokers.items())
                  if not broker.fenced and not self._lease_is_live(broker_id, now_ms)]
        draft = None
        if lapsed:
            draft = _Draft(image, self.settings)
            self._fence_brokers(draft, lapsed)
        if self._preferred_check_due(now_ms):
            self._last_preferred_check_ms = now_ms
            current = draft.image if draft else image
            moves = _preferred_moves(current, sorted(
                (name, p) for name, topic in current.topics.items() for p in topic.partitions))
            if moves:
                draft = draft or _Draft(image, self.settings)
                for topic, partition, leader in moves:
                    _change_partition(draft, topic, partition, leader=leader)
        return draft.records if draft else []

    def own_state(self) -> tuple:
        """The core's own state (leases, the preferred-leader timer), to put
        back with ``restore_own_state`` when records computed since were
        never committed and are computed again: a registration's fresh
        lease must not make its own retry look like a live duplicate."""
        return dict(self._lease_start_ms), self._last_preferred_check_ms

    def restore_own_state(self, state: tuple) -> None:
        leases, self._last_preferred_check_ms = state
        self._lease_start_ms = dict(leases)

    def _preferred_check_due(self, now_ms: int) -> bool:
        if not self.settings.auto_leader_rebalance_enable:
            return False
        if self._last_preferred_check_ms is None:  # become_active was not called
            self._last_preferred_check_ms = now_ms
        return (now_ms - self._last_preferred_check_ms
                >= self.settings.leader_imbalance_check_interval_ms)

    # -- brokers ------------------------------------------------------------
    def register_broker(self, image: MetadataImage, request: Any, now_ms: int
                        ) -> ControllerResult:
        """BrokerRegistration. The same incarnation again is a retry: no
        records, the current epoch. A different incarnation replaces the old
        one only once the old lease lapsed (else another live process uses
        this id: ``DuplicateBrokerRegistrationError``); an unfenced old
        registration is fenced first, exactly as on lease expiry. The new
        registration starts fenced and gets a fresh lease.

        ``clean_shutdown`` (default false) says the broker's logs lost
        nothing unflushed when it last stopped (a clean shutdown, or a crash
        of its process alone: ``LogManager.nothing_unflushed_lost``).
        Otherwise they may have lost their unflushed tail, so it stops being
        an eligible leader replica anywhere (KIP-966), in the same batch.
        ``min_insync_replicas`` (optional): the broker's own default, which
        ``_min_insync_replicas`` takes into account."""
        body = Fields(request, "")
        broker_id = body.integer("broker_id", 0, INT32_MAX)
        clean_shutdown = body.boolean("clean_shutdown", default=False)
        min_isr = body.integer("min_insync_replicas", 1, REPLICAS_PER_PARTITION_MAX,
                               default=None)
        incarnation_id = body.string("incarnation_id", INCARNATION_ID_CHARS_MAX)
        endpoints = _endpoints(body)
        rack = body.string("rack", RACK_CHARS_MAX, min_chars=0, default=None)
        existing = image.brokers.get(broker_id)
        if existing is not None and existing.incarnation_id == incarnation_id:
            if (existing.endpoints != endpoints or existing.rack != rack
                    or existing.min_insync_replicas != min_isr):
                raise InvalidRequestError(
                    f"broker {broker_id} incarnation {incarnation_id!r} is already registered "
                    "with other endpoints or rack; a restarted process needs a new incarnation_id")
            self._lease_start_ms[broker_id] = now_ms
            return ControllerResult([], {"broker_id": broker_id,
                                         "broker_epoch": existing.broker_epoch})
        if existing is not None and self._holds_session(existing, now_ms):
            raise DuplicateBrokerRegistrationError(
                f"broker {broker_id} is registered by incarnation {existing.incarnation_id!r}, "
                f"whose lease is live until {self.lease_expiry_ms(broker_id)}; is node.id "
                "configured twice? A restarted broker may register once that lease lapses")
        draft = _Draft(image, self.settings)
        if existing is not None and not existing.fenced:
            self._fence_brokers(draft, [broker_id])
        broker_epoch = draft.add(RegisterBrokerRecord(broker_id, incarnation_id, endpoints, rack,
                                                      min_insync_replicas=min_isr))
        if not clean_shutdown:
            _forget_unclean_replica(draft, broker_id)
        self._lease_start_ms[broker_id] = now_ms
        return ControllerResult(draft.records,
                                {"broker_id": broker_id, "broker_epoch": broker_epoch})

    def heartbeat(self, image: MetadataImage, request: Any, now_ms: int) -> ControllerResult:
        """BrokerHeartbeat: renews the lease, takes the broker's replicas in
        log directories it reports offline (``offline_log_dirs``,
        ``offline_replicas``: topic id -> partitions) out of their ISRs and
        leadership, then moves the broker one step: controlled shutdown
        (``want_shutdown``, or already in it), fencing on request
        (``want_fence``), or unfencing once the broker's metadata has reached
        its own registration (``metadata_offset >= broker_epoch``)."""
        body = Fields(request, "")
        broker_id = body.integer("broker_id", 0, INT32_MAX)
        broker_epoch = body.integer("broker_epoch", 0, INT64_MAX)
        metadata_offset = body.integer("metadata_offset", -1, INT64_MAX)
        want_fence = body.boolean("want_fence", default=False)
        want_shutdown = body.boolean("want_shutdown", default=False)
        offline_dirs = body.strings("offline_log_dirs", LOG_DIRS_MAX, LOG_DIR_CHARS_MAX,
                                    default=[])
        offline = _offline_replicas(body)
        broker = _registered_broker(image, broker_id, broker_epoch)
        self._lease_start_ms[broker_id] = now_ms
        caught_up = metadata_offset >= broker.broker_epoch
        draft, should_shut_down = None, False
        if offline_dirs or offline:
            draft = self._take_replicas_offline(image, broker, offline_dirs, offline)
            if draft is not None:
                image, broker = draft.image, draft.image.brokers[broker_id]
        if want_shutdown or broker.in_controlled_shutdown:
            draft, should_shut_down = self._controlled_shutdown(image, broker, draft)
        elif want_fence and not broker.fenced:
            draft = draft or _Draft(image, self.settings)
            self._fence_brokers(draft, [broker_id])
        elif not want_fence and broker.fenced and caught_up:
            draft = draft or _Draft(image, self.settings)
            draft.add(UnfenceBrokerRecord(broker_id, broker.broker_epoch))
            _elect_offline_partitions(draft, self.settings, replica=broker_id)
        after = (draft.image if draft else image).brokers[broker_id]
        if should_shut_down:
            # The process is exiting: its id is free for the next incarnation.
            self._lease_start_ms.pop(broker_id, None)
        return ControllerResult(draft.records if draft else [], {
            "is_caught_up": caught_up,
            "is_fenced": after.fenced,
            "should_shut_down": should_shut_down,
            "session_timeout_ms": self.settings.session_timeout_ms,
            "heartbeat_interval_ms": self.settings.heartbeat_interval_ms,
        })

    def _controlled_shutdown(self, image: MetadataImage, broker: BrokerRegistration,
                             draft: "_Draft | None" = None) -> tuple["_Draft | None", bool]:
        """Enter controlled shutdown: leave every ISR and leadership (new
        leaders elected among the other live brokers, unclean only where the
        topic allows it), then, leading nothing, be fenced and told to shut
        down, all in one batch. A broker leaves controlled shutdown only by
        registering again."""
        if broker.in_controlled_shutdown and broker.fenced:
            return draft, True  # Nothing (more) is left to do.
        draft = draft or _Draft(image, self.settings)
        if not broker.in_controlled_shutdown:
            draft.add(BrokerRegistrationChangeRecord(broker.broker_id, broker.broker_epoch, True))
        self._move_replicas_away(draft, {broker.broker_id})
        if draft.image.partitions_led_by(broker.broker_id):
            return draft, False
        if not draft.image.brokers[broker.broker_id].fenced:
            draft.add(FenceBrokerRecord(broker.broker_id, broker.broker_epoch))
        return draft, True

    def _take_replicas_offline(self, image: MetadataImage, broker: BrokerRegistration,
                               dirs: list[str], offline: dict[str, set[int]]
                               ) -> "_Draft | None":
        """The broker lost log directories to disk errors (Kafka's log dir
        failure): record them and the replicas in them on its registration,
        then take each such replica out of its ISR (never emptying it:
        ``isr_after_fencing``) and, where it led, elect a leader among the
        other live ISR members (unclean only where the topic allows it). What
        was recorded already, and partitions of topics since deleted, change
        nothing; None when nothing changes."""
        recorded = {topic_id: set(partitions)
                    for topic_id, partitions in broker.offline_replicas.items()}
        new = {}
        for topic_id, partitions in offline.items():
            if topic_id in image.topic_names_by_id:
                fresh = partitions - recorded.get(topic_id, set())
                if fresh:
                    new[topic_id] = fresh
        all_dirs = sorted(set(broker.offline_log_dirs) | set(dirs))
        if not new and all_dirs == sorted(broker.offline_log_dirs):
            return None
        for topic_id, partitions in new.items():
            recorded.setdefault(topic_id, set()).update(partitions)
        draft = _Draft(image, self.settings)
        draft.add(BrokerRegistrationChangeRecord(
            broker.broker_id, broker.broker_epoch, broker.in_controlled_shutdown,
            offline_log_dirs=all_dirs,
            offline_replicas={topic_id: sorted(partitions)
                              for topic_id, partitions in sorted(recorded.items())}))
        live = draft.image.live_broker_ids()
        for topic_id in sorted(new):
            name = draft.image.topic_names_by_id[topic_id]
            topic = draft.image.topics[name]
            unclean_allowed = _unclean_allowed(draft.image, name, self.settings)
            for partition in sorted(new[topic_id]):
                current = topic.partitions.get(partition)
                if current is None or broker.broker_id not in current.replicas:
                    continue
                logger.warning("broker %d: its log of %s-%d is in an offline log directory",
                               broker.broker_id, name, partition)
                isr = _isr_without(draft, current.isr, [broker.broker_id])
                if current.leader != broker.broker_id:
                    if isr != current.isr or broker.broker_id in current.elr:
                        # Out of the ISR, and of the ELR (_eligible_after).
                        _change_partition(draft, name, partition, isr=isr)
                    continue
                _elect(draft, name, partition, isr, live, unclean_allowed)
        return draft

    def _fence_brokers(self, draft: "_Draft", broker_ids: Iterable[int]) -> None:
        """Fence the brokers (FenceBrokerRecords by id), then take them out of
        every ISR and leadership."""
        fenced = set(broker_ids)
        for broker_id in sorted(fenced):
            broker = draft.image.brokers[broker_id]
            if not broker.fenced:
                draft.add(FenceBrokerRecord(broker_id, broker.broker_epoch))
        self._move_replicas_away(draft, fenced)

    def _move_replicas_away(self, draft: "_Draft", leaving: set[int]) -> None:
        """For every partition a leaving broker (no longer live) leads or is in
        the ISR of: drop it from the ISR (never emptying it:
        ``isr_after_fencing``) and, if it led, elect a new leader among the
        live brokers, unclean only if the topic allows it (the ISR is then
        reset to the new leader and the partition is RECOVERING). One
        PartitionChangeRecord per partition that changes (and one more where
        that completes a reassignment), topics by name, partitions by number."""
        live = draft.image.live_broker_ids()
        assert not live & leaving, f"brokers {sorted(live & leaving)} are still live"
        for name in sorted(draft.image.topics):
            topic = draft.image.topics[name]
            unclean_allowed = None  # Looked up once per topic, when needed.
            for partition in sorted(topic.partitions):
                current = topic.partitions[partition]
                if current.leader not in leaving and leaving.isdisjoint(current.isr):
                    continue
                isr = _isr_without(draft, current.isr, leaving)
                if current.leader not in leaving:
                    _change_partition(draft, name, partition, isr=isr)
                    continue
                if unclean_allowed is None:
                    unclean_allowed = _unclean_allowed(draft.image, name, self.settings)
                _elect(draft, name, partition, isr, live, unclean_allowed)

    # -- topics -------------------------------------------------------------
    def create_topics(self, image: MetadataImage, request: Any) -> ControllerResult:
        """CreateTopics: per topic, TopicRecord, PartitionRecords and
        ConfigRecords. Replicas are placed over the live brokers (leader =
        first replica, ISR = replicas, epochs 0), later topics seeing the
        load of earlier ones; or follow ``assignments``, where, as in Kafka,
        the ISR is the live replicas and the first of them leads. With
        ``validate_only`` everything is checked and nothing is written."""
        body = Fields(request, "")
        items = body.sequence("topics", TOPICS_PER_REQUEST_MAX)
        validate_only = body.boolean("validate_only", default=False)
        specs = [_NewTopic.parse(item, f"topics[{i}]") for i, item in enumerate(items)]
        name_counts = collections.Counter(spec.name for spec in specs)
        draft = _Draft(image, self.settings)
        creation = _TopicCreation(draft, self.settings, validate_only)
        results = []
        for spec in specs:
            try:
                if name_counts[spec.name] > 1:
                    raise InvalidRequestError(
                        f"topic {spec.name!r} appears more than once in the request")
                results.append(self._create_topic(creation, spec))
            except KraftError as exc:
                results.append({"name": spec.name, "topic_id": None, "num_partitions": -1,
                                "replication_factor": -1, "configs": {},
                                "error": _error(exc)})
        return ControllerResult([] if validate_only else draft.records, {"topics": results})

    def _create_topic(self, creation: "_TopicCreation", spec: "_NewTopic") -> dict:
        draft = creation.draft
        _check_topic_name(spec.name)
        if spec.name in draft.image.topics:
            raise TopicAlreadyExistsError(f"topic {spec.name!r} already exists")
        creation.check_collision(spec.name)
        # No overrides: the defaults alone, checked when the settings were made.
        configs = (validate_topic_configs(spec.configs, self.settings.topic_config_defaults)
                   if spec.configs else {})
        assignment = (self._manual_assignment(creation, spec) if spec.assignments is not None
                      else self._placed_assignment(creation, spec))
        self._check_writable(spec.name, len(assignment[0]), configs, creating=True)
        topic_id = creation.new_topic_id(self._id_factory)
        creation.take_partition_budget(len(assignment))
        draft.add(TopicRecord(spec.name, topic_id))
        live = draft.image.live_broker_ids()
        for partition, replicas in enumerate(assignment):
            isr = [broker for broker in replicas if broker in live]
            draft.add(PartitionRecord(topic_id, partition, list(replicas), isr, isr[0], 0, 0))
        for key, value in configs.items():
            draft.add(ConfigRecord(TOPIC_RESOURCE, spec.name, key, value))
        creation.created(spec.name, assignment)
        return {"name": spec.name, "topic_id": None if creation.validate_only else topic_id,
                "num_partitions": len(assignment), "replication_factor": len(assignment[0]),
                "configs": configs, "error": None}

    def _check_writable(self, topic: str, replication_factor: int, configs: Mapping[str, str],
                        creating: bool) -> None:
        """Refuse a topic that no acks=all write could ever commit to: fewer
        replicas than its min.insync.replicas (the producer's default acks
        is all, so its sends would retry until delivery.timeout.ms)."""
        own = MIN_INSYNC_REPLICAS in configs
        min_isr = int(configs[MIN_INSYNC_REPLICAS] if own else
                      self.settings.topic_config_defaults.get(MIN_INSYNC_REPLICAS, "1"))
        if replication_factor >= min_isr:
            return
        source = "its" if own else "the cluster's default"
        fix = (f"create it with --config {MIN_INSYNC_REPLICAS}={replication_factor} or a "
               f"replication factor of at least {min_isr}" if creating else
               f"keep {MIN_INSYNC_REPLICAS} at most {replication_factor}, or add replicas first")
        error = InvalidReplicationFactorError if creating else InvalidConfigError
        raise error(f"topic {topic!r}: replication factor {replication_factor} is below "
                    f"{source} {MIN_INSYNC_REPLICAS}={min_isr}, so no acks=all write could "
                    f"ever succeed; {fix}")

    def _placed_assignment(self, creation: "_TopicCreation", spec: "_NewTopic"
                           ) -> list[list[int]]:
        num_partitions = (self.settings.default_num_partitions if spec.num_partitions == -1
                          else spec.num_partitions)
        replication_factor = (self.settings.default_replication_factor
                              if spec.replication_factor == -1 else spec.replication_factor)
        _check_partition_count(num_partitions)
        creation.check_partition_budget(num_partitions)
        return creation.place(num_partitions, replication_factor)

    @staticmethod
    def _manual_assignment(creation: "_TopicCreation", spec: "_NewTopic") -> list[list[int]]:
        """The replica lists of a manual assignment, checked: partitions
        0..n-1 each exactly once, agreeing with any num_partitions and
        replication_factor given."""
        partitions = [partition for partition, _ in spec.assignments]
        if not partitions:
            raise InvalidPartitionsError("assignments must name at least one partition")
        if sorted(partitions) != list(range(len(partitions))):
            raise InvalidPartitionsError(
                f"assignments must name partitions 0 to {len(partitions) - 1} once each")
        if spec.num_partitions not in (-1, len(partitions)):
            raise InvalidPartitionsError(
                f"num_partitions is {spec.num_partitions} but assignments name "
                f"{len(partitions)} partitions")
        creation.check_partition_budget(len(partitions))
        assignment = [replicas for _, replicas in sorted(spec.assignments)]
        replication_factor = (len(assignment[0]) if spec.replication_factor == -1
                              else spec.replication_factor)
        _check_replica_lists(creation.draft.image, assignment, replication_factor,
                             first_partition=0)
        return assignment

    def delete_topics(self, image: MetadataImage, request: Any) -> ControllerResult:
        """DeleteTopics: a RemoveTopicRecord per existing topic (the image
        drops its partitions and configs with it)."""
        body = Fields(request, "")
        names = [as_str(name, f"topics[{i}]", NAME_CHARS_MAX)
                 for i, name in enumerate(body.sequence("topics", TOPICS_PER_REQUEST_MAX))]
        name_counts = collections.Counter(names)
        draft = _Draft(image, self.settings)
        results = []
        for name in names:
            error = None
            if name_counts[name] > 1:
                error = _error(InvalidRequestError(
                    f"topic {name!r} appears more than once in the request"))
            elif name not in image.topics:
                error = _error(UnknownTopicOrPartitionError(f"topic {name!r} does not exist"))
            else:
                draft.add(RemoveTopicRecord(image.topics[name].topic_id))
            results.append({"name": name, "error": error})
        return ControllerResult(draft.records, {"topics": results})

    def create_partitions(self, image: MetadataImage, request: Any) -> ControllerResult:
        """CreatePartitions: grow topics to ``count`` partitions; new ones take
        the topic's replication factor (that of partition 0) and are placed
        over the live brokers, or follow the given ``assignments``."""
        body = Fields(request, "")
        items = body.sequence("topics", TOPICS_PER_REQUEST_MAX)
        validate_only = body.boolean("validate_only", default=False)
        specs = [_NewPartitions.parse(item, f"topics[{i}]") for i, item in enumerate(items)]
        name_counts = collections.Counter(spec.name for spec in specs)
        draft = _Draft(image, self.settings)
        creation = _TopicCreation(draft, self.settings, validate_only)
        results = []
        for spec in specs:
            error = None
            try:
                if name_counts[spec.name] > 1:
                    raise InvalidRequestError(
                        f"topic {spec.name!r} appears more than once in the request")
                self._create_partitions(creation, spec)
            except KraftError as exc:
                error = _error(exc)
            results.append({"name": spec.name, "error": error})
        return ControllerResult([] if validate_only else draft.records, {"topics": results})

    def _create_partitions(self, creation: "_TopicCreation", spec: "_NewPartitions") -> None:
        draft = creation.draft
        topic = draft.image.topics.get(spec.name)
        if topic is None:
            raise UnknownTopicOrPartitionError(f"topic {spec.name!r} does not exist")
        current = len(topic.partitions)
        if spec.count < current:
            raise InvalidPartitionsError(
                f"cannot decrease the partitions of topic {spec.name!r} from {current} "
                f"to {spec.count}")
        if spec.count == current:
            raise InvalidPartitionsError(f"topic {spec.name!r} already has {current} partitions")
        _check_partition_count(spec.count)
        added = spec.count - current
        creation.check_partition_budget(added)
        # Partition 0's target replicas: a reassignment under way lists more.
        replication_factor = (len(topic.partitions[0].target_replicas) if 0 in topic.partitions
                              else self.settings.default_replication_factor)
        if spec.assignments is None:
            assignment = creation.place(added, replication_factor)
        else:
            if len(spec.assignments) != added:
                raise InvalidPartitionsError(
                    f"assignments give {len(spec.assignments)} new partitions but growing "
                    f"topic {spec.name!r} from {current} to {spec.count} adds {added}")
            assignment = spec.assignments
            _check_replica_lists(draft.image, assignment, replication_factor,
                                 first_partition=current)
        creation.take_partition_budget(added)
        live = draft.image.live_broker_ids()
        for offset, replicas in enumerate(assignment):
            isr = [broker for broker in replicas if broker in live]
            draft.add(PartitionRecord(topic.topic_id, current + offset, list(replicas), isr,
                                      isr[0], 0, 0))
        creation.created(spec.name, assignment)

    # -- configs ------------------------------------------------------------
    def describe_configs(self, image: MetadataImage, request: Any) -> dict:
        """DescribeConfigs (read only): every key the registry knows (or only
        ``keys``) with its value: the topic's override (source TOPIC_CONFIG),
        else the node's default, else the built-in one (DEFAULT_CONFIG)."""
        body = Fields(request, "")
        results = []
        for i, item in enumerate(body.sequence("resources", TOPICS_PER_REQUEST_MAX)):
            resource = Fields(item, f"resources[{i}]")
            resource_type = resource.string("type", NAME_CHARS_MAX)
            name = resource.string("name", NAME_CHARS_MAX)
            keys = resource.sequence("keys", CONFIGS_PER_RESOURCE_MAX, default=None)
            if keys is not None:
                keys = [as_str(key, f"resources[{i}].keys[{j}]", NAME_CHARS_MAX)
                        for j, key in enumerate(keys)]
            result = {"type": resource_type, "name": name, "configs": [], "error": None}
            try:
                result["configs"] = self._describe_topic(image, resource_type, name, keys)
            except KraftError as exc:
                result["error"] = _error(exc)
            results.append(result)
        return {"resources": results}

    def _describe_topic(self, image: MetadataImage, resource_type: str, name: str,
                        keys: list[str] | None) -> list[dict]:
        _check_resource_type(resource_type)
        if name not in image.topics:
            raise UnknownTopicOrPartitionError(f"topic {name!r} does not exist")
        overrides = image.topic_configs(name)
        known = sorted(set(TOPIC_CONFIGS) | set(overrides))
        if keys is not None:
            unknown = sorted(set(keys) - set(known))
            if unknown:
                raise InvalidConfigError(
                    f"unknown topic configs {unknown}; known: {', '.join(TOPIC_CONFIGS)}")
            wanted = set(keys)
            known = [key for key in known if key in wanted]
        return [{"name": key,
                 "value": overrides.get(key, self._config_defaults.get(key)),
                 "source": CONFIG_SOURCE_TOPIC if key in overrides else CONFIG_SOURCE_DEFAULT,
                 "read_only": False}
                for key in known]

    def alter_configs(self, image: MetadataImage, request: Any) -> ControllerResult:
        """IncrementalAlterConfigs for topics: ``set`` and ``delete`` ops, one
        ConfigRecord per change (value None deletes the override; an op that
        changes nothing writes nothing). The topic's overrides after the ops
        must validate together. Enabling unclean election also elects leaders
        for the topic's offline partitions in the same batch (not with
        ``validate_only``: no leader is elected, nor an unclean election
        announced, for a batch that is thrown away)."""
        body = Fields(request, "")
        items = body.sequence("resources", TOPICS_PER_REQUEST_MAX)
        validate_only = body.boolean("validate_only", default=False)
        specs = [_ConfigChange.parse(item, f"resources[{i}]") for i, item in enumerate(items)]
        resource_counts = collections.Counter((spec.type, spec.name) for spec in specs)
        draft = _Draft(image, self.settings)
        results = []
        for spec in specs:
            error = None
            try:
                if resource_counts[(spec.type, spec.name)] > 1:
                    raise InvalidRequestError(
                        f"resource {spec.type} {spec.name!r} appears more than once")
                self._alter_topic_configs(draft, spec, validate_only)
            except KraftError as exc:
                error = _error(exc)
            results.append({"type": spec.type, "name": spec.name, "error": error})
        return ControllerResult([] if validate_only else draft.records, {"resources": results})

    def _alter_topic_configs(self, draft: "_Draft", spec: "_ConfigChange",
                             validate_only: bool) -> None:
        _check_resource_type(spec.type)
        if spec.name not in draft.image.topics:
            raise UnknownTopicOrPartitionError(f"topic {spec.name!r} does not exist")
        keys = [key for key, _, _ in spec.ops]
        repeated = sorted(key for key, count in collections.Counter(keys).items() if count > 1)
        if repeated:
            raise InvalidRequestError(f"configs {repeated} are altered more than once")
        current = draft.image.topic_configs(spec.name)
        updated = dict(current)
        for key, op, value in spec.ops:
            if op == "set":
                updated[key] = normalise_topic_config(key, value)
            elif key in current or key in TOPIC_CONFIGS:
                updated.pop(key, None)
            else:
                raise InvalidConfigError(
                    f"unknown topic config {key!r}; known: {', '.join(TOPIC_CONFIGS)}")
        # Together too; an override of a key this version no longer knows
        # is left alone rather than blocking every later change.
        validate_topic_configs({key: value for key, value in updated.items()
                                if key in TOPIC_CONFIGS}, self.settings.topic_config_defaults)
        replication = min(len(reg.replicas)
                          for reg in draft.image.topics[spec.name].partitions.values())
        self._check_writable(spec.name, replication, updated, creating=False)
        was_unclean = _unclean_allowed(draft.image, spec.name, self.settings)
        for key in keys:
            if current.get(key) != updated.get(key):
                draft.add(ConfigRecord(TOPIC_RESOURCE, spec.name, key, updated.get(key)))
        if current.get(MIN_INSYNC_REPLICAS) != updated.get(MIN_INSYNC_REPLICAS):
            _judge_eligible_again(draft, spec.name)
        if (not validate_only and not was_unclean
                and _unclean_allowed(draft.image, spec.name, self.settings)):
            _elect_offline_partitions(draft, self.settings, topics=[spec.name])

    # -- client quotas ------------------------------------------------------
    def describe_client_quotas(self, image: MetadataImage, request: Any) -> dict:
        """DescribeClientQuotas: every entity with a quota (read only)."""
        Fields(request, "")
        return {"entries": [{"entity": quotas.parse_entity_name(name), "quotas": {
            key: float(value) for key, value in sorted(values.items())}}
            for name, values in sorted(image.client_quotas().items())]}

    def alter_client_quotas(self, image: MetadataImage, request: Any) -> ControllerResult:
        """AlterClientQuotas: per entry, an entity and ops ``{"key", "value"}``
        (value None removes the quota). One ConfigRecord per change; an entry
        with a bad entity, key or value fails alone, with nothing written."""
        body = Fields(request, "")
        validate_only = body.boolean("validate_only", default=False)
        draft = _Draft(image, self.settings)
        results = []
        for i, item in enumerate(body.sequence("entries", TOPICS_PER_REQUEST_MAX)):
            entry = Fields(item, f"entries[{i}]")
            error = None
            entity = entry.values.get("entity")
            try:
                try:
                    raw_ops = entry.sequence("ops", CONFIGS_PER_RESOURCE_MAX)
                    # A quota stored before a rule was added may always be removed.
                    removing = all(isinstance(op, dict) and op.get("value") is None
                                   for op in raw_ops)
                    name = quotas.entity_name(quotas.check_entity(entity, strict=not removing))
                    ops = []
                    for j, op in enumerate(raw_ops):
                        op_fields = Fields(op, f"entries[{i}].ops[{j}]")
                        key = op_fields.string("key", NAME_CHARS_MAX)
                        value = op_fields.values.get("value")
                        ops.append((key, None if value is None
                                    else repr(quotas.check_quota_value(key, value))))
                except ValueError as exc:
                    raise InvalidRequestError(str(exc)) from None
                if len({key for key, _ in ops}) != len(ops):
                    raise InvalidRequestError(f"entries[{i}] sets a quota more than once")
                current = draft.image.configs.get((quotas.CLIENT_QUOTA_RESOURCE, name), {})
                for key, value in ops:
                    if current.get(key) != value:
                        draft.add(ConfigRecord(quotas.CLIENT_QUOTA_RESOURCE, name, key, value))
            except KraftError as exc:
                error = _error(exc)
            results.append({"entity": entity, "error": error})
        return ControllerResult([] if validate_only else draft.records, {"entries": results})

    # -- SCRAM users ---------------------------------------------------------
    def describe_users(self, image: MetadataImage, request: Any) -> dict:
        """DescribeUserScramCredentials: users, their mechanisms and
        iteration counts (never a salt or a key)."""
        Fields(request, "")
        return {"users": [{"name": name, "credentials": [
            {"mechanism": mech, "iterations": scram.decode(value).iterations}
            for mech, value in sorted(creds.items())]}
            for name, creds in sorted(image.scram_users().items())]}

    def alter_users(self, image: MetadataImage, request: Any) -> ControllerResult:
        """AlterUserScramCredentials: ``upsertions`` (name, mechanism,
        iterations, salt, salted_password: the password salted and iterated
        by the client, from which only the stored and server keys are kept)
        and ``deletions`` (name, mechanism). Each fails alone."""
        body = Fields(request, "")
        draft = _Draft(image, self.settings)
        results = []
        for kind in ("upsertions", "deletions"):
            for i, item in enumerate(body.sequence(kind, TOPICS_PER_REQUEST_MAX, default=[])):
                fields = Fields(item, f"{kind}[{i}]")
                error = None
                try:
                    for record in _scram_change(draft.image, kind == "upsertions", fields):
                        draft.add(record)
                except KraftError as exc:
                    error = _error(exc)
                results.append({"name": fields.values.get("name"), "error": error})
        return ControllerResult(draft.records, {"results": results})

    # -- ACLs --------------------------------------------------------------
    def create_acls(self, image: MetadataImage, request: Any) -> ControllerResult:
        """CreateAcls: ``creations``, each an ACL (protocol/acl.py), checked
        alone; one already there succeeds and writes nothing."""
        body = Fields(request, "")
        draft = _Draft(image, self.settings)
        results = []
        for i, item in enumerate(body.sequence("creations", TOPICS_PER_REQUEST_MAX)):
            error = None
            try:
                binding = acl.binding_from_wire(item, f"creations[{i}]")
                if binding not in draft.image.acls:
                    if len(draft.image.acls) >= ACLS_MAX:
                        raise InvalidRequestError(
                            f"the cluster holds {ACLS_MAX} ACLs, the most it may: delete some "
                            "(prefixed patterns cover many resources with one)")
                    draft.add(AccessControlEntryRecord(*binding))
            except KraftError as exc:
                error = _error(exc)
            results.append({"error": error})
        return ControllerResult(draft.records, {"results": results})

    def delete_acls(self, image: MetadataImage, request: Any) -> ControllerResult:
        """DeleteAcls: ``filters`` (protocol/acl.py); each answers the ACLs
        it matched, all of which are deleted (once, if several match one)."""
        body = Fields(request, "")
        draft = _Draft(image, self.settings)
        results = []
        for i, item in enumerate(body.sequence("filters", TOPICS_PER_REQUEST_MAX)):
            try:
                acl_filter = acl.filter_from_wire(item, f"filters[{i}]")
            except KraftError as exc:
                results.append({"error": _error(exc), "matching_acls": []})
                continue
            matched = sorted(b for b in image.acls if acl.filter_matches(acl_filter, b))
            for binding in matched:
                if binding in draft.image.acls:
                    draft.add(RemoveAccessControlEntryRecord(*binding))
            results.append({"error": None, "matching_acls": [b.to_wire() for b in matched]})
        return ControllerResult(draft.records, {"filter_results": results})

    # -- delegation tokens (protocol/tokens.py) ----------------------------------
    # The broker the client called has authenticated it and checked the
    # token's HMAC: these take ``owner``/``requester`` principals from it.
    # ``now_ms`` is wall-clock time (token times are compared by every node).
    def create_delegation_token(self, image: MetadataImage, request: Any, now_ms: int
                                ) -> ControllerResult:
        """CreateDelegationToken: ``owner``, ``requester``, ``renewers``,
        ``max_lifetime_ms`` (-1: the cluster's maximum, which also caps it)."""
        body = Fields(request, "")
        owner = _principal(body.string("owner", NAME_CHARS_MAX), "owner")
        requester = _principal(body.string("requester", NAME_CHARS_MAX), "requester")
        renewers = [_principal(as_str(r, f"renewers[{i}]", NAME_CHARS_MAX), "renewer")
                    for i, r in enumerate(body.sequence("renewers", TOKEN_RENEWERS_MAX,
                                                        default=[]))]
        lifetime = body.integer("max_lifetime_ms", -1, INT64_MAX, default=-1)
        if len(image.delegation_tokens) >= TOKENS_MAX:
            raise InvalidRequestError(
                f"the cluster holds {TOKENS_MAX} delegation tokens, the most it may: expire "
                "some (`kraftlog tokens expire`) or wait for them to expire")
        settings = self.settings
        # Times stay int64 (as Kafka's), whatever the configured lifetimes.
        max_ms = min(INT64_MAX, now_ms + (settings.token_max_lifetime_ms if lifetime <= 0
                                          else min(lifetime, settings.token_max_lifetime_ms)))
        record = DelegationTokenRecord(
            new_token_id(), owner, requester, sorted(set(renewers)), now_ms,
            min(max_ms, now_ms + settings.token_expiry_ms), max_ms)
        return ControllerResult([record], {"token": _token_wire(record)})

    def renew_delegation_token(self, image: MetadataImage, request: Any, now_ms: int
                               ) -> ControllerResult:
        """RenewDelegationToken: ``token_id``, ``requester`` (the owner or a
        renewer), ``renew_period_ms`` (-1: the cluster's expiry time);
        never past the token's maximum."""
        token, period = self._renewable(image, request, now_ms, "renew_period_ms")
        expiry = min(token.max_timestamp_ms,
                     now_ms + (self.settings.token_expiry_ms if period < 0 else period))
        record = DelegationTokenRecord(
            token.token_id, token.owner, token.requester, list(token.renewers),
            token.issue_timestamp_ms, max(expiry, token.issue_timestamp_ms),
            token.max_timestamp_ms)
        return ControllerResult([record], {"expiration_timestamp_ms":
                                           record.expiration_timestamp_ms})

    def expire_delegation_token(self, image: MetadataImage, request: Any, now_ms: int
                                ) -> ControllerResult:
        """ExpireDelegationToken: ``token_id``, ``requester``,
        ``expiry_period_ms`` (-1 or 0: now, the token is removed)."""
        token, period = self._renewable(image, request, now_ms, "expiry_period_ms")
        if period <= 0:
            return ControllerResult([RemoveDelegationTokenRecord(token.token_id)],
                                    {"expiration_timestamp_ms": now_ms})
        record = DelegationTokenRecord(
            token.token_id, token.owner, token.requester, list(token.renewers),
            token.issue_timestamp_ms,
            max(token.issue_timestamp_ms, min(token.max_timestamp_ms, now_ms + period)),
            token.max_timestamp_ms)
        return ControllerResult([record], {"expiration_timestamp_ms":
                                           record.expiration_timestamp_ms})

    @staticmethod
    def _renewable(image: MetadataImage, request: Any, now_ms: int, period_key: str):
        body = Fields(request, "")
        token_id = body.string("token_id", NAME_CHARS_MAX)
        requester = _principal(body.string("requester", NAME_CHARS_MAX), "requester")
        period = body.integer(period_key, -1, INT64_MAX, default=-1)
        token = image.delegation_tokens.get(token_id)
        if token is None:
            raise DelegationTokenNotFoundError("no such delegation token")
        if token.expiration_timestamp_ms < now_ms:
            raise DelegationTokenExpiredError("the delegation token has expired")
        if not token.may_renew(requester):
            raise DelegationTokenOwnerMismatchError(
                f"{requester} is neither the token's owner nor a renewer")
        return token, period

    def expired_delegation_tokens(self, image: MetadataImage, now_ms: int) -> list[Record]:
        """Housekeeping (the shell's tick): the tokens past their expiry
        (wall-clock ``now_ms``) removed."""
        tokens = image.delegation_tokens
        if not tokens:
            return []
        # Most ticks expire nothing: the earliest expiry, once per token change.
        cached_tokens, version, earliest = self._token_expiry_cache
        if cached_tokens is not tokens or version != image.token_version:
            earliest = min(t.expiration_timestamp_ms for t in tokens.values())
            self._token_expiry_cache = (tokens, image.token_version, earliest)
        if earliest >= now_ms:
            return []
        return [RemoveDelegationTokenRecord(token_id) for token_id in sorted(
            token_id for token_id, token in tokens.items()
            if token.expiration_timestamp_ms < now_ms)]

    # -- partitions ---------------------------------------------------------
    def alter_partition(self, image: MetadataImage, request: Any) -> ControllerResult:
        """AlterPartition from a partition leader that shrinks or expands the
        ISR, and, after an unclean election, says it has taken over
        (``leader_recovery_state`` 0; absent keeps the current state).
        Checked in order: broker registered, broker epoch, partition exists,
        sender is the leader, leader epoch (older: fenced, newer: unknown),
        partition epoch, ISR shape, added members live, recovery state (never
        back to RECOVERING; while RECOVERING the ISR is the leader alone).

        An ISR that now holds every target replica of a reassignment
        completes it in the same batch, so the answer (the partition as it
        is after the batch) may name other replicas, or even another leader,
        than the sender expects; the metadata tells it the rest."""
        body = Fields(request, "")
        broker_id = body.integer("broker_id", 0, INT32_MAX)
        broker_epoch = body.integer("broker_epoch", 0, INT64_MAX)
        topic = body.string("topic", NAME_CHARS_MAX)
        partition = body.integer("partition", 0, INT32_MAX)
        leader_epoch = body.integer("leader_epoch", 0, INT32_MAX)
        partition_epoch = body.integer("partition_epoch", 0, INT32_MAX)
        new_isr = [as_int(member, f"new_isr[{i}]", 0, INT32_MAX) for i, member in
                   enumerate(body.sequence("new_isr", REPLICAS_PER_PARTITION_MAX))]
        member_epochs = [as_int(epoch, f"new_isr_broker_epochs[{i}]", -1, INT64_MAX)
                         for i, epoch in enumerate(body.sequence(
                             "new_isr_broker_epochs", REPLICAS_PER_PARTITION_MAX, default=[]))]
        if member_epochs and len(member_epochs) != len(new_isr):
            raise InvalidRequestError(
                f"new_isr_broker_epochs has {len(member_epochs)} epochs for the "
                f"{len(new_isr)} members of new_isr")
        recovery_state = body.integer("leader_recovery_state", LEADER_RECOVERED,
                                      LEADER_RECOVERING, default=None)
        _registered_broker(image, broker_id, broker_epoch)
        current = _existing_partition(image, topic, partition)
        where = f"{topic}-{partition}"
        _check_alter_partition_epochs(current, broker_id, leader_epoch, partition_epoch, where)
        _check_new_isr(image, current, new_isr, topic, partition, member_epochs)
        if recovery_state is None:
            recovery_state = current.leader_recovery_state
        _check_recovery_change(current, recovery_state, new_isr, where)
        draft = _Draft(image, self.settings)
        _change_partition(draft, topic, partition, isr=new_isr, recovery_state=recovery_state)
        after = draft.image.topics[topic].partitions[partition]
        return ControllerResult(draft.records, {
            "topic": topic, "partition": partition, "leader": after.leader,
            "leader_epoch": after.leader_epoch, "partition_epoch": after.partition_epoch,
            "isr": list(after.isr), "leader_recovery_state": after.leader_recovery_state})

    def alter_partitions(self, image: MetadataImage, request: Any) -> ControllerResult:
        """Many AlterPartitions from one leader in one request, as Kafka's
        AlterPartitionManager sends them: ``{"broker_id", "broker_epoch",
        "partitions": [the fields of alter_partition but those two]}``. An
        unregistered sender or a stale broker epoch refuses the whole
        request; any other refusal is its item's ``error``, and the other
        items are written. A broker rejoining the ISRs of thousands of
        partitions sends one request per batch, not one per partition."""
        body = Fields(request, "")
        broker_id = body.integer("broker_id", 0, INT32_MAX)
        broker_epoch = body.integer("broker_epoch", 0, INT64_MAX)
        items = body.sequence("partitions", PARTITIONS_PER_REQUEST_MAX)
        _registered_broker(image, broker_id, broker_epoch)
        records: list[Record] = []
        results = []
        seen: set[tuple[str, int]] = set()
        for i, item in enumerate(items):
            if not isinstance(item, dict):
                results.append({"topic": None, "partition": None, "error": _error(
                    InvalidRequestError(f"partitions[{i}] must be a map"))})
                continue
            try:
                one = self.alter_partition(image, {**item, "broker_id": broker_id,
                                                   "broker_epoch": broker_epoch})
                key = (one.response["topic"], one.response["partition"])
                if key in seen:
                    raise InvalidRequestError(f"{key[0]}-{key[1]} appears more than once "
                                              "in the request")
            except KraftError as exc:
                results.append({"topic": item.get("topic"), "partition": item.get("partition"),
                                "error": _error(exc)})
                continue
            seen.add(key)
            records.extend(one.records)
            results.append({**one.response, "error": None})
        return ControllerResult(records, {"partitions": results})

    def elect_leaders(self, image: MetadataImage, request: Any) -> ControllerResult:
        """ElectLeaders. ``election_type`` "preferred" (the default, or
        Kafka's 0): move each named partition's leadership to its first
        replica if that one is live and in the ISR. "unclean" (or 1): give a
        partition that has no leader one, from outside the ISR if no ISR
        member is live, whatever ``unclean.leader.election.enable`` says
        (an operator accepting the loss of what that replica lacks), and
        ``ELECTION_NOT_NEEDED`` for a partition that has a leader.
        ``partitions`` None (or absent) means every partition; the answer
        then lists only the partitions that moved or could not (as Kafka
        leaves out those whose preferred replica already leads, or, for
        unclean, those that have a leader)."""
        body = Fields(request, "")
        election_type = body.values.get("election_type", "preferred")
        if (isinstance(election_type, bool) or not isinstance(election_type, (str, int))
                or election_type not in ELECTION_TYPES):
            raise InvalidRequestError(
                f"election_type must be \"preferred\" or \"unclean\" (or Kafka's 0 or 1), "
                f"not {printable(election_type)}")
        unclean = ELECTION_TYPES[election_type]
        items = body.sequence("partitions", PARTITIONS_PER_REQUEST_MAX, default=None)
        if items is None:
            wanted = sorted((name, p) for name, topic in image.topics.items()
                            for p in topic.partitions)
        else:
            wanted = [_topic_partition(item, f"partitions[{i}]") for i, item in enumerate(items)]
        draft = _Draft(image, self.settings)
        results = []
        for topic, partition in wanted:
            if unclean:
                result = _elect_unclean(draft, topic, partition)
                listed = items is not None or result["error"] is None or (
                    result["error"]["code"] != ELECTION_NOT_NEEDED)
            else:
                result = _elect_preferred(draft, topic, partition)
                moved = result.pop("moved")
                listed = items is not None or moved or result["error"] is not None
            if listed:
                results.append(result)
        return ControllerResult(draft.records, {"partitions": results})

    # -- producer ids -------------------------------------------------------
    def allocate_producer_ids(self, image: MetadataImage, request: Any) -> ControllerResult:
        """AllocateProducerIds (KIP-730): the next block of
        ``PRODUCER_ID_BLOCK_SIZE`` producer ids for a registered broker, which
        hands them to idempotent and transactional producers. The block is
        taken through the metadata log, so no id is ever handed out twice,
        whichever controller is active."""
        body = Fields(request, "")
        broker_id = body.integer("broker_id", 0, INT32_MAX)
        broker_epoch = body.integer("broker_epoch", 0, INT64_MAX)
        _registered_broker(image, broker_id, broker_epoch)
        start = image.next_producer_id
        if start > PRODUCER_ID_MAX - PRODUCER_ID_BLOCK_SIZE:
            raise UnknownServerError("every producer id is taken")
        record = ProducerIdsRecord(broker_id, broker_epoch, start + PRODUCER_ID_BLOCK_SIZE)
        return ControllerResult([record], {"producer_id_start": start,
                                           "producer_id_len": PRODUCER_ID_BLOCK_SIZE})

    # -- reassignment -------------------------------------------------------
    def alter_partition_reassignments(self, image: MetadataImage, request: Any
                                      ) -> ControllerResult:
        """AlterPartitionReassignments (KIP-455). Per partition: ``replicas``
        (distinct registered brokers; fenced ones may wait in the target)
        starts moving it there, replacing any target under way; ``replicas``
        null (or absent) cancels the reassignment under way.

        Starting keeps the ISR and leader and adds the new replicas
        (``_reassignment_plan``); a target whose every member is already in
        sync (a reorder, a shrink) is done at once, in one record. Cancelling
        goes back to the original replicas; the added ones leave the ISR,
        and a leader among them gives way to an original in-sync replica.
        A change that would leave no in-sync replica (every member of the
        ISR is one it drops) is refused: the replicas left would lack
        acknowledged records."""
        body = Fields(request, "")
        items = body.sequence("partitions", PARTITIONS_PER_REQUEST_MAX)
        specs = [_Reassignment.parse(item, f"partitions[{i}]") for i, item in enumerate(items)]
        counts = collections.Counter((spec.topic, spec.partition) for spec in specs)
        draft = _Draft(image, self.settings)
        results = []
        for spec in specs:
            error = None
            try:
                if counts[(spec.topic, spec.partition)] > 1:
                    raise InvalidRequestError(f"partition {spec.topic}-{spec.partition} "
                                              "appears more than once in the request")
                _reassign(draft, spec)
            except KraftError as exc:
                error = _error(exc)
            results.append({"topic": spec.topic, "partition": spec.partition, "error": error})
        return ControllerResult(draft.records, {"partitions": results})

    def list_partition_reassignments(self, image: MetadataImage, request: Any) -> dict:
        """ListPartitionReassignments (read only): the partitions of
        ``topics`` (every topic for null) with a reassignment under way, by
        topic and partition. Unknown topics have none."""
        body = Fields(request, "")
        names = body.strings("topics", TOPICS_PER_REQUEST_MAX, NAME_CHARS_MAX, default=None)
        wanted = sorted(image.topics if names is None else set(names) & set(image.topics))
        partitions = []
        for name in wanted:
            for partition, current in sorted(image.topics[name].partitions.items()):
                if current.reassigning:
                    partitions.append({
                        "topic": name, "partition": partition,
                        "replicas": list(current.replicas),
                        "adding_replicas": list(current.adding_replicas),
                        "removing_replicas": list(current.removing_replicas)})
        return {"partitions": partitions}


# -- batch building -------------------------------------------------------------
class _Draft:
    """The records of one batch being built, and ``image``: a scratch copy of
    the image the shell gave, with those records applied at the offsets they
    will get. The shell's image is never touched.

    The copy (``MetadataImage.copy``) has its own broker registrations and
    shares topics and configs copy-on-write, so its cost does not grow with
    the number of topics or partitions. A test checks that no controller
    call changes the image it was given."""

    def __init__(self, image: MetadataImage, settings: ControllerSettings) -> None:
        self.image = image.copy()
        self.settings = settings
        self.records: list[Record] = []

    def add(self, record: Record) -> int:
        """Apply ``record`` to the scratch image and keep it; returns its
        offset. A record the image refuses is a controller bug and raises."""
        offset = self.image.offset + 1
        self.image.apply(record, offset)
        self.records.append(record)
        return offset


def _change_partition(draft: _Draft, topic: str, partition: int, *,
                      leader: int | None = None, isr: list[int] | None = None,
                      replicas: list[int] | None = None, adding: list[int] | None = None,
                      removing: list[int] | None = None,
                      recovery_state: int | None = None,
                      elr: list[int] | None = None) -> None:
    """A PartitionChangeRecord with only the fields that differ; none if
    nothing does. Every partition change of the controller goes through here,
    which keeps three rules in one place:
      - a new leader given without ``recovery_state`` was elected cleanly, so
        a RECOVERING partition becomes RECOVERED (unclean elections pass
        RECOVERING themselves);
      - the eligible leader replicas follow the ISR (``_eligible_after``)
        unless ``elr`` gives them, and a partition that loses its leader
        keeps the old one as its last known leader (KIP-966);
      - a change that leaves every target replica of a reassignment in the
        ISR is followed by the record that completes the reassignment."""
    topic_image = draft.image.topics[topic]
    current = topic_image.partitions[partition]
    if elr is None:
        elr = _eligible_after(draft, topic, partition, current,
                              current.isr if isr is None else list(isr),
                              current.replicas if replicas is None else list(replicas))
    new_leader = current.leader if leader is None else leader
    last_known_leader = (NO_LEADER if new_leader != NO_LEADER
                         or not draft.settings.eligible_leader_replicas
                         else current.leader if current.leader != NO_LEADER
                         else current.last_known_leader)
    if last_known_leader not in (replicas or current.replicas):
        last_known_leader = NO_LEADER
    changes: dict[str, Any] = {}
    if leader is not None and leader != current.leader:
        changes["leader"] = leader
        if (recovery_state is None and leader != NO_LEADER
                and current.leader_recovery_state == LEADER_RECOVERING):
            recovery_state = LEADER_RECOVERED
    for field, value, now in (("isr", isr, current.isr),
                              ("replicas", replicas, current.replicas),
                              ("adding_replicas", adding, current.adding_replicas),
                              ("removing_replicas", removing, current.removing_replicas),
                              ("elr", elr, current.elr)):
        if value is not None and list(value) != now:
            changes[field] = list(value)
    if last_known_leader != current.last_known_leader:
        changes["last_known_leader"] = last_known_leader
    if recovery_state is not None and recovery_state != current.leader_recovery_state:
        changes["leader_recovery_state"] = recovery_state
    if not changes:
        return
    draft.add(PartitionChangeRecord(topic_image.topic_id, partition, **changes))
    _complete_reassignment_if_caught_up(draft, topic, partition)


def _complete_reassignment_if_caught_up(draft: _Draft, topic: str, partition: int) -> None:
    """Once every target replica of a reassignment under way is in the ISR,
    the reassignment is done: the replicas become the target, the ISR keeps
    its target members, and a leader that is not a target gives way to the
    first target that is in sync and live (NO_LEADER if none is)."""
    current = draft.image.topics[topic].partitions[partition]
    target = current.target_replicas
    if not current.reassigning or not set(target) <= set(current.isr):
        return
    isr = [broker for broker in current.isr if broker in target]
    _change_partition(draft, topic, partition, replicas=target, isr=isr, adding=[], removing=[],
                      leader=_leader_within(current.leader, target, isr, draft.image, topic,
                                            partition))


def _min_insync_replicas(draft: _Draft, topic: str) -> int:
    """The topic's min.insync.replicas as eligible leader replicas must read
    it: its override, else the smallest default of this controller and of
    every registered broker. Never more than a leader uses (a leader's high
    watermark must stand still whenever this counts its ISR below it), so
    a default that differs between nodes costs availability, not data."""
    value = draft.image.configs.get((TOPIC_RESOURCE, topic), {}).get(MIN_INSYNC_REPLICAS)
    if value is None:
        defaults = [b.min_insync_replicas for b in draft.image.brokers.values()
                    if b.min_insync_replicas is not None]
        value = min([*defaults, int(draft.settings.topic_config_defaults.get(
            MIN_INSYNC_REPLICAS, "1"))])
    try:
        return int(value)
    except ValueError:  # An override no longer valid: brokers then read 1.
        return 1


def _eligible_after(draft: _Draft, topic: str, partition: int, current: PartitionRegistration,
                    isr: list[int], replicas: list[int]) -> list[int]:
    """The ELR once the partition's ISR is ``isr`` (KIP-966), in replica order.

    While the ISR is below min.insync.replicas, a leader's high watermark
    stands still (``Partition.maybe_advance_high_watermark``), so a member
    leaving it then holds every committed record for as long as that
    lasts: it joins the ELR. Members back in the ISR leave it; an ISR at
    min.insync.replicas or more lets the high watermark move on without
    the others, so it empties."""
    if not draft.settings.eligible_leader_replicas or len(isr) >= _min_insync_replicas(
            draft, topic):
        return []
    eligible = (set(current.elr) | set(current.isr)) - set(isr)
    if eligible:  # A replica whose log is in a failed log dir has none to offer.
        eligible -= draft.image.brokers_offline_for(topic, partition)
    return [r for r in replicas if r in eligible]


def _isr_without(draft: _Draft, isr: list[int], leaving: Iterable[int]) -> list[int]:
    """The ISR once ``leaving`` brokers are fenced or lose their logs. With
    eligible leader replicas it may empty: the last member joins the ELR.
    Without, the last member stays (``isr_after_fencing``)."""
    if draft.settings.eligible_leader_replicas:
        gone = set(leaving)
        return [broker for broker in isr if broker not in gone]
    for broker_id in sorted(leaving):
        isr = isr_after_fencing(isr, broker_id)
    return isr


def _forget_unclean_replica(draft: _Draft, broker_id: int) -> None:
    """The broker registered after an unclean shutdown (KIP-966): its logs
    may have lost their unflushed tail, so it is no eligible leader replica
    anywhere any more (a last known leader it stays: the last resort). The
    broker left every ISR when its previous registration was fenced."""
    for name in sorted(draft.image.topics):
        topic = draft.image.topics[name]
        for partition in sorted(topic.partitions):
            current = topic.partitions[partition]
            if broker_id not in current.elr:
                continue
            _change_partition(draft, name, partition,
                              elr=[r for r in current.elr if r != broker_id])


def _judge_eligible_again(draft: _Draft, topic: str) -> None:
    """The topic's min.insync.replicas changed: its ELRs are judged again by
    the new value. Where the ISR now reaches it, the high watermark may move
    on without them, so they are forgotten (Kafka forgets them all); where
    it does not, the high watermark still stands and they stay eligible
    (forgetting those could elect a broker that lost its tail over one that
    kept everything)."""
    for partition, current in sorted(draft.image.topics[topic].partitions.items()):
        if current.elr:
            _change_partition(draft, topic, partition)


def _leader_within(leader: int, replicas: list[int], isr: list[int],
                   image: MetadataImage, topic: str, partition: int) -> int:
    """``leader`` if it stays in ``isr``, else a clean choice: the first of
    ``replicas`` that is in ``isr``, live and not offline, or NO_LEADER."""
    if leader in isr:
        return leader
    eligible = image.live_broker_ids() - image.brokers_offline_for(topic, partition)
    return elect_leader(replicas, isr, eligible, unclean_allowed=False)[0]


def _unclean_allowed(image: MetadataImage, topic: str, settings: ControllerSettings) -> bool:
    return unclean_election_enabled(image, topic, settings.unclean_leader_election_enable)


def _elect_offline_partitions(draft: _Draft, settings: ControllerSettings, *,
                              replica: int | None = None,
                              topics: Iterable[str] | None = None) -> None:
    """Give offline partitions (leader NO_LEADER) a leader where one is now
    possible: clean from the live ISR members, else unclean (ISR reset to the
    new leader, RECOVERING) where the topic allows it. Only partitions of
    ``topics``, and only those ``replica`` is a replica of, when given."""
    live = draft.image.live_broker_ids()
    for name in sorted(draft.image.topics if topics is None else topics):
        topic = draft.image.topics[name]
        unclean_allowed = _unclean_allowed(draft.image, name, settings)
        for partition in sorted(topic.partitions):
            current = topic.partitions[partition]
            if current.leader != NO_LEADER or (replica is not None
                                               and replica not in current.replicas):
                continue
            _elect(draft, name, partition, current.isr, live, unclean_allowed)


def _elect(draft: _Draft, topic: str, partition: int, isr: list[int], live: set[int],
           unclean_allowed: bool) -> None:
    """Replace the partition's leader (gone, or NO_LEADER) and set its ISR to
    ``isr``. In order, the first live one (replica order) of: the members
    of ``isr``; the eligible leader replicas (``isr`` then becomes that
    replica alone); when neither list has anyone, the last known leader,
    which may have lost its unflushed tail in an unclean shutdown but held
    every committed record most recently (KIP-966; what Kafka did before
    it, and does). Else, if ``unclean_allowed``,
    the first live replica, which resets the ISR to it alone, forgets
    the eligible replicas and marks the partition RECOVERING, loudly; else
    NO_LEADER."""
    current = draft.image.topics[topic].partitions[partition]
    live = live - draft.image.brokers_offline_for(topic, partition)
    leader = elect_leader(current.replicas, isr, live, unclean_allowed=False)[0]
    if leader != NO_LEADER:
        _change_partition(draft, topic, partition, leader=leader, isr=isr)
        return
    elr = _eligible_after(draft, topic, partition, current, isr, current.replicas)
    if not draft.settings.eligible_leader_replicas:
        elr = current.elr  # Turned off: what was kept before still names clean copies.
    last_known = current.leader if current.leader != NO_LEADER else current.last_known_leader
    pools = [("an eligible leader replica", elr)]
    if not isr and not elr and last_known != NO_LEADER:
        # As Kafka (and as it did before KIP-966: its last ISR member).
        pools.append(("the last known leader, no replica being known to hold every "
                      "committed record: what it lost in an unclean shutdown is lost",
                      [last_known]))
    for what, pool in pools:
        leader = elect_leader(current.replicas, pool, live, unclean_allowed=False)[0]
        if leader != NO_LEADER:
            logger.warning("%s-%d: no in-sync replica is left; broker %d, %s, leads epoch %d",
                           topic, partition, leader, what, current.leader_epoch + 1)
            _change_partition(draft, topic, partition, leader=leader, isr=[leader])
            return
    leader, unclean = elect_leader(current.replicas, isr, live, unclean_allowed=unclean_allowed)
    if not unclean:
        _change_partition(draft, topic, partition, leader=leader, isr=isr)
        return
    # The leader always changes here: the old one is gone or NO_LEADER.
    assert leader != current.leader, f"unclean election kept leader {leader}"
    passed_over = set(current.isr) | set(elr)
    logger.warning(
        "UNCLEAN leader election for %s-%d: broker %d (not in the ISR %s) leads epoch %d; "
        "records acknowledged by the old ISR may be lost", topic, partition, leader,
        [r for r in current.replicas if r in passed_over], current.leader_epoch + 1)
    _change_partition(draft, topic, partition, leader=leader, isr=[leader],
                      recovery_state=LEADER_RECOVERING, elr=[])


def _preferred_moves(image: MetadataImage, partitions: Iterable[tuple[str, int]]
                     ) -> list[tuple[str, int, int]]:
    """(topic, partition, preferred leader) for each partition whose
    leadership should move to its preferred replica now."""
    live = image.live_broker_ids()
    moves = []
    for topic, partition in partitions:
        current = image.topics[topic].partitions[partition]
        preferred = preferred_leader_election(
            current.replicas, current.isr, live - image.brokers_offline_for(topic, partition),
            current.leader)
        # A reassignment lists its targets first, so the preferred replica
        # is never one being removed; checked anyway, since leading from a
        # replica about to go would only move leadership twice.
        if preferred is not None and preferred not in current.removing_replicas:
            moves.append((topic, partition, preferred))
    return moves


def _reassign(draft: _Draft, spec: "_Reassignment") -> None:
    """One partition of AlterPartitionReassignments (see there)."""
    where = f"{spec.topic}-{spec.partition}"
    current = _existing_partition(draft.image, spec.topic, spec.partition)
    if spec.replicas is None:
        if not current.reassigning:
            raise NoReassignmentInProgressError(
                f"partition {where} has no reassignment in progress to cancel")
        replicas, adding, removing = current.original_replicas, [], []
        doing = "cancel the reassignment of"
    else:
        _check_target_replicas(draft.image, spec.replicas, where)
        replicas, adding, removing = _reassignment_plan(current.original_replicas,
                                                        spec.replicas, current.isr)
        doing = "reassign"
    isr = [broker for broker in current.isr if broker in replicas]
    if not isr:
        raise InvalidRequestError(
            f"cannot {doing} {where}: every in-sync replica {current.isr} would stop being a "
            f"replica, and the replicas {replicas} left are out of sync, so acknowledged "
            "records would be lost; let the reassignment under way complete, or name a "
            "target that keeps an in-sync replica")
    _change_partition(draft, spec.topic, spec.partition, replicas=replicas, isr=isr,
                      adding=adding, removing=removing,
                      leader=_leader_within(current.leader, replicas, isr, draft.image,
                                            spec.topic, spec.partition))


def _reassignment_plan(original: list[int], target: list[int], isr: list[int]
                       ) -> tuple[list[int], list[int], list[int]]:
    """(replicas, adding, removing) that move a partition from ``original``
    to ``target``: the targets first (so the preferred leader is the
    target's), then the originals that leave. A target already wholly in
    ``isr`` needs no copying, so the move is complete at once."""
    if set(target) <= set(isr):
        return list(target), [], []
    replicas = list(target) + [broker for broker in original if broker not in target]
    return (replicas, [broker for broker in target if broker not in original],
            [broker for broker in original if broker not in target])


def _elect_unclean(draft: _Draft, topic: str, partition: int) -> dict:
    """One partition of an unclean ElectLeaders: its result entry (with
    ``unclean``: whether the leader came from outside the ISR)."""
    result = {"topic": topic, "partition": partition, "leader": NO_LEADER, "error": None,
              "unclean": False}
    current = draft.image.partition(topic, partition)
    if current is None:
        result["error"] = _error(UnknownTopicOrPartitionError(
            f"partition {topic}-{partition} does not exist"))
        return result
    result["leader"] = current.leader
    if current.leader != NO_LEADER:
        result["error"] = {"code": ELECTION_NOT_NEEDED,
                           "message": f"{topic}-{partition} has a leader, broker "
                                      f"{current.leader}"}
        return result
    live = draft.image.live_broker_ids()
    offline = draft.image.brokers_offline_for(topic, partition)
    if not any(r in live and r not in offline for r in current.replicas):
        result["error"] = {"code": ELIGIBLE_LEADERS_NOT_AVAILABLE,
                           "message": f"no replica of {topic}-{partition} "
                                      f"({current.replicas}) is live with its log online"}
        return result
    _elect(draft, topic, partition, list(current.isr), live, unclean_allowed=True)
    after = draft.image.topics[topic].partitions[partition]
    result.update(leader=after.leader, unclean=after.leader not in (
        *current.isr, *current.elr, current.last_known_leader))
    return result


def _elect_preferred(draft: _Draft, topic: str, partition: int) -> dict:
    """One partition of ElectLeaders: its result entry, plus ``moved``."""
    result = {"topic": topic, "partition": partition, "leader": NO_LEADER, "error": None,
              "moved": False}
    current = draft.image.partition(topic, partition)
    if current is None:
        result["error"] = _error(UnknownTopicOrPartitionError(
            f"partition {topic}-{partition} does not exist"))
        return result
    moves = _preferred_moves(draft.image, [(topic, partition)])
    if moves:
        _change_partition(draft, topic, partition, leader=moves[0][2])
        result["moved"] = True
    elif current.leader != current.replicas[0]:
        result["error"] = {
            "code": PREFERRED_LEADER_NOT_AVAILABLE,
            "message": f"the preferred leader {current.replicas[0]} of {topic}-{partition} "
                       "is not live or not in the ISR"}
    result["leader"] = draft.image.topics[topic].partitions[partition].leader
    return result


class _TopicCreation:
    """State shared by the topics of one CreateTopics / CreatePartitions
    request: the draft, the placement load (replicas and preferred
    leaderships per broker, so later topics spread over what earlier ones
    took), the normalised names for the collision rule, and the partition
    budget of the request."""

    def __init__(self, draft: _Draft, settings: ControllerSettings, validate_only: bool) -> None:
        self.draft = draft
        self.settings = settings
        self.validate_only = validate_only
        # The image's counts as of now (it keeps them: nothing here walks
        # every partition); topics this request creates are added as it goes.
        self.replica_counts = draft.image.replica_counts.copy()
        self.leader_counts = draft.image.preferred_leader_counts.copy()
        self.collision_keys: dict[str, str] = {}  # this request's topics
        self.partitions_left = PARTITIONS_PER_REQUEST_MAX

    def _count(self, assignment: Iterable[list[int]]) -> None:
        for replicas in assignment:
            self.replica_counts.update(replicas)
            if replicas:
                self.leader_counts[replicas[0]] += 1

    def check_collision(self, name: str) -> None:
        """Kafka's rule: '.' and '_' collide in metric names, so two topics
        may not differ only by them."""
        key = collision_key(name)
        other = self.collision_keys.get(key) or self.draft.image.topics_by_collision_key.get(key)
        if other is not None:
            raise InvalidTopicError(
                f"topic {name!r} collides with existing topic {other!r}: topic names may not "
                "differ only by '.' and '_'")

    def place(self, num_partitions: int, replication_factor: int) -> list[list[int]]:
        image = self.draft.image
        live = sorted(image.live_broker_ids())
        brokers = [BrokerInfo(broker_id, image.brokers[broker_id].rack) for broker_id in live]
        return place_replicas(brokers, num_partitions, replication_factor,
                              existing_replica_counts=self.replica_counts,
                              existing_leader_counts=self.leader_counts)

    def check_partition_budget(self, count: int) -> None:
        if count > self.partitions_left:
            raise InvalidPartitionsError(
                f"a request may create at most {PARTITIONS_PER_REQUEST_MAX} partitions; "
                f"{PARTITIONS_PER_REQUEST_MAX - self.partitions_left} are already created by "
                f"earlier items, so {count} more are refused")

    def take_partition_budget(self, count: int) -> None:
        self.check_partition_budget(count)
        self.partitions_left -= count

    def new_topic_id(self, id_factory: Callable[[], str]) -> str:
        """A topic id not in use. validate_only needs one only for the draft,
        so it takes a placeholder rather than the factory's randomness."""
        in_use = self.draft.image.topic_names_by_id
        if self.validate_only:
            return next(f"validate-only-{n}" for n in range(len(in_use) + 1)
                        if f"validate-only-{n}" not in in_use)
        for _ in range(TOPIC_ID_ATTEMPTS_MAX):
            topic_id = id_factory()
            if isinstance(topic_id, str) and topic_id and topic_id not in in_use:
                return topic_id
        raise KraftError(f"the topic id factory gave no unused id in {TOPIC_ID_ATTEMPTS_MAX} "
                         "attempts")

    def created(self, name: str, assignment: list[list[int]]) -> None:
        self.collision_keys[collision_key(name)] = name
        self._count(assignment)


# -- checks of request semantics (per item) --------------------------------------
def _principal(text: str, what: str) -> str:
    if not text.startswith("User:") or len(text) == len("User:"):
        raise InvalidRequestError(f"a token's {what} is a principal, User:<name>, not {text!r}")
    return text


def _token_wire(record: DelegationTokenRecord) -> dict:
    return {f.name: getattr(record, f.name) for f in dataclasses.fields(record)}


def _error(exc: KraftError) -> dict:
    return {"code": exc.code, "message": str(exc)}


def _check_topic_name(name: str) -> None:
    try:
        validate_topic_name(name)
    except storage_errors.InvalidTopicError as exc:
        raise InvalidTopicError(str(exc)) from None


def _check_partition_count(count: int) -> None:
    if count < 1:
        raise InvalidPartitionsError(f"number of partitions must be at least 1, not {count}")
    if count > PARTITIONS_PER_TOPIC_MAX:
        raise InvalidPartitionsError(
            f"a topic may have at most {PARTITIONS_PER_TOPIC_MAX} partitions, not {count}")


def _check_resource_type(resource_type: str) -> None:
    if resource_type != TOPIC_RESOURCE:
        raise InvalidRequestError(
            f"resource type {resource_type!r} is not supported: only 'topic' configs are "
            "managed by the controller (broker configs are not dynamic yet)")


def _check_replica_lists(image: MetadataImage, assignment: list[list[int]],
                         replication_factor: int, first_partition: int) -> None:
    """Manual replica lists: each of ``replication_factor`` distinct
    registered brokers, at least one of them live (it will lead)."""
    if replication_factor < 1:
        raise InvalidReplicationFactorError(
            f"replication factor must be at least 1, not {replication_factor}")
    live = image.live_broker_ids()
    for offset, replicas in enumerate(assignment):
        where = f"partition {first_partition + offset}"
        if len(replicas) != replication_factor:
            raise InvalidReplicationFactorError(
                f"{where} has {len(replicas)} replicas; every partition needs "
                f"{replication_factor}")
        if len(set(replicas)) != len(replicas):
            raise InvalidRequestError(f"{where} lists a broker twice: {replicas}")
        unknown = sorted(set(replicas) - set(image.brokers))
        if unknown:
            raise InvalidRequestError(f"{where} is assigned to unregistered brokers {unknown}")
        if live.isdisjoint(replicas):
            raise InvalidRequestError(
                f"all brokers {replicas} assigned to {where} are fenced or shutting down")


def _registered_broker(image: MetadataImage, broker_id: int, broker_epoch: int
                       ) -> BrokerRegistration:
    broker = image.brokers.get(broker_id)
    if broker is None:
        raise BrokerIdNotRegisteredError(f"broker {broker_id} is not registered")
    if broker.broker_epoch != broker_epoch:
        raise StaleBrokerEpochError(
            f"broker {broker_id} epoch {broker_epoch} is stale: the registered epoch is "
            f"{broker.broker_epoch}")
    return broker


def _check_target_replicas(image: MetadataImage, target: list[int], where: str) -> None:
    """A reassignment target: at least one broker, each once, each
    registered. Fenced brokers may be named; they catch up once back."""
    if not target:
        raise InvalidRequestError(f"the target replicas of {where} must name at least one broker")
    if len(set(target)) != len(target):
        raise InvalidRequestError(f"the target replicas of {where} list a broker twice: {target}")
    unknown = sorted(set(target) - set(image.brokers))
    if unknown:
        raise InvalidRequestError(
            f"the target replicas of {where} name unregistered brokers {unknown}")


def _existing_partition(image: MetadataImage, topic: str, partition: int
                        ) -> PartitionRegistration:
    current = image.partition(topic, partition)
    if current is None:
        raise UnknownTopicOrPartitionError(f"partition {topic}-{partition} does not exist")
    return current


def _check_alter_partition_epochs(current: PartitionRegistration, broker_id: int,
                                  leader_epoch: int, partition_epoch: int, where: str) -> None:
    if current.leader != broker_id:
        raise NotLeaderOrFollowerError(
            f"broker {broker_id} is not the leader of {where} (the leader is {current.leader})")
    if leader_epoch < current.leader_epoch:
        raise FencedLeaderEpochError(
            f"leader epoch {leader_epoch} of {where} is fenced: the current one is "
            f"{current.leader_epoch}")
    if leader_epoch > current.leader_epoch:
        raise UnknownLeaderEpochError(
            f"leader epoch {leader_epoch} of {where} is newer than the controller's "
            f"{current.leader_epoch}")
    if partition_epoch != current.partition_epoch:
        raise InvalidUpdateVersionError(
            f"partition epoch {partition_epoch} of {where} is not the current "
            f"{current.partition_epoch}")


def _check_recovery_change(current: PartitionRegistration, recovery_state: int,
                           new_isr: list[int], where: str) -> None:
    """Only the controller marks a leader RECOVERING (after an unclean
    election); the leader only ends it. While it lasts the ISR is the
    leader alone: other replicas would sync to a log the leader has not yet
    declared the partition's history."""
    if recovery_state == LEADER_RECOVERING and current.leader_recovery_state == LEADER_RECOVERED:
        raise InvalidRequestError(
            f"leader_recovery_state of {where} cannot go back to RECOVERING (1): only an "
            "unclean election starts it")
    if recovery_state == LEADER_RECOVERING and new_isr != [current.leader]:
        raise InvalidRequestError(
            f"new_isr {new_isr} of {where} may not grow beyond the leader {current.leader} "
            "while the partition is RECOVERING from an unclean election; send "
            "leader_recovery_state 0 (RECOVERED) in the same request once the leader has "
            "taken over")


def _check_new_isr(image: MetadataImage, current: PartitionRegistration, new_isr: list[int],
                   topic: str, partition: int, member_epochs: list[int] | None = None) -> None:
    where = f"{topic}-{partition}"
    if len(set(new_isr)) != len(new_isr) or not set(new_isr) <= set(current.replicas):
        raise InvalidRequestError(
            f"new_isr {new_isr} of {where} must be distinct replicas of {current.replicas}")
    if current.leader not in new_isr:
        raise InvalidRequestError(
            f"new_isr {new_isr} of {where} must contain the leader {current.leader}")
    live = image.live_broker_ids()
    ineligible = sorted(b for b in set(new_isr) - set(current.isr) if b not in live)
    if ineligible:
        raise IneligibleReplicaError(
            f"brokers {ineligible} cannot join the ISR of {where}: they are fenced or "
            "shutting down")
    joining = set(new_isr) - set(current.isr)
    offline = sorted(joining & image.brokers_offline_for(topic, partition))
    if offline:
        raise IneligibleReplicaError(
            f"brokers {offline} cannot join the ISR of {where}: their log of it is in a log "
            "directory they took offline after a disk error")
    # KIP-903: the leader saw each new member caught up in fetches of one
    # registration; a member registered since (a restart, which may have
    # lost its unflushed tail) must catch up again before it joins.
    restarted = sorted(
        (b, epoch, image.brokers[b].broker_epoch) for b, epoch in zip(new_isr, member_epochs or ())
        if b not in current.isr and epoch != -1 and image.brokers[b].broker_epoch != epoch)
    if restarted:
        raise IneligibleReplicaError(
            f"brokers {[b for b, _, _ in restarted]} cannot join the ISR of {where}: the leader "
            "saw them caught up as broker epochs "
            f"{[e for _, e, _ in restarted]}, but they registered again since (epochs "
            f"{[e for _, _, e in restarted]}); they join once they catch up again")


# -- request shapes (what a schema would check) -----------------------------------
def _offline_replicas(body: Fields) -> dict[str, set[int]]:
    """A heartbeat's ``offline_replicas``: topic id -> partition numbers."""
    value = body.mapping("offline_replicas", OFFLINE_REPLICAS_MAX, default={})
    offline: dict[str, set[int]] = {}
    count = 0
    for topic_id, partitions in value.items():
        where = f"offline_replicas[{printable(topic_id)}]"
        as_str(topic_id, f"{where} (a topic id)", NAME_CHARS_MAX)
        if not isinstance(partitions, list):
            raise InvalidRequestError(f"{where} must be a list of partitions")
        count += len(partitions)
        if count > OFFLINE_REPLICAS_MAX:
            raise InvalidRequestError(
                f"offline_replicas names more than {OFFLINE_REPLICAS_MAX} partitions")
        offline[topic_id] = {as_int(p, f"{where}[{i}]", 0, INT32_MAX)
                             for i, p in enumerate(partitions)}
    return offline


def _broker_ids(value: Any, where: str) -> list[int]:
    if not isinstance(value, list) or len(value) > REPLICAS_PER_PARTITION_MAX:
        raise InvalidRequestError(
            f"{where} must be a list of at most {REPLICAS_PER_PARTITION_MAX} broker ids, "
            f"got {printable(value)}")
    return [as_int(broker, f"{where}[{i}]", 0, INT32_MAX) for i, broker in enumerate(value)]


def _config_value(value: Any, where: str) -> Any:
    """Config values travel as strings, numbers (``min.cleanable.dirty.ratio``
    as a float), booleans, or lists of strings (``cleanup.policy`` as
    ``["compact", "delete"]``); the registry judges the value itself, per item."""
    if isinstance(value, (str, int, float)):  # bool is an int
        return value
    if (isinstance(value, (list, tuple)) and len(value) <= CONFIG_LIST_ITEMS_MAX
            and all(isinstance(item, str) for item in value)):
        return value
    raise InvalidRequestError(
        f"{where} must be a string, a number, a boolean or a list of at most "
        f"{CONFIG_LIST_ITEMS_MAX} strings, got {printable(value)}")


def _scram_change(image: MetadataImage, upsert: bool, fields: Fields) -> list[ConfigRecord]:
    """The records of one upsertion (name, mechanism, iterations, salt,
    salted_password) or deletion (name, and a mechanism or not) of a SCRAM
    user. A user has one password: a new one replaces the credentials of
    every mechanism; a deletion without a mechanism removes them all."""
    name = fields.values.get("name")
    given = fields.values.get("mechanism")
    try:
        if upsert:
            scram.check_user_name(name)
        elif not isinstance(name, str) or not name:  # a stored name may always go
            raise ValueError(f"name must be a user's name, not {name!r}")
        if given is not None and not isinstance(given, str):
            raise ValueError(f"mechanism must be a string, not {given!r}")
        mechanism = scram.check_mechanism(given) if upsert or given is not None else None
        value = _scram_credential(fields, mechanism) if upsert else None
    except ValueError as exc:
        raise InvalidRequestError(f"{fields.where}: {exc}") from None
    current = sorted(image.scram_credentials(name))
    if value is None:
        if not current or (mechanism and mechanism not in current):
            raise ResourceNotFoundError(f"user {name!r} has no {mechanism or 'SCRAM'} "
                                        "credential")
        return [ConfigRecord(scram.USER_SCRAM_RESOURCE, name, other, None)
                for other in ([mechanism] if mechanism else current)]
    return [ConfigRecord(scram.USER_SCRAM_RESOURCE, name, other, None)
            for other in current if other != mechanism] + [
        ConfigRecord(scram.USER_SCRAM_RESOURCE, name, mechanism, value)]


def _scram_credential(fields: Fields, mechanism: str) -> str:
    """The stored credential of an upsertion: only the keys SCRAM derives
    from the salted password the client sent."""
    iterations = scram.check_iterations(fields.values.get("iterations"))
    salt = fields.values.get("salt")
    salted = fields.values.get("salted_password")
    if not (isinstance(salt, bytes) and 16 <= len(salt) <= 256):
        raise ValueError("salt must be 16-256 random bytes")
    size = scram.digest_size(mechanism)
    if not (isinstance(salted, bytes) and len(salted) == size):
        raise ValueError(f"salted_password must be the {size}-byte PBKDF2 output of the "
                         f"password for {mechanism}")
    return scram.encode(scram.credential(salted, salt, iterations, mechanism))


def _endpoints(body: Fields) -> dict[str, str]:
    endpoints = body.mapping("endpoints", ENDPOINTS_MAX)
    if not endpoints:
        raise InvalidRequestError("endpoints must name at least one listener")
    for listener, address in endpoints.items():
        where = f"endpoints[{printable(listener)}]"
        as_str(listener, f"endpoints key {printable(listener)}", ENDPOINT_CHARS_MAX)
        as_str(address, where, ENDPOINT_CHARS_MAX)
        # host:port, or https://host:port for an SSL listener.
        host, sep, port = address.removeprefix("https://").rpartition(":")
        if not (sep and host and "/" not in host and port.isascii() and port.isdigit()
                and 0 < int(port) < 65536):
            raise InvalidRequestError(
                f"{where} must be 'host:port' or 'https://host:port', got {printable(address)}")
    return dict(endpoints)


def _topic_partition(item: Any, where: str) -> tuple[str, int]:
    fields = Fields(item, where)
    return fields.string("topic", NAME_CHARS_MAX), fields.integer("partition", 0, INT32_MAX)


@dataclasses.dataclass
class _NewTopic:
    """One topic of a CreateTopics request, shape-checked. -1 means default."""

    name: str
    num_partitions: int
    replication_factor: int
    configs: dict[str, Any]
    assignments: list[tuple[int, list[int]]] | None

    @classmethod
    def parse(cls, item: Any, where: str) -> "_NewTopic":
        fields = Fields(item, where)
        name = fields.string("name", NAME_CHARS_MAX)
        num_partitions = fields.integer("num_partitions", -(2**31), INT32_MAX, default=-1)
        replication_factor = fields.integer("replication_factor", -(2**31), INT32_MAX, default=-1)
        configs = fields.mapping("configs", CONFIGS_PER_RESOURCE_MAX, default={})
        for key, value in configs.items():
            as_str(key, f"{fields.path('configs')} key {printable(key)}", NAME_CHARS_MAX)
            _config_value(value, f"{fields.path('configs')}[{key!r}]")
        raw = fields.mapping("assignments", PARTITIONS_PER_TOPIC_MAX, default=None)
        assignments = None
        if raw is not None:
            assignments = [(_partition_key(key, fields.path("assignments")),
                            _broker_ids(replicas, f"{fields.path('assignments')}[{key!r}]"))
                           for key, replicas in raw.items()]
        return cls(name, num_partitions, replication_factor, dict(configs), assignments)


def _partition_key(key: Any, where: str) -> int:
    """Partition numbers key ``assignments``: ints, or digit strings (JSON)."""
    if isinstance(key, str) and key.isascii() and key.isdigit() and len(key) <= 10:
        key = int(key)
    return as_int(key, f"{where} key {printable(key)}", 0, INT32_MAX)


@dataclasses.dataclass
class _NewPartitions:
    """One topic of a CreatePartitions request, shape-checked."""

    name: str
    count: int
    assignments: list[list[int]] | None

    @classmethod
    def parse(cls, item: Any, where: str) -> "_NewPartitions":
        fields = Fields(item, where)
        name = fields.string("name", NAME_CHARS_MAX)
        count = fields.integer("count", 0, INT32_MAX)
        raw = fields.sequence("assignments", PARTITIONS_PER_TOPIC_MAX, default=None)
        assignments = None
        if raw is not None:
            assignments = [_broker_ids(replicas, f"{fields.path('assignments')}[{i}]")
                           for i, replicas in enumerate(raw)]
        return cls(name, count, assignments)


@dataclasses.dataclass
class _Reassignment:
    """One partition of an AlterPartitionReassignments request, shape-checked;
    ``replicas`` None cancels."""

    topic: str
    partition: int
    replicas: list[int] | None

    @classmethod
    def parse(cls, item: Any, where: str) -> "_Reassignment":
        fields = Fields(item, where)
        topic = fields.string("topic", NAME_CHARS_MAX)
        partition = fields.integer("partition", 0, INT32_MAX)
        replicas = fields.sequence("replicas", REPLICAS_PER_PARTITION_MAX, default=None)
        if replicas is not None:
            replicas = _broker_ids(replicas, fields.path("replicas"))
        return cls(topic, partition, replicas)


@dataclasses.dataclass
class _ConfigChange:
    """One resource of an AlterConfigs request: (key, op, value) ops."""

    type: str
    name: str
    ops: list[tuple[str, str, Any]]

    @classmethod
    def parse(cls, item: Any, where: str) -> "_ConfigChange":
        fields = Fields(item, where)
        resource_type = fields.string("type", NAME_CHARS_MAX)
        name = fields.string("name", NAME_CHARS_MAX)
        ops = []
        for i, raw in enumerate(fields.sequence("ops", CONFIGS_PER_RESOURCE_MAX)):
            op_fields = Fields(raw, f"{fields.path('ops')}[{i}]")
            key = op_fields.string("name", NAME_CHARS_MAX)
            op = op_fields.string("op", NAME_CHARS_MAX)
            if op not in ("set", "delete"):
                raise InvalidRequestError(
                    f"{op_fields.path('op')} must be 'set' or 'delete', got {printable(op)}")
            value = None
            if op == "set":
                value = _config_value(op_fields.required("value"), op_fields.path("value"))
            ops.append((key, op, value))
        return cls(resource_type, name, ops)
