"""The broker's replication core: every replication decision, no I/O.

One ``ReplicationCore`` per broker. It owns the ``Partition``s the broker
hosts and everything that happens to them: the leader gate of every data
request, produce appends and the ``acks=all`` purgatory, fetch long-polls,
the judgement of a follower's fetch (diverged? where does its log end?),
the follower side (which leader to fetch from, what to ask, how to apply the
answer: append, truncate, restart), ISR proposals (AlterPartition) in
flight, and following the metadata image. The broker's membership state
comes from the ``LifecycleCore`` it is given.

Style: etcd-io/raft's ``Ready``. Callers feed events, each with ``now_ms``:

  ``apply_image``             the broker's metadata image changed
  ``produce``                 a produce request (appends at once)
  ``fetch``                   a fetch request, from a consumer or a follower
  ``fetch_answered`` / ``fetch_failed``    the answer to a ``SendFetch``
  ``alter_partition_answered``             the answer to a ``SendAlterPartition``
  ``tick``                    time passed (deadlines, ISR expiration)

and then take ``ready()``: the actions to carry out, in order:

  ``Respond``                 answer request ``request_id`` (produce or fetch)
  ``SendFetch``               send a follower fetch to leader ``leader_id``
  ``CancelRequest``           drop a ``SendFetch`` still out (its answer is void)
  ``SendAlterPartition``      send an ISR change to the controller

``next_wake_ms()`` says when ``tick`` has work. Logs are the only thing the
core touches directly: it calls the injected ``HostedLogs`` to open and
delete them and the ``storage.log.Log`` of each partition to append, read
and truncate. The asyncio shell (``ReplicaManager`` with ``data_api.py``,
``fetcher.py`` and ``isr.py``) and the seeded simulator
(``tests/sim/replication.py``) drive this same class.

Results in ``Respond`` carry per-partition errors as exceptions (``error``:
an ``Exception`` or None); the shell turns them into the wire's error
entries (an exception without a code is a storage failure).
"""

from __future__ import annotations

import dataclasses
import heapq
import itertools
import logging
import secrets
import zlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Protocol

from api.broker.lifecycle_core import LifecycleCore
from protocol.fetch_session import (FETCH_SESSION_EPOCH_MAX, FETCH_SESSION_ERRORS, NO_SESSION,
                                     OPEN_SESSION, next_fetch_session_epoch)
from api.broker.partition import IsrProposal, Partition
from kraft.config import BROKER_LISTENER
from kraft.image import MetadataImage
from kraft.records import LEADER_RECOVERING, NO_LEADER
from kraft.topic_config import MIN_INSYNC_REPLICAS, builtin_defaults
from protocol import tls
from protocol.errors import (FencedLeaderEpochError, InvalidRequestError, LeaderNotAvailableError,
                             NotEnoughReplicasAfterAppendError, NotEnoughReplicasError,
                             NotLeaderOrFollowerError, ReplicationTimedOutError,
                             StaleBrokerEpochError, UnknownLeaderEpochError,
                             UnknownTopicOrPartitionError)
from storage.batch import ControlType
from storage.config import TOPIC_KEYS
from storage.errors import InvalidTxnStateError, LogDirectoryError, OffsetOutOfRangeError
from storage.log import AppendInfo, Log
from storage.manager import TopicPartition, validate_topic_name

logger = logging.getLogger(__name__)

#: How long a follower's partition rests after an error before it is fetched again.
PARTITION_BACKOFF_MS = 200
#: Pause of a follower fetch session after its leader could not be reached.
CONNECT_BACKOFF_MS = 100
#: How long an AlterPartition may take at the controller.
ALTER_PARTITION_TIMEOUT_MS = 5000
#: A follower fetch's answer may take the leader's long-poll plus this.
FETCH_TIMEOUT_SLACK_MS = 10_000
#: Longest long-poll of a fetch, whatever the request asks.
FETCH_WAIT_MS_MAX = 30_000
#: A follower's fetch that has yet to name partitions this leader came to
#: lead waits at most EXPECTED_WAIT_MS (it will soon hear of them), for
#: EXPECTED_WINDOW_MS after the leadership at most.
EXPECTED_WAIT_MS = 20
EXPECTED_WINDOW_MS = 2000
#: Logs opened (created or read from disk) per pass over a metadata change;
#: the rest wait for the next pass, right after the event loop's other work.
NEW_LOGS_PER_PASS = 16
#: Refusals the controller makes before writing anything, and which no copy
#: of the request can escape: the partition epoch is checked first, and the
#: request's shape is judged against what that epoch fixes (replicas,
#: leader), so the proposal certainly did not take effect. Not
#: INELIGIBLE_REPLICA: liveness and registrations change without a new
#: partition epoch, so one copy may be refused while another (a retry, or
#: one still queued at the controller) is applied; the leader then keeps
#: counting the members it proposed until the controller says otherwise.
#: (The replication simulation found it: seed 1680 with 5 brokers, a high
#: watermark committed by the leader alone while the controller's ISR held
#: a member without those records.)
DEFINITE_REFUSALS = frozenset({"INVALID_REQUEST"})


def broker_url(image: MetadataImage, broker_id: int) -> str | None:
    broker = image.brokers.get(broker_id)
    if broker is None:
        return None
    address = broker.endpoints.get(BROKER_LISTENER)
    # An SSL listener registers its https:// URL; a plain one host:port.
    return tls.url(address, tls.PLAINTEXT) if address else None


def _as_int(value, default: int) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


# -- what the core is given -----------------------------------------------------------
#: What ``HostedLogs.open`` answers for a new log whose files are being
#: created on another thread: the core waits for ``logs_created``.
LOG_PENDING = "pending"


class HostedLogs(Protocol):
    """The disk side of hosting partitions (``replica_manager.DiskLogs`` in
    the broker; the simulator passes the same class over its own dirs)."""

    def open(self, tp: TopicPartition, topic_id: str, overrides: dict,
             caught_up: bool) -> tuple[Log, int | None] | None | str:
        """The partition's log, opened or created, with its checkpointed
        high watermark; None when the log on disk belongs to another
        incarnation of the topic and the image is too old to say which;
        ``LOG_PENDING`` when a new log's files are being made elsewhere
        (the core is then told by ``ReplicationCore.logs_created``)."""

    def reconfigure(self, tp: TopicPartition, overrides: dict) -> None:
        """Apply changed topic config overrides to an open log."""

    def delete(self, tp: TopicPartition) -> None:
        """Delete the partition's log."""

    def hosted(self) -> set[TopicPartition]:
        """Every partition with a log on disk."""


