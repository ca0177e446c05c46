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
import collections
import concurrent.futures
import dataclasses
import fcntl
import functools
import logging
import multiprocessing
import os
import shutil
import threading
import time
import uuid
from typing import Any, Callable, Iterable, Mapping

from storage import cleaner
from storage.checkpoint import (SYNCFS_AVAILABLE, OffsetCheckpoint, fsync_directory,
                                sync_filesystem, write_atomically)
from storage.config import NO_LIMIT, LogConfig
from storage.errors import InvalidConfigError, InvalidTopicError, LogDirectoryError
from storage.clock import retention_clock_ms
from storage.log import FlushTicket, Log, wall_clock_ms
from storage.names import TOPIC_NAME_MAX_CHARS, TopicPartition, validate_topic_name

log = logging.getLogger(__name__)

RECOVERY_POINT_FILE = "recovery-point-offset-checkpoint"
LOG_START_FILE = "log-start-offset-checkpoint"
CLEAN_SHUTDOWN_FILE = ".kraftlog_cleanshutdown"
#: The kernel's boot id when the dir was last opened: a process that died
#: without the machine restarting left everything it wrote in the page cache.
BOOT_ID_FILE = ".kraftlog_boot_id"
LOCK_FILE = ".lock"
DELETE_SUFFIX = "-delete"
#: A log whose cleaner pass failed is not tried again before this.
CLEAN_RETRY_AFTER_FAILURE_S = 60
#: Logs fsynced by one hand-over to the flush thread (``flush_logs_async``).
FLUSH_BATCH_LOGS = 64
#: Distinct topic-override sets whose LogConfig is kept (``_config_for``);
#: past it the cache starts again (topics with one-off overrides).
CONFIGS_KEPT = 4096


def _abort_flushes(batch: list[tuple[Log, FlushTicket]]) -> None:
    """Tickets begun and not synced: each log takes back what its ticket took."""
    for part_log, ticket in batch:
        if not (part_log.closed or part_log.offline):
            part_log.abort_flush(ticket)


def _sync_tickets(tickets: list[FlushTicket], group_fds: list[int | None] | None = None
                  ) -> list[Exception | None]:
    """Flush thread: make each ticket durable; each one's error, or None.
    One failing does not stop the others (their logs may be in other dirs).

    A ticket whose ``group_fds`` entry is None is fsynced file by file.
    Those given a file descriptor are written without fsyncs, and then one
    ``sync_filesystem`` per descriptor makes them all durable at once; if it
    fails, every ticket of that descriptor fails with it (which file lost
    its data is unknown: their dir goes offline, as for any fsync error)."""
    failures: list[Exception | None] = [None] * len(tickets)
    groups: dict[int, list[int]] = {}
    for i, ticket in enumerate(tickets):
        fd = group_fds[i] if group_fds is not None else None
        try:
            if fd is None:
                ticket.sync()
            else:
                ticket.write_unsynced()
                groups.setdefault(fd, []).append(i)
        except Exception as exc:  # noqa: BLE001  each ticket answers for itself
            failures[i] = exc
    for fd, members in groups.items():
        try:
            sync_filesystem(fd)
        except OSError as exc:
            for i in members:
                failures[i] = exc
    return failures


def _text_of(path: str) -> str | None:
    """A small file's text, stripped; None if empty or unreadable."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read().strip() or None
    except OSError:
        return None


def current_boot_id() -> str | None:
    """This boot of the machine (Linux's boot_id), None where unknown."""
    return _text_of("/proc/sys/kernel/random/boot_id")


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
    # log.flush.syncfs.min.logs (kraftlog's): a flush of this many logs of one
    # dir syncs its filesystem once instead of fsyncing each file; 0: never
    flush_syncfs_min_logs: int = 0

    def __post_init__(self) -> None:
        if not self.log_dirs:
            raise InvalidConfigError("log.dirs must name at least one directory")
        for name in ("retention_check_interval_ms", "flush_check_interval_ms",
                     "checkpoint_interval_ms", "producer_id_expiration_ms",
                     "producer_id_expiration_check_interval_ms"):
            if getattr(self, name) < 1:
                raise InvalidConfigError(f"{name} must be at least 1 ms")
        if self.flush_syncfs_min_logs < 0:
            raise InvalidConfigError("log.flush.syncfs.min.logs must be 0 or more")

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
            flush_syncfs_min_logs=int(settings.get(
                "log.flush.syncfs.min.logs", cls.flush_syncfs_min_logs)),
        )


@dataclasses.dataclass
class CleanerStats:
    """What the log cleaner has done since the broker started (``/metrics``)."""

    passes: int = 0
    #: Passes whose log changed meanwhile (truncation, retention, a delete).
    passes_discarded: int = 0
    passes_failed: int = 0
    bytes_read: int = 0
    bytes_written: int = 0
    #: Written / read of the last pass, in percent (Kafka's cleaner-recopy-percent).
    last_recopy_percent: float = 0.0
    #: Seconds of the last pass.
    last_seconds: float = 0.0
    #: ``time.monotonic()`` when the last pass ended, None before the first.
    last_run_monotonic: float | None = None


