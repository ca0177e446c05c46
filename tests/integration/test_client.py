"""The Python client against real kraftlog processes on loopback: a
single combined node for most tests (one per module), and a 3-broker
cluster for producing to and consuming from several leaders."""

import time
import urllib.request

import pytest

from api.client import (Admin, AsyncAdmin, AsyncConsumer, AsyncProducer, ConfigEntry, Consumer,
                        KraftlogError, NewTopic, NoOffsetForPartitionError, OffsetOutOfRangeError,
                        Producer, RecordMetadata, TopicAlreadyExistsError, TopicPartition,
                        UnknownTopicOrPartitionError)
from chaos.cluster import ProcessCluster
from protocol.partitioner import partition_for_key


@pytest.fixture(scope="module")
def url(tmp_path_factory):
    with ProcessCluster(str(tmp_path_factory.mktemp("single")), controllers=1, brokers=0,
                        combined=True) as cluster:
        cluster.start()
        cluster.wait_for_brokers_running(timeout_s=30)
        yield cluster.nodes[1].broker_url


@pytest.fixture(scope="module")
def admin(url):
    with Admin(url) as admin:
        yield admin


def create(admin, name, partitions=1, **configs):
    admin.create_topics([NewTopic(name, num_partitions=partitions, replication_factor=1,
                                  configs=configs)])
    return [TopicPartition(name, p) for p in range(partitions)]


def consume_all(url, tps, count, **settings):
    """Every record of ``tps`` from the beginning until ``count`` arrived."""
    with Consumer(url, auto_offset_reset="earliest", **settings) as consumer:
        consumer.assign(tps)
        records = []
        deadline = time.monotonic() + 20
        while len(records) < count:
            assert time.monotonic() < deadline, f"only {len(records)} of {count} records"
            records.extend(consumer.poll(timeout_ms=500))
        assert consumer.poll(timeout_ms=100) == []  # and nothing more
        return records


def test_records_come_back_in_order_with_keys_values_headers_and_timestamps(url, admin):
    tps = create(admin, "roundtrip", partitions=4)
    sent = []
    with Producer(url, linger_ms=5) as producer:
        for i in range(2000):
            key = None if i % 2 else f"key-{i % 20}".encode()
            headers = [("i", str(i).encode()), ("empty", None)] if i % 3 == 0 else []
            handle = producer.send("roundtrip", b"value-%d" % i, key=key, headers=headers,
                                   timestamp_ms=1_700_000_000_000 + i)
            sent.append((key, b"value-%d" % i, tuple(headers), 1_700_000_000_000 + i, handle))
        producer.flush()
    where = {}
    for key, value, headers, ts, handle in sent:
        metadata = handle.result(0)
        if key is not None:
            assert metadata.partition == partition_for_key(key, 4)
        assert metadata.timestamp == ts
        where[(metadata.partition, metadata.offset)] = (key, value, headers, ts)
    records = consume_all(url, tps, 2000)
    for p in range(4):
        mine = [r for r in records if r.partition == p]
        assert [r.offset for r in mine] == list(range(len(mine)))
        for r in mine:
            assert (r.key, r.value, r.headers, r.timestamp) == where[(p, r.offset)]
    assert len(where) == 2000


def test_delivery_callbacks_and_handles_agree_on_partition_and_offset(url, admin):
    create(admin, "callbacks", partitions=3)
    delivered = []
    with Producer(url) as producer:
        handles = [producer.send("callbacks", b"v", key=b"k%d" % i,
                                 on_delivery=lambda e, m: delivered.append((e, m)))
                   for i in range(30)]
        producer.flush()
        assert sorted(m for _, m in delivered) == sorted(h.result(0) for h in handles)
        assert all(e is None for e, _ in delivered)
        assert producer.partitions_for("callbacks") == {0, 1, 2}


def test_close_delivers_what_was_sent_and_then_refuses_sends(url, admin):
    tps = create(admin, "closing")
    producer = Producer(url, linger_ms=60_000)  # nothing would leave before close
    handles = [producer.send("closing", b"v%d" % i) for i in range(100)]
    started = time.monotonic()
    producer.close()
    assert time.monotonic() - started < 10
    assert [h.result(0).offset for h in handles] == list(range(100))
    with pytest.raises(KraftlogError) as caught:
        producer.send("closing", b"late")
    assert caught.value.code == "CLIENT_CLOSED"
    assert len(consume_all(url, tps, 100)) == 100


