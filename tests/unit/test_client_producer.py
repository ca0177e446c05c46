"""The producer's pure core (the record accumulator and record handles),
then its sender against an in-memory broker: batching by size and linger,
partition choice, pending records, memory bounds, one request per broker,
retries and failures, handles and callbacks."""

import asyncio
import threading
import time

import pytest

from api.client import (AsyncProducer, BufferExhaustedError, KraftlogError, MessageTooLargeError,
                        Producer, RecordMetadata)
from api.client.accumulator import RecordAccumulator, flush_targets
from api.client.config import ProducerConfig
from protocol.partitioner import StickyPartitioner, partition_for_key
from storage.batch import HEADER_SIZE, iter_batches, iter_records, parse_header
from storage.producer_state import ProducerStateManager

A, B = "http://a:1", "http://b:1"
NOW = 1_000_000  # the accumulators' clock
LATER = NOW + 1000  # past linger_ms, well within delivery_timeout_ms


class Clock:
    def __init__(self, now_ms=NOW):
        self.now_ms = now_ms

    def __call__(self):
        return self.now_ms


def accumulator(counts=None, **overrides):
    settings = dict(batch_size=16384, buffer_memory=1 << 24, linger_ms=5,
                    delivery_timeout_ms=120_000, partition_counts=counts if counts is not None
                    else {"t": 4}, clock_ms=Clock())
    settings.update(overrides)
    return RecordAccumulator(**settings)


def leaders(mapping):
    """A leader_url function: {(topic, partition): url}, default A."""
    return lambda tp: mapping.get(tp, A)


def drain_all(acc, now_ms=None, leader_url=lambda tp: A, **kwargs):
    acc.begin_flush()
    try:
        out, _next, _missing = acc.drain(now_ms or acc._clock_ms(), leader_url, **kwargs)
    finally:
        acc.end_flush()
    return [batch for batches in out.values() for batch in batches]


def records_of(batch):
    return list(iter_records(batch.builder.build()))


# -- batching -------------------------------------------------------------------------
def test_batches_stay_under_batch_size_and_keep_send_order():
    acc = accumulator(batch_size=1000)
    handles = [acc.append("t", b"v%03d" % i + b"." * 96, partition=0) for i in range(50)]
    batches = drain_all(acc)
    assert len(batches) > 1
    seen = []
    for batch in batches:
        assert len(batch.builder.build()) <= 1000
        seen.extend(r.value[:4] for r in records_of(batch))
    assert seen == [b"v%03d" % i for i in range(50)]
    for i, handle in enumerate(handles):  # each handle knows its batch and index
        assert records_of(handle._batch)[handle._index].value[:4] == b"v%03d" % i


def test_a_round_asks_only_the_partitions_with_records_waiting():
    """A producer that wrote to 2,000 partitions once: its sender's next
    round looks at the partitions with records waiting, not at every one
    written to (a round per send at linger 0 walked them all)."""
    acc = accumulator(counts={"t": 2000})
    for p in range(2000):
        acc.append("t", b"v", partition=p)
    first = drain_all(acc)
    assert len(first) == 2000
    acc.sent(first)
    assert not acc._queues  # what a round walks: nothing is left waiting
    acc.append("t", b"late", partition=7)
    asked = []
    batches = drain_all(acc, leader_url=lambda tp: asked.append(tp) or A)
    assert [(b.partition, b.builder.record_count) for b in batches] == [(7, 1)]
    assert asked == [("t", 7)] and acc.partitions_with_data() == []
    assert acc.wanted_topics() == set() and not acc.has_unsent()
    acc.append("t", b"old", partition=3)  # expiry: what waits too long goes, the rest stay
    acc._clock_ms.now_ms += 60_000
    acc.append("t", b"new", partition=4)
    acc._clock_ms.now_ms += 60_001
    assert [(b.partition, b.builder.record_count) for b in acc.expired(acc._clock_ms())] == [
        (3, 1)]
    assert acc.partitions_with_data() == [("t", 4)]


def test_a_record_larger_than_batch_size_travels_alone():
    acc = accumulator(batch_size=200)
    acc.append("t", b"small", partition=0)
    big = acc.append("t", b"x" * 500, partition=0)
    acc.append("t", b"small", partition=0)
    batches = drain_all(acc)
    assert [b.builder.record_count for b in batches] == [1, 1, 1]
    assert big._batch is batches[1]


def test_a_batch_waits_for_linger_unless_full_or_flushed():
    clock = Clock()
    acc = accumulator(linger_ms=50, batch_size=400, clock_ms=clock)
    acc.append("t", b"a", partition=0)
    out, next_ms, _ = acc.drain(clock.now_ms + 10, leaders({}))
    assert out == {} and next_ms == 40
    out, _, _ = acc.drain(clock.now_ms + 50, leaders({}))
    assert [b.builder.record_count for b in out[A]] == [1]
    # A full batch (another one follows it) goes at once; the open one lingers.
    for _ in range(5):
        acc.append("t", b"x" * 100, partition=1)
    out, next_ms, _ = acc.drain(clock.now_ms, leaders({}))
    assert len(out[A]) == 2 and next_ms == 50
    acc.sent(out[A])  # the request is over
    targets = acc.begin_flush()
    out, _, _ = acc.drain(clock.now_ms, leaders({}))
    acc.end_flush()
    assert len(out[A]) == 1 and out[A][0] in targets


