"""Consumers' fetch sessions (KIP-227) in the ReplicationCore, on real logs:
after the opening fetch, a consumer's fetch names only the partitions whose
position moved and is answered with those and the others with news; a
session answers only its owner; the session cache keeps the biggest; a
fetch reads the session's other partitions only until its bytes are spent,
and those left behind lead the next one."""

from __future__ import annotations

import dataclasses

import pytest

from api.broker.data_api import decode_fetch, render_results
from api.broker.replication import ProduceItem, Respond
from kraft.image import MetadataImage
from kraft.records import PartitionRecord, RegisterBrokerRecord, TopicRecord
from storage.batch import build_batch, iter_batches
from storage.log import Log
from storage.manager import TopicPartition
from tests.unit.test_replication_core import FOLLOWER, LEADER, broker, of

PARTITIONS = 6


def image() -> MetadataImage:
    """Topic "c" led by LEADER alone (ISR of one: acks=1 writes commit at once)."""
    image = MetadataImage()
    for b in (LEADER, FOLLOWER):
        image.apply(RegisterBrokerRecord(b, f"inc-{b}", {"BROKER": f"127.0.0.1:{9000 + b}"},
                                         None), image.offset + 1)
    image.apply(TopicRecord("c", "id-c"), image.offset + 1)
    for p in range(PARTITIONS):
        image.apply(PartitionRecord("id-c", p, [LEADER], [LEADER], LEADER, 0, 0),
                    image.offset + 1)
    return image


@pytest.fixture
def leader(tmp_path):
    core = broker(tmp_path, LEADER, image())
    core.ready()
    return core


def produce(core, p: int, count: int, now_ms: int, value: bytes = b"v") -> list:
    """Append (acks=1); the core's actions after it."""
    core.produce(core.new_request_id(), [ProduceItem(
        TopicPartition("c", p), None, build_batch([(None, value)] * count))], 1, 30_000, now_ms)
    return core.ready()


class ConsumerLink:
    """A consumer's fetches in one session, as the wire carries them."""

    def __init__(self, core, owner: str = "User:ANONYMOUS\0c1", **body) -> None:
        self.core, self.owner, self.body = core, owner, body
        self.session_id, self.epoch = 0, 0
        self.positions = {p: 0 for p in range(PARTITIONS)}
        self.told: dict[int, int] = {}  # what the session holds: partition -> offset

    def fetch(self, now_ms: int, partitions=None, **overrides) -> dict | None:
        """Send the next fetch (naming what moved); the answer, or None if parked."""
        wanted = self.positions if partitions is None else {
            p: self.positions[p] for p in partitions}
        named = [p for p, offset in wanted.items()
                 if self.epoch == 0 or self.told.get(p) != offset]
        forgotten = [p for p in self.told if p not in wanted] if self.epoch else []
        body = {"max_wait_ms": 0, "min_bytes": 1, "session_id": self.session_id,
                "session_epoch": self.epoch, **self.body, **overrides,
                "partitions": [{"topic": "c", "partition": p, "offset": wanted[p]}
                               for p in named],
                "forgotten": [{"topic": "c", "partition": p} for p in forgotten]}
        request = decode_fetch(body)
        request.owner = self.owner
        request_id = self.core.new_request_id()
        self.core.fetch(request_id, request, now_ms)
        self.sent = (named, dict(wanted))
        return self.answer(request_id)

    def answer(self, request_id: int) -> dict | None:
        self.pending = request_id
        for respond in of(self.core.ready(), Respond):
            if respond.request_id == request_id:
                return self.take(respond)
        return None

    def take(self, respond: Respond) -> dict:
        answer = {"partitions": render_results("fetch", respond.results), **respond.fields}
        if answer.get("error") is None and answer.get("session_id", 0) > 0:
            self.session_id = answer["session_id"]
            self.epoch += 1
            self.told = dict(self.sent[1])
        elif answer.get("error") is None:
            self.session_id, self.epoch, self.told = 0, 0, {}
        for entry in answer["partitions"]:
            if entry["records"]:
                last = list(iter_batches(entry["records"]))[-1][0]
                self.positions[entry["partition"]] = last.next_offset
        return answer


def names(answer) -> list[int]:
    return sorted(entry["partition"] for entry in answer["partitions"])


def test_a_consumers_session_names_and_answers_only_what_moved(leader):
    consumer = ConsumerLink(leader)
    produce(leader, 1, 3, 1)
    opening = consumer.fetch(2)
    assert opening["session_id"] > 0 and names(opening) == list(range(PARTITIONS))
    assert consumer.positions[1] == 3
    # Names only 1, which moved; nothing has news, 1 included (Kafka's
    # incremental answers: a partition named with nothing new is left out).
    quiet = consumer.fetch(3)
    assert consumer.sent[0] == [1] and names(quiet) == []
    produce(leader, 4, 2, 4)
    answer = consumer.fetch(5)  # names nothing; 4 has records
    assert consumer.sent[0] == [] and names(answer) == [4]
    assert answer["partitions"][0]["high_watermark"] == 2 and consumer.positions[4] == 2
    assert consumer.fetch(6, partitions=[0, 1, 2, 3, 5]) is not None
    produce(leader, 4, 1, 7)
    assert names(consumer.fetch(8)) == [4]  # forgotten, then named again
    assert consumer.positions[4] == 3


