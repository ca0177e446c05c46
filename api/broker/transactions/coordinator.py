"""The transaction coordinator's core: Kafka's transaction state machine
for the transactional ids of one ``__transaction_state`` partition.

Pure: no I/O, no clock (every call takes ``now_ms``). Each call returns an
answer and the records expressing the change; the shell
(``service.py``) appends the records to the partition and answers only
once they are committed, and a coordinator taking the partition over
replays them into a fresh core. One record per transactional id, each the
id's whole state (``TxnMetadata``), so the latest record of an id is its
state.

States (KIP-98)::

    EMPTY ──add partitions──▶ ONGOING ──end(commit)──▶ PREPARE_COMMIT ──markers──▶ COMPLETE_COMMIT
      ▲                          │      ──end(abort)──▶ PREPARE_ABORT  ──markers──▶ COMPLETE_ABORT
      │                          └─ timeout, or a new instance's init: PREPARE_ABORT, epoch + 1
      └────────────── init_producer_id (epoch + 1) from EMPTY or COMPLETE_* ◀─────────┘

``PREPARE_*`` is the commit point: once that record is committed the
outcome is decided, and whichever coordinator holds the partition writes
the markers (COMMIT or ABORT control batches) to every partition of the
transaction, then records ``COMPLETE_*``. A producer whose epoch is older
than the id's is fenced (``PRODUCER_FENCED``): bumping the epoch is how a
new instance, or a timeout, shuts out a zombie.
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Any

import msgpack

from protocol import TopicPartition

EPOCH_MAX = 2**15 - 1
RECORD_KEY_VERSION = 0
RECORD_VALUE_VERSION = 0

CODES = frozenset({
    "CONCURRENT_TRANSACTIONS", "INVALID_PRODUCER_ID_MAPPING", "PRODUCER_FENCED",
    "INVALID_TXN_STATE", "INVALID_TRANSACTION_TIMEOUT", "TRANSACTIONAL_ID_NOT_FOUND",
})


class TxnState(str, enum.Enum):
    EMPTY = "Empty"
    ONGOING = "Ongoing"
    PREPARE_COMMIT = "PrepareCommit"
    PREPARE_ABORT = "PrepareAbort"
    COMPLETE_COMMIT = "CompleteCommit"
    COMPLETE_ABORT = "CompleteAbort"
    DEAD = "Dead"

    @property
    def preparing(self) -> bool:
        return self in (TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT)

    @property
    def complete(self) -> bool:
        return self in (TxnState.COMPLETE_COMMIT, TxnState.COMPLETE_ABORT, TxnState.EMPTY)


class TxnError(Exception):
    """A request the coordinator refuses, with Kafka's error name. Raised
    before any change."""

    def __init__(self, code: str, message: str) -> None:
        assert code in CODES, code
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


@dataclasses.dataclass(frozen=True)
class TxnMetadata:
    """Everything the coordinator knows of one transactional id."""

    transactional_id: str
    producer_id: int
    producer_epoch: int
    timeout_ms: int
    state: TxnState
    partitions: tuple[TopicPartition, ...]  # sorted
    txn_start_ms: int  # when the current transaction began (-1: none)
    last_update_ms: int
    #: KIP-939: a transaction prepared for an outside coordinator (a Spark
    #: driver) to commit: never aborted by its timeout, only by a new
    #: instance's init or an operator.
    two_phase: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {"transactional_id": self.transactional_id, "producer_id": self.producer_id,
                "producer_epoch": self.producer_epoch, "timeout_ms": self.timeout_ms,
                "state": self.state.value,
                "partitions": [{"topic": tp.topic, "partition": tp.partition}
                               for tp in self.partitions],
                "txn_start_ms": self.txn_start_ms, "last_update_ms": self.last_update_ms,
                "two_phase_commit": self.two_phase}


def encode(record: TxnMetadata | tuple[str, None]) -> tuple[bytes, bytes | None]:
    """Key and value of a ``__transaction_state`` record; ``(id, None)`` is
    the tombstone of an expired id."""
    if isinstance(record, tuple):
        tid, _ = record
        return msgpack.packb([RECORD_KEY_VERSION, tid]), None
    value = {"v": RECORD_VALUE_VERSION, **record.to_dict()}
    value["partitions"] = [[tp.topic, tp.partition] for tp in record.partitions]
    value["two_phase"] = value.pop("two_phase_commit")
    return msgpack.packb([RECORD_KEY_VERSION, record.transactional_id]), msgpack.packb(value)


def decode(key: bytes, value: bytes | None) -> TxnMetadata | tuple[str, None]:
    key_version, tid = msgpack.unpackb(key)
    if key_version != RECORD_KEY_VERSION:
        raise ValueError(f"transaction record key version {key_version} is not known")
    if value is None:
        return tid, None
    raw = msgpack.unpackb(value)
    if raw.get("v", 0) > RECORD_VALUE_VERSION:
        raise ValueError(f"transaction record value version {raw['v']} is newer than this "
                         "broker's")
    return TxnMetadata(tid, raw["producer_id"], raw["producer_epoch"], raw["timeout_ms"],
                       TxnState(raw["state"]),
                       tuple(TopicPartition(t, p) for t, p in raw["partitions"]),
                       raw["txn_start_ms"], raw["last_update_ms"], raw.get("two_phase", False))


Records = list  # of TxnMetadata or (id, None)


class TransactionCoordinatorCore:
    """The transactional ids of one ``__transaction_state`` partition."""

    def __init__(self, *, max_timeout_ms: int, id_expiration_ms: int) -> None:
        self.max_timeout_ms = max_timeout_ms
        self.id_expiration_ms = id_expiration_ms
        self.txns: dict[str, TxnMetadata] = {}

    # -- rebuilding ------------------------------------------------------------------
    def replay(self, record: TxnMetadata | tuple[str, None]) -> None:
        if isinstance(record, tuple):
            self.txns.pop(record[0], None)
        else:
            self.txns[record.transactional_id] = record

    def _apply(self, records: Records) -> Records:
        for record in records:
            self.replay(record)
        return records

    # -- the producer's requests -------------------------------------------------------
    def init_producer_id(self, tid: str, timeout_ms: int, fresh_producer_id: int, now_ms: int,
                         producer_id: int = -1, producer_epoch: int = -1,
                         two_phase: bool = False) -> tuple[dict | TxnError, Records]:
        """InitProducerId with a transactional id: the id's producer id and a
        bumped epoch, fencing any older instance. An open transaction is
        aborted first (epoch bumped; ``CONCURRENT_TRANSACTIONS`` until its
        markers are written: retry). ``fresh_producer_id`` is used for a
        new id or when the epoch is exhausted. ``producer_id``/``epoch``
        (KIP-360): the caller's current ones, when it bumps its own epoch;
        an older epoch is fenced. ``two_phase`` (KIP-939): the id's
        transactions are committed by an outside coordinator and never
        time out."""
        if not 1 <= timeout_ms <= self.max_timeout_ms:
            raise TxnError("INVALID_TRANSACTION_TIMEOUT",
                           f"transaction_timeout_ms must be in [1, {self.max_timeout_ms}] "
                           f"(transaction.max.timeout.ms), not {timeout_ms}")
        current = self.txns.get(tid)
        if current is None:
            record = TxnMetadata(tid, fresh_producer_id, 0, timeout_ms, TxnState.EMPTY, (), -1,
                                 now_ms, two_phase)
            return {"producer_id": record.producer_id, "producer_epoch": 0}, \
                self._apply([record])
        if producer_id >= 0 and (producer_id != current.producer_id
                                 or producer_epoch != current.producer_epoch):
            raise TxnError("PRODUCER_FENCED",
                           f"transactional id {tid!r} is held by producer "
                           f"{current.producer_id} epoch {current.producer_epoch}, not "
                           f"{producer_id} epoch {producer_epoch}")
        if current.state.preparing:
            return _concurrent(tid, current), []
        if current.state == TxnState.ONGOING:
            # A new instance: abort what the old one left open, fencing it.
            return _concurrent(tid, current), self._apply(
                [self._prepare(current, TxnState.PREPARE_ABORT, now_ms, bump=True)])
        if current.producer_epoch >= EPOCH_MAX - 1:
            pid, epoch = fresh_producer_id, 0
        else:
            pid, epoch = current.producer_id, current.producer_epoch + 1
        record = dataclasses.replace(current, producer_id=pid, producer_epoch=epoch,
                                     timeout_ms=timeout_ms, state=TxnState.EMPTY,
                                     partitions=(), txn_start_ms=-1, last_update_ms=now_ms,
                                     two_phase=two_phase)
        return {"producer_id": pid, "producer_epoch": epoch}, self._apply([record])

    def add_partitions(self, tid: str, producer_id: int, producer_epoch: int,
                       partitions: list[TopicPartition], now_ms: int
                       ) -> tuple[dict | TxnError, Records]:
        """AddPartitionsToTxn: the transaction will write to ``partitions``
        (the offsets partition of a group, for offsets sent with it)."""
        current = self._owned(tid, producer_id, producer_epoch)
        if current.state.preparing:
            return _concurrent(tid, current), []
        wanted = set(partitions)
        if current.state == TxnState.ONGOING and wanted <= set(current.partitions):
            return {}, []
        start = current.txn_start_ms if current.state == TxnState.ONGOING else now_ms
        record = dataclasses.replace(
            current, state=TxnState.ONGOING, partitions=tuple(sorted(set(
                current.partitions if current.state == TxnState.ONGOING else ()) | wanted)),
            txn_start_ms=start, last_update_ms=now_ms)
        return {}, self._apply([record])

    def end_txn(self, tid: str, producer_id: int, producer_epoch: int, commit: bool,
                now_ms: int) -> tuple[dict | TxnError, Records]:
        """EndTxn: decide the outcome (PREPARE_*); the shell then writes the
        markers and calls ``complete``. A retry after the decision is
        answered by the state it reached."""
        current = self._owned(tid, producer_id, producer_epoch)
        target = TxnState.PREPARE_COMMIT if commit else TxnState.PREPARE_ABORT
        done = TxnState.COMPLETE_COMMIT if commit else TxnState.COMPLETE_ABORT
        if current.state == TxnState.ONGOING:
            return {}, self._apply([self._prepare(current, target, now_ms, bump=False)])
        if current.state == done:
            return {}, []
        if current.state == target:
            return _concurrent(tid, current), []
        raise TxnError("INVALID_TXN_STATE",
                       f"cannot {'commit' if commit else 'abort'} transactional id {tid!r}: "
                       f"its state is {current.state.value}"
                       + (" (no transaction was begun with a write)"
                          if current.state == TxnState.EMPTY else ""))

    # -- the shell's steps -------------------------------------------------------------
    def verify(self, tid: str, producer_id: int, producer_epoch: int,
               partitions: list[TopicPartition]) -> None:
        """KIP-890: a partition leader asks, before a transaction's first
        write to it, whether the partitions are in the producer's open
        transaction. Raises if not; changes nothing."""
        current = self._owned(tid, producer_id, producer_epoch)
        missing = sorted(set(partitions) - set(current.partitions))
        if current.state != TxnState.ONGOING or missing:
            raise TxnError("INVALID_TXN_STATE",
                           f"{[f'{tp.topic}-{tp.partition}' for tp in missing or partitions]} "
                           f"are not in an open transaction of {tid!r} (its state is "
                           f"{current.state.value}); add them before writing")

    def pending_markers(self) -> list[TxnMetadata]:
        """Decided transactions whose markers are still to be written."""
        return [txn for txn in self.txns.values() if txn.state.preparing]

    def complete(self, tid: str, producer_epoch: int, now_ms: int) -> Records:
        """The markers of ``tid``'s decided transaction are written."""
        current = self.txns.get(tid)
        if current is None or not current.state.preparing or \
                current.producer_epoch != producer_epoch:
            return []
        done = (TxnState.COMPLETE_COMMIT if current.state == TxnState.PREPARE_COMMIT
                else TxnState.COMPLETE_ABORT)
        return self._apply([dataclasses.replace(current, state=done, last_update_ms=now_ms)])

    def tick(self, now_ms: int) -> Records:
        """Abort transactions open longer than their timeout (bumping the
        epoch, so the producer that left them is fenced), except two-phase
        ones (KIP-939: their outside coordinator decides); forget ids idle
        for ``transactional.id.expiration.ms``."""
        records: Records = []
        for txn in list(self.txns.values()):
            if txn.state == TxnState.ONGOING and not txn.two_phase \
                    and now_ms - txn.txn_start_ms > txn.timeout_ms:
                records.append(self._prepare(txn, TxnState.PREPARE_ABORT, now_ms, bump=True))
            elif txn.state.complete and now_ms - txn.last_update_ms > self.id_expiration_ms:
                records.append((txn.transactional_id, None))
        return self._apply(records)

    def abort(self, tid: str, now_ms: int) -> tuple[dict, Records]:
        """An operator's abort (``kraftlog transactions abort``): an open
        transaction is aborted with the epoch bumped, as on a timeout."""
        current = self.txns.get(tid)
        if current is None:
            raise TxnError("TRANSACTIONAL_ID_NOT_FOUND", f"no transactional id {tid!r} here")
        if current.state != TxnState.ONGOING:
            raise TxnError("INVALID_TXN_STATE",
                           f"transactional id {tid!r} has no open transaction "
                           f"({current.state.value})")
        return {}, self._apply([self._prepare(current, TxnState.PREPARE_ABORT, now_ms,
                                              bump=True)])

    # -- inspection ------------------------------------------------------------------
    def describe(self, tid: str) -> dict | None:
        txn = self.txns.get(tid)
        return txn.to_dict() if txn is not None else None

    def list_transactions(self) -> list[dict]:
        return [{"transactional_id": t.transactional_id, "producer_id": t.producer_id,
                 "state": t.state.value} for t in sorted(self.txns.values(),
                                                         key=lambda t: t.transactional_id)]

    # -- helpers -----------------------------------------------------------------------
    def _owned(self, tid: str, producer_id: int, producer_epoch: int) -> TxnMetadata:
        current = self.txns.get(tid)
        if current is None or current.producer_id != producer_id:
            raise TxnError("INVALID_PRODUCER_ID_MAPPING",
                           f"transactional id {tid!r} does not belong to producer "
                           f"{producer_id}; call init_transactions first")
        if producer_epoch != current.producer_epoch:
            raise TxnError("PRODUCER_FENCED",
                           f"producer {producer_id} epoch {producer_epoch} of {tid!r} is fenced "
                           f"by epoch {current.producer_epoch}: a newer instance took over, or "
                           "its transaction timed out and was aborted")
        return current

    @staticmethod
    def _prepare(txn: TxnMetadata, state: TxnState, now_ms: int, bump: bool) -> TxnMetadata:
        epoch = txn.producer_epoch + 1 if bump and txn.producer_epoch < EPOCH_MAX else \
            txn.producer_epoch
        return dataclasses.replace(txn, state=state, producer_epoch=epoch, last_update_ms=now_ms)

    def check_invariants(self) -> None:
        for tid, txn in self.txns.items():
            assert tid == txn.transactional_id
            assert 0 <= txn.producer_epoch <= EPOCH_MAX
            assert txn.state != TxnState.ONGOING or txn.partitions, txn
            assert txn.state not in (TxnState.EMPTY,) or not txn.partitions, txn


def _concurrent(tid: str, txn: TxnMetadata) -> TxnError:
    return TxnError("CONCURRENT_TRANSACTIONS",
                    f"transactional id {tid!r} is completing a transaction "
                    f"({txn.state.value}); retry shortly")
