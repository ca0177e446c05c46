"""Unit tests of the consumer group coordinator's pure core
(api/broker/groups/coordinator.py) and its records (records.py): the
KIP-848 heartbeat protocol, reconciliation that never lets two members hold
a partition, timers, static membership, subscriptions, offsets, and
rebuilding the state from its records.

Every operation goes through a ``Harness`` that calls ``check_invariants()``
after it, checks that no two live clients of a group hold one partition,
and keeps the records, so each scenario ends by replaying them into a fresh
core and comparing."""

from __future__ import annotations

import itertools
import random

import msgpack
import pytest

from api.broker.groups import records as rec
from api.broker.groups.coordinator import (TIMING_FIELDS, GroupCoordinatorCore, GroupError,
                                           HeartbeatRequest, HeartbeatResponse)

SESSION = 45000
REBALANCE = 300000


def strip_timing(described: dict) -> dict:
    return {**described, "members": [{k: v for k, v in m.items() if k not in TIMING_FIELDS}
                                     for m in described["members"]]}


class Harness:
    """One core, a clock, the cluster's topics, and the records written."""

    def __init__(self, topics: dict[str, int] | None = None, **settings) -> None:
        ids = itertools.count(1)
        self.settings = settings
        self.core = GroupCoordinatorCore(id_factory=lambda: f"m{next(ids)}", **settings)
        self.now = 0
        self.topics = dict(topics or {})
        self.log: list = []
        self.clients: list[Client] = []

    def wrote(self, records: list) -> list:
        self.log.extend(records)
        self.check()
        return records

    def check(self) -> None:
        self.core.check_invariants()
        by_group: dict[str, dict] = {}
        for c in self.clients:
            if c.member_id is None:
                continue
            held = by_group.setdefault(c.group, {})
            for tp in c.owned:
                assert tp not in held, f"{tp} owned by both {held[tp]} and {c.member_id}"
                held[tp] = c.member_id

    def heartbeat(self, group: str, req: HeartbeatRequest) -> HeartbeatResponse:
        try:
            resp, records = self.core.heartbeat(self.now, group, req, self.topics)
        except GroupError:
            self.check()
            raise
        self.wrote(records)
        return resp

    def tick(self, advance_ms: int = 0) -> list:
        self.now += advance_ms
        records = self.wrote(self.core.tick(self.now, self.topics))
        # A client the coordinator dropped notices (its own timers) and
        # stops consuming: it holds nothing from then on.
        for c in self.clients:
            if c.member_id is not None and c.member_id not in self.members(c.group):
                c.forget()
        return records

    def describe(self, group: str) -> dict:
        return self.core.describe(group, self.now)

    def members(self, group: str) -> dict[str, dict]:
        return {m["member_id"]: m for m in self.describe(group)["members"]}

    def client(self, group: str, topics=None, **kwargs) -> Client:
        c = Client(self, group, topics, **kwargs)
        self.clients.append(c)
        return c

    def replayed(self, records=None) -> GroupCoordinatorCore:
        fresh = GroupCoordinatorCore(**self.settings)
        for record in self.log if records is None else records:
            key, value = rec.encode(record)
            fresh.replay(rec.decode(key, value))
        fresh.check_invariants()
        return fresh

    def check_replay(self) -> None:
        """Replaying the records (all of them, and only the latest per key, as
        compaction leaves them) rebuilds the same groups and offsets."""
        latest: dict[bytes, tuple[int, object]] = {}
        for i, record in enumerate(self.log):
            latest[rec.encode(record)[0]] = (i, record)
        compacted = [r for _, r in sorted(latest.values(), key=lambda x: x[0])]
        ids = sorted({r.group_id for r in self.log})
        for fresh in (self.replayed(), self.replayed(compacted)):
            assert fresh.list_groups() == self.core.list_groups()
            for gid in ids:
                assert (strip_timing(fresh.describe(gid, self.now))
                        == strip_timing(self.core.describe(gid, self.now)))
                assert fresh.fetch_offsets(gid) == self.core.fetch_offsets(gid)
            fresh.loaded(self.now)
            fresh.check_invariants()


