"""All partition logs of a broker, under its ``log.dirs``.

The manager loads every partition directory at start-up (recovering what an
unclean stop left unflushed), hands out logs, and runs the periodic work:
retention, flushes (fsync on a worker thread, never on the event loop) and
checkpoints. Per log directory it keeps Kafka's files::

    recovery-point-offset-checkpoint   everything below is fsynced
    log-start-offset-checkpoint        first offset still readable
    .kraftlog_cleanshutdown            present only after a clean stop
    .lock                              flock'ed while a process owns the dir

Threading: every method runs on the owner thread (the broker's event loop)
except the fsyncs, which ``flush_due_logs_async`` sends to an executor.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import fcntl
import logging
import os
import shutil
import uuid
from typing import Any, Callable, Iterable, Mapping

from storage.checkpoint import OffsetCheckpoint, fsync_directory, write_atomically
from storage.config import LogConfig
from storage.errors import InvalidConfigError, InvalidTopicError, LogDirectoryError
from storage.log import Log, wall_clock_ms
from storage.names import TOPIC_NAME_MAX_CHARS, TopicPartition, validate_topic_name

log = logging.getLogger(__name__)

RECOVERY_POINT_FILE = "recovery-point-offset-checkpoint"
LOG_START_FILE = "log-start-offset-checkpoint"
CLEAN_SHUTDOWN_FILE = ".kraftlog_cleanshutdown"
LOCK_FILE = ".lock"
DELETE_SUFFIX = "-delete"

def parse_partition_dir(name: str) -> TopicPartition | None:
    """``orders-3`` -> ``TopicPartition("orders", 3)``; None for other names."""
    if name.endswith(DELETE_SUFFIX):
        return None
    topic, sep, partition = name.rpartition("-")
    if not sep or not partition.isdigit():
        return None
    try:
        validate_topic_name(topic)
    except InvalidTopicError:
        return None
    return TopicPartition(topic, int(partition))


@dataclasses.dataclass(frozen=True)
class LogManagerConfig:
    """Broker-level settings of the manager (Kafka's names in comments)."""

    log_dirs: tuple[str, ...]
    # log.retention.check.interval.ms (Kafka: 300000)
    retention_check_interval_ms: int = 300_000
    # log.flush.scheduler.interval.ms: how often flush.ms is checked
    flush_check_interval_ms: int = 200
    # log.flush.offset.checkpoint.interval.ms (Kafka: 60000)
    checkpoint_interval_ms: int = 60_000
    # producer.id.expiration.ms (Kafka: 86400000)
    producer_id_expiration_ms: int = 86_400_000
    # producer.id.expiration.check.interval.ms (Kafka: 600000)
    producer_id_expiration_check_interval_ms: int = 600_000

    def __post_init__(self) -> None:
        if not self.log_dirs:
            raise InvalidConfigError("log.dirs must name at least one directory")
        for name in ("retention_check_interval_ms", "flush_check_interval_ms",
                     "checkpoint_interval_ms", "producer_id_expiration_ms",
                     "producer_id_expiration_check_interval_ms"):
            if getattr(self, name) < 1:
                raise InvalidConfigError(f"{name} must be at least 1 ms")

    @classmethod
    def from_broker_config(cls, settings: Mapping[str, Any]) -> "LogManagerConfig":
        dirs = settings.get("log.dirs", settings.get("log.dir"))
        if isinstance(dirs, str):
            dirs = [d.strip() for d in dirs.split(",") if d.strip()]
        if not dirs:
            raise InvalidConfigError("log.dirs must name at least one directory")
        return cls(
            log_dirs=tuple(dirs),
            retention_check_interval_ms=int(settings.get(
                "log.retention.check.interval.ms", cls.retention_check_interval_ms)),
            flush_check_interval_ms=int(settings.get(
                "log.flush.scheduler.interval.ms", cls.flush_check_interval_ms)),
            checkpoint_interval_ms=int(settings.get(
                "log.flush.offset.checkpoint.interval.ms", cls.checkpoint_interval_ms)),
            producer_id_expiration_ms=int(settings.get(
                "producer.id.expiration.ms", cls.producer_id_expiration_ms)),
            producer_id_expiration_check_interval_ms=int(settings.get(
                "producer.id.expiration.check.interval.ms",
                cls.producer_id_expiration_check_interval_ms)),
        )


class LogManager:
    """Owns the ``Log`` of every partition this broker hosts."""

    def __init__(self, config: LogManagerConfig, default_log_config: LogConfig | None = None,
                 *, clock: Callable[[], int] = wall_clock_ms) -> None:
        self.config = config
        self.default_log_config = default_log_config or LogConfig()
        self.clock = clock
        self._logs: dict[TopicPartition, Log] = {}
        self._dir_of: dict[TopicPartition, str] = {}
        self._lock_fds: list[int] = []
        self._tasks: list[asyncio.Task] = []
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        # Set by the broker: per partition, the offset retention may not pass
        # (its high watermark), so uncommitted data is never deleted.
        self.retention_upper_bounds: Callable[[], Mapping[TopicPartition, int]] | None = None
        self.started = False

    # -- start-up --------------------------------------------------------
    def startup(self) -> None:
        """Lock every log dir, load every partition, remove clean-shutdown
        markers (so a crash from now on is detected) and write checkpoints."""
        for directory in self.config.log_dirs:
            os.makedirs(directory, exist_ok=True)
            self._lock_dir(directory)
        for directory in self.config.log_dirs:
            self._load_dir(directory)
        for directory in self.config.log_dirs:
            marker = os.path.join(directory, CLEAN_SHUTDOWN_FILE)
            if os.path.exists(marker):
                os.unlink(marker)
                fsync_directory(directory)
        self.checkpoint()
        self.started = True

    def _lock_dir(self, directory: str) -> None:
        fd = os.open(os.path.join(directory, LOCK_FILE), os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise LogDirectoryError(
                f"log dir {directory} is in use by another process; stop it or choose "
                "another log.dirs") from None
        self._lock_fds.append(fd)

    def _load_dir(self, directory: str) -> None:
        clean = os.path.exists(os.path.join(directory, CLEAN_SHUTDOWN_FILE))
        recovery_points = self._read_checkpoint(directory, RECOVERY_POINT_FILE)
        log_starts = self._read_checkpoint(directory, LOG_START_FILE)
        if not clean and any(parse_partition_dir(name) for name in os.listdir(directory)):
            log.warning("%s: no clean-shutdown marker; recovering unflushed data", directory)
        for name in sorted(os.listdir(directory)):
            path = os.path.join(directory, name)
            if not os.path.isdir(path):
                continue
            if name.endswith(DELETE_SUFFIX):
                shutil.rmtree(path, ignore_errors=True)
                continue
            tp = parse_partition_dir(name)
            if tp is None:
                continue
            if tp in self._logs:
                raise LogDirectoryError(
                    f"partition {tp} exists in both {self._dir_of[tp]} and {directory}")
            key = (tp.topic, tp.partition)
            self._logs[tp] = Log.open(
                path, self.default_log_config, recovery_point=recovery_points.get(key, 0),
                log_start_offset=log_starts.get(key), clean_shutdown=clean, clock=self.clock)
            self._dir_of[tp] = directory

    @staticmethod
    def _read_checkpoint(directory: str, name: str) -> dict[tuple[str, int], int]:
        try:
            return OffsetCheckpoint(os.path.join(directory, name)).read()
        except ValueError as exc:
            # Losing a checkpoint costs time (full recovery), never data.
            log.warning("ignoring unreadable checkpoint: %s", exc)
            return {}

    # -- logs --------------------------------------------------------------
    @property
    def logs(self) -> dict[TopicPartition, Log]:
        return dict(self._logs)

    def get_log(self, tp: TopicPartition) -> Log | None:
        return self._logs.get(tp)

    def get_or_create_log(self, tp: TopicPartition,
                          overrides: Mapping[str, Any] | None = None) -> Log:
        """The partition's log, created (in the least-loaded log dir) if new.
        ``overrides`` are topic-level configs (``{"retention.ms": ...}``);
        given for an existing log they replace its overrides, omitted they
        leave its config alone."""
        existing = self._logs.get(tp)
        if existing is not None and overrides is None:
            return existing
        config = LogConfig.from_mapping(overrides or {}, base=self.default_log_config)
        if existing is not None:
            existing.config = config
            return existing
        validate_topic_name(tp.topic)
        if tp.partition < 0:
            raise InvalidTopicError(f"partition {tp.partition} is negative")
        directory = min(self.config.log_dirs,
                        key=lambda d: sum(1 for v in self._dir_of.values() if v == d))
        new_log = Log.open(os.path.join(directory, str(tp)), config, clock=self.clock)
        fsync_directory(directory)
        self._logs[tp] = new_log
        self._dir_of[tp] = directory
        return new_log

    def delete_log(self, tp: TopicPartition) -> bool:
        """Remove a partition's data: rename its directory out of the way
        (atomic, so a crash never leaves half a log loaded) and delete it."""
        existing = self._logs.get(tp)
        if existing is None:
            return False
        directory = self._dir_of[tp]
        # A short name (not "<topic>-<p>.<id>-delete"): a 249-character topic
        # name plus a suffix would pass the file system's 255-byte limit.
        doomed = os.path.join(directory, f".{uuid.uuid4().hex}{DELETE_SUFFIX}")
        os.rename(existing.directory, doomed)  # open files follow the rename
        del self._logs[tp], self._dir_of[tp]  # forgotten only once moved away
        existing.abandon()
        fsync_directory(directory)
        shutil.rmtree(doomed, ignore_errors=True)
        return True

    # -- periodic work ---------------------------------------------------
    def checkpoint(self) -> None:
        """Write every log dir's recovery-point and log-start checkpoints."""
        self._write_checkpoints(self._checkpoint_snapshot())

    def _checkpoint_snapshot(self) -> dict[str, tuple[dict, dict]]:
        """Owner thread: ``{dir: (recovery points, log starts)}``."""
        snapshot: dict[str, tuple[dict, dict]] = {d: ({}, {}) for d in self.config.log_dirs}
        for tp, part_log in self._logs.items():
            recovery, starts = snapshot[self._dir_of[tp]]
            recovery[(tp.topic, tp.partition)] = part_log.recovery_point
            starts[(tp.topic, tp.partition)] = part_log.log_start_offset
        return snapshot

    @staticmethod
    def _write_checkpoints(snapshot: dict[str, tuple[dict, dict]]) -> None:
        """Any thread: write a snapshot taken by ``_checkpoint_snapshot``."""
        for directory, (recovery, starts) in snapshot.items():
            OffsetCheckpoint(os.path.join(directory, RECOVERY_POINT_FILE)).write(recovery)
            OffsetCheckpoint(os.path.join(directory, LOG_START_FILE)).write(starts)

    def run_retention(self, now_ms: int | None = None,
                      upper_bounds: Mapping[TopicPartition, int] | None = None) -> int:
        """Apply retention to every log; ``upper_bounds`` (high watermarks)
        keep uncommitted data. Returns the number of segments deleted."""
        now_ms = self.clock() if now_ms is None else now_ms
        deleted = 0
        for tp, part_log in list(self._logs.items()):
            # A log the caller gave no bound for (not yet hosted) is left alone.
            bound = (None if upper_bounds is None
                     else upper_bounds.get(tp, part_log.log_start_offset))
            deleted += part_log.delete_retained_segments(now_ms, bound)
        return deleted

    def logs_due_for_flush(self, now_ms: int | None = None) -> list[Log]:
        now_ms = self.clock() if now_ms is None else now_ms
        return [part_log for part_log in self._logs.values() if part_log.flush_due(now_ms)]

    async def flush_logs_async(self, logs: Iterable[Log]) -> None:
        """fsync ``logs`` on the flush thread; the event loop keeps serving."""
        loop = asyncio.get_running_loop()
        for part_log in logs:
            if part_log.closed:
                continue
            ticket = part_log.begin_flush()
            await loop.run_in_executor(self._flush_executor(), ticket.sync)
            part_log.end_flush(ticket)

    def _flush_executor(self) -> concurrent.futures.ThreadPoolExecutor:
        if self._executor is None:
            self._executor = concurrent.futures.ThreadPoolExecutor(
                max_workers=1, thread_name_prefix="kraftlog-flush")
        return self._executor

    async def start_background_tasks(self) -> None:
        """Start retention, flush and checkpoint loops on the running loop."""
        self._tasks = [
            asyncio.create_task(self._every(self.config.retention_check_interval_ms,
                                            self._retention_tick), name="log-retention"),
            asyncio.create_task(self._every(self.config.flush_check_interval_ms,
                                            self._flush_tick), name="log-flush"),
            asyncio.create_task(self._every(self.config.checkpoint_interval_ms,
                                            self._checkpoint_tick), name="log-checkpoint"),
            asyncio.create_task(self._every(self.config.producer_id_expiration_check_interval_ms,
                                            self._producer_expiry_tick),
                                name="producer-id-expiration"),
        ]

    async def _every(self, interval_ms: int, tick) -> None:
        while True:
            await asyncio.sleep(interval_ms / 1000)
            try:
                await tick()
            except Exception:  # a failed tick must not stop the loop
                log.exception("log manager task %s failed", tick.__name__)

    async def _retention_tick(self) -> None:
        bounds = self.retention_upper_bounds
        self.run_retention(upper_bounds=bounds() if bounds is not None else None)

    async def _flush_tick(self) -> None:
        await self.flush_logs_async(self.logs_due_for_flush())

    def expire_producers(self, now_ms: int | None = None) -> int:
        """Forget idempotent producers silent for ``producer.id.expiration.ms``
        in every log. Returns how many went."""
        now_ms = self.clock() if now_ms is None else now_ms
        return sum(len(part_log.producer_state.remove_expired(
            now_ms, self.config.producer_id_expiration_ms)) for part_log in self._logs.values())

    async def _producer_expiry_tick(self) -> None:
        self.expire_producers()

    async def _checkpoint_tick(self) -> None:
        loop = asyncio.get_running_loop()
        snapshot = self._checkpoint_snapshot()
        await loop.run_in_executor(self._flush_executor(), self._write_checkpoints, snapshot)

    async def stop_background_tasks(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []

    # -- shutdown --------------------------------------------------------
    def shutdown(self) -> None:
        """Clean stop: flush and close every log, write checkpoints, then the
        clean-shutdown markers (last, so their presence proves the rest)."""
        for part_log in self._logs.values():
            part_log.close()
        self.checkpoint()
        for directory in self.config.log_dirs:
            write_atomically(os.path.join(directory, CLEAN_SHUTDOWN_FILE), b"")
        self._release()

    def abandon(self) -> None:
        """Stop without flushing or markers: what a crash leaves (tests)."""
        for part_log in self._logs.values():
            part_log.abandon()
        self._release()

    def _release(self) -> None:
        for fd in self._lock_fds:
            os.close(fd)
        self._lock_fds = []
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None
        self.started = False
