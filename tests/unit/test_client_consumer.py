"""The consumer: the fast batch decoder against ``storage.batch``'s reference
decoder, the fetch buffer's positions and bounds, and the consumer against
an in-memory broker (leader moves, out-of-range resets, no position)."""

import asyncio
import gc
import struct
import weakref

import pytest
from hypothesis import given, settings, strategies as st

from api.client import (
    AsyncConsumer, ConsumerRecord, CorruptRecordError, NoOffsetForPartitionError,
    OffsetAndTimestamp, OffsetOutOfRangeError, TopicPartition)
from api.client import fetcher
from api.client.fetcher import FetchBuffer, PartitionState, decode_batch
from storage.batch import (
    CONTROL_BIT, CRC_OFFSET, BatchBuilder, Compression, iter_batches, iter_records,
    parse_header, stamped_prefix)

A, B = "http://a:1", "http://b:1"
TP = TopicPartition("t", 0)


def stored_batch(base_offset, values, *, timestamp_ms=1000, compression=Compression.NONE,
                 headers=(), control=False):
    """A batch as a broker stores it: built by a producer, stamped with its
    base offset."""
    builder = BatchBuilder(compression=compression, control=control)
    for value in values:
        builder.append(b"k" + value, value, timestamp_ms=timestamp_ms, headers=headers)
    data = bytearray(builder.build())
    data[:16] = stamped_prefix(parse_header(data), base_offset, 0)
    return bytes(data)


def values(start, stop):
    return [b"v%d" % i for i in range(start, stop)]


# -- decoding --------------------------------------------------------------------------
records_strategy = st.lists(st.tuples(
    st.one_of(st.none(), st.binary(max_size=20)), st.one_of(st.none(), st.binary(max_size=50)),
    st.integers(min_value=0, max_value=10**6),
    st.lists(st.tuples(st.text(max_size=5), st.one_of(st.none(), st.binary(max_size=5))),
             max_size=2)), min_size=1, max_size=30)


@settings(max_examples=60, deadline=None)
@given(records_strategy, st.sampled_from([Compression.NONE, Compression.GZIP]),
       st.integers(min_value=0, max_value=2**40))
def test_the_fast_decoder_agrees_with_the_reference_decoder(records, compression, base):
    builder = BatchBuilder(compression=compression)
    for key, value, ts, headers in records:
        builder.append(key, value, timestamp_ms=ts, headers=headers)
    data = bytearray(builder.build())
    data[:16] = stamped_prefix(parse_header(data), base, 3)
    expected = [ConsumerRecord("t", 5, *r) for r in iter_records(bytes(data))]
    for c_records in {fetcher.build_records, None}:  # in C (when built), and in Python
        fetcher.build_records, saved = c_records, fetcher.build_records
        try:
            got = decode_batch("t", 5, memoryview(bytes(data)))
            without = decode_batch("t", 5, memoryview(bytes(data)), include_headers=False)
        finally:
            fetcher.build_records = saved
        assert got == expected and all(type(r) is ConsumerRecord for r in got)
        assert [r._replace(headers=()) for r in expected] == without