class Client:
    """A consumer as the protocol expects one to behave: it takes what it is
    given at once, and releases what is taken away either at once
    (``auto_release``) or when the test says (``release()``); each heartbeat
    reports what it holds."""

    def __init__(self, h: Harness, group: str, topics, *, regex=None, instance_id=None,
                 assignor=None, rebalance_timeout_ms=None, auto_release=True) -> None:
        self.h, self.group = h, group
        self.topics, self.regex = topics, regex
        self.instance_id, self.assignor = instance_id, assignor
        self.rebalance_timeout_ms = rebalance_timeout_ms
        self.auto_release = auto_release
        self.member_id: str | None = None
        self.epoch = 0
        self.owned: set = set()
        self.to_release: set = set()
        self.known: set | None = None    # the assignment last received
        self.released = False            # released something since the last heartbeat

    def forget(self) -> None:
        self.member_id, self.epoch = None, 0
        self.owned, self.to_release = set(), set()
        self.known, self.released = None, False

    def join(self, member_id: str = "") -> HeartbeatResponse:
        resp = self.h.heartbeat(self.group, HeartbeatRequest(
            member_id=member_id, member_epoch=0, instance_id=self.instance_id,
            subscribed_topic_names=self.topics, subscribed_topic_regex=self.regex,
            server_assignor=self.assignor, rebalance_timeout_ms=self.rebalance_timeout_ms,
            owned_partitions=[]))
        self.member_id = resp.member_id
        self.apply(resp)
        return resp

    def beat(self, *, epoch: int | None = None, owned=None, **fields) -> HeartbeatResponse:
        plain = epoch is None and owned is None and not fields and not self.released
        if plain:
            before = strip_timing(self.h.describe(self.group))
            predicted = self.h.core.has_news(self.group, self.member_id)
            assert strip_timing(self.h.describe(self.group)) == before, "has_news changed state"
        epoch_before, known = self.epoch, self.known
        resp = self.h.heartbeat(self.group, HeartbeatRequest(
            member_id=self.member_id, member_epoch=self.epoch if epoch is None else epoch,
            instance_id=self.instance_id,
            owned_partitions=sorted(self.owned) if owned is None else owned, **fields))
        self.released = False
        self.apply(resp)                 # may release at once (auto_release)
        if plain:
            # A watch wakes the client exactly when its heartbeat has news: a
            # new epoch or an assignment it has not seen.
            news = resp.member_epoch != epoch_before or (
                resp.assignment is not None and set(resp.assignment) != known)
            assert predicted == news, (self.member_id, predicted, resp)
        return resp

    def apply(self, resp: HeartbeatResponse) -> None:
        self.epoch = resp.member_epoch
        if resp.assignment is not None:
            given = set(resp.assignment)
            self.known = given
            revoked = self.owned - given
            self.owned |= given
            self.to_release |= revoked
            if self.auto_release:
                self.release()

    def release(self) -> None:
        self.released |= bool(self.to_release)
        self.owned -= self.to_release
        self.to_release = set()
        self.h.check()

    def leave(self, static: bool = False) -> HeartbeatResponse:
        resp = self.h.heartbeat(self.group, HeartbeatRequest(
            member_id=self.member_id, member_epoch=-2 if static else -1,
            instance_id=self.instance_id))
        self.forget()
        return resp


def settle(h: Harness, clients, rounds: int = 10) -> None:
    """Heartbeat every client until the group is stable."""
    for _ in range(rounds):
        for c in clients:
            c.beat()
        if all(h.describe(c.group)["state"] in ("stable", "empty") for c in clients):
            return
    raise AssertionError(f"not stable after {rounds} rounds: {h.describe(clients[0].group)}")


def owned(c: Client) -> list:
    return sorted(c.owned)


def tps(topic: str, *partitions: int) -> list:
    return [(topic, p) for p in partitions]


def refused(code: str, call, *args, **kwargs) -> None:
    """``call`` raises GroupError ``code`` and leaves a sound core."""
    with pytest.raises(GroupError) as e:
        call(*args, **kwargs)
    assert e.value.code == code, e.value
    owner = getattr(call, "__self__", None)
    if isinstance(owner, GroupCoordinatorCore):
        owner.check_invariants()
    elif isinstance(owner, Client):
        owner.h.check()
    elif isinstance(owner, Harness):
        owner.check()


# ----------------------------------------------------------------------------
# assignment and reconciliation

def test_three_partitions_one_to_four_members():
    h = Harness({"t": 3})
    a = h.client("g", ["t"])
    resp = a.join()
    assert (resp.member_id, resp.member_epoch, resp.assignment) == ("m1", 1, tps("t", 0, 1, 2))
    settle(h, [a])
    b = h.client("g", ["t"])
    b.join()
    settle(h, [a, b])
    assert (owned(a), owned(b)) == (tps("t", 0, 1), tps("t", 2))
    c = h.client("g", ["t"])
    c.join()
    settle(h, [a, b, c])
    assert (owned(a), owned(b), owned(c)) == (tps("t", 0), tps("t", 2), tps("t", 1))
    d = h.client("g", ["t"])
    resp = d.join()
    assert resp.assignment == []
    settle(h, [a, b, c, d])
    assert (owned(a), owned(b), owned(c), owned(d)) == (tps("t", 0), tps("t", 2), tps("t", 1), [])
    g = h.describe("g")
    assert (g["state"], g["group_epoch"], g["assignment_epoch"]) == ("stable", 4, 4)
    assert [m["member_epoch"] for m in g["members"]] == [4, 4, 4, 4]
    h.check_replay()