def test_a_partition_sends_its_next_batch_only_when_the_previous_request_is_over():
    """Two requests in flight could be appended out of order (separate
    connections), so a partition has at most one."""
    clock = Clock()
    acc = accumulator(linger_ms=0, batch_size=400, clock_ms=clock)
    acc.append("t", b"first", partition=0)
    acc.append("t", b"other", partition=1)
    first, _, _ = acc.drain(clock.now_ms, leaders({}))
    assert sorted(b.partition for b in first[A]) == [0, 1]
    acc.append("t", b"second", partition=0)
    acc.append("t", b"next", partition=1)
    acc.sent([b for b in first[A] if b.partition == 1])  # only partition 1's request ended
    out, _, _ = acc.drain(clock.now_ms, leaders({}))
    assert [b.partition for b in out[A]] == [1]
    acc.sent([b for b in first[A] if b.partition == 0])
    out, _, _ = acc.drain(clock.now_ms, leaders({}))
    assert [b.partition for b in out[A]] == [0]
    assert out[A][0].builder.record_count == 1


def test_ready_batches_go_in_one_request_per_leader():
    acc = accumulator()
    for partition in range(4):
        acc.append("t", b"v", partition=partition)
    out, _, missing = acc.drain(LATER, leaders({("t", 1): B, ("t", 3): None}))
    assert {url: sorted(b.partition for b in bs) for url, bs in out.items()} == {
        A: [0, 2], B: [1]}
    assert missing == {"t"}  # partition 3 has no known leader: stays queued
    out, _, _ = acc.drain(LATER, leaders({}))
    assert [b.partition for b in out[A]] == [3]


def test_busy_brokers_and_the_request_byte_cap_hold_batches_back():
    acc = accumulator(batch_size=1000)
    for partition in range(3):
        for _ in range(3):
            acc.append("t", b"x" * 600, partition=partition)
    out, _, _ = acc.drain(LATER, leaders({}), busy_urls={A})
    assert out == {}
    out, _, _ = acc.drain(LATER, leaders({}), max_request_bytes=1500)
    assert len(out[A]) == 2  # 2 x ~700 bytes fit in 1500, a third would not
    out, _, _ = acc.drain(LATER, leaders({}), max_request_bytes=10)
    assert len(out[A]) == 1  # a request always takes one batch


def test_requeued_batches_go_first_after_their_backoff():
    clock = Clock()
    now = clock.now_ms
    acc = accumulator(linger_ms=0, clock_ms=clock)
    first = acc.append("t", b"1", partition=0)._batch
    out, _, _ = acc.drain(now, leaders({}))
    acc.append("t", b"2", partition=0)
    acc.requeue(out[A], retry_at_ms=now + 100)
    acc.sent(out[A])  # the failed request is over
    out, next_ms, _ = acc.drain(now, leaders({}))
    assert out == {} and next_ms == 100  # the retry holds the partition's queue
    out, _, _ = acc.drain(now + 100, leaders({}))
    assert out[A][0] is first and [records_of(b)[0].value for b in out[A]] == [b"1", b"2"]


def test_batches_older_than_delivery_timeout_expire():
    clock = Clock()
    acc = accumulator(delivery_timeout_ms=1000, clock_ms=clock)
    old = acc.append("t", b"old", partition=0)._batch
    clock.now_ms += 600
    acc.append("t", b"young", partition=1)
    assert acc.expired(clock.now_ms + 399) == []
    assert acc.expired(clock.now_ms + 400) == [old]
    out, _, _ = acc.drain(LATER, leaders({}))
    assert [b.partition for b in out[A]] == [1]


# -- partitions -----------------------------------------------------------------------
def test_keyed_records_go_where_kafkas_partitioner_puts_them():
    acc = accumulator({"t": 7})
    for i in range(300):
        key = f"key-{i}"
        handle = acc.append("t", b"v", key=key)
        assert handle._batch.partition == partition_for_key(key.encode(), 7)
        again = acc.append("t", b"v", key=key.encode())  # cached hash, same answer
        assert again._batch.partition == handle._batch.partition


def test_keyless_records_stick_to_a_partition_until_its_batch_is_drained():
    choices = iter([2, 0, 1])
    acc = accumulator({"t": 4}, sticky=StickyPartitioner(choose=lambda n: next(choices)))
    assert {acc.append("t", b"v")._batch.partition for _ in range(10)} == {2}
    drain_all(acc)
    assert acc.append("t", b"v")._batch.partition == 0  # choose(3) -> 0
    explicit = acc.append("t", b"v", partition=3)
    assert explicit._batch.partition == 3


def test_a_custom_partitioner_decides_and_is_checked():
    acc = accumulator({"t": 3}, partitioner=lambda topic, key, n: len(key or b"") % n)
    assert acc.append("t", b"v", key=b"ab")._batch.partition == 2
    bad = accumulator({"t": 3}, partitioner=lambda topic, key, n: n)
    with pytest.raises(ValueError):
        bad.append("t", b"v")


