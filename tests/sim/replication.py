"""A seeded, deterministic simulation of one partition's replication.

What runs is the shipped code, driven the way the broker's asyncio shell
drives it: per simulated broker, ``api.broker.lifecycle_core.LifecycleCore``
(registration, heartbeats, fencing), ``api.broker.replication.ReplicationCore``
(the leader gate, produce and the acks=all purgatory, fetch long-polls, the
judgement of follower fetches, the follower's fetch sessions and how it
applies answers, AlterPartition in flight) with its ``Partition``, over the
broker's real disk side (``replica_manager.DiskLogs`` on a
``storage.manager.LogManager``, so real ``storage.log.Log`` segments,
indexes, epoch checkpoints, recovery and high-watermark checkpoints, in a
directory under /dev/shm); requests are decoded and answers rendered by
``data_api.decode_fetch`` and ``render_results``; and the controller core
``kraft.controller.Controller`` with its ``kraft.image.MetadataImage``. What
is simulated: the network (a queue of messages that may be delivered in any
order, dropped, delayed or duplicated), time (an injected clock: every core
takes ``now_ms``), producers, and crashes, which lose exactly what a real
crash would (below). Every step takes one action chosen by
``random.Random(seed)``; the invariants below are checked after every step.
A failure raises ``SimulationFailure`` naming the seed, the step and the
last events.

Modelled:
  - N brokers (3 or 5), one topic with one partition whose replicas are all
    brokers; ``min.insync.replicas`` = 2 (RF 3) or 3 (RF 5);
    ``unclean.leader.election.enable`` = false; automatic preferred-leader
    elections on.
  - Batches of 1 to 3 records; follower fetches return whole batches, at
    most ``FETCH_BATCHES_MAX`` of them (the fetch size limit).
  - Flushes (``Log.flush`` and the recovery-point checkpoint), the
    high-watermark checkpoint written at random times
    (``replication-offset-checkpoint``), process crashes (kill -9: the page
    cache survives, nothing is lost; the logs are abandoned unflushed) and
    machine crashes (the log file is cut at the last fsynced position, the
    recovery point), restarts with a new incarnation id and a new
    ``LogManager`` that recovers the logs as a real start does.
  - Metadata: each broker holds its own image, fed by delayable deliveries
    of the controller's records (after every controller change, on a poll
    timer, and at random, sometimes only a prefix of what is missing), so a
    broker can act on a stale or intermediate image.
  - Leases: heartbeats may be lost, so a live broker can be fenced and its
    leadership moved while it still believes it leads (a zombie leader).
  - ISR changes: AlterPartition requests and answers may be lost, delayed,
    duplicated or refused, and time out after ``ALTER_PARTITION_TIMEOUT_MS``,
    which ``isr.py`` hands to the partition as None ("refused or lost").

Durability modes (``Rules.durability``): "strict" (the default, below),
"brief" (a weakening of it), "elr" (KIP-966's promise, below), "noelr"
(the same faults with the controller's eligible leader replicas off: a
planted violation), "sync" (the topic has ``flush.messages=1``; machine
crashes may strike any broker at any time and every broker at once, a
power loss: nothing acknowledged may be lost) and "power" (the same faults
with the default background flush: a planted violation the invariants must
catch).

**Eligible leader replicas (KIP-966)**, which the controller keeps, close
the "last replica standing" gap described next: a replica that left the
ISR while it was below min.insync.replicas (the high watermark then stands
still) stays electable, and a broker that registers after an unclean
shutdown (its machine restarted: each simulated broker has a boot id that
a machine crash changes) is not. So in "elr" mode a machine crash may
strike any broker at any time, with no other fault held back, as long as
at most min.insync.replicas - 1 brokers are *tainted* at once (crashed
and not back in the ISR with a later registration). "brief" allows more
than that at once and still fails, rarely (about 1 seed in 150).

Not modelled: retention and DeleteRecords (the log start stays 0), more than
one partition, reassignment, controlled shutdown, unclean elections,
controller failover (the controller never crashes and commits at once),
consumers, producer idempotence and retries (a retried write is a new
write), corruption of flushed data, torn writes, and a truncation being
undone by a machine crash (truncations are durable at once). The HTTP
transport's own retries are modelled where they matter: while a machine crash
is unresolved, a lost control-plane request is sent again.

**Durability assumption ("strict").** Kafka's model, which the product follows, makes
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
against. (A fetch names its broker epoch, KIP-903, and a leader refuses one
naming an older registration than its image shows; before the image shows
the new one, only the closed connection stops a dead incarnation's fetch.)

**KIP-903** (fixed; the issue the invariants found before it): a leader
proposes a follower it has seen caught up; the request is delayed while that
follower loses its data in a machine crash, restarts, registers and is
unfenced; without broker epochs the controller then added the new
incarnation, which lacks the data, to the ISR (invariant 4). The simulator
found it at seed 232 with 5 brokers and 3000 steps, about one seed in 1500
of that length. Now every fetch names the follower's broker epoch, the
leader proposes a member only on fetches of the registration its image
shows and names that epoch, and the controller refuses a member registered
since (``INELIGIBLE_REPLICA``).

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
     ``check_invariants()`` on every up broker (the log's include its
     producer state). And at the end: the idempotent producer's records
     (a third of the produces, retried with the same sequence until a
     leader acknowledges them, often to another leader than the first
     attempt's) are each in the final log once, in the order sent.
"""

from __future__ import annotations

import collections
import dataclasses
import os
import random
import shutil
import tempfile
from collections.abc import Callable