def test_a_waiting_session_fetch_is_answered_by_an_append_to_a_partition_it_did_not_name(
        leader):
    consumer = ConsumerLink(leader, max_wait_ms=5_000)
    assert consumer.fetch(1, max_wait_ms=0)["session_id"] > 0
    assert consumer.fetch(2) is None  # names nothing; nothing new: it waits
    actions = produce(leader, 5, 2, 3)
    (respond,) = [r for r in of(actions, Respond) if r.request_id == consumer.pending]
    answer = consumer.take(respond)
    assert names(answer) == [5] and consumer.positions[5] == 2


def test_a_session_answers_only_its_owner_and_closes_on_the_final_epoch(leader):
    consumer = ConsumerLink(leader)
    consumer.fetch(1)
    thief = ConsumerLink(leader, owner="User:mallory\0c2")
    thief.session_id, thief.epoch = consumer.session_id, consumer.epoch
    refused = thief.fetch(2)
    assert refused["error"]["code"] == "FETCH_SESSION_ID_NOT_FOUND" and not refused[
        "partitions"]
    assert consumer.fetch(3)["session_id"] == consumer.session_id  # untouched by it
    stale = consumer.fetch(4, session_epoch=consumer.epoch + 5)
    assert stale["error"]["code"] == "INVALID_FETCH_SESSION_EPOCH"
    session_id, epoch = consumer.session_id, consumer.epoch
    closing = consumer.fetch(5, session_epoch=-1, partitions=[])  # Kafka's final epoch
    assert closing.get("session_id", 0) == 0 and "error" not in closing
    consumer.session_id, consumer.epoch = session_id, epoch
    gone = consumer.fetch(6)
    assert gone["error"]["code"] == "FETCH_SESSION_ID_NOT_FOUND"


def test_the_cache_keeps_the_biggest_sessions_and_the_rest_fetch_without(leader):
    leader.settings = dataclasses.replace(leader.settings, fetch_session_cache_slots=1)
    big = ConsumerLink(leader, owner="a")
    assert big.fetch(1, partitions=[0, 1, 2])["session_id"] > 0
    small = ConsumerLink(leader, owner="b")
    produce(leader, 0, 1, 2)
    answer = small.fetch(3, partitions=[0, 1])
    # no room (its session would be smaller): answered in full, without one
    assert answer["session_id"] == 0 and names(answer) == [0, 1]
    assert small.positions[0] == 1
    assert big.fetch(4, partitions=[0, 1, 2])["session_id"] == big.session_id
    bigger = ConsumerLink(leader, owner="c")
    assert bigger.fetch(5)["session_id"] > 0  # six partitions: the three's goes
    assert big.fetch(6, partitions=[0, 1, 2])["error"]["code"] == "FETCH_SESSION_ID_NOT_FOUND"


def test_a_fetch_reads_its_sessions_others_only_until_its_bytes_are_spent(leader):
    value = b"x" * 1000
    consumer = ConsumerLink(leader, max_bytes=1)  # one batch per answer (KIP-74)
    consumer.fetch(1)  # opens, with nothing yet
    for p in range(PARTITIONS):
        produce(leader, p, 1, 2, value)
    served = []
    for now in range(3, 3 + PARTITIONS):
        answer = consumer.fetch(now)
        with_records = [e["partition"] for e in answer["partitions"] if e["records"]]
        assert len(with_records) == 1, answer
        served += with_records
    # each partition once, none starved by the others
    assert sorted(served) == list(range(PARTITIONS))
    assert all(offset == 1 for offset in consumer.positions.values())
    quiet = consumer.fetch(10)  # nothing left: only the last one named, no news
    assert [e for e in quiet["partitions"] if e["records"]] == []


def test_a_partition_named_again_where_it_was_is_answered_though_nothing_is_new(leader):
    """One named further on with nothing new is left out of the answer; a
    fetcher that dropped an answer names the partition again where it was,
    and is told what the session holds for it (the simulation found a
    follower stuck at an old high watermark without this)."""
    consumer = ConsumerLink(leader)
    produce(leader, 1, 3, 1)
    consumer.fetch(2)  # opens: 1's records
    assert names(consumer.fetch(3)) == []  # 1 named at 3, its new position: nothing new
    consumer.told[1] = None  # as if that answer was dropped: 1 is named again, at 3
    again = consumer.fetch(4)
    assert consumer.sent[0] == [1] and names(again) == [1]
    assert again["partitions"][0]["high_watermark"] == 3 and not again["partitions"][0][
        "records"]


