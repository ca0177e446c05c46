"""The controller's Raft journal on disk (kraft/quorum.py ``_DurableJournal``
and ``_DurableMetaStorer``): what is durable when, and a journal file that
appends land in without allocating blocks."""
import os

import pytest
from pysyncobj import pickle as pysyncobj_pickle

from kraft.quorum import JOURNAL_FILL_CHUNK, _DurableJournal, _DurableMetaStorer


def on_disk(path):
    with open(path, "rb") as f:
        return pysyncobj_pickle.loads(f.read())


def holes(path):
    """(start, end) of each hole in the file."""
    found = []
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        position = 0
        while position < size:
            hole = os.lseek(fd, position, os.SEEK_HOLE)
            if hole >= size:
                break
            try:
                position = os.lseek(fd, hole, os.SEEK_DATA)
            except OSError:  # ENXIO: no data after it, a hole to the end
                position = size
            found.append((hole, position))
    finally:
        os.close(fd)
    return found


def test_a_new_term_or_vote_is_on_disk_when_store_returns(tmp_path):
    storer = _DurableMetaStorer(str(tmp_path / "j.meta"))
    meta = {"currentTerm": 3, "votedForNodeId": 2, "raftCommitIndex": 7}
    storer.storeMeta(meta)
    assert on_disk(storer.getPath()) == meta
    meta.update(currentTerm=4, votedForNodeId=None)
    storer.storeMeta(meta)
    assert on_disk(storer.getPath())["currentTerm"] == 4
    storer.close()


def test_the_commit_index_alone_is_stored_in_the_background_and_by_close(tmp_path):
    storer = _DurableMetaStorer(str(tmp_path / "j.meta"))
    meta = {"currentTerm": 1, "votedForNodeId": 1, "raftCommitIndex": 1}
    storer.storeMeta(meta)
    written = []
    real = storer._write

    def slow_write(meta, background):
        written.append(background)
        real(meta, background)

    storer._write = slow_write
    meta["raftCommitIndex"] = 9
    storer.storeMeta(meta)          # returns without writing on this thread ...
    storer.close()                  # ... and close waits for it
    assert written == [True]
    assert on_disk(storer.getPath())["raftCommitIndex"] == 9


def test_a_background_store_never_writes_a_term_not_stored_by_its_own_call(tmp_path):
    """The background thread copies the live meta when it writes: should it
    see a term the tick thread has set but not stored yet (that store is
    on its way, and must come first), it writes nothing."""
    storer = _DurableMetaStorer(str(tmp_path / "j.meta"))
    meta = {"currentTerm": 1, "votedForNodeId": None, "raftCommitIndex": 1}
    storer.storeMeta(meta)
    meta.update(currentTerm=2, raftCommitIndex=5)   # the tick thread, mid-election
    storer._write(meta, background=True)
    assert on_disk(storer.getPath()) == {"currentTerm": 1, "votedForNodeId": None,
                                         "raftCommitIndex": 1}
    storer.close()


def test_appends_land_on_written_blocks_and_survive_a_reopen(tmp_path):
    path = str(tmp_path / "raft.journal")
    journal = _DurableJournal(path)
    entry = os.urandom(3000)
    for index in range(1, 400):  # grows the file (doubling) several times
        journal.add(entry, index, 1)
        assert holes(path) == [], f"a hole after entry {index}"
    size = os.path.getsize(path)
    assert size > 1 << 20 > JOURNAL_FILL_CHUNK // 2
    journal._destroy()
    reopened = _DurableJournal(path)
    assert len(reopened) == 399
    assert [reopened[i][1] for i in (0, 398)] == [1, 399]
    assert reopened[398][0] == entry
    reopened._destroy()


@pytest.mark.parametrize("cut", [1, 200])
def test_a_journal_truncated_and_appended_again_reads_back_as_written(tmp_path, cut):
    path = str(tmp_path / "raft.journal")
    journal = _DurableJournal(path)
    for index in range(1, 301):
        journal.add(b"a%d" % index, index, 1)
    journal.deleteEntriesFrom(cut)          # a position: entries above index cut go
    for index in range(cut + 1, cut + 51):
        journal.add(b"b%d" % index, index, 2)
    journal._destroy()
    reopened = _DurableJournal(path)
    held = [reopened[i] for i in range(len(reopened))]
    assert [e[1] for e in held] == list(range(1, cut + 51))
    assert held[-1] == (b"b%d" % (cut + 50), cut + 50, 2)
    assert holes(path) == []
    reopened._destroy()


def test_a_truncated_log_counts_nothing_above_its_end_as_synced(tmp_path):
    """A follower whose log was cut back and that is then elected must sync
    the entries it appends at those indexes again before they count."""
    journal = _DurableJournal(str(tmp_path / "raft.journal"))
    for index in range(1, 11):
        journal.add(b"x", index, 1)
    assert journal.synced_index == 10
    journal.deleteEntriesFrom(7)            # from position 7: entries 8-10 gone
    assert journal.synced_index == 7
    journal.lead(True)
    held = []
    journal.hold_commit_index = held.append
    journal._sync_lock.acquire()            # the leader's sync cannot run yet
    try:
        journal.add(b"noop", 8, 2)
        assert journal.synced_index == 7
        journal.setRaftCommitIndex(8)       # pysyncobj: a majority holds 8
        assert held == [journal._committed] and journal._committed < 8
    finally:
        journal._sync_lock.release()
    journal.lead(False)                     # syncs what is left
    assert journal.synced_index == 8
    journal._destroy()


def test_a_background_sync_that_ends_after_a_truncation_counts_nothing_above_the_cut(
        tmp_path, monkeypatch):
    import threading

    import kraft.quorum as quorum_module

    journal = _DurableJournal(str(tmp_path / "raft.journal"))
    journal.lead(True)
    real, started, release = os.fdatasync, threading.Event(), threading.Event()

    def slow(fd):
        if threading.current_thread().name == "raft-journal-sync":
            started.set()
            release.wait(10)
        real(fd)

    monkeypatch.setattr(quorum_module.os, "fdatasync", slow)
    for index in range(1, 8):
        journal.add(b"x", index, 1)
    assert started.wait(5)
    journal._leading = False      # stepped down (as lead(False), without its own sync)
    cut = threading.Thread(target=journal.deleteEntriesFrom, args=(3,))
    cut.start()                   # waits for the sync in flight
    release.set()
    cut.join(5)
    assert not cut.is_alive()
    assert journal.synced_index == 3, journal.synced_index
    journal._destroy()


def test_a_journal_that_cannot_be_synced_stops_the_controller(tmp_path, monkeypatch):
    import kraft.quorum as quorum_module

    journal = _DurableJournal(str(tmp_path / "raft.journal"))
    reasons = []
    journal.on_fatal = reasons.append

    def failing(fd):
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(quorum_module.os, "fdatasync", failing)
    with pytest.raises(OSError):
        journal.add(b"x", 1, 1)
    assert len(reasons) == 1 and "syncing the Raft journal" in reasons[0]
    monkeypatch.undo()
    journal._destroy()
