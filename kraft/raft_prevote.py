"""Pre-vote for pysyncobj (Raft thesis §9.6; Kafka's KIP-996).

pysyncobj 0.3.17 stands for election as soon as a follower's election timer
runs out: it raises its term and asks for votes, and every voter that sees
the higher term -- the leader among them -- gives up its own (syncobj.py,
``_onTick`` lines 634-652 and ``__onMessageReceived`` lines 918-922). A
follower whose process was paused or starved of CPU for longer than the
election timeout therefore deposes a healthy leader when it wakes: its timer
is checked before the heartbeats waiting in its socket are read. Measured on
a 3-controller cluster with the shipped defaults, a follower paused for 1.5 s
moved the controller leadership every time; under a loaded CI machine such a
false election failed a topic creation with NOT_CONTROLLER.

``PreVoteSyncObj`` puts two steps before pysyncobj's election:

1. the messages that arrived while the tick thread did not run are read
   first (a heartbeat among them puts the timer back);
2. if the timer is still out, the follower asks every voter whether it
   *would* vote for it in the next term (``pre_vote``), changing nothing on
   either side. A voter says yes only if it is not the leader, has not heard
   from a leader within the minimum election timeout (leader stickiness) and
   the asker's log is at least as up to date as its own. Only with a
   majority of yeses does pysyncobj raise the term and stand; otherwise the
   follower asks again after a heartbeat period, and stops asking as soon
   as it hears from a leader.

A voter that sees its leader's connection close (kill -9 of the leader)
forgets that leader at once, so an early election after a crash is not held
up by stickiness. The asker's pre-vote says its leader is gone; a voter that
still hears a leader answers it only after the other messages of the same
poll (the close may be among them), and the asker asks again four times as
often as otherwise. A leadership transfer (``timeout_now``) skips the
pre-vote: the leader asked for the election.

Because terms no longer rise without a majority's agreement, a voter that
did get ahead (its real election was cut off half way) would otherwise
ignore the leader's lower-term heartbeats for ever. It answers such a
heartbeat with ``term_notice``; the leader takes the higher term and steps
down, and the next election, held at a term above it, brings it back. That
is etcd's answer to the same case (its ``MsgAppResp`` to a lower-term
leader when pre-vote is on).

A voter without this class ignores the new message types (pysyncobj drops
unknown ones), so a cluster part-way through an upgrade still elects: the
old voters as before, the new ones with the yeses of new voters.

Private pysyncobj names used, beyond those of ``kraft.raft_guard``:
``__raftState``, ``__raftElectionDeadline``, ``__transferInProgress``,
``__raftLeader``, ``__otherNodes``, ``__selfNode``, ``__transport``,
``__conf``, ``__setCurrentTerm``, ``__setState``, ``__getCurrentLogIndex``,
``__getCurrentLogTerm``, ``__onNodeDisconnected`` and the public ``_poller``
are checked (the methods at import, the attributes once a replica is
constructed); the TCP transport's ``_connections``,
``_lastConnectAttempt`` and ``TcpConnection.__lastReadTime`` (see
``_freshen_links``) are used where present. Every time compared with pysyncobj's timers is
read from pysyncobj's own clock (``raft_clock``: CLOCK_MONOTONIC_RAW, which
drifts from ``time.monotonic``: they were 0.26 s apart on the machine this
was written on).
"""

from __future__ import annotations

import math
import random
from typing import Any

from pysyncobj import SyncObj
from pysyncobj.monotonic import monotonic as raft_clock
from pysyncobj.tcp_connection import CONNECTION_STATE, TcpConnection

from kraft.raft_guard import GuardedSyncObj

#: pysyncobj's states (``_RAFT_STATE``).
_FOLLOWER = 0
_LEADER = 2

PRE_VOTE = "pre_vote"
PRE_VOTE_RESPONSE = "pre_vote_response"
TERM_NOTICE = "term_notice"