def test_seek_position_and_seek_to_end(url, admin):
    (tp,) = create(admin, "seeking")
    with Producer(url) as producer:
        for i in range(20):
            producer.send("seeking", b"%d" % i, timestamp_ms=1_000_000 + i * 1000)
    with Consumer(url, auto_offset_reset="latest") as consumer:
        consumer.assign([tp])
        assert consumer.position(tp) == 20  # latest
        assert consumer.beginning_offsets([tp]) == {tp: 0}
        assert consumer.end_offsets([tp]) == {tp: 20}
        found = consumer.offsets_for_times({tp: 1_005_500})
        assert (found[tp].offset, found[tp].timestamp) == (6, 1_006_000)
        assert consumer.offsets_for_times({tp: 10**13}) == {tp: None}
        consumer.seek(tp, 15)
        records = []
        while len(records) < 5:
            records.extend(consumer.poll(timeout_ms=1000))
        assert [r.value for r in records] == [b"%d" % i for i in range(15, 20)]
        assert consumer.position(tp) == 20
        consumer.seek_to_beginning()
        assert consumer.position(tp) == 0
        consumer.seek_to_end([tp])
        assert consumer.poll(timeout_ms=200) == []
        with Producer(url) as producer:
            producer.send("seeking", b"new")
        records = []
        deadline = time.monotonic() + 10
        while not records and time.monotonic() < deadline:
            records = consumer.poll(timeout_ms=500)
        assert [(r.offset, r.value) for r in records] == [(20, b"new")]
        assert consumer.partitions_for_topic("seeking") == {0}
        assert "seeking" in consumer.topics()
        listed = consumer.list_topics()["seeking"]
        assert listed.partitions == {0}
        assert listed.topic_id is not None
        assert listed.topic_id == admin.describe_topics(["seeking"])["seeking"].topic_id


def test_a_seek_does_not_wait_out_a_long_poll_at_the_old_position(url, admin):
    """A caught-up consumer has a fetch waiting at the log end (up to
    fetch_max_wait_ms for new records); one fetch at a time goes to a leader.
    After a seek the records at the new position come at once, not when that
    wait ends (a group that forms and then rewinds paid 500 ms per seek)."""
    (tp,) = create(admin, "rewinding")
    with Producer(url) as producer:
        for i in range(10):
            producer.send("rewinding", b"%d" % i)
    with Consumer(url, auto_offset_reset="latest", fetch_max_wait_ms=30_000) as consumer:
        consumer.assign([tp])
        assert consumer.poll(timeout_ms=300) == []  # caught up: a 30 s long poll is out
        consumer.seek_to_beginning()
        records = consumer.poll(timeout_ms=10_000)  # would be [] while the long poll waits
        assert [r.value for r in records] == [b"%d" % i for i in range(10)]
        consumer.seek(tp, 4)
        assert [r.value for r in consumer.poll(timeout_ms=10_000)] == [
            b"%d" % i for i in range(4, 10)]


class FetchSpy:
    """Records the fetch bodies a consumer sends to the real broker (the
    transport itself carries them)."""

    def __init__(self, consumer) -> None:
        self.bodies: list[dict] = []
        transport = consumer._consumer._fetch.transport
        request = transport.request

        async def spying(url, path, body=None, **kwargs):
            if path == "/v1/fetch":
                self.bodies.append({k: (list(v) if isinstance(v, list) else v)
                                    for k, v in body.items()})
            return await request(url, path, body, **kwargs)

        consumer._consumer._fetch.transport = spying_transport = type(
            "Spying", (), {"request": staticmethod(spying)})()
        self.transport = spying_transport


def poll_values(consumer, count, timeout_s=20):
    records = []
    deadline = time.monotonic() + timeout_s
    while len(records) < count:
        assert time.monotonic() < deadline, f"only {len(records)} of {count} records"
        records.extend(consumer.poll(timeout_ms=500))
    return records


