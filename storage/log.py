"""The log of one partition: ordered segments, offsets, epochs, retention.

A ``Log`` knows nothing of the network, replication or metadata. The broker
(``api/``) owns one per hosted partition and calls it from its event-loop
thread. The only method meant for another thread is ``FlushTicket.sync`` (the
fsyncs), so the event loop never blocks on the disk::

    ticket = log.begin_flush()                 # owner thread: cheap
    await loop.run_in_executor(None, ticket.sync)
    log.end_flush(ticket)                      # owner thread: advance recovery point

Directory layout (Kafka's)::

    <topic>-<partition>/
        00000000000000000000.log / .index / .timeindex
        00000000000000004211.log / .index / .timeindex   (one per segment)
        leader-epoch-checkpoint

The recovery point and log start offset are kept per log directory by the
``LogManager``; a ``Log`` is told them when it opens.

Invariants (``check_invariants``):
  - segments are contiguous: each starts where the previous one ends;
  - ``first segment base <= log_start_offset <= log_end_offset``;
  - ``recovery_point <= log_end_offset``; everything below it is fsynced;
  - every epoch in the cache starts at or below the log end offset.
"""

from __future__ import annotations

import bisect
import dataclasses
import errno
import functools
import logging
import os
import shutil
from typing import Callable

from storage import batch as fmt
from storage.cleaner import CleanerState, complete_swaps
from storage.checkpoint import (CheckpointFormatError, LeaderEpochCheckpoint, fsync_directory,
                                write_atomically)
from storage.clock import wall_clock_ms
from storage.config import LONG_MAX, NO_LIMIT, LogConfig
from storage.epoch_cache import LeaderEpochCache
from storage.errors import (InvalidOffsetError, InvalidRecordError, LogDirectoryError,
                            OffsetOutOfRangeError)
from storage.producer_state import Duplicate, ProducerStateManager, snapshot_offsets
from storage.txn_index import AbortedTxn, AbortedTxns
from storage.segment import LOG_SUFFIX, BatchMeta, Segment

log = logging.getLogger(__name__)

EPOCH_CHECKPOINT_NAME = "leader-epoch-checkpoint"
MAX_RELATIVE_OFFSET = 2**31 - 1  # relative offsets in the index are int32


#: Present in a partition directory once its log may hold gaps between
#: batches (a clean swapped in, or a follower copied a compacted leader's):
#: written and fsynced before the gaps reach the disk, never removed, so
#: recovery accepts them whatever config the log is opened with.
GAPS_MARKER = "may-have-gaps"


def _gaps_below(config: LogConfig, gaps_possible: bool) -> int:
    """Below which offset recovery accepts a gap between batches: anywhere
    in a log that may have gaps or is compacted; nowhere else (offsets are
    dense, and a jump means a corrupt base offset)."""
    return LONG_MAX if gaps_possible or config.compact else 0


@dataclasses.dataclass(frozen=True)
class AppendInfo:
    """What an append did: offsets assigned and the broker's clock then."""

    base_offset: int
    last_offset: int
    append_time_ms: int
    record_count: int
    size_bytes: int
    max_timestamp: int
    #: An idempotent producer's retry of a batch already in the log: nothing
    #: was written, and the offsets are the original batch's.
    duplicate: bool = False


@dataclasses.dataclass
class FlushTicket:
    """Segments to fsync and the offset that becomes the recovery point once
    they are. ``sync`` may run on any thread."""

    segments: list[Segment]
    offset: int
    directory: str | None  # fsync it too when segment files were created
    truncations: int  # the log's truncation count when the ticket was taken
    files: list[str] = dataclasses.field(default_factory=list)  # producer snapshots
    #: Writes the leader-epoch checkpoint (LeaderEpochCache.take_pending_write).
    epoch_write: Callable[..., None] | None = None
    #: The snapshots this ticket took from the log (``files`` also holds
    #: those of tickets still out); ``end_flush`` lets go of them.
    taken_files: list[str] = dataclasses.field(default_factory=list)

    def sync(self) -> None:
        if self.epoch_write is not None:
            self.epoch_write()
        for segment in self.segments:
            segment.sync()
        for path in self.files:
            try:
                fd = os.open(path, os.O_RDONLY)
            except FileNotFoundError:
                continue  # deleted since (truncation, retention)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        if self.directory is not None:
            fsync_directory(self.directory)

    def write_unsynced(self) -> None:
        """What ``sync`` writes, without its fsyncs: the caller makes the
        ticket durable by syncing the filesystem (``sync_filesystem``),
        which covers the segments, snapshots and names as well."""
        if self.epoch_write is not None:
            self.epoch_write(False)


#: OS errors that say the process ran out of something (file descriptors,
#: memory), not that the disk failed. A method that only reads
#: (``READ_ONLY``) is refused for them without taking the dir offline; any
#: other may have changed the log halfway, so the dir goes offline as for
#: any disk error (Kafka treats them alike).
NOT_DISK_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.EAGAIN,
                             errno.EINTR})
READ_ONLY = frozenset({"read", "offset_for_timestamp"})


def _io(method):
    """A ``Log`` method that touches files. Once any such method met an
    ``OSError`` (EIO, ENOSPC, ...) the log is offline: the error is reported
    to the owner (``on_io_error``, which takes the whole log directory
    offline, as Kafka does) and raised as ``LogDirectoryError``
    (KAFKA_STORAGE_ERROR), and every later call refuses at once. The log's
    files may then hold a torn write or unsynced bytes the page cache lost,
    so nothing is read from or written to them again by this process; the
    next start-up recovers them from the last checkpoint."""
    name = method.__name__

    @functools.wraps(method)
    def guarded(self: "Log", *args, **kwargs):
        if self.offline:
            raise LogDirectoryError(f"the log {self.directory} is offline after a disk error "
                                    "in its log directory")
        try:
            return method(self, *args, **kwargs)
        except OSError as exc:
            if exc.errno in NOT_DISK_ERRNOS and name in READ_ONLY:
                # The process, not the disk, and nothing changed: refused.
                raise LogDirectoryError(f"{name} of {self.directory} failed: {exc}") from exc
            self.io_failed(exc, name)
            raise LogDirectoryError(f"{name} of {self.directory} failed: {exc}; its log "
                                    "directory is now offline") from exc
    return guarded