def test_new_member_waits_until_the_old_owner_released():
    h = Harness({"t": 4})
    a = h.client("g", ["t"])
    b = h.client("g", ["t"], auto_release=False)
    a.join()
    b.join()
    settle(h, [a, b])
    assert (owned(a), owned(b), b.epoch) == (tps("t", 0, 1), tps("t", 2, 3), 2)

    c = h.client("g", ["t"])
    resp = c.join()
    # The target moves (t,3) from b to c, but b holds it: c gets nothing yet.
    assert (resp.member_id, resp.member_epoch, resp.assignment) == ("m3", 3, [])
    members = h.members("g")
    assert members["m2"]["assigned"] == tps("t", 2)
    assert members["m2"]["pending_revocation"] == tps("t", 3)
    assert members["m3"]["target"] == tps("t", 3)
    assert members["m3"]["state"] == "unreleased"
    assert c.beat().assignment is None and owned(c) == []

    # b hears of the revocation; it keeps its epoch until it shows the release.
    resp = b.beat()
    assert (resp.member_epoch, resp.assignment) == (2, tps("t", 2))
    assert owned(b) == tps("t", 2, 3) and b.to_release == {("t", 3)}
    assert c.beat().assignment is None
    resp = b.beat()                                  # still holding (t,3)
    assert (resp.member_epoch, h.members("g")["m2"]["pending_revocation"]) == (2, tps("t", 3))
    assert c.beat().assignment is None and h.describe("g")["state"] == "reconciling"

    b.release()
    resp = b.beat()                                  # shows the release: advances
    assert (resp.member_epoch, h.members("g")["m2"]["pending_revocation"]) == (3, [])
    resp = c.beat()
    assert (resp.member_epoch, resp.assignment) == (3, tps("t", 3))
    resp = a.beat()                                  # a lost nothing: just a new epoch
    assert (resp.member_epoch, resp.assignment) == (3, tps("t", 0, 1))
    assert (owned(a), owned(b), owned(c)) == (tps("t", 0, 1), tps("t", 2), tps("t", 3))
    assert h.describe("g")["state"] == "stable"
    h.check_replay()


def test_two_groups_on_one_topic_each_get_every_partition():
    h = Harness({"t": 5})
    g1 = [h.client("g1", ["t"]) for _ in range(2)]
    g2 = [h.client("g2", ["t"]) for _ in range(3)]
    for c in g1 + g2:
        c.join()
    settle(h, g1)
    settle(h, g2)
    for clients in (g1, g2):
        held = [tp for c in clients for tp in c.owned]
        assert sorted(held) == tps("t", 0, 1, 2, 3, 4)
        assert sorted(len(c.owned) for c in clients) == ([2, 3] if len(clients) == 2
                                                         else [1, 2, 2])
    assert [g["group_id"] for g in h.core.list_groups()] == ["g1", "g2"]
    h.check_replay()


# ----------------------------------------------------------------------------
# timers

def test_session_timeout_removes_a_silent_member_and_its_partitions_move():
    h = Harness({"t": 4})
    a, b = h.client("g", ["t"]), h.client("g", ["t"])
    a.join()
    b.join()
    settle(h, [a, b])
    assert (owned(a), owned(b)) == (tps("t", 0, 1), tps("t", 2, 3))
    b_last = h.now
    for _ in range(9):                               # a keeps beating, b is silent
        h.now += 5000
        a.beat()
        assert h.tick() == []
    h.now = b_last + SESSION
    a.beat()
    assert h.tick() == []                            # exactly the session: still in
    records = h.tick(1)
    assert rec.MemberTombstone("g", "m2") in records
    assert "m2" not in h.members("g") and h.describe("g")["group_epoch"] == 3
    resp = a.beat()
    assert (resp.member_epoch, resp.assignment) == (3, tps("t", 0, 1, 2, 3))
    refused("UNKNOWN_MEMBER_ID", h.heartbeat, "g", HeartbeatRequest(member_id="m2",
                                                                    member_epoch=2))
    h.check_replay()


