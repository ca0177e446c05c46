"""The producer's sender: the I/O shell around the accumulator.

Runs on one event loop: each round it drains the batches that are ready,
groups them by leader broker, sends one ``POST /v1/produce`` per broker (at
most ``max_in_flight`` per broker, one request at a time per partition),
settles batches from the answers, and refreshes metadata and puts a batch
back after a retriable error.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from api.client._transport import ClusterMetadata, Transport, monotonic_ms
from api.client.accumulator import (RESPONSE_MARGIN_MS, ProducerBatch, RecordAccumulator,
                                    _Completion, _PendingGroup)
from api.client.config import ProducerConfig
from api.client.errors import (METADATA_CODES, ClientClosedError, KraftlogError,
                               RequestTimedOutError, error_from)
from api.client.idempotence import SEQUENCE_CODES
from api.client.transactions import ABORTABLE_ERROR
from protocol.aio import wait_event
from storage.batch import Compression

logger = logging.getLogger(__name__)


class Sender:
    """Runs on one event loop: drains ready batches, sends produce requests,
    settles batches from the answers, refreshes metadata when needed."""

    def __init__(self, config: ProducerConfig, accumulator: RecordAccumulator,
                 metadata: ClusterMetadata, transport: Transport,
                 clock_ms: Callable[[], int] = monotonic_ms) -> None:
        self.config = config
        self.acc = accumulator
        self.metadata = metadata
        self.transport = transport
        self._clock_ms = clock_ms
        self._wakeup = asyncio.Event()
        #: Set whenever memory is released, for async senders waiting for room.
        self.space = asyncio.Event()
        self._in_flight: dict[str, int] = {}
        self._requests: set[asyncio.Task] = set()
        self._refresh_task: asyncio.Task | None = None
        self._last_refresh_ms = -(2**62)
        self._stopping = False
        self._task: asyncio.Task | None = None
        # Partitions already warned about: a partition whose ISR is below its
        # min.insync.replicas makes every acks=all send retry until
        # delivery_timeout_ms, which the user would otherwise not hear of.
        self._warned: set[tuple[str, int]] = set()
        self.idempotence = accumulator.idempotence
        #: A transactional producer's TransactionManager (set by the producer).
        self.txn: Any = None
        self._init_task: asyncio.Task | None = None
        self._last_init_ms = -(2**62)

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run())

    def wake(self) -> None:
        self._wakeup.set()

    async def stop(self, abort: bool) -> None:
        """End the loop: after everything is delivered, or (``abort``) now,
        failing what is left with ``CLIENT_CLOSED``."""
        self._stopping = True
        if abort:
            error = ClientClosedError("the producer closed before these records were delivered")
            for done in self.acc.abort_all():
                self.acc.complete(done, error=error)
            for task in list(self._requests):
                task.cancel()
        self.wake()
        tasks = [t for t in (self._task, self._refresh_task, self._init_task) if t is not None]
        if abort:
            for task in (self._refresh_task, self._init_task):
                if task is not None:
                    task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        if self._requests:
            await asyncio.gather(*self._requests, return_exceptions=True)

    async def _run(self) -> None:
        while True:
            try:
                if not await self._round():
                    return
            except asyncio.CancelledError:
                raise
            except Exception:  # a bug must not leave every send hanging silently
                logger.exception("producer sender round failed")
                await asyncio.sleep(self.config.retry_backoff_ms / 1000)

    async def _round(self) -> bool:
        """One round: expire, drain, send, then wait for something to do.
        False once stopping and everything is settled."""
        self._wakeup.clear()
        now = self._clock_ms()
        self._expire(now)
        if self.idempotence is not None:
            init_wait = self._maybe_init_producer_id(now)
        else:
            init_wait = None
        if self.txn is not None:
            if self.txn.state == ABORTABLE_ERROR:
                self._fail_transaction_batches()
            self.txn.maybe_add(self.acc.partitions_with_data())
        busy = {url for url, n in self._in_flight.items() if n >= self.config.max_in_flight}
        ready, next_ms, missing = self.acc.drain(
            now, self.metadata.leader_url, busy, self.config.max_request_bytes)
        # A partition without a leader: everything is asked for again, but a
        # topic this producer has no metadata for yet is asked for alone.
        new = self.acc.pending_topics()
        for topic in missing:
            if self.metadata.partition_counts.get(topic) is None:
                new.append(topic)
            else:
                self.metadata.request_update()
        refresh_wait = self._maybe_refresh(now, new)
        for wait in (refresh_wait, init_wait):
            if wait is not None:
                next_ms = wait if next_ms is None else min(next_ms, wait)
        for url, batches in ready.items():
            self._in_flight[url] = self._in_flight.get(url, 0) + 1
            task = asyncio.get_running_loop().create_task(self._produce(url, batches))
            self._requests.add(task)
            task.add_done_callback(self._requests.discard)
        if self._stopping and not self.acc.has_incomplete() and not self._requests:
            return False
        if ready:
            return True  # more may be ready (per-request byte cap): drain again at once
        await wait_event(self._wakeup, None if next_ms is None else next_ms / 1000)
        return True

    # -- metadata ------------------------------------------------------------------
    def _maybe_refresh(self, now_ms: int, new: list[str]) -> int | None:
        """Start a refresh if one is due (or records wait for the metadata of
        ``new`` topics) and none runs; ms until the next may start when one
        is due but held back by ``retry_backoff_ms``. Topics new to the
        producer are asked for alone while the rest is current (KIP-526)."""
        due = self.metadata.needs_update(now_ms)
        if not (due or new) or self._refresh_task is not None:
            return None
        if not self.acc.wanted_topics():
            return None
        wait = self._last_refresh_ms + self.config.retry_backoff_ms - now_ms
        if wait > 0:
            return wait
        self._last_refresh_ms = now_ms
        self._refresh_task = asyncio.get_running_loop().create_task(
            self._refresh(None if due else new))
        return None

    async def _refresh(self, only: list[str] | None = None) -> None:
        try:
            if only:
                await self.metadata.refresh(only, only=True)
            else:
                await self.metadata.refresh(self.acc.wanted_topics())
        except KraftlogError as exc:
            logger.debug("metadata refresh failed: %s", exc)
        else:
            for topic in self.acc.pending_topics():
                error = self.metadata.topic_errors.get(topic)
                if error is not None and not error.retriable:
                    group = self.acc.fail_pending(topic)
                    if group is not None:
                        self.acc.complete(group, error=error)
                        self.space.set()
                    continue
                try:
                    group = self.acc.assign_pending(topic)
                except Exception as exc:  # the application's partitioner failed
                    group = self.acc.fail_pending(topic)
                    if group is not None:
                        self.acc.complete(group, error=KraftlogError(
                            "INVALID_PARTITIONS", f"the partitioner failed: {exc!r}",
                            retriable=False))
                        self.space.set()
                    continue
                if group is not None:
                    self.acc.finish_forwarded(group)
        finally:
            self._refresh_task = None
            self.wake()

    def _fail_transaction_batches(self) -> None:
        """The open transaction can only abort: what is still queued fails
        now rather than at its delivery timeout."""
        queued = self.acc.abort_all()
        if not queued:
            return
        error = KraftlogError("TRANSACTION_ABORTABLE",
                              f"an earlier record of the transaction failed ({self.txn.error}); "
                              "the transaction must be aborted", retriable=False)
        for done in queued:
            if self.idempotence is not None and isinstance(done, ProducerBatch):
                self.idempotence.given_up((done.topic, done.partition), done.producer_epoch,
                                          done.base_sequence >= 0)
            self.acc.complete(done, error=error)
        self.space.set()

    # -- idempotence ---------------------------------------------------------------------
    def _maybe_init_producer_id(self, now_ms: int) -> int | None:
        """Bump the epoch, or take a producer id from the cluster, when
        the idempotence state needs it and its requests are all back; ms
        until the next try when backing off."""
        idem = self.idempotence
        assert idem is not None
        if idem.maybe_bump():
            logger.info("producer %d: epoch bumped to %d; sequences restart at 0",
                        idem.producer_id, idem.epoch)
            return None
        if not idem.needs_new_id or self._init_task is not None or self._requests:
            return None
        if not self.acc.has_incomplete():
            return None  # nothing to send: take an id when there is
        wait = self._last_init_ms + self.config.retry_backoff_ms - now_ms
        if wait > 0:
            return wait
        self._last_init_ms = now_ms
        self._init_task = asyncio.get_running_loop().create_task(self._init_producer_id())
        return None

    async def _init_producer_id(self) -> None:
        idem = self.idempotence
        assert idem is not None
        try:
            answer = await self.metadata.request_any(
                "/v1/producers/init",
                {"transactional_id": None, "transaction_timeout_ms": 60_000})
            idem.set_id(answer["producer_id"], answer["producer_epoch"])
            logger.debug("idempotent producer id %d epoch %d", idem.producer_id, idem.epoch)
        except KraftlogError as exc:
            logger.info("cannot get a producer id yet (retrying): %s", exc)
        except Exception:  # a malformed answer: try again after the back-off
            logger.exception("cannot get a producer id (retrying)")
        finally:
            self._init_task = None
            self.wake()

    # -- expiry ----------------------------------------------------------------------
    def _expire(self, now_ms: int) -> None:
        expired = self.acc.expired(now_ms)
        for done in expired:
            error = self._expiry_error(done)
            if self.idempotence is not None and isinstance(done, ProducerBatch):
                self.idempotence.given_up((done.topic, done.partition), done.producer_epoch,
                                          done.base_sequence >= 0)
            if self.txn is not None:
                self.txn.batch_failed(error)
            self.acc.complete(done, error=error)
        if expired:
            self.space.set()

    def _expiry_error(self, done: _Completion) -> KraftlogError:
        timeout_ms = self.config.delivery_timeout_ms
        if isinstance(done, _PendingGroup):
            cause = self.metadata.topic_errors.get(done.topic)
            if cause is None or cause.code == "UNKNOWN_TOPIC_OR_PARTITION":
                return error_from({
                    "code": "UNKNOWN_TOPIC_OR_PARTITION",
                    "message": f"topic {done.topic!r} was not in the metadata within "
                               f"delivery_timeout_ms ({timeout_ms} ms); create it first"})
            where = f"topic {done.topic!r}"
        else:
            cause = done.last_error
            where = f"{done.topic}-{done.partition}"
            count = self.metadata.partition_counts.get(done.topic)
            if count is not None and done.partition >= count:
                return error_from({
                    "code": "UNKNOWN_TOPIC_OR_PARTITION",
                    "message": f"topic {done.topic!r} has {count} partitions, no partition "
                               f"{done.partition} (waited delivery_timeout_ms, {timeout_ms} ms)"})
            if cause is None and self.metadata.leader_url((done.topic, done.partition)) is None:
                cause = self.metadata.topic_errors.get(done.topic)
        if cause is None:
            return RequestTimedOutError(
                f"records for {where} expired: {timeout_ms} ms (delivery_timeout_ms) passed "
                "since the batch was created")
        return error_from({"code": cause.code, "message": (
            f"records for {where} expired after delivery_timeout_ms ({timeout_ms} ms); "
            f"last error: {cause.message}"), **cause.details})

    # -- one request -------------------------------------------------------------------
    async def _produce(self, url: str, batches: list[ProducerBatch]) -> None:
        config = self.config
        groups: dict[tuple[str, int], list[ProducerBatch]] = {}
        settled = False
        idem = self.idempotence
        if idem is not None:
            idem.request_started()
        try:
            for batch in batches:
                if batch.payload is None:
                    await self._build(batch)
                batch.attempts += 1
                groups.setdefault((batch.topic, batch.partition), []).append(batch)
            body = {"acks": config.acks, "timeout_ms": config.request_timeout_ms,
                    "transactional_id": config.transactional_id,
                    "partitions": [
                        {"topic": topic, "partition": partition,
                         "records": bs[0].payload if len(bs) == 1
                         else b"".join(b.payload for b in bs)}
                        for (topic, partition), bs in groups.items()]}
            if config.acks == 0:
                # Nobody waits for the broker's answer: settle now (offset -1).
                for batch in batches:
                    self.acc.complete(batch)
                settled = True
            try:
                answer = await self.transport.request(
                    url, "/v1/produce", body,
                    timeout_ms=config.request_timeout_ms + RESPONSE_MARGIN_MS)
            except KraftlogError as exc:
                if exc.code == "BROKER_NOT_AVAILABLE":
                    self.metadata.forget_broker_url(url)
                if not settled:
                    for group in groups.values():
                        self._failed(group, exc)
                settled = True
                return
            if not settled:
                self._settle(url, groups, answer)
            settled = True
        except asyncio.CancelledError:
            if not settled:
                error = ClientClosedError("the producer closed while the request was in flight")
                for batch in batches:
                    self.acc.complete(batch, error=error)
            raise
        except Exception as exc:  # a bug or a malformed answer: fail, never hang
            logger.exception("produce request to %s failed", url)
            if not settled:
                error = KraftlogError("UNKNOWN_SERVER_ERROR", f"produce failed: {exc!r}",
                                      retriable=False)
                for batch in batches:
                    self.acc.complete(batch, error=error)
        finally:
            if idem is not None:
                idem.request_ended()
                for batch in batches:
                    idem.returned((batch.topic, batch.partition))
            self._in_flight[url] -= 1
            self.acc.sent(batches)
            # Before waking: the loop must not see this task still in flight.
            self._requests.discard(asyncio.current_task())
            self.space.set()
            self.wake()

    async def _build(self, batch: ProducerBatch) -> None:
        """Turn a drained batch into its bytes (kept for retries) and drop the
        builder's copy. Compression runs in a worker thread: zlib releases
        the GIL, and a megabyte takes long enough to stall the loop."""
        builder = batch.builder
        batch.record_count = builder.record_count
        if builder.compression == Compression.NONE:
            batch.payload = builder.build()
        else:
            batch.payload = await asyncio.get_running_loop().run_in_executor(
                None, builder.build)
        batch.builder = None

    def _settle(self, url: str, groups: dict[tuple[str, int], list[ProducerBatch]],
                answer: dict) -> None:
        for entry in answer.get("partitions") or ():
            batches = groups.pop((entry.get("topic"), entry.get("partition")), None)
            if batches is None:
                continue
            error = error_from(entry.get("error"))
            if error is not None:
                self._failed(batches, error)
                continue
            offset = entry["base_offset"]
            append_time_ms = entry.get("log_append_time_ms", -1)
            if append_time_ms is None:
                append_time_ms = -1
            if self.idempotence is not None:
                for batch in batches:
                    self.idempotence.acked((batch.topic, batch.partition), batch.producer_epoch,
                                           batch.base_sequence, batch.record_count)
            for batch in batches:
                self.acc.complete(batch, base_offset=offset, log_append_time_ms=append_time_ms)
                offset += batch.record_count
        for (topic, partition), batches in groups.items():
            self._failed(batches, KraftlogError(
                "UNKNOWN_SERVER_ERROR",
                f"{url} answered the produce request without partition {topic}-{partition}",
                retriable=True))

    def _failed(self, batches: list[ProducerBatch], error: KraftlogError) -> None:
        """Retry ``batches`` of one partition after a retriable error while
        retries and delivery time remain; else fail them."""
        now = self._clock_ms()
        head = batches[0]
        if error.code == "NOT_ENOUGH_REPLICAS" and (head.topic, head.partition) not in self._warned:
            self._warned.add((head.topic, head.partition))
            logger.warning("%s-%d: acks=all sends cannot succeed now and are retried until "
                           "delivery_timeout_ms: %s", head.topic, head.partition, error)
        if error.code in METADATA_CODES:
            self.metadata.learn_leader(head.topic, head.partition, error)
        elif error.retriable:
            self.metadata.request_update()
        retry_at = now + self.config.retry_backoff_ms
        retriable = error.retriable
        idem = self.idempotence
        if idem is not None:
            unresolvable = False
            for batch in batches:
                unresolvable |= idem.failed((batch.topic, batch.partition),
                                            batch.producer_epoch, batch.base_sequence,
                                            error.code)
            if error.code in SEQUENCE_CODES and (idem.allowed is None or not unresolvable):
                # Retried in order, after an epoch bump if need be (see
                # idempotence.py); a real gap in a transaction fails the
                # batch instead: the transaction must abort.
                retriable = True
            if error.code == "OUT_OF_ORDER_SEQUENCE_NUMBER" and not unresolvable:
                # Overtaken by a later request on another connection: it goes
                # again as soon as the batches ahead of it are answered
                # (``may_send`` holds a retry until then), not after a back-off.
                retry_at = now
        if (retriable and head.attempts <= self.config.retries
                and all(retry_at < b.created_ms + self.config.delivery_timeout_ms
                        for b in batches)):
            for batch in batches:
                batch.last_error = error
            self.acc.requeue(batches, retry_at)
            return
        for batch in batches:
            if idem is not None:
                idem.given_up((batch.topic, batch.partition), batch.producer_epoch,
                              batch.base_sequence >= 0)
            if self.txn is not None:
                self.txn.batch_failed(error)
            self.acc.complete(batch, error=error)
