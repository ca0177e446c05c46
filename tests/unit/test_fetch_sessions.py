"""Follower fetch sessions (KIP-227) between two ReplicationCores on real
logs: after the fetch that opens a session, a fetch names only the
partitions whose position changed and is answered with only those and the
ones with news, and nothing is lost or stuck on the way."""

from __future__ import annotations

import pytest

from api.broker.data_api import decode_fetch, render_results
from api.broker.replication import (CancelRequest, ProduceItem, Respond, SendAlterPartition,
                                    SendFetch)
from kraft.image import MetadataImage
from kraft.records import (ConfigRecord, PartitionChangeRecord, PartitionRecord,
                           RegisterBrokerRecord, TopicRecord, UnfenceBrokerRecord)
from storage.batch import build_batch
from storage.manager import TopicPartition
from tests.unit.test_replication_core import FOLLOWER, LAG_MS, LEADER, broker, of

PARTITIONS = 5
TPS = [TopicPartition("t", p) for p in range(PARTITIONS)]


def image() -> MetadataImage:
    image = MetadataImage()
    for b in (LEADER, FOLLOWER):
        image.apply(RegisterBrokerRecord(b, f"inc-{b}", {"BROKER": f"127.0.0.1:{9000 + b}"},
                                         None), image.offset + 1)
    image.apply(TopicRecord("t", "id-1"), image.offset + 1)
    for p in range(PARTITIONS):
        image.apply(PartitionRecord("id-1", p, [LEADER, FOLLOWER], [LEADER, FOLLOWER], LEADER,
                                    0, 0), image.offset + 1)
    image.apply(ConfigRecord("topic", "t", "min.insync.replicas", "2"), image.offset + 1)
    return image


@pytest.fixture
def pair(tmp_path):
    meta = image()
    leader, follower = broker(tmp_path, LEADER, meta), broker(tmp_path, FOLLOWER, meta)
    leader.ready()
    return leader, follower


class Link:
    """Carries the follower's fetches to the leader and the answers back, as
    the shell does (the answer's top-level fields included)."""

    def __init__(self, leader, follower) -> None:
        self.leader, self.follower = leader, follower
        self.parked: dict[int, tuple[SendFetch, int]] = {}  # leader's id -> fetch
        self.other: list[Respond] = []  # the leader's other answers (writes)
        self.proposals: list[SendAlterPartition] = []  # the leader's ISR changes

    def send(self, now_ms: int) -> SendFetch | None:
        """The follower's next fetch, delivered; None if it sent none."""
        fetches = of(self.follower.ready(), SendFetch)
        if not fetches:
            return None
        (fetch,) = fetches
        request_id = self.leader.new_request_id()
        self.parked[request_id] = (fetch, request_id)
        self.leader.fetch(request_id, decode_fetch(fetch.body), now_ms)
        return fetch

    def answer(self, now_ms: int) -> dict | None:
        """Carry the leader's answers back; the last one carried."""
        carried = None
        actions = self.leader.ready()
        self.proposals += of(actions, SendAlterPartition)
        for respond in of(actions, Respond):
            if respond.request_id not in self.parked:
                self.other.append(respond)
                continue
            fetch, _ = self.parked.pop(respond.request_id)
            carried = {"partitions": render_results("fetch", respond.results), **respond.fields}
            self.follower.fetch_answered(fetch.request_id, carried, now_ms)
        return carried


def produce(core, tp: TopicPartition, count: int, now_ms: int, acks: int = 1) -> int:
    request_id = core.new_request_id()
    core.produce(request_id, [ProduceItem(tp, None, build_batch([(None, b"v")] * count))],
                 acks, 30_000, now_ms)
    return request_id


def names(items) -> list[int]:
    return sorted(item["partition"] for item in items)


