"""pysyncobj 0.3.17: a follower handling a stale AppendEntries truncates entries
it already holds -- committed and applied ones included -- and what
``kraft.raft_guard.GuardedSyncObj`` does about it.

The follower code (syncobj.py 982-1004) deletes everything after
``prevLogIdx`` whenever it has anything there, without comparing terms (Raft
§5.3 deletes only from the first conflicting entry), then lowers its commit
index to its new log end (1029-1030). These tests drive real ``SyncObj``
objects with ``autoTick=False`` over an in-process fake transport (no sockets,
no sleeps): each message is pickled and delivered only when a test says so,
which is how the interleavings below are made deterministic. Timers are set so
far out that nothing happens unless a test asks (elections are forced by
zeroing the election deadline; replication rounds by calling the leader's
``__sendAppendEntries``).

Without the guard the tests assert the bad behaviour precisely; with it they
assert it does not happen.
"""

from __future__ import annotations

import logging

import pytest

import pysyncobj.pickle as pspickle
from kraft import raft_guard
from kraft.raft_guard import (
    COMMITTED_ENTRY_LOST,
    CONFLICT_BELOW_COMMIT,
    ENTRY_MISMATCH,
    STALE_APPEND_ENTRIES,
    GuardedSyncObj,
)
from pysyncobj import SyncObj, SyncObjConf, replicated
from pysyncobj.journal import FileJournal
from pysyncobj.node import Node
from pysyncobj.transport import Transport

SUCCESS = 0  # pysyncobj FAIL_REASON.SUCCESS


# --------------------------------------------------------------- harness ---

class FakeNet:
    """Messages wait in a FIFO until a test delivers them; ``down`` nodes
    neither send nor receive (a crash or a partition)."""

    def __init__(self) -> None:
        self.queue: list[tuple[str, str, dict]] = []
        self.transports: dict[str, FakeTransport] = {}
        self.down: set[str] = set()

    def send(self, src: str, dst: str, message: dict) -> None:
        if src in self.down or dst in self.down:
            return
        # Pickled like the TCP transport does: the receiver gets a copy.
        self.queue.append((src, dst, pspickle.loads(pspickle.dumps(message))))

    def take(self, pred=lambda src, dst, msg: True) -> list[tuple[str, str, dict]]:
        taken = [m for m in self.queue if pred(*m)]
        self.queue = [m for m in self.queue if not pred(*m)]
        return taken

    def deliver(self, pred=lambda src, dst, msg: True) -> None:
        """Deliver matching messages, and the ones they cause, until none is left."""
        while True:
            batch = self.take(pred)
            if not batch:
                return
            for src, dst, message in batch:
                if dst not in self.down:
                    self.transports[dst]._onMessageReceived(Node(src), message)


class FakeTransport(Transport):
    net: FakeNet  # set by transport_class()

    def __init__(self, syncObj, selfNode, otherNodes) -> None:
        super().__init__(syncObj, selfNode, otherNodes)
        self.me = selfNode.id
        self.others = list(otherNodes)
        self.net.transports[self.me] = self

    def connect_all(self) -> None:
        for node in self.others:
            self._onNodeConnected(node)

    def send(self, node, message) -> bool:
        self.net.send(self.me, node.id, message)
        return True


def transport_class(net: FakeNet) -> type[FakeTransport]:
    return type("BoundFakeTransport", (FakeTransport,), {"net": net})


def conf(**overrides) -> SyncObjConf:
    values = dict(
        autoTick=False,
        # Nothing is time-driven in these tests: no spontaneous election,
        # heartbeat, leader fallback or compaction.
        raftMinTimeout=10_000.0, raftMaxTimeout=20_000.0, appendEntriesPeriod=1_000.0,
        connectionTimeout=20_000.0, leaderFallbackTimeout=10_000.0,
        # Small batches, so a catch-up round is several AppendEntries.
        appendEntriesBatchSizeBytes=100,
    )
    values.update(overrides)
    return SyncObjConf(**values)


def kv_class(base: type) -> type:
    class KV(base):
        """A replicated dict that also records the order it applied puts in."""

        def __init__(self, me: str, others: list[str], net: FakeNet, **overrides) -> None:
            super().__init__(me, others, conf(**overrides), nodeClass=Node,
                             transportClass=transport_class(net))
            self.applied: list[tuple[str, str]] = []
            self.data: dict[str, str] = {}

        @replicated
        def put(self, key: str, value: str) -> str:
            self.applied.append((key, value))
            self.data[key] = value
            return value

    KV.__name__ = f"KV[{base.__name__}]"
    return KV


