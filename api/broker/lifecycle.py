"""A broker's side of the control plane over HTTP: register, heartbeat, follow metadata.

What to send and when, the broker's states and what an answer changes are
decided by ``lifecycle_core.LifecycleCore`` (see its docstring for the state
table); this shell sends its requests to the active controller and feeds it
the answers and the time.

Metadata follows by long-poll: ``after_offset`` = the image's offset; records
are applied in order to the broker's own ``MetadataImage``; a controller
whose history does not reach back that far sends a snapshot instead.
``add_listener`` callbacks see every change (the replication core becomes
leader or follower of its partitions from them).
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Callable

from api.broker.lifecycle_core import (RE_REGISTER_CODES, RETRY_BACKOFF_MS, BrokerState,
                                       LifecycleCore, LifecycleSettings, apply_noting)
from kraft.client import ControllerClient
from kraft.config import NodeConfig
from kraft.image import MetadataImage
from kraft.records import decode
from protocol.aio import wait_event
from protocol.errors import KraftError, MetadataApplyError

logger = logging.getLogger(__name__)

__all__ = ["BrokerLifecycle", "BrokerState", "RE_REGISTER_CODES", "RETRY_BACKOFF_MS"]

#: How long the metadata stream may stay silent before the broker looks for
#: the active controller again (the controller writes an empty frame every
#: second when nothing commits: ``METADATA_STREAM_KEEPALIVE_S``).
METADATA_STREAM_SILENCE_S = 5.0
#: The pause before the presence stream (``brokers/presence``) is asked for
#: again after a refusal or a failure to connect.
PRESENCE_RETRY_S = 0.1


def monotonic_ms() -> int:
    return int(time.monotonic() * 1000)


class BrokerLifecycle:
    def __init__(self, config: NodeConfig, client: ControllerClient) -> None:
        self.config = config
        self.client = client
        self.broker_id = config.node_id
        self.incarnation_id = uuid.uuid4().hex  # new per process start
        self.core = LifecycleCore(LifecycleSettings(
            broker_id=config.node_id, incarnation_id=self.incarnation_id,
            endpoints={name: endpoint.registered for name, endpoint in config.listeners.items()
                       if name != "CONTROLLER"},
            rack=config.rack, heartbeat_interval_ms=config.heartbeat_interval_ms,
            session_timeout_ms=config.session_timeout_ms), monotonic_ms())
        self.image = MetadataImage()
        self._listeners: list[Callable[[MetadataImage], None]] = []
        #: What the records behind the latest notification of the listeners
        #: changed: topic -> its changed partitions (None: all of them), or
        #: None for everything (a snapshot, a cluster-wide config). Listeners
        #: use it to revisit only those partitions.
        self.changed_topics: dict[str, set[int] | None] | None = None
        self._tasks: list[asyncio.Task] = []
        #: Called after each registration the controller accepted.
        self.on_registered: list[Callable[[], None]] = []
        # Set when the core may have a request due sooner than it said.
        self._wake = asyncio.Event()
        # Set by each accepted registration: the presence stream opens at
        # once, before the heartbeats that unfence this broker.
        self._registered = asyncio.Event()
        # Set by stop(): the loops end even if a cancellation is lost (in
        # Python 3.11, wait_for swallows one that races its own result).
        self._stopping = False
        #: Whether the active controller holds this broker's presence stream
        #: now (``/healthz`` reports it): until it does, a kill -9 of this
        #: process is noticed only when its session lapses.
        self.presence_held = False

    # -- the core's state, for the rest of the broker ---------------------------
    @property
    def state(self) -> BrokerState:
        return self.core.state

    @property
    def broker_epoch(self) -> int | None:
        return self.core.broker_epoch

    @broker_epoch.setter
    def broker_epoch(self, value: int | None) -> None:
        self.core.broker_epoch = value

    @property
    def metadata_caught_up(self) -> bool:
        return self.core.metadata_caught_up

    @property
    def endpoints(self) -> dict[str, str]:
        return dict(self.core.settings.endpoints)

    def add_listener(self, listener: Callable[[MetadataImage], None]) -> None:
        self._listeners.append(listener)

    def report_offline(self, log_dirs: list[str], replicas: dict[str, list[int]]) -> None:
        """``LifecycleCore.report_offline``, with the heartbeat sent at once."""
        self.core.report_offline(log_dirs, replicas, monotonic_ms())
        self._wake.set()

    # -- lifecycle --------------------------------------------------------
    async def start(self) -> None:
        self._tasks = [asyncio.create_task(self._control_loop(), name="broker-heartbeat"),
                       asyncio.create_task(self._metadata_loop(), name="broker-metadata"),
                       asyncio.create_task(self._presence_loop(), name="broker-presence")]

    async def stop(self) -> None:
        self._stopping = True
        self._wake.set()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []
        self.core.stop()

    async def controlled_shutdown(self, timeout_ms: int) -> bool:
        """Ask the controller to move this broker's leaderships away; True
        once it says the broker may exit, False if that took too long."""
        if self.core.broker_epoch is None:
            return True  # never registered: nothing leads here
        self.core.begin_shutdown()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_ms / 1000
        while loop.time() < deadline:
            remaining_ms = int((deadline - loop.time()) * 1000)
            try:
                answer = await self.client.call(
                    "/v1/controller/brokers/heartbeat",
                    self.core.heartbeat_body(want_shutdown=True),
                    timeout_ms=max(1, min(remaining_ms, self.core.settings.heartbeat_timeout_ms)))
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

    # -- registration and heartbeats: the core decides, this loop sends -----
    async def _control_loop(self) -> None:
        while not self._stopping:
            self._wake.clear()
            now_ms = monotonic_ms()
            self.core.tick(now_ms)
            request = self.core.poll(now_ms)
            if request is not None:
                try:
                    answer = await self.client.call(
                        f"/v1/controller/brokers/{request.kind}", request.body,
                        timeout_ms=request.timeout_ms)
                except KraftError as exc:
                    self.core.failed(request.kind, getattr(exc, "code", None), monotonic_ms())
                except Exception:
                    logger.exception("broker %d: %s failed", self.broker_id, request.kind)
                    self.core.failed(request.kind, None, monotonic_ms())
                else:
                    self.core.answered(request.kind, answer, monotonic_ms())
                    if request.kind == "register" and self.core.broker_epoch is not None:
                        self._registered.set()
                        for callback in self.on_registered:
                            callback()
                continue
            wake_ms = self.core.next_wake_ms()
            timeout_s = None if wake_ms is None else max(0.0, (wake_ms - monotonic_ms()) / 1000)
            await wait_event(self._wake, timeout_s)

    # -- presence ---------------------------------------------------------
    async def _presence_loop(self) -> None:
        """Keep a connection open to the active controller while registered
        (``ControllerServer.handle_presence``). If this process dies, its
        kernel closes the connection and the controller fences the broker
        at once instead of after the session timeout; heartbeats remain
        what keeps the session. Nothing else closes it but a new active
        controller or a new registration (silence does not: a broker cut
        off for a while must not look dead when the network heals)."""
        while not self._stopping:
            self._registered.clear()
            epoch = self.core.broker_epoch
            if epoch is None:
                await wait_event(self._registered, PRESENCE_RETRY_S)
                continue

            def release(node_id: int, epoch: int = epoch) -> bool:
                leader = self.client.leader_id
                return (self._stopping or self.core.broker_epoch != epoch
                        or (leader is not None and leader != node_id))

            def opened(node_id: int) -> None:
                self.presence_held = True

            started = time.monotonic()
            try:
                await self.client.hold(
                    "/v1/controller/brokers/presence",
                    {"broker_id": self.broker_id, "broker_epoch": epoch},
                    release=release, opened=opened)
                if time.monotonic() - started > PRESENCE_RETRY_S:
                    continue  # held, then ended or let go: open it again at once
            except KraftError as exc:
                logger.debug("broker %d: presence stream: %s", self.broker_id, exc)
            except Exception:
                logger.exception("broker %d: presence stream failed", self.broker_id)
            finally:
                self.presence_held = False
            await asyncio.sleep(PRESENCE_RETRY_S)

    # -- metadata ---------------------------------------------------------
    async def _metadata_loop(self) -> None:
        """Follow the metadata log on the active controller's stream
        (``metadata/stream``), opened again from this image's offset each
        time it ends: the controller changed, or went quiet."""
        while not self._stopping:
            try:
                await self.client.follow(
                    "/v1/controller/metadata/stream",
                    lambda: {"after_offset": self.image.offset},
                    lambda answer: self._apply(answer) and not self._stopping,
                    silence_s=METADATA_STREAM_SILENCE_S)
            except KraftError as exc:
                if getattr(exc, "code", None) == "OFFSET_OUT_OF_RANGE":
                    # The metadata log is shorter than our copy (a controller
                    # restored from an older state): start over from it.
                    logger.error("broker %d: metadata offset %d is beyond the controller's "
                                 "log; reloading metadata", self.broker_id, self.image.offset)
                    self._reset_image()
                    continue
                logger.info("broker %d: metadata fetch failed: %s", self.broker_id, exc)
                await asyncio.sleep(RETRY_BACKOFF_MS / 1000)
            except Exception:
                logger.exception("broker %d: metadata loop error", self.broker_id)
                await asyncio.sleep(RETRY_BACKOFF_MS / 1000)

    def _reset_image(self) -> None:
        self.image = MetadataImage()
        self.core.metadata_reset()

    def _apply(self, answer: dict) -> bool:
        """Take in one answer of the metadata stream; False when the image
        was reset (the stream is then opened again from the start)."""
        changed: dict[str, set[int] | None] | None = {}
        if "snapshot" in answer:
            self.image = MetadataImage.from_snapshot(answer["snapshot"])
            changed = None
        else:
            try:
                for offset, raw in answer.get("records", ()):
                    if offset <= self.image.offset:
                        continue  # already applied (a retried fetch)
                    changed = apply_noting(self.image, decode(raw), offset, changed)
            except (MetadataApplyError, KraftError) as exc:
                # Our copy disagrees with the log: start over from a snapshot.
                logger.critical("broker %d: metadata record refused (%s); reloading",
                                self.broker_id, exc)
                self._reset_image()
                return False
        controller_offset = answer.get("offset", self.image.offset)
        if not isinstance(controller_offset, int):
            controller_offset = 0
        if self.core.offline_log_dirs:  # disk errors: does the metadata record them yet?
            own = self.image.brokers.get(self.core.settings.broker_id)
            self.core.registration_seen(
                own.broker_epoch if own else None, own.offline_log_dirs if own else [],
                own.offline_replicas if own else {}, self.image.topic_names_by_id)
        if not self.core.metadata_applied(self.image.offset, controller_offset, monotonic_ms()):
            return True  # nothing new to act on (catching up is news: replication may start)
        self._wake.set()  # a heartbeat may be due at once (to be unfenced)
        self.changed_topics = changed
        for listener in self._listeners:
            try:
                listener(self.image)
            except Exception:
                logger.exception("broker %d: metadata listener failed", self.broker_id)
        return True

