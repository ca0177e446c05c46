"""A consumer's membership in a group (the new protocol, KIP-848).

The broker decides who owns what (a server-side assignor); the member only
heartbeats and does what it is told:

Heartbeat (a background task)
    Every ``heartbeat_interval_ms`` (the coordinator says how often) the
    member sends its member id and epoch, its subscription and the
    partitions it owns. The answer may carry a new target assignment. A
    member that joins sends epoch 0 and gets its id; one that leaves sends
    -1 (or -2 for a static member, which keeps its partitions for a quick
    restart). ``NOT_COORDINATOR`` and friends send the member to find the
    coordinator again; ``UNKNOWN_MEMBER_ID`` or ``FENCED_MEMBER_EPOCH`` mean
    its partitions are lost: it gives them up without committing and
    rejoins.

Watch (a second background task)
    Between heartbeats the member keeps one ``/v1/groups/watch`` open; the
    coordinator answers it as soon as this member's heartbeat would carry
    news (partitions to give up or take, a new epoch), and the member
    heartbeats at once. So a rebalance takes a few round trips, not one or
    two heartbeat intervals. A coordinator without watches (404) is simply
    not watched: the heartbeat alone converges, as in Kafka.

Reconciliation (in ``poll``, on the user's side of the consumer)
    As in Kafka, partitions change hands inside ``poll``: everything ``poll``
    returned before has been processed by then. Partitions to give up are
    committed first (with ``enable_auto_commit``), passed to
    ``on_partitions_revoked`` and removed; only then does the next heartbeat
    show them released, and the coordinator hands them to their new owner.
    New partitions start at their committed offset (else
    ``auto_offset_reset``) and are passed to ``on_partitions_assigned``.
    Heartbeats count what the member was told to take as owned, so a target
    that changes while a poll takes partitions up takes them back like any
    other, never behind the member's back.

Auto-commit
    With ``enable_auto_commit``, ``poll`` commits the positions of the
    records it returned before, every ``auto_commit_interval_ms``, and on
    revocation and close: at-least-once, duplicates only since the last
    commit.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Protocol

from api.client._transport import ClusterMetadata, Transport, monotonic_ms
from api.client._types import TopicPartition
from api.client.errors import KraftlogError
from protocol.aio import wait_event


class GroupConsumer(Protocol):
    """What a member needs of the consumer it belongs to (``AsyncConsumer``):
    its settings, its transport and metadata, the two calls that hand
    partitions over (with their positions) and back, and a wake-up for a
    waiting poll."""

    config: Any
    _transport: Transport
    _metadata: ClusterMetadata

    def _assign_for_group(self, tps: Iterable[TopicPartition],
                          committed: Mapping[TopicPartition, int] | None = None) -> None: ...

    def _consumed_positions(self, tps: Iterable[TopicPartition]
                            ) -> dict[TopicPartition, int]: ...

    def wake_poll(self) -> None: ...


logger = logging.getLogger(__name__)

#: Codes after which the member looks for the coordinator again.
FIND_AGAIN_CODES = frozenset({"NOT_COORDINATOR", "COORDINATOR_NOT_AVAILABLE",
                              "BROKER_NOT_AVAILABLE"})
#: Codes after which the same request is simply retried after a backoff.
RETRY_CODES = frozenset({"COORDINATOR_LOAD_IN_PROGRESS", "REQUEST_TIMED_OUT",
                         "NOT_ENOUGH_REPLICAS", "NOT_ENOUGH_REPLICAS_AFTER_APPEND",
                         "NOT_LEADER_OR_FOLLOWER", "UNKNOWN_SERVER_ERROR"})
#: Codes that cost the member its partitions and its place.
REJOIN_CODES = frozenset({"UNKNOWN_MEMBER_ID", "FENCED_MEMBER_EPOCH"})
#: Whole-commit refusals: the member's partitions may be someone else's now.
REFUSED_COMMIT_CODES = REJOIN_CODES | {"STALE_MEMBER_EPOCH"}
#: Codes that no retry can cure: the next ``poll`` raises them.
FATAL_CODES = frozenset({"INVALID_REQUEST", "UNSUPPORTED_ASSIGNOR", "GROUP_MAX_SIZE_REACHED",
                         "INVALID_SESSION_TIMEOUT",
                         "UNRELEASED_INSTANCE_ID", "INVALID_GROUP_ID",
                         # ACLs: until an administrator allows it
                         "GROUP_AUTHORIZATION_FAILED", "TOPIC_AUTHORIZATION_FAILED",
                         "CLUSTER_AUTHORIZATION_FAILED"})
#: Heartbeat interval until the coordinator says otherwise.
HEARTBEAT_INTERVAL_MS_DEFAULT = 1000
#: A heartbeat waits at least this long for its answer.
HEARTBEAT_TIMEOUT_MS_MIN = 500
#: A watch is answered within this much more than its wait, else given up.
WATCH_TIMEOUT_MARGIN_MS = 5000
#: A watch waits at most this long (then the member watches again).
WATCH_WAIT_MS_MAX = 30_000
#: A member leaving waits at most this long for the coordinator.
LEAVE_TIMEOUT_MS = 3000


class CommitFailedError(KraftlogError):
    """The commit was refused (the member's epoch is stale or it was
    removed): its partitions may now belong to another member."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(code, message, retriable=False)


