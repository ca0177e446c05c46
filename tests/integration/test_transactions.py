"""Transactions against real brokers: markers, the last stable offset,
read_committed fetches and consumers."""

from __future__ import annotations

import time

from api.client import Consumer, TopicPartition
from storage.batch import BatchBuilder
from tests.integration.test_broker_api import (assert_serving, call, create_topic, fetch, post,
                                               produce)


def txn_batch(pid: int, epoch: int, seq: int, values: list[bytes]) -> bytes:
    builder = BatchBuilder(producer_id=pid, producer_epoch=epoch, base_sequence=seq,
                           transactional=True)
    for value in values:
        builder.append(None, value, timestamp_ms=int(time.time() * 1000))
    return builder.build()


def marker(url: str, topic: str, pid: int, epoch: int, committed: bool,
           coordinator_epoch: int = 0) -> dict:
    (result,) = call(url, "/v1/txn/markers", {"markers": [
        {"topic": topic, "partition": 0, "producer_id": pid, "producer_epoch": epoch,
         "coordinator_epoch": coordinator_epoch, "committed": committed}]})["markers"]
    return result


def open_transaction(url: str, tid: str, topic: str, inits: int = 1) -> tuple[int, int]:
    """Producer id and epoch of ``tid`` (``inits`` InitProducerIds: each
    bumps the epoch) with ``topic``-0 added to its open transaction."""
    from chaos.cluster import wait_until
    wait_until(lambda: post(url, "/v1/transactions/coordinator",
                            {"transactional_id": tid}).status == 200, 20,
               "the transaction coordinator")
    for _ in range(inits):
        # Until the coordinator has loaded (a refusal changes nothing).
        answer = wait_until(lambda: (reply := post(url, "/v1/producers/init", {
            "transactional_id": tid})).status == 200 and reply.body, 20, "InitProducerId")
    pid, epoch = answer["producer_id"], answer["producer_epoch"]
    call(url, "/v1/transactions/add_partitions", {
        "transactional_id": tid, "producer_id": pid, "producer_epoch": epoch,
        "partitions": [{"topic": topic, "partition": 0}]})
    return pid, epoch


def txn_produce(url: str, topic: str, records: bytes, tid: str | None) -> dict:
    (result,) = call(url, "/v1/produce", {
        "acks": -1, "timeout_ms": 10_000, "transactional_id": tid,
        "partitions": [{"topic": topic, "partition": 0, "records": records}]})["partitions"]
    return result


def test_read_committed_stops_at_an_open_transaction_and_skips_aborted_ones(url):
    topic = "txn-visibility"
    create_topic(url, topic)
    a, ea = open_transaction(url, "visibility-a", topic)
    b, eb = open_transaction(url, "visibility-b", topic)
    assert txn_produce(url, topic, txn_batch(a, ea, 0, [b"a1", b"a2"]),               # 0-1
                       "visibility-a")["error"] is None
    assert txn_produce(url, topic, txn_batch(b, eb, 0, [b"b1"]),                      # 2
                       "visibility-b")["error"] is None
    (part,) = fetch(url, [(topic, 0, 0)])
    assert (part["high_watermark"], part["last_stable_offset"]) == (3, 0)
    body = {"isolation_level": "read_committed", "max_wait_ms": 0,
            "partitions": [{"topic": topic, "partition": 0, "offset": 0}]}
    (held,) = call(url, "/v1/fetch", body)["partitions"]
    assert held["records"] == b"" and held["last_stable_offset"] == 0
    assert marker(url, topic, a, ea, committed=False)["error"] is None                # 3
    assert marker(url, topic, b, eb, committed=True)["error"] is None                 # 4
    (done,) = call(url, "/v1/fetch", body)["partitions"]
    assert done["last_stable_offset"] == 5
    assert done["aborted_transactions"] == [{"producer_id": a, "first_offset": 0}]
    assert _read(url, topic, 0, "read_committed") == [b"b1"]
    # read_uncommitted consumers see both, never the markers.
    with Consumer(url, auto_offset_reset="earliest") as c:
        c.assign([TopicPartition(topic, 0)])
        seen: list[bytes] = []
        deadline = time.monotonic() + 10
        while len(seen) < 3 and time.monotonic() < deadline:
            seen.extend(r.value for r in c.poll(timeout_ms=200))
    assert seen == [b"a1", b"a2", b"b1"]


