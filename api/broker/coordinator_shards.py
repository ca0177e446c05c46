"""What the group and transaction coordinators' shells share: a pure core
per led partition of an internal topic, loaded from its log, run one
operation at a time, persisted through the produce purgatory.

Where a key lives
    Key ``k`` (a group id, a transactional id) belongs to partition
    ``abs(javaHash(k)) % N`` of the service's internal topic (Java's
    ``String.hashCode``, as Kafka's, so a key lands on the same partition
    number). The broker that leads that partition coordinates the key. The
    first ``find_coordinator`` creates the topic through the controller.

One core per led partition (a "shard")
    When this broker becomes leader of a partition of the topic it creates
    an empty core and replays the partition's log into it
    (``COORDINATOR_LOAD_IN_PROGRESS`` meanwhile); when it stops leading, the
    shard is dropped. A shard's operations run one at a time (its lock):
    the core computes the answer and the records expressing the change, the
    records are appended to the partition and the answer is given only once
    they are committed (acks=all). If a write fails, the core may be ahead
    of the log, so the shard is reloaded from the log before it answers
    again.

Timers
    Every ``TICK_INTERVAL_S`` each loaded shard's ``tick`` runs; its records
    are written like any other.
"""

from __future__ import annotations

import abc
import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from api.broker.replication import broker_url
from protocol.errors import (CodedError, CoordinatorLoadInProgressError,
                             CoordinatorNotAvailableError, KraftError, NotCoordinatorError)
from storage.batch import RecordTooLargeError, build_batch, iter_batches, iter_records
from storage.manager import TopicPartition

logger = logging.getLogger(__name__)

#: How long a coordinator write may take to commit.
WRITE_TIMEOUT_MS = 5000
#: How often the cores' timers run.
TICK_INTERVAL_S = 0.25
#: While loading, how often to look whether the replayed tail is committed.
LOAD_COMMIT_POLL_S = 0.05
#: max.message.bytes of the internal topics: room for a large change.
INTERNAL_MESSAGE_BYTES_MAX = 16 * 1024 * 1024
#: segment.bytes of the internal topics (Kafka's offsets.topic.segment.bytes).
INTERNAL_SEGMENT_BYTES = 100 * 1024 * 1024
#: Bytes read per step while loading a shard.
LOAD_CHUNK_BYTES = 1024 * 1024


def java_string_hash(text: str) -> int:
    """Java's ``String.hashCode`` (over UTF-16 code units), as a signed int."""
    data = text.encode("utf-16-be")
    h = 0
    for i in range(0, len(data), 2):
        h = (31 * h + (data[i] << 8 | data[i + 1])) & 0xFFFFFFFF
    return h - (1 << 32) if h & 0x80000000 else h


def partition_for(key: str, partitions: int) -> int:
    """Kafka's ``Utils.abs(key.hashCode()) % partitions``."""
    return (java_string_hash(key) & 0x7FFFFFFF) % partitions


@dataclass
class Shard:
    """The keys of one partition of the internal topic this broker leads."""

    partition: int
    leader_epoch: int
    core: Any
    loaded: bool = False
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    load_task: asyncio.Task | None = None