def test_records_before_metadata_wait_then_keep_their_order():
    wakes = []
    counts = {}
    acc = accumulator(counts, wake=lambda: wakes.append(1))
    handles = [acc.append("t", f"v{i}", key=f"k{i % 3}") for i in range(9)]
    assert wakes == [1] and not handles[0].done()
    targets = acc.begin_flush()
    acc.end_flush()
    assert handles[0]._batch in targets
    assert acc.assign_pending("t") is None  # still no partition count
    counts["t"] = 2
    # Records sent meanwhile, even to an explicit partition, queue behind
    # the pending ones, keeping send order.
    later = acc.append("t", "v9", key="k0")
    explicit = acc.append("t", "v10", partition=partition_for_key(b"k0", 2))
    assert later._batch is explicit._batch is handles[0]._batch
    group = acc.assign_pending("t")
    acc.finish_forwarded(group)
    values_there = [r.value for r in records_of(explicit._batch)]
    assert values_there[-2:] == [b"v9", b"v10"]
    by_partition = {}
    for i, handle in enumerate(handles[:9]):
        key = f"k{i % 3}".encode()
        assert handle._batch.partition == partition_for_key(key, 2)
        by_partition.setdefault(handle._batch.partition, []).append(f"v{i}".encode())
    for batch in list(flush_targets(targets))[1:]:
        assert [r.value for r in records_of(batch)][:len(by_partition[batch.partition])] == \
            by_partition[batch.partition]
    assert acc.buffered_bytes == sum(b.buffered_bytes for b in group.forwarded_to)


def test_str_keys_values_and_headers_are_utf8_and_other_types_refused():
    acc = accumulator()
    handle = acc.append("t", "välue", key="kéy", partition=0,
                        headers=[("h", "x"), ("n", None)])
    (record,) = records_of(handle._batch)
    assert (record.key, record.value) == ("kéy".encode(), "välue".encode())
    assert record.headers == (("h", b"x"), ("n", None))
    handle = acc.append("t", b"v", partition=1, headers={"a": b"1"})
    assert records_of(handle._batch)[0].headers == (("a", b"1"),)
    with pytest.raises(TypeError):
        acc.append("t", 42, partition=0)
    with pytest.raises(TypeError):
        acc.append("t", b"v", partition=0, headers=[(1, b"x")])
    with pytest.raises(ValueError):
        acc.append("t", b"v", partition=-1)


# -- memory ---------------------------------------------------------------------------
def test_a_full_buffer_refuses_until_a_batch_completes():
    acc = accumulator(buffer_memory=1000)
    handles = [acc.append("t", b"x" * 200, partition=0) for _ in range(4)]
    assert all(handles)
    assert acc.append("t", b"x" * 200, partition=0) is None
    acc.complete(handles[0]._batch, base_offset=0)
    assert acc.buffered_bytes == 0
    assert acc.append("t", b"x" * 200, partition=0) is not None
    with pytest.raises(MessageTooLargeError):
        acc.append("t", b"x" * 2000, partition=0)


def test_a_blocking_send_raises_buffer_exhausted_after_max_block_ms():
    acc = accumulator(buffer_memory=500, max_block_ms=50)
    acc.append("t", b"x" * 400, partition=0)
    started = time.monotonic()
    with pytest.raises(BufferExhaustedError) as caught:
        acc.append("t", b"x" * 400, partition=0)
    assert time.monotonic() - started >= 0.045
    assert caught.value.code == "BUFFER_EXHAUSTED"


def test_a_blocked_send_goes_on_once_memory_is_released():
    acc = accumulator(buffer_memory=500, max_block_ms=10_000)
    first = acc.append("t", b"x" * 400, partition=0)
    releaser = threading.Thread(target=acc.complete, args=(first._batch,),
                                kwargs={"base_offset": 0})
    releaser.start()
    second = acc.append("t", b"x" * 400, partition=0)  # blocks until the release
    releaser.join()
    assert second is not None and first.result(0) == RecordMetadata("t", 0, 0, first.timestamp_ms)


# -- handles and callbacks -----------------------------------------------------------------
def test_handles_resolve_to_base_offset_plus_index():
    acc = accumulator()
    handles = [acc.append("t", b"v", partition=2, timestamp_ms=1000 + i) for i in range(3)]
    assert not handles[0].done()
    with pytest.raises(TimeoutError):
        handles[0].result(timeout=0.01)
    acc.complete(handles[0]._batch, base_offset=100)
    assert [h.result(0) for h in handles] == [
        RecordMetadata("t", 2, 100 + i, 1000 + i) for i in range(3)]
    assert handles[0].done() and handles[0].exception() is None


def test_log_append_time_and_acks_zero_show_in_the_metadata():
    acc = accumulator()
    appended = acc.append("t", b"v", partition=0, timestamp_ms=5)
    acc.complete(appended._batch, base_offset=7, log_append_time_ms=99)
    assert appended.result(0) == RecordMetadata("t", 0, 7, 99)
    unacked = acc.append("t", b"v", partition=1, timestamp_ms=5)
    acc.complete(unacked._batch)
    assert unacked.result(0).offset == -1


