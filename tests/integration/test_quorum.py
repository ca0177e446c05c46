"""The metadata quorum on real sockets and real files, in one process:
three pysyncobj replicas commit batches atomically, refuse stale and
malformed ones, and come back with their image after a restart, from the
journal and from a snapshot."""

import asyncio
import contextlib
import os

import msgpack
import pytest

from chaos.cluster import free_port
from kraft.image import MetadataImage
from kraft.quorum import ApplyStatus, MetadataQuorum, RaftSettings
from kraft.records import NoOpRecord, PartitionRecord, TopicRecord
from protocol.errors import NotControllerError

FAST = RaftSettings(election_timeout_ms=200, fetch_timeout_ms=1000)


def make_quorums(tmp_path, addresses, settings=FAST):
    quorums = [MetadataQuorum(node_id, addresses, str(tmp_path / f"c{node_id}"), settings)
               for node_id in sorted(addresses)]
    for quorum in quorums:
        quorum.start()
    return quorums


@contextlib.contextmanager
def running(tmp_path, addresses, settings=FAST):
    """Replicas started for the block and stopped after it, whatever happens."""
    quorums = make_quorums(tmp_path, addresses, settings)
    try:
        yield quorums
    finally:
        for quorum in quorums:
            quorum.stop()


async def wait_for(predicate, timeout_s, what):
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not predicate():
        assert loop.time() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.02)


async def leader_of(quorums):
    await wait_for(lambda: sum(q.is_leader for q in quorums) == 1, 10, "one leader")
    leader = next(q for q in quorums if q.is_leader)
    await leader.propose([NoOpRecord()], None, 5)  # barrier: the image is current
    return leader


def offset_of(quorum):
    with quorum.image_lock:
        return quorum.image.offset


async def create_topic(leader, name):
    expected = offset_of(leader)
    return await leader.propose([TopicRecord(name, f"id-{name}"),
                                 PartitionRecord(f"id-{name}", 0, [1], [1], 1, 0, 0)],
                                expected, 5)


@pytest.fixture
def addresses():
    return {node_id: f"127.0.0.1:{free_port()}" for node_id in (1, 2, 3)}


async def test_three_replicas_apply_the_same_batches_at_the_same_offsets(tmp_path, addresses):
    with running(tmp_path, addresses) as quorums:
        leader = await leader_of(quorums)
        start = offset_of(leader)
        for i in range(5):
            result = await create_topic(leader, f"t{i}")
            assert result.status is ApplyStatus.APPLIED
            assert result.last_offset == start + 2 * (i + 1)  # two records per batch
        await wait_for(lambda: all(offset_of(q) == offset_of(leader) for q in quorums), 5,
                       "followers to apply")
        snapshots = {q.snapshot() for q in quorums}
        assert len(snapshots) == 1
        records, _ = leader.records_after(start)
        assert [offset for offset, _ in records] == list(range(start + 1, start + 11))
        # From any offset (read in from the history's nearer end): the
        # records after it, oldest first, and the first alone when the byte
        # budget holds less.
        for after in range(start, start + 11):
            records, end = leader.records_after(after)
            assert end == start + 10
            assert [offset for offset, _ in records] == list(range(after + 1, start + 11))
            one, _ = leader.records_after(after, max_bytes=1)
            assert [offset for offset, _ in one] == list(range(after + 1, start + 11))[:1]


async def test_a_batch_computed_on_another_image_is_refused_everywhere(tmp_path, addresses):
    with running(tmp_path, addresses) as quorums:
        leader = await leader_of(quorums)
        stale_offset = offset_of(leader)
        await create_topic(leader, "first")
        result = await leader.propose([TopicRecord("second", "id-second")], stale_offset, 5)
        assert result.status is ApplyStatus.STALE
        await wait_for(lambda: all(offset_of(q) == offset_of(leader) for q in quorums), 5,
                       "followers to apply")
        for q in quorums:
            with q.image_lock:
                assert sorted(q.image.topics) == ["first"]


