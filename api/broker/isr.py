"""ISR changes over HTTP: the transport of the replication core's ``SendAlterPartition``.

``Partition.isr_proposal`` decides what to propose and the core
(``replication.ReplicationCore``) when (after a follower fetch, and every
``replica.lag.time.max.ms / 2``), keeps at most one proposal per partition in
flight, gives up on one after ``ALTER_PARTITION_TIMEOUT_MS`` and applies the
answer. This module only sends the AlterPartition to the active controller
and hands the answer, or the refusal's code, back to the ``ReplicaManager``.
"""

from __future__ import annotations

import asyncio
import logging

from api.broker.replica_manager import ReplicaManager, RequestTasks
from api.broker.replication import SendAlterPartition
from kraft.client import ControllerClient
from protocol.errors import KraftError

logger = logging.getLogger(__name__)


class AlterPartitionSender:
    def __init__(self, replicas: ReplicaManager, client: ControllerClient) -> None:
        self.replicas = replicas
        self.client = client
        self._requests = RequestTasks()

    def send(self, action: SendAlterPartition) -> None:
        self._requests.start(action.request_id, self._send(action),
                             f"alter-partition-{action.request_id}")

    def cancel(self, request_id: int) -> None:
        self._requests.cancel(request_id)

    async def _send(self, action: SendAlterPartition) -> None:
        try:
            answer = await self.client.call("/v1/controller/partitions/alter", action.body,
                                            timeout_ms=action.timeout_ms)
        except asyncio.CancelledError:
            raise
        except KraftError as exc:
            self.replicas.alter_partition_answered(action.request_id, None,
                                                   getattr(exc, "code", None) or "UNKNOWN")
            return
        except Exception:  # a bug must not leave the proposal pending forever
            logger.exception("broker %d: AlterPartition failed", self.replicas.broker_id)
            self.replicas.alter_partition_answered(action.request_id, None, "UNKNOWN")
            return
        self.replicas.alter_partition_answered(action.request_id, answer, None)

    async def stop(self) -> None:
        await self._requests.stop()
