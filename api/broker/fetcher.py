"""Follower replication: one fetch loop per leader broker.

The ``ReplicaFetcherManager`` keeps, for every partition this broker follows,
the fetcher of its current leader (``sync`` after every metadata change). A
``ReplicaFetcher`` sends the ordinary ``POST /v1/fetch`` with ``replica_id``
for all its partitions at once, then per partition:

  - records: appended unchanged (offsets and leader epochs as the leader
    stamped them), and the follower's high watermark becomes
    ``min(leader's, own log end)``;
  - ``diverging_epoch``: the log is truncated where it stops matching the
    leader's (``Partition.truncation_offset``), and the next fetch asks again
    from there — so a replica that returns after a failure never keeps
    records the new leader does not have;
  - ``OFFSET_OUT_OF_RANGE`` below the leader's log start: the log restarts
    empty at the leader's log start (the rest was deleted by retention);
  - epoch and leadership errors: the partition waits for the metadata to
    move (a short back-off, or at once when ``sync`` runs).

Nothing is fetched until the broker's metadata has caught up with the
controller: an image replaying history could name a deposed leader, whose
answers must not truncate anything. A partition whose log holds an epoch
newer than the leader epoch it follows is skipped for the same reason.

A change of a fetcher's partitions cancels its in-flight long-poll, so a
partition that moves to a new leader is fetched at once.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Callable

import aiohttp
import msgpack

from api.broker.partition import Partition
from api.broker.replica_manager import ReplicaManager, broker_url
from kraft import wire
from storage.manager import TopicPartition

logger = logging.getLogger(__name__)

#: How long a partition rests after an error before it is fetched again.
PARTITION_BACKOFF_MS = 200
#: Pause after a leader could not be reached.
CONNECT_BACKOFF_MS = 100


@dataclasses.dataclass(frozen=True)
class FetcherSettings:
    """Kafka's names: replica.fetch.wait.max.ms, replica.fetch.max.bytes,
    replica.fetch.response.max.bytes."""

    wait_max_ms: int = 500
    partition_bytes_max: int = 1024 * 1024
    response_bytes_max: int = 10 * 1024 * 1024

    @classmethod
    def from_broker_config(cls, settings: dict) -> "FetcherSettings":
        return cls(
            wait_max_ms=int(settings.get("replica.fetch.wait.max.ms", cls.wait_max_ms)),
            partition_bytes_max=int(settings.get("replica.fetch.max.bytes",
                                                 cls.partition_bytes_max)),
            response_bytes_max=int(settings.get("replica.fetch.response.max.bytes",
                                                cls.response_bytes_max)))


class ReplicaFetcherManager:
    """Owns the fetchers; ``sync`` assigns each followed partition to the
    fetcher of its leader."""

    def __init__(self, replicas: ReplicaManager, settings: FetcherSettings,
                 is_ready: Callable[[], bool]) -> None:
        self.replicas = replicas
        self.settings = settings
        # Whether this broker's metadata is current enough to follow anyone.
        self.is_ready = is_ready
        self.fetchers: dict[int, ReplicaFetcher] = {}
        self._session: aiohttp.ClientSession | None = None

    def sync(self) -> None:
        """After a metadata change: move partitions between fetchers, start
        fetchers for new leaders, stop those left with nothing."""
        wanted: dict[int, dict[TopicPartition, int]] = {}
        if self.is_ready():
            for tp, part in self.replicas.partitions.items():
                if not part.is_leader and part.leader_id >= 0:
                    wanted.setdefault(part.leader_id, {})[tp] = part.leader_epoch
        for leader_id in list(self.fetchers):
            if leader_id not in wanted:
                self.fetchers.pop(leader_id).stop()
        for leader_id, tps in wanted.items():
            fetcher = self.fetchers.get(leader_id)
            if fetcher is None:
                fetcher = self.fetchers[leader_id] = ReplicaFetcher(leader_id, self)
                fetcher.start()
            fetcher.assign(tps)

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession()
        return self._session

    async def stop(self) -> None:
        fetchers, self.fetchers = list(self.fetchers.values()), {}
        for fetcher in fetchers:
            fetcher.stop()
        await asyncio.gather(*(f.task for f in fetchers if f.task), return_exceptions=True)
        if self._session is not None:
            await self._session.close()
            self._session = None


class ReplicaFetcher:
    """The fetch loop towards one leader broker."""

    def __init__(self, leader_id: int, manager: ReplicaFetcherManager) -> None:
        self.leader_id = leader_id
        self.manager = manager
        self.replicas = manager.replicas
        # Partitions fetched, with the leader epoch each was assigned in.
        self.partitions: dict[TopicPartition, int] = {}
        # Partitions resting after an error, until this loop time.
        self._resting: dict[TopicPartition, float] = {}
        # The order partitions are asked for in: those that just returned
        # data go to the back, so a busy partition cannot starve the others
        # of the response budget (only the first with data may exceed it).
        self._order: list[TopicPartition] = []
        self._changed = asyncio.Event()
        self.task: asyncio.Task | None = None

    def start(self) -> None:
        self.task = asyncio.create_task(self._run(), name=f"replica-fetcher-{self.leader_id}")

    def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()

    def assign(self, epochs: dict[TopicPartition, int]) -> None:
        """Fetch exactly these partitions from now on; an in-flight fetch is
        dropped when the set or any partition's leader epoch changed."""
        if epochs == self.partitions:
            return
        self.partitions = dict(epochs)
        self._resting = {tp: t for tp, t in self._resting.items() if tp in epochs}
        kept = [tp for tp in self._order if tp in epochs]
        self._order = kept + sorted(set(epochs) - set(kept))
        self._changed.set()

    # -- the loop ----------------------------------------------------------------
    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            self._changed.clear()
            try:
                request = self._build_request(loop.time())
                if request is None:
                    await self._wait_for_change(self._next_wake_s(loop.time()))
                    continue
                body, sent = request
                answer = await self._send_unless_changed(body)
                if answer is not None:
                    self._handle_answer(answer, sent, loop.time())
            except asyncio.CancelledError:
                raise
            except (aiohttp.ClientError, asyncio.TimeoutError, OSError, ValueError) as exc:
                logger.debug("broker %d: fetch from leader %d failed: %s",
                             self.replicas.broker_id, self.leader_id, exc)
                await self._wait_for_change(CONNECT_BACKOFF_MS / 1000)
            except Exception:
                logger.exception("broker %d: replica fetcher for leader %d failed",
                                 self.replicas.broker_id, self.leader_id)
                await self._wait_for_change(CONNECT_BACKOFF_MS / 1000)

    def _build_request(self, now: float) -> tuple[dict, dict] | None:
        """The fetch to send now, with what each partition's state was when
        it was built (to check the answer still applies); None if nothing
        can be fetched."""
        settings = self.manager.settings
        items, sent = [], {}
        for tp in self._order:
            part = self._followed(tp)
            if part is None or self._resting.get(tp, 0) > now:
                continue
            if part.last_fetched_epoch > part.leader_epoch:
                # Our log is newer than the leader we were told of: wait for
                # the metadata to name a newer one.
                logger.warning("broker %d: %s holds leader epoch %d, newer than leader %d's "
                               "epoch %d; waiting for newer metadata", self.replicas.broker_id,
                               tp, part.last_fetched_epoch, self.leader_id, part.leader_epoch)
                self._rest(tp, now, PARTITION_BACKOFF_MS * 10)
                continue
            items.append({"topic": tp.topic, "partition": tp.partition,
                          "offset": part.log_end_offset,
                          "current_leader_epoch": part.leader_epoch,
                          "last_fetched_epoch": part.last_fetched_epoch,
                          "max_bytes": settings.partition_bytes_max})
            sent[tp] = (part, part.leader_epoch, part.log_end_offset)
        if not items:
            return None
        return {"replica_id": self.replicas.broker_id, "max_wait_ms": settings.wait_max_ms,
                "min_bytes": 1, "max_bytes": settings.response_bytes_max,
                "partitions": items}, sent

    def _followed(self, tp: TopicPartition) -> Partition | None:
        part = self.replicas.partitions.get(tp)
        if part is None or part.is_leader or part.leader_id != self.leader_id:
            return None
        return part

    def _next_wake_s(self, now: float) -> float | None:
        resting = [t for t in self._resting.values() if t > now]
        return max(0.0, min(resting) - now) if resting else None

    async def _wait_for_change(self, timeout_s: float | None) -> None:
        try:
            await asyncio.wait_for(self._changed.wait(), timeout_s)
        except asyncio.TimeoutError:
            pass

    async def _send_unless_changed(self, body: dict) -> dict | None:
        """POST the fetch; None if the partitions changed first (the fetch
        is cancelled: nothing of it was applied)."""
        url = broker_url(self.replicas.image, self.leader_id)
        if url is None:
            await self._wait_for_change(CONNECT_BACKOFF_MS / 1000)
            return None
        request = asyncio.ensure_future(self._post(url + "/v1/fetch", body))
        changed = asyncio.ensure_future(self._changed.wait())
        try:
            await asyncio.wait({request, changed}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            changed.cancel()
            if not request.done():
                request.cancel()
                await asyncio.gather(request, return_exceptions=True)
        if request.cancelled():
            return None
        return request.result()

    async def _post(self, url: str, body: dict) -> dict:
        timeout_s = self.manager.settings.wait_max_ms / 1000 + 10
        async with self.manager.session.post(
                url, data=msgpack.packb(body, use_bin_type=True),
                headers={"Content-Type": wire.MSGPACK, "Accept": wire.MSGPACK},
                timeout=aiohttp.ClientTimeout(total=timeout_s)) as response:
            answer = msgpack.unpackb(await response.read(), raw=False)
        if not isinstance(answer, dict):
            raise ValueError(f"fetch answer is not a map: {answer!r:.100}")
        return answer

    # -- answers -------------------------------------------------------------------
    def _handle_answer(self, answer: dict, sent: dict, now: float) -> None:
        if "error" in answer and "partitions" not in answer:
            error = answer.get("error") or {}
            logger.info("broker %d: leader %d refused the fetch: %s", self.replicas.broker_id,
                        self.leader_id, error.get("message", error))
            for tp in sent:
                self._rest(tp, now)
            return
        served = []
        for result in answer.get("partitions", ()):
            tp = TopicPartition(result.get("topic"), result.get("partition"))
            if result.get("records"):
                served.append(tp)
            expected = sent.get(tp)
            part = self._followed(tp)
            if expected is None or part is not expected[0]:
                continue
            if (part.leader_epoch, part.log_end_offset) != expected[1:]:
                continue  # the partition moved on while the fetch was out
            try:
                self._apply(part, result, now)
            except Exception:
                logger.exception("broker %d: cannot apply the fetch of %s from leader %d",
                                 self.replicas.broker_id, tp, self.leader_id)
                self._rest(tp, now)
        if served:
            moved = set(served)
            self._order = [tp for tp in self._order if tp not in moved] + \
                [tp for tp in served if tp in self.partitions]

    def _apply(self, part: Partition, result: dict, now: float) -> None:
        error = result.get("error")
        if error:
            self._apply_error(part, error, now)
            return
        diverging = result.get("diverging_epoch")
        if diverging:
            offset = part.truncation_offset(diverging["epoch"], diverging["end_offset"])
            part.truncate_to(offset, f"diverged from leader {self.leader_id}'s epoch "
                                     f"{diverging['epoch']}, which ends at "
                                     f"{diverging['end_offset']}")
            return
        part.append_as_follower(result.get("records") or b"", result["high_watermark"])

    def _apply_error(self, part: Partition, error: dict, now: float) -> None:
        code = error.get("code")
        if code == "OFFSET_OUT_OF_RANGE":
            start, end = error.get("log_start_offset", -1), error.get("log_end_offset", -1)
            if 0 <= start and part.log_end_offset < start:
                part.restart_at(start)
                return
            if 0 <= end < part.log_end_offset:
                part.truncate_to(end, f"beyond leader {self.leader_id}'s log end")
                return
        logger.info("broker %d: fetch of %s from leader %d: %s: %s", self.replicas.broker_id,
                    part.tp, self.leader_id, code, error.get("message"))
        self._rest(part.tp, now)

    def _rest(self, tp: TopicPartition, now: float, rest_ms: int = PARTITION_BACKOFF_MS) -> None:
        self._resting[tp] = now + rest_ms / 1000
