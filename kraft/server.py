"""The controller process: the quorum, the controller core and their HTTP API.

Who is active. The Raft leader becomes the *active controller* once it has
committed a barrier (a ``NoOpRecord``) in its term: from then on its image
holds every committed record, so what it decides is decided on current
state. Only the active controller answers writes, heartbeats and metadata
fetches; the others answer ``NOT_CONTROLLER`` with the leader's id and URL
when they know it. A leader cut off from the majority keeps believing it is
active until ``controller.quorum.fetch.timeout.ms`` passes (then pysyncobj
steps it down); meanwhile it can still answer requests that write nothing,
such as heartbeats. Its writes fail. The config requires that timeout to be
below ``broker.session.timeout.ms``, so such a renewal never outlives a
session. A leader that is not active yet (barrier in flight) holds
the request until it is, for at most ``ACTIVATION_WAIT_MS``.

Writes. Requests that may write queue up for one committer task (group
commit): it takes every request waiting, up to ``GROUP_WRITES_MAX``, lets
the core compute each one's records in turn, each on the image the earlier
ones leave (a scratch copy), and has the quorum commit all of them as one
batch tagged with the offset of the image it was computed on; then it
answers them all. So N concurrent clients share one Raft round trip instead
of taking N in turn. The committer does not wait for one group to commit
before it proposes the next (a pipeline of up to ``PIPELINE_DEPTH``): the
next group is computed on the image the one in flight will leave, and its
batch names that one (its token), so a replica applies it only right after
it. Requests are decided in arrival order exactly as if committed one by
one. A batch that meets a different image (leadership moved meanwhile) is
rejected by every replica, and so is every batch computed on it; their
writes are computed again, at most ``WRITE_ATTEMPTS`` times. After a batch
whose fate is unknown (a timeout), the ones computed on it may still
commit, and are answered so.

Time. ``clock_ms`` (monotonic) is a parameter; lease expiry and periodic
leader rebalancing are decided by the core's ``tick`` and written as records,
never computed inside ``apply``.

Endpoints (controller listener; msgpack or JSON bodies, see protocol/wire.py):

  POST /v1/controller/brokers/register     broker registration
  POST /v1/controller/brokers/heartbeat    lease renewal, fence/unfence, shutdown
  POST /v1/controller/brokers/presence     held open by a live broker (see handle_presence)
  POST /v1/controller/metadata             long-poll for records after an offset
  POST /v1/controller/metadata/stream      held open by a broker: records as they commit
  POST /v1/controller/topics/create        create topics
  POST /v1/controller/topics/delete        delete topics
  POST /v1/controller/partitions/create    add partitions
  POST /v1/controller/configs/describe     describe topic configs
  POST /v1/controller/configs/alter        incremental alter topic configs
  POST /v1/controller/quotas/alter         set or remove client quotas
  POST /v1/controller/quotas/describe      every client quota
  POST /v1/controller/users/alter          add, replace or delete SCRAM credentials
  POST /v1/controller/users/describe       users and their SCRAM mechanisms
  POST /v1/controller/partitions/alter     AlterPartition (ISR, leader recovery) from leaders
  POST /v1/controller/partitions/alter-many  many AlterPartitions of one leader at once
  POST /v1/controller/leaders/elect        preferred leader election
  POST /v1/controller/partitions/reassign  start or cancel partition reassignments
  POST /v1/controller/partitions/reassignments  list reassignments in progress (read only)
  POST /v1/controller/quorum/add-voter     add a controller to the voters (KIP-853 AddRaftVoter)
  POST /v1/controller/quorum/remove-voter  remove one (RemoveRaftVoter; the leader hands over first)
  GET  /v1/quorum                          Raft status (any controller)
  GET  /v1/metadata                        this controller's image as JSON
  GET  /healthz
"""

from __future__ import annotations

import asyncio
import base64
import collections
import dataclasses
import logging
import os
import time
from collections.abc import Callable
from typing import Any

import aiohttp
import msgpack
from aiohttp import web

from kraft.authorizer import (AllowAll, Authorizer, RouteRule, authorization_middleware,
                              check_routes_complete)
from kraft.config import NodeConfig
from kraft.controller import (INT32_MAX, INT64_MAX, Controller, ControllerResult,
                              ControllerSettings)
from kraft import membership
from kraft.image import MetadataImage
from kraft.membership import MembershipRefused, Voter, stale_state_message
from kraft.quorum import ApplyStatus, MetadataQuorum, RaftSettings
from kraft.records import NoOpRecord, decode
from protocol import acl, tls, wire
from protocol.aio import wait_event
from protocol.errors import (CodedError, InvalidRequestError, KraftError, NotControllerError,
                             RequestTimedOutError, StaleBrokerEpochError, UnknownServerError)
from protocol.fields import Fields
from storage.clock import expiry_clock_ms, wall_clock_ms


#: How each controller route is authorized (kraft/authorizer.py). Brokers
#: and administrators' tools call these; Kafka's equivalents need
#: CLUSTER_ACTION (a forwarded admin request is an Envelope, checked at the
#: broker the client called, whose certificate then calls here).
_CLUSTER_ACTION_PATHS = (
    "brokers/register", "brokers/heartbeat", "brokers/presence", "metadata", "metadata/stream",
    "topics/create",
    "topics/delete", "partitions/create", "configs/alter", "quotas/alter", "quotas/describe",
    "users/alter", "users/describe", "acls/create", "acls/delete", "tokens/create", "tokens/renew",
    "tokens/expire", "partitions/alter", "partitions/alter-many", "leaders/elect",
    "partitions/reassign", "producer_ids/allocate", "configs/describe",
    "partitions/reassignments")
CONTROLLER_ROUTE_RULES: dict[tuple[str, str], RouteRule] = {
    **{("POST", f"/v1/controller/{path}"): RouteRule(path, acl.CLUSTER_ACTION)
       for path in _CLUSTER_ACTION_PATHS},
    # Kafka's AddRaftVoter and RemoveRaftVoter: ALTER on the CLUSTER.
    ("POST", "/v1/controller/quorum/add-voter"): RouteRule("AddRaftVoter", acl.ALTER),
    ("POST", "/v1/controller/quorum/remove-voter"): RouteRule("RemoveRaftVoter", acl.ALTER),
    ("GET", "/v1/quorum"): RouteRule("DescribeQuorum", acl.DESCRIBE),
    ("GET", "/v1/metadata"): RouteRule("the metadata image", acl.CLUSTER_ACTION),
    ("GET", "/healthz"): RouteRule("health", open=True),
}