async def test_a_pipelined_batch_applies_only_right_after_the_one_it_was_computed_on(
        tmp_path, addresses):
    """The controller proposes a batch computed on another still in flight
    (``after`` its token). Offsets alone are not enough: if that one is
    refused and as many other records apply, the offset matches an image
    the batch was not computed on. Every replica refuses it alike."""
    with running(tmp_path, addresses) as quorums:
        leader = await leader_of(quorums)
        base = offset_of(leader)
        first = [TopicRecord("a", "id-a")]
        # In flight together: b is computed on the image a leaves.
        a, b = await asyncio.gather(
            leader.propose(first, base, 5, token=11),
            leader.propose([TopicRecord("b", "id-b")], base + 1, 5, after=11, token=12))
        assert (a.status, b.status) == (ApplyStatus.APPLIED, ApplyStatus.APPLIED)
        # The ABA case: x (token 21) is refused (a stale offset), then one
        # other record applies, so the image reaches the offset y expects.
        at = offset_of(leader)
        x, other, y = await asyncio.gather(
            leader.propose([TopicRecord("x", "id-x")], at - 1, 5, token=21),
            leader.propose([TopicRecord("other", "id-other")], at, 5),
            leader.propose([TopicRecord("y", "id-y")], at + 1, 5, after=21, token=22))
        assert x.status is ApplyStatus.STALE and other.status is ApplyStatus.APPLIED
        assert y.status is ApplyStatus.STALE, "applied on an image it was not computed on"
        await wait_for(lambda: all(offset_of(q) == offset_of(leader) for q in quorums), 5,
                       "followers to apply")
        for q in quorums:
            with q.image_lock:
                assert sorted(q.image.topics) == ["a", "b", "other"]


async def test_a_snapshot_keeps_the_last_batch_token(tmp_path):
    """A replica restored from a snapshot must judge the next pipelined
    batch as the others do."""
    addresses = {1: f"127.0.0.1:{free_port()}"}
    settings = RaftSettings(election_timeout_ms=200, fetch_timeout_ms=1000,
                            snapshot_min_entries=4)
    (quorum,) = make_quorums(tmp_path, addresses, settings)
    try:
        leader = await leader_of([quorum])
        for i in range(8):
            await leader.propose([TopicRecord(f"t{i}", f"id-{i}")], offset_of(leader), 5,
                                 token=100 + i)
        await wait_for(lambda: os.path.exists(tmp_path / "c1" / "raft.snapshot"), 10,
                       "a snapshot")
        with open(tmp_path / "c1" / "raft.snapshot", "rb") as f:
            raw = msgpack.unpackb(f.read(), raw=False)
        assert raw["last_token"] in range(100, 108)
        quorum.stop()
        (quorum,) = make_quorums(tmp_path, addresses, settings)
        quorum._read_snapshot(str(tmp_path / "c1" / "raft.snapshot"))  # noqa: SLF001
        assert quorum._last_token == raw["last_token"]  # noqa: SLF001
    finally:
        quorum.stop()


async def test_an_undecodable_batch_changes_nothing(tmp_path, addresses):
    with running(tmp_path, addresses) as quorums:
        leader = await leader_of(quorums)
        before = leader.snapshot()
        loop = asyncio.get_running_loop()
        done = loop.create_future()
        garbage = msgpack.packb([b"\xc1not a record"])
        leader.apply_batch(None, garbage, callback=lambda result, error:
                           loop.call_soon_threadsafe(done.set_result, (result, error)))
        result, error = await asyncio.wait_for(done, 5)
        assert result.status is ApplyStatus.INVALID
        assert leader.snapshot() == before


async def test_a_follower_cannot_commit_and_says_who_leads(tmp_path, addresses):
    with running(tmp_path, addresses) as quorums:
        leader = await leader_of(quorums)
        follower = next(q for q in quorums if q is not leader)
        await wait_for(lambda: follower.leader_id() == leader.node_id, 5, "leader known")
        status = follower.status()
        assert status["state"] == "follower" and status["leader_id"] == leader.node_id
        leader_status = leader.status()
        assert {v["id"] for v in leader_status["voters"]} == {1, 2, 3}
        assert all(v["lag"] is not None for v in leader_status["voters"])


