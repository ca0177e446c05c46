"""Dynamic controller membership (KIP-853) on real sockets and files, in one
process: a joining replica catches up as a learner before it votes, voters
are removed (the leader too, after handing over), one change at a time, and
the voter set survives restarts from the journal and from a snapshot, even
when the static voter list is older than the log's."""

import asyncio
import os

import pytest

from pysyncobj import FAIL_REASON

from chaos.cluster import free_port
from kraft.membership import ADD, MEMBERSHIP_COMMAND_TYPE, Change, MembershipRefused, Voter
from kraft.quorum import MetadataQuorum, RaftSettings
from protocol.errors import NotControllerError, RequestTimedOutError
from tests.integration.test_quorum import create_topic, leader_of, offset_of, wait_for

FAST = RaftSettings(election_timeout_ms=200, fetch_timeout_ms=1000)


class Replicas:
    """Quorum replicas of one test, stopped at the end whatever happens."""

    def __init__(self, tmp_path, static, settings=FAST):
        self.tmp_path, self.static, self.settings = tmp_path, static, settings
        self.running: dict[int, MetadataQuorum] = {}
        self.addresses = dict(static)

    def start(self, node_id, address=None):
        if address is not None:
            self.addresses[node_id] = address
        quorum = MetadataQuorum(node_id, self.static, str(self.tmp_path / f"c{node_id}"),
                                self.settings, self_address=self.addresses[node_id])
        quorum.start()
        self.running[node_id] = quorum
        return quorum

    def stop(self, node_id):
        self.running.pop(node_id).stop()

    def stop_all(self):
        for node_id in list(self.running):
            self.stop(node_id)

    async def leader(self):
        return await leader_of(list(self.running.values()))


@pytest.fixture
def replicas(tmp_path):
    static = {node_id: f"127.0.0.1:{free_port()}" for node_id in (1, 2, 3)}
    r = Replicas(tmp_path, static)
    try:
        yield r
    finally:
        r.stop_all()


def voter_ids(quorum):
    return set(quorum.voters())


async def remove(replicas, node_id):
    """Remove ``node_id`` as a user would: at the leader, following the
    hand-over when it is the leader itself."""
    leader = await replicas.leader()
    try:
        return await leader.remove_voter(node_id, 5)
    except NotControllerError as exc:
        successor_id = exc.leader_id
    assert successor_id is not None and successor_id != node_id
    await wait_for(lambda: replicas.running[successor_id].is_leader, 5, "the successor")
    successor = await replicas.leader()
    assert successor.node_id == successor_id
    return await successor.remove_voter(node_id, 5)


async def test_a_joining_replica_catches_up_then_votes_and_the_set_survives_restarts(replicas):
    for node_id in (1, 2, 3):
        replicas.start(node_id)
    leader = await replicas.leader()
    for i in range(5):
        await create_topic(leader, f"before-{i}")
    joining = replicas.start(4, f"127.0.0.1:{free_port()}")
    assert not joining.is_voter and voter_ids(joining) == {1, 2, 3}

    voters = await leader.add_voter(Voter(4, replicas.addresses[4], "http://x:4"), 10, 5)
    assert set(voters) == {1, 2, 3, 4}
    # It had every committed record before it became a voter.
    assert offset_of(joining) >= 5
    await wait_for(lambda: joining.is_voter and all(
        voter_ids(q) == {1, 2, 3, 4} for q in replicas.running.values()), 5,
        "every replica to see four voters")
    await create_topic(leader, "after-add")
    await wait_for(lambda: offset_of(joining) == offset_of(leader), 5, "the new voter to apply")

    # Removing the leader: it hands over, its successor removes it.
    old_leader = leader.node_id
    await remove(replicas, old_leader)
    survivors = {1, 2, 3, 4} - {old_leader}
    await wait_for(lambda: all(voter_ids(q) == survivors for q in replicas.running.values()),
                   5, "the removal everywhere")
    assert not replicas.running[old_leader].is_voter
    leader = await replicas.leader()
    assert leader.node_id != old_leader
    await create_topic(leader, "after-remove")
    expected_offset = offset_of(leader)

    # Every replica restarted with the static voter list {1, 2, 3}: the log wins.
    replicas.stop_all()
    for node_id in (1, 2, 3, 4):
        replicas.start(node_id)
    leader = await replicas.leader()
    assert leader.node_id in survivors
    for quorum in replicas.running.values():
        assert voter_ids(quorum) == survivors
    assert not replicas.running[old_leader].is_voter
    await wait_for(lambda: all(offset_of(q) > expected_offset for q in replicas.running.values()
                               if q.node_id != old_leader), 10, "survivors to re-apply the log")
    with leader.image_lock:
        assert {"before-0", "after-add", "after-remove"} <= set(leader.image.topics)