def test_a_consumers_fetches_name_only_the_partitions_that_moved(url, admin):
    """Fetch sessions (KIP-227): after the fetch that opens one, a consumer of
    many quiet partitions names only those whose position moved, and gets
    every record once, in order, through new records, a seek and close."""
    tps = create(admin, "sessions", partitions=100)
    with Producer(url) as producer:
        for i in range(10):
            producer.send("sessions", b"a%d" % i, partition=3)
    with Consumer(url, auto_offset_reset="earliest", fetch_max_wait_ms=200) as consumer:
        spy = FetchSpy(consumer)
        consumer.assign(tps)
        first = poll_values(consumer, 10)
        assert [(r.partition, r.value) for r in first] == [(3, b"a%d" % i) for i in range(10)]
        with Producer(url) as producer:
            for i in range(5):
                producer.send("sessions", b"b%d" % i, partition=50)
        second = poll_values(consumer, 5)
        assert [(r.partition, r.offset, r.value) for r in second] == [
            (50, i, b"b%d" % i) for i in range(5)]
        opening, *later = spy.bodies
        assert opening["session_epoch"] == 0 and len(opening["partitions"]) == 100
        assert later and all(body["session_id"] > 0 and body["session_epoch"] > 0
                             for body in later)
        assert max(len(body["partitions"]) for body in later) <= 2  # 3 and 50, as they moved
        assert sorted(later[0]["session_epoch"] + i for i in range(len(later))) == [
            body["session_epoch"] for body in later]
        consumer.seek(TopicPartition("sessions", 3), 7)  # a seek: named at its new offset
        assert [r.value for r in poll_values(consumer, 3)] == [b"a7", b"a8", b"a9"]
        assert consumer.poll(timeout_ms=300) == []


def test_a_seek_back_to_the_offset_last_named_reads_again(url, admin):
    """With the buffer full no fetch is in flight to cancel; a seek back to
    the offset the last fetch named is still a new position for the
    session (the broker answered from there once and would not again)."""
    (tp,) = create(admin, "rewound")
    with Producer(url) as producer:
        for i in range(10):
            producer.send("rewound", b"%d" % i)
    with Consumer(url, auto_offset_reset="earliest", fetch_max_wait_ms=200,
                  max_buffered_bytes=1, max_poll_records=1) as consumer:
        consumer.assign([tp])
        assert [r.value for r in poll_values(consumer, 1)] == [b"0"]
        consumer.seek(tp, 0)
        assert [r.value for r in poll_values(consumer, 10)] == [b"%d" % i for i in range(10)]
        consumer.assign([])
        consumer.assign([tp])  # a new assignment at the same offset: named again too
        consumer.seek(tp, 0)
        assert [r.value for r in poll_values(consumer, 10)] == [b"%d" % i for i in range(10)]


def test_consumers_beyond_the_session_cache_fetch_without_one(tmp_path):
    """A broker keeping one consumer session: the bigger consumer's opens
    and evicts the smaller's, which is told so and fetches without; both get
    every record once."""
    with ProcessCluster(str(tmp_path), controllers=1, brokers=0, combined=True, settings={
            "max.incremental.fetch.session.cache.slots": 1}) as cluster:
        cluster.start()
        cluster.wait_for_brokers_running(timeout_s=30)
        url = cluster.nodes[1].broker_url
        with Admin(url) as admin:
            tps = create(admin, "slots", partitions=6)
        with Producer(url) as producer:
            for p in range(6):
                for i in range(20):
                    producer.send("slots", b"%d-%d" % (p, i), partition=p)
        with Consumer(url, auto_offset_reset="earliest", fetch_max_wait_ms=100) as small, \
                Consumer(url, auto_offset_reset="earliest", fetch_max_wait_ms=100) as big:
            small_spy, big_spy = FetchSpy(small), FetchSpy(big)
            small.assign(tps[:2])
            got_small = poll_values(small, 40)
            big.assign(tps)
            got_big = poll_values(big, 120)
            with Producer(url) as producer:
                for p in range(6):
                    producer.send("slots", b"%d-late" % p, partition=p)
            got_small += poll_values(small, 2)
            got_big += poll_values(big, 6)
            for got, partitions in ((got_small, 2), (got_big, 6)):
                for p in range(partitions):
                    mine = [r.value for r in got if r.partition == p]
                    assert mine == [b"%d-%d" % (p, i) for i in range(20)] + [b"%d-late" % p]
            assert small.poll(timeout_ms=200) == [] and big.poll(timeout_ms=200) == []
        *fetches, closing = big_spy.bodies
        assert all(body["session_epoch"] > 0 for body in fetches[1:])
        assert closing["session_epoch"] == -1 and closing["session_id"] == fetches[-1][
            "session_id"]  # closing the consumer frees its slot at once
        with urllib.request.urlopen(url + "/metrics", timeout=10) as response:
            metrics = response.read().decode()
        assert "\nkraftlog_fetch_session_evictions_total 1\n" in metrics, metrics
        # the small one's session went to the big one: it fetches without, from then on
        # naming both its partitions each time
        assert any(body["session_epoch"] > 0 for body in small_spy.bodies)  # it had one
        assert small_spy.bodies[-1]["session_epoch"] == 0
        assert len(small_spy.bodies[-1]["partitions"]) == 2


