"""The broker's HTTP server: data plane, admin, inspection and REST proxy.

One aiohttp application on the ``BROKER`` listener (docs/protocol.md lists
every endpoint and field):

  POST /v1/produce, /v1/fetch, /v1/offsets, /v1/metadata  data plane (data_api.py)
  POST /v1/admin/...                                      forwarded to the active controller
  POST /topics/{topic}, GET /topics/{topic}/partitions/{p}/records
                                                          REST Proxy v2 shapes (rest_proxy.py)
  GET  /healthz, /v1/cluster, /v1/brokers, /v1/topics, /v1/topics/{topic},
       /v1/quorum, /metrics                               inspection (JSON, Prometheus)

The server owns the broker's storage: it starts the ``LogManager`` (loading
every partition on disk) and a ``ReplicaManager`` that follows the metadata
image the ``BrokerLifecycle`` keeps. Bodies above ``socket.request.max.bytes``
are refused with ``MESSAGE_TOO_LARGE`` as soon as their declared length or
the bytes read pass the limit, before the rest is buffered.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable

import aiohttp
from aiohttp import web

from api.broker.authz import (BROKER_ROUTE_RULES, require_cluster_or_topics, require_topics,
                              topic_filter)
from api.broker.connections import ConnectionLimiter
from api.broker.data_api import INT64_MAX, DataApi
from api.broker.fetcher import FollowerFetchSender
from api.broker.groups.api import GroupApi
from api.broker.groups.service import OFFSETS_TOPIC, GroupService
from api.broker.isr import AlterPartitionSender
from api.broker.lifecycle import BrokerLifecycle
from api.broker.metrics import LOOP_LAG_PERIOD_S, BrokerMetrics
from api.broker.producers import ProducerApi, ProducerIdManager
from api.broker.kafka_listener import KafkaListener
from api.broker.console import Console
from api.broker.quotas import QuotaManager, request_quota_middleware
from api.broker.replica_manager import ReplicaManager
from api.broker.replication import ReplicationSettings, broker_url
from api.broker.rest_proxy import RestProxy
from api.broker.transactions.service import TRANSACTION_TOPIC, TransactionApi, TransactionService
from kraft.authorizer import (STANDARD_AUTHORIZER, AllowAll, Authorizer, auth_of,
                              authorization_middleware, check_routes_complete)
from kraft.client import ControllerClient
from kraft.config import BROKER_LISTENER, KAFKA_LISTENER, NodeConfig
from kraft.image import MetadataImage
from kraft.topic_config import defaults_from_broker_config
from protocol import acl, gc_pauses, tls, tokens, wire
from protocol.aio import wait_event
from protocol.errors import (ClusterAuthorizationFailedError, DelegationTokenAuthDisabledError,
                             DelegationTokenNotFoundError,
                             DelegationTokenRequestNotAllowedError, SecurityDisabledError,
                             UnknownTopicOrPartitionError)
from protocol.fields import Fields
from storage.cleaner import CleanerConfig
from storage.clock import wall_clock_ms
from storage.config import LogConfig
from storage.manager import TOPIC_NAME_MAX_CHARS, LogManager, LogManagerConfig, TopicPartition

logger = logging.getLogger(__name__)

#: How long the quorum proxy and leader-stat calls wait for another node.
PEER_CALL_TIMEOUT_S = 5.0
#: How long an admin call waits for this broker's metadata to show its change.
ADMIN_METADATA_WAIT_MS = 10_000
#: Default time an admin call may take at the controller.
ADMIN_TIMEOUT_MS = 30_000
#: How long one attempt of an admin call waits for a controller's answer.
ADMIN_ATTEMPT_TIMEOUT_MS = 10_000
TOPICS_PER_REQUEST_MAX = 1000

#: Admin endpoints and the controller paths they forward to.
ADMIN_ROUTES = {
    "/v1/admin/topics/create": "/v1/controller/topics/create",
    "/v1/admin/topics/delete": "/v1/controller/topics/delete",
    "/v1/admin/partitions/create": "/v1/controller/partitions/create",
    "/v1/admin/configs/describe": "/v1/controller/configs/describe",
    "/v1/admin/configs/alter": "/v1/controller/configs/alter",
    "/v1/admin/leaders/elect": "/v1/controller/leaders/elect",
    "/v1/admin/partitions/reassign": "/v1/controller/partitions/reassign",
    "/v1/admin/partitions/reassignments": "/v1/controller/partitions/reassignments",
    "/v1/admin/quotas/alter": "/v1/controller/quotas/alter",
    "/v1/admin/quotas/describe": "/v1/controller/quotas/describe",
    "/v1/admin/users/alter": "/v1/controller/users/alter",
    "/v1/admin/users/describe": "/v1/controller/users/describe",
    "/v1/admin/acls/create": "/v1/controller/acls/create",
    "/v1/admin/acls/delete": "/v1/controller/acls/delete",
}


#: Delegation token endpoints and the controller paths they forward to
#: (with the caller's principal as the token's owner or requester).
TOKEN_ROUTES = {
    "/v1/admin/tokens/create": "/v1/controller/tokens/create",
    "/v1/admin/tokens/renew": "/v1/controller/tokens/renew",
    "/v1/admin/tokens/expire": "/v1/controller/tokens/expire",
}
TOKEN_RENEWERS_MAX = 100
TOKEN_NAME_CHARS_MAX = 512  # a principal or an HMAC


#: Admin routes a password-authenticated (SCRAM) user may not call.
CERTIFICATE_ONLY_ROUTES = frozenset({"/v1/admin/users/alter", "/v1/admin/users/describe",
                                     "/v1/admin/quotas/alter"})


def replication_settings(config: NodeConfig) -> ReplicationSettings:
    """The replication core's settings from the node config (Kafka's names)."""
    settings = config.settings
    return ReplicationSettings(
        lag_time_max_ms=settings["replica.lag.time.max.ms"],
        fetch_wait_max_ms=settings["replica.fetch.wait.max.ms"],
        fetch_partition_bytes_max=settings["replica.fetch.max.bytes"],
        fetch_response_bytes_max=settings["replica.fetch.response.max.bytes"],
        num_fetchers=settings["num.replica.fetchers"],
        fetch_session_cache_slots=settings["max.incremental.fetch.session.cache.slots"],
        ack_before_replication=config.unsafe_ack_before_replication)


def _quorum_progress(view: dict) -> tuple:
    """How far along a controller's quorum view is: (term, commit index),
    -1 where a field is missing or not a number."""
    def number(key: str) -> int:
        value = view.get(key)
        return value if isinstance(value, int) and not isinstance(value, bool) else -1
    return (number("term"), number("commit_index"))


def _topics_named(body: dict) -> list[str]:
    """The topic names an admin request's ``topics`` list names (creations
    and partition additions name them so; other requests name none)."""
    topics = body.get("topics")
    if not isinstance(topics, list):
        return []
    return [item["name"] for item in topics
            if isinstance(item, dict) and isinstance(item.get("name"), str)]


class BrokerServer:
    def __init__(self, config: NodeConfig, lifecycle: BrokerLifecycle,
                 client: ControllerClient) -> None:
        self.config = config
        self.lifecycle = lifecycle
        self.client = client
        self.request_bytes_max = config.settings["socket.request.max.bytes"]
        self.log_manager = LogManager(
            LogManagerConfig.from_broker_config(config.settings),
            LogConfig.from_broker_config(config.settings),
            cleaner_config=CleanerConfig.from_broker_config(config.settings))
        self.replicas = ReplicaManager(
            config.node_id, self.log_manager, lifecycle.core, replication_settings(config),
            topic_defaults=defaults_from_broker_config(config.settings))
        peer_ssl = config.tls.peer if config.tls else None
        self.fetchers = FollowerFetchSender(self.replicas, peer_ssl)
        self.isr = AlterPartitionSender(self.replicas, client)
        self.replicas.fetch_sender = self.fetchers
        self.replicas.alter_sender = self.isr
        self.hw_checkpoint_interval_ms = config.settings[
            "replica.high.watermark.checkpoint.interval.ms"]
        self._hw_task: asyncio.Task | None = None
        self._lag_task: asyncio.Task | None = None
        # One high-watermark checkpoint write at a time (they share a temp file).
        self._hw_lock = asyncio.Lock()
        self.metrics = BrokerMetrics(self._partition_counts, self._leader_counts,
                                     self._replication_gauges)
        self.metrics.add_cleaner_gauges(self._cleaner_gauges)
        self.data = DataApi(self.replicas, self.metrics, self._not_serving_reason,
                            config.cluster_id, lambda: self.client.leader_id,
                            metadata_ready=lambda: self.lifecycle.metadata_caught_up)
        if config.unsafe_ack_before_replication:
            logger.warning("UNSAFE: unsafe.ack.before.replication is on: acks=all writes are "
                           "acknowledged before they are replicated and CAN BE LOST. This "
                           "setting exists only to prove the chaos checker catches it.")
        self.quotas = QuotaManager(
            lambda: self.lifecycle.image.client_quotas(), lambda: self.lifecycle.image.offset,
            config.settings["quota.window.num"], config.settings["quota.window.size.seconds"],
            time.monotonic)
        self.data.quotas = self.quotas
        self.metrics.add_quota_gauges(lambda: dict(self.quotas.throttled.ms_total))
        self.connections = ConnectionLimiter(config.settings)
        gc_pauses.observers.append(self.metrics.gc_full_pauses.observe)
        self.metrics.add_connection_gauges(lambda: {
            "total": self.connections.total, "refused": self.connections.refused,
            "idle_closed": self.connections.idle_closed})
        self.rest = RestProxy(self)
        self.groups = GroupService(
            config.node_id, self.replicas, self.data,
            lambda path, body: self.client.call(path, body, timeout_ms=ADMIN_TIMEOUT_MS),
            lambda: self.lifecycle.image, config.settings, self.replicas.clock_ms)
        self.groups.peer_ssl = peer_ssl
        self.group_api = GroupApi(self.groups, self._live_broker_urls)
        self.data.marker_listeners.append(self.groups.on_marker)
        self.producer_ids = ProducerIdManager(
            lambda path, body: self.client.call(path, body, timeout_ms=ADMIN_TIMEOUT_MS),
            lambda: self.lifecycle.core.broker_epoch, config.node_id)
        self.transactions = TransactionService(
            config.node_id, self.replicas, self.data,
            lambda path, body: self.client.call(path, body, timeout_ms=ADMIN_TIMEOUT_MS),
            # Wall time (storage/clock.py), not monotonic: transaction start
            # and update times are stored in __transaction_state and judged
            # by whichever broker coordinates next, after a failover.
            lambda: self.lifecycle.image, config.settings, wall_clock_ms,
            self.producer_ids)
        self.transactions.peer_ssl = peer_ssl
        self.transaction_api = TransactionApi(self.transactions, self._live_broker_urls)
        self.producer_api = ProducerApi(self.producer_ids, self.transactions)
        self.data.verify_txn = self.transactions.verify
        self.data.internal_topics = frozenset({OFFSETS_TOPIC, TRANSACTION_TOPIC})
        self.metrics.add_group_gauges(
            lambda: {(group,): count for group, count in self.groups.member_counts.items()},
            lambda: {(g, t, str(p)): lag for (g, t, p), lag in self.groups.lags.items()})
        self.authorizer: Authorizer | AllowAll = (
            Authorizer(lambda: self.lifecycle.image, config.acl,
                       ready=lambda: self.lifecycle.metadata_caught_up)
            if config.acl.enabled else AllowAll())
        self._runner: web.AppRunner | None = None
        self.kafka: KafkaListener | None = None
        self._session: aiohttp.ClientSession | None = None
        # Replaced by a fresh event after every metadata change.
        self._metadata_changed = asyncio.Event()
        lifecycle.add_listener(self._on_metadata)
        self.replicas.on_logs_opened = self._on_logs_opened
        self.replicas.on_dirs_offline = self._dirs_offline
        #: Set by the node: called when this broker cannot go on (every log
        #: dir offline); the node stops and exits non-zero.
        self.on_fatal: Callable[[str], None] | None = None
        self._fatal = False

    # -- start and stop --------------------------------------------------------
    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, self.log_manager.startup)
        self.lifecycle.core.clean_shutdown = self.log_manager.nothing_unflushed_lost
        self.lifecycle.core.min_insync_replicas = self.replicas.core.default_min_insync_replicas
        # The controller knows now what a crash lost: stop saying it.
        self.lifecycle.on_registered.append(self.log_manager.record_boot)
        await self.log_manager.start_background_tasks()
        self.groups.start()
        self.transactions.start()
        self._hw_task = asyncio.create_task(self._checkpoint_high_watermarks_loop(),
                                            name="high-watermark-checkpoint")
        self._lag_task = asyncio.create_task(self._measure_loop_lag(), name="event-loop-lag")
        self._session = tls.session(self.config.tls.peer if self.config.tls else None)
        app = web.Application(middlewares=[self._metrics_middleware, wire.error_middleware,
                                           self._size_middleware],
                              client_max_size=self.request_bytes_max)
        idle_ms = self.config.settings["connections.max.idle.ms"]
        app[wire.BODY_BYTES_MAX_KEY] = self.request_bytes_max
        app[wire.BODY_IDLE_MS_KEY] = idle_ms
        self.config.secure_app(app, self.config.listeners[BROKER_LISTENER],
                               lambda user: self.lifecycle.image.scram_credentials(user),
                               lambda: self.lifecycle.metadata_caught_up,
                               lambda token_id: self.lifecycle.image.delegation_tokens.get(
                                   token_id))
        self.data.add_routes(app)
        self.rest.add_routes(app)
        self.group_api.add_routes(app)
        self.producer_api.add_routes(app)
        self.transaction_api.add_routes(app)
        Console().add_routes(app)
        for path in ADMIN_ROUTES:
            app.router.add_post(path, self.handle_admin)
        app.router.add_post("/v1/admin/topics/describe", self.handle_describe_topics)
        app.router.add_get("/healthz", self.handle_health)
        app.router.add_get("/metrics", self.handle_metrics)
        app.router.add_get("/v1/cluster", self.handle_cluster)
        app.router.add_get("/v1/brokers", self.handle_brokers)
        app.router.add_get("/v1/topics", self.handle_topics)
        app.router.add_get("/v1/topics/{topic}", self.handle_topic)
        app.router.add_get("/v1/quorum", self.handle_quorum)
        app.router.add_get("/v1/log-dirs", self.handle_log_dirs)
        app.router.add_get("/v1/metrics/topics", self.handle_topic_counters)
        app.router.add_post("/v1/admin/acls/describe", self.handle_describe_acls)
        for path in TOKEN_ROUTES:
            app.router.add_post(path, self.handle_tokens)
        app.router.add_post("/v1/admin/tokens/describe", self.handle_describe_tokens)
        check_routes_complete(app, BROKER_ROUTE_RULES)
        app.middlewares.append(authorization_middleware(self.authorizer, BROKER_ROUTE_RULES))
        # Innermost: a request's time is its handler's, once authorized.
        app.middlewares.append(request_quota_middleware(self.quotas))
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=2.0,
                                     keepalive_timeout=idle_ms / 1000)
        await self._runner.setup()
        # Counted over both listeners; a request begun is aiohttp's to time.
        self.connections.guard_aiohttp(
            self._runner.server, lambda handler: getattr(handler, "_request_count", 1) > 0)
        endpoint = self.config.listeners[BROKER_LISTENER]
        await web.TCPSite(self._runner, endpoint.host, endpoint.port,
                          ssl_context=self.config.tls.server if endpoint.tls else None).start()
        logger.info("broker %d listening on %s", self.config.node_id, endpoint.url)
        kafka = self.config.listeners.get(KAFKA_LISTENER)
        if kafka is not None:
            self.kafka = KafkaListener(self, kafka, self.request_bytes_max, idle_ms)
            await self.kafka.start()
            logger.info("broker %d speaks Kafka's protocol on %s", self.config.node_id, kafka)

    async def _measure_loop_lag(self) -> None:
        """``kraftlog_event_loop_lag_seconds``: how late a timer runs."""
        loop = asyncio.get_running_loop()
        while True:
            due = loop.time() + LOOP_LAG_PERIOD_S
            await asyncio.sleep(LOOP_LAG_PERIOD_S)
            self.metrics.loop_lag.observe(max(0.0, loop.time() - due))

    async def stop(self) -> None:
        if self._lag_task is not None:
            self._lag_task.cancel()
            await asyncio.gather(self._lag_task, return_exceptions=True)
            self._lag_task = None
        if self.metrics.gc_full_pauses.observe in gc_pauses.observers:
            gc_pauses.observers.remove(self.metrics.gc_full_pauses.observe)
        if self.kafka is not None:
            await self.kafka.stop()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        await self.groups.stop()
        await self.transactions.stop()
        if self._session is not None:
            await self._session.close()
            self._session = None
        self.replicas.stop()
        await self.fetchers.stop()
        await self.isr.stop()
        if self._hw_task is not None:
            async with self._hw_lock:  # never cancel it in the middle of a write
                self._hw_task.cancel()
            await asyncio.gather(self._hw_task, return_exceptions=True)
            self._hw_task = None
        # A log being created on the replica manager's thread ends first.
        await asyncio.get_running_loop().run_in_executor(None, self.replicas.wait_for_creations)
        await self.log_manager.stop_background_tasks()
        if self.log_manager.started:
            try:
                await self._checkpoint_high_watermarks()
            except Exception:  # the logs must still close cleanly
                logger.exception("broker %d: cannot write the high-watermark checkpoint",
                                 self.config.node_id)
            await asyncio.get_running_loop().run_in_executor(None, self.log_manager.shutdown)

    async def _checkpoint_high_watermarks(self) -> None:
        async with self._hw_lock:
            snapshot = self.replicas.disk.high_watermark_snapshot(self.replicas.partitions)
            failed = await asyncio.get_running_loop().run_in_executor(
                None, self.replicas.disk.write_high_watermarks, snapshot)
            for directory, reason in sorted(failed.items()):
                self.log_manager.fail_dir(directory, f"high-watermark checkpoint: {reason}")

    async def _checkpoint_high_watermarks_loop(self) -> None:
        while True:
            await asyncio.sleep(self.hw_checkpoint_interval_ms / 1000)
            try:
                await self._checkpoint_high_watermarks()
            except Exception:  # the next round tries again
                logger.exception("broker %d: cannot write the high-watermark checkpoint",
                                 self.config.node_id)

    # -- metadata ----------------------------------------------------------------
    def _on_metadata(self, image: MetadataImage) -> None:
        try:
            self.replicas.apply_image(image, self.lifecycle.changed_topics)
            self._on_logs_opened()
        finally:
            self._wake_metadata_waiters()

    def _wake_metadata_waiters(self) -> None:
        changed, self._metadata_changed = self._metadata_changed, asyncio.Event()
        changed.set()

    def _dirs_offline(self, log_dirs: list[str], replicas: dict[str, list[int]]) -> None:
        """Log dirs went offline: the controller hears at once (heartbeat);
        with none left, the broker stops (Kafka halts then too), since it
        could neither lead nor follow anything."""
        self.lifecycle.report_offline(log_dirs, replicas)
        if not self.log_manager.online_dirs() and not self._fatal:
            self._fatal = True
            reason = "every log dir is offline after disk errors"
            logger.critical("broker %d: %s (%s); stopping", self.config.node_id, reason,
                            self.log_manager.offline_dirs)
            if self.on_fatal is not None:
                self.on_fatal(reason)

    def _on_logs_opened(self) -> None:
        """The coordinators load or unload their shards for the partitions
        this broker now leads or no longer leads."""
        try:
            self.groups.on_metadata()
            self.transactions.on_metadata()
        finally:
            self._wake_metadata_waiters()

    async def wait_for_metadata(self, offset: int, timeout_ms: int, *,
                                opened: Iterable[str] = ()) -> bool:
        """Wait until this broker's image has reached ``offset`` and every
        log of the topics ``opened`` that it gives this broker is open."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_ms / 1000
        opened = list(opened)
        while self.lifecycle.image.offset < offset or self.replicas.opening(opened):
            remaining = deadline - loop.time()
            if remaining <= 0:
                return False
            if not await wait_event(self._metadata_changed, remaining):
                return False
        return True

    def _not_serving_reason(self) -> str | None:
        return self.lifecycle.core.not_serving_reason()

    def _partition_counts(self) -> dict[tuple, float]:
        return {(): len(self.replicas.partitions)}

    def _leader_counts(self) -> dict[tuple, float]:
        return {(): sum(1 for p in self.replicas.partitions.values() if p.is_leader)}

    def _cleaner_gauges(self) -> dict[str, float]:
        manager = self.log_manager
        stats = manager.cleaner_stats
        last = stats.last_run_monotonic
        return {"max_dirty_percent": manager.max_dirty_percent(),
                "recopy_percent": stats.last_recopy_percent,
                "time_since_last_run": -1 if last is None else time.monotonic() - last,
                "last_pass_seconds": stats.last_seconds, "passes": stats.passes,
                "bytes_read": stats.bytes_read, "bytes_cleaned": stats.bytes_written,
                "passes_failed": stats.passes_failed,
                "passes_discarded": stats.passes_discarded, "running": len(manager.cleaning)}

    def _replication_gauges(self) -> dict[str, float]:
        parts = self.replicas.partitions.values()
        image = self.lifecycle.image
        return {
            "under_replicated": sum(1 for p in parts if p.under_replicated),
            "under_min_isr": sum(1 for p in parts if p.under_min_isr),
            # Cluster-wide, from the metadata: partitions with no leader.
            "offline": sum(1 for t in image.topics.values()
                           for reg in t.partitions.values() if reg.leader < 0),
            "isr_shrinks": self.replicas.isr_shrinks,
            "isr_expands": self.replicas.isr_expands,
            "log_dirs_offline": len(self.log_manager.offline_dirs),
            "unflushed_logs": self.log_manager.unflushed_log_count(),
            "offline_replicas": len(self.replicas.core.offline),
            **self.replicas.core.fetch_session_figures(),
            **self.data.stream_counts(),
        }

    # -- middlewares -------------------------------------------------------------
    @web.middleware
    async def _size_middleware(self, request: web.Request, handler) -> web.StreamResponse:
        length = request.content_length
        if length is not None and length > self.request_bytes_max:
            raise wire.BodyTooLargeError(
                f"request body of {length} bytes exceeds socket.request.max.bytes "
                f"({self.request_bytes_max}); send smaller requests")
        return await handler(request)

    @web.middleware
    async def _metrics_middleware(self, request: web.Request, handler) -> web.StreamResponse:
        started = time.perf_counter()
        route = request.match_info.route.resource
        api = route.canonical if route is not None else "unmatched"
        status = 500
        try:
            response = await handler(request)
            status = response.status
            return response
        except asyncio.CancelledError:
            status = 499  # the client went away first (nginx's convention)
            raise
        finally:
            self.metrics.requests.inc(1, api, str(status))
            self.metrics.latency.observe(time.perf_counter() - started, api)

    # -- admin -------------------------------------------------------------------
    async def forward_admin(self, controller_path: str, body: dict) -> dict:
        """Send an admin request to the active controller and wait until this
        broker's metadata shows its effect."""
        timeout_ms = body.get("timeout_ms") if isinstance(body.get("timeout_ms"), int) \
            else ADMIN_TIMEOUT_MS
        # A controller that took the request is given time to commit it: asked
        # again after a heartbeat interval (the default per attempt), a slow
        # commit of a create would answer the retry TOPIC_ALREADY_EXISTS.
        # One that cannot be reached is still left at once for the others.
        answer = await self.client.call(
            controller_path, body, timeout_ms=timeout_ms,
            request_timeout_ms=min(timeout_ms, ADMIN_ATTEMPT_TIMEOUT_MS))
        offset = answer.get("metadata_offset") if isinstance(answer, dict) else None
        if isinstance(offset, int):
            # A topic created (or grown) through this broker: also until
            # its new logs here are open, so a produce to this broker right
            # after finds its partitions.
            await self.wait_for_metadata(offset, ADMIN_METADATA_WAIT_MS,
                                         opened=_topics_named(body))
        return answer

    async def handle_admin(self, request: web.Request) -> web.Response:
        body = await wire.read_body(request)
        route = request.match_info.route.resource.canonical
        auth = auth_of(request)
        if not auth.enabled and route in CERTIFICATE_ONLY_ROUTES \
                and request.get(tls.PROOF_KEY) in tls.NOT_A_NODE:
            # Without ACLs: a SCRAM user may not make users or change quotas
            # (nor take over another user's password).
            raise ClusterAuthorizationFailedError(
                f"{route} is for administrators, who authenticate with a client "
                "certificate: a SCRAM user may not manage users or quotas (with ACLs on, "
                "ALTER on the cluster allows it)")
        if auth.enabled:
            self._authorize_admin(auth, route, body)
        elif route.startswith("/v1/admin/acls/"):
            raise SecurityDisabledError(
                "ACLs are off on this cluster: set authorizer.class.name = "
                f"{STANDARD_AUTHORIZER} (and super.users) on every node to use them")
        path = ADMIN_ROUTES[route]
        return wire.respond(request, await self.forward_admin(path, body))

    @staticmethod
    def _authorize_admin(auth, route: str, body) -> None:
        """The per-resource checks of the admin routes that have them (the
        others' CLUSTER operation is the middleware's). All or nothing: a
        request that names a resource the caller may not touch is refused
        whole, naming it."""
        values = body if isinstance(body, dict) else {}

        def names(key: str, field: str | None = "name") -> list[str]:
            items = values.get(key)
            if not isinstance(items, list):
                return []
            if field is None:
                return [item for item in items if isinstance(item, str)]
            return [item.get(field) for item in items
                    if isinstance(item, dict) and isinstance(item.get(field), str)]

        if route == "/v1/admin/topics/create":
            require_cluster_or_topics(auth, acl.CREATE, names("topics"), "CreateTopics")
        elif route == "/v1/admin/topics/delete":
            require_topics(auth, acl.DELETE, names("topics", None), "DeleteTopics")
        elif route == "/v1/admin/partitions/create":
            require_topics(auth, acl.ALTER, names("topics"), "CreatePartitions")
        elif route in ("/v1/admin/configs/describe", "/v1/admin/configs/alter"):
            op = acl.DESCRIBE_CONFIGS if route.endswith("describe") else acl.ALTER_CONFIGS
            for item in values.get("resources") or ():
                if not isinstance(item, dict):
                    continue
                if item.get("type") == "topic" and isinstance(item.get("name"), str):
                    auth.require(op, acl.TOPIC, item["name"], "configs")
                else:
                    auth.require(op, acl.CLUSTER, acl.CLUSTER_NAME, "broker configs")

    async def handle_describe_acls(self, request: web.Request) -> web.Response:
        """DescribeAcls, from this broker's metadata: the ACLs a filter
        (protocol/acl.py; none: every ACL) matches."""
        if not auth_of(request).enabled:
            raise SecurityDisabledError(
                "ACLs are off on this cluster: set authorizer.class.name = "
                f"{STANDARD_AUTHORIZER} (and super.users) on every node to use them")
        body = Fields(await wire.read_body(request), "")
        acl_filter = acl.filter_from_wire(body.values.get("filter") or {})
        self.data.check_metadata_current()
        return wire.respond(request, {"acls": [
            b.to_wire() for b in self.lifecycle.image.acl_bindings()
            if acl.filter_matches(acl_filter, b)]})

    # -- delegation tokens (protocol/tokens.py) -------------------------------------
    def _token_caller(self, request: web.Request) -> str:
        """The principal asking about tokens: a user authenticated with a
        password or a certificate (Kafka: not with a token, nor anonymously)."""
        if not self.config.token_secret:
            raise DelegationTokenAuthDisabledError(
                "this cluster makes no delegation tokens: set delegation.token.secret.key.file "
                "(the same secret) on every node")
        principal = tls.principal_of(request)
        if request.get(tls.PROOF_KEY) not in ("password", "certificate"):
            raise DelegationTokenRequestNotAllowedError(
                "delegation tokens are made, renewed and expired by users authenticated with "
                "a password or a certificate on an SSL or SASL_SSL listener, not with a token "
                f"nor as {tls.ANONYMOUS}")
        return principal

    async def handle_tokens(self, request: web.Request) -> web.Response:
        """CreateDelegationToken, RenewDelegationToken, ExpireDelegationToken:
        the caller is the new token's owner, or must own or renew it."""
        principal = self._token_caller(request)
        secret = self.config.token_secret
        body = Fields(await wire.read_body(request), "")
        route = request.match_info.route.resource.canonical
        if route.endswith("/create"):
            answer = await self.forward_admin(TOKEN_ROUTES[route], {
                "owner": principal, "requester": principal,
                "renewers": body.strings("renewers", TOKEN_RENEWERS_MAX, TOKEN_NAME_CHARS_MAX,
                                         default=[]),
                "max_lifetime_ms": body.integer("max_lifetime_ms", -1, INT64_MAX, default=-1)})
            token = dict(answer["token"])
            token["hmac"] = tokens.token_hmac(secret, token["token_id"])
            return wire.respond(request, {"token": token})
        token_id = body.string("token_id", tokens.TOKEN_ID_CHARS_MAX)
        if not tokens.genuine(secret, token_id, body.string("hmac", TOKEN_NAME_CHARS_MAX)):
            raise DelegationTokenNotFoundError("no such delegation token")
        period = "renew_period_ms" if route.endswith("/renew") else "expiry_period_ms"
        answer = await self.forward_admin(TOKEN_ROUTES[route], {
            "token_id": token_id, "requester": principal,
            period: body.integer(period, -1, INT64_MAX, default=-1)})
        return wire.respond(request, {"expiration_timestamp_ms":
                                      answer["expiration_timestamp_ms"]})

    async def handle_describe_tokens(self, request: web.Request) -> web.Response:
        """DescribeDelegationToken, from this broker's metadata: the tokens
        the caller owns or renews (with ACLs on, a super user sees all),
        of ``owners`` if given, each with its HMAC."""
        principal = self._token_caller(request)
        body = Fields(await wire.read_body(request), "")
        owners = body.strings("owners", TOKEN_RENEWERS_MAX, TOKEN_NAME_CHARS_MAX, default=None)
        self.data.check_metadata_current()
        auth = auth_of(request)
        sees_all = auth.enabled and auth.authorizer.is_super_user(principal)
        return wire.respond(request, {"tokens": [
            {**token.to_wire(), "hmac": tokens.token_hmac(self.config.token_secret, token_id)}
            for token_id, token in sorted(self.lifecycle.image.delegation_tokens.items())
            if (sees_all or token.may_renew(principal))
            and (owners is None or token.owner in owners)]})

    async def handle_describe_topics(self, request: web.Request) -> web.Response:
        body = Fields(await wire.read_body(request), "")
        names = body.strings("topics", TOPICS_PER_REQUEST_MAX, TOPIC_NAME_MAX_CHARS,
                             default=None)
        self.data.check_metadata_current()
        auth = auth_of(request)
        answer = self.data.metadata(names, topic_filter(auth), eligible=True)
        may_see_configs = topic_filter(auth, acl.DESCRIBE_CONFIGS)
        found = [topic["name"] for topic in answer["topics"]
                 if topic["error"] is None and may_see_configs(topic["name"])]
        if found:
            # Every config with its value and source, as the controller knows them.
            described = await self.client.call("/v1/controller/configs/describe", {
                "resources": [{"type": "topic", "name": name} for name in found]},
                timeout_ms=ADMIN_TIMEOUT_MS)
            configs = {r["name"]: r["configs"] for r in described["resources"]
                       if r.get("error") is None}
            for topic in answer["topics"]:
                if topic["name"] in found:
                    topic["configs"] = configs.get(topic["name"], [])
        return wire.respond(request, answer, pieces=False)  # no records: packed in C

    # -- inspection --------------------------------------------------------------
    async def handle_health(self, request: web.Request) -> web.Response:
        lifecycle = self.lifecycle
        return wire.respond(request, {
            "status": "ok", "node_id": self.config.node_id, "role": "broker",
            "state": lifecycle.state.value, "broker_epoch": lifecycle.broker_epoch,
            "presence": lifecycle.presence_held, "metadata_offset": lifecycle.image.offset,
            "partitions": len(self.replicas.partitions)})

    async def handle_metrics(self, request: web.Request) -> web.Response:
        return web.Response(text=self.metrics.render(),
                            content_type="text/plain", charset="utf-8",
                            headers={"X-Content-Type-Options": "nosniff"})

    def _brokers(self) -> list[dict]:
        image = self.lifecycle.image
        return [{"id": b.broker_id, "epoch": b.broker_epoch, "endpoints": b.endpoints,
                 "url": broker_url(image, b.broker_id), "rack": b.rack, "fenced": b.fenced,
                 "in_controlled_shutdown": b.in_controlled_shutdown,
                 "leaders": len(image.partitions_led_by(b.broker_id)),
                 "offline_log_dirs": list(b.offline_log_dirs),
                 "offline_replicas": sum(len(ps) for ps in b.offline_replicas.values())}
                for _, b in sorted(image.brokers.items())]

    async def handle_cluster(self, request: web.Request) -> web.Response:
        image = self.lifecycle.image
        return wire.respond(request, {
            "cluster_id": self.config.cluster_id,
            "controller_id": self.client.leader_id,
            "controllers": {str(nid): url for nid, url in self.config.controller_urls.items()},
            "metadata_offset": image.offset,
            "brokers": self._brokers(),
        })

    def _live_broker_urls(self) -> dict[int, str]:
        image = self.lifecycle.image
        return {broker: url for broker in sorted(image.live_broker_ids())
                if (url := broker_url(image, broker)) is not None}

    async def handle_log_dirs(self, request: web.Request) -> web.Response:
        """Kafka's DescribeLogDirs: each live broker's log directories, their
        disk and what is in them (``?local=true``: this broker's alone;
        ``?partitions=true``: with every replica's size and offsets)."""
        replicas = request.query.get("partitions") in ("1", "true")
        return await self._every_broker(request, "/v1/log-dirs", lambda: self._log_dirs(
            replicas), {"partitions": str(replicas).lower()})

    async def handle_topic_counters(self, request: web.Request) -> web.Response:
        """Each live broker's per-topic counters (records and bytes in by
        produce, out by fetch, since it started; ``?local=true``: this
        broker's): a console turns two readings into cluster-wide rates."""
        return await self._every_broker(request, "/v1/metrics/topics", lambda: {
            "broker_id": self.config.node_id, "topics": self.metrics.topic_counters()})

    async def _every_broker(self, request: web.Request, path: str, local: Callable[[], dict],
                            params: dict | None = None) -> web.Response:
        """``local()`` for this broker (alone with ``?local=true``), and the
        same ``path`` asked of every other live broker: ``{"brokers": [...],
        "unreachable_brokers": [...]}``."""
        if request.query.get("local") in ("1", "true"):
            return wire.respond(request, local())
        answers: list[dict] = [local()]
        errors: list[dict] = []
        peers = {b: url for b, url in self._live_broker_urls().items()
                 if b != self.config.node_id}

        async def ask(url: str) -> dict:
            if self._session is None:
                raise ConnectionError("this broker is shutting down")
            async with self._session.get(
                    f"{url}{path}", params={**(params or {}), "local": "true"},
                    headers={"Accept": wire.JSON},
                    timeout=aiohttp.ClientTimeout(total=PEER_CALL_TIMEOUT_S)) as response:
                answer = await response.json()
                if response.status != 200:
                    raise ConnectionError(str(answer.get("error")))
                return answer

        found = await asyncio.gather(*(ask(url) for url in peers.values()),
                                     return_exceptions=True)
        for broker, answer in zip(peers, found):
            if isinstance(answer, BaseException):
                errors.append({"broker_id": broker, "error": f"{type(answer).__name__}: "
                                                            f"{answer}"})
            else:
                answers.append(answer)
        return wire.respond(request, {
            "brokers": sorted(answers, key=lambda a: a["broker_id"]),
            "unreachable_brokers": errors})

    def _log_dirs(self, replicas: bool) -> dict:
        dirs = []
        for entry in self.log_manager.describe_dirs():
            logs = entry.pop("logs")
            entry["partitions"] = len(logs)
            if replicas:
                entry["replicas"] = []
                for tp, size in logs:
                    part = self.replicas.partitions.get(tp)
                    entry["replicas"].append({
                        "topic": tp.topic, "partition": tp.partition, "size_bytes": size,
                        "leader": bool(part is not None and part.is_leader),
                        "log_start_offset": part.log_start_offset if part else None,
                        "log_end_offset": part.log_end_offset if part else None})
            dirs.append(entry)
        return {"broker_id": self.config.node_id, "log_dirs": dirs}

    async def handle_brokers(self, request: web.Request) -> web.Response:
        return wire.respond(request, {"brokers": self._brokers()})

    async def handle_topics(self, request: web.Request) -> web.Response:
        image = self.lifecycle.image
        visible = topic_filter(auth_of(request))
        topics = [{"name": t.name, "topic_id": t.topic_id, "partitions": len(t.partitions),
                   "replication_factor": len(t.partitions[0].replicas) if t.partitions else 0}
                  for _, t in sorted(image.topics.items()) if visible(t.name)]
        return wire.respond(request, {"topics": topics})

    async def handle_topic(self, request: web.Request) -> web.Response:
        """Per partition: the registration from the metadata, and the log's
        offsets and size as its leader reports them (``?local=true``: only
        the partitions this broker hosts, as this broker sees them;
        ``?producers=true``: with the idempotent producers each knows)."""
        name = request.match_info["topic"]
        auth = auth_of(request)
        auth.require(acl.DESCRIBE, acl.TOPIC, name)  # before existence: Kafka's rule
        image = self.lifecycle.image
        topic = image.topics.get(name)
        if topic is None:
            raise UnknownTopicOrPartitionError(f"topic {name!r} does not exist")
        producers = request.query.get("producers") in ("1", "true")
        if producers:
            auth.require(acl.READ, acl.TOPIC, name, "its producers")
        if request.query.get("local") in ("1", "true"):
            now_ms = self.replicas.clock_ms()
            return wire.respond(request, {"name": name, "partitions": [
                part.describe(now_ms, producers)
                for tp, part in sorted(self.replicas.partitions.items()) if tp.topic == name]})
        stats = await self._leader_stats(name, topic.partitions, producers)
        partitions = []
        for p, reg in sorted(topic.partitions.items()):
            entry = {"partition": p, "leader": reg.leader, "leader_epoch": reg.leader_epoch,
                     "partition_epoch": reg.partition_epoch, "replicas": reg.replicas,
                     "isr": reg.isr, "elr": reg.elr, "last_known_leader": reg.last_known_leader,
                     "adding_replicas": reg.adding_replicas,
                     "removing_replicas": reg.removing_replicas,
                     "log_start_offset": None, "high_watermark": None,
                     "last_stable_offset": None,
                     "log_end_offset": None, "size_bytes": None, "replica_states": None}
            if producers:
                entry["producers"] = None
            found = stats.get(p)
            if found is not None:
                for key in ("log_start_offset", "high_watermark", "last_stable_offset",
                            "log_end_offset", "size_bytes", "replica_states",
                            "cleaner") + (
                                ("producers",) if producers else ()):
                    entry[key] = found.get(key)
            partitions.append(entry)
        configs = image.topic_configs(name) \
            if auth.allowed(acl.DESCRIBE_CONFIGS, acl.TOPIC, name) else None
        return wire.respond(request, {"name": name, "topic_id": topic.topic_id,
                                      "configs": configs, "partitions": partitions})

    async def _leader_stats(self, name: str, registrations: dict, producers: bool = False
                            ) -> dict[int, dict]:
        """Each partition's log figures, from the broker that leads it."""
        stats: dict[int, dict] = {}
        remote: set[int] = set()
        for p, reg in registrations.items():
            part = self.replicas.partitions.get(TopicPartition(name, p))
            if part is not None and part.is_leader:
                stats[p] = part.describe(self.replicas.clock_ms(), producers)
            elif reg.leader >= 0 and reg.leader != self.config.node_id:
                remote.add(reg.leader)

        async def ask(leader: int) -> None:
            url = broker_url(self.lifecycle.image, leader)
            if url is None or self._session is None:
                return
            try:
                async with self._session.get(
                        f"{url}/v1/topics/{name}",
                        params={"local": "true", **({"producers": "true"} if producers else {})},
                        headers={"Accept": wire.JSON},
                        timeout=aiohttp.ClientTimeout(total=PEER_CALL_TIMEOUT_S)) as response:
                    answer = await response.json()
            except (aiohttp.ClientError, asyncio.TimeoutError, ValueError, OSError):
                return
            for entry in answer.get("partitions", ()):
                reg = registrations.get(entry.get("partition"))
                if reg is not None and reg.leader == leader and entry.get("role") == "leader":
                    stats[entry["partition"]] = entry

        await asyncio.gather(*(ask(leader) for leader in sorted(remote)))
        return stats

    async def handle_quorum(self, request: web.Request) -> web.Response:
        """Ask the controllers; answer with the leader's view (it alone knows
        every voter's match index), else the view of the controller furthest
        along (highest term, then commit index): a controller removed from
        the voters may never hear of the changes made after it left, and
        must not speak for the quorum when the leader is slow to answer."""
        answers = await asyncio.gather(*(self._quorum_of(nid) for nid in self.client.voter_urls))
        views = [a for a in answers if a is not None]
        if not views:
            return wire.respond(request, {"error": {
                "code": "NOT_CONTROLLER",
                "message": f"no controller answered (voters {self.client.voter_urls})"}}, 503)
        leaders = [v for v in views if v.get("state") == "leader"]
        return wire.respond(request, max(leaders or views, key=_quorum_progress))

    async def _quorum_of(self, node_id: int) -> dict | None:
        try:
            return await self.client.get_json(node_id, "/v1/quorum", PEER_CALL_TIMEOUT_S)
        except (aiohttp.ClientError, asyncio.TimeoutError, ValueError, OSError):
            return None

    # -- calling other brokers (REST proxy) -----------------------------------------
    @property
    def session(self) -> aiohttp.ClientSession:
        assert self._session is not None, "server not started"
        return self._session
