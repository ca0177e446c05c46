"""Driver-side lookups: the partitions a query reads and their offsets.

``ClusterOffsets`` runs on the Spark driver (in the Python process that
plans batches) and asks the cluster through the kraftlog client, never
anything below it: which partitions the subscription covers now, their log
start offsets and high watermarks, and the offsets for timestamps. It turns
an ``OffsetSpec`` (``startingOffsets`` and friends) into one offset per
partition. Lookups are retried ``fetchOffset.numRetries`` times,
``fetchOffset.retryIntervalMs`` apart, on errors a retry may cure (no leader
during an election, a broker restarting).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping
from typing import TypeVar

from api.client import (
    Consumer, KraftlogError, OffsetOutOfRangeError, TopicPartition, UnknownTopicOrPartitionError)
from spark_source.options import (
    EARLIEST, LATEST, InvalidOptionError, OffsetSpec, SourceOptions, TopicPartitionKey)

logger = logging.getLogger(__name__)
T = TypeVar("T")

#: Each lookup's deadline; the client retries within it (an election takes
#: a second or two), and ``fetchOffset.numRetries`` retries beyond it.
REQUEST_TIMEOUT_MS = 10_000
#: How long the truncation probe waits for a fetch answer.
PROBE_POLL_MS = 1000
UNKNOWN = UnknownTopicOrPartitionError.CODE


class ClusterOffsets:
    """Partitions and offsets of the subscription, asked of the cluster.
    Opens one client on first use; ``close`` it when done."""

    def __init__(self, options: SourceOptions) -> None:
        self.options = options
        self._consumer: Consumer | None = None
        #: Topic ids of the subscription's topics, as the last ``partitions``
        #: call saw them (an id changes when a topic is deleted and created
        #: again).
        self.topic_ids: dict[str, str] = {}

    def _client(self) -> Consumer:
        if self._consumer is None:
            self._consumer = Consumer(self.options.bootstrap, auto_offset_reset="none",
                                      enable_auto_commit=False,
                                      isolation_level=self.options.isolation_level,
                                      request_timeout_ms=REQUEST_TIMEOUT_MS,
                                      **self.options.security)
        return self._consumer

    def close(self) -> None:
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None

    def _retry(self, what: str, fn: Callable[[], T]) -> T:
        """``fn()``, again after errors a retry may cure (timeouts
        included: each attempt is bounded by ``REQUEST_TIMEOUT_MS``), but
        not after an unknown topic: an answer, not a hiccup."""
        attempts = self.options.fetch_offset_retries + 1
        for attempt in range(1, attempts + 1):
            try:
                return fn()
            except KraftlogError as exc:
                if (not exc.retriable or attempt == attempts
                        or UNKNOWN in (exc.code, exc.details.get("last_code"))):
                    raise
                logger.warning("%s failed (attempt %d of %d), retrying: %s", what, attempt,
                               attempts, exc)
                time.sleep(self.options.fetch_offset_retry_interval_ms / 1000)
        raise AssertionError("unreachable")

    # -- partitions --------------------------------------------------------------------------
    def partitions(self) -> set[TopicPartitionKey]:
        """The partitions the subscription covers now, from one metadata
        request: the subscribed topics that exist, the topics matching the
        pattern, or those assigned partitions that exist. Also updates
        ``topic_ids``."""
        subscription = self.options.subscription
        listed = self._retry("listing topics", self._client().list_topics)
        self.topic_ids = {name: topic.topic_id for name, topic in listed.items()
                          if subscription.matches(name) and topic.topic_id is not None}
        if subscription.partitions is not None:
            return {(t, p) for t, p in subscription.partitions
                    if t in listed and p in listed[t].partitions}
        return {(name, p) for name, topic in listed.items()
                if subscription.matches(name) for p in topic.partitions}

    # -- offsets ------------------------------------------------------------------------------
    def earliest(self, tps: Iterable[TopicPartitionKey]) -> dict[TopicPartitionKey, int]:
        return self._offsets(tps, EARLIEST)

    def latest(self, tps: Iterable[TopicPartitionKey]) -> dict[TopicPartitionKey, int]:
        """High watermarks: the end of what is committed, which is all a
        query ever reads."""
        return self._offsets(tps, LATEST)

    def latest_of_existing(self, tps: set[TopicPartitionKey]) -> dict[TopicPartitionKey, int]:
        """``latest(tps)`` for those of ``tps`` that still exist: a topic
        deleted since ``tps`` was listed is left out of the answer rather
        than failing the lookup (the caller treats it as missing)."""
        try:
            return self.latest(tps)
        except KraftlogError as exc:
            if UNKNOWN not in (exc.code, exc.details.get("last_code")):
                raise
        still = self.partitions() & tps
        logger.info("kraftlog: %s vanished during an offset lookup", sorted(tps - still))
        return self.latest(still)

    def beyond_log_end(self, tp: TopicPartitionKey, offset: int) -> bool | None:
        """Whether ``offset`` is past the end of the leader's log (a log
        truncated, or a topic created again, below a query's position), as
        opposed to a high watermark still catching up after a leader change
        (the leader's log then holds ``offset``). Asked with one fetch; None
        when the answer does not say."""
        client = self._client()
        partition = TopicPartition(*tp)
        try:
            client.assign([partition])
            client.seek(partition, offset)
            client.poll(PROBE_POLL_MS, 1)
            return False
        except OffsetOutOfRangeError:
            return True
        except KraftlogError as exc:
            logger.info("kraftlog: could not probe %s-%d at %d: %s", *tp, offset, exc)
            return None
        finally:
            client.assign([])

    def _offsets(self, tps: Iterable[TopicPartitionKey], which: int
                 ) -> dict[TopicPartitionKey, int]:
        query = [TopicPartition(*tp) for tp in tps]
        if not query:
            return {}
        client = self._client()
        lookup = client.beginning_offsets if which == EARLIEST else client.end_offsets
        found = self._retry("offset lookup", lambda: lookup(query))
        return {(tp.topic, tp.partition): offset for tp, offset in found.items()}

    def for_times(self, timestamps: Mapping[TopicPartitionKey, int]
                  ) -> dict[TopicPartitionKey, int | None]:
        """Per partition the first offset whose timestamp is at or after the
        given ms, None where no record is."""
        if not timestamps:
            return {}
        query = {TopicPartition(*tp): ts for tp, ts in timestamps.items()}
        found = self._retry("offsets for timestamps",
                            lambda: self._client().offsets_for_times(query))
        return {(tp.topic, tp.partition): (None if hit is None else hit.offset)
                for tp, hit in found.items()}

    # -- OffsetSpec -> offsets ---------------------------------------------------------------
    def resolve(self, spec: OffsetSpec, tps: set[TopicPartitionKey], *, ending: bool = False
                ) -> dict[TopicPartitionKey, int]:
        """One concrete offset per partition of ``tps`` for ``spec``.

        Specific offsets and per-partition timestamps must name exactly the
        partitions of ``tps`` (Spark's rule: use -2/-1 for the others).
        A timestamp with no record at or after it is an error with the
        ``error`` strategy and the high watermark with ``latest``; for an
        ending timestamp it is always the high watermark.
        """
        option = spec.option_name("ending" if ending else "starting")
        if spec.kind == "earliest":
            return self.earliest(tps)
        if spec.kind == "latest":
            return self.latest(tps)
        if spec.kind in ("offsets", "timestamps"):
            _require_same_partitions(option, spec.offsets or {}, tps)
        if spec.kind == "offsets":
            table = dict(spec.offsets or {})
            earliest = self.earliest([tp for tp, o in table.items() if o == EARLIEST])
            latest = self.latest([tp for tp, o in table.items() if o == LATEST])
            return {tp: earliest[tp] if o == EARLIEST else latest[tp] if o == LATEST else o
                    for tp, o in table.items()}
        if spec.kind == "timestamp":
            wanted = {tp: spec.timestamp for tp in tps}
        else:
            wanted = dict(spec.offsets or {})
        found = self.for_times(wanted)
        missing = sorted(tp for tp, offset in found.items() if offset is None)
        if missing and not ending and self.options.timestamp_strategy == "error":
            raise InvalidOptionError(
                f"{option}: no record at or after the timestamp in "
                f"{', '.join(f'{t}-{p} ({wanted[(t, p)]} ms)' for t, p in missing)}; set "
                "startingOffsetsByTimestampStrategy=latest to start those at the end instead")
        latest = self.latest(missing)
        return {tp: latest[tp] if offset is None else offset for tp, offset in found.items()}


def _require_same_partitions(option: str, table: Mapping[TopicPartitionKey, int],
                             tps: set[TopicPartitionKey]) -> None:
    named = set(table)
    if named == tps:
        return
    missing = sorted(tps - named)
    extra = sorted(named - tps)
    parts = []
    if missing:
        parts.append(f"it does not give {', '.join(f'{t}-{p}' for t, p in missing)}")
    if extra:
        parts.append(f"{', '.join(f'{t}-{p}' for t, p in extra)} "
                     "are not partitions of the subscription")
    raise InvalidOptionError(
        f"{option} must give every partition the query reads and no other: "
        f"{'; '.join(parts)}" + (" (use -2 for earliest, -1 for latest)"
                                 if "Timestamp" not in option else ""))