def test_decoded_records_are_never_scanned_by_the_garbage_collector():
    data = stored_batch(0, values(0, 50), headers=[("h", b"1"), ("g", None)])
    records = decode_batch("t", 0, memoryview(data))
    assert len(records) == 50 and records[3].headers == (("h", b"1"), ("g", None))
    assert not any(gc.is_tracked(r) or gc.is_tracked(r.headers) for r in records)
    # A record holding something the collector must see stays tracked.
    held = fetcher.build_records(ConsumerRecord, [(1, 2, b"k", b"v", ([],))], "t", 0, 10, 100, 0,
                              True)
    assert held == [ConsumerRecord("t", 0, 12, 101, b"k", b"v", ([],), 0)]
    assert gc.is_tracked(held[0])
    # An untracked dict may be tracked again once something is put in it:
    # a record holding one is left to the collector (a cycle through it).
    as_map = fetcher.build_records(ConsumerRecord, [(0, 0, b"k", {"a": 1}, ())], "t", 0, 0, 0, 0,
                                True)[0]
    assert gc.is_tracked(as_map)
    class Marker:
        pass

    marker = Marker()
    as_map.value["self"], as_map.value["marker"] = as_map, marker
    ref = weakref.ref(marker)
    del as_map, marker
    gc.collect()
    assert ref() is None
    gc.disable()  # the fresh tuples below stay tracked until the call looks at them
    try:
        deep = tuple([tuple([tuple([1])])])  # deeper than a header's: left to the collector
        assert gc.is_tracked(fetcher.build_records(ConsumerRecord, [(0, 0, None, None, (deep,))],
                                                "t", 0, 0, 0, 0, True)[0])
    finally:
        gc.enable()

    class WithDict(tuple):  # its instances' __dict__ may hold anything: left tracked
        pass

    assert gc.is_tracked(fetcher.build_records(WithDict, [(0, 0, None, None, ())], "t", 0, 0, 0, 0,
                                            True)[0])
    with pytest.raises(ValueError):
        fetcher.build_records(ConsumerRecord, [(0, 0, None, None)], "t", 0, 0, 0, 0, True)
    with pytest.raises(TypeError):
        fetcher.build_records(ConsumerRecord, [(0, "x", None, None, ())], "t", 0, 0, 0, 0, True)


def test_a_corrupt_batch_raises_unless_crc_checks_are_off():
    data = bytearray(stored_batch(0, values(0, 3)))
    data[-1] ^= 0xFF
    with pytest.raises(CorruptRecordError):
        decode_batch("t", 0, memoryview(bytes(data)))
    good = bytearray(stored_batch(0, values(0, 3)))
    struct.pack_into(">I", good, CRC_OFFSET, 12345)  # only the stored CRC is wrong
    with pytest.raises(CorruptRecordError):
        decode_batch("t", 0, memoryview(bytes(good)))
    assert len(decode_batch("t", 0, memoryview(bytes(good)), check_crc=False)) == 3


# -- the fetch buffer --------------------------------------------------------------------
def state(position, tp=TP):
    s = PartitionState(tp, "earliest")
    s.seek(position)
    return s


def test_records_below_the_position_in_the_first_batch_are_skipped():
    buffer = FetchBuffer()
    s = state(12)
    data = stored_batch(10, values(10, 15)) + stored_batch(15, values(15, 18))
    assert buffer.add(s, data) == 18  # the next fetch offset
    records = buffer.drain(100)
    assert [r.offset for r in records] == list(range(12, 18))
    assert [r.value for r in records] == values(12, 18)
    assert records[0] == ConsumerRecord("t", 0, 12, 1000, b"kv12", b"v12", ())
    assert s.position == 18 and buffer.buffered_bytes == 0 and len(buffer) == 0


def test_max_records_slices_and_the_position_follows():
    buffer = FetchBuffer()
    s = state(0)
    buffer.add(s, stored_batch(0, values(0, 5)) + stored_batch(5, values(5, 10)))
    first = buffer.drain(3)
    assert [r.offset for r in first] == [0, 1, 2] and s.position == 3
    second = buffer.drain(4)
    assert [r.offset for r in second] == [3, 4, 5, 6] and s.position == 7
    assert [r.offset for r in buffer.drain(100)] == [7, 8, 9] and s.position == 10


def test_fetches_from_before_a_seek_are_dropped():
    buffer = FetchBuffer()
    s = state(0)
    buffer.add(s, stored_batch(0, values(0, 5)))
    s.seek(100)
    assert buffer.drain(10) == [] and buffer.buffered_bytes == 0


def test_control_batches_are_skipped_and_advance_the_position():
    buffer = FetchBuffer()
    s = state(0)
    buffer.add(s, stored_batch(0, [b"marker"], control=True) + stored_batch(1, values(1, 3)))
    assert [r.offset for r in buffer.drain(10)] == [1, 2]


