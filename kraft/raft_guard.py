"""Guard against pysyncobj followers truncating their log on a stale AppendEntries.

The defect (pysyncobj 0.3.17, ``SyncObj.__onMessageReceived`` in syncobj.py,
lines 982-1004): when an ``append_entries`` message's ``prevLogIdx`` /
``prevLogTerm`` match the follower's log, the follower deletes *every* entry
after ``prevLogIdx`` whenever it has any (``if len(prevEntries) > 1: ...
self.__deleteEntriesFrom(prevLogIdx + 1)``). It never compares the terms of the
entries the message carries with the ones it holds. Raft §5.3 deletes only from
the first *conflicting* entry, precisely because a follower can receive an
AppendEntries that is older than what it already has.

Such a same-term stale message reaches a follower when

* it was delayed on an old TCP connection while the sender had already
  reconnected (``TCPTransport._onIncomingMessageReceived`` replaces
  ``_connections[node]`` without closing the previous connection, whose
  messages are still delivered for the same node), or
* the leader rewinds ``nextIndex`` on a late, duplicated ``next_node_idx``
  reset reply (syncobj.py lines 1077-1078 apply every reset unconditionally) and
  re-sends a catch-up round in batches of ``appendEntriesBatchSizeBytes``:
  every batch but the last carries fewer entries than the follower has.

The follower then drops entries it has acknowledged (so the leader counted them
as replicated and may have committed and acknowledged them), lowers its commit
index (lines 1029-1030, persisted at line 1035) and replies success for the
shorter log, which the leader ignores (``matchIndex`` only grows, lines 1080-1082).
If the leader fails before re-sending them, the surviving majority may no
longer hold a committed entry: it is lost cluster-wide, and a follower that
had applied it keeps it in its state machine while it never applies the
entries a new leader writes at the same indexes (``raftLastApplied`` is not
rewound), so replicas diverge. A stale message that arrives while a log
compaction is in flight can also make ``__deleteEntriesTo`` empty the journal,
after which every log access raises ``IndexError``.

``GuardedSyncObj`` is a drop-in replacement for ``SyncObj`` as the base class
of a replicated object. Before pysyncobj sees an ``append_entries`` message it

1. skips the message's entries the follower already holds with the same term
   (Raft's "append any new entries not already in the log");
2. if an entry conflicts (same index, other term), lets pysyncobj truncate
   from that index, which is what Raft prescribes -- unless the index is at or
   below the commit index (or the last applied index): that would rewrite
   history this node has committed, a Raft safety violation caused elsewhere,
   so the message is refused and reported as CRITICAL rather than obeyed;
3. if every entry is already present (a stale or duplicated message), does not
   truncate at all: it hands pysyncobj a bare heartbeat (term, leader, election
   timer), raises the commit index at most to the last entry the message
   verified, and replies success for exactly that prefix, as a Raft follower
   does.

After every append_entries it also checks that the entry at
``min(max(commitIndex, lastApplied), lastLogIndex)`` is still in the log with
the same term, and reports CRITICAL if not -- a tripwire in case a pysyncobj
upgrade changes the handler underneath the guard.

Private pysyncobj names the guard relies on (checked at import and at
construction, so an upgrade that renames them fails loudly instead of silently
disabling the guard):

* ``SyncObj._SyncObj__onMessageReceived`` -- overridden; it is the callback
  ``SyncObj.__init__`` registers with the transport (``self.__onMessageReceived``
  is looked up on the instance, so the subclass's override is what gets bound);
* ``SyncObj._SyncObj__sendNextNodeIdx(node, reset=False, nextNodeIdx=None,
  success=False)`` -- used to reply to a stale message;
* ``self._SyncObj__raftLog`` -- the journal, read only: ``len()``, ``[i]``
  giving ``(command, index, term)``;
* the message layout: ``type``, ``term``, ``commit_index``, ``prevLogIdx``,
  ``prevLogTerm``, ``entries`` (``(command, index, term)`` items) and the
  chunked form ``transmission`` in ``start`` / ``process`` / ``finish`` with
  ``data`` (the pickled entry, split);
* the public ``raftCurrentTerm``, ``raftCommitIndex`` and ``raftLastApplied``.

Only pysyncobj and the standard library are imported.
"""

from __future__ import annotations

import collections
import logging
from dataclasses import dataclass
from typing import Any

import pysyncobj.pickle as _pysyncobj_pickle
from pysyncobj import SyncObj
from pysyncobj.version import VERSION as PYSYNCOBJ_VERSION

logger = logging.getLogger(__name__)

#: pysyncobj versions whose handler this guard was written against and tested on.
TESTED_PYSYNCOBJ_VERSIONS = ("0.3.17",)

_HANDLER = "_SyncObj__onMessageReceived"
_REPLY = "_SyncObj__sendNextNodeIdx"
_LOG = "_SyncObj__raftLog"

