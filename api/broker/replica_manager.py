"""The shell around the replication core: disks on one side, asyncio on the other.

``DiskLogs`` is the disk side of hosting partitions, which the core
(``replication.ReplicationCore``) calls through its ``HostedLogs`` interface:
open or create a partition's log in the ``LogManager``, apply topic config
overrides, delete it. Each partition directory holds ``partition.metadata``
naming its topic id (as Kafka's does), so a broker that was down while a
topic was deleted and recreated never serves the old topic's data as the new
one's. High watermarks survive restarts in each log directory's
``replication-offset-checkpoint`` (Kafka's file): written every
``replica.high.watermark.checkpoint.interval.ms`` and at shutdown, read when a
partition is first hosted, and clamped to the recovered log end.

``ReplicaManager`` drives the core on the event loop: it feeds it events
(metadata changes, requests from ``data_api``, answers from ``fetcher`` and
``isr``, timer ticks) with the monotonic clock, and carries out its actions:
it resolves the future of every answered request, hands follower fetches to
the ``FollowerFetchSender`` and ISR changes to the ``AlterPartitionSender``,
cancels what the core gave up on, and keeps one timer armed at the core's
next deadline. It decides nothing itself.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import errno
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import NamedTuple, Protocol

from api.broker.lifecycle_core import LifecycleCore
from api.broker.partition import Partition
from api.broker.replication import (LOG_PENDING, Action, CancelRequest, FetchRequest, MarkerItem,
                                    ProduceItem, ReplicationCore, ReplicationSettings,
                                    Respond, SendAlterPartition, SendFetch)
from kraft.image import MetadataImage
from protocol.aio import wait_event
from storage.checkpoint import CheckpointFormatError, OffsetCheckpoint
from storage.config import LogConfig
from storage.errors import LogDirectoryError
from storage.log import AppendInfo, Log
from storage.manager import LogManager, TopicPartition

logger = logging.getLogger(__name__)

PARTITION_METADATA_FILE = "partition.metadata"
#: How long a produce waits for a partition of this broker whose log is
#: still being opened, at most (and never beyond its own timeout).
OPENING_WAIT_MS = 5000
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


def _write_topic_id(log: Log, topic_id: str) -> None:
    """Write the log's ``partition.metadata``; no fsync here (on the event
    loop, for each of perhaps thousands of new logs): the file and its name
    reach the disk with the log's next flush."""
    path = os.path.join(log.directory, PARTITION_METADATA_FILE)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        data = f"version: 0\ntopic_id: {topic_id}\n".encode()
        if os.write(fd, data) != len(data):
            raise OSError(errno.EIO, f"short write of {path}")
    finally:
        os.close(fd)
    log.sync_later(path)


class _NewLog(NamedTuple):
    """A log ``DiskLogs._create`` makes on the executor."""
    tp: TopicPartition
    topic_id: str
    overrides: dict
    directory: str
    config: LogConfig


#: What making one new log gave: the log, whether its files hold the topic
#: id asked for, or the error that stopped it.
_Made = tuple[Log | None, bool, Exception | None]


