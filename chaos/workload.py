"""The chaos workload: acks=all producers, live consumers, a final read, and
the history they write.

Everything here uses the public client (``api.client``), as a user would.

Producers
    ``producers`` threads, each with its own ``Producer`` (``acks="all"``,
    ``retries=0``: one request per attempt, so each attempt has one
    outcome). Every value is unique, ``"<producer>-<seq>"``, sent to a random
    key of ``keys``, so murmur2 spreads a producer's writes over every
    partition. A producer paces itself to its share of ``rate`` writes per
    second and does not wait for each outcome, so a stalled partition does
    not stop the others, up to ``OUTSTANDING_MAX`` writes without an outcome. Each attempt is
    recorded when its outcome is known (the client's delivery callback):

    - ``ok``: acknowledged at (partition, offset);
    - ``failed``: the broker definitely wrote nothing (``DEFINITE_FAILURES``,
      or the connection was refused before anything was sent);
    - ``unknown``: anything else — a timeout, a connection lost mid-request,
      ``NOT_ENOUGH_REPLICAS_AFTER_APPEND``, a leader change after the append.
      Such a write may or may not be in the log; the checker accepts both.

Consumers
    ``consumers`` threads, each reading every partition from offset 0 for the
    whole run with ``auto_offset_reset="none"`` (a consumer that is told its
    position is out of range records that and tries the same position again
    rather than jumping), recording every poll.

Final read
    After the faults are healed and the ISR is whole again, one fresh
    consumer reads every partition from the start to its high watermark.

Security
    Against a TLS cluster (``kraftlog chaos run --secure``) every client here
    and every HTTP call gets the run's ``ClientSecurity``: the client
    settings and the SSL context of the cluster's CA and client certificate.
    It is a required argument, so no call can forget it.

The history is JSON lines (docs/chaos.md has the format); ``History`` writes
it as events happen, so a run that crashes still leaves what it saw.
"""

from __future__ import annotations

import json
import random
import ssl
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TextIO

from api.client import Consumer, Producer, TopicPartition
from api.client.errors import KraftlogError, OffsetOutOfRangeError

#: Error codes after which the broker has written nothing (docs/protocol.md):
#: refused before the append, or never reached a partition.
DEFINITE_FAILURES = frozenset({
    "NOT_ENOUGH_REPLICAS", "UNKNOWN_TOPIC_OR_PARTITION", "LEADER_NOT_AVAILABLE",
    "MESSAGE_TOO_LARGE", "INVALID_TOPIC_EXCEPTION", "CORRUPT_MESSAGE", "INVALID_REQUEST",
    "BUFFER_EXHAUSTED",
})
#: aiohttp's words for a connection that never opened (nothing was sent).
NOT_CONNECTED_MARKER = "Cannot connect to host"
#: Records a producer sends per pacing step.
ROUND_RECORDS = 5
#: Writes a producer may have without an outcome: a stalled partition holds
#: some of them, and the others keep flowing until they are all taken.
OUTSTANDING_MAX = 300
#: How long a live consumer's poll waits.
POLL_TIMEOUT_MS = 250
#: Pause after a consumer error before polling again.
CONSUMER_ERROR_BACKOFF_S = 0.2
#: The final read starts once the high watermarks stay put this long.
END_OFFSETS_SETTLE_S = 1.0
#: Records per ``drain`` event line of the final read.
DRAIN_CHUNK_RECORDS = 2000
#: The transactional workload: values per transaction, the share aborted,
#: and the transaction timeout (transactions a fault left open are aborted
#: by the coordinator after it, before the final read).
TXN_VALUES_MIN, TXN_VALUES_MAX = 2, 8
TXN_ABORT_SHARE = 0.2
TRANSACTION_TIMEOUT_MS = 10_000
#: The consume-transform-produce loop of the transactional workload.
COPY_GROUP = "chaos-copier"
COPY_SESSION_TIMEOUT_MS = 6_000


@dataclass(frozen=True)
class ClientSecurity:
    """How the harness reaches the cluster's listeners. ``settings``: the
    keyword arguments of every client it makes (Kafka's ``security_protocol``,
    ``ssl_cafile``, ``ssl_certfile``, ``ssl_keyfile``; a TLS
    ``ProcessCluster``'s ``client_security``). ``context``: what its own
    JSON calls to https URLs verify the nodes with and present as their
    client certificate (the cluster's ``ssl_context``). Both empty for a
    plaintext cluster."""

    settings: Mapping[str, Any] = field(default_factory=dict)
    context: ssl.SSLContext | None = None


