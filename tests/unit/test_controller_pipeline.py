"""The controller's pipelined committer (kraft/server.py) against a quorum
stand-in whose log applies proposals in order through the shipped
``MetadataQuorum.apply_batch`` (the offset, then the token of the batch it
follows), so the tests can decide when each batch applies, refuse one, or
fail a proposal. The quorum on real sockets is in
tests/integration/test_quorum.py. Each test here is a defect a second
reading of the pipeline found."""
import asyncio
import collections
import threading
from types import SimpleNamespace

import msgpack
import pytest

import kraft.server as server
from kraft.controller import Controller, ControllerResult, ControllerSettings
from kraft.image import MetadataImage
from kraft.quorum import MetadataQuorum
from kraft.records import NoOpRecord, TopicRecord
from protocol.errors import KraftError


class InOrderLog:
    """The quorum as the committer sees it: proposals applied in order."""

    def __init__(self):
        self.image_lock = threading.Lock()
        self._image = MetadataImage()
        self._last_token = None
        self._history = collections.deque(maxlen=1000)
        self.is_leader = True
        self.raftCurrentTerm = 1
        self.pending = collections.deque()   # (records, expected, after, token, future)
        self.auto = False
        self.raise_on_propose = None          # an exception the next propose raises
        self.invalid_next = False

    @property
    def image(self):
        return self._image

    def leader_id(self):
        return 1

    def _notify(self):
        pass  # (the real quorum tells its listeners)

    def _apply(self, records, expected, after, token):
        """The shipped ``MetadataQuorum.apply_batch`` itself, as pysyncobj
        calls it for each committed entry (``_doApply``), on this log."""
        payload = msgpack.packb([record.encode() for record in records], use_bin_type=True)
        if self.invalid_next:  # a batch no replica can decode
            self.invalid_next = False
            payload = msgpack.packb([b"\xc1not a record"])
        return MetadataQuorum.apply_batch(self, expected, payload, after, token, _doApply=True)

    def foreign(self, records):
        """Another proposer's batch lands first (a barrier, a forwarded command)."""
        self._apply(records, None, None, None)

    def commit_all(self):
        while self.pending:
            records, expected, after, token, fut = self.pending.popleft()
            if not fut.done():
                fut.set_result(self._apply(records, expected, after, token))

    async def propose(self, batch, expected_offset, timeout_s, *, after=None, token=None):
        if self.raise_on_propose is not None:
            exc, self.raise_on_propose = self.raise_on_propose, None
            raise exc
        fut = asyncio.get_running_loop().create_future()
        self.pending.append((list(batch), expected_offset, after, token, fut))
        if self.auto:
            asyncio.get_running_loop().call_soon(self.commit_all)
        return await asyncio.wait_for(fut, timeout_s)


def make_server(log):
    srv = server.ControllerServer.__new__(server.ControllerServer)
    srv.config = SimpleNamespace(node_id=1, voters={})
    srv.clock_ms = lambda: 0
    srv.quorum = log
    srv.core = Controller(ControllerSettings())
    srv._write_lock = asyncio.Lock()
    srv._writes = collections.deque()
    srv._writes_waiting = asyncio.Event()
    srv._committer = None
    srv._writes_committed = srv._write_batches = srv._pipelined_batches = 0
    srv._active_term = 1
    srv._activation = None
    srv._changed = asyncio.Event()
    srv._tasks = []
    srv._stopping = False
    return srv


def next_topic(image):
    """A non-idempotent write (as allocate_producer_ids: takes 'the next')."""
    n = len(image.topics)
    return ControllerResult([TopicRecord(f"t{n}", f"id{n}")], {"name": f"t{n}"})


async def until(pred, timeout=2.0):
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while not pred():
        assert loop.time() < end
        await asyncio.sleep(0.001)