def test_after_the_opening_fetch_only_what_changed_is_named_and_answered(pair):
    leader, follower = pair
    link = Link(leader, follower)
    opening = link.send(1)
    assert opening.body["session_epoch"] == 0 and names(opening.body["partitions"]) == [
        0, 1, 2, 3, 4]
    answer = link.answer(1)  # nothing to read yet: the opening fetch parks ...
    assert answer is None
    produce(leader, TPS[2], 3, 2)
    answer = link.answer(2)  # ... and the append answers it, every partition named
    assert answer["session_id"] > 0 and names(answer["partitions"]) == [0, 1, 2, 3, 4]
    assert follower.partitions[TPS[2]].log_end_offset == 3
    fetch = link.send(3)  # only partition 2 moved
    assert fetch.body["session_epoch"] == 1 and names(fetch.body["partitions"]) == [2]
    assert link.answer(3) is None  # parked: nothing new
    produce(leader, TPS[4], 2, 4)
    answer = link.answer(4)
    # 2 (named; its high watermark moved) and 4 (records); the quiet ones not at all
    assert names(answer["partitions"]) == [2, 4]
    assert follower.partitions[TPS[4]].log_end_offset == 2
    assert follower.partitions[TPS[2]].high_watermark == 3
    fetch = link.send(5)
    assert fetch.body["session_epoch"] == 2 and names(fetch.body["partitions"]) == [4]


def test_acks_all_completes_through_an_incremental_fetch(pair):
    leader, follower = pair
    link = Link(leader, follower)
    link.send(1)
    produce(leader, TPS[0], 1, 1)
    link.answer(1)  # the session is open
    link.send(2)
    request_id = produce(leader, TPS[3], 4, 3, acks=-1)
    link.answer(3)  # records for 3, which the fetch did not name
    assert follower.partitions[TPS[3]].log_end_offset == 4
    assert not [r for r in link.other if r.request_id == request_id]
    link.send(4)  # names 3 at its new log end: the leader's high watermark moves
    link.answer(4)
    done = [r for r in link.other if r.request_id == request_id]
    assert done and done[0].results[0]["error"] is None
    assert leader.partitions[TPS[3]].high_watermark == 4


def test_an_unknown_session_is_refused_and_the_follower_opens_a_new_one(pair, tmp_path):
    leader, follower = pair
    link = Link(leader, follower)
    link.send(1)
    produce(leader, TPS[1], 1, 1)
    link.answer(1)
    # The leader restarts: its sessions are gone.
    restarted = broker(tmp_path / "again", LEADER, image())
    restarted.ready()
    link.leader = restarted
    fetch = link.send(2)
    assert fetch.body["session_epoch"] == 1
    answer = link.answer(2)
    assert answer["error"]["code"] == "FETCH_SESSION_ID_NOT_FOUND"
    reopened = link.send(3)
    assert reopened.body["session_epoch"] == 0
    assert names(reopened.body["partitions"]) == [0, 1, 2, 3, 4]


def test_records_the_byte_budget_left_behind_come_with_the_next_fetch(tmp_path):
    meta = image()
    leader = broker(tmp_path, LEADER, meta)
    follower = broker(tmp_path, FOLLOWER, meta)
    follower.settings = type(follower.settings)(lag_time_max_ms=LAG_MS,
                                                fetch_response_bytes_max=1)
    leader.ready()
    link = Link(leader, follower)
    link.send(1)
    produce(leader, TPS[0], 1, 1)
    link.answer(1)  # open
    link.send(2)
    for tp in TPS[1:]:
        produce(leader, tp, 2, 3)
    answer = link.answer(3)
    # One batch fits the budget (the first comes whole); the others wait.
    assert sum(1 for r in answer["partitions"] if r["records"]) == 1
    for now in range(4, 12):
        if link.send(now):
            link.answer(now)
    assert [follower.partitions[tp].log_end_offset for tp in TPS] == [1, 2, 2, 2, 2]


def test_a_quiet_caught_up_follower_stays_in_the_isr(pair):
    """Its fetches stop naming the quiet partitions; the leader's ISR check
    counts it caught up as of its session's last fetch, not as lagging."""
    leader, follower = pair
    link = Link(leader, follower)
    link.send(1)
    for tp in TPS:
        produce(leader, tp, 1, 1)
    link.answer(1)
    now = 2
    while now < 3 * LAG_MS:  # quiet: each long-poll times out and comes back
        link.send(now)
        leader.tick(now + 500)
        link.answer(now + 500)
        now += 1000
        leader.tick(now)
        link.answer(now)
    assert link.proposals == []  # no shrink proposed
    assert all(leader.partitions[tp].isr == [LEADER, FOLLOWER] for tp in TPS)