def copy_value(partition: int, offset: int, value: str) -> str:
    """What the copier writes for the input record at (partition, offset)."""
    return f"{partition}:{offset}:{value}"


def classify(error: KraftlogError | None) -> tuple[str, str | None]:
    """(outcome, error code) of one write attempt."""
    if error is None:
        return "ok", None
    code = getattr(error, "code", None) or type(error).__name__
    if code in DEFINITE_FAILURES:
        return "failed", code
    if code == "BROKER_NOT_AVAILABLE" and NOT_CONNECTED_MARKER in str(error):
        return "failed", code
    return "unknown", code


class History:
    """Events appended to ``path`` as JSON lines, each stamped with ``t``,
    seconds since the history began; safe to call from any thread."""

    def __init__(self, path: str) -> None:
        self.path = path
        # Line-buffered: a harness killed mid-run leaves whole lines.
        self._file: TextIO = open(path, "w", buffering=1)
        self._lock = threading.Lock()
        self._started = time.monotonic()

    def now(self) -> float:
        return round(time.monotonic() - self._started, 4)

    def record(self, event: dict[str, Any]) -> None:
        event.setdefault("t", self.now())
        line = json.dumps(event, separators=(",", ":"))
        with self._lock:
            self._file.write(line + "\n")

    def close(self) -> None:
        with self._lock:
            self._file.close()


def read_history(path: str) -> list[dict]:
    """The events of a history file; a torn last line (the harness was
    killed while writing it) is left out."""
    with open(path) as f:
        lines = [line for line in f if line.strip()]
    events = []
    for number, line in enumerate(lines, 1):
        try:
            events.append(json.loads(line))
        except json.JSONDecodeError:
            if number < len(lines):
                raise ValueError(f"{path}:{number} is not JSON: {line[:80]!r}") from None
    return events


class Tally:
    """Running counts for the progress line."""

    def __init__(self) -> None:
        self.outcomes = {"ok": 0, "failed": 0, "unknown": 0}
        self.polled = 0
        self.copied = 0

    def line(self) -> str:
        o = self.outcomes
        return (f"writes ok {o['ok']:,} failed {o['failed']:,} unknown {o['unknown']:,}, "
                f"read {self.polled:,}" + (f", copied {self.copied:,}" if self.copied else ""))