def test_revocation_timeout_fences_a_member_that_never_releases():
    h = Harness({"t": 4})
    a = h.client("g", ["t"], rebalance_timeout_ms=10000, auto_release=False)
    a.join()
    h.now = 1000
    b = h.client("g", ["t"])
    b.join()                                         # revocation from a starts now
    assert h.members("g")["m1"]["revocation_remaining_ms"] == 10000
    for _ in range(5):
        h.now += 2000
        a.beat()                                     # heartbeats, still holding
        assert b.beat().assignment is None and owned(b) == []
        assert h.tick() == []
    assert h.now == 11000                            # the deadline itself: not yet
    records = h.tick(1)
    assert rec.MemberTombstone("g", "m1") in records
    assert list(h.members("g")) == ["m2"]
    resp = b.beat()
    assert (resp.member_epoch, resp.assignment) == (3, tps("t", 0, 1, 2, 3))
    refused("UNKNOWN_MEMBER_ID", h.heartbeat, "g", HeartbeatRequest(member_id="m1",
                                                                    member_epoch=1))
    h.check_replay()


# ----------------------------------------------------------------------------
# epochs

def test_member_epochs_fenced_rejoin_and_previous():
    h = Harness({"t": 4})
    a = h.client("g", ["t"], auto_release=False)
    a.join()
    before = h.describe("g")
    refused("FENCED_MEMBER_EPOCH", a.beat, epoch=2)            # from the future
    assert h.describe("g") == before

    b = h.client("g", ["t"])
    b.join()                                                   # group epoch 2
    a.beat()                                                   # told to revoke (t,2),(t,3)
    a.release()
    # a releases and advances to epoch 2, but the response is lost.
    resp = h.heartbeat("g", HeartbeatRequest(member_id="m1", member_epoch=1,
                                             owned_partitions=tps("t", 0, 1)))
    assert resp.member_epoch == 2
    # The retry with the previous epoch is fine and gets the assignment again.
    resp = a.beat(epoch=1)
    assert (resp.member_epoch, resp.assignment) == (2, tps("t", 0, 1))
    # ... but not if the client claims a partition it may not hold.
    refused("FENCED_MEMBER_EPOCH", a.beat, epoch=1, owned=tps("t", 0, 1, 2))

    c = h.client("g", ["t"])
    c.join()                                                   # group epoch 3
    settle(h, [a, b, c])
    assert (a.epoch, h.members("g")["m1"]["previous_member_epoch"]) == (3, 2)
    refused("FENCED_MEMBER_EPOCH", a.beat, epoch=1)            # older than the previous
    refused("FENCED_MEMBER_EPOCH", a.beat, epoch=4)

    # Fenced: the client drops everything and rejoins with its id and epoch 0.
    kept = owned(a)
    a.forget()
    resp = a.join(member_id="m1")
    assert (resp.member_id, resp.member_epoch, resp.assignment) == ("m1", 3, kept)
    assert h.describe("g")["group_epoch"] == 3 and h.describe("g")["state"] == "stable"
    h.check_replay()


def test_a_member_may_name_itself_when_it_joins():
    # KIP-848 v1 (Kafka's clients): the member makes its id and joins with
    # epoch 0; the coordinator takes it. A beat under an unknown id is still
    # refused.
    h = Harness({"t": 2})
    response = h.heartbeat("g", HeartbeatRequest(member_id="client-made-uuid",
                                                 subscribed_topic_names=["t"]))
    assert response.member_id == "client-made-uuid" and response.member_epoch == 1
    assert sorted(response.assignment) == [("t", 0), ("t", 1)]
    refused("UNKNOWN_MEMBER_ID", h.heartbeat, "g", HeartbeatRequest(member_id="ghost",
                                                                    member_epoch=1))


def test_request_validation():
    h = Harness({"t": 2})
    refused("INVALID_REQUEST", h.heartbeat, "g", HeartbeatRequest())       # no subscription
    refused("INVALID_REQUEST", h.heartbeat, "g", HeartbeatRequest(
        subscribed_topic_names=["t"], owned_partitions=tps("t", 0)))
    refused("INVALID_REQUEST", h.heartbeat, "g", HeartbeatRequest(subscribed_topic_regex="(t"))
    refused("UNSUPPORTED_ASSIGNOR", h.heartbeat, "g", HeartbeatRequest(
        subscribed_topic_names=["t"], server_assignor="nope"))
    refused("INVALID_REQUEST", h.heartbeat, "g", HeartbeatRequest(member_epoch=3))
    refused("INVALID_REQUEST", h.heartbeat, "g", HeartbeatRequest(
        member_id="x", member_epoch=-3))
    assert h.core.list_groups() == [] and h.log == []
    a = h.client("g", ["t"])
    a.join()
    refused("UNKNOWN_MEMBER_ID", h.heartbeat, "g", HeartbeatRequest(member_id="ghost",
                                                                    member_epoch=1))
    refused("INVALID_REQUEST", a.leave, static=True)          # not a static member
    refused("INVALID_REQUEST", a.beat, subscribed_topic_regex="[")
    assert h.describe("g")["members"][0]["subscribed_topic_regex"] is None


