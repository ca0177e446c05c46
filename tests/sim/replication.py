"""A seeded, deterministic simulation of one partition's replication.

What runs for real: ``api.broker.partition.Partition`` (one per simulated
broker, recreated at every restart), ``storage.epoch_cache.LeaderEpochCache``,
and the controller core ``kraft.controller.Controller`` with its
``kraft.image.MetadataImage``, driven with an injected clock. What is
simulated: the log (``SimLog``, in memory, with a flushed prefix), the
network (a queue of messages that may be delivered in any order, dropped,
delayed or duplicated), the broker shells (registration and heartbeats as in
``api/broker/lifecycle.py``, metadata as in ``ReplicaManager.apply_image``,
the follower fetch loop as in ``api/broker/fetcher.py``, the leader's side of
a follower fetch and the acks=all purgatory as in ``api/broker/data_api.py``,
AlterPartition as in ``api/broker/isr.py``), producers, and crashes. Every
step takes one action chosen by ``random.Random(seed)``; the invariants below
are checked after every step. A failure raises ``SimulationFailure`` naming
the seed, the step and the last events.

Modelled:
  - N brokers (3 or 5), one topic with one partition whose replicas are all
    brokers; ``min.insync.replicas`` = 2 (RF 3) or 3 (RF 5);
    ``unclean.leader.election.enable`` = false; automatic preferred-leader
    elections on.
  - Batches of 1 to 3 records; follower fetches return whole batches, at
    most ``FETCH_BATCHES_MAX`` of them (the fetch size limit).
  - Flushes, a durable high-watermark checkpoint written at random times
    (``replication-offset-checkpoint``), process crashes (kill -9: the page
    cache survives, nothing is lost) and machine crashes (everything above
    the last flush is lost), restarts with a new incarnation id.
  - Recovery as ``Log.open`` does it: the leader-epoch cache is durable
    (written through on every change) and is cut at the recovered log end.
  - Metadata: each broker holds its own image, fed by delayable deliveries
    of the controller's records (after every controller change, on a poll
    timer, and at random, sometimes only a prefix of what is missing), so a
    broker can act on a stale or intermediate image.
  - Leases: heartbeats may be lost, so a live broker can be fenced and its
    leadership moved while it still believes it leads (a zombie leader).
  - ISR changes: AlterPartition requests and answers may be lost, delayed,
    duplicated or refused, and time out after ``ALTER_PARTITION_TIMEOUT_MS``,
    which ``isr.py`` hands to the partition as None ("refused or lost").

Not modelled: retention and DeleteRecords (the log start stays 0), more than
one partition, reassignment, controlled shutdown, unclean elections,
controller failover (the controller never crashes and commits at once),
consumers, producer idempotence and retries (a retried write is a new
write), corruption of flushed data, torn writes, and a truncation being
undone by a machine crash (truncations are durable at once).

**Durability assumption.** Kafka's model, which the product follows, makes
data durable by replication, not fsync: an acknowledged write survives as
long as the replicas that hold it do not all lose it at once. The brief
version of the rule is "a machine crash that loses unflushed bytes is only
allowed while at least one OTHER in-sync replica is up". That is not quite
enough for a controller without KIP-966 (eligible leader replicas): a broker
that lost data stays in the ISR, and stays *live*, until its lease lapses or
it registers again; if every other ISR member is fenced first (a crash, or
a lost heartbeat), the controller keeps the amnesiac broker as the last ISR
member and later elects it cleanly ("last replica standing"), and every
acknowledged write it lost is gone. Kafka before KIP-966 has exactly that
limitation. So the rule enforced here (``Rules.durability == "strict"``) is:
a machine crash of broker b that loses data is allowed only when

  - another member of the controller's ISR is up, and
  - every other broker is up, registered with its current incarnation,
    unfenced, and holds a lease that lasts until its next heartbeat arrives
    (``Simulation._healthy``), and no earlier machine crash is still
    *unresolved*;

and while a machine crash is unresolved (the crashed incarnation's
registration is still unfenced, or it is still in the ISR) no other broker
crashes and the control plane (registrations, heartbeats and their answers)
is reliable: those messages are neither dropped, duplicated nor delayed, are
delivered before the clock moves (which then moves in slices of
``PROTECTED_SLICE_MS``), and a request lost before that began is sent again.
So no healthy broker is fenced before the crashed one, which therefore
leaves the ISR before it can lead. ``Rules.durability == "brief"`` keeps only
the first condition.

**Network.** Every message waits in one queue; a step delivers any message
whose latency has passed, so messages overtake each other freely. Fault
actions drop a message, delay it (up to ``DELAY_MS_MAX``) or duplicate it (a
retried request). One rule keeps this to what TCP and HTTP allow: when a
sender stops waiting for a request (answered, timed out, cancelled) its
undelivered copies are withdrawn, because the product closes the connection
and a request that has not reached the receiver by then never will; and a
crash closes all of the crashed broker's connections. Without that rule an
AlterPartition could be applied seconds after its sender gave up on it and
proposed something else, which no rule on the leader's side can guard
against; and the product's fetch carries no broker epoch (KIP-903) that
would let a leader refuse a fetch sent by a dead incarnation.

**Known open issue** (a product bug the invariants report, not fixable in
``Partition`` alone): fetches and AlterPartition carry no broker epoch
(KIP-903). A leader proposes a follower it has seen caught up; the request
is delayed while that follower loses its data in a machine crash, restarts,
registers and is unfenced; the controller then adds the new incarnation,
which lacks the data, to the ISR (invariant 4; seed 232 with 5 brokers and
3000 steps; about one seed in 1500 of that length, none of the default ones).

Invariants, after every step (``Simulation.check_invariants``):

  1. Single leader: each leader epoch has at most one leader, over the whole
     history: the controller's (every image after every record, NO_LEADER
     included) and every broker whose ``Partition`` acts as leader in that
     epoch (serving or not, stale metadata or not).
  2. Monotonic high watermark: while a broker incarnation leads in one epoch,
     its high watermark never decreases.
  3. Consistent committed data: ``committed`` is the longest prefix any
     *serving* leader (RUNNING, metadata caught up: it can answer clients)
     has had below its high watermark, as ``(leader_epoch, value)`` per
     offset; a serving leader's prefix below its high watermark must extend
     ``committed`` without changing it, and every up replica's records below
     its *own* high watermark must equal ``committed`` there. Not "every
     replica that has the offset": a deposed leader legitimately keeps a
     divergent, never committed suffix until its first fetch truncates it.
  4. Committed data is in the ISR: every broker that is up, is registered in
     the controller's image with its current incarnation, and is in the
     controller's current ISR holds every committed record, identical. (A
     restarted broker that has not registered yet is excluded: the
     controller cannot know it lost data until it registers, which fences
     the old registration and removes it from the ISR.)
  5. No acknowledged write is lost: at the end, after healing (everyone
     restarted, no more faults, run until the ISR holds every replica and
     every replica's log end and high watermark equal the leader's, within a
     bounded number of rounds), every acknowledged record is on the final
     leader at the offset it was acknowledged at, and all replicas' logs are
     identical. Failing to converge is reported too.
  6. ``Partition.check_invariants()`` and the epoch cache's own
     ``check_invariants()`` on every up broker.
"""

from __future__ import annotations

import bisect
import collections
import dataclasses
import random
from collections.abc import Callable

from api.broker.fetcher import CONNECT_BACKOFF_MS, PARTITION_BACKOFF_MS
from api.broker.isr import ALTER_PARTITION_TIMEOUT_MS
from api.broker.lifecycle import RE_REGISTER_CODES, RETRY_BACKOFF_MS, BrokerState
from api.broker.partition import IsrProposal, Partition, Role
from kraft import records as rec
from kraft.controller import Controller, ControllerSettings
from kraft.errors import KraftError
from kraft.image import MetadataImage
from kraft.records import NO_LEADER
from kraft.topic_config import MIN_INSYNC_REPLICAS
from storage.epoch_cache import LeaderEpochCache
from storage.errors import InvalidOffsetError
from storage.log import AppendInfo
from storage.manager import TopicPartition

TOPIC = "sim"
TP = TopicPartition(TOPIC, 0)
CONTROLLER = -1  # the controller's address in the network

