"""A broker's side of the control plane: register, heartbeat, follow metadata.

States (``BrokerState``; only ``BrokerLifecycle`` changes them)::

    STARTING --registered--> FENCED --controller unfences--> RUNNING
    FENCED/RUNNING --lease lapsed, re-registered, or want_fence--> FENCED
    FENCED/RUNNING --controlled_shutdown()--> SHUTTING_DOWN --should_shut_down--> STOPPED
    any --stop()--> STOPPED

Registration gives the broker its epoch (the offset of its registration
record). It starts fenced: it may lead nothing until it has fetched the
metadata log at least up to its own registration and a heartbeat has told the
controller so. Heartbeats (every ``broker.heartbeat.interval.ms``) renew its
lease; if the controller hears nothing for ``broker.session.timeout.ms`` it
fences the broker and moves its leaderships. A heartbeat refused with
``STALE_BROKER_EPOCH`` or ``BROKER_ID_NOT_REGISTERED`` makes the broker
register again.

Metadata follows by long-poll: ``after_offset`` = the image's offset; records
are applied in order to the broker's own ``MetadataImage``; a controller
whose history does not reach back that far sends a snapshot instead.
``add_listener`` callbacks see every change (the data plane will use them to
become leader or follower of its partitions).
"""

from __future__ import annotations

import asyncio
import enum
import logging
import uuid
from collections.abc import Callable

from kraft.client import ControllerClient
from kraft.config import NodeConfig
from kraft.errors import KraftError, MetadataApplyError
from kraft.image import MetadataImage
from kraft.records import decode

logger = logging.getLogger(__name__)

#: Longest wait of one metadata long-poll.
METADATA_POLL_MS = 5000
#: Pause after a failed registration, heartbeat or metadata fetch.
RETRY_BACKOFF_MS = 100

RE_REGISTER_CODES = frozenset({"STALE_BROKER_EPOCH", "BROKER_ID_NOT_REGISTERED"})


class BrokerState(enum.Enum):
    STARTING = "starting"
    FENCED = "fenced"
    RUNNING = "running"
    SHUTTING_DOWN = "shutting_down"
    STOPPED = "stopped"