@dataclasses.dataclass(frozen=True)
class ReplicationSettings:
    """Kafka's names: replica.lag.time.max.ms, replica.fetch.wait.max.ms,
    replica.fetch.max.bytes, replica.fetch.response.max.bytes,
    num.replica.fetchers; unsafe.ack.before.replication (the chaos checker's
    broken broker: acks=all treated as acks=1)."""

    lag_time_max_ms: int = 30_000
    fetch_wait_max_ms: int = 500
    fetch_partition_bytes_max: int = 1024 * 1024
    fetch_response_bytes_max: int = 10 * 1024 * 1024
    num_fetchers: int = 1
    ack_before_replication: bool = False
    #: Consumers' fetch sessions this broker keeps at most (Kafka's
    #: max.incremental.fetch.session.cache.slots); followers' do not count.
    fetch_session_cache_slots: int = 1000

    @property
    def isr_check_interval_ms(self) -> int:
        return max(50, self.lag_time_max_ms // 2)


# -- requests --------------------------------------------------------------------------
@dataclasses.dataclass
class ProduceItem:
    tp: TopicPartition
    current_leader_epoch: int | None
    records: bytes


@dataclasses.dataclass
class MarkerItem:
    """One transaction marker to write (WriteTxnMarkers)."""

    tp: TopicPartition
    producer_id: int
    producer_epoch: int
    coordinator_epoch: int
    committed: bool


@dataclasses.dataclass
class FetchSpec:
    tp: TopicPartition
    offset: int
    max_bytes: int
    current_leader_epoch: int | None
    last_fetched_epoch: int = -1


@dataclasses.dataclass
class FetchRequest:
    replica_id: int  # -1: a consumer
    specs: list[FetchSpec]
    max_wait_ms: int
    min_bytes: int
    max_bytes: int
    #: READ_UNCOMMITTED (0) or READ_COMMITTED (1), Kafka's numbers.
    isolation_level: int = 0
    #: An incremental fetch session (Kafka's KIP-227), a follower's or a
    #: consumer's: epoch
    #: NO_SESSION (-1) fetches ``specs`` alone; 0 opens a session of
    #: ``specs`` (closing ``session_id``'s, if given); from 1 on, the
    #: session's next fetch, whose ``specs`` are only the partitions whose
    #: position changed and ``forgotten`` those it drops.
    session_id: int = 0
    session_epoch: int = -1
    forgotten: list[TopicPartition] = dataclasses.field(default_factory=list)
    #: Which of the follower's fetchers sends it (a session is its alone).
    fetcher: int = 0
    #: The follower's broker epoch (its registration, KIP-903); -1: unnamed.
    replica_epoch: int = -1
    #: Who sends a consumer's fetch (its principal and client id): a
    #: consumer's session answers only the one that opened it.
    owner: str = ""
    #: A consumer's fetch with ACLs: the error for a topic its sender may
    #: not read now (None if it may), judged again for every partition a
    #: session answers, named or not (an ACL removed since counts); a
    #: partition refused leaves the session, as any answered with an error.
    refusal: Callable[[str], Exception | None] | None = None


READ_UNCOMMITTED, READ_COMMITTED = 0, 1
#: Partitions one data request may name (the broker refuses more): a
#: follower's fetch names at most this many, the rest in its next ones.
PARTITIONS_PER_REQUEST_MAX = 10_000
#: Fetch sessions a leader keeps per follower broker (the oldest is closed;
#: a follower has one per fetcher, ``num.replica.fetchers`` <= 64), and how
#: long one may go unused before it is closed.
FETCH_SESSIONS_PER_REPLICA_MAX = 64
FETCH_SESSION_IDLE_MS = 120_000



# -- actions ---------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Respond:
    request_id: int
    results: list[dict]
    #: Top-level fields of the answer besides the results (a fetch
    #: session's ``session_id``, or its ``error``).
    fields: dict = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class SendFetch:
    request_id: int
    leader_id: int
    body: dict
    timeout_ms: int


@dataclasses.dataclass(frozen=True)
class CancelRequest:
    request_id: int


@dataclasses.dataclass(frozen=True)
class SendAlterPartition:
    request_id: int
    body: dict
    timeout_ms: int


Action = Respond | SendFetch | CancelRequest | SendAlterPartition


# -- what waits ------------------------------------------------------------------------
@dataclasses.dataclass
class _PendingAck:
    """An acks=all write waiting for the high watermark to pass it."""

    result: dict
    part: Partition
    leader_epoch: int
    required_offset: int  # the high watermark that commits it


@dataclasses.dataclass
class _ParkedProduce:
    request_id: int
    results: list[dict]
    waiting: list[_PendingAck]
    deadline_ms: int
    timeout_ms: int
    tps: set[TopicPartition]


@dataclasses.dataclass
class _ParkedFetch:
    request_id: int
    request: FetchRequest
    answered: dict[int, dict]  # decided on arrival, by position
    to_read: list[FetchSpec]
    deadline_ms: int
    #: Its fetch session: its other partitions answer too, those with
    #: something new (records, high watermark, log start, an error).
    session: "_LeaderFetchSession | None" = None
    #: The answer's top-level fields without a session (a consumer's that
    #: asked for one and found no room: ``session_id`` 0).
    fields: dict = dataclasses.field(default_factory=dict)
    #: ``to_read`` by partition, and the bytes found in those of its
    #: partitions (and its session's) read while it waited: a touch reads
    #: only the partitions it touched (``ReplicationCore._brings_enough``).
    by_tp: dict[TopicPartition, FetchSpec] = dataclasses.field(default_factory=dict)
    seen_bytes: dict[TopicPartition, int] = dataclasses.field(default_factory=dict)
    seen_total: int = 0
    #: Its session's partitions it named further on than the fetch before.
    advanced: set[TopicPartition] = dataclasses.field(default_factory=set)


class _LeaderFetchSession:
    """A fetch session on a leader, a follower's or a consumer's
    (``replica_id`` -1): where the fetcher stands in each partition (as it
    last said), what it was last told of each, and which partitions changed
    since (``dirty``: touched, or left behind by an answer's byte budget, so
    read again at its next fetch, in that order). An incremental fetch names
    only the partitions whose position changed, and is answered with only
    those and the dirty ones with news: a fetcher of 10,000 quiet partitions
    costs its leader nothing per fetch for them."""

    def __init__(self, session_id: int, replica_id: int, fetcher: int,
                 owner: str = "") -> None:
        self.session_id = session_id
        self.replica_id = replica_id
        self.fetcher = fetcher  # which of the follower's fetchers holds it
        self.owner = owner  # a consumer's: who opened it
        self.next_epoch = 1
        self.specs: dict[TopicPartition, FetchSpec] = {}
        # What it was last told of each partition (``_news``).
        self.told: dict[TopicPartition, tuple] = {}
        # An ordered set: those left behind by the byte budget lead.
        self.dirty: dict[TopicPartition, None] = {}
        self.parked: int | None = None  # its fetch waiting for records
        # The partitions its latest fetch named further on than the fetch
        # before, in the same leader epoch (``_ParkedFetch.advanced``).
        self.advanced: set[TopicPartition] = set()
        self.last_fetch_ms = 0
        self.replica_epoch = -1  # the follower's broker epoch, as its last fetch said


@dataclasses.dataclass
class _AlterInFlight:
    part: Partition
    proposal: IsrProposal
    deadline_ms: int
    isr_before: list[int]  # the ISR the proposal changes


@dataclasses.dataclass
class _FetchInFlight:
    request_id: int
    # Per partition: the Partition object, its leader epoch and log end when
    # the fetch was built; the answer applies only if all three still hold.
    sent: dict[TopicPartition, tuple[Partition, int, int]]
    deadline_ms: int


class _FollowerSession:
    """The follower fetch loop towards one leader broker (one of
    ``num.replica.fetchers`` per leader)."""

    def __init__(self, key: tuple[int, int]) -> None:
        self.key = key
        self.leader_id = key[0]
        # Partitions fetched, with the leader epoch each was assigned in.
        self.partitions: dict[TopicPartition, int] = {}
        # Partitions resting after an error, until this time.
        self.resting: dict[TopicPartition, int] = {}
        # The order partitions are asked for in: those that just returned
        # data go to the back, so a busy partition cannot starve the others
        # of the response budget (only the first with data may exceed it).
        self.order: dict[TopicPartition, None] = {}
        self.in_flight: _FetchInFlight | None = None
        # After a failure to reach the leader, no fetch before this time.
        self.backoff_until_ms = 0
        # The leader's fetch session (0: none yet; the next fetch opens one)
        # and the epoch of its next fetch.
        self.fetch_session_id = 0
        self.fetch_session_epoch = OPEN_SESSION
        # Per partition, what the leader's session holds of it: the
        # Partition, its leader epoch, log end and last fetched epoch when
        # last sent. A partition whose state still matches is left out of
        # an incremental fetch; an answer applies only while it matches.
        self.told: dict[TopicPartition, tuple[Partition, int, int, int]] = {}
        # Partitions whose state may differ from ``told``: answered, put to
        # rest or back from it, added to the session, dropped from it or in
        # a new leader epoch. An incremental fetch looks at these alone (a
        # partition's log end moves only by this session's answers).
        self.changed: set[TopicPartition] = set()

    def reset_fetch_session(self) -> None:
        """Forget the leader's session (a fetch failed, was cancelled or
        refused): the next fetch opens a new one with every partition."""
        self.fetch_session_epoch = OPEN_SESSION
        self.told = {}
        self.changed = set()


class ReplicationCore:
    def __init__(self, broker_id: int, logs: HostedLogs, lifecycle: LifecycleCore,
                 settings: ReplicationSettings = ReplicationSettings(), *,
                 topic_defaults: Mapping[str, str] | None = None,
                 partition_factory: Callable[..., Partition] = Partition) -> None:
        self.broker_id = broker_id
        self.logs = logs
        self.lifecycle = lifecycle
        self.settings = settings
        # Topic-level defaults (this node's min.insync.replicas and friends).
        self.topic_defaults = dict(topic_defaults or builtin_defaults())
        #: min.insync.replicas of a topic without an override, on this broker.
        self.default_min_insync_replicas = _as_int(
            self.topic_defaults.get(MIN_INSYNC_REPLICAS), 1)
        # The simulator plants known bugs through a Partition subclass.
        self.partition_factory = partition_factory
        self.partitions: dict[TopicPartition, Partition] = {}
        # The hosted partitions by topic, and the follower session each
        # followed partition is in: a metadata change looks only at what it
        # changed (apply_image).
        self._by_topic: dict[str, set[TopicPartition]] = {}
        self._session_key_of: dict[TopicPartition, tuple[int, int]] = {}
        # (metadata caught up, fetch ready) at the last walk of every topic.
        self._walked: tuple[bool, bool] | None = None
        # Assigned partitions whose log did not open: looked at again on the
        # next metadata change, whatever it changed.
        self._unopened: dict[str, set[int]] = {}
        # Assigned partitions whose log waits its turn to be opened (at most
        # NEW_LOGS_PER_PASS per pass): opened by the "open" timer.
        self._deferred: dict[str, set[int]] = {}
        # Logs opened by the pass under way (``_apply_topics``): new to this
        # broker, not partitions that changed leader (``_partitions_changed``).
        self._new_logs: set[TopicPartition] = set()
        # Assigned partitions whose new log's files are being created off
        # the event loop (LOG_PENDING): opened once ``logs_created`` says so.
        self._creating: set[TopicPartition] = set()
        #: Partitions whose logs are in a log directory that went offline
        #: after a disk error (``logs_offline``): never opened or served
        #: again by this process; refused with KAFKA_STORAGE_ERROR.
        self.offline: set[TopicPartition] = set()
        #: Passes over metadata (changes and the "open" timer's): the shell
        #: tells the group and transaction coordinators when one ran.
        self.passes = 0
        self.image = MetadataImage()
        # ISR changes this broker made as leader (metrics).
        self.isr_shrinks = 0
        self.isr_expands = 0
        self._actions: list[Action] = []
        self._next_request_id = 0
        # Partitions whose data, high watermark or role changed since waiting
        # requests were last looked at.
        self._touched: set[TopicPartition] = set()
        # Followers of partitions this broker just came to lead: their
        # fetches waiting here are answered at once, so their next fetch
        # (incremental) names the new partitions without waiting out a poll.
        self._wake_followers: set[int] = set()
        # Those partitions, per follower, until its session names them (or
        # EXPECTED_WINDOW_MS passes after the latest): a follower that hears of them after
        # this broker does sends a fetch without them first, which must not
        # wait out a whole poll either (it waits EXPECTED_WAIT_MS at most).
        self._expected_from: dict[int, tuple[set[TopicPartition], int]] = {}
        self._parked_fetches: dict[int, _ParkedFetch] = {}
        self._parked_produces: dict[int, _ParkedProduce] = {}
        # Followers' fetch sessions on this leader, and by partition.
        self._fetch_sessions: dict[int, _LeaderFetchSession] = {}
        self._fetch_sessions_of: dict[TopicPartition, set[int]] = {}
        self._next_fetch_session_id = 0
        #: Consumers' sessions closed to make room for bigger ones.
        self.fetch_session_evictions = 0
        # Waiting requests by partition (ids into the two maps above).
        self._waiting_on: dict[TopicPartition, set[int]] = {}
        self._alters: dict[int, _AlterInFlight] = {}
        self._sessions: dict[tuple[int, int], _FollowerSession] = {}
        self._next_isr_check_ms = 0
        self._live_brokers: set[int] = set()
        # Deadlines, as a heap of (time, tie-breaker, kind, key): a parked
        # fetch's or produce's, an AlterPartition's, a session's (its fetch
        # in flight, its back-off, a resting partition). Entries whose
        # object is gone or has another deadline are skipped when met, so
        # nothing is ever searched for: no event costs O(partitions).
        self._timers: list[tuple[int, int, str, object]] = []
        self._timer_seq = itertools.count()

    # -- the Ready interface ------------------------------------------------------
    def ready(self) -> list[Action]:
        """Actions decided since the last call, in order; the caller must
        carry out every one."""
        actions, self._actions = self._actions, []
        return actions

    def new_request_id(self) -> int:
        self._next_request_id += 1
        return self._next_request_id

    def next_wake_ms(self) -> int:
        """The earliest time ``tick`` may have something to do."""
        while self._timers and not self._timer_live(self._timers[0]):
            heapq.heappop(self._timers)
        if self._timers:
            return min(self._timers[0][0], self._next_isr_check_ms)
        return self._next_isr_check_ms

    def _at(self, deadline_ms: int, kind: str, key) -> None:
        heapq.heappush(self._timers, (deadline_ms, next(self._timer_seq), kind, key))

    def _timer_live(self, entry: tuple[int, int, str, object]) -> bool:
        deadline_ms, _seq, kind, key = entry
        if kind == "fetch":
            parked = self._parked_fetches.get(key)
            return parked is not None and parked.deadline_ms == deadline_ms
        if kind == "produce":
            parked = self._parked_produces.get(key)
            return parked is not None and parked.deadline_ms == deadline_ms
        if kind == "alter":
            alter = self._alters.get(key)
            return alter is not None and alter.deadline_ms == deadline_ms
        if kind == "open":
            return bool(self._deferred)
        return key in self._sessions  # a session's: at worst an early tick

    def tick(self, now_ms: int) -> None:
        """Time moved to ``now_ms``: answer long-polls and writes whose time
        is up, give up on requests out too long, shrink or grow ISRs."""
        while self._timers and self._timers[0][0] <= now_ms:
            entry = heapq.heappop(self._timers)
            if self._timer_live(entry):
                self._expire(entry[2], entry[3], now_ms)
        if now_ms >= self._next_isr_check_ms:
            self._next_isr_check_ms = now_ms + self.settings.isr_check_interval_ms
            self._refresh_fetch_sessions(now_ms)
            for part in list(self.partitions.values()):
                if part.is_leader:
                    self._maybe_propose(part, now_ms)
        self._after_event(now_ms)

    def _expire(self, kind: str, key, now_ms: int) -> None:
        if kind == "open":
            self._open_pass(now_ms, {}, retry_failed=False)
        elif kind == "fetch":
            self._answer_fetch(self._parked_fetches[key], final=True)
        elif kind == "produce":
            self._time_out_produce(self._parked_produces[key])
        elif kind == "alter":
            alter = self._alters.pop(key)
            self._actions.append(CancelRequest(key))
            self._settle_alter(alter, None, refused=False)
        else:
            session = self._sessions[key]
            if session.in_flight is not None and session.in_flight.deadline_ms <= now_ms:
                self._actions.append(CancelRequest(session.in_flight.request_id))
                self._fetch_failed(session, now_ms)
            if session.backoff_until_ms <= now_ms:
                session.backoff_until_ms = 0
            rested = [tp for tp, t in session.resting.items() if t <= now_ms]
            for tp in rested:
                del session.resting[tp]
            session.changed.update(rested)

    def _rest(self, session: _FollowerSession, tp: TopicPartition, until_ms: int) -> None:
        session.resting[tp] = until_ms
        session.changed.add(tp)
        self._at(until_ms, "session", session.key)

    def _after_event(self, now_ms: int) -> None:
        """Look again at what waits on touched partitions, then send the
        follower fetches that are due."""
        if self._wake_followers:
            wake, self._wake_followers = self._wake_followers, set()
            for session in list(self._fetch_sessions.values()):
                if session.replica_id in wake and session.parked in self._parked_fetches:
                    self._answer_fetch(self._parked_fetches[session.parked], final=True)
        while self._touched:
            touched, self._touched = self._touched, set()
            ids: set[int] = set()
            for tp in touched:
                ids |= self._waiting_on.get(tp, set())
                for session_id in self._fetch_sessions_of.get(tp, ()):
                    session = self._fetch_sessions[session_id]
                    session.dirty[tp] = None
                    if session.parked is not None:
                        ids.add(session.parked)
            # Waiting fetches at one position of one partition (consumers
            # that all read from its end) count its bytes once per pass.
            counted: dict[tuple, int | None] = {}
            for request_id in sorted(ids):
                if request_id in self._parked_produces:
                    self._check_produce(self._parked_produces[request_id])
                elif request_id in self._parked_fetches:
                    parked = self._parked_fetches[request_id]
                    if self._brings_enough(parked, touched, counted):
                        self._answer_fetch(parked, final=False)
        for session in self._sessions.values():
            self._maybe_fetch(session, now_ms)

    def _touch(self, tp: TopicPartition) -> None:
        self._touched.add(tp)

    def _wait_on(self, request_id: int, tps) -> None:
        for tp in tps:
            self._waiting_on.setdefault(tp, set()).add(request_id)

    def _stop_waiting(self, request_id: int, tps) -> None:
        for tp in tps:
            waiting = self._waiting_on.get(tp)
            if waiting is not None:
                waiting.discard(request_id)
                if not waiting:
                    del self._waiting_on[tp]

    # -- following the metadata ------------------------------------------------------
    def apply_image(self, image: MetadataImage, now_ms: int,
                    changed: Mapping[str, set[int] | None] | None = None) -> None:
        """Host what ``image`` gives this broker; once the metadata has caught
        up (``lifecycle.metadata_caught_up``) also take roles from it and
        drop what it no longer gives. ``changed``: the topics (and, where
        known, partitions) the records since the last image touched; only
        those are looked at again, so a change costs what it changed, not
        the cluster's partition count. None looks at everything (a snapshot,
        a cluster-wide config, the first image caught up)."""
        if image is not self.image:
            changed = None  # a new image object (rebuilt): nothing can be assumed
        self.image = image
        live = image.live_broker_ids()
        if live - self._live_brokers:
            # A broker may join ISRs now: its fetches name only partitions
            # whose position changed (fetch sessions), so a follower that
            # caught up while it was fenced is not named again; look now.
            self._next_isr_check_ms = now_ms
        self._live_brokers = live
        self._open_pass(now_ms, changed, retry_failed=True)

    def hosted_in(self, topic: str) -> list[TopicPartition]:
        """The partitions of ``topic`` hosted here (without walking the
        others: the coordinators ask at every metadata change)."""
        return list(self._by_topic.get(topic, ()))

    def opening(self, topics: Iterable[str]) -> bool:
        """Whether logs of ``topics`` the image gives this broker are still
        being opened (waiting their turn or their files being made); not
        those that failed to open, which wait for the next metadata change."""
        return self.opening_any(TopicPartition(name, number) for name in topics
                                for number in getattr(self.image.topics.get(name),
                                                      "partitions", ()))

    def opening_any(self, tps: Iterable[TopicPartition]) -> bool:
        """Whether any of ``tps`` is given to this broker but its log is not
        open yet (waiting its turn or its files being made)."""
        if not (self._deferred or self._creating):
            return False
        return any(tp in self._creating or tp.partition in self._deferred.get(tp.topic, ())
                   for tp in tps)

    def logs_created(self, created: Iterable[TopicPartition], now_ms: int) -> None:
        """New logs whose files ``HostedLogs.open`` had made elsewhere
        (``LOG_PENDING``) are ready: opened by the next "open" pass if the
        image still gives them to this broker, deleted if it no longer does
        (no later walk would, as they were never hosted)."""
        for tp in created:
            self._creating.discard(tp)
            topic = self.image.topics.get(tp.topic)
            reg = topic.partitions.get(tp.partition) if topic is not None else None
            if reg is not None and self.broker_id in reg.replicas:
                self._deferred.setdefault(tp.topic, set()).add(tp.partition)
            elif tp not in self.partitions:
                try:
                    self._remove(tp, "it was unassigned while its log was being created")
                except Exception:
                    logger.exception("broker %d: cannot delete the log of %s",
                                     self.broker_id, tp)
        if self._deferred:
            self._at(now_ms, "open", None)
        self._after_event(now_ms)

    def logs_offline(self, tps: Iterable[TopicPartition], now_ms: int) -> None:
        """The logs of ``tps`` are in a log directory that went offline
        after a disk error: stop leading and following them at once (the
        controller elects other leaders once the heartbeat reports them);
        writes waiting for replication there fail with KAFKA_STORAGE_ERROR
        (acknowledged by nobody: the log may not hold them), waiting fetches
        answer, follower sessions drop them. Their files stay as they are."""
        gone = set(tps) - self.offline
        self.offline |= gone
        for tp in sorted(gone):
            self._creating.discard(tp)
            for pending in (self._deferred, self._unopened):
                numbers = pending.get(tp.topic)
                if numbers is not None:
                    numbers.discard(tp.partition)
                    if not numbers:
                        del pending[tp.topic]
            if self._unhost(tp):
                logger.error("broker %d: %s is offline: its log directory failed",
                             self.broker_id, tp)
            self._touch(tp)
        self._sync_sessions(gone)
        self._after_event(now_ms)

    def _offline_error(self, tp: TopicPartition) -> LogDirectoryError:
        return LogDirectoryError(
            f"broker {self.broker_id} cannot serve {tp}: its log is in a log directory that "
            "went offline after a disk error; the controller moves leadership to another "
            "replica (refresh metadata and retry)")

    def _open_pass(self, now_ms: int, changed: Mapping[str, set[int] | None] | None, *,
                   retry_failed: bool) -> None:
        """``apply_image``'s work on ``self.image``. The next logs waiting
        their turn (``_deferred``), and those of the changed partitions, join
        every pass; logs that failed to open
        (``_unopened``) join only passes for a metadata change
        (``retry_failed``), not the "open" timer's, so a log that keeps
        failing cannot hold the others back or keep the timer busy."""
        caught_up = self.lifecycle.metadata_caught_up
        fetch_ready = self.lifecycle.fetch_ready
        if changed is None:  # every topic is walked: every waiting log with them
            deferred, self._deferred = self._deferred, {}
        else:
            deferred = self._next_deferred()
            for name, numbers in changed.items():  # a changed partition's log is looked at now
                waiting = self._deferred.get(name)
                if not waiting:
                    continue
                taken = set(waiting) if numbers is None else waiting & numbers
                waiting -= taken
                if not waiting:
                    del self._deferred[name]
                if taken:
                    deferred.setdefault(name, set()).update(taken)
        unopened = self._unopened
        joining = (deferred, unopened) if retry_failed else (deferred,)
        if changed is not None and any(joining):
            merged = dict(changed)
            for pending in joining:
                for name, numbers in pending.items():
                    if name in merged and merged[name] is not None:
                        merged[name] = merged[name] | numbers
                    elif name not in merged:
                        merged[name] = set(numbers)
            changed = merged
        if retry_failed or changed is None:
            self._unopened = {}
        try:
            self._apply_image(self.image, now_ms, changed, caught_up, fetch_ready,
                              opening_only=not retry_failed)
        except BaseException:
            self._walked = None  # the next image is looked at whole
            for pending in joining:  # nothing waiting is forgotten
                for name, numbers in pending.items():
                    self._deferred.setdefault(name, set()).update(numbers)
            raise
        finally:
            if self._deferred:  # the next logs at once, once the loop had its turn
                self._at(now_ms + 1, "open", None)
            self.passes += 1
        self._after_event(now_ms)

    def _next_deferred(self) -> dict[str, set[int]]:
        """The next NEW_LOGS_PER_PASS logs waiting their turn, taken out of
        ``_deferred``: a pass walks those, not every log still waiting (a
        broker given 10,000 at once would walk them 600 times)."""
        taken: dict[str, set[int]] = {}
        left = NEW_LOGS_PER_PASS
        while left and self._deferred:
            name = next(iter(self._deferred))
            numbers = self._deferred[name]
            chunk = taken.setdefault(name, set())
            while left and numbers:
                chunk.add(numbers.pop())
                left -= 1
            if not numbers:
                del self._deferred[name]
        return taken

    def _apply_image(self, image: MetadataImage, now_ms: int,
                     changed: Mapping[str, set[int] | None] | None, caught_up: bool,
                     fetch_ready: bool, *, opening_only: bool = False) -> None:
        try:
            self._apply_image_walk(image, now_ms, changed, caught_up, fetch_ready,
                                   opening_only=opening_only)
        finally:
            self._new_logs = set()

    def _apply_image_walk(self, image: MetadataImage, now_ms: int,
                          changed: Mapping[str, set[int] | None] | None, caught_up: bool,
                          fetch_ready: bool, *, opening_only: bool = False) -> None:
        if (changed is None or (not caught_up and not opening_only)
                or (caught_up, fetch_ready) != self._walked):
            self._walked = (caught_up, fetch_ready)
            assigned = self._apply_topics(image, dict.fromkeys(image.topics), caught_up, now_ms)
            if caught_up:
                doomed = {tp for tp in self.partitions if tp not in assigned}
                doomed |= {tp for tp in self.logs.hosted() if tp not in assigned}
                doomed |= {tp for tp in self.offline if tp not in assigned}
                self._drop(doomed)
            self._sync_sessions(None)
        else:
            wanted: set[TopicPartition] = set()  # hosted before, among the changed
            for name, numbers in changed.items():
                hosted = self._by_topic.get(name, set())
                wanted |= (hosted if numbers is None
                           else {tp for tp in hosted if tp.partition in numbers})
            wanted |= {tp for tp in self.offline if tp.topic in changed and (
                changed[tp.topic] is None or tp.partition in changed[tp.topic])}
            assigned = self._apply_topics(image, changed, caught_up, now_ms)
            self._drop({tp for tp in wanted if tp not in assigned})
            self._sync_sessions(wanted | assigned)

    def _assigned_in(self, image: MetadataImage, changed: Mapping[str, set[int] | None] | None):
        """(tp, registration) of this broker's replicas among ``changed``
        (every topic for None)."""
        names = image.topics if changed is None else changed
        for name in names:
            topic = image.topics.get(name)
            if topic is None:
                continue
            numbers = None if changed is None else changed[name]
            items = (topic.partitions.items() if numbers is None
                     else ((n, topic.partitions[n]) for n in sorted(numbers)
                           if n in topic.partitions))
            for number, reg in items:
                if self.broker_id in reg.replicas:
                    yield TopicPartition(name, number), reg

    def _apply_topics(self, image: MetadataImage, changed: Mapping[str, set[int] | None],
                      caught_up: bool, now_ms: int) -> set[TopicPartition]:
        """Open, configure and update this broker's replicas among
        ``changed``; returns them (assigned, whether or not a log opened)."""
        assigned: set[TopicPartition] = set()
        led: list[Partition] = []  # new leaderships, logged together at the end
        try:
            self._apply_assigned(image, changed, caught_up, now_ms, assigned, led)
        finally:
            if led:
                self._log_new_leaderships(led)
        return assigned

    def _apply_assigned(self, image: MetadataImage, changed: Mapping[str, set[int] | None],
                        caught_up: bool, now_ms: int, assigned: set[TopicPartition],
                        led: list[Partition]) -> None:
        """``_apply_topics``' walk: fills ``assigned`` and ``led``."""
        configs_of: dict[str, tuple[dict, int]] = {}
        opened = 0
        for tp, reg in self._assigned_in(image, changed):
            assigned.add(tp)
            if tp in self.offline:
                continue  # never opened again here (logs_offline)
            if tp not in self.partitions:
                # Opening a log creates or reads files: a few at a time, so
                # thousands given at once do not stall everything else.
                if opened >= NEW_LOGS_PER_PASS:
                    self._deferred.setdefault(tp.topic, set()).add(tp.partition)
                    continue
                opened += 1
                self._new_logs.add(tp)
            if tp.topic not in configs_of:
                configs = image.topic_configs(tp.topic)
                configs_of[tp.topic] = (
                    {key: value for key, value in configs.items() if key in TOPIC_KEYS},
                    _as_int(configs.get(MIN_INSYNC_REPLICAS,
                                        self.topic_defaults.get(MIN_INSYNC_REPLICAS)), 1))
            overrides, min_isr = configs_of[tp.topic]
            # Assigned by the image, whether or not its log opens: a log that
            # fails to open now is retried on the next change, never deleted.
            try:
                part = self._hosted(tp, image.topics[tp.topic].topic_id, overrides, caught_up)
            except LogDirectoryError as exc:
                # Its log is in (or was being made in) an offline dir: it is
                # offline here until a restart, and the controller is told.
                # (A hosted one is let go by ``logs_offline``, which the
                # failed dir's listener calls.)
                logger.error("broker %d: cannot open the log of %s: %s", self.broker_id, tp,
                             exc)
                if tp not in self.partitions:
                    self.offline.add(tp)
                continue
            except Exception:
                logger.exception("broker %d: cannot open the log of %s", self.broker_id, tp)
                part = None
            if part is None:
                if caught_up and tp not in self._creating:
                    # Tried again with the next change, whatever it is.
                    self._unopened.setdefault(tp.topic, set()).add(tp.partition)
                continue
            part.min_insync_replicas = min_isr
            if not caught_up:
                # A replayed past: the log is opened, but no role is taken
                # from it (no epoch written, no high watermark moved, no
                # ISR proposed). The caught-up image that follows decides.
                continue
            before = (part.role, part.leader_epoch, part.high_watermark)
            recovery = reg.leader_recovery_state
            if part.update(reg.leader, reg.leader_epoch, reg.partition_epoch,
                           reg.replicas, reg.isr, now_ms, recovery):
                if recovery == LEADER_RECOVERING:
                    self._log_unclean_leadership(part)
                else:
                    led.append(part)
                for replica in reg.replicas:
                    if replica != self.broker_id:
                        self._wake_followers.add(replica)
                        unnamed = self._expected_from.get(replica, (set(), 0))[0]
                        unnamed.add(tp)
                        self._expected_from[replica] = (unnamed, now_ms + EXPECTED_WINDOW_MS)
            if (part.role, part.leader_epoch, part.high_watermark) != before:
                self._touch(tp)  # waiting requests answer with the new role or data

    def _drop(self, doomed: set[TopicPartition]) -> None:
        for tp in sorted(doomed):
            try:
                self._remove(tp, "its topic was deleted or it moved to other brokers")
            except Exception:
                logger.exception("broker %d: cannot delete the log of %s", self.broker_id, tp)

    def _hosted(self, tp: TopicPartition, topic_id: str, overrides: dict,
                caught_up: bool) -> Partition | None:
        part = self.partitions.get(tp)
        if part is not None and part.topic_id != topic_id:
            if not caught_up:
                return None
            self._remove(tp, f"topic recreated with id {topic_id}")
            part = None
        if part is not None:
            self.logs.reconfigure(tp, overrides)
            return part
        opened = self.logs.open(tp, topic_id, overrides, caught_up)
        if opened is None:
            return None
        if opened == LOG_PENDING:
            self._creating.add(tp)
            return None
        self._creating.discard(tp)
        log, high_watermark = opened
        part = self.partition_factory(tp, log, self.broker_id, topic_id,
                                      high_watermark=high_watermark)
        self.partitions[tp] = part
        self._by_topic.setdefault(tp.topic, set()).add(tp)
        return part

    def _remove(self, tp: TopicPartition, reason: str) -> None:
        if tp in self.offline:
            # Its files are in an offline dir: only forgotten (never touched).
            self.offline.discard(tp)
            self.logs.delete(tp)
            return
        logger.info("broker %d: deleting the log of %s (%s)", self.broker_id, tp, reason)
        self._unhost(tp)
        self.logs.delete(tp)
        self._touch(tp)

    def _unhost(self, tp: TopicPartition) -> bool:
        """Forget the hosted partition ``tp``; whether it was hosted."""
        if self.partitions.pop(tp, None) is None:
            return False
        hosted = self._by_topic.get(tp.topic)
        if hosted is not None:
            hosted.discard(tp)
            if not hosted:
                del self._by_topic[tp.topic]
        return True

    def _log_unclean_leadership(self, part: Partition) -> None:
        logger.warning(
            "broker %d: UNCLEAN leader election: leads %s in epoch %d although it was not "
            "in sync; its log ends at offset %d (high watermark %d), so records the "
            "previous leader acknowledged at or above offset %d are LOST",
            self.broker_id, part.tp, part.leader_epoch, part.log_end_offset,
            part.high_watermark, part.log_end_offset)

    def _log_new_leaderships(self, parts: list[Partition]) -> None:
        """One line for the leaderships one metadata change brought, each
        partition named with its epoch and log end (a line each was a tenth
        of a broker's Python time in a profile while topics were created by
        hundreds a second; a failover brings thousands at once)."""
        if not logger.isEnabledFor(logging.INFO):
            return
        named = ", ".join(f"{part.tp} in epoch {part.leader_epoch} (log end "
                          f"{part.log_end_offset})" for part in parts)
        if len(parts) == 1:
            logger.info("broker %d: leader of %s", self.broker_id, named)
        else:
            logger.info("broker %d: leader of %d partitions: %s", self.broker_id, len(parts),
                        named)

    # -- the leader gate ---------------------------------------------------------------
    def leader_partition(self, topic: str, partition: int,
                         current_leader_epoch: int | None = None) -> Partition:
        """The partition if this broker serves data and leads it (in
        ``current_leader_epoch`` when the caller names one); otherwise the
        error that tells the caller where to go."""
        reason = self.lifecycle.not_serving_reason()
        if reason is not None:
            raise NotLeaderOrFollowerError(
                f"broker {self.broker_id} is not serving data: {reason}")
        tp = TopicPartition(topic, partition)
        part = self.partitions.get(tp)
        if part is None or not part.is_leader:
            if part is None and tp in self.offline:
                raise self._offline_error(tp)
            raise self._not_leader(topic, partition)
        if current_leader_epoch is not None and current_leader_epoch >= 0:
            if current_leader_epoch < part.leader_epoch:
                raise FencedLeaderEpochError(
                    f"{topic}-{partition}: leader epoch {current_leader_epoch} is stale; "
                    f"the current one is {part.leader_epoch}")
            if current_leader_epoch > part.leader_epoch:
                raise UnknownLeaderEpochError(
                    f"{topic}-{partition}: leader epoch {current_leader_epoch} is newer "
                    f"than this broker's {part.leader_epoch}; retry")
        return part

    def _led(self, tp: TopicPartition, current_leader_epoch: int | None,
             serving: bool) -> Partition:
        """``leader_partition`` for a partition named by a fetch of perhaps
        thousands: one lookup when this broker serves (``serving``, asked
        once per fetch) and leads it in that epoch; the full checks, and
        the error they raise, otherwise."""
        part = self.partitions.get(tp)
        if (serving and part is not None and part.is_leader
                and (current_leader_epoch is None or current_leader_epoch < 0
                     or current_leader_epoch == part.leader_epoch)):
            return part
        return self.leader_partition(tp.topic, tp.partition, current_leader_epoch)

    def _not_leader(self, topic: str, partition: int) -> Exception:
        reg = self.image.partition(topic, partition)
        if reg is None:
            validate_topic_name(topic)  # a name that can never exist is not retriable
            if topic in self.image.topics:
                count = len(self.image.topics[topic].partitions)
                return UnknownTopicOrPartitionError(
                    f"topic {topic!r} has partitions 0 to {count - 1}, not {partition}")
            return UnknownTopicOrPartitionError(
                f"topic {topic!r} does not exist (create it with "
                f"`kraftlog topics create {topic}`)")
        if reg.leader == NO_LEADER:
            return LeaderNotAvailableError(
                f"{topic}-{partition} has no leader: all its replicas {reg.replicas} "
                "are unavailable", leader_epoch=reg.leader_epoch)
        if reg.leader == self.broker_id:
            # Assigned here, its log not open yet (a new partition's files
            # are being made, or thousands wait their turn): soon, not elsewhere.
            return LeaderNotAvailableError(
                f"broker {self.broker_id} leads {topic}-{partition} but is still opening "
                "its log; retry shortly", leader_epoch=reg.leader_epoch)
        return NotLeaderOrFollowerError(
            f"broker {self.broker_id} is not the leader of {topic}-{partition}; "
            f"broker {reg.leader} is", leader_id=reg.leader,
            leader_epoch=reg.leader_epoch, leader_url=broker_url(self.image, reg.leader))

    # -- produce and the acks=all purgatory ----------------------------------------------
    def produce(self, request_id: int, items: list[ProduceItem], acks: int, timeout_ms: int,
                now_ms: int) -> list[tuple[str, AppendInfo]]:
        """Append each partition's batches as leader; the request is answered
        (``Respond``) at once unless ``acks`` is -1 (all), when it waits until
        every write is committed or fails, or ``timeout_ms`` ends. Each
        partition's outcome is its own. Returns what was appended, per
        topic (for metrics)."""
        if acks == -1 and self.settings.ack_before_replication:
            acks = 1
        seen: set[TopicPartition] = set()
        results, waiting, appended = [], [], []
        for item in items:
            tp = item.tp
            result = {"topic": tp.topic, "partition": tp.partition, "error": None}
            try:
                if tp in seen:
                    raise InvalidRequestError(
                        f"{tp} appears more than once in the request; "
                        "put all its batches in one records field")
                seen.add(tp)
                part = self.leader_partition(tp.topic, tp.partition, item.current_leader_epoch)
                opening = part.needs_verification(item.records)
                if opening is not None and part.txn_guards.get(opening[0]) != opening[1]:
                    raise InvalidTxnStateError(
                        f"producer {opening[0]} epoch {opening[1]} would open a transaction in "
                        f"{tp} that its transaction coordinator has not confirmed (KIP-890): "
                        "add the partition to the transaction first, and name the "
                        "transactional_id in the produce request")
                pending = self._append(part, item.records, acks, result)
                appended.append((tp.topic, pending[1]))
                if pending[0] is not None:
                    waiting.append(pending[0])
            except Exception as exc:  # noqa: BLE001  each partition answers for itself
                result["error"] = exc
            results.append(result)
        self._park_produce(request_id, [] if acks == 0 else results, waiting, timeout_ms, now_ms)
        self._after_event(now_ms)
        return appended

    def write_markers(self, request_id: int, items: list[MarkerItem], timeout_ms: int,
                      now_ms: int) -> None:
        """WriteTxnMarkers from a transaction coordinator: append each
        marker as the partition's leader and answer once every one is
        committed (acks=all), as Kafka's coordinator requires before it
        completes the transaction. Each partition answers for itself."""
        results, waiting = [], []
        for item in items:
            tp = item.tp
            result = {"topic": tp.topic, "partition": tp.partition,
                      "producer_id": item.producer_id, "error": None}
            try:
                part = self.leader_partition(tp.topic, tp.partition)
                if len(part.isr) < part.min_insync_replicas:
                    raise NotEnoughReplicasError(
                        f"{tp} has {len(part.isr)} in-sync replicas, fewer than its "
                        f"min.insync.replicas={part.min_insync_replicas}; the marker waits")
                info = part.log.append_marker(
                    ControlType.COMMIT if item.committed else ControlType.ABORT,
                    item.producer_id, item.producer_epoch, item.coordinator_epoch,
                    part.leader_epoch)
                part.txn_guards.pop(item.producer_id, None)  # the transaction ended here
                part.maybe_advance_high_watermark()
                self._touch(tp)
                result.update(base_offset=info.base_offset)
                waiting.append(_PendingAck(result, part, part.leader_epoch,
                                           info.last_offset + 1))
            except Exception as exc:  # noqa: BLE001  each partition answers for itself
                result["error"] = exc
            results.append(result)
        self._park_produce(request_id, results, waiting, timeout_ms, now_ms)
        self._after_event(now_ms)

    def append_committed(self, request_id: int, part: Partition, records: bytes,
                         timeout_ms: int, now_ms: int, coordinator: bool = False
                         ) -> AppendInfo:
        """Append ``records`` to ``part`` as leader and answer once committed,
        as an acks=all produce does (the group coordinator's writes to
        ``__consumer_offsets``, which checks its leadership itself). Raises
        the error of a write refused before it was appended."""
        result = {"topic": part.tp.topic, "partition": part.tp.partition, "error": None}
        pending, info = self._append(part, records, -1, result, coordinator)
        self._park_produce(request_id, [result], [pending], timeout_ms, now_ms)
        self._after_event(now_ms)
        return info

    def _append(self, part: Partition, records: bytes, acks: int, result: dict,
                coordinator: bool = False) -> tuple[_PendingAck | None, AppendInfo]:
        if acks == -1 and len(part.isr) < part.min_insync_replicas:
            raise NotEnoughReplicasError(
                f"{part.tp} has {len(part.isr)} in-sync replicas {part.isr}, fewer than its "
                f"min.insync.replicas={part.min_insync_replicas}; nothing was written. Retry "
                "once a replica has caught up, or produce with acks=1")
        info = part.append_as_leader(records, coordinator)
        self._touch(part.tp)
        result.update(base_offset=info.base_offset, log_append_time_ms=-1,
                      log_start_offset=part.log_start_offset)
        if acks != -1:
            return None, info
        return _PendingAck(result, part, part.leader_epoch, info.last_offset + 1), info

    def _park_produce(self, request_id: int, results: list[dict], waiting: list[_PendingAck],
                      timeout_ms: int, now_ms: int) -> None:
        if not waiting:
            self._actions.append(Respond(request_id, results))
            return
        tps = {entry.part.tp for entry in waiting}
        parked = _ParkedProduce(request_id, results, waiting, now_ms + timeout_ms, timeout_ms,
                                tps)
        self._parked_produces[request_id] = parked
        self._at(parked.deadline_ms, "produce", request_id)
        self._wait_on(request_id, tps)
        self._check_produce(parked)

    def _check_produce(self, parked: _ParkedProduce) -> None:
        still = []
        for entry in parked.waiting:
            outcome = self._replication_outcome(entry)
            if outcome is None:
                still.append(entry)
            elif isinstance(outcome, Exception):
                _fail_write(entry, outcome)
        parked.waiting = still
        if not still:
            self._finish_produce(parked)

    def _time_out_produce(self, parked: _ParkedProduce) -> None:
        for entry in parked.waiting:
            _fail_write(entry, ReplicationTimedOutError(
                f"{entry.part.tp}: not every in-sync replica of {entry.part.isr} had the write "
                f"within timeout_ms={parked.timeout_ms} (high watermark "
                f"{entry.part.high_watermark}, needed {entry.required_offset}); it may still "
                "be committed"))
        parked.waiting = []
        self._finish_produce(parked)

    def _finish_produce(self, parked: _ParkedProduce) -> None:
        self._parked_produces.pop(parked.request_id, None)
        self._stop_waiting(parked.request_id, parked.tps)
        self._actions.append(Respond(parked.request_id, parked.results))

    def _replication_outcome(self, entry: _PendingAck) -> Exception | bool | None:
        """True once committed, an error if it never will be here, None to
        keep waiting."""
        part = entry.part
        if part.tp in self.offline:
            return self._offline_error(part.tp)
        if (self.partitions.get(part.tp) is not part or not part.is_leader
                or part.leader_epoch != entry.leader_epoch):
            return NotLeaderOrFollowerError(
                f"{part.tp}: this broker stopped leading (epoch {entry.leader_epoch}) before "
                "the write reached every in-sync replica; it may or may not be committed",
                leader_id=part.leader_id, leader_epoch=part.leader_epoch,
                leader_url=broker_url(self.image, part.leader_id))
        if part.high_watermark < entry.required_offset:
            return None
        if len(part.isr) < part.min_insync_replicas:
            return NotEnoughReplicasAfterAppendError(
                f"{part.tp}: the write reached the in-sync replicas {part.isr}, fewer than "
                f"min.insync.replicas={part.min_insync_replicas}, so it is not acknowledged")
        return True

    # -- fetch: consumers and followers, with long-polls --------------------------------
    def fetch(self, request_id: int, request: FetchRequest, now_ms: int) -> None:
        """A fetch: answered (``Respond``) once ``min_bytes`` are there, a
        partition fails, or ``max_wait_ms`` passes. A follower's fetch
        (``replica_id`` >= 0) is judged once, on arrival: diverged, or where
        its log ends; it reads up to the log end, consumers up to the high
        watermark."""
        answered = {}
        session = None
        if (request.replica_id >= 0 and request.session_epoch != NO_SESSION
                and self._stale_registration(request.replica_id, request.replica_epoch)):
            # A dead incarnation's late fetch: its session goes, and it is
            # answered alone (every partition STALE_BROKER_EPOCH).
            old = self._fetch_sessions.get(request.session_id)
            if old is not None and old.replica_id == request.replica_id:
                self._close_fetch_session(old)
            request = dataclasses.replace(request, session_epoch=NO_SESSION)
        no_room = False
        if request.replica_id < 0 and request.session_epoch == NO_SESSION:
            self._close_consumer_session(request)  # Kafka's final epoch, -1
        if request.session_epoch != NO_SESSION:
            session = self._fetch_session(request_id, request, now_ms)
            if session is False:  # no room for a consumer's: answered without
                session, no_room = None, True
            elif session is None:
                self._after_event(now_ms)
                return  # refused: the fetcher opens a new session
        if request.replica_id >= 0:
            answered = self._follower_arrival(request.replica_id, request.replica_epoch,
                                              request.specs, now_ms)
            if session is not None:
                # Refused or diverged: not a position this leader vouches
                # for; the follower names the partition again once it moves.
                for i in answered:
                    self._forget_in_session(session, request.specs[i].tp)
        to_read = [spec for i, spec in enumerate(request.specs) if i not in answered]
        wait_ms = min(request.max_wait_ms, FETCH_WAIT_MS_MAX)
        if session is not None and self._still_expected(request.replica_id, request, now_ms):
            wait_ms = min(wait_ms, EXPECTED_WAIT_MS)
        parked = _ParkedFetch(request_id, request, answered, to_read, now_ms + wait_ms,
                              session, {"session_id": 0} if no_room else {},
                              advanced=session.advanced if session is not None else set())
        if not self._answer_fetch(parked, final=wait_ms <= 0):
            parked.by_tp = {spec.tp: spec for spec in to_read}
            self._parked_fetches[request_id] = parked
            self._at(parked.deadline_ms, "fetch", request_id)
            self._wait_on(request_id, {spec.tp for spec in to_read})
            if session is not None:
                session.parked = request_id
        self._after_event(now_ms)

    def _fetch_session(self, request_id: int, request: FetchRequest, now_ms: int
                       ) -> _LeaderFetchSession | None | bool:
        """The fetcher's session brought up to date with ``request``
        (opened, for epoch 0); None, with the refusal answered, if the
        session is unknown or the epoch out of step; False if a consumer's
        is to be opened and there is no room (``_room_for``)."""
        replica_id = request.replica_id
        if request.session_epoch == OPEN_SESSION:
            if replica_id >= 0:
                # A fetcher has one session: its others are a restarted
                # follower's, or ones whose opening answer it never got.
                for old in [s for s in self._fetch_sessions.values()
                            if (s.replica_id, s.fetcher) == (replica_id, request.fetcher)]:
                    self._close_fetch_session(old)
                mine = [s for s in self._fetch_sessions.values() if s.replica_id == replica_id]
                while len(mine) >= FETCH_SESSIONS_PER_REPLICA_MAX:
                    self._close_fetch_session(mine.pop(0))  # the oldest
            else:
                self._close_consumer_session(request)  # the consumer starts afresh
                if not self._room_for(len(request.specs)):
                    return False
            session = _LeaderFetchSession(self._new_fetch_session_id(replica_id), replica_id,
                                          request.fetcher, request.owner)
            self._fetch_sessions[session.session_id] = session
        else:
            session = self._fetch_sessions.get(request.session_id)
            if session is None or (session.replica_id, session.fetcher, session.owner) != (
                    replica_id, request.fetcher, request.owner):
                whose = f"broker {replica_id}" if replica_id >= 0 else "this consumer"
                code, message = "FETCH_SESSION_ID_NOT_FOUND", (
                    f"no fetch session {request.session_id} of {whose} here")
            elif request.session_epoch != session.next_epoch:
                code, message = "INVALID_FETCH_SESSION_EPOCH", (
                    f"fetch session {request.session_id} expects epoch {session.next_epoch}, "
                    f"not {request.session_epoch}")
            else:
                code = None
            if code is not None:
                self._actions.append(Respond(request_id, [], {
                    "session_id": 0, "error": {"code": code, "message": message}}))
                return None
            stale = self._parked_fetches.get(session.parked) if session.parked else None
            if stale is not None:  # a fetch the follower gave up on
                self._answer_fetch(stale, final=True)
            for tp in request.forgotten:
                self._forget_in_session(session, tp)
            if replica_id < 0 and len(session.specs) + sum(
                    spec.tp not in session.specs for spec in request.specs
            ) > PARTITIONS_PER_REQUEST_MAX:
                # A consumer's session holds no more than one fetch may
                # name: past that it is closed, and this fetch answered
                # without one (the consumer opens a new one, in full).
                self._close_fetch_session(session)
                return False
        if request.session_epoch != OPEN_SESSION:
            session.next_epoch = next_fetch_session_epoch(session.next_epoch)
        session.last_fetch_ms = now_ms
        session.replica_epoch = request.replica_epoch
        advanced = session.advanced = set()
        for spec in request.specs:
            before = session.specs.get(spec.tp)
            if before is None:
                holders = self._fetch_sessions_of.setdefault(spec.tp, set())
                # A partition is fetched by one session of a follower: an
                # older one (a restarted follower's, another fetcher's
                # before a move) no longer speaks for it.
                if replica_id >= 0:
                    for other in [self._fetch_sessions[i] for i in holders]:
                        if other.replica_id == replica_id:
                            self._forget_in_session(other, spec.tp)
                self._fetch_sessions_of.setdefault(spec.tp, set()).add(session.session_id)
            elif (spec.offset > before.offset
                  and spec.current_leader_epoch == before.current_leader_epoch):
                advanced.add(spec.tp)
            session.specs[spec.tp] = spec
        return session

    def _close_consumer_session(self, request: FetchRequest) -> None:
        """Close the session ``request`` names if it is its consumer's own."""
        old = self._fetch_sessions.get(request.session_id) if request.session_id else None
        if old is not None and (old.replica_id, old.owner) == (-1, request.owner):
            self._close_fetch_session(old)

    def _new_fetch_session_id(self, replica_id: int) -> int:
        """A follower's session ids count up (the simulator replays them);
        a consumer's are random, as Kafka's, so one client cannot guess
        another's (the owner check stands behind it)."""
        if replica_id >= 0:
            self._next_fetch_session_id += 1
            while self._next_fetch_session_id in self._fetch_sessions:
                self._next_fetch_session_id += 1
            return self._next_fetch_session_id
        while True:
            session_id = secrets.randbelow(FETCH_SESSION_EPOCH_MAX) + 1
            if session_id not in self._fetch_sessions:
                return session_id

    def _room_for(self, partitions: int) -> bool:
        """Whether a consumer's new session of ``partitions`` may be kept,
        as Kafka's session cache decides: while consumers' sessions are
        fewer than ``fetch_session_cache_slots``, yes; else only by closing
        the smallest one (the least lately used among equals) if it is
        smaller than the new one. Otherwise the fetch goes without (its
        answer says ``session_id`` 0) and the consumer asks again at its
        next fetch: a busy broker keeps the sessions that save the most."""
        consumers = [s for s in self._fetch_sessions.values() if s.replica_id < 0]
        if len(consumers) < self.settings.fetch_session_cache_slots:
            return True
        if not consumers:
            return False  # no slots at all
        smallest = min(consumers, key=lambda s: (len(s.specs), s.last_fetch_ms))
        if len(smallest.specs) >= partitions:
            return False
        self._close_fetch_session(smallest)
        self.fetch_session_evictions += 1
        return True

    def fetch_session_figures(self) -> dict[str, int]:
        """The fetch sessions kept here, for the metrics."""
        consumers = [s for s in self._fetch_sessions.values() if s.replica_id < 0]
        return {"consumer_sessions": len(consumers),
                "consumer_session_partitions": sum(len(s.specs) for s in consumers),
                "follower_sessions": len(self._fetch_sessions) - len(consumers),
                "session_evictions": self.fetch_session_evictions}

    def _forget_in_session(self, session: _LeaderFetchSession, tp: TopicPartition) -> None:
        if session.specs.pop(tp, None) is not None:
            ids = self._fetch_sessions_of[tp]
            ids.discard(session.session_id)
            if not ids:
                del self._fetch_sessions_of[tp]
        session.told.pop(tp, None)
        session.dirty.pop(tp, None)

    def _close_fetch_session(self, session: _LeaderFetchSession) -> None:
        for tp in list(session.specs):
            self._forget_in_session(session, tp)
        self._fetch_sessions.pop(session.session_id, None)
        if session.parked is not None and session.parked in self._parked_fetches:
            self._answer_fetch(self._parked_fetches[session.parked], final=True)

    def _refresh_fetch_sessions(self, now_ms: int) -> None:
        """Before the ISR check: a follower whose session fetched lately and
        whose log ends at this leader's, in a partition its fetches no
        longer name (nothing changed), is as caught up as at that fetch.
        (A leader's record of a follower is reset when the partition
        changes; the follower, whose position did not, does not name it
        again.) Only a follower's live sessions speak for it: opening one
        closes that fetcher's others, and a partition named by one is
        forgotten by the follower's others. Sessions unused for
        FETCH_SESSION_IDLE_MS are closed."""
        for replica_id, (_, until) in list(self._expected_from.items()):
            if until <= now_ms:
                del self._expected_from[replica_id]  # one that stopped fetching
        for session in list(self._fetch_sessions.values()):
            if now_ms - session.last_fetch_ms > FETCH_SESSION_IDLE_MS:
                self._close_fetch_session(session)
                continue
            if session.replica_id < 0:
                continue  # a consumer's: nothing to record
            for tp, spec in session.specs.items():
                part = self.partitions.get(tp)
                if (part is not None and spec.current_leader_epoch == part.leader_epoch
                        and spec.offset == part.log_end_offset):
                    if part.is_leader and part.record_follower_fetch(
                            session.replica_id, spec.offset, session.last_fetch_ms,
                            session.replica_epoch):
                        self._touch(tp)

    def _still_expected(self, replica_id: int, request: FetchRequest, now_ms: int) -> bool:
        """Whether follower ``replica_id`` has yet to name partitions this
        broker came to lead lately (those it names now are crossed off)."""
        expected = self._expected_from.get(replica_id)
        if expected is None:
            return False
        unnamed, until = expected
        for spec in request.specs:
            unnamed.discard(spec.tp)
        if not unnamed or until <= now_ms:
            del self._expected_from[replica_id]
            return False
        return True

    def _brings_enough(self, parked: _ParkedFetch, touched: set[TopicPartition],
                       counted: dict[tuple, int | None] | None = None) -> bool:
        """Whether the partitions of ``touched`` that the waiting fetch
        ``parked`` reads (named, or its session's others) bring it to its
        ``min_bytes``, or fail. Only those are read, so a burst of touches
        one at a time (a thousand ISR answers, metadata changes) costs what
        it touched, not the fetch's partitions each time; bytes found by
        earlier touches count. A partition whose only news is a high
        watermark or log start waits for the fetch's deadline, as before.
        ``counted``: bytes already counted in this pass (``_available``)."""
        by_tp = parked.by_tp
        small, big = (touched, by_tp) if len(touched) <= len(by_tp) else (by_tp, touched)
        specs = [by_tp[tp] for tp in small if tp in big]
        session = parked.session
        if session is not None and session.dirty:
            small, big = ((touched, session.dirty) if len(touched) <= len(session.dirty)
                          else (session.dirty, touched))
            specs += [session.specs[tp] for tp in small
                      if tp in big and tp not in by_tp and tp in session.specs]
        if not specs:
            return False
        request = parked.request
        available = self._available(specs, follower=request.replica_id >= 0,
                                    committed=request.isolation_level == READ_COMMITTED,
                                    counted=counted)
        if available is None:
            return True
        seen = parked.seen_bytes
        for spec, found in zip(specs, available):
            parked.seen_total += found - seen.get(spec.tp, 0)
            if found:
                seen[spec.tp] = found
            else:
                seen.pop(spec.tp, None)
        return parked.seen_total >= request.min_bytes

    def _answer_fetch(self, parked: _ParkedFetch, final: bool) -> bool:
        """Read; answer if there is enough (or ``final``). True if answered."""
        request = parked.request
        session = parked.session
        follower = request.replica_id >= 0
        committed = request.isolation_level == READ_COMMITTED
        # A session's other partitions touched since its last answer are
        # read first, those the byte budget left behind last time leading,
        # and only until the budget is spent: the rest stay dirty, unread,
        # so a fetch costs what it answers, not what its session holds.
        others: list[FetchSpec] = []
        unread: list[TopicPartition] = []
        if session is not None and session.dirty:
            named = {spec.tp for spec in request.specs}
            others = [session.specs[tp] for tp in session.dirty
                      if tp not in named and tp in session.specs]
        read_others, total_bytes, any_error = self._read_all(
            others, request.max_bytes, follower=follower, committed=committed, until_full=True)
        if len(read_others) < len(others):
            unread = [spec.tp for spec in others[len(read_others):]]
            others = others[:len(read_others)]
        read_named, named_bytes, named_error = self._read_all(
            parked.to_read, request.max_bytes - total_bytes, follower=follower,
            committed=committed, first=total_bytes == 0)
        total_bytes += named_bytes
        any_error = any_error or named_error
        if not (final or total_bytes >= request.min_bytes or any_error or parked.answered):
            # What this read found counts towards min_bytes from here on:
            # a later touch adds only what it touched.
            parked.seen_bytes = {spec.tp: len(result["records"])
                                 for spec, result in zip(others + parked.to_read,
                                                         read_others + read_named)
                                 if result["records"]}
            parked.seen_total = total_bytes
            return False
        unread_named = iter(read_named)
        results = [parked.answered[i] if i in parked.answered else next(unread_named)
                   for i in range(len(request.specs))]
        fields = dict(parked.fields)
        if session is not None:
            # Records left behind by the response's byte budget: read again
            # at the next fetch (the fetcher does not know they are there).
            dirty = dict.fromkeys(unread)
            for spec, result in zip(others + parked.to_read, read_others + read_named):
                if (not result["records"] and result["error"] is None
                        and _readable_end(result, follower, committed) > spec.offset):
                    dirty[spec.tp] = None
            session.dirty = dirty
            # A partition named further on than before (a follower naming
            # its new log end after the records it fetched, a consumer its
            # new position) with nothing new since the session last told of
            # it is left out, as Kafka's incremental answers do: the fetcher
            # keeps what it was told, and the session reads it again once it
            # is touched. One named where it was (a fetcher that dropped an
            # answer asks again) is answered.
            told = session.told
            advanced = parked.advanced
            quiet = set()
            for i, result in enumerate(results):
                tp = TopicPartition(result["topic"], result["partition"])
                news = _news(result, follower)
                if (tp in advanced and not result["records"] and result["error"] is None
                        and i not in parked.answered and told.get(tp) == news):
                    quiet.add(i)
                told[tp] = news
            for result in read_others:  # the others: those with news
                tp = TopicPartition(result["topic"], result["partition"])
                told = _news(result, follower)
                if result["records"] or result["error"] is not None or \
                        session.told.get(tp) != told:
                    session.told[tp] = told
                    results.append(result)
            if not follower:
                if request.refusal is not None:
                    for i, result in enumerate(results):
                        error = request.refusal(result["topic"])
                        if error is not None:
                            results[i] = dict(result, records=b"", error=error)
                # A consumer names a partition that failed again once it
                # retries (its leader moved, it was refused): the session
                # keeps only partitions served here, and no name a client
                # makes up outlives the answer that refused it.
                for result in results:
                    if result["error"] is not None:
                        self._forget_in_session(
                            session, TopicPartition(result["topic"], result["partition"]))
            if quiet:
                results = [result for i, result in enumerate(results)
                           if i not in quiet or result["error"] is not None]
            if session.parked == parked.request_id:
                session.parked = None
            fields = {"session_id": session.session_id}
        if self._parked_fetches.pop(parked.request_id, None) is not None:
            self._stop_waiting(parked.request_id, {spec.tp for spec in parked.to_read})
        self._actions.append(Respond(parked.request_id, results, fields))
        return True

    def _follower_arrival(self, replica_id: int, replica_epoch: int, specs: list[FetchSpec],
                          now_ms: int) -> dict[int, dict]:
        """Check each partition of follower ``replica_id``'s fetch against
        this leader's log and record where the follower's log ends (and
        which registration of it said so). Returns the answers already
        decided (errors, diverging epochs) by position."""
        answered: dict[int, dict] = {}
        stale = self._stale_registration(replica_id, replica_epoch)
        serving = self.lifecycle.not_serving_reason() is None
        for i, spec in enumerate(specs):
            try:
                part = self._led(spec.tp, spec.current_leader_epoch, serving)
                if replica_id not in part.replicas or replica_id == part.broker_id:
                    raise NotLeaderOrFollowerError(
                        f"broker {replica_id} is not a follower of {spec.tp} (replicas "
                        f"{part.replicas})")
                if stale:  # a late fetch of an incarnation that registered again since
                    raise StaleBrokerEpochError(
                        f"broker {replica_id} fetches as broker epoch {replica_epoch}, but "
                        f"it has registered again since (epoch "
                        f"{self.image.brokers[replica_id].broker_epoch})")
                diverging = part.diverging_epoch(spec.offset, spec.last_fetched_epoch)
                if diverging is not None:
                    result = empty_fetch_result(spec)
                    result.update(high_watermark=part.high_watermark,
                                  log_start_offset=part.log_start_offset,
                                  log_end_offset=part.log_end_offset,
                                  diverging_epoch={"epoch": diverging[0],
                                                   "end_offset": diverging[1]})
                    answered[i] = result
                    continue
                if part.log_start_offset <= spec.offset <= part.log_end_offset:
                    if part.record_follower_fetch(replica_id, spec.offset, now_ms,
                                                  replica_epoch):
                        self._touch(part.tp)  # commits: acks=all and consumers
                    self._maybe_propose(part, now_ms)
            except Exception as exc:  # noqa: BLE001  each partition answers for itself
                result = empty_fetch_result(spec)
                result["error"] = exc
                answered[i] = result
        return answered

    def _stale_registration(self, replica_id: int, replica_epoch: int) -> bool:
        """Whether a follower's fetch names an older registration than this
        broker's image shows (a previous incarnation's, sent before it died)."""
        registered = self.image.brokers.get(replica_id)
        return (replica_epoch >= 0 and registered is not None
                and registered.broker_epoch > replica_epoch)

    def _available(self, specs: list[FetchSpec], follower: bool, committed: bool,
                   counted: dict[tuple, int | None] | None = None) -> list[int] | None:
        """The bytes each partition of ``specs`` would bring a read now (at
        most its ``max_bytes``), counted from positions without reading the
        records; None if any would fail (the fetch is then answered). A
        parked fetch asks this at every touch of its partitions, so with
        many consumers waiting on a partition it must not read the log.
        ``counted`` keeps each (partition, leader epoch, offset, bound)
        counted, for the other fetches waiting there in the same pass."""
        found = []
        serving = None
        for spec in specs:
            key = (spec.tp, spec.current_leader_epoch, spec.offset, follower, committed)
            count = counted.get(key, -1) if counted is not None else -1
            if count == -1:
                if serving is None:
                    serving = self.lifecycle.not_serving_reason() is None
                try:
                    part = self._led(spec.tp, spec.current_leader_epoch, serving)
                    upper_bound = (part.log_end_offset if follower
                                   else part.last_stable_offset if committed
                                   else part.high_watermark)
                    count = part.log.bytes_between(spec.offset, upper_bound)
                except Exception:  # noqa: BLE001  the read at the answer says what failed
                    count = None
                if counted is not None:
                    counted[key] = count
            if count is None:
                return None
            found.append(min(spec.max_bytes, count))
        return found

    def _read_all(self, specs: list[FetchSpec], max_bytes: int, follower: bool,
                  committed: bool = False, *, until_full: bool = False, first: bool = True
                  ) -> tuple[list[dict], int, bool]:
        """Each partition of ``specs`` read, within ``max_bytes`` in all:
        their results, the bytes read and whether any failed. ``first``: the
        first batch read may exceed the limits (KIP-74). ``until_full``:
        stop once the bytes are spent (the results are then fewer)."""
        results = []
        total_bytes = 0
        any_error = False
        spent = False  # a batch found did not fit what is left: none is read further
        serving = self.lifecycle.not_serving_reason() is None
        for spec in specs:
            if until_full and (spent or total_bytes >= max_bytes):
                break
            tp = spec.tp
            result = None
            try:
                part = self._led(tp, spec.current_leader_epoch, serving)
                log = part.log
                high_watermark = part.high_watermark
                stable = part.last_stable_offset
                start, end = log.log_start_offset, log.log_end_offset
                result = {"topic": tp.topic, "partition": tp.partition, "error": None,
                          "high_watermark": high_watermark, "log_start_offset": start,
                          "log_end_offset": end, "records": b"",
                          "last_stable_offset": stable}
                # Followers read everything the leader has; consumers only
                # what is committed, and read_committed ones only what no
                # open transaction holds back (the LSO).
                upper_bound = end if follower else stable if committed else high_watermark
                budget = min(spec.max_bytes, max_bytes - total_bytes)
                if spec.offset < start or spec.offset > end:
                    raise OffsetOutOfRangeError(spec.offset, start, end)
                if spec.offset < upper_bound and budget > 0 and not spent:
                    # KIP-74: the first batch of the response comes whole even
                    # when larger than the limits, so a consumer always moves.
                    data = log.read(spec.offset, budget, upper_bound,
                                    min_one_batch=first and total_bytes == 0)
                    result["records"] = data
                    total_bytes += len(data)
                    # Records there that did not fit: the answer is full. The
                    # partitions after it are not read (each read would look
                    # up a batch only to find it too big); the session reads
                    # them at the next fetch, and a fetch without one is
                    # asked again by its fetcher.
                    spent = budget < spec.max_bytes and not data
                    if committed:
                        result["aborted_transactions"] = [
                            {"producer_id": txn.producer_id, "first_offset": txn.first_offset}
                            for txn in log.collect_aborted(spec.offset, upper_bound)]
            except Exception as exc:  # noqa: BLE001  each partition answers for itself
                if result is None:  # (one found out of range keeps what it was told)
                    result = empty_fetch_result(spec)
                result["error"] = exc
                any_error = True
            results.append(result)
        return results, total_bytes, any_error

    # -- follower: fetch sessions ----------------------------------------------------------
    def _session_key(self, leader_id: int, tp: TopicPartition) -> tuple[int, int]:
        count = self.settings.num_fetchers
        index = zlib.crc32(f"{tp.topic}\0{tp.partition}".encode()) % count if count > 1 else 0
        return leader_id, index

    def _sync_sessions(self, only: set[TopicPartition] | None) -> None:
        """Give each followed partition to the session of its leader; start
        sessions for new leaders, drop those left with nothing. A session
        whose partitions changed drops its fetch in flight. ``only``: the
        partitions that may have changed (None: every one)."""
        if only is None:
            self._session_key_of = {}
            wanted: dict[tuple[int, int], dict[TopicPartition, int]] = {}
            if self.lifecycle.fetch_ready:
                for tp, part in self.partitions.items():
                    if not part.is_leader and part.leader_id >= 0:
                        key = self._session_key(part.leader_id, tp)
                        wanted.setdefault(key, {})[tp] = part.leader_epoch
                        self._session_key_of[tp] = key
            for key in [k for k in self._sessions if k not in wanted]:
                self._cancel_fetch(self._sessions.pop(key))
            for key, epochs in wanted.items():
                self._set_session(key, epochs)
            return
        ready = self.lifecycle.fetch_ready
        # Per session: partitions removed, added, and in a new leader epoch.
        changes: dict[tuple[int, int], tuple[list, list, list]] = {}
        for tp in only:
            part = self.partitions.get(tp)
            want = None
            if ready and part is not None and not part.is_leader and part.leader_id >= 0:
                want = (self._session_key(part.leader_id, tp), part.leader_epoch)
            old_key = self._session_key_of.get(tp)
            old = None if old_key is None else (old_key, self._sessions[old_key].partitions[tp])
            if want == old:
                continue
            if old_key is not None and (want is None or want[0] != old_key):
                del self._sessions[old_key].partitions[tp]
                del self._session_key_of[tp]
                changes.setdefault(old_key, ([], [], []))[0].append(tp)
            if want is not None:
                key, epoch = want
                session = self._sessions.get(key)
                if session is None:
                    session = self._sessions[key] = _FollowerSession(key)
                session.partitions[tp] = epoch
                self._session_key_of[tp] = key
                changes.setdefault(key, ([], [], []))[2 if key == old_key else 1].append(tp)
        for key, (removed, added, moved) in changes.items():
            session = self._sessions[key]
            if session.partitions:
                self._partitions_changed(session, removed, added, moved)
            else:
                self._cancel_fetch(self._sessions.pop(key))

    def _set_session(self, key: tuple[int, int], epochs: dict[TopicPartition, int]) -> None:
        """The session's partitions become ``epochs`` (a walk of every
        partition; a metadata change goes through ``_partitions_changed``
        with what it changed alone)."""
        session = self._sessions.get(key)
        if session is None:
            session = self._sessions[key] = _FollowerSession(key)
        old = session.partitions
        if epochs == old:
            return
        removed = [tp for tp in old if tp not in epochs]
        added = [tp for tp in epochs if tp not in old]
        moved = [tp for tp, epoch in epochs.items() if tp in old and old[tp] != epoch]
        session.partitions = dict(epochs)
        self._partitions_changed(session, removed, added, moved)

    def _partitions_changed(self, session: _FollowerSession, removed: list, added: list,
                            moved: list) -> None:
        """The session's partitions changed (``session.partitions`` is the
        new set): the change travels in its next incremental fetch (new
        partitions named, dropped ones forgotten), so it costs what changed,
        not the session's size. The fetch out, if any, stays out: its answer
        applies to what it still matches, and a partition it no longer
        matches is named again. Only a partition that comes to this session
        by a change of leader (leader epoch > 0, a failover or a preferred
        leader's return) is fetched at once: the fetch out is dropped and
        the session opened afresh, since acks=all writes to it wait for this
        follower. A log opened by this pass is not such a change (a broker
        opening 10,000 logs after a restart, NEW_LOGS_PER_PASS at a time,
        would drop its every fetch until the last opened): the next fetch
        names it."""
        for tp in removed:
            session.resting.pop(tp, None)
            session.order.pop(tp, None)
        for tp in sorted(added):
            session.order[tp] = None
        session.changed.update(removed, added, moved)
        # A partition whose log left this broker (reassigned away) must not
        # stay in the leader's session: if it came back, with a new and
        # empty log in the same leader epoch, the leader would count this
        # follower at the old log end (its ISR check trusts the session).
        # A new session closes the old one.
        dropped = any(tp not in self.partitions for tp in removed)
        if dropped or (session.in_flight is not None
                       and any(session.partitions[tp] > 0 and tp not in self._new_logs
                               for tp in added)):
            session.backoff_until_ms = 0
            self._cancel_fetch(session)

    def _cancel_fetch(self, session: _FollowerSession) -> None:
        """Drop the fetch out, if any, and the leader's session with it (it
        may have sent what this broker will never apply)."""
        if session.in_flight is not None:
            self._actions.append(CancelRequest(session.in_flight.request_id))
            session.in_flight = None
        session.reset_fetch_session()

    def _followed(self, session: _FollowerSession, tp: TopicPartition) -> Partition | None:
        part = self.partitions.get(tp)
        if (part is None or part.is_leader or part.leader_id != session.leader_id
                or tp not in session.partitions):
            return None
        return part

    def _maybe_fetch(self, session: _FollowerSession, now_ms: int) -> None:
        """Send the session's next fetch, if none is out and any partition
        may be fetched now."""
        if session.in_flight is not None or session.backoff_until_ms > now_ms:
            return
        s = self.settings
        items, sent = [], {}
        if session.fetch_session_epoch == OPEN_SESSION:
            session.told = {}
            looked_at = list(session.order)
        elif len(session.changed) * 8 > len(session.order):
            # In the session's order when many changed (the byte budget's
            # fairness); those that left the session, to be forgotten, last.
            changed = session.changed
            looked_at = [tp for tp in session.order if tp in changed] + \
                [tp for tp in changed if tp not in session.partitions]
        else:
            looked_at = session.changed
        session.changed = set()
        told = session.told
        # Partitions the session drops: resting after an error, or no longer
        # in the session (_set_session); the leader's session forgets them.
        forgotten = []
        for tp in looked_at:
            part = self._followed(session, tp)
            if part is None or session.resting.get(tp, 0) > now_ms:
                if tp in told:
                    if len(forgotten) >= PARTITIONS_PER_REQUEST_MAX:
                        session.changed.add(tp)  # forgotten by the next fetch
                        continue
                    del told[tp]
                    forgotten.append(tp)
                continue
            if part.last_fetched_epoch > part.leader_epoch:
                # Our log is newer than the leader we were told of: wait for
                # the metadata to name a newer one.
                logger.warning("broker %d: %s holds leader epoch %d, newer than leader %d's "
                               "epoch %d; waiting for newer metadata", self.broker_id, tp,
                               part.last_fetched_epoch, session.leader_id, part.leader_epoch)
                self._rest(session, tp, now_ms + PARTITION_BACKOFF_MS * 10)
                continue
            state = (part, part.leader_epoch, part.log_end_offset, part.last_fetched_epoch)
            if told.get(tp) == state:
                continue  # the leader's session has it as it is
            if len(items) >= PARTITIONS_PER_REQUEST_MAX:
                session.changed.add(tp)  # named by the next fetch (of this session)
                continue
            told[tp] = state
            items.append({"topic": tp.topic, "partition": tp.partition,
                          "offset": part.log_end_offset,
                          "current_leader_epoch": part.leader_epoch,
                          "last_fetched_epoch": part.last_fetched_epoch,
                          "max_bytes": s.fetch_partition_bytes_max})
            sent[tp] = state[:3]
        if not told and not forgotten:
            return  # nothing to fetch
        request_id = self.new_request_id()
        timeout_ms = s.fetch_wait_max_ms + FETCH_TIMEOUT_SLACK_MS
        session.in_flight = _FetchInFlight(request_id, sent, now_ms + timeout_ms)
        self._at(now_ms + timeout_ms, "session", session.key)
        self._actions.append(SendFetch(request_id, session.leader_id, {
            "replica_id": self.broker_id, "replica_epoch": self._broker_epoch(),
            "max_wait_ms": s.fetch_wait_max_ms, "min_bytes": 1,
            "max_bytes": s.fetch_response_bytes_max, "partitions": items,
            "session_id": session.fetch_session_id,
            "session_epoch": session.fetch_session_epoch, "fetcher": session.key[1],
            "forgotten": [{"topic": tp.topic, "partition": tp.partition} for tp in forgotten]},
            timeout_ms))

    def _session_of(self, request_id: int) -> _FollowerSession | None:
        for session in self._sessions.values():
            if session.in_flight is not None and session.in_flight.request_id == request_id:
                return session
        return None

    def fetches_to(self, leader_id: int) -> list[int]:
        """Request ids of the follower fetches out to ``leader_id``."""
        return [s.in_flight.request_id for s in self._sessions.values()
                if s.leader_id == leader_id and s.in_flight is not None]

    def fetch_failed(self, request_id: int, now_ms: int) -> None:
        """The leader could not be reached or its answer was unreadable."""
        session = self._session_of(request_id)
        if session is not None:
            self._fetch_failed(session, now_ms)
        self._after_event(now_ms)

    def _fetch_failed(self, session: _FollowerSession, now_ms: int) -> None:
        session.in_flight = None
        session.reset_fetch_session()
        session.backoff_until_ms = now_ms + CONNECT_BACKOFF_MS
        self._at(session.backoff_until_ms, "session", session.key)

    def fetch_answered(self, request_id: int, answer: dict, now_ms: int) -> None:
        """The leader's answer to ``SendFetch`` ``request_id``: apply each
        partition's part that still matches what was asked."""
        session = self._session_of(request_id)
        if session is None:
            return  # cancelled or timed out: nothing of it applies
        sent = session.in_flight.sent
        session.in_flight = None
        error = answer.get("error")
        if isinstance(error, dict) and error.get("code") in FETCH_SESSION_ERRORS:
            logger.info("broker %d: leader %d: %s; opening a new fetch session",
                        self.broker_id, session.leader_id, error.get("message"))
            session.reset_fetch_session()
            self._after_event(now_ms)
            return
        if "error" in answer and "partitions" not in answer:
            error = answer.get("error") or {}
            logger.info("broker %d: leader %d refused the fetch: %s", self.broker_id,
                        session.leader_id, error.get("message", error))
            session.reset_fetch_session()
            for tp in sent:
                self._rest(session, tp, now_ms + PARTITION_BACKOFF_MS)
            self._after_event(now_ms)
            return
        session_id = answer.get("session_id")
        in_session = isinstance(session_id, int) and not isinstance(session_id, bool) \
            and session_id > 0
        if in_session:
            session.fetch_session_id = session_id
            session.fetch_session_epoch = next_fetch_session_epoch(session.fetch_session_epoch)
            told = session.told
        else:  # a leader that keeps no session: every fetch names every partition
            told = dict(sent)
            session.reset_fetch_session()
        served = []
        for result in answer.get("partitions", ()):
            tp = TopicPartition(result.get("topic"), result.get("partition"))
            session.changed.add(tp)
            if result.get("records"):
                served.append(tp)
            expected = told.get(tp)
            part = self._followed(session, tp)
            if part is None:
                continue  # no longer fetched here: the next fetch forgets it
            if expected is None or part is not expected[0] or \
                    (part.leader_epoch, part.log_end_offset) != expected[1:3]:
                # The partition moved on while the fetch was out: the
                # leader's session is told again where it is by the next fetch.
                told.pop(tp, None)
                continue
            try:
                self._apply_fetched(session, part, result, now_ms)
            except LogDirectoryError:
                # Its log dir went offline (said where it failed); the
                # partition is let go once this call returns (logs_offline).
                self._rest(session, tp, now_ms + PARTITION_BACKOFF_MS)
            except Exception:
                logger.exception("broker %d: cannot apply the fetch of %s from leader %d",
                                 self.broker_id, tp, session.leader_id)
                self._rest(session, tp, now_ms + PARTITION_BACKOFF_MS)
            self._touch(tp)
        for tp in served:  # to the back of the line
            if session.order.pop(tp, False) is None:
                session.order[tp] = None
        self._after_event(now_ms)

    def _apply_fetched(self, session: _FollowerSession, part: Partition, result: dict,
                       now_ms: int) -> None:
        error = result.get("error")
        if error:
            self._apply_fetch_error(session, part, error, now_ms)
            return
        diverging = result.get("diverging_epoch")
        if diverging:
            offset = part.truncation_offset(diverging["epoch"], diverging["end_offset"])
            part.truncate_to(offset, f"diverged from leader {session.leader_id}'s epoch "
                                     f"{diverging['epoch']}, which ends at "
                                     f"{diverging['end_offset']}")
            return
        part.append_as_follower(result.get("records") or b"", result["high_watermark"])

    def _apply_fetch_error(self, session: _FollowerSession, part: Partition, error: dict,
                           now_ms: int) -> None:
        code = error.get("code")
        if code == "OFFSET_OUT_OF_RANGE":
            start, end = error.get("log_start_offset", -1), error.get("log_end_offset", -1)
            if 0 <= start and part.log_end_offset < start:
                part.restart_at(start)
                return
            if 0 <= end < part.log_end_offset:
                part.truncate_to(end, f"beyond leader {session.leader_id}'s log end")
                return
        logger.info("broker %d: fetch of %s from leader %d: %s: %s", self.broker_id,
                    part.tp, session.leader_id, code, error.get("message"))
        self._rest(session, part.tp, now_ms + PARTITION_BACKOFF_MS)

    def _broker_epoch(self) -> int:
        """This broker's registration as its fetches name it (-1: none yet)."""
        epoch = self.lifecycle.broker_epoch
        return -1 if epoch is None else epoch

    # -- ISR changes (AlterPartition) ------------------------------------------------------
    def _maybe_propose(self, part: Partition, now_ms: int) -> None:
        """Send the partition's ISR change, if it has one now."""
        broker_epoch = self.lifecycle.broker_epoch
        if broker_epoch is None:
            return
        proposal = part.isr_proposal(now_ms, self.settings.lag_time_max_ms,
                                     self.image.live_broker_epochs())
        if proposal is None:
            return
        request_id = self.new_request_id()
        self._alters[request_id] = _AlterInFlight(part, proposal,
                                                  now_ms + ALTER_PARTITION_TIMEOUT_MS,
                                                  list(part.isr))
        self._at(now_ms + ALTER_PARTITION_TIMEOUT_MS, "alter", request_id)
        self._actions.append(SendAlterPartition(request_id, {
            "broker_id": self.broker_id, "broker_epoch": broker_epoch,
            "topic": proposal.tp.topic, "partition": proposal.tp.partition,
            "leader_epoch": proposal.leader_epoch,
            "partition_epoch": proposal.partition_epoch, "new_isr": proposal.new_isr,
            # KIP-903: the registration each member fetched with, which the
            # controller checks before it adds one.
            "new_isr_broker_epochs": [broker_epoch if r == self.broker_id else epoch for r, epoch
                                      in zip(proposal.new_isr, proposal.broker_epochs)],
            "leader_recovery_state": proposal.leader_recovery_state,
        }, ALTER_PARTITION_TIMEOUT_MS))

    def alter_partitions_answered(
            self, answers: Sequence[tuple[int, dict | None, str | None]], now_ms: int) -> None:
        """The controller's answers, ``(request_id, answer, error_code)``
        (both None: no answer), those of one request together: what waits
        on their partitions is looked at once for all of them."""
        for request_id, answer, error_code in answers:
            alter = self._alters.pop(request_id, None)
            if alter is None:
                continue  # timed out already, or a duplicate
            if error_code is not None:
                logger.info("broker %d: ISR change of %s to %s refused: %s", self.broker_id,
                            alter.proposal.tp, alter.proposal.new_isr, error_code)
            if not isinstance(answer, dict) or not isinstance(answer.get("isr"), list):
                answer = None
            try:
                self._settle_alter(alter, answer, refused=error_code in DEFINITE_REFUSALS)
            except Exception:  # noqa: BLE001  one answer's bug must not hold the others
                logger.exception("broker %d: cannot apply the ISR answer for %s",
                                 self.broker_id, alter.proposal.tp)
        self._after_event(now_ms)

    def alter_partition_answered(self, request_id: int, answer: dict | None,
                                 error_code: str | None, now_ms: int) -> None:
        """One answer alone (``alter_partitions_answered``)."""
        self.alter_partitions_answered([(request_id, answer, error_code)], now_ms)

    def _settle_alter(self, alter: _AlterInFlight, answer: dict | None,
                      refused: bool) -> None:
        part, proposal = alter.part, alter.proposal
        before = list(part.isr)
        done = part.isr_change_done(proposal, answer, refused)
        # The controller took exactly this change, whether its answer or the
        # image showing it came first (the metrics count it either way).
        accepted = (answer is not None and not refused
                    and answer.get("isr") == proposal.new_isr)
        if accepted:
            before, after = alter.isr_before, proposal.new_isr
        elif done:
            after = part.isr
        else:
            return
        shrunk = [r for r in before if r not in after]
        grown = [r for r in after if r not in before]
        if shrunk:
            self.isr_shrinks += 1
            logger.warning("broker %d: ISR of %s shrank from %s to %s (%s)", self.broker_id,
                           part.tp, before, after, proposal.reason)
        if grown:
            self.isr_expands += 1
            logger.info("broker %d: ISR of %s grew from %s to %s (%s)", self.broker_id,
                        part.tp, before, after, proposal.reason)
        self._touch(part.tp)  # the high watermark or acks=all outcomes may move

    # -- inspection --------------------------------------------------------------------------
    def high_watermarks(self) -> dict[TopicPartition, int]:
        return {tp: part.high_watermark for tp, part in self.partitions.items()}

    def check_invariants(self) -> None:
        for part in self.partitions.values():
            part.check_invariants()
        for request_id, parked in self._parked_produces.items():
            assert parked.waiting, f"produce {request_id} parked with nothing to wait for"
        for session in self._sessions.values():
            assert set(session.order) == set(session.partitions), session.leader_id


def _news(result: dict, follower: bool) -> tuple:
    """What a fetch session tells of a partition besides its records (a
    consumer's also its last stable offset): an answer whose news differ
    from the last told carries the partition."""
    if follower:
        return result["high_watermark"], result["log_start_offset"]
    return (result["high_watermark"], result["log_start_offset"],
            result.get("last_stable_offset", -1))


def _readable_end(result: dict, follower: bool, committed: bool) -> int:
    """Where what the fetcher may read of a partition ends: its log end for
    a follower, else its high watermark (a read_committed consumer's: the
    last stable offset)."""
    if follower:
        return result["log_end_offset"]
    return result.get("last_stable_offset", -1) if committed else result["high_watermark"]


def empty_fetch_result(spec: FetchSpec) -> dict:
    """A fetch result with nothing in it (and nothing told of the partition)."""
    return {"topic": spec.tp.topic, "partition": spec.tp.partition, "error": None,
            "high_watermark": -1, "log_start_offset": -1, "log_end_offset": -1,
            "records": b""}


def _fail_write(entry: _PendingAck, exc: Exception) -> None:
    for key in ("base_offset", "log_append_time_ms", "log_start_offset"):
        entry.result.pop(key, None)
    entry.result["error"] = exc
