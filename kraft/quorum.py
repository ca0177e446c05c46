"""The controller quorum: a pysyncobj Raft group whose one replicated method
applies a batch of metadata records to the ``MetadataImage``.

Threads. pysyncobj runs on its own tick thread (``MetadataQuorum.start``
starts it; ``autoTick`` is off so the image exists before the first tick).
Replicated methods, pysyncobj callbacks and the state-change hook run there.
Everything else (HTTP handlers, the controller core) runs on the asyncio loop.
The bridge:
  - ``propose`` (loop) queues a command with a callback; the callback (tick
    thread) resolves an asyncio future through ``loop.call_soon_threadsafe``.
    Nothing on the loop ever waits on the tick thread, and nothing on the tick
    thread ever calls ``sync=True``.
  - ``image_lock`` (a ``threading.Lock``) guards the image and the record
    history: the tick thread holds it while applying, the loop while reading.
  - ``add_listener`` callbacks run on the tick thread after each applied batch
    and after each Raft state change; the server forwards them to its loop.

Atomic batches. A batch carries the metadata offset of the image it was
computed against (``expected_offset``). Applying it on any other image would
apply records validated against a different state, so such a batch is
rejected, identically on every replica (``STALE``), and the active controller
recomputes. Records of a batch take consecutive metadata offsets.

Persistence. ``journalFile`` and ``fullDumpFile`` live in the controller's
metadata directory. pysyncobj never fsyncs; ``_DurableJournal`` fsyncs the
journal after every change, stores term/vote/commit index with fsync, and
replaces the journal atomically when a snapshot lets it drop old entries,
so an acknowledged entry or vote survives a crash or a power loss, as Raft
requires. Snapshots (``fullDumpFile``) are written by ``_write_snapshot``:
msgpack of the image (never pickle), fsynced before pysyncobj renames it into
place; the rename is made durable before the journal drops the entries the
snapshot covers, and a journal left longer than the snapshot by a crash is
cut to line up with it at start-up (``_trim_journal_to_snapshot``).

Safety. The base class is ``GuardedSyncObj`` (kraft/raft_guard.py), which
stops pysyncobj's follower from truncating committed entries on a stale
AppendEntries.
Its base, ``PreVoteSyncObj`` (kraft/raft_prevote.py), adds Raft's pre-vote
(KIP-996): a follower that was paused or starved past its election timeout
stands only if a majority no longer hears a leader, so it cannot depose a
healthy one.

Membership (KIP-853). The voter set is in the log (``kraft/membership.py``):
pysyncobj's membership entries, which its leader and followers act on when
they append them and undo when they truncate them, as Raft's single-server
changes need. pysyncobj leaves four gaps, closed here:

- at start-up it uses the static voter list and re-applies only committed
  entries; here the set is read from the whole log (the snapshot's set, then
  every journal entry after it, committed or not) before anything runs, and
  re-applying a committed entry changes nothing (``__doApplyCommand``);
- its snapshots (our serializer) did not record the set; they record it as
  of the snapshot's last entry (later entries undone, ``membership.revert``);
- it never enforces one change at a time (``__changeClusterIDx`` is never
  set); ``__changeCluster`` refuses a change while another is uncommitted;
- it cannot remove its own leader; ``remove_voter`` hands leadership to a
  caught-up voter first, and the new leader removes the old one.

A controller that is not in the set (joining, or removed) is an observer:
it never stands for election. A joining one is first a learner of the
leader (pysyncobj's read-only replication) and becomes a voter only once it
holds every committed entry, as KIP-853's AddVoter requires.
"""

from __future__ import annotations

import asyncio
import collections
import enum
import itertools
import logging
import os
import random
import socket
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import msgpack
import pysyncobj.pickle as _pysyncobj_pickle
from pysyncobj import FAIL_REASON, SyncObj, SyncObjConf, SyncObjException, replicated
from pysyncobj.journal import FileJournal
from pysyncobj.node import TCPNode

from kraft import membership
from kraft import records as metadata_records
from kraft.image import MetadataImage
from kraft.membership import Change, MembershipRefused, Voter
from kraft.raft_prevote import PreVoteSyncObj, raft_clock
from protocol.errors import NotControllerError, RequestTimedOutError

logger = logging.getLogger(__name__)

JOURNAL_FILE = "raft.journal"
SNAPSHOT_FILE = "raft.snapshot"
SNAPSHOT_FORMAT = 1
#: Records kept in memory for brokers that long-poll; older ones come as a snapshot.
HISTORY_RECORDS_MAX = 50_000
#: Bytes of records one metadata fetch returns at most.
FETCH_BYTES_MAX = 4 * 1024 * 1024
#: When the leader's connection closes, the remaining voters stand for
#: election this far apart, by rank (see MetadataQuorum).
EARLY_ELECTION_STAGGER_S = 0.1
#: pysyncobj's follower and leader states (``_RAFT_STATE``).
_FOLLOWER = 0
_LEADER = 2
#: pysyncobj's command type byte of membership entries.
_MEMBERSHIP_TYPE = bytes([membership.MEMBERSHIP_COMMAND_TYPE])
#: How often a membership change looks at a learner's progress.
LEARNER_POLL_S = 0.05
#: How long the loop waits for the tick thread to run a call (``_on_tick``).
TICK_CALL_TIMEOUT_S = 10.0
#: How long the leader keeps replicating to a controller it removed, so that
#: the removed one learns it is out (it then stops standing for election).
REMOVED_CATCH_UP_S = 3.0

# pysyncobj's state numbers (_RAFT_STATE).
_STATE_NAMES = {0: "follower", 1: "candidate", 2: "leader"}


class ApplyStatus(enum.Enum):
    APPLIED = "applied"
    STALE = "stale"        # computed against another image: recompute
    INVALID = "invalid"    # does not decode: a bug of the proposer


@dataclass(frozen=True)
class ApplyResult:
    status: ApplyStatus
    last_offset: int       # APPLIED: offset of the batch's last record; else the image's
    detail: str = ""


@dataclass(frozen=True)
class RaftSettings:
    """pysyncobj timing, from the node config (see kraft/config.py)."""

    election_timeout_ms: int = 500
    fetch_timeout_ms: int = 2000
    # The shared secret Raft messages are authenticated and encrypted with
    # (pysyncobj's password: Fernet, checked before a message is unpickled).
    secret: bytes | None = None
    # Entries in the journal before a snapshot is written and the journal cut.
    snapshot_min_entries: int = 5000
    snapshot_min_interval_s: int = 300


class _Wakeable:
    """A daemon thread, started at the first ``wake()``, that runs
    ``work()`` once for every wake (wakes that come while it works fold
    into one more run). ``close()`` lets it run for a wake already given,
    then ends it."""

    def __init__(self, name: str, work: Callable[[], None]) -> None:
        self._name, self._work = name, work
        self._condition = threading.Condition()
        self._woken = False
        self.closed = False
        self._thread: threading.Thread | None = None

    def wake(self) -> None:
        with self._condition:
            self._woken = True
            if self._thread is None and not self.closed:
                self._thread = threading.Thread(target=self._run, daemon=True, name=self._name)
                self._thread.start()
            self._condition.notify()

    def _run(self) -> None:
        while True:
            with self._condition:
                while not self._woken and not self.closed:
                    self._condition.wait()
                if not self._woken:
                    return
                self._woken = False
            self._work()

    def close(self, timeout_s: float = 10.0) -> None:
        with self._condition:
            self.closed = True
            self._condition.notify()
        if self._thread is not None:
            self._thread.join(timeout_s)