def test_a_write_the_coordinator_does_not_confirm_opens_no_transaction(url):
    # KIP-890: a transactional batch that would open a transaction in a
    # partition is appended only once the coordinator confirms the partition
    # is in the producer's open transaction.
    topic = "txn-verify"
    create_topic(url, topic)
    pid, epoch = open_transaction(url, "verify-app", "txn-visibility")  # another partition
    for tid in (None, "verify-app", "someone-else"):
        result = txn_produce(url, topic, txn_batch(pid, epoch, 0, [b"x"]), tid)
        assert result["error"]["code"] in ("INVALID_TXN_STATE", "INVALID_PRODUCER_ID_MAPPING"), \
            (tid, result)
    (part,) = fetch(url, [(topic, 0, 0)])
    assert part["log_end_offset"] == 0
    assert_serving(url)


def test_markers_from_fenced_epochs_and_bad_marker_requests_are_refused(url):
    topic = "txn-fencing"
    create_topic(url, topic)
    pid, epoch = open_transaction(url, "fencing-app", topic, inits=2)  # epoch 1
    assert txn_produce(url, topic, txn_batch(pid, epoch, 0, [b"x"]), "fencing-app")["error"] \
        is None
    assert marker(url, topic, pid, epoch - 1, True)["error"]["code"] == \
        "INVALID_PRODUCER_EPOCH"
    assert marker(url, topic, pid, epoch, True, coordinator_epoch=5)["error"] is None
    call(url, "/v1/transactions/add_partitions", {
        "transactional_id": "fencing-app", "producer_id": pid, "producer_epoch": epoch,
        "partitions": [{"topic": topic, "partition": 0}]})
    assert txn_produce(url, topic, txn_batch(pid, epoch, 1, [b"y"]), "fencing-app")["error"] \
        is None
    assert marker(url, topic, pid, epoch, True, coordinator_epoch=4)["error"]["code"] == \
        "TRANSACTION_COORDINATOR_FENCED"
    (plain,) = produce(url, [(topic, 0, _plain_from(pid, epoch, 2))], acks=-1)
    assert plain["error"]["code"] == "INVALID_TXN_STATE"
    reply = post(url, "/v1/txn/markers", {"markers": [{"topic": topic, "partition": 0}]})
    assert reply.status == 400 and reply.body["error"]["code"] == "INVALID_REQUEST"
    assert_serving(url)


def _plain_from(pid: int, epoch: int, seq: int) -> bytes:
    builder = BatchBuilder(producer_id=pid, producer_epoch=epoch, base_sequence=seq)
    builder.append(None, b"plain", timestamp_ms=int(time.time() * 1000))
    return builder.build()


# -- the transactional producer -----------------------------------------------------
def test_a_committed_transaction_is_seen_whole_and_an_aborted_one_never(url):
    from api.client import Producer
    create_topic(url, "txn-client", partitions=2)
    with Producer(url, transactional_id="orders-app") as producer:
        producer.init_transactions()
        producer.begin_transaction()
        for i in range(10):
            producer.send("txn-client", f"c{i}", partition=i % 2)
        producer.commit_transaction()
        producer.begin_transaction()
        for i in range(6):
            producer.send("txn-client", f"a{i}", partition=i % 2)
        producer.flush()
        producer.abort_transaction()
        producer.begin_transaction()
        producer.send("txn-client", "after", partition=0)
        producer.commit_transaction()
    seen = {p: _read(url, "txn-client", p, "read_committed") for p in (0, 1)}
    assert seen[0] == [b"c0", b"c2", b"c4", b"c6", b"c8", b"after"]
    assert seen[1] == [b"c1", b"c3", b"c5", b"c7", b"c9"]
    raw = _read(url, "txn-client", 1, "read_uncommitted")
    assert raw == [b"c1", b"c3", b"c5", b"c7", b"c9", b"a1", b"a3", b"a5"]


def test_a_new_instance_fences_the_old_one_and_aborts_what_it_left_open(url):
    from api.client import KraftlogError, Producer
    create_topic(url, "txn-zombie")
    old = Producer(url, transactional_id="zombie-app")
    old.init_transactions()
    old.begin_transaction()
    old.send("txn-zombie", "left open").result(10)
    with Producer(url, transactional_id="zombie-app") as new:
        new.init_transactions()  # aborts the old instance's transaction
        new.begin_transaction()
        new.send("txn-zombie", "new")
        new.commit_transaction()
    old.send("txn-zombie", "zombie write")
    try:
        old.commit_transaction()
        raise AssertionError("the fenced producer committed")
    except KraftlogError as exc:
        assert exc.code in ("PRODUCER_FENCED", "INVALID_PRODUCER_EPOCH", "TRANSACTION_ABORTABLE")
    old.close(timeout_ms=1000)
    assert _read(url, "txn-zombie", 0, "read_committed") == [b"new"]