class Workload:
    """The producers and live consumers of one run."""

    def __init__(self, bootstrap: Callable[[], list[str]], topic: str, partitions: int,
                 history: History, *, security: ClientSecurity, producers: int = 3,
                 consumers: int = 2, rate: float = 300.0, keys: int = 64, seed: int = 0,
                 request_timeout_ms: int = 3000, idempotent: bool = False,
                 transactional: bool = False) -> None:
        self.bootstrap = bootstrap
        self.security = security
        self.topic = topic
        self.partitions = partitions
        self.history = history
        self.producer_count = producers
        self.consumer_count = consumers
        self.rate = rate
        self.keys = keys
        self.seed = seed
        self.request_timeout_ms = request_timeout_ms
        self.idempotent = idempotent
        self.transactional = transactional
        self.copy_topic = f"{topic}-copy"
        self.copier_id = f"chaos-{seed}-copier"
        self.isolation_level = "read_committed" if transactional else "read_uncommitted"
        self.tally = Tally()
        self._stop_producers = threading.Event()
        self._stop_consumers = threading.Event()
        self._threads: list[threading.Thread] = []
        self._consumer_threads: list[threading.Thread] = []
        self.errors: list[str] = []

    def start(self) -> None:
        produce = self._produce_transactions if self.transactional else self._produce
        for number in range(self.producer_count):
            thread = threading.Thread(target=self._guard, args=(produce, number),
                                      name=f"chaos-producer-{number}", daemon=True)
            thread.start()
            self._threads.append(thread)
        for number in range(self.consumer_count):
            thread = threading.Thread(target=self._guard, args=(self._consume, number),
                                      name=f"chaos-consumer-{number}", daemon=True)
            thread.start()
            self._consumer_threads.append(thread)
        if self.transactional:
            thread = threading.Thread(target=self._guard, args=(self._copy, 0),
                                      name="chaos-copier", daemon=True)
            thread.start()
            self._consumer_threads.append(thread)

    def stop_producers(self, timeout_s: float) -> None:
        """Stop sending; return once every attempt has an outcome."""
        self._stop_producers.set()
        _join_all(self._threads, timeout_s, "producers")

    def stop_consumers(self, timeout_s: float) -> None:
        self._stop_consumers.set()
        _join_all(self._consumer_threads, timeout_s, "consumers")

    def abort(self) -> None:
        """Tell every thread to stop, without waiting (the harness is failing)."""
        self._stop_producers.set()
        self._stop_consumers.set()

    def _guard(self, body: Callable[[int], None], number: int) -> None:
        try:
            body(number)
        except Exception as exc:  # noqa: BLE001  a dead thread must be visible
            self.errors.append(f"{threading.current_thread().name}: {type(exc).__name__}: {exc}")
            self.history.record({"type": "workload-error",
                                 "thread": threading.current_thread().name,
                                 "error": f"{type(exc).__name__}: {exc}"})

    # -- producers ---------------------------------------------------------------
    def _produce(self, number: int) -> None:
        rng = random.Random(f"{self.seed}-producer-{number}")
        interval_s = ROUND_RECORDS * self.producer_count / self.rate
        timeout_ms = self.request_timeout_ms
        with Producer(self.bootstrap(), **self.producer_settings(),
                      **self.security.settings) as producer:
            outstanding = _Outstanding(OUTSTANDING_MAX)
            seq = 0
            next_round = time.monotonic()
            while not self._stop_producers.is_set():
                for _ in range(ROUND_RECORDS):
                    while not outstanding.acquire(timeout=0.1):
                        if self._stop_producers.is_set():
                            break
                    else:
                        value = f"{number}-{seq}"
                        key = f"k{rng.randrange(self.keys)}"
                        producer.send(self.topic, value, key=key, on_delivery=self._on_delivery(
                            number, seq, key, value, self.history.now(), outstanding))
                        seq += 1
                        continue
                    break
                next_round += interval_s
                delay = next_round - time.monotonic()
                if delay > 0:
                    self._stop_producers.wait(delay)
                else:
                    next_round = time.monotonic()  # behind: do not burst to catch up
            producer.flush(timeout_ms=10 * timeout_ms)
            # Outcomes are recorded by delivery callbacks, which run just after
            # the flush sees the batches complete: wait for the last of them.
            if not outstanding.wait_empty(10 * timeout_ms / 1000):
                raise TimeoutError(f"{outstanding.count} writes never got an outcome")

    def producer_settings(self) -> dict[str, Any]:
        """The producers' client settings (recorded in the history: the
        checker needs ``retries``). ``max_in_flight`` is the client's
        default: the client keeps a partition's batches in order itself, and
        the reordering check covers it too."""
        timeout_ms = self.request_timeout_ms
        if self.transactional:
            # Each producer thread adds its own transactional_id (the prefix
            # plus its number).
            return {"acks": "all", "enable_idempotence": True, "retries": 2**31 - 1,
                    "transactional_id": f"chaos-{self.seed}", "max_in_flight": 5,
                    "linger_ms": 1, "retry_backoff_ms": 50,
                    "transaction_timeout_ms": TRANSACTION_TIMEOUT_MS,
                    "request_timeout_ms": timeout_ms, "delivery_timeout_ms": 10 * timeout_ms,
                    "metadata_max_age_ms": 2000, "max_block_ms": 10 * timeout_ms}
        if self.idempotent:
            # The client retries every failure itself, for as long as faults
            # last; idempotence must keep each value once and in order.
            return {"acks": "all", "enable_idempotence": True, "retries": 2**31 - 1,
                    "max_in_flight": 5, "linger_ms": 1, "retry_backoff_ms": 50,
                    "request_timeout_ms": timeout_ms, "delivery_timeout_ms": 40 * timeout_ms,
                    "metadata_max_age_ms": 2000, "max_block_ms": 40 * timeout_ms}
        return {"acks": "all", "retries": 0, "enable_idempotence": False, "max_in_flight": 5,
                "linger_ms": 1, "request_timeout_ms": timeout_ms,
                "delivery_timeout_ms": 3 * timeout_ms, "metadata_max_age_ms": 2000,
                "max_block_ms": timeout_ms}

    def _on_delivery(self, producer: int, seq: int, key: str, value: str, sent: float,
                     outstanding: _Outstanding
                     ) -> Callable[[KraftlogError | None, Any], None]:
        def delivered(error: KraftlogError | None, metadata: Any) -> None:
            try:
                outcome, code = classify(error)
                self.tally.outcomes[outcome] += 1
                self.history.record({
                    "type": "send", "t": sent, "t_end": self.history.now(),
                    "producer": producer, "seq": seq, "key": key, "value": value,
                    "outcome": outcome,
                    "partition": metadata.partition if metadata is not None else None,
                    "offset": metadata.offset if metadata is not None else None,
                    "error": code})
            finally:
                outstanding.release()  # after recording: stop_producers waits on it
        return delivered

    def _produce_transactions(self, number: int) -> None:
        """Transactions of TXN_VALUES_MIN..MAX values to random keys (so over
        several partitions), committed, or aborted one time in
        ``TXN_ABORT_SHARE``. Every value of a transaction gets its outcome:
        ``ok`` (committed, at the offset its send named), ``failed``
        (aborted: never visible) or ``unknown`` (the commit's answer was lost:
        visible whole or not at all)."""
        rng = random.Random(f"{self.seed}-txn-producer-{number}")
        settings = self.producer_settings()
        settings["transactional_id"] = f"{settings['transactional_id']}-{number}"
        interval_s = TXN_VALUES_MAX * self.producer_count / self.rate
        seq = 0
        txn_no = 0
        producer = None
        try:
            while not self._stop_producers.is_set():
                if producer is None:
                    producer = self._new_transactional_producer(settings)
                    if producer is None:
                        continue
                txn_no += 1
                txn = f"{number}-{txn_no}"
                started = self.history.now()
                sent = []
                try:
                    producer.begin_transaction()
                    for _ in range(rng.randint(TXN_VALUES_MIN, TXN_VALUES_MAX)):
                        value = f"{number}-{seq}"
                        key = f"k{rng.randrange(self.keys)}"
                        sent.append((seq, key, value, producer.send(self.topic, value, key=key)))
                        seq += 1
                    if rng.random() < TXN_ABORT_SHARE:
                        producer.flush()
                        producer.abort_transaction()
                        outcome, code = "failed", "TRANSACTION_ABORTED"
                    else:
                        producer.commit_transaction()
                        outcome, code = "ok", None
                except KraftlogError as exc:
                    outcome, code = "unknown", getattr(exc, "code", type(exc).__name__)
                    try:
                        producer.abort_transaction()
                    except KraftlogError:
                        pass
                    producer.close(timeout_ms=1000)
                    producer = None  # a fresh instance fences this one's leftovers
                self._record_transaction(number, txn, sent, outcome, code, started)
                self._stop_producers.wait(interval_s)
        finally:
            if producer is not None:
                producer.close(timeout_ms=10 * self.request_timeout_ms)

    def _new_transactional_producer(self, settings: dict) -> Producer | None:
        producer = Producer(self.bootstrap(), **settings, **self.security.settings)
        try:
            producer.init_transactions()
            return producer
        except KraftlogError as exc:
            self.history.record({"type": "producer-error", "error": exc.code,
                                 "message": str(exc)[:300]})
            producer.close(timeout_ms=1000)
            self._stop_producers.wait(CONSUMER_ERROR_BACKOFF_S)
            return None

    def _record_transaction(self, number: int, txn: str, sent: list, outcome: str,
                            code: str | None, started: float) -> None:
        now = self.history.now()
        for seq, key, value, handle in sent:
            metadata = None
            if outcome == "ok":
                metadata = handle.result(0)  # committed: every send was acknowledged
            self.tally.outcomes[outcome] += 1
            self.history.record({
                "type": "send", "t": started, "t_end": now, "producer": number, "seq": seq,
                "key": key, "value": value, "txn": txn, "outcome": outcome,
                "partition": metadata.partition if metadata is not None else None,
                "offset": metadata.offset if metadata is not None else None, "error": code})

    # -- consume-transform-produce ----------------------------------------------------
    def _copy(self, _number: int) -> None:
        """Kafka's exactly-once loop: read the topic as group ``COPY_GROUP``
        (read_committed), write a copy of each record to ``copy_topic`` and
        the group's offsets in one transaction. Any failure starts over from
        the group's committed offsets (a new consumer and producer), as an
        application restarting would. The final check: every record below
        the committed offsets copied exactly once, none above."""
        settings = {**self.producer_settings(), "transactional_id": self.copier_id}
        while not self._stop_consumers.is_set():
            consumer = producer = None
            try:
                consumer = Consumer(self.bootstrap(), group_id=COPY_GROUP,
                                    isolation_level="read_committed",
                                    auto_offset_reset="earliest", enable_auto_commit=False,
                                    request_timeout_ms=5000, metadata_max_age_ms=2000,
                                    session_timeout_ms=COPY_SESSION_TIMEOUT_MS,
                                    **self.security.settings)
                consumer.subscribe([self.topic])
                producer = Producer(self.bootstrap(), **settings, **self.security.settings)
                producer.init_transactions()
                while not self._stop_consumers.is_set():
                    records = consumer.poll(timeout_ms=POLL_TIMEOUT_MS)
                    if not records:
                        continue
                    producer.begin_transaction()
                    positions = {}
                    for record in records:
                        value = record.value.decode() if record.value is not None else ""
                        producer.send(self.copy_topic, copy_value(record.partition,
                                                                  record.offset, value))
                        positions[TopicPartition(self.topic, record.partition)] = \
                            record.offset + 1
                    producer.send_offsets_to_transaction(positions, consumer.group_metadata())
                    producer.commit_transaction()
                    self.tally.copied += len(records)
            except KraftlogError as exc:
                self.history.record({"type": "copier-error", "error": exc.code,
                                     "message": str(exc)[:300]})
                self._stop_consumers.wait(CONSUMER_ERROR_BACKOFF_S)
            finally:
                for client in (producer, consumer):
                    if client is not None:
                        try:
                            client.close(timeout_ms=2000) if client is producer else \
                                client.close()
                        except Exception:  # noqa: BLE001  starting over anyway
                            pass

    # -- consumers ---------------------------------------------------------------
    def _consume(self, number: int) -> None:
        tps = [TopicPartition(self.topic, p) for p in range(self.partitions)]
        with Consumer(self.bootstrap(), auto_offset_reset="none", request_timeout_ms=5000,
                      metadata_max_age_ms=2000, isolation_level=self.isolation_level,
                      **self.security.settings) as consumer:
            consumer.assign(tps)
            for tp in tps:
                consumer.seek(tp, 0)
            self.history.record({"type": "consumer-start", "consumer": number,
                                 "positions": {str(tp.partition): 0 for tp in tps}})
            while not self._stop_consumers.is_set():
                try:
                    records = consumer.poll(timeout_ms=POLL_TIMEOUT_MS)
                except OffsetOutOfRangeError as exc:
                    self._consumer_error(number, exc)
                    for tp in exc.partitions or {}:
                        # Try again where this consumer's user is (its records
                        # fetched but not yet returned are dropped by seek).
                        consumer.seek(tp, consumer.position(tp))
                    continue
                except KraftlogError as exc:
                    self._consumer_error(number, exc)
                    continue
                by_partition: dict[int, list] = {}
                for record in records:
                    value = record.value.decode() if record.value is not None else None
                    by_partition.setdefault(record.partition, []).append([record.offset, value])
                for partition, read in by_partition.items():
                    self.tally.polled += len(read)
                    self.history.record({"type": "poll", "consumer": number,
                                         "partition": partition, "records": read})

    def _consumer_error(self, number: int, exc: KraftlogError) -> None:
        self.history.record({"type": "consumer-error", "consumer": number,
                             "error": getattr(exc, "code", type(exc).__name__),
                             "message": str(exc)[:300]})
        self._stop_consumers.wait(CONSUMER_ERROR_BACKOFF_S)