def test_buffered_bytes_count_what_waits_and_discard_frees_it():
    buffer = FetchBuffer()
    a, b = state(0, TopicPartition("t", 0)), state(0, TopicPartition("t", 1))
    data = stored_batch(0, values(0, 5))
    buffer.add(a, data)
    buffer.add(b, data)
    assert buffer.buffered_bytes == 2 * len(data)
    buffer.discard(a.tp)
    assert buffer.buffered_bytes == len(data)
    assert {r.partition for r in buffer.drain(100)} == {1}


def test_buffered_data_is_one_object_per_partition_not_one_per_batch():
    """What waits in the buffer until polled lives long enough for the
    garbage collector to move it to its oldest generation, which every full
    collection walks: 500 batches buffered add a handful of objects it
    tracks, not one or more per batch; polling them still yields them all,
    in order, a partial batch at the end left for the next fetch."""
    buffer = FetchBuffer()
    s = state(0)
    data = b"".join(stored_batch(i, values(i, i + 1)) for i in range(500))
    partial = stored_batch(500, values(500, 501))[:-3]
    gc.collect()
    before = len(gc.get_objects())
    assert buffer.add(s, data + partial) == 500
    assert len(gc.get_objects()) - before < 20
    assert [r.offset for r in buffer.drain(1000)] == list(range(500)) and s.position == 500


def test_a_corrupt_batch_stops_its_partition_with_an_error():
    buffer = FetchBuffer()
    s = state(0)
    bad = bytearray(stored_batch(0, values(0, 2)))
    bad[-1] ^= 0xFF
    buffer.add(s, bytes(bad))
    assert buffer.drain(10) == []
    assert isinstance(s.error, CorruptRecordError)


# -- whole batches for readers that decode them (poll_batches) --------------------------------
def test_drain_batches_hands_whole_batches_with_the_position_to_skip_to():
    buffer = FetchBuffer()
    s = state(12)
    buffer.add(s, stored_batch(10, values(10, 15)) + stored_batch(15, values(15, 18)))
    got = buffer.drain_batches(100)
    assert [(b.header.base_offset, b.position) for b in got] == [(10, 12), (15, 15)]
    assert [r.offset for r in iter_records(got[0].data)] == list(range(10, 15))
    assert s.position == 18 and len(buffer) == 0


def test_drain_batches_skips_control_batches_and_stops_near_max_records():
    buffer = FetchBuffer()
    s = state(0)
    buffer.add(s, stored_batch(0, [b"marker"], control=True) + stored_batch(1, values(1, 4))
               + stored_batch(4, values(4, 7)))
    first = buffer.drain_batches(2)  # a whole batch even past max_records
    assert [b.header.base_offset for b in first] == [1] and s.position == 4
    assert [b.header.base_offset for b in buffer.drain_batches(10)] == [4]


def test_drain_batches_after_drain_hands_over_the_rest_of_a_decoded_batch():
    buffer = FetchBuffer()
    s = state(0)
    buffer.add(s, stored_batch(0, values(0, 5)) + stored_batch(5, values(5, 8)))
    assert [r.offset for r in buffer.drain(2)] == [0, 1]
    got = buffer.drain_batches(100)
    assert [(b.header.base_offset, b.position) for b in got] == [(0, 2), (5, 5)]
    assert s.position == 8


def test_drain_batches_stops_a_partition_at_a_corrupt_batch():
    buffer = FetchBuffer()
    s = state(0)
    bad = bytearray(stored_batch(0, values(0, 2)))
    bad[-1] ^= 0xFF
    buffer.add(s, bytes(bad))
    assert buffer.drain_batches(10) == []
    assert isinstance(s.error, CorruptRecordError) and s.position == 0