def test_transaction_misuse_gets_kafka_errors(url):
    from api.client import KraftlogError, Producer
    create_topic(url, "txn-misuse")
    with Producer(url, transactional_id="misuse-app") as producer:
        for call in (producer.begin_transaction, producer.commit_transaction):
            try:
                call()
                raise AssertionError(f"{call.__name__} before init_transactions")
            except KraftlogError as exc:
                assert exc.code == "INVALID_TXN_STATE" and "init_transactions" in str(exc)
        producer.init_transactions()
        try:
            producer.send("txn-misuse", "outside")
            raise AssertionError("send outside a transaction")
        except KraftlogError as exc:
            assert exc.code == "INVALID_TXN_STATE"
    reply = post(url, "/v1/transactions/end", {"transactional_id": "nobody", "producer_id": 1,
                                               "producer_epoch": 0, "committed": True})
    assert reply.body["error"]["code"] in ("INVALID_PRODUCER_ID_MAPPING", "NOT_COORDINATOR")
    assert_serving(url)


def _read(url: str, topic: str, partition: int, isolation: str) -> list[bytes]:
    with Consumer(url, isolation_level=isolation, auto_offset_reset="earliest") as c:
        tp = TopicPartition(topic, partition)
        c.assign([tp])
        end = c.end_offsets([tp])[tp]
        values: list[bytes] = []
        deadline = time.monotonic() + 10
        while c.position(tp) < end and time.monotonic() < deadline:
            values.extend(r.value for r in c.poll(timeout_ms=200))
        return values