@pytest.mark.parametrize("body, field", [
    ({"partitions": [], "session_epoch": -2}, "session_epoch"),
    ({"replica_id": 2, "partitions": [], "session_epoch": -2}, "session_epoch"),
    ({"replica_id": 2, "partitions": [], "session_id": -1, "session_epoch": 1}, "session_id"),
    ({"replica_id": 2, "partitions": [], "session_id": "x", "session_epoch": 1}, "session_id"),
    ({"replica_id": 2, "partitions": [], "session_epoch": 1, "forgotten": [{"topic": "t"}]},
     "forgotten[0].partition"),
    ({"replica_id": 2, "partitions": [], "session_epoch": 1, "forgotten": "t"}, "forgotten"),
])
def test_bad_session_fields_are_refused_naming_the_field(body, field):
    from protocol.errors import InvalidRequestError

    with pytest.raises(InvalidRequestError, match=field.replace("[", r"\[").replace("]", r"\]")):
        decode_fetch(body)


def test_a_follower_of_more_partitions_than_a_request_may_name_fetches_them_all(
        tmp_path, monkeypatch):
    """The broker refuses a fetch naming more than PARTITIONS_PER_REQUEST_MAX
    partitions: a follower of more names the rest in its next fetches."""
    import api.broker.replication as replication

    monkeypatch.setattr(replication, "PARTITIONS_PER_REQUEST_MAX", 3)
    meta = image()
    leader, follower = broker(tmp_path, LEADER, meta), broker(tmp_path, FOLLOWER, meta)
    leader.ready()
    link = Link(leader, follower)
    for tp in TPS:
        produce(leader, tp, 1, 1)
    opening = link.send(1)
    assert len(opening.body["partitions"]) == 3
    link.answer(1)
    left_out = {0, 1, 2, 3, 4} - set(names(opening.body["partitions"]))
    rest = link.send(2)  # those left out come first (the answered ones moved back)
    assert set(names(rest.body["partitions"])) >= left_out
    link.answer(2)
    assert [follower.partitions[tp].log_end_offset for tp in TPS] == [1] * PARTITIONS


def test_a_restarted_followers_old_session_never_speaks_for_it(pair, tmp_path):
    """A follower restarts with less than it had (its unflushed tail lost)
    and opens a new session; its old session, still on the leader, must not
    put it back where it was: not its log end, not the high watermark, not
    the ISR."""
    leader, follower = pair
    link = Link(leader, follower)
    link.send(1)
    produce(leader, TPS[0], 5, 1)
    link.answer(1)
    link.send(2)  # the old session has it at 5, caught up
    assert leader.partitions[TPS[0]].replica_states[FOLLOWER].log_end_offset == 5
    restarted = broker(tmp_path / "restarted", FOLLOWER, image())  # an empty log
    link.follower = restarted
    opening = link.send(3)
    assert opening.body["session_epoch"] == 0
    assert leader.partitions[TPS[0]].replica_states[FOLLOWER].log_end_offset == 0
    leader.tick(3 * LAG_MS)  # the ISR check and its refresh of the sessions
    state = leader.partitions[TPS[0]].replica_states[FOLLOWER]
    assert state.log_end_offset == 0
    assert leader.partitions[TPS[0]].high_watermark == 5  # committed before; not moved by it


# -- a session's partitions change: incrementally ------------------------------------

def add_topic(meta: MetadataImage, name: str, topic_id: str, leader: int) -> None:
    meta.apply(TopicRecord(name, topic_id), meta.offset + 1)
    meta.apply(PartitionRecord(topic_id, 0, [LEADER, FOLLOWER], [LEADER, FOLLOWER], leader,
                               0, 0), meta.offset + 1)


def both_apply(pair, meta: MetadataImage, changed: dict, now_ms: int) -> None:
    """The leader, then the follower, take the change."""
    leader, follower = pair
    leader.apply_image(meta, now_ms, changed)
    follower.apply_image(meta, now_ms, changed)


def open_session(link: Link) -> None:
    """A session open, and an incremental fetch parked on the leader."""
    link.send(1)
    produce(link.leader, TPS[0], 1, 1)
    link.answer(1)
    fetch = link.send(2)
    assert fetch.body["session_epoch"] == 1 and link.answer(2) is None


