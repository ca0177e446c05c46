"""The leader's ISR changes, sent to the controller as AlterPartition.

``Partition.isr_proposal`` decides (a pure core); this shell sends what it
decides and hands the controller's answer back:

  - after every follower fetch that moved a follower's state (``maybe_propose``
    for that partition: a caught-up replica joins at once);
  - every ``replica.lag.time.max.ms / 2`` for every partition this broker
    leads (a silent or slow follower is shrunk out, as Kafka's
    ``isr-expiration`` task does).

At most one proposal per partition is in flight. A refused or lost proposal
is forgotten and decided afresh at the next chance; an accepted one is
applied to the partition at once (its partition epoch moves), and the
metadata image confirms it later.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from api.broker.partition import IsrProposal, Partition
from api.broker.replica_manager import ReplicaManager
from kraft.client import ControllerClient
from kraft.errors import KraftError

logger = logging.getLogger(__name__)

#: How long an AlterPartition may take at the controller.
ALTER_PARTITION_TIMEOUT_MS = 5000
#: Refusals the controller makes before writing anything, and which a retry
#: of an already applied request cannot produce (the partition epoch is
#: checked first): the proposal certainly did not take effect.
DEFINITE_REFUSALS = frozenset({"INELIGIBLE_REPLICA", "INVALID_REQUEST"})


class IsrManager:
    def __init__(self, replicas: ReplicaManager, client: ControllerClient,
                 broker_epoch: Callable[[], int | None], lag_time_max_ms: int) -> None:
        self.replicas = replicas
        self.client = client
        self.broker_epoch = broker_epoch
        self.lag_time_max_ms = lag_time_max_ms
        self._in_flight: set[asyncio.Task] = set()
        self._task: asyncio.Task | None = None

    async def start(self) -> None:
        self._task = asyncio.create_task(self._expire_loop(), name="isr-expiration")

    async def stop(self) -> None:
        tasks = list(self._in_flight) + ([self._task] if self._task else [])
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._in_flight.clear()
        self._task = None

    def maybe_propose(self, part: Partition) -> None:
        """Send the partition's ISR change if it has one now."""
        if self.broker_epoch() is None:
            return
        proposal = part.isr_proposal(self.replicas.clock_ms(), self.lag_time_max_ms,
                                     self.replicas.image.live_broker_ids())
        if proposal is not None:
            task = asyncio.create_task(self._send(part, proposal))
            self._in_flight.add(task)
            task.add_done_callback(self._in_flight.discard)

    async def _expire_loop(self) -> None:
        interval_s = max(0.05, self.lag_time_max_ms / 2000)
        while True:
            await asyncio.sleep(interval_s)
            for part in list(self.replicas.partitions.values()):
                try:
                    if part.is_leader:
                        self.maybe_propose(part)
                except Exception:  # one partition's failure must not end the task
                    logger.exception("broker %d: ISR check of %s failed",
                                     self.replicas.broker_id, part.tp)

    async def _send(self, part: Partition, proposal: IsrProposal) -> None:
        answer, refused = None, False
        try:
            answer = await self.client.call("/v1/controller/partitions/alter", {
                "broker_id": self.replicas.broker_id,
                "broker_epoch": self.broker_epoch(),
                "topic": proposal.tp.topic,
                "partition": proposal.tp.partition,
                "leader_epoch": proposal.leader_epoch,
                "partition_epoch": proposal.partition_epoch,
                "new_isr": proposal.new_isr,
                "leader_recovery_state": proposal.leader_recovery_state,
            }, timeout_ms=ALTER_PARTITION_TIMEOUT_MS)
        except KraftError as exc:
            refused = getattr(exc, "code", None) in DEFINITE_REFUSALS
            logger.info("broker %d: ISR change of %s to %s refused: %s",
                        self.replicas.broker_id, proposal.tp, proposal.new_isr, exc)
        finally:
            # Hand the answer back even when cancelled, so no proposal stays
            # pending forever.
            self._settle(part, proposal, answer, refused)

    def _settle(self, part: Partition, proposal: IsrProposal, answer: dict | None,
                refused: bool) -> None:
        before = list(part.isr)
        if not isinstance(answer, dict) or not isinstance(answer.get("isr"), list):
            answer = None
        if not part.isr_change_done(proposal, answer, refused):
            return
        shrunk = [r for r in before if r not in part.isr]
        grown = [r for r in part.isr if r not in before]
        if shrunk:
            self.replicas.isr_shrinks += 1
            logger.warning("broker %d: ISR of %s shrank from %s to %s (%s)",
                           self.replicas.broker_id, part.tp, before, part.isr, proposal.reason)
        if grown:
            self.replicas.isr_expands += 1
            logger.info("broker %d: ISR of %s grew from %s to %s (%s)",
                        self.replicas.broker_id, part.tp, before, part.isr, proposal.reason)
        self.replicas.notify(part.tp)  # the high watermark or acks=all outcomes may move