def test_send_batch_writes_each_record_once_where_send_would_in_order(url, admin):
    """The bulk path: keyed records land on the partition ``send`` picks for
    their key, keyless and explicit-partition ones in order, after what
    ``send`` queued before; idempotent (acks=all, the default) and in a
    transaction; handles give each batch's first offset."""
    tps = create(admin, "bulk", partitions=3)
    keys = [b"key-%d" % (i % 17) for i in range(5000)]
    delivered = []
    with Producer(url, batch_size=16384) as producer:
        expected = {k: producer.send("bulk", b"probe", key=k) for k in set(keys)}
        producer.flush()
        placed = {k: h.result(10).partition for k, h in expected.items()}
        handles = producer.send_batch("bulk", [b"v%d" % i for i in range(5000)], keys,
                                      on_delivery=lambda err, md: delivered.append(err))
        producer.send_batch("bulk", ["tail-%d" % i for i in range(300)], partition=1)
        producer.send("bulk", b"last", partition=1)
        producer.flush()
        assert len(handles) == len(delivered) > 1 and set(delivered) == {None}
        assert all(h.result(0).offset >= 0 for h in handles)
    records = consume_all(url, tps, 17 + 5000 + 301)
    bulk = [r for r in records if r.value.startswith(b"v")]
    assert sorted(int(r.value[1:]) for r in bulk) == list(range(5000))  # each once
    for r in bulk:
        assert r.partition == placed[r.key] and r.key == keys[int(r.value[1:])]
    for p in range(3):  # per partition, in the order given
        mine = [int(r.value[1:]) for r in bulk if r.partition == p]
        assert mine == sorted(mine)
    on_one = [r.value for r in records if r.partition == 1 and not r.value[:1] in (b"v", b"p")]
    assert on_one == [b"tail-%d" % i for i in range(300)] + [b"last"]
    with Producer(url, transactional_id="bulk-txn") as producer:
        producer.init_transactions()
        producer.begin_transaction()
        producer.send_batch("bulk", [b"txn-%d" % i for i in range(100)], partition=0)
        producer.commit_transaction()
    committed = consume_all(url, tps, 17 + 5000 + 301 + 100, isolation_level="read_committed")
    assert [r.value for r in committed if r.value.startswith(b"txn-")] == [
        b"txn-%d" % i for i in range(100)]


def test_send_batch_refuses_what_it_cannot_write(url, admin):
    create(admin, "bulk-bad", partitions=2)
    with Producer(url, max_block_ms=2000) as producer:
        with pytest.raises(KraftlogError) as caught:
            producer.send_batch("bulk-bad", [b"x"], partition=2)
        assert caught.value.code == "UNKNOWN_TOPIC_OR_PARTITION" and "0 to 1" in str(caught.value)
        with pytest.raises(ValueError, match="2 keys for 1 values"):
            producer.send_batch("bulk-bad", [b"x"], [b"a", b"b"])
        with pytest.raises(TypeError, match="give bytes, str or None"):
            producer.send_batch("bulk-bad", [b"x", 1.5])
        with pytest.raises(KraftlogError) as caught:
            producer.send_batch("no-such-topic-here", [b"x"])
        assert caught.value.code == "UNKNOWN_TOPIC_OR_PARTITION"


def test_auto_offset_reset_none_raises_until_the_application_seeks(url, admin):
    (tp,) = create(admin, "no-reset")
    with Producer(url) as producer:
        producer.send("no-reset", b"only")
    with Consumer(url, auto_offset_reset="none") as consumer:
        consumer.assign([tp])
        with pytest.raises(NoOffsetForPartitionError):
            consumer.poll(timeout_ms=1000)
        consumer.seek(tp, 1000)
        with pytest.raises(OffsetOutOfRangeError) as caught:
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                consumer.poll(timeout_ms=200)
        assert caught.value.partitions == {tp: 1000}
        consumer.seek(tp, 0)
        assert [r.value for r in consumer.poll(timeout_ms=5000)] == [b"only"]


def test_producing_to_an_unknown_topic_fails_after_the_delivery_timeout(url):
    with Producer(url, request_timeout_ms=1000, delivery_timeout_ms=1500) as producer:
        started = time.monotonic()
        handle = producer.send("does-not-exist", b"v")
        with pytest.raises(UnknownTopicOrPartitionError) as caught:
            handle.result(timeout=10)
        assert 1.4 <= time.monotonic() - started < 5
        assert caught.value.code == "UNKNOWN_TOPIC_OR_PARTITION"