# -- timing (ms of simulated time) -------------------------------------------------
SESSION_TIMEOUT_MS = 3000  # broker.session.timeout.ms (short: leases lapse often)
HEARTBEAT_INTERVAL_MS = 1000  # broker.heartbeat.interval.ms
HEARTBEAT_TIMEOUT_MS = SESSION_TIMEOUT_MS // 2  # lifecycle._send_heartbeat's timeout
LAG_TIME_MAX_MS = 2000  # replica.lag.time.max.ms
ISR_CHECK_INTERVAL_MS = LAG_TIME_MAX_MS // 2  # isr.py's expiration loop
FETCH_WAIT_MAX_MS = 500  # replica.fetch.wait.max.ms: how long a leader parks a fetch
FETCH_TIMEOUT_MS = FETCH_WAIT_MAX_MS + 10_000  # fetcher._post's timeout
PRODUCE_TIMEOUT_MS = 30_000  # a produce's timeout_ms: an ack not given by then never is
METADATA_POLL_MS = 1000  # a broker behind the controller asks again this often
PREFERRED_CHECK_INTERVAL_MS = 4000  # leader.imbalance.check.interval
TIME_STEP_MS_MAX = 1500  # one clock advance
PROTECTED_SLICE_MS = 250  # the clock's step while the control plane is kept reliable
LATENCY_MS_MAX = 20  # ordinary network latency
DELAY_MS_MIN, DELAY_MS_MAX = 300, 5000  # a delayed message

# -- limits ----------------------------------------------------------------------------
FETCH_BATCHES_MAX = 4  # batches per fetch answer (replica.fetch.max.bytes)
BATCH_RECORDS_MAX = 3
TRACE_EVENTS_MAX = 30  # events a failure shows
# Healing: rounds of HEAL_TICK_MS, each delivering what is due. Correct runs
# converge within ~110 rounds (a lost fetch waits out FETCH_TIMEOUT_MS); a
# follower looping on diverging answers uses a round's deliveries at once.
HEAL_ROUNDS_MAX = 400
HEAL_TICK_MS = 100
DELIVERIES_PER_HEAL_ROUND_MAX = 200

# Actions and their base weights (the sum need not be 100). Each seed scales
# the fault actions by a factor drawn from SWARM_FACTORS ("swarm testing": a
# seed with no drops but many crashes finds other bugs than the reverse).
ACTIONS = (("deliver", 55), ("produce", 11), ("advance_time", 13), ("drop", 2.5),
           ("duplicate", 1.2), ("delay", 2), ("flush", 4), ("checkpoint", 2.5), ("crash", 0.6),
           ("restart", 2), ("metadata", 2.5))
FAULT_ACTIONS = ("drop", "duplicate", "delay", "crash", "flush", "checkpoint", "metadata")
SWARM_FACTORS = (0, 0.5, 1, 1, 2, 4)

CONTROL_KINDS = ("register", "heartbeat", "register_answer", "heartbeat_answer")
REQUEST_KINDS = ("register", "heartbeat", "alter_partition", "fetch")


class SimulationFailure(AssertionError):
    """An invariant broke. The message names the seed and step, the invariant,
    the details and the last events, and how to replay the run."""


# -- the rules under test, and deliberately broken variants --------------------------
@dataclasses.dataclass(frozen=True)
class Rules:
    """Switches for the checker's own tests. The defaults are the product's
    rules; each False (or "brief") plants one known bug."""

    # (a) A follower answered with diverging_epoch truncates its log.
    follower_truncates_on_divergence: bool = True
    # (b) The leader's high watermark waits for the ISR (else: its log end).
    high_watermark_waits_for_followers: bool = True
    # (c) A follower asks the leader where to truncate (KIP-101), naming its
    # last epoch in every fetch; else it truncates to its own high watermark
    # on every leader change or restart and names no epoch (pre-KIP-101).
    follower_asks_leader: bool = True
    # "strict" or "brief": see the module docstring.
    durability: str = "strict"

    def cli_flag(self) -> str:
        """How ``python -m tests.unit.test_replication_simulation`` names
        these rules (one planted bug at a time)."""
        planted = [flag for flag, on in (
            ("a", not self.follower_truncates_on_divergence),
            ("b", not self.high_watermark_waits_for_followers),
            ("c", not self.follower_asks_leader), ("brief", self.durability == "brief")) if on]
        return f" --rule {planted[0]}" if planted else ""

    def partition_class(self) -> type[Partition]:
        if not self.high_watermark_waits_for_followers:
            return _HighWatermarkIgnoresFollowers
        if not self.follower_asks_leader:
            return _TrustsOwnHighWatermark
        return Partition


class _HighWatermarkIgnoresFollowers(Partition):
    """Broken rule (b): the leader commits whatever it has appended."""

    def maybe_advance_high_watermark(self) -> bool:
        if not self.is_leader or self.log_end_offset <= self.high_watermark:
            return False
        self.high_watermark = self.log_end_offset
        return True


class _TrustsOwnHighWatermark(Partition):
    """Broken rule (c): the pre-KIP-101 follower. It cuts its log at its own
    high watermark whenever it starts following a leader epoch, and fetches
    without naming an epoch, so the leader never checks it."""

    @property
    def last_fetched_epoch(self) -> int:
        return -1

    def update(self, leader, leader_epoch, partition_epoch, replicas, isr, now_ms=0,
               leader_recovery_state=0) -> bool:
        epoch_before = self.leader_epoch
        became_leader = super().update(leader, leader_epoch, partition_epoch, replicas, isr,
                                       now_ms, leader_recovery_state)
        if self.role is Role.FOLLOWER and self.leader_epoch != epoch_before:
            self.log.truncate_to(self.high_watermark)
        return became_leader


# -- the log ------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Batch:
    """Records appended together, stamped with the leader epoch they were
    appended in. Immutable: leaders hand the same objects to followers."""

    base_offset: int
    leader_epoch: int
    values: tuple[str, ...]

    @property
    def next_offset(self) -> int:
        return self.base_offset + len(self.values)

    @property
    def last_offset(self) -> int:
        return self.next_offset - 1


class SimLog:
    """The part of ``storage.log.Log`` that ``Partition`` uses, in memory.

    Invariants: ``batches`` are contiguous from offset 0 (retention is not
    modelled, so the log start is always 0); ``entries[o]`` is the
    ``(leader_epoch, value)`` of offset o; ``0 <= flushed_offset <=
    log_end_offset`` and ``flushed_offset`` is a batch boundary; what is
    below it survives a machine crash.
    """

    def __init__(self) -> None:
        self.log_start_offset = 0
        self.batches: list[Batch] = []
        self._bases: list[int] = []
        self.entries: list[tuple[int, str]] = []
        self.flushed_offset = 0
        # No checkpoint file: every change is "durable" at once, as the real
        # cache's write-through checkpoint is.
        self.epoch_cache = LeaderEpochCache(None)
        # Bumped whenever records are removed from the end (truncation or a
        # crash), so checks of an unchanged prefix can be skipped.
        self.truncations = 0

    # -- what Partition reads ----------------------------------------------------
    @property
    def log_end_offset(self) -> int:
        return len(self.entries)

    @property
    def size_bytes(self) -> int:
        return len(self.entries)

    @property
    def segments(self) -> list["SimLog"]:
        return [self]

    @property
    def latest_epoch(self) -> int:
        return self.epoch_cache.latest_epoch

    def end_offset_for_epoch(self, epoch: int) -> tuple[int, int]:
        return self.epoch_cache.end_offset_for(epoch, self.log_end_offset)

    # -- appends (as Log.append / Log.append_as_follower) ----------------------------
    def append(self, values, leader_epoch: int) -> AppendInfo:
        batch = Batch(self.log_end_offset, leader_epoch, tuple(values))
        self._write(batch)
        if leader_epoch >= 0:  # only once the records are written, as Log.append
            self.epoch_cache.assign(leader_epoch, batch.base_offset)
        return AppendInfo(batch.base_offset, batch.last_offset, 0, len(batch.values),
                          len(batch.values), -1)

    def append_as_follower(self, batches) -> AppendInfo:
        expected = self.log_end_offset
        for batch in batches:
            if batch.base_offset != expected:
                raise InvalidOffsetError(
                    f"follower batch starts at offset {batch.base_offset}, expected {expected}")
            expected = batch.next_offset
        for batch in batches:
            self._write(batch)
        for batch in batches:
            self.epoch_cache.assign(batch.leader_epoch, batch.base_offset)
        count = sum(len(b.values) for b in batches)
        return AppendInfo(batches[0].base_offset, batches[-1].last_offset, 0, count, count, -1)

    def _write(self, batch: Batch) -> None:
        self.batches.append(batch)
        self._bases.append(batch.base_offset)
        self.entries.extend((batch.leader_epoch, value) for value in batch.values)

    # -- reads (as Log.read with an upper bound) ----------------------------------------
    def read(self, offset: int, upper_bound_offset: int, batches_max: int) -> tuple[Batch, ...]:
        """Whole batches from the one holding ``offset``, none reaching
        ``upper_bound_offset``, at most ``batches_max``."""
        assert self.log_start_offset <= offset <= self.log_end_offset
        index = max(bisect.bisect_right(self._bases, offset) - 1, 0)
        out = []
        for batch in self.batches[index:index + batches_max]:
            if batch.last_offset >= upper_bound_offset:
                break
            out.append(batch)
        return tuple(out)

    # -- truncation, flush and crash -------------------------------------------------------
    def truncate_to(self, offset: int) -> None:
        """As ``Log.truncate_to``: the batch holding ``offset`` goes whole."""
        if offset >= self.log_end_offset:
            return
        if offset < self.log_start_offset:
            self.truncate_fully_and_start_at(offset)
            return
        # Cut from the batch holding offset: it goes whole.
        self._cut(bisect.bisect_right(self._bases, offset) - 1)
        self.epoch_cache.truncate_from_end(self.log_end_offset)

    def truncate_fully_and_start_at(self, offset: int) -> None:
        assert offset == 0, "retention is not modelled: the log always starts at 0"
        self._cut(0)
        self.epoch_cache.clear()

    def _cut(self, keep_batches: int) -> None:
        del self.batches[keep_batches:]
        del self._bases[keep_batches:]
        end = self.batches[-1].next_offset if self.batches else 0
        del self.entries[end:]
        self.flushed_offset = min(self.flushed_offset, end)
        self.truncations += 1

    def flush(self) -> None:
        self.flushed_offset = self.log_end_offset

    def crash(self, lose_unflushed: bool) -> int:
        """What the disk holds after a crash, as ``Log.open`` recovers it;
        returns how many records were lost."""
        lost = 0
        if lose_unflushed and self.flushed_offset < self.log_end_offset:
            lost = self.log_end_offset - self.flushed_offset
            self._cut(bisect.bisect_left(self._bases, self.flushed_offset))
        self.epoch_cache.truncate_from_end(self.log_end_offset)
        return lost