# -- the CLI ---------------------------------------------------------------------------
def kraftlog(url: str, *args: str) -> str:
    import subprocess
    import sys
    result = subprocess.run([sys.executable, "-m", "api.cli", "--bootstrap", url, *args],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_the_cli_lists_describes_and_aborts_a_hanging_transaction(url):
    from api.client import KraftlogError, Producer
    from chaos.cluster import wait_until
    create_topic(url, "txn-cli")
    producer = Producer(url, transactional_id="hanging-app")
    producer.init_transactions()
    producer.begin_transaction()
    producer.send("txn-cli", "pending").result(10)
    listed = kraftlog(url, "transactions", "list")
    assert any(line.split()[0] == "hanging-app" and "Ongoing" in line
               for line in listed.splitlines()), listed
    described = kraftlog(url, "transactions", "describe", "hanging-app")
    assert "txn-cli-0" in described and "Ongoing" in described
    read = ["consume", "txn-cli", "--from-beginning", "--timeout-ms", "1500"]
    assert kraftlog(url, *read) == "pending\n"
    assert kraftlog(url, *read, "--isolation-level", "read_committed") == ""
    assert "LSO" in kraftlog(url, "topics", "describe", "txn-cli")
    assert "fenced" in kraftlog(url, "transactions", "abort", "hanging-app")
    wait_until(lambda: "CompleteAbort" in kraftlog(url, "transactions", "describe",
                                                   "hanging-app"), 10, "the abort to complete")
    assert kraftlog(url, *read, "--isolation-level", "read_committed") == ""
    try:
        producer.commit_transaction()
        raise AssertionError("the aborted transaction's producer committed")
    except KraftlogError as exc:
        assert exc.code in ("PRODUCER_FENCED", "INVALID_PRODUCER_EPOCH")
    producer.close(timeout_ms=1000)


def test_transactional_ids_a_url_path_cannot_hold_are_described_by_query(url):
    # "." and ".." are dropped from a URL's path by browsers and by aiohttp's
    # client (the Admin's, the brokers' forwarding): ?transactional_id= works.
    from api.client import Admin, Producer
    create_topic(url, "txn-dots")
    for tid in (".", ".."):
        with Producer(url, transactional_id=tid) as producer:
            producer.init_transactions()
            producer.begin_transaction()
            producer.send("txn-dots", b"x").result(10)
            with Admin(url) as admin:
                described = admin.describe_transaction(tid)
            assert described["transactional_id"] == tid and described["state"] == "Ongoing"
            assert "Ongoing" in kraftlog(url, "transactions", "describe", tid)
            producer.commit_transaction()


def test_consumed_offsets_commit_with_the_transaction_and_only_with_it(single):
    import signal
    from api.client import Producer
    from chaos.cluster import wait_until
    url = single.nodes[1].broker_url
    create_topic(url, "txn-out")
    group = "txn-pipeline"
    tp = TopicPartition("txn-in", 0)

    def committed() -> int | None:
        reply = call(url, "/v1/groups/coordinator", {"group_id": group})
        answer = call(reply["coordinator_url"], "/v1/groups/offsets/fetch",
                      {"group_id": group, "partitions": None})
        found = [p["offset"] for p in answer["partitions"] if p["topic"] == "txn-in"]
        return found[0] if found else None

    with Producer(url, transactional_id="pipeline-app") as producer:
        producer.init_transactions()
        producer.begin_transaction()
        producer.send("txn-out", "aborted output")
        producer.send_offsets_to_transaction({tp: 5}, group)
        producer.abort_transaction()
        assert committed() is None
        producer.begin_transaction()
        producer.send("txn-out", "committed output")
        producer.send_offsets_to_transaction({tp: 7}, group)
        assert committed() is None  # not before the commit
        producer.commit_transaction()
    assert committed() == 7
    assert _read(url, "txn-out", 0, "read_committed") == [b"committed output"]
    # A coordinator reloading the partition replays the transaction and its
    # marker to the same offsets.
    single.kill(1, signal.SIGTERM)
    single.start([1])
    single.wait_for_brokers_running(timeout_s=30)
    assert wait_until(lambda: committed() == 7, 20, "the group's offsets after a restart")


def test_the_rest_read_honours_read_committed(url):
    import json
    import urllib.request
    from api.client import Producer
    create_topic(url, "txn-rest")
    with Producer(url, transactional_id="rest-app") as producer:
        producer.init_transactions()
        for value, commit in (("kept", True), ("dropped", False), ("kept too", True)):
            producer.begin_transaction()
            producer.send("txn-rest", value)
            if commit:
                producer.commit_transaction()
            else:
                producer.flush()
                producer.abort_transaction()

    def read(isolation: str) -> list[str]:
        with urllib.request.urlopen(f"{url}/topics/txn-rest/partitions/0/records?offset=0"
                                    f"&isolation_level={isolation}", timeout=10) as reply:
            return [r["value"] for r in json.load(reply)]

    assert read("read_committed") == ["kept", "kept too"]
    assert read("read_uncommitted") == ["kept", "dropped", "kept too"]


def test_large_transactions_with_pipelined_requests_commit(url):
    # Requests of one partition in flight together travel over separate
    # connections and may arrive out of order; the broker refuses the early
    # one (OUT_OF_ORDER_SEQUENCE_NUMBER) and the producer must retry it in
    # order, not fail the transaction.
    from api.client import Producer
    create_topic(url, "txn-large", partitions=4)
    value = b"x" * 100
    with Producer(url, transactional_id="large-app", batch_size=16 * 1024) as producer:
        producer.init_transactions()
        for _ in range(8):
            producer.begin_transaction()
            for _ in range(5_000):
                producer.send("txn-large", value)
            producer.commit_transaction()
    total = sum(len(_read(url, "txn-large", p, "read_committed")) for p in range(4))
    assert total == 40_000


def test_a_failed_record_makes_the_transaction_abortable_at_once(url):
    from api.client import KraftlogError, Producer
    create_topic(url, "txn-failing")
    with Producer(url, transactional_id="failing-app") as producer:
        producer.init_transactions()
        producer.begin_transaction()
        producer.send("txn-failing", "fine")
        producer.send("txn-failing", b"x" * 200_000)  # over the broker's request limit
        started = time.monotonic()
        try:
            producer.commit_transaction()
            raise AssertionError("committed a transaction with a failed record")
        except KraftlogError as exc:
            assert exc.code == "TRANSACTION_ABORTABLE" and "MESSAGE_TOO_LARGE" in str(exc)
        assert time.monotonic() - started < 10  # not after delivery_timeout_ms
        producer.abort_transaction()
        producer.begin_transaction()
        producer.send("txn-failing", "after")
        producer.commit_transaction()
    assert _read(url, "txn-failing", 0, "read_committed") == [b"after"]