def test_a_failed_batch_fails_each_record_and_calls_back_once():
    acc = accumulator()
    calls = []

    def broken(error, metadata):
        raise RuntimeError("a user's bug must not stop the others")

    handles = [acc.append("t", b"v", partition=0, on_delivery=lambda e, m, i=i:
                          calls.append((i, e, m))) for i in range(2)]
    acc.append("t", b"v", partition=0, on_delivery=broken)
    error = KraftlogError("MESSAGE_TOO_LARGE", "too big")
    acc.complete(handles[0]._batch, error=error)
    acc.complete(handles[0]._batch, base_offset=5)  # settled once only
    assert calls == [(0, error, None), (1, error, None)]
    with pytest.raises(KraftlogError) as caught:
        handles[1].result(0)
    assert caught.value is error and handles[1].exception() is error


async def test_handles_are_awaitable():
    acc = accumulator()
    handle = acc.append("t", b"v", partition=0, timestamp_ms=1)
    asyncio.get_running_loop().call_soon(
        lambda: acc.complete(handle._batch, base_offset=3))
    assert await asyncio.wait_for(handle, 5) == RecordMetadata("t", 0, 3, 1)


def test_config_is_checked_once():
    with pytest.raises(ValueError):
        ProducerConfig(acks=2)
    with pytest.raises(ValueError):
        ProducerConfig(compression_type="zstd")
    with pytest.raises(ValueError):
        ProducerConfig(delivery_timeout_ms=1000, request_timeout_ms=1000, linger_ms=5)
    assert ProducerConfig(acks="all").acks == -1


# -- the sender, against an in-memory broker ---------------------------------------------
class FakeBroker:
    """Brokers A and B in one object: metadata, and produce that appends
    to per-partition logs. ``leaders`` maps (topic, partition) -> url; a
    produce to the wrong broker answers NOT_LEADER_OR_FOLLOWER with a hint.
    ``fail`` maps (topic, partition) to an error body for the next N tries."""

    def __init__(self, topics):
        self.topics = dict(topics)  # name -> partition count
        self.leaders = {}
        self.logs = {}
        self.requests = []
        self.fail = {}
        self.hold = None  # an asyncio.Event produce waits on, when set
        self.producer_ids = 0
        self.producer_states = {}
        self.lose_answers = 0

    def leader(self, tp):
        return self.leaders.get(tp, A)

    async def request(self, url, path, body=None, *, timeout_ms=None, method="POST"):
        self.requests.append((url, path, body))
        if path == "/v1/metadata":
            return {"brokers": [{"id": 1, "url": A}, {"id": 2, "url": B}], "topics": [
                self._topic(name) for name in body["topics"] or self.topics]}
        if path == "/v1/producers/init":
            self.producer_ids += 1
            return {"producer_id": 1000 + self.producer_ids, "producer_epoch": 0}
        assert path == "/v1/produce"
        if self.hold is not None:
            await self.hold.wait()
        answer = self._produce(url, body)
        if self.lose_answers:
            # Appended, but the answer never reaches the producer.
            self.lose_answers -= 1
            raise KraftlogError("REQUEST_TIMED_OUT", "the answer was lost", retriable=True)
        return answer

    def _produce(self, url, body):
        results = []
        for entry in body["partitions"]:
            tp = (entry["topic"], entry["partition"])
            result = {"topic": tp[0], "partition": tp[1], "error": None}
            failures = self.fail.get(tp)
            if failures:
                result["error"] = failures.pop(0)
            elif self.leader(tp) != url:
                result["error"] = {"code": "NOT_LEADER_OR_FOLLOWER", "message": "not me",
                                   "leader_id": 2 if self.leader(tp) == B else 1,
                                   "leader_url": self.leader(tp)}
            else:
                log = self.logs.setdefault(tp, [])
                result["base_offset"] = len(log)
                result["log_append_time_ms"] = -1
                state = self.producer_states.setdefault(tp, ProducerStateManager(""))
                for header, view in iter_batches(entry["records"]):
                    # The broker's own duplicate and sequence rules.
                    try:
                        duplicate = (state.check(header) if header.producer_id >= 0
                                     else None)
                    except Exception as exc:  # noqa: BLE001
                        result = {**result, "error": {"code": exc.code, "message": str(exc)}}
                        break
                    if duplicate is not None:
                        result["base_offset"] = duplicate.first_offset
                        continue
                    state.apply(header._replace(base_offset=len(log)))
                    log.extend(iter_records(view))
            results.append(result)
        return {"partitions": [] if body["acks"] == 0 else results}

    def _topic(self, name):
        if name not in self.topics:
            return {"name": name, "partitions": [], "error": {
                "code": "UNKNOWN_TOPIC_OR_PARTITION", "message": "no such topic"}}
        return {"name": name, "error": None, "partitions": [
            {"partition": p, "leader": 1 if self.leader((name, p)) == A else 2,
             "leader_epoch": 0, "replicas": [1], "isr": [1]}
            for p in range(self.topics[name])]}

    def produce_requests(self):
        return [(url, body) for url, path, body in self.requests if path == "/v1/produce"]

    async def close(self):
        pass


