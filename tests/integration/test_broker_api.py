"""The broker's HTTP API (docs/protocol.md) against real ``kraftlog node``
processes: produce, fetch, list offsets, metadata, admin, inspection,
metrics and the REST proxy, plus the bad inputs a broker must refuse with a
clear code (never a 500) while it carries on serving.

Two clusters, each shared by this module's tests:
  ``single``  one combined node (broker + controller), with
              ``socket.request.max.bytes`` lowered to 64 KiB for the body
              limit tests; restarted by the persistence test, which runs last;
  ``multi``   one dedicated controller (node 1) and two brokers (2 and 3),
              replication factor 1, for leadership, forwarding and
              leader-stat cases.
Every wait is a condition with a deadline (``wait_until``), or a long-poll
whose duration is itself what is measured.
"""

from __future__ import annotations

import base64
import http.client
import json
import os
import re
import signal
import struct
import threading
import time
import urllib.error
import urllib.request
import zlib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from urllib.parse import urlsplit

import msgpack
import pytest

from chaos.cluster import ProcessCluster, wait_until
from tests.helpers import REQUEST_BYTES_MAX
from protocol.partitioner import partition_for_key
from storage.batch import (ATTRIBUTES_OFFSET, CRC_OFFSET, HEADER_SIZE, MAGIC_OFFSET, BatchBuilder,
                           Compression, build_batch, iter_batches, iter_records)

MSGPACK = "application/msgpack"
JSON = "application/json"
JSON_V2 = "application/vnd.kafka.json.v2+json"
BINARY_V2 = "application/vnd.kafka.binary.v2+json"


# -- HTTP ------------------------------------------------------------------------

@dataclass
class Reply:
    status: int
    content_type: str
    raw: bytes

    @property
    def body(self):
        if self.content_type.startswith(MSGPACK):
            return msgpack.unpackb(self.raw, raw=False, strict_map_key=False)
        if "json" in self.content_type:
            return json.loads(self.raw)
        return self.raw.decode("utf-8", errors="replace")