logger = logging.getLogger(__name__)

#: How long a write may wait for the quorum to commit it.
COMMIT_TIMEOUT_MS = 5000
#: How long adding a controller waits, by default and at most, for it to
#: catch up as a learner before it becomes a voter.
VOTER_CATCH_UP_TIMEOUT_MS = 30_000
#: How long the active controller waits for a controller it is asked to add
#: to say who it is (GET /healthz at its CONTROLLER listener).
VOTER_IDENTITY_TIMEOUT_S = 5.0
VOTER_CATCH_UP_TIMEOUT_MS_MAX = 300_000
#: How long a request waits for a freshly elected leader to become active.
ACTIVATION_WAIT_MS = 3000
#: Recomputations of a batch that met a different image.
WRITE_ATTEMPTS = 3
#: Groups of writes in flight at once: each is computed on the image the
#: one before it leaves and proposed without waiting for it to commit.
PIPELINE_DEPTH = 4
#: Most write requests committed together as one batch (see ``write``), and
#: the records a group stops taking more writes at (one Raft entry, applied
#: under the image lock on every controller, must stay small).
GROUP_WRITES_MAX = 64
GROUP_RECORDS_MAX = 20_000
#: Longest long-poll a broker may ask for.
METADATA_WAIT_MS_MAX = 30_000
#: A broker's metadata stream (``metadata/stream``): a frame with no records
#: at least this often, so the broker can tell a quiet controller from a
#: dead or paused one (api/broker/lifecycle.py gives up after 5 s).
METADATA_STREAM_KEEPALIVE_S = 1.0
#: A broker's presence stream (``brokers/presence``): how often the active
#: controller looks whether the broker's connection closed, and writes a
#: byte so the broker can tell a dead controller from a quiet one.
PRESENCE_CHECK_S = 0.05
PRESENCE_KEEPALIVE_S = 1.0
#: How long a closed presence stream may stay closed before the broker is
#: taken for dead and fenced: a live broker whose connection broke reopens
#: it at once; a killed one never does.
PRESENCE_GRACE_S = 0.5
#: Request bodies the controller accepts (bytes).
CONTROLLER_REQUEST_BYTES_MAX = 8 * 1024 * 1024
#: How long stopping waits for the controller's tasks to end, and how often
#: it cancels again meanwhile (see cancel_until_done).
STOP_TASKS_TIMEOUT_S = 5.0
CANCEL_RETRY_S = 0.2


def monotonic_ms() -> int:
    return int(time.monotonic() * 1000)


async def cancel_until_done(tasks: list[asyncio.Task], timeout_s: float) -> list[asyncio.Task]:
    """Cancel ``tasks`` and wait for them to end, cancelling again while any
    runs; those still running after ``timeout_s``.

    One ``cancel()`` is not always enough on Python 3.11: ``asyncio.wait_for``
    swallows a cancellation that arrives just as the future it waits on
    completes (fixed in 3.12), and a loop around such a wait then runs on.
    The chaos harness's rolling restarts caught a controller that never
    stopped this way, right after it became active.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    pending = {task for task in tasks if not task.done()}
    while pending:
        for task in pending:
            task.cancel()
        remaining = deadline - loop.time()
        if remaining <= 0:
            break
        _, pending = await asyncio.wait(pending, timeout=min(CANCEL_RETRY_S, remaining))
    return list(pending)


def _settle(future: asyncio.Future, *, result: Any = None,
            error: BaseException | None = None) -> None:
    """Answer a waiting write, unless it is answered already."""
    if future.done():
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)


def raft_secret(config: NodeConfig) -> bytes | None:
    """The secret this controller's Raft traffic is authenticated with: the
    configured one; for a lone voter without one, a random one (no peer has
    to know it, and nothing on this machine can then speak to its Raft
    port); otherwise none, which the config allows only on loopback."""
    if config.raft_secret is not None:
        return config.raft_secret
    if len(config.voters) == 1 and not config.joins_quorum:
        return base64.urlsafe_b64encode(os.urandom(32))
    logger.warning("controller %d: the Raft port is unauthenticated (no "
                   "controller.quorum.secret.file): anything on this machine that can "
                   "connect to it can run code in this process", config.node_id)
    return None


@dataclasses.dataclass
class _Outcome:
    """What a write in a group is answered once the group commits."""
    entry: "_Write"
    response: Any
    offset: int          # the image offset its records (or the ones before it) reach
    wrote: bool          # it added records
    error: BaseException | None = None  # a refusal decided on uncommitted records


@dataclasses.dataclass(eq=False)
class _Write:
    """One write request waiting for the committer (``ControllerServer.write``)."""
    compute: Callable[[MetadataImage], ControllerResult]
    future: asyncio.Future
    taken: bool = False     # in a group being committed: it will be answered
    dropped: bool = False   # its caller gave up before it was taken: skip it
    attempts: int = 0       # times computed on an image that then changed


@dataclasses.dataclass(eq=False)
class _Batch:
    """A group of writes in the committer's pipeline."""
    group: list[_Write]
    planned: list[_Outcome]
    records: list
    image: MetadataImage            # the image its records leave: the next group's base
    token: int | None               # its proposal's token (the chain's, if no records)
    own_state: tuple                # the core's own state before it was computed
    task: asyncio.Future | None     # its proposal; None: no records of its own


def _retrieve(task: asyncio.Future) -> None:
    """A proposal's outcome is read by the committer, unless the batch was
    given up on (one before it failed): read it here so it is never
    reported as lost."""
    if not task.cancelled():
        task.exception()


