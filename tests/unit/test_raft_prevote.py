"""Pre-vote (KIP-996) before pysyncobj's elections: ``kraft.raft_prevote``.

Real ``SyncObj`` objects (pysyncobj's own election and vote code, as shipped)
on the in-process fake network of ``test_pysyncobj_stale_append``: messages
move only when a test delivers them, nothing is timed. Where a case shows
what plain pysyncobj does, both classes run it and the test asserts each.
"""

from __future__ import annotations

import socket

import pytest

from kraft import raft_prevote
from kraft.raft_prevote import PRE_VOTE, PRE_VOTE_RESPONSE, TERM_NOTICE, PreVoteSyncObj
from pysyncobj import SyncObj
from pysyncobj.node import Node
from pysyncobj.poller import createPoller
from pysyncobj.tcp_connection import CONNECTION_STATE, TcpConnection
from tests.unit import test_pysyncobj_stale_append as stale_append
from tests.unit.test_pysyncobj_stale_append import FakeNet, handle, kv_class

PlainKV = kv_class(SyncObj)
PreVoteKV = kv_class(PreVoteSyncObj)
BOTH = pytest.mark.parametrize("kv", [PlainKV, PreVoteKV], ids=["pysyncobj", "pre-vote"])


class Cluster(stale_append.Cluster):
    """Voters a, b, c of class ``kv`` on one FakeNet, every pair connected;
    elections go through the pre-vote, so they take several deliveries."""

    def settle(self, rounds: int = 6) -> None:
        """Deliver everything and tick everybody, a few times over."""
        for _ in range(rounds):
            self.net.deliver()
            self.tick()
        self.net.deliver()

    def time_out(self, name: str) -> None:
        """``name``'s election timer runs out (as after a pause)."""
        self.nodes[name]._SyncObj__raftElectionDeadline = 0

    def elect(self, name: str) -> None:
        self.time_out(name)
        self.settle()
        assert self.nodes[name]._isLeader()
        self.round(name)

    def round(self, leader: str) -> None:
        super().round(leader)
        self.net.deliver()

    def crash(self, name: str, seen_by: tuple[str, ...]) -> None:
        """kill -9 of ``name``: down, and its connections close at ``seen_by``."""
        self.net.down.add(name)
        for other in seen_by:
            self.net.transports[other]._onNodeDisconnected(Node(name))

    def terms(self) -> dict[str, int]:
        return {n: node.raftCurrentTerm for n, node in self.nodes.items()}

    def leaders(self) -> list[str]:
        return [n for n, node in self.nodes.items()
                if n not in self.net.down and node._isLeader()]


def sent(net: FakeNet, kind: str) -> list[tuple[str, str, dict]]:
    return [m for m in net.queue if m[2].get("type") == kind]


@BOTH
def test_a_follower_whose_timer_ran_out_does_not_depose_a_leader_the_others_hear(kv):
    """b was paused past its election timeout while a led and c followed.
    pysyncobj: b raises the term at once and a steps down on b's vote
    request. With pre-vote: b only asks; a (the leader) and c (which hears
    it) say no; nothing changes and b follows a again at its next heartbeat."""
    cluster = Cluster(kv)
    cluster.elect("a")
    assert cluster.terms() == {"a": 1, "b": 1, "c": 1}
    cluster.time_out("b")
    cluster.tick("b")
    if kv is PlainKV:
        assert [m[2]["term"] for m in sent(cluster.net, "request_vote")] == [2, 2]
        cluster.net.deliver()
        assert not cluster["a"]._isLeader() and cluster["a"].raftCurrentTerm == 2
    else:
        assert not sent(cluster.net, "request_vote")
        asks = sent(cluster.net, PRE_VOTE)
        assert sorted(dst for _, dst, _ in asks) == ["a", "c"]
        assert all(m["term"] == 2 for _, _, m in asks)
        cluster.net.deliver()
        assert cluster["b"].pre_vote_counts["asked"] == 1
        assert cluster["b"].pre_vote_counts["won"] == 0
        assert cluster["a"].pre_vote_counts["refused"] == 1
        assert cluster["c"].pre_vote_counts["refused"] == 1
        cluster.round("a")
        assert cluster.leaders() == ["a"] and cluster.terms() == {"a": 1, "b": 1, "c": 1}
        assert cluster["b"]._getLeader() == Node("a")
    cluster.destroy()