class ShardedCoordinator(abc.ABC):
    """The shell of a coordinator whose state is an internal topic.

    A subclass sets ``TOPIC``, ``WHAT`` (what a key is, for messages) and
    ``ERROR_TYPE`` (the core's refusal, with ``code`` and ``message``), and
    implements ``new_core``, ``decode``, ``encode`` and ``tick_core``."""

    TOPIC = ""
    WHAT = "key"
    FIND_PATH = ""
    ERROR_TYPE: type = Exception
    #: How it calls its peers' SSL listeners (the node's; None: plain HTTP).
    peer_ssl: Any = None

    def __init__(self, broker_id: int, replicas: Any, data: Any,
                 controller_call: Callable[..., Any], image: Callable[[], Any],
                 clock_ms: Callable[[], int], partitions_wanted: int,
                 replication_wanted: int,
                 segment_bytes: int = INTERNAL_SEGMENT_BYTES) -> None:
        self.broker_id = broker_id
        self.replicas = replicas
        self.data = data
        self.controller_call = controller_call
        self.image = image
        self.clock_ms = clock_ms
        self.partitions_wanted = partitions_wanted
        self.replication_wanted = replication_wanted
        self.segment_bytes = segment_bytes
        self._compaction_checked = False
        self.shards: dict[int, Shard] = {}
        self._tasks: list[asyncio.Task] = []
        self._create_lock = asyncio.Lock()

    # -- what a subclass provides ------------------------------------------------
    @abc.abstractmethod
    def new_core(self) -> Any:
        """An empty core for a newly led partition."""

    @abc.abstractmethod
    def decode(self, key: bytes | None, value: bytes | None) -> Any:
        """The core's record for a stored key and value."""

    @abc.abstractmethod
    def encode(self, record: Any) -> tuple[bytes | None, bytes | None]:
        """The stored key and value of a core's record."""

    @abc.abstractmethod
    def tick_core(self, shard: Shard, now_ms: int) -> list:
        """Run the core's timers; the records they produce."""

    def on_loaded(self, shard: Shard) -> None:
        """A shard finished loading (e.g. resume work its state calls for)."""

    def replay_batch(self, shard: Shard, header: Any, batch: Any, from_offset: int) -> int:
        """Replay one stored batch into the shard's core; the records
        replayed. Control batches (transaction markers) hold no state here."""
        if header.is_control:
            return 0
        count = 0
        for record in iter_records(batch):
            if record.offset >= from_offset:
                shard.core.replay(self.decode(record.key, record.value))
                count += 1
        return count

    # -- lifecycle ---------------------------------------------------------------
    def start(self) -> None:
        self._tasks.append(asyncio.create_task(self._tick_loop(),
                                               name=f"{self.TOPIC}-coordinator-tick"))

    async def stop(self) -> None:
        tasks = self._tasks + [s.load_task for s in self.shards.values()
                               if s.load_task is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._tasks = []
        self.shards.clear()

    # -- following leadership ------------------------------------------------------
    def on_metadata(self) -> None:
        """Load the shards this broker now leads; drop the ones it does not."""
        for number in list(self.shards):
            part = self.replicas.partitions.get(TopicPartition(self.TOPIC, number))
            shard = self.shards[number]
            if part is None or not part.is_leader or part.leader_epoch != shard.leader_epoch:
                self._drop(shard, "it no longer leads the partition")
        partitions = self.replicas.partitions
        for tp in self.replicas.hosted_in(self.TOPIC):  # not every partition hosted
            part = partitions.get(tp)
            if part is None or not part.is_leader:
                continue
            if tp.partition not in self.shards:
                self._load(tp.partition, part.leader_epoch)

    def _drop(self, shard: Shard, why: str) -> None:
        if self.shards.get(shard.partition) is shard:
            del self.shards[shard.partition]
            logger.info("broker %d: no longer coordinating %s-%d: %s", self.broker_id,
                        self.TOPIC, shard.partition, why)
        if shard.load_task is not None:
            shard.load_task.cancel()

    def _load(self, partition: int, leader_epoch: int) -> None:
        shard = Shard(partition, leader_epoch, self.new_core())
        self.shards[partition] = shard
        shard.load_task = asyncio.create_task(self._replay(shard),
                                              name=f"{self.TOPIC}-load-{partition}")

    async def _replay(self, shard: Shard) -> None:
        """Read the partition's log from its start into the shard's core
        (control batches, i.e. transaction markers, hold no state)."""
        started = time.monotonic()
        count = 0
        try:
            part = self.replicas.partitions.get(TopicPartition(self.TOPIC, shard.partition))
            if part is None:
                return
            offset = part.log.log_start_offset
            # Until nothing new arrived while waiting (markers are appended by
            # others even while the shard loads): then ``loaded`` is set in
            # the same step, and later appends reach the core live.
            while True:
                end = part.log.log_end_offset
                stuck = False
                while offset < end:
                    data = part.log.read(offset, LOAD_CHUNK_BYTES)
                    if not data:
                        stuck = True
                        break
                    for header, batch in iter_batches(data):
                        if header.next_offset <= offset:
                            continue
                        count += self.replay_batch(shard, header, batch, offset)
                        offset = header.next_offset
                    await asyncio.sleep(0)  # let requests in between chunks
                # What was replayed may include a tail no follower has yet:
                # answer nothing from it until it is committed (it could be
                # truncated).
                while part.high_watermark < offset:
                    if self.shards.get(shard.partition) is not shard or not part.is_leader:
                        return
                    await asyncio.sleep(LOAD_COMMIT_POLL_S)
                if stuck or offset >= part.log.log_end_offset:
                    break
            loaded = getattr(shard.core, "loaded", None)
            if loaded is not None:
                loaded(self.clock_ms())
            shard.loaded = True
            logger.info("broker %d: coordinating %s-%d: loaded %d records in %.0f ms",
                        self.broker_id, self.TOPIC, shard.partition, count,
                        (time.monotonic() - started) * 1000)
            self.on_loaded(shard)
        except asyncio.CancelledError:
            raise
        except Exception:
            logger.exception("broker %d: cannot load %s-%d; will retry", self.broker_id,
                             self.TOPIC, shard.partition)
            if self.shards.get(shard.partition) is shard:
                del self.shards[shard.partition]  # the next metadata change retries

    # -- routing -------------------------------------------------------------------
    def partition_count(self) -> int | None:
        topic = self.image().topics.get(self.TOPIC)
        return len(topic.partitions) if topic is not None else None

    async def locate(self, key: str) -> dict:
        """The coordinator of ``key``: its partition, broker id and URL;
        creates the topic on first use."""
        count = self.partition_count()
        if count is None:
            await self._create_topic()
            count = self.partition_count()
            if count is None:
                raise CoordinatorNotAvailableError(
                    f"{self.TOPIC} is being created; retry shortly")
        elif not self._compaction_checked:
            await self._make_compacted()
        partition = partition_for(key, count)
        image = self.image()
        reg = image.partition(self.TOPIC, partition)
        if reg is None or reg.leader < 0:
            raise CoordinatorNotAvailableError(
                f"{self.TOPIC}-{partition}, which holds {self.WHAT} {key!r}, has no leader "
                "right now; retry shortly")
        return {"partition": partition, "coordinator_id": reg.leader,
                "coordinator_url": broker_url(image, reg.leader)}

    def topic_configs(self, replication: int) -> dict[str, str]:
        # Compacted, as Kafka's internal topics: the latest record of each
        # key stays forever, superseded ones go, so a new coordinator reads
        # about as many records as there are live keys. Small segments
        # (offsets.topic.segment.bytes) so the active segment, which is
        # never cleaned, stays small.
        return {"cleanup.policy": "compact",
                "segment.bytes": str(self.segment_bytes),
                "max.message.bytes": str(INTERNAL_MESSAGE_BYTES_MAX),
                "min.insync.replicas": str(min(2, replication))}

    async def _make_compacted(self) -> None:
        """A topic created before compaction existed kept every record
        (retention off): make it compacted, once per process. A failure is
        only logged; the next process tries again."""
        self._compaction_checked = True
        configs = self.image().topic_configs(self.TOPIC)
        if "compact" in configs.get("cleanup.policy", ""):
            return  # compacted already (perhaps compact,delete, as someone chose)
        ops = [{"name": "cleanup.policy", "op": "set", "value": "compact"},
               {"name": "segment.bytes", "op": "set", "value": str(self.segment_bytes)}]
        ops += [{"name": key, "op": "delete"} for key in ("retention.ms", "retention.bytes")
                if key in configs]
        try:
            answer = await self.controller_call("/v1/controller/configs/alter", {
                "resources": [{"type": "topic", "name": self.TOPIC, "ops": ops}]})
            error = (answer.get("resources") or [{}])[0].get("error")
            if error:
                raise RuntimeError(f"{error.get('code')}: {error.get('message')}")
            logger.info("broker %d: %s is compacted from now on", self.broker_id, self.TOPIC)
        except Exception as exc:  # noqa: BLE001  never stop a coordinator for this
            logger.warning("broker %d: could not make %s compacted: %s", self.broker_id,
                           self.TOPIC, exc)

    async def _create_topic(self) -> None:
        async with self._create_lock:
            image = self.image()
            if self.TOPIC in image.topics:
                return
            live = len(image.live_broker_ids())
            replication = max(1, min(self.replication_wanted, live))
            answer = await self.controller_call("/v1/controller/topics/create", {"topics": [{
                "name": self.TOPIC, "num_partitions": self.partitions_wanted,
                "replication_factor": replication,
                "configs": self.topic_configs(replication)}]})
            error = (answer.get("topics") or [{}])[0].get("error")
            if error and error.get("code") != "TOPIC_ALREADY_EXISTS":
                raise CoordinatorNotAvailableError(
                    f"cannot create {self.TOPIC}: {error.get('code')}: {error.get('message')}")
            logger.info("broker %d: created %s (%d partitions, replication factor %d)",
                        self.broker_id, self.TOPIC, self.partitions_wanted, replication)

    def shard_for(self, key: str) -> Shard:
        """The loaded shard coordinating ``key`` here, else the error that
        sends the client to the right broker or back after a pause."""
        count = self.partition_count()
        if count is None:
            raise CoordinatorNotAvailableError(
                f"{self.TOPIC} does not exist yet: find the coordinator first "
                f"(POST {self.FIND_PATH})")
        partition = partition_for(key, count)
        shard = self.shards.get(partition)
        if shard is None:
            image = self.image()
            reg = image.partition(self.TOPIC, partition)
            leader = reg.leader if reg is not None and reg.leader >= 0 else None
            if leader == self.broker_id:
                # Its partition is given to this broker, whose log is not
                # open yet (new logs are made off the event loop): soon here.
                raise CoordinatorLoadInProgressError(
                    f"broker {self.broker_id} coordinates {self.WHAT} {key!r} but is still "
                    f"opening {self.TOPIC}-{partition}; retry shortly")
            raise NotCoordinatorError(
                f"broker {self.broker_id} is not the coordinator of {self.WHAT} {key!r}"
                + (f"; broker {leader} is" if leader is not None else
                   "; it has none right now, retry shortly"),
                coordinator_id=leader,
                coordinator_url=broker_url(image, leader) if leader is not None else None)
        if not shard.loaded:
            raise CoordinatorLoadInProgressError(
                f"broker {self.broker_id} is loading {self.TOPIC}-{partition}; retry shortly")
        return shard

    # -- running operations ----------------------------------------------------------
    async def run(self, key: str, operation: Callable[[Any], Any]) -> Any:
        """``operation(core) -> (answer, records)`` on the key's shard; the
        answer once the records are committed (an answer that is an
        exception is raised then: the core refused after changing state)."""
        shard = self.shard_for(key)
        async with shard.lock:
            if self.shards.get(shard.partition) is not shard or not shard.loaded:
                shard = self.shard_for(key)  # raises: it moved or is reloading
            try:
                answer, records = operation(shard.core)
            except self.ERROR_TYPE as exc:
                raise CodedError(exc.code, exc.message) from None
            except Exception:
                # The core may have changed part-way: start again from the log.
                self._drop(shard, "an operation failed part-way; reloading from the log")
                self.on_metadata()
                raise
            if records:
                await self.write(shard, records)
            if isinstance(answer, self.ERROR_TYPE):
                raise CodedError(answer.code, answer.message)
            return answer

    async def write(self, shard: Shard, records: list) -> None:
        """Append ``records`` to the shard's partition; return once committed."""
        part = self.replicas.partitions.get(TopicPartition(self.TOPIC, shard.partition))
        if part is None or not part.is_leader or part.leader_epoch != shard.leader_epoch:
            self._drop(shard, "leadership moved during a write")
            raise NotCoordinatorError(f"{self.TOPIC}-{shard.partition} moved; find the "
                                      "coordinator again")
        batch = build_batch([self.encode(record) for record in records])
        try:
            await self.data.append_committed(part, batch, WRITE_TIMEOUT_MS)
        except Exception as exc:
            # The core is ahead of what is committed: start again from the log.
            self._drop(shard, "a write did not commit; reloading from the log")
            self.on_metadata()
            if isinstance(exc, RecordTooLargeError):
                raise CodedError("MESSAGE_TOO_LARGE", f"the change is too large for one "
                                 f"{self.TOPIC} batch ({exc})") from None
            raise

    async def _tick_loop(self) -> None:
        while True:
            await asyncio.sleep(TICK_INTERVAL_S)
            for shard in list(self.shards.values()):
                if not shard.loaded:
                    continue
                try:
                    async with shard.lock:
                        if self.shards.get(shard.partition) is not shard:
                            continue
                        records = self.tick_core(shard, self.clock_ms())
                        if records:
                            await self.write(shard, records)
                except KraftError as exc:
                    logger.info("broker %d: timers of %s-%d: %s", self.broker_id,
                                self.TOPIC, shard.partition, exc)
                except Exception:
                    logger.exception("broker %d: timers of %s-%d failed",
                                     self.broker_id, self.TOPIC, shard.partition)