# -- the consumer, against an in-memory broker ---------------------------------------------
class FakeBroker:
    """Two brokers (A, B) serving metadata, list offsets and fetch from
    in-memory logs. ``leaders`` maps tp -> url; the wrong broker answers
    NOT_LEADER_OR_FOLLOWER with a hint. Records below ``log_start`` are
    gone. Fetches with nothing to return wait (long poll) for appends."""

    def __init__(self):
        self.logs: dict[tuple, list[tuple[int, bytes]]] = {}
        self.log_start: dict[tuple, int] = {}
        self.leaders: dict[tuple, str] = {}
        self.requests = []
        self.in_flight: dict[str, int] = {}
        self.max_in_flight: dict[str, int] = {}
        self.appended = asyncio.Event()

    def append(self, tp, values_):
        log = self.logs.setdefault(tp, [])
        end = self.end(tp)
        log.append((end, stored_batch(end, values_)))
        self.appended.set()

    def end(self, tp):
        log = self.logs.get(tp, [])
        return parse_header(log[-1][1]).next_offset if log else 0

    async def request(self, url, path, body=None, *, timeout_ms=None, method="POST", pieces=True):
        self.requests.append((url, path, body))
        if path == "/v1/metadata":
            topics = sorted({tp[0] for tp in self.logs})
            return {"brokers": [{"id": 1, "url": A}, {"id": 2, "url": B}], "topics": [
                {"name": t, "error": None, "partitions": [
                    {"partition": p, "leader": 1 if self.leaders.get((t, p), A) == A else 2,
                     "leader_epoch": 0} for (name, p) in sorted(self.logs) if name == t]}
                for t in (body["topics"] or topics) if t in topics]}
        self.in_flight[url] = self.in_flight.get(url, 0) + 1
        self.max_in_flight[url] = max(self.max_in_flight.get(url, 0), self.in_flight[url])
        try:
            if path == "/v1/offsets":
                return {"partitions": [self._offset(url, p) for p in body["partitions"]]}
            assert path == "/v1/fetch"
            answer = self._fetch(url, body)
            if not any(p["records"] or p["error"] for p in answer["partitions"]):
                self.appended.clear()
                try:
                    await asyncio.wait_for(self.appended.wait(), body["max_wait_ms"] / 1000)
                except asyncio.TimeoutError:
                    pass
                answer = self._fetch(url, body)
            return answer
        finally:
            self.in_flight[url] -= 1

    def _not_leader(self, url, tp):
        leader = self.leaders.get(tp, A)
        if leader == url:
            return None
        return {"code": "NOT_LEADER_OR_FOLLOWER", "message": "not me",
                "leader_id": 1 if leader == A else 2, "leader_url": leader}

    def _offset(self, url, entry):
        tp = (entry["topic"], entry["partition"])
        result = {"topic": tp[0], "partition": tp[1], "error": self._not_leader(url, tp),
                  "offset": -1, "timestamp": -1}
        if result["error"] is None:
            if entry["timestamp"] == -2:
                result["offset"] = self.log_start.get(tp, 0)
            elif entry["timestamp"] == -1:
                result["offset"] = self.end(tp)
            else:
                result["offset"], result["timestamp"] = -1, -1
        return result

    def _fetch(self, url, body):
        out = []
        for entry in body["partitions"]:
            tp = (entry["topic"], entry["partition"])
            start, end = self.log_start.get(tp, 0), self.end(tp)
            result = {"topic": tp[0], "partition": tp[1], "error": self._not_leader(url, tp),
                      "high_watermark": end, "log_start_offset": start,
                      "log_end_offset": end, "records": b""}
            offset = entry["offset"]
            if result["error"] is None and not start <= offset <= end:
                result["error"] = {"code": "OFFSET_OUT_OF_RANGE", "message": "out"}
            elif result["error"] is None:
                chunks = [data for base, data in self.logs.get(tp, [])
                          if parse_header(data).next_offset > offset]
                taken, size = [], 0
                for data in chunks:
                    if taken and size + len(data) > entry["max_bytes"]:
                        break
                    taken.append(data)
                    size += len(data)
                result["records"] = b"".join(taken)
            out.append(result)
        return {"partitions": out}

    def fetches(self):
        return [(url, body) for url, path, body in self.requests if path == "/v1/fetch"]

    async def close(self):
        pass