class DiskLogs:
    """``HostedLogs`` over a ``LogManager``: partition logs on disk, their
    topic ids and high-watermark checkpoints.

    Given ``create_on`` (an executor) and ``created`` (called on the owner
    thread), a new log's files are made on that executor: ``open`` answers
    ``LOG_PENDING`` and ``created([tp])`` follows once the log is hosted.
    Making a partition's directory and files takes milliseconds of system
    calls; a broker given thousands at once keeps its event loop for
    requests and heartbeats this way. Without them (the simulator, unit
    tests), everything happens inside ``open``."""

    def __init__(self, broker_id: int, log_manager: LogManager, *,
                 create_on: concurrent.futures.Executor | None = None,
                 created: Callable[[list[TopicPartition]], None] | None = None) -> None:
        self.broker_id = broker_id
        self.log_manager = log_manager
        # Storage overrides each hosted log was opened with.
        self._overrides: dict[TopicPartition, dict[str, str]] = {}
        # High watermarks read from the checkpoints, for partitions not yet
        # hosted (loaded on first use, after the log manager started).
        self._checkpointed: dict[TopicPartition, int] | None = None
        self._create_on = create_on
        self._created = created
        # New logs whose files are being made on ``create_on``; and the
        # error of one that failed, raised by the next ``open`` of it.
        self._creating: set[TopicPartition] = set()
        self._create_failed: dict[TopicPartition, tuple[str, BaseException]] = {}
        # Logs ``_create`` made and hosted, by the topic id their files hold,
        # until the next ``open`` of each (which then trusts them as made).
        self._made: dict[TopicPartition, str] = {}
        self._stopped = False
        # Creations the executor finished, waiting for the owner's loop
        # (``_hand_back``): taken together, so a burst of new logs wakes the
        # loop once and reaches ``created`` as one list, not one call each.
        self._finished: list[tuple[list[_NewLog], concurrent.futures.Future]] = []
        self._finished_lock = threading.Lock()
        # Logs ``_create`` was asked for in this turn of the loop, not yet
        # handed to the executor (``_submit_new_logs``).
        self._to_make: list[_NewLog] = []

    def stop(self) -> None:
        """Creations still running are closed, not hosted, when they end."""
        self._stopped = True

    def open(self, tp: TopicPartition, topic_id: str, overrides: dict,
             caught_up: bool) -> tuple[Log, int | None] | None | str:
        if tp in self._creating:
            return LOG_PENDING
        failed = self._create_failed.pop(tp, None)
        if failed is not None and failed[0] == topic_id:  # (not a later topic's)
            raise failed[1]
        existing = self.log_manager.get_log(tp)
        if existing is None and self._create_on is not None:
            self._create(tp, topic_id, overrides)
            return LOG_PENDING
        made = self._made.pop(tp, None)  # trusted by this open only
        if existing is not None and made == topic_id and self._overrides.get(tp) == overrides:
            # Its files were just made here, holding this topic id, with
            # this config (``_create``): nothing to read back or rebuild.
            return existing, self._load_checkpoints().get(tp)
        if existing is not None:
            recorded = read_topic_id(existing.directory)
            if recorded is not None and recorded != topic_id:
                if not caught_up:
                    return None
                logger.warning("broker %d: %s on disk belongs to topic id %s, not %s; "
                               "deleting it", self.broker_id, tp, recorded, topic_id)
                self.log_manager.delete_log(tp)
        # No fsync here, on the event loop, for each of perhaps thousands of
        # new logs: their names and this file reach the disk with the next
        # flush (a file lost to a crash before it is written again).
        log = self.log_manager.get_or_create_log(tp, overrides, sync=False)
        recorded = read_topic_id(log.directory)
        if recorded is None:
            try:
                _write_topic_id(log, topic_id)
            except OSError as exc:
                log.io_failed(exc, "writing the topic id")
                raise LogDirectoryError(f"cannot write the topic id of {tp}: {exc}") from exc
        elif recorded != topic_id:
            raise RuntimeError(f"{tp}: the log at {log.directory} belongs to topic id "
                               f"{recorded}, not {topic_id}; refusing to serve it")
        self._overrides[tp] = overrides
        return log, self._load_checkpoints().get(tp)

    def _create(self, tp: TopicPartition, topic_id: str, overrides: dict) -> None:
        """Make a new log's files on ``create_on`` (see the class doc): the
        logs asked for in one turn of the loop go to the executor as one job,
        one hand-over for a metadata change that brings several."""
        directory, config = self.log_manager.reserve_new_log(tp, overrides)
        self._creating.add(tp)
        self._to_make.append(_NewLog(tp, topic_id, overrides, directory, config))
        if len(self._to_make) == 1:
            asyncio.get_running_loop().call_soon(self._submit_new_logs)

    def _submit_new_logs(self) -> None:
        """On the loop: the logs ``_create`` queued, to the executor at once."""
        jobs, self._to_make = self._to_make, []
        if not jobs:
            return
        loop = asyncio.get_running_loop()
        try:
            future = self._create_on.submit(self._make_logs, jobs)
        except RuntimeError:  # the executor was shut down: the broker stops
            for job in jobs:
                self._creating.discard(job.tp)
                self.log_manager.release_new_log(job.directory)
            return
        future.add_done_callback(lambda f: self._hand_back(loop, jobs, f))

    def _make_logs(self, jobs: list[_NewLog]) -> list[_Made]:
        """On the executor: each job's log (touching only its partition's
        directory), whether its files hold the job's topic id, or its error;
        one log's failure does not stop the others."""
        made = []
        for job in jobs:
            try:
                log = self.log_manager.open_new_log(job.tp, job.directory, job.config)
                recorded = None if log.fresh else read_topic_id(log.directory)
                if recorded is None:
                    _write_topic_id(log, job.topic_id)
                    recorded = job.topic_id
                made.append((log, recorded == job.topic_id, None))
            except Exception as exc:  # noqa: BLE001  handed back to the loop
                made.append((None, False, exc))
        return made

    def _hand_back(self, loop: asyncio.AbstractEventLoop, jobs: list[_NewLog],
                   future: concurrent.futures.Future) -> None:
        """On the executor: queue a finished job for the loop, waking it only
        if nothing was queued already (it takes them all then)."""
        with self._finished_lock:
            first = not self._finished
            self._finished.append((jobs, future))
        if first:
            try:
                loop.call_soon_threadsafe(self._take_finished)
            except RuntimeError:
                pass  # the loop is closed: the broker stopped, nothing to host it

    def _take_finished(self) -> None:
        """On the loop: every creation finished since the last call, hosted
        (or given up), then told to ``created`` in one list."""
        with self._finished_lock:
            finished, self._finished = self._finished, []
        created = []
        for jobs, future in finished:
            if future.cancelled():
                outcomes = None
            else:
                try:
                    outcomes = future.result()
                except BaseException as exc:  # noqa: BLE001  the job itself failed
                    outcomes = [(None, False, exc)] * len(jobs)
            for i, job in enumerate(jobs):
                try:
                    if self._host_new_log(job, None if outcomes is None else outcomes[i]):
                        created.append(job.tp)
                except Exception:  # one log's trouble does not keep the others
                    logger.exception("broker %d: hosting the new log of %s failed",
                                     self.broker_id, job.tp)
        if created and self._created is not None and not self._stopped:
            self._created(created)

    def _host_new_log(self, job: _NewLog, outcome: _Made | None) -> bool:
        """On the loop: host the made log or give it up (``outcome`` None:
        the job was cancelled); whether ``created`` should hear of it."""
        tp, directory = job.tp, job.directory
        self._creating.discard(tp)
        if outcome is None:
            self.log_manager.release_new_log(directory)
            return False
        log, holds_topic_id, error = outcome
        if error is not None or self._stopped:
            self.log_manager.release_new_log(directory)
            if isinstance(error, OSError):
                self.log_manager.fail_dir(directory, f"creating the log of {tp}: {error}")
                self.log_manager.log_offline(tp, directory)  # its partial files are there
            if error is None:
                log.abandon()
            else:
                self._create_failed[tp] = (job.topic_id, error)
            return True
        try:
            self.log_manager.adopt_new_log(tp, directory, log)
            self._overrides[tp] = job.overrides
            if holds_topic_id:
                self._made[tp] = job.topic_id
        except LogDirectoryError as exc:  # its dir went offline meanwhile
            self._create_failed[tp] = (job.topic_id, exc)
        return True

    def reconfigure(self, tp: TopicPartition, overrides: dict) -> None:
        if overrides != self._overrides.get(tp):
            self.log_manager.get_or_create_log(tp, overrides)
            self._overrides[tp] = overrides

    def delete(self, tp: TopicPartition) -> None:
        self._overrides.pop(tp, None)
        self._made.pop(tp, None)
        self._create_failed.pop(tp, None)
        self.log_manager.delete_log(tp)

    def hosted(self) -> set[TopicPartition]:
        return set(self.log_manager.logs)

    # -- high-watermark checkpoints ----------------------------------------------
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

    def high_watermark_snapshot(self, partitions: Mapping[TopicPartition, Partition]
                                ) -> dict[str, dict[tuple[str, int], int]]:
        """Event loop: ``{log dir: {(topic, partition): high watermark}}``
        for every log on disk (hosted ones as they are now, others as last
        checkpointed), to hand to ``write_high_watermarks`` on any thread."""
        snapshot: dict[str, dict[tuple[str, int], int]] = {
            d: {} for d in self.log_manager.online_dirs()}
        # Read first, so a checkpoint written before any partition is hosted
        # keeps what the last one held.
        checkpointed = self._load_checkpoints()
        for tp, directory in list(self.log_manager.log_dirs().items()):
            part = partitions.get(tp)
            hw = part.high_watermark if part is not None else checkpointed.get(tp)
            offsets = snapshot.get(directory)
            if hw is not None and offsets is not None:
                offsets[(tp.topic, tp.partition)] = hw
        return snapshot

    @staticmethod
    def write_high_watermarks(snapshot: dict[str, dict[tuple[str, int], int]]
                              ) -> dict[str, str]:
        """Any thread: write each dir's checkpoint; the dirs whose write
        failed -> the error (for the owner thread to take offline)."""
        failed = {}
        for directory, offsets in snapshot.items():
            try:
                OffsetCheckpoint(os.path.join(directory, HIGH_WATERMARK_FILE)).write(offsets)
            except OSError as exc:
                failed[directory] = str(exc)
        return failed