def test_a_follower_reads_heartbeats_that_waited_before_it_asks():
    """The heartbeat that came while b's tick thread was stopped is read
    before b decides none came: b asks nobody."""
    cluster = Cluster(PreVoteKV)
    cluster.elect("a")
    cluster["a"]._SyncObj__sendAppendEntries()
    queued = cluster.net.take(lambda src, dst, m: dst == "b")
    assert queued
    cluster.time_out("b")
    # The fake transport has no socket for the poll to read: hand the queued
    # heartbeats to it the moment b's gate polls, as the TCP transport would.
    poller = cluster["b"]._poller
    real_poll = poller.poll

    def poll_delivering(timeout):
        for src, _, message in queued:
            cluster.net.transports["b"]._onMessageReceived(Node(src), message)
        queued.clear()
        return real_poll(timeout)

    poller.poll = poll_delivering
    cluster.tick("b")
    assert not sent(cluster.net, PRE_VOTE) and not sent(cluster.net, "request_vote")
    assert cluster["b"].pre_vote_counts["asked"] == 0
    assert cluster.terms() == {"a": 1, "b": 1, "c": 1}
    cluster.destroy()


def test_when_the_leaders_process_is_gone_a_follower_is_elected_at_once():
    """kill -9 of a: its connections close, b and c forget it as leader, so
    c says yes to b's pre-vote without waiting out its own timer, and b is
    elected in the next term."""
    cluster = Cluster(PreVoteKV)
    cluster.elect("a")
    cluster.crash("a", seen_by=("b", "c"))
    granted = cluster["c"].pre_vote_counts["granted"]
    cluster.time_out("b")
    cluster.settle()
    assert cluster.leaders() == ["b"]
    assert cluster["b"].raftCurrentTerm == cluster["c"].raftCurrentTerm == 2
    assert cluster["b"].pre_vote_counts["won"] == 1
    assert cluster["c"].pre_vote_counts["granted"] == granted + 1
    cluster.destroy()


def test_a_pre_vote_that_comes_before_the_close_it_follows_is_answered_after_it():
    """b saw a's connection close and asks; c gets the ask before its own
    copy of the close (one poll hands both over, in any order). c answers
    once the poll's messages are handled, by then without a leader: yes."""
    cluster = Cluster(PreVoteKV)
    cluster.elect("a")
    cluster.crash("a", seen_by=("b",))
    cluster.time_out("b")
    cluster.tick("b")
    [(_, _, ask)] = [m for m in sent(cluster.net, PRE_VOTE) if m[1] == "c"]
    assert ask["leader_gone"] is True
    cluster.net.deliver(lambda src, dst, m: dst == "c")
    assert not sent(cluster.net, PRE_VOTE_RESPONSE)  # held back, not refused
    cluster.net.transports["c"]._onNodeDisconnected(Node("a"))
    cluster.tick("c")
    [(_, _, answer)] = sent(cluster.net, PRE_VOTE_RESPONSE)
    assert answer["granted"] is True
    cluster.settle()
    assert cluster.leaders() == ["b"] and cluster["b"].raftCurrentTerm == 2
    cluster.destroy()


def test_two_voters_asking_at_once_with_the_same_log_do_not_both_win():
    """b and c both ask about term 2 and their asks cross (a link that came
    up with both waiting). Were each to say yes, both would stand and split
    the vote. The lower id keeps its own: exactly one wins and is elected."""
    cluster = Cluster(PreVoteKV)
    cluster.elect("a")
    cluster.crash("a", seen_by=("b", "c"))
    cluster.time_out("b")
    cluster.time_out("c")
    cluster.tick("b")
    cluster.tick("c")
    assert len(sent(cluster.net, PRE_VOTE)) == 2  # each asks the other (a is down)
    cluster.settle()
    assert cluster["b"].pre_vote_counts["won"] + cluster["c"].pre_vote_counts["won"] == 1
    assert cluster.leaders() == ["b"]
    assert cluster.terms()["b"] == cluster.terms()["c"] == 2
    cluster.destroy()


