"""The transactional producer's side of KIP-98, on the producer's event loop.

``TransactionManager`` talks to the transactional id's coordinator (found
with ``POST /v1/transactions/coordinator``, followed when it moves) and
keeps the producer's transaction state::

    UNINITIALIZED ─init─▶ READY ─begin─▶ IN_TRANSACTION ─commit/abort─▶ READY
                                              │ a send failed
                                              ▼
                                        ABORTABLE_ERROR ─abort─▶ READY
    any state ── fenced by a newer instance (PRODUCER_FENCED) ──▶ FATAL_ERROR
    IN_TRANSACTION ─prepare─▶ PREPARED   (KIP-939: another process ends it)

Before the first batch of a transaction leaves for a partition, the
partition is added to the transaction (``AddPartitionsToTxn``); the sender
holds the partition's batches until then (``IdempotenceState.allowed``).
``commit`` sends everything, waits for every record's acknowledgement and
then ends the transaction; the coordinator writes the markers, and
``commit`` returns once they are written, so a ``read_committed`` consumer
sees the records as soon as it returns.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable
from typing import Any

from api.client._transport import ClusterMetadata, Transport, monotonic_ms
from api.client.errors import KraftlogError
from api.client.idempotence import IdempotenceState

logger = logging.getLogger(__name__)

#: Answers after which the coordinator must be found again.
FIND_AGAIN_CODES = frozenset({"NOT_COORDINATOR", "COORDINATOR_NOT_AVAILABLE",
                              "BROKER_NOT_AVAILABLE"})
#: Answers after which the same request is tried again after a pause.
RETRY_CODES = frozenset({"COORDINATOR_LOAD_IN_PROGRESS", "CONCURRENT_TRANSACTIONS",
                         "REQUEST_TIMED_OUT", "NOT_ENOUGH_REPLICAS",
                         "NOT_ENOUGH_REPLICAS_AFTER_APPEND", "NOT_LEADER_OR_FOLLOWER",
                         # A coordinator just restarted may not know the topic yet.
                         "UNKNOWN_TOPIC_OR_PARTITION", "LEADER_NOT_AVAILABLE",
                         "KAFKA_STORAGE_ERROR"})
FATAL_CODES = frozenset({"PRODUCER_FENCED", "INVALID_PRODUCER_EPOCH",
                         "INVALID_PRODUCER_ID_MAPPING", "TRANSACTIONAL_ID_AUTHORIZATION_FAILED"})

UNINITIALIZED, READY, IN_TRANSACTION, ABORTABLE_ERROR, FATAL_ERROR, PREPARED = (
    "UNINITIALIZED", "READY", "IN_TRANSACTION", "ABORTABLE_ERROR", "FATAL_ERROR", "PREPARED")


class TransactionManager:
    def __init__(self, transactional_id: str, timeout_ms: int, metadata: ClusterMetadata,
                 transport: Transport, idempotence: IdempotenceState, *,
                 max_block_ms: int, retry_backoff_ms: int, request_timeout_ms: int,
                 two_phase: bool = False) -> None:
        self.transactional_id = transactional_id
        self.two_phase = two_phase
        self.timeout_ms = timeout_ms
        self.metadata = metadata
        self.transport = transport
        self.idem = idempotence
        self.max_block_ms = max_block_ms
        self.retry_backoff_ms = retry_backoff_ms
        self.request_timeout_ms = request_timeout_ms
        self.state = UNINITIALIZED
        self.error: KraftlogError | None = None
        #: Partitions the coordinator has added to the open transaction; the
        #: sender sends only to these (the same set as ``idem.allowed``).
        self.added: set[tuple[str, int]] = set()
        idempotence.allowed = self.added
        self._coordinator_url: str | None = None
        self._adding: asyncio.Task | None = None
        #: Called when partitions were added (the sender wakes up).
        self.on_change: Callable[[], None] = lambda: None

    # -- state -----------------------------------------------------------------------
    def _require(self, *states: str, action: str) -> None:
        if self.state == FATAL_ERROR:
            raise KraftlogError("PRODUCER_FENCED" if self.error is None else self.error.code,
                                f"cannot {action}: the producer is fenced or failed for good "
                                f"({self.error}); close it and create a new one",
                                retriable=False)
        if self.state not in states:
            raise KraftlogError("INVALID_TXN_STATE",
                                f"cannot {action} in state {self.state}"
                                + (": call init_transactions() first"
                                   if self.state == UNINITIALIZED else ""), retriable=False)

    def batch_failed(self, error: KraftlogError) -> None:
        """A record of the open transaction failed: it may only be aborted."""
        if error.code in FATAL_CODES:
            self._fatal(error)
        elif self.state == IN_TRANSACTION:
            self.state = ABORTABLE_ERROR
            self.error = error

    def _fatal(self, error: KraftlogError) -> None:
        self.state = FATAL_ERROR
        self.error = error

    # -- requests to the coordinator -----------------------------------------------------
    async def _call(self, path: str, body: dict, what: str) -> Any:
        """``path`` on the coordinator, finding it (again) and retrying the
        retriable answers until ``max_block_ms``."""
        deadline = monotonic_ms() + self.max_block_ms
        last: KraftlogError | None = None
        while monotonic_ms() < deadline:
            try:
                if self._coordinator_url is None:
                    found = await self.metadata.request_any(
                        "/v1/transactions/coordinator",
                        {"transactional_id": self.transactional_id})
                    self._coordinator_url = found.get("coordinator_url")
                    if self._coordinator_url is None:
                        raise KraftlogError("COORDINATOR_NOT_AVAILABLE",
                                            "the coordinator has no address yet")
                return await self.transport.request(self._coordinator_url, path, body,
                                                    timeout_ms=self.request_timeout_ms)
            except KraftlogError as exc:
                last = exc
                if exc.code in FIND_AGAIN_CODES:
                    self._coordinator_url = None
                elif exc.code not in RETRY_CODES:
                    if exc.code in FATAL_CODES:
                        self._fatal(exc)
                    raise
            await asyncio.sleep(self.retry_backoff_ms / 1000)
        raise KraftlogError(
            "REQUEST_TIMED_OUT", f"{what} did not finish within max_block_ms "
            f"({self.max_block_ms} ms); last error: {last}", retriable=True)

    async def init(self) -> None:
        """InitProducerId: the id's producer id and a new epoch, fencing any
        older instance and aborting what it left open."""
        self._require(UNINITIALIZED, READY, action="init_transactions")
        body: dict[str, Any] = {"transactional_id": self.transactional_id,
                                "transaction_timeout_ms": self.timeout_ms}
        if self.two_phase:
            body["two_phase_commit"] = True
        if self.idem.has_id:  # KIP-360: bump our own epoch
            body.update(producer_id=self.idem.producer_id, producer_epoch=self.idem.epoch)
        answer = await self._call("/v1/producers/init", body, "init_transactions")
        self.idem.set_id(answer["producer_id"], answer["producer_epoch"])
        self.state = READY

    def begin(self) -> None:
        self._require(READY, action="begin_transaction")
        self.added.clear()
        self.state = IN_TRANSACTION
        self.error = None

    # -- adding partitions (run by the sender) -------------------------------------------
    def maybe_add(self, wanted: Iterable[tuple[str, int]]) -> None:
        """Start adding the partitions with data that are not added yet."""
        if self.state != IN_TRANSACTION or self._adding is not None:
            return
        missing = sorted(set(wanted) - self.added)
        if missing:
            self._adding = asyncio.get_running_loop().create_task(self._add(missing))

    async def _add(self, partitions: list[tuple[str, int]]) -> None:
        try:
            await self._call("/v1/transactions/add_partitions", {
                "transactional_id": self.transactional_id,
                "producer_id": self.idem.producer_id, "producer_epoch": self.idem.epoch,
                "partitions": [{"topic": t, "partition": p} for t, p in partitions]},
                "adding partitions to the transaction")
            self.added.update(partitions)
        except KraftlogError as exc:
            logger.warning("transaction %r: cannot add %s: %s", self.transactional_id,
                           partitions, exc)
            self.batch_failed(exc)
        finally:
            self._adding = None
            self.on_change()

    # -- consumed offsets (send_offsets_to_transaction) ---------------------------------------
    async def send_offsets(self, offsets: dict[tuple[str, int], int], group_id: str) -> None:
        """Commit ``offsets`` for ``group_id`` as part of the open transaction:
        the group's ``__consumer_offsets`` partition joins the transaction,
        then the group coordinator writes the offsets in it; they become the
        group's committed offsets exactly when the transaction commits."""
        self._require(IN_TRANSACTION, action="send_offsets_to_transaction")
        deadline = monotonic_ms() + self.max_block_ms
        while True:
            try:
                where = await self.metadata.request_any("/v1/groups/coordinator",
                                                        {"group_id": group_id})
                offsets_partition = ("__consumer_offsets", where["partition"])
                if offsets_partition not in self.added:
                    await self._call("/v1/transactions/add_partitions", {
                        "transactional_id": self.transactional_id,
                        "producer_id": self.idem.producer_id,
                        "producer_epoch": self.idem.epoch,
                        "partitions": [{"topic": offsets_partition[0],
                                        "partition": offsets_partition[1]}]},
                        "adding the group's offsets to the transaction")
                    self.added.add(offsets_partition)
                answer = await self.transport.request(
                    where["coordinator_url"], "/v1/groups/offsets/txn_commit", {
                        "group_id": group_id, "transactional_id": self.transactional_id,
                        "producer_id": self.idem.producer_id,
                        "producer_epoch": self.idem.epoch,
                        "offsets": [{"topic": t, "partition": p, "offset": o}
                                    for (t, p), o in sorted(offsets.items())]},
                    timeout_ms=self.request_timeout_ms)
                for entry in answer.get("partitions") or ():
                    if entry.get("error"):
                        raise KraftlogError(entry["error"]["code"],
                                            entry["error"].get("message", ""),
                                            retriable=False)
                return
            except KraftlogError as exc:
                if exc.code in FATAL_CODES:
                    self._fatal(exc)
                    raise
                if (exc.code not in FIND_AGAIN_CODES | RETRY_CODES
                        and exc.code != "COORDINATOR_LOAD_IN_PROGRESS") \
                        or monotonic_ms() >= deadline:
                    self.batch_failed(exc)
                    raise
            await asyncio.sleep(self.retry_backoff_ms / 1000)

    # -- ending ------------------------------------------------------------------------
    async def end(self, commit: bool) -> None:
        """EndTxn, retried until the coordinator has written the markers."""
        if self.added:
            await self._call("/v1/transactions/end", {
                "transactional_id": self.transactional_id,
                "producer_id": self.idem.producer_id, "producer_epoch": self.idem.epoch,
                "committed": commit}, "commit_transaction" if commit else "abort_transaction")
            # Retried until the decided state is complete: the markers are in.
            await self._call("/v1/transactions/end", {
                "transactional_id": self.transactional_id,
                "producer_id": self.idem.producer_id, "producer_epoch": self.idem.epoch,
                "committed": commit}, "waiting for the transaction markers")
        self.added.clear()
        self.state = READY
        self.error = None