_PRIVATE_METHODS = ("_SyncObj__setCurrentTerm", "_SyncObj__setState",
                    "_SyncObj__getCurrentLogIndex", "_SyncObj__getCurrentLogTerm",
                    "_SyncObj__onNodeDisconnected", "_onTick")
for _name in _PRIVATE_METHODS:
    if not callable(getattr(SyncObj, _name, None)):
        raise ImportError(f"pysyncobj has no SyncObj.{_name}: kraft.raft_prevote cannot "
                          "put a pre-vote before its elections")

#: How often an election without a link to a voter tries to connect to it.
RECONNECT_EVERY_S = 0.1

#: Where pysyncobj's TCP connection keeps the time it last read anything.
_LAST_READ = "_TcpConnection__lastReadTime"

#: Instance attributes read or set; checked once a replica is constructed.
PRIVATE_ATTRIBUTES = ("_SyncObj__raftState", "_SyncObj__raftElectionDeadline",
                      "_SyncObj__transferInProgress", "_SyncObj__raftLeader",
                      "_SyncObj__otherNodes", "_SyncObj__selfNode", "_SyncObj__transport",
                      "_SyncObj__conf", "_poller")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


class PreVoteSyncObj(GuardedSyncObj):
    """``GuardedSyncObj`` whose followers stand for election only once a
    majority of voters agree that no leader is heard from. Use it exactly
    like ``SyncObj``; ``pre_vote_counts`` says how often each step ran."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # Set before SyncObj.__init__ (see GuardedSyncObj.__init__).
        #: When this replica last heard from a leader of its term (monotonic).
        self._leader_heard = -math.inf
        #: The term the pre-vote in progress asks about (None: none asked).
        self._pre_vote_term: int | None = None
        self._pre_vote_yeses: set[Any] = set()
        #: The term a majority agreed this replica may stand in, and when.
        self._pre_vote_won: int | None = None
        self._pre_vote_won_at = -math.inf
        #: Whether the connection to the last leader closed since it was heard.
        self._leader_gone = False
        #: Pre-votes from askers whose leader is gone, answered after the
        #: messages that came with them (the close among them, perhaps).
        self._pre_vote_deferred: list[tuple[Any, dict]] = []
        self.pre_vote_counts = {"asked": 0, "won": 0, "granted": 0, "refused": 0,
                                "term_notices": 0}
        super().__init__(*args, **kwargs)
        missing = [name for name in PRIVATE_ATTRIBUTES if not hasattr(self, name)]
        if missing:
            raise RuntimeError(f"pysyncobj's SyncObj has no {', '.join(missing)}: "
                               "kraft.raft_prevote cannot run")

    # -- hooks --------------------------------------------------------------

    def _may_stand(self) -> bool:
        """Whether this replica is a voter that may stand for election."""
        return self._SyncObj__selfNode is not None

    # -- the gate before pysyncobj's election (tick thread) -----------------

    def _onTick(self, timeToWait: float = 0.0) -> None:  # noqa: N803 (pysyncobj's name)
        if self._pre_vote_deferred:
            deferred, self._pre_vote_deferred = self._pre_vote_deferred, []
            for node, message in deferred:
                self._answer_pre_vote(node, message, may_defer=False)
        self._pre_vote_gate()
        super()._onTick(timeToWait)

    def _pre_vote_gate(self) -> None:
        """Leave an expired election timer to pysyncobj only with a
        majority's pre-vote; otherwise ask for one and put the timer off."""
        if (self._SyncObj__raftState == _LEADER or not self._may_stand()
                or self._SyncObj__raftElectionDeadline >= raft_clock()
                or not self._SyncObj__otherNodes):
            return  # no election due, or a lone voter's, which pysyncobj holds
        if (self._pre_vote_won is not None and raft_clock() - self._pre_vote_won_at
                > self._SyncObj__conf.raftMinTimeout):
            # Won, but not stood on in time (connected to nobody meanwhile):
            # the yeses describe a cluster that may have moved on. Ask again.
            self._pre_vote_won = None
        if self._SyncObj__transferInProgress or self._pre_vote_won == self.raftCurrentTerm + 1:
            self._freshen_links()  # pysyncobj asks for votes during this tick
            return
        if self._SyncObj__transport.ready:
            # Heartbeats that waited in the socket while this thread was
            # paused or starved: read before deciding that none came.
            self._poller.poll(0)
            if (self._SyncObj__raftElectionDeadline >= raft_clock()
                    or self._SyncObj__raftState == _LEADER):
                return
        term = self.raftCurrentTerm + 1
        if self._pre_vote_won == term:
            return
        self._pre_vote_term = term
        self._pre_vote_yeses = set()
        self.pre_vote_counts["asked"] += 1
        self._freshen_links()
        request = {"type": PRE_VOTE, "term": term,
                   "last_log_index": self._SyncObj__getCurrentLogIndex(),
                   "last_log_term": self._SyncObj__getCurrentLogTerm(),
                   "leader_gone": self._leader_gone}
        for node in list(self._SyncObj__otherNodes):
            self._SyncObj__transport.send(node, request)
        period = self._SyncObj__conf.appendEntriesPeriod
        if self._leader_gone:
            # The others see the same connection close within moments:
            # ask again soon rather than after a heartbeat period.
            period /= 4
        self._SyncObj__raftElectionDeadline = raft_clock() + period * (
            1 + random.random())

    def _freshen_links(self) -> None:
        """pysyncobj closes a connection on which it sends after reading
        nothing for ``connectionTimeout`` (``TcpConnection.__trySendBuffer``),
        and the message with it. That is meant for a peer that stopped
        answering; but two followers never speak to each other while a leader
        is heard, so the first message of an election would always find their
        link idle, be dropped, and wait for a reconnection (up to
        ``connectionRetryTime``). A connected link is counted as read from
        when an election starts talking on it; a dead peer still shows as a
        send error, or through TCP keepalive and the timeout after this.

        A link that is down (a voter restarted moments ago) is tried again at
        the transport's next tick rather than after ``connectionRetryTime``,
        at most every ``RECONNECT_EVERY_S``: the side that connects is asking
        too, and its asks reach the other side once it has."""
        transport = self._SyncObj__transport
        connections = getattr(transport, "_connections", None)
        attempts = getattr(transport, "_lastConnectAttempt", None)
        if not connections:
            return  # not pysyncobj's TCP transport
        now = raft_clock()
        for node in self._SyncObj__otherNodes:
            connection = connections.get(node)
            if not isinstance(connection, TcpConnection) or node == self._SyncObj__raftLeader:
                continue  # the leader whose connection closed is not called again sooner
            if connection.state == CONNECTION_STATE.CONNECTED:
                if hasattr(connection, _LAST_READ):
                    setattr(connection, _LAST_READ, now)
            elif (connection.state == CONNECTION_STATE.DISCONNECTED
                    and isinstance(attempts, dict)
                    and now - attempts.get(node, now) > RECONNECT_EVERY_S):
                del attempts[node]

    # -- messages (tick thread) ---------------------------------------------

    def _SyncObj__onMessageReceived(self, node: Any, message: Any) -> None:  # noqa: N802
        if isinstance(message, dict):
            kind = message.get("type")
            if kind == PRE_VOTE:
                self._answer_pre_vote(node, message)
                return
            if kind == PRE_VOTE_RESPONSE:
                self._count_pre_vote(node, message)
                return
            if kind == TERM_NOTICE:
                self._take_term_notice(node, message)
                return
            if kind == "append_entries" and _is_int(message.get("term")):
                if message["term"] >= self.raftCurrentTerm:
                    # A leader of this term or a later one: no election.
                    self._leader_heard = raft_clock()
                    self._leader_gone = False
                    self._pre_vote_term = None
                    self._pre_vote_won = None
                elif self._may_stand() and node in self._SyncObj__otherNodes:
                    # A leader behind this voter's term, which it would
                    # otherwise ignore for good: tell it.
                    self._SyncObj__transport.send(
                        node, {"type": TERM_NOTICE, "term": self.raftCurrentTerm})
        super()._SyncObj__onMessageReceived(node, message)

    def _leader_is_heard(self) -> bool:
        return (self._SyncObj__raftLeader is not None and raft_clock() - self._leader_heard
                < self._SyncObj__conf.raftMinTimeout)

    def _answer_pre_vote(self, node: Any, message: dict, may_defer: bool = True) -> None:
        term = message.get("term")
        last_index = message.get("last_log_index")
        last_term = message.get("last_log_term")
        if not (_is_int(term) and _is_int(last_index) and _is_int(last_term)):
            return
        if node not in self._SyncObj__otherNodes:
            return  # not a voter here: its yes or no is nobody's business
        heard = self._leader_is_heard()
        theirs = (last_term, last_index)
        mine = (self._SyncObj__getCurrentLogTerm(), self._SyncObj__getCurrentLogIndex())
        # Two voters asking about the same term with the same log would both
        # win if each said yes to the other, and split the real vote (a
        # random 1-2 election timeouts more). The lower id keeps its own; one
        # that has won already stands in that term and votes for itself.
        contending = self._pre_vote_won == term or (
            self._pre_vote_term == term and theirs == mine
            and str(self._SyncObj__selfNode.id) < str(node.id))
        granted = (term > self.raftCurrentTerm
                   and self._SyncObj__raftState != _LEADER
                   and not heard
                   and theirs >= mine and not contending)
        if heard and may_defer and message.get("leader_gone") is True:
            # The asker saw its leader's connection close; the same close
            # may be among the messages this poll has yet to hand over.
            self._pre_vote_deferred.append((node, message))
            return
        self.pre_vote_counts["granted" if granted else "refused"] += 1
        self._SyncObj__transport.send(node, {
            "type": PRE_VOTE_RESPONSE, "term": term, "granted": granted,
            "current_term": self.raftCurrentTerm})

    def _count_pre_vote(self, node: Any, message: dict) -> None:
        current = message.get("current_term")
        if _is_int(current) and current > self.raftCurrentTerm:
            self._join_term(current)  # Raft: a later term seen is taken
            return
        if (message.get("granted") is not True or message.get("term") != self._pre_vote_term
                or self._pre_vote_term != self.raftCurrentTerm + 1
                or node not in self._SyncObj__otherNodes
                or self._SyncObj__raftState == _LEADER):
            return
        self._pre_vote_yeses.add(node)
        if len(self._pre_vote_yeses) + 1 > (len(self._SyncObj__otherNodes) + 1) / 2:
            self.pre_vote_counts["won"] += 1
            self._pre_vote_won = self._pre_vote_term
            self._pre_vote_won_at = raft_clock()
            self._pre_vote_term = None
            self._SyncObj__raftElectionDeadline = 0.0  # stand at the next tick

    def _take_term_notice(self, node: Any, message: dict) -> None:
        term = message.get("term")
        if not _is_int(term) or node not in self._SyncObj__otherNodes:
            return
        if term > self.raftCurrentTerm:
            self.pre_vote_counts["term_notices"] += 1
            self._join_term(term)

    def _join_term(self, term: int) -> None:
        """Take a later term as a follower with no vote cast and no leader,
        as pysyncobj does for a vote request of a later term."""
        self._SyncObj__setCurrentTerm(term, None)
        self._SyncObj__setState(_FOLLOWER)
        self._SyncObj__raftLeader = None
        self._leader_heard = -math.inf
        self._leader_gone = False
        self._pre_vote_term = None
        self._pre_vote_won = None

    def _SyncObj__onNodeDisconnected(self, node: Any) -> None:  # noqa: N802
        if node == self._SyncObj__raftLeader:
            # Its process is gone or it hung up: no leader is heard, so this
            # replica's yes does not wait out the timeout.
            self._leader_heard = -math.inf
            self._leader_gone = True
        super()._SyncObj__onNodeDisconnected(node)