from api.broker.data_api import decode_fetch, render_results
from api.broker.lifecycle_core import (BrokerState, LifecycleCore, LifecycleSettings,
                                       apply_noting)
from api.broker.partition import Partition, Role
from api.broker.replica_manager import DiskLogs
from api.broker.replication import (CancelRequest, ProduceItem, ReplicationCore,
                                    ReplicationSettings, Respond, SendAlterPartition, SendFetch)
from kraft import records as rec
from kraft.controller import Controller, ControllerSettings
from kraft.image import MetadataImage
from kraft.records import NO_LEADER
from kraft.topic_config import MIN_INSYNC_REPLICAS
from protocol.errors import KraftError
from storage.batch import BatchBuilder, build_batch, iter_batches, iter_records
from storage.config import LogConfig
from storage.log import Log
from storage.manager import LogManager, LogManagerConfig, TopicPartition

TOPIC = "sim"
TP = TopicPartition(TOPIC, 0)
CONTROLLER = -1  # the controller's address in the network

# -- timing (ms of simulated time) -------------------------------------------------
SESSION_TIMEOUT_MS = 3000  # broker.session.timeout.ms (short: leases lapse often)
HEARTBEAT_INTERVAL_MS = 1000  # broker.heartbeat.interval.ms
LAG_TIME_MAX_MS = 2000  # replica.lag.time.max.ms
FETCH_WAIT_MAX_MS = 500  # replica.fetch.wait.max.ms: how long a leader parks a fetch
PRODUCE_TIMEOUT_MS = 30_000  # a produce's timeout_ms: an ack not given by then never is
METADATA_POLL_MS = 1000  # a broker behind the controller asks again this often
PREFERRED_CHECK_INTERVAL_MS = 4000  # leader.imbalance.check.interval
TIME_STEP_MS_MAX = 1500  # one clock advance
PROTECTED_SLICE_MS = 250  # the clock's step while the control plane is kept reliable
LATENCY_MS_MAX = 20  # ordinary network latency
DELAY_MS_MIN, DELAY_MS_MAX = 300, 5000  # a delayed message

# -- limits ----------------------------------------------------------------------------
# replica.fetch.max.bytes: a few of the simulation's small batches per fetch.
FETCH_PARTITION_BYTES_MAX = 400
BATCH_RECORDS_MAX = 3
#: The simulated idempotent producer's id; its values are "i<n>".
IDEMPOTENT_PRODUCER_ID = 4242
IDEMPOTENT_SHARE = 0.35
TRACE_EVENTS_MAX = 30  # events a failure shows
# Healing: rounds of HEAL_TICK_MS, each delivering what is due. Correct runs
# converge within ~110 rounds (a lost fetch waits out its timeout); a
# follower looping on diverging answers uses a round's deliveries at once.
HEAL_ROUNDS_MAX = 400
HEAL_TICK_MS = 100
DELIVERIES_PER_HEAL_ROUND_MAX = 200

# Actions and their base weights (the sum need not be 100). Each seed scales
# the fault actions by a factor drawn from SWARM_FACTORS ("swarm testing": a
# seed with no drops but many crashes finds other bugs than the reverse).
ACTIONS = (("deliver", 55), ("produce", 11), ("advance_time", 13), ("drop", 2.5),
           ("duplicate", 1.2), ("delay", 2), ("flush", 4), ("checkpoint", 2.5), ("crash", 0.6),
           ("restart", 2), ("metadata", 2.5),
           # Every up broker loses power at once; only in the "sync" and
           # "power" durability modes (weight 0 otherwise, which leaves the
           # other modes' seeds choosing exactly as before).
           ("power_loss", 0.3))
FAULT_ACTIONS = ("drop", "duplicate", "delay", "crash", "flush", "checkpoint", "metadata")
SWARM_FACTORS = (0, 0.5, 1, 1, 2, 4)

CONTROL_KINDS = ("register", "heartbeat", "register_answer", "heartbeat_answer")
#: Durability modes in which every broker may lose power at once.
POWER_LOSS_MODES = ("sync", "power")
#: Durability modes bounded by brokers tainted by machine crashes at once.
TAINT_MODES = ("elr", "noelr")
REQUEST_KINDS = ("register", "heartbeat", "alter_partition", "fetch")


def _scratch_root() -> str:
    """Logs live in memory-backed files when the machine has them: the
    simulation fsyncs often and its data is worth nothing after the run."""
    base = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
    return tempfile.mkdtemp(prefix="kraftlog-sim-", dir=base)


class SimulationFailure(AssertionError):
    """An invariant broke. The message names the seed and step, the invariant,
    the details and the last events, and how to replay the run."""