def test_a_new_partition_joins_the_session_in_an_incremental_fetch(pair):
    """A topic created while the follower's fetch waits on the leader: the
    fetch is not dropped (no new connection, no fetch of every partition);
    the leader answers it at once, having come to lead a partition of this
    follower, and the next fetch names the new partition alone."""
    leader, follower = pair
    link = Link(leader, follower)
    open_session(link)
    meta = leader.image
    add_topic(meta, "u", "id-u", LEADER)
    both_apply(pair, meta, {"u": None}, 3)
    actions = follower.ready()
    assert not of(actions, CancelRequest) and not of(actions, SendFetch)
    answer = link.answer(3)  # the leader woke the parked fetch: what it named, no records
    assert [(r["topic"], r["partition"], r["records"]) for r in answer["partitions"]] == [
        ("t", 0, b"")]
    fetch = link.send(4)
    assert fetch.body["session_epoch"] == 2 and fetch.body["session_id"] > 0
    assert [(i["topic"], i["partition"]) for i in fetch.body["partitions"]] == [("u", 0)]
    produce(leader, TopicPartition("u", 0), 3, 5)
    link.answer(5)
    assert follower.partitions[TopicPartition("u", 0)].log_end_offset == 3


def test_a_partition_leaving_the_session_is_forgotten_and_nothing_else_refetched(pair):
    leader, follower = pair
    link = Link(leader, follower)
    meta = leader.image
    add_topic(meta, "u", "id-u", LEADER)
    both_apply(pair, meta, {"u": None}, 0)
    open_session(link)
    # The follower leads u-0 now (an election): it leaves the follower's session.
    meta.apply(PartitionChangeRecord("id-u", 0, leader=FOLLOWER), meta.offset + 1)
    both_apply(pair, meta, {"u": {0}}, 3)
    actions = follower.ready()
    assert not of(actions, CancelRequest) and not of(actions, SendFetch)
    answer = link.answer(4)  # the leader's change of role answered the fetch out
    assert answer is not None
    fetch = link.send(5)
    assert fetch.body["session_epoch"] == 2
    assert fetch.body["partitions"] == []  # nothing else moved: nothing named
    assert fetch.body["forgotten"] == [{"topic": "u", "partition": 0}]
    link.answer(5)
    session = next(iter(leader._fetch_sessions.values()))  # noqa: SLF001
    assert TopicPartition("u", 0) not in session.specs


def test_a_partition_that_comes_by_a_change_of_leader_is_fetched_at_once(pair):
    """acks=all writes to a partition whose leader just changed wait for its
    followers: the fetch out is dropped and the session opened afresh."""
    leader, follower = pair
    link = Link(leader, follower)
    meta = leader.image
    add_topic(meta, "v", "id-v", FOLLOWER)  # led by the follower at first
    both_apply(pair, meta, {"v": None}, 0)
    open_session(link)
    meta.apply(PartitionChangeRecord("id-v", 0, leader=LEADER), meta.offset + 1)
    both_apply(pair, meta, {"v": {0}}, 3)
    actions = follower.ready()
    assert len(of(actions, CancelRequest)) == 1
    (fetch,) = of(actions, SendFetch)
    assert fetch.body["session_epoch"] == 0  # a new session: every partition
    assert ("v", 0) in [(i["topic"], i["partition"]) for i in fetch.body["partitions"]]