def test_a_voter_that_won_its_pre_vote_says_no_to_another_for_the_same_term():
    """c won its pre-vote for term 2 and stands at its next tick; b's ask
    for term 2, arriving first, is refused whatever the ids: c will vote
    for itself in that term."""
    cluster = Cluster(PreVoteKV)
    cluster.elect("a")
    cluster.crash("a", seen_by=("b", "c"))
    cluster.time_out("c")
    cluster.tick("c")
    cluster.net.deliver(lambda src, dst, m: m["type"] == PRE_VOTE)  # b answers c
    handle(cluster["c"], "b", cluster.net.take(
        lambda src, dst, m: m["type"] == PRE_VOTE_RESPONSE)[0][2])
    assert cluster["c"]._pre_vote_won == 2  # stands at its next tick
    handle(cluster["c"], "b", {"type": PRE_VOTE, "term": 2, "last_log_index": 2,
                               "last_log_term": 1, "leader_gone": True})
    [(_, _, answer)] = sent(cluster.net, PRE_VOTE_RESPONSE)
    assert answer["granted"] is False
    cluster.settle()
    assert cluster.leaders() == ["c"] and cluster.terms()["c"] == 2
    cluster.destroy()


def test_a_pre_vote_won_but_not_stood_on_in_time_is_asked_again():
    """b won its pre-vote but could not stand (connected to nobody, say)
    for longer than the election timeout: those yeses may be stale, so b
    asks again before it stands."""
    cluster = Cluster(PreVoteKV)
    cluster.elect("a")
    cluster.crash("a", seen_by=("b", "c"))
    b = cluster["b"]
    cluster.time_out("b")
    cluster.tick("b")
    cluster.net.deliver(lambda src, dst, m: m["type"] == PRE_VOTE)
    cluster.net.deliver(lambda src, dst, m: m["type"] == PRE_VOTE_RESPONSE)
    assert b._pre_vote_won == 2
    b._pre_vote_won_at -= 2 * b._SyncObj__conf.raftMinTimeout  # as if that long ago
    asked = b.pre_vote_counts["asked"]
    cluster.tick("b")
    assert b.pre_vote_counts["asked"] == asked + 1
    assert not sent(cluster.net, "request_vote") and b.raftCurrentTerm == 1
    cluster.settle()
    assert cluster.leaders() == ["b"] and b.raftCurrentTerm == 2
    cluster.destroy()


def test_an_idle_link_carries_the_first_message_of_an_election():
    """pysyncobj closes a connection it sends on after reading nothing for
    its timeout, dropping the message: what two followers' link always looks
    like. The pre-vote counts a connected link as read from first."""
    poller = createPoller("auto")
    mine, theirs = socket.socketpair()
    try:
        idle = TcpConnection(poller, socket=mine, timeout=1.0)
        setattr(idle, raft_prevote._LAST_READ, raft_prevote.raft_clock() - 5)
        idle.send({"type": PRE_VOTE})
        assert idle.state == CONNECTION_STATE.DISCONNECTED  # pysyncobj's own behaviour
    finally:
        theirs.close()
    cluster = Cluster(PreVoteKV)
    cluster.elect("a")
    mine, theirs = socket.socketpair()
    try:
        link = TcpConnection(poller, socket=mine, timeout=1.0)
        setattr(link, raft_prevote._LAST_READ, raft_prevote.raft_clock() - 5)
        cluster.net.transports["b"]._connections = {Node("c"): link}
        cluster["b"]._freshen_links()
        link.send({"type": PRE_VOTE})
        assert link.state == CONNECTION_STATE.CONNECTED
        theirs.settimeout(5)
        assert theirs.recv(4)  # the message's length prefix arrived
        link.disconnect()
    finally:
        theirs.close()
        cluster.destroy()


def test_a_voter_whose_log_is_behind_gets_no_yes():
    """c missed entries while cut off; its pre-vote is refused by a voter
    holding more, even with no leader heard, so it never raises a term it
    could not win."""
    cluster = Cluster(PreVoteKV)
    cluster.elect("a")
    cluster.net.down.add("c")
    cluster["a"].put("k", "v")
    cluster.tick("a")
    cluster.round("a")
    cluster.net.down = set()
    cluster.crash("a", seen_by=("b", "c"))
    cluster.time_out("c")
    cluster.tick("c")
    cluster.net.deliver()
    assert cluster["b"].pre_vote_counts["refused"] == 1
    assert cluster["b"].pre_vote_counts["granted"] == 1  # a's, at the start
    assert cluster["c"].pre_vote_counts["won"] == 0
    assert cluster["c"].raftCurrentTerm == 1
    cluster.destroy()