# -- the rules under test, and deliberately broken variants --------------------------
@dataclasses.dataclass(frozen=True)
class Rules:
    """Switches for the checker's own tests. The defaults are the product's
    rules; each False (or "brief") plants one known bug, through a subclass
    of the shipped ``Partition``."""

    # (a) A follower answered with diverging_epoch truncates its log.
    follower_truncates_on_divergence: bool = True
    # (b) The leader's high watermark waits for the ISR (else: its log end).
    high_watermark_waits_for_followers: bool = True
    # (c) A follower asks the leader where to truncate (KIP-101), naming its
    # last epoch in every fetch; else it truncates to its own high watermark
    # on every leader change or restart and names no epoch (pre-KIP-101).
    follower_asks_leader: bool = True
    # "strict" or "brief": see the module docstring. "sync": the topic has
    # flush.messages=1, and machine crashes may strike any broker at any
    # time, every broker at once too ("power_loss"): nothing acknowledged
    # may be lost, which is what that setting promises. "power": the same
    # faults with the default (background) flush: a planted violation of
    # what the default promises, which the invariants must catch. "elr":
    # machine crashes at any time, as long as at most min.insync.replicas - 1
    # brokers are tainted by one at once (KIP-966's promise); "noelr": the
    # same with the controller's eligible leader replicas turned off, a
    # planted violation (Kafka before KIP-966).
    durability: str = "strict"

    def cli_flag(self) -> str:
        """How ``python -m tests.unit.test_replication_simulation`` names
        these rules (one planted bug at a time)."""
        planted = [flag for flag, on in (
            ("a", not self.follower_truncates_on_divergence),
            ("b", not self.high_watermark_waits_for_followers),
            ("c", not self.follower_asks_leader), ("brief", self.durability == "brief"),
            ("sync", self.durability == "sync"), ("power", self.durability == "power"),
            ("elr", self.durability == "elr"), ("noelr", self.durability == "noelr")) if on]
        return f" --rule {planted[0]}" if planted else ""

    def partition_class(self) -> type[Partition]:
        if not self.follower_truncates_on_divergence:
            return _IgnoresDivergence
        if not self.high_watermark_waits_for_followers:
            return _HighWatermarkIgnoresFollowers
        if not self.follower_asks_leader:
            return _TrustsOwnHighWatermark
        return Partition


class _IgnoresDivergence(Partition):
    """Broken rule (a): a diverging answer cuts nothing."""

    def truncation_offset(self, leader_epoch: int, leader_end_offset: int) -> int:
        return self.log_end_offset

    def truncate_to(self, offset: int, reason: str) -> None:
        if offset < self.log_end_offset:
            super().truncate_to(offset, reason)


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
            self.truncate_to(self.high_watermark, "pre-KIP-101: to its own high watermark")
        return became_leader


def _observed(base: type[Partition], broker: "SimBroker") -> type[Partition]:
    """``base`` telling ``broker`` when it removes records from its log's end,
    so the checker knows when to read the log again from the start."""

    class Observed(base):  # type: ignore[misc, valid-type]
        def truncate_to(self, offset: int, reason: str) -> None:
            broker.truncations += 1
            super().truncate_to(offset, reason)

        def restart_at(self, offset: int) -> None:
            broker.truncations += 1
            super().restart_at(offset)

    return Observed


# -- messages ------------------------------------------------------------------------------
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
    # Matches an answer to its request: the sender's request id (the core's
    # for fetches and AlterPartition, negative for the control plane).
    seq: int
    body: dict
    deliver_at_ms: int

    def describe(self) -> str:
        return f"{self.kind}#{self.msg_id} {_node_name(self.src)}->{_node_name(self.dst)}"


def _node_name(node: int) -> str:
    return "controller" if node == CONTROLLER else f"b{node}"


@dataclasses.dataclass
class ProduceInFlight:
    values: list[str]
    acks_all: bool
    leader_epoch: int
    #: The idempotent producer's batch (a retry may be answered with the
    #: offsets a former leader gave it, whatever the epoch).
    idempotent: bool = False


@dataclasses.dataclass
class IdempotentProducer:
    """A client with idempotence on: one batch outstanding, resent
    unchanged (same sequence) until a leader acknowledges it, whatever
    happened to earlier attempts; a sequence the leader cannot place
    (OUT_OF_ORDER_SEQUENCE_NUMBER) bumps the epoch as KIP-360 does."""

    epoch: int = 0
    next_seq: int = 0
    values_written: int = 0
    pending: tuple[list[str], bytes] | None = None


class SimBroker:
    """One broker: its log directory (which survives crashes, as a disk does)
    and the process running over it (the cores), which a crash throws away."""

    def __init__(self, broker_id: int, root: str, rules: Rules) -> None:
        self.broker_id = broker_id
        self.directory = os.path.join(root, f"b{broker_id}")
        self.rules = rules
        self.up = True
        self.incarnation = 0
        # Bumped whenever records may have left the log's end (a truncation
        # or a restart), so checks of an unchanged prefix can be skipped.
        self.truncations = 0
        # The broker epoch of the registration that stood for this broker
        # when a machine crash lost its unflushed data, until the controller
        # has fenced it and dropped it from the ISR (_unresolved_crash).
        self.lost_data_broker_epoch: int | None = None
        # The simulated machine's boot: a machine crash or power loss starts
        # a new one, so the next start knows its page cache is gone.
        self.boot = 0
        # Machine-crashed and not back in the ISR since (Simulation._tainted).
        self.tainted = False
        self.start_process(0, lambda: 0)

    def start_process(self, now_ms: int, clock_ms: Callable[[], int]) -> None:
        """What a process start creates: a ``LogManager`` that loads (and
        recovers) the logs, and the cores, all empty."""
        self.truncations += 1
        self.log_manager = LogManager(LogManagerConfig((self.directory,)), LogConfig(),
                                      clock=clock_ms, boot_id=f"b{self.broker_id}-boot{self.boot}")
        self.log_manager.startup()
        self.disk = DiskLogs(self.broker_id, self.log_manager)
        self.lifecycle = LifecycleCore(LifecycleSettings(
            self.broker_id, self.incarnation_id, {"BROKER": f"127.0.0.1:{9000 + self.broker_id}"},
            None, HEARTBEAT_INTERVAL_MS, SESSION_TIMEOUT_MS), now_ms)
        # As the broker's shell does once its logs are loaded.
        self.lifecycle.clean_shutdown = self.log_manager.nothing_unflushed_lost
        self.core = ReplicationCore(
            self.broker_id, self.disk, self.lifecycle,
            ReplicationSettings(lag_time_max_ms=LAG_TIME_MAX_MS,
                                fetch_wait_max_ms=FETCH_WAIT_MAX_MS,
                                fetch_partition_bytes_max=FETCH_PARTITION_BYTES_MAX),
            partition_factory=_observed(self.rules.partition_class(), self))
        self.lifecycle.min_insync_replicas = self.core.default_min_insync_replicas
        self.image = MetadataImage()
        # The control-plane request in flight, as sent (to send again).
        self.control_msg: Message | None = None
        # Leader side: fetches being served, by the core's request id.
        self.fetches_in: dict[int, Message] = {}
        self.produces: dict[int, ProduceInFlight] = {}
        self.next_metadata_poll_ms = now_ms

    @property
    def incarnation_id(self) -> str:
        return f"b{self.broker_id}-i{self.incarnation}"

    @property
    def part(self) -> Partition | None:
        return self.core.partitions.get(TP) if self.up else None

    @property
    def log(self) -> Log | None:
        return self.log_manager.get_log(TP) if self.up else None

    @property
    def state(self) -> BrokerState:
        return self.lifecycle.state

    @property
    def broker_epoch(self) -> int | None:
        return self.lifecycle.broker_epoch

    @property
    def serving(self) -> bool:
        """RUNNING and metadata caught up (the core's leader gate)."""
        return self.up and self.lifecycle.not_serving_reason() is None