def final_read(bootstrap: list[str], topic: str, partitions: int, history: History,
               timeout_s: float, isolation_level: str = "read_uncommitted",
               kind: str = "drain", *, security: ClientSecurity) -> int:
    """Read every partition from offset 0 to its high watermark (its last
    stable offset, read_committed) now; record it as ``drain`` events (or
    ``kind``); the number of records read."""
    tps = [TopicPartition(topic, p) for p in range(partitions)]
    deadline = time.monotonic() + timeout_s
    total = 0
    with Consumer(bootstrap, auto_offset_reset="none", request_timeout_ms=5000,
                  isolation_level=isolation_level, **security.settings) as consumer:
        if isolation_level == "read_committed":
            _wait_transactions_settled(bootstrap, consumer, tps, deadline, security)
        ends = _settled_end_offsets(consumer, tps, deadline)
        history.record({"type": f"{kind}-start",
                        "ends": {str(tp.partition): end for tp, end in ends.items()}})
        consumer.assign(tps)
        for tp in tps:
            consumer.seek(tp, 0)
        chunks: dict[int, list] = {tp.partition: [] for tp in tps}
        while any(consumer.position(tp) < ends[tp] for tp in tps):
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"the final read did not reach the high watermarks {dict(ends)} within "
                    f"{timeout_s:.0f} s (positions "
                    f"{ {tp.partition: consumer.position(tp) for tp in tps} })")
            for record in consumer.poll(timeout_ms=500):
                if record.offset >= ends[TopicPartition(topic, record.partition)]:
                    continue  # written after the read began: not part of it
                value = record.value.decode() if record.value is not None else None
                chunk = chunks[record.partition]
                chunk.append([record.offset, value])
                total += 1
                if len(chunk) >= DRAIN_CHUNK_RECORDS:
                    history.record({"type": kind, "partition": record.partition,
                                    "records": chunk})
                    chunks[record.partition] = []
        for partition, chunk in chunks.items():
            history.record({"type": kind, "partition": partition, "records": chunk})
    return total