class _DurableMetaStorer:
    """Stores pysyncobj's ``.meta`` (term, vote, commit index) durably:
    temp file, fsync, rename, fsync of the directory. Replaces FileJournal's
    own storer, which renames an unsynced file.

    A new term or vote is stored before ``storeMeta`` returns: Raft needs
    them on disk before any message that reflects them leaves. The commit
    index alone (FileJournal stores it once a second from the tick thread)
    is stored by a thread of its own: Raft keeps it in memory only, a
    replica that restarts with an older one learns the newer from the
    leader, and its fsyncs, queued behind the rest of the disk's writes,
    took up to 300 ms under a flood of broker writes, long enough for a
    leader's followers to stop hearing it and elect another. A background
    store writes only on top of the term and vote already on disk, so it
    can never put back an older term."""

    def __init__(self, path: str) -> None:
        self._path = path
        self._write_lock = threading.Lock()   # one writer of the file at a time
        self._durable_vote: tuple[Any, Any] | None = None  # (term, vote) on disk
        self._pending_lock = threading.Lock()
        self._pending: dict | None = None     # the live meta to store in the background
        self._storer = _Wakeable("raft-meta-store", self._store_pending)

    def getMeta(self) -> dict:  # noqa: N802 (pysyncobj's name)
        try:
            with open(self._path, "rb") as f:
                meta = _pysyncobj_pickle.loads(f.read())
        except FileNotFoundError:
            return {}
        self._durable_vote = (meta.get("currentTerm"), meta.get("votedForNodeId"))
        return meta

    def storeMeta(self, meta: dict) -> None:  # noqa: N802
        vote = (meta.get("currentTerm"), meta.get("votedForNodeId"))
        if vote != self._durable_vote or self._storer.closed:
            with self._pending_lock:
                self._pending = None  # this store writes the newest state
            self._write(meta, background=False)
            return
        with self._pending_lock:
            self._pending = meta
        self._storer.wake()

    def _write(self, meta: dict, background: bool) -> None:
        with self._write_lock:
            snapshot = dict(meta)  # the tick thread may change it meanwhile
            vote = (snapshot.get("currentTerm"), snapshot.get("votedForNodeId"))
            if background and vote != self._durable_vote:
                return  # a new term or vote is being stored by its own call
            tmp = self._path + ".tmp"
            with open(tmp, "wb") as f:
                f.write(_pysyncobj_pickle.dumps(snapshot))
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self._path)
            _fsync_path(os.path.dirname(self._path) or ".")
            self._durable_vote = vote

    def _store_pending(self) -> None:
        with self._pending_lock:
            meta, self._pending = self._pending, None
        if meta is None:
            return  # stored meanwhile by a term change
        try:
            self._write(meta, background=True)
        except OSError as exc:  # the next second tries again
            logger.error("storing the Raft commit index in %s failed: %s", self._path, exc)

    def close(self) -> None:
        """Store what is pending and end the thread."""
        self._storer.close()

    def getPath(self) -> str:  # noqa: N802
        return self._path


def _open_file_journal(path: str, storer: _DurableMetaStorer) -> Any:
    journal = FileJournal(path)
    journal._FileJournal__metaStorer = storer
    return journal


#: Zeros written per call when the journal's new tail is filled.
JOURNAL_FILL_CHUNK = 1 << 20


class _DurableJournal:
    """pysyncobj's FileJournal made durable and crash-safe:

    - fdatasync after every change of the log (Raft acknowledges an entry
      only once it is on disk), through a second descriptor of the same
      file, onto blocks written beforehand (``_fill_tail``);
    - term and vote stored with fsync before pysyncobj goes on, the commit
      index in the background (``_DurableMetaStorer``);
    - dropping the head of the log after a snapshot (``deleteEntriesTo``)
      rewrites the journal into a new file and renames it into place, where
      FileJournal would clear the file and re-add the entries one by one, so
      that a crash in between loses the tail; the directory is synced first,
      so the snapshot's rename is durable before its entries leave the log;
    - on the leader (``lead(True)``), an append's sync runs on a thread of
      its own while pysyncobj sends the entry to the followers, as the Raft
      thesis allows (section 10.2.1): the leader counts itself towards a
      majority only for entries on its disk, so its commit index is held
      at the last synced entry, and raised only to an entry of its own
      term (Raft's rule for counting replicas): ``setRaftCommitIndex``,
      which pysyncobj calls right after raising it, sets it back through
      ``hold_commit_index``. A leader whose disk is slow then still sends
      heartbeats, instead of looking dead to its followers until its sync
      returns; and its sync and the followers' overlap.

    Every other call goes straight to the wrapped journal. pysyncobj calls
    it only from its tick thread."""

    def __init__(self, path: str) -> None:
        self._path = path
        self._meta_storer = _DurableMetaStorer(path + ".meta")
        #: Set by the owner: what to do when a sync fails (see ``_sync``).
        self.on_fatal: Callable[[str], None] = _halt
        self._open()
        self._leading = False               # syncs in the background (the class doc)
        self._truncations = 0               # a sync counts only if none came between
        self._committed = self._inner.getRaftCommitIndex()  # as last set
        self._sync_lock = threading.Lock()  # the descriptor, between syncs and rewrites
        self._syncer = _Wakeable("raft-journal-sync", self._sync_appended)
        self._closed = False                # destroyed: the descriptor is gone
        #: Set by the owner: put pysyncobj's commit index back to a lower one,
        #: and wake the tick thread once an entry is synced.
        self.hold_commit_index: Callable[[int], None] | None = None
        self.on_synced: Callable[[], None] | None = None

    def _open(self) -> None:
        """Open the journal file, write its tail ahead and sync it whole:
        what a killed leader appended may be in the page cache only, and
        read back it would be acknowledged as a follower's without a sync."""
        self._inner = _open_file_journal(self._path, self._meta_storer)
        self._fd = os.open(self._path, os.O_RDWR)
        self._filled_to = 0
        self._fill_tail()
        self._sync()
        self._appended = self._inner[-1][1] if len(self._inner) else 0
        self._synced = self._appended       # every entry up to it is on disk

    def add(self, command: bytes, idx: int, term: int) -> None:
        self._inner.add(command, idx, term)
        self._fill_tail()
        self._appended = idx
        if not self._leading:
            self._sync()
            self._synced = idx
            return
        self._syncer.wake()

    def lead(self, leading: bool) -> None:
        """Sync appends in the background (a leader) or before ``add``
        returns (a follower: it acknowledges what it holds). Leaving the
        lead syncs everything first."""
        was_leading, self._leading = self._leading, leading
        if leading:
            self._synced = min(self._synced, self._appended)
        elif was_leading:
            with self._sync_lock:
                appended = self._appended
                self._sync()
                self._synced = max(self._synced, appended)

    @property
    def synced_index(self) -> int:
        return self._synced

    def setRaftCommitIndex(self, index: int) -> None:  # noqa: N802 (pysyncobj's name)
        if self._leading and index > self._synced:
            held = max(self._committed, min(index, self._synced_own_term()))
            if held != index:
                index = held
                if self.hold_commit_index is not None:
                    self.hold_commit_index(index)
        self._committed = index
        self._inner.setRaftCommitIndex(index)

    def _synced_own_term(self) -> int:
        """The last synced entry, if it is of the leader's term (that of
        its last entry: the no-op it appends when elected), else 0."""
        log = self._inner
        if not len(log):
            return 0
        position = self._synced - log[0][1]
        if position < 0 or position >= len(log) or log[position][2] != log[-1][2]:
            return 0
        return self._synced

    def _sync_appended(self) -> None:
        """The leader's background sync (``raft-journal-sync``)."""
        with self._sync_lock:
            if self._closed or self._synced >= self._appended:
                return
            appended = self._appended  # written to the mapping before it was set
            truncations = self._truncations
            self._sync()
            if truncations == self._truncations:
                self._synced = max(self._synced, appended)
        if self.on_synced is not None:
            try:
                self.on_synced()
            except OSError as exc:  # the tick thread's next poll sees it anyway
                logger.warning("could not wake the Raft thread: %s", exc)

    def _sync(self) -> None:
        """fdatasync the journal, or stop: after a failed sync the kernel
        may have dropped the pages it could not write and report the next
        sync a success (Linux does), so retrying could count lost entries
        as stored. Kafka halts a controller whose metadata log fails too."""
        try:
            os.fdatasync(self._fd)
        except OSError as exc:
            self.on_fatal(f"syncing the Raft journal {self._path} failed: {exc}")
            raise

    def _fill_tail(self) -> None:
        """Write zeros over the file's tail beyond the log's end, once. When
        pysyncobj grows the journal (doubling it with ``mmap.resize``) the
        new part is a hole, so each append would allocate blocks and its
        sync would wait for a commit of the file system's journal, which on
        ext4 (data=ordered) waits in turn for other files' data being
        written out: 100-300 ms while brokers flush. Appends to blocks
        already written need only their own pages synced."""
        size = os.fstat(self._fd).st_size
        if size <= self._filled_to:
            return
        position = max(self._filled_to, self._inner._FileJournal__currentOffset)
        zeros = bytes(min(JOURNAL_FILL_CHUNK, size - position))
        while position < size:
            position += os.pwrite(self._fd, zeros[:size - position], position)
        self._filled_to = size

    def clear(self) -> None:
        with self._sync_lock:
            self._inner.clear()
            self._sync()
            self._cut_back()

    def deleteEntriesFrom(self, entry_from: int) -> None:  # noqa: N802 (pysyncobj's name)
        with self._sync_lock:
            self._inner.deleteEntriesFrom(entry_from)
            self._sync()
            self._cut_back()

    def _cut_back(self) -> None:
        """After a truncation (``_sync_lock`` held): an index above the
        log's end is not synced (the next entry there will be another one),
        and a background sync that read the log's end before it counts for
        nothing."""
        last = self._inner[-1][1] if len(self._inner) else 0
        self._appended = min(self._appended, last)
        self._synced = min(self._synced, last)
        self._truncations += 1

    def deleteEntriesTo(self, entry_to: int) -> None:  # noqa: N802
        _fsync_path(os.path.dirname(self._path) or ".")
        self.rewrite([self._inner[i] for i in range(entry_to, len(self._inner))])

    def rewrite(self, entries: list) -> None:
        """Replace the log with ``entries``, atomically."""
        # The commit index the journal object being replaced holds, if not
        # stored yet: to the store now (the new object reads it from disk).
        self._inner.onOneSecondTimer()
        tmp = self._path + ".rewrite"
        for leftover in (tmp, tmp + ".meta"):
            if os.path.exists(leftover):
                os.unlink(leftover)
        staging = FileJournal(tmp)
        for entry in entries:
            staging.add(*entry)
        staging._destroy()  # flushes the mapping
        _fsync_path(tmp)
        with self._sync_lock:
            os.replace(tmp, self._path)
            _fsync_path(os.path.dirname(self._path) or ".")
            self._inner._destroy()
            os.close(self._fd)
            self._open()

    def _destroy(self) -> None:
        self._syncer.close()
        self._inner.onOneSecondTimer()  # the last commit index, if pending
        self._meta_storer.close()
        with self._sync_lock:
            self._closed = True
            self._inner._destroy()
            os.close(self._fd)

    def __getitem__(self, index: Any) -> Any:
        return self._inner[index]

    def __len__(self) -> int:
        return len(self._inner)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def _halt(reason: str) -> None:
    """A controller whose Raft journal cannot be synced stops at once."""
    logger.critical("%s: stopping this controller", reason)
    logging.shutdown()
    os._exit(70)