def test_a_restarted_follower_opening_its_logs_keeps_its_fetch_and_names_them_as_they_open(
        tmp_path):
    """A broker restarting with thousands of logs opens them
    NEW_LOGS_PER_PASS at a time. Logs in a leader epoch > 0 (leaders moved
    in the cluster's past) are not partitions that changed leader: the
    fetch out is kept and the next incremental fetch names them. (Each pass
    used to drop the fetch out and open a new session naming every
    partition, so the broker fetched nothing until its last log opened.)"""
    import api.broker.replication as replication

    count = 3 * replication.NEW_LOGS_PER_PASS + 5
    meta = MetadataImage()
    for b in (LEADER, FOLLOWER):
        meta.apply(RegisterBrokerRecord(b, f"inc-{b}", {"BROKER": f"127.0.0.1:{9000 + b}"},
                                        None), meta.offset + 1)
    meta.apply(TopicRecord("w", "id-w"), meta.offset + 1)
    for p in range(count):  # leader epoch 4: the leadership moved before
        meta.apply(PartitionRecord("id-w", p, [LEADER, FOLLOWER], [LEADER], LEADER, 4, 4),
                   meta.offset + 1)
    leader, follower = broker(tmp_path, LEADER, meta), broker(tmp_path, FOLLOWER, meta)
    wide = [TopicPartition("w", p) for p in range(count)]
    while leader.opening_any(wide):
        leader.tick(leader.next_wake_ms())
    leader.ready()
    link = Link(leader, follower)
    opening = link.send(1)
    assert opening.body["session_epoch"] == 0
    named = set(names(opening.body["partitions"]))
    assert len(named) == replication.NEW_LOGS_PER_PASS  # the logs open so far
    assert link.answer(1) is None  # caught up: it waits on the leader
    now = 1
    while follower.opening_any(wide):
        now = max(now, follower.next_wake_ms())
        follower.tick(now)
        actions = follower.ready()
        assert not of(actions, CancelRequest), "a log opening dropped the fetch out"
        assert not of(actions, SendFetch)  # one fetch out at a time
    leader.tick(opening.body["max_wait_ms"] + 2)  # the wait ends: answered empty
    link.answer(opening.body["max_wait_ms"] + 2)
    fetch = link.send(opening.body["max_wait_ms"] + 3)
    assert fetch.body["session_epoch"] == 1  # the same session, incremental
    assert set(names(fetch.body["partitions"])) == set(range(count)) - named


def unfence(meta: MetadataImage) -> None:
    for b in (LEADER, FOLLOWER):
        meta.apply(UnfenceBrokerRecord(b, meta.brokers[b].broker_epoch), meta.offset + 1)


def test_a_follower_reassigned_away_and_back_is_not_counted_at_its_old_log_end(pair):
    """The follower is moved off t-0 and back (same leader: the leader epoch
    stays 0) while its fetch waits on the leader. Its new log is empty; the
    leader's session must not still hold it at its old log end, or the ISR
    check would take an empty replica into the ISR as caught up. (Found by
    a second reading of the incremental session changes.)"""
    leader, follower = pair
    link = Link(leader, follower)
    meta = leader.image
    unfence(meta)
    both_apply(pair, meta, None, 0)
    link.send(1)
    produce(leader, TPS[0], 5, 1)
    link.answer(1)  # open; the follower has t-0 at 5
    link.send(2)  # names t-0 at 5; parks
    assert link.answer(2) is None
    meta.apply(PartitionChangeRecord("id-1", 0, replicas=[LEADER], isr=[LEADER]),
               meta.offset + 1)
    both_apply(pair, meta, {"t": {0}}, 3)
    link.send(3)
    link.answer(3)
    assert TPS[0] not in follower.partitions
    meta.apply(PartitionChangeRecord("id-1", 0, replicas=[LEADER, FOLLOWER], isr=[LEADER]),
               meta.offset + 1)
    both_apply(pair, meta, {"t": {0}}, 4)
    assert follower.partitions[TPS[0]].log_end_offset == 0  # a new, empty log
    link.send(4)
    assert leader.partitions[TPS[0]].leader_epoch == 0
    leader.tick(5)  # the ISR check, and its refresh of the fetch sessions
    proposals = of(leader.ready(), SendAlterPartition)
    assert not [p for p in proposals if FOLLOWER in p.body["new_isr"]], proposals
    assert leader.partitions[TPS[0]].replica_states[FOLLOWER].log_end_offset in (-1, 0)


def test_a_new_partition_is_fetched_soon_when_the_leader_hears_of_it_first(pair):
    """The leader applies the new topic first: its wake answers the
    follower's waiting fetch before the follower knows of u-0, so the
    follower's next fetch does not name it. That fetch must not wait out a
    whole poll (500 ms): u-0, and an acks=all write to it, would wait too."""
    leader, follower = pair
    link = Link(leader, follower)
    open_session(link)
    meta = leader.image
    add_topic(meta, "u", "id-u", LEADER)
    leader.apply_image(meta, 3, {"u": None})  # the leader first: wakes the follower
    link.answer(3)
    link.send(3)  # the follower does not know u-0 yet
    link.answer(3)
    follower.apply_image(meta, 4, {"u": None})
    u0 = TopicPartition("u", 0)
    produce(leader, u0, 1, 5, acks=-1)
    for now in range(5, 100, 10):
        link.send(now)
        link.answer(now)
        leader.tick(now)
        link.answer(now)
    assert follower.partitions[u0].log_end_offset == 1, "u-0 not fetched within 100 ms"


