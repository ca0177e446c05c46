"""The partitions this broker hosts, kept in step with the metadata image.

The ``BrokerLifecycle`` calls ``apply_image`` after every metadata change. For
each partition whose replicas include this broker, the manager opens (or
creates) its log, applies the topic's config overrides, and takes the
leader, epochs and ISR from the image. Partitions the image no longer gives
this broker (topic deleted, or recreated under the same name with a new topic
id) lose their logs, but only once the broker's image has caught up to its own
registration: an image still replaying the metadata log from the start is a
past state, in which a topic that exists today may not exist yet.

Each partition directory holds ``partition.metadata`` naming its topic id
(as Kafka's does), so a broker that was down while a topic was deleted and
recreated never serves the old topic's data as the new one's.

The produce and fetch handlers ask ``leader_partition`` for the partition
they write to or read from; it raises ``NotLeaderOrFollowerError`` with the
current leader when this broker is not it. Fetch long-polls and ``acks=all``
produces wait on ``data_waiter``; appends, high-watermark moves and role
changes wake them.

High watermarks survive restarts in each log directory's
``replication-offset-checkpoint`` (Kafka's file): written every
``replica.high.watermark.checkpoint.interval.ms`` and at shutdown, read when a
partition is first hosted, and clamped to the recovered log end.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable, Mapping

from api.broker.errors import (FencedLeaderEpochError, LeaderNotAvailableError,
                               NotLeaderOrFollowerError, UnknownLeaderEpochError)
from api.broker.partition import Partition
from kraft.config import BROKER_LISTENER
from kraft.errors import UnknownTopicOrPartitionError
from kraft.image import MetadataImage
from kraft.records import LEADER_RECOVERING, NO_LEADER
from kraft.topic_config import MIN_INSYNC_REPLICAS, builtin_defaults
from storage.checkpoint import CheckpointFormatError, OffsetCheckpoint, write_atomically
from storage.config import TOPIC_KEYS
from storage.log import AppendInfo
from storage.manager import LogManager, TopicPartition, validate_topic_name

logger = logging.getLogger(__name__)

PARTITION_METADATA_FILE = "partition.metadata"
HIGH_WATERMARK_FILE = "replication-offset-checkpoint"


def monotonic_ms() -> int:
    return int(time.monotonic() * 1000)


def read_topic_id(directory: str) -> str | None:
    """The topic id recorded in a partition directory, or None if absent."""
    try:
        with open(os.path.join(directory, PARTITION_METADATA_FILE), encoding="utf-8") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "topic_id":
                    return value.strip() or None
    except FileNotFoundError:
        return None
    return None


def _as_int(value, default: int) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


def broker_url(image: MetadataImage, broker_id: int) -> str | None:
    broker = image.brokers.get(broker_id)
    if broker is None:
        return None
    address = broker.endpoints.get(BROKER_LISTENER)
    return f"http://{address}" if address else None


class ReplicaManager:
    def __init__(self, broker_id: int, log_manager: LogManager, *,
                 topic_defaults: Mapping[str, str] | None = None,
                 clock_ms: Callable[[], int] = monotonic_ms) -> None:
        self.broker_id = broker_id
        self.log_manager = log_manager
        self.clock_ms = clock_ms
        # Topic-level defaults (this node's min.insync.replicas and friends).
        self.topic_defaults = dict(topic_defaults or builtin_defaults())
        self.partitions: dict[TopicPartition, Partition] = {}
        self.image = MetadataImage()
        # High watermarks read from the checkpoints, for partitions not yet
        # hosted (loaded on first use, after the log manager started).
        self._checkpointed: dict[TopicPartition, int] | None = None
        # ISR changes this broker made as leader (metrics).
        self.isr_shrinks = 0
        self.isr_expands = 0
        # Storage overrides each hosted log was opened with.
        self._overrides: dict[TopicPartition, dict[str, str]] = {}
        # Fetch long-polls waiting for data, by partition.
        self._waiters: dict[TopicPartition, set[asyncio.Future]] = {}
        log_manager.retention_upper_bounds = self.high_watermarks

    # -- following the metadata --------------------------------------------
    def apply_image(self, image: MetadataImage, caught_up: bool) -> None:
        """Host what ``image`` gives this broker; with ``caught_up`` also drop
        what it no longer gives. Called on the event loop after every change."""
        self.image = image
        now_ms = self.clock_ms()
        # Assigned by the image, whether or not its log opens: a log that
        # fails to open now is retried on the next change, never deleted.
        assigned: set[TopicPartition] = set()
        for name, topic in image.topics.items():
            configs = image.topic_configs(name)
            overrides = {key: value for key, value in configs.items() if key in TOPIC_KEYS}
            min_isr = _as_int(configs.get(MIN_INSYNC_REPLICAS,
                                          self.topic_defaults.get(MIN_INSYNC_REPLICAS)), 1)
            for number, reg in topic.partitions.items():
                if self.broker_id not in reg.replicas:
                    continue
                tp = TopicPartition(name, number)
                assigned.add(tp)
                try:
                    part = self._hosted(tp, topic.topic_id, overrides, caught_up)
                except Exception:
                    logger.exception("broker %d: cannot open the log of %s", self.broker_id, tp)
                    continue
                if part is None:
                    continue
                part.min_insync_replicas = min_isr
                if not caught_up:
                    # A replayed past: the log is opened, but no role is taken
                    # from it (no epoch written, no high watermark moved, no
                    # ISR proposed). The caught-up image that follows decides.
                    continue
                before = (part.role, part.leader_epoch, part.high_watermark)
                recovery = reg.leader_recovery_state
                if part.update(reg.leader, reg.leader_epoch, reg.partition_epoch,
                               reg.replicas, reg.isr, now_ms, recovery):
                    self._log_new_leadership(part, recovery)
                if (part.role, part.leader_epoch, part.high_watermark) != before:
                    self.notify(tp)  # waiting fetches answer with the new role or data
        if caught_up:
            doomed = {tp for tp in self.partitions if tp not in assigned}
            doomed |= {tp for tp in self.log_manager.logs if tp not in assigned}
            for tp in sorted(doomed):
                try:
                    self._remove(tp, "its topic was deleted or it moved to other brokers")
                except Exception:
                    logger.exception("broker %d: cannot delete the log of %s",
                                     self.broker_id, tp)

    def _hosted(self, tp: TopicPartition, topic_id: str, overrides: dict,
                caught_up: bool) -> Partition | None:
        """The partition of topic ``topic_id``, opened or created; None when
        the log on disk belongs to another incarnation of the topic and the
        image is too old to say which one is current."""
        part = self.partitions.get(tp)
        if part is not None and part.topic_id != topic_id:
            if not caught_up:
                return None
            self._remove(tp, f"topic recreated with id {topic_id}")
            part = None
        if part is not None:
            if overrides != self._overrides.get(tp):
                self.log_manager.get_or_create_log(tp, overrides)
                self._overrides[tp] = overrides
            return part
        existing = self.log_manager.get_log(tp)
        if existing is not None:
            recorded = read_topic_id(existing.directory)
            if recorded is not None and recorded != topic_id:
                if not caught_up:
                    return None
                logger.warning("broker %d: %s on disk belongs to topic id %s, not %s; "
                               "deleting it", self.broker_id, tp, recorded, topic_id)
                self.log_manager.delete_log(tp)
        log = self.log_manager.get_or_create_log(tp, overrides)
        recorded = read_topic_id(log.directory)
        if recorded is None:
            write_atomically(os.path.join(log.directory, PARTITION_METADATA_FILE),
                             f"version: 0\ntopic_id: {topic_id}\n".encode())
        elif recorded != topic_id:
            raise RuntimeError(f"{tp}: the log at {log.directory} belongs to topic id "
                               f"{recorded}, not {topic_id}; refusing to serve it")
        part = Partition(tp, log, self.broker_id, topic_id,
                         high_watermark=self._checkpointed_high_watermark(tp))
        self.partitions[tp] = part
        self._overrides[tp] = overrides
        return part

    def _log_new_leadership(self, part: Partition, recovery: int) -> None:
        if recovery == LEADER_RECOVERING:
            logger.warning(
                "broker %d: UNCLEAN leader election: leads %s in epoch %d although it was not "
                "in sync; its log ends at offset %d (high watermark %d), so records the "
                "previous leader acknowledged at or above offset %d are LOST",
                self.broker_id, part.tp, part.leader_epoch, part.log_end_offset,
                part.high_watermark, part.log_end_offset)
        else:
            logger.info("broker %d: leader of %s in epoch %d (log end %d)", self.broker_id,
                        part.tp, part.leader_epoch, part.log_end_offset)

    def _remove(self, tp: TopicPartition, reason: str) -> None:
        logger.info("broker %d: deleting the log of %s (%s)", self.broker_id, tp, reason)
        self.partitions.pop(tp, None)
        self._overrides.pop(tp, None)
        self.log_manager.delete_log(tp)
        self.notify(tp)

    # -- lookups ---------------------------------------------------------------
    def leader_partition(self, topic: str, partition: int,
                         current_leader_epoch: int | None = None) -> Partition:
        """The partition if this broker leads it (in ``current_leader_epoch``
        when the caller names one); otherwise the error that tells the
        caller where to go."""
        part = self.partitions.get(TopicPartition(topic, partition))
        if part is None or not part.is_leader:
            reg = self.image.partition(topic, partition)
            if reg is None:
                validate_topic_name(topic)  # a name that can never exist is not retriable
                if topic in self.image.topics:
                    count = len(self.image.topics[topic].partitions)
                    raise UnknownTopicOrPartitionError(
                        f"topic {topic!r} has partitions 0 to {count - 1}, not {partition}")
                raise UnknownTopicOrPartitionError(
                    f"topic {topic!r} does not exist (create it with "
                    f"`kraftlog topics create {topic}`)")
            if reg.leader == NO_LEADER:
                raise LeaderNotAvailableError(
                    f"{topic}-{partition} has no leader: all its replicas {reg.replicas} "
                    "are unavailable", leader_epoch=reg.leader_epoch)
            raise NotLeaderOrFollowerError(
                f"broker {self.broker_id} is not the leader of {topic}-{partition}; "
                f"broker {reg.leader} is", leader_id=reg.leader,
                leader_epoch=reg.leader_epoch, leader_url=broker_url(self.image, reg.leader))
        if current_leader_epoch is not None and current_leader_epoch >= 0:
            if current_leader_epoch < part.leader_epoch:
                raise FencedLeaderEpochError(
                    f"{topic}-{partition}: leader epoch {current_leader_epoch} is stale; "
                    f"the current one is {part.leader_epoch}")
            if current_leader_epoch > part.leader_epoch:
                raise UnknownLeaderEpochError(
                    f"{topic}-{partition}: leader epoch {current_leader_epoch} is newer "
                    f"than this broker's {part.leader_epoch}; retry")
        return part

    def append(self, part: Partition, records) -> AppendInfo:
        info = part.append_as_leader(records)
        self.notify(part.tp)
        return info

    def high_watermarks(self) -> dict[TopicPartition, int]:
        return {tp: part.high_watermark for tp, part in self.partitions.items()}

    # -- high-watermark checkpoints ----------------------------------------------
    def _checkpointed_high_watermark(self, tp: TopicPartition) -> int | None:
        return self._load_checkpoints().get(tp)

    def _load_checkpoints(self) -> dict[TopicPartition, int]:
        if self._checkpointed is None:
            self._checkpointed = {}
            for directory in self.log_manager.config.log_dirs:
                path = os.path.join(directory, HIGH_WATERMARK_FILE)
                try:
                    stored = OffsetCheckpoint(path).read()
                except (CheckpointFormatError, OSError) as exc:
                    # Losing it costs only visibility until followers report.
                    logger.warning("broker %d: ignoring %s: %s", self.broker_id, path, exc)
                    continue
                self._checkpointed.update(
                    (TopicPartition(topic, p), hw) for (topic, p), hw in stored.items())
        return self._checkpointed

    def high_watermark_snapshot(self) -> dict[str, dict[tuple[str, int], int]]:
        """Event loop: ``{log dir: {(topic, partition): high watermark}}``
        for every log on disk (hosted ones as they are now, others as last
        checkpointed), to hand to ``write_high_watermarks`` on any thread."""
        dirs = {os.path.abspath(d): d for d in self.log_manager.config.log_dirs}
        snapshot: dict[str, dict[tuple[str, int], int]] = {d: {} for d in dirs.values()}
        # Read first, so a checkpoint written before any partition is hosted
        # keeps what the last one held.
        checkpointed = self._load_checkpoints()
        for tp, part_log in self.log_manager.logs.items():
            part = self.partitions.get(tp)
            hw = part.high_watermark if part is not None else checkpointed.get(tp)
            directory = dirs.get(os.path.dirname(os.path.abspath(part_log.directory)))
            if hw is not None and directory is not None:
                snapshot[directory][(tp.topic, tp.partition)] = hw
        return snapshot

    @staticmethod
    def write_high_watermarks(snapshot: dict[str, dict[tuple[str, int], int]]) -> None:
        for directory, offsets in snapshot.items():
            OffsetCheckpoint(os.path.join(directory, HIGH_WATERMARK_FILE)).write(offsets)

    # -- long-poll waiters -----------------------------------------------------
    def data_waiter(self, tps: list[TopicPartition]) -> asyncio.Future:
        """A future completed the next time any of ``tps`` gains committed
        data or changes role. The caller must ``forget_waiter`` it."""
        future = asyncio.get_running_loop().create_future()
        for tp in tps:
            self._waiters.setdefault(tp, set()).add(future)
        return future

    def forget_waiter(self, future: asyncio.Future, tps: list[TopicPartition]) -> None:
        for tp in tps:
            waiting = self._waiters.get(tp)
            if waiting is not None:
                waiting.discard(future)
                if not waiting:
                    del self._waiters[tp]

    def notify(self, tp: TopicPartition) -> None:
        for future in self._waiters.pop(tp, ()):
            if not future.done():
                future.set_result(None)