def _fsync_path(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


#: How long a starting controller waits for its Raft port to be free (a
#: process it replaces may still be closing it) before it gives up.
RAFT_BIND_WAIT_S = 10.0


def _wait_bindable(address: str, wait_s: float) -> None:
    """Return once ``address`` ("host:port") can be listened on, or raise
    OSError saying which address is taken. pysyncobj, left to itself, retries
    the bind forever without a word."""
    host, _, port = address.rpartition(":")
    deadline = time.monotonic() + wait_s
    warned = False
    while True:
        with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind((host.strip("[]"), int(port)))
                return
            except OSError as exc:
                error = exc
        if time.monotonic() >= deadline:
            raise OSError(error.errno, f"cannot listen on the Raft address {address}: "
                          f"{error.strerror}; is another process using the port? "
                          "Stop it, or change controller.quorum.voters or "
                          "controller.quorum.raft.port.offset") from None
        if not warned:
            logger.warning("the Raft address %s is taken (%s); waiting up to %.0f s",
                           address, error.strerror, wait_s)
            warned = True
        time.sleep(0.2)


if not callable(getattr(SyncObj, "_SyncObj__onNodeDisconnected", None)):
    raise ImportError("this pysyncobj has no SyncObj.__onNodeDisconnected: kraft.quorum's "
                      "early election hooks it (see MetadataQuorum)")


class MetadataQuorum(PreVoteSyncObj):
    """One controller's Raft replica of the metadata log.

    ``raft_addresses`` maps every voter of the static config to its Raft
    ``host:port`` and ``urls`` to its CONTROLLER URL (for ``voters()``);
    the log's voter set, once it has one, replaces them. ``self_address`` is
    this node's Raft address when it is not among them (a joining
    controller). Call ``start()`` to run the tick thread and ``stop()`` to
    end it.
    """

    def __init__(self, node_id: int, raft_addresses: dict[int, str], metadata_dir: str,
                 settings: RaftSettings = RaftSettings(), *,
                 urls: dict[int, str] | None = None,
                 self_address: str | None = None) -> None:
        # Attributes set before SyncObj.__init__ are pysyncobj-internal as far
        # as it is concerned; the custom serializer means none is pickled.
        self.node_id = node_id
        self.metadata_dir = metadata_dir
        self.self_address = raft_addresses.get(node_id) or self_address
        assert self.self_address, f"controller {node_id} needs its own Raft address"
        urls = urls or {}
        #: The voter set of the static config (the log's replaces it).
        self._static_voters = {nid: Voter(nid, address, urls.get(nid))
                               for nid, address in raft_addresses.items()}
        # The voter set as of the end of this node's log, committed or not
        # (Raft's rule); replaced, never changed in place, on the tick thread.
        self._voters: dict[int, Voter] = dict(self._static_voters)
        self._ids_by_address = {v.raft_address: nid for nid, v in self._voters.items()}
        self._is_voter = node_id in self._voters
        # The voter set recorded in the snapshot last loaded (None: none, or
        # one from before membership was recorded: the static set).
        self._snapshot_voters: dict[int, Voter] | None = None
        # Joining controllers the leader replicates to before they vote.
        self._learners: dict[str, Any] = {}
        # learner address -> the term above the leader's its messages carry
        self._stale_learners: dict[str, int] = {}
        # Why the leader's last membership change was refused (tick thread).
        self._refusal: MembershipRefused | None = None
        # Raft index of a membership entry not yet committed (tick thread).
        self._pending_change_seen: int | None = None
        # Work for the tick thread (``_on_tick``), run between ticks.
        self._tick_calls: collections.deque[Callable[[], None]] = collections.deque()
        self.image_lock = threading.Lock()
        self._image = MetadataImage()
        # The token of the last batch applied (None: none, or one without).
        self._last_token: int | None = None
        # (offset, encoded record) of recently applied records, oldest first.
        self._history: collections.deque[tuple[int, bytes]] = collections.deque(
            maxlen=HISTORY_RECORDS_MAX)
        self._listeners: list[Callable[[], None]] = []
        self._stopping = threading.Event()
        # Set when a command is queued: the tick after the one that appends it
        # runs at once, since a lone voter commits on the following tick and
        # nothing else would wake its poll.
        self._kick = threading.Event()
        self._thread: threading.Thread | None = None
        os.makedirs(metadata_dir, exist_ok=True)
        election_s = settings.election_timeout_ms / 1000
        conf = SyncObjConf(
            autoTick=False,
            journalFile=os.path.join(metadata_dir, JOURNAL_FILE),
            fullDumpFile=os.path.join(metadata_dir, SNAPSHOT_FILE),
            serializer=self._write_snapshot,
            deserializer=self._read_snapshot,
            # One append per command (p50 ~2 ms here, ~100 ms when batched).
            appendEntriesUseBatch=False,
            # A command with no leader fails at once; the caller retries.
            commandsWaitLeader=False,
            raftMinTimeout=election_s,
            raftMaxTimeout=2 * election_s,
            appendEntriesPeriod=min(0.1, election_s / 5),
            leaderFallbackTimeout=settings.fetch_timeout_ms / 1000,
            connectionTimeout=max(1.0, 2 * election_s),
            connectionRetryTime=min(1.0, election_s),
            logCompactionMinEntries=settings.snapshot_min_entries,
            logCompactionMinTime=settings.snapshot_min_interval_s,
            onStateChanged=self._on_state_changed,
            # Membership entries act when appended and are undone when
            # truncated; the gaps pysyncobj leaves are closed below.
            dynamicMembershipChange=True,
            password=settings.secret,
            # pysyncobj's own retries spin on a CPU in its constructor:
            # _wait_bindable has waited already, so few and then an error.
            maxBindRetries=3,
            # Its own address only, as the controller's HTTP listener: by
            # default pysyncobj listens on every interface (0.0.0.0).
            bindAddress=self.self_address,
        )
        self_address = self.self_address
        others = [v.raft_address for nid, v in sorted(self._voters.items())
                  if v.raft_address != self_address]
        _wait_bindable(self_address, RAFT_BIND_WAIT_S)
        try:
            super().__init__(self_address, others, conf)
        except SyncObjException as exc:
            raise OSError(f"controller {node_id}: cannot listen on its Raft address "
                          f"{self_address} ({exc})") from None
        # autoTick is off, so nothing has touched the journal since __init__
        # opened it: swap in the durable one and line it up with the snapshot.
        self._SyncObj__raftLog._destroy()
        journal = _DurableJournal(os.path.join(metadata_dir, JOURNAL_FILE))
        journal.hold_commit_index = self._hold_commit_index
        # A synced append may let the leader commit: wake its poll.
        notifier = getattr(self, "_SyncObj__pipeNotifier", None)
        journal.on_synced = notifier.notify if notifier is not None else self._kick.set
        self._SyncObj__raftLog = journal
        self._trim_journal_to_snapshot()
        self._last_log_index = self._SyncObj__raftLog[-1][1]
        # The longest this replica's Raft thread went without reading its
        # sockets (a leader that long sends no heartbeat; followers that
        # hear none for an election timeout ask for a pre-vote).
        self.busy_max_s = 0.0
        self._time_polls()
        # The log's voter set, before the first tick can use the static one.
        self._snapshot_voters, snapshot_index = self._snapshot_on_disk()
        self._adopt_log_voters(after_index=snapshot_index)

    def _may_stand(self) -> bool:
        return self._is_voter and super()._may_stand()

    def _hold_commit_index(self, index: int) -> None:
        """The journal's hook: the leader's commit index back to ``index``
        (its own log is synced only that far; see ``_DurableJournal``)."""
        self._SyncObj__raftCommitIndex = index

    def _time_polls(self) -> None:
        """Measure the time between the end of one poll of the sockets and
        the start of the next (``busy_max_s``): the work of one tick,
        journal fsyncs included, when nothing is read."""
        poll = self._poller.poll
        last_end: float | None = None

        def timed_poll(timeout: float) -> Any:
            nonlocal last_end
            if last_end is not None:
                busy = time.monotonic() - last_end
                if busy > self.busy_max_s:
                    self.busy_max_s = busy
            try:
                return poll(timeout)
            finally:
                last_end = time.monotonic()

        self._poller.poll = timed_poll

    # -- an early election when the leader's process is gone -------------
    def _SyncObj__onNodeDisconnected(self, node: Any) -> None:  # noqa: N802 (pysyncobj's)
        """pysyncobj's hook for a voter's connection ending (tick thread),
        extended: when it is this follower's connection to the leader, the
        leader's process is gone (its kernel closed the socket: killed or
        stopping) or it closed the connection itself, so this follower stands
        for election at once instead of after the election timeout, staggered
        by rank among the remaining voters (``EARLY_ELECTION_STAGGER_S``
        apart) so that one candidate usually asks before the next would. A
        leader that is paused or cut off closes nothing: its followers wait
        out the timeout as before (pysyncobj also drops a connection silent
        for ``connectionTimeout``, longer than the election timeout)."""
        leader = self._SyncObj__raftLeader
        super()._SyncObj__onNodeDisconnected(node)
        if (self._stopping.is_set() or leader is None or node != leader
                or self._SyncObj__raftState != _FOLLOWER):
            return
        if not self._is_voter:
            return  # an observer never stands
        rest = sorted(v.raft_address for v in self._voters.values()
                      if v.raft_address != str(leader))
        if self.self_address not in rest:
            return
        rank = rest.index(self.self_address)
        at = raft_clock() + rank * EARLY_ELECTION_STAGGER_S + random.uniform(0, 0.01)
        if at < self._SyncObj__raftElectionDeadline:
            self._SyncObj__raftElectionDeadline = at
            logger.info("controller %d: the Raft leader %s closed its connection; standing "
                        "for election in %d ms", self.node_id, leader,
                        max(0, int((at - raft_clock()) * 1000)))

    # -- membership: the voter set from the log (tick thread) --------------
    def _snapshot_on_disk(self) -> tuple[dict[int, Voter] | None, int]:
        """The voter set the snapshot file records (None: no snapshot, or
        one written before membership was recorded) and its last index."""
        path = os.path.join(self.metadata_dir, SNAPSHOT_FILE)
        if not os.path.exists(path):
            return None, 0
        try:
            with open(path, "rb") as f:
                raw = msgpack.unpackb(f.read(), raw=False)
            last_index = int(raw["last_entry"][1])
            voters = membership.decode_voters(raw["voters"]) if "voters" in raw else None
        except Exception as exc:  # noqa: BLE001 - pysyncobj reports it again at load
            logger.error("controller %d: unreadable snapshot %s: %s", self.node_id, path, exc)
            return None, 0
        return voters, last_index

    def _adopt_log_voters(self, after_index: int) -> None:
        """Take the voter set from the log: the snapshot's (or the static
        one), then every membership entry after ``after_index``."""
        log = self._SyncObj__raftLog
        base = self._snapshot_voters if self._snapshot_voters is not None \
            else self._static_voters
        later = [log[i][0] for i in range(len(log)) if log[i][1] > after_index]
        self._set_voters(membership.replay(base, later), sync=True)

    def _SyncObj__updateClusterConfiguration(self, new_nodes: Any) -> None:  # noqa: N802
        """pysyncobj, after loading a snapshot (at start-up, or installed
        from the leader): its journal now begins with the snapshot's two
        entries, so the set is the snapshot's and then the journal's."""
        log = self._SyncObj__raftLog
        self._adopt_log_voters(after_index=log[1][1] if len(log) > 1 else 0)

    def _SyncObj__doApplyCommand(self, command: bytes) -> Any:  # noqa: N802
        """A committed membership entry changes nothing when applied: it
        acted when it was appended (or was read from the log at start-up).
        pysyncobj would act again, with an older set than the log's."""
        if bytes(command[:1]) == _MEMBERSHIP_TYPE:
            return None
        return SyncObj._SyncObj__doApplyCommand(self, command)

    def _SyncObj__doChangeCluster(self, request: Any, reverse: bool = False) -> bool:  # noqa: N802
        """pysyncobj appended (or, ``reverse``, truncated) a membership
        entry: move its Raft connections and this node's voter set."""
        change = membership.parse_request(request)
        if change is None:
            logger.error("controller %d: ignoring a membership entry kraftlog did not write: "
                         "%r", self.node_id, request)
            return False
        address = change.voter.raft_address
        if address == self.self_address:
            done = True  # pysyncobj keeps its own node; being a voter is ours
        elif change.kind == membership.REMOVE and not reverse and self._isLeader():
            # Pushed entries are the only way a removed controller learns it
            # is out: the leader keeps replicating to it as a learner, on
            # the same connection (closing it would make it stand for
            # election before it knows), until remove_voter ends that.
            done = self._voter_to_learner(address)
        else:
            if address in self._learners:
                self._stop_learner(address)  # it becomes a voter: one connection
            done = SyncObj._SyncObj__doChangeCluster(self, request, reverse)
        self._set_voters(membership.apply_change(self._voters, change, reverse), sync=True)
        logger.info("controller %d: voters now %s (%s%s controller %d)", self.node_id,
                    sorted(self._voters), "undone: " if reverse else "",
                    "add" if change.kind == membership.ADD else "remove", change.voter.node_id)
        return done

    def _SyncObj__changeCluster(self, request: Any) -> bool:  # noqa: N802
        """The leader, right before it appends a membership entry: refuse
        (REQUEST_DENIED, reason in ``_refusal``) what must not be."""
        self._refusal = None
        change = membership.parse_request(request)
        try:
            if change is None:
                raise MembershipRefused(membership.INVALID_REQUEST,
                                        "not a membership change kraftlog writes")
            self._check_change(change)
        except (MembershipRefused, NotControllerError) as exc:
            self._refusal = exc if isinstance(exc, MembershipRefused) else \
                MembershipRefused("NOT_CONTROLLER", str(exc))
            logger.warning("controller %d: membership change refused: %s", self.node_id, exc)
            return False
        return self._SyncObj__doChangeCluster(request)

    def addNodeToCluster(self, node: Any, callback: Any = None) -> None:  # noqa: N802
        raise RuntimeError("use MetadataQuorum.add_voter: membership entries carry the id")

    def removeNodeFromCluster(self, node: Any, callback: Any = None) -> None:  # noqa: N802
        raise RuntimeError("use MetadataQuorum.remove_voter")

    def _addNodeToCluster(self, args: Any, callback: Any) -> None:
        """pysyncobj's utility command from any peer with the secret: refused;
        membership changes go through the active controller's API."""
        callback(None, FAIL_REASON.REQUEST_DENIED)

    def _removeNodeFromCluster(self, args: Any, callback: Any) -> None:
        callback(None, FAIL_REASON.REQUEST_DENIED)

    def _set_voters(self, voters: dict[int, Voter], sync: bool) -> None:
        self._voters = voters
        self._ids_by_address = {v.raft_address: nid for nid, v in voters.items()}
        own = voters.get(self.node_id)
        is_voter = own is not None and own.raft_address == self.self_address
        if is_voter != self._is_voter:
            logger.info("controller %d: %s", self.node_id,
                        "now a voter" if is_voter else "not a voter: an observer from now on")
            if is_voter:  # stand only after a full election timeout, as on start-up
                conf = self._SyncObj__conf
                self._SyncObj__raftElectionDeadline = raft_clock() + random.uniform(
                    conf.raftMinTimeout, conf.raftMaxTimeout)
        self._is_voter = is_voter
        if sync:
            self._sync_other_nodes()

    def _sync_other_nodes(self) -> None:
        """Make pysyncobj's partners the voters but this node."""
        wanted = {v.raft_address for v in self._voters.values()} - {self.self_address}
        if wanted == {node.address for node in self._SyncObj__otherNodes}:
            return
        for address in wanted & set(self._learners):
            self._stop_learner(address)
        SyncObj._SyncObj__updateClusterConfiguration(self, sorted(wanted))
        if self._isLeader():
            for node in self._SyncObj__otherNodes:
                self._SyncObj__lastResponseTime.setdefault(node, raft_clock())

    def _uncommitted_change(self) -> tuple[int, Change] | None:
        """The newest membership entry above the commit index, if any."""
        log = self._SyncObj__raftLog
        commit = self.raftCommitIndex
        for i in range(len(log) - 1, -1, -1):
            command, index = log[i][0], log[i][1]
            if index <= commit:
                return None
            change = membership.parse_entry(command)
            if change is not None:
                return index, change
        return None

    def _check_change(self, change: Change) -> None:
        """Raise unless the leader may append ``change`` now."""
        if not self._isLeader():
            raise NotControllerError(f"controller {self.node_id} is not the Raft leader",
                                     leader_id=self.leader_id())
        noop = self._SyncObj__noopIDx
        if noop is None or self.raftLastApplied < noop:
            raise MembershipRefused(membership.CHANGE_IN_PROGRESS,
                                    f"controller {self.node_id} was just elected and has not "
                                    "committed an entry of its term yet; retry in a moment")
        pending = self._uncommitted_change()
        if pending is not None:
            index, other = pending
            raise MembershipRefused(
                membership.CHANGE_IN_PROGRESS,
                f"another voter change ({'adding' if other.kind == membership.ADD else 'removing'}"
                f" controller {other.voter.node_id}, Raft index {index}) is not committed yet: "
                "the quorum changes one voter at a time. Wait until it is (kraftlog quorum "
                "status) and retry")
        if change.kind == membership.ADD:
            membership.check_add(self._voters, change.voter)
        else:
            voter = membership.check_remove(self._voters, change.voter.node_id)
            if voter.raft_address == self.self_address:
                raise MembershipRefused(membership.INVALID_REQUEST,
                                        "the leader cannot remove itself: it hands leadership "
                                        "over first (remove_voter does)")

    # -- membership: learners (tick thread) --------------------------------
    def _start_learner(self, address: str) -> None:
        """Replicate to ``address`` as pysyncobj replicates to a read-only
        node: it receives the log (or a snapshot) and counts for nothing."""
        if address in self._learners or address in self._ids_by_address:
            return
        node = TCPNode(address)
        self._SyncObj__transport.addNode(node)
        self._SyncObj__readonlyNodes.add(node)
        self._SyncObj__raftNextIndex[node] = self._SyncObj__raftLog[-1][1] + 1
        self._SyncObj__raftMatchIndex[node] = 0
        self._learners[address] = node
        self._stale_learners.pop(address, None)
        logger.info("controller %d: replicating to the learner %s", self.node_id, address)

    def _voter_to_learner(self, address: str) -> bool:
        node = next((n for n in self._SyncObj__otherNodes if n.address == address), None)
        if node is None:
            return False
        self._SyncObj__otherNodes.discard(node)
        self._SyncObj__readonlyNodes.add(node)  # its next and match indexes kept
        self._learners[address] = node
        return True

    def _SyncObj__onMessageReceived(self, node: Any, message: Any) -> None:  # noqa: N802
        """A learner (joining, or just removed) only acknowledges appends:
        its votes, vote requests (a removed controller that has not heard
        yet may stand) and commands are not a voter's, and are dropped.
        A learner whose messages carry a term above this leader's holds a
        stale log (removed while it was down): the add waiting for it fails.

        From any peer, a membership entry forwarded as ``apply_command`` is
        refused: changes go through the active controller's API (its ACLs,
        its learner catch-up), which never forwards one."""
        if not isinstance(message, dict):
            PreVoteSyncObj._SyncObj__onMessageReceived(self, node, message)
            return
        kind = message.get("type")
        if node in self._learners.values() and kind != "next_node_idx":
            term = message.get("term")
            address = getattr(node, "address", str(node))
            if isinstance(term, int) and term > self.raftCurrentTerm \
                    and address not in self._stale_learners:
                self._stale_learners[address] = term
                logger.warning("controller %d: the learner %s is at term %d, above this "
                               "leader's %d: it holds stale state", self.node_id, address,
                               term, self.raftCurrentTerm)
            return
        if kind == "apply_command" and bytes(message.get("command", b"")[:1]) == _MEMBERSHIP_TYPE:
            logger.warning("controller %d: dropped a membership entry sent over the Raft port "
                           "by %s: voter changes go through the active controller's API",
                           self.node_id, getattr(node, "address", node))
            if "request_id" in message:
                self._SyncObj__transport.send(node, {
                    "type": "apply_command_response", "request_id": message["request_id"],
                    "error": FAIL_REASON.REQUEST_DENIED})
            return
        PreVoteSyncObj._SyncObj__onMessageReceived(self, node, message)

    def _stop_learner(self, address: str) -> None:
        self._stale_learners.pop(address, None)
        node = self._learners.pop(address, None)
        if node is None:
            return
        self._SyncObj__readonlyNodes.discard(node)
        self._SyncObj__connectedNodes.discard(node)
        self._SyncObj__raftNextIndex.pop(node, None)
        self._SyncObj__raftMatchIndex.pop(node, None)
        self._SyncObj__transport.dropNode(node)

    def _stop_all_learners(self) -> None:
        if not self._isLeader():
            for address in list(self._learners):
                self._stop_learner(address)

    def _learner_progress(self, address: str, node_id: int = -1) -> tuple[int | None, int]:
        """(the learner's match index, None if it is not replicated to;
        the commit index). MembershipRefused if it holds stale state."""
        term = self._stale_learners.get(address)
        if term is not None:
            raise MembershipRefused(
                membership.INVALID_REQUEST,
                f"the controller at Raft address {address} is at term {term}, above the "
                f"leader's {self.raftCurrentTerm}, so it ignores the leader. "
                + membership.stale_state_message(node_id))
        node = self._learners.get(address)
        match = None if node is None else self._SyncObj__raftMatchIndex.get(node)
        return match, self.raftCommitIndex

    # -- membership: the asyncio side --------------------------------------
    async def _on_tick(self, call: Callable[[], Any]) -> Any:
        """Run ``call`` on the tick thread between two ticks; its result
        (or exception) on the loop."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future = loop.create_future()

        def run() -> None:
            try:
                outcome: tuple = (call(), None)
            except Exception as exc:  # noqa: BLE001 - handed to the caller
                outcome = (None, exc)
            try:
                loop.call_soon_threadsafe(_settle_call, future, outcome)
            except RuntimeError:  # the loop is closed: nobody waits
                pass

        self._tick_calls.append(run)
        self._kick.set()
        try:
            return await asyncio.wait_for(future, TICK_CALL_TIMEOUT_S)
        except asyncio.TimeoutError:
            raise RequestTimedOutError(f"controller {self.node_id}: its Raft thread did not "
                                       f"answer within {TICK_CALL_TIMEOUT_S:.0f} s") from None

    def voters(self) -> dict[int, Voter]:
        """The voter set as of the end of this node's log (any thread)."""
        return dict(self._voters)

    @property
    def is_voter(self) -> bool:
        return self._is_voter

    async def add_voter(self, voter: Voter, catch_up_timeout_s: float,
                        commit_timeout_s: float) -> dict[int, Voter]:
        """Make ``voter`` (a running controller started to join) a voter:
        replicate the log to it until it holds every committed entry, then
        append and commit the change. The voter set after it.

        Raises MembershipRefused (what must not be done), NotControllerError,
        RequestTimedOutError (the learner did not catch up in time, or the
        outcome of the change is unknown)."""
        change = Change(membership.ADD, voter)
        await self._on_tick(lambda: self._check_change(change))
        address = voter.raft_address
        await self._on_tick(lambda: self._start_learner(address))
        try:
            deadline = time.monotonic() + catch_up_timeout_s
            while True:
                match, commit = await self._on_tick(
                    lambda: self._learner_progress(address, voter.node_id))
                if match is None:
                    raise NotControllerError(f"controller {self.node_id} stopped leading while "
                                             f"controller {voter.node_id} caught up",
                                             leader_id=self.leader_id())
                if match >= commit:
                    break
                if time.monotonic() >= deadline:
                    raise RequestTimedOutError(
                        f"controller {voter.node_id} (Raft address {address}) did not catch "
                        f"up within {catch_up_timeout_s:.0f} s (it holds Raft index {match} of "
                        f"{commit}): is it running, started with controller.quorum.join = "
                        "true, the same controller.quorum.secret.file, and the current voters "
                        "in controller.quorum.voters? Nothing was changed")
                await asyncio.sleep(LEARNER_POLL_S)
            await self._propose_change(change, commit_timeout_s)
        finally:
            await self._on_tick(lambda: self._stop_learner(address))
        return self.voters()

    async def remove_voter(self, node_id: int, commit_timeout_s: float) -> dict[int, Voter]:
        """Remove voter ``node_id``; the voter set after it. When it is this
        node (the leader), leadership goes to a caught-up voter first and
        NotControllerError names it: the caller asks it again there."""
        voter = membership.check_remove(self._voters, node_id)
        if voter.raft_address != self.self_address:
            address = voter.raft_address
            change = Change(membership.REMOVE, voter)
            await self._on_tick(lambda: self._check_change(change))
            try:
                await self._propose_change(change, commit_timeout_s)
                await self._let_learner_catch_up(address, REMOVED_CATCH_UP_S)
            finally:
                await self._on_tick(lambda: self._stop_learner(address))
            return self.voters()
        await self._on_tick(lambda: self._check_change_of_leader())
        successor = await self._hand_over_leadership(commit_timeout_s)
        raise NotControllerError(
            f"controller {node_id} was the leader: it handed leadership to controller "
            f"{successor}, which removes it when asked again", leader_id=successor)

    async def _let_learner_catch_up(self, address: str, timeout_s: float) -> bool:
        """Wait until the learner at ``address`` holds every committed entry
        (True), or ``timeout_s`` passed or it is not replicated to (False)."""
        deadline = time.monotonic() + timeout_s
        while True:
            match, commit = await self._on_tick(lambda: self._learner_progress(address))
            if match is not None and match >= commit:
                return True
            if match is None or time.monotonic() >= deadline:
                return False
            await asyncio.sleep(LEARNER_POLL_S)

    def _check_change_of_leader(self) -> None:
        """As ``_check_change``, for removing the leader itself (which its
        successor will do)."""
        if not self._isLeader():
            raise NotControllerError(f"controller {self.node_id} is not the Raft leader",
                                     leader_id=self.leader_id())
        pending = self._uncommitted_change()
        if pending is not None:
            raise MembershipRefused(membership.CHANGE_IN_PROGRESS,
                                    f"another voter change (Raft index {pending[0]}) is not "
                                    "committed yet: wait until it is and retry")
        membership.check_remove(self._voters, self.node_id)

    async def _hand_over_leadership(self, timeout_s: float) -> int:
        """Ask the most caught-up connected voter to stand (Raft's
        TimeoutNow) until another leader is known; its id."""
        deadline = time.monotonic() + timeout_s
        asked_at = 0.0
        while True:
            leader = self.leader_id()
            if not self.is_leader and leader is not None and leader != self.node_id:
                return leader
            if time.monotonic() >= deadline:
                raise RequestTimedOutError(
                    f"controller {self.node_id} could not hand leadership over within "
                    f"{timeout_s:.0f} s (no other voter caught up and connected?); nothing "
                    "was removed. Check kraftlog quorum status and retry")
            if self.is_leader and time.monotonic() - asked_at > 0.5:
                asked_at = time.monotonic()
                await self._on_tick(lambda: self.transferLeadership(None, None))
            await asyncio.sleep(LEARNER_POLL_S)

    async def _propose_change(self, change: Change, timeout_s: float) -> None:
        """Append ``change`` on the leader and wait until it commits."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future = loop.create_future()

        def settle(result: Any, error: int) -> None:  # tick thread
            refusal, self._refusal = self._refusal, None
            _settle_threadsafe(loop, future, refusal, error)

        def queue() -> None:  # tick thread
            # Only a leader queues it: a follower's pysyncobj would forward
            # it to the leader, around its API (which refuses it anyway).
            if not self._isLeader():
                raise NotControllerError(f"controller {self.node_id} is not the Raft leader",
                                         leader_id=self.leader_id())
            self._applyCommand(change.command(), settle, membership.MEMBERSHIP_COMMAND_TYPE)

        await self._on_tick(queue)
        try:
            refusal, error = await asyncio.wait_for(future, timeout_s)
        except asyncio.TimeoutError:
            raise RequestTimedOutError(
                f"the voter change did not commit within {timeout_s:.1f} s; it may still: "
                "check kraftlog quorum status before retrying") from None
        if error == FAIL_REASON.SUCCESS:
            return
        if error == FAIL_REASON.REQUEST_DENIED:
            raise refusal or MembershipRefused(
                membership.CHANGE_IN_PROGRESS,
                "the leader refused the voter change (the voter set changed meanwhile?): "
                "check kraftlog quorum status and retry")
        if error in (FAIL_REASON.NOT_LEADER, FAIL_REASON.MISSING_LEADER):
            raise NotControllerError(f"controller {self.node_id} is not the Raft leader",
                                     leader_id=self.leader_id())
        raise RequestTimedOutError(
            f"leadership moved while the voter change was in flight "
            f"({_FAIL_NAMES.get(error, error)}); it may still be applied: check kraftlog "
            "quorum status before retrying")

    def _trim_journal_to_snapshot(self) -> None:
        """After a crash between writing a snapshot and cutting the journal,
        the journal still starts before the snapshot. pysyncobj would then
        clear it down to the snapshot's two entries and lose every entry
        after them, committed ones included. Cut it to start at the
        snapshot's entries instead, so pysyncobj keeps the rest."""
        path = os.path.join(self.metadata_dir, SNAPSHOT_FILE)
        if not os.path.exists(path):
            return
        try:
            with open(path, "rb") as f:
                raw = msgpack.unpackb(f.read(), raw=False)
            prev, last = tuple(raw["prev_entry"]), tuple(raw["last_entry"])
        except Exception as exc:
            logger.error("controller %d: unreadable snapshot %s: %s", self.node_id, path, exc)
            return
        journal = self._SyncObj__raftLog
        first_idx = journal[0][1]
        start = prev[1] - first_idx
        if start <= 0 or start + 1 >= len(journal):
            return
        held_prev, held_last = journal[start], journal[start + 1]
        if (bytes(held_prev[0]), held_prev[1], held_prev[2]) != prev or \
                (bytes(held_last[0]), held_last[1], held_last[2]) != last:
            return
        logger.warning("controller %d: journal starts at index %d, before the snapshot at %d "
                       "(a crash during log compaction); cutting it to the snapshot",
                       self.node_id, first_idx, last[1])
        journal.rewrite([journal[i] for i in range(start, len(journal))])

    # -- lifecycle (any thread) -------------------------------------------
    def start(self) -> None:
        assert self._thread is None, "started twice"
        self._thread = threading.Thread(target=self._run, name=f"raft-{self.node_id}",
                                        daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """End the tick thread, then close sockets and the journal."""
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
            if self._thread.is_alive():
                logger.error("raft tick thread did not stop within 10 s")
                return
        self.destroy()

    def _run(self) -> None:
        while not self._stopping.is_set():
            kicked = self._kick.is_set()
            self._kick.clear()
            try:
                while self._tick_calls:
                    self._tick_calls.popleft()()
                if not self._is_voter:
                    # An observer (joining, or removed) never stands for
                    # election: its deadline stays ahead of it.
                    self._SyncObj__raftElectionDeadline = raft_clock() + 3600
                self.doTick(0.0 if kicked else 0.05)
                log = self._SyncObj__raftLog
                self._last_log_index = log[-1][1] if len(log) else 0
                pending = self._uncommitted_change()
                self._pending_change_seen = None if pending is None else pending[0]
            except Exception:
                # A tick that raises would otherwise end this thread silently
                # and leave a controller that answers HTTP but never votes.
                logger.exception("raft tick failed")
                self._stopping.wait(0.05)

    def add_listener(self, listener: Callable[[], None]) -> None:
        """Call ``listener()`` on the tick thread after every applied batch
        and every Raft state change. It must not block."""
        self._listeners.append(listener)

    # -- the replicated method (tick thread) ------------------------------
    @replicated
    def apply_batch(self, expected_offset: int | None, payload: bytes,
                    after: int | None = None, token: int | None = None) -> ApplyResult:
        """Apply a batch of encoded records, all or none, if the image is at
        ``expected_offset`` (None: whatever it is; used for the no-op barrier)
        and, for a batch computed on another batch still in flight (the
        controller's pipeline), if the last batch applied is that one
        (``after``, its ``token``). Offsets alone could be fooled: had that
        batch been dropped and as many other records applied, the offset
        would match an image the batch was not computed on. Every replica
        reaches the same verdict from the same log (the last token is in
        snapshots too)."""
        try:
            encoded = msgpack.unpackb(payload, raw=False)
            batch = [metadata_records.decode(item) for item in encoded]
        except Exception as exc:  # msgpack and decode raise several types
            logger.critical("refusing an undecodable metadata batch: %s", exc)
            return ApplyResult(ApplyStatus.INVALID, self._image.offset, str(exc))
        with self.image_lock:
            image = self._image
            if expected_offset is not None and expected_offset != image.offset:
                return ApplyResult(ApplyStatus.STALE, image.offset,
                                   f"batch for offset {expected_offset}, image at {image.offset}")
            if after is not None and after != self._last_token:
                return ApplyResult(ApplyStatus.STALE, image.offset,
                                   "the batch it was computed after was not applied")
            # One record applies atomically by itself; several go to a copy
            # that replaces the image only if all of them apply.
            target = image if len(batch) == 1 else image.copy()
            try:
                for record in batch:
                    target.apply(record, target.offset + 1)
            except Exception as exc:
                # The controller validated this batch against this very
                # image, so this is a bug; every replica refuses it alike.
                logger.critical("metadata batch at offset %d refused: %s", image.offset, exc)
                return ApplyResult(ApplyStatus.INVALID, image.offset, str(exc))
            self._image = target
            self._last_token = token
            first = target.offset - len(batch) + 1
            self._history.extend(zip(range(first, target.offset + 1), encoded))
            result = ApplyResult(ApplyStatus.APPLIED, target.offset)
        self._notify()
        return result

    def _notify(self) -> None:
        for listener in self._listeners:
            try:
                listener()
            except Exception:
                logger.exception("quorum listener failed")

    def _on_state_changed(self, old_state: int, new_state: int) -> None:
        logger.info("controller %d: raft %s -> %s", self.node_id,
                    _STATE_NAMES.get(old_state), _STATE_NAMES.get(new_state))
        # pysyncobj calls this before the new leader appends its no-op, and
        # before a deposed one acknowledges anything as a follower.
        self._SyncObj__raftLog.lead(new_state == _LEADER)
        if new_state != _LEADER and self._learners:
            # Only a leader replicates to learners; dropped between ticks,
            # outside pysyncobj's own call.
            self._tick_calls.append(self._stop_all_learners)
        self._notify()

    # -- snapshots (tick thread) ------------------------------------------
    def _write_snapshot(self, path: str, raft_data: Sequence[Any]) -> None:
        """pysyncobj's serializer hook: write the image and the two Raft
        entries pysyncobj keeps, fsync, and let pysyncobj rename it."""
        last_entry, prev_entry = raft_data[0], raft_data[1]
        with self.image_lock:
            image = self._image.to_snapshot()
            last_token = self._last_token
        # The voter set as of the snapshot's last entry: the current one
        # with the changes of later entries (already appended) undone.
        log = self._SyncObj__raftLog
        later = [log[i][0] for i in range(len(log)) if log[i][1] > last_entry[1]]
        voters = membership.revert(self._voters, later)
        body = msgpack.packb({
            "format": SNAPSHOT_FORMAT,
            "image": image,
            "last_token": last_token,
            "voters": membership.encode_voters(voters),
            "last_entry": [bytes(last_entry[0]), last_entry[1], last_entry[2]],
            "prev_entry": [bytes(prev_entry[0]), prev_entry[1], prev_entry[2]],
        }, use_bin_type=True)
        with open(path, "wb") as f:
            f.write(body)
            f.flush()
            os.fsync(f.fileno())
        logger.info("controller %d: snapshot at raft index %d, metadata offset %d",
                    self.node_id, last_entry[1], self._image.offset)

    def _read_snapshot(self, path: str) -> tuple:
        """pysyncobj's deserializer hook (start-up, or a snapshot installed
        from the leader): replace the image; return the two Raft entries."""
        with open(path, "rb") as f:
            raw = msgpack.unpackb(f.read(), raw=False)
            # A snapshot installed from the leader was written unsynced, and
            # pysyncobj clears the journal right after this returns.
            os.fsync(f.fileno())
        _fsync_path(os.path.dirname(path) or ".")
        if raw.get("format") != SNAPSHOT_FORMAT:
            raise ValueError(f"{path}: unknown snapshot format {raw.get('format')!r}")
        image = MetadataImage.from_snapshot(raw["image"])
        # Snapshots from before membership was recorded: the static set.
        self._snapshot_voters = (membership.decode_voters(raw["voters"])
                                 if "voters" in raw else None)
        with self.image_lock:
            self._image = image
            self._last_token = raw.get("last_token")  # snapshots before pipelining: none
            self._history.clear()  # a gap: brokers behind it get the snapshot
        last, prev = raw["last_entry"], raw["prev_entry"]
        logger.info("controller %d: loaded snapshot at metadata offset %d",
                    self.node_id, image.offset)
        self._notify()
        # pysyncobj hands the cluster (the last item) to
        # __updateClusterConfiguration, whose override reads the set from
        # the snapshot and the journal instead.
        base = self._snapshot_voters if self._snapshot_voters is not None \
            else self._static_voters
        return (tuple(last), tuple(prev), [v.raft_address for v in base.values()])

    # -- the asyncio side -------------------------------------------------
    @property
    def image(self) -> MetadataImage:
        """The image; read it under ``image_lock``."""
        return self._image

    @property
    def is_leader(self) -> bool:
        return self._isLeader()

    def leader_id(self) -> int | None:
        leader = self._getLeader()
        if leader is None:
            return None
        return self._ids_by_address.get(getattr(leader, "address", str(leader)))

    async def propose(self, batch: Sequence[metadata_records.Record],
                      expected_offset: int | None, timeout_s: float, *,
                      after: int | None = None, token: int | None = None) -> ApplyResult:
        """Replicate ``batch`` and wait until it is applied here (or refused:
        see ``apply_batch`` for ``expected_offset``, ``after`` and ``token``).

        Raises NotControllerError if this node cannot commit (no leader,
        leadership lost) and RequestTimedOutError if it takes longer than
        ``timeout_s`` (the batch may still commit later)."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future = loop.create_future()

        def settle(result: Any, error: int) -> None:  # tick thread
            _settle_threadsafe(loop, future, result, error)

        payload = msgpack.packb([record.encode() for record in batch], use_bin_type=True)
        self._kick.set()
        if after is None and token is None:
            self.apply_batch(expected_offset, payload, callback=settle)
        else:
            self.apply_batch(expected_offset, payload, after, token, callback=settle)
        try:
            async with asyncio.timeout(timeout_s):
                result, error = await future
        except TimeoutError:
            raise RequestTimedOutError(
                f"the controller quorum did not commit within {timeout_s:.1f} s; the "
                "change may still be applied: check before retrying") from None
        if error == FAIL_REASON.SUCCESS:
            return result
        if error == FAIL_REASON.QUEUE_FULL:
            raise RequestTimedOutError("the controller's command queue is full; retry later")
        if error in (FAIL_REASON.LEADER_CHANGED, FAIL_REASON.UNKNOWN_OUTCOME):
            # Forwarded to a new leader, which may still commit it.
            raise RequestTimedOutError(
                f"leadership moved while the change was in flight "
                f"({_FAIL_NAMES.get(error, error)}); it may still be applied: check before "
                "retrying")
        raise NotControllerError(
            f"controller {self.node_id} could not commit: {_FAIL_NAMES.get(error, error)}",
            leader_id=self.leader_id())

    def records_after(self, offset: int, max_bytes: int = FETCH_BYTES_MAX
                      ) -> tuple[list[tuple[int, bytes]] | None, int]:
        """Records with offsets above ``offset`` and the image's offset.
        None instead of a list when the history no longer reaches back that
        far (the caller sends a snapshot). Call on the loop thread."""
        with self.image_lock:
            image_offset = self._image.offset
            if offset >= image_offset:
                return [], image_offset
            history = self._history
            if not history or history[0][0] > offset + 1:
                return None, image_offset
            start = offset + 1 - history[0][0]
            # The history's offsets are consecutive, and a broker asks from
            # near its end: walk in from the nearer end, so a long-poll costs
            # what it answers, not the history before it (50,000 records).
            wanted = max(0, len(history) - start)
            if start <= wanted:
                newer = itertools.islice(history, start, None)
            else:
                newer = reversed(list(itertools.islice(reversed(history), wanted)))
            out, size = [], 0
            for item in newer:
                if out and size + len(item[1]) > max_bytes:
                    break
                out.append(item)
                size += len(item[1])
            return out, image_offset

    def snapshot(self) -> tuple[bytes, int]:
        with self.image_lock:
            return self._image.to_snapshot(), self._image.offset

    def status(self) -> dict:
        """This replica's view of the quorum, for ``/v1/quorum``."""
        for _ in range(5):
            try:
                raw = self.getStatus()
                break
            except (RuntimeError, IndexError):  # changed by the tick thread meanwhile
                continue
        else:
            raise RuntimeError("could not read the raft status")
        leader = raw.get("leader")
        leader_id = None if leader is None else self._ids_by_address.get(
            getattr(leader, "address", str(leader)))
        last_index = self._last_log_index  # read on the tick thread
        state = _STATE_NAMES.get(raw["state"], str(raw["state"]))
        voters = []
        for nid, voter in sorted(self._voters.items()):
            address = voter.raft_address
            entry: dict[str, Any] = {"id": nid, "raft_address": address, "url": voter.url}
            if address == self.self_address:
                entry.update(connected=True, match_index=last_index if state == "leader" else None)
            else:
                entry["connected"] = raw.get(f"partner_node_status_server_{address}", 0) == 2
                entry["match_index"] = raw.get(f"match_idx_server_{address}") \
                    if state == "leader" else None
            entry["lag"] = (last_index - entry["match_index"]
                            if entry["match_index"] is not None else None)
            voters.append(entry)
        with self.image_lock:
            metadata_offset = self._image.offset
        return {
            "node_id": self.node_id,
            "state": state,
            "leader_id": leader_id,
            "term": raw["raft_term"],
            "commit_index": raw["commit_idx"],
            "last_applied": raw["last_applied"],
            "last_log_index": last_index,
            "has_quorum": bool(raw.get("has_quorum")),
            "metadata_offset": metadata_offset,
            "voter": self._is_voter,
            "voters": voters,
            "pending_voter_change": self._pending_change_seen,
            "pre_votes": dict(self.pre_vote_counts),
            "busy_max_ms": round(self.busy_max_s * 1000, 1),
        }


_FAIL_NAMES = {value: name for name, value in vars(FAIL_REASON).items() if name.isupper()}


def _settle_call(future: asyncio.Future, outcome: tuple) -> None:
    if future.done():
        return
    result, error = outcome
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)


def _settle(future: asyncio.Future, result: Any, error: int) -> None:
    if not future.done():
        future.set_result((result, error))


def _settle_threadsafe(loop: asyncio.AbstractEventLoop, future: asyncio.Future,
                       result: Any, error: int) -> None:
    """Called on the tick thread: must never raise, or pysyncobj would skip
    marking the entry applied and apply it again."""
    try:
        loop.call_soon_threadsafe(_settle, future, result, error)
    except RuntimeError:  # the loop is closed: nobody waits any more
        pass