def test_a_burst_of_isr_answers_costs_what_it_touched_not_what_the_fetches_name(tmp_path):
    """A thousand AlterPartition answers arriving one at a time (a leader
    shrinking or growing every ISR after a broker died or came back), with
    a follower's fetch and a consumer's fetch of all those partitions
    waiting: each answer reads only its own partition, not every partition
    the waiting fetches name (which made a burst quadratic: 1,000 answers,
    seconds of CPU on the event loop). Records still wake them at once."""
    count = 1000
    meta = MetadataImage()
    for b in (LEADER, FOLLOWER):
        meta.apply(RegisterBrokerRecord(b, f"inc-{b}", {"BROKER": f"127.0.0.1:{9000 + b}"},
                                        None), meta.offset + 1)
        meta.apply(UnfenceBrokerRecord(b, meta.brokers[b].broker_epoch), meta.offset + 1)
    meta.apply(TopicRecord("big", "id-big"), meta.offset + 1)
    for p in range(count):  # the follower out of every ISR: it will be taken back
        meta.apply(PartitionRecord("id-big", p, [LEADER, FOLLOWER], [LEADER], LEADER, 0, 0),
                   meta.offset + 1)
    leader, follower = broker(tmp_path, LEADER, meta), broker(tmp_path, FOLLOWER, meta)
    big = [TopicPartition("big", p) for p in range(count)]
    for core in (leader, follower):  # logs open NEW_LOGS_PER_PASS at a time
        while core.opening_any(big):
            core.tick(core.next_wake_ms())
    leader.ready()
    link = Link(leader, follower)
    # The follower's fetches name its partitions as their logs open; once
    # it named them all and is caught up, the leader proposes it back into
    # every ISR, and its next fetch waits (nothing to read).
    now = 1
    while now < 10_000 and not (len({p.body["partition"] for p in link.proposals}) == count
                                and link.parked):
        link.send(now)
        now += 100
        leader.tick(now)
        follower.tick(now)
        link.answer(now)
    proposals = {p.body["partition"]: p for p in link.proposals}
    assert sorted(proposals) == list(range(count)) and link.parked
    consumer_id = leader.new_request_id()
    leader.fetch(consumer_id, decode_fetch({"partitions": [
        {"topic": "big", "partition": p, "offset": 0} for p in range(count)],
        "max_wait_ms": 500}), now)
    assert not [a for a in of(leader.ready(), Respond) if a.request_id == consumer_id]

    read = []  # how many partitions each read (or count of bytes) of the leader covered
    real_read_all, real_available = leader._read_all, leader._available
    leader._read_all = lambda specs, *args, **kwargs: (
        read.append(len(specs)), real_read_all(specs, *args, **kwargs))[1]
    leader._available = lambda specs, *args, **kwargs: (
        read.append(len(specs)), real_available(specs, *args, **kwargs))[1]
    for p, proposal in sorted(proposals.items()):
        leader.alter_partition_answered(proposal.request_id, {
            "leader_epoch": 0, "partition_epoch": 1, "isr": [LEADER, FOLLOWER],
            "leader_recovery_state": 0}, None, now)
    assert all(leader.partitions[tp].isr == [LEADER, FOLLOWER] for tp in big)
    assert not of(leader.ready(), Respond)  # no records: both still wait
    # Quadratic was 1,000 x (1 + 2 + ... + 1,000) / 1,000 + 1,000 x 1,000.
    assert sum(read) <= 2 * count, f"{sum(read)} partition reads for {count} ISR answers"

    produce(leader, big[7], 3, now)  # records: the follower's fetch answers at once
    answer = link.answer(now)
    assert answer is not None and 7 in names(p for p in answer["partitions"] if p["records"])
    link.send(now)  # the follower has them: the high watermark moves, the consumer hears
    answers = [a for a in of(leader.ready(), Respond) if a.request_id == consumer_id]
    assert answers and [r["partition"] for r in answers[0].results if r["records"]] == [7]