def fake_producer(broker, **settings):
    producer = AsyncProducer(A, **{"linger_ms": 0, "retry_backoff_ms": 10, **settings})
    producer._transport = producer._metadata.transport = producer._sender.transport = broker
    return producer


async def test_one_produce_request_per_broker_carries_many_partitions():
    broker = FakeBroker({"t": 4})
    broker.leaders = {("t", 1): B, ("t", 3): B}
    async with fake_producer(broker, linger_ms=50) as producer:
        handles = [await producer.send("t", b"v%d" % p, partition=p) for p in range(4)]
        await producer.flush()
        metadata = [await h for h in handles]
    assert [(m.partition, m.offset) for m in metadata] == [(p, 0) for p in range(4)]
    requests = broker.produce_requests()
    assert sorted((url, sorted(e["partition"] for e in body["partitions"]))
                  for url, body in requests) == [(A, [0, 2]), (B, [1, 3])]
    assert all(body["acks"] == -1 for _, body in requests)


def encoded(pairs):
    """A records section of ``(key, value)`` pairs made as the Spark sink
    makes it (``protocol.columns.encode``)."""
    from array import array

    from protocol import columns

    def column(items):
        offsets, data = array("i", [0]), b""
        for item in items:
            data += item
            offsets.append(len(data))
        return columns.BinaryColumn(offsets.tobytes(), data, None)
    rows = array("q", range(len(pairs))).tobytes()
    return columns.encode(column([k for k, _ in pairs]), column([v for _, v in pairs]), rows)


def test_an_encoded_batch_goes_at_once_after_the_partitions_earlier_records():
    acc = accumulator()
    first = acc.append("t", b"before", partition=1)
    handle = acc.append_encoded("t", 1, encoded([(b"k0", b"v0"), (b"k1", b"v1")]), 2,
                                timestamp_ms=1234)
    later = acc.append("t", b"after", partition=1)
    # No linger has passed: only what is closed goes, the encoded batch too.
    out, _next, _missing = acc.drain(acc._clock_ms(), lambda tp: A)
    batches = out[A]
    assert [b.count for b in batches] == [1, 2]  # the open batch closed before it
    assert [(r.key, r.value, r.timestamp) for r in records_of(batches[1])] == [
        (b"k0", b"v0", 1234), (b"k1", b"v1", 1234)]
    assert first._batch is batches[0] and handle._batch is batches[1]
    assert later._batch not in batches  # a new open batch, lingering


def test_an_encoded_batch_obeys_transactions_and_the_buffer_limit():
    acc = accumulator(transactional=True)
    with pytest.raises(KraftlogError, match="INVALID_TXN_STATE|begin_transaction"):
        acc.append_encoded("t", 0, encoded([(b"k", b"v")]), 1)
    acc.txn_open = True
    acc.append_encoded("t", 0, encoded([(b"k", b"v")]), 1)
    built = drain_all(acc)[0]
    header = parse_header(built.builder.build())
    assert header.is_transactional and header.record_count == 1
    small = accumulator(buffer_memory=200)
    assert small.append_encoded("t", 0, encoded([(b"k", b"x" * 100)]), 1) is not None
    assert small.append_encoded("t", 0, encoded([(b"k", b"x" * 100)]), 1) is None  # full


def test_an_encoded_batch_with_header_room_is_the_same_batch_built_in_place():
    from protocol import columns
    from storage.batch import EncodedBatchBuilder, iter_records

    plain = encoded([(b"k", b"v"), (b"j", b"w")])
    roomy = bytearray(columns.BATCH_HEADER_BYTES) + plain
    for builder in (EncodedBatchBuilder(plain, 2, 99, transactional=True),
                    EncodedBatchBuilder(roomy, 2, 99, transactional=True, header_room=True)):
        builder.producer_id, builder.producer_epoch, builder.base_sequence = 7, 1, 40
        assert builder.size_bytes == HEADER_SIZE + len(plain)
        built = builder.build()
        header = parse_header(built)
        assert (header.producer_id, header.base_sequence, header.is_transactional) == (7, 40, True)
        assert [(r.key, r.value, r.timestamp) for r in iter_records(built)] == [
            (b"k", b"v", 99), (b"j", b"w", 99)]
    assert builder.build() is roomy  # written in place: no copy of the records
    with pytest.raises(ValueError):
        EncodedBatchBuilder(plain, 2, 99, header_room=True)  # bytes: no room to write in


async def test_encoded_batches_are_idempotent_and_get_their_offsets():
    broker = FakeBroker({"t": 2})
    async with fake_producer(broker) as producer:
        first = await producer.send_encoded("t", 1, encoded([(b"a", b"1"), (b"b", b"2")]), 2)
        second = await producer.send_encoded("t", 1, encoded([(b"c", b"3")]), 1)
        await producer.flush()
        assert [(await h).offset for h in (first, second)] == [0, 2]
    assert [r.key for r in broker.logs[("t", 1)]] == [b"a", b"b", b"c"]
    stamped = [header for _, body in broker.produce_requests()
               for entry in body["partitions"] for header, _ in iter_batches(entry["records"])]
    assert [h.base_sequence for h in stamped] == [0, 2] and stamped[0].producer_id >= 0