def _make_directory(directory: str) -> bool:
    """Make ``directory`` (and its parents) if missing; whether it was."""
    try:
        os.mkdir(directory)
        return True
    except FileExistsError:
        return False
    except FileNotFoundError:  # a parent is missing too
        os.makedirs(os.path.dirname(directory) or ".", exist_ok=True)
        return _make_directory(directory)


class Log:
    """Segments of one partition, from ``log_start_offset`` to ``log_end_offset``."""

    def __init__(self, directory: str, config: LogConfig, segments: list[Segment],
                 epoch_cache: LeaderEpochCache, log_start_offset: int,
                 recovery_point: int, clock: Callable[[], int],
                 cleaner_state: CleanerState | None = None,
                 gaps_possible: bool = False) -> None:
        # Use Log.open; this only wires loaded parts together.
        self.directory = directory
        #: Whether ``open`` made the directory (nothing was there before).
        self.fresh = False
        self._config = config
        self.clock = clock
        self._segments = segments
        self._bases = [s.base_offset for s in segments]
        self.epoch_cache = epoch_cache
        self.log_start_offset = log_start_offset
        # Invariant: every byte below recovery_point is fsynced.
        self.recovery_point = recovery_point
        # Set by the owner (the log manager): a truncation that lowers the
        # recovery point calls ``on_recovery_point_lowered`` (note it), and
        # the next write first calls ``before_write_after_truncation``
        # (make the lower one durable), so the checkpoint on disk never
        # vouches for bytes written after the truncation.
        self.on_recovery_point_lowered: Callable[[], None] | None = None
        self.before_write_after_truncation: Callable[[], None] | None = None
        # Set by the owner: told (on the owner thread) the OSError a file
        # operation raised and what it was doing (``_io``). ``offline``:
        # such an error happened here or in the log's directory; final.
        self.on_io_error: Callable[[OSError, str], None] | None = None
        self.offline = False
        self._checkpoint_before_write = False
        self._unflushed_messages = 0
        self._first_unflushed_ms: int | None = None
        #: Called when the log comes to hold data its last flush did not
        #: cover (its owner's list of logs to look at for ``flush_due``).
        self.on_unflushed: Callable[[], None] | None = None
        self._dir_dirty = False
        # Counts truncations from the end; a flush ticket taken before one
        # must not advance the recovery point (see end_flush).
        self._truncations = 0
        self.closed = False
        #: Idempotent producers' sequences and epochs (storage.producer_state).
        self.producer_state = ProducerStateManager(directory)
        #: Aborted transactions, for read_committed fetches (storage.txn_index).
        self.aborted_txns = AbortedTxns(directory)
        self._unsynced_snapshots: list[str] = []
        # What tickets still out (begun, not ended) sync: the directory (how
        # many of them) and snapshot files; begin_flush hands them on too.
        self._dir_syncs_out = 0
        self._snapshots_out: list[str] = []
        # A new leader epoch's checkpoint is written by the next flush,
        # before the recovery point passes it (see LeaderEpochCache).
        epoch_cache.defer_writes()
        self._writing = False
        self._snapshot_due = False
        #: Changes whenever segments are removed or replaced (truncation,
        #: retention, a clean): a clean planned before does not swap in.
        self.layout_version = 0
        #: How far compaction got (storage.cleaner).
        self.cleaner_state = cleaner_state or CleanerState.load(directory)
        #: Whether batches may have gaps between them (``GAPS_MARKER``).
        self.gaps_possible = gaps_possible

    @property
    def config(self) -> LogConfig:
        return self._config

    @config.setter
    def config(self, config: LogConfig) -> None:
        """A topic's configs changed (``topics alter``): applies from now on."""
        self._config = config
        gaps_below = _gaps_below(config, self.gaps_possible)
        for segment in self._segments:
            segment.gaps_below = gaps_below

    def mark_gaps_possible(self) -> None:
        """Gaps between batches are about to reach the disk: record it
        durably first (``GAPS_MARKER``), so recovery never takes them for
        corruption."""
        if self.gaps_possible:
            return
        write_atomically(os.path.join(self.directory, GAPS_MARKER), b"")
        self.gaps_possible = True
        for segment in self._segments:
            segment.gaps_below = LONG_MAX

    # ------------------------------------------------------------------
    # Opening and recovery
    # ------------------------------------------------------------------
    @classmethod
    def open(cls, directory: str, config: LogConfig | None = None, *,
             recovery_point: int = 0, log_start_offset: int | None = None,
             clean_shutdown: bool = False,
             clock: Callable[[], int] = wall_clock_ms) -> "Log":
        """Open (or create) the log in ``directory``.

        After a clean shutdown every segment is trusted. Otherwise data from
        ``recovery_point`` on is re-validated batch by batch (CRC, header
        sanity, offset contiguity) and the log is truncated at the first bad
        byte; segments after a corrupt one are deleted. Recovery cost is
        bounded by the unflushed bytes, not the log size.
        """
        config = config or LogConfig()
        # A directory made here holds nothing: no listing, no leftovers to
        # clear, no checkpoint, index or snapshot to read (a broker given
        # thousands of new partitions makes each with a third of the system
        # calls).
        fresh = _make_directory(directory)
        names = set() if fresh else cls._remove_leftovers(directory, complete_swaps(directory))
        epoch_checkpoint = LeaderEpochCheckpoint(os.path.join(directory, EPOCH_CHECKPOINT_NAME))
        try:
            epoch_cache = LeaderEpochCache(epoch_checkpoint, fresh=fresh)
            rebuild_epochs = False
        except CheckpointFormatError as exc:
            log.warning("%s; rebuilding the leader-epoch cache from the log", exc)
            os.unlink(epoch_checkpoint.path)
            epoch_cache = LeaderEpochCache(epoch_checkpoint)
            rebuild_epochs = True
        bases = sorted(int(name[:-len(LOG_SUFFIX)]) for name in names
                       if name.endswith(LOG_SUFFIX) and name[:-len(LOG_SUFFIX)].isdigit())
        interval = config.index_interval_bytes
        cleaner_state = CleanerState(directory) if fresh else CleanerState.load(directory)
        gaps_possible = GAPS_MARKER in names
        gaps_below = _gaps_below(config, gaps_possible)
        segments: list[Segment] = []
        recovered_any = False
        for i, base in enumerate(bases):
            if segments and base != segments[-1].next_offset:
                cls._drop_segments(directory, bases[i:], interval,
                                   f"segment {base} does not start at the previous end "
                                   f"{segments[-1].next_offset}")
                break
            next_base = bases[i + 1] if i + 1 < len(bases) else None
            if clean_shutdown or (next_base is not None and next_base <= recovery_point):
                segments.append(Segment.open_clean(directory, base, interval,
                                                   gaps_below=gaps_below))
                continue
            recovered_any = True
            from_offset = max(base, recovery_point)
            segment, truncated = Segment.open_for_recovery(
                directory, base, interval, from_offset, epoch_cache.learn_from_recovery,
                gaps_below=gaps_below)
            segments.append(segment)
            if truncated and next_base is not None:
                cls._drop_segments(directory, bases[i + 1:], interval,
                                   f"corrupt data in segment {base}")
                break
        created = not segments
        if created:
            segments.append(Segment.create(directory, log_start_offset or 0, interval,
                                           gaps_below=gaps_below, fresh=fresh))
        if rebuild_epochs:
            for segment in segments:
                for _pos, header in segment.iter_batch_headers():
                    epoch_cache.learn_from_recovery(header)
        log_end_offset = segments[-1].next_offset
        start = segments[0].base_offset if log_start_offset is None else log_start_offset
        start = min(max(start, segments[0].base_offset), log_end_offset)
        # Clamp epochs to the log start first, then drop any at or past the
        # log end: an empty log keeps none, however it became empty.
        epoch_cache.truncate_from_start(start)
        epoch_cache.truncate_from_end(log_end_offset)
        trusted = log_end_offset if clean_shutdown else min(recovery_point, log_end_offset)
        instance = cls(directory, config, segments, epoch_cache, start, trusted, clock,
                       cleaner_state, gaps_possible)
        if log_start_offset is not None and log_start_offset > log_end_offset:
            # Recovery cut below the (durable) log start: everything left was
            # already deleted logically. Restart empty at the log start.
            log.warning("%s: recovered log ends at %d, below its start offset %d; "
                        "restarting it empty there", directory, log_end_offset,
                        log_start_offset)
            instance.truncate_fully_and_start_at(log_start_offset)
        if created:  # its files' names reach the disk with the first flush
            instance._dir_dirty = True
        instance.cleaner_state.truncated(instance.log_end_offset)
        instance.aborted_txns.load([] if fresh else instance._bases, instance.log_end_offset)
        if fresh:
            instance.producer_state.clear(instance.log_end_offset)
        else:
            instance._load_producer_state()
        instance.fresh = fresh
        if recovered_any:
            # What recovery validated may still be only in the page cache.
            instance.flush()
        return instance

    def _load_producer_state(self) -> None:
        """Producer state as of the log end: the newest intact snapshot at
        or below it, then the batch headers after it (records are never
        decoded). After a clean close the snapshot is at the log end and
        nothing is read."""
        state = self.producer_state
        end = self.log_end_offset
        state.delete_snapshots(above=end)
        for offset in reversed(snapshot_offsets(self.directory)):
            if state.load_snapshot(offset):
                break
        else:
            state.clear(self._segments[0].base_offset)
        self._replay_producer_state()

    def _replay_producer_state(self) -> None:
        """Apply the batch headers from the producer state's end offset to
        the log end."""
        state = self.producer_state
        start = max(state.end_offset, self._segments[0].base_offset)
        state.end_offset = start
        index = max(bisect.bisect_right(self._bases, start) - 1, 0)
        for segment in self._segments[index:]:
            if segment.next_offset <= start:
                continue
            found = segment.find_batch(start) if start > segment.base_offset else None
            position = found[0] if found is not None else 0
            for pos, header in segment.iter_batch_headers(position):
                if header.next_offset <= state.end_offset:
                    continue
                if header.is_control and header.producer_id >= 0:
                    self._apply_marker(header, segment.read_batch_at(pos, header),
                                       segment.base_offset)
                else:
                    state.apply(header)
        state.end_offset = self.log_end_offset

    def _apply_marker(self, header: fmt.BatchHeader, batch, segment_base: int) -> None:
        """A transaction marker is in the log: end the producer's
        transaction, and index it if it aborted."""
        control_type, coordinator_epoch = fmt.parse_control_batch(batch)
        aborted = self.producer_state.apply_marker(header, control_type, coordinator_epoch)
        if aborted is not None:
            self.aborted_txns.append(aborted, segment_base)

    @property
    def first_unstable_offset(self) -> int | None:
        """First offset of the oldest transaction still open here."""
        return self.producer_state.first_unstable_offset

    def collect_aborted(self, start_offset: int, upper_offset: int) -> list[AbortedTxn]:
        """Aborted transactions with records in ``[start_offset, upper_offset)``."""
        return self.aborted_txns.collect(start_offset, upper_offset)

    @staticmethod
    def _remove_leftovers(directory: str, names: list[str]) -> set[str]:
        """Delete files an interrupted operation left behind: temporary
        checkpoints, and index files whose log file is gone. ``names``: the
        directory's files; returns those that are left."""
        left = set(names)
        for name in names:
            stem, _, suffix = name.rpartition(".")
            if name.endswith(".tmp") or (
                    suffix in ("index", "timeindex", "txnindex")
                    and f"{stem}{LOG_SUFFIX}" not in left):
                os.unlink(os.path.join(directory, name))
                left.discard(name)
        return left

    @staticmethod
    def _drop_segments(directory: str, bases: list[int], interval: int, reason: str) -> None:
        for base in bases:
            log.warning("%s: deleting segment %d: %s", directory, base, reason)
            Segment(directory, base, interval).delete()

    # ------------------------------------------------------------------
    # Queries
    # ------------------------------------------------------------------
    @property
    def segments(self) -> list[Segment]:
        return list(self._segments)

    @property
    def active_segment(self) -> Segment:
        return self._segments[-1]

    @property
    def log_end_offset(self) -> int:
        return self._segments[-1].next_offset

    @property
    def size_bytes(self) -> int:
        return sum(s.size_bytes for s in self._segments)

    @property
    def latest_epoch(self) -> int:
        return self.epoch_cache.latest_epoch

    def end_offset_for_epoch(self, epoch: int) -> tuple[int, int]:
        """``(epoch, end_offset)`` a follower truncates to (KIP-101/279)."""
        return self.epoch_cache.end_offset_for(epoch, self.log_end_offset)

    # ------------------------------------------------------------------
    # Appending
    # ------------------------------------------------------------------
    @_io
    def append(self, records, leader_epoch: int, *, coordinator: bool = False) -> AppendInfo:
        """Append producer batches as the partition leader.

        ``records`` holds one or more whole batches. All are validated (header
        sanity, CRC, size limit; records are not decoded) before any byte is
        written, so a bad request never appends in part. Each batch is
        stamped with its base offset and ``leader_epoch``.

        ``coordinator``: a group coordinator's transactional offset commit,
        written with the producer's id and epoch but no sequence (Kafka's
        coordinator origin): only the epoch is checked.
        """
        view = memoryview(records)
        validated = fmt.validate_batches(view, self.config.max_message_bytes, strict=True)
        first = validated[0][1]
        if self.config.compact:
            self._check_keys(view, validated)
        if any(header.is_control for _pos, header in validated):
            raise InvalidRecordError(
                "control batches (transaction markers) are written by the transaction "
                "coordinator, not by producers")
        if first.producer_id >= 0 or len(validated) > 1 and any(
                header.producer_id >= 0 for _pos, header in validated):
            duplicate = self._check_producer(validated, coordinator)
            if duplicate is not None:
                # Answered as written: with flush.messages, on disk first
                # (the first attempt's fsync may have failed, or the
                # setting come since).
                self._flush_if_count_reached()
                return AppendInfo(duplicate.first_offset, duplicate.last_offset, self.clock(),
                                  0, 0, duplicate.timestamp, duplicate=True)
        offset = self.log_end_offset
        entries = []
        for pos, header in validated:
            prefix = fmt.stamped_prefix(header, offset, leader_epoch)
            body = view[pos + fmt.MAGIC_OFFSET:pos + header.size_bytes]
            last = offset + header.last_offset_delta
            entries.append(([prefix, body], BatchMeta(offset, last, header.max_timestamp,
                                                      header.size_bytes), header.record_count))
            offset = last + 1
        info = self._write(entries)
        if leader_epoch >= 0:  # only once the bytes are written
            self.epoch_cache.assign(leader_epoch, info.base_offset)
        if first.producer_id >= 0:
            self.producer_state.apply(first._replace(base_offset=info.base_offset))
        self._producer_state_caught_up()
        self._flush_if_count_reached()
        return info

    def _check_keys(self, view, validated: list[tuple[int, fmt.BatchHeader]]) -> None:
        """A compacted log keeps the latest record per key: every record
        needs one (Kafka refuses the batch with INVALID_RECORD). The only
        produce path that decodes records, and only for compacted logs."""
        for pos, header in validated:
            batch = view[pos:pos + header.size_bytes]
            for i, record in enumerate(fmt.iter_records(batch, verify_crc=False)):
                if record.key is None:
                    raise InvalidRecordError(
                        f"record {i} of a batch has no key, and {os.path.basename(self.directory)}"
                        " is a compacted topic (cleanup.policy=compact), which keeps the latest "
                        "record of each key: give every record a key")

    def _check_producer(self, validated: list[tuple[int, fmt.BatchHeader]],
                        coordinator: bool = False) -> Duplicate | None:
        """An idempotent producer's batch: one per request (as Kafka's
        produce v3+), with a sequence, judged by the producer state."""
        if len(validated) > 1:
            raise InvalidRecordError(
                "a batch with a producer id must travel alone: send one batch per partition "
                "per produce request when idempotence is on")
        header = validated[0][1]
        if coordinator and header.producer_epoch >= 0:
            self.producer_state.check_marker(header.producer_id, header.producer_epoch, None)
            return None
        if header.producer_epoch < 0 or header.base_sequence < 0:
            raise InvalidRecordError(
                f"a batch with producer id {header.producer_id} needs a producer epoch and a "
                f"base sequence >= 0, not {header.producer_epoch} and {header.base_sequence}")
        return self.producer_state.check(header)

    def _producer_state_caught_up(self) -> None:
        """Every batch up to the log end is applied: record that, and take
        the snapshot a roll during the write asked for."""
        self.producer_state.end_offset = self.log_end_offset
        if self._snapshot_due:
            self._snapshot_due = False
            self._take_snapshot()

    def _take_snapshot(self) -> None:
        self._unsynced_snapshots.append(self.producer_state.write_snapshot())
        self._dir_dirty = True

    @_io
    def append_as_follower(self, records) -> AppendInfo:
        """Append a leader's batches unchanged (offsets and epochs as stamped).

        The first batch must start at the log end offset and the batches must
        be contiguous; the epoch cache learns each batch's leader epoch.
        """
        view = memoryview(records)
        validated = fmt.validate_batches(view, fmt.MAX_BATCH_BYTES, strict=False)
        expected = self.log_end_offset
        entries = []
        gaps = False
        for pos, header in validated:
            # A compacted leader log has gaps: a batch may start past the end.
            if header.base_offset < expected:
                raise InvalidOffsetError(
                    f"follower batch starts at offset {header.base_offset}, below the log "
                    f"end {expected}")
            gaps = gaps or header.base_offset > expected
            entries.append(([view[pos:pos + header.size_bytes]],
                            BatchMeta(header.base_offset, header.last_offset,
                                      header.max_timestamp, header.size_bytes),
                            header.record_count))
            expected = header.next_offset
        if gaps:
            self.mark_gaps_possible()
        info = self._write(entries)
        state = self.producer_state
        for pos, header in validated:
            self.epoch_cache.assign(header.partition_leader_epoch, header.base_offset)
            if header.producer_id < 0:
                continue
            if header.is_control:
                self._apply_marker(header, view[pos:pos + header.size_bytes],
                                   self._segment_holding(header.base_offset))
            else:
                state.apply(header)
        self._producer_state_caught_up()
        self._flush_if_count_reached()
        return info

    def _segment_holding(self, offset: int) -> int:
        return self._bases[max(bisect.bisect_right(self._bases, offset) - 1, 0)]

    @_io
    def append_marker(self, control_type: fmt.ControlType, producer_id: int,
                      producer_epoch: int, coordinator_epoch: int, leader_epoch: int,
                      timestamp_ms: int | None = None) -> AppendInfo:
        """Append a transaction marker as the partition leader (the
        transaction coordinator's WriteTxnMarkers): ends the producer's
        transaction here; an ABORT is indexed for read_committed readers.
        A marker from an older producer epoch or coordinator is refused."""
        self.producer_state.check_marker(producer_id, producer_epoch, coordinator_epoch)
        batch = fmt.build_control_batch(control_type, producer_id, producer_epoch,
                                        coordinator_epoch,
                                        self.clock() if timestamp_ms is None else timestamp_ms)
        header = fmt.parse_header(batch)
        offset = self.log_end_offset
        view = memoryview(batch)
        prefix = fmt.stamped_prefix(header, offset, leader_epoch)
        info = self._write([([prefix, view[fmt.MAGIC_OFFSET:]],
                             BatchMeta(offset, offset, header.max_timestamp, header.size_bytes),
                             1)])
        if leader_epoch >= 0:
            self.epoch_cache.assign(leader_epoch, offset)
        self._apply_marker(header._replace(base_offset=offset), batch,
                           self._segment_holding(offset))
        self._producer_state_caught_up()
        self._flush_if_count_reached()
        return info

    def _flush_if_count_reached(self) -> None:
        """``flush.messages`` as Kafka applies it: once that many records are
        unflushed, the append itself fsyncs them (and the epoch checkpoint)
        before it returns, so a leader acknowledges and a follower fetches
        on only what is on its disk. With ``flush.messages=1`` an
        acknowledged ``acks=all`` write is on the disk of every in-sync
        replica: every replica losing power at once loses none of it."""
        if (self.config.flush_messages != NO_LIMIT
                and self._unflushed_messages >= self.config.flush_messages):
            self.flush()

    def _recovery_point_lowered(self) -> None:
        self._checkpoint_before_write = True
        if self.on_recovery_point_lowered is not None:
            self.on_recovery_point_lowered()

    def _write(self, entries: list[tuple[list, BatchMeta, int]]) -> AppendInfo:
        """Write validated batches, rolling segments where a batch does not fit."""
        if self._checkpoint_before_write:
            if self.before_write_after_truncation is not None:
                self.before_write_after_truncation()  # raises if it cannot: nothing written
            self._checkpoint_before_write = False
        now_ms = self.clock()
        pieces: list = []
        metas: list[BatchMeta] = []
        run_bytes = 0
        messages = 0
        for i, (batch_pieces, meta, count) in enumerate(entries):
            if self._should_roll(run_bytes, meta):
                if metas:
                    self.active_segment.append(pieces, metas)
                    pieces, metas, run_bytes = [], [], 0
                # The producer state catches up after the write: once this
                # write has put a batch in, the roll's snapshot waits for it.
                self._snapshot_due = self._writing = i > 0
                try:
                    self.roll()
                finally:
                    self._writing = False
            pieces.extend(batch_pieces)
            metas.append(meta)
            run_bytes += meta.size_bytes
            messages += count
        self.active_segment.append(pieces, metas)
        if self._first_unflushed_ms is None:
            self._first_unflushed_ms = now_ms
            if self.on_unflushed is not None:
                self.on_unflushed()
        self._unflushed_messages += messages
        first, last = entries[0][1], entries[-1][1]
        return AppendInfo(first.base_offset, last.last_offset, now_ms, messages,
                          sum(m.size_bytes for _, m, _ in entries),
                          max(m.max_timestamp for _, m, _ in entries))

    def _should_roll(self, pending_bytes: int, meta: BatchMeta) -> bool:
        """Kafka's roll rules: size, age (by record timestamps, as Kafka
        measures segment.ms), and the int32 range of relative offsets."""
        segment = self.active_segment
        if segment.is_empty and pending_bytes == 0:
            return False
        if segment.size_bytes + pending_bytes + meta.size_bytes > self.config.segment_bytes:
            return True
        first_ts = segment.first_batch_timestamp
        if first_ts != fmt.NO_TIMESTAMP and meta.max_timestamp - first_ts > self.config.segment_ms:
            return True
        if (self.config.compact and first_ts != fmt.NO_TIMESTAMP
                and meta.max_timestamp - first_ts > self.config.max_compaction_lag_ms):
            return True  # the active segment is never cleaned (KIP-354)
        return meta.last_offset - segment.base_offset > MAX_RELATIVE_OFFSET

    @_io
    def roll(self) -> Segment:
        """Start a new active segment at the log end offset (no-op when the
        active segment is empty). The old segment's index entries are
        written now; its fsync happens with the next flush."""
        active = self.active_segment
        if active.is_empty:
            return active
        active.write_index_entries()
        active.forget_recent_batches()
        segment = Segment.create(self.directory, self.log_end_offset,
                                 self.config.index_interval_bytes,
                                 gaps_below=_gaps_below(self.config, self.gaps_possible))
        self._segments = self._segments + [segment]
        self._bases = self._bases + [segment.base_offset]
        self._dir_dirty = True
        if not self._writing:
            self._take_snapshot()  # recovery replays from here, not the log start
        return segment

    # ------------------------------------------------------------------
    # Reading
    # ------------------------------------------------------------------
    @_io
    def read(self, offset: int, max_bytes: int, upper_bound_offset: int | None = None,
             min_one_batch: bool = True) -> bytes:
        """Whole batches from the one holding ``offset``, about ``max_bytes``
        in all, none reaching ``upper_bound_offset`` (the high watermark, for
        consumers). The first batch may hold offsets below ``offset``; the
        reader skips them. With ``min_one_batch`` a first batch larger than
        ``max_bytes`` is returned whole so a consumer always progresses."""
        end = self.log_end_offset
        if offset < self.log_start_offset or offset > end:
            raise OffsetOutOfRangeError(offset, self.log_start_offset, end)
        upper = end if upper_bound_offset is None else min(upper_bound_offset, end)
        chunks: list[bytes] = []
        remaining = max_bytes
        segments = self._segments
        index = max(bisect.bisect_right(self._bases, offset) - 1, 0)
        for segment in segments[index:]:
            if offset >= upper or remaining <= 0:
                break
            if offset < segment.next_offset:
                data, next_offset = segment.read(offset, remaining, upper,
                                                 min_one_batch and not chunks)
                if data:
                    chunks.append(data)
                    remaining -= len(data)
                if next_offset < segment.next_offset:
                    break  # stopped inside this segment by a limit
            offset = segment.next_offset
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)

    @_io
    def bytes_between(self, offset: int, upper_bound_offset: int) -> int:
        """The bytes ``read(offset, ..., upper_bound_offset)`` would return
        with no byte limit, from the batches' positions instead of their
        bytes: what a waiting fetch asks at each append (Kafka's
        ``DelayedFetch`` compares positions the same way). Near the log end
        this reads nothing from disk."""
        end = self.log_end_offset
        if offset < self.log_start_offset or offset > end:
            raise OffsetOutOfRangeError(offset, self.log_start_offset, end)
        upper = min(upper_bound_offset, end)
        total = 0
        segments = self._segments
        index = max(bisect.bisect_right(self._bases, offset) - 1, 0)
        for segment in segments[index:]:
            if offset >= upper:
                break
            if offset < segment.next_offset:
                start = segment.position_of(offset) if offset > segment.base_offset else 0
                stop = (segment.position_of(upper) if upper < segment.next_offset
                        else segment.size_bytes)
                total += max(0, stop - start)
            offset = segment.next_offset
        return total

    @_io
    def offset_for_timestamp(self, timestamp_ms: int) -> int | None:
        """Offset of the first record whose timestamp is >= ``timestamp_ms``
        (at or after the log start), or None if there is none."""
        for segment in self._segments:
            if segment.next_offset <= self.log_start_offset:
                continue
            found = segment.find_offset_by_timestamp(timestamp_ms, self.log_start_offset)
            if found is not None:
                return found
        return None

    # ------------------------------------------------------------------
    # Truncation and deletion
    # ------------------------------------------------------------------
    @_io
    def truncate_to(self, offset: int) -> None:
        """Remove every record at or above ``offset`` (a follower dropping a
        divergent suffix). A batch holding ``offset`` goes whole, so the log
        end may land below it. Below the log start: truncate fully."""
        if offset >= self.log_end_offset:
            return
        if offset < self.log_start_offset:
            self.truncate_fully_and_start_at(offset)
            return
        log.info("%s: truncating to offset %d (log end was %d)", self.directory, offset,
                 self.log_end_offset)
        # Segments starting below offset stay (the last of them is cut);
        # the first segment always stays, emptied if need be.
        keep = max(bisect.bisect_left(self._bases, offset), 1)
        for segment in self._segments[keep:]:
            segment.delete()
        self._segments = self._segments[:keep]
        self._bases = self._bases[:keep]
        self._truncations += 1
        self.layout_version += 1
        self.active_segment.truncate_to(offset)
        end = self.log_end_offset
        if end < self.log_start_offset:
            # The cut batch began below the log start: nothing visible is
            # left, and a log never ends below its start.
            self.truncate_fully_and_start_at(self.log_start_offset)
            return
        self.epoch_cache.truncate_from_end(end)
        lowered = end < self.recovery_point
        self.recovery_point = min(self.recovery_point, end)
        self._dir_dirty = True
        self.aborted_txns.truncate_to(end)
        self._cleaner_state_truncated(end)
        self._load_producer_state()
        if lowered:
            self._recovery_point_lowered()

    @_io
    def truncate_fully_and_start_at(self, offset: int) -> None:
        """Delete everything and restart the log empty at ``offset`` (a
        follower whose data is all below the leader's log start, or all
        divergent)."""
        if offset < 0:
            raise InvalidOffsetError(f"cannot start a log at negative offset {offset}")
        log.info("%s: truncating fully and starting at offset %d", self.directory, offset)
        for segment in self._segments:
            segment.delete()
        self._truncations += 1
        self.layout_version += 1
        segment = Segment.create(self.directory, offset, self.config.index_interval_bytes,
                                 gaps_below=_gaps_below(self.config, self.gaps_possible))
        self._segments = [segment]
        self._bases = [offset]
        self.epoch_cache.clear()
        self.log_start_offset = offset
        lowered = offset < self.recovery_point
        self.recovery_point = offset
        self._dir_dirty = True
        self.producer_state.delete_snapshots()
        self.producer_state.clear(offset)
        self.aborted_txns.clear()
        self.cleaner_state.reset(offset)
        self.cleaner_state.save()
        if lowered:
            self._recovery_point_lowered()

    def _cleaner_state_truncated(self, end: int) -> None:
        state = self.cleaner_state
        before = (state.first_dirty, [list(p) for p in state.cleaned_at])
        state.truncated(end)
        if (state.first_dirty, state.cleaned_at) != before:
            # Offsets past the end will be new records: never "cleaned".
            state.save()

    @_io
    def delete_records_before(self, offset: int) -> int:
        """Move the log start offset up to ``offset`` (Kafka's DeleteRecords)
        and delete segments wholly below it. Returns the new log start."""
        if offset > self.log_end_offset:
            raise OffsetOutOfRangeError(offset, self.log_start_offset, self.log_end_offset)
        if offset <= self.log_start_offset:
            return self.log_start_offset
        self.log_start_offset = offset
        count = 0
        while count < len(self._segments) and self._segments[count].next_offset <= offset:
            count += 1
        self._delete_oldest(count, "below the log start offset")
        self._truncate_epochs_from_start()
        return offset

    @_io
    def delete_retained_segments(self, now_ms: int | None = None,
                                 upper_bound_offset: int | None = None) -> int:
        """Apply retention: delete the oldest segments whose newest record is
        older than ``retention.ms``, or while the log exceeds
        ``retention.bytes``. Whole segments only, oldest first, never one
        reaching past ``upper_bound_offset`` (the high watermark). Returns
        how many were deleted."""
        if not self.config.delete:
            return 0  # cleanup.policy=compact: only the cleaner removes records
        now_ms = self.clock() if now_ms is None else now_ms
        upper = self.log_end_offset if upper_bound_offset is None else upper_bound_offset
        retention_ms = self.config.retention_ms
        retention_bytes = self.config.retention_bytes
        excess_bytes = self.size_bytes - retention_bytes
        count = 0
        for segment in self._segments:
            if segment.is_empty or segment.next_offset > upper:
                break
            by_time = retention_ms != NO_LIMIT and segment.max_timestamp < now_ms - retention_ms
            by_size = retention_bytes != NO_LIMIT and excess_bytes >= segment.size_bytes
            if not (by_time or by_size):
                break
            excess_bytes -= segment.size_bytes
            count += 1
        deleted = self._delete_oldest(count, "retention")
        if deleted:
            self.log_start_offset = max(self.log_start_offset, self._segments[0].base_offset)
            self._truncate_epochs_from_start()
        return deleted

    def _truncate_epochs_from_start(self) -> None:
        """The log start moved: forget epochs wholly below it. The latest
        epoch stays (clamped to the new log start) even when retention
        emptied the log, as Kafka keeps it: a leader must still vouch for
        its own epoch to a follower that fetches at its log end."""
        self.epoch_cache.truncate_from_start(self.log_start_offset)

    def _delete_oldest(self, count: int, reason: str) -> int:
        """Delete the ``count`` oldest segments. If that includes the active
        one, roll first so the log keeps an (empty) active segment."""
        if count >= len(self._segments):
            self.roll()
        count = min(count, len(self._segments) - 1)
        for segment in self._segments[:count]:
            log.info("%s: deleting segment %d..%d (%d bytes): %s", self.directory,
                     segment.base_offset, segment.next_offset - 1, segment.size_bytes, reason)
            segment.delete()
        if count:
            self.layout_version += 1
            self._segments = self._segments[count:]
            self._bases = self._bases[count:]
            self.recovery_point = max(self.recovery_point, self._segments[0].base_offset)
            self._dir_dirty = True
            # Producers stay (KIP-360: until producer.id.expiration.ms); the
            # snapshots of deleted segments go.
            self.producer_state.delete_snapshots(below=self._segments[0].base_offset)
            self.aborted_txns.drop_segments_below(self._segments[0].base_offset)
        return count

    @_io
    def replace_segments(self, replacements: list[tuple[list[Segment], Segment]]) -> None:
        """The cleaner swapped each run of old segments for one cleaned
        segment covering the same offsets (storage.cleaner.swap)."""
        segments = list(self._segments)
        for old, new in replacements:
            at = segments.index(old[0])
            assert segments[at:at + len(old)] == old, (old, segments)
            assert new.base_offset == old[0].base_offset and new.next_offset == \
                old[-1].next_offset, (old, new)
            segments[at:at + len(old)] = [new]
            merged = [s.base_offset for s in old[1:]]
            if merged:
                self.aborted_txns.merge_segments(merged, new.base_offset)
        self._segments = segments
        self._bases = [s.base_offset for s in segments]
        self.layout_version += 1

    # ------------------------------------------------------------------
    # Flushing
    # ------------------------------------------------------------------
    @property
    def unflushed(self) -> bool:
        """Whether it holds data no flush has covered yet (taken by a flush
        in progress counts as covered)."""
        return self._first_unflushed_ms is not None

    def flush_due(self, now_ms: int | None = None) -> bool:
        """Whether ``flush.messages`` or ``flush.ms`` asks for an fsync now."""
        if self._first_unflushed_ms is None:
            return False
        if (self.config.flush_messages != NO_LIMIT
                and self._unflushed_messages >= self.config.flush_messages):
            return True
        if self.config.flush_ms == NO_LIMIT:
            return False
        now_ms = self.clock() if now_ms is None else now_ms
        return now_ms - self._first_unflushed_ms >= self.config.flush_ms

    def sync_later(self, path: str) -> None:
        """A file just written in this log's directory (without an fsync):
        it and its name become durable with the next flush."""
        self._unsynced_snapshots.append(path)
        self._dir_dirty = True

    @_io
    def begin_flush(self) -> FlushTicket:
        """Owner thread: write pending index entries and name what to fsync."""
        target = self.log_end_offset
        todo = [s for s in self._segments if s.next_offset > self.recovery_point or
                s is self.active_segment]
        for segment in todo:
            if segment.write_index_entries():
                self._dir_dirty = True  # a new index file's name
        # Names and snapshots a ticket still out (on the flush thread) took
        # are synced again by this one: a flush() on this thread (one
        # flush.messages asks for) must not acknowledge before they are.
        directory = self.directory if (self._dir_dirty or self._dir_syncs_out) else None
        self._dir_dirty = False
        self._unflushed_messages = 0
        self._first_unflushed_ms = None
        taken, self._unsynced_snapshots = self._unsynced_snapshots, []
        files = [*self._snapshots_out, *taken]
        self._snapshots_out.extend(taken)
        if directory is not None:
            self._dir_syncs_out += 1
        # The epoch checkpoint's new name is made durable by the directory's
        # fsync when the ticket does one (a new log's first flush): one, not two.
        return FlushTicket(todo, target, directory, self._truncations, files,
                           self.epoch_cache.take_pending_write(directory is not None), taken)

    def end_flush(self, ticket: FlushTicket) -> None:
        """Owner thread: the ticket's data is durable; advance the recovery
        point to it. If the log was truncated meanwhile, the offsets the
        ticket covered may since hold new, unsynced bytes: leave the
        recovery point where the truncation put it; the next flush advances
        it. (A ticket whose sync failed on the disk is never ended: its log
        is offline. Any other ticket not synced is ``abort_flush``'s.)"""
        self._let_go(ticket)
        if ticket.truncations == self._truncations:
            self.recovery_point = max(self.recovery_point, ticket.offset)

    def abort_flush(self, ticket: FlushTicket) -> None:
        """Owner thread: the ticket's sync failed (not the disk: a bug) or
        was given up on (the flush cancelled): what it took is the next
        ticket's to sync, the recovery point stays, and the log is due for a
        flush again."""
        self._let_go(ticket)
        if ticket.directory is not None:
            self._dir_dirty = True
        self._unsynced_snapshots.extend(ticket.taken_files)
        if self._first_unflushed_ms is None:
            self._first_unflushed_ms = self.clock()
            if self.on_unflushed is not None:
                self.on_unflushed()

    def _let_go(self, ticket: FlushTicket) -> None:
        for path in ticket.taken_files:
            self._snapshots_out.remove(path)
        if ticket.directory is not None:
            self._dir_syncs_out = max(0, self._dir_syncs_out - 1)

    @_io
    def flush(self) -> None:
        """fsync everything appended so far, on the calling thread."""
        ticket = self.begin_flush()
        ticket.sync()
        self.end_flush(ticket)

    def io_failed(self, exc: OSError, what: str) -> None:
        """A file operation of this log failed (on any path: ``_io``, a
        flush ticket synced elsewhere): the log is offline from now on, and
        the owner is told."""
        self.offline = True
        log.error("%s: %s failed: %s", self.directory, what, exc)
        if self.on_io_error is not None:
            self.on_io_error(exc, what)

    # ------------------------------------------------------------------
    # Lifecycle
    # ------------------------------------------------------------------
    def close(self) -> None:
        """Flush and close every file (a clean shutdown); an offline log's
        files are only closed (nothing of it can be trusted to the disk).
        A disk error while flushing takes the log offline and raises
        ``LogDirectoryError`` once its files are closed."""
        if self.closed:
            return
        if not self.offline:
            try:
                # A snapshot at the log end: the next open reads no batch header.
                self._take_snapshot()
                self.flush()
            except (OSError, LogDirectoryError) as exc:
                if isinstance(exc, OSError):
                    self.io_failed(exc, "close")
                self.abandon()
                raise LogDirectoryError(f"closing {self.directory} failed: {exc}") from exc
        self.abandon()

    def abandon(self) -> None:
        """Close file handles without flushing anything: what a crash leaves.
        For tests and the chaos harness's in-process simulations."""
        for segment in self._segments:
            segment.close()
        self.epoch_cache.close()
        self.closed = True

    def delete(self) -> None:
        """Remove the whole partition directory."""
        self.abandon()
        shutil.rmtree(self.directory, ignore_errors=True)

    def check_invariants(self) -> None:
        segments = self._segments
        assert segments, "a log always has an active segment"
        assert self._bases == [s.base_offset for s in segments]
        for previous, segment in zip(segments, segments[1:]):
            assert segment.base_offset == previous.next_offset, (previous, segment)
        assert segments[0].base_offset <= self.log_start_offset <= self.log_end_offset, (
            segments[0].base_offset, self.log_start_offset, self.log_end_offset)
        assert self.recovery_point <= self.log_end_offset, (self.recovery_point,
                                                            self.log_end_offset)
        for segment in segments:
            segment.check_invariants()
        self.epoch_cache.check_invariants()
        for _epoch, start in self.epoch_cache.entries:
            assert start <= self.log_end_offset, (start, self.log_end_offset)
        assert self.cleaner_state.first_dirty <= self.log_end_offset, (
            self.cleaner_state.first_dirty, self.log_end_offset)
        assert self.producer_state.end_offset == self.log_end_offset, (
            self.producer_state.end_offset, self.log_end_offset)
        aborted = self.aborted_txns.entries
        assert all(e.first_offset <= e.last_offset < self.log_end_offset for e in aborted), (
            aborted, self.log_end_offset)
        assert [e.last_offset for e in aborted] == sorted({e.last_offset for e in aborted})
        self.producer_state.check_invariants()

    def __repr__(self) -> str:
        return (f"Log({self.directory!r}, start={self.log_start_offset}, "
                f"end={self.log_end_offset}, segments={len(self._segments)})")
