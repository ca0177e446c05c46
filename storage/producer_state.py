"""Producer state of one partition: what makes an idempotent produce
exactly-once.

An idempotent producer stamps each batch with its producer id, its epoch
and the sequence number of the batch's first record (``storage.batch``
header fields). For every producer id this module remembers the epoch and
the last ``BATCHES_KEPT`` batches appended (first and last sequence, first
and last offset), from which the leader decides, before writing a byte:

- a batch equal to one of those (same epoch, same sequences) is a
  *duplicate*, a retry of something already written: it is not written
  again and its producer is told the original offsets;
- a batch from an older epoch is refused (``INVALID_PRODUCER_EPOCH``): a
  newer incarnation of the producer exists;
- in the current epoch a batch must continue the sequence exactly (last
  sequence + 1, wrapping at 2**31 - 1); anything else is a gap or a reorder
  and is refused (``OUT_OF_ORDER_SEQUENCE_NUMBER``); a new epoch starts at
  sequence 0;
- a producer this partition does not know is accepted at any sequence:
  its state may have gone with retention or expiry (KIP-360), so the
  broker never answers ``UNKNOWN_PRODUCER_ID``.

The rules are Kafka's (``ProducerStateManager``). Followers and recovery
apply batches without the checks: the leader already made them, and a
replica's state is a function of its log alone, so every replica that holds
the same log holds the same state.

``ProducerStateManager`` is pure: it reads no clock and does no I/O except
in ``write_snapshot``/``load_snapshot``/``delete_snapshots``, which the
``Log`` calls. Snapshots (``<20-digit offset>.snapshot``, Kafka's name) hold
the state as of an offset, so recovery replays only the batch headers after
the newest snapshot instead of the whole log; the log takes one at every
segment roll and at a clean close.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import struct
import zlib
from collections import deque
from typing import NamedTuple

import msgpack

from storage.batch import (NO_PRODUCER_EPOCH, NO_SEQUENCE,  # noqa: F401  (re-exported)
                           SEQUENCE_MAX, BatchHeader, ControlType, next_sequence)
from storage.errors import (InvalidProducerEpochError, InvalidTxnStateError,
                            OutOfOrderSequenceError, TransactionCoordinatorFencedError)
from storage.txn_index import AbortedTxn

log = logging.getLogger(__name__)

#: Batches remembered per producer for duplicate detection: a producer may
#: have this many requests in flight per partition (Kafka's limit, 5).
BATCHES_KEPT = 5
SNAPSHOT_SUFFIX = ".snapshot"
SNAPSHOT_VERSION = 2
#: Snapshot file: a CRC-32 of the body, then the msgpack body.
_SNAPSHOT_HEADER = struct.Struct(">I")


def snapshot_path(directory: str, offset: int) -> str:
    return os.path.join(directory, f"{offset:020d}{SNAPSHOT_SUFFIX}")


def snapshot_offsets(directory: str) -> list[int]:
    """Offsets of the snapshot files in ``directory``, ascending."""
    return sorted(int(name[:-len(SNAPSHOT_SUFFIX)]) for name in os.listdir(directory)
                  if name.endswith(SNAPSHOT_SUFFIX) and name[:-len(SNAPSHOT_SUFFIX)].isdigit())


class BatchMetadata(NamedTuple):
    """One appended batch of a producer, as duplicate detection needs it."""

    first_seq: int
    last_seq: int
    first_offset: int
    last_offset: int
    timestamp: int


class Duplicate(NamedTuple):
    """A batch already in the log: where it went."""

    first_offset: int
    last_offset: int
    timestamp: int


@dataclasses.dataclass
class ProducerEntry:
    """What a partition knows of one producer id."""

    producer_id: int
    epoch: int = NO_PRODUCER_EPOCH
    batches: deque = dataclasses.field(default_factory=lambda: deque(maxlen=BATCHES_KEPT))
    #: Max timestamp of its last batch (ms): what expiry measures.
    last_timestamp: int = -1
    #: Offset of its open transaction's first batch here, -1 if none.
    txn_first_offset: int = -1
    #: Epoch of the transaction coordinator that wrote its last marker.
    coordinator_epoch: int = -1

    @property
    def last_seq(self) -> int:
        return self.batches[-1].last_seq if self.batches else NO_SEQUENCE

    @property
    def last_offset(self) -> int:
        return self.batches[-1].last_offset if self.batches else -1

    def find_duplicate(self, epoch: int, first_seq: int, last_seq: int) -> Duplicate | None:
        if epoch != self.epoch:
            return None
        for batch in self.batches:
            if batch.first_seq == first_seq and batch.last_seq == last_seq:
                return Duplicate(batch.first_offset, batch.last_offset, batch.timestamp)
        return None

    def to_wire(self) -> list:
        return [self.producer_id, self.epoch, self.last_timestamp,
                [list(b) for b in self.batches], self.txn_first_offset, self.coordinator_epoch]

    @classmethod
    def from_wire(cls, raw: list) -> "ProducerEntry":
        producer_id, epoch, last_timestamp, batches, txn_first, coordinator_epoch = raw
        return cls(producer_id, epoch,
                   deque((BatchMetadata(*b) for b in batches), maxlen=BATCHES_KEPT),
                   last_timestamp, txn_first, coordinator_epoch)


def _last_seq(header: BatchHeader) -> int:
    return next_sequence(header.base_sequence, header.last_offset_delta)


class ProducerStateManager:
    """Every producer's state in one partition, as of ``end_offset``: the
    log offset up to which batches have been applied."""

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self.producers: dict[int, ProducerEntry] = {}
        self.end_offset = 0
        #: Producers with a transaction open here -> its first offset.
        self.ongoing: dict[int, int] = {}

    @property
    def first_unstable_offset(self) -> int | None:
        """The first offset of the oldest open transaction: a
        read_committed consumer reads no further (the LSO)."""
        return min(self.ongoing.values()) if self.ongoing else None

    # -- the leader's checks ------------------------------------------------
    def check(self, header: BatchHeader) -> Duplicate | None:
        """Judge a producer's batch before it is written (leader only).
        Returns where it already is if it is a duplicate; raises if it must
        be refused; None to append it."""
        entry = self.producers.get(header.producer_id)
        if entry is None:
            return None  # unknown producer: any sequence (see the module doc)
        epoch, first_seq = header.producer_epoch, header.base_sequence
        duplicate = entry.find_duplicate(epoch, first_seq, _last_seq(header))
        if duplicate is not None:
            return duplicate
        if not header.is_transactional and entry.txn_first_offset >= 0 and \
                epoch == entry.epoch:
            raise InvalidTxnStateError(
                f"producer {header.producer_id} sent a non-transactional batch while its "
                f"transaction (from offset {entry.txn_first_offset}) is open here")
        if epoch < entry.epoch:
            raise InvalidProducerEpochError(
                f"producer {header.producer_id} sent epoch {epoch}, older than the epoch "
                f"{entry.epoch} this partition has seen: a newer instance of this producer "
                "exists, so this one is fenced")
        if epoch > entry.epoch:
            if first_seq != 0 and entry.epoch != NO_PRODUCER_EPOCH:
                raise OutOfOrderSequenceError(
                    f"producer {header.producer_id} began epoch {epoch} at sequence "
                    f"{first_seq}; a new epoch starts at sequence 0")
            return None
        if first_seq != next_sequence(entry.last_seq):
            raise OutOfOrderSequenceError(
                f"producer {header.producer_id} epoch {epoch} sent sequence {first_seq} but "
                f"this partition's last sequence from it is {entry.last_seq} (expected "
                f"{next_sequence(entry.last_seq)}): a batch before it is missing")
        return None

    # -- applying appended batches (leader, follower, recovery) --------------------------
    def apply(self, header: BatchHeader) -> None:
        """Record a batch that is now in the log at ``header.base_offset``.
        Batches without a producer id only move ``end_offset``."""
        if header.producer_id >= 0:
            entry = self.producers.get(header.producer_id)
            if entry is None:
                entry = self.producers[header.producer_id] = ProducerEntry(header.producer_id)
            if header.producer_epoch != entry.epoch:
                if header.producer_epoch > entry.epoch:
                    entry.batches.clear()  # a new epoch restarts the sequence
                entry.epoch = max(entry.epoch, header.producer_epoch)
            if header.base_sequence >= 0 and header.producer_epoch == entry.epoch:
                entry.batches.append(BatchMetadata(
                    header.base_sequence, _last_seq(header), header.base_offset,
                    header.last_offset, header.max_timestamp))
            entry.last_timestamp = max(entry.last_timestamp, header.max_timestamp)
            if header.is_transactional and entry.txn_first_offset < 0:
                entry.txn_first_offset = header.base_offset
                self.ongoing[header.producer_id] = header.base_offset
        self.end_offset = max(self.end_offset, header.next_offset)

    # -- transaction markers (written by the transaction coordinator) -----------------
    def check_marker(self, producer_id: int, producer_epoch: int,
                     coordinator_epoch: int | None) -> None:
        """Refuse a marker from a fenced producer epoch or coordinator
        (``coordinator_epoch`` None: a coordinator's write for the producer,
        whose epoch alone is checked)."""
        entry = self.producers.get(producer_id)
        if entry is None:
            return
        if producer_epoch < entry.epoch:
            raise InvalidProducerEpochError(
                f"a marker for producer {producer_id} epoch {producer_epoch}, older than "
                f"its epoch {entry.epoch} here")
        if coordinator_epoch is not None and coordinator_epoch < entry.coordinator_epoch:
            raise TransactionCoordinatorFencedError(
                f"a marker from coordinator epoch {coordinator_epoch}, older than "
                f"{entry.coordinator_epoch} which wrote this producer's last marker")

    def apply_marker(self, header: BatchHeader, control_type: ControlType,
                     coordinator_epoch: int) -> AbortedTxn | None:
        """A marker at ``header.base_offset`` ends the producer's open
        transaction here; an ABORT returns the aborted transaction for the
        index."""
        pid = header.producer_id
        entry = self.producers.get(pid)
        if entry is None:
            entry = self.producers[pid] = ProducerEntry(pid)
        if header.producer_epoch > entry.epoch:
            entry.batches.clear()
            entry.epoch = header.producer_epoch
        entry.coordinator_epoch = max(entry.coordinator_epoch, coordinator_epoch)
        entry.last_timestamp = max(entry.last_timestamp, header.max_timestamp)
        first, entry.txn_first_offset = entry.txn_first_offset, -1
        self.ongoing.pop(pid, None)
        self.end_offset = max(self.end_offset, header.next_offset)
        if control_type != ControlType.ABORT or first < 0:
            return None
        stable = self.first_unstable_offset
        return AbortedTxn(pid, first, header.base_offset,
                          header.next_offset if stable is None else stable)

    def clear(self, offset: int) -> None:
        self.producers.clear()
        self.ongoing.clear()
        self.end_offset = offset

    def remove_expired(self, now_ms: int, expiration_ms: int) -> list[int]:
        """Forget producers whose last batch is older than ``expiration_ms``
        (``producer.id.expiration.ms``). Returns their ids."""
        cutoff = now_ms - expiration_ms
        gone = [pid for pid, entry in self.producers.items()
                if entry.last_timestamp < cutoff and entry.txn_first_offset < 0]
        for pid in gone:
            del self.producers[pid]
        return gone

    def describe(self) -> list[dict]:
        """Each producer as ``topics describe --producers`` shows it."""
        return [{"producer_id": e.producer_id, "producer_epoch": e.epoch,
                 "last_sequence": e.last_seq, "last_offset": e.last_offset,
                 "last_timestamp": e.last_timestamp,
                 "coordinator_epoch": e.coordinator_epoch,
                 "current_transaction_start_offset": e.txn_first_offset}
                for e in sorted(self.producers.values(), key=lambda e: e.producer_id)]

    # -- snapshots ------------------------------------------------------------
    def snapshot_bytes(self) -> bytes:
        body = msgpack.packb({"version": SNAPSHOT_VERSION, "offset": self.end_offset,
                              "producers": [e.to_wire() for e in self.producers.values()]})
        return _SNAPSHOT_HEADER.pack(zlib.crc32(body) & 0xFFFFFFFF) + body

    def write_snapshot(self) -> str:
        """Write the state as ``<end_offset>.snapshot`` (not fsynced: the
        log syncs it with its next flush, and a torn one fails its CRC and
        is skipped). Returns the path."""
        path = snapshot_path(self.directory, self.end_offset)
        tmp = path + ".tmp"
        with open(tmp, "wb") as f:
            f.write(self.snapshot_bytes())
        os.replace(tmp, path)
        return path

    def load_snapshot(self, offset: int) -> bool:
        """Replace the state with the snapshot at ``offset``; False (and
        the file deleted) if it is damaged."""
        path = snapshot_path(self.directory, offset)
        try:
            with open(path, "rb") as f:
                data = f.read()
            (crc,) = _SNAPSHOT_HEADER.unpack_from(data)
            body = data[_SNAPSHOT_HEADER.size:]
            if zlib.crc32(body) & 0xFFFFFFFF != crc:
                raise ValueError("checksum mismatch")
            raw = msgpack.unpackb(body)
            if raw["version"] != SNAPSHOT_VERSION or raw["offset"] != offset:
                raise ValueError(f"version {raw['version']}, offset {raw['offset']}")
            producers = {}
            for item in raw["producers"]:
                entry = ProducerEntry.from_wire(item)
                producers[entry.producer_id] = entry
        except (OSError, ValueError, KeyError, TypeError, struct.error,
                msgpack.exceptions.ExtraData, msgpack.exceptions.UnpackException) as exc:
            log.warning(
                "%s: ignoring a damaged producer snapshot: %s", path, exc)
            _unlink(path)
            return False
        self.producers = producers
        self.ongoing = {pid: e.txn_first_offset for pid, e in producers.items()
                        if e.txn_first_offset >= 0}
        self.end_offset = offset
        return True

    def delete_snapshots(self, *, below: int | None = None, above: int | None = None
                         ) -> None:
        """Delete snapshot files at offsets ``< below`` or ``> above``; all
        of them when neither is given."""
        everything = below is None and above is None
        for offset in snapshot_offsets(self.directory):
            if everything or (below is not None and offset < below) or (
                    above is not None and offset > above):
                _unlink(snapshot_path(self.directory, offset))

    def check_invariants(self) -> None:
        for pid, entry in self.producers.items():
            assert pid == entry.producer_id >= 0, (pid, entry)
            offsets = [b.first_offset for b in entry.batches]
            assert offsets == sorted(offsets), entry
            assert all(b.last_offset < self.end_offset for b in entry.batches), (
                entry, self.end_offset)
            assert (entry.txn_first_offset >= 0) == (pid in self.ongoing), entry
            assert entry.txn_first_offset < self.end_offset, entry


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