class LogManager:
    """Owns the ``Log`` of every partition this broker hosts."""

    def __init__(self, config: LogManagerConfig, default_log_config: LogConfig | None = None,
                 *, clock: Callable[[], int] = wall_clock_ms,
                 retention_clock: Callable[[], int] | None = None,
                 cleaner_config: cleaner.CleanerConfig | None = None,
                 boot_id: str | None = None) -> None:
        self.config = config
        # Which boot of the machine this is (the replication simulation
        # passes its own): see ``startup``.
        self.boot_id = boot_id if boot_id is not None else current_boot_id()
        self.cleaner_config = cleaner_config or cleaner.CleanerConfig()
        self.cleaner_stats = CleanerStats()
        self._cleaning: dict[TopicPartition, asyncio.Task] = {}
        #: Partitions whose last pass failed -> when: left alone for a while.
        self._clean_failed_at: dict[TopicPartition, float] = {}
        self._cleaner_executor: concurrent.futures.ProcessPoolExecutor | None = None
        self._cleaner_wakeup: asyncio.Event | None = None
        self.default_log_config = default_log_config or LogConfig()
        self._configs: dict[tuple, LogConfig] = {}  # see _config_for
        self.clock = clock
        # What time-based retention deletes by (storage/clock.py): with the
        # default clock, the earlier of it and the system clock; an injected
        # clock (tests, the simulator) is used for both.
        self.retention_clock = retention_clock or (
            retention_clock_ms if clock is wall_clock_ms else lambda: self.clock())
        self._logs: dict[TopicPartition, Log] = {}
        self._dir_of: dict[TopicPartition, str] = {}
        self._logs_in_dir: collections.Counter[str] = collections.Counter()
        # Log dirs with new partition directories whose names are not fsynced.
        self._unsynced_dirs: set[str] = set()
        # Each log dir's lock file, open while this process owns the dir, by
        # the dir as ``os.path.dirname`` of its logs' directories gives it; a
        # group flush syncs the dir's filesystem through it (opened before
        # anything was written there, it is told of every write-back error).
        self._lock_fds: dict[str, int] = {}
        self._tasks: list[asyncio.Task] = []
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        # Checkpoint snapshots are numbered on the owner thread; a write
        # (on any thread) never replaces a newer snapshot's file with an
        # older one's: after a truncation lowers a recovery point, a periodic
        # write still in flight must not raise it back.
        self._checkpoint_lock = threading.Lock()
        self._checkpoint_version = 0
        self._checkpoint_written: dict[str, int] = {}
        # Dirs where a truncation lowered a recovery point since their
        # checkpoints were last written (_watch_truncations).
        self._lowered_dirs: set[str] = set()
        # Logs written to since their last flush, in the order they were
        # (``logs_due_for_flush`` looks only at these).
        self._unflushed: dict[Log, None] = {}
        # Log dirs taken offline after a disk error (``fail_dir``) -> why,
        # and the partitions whose logs were in them -> their dir. Nothing
        # is read from or written to an offline dir again by this process.
        self.offline_dirs: dict[str, str] = {}
        self._offline_logs: dict[TopicPartition, str] = {}
        #: Told ``(dir, partitions whose logs were in it)`` when a dir goes
        #: offline (the broker stops serving them and tells the controller).
        self.dir_failure_listeners: list[Callable[[str, list[TopicPartition]], None]] = []
        # Set by the broker: per partition, the offset retention may not pass
        # (its high watermark), so uncommitted data is never deleted.
        self.retention_upper_bounds: Callable[[], Mapping[TopicPartition, int]] | None = None
        self.started = False
        self.nothing_unflushed_lost = False  # set by startup

    # -- start-up --------------------------------------------------------
    def startup(self) -> None:
        """Lock every log dir, load every partition, remove clean-shutdown
        markers (so a crash from now on is detected) and write checkpoints.

        ``nothing_unflushed_lost`` then says whether every dir lost nothing
        it had written since its last fsync: it had its marker (the last stop
        closed every log cleanly), or its last process ran in this same
        boot of the machine, so that crash was the process's alone and the
        page cache kept all it wrote (a machine crash or power loss changes
        the boot id; a dir taken offline by a disk error forgets it, since a
        failed write-back may drop cached pages). Kafka counts every crash
        as unclean; this tells the two apart. A loss stays on record (no
        boot id) until ``record_boot``: the broker calls it once the
        controller has its registration, which told it."""
        for directory in self.config.log_dirs:
            os.makedirs(directory, exist_ok=True)
            self._lock_dir(directory)
        for directory in self.config.log_dirs:
            try:
                self._load_dir(directory)
            except OSError as exc:
                # Which partitions the dir held may be unknowable, so none
                # may be created anew elsewhere: refuse to start (Kafka
                # with one log dir does the same).
                raise LogDirectoryError(
                    f"log dir {directory} cannot be read ({exc}); repair or replace the disk. "
                    "Removing the dir from log.dirs makes its replicas start empty and copy "
                    "back from their leaders: first make sure every partition it held has "
                    "another in-sync replica (a partition whose only in-sync replica was here "
                    "would lose what it acknowledged)") from exc
        self.nothing_unflushed_lost = all(
            os.path.exists(os.path.join(directory, CLEAN_SHUTDOWN_FILE))
            or (self.boot_id is not None
                and _text_of(os.path.join(directory, BOOT_ID_FILE)) == self._boot_record())
            for directory in self.config.log_dirs)
        if self.nothing_unflushed_lost:
            self.record_boot()
        elif self._logs:  # (a first start has nothing to lose)
            log.warning("log dirs %s: the last stop was not clean and the machine has booted "
                        "since (or the set of log dirs changed), so writes not yet fsynced may "
                        "be lost: this broker registers as unclean and leaves every eligible "
                        "leader replica set until it has caught up",
                        ", ".join(self.config.log_dirs))
        for directory in self.config.log_dirs:
            boot_file = os.path.join(directory, BOOT_ID_FILE)
            if not self.nothing_unflushed_lost and os.path.exists(boot_file):
                os.unlink(boot_file)
                fsync_directory(directory)
            marker = os.path.join(directory, CLEAN_SHUTDOWN_FILE)
            if os.path.exists(marker):
                os.unlink(marker)
                fsync_directory(directory)
        self.checkpoint()
        self.started = True

    def record_boot(self) -> None:
        """Note this boot in every online dir (see ``startup``): from now on a
        crash of this process alone loses nothing unflushed."""
        if self.boot_id is None:
            return
        for directory in self.online_dirs():
            try:
                write_atomically(os.path.join(directory, BOOT_ID_FILE),
                                 self._boot_record().encode("utf-8", "replace"))
            except OSError as exc:  # The next start counts as unclean: safe.
                log.warning("log dir %s: cannot record the boot id: %s", directory, exc)

    def _boot_record(self) -> str:
        """What a dir records of this start: the boot id and every log dir
        (a dir gone from log.dirs, its logs with it, is a loss too)."""
        return "\n".join([str(self.boot_id), *sorted(self.config.log_dirs)])

    def _lock_dir(self, directory: str) -> None:
        fd = os.open(os.path.join(directory, LOCK_FILE), os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise LogDirectoryError(
                f"log dir {directory} is in use by another process; stop it or choose "
                "another log.dirs") from None
        self._lock_fds[os.path.dirname(os.path.join(directory, "x"))] = fd

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
            self._watch(self._logs[tp], directory)
            self._dir_of[tp] = directory
            self._logs_in_dir[directory] += 1

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

    def log_dirs(self) -> Mapping[TopicPartition, str]:
        """Each hosted log's dir (one of ``config.log_dirs``), as a view:
        read it on the owner thread, without changing it."""
        return self._dir_of

    def get_log(self, tp: TopicPartition) -> Log | None:
        return self._logs.get(tp)

    def online_dirs(self) -> list[str]:
        return [d for d in self.config.log_dirs if d not in self.offline_dirs]

    def offline_logs(self) -> dict[TopicPartition, str]:
        """Partitions whose logs are in offline dirs -> the dir."""
        return dict(self._offline_logs)

    def fail_dir(self, directory: str, reason: str) -> None:
        """Take a log dir offline after a disk error (Kafka's log dir
        failure handling). Owner thread. Every log in it goes offline (each
        later call refuses with ``LogDirectoryError``) and its files are
        closed; no checkpoint, flush, retention, clean or new log touches
        the dir again; the listeners are told which partitions it held. A
        dir comes back only with a restart, which recovers it from its last
        checkpoint."""
        if directory in self.offline_dirs:
            return
        self.offline_dirs[directory] = reason
        try:  # A failed write-back may have dropped cached pages: not intact.
            os.unlink(os.path.join(directory, BOOT_ID_FILE))
        except OSError as exc:
            log.error("log dir %s: cannot forget its boot id (%s); if the broker restarts "
                      "before the machine does, remove %s by hand first", directory, exc,
                      BOOT_ID_FILE)
        gone = sorted(tp for tp, where in self._dir_of.items() if where == directory)
        log.critical("log dir %s is OFFLINE after a disk error (%s); its %d partition logs are "
                     "no longer served; %d log dirs remain online", directory, reason, len(gone),
                     len(self.online_dirs()))
        closing = []
        for tp in gone:
            part_log = self._logs.pop(tp)
            del self._dir_of[tp]
            self._offline_logs[tp] = directory
            part_log.offline = True
            closing.append(part_log)
        self._close_later(closing)
        self._logs_in_dir[directory] = 0
        self._lowered_dirs.discard(directory)
        self._unsynced_dirs.discard(directory)
        for listener in self.dir_failure_listeners:
            listener(directory, gone)

    def get_or_create_log(self, tp: TopicPartition,
                          overrides: Mapping[str, Any] | None = None, *,
                          sync: bool = True) -> Log:
        """The partition's log, created (in the least-loaded log dir) if new.
        ``overrides`` are topic-level configs (``{"retention.ms": ...}``);
        given for an existing log they replace its overrides, omitted they
        leave its config alone. ``sync`` False: the new directory's name is
        fsynced by the next flush tick, off the caller's thread (a broker
        given thousands of partitions at once must not fsync for each on its
        event loop); its files' names by the log's first flush."""
        existing = self._logs.get(tp)
        if existing is not None and overrides is None:
            return existing
        self._check_not_offline(tp)
        if existing is not None:
            config = self._config_for(overrides)
            existing.config = config
            if config.compact:
                self.wake_cleaner()  # perhaps compact only from now on
            return existing
        directory, config = self.reserve_new_log(tp, overrides)
        try:
            new_log = self.open_new_log(tp, directory, config)
        except OSError as exc:
            self.release_new_log(directory)
            self.fail_dir(directory, f"creating the log of {tp}: {exc}")
            self.log_offline(tp, directory)  # its partial files are there
            raise LogDirectoryError(f"cannot create the log of {tp} in {directory}: {exc}; "
                                    "the dir is offline") from exc
        except BaseException:
            self.release_new_log(directory)
            raise
        self.adopt_new_log(tp, directory, new_log, sync=sync)
        return new_log

    # A new log in three steps, for a caller that creates its files on
    # another thread: ``reserve_new_log`` and ``adopt_new_log`` (or
    # ``release_new_log``) on the owner thread, ``open_new_log`` on any.
    def reserve_new_log(self, tp: TopicPartition, overrides: Mapping[str, Any] | None = None
                        ) -> tuple[str, LogConfig]:
        """Check the name, choose the least-loaded log dir and count the log
        in it; the dir and the log's config. Owner thread."""
        assert tp not in self._logs, tp
        config = self._config_for(overrides)
        validate_topic_name(tp.topic)
        if tp.partition < 0:
            raise InvalidTopicError(f"partition {tp.partition} is negative")
        self._check_not_offline(tp)
        online = self.online_dirs()
        if not online:
            raise LogDirectoryError("every log dir is offline after disk errors")
        directory = min(online, key=lambda d: self._logs_in_dir[d])
        self._logs_in_dir[directory] += 1
        return directory, config

    def _config_for(self, overrides: Mapping[str, Any] | None) -> LogConfig:
        """The config of a log with these topic-level ``overrides``: built
        once per distinct set and shared (LogConfig is frozen), as the
        partitions of one topic, thousands perhaps, have the same."""
        try:
            # Each value's type is part of the key: 1 == True == 1.0 in Python,
            # and the parsers take one and refuse the others.
            key = (tuple(sorted((name, type(value), value) for name, value in overrides.items()))
                   if overrides else ())
            config = self._configs.get(key)
        except TypeError:  # a value that cannot be a key: built, not kept
            return LogConfig.from_mapping(overrides or {}, base=self.default_log_config)
        if config is None:
            config = LogConfig.from_mapping(overrides or {}, base=self.default_log_config)
            if len(self._configs) >= CONFIGS_KEPT:
                self._configs.clear()
            self._configs[key] = config
        return config

    def log_offline(self, tp: TopicPartition, directory: str) -> None:
        """A log whose files are in the offline ``directory`` but that was
        not hosted yet (being made when the dir failed, or failing to be
        made): offline like the others, the listeners told. Owner thread."""
        if tp in self._offline_logs:
            return
        self._offline_logs[tp] = directory
        for listener in self.dir_failure_listeners:
            listener(directory, [tp])

    def _close_later(self, logs: list[Log]) -> None:
        """Close offline logs' files on the flush thread: a flush of one of
        them may be stuck in an fsync on the failing disk, holding its
        segment's lock, and the event loop must not wait for it."""
        def close() -> None:
            for part_log in logs:
                try:
                    part_log.abandon()
                except OSError:
                    pass
        if not logs:
            return
        try:
            self._flush_executor().submit(close)
        except RuntimeError:  # the executor is shut down: the broker is stopping
            close()

    def _check_not_offline(self, tp: TopicPartition) -> None:
        """A log in an offline dir is never made anew in another: its data
        is there, and an empty copy would pass for it."""
        if tp in self._offline_logs:
            raise LogDirectoryError(
                f"the log of {tp} is in log dir {self._offline_logs[tp]}, offline after a disk "
                "error; it is served again after a restart with the disk repaired")

    def open_new_log(self, tp: TopicPartition, directory: str, config: LogConfig) -> Log:
        """Create (or open what is there of) the log's files. Any thread: it
        touches only that directory."""
        return Log.open(os.path.join(directory, str(tp)), config, clock=self.clock)

    def adopt_new_log(self, tp: TopicPartition, directory: str, new_log: Log, *,
                      sync: bool = False) -> None:
        """Host a log ``open_new_log`` made. Owner thread. One whose dir went
        offline while it was made is not hosted: it is offline with the rest
        of the dir (``LogDirectoryError``)."""
        if directory in self.offline_dirs:
            self._logs_in_dir[directory] = 0
            new_log.offline = True
            self._close_later([new_log])
            self.log_offline(tp, directory)
            raise LogDirectoryError(f"the log of {tp} was made in {directory}, which went "
                                    "offline after a disk error meanwhile")
        if sync or new_log.config.flush_messages != NO_LIMIT:
            # flush.messages: its records are on disk before they are
            # acknowledged, and so must its directory's name be.
            fsync_directory(directory)
        else:
            self._unsynced_dirs.add(directory)
        self._logs[tp] = new_log
        self._dir_of[tp] = directory
        self._watch(new_log, directory)

    def _watch(self, part_log: Log, directory: str) -> None:
        """A disk error in the log takes its whole dir offline (``fail_dir``).

        A truncation that lowers a log's recovery point gets its dir's
        checkpoints written before the log takes new data (Kafka writes
        them after a truncation too): with the old, higher recovery point
        on disk, a restart would trust records written after the
        truncation as if they had been fsynced and re-validated, and would
        learn their leader epoch at the wrong offset (the epoch of a batch
        re-read at the stale recovery point, not at the truncation point).
        Until then the file is merely shorter than the checkpoint says,
        which recovery handles. One write per dir covers every log
        truncated before it: a failover that cuts many followers' tails
        writes each dir once, at the first append after the cuts."""
        part_log.on_unflushed = functools.partial(self._unflushed.__setitem__, part_log, None)
        if part_log.unflushed:
            self._unflushed[part_log] = None
        part_log.on_recovery_point_lowered = lambda: self._lowered_dirs.add(directory)
        part_log.before_write_after_truncation = lambda: self._checkpoint_lowered_dirs(directory)
        part_log.on_io_error = lambda exc, what: self.fail_dir(directory, f"{what}: {exc}")

    def _checkpoint_lowered_dirs(self, writing_in: str) -> None:
        """Owner thread, before a write: checkpoint the dirs where a
        recovery point went down since their last write. A failure raises
        (the write is refused: KAFKA_STORAGE_ERROR) and is tried again by
        the next write."""
        if not self._lowered_dirs:
            return
        version, snapshot = self._checkpoint_snapshot()
        dirs = sorted(self._lowered_dirs)
        failed = self._write_checkpoints((version, {d: snapshot[d] for d in dirs
                                                    if d in snapshot}))
        self._lowered_dirs.difference_update(dirs)
        self._checkpoint_failed(failed)
        if writing_in in failed:
            raise LogDirectoryError(
                f"cannot write the recovery-point checkpoint of {writing_in} after a "
                f"truncation ({failed[writing_in]}); the dir is offline")

    def release_new_log(self, directory: str) -> None:
        """Undo ``reserve_new_log`` for a log that was not made. Owner thread."""
        self._logs_in_dir[directory] -= 1

    def delete_log(self, tp: TopicPartition) -> bool:
        """Remove a partition's data: rename its directory out of the way
        (atomic, so a crash never leaves half a log loaded) and delete it."""
        existing = self._logs.get(tp)
        if existing is None:
            # A log in an offline dir stays as it is, and its name stays
            # refused until a restart (``_check_not_offline``): a new log of
            # that name elsewhere would be a second copy on the next start.
            return False
        directory = self._dir_of[tp]
        # A short name (not "<topic>-<p>.<id>-delete"): a 249-character topic
        # name plus a suffix would pass the file system's 255-byte limit.
        doomed = os.path.join(directory, f".{uuid.uuid4().hex}{DELETE_SUFFIX}")
        os.rename(existing.directory, doomed)  # open files follow the rename
        del self._logs[tp], self._dir_of[tp]  # forgotten only once moved away
        self._logs_in_dir[directory] -= 1
        existing.abandon()
        fsync_directory(directory)
        shutil.rmtree(doomed, ignore_errors=True)
        return True

    def describe_dirs(self) -> list[dict]:
        """Each log directory as Kafka's DescribeLogDirs tells it: its path,
        the file system's total and usable bytes (KIP-827), and every
        partition's log in it with its size."""
        out = []
        for directory in self.config.log_dirs:
            entry: dict = {"path": directory, "error": None, "total_bytes": None,
                           "usable_bytes": None, "size_bytes": 0, "logs": [],
                           "offline": directory in self.offline_dirs}
            if entry["offline"]:
                entry["error"] = f"offline after a disk error: {self.offline_dirs[directory]}"
                out.append(entry)
                continue
            try:
                fs = os.statvfs(directory)
                entry["total_bytes"] = fs.f_blocks * fs.f_frsize
                entry["usable_bytes"] = fs.f_bavail * fs.f_frsize
            except OSError as exc:
                entry["error"] = f"{type(exc).__name__}: {exc}"
            out.append(entry)
        where = {entry["path"]: entry for entry in out}
        for tp, part_log in sorted(self._logs.items()):
            entry = where[self._dir_of[tp]]
            size = part_log.size_bytes
            entry["size_bytes"] += size
            entry["logs"].append((tp, size))
        return out

    # -- periodic work ---------------------------------------------------
    def checkpoint(self) -> None:
        """Write every online log dir's recovery-point and log-start
        checkpoints (a dir whose write fails goes offline)."""
        self._checkpoint_failed(self._write_checkpoints(self._checkpoint_snapshot()))

    def _checkpoint_failed(self, failed: dict[str, str]) -> None:
        for directory, reason in sorted(failed.items()):
            self.fail_dir(directory, f"checkpoint: {reason}")

    def _checkpoint_snapshot(self) -> tuple[int, dict[str, tuple[dict, dict]]]:
        """Owner thread: ``(version, {dir: (recovery points, log starts)})``
        for the online dirs."""
        snapshot: dict[str, tuple[dict, dict]] = {d: ({}, {}) for d in self.online_dirs()}
        for tp, part_log in self._logs.items():
            recovery, starts = snapshot[self._dir_of[tp]]
            recovery[(tp.topic, tp.partition)] = part_log.recovery_point
            starts[(tp.topic, tp.partition)] = part_log.log_start_offset
        self._checkpoint_version += 1
        return self._checkpoint_version, snapshot

    def _write_checkpoints(self, versioned: tuple[int, dict[str, tuple[dict, dict]]]
                           ) -> dict[str, str]:
        """Any thread: write a snapshot taken by ``_checkpoint_snapshot``,
        per dir unless a newer snapshot of that dir is written already.
        Returns the dirs whose write failed -> the error, for the owner
        thread to take offline."""
        version, snapshot = versioned
        failed = {}
        with self._checkpoint_lock:
            for directory, (recovery, starts) in snapshot.items():
                if (self._checkpoint_written.get(directory, 0) > version
                        or directory in self.offline_dirs):
                    continue
                try:
                    OffsetCheckpoint(os.path.join(directory, RECOVERY_POINT_FILE)).write(recovery)
                    OffsetCheckpoint(os.path.join(directory, LOG_START_FILE)).write(starts)
                except OSError as exc:
                    failed[directory] = str(exc)
                    continue
                self._checkpoint_written[directory] = version
        return failed

    def run_retention(self, now_ms: int | None = None,
                      upper_bounds: Mapping[TopicPartition, int] | None = None) -> int:
        """Apply retention to every log; ``upper_bounds`` (high watermarks)
        keep uncommitted data. Returns the number of segments deleted."""
        now_ms = self.retention_clock() if now_ms is None else now_ms
        deleted = 0
        for tp, part_log in list(self._logs.items()):
            # A log the caller gave no bound for (not yet hosted) is left alone.
            bound = (None if upper_bounds is None
                     else upper_bounds.get(tp, part_log.log_start_offset))
            if part_log.offline:
                continue  # its dir went offline during this pass
            try:
                deleted += part_log.delete_retained_segments(now_ms, bound)
            except LogDirectoryError:
                continue  # its dir is offline now (fail_dir said why)
        return deleted

    def logs_due_for_flush(self, now_ms: int | None = None) -> list[Log]:
        """The logs ``flush.ms`` or ``flush.messages`` asks to fsync now,
        looked for among those written since their last flush (the flush
        scheduler's tick costs the partitions written to, not every one
        hosted: 10,000 quiet ones cost nothing)."""
        now_ms = self.clock() if now_ms is None else now_ms
        due = []
        unflushed = self._unflushed
        for part_log in list(unflushed):
            if not part_log.unflushed or part_log.closed or part_log.offline:
                del unflushed[part_log]  # flushed since (or gone): back when written to
            elif part_log.flush_due(now_ms):
                due.append(part_log)
        return due

    def unflushed_log_count(self) -> int:
        """Hosted logs holding data not fsynced yet (recovery point below the
        log end): waiting for ``flush.ms``, or for the flush thread. O(logs):
        for a metrics scrape, not a hot path."""
        return sum(1 for part_log in self._logs.values()
                   if part_log.recovery_point < part_log.log_end_offset)

    async def flush_logs_async(self, logs: Iterable[Log]) -> None:
        """fsync ``logs`` on the flush thread, ``FLUSH_BATCH_LOGS`` at a
        time: one trip to the thread and back per batch, not per log, so
        thousands of dirty partitions cost the event loop a few wake-ups,
        not thousands. The event loop keeps serving meanwhile."""
        loop = asyncio.get_running_loop()
        # Tickets with names, producer snapshots or an epoch checkpoint to
        # write go in batches of their own, not behind segments' fsyncs
        # (they are durable sooner so; the next flush would sync them again
        # meanwhile). A thousand partitions' first writes, each with a new
        # leader epoch to checkpoint, are then a few trips, not a thousand.
        first: list[tuple[Log, FlushTicket]] = []
        batch: list[tuple[Log, FlushTicket]] = []

        async def send(waiting: list[tuple[Log, FlushTicket]]) -> None:
            sending = waiting[:]
            waiting.clear()
            if sending:
                await self._sync_flush_batch(loop, sending)

        try:
            for part_log in logs:
                if part_log.closed or part_log.offline:
                    continue
                try:
                    ticket = part_log.begin_flush()
                except LogDirectoryError:
                    continue  # its dir went offline (begin_flush said why)
                waiting = first if (ticket.directory is not None or ticket.files
                                    or ticket.epoch_write is not None) else batch
                waiting.append((part_log, ticket))
                if len(waiting) >= FLUSH_BATCH_LOGS:
                    await send(first)  # ``first`` goes ahead of a full ``batch``
                    if waiting is batch:
                        await send(batch)
            await send(first)
            await send(batch)
        finally:
            _abort_flushes(first + batch)  # begun, never handed to the thread (cancelled)

    async def _sync_flush_batch(self, loop: asyncio.AbstractEventLoop,
                                batch: list[tuple[Log, FlushTicket]]) -> None:
        try:
            failures = await loop.run_in_executor(self._flush_executor(), _sync_tickets,
                                                  [ticket for _, ticket in batch],
                                                  self._group_fds(batch))
        except BaseException:
            _abort_flushes(batch)  # cancelled, or the executor is shut down
            raise
        for (part_log, ticket), failure in zip(batch, failures):
            if part_log.closed or part_log.offline:
                continue  # deleted or moved meanwhile (its files renamed, closed)
            if failure is not None and not isinstance(failure, OSError):
                log.error("fsync of %s failed", part_log.directory, exc_info=failure)
                part_log.abort_flush(ticket)  # not a disk's error: tried again later
                continue
            if failure is not None:
                # A failed fsync leaves unknown data on the disk (the kernel
                # may have dropped the dirty pages): never retried, the dir
                # goes offline.
                part_log.io_failed(failure, "fsync")
                continue
            part_log.end_flush(ticket)

    def _group_fds(self, batch: list[tuple[Log, FlushTicket]]) -> list[int | None] | None:
        """Per ticket, the descriptor whose filesystem one ``syncfs`` makes it
        durable by (its dir has at least ``flush_syncfs_min_logs`` tickets in
        the batch), or None: fsync its files. A flush of a few logs fsyncs
        them (a filesystem shared with other writers is not synced for
        them); thousands of partitions' flushes (``flush.ms`` of a broker
        with thousands written to, their first flushes after a creation)
        cost a journal commit per batch, not several per log."""
        least = self.config.flush_syncfs_min_logs
        if not SYNCFS_AVAILABLE or least <= 0 or len(batch) < least:
            return None
        dirs = [os.path.dirname(part_log.directory) for part_log, _ in batch]
        counts = collections.Counter(dirs)
        return [self._lock_fds.get(d) if counts[d] >= least else None for d in dirs]

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
        if self.cleaner_config.enable:
            self._cleaner_wakeup = asyncio.Event()
            self._tasks.append(asyncio.create_task(self._cleaner_loop(), name="log-cleaner"))

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
        if self._unsynced_dirs:
            dirs, self._unsynced_dirs = self._unsynced_dirs, set()
            loop = asyncio.get_running_loop()
            pending = sorted(dirs)
            while pending:
                try:
                    await loop.run_in_executor(self._flush_executor(), fsync_directory,
                                               pending[0])
                except OSError as exc:
                    self.fail_dir(pending[0], f"fsync of the directory: {exc}")
                except BaseException:
                    self._unsynced_dirs.update(pending)  # again with the next tick
                    raise
                pending.pop(0)
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
        self._checkpoint_failed(await loop.run_in_executor(
            self._flush_executor(), self._write_checkpoints, snapshot))

    # -- the log cleaner ---------------------------------------------------
    def wake_cleaner(self) -> None:
        """Look for logs to clean now, not at the next backoff (a config
        change, or a test that wants a pass)."""
        if self._cleaner_wakeup is not None:
            self._cleaner_wakeup.set()

    async def _cleaner_loop(self) -> None:
        """Start passes on the dirtiest compacted logs, up to
        ``log.cleaner.threads`` at once; look again when one ends or after
        ``log.cleaner.backoff.ms``."""
        wakeup = self._cleaner_wakeup
        assert wakeup is not None
        while True:
            try:
                self._start_cleanings()
            except Exception:  # a failed look must not stop the cleaner
                log.exception("log cleaner failed to choose logs")
            try:
                await asyncio.wait_for(wakeup.wait(), self.cleaner_config.backoff_ms / 1000)
            except asyncio.TimeoutError:
                pass
            wakeup.clear()

    def _start_cleanings(self) -> None:
        free = self.cleaner_config.threads - len(self._cleaning)
        if free <= 0:
            return
        now_ms = self.clock()
        bounds = self.retention_upper_bounds() if self.retention_upper_bounds else None
        candidates = []
        retry_after = time.monotonic() - CLEAN_RETRY_AFTER_FAILURE_S
        for tp, part_log in self._logs.items():
            if tp in self._cleaning or not part_log.config.compact:
                continue
            if self._clean_failed_at.get(tp, retry_after) > retry_after:
                continue  # its last pass failed (logged): not in a tight loop
            if bounds is not None and tp not in bounds:
                continue  # not hosted (yet): no high watermark to stay under
            bound = None if bounds is None else bounds[tp]
            found = cleaner.needs_cleaning(part_log, now_ms, bound)
            if found is not None:
                candidates.append((found, tp, part_log))
        candidates.sort(key=lambda c: c[0].dirty_ratio, reverse=True)
        for found, tp, part_log in candidates[:free]:
            plan = cleaner.plan_clean(part_log, now_ms, found=found)
            if plan is not None:
                self._cleaning[tp] = asyncio.create_task(self._clean(tp, part_log, plan),
                                                         name=f"clean-{tp}")

    def _cleaner_pool(self) -> concurrent.futures.ProcessPoolExecutor:
        """``log.cleaner.threads`` cleaner processes (not threads: a clean
        decodes every record and would hold the GIL the event loop needs),
        started on first use, at a lower priority than the broker."""
        if self._cleaner_executor is None:
            threads = self.cleaner_config.threads
            self._cleaner_executor = concurrent.futures.ProcessPoolExecutor(
                max_workers=threads, mp_context=multiprocessing.get_context("spawn"),
                initializer=cleaner.init_cleaner_process,
                initargs=(self.cleaner_config.io_max_bytes_per_second / threads, os.getpid()))
        return self._cleaner_executor

    async def _clean(self, tp: TopicPartition, part_log: Log, plan: cleaner.CleanPlan) -> None:
        """One pass: the clean in a cleaner process, the swap on this thread."""
        loop = asyncio.get_running_loop()
        budget = self.cleaner_config.dedupe_buffer_size // self.cleaner_config.threads
        stats = self.cleaner_stats
        try:
            try:
                result = await loop.run_in_executor(self._cleaner_pool(),
                                                    cleaner.clean_in_process, plan, budget)
            except concurrent.futures.process.BrokenProcessPool:
                self._stop_cleaner_pool()  # a cleaner process died: start afresh next time
                raise
            result.plan = plan  # the copy that came back lacks the segment objects
            if self._logs.get(tp) is not part_log:
                result.discard()  # deleted or replaced meanwhile
                stats.passes_discarded += 1
                return
            if part_log.offline:
                result.discard()
                stats.passes_discarded += 1
                return
            try:
                swapped = cleaner.swap(part_log, result, delete_later=self._unlink_later)
            except FileNotFoundError:
                raise  # a planned segment went meanwhile (below): no disk error
            except OSError as exc:
                if not part_log.offline:
                    part_log.io_failed(exc, "swapping in a cleaned segment")
                raise LogDirectoryError(f"{tp}: swapping in a cleaned segment failed: "
                                        f"{exc}") from exc
            if not swapped:
                stats.passes_discarded += 1
                return
            stats.passes += 1
            stats.bytes_read += result.bytes_read
            stats.bytes_written += result.bytes_written
            stats.last_seconds = result.seconds
            stats.last_recopy_percent = (100.0 * result.bytes_written / result.bytes_read
                                         if result.bytes_read else 0.0)
            log.info("%s: cleaned offsets %d..%d in %.2f s: %d of %d records kept, "
                     "%d -> %d bytes", tp, plan.segments[0].base_offset, result.map_end - 1,
                     result.seconds, result.records_kept, result.records_read,
                     result.bytes_read, result.bytes_written)
        except asyncio.CancelledError:
            raise  # the process finishes alone; its output is removed at the next open
        except FileNotFoundError as exc:
            # A planned segment was deleted meanwhile (retention, a deleted
            # partition): the log changed, which is no failure.
            stats.passes_discarded += 1
            log.info("%s: a segment went while it was cleaned (%s); discarding the pass",
                     tp, exc.filename)
        except Exception:
            stats.passes_failed += 1
            self._clean_failed_at[tp] = time.monotonic()
            log.exception("%s: cleaning failed; the log is unchanged; trying again in %d s",
                          tp, CLEAN_RETRY_AFTER_FAILURE_S)
        else:
            self._clean_failed_at.pop(tp, None)
        finally:
            stats.last_run_monotonic = time.monotonic()
            self._cleaning.pop(tp, None)
            self.wake_cleaner()

    @property
    def cleaning(self) -> list[TopicPartition]:
        """The partitions a cleaner pass is under way for."""
        return list(self._cleaning)

    def _unlink_later(self, paths: list[str]) -> None:
        """Unlink the files of segments a clean replaced, on the flush
        thread: unlinking a large file can block for a while."""
        self._flush_executor().submit(cleaner.unlink_all, paths)

    def max_dirty_percent(self) -> float:
        """The highest dirty ratio of any compacted log, in percent."""
        now_ms = self.clock()
        ratios = [cleaner.cleanability(part_log, now_ms).dirty_ratio
                  for part_log in self._logs.values()
                  if part_log.config.compact and not part_log.closed]
        return 100.0 * max(ratios, default=0.0)

    async def stop_background_tasks(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []
        cleanings = list(self._cleaning.values())
        for task in cleanings:
            task.cancel()
        await asyncio.gather(*cleanings, return_exceptions=True)
        self._cleaning = {}

    # -- shutdown --------------------------------------------------------
    def shutdown(self) -> None:
        """Clean stop: flush and close every log, write checkpoints, then the
        clean-shutdown markers (last, so their presence proves the rest)."""
        for part_log in list(self._logs.values()):
            try:
                part_log.close()
            except LogDirectoryError:
                pass  # its dir went offline: no marker there
        self.checkpoint()
        for directory in self.online_dirs():
            try:
                write_atomically(os.path.join(directory, CLEAN_SHUTDOWN_FILE), b"")
            except OSError as exc:
                log.error("cannot write the clean-shutdown marker of %s: %s", directory, exc)
        self._release()

    def abandon(self) -> None:
        """Stop without flushing or markers: what a crash leaves (tests)."""
        for part_log in self._logs.values():
            part_log.abandon()
        self._release()

    def _release(self) -> None:
        # Cleaner processes and the flush thread first: none may write into
        # a log dir once its lock is free for another broker, and a group
        # flush syncs through the lock's descriptor.
        self._stop_cleaner_pool()
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None
        for fd in self._lock_fds.values():
            os.close(fd)
        self._lock_fds = {}
        self.started = False

    def _stop_cleaner_pool(self) -> None:
        """Stop the cleaner processes at once: a clean in progress only
        writes ``.cleaned`` files, which the next open deletes."""
        executor, self._cleaner_executor = self._cleaner_executor, None
        if executor is None:
            return
        processes = list((getattr(executor, "_processes", None) or {}).values())
        for process in processes:  # no public way to kill them
            try:
                process.kill()
            except (OSError, AttributeError):
                pass
        for process in processes:
            try:
                process.join(5)
            except (OSError, AttributeError, AssertionError):
                pass
        executor.shutdown(wait=False, cancel_futures=True)
