"""The sink's exactly-once protocol: KIP-939's two phases over Spark's.

Spark runs a streaming write as tasks (``write`` on executors), then one
``commit(messages, batch_id)`` on the driver once every task succeeded, and
records the batch in its checkpoint's commit log only after that returns. A
restart re-runs the last batch without such a record, with the same input.
The sink makes that exactly once for ``read_committed`` consumers:

1. **Tasks prepare.** Task *t* of a batch writes its rows in one transaction
   of the transactional id ``<prefix>-<t>`` with two-phase commit (the
   coordinator never aborts it on a timeout), and leaves it open
   (``Producer.prepare_transaction``). Its ``init_transactions`` fences any
   earlier attempt of the task and aborts what that left open.
2. **The driver decides.** ``commit`` writes the decision (the batch id and
   every prepared transaction) to the sink's registry, then commits the
   transactions, then records the batch as done. Writing the decision is the
   commit point: from then on the batch is rolled forward, never back.
3. **Recovery.** A decision not marked done (the driver died while
   committing) is finished by the next ``commit``, and each task finishes
   its own id's transaction before taking the id again. A batch Spark replays
   that was already decided writes nothing: its tasks see the decision and
   skip, and ``commit`` of a batch id at or below the decision commits
   nothing new. Transactions a crashed attempt left open under ids the replay
   does not use are aborted by ``commit``: every task registers before it
   writes, so the registry knows every id in use.

The registry is the committed offsets of the consumer group named
``<prefix>`` (replicated, durable, one lookup to read), on reserved
partitions no topic has:

- ``__sink_task-<t>``: offset = the batch task *t* last began;
- ``__sink_decision-<i>``: offset = the decided batch, metadata = part *i*
  of its transactions, JSON ``{"n": parts, "t": [[task, producer id,
  epoch], ...]}``; all parts written in one request;
- ``__sink_done-0``: offset = the last batch whose transactions are all
  committed.

``kraftlog groups describe <prefix>`` shows them. The encoding here is pure;
the ``async`` functions do the I/O through an ``AsyncAdmin``.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from api.client import KraftlogError, OffsetAndMetadata, PreparedTransaction, TopicPartition
from api.client.admin import AsyncAdmin

logger = logging.getLogger(__name__)

TASK_TOPIC = "__sink_task"
DECISION_TOPIC = "__sink_decision"
DONE_TOPIC = "__sink_done"
#: Characters of one decision part: under the broker's limit for committed
#: offset metadata (4,096).
DECISION_PART_CHARS = 3800
#: Answers to aborting a stray id that mean there is nothing to abort.
NOTHING_OPEN = frozenset({"INVALID_TXN_STATE", "TRANSACTIONAL_ID_NOT_FOUND"})


class SinkCommitError(RuntimeError):
    """A decided batch cannot be completed: one of its transactions was
    aborted by someone else (``kraftlog transactions abort``)."""


def transactional_id(prefix: str, task: int) -> str:
    return f"{prefix}-{task}"


@dataclass(frozen=True)
class Registry:
    """What the registry holds for one sink (see the module's docstring)."""

    decided: int = -1
    #: task -> its prepared transaction in the decided batch
    decision: Mapping[int, PreparedTransaction] = field(default_factory=dict)
    done: int = -1
    #: task -> the batch it last began
    tasks: Mapping[int, int] = field(default_factory=dict)

    @property
    def pending(self) -> bool:
        """A decision whose transactions may not all be committed yet."""
        return self.decided > self.done


def parse_registry(prefix: str, offsets: Mapping[TopicPartition, OffsetAndMetadata]
                   ) -> Registry:
    """The group's committed offsets -> ``Registry``. A decision is read
    only whole: every part present, all of one batch."""
    tasks: dict[int, int] = {}
    parts: dict[int, OffsetAndMetadata] = {}
    done = -1
    for tp, value in offsets.items():
        if tp.topic == TASK_TOPIC:
            tasks[tp.partition] = value.offset
        elif tp.topic == DECISION_TOPIC:
            parts[tp.partition] = value
        elif tp.topic == DONE_TOPIC:
            done = value.offset
    if 0 not in parts:
        return Registry(done=done, tasks=tasks)
    decided = parts[0].offset
    count = json.loads(parts[0].metadata)["n"]
    decision: dict[int, PreparedTransaction] = {}
    for i in range(count):
        part = parts.get(i)
        if part is None or part.offset != decided:
            raise SinkCommitError(f"the decision of batch {decided} of sink {prefix!r} is "
                                  f"incomplete (part {i} of {count} missing)")
        for task, producer_id, epoch in json.loads(part.metadata)["t"]:
            decision[task] = PreparedTransaction(transactional_id(prefix, task), producer_id,
                                                 epoch)
    return Registry(decided, decision, done, tasks)


def decision_entries(batch_id: int, prepared: Mapping[int, PreparedTransaction]
                     ) -> dict[TopicPartition, OffsetAndMetadata]:
    """The registry entries deciding ``batch_id`` with ``prepared``."""
    triples = [[task, p.producer_id, p.producer_epoch] for task, p in sorted(prepared.items())]
    chunks: list[list] = [[]]
    size = 0
    for triple in triples:
        length = len(json.dumps(triple)) + 1
        if chunks[-1] and size + length > DECISION_PART_CHARS:
            chunks.append([])
            size = 0
        chunks[-1].append(triple)
        size += length
    return {TopicPartition(DECISION_TOPIC, i): OffsetAndMetadata(
                batch_id, json.dumps({"n": len(chunks), "t": chunk}, separators=(",", ":")))
            for i, chunk in enumerate(chunks)}


# -- I/O -------------------------------------------------------------------------------------
async def read_registry(admin: AsyncAdmin, prefix: str) -> Registry:
    return parse_registry(prefix, await admin.list_consumer_group_offsets(prefix))


async def register_task(admin: AsyncAdmin, prefix: str, task: int, batch_id: int) -> None:
    await admin.alter_consumer_group_offsets(
        prefix, {TopicPartition(TASK_TOPIC, task): OffsetAndMetadata(batch_id)})


async def complete(admin: AsyncAdmin, prepared: PreparedTransaction, commit: bool) -> None:
    """Commit (or abort) one prepared transaction, or find it completed
    already: an id that has moved on (``PRODUCER_FENCED``: a later epoch)
    completed this transaction before, since the sink takes an id again only
    after finishing the id's decided transaction. A decided transaction found
    aborted at its own epoch is an error: someone else aborted it."""
    try:
        await admin.complete_transaction(prepared, commit)
    except KraftlogError as exc:
        if exc.code == "INVALID_TXN_STATE" and commit:
            raise SinkCommitError(
                f"transaction {prepared.transactional_id} (producer {prepared.producer_id}, "
                f"epoch {prepared.producer_epoch}) was decided committed by the sink but is "
                f"aborted ({exc}): the rows of that task in that batch are lost. Do not abort "
                "a sink's prepared transactions by hand") from exc
        if exc.code not in ("PRODUCER_FENCED", "INVALID_TXN_STATE"):
            raise
        logger.info("transaction %s epoch %d was completed before: %s",
                    prepared.transactional_id, prepared.producer_epoch, exc)


async def complete_all(admin: AsyncAdmin, prepared: Iterable[PreparedTransaction],
                       commit: bool) -> None:
    await asyncio.gather(*(complete(admin, p, commit) for p in prepared))


async def roll_forward(admin: AsyncAdmin, prefix: str, registry: Registry) -> None:
    """Commit every transaction of a pending decision; mark it done."""
    if not registry.pending:
        return
    logger.warning("sink %s: completing batch %d, decided before a restart", prefix,
                   registry.decided)
    await complete_all(admin, registry.decision.values(), commit=True)
    await admin.alter_consumer_group_offsets(
        prefix, {TopicPartition(DONE_TOPIC, 0): OffsetAndMetadata(registry.decided)})


async def abort_strays(admin: AsyncAdmin, prefix: str, tasks: Iterable[int]) -> None:
    """Abort whatever the ids of ``tasks`` hold open (a crashed attempt's
    transactions); ids with nothing open are left alone."""
    async def one(task: int) -> None:
        tid = transactional_id(prefix, task)
        try:
            await admin.abort_transaction(tid)
            logger.warning("sink %s: aborted %s, left open by an attempt that did not finish",
                           prefix, tid)
        except KraftlogError as exc:
            if exc.code not in NOTHING_OPEN:
                raise

    await asyncio.gather(*(one(t) for t in tasks))


async def begin_task(admin: AsyncAdmin, prefix: str, task: int, batch_id: int) -> bool:
    """Before task ``task`` of ``batch_id`` takes its transactional id:
    whether it should write (False: the batch was decided before a restart,
    its rows are in). Finishes the id's decided transaction first, if any,
    and registers the task."""
    registry = await read_registry(admin, prefix)
    mine = registry.decision.get(task) if registry.pending else None
    if mine is not None:
        await complete(admin, mine, commit=True)
    if batch_id <= registry.decided:
        return False
    await register_task(admin, prefix, task, batch_id)
    return True


async def commit_batch(admin: AsyncAdmin, prefix: str, batch_id: int,
                       prepared: Mapping[int, PreparedTransaction], ran: Iterable[int]
                       ) -> str:
    """The driver's ``commit`` of a streaming batch: ``prepared`` maps each
    task that wrote to its transaction; ``ran`` lists every task of the
    batch. Returns what it did, for the log."""
    registry = await read_registry(admin, prefix)
    await roll_forward(admin, prefix, registry)
    if batch_id <= registry.decided:
        # Replayed after a restart and decided before it: its rows are in.
        await complete_all(admin, prepared.values(), commit=False)
        return f"batch {batch_id} was committed before the restart; nothing written again"
    ran = set(ran)
    strays = [t for t, began in registry.tasks.items()
              if began > registry.decided and t not in ran]
    if strays:
        await abort_strays(admin, prefix, strays)
    if not prepared:
        return f"batch {batch_id}: no rows"
    await admin.alter_consumer_group_offsets(prefix, decision_entries(batch_id, prepared))
    await complete_all(admin, prepared.values(), commit=True)
    await admin.alter_consumer_group_offsets(
        prefix, {TopicPartition(DONE_TOPIC, 0): OffsetAndMetadata(batch_id)})
    return f"batch {batch_id}: {len(prepared)} transactions committed"