class OvertakingBroker(FakeBroker):
    """Produce requests travel on separate connections: the second produce
    request is appended only after the third was (which overtook it and so
    was refused as out of order)."""

    def __init__(self, topics):
        super().__init__(topics)
        self.produces = 0
        self.third_done = asyncio.Event()

    async def request(self, url, path, body=None, **kwargs):
        if path != "/v1/produce":
            return await super().request(url, path, body, **kwargs)
        self.produces += 1
        number = self.produces
        if number == 2:
            await asyncio.wait_for(self.third_done.wait(), 5)
        try:
            return await super().request(url, path, body, **kwargs)
        finally:
            if number == 3:
                self.third_done.set()


async def test_a_batch_overtaken_on_another_connection_goes_again_without_a_back_off():
    # With a back-off of a minute, only a retry that waits for the batch
    # ahead of it (not for the back-off) lets the flush finish in time.
    broker = OvertakingBroker({"t": 1})
    async with fake_producer(broker, retry_backoff_ms=60_000, batch_size=200,
                             linger_ms=0) as producer:
        first = await producer.send("t", b"a" * 150, partition=0)
        await asyncio.sleep(0.05)  # answered: the next ones may be pipelined
        handles = [await producer.send("t", b"%d" % i * 150, partition=0) for i in range(3)]
        await asyncio.wait_for(producer.flush(), 10)
        offsets = [(await h).offset for h in [first, *handles]]
    assert [r.value[:1] for r in broker.logs[("t", 0)]] == [b"a", b"0", b"1", b"2"]
    assert sorted(offsets) == offsets
    assert broker.third_done.is_set()  # the overtaking did happen


async def test_batches_of_one_partition_share_a_request_and_get_consecutive_offsets():
    # Without idempotence; an idempotent producer sends one batch per
    # partition per request (the broker dedupes batch by batch).
    broker = FakeBroker({"t": 1})
    broker.hold = asyncio.Event()  # the first request waits: later batches queue up
    async with fake_producer(broker, linger_ms=10_000, batch_size=300,
                             max_in_flight=1, enable_idempotence=False) as producer:
        handles = [await producer.send("t", b"x" * 100, partition=0) for _ in range(8)]
        flushed = asyncio.ensure_future(producer.flush())
        broker.hold.set()
        await asyncio.wait_for(flushed, 5)
        assert [(await h).offset for h in handles] == list(range(8))
    batches_per_request = [len(list(iter_batches(body["partitions"][0]["records"])))
                           for _, body in broker.produce_requests()]
    assert max(batches_per_request) > 1 and sum(batches_per_request) == 8


async def test_not_leader_with_a_hint_retries_at_the_new_leader():
    broker = FakeBroker({"t": 1})
    async with fake_producer(broker) as producer:
        await producer.send_and_wait("t", b"first", partition=0)
        broker.leaders[("t", 0)] = B  # leadership moves; the client's metadata is stale
        metadata = await producer.send_and_wait("t", b"second", partition=0)
    assert metadata.offset == 1
    urls = [url for url, _ in broker.produce_requests()]
    assert urls == [A, A, B]
    assert [r.value for r in broker.logs[("t", 0)]] == [b"first", b"second"]


async def test_retriable_errors_are_retried_and_others_fail_the_batch(caplog):
    broker = FakeBroker({"t": 2})
    broker.fail[("t", 0)] = [{"code": "NOT_ENOUGH_REPLICAS", "message": "wait"}] * 2
    broker.fail[("t", 1)] = [{"code": "MESSAGE_TOO_LARGE", "message": "too big"}]
    async with fake_producer(broker) as producer:
        retried = await producer.send("t", b"v", partition=0)
        failed = await producer.send("t", b"v", partition=1)
        assert (await retried).offset == 0
        with pytest.raises(MessageTooLargeError):
            await failed
    attempts = [e["partition"] for _, body in broker.produce_requests()
                for e in body["partitions"]]
    assert attempts.count(0) == 3 and attempts.count(1) == 1
    # Told once per partition why acks=all sends keep retrying, not per retry.
    warnings = [r.getMessage() for r in caplog.records if "cannot succeed now" in r.getMessage()]
    assert len(warnings) == 1 and warnings[0].startswith("t-0:"), warnings


async def test_records_for_an_unknown_topic_fail_after_delivery_timeout():
    broker = FakeBroker({})
    calls = []
    async with fake_producer(broker, request_timeout_ms=100,
                             delivery_timeout_ms=300) as producer:
        started = time.monotonic()
        handle = await producer.send("nope", b"v", on_delivery=lambda e, m: calls.append(e))
        with pytest.raises(KraftlogError) as caught:
            await asyncio.wait_for(handle, 5)
        assert time.monotonic() - started >= 0.29
    assert caught.value.code == "UNKNOWN_TOPIC_OR_PARTITION"
    assert calls == [caught.value]