PlainKV = kv_class(SyncObj)
GuardedKV = kv_class(GuardedSyncObj)
BOTH = pytest.mark.parametrize("kv", [PlainKV, GuardedKV], ids=["pysyncobj", "guarded"])


def log_of(obj) -> list[tuple[int, int]]:
    """(index, term) of every entry in the node's journal."""
    journal = obj._SyncObj__raftLog
    return [(journal[i][1], journal[i][2]) for i in range(len(journal))]


def handle(obj, sender: str, message: dict) -> None:
    """Hand a message to the node exactly as its transport would."""
    obj._SyncObj__onMessageReceived(Node(sender), message)


def put_cmd(key: str) -> bytes:
    """The journal command of ``put(key, key)`` (REGULAR type byte + pickle)."""
    return b"\x00" + pspickle.dumps((0, (key, key)))


NOOP = b"\x01"


def entries(first_idx: int, keys: list[str], term: int = 1) -> list[tuple[bytes, int, int]]:
    return [(put_cmd(k), first_idx + i, term) for i, k in enumerate(keys)]


def ae(term: int, prev: int, prev_term: int, ents: list, commit: int) -> dict:
    return {"type": "append_entries", "term": term, "commit_index": commit,
            "prevLogIdx": prev, "prevLogTerm": prev_term, "entries": ents}


class Cluster:
    """Three nodes a, b, c of class ``kv`` on one FakeNet."""

    def __init__(self, kv: type, **overrides) -> None:
        self.net = FakeNet()
        names = ["a", "b", "c"]
        self.nodes = {n: kv(n, [o for o in names if o != n], self.net, **overrides)
                      for n in names}
        for transport in self.net.transports.values():
            transport.connect_all()

    def __getitem__(self, name: str):
        return self.nodes[name]

    def tick(self, *names: str) -> None:
        for name in names or tuple(self.nodes):
            if name not in self.net.down:
                self.nodes[name].doTick(0)

    def elect(self, name: str) -> None:
        node = self.nodes[name]
        node._SyncObj__raftElectionDeadline = 0
        self.tick(name)              # request_vote
        self.net.deliver()           # votes, then the new leader's first append_entries
        self.tick()                  # leader commits its no-op
        assert node._isLeader()

    def round(self, leader: str) -> None:
        """One replication round, fully delivered, then everybody ticks."""
        self.nodes[leader]._SyncObj__sendAppendEntries()
        self.net.deliver()
        self.tick()

    def destroy(self) -> None:
        for node in self.nodes.values():
            node.destroy()


def applied_state(node) -> tuple:
    return node.raftCommitIndex, node.raftLastApplied, list(node.applied)


# ------------------------------------------- 1. the follower, message level ---

def follower_with_8_applied(kv: type, **overrides):
    """Follower b of leader a (term 1): entries 1..8 held, committed, applied."""
    net = FakeNet()
    b = kv("b", ["a", "c"], net, **overrides)
    net.transports["b"].connect_all()
    handle(b, "a", ae(1, 1, 0, [(NOOP, 2, 1)] + entries(3, ["k0", "k1", "k2", "k3", "k4", "k5"]),
                      commit=1))
    handle(b, "a", ae(1, 8, 1, [], commit=8))   # heartbeat carrying commit 8
    b.doTick(0)                                 # applies 2..8
    assert log_of(b) == [(1, 0)] + [(i, 1) for i in range(2, 9)]
    assert (b.raftCommitIndex, b.raftLastApplied) == (8, 8)
    assert b.data == {f"k{i}": f"k{i}" for i in range(6)}
    net.queue.clear()
    return net, b