def test_group_max_size():
    h = Harness({"t": 2}, max_group_size=2)
    a, b, c = (h.client("g", ["t"]) for _ in range(3))
    a.join()
    b.join()
    refused("GROUP_MAX_SIZE_REACHED", c.join)
    a.leave()
    assert c.join().member_id == "m3"


def test_assignor_choice_most_requested_ties_by_name():
    h = Harness({"t": 4})
    a = h.client("g", ["t"])
    a.join()
    assert h.describe("g")["assignor"] == "uniform"
    b = h.client("g", ["t"], assignor="range")
    b.join()
    assert h.describe("g")["assignor"] == "range"
    c = h.client("g", ["t"], assignor="uniform")
    c.join()
    assert h.describe("g")["assignor"] == "range"              # 1:1, "range" < "uniform"
    a.beat(server_assignor="uniform")
    assert h.describe("g")["assignor"] == "uniform"
    assert h.describe("g")["group_epoch"] == 4                 # the change bumped it
    settle(h, [a, b, c])
    h.check_replay()


# ----------------------------------------------------------------------------
# static membership

def test_static_member_leaves_and_comes_back_to_the_same_assignment():
    h = Harness({"t": 4})
    a = h.client("g", ["t"], instance_id="host-a")
    b = h.client("g", ["t"], instance_id="host-b")
    a.join()
    b.join()
    settle(h, [a, b])
    kept, epoch = owned(a), a.epoch
    resp = a.leave(static=True)
    assert resp.member_epoch == -2
    m1 = h.members("g")["m1"]
    assert (m1["state"], m1["member_epoch"], m1["assigned"]) == ("away", -2, kept)
    assert h.describe("g")["group_epoch"] == 2
    assert b.beat().assignment is None

    # Another process with host-b's instance id while b lives: refused.
    refused("UNRELEASED_INSTANCE_ID", h.client("g", ["t"], instance_id="host-b").join)
    # Commits and heartbeats of the departed process are refused.
    refused("FENCED_MEMBER_EPOCH", h.core.commit_offsets, h.now, "g", "m1", epoch, {})
    refused("FENCED_MEMBER_EPOCH", h.heartbeat, "g",
            HeartbeatRequest(member_id="m1", member_epoch=epoch))

    h.now += SESSION - 1000
    h.tick()
    a2 = h.client("g", ["t"], instance_id="host-a")
    resp = a2.join()
    assert (resp.member_id, resp.member_epoch, resp.assignment) == ("m3", epoch, kept)
    assert h.log[-3:] == [
        rec.MemberTombstone("g", "m1"),
        rec.MemberRecord("g", "m3", "host-a", epoch, epoch, ("t",), None, None, REBALANCE,
                         SESSION, tuple(kept), (), None, None),
        rec.TargetAssignmentRecord("g", 2, {"m2": tuple(owned(b)), "m3": tuple(kept)})]
    assert h.describe("g")["group_epoch"] == 2 and h.describe("g")["state"] == "stable"
    assert b.beat().assignment is None and b.epoch == 2
    h.check_replay()


def test_a_classic_static_member_replaces_its_live_holder_and_a_failover_keeps_it():
    # The Kafka listener's classic joins: a new process with host-a's
    # instance id takes the place of the live m1 (release, then join, one
    # operation); replayed from the records, the group still has the new one.
    h = Harness({"t": 4})
    a = h.client("g", ["t"], instance_id="host-a")
    b = h.client("g", ["t"])
    a.join()
    b.join()
    settle(h, [a, b])
    kept = owned(a)
    join = HeartbeatRequest(member_id="classic-2", member_epoch=0, instance_id="host-a",
                            subscribed_topic_names=["t"], rebalance_timeout_ms=REBALANCE,
                            session_timeout_ms=SESSION)
    replaced, records = h.core.release_instance(h.now, "g", join)
    h.wrote(records)
    assert replaced == "m1"
    resp = h.heartbeat("g", join)
    assert (resp.member_id, set(resp.assignment)) == ("classic-2", set(kept))
    assert h.core.instance_member("g", "host-a") == "classic-2"
    assert h.replayed().instance_member("g", "host-a") == "classic-2"
    h.check_replay()
    # The holder itself joining again, or a join that would be refused,
    # releases nobody.
    assert h.core.release_instance(h.now, "g", join) == (None, [])
    bad = HeartbeatRequest(member_id="classic-3", member_epoch=0, instance_id="host-a",
                           subscribed_topic_names=["t"], rebalance_timeout_ms=-5)
    refused("INVALID_REQUEST", h.core.release_instance, h.now, "g", bad)
    assert h.core.instance_member("g", "host-a") == "classic-2"