async def test_a_partition_the_topic_does_not_have_fails_as_unknown():
    broker = FakeBroker({"t": 1})
    async with fake_producer(broker, request_timeout_ms=100,
                             delivery_timeout_ms=300) as producer:
        await producer.send_and_wait("t", b"v", partition=0)
        with pytest.raises(KraftlogError) as caught:
            await producer.send_and_wait("t", b"v", partition=5)
    assert caught.value.code == "UNKNOWN_TOPIC_OR_PARTITION"
    assert "1 partitions" in caught.value.message


async def test_records_sent_before_the_topic_exists_are_delivered_once_it_does():
    broker = FakeBroker({})
    async with fake_producer(broker) as producer:
        handles = [await producer.send("late", b"v%d" % i, key=b"k") for i in range(3)]
        broker.topics["late"] = 3
        metadata = [await asyncio.wait_for(h, 5) for h in handles]
    partition = partition_for_key(b"k", 3)
    assert [(m.partition, m.offset) for m in metadata] == [(partition, i) for i in range(3)]


async def test_a_new_topic_is_asked_for_alone_and_the_periodic_refresh_asks_for_all():
    # KIP-526: a producer taking up its topics one at a time (by send or by
    # partitions_for) asks for each new one alone, not again for all it
    # knows; a refresh a lost leader makes due asks for every topic.
    broker = FakeBroker({f"t{i}": 2 for i in range(4)})

    def asked():
        return [body["topics"] for _, path, body in broker.requests if path == "/v1/metadata"]
    async with fake_producer(broker) as producer:
        await producer.send_and_wait("t0", b"v", partition=0)
        await producer.send_and_wait("t1", b"v")
        assert await producer.partitions_for("t2") == {0, 1}
        assert await producer.partitions_for("t3") == {0, 1}
        assert asked() == [["t0"], ["t1"], ["t2"], ["t3"]]
        broker.fail[("t0", 0)] = [{"code": "NOT_LEADER_OR_FOLLOWER", "message": "moved"}]
        assert (await producer.send_and_wait("t0", b"v", partition=0)).offset == 1
    assert asked()[4:] == [["t0", "t1", "t2", "t3"]]


async def test_acks_zero_resolves_without_waiting_for_the_answer():
    broker = FakeBroker({"t": 1})
    broker.hold = asyncio.Event()
    producer = fake_producer(broker, acks=0)
    handle = await producer.send("t", b"v", partition=0)
    assert (await asyncio.wait_for(handle, 5)).offset == -1
    broker.hold.set()
    await producer.close()
    assert broker.produce_requests()[0][1]["acks"] == 0


async def test_close_with_a_timeout_fails_what_cannot_be_delivered():
    broker = FakeBroker({"t": 1})
    broker.hold = asyncio.Event()  # the broker never answers
    producer = fake_producer(broker)
    handle = await producer.send("t", b"v", partition=0)
    await producer.close(timeout_ms=100)
    with pytest.raises(KraftlogError) as caught:
        await handle
    assert caught.value.code == "CLIENT_CLOSED"
    with pytest.raises(KraftlogError):
        await producer.send("t", b"v", partition=0)


async def test_an_async_send_waits_for_memory_then_gives_up():
    broker = FakeBroker({"t": 1})
    broker.hold = asyncio.Event()
    producer = fake_producer(broker, buffer_memory=300, max_block_ms=100)
    await producer.send("t", b"x" * 200, partition=0)
    with pytest.raises(BufferExhaustedError):
        await producer.send("t", b"x" * 200, partition=0)
    blocked = asyncio.ensure_future(producer.send("t", b"x" * 200, partition=0))
    broker.hold.set()  # the first batch completes and frees its memory
    assert await asyncio.wait_for(blocked, 5) is not None
    await producer.close()


def test_the_sync_producer_sends_from_the_callers_thread_and_flushes():
    broker = FakeBroker({"t": 2})
    producer = Producer(A, linger_ms=1000, retry_backoff_ms=10)
    inner = producer._producer
    producer._thread.call(setattr, inner, "_transport", broker)
    inner._metadata.transport = inner._sender.transport = broker
    delivered = []
    handles = [producer.send("t", b"v%d" % i, key=b"k%d" % i,
                             on_delivery=lambda e, m: delivered.append(m)) for i in range(20)]
    producer.flush(timeout_ms=5000)  # well before linger_ms
    assert all(h.done() for h in handles) and len(delivered) == 20
    offsets = {}
    for i, handle in enumerate(handles):
        metadata = handle.result(0)
        assert metadata.partition == partition_for_key(b"k%d" % i, 2)
        offsets.setdefault(metadata.partition, []).append(metadata.offset)
    assert all(o == list(range(len(o))) for o in offsets.values())
    producer.close()
    with pytest.raises(KraftlogError):
        producer.send("t", b"v")


def test_batch_header_offsets_start_at_zero_for_the_leader_to_stamp():
    acc = accumulator()
    handle = acc.append("t", b"v", partition=0)
    data = handle._batch.builder.build()
    assert parse_header(data).base_offset == 0 and len(data) > HEADER_SIZE