@BOTH
def test_stale_same_term_append_entries_truncates_applied_entries(kv, caplog):
    net, b = follower_with_8_applied(kv)

    # The leader's AppendEntries(prev=4, entries=[5, 6]) from earlier in the same
    # term arrives late (e.g. on the old TCP connection after a reconnect).
    with caplog.at_level(logging.DEBUG):
        handle(b, "a", ae(1, 4, 1, entries(5, ["k2", "k3"]), commit=4))
    reply = net.take()
    assert reply == [("b", "a", {"type": "next_node_idx", "next_node_idx": 7,
                                 "reset": False, "success": True})]
    pysyncobj_warned = [r for r in caplog.records if "truncating already-applied" in r.message]

    if kv is PlainKV:
        # Entries 7 and 8 -- committed, applied, acknowledged -- are gone; the
        # commit index went backwards to the new log end; lastApplied did not.
        assert log_of(b) == [(1, 0)] + [(i, 1) for i in range(2, 7)]
        assert (b.raftCommitIndex, b.raftLastApplied) == (6, 8)
        assert b.data["k5"] == "k5"  # the state machine still holds entry 8's effect
        assert [r.levelno for r in pysyncobj_warned] == [logging.CRITICAL]
        # The success reply says "I hold up to 6"; a leader whose matchIndex
        # for b is already 8 ignores it (syncobj.py 1080), so nothing prompts a
        # resend until its next heartbeat is rejected.
    else:
        assert log_of(b) == [(1, 0)] + [(i, 1) for i in range(2, 9)]
        assert (b.raftCommitIndex, b.raftLastApplied) == (8, 8)
        assert pysyncobj_warned == []
        [event] = b.raft_guard_events
        assert (event.kind, event.prev_log_idx, event.last_entry_idx, event.log_last_idx) == \
            (STALE_APPEND_ENTRIES, 4, 6, 8)
    b.destroy()


@BOTH
def test_stale_heartbeat_with_an_older_prev_index_also_truncates(kv):
    """No entries at all: prevLogIdx alone decides how much is deleted."""
    net, b = follower_with_8_applied(kv)
    handle(b, "a", ae(1, 3, 1, [], commit=3))
    assert net.take()[0][2]["next_node_idx"] == 4
    expected_end = 3 if kv is PlainKV else 8
    assert log_of(b)[-1] == (expected_end, 1)
    assert b.raftCommitIndex == expected_end
    assert b.raftLastApplied == 8
    b.destroy()


@BOTH
def test_file_journal_persists_the_truncation_and_the_lower_commit_index(kv, tmp_path):
    journal_file = str(tmp_path / "b.journal")
    net, b = follower_with_8_applied(kv, journalFile=journal_file)
    b._SyncObj__raftLog.onOneSecondTimer()          # meta (commit index) stored
    assert FileJournal(journal_file).getRaftCommitIndex() == 8

    handle(b, "a", ae(1, 4, 1, entries(5, ["k2", "k3"]), commit=4))
    b._SyncObj__raftLog.onOneSecondTimer()
    b.destroy()

    reopened = FileJournal(journal_file)
    held = [reopened[i][1] for i in range(len(reopened))]
    if kv is PlainKV:
        # journal.py deleteEntriesFrom rewrote LAST_RECORD_OFFSET: the
        # truncation survives a restart, and so does the lowered commit index.
        assert held == [1, 2, 3, 4, 5, 6]
        assert reopened.getRaftCommitIndex() == 6
    else:
        assert held == [1, 2, 3, 4, 5, 6, 7, 8]
        assert reopened.getRaftCommitIndex() == 8
    reopened._destroy()


@BOTH
def test_stale_append_entries_during_log_compaction_empties_the_journal(kv):
    """A compaction serialises at lastApplied-1 = 7 on one tick and deletes the
    journal up to index 7 on the next (``__deleteEntriesTo``); a stale message
    in between shortens the log to 5, so the deletion removes everything."""
    net, b = follower_with_8_applied(kv)
    b.forceLogCompaction()
    b.doTick(0)                                      # serialise (in-memory dump)
    handle(b, "a", ae(1, 2, 1, entries(3, ["k0", "k1", "k2"]), commit=2))
    b.doTick(0)                                      # compaction completes

    if kv is PlainKV:
        assert log_of(b) == []
        with pytest.raises(IndexError):              # every later AppendEntries
            handle(b, "a", ae(1, 8, 1, [], commit=8))
        with pytest.raises(IndexError):              # and every election
            b._SyncObj__raftElectionDeadline = 0
            b.doTick(0)
    else:
        assert log_of(b) == [(7, 1), (8, 1)]
        handle(b, "a", ae(1, 8, 1, [], commit=8))
        assert net.take()[-1][2] == {"type": "next_node_idx", "next_node_idx": 9,
                                     "reset": False, "success": True}
    # No destroy(): the broken plain node raises from anywhere; MemoryJournal
    # and the fake transport hold no resources.