Listener = Callable[[set[TopicPartition]], Any]


class GroupMember:
    def __init__(self, consumer: GroupConsumer, group_id: str, *, instance_id: str | None,
                 session_timeout_ms: int, rebalance_timeout_ms: int, auto_commit: bool,
                 auto_commit_interval_ms: int, assignor: str | None,
                 retry_backoff_ms: int) -> None:
        self.consumer = consumer
        self.group_id = group_id
        self.instance_id = instance_id
        self.session_timeout_ms = session_timeout_ms
        self.rebalance_timeout_ms = rebalance_timeout_ms
        self.auto_commit = auto_commit
        self.auto_commit_interval_ms = auto_commit_interval_ms
        self.assignor = assignor
        self.retry_backoff_ms = retry_backoff_ms
        self.topics: list[str] | None = None
        self.pattern: str | None = None
        self.on_revoked: Listener | None = None
        self.on_assigned: Listener | None = None
        self.on_lost: Listener | None = None
        self.member_id = ""
        self.member_epoch = 0
        self.heartbeat_interval_ms = HEARTBEAT_INTERVAL_MS_DEFAULT
        # What the coordinator wants this member to own (None: nothing said yet).
        self.target: set[TopicPartition] | None = None
        # What this member owns (== the consumer's assignment).
        self.owned: set[TopicPartition] = set()
        self.lost = False
        # Partitions taken away by a loss, for on_partitions_lost.
        self._lost_partitions: set[TopicPartition] = set()
        # Bumped by every loss: reconciliation started before one gives up.
        self.generation = 0
        self._last_ok_ms = monotonic_ms()
        self._auto_commit: asyncio.Future | None = None
        # A refusal no retry cures (a bad regex, say): raised by poll.
        self.fatal: KraftlogError | None = None
        self.coordinator_url: str | None = None
        self._subscription_sent = False
        self._next_commit_ms = monotonic_ms() + auto_commit_interval_ms
        self._wake = asyncio.Event()
        self._task: asyncio.Task | None = None
        self._watch_task: asyncio.Task | None = None
        # Set by every heartbeat answered: the watch may start (again).
        self._beaten = asyncio.Event()
        self._leaving = False

    # -- subscription ---------------------------------------------------------------
    def subscribe(self, topics: Iterable[str] | None, pattern: str | None,
                  on_revoked: Listener | None, on_assigned: Listener | None,
                  on_lost: Listener | None) -> None:
        self.topics = sorted(set(topics)) if topics is not None else None
        self.pattern = pattern
        self.on_revoked, self.on_assigned, self.on_lost = on_revoked, on_assigned, on_lost
        self._subscription_sent = False
        self.fatal = None
        loop = asyncio.get_running_loop()
        if self._task is None or self._task.done():
            self._task = loop.create_task(self._heartbeat_loop())
        if self._watch_task is None or self._watch_task.done():
            self._watch_task = loop.create_task(self._watch_loop())
        self._wake.set()

    # -- talking to the coordinator ----------------------------------------------------
    async def _coordinator(self) -> str:
        if self.coordinator_url is None:
            answer = await self.consumer._metadata.request_any(
                "/v1/groups/coordinator", {"group_id": self.group_id})
            url = answer.get("coordinator_url")
            if not url:
                raise KraftlogError("COORDINATOR_NOT_AVAILABLE",
                                    f"no coordinator for group {self.group_id!r} yet",
                                    retriable=True)
            self.coordinator_url = url
        return self.coordinator_url

    async def _call(self, path: str, body: dict, timeout_ms: int | None = None) -> Any:
        url = await self._coordinator()
        try:
            return await self.consumer._transport.request(url, path, body,
                                                          timeout_ms=timeout_ms)
        except KraftlogError as exc:
            if exc.code in FIND_AGAIN_CODES:
                self.coordinator_url = None
            raise

    def _heartbeat_body(self, epoch: int) -> dict:
        body: dict[str, Any] = {"group_id": self.group_id, "member_id": self.member_id,
                                "member_epoch": epoch, "instance_id": self.instance_id,
                                "owned_partitions": [] if epoch == 0
                                else _as_wire(self._claimed())}
        if epoch == 0 or not self._subscription_sent:
            body.update(subscribed_topic_names=self.topics, subscribed_topic_regex=self.pattern,
                        server_assignor=self.assignor,
                        rebalance_timeout_ms=self.rebalance_timeout_ms,
                        session_timeout_ms=self.session_timeout_ms)
        return body

    def _claimed(self) -> set[TopicPartition]:
        """What heartbeats say this member owns: what it holds, and what it
        was told to take (a ``poll`` may be taking it up right now). A
        partition counts as released only in a heartbeat sent after the
        answer that took it away, so a heartbeat sent before a take (or
        during it) and answered after it cannot release what the member is
        about to hold; a take whose target changed meanwhile is given up."""
        return self.owned | (self.target or set())

    async def _heartbeat(self) -> None:
        # Bounded by half the session, so a coordinator that stopped answering
        # is noticed while the session can still be judged.
        timeout_ms = min(self.consumer.config.request_timeout_ms,
                         max(HEARTBEAT_TIMEOUT_MS_MIN, self.session_timeout_ms // 2))
        answer = await self._call("/v1/groups/heartbeat", self._heartbeat_body(self.member_epoch),
                                  timeout_ms=timeout_ms)
        self._subscription_sent = True
        self.member_id = answer["member_id"]
        self.member_epoch = answer["member_epoch"]
        self.heartbeat_interval_ms = answer.get("heartbeat_interval_ms") or \
            HEARTBEAT_INTERVAL_MS_DEFAULT
        if answer.get("assignment") is not None:
            before = self._claimed()
            self.target = {TopicPartition(entry["topic"], p) for entry in answer["assignment"]
                           for p in entry["partitions"]}
            if before - self._claimed():
                self._wake.set()  # released before taken up: say so at once

    async def _heartbeat_loop(self) -> None:
        while not self._leaving:
            wait_ms = self.heartbeat_interval_ms
            self._wake.clear()  # before the request: a wake-up meanwhile is kept
            sent_ms = monotonic_ms()
            try:
                await self._heartbeat()
                self._last_ok_ms = sent_ms
                self._beaten.set()
            except asyncio.CancelledError:
                raise
            except KraftlogError as exc:
                if exc.code in REJOIN_CODES:
                    self._lose(str(exc), forget_id=exc.code == "UNKNOWN_MEMBER_ID")
                    wait_ms = 0
                elif exc.code in FATAL_CODES:
                    logger.error("group %s: the coordinator refused this member: %s",
                                 self.group_id, exc)
                    if self.owned or self.target:
                        self._lose(str(exc), forget_id=True)
                    self.fatal = exc
                    self.consumer.wake_poll()  # raised by the poll waiting now
                    return
                else:
                    logger.info("group %s: heartbeat failed: %s", self.group_id, exc)
                    wait_ms = self.retry_backoff_ms
                    if (self.owned or self.target) \
                            and sent_ms - self._last_ok_ms > self.session_timeout_ms:
                        # The coordinator has surely removed this member and
                        # given its partitions to others: stop consuming them.
                        self._lose(f"no heartbeat got through for a whole session "
                                   f"({self.session_timeout_ms} ms)", forget_id=True)
            except Exception:
                logger.exception("group %s: heartbeat loop error", self.group_id)
                wait_ms = self.retry_backoff_ms
            await wait_event(self._wake, wait_ms / 1000)

    async def _watch_loop(self) -> None:
        """Keep a watch open while this member is in the group; heartbeat at
        once when it answers ``news``. After news (or an error) the next
        watch waits for the next heartbeat's answer, so a watch never spins."""
        while not self._leaving:
            await self._beaten.wait()
            self._beaten.clear()
            if not self.member_id or self.member_epoch <= 0 or self.coordinator_url is None:
                continue
            wait_ms = min(self.heartbeat_interval_ms, WATCH_WAIT_MS_MAX)
            try:
                answer = await self._call(
                    "/v1/groups/watch", {"group_id": self.group_id, "member_id": self.member_id,
                                         "max_wait_ms": wait_ms},
                    timeout_ms=wait_ms + WATCH_TIMEOUT_MARGIN_MS)
            except asyncio.CancelledError:
                raise
            except KraftlogError as exc:
                if exc.code == "NOT_FOUND":
                    logger.info("group %s: the coordinator has no watches; heartbeats alone "
                                "will do", self.group_id)
                    return
                if exc.code in REJOIN_CODES:
                    self._wake.set()  # removed meanwhile: the heartbeat rejoins now
                # Otherwise the next watch follows the next regular heartbeat:
                # a watch that keeps failing never hurries the heartbeats.
                continue
            except Exception:
                logger.exception("group %s: watch loop error", self.group_id)
                continue
            if answer.get("news"):
                self._wake.set()
            else:
                self._beaten.set()

    def _lose(self, why: str, forget_id: bool) -> None:
        """This member's partitions may belong to others now: stop fetching
        them at once (the listener hears of it in the next ``poll``) and
        rejoin owning nothing."""
        logger.warning("group %s: %s; giving up partitions %s and rejoining", self.group_id,
                       why, sorted(self.owned))
        self._lost_partitions |= self.owned
        self.owned = set()
        self.consumer._assign_for_group(())
        self.lost = True
        self.generation += 1
        self.target = None
        self.member_epoch = 0
        if forget_id:
            self.member_id = ""
        self._subscription_sent = False

    # -- reconciliation (in poll) ------------------------------------------------------
    async def reconcile(self) -> None:
        """Give up and take partitions as the coordinator asked; commit when
        due. Called at the start of every ``poll``."""
        consumer = self.consumer
        if self.fatal is not None:
            raise self.fatal
        if self.lost:
            lost, self._lost_partitions, self.lost = self._lost_partitions, set(), False
            if lost:
                await _call_listener(self.on_lost or self.on_revoked, lost)
        generation = self.generation
        target = self.target
        if target is not None:
            revoke = self.owned - target
            if revoke:
                if self.auto_commit:
                    await self._commit_quietly(consumer._consumed_positions(revoke))
                await _call_listener(self.on_revoked, revoke)
                if generation != self.generation:
                    return  # lost meanwhile: the next poll starts over
                self.owned -= revoke
                consumer._assign_for_group(self.owned)
                self._wake.set()  # tell the coordinator now that they are free
            add = target - self.owned
            if add:
                committed = await self.fetch_committed(add)
                if generation != self.generation or self.target is not target:
                    return  # lost, or told something newer, meanwhile
                self.owned |= add
                consumer._assign_for_group(self.owned, {tp: committed[tp] for tp in add
                                                        if tp in committed})
                await _call_listener(self.on_assigned, add)
                self._wake.set()
        if self.auto_commit and monotonic_ms() >= self._next_commit_ms and (
                self._auto_commit is None or self._auto_commit.done()):
            # In the background, as Kafka's: poll must not wait for a
            # coordinator that is slow or gone.
            self._next_commit_ms = monotonic_ms() + self.auto_commit_interval_ms
            self._auto_commit = asyncio.ensure_future(
                self._commit_quietly(consumer._consumed_positions(self.owned)))

    async def _commit_quietly(self, offsets: Mapping[TopicPartition, int]) -> None:
        try:
            await self.commit(offsets)
        except KraftlogError as exc:
            logger.warning("group %s: auto-commit of %d partitions failed: %s",
                           self.group_id, len(offsets), exc)

    # -- offsets ------------------------------------------------------------------------
    async def commit(self, offsets: Mapping[TopicPartition, int]) -> None:
        if not offsets:
            return
        body = {"group_id": self.group_id, "member_id": self.member_id,
                "member_epoch": self.member_epoch if self.member_id else -1,
                "offsets": [{"topic": tp.topic, "partition": tp.partition, "offset": offset}
                            for tp, offset in sorted(offsets.items())]}
        try:
            answer = await self._retrying(lambda: self._call("/v1/groups/offsets/commit", body))
        except KraftlogError as exc:
            if exc.code in REFUSED_COMMIT_CODES:
                raise CommitFailedError(exc.code, str(exc)) from None
            raise
        for entry in answer.get("partitions") or ():
            error = entry.get("error")
            if error:
                raise CommitFailedError(error.get("code", "UNKNOWN_SERVER_ERROR"),
                                        f"commit of {entry['topic']}-{entry['partition']} "
                                        f"refused: {error.get('message')}")

    async def fetch_committed(self, tps: Iterable[TopicPartition]
                              ) -> dict[TopicPartition, int]:
        wanted = set(tps)
        answer = await self._retrying(lambda: self._call("/v1/groups/offsets/fetch", {
            "group_id": self.group_id, "partitions": _as_wire(wanted)}))
        return {TopicPartition(e["topic"], e["partition"]): e["offset"]
                for e in answer.get("partitions") or ()
                if TopicPartition(e["topic"], e["partition"]) in wanted}

    async def _retrying(self, call: Callable[[], Any]) -> Any:
        deadline = monotonic_ms() + self.consumer.config.request_timeout_ms
        while True:
            try:
                return await call()
            except KraftlogError as exc:
                if exc.code not in FIND_AGAIN_CODES | RETRY_CODES or monotonic_ms() > deadline:
                    raise
            await asyncio.sleep(self.retry_backoff_ms / 1000)

    # -- leaving ------------------------------------------------------------------------
    async def close(self) -> None:
        self._leaving = True
        # A poll still taking partitions up must not take them after this.
        self.generation += 1
        self.target = None
        tasks = [task for task in (self._task, self._watch_task) if task is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._auto_commit is not None:
            await asyncio.gather(self._auto_commit, return_exceptions=True)
        try:
            if self.member_id and self.auto_commit and self.owned and not self.lost:
                await self.commit(self.consumer._consumed_positions(self.owned))
        except KraftlogError as exc:
            logger.info("group %s: committing on close: %s", self.group_id, exc)
        # As Kafka's consumer does on close: the listener hears that the
        # partitions are given up before the coordinator can hand them on.
        lost, self._lost_partitions = self._lost_partitions, set()
        owned, self.owned = self.owned, set()
        self.consumer._assign_for_group(())
        if lost:
            await _call_listener(self.on_lost or self.on_revoked, lost)
        if owned:
            await _call_listener(self.on_revoked, owned)
        if not self.member_id:
            return
        try:
            await self.consumer._transport.request(
                await self._coordinator(), "/v1/groups/heartbeat",
                self._heartbeat_body(-2 if self.instance_id else -1),
                timeout_ms=LEAVE_TIMEOUT_MS)
        except KraftlogError as exc:
            logger.info("group %s: leaving: %s (the session timeout removes this member)",
                        self.group_id, exc)


async def _call_listener(listener: Listener | None, partitions: set[TopicPartition]) -> None:
    if listener is None:
        return
    try:
        result = listener(set(partitions))
        if inspect.isawaitable(result):
            await result
    except Exception:
        logger.exception("rebalance listener %r failed", listener)


def _as_wire(partitions: Iterable[TopicPartition]) -> list[dict]:
    by_topic: dict[str, list[int]] = {}
    for tp in sorted(partitions):
        by_topic.setdefault(tp.topic, []).append(tp.partition)
    return [{"topic": topic, "partitions": ps} for topic, ps in by_topic.items()]