def send(url: str, data: bytes | None = None, *, method: str | None = None,
         content_type: str | None = MSGPACK, accept: str | None = MSGPACK,
         timeout_s: float = 15.0) -> Reply:
    headers = {}
    if content_type:
        headers["Content-Type"] = content_type
    if accept:
        headers["Accept"] = accept
    request = urllib.request.Request(url, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            return Reply(response.status, response.headers.get("Content-Type", ""),
                         response.read())
    except urllib.error.HTTPError as exc:
        return Reply(exc.code, exc.headers.get("Content-Type", ""), exc.read())


def post(url: str, path: str, body, **kwargs) -> Reply:
    return send(url + path, msgpack.packb(body, use_bin_type=True), **kwargs)


def call(url: str, path: str, body) -> dict:
    """POST msgpack, expect 200, return the decoded answer."""
    reply = post(url, path, body)
    assert reply.status == 200, (path, reply.status, reply.body)
    assert reply.content_type.startswith(MSGPACK), reply.content_type
    return reply.body


def get_json(url: str, path: str) -> dict:
    reply = send(url + path, content_type=None, accept=JSON)
    assert reply.status == 200, (path, reply.status, reply.body)
    return reply.body


def assert_serving(url: str) -> None:
    health = get_json(url, "/healthz")
    assert health["status"] == "ok" and health["state"] == "running", health


def assert_error(reply: Reply, status: int, code: str) -> dict:
    """A whole-request error: the status, and the documented error shape."""
    body = reply.body
    assert reply.status == status, (reply.status, body)
    assert isinstance(body, dict) and set(body) == {"error"}, body
    assert body["error"]["code"] == code, body
    assert isinstance(body["error"]["message"], str) and body["error"]["message"], body
    return body["error"]


# -- the data plane ------------------------------------------------------------------

def create_topic(url: str, name: str, partitions: int = 1, **extra) -> dict:
    answer = call(url, "/v1/admin/topics/create", {"topics": [
        {"name": name, "num_partitions": partitions, "replication_factor": 1, **extra}]})
    (result,) = answer["topics"]
    assert result["error"] is None, result
    return result


def produce(url: str, parts: list[tuple[str, int, bytes]], acks=1, **extra) -> list[dict]:
    answer = call(url, "/v1/produce", {"acks": acks, "timeout_ms": 10_000, "partitions": [
        {"topic": topic, "partition": partition, "records": records, **extra}
        for topic, partition, records in parts]})
    return answer["partitions"]


def produce_ok(url: str, topic: str, partition: int, records: bytes) -> int:
    (result,) = produce(url, [(topic, partition, records)])
    assert result["error"] is None, result
    return result["base_offset"]


def fetch(url: str, specs: list[tuple[str, int, int]], max_wait_ms: int = 0,
          min_bytes: int = 1, max_bytes: int | None = None,
          partition_max_bytes: int | None = None) -> list[dict]:
    body = {"max_wait_ms": max_wait_ms, "min_bytes": min_bytes, "partitions": [
        {"topic": topic, "partition": partition, "offset": offset,
         **({} if partition_max_bytes is None else {"max_bytes": partition_max_bytes})}
        for topic, partition, offset in specs]}
    if max_bytes is not None:
        body["max_bytes"] = max_bytes
    return call(url, "/v1/fetch", body)["partitions"]


def read_all(url: str, topic: str, partition: int, offset: int = 0) -> list[tuple]:
    """Every committed record from ``offset``, as a consumer reads them:
    records below the asked offset in a returned batch are skipped."""
    out = []
    while True:
        (result,) = fetch(url, [(topic, partition, offset)])
        assert result["error"] is None, result
        found = [r for r in decode(result["records"]) if r[0] >= offset]
        if not found:
            assert offset == result["high_watermark"], (offset, result)
            return out
        out.extend(found)
        offset = found[-1][0] + 1


def decode(data: bytes) -> list[tuple]:
    """(offset, timestamp, key, value, headers) of every record, with the
    headers as a tuple of (key, value) tuples."""
    return [(r.offset, r.timestamp, r.key, r.value, tuple(tuple(h) for h in r.headers))
            for _, batch in iter_batches(data, allow_partial_tail=False)
            for r in iter_records(batch)]


def batch_of(records: list[tuple]) -> bytes:
    """A batch of (key, value, headers, timestamp) records."""
    builder = BatchBuilder()
    for key, value, headers, timestamp in records:
        builder.append(key, value, timestamp_ms=timestamp, headers=headers)
    return builder.build()


def offsets_of(url: str, topic: str, partition: int) -> dict:
    """The partition's log figures, from /v1/topics/{topic}."""
    answer = get_json(url, f"/v1/topics/{topic}")
    (entry,) = [p for p in answer["partitions"] if p["partition"] == partition]
    return entry


def log_end(url: str, topic: str, partition: int) -> int:
    return offsets_of(url, topic, partition)["log_end_offset"]


def metadata(url: str, topics: list[str] | None) -> dict:
    return call(url, "/v1/metadata", {"topics": topics})


def now_ms() -> int:
    return int(time.time() * 1000)


def corrupt(batch: bytes, position: int | None = None) -> bytes:
    """The batch with one byte flipped in its records (inside the CRC)."""
    position = len(batch) - 2 if position is None else position
    flipped = bytearray(batch)
    flipped[position] ^= 0xFF
    return bytes(flipped)


def sized_batch(total_bytes: int, tag: str = "x") -> bytes:
    """One record whose batch is exactly ``total_bytes`` long."""
    value_bytes = total_bytes - HEADER_SIZE - 20
    for _ in range(10):
        batch = build_batch([(tag.encode(), b"v" * value_bytes)], timestamp_ms=now_ms())
        if len(batch) == total_bytes:
            return batch
        value_bytes += total_bytes - len(batch)
    raise AssertionError(f"cannot build a batch of exactly {total_bytes} bytes")


# -- clusters ------------------------------------------------------------------------

@pytest.fixture(scope="module")
def multi(tmp_path_factory):
    with ProcessCluster(str(tmp_path_factory.mktemp("multi")), controllers=1, brokers=2,
                        combined=False) as cluster:
        cluster.start()
        cluster.wait_for_active_controller(20)
        cluster.wait_for_brokers_running(timeout_s=20)
        for broker in cluster.broker_ids:
            wait_until(lambda: [b["id"] for b in metadata(
                cluster.nodes[broker].broker_url, [])["brokers"]] == cluster.broker_ids,
                10, f"broker {broker} to see every broker unfenced")
        yield cluster


def wait_for_topic(url: str, topic: str, timeout_s: float = 10.0) -> dict:
    """Until the broker at ``url`` has ``topic`` in its metadata (another
    broker's create may not have reached it yet: a retriable state)."""
    return wait_until(lambda: (t := metadata(url, [topic])["topics"][0])["error"] is None and t,
                      timeout_s, f"{topic} in the metadata of {url}")


# == 1. produce and fetch ==============================================================

def test_produce_many_partitions_assigns_consecutive_offsets_and_fetch_returns_the_records(url):
    topic = "orders"
    create_topic(url, topic, partitions=4)
    (meta,) = metadata(url, [topic])["topics"]
    epochs = {p["partition"]: p["leader_epoch"] for p in meta["partitions"]}
    base_ts = now_ms() - 60_000
    sent: dict[int, list[tuple[bytes, list[tuple]]]] = {p: [] for p in range(4)}
    for round_ in range(2):
        parts = []
        for p in range(4):
            records = [(None if i == 1 else f"k-{p}-{round_}-{i}".encode(),
                        None if i == 2 else f"value {p}/{round_}/{i} ".encode() * (i + 1),
                        [("trace", f"t{i}".encode()), ("empty", None)] if i % 2 == 0 else [],
                        base_ts + 1000 * round_ + 7 * i)
                       for i in range(p + 1 + round_)]
            batch = batch_of(records)
            sent[p].append((batch, records))
            parts.append((topic, p, batch))
        results = produce(url, parts)
        # One answer per partition, in request order; offsets consecutive
        # per partition across requests.
        assert [(r["topic"], r["partition"]) for r in results] == [(topic, p) for p in range(4)]
        for p, result in enumerate(results):
            expected_base = 0 if round_ == 0 else p + 1
            assert result == {"topic": topic, "partition": p, "error": None,
                              "base_offset": expected_base, "log_append_time_ms": -1,
                              "log_start_offset": 0}, result

    fetched = fetch(url, [(topic, p, 0) for p in range(4)])
    assert [(r["topic"], r["partition"]) for r in fetched] == [(topic, p) for p in range(4)]
    for p, result in enumerate(fetched):
        total = (p + 1) + (p + 2)
        assert result["error"] is None, result
        assert (result["high_watermark"], result["log_end_offset"],
                result["log_start_offset"]) == (total, total, 0)
        batches = list(iter_batches(result["records"], allow_partial_tail=False))
        assert len(batches) == 2
        base = 0
        for (header, stored), (original, records) in zip(batches, sent[p]):
            # The same bytes, but for the offset and epoch the leader stamped.
            assert header.base_offset == base
            assert header.partition_leader_epoch == epochs[p]
            assert bytes(stored[MAGIC_OFFSET:]) == original[MAGIC_OFFSET:]
            decoded = [(r.offset, r.timestamp, r.key, r.value,
                        tuple(tuple(h) for h in r.headers)) for r in iter_records(stored)]
            assert decoded == [(base + i, ts, key, value, tuple(tuple(h) for h in headers))
                               for i, (key, value, headers, ts) in enumerate(records)]
            base += len(records)

    # From a middle offset: the batch holding it may start earlier; the
    # first record at or after the offset is the right one.
    p = 3  # offsets 0-3 in the first batch, 4-8 in the second
    for offset in (2, 6, 8):
        (result,) = fetch(url, [(topic, p, offset)])
        assert result["error"] is None, result
        first_header = next(iter_batches(result["records"]))[0]
        assert first_header.base_offset <= offset
        first = next(r for r in decode(result["records"]) if r[0] >= offset)
        round_, i = (0, offset) if offset < 4 else (1, offset - 4)
        key, value, headers, ts = sent[p][round_][1][i]
        assert first == (offset, ts, key, value, tuple(tuple(h) for h in headers))


def test_the_leader_stamps_offsets_and_epoch_over_whatever_the_producer_wrote(url):
    topic = "stamped"
    create_topic(url, topic)
    produce_ok(url, topic, 0, build_batch([(b"k", b"first")]))
    forged = bytearray(build_batch([(b"k", b"second"), (b"k", b"third")]))
    struct.pack_into(">q", forged, 0, 123_456)  # base offset, outside the CRC
    struct.pack_into(">i", forged, 12, 99)      # partition leader epoch, outside the CRC
    assert produce_ok(url, topic, 0, bytes(forged)) == 1
    (meta,) = metadata(url, [topic])["topics"]
    (result,) = fetch(url, [(topic, 0, 1)])
    header = next(iter_batches(result["records"]))[0]
    assert header.base_offset == 1
    assert header.partition_leader_epoch == meta["partitions"][0]["leader_epoch"]
    assert [(r[0], r[3]) for r in read_all(url, topic, 0)] == [
        (0, b"first"), (1, b"second"), (2, b"third")]


# == 2. acks ===========================================================================

def test_acks_zero_answers_nothing_but_appends_and_acks_all_and_bad_acks(url):
    topic = "acks"
    create_topic(url, topic)
    batch = build_batch([(b"a", b"0"), (b"b", b"0")])
    assert call(url, "/v1/produce", {"acks": 0, "partitions": [
        {"topic": topic, "partition": 0, "records": batch}]}) == {"partitions": [],
                                                                  "throttle_time_ms": 0}
    # The records were appended all the same.
    assert [r[0] for r in read_all(url, topic, 0)] == [0, 1]

    for acks in ("all", -1, 1):
        (result,) = produce(url, [(topic, 0, build_batch([(b"c", b"1")]))], acks=acks)
        assert result["error"] is None, (acks, result)
    assert [r[0] for r in read_all(url, topic, 0)] == [0, 1, 2, 3, 4]

    for acks in (2, -2, "one", True):
        reply = post(url, "/v1/produce", {"acks": acks, "partitions": [
            {"topic": topic, "partition": 0, "records": batch}]})
        assert_error(reply, 400, "INVALID_REQUIRED_ACKS")
    assert log_end(url, topic, 0) == 5


def test_concurrent_produces_to_one_partition_get_distinct_consecutive_offsets(url):
    topic = "contended"
    create_topic(url, topic)

    def one(i: int) -> tuple[int, int]:
        batch = build_batch([(f"w{i}".encode(), f"{i}-{j}".encode()) for j in range(1 + i % 3)])
        return produce_ok(url, topic, 0, batch), i

    with ThreadPoolExecutor(max_workers=8) as pool:
        answers = sorted(pool.map(one, range(80)))
    expected = []
    for base, i in answers:
        assert base == len(expected), (base, len(expected))
        expected += [(base + j, f"w{i}".encode(), f"{i}-{j}".encode()) for j in range(1 + i % 3)]
    assert [(r[0], r[2], r[3]) for r in read_all(url, topic, 0)] == expected


# == 3. fetch long-poll and byte limits ================================================

def test_a_fetch_at_the_high_watermark_returns_as_soon_as_records_arrive(url):
    topic = "longpoll"
    create_topic(url, topic)
    produce_ok(url, topic, 0, build_batch([(b"old", b"0")]))
    outcome = {}

    def long_poll():
        started = time.monotonic()
        outcome["result"] = fetch(url, [(topic, 0, 1)], max_wait_ms=3000)
        outcome["elapsed"] = time.monotonic() - started
        outcome["returned_at"] = time.monotonic()

    poller = threading.Thread(target=long_poll)
    poller.start()
    poller.join(timeout=0.5)
    assert poller.is_alive(), f"the fetch did not wait for new records: {outcome}"
    produced_at = time.monotonic()
    produce_ok(url, topic, 0, build_batch([(b"new", b"1"), (b"new", b"2")]))
    poller.join(timeout=5)
    assert not poller.is_alive()
    (result,) = outcome["result"]
    assert result["error"] is None, result
    assert [(r[0], r[2], r[3]) for r in decode(result["records"])] == [
        (1, b"new", b"1"), (2, b"new", b"2")]
    assert outcome["elapsed"] < 3.0, outcome["elapsed"]
    assert outcome["returned_at"] - produced_at < 1.0


def test_a_fetch_with_nothing_new_waits_max_wait_ms_and_returns_empty(url):
    topic = "quiet"
    create_topic(url, topic)
    started = time.monotonic()
    (result,) = fetch(url, [(topic, 0, 0)], max_wait_ms=500)
    elapsed = time.monotonic() - started
    assert result["error"] is None and result["records"] == b"", result
    assert result["high_watermark"] == 0
    assert 0.45 <= elapsed < 2.5, elapsed
    # max_wait_ms 0 answers at once.
    started = time.monotonic()
    (result,) = fetch(url, [(topic, 0, 0)], max_wait_ms=0)
    assert result["records"] == b"" and time.monotonic() - started < 0.4


def test_a_fetch_waits_while_fewer_than_min_bytes_are_available(url):
    topic = "minbytes"
    create_topic(url, topic)
    batch = build_batch([(b"k", b"small")])
    produce_ok(url, topic, 0, batch)
    started = time.monotonic()
    (result,) = fetch(url, [(topic, 0, 0)], max_wait_ms=600, min_bytes=len(batch) + 1)
    elapsed = time.monotonic() - started
    assert elapsed >= 0.55, f"returned after {elapsed:.3f} s with too few bytes"
    assert result["error"] is None and len(decode(result["records"])) == 1  # what there is
    started = time.monotonic()
    (result,) = fetch(url, [(topic, 0, 0)], max_wait_ms=600, min_bytes=len(batch))
    assert time.monotonic() - started < 0.4 and len(decode(result["records"])) == 1


def test_fetch_max_bytes_limit_the_answer_but_always_return_one_whole_batch(url):
    topic = "limits"
    create_topic(url, topic, partitions=2)
    size = 1000
    for p in range(2):
        # Four batches in one records field: appended as four batches.
        produce_ok(url, topic, p, b"".join(sized_batch(size, f"{p}-{i}") for i in range(4)))

    def batches(result):
        assert result["error"] is None, result
        return [h.base_offset for h, _ in iter_batches(result["records"],
                                                        allow_partial_tail=False)]

    # Per partition: as many whole batches as fit.
    (result,) = fetch(url, [(topic, 0, 0)], partition_max_bytes=2 * size + 10)
    assert batches(result) == [0, 1] and len(result["records"]) == 2 * size
    # Below one batch: still one whole batch (KIP-74), so consumers move.
    (result,) = fetch(url, [(topic, 0, 1)], partition_max_bytes=10)
    assert batches(result) == [1] and len(result["records"]) == size
    # The whole response: the first partition gets one batch, the second none.
    first, second = fetch(url, [(topic, 0, 0), (topic, 1, 0)], max_bytes=10)
    assert batches(first) == [0] and batches(second) == []
    # Both limits: 3 batches in all, at most 2 from a partition.
    first, second = fetch(url, [(topic, 0, 0), (topic, 1, 0)], max_bytes=3 * size + 10,
                          partition_max_bytes=2 * size + 10)
    assert batches(first) == [0, 1] and batches(second) == [0]
    # No limit hit: everything.
    first, second = fetch(url, [(topic, 0, 0), (topic, 1, 0)])
    assert batches(first) == batches(second) == [0, 1, 2, 3]


# == 4. list offsets ===================================================================

def test_list_offsets_earliest_latest_and_by_timestamp(url):
    topic = "clock"
    create_topic(url, topic, partitions=2)
    t = now_ms() - 600_000
    produce_ok(url, topic, 0, batch_of([(b"a", b"0", [], t + 1000), (b"b", b"1", [], t + 2000),
                                        (b"c", b"2", [], t + 3000)]))
    produce_ok(url, topic, 0, batch_of([(b"d", b"3", [], t + 4000), (b"e", b"4", [], t + 5000)]))

    def ask(partition, timestamp):
        (result,) = call(url, "/v1/offsets", {"partitions": [
            {"topic": topic, "partition": partition, "timestamp": timestamp}]})["partitions"]
        assert result["error"] is None, result
        assert (result["topic"], result["partition"]) == (topic, partition)
        return result["offset"], result["timestamp"]

    assert ask(0, -2) == (0, -1)
    assert ask(0, -1) == (5, -1)
    assert ask(0, 0) == (0, t + 1000)
    assert ask(0, t + 1000) == (0, t + 1000)
    assert ask(0, t + 1500) == (1, t + 2000)  # inside the first batch
    assert ask(0, t + 3000) == (2, t + 3000)
    assert ask(0, t + 3001) == (3, t + 4000)  # the next batch
    assert ask(0, t + 5000) == (4, t + 5000)
    assert ask(0, t + 5001) == (-1, -1)  # after every record: Kafka's answer
    # An empty partition.
    assert ask(1, -2) == (0, -1)
    assert ask(1, -1) == (0, -1)
    assert ask(1, t) == (-1, -1)
    # Timestamps out of order: the first offset whose timestamp is at or after.
    produce_ok(url, topic, 1, batch_of([(b"late", b"0", [], t + 5000)]))
    produce_ok(url, topic, 1, batch_of([(b"early", b"1", [], t + 1000),
                                        (b"mid", b"2", [], t + 3000)]))
    assert ask(1, t + 500) == (0, t + 5000)
    assert ask(1, t + 2000) == (0, t + 5000)
    assert ask(1, t + 5000) == (0, t + 5000)
    assert ask(1, t + 5001) == (-1, -1)


# == 5. metadata =======================================================================

def test_metadata_names_brokers_topics_and_partitions(single, url):
    topic = "meta"
    created = create_topic(url, topic, partitions=2)
    answer = metadata(url, [topic, "no-such-topic"])
    assert answer["cluster_id"] and answer["controller_id"] == 1
    assert isinstance(answer["metadata_offset"], int) and answer["metadata_offset"] > 0
    assert answer["brokers"] == [{"id": 1, "url": url, "rack": None}]
    known, unknown = answer["topics"]
    assert known["name"] == topic and known["error"] is None
    assert known["topic_id"] == created["topic_id"]
    assert [p["partition"] for p in known["partitions"]] == [0, 1]
    for p in known["partitions"]:
        assert p["leader"] == 1 and p["replicas"] == [1] and p["isr"] == [1]
        assert isinstance(p["leader_epoch"], int) and p["leader_epoch"] >= 0
    assert unknown["name"] == "no-such-topic" and unknown["partitions"] == []
    assert unknown["error"]["code"] == "UNKNOWN_TOPIC_OR_PARTITION"

    # GET with ?topics=, JSON by default and msgpack when asked.
    reply = send(f"{url}/v1/metadata?topics={topic}", content_type=None, accept=None)
    assert reply.status == 200 and reply.content_type.startswith(JSON)
    assert reply.body["topics"] == [known]
    reply = send(f"{url}/v1/metadata?topics={topic},no-such-topic", content_type=None)
    assert reply.content_type.startswith(MSGPACK) and reply.body["topics"] == [known, unknown]
    # No topics named: every topic.
    everything = {t["name"] for t in call(url, "/v1/metadata", {})["topics"]}
    assert topic in everything and "no-such-topic" not in everything


# == 6. admin ==========================================================================

def test_create_answers_each_topic_and_a_produce_right_after_works(url):
    answer = call(url, "/v1/admin/topics/create", {"topics": [
        {"name": "fresh", "num_partitions": 3, "replication_factor": 1,
         "configs": {"retention.ms": "3600000"}}]})
    (created,) = answer["topics"]
    assert created["name"] == "fresh" and created["error"] is None
    assert created["num_partitions"] == 3 and created["replication_factor"] == 1
    assert isinstance(created["topic_id"], str) and created["topic_id"]
    # No retry: the broker answered once its own metadata had the topic.
    for p in range(3):
        assert produce_ok(url, "fresh", p, build_batch([(b"k", b"v")])) == 0

    answer = call(url, "/v1/admin/topics/create", {"topics": [
        {"name": "fresh", "num_partitions": 1}, {"name": "fresh-too", "num_partitions": 1},
        {"name": "bad/name", "num_partitions": 1}, {"name": "..", "num_partitions": 1}]})
    codes = {t["name"]: t["error"] and t["error"]["code"] for t in answer["topics"]}
    assert codes == {"fresh": "TOPIC_ALREADY_EXISTS", "fresh-too": None,
                     "bad/name": "INVALID_TOPIC_EXCEPTION", "..": "INVALID_TOPIC_EXCEPTION"}
    names = {t["name"] for t in metadata(url, None)["topics"]}
    assert "fresh-too" in names and "bad/name" not in names and ".." not in names
    assert len(metadata(url, ["fresh"])["topics"][0]["partitions"]) == 3  # unchanged

    answer = call(url, "/v1/admin/topics/create", {"validate_only": True, "topics": [
        {"name": "hypothetical", "num_partitions": 2}]})
    assert answer["topics"][0]["error"] is None
    assert answer["topics"][0]["num_partitions"] == 2
    assert metadata(url, ["hypothetical"])["topics"][0]["error"]["code"] == \
        "UNKNOWN_TOPIC_OR_PARTITION"


def test_describe_topics_lists_each_topics_configs(url):
    create_topic(url, "described", partitions=2, configs={"max.message.bytes": "4096"})
    answer = call(url, "/v1/admin/topics/describe", {"topics": ["described", "undescribed"]})
    topic, missing = answer["topics"]
    assert topic["error"] is None and len(topic["partitions"]) == 2
    assert missing["error"]["code"] == "UNKNOWN_TOPIC_OR_PARTITION"
    # docs/protocol.md: configs is [{"name", "value", "source"}].
    assert isinstance(topic["configs"], list), topic["configs"]
    configs = {c["name"]: c for c in topic["configs"]}
    assert configs["max.message.bytes"]["value"] == "4096"
    assert configs["max.message.bytes"]["source"] == "TOPIC_CONFIG"


def test_configs_alter_set_and_delete_show_in_describe_and_the_broker_applies_them(url):
    topic = "altered"
    create_topic(url, topic)
    # docs/protocol.md: {"resources": [{"type", "name", "ops": [{"name", "op", "value"}]}]}
    reply = post(url, "/v1/admin/configs/alter", {"resources": [
        {"type": "topic", "name": topic,
         "ops": [{"name": "max.message.bytes", "op": "set", "value": "2048"}]}]})
    assert reply.status == 200, reply.body
    assert reply.body["resources"] == [{"type": "topic", "name": topic, "error": None}]
    answer = call(url, "/v1/admin/configs/describe", {"resources": [
        {"type": "topic", "name": topic, "keys": ["max.message.bytes"]}]})
    (resource,) = answer["resources"]
    assert resource["error"] is None
    (config,) = resource["configs"]
    assert (config["name"], config["value"], config["source"]) == (
        "max.message.bytes", "2048", "TOPIC_CONFIG")
    # The broker applies it at once.
    (result,) = produce(url, [(topic, 0, sized_batch(4096))])
    assert result["error"]["code"] == "MESSAGE_TOO_LARGE", result

    answer = call(url, "/v1/admin/configs/alter", {"resources": [
        {"type": "topic", "name": topic, "ops": [{"name": "max.message.bytes", "op": "delete"}]}]})
    assert answer["resources"] == [{"type": "topic", "name": topic, "error": None}]
    answer = call(url, "/v1/admin/configs/describe", {"resources": [
        {"type": "topic", "name": topic, "keys": ["max.message.bytes"]}]})
    assert answer["resources"][0]["configs"][0]["source"] == "DEFAULT_CONFIG"
    assert produce_ok(url, topic, 0, sized_batch(4096)) == 0
    # Unknown topics and configs: per resource.
    answer = call(url, "/v1/admin/configs/alter", {"resources": [
        {"type": "topic", "name": "no-such-topic",
         "ops": [{"name": "retention.ms", "op": "set", "value": "1000"}]},
        {"type": "topic", "name": topic,
         "ops": [{"name": "retention.mss", "op": "set", "value": "1000"}]}]})
    assert [r["error"]["code"] for r in answer["resources"]] == [
        "UNKNOWN_TOPIC_OR_PARTITION", "INVALID_CONFIG"]


def test_configs_describe_answers_defaults_and_unknown_topics(url):
    create_topic(url, "plain")
    answer = call(url, "/v1/admin/configs/describe", {"resources": [
        {"type": "topic", "name": "plain"}, {"type": "topic", "name": "absent"}]})
    plain, absent = answer["resources"]
    assert plain["error"] is None and (plain["type"], plain["name"]) == ("topic", "plain")
    configs = {c["name"]: c for c in plain["configs"]}
    assert configs["max.message.bytes"]["source"] == "DEFAULT_CONFIG"
    assert configs["retention.ms"]["value"] is not None
    assert absent["error"]["code"] == "UNKNOWN_TOPIC_OR_PARTITION"


def test_added_partitions_take_produce_at_once(url):
    topic = "growing"
    create_topic(url, topic, partitions=1)
    answer = call(url, "/v1/admin/partitions/create", {"topics": [{"name": topic, "count": 3}]})
    assert answer["topics"] == [{"name": topic, "error": None}]
    assert produce_ok(url, topic, 2, build_batch([(b"k", b"new partition")])) == 0
    (meta,) = metadata(url, [topic])["topics"]
    assert [p["partition"] for p in meta["partitions"]] == [0, 1, 2]
    assert read_all(url, topic, 2)[0][3] == b"new partition"


def test_a_deleted_topic_refuses_produce_and_its_directory_goes(single, url):
    topic = "doomed"
    create_topic(url, topic, partitions=2)
    produce_ok(url, topic, 1, build_batch([(b"k", b"v")]))
    directories = [os.path.join(single.base_dir, "data-1", f"{topic}-{p}") for p in range(2)]
    assert all(os.path.isdir(d) for d in directories)
    answer = call(url, "/v1/admin/topics/delete", {"topics": [topic, "never-was"]})
    gone, never = answer["topics"]
    assert gone == {"name": topic, "error": None}
    assert never["name"] == "never-was"
    assert never["error"]["code"] == "UNKNOWN_TOPIC_OR_PARTITION"
    (result,) = produce(url, [(topic, 1, build_batch([(b"k", b"v")]))])
    assert result["error"]["code"] == "UNKNOWN_TOPIC_OR_PARTITION", result
    assert metadata(url, [topic])["topics"][0]["error"]["code"] == "UNKNOWN_TOPIC_OR_PARTITION"
    data_dir = os.path.join(single.base_dir, "data-1")
    wait_until(lambda: not any(name.startswith(f"{topic}-") for name in os.listdir(data_dir)),
               10, f"the directories of {topic} to be deleted")
    # Created again under the same name: a new, empty topic.
    create_topic(url, topic, partitions=2)
    assert read_all(url, topic, 1) == []
    assert produce_ok(url, topic, 1, build_batch([(b"k", b"reborn")])) == 0
    assert [r[3] for r in read_all(url, topic, 1)] == [b"reborn"]


# == 7. bad input ======================================================================

@pytest.fixture(scope="module")
def shaped(single) -> str:
    """A topic the malformed requests name; it must stay empty."""
    create_topic(single.nodes[1].broker_url, "shaped", partitions=2)
    return "shaped"


GOOD = build_batch([(b"k", b"v")], timestamp_ms=1_700_000_000_000)


def _packed(body) -> bytes:
    return msgpack.packb(body, use_bin_type=True)


def _produce_body(**item):
    return _packed({"partitions": [{"topic": "shaped", "partition": 0, "records": GOOD, **item}]})


@pytest.mark.parametrize("path, data, content_type, status, code", [
    pytest.param("/v1/produce", b"\xc1\xc1", MSGPACK, 400, "INVALID_REQUEST", id="bad-msgpack"),
    pytest.param("/v1/produce", _packed({"partitions": []})[:-1] + b"\x92", MSGPACK, 400,
                 "INVALID_REQUEST", id="truncated-msgpack"),
    pytest.param("/v1/produce", b"", MSGPACK, 400, "INVALID_REQUEST", id="empty-body"),
    pytest.param("/v1/produce", b"[1, 2]", JSON, 400, "INVALID_REQUEST", id="json-list"),
    pytest.param("/v1/fetch", b'"partitions"', JSON, 400, "INVALID_REQUEST", id="json-string"),
    pytest.param("/v1/offsets", b"{not json", JSON, 400, "INVALID_REQUEST", id="bad-json"),
    pytest.param("/v1/produce", _packed([{"topic": "shaped"}]), MSGPACK, 400, "INVALID_REQUEST",
                 id="msgpack-list"),
    pytest.param("/v1/produce", b"acks=1", "text/plain", 400, "INVALID_REQUEST",
                 id="wrong-content-type"),
    pytest.param("/v1/produce", _produce_body(partition="x"), MSGPACK, 400, "INVALID_REQUEST",
                 id="partition-string"),
    pytest.param("/v1/produce", _produce_body(partition=-1), MSGPACK, 400, "INVALID_REQUEST",
                 id="partition-negative"),
    pytest.param("/v1/produce", _produce_body(records="not bytes"), MSGPACK, 400,
                 "INVALID_REQUEST", id="records-string"),
    pytest.param("/v1/produce", _produce_body(records=5), MSGPACK, 400, "INVALID_REQUEST",
                 id="records-int"),
    pytest.param("/v1/produce", _produce_body(records=None), MSGPACK, 400, "INVALID_REQUEST",
                 id="records-missing"),
    pytest.param("/v1/produce", _produce_body(topic=None), MSGPACK, 400, "INVALID_REQUEST",
                 id="topic-missing"),
    pytest.param("/v1/produce", _produce_body(topic=7), MSGPACK, 400, "INVALID_REQUEST",
                 id="topic-int"),
    pytest.param("/v1/produce", _produce_body(topic=""), MSGPACK, 400, "INVALID_REQUEST",
                 id="topic-empty"),
    pytest.param("/v1/produce", _produce_body(topic="x" * 250), MSGPACK, 400,
                 "INVALID_REQUEST", id="topic-too-long"),
    pytest.param("/v1/produce", _packed({"acks": 1}), MSGPACK, 400, "INVALID_REQUEST",
                 id="partitions-missing"),
    pytest.param("/v1/produce", _packed({"partitions": {"shaped": GOOD}}), MSGPACK, 400,
                 "INVALID_REQUEST", id="partitions-map"),
    pytest.param("/v1/produce", _packed({"partitions": [5]}), MSGPACK, 400, "INVALID_REQUEST",
                 id="partition-item-int"),
    pytest.param("/v1/produce", _packed({"partitions": [
        {"topic": "shaped", "partition": 0, "records": GOOD},
        {"topic": "shaped", "partition": "1", "records": GOOD}]}), MSGPACK, 400,
        "INVALID_REQUEST", id="second-item-bad"),
    pytest.param("/v1/produce", _packed({"timeout_ms": "soon", "partitions": []}), MSGPACK, 400,
                 "INVALID_REQUEST", id="timeout-string"),
    pytest.param("/v1/fetch", _packed({"partitions": [{"topic": "shaped", "partition": 0}]}),
                 MSGPACK, 400, "INVALID_REQUEST", id="fetch-offset-missing"),
    pytest.param("/v1/fetch", _packed({"max_wait_ms": "soon", "partitions": [
        {"topic": "shaped", "partition": 0, "offset": 0}]}), MSGPACK, 400, "INVALID_REQUEST",
        id="fetch-wait-string"),
    pytest.param("/v1/fetch", _packed({"max_wait_ms": -1, "partitions": []}), MSGPACK, 400,
                 "INVALID_REQUEST", id="fetch-wait-negative"),
    pytest.param("/v1/fetch", _packed({"max_bytes": 0, "partitions": []}), MSGPACK, 400,
                 "INVALID_REQUEST", id="fetch-max-bytes-zero"),
    pytest.param("/v1/fetch", _packed({"partitions": [
        {"topic": "shaped", "partition": 0, "offset": "0"}]}), MSGPACK, 400,
        "INVALID_REQUEST", id="fetch-offset-string"),
    pytest.param("/v1/fetch", _packed({"replica_id": "two", "partitions": [
        {"topic": "shaped", "partition": 0, "offset": 0}]}), MSGPACK, 400, "INVALID_REQUEST",
        id="fetch-replica-id-string"),
    pytest.param("/v1/fetch", _packed({"replica_id": -2, "partitions": []}), MSGPACK, 400,
                 "INVALID_REQUEST", id="fetch-replica-id-negative"),
    pytest.param("/v1/fetch", _packed({"replica_id": 2, "partitions": [
        {"topic": "shaped", "partition": 0, "offset": 0, "last_fetched_epoch": -5}]}),
        MSGPACK, 400, "INVALID_REQUEST", id="fetch-last-epoch-negative"),
    pytest.param("/v1/fetch", _packed({"partitions": [
        {"topic": "shaped", "partition": 0, "offset": 0, "last_fetched_epoch": [1]}]}),
        MSGPACK, 400, "INVALID_REQUEST", id="fetch-last-epoch-list"),
    pytest.param("/v1/offsets", _packed({"partitions": [{"topic": "shaped", "partition": 0}]}),
                 MSGPACK, 400, "INVALID_REQUEST", id="offsets-timestamp-missing"),
    pytest.param("/v1/offsets", _packed({"partitions": [
        {"topic": "shaped", "partition": 0, "timestamp": -3}]}), MSGPACK, 400,
        "INVALID_REQUEST", id="offsets-timestamp-bad"),
    pytest.param("/v1/metadata", _packed({"topics": "shaped"}), MSGPACK, 400, "INVALID_REQUEST",
                 id="metadata-topics-string"),
    pytest.param("/v1/metadata", _packed({"topics": [1]}), MSGPACK, 400, "INVALID_REQUEST",
                 id="metadata-topic-int"),
    pytest.param("/v1/metadata", b'{"topics": ["\\ud800"]}', JSON, 400, "INVALID_REQUEST",
                 id="json-lone-surrogate"),
    pytest.param("/v1/admin/topics/create", b"\xc1", MSGPACK, 400, "INVALID_REQUEST",
                 id="admin-bad-msgpack"),
    pytest.param("/v1/admin/topics/create", _packed({"topics": "x"}), MSGPACK, 400,
                 "INVALID_REQUEST", id="admin-topics-string"),
    pytest.param("/v1/admin/topics/describe", _packed({"topics": 5}), MSGPACK, 400,
                 "INVALID_REQUEST", id="describe-topics-int"),
    pytest.param("/topics/shaped", b"{not json", JSON, 400, "INVALID_REQUEST",
                 id="rest-bad-json"),
    pytest.param("/topics/shaped", b'{"records": "x"}', JSON_V2, 400, "INVALID_REQUEST",
                 id="rest-records-string"),
])
def test_malformed_requests_get_a_clear_error_and_the_broker_carries_on(
        url, shaped, path, data, content_type, status, code):
    reply = send(url + path, data, content_type=content_type, accept=JSON)
    assert reply.content_type.startswith(JSON), reply
    assert_error(reply, status, code)
    assert_serving(url)
    # A refused request appends nothing, not even its good parts.
    assert log_end(url, shaped, 0) == 0 and log_end(url, shaped, 1) == 0


def _oversized_produce(topic: str) -> bytes:
    body = _packed({"partitions": [{"topic": topic, "partition": 0,
                                    "records": sized_batch(REQUEST_BYTES_MAX + 4096)}]})
    assert len(body) > REQUEST_BYTES_MAX
    return body


def test_a_body_above_socket_request_max_bytes_is_refused_by_its_content_length(url):
    topic = "big-bodies"
    create_topic(url, topic)
    reply = send(url + "/v1/produce", _oversized_produce(topic))
    assert_error(reply, 413, "MESSAGE_TOO_LARGE")
    assert_serving(url)
    assert log_end(url, topic, 0) == 0
    reply = rest_produce(url, topic, [{"value": "x" * REQUEST_BYTES_MAX}])
    assert_error(reply, 413, "MESSAGE_TOO_LARGE")
    assert_serving(url)
    assert log_end(url, topic, 0) == 0
    # A body just under the limit is fine.
    assert produce_ok(url, topic, 0, sized_batch(REQUEST_BYTES_MAX - 1024)) == 0


def test_a_chunked_body_above_socket_request_max_bytes_is_refused(url):
    topic = "big-chunks"
    create_topic(url, topic)
    # No Content-Length: the body comes chunked, and is refused once the
    # bytes read pass the limit.
    reply = _post_chunked(url, "/v1/produce", _oversized_produce(topic))
    assert_error(reply, 413, "MESSAGE_TOO_LARGE")
    assert_serving(url)
    assert log_end(url, topic, 0) == 0


def _produce_body_of(size: int, topic: str) -> bytes:
    """A produce request body of exactly ``size`` bytes."""
    batch_bytes = size - 60
    for _ in range(10):
        body = _packed({"partitions": [{"topic": topic, "partition": 0,
                                        "records": sized_batch(batch_bytes)}]})
        if len(body) == size:
            return body
        batch_bytes += size - len(body)
    raise AssertionError(f"cannot build a request body of exactly {size} bytes")


def _post_chunked(url: str, path: str, body: bytes) -> Reply:
    split = urlsplit(url)
    connection = http.client.HTTPConnection(split.hostname, split.port, timeout=15)
    try:
        chunks = [body[i:i + 8192] for i in range(0, len(body), 8192)]
        try:
            connection.request("POST", path, body=iter(chunks), encode_chunked=True,
                               headers={"Content-Type": MSGPACK, "Accept": MSGPACK})
        except (BrokenPipeError, ConnectionResetError):
            pass
        response = connection.getresponse()
        return Reply(response.status, response.getheader("Content-Type", ""), response.read())
    finally:
        connection.close()


def test_a_body_of_exactly_socket_request_max_bytes_is_accepted_one_more_byte_is_not(url):
    topic = "boundary"
    create_topic(url, topic)
    at_limit = _produce_body_of(REQUEST_BYTES_MAX, topic)
    over_limit = _produce_body_of(REQUEST_BYTES_MAX + 1, topic)
    for deliver in (lambda body: send(url + "/v1/produce", body),
                    lambda body: _post_chunked(url, "/v1/produce", body)):
        reply = deliver(at_limit)
        assert reply.status == 200, reply.body
        assert reply.body["partitions"][0]["error"] is None, reply.body
        assert_error(deliver(over_limit), 413, "MESSAGE_TOO_LARGE")
    assert log_end(url, topic, 0) == 2
    assert_serving(url)


def test_a_batch_above_max_message_bytes_is_refused_and_nothing_is_appended(url):
    topic = "small-batches"
    create_topic(url, topic, partitions=2, configs={"max.message.bytes": "2048"})
    results = produce(url, [(topic, 0, sized_batch(4096)), (topic, 1, sized_batch(1024))])
    assert results[0]["error"]["code"] == "MESSAGE_TOO_LARGE", results
    assert results[1]["error"] is None and results[1]["base_offset"] == 0
    # A small batch followed by a large one: none of them.
    (result,) = produce(url, [(topic, 0, sized_batch(1024) + sized_batch(4096))])
    assert result["error"]["code"] == "MESSAGE_TOO_LARGE", result
    assert (log_end(url, topic, 0), log_end(url, topic, 1)) == (0, 1)
    assert produce_ok(url, topic, 0, sized_batch(2048)) == 0  # the limit itself is allowed
    assert_serving(url)


def test_a_corrupt_batch_is_refused_and_nothing_of_its_partition_is_appended(url):
    topic = "crc"
    create_topic(url, topic)
    good = build_batch([(b"k1", b"first"), (b"k2", b"second")])
    for bad in (corrupt(good),                     # in the records
                corrupt(good, HEADER_SIZE - 10),   # in the header, inside the CRC
                good[:-5]):                        # cut short
        (result,) = produce(url, [(topic, 0, bad)])
        assert result["error"]["code"] == "CORRUPT_MESSAGE", result
        assert result["error"]["message"]
        # The second batch of a records field is corrupt: all or none.
        (result,) = produce(url, [(topic, 0, good + bad)])
        assert result["error"]["code"] == "CORRUPT_MESSAGE", result
        (result,) = produce(url, [(topic, 0, bad + good)])
        assert result["error"]["code"] == "CORRUPT_MESSAGE", result
        assert log_end(url, topic, 0) == 0
    assert read_all(url, topic, 0) == []
    # Empty records: nothing to append.
    (result,) = produce(url, [(topic, 0, b"")])
    assert result["error"]["code"] == "INVALID_RECORD", result
    assert produce_ok(url, topic, 0, good + good) == 0
    assert [r[3] for r in read_all(url, topic, 0)] == [b"first", b"second"] * 2
    assert_serving(url)


def test_gzip_batches_are_stored_as_sent_and_unknown_codecs_refused(url):
    topic = "compressed"
    create_topic(url, topic)
    gzipped = build_batch([(f"k{i}".encode(), b"gz" * 200) for i in range(5)],
                          compression=Compression.GZIP)
    assert len(gzipped) < 5 * 400
    assert produce_ok(url, topic, 0, gzipped) == 0
    (result,) = fetch(url, [(topic, 0, 0)])
    assert result["records"][MAGIC_OFFSET:] == gzipped[MAGIC_OFFSET:]
    assert [(r[0], r[2], r[3]) for r in decode(result["records"])] == [
        (i, f"k{i}".encode(), b"gz" * 200) for i in range(5)]
    zstd = bytearray(build_batch([(b"k", b"v")]))
    struct.pack_into(">h", zstd, ATTRIBUTES_OFFSET, int(Compression.ZSTD))
    struct.pack_into(">I", zstd, CRC_OFFSET, zlib.crc32(zstd[ATTRIBUTES_OFFSET:]) & 0xFFFFFFFF)
    (result,) = produce(url, [(topic, 0, bytes(zstd))])
    assert result["error"]["code"] == "UNSUPPORTED_COMPRESSION_TYPE", result
    assert log_end(url, topic, 0) == 5


def test_unknown_topics_and_partitions_get_their_own_errors(url):
    topic = "known"
    create_topic(url, topic, partitions=2)
    batch = build_batch([(b"k", b"v")])
    results = produce(url, [("unknown-topic", 0, batch), (topic, 2, batch), (topic, 1, batch)])
    assert results[0]["error"]["code"] == "UNKNOWN_TOPIC_OR_PARTITION"
    assert results[1]["error"]["code"] == "UNKNOWN_TOPIC_OR_PARTITION"
    assert results[2]["error"] is None and results[2]["base_offset"] == 0  # the others carry on
    results = fetch(url, [("unknown-topic", 0, 0), (topic, 7, 0), (topic, 1, 0)])
    assert [r["error"] and r["error"]["code"] for r in results] == [
        "UNKNOWN_TOPIC_OR_PARTITION", "UNKNOWN_TOPIC_OR_PARTITION", None]
    answer = call(url, "/v1/offsets", {"partitions": [
        {"topic": "unknown-topic", "partition": 0, "timestamp": -1},
        {"topic": topic, "partition": 9, "timestamp": -1},
        {"topic": topic, "partition": 1, "timestamp": -1}]})
    assert [(r["error"] and r["error"]["code"], r["offset"]) for r in answer["partitions"]] == [
        ("UNKNOWN_TOPIC_OR_PARTITION", -1), ("UNKNOWN_TOPIC_OR_PARTITION", -1), (None, 1)]
    assert_serving(url)


def test_a_produce_to_an_invalid_topic_name_is_refused_and_creates_nothing(single, url):
    data_dir = os.path.join(single.base_dir, "data-1")
    before = set(os.listdir(data_dir))
    batch = build_batch([(b"k", b"v")])
    names = ["bad/name", "../escape", ".", "..", "sp ace", "dollar$"]
    results = produce(url, [(name, 0, batch) for name in names])
    for name, result in zip(names, results):
        assert result["topic"] == name
        # Not UNKNOWN_TOPIC_OR_PARTITION: that one is retriable, and this
        # name can never work.
        assert result["error"]["code"] == "INVALID_TOPIC_EXCEPTION", result
    assert set(os.listdir(data_dir)) == before
    assert not os.path.exists(os.path.join(single.base_dir, "escape-0"))
    assert_serving(url)


def test_a_fetch_outside_the_log_is_offset_out_of_range_with_the_bounds(url):
    topic = "bounded"
    create_topic(url, topic)
    produce_ok(url, topic, 0, build_batch([(b"k", b"v")] * 3))
    for offset in (-1, -(2**40), 4, 10**12):
        (result,) = fetch(url, [(topic, 0, offset)])
        error = result["error"]
        assert error["code"] == "OFFSET_OUT_OF_RANGE", result
        assert (error["log_start_offset"], error["log_end_offset"]) == (0, 3), error
        assert (result["log_start_offset"], result["high_watermark"]) == (0, 3), result
        assert result["records"] == b""
    # The log end itself is valid: nothing yet.
    (result,) = fetch(url, [(topic, 0, 3)])
    assert result["error"] is None and result["records"] == b""


def test_a_partition_twice_in_one_produce_is_refused_the_second_time(url):
    topic = "twice"
    create_topic(url, topic)
    first, second = produce(url, [(topic, 0, build_batch([(b"a", b"1")])),
                                  (topic, 0, build_batch([(b"b", b"2")]))])
    assert first["error"] is None and first["base_offset"] == 0
    assert second["error"]["code"] == "INVALID_REQUEST", second
    assert [r[3] for r in read_all(url, topic, 0)] == [b"1"]


def test_unknown_endpoints_are_404_and_wrong_methods_405(url):
    reply = send(url + "/v1/nothing-here", content_type=None, accept=None)
    assert reply.content_type.startswith(JSON)
    assert_error(reply, 404, "NOT_FOUND")
    reply = send(url + "/v1/nothing-here", _packed({}), accept=JSON)
    assert_error(reply, 404, "NOT_FOUND")
    for method, path in (("GET", "/v1/produce"), ("GET", "/v1/fetch"),
                         ("PUT", "/v1/metadata"), ("POST", "/healthz"),
                         ("DELETE", "/v1/topics/shaped")):
        reply = send(url + path, method=method, content_type=None, accept=JSON)
        assert reply.status == 405, (method, path, reply.status, reply.body)
        assert reply.content_type.startswith(JSON)
        assert reply.body["error"]["code"] and reply.body["error"]["message"]
    assert_serving(url)


# == 9. inspection and metrics (single node) ===========================================

SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$')
LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def scrape(url: str) -> dict[tuple, float]:
    reply = send(url + "/metrics", content_type=None, accept=None)
    assert reply.status == 200 and reply.content_type.startswith("text/plain"), reply
    samples = {}
    for line in reply.body.splitlines():
        if not line or line.startswith("#"):
            continue
        match = SAMPLE.match(line)
        assert match, f"not a Prometheus sample: {line!r}"
        name, labels, value = match.groups()
        samples[(name, frozenset(LABEL.findall(labels or "")))] = float(value)
    return samples


def sample(samples: dict, name: str, **labels) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


def test_metrics_count_requests_bytes_and_messages_exactly(url):
    topic = "metered"
    create_topic(url, topic, partitions=2)
    before = scrape(url)
    batches = [(0, build_batch([(b"k", b"v")] * 2)), (1, build_batch([(b"k", b"w")] * 3)),
               (0, build_batch([(None, b"x" * 100)] * 5))]
    for partition, batch in batches:
        produce_ok(url, topic, partition, batch)
    fetch(url, [(topic, 0, 0), (topic, 1, 0)])
    after = scrape(url)

    def grew(name, **labels):
        return sample(after, name, **labels) - sample(before, name, **labels)

    assert grew("kraftlog_messages_in_total", topic=topic) == 10
    assert grew("kraftlog_bytes_in_total", topic=topic) == sum(len(b) for _, b in batches)
    assert grew("kraftlog_messages_out_total", topic=topic) == 10
    assert grew("kraftlog_bytes_out_total", topic=topic) == sum(len(b) for _, b in batches)
    assert grew("kraftlog_requests_total", api="/v1/produce", code="200") == 3
    assert grew("kraftlog_requests_total", api="/v1/fetch", code="200") == 1
    assert grew("kraftlog_request_latency_seconds_count", api="/v1/produce") == 3
    assert grew("kraftlog_request_latency_seconds_bucket", api="/v1/produce", le="+Inf") == 3
    assert sample(after, "kraftlog_request_latency_seconds_sum", api="/v1/produce") > 0
    health = get_json(url, "/healthz")
    assert sample(after, "kraftlog_partitions") == health["partitions"] > 0
    assert sample(after, "kraftlog_leader_partitions") == health["partitions"]
    # Refused requests are counted under their status too.
    assert_error(post(url, "/v1/produce", {"acks": 7, "partitions": []}), 400,
                 "INVALID_REQUIRED_ACKS")
    assert sample(scrape(url), "kraftlog_requests_total", api="/v1/produce", code="400") >= 1


def test_the_event_loop_lag_is_measured_ten_times_a_second(url):
    """`kraftlog_event_loop_lag_seconds`: how late the broker's event loop
    runs a timer due every 100 ms (what a request arriving then waits before
    it is read); an idle broker's lag sits in the low buckets."""
    before = scrape(url)
    count = "kraftlog_event_loop_lag_seconds_count"
    wait_until(lambda: sample(scrape(url), count) >= sample(before, count) + 5, 10,
               "five more measurements of the event loop's lag")
    after = scrape(url)
    total = sample(after, count)
    assert sample(after, "kraftlog_event_loop_lag_seconds_bucket", le="+Inf") == total
    assert sample(after, "kraftlog_event_loop_lag_seconds_bucket", le="1.0") >= total * 0.9


# == 10. REST proxy (single node) ======================================================

def rest_produce(url: str, topic: str, records: list[dict], content_type: str = JSON_V2,
                 raw: bytes | None = None) -> Reply:
    data = json.dumps({"records": records}).encode() if raw is None else raw
    return send(f"{url}/topics/{topic}", data, content_type=content_type, accept=None)


def rest_read(url: str, topic: str, partition: int, offset: int, binary: bool = False) -> Reply:
    return send(f"{url}/topics/{topic}/partitions/{partition}/records?offset={offset}",
                content_type=None, accept=BINARY_V2 if binary else JSON_V2)


def compact(value) -> bytes:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()


def test_rest_json_records_go_where_the_java_client_sends_them_and_read_back(url):
    topic = "rest-json"
    create_topic(url, topic, partitions=4)
    records = [{"key": f"user-{i}", "value": {"n": i, "tags": ["a", "b"], "ok": True}}
               for i in range(12)]
    records += [{"key": {"id": 7, "region": "eu"}, "value": [1, 2.5, None]},
                {"key": "ключ", "value": "текст"},
                {"value": {"explicit": True}, "partition": 3},
                {"key": "user-1", "value": "pinned", "partition": 0}]
    reply = rest_produce(url, topic, records)
    assert reply.status == 200, reply.body
    answer = reply.body
    assert answer["key_schema_id"] is None and answer["value_schema_id"] is None
    next_offset = {p: 0 for p in range(4)}
    expected = {p: [] for p in range(4)}
    assert len(answer["offsets"]) == len(records)
    for record, got in zip(records, answer["offsets"]):
        partition = record.get("partition", partition_for_key(compact(record.get("key")), 4))
        assert got == {"partition": partition, "offset": next_offset[partition],
                       "error_code": None, "error": None}, (record, got)
        expected[partition].append((next_offset[partition], record.get("key"), record["value"]))
        next_offset[partition] += 1
    assert len({o["partition"] for o in answer["offsets"]}) > 1  # keys did spread

    for partition in range(4):
        reply = rest_read(url, topic, partition, 0)
        assert reply.status == 200, reply.body
        rows = reply.body
        assert [(r["offset"], r["key"], r["value"]) for r in rows] == expected[partition]
        for row in rows:
            assert row["topic"] == topic and row["partition"] == partition
            assert abs(row["timestamp"] - now_ms()) < 60_000
        # The bytes stored are the compact JSON text, as a consumer sees them.
        stored = read_all(url, topic, partition)
        assert [(r[2], r[3]) for r in stored] == [
            (None if k is None else compact(k), compact(v)) for _, k, v in expected[partition]]
    # From a later offset.
    reply = rest_read(url, topic, 3, 1)
    assert [r["offset"] for r in reply.body] == [o for o, _, _ in expected[3][1:]]


def test_rest_binary_records_round_trip_base64_and_keyless_ones_stick_to_one_partition(url):
    topic = "rest-binary"
    create_topic(url, topic, partitions=3)
    keys = [b"\x00\xff key", b"k2", b""]
    values = [b"\x00\x01\x02", b"\xff" * 40, b"plain"]
    records = [{"key": base64.b64encode(k).decode(), "value": base64.b64encode(v).decode()}
               for k, v in zip(keys, values)]
    reply = rest_produce(url, topic, records, content_type=BINARY_V2)
    assert reply.status == 200, reply.body
    for key, got in zip(keys, reply.body["offsets"]):
        assert got["partition"] == partition_for_key(key, 3) and got["error"] is None
    for key, value, got in zip(keys, values, reply.body["offsets"]):
        rows = rest_read(url, topic, got["partition"], got["offset"], binary=True).body
        assert rows[0]["offset"] == got["offset"]
        assert (rows[0]["key"], rows[0]["value"]) == (base64.b64encode(key).decode(),
                                                      base64.b64encode(value).decode())
        (stored,) = [r for r in read_all(url, topic, got["partition"]) if r[0] == got["offset"]]
        assert (stored[2], stored[3]) == (key, value)

    keyless = [{"value": base64.b64encode(f"v{i}".encode()).decode()} for i in range(5)]
    reply = rest_produce(url, topic, keyless, content_type=BINARY_V2)
    assert reply.status == 200, reply.body
    (partition,) = {o["partition"] for o in reply.body["offsets"]}
    offsets = [o["offset"] for o in reply.body["offsets"]]
    assert offsets == list(range(offsets[0], offsets[0] + 5))


def test_rest_null_values_are_tombstones_and_read_back_as_null(url):
    topic = "rest-tombstones"
    create_topic(url, topic, configs={"cleanup.policy": "compact"})
    reply = rest_produce(url, topic, [{"key": "user-1", "value": {"n": 1}, "partition": 0},
                                      {"key": "user-1", "value": None, "partition": 0},
                                      {"key": "user-2", "partition": 0}])  # value left out
    assert reply.status == 200, reply.body
    assert [o["offset"] for o in reply.body["offsets"]] == [0, 1, 2]
    # Stored as a null value (a tombstone), not as the JSON text "null".
    assert [(r[2], r[3]) for r in read_all(url, topic, 0)] == [
        (b'"user-1"', b'{"n":1}'), (b'"user-1"', None), (b'"user-2"', None)]
    rows = rest_read(url, topic, 0, 0).body
    assert [(r["key"], r["value"]) for r in rows] == [
        ("user-1", {"n": 1}), ("user-1", None), ("user-2", None)]

    # The binary format tells a null value from the bytes of the text null,
    # which the json format reads as null too (docs/protocol.md).
    key = base64.b64encode(b"k").decode()
    reply = rest_produce(url, topic, [
        {"key": key, "value": None, "partition": 0},
        {"key": key, "value": base64.b64encode(b"null").decode(), "partition": 0}],
        content_type=BINARY_V2)
    assert reply.status == 200, reply.body
    assert [(r[2], r[3]) for r in read_all(url, topic, 0, 3)] == [(b"k", None), (b"k", b"null")]
    binary = rest_read(url, topic, 0, 3, binary=True).body
    assert [r["value"] for r in binary] == [None, base64.b64encode(b"null").decode()]
    assert [r["value"] for r in rest_read(url, topic, 0, 3).body] == [None, None]


def strict_json(raw: bytes):
    """Parse as RFC 8259 JSON: NaN and Infinity are not JSON."""
    def refuse(constant):
        raise ValueError(f"{constant} is not JSON")
    return json.loads(raw, parse_constant=refuse)


def test_rest_reads_answer_strict_json_even_for_nan_like_values(url):
    topic = "rest-nan"
    create_topic(url, topic)
    texts = [b"NaN", b"Infinity", b"-Infinity"]
    reply = rest_produce(url, topic, [{"value": base64.b64encode(t).decode(), "partition": 0}
                                      for t in texts], content_type=BINARY_V2)
    assert reply.status == 200, reply.body
    # docs/protocol.md: "in the json format a key or value that is not JSON
    # text comes back as a string"; NaN and Infinity are not JSON text.
    reply = rest_read(url, topic, 0, 0)
    assert reply.status == 200
    rows = strict_json(reply.raw)
    assert [r["value"] for r in rows] == [t.decode() for t in texts]


def test_rest_json_values_that_are_not_json_are_refused_or_read_back_as_json(url):
    topic = "rest-nan-in"
    create_topic(url, topic)
    reply = rest_produce(url, topic, [], raw=b'{"records": [{"value": NaN, "partition": 0}]}')
    if reply.status == 400:
        assert_error(reply, 400, "INVALID_REQUEST")
        assert log_end(url, topic, 0) == 0
    else:
        assert reply.status == 200, reply.body
        strict_json(rest_read(url, topic, 0, 0).raw)  # whatever it stored, valid JSON back


def test_rest_errors_are_per_record_when_one_partition_refuses(url):
    topic = "rest-partial"
    create_topic(url, topic, partitions=2, configs={"max.message.bytes": "2048"})
    records = [{"value": "small", "partition": 1}, {"value": "x" * 4000, "partition": 0},
               {"value": "small too", "partition": 1}]
    reply = rest_produce(url, topic, records)
    assert reply.status == 200, reply.body
    ok1, refused, ok2 = reply.body["offsets"]
    assert ok1 == {"partition": 1, "offset": 0, "error_code": None, "error": None}
    assert ok2 == {"partition": 1, "offset": 1, "error_code": None, "error": None}
    assert refused["partition"] == 0 and refused["offset"] is None
    # Confluent's shape: a number (1: a retry cannot help), the name in "error".
    assert refused["error_code"] == 1 and refused["error"].startswith("MESSAGE_TOO_LARGE: ")
    assert (log_end(url, topic, 0), log_end(url, topic, 1)) == (0, 2)


def test_rest_headers_travel_both_ways_and_reads_start_from_a_time(url):
    topic = "rest-headers"
    create_topic(url, topic)
    reply = rest_produce(url, topic, [
        {"value": "a", "headers": [{"key": "trace", "value": "t-1"}, {"key": "empty",
                                                                         "value": None}]},
        {"value": "b"}])
    assert reply.status == 200, reply.body
    later_ms = now_ms() + 5  # the next record's timestamp is strictly later
    while now_ms() < later_ms:
        time.sleep(0.001)
    binary = rest_produce(url, topic, [{"value": base64.b64encode(b"c").decode(), "headers": [
        {"key": "raw", "value": base64.b64encode(b"\x00\xff").decode()}]}],
        content_type=BINARY_V2)
    assert binary.status == 200, binary.body
    rows = rest_read(url, topic, 0, 0).body
    assert [r["headers"] for r in rows] == [  # json: values as UTF-8 text
        [{"key": "trace", "value": "t-1"}, {"key": "empty", "value": None}], [],
        [{"key": "raw", "value": "\x00\ufffd"}]]
    assert rest_read(url, topic, 0, 2, binary=True).body[0]["headers"] == [
        {"key": "raw", "value": base64.b64encode(b"\x00\xff").decode()}]
    # What a consumer sees: the same headers, bytes as sent.
    assert [r[4] for r in read_all(url, topic, 0)] == [
        (("trace", b"t-1"), ("empty", None)), (), (("raw", b"\x00\xff"),)]

    # From a time: the first record at or after it, as offsetsForTimes.
    stamps = [r["timestamp"] for r in rows]
    assert stamps[2] > stamps[1], stamps
    at = send(f"{url}/topics/{topic}/partitions/0/records?timestamp={stamps[2]}",
              content_type=None, accept=JSON_V2)
    assert at.status == 200 and [r["offset"] for r in at.body] == [2], at.body
    found = send(f"{url}/topics/{topic}/partitions/0/offsets?timestamp={stamps[1] + 1}",
                 content_type=None, accept=JSON_V2)
    assert found.status == 200 and found.body == {"offset": 2}, found.body
    ends = send(f"{url}/topics/{topic}/partitions/0/offsets", content_type=None, accept=JSON_V2)
    assert ends.body == {"beginning_offset": 0, "end_offset": 3}, ends.body
    none = send(f"{url}/topics/{topic}/partitions/0/offsets?timestamp={now_ms() + 3_600_000}",
                content_type=None, accept=JSON_V2)
    assert none.body == {"offset": None}, none.body
    later = send(f"{url}/topics/{topic}/partitions/0/records?timestamp={now_ms() + 3_600_000}",
                 content_type=None, accept=JSON_V2)
    assert later.status == 200 and later.body == []
    for query in ("timestamp=-1", "timestamp=soon", "timestamp=1&offset=0"):
        assert_error(send(f"{url}/topics/{topic}/partitions/0/records?{query}",
                          content_type=None, accept=JSON_V2), 400, "INVALID_REQUEST")
    for query in ("timestamp=-1", "timestamp=soon", "isolation_level=dirty"):
        assert_error(send(f"{url}/topics/{topic}/partitions/0/offsets?{query}",
                          content_type=None, accept=JSON_V2), 400, "INVALID_REQUEST")
    assert_error(send(f"{url}/topics/{topic}/partitions/7/offsets", content_type=None,
                      accept=JSON_V2), 404, "UNKNOWN_TOPIC_OR_PARTITION")
    # Bad headers: refused whole, nothing written.
    for headers in ("h", [{"value": "x"}], [{"key": 5, "value": "x"}],
                    [{"key": "k", "value": 5}], [{"key": "k", "value": {"a": 1}}],
                    [{"key": "\ud800", "value": "x"}], [{"key": "k", "value": "\ud800"}]):
        assert_error(rest_produce(url, topic, [{"value": 1, "headers": headers}]), 400,
                     "INVALID_REQUEST")
    assert_error(rest_produce(url, topic, [{"value": "Yw==", "headers": [
        {"key": "k", "value": "not base64!"}]}], content_type=BINARY_V2), 400, "INVALID_REQUEST")
    assert log_end(url, topic, 0) == 3
    assert_serving(url)


def test_rest_bad_base64_and_unknown_topics_are_refused(url):
    topic = "rest-bad"
    create_topic(url, topic)
    for bad in ("not base64!", "abc", 5):
        reply = rest_produce(url, topic, [{"value": bad}], content_type=BINARY_V2)
        assert_error(reply, 400, "INVALID_REQUEST")
    assert_error(rest_produce(url, topic, [{"value": 1, "partition": 1}]), 400, "INVALID_REQUEST")
    assert_error(rest_produce(url, topic, []), 400, "INVALID_REQUEST")
    assert_error(rest_produce(url, topic, [{"value": 1}], content_type="text/plain"), 400,
                 "INVALID_REQUEST")
    assert log_end(url, topic, 0) == 0
    assert_error(rest_produce(url, "rest-nowhere", [{"value": 1}]), 404,
                 "UNKNOWN_TOPIC_OR_PARTITION")
    assert_error(rest_read(url, "rest-nowhere", 0, 0), 404, "UNKNOWN_TOPIC_OR_PARTITION")
    assert_error(rest_read(url, topic, 5, 0), 404, "UNKNOWN_TOPIC_OR_PARTITION")
    assert_error(rest_read(url, topic, 0, 9), 416, "OFFSET_OUT_OF_RANGE")
    # A name no topic can ever have (here a path trick) is not "does not exist".
    for bad in ("..%2Fetc", "has%20space", "x" * 250):
        assert_error(rest_produce(url, bad, [{"value": 1}]), 400, "INVALID_TOPIC_EXCEPTION")
        assert_error(rest_read(url, bad, 0, 0), 400, "INVALID_TOPIC_EXCEPTION")
    assert_serving(url)


# == multi-broker: leadership errors (7), leader figures (9), forwarding (10) =========

def test_a_produce_to_a_broker_that_does_not_lead_names_the_leader(multi):
    b2, b3 = (multi.nodes[b].broker_url for b in (2, 3))
    topic = "led-by-2"
    create_topic(b2, topic, partitions=2, assignments={0: [2], 1: [2]})
    meta = wait_for_topic(b3, topic)
    assert {p["leader"] for p in meta["partitions"]} == {2}
    batch = build_batch([(b"k", b"v")])
    results = produce(b3, [(topic, 0, batch), (topic, 1, batch)])
    for p, result in zip((0, 1), results):
        error = result["error"]
        assert error["code"] == "NOT_LEADER_OR_FOLLOWER", result
        assert error["leader_id"] == 2 and error["leader_url"] == b2, error
        assert error["leader_epoch"] == meta["partitions"][p]["leader_epoch"]
    (result,) = fetch(b3, [(topic, 0, 0)])
    assert result["error"]["code"] == "NOT_LEADER_OR_FOLLOWER"
    assert result["error"]["leader_url"] == b2
    (result,) = call(b3, "/v1/offsets", {"partitions": [
        {"topic": topic, "partition": 1, "timestamp": -1}]})["partitions"]
    assert result["error"]["code"] == "NOT_LEADER_OR_FOLLOWER"
    assert (result["error"]["leader_id"], result["error"]["leader_url"]) == (2, b2)
    assert produce_ok(results[0]["error"]["leader_url"], topic, 0, batch) == 0
    assert log_end(b3, topic, 0) == 1  # and broker 3 reports the leader's figures


def test_every_broker_shows_every_partitions_log_figures_from_its_leader(multi):
    b2, b3 = (multi.nodes[b].broker_url for b in (2, 3))
    topic = "spread"
    create_topic(b2, topic, partitions=2, assignments={0: [2], 1: [3]})
    wait_for_topic(b3, topic)
    sent = {0: [build_batch([(b"a", b"1")] * 3), build_batch([(b"b", b"2")])],
            1: [build_batch([(b"c", b"3" * 50)] * 2)]}
    leaders = {0: b2, 1: b3}
    for p, batches in sent.items():
        for batch in batches:
            produce_ok(leaders[p], topic, p, batch)
    for broker_url in (b2, b3):
        answer = get_json(broker_url, f"/v1/topics/{topic}")
        assert answer["name"] == topic
        figures = {p["partition"]: p for p in answer["partitions"]}
        assert figures[0]["leader"] == 2 and figures[1]["leader"] == 3
        for p, batches in sent.items():
            count = sum(len(list(iter_records(b))) for b in batches)
            assert (figures[p]["log_start_offset"], figures[p]["high_watermark"],
                    figures[p]["log_end_offset"]) == (0, count, count), (broker_url, figures[p])
            assert figures[p]["size_bytes"] == sum(len(b) for b in batches)
            assert figures[p]["replicas"] == [2 if p == 0 else 3]
        listed = {t["name"]: t for t in get_json(broker_url, "/v1/topics")["topics"]}
        assert (listed[topic]["partitions"], listed[topic]["replication_factor"]) == (2, 1)
        reply = send(f"{broker_url}/v1/topics/no-such-topic", content_type=None, accept=JSON)
        assert_error(reply, 404, "UNKNOWN_TOPIC_OR_PARTITION")


def test_every_broker_reports_the_same_cluster(multi):
    answers = [get_json(multi.nodes[b].broker_url, "/v1/cluster") for b in multi.broker_ids]
    cluster_ids = {a["cluster_id"] for a in answers}
    assert len(cluster_ids) == 1 and all(cluster_ids)
    for answer in answers:
        assert answer["controller_id"] == 1
        brokers = {b["id"]: b for b in answer["brokers"]}
        assert set(brokers) == {2, 3}
        for broker_id, broker in brokers.items():
            assert broker["url"] == multi.nodes[broker_id].broker_url
            assert broker["fenced"] is False
    meta = metadata(multi.nodes[2].broker_url, [])
    assert meta["cluster_id"] in cluster_ids
    assert meta["brokers"] == [{"id": b, "url": multi.nodes[b].broker_url, "rack": None}
                               for b in (2, 3)]


def test_log_dirs_of_every_broker_from_any_broker(multi):
    # Kafka's DescribeLogDirs: each live broker's directories, their disk,
    # and (asked for) every replica in them with its size and offsets.
    b2, b3 = (multi.nodes[b].broker_url for b in (2, 3))
    topic = "log-dirs-shown"
    create_topic(b2, topic, partitions=1, assignments={0: [2, 3]}, replication_factor=-1)
    wait_for_topic(b3, topic)
    builder = BatchBuilder()
    for _ in range(5):
        builder.append(b"k", b"v" * 100)
    produce_ok(b2, topic, 0, builder.build())

    def replicated():  # the follower copies the batch in its own time (acks=1)
        reply = send(f"{b3}/v1/log-dirs?partitions=true", accept=JSON)
        assert reply.status == 200, reply.body
        sizes = [r["size_bytes"] for b in reply.body["brokers"] for d in b["log_dirs"]
                 for r in d.get("replicas") or () if r["topic"] == topic]
        return reply if len(sizes) == 2 and min(sizes) > 500 else None

    reply = wait_until(replicated, 20, "both replicas holding the batch")
    assert reply.body["unreachable_brokers"] == []
    by_broker = {b["broker_id"]: b for b in reply.body["brokers"]}
    assert {2, 3} <= set(by_broker)
    for broker, leader in ((2, True), (3, False)):
        (directory,) = by_broker[broker]["log_dirs"]
        assert directory["error"] is None
        assert directory["total_bytes"] > directory["usable_bytes"] > 0
        (replica,) = [r for r in directory["replicas"] if r["topic"] == topic]
        assert replica["leader"] is leader and replica["log_start_offset"] == 0
        assert replica["size_bytes"] > 500
        assert directory["size_bytes"] >= replica["size_bytes"]
        assert directory["partitions"] == len(directory["replicas"])
    local = send(f"{b2}/v1/log-dirs?local=true", accept=JSON).body
    assert local["broker_id"] == 2 and "replicas" not in local["log_dirs"][0]


def test_the_rest_proxy_forwards_from_a_broker_that_leads_nothing(multi):
    b2, b3 = (multi.nodes[b].broker_url for b in (2, 3))
    topic = "rest-forwarded"
    create_topic(b2, topic, partitions=2, assignments={0: [2], 1: [2]})
    wait_for_topic(b3, topic)
    records = [{"key": f"k{i}", "value": {"i": i}} for i in range(6)]
    reply = rest_produce(b3, topic, records)
    assert reply.status == 200, reply.body
    counts = {0: 0, 1: 0}
    for record, got in zip(records, reply.body["offsets"]):
        partition = partition_for_key(compact(record["key"]), 2)
        assert got == {"partition": partition, "offset": counts[partition],
                       "error_code": None, "error": None}
        counts[partition] += 1
    for partition in (0, 1):
        rows = rest_read(b3, topic, partition, 0).body
        assert [r["value"]["i"] for r in rows] == [
            r["value"]["i"] for r in records
            if partition_for_key(compact(r["key"]), 2) == partition]
        assert len(read_all(b2, topic, partition)) == counts[partition]


# == 8. restart (runs last: it restarts the single node) ===============================

def test_review_regressions_bad_shapes_answer_400_never_500(url):
    # A fetch answered in JSON cannot carry batches: refused up front.
    reply = send(url + "/v1/fetch", json.dumps({"partitions": []}).encode(),
                 content_type=JSON, accept=JSON)
    assert_error(reply, 400, "INVALID_REQUEST")
    # Describe with a name that is not a string.
    assert_error(post(url, "/v1/admin/topics/describe", {"topics": [["x"]]}),
                 400, "INVALID_REQUEST")
    # A REST body nested deeper than the parser goes.
    create_topic(url, "deep", 1)
    deep = ("[" * 5000 + "]" * 5000).encode()
    reply = send(url + "/topics/deep", b'{"records": [{"value": ' + deep + b"}]}",
                 content_type="application/vnd.kafka.json.v2+json", accept=JSON)
    assert_error(reply, 400, "INVALID_REQUEST")
    assert_serving(url)


def test_list_offsets_answers_an_invalid_name_per_partition(url):
    create_topic(url, "offsets-mixed", 1)
    answer = call(url, "/v1/offsets", {"partitions": [
        {"topic": "bad/name", "partition": 0, "timestamp": -1},
        {"topic": "offsets-mixed", "partition": 0, "timestamp": -1}]})
    assert [(r["error"] and r["error"]["code"]) for r in answer["partitions"]] == [
        "INVALID_TOPIC_EXCEPTION", None]


def test_a_topic_with_the_longest_name_is_deleted_and_recreated_empty(single, url):
    name = "L" * 249
    create_topic(url, name, 1)
    produce_ok(url, name, 0, build_batch([(None, b"old")]))
    answer = call(url, "/v1/admin/topics/delete", {"topics": [name]})
    assert answer["topics"][0]["error"] is None
    create_topic(url, name, 1)
    assert log_end(url, name, 0) == 0
    data_dir = os.path.join(single.base_dir, "data-1")
    wait_until(lambda: not any(entry.endswith("-delete") for entry in os.listdir(data_dir)),
               10, "deleted directories removed")


def test_acknowledged_records_survive_sigterm_and_sigkill_restarts(single, url):
    topic = "durable"
    create_topic(url, topic, partitions=2)
    t = now_ms() - 30_000
    expected = {0: [], 1: []}

    def produce_round(tag: str) -> None:
        for p in (0, 1):
            base = len(expected[p])
            records = [(f"{tag}-{p}-{i}".encode(), f"value {tag} {i}".encode(),
                        [("h", tag.encode())], t + base + i)
                       for i in range(3 + p)]
            assert produce_ok(url, topic, p, batch_of(records)) == base
            expected[p] += [(base + i, ts, k, v, tuple(tuple(h) for h in hs))
                            for i, (k, v, hs, ts) in enumerate(records)]

    def everything_back():
        return all(read_all(url, topic, p) == expected[p] for p in (0, 1))

    def leader_epoch() -> int:
        (meta,) = metadata(url, [topic])["topics"]
        return meta["partitions"][0]["leader_epoch"]

    produce_round("a")
    produce_round("b")
    for sig in (signal.SIGTERM, signal.SIGKILL):
        old_epoch = leader_epoch()
        single.kill(1, sig)
        if sig == signal.SIGTERM:
            assert single.nodes[1].process.returncode == 0, single.log_tail(1)
        single.start([1])
        single.wait_for_brokers_running(timeout_s=20)
        # The node leads its partitions again once its metadata says so.
        wait_until(everything_back, 15, f"every acknowledged record after {sig.name}")
        # A producer still on the old leader epoch is fenced, and appends nothing.
        assert leader_epoch() > old_epoch
        (result,) = produce(url, [(topic, 0, build_batch([(b"k", b"stale")]))],
                            current_leader_epoch=old_epoch)
        assert result["error"]["code"] == "FENCED_LEADER_EPOCH", result
        produce_round(f"after-{sig.name}")  # continues at the right offsets
        assert everything_back()
    for p in (0, 1):
        figures = offsets_of(url, topic, p)
        assert figures["high_watermark"] == figures["log_end_offset"] == len(expected[p])


# == replication on one node ==========================================================

def test_a_topic_with_fewer_replicas_than_min_insync_replicas_is_refused(url):
    """No acks=all write could ever commit to it (the producer's default), so
    it is not created; what to change is in the message. A running topic
    whose ISR shrinks below the minimum refuses acks=all writes instead
    (test_replication.py, and the core's own tests)."""
    answer = call(url, "/v1/admin/topics/create", {"topics": [
        {"name": "strict", "num_partitions": 1, "replication_factor": 1,
         "configs": {"min.insync.replicas": "2"}}]})
    (result,) = answer["topics"]
    assert result["error"]["code"] == "INVALID_REPLICATION_FACTOR", result
    assert "min.insync.replicas=2" in result["error"]["message"]
    assert "--config min.insync.replicas=1" in result["error"]["message"]
    topics = call(url, "/v1/metadata", {"topics": ["strict"]})["topics"]
    assert topics[0]["error"]["code"] == "UNKNOWN_TOPIC_OR_PARTITION"
    create_topic(url, "strict", configs={"min.insync.replicas": "1"})
    answer = call(url, "/v1/admin/configs/alter", {"resources": [{
        "type": "topic", "name": "strict",
        "ops": [{"name": "min.insync.replicas", "op": "set", "value": "2"}]}]})
    assert answer["resources"][0]["error"]["code"] == "INVALID_CONFIG", answer
    (result,) = produce(url, [("strict", 0, batch_of([(None, b"v", [], None)]))], acks="all")
    assert result["error"] is None, "the topic stays writable"


def test_acks_all_on_a_sole_replica_is_acknowledged_once_committed(url):
    create_topic(url, "sole")
    (result,) = produce(url, [("sole", 0, batch_of([(None, b"v", [], None)] * 3))], acks=-1)
    assert result["error"] is None and result["base_offset"] == 0
    assert offsets_of(url, "sole", 0)["high_watermark"] == 3


def test_a_fetch_from_a_broker_that_is_no_replica_is_refused_per_partition(url):
    create_topic(url, "lonely")
    produce_ok(url, "lonely", 0, batch_of([(None, b"v", [], None)]))
    answer = call(url, "/v1/fetch", {"replica_id": 77, "partitions": [
        {"topic": "lonely", "partition": 0, "offset": 0}]})
    (result,) = answer["partitions"]
    assert result["error"]["code"] == "NOT_LEADER_OR_FOLLOWER"
    assert "not a follower" in result["error"]["message"]
    assert result["records"] == b""


def test_a_follower_fetch_naming_an_epoch_the_leader_lacks_gets_the_diverging_epoch(multi):
    first = multi.nodes[multi.broker_ids[0]].broker_url
    create_topic(first, "epochs", replication_factor=2)
    (meta,) = wait_for_topic(first, "epochs")["partitions"]
    leader_url = multi.nodes[meta["leader"]].broker_url
    follower = next(b for b in meta["replicas"] if b != meta["leader"])
    produce_ok(leader_url, "epochs", 0, batch_of([(None, b"v", [], None)] * 4))
    epoch = meta["leader_epoch"]
    # Offset 9 in the leader's own epoch: beyond where that epoch ends (4).
    answer = call(leader_url, "/v1/fetch", {"replica_id": follower, "partitions": [
        {"topic": "epochs", "partition": 0, "offset": 9, "last_fetched_epoch": epoch,
         "current_leader_epoch": epoch}]})
    (result,) = answer["partitions"]
    assert result["error"] is None, result
    assert result["diverging_epoch"] == {"epoch": epoch, "end_offset": 4}, result
    assert result["records"] == b""
    # A consumer never sees follower-only fields, and a follower in step
    # reads past the high watermark.
    answer = call(leader_url, "/v1/fetch", {"replica_id": follower, "partitions": [
        {"topic": "epochs", "partition": 0, "offset": 0, "last_fetched_epoch": -1}]})
    assert len(decode(answer["partitions"][0]["records"])) == 4


def test_a_follower_fetch_stream_answers_each_fetch_by_id_and_closes_on_bad_messages(multi):
    """GET /v1/replica/fetch-stream: followers' fetches over one WebSocket,
    answered as POST /v1/fetch answers them, each tagged with its id; a
    bad fetch gets its error answer, a message of another shape closes the
    stream (1003), and the broker serves on."""
    import asyncio

    import aiohttp

    first = multi.nodes[multi.broker_ids[0]].broker_url
    create_topic(first, "streamed", replication_factor=2)
    (meta,) = wait_for_topic(first, "streamed")["partitions"]
    leader_url = multi.nodes[meta["leader"]].broker_url
    follower = next(b for b in meta["replicas"] if b != meta["leader"])
    produce_ok(leader_url, "streamed", 0, batch_of([(None, b"v", [], None)] * 4))
    spec = {"topic": "streamed", "partition": 0, "offset": 0, "last_fetched_epoch": -1}

    def tagged(request_id, fetch) -> bytes:
        return msgpack.packb({"id": request_id, "fetch": fetch}, use_bin_type=True)

    async def talk() -> tuple[dict, list]:
        answers, closes = {}, []
        async with aiohttp.ClientSession() as session:
            stream = await session.ws_connect(leader_url + "/v1/replica/fetch-stream")
            await stream.send_bytes(tagged(7, {"replica_id": follower, "max_wait_ms": 0,
                                               "partitions": [spec]}))
            await stream.send_bytes(tagged(8, {"replica_id": "two", "partitions": [spec]}))
            await stream.send_bytes(tagged(9, {"replica_id": -1, "partitions": [spec]}))
            # More at once than the leader answers at a time (16), good and
            # bad alternating: each is answered, none holds a place for good.
            for request_id in range(100, 140):
                await stream.send_bytes(tagged(request_id, {
                    "replica_id": follower if request_id % 2 else "two", "max_wait_ms": 0,
                    "partitions": [spec]}))
            while len(answers) < 43:
                message = await stream.receive(timeout=15)
                assert message.type is aiohttp.WSMsgType.BINARY, message
                answer = msgpack.unpackb(message.data, raw=False)
                answers[answer["id"]] = answer["answer"]
            for bad in ("a text message", b"\xc1 not msgpack", msgpack.packb({"fetch": {}})):
                stream = await session.ws_connect(leader_url + "/v1/replica/fetch-stream")
                await (stream.send_str(bad) if isinstance(bad, str) else stream.send_bytes(bad))
                message = await stream.receive(timeout=15)
                closes.append((message.type, stream.close_code))
                await stream.close()
        return answers, closes

    answers, closes = asyncio.run(talk())
    assert len(decode(answers[7]["partitions"][0]["records"])) == 4
    assert answers[7]["partitions"][0]["error"] is None
    assert answers[8]["error"]["code"] == "INVALID_REQUEST"
    assert "replica_id" in answers[8]["error"]["message"]
    assert answers[9]["error"]["code"] == "INVALID_REQUEST"
    assert "followers' fetches" in answers[9]["error"]["message"]
    assert closes == [(aiohttp.WSMsgType.CLOSE, 1003)] * 3
    assert sorted(answers) == [7, 8, 9, *range(100, 140)]
    assert all(("error" in answers[i]) == (i % 2 == 0) for i in range(100, 140))
    assert produce_ok(leader_url, "streamed", 0, batch_of([(None, b"w", [], None)])) == 4


def test_a_clients_stream_answers_produces_and_fetches_by_id_in_any_order(multi):
    """GET /v1/stream: a client's produces and consumers' fetches over one
    WebSocket, each answered with the status and body its POST would get,
    in any order (a long-polling fetch does not hold the produce sent after
    it); a bad request gets its error, a message of another shape closes the
    stream (1003), and the broker serves on."""
    import asyncio

    import aiohttp

    first = multi.nodes[multi.broker_ids[0]].broker_url
    create_topic(first, "client-streamed")
    (meta,) = wait_for_topic(first, "client-streamed")["partitions"]
    leader_url = multi.nodes[meta["leader"]].broker_url
    spec = {"topic": "client-streamed", "partition": 0, "offset": 0}

    def tagged(request_id: int, path, body) -> bytes:
        return msgpack.packb({"id": request_id, "path": path, "body": body}, use_bin_type=True)

    def produce(values) -> dict:
        return {"acks": -1, "partitions": [{"topic": "client-streamed", "partition": 0,
                                            "records": batch_of([(None, v, [], None)
                                                                 for v in values])}]}

    async def talk() -> tuple[list, list, float]:
        answers, closes = [], []
        async with aiohttp.ClientSession() as session:
            stream = await session.ws_connect(leader_url + "/v1/stream")
            await stream.send_bytes(tagged(1, "/v1/produce", produce([b"a", b"b"])))
            answers.append(msgpack.unpackb((await stream.receive(timeout=15)).data, raw=False))
            # A fetch at the log end long-polls; the produce after it is
            # answered first, and wakes it.
            await stream.send_bytes(tagged(2, "/v1/fetch", {"max_wait_ms": 10_000, "partitions": [
                dict(spec, offset=2)]}))
            await stream.send_bytes(tagged(3, "/v1/produce", produce([b"c"])))
            for bad_id, path, body in (
                    (4, "/v1/offsets", {"partitions": []}),  # not carried
                    (5, "/v1/produce", [1, 2]),  # not a map
                    (6, "/v1/produce", dict(produce([b"x"]), acks=5)),
                    (7, "/v1/fetch", {"replica_id": "two", "partitions": [spec]}),
                    (8, "/v1/produce", {"partitions": [{"topic": "no-such-topic",
                                                        "partition": 0,
                                                        "records": batch_of([(None, b"x", [],
                                                                              None)])}]})):
                await stream.send_bytes(tagged(bad_id, path, body))
            started = time.monotonic()
            while len(answers) < 8:
                message = await stream.receive(timeout=15)
                assert message.type is aiohttp.WSMsgType.BINARY, message
                answers.append(msgpack.unpackb(message.data, raw=False))
            waited = time.monotonic() - started
            for bad in ("a text message", b"\xc1 not msgpack",
                        msgpack.packb({"path": "/v1/fetch", "body": {}})):
                stream = await session.ws_connect(leader_url + "/v1/stream")
                await (stream.send_str(bad) if isinstance(bad, str) else stream.send_bytes(bad))
                message = await stream.receive(timeout=15)
                closes.append((message.type, message.data))  # the code the broker sent
                await stream.close()
        return answers, closes, waited

    answers, closes, waited = asyncio.run(talk())
    by_id = {answer["id"]: answer for answer in answers}
    assert sorted(by_id) == list(range(1, 9))
    assert by_id[1]["status"] == 200 and by_id[1]["answer"]["partitions"][0]["base_offset"] == 0
    order = [answer["id"] for answer in answers]
    assert order.index(3) < order.index(2), order  # the fetch waited for the produce
    assert waited < 10, "the fetch was woken by the produce, not by its 10 s deadline"
    assert by_id[3]["answer"]["partitions"][0]["base_offset"] == 2
    fetched = by_id[2]["answer"]["partitions"][0]
    assert fetched["error"] is None and [r[3] for r in decode(fetched["records"])] == [b"c"]
    for bad_id, code, words in ((4, "INVALID_REQUEST", "/v1/offsets"),
                                (5, "INVALID_REQUEST", "must be a map"),
                                (6, "INVALID_REQUIRED_ACKS", "acks"),
                                (7, "INVALID_REQUEST", "replica_id")):
        assert by_id[bad_id]["status"] == 400, by_id[bad_id]
        error = by_id[bad_id]["answer"]["error"]
        assert error["code"] == code and words in error["message"], error
    unknown = by_id[8]["answer"]["partitions"][0]["error"]
    assert by_id[8]["status"] == 200 and unknown["code"] == "UNKNOWN_TOPIC_OR_PARTITION"
    assert closes == [(aiohttp.WSMsgType.CLOSE, 1003)] * 3
    assert produce_ok(leader_url, "client-streamed", 0, batch_of([(None, b"d", [], None)])) == 3


def test_a_stream_message_above_socket_request_max_bytes_closes_the_stream_1009(url):
    """The broker reads no stream message larger than socket.request.max.bytes
    (64 KiB here): it closes the stream with 1009 (message too big), and
    serves on."""
    import asyncio

    import aiohttp

    create_topic(url, "streamed-big")
    wait_for_topic(url, "streamed-big")
    body = {"acks": 1, "partitions": [{"topic": "streamed-big", "partition": 0,
                                       "records": batch_of([(None, b"x" * REQUEST_BYTES_MAX,
                                                             [], None)])}]}

    async def talk() -> tuple:
        async with aiohttp.ClientSession() as session:
            stream = await session.ws_connect(url + "/v1/stream")
            await stream.send_bytes(msgpack.packb({"id": 1, "path": "/v1/produce",
                                                   "body": body}, use_bin_type=True))
            message = await stream.receive(timeout=15)
            return message.type, message.data  # the code the broker sent

    assert asyncio.run(talk()) == (aiohttp.WSMsgType.CLOSE, 1009)
    assert produce_ok(url, "streamed-big", 0, batch_of([(None, b"small", [], None)])) == 0


def test_a_web_page_of_another_origin_may_not_open_a_stream(multi):
    """Browsers open WebSockets across origins without asking the server
    (unlike a POST of msgpack), so a handshake from a page of another origin
    is refused (403), on both streams; the broker's own pages and programs
    (no Origin) are not."""
    import asyncio

    import aiohttp

    url = multi.nodes[multi.broker_ids[0]].broker_url
    own = "http://" + urlsplit(url).netloc

    async def talk() -> list:
        outcomes = []
        async with aiohttp.ClientSession() as session:
            for path, origin in (("/v1/stream", "https://pages.example"),
                                 ("/v1/replica/fetch-stream", "https://pages.example"),
                                 ("/v1/stream", own), ("/v1/stream", None)):
                headers = {} if origin is None else {"Origin": origin}
                try:
                    stream = await session.ws_connect(url + path, headers=headers)
                    await stream.close()
                    outcomes.append("open")
                except aiohttp.WSServerHandshakeError as exc:
                    outcomes.append(exc.status)
        return outcomes

    assert asyncio.run(talk()) == [403, 403, "open", "open"]