# ------------------------------------- 2. whole cluster, real leader code ---

def three_nodes_with_c_cut_off(kv: type) -> tuple[Cluster, list]:
    """a leads term 1, c is partitioned away, a's client writes k0..k5
    (entries 3..8). Returns the cluster and the list of client acks."""
    cluster = Cluster(kv)
    cluster.elect("a")
    cluster.round("a")                               # everybody commits the no-op
    cluster.net.down.add("c")
    acks: list = []
    for i in range(6):
        cluster["a"].put(f"k{i}", f"v{i}", callback=lambda res, err: acks.append((res, err)))
    cluster.tick("a")                                # entries 3..8 appended on a
    assert log_of(cluster["a"])[-1] == (8, 1)
    return cluster, acks


def crash_a_and_elect_b_with_c(cluster: Cluster) -> list:
    """a crashes, c's partition heals, b becomes leader of term 2 and a client
    writes k6 (and then k7) through it. Returns b's client acks."""
    cluster.net.queue.clear()
    cluster.net.down = {"a"}
    cluster.elect("b")
    acks: list = []
    cluster["b"].put("k6", "v6", callback=lambda res, err: acks.append(("k6", res, err)))
    cluster.tick("b")
    for _ in range(3):
        cluster.round("b")
    cluster["b"].put("k7", "v7", callback=lambda res, err: acks.append(("k7", res, err)))
    cluster.tick("b")
    for _ in range(3):
        cluster.round("b")
    return acks


@BOTH
def test_append_entries_delayed_on_an_old_connection_loses_acknowledged_writes(kv, caplog):
    """Interleaving (3 nodes, term 1, c partitioned):

    1. a sends b AppendEntries(prev=2, entries 3..6) and (prev=6, entries 7..8);
       the first is delayed on a dying TCP connection, the second is lost with it.
    2. Over the new connection a's heartbeats are rejected, a rewinds and
       re-sends 3..8; b acks; a commits 3..8, applies them and acks k0..k5 to
       the client; the next heartbeat carries commit 8 and b applies 3..8 too.
    3. The delayed AppendEntries(prev=2, 3..6) from step 1 is finally read by b.
    4. a crashes before its next heartbeat; c's partition heals; b and c elect b
       (term 2); clients write k6 and k7 through b.
    """
    cluster, acks = three_nodes_with_c_cut_off(kv)
    a, b, c = cluster["a"], cluster["b"], cluster["c"]
    net = cluster.net

    a._SyncObj__sendAppendEntries()
    sent = [(m["prevLogIdx"], [e[1] for e in m["entries"]]) for _, _, m in net.queue]
    assert sent == [(2, [3, 4, 5, 6]), (6, [7, 8])]
    delayed = net.take(lambda s, d, m: m.get("prevLogIdx") == 2)
    net.queue.clear()                                        # step 1
    for _ in range(3):                                       # step 2
        cluster.round("a")
    assert acks == [(f"v{i}", SUCCESS) for i in range(6)]
    assert log_of(b) == log_of(a) and applied_state(b) == applied_state(a) == \
        (8, 8, [(f"k{i}", f"v{i}") for i in range(6)])

    with caplog.at_level(logging.CRITICAL):                  # step 3
        net.queue.extend(delayed)
        net.deliver()
    b_log_after_stale = log_of(b)
    b_acks = crash_a_and_elect_b_with_c(cluster)             # step 4

    if kv is PlainKV:
        assert b_log_after_stale == [(1, 0)] + [(i, 1) for i in range(2, 7)]
        assert any("truncating already-applied" in r.message for r in caplog.records)
        # (a) Committed, acknowledged k4/k5 (entries 7, 8) are gone from the
        # surviving majority: b refilled 7 and 8 with its no-op and k6.
        assert log_of(b) == log_of(c) == \
            [(1, 0)] + [(i, 1) for i in range(2, 7)] + [(7, 2), (8, 2), (9, 2)]
        assert "k4" not in c.data and "k5" not in c.data
        # (b) b applied the lost entries and never applies what term 2 wrote at
        # indexes 7 and 8 (its lastApplied was already 8): replicas diverge, and
        # the client that wrote k6 through b is never answered.
        assert b.data == {"k0": "v0", "k1": "v1", "k2": "v2", "k3": "v3",
                          "k4": "v4", "k5": "v5", "k7": "v7"}
        assert c.data == {"k0": "v0", "k1": "v1", "k2": "v2", "k3": "v3",
                          "k6": "v6", "k7": "v7"}
        assert b_acks == [("k7", "v7", SUCCESS)]
    else:
        assert b_log_after_stale == log_of(a)
        assert [e.kind for e in b.raft_guard_events] == [STALE_APPEND_ENTRIES]
        assert not any("truncating already-applied" in r.message for r in caplog.records)
        assert log_of(b) == log_of(c) == \
            [(1, 0)] + [(i, 1) for i in range(2, 9)] + [(9, 2), (10, 2), (11, 2)]
        expected = {f"k{i}": f"v{i}" for i in range(8)}
        assert b.data == c.data == expected
        assert b.applied == c.applied
        assert b_acks == [("k6", "v6", SUCCESS), ("k7", "v7", SUCCESS)]
    cluster.destroy()