def test_admin_refuses_a_topic_with_fewer_replicas_than_min_insync_replicas(url, admin):
    with pytest.raises(KraftlogError) as caught:
        admin.create_topics([NewTopic("unwritable", 1, 1, {"min.insync.replicas": "2"})])
    assert caught.value.code == "INVALID_REPLICATION_FACTOR"
    assert "min.insync.replicas=2" in str(caught.value)
    assert "unwritable" not in admin.list_topics()


def test_admin_creates_describes_alters_and_deletes(url, admin):
    assert admin.create_topics([NewTopic("admin-t", 2, 1)], validate_only=True)[
        "admin-t"].error is None
    assert "admin-t" not in admin.list_topics()
    created = admin.create_topics([NewTopic("admin-t", 2, 1, {"retention.ms": "60000"})])
    assert created["admin-t"].num_partitions == 2 and created["admin-t"].topic_id
    with pytest.raises(TopicAlreadyExistsError):
        admin.create_topics(["admin-t"])
    results = admin.create_topics(["admin-t"], raise_on_error=False)
    assert results["admin-t"].error.code == "TOPIC_ALREADY_EXISTS"
    described = admin.describe_topics(["admin-t"])["admin-t"]
    assert [p.partition for p in described.partitions] == [0, 1]
    assert all(p.leader == 1 and p.isr == [1] for p in described.partitions)
    assert described.configs["retention.ms"] == ConfigEntry(
        "retention.ms", "60000", "TOPIC_CONFIG")
    assert described.configs["cleanup.policy"].source == "DEFAULT_CONFIG"
    configs = admin.describe_configs("admin-t")
    assert configs["retention.ms"].value == "60000"
    admin.alter_configs("admin-t", {"retention.ms": "120000", "cleanup.policy": None})
    assert admin.describe_configs("admin-t", ["retention.ms"])["retention.ms"].value == "120000"
    admin.alter_configs("admin-t", {"retention.ms": None})
    assert admin.describe_configs("admin-t")["retention.ms"].source == "DEFAULT_CONFIG"
    admin.create_partitions({"admin-t": 3})
    assert len(admin.describe_topics(["admin-t"])["admin-t"].partitions) == 3
    assert admin.elect_leaders([("admin-t", 0)]).keys() == {TopicPartition("admin-t", 0)}
    cluster = admin.describe_cluster()
    assert [b["id"] for b in cluster["brokers"]] == [1]
    admin.delete_topics(["admin-t"])
    assert "admin-t" not in admin.list_topics()
    with pytest.raises(UnknownTopicOrPartitionError):
        admin.delete_topics(["admin-t"])
    with pytest.raises(UnknownTopicOrPartitionError):
        admin.describe_topics(["admin-t"])


def test_a_tombstone_is_sent_and_read_as_a_null_value(url, admin):
    tps = create(admin, "tombstones", **{"cleanup.policy": "delete,compact"})
    assert admin.describe_configs("tombstones")["cleanup.policy"].value == "compact,delete"
    with Producer(url) as producer:
        producer.send("tombstones", b"v1", key=b"k")
        producer.send("tombstones", value=None, key=b"k")  # deletes k once compacted
        producer.send("tombstones", key="k2")  # value left out: null too
        producer.send("tombstones", b"", key=b"k3")  # empty is not null
        producer.flush()
    records = consume_all(url, tps, 4)
    assert [(r.key, r.value) for r in records] == [
        (b"k", b"v1"), (b"k", None), (b"k2", None), (b"k3", b"")]


def test_gzip_batches_round_trip(url, admin):
    tps = create(admin, "gzipped")
    with Producer(url, compression_type="gzip") as producer:
        for i in range(500):
            producer.send("gzipped", b"compressible " * 10 + b"%d" % i)
    records = consume_all(url, tps, 500)
    assert [r.value[-3:] for r in records[-2:]] == [b"498", b"499"]


