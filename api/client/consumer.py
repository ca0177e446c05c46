"""The consumer: assigned partitions, prefetched batches, records on poll.

The application ``assign``s partitions (and may ``seek``), or ``subscribe``s
with a ``group_id`` and lets its group member (``group.py``) take partitions
from the group coordinator; each partition then has a *position*, the offset
of the next record ``poll`` returns.

How records travel::

    Fetcher (fetcher.py: per leader    FetchBuffer (bounded by      poll()
    broker, one POST /v1/fetch in ──>  max_buffered_bytes, raw  ──> decodes a
    flight)                            batches, decoded lazily)     batch at a time

Errors: ``NOT_LEADER_OR_FOLLOWER`` and other metadata errors refresh the
metadata and fetching carries on with the new leader. ``OFFSET_OUT_OF_RANGE``
applies ``auto_offset_reset``: "earliest" moves to the log start offset,
"latest" to the high watermark, "none" makes ``poll`` raise
``OffsetOutOfRangeError`` until the application seeks. A partition without a
position is reset the same way (with "none": ``NoOffsetForPartitionError``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from api.client._sync import LoopThread
from api.client._transport import DEFAULT_BOOTSTRAP, ClusterMetadata, Transport, monotonic_ms
from api.client._types import (ConsumerGroupMetadata, ConsumerRecord, OffsetAndTimestamp,
                               TopicMetadata, TopicPartition, as_topic_partition)
from api.client.errors import (METADATA_CODES, KraftlogError, NoOffsetForPartitionError,
                               RequestTimedOutError, UnknownTopicOrPartitionError, error_from)
from api.client.group import GroupMember

logger = logging.getLogger(__name__)

from api.client.config import ConsumerConfig
from api.client.fetcher import (_RESET_TIMESTAMPS, EARLIEST, LATEST, FetchBuffer, Fetcher,
                                FetchedBatch, PartitionState)
from protocol.aio import wait_event


def first_offsets(records: Iterable[ConsumerRecord]) -> dict[TopicPartition, int]:
    """Per partition, the offset of the first of ``records`` (records taken
    from a poll but not yet handed to the application: where it really is)."""
    firsts: dict[TopicPartition, int] = {}
    for record in records:
        firsts.setdefault(TopicPartition(record.topic, record.partition), record.offset)
    return firsts


# ---------------------------------------------------------------------------
# The asyncio consumer.
# ---------------------------------------------------------------------------
class AsyncConsumer:
    """An asyncio consumer of assigned partitions.

    ::

        async with AsyncConsumer(bootstrap=url, auto_offset_reset="earliest") as consumer:
            consumer.assign([TopicPartition("orders", 0)])
            async for record in consumer:
                print(record.offset, record.value)

    Settings (Kafka's names, snake_case): ``bootstrap``, ``auto_offset_reset``
    ("earliest" | "latest" | "none"), ``fetch_min_bytes``,
    ``fetch_max_wait_ms`` (the long poll), ``fetch_max_bytes`` (per fetch),
    ``max_partition_fetch_bytes``, ``max_poll_records``,
    ``max_buffered_bytes`` (prefetched data; may be passed by one batch),
    ``request_timeout_ms`` (per request, and the bound on ``position`` and the
    offset lookups), ``retry_backoff_ms``, ``metadata_max_age_ms``,
    ``check_crcs``, ``include_headers``, ``consumer_timeout_ms`` (iteration
    ends after this long without records; None: never); TLS:
    ``security_protocol`` ("PLAINTEXT" or "SSL"), ``ssl_cafile``,
    ``ssl_certfile``, ``ssl_keyfile``, ``ssl_check_hostname``; ``client_id``
    (Kafka's client.id, sent with every request; default ``consumer-<n>``).
    """

    def __init__(self, bootstrap: str | Iterable[str] = DEFAULT_BOOTSTRAP, **settings: Any
                 ) -> None:
        self.config = config = ConsumerConfig(bootstrap=bootstrap, **settings)
        self._transport = Transport(request_timeout_ms=config.request_timeout_ms,
                                    security=config.security, client_id=config.client_id)
        self._metadata = ClusterMetadata(
            self._transport, config.bootstrap, metadata_max_age_ms=config.metadata_max_age_ms,
            request_timeout_ms=config.request_timeout_ms)
        self._buffer = FetchBuffer(check_crcs=config.check_crcs,
                                   include_headers=config.include_headers)
        self._states: dict[TopicPartition, PartitionState] = {}
        self._wakeup = asyncio.Event()
        self._data = asyncio.Event()
        self._fetch = Fetcher(config, self._metadata, self._transport, self._buffer,
                              self._states, self._wakeup, self._data, self._reset_positions,
                              self._refresh_metadata)
        self._fetcher: asyncio.Task | None = None
        self._iter_records: deque[ConsumerRecord] = deque()
        self._closed = False
        self._group: GroupMember | None = None

    # -- lifecycle ----------------------------------------------------------------
    async def start(self) -> None:
        """Start the background fetcher (``poll`` does it too)."""
        self._check_open()
        if self._fetcher is None:
            self._fetcher = asyncio.get_running_loop().create_task(self._fetch.run())

    async def __aenter__(self) -> "AsyncConsumer":
        await self.start()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    async def close(self) -> None:
        if self._closed:
            return
        if self._group is not None:
            await self._group.close()  # commits (auto-commit) and leaves the group
        self._closed = self._fetch.closed = True
        tasks = [t for t in (self._fetcher, *self._fetch.tasks()) if t is not None]
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        self._buffer.discard()
        await self._fetch.close_sessions()
        await self._transport.close()

    def _check_open(self) -> None:
        if self._closed:
            raise KraftlogError("CLIENT_CLOSED", "the consumer is closed")

    # -- assignment and positions --------------------------------------------------------
    def assign(self, partitions: Iterable[TopicPartition | tuple[str, int]]) -> None:
        """Consume exactly ``partitions`` from now on. Partitions kept from
        the previous assignment keep their positions; new ones start without
        one (resolved by ``auto_offset_reset`` unless you ``seek``)."""
        self._check_open()
        if self._group is not None:
            raise ValueError("this consumer subscribed to topics: its group assigns its "
                             "partitions (use assign() on a consumer without subscribe())")
        self._assign(partitions)

    # -- groups ---------------------------------------------------------------------------
    def subscribe(self, topics: Iterable[str] | None = None, pattern: str | None = None, *,
                  on_partitions_revoked: Callable | None = None,
                  on_partitions_assigned: Callable | None = None,
                  on_partitions_lost: Callable | None = None) -> None:
        """Join ``group_id`` and consume what the group assigns: the
        partitions of ``topics``, or of every topic whose whole name matches
        ``pattern`` (a regular expression; new matching topics are picked
        up). The listeners get sets of partitions (may be coroutine
        functions); they run inside ``poll``. ``on_partitions_lost`` (default:
        ``on_partitions_revoked``) is called without a commit when the
        member was removed from the group."""
        self._check_open()
        config = self.config
        if config.group_id is None:
            raise ValueError("subscribe() needs a group_id: Consumer(..., group_id='my-app')")
        if (topics is None) == (pattern is None):
            raise ValueError("give exactly one of topics and pattern")
        if topics is not None:
            topics = [topics] if isinstance(topics, str) else list(topics)
            if not topics or not all(isinstance(t, str) and t for t in topics):
                raise ValueError(f"topics must be non-empty topic names, not {topics!r}")
        if self._group is None:
            self._group = GroupMember(
                self, config.group_id, instance_id=config.group_instance_id,
                session_timeout_ms=config.session_timeout_ms,
                rebalance_timeout_ms=config.rebalance_timeout_ms,
                auto_commit=config.enable_auto_commit,
                auto_commit_interval_ms=config.auto_commit_interval_ms,
                assignor=config.group_remote_assignor, retry_backoff_ms=config.retry_backoff_ms)
        self._group.subscribe(topics, pattern, on_partitions_revoked, on_partitions_assigned,
                              on_partitions_lost)

    def _member(self) -> GroupMember:
        if self._group is None:
            raise ValueError("commit and committed need a group member: set group_id and "
                             "subscribe() first")
        return self._group

    async def commit(self, offsets: Mapping[Any, int] | None = None) -> None:
        """Commit ``offsets`` (tp -> next offset to read), or the positions of
        everything ``poll`` returned so far. Raises ``CommitFailedError`` when
        the group refuses (the member's partitions moved)."""
        self._check_open()
        group = self._member()
        if offsets is None:
            positions = self._consumed_positions(group.owned)
        else:
            positions = {as_topic_partition(tp): offset for tp, offset in offsets.items()}
        await group.commit(positions)

    async def committed(self, tps: Iterable[Any]) -> dict[TopicPartition, int | None]:
        """The group's committed offsets (None where nothing is committed)."""
        self._check_open()
        wanted = [as_topic_partition(tp) for tp in tps]
        found = await self._member().fetch_committed(wanted)
        return {tp: found.get(tp) for tp in wanted}

    def _assign_for_group(self, partitions: Iterable[TopicPartition],
                          committed: Mapping[TopicPartition, int] | None = None) -> None:
        """The group changed this member's partitions: new ones start at their
        committed offset, or by ``auto_offset_reset``."""
        self._assign(partitions)
        for tp, offset in (committed or {}).items():
            state = self._states.get(tp)
            if state is not None and offset >= 0:
                state.seek(offset)
                self._moved([state])

    def _consumed_positions(self, tps: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        """Where the application is in each partition: the offset after the
        last record ``poll`` handed it."""
        held = first_offsets(self._iter_records)  # taken for iteration, not handed out
        out = {}
        for tp in tps:
            state = self._states.get(tp)
            if tp in held:
                out[tp] = held[tp]
            elif state is not None and state.position is not None:
                out[tp] = state.position
        return out

    def _assign(self, partitions: Iterable[TopicPartition | tuple[str, int]]) -> None:
        wanted = [as_topic_partition(tp) for tp in partitions]
        states = {}
        for tp in wanted:
            states[tp] = self._states.get(tp) or PartitionState(tp, self.config.auto_offset_reset)
        for tp in self._states.keys() - states.keys():
            self._buffer.discard(tp)
        self._iter_records = deque(r for r in self._iter_records
                                   if TopicPartition(r.topic, r.partition) in states)
        # In place: the fetcher holds this same dict.
        self._states.clear()
        self._states.update(states)
        self._fetch.assignment_changed()
        self._metadata.topics_wanted = {tp.topic for tp in states}
        self._metadata.request_update()
        self._wakeup.set()

    def group_metadata(self) -> ConsumerGroupMetadata:
        """The consumer's group, for ``Producer.send_offsets_to_transaction``."""
        if self.config.group_id is None:
            raise ValueError("group_metadata() needs a consumer with a group_id")
        return ConsumerGroupMetadata(self.config.group_id)

    def assignment(self) -> set[TopicPartition]:
        return set(self._states)

    def _state(self, tp: Any) -> PartitionState:
        tp = as_topic_partition(tp)
        state = self._states.get(tp)
        if state is None:
            raise ValueError(f"{tp.topic}-{tp.partition} is not assigned to this consumer")
        return state

    def seek(self, tp: TopicPartition | tuple[str, int], offset: int) -> None:
        """Make ``offset`` the next offset ``poll`` returns for ``tp``."""
        if not isinstance(offset, int) or offset < 0:
            raise ValueError(f"offset must be an int >= 0, not {offset!r}")
        state = self._state(tp)
        state.seek(offset)
        self._moved([state])

    def _seek_reset(self, tps: Iterable[Any] | None, reset: str) -> None:
        states = list(self._states.values()) if tps is None else [self._state(tp) for tp in tps]
        for state in states:
            state.seek(None, reset)
        self._moved(states)

    def _moved(self, states: list[PartitionState]) -> None:
        """Drop what was fetched, or taken for iteration, before a seek."""
        moved = {state.tp for state in states}
        for tp in moved:
            self._buffer.discard(tp)
        self._iter_records = deque(r for r in self._iter_records
                                   if TopicPartition(r.topic, r.partition) not in moved)
        self._fetch.abandon(moved)
        self._wakeup.set()

    def seek_to_beginning(self, tps: Iterable[Any] | None = None) -> None:
        """Move to the log start offset (of every assigned partition for
        None); resolved lazily, by the fetcher or ``position``."""
        self._seek_reset(tps, "earliest")

    def seek_to_end(self, tps: Iterable[Any] | None = None) -> None:
        """Move to the high watermark: only records produced from now on."""
        self._seek_reset(tps, "latest")

    async def position(self, tp: TopicPartition | tuple[str, int]) -> int:
        """The next offset ``poll`` returns for ``tp``, looked up now when the
        partition has none (``NoOffsetForPartitionError`` with "none")."""
        self._check_open()
        state = self._state(tp)
        for record in self._iter_records:  # taken for iteration, not yet handed out
            if (record.topic, record.partition) == state.tp:
                return record.offset
        deadline_ms = monotonic_ms() + self.config.request_timeout_ms
        while state.position is None:
            if state.error is not None:
                raise state.error
            await self._reset_positions([state], deadline_ms)
        return state.position

    async def _reset_positions(self, states: list[PartitionState],
                               deadline_ms: int | None) -> None:
        """Give ``states`` (without a position) one by their reset strategy.
        With a deadline, retriable failures are retried until it; without,
        one attempt is made and failures wait for the next round."""
        query: dict[TopicPartition, int] = {}
        generations = {}
        for state in states:
            if state.reset == "none":
                state.error = NoOffsetForPartitionError(
                    f"{state.tp.topic}-{state.tp.partition} has no position and "
                    "auto_offset_reset is 'none': seek() first",
                    partitions={state.tp: None})
                self._data.set()
                continue
            if deadline_ms is None and self._metadata.leader_url(state.tp) is None:
                # No leader known yet: the refresh this asks for wakes the
                # fetch loop, which tries again then (no backoff needed).
                self._metadata.request_update()
                continue
            query[state.tp] = _RESET_TIMESTAMPS[state.reset]
            generations[state.tp] = state.generation
        if not query:
            return
        if deadline_ms is None:
            found, errors = await self._list_offsets_once(query)
        else:
            found, errors = await self._list_offsets(query, deadline_ms), {}
        for tp, (offset, _timestamp) in found.items():
            state = self._states.get(tp)
            if state is not None and state.generation == generations[tp] and offset >= 0:
                state.seek(offset)
        now = monotonic_ms()
        for tp, error in errors.items():
            state = self._states.get(tp)
            if state is None or state.generation != generations[tp]:
                continue
            if error.retriable:
                state.retry_at_ms = now + self.config.retry_backoff_ms
            else:
                state.error = error
                self._data.set()

    # -- offsets lookups -------------------------------------------------------------------
    async def _list_offsets_once(self, query: Mapping[TopicPartition, int]
                                 ) -> tuple[dict[TopicPartition, tuple[int, int]],
                                            dict[TopicPartition, KraftlogError]]:
        """One ``/v1/offsets`` round to each leader: (answers, errors)."""
        by_url: dict[str, list[TopicPartition]] = {}
        errors: dict[TopicPartition, KraftlogError] = {}
        for tp in query:
            url = self._metadata.leader_url(tp)
            if url is None:
                errors[tp] = self._metadata.topic_errors.get(tp.topic) or KraftlogError(
                    "LEADER_NOT_AVAILABLE", f"no known leader for {tp.topic}-{tp.partition}")
                self._metadata.request_update()
            else:
                by_url.setdefault(url, []).append(tp)

        async def ask(url: str, tps: list[TopicPartition]) -> Any:
            try:
                return await self._transport.request(url, "/v1/offsets", {
                    "isolation_level": self.config.isolation_level, "partitions": [
                        {"topic": tp.topic, "partition": tp.partition, "timestamp": query[tp]}
                        for tp in tps]}, pieces=False)
            except KraftlogError as exc:
                return exc

        answers = await asyncio.gather(*(ask(url, tps) for url, tps in by_url.items()))
        found: dict[TopicPartition, tuple[int, int]] = {}
        for (url, tps), answer in zip(by_url.items(), answers):
            if isinstance(answer, KraftlogError):
                if answer.code == "BROKER_NOT_AVAILABLE":
                    self._metadata.forget_broker_url(url)
                for tp in tps:
                    errors[tp] = answer
                continue
            asked = set(tps)
            for entry in answer.get("partitions") or ():
                tp = TopicPartition(entry.get("topic"), entry.get("partition"))
                if tp not in asked:
                    continue
                asked.discard(tp)
                error = error_from(entry.get("error"))
                if error is not None:
                    if error.code in METADATA_CODES:
                        self._metadata.learn_leader(tp.topic, tp.partition, error)
                    errors[tp] = error
                else:
                    found[tp] = (entry["offset"], entry.get("timestamp", -1))
            for tp in asked:
                errors[tp] = KraftlogError("UNKNOWN_SERVER_ERROR",
                                           f"{url} did not answer for {tp}", retriable=True)
        return found, errors

    async def _list_offsets(self, query: Mapping[TopicPartition, int], deadline_ms: int
                            ) -> dict[TopicPartition, tuple[int, int]]:
        """Offsets for ``query`` (tp -> timestamp or EARLIEST/LATEST),
        retrying retriable errors until ``deadline_ms``."""
        remaining = dict(query)
        found: dict[TopicPartition, tuple[int, int]] = {}
        topics = {tp.topic for tp in remaining}
        if any(self._metadata.leader_url(tp) is None for tp in remaining):
            await self._refresh_metadata(topics)
        while True:
            answers, errors = await self._list_offsets_once(remaining)
            found.update(answers)
            for tp in answers:
                remaining.pop(tp)
            if not remaining:
                return found
            fatal = [e for e in errors.values() if not e.retriable]
            if fatal:
                raise fatal[0]
            wait_ms = min(self.config.retry_backoff_ms, deadline_ms - monotonic_ms())
            if wait_ms <= 0:
                error = next(iter(errors.values()), None)
                raise RequestTimedOutError(
                    f"offsets of {sorted(remaining)} not found within request_timeout_ms "
                    f"({self.config.request_timeout_ms} ms); last error: {error}",
                    **({"last_code": error.code} if error else {}))
            await asyncio.sleep(wait_ms / 1000)
            await self._refresh_metadata(topics)

    async def _refresh_metadata(self, topics: Iterable[str] | None = None) -> None:
        try:
            await self._metadata.refresh(topics)
        except KraftlogError as exc:
            if not exc.retriable:
                raise
            logger.debug("metadata refresh failed: %s", exc)

    async def _offsets(self, tps: Iterable[Any], timestamp: int) -> dict[TopicPartition, int]:
        self._check_open()
        query = {as_topic_partition(tp): timestamp for tp in tps}
        found = await self._list_offsets(query, monotonic_ms() + self.config.request_timeout_ms)
        return {tp: offset for tp, (offset, _ts) in found.items()}

    async def beginning_offsets(self, tps: Iterable[Any]) -> dict[TopicPartition, int]:
        """The log start offset of each partition (assigned or not)."""
        return await self._offsets(tps, EARLIEST)

    async def end_offsets(self, tps: Iterable[Any]) -> dict[TopicPartition, int]:
        """The high watermark of each partition: the offset the next
        committed record gets."""
        return await self._offsets(tps, LATEST)

    async def offsets_for_times(self, timestamps: Mapping[Any, int]
                                ) -> dict[TopicPartition, OffsetAndTimestamp | None]:
        """Per partition, the first record whose timestamp is at or after the
        given ms, or None when there is none (Kafka's answer)."""
        self._check_open()
        query = {}
        for tp, ts in timestamps.items():
            if not isinstance(ts, int) or ts < 0:
                raise ValueError(f"timestamp for {tp} must be an int >= 0 (ms), not {ts!r}")
            query[as_topic_partition(tp)] = ts
        found = await self._list_offsets(query, monotonic_ms() + self.config.request_timeout_ms)
        return {tp: (OffsetAndTimestamp(offset, ts) if offset >= 0 else None)
                for tp, (offset, ts) in found.items()}

    async def partitions_for_topic(self, topic: str) -> set[int]:
        """The partitions of ``topic``; raises ``UnknownTopicOrPartitionError``
        for a topic that does not exist."""
        self._check_open()
        await self._metadata.refresh([topic], only=True)
        partitions = self._metadata.partitions(topic)
        if partitions is None:
            raise self._metadata.topic_errors.get(topic) or UnknownTopicOrPartitionError(
                f"topic {topic!r} does not exist")
        return partitions

    async def topics(self) -> set[str]:
        """The names of every topic in the cluster."""
        self._check_open()
        answer = await self._metadata.request_any("/v1/metadata", {"topics": None})
        return {t["name"] for t in answer.get("topics") or () if t.get("error") is None}

    async def list_topics(self) -> dict[str, TopicMetadata]:
        """Every topic in the cluster with its id and partition numbers, in
        one metadata request (``topics`` and ``partitions_for_topic`` at
        once)."""
        self._check_open()
        answer = await self._metadata.request_any("/v1/metadata", {"topics": None})
        return {t["name"]: TopicMetadata(t["name"], t.get("topic_id"), frozenset(
                    p["partition"] for p in t.get("partitions") or ()))
                for t in answer.get("topics") or () if t.get("error") is None}

    # -- polling ----------------------------------------------------------------------------
    async def poll(self, timeout_ms: int = 0, max_records: int | None = None
                   ) -> list[ConsumerRecord]:
        """Records from the assigned partitions, at most ``max_records``
        (default ``max_poll_records``), waiting up to ``timeout_ms`` for the
        first. Raises a partition's error (e.g. ``OffsetOutOfRangeError``
        with ``auto_offset_reset="none"``) until the application seeks."""
        return await self._poll(self._buffer.drain, timeout_ms, max_records)

    async def poll_batches(self, timeout_ms: int = 0, max_records: int | None = None
                           ) -> list[FetchedBatch]:
        """``poll`` for readers that decode whole batches themselves (the
        Spark source turns them into Arrow columns): checked, undecoded
        batches (``FetchedBatch``) holding about ``max_records`` records,
        positions advanced past them. Each batch's records below its
        ``position`` were returned before and are to be skipped."""
        return await self._poll(self._buffer.drain_batches, timeout_ms, max_records)

    async def _poll(self, drain: Callable[[int], list], timeout_ms: int,
                    max_records: int | None) -> list:
        self._check_open()
        if self._fetcher is None:
            await self.start()
        max_records = max_records or self.config.max_poll_records
        deadline = time.monotonic() + timeout_ms / 1000
        if self._group is not None:
            await self._group.reconcile()
        while True:
            self._raise_partition_error()
            if self._group is not None and self._group.fatal is not None:
                raise self._group.fatal
            self._data.clear()
            records = drain(max_records)
            if records:
                self._wakeup.set()  # buffer space freed: the fetcher may go on
                return records
            self._raise_partition_error()
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return []
            self._wakeup.set()
            if not await wait_event(self._data, remaining):
                return []

    def wake_poll(self) -> None:
        """Make a waiting ``poll`` look again (its group failed, say)."""
        self._data.set()

    def _raise_partition_error(self) -> None:
        for state in self._states.values():
            if state.error is not None:
                raise state.error

    def __aiter__(self) -> "AsyncConsumer":
        return self

    async def __anext__(self) -> ConsumerRecord:
        pending = self._iter_records
        while not pending:
            timeout_ms = self.config.consumer_timeout_ms
            pending = deque(await self.poll(1000 if timeout_ms is None else timeout_ms))
            self._iter_records = pending
            if not pending and timeout_ms is not None:
                raise StopAsyncIteration
        return pending.popleft()


class Consumer:
    """The synchronous consumer: the same settings and methods as
    ``AsyncConsumer``, blocking; it runs an ``AsyncConsumer`` on a daemon
    thread's event loop.

    ::

        with Consumer(bootstrap=url, auto_offset_reset="earliest") as consumer:
            consumer.assign([("orders", 0), ("orders", 1)])
            for record in consumer:          # stops after consumer_timeout_ms idle
                print(record.partition, record.offset, record.value)
    """

    def __init__(self, bootstrap: str | Iterable[str] = DEFAULT_BOOTSTRAP, **settings: Any
                 ) -> None:
        self._thread = LoopThread("kraftlog-consumer")
        try:
            self._consumer: AsyncConsumer = self._thread.run(self._create(bootstrap, settings))
        except BaseException:
            self._thread.stop()
            raise
        self.config = self._consumer.config
        self._pending: deque[ConsumerRecord] = deque()
        # The group generation the held records came from (see _drop_pending_if_lost).
        self._pending_generation = 0
        # commit_async tasks not yet answered (touched on the loop thread only).
        self._async_commits: set[asyncio.Future] = set()
        self._closed = False

    @staticmethod
    async def _create(bootstrap: Any, settings: dict) -> AsyncConsumer:
        consumer = AsyncConsumer(bootstrap, **settings)
        await consumer.start()
        return consumer

    def __enter__(self) -> "Consumer":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _call(self, fn: Callable, *args: Any) -> Any:
        return self._thread.call(fn, *args)

    def assign(self, partitions: Iterable[TopicPartition | tuple[str, int]]) -> None:
        partitions = [as_topic_partition(tp) for tp in partitions]
        self._call(self._consumer.assign, partitions)
        kept = set(partitions)
        self._pending = deque(r for r in self._pending
                              if TopicPartition(r.topic, r.partition) in kept)

    def group_metadata(self) -> ConsumerGroupMetadata:
        """The consumer's group, for ``Producer.send_offsets_to_transaction``."""
        if self.config.group_id is None:
            raise ValueError("group_metadata() needs a consumer with a group_id")
        return ConsumerGroupMetadata(self.config.group_id)

    def assignment(self) -> set[TopicPartition]:
        return self._call(self._consumer.assignment)

    def subscribe(self, topics: Iterable[str] | None = None, pattern: str | None = None,
                  **listeners: Callable | None) -> None:
        """As ``AsyncConsumer.subscribe``. The listeners run on the consumer's
        own thread while ``poll`` waits for them: they must not call this
        consumer's blocking methods (with ``enable_auto_commit`` the consumer
        commits revoked partitions itself)."""
        topics = [topics] if isinstance(topics, str) else (
            None if topics is None else list(topics))
        self._call(lambda: self._consumer.subscribe(topics, pattern, **listeners))

    def commit(self, offsets: Mapping[Any, int] | None = None) -> None:
        """As ``AsyncConsumer.commit``; records this consumer still holds for
        iteration count as not yet consumed."""
        if offsets is None and self._pending:
            offsets = self._thread.run(self._positions_for_commit())
        self._thread.run(self._consumer.commit(offsets))

    def commit_async(self, offsets: Mapping[Any, int] | None = None,
                     callback: Callable[[dict, Exception | None], Any] | None = None) -> None:
        """Commit without waiting (Kafka's commitAsync): ``callback(offsets,
        error)`` runs on the consumer's thread once the coordinator answered.
        A failed async commit is not retried: a later commit covers it."""
        if offsets is None:
            offsets = self._thread.run(self._positions_for_commit())
        chosen = {as_topic_partition(tp): offset for tp, offset in offsets.items()}

        async def commit() -> None:
            error: Exception | None = None
            try:
                await self._consumer.commit(chosen)
            except Exception as exc:  # noqa: BLE001  handed to the callback
                error = exc
                if callback is None:
                    logger.warning("async commit failed: %s", exc)
            if callback is not None:
                try:
                    callback(chosen, error)
                except Exception:
                    logger.exception("commit callback %r failed", callback)

        def start() -> None:
            task = asyncio.ensure_future(commit())
            self._async_commits.add(task)  # held until done; close() waits for them
            task.add_done_callback(self._async_commits.discard)

        self._thread.call_soon(start)

    async def _finish_async_commits(self) -> None:
        if self._async_commits:
            await asyncio.gather(*self._async_commits, return_exceptions=True)

    async def _rewind_to_pending(self) -> None:
        assigned = self._consumer.assignment()
        for tp, offset in first_offsets(self._pending).items():
            if tp in assigned:
                self._consumer.seek(tp, offset)
        self._pending.clear()

    async def _positions_for_commit(self) -> dict[TopicPartition, int]:
        positions = self._consumer._consumed_positions(self._consumer.assignment())
        positions.update(first_offsets(self._pending))  # held records come before those
        return positions

    def committed(self, tps: Iterable[Any]) -> dict[TopicPartition, int | None]:
        return self._thread.run(self._consumer.committed(list(tps)))

    def seek(self, tp: TopicPartition | tuple[str, int], offset: int) -> None:
        self._call(self._consumer.seek, tp, offset)
        self._drop_pending([tp])

    def seek_to_beginning(self, tps: Iterable[Any] | None = None) -> None:
        tps = None if tps is None else list(tps)
        self._call(self._consumer.seek_to_beginning, tps)
        self._drop_pending(tps)

    def seek_to_end(self, tps: Iterable[Any] | None = None) -> None:
        tps = None if tps is None else list(tps)
        self._call(self._consumer.seek_to_end, tps)
        self._drop_pending(tps)

    def _drop_pending(self, tps: list | None) -> None:
        """Records the iterator holds for partitions just moved are stale."""
        if tps is None:
            self._pending.clear()
            return
        moved = {tuple(as_topic_partition(tp)) for tp in tps}
        self._pending = deque(r for r in self._pending if (r.topic, r.partition) not in moved)

    def position(self, tp: TopicPartition | tuple[str, int]) -> int:
        tp = as_topic_partition(tp)
        held = [r.offset for r in self._pending if r.topic == tp.topic
                and r.partition == tp.partition]
        if held:  # records the iterator took but has not handed out yet
            return held[0]
        return self._thread.run(self._consumer.position(tp))

    def _drop_pending_if_lost(self) -> None:
        """Records held for iteration from partitions the group took away
        (the member was fenced or lost its session) must not be handed out."""
        group = self._consumer._group
        if self._pending and group is not None and group.generation != self._pending_generation:
            self._pending.clear()

    def _held_generation(self) -> int:
        group = self._consumer._group
        return group.generation if group is not None else 0

    def poll(self, timeout_ms: int = 0, max_records: int | None = None
             ) -> list[ConsumerRecord]:
        max_records = max_records or self.config.max_poll_records
        self._drop_pending_if_lost()
        if self._pending:
            out = [self._pending.popleft() for _ in range(min(max_records, len(self._pending)))]
            return out
        return self._thread.run(self._consumer.poll(timeout_ms, max_records))

    def poll_batches(self, timeout_ms: int = 0, max_records: int | None = None
                     ) -> list[FetchedBatch]:
        """``AsyncConsumer.poll_batches``, blocking. Not to be mixed with
        iterating the consumer (records held for iteration are not in it)."""
        return self._thread.run(self._consumer.poll_batches(timeout_ms, max_records))

    def __iter__(self) -> "Consumer":
        return self

    def __next__(self) -> ConsumerRecord:
        timeout_ms = self.config.consumer_timeout_ms
        self._drop_pending_if_lost()
        while not self._pending:
            records = self._thread.run(self._consumer.poll(
                1000 if timeout_ms is None else timeout_ms))
            self._pending_generation = self._held_generation()
            self._pending.extend(records)
            if not records and timeout_ms is not None:
                raise StopIteration
        return self._pending.popleft()

    def beginning_offsets(self, tps: Iterable[Any]) -> dict[TopicPartition, int]:
        return self._thread.run(self._consumer.beginning_offsets(list(tps)))

    def end_offsets(self, tps: Iterable[Any]) -> dict[TopicPartition, int]:
        return self._thread.run(self._consumer.end_offsets(list(tps)))

    def offsets_for_times(self, timestamps: Mapping[Any, int]
                          ) -> dict[TopicPartition, OffsetAndTimestamp | None]:
        return self._thread.run(self._consumer.offsets_for_times(dict(timestamps)))

    def partitions_for_topic(self, topic: str) -> set[int]:
        return self._thread.run(self._consumer.partitions_for_topic(topic))

    def topics(self) -> set[str]:
        return self._thread.run(self._consumer.topics())

    def list_topics(self) -> dict[str, TopicMetadata]:
        return self._thread.run(self._consumer.list_topics())

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self._thread.run(self._finish_async_commits())
            if self._pending:
                # Held records were never handed out: the commit on close
                # must not count them as consumed.
                self._thread.run(self._rewind_to_pending())
            self._thread.run(self._consumer.close())
        finally:
            self._thread.stop()