@BOTH
def test_duplicated_reset_reply_makes_the_leader_send_a_truncating_batch(kv, caplog):
    """No reordering on any connection; only timing. The round trip to b is
    longer than a heartbeat period, and catch-up rounds are split in batches.

    1. a's round to b (3..6, 7..8) is lost with a dropped connection; a keeps
       nextIndex[b] = 9.
    2. a sends two heartbeats (prev=8) before b's first reply comes back; b
       rejects both: two next_node_idx(reset, 3) replies, R1 and R2.
    3. R1 arrives: a rewinds to 3 and sends round 2 (3..6, 7..8); b takes it.
    4. R2 arrives (one heartbeat later than R1, before b's acks of round 2):
       a rewinds to 3 again and sends round 3 (3..6, 7..8).
    5. b's acks of round 2 arrive: a commits 3..8 and acks k0..k5.
    6. b processes the first batch of round 3, (prev=2, 3..6): it deletes 7
       and 8. a crashes before the second batch reaches b.
    """
    cluster, acks = three_nodes_with_c_cut_off(kv)
    a, b, c = cluster["a"], cluster["b"], cluster["c"]
    net = cluster.net
    to_b = lambda s, d, m: d == "b"   # noqa: E731
    to_a = lambda s, d, m: d == "a"   # noqa: E731

    a._SyncObj__sendAppendEntries()
    net.queue.clear()                                         # 1
    a._SyncObj__sendAppendEntries()
    a._SyncObj__sendAppendEntries()                           # 2
    net.deliver(to_b)
    r1, r2 = net.take(to_a)
    assert r1[2] == r2[2] == {"type": "next_node_idx", "next_node_idx": 3,
                              "reset": True, "success": False}
    net.queue.append(r1)
    net.deliver()                                             # 3
    a._SyncObj__sendAppendEntries()
    net.deliver(to_b)
    acks_of_round_2 = net.take(to_a)
    net.queue.append(r2)
    net.deliver()                                             # 4
    a._SyncObj__sendAppendEntries()
    round_3 = net.take(to_b)
    assert [(m["prevLogIdx"], [e[1] for e in m["entries"]]) for _, _, m in round_3] == \
        [(2, [3, 4, 5, 6]), (6, [7, 8])]
    net.queue.extend(acks_of_round_2)
    net.deliver()
    cluster.tick("a")                                         # 5
    assert a.raftCommitIndex == 8
    assert acks == [(f"v{i}", SUCCESS) for i in range(6)]
    with caplog.at_level(logging.CRITICAL):
        net.queue.append(round_3[0])
        net.deliver()                                         # 6
    b_log_after_batch = log_of(b)
    crash_a_and_elect_b_with_c(cluster)

    if kv is PlainKV:
        assert b_log_after_batch[-1] == (6, 1)
        # b had not applied 7..8 yet, so pysyncobj logged nothing at all.
        assert not any("truncating" in r.message for r in caplog.records)
        # The acknowledged k4 and k5 are lost for good.
        assert [(k, v) for k, v in c.applied] == \
            [("k0", "v0"), ("k1", "v1"), ("k2", "v2"), ("k3", "v3"), ("k6", "v6"), ("k7", "v7")]
        assert b.applied == c.applied
    else:
        assert b_log_after_batch[-1] == (8, 1)
        assert c.applied == b.applied == [(f"k{i}", f"v{i}") for i in range(8)]
    cluster.destroy()