async def test_the_asyncio_clients_round_trip(url):
    async with AsyncAdmin(url) as admin:
        await admin.create_topics([NewTopic("async-t", 2, 1)])
    async with AsyncProducer(url) as producer:
        handles = [await producer.send("async-t", f"v{i}", key=f"k{i}") for i in range(50)]
        bulk = await producer.send_batch("async-t", [f"b{i}" for i in range(20)],
                                         [f"k{i}" for i in range(20)])
        metadata = await producer.send_and_wait("async-t", "last", partition=0)
        await producer.flush()
    assert all(isinstance(m, RecordMetadata) for m in [await h for h in handles + bulk])
    async with AsyncConsumer(url, auto_offset_reset="earliest",
                             consumer_timeout_ms=1000) as consumer:
        consumer.assign([("async-t", 0), ("async-t", 1)])
        records = [r async for r in consumer]
    assert len(records) == 71
    by_key = {}
    for r in records:  # the bulk path placed each key where send placed it
        by_key.setdefault(r.key, set()).add(r.partition)
    assert all(len(partitions) == 1 for partitions in by_key.values())
    last = [r for r in records if r.partition == 0][-1]
    assert (last.value, last.offset) == (b"last", metadata.offset)


def test_three_brokers_each_lead_and_every_record_comes_back(tmp_path):
    with ProcessCluster(str(tmp_path / "three"), controllers=1, brokers=3) as cluster:
        cluster.start()
        cluster.wait_for_brokers_running(timeout_s=30)
        urls = [cluster.nodes[i].broker_url for i in cluster.broker_ids]
        with Admin(urls[0]) as admin:
            admin.create_topics([NewTopic("spread", 6, 1)])
            leaders = {p.partition: p.leader
                       for p in admin.describe_topics(["spread"])["spread"].partitions}
        assert set(leaders.values()) == set(cluster.broker_ids)
        with Producer(urls[1:]) as producer:  # bootstrap from a list
            handles = [producer.send("spread", b"%d" % i, key=b"%d" % i) for i in range(3000)]
            producer.flush()
            assert {h.result(0).partition for h in handles} == set(range(6))
        appended = {b: _messages_in(cluster, b, "spread") for b in cluster.broker_ids}
        assert sum(appended.values()) == 3000 and all(appended.values()), appended
        records = consume_all(urls[2], [TopicPartition("spread", p) for p in range(6)], 3000)
        assert sorted(int(r.value) for r in records) == list(range(3000))
        for p in range(6):
            offsets = [r.offset for r in records if r.partition == p]
            assert offsets == list(range(len(offsets)))


def _messages_in(cluster, broker_id, topic):
    """How many records of ``topic`` a broker appended as leader (/metrics)."""
    with urllib.request.urlopen(cluster.nodes[broker_id].broker_url + "/metrics",
                                timeout=5) as response:
        text = response.read().decode()
    prefix = f'kraftlog_messages_in_total{{topic="{topic}"}} '
    return sum(float(line[len(prefix):]) for line in text.splitlines()
               if line.startswith(prefix))


def test_a_producer_and_a_consumer_each_hold_one_stream_to_the_broker(url, admin):
    """Produces and fetches travel as messages on one WebSocket per client
    and broker (GET /v1/stream), not an HTTP exchange each: the broker
    counts one stream per client while they are open, each request under
    its own path, and none once they close."""
    tps = create(admin, "streamed", partitions=2)

    def metrics() -> dict[str, float]:
        with urllib.request.urlopen(url + "/metrics", timeout=10) as response:
            lines = response.read().decode().splitlines()
        return {name: float(value) for name, _, value in
                (line.rpartition(" ") for line in lines if line and not line.startswith("#"))}

    def produces(figures: dict[str, float]) -> float:
        return sum(v for k, v in figures.items()
                   if k.startswith("kraftlog_requests_total{") and '"/v1/produce"' in k)

    before = metrics()
    with Producer(url, linger_ms=0) as producer, \
            Consumer(url, auto_offset_reset="earliest", fetch_max_wait_ms=100) as consumer:
        for i in range(20):
            producer.send("streamed", b"%d" % i, partition=i % 2).result(10)
        consumer.assign(tps)
        got = []
        deadline = time.monotonic() + 20
        while len(got) < 20:
            assert time.monotonic() < deadline, f"only {len(got)} of 20 records"
            got.extend(consumer.poll(timeout_ms=500))
        during = metrics()
        assert during["kraftlog_client_streams"] == 2, during
    assert produces(during) - produces(before) >= 20
    assert sorted(int(r.value) for r in got) == list(range(20))
    deadline = time.monotonic() + 10
    while metrics()["kraftlog_client_streams"] != 0:
        assert time.monotonic() < deadline, "the clients' streams outlived the clients"
        time.sleep(0.05)
