"""A broker's membership in the cluster, as a pure state machine.

``LifecycleCore`` decides what the broker says to the controller and when:
register until registered, then heartbeat every
``broker.heartbeat.interval.ms``, one request at a time; it takes the answers
and failures, and it owns the broker's state. It does no I/O and reads no
clock: ``BrokerLifecycle`` (asyncio + HTTP) and the replication simulator
(``tests/sim/replication.py``) both drive this same class, each with its own
transport and time.

States (``BrokerState``; only ``LifecycleCore._set_state`` changes them)::

    STARTING      --registered-------------------------------> FENCED
    FENCED        --heartbeat answer: unfenced----------------> RUNNING
    RUNNING       --heartbeat answer: fenced, or no heartbeat
                    got through for a whole session-----------> FENCED
    FENCED/RUNNING --STALE_BROKER_EPOCH/BROKER_ID_NOT_REGISTERED--> STARTING
    FENCED/RUNNING --controlled shutdown begins----------------> SHUTTING_DOWN
    any           --stop----------------------------------------> STOPPED

Any other transition is a bug and raises ``IllegalTransition`` naming both
states.

Registration gives the broker its epoch (the offset of its registration
record). It starts fenced: it may lead nothing until its metadata image has
reached its own registration and a heartbeat has told the controller so
(``metadata_applied`` asks for that heartbeat at once).
"""

from __future__ import annotations

import dataclasses
import enum
import logging
from collections.abc import Container, Mapping

from kraft.image import BROKER_RESOURCE, TOPIC_RESOURCE, MetadataImage
from kraft.records import (ConfigRecord, PartitionChangeRecord, PartitionRecord, Record,
                           RemoveTopicRecord, TopicRecord)

logger = logging.getLogger(__name__)

#: Pause after a failed registration or heartbeat (capped by the interval).
RETRY_BACKOFF_MS = 100
#: Heartbeat answers that mean the controller no longer knows this
#: registration: register again.
RE_REGISTER_CODES = frozenset({"STALE_BROKER_EPOCH", "BROKER_ID_NOT_REGISTERED"})


class BrokerState(enum.Enum):
    STARTING = "starting"
    FENCED = "fenced"
    RUNNING = "running"
    SHUTTING_DOWN = "shutting_down"
    STOPPED = "stopped"


#: The legal transitions (staying in a state is always allowed).
TRANSITIONS: dict[BrokerState, frozenset[BrokerState]] = {
    BrokerState.STARTING: frozenset({BrokerState.FENCED, BrokerState.SHUTTING_DOWN,
                                     BrokerState.STOPPED}),
    BrokerState.FENCED: frozenset({BrokerState.RUNNING, BrokerState.STARTING,
                                   BrokerState.SHUTTING_DOWN, BrokerState.STOPPED}),
    BrokerState.RUNNING: frozenset({BrokerState.FENCED, BrokerState.STARTING,
                                    BrokerState.SHUTTING_DOWN, BrokerState.STOPPED}),
    BrokerState.SHUTTING_DOWN: frozenset({BrokerState.STOPPED}),
    BrokerState.STOPPED: frozenset(),
}


class IllegalTransition(AssertionError):
    """A transition the table above does not allow: a bug in the caller."""


@dataclasses.dataclass(frozen=True)
class ControlRequest:
    """What to send to the controller now."""

    kind: str  # "register" or "heartbeat"
    body: dict
    timeout_ms: int