def test_an_answer_whose_bytes_are_spent_reads_no_further_partition(leader, monkeypatch):
    """Once a partition's next batch does not fit what is left of a fetch's
    bytes, the partitions after it are not read (each would look a batch up
    only to find it too big, thousands of times in a fetch of thousands of
    partitions); the session reads them at the next fetch."""
    value = b"x" * 1000
    for p in range(PARTITIONS):
        produce(leader, p, 1, 1, value)
    one_batch = len(build_batch([(None, value)]))
    reads = []
    read = Log.read
    monkeypatch.setattr(Log, "read", lambda log, *args, **kwargs: (
        reads.append(log) or read(log, *args, **kwargs)))
    consumer = ConsumerLink(leader, max_bytes=one_batch + one_batch // 2)
    answer = consumer.fetch(2)  # names all six
    assert [e["partition"] for e in answer["partitions"] if e["records"]] == [0]
    assert len(reads) == 2  # the batch that fits, and the one that did not
    for now in range(3, 3 + PARTITIONS):
        consumer.fetch(now)
    assert all(offset == 1 for offset in consumer.positions.values())


def test_a_partition_answered_with_an_error_leaves_the_session_and_made_up_names_do_not_stay(
        leader):
    """A consumer names a partition that failed again when it retries, so the
    session keeps only partitions served here: names a client makes up (or
    whose leader moved) go with the answer that refused them, and a session
    never holds more than one fetch may name."""
    consumer = ConsumerLink(leader)
    consumer.fetch(1)
    session = leader._fetch_sessions[consumer.session_id]
    assert len(session.specs) == PARTITIONS
    body = {"max_wait_ms": 0, "session_id": consumer.session_id,
            "session_epoch": consumer.epoch,
            "partitions": [{"topic": "nope", "partition": p, "offset": 0} for p in range(500)]}
    request = decode_fetch(body)
    request.owner = consumer.owner
    leader.fetch(leader.new_request_id(), request, 2)
    (respond,) = of(leader.ready(), Respond)
    assert len(respond.results) == 500 and all(r["error"] is not None for r in respond.results)
    assert len(session.specs) == PARTITIONS  # the made-up names did not stay
    assert sorted(leader.fetch_session_figures().items()) == [
        ("consumer_session_partitions", PARTITIONS), ("consumer_sessions", 1),
        ("follower_sessions", 0), ("session_evictions", 0)]


def test_a_session_that_would_hold_more_than_a_fetch_may_name_is_closed(leader, monkeypatch):
    from api.broker import replication

    monkeypatch.setattr(replication, "PARTITIONS_PER_REQUEST_MAX", 8)
    consumer = ConsumerLink(leader)
    consumer.fetch(1)  # 6 partitions
    more = {"max_wait_ms": 0, "session_id": consumer.session_id, "session_epoch": consumer.epoch,
            "partitions": [{"topic": "other", "partition": p, "offset": 0} for p in range(3)]}
    request = decode_fetch(more)
    request.owner = consumer.owner
    leader.fetch(leader.new_request_id(), request, 2)
    (respond,) = of(leader.ready(), Respond)
    assert respond.fields == {"session_id": 0}  # answered without; the consumer reopens
    assert consumer.session_id not in leader._fetch_sessions


def test_consumer_session_ids_are_not_counted_up(leader):
    ids = set()
    for i in range(20):
        consumer = ConsumerLink(leader, owner=f"c{i}")
        consumer.fetch(1)
        ids.add(consumer.session_id)
    assert len(ids) == 20 and ids != set(range(min(ids), min(ids) + 20))


def test_a_partition_its_sender_may_no_longer_read_is_refused_and_leaves_the_session(leader):
    """With ACLs the broker judges every partition a session answers, named
    or not, at each fetch (``FetchRequest.refusal``): one refused is answered
    with the refusal and no records, and leaves the session like any answer
    with an error, so later appends to it cost the broker nothing."""
    consumer = ConsumerLink(leader)
    assert names(consumer.fetch(1)) == list(range(PARTITIONS))
    session = leader._fetch_sessions[consumer.session_id]
    produce(leader, 2, 3, 2)
    refused_topics = {"c"}
    body = {"max_wait_ms": 0, "session_id": consumer.session_id,
            "session_epoch": consumer.epoch, "partitions": [], "forgotten": []}
    request = decode_fetch(body)
    request.owner = consumer.owner
    request.refusal = lambda topic: PermissionError(f"may not read {topic}") \
        if topic in refused_topics else None
    request_id = leader.new_request_id()
    leader.fetch(request_id, request, 3)
    (respond,) = [r for r in of(leader.ready(), Respond) if r.request_id == request_id]
    (result,) = respond.results
    assert (result["partition"], result["records"]) == (2, b"")
    assert isinstance(result["error"], PermissionError)
    assert TopicPartition("c", 2) not in session.specs
    assert len(session.specs) == PARTITIONS - 1