@pytest.mark.parametrize("snapshot_first", [False, True], ids=["journal", "snapshot"])
async def test_a_restarted_quorum_has_every_committed_record(tmp_path, addresses,
                                                              snapshot_first):
    settings = RaftSettings(election_timeout_ms=200, fetch_timeout_ms=1000,
                            snapshot_min_entries=5 if snapshot_first else 5000)
    quorums = make_quorums(tmp_path, addresses, settings)
    leader = await leader_of(quorums)
    for i in range(12):
        await create_topic(leader, f"t{i}")
    await wait_for(lambda: all(offset_of(q) == offset_of(leader) for q in quorums), 5,
                   "followers to apply")
    if snapshot_first:
        await wait_for(lambda: all(os.path.exists(tmp_path / f"c{q.node_id}" / "raft.snapshot")
                                   for q in quorums), 10, "snapshots on every replica")
    expected = leader.snapshot()
    for q in quorums:
        q.stop()

    quorums = make_quorums(tmp_path, addresses, settings)
    try:
        leader = await leader_of(quorums)  # its barrier commits every older entry
        await wait_for(lambda: all(offset_of(q) == expected[1] + 1 for q in quorums), 10,
                       "replicas to re-apply the log and the new barrier")
        before = MetadataImage.from_snapshot(expected[0])
        for q in quorums:
            after = MetadataImage.from_snapshot(q.snapshot()[0])
            assert after.topics == before.topics and len(after.topics) == 12
    finally:
        for q in quorums:
            q.stop()


async def test_the_journal_is_synced_on_every_append(tmp_path, addresses, monkeypatch):
    import kraft.quorum as quorum_module

    quorums = make_quorums(tmp_path, addresses)
    try:
        leader = await leader_of(quorums)
        calls = []
        real_fdatasync = os.fdatasync
        monkeypatch.setattr(quorum_module.os, "fdatasync",
                            lambda fd: (calls.append(fd), real_fdatasync(fd)))
        await create_topic(leader, "synced")
        # the leader's own append, and each follower's, before it acknowledged
        assert len(calls) >= 2
    finally:
        monkeypatch.undo()
        for q in quorums:
            q.stop()


async def test_propose_without_a_quorum_fails_fast(tmp_path):
    addresses = {1: f"127.0.0.1:{free_port()}", 2: f"127.0.0.1:{free_port()}",
                 3: f"127.0.0.1:{free_port()}"}
    lone = MetadataQuorum(1, addresses, str(tmp_path / "lone"), FAST)
    lone.start()
    try:
        with pytest.raises(NotControllerError):
            await lone.propose([NoOpRecord()], None, 5)
        assert not lone.is_leader
    finally:
        lone.stop()


async def test_a_batch_with_one_bad_record_applies_none_of_them(tmp_path, addresses):
    from kraft.records import FenceBrokerRecord, RegisterBrokerRecord

    with running(tmp_path, addresses) as quorums:
        leader = await leader_of(quorums)
        before = leader.snapshot()
        result = await leader.propose([RegisterBrokerRecord(5, "inc", {"BROKER": "h:1"}, None),
                                       FenceBrokerRecord(6, 0)], before[1], 5)
        assert result.status is ApplyStatus.INVALID
        assert leader.snapshot() == before
        assert leader.records_after(before[1]) == ([], before[1])


async def test_a_crash_between_snapshot_and_journal_cut_loses_nothing(tmp_path, monkeypatch):
    """pysyncobj renames a new snapshot in one tick and cuts the journal in a
    later one, after acknowledging more entries. A crash in between leaves a
    journal that starts before the snapshot; pysyncobj alone would then clear
    it down to the snapshot and lose those acknowledged entries."""
    import kraft.quorum as quorum_module

    addresses = {1: f"127.0.0.1:{free_port()}"}
    settings = RaftSettings(election_timeout_ms=200, fetch_timeout_ms=1000,
                            snapshot_min_entries=4)
    # The journal is never cut, as if the crash came first; and only one
    # snapshot is written, so later entries exist only in the journal.
    monkeypatch.setattr(quorum_module._DurableJournal, "deleteEntriesTo", lambda self, n: None)
    write_snapshot = MetadataQuorum._write_snapshot
    written = []

    def write_once(self, path, raft_data):
        if written:
            raise OSError("simulated: no second snapshot")
        written.append(raft_data[0][1])
        write_snapshot(self, path, raft_data)

    monkeypatch.setattr(MetadataQuorum, "_write_snapshot", write_once)
    (quorum,) = make_quorums(tmp_path, addresses, settings)
    leader = await leader_of([quorum])
    for i in range(12):
        await create_topic(leader, f"t{i}")
    await wait_for(lambda: os.path.exists(tmp_path / "c1" / "raft.snapshot"), 10, "a snapshot")
    for i in range(12, 15):  # acknowledged after the snapshot
        await create_topic(leader, f"t{i}")
    assert written and written[0] < quorum.status()["commit_index"]
    expected = MetadataImage.from_snapshot(quorum.snapshot()[0]).topics
    quorum.stop()
    monkeypatch.undo()

    (quorum,) = make_quorums(tmp_path, addresses, settings)
    try:
        await leader_of([quorum])
        restored = MetadataImage.from_snapshot(quorum.snapshot()[0]).topics
        assert restored == expected and len(restored) == 15
    finally:
        quorum.stop()