async def test_a_refused_batch_after_a_group_hit_the_records_limit_applies_each_write_once(
        monkeypatch):
    """Writes put back by the records limit belong to the next group only:
    a refused batch recomputes each of them once."""
    monkeypatch.setattr(server, "GROUP_RECORDS_MAX", 1)  # each group: one writing write
    log = InOrderLog()
    srv = make_server(log)
    writes = [asyncio.ensure_future(srv.write(next_topic)) for _ in range(3)]
    await until(lambda: len(log.pending) == 3)   # 3 batches in flight, chained
    log.foreign([NoOpRecord()])                   # the first is now STALE, the rest by token
    log.auto = True
    log.commit_all()
    results = await asyncio.gather(*writes, return_exceptions=True)
    errors = [r for r in results if isinstance(r, BaseException)]
    with log.image_lock:
        topics = sorted(log.image.topics)
    assert not errors, f"one STALE refused writes: {errors}"
    assert len(topics) == 3, f"3 writes, {len(topics)} topics: {topics}"


async def test_a_proposal_that_fails_with_a_bug_is_answered_at_once_as_not_applied(
        monkeypatch):
    monkeypatch.setattr(server, "COMMIT_TIMEOUT_MS", 200)
    log = InOrderLog()
    srv = make_server(log)
    log.raise_on_propose = ValueError("cannot encode")
    with pytest.raises(KraftError) as info:
        await srv.write(next_topic)
    assert "may still be applied" not in str(info.value), info.value


async def test_an_invalid_batch_refuses_only_its_own_writes(monkeypatch):
    monkeypatch.setattr(server, "GROUP_RECORDS_MAX", 1)
    log = InOrderLog()
    srv = make_server(log)
    writes = [asyncio.ensure_future(srv.write(next_topic)) for _ in range(3)]
    await until(lambda: len(log.pending) == 3)
    log.invalid_next = True
    log.auto = True
    log.commit_all()
    results = await asyncio.gather(*writes, return_exceptions=True)
    assert isinstance(results[0], KraftError)
    assert not any(isinstance(r, BaseException) for r in results[1:]), results


async def test_an_exception_starting_a_group_neither_loses_it_nor_misanswers_the_one_in_flight(
        monkeypatch):
    """A bug while computing group 2 fails group 2 alone; batch 1, in
    flight, is answered by its own outcome."""
    monkeypatch.setattr(server, "COMMIT_TIMEOUT_MS", 200)
    log = InOrderLog()
    srv = make_server(log)
    first = asyncio.ensure_future(srv.write(next_topic))
    await until(lambda: len(log.pending) == 1)       # batch 1 in flight
    real, calls = srv.core.own_state, []
    def own_state():
        calls.append(1)
        raise RuntimeError("boom")                   # any bug while starting group 2
    srv.core.own_state = own_state
    second = asyncio.ensure_future(srv.write(next_topic))
    await until(lambda: calls)
    srv.core.own_state = real
    log.auto = True
    log.commit_all()                                  # batch 1 applies
    r1, r2 = await asyncio.gather(first, second, return_exceptions=True)
    with log.image_lock:
        topics = sorted(log.image.topics)
    assert "t0" in topics
    assert not isinstance(r1, BaseException), f"applied, answered {r1!r}"
    assert not (isinstance(r2, BaseException) and "may still be applied" in str(r2)), r2


async def test_writes_that_arrive_while_a_batch_is_in_flight_are_proposed_before_it_commits():
    """The pipeline: a group that arrives while the batch before it waits
    for its commit is computed on the image that batch leaves and proposed
    at once, chained to it by its token, and counted as pipelined. (The
    real cluster's concurrent creations cannot pin this: whether a write
    finds a batch in flight there is a matter of timing.)"""
    log = InOrderLog()
    srv = make_server(log)
    first = asyncio.ensure_future(srv.write(next_topic))
    await until(lambda: len(log.pending) == 1)        # batch 1 in flight, uncommitted
    second = asyncio.ensure_future(srv.write(next_topic))
    await until(lambda: len(log.pending) == 2)        # proposed before batch 1 commits
    (records1, expected1, _, token1, _), (records2, expected2, after2, _, _) = log.pending
    assert (expected1, expected2) == (-1, 0)          # on the image batch 1 leaves
    assert after2 == token1 is not None
    assert [r.name for r in records1 + records2] == ["t0", "t1"]
    assert srv._pipelined_batches == 1
    log.auto = True
    log.commit_all()
    r1, r2 = await asyncio.gather(first, second)
    assert (r1["name"], r1["metadata_offset"]) == ("t0", 0)
    assert (r2["name"], r2["metadata_offset"]) == ("t1", 1)