def fake_consumer(broker, **settings):
    consumer = AsyncConsumer(A, **{"fetch_max_wait_ms": 50, "retry_backoff_ms": 5, **settings})
    consumer._transport = consumer._metadata.transport = consumer._fetch.transport = broker
    return consumer


async def poll_until(consumer, count, timeout_s=5.0):
    """Poll until ``count`` records arrived (or the deadline fails the test)."""
    records = []
    deadline = asyncio.get_running_loop().time() + timeout_s
    while len(records) < count:
        assert asyncio.get_running_loop().time() < deadline, f"only {len(records)} records"
        records.extend(await consumer.poll(timeout_ms=100))
    return records


async def test_records_of_partitions_on_two_brokers_arrive_in_order():
    broker = FakeBroker()
    broker.leaders[("t", 1)] = B
    for p in (0, 1):
        broker.append(("t", p), values(0, 5))
        broker.append(("t", p), values(5, 8))
    async with fake_consumer(broker, auto_offset_reset="earliest") as consumer:
        consumer.assign([("t", 0), TopicPartition("t", 1)])
        records = await poll_until(consumer, 16)
        for p in (0, 1):
            mine = [r for r in records if r.partition == p]
            assert [r.offset for r in mine] == list(range(8))
            assert [r.value for r in mine] == values(0, 8)
            assert await consumer.position(TopicPartition("t", p)) == 8
    assert broker.max_in_flight[A] == 1 and broker.max_in_flight[B] == 1
    assert {url for url, _ in broker.fetches()} == {A, B}


async def test_a_leader_move_is_followed_without_losing_records():
    broker = FakeBroker()
    broker.append(("t", 0), values(0, 3))
    async with fake_consumer(broker, auto_offset_reset="earliest") as consumer:
        consumer.assign([TP])
        assert [r.offset for r in await poll_until(consumer, 3)] == [0, 1, 2]
        broker.leaders[("t", 0)] = B
        broker.append(("t", 0), values(3, 6))
        assert [r.offset for r in await poll_until(consumer, 3)] == [3, 4, 5]
    assert broker.fetches()[-1][0] == B


async def test_out_of_range_resets_to_the_log_start_with_earliest():
    broker = FakeBroker()
    broker.append(("t", 0), values(0, 5))
    broker.append(("t", 0), values(5, 10))
    broker.log_start[("t", 0)] = 5
    async with fake_consumer(broker, auto_offset_reset="earliest") as consumer:
        consumer.assign([TP])
        consumer.seek(TP, 2)  # deleted by retention
        assert [r.offset for r in await poll_until(consumer, 5)] == list(range(5, 10))


async def test_out_of_range_resets_to_the_end_with_latest():
    broker = FakeBroker()
    broker.append(("t", 0), values(0, 5))
    async with fake_consumer(broker, auto_offset_reset="latest") as consumer:
        consumer.assign([TP])
        consumer.seek(TP, 50)
        assert await consumer.poll(timeout_ms=200) == []
        assert await consumer.position(TP) == 5
        broker.append(("t", 0), values(5, 7))
        assert [r.offset for r in await poll_until(consumer, 2)] == [5, 6]


async def test_out_of_range_with_none_raises_from_poll_until_a_seek():
    broker = FakeBroker()
    broker.append(("t", 0), values(0, 5))
    async with fake_consumer(broker, auto_offset_reset="none") as consumer:
        consumer.assign([TP])
        with pytest.raises(NoOffsetForPartitionError):
            await consumer.poll(timeout_ms=1000)
        consumer.seek(TP, 50)
        with pytest.raises(OffsetOutOfRangeError) as caught:
            for _ in range(50):
                await consumer.poll(timeout_ms=100)
        assert caught.value.partitions == {TP: 50}
        with pytest.raises(OffsetOutOfRangeError):
            await consumer.poll(timeout_ms=0)  # again: nothing changed
        consumer.seek(TP, 3)
        assert [r.offset for r in await poll_until(consumer, 2)] == [3, 4]