# -- messages and pending work ---------------------------------------------------------------
@dataclasses.dataclass
class Message:
    msg_id: int
    kind: str
    src: int
    dst: int
    # The sending and receiving incarnations (None: the controller); a
    # message reaching a later incarnation of a broker is discarded.
    src_incarnation: int | None
    dst_incarnation: int | None
    seq: int  # matches an answer to its request
    body: dict
    deliver_at_ms: int

    def describe(self) -> str:
        return f"{self.kind}#{self.msg_id} {_node_name(self.src)}->{_node_name(self.dst)}"


def _node_name(node: int) -> str:
    return "controller" if node == CONTROLLER else f"b{node}"


@dataclasses.dataclass
class FetchInFlight:
    """A follower's fetch awaiting its answer, with what its partition was
    when it was sent (fetcher._build_request's ``sent``)."""

    seq: int
    leader_id: int
    part: Partition
    leader_epoch: int
    log_end_offset: int
    deadline_ms: int


@dataclasses.dataclass
class ParkedFetch:
    """A follower fetch the leader holds until data arrives (a long-poll)."""

    msg: Message
    deadline_ms: int


@dataclasses.dataclass
class PendingAck:
    """An acks=all write in the purgatory (data_api.PendingAck)."""

    part: Partition
    leader_epoch: int
    required_offset: int
    batch: Batch
    deadline_ms: int


@dataclasses.dataclass
class IsrInFlight:
    proposal: IsrProposal
    part: Partition
    deadline_ms: int


class SimBroker:
    """One broker: durable state (log, high-watermark checkpoint) and the
    state of its current process, which a crash throws away."""

    def __init__(self, broker_id: int) -> None:
        self.broker_id = broker_id
        self.log = SimLog()
        self.hw_checkpoint: int | None = None
        self.up = True
        self.incarnation = 0
        # The broker epoch of the registration that stood for this broker
        # when a machine crash lost its unflushed data, until the controller
        # has fenced it and dropped it from the ISR (_unresolved_crash).
        self.lost_data_broker_epoch: int | None = None
        self.start_process(0)

    def start_process(self, now_ms: int) -> None:
        """What a process start creates (BrokerLifecycle, ReplicaManager,
        fetchers and ISR manager, all empty)."""
        self.image = MetadataImage()
        self.broker_epoch: int | None = None
        self.state = BrokerState.STARTING
        self.metadata_caught_up = False
        self.part: Partition | None = None
        # Registration or heartbeat in flight: (seq, deadline); one at a time.
        self.control_in_flight: tuple[int, int] | None = None
        self.next_control_ms = now_ms
        self.last_heartbeat_ok_ms = now_ms
        # The fetcher: whom it follows in which epoch, its one fetch in
        # flight, and when a resting partition may fetch again.
        self.fetch_target: tuple[int, int] | None = None
        self.fetch_in_flight: FetchInFlight | None = None
        self.resting_until_ms = 0
        # Leader side.
        self.parked: list[ParkedFetch] = []
        self.pending_acks: list[PendingAck] = []
        self.isr_in_flight: dict[int, IsrInFlight] = {}
        self.next_isr_check_ms = now_ms + ISR_CHECK_INTERVAL_MS
        self.next_metadata_poll_ms = now_ms

    @property
    def incarnation_id(self) -> str:
        return f"b{self.broker_id}-i{self.incarnation}"

    @property
    def serving(self) -> bool:
        """DataApi.is_serving: RUNNING and metadata caught up."""
        return self.up and self.state is BrokerState.RUNNING and self.metadata_caught_up

    @property
    def fetch_ready(self) -> bool:
        """ReplicaFetcherManager.is_ready."""
        return self.metadata_caught_up and self.broker_epoch is not None


class _Refused(Exception):
    """A per-partition error answer (the product's typed errors, by code)."""

    def __init__(self, code: str, **extra) -> None:
        super().__init__(code)
        self.code = code
        self.extra = extra

    def as_error(self) -> dict:
        return {"code": self.code, **self.extra}


def _fetch_result(**fields) -> dict:
    result = {"error": None, "high_watermark": -1, "log_start_offset": -1,
              "log_end_offset": -1, "records": (), "diverging_epoch": None}
    result.update(fields)
    return result


def _describe_record(record: rec.Record) -> str:
    fields = {k: v for k, v in dataclasses.asdict(record).items()
              if v is not None and k not in ("topic_id", "endpoints", "rack")}
    return f"{type(record).__name__}{fields}"