def test_a_waiting_fetch_counts_the_bytes_found_before_towards_min_bytes(tmp_path):
    """A consumer's fetch with min_bytes above what one partition holds
    waits; records arriving in another partition answer it at once, the
    bytes already there counting with the new ones."""
    meta = MetadataImage()
    meta.apply(RegisterBrokerRecord(LEADER, "inc", {"BROKER": "127.0.0.1:9001"}, None),
               meta.offset + 1)
    meta.apply(TopicRecord("m", "id-m"), meta.offset + 1)
    for p in range(2):
        meta.apply(PartitionRecord("id-m", p, [LEADER], [LEADER], LEADER, 0, 0),
                   meta.offset + 1)
    leader = broker(tmp_path, LEADER, meta)
    leader.ready()
    m0, m1 = TopicPartition("m", 0), TopicPartition("m", 1)
    produce(leader, m0, 3, 1)
    batch = leader.partitions[m0].log.size_bytes
    request_id = leader.new_request_id()
    leader.fetch(request_id, decode_fetch({"partitions": [
        {"topic": "m", "partition": p, "offset": 0} for p in range(2)],
        "max_wait_ms": 10_000, "min_bytes": batch * 3 // 2}), 2)
    assert not [a for a in of(leader.ready(), Respond) if a.request_id == request_id]
    produce(leader, m1, 3, 3)
    (answer,) = [a for a in of(leader.ready(), Respond) if a.request_id == request_id]
    assert [bool(r["records"]) for r in answer.results] == [True, True]


def test_many_consumers_waiting_on_a_partition_cost_an_append_no_reads(tmp_path):
    """Fifty consumers long-poll one partition for more bytes than one
    batch (fetch.min.bytes): each append asks how much each now finds from
    the batches' positions, not by reading the log (which made an append
    cost waiters x batches read, a quarter of a broker's CPU with 500
    consumers), and counts them once for all fetches waiting at one offset;
    once enough is there, every one is answered with it."""
    meta = MetadataImage()
    meta.apply(RegisterBrokerRecord(LEADER, "inc", {"BROKER": "127.0.0.1:9001"}, None),
               meta.offset + 1)
    meta.apply(TopicRecord("m", "id-m"), meta.offset + 1)
    meta.apply(PartitionRecord("id-m", 0, [LEADER], [LEADER], LEADER, 0, 0), meta.offset + 1)
    leader = broker(tmp_path, LEADER, meta)
    leader.ready()
    tp = TopicPartition("m", 0)
    produce(leader, tp, 1, 1)
    batch = leader.partitions[tp].log.size_bytes
    waiting = []
    for _ in range(50):
        waiting.append(leader.new_request_id())
        leader.fetch(waiting[-1], decode_fetch({
            "partitions": [{"topic": "m", "partition": 0, "offset": 1}],
            "max_wait_ms": 10_000, "min_bytes": batch * 5}), 2)
    assert not [a for a in of(leader.ready(), Respond) if a.request_id in waiting]
    log = leader.partitions[tp].log
    reads, counts = [], []
    real_read, real_count = log.read, log.bytes_between
    log.read = lambda *args, **kwargs: (reads.append(args), real_read(*args, **kwargs))[1]
    log.bytes_between = lambda *args: (counts.append(args), real_count(*args))[1]
    for now in range(3, 7):  # four batches: not yet enough for any of them
        produce(leader, tp, 1, now)
        assert not [a for a in of(leader.ready(), Respond) if a.request_id in waiting]
    assert reads == []
    # All fifty wait at one offset: each append counts its bytes once for them.
    assert len(counts) <= 2 * 4, counts
    produce(leader, tp, 1, 7)  # the fifth: every one answered, with all five
    answers = [a for a in of(leader.ready(), Respond) if a.request_id in waiting]
    assert sorted(a.request_id for a in answers) == sorted(waiting)
    assert all(len(a.results[0]["records"]) == batch * 5 for a in answers)
    assert len(reads) == len(waiting)