async def test_seek_to_beginning_and_end_and_offset_lookups():
    broker = FakeBroker()
    broker.append(("t", 0), values(0, 4))
    broker.log_start[("t", 0)] = 1
    async with fake_consumer(broker, auto_offset_reset="none") as consumer:
        consumer.assign([TP])
        assert await consumer.beginning_offsets([TP]) == {TP: 1}
        assert await consumer.end_offsets([("t", 0)]) == {TP: 4}
        assert await consumer.offsets_for_times({TP: 10**12}) == {TP: None}
        consumer.seek_to_end()
        assert await consumer.position(TP) == 4
        consumer.seek_to_beginning([TP])
        assert [r.offset for r in await poll_until(consumer, 3)] == [1, 2, 3]
        with pytest.raises(ValueError):
            await consumer.position(TopicPartition("t", 9))
    assert OffsetAndTimestamp(1, 2).offset == 1


async def test_prefetching_stops_while_the_buffer_is_full():
    broker = FakeBroker()
    for i in range(10):
        broker.append(("t", 0), values(i * 10, i * 10 + 10))
    one_batch = len(broker.logs[("t", 0)][0][1])
    async with fake_consumer(broker, auto_offset_reset="earliest",
                             max_buffered_bytes=one_batch, max_partition_fetch_bytes=1,
                             max_poll_records=10) as consumer:
        consumer.assign([TP])
        assert [r.offset for r in await poll_until(consumer, 10)] == list(range(10))
        # Let the fetcher run until it stops for the full buffer.
        for _ in range(100):
            await asyncio.sleep(0)
            if not consumer._fetch.in_flight and consumer._buffer.buffered_bytes >= one_batch:
                break
        fetches = len(broker.fetches())
        for _ in range(100):
            consumer._wakeup.set()
            await asyncio.sleep(0)
        assert len(broker.fetches()) == fetches
        assert consumer._buffer.buffered_bytes <= one_batch
        records = await poll_until(consumer, 90)  # and polling lets it go on
        assert [r.offset for r in records] == list(range(10, 100))


async def test_iteration_ends_after_consumer_timeout_ms():
    broker = FakeBroker()
    broker.append(("t", 0), values(0, 3))
    async with fake_consumer(broker, auto_offset_reset="earliest",
                             consumer_timeout_ms=200) as consumer:
        consumer.assign([TP])
        assert [r.value async for r in consumer] == values(0, 3)


def test_batches_straight_from_the_storage_format_decode():
    data = stored_batch(7, values(0, 2), headers=[("h", b"x")])
    (header, view), = iter_batches(data)
    assert [r.headers for r in decode_batch("t", 0, view)] == [(("h", b"x"),)] * 2
    assert not header.attributes & CONTROL_BIT


class OldBroker(FakeBroker):
    """A broker of the version before consumers' fetch sessions: it refuses
    a consumer's fetch that asks for one."""

    async def request(self, url, path, body=None, **kwargs):
        if path == "/v1/fetch" and body.get("session_epoch", -1) != -1:
            self.requests.append((url, path, dict(body)))
            from api.client.errors import KraftlogError
            raise KraftlogError("INVALID_REQUEST",
                                "fetch sessions are for followers (replica_id >= 0)")
        return await super().request(url, path, body, **kwargs)


async def test_a_broker_that_refuses_sessions_is_fetched_from_without_one():
    broker = OldBroker()
    broker.append(("t", 0), values(0, 5))
    async with fake_consumer(broker, auto_offset_reset="earliest") as consumer:
        consumer.assign([TP])
        assert [r.value for r in await poll_until(consumer, 5)] == values(0, 5)
        broker.append(("t", 0), values(5, 8))
        assert [r.value for r in await poll_until(consumer, 3)] == values(5, 8)
    asked, *later = broker.fetches()
    assert asked[1]["session_epoch"] == 0  # offered once ...
    assert later and all("session_epoch" not in body for _, body in later)  # ... then not