class _Outstanding:
    """A counting limit on writes without an outcome, which can also be
    waited on until it is empty."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.count = 0
        self._changed = threading.Condition()

    def acquire(self, timeout: float) -> bool:
        with self._changed:
            if not self._changed.wait_for(lambda: self.count < self.limit, timeout):
                return False
            self.count += 1
            return True

    def release(self) -> None:
        with self._changed:
            self.count -= 1
            self._changed.notify_all()

    def wait_empty(self, timeout: float) -> bool:
        with self._changed:
            return self._changed.wait_for(lambda: self.count == 0, timeout)


def record_copier_offsets(bootstrap: list[str], topic: str, partitions: int,
                          history: History, copier_id: str, timeout_s: float = 60.0, *,
                          security: ClientSecurity) -> None:
    """The copier group's committed offsets of ``topic`` (``copy-offsets``),
    once the copier's last transaction is complete (its markers, the one in
    ``__consumer_offsets`` too, written)."""
    import urllib.parse

    from chaos.cluster import http_json

    deadline = time.monotonic() + timeout_s
    path = "/v1/transactions/" + urllib.parse.quote(copier_id, safe="")
    while True:
        try:
            status, answer = http_json(bootstrap[0] + path, context=security.context)
        except OSError:
            status, answer = 0, {}
        if status == 404 or (status == 200 and answer.get("state") not in (
                "Ongoing", "PrepareCommit", "PrepareAbort")):
            break
        if time.monotonic() > deadline:
            raise TimeoutError(f"the copier's transaction did not complete: {answer}")
        time.sleep(0.2)
    status, group = http_json(bootstrap[0] + "/v1/groups/" + COPY_GROUP,
                              context=security.context)
    committed = {p: 0 for p in range(partitions)}
    if status == 200:
        for entry in group.get("offsets") or ():
            if entry["topic"] == topic:
                committed[entry["partition"]] = entry["offset"]
    elif status != 404:
        raise RuntimeError(f"cannot read the copier's offsets: {status} {group}")
    history.record({"type": "copy-offsets",
                    "offsets": {str(p): offset for p, offset in committed.items()}})


def _wait_transactions_settled(bootstrap: list[str], committed: Consumer,
                               tps: list[TopicPartition], deadline: float,
                               security: ClientSecurity) -> None:
    """Until no transaction is open: every last stable offset has reached
    its high watermark (a transaction a fault left open is aborted by its
    coordinator after its timeout)."""
    with Consumer(bootstrap, auto_offset_reset="none", request_timeout_ms=5000,
                  **security.settings) as plain:
        while True:
            stable, high = committed.end_offsets(tps), plain.end_offsets(tps)
            if stable == high:
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"transactions still open at the final read: last stable "
                                   f"offsets {dict(stable)} below high watermarks {dict(high)}")
            time.sleep(0.5)


def _settled_end_offsets(consumer: Consumer, tps: list[TopicPartition], deadline: float
                         ) -> dict[TopicPartition, int]:
    """The high watermarks once two looks ``END_OFFSETS_SETTLE_S`` apart
    agree: a leader elected just now may not yet have raised its high
    watermark to its log end."""
    ends = consumer.end_offsets(tps)
    while time.monotonic() < deadline:
        time.sleep(END_OFFSETS_SETTLE_S)
        again = consumer.end_offsets(tps)
        if again == ends:
            return ends
        ends = again
    raise TimeoutError(f"the high watermarks did not settle: last {dict(ends)}")


def _join_all(threads: list[threading.Thread], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    alive = [t.name for t in threads if t.is_alive()]
    if alive:
        raise TimeoutError(f"the {what} did not stop within {timeout_s:.0f} s: {alive}")