def test_static_member_that_stays_away_past_its_session_is_removed():
    h = Harness({"t": 4})
    a = h.client("g", ["t"], instance_id="host-a")
    b = h.client("g", ["t"])
    a.join()
    b.join()
    settle(h, [a, b])
    a.leave(static=True)
    h.now += SESSION
    b.beat()
    h.tick()
    assert "m1" in h.members("g")
    records = h.tick(1)
    assert rec.MemberTombstone("g", "m1") in records
    resp = b.beat()
    assert (resp.member_epoch, resp.assignment) == (3, tps("t", 0, 1, 2, 3))
    # Coming back later is an ordinary join: a new member, a new epoch.
    resp = h.client("g", ["t"], instance_id="host-a").join()
    assert (resp.member_id, resp.member_epoch) == ("m3", 4)
    h.check_replay()


def test_static_rejoin_after_its_session_but_before_tick_is_a_new_member():
    h = Harness({"t": 2})
    a = h.client("g", ["t"], instance_id="host-a")
    a.join()
    a.leave(static=True)
    h.now += SESSION + 1
    resp = h.client("g", ["t"], instance_id="host-a").join()
    assert (resp.member_id, resp.member_epoch, resp.assignment) == ("m2", 2, tps("t", 0, 1))
    assert list(h.members("g")) == ["m2"]
    h.check_replay()


# ----------------------------------------------------------------------------
# subscriptions and topic metadata

def test_regex_subscription_picks_up_a_new_topic_at_tick():
    h = Harness({"orders-eu": 2, "audit": 1})
    a = h.client("g", None, regex="orders-.*")
    assert a.join().assignment == tps("orders-eu", 0, 1)
    assert h.tick(1000) == []
    h.topics["orders-us"] = 2
    h.topics["orders"] = 1                           # fullmatch: not "orders-.*"
    records = h.tick(1000)
    assert records[0] == rec.GroupMetadataRecord("g", 2, "uniform",
                                                 {"orders-eu": 2, "orders-us": 2})
    resp = a.beat()
    assert (resp.member_epoch, resp.assignment) == (
        2, tps("orders-eu", 0, 1) + tps("orders-us", 0, 1))
    assert h.tick(1000) == []
    h.check_replay()


def test_partition_count_growth_triggers_a_new_assignment():
    h = Harness({"t": 2, "u": 1})
    a, b = h.client("g", ["t"]), h.client("g", ["t"])
    a.join()
    b.join()
    settle(h, [a, b])
    assert (owned(a), owned(b)) == (tps("t", 0), tps("t", 1))
    h.topics["u"] = 5                                # not subscribed: nothing happens
    assert h.tick(100) == []
    h.topics["t"] = 4
    h.tick(100)
    assert h.describe("g")["group_epoch"] == 3
    settle(h, [a, b])
    assert (owned(a), owned(b)) == (tps("t", 0, 2), tps("t", 1, 3))
    h.check_replay()


def test_subscription_change_revokes_then_reassigns():
    h = Harness({"t": 2, "u": 2})
    a, b = h.client("g", ["t", "u"]), h.client("g", ["t", "u"])
    a.join()
    b.join()
    settle(h, [a, b])
    a.beat(subscribed_topic_names=["u"])
    assert h.describe("g")["group_epoch"] == 3
    settle(h, [a, b])
    assert (owned(a), owned(b)) == (tps("u", 0, 1), tps("t", 0, 1))
    h.check_replay()


# ----------------------------------------------------------------------------
# offsets

