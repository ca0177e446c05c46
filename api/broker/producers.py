"""Producer ids: InitProducerId for idempotent producers.

Any broker answers ``POST /v1/producers/init``. It hands out ids from a
block it took from the active controller (``AllocateProducerIds``, KIP-730:
the block is a metadata record, so no two brokers ever hold the same ids),
fetching the next block before this one runs out. A producer without a
transactional id gets a fresh id at epoch 0 every time, as in Kafka; it
bumps its epoch itself when it must reset its sequences (KIP-360).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from kraft.authorizer import auth_of
from protocol import acl, wire
from protocol.errors import CoordinatorNotAvailableError, KraftError
from protocol.fields import Fields

logger = logging.getLogger(__name__)

#: Fetch the next block when this share of the current one is used.
PREFETCH_AT = 0.9
#: Beyond transaction.max.timeout.ms, which the coordinator checks.
TRANSACTION_TIMEOUT_MS_MAX = 2**31 - 1
TRANSACTIONAL_ID_CHARS_MAX = 255
INT16_MAX = 2**15 - 1
INT64_MAX = 2**63 - 1

Call = Callable[[str, dict], Awaitable[dict]]


class ProducerIdManager:
    """Producer ids from controller blocks; one block request at a time."""

    def __init__(self, call_controller: Call, broker_epoch: Callable[[], int | None],
                 broker_id: int) -> None:
        self._call = call_controller
        self._broker_epoch = broker_epoch
        self.broker_id = broker_id
        self._next = 0
        self._end = 0  # ids in [_next, _end) are ours
        self._block_len = 0
        self._spare: tuple[int, int] | None = None  # the next block, prefetched
        self._fetching: asyncio.Task | None = None
        self._error: Exception | None = None

    async def next_id(self) -> int:
        """A producer id no one else has or will have."""
        while self._next >= self._end:
            if self._spare is not None:
                (self._next, self._end), self._spare = self._spare, None
                self._block_len = self._end - self._next
                continue
            self._start_fetch()
            assert self._fetching is not None
            await asyncio.shield(self._fetching)
            if self._spare is None:
                raise self._error or CoordinatorNotAvailableError(
                    "no producer id block from the controller")
        producer_id = self._next
        self._next += 1
        if self._end - self._next < self._block_len * (1 - PREFETCH_AT):
            self._start_fetch()  # the next producers need not wait for the controller
        return producer_id

    def _start_fetch(self) -> None:
        if self._fetching is None and self._spare is None:
            self._fetching = asyncio.get_running_loop().create_task(self._fetch_block())

    async def _fetch_block(self) -> None:
        """Fetch one block into ``_spare``; a failure is kept in ``_error``
        for the caller waiting on it (a prefetch's is only logged)."""
        try:
            epoch = self._broker_epoch()
            if epoch is None:
                raise CoordinatorNotAvailableError(
                    f"broker {self.broker_id} is not registered with the controller yet; "
                    "retry shortly")
            answer = await self._call("/v1/controller/producer_ids/allocate",
                                      {"broker_id": self.broker_id, "broker_epoch": epoch})
            start, length = answer["producer_id_start"], answer["producer_id_len"]
            self._spare, self._error = (start, start + length), None
            logger.info("broker %d: producer ids [%d, %d) from the controller",
                        self.broker_id, start, start + length)
        except KraftError as exc:
            logger.info("broker %d: cannot take producer ids: %s", self.broker_id, exc)
            self._error = CoordinatorNotAvailableError(
                f"cannot take producer ids from the controller now ({exc}); retry shortly")
        except Exception as exc:  # noqa: BLE001  the waiting request answers with it
            logger.exception("broker %d: cannot take producer ids", self.broker_id)
            self._error = CoordinatorNotAvailableError(
                f"cannot take producer ids from the controller now ({exc!r}); retry shortly")
        finally:
            self._fetching = None


class ProducerApi:
    """``POST /v1/producers/init`` (Kafka's InitProducerId)."""

    def __init__(self, ids: ProducerIdManager, transactions: Any = None) -> None:
        self.ids = ids
        #: The transaction coordinator's shell (``init_producer_id``), which
        #: answers for transactional ids.
        self.transactions = transactions

    def add_routes(self, app: web.Application) -> None:
        app.router.add_post("/v1/producers/init", self.handle_init)

    async def handle_init(self, request: web.Request) -> web.Response:
        body = Fields(await wire.read_body(request), "")
        timeout_ms = body.integer("transaction_timeout_ms", 1, TRANSACTION_TIMEOUT_MS_MAX,
                                  default=60_000)
        auth = auth_of(request)
        if body.values.get("transactional_id") is not None:
            # On the transactional id's coordinator (else NOT_COORDINATOR).
            tid = body.string("transactional_id", TRANSACTIONAL_ID_CHARS_MAX)
            auth.require(acl.WRITE, acl.TRANSACTIONAL_ID, tid)
            answer = await self.transactions.init_producer_id(
                tid, timeout_ms, body.integer("producer_id", -1, INT64_MAX, default=-1),
                body.integer("producer_epoch", -1, INT16_MAX, default=-1),
                body.boolean("two_phase_commit", default=False))
            return wire.respond(request, answer)
        # An idempotent producer: IDEMPOTENT_WRITE on the cluster, or WRITE
        # on some topic (KIP-679).
        if not (auth.allowed(acl.IDEMPOTENT_WRITE, acl.CLUSTER, acl.CLUSTER_NAME)
                or auth.allowed_any(acl.WRITE, acl.TOPIC)):
            raise auth.refusal(acl.IDEMPOTENT_WRITE, acl.CLUSTER, acl.CLUSTER_NAME,
                               "an idempotent producer needs it, or WRITE on some topic")
        producer_id = await self.ids.next_id()
        return wire.respond(request, {"producer_id": producer_id, "producer_epoch": 0})