# -- idempotence ---------------------------------------------------------------------
def stamps(broker, tp=("t", 0)):
    """(producer id, epoch, base sequence, records) of every batch sent to ``tp``."""
    out = []
    for _, body in broker.produce_requests():
        for entry in body["partitions"]:
            if (entry["topic"], entry["partition"]) == tp:
                for header, _view in iter_batches(entry["records"]):
                    out.append((header.producer_id, header.producer_epoch,
                                header.base_sequence, header.record_count))
    return out


def test_idempotence_is_on_by_default_with_acks_all_and_refused_with_acks_1():
    assert ProducerConfig().enable_idempotence is True
    assert ProducerConfig(acks=1).enable_idempotence is False
    assert ProducerConfig(max_in_flight=6).enable_idempotence is False
    with pytest.raises(ValueError, match="acks='all'"):
        ProducerConfig(acks=1, enable_idempotence=True)
    with pytest.raises(ValueError, match="max_in_flight up to 5"):
        ProducerConfig(max_in_flight=6, enable_idempotence=True)


async def test_batches_carry_the_producer_id_and_consecutive_sequences():
    broker = FakeBroker({"t": 1})
    async with fake_producer(broker, batch_size=300) as producer:
        handles = [await producer.send("t", b"x" * 100, partition=0) for _ in range(6)]
        await producer.flush()
        assert [(await h).offset for h in handles] == list(range(6))
    sent = stamps(broker)
    assert {(pid, epoch) for pid, epoch, _, _ in sent} == {(1001, 0)}
    sequences, expected = [seq for _, _, seq, _ in sent], 0
    for (_, _, seq, count) in sent:
        assert seq == expected
        expected += count
    assert sequences[0] == 0 and expected == 6


async def test_a_lost_answer_is_retried_and_lands_once_with_its_original_offset():
    broker = FakeBroker({"t": 1})
    broker.lose_answers = 1
    async with fake_producer(broker) as producer:
        first = await producer.send("t", b"a", partition=0)
        assert (await first).offset == 0
        second = await producer.send("t", b"b", partition=0)
        assert (await second).offset == 1
    assert [r.value for r in broker.logs[("t", 0)]] == [b"a", b"b"]
    assert stamps(broker)[:2] == [(1001, 0, 0, 1), (1001, 0, 0, 1)]  # the retry: same seq


async def test_pipelined_batches_after_a_failed_one_land_in_send_order():
    broker = FakeBroker({"t": 1})
    async with fake_producer(broker, batch_size=200, linger_ms=0) as producer:
        await (await producer.send("t", b"first", partition=0))  # the leader knows us
        broker.hold = asyncio.Event()
        handles = [await producer.send("t", b"%03d" % i + b"." * 150, partition=0)
                   for i in range(12)]
        for _ in range(50):  # until several requests are in flight
            await asyncio.sleep(0.01)
            if len(broker.produce_requests()) >= 4:
                break
        assert len(broker.produce_requests()) >= 4  # three in flight at once
        broker.fail[("t", 0)] = [{"code": "NOT_LEADER_OR_FOLLOWER", "message": "moved"}]
        broker.hold.set()
        broker.hold = None
        await producer.flush()
        offsets = [(await h).offset for h in handles]
    values = [r.value[:3] for r in broker.logs[("t", 0)]]
    assert values == [b"fir"] + [b"%03d" % i for i in range(12)]
    assert offsets == list(range(1, 13))


async def test_a_real_sequence_gap_bumps_the_epoch_and_restarts_the_sequence():
    broker = FakeBroker({"t": 1})
    async with fake_producer(broker) as producer:
        await (await producer.send("t", b"a", partition=0))
        # The leader loses this producer's batches (e.g. an unclean election).
        entry = broker.producer_states[("t", 0)].producers[1001]
        entry.batches.clear()
        handle = await producer.send("t", b"b", partition=0)
        assert (await handle).offset == 1
    assert [s[:3] for s in stamps(broker)] == [(1001, 0, 0), (1001, 0, 1), (1001, 1, 0)]
    assert producer._acc.idempotence.bumps == 1
    assert [r.value for r in broker.logs[("t", 0)]] == [b"a", b"b"]


def test_a_sync_wait_racing_the_completion_always_returns():
    """A completion makes its threading event only for a sync waiter (a
    batch of an async sender never needs one). Waiters and the finishing
    thread racing each other: every wait returns True, none waits out its
    timeout, whichever comes first."""
    from api.client.accumulator import _Completion

    for i in range(300):
        done = _Completion(0)
        results = []
        waiters = [threading.Thread(target=lambda: results.append(done.wait(10)))
                   for _ in range(2)]
        if i % 2:
            done._finish()
        for t in waiters:
            t.start()
        if not i % 2:
            time.sleep(0.0001 * (i % 3))
            done._finish()
        for t in waiters:
            t.join(timeout=10)
        assert results == [True, True], i
    assert _Completion(0)._event is None  # none made until someone waits