class ControllerServer:
    """One controller: ``await start()``, ``await stop()``."""

    def __init__(self, config: NodeConfig, *,
                 clock_ms: Callable[[], int] = monotonic_ms) -> None:
        assert config.is_controller
        self.config = config
        self.clock_ms = clock_ms
        raft_addresses = {nid: str(config.raft_endpoint(nid)) for nid in config.voters}
        self._secret_made_up = config.raft_secret is None and len(config.voters) == 1 \
            and not config.joins_quorum
        self.quorum = MetadataQuorum(
            config.node_id, raft_addresses, config.metadata_log_dir,
            RaftSettings(election_timeout_ms=config.election_timeout_ms,
                         fetch_timeout_ms=config.fetch_timeout_ms,
                         secret=raft_secret(config)),
            urls=config.controller_urls, self_address=str(config.own_raft_endpoint))
        self.core = Controller(ControllerSettings.from_node(config))
        self._loop: asyncio.AbstractEventLoop | None = None
        self._write_lock = asyncio.Lock()
        self._membership_busy = asyncio.Lock()
        # Write requests waiting for the committer task, in arrival order.
        self._writes: collections.deque[_Write] = collections.deque()
        self._writes_waiting = asyncio.Event()
        self._committer: asyncio.Task | None = None
        # Since start: writes that committed records, and the Raft batches
        # that carried them (``/v1/quorum`` reports both: their ratio is the
        # group commit's average group).
        self._writes_committed = 0
        self._write_batches = 0
        # Batches proposed while another was still in flight (the pipeline).
        self._pipelined_batches = 0
        # Raft term in which this node became active; None while not active.
        self._active_term: int | None = None
        self._activation: asyncio.Task | None = None
        # Replaced (after being set) on every quorum event: long-polls wait on it.
        self._changed = asyncio.Event()
        self._tasks: list[asyncio.Task] = []
        self._stopping = False
        self._runner: web.AppRunner | None = None
        self.tick_interval_ms = max(10, min(100, config.session_timeout_ms // 10))
        # Presence streams open now, by broker id; departures waiting out
        # their grace (see handle_presence).
        self._presence: collections.Counter[int] = collections.Counter()
        self._departures: dict[int, asyncio.TimerHandle] = {}

    # -- lifecycle --------------------------------------------------------
    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self.quorum.add_listener(self._on_quorum_event_threadsafe)
        self.quorum.start()
        app = web.Application(middlewares=[wire.error_middleware],
                              client_max_size=CONTROLLER_REQUEST_BYTES_MAX)
        idle_ms = self.config.settings["connections.max.idle.ms"]
        app[wire.BODY_BYTES_MAX_KEY] = CONTROLLER_REQUEST_BYTES_MAX
        app[wire.BODY_IDLE_MS_KEY] = idle_ms
        # Never SASL_SSL (refused): no passwords to check here.
        self.config.secure_app(app, self.config.controller_endpoint)
        self.add_routes(app)
        # Its ACLs are the cluster's once it is the active controller (its
        # barrier applied): before, only super users (the nodes) are served,
        # as Kafka's authorizer answers "not ready" until its first load.
        authorizer = (Authorizer(lambda: self.quorum.image, self.config.acl,
                                 ready=lambda: self.is_active, lock=self.quorum.image_lock)
                      if self.config.acl.enabled else AllowAll())
        check_routes_complete(app, CONTROLLER_ROUTE_RULES)
        app.middlewares.append(authorization_middleware(authorizer, CONTROLLER_ROUTE_RULES))
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=2.0,
                                     keepalive_timeout=idle_ms / 1000)
        await self._runner.setup()
        endpoint = self.config.controller_endpoint
        await web.TCPSite(self._runner, endpoint.host, endpoint.port,
                          ssl_context=self.config.tls.server if endpoint.tls else None).start()
        self._tasks.append(asyncio.create_task(self._tick_loop(), name="controller-tick"))
        logger.info("controller %d listening on %s", self.config.node_id, endpoint.url)

    async def stop(self) -> None:
        self._stopping = True  # no new activation, no more ticks
        self._forget_departures()
        tasks = self._tasks + [t for t in (self._activation, self._committer) if t is not None]
        left = await cancel_until_done(tasks, STOP_TASKS_TIMEOUT_S)
        self._fail_writes(lambda: self.not_controller("stopping"))
        if left:
            logger.warning("controller %d: tasks still running after %.0f s of stopping: %s",
                           self.config.node_id, STOP_TASKS_TIMEOUT_S,
                           ", ".join(t.get_name() for t in left))
        if self._runner is not None:
            await self._runner.cleanup()
        await asyncio.get_running_loop().run_in_executor(None, self.quorum.stop)

    def add_routes(self, app: web.Application) -> None:
        post = {
            "brokers/register": self.handle_register,
            "brokers/heartbeat": self.handle_heartbeat,
            "brokers/presence": self.handle_presence,
            "metadata": self.handle_metadata,
            "metadata/stream": self.handle_metadata_stream,
            "topics/create": self._writer(lambda c: c.create_topics),
            "topics/delete": self._writer(lambda c: c.delete_topics),
            "partitions/create": self._writer(lambda c: c.create_partitions),
            "configs/alter": self._writer(lambda c: c.alter_configs),
            "quotas/alter": self._writer(lambda c: c.alter_client_quotas),
            "quotas/describe": self._reader(lambda c: c.describe_client_quotas),
            "users/alter": self._writer(lambda c: c.alter_users),
            "users/describe": self._reader(lambda c: c.describe_users),
            "acls/create": self._writer(lambda c: c.create_acls),
            "acls/delete": self._writer(lambda c: c.delete_acls),
            "tokens/create": self._timed_writer(lambda c: c.create_delegation_token),
            "tokens/renew": self._timed_writer(lambda c: c.renew_delegation_token),
            "tokens/expire": self._timed_writer(lambda c: c.expire_delegation_token),
            "partitions/alter": self._writer(lambda c: c.alter_partition),
            "partitions/alter-many": self._writer(lambda c: c.alter_partitions),
            "leaders/elect": self._writer(lambda c: c.elect_leaders),
            "partitions/reassign": self._writer(lambda c: c.alter_partition_reassignments),
            "producer_ids/allocate": self._writer(lambda c: c.allocate_producer_ids),
            "configs/describe": self._reader(lambda c: c.describe_configs),
            "partitions/reassignments": self._reader(lambda c: c.list_partition_reassignments),
        }
        for path, handler in post.items():
            app.router.add_post(f"/v1/controller/{path}", handler)
        app.router.add_post("/v1/controller/quorum/add-voter", self.handle_add_voter)
        app.router.add_post("/v1/controller/quorum/remove-voter", self.handle_remove_voter)
        app.router.add_get("/v1/quorum", self.handle_quorum)
        app.router.add_get("/v1/metadata", self.handle_image)
        app.router.add_get("/healthz", self.handle_health)

    # -- who is active ----------------------------------------------------
    def _on_quorum_event_threadsafe(self) -> None:  # raft tick thread
        loop = self._loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(self._on_quorum_event)

    def _on_quorum_event(self) -> None:
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()
        if self._stopping:
            return
        term = self.quorum.raftCurrentTerm
        if not self.quorum.is_leader:
            if self._active_term is not None:
                logger.info("controller %d is no longer active", self.config.node_id)
            self._active_term = None
            self._forget_departures()
        elif self._active_term != term and self._activation is None:
            self._active_term = None
            self._forget_departures()
            self._activation = asyncio.create_task(self._activate(term))

    async def _activate(self, term: int) -> None:
        """Commit a barrier in ``term``; once applied, the image is current."""
        try:
            async with self._write_lock:
                await self.quorum.propose([NoOpRecord()], None, COMMIT_TIMEOUT_MS / 1000)
                if self.quorum.is_leader and self.quorum.raftCurrentTerm == term:
                    with self.quorum.image_lock:
                        self.core.become_active(self.quorum.image, self.clock_ms())
                    self._active_term = term
                    logger.info("controller %d is active (term %d)", self.config.node_id, term)
        except KraftError as exc:
            logger.info("controller %d: activation in term %d failed: %s",
                        self.config.node_id, term, exc)
        finally:
            self._activation = None
            self._on_quorum_event()  # leadership may have moved meanwhile

    @property
    def is_active(self) -> bool:
        return (self._active_term is not None and self.quorum.is_leader
                and self.quorum.raftCurrentTerm == self._active_term)

    def not_controller(self, why: str) -> NotControllerError:
        leader_id = self.quorum.leader_id()
        if leader_id == self.config.node_id:
            leader_id = None  # ourselves, not yet active: no better hint
        error = NotControllerError(
            f"controller {self.config.node_id} is not the active controller ({why})"
            + (f"; the leader is controller {leader_id}" if leader_id is not None else
               "; no leader is known yet, retry shortly"),
            leader_id=leader_id)
        if leader_id is not None:
            error.leader_url = self.voter_url(leader_id)
        return error

    def voter_url(self, node_id: int | None) -> str | None:
        """A controller's URL: the log's voter set first (controllers that
        joined), then the static voters."""
        voter = self.quorum.voters().get(node_id) if node_id is not None else None
        if voter is not None and voter.url:
            return voter.url
        endpoint = self.config.voters.get(node_id) if node_id is not None else None
        return endpoint.url if endpoint is not None else None

    async def _await_active(self) -> None:
        deadline = time.monotonic() + ACTIVATION_WAIT_MS / 1000
        while not self.is_active:
            if not self.quorum.is_leader:
                raise self.not_controller("not the Raft leader")
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise self.not_controller("elected but not yet active")
            await wait_event(self._changed, remaining)

    # -- writing ----------------------------------------------------------
    async def write(self, compute: Callable[[MetadataImage], ControllerResult]) -> dict:
        """Compute records on the current image and commit them atomically;
        the request's answer, with ``metadata_offset``: the offset of its
        last record (or of the image it saw, if it wrote none), which
        brokers wait for before answering an admin call. Committed in a
        group with whatever other writes are waiting (see the module doc)."""
        await self._await_active()
        if self._stopping:
            raise self.not_controller("stopping")
        entry = _Write(compute, asyncio.get_running_loop().create_future())
        self._writes.append(entry)
        self._writes_waiting.set()
        if self._committer is None or self._committer.done():
            self._committer = asyncio.create_task(self._commit_loop(), name="controller-commit")
        try:
            async with asyncio.timeout(COMMIT_TIMEOUT_MS / 1000):
                return await asyncio.shield(entry.future)
        except TimeoutError:
            if not entry.taken:
                entry.dropped = True
                raise RequestTimedOutError(
                    f"the controller is busy: no turn to write within {COMMIT_TIMEOUT_MS} ms; "
                    "retry") from None
            try:  # being committed: the quorum's own timeouts bound it, this is a backstop
                return await asyncio.wait_for(asyncio.shield(entry.future),
                                              WRITE_ATTEMPTS * COMMIT_TIMEOUT_MS / 1000)
            except asyncio.TimeoutError:
                raise RequestTimedOutError(
                    "the controller quorum did not commit in time; the change may still be "
                    "applied: check before retrying") from None
        except asyncio.CancelledError:
            entry.dropped = not entry.taken  # the caller left: never write it
            raise

    async def _commit_loop(self) -> None:
        """The committer: takes the waiting writes, a group at a time, and
        keeps up to ``PIPELINE_DEPTH`` groups in flight (see the module doc)."""
        while not self._stopping:
            if not self._writes:
                self._writes_waiting.clear()
                await self._writes_waiting.wait()
                continue
            in_flight: collections.deque[_Batch] = collections.deque()
            try:
                async with self._write_lock:  # the activation barrier takes it too
                    await self._run_pipeline(in_flight)
            except asyncio.CancelledError:
                for batch in in_flight:  # may be in flight: may commit
                    for entry in (e for e in batch.group if e.taken):
                        _settle(entry.future, error=RequestTimedOutError(
                            "the controller stopped while committing; the change may still "
                            "be applied: check before retrying"))
                raise
            except Exception as exc:
                logger.exception("controller %d: the committer failed", self.config.node_id)
                for batch in in_flight:  # proposed: they may still commit
                    for entry in batch.group:
                        if entry.taken:
                            _settle(entry.future, error=RequestTimedOutError(
                                f"the controller failed while committing ({exc}); the change "
                                "may still be applied: check before retrying"))

    def _take_group(self) -> list[_Write]:
        group: list[_Write] = []
        while self._writes and len(group) < GROUP_WRITES_MAX:
            entry = self._writes.popleft()
            if not entry.dropped and not entry.future.done():
                entry.taken = True
                group.append(entry)
        return group

    def _put_back(self, entries: list[_Write]) -> None:
        """Writes to compute again, first in line, in their order; one that
        met a changed image ``WRITE_ATTEMPTS`` times is refused."""
        for entry in reversed(entries):
            if entry.future.done():
                continue
            entry.attempts += 1
            if entry.attempts >= WRITE_ATTEMPTS:
                _settle(entry.future, error=self.not_controller(
                    "metadata kept changing underneath"))
                continue
            entry.taken = False
            self._writes.appendleft(entry)

    async def _run_pipeline(self, in_flight: "collections.deque[_Batch]") -> None:
        """Start groups while there is room and writes wait, each computed
        on the image the one before leaves and proposed at once; finish
        them in order as they are applied. Returns with nothing in flight
        and nothing waiting."""
        while True:
            while self._writes and len(in_flight) < PIPELINE_DEPTH:
                group = self._take_group()
                if not group:
                    continue
                if not self.is_active:
                    error = self.not_controller("lost leadership")
                    for entry in group:
                        _settle(entry.future, error=error)
                    continue
                own_state = None
                try:
                    own_state = self.core.own_state()
                    batch = self._start_batch(group, in_flight[-1] if in_flight else None)
                except Exception as exc:  # a bug: this group alone fails, nothing was proposed
                    logger.exception("controller %d: computing %d writes failed",
                                     self.config.node_id, len(group))
                    if own_state is not None:
                        self.core.restore_own_state(own_state)
                    for entry in group:
                        if entry.taken:
                            _settle(entry.future, error=UnknownServerError(
                                f"the controller failed to compute the change: {exc}"))
                    continue
                if batch is not None:
                    in_flight.append(batch)
            if not in_flight:
                if not self._writes:
                    return
                continue
            oldest = in_flight[0]
            if oldest.task is not None and not oldest.task.done():
                waits: set[asyncio.Future] = {oldest.task}
                waiter = None
                if len(in_flight) < PIPELINE_DEPTH:
                    self._writes_waiting.clear()
                    if self._writes:
                        continue
                    waiter = asyncio.ensure_future(self._writes_waiting.wait())
                    waits.add(waiter)
                try:
                    await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    if waiter is not None:
                        waiter.cancel()
                if not oldest.task.done():
                    continue  # more writes came: start them first
            in_flight.popleft()
            self._finish_batch(oldest, in_flight)

    def _start_batch(self, group: list[_Write], previous: "_Batch | None") -> "_Batch | None":
        """Compute ``group`` on the image ``previous`` leaves (the committed
        one if None) and propose its records; None if nothing is left to
        commit (all answered, or put back)."""
        own_state = self.core.own_state()
        base = previous.image if previous is not None else None
        planned, records, expected_offset, image = self._compute_group(group, base)
        if planned is None:
            self.core.restore_own_state(own_state)
            self._put_back([entry for entry in group if entry.taken])
            return None
        chain = previous.token if previous is not None else None
        if not records:
            if not planned:
                return None
            # Decided on records still in flight: answered when they apply.
            return _Batch(group, planned, [], image, chain, own_state, None)
        token = int.from_bytes(os.urandom(8), "big") >> 1
        if previous is not None:
            self._pipelined_batches += 1
        task = asyncio.ensure_future(self.quorum.propose(
            records, expected_offset, COMMIT_TIMEOUT_MS / 1000, after=chain, token=token))
        task.add_done_callback(_retrieve)
        return _Batch(group, planned, records, image, token, own_state, task)

    def _finish_batch(self, batch: "_Batch", rest: "collections.deque[_Batch]") -> None:
        """Answer the writes of ``batch``, the oldest in flight, now that it
        is decided. If it did not apply, neither will the ones computed on
        it (``rest``): those of a refused batch are computed again; after
        one whose fate is unknown (a timeout, leadership moving), they may
        still apply, and are answered so."""
        if batch.task is None:
            outcome = None  # no records: the batch before it applied
        else:
            try:
                outcome = batch.task.result()
            except Exception as exc:
                if not isinstance(exc, KraftError):  # never reached the quorum: a bug
                    logger.exception("controller %d: proposing a batch failed",
                                     self.config.node_id)
                    exc = UnknownServerError(f"the controller failed to commit: {exc}")
                for later in [batch, *rest]:
                    for entry in later.group:
                        if entry.taken:
                            _settle(entry.future, error=exc)
                rest.clear()
                return
            if outcome.status is not ApplyStatus.APPLIED:
                self.core.restore_own_state(batch.own_state)
                if outcome.status is ApplyStatus.INVALID:
                    error = UnknownServerError(f"metadata batch refused: {outcome.detail}")
                    for entry in batch.group:
                        if entry.taken:
                            _settle(entry.future, error=error)
                    retry = [e for later in rest for e in later.group if e.taken]
                else:
                    logger.info("controller %d: recomputing a batch (%s)",
                                self.config.node_id, outcome.detail)
                    retry = [e for later in [batch, *rest] for e in later.group if e.taken]
                rest.clear()
                self._put_back(retry)
                return
            self._write_batches += 1
            self._writes_committed += sum(1 for planned in batch.planned if planned.wrote)
        for planned in batch.planned:
            if planned.error is not None:
                _settle(planned.entry.future, error=planned.error)
                continue
            if isinstance(planned.response, dict):
                planned.response["metadata_offset"] = planned.offset
            _settle(planned.entry.future, result=planned.response)

    def _compute_group(self, group: list[_Write], pending: MetadataImage | None = None
                       ) -> tuple[list[_Outcome] | None, list, int, MetadataImage]:
        """The outcome of each write to answer once the group's records are
        committed, those records, the offset they follow, and the image
        they leave. Computed on ``pending`` (the image a batch still in
        flight leaves) or, if None, on the committed image. A write decided
        on the committed image alone (none before it in the group wrote
        anything) and writing nothing is answered here and now, refusals
        too: it depends on nothing uncommitted. One decided on a scratch or
        pending image waits for the commit, refused or not (it is decided
        again if the batch is recomputed). None instead of the outcomes if
        a write's records did not apply: a bug, answered as such; the
        scratch image is then spoilt and the rest is computed afresh. Writes
        beyond ``GROUP_RECORDS_MAX`` records go back to the queue's front."""
        planned: list[_Outcome] = []
        records: list = []
        with self.quorum.image_lock:
            base = image = self.quorum.image if pending is None else pending
            # A pending image is as uncommitted as a scratch one.
            scratch: MetadataImage | None = pending
            for index, entry in enumerate(group):
                if len(records) >= GROUP_RECORDS_MAX:
                    for later in reversed(group[index:]):  # the next group's, first
                        later.taken = False
                        self._writes.appendleft(later)
                    del group[index:]  # no longer this group's: in no other batch twice
                    break
                try:
                    result = entry.compute(image)
                except Exception as exc:
                    error = exc if isinstance(exc, KraftError) else UnknownServerError(
                        f"the controller failed to compute the change: {exc}")
                    if not isinstance(exc, KraftError):
                        logger.exception("controller %d: computing a write failed",
                                         self.config.node_id)
                    if scratch is None:
                        _settle(entry.future, error=error)
                    else:
                        planned.append(_Outcome(entry, None, image.offset, False, error))
                    continue
                if not result.records:
                    if scratch is None:
                        if isinstance(result.response, dict):
                            result.response["metadata_offset"] = image.offset
                        _settle(entry.future, result=result.response)
                    else:
                        planned.append(_Outcome(entry, result.response, image.offset, False))
                    continue
                if scratch is None or scratch is pending:
                    scratch = image = base.copy()
                try:
                    for record in result.records:  # as every replica will
                        scratch.apply(record, scratch.offset + 1)
                except Exception as exc:
                    logger.exception("controller %d: a computed batch does not apply",
                                     self.config.node_id)
                    _settle(entry.future, error=UnknownServerError(
                        f"metadata batch refused: {exc}"))
                    return None, [], base.offset, base
                records.extend(result.records)
                planned.append(_Outcome(entry, result.response, image.offset, True))
            return planned, records, base.offset, image

    def _writer(self, pick: Callable[[Controller], Callable[[MetadataImage, dict], Any]]):
        async def handle(request: web.Request) -> web.Response:
            body = await wire.read_body(request)
            method = pick(self.core)
            return wire.respond(request, await self.write(lambda image: method(image, body)))
        return handle

    def _timed_writer(self, pick: Callable[[Controller], Callable[..., Any]]):
        """As ``_writer``, for a request judged against wall-clock time
        (delegation tokens: every node compares their times)."""
        async def handle(request: web.Request) -> web.Response:
            body = await wire.read_body(request)
            method = pick(self.core)
            return wire.respond(request, await self.write(
                lambda image: method(image, body, wall_clock_ms())))
        return handle

    async def handle_register(self, request: web.Request) -> web.Response:
        body = await wire.read_body(request)
        now_ms = self.clock_ms()
        return wire.respond(request, await self.write(
            lambda image: self.core.register_broker(image, body, now_ms)))

    async def handle_heartbeat(self, request: web.Request) -> web.Response:
        body = await wire.read_body(request)
        now_ms = self.clock_ms()
        return wire.respond(request, await self.write(
            lambda image: self.core.heartbeat(image, body, now_ms)))

    async def handle_presence(self, request: web.Request) -> web.StreamResponse:
        """A broker's presence stream: the registered broker (``broker_id``,
        ``broker_epoch``) keeps this request open to the active controller,
        which answers with a byte now and then and never finishes. When the
        broker's connection closes and no new stream of the same epoch opens
        within ``PRESENCE_GRACE_S``, the broker is taken for dead and its
        lease ends (``Controller.end_lease``): a killed process has its
        connections closed by its kernel, so its partitions get new leaders
        in well under a second instead of after ``broker.session.timeout.ms``.
        A paused or partitioned broker keeps its connection (nothing closes
        it) and is left to the session timeout, as before."""
        body = Fields(await wire.read_body(request), "")
        broker_id = body.integer("broker_id", 0, INT32_MAX)
        broker_epoch = body.integer("broker_epoch", 0, INT64_MAX)
        await self._await_active()
        term = self._active_term
        with self.quorum.image_lock:
            broker = self.quorum.image.brokers.get(broker_id)
        if broker is None or broker.broker_epoch != broker_epoch:
            raise StaleBrokerEpochError(
                f"broker {broker_id} is not registered with epoch {broker_epoch}")
        pending = self._departures.pop(broker_id, None)
        if pending is not None:
            pending.cancel()  # back within its grace: alive after all
        response = web.StreamResponse(headers={"Content-Type": "application/octet-stream"})
        self._presence[broker_id] += 1
        opened = gone = False
        try:
            await response.prepare(request)
            await response.write(b"\x00")
            opened = True  # from here on, a closed connection is the broker's doing
            loop = asyncio.get_running_loop()
            next_byte = loop.time() + PRESENCE_KEEPALIVE_S
            while not self._stopping and self.is_active and self._active_term == term:
                transport = request.transport
                if transport is None or transport.is_closing():
                    gone = True
                    break
                if loop.time() >= next_byte:
                    await response.write(b"\x00")
                    next_byte = loop.time() + PRESENCE_KEEPALIVE_S
                await asyncio.sleep(PRESENCE_CHECK_S)
        except ConnectionError:
            gone = opened
        finally:
            self._presence[broker_id] -= 1
            if (gone and not self._presence[broker_id] and not self._stopping
                    and self.is_active and self._active_term == term):
                self._departures[broker_id] = asyncio.get_running_loop().call_later(
                    PRESENCE_GRACE_S, self._departed, broker_id, broker_epoch, term,
                    self.clock_ms())
        return response

    def _departed(self, broker_id: int, broker_epoch: int, term: int, closed_ms: int) -> None:
        self._departures.pop(broker_id, None)
        if (self._presence[broker_id] or self._stopping or not self.is_active
                or self._active_term != term):
            return
        with self.quorum.image_lock:
            ended = self.core.end_lease(self.quorum.image, broker_id, broker_epoch, closed_ms)
        if ended:
            logger.warning("controller %d: broker %d's connection closed and was not reopened "
                           "within %d ms: its process is gone; fencing it now",
                           self.config.node_id, broker_id, PRESENCE_GRACE_S * 1000)
            self._tasks.append(asyncio.create_task(self._tick_once(),
                                                   name=f"fence-departed-{broker_id}"))

    def _fail_writes(self, error: Callable[[], KraftError]) -> None:
        """Answer every write still waiting for the committer with ``error()``."""
        while self._writes:
            _settle(self._writes.popleft().future, error=error())

    def _forget_departures(self) -> None:
        """No longer active (or stopping): departures seen in that term are
        not this controller's to act on."""
        for pending in self._departures.values():
            pending.cancel()
        self._departures.clear()

    async def _tick_loop(self) -> None:
        while not self._stopping:
            await asyncio.sleep(self.tick_interval_ms / 1000)
            if self.is_active:
                await self._tick_once()
            self._tasks = [t for t in self._tasks if not t.done()]

    async def _tick_once(self) -> None:
        """The core's periodic work (fencing lapsed leases, preferred
        leaders, expired tokens), committed."""
        try:
            now_ms, wall_ms = self.clock_ms(), expiry_clock_ms()
            await self.write(lambda image: ControllerResult(
                self.core.tick(image, now_ms)
                + self.core.expired_delegation_tokens(image, wall_ms), {}))
        except KraftError as exc:
            logger.info("controller %d: periodic work failed: %s", self.config.node_id, exc)
        except Exception:
            logger.exception("controller %d: periodic work failed", self.config.node_id)

    # -- reading ----------------------------------------------------------
    def _reader(self, pick: Callable[[Controller], Callable[[MetadataImage, dict], dict]]):
        """A handler for a read-only request: the core's answer on the
        current image, without the write lock and without a
        ``metadata_offset`` (nothing was written for a broker to wait for).
        Only the active controller answers, so the image is current."""
        async def handle(request: web.Request) -> web.Response:
            body = await wire.read_body(request)
            await self._await_active()
            method = pick(self.core)
            with self.quorum.image_lock:
                response = method(self.quorum.image, body)
            return wire.respond(request, response)
        return handle

    async def handle_metadata(self, request: web.Request) -> web.Response:
        """Long-poll: records after ``after_offset``, waiting up to
        ``max_wait_ms`` for one to exist. Too old an offset gets a snapshot."""
        body = await wire.read_body(request)
        after = body.get("after_offset", -1)
        wait_ms = body.get("max_wait_ms", 0)
        for name, value in (("after_offset", after), ("max_wait_ms", wait_ms)):
            if not isinstance(value, int) or isinstance(value, bool):
                raise InvalidRequestError(f"{name} must be an integer, got {value!r}")
        if after < -1:
            raise InvalidRequestError(f"after_offset must be -1 or more, got {after}")
        wait_ms = min(max(wait_ms, 0), METADATA_WAIT_MS_MAX)
        await self._await_active()
        deadline = time.monotonic() + wait_ms / 1000
        as_json = wire.response_type(request) == wire.JSON
        while True:
            answer, _ = self._metadata_since(after, packed_snapshot=not as_json)
            if answer is not None or time.monotonic() >= deadline:
                break
            changed = self._changed
            await wait_event(changed, max(0.0, deadline - time.monotonic()))
            if not self.is_active:
                raise self.not_controller("lost leadership")
        if answer is None:
            answer = {"offset": after, "records": []}
        if as_json:  # for people: the image, records decoded
            if "snapshot" in answer:
                with self.quorum.image_lock:
                    shown = image_as_json(self.quorum.image)
                return wire.respond(request, {"offset": shown["offset"], "snapshot": shown})
            answer = {"offset": answer["offset"], "records": [
                {"offset": offset, "type": decode(raw).TYPE,
                 "fields": dataclasses.asdict(decode(raw))} for offset, raw in answer["records"]]}
        return wire.respond(request, answer)

    async def handle_metadata_stream(self, request: web.Request) -> web.StreamResponse:
        """A broker's metadata stream: from ``after_offset`` (as for the
        long-poll; too old gets a snapshot first) every record as it
        commits, until this controller stops being active (the broker then
        finds the one that is). Each frame is a 4-byte big-endian length and
        a msgpack answer of the long-poll's form; one with no records goes
        out every METADATA_STREAM_KEEPALIVE_S when nothing else does. One
        held request per broker: a change reaches every broker without an
        HTTP exchange each, as Kafka's brokers keep fetching the metadata
        log from the active controller."""
        body = Fields(await wire.read_body(request), "")
        after = body.integer("after_offset", -1, INT64_MAX)
        await self._await_active()
        term = self._active_term
        answer, after = self._metadata_since(after)  # an offset beyond the log: refused here
        response = web.StreamResponse(headers={"Content-Type": "application/octet-stream"})
        await response.prepare(request)
        try:
            while not self._stopping and self.is_active and self._active_term == term:
                if answer is None:
                    changed = self._changed  # taken before any wait: no change is missed
                    if await wait_event(changed, METADATA_STREAM_KEEPALIVE_S):
                        answer, after = self._metadata_since(after)
                        continue
                    answer = {"offset": after, "records": []}
                frame = msgpack.packb(answer, use_bin_type=True)
                await response.write(len(frame).to_bytes(4, "big") + frame)
                answer, after = self._metadata_since(after)
        except (ConnectionError, MetadataOffsetOutOfRangeError):
            pass  # the broker went, or must start over: it opens a new stream
        return response

    def _metadata_since(self, after: int, packed_snapshot: bool = True
                        ) -> tuple[dict | None, int]:
        """The metadata stream's next answer after ``after`` (None: nothing
        new yet) and the offset it ends at. Without ``packed_snapshot`` an
        answer that must be a snapshot says so (``"snapshot": None``) without
        packing one: a JSON reader is shown the image instead."""
        records, image_offset = self.quorum.records_after(after)
        if after > image_offset:
            raise MetadataOffsetOutOfRangeError(
                f"after_offset {after} is beyond the metadata log's end {image_offset}; "
                "fetch from -1 to get a snapshot")
        if records is None:
            if not packed_snapshot:
                return {"offset": image_offset, "snapshot": None}, image_offset
            snapshot, image_offset = self.quorum.snapshot()
            return {"offset": image_offset, "snapshot": snapshot}, image_offset
        if not records:
            return None, after
        return ({"offset": image_offset, "records": [[offset, raw] for offset, raw in records]},
                records[-1][0])

    async def handle_quorum(self, request: web.Request) -> web.Response:
        status = self.quorum.status()
        status["active"] = self.is_active
        status["writes"] = {"committed": self._writes_committed,
                            "batches": self._write_batches,
                            "pipelined": self._pipelined_batches}
        status["leader_url"] = self.voter_url(status["leader_id"])
        for voter in status["voters"]:
            voter["url"] = voter.get("url") or self.voter_url(voter["id"])
        return wire.respond(request, status)

    # -- membership (KIP-853) ---------------------------------------------
    async def handle_add_voter(self, request: web.Request) -> web.Response:
        """Make a running controller (started with controller.quorum.join)
        a voter: ``node_id``, and its ``address`` (CONTROLLER listener,
        host:port) and/or ``raft_address`` (the other is derived with this
        controller's controller.quorum.raft.port.offset); ``timeout_ms`` to
        wait for it to catch up. Answers the voter set after the change."""
        body = Fields(await wire.read_body(request), "")
        node_id = body.integer("node_id", 0, INT32_MAX)
        address = body.string("address", 300, default=None)
        raft_address = body.string("raft_address", 300, default=None)
        timeout_ms = body.integer("timeout_ms", 1, VOTER_CATCH_UP_TIMEOUT_MS_MAX,
                                  default=VOTER_CATCH_UP_TIMEOUT_MS)
        voter = self._voter_to_add(node_id, address, raft_address)
        if self._secret_made_up:
            raise CodedError("INVALID_REQUEST",
                             "this lone controller made up its Raft secret at start-up, so no "
                             "other controller can join it: set controller.quorum.secret.file "
                             "(the same file content everywhere) on it and restart it first")
        await self._await_active()
        try:
            membership.check_add(self.quorum.voters(), voter)
        except MembershipRefused as exc:
            raise CodedError(exc.code, str(exc)) from None
        await self._check_identity(voter)
        async with self._membership_lock():
            voters = await self._membership(self.quorum.add_voter(
                voter, timeout_ms / 1000, COMMIT_TIMEOUT_MS / 1000))
        logger.info("controller %d: controller %d (%s) is now a voter", self.config.node_id,
                    node_id, voter.raft_address)
        return wire.respond(request, {"voters": _voters_json(voters)})

    async def handle_remove_voter(self, request: web.Request) -> web.Response:
        """Remove voter ``node_id``. When it is this (active) controller, it
        hands leadership to a caught-up voter and answers NOT_CONTROLLER
        naming it: the client asks it again there, and it removes this one."""
        body = Fields(await wire.read_body(request), "")
        node_id = body.integer("node_id", 0, INT32_MAX)
        await self._await_active()
        async with self._membership_lock():
            voters = await self._membership(self.quorum.remove_voter(
                node_id, COMMIT_TIMEOUT_MS / 1000))
        logger.info("controller %d: controller %d is no longer a voter", self.config.node_id,
                    node_id)
        return wire.respond(request, {"voters": _voters_json(voters)})

    async def _check_identity(self, voter: Voter) -> None:
        """Refuse to add ``voter`` unless the process at its URL is that
        controller: its node id, and listening for Raft at its Raft address
        (a typo in the id or an address that is another node's or not the
        one it listens as would add a voter that never stands), and not
        holding a voter set that still names it (stale state)."""
        url = voter.url or ""
        fix = "check --id, --address and --raft-address"
        try:
            async with tls.session(self.config.tls.peer if self.config.tls else None) as session:
                async with session.get(
                        url + "/healthz", headers={"Accept": "application/json"},
                        timeout=aiohttp.ClientTimeout(total=VOTER_IDENTITY_TIMEOUT_S)) as answer:
                    health = await answer.json(content_type=None)
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError, ValueError) as exc:
            raise CodedError(
                "INVALID_REQUEST", f"nothing answered as controller {voter.node_id} at {url} "
                f"({type(exc).__name__}: {exc}): start it (controller.quorum.join = true) "
                f"and {fix}. Nothing was changed") from None
        if not isinstance(health, dict) or health.get("role") != "controller":
            raise CodedError("INVALID_REQUEST", f"{url} is not a controller's CONTROLLER "
                             f"listener: {fix}. Nothing was changed")
        if health.get("node_id") != voter.node_id:
            raise CodedError(
                "INVALID_REQUEST", f"the controller at {url} is node {health.get('node_id')}, "
                f"not {voter.node_id}: {fix}. Nothing was changed")
        listens_as = health.get("raft_address")
        if listens_as != voter.raft_address:
            raise CodedError(
                "INVALID_REQUEST", f"controller {voter.node_id} listens for Raft at "
                f"{listens_as or 'an address it does not report (an older version?)'}, not at "
                f"{voter.raft_address}: give --raft-address {listens_as or 'host:port'} (or "
                "--address as its CONTROLLER listener names its host). Nothing was changed")
        if health.get("voter"):
            raise CodedError("INVALID_REQUEST", stale_state_message(voter.node_id))

    def _voter_to_add(self, node_id: int, address: str | None,
                      raft_address: str | None) -> Voter:
        offset = self.config.raft_port_offset
        try:
            if address is None and raft_address is None:
                raise MembershipRefused("INVALID_REQUEST", "give the new controller's address "
                                        "(its CONTROLLER listener) or its raft_address")
            if address is not None:
                host, port = membership.parse_host_port(address, "address")
            if raft_address is not None:
                raft_host, raft_port = membership.parse_host_port(raft_address, "raft_address")
            if address is None:
                host, port = raft_host, raft_port - offset
                if port < 1:
                    raise MembershipRefused("INVALID_REQUEST", f"raft_address {raft_address}: "
                                            f"its port minus the Raft port offset ({offset}) "
                                            "is no port; give address too")
            if raft_address is None:
                raft_host, raft_port = host, port + offset
                if raft_port > 65535:
                    raise MembershipRefused("INVALID_REQUEST", f"address {address}: its port "
                                            f"plus the Raft port offset ({offset}) is above "
                                            "65535; give raft_address too")
        except MembershipRefused as exc:
            raise CodedError(exc.code, str(exc)) from None
        scheme = "https" if self.config.controller_endpoint.tls else "http"
        return Voter(node_id, f"{raft_host}:{raft_port}", f"{scheme}://{host}:{port}")

    def _membership_lock(self) -> Any:
        """One membership change at a time from this controller: a second
        one while the first waits for its learner is refused at once."""
        if self._membership_busy.locked():
            raise CodedError(membership.CHANGE_IN_PROGRESS,
                             "another voter change is in progress on this controller: the "
                             "quorum changes one voter at a time. Wait for it (kraftlog quorum "
                             "status) and retry")
        return self._membership_busy

    async def _membership(self, change: Any) -> dict:
        try:
            return await change
        except MembershipRefused as exc:
            raise CodedError(exc.code, str(exc)) from None
        except NotControllerError as exc:
            if exc.leader_id is not None:
                exc.leader_url = self.voter_url(exc.leader_id)
            raise

    async def handle_image(self, request: web.Request) -> web.Response:
        with self.quorum.image_lock:
            body = image_as_json(self.quorum.image)
        return wire.respond(request, body)

    async def handle_health(self, request: web.Request) -> web.Response:
        return wire.respond(request, {"status": "ok", "node_id": self.config.node_id,
                                      "role": "controller", "active": self.is_active,
                                      "raft_address": self.quorum.self_address,
                                      "voter": self.quorum.is_voter})


class MetadataOffsetOutOfRangeError(KraftError):
    code = "OFFSET_OUT_OF_RANGE"


def _voters_json(voters: dict) -> list[dict]:
    return [{"id": v.node_id, "raft_address": v.raft_address, "url": v.url}
            for _, v in sorted(voters.items())]


def image_as_json(image: MetadataImage) -> dict:
    """The image for people and tests: brokers, topics, partitions, configs."""
    return {
        "offset": image.offset,
        "brokers": [dataclasses.asdict(b) for _, b in sorted(image.brokers.items())],
        "topics": [{
            "name": t.name, "topic_id": t.topic_id,
            "configs": image.topic_configs(t.name),
            "partitions": [dict(partition=p, **dataclasses.asdict(reg))
                           for p, reg in sorted(t.partitions.items())],
        } for _, t in sorted(image.topics.items())],
    }