def test_offsets_commit_fetch_stale_admin_reset_delete():
    h = Harness({"t": 2})
    a = h.client("g", ["t"])
    a.join()
    h.now = 10
    results, records = h.core.commit_offsets(h.now, "g", "m1", 1, {("t", 0): (5, "x"),
                                                                    ("t", 1): (-1, "")})
    h.wrote(records)
    assert results == {("t", 0): None, ("t", 1): "INVALID_REQUEST"}
    assert records == [rec.OffsetCommitRecord("g", "t", 0, 5, "x", 10)]
    assert h.core.fetch_offsets("g") == {("t", 0): (5, "x", 10)}
    assert h.core.fetch_offsets("g", [("t", 0), ("t", 1)]) == {("t", 0): (5, "x", 10)}

    b = h.client("g", ["t"])
    b.join()
    settle(h, [a, b])                                  # a is at epoch 2, previously 1
    assert (a.epoch, h.members("g")["m1"]["previous_member_epoch"]) == (2, 1)
    h.wrote(h.core.commit_offsets(h.now, "g", "m1", 1, {("t", 0): (6, None)})[1])
    c = h.client("g", ["t"])
    c.join()
    settle(h, [a, b, c])                               # a: epoch 3, previously 2
    refused("STALE_MEMBER_EPOCH", h.core.commit_offsets, h.now, "g", "m1", 1,
            {("t", 0): (7, "")})
    refused("FENCED_MEMBER_EPOCH", h.core.commit_offsets, h.now, "g", "m1", 4,
            {("t", 0): (7, "")})
    refused("UNKNOWN_MEMBER_ID", h.core.commit_offsets, h.now, "g", "ghost", 3,
            {("t", 0): (7, "")})
    refused("UNKNOWN_MEMBER_ID", h.core.commit_offsets, h.now, "g", "", -1,
            {("t", 0): (7, "")})
    refused("NON_EMPTY_GROUP", h.core.reset_offsets, h.now, "g", {("t", 0): (0, "")})
    refused("NON_EMPTY_GROUP", h.core.delete_group, "g")
    assert h.core.fetch_offsets("g") == {("t", 0): (6, "", 10)}

    for c_ in (a, b, c):
        c_.leave()
    assert h.describe("g")["state"] == "empty"
    h.now = 20
    results, records = h.core.commit_offsets(h.now, "g", "", -1, {("t", 1): (3, "admin")})
    h.wrote(records)
    assert results == {("t", 1): None}
    h.wrote(h.core.reset_offsets(h.now, "g", {("t", 0): (0, "")}))
    assert h.core.fetch_offsets("g") == {("t", 0): (0, "", 20), ("t", 1): (3, "admin", 20)}
    h.check_replay()

    records = h.wrote(h.core.delete_group("g"))
    assert records == [rec.OffsetTombstone("g", "t", 0), rec.OffsetTombstone("g", "t", 1),
                       rec.TargetAssignmentTombstone("g"), rec.GroupTombstone("g")]
    assert h.describe("g")["state"] == "dead" and h.core.fetch_offsets("g") == {}
    refused("GROUP_ID_NOT_FOUND", h.core.delete_group, "g")
    h.check_replay()


def test_simple_consumer_commits_create_a_group():
    h = Harness({"t": 1})
    results, records = h.core.commit_offsets(5, "simple", "", -1, {("t", 0): (42, "")})
    h.wrote(records)
    assert results == {("t", 0): None}
    assert records == [rec.GroupMetadataRecord("simple", 0, "uniform", {}),
                       rec.OffsetCommitRecord("simple", "t", 0, 42, "", 5)]
    assert h.core.list_groups() == [{"group_id": "simple", "state": "empty", "members": 0,
                                     "group_epoch": 0}]
    refused("INVALID_REQUEST", h.core.commit_offsets, 5, "simple", "", 3, {("t", 0): (1, "")})
    h.check_replay()


# ----------------------------------------------------------------------------
# records and replay

SAMPLES = [
    rec.GroupMetadataRecord("g", 7, "range", {"a": 3, "b": 1}),
    rec.MemberRecord("g", "m1", "host-1", 7, 6, ("a", "b"), "x.*", "range", 1000, 2000,
                     (("a", 0), ("b", 0)), (("a", 2),), "client", "10.0.0.1"),
    rec.MemberRecord("g", "m2", None, -2, 5, None, None, None, 1, 1, (), (), None, None),
    rec.TargetAssignmentRecord("g", 7, {"m1": (("a", 0), ("b", 0)), "m2": ()}),
    rec.OffsetCommitRecord("g", "a", 2, 99, "meta", 123456789),
    rec.GroupTombstone("g"),
    rec.MemberTombstone("g", "m1"),
    rec.TargetAssignmentTombstone("g"),
    rec.OffsetTombstone("g", "a", 2),
]


@pytest.mark.parametrize("record", SAMPLES, ids=lambda r: type(r).__name__)
def test_record_round_trip(record):
    key, value = rec.encode(record)
    assert isinstance(key, bytes)
    assert (value is None) == type(record).__name__.endswith("Tombstone")
    assert rec.decode(key, value) == record


