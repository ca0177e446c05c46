"""The group coordinator's I/O shell: routing, persistence, loading, timers.

The protocol itself lives in ``coordinator.py`` (a pure core: time passed in,
records out). The machinery shared with the transaction coordinator (a core
per led ``__consumer_offsets`` partition, loaded from its log, writes through
the produce purgatory, timers) is ``api/broker/coordinator_shards.py``; this
module adds what is particular to groups: Kafka's placement of a group
(``abs(javaHash(group)) % offsets.topic.num.partitions``), the core's
settings, subscriptions seeing the topics, and the lag gauges.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from typing import Any

import aiohttp

from api.broker.coordinator_shards import (WRITE_TIMEOUT_MS, Shard,  # noqa: F401
                                           ShardedCoordinator, java_string_hash,
                                           partition_for)
from api.broker.groups import records as group_records
from api.broker.groups.coordinator import GroupCoordinatorCore, GroupError
from api.broker.replication import broker_url
from protocol import tls
from protocol.aio import wait_event
from protocol.errors import CodedError, KraftError, NotCoordinatorError
from storage.batch import BatchBuilder, ControlType, iter_records, parse_control_batch
from storage.manager import TopicPartition

logger = logging.getLogger(__name__)

OFFSETS_TOPIC = "__consumer_offsets"
#: How long asking another broker for offsets may take.
PEER_TIMEOUT_S = 5.0
#: How often the lag gauges are refreshed.
LAG_REFRESH_S = 5.0
#: group.id limits.
GROUP_ID_CHARS_MAX = 255


class GroupService(ShardedCoordinator):
    TOPIC = OFFSETS_TOPIC
    WHAT = "group"
    FIND_PATH = "/v1/groups/coordinator"
    ERROR_TYPE = GroupError

    def __init__(self, broker_id: int, replicas: Any, data: Any,
                 controller_call: Callable[..., Any], image: Callable[[], Any],
                 settings: Mapping[str, Any], clock_ms: Callable[[], int]) -> None:
        # Typed and range-checked by the node config's schema.
        super().__init__(broker_id, replicas, data, controller_call, image, clock_ms,
                         settings["offsets.topic.num.partitions"],
                         settings["offsets.topic.replication.factor"],
                         settings["offsets.topic.segment.bytes"])
        self.core_settings = {
            "session_timeout_ms": settings["group.consumer.session.timeout.ms"],
            "heartbeat_interval_ms": settings["group.consumer.heartbeat.interval.ms"],
            "session_timeout_ms_min": settings["group.min.session.timeout.ms"],
            "session_timeout_ms_max": settings["group.max.session.timeout.ms"],
        }
        # For the gauges, refreshed every LAG_REFRESH_S: (group, topic,
        # partition) -> high watermark - committed offset; group -> members.
        self.lags: dict[tuple[str, str, int], int] = {}
        self.member_counts: dict[str, int] = {}
        # Members waiting in ``watch``: group -> member -> the events to set
        # when a heartbeat of the member would have news.
        self.watchers: dict[str, dict[str, set[asyncio.Event]]] = {}

    def start(self) -> None:
        super().start()
        self._tasks.append(asyncio.create_task(self._lag_loop(), name="group-lag"))

    def new_core(self) -> GroupCoordinatorCore:
        return GroupCoordinatorCore(**self.core_settings)

    def decode(self, key: bytes | None, value: bytes | None) -> Any:
        return group_records.decode(key, value)

    def encode(self, record: Any) -> tuple[bytes | None, bytes | None]:
        return group_records.encode(record)

    def tick_core(self, shard: Shard, now_ms: int) -> list:
        records = shard.core.tick(now_ms, self.topics())
        for group_id in {record.group_id for record in records}:
            self.notify(group_id, shard)
        return records

    # -- watches: a rebalance at the speed of requests ----------------------------------
    async def run(self, key: str, operation: Callable[[Any], Any]) -> Any:
        try:
            return await super().run(key, operation)
        finally:
            if key in self.watchers:
                self.notify(key)

    async def watch(self, group_id: str, member_id: str, max_wait_ms: int) -> bool:
        """Wait until a heartbeat of ``member_id`` would have news
        (``GroupCoordinatorCore.has_news``): True at once if it has now,
        when it comes (or the member is gone), False after ``max_wait_ms``.
        Changes nothing, so a watch given up on costs nothing."""
        shard = self.shard_for(group_id)
        try:
            if shard.core.has_news(group_id, member_id):
                return True
        except GroupError as exc:
            raise CodedError(exc.code, exc.message) from None
        event = asyncio.Event()
        waiting = self.watchers.setdefault(group_id, {}).setdefault(member_id, set())
        waiting.add(event)
        try:
            return await wait_event(event, max_wait_ms / 1000)
        finally:
            waiting.discard(event)
            if not waiting:
                members = self.watchers.get(group_id, {})
                if members.get(member_id) is waiting:
                    del members[member_id]
                if not members:
                    self.watchers.pop(group_id, None)

    def notify(self, group_id: str, shard: Shard | None = None) -> None:
        """Wake the watches of the group's members whose heartbeat now has
        news; all of them if the group is no longer coordinated here (their
        heartbeat finds out where it went)."""
        members = self.watchers.get(group_id)
        if not members:
            return
        if shard is None:
            try:
                shard = self.shard_for(group_id)
            except KraftError:
                pass                                 # moved or reloading
        for member_id, events in members.items():
            try:
                news = shard is None or not shard.loaded or shard.core.has_news(group_id,
                                                                                member_id)
            except GroupError:
                news = True                          # gone: its heartbeat says so
            if news:
                for event in events:
                    event.set()

    def replay_batch(self, shard: Shard, header: Any, batch: Any, from_offset: int) -> int:
        """Transactional offset commits wait in the core for their marker."""
        if header.is_control:
            if header.producer_id >= 0:
                control_type, _ = parse_control_batch(batch)
                shard.core.complete_txn(header.producer_id, control_type == ControlType.COMMIT)
            return 0
        if not header.is_transactional:
            return super().replay_batch(shard, header, batch, from_offset)
        for record in iter_records(batch):
            shard.core.replay_txn(header.producer_id, self.decode(record.key, record.value))
        return header.record_count

    # -- transactional offsets ----------------------------------------------------------
    def on_marker(self, item: Any) -> None:
        """A transaction marker was committed in a partition this broker
        leads (``DataApi.marker_listeners``)."""
        if item.tp.topic != OFFSETS_TOPIC:
            return
        shard = self.shards.get(item.tp.partition)
        if shard is not None and shard.loaded:
            shard.core.complete_txn(item.producer_id, item.committed)

    async def txn_commit(self, group_id: str, producer_id: int, producer_epoch: int,
                         offsets: Mapping[Any, Any]) -> dict:
        """TxnOffsetCommit: write the offsets in the producer's transaction
        (a transactional batch with its id and epoch); they become the
        group's committed offsets when the transaction commits."""
        shard = self.shard_for(group_id)
        async with shard.lock:
            if self.shards.get(shard.partition) is not shard or not shard.loaded:
                shard = self.shard_for(group_id)
            try:
                results, records = shard.core.txn_offset_records(self.clock_ms(), group_id,
                                                                 offsets)
            except GroupError as exc:
                raise CodedError(exc.code, exc.message) from None
            if records:
                part = self.replicas.partitions.get(TopicPartition(OFFSETS_TOPIC,
                                                                   shard.partition))
                if part is None or not part.is_leader:
                    raise NotCoordinatorError(f"{OFFSETS_TOPIC}-{shard.partition} moved; find "
                                              "the coordinator again")
                builder = BatchBuilder(producer_id=producer_id, producer_epoch=producer_epoch,
                                       transactional=True)
                now = self.clock_ms()
                for record in records:
                    key, value = self.encode(record)
                    builder.append(key, value, timestamp_ms=now)
                await self.data.append_committed(part, builder.build(), WRITE_TIMEOUT_MS,
                                                 coordinator=True)
                for record in records:
                    shard.core.replay_txn(producer_id, record)
            return results

    # -- routing -------------------------------------------------------------------
    async def find_coordinator(self, group_id: str) -> dict:
        return {"group_id": group_id, **await self.locate(group_id)}

    def topics(self) -> dict[str, int]:
        """Topic -> partition count, as subscriptions see them."""
        return {name: len(topic.partitions) for name, topic in self.image().topics.items()
                if not name.startswith("__")}

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
        async with tls.session(self.peer_ssl) as session:
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