# -- the simulation ------------------------------------------------------------------------------
class Simulation:
    def __init__(self, seed: int, broker_count: int = 3, rules: Rules = Rules(),
                 trace: Callable[[str], None] | None = None) -> None:
        self.seed = seed
        self.rng = random.Random(seed)
        self.rules = rules
        self.broker_count = broker_count
        self.min_insync_replicas = 2 if broker_count <= 3 else 3
        self.now_ms = 0
        self.step_no = 0
        self.healing = False
        self.events: collections.deque[str] = collections.deque(maxlen=TRACE_EVENTS_MAX)
        self._trace_sink = trace
        self.action_names = [name for name, _ in ACTIONS]
        self.action_weights = [weight * (self.rng.choice(SWARM_FACTORS)
                                         if name in FAULT_ACTIONS else 1)
                               for name, weight in ACTIONS]
        # The network.
        self.queue: list[Message] = []
        self._ids = 0
        # The controller and its committed metadata log (offset = index).
        settings = ControllerSettings(
            session_timeout_ms=SESSION_TIMEOUT_MS, heartbeat_interval_ms=HEARTBEAT_INTERVAL_MS,
            unclean_leader_election_enable=False, auto_leader_rebalance_enable=True,
            leader_imbalance_check_interval_ms=PREFERRED_CHECK_INTERVAL_MS)
        self.controller = Controller(settings, id_factory=lambda: f"topic-{seed}")
        self.image = MetadataImage()
        self.metadata_log: list[rec.Record] = []
        self.controller.become_active(self.image, self.now_ms)
        self.brokers = [SimBroker(i) for i in range(1, broker_count + 1)]
        # Checker state.
        self.epoch_leaders: dict[int, tuple[int, str]] = {}  # epoch -> (leader, who said)
        self.leader_hw: dict[tuple[int, int, int], int] = {}  # (broker, incarnation, epoch)
        self.committed: list[tuple[int, str]] = []
        self.verified: dict[int, tuple[int, int]] = {}  # broker -> (truncations, prefix ok)
        self.acked: dict[int, tuple[int, str]] = {}  # offset -> (leader_epoch, value)
        self.values_written = 0
        self.heal_rounds: int | None = None
        self.steps_planned = 0
        # What happened, for summaries: actions taken and notable events.
        self.action_counts: collections.Counter[str] = collections.Counter()
        self.event_counts: collections.Counter[str] = collections.Counter()
        self._bootstrap()

    # -- running --------------------------------------------------------------------------------
    def run(self, steps: int) -> None:
        """``steps`` random steps, then heal and check that nothing
        acknowledged was lost."""
        self.steps_planned = steps
        for _ in range(steps):
            self.step()
        self.heal()
        self.check_final()

    def step(self) -> None:
        self.step_no += 1
        action = self.rng.choices(self.action_names, self.action_weights)[0]
        self.action_counts[action] += 1
        getattr(self, f"_act_{action}")()
        self._after_event()
        self.check_invariants()

    def note(self, text: str) -> None:
        line = f"{self.step_no:5d} t={self.now_ms:6d}  {text}"
        self.events.append(line)
        if self._trace_sink is not None:
            self._trace_sink(line)

    def fail(self, invariant: str, details: str) -> None:
        events = "\n".join(f"    {line}" for line in self.events)
        raise SimulationFailure(
            f"replication simulation: seed={self.seed} brokers={self.broker_count} "
            f"step={self.step_no} rules={self.rules}\n"
            f"  invariant broken: {invariant}\n  {details}\n"
            f"  state: {self.describe_state()}\n"
            f"  last {len(self.events)} events:\n{events}\n"
            f"  replay: python -m tests.unit.test_replication_simulation --seed {self.seed} "
            f"--brokers {self.broker_count} --steps {self.steps_planned}"
            f"{self.rules.cli_flag()} --trace")

    def describe_state(self) -> str:
        reg = self.image.partition(TOPIC, 0)
        parts = [f"controller: leader={reg.leader} epoch={reg.leader_epoch} isr={reg.isr} "
                 f"pe={reg.partition_epoch}" if reg else "controller: no partition"]
        for b in self.brokers:
            if not b.up:
                parts.append(f"b{b.broker_id}: DOWN end={b.log.log_end_offset} "
                             f"flushed={b.log.flushed_offset}")
                continue
            p = b.part
            role = (f"{p.role.value} epoch={p.leader_epoch} hw={p.high_watermark} isr={p.isr}"
                    if p else "no partition")
            parts.append(f"b{b.broker_id}: {b.state.value} {role} end={b.log.log_end_offset} "
                         f"flushed={b.log.flushed_offset} epochs={b.log.epoch_cache.entries}")
        return "; ".join(parts)

    # -- bootstrap: brokers registered and unfenced, the topic created ----------------------
    def _bootstrap(self) -> None:
        for b in self.brokers:
            result = self.controller.register_broker(self.image, self._register_body(b),
                                                     self.now_ms)
            self._commit(result.records, f"b{b.broker_id} registers")
            b.broker_epoch = result.response["broker_epoch"]
            b.state = BrokerState.FENCED
        for b in self.brokers:
            self._deliver_metadata_now(b)
            result = self.controller.heartbeat(self.image, self._heartbeat_body(b), self.now_ms)
            self._commit(result.records, f"b{b.broker_id} heartbeats")
            b.state = BrokerState.RUNNING
            b.next_control_ms = self.now_ms + HEARTBEAT_INTERVAL_MS
        result = self.controller.create_topics(self.image, {"topics": [{
            "name": TOPIC, "num_partitions": 1, "replication_factor": self.broker_count,
            "configs": {MIN_INSYNC_REPLICAS: str(self.min_insync_replicas)}}]})
        assert result.response["topics"][0]["error"] is None, result.response
        self._commit(result.records, "topic created")
        for b in self.brokers:
            self._deliver_metadata_now(b)
        self.queue.clear()
        self._after_event()
        self.check_invariants()

    def _deliver_metadata_now(self, b: SimBroker) -> None:
        body = {"records": self._records_after(b.image.offset), "offset": self.image.offset}
        self._on_metadata(b, body)

    # -- actions ------------------------------------------------------------------------------
    def _act_deliver(self) -> None:
        ready = [m for m in self.queue if m.deliver_at_ms <= self.now_ms]
        if not ready:
            if self.queue:
                wait_ms = min(m.deliver_at_ms for m in self.queue) - self.now_ms
                self._advance_time(min(max(1, wait_ms), TIME_STEP_MS_MAX))
            else:
                self._advance_time(self.rng.randint(1, 50))
            return
        msg = self.rng.choice(ready)
        self.queue.remove(msg)
        self._deliver(msg)

    def _act_produce(self) -> None:
        leaders = [b for b in self.brokers if b.serving and b.part and b.part.is_leader]
        if not leaders:
            return
        self._produce(self.rng.choice(leaders), acks_all=self.rng.random() < 0.85)

    def _act_advance_time(self) -> None:
        roll = self.rng.random()
        if roll < 0.7:
            delta_ms = self.rng.randint(1, 100)
        elif roll < 0.95:
            delta_ms = self.rng.randint(100, 600)
        else:
            delta_ms = self.rng.randint(600, TIME_STEP_MS_MAX)
        self._advance_time(delta_ms)

    def _faultable(self) -> list[Message]:
        protected = self._control_plane_protected()
        return [m for m in self.queue if not (protected and m.kind in CONTROL_KINDS)]

    def _act_drop(self) -> None:
        candidates = self._faultable()
        if candidates:
            msg = self.rng.choice(candidates)
            self.queue.remove(msg)
            self.note(f"network drops {msg.describe()}")

    def _act_duplicate(self) -> None:
        candidates = self._faultable()
        if candidates:
            msg = self.rng.choice(candidates)
            self._ids += 1
            copy = dataclasses.replace(msg, msg_id=self._ids)
            self.queue.append(copy)
            self.note(f"network duplicates {msg.describe()} as #{copy.msg_id}")

    def _act_delay(self) -> None:
        candidates = self._faultable()
        if candidates:
            msg = self.rng.choice(candidates)
            msg.deliver_at_ms = self.now_ms + self.rng.randint(DELAY_MS_MIN, DELAY_MS_MAX)
            self.note(f"network delays {msg.describe()} until t={msg.deliver_at_ms}")

    def _act_flush(self) -> None:
        up = [b for b in self.brokers if b.up]
        if up:
            b = self.rng.choice(up)
            b.log.flush()
            self.note(f"b{b.broker_id} flushes its log to {b.log.flushed_offset}")

    def _act_checkpoint(self) -> None:
        hosting = [b for b in self.brokers if b.up and b.part is not None]
        if hosting:
            b = self.rng.choice(hosting)
            b.hw_checkpoint = b.part.high_watermark
            self.note(f"b{b.broker_id} checkpoints high watermark {b.hw_checkpoint}")

    def _act_crash(self) -> None:
        up = [b for b in self.brokers if b.up]
        if not up:
            return
        b = self.rng.choice(up)
        if self.rng.random() < 0.5:
            if self._machine_crash_allowed(b):
                self._crash(b, lose_unflushed=True)
            else:
                self.event_counts["machine crashes not allowed"] += 1
                self.note(f"b{b.broker_id}: a machine crash is not allowed now")
        elif self._process_crash_allowed(b):
            self._crash(b, lose_unflushed=False)

    def _act_restart(self) -> None:
        down = [b for b in self.brokers if not b.up]
        if down:
            self._restart(self.rng.choice(down))

    def _act_metadata(self) -> None:
        up = [b for b in self.brokers if b.up]
        if up:
            self._send_metadata(self.rng.choice(up), partial=self.rng.random() < 0.5)

    # -- the network ------------------------------------------------------------------------------
    def _incarnation_of(self, node: int) -> int | None:
        return None if node == CONTROLLER else self.brokers[node - 1].incarnation

    def _send(self, kind: str, src: int, dst: int, body: dict, seq: int = 0,
              dst_incarnation: int | None = None) -> None:
        """Queue a message; it may be delivered after ordinary latency, in
        any order with the others, unless a fault action gets it first."""
        self._ids += 1
        if dst_incarnation is None:
            dst_incarnation = self._incarnation_of(dst)
        latency_ms = 0 if self.healing else self.rng.randint(0, LATENCY_MS_MAX)
        self.queue.append(Message(self._ids, kind, src, dst, self._incarnation_of(src),
                                  dst_incarnation, seq, body, self.now_ms + latency_ms))

    def _reply(self, request: Message, kind: str, body: dict) -> None:
        """Answer ``request``, to the incarnation that sent it."""
        self._send(kind, request.dst, request.src, body, request.seq, request.src_incarnation)

    def _withdraw(self, b: SimBroker, seq: int) -> None:
        """The sender stopped waiting for request ``seq`` (answered, timed
        out, cancelled): its connection is closed, so a copy not delivered
        yet never will be. Any copy delivered was handled before anything
        the sender sends from now on, as over one TCP connection."""
        self.queue = [m for m in self.queue if not (
            m.src == b.broker_id and m.seq == seq and m.kind in REQUEST_KINDS)]

    def _deliver(self, msg: Message) -> None:
        if msg.dst == CONTROLLER:
            self._controller_receive(msg)
            return
        b = self.brokers[msg.dst - 1]
        if not b.up or b.incarnation != msg.dst_incarnation:
            return  # the process it was sent to is gone
        handler = {"metadata": self._on_metadata_message,
                   "register_answer": self._on_control_answer,
                   "heartbeat_answer": self._on_control_answer,
                   "alter_partition_answer": self._on_alter_partition_answer,
                   "fetch": self._on_fetch,
                   "fetch_answer": self._on_fetch_answer}[msg.kind]
        handler(b, msg)

    def _control_plane_protected(self) -> bool:
        return self.rules.durability == "strict" and any(
            self._unresolved_crash(b) for b in self.brokers)

    def _deliver_control_plane(self) -> None:
        """While a machine crash is unresolved the control plane is perfect:
        registrations, heartbeats and their answers all arrive before the
        clock moves, and a request lost before that began is sent again."""
        for _ in range(10 * self.broker_count):
            for b in self.brokers:
                if b.up and b.control_in_flight is not None and not any(
                        m.seq == b.control_in_flight[0] for m in self.queue
                        if m.kind in CONTROL_KINDS):
                    b.control_in_flight = None
                    b.next_control_ms = self.now_ms
                    self._control_tick(b)
            pending = [m for m in self.queue if m.kind in CONTROL_KINDS]
            if not pending:
                return
            for msg in pending:
                if msg in self.queue:  # an answer before it may have withdrawn it
                    self.queue.remove(msg)
                    self._deliver(msg)
            self._after_event()

    # -- the controller ---------------------------------------------------------------------------
    def _controller_receive(self, msg: Message) -> None:
        """The controller shell: call the core, commit its records as one
        batch, answer the sender's incarnation."""
        method = {"register": self.controller.register_broker,
                  "heartbeat": self.controller.heartbeat,
                  "alter_partition": self.controller.alter_partition}[msg.kind]
        try:
            if msg.kind == "alter_partition":
                result = method(self.image, msg.body)
            else:
                result = method(self.image, msg.body, self.now_ms)
        except KraftError as exc:
            answer = {"error": exc.code}
        else:
            self._commit(result.records, f"{msg.kind} of b{msg.src}")
            answer = {"answer": result.response}
        self._reply(msg, f"{msg.kind}_answer", answer)

    def _commit(self, records: list[rec.Record], why: str) -> None:
        for record in records:
            offset = self.image.offset + 1
            self.image.apply(record, offset)
            assert offset == len(self.metadata_log)
            self.metadata_log.append(record)
            self.note(f"controller commits @{offset} ({why}): {_describe_record(record)}")
            if isinstance(record, rec.PartitionChangeRecord):
                self.event_counts["leader changes" if record.leader is not None
                                  else "isr changes"] += 1
            reg = self.image.partition(TOPIC, 0)
            if reg is not None:
                self._claim_epoch(reg.leader_epoch, reg.leader, "the controller")
        if records:
            for b in self.brokers:
                if b.up:
                    self._send_metadata(b)

    def _records_after(self, offset: int) -> list[tuple[int, rec.Record]]:
        return [(o, self.metadata_log[o]) for o in range(offset + 1, len(self.metadata_log))]

    def _send_metadata(self, b: SimBroker, partial: bool = False) -> None:
        records = self._records_after(b.image.offset)
        if partial and len(records) > 1:
            records = records[:self.rng.randint(1, len(records) - 1)]
        self._send("metadata", CONTROLLER, b.broker_id,
                   {"records": records, "offset": self.image.offset})

    # -- broker: registration and heartbeats (lifecycle.py) -----------------------------------
    def _register_body(self, b: SimBroker) -> dict:
        return {"broker_id": b.broker_id, "incarnation_id": b.incarnation_id,
                "endpoints": {"BROKER": f"127.0.0.1:{9000 + b.broker_id}"}, "rack": None}

    def _heartbeat_body(self, b: SimBroker) -> dict:
        return {"broker_id": b.broker_id, "broker_epoch": b.broker_epoch,
                "metadata_offset": b.image.offset, "want_fence": False,
                "want_shutdown": False}

    def _control_tick(self, b: SimBroker) -> None:
        """BrokerLifecycle._heartbeat_loop: register until registered, then
        heartbeat every interval; one request at a time."""
        if b.control_in_flight is not None or self.now_ms < b.next_control_ms:
            return
        self._ids += 1
        seq = self._ids
        if b.broker_epoch is None:
            kind, body, timeout_ms = "register", self._register_body(b), SESSION_TIMEOUT_MS
        else:
            kind, body, timeout_ms = "heartbeat", self._heartbeat_body(b), HEARTBEAT_TIMEOUT_MS
        b.control_in_flight = (seq, self.now_ms + timeout_ms)
        self._send(kind, b.broker_id, CONTROLLER, body, seq)

    def _on_control_answer(self, b: SimBroker, msg: Message) -> None:
        if b.control_in_flight is None or b.control_in_flight[0] != msg.seq:
            return  # an answer to a request given up on
        b.control_in_flight = None
        self._withdraw(b, msg.seq)
        if "error" in msg.body:
            self.note(f"b{b.broker_id}: {msg.kind} refused: {msg.body['error']}")
            if msg.kind == "heartbeat_answer" and msg.body["error"] in RE_REGISTER_CODES:
                b.broker_epoch = None
                b.state = BrokerState.STARTING
                b.next_control_ms = self.now_ms
            else:
                self._control_failed(b)
            return
        answer = msg.body["answer"]
        if msg.kind == "register_answer":
            b.broker_epoch = answer["broker_epoch"]
            b.state = BrokerState.FENCED
            b.next_control_ms = self.now_ms  # heartbeat at once
            self.note(f"b{b.broker_id} registered with broker epoch {b.broker_epoch}")
            return
        b.last_heartbeat_ok_ms = self.now_ms
        state = BrokerState.FENCED if answer["is_fenced"] else BrokerState.RUNNING
        if state is not b.state:
            self.note(f"b{b.broker_id}: {b.state.value} -> {state.value}")
        b.state = state
        b.next_control_ms = self.now_ms + HEARTBEAT_INTERVAL_MS

    def _control_failed(self, b: SimBroker) -> None:
        b.next_control_ms = self.now_ms + min(HEARTBEAT_INTERVAL_MS, RETRY_BACKOFF_MS)
        if (b.state is BrokerState.RUNNING
                and self.now_ms - b.last_heartbeat_ok_ms > SESSION_TIMEOUT_MS):
            self.note(f"b{b.broker_id}: no heartbeat got through for a session; fences itself")
            b.state = BrokerState.FENCED

    # -- broker: metadata (lifecycle._apply, ReplicaManager.apply_image, fetchers.sync) -----------
    def _on_metadata_message(self, b: SimBroker, msg: Message) -> None:
        self._on_metadata(b, msg.body)

    def _on_metadata(self, b: SimBroker, body: dict) -> None:
        before = b.image.offset
        for offset, record in body["records"]:
            if offset <= b.image.offset:
                continue  # already applied
            assert offset == b.image.offset + 1, (offset, b.image.offset)
            b.image.apply(record, offset)
        was_caught_up = b.metadata_caught_up
        b.metadata_caught_up = (b.broker_epoch is not None
                                and b.image.offset >= max(b.broker_epoch, body["offset"]))
        if b.image.offset == before and (was_caught_up or not b.metadata_caught_up):
            return
        if (b.state is BrokerState.FENCED and b.broker_epoch is not None
                and b.image.offset >= b.broker_epoch):
            b.next_control_ms = min(b.next_control_ms, self.now_ms)  # ask to be unfenced
        self._apply_image(b)
        self._sync_fetcher(b)

    def _apply_image(self, b: SimBroker) -> None:
        """ReplicaManager.apply_image for the one partition: the log is
        opened even for a replayed image, but a role is taken only from one
        the broker has caught up to."""
        topic = b.image.topics.get(TOPIC)
        reg = topic.partitions.get(0) if topic else None
        if reg is None or b.broker_id not in reg.replicas:
            return
        if b.part is None:
            b.part = self.rules.partition_class()(TP, b.log, b.broker_id, topic.topic_id,
                                                  high_watermark=b.hw_checkpoint)
        part = b.part
        part.min_insync_replicas = int(b.image.topic_configs(TOPIC).get(MIN_INSYNC_REPLICAS, 1))
        if not b.metadata_caught_up:
            return
        before = (part.role, part.leader_epoch, part.partition_epoch)
        part.update(reg.leader, reg.leader_epoch, reg.partition_epoch, reg.replicas, reg.isr,
                    self.now_ms, reg.leader_recovery_state)
        if (part.role, part.leader_epoch, part.partition_epoch) != before:
            self.note(f"b{b.broker_id} applies image @{b.image.offset}: {part.role.value} "
                      f"epoch={part.leader_epoch} pe={part.partition_epoch} isr={part.isr} "
                      f"hw={part.high_watermark} end={part.log_end_offset}")

    def _sync_fetcher(self, b: SimBroker) -> None:
        """ReplicaFetcherManager.sync + ReplicaFetcher.assign: follow the
        partition's leader in its epoch; any change cancels the fetch in
        flight (its answer, if it comes, is ignored)."""
        part = b.part
        wanted = None
        if b.fetch_ready and part is not None and not part.is_leader and part.leader_id >= 0:
            wanted = (part.leader_id, part.leader_epoch)
        if wanted == b.fetch_target:
            return
        if b.fetch_target is None or wanted is None or wanted[0] != b.fetch_target[0]:
            b.resting_until_ms = 0  # a new fetcher starts with nothing resting
        b.fetch_target = wanted
        if b.fetch_in_flight is not None:
            self._withdraw(b, b.fetch_in_flight.seq)
            b.fetch_in_flight = None

    # -- broker as follower (fetcher.py) ----------------------------------------------------------
    def _maybe_fetch(self, b: SimBroker) -> None:
        """ReplicaFetcher._build_request and the send."""
        part = b.part
        if (b.fetch_target is None or b.fetch_in_flight is not None or part is None
                or part.is_leader or part.leader_id != b.fetch_target[0]
                or b.resting_until_ms > self.now_ms):
            return
        if part.last_fetched_epoch > part.leader_epoch:
            # Our log is newer than the leader we were told of: wait for the
            # metadata to name a newer one.
            b.resting_until_ms = self.now_ms + PARTITION_BACKOFF_MS * 10
            return
        leader = self.brokers[part.leader_id - 1]
        if not leader.up:
            b.resting_until_ms = self.now_ms + CONNECT_BACKOFF_MS  # connection refused
            return
        self._ids += 1
        b.fetch_in_flight = FetchInFlight(self._ids, part.leader_id, part, part.leader_epoch,
                                          part.log_end_offset, self.now_ms + FETCH_TIMEOUT_MS)
        self._send("fetch", b.broker_id, part.leader_id, {
            "replica_id": b.broker_id, "offset": part.log_end_offset,
            "current_leader_epoch": part.leader_epoch,
            "last_fetched_epoch": part.last_fetched_epoch}, self._ids)

    def _on_fetch_answer(self, b: SimBroker, msg: Message) -> None:
        """ReplicaFetcher._handle_answer for the one partition."""
        sent = b.fetch_in_flight
        if sent is None or sent.seq != msg.seq:
            return  # cancelled, timed out or duplicated: nothing of it applies
        b.fetch_in_flight = None
        self._withdraw(b, msg.seq)
        part = b.part
        if part is not sent.part or part.is_leader or part.leader_id != sent.leader_id:
            return
        if (part.leader_epoch, part.log_end_offset) != (sent.leader_epoch, sent.log_end_offset):
            return  # the partition moved on while the fetch was out
        try:
            self._apply_fetch(b, part, msg.body)
        except InvalidOffsetError as exc:
            self.event_counts["unappliable fetch answers"] += 1
            self.note(f"b{b.broker_id} cannot apply the fetch: {exc}")
            b.resting_until_ms = self.now_ms + PARTITION_BACKOFF_MS

    def _apply_fetch(self, b: SimBroker, part: Partition, result: dict) -> None:
        """ReplicaFetcher._apply."""
        if result["error"]:
            self._apply_fetch_error(b, part, result["error"])
            return
        diverging = result["diverging_epoch"]
        if diverging:
            if not self.rules.follower_truncates_on_divergence:
                return  # broken rule (a)
            offset = part.truncation_offset(diverging["epoch"], diverging["end_offset"])
            end = part.log_end_offset
            part.truncate_to(offset, f"diverged from b{part.leader_id}")
            self.event_counts["diverging answers"] += 1
            if part.log_end_offset < end:
                self.event_counts["follower truncations"] += 1
            self.note(f"b{b.broker_id} told epoch {diverging['epoch']} ends at "
                      f"{diverging['end_offset']}: truncates {end} -> {part.log_end_offset}")
            return
        records = result["records"]
        part.append_as_follower(records, result["high_watermark"])
        if records:
            self.note(f"b{b.broker_id} appends [{records[0].base_offset}, "
                      f"{records[-1].next_offset}) from b{part.leader_id}, hw -> "
                      f"{part.high_watermark}")

    def _apply_fetch_error(self, b: SimBroker, part: Partition, error: dict) -> None:
        """ReplicaFetcher._apply_error."""
        if error["code"] == "OFFSET_OUT_OF_RANGE":
            start, end = error.get("log_start_offset", -1), error.get("log_end_offset", -1)
            if 0 <= start and part.log_end_offset < start:
                part.restart_at(start)
                return
            if 0 <= end < part.log_end_offset:
                part.truncate_to(end, "beyond the leader's log end")
                self.note(f"b{b.broker_id} truncates to the leader's log end {end}")
                return
        b.resting_until_ms = self.now_ms + PARTITION_BACKOFF_MS

    # -- broker as leader (data_api.py) ---------------------------------------------------------
    def _serving_partition(self, b: SimBroker, current_leader_epoch: int | None) -> Partition:
        """DataApi._serving_partition + ReplicaManager.leader_partition."""
        if not b.serving:
            raise _Refused("NOT_LEADER_OR_FOLLOWER")
        part = b.part
        if part is None or not part.is_leader:
            raise _Refused("NOT_LEADER_OR_FOLLOWER")
        if current_leader_epoch is not None and current_leader_epoch >= 0:
            if current_leader_epoch < part.leader_epoch:
                raise _Refused("FENCED_LEADER_EPOCH")
            if current_leader_epoch > part.leader_epoch:
                raise _Refused("UNKNOWN_LEADER_EPOCH")
        return part

    def _on_fetch(self, leader: SimBroker, msg: Message) -> None:
        """DataApi.handle_fetch for a follower: judged on arrival, then read;
        parked (a long-poll) while there is nothing to send."""
        answer = self._follower_arrival(leader, msg.body)
        if answer is None:
            answer = self._read_for_follower(leader, msg.body)
            if not answer["records"] and answer["error"] is None:
                leader.parked.append(ParkedFetch(msg, self.now_ms + FETCH_WAIT_MAX_MS))
                return
        self._answer_fetch(leader, msg, answer)

    def _answer_fetch(self, leader: SimBroker, msg: Message, answer: dict) -> None:
        self._reply(msg, "fetch_answer", answer)

    def _follower_arrival(self, leader: SimBroker, spec: dict) -> dict | None:
        """DataApi._follower_arrival for the one partition: an answer already
        decided (error, diverging epoch), or None to read."""
        try:
            part = self._serving_partition(leader, spec["current_leader_epoch"])
            replica_id = spec["replica_id"]
            if replica_id not in part.replicas or replica_id == part.broker_id:
                raise _Refused("NOT_LEADER_OR_FOLLOWER")
            diverging = part.diverging_epoch(spec["offset"], spec["last_fetched_epoch"])
            if diverging is not None:
                return _fetch_result(high_watermark=part.high_watermark,
                                     log_start_offset=part.log_start_offset,
                                     log_end_offset=part.log_end_offset,
                                     diverging_epoch={"epoch": diverging[0],
                                                      "end_offset": diverging[1]})
            if part.log_start_offset <= spec["offset"] <= part.log_end_offset:
                part.record_follower_fetch(replica_id, spec["offset"], self.now_ms)
                self._maybe_propose_isr(leader)  # DataApi.follower_fetched
            return None
        except _Refused as exc:
            return _fetch_result(error=exc.as_error())

    def _read_for_follower(self, leader: SimBroker, spec: dict) -> dict:
        """DataApi._read_all(follower=True) for the one partition."""
        try:
            part = self._serving_partition(leader, spec["current_leader_epoch"])
            result = _fetch_result(high_watermark=part.high_watermark,
                                   log_start_offset=part.log_start_offset,
                                   log_end_offset=part.log_end_offset)
            offset = spec["offset"]
            if offset < part.log_start_offset or offset > part.log_end_offset:
                raise _Refused("OFFSET_OUT_OF_RANGE", log_start_offset=part.log_start_offset,
                               log_end_offset=part.log_end_offset)
            if offset < part.log_end_offset:
                result["records"] = part.log.read(offset, part.log_end_offset,
                                                  FETCH_BATCHES_MAX)
            return result
        except _Refused as exc:
            return _fetch_result(error=exc.as_error())

    def _retry_parked(self, leader: SimBroker, timed_out_only: bool = False) -> None:
        """A parked fetch wakes on new data or a role change (notify), or at
        its deadline, and is read again."""
        still = []
        for parked in leader.parked:
            due = parked.deadline_ms <= self.now_ms
            if timed_out_only and not due:
                still.append(parked)
                continue
            answer = self._read_for_follower(leader, parked.msg.body)
            if answer["records"] or answer["error"] is not None or due:
                self._answer_fetch(leader, parked.msg, answer)
            else:
                still.append(parked)
        leader.parked = still

    def _maybe_propose_isr(self, b: SimBroker) -> None:
        """IsrManager.maybe_propose + _send."""
        if b.broker_epoch is None or b.part is None:
            return
        proposal = b.part.isr_proposal(self.now_ms, LAG_TIME_MAX_MS)
        if proposal is None:
            return
        self._ids += 1
        b.isr_in_flight[self._ids] = IsrInFlight(proposal, b.part,
                                                 self.now_ms + ALTER_PARTITION_TIMEOUT_MS)
        self.note(f"b{b.broker_id} proposes ISR {proposal.new_isr} ({proposal.reason})")
        self._send("alter_partition", b.broker_id, CONTROLLER, {
            "broker_id": b.broker_id, "broker_epoch": b.broker_epoch, "topic": TOPIC,
            "partition": 0, "leader_epoch": proposal.leader_epoch,
            "partition_epoch": proposal.partition_epoch, "new_isr": proposal.new_isr,
            "leader_recovery_state": proposal.leader_recovery_state}, self._ids)

    def _on_alter_partition_answer(self, b: SimBroker, msg: Message) -> None:
        pending = b.isr_in_flight.pop(msg.seq, None)
        if pending is None:
            return  # timed out already (settled as refused) or a duplicate
        self._withdraw(b, msg.seq)
        answer = msg.body.get("answer")
        self._settle_isr(b, pending, answer, msg.body.get("error"))

    def _settle_isr(self, b: SimBroker, pending: IsrInFlight, answer: dict | None,
                    error: str | None) -> None:
        """IsrManager._settle."""
        applied = pending.part.isr_change_done(pending.proposal, answer)
        self.event_counts["isr answers applied" if applied else "isr answers not applied"] += 1
        self.note(f"b{b.broker_id}: ISR {pending.proposal.new_isr} "
                  f"{'applied' if applied else 'not applied'}"
                  f"{f' ({error})' if error else ''}")

    # -- clients: produce and the acks=all purgatory ---------------------------------------------
    def _produce(self, b: SimBroker, acks_all: bool) -> None:
        part = b.part
        if acks_all and len(part.isr) < part.min_insync_replicas:
            self.note(f"b{b.broker_id} refuses an acks=all write: ISR {part.isr}")
            return
        count = self.rng.randint(1, BATCH_RECORDS_MAX)
        values = [f"v{self.values_written + i}" for i in range(count)]
        self.values_written += count
        info = part.append_as_leader(values)
        batch = b.log.batches[-1]
        assert batch.base_offset == info.base_offset
        self.note(f"b{b.broker_id} appends {values} at {info.base_offset} in epoch "
                  f"{part.leader_epoch} (acks={'all' if acks_all else 1})")
        if acks_all:
            b.pending_acks.append(PendingAck(part, part.leader_epoch, info.last_offset + 1,
                                             batch, self.now_ms + PRODUCE_TIMEOUT_MS))

    def _settle_acks(self, b: SimBroker) -> None:
        """DataApi._replication_outcome for every waiting write."""
        waiting = []
        for entry in b.pending_acks:
            part = entry.part
            if b.part is not part or not part.is_leader or part.leader_epoch != entry.leader_epoch:
                continue  # NOT_LEADER_OR_FOLLOWER: not acknowledged
            if part.high_watermark < entry.required_offset:
                if entry.deadline_ms > self.now_ms:
                    waiting.append(entry)
                continue
            if len(part.isr) < part.min_insync_replicas:
                continue  # NOT_ENOUGH_REPLICAS_AFTER_APPEND
            self._acknowledge(b, entry.batch)
            self.event_counts["acks=all writes acknowledged"] += 1
        b.pending_acks = waiting

    def _acknowledge(self, b: SimBroker, batch: Batch) -> None:
        for i, value in enumerate(batch.values):
            offset = batch.base_offset + i
            record = (batch.leader_epoch, value)
            if self.acked.setdefault(offset, record) != record:
                self.fail("5 (acknowledged writes)",
                          f"offset {offset} acknowledged twice: {self.acked[offset]} and "
                          f"{record}")
        self.note(f"b{b.broker_id} acknowledges {list(batch.values)} at {batch.base_offset}")

    # -- time ------------------------------------------------------------------------------------
    def _advance_time(self, delta_ms: int) -> None:
        """Move the clock; the controller ticks and every broker's timers
        fire (heartbeats, timeouts, long-poll deadlines, ISR checks). While
        the control plane is kept reliable the clock moves in slices, each
        after every control message has arrived."""
        while delta_ms > 0:
            slice_ms = delta_ms
            if self._control_plane_protected():
                self._deliver_control_plane()
                slice_ms = min(delta_ms, PROTECTED_SLICE_MS)
            self.now_ms += slice_ms
            delta_ms -= slice_ms
            self._commit(self.controller.tick(self.image, self.now_ms), "tick")
            for b in self.brokers:
                if b.up:
                    self._run_timers(b)

    def _run_timers(self, b: SimBroker) -> None:
        now = self.now_ms
        if b.control_in_flight is not None and b.control_in_flight[1] <= now:
            self._withdraw(b, b.control_in_flight[0])
            b.control_in_flight = None
            self._control_failed(b)
        self._control_tick(b)
        if b.fetch_in_flight is not None and b.fetch_in_flight.deadline_ms <= now:
            self._withdraw(b, b.fetch_in_flight.seq)
            b.fetch_in_flight = None
            b.resting_until_ms = now + CONNECT_BACKOFF_MS
        self._retry_parked(b, timed_out_only=True)
        for seq, pending in list(b.isr_in_flight.items()):
            if pending.deadline_ms <= now:
                del b.isr_in_flight[seq]
                self._withdraw(b, seq)
                self._settle_isr(b, pending, None, "timed out")
        if now >= b.next_isr_check_ms:
            b.next_isr_check_ms = now + ISR_CHECK_INTERVAL_MS
            if b.part is not None and b.part.is_leader:
                self._maybe_propose_isr(b)
        if now >= b.next_metadata_poll_ms:
            b.next_metadata_poll_ms = now + METADATA_POLL_MS
            if b.image.offset < self.image.offset:
                self._send_metadata(b)

    def _after_event(self) -> None:
        """What the brokers' event loops do at once after any event: answer
        woken long-polls, send the next fetch, settle acks, heartbeat when
        asked to."""
        for b in self.brokers:
            if b.up:
                self._control_tick(b)
                self._retry_parked(b)
                self._maybe_fetch(b)
                self._settle_acks(b)

    # -- crashes and restarts ---------------------------------------------------------------------
    def _unresolved_crash(self, b: SimBroker) -> bool:
        """Whether b lost data in a machine crash and the controller may
        still count that incarnation: its registration unfenced, or in the ISR."""
        if b.lost_data_broker_epoch is None:
            return False
        reg = self.image.brokers.get(b.broker_id)
        part = self.image.partition(TOPIC, 0)
        if reg is not None and reg.broker_epoch == b.lost_data_broker_epoch and (
                not reg.fenced or b.broker_id in part.isr):
            return True
        b.lost_data_broker_epoch = None
        return False

    def _healthy(self, b: SimBroker) -> bool:
        """Up, registered with this incarnation, unfenced, and with a lease
        that lasts until its next heartbeat surely arrives (the next one is
        due within a heartbeat interval, plus one clock slice)."""
        reg = self.image.brokers.get(b.broker_id)
        expiry_ms = self.controller.lease_expiry_ms(b.broker_id)
        return (b.up and reg is not None and reg.incarnation_id == b.incarnation_id
                and not reg.fenced and expiry_ms is not None
                and expiry_ms - self.now_ms > HEARTBEAT_INTERVAL_MS + PROTECTED_SLICE_MS)

    def _machine_crash_allowed(self, b: SimBroker) -> bool:
        """The durability assumption (module docstring)."""
        isr = self.image.partition(TOPIC, 0).isr
        if not any(x != b.broker_id and self.brokers[x - 1].up for x in isr):
            return False
        if self.rules.durability == "brief":
            return True
        if any(self._unresolved_crash(o) for o in self.brokers):
            return False
        return all(self._healthy(o) for o in self.brokers if o is not b)

    def _process_crash_allowed(self, b: SimBroker) -> bool:
        if self.rules.durability == "brief":
            return True
        return not any(self._unresolved_crash(o) for o in self.brokers if o is not b)

    def _crash(self, b: SimBroker, lose_unflushed: bool) -> None:
        epoch_at_crash = b.broker_epoch
        lost = b.log.crash(lose_unflushed)
        self.event_counts["machine crashes" if lose_unflushed else "process crashes"] += 1
        self.event_counts["records lost in crashes"] += lost
        b.up = False
        b.part = None
        if lose_unflushed and lost:
            # The disk lost data: whichever registration of this broker the
            # controller still counts (perhaps a previous incarnation's, if
            # this one had not registered yet) now stands for less data.
            reg = self.image.brokers.get(b.broker_id)
            if reg is not None:
                b.lost_data_broker_epoch = reg.broker_epoch
        self.note(f"b{b.broker_id} {'MACHINE' if lose_unflushed else 'process'} crash "
                  f"(broker epoch {epoch_at_crash}): lost {lost} records, log ends at "
                  f"{b.log.log_end_offset}, epochs {b.log.epoch_cache.entries}")
        # Its connections close: nothing it sent is delivered any more, and
        # nothing sent to it.
        self.queue = [m for m in self.queue
                      if m.src != b.broker_id and m.dst != b.broker_id]
        for other in self.brokers:
            if other.up and other.fetch_in_flight and other.fetch_in_flight.leader_id == \
                    b.broker_id:
                other.fetch_in_flight = None
                other.resting_until_ms = self.now_ms + CONNECT_BACKOFF_MS
            other.parked = [p for p in other.parked if p.msg.src != b.broker_id]

    def _restart(self, b: SimBroker) -> None:
        b.up = True
        b.incarnation += 1
        b.start_process(self.now_ms)
        self.note(f"b{b.broker_id} restarts as {b.incarnation_id} (log end "
                  f"{b.log.log_end_offset}, checkpointed hw {b.hw_checkpoint})")
        self._send_metadata(b)

    # -- invariants -------------------------------------------------------------------------------
    def _claim_epoch(self, epoch: int, leader: int, who: str) -> None:
        known = self.epoch_leaders.setdefault(epoch, (leader, who))
        if known[0] != leader:
            self.fail("1 (single leader per epoch)",
                      f"epoch {epoch}: leader {known[0]} (per {known[1]}) and {leader} "
                      f"(per {who})")

    def check_invariants(self) -> None:
        for b in self.brokers:
            if not b.up or b.part is None:
                continue
            part = b.part
            try:
                part.check_invariants()
                b.log.epoch_cache.check_invariants()
            except AssertionError as exc:
                self.fail("6 (Partition.check_invariants)", f"b{b.broker_id}: {exc}")
            if part.is_leader:
                self._check_leader(b, part)
        for b in self.brokers:
            if b.up and b.part is not None:
                self._check_committed_prefix(b, b.part.high_watermark, "3 (consistent "
                                             "committed data)", "below its high watermark")
        self._check_isr_holds_committed()

    def _check_leader(self, b: SimBroker, part: Partition) -> None:
        self._claim_epoch(part.leader_epoch, b.broker_id, f"b{b.broker_id}'s partition")
        key = (b.broker_id, b.incarnation, part.leader_epoch)
        previous = self.leader_hw.get(key, -1)
        if part.high_watermark < previous:
            self.fail("2 (monotonic high watermark)",
                      f"b{b.broker_id} leading epoch {part.leader_epoch}: high watermark "
                      f"{previous} -> {part.high_watermark}")
        self.leader_hw[key] = part.high_watermark
        if not b.serving:
            return
        hw = part.high_watermark
        self._check_committed_prefix(b, hw, "3 (consistent committed data)",
                                     "leads and serves, and below its high watermark")
        if hw > len(self.committed):
            self.committed.extend(b.log.entries[len(self.committed):hw])

    def _check_committed_prefix(self, b: SimBroker, limit: int, invariant: str,
                                where: str) -> None:
        shared = min(limit, len(self.committed), b.log.log_end_offset)
        truncations, verified = self.verified.get(b.broker_id, (-1, 0))
        if truncations == b.log.truncations and verified >= shared:
            return
        start = verified if truncations == b.log.truncations else 0
        if b.log.entries[start:shared] != self.committed[start:shared]:
            self._report_mismatch(b, shared, invariant, where)
        self.verified[b.broker_id] = (b.log.truncations, shared)

    def _report_mismatch(self, b: SimBroker, limit: int, invariant: str, where: str) -> None:
        first = next(o for o in range(limit) if b.log.entries[o] != self.committed[o])
        self.fail(invariant, f"b{b.broker_id} {where}: offset {first} holds "
                             f"{b.log.entries[first]}, committed is {self.committed[first]}")

    def _check_isr_holds_committed(self) -> None:
        reg = self.image.partition(TOPIC, 0)
        for broker_id in reg.isr:
            b = self.brokers[broker_id - 1]
            registration = self.image.brokers.get(broker_id)
            if not b.up or registration is None or \
                    registration.incarnation_id != b.incarnation_id:
                continue
            if b.log.log_end_offset < len(self.committed):
                self.fail("4 (committed data is in the ISR)",
                          f"b{broker_id} is in the controller's ISR {reg.isr} (partition epoch "
                          f"{reg.partition_epoch}) but its log ends at {b.log.log_end_offset}, "
                          f"below the committed {len(self.committed)}")
            self._check_committed_prefix(b, len(self.committed),
                                         "4 (committed data is in the ISR)",
                                         f"in the ISR {reg.isr}")

    # -- healing and the final check --------------------------------------------------------------
    def heal(self) -> None:
        """No more faults: restart everyone, deliver everything, let time
        pass, until the partition is fully replicated (or give up)."""
        self.healing = True
        self.note("healing: no more faults")
        for b in self.brokers:
            if not b.up:
                self._restart(b)
        for rounds in range(HEAL_ROUNDS_MAX):
            for _ in range(DELIVERIES_PER_HEAL_ROUND_MAX):
                ready = [m for m in self.queue if m.deliver_at_ms <= self.now_ms]
                if not ready:
                    break
                self.step_no += 1
                self.queue.remove(ready[0])
                self._deliver(ready[0])
                self._after_event()
                self.check_invariants()
            if self.converged():
                self.heal_rounds = rounds
                return
            self.step_no += 1
            self._advance_time(HEAL_TICK_MS)
            self._after_event()
            self.check_invariants()
        self.fail("5 (no acknowledged write lost)",
                  f"the partition did not converge within {HEAL_ROUNDS_MAX} healing rounds")

    def converged(self) -> bool:
        reg = self.image.partition(TOPIC, 0)
        if reg.leader == NO_LEADER or sorted(reg.isr) != sorted(reg.replicas):
            return False
        leader = self.brokers[reg.leader - 1]
        if leader.part is None or not leader.part.is_leader or \
                leader.part.leader_epoch != reg.leader_epoch:
            return False
        end = leader.part.log_end_offset
        return all(b.up and b.serving and b.image.offset == self.image.offset
                   and b.part is not None and b.part.log_end_offset == end
                   and b.part.high_watermark == end for b in self.brokers)

    def check_final(self) -> None:
        reg = self.image.partition(TOPIC, 0)
        leader = self.brokers[reg.leader - 1]
        entries = leader.log.entries
        for offset, record in sorted(self.acked.items()):
            held = entries[offset] if offset < len(entries) else None
            if held != record:
                self.fail("5 (no acknowledged write lost)",
                          f"acknowledged {record} at offset {offset}; the final leader "
                          f"b{leader.broker_id} holds {held}")
        for b in self.brokers:
            if b.log.entries != entries:
                first = next((o for o, (x, y) in enumerate(zip(b.log.entries, entries))
                              if x != y), min(len(b.log.entries), len(entries)))
                self.fail("5 (replicas identical)",
                          f"b{b.broker_id} differs from the leader b{leader.broker_id} from "
                          f"offset {first}")
        if entries[:len(self.committed)] != self.committed:
            self.fail("5 (no committed record lost)", "the final log lost committed records")

    def summary(self) -> str:
        reg = self.image.partition(TOPIC, 0)
        return (f"seed={self.seed} brokers={self.broker_count} steps={self.step_no} "
                f"t={self.now_ms}ms log={len(self.brokers[0].log.entries)} "
                f"committed={len(self.committed)} acked={len(self.acked)} "
                f"leader_epoch={reg.leader_epoch} metadata={self.image.offset}\n"
                f"  actions={dict(sorted(self.action_counts.items()))}\n"
                f"  events={dict(sorted(self.event_counts.items()))}")


def run_simulation(seed: int, steps: int, broker_count: int = 3, rules: Rules = Rules(),
                   trace: Callable[[str], None] | None = None) -> Simulation:
    """One full run; raises SimulationFailure if an invariant breaks."""
    sim = Simulation(seed, broker_count, rules, trace)
    sim.run(steps)
    return sim