def test_without_a_leader_change_the_truncation_is_repaired_and_nothing_reapplied():
    """Plain pysyncobj: if the leader survives, its next heartbeat (prev=8) is
    rejected by the shortened follower, it rewinds and re-sends 7..8 with the
    same terms; the follower re-appends them but does not apply them again
    (lastApplied stayed 8). The damage is a window, not permanent."""
    cluster, acks = three_nodes_with_c_cut_off(PlainKV)
    a, b = cluster["a"], cluster["b"]
    net = cluster.net
    a._SyncObj__sendAppendEntries()
    delayed = net.take(lambda s, d, m: m.get("prevLogIdx") == 2)
    net.queue.clear()
    for _ in range(3):
        cluster.round("a")
    net.queue.extend(delayed)
    net.deliver()
    assert log_of(b)[-1] == (6, 1)
    assert (a.raftCommitIndex, b.raftCommitIndex, b.raftLastApplied) == (8, 6, 8)

    cluster.round("a")          # heartbeat prev=8 -> next_node_idx(reset, 7)
    cluster.round("a")          # AppendEntries(prev=6, 7..8)
    assert log_of(b) == log_of(a)
    assert applied_state(b) == applied_state(a) == (8, 8, [(f"k{i}", f"v{i}") for i in range(6)])
    cluster.destroy()


# ------------------------------------------- 3. the guard keeps Raft rules ---

def test_guard_still_truncates_a_real_uncommitted_conflict():
    """Raft §5.3 truncation stays: b holds uncommitted 7..8 from term 1; the
    term-2 leader's AppendEntries has a different entry at 7."""
    net, b = follower_with_8_applied(GuardedKV)
    handle(b, "a", ae(1, 8, 1, entries(9, ["x", "y"]), commit=8))     # 9, 10 uncommitted
    net.take()
    handle(b, "c", ae(2, 8, 1, [(NOOP, 9, 2)], commit=8))
    assert log_of(b)[-2:] == [(8, 1), (9, 2)]
    assert net.take() == [("b", "c", {"type": "next_node_idx", "next_node_idx": 10,
                                      "reset": False, "success": True})]
    assert b.raft_guard_events == []
    b.destroy()


def test_guard_appends_only_the_new_tail_of_an_overlapping_message():
    net, b = follower_with_8_applied(GuardedKV)
    handle(b, "a", ae(1, 4, 1, entries(5, ["k2", "k3", "k4", "k5", "k6"]), commit=8))
    assert log_of(b)[-1] == (9, 1)
    assert net.take()[0][2]["next_node_idx"] == 10
    b.doTick(0)
    assert b.raftLastApplied == 8   # commit stays 8 (leader's commit), 9 waits
    handle(b, "a", ae(1, 9, 1, [], commit=9))
    b.doTick(0)
    assert b.data["k6"] == "k6" and b.applied.count(("k6", "k6")) == 1
    b.destroy()


def test_guard_refuses_a_conflict_at_or_below_the_commit_index(caplog):
    """A leader claiming a different entry at committed index 7 means Raft's
    safety was already broken elsewhere: refuse, no reply, CRITICAL."""
    net, b = follower_with_8_applied(GuardedKV)
    with caplog.at_level(logging.CRITICAL, logger="kraft.raft_guard"):
        handle(b, "c", ae(2, 6, 1, [(NOOP, 7, 2)], commit=8))
    assert log_of(b)[-1] == (8, 1)
    assert net.take() == []
    [event] = b.raft_guard_events
    assert event.kind == CONFLICT_BELOW_COMMIT and event.critical
    assert [r.levelno for r in caplog.records] == [logging.CRITICAL]
    b.destroy()


def test_guard_refuses_a_same_index_and_term_entry_with_another_command():
    net, b = follower_with_8_applied(GuardedKV)
    handle(b, "a", ae(1, 6, 1, entries(7, ["not-k4"]), commit=8))
    assert log_of(b)[-1] == (8, 1) and net.take() == []
    [event] = b.raft_guard_events
    assert event.kind == ENTRY_MISMATCH and event.critical
    b.destroy()


