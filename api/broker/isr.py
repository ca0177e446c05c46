"""ISR changes over HTTP: the transport of the replication core's ``SendAlterPartition``.

``Partition.isr_proposal`` decides what to propose and the core
(``replication.ReplicationCore``) when (after a follower fetch, and every
``replica.lag.time.max.ms / 2``), keeps at most one proposal per partition in
flight, gives up on one after ``ALTER_PARTITION_TIMEOUT_MS`` and applies the
answer. This module only sends the AlterPartitions to the active controller, many
in one request, and hands the answers of each request, or their refusals'
codes, back to the ``ReplicaManager`` together.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from api.broker.replica_manager import ReplicaManager, RequestTasks
from api.broker.replication import SendAlterPartition
from kraft.client import ControllerClient
from protocol.errors import KraftError

logger = logging.getLogger(__name__)


#: Items per AlterPartition request, at most (the controller takes 10,000).
ALTER_BATCH_MAX = 1000
#: The fields every item of one request shares (sent once, not per item).
_SHARED = ("broker_id", "broker_epoch")
#: After a controller answered that it has no ``partitions/alter-many`` (an
#: older version, during a rolling upgrade), ISR changes go one per request
#: for this long before the batched call is tried again.
SINGLES_AFTER_NOT_FOUND_S = 60.0


class AlterPartitionSender:
    """Sends the ISR changes the core asks for within one pass of the event
    loop as one request (``partitions/alter-many``), as Kafka's
    AlterPartitionManager batches them: a broker rejoining thousands of
    ISRs, or a leader shrinking them after a follower died, costs the
    controller a request per ``ALTER_BATCH_MAX`` partitions, not one each.
    Every item is answered (or refused) on its own."""

    def __init__(self, replicas: ReplicaManager, client: ControllerClient) -> None:
        self.replicas = replicas
        self.client = client
        self._batches = RequestTasks()
        self._next_batch = 0
        # Waiting for the end of this loop pass, by the core's request id.
        self._queued: dict[int, SendAlterPartition] = {}
        # Sent and not answered yet (cancelled ones are dropped from here).
        self._in_flight: set[int] = set()
        self._flush_scheduled = False
        self._stopped = False
        self._singles_until = 0.0  # time.monotonic(): one change per request until then

    def send(self, action: SendAlterPartition) -> None:
        self._queued[action.request_id] = action
        if not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)

    def cancel(self, request_id: int) -> None:
        """The core gave up on it: never sent, or its answer dropped."""
        if self._queued.pop(request_id, None) is None:
            self._in_flight.discard(request_id)

    def _flush(self) -> None:
        self._flush_scheduled = False
        if self._stopped:
            return
        groups: dict[tuple, list[SendAlterPartition]] = {}
        for action in self._queued.values():
            groups.setdefault(tuple(action.body[k] for k in _SHARED), []).append(action)
        self._queued.clear()
        singles = time.monotonic() < self._singles_until
        for shared, actions in groups.items():
            if singles:
                for action in actions:
                    self._in_flight.add(action.request_id)
                    self._next_batch += 1
                    self._batches.start(self._next_batch, self._send_one(action),
                                        f"alter-partition-{action.request_id}")
                continue
            for start in range(0, len(actions), ALTER_BATCH_MAX):
                batch = actions[start:start + ALTER_BATCH_MAX]
                self._in_flight.update(a.request_id for a in batch)
                self._next_batch += 1
                self._batches.start(self._next_batch, self._send(dict(zip(_SHARED, shared)),
                                                                 batch),
                                    f"alter-partitions-{self._next_batch}")

    async def _call(self, path: str, body: dict, timeout_ms: int) -> tuple[Any, str | None]:
        """The controller's answer, or None and the refusal's code (UNKNOWN
        for anything else: a bug must not leave a proposal pending)."""
        try:
            return await self.client.call(path, body, timeout_ms=timeout_ms), None
        except asyncio.CancelledError:
            raise
        except KraftError as exc:
            return None, getattr(exc, "code", None) or "UNKNOWN"
        except Exception:
            logger.exception("broker %d: AlterPartition failed", self.replicas.broker_id)
            return None, "UNKNOWN"

    async def _send(self, shared: dict, batch: list[SendAlterPartition]) -> None:
        body = {**shared, "partitions": [
            {k: v for k, v in action.body.items() if k not in _SHARED} for action in batch]}
        answer, code = await self._call("/v1/controller/partitions/alter-many", body,
                                        max(a.timeout_ms for a in batch))
        if code == "NOT_FOUND":  # a controller without the batched call
            logger.info("broker %d: the controller has no partitions/alter-many; sending "
                        "ISR changes one at a time", self.replicas.broker_id)
            self._singles_until = time.monotonic() + SINGLES_AFTER_NOT_FOUND_S
            await asyncio.gather(*(self._send_one(action) for action in batch))
            return
        results = answer.get("partitions") if isinstance(answer, dict) else None
        if code is None and (not isinstance(results, list) or len(results) != len(batch)):
            logger.error("broker %d: %d ISR changes sent, answered %r", self.replicas.broker_id,
                         len(batch), results)
            code = "UNKNOWN"
        if code is not None:
            self._answer([(action, None, code) for action in batch])
            return
        offset = answer.get("metadata_offset")
        answers = []
        for action, result in zip(batch, results):
            error = result.get("error") if isinstance(result, dict) else {"code": "UNKNOWN"}
            if error:
                answers.append((action, None, error.get("code") or "UNKNOWN"))
            else:
                answers.append((action, {**result, "metadata_offset": offset}, None))
        self._answer(answers)

    async def _send_one(self, action: SendAlterPartition) -> None:
        """One ISR change alone (``partitions/alter``)."""
        answer, code = await self._call("/v1/controller/partitions/alter", action.body,
                                        action.timeout_ms)
        self._answer([(action, answer, code)])

    def _answer(self, answers: list[tuple[SendAlterPartition, dict | None, str | None]]
                ) -> None:
        """Hands a request's answers to the core together: it looks again
        at what waits on their partitions once, not once per answer."""
        due = []
        for action, answer, code in answers:
            if action.request_id in self._in_flight:
                self._in_flight.discard(action.request_id)
                due.append((action.request_id, answer, code))
        if due:
            self.replicas.alter_partitions_answered(due)

    async def stop(self) -> None:
        self._stopped = True
        self._queued.clear()
        await self._batches.stop()