class RequestTasks:
    """The senders' requests in flight: one asyncio task per request id of
    the core, cancelled when the core gives up on it or the broker stops."""

    def __init__(self) -> None:
        self._tasks: dict[int, asyncio.Task] = {}
        self._stopped = False

    def start(self, request_id: int, coroutine, name: str) -> None:
        if self._stopped:
            coroutine.close()  # stopping: never started, never awaited
            return
        task = asyncio.create_task(coroutine, name=name)
        self._tasks[request_id] = task
        task.add_done_callback(lambda _t: self._tasks.pop(request_id, None))

    def cancel(self, request_id: int) -> None:
        task = self._tasks.pop(request_id, None)
        if task is not None:
            task.cancel()

    async def stop(self) -> None:
        self._stopped = True
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._tasks.clear()


class FetchSender(Protocol):
    def send(self, action: SendFetch) -> None: ...
    def cancel(self, request_id: int) -> None: ...


class AlterSender(Protocol):
    def send(self, action: SendAlterPartition) -> None: ...
    def cancel(self, request_id: int) -> None: ...


class ReplicaManager:
    """Drives the ``ReplicationCore`` on the event loop."""

    def __init__(self, broker_id: int, log_manager: LogManager, lifecycle: LifecycleCore,
                 settings: ReplicationSettings = ReplicationSettings(), *,
                 topic_defaults: Mapping[str, str] | None = None,
                 clock_ms: Callable[[], int] = monotonic_ms) -> None:
        self.broker_id = broker_id
        self.log_manager = log_manager
        # New logs' files are made here, off the event loop (DiskLogs).
        self._creator = concurrent.futures.ThreadPoolExecutor(
            1, thread_name_prefix=f"broker-{broker_id}-new-logs")
        self.disk = DiskLogs(broker_id, log_manager, create_on=self._creator,
                             created=self._logs_created)
        self.core = ReplicationCore(broker_id, self.disk, lifecycle, settings,
                                    topic_defaults=topic_defaults)
        self.clock_ms = clock_ms
        # Set by the server: where follower fetches and ISR changes go.
        self.fetch_sender: FetchSender | None = None
        self.alter_sender: AlterSender | None = None
        # Set by the server: called after a pass of the core's "open" timer
        # (logs opened later than the metadata change that assigned them).
        self.on_logs_opened: Callable[[], None] | None = None
        self._waiting: dict[int, asyncio.Future] = {}
        # Requests whose future gets the whole Respond (fetch_in_session).
        self._whole_answers: set[int] = set()
        # Replaced (after being set) on every pass over the metadata.
        self._passed = asyncio.Event()
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at_ms: int | None = None
        self._stopped = False
        log_manager.retention_upper_bounds = self.core.high_watermarks
        log_manager.dir_failure_listeners.append(self._dir_failed)
        # Disk errors can be met on other threads (start-up and shutdown run
        # the log manager on an executor): the core hears on this loop.
        try:
            self._loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            self._loop = None
        # The offline dirs and replicas last reported (_report_offline), and
        # what they were computed from (looked at again only when it moves).
        self._reported_offline: tuple[list[str], dict[str, list[int]]] = ([], {})
        self._reported_from: tuple[int, int, int] = (0, -1, 0)
        #: Set by the server: told the offline dirs and replicas (topic id
        #: -> partitions) after the core let go of a failed dir's partitions.
        self.on_dirs_offline: Callable[[list[str], dict[str, list[int]]], None] | None = None

    # -- what others read ----------------------------------------------------------
    @property
    def partitions(self) -> dict[TopicPartition, Partition]:
        return self.core.partitions

    def hosted_in(self, topic: str) -> list[TopicPartition]:
        return self.core.hosted_in(topic)

    @property
    def image(self) -> MetadataImage:
        return self.core.image

    def opening(self, topics: Iterable[str]) -> bool:
        return self.core.opening(topics)

    @property
    def isr_shrinks(self) -> int:
        return self.core.isr_shrinks

    @property
    def isr_expands(self) -> int:
        return self.core.isr_expands

    def leader_partition(self, topic: str, partition: int,
                         current_leader_epoch: int | None = None) -> Partition:
        return self.core.leader_partition(topic, partition, current_leader_epoch)

    # -- events in -------------------------------------------------------------------
    def apply_image(self, image: MetadataImage,
                    changed: Mapping[str, set[int] | None] | None = None) -> None:
        """``ReplicationCore.apply_image``: ``changed`` as it says."""
        self.core.apply_image(image, self.clock_ms(), changed)
        self._carry_out()
        self._note_pass()

    async def produce(self, items: list[ProduceItem], acks: int, timeout_ms: int
                      ) -> tuple[list[dict], list[tuple[str, AppendInfo]]]:
        # A partition given to this broker whose log is still being opened
        # (a topic created a moment ago): wait for it, within the request's
        # time, rather than answer LEADER_NOT_AVAILABLE at once.
        await self._until_open([item.tp for item in items],
                               min(timeout_ms, OPENING_WAIT_MS))
        request_id, future = self._new_request()
        appended = self.core.produce(request_id, items, acks, timeout_ms, self.clock_ms())
        self._carry_out()
        return await future, appended

    async def write_markers(self, items: list[MarkerItem], timeout_ms: int) -> list[dict]:
        request_id, future = self._new_request()
        self.core.write_markers(request_id, items, timeout_ms, self.clock_ms())
        self._carry_out()
        return await future

    async def fetch(self, request: FetchRequest) -> list[dict]:
        request_id, future = self._new_request()
        self.core.fetch(request_id, request, self.clock_ms())
        self._carry_out()
        return await future

    async def fetch_in_session(self, request: FetchRequest) -> tuple[list[dict], dict]:
        """A fetch in a fetch session (a follower's or a consumer's): the
        results and the answer's other fields (``session_id``, or the
        session's ``error``)."""
        request_id, future = self._new_request()
        self._whole_answers.add(request_id)
        try:
            self.core.fetch(request_id, request, self.clock_ms())
            self._carry_out()
            answer = await future
        finally:
            self._whole_answers.discard(request_id)
        return answer.results, answer.fields

    async def append_committed(self, part: Partition, records: bytes, timeout_ms: int,
                               coordinator: bool = False) -> tuple[dict, AppendInfo]:
        """Append as leader and wait until committed (the group coordinator's
        writes); the partition's result entry and what was appended."""
        request_id, future = self._new_request()
        try:
            info = self.core.append_committed(request_id, part, records, timeout_ms,
                                              self.clock_ms(), coordinator)
        except BaseException:
            self._waiting.pop(request_id, None)
            raise
        self._carry_out()
        return (await future)[0], info

    def fetch_answered(self, request_id: int, answer: dict) -> None:
        self.core.fetch_answered(request_id, answer, self.clock_ms())
        self._carry_out()

    def fetch_failed(self, request_id: int) -> None:
        self.core.fetch_failed(request_id, self.clock_ms())
        self._carry_out()

    def alter_partitions_answered(
            self, answers: Sequence[tuple[int, dict | None, str | None]]) -> None:
        """The controller's answers to ISR changes: (request id, answer,
        error code), those of one request together."""
        self.core.alter_partitions_answered(answers, self.clock_ms())
        self._carry_out()

    def _tick(self) -> None:
        self._timer, self._timer_at_ms = None, None
        passes = self.core.passes
        try:
            self.core.tick(self.clock_ms())
        finally:
            self._carry_out()
        if self.core.passes != passes:
            self._note_pass()
            if self.on_logs_opened is not None:
                # Logs opened by the core's "open" timer took roles after the
                # metadata listeners ran: the coordinators look again.
                self.on_logs_opened()

    async def _until_open(self, tps: list[TopicPartition], timeout_ms: int) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_ms / 1000
        while self.core.opening_any(tps) and not self._stopped:
            remaining = deadline - loop.time()
            if remaining <= 0:
                return  # the core answers for them as they are
            if not await wait_event(self._passed, remaining):
                return

    def _note_pass(self) -> None:
        """Wake what waits for logs to open (``_until_open``)."""
        passed, self._passed = self._passed, asyncio.Event()
        passed.set()

    def wait_for_creations(self) -> None:
        """Block until a log creation under way ends (after ``stop``; any
        thread): none may write in a log dir the log manager has shut down."""
        self._creator.shutdown(wait=True)

    def _logs_created(self, created: list[TopicPartition]) -> None:
        if self._stopped:
            return
        self.core.logs_created(created, self.clock_ms())
        self._carry_out()
        self._note_pass()
        if self.on_logs_opened is not None:
            self.on_logs_opened()  # (also when a log was deleted instead: waiters look again)

    def _dir_failed(self, directory: str, tps: list[TopicPartition]) -> None:
        """A log dir went offline (``LogManager.fail_dir``), perhaps in the
        middle of a core call whose append or read met the error, perhaps
        on another thread: the core lets go of its partitions on the loop,
        right after that call, not inside it."""
        if self._loop is None:  # no loop (a unit test driving it by hand)
            self._take_offline(tps)
            return
        try:
            self._loop.call_soon_threadsafe(self._take_offline, tps)
        except RuntimeError:
            pass  # the loop is closed: the broker has stopped

    def _take_offline(self, tps: list[TopicPartition]) -> None:
        if self._stopped:
            return
        self.core.logs_offline(tps, self.clock_ms())
        self._carry_out()
        if self.on_logs_opened is not None:
            self.on_logs_opened()  # the coordinators look again at what they host

    def _report_offline(self) -> None:
        """Tell the server (then the controller) every offline dir and
        replica whenever that changed: the core's offline set grew, or the
        image came to name a partition it held before it knew the topic
        (a dir that failed at start-up)."""
        source = (len(self.core.offline), self.core.image.offset,
                  len(self.log_manager.offline_dirs))
        if source == self._reported_from:
            return  # (a partition leaves the set only with a metadata change)
        self._reported_from = source
        replicas: dict[str, list[int]] = {}
        for tp in sorted(self.core.offline):
            topic = self.core.image.topics.get(tp.topic)
            if topic is not None:
                replicas.setdefault(topic.topic_id, []).append(tp.partition)
        report = (sorted(self.log_manager.offline_dirs), replicas)
        if report == self._reported_offline:
            return
        self._reported_offline = report
        if self.on_dirs_offline is not None:
            self.on_dirs_offline(*report)

    def stop(self) -> None:
        self._stopped = True
        self.disk.stop()
        self._creator.shutdown(wait=False, cancel_futures=True)  # none started from here
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    # -- actions out -------------------------------------------------------------------
    def _new_request(self) -> tuple[int, asyncio.Future]:
        request_id = self.core.new_request_id()
        future = asyncio.get_running_loop().create_future()
        self._waiting[request_id] = future
        return request_id, future

    def _carry_out(self) -> None:
        for action in self.core.ready():
            self._carry_out_one(action)
        self._arm_timer()
        if self.core.offline or self.log_manager.offline_dirs:
            self._report_offline()

    def _carry_out_one(self, action: Action) -> None:
        if isinstance(action, Respond):
            future = self._waiting.pop(action.request_id, None)
            if future is not None and not future.done():
                future.set_result(action if action.request_id in self._whole_answers
                                  else action.results)
        elif self._stopped:
            return  # stopping: nothing new goes out (the senders are closing)
        elif isinstance(action, SendFetch):
            if self.fetch_sender is not None:
                self.fetch_sender.send(action)
        elif isinstance(action, SendAlterPartition):
            if self.alter_sender is not None:
                self.alter_sender.send(action)
        elif isinstance(action, CancelRequest):
            for sender in (self.fetch_sender, self.alter_sender):
                if sender is not None:
                    sender.cancel(action.request_id)

    def _arm_timer(self) -> None:
        if self._stopped:
            return
        wake_ms = self.core.next_wake_ms()
        if wake_ms is None or wake_ms == self._timer_at_ms:
            return
        if self._timer is not None:
            self._timer.cancel()
        loop = asyncio.get_running_loop()
        delay_s = max(0.0, (wake_ms - self.clock_ms()) / 1000)
        self._timer = loop.call_later(delay_s, self._tick)
        self._timer_at_ms = wake_ms
