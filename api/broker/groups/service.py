"""The group coordinator's I/O shell: routing, persistence, loading, timers.

The protocol itself lives in ``coordinator.py`` (a pure core: time passed in,
records out). This module runs it on a broker, as Kafka does:

Where a group lives
    Group ``g`` belongs to partition ``hash(g) % N`` of the internal topic
    ``__consumer_offsets`` (``hash`` is Java's ``String.hashCode``, as
    Kafka's, so the same group lands on the same partition number). The
    broker that leads that partition is the group's coordinator. Any broker
    answers ``POST /v1/groups/coordinator``; the first such call creates the
    topic through the controller (``offsets.topic.num.partitions``,
    replication ``min(offsets.topic.replication.factor, live brokers)``,
    retention off: there is no compaction yet, so nothing may be deleted).

One core per led partition (a "shard")
    When this broker becomes leader of an ``__consumer_offsets`` partition
    it creates an empty core and replays the partition's log into it
    (``COORDINATOR_LOAD_IN_PROGRESS`` meanwhile); when it stops leading, the
    shard is dropped. A shard's operations run one at a time (its lock):
    the core computes the answer and the records that express the change,
    the records are appended to the partition and the answer is given only
    once they are committed (acks=all, through the produce purgatory). If a
    write fails, the core may be ahead of the log, so the shard is reloaded
    from the log before it answers again.

Timers
    Every ``TICK_INTERVAL_S`` each loaded shard's core expires silent
    members and missed revocations, and notices new partitions or topics
    matching a subscription; its records are written like any other.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from api.broker.groups import records as group_records
from api.broker.groups.coordinator import GroupCoordinatorCore, GroupError
from api.broker.replication import broker_url
from protocol.errors import (CodedError, CoordinatorLoadInProgressError,
                             CoordinatorNotAvailableError, KraftError, NotCoordinatorError)
from storage.batch import RecordTooLargeError, build_batch, decode_batches
from storage.manager import TopicPartition

logger = logging.getLogger(__name__)

OFFSETS_TOPIC = "__consumer_offsets"
#: How long a coordinator write may take to commit.
WRITE_TIMEOUT_MS = 5000
#: How often the cores' timers run.
TICK_INTERVAL_S = 0.25
#: While loading, how often to look whether the replayed tail is committed.
LOAD_COMMIT_POLL_S = 0.05
#: max.message.bytes of __consumer_offsets: room for a large group's batch.
OFFSETS_MESSAGE_BYTES_MAX = 16 * 1024 * 1024
#: Bytes read per step while loading a shard.
LOAD_CHUNK_BYTES = 1024 * 1024
#: How long asking another broker for offsets may take.
PEER_TIMEOUT_S = 5.0
#: How often the lag gauges are refreshed.
LAG_REFRESH_S = 5.0
#: group.id limits.
GROUP_ID_CHARS_MAX = 255


def java_string_hash(text: str) -> int:
    """Java's ``String.hashCode`` (over UTF-16 code units), as a signed int."""
    data = text.encode("utf-16-be")
    h = 0
    for i in range(0, len(data), 2):
        h = (31 * h + (data[i] << 8 | data[i + 1])) & 0xFFFFFFFF
    return h - (1 << 32) if h & 0x80000000 else h


def partition_for(group_id: str, partitions: int) -> int:
    """Kafka's ``Utils.abs(groupId.hashCode()) % partitions``."""
    return (java_string_hash(group_id) & 0x7FFFFFFF) % partitions


@dataclass
class Shard:
    """The groups of one ``__consumer_offsets`` partition this broker leads."""

    partition: int
    leader_epoch: int
    core: GroupCoordinatorCore
    loaded: bool = False
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    load_task: asyncio.Task | None = None