def test_record_keys_share_identity_with_their_tombstones_and_versions_are_checked():
    assert rec.encode(SAMPLES[0])[0] == rec.encode(rec.GroupTombstone("g"))[0]
    assert rec.encode(SAMPLES[1])[0] == rec.encode(rec.MemberTombstone("g", "m1"))[0]
    assert rec.encode(SAMPLES[3])[0] == rec.encode(rec.TargetAssignmentTombstone("g"))[0]
    assert rec.encode(SAMPLES[4])[0] == rec.encode(rec.OffsetTombstone("g", "a", 2))[0]
    key, value = rec.encode(SAMPLES[4])
    newer = msgpack.packb({**msgpack.unpackb(value), "v": rec.VALUE_VERSION + 1})
    with pytest.raises(rec.RecordFormatError):
        rec.decode(key, newer)
    with pytest.raises(rec.RecordFormatError):
        rec.decode(msgpack.packb([1, "group", "g"]), None)
    extra = msgpack.packb({**msgpack.unpackb(value), "added_later": 1})
    assert rec.decode(key, extra) == SAMPLES[4]        # unknown fields are ignored


def test_replay_of_a_random_history_rebuilds_the_same_state():
    rng = random.Random(848)
    h = Harness({"a": 3, "b": 5, "c": 2}, session_timeout_ms=20000)
    groups = ["g1", "g2", "g3"]
    subscriptions = [(["a"], None), (["a", "b"], None), (None, "b|c"), (["c"], "a"),
                     (None, "new-.*")]
    instances = itertools.count(1)
    counts = {"join": 0, "beat": 0, "release": 0, "leave": 0, "static": 0,
              "tick": 0, "commit": 0, "admin": 0, "topics": 0, "refused": 0}

    sizes = []

    def live(group=None):
        return [c for c in h.clients if c.member_id is not None
                and (group is None or c.group == group)]

    for _ in range(300):
        h.now += rng.choice([0, 100, 300])
        op = rng.choices(["join", "beat", "release", "leave", "static", "tick", "commit",
                          "admin", "topics"], [10, 45, 10, 2, 3, 12, 10, 4, 2])[0]
        # Honest clients are never refused: a GroupError fails the test.
        if op == "join":
            group = rng.choice(groups)
            away = [c for c in h.clients if c.group == group and c.member_id is None
                    and c.instance_id is not None]
            if away and rng.random() < 0.5:
                c = rng.choice(away)                 # a static member comes back
            else:
                names, regex = rng.choice(subscriptions)
                c = h.client(group, names, regex=regex,
                             instance_id=f"i{next(instances)}" if rng.random() < 0.3 else None,
                             assignor=rng.choice([None, None, "range", "uniform"]),
                             rebalance_timeout_ms=rng.choice([None, 8000]),
                             auto_release=rng.random() < 0.7)
            c.join()
        elif op == "beat" and live():
            rng.choice(live()).beat()
        elif op == "release" and live():
            rng.choice(live()).release()
        elif op == "leave" and live():
            rng.choice(live()).leave()
        elif op == "static" and [c for c in live() if c.instance_id is not None]:
            rng.choice([c for c in live() if c.instance_id is not None]).leave(static=True)
        elif op == "tick":
            h.tick(rng.choices([0, 2000, 21000], [5, 5, 1])[0])
        elif op == "commit" and live():
            c = rng.choice(live())
            offsets = {tp: (rng.randrange(-1, 100), "m") for tp in sorted(c.owned)}
            h.wrote(h.core.commit_offsets(h.now, c.group, c.member_id, c.epoch, offsets)[1])
        elif op == "admin":
            group = rng.choice(groups)
            try:
                h.wrote(h.core.commit_offsets(h.now, group, "", -1,
                                              {("a", 0): (rng.randrange(100), "")})[1])
            except GroupError as e:           # only an empty group takes these
                assert e.code == "UNKNOWN_MEMBER_ID" and h.members(group), e
                counts["refused"] += 1
        elif op == "topics":
            if rng.random() < 0.5:
                h.topics[rng.choice(sorted(h.topics))] += 1
            else:
                h.topics[f"new-{len(h.topics)}"] = rng.randint(1, 3)
        else:
            continue
        counts[op] += 1
        h.check()
        sizes.append(sum(len(h.members(g)) for g in groups))

    # The history exercised what it should.
    assert min(counts.values()) > 0, (counts, sizes)
    assert max(sizes) >= 5 and sum(len(h.members(g)) for g in groups) > 0
    assert any(isinstance(r, rec.MemberTombstone) for r in h.log)
    assert any(r.pending_revocation for r in h.log if isinstance(r, rec.MemberRecord))
    h.check_replay()