def test_a_partition_dropped_after_its_answer_failed_is_listed_as_forgotten():
    """A partition whose answer the consumer could not take (unassigned while
    the fetch was out, its records too large, refused) is no longer what the
    broker's session holds: named again if still fetched there, and listed
    in ``forgotten`` if not, so the broker stops reading it for nobody."""
    session = fetcher.FetchSession()
    other = TopicPartition("t", 1)
    entries = {tp: {"topic": tp.topic, "partition": tp.partition, "offset": 0,
                    "max_bytes": 1024} for tp in (TP, other)}
    keys = {tp: (0, None, 1024, 0, None) for tp in entries}
    session.request({}, entries, keys)
    assert session.answered({"session_id": 7, "partitions": []}, keys)
    session.untell(other)  # e.g. its records arrived after it was unassigned
    body = session.request({}, {TP: entries[TP]}, {TP: keys[TP]})
    assert body["partitions"] == []
    assert body["forgotten"] == [{"topic": "t", "partition": 1}]
    session.answered({"session_id": 7, "partitions": []}, {TP: keys[TP]})
    session.untell(TP)  # still fetched: named again
    assert session.request({}, {TP: entries[TP]}, {TP: keys[TP]})["partitions"] == [entries[TP]]


async def test_the_partitions_of_a_leader_with_a_fetch_in_flight_are_not_looked_at(
        monkeypatch):
    """A consumer of 2,000 partitions led by A and one led by B: while A's
    fetch is in flight, starting B's looks at B's partition alone; the
    partitions are grouped by leader again when the metadata moves one, and
    when the assignment changes."""
    broker = FakeBroker()
    async with fake_consumer(broker) as consumer:
        def answer(leader_of):
            return {"brokers": [{"id": 1, "url": A}, {"id": 2, "url": B}], "topics": [
                {"name": "t", "error": None, "partitions": [
                    {"partition": p, "leader": leader_of(p), "leader_epoch": 0}
                    for p in range(2001)]}]}

        consumer._metadata.apply(answer(lambda p: 2 if p == 2000 else 1), 0)
        consumer.assign([TopicPartition("t", p) for p in range(2001)])
        for s in consumer._states.values():
            s.seek(0)
        fetcher_ = consumer._fetch
        looked = []
        real = PartitionState.fetchable
        monkeypatch.setattr(PartitionState, "fetchable",
                            lambda self, now: looked.append(self.tp.partition) or real(self, now))
        in_flight_elsewhere = asyncio.get_running_loop().create_future()

        def start(urls_in_flight):
            for url in list(fetcher_.in_flight):
                fetcher_.in_flight.pop(url).cancel()
                fetcher_.in_flight_tps.pop(url, None)
            for url in urls_in_flight:
                fetcher_.in_flight[url] = in_flight_elsewhere
            looked.clear()
            fetcher_._start_fetches(0)
            started = {url: sorted(tp.partition for tp in tps)
                       for url, tps in fetcher_.in_flight_tps.items()}
            return started, sorted(looked)

        assert start([A]) == ({B: [2000]}, [2000])
        consumer._metadata.apply(answer(lambda p: 2 if p in (0, 2000) else 1), 0)
        assert start([A]) == ({B: [0, 2000]}, [0, 2000])
        assert start([B])[0] == {A: list(range(1, 2000))}
        consumer.assign([TopicPartition("t", p) for p in (1, 2, 2000)])
        for s in consumer._states.values():
            s.seek(0)
        assert start([B]) == ({A: [1, 2]}, [1, 2])
        for task in fetcher_.in_flight.values():
            task.cancel()
        fetcher_.in_flight.clear()