async def test_the_voter_set_is_in_snapshots(tmp_path):
    static = {node_id: f"127.0.0.1:{free_port()}" for node_id in (1, 2, 3)}
    replicas = Replicas(tmp_path, static, RaftSettings(election_timeout_ms=200,
                                                       fetch_timeout_ms=1000,
                                                       snapshot_min_entries=4))
    try:
        for node_id in (1, 2, 3):
            replicas.start(node_id)
        leader = await replicas.leader()
        follower = next(n for n in (1, 2, 3) if n != leader.node_id)
        await remove(replicas, follower)
        for i in range(12):
            await create_topic(leader, f"t{i}")
        await wait_for(lambda: all(os.path.exists(tmp_path / f"c{n}" / "raft.snapshot")
                                   for n in (1, 2, 3) if n != follower), 15, "snapshots")
        replicas.stop_all()
        for node_id in (1, 2, 3):
            replicas.start(node_id)
        leader = await replicas.leader()
        assert all(voter_ids(q) == {1, 2, 3} - {follower} for q in replicas.running.values())
        await create_topic(leader, "after-restart")
    finally:
        replicas.stop_all()


async def test_refusals_name_what_is_wrong(replicas):
    for node_id in (1, 2, 3):
        replicas.start(node_id)
    leader = await replicas.leader()
    with pytest.raises(MembershipRefused) as refused:
        await leader.add_voter(Voter(2, f"127.0.0.1:{free_port()}", None), 1, 5)
    assert refused.value.code == "DUPLICATE_VOTER"
    with pytest.raises(MembershipRefused) as refused:
        await leader.add_voter(Voter(9, replicas.addresses[2], None), 1, 5)
    assert refused.value.code == "DUPLICATE_VOTER"
    with pytest.raises(MembershipRefused) as refused:
        await leader.remove_voter(7, 5)
    assert refused.value.code == "VOTER_NOT_FOUND"
    follower = next(q for q in replicas.running.values() if not q.is_leader)
    with pytest.raises(NotControllerError):
        await follower.add_voter(Voter(9, f"127.0.0.1:{free_port()}", None), 1, 5)
    # Nobody listens there: it cannot catch up, and nothing changes.
    with pytest.raises(RequestTimedOutError, match="did not catch up"):
        await leader.add_voter(Voter(9, f"127.0.0.1:{free_port()}", None), 0.5, 5)
    assert voter_ids(leader) == {1, 2, 3}
    # Down to one voter, which cannot go.
    for node_id in sorted({1, 2, 3} - {leader.node_id}):
        await leader.remove_voter(node_id, 5)
    with pytest.raises(MembershipRefused) as refused:
        await leader.remove_voter(leader.node_id, 5)
    assert refused.value.code == "INVALID_REQUEST" and "last voter" in str(refused.value)
    await create_topic(leader, "alone")  # a lone voter commits by itself


async def test_one_change_at_a_time(tmp_path):
    static = {node_id: f"127.0.0.1:{free_port()}" for node_id in (1, 2, 3)}
    # A leader that keeps leading for a while with nobody answering.
    replicas = Replicas(tmp_path, static, RaftSettings(election_timeout_ms=200,
                                                       fetch_timeout_ms=5000))
    try:
        await _one_change_at_a_time(replicas)
    finally:
        replicas.stop_all()