def test_guard_does_not_commit_entries_a_stale_message_did_not_verify():
    """b holds 9..10 of an older term, unverified by the term-2 leader whose
    stale message covers only up to 8 but carries commit_index 10: b must
    commit no further than 8 (pysyncobj commits min(leaderCommit, lastIndex))."""
    net, b = follower_with_8_applied(GuardedKV)
    handle(b, "a", ae(1, 8, 1, entries(9, ["x", "y"]), commit=8))
    net.take()
    handle(b, "c", ae(2, 6, 1, entries(7, ["k4", "k5"]), commit=10))
    assert log_of(b)[-1] == (10, 1)
    assert b.raftCommitIndex == 8 and b.raftCurrentTerm == 2
    assert net.take() == [("b", "c", {"type": "next_node_idx", "next_node_idx": 9,
                                      "reset": False, "success": True})]
    b.doTick(0)
    assert "x" not in b.data
    b.destroy()


@BOTH
def test_stale_chunked_entry_transmission(kv):
    """An entry larger than appendEntriesBatchSizeBytes travels as
    start/process/finish pieces; a stale one truncates at 'finish'."""
    net, b = follower_with_8_applied(kv)
    blob = pspickle.dumps(entries(3, ["k0"])[0])
    pieces = [blob[:10], blob[10:20], blob[20:]]
    for kind, piece in zip(("start", "process", "finish"), pieces):
        handle(b, "a", {"type": "append_entries", "transmission": kind, "data": piece,
                        "term": 1, "commit_index": 8, "prevLogIdx": 2, "prevLogTerm": 1})
    assert net.take()[-1][2] == {"type": "next_node_idx", "next_node_idx": 4,
                                 "reset": False, "success": True}
    assert log_of(b)[-1] == ((3, 1) if kv is PlainKV else (8, 1))
    b.destroy()


@BOTH
def test_early_finish_piece_is_reassembled_like_pysyncobj_does(kv):
    """Aside, pysyncobj leader bug (syncobj.py 1281 compares the offset with the
    *command* length, not the pickled entry's): an entry can be sent as
    start / finish / finish. The follower raises on the early 'finish', keeps
    the bytes, and takes the entry at the second; the guard mirrors that."""
    net, b = follower_with_8_applied(kv)
    command = put_cmd("x" * 150)
    blob = pspickle.dumps((command, 9, 1))
    assert len(command) <= 200 < len(blob)

    def piece(kind, data):
        handle(b, "a", {"type": "append_entries", "transmission": kind, "data": data,
                        "term": 1, "commit_index": 8, "prevLogIdx": 8, "prevLogTerm": 1})

    piece("start", blob[:100])
    with pytest.raises(Exception):
        piece("finish", blob[100:200])
    piece("finish", blob[200:])
    assert log_of(b)[-1] == (9, 1)
    b.destroy()


def test_guard_tripwire_reports_a_lost_committed_entry(monkeypatch, caplog):
    """If a future pysyncobj truncated by some other path, the guard could not
    prevent it but reports it: simulate by letting a stale message through."""
    net, b = follower_with_8_applied(GuardedKV)
    monkeypatch.setattr(GuardedKV, "_raft_guard_filter", lambda self, node, message: message)
    with caplog.at_level(logging.CRITICAL, logger="kraft.raft_guard"):
        handle(b, "a", ae(1, 4, 1, entries(5, ["k2", "k3"]), commit=4))
    [event] = b.raft_guard_events
    assert event.kind == COMMITTED_ENTRY_LOST and event.critical
    assert "entry 8" in event.detail
    assert any(r.name == "kraft.raft_guard" for r in caplog.records)
    b.destroy()


def test_guard_private_pysyncobj_names_exist():
    """What a pysyncobj upgrade must keep for the guard to work (the module
    refuses to import without the two methods)."""
    assert raft_guard.PRIVATE_NAMES == ("_SyncObj__onMessageReceived",
                                        "_SyncObj__sendNextNodeIdx", "_SyncObj__raftLog")
    assert callable(SyncObj._SyncObj__onMessageReceived)
    assert callable(SyncObj._SyncObj__sendNextNodeIdx)
    net, b = follower_with_8_applied(GuardedKV)
    assert hasattr(b, "_SyncObj__raftLog")
    # The guard's own attributes are excluded from SyncObj's full dumps.
    assert {"_raft_guard_events", "_raft_guard_transmission"} <= b._SyncObj__properies
    # The transport delivers to the override, not to SyncObj's own handler.
    assert net.transports["b"]._onMessageReceivedCallback.__func__ is \
        GuardedSyncObj._SyncObj__onMessageReceived
    b.destroy()