def _describe_record(record: rec.Record) -> str:
    fields = {k: v for k, v in dataclasses.asdict(record).items()
              if v is not None and k not in ("topic_id", "endpoints", "rack")}
    return f"{type(record).__name__}{fields}"


def _lose_unflushed(log: Log) -> int:
    """Cut ``log``'s file at its recovery point, the last position fsynced
    (what a machine crash keeps of it; the log is closed after); returns how
    many records were lost."""
    lost = log.log_end_offset - log.recovery_point
    segments = log.segments
    assert len(segments) == 1, "the simulation's logs never roll"
    segment = segments[0]
    found = segment.find_batch(log.recovery_point) if lost > 0 else None
    log.abandon()
    if found is not None:
        with open(segment.log_path, "r+b") as f:
            f.truncate(found[0])
    return max(lost, 0)


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
        if rules.durability not in POWER_LOSS_MODES:
            self.action_weights[self.action_names.index("power_loss")] = 0
        # The network.
        self.queue: list[Message] = []
        self._ids = 0
        # The controller and its committed metadata log (offset = index).
        settings = ControllerSettings(
            session_timeout_ms=SESSION_TIMEOUT_MS, heartbeat_interval_ms=HEARTBEAT_INTERVAL_MS,
            unclean_leader_election_enable=False, auto_leader_rebalance_enable=True,
            leader_imbalance_check_interval_ms=PREFERRED_CHECK_INTERVAL_MS,
            eligible_leader_replicas=rules.durability != "noelr")
        self.controller = Controller(settings, id_factory=lambda: f"topic-{seed}")
        self.image = MetadataImage()
        self.metadata_log: list[rec.Record] = []
        self.controller.become_active(self.image, self.now_ms)
        self.root = _scratch_root()
        self.brokers = [SimBroker(i, self.root, rules) for i in range(1, broker_count + 1)]
        for b in self.brokers:
            b.log_manager.clock = self.clock_ms
        # Checker state.
        self.epoch_leaders: dict[int, tuple[int, str]] = {}  # epoch -> (leader, who said)
        self.leader_hw: dict[tuple[int, int, int], int] = {}  # (broker, incarnation, epoch)
        self.committed: list[tuple[int, str]] = []
        self.verified: dict[int, tuple[int, int]] = {}  # broker -> (truncations, prefix ok)
        self._read: dict[int, tuple[int, list[tuple[int, str]]]] = {}  # broker -> entries
        self.acked: dict[int, tuple[int, str]] = {}  # offset -> (leader_epoch, value)
        self.values_written = 0
        self.idempotent = IdempotentProducer()
        self.heal_rounds: int | None = None
        self.steps_planned = 0
        # What happened, for summaries: actions taken and notable events.
        self.action_counts: collections.Counter[str] = collections.Counter()
        self.event_counts: collections.Counter[str] = collections.Counter()
        self._bootstrap()

    def clock_ms(self) -> int:
        return self.now_ms

    # -- running --------------------------------------------------------------------------------
    def run(self, steps: int) -> None:
        """``steps`` random steps, then heal and check that nothing
        acknowledged was lost. The logs' directory is removed at the end."""
        self.steps_planned = steps
        try:
            for _ in range(steps):
                self.step()
            self.heal()
            self.check_final()
        finally:
            self.close()

    def close(self) -> None:
        for b in self.brokers:
            if b.up:
                b.log_manager.abandon()
        shutil.rmtree(self.root, ignore_errors=True)

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
                parts.append(f"b{b.broker_id}: DOWN")
                continue
            p, log = b.part, b.log
            role = (f"{p.role.value} epoch={p.leader_epoch} hw={p.high_watermark} isr={p.isr}"
                    if p else "no partition")
            where = (f"end={log.log_end_offset} flushed={log.recovery_point} "
                     f"epochs={log.epoch_cache.entries}" if log else "no log")
            parts.append(f"b{b.broker_id}: {b.state.value} {role} {where}")
        return "; ".join(parts)

    # -- bootstrap: brokers registered and unfenced, the topic created ----------------------
    def _bootstrap(self) -> None:
        """Every broker's lifecycle core registers and is unfenced, its
        requests answered directly by the controller core."""
        for b in self.brokers:
            request = b.lifecycle.poll(self.now_ms)
            result = self.controller.register_broker(self.image, request.body, self.now_ms)
            self._commit(result.records, f"b{b.broker_id} registers")
            b.lifecycle.answered(request.kind, result.response, self.now_ms)
            b.log_manager.record_boot()
        for b in self.brokers:
            self._deliver_metadata_now(b)
            request = b.lifecycle.poll(self.now_ms)
            result = self.controller.heartbeat(self.image, request.body, self.now_ms)
            self._commit(result.records, f"b{b.broker_id} heartbeats")
            b.lifecycle.answered(request.kind, result.response, self.now_ms)
        result = self.controller.create_topics(self.image, {"topics": [{
            "name": TOPIC, "num_partitions": 1, "replication_factor": self.broker_count,
            "configs": {MIN_INSYNC_REPLICAS: str(self.min_insync_replicas),
                        **({"flush.messages": "1"} if self.rules.durability == "sync" else {})}}]})
        assert result.response["topics"][0]["error"] is None, result.response
        self._commit(result.records, "topic created")
        for b in self.brokers:
            self._deliver_metadata_now(b)
        # Every broker has the whole image already; the first fetches stay.
        self.queue = [m for m in self.queue if m.kind != "metadata"]
        for b in self.brokers:
            assert b.serving, b.state
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
        leader = self.rng.choice(leaders)
        if self.rng.random() < IDEMPOTENT_SHARE:
            self._produce_idempotent(leader)
        else:
            self._produce(leader, acks_all=self.rng.random() < 0.85)

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
        hosting = [b for b in self.brokers if b.up and b.log is not None]
        if hosting:
            b = self.rng.choice(hosting)
            b.log.flush()
            b.log_manager.checkpoint()
            self.note(f"b{b.broker_id} flushes its log to {b.log.recovery_point}")

    def _act_checkpoint(self) -> None:
        hosting = [b for b in self.brokers if b.up and b.part is not None]
        if hosting:
            b = self.rng.choice(hosting)
            b.disk.write_high_watermarks(b.disk.high_watermark_snapshot(b.core.partitions))
            self.note(f"b{b.broker_id} checkpoints high watermark {b.part.high_watermark}")

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

    def _act_power_loss(self) -> None:
        """Every up broker loses power at once (a rack or a site): each
        log is cut at its last fsync."""
        up = [b for b in self.brokers if b.up]
        self.note(f"POWER LOSS of brokers {[b.broker_id for b in up]}")
        self.event_counts["power losses"] += 1
        for b in up:
            self._crash(b, lose_unflushed=True)

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
              dst_incarnation: int | None = None) -> Message:
        """Queue a message; it may be delivered after ordinary latency, in
        any order with the others, unless a fault action gets it first."""
        self._ids += 1
        if dst_incarnation is None:
            dst_incarnation = self._incarnation_of(dst)
        latency_ms = 0 if self.healing else self.rng.randint(0, LATENCY_MS_MAX)
        msg = Message(self._ids, kind, src, dst, self._incarnation_of(src), dst_incarnation,
                      seq, body, self.now_ms + latency_ms)
        self.queue.append(msg)
        return msg

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
        clock moves, and a request lost before that began is sent again (the
        controller client retries a request whose connection failed)."""
        for _ in range(10 * self.broker_count):
            for b in self.brokers:
                sent = b.control_msg
                if b.up and sent is not None and not any(
                        m.seq == sent.seq and m.src == b.broker_id for m in self.queue):
                    self._ids += 1
                    self.queue.append(dataclasses.replace(sent, msg_id=self._ids,
                                                          deliver_at_ms=self.now_ms))
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

    # -- broker: the lifecycle core's registration and heartbeats --------------------------------
    def _control_tick(self, b: SimBroker) -> None:
        """BrokerLifecycle._control_loop: send what the core says is due."""
        request = b.lifecycle.poll(self.now_ms)
        if request is None:
            return
        self._ids += 1
        b.control_msg = self._send(request.kind, b.broker_id, CONTROLLER, request.body,
                                   -self._ids)

    def _on_control_answer(self, b: SimBroker, msg: Message) -> None:
        sent = b.control_msg
        if sent is None or sent.seq != msg.seq:
            return  # an answer to a request given up on
        b.control_msg = None
        self._withdraw(b, msg.seq)
        kind = sent.kind
        state_before = b.state
        if "error" in msg.body:
            self.note(f"b{b.broker_id}: {kind} refused: {msg.body['error']}")
            b.lifecycle.failed(kind, msg.body["error"], self.now_ms)
        else:
            b.lifecycle.answered(kind, msg.body["answer"], self.now_ms)
            if kind == "register":
                self.note(f"b{b.broker_id} registered with broker epoch {b.broker_epoch}")
                b.log_manager.record_boot()  # as the broker's shell does
        if b.state is not state_before:
            self.note(f"b{b.broker_id}: {state_before.value} -> {b.state.value}")

    def _lifecycle_tick(self, b: SimBroker) -> None:
        state_before = b.state
        b.lifecycle.tick(self.now_ms)
        if b.control_msg is not None and b.lifecycle.in_flight is None:
            self._withdraw(b, b.control_msg.seq)  # given up on: timed out
            b.control_msg = None
        if b.state is not state_before:
            self.note(f"b{b.broker_id}: {state_before.value} -> {b.state.value}")

    # -- broker: metadata (BrokerLifecycle._apply, then the replication core) ----------------------
    def _on_metadata_message(self, b: SimBroker, msg: Message) -> None:
        self._on_metadata(b, msg.body)

    def _on_metadata(self, b: SimBroker, body: dict) -> None:
        changed: dict | None = {}
        for offset, record in body["records"]:
            if offset <= b.image.offset:
                continue  # already applied
            assert offset == b.image.offset + 1, (offset, b.image.offset)
            changed = apply_noting(b.image, record, offset, changed)  # as BrokerLifecycle
        if not b.lifecycle.metadata_applied(b.image.offset, body["offset"], self.now_ms):
            return
        part = b.part
        before = (part.role, part.leader_epoch, part.partition_epoch) if part else None
        b.core.apply_image(b.image, self.now_ms, changed)
        self._carry_out(b)
        part = b.part
        if part is not None and (part.role, part.leader_epoch, part.partition_epoch) != before:
            self.note(f"b{b.broker_id} applies image @{b.image.offset}: {part.role.value} "
                      f"epoch={part.leader_epoch} pe={part.partition_epoch} isr={part.isr} "
                      f"hw={part.high_watermark} end={part.log_end_offset}")

    # -- broker: carrying out the replication core's actions --------------------------------------
    def _carry_out(self, b: SimBroker) -> None:
        """ReplicaManager._carry_out: every action the core decided, until
        it has no more (a refused connection is an event too)."""
        while True:
            actions = b.core.ready()
            if not actions:
                return
            for action in actions:
                if isinstance(action, Respond):
                    self._on_respond(b, action)
                elif isinstance(action, SendFetch):
                    self._send_fetch(b, action)
                elif isinstance(action, SendAlterPartition):
                    self.note(f"b{b.broker_id} proposes ISR {action.body['new_isr']}")
                    self._send("alter_partition", b.broker_id, CONTROLLER, action.body,
                               action.request_id)
                elif isinstance(action, CancelRequest):
                    self._withdraw(b, action.request_id)

    def _send_fetch(self, b: SimBroker, action: SendFetch) -> None:
        leader = self.brokers[action.leader_id - 1]
        if not leader.up:
            b.core.fetch_failed(action.request_id, self.now_ms)  # connection refused
            return
        self._send("fetch", b.broker_id, action.leader_id, action.body, action.request_id)

    def _on_respond(self, b: SimBroker, action: Respond) -> None:
        fetch = b.fetches_in.pop(action.request_id, None)
        if fetch is not None:
            answer = {"partitions": render_results("fetch", action.results), **action.fields}
            self._reply(fetch, "fetch_answer", answer)
            return
        produce = b.produces.pop(action.request_id, None)
        if produce is not None:
            self._settle_produce(b, produce, action.results)

    # -- broker as leader: follower fetches arrive --------------------------------------------------
    def _on_fetch(self, leader: SimBroker, msg: Message) -> None:
        """DataApi.handle_fetch: decode, hand to the core (which answers at
        once or parks the fetch as a long-poll)."""
        request_id = leader.core.new_request_id()
        leader.fetches_in[request_id] = msg
        leader.core.fetch(request_id, decode_fetch(msg.body), self.now_ms)
        self._carry_out(leader)

    # -- broker as follower: answers come back --------------------------------------------------------
    def _on_fetch_answer(self, b: SimBroker, msg: Message) -> None:
        self._withdraw(b, msg.seq)
        part = b.part
        before = (part.log_end_offset, part.high_watermark, b.truncations) if part else None
        b.core.fetch_answered(msg.seq, msg.body, self.now_ms)
        self._carry_out(b)
        part = b.part
        if part is None or before is None:
            return
        end, hw, truncations = before
        if b.truncations != truncations:
            self.event_counts["follower truncations"] += 1
            self.note(f"b{b.broker_id} truncates {end} -> {part.log_end_offset}")
        elif part.log_end_offset > end:
            self.note(f"b{b.broker_id} appends [{end}, {part.log_end_offset}) from "
                      f"b{part.leader_id}, hw -> {part.high_watermark}")

    def _on_alter_partition_answer(self, b: SimBroker, msg: Message) -> None:
        self._withdraw(b, msg.seq)
        isr_before = list(b.part.isr) if b.part else None
        b.core.alter_partitions_answered([(msg.seq, msg.body.get("answer"),
                                           msg.body.get("error"))], self.now_ms)
        self._carry_out(b)
        applied = b.part is not None and b.part.isr != isr_before
        self.event_counts["isr answers applied" if applied else "isr answers not applied"] += 1
        self.note(f"b{b.broker_id}: ISR answer {msg.body.get('answer') or msg.body}")

    # -- clients: produce and acknowledgements ---------------------------------------------------------
    def _produce(self, b: SimBroker, acks_all: bool) -> None:
        count = self.rng.randint(1, BATCH_RECORDS_MAX)
        values = [f"v{self.values_written + i}" for i in range(count)]
        self.values_written += count
        batch = build_batch([(None, v.encode()) for v in values], timestamp_ms=self.now_ms)
        request_id = b.core.new_request_id()
        b.produces[request_id] = ProduceInFlight(values, acks_all, b.part.leader_epoch)
        appended = b.core.produce(request_id, [ProduceItem(TP, None, batch)],
                                  -1 if acks_all else 1, PRODUCE_TIMEOUT_MS, self.now_ms)
        if appended:
            self.note(f"b{b.broker_id} appends {values} at {appended[0][1].base_offset} in "
                      f"epoch {b.part.leader_epoch} (acks={'all' if acks_all else 1})")
        self._carry_out(b)

    def _produce_idempotent(self, b: SimBroker) -> None:
        """Send the idempotent producer's outstanding batch again, or its
        next one: acks=all, same bytes on every attempt."""
        producer = self.idempotent
        if producer.pending is None:
            count = self.rng.randint(1, BATCH_RECORDS_MAX)
            values = [f"i{producer.values_written + i}" for i in range(count)]
            producer.values_written += count
            builder = BatchBuilder(producer_id=IDEMPOTENT_PRODUCER_ID,
                                   producer_epoch=producer.epoch,
                                   base_sequence=producer.next_seq)
            for value in values:
                builder.append(None, value.encode(), timestamp_ms=self.now_ms)
            producer.pending = (values, builder.build())
        values, batch = producer.pending
        request_id = b.core.new_request_id()
        b.produces[request_id] = ProduceInFlight(values, True, b.part.leader_epoch,
                                                 idempotent=True)
        appended = b.core.produce(request_id, [ProduceItem(TP, None, batch)], -1,
                                  PRODUCE_TIMEOUT_MS, self.now_ms)
        if appended and not appended[0][1].duplicate:
            self.note(f"b{b.broker_id} appends idempotent {values} at "
                      f"{appended[0][1].base_offset} in epoch {b.part.leader_epoch}")
        elif appended:
            self.event_counts["idempotent retries deduplicated"] += 1
            self.note(f"b{b.broker_id} finds idempotent {values} already at "
                      f"{appended[0][1].base_offset}")
        self._carry_out(b)

    def _settle_idempotent(self, produce: ProduceInFlight, result: dict) -> None:
        producer = self.idempotent
        current = producer.pending is not None and producer.pending[0] == produce.values
        if result["error"] is not None:
            code = getattr(result["error"], "code", None)
            if current and code == "OUT_OF_ORDER_SEQUENCE_NUMBER":
                # The leader lost this producer's acknowledged batches: a
                # new epoch, its sequence from 0, the same records.
                producer.epoch += 1
                producer.next_seq = 0
                builder = BatchBuilder(producer_id=IDEMPOTENT_PRODUCER_ID,
                                       producer_epoch=producer.epoch, base_sequence=0)
                for value in produce.values:
                    builder.append(None, value.encode(), timestamp_ms=self.now_ms)
                producer.pending = (produce.values, builder.build())
                self.event_counts["idempotent epoch bumps"] += 1
            return
        if current:
            producer.next_seq += len(produce.values)
            producer.pending = None

    def _settle_produce(self, b: SimBroker, produce: ProduceInFlight,
                        results: list[dict]) -> None:
        (result,) = results
        if produce.idempotent:
            self._settle_idempotent(produce, result)
        if result["error"] is not None:
            code = getattr(result["error"], "code", result["error"])
            self.note(f"b{b.broker_id} refuses {produce.values}: {code}")
            return
        if not produce.acks_all:
            return
        base_offset = result["base_offset"]
        for i, value in enumerate(produce.values):
            # An idempotent retry may be answered with where a former
            # leader put it: its epoch is not this leader's.
            record = (None if produce.idempotent else produce.leader_epoch, value)
            if self.acked.setdefault(base_offset + i, record) != record:
                self.fail("5 (acknowledged writes)",
                          f"offset {base_offset + i} acknowledged twice: "
                          f"{self.acked[base_offset + i]} and {record}")
        self.event_counts["acks=all writes acknowledged"] += 1
        self.note(f"b{b.broker_id} acknowledges {produce.values} at {base_offset}")

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
        self._lifecycle_tick(b)
        self._control_tick(b)
        b.core.tick(self.now_ms)
        self._carry_out(b)
        if self.now_ms >= b.next_metadata_poll_ms:
            b.next_metadata_poll_ms = self.now_ms + METADATA_POLL_MS
            if b.image.offset < self.image.offset:
                self._send_metadata(b)

    def _after_event(self) -> None:
        """What the brokers' event loops do at once after any event: send a
        registration or heartbeat that became due."""
        for b in self.brokers:
            if b.up:
                self._control_tick(b)

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
        if self.rules.durability in POWER_LOSS_MODES:
            return True  # any time: what the flush setting promises is under test
        isr = self.image.partition(TOPIC, 0).isr
        if not any(x != b.broker_id and self.brokers[x - 1].up for x in isr):
            return False
        if self.rules.durability == "brief":
            return True
        if self.rules.durability in TAINT_MODES:
            return sum(self._tainted(o) for o in self.brokers if o is not b) + 1 <= (
                self.min_insync_replicas - 1)
        if any(self._unresolved_crash(o) for o in self.brokers):
            return False
        return all(self._healthy(o) for o in self.brokers if o is not b)

    def _tainted(self, b: SimBroker) -> bool:
        """Whether b lost data in a machine crash (perhaps none: it cannot
        tell) and has not been back in the ISR since, with a registration
        made after it: what KIP-966 tolerates min.insync.replicas - 1 of."""
        if not b.tainted:
            return False
        reg = self.image.brokers.get(b.broker_id)
        if (b.up and reg is not None and reg.incarnation_id == b.incarnation_id
                and b.broker_id in self.image.partition(TOPIC, 0).isr):
            b.tainted = False
        return b.tainted

    def _process_crash_allowed(self, b: SimBroker) -> bool:
        if self.rules.durability in ("brief", *POWER_LOSS_MODES, *TAINT_MODES):
            return True
        return not any(self._unresolved_crash(o) for o in self.brokers if o is not b)

    def _crash(self, b: SimBroker, lose_unflushed: bool) -> None:
        epoch_at_crash = b.broker_epoch
        log = b.log
        lost = _lose_unflushed(log) if lose_unflushed and log is not None else 0
        b.log_manager.abandon()  # no flush, no clean-shutdown marker
        if lose_unflushed:
            b.boot += 1
            b.tainted = True
        self.event_counts["machine crashes" if lose_unflushed else "process crashes"] += 1
        self.event_counts["records lost in crashes"] += lost
        b.up = False
        if lose_unflushed and lost:
            # The disk lost data: whichever registration of this broker the
            # controller still counts (perhaps a previous incarnation's, if
            # this one had not registered yet) now stands for less data.
            reg = self.image.brokers.get(b.broker_id)
            if reg is not None:
                b.lost_data_broker_epoch = reg.broker_epoch
        self.note(f"b{b.broker_id} {'MACHINE' if lose_unflushed else 'process'} crash "
                  f"(broker epoch {epoch_at_crash}): lost {lost} records")
        # Its connections close: nothing it sent is delivered any more, and
        # nothing sent to it. Its peers see the failure of what they sent it.
        self.queue = [m for m in self.queue
                      if m.src != b.broker_id and m.dst != b.broker_id]
        for other in self.brokers:
            if other.up and other is not b:
                for session_request in list(other.core.fetches_to(b.broker_id)):
                    other.core.fetch_failed(session_request, self.now_ms)
                self._carry_out(other)

    def _restart(self, b: SimBroker) -> None:
        b.up = True
        b.incarnation += 1
        b.start_process(self.now_ms, self.clock_ms)
        log = b.log
        self.note(f"b{b.broker_id} restarts as {b.incarnation_id} (log end "
                  f"{log.log_end_offset if log else 0})")
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
                b.core.check_invariants()
                b.log.check_invariants()
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
            self.committed.extend(self._entries(b)[len(self.committed):hw])

    def _check_committed_prefix(self, b: SimBroker, limit: int, invariant: str,
                                where: str) -> None:
        shared = min(limit, len(self.committed), b.log.log_end_offset)
        truncations, verified = self.verified.get(b.broker_id, (-1, 0))
        if truncations == b.truncations and verified >= shared:
            return
        start = verified if truncations == b.truncations else 0
        if self._entries(b)[start:shared] != self.committed[start:shared]:
            self._report_mismatch(b, shared, invariant, where)
        self.verified[b.broker_id] = (b.truncations, shared)

    def _report_mismatch(self, b: SimBroker, limit: int, invariant: str, where: str) -> None:
        entries = self._entries(b)
        first = next(o for o in range(limit) if entries[o] != self.committed[o])
        self.fail(invariant, f"b{b.broker_id} {where}: offset {first} holds "
                             f"{entries[first]}, committed is {self.committed[first]}")

    def _entries(self, b: SimBroker) -> list[tuple[int, str]]:
        """``(leader_epoch, value)`` of every offset in b's log, decoded from
        its files; read again from the start only after a truncation."""
        truncations, entries = self._read.get(b.broker_id, (-1, []))
        if truncations != b.truncations:
            entries = []
        log = b.log
        end = log.log_end_offset if log is not None else 0
        while len(entries) < end:
            data = log.read(len(entries), 1 << 20, end)
            for header, batch in iter_batches(data):
                for record in iter_records(batch):
                    if record.offset >= len(entries):
                        assert record.offset == len(entries), (record.offset, len(entries))
                        entries.append((header.partition_leader_epoch, record.value.decode()))
        self._read[b.broker_id] = (b.truncations, entries)
        return entries

    def _check_isr_holds_committed(self) -> None:
        reg = self.image.partition(TOPIC, 0)
        for broker_id in reg.isr:
            b = self.brokers[broker_id - 1]
            registration = self.image.brokers.get(broker_id)
            if not b.up or registration is None or \
                    registration.incarnation_id != b.incarnation_id:
                continue
            if b.log is None or b.log.log_end_offset < len(self.committed):
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
        entries = self._entries(leader)
        for offset, record in sorted(self.acked.items()):
            held = entries[offset] if offset < len(entries) else None
            if held is None or held[1] != record[1] or record[0] not in (None, held[0]):
                self.fail("5 (no acknowledged write lost)",
                          f"acknowledged {record} at offset {offset}; the final leader "
                          f"b{leader.broker_id} holds {held}")
        for b in self.brokers:
            held = self._entries(b)
            if held != entries:
                first = next((o for o, (x, y) in enumerate(zip(held, entries))
                              if x != y), min(len(held), len(entries)))
                self.fail("5 (replicas identical)",
                          f"b{b.broker_id} differs from the leader b{leader.broker_id} from "
                          f"offset {first}")
        if entries[:len(self.committed)] != self.committed:
            self.fail("5 (no committed record lost)", "the final log lost committed records")
        idempotent = [int(value[1:]) for _epoch, value in entries if value.startswith("i")]
        if idempotent != sorted(set(idempotent)):
            duplicated = sorted(v for v in set(idempotent) if idempotent.count(v) > 1)
            self.fail("6 (idempotent producer: no duplicate, no reorder)",
                      f"the idempotent producer's records are {idempotent[:40]}...; "
                      f"duplicated: {duplicated[:10]}")

    def summary(self) -> str:
        reg = self.image.partition(TOPIC, 0)
        return (f"seed={self.seed} brokers={self.broker_count} steps={self.step_no} "
                f"t={self.now_ms}ms log={len(self._entries(self.brokers[0]))} "
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