async def _one_change_at_a_time(replicas):
    for node_id in (1, 2, 3):
        replicas.start(node_id)
    leader = await replicas.leader()
    followers = [n for n in (1, 2, 3) if n != leader.node_id]
    # Both followers stopped: a removal can be appended but not committed
    # (two of three voters needed, or of two after it).
    for node_id in followers:
        replicas.stop(node_id)
    first = asyncio.ensure_future(leader.remove_voter(followers[0], 1.0))
    await wait_for(lambda: leader.status()["pending_voter_change"] is not None, 5,
                   "the first change to be appended")
    with pytest.raises(MembershipRefused) as refused:
        await leader.remove_voter(followers[1], 1.0)
    assert refused.value.code == "REBALANCE_IN_PROGRESS"
    assert "one voter at a time" in str(refused.value)
    with pytest.raises((RequestTimedOutError, NotControllerError)):
        await first


async def test_a_membership_entry_over_the_raft_port_is_refused(replicas):
    """Only the active controller's API appends voter changes: one a peer
    sends as apply_command (what pysyncobj's forwarding does) is dropped
    and denied, and a follower never queues one."""
    for node_id in (1, 2, 3):
        replicas.start(node_id)
    leader = await replicas.leader()
    follower = next(q for q in replicas.running.values() if q is not leader)
    newcomer = Voter(9, f"127.0.0.1:{free_port()}", "http://127.0.0.1:1")
    loop = asyncio.get_running_loop()
    outcome = loop.create_future()

    def forward():  # the follower's tick thread: pysyncobj sends it to the leader
        follower._applyCommand(  # noqa: SLF001
            Change(ADD, newcomer).command(),
            lambda result, error: loop.call_soon_threadsafe(outcome.set_result, error),
            MEMBERSHIP_COMMAND_TYPE)

    await follower._on_tick(forward)  # noqa: SLF001
    assert await asyncio.wait_for(outcome, 10) == FAIL_REASON.REQUEST_DENIED
    with pytest.raises(NotControllerError):
        await follower._propose_change(Change(ADD, newcomer), 2)  # noqa: SLF001
    with pytest.raises(NotControllerError):
        await follower.remove_voter(leader.node_id, 2)
    await create_topic(leader, "after")  # the log moved on without it
    assert all(voter_ids(q) == {1, 2, 3} for q in replicas.running.values())
    assert leader.status()["pending_voter_change"] is None


async def test_a_controller_removed_while_down_is_refused_as_stale(replicas):
    """Controller 4 is removed while it is down: its log still makes it a
    voter, and its term is above the leader's (as after campaigning while
    cut off: set here, the rest of the quorum does not let it connect). It
    ignores the leader's appends; adding it back as it is fails at once and
    says to clear its metadata dir."""
    for node_id in (1, 2, 3):
        replicas.start(node_id)
    leader = await replicas.leader()
    address = f"127.0.0.1:{free_port()}"
    replicas.start(4, address)
    await leader.add_voter(Voter(4, address, "http://x:4"), 10, 5)
    await wait_for(lambda: replicas.running[4].is_voter, 5, "controller 4 to vote")
    replicas.stop(4)
    await leader.remove_voter(4, 5)
    stale = replicas.start(4, address)
    assert stale.is_voter  # it never heard
    leader = await replicas.leader()
    term = leader.raftCurrentTerm + 50

    def campaigned():  # its tick thread
        stale._SyncObj__raftCurrentTerm = term  # noqa: SLF001

    await stale._on_tick(campaigned)  # noqa: SLF001
    started = asyncio.get_running_loop().time()
    with pytest.raises(MembershipRefused, match="metadata.log.dir") as refused:
        await leader.add_voter(Voter(4, address, "http://x:4"), 20, 5)
    assert refused.value.code == "INVALID_REQUEST" and "stale state" in str(refused.value)
    assert asyncio.get_running_loop().time() - started < 10
    assert voter_ids(leader) == {1, 2, 3}