def test_a_voter_ahead_of_the_leaders_term_brings_the_cluster_to_it():
    """c raised its term but its vote requests were lost (a real election
    cut off half way). It ignores a's lower-term heartbeats; without the
    notice it could never follow again, since the others refuse its
    pre-votes while they hear a. c's notice makes a step down, and the next
    election, above c's term, brings c back as a follower."""
    cluster = Cluster(PreVoteKV)
    cluster.elect("a")
    # What pysyncobj's election does to c, its vote requests then lost.
    c = cluster["c"]
    c._SyncObj__setCurrentTerm(3, "c")
    c._SyncObj__setState(1)  # candidate
    c._SyncObj__raftLeader = None
    cluster.round("a")
    assert cluster["a"].pre_vote_counts["term_notices"] == 1
    assert not cluster["a"]._isLeader() and cluster["a"].raftCurrentTerm == 3
    cluster.time_out("a")
    cluster.settle()
    assert cluster.leaders() == ["a"]
    assert cluster.terms() == {"a": 4, "b": 4, "c": 4}
    done = []
    cluster["a"].put("k", "v", callback=lambda result, error: done.append(error))
    cluster.tick("a")
    cluster.round("a")
    cluster.round("a")
    assert done == [0] and cluster["c"].data == {"k": "v"}
    cluster.destroy()


def test_a_leadership_transfer_skips_the_pre_vote():
    """The leader asked for the election (timeout_now): b stands at once."""
    cluster = Cluster(PreVoteKV)
    cluster.elect("a")
    handle(cluster["b"], "a", {"type": "timeout_now", "term": 1})
    cluster.tick("b")
    assert [m[2]["term"] for m in sent(cluster.net, "request_vote")] == [2, 2]
    assert not sent(cluster.net, PRE_VOTE)
    cluster.destroy()


@pytest.mark.parametrize("message", [
    {"type": PRE_VOTE, "term": "2", "last_log_index": 1, "last_log_term": 1},
    {"type": PRE_VOTE, "term": 2, "last_log_index": None, "last_log_term": 1},
    {"type": PRE_VOTE, "term": True, "last_log_index": 1, "last_log_term": 1},
    {"type": PRE_VOTE},
    {"type": PRE_VOTE_RESPONSE, "term": 2, "granted": 1, "current_term": "x"},
    {"type": TERM_NOTICE, "term": [5]},
])
def test_malformed_messages_change_nothing_and_get_no_answer(message):
    cluster = Cluster(PreVoteKV)
    cluster.elect("a")
    handle(cluster["b"], "c", message)
    assert not cluster.net.queue
    assert cluster.terms() == {"a": 1, "b": 1, "c": 1}
    cluster.destroy()


def test_a_node_that_is_not_a_voter_is_not_answered_nor_obeyed():
    cluster = Cluster(PreVoteKV)
    cluster.elect("a")
    handle(cluster["b"], "x", {"type": PRE_VOTE, "term": 9, "last_log_index": 99,
                               "last_log_term": 9})
    handle(cluster["b"], "x", {"type": TERM_NOTICE, "term": 9})
    assert not cluster.net.queue
    assert cluster["b"].raftCurrentTerm == 1
    cluster.destroy()


def test_private_pysyncobj_names_exist():
    """What a pysyncobj upgrade must keep (the module refuses to import or
    to construct without them)."""
    for name in raft_prevote._PRIVATE_METHODS:
        assert callable(getattr(SyncObj, name))
    cluster = Cluster(PreVoteKV)
    for name in raft_prevote.PRIVATE_ATTRIBUTES:
        assert hasattr(cluster["a"], name)
    # Its state is kept out of SyncObj's full dumps.
    assert {"_leader_heard", "_pre_vote_term", "pre_vote_counts"} <= \
        cluster["a"]._SyncObj__properies
    cluster.destroy()
