"""Leader-epoch cache: which leader epoch started at which offset.

Kept on every replica of a partition and persisted beside its log (Kafka's
``leader-epoch-checkpoint``). A follower that was behind asks the leader for
the end offset of its latest epoch and truncates any suffix past it (KIP-101),
instead of trusting its own high watermark, which can lose committed data
across back-to-back leader changes.

Invariants (checked by ``check_invariants``):
  - entries are sorted with strictly increasing epochs;
  - start offsets are non-decreasing.
"""

from __future__ import annotations

import bisect
import logging
import threading

from collections.abc import Callable

from storage.checkpoint import CheckpointFormatError, LeaderEpochCheckpoint

log = logging.getLogger(__name__)

UNDEFINED_EPOCH = -1
UNDEFINED_OFFSET = -1


class LeaderEpochCache:
    """In-memory list of ``(epoch, start_offset)``, written through to a
    checkpoint file on every change.

    A new epoch (``assign``) is not written at once once the owning log
    calls ``defer_writes``: the log's next flush takes the entries
    (``take_pending_write``, on the owner thread) and writes and fsyncs the
    file (on its flush thread), before its recovery point moves past the
    epoch's start. That is enough, because an epoch whose entry a crash
    loses starts at or above the recovery point, where recovery re-reads
    every batch and learns the epochs from their headers
    (``learn_from_recovery``); a corrupt file is rebuilt from the log. So
    becoming leader or follower of a partition creates no file and fsyncs
    nothing on the broker's event loop: a broker taking over 3,000
    leaderships at once wrote 3,000 files there (Kafka stopped fsyncing
    this file on the append path in KAFKA-15046). Truncations are written
    durably at once; a write taken before one and done after it is
    skipped (each change has a version, and an older one never overwrites
    a newer)."""

    def __init__(self, checkpoint: LeaderEpochCheckpoint | None, *,
                 fresh: bool = False) -> None:
        self._checkpoint = checkpoint
        # Whether assign leaves the write to the log's flush (defer_writes).
        self._deferred = False
        # Changes made (_version) and the newest written durably, under
        # _write_lock (a flush thread and the owner thread both write).
        self._version = 0
        self._written_version = 0
        self._write_lock = threading.Lock()
        self._closed = False  # (under _write_lock) its log let go of its files
        # ``fresh``: its log's directory was made a moment ago, so it holds
        # no checkpoint to read (a broker given thousands of new partitions).
        self._entries: list[tuple[int, int]] = (
            checkpoint.read() if checkpoint and not fresh else [])
        self._epochs = [epoch for epoch, _ in self._entries]
        for (e1, s1), (e2, s2) in zip(self._entries, self._entries[1:]):
            if e1 >= e2 or s1 > s2:
                raise CheckpointFormatError(
                    f"{checkpoint.path}: entries out of order: epoch {e1} at {s1}, "
                    f"then epoch {e2} at {s2}")

    # -- queries ---------------------------------------------------------
    @property
    def entries(self) -> list[tuple[int, int]]:
        return list(self._entries)

    @property
    def latest_epoch(self) -> int:
        return self._entries[-1][0] if self._entries else UNDEFINED_EPOCH

    @property
    def earliest_entry(self) -> tuple[int, int] | None:
        return self._entries[0] if self._entries else None

    def end_offset_for(self, requested_epoch: int, log_end_offset: int) -> tuple[int, int]:
        """``(epoch, end_offset)`` for ``requested_epoch`` (KIP-279).

        ``epoch`` is the largest known epoch <= the request and ``end_offset``
        the start offset of the first epoch after it, or the log end offset if
        it is the latest. Unknown (older than every entry): both undefined.
        """
        if requested_epoch == UNDEFINED_EPOCH or not self._entries:
            return UNDEFINED_EPOCH, UNDEFINED_OFFSET
        if requested_epoch == self._epochs[-1]:
            return self._epochs[-1], log_end_offset
        if requested_epoch > self._epochs[-1]:
            # An epoch from the future: this replica cannot vouch for it.
            return UNDEFINED_EPOCH, UNDEFINED_OFFSET
        index = bisect.bisect_right(self._epochs, requested_epoch)
        if index == 0:
            return UNDEFINED_EPOCH, UNDEFINED_OFFSET
        return self._epochs[index - 1], self._entries[index][1]

    def epoch_for_offset(self, offset: int) -> int:
        """The epoch whose range holds ``offset`` (UNDEFINED before the first)."""
        starts = [start for _, start in self._entries]
        index = bisect.bisect_right(starts, offset)
        return self._entries[index - 1][0] if index else UNDEFINED_EPOCH

    # -- changes ---------------------------------------------------------
    def assign(self, epoch: int, start_offset: int) -> bool:
        """Record that ``epoch`` starts at ``start_offset``. Returns whether the
        cache changed. An epoch older than the latest, or a start offset below
        the latest's, is a stale leader's batch: ignored with a warning, as
        Kafka does, because the log itself stays correct."""
        if epoch < 0:
            return False
        if self._entries:
            latest_epoch, latest_start = self._entries[-1]
            if epoch == latest_epoch:
                return False
            if epoch < latest_epoch or start_offset < latest_start:
                log.warning("ignoring leader epoch %d at offset %d: latest is epoch %d at %d",
                            epoch, start_offset, latest_epoch, latest_start)
                return False
        # A newer epoch starting where the latest one did means the latest
        # never held a record: it is replaced, as Kafka does.
        while self._entries and self._entries[-1][1] >= start_offset:
            self._entries.pop()
            self._epochs.pop()
        self._entries.append((epoch, start_offset))
        self._epochs.append(epoch)
        if self._deferred:
            self._version += 1
        else:
            self._persist()
        return True

    def defer_writes(self) -> None:
        """From now on ``assign`` leaves the checkpoint to the owner's
        flush: ``take_pending_write`` before its recovery point may pass the
        new epoch's start."""
        self._deferred = True

    def take_pending_write(self, directory_synced_after: bool = False
                           ) -> Callable[..., None] | None:
        """Owner thread: None if the file holds every change; else a call
        (for any thread) that writes the entries as they are now, durably,
        unless a newer change was written first. A partition directory
        gone meanwhile (deleted) is no error: there is nothing to keep.
        ``directory_synced_after``: the caller fsyncs the partition's
        directory right after the call (a flush of new segment files), so
        the new name is made durable by that, not by a fsync of its own.
        Called with ``durable=False`` it writes and renames without an
        fsync: the caller syncs the whole filesystem after (a group flush);
        a crash before that leaves the old file or the new one, maybe
        empty, which the log rebuilds from its batches when it opens."""
        if self._checkpoint is None or self._written_version == self._version:
            return None
        version, entries = self._version, list(self._entries)

        def write(durable: bool = True) -> None:
            try:
                self._write_version(version, entries, durable,
                                    durable and not directory_synced_after)
            except FileNotFoundError:
                pass
        return write

    def close(self) -> None:
        """Its log let go of its files (closed, deleted, abandoned): a write
        taken before and run after, on the flush thread, does nothing. Its
        path may name another log's file by then (the topic recreated)."""
        with self._write_lock:
            self._closed = True

    def _write_version(self, version: int, entries: list[tuple[int, int]],
                       sync: bool = True, sync_directory: bool = True) -> None:
        with self._write_lock:
            if self._closed or version <= self._written_version:
                return
            self._checkpoint.write(entries, sync=sync, sync_directory=sync_directory)
            self._written_version = version

    def learn_from_recovery(self, header) -> None:
        """Recovery re-reads unflushed batches whose epochs the checkpoint
        may not have caught: assign those newer than the latest known."""
        if header.partition_leader_epoch > self.latest_epoch:
            self.assign(header.partition_leader_epoch, header.base_offset)

    def truncate_from_end(self, end_offset: int) -> None:
        """Forget epochs that start at or after ``end_offset`` (log truncated to it)."""
        keep = len(self._entries)
        while keep and self._entries[keep - 1][1] >= end_offset:
            keep -= 1
        if keep != len(self._entries):
            del self._entries[keep:]
            del self._epochs[keep:]
            self._persist()

    def truncate_from_start(self, start_offset: int) -> None:
        """Drop epochs wholly below ``start_offset`` (log start moved up) and
        clamp the first remaining one to start there."""
        if not self._entries:
            return
        starts = [start for _, start in self._entries]
        index = bisect.bisect_right(starts, start_offset) - 1
        if index < 0:
            return
        epoch, start = self._entries[index]
        new_entries = [(epoch, max(start, start_offset))] + self._entries[index + 1:]
        if new_entries != self._entries:
            self._entries = new_entries
            self._epochs = [e for e, _ in new_entries]
            self._persist()

    def clear(self) -> None:
        if self._entries:
            self._entries = []
            self._epochs = []
            self._persist()

    def check_invariants(self) -> None:
        for (e1, s1), (e2, s2) in zip(self._entries, self._entries[1:]):
            assert e1 < e2, f"epochs not increasing: {e1} then {e2}"
            assert s1 <= s2, f"start offsets decreasing: {s1} then {s2}"
        assert self._epochs == [e for e, _ in self._entries]

    def _persist(self) -> None:
        self._version += 1
        if self._checkpoint is not None:
            self._write_version(self._version, list(self._entries))