@dataclasses.dataclass(frozen=True)
class LifecycleSettings:
    broker_id: int
    incarnation_id: str
    endpoints: dict
    rack: str | None
    heartbeat_interval_ms: int
    session_timeout_ms: int

    @property
    def heartbeat_timeout_ms(self) -> int:
        """Half a session: a heartbeat that cannot get through in that time
        leaves the next one time to, before the lease lapses."""
        return max(1, self.session_timeout_ms // 2)


class LifecycleCore:
    def __init__(self, settings: LifecycleSettings, now_ms: int) -> None:
        self.settings = settings
        self.state = BrokerState.STARTING
        # The epoch of this incarnation's registration; None until registered
        # (and again after the controller forgot it).
        self.broker_epoch: int | None = None
        # The metadata offset this broker's image has reached, and whether it
        # holds everything the controller had when it last answered (and at
        # least this broker's own registration): only then is an absence in
        # the image real rather than not yet replayed.
        self.metadata_offset = -1
        self.controller_offset = 0
        self.metadata_caught_up = False
        # One request at a time: (kind, deadline) while one is out.
        self.in_flight: tuple[str, int] | None = None
        self.next_request_ms = now_ms
        self.last_success_ms = now_ms
        # Log dirs this process took offline after disk errors, and the
        # replicas that were in them (topic id -> partitions): every
        # heartbeat names them, so the controller records them on each
        # registration of this process (report_offline).
        self.offline_log_dirs: list[str] = []
        self.offline_replicas: dict[str, list[int]] = {}
        # Whether this registration, as the metadata shows it, holds all of
        # them: heartbeats then stop naming them (a map of thousands of
        # partitions every interval would load the controller for nothing).
        self.offline_recorded = False
        # Whether the logs lost nothing unflushed when the broker last stopped
        # (a clean shutdown, or a crash of the process alone: set by the
        # shell from ``LogManager.nothing_unflushed_lost``). A registration
        # says so; false makes the controller stop counting this broker as an
        # eligible leader replica (KIP-966). True once registered: a later
        # registration of this same process has lost nothing.
        self.clean_shutdown = False
        # This broker's default min.insync.replicas (set by the shell), which
        # the registration tells the controller (eligible leader replicas
        # are kept by the smallest default any broker uses).
        self.min_insync_replicas: int | None = None

    # -- what to send --------------------------------------------------------
    def poll(self, now_ms: int) -> ControlRequest | None:
        """The registration or heartbeat due now, if any; the caller sends it
        and reports ``answered`` or ``failed``."""
        if (self.in_flight is not None or now_ms < self.next_request_ms
                or self.state in (BrokerState.SHUTTING_DOWN, BrokerState.STOPPED)):
            return None
        s = self.settings
        if self.broker_epoch is None:
            request = ControlRequest("register", {
                "broker_id": s.broker_id, "incarnation_id": s.incarnation_id,
                "endpoints": s.endpoints, "rack": s.rack,
                "clean_shutdown": self.clean_shutdown,
                **({} if self.min_insync_replicas is None
                   else {"min_insync_replicas": self.min_insync_replicas})},
                s.session_timeout_ms)
        else:
            request = ControlRequest("heartbeat", self.heartbeat_body(), s.heartbeat_timeout_ms)
        self.in_flight = (request.kind, now_ms + request.timeout_ms)
        return request

    def heartbeat_body(self, want_shutdown: bool = False) -> dict:
        body = {"broker_id": self.settings.broker_id, "broker_epoch": self.broker_epoch,
                "metadata_offset": self.metadata_offset, "want_fence": False,
                "want_shutdown": want_shutdown}
        if self.offline_log_dirs and not self.offline_recorded:
            body["offline_log_dirs"] = list(self.offline_log_dirs)
            body["offline_replicas"] = {topic_id: list(partitions) for topic_id, partitions
                                        in self.offline_replicas.items()}
        return body

    def report_offline(self, log_dirs: list[str], replicas: dict[str, list[int]],
                       now_ms: int) -> None:
        """Log dirs went offline after disk errors, holding ``replicas``
        (all of them so far): the next heartbeat, due at once, tells the
        controller, which moves their leadership and ISR places away."""
        self.offline_log_dirs = sorted(log_dirs)
        self.offline_replicas = {topic_id: sorted(partitions)
                                 for topic_id, partitions in replicas.items()}
        self.offline_recorded = False
        if self.in_flight is None:
            self.next_request_ms = min(self.next_request_ms, now_ms)

    def registration_seen(self, broker_epoch: int | None, offline_log_dirs: list[str],
                          offline_replicas: Mapping[str, list[int]],
                          topic_ids: Container[str]) -> None:
        """This broker's registration as the metadata now shows it: whether
        it records every offline dir and every offline replica of the
        topics that still exist (``topic_ids``), so heartbeats may stop
        naming them."""
        self.offline_recorded = (
            broker_epoch is not None and broker_epoch == self.broker_epoch
            and set(self.offline_log_dirs) <= set(offline_log_dirs)
            and all(set(partitions) <= set(offline_replicas.get(topic_id, ()))
                    for topic_id, partitions in self.offline_replicas.items()
                    if topic_id in topic_ids))

    def next_wake_ms(self) -> int | None:
        """When ``poll`` or ``tick`` has something to do next."""
        if self.state in (BrokerState.SHUTTING_DOWN, BrokerState.STOPPED):
            return None
        if self.in_flight is not None:
            return self.in_flight[1]
        return self.next_request_ms

    # -- answers -----------------------------------------------------------------
    def answered(self, kind: str, answer: dict, now_ms: int) -> None:
        """The controller accepted the request ``kind`` sent by ``poll``."""
        if self.in_flight is None or self.in_flight[0] != kind:
            return  # given up on already
        self.in_flight = None
        self.last_success_ms = now_ms
        if self.state in (BrokerState.SHUTTING_DOWN, BrokerState.STOPPED):
            return  # shutdown began while it was out
        if kind == "register":
            self.broker_epoch = answer["broker_epoch"]
            self.offline_recorded = False  # a new registration records none yet
            self.clean_shutdown = True
            self._set_state(BrokerState.FENCED)
            logger.info("broker %d registered with epoch %d", self.settings.broker_id,
                        self.broker_epoch)
            self.next_request_ms = now_ms  # heartbeat at once
            return
        self._set_state(BrokerState.FENCED if answer.get("is_fenced") else BrokerState.RUNNING)
        self.next_request_ms = now_ms + self.settings.heartbeat_interval_ms

    def failed(self, kind: str, code: str | None, now_ms: int) -> None:
        """The request ``kind`` was refused with ``code`` or got no answer
        (``code`` None: timed out, unreachable)."""
        if self.in_flight is None or self.in_flight[0] != kind:
            return
        self.in_flight = None
        if self.state in (BrokerState.SHUTTING_DOWN, BrokerState.STOPPED):
            return
        logger.warning("broker %d: %s failed: %s", self.settings.broker_id,
                       "registration" if kind == "register" else "heartbeat", code or "no answer")
        if kind == "heartbeat" and code in RE_REGISTER_CODES:
            self.broker_epoch = None
            self.metadata_caught_up = False
            self._set_state(BrokerState.STARTING)
            self.next_request_ms = now_ms
            return
        # A failed request is retried soon, not a whole interval later.
        self.next_request_ms = now_ms + min(self.settings.heartbeat_interval_ms,
                                            RETRY_BACKOFF_MS)
        self._maybe_fence_self(now_ms)

    def tick(self, now_ms: int) -> None:
        """A request past its deadline counts as failed."""
        if self.in_flight is not None and self.in_flight[1] <= now_ms:
            self.failed(self.in_flight[0], None, now_ms)

    def _maybe_fence_self(self, now_ms: int) -> None:
        if (self.state is BrokerState.RUNNING
                and now_ms - self.last_success_ms > self.settings.session_timeout_ms):
            # The controller has surely fenced us by now: stop acting as a
            # live broker until a heartbeat gets through.
            logger.warning("broker %d: no heartbeat got through for a whole session; "
                           "fencing itself", self.settings.broker_id)
            self._set_state(BrokerState.FENCED)

    # -- metadata ----------------------------------------------------------------
    def metadata_applied(self, image_offset: int, controller_offset: int | None,
                         now_ms: int) -> bool:
        """The broker's image reached ``image_offset``; the controller's log
        ended at ``controller_offset`` when it answered. True when the
        replication state should follow the image (it moved, or catching up
        just happened: news either way)."""
        before = self.metadata_offset
        was_caught_up = self.metadata_caught_up
        self.metadata_offset = image_offset
        self._update_caught_up(controller_offset)
        if image_offset == before and (was_caught_up or not self.metadata_caught_up):
            return False
        if (self.state is BrokerState.FENCED and self.broker_epoch is not None
                and image_offset >= self.broker_epoch):
            self.next_request_ms = min(self.next_request_ms, now_ms)  # ask to be unfenced
        return True

    def metadata_reset(self) -> None:
        """The image is being rebuilt from scratch."""
        self.metadata_offset = -1
        self.controller_offset = 0
        self.metadata_caught_up = False

    def _update_caught_up(self, controller_offset: int | None) -> None:
        if controller_offset is not None:
            self.controller_offset = controller_offset
        self.metadata_caught_up = (self.broker_epoch is not None and self.metadata_offset
                                   >= max(self.broker_epoch, self.controller_offset))

    # -- what the data plane asks ------------------------------------------------
    @property
    def fetch_ready(self) -> bool:
        """Whether the metadata is current enough to follow any leader."""
        return self.metadata_caught_up and self.broker_epoch is not None

    def not_serving_reason(self) -> str | None:
        """None when the broker may serve data, else why it may not."""
        if self.state not in (BrokerState.RUNNING, BrokerState.SHUTTING_DOWN):
            return f"its state is {self.state.value} (it has not caught up with the controller)"
        if not self.metadata_caught_up:
            return "it is replaying the metadata log"
        return None

    # -- shutdown ------------------------------------------------------------------
    def begin_shutdown(self) -> None:
        self._set_state(BrokerState.SHUTTING_DOWN)
        self.in_flight = None

    def stop(self) -> None:
        self._set_state(BrokerState.STOPPED)

    def _set_state(self, state: BrokerState) -> None:
        if state is self.state:
            return
        if state not in TRANSITIONS[self.state]:
            raise IllegalTransition(f"broker {self.settings.broker_id}: "
                                    f"{self.state.value} -> {state.value} is not allowed")
        logger.info("broker %d: %s -> %s", self.settings.broker_id, self.state.value,
                    state.value)
        self.state = state


def apply_noting(image: MetadataImage, record: Record, offset: int,
                 changed: dict[str, set[int] | None] | None
                 ) -> dict[str, set[int] | None] | None:
    """Apply ``record`` at ``offset`` to the broker's ``image`` and return
    ``changed`` with what it changed for the partitions a broker hosts
    (topic -> partitions, None for all of a topic's; None overall for
    everything): what the replication core revisits (``apply_image``)."""
    removed = (image.topic_names_by_id.get(record.topic_id)
               if isinstance(record, RemoveTopicRecord) else None)  # gone once applied
    image.apply(record, offset)
    return None if changed is None else _note_change(changed, record, image, removed)


def _note_change(changed: dict[str, set[int] | None], record: Record, image: MetadataImage,
                 removed: str | None) -> dict[str, set[int] | None] | None:
    """``changed`` with what ``record`` (just applied to ``image``) changed
    for the partitions a broker hosts; None when that is everything."""
    if isinstance(record, (PartitionRecord, PartitionChangeRecord)):
        name = image.topic_names_by_id.get(record.topic_id)
        if name is not None and changed.get(name, set()) is not None:
            changed.setdefault(name, set()).add(record.partition)
    elif isinstance(record, TopicRecord):
        changed[record.name] = None
    elif isinstance(record, RemoveTopicRecord):
        if removed is not None:
            changed[removed] = None
    elif isinstance(record, ConfigRecord):
        if record.resource_type == TOPIC_RESOURCE:
            changed[record.resource_name] = None
        elif record.resource_type == BROKER_RESOURCE:
            return None  # a broker or cluster default: any topic may use it
        # (client quotas and SCRAM credentials: no partition's concern)
    return changed