#: The private names above; tests assert they exist.
PRIVATE_NAMES = (_HANDLER, _REPLY, _LOG)

for _name in (_HANDLER, _REPLY):
    if not callable(getattr(SyncObj, _name, None)):
        raise ImportError(
            f"pysyncobj {PYSYNCOBJ_VERSION} has no SyncObj.{_name}; kraft.raft_guard "
            f"was written for {TESTED_PYSYNCOBJ_VERSIONS} and cannot guard this version")
if PYSYNCOBJ_VERSION not in TESTED_PYSYNCOBJ_VERSIONS:
    logger.warning("kraft.raft_guard was tested with pysyncobj %s, running on %s: "
                   "re-check the follower append_entries handler",
                   ", ".join(TESTED_PYSYNCOBJ_VERSIONS), PYSYNCOBJ_VERSION)

#: A same-term message whose entries the follower already holds: answered, not obeyed.
STALE_APPEND_ENTRIES = "stale_append_entries"
#: A conflicting entry at or below the commit (or last applied) index: refused.
CONFLICT_BELOW_COMMIT = "conflict_below_commit"
#: Same index and term, different command (Log Matching broken): refused.
ENTRY_MISMATCH = "entry_mismatch"
#: Tripwire: an entry at or below the commit/applied index vanished or changed.
COMMITTED_ENTRY_LOST = "committed_entry_lost"

_CRITICAL_KINDS = frozenset({CONFLICT_BELOW_COMMIT, ENTRY_MISMATCH, COMMITTED_ENTRY_LOST})


@dataclass(frozen=True)
class GuardEvent:
    """One append_entries message the guard intervened on (or a tripwire)."""

    kind: str
    leader: str            # id of the sending node
    term: int              # term of the message
    prev_log_idx: int | None
    first_entry_idx: int | None   # index of the message's first entry, if any
    last_entry_idx: int | None    # index of the message's last entry, if any
    log_last_idx: int      # this node's last log index when reported
    commit_idx: int        # this node's commit index when reported
    last_applied: int      # this node's last applied index when reported
    detail: str

    @property
    def critical(self) -> bool:
        return self.kind in _CRITICAL_KINDS