class GroupService:
    def __init__(self, broker_id: int, replicas: Any, data: Any,
                 controller_call: Callable[..., Any], image: Callable[[], Any],
                 settings: Mapping[str, Any], clock_ms: Callable[[], int]) -> None:
        self.broker_id = broker_id
        self.replicas = replicas
        self.data = data
        self.controller_call = controller_call
        self.image = image
        self.clock_ms = clock_ms
        # Typed and range-checked by the node config's schema.
        self.partitions_wanted = settings["offsets.topic.num.partitions"]
        self.replication_wanted = settings["offsets.topic.replication.factor"]
        self.core_settings = {
            "session_timeout_ms": settings["group.consumer.session.timeout.ms"],
            "heartbeat_interval_ms": settings["group.consumer.heartbeat.interval.ms"],
            "session_timeout_ms_min": settings["group.min.session.timeout.ms"],
            "session_timeout_ms_max": settings["group.max.session.timeout.ms"],
        }
        self.shards: dict[int, Shard] = {}
        # For the gauges, refreshed every LAG_REFRESH_S: (group, topic,
        # partition) -> high watermark - committed offset; group -> members.
        self.lags: dict[tuple[str, str, int], int] = {}
        self.member_counts: dict[str, int] = {}
        self._tick_task: asyncio.Task | None = None
        self._lag_task: asyncio.Task | None = None
        self._create_lock = asyncio.Lock()

    # -- lifecycle ---------------------------------------------------------------
    def start(self) -> None:
        self._tick_task = asyncio.create_task(self._tick_loop(), name="group-coordinator-tick")
        self._lag_task = asyncio.create_task(self._lag_loop(), name="group-lag")

    async def stop(self) -> None:
        tasks = [t for t in [self._tick_task, self._lag_task]
                 + [s.load_task for s in self.shards.values()] if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self.shards.clear()

    # -- following leadership ------------------------------------------------------
    def on_metadata(self) -> None:
        """Load the shards this broker now leads; drop the ones it does not."""
        for number in list(self.shards):
            part = self.replicas.partitions.get(TopicPartition(OFFSETS_TOPIC, number))
            shard = self.shards[number]
            if part is None or not part.is_leader or part.leader_epoch != shard.leader_epoch:
                self._drop(shard, "it no longer leads the partition")
        for tp, part in self.replicas.partitions.items():
            if tp.topic != OFFSETS_TOPIC or not part.is_leader:
                continue
            if tp.partition not in self.shards:
                self._load(tp.partition, part.leader_epoch)

    def _drop(self, shard: Shard, why: str) -> None:
        if self.shards.get(shard.partition) is shard:
            del self.shards[shard.partition]
            logger.info("broker %d: no longer coordinating %s-%d: %s", self.broker_id,
                        OFFSETS_TOPIC, shard.partition, why)
        if shard.load_task is not None:
            shard.load_task.cancel()

    def _load(self, partition: int, leader_epoch: int) -> None:
        shard = Shard(partition, leader_epoch, GroupCoordinatorCore(**self.core_settings))
        self.shards[partition] = shard
        shard.load_task = asyncio.create_task(self._replay(shard),
                                              name=f"group-load-{partition}")

    async def _replay(self, shard: Shard) -> None:
        """Read the partition's log from its start into the shard's core."""
        started = time.monotonic()
        count = 0
        try:
            part = self.replicas.partitions.get(TopicPartition(OFFSETS_TOPIC, shard.partition))
            if part is None:
                return
            offset = part.log.log_start_offset
            end = part.log.log_end_offset
            while offset < end:
                data = part.log.read(offset, LOAD_CHUNK_BYTES)
                if not data:
                    break
                for record in decode_batches(data):
                    if record.offset < offset:
                        continue
                    shard.core.replay(group_records.decode(record.key, record.value))
                    offset = record.offset + 1
                    count += 1
                await asyncio.sleep(0)  # let requests in between chunks
            # What was replayed may include a tail no follower has yet: answer
            # nothing from it until it is committed (it could be truncated).
            while part.high_watermark < offset:
                if self.shards.get(shard.partition) is not shard or not part.is_leader:
                    return
                await asyncio.sleep(LOAD_COMMIT_POLL_S)
            shard.core.loaded(self.clock_ms())
            shard.loaded = True
            logger.info("broker %d: coordinating %s-%d: loaded %d records in %.0f ms",
                        self.broker_id, OFFSETS_TOPIC, shard.partition, count,
                        (time.monotonic() - started) * 1000)
        except asyncio.CancelledError:
            raise
        except Exception:
            logger.exception("broker %d: cannot load %s-%d; will retry", self.broker_id,
                             OFFSETS_TOPIC, shard.partition)
            if self.shards.get(shard.partition) is shard:
                del self.shards[shard.partition]  # the next metadata change retries

    # -- routing -------------------------------------------------------------------
    def offsets_partitions(self) -> int | None:
        topic = self.image().topics.get(OFFSETS_TOPIC)
        return len(topic.partitions) if topic is not None else None

    async def find_coordinator(self, group_id: str) -> dict:
        count = self.offsets_partitions()
        if count is None:
            await self._create_offsets_topic()
            count = self.offsets_partitions()
            if count is None:
                raise CoordinatorNotAvailableError(
                    f"{OFFSETS_TOPIC} is being created; retry shortly")
        partition = partition_for(group_id, count)
        image = self.image()
        reg = image.partition(OFFSETS_TOPIC, partition)
        if reg is None or reg.leader < 0:
            raise CoordinatorNotAvailableError(
                f"{OFFSETS_TOPIC}-{partition}, which holds group {group_id!r}, has no leader "
                "right now; retry shortly")
        return {"group_id": group_id, "partition": partition, "coordinator_id": reg.leader,
                "coordinator_url": broker_url(image, reg.leader)}

    async def _create_offsets_topic(self) -> None:
        async with self._create_lock:
            image = self.image()
            if OFFSETS_TOPIC in image.topics:
                return
            live = len(image.live_broker_ids())
            replication = max(1, min(self.replication_wanted, live))
            answer = await self.controller_call("/v1/controller/topics/create", {"topics": [{
                "name": OFFSETS_TOPIC, "num_partitions": self.partitions_wanted,
                "replication_factor": replication,
                # No compaction yet: keep every commit rather than lose the latest.
                "configs": {"retention.ms": "-1", "retention.bytes": "-1",
                            "max.message.bytes": str(OFFSETS_MESSAGE_BYTES_MAX),
                            "min.insync.replicas": str(min(2, replication))}}]})
            error = (answer.get("topics") or [{}])[0].get("error")
            if error and error.get("code") != "TOPIC_ALREADY_EXISTS":
                raise CoordinatorNotAvailableError(
                    f"cannot create {OFFSETS_TOPIC}: {error.get('code')}: {error.get('message')}")
            logger.info("broker %d: created %s (%d partitions, replication factor %d)",
                        self.broker_id, OFFSETS_TOPIC, self.partitions_wanted, replication)

    def _shard_for(self, group_id: str) -> Shard:
        count = self.offsets_partitions()
        if count is None:
            raise CoordinatorNotAvailableError(
                f"{OFFSETS_TOPIC} does not exist yet: find the coordinator first "
                "(POST /v1/groups/coordinator)")
        partition = partition_for(group_id, count)
        shard = self.shards.get(partition)
        if shard is None:
            image = self.image()
            reg = image.partition(OFFSETS_TOPIC, partition)
            leader = reg.leader if reg is not None and reg.leader >= 0 else None
            raise NotCoordinatorError(
                f"broker {self.broker_id} is not the coordinator of group {group_id!r}"
                + (f"; broker {leader} is" if leader is not None else
                   "; it has none right now, retry shortly"),
                coordinator_id=leader,
                coordinator_url=broker_url(image, leader) if leader is not None else None)
        if not shard.loaded:
            raise CoordinatorLoadInProgressError(
                f"broker {self.broker_id} is loading the groups of {OFFSETS_TOPIC}-"
                f"{partition}; retry shortly")
        return shard

    def topics(self) -> dict[str, int]:
        """Topic -> partition count, as subscriptions see them."""
        return {name: len(topic.partitions) for name, topic in self.image().topics.items()
                if name != OFFSETS_TOPIC}

    # -- running operations ----------------------------------------------------------
    async def run(self, group_id: str, operation: Callable[[GroupCoordinatorCore], Any]) -> Any:
        """``operation(core) -> (answer, records)`` on the group's shard; the
        answer once the records are committed."""
        shard = self._shard_for(group_id)
        async with shard.lock:
            if self.shards.get(shard.partition) is not shard or not shard.loaded:
                shard = self._shard_for(group_id)  # raises: it moved or is reloading
            try:
                answer, records = operation(shard.core)
            except GroupError as exc:
                raise CodedError(exc.code, exc.message) from None
            except Exception:
                # The core may have changed part-way: start again from the log.
                self._drop(shard, "an operation failed part-way; reloading from the log")
                self.on_metadata()
                raise
            if records:
                await self._write(shard, records)
            return answer

    async def _write(self, shard: Shard, records: list) -> None:
        part = self.replicas.partitions.get(TopicPartition(OFFSETS_TOPIC, shard.partition))
        if part is None or not part.is_leader or part.leader_epoch != shard.leader_epoch:
            self._drop(shard, "leadership moved during a write")
            raise NotCoordinatorError(f"{OFFSETS_TOPIC}-{shard.partition} moved; find the "
                                      "coordinator again")
        batch = build_batch([group_records.encode(record) for record in records])
        try:
            await self.data.append_committed(part, batch, WRITE_TIMEOUT_MS)
        except Exception as exc:
            # The core is ahead of what is committed: start again from the log.
            self._drop(shard, "a write did not commit; reloading from the log")
            self.on_metadata()
            if isinstance(exc, RecordTooLargeError):
                raise CodedError("MESSAGE_TOO_LARGE", f"the group's change is too large for "
                                 f"one {OFFSETS_TOPIC} batch ({exc}); commit fewer partitions "
                                 "or shorter metadata at a time") from None
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
                        records = shard.core.tick(self.clock_ms(), self.topics())
                        if records:
                            await self._write(shard, records)
                except KraftError as exc:
                    logger.info("broker %d: group timers of %s-%d: %s", self.broker_id,
                                OFFSETS_TOPIC, shard.partition, exc)
                except Exception:
                    logger.exception("broker %d: group timers of %s-%d failed",
                                     self.broker_id, OFFSETS_TOPIC, shard.partition)

    # -- inspection ------------------------------------------------------------------
    async def _lag_loop(self) -> None:
        while True:
            await asyncio.sleep(LAG_REFRESH_S)
            try:
                await self.refresh_lags()
            except Exception:
                logger.exception("broker %d: cannot refresh group lag", self.broker_id)

    async def refresh_lags(self) -> None:
        """Lag of every committed partition of the groups coordinated here."""
        committed: dict[tuple[str, str, int], int] = {}
        members: dict[str, int] = {}
        for shard in list(self.shards.values()):
            if not shard.loaded:
                continue
            for group in shard.core.list_groups():
                members[group["group_id"]] = group["members"]
                for (topic, partition), value in shard.core.fetch_offsets(
                        group["group_id"]).items():
                    committed[(group["group_id"], topic, partition)] = value[0]
        ends = await self.end_offsets(sorted({(t, p) for _, t, p in committed}))
        self.lags = {key: max(0, ends[key[1:]] - offset) for key, offset in committed.items()
                     if key[1:] in ends}
        self.member_counts = members

    async def end_offsets(self, partitions: list[tuple[str, int]]
                           ) -> dict[tuple[str, int], int]:
        """High watermarks, asked of each partition's leader (None-less: a
        partition whose leader does not answer is left out)."""
        image = self.image()
        by_url: dict[str, list[tuple[str, int]]] = {}
        for topic, partition in partitions:
            reg = image.partition(topic, partition)
            url = broker_url(image, reg.leader) if reg is not None and reg.leader >= 0 else None
            if url:
                by_url.setdefault(url, []).append((topic, partition))
        ends: dict[tuple[str, int], int] = {}
        async with aiohttp.ClientSession() as session:
            async def ask(url: str, tps: list[tuple[str, int]]) -> None:
                body = {"partitions": [{"topic": t, "partition": p, "timestamp": -1}
                                       for t, p in tps]}
                try:
                    async with session.post(f"{url}/v1/offsets", json=body, headers={
                            "Accept": "application/json"},
                            timeout=aiohttp.ClientTimeout(total=PEER_TIMEOUT_S)) as answer:
                        for entry in (await answer.json()).get("partitions") or ():
                            if entry.get("error") is None:
                                ends[(entry["topic"], entry["partition"])] = entry["offset"]
                except (aiohttp.ClientError, asyncio.TimeoutError, ValueError):
                    pass  # lag unknown for these; the rest still answers
            await asyncio.gather(*(ask(url, tps) for url, tps in by_url.items()))
        return ends


    def list_local(self) -> list[dict]:
        groups = []
        for shard in self.shards.values():
            if shard.loaded:
                for group in shard.core.list_groups():
                    groups.append({**group, "coordinator_id": self.broker_id})
        return sorted(groups, key=lambda g: g["group_id"])