class BrokerLifecycle:
    def __init__(self, config: NodeConfig, client: ControllerClient) -> None:
        self.config = config
        self.client = client
        self.broker_id = config.node_id
        self.incarnation_id = uuid.uuid4().hex  # new per process start
        self.broker_epoch: int | None = None
        self.state = BrokerState.STARTING
        self.image = MetadataImage()
        # True when the image holds everything the controller had when it last
        # answered, and at least this broker's registration: only then is an
        # absence in the image (a deleted topic) real rather than not yet
        # replayed. False again while a reload replays from scratch.
        self.metadata_caught_up = False
        self._listeners: list[Callable[[MetadataImage], None]] = []
        self._tasks: list[asyncio.Task] = []
        # Set when a heartbeat should go now rather than at the next interval.
        self._heartbeat_now = asyncio.Event()

    def add_listener(self, listener: Callable[[MetadataImage], None]) -> None:
        self._listeners.append(listener)

    @property
    def endpoints(self) -> dict[str, str]:
        return {name: str(endpoint) for name, endpoint in self.config.listeners.items()
                if name != "CONTROLLER"}

    # -- lifecycle --------------------------------------------------------
    async def start(self) -> None:
        self._tasks = [asyncio.create_task(self._heartbeat_loop(), name="broker-heartbeat"),
                       asyncio.create_task(self._metadata_loop(), name="broker-metadata")]

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []
        self._set_state(BrokerState.STOPPED)

    async def controlled_shutdown(self, timeout_ms: int) -> bool:
        """Ask the controller to move this broker's leaderships away; True
        once it says the broker may exit, False if that took too long."""
        if self.broker_epoch is None:
            return True  # never registered: nothing leads here
        self._set_state(BrokerState.SHUTTING_DOWN)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_ms / 1000
        while loop.time() < deadline:
            remaining_ms = int((deadline - loop.time()) * 1000)
            try:
                answer = await self._send_heartbeat(want_shutdown=True,
                                                    timeout_ms=max(1, remaining_ms))
                if answer.get("should_shut_down"):
                    logger.info("broker %d: controlled shutdown complete", self.broker_id)
                    return True
            except KraftError as exc:
                logger.warning("broker %d: controlled shutdown heartbeat failed: %s",
                               self.broker_id, exc)
            await asyncio.sleep(min(0.1, max(0.0, deadline - loop.time())))
        logger.warning("broker %d: controlled shutdown did not finish in %d ms",
                       self.broker_id, timeout_ms)
        return False

    def _set_state(self, state: BrokerState) -> None:
        if state != self.state:
            logger.info("broker %d: %s -> %s", self.broker_id, self.state.value, state.value)
            self.state = state

    # -- registration and heartbeats --------------------------------------
    async def _heartbeat_loop(self) -> None:
        loop = asyncio.get_running_loop()
        interval_s = self.config.heartbeat_interval_ms / 1000
        last_success = loop.time()
        while True:
            self._heartbeat_now.clear()
            succeeded = False
            try:
                if self.broker_epoch is None:
                    await self._register()
                elif self.state is not BrokerState.SHUTTING_DOWN:
                    await self._heartbeat()
                succeeded = True
                last_success = loop.time()
            except KraftError as exc:
                logger.warning("broker %d: %s failed: %s", self.broker_id,
                               "registration" if self.broker_epoch is None else "heartbeat",
                               exc)
                if getattr(exc, "code", None) in RE_REGISTER_CODES \
                        and self.state is not BrokerState.SHUTTING_DOWN:
                    self.broker_epoch = None
                    self._set_state(BrokerState.STARTING)
                    continue
            except Exception:
                logger.exception("broker %d: heartbeat loop error", self.broker_id)
            if (not succeeded and self.state is BrokerState.RUNNING
                    and loop.time() - last_success > self.config.session_timeout_ms / 1000):
                # The controller has surely fenced us by now: stop acting as
                # a live broker until a heartbeat gets through.
                logger.warning("broker %d: no heartbeat got through for a whole session; "
                               "fencing itself", self.broker_id)
                self._set_state(BrokerState.FENCED)
            # A failed heartbeat is retried soon, not a whole interval later.
            wait_s = interval_s if succeeded and self.broker_epoch is not None \
                else min(interval_s, RETRY_BACKOFF_MS / 1000)
            try:
                await asyncio.wait_for(self._heartbeat_now.wait(), wait_s)
            except asyncio.TimeoutError:
                pass

    async def _register(self) -> None:
        answer = await self.client.call("/v1/controller/brokers/register", {
            "broker_id": self.broker_id,
            "incarnation_id": self.incarnation_id,
            "endpoints": self.endpoints,
            "rack": self.config.rack,
        }, timeout_ms=self.config.session_timeout_ms)
        self.broker_epoch = answer["broker_epoch"]
        self._set_state(BrokerState.FENCED)
        logger.info("broker %d registered with epoch %d", self.broker_id, self.broker_epoch)
        self._heartbeat_now.set()

    async def _heartbeat(self) -> None:
        answer = await self._send_heartbeat()
        if self.state in (BrokerState.SHUTTING_DOWN, BrokerState.STOPPED):
            return  # shutdown began while this heartbeat was in flight
        if answer.get("is_fenced"):
            self._set_state(BrokerState.FENCED)
        else:
            self._set_state(BrokerState.RUNNING)

    async def _send_heartbeat(self, *, want_shutdown: bool = False,
                              timeout_ms: int | None = None) -> dict:
        # Half a session: a heartbeat that cannot get through in that time
        # leaves the next one time to, before the lease lapses.
        timeout_ms = timeout_ms or max(1, self.config.session_timeout_ms // 2)
        return await self.client.call("/v1/controller/brokers/heartbeat", {
            "broker_id": self.broker_id,
            "broker_epoch": self.broker_epoch,
            "metadata_offset": self.image.offset,
            "want_fence": False,
            "want_shutdown": want_shutdown,
        }, timeout_ms=timeout_ms)

    # -- metadata ---------------------------------------------------------
    async def _metadata_loop(self) -> None:
        while True:
            try:
                answer = await self.client.call(
                    "/v1/controller/metadata",
                    {"after_offset": self.image.offset, "max_wait_ms": METADATA_POLL_MS},
                    timeout_ms=METADATA_POLL_MS + self.config.session_timeout_ms,
                    request_timeout_ms=METADATA_POLL_MS + 2000)
                self._apply(answer)
            except KraftError as exc:
                if getattr(exc, "code", None) == "OFFSET_OUT_OF_RANGE":
                    # The metadata log is shorter than our copy (a controller
                    # restored from an older state): start over from it.
                    logger.error("broker %d: metadata offset %d is beyond the controller's "
                                 "log; reloading metadata", self.broker_id, self.image.offset)
                    self.image = MetadataImage()
                    self.metadata_caught_up = False
                    continue
                logger.info("broker %d: metadata fetch failed: %s", self.broker_id, exc)
                await asyncio.sleep(RETRY_BACKOFF_MS / 1000)
            except Exception:
                logger.exception("broker %d: metadata loop error", self.broker_id)
                await asyncio.sleep(RETRY_BACKOFF_MS / 1000)

    def _apply(self, answer: dict) -> None:
        before = self.image.offset
        if "snapshot" in answer:
            self.image = MetadataImage.from_snapshot(answer["snapshot"])
        else:
            try:
                for offset, raw in answer.get("records", ()):
                    if offset <= self.image.offset:
                        continue  # already applied (a retried fetch)
                    self.image.apply(decode(raw), offset)
            except (MetadataApplyError, KraftError) as exc:
                # Our copy disagrees with the log: start over from a snapshot.
                logger.critical("broker %d: metadata record refused (%s); reloading",
                                self.broker_id, exc)
                self.image = MetadataImage()
                self.metadata_caught_up = False
                return
        controller_offset = answer.get("offset", self.image.offset)
        was_caught_up = self.metadata_caught_up
        self.metadata_caught_up = (self.broker_epoch is not None and self.image.offset >= max(
            self.broker_epoch, controller_offset if isinstance(controller_offset, int) else 0))
        if self.image.offset == before and (was_caught_up or not self.metadata_caught_up):
            return  # nothing new to act on (catching up is news: replication may start)
        if (self.state is BrokerState.FENCED and self.broker_epoch is not None
                and self.image.offset >= self.broker_epoch):
            self._heartbeat_now.set()  # caught up: ask to be unfenced now
        for listener in self._listeners:
            try:
                listener(self.image)
            except Exception:
                logger.exception("broker %d: metadata listener failed", self.broker_id)