class GuardedSyncObj(SyncObj):
    """``SyncObj`` whose follower never truncates entries it already holds
    because of a stale AppendEntries, and refuses (loudly) to rewrite entries
    at or below its commit index. Use it exactly like ``SyncObj``."""

    #: How many recent ``GuardEvent``s ``raft_guard_events`` keeps.
    raft_guard_event_limit = 1000

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # Set before SyncObj.__init__: it records the attribute names present at
        # that point and serialises every attribute added later into its full
        # dumps (snapshots); and with autoTick its thread may deliver messages
        # before __init__ returns.
        self._raft_guard_events: collections.deque[GuardEvent] = collections.deque(
            maxlen=self.raft_guard_event_limit)
        self._raft_guard_transmission = b""
        super().__init__(*args, **kwargs)
        if not hasattr(self, _LOG):
            raise RuntimeError(f"pysyncobj {PYSYNCOBJ_VERSION}: SyncObj has no {_LOG}; "
                               "kraft.raft_guard cannot read the follower's log")

    # -- public surface ---------------------------------------------------

    @property
    def raft_guard_events(self) -> list[GuardEvent]:
        """The most recent interventions, oldest first."""
        return list(self._raft_guard_events)

    def on_raft_guard_event(self, event: GuardEvent) -> None:
        """Called (on the tick thread) for every event. Stale messages are
        routine under reordering and are logged at DEBUG; the other kinds mean
        the replicated log broke a Raft invariant and are logged CRITICAL.
        Override to export a metric or to fence this node."""
        if event.critical:
            logger.critical("raft guard: %s", event)
        else:
            logger.debug("raft guard: %s", event)

    # -- the override -----------------------------------------------------

    def _SyncObj__onMessageReceived(self, node: Any, message: Any) -> None:
        handle = getattr(SyncObj, _HANDLER)
        if not (isinstance(message, dict) and message.get("type") == "append_entries"
                and "prevLogIdx" in message
                and message.get("term", -1) >= self.raftCurrentTerm):
            handle(self, node, message)
            return
        message = self._raft_guard_filter(node, message)
        if message is None:
            return
        anchor = self._raft_guard_anchor()
        handle(self, node, message)
        self._raft_guard_check_anchor(node, message, anchor)

    # -- internals --------------------------------------------------------

    def _raft_guard_log(self) -> Any:
        return getattr(self, _LOG)

    def _raft_guard_filter(self, node: Any, message: dict) -> dict | None:
        """The message pysyncobj should process instead of ``message``, or
        None when the guard has dealt with it (replied or refused)."""
        transmission = message.get("transmission")
        if transmission is not None:
            # One entry too large for a batch, sent in pieces; mirror
            # pysyncobj's reassembly so the finished entry can be checked.
            if transmission == "start":
                self._raft_guard_transmission = message["data"]
                return message
            if transmission == "process":
                self._raft_guard_transmission += message["data"]
                return message
            if transmission != "finish":
                return message  # pysyncobj raises on an unknown kind
            self._raft_guard_transmission += message["data"]
            try:
                entry = _pysyncobj_pickle.loads(self._raft_guard_transmission)
            except Exception:
                # pysyncobj fails on it the same way and, like here, keeps the
                # bytes (its leader can send 'finish' one piece early).
                return message
            self._raft_guard_transmission = b""
            message = {k: v for k, v in message.items() if k not in ("transmission", "data")}
            message["entries"] = [entry]

        log = self._raft_guard_log()
        first_idx, last_idx = log[0][1], log[-1][1]
        prev_idx, prev_term = message["prevLogIdx"], message["prevLogTerm"]
        if prev_idx is None or prev_idx < first_idx or prev_idx >= last_idx:
            # Nothing after prevLogIdx to lose, or pysyncobj rejects the message.
            return message
        if log[prev_idx - first_idx][2] != prev_term:
            return message  # pysyncobj rejects it (term mismatch at prevLogIdx)

        entries = list(message.get("entries") or ())
        skip = 0  # entries already held with the same term
        while skip < len(entries):
            command, idx, term = entries[skip][0], entries[skip][1], entries[skip][2]
            if idx > last_idx:
                break
            held = log[idx - first_idx]
            if held[2] != term:
                break
            if bytes(held[0]) != bytes(command):
                self._raft_guard_report(
                    ENTRY_MISMATCH, node, message, entries, log,
                    f"entry {idx} term {term}: the leader's command differs from the one held; "
                    "refusing the message")
                return None
            skip += 1

        if skip < len(entries):
            first_new = entries[skip][1]
            if first_new <= last_idx:  # a real conflict: Raft truncates from here
                limit = max(self.raftCommitIndex, self.raftLastApplied)
                if first_new <= limit:
                    self._raft_guard_report(
                        CONFLICT_BELOW_COMMIT, node, message, entries, log,
                        f"entry {first_new} conflicts (held term {log[first_new - first_idx][2]}, "
                        f"leader term {entries[skip][2]}) at or below commit/applied index "
                        f"{limit}; refusing to rewrite committed history")
                    return None
            if skip == 0:
                return message
            rewritten = dict(message)
            rewritten["prevLogIdx"] = entries[skip - 1][1]
            rewritten["prevLogTerm"] = entries[skip - 1][2]
            rewritten["entries"] = entries[skip:]
            return rewritten

        # Every entry is already held and the log goes further: a stale or
        # duplicated message. Apply its heartbeat effects only, commit no
        # further than what it verified, and acknowledge exactly that prefix.
        verified = entries[-1][1] if entries else prev_idx
        self._raft_guard_report(
            STALE_APPEND_ENTRIES, node, message, entries, log,
            f"entries up to {verified} already held (log ends at {last_idx}); not truncating")
        heartbeat = {
            "type": "append_entries",
            "term": message["term"],
            "commit_index": min(message["commit_index"], verified),
        }
        getattr(SyncObj, _HANDLER)(self, node, heartbeat)
        getattr(self, _REPLY)(node, nextNodeIdx=verified + 1, success=True)
        return None

    def _raft_guard_anchor(self) -> tuple[int, int] | None:
        log = self._raft_guard_log()
        first_idx, last_idx = log[0][1], log[-1][1]
        idx = min(max(self.raftCommitIndex, self.raftLastApplied), last_idx)
        if idx < first_idx:
            return None
        return idx, log[idx - first_idx][2]

    def _raft_guard_check_anchor(self, node: Any, message: dict,
                                 anchor: tuple[int, int] | None) -> None:
        if anchor is None:
            return
        idx, term = anchor
        log = self._raft_guard_log()
        first_idx, last_idx = log[0][1], log[-1][1]
        if idx > last_idx or (idx >= first_idx and log[idx - first_idx][2] != term):
            self._raft_guard_report(
                COMMITTED_ENTRY_LOST, node, message, list(message.get("entries") or ()), log,
                f"entry {idx} (term {term}), at or below the commit/applied index, is no "
                f"longer in the log (log now ends at {last_idx})")

    def _raft_guard_report(self, kind: str, node: Any, message: dict, entries: list,
                           log: Any, detail: str) -> None:
        event = GuardEvent(
            kind=kind,
            leader=str(getattr(node, "id", node)),
            term=message.get("term"),
            prev_log_idx=message.get("prevLogIdx"),
            first_entry_idx=entries[0][1] if entries else None,
            last_entry_idx=entries[-1][1] if entries else None,
            log_last_idx=log[-1][1] if len(log) else 0,
            commit_idx=self.raftCommitIndex,
            last_applied=self.raftLastApplied,
            detail=detail,
        )
        self._raft_guard_events.append(event)
        self.on_raft_guard_event(event)