def test_a_taken_raft_port_is_an_error_naming_it_not_a_silent_hang(tmp_path, monkeypatch):
    """pysyncobj alone retries a failed bind forever, spinning a CPU, and the
    node never says why it is not in the quorum."""
    import socket

    import kraft.quorum as quorum_module

    monkeypatch.setattr(quorum_module, "RAFT_BIND_WAIT_S", 0.5)
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen(1)
        address = f"127.0.0.1:{squatter.getsockname()[1]}"
        with pytest.raises(OSError, match=f"cannot listen on the Raft address {address}"):
            MetadataQuorum(1, {1: address}, str(tmp_path / "c1"), FAST)
    # Free again: the same address starts.
    (quorum,) = make_quorums(tmp_path, {1: address})
    quorum.stop()


def test_free_ports_are_outside_the_ephemeral_range():
    """Outgoing connections take ports from the ephemeral range; a node told
    to listen on one of those can find it taken."""
    with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
        low, high = (int(v) for v in f.read().split()[:2])
    ports = [free_port(pair=True) for _ in range(50)]
    assert all(1024 <= p and (p + 1 < low or p > high) for p in ports)
    assert len({*ports, *(p + 1 for p in ports)}) == 100


def test_the_raft_port_listens_on_its_own_address_only(tmp_path):
    """pysyncobj alone listens on 0.0.0.0; a controller configured on
    127.0.0.1 must not be reachable on another address of the machine."""
    import socket

    address = f"127.0.0.1:{free_port()}"
    (quorum,) = make_quorums(tmp_path, {1: address})
    try:
        port = int(address.rsplit(":", 1)[1])
        socket.create_connection(("127.0.0.1", port), timeout=5).close()
        with pytest.raises(OSError):
            socket.create_connection(("127.0.0.2", port), timeout=5).close()
    finally:
        quorum.stop()


async def test_a_leader_whose_disk_stalls_keeps_leading_and_commits_only_what_it_synced(
        tmp_path, addresses, monkeypatch):
    """The leader syncs its appends on a thread of its own: while its disk
    holds a sync for several election timeouts, it goes on sending
    heartbeats (no election: the followers still hear it) and the entry
    reaches the followers, but it is committed, applied and answered only
    once it is on the leader's own disk too (Raft counts the leader towards
    a majority only for what it has stored)."""
    import threading

    import kraft.quorum as quorum_module

    with running(tmp_path, addresses) as quorums:
        leader = await leader_of(quorums)
        term = leader.raftCurrentTerm
        journal = leader._SyncObj__raftLog
        release, held = threading.Event(), threading.Event()
        real_fdatasync = os.fdatasync

        def stalling_fdatasync(fd):
            if fd == journal._fd:
                held.set()
                release.wait(30)
            real_fdatasync(fd)

        monkeypatch.setattr(quorum_module.os, "fdatasync", stalling_fdatasync)
        try:
            creation = asyncio.ensure_future(create_topic(leader, "stalled"))
            await wait_for(held.is_set, 5, "the leader's sync to stall")
            index = leader._last_log_index

            def followers_hold_it():
                voters = leader.status()["voters"]
                return all(v["match_index"] is not None and v["match_index"] >= index
                           for v in voters if v["id"] != leader.node_id)

            await wait_for(followers_hold_it, 5, "both followers to acknowledge the entry")
            stalled_since = asyncio.get_running_loop().time()
            # Three election timeouts with the leader's disk stalled ...
            await wait_for(lambda: asyncio.get_running_loop().time() - stalled_since > 0.6,
                           2, "three election timeouts")
            assert leader.is_leader and leader.raftCurrentTerm == term
            assert all(q.raftCurrentTerm == term for q in quorums), "an election was held"
            assert leader.raftCommitIndex < index <= journal.synced_index + 1
            assert not creation.done()
            assert "stalled" not in leader.image.topics
        finally:
            release.set()
        result = await creation
        assert result.status is ApplyStatus.APPLIED
        assert journal.synced_index >= index and leader.raftCommitIndex >= index
        await wait_for(lambda: all("stalled" in q.image.topics for q in quorums), 5,
                       "every replica to apply it")
