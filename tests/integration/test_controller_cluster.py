"""The control plane as real processes on loopback: three controllers and
three brokers started with ``kraftlog node``, killed with SIGKILL, paused
with SIGSTOP, stopped with SIGTERM. Every wait has a deadline
(``wait_until``); times quoted in test names are checked as deadlines, and
measured properly by ``kraftlog bench controller``."""

import asyncio
import signal
import subprocess
import sys
import threading
import time
import urllib.request

import msgpack
import pytest

from chaos.cluster import FAST_SETTINGS, ProcessCluster, http_json, wait_until
from kraft.client import ControllerClient
from kraft.records import TopicRecord, decode

SESSION_TIMEOUT_S = 1.5  # chaos.cluster.FAST_SETTINGS


def create_topic(cluster, name, partitions=3, replication_factor=3, **extra):
    status, body = cluster.controller_call("/v1/controller/topics/create", {
        "topics": [{"name": name, "num_partitions": partitions,
                    "replication_factor": replication_factor, **extra}]})
    assert status == 200, body
    (result,) = body["topics"]
    return result


def topics_of(metadata):
    return {t["name"]: [(p["partition"], p["replicas"]) for p in t["partitions"]]
            for t in metadata["topics"]}


def partitions_of(cluster, controller_id, topic):
    (t,) = [t for t in cluster.metadata(controller_id)["topics"] if t["name"] == topic]
    return t["partitions"]


@pytest.fixture
def cluster(tmp_path):
    with ProcessCluster(str(tmp_path / "cluster"), controllers=3, brokers=3) as c:
        c.start()
        c.wait_for_active_controller(20)
        c.wait_for_brokers_running(timeout_s=20)
        yield c


def test_killing_the_active_controller_elects_another_that_creates_a_topic_within_3s(cluster):
    create_topic(cluster, "before")
    old = cluster.wait_for_active_controller()
    cluster.kill(old)
    killed_at = time.monotonic()
    new = cluster.wait_for_active_controller(3, exclude=(old,))
    created = create_topic(cluster, "after")
    elapsed = time.monotonic() - killed_at
    assert new != old and created["error"] is None
    assert elapsed < 3.0, f"failover plus a topic creation took {elapsed:.2f} s"
    # The killed leader's connections closed: a survivor stood for election
    # at once rather than waiting out the election timeout.
    survivors = [c for c in cluster.controller_ids if c != old]
    assert any("closed its connection; standing for election" in cluster.log_tail(c, 400)
               for c in survivors)
    # The new controller kept what the old one committed.
    assert {"before", "after"} <= set(topics_of(cluster.metadata(new)))


def test_all_controllers_killed_and_restarted_keep_every_topic_and_assignment(cluster):
    for i in range(4):
        create_topic(cluster, f"topic-{i}", partitions=i + 1)
    active = cluster.wait_for_active_controller()
    before = topics_of(cluster.metadata(active))
    for controller in cluster.controller_ids:
        cluster.kill(controller)
    cluster.start(cluster.controller_ids)
    cluster.wait_for_active_controller(20)
    for controller in cluster.controller_ids:
        wait_until(lambda: topics_of(cluster.metadata(controller)) == before, 10,
                   f"controller {controller} to have every topic back")
    # Brokers reconnect (their leases were reset by the new active controller).
    cluster.wait_for_brokers_running(timeout_s=20)


def test_a_lone_controller_cut_off_from_the_others_cannot_change_metadata(cluster):
    lone = cluster.wait_for_active_controller()  # the worst case: it was the leader
    others = [c for c in cluster.controller_ids if c != lone]
    # Every broker live in its image: the creation below could only be
    # refused for want of a quorum, not answered from the image at once
    # (no live broker to place it on needs no commit).
    wait_until(lambda: all(not b["fenced"] for b in cluster.metadata(lone)["brokers"]), 10,
               "every broker unfenced")
    before = cluster.quorum(lone)
    for other in others:
        cluster.pause(other)
    try:
        url = cluster.nodes[lone].controller_url + "/v1/controller/topics/create"
        status, body = http_json(url, {"topics": [{"name": "split-brain", "num_partitions": 1,
                                                   "replication_factor": 1}]}, timeout_s=10)
        # What each side held, should it ever commit alone.
        assert status in (421, 503), (body, before, cluster.quorum(lone),
                                      [cluster.log_tail(c, 40) for c in cluster.controller_ids])
        assert body["error"]["code"] in ("NOT_CONTROLLER", "REQUEST_TIMED_OUT")
        assert "split-brain" not in topics_of(cluster.metadata(lone))
        # It gives up leadership once no majority answers (fetch timeout).
        wait_until(lambda: not cluster.quorum(lone)["active"]
                   and cluster.quorum(lone)["state"] != "leader", 5, "the lone leader to resign")
        status, body = http_json(url, {"topics": [{"name": "split-brain-2"}]})
        assert (status, body["error"]["code"]) == (421, "NOT_CONTROLLER")
        assert "split-brain-2" not in topics_of(cluster.metadata(lone))
    finally:
        for other in others:
            cluster.resume(other)
    cluster.wait_for_active_controller(10)
    assert create_topic(cluster, "healed", partitions=1)["error"] is None


def test_concurrent_writes_commit_together_and_are_decided_as_if_one_by_one(cluster):
    """Writes that arrive together are committed in shared Raft batches
    (group commit), each decided on the image the earlier ones leave: of two
    creations of one name exactly one succeeds, a name colliding with one
    created in the same batch is refused, and every answer's
    metadata_offset is the offset its own records reached."""
    import concurrent.futures

    active = cluster.wait_for_active_controller()
    before = cluster.quorum(active)["writes"]
    names = [f"group-{i}" for i in range(30)]
    requests = names + names[:5] + ["dotted.name", "dotted_name"]

    def create(name):
        status, body = cluster.controller_call("/v1/controller/topics/create", {
            "topics": [{"name": name, "num_partitions": 2, "replication_factor": 3}]})
        assert status == 200, body
        return body["topics"][0], body["metadata_offset"]

    with concurrent.futures.ThreadPoolExecutor(len(requests)) as pool:
        results = list(pool.map(create, requests))
    outcomes = {}
    for name, (result, _) in zip(requests, results):
        outcomes.setdefault(name, []).append(result["error"] and result["error"]["code"])
    # Each creation wrote three records; each answer names where its own end.
    offsets = [offset for result, offset in results if result["error"] is None]
    assert len(set(offsets)) == len(offsets) == 31
    for name in names[:5]:
        assert set(outcomes[name]) == {None, "TOPIC_ALREADY_EXISTS"}, outcomes[name]
    assert all(outcomes[name] == [None] for name in names[5:])
    assert {outcomes["dotted.name"][0], outcomes["dotted_name"][0]} == {
        None, "INVALID_TOPIC_EXCEPTION"}
    created = {p for name in names for p, _ in topics_of(cluster.metadata(active))[name]}
    assert created == {0, 1}
    after = cluster.quorum(active)["writes"]
    writes = after["committed"] - before["committed"]
    batches = after["batches"] - before["batches"]
    assert writes >= 31  # 30 names and one of the colliding pair (plus any heartbeats)
    assert batches < writes, f"{writes} writes in {batches} batches: nothing was grouped"
    # Whether some of them were also pipelined (proposed while the batch
    # before was in flight) depends on timing here; tests/unit/
    # test_controller_pipeline.py pins the pipeline.


def test_a_killed_broker_is_fenced_at_once_and_loses_its_leaderships(tmp_path):
    """kill -9 closes the broker's connections, among them its presence
    stream to the active controller: it is fenced within a second or two,
    not after its session (20 s here) lapses."""
    settings = {**FAST_SETTINGS, "broker.session.timeout.ms": 20_000,
                "broker.heartbeat.interval.ms": 1000}
    with ProcessCluster(str(tmp_path / "cluster"), controllers=3, brokers=3,
                        settings=settings) as cluster:
        cluster.start()
        cluster.wait_for_active_controller(20)
        cluster.wait_for_brokers_running(timeout_s=20)
        create_topic(cluster, "orders", partitions=6, replication_factor=3)
        active = cluster.wait_for_active_controller()
        before = {p["partition"]: p for p in partitions_of(cluster, active, "orders")}
        victim = before[0]["leader"]
        led = [p for p, reg in before.items() if reg["leader"] == victim]
        cluster.kill(victim)

        def moved():
            now = {p["partition"]: p for p in partitions_of(cluster, active, "orders")}
            return all(now[p]["leader"] not in (victim, -1) for p in led) and now

        # Well inside the 20 s session: the closed connection is the evidence.
        after = wait_until(moved, 5, "leaderships to move off the victim")
        for p in led:
            assert after[p]["leader"] in before[p]["isr"]  # clean: from the ISR
            assert after[p]["leader_epoch"] == before[p]["leader_epoch"] + 1
        for p, reg in after.items():
            assert victim not in reg["isr"]  # fenced replicas leave every ISR
        brokers = {b["broker_id"]: b for b in cluster.metadata(active)["brokers"]}
        assert brokers[victim]["fenced"]
        assert "its process is gone; fencing it now" in cluster.log_tail(active, 200)

        # Restarted, it registers anew (new incarnation, new epoch) and is unfenced.
        old_epoch = brokers[victim]["broker_epoch"]
        cluster.start([victim])
        cluster.wait_for_brokers_running([victim], timeout_s=20)
        brokers = {b["broker_id"]: b for b in cluster.metadata(active)["brokers"]}
        assert not brokers[victim]["fenced"] and brokers[victim]["broker_epoch"] > old_epoch


def test_a_paused_broker_keeps_its_leaderships_until_its_session_lapses(cluster):
    """SIGSTOP closes nothing: a broker paused for less than its session
    keeps everything, and one paused longer is fenced when its lease lapses
    (the backstop for a process that is hung or cut off, not gone)."""
    create_topic(cluster, "paused", partitions=6, replication_factor=3)
    active = cluster.wait_for_active_controller()
    victim = partitions_of(cluster, active, "paused")[0]["leader"]
    since = cluster.quorum(active)["metadata_offset"]
    cluster.pause(victim)
    time.sleep(SESSION_TIMEOUT_S / 2)  # the pause itself: shorter than a session
    cluster.resume(victim)
    status, body = http_json(cluster.nodes[active].controller_url + "/v1/controller/metadata",
                             {"after_offset": since, "max_wait_ms": 0})
    assert status == 200, body
    assert not [r for r in body.get("records", []) if r["type"] == "fence_broker"]
    assert partitions_of(cluster, active, "paused")[0]["leader"] == victim

    time.sleep(SESSION_TIMEOUT_S)  # heartbeats again: a fresh lease
    cluster.pause(victim)
    paused_at = time.monotonic()
    try:
        wait_until(lambda: {b["broker_id"]: b for b in cluster.metadata(active)["brokers"]}
                   [victim]["fenced"], SESSION_TIMEOUT_S + 5, "the paused broker fenced")
        assert time.monotonic() - paused_at > SESSION_TIMEOUT_S * 0.8, "fenced too early"
    finally:
        cluster.resume(victim)
    assert "its process is gone" not in cluster.log_tail(active, 200)


def test_sigterm_moves_a_brokers_leaderships_before_it_exits(cluster):
    create_topic(cluster, "payments", partitions=6, replication_factor=3)
    active = cluster.wait_for_active_controller()
    victim = partitions_of(cluster, active, "payments")[0]["leader"]
    started = time.monotonic()
    cluster.kill(victim, signal.SIGTERM)
    assert cluster.nodes[victim].process.returncode == 0
    # Moved at shutdown, not after a session timeout.
    assert time.monotonic() - started < SESSION_TIMEOUT_S
    partitions = partitions_of(cluster, active, "payments")
    assert all(p["leader"] != victim and victim not in p["isr"] for p in partitions)
    brokers = {b["broker_id"]: b for b in cluster.metadata(active)["brokers"]}
    assert brokers[victim]["fenced"] and brokers[victim]["in_controlled_shutdown"]


def make_active(cluster, target, attempts=10):
    """Move leadership until ``target`` is the active controller, by pausing
    whoever else is active until another is elected (each round gives the
    target an even chance)."""
    for _ in range(attempts):
        active = cluster.wait_for_active_controller()
        if active == target:
            return
        cluster.pause(active)
        try:
            cluster.wait_for_active_controller(5, exclude=(active,))
        finally:
            cluster.resume(active)
    raise AssertionError(f"controller {target} never became active in {attempts} elections")


def test_pausing_the_active_controller_fences_no_live_broker(cluster):
    """A paused controller accepts connections and never answers; brokers
    must find the new active controller before their sessions lapse. The
    lowest id is paused: brokers without a known leader try voters in id
    order, so it is the one they would keep asking."""
    make_active(cluster, min(cluster.controller_ids))
    wait_until(lambda: not any(b["fenced"] for b in cluster.metadata(
        cluster.wait_for_active_controller())["brokers"]), 10, "every broker unfenced")
    old = cluster.wait_for_active_controller()
    since = cluster.quorum(old)["metadata_offset"]
    cluster.pause(old)
    try:
        new = cluster.wait_for_active_controller(5, exclude=(old,))
        url = cluster.nodes[new].controller_url + "/v1/controller/metadata"
        window_end = time.monotonic() + 3 * SESSION_TIMEOUT_S
        while time.monotonic() < window_end:
            status, body = http_json(url, {"after_offset": since, "max_wait_ms": 200})
            assert status == 200, body
            fenced = [r for r in body.get("records", []) if r["type"] == "fence_broker"]
            assert not fenced, f"live brokers were fenced: {fenced}"
        brokers = cluster.metadata(new)["brokers"]
        assert brokers and not any(b["fenced"] for b in brokers)
    finally:
        cluster.resume(old)


def test_a_follower_controller_paused_past_its_election_timeout_deposes_nobody(tmp_path):
    """A follower controller paused for several election timeouts (a long
    GC pause, a starved machine) wakes with its election timer long run
    out. pysyncobj alone would raise the term at once and depose the
    healthy active controller. With pre-vote (KIP-996) it stands only if a
    majority no longer hears the leader: it never stands, the active
    controller keeps its leadership and its term, and what was written
    meanwhile reaches the follower. The election timeout is Kafka's default
    (1 s) rather than the test clusters' 300 ms, so that a loaded machine
    stalling the leader itself does not cause an election of its own."""
    election_ms = 1000
    settings = {**FAST_SETTINGS, "controller.quorum.election.timeout.ms": election_ms,
                "controller.quorum.fetch.timeout.ms": 2 * election_ms,
                "broker.session.timeout.ms": 3 * election_ms,  # above the fetch timeout
                "broker.heartbeat.interval.ms": election_ms // 2}
    pause_s = 3 * election_ms / 1000  # past the longest timer (twice the timeout)
    with ProcessCluster(str(tmp_path / "cluster"), controllers=3, brokers=3,
                        settings=settings) as cluster:
        cluster.start()
        cluster.wait_for_active_controller(20)
        cluster.wait_for_brokers_running(timeout_s=20)
        active = cluster.wait_for_active_controller()
        term = cluster.quorum(active)["term"]
        for n, follower in enumerate(c for c in cluster.controller_ids if c != active):
            won = cluster.quorum(follower).get("pre_votes", {}).get("won")
            cluster.pause(follower)
            try:
                paused_at = time.monotonic()
                create_topic(cluster, f"written-while-paused-{n}")
                offset = cluster.quorum(active)["metadata_offset"]
                time.sleep(max(0.0, pause_s - (time.monotonic() - paused_at)))
            finally:
                cluster.resume(follower)
            wait_until(lambda: (status := cluster.quorum(follower) or {}).get(
                "metadata_offset", -1) >= offset and status.get("leader_id") == active, 10,
                f"controller {follower} following {active} again, caught up")
            assert cluster.active_controller() == active
            assert {c: cluster.quorum(c)["term"] for c in cluster.controller_ids} == \
                dict.fromkeys(cluster.controller_ids, term)
            votes = cluster.quorum(follower)["pre_votes"]
            assert votes["won"] == won, votes  # it never stood


# -- requests answered by one shared cluster (nothing destructive) ------------

@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    with ProcessCluster(str(tmp_path_factory.mktemp("shared")), controllers=3,
                        brokers=3) as c:
        c.start()
        c.wait_for_active_controller(20)
        c.wait_for_brokers_running(timeout_s=20)
        yield c


def post_raw(url, data, content_type="application/msgpack"):
    request = urllib.request.Request(url, data=data, headers={"Content-Type": content_type,
                                                              "Accept": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def test_followers_answer_not_controller_with_the_leaders_address(shared):
    active = shared.wait_for_active_controller()
    for follower in (c for c in shared.controller_ids if c != active):
        def refusal(follower=follower):
            status, body = http_json(shared.nodes[follower].controller_url
                                     + "/v1/controller/topics/create", {"topics": []})
            assert status == 421
            assert body["error"]["code"] == "NOT_CONTROLLER"
            # A follower not yet reached by the new leader knows no leader.
            return body if body["error"].get("leader_id") is not None else None

        body = wait_until(refusal, 10, f"controller {follower} to know the leader")
        assert body["error"]["leader_id"] == active
        assert body["error"]["leader_url"] == shared.nodes[active].controller_url


@pytest.mark.parametrize("topic, code", [
    ({"name": "bad/name"}, "INVALID_TOPIC_EXCEPTION"),
    ({"name": "."}, "INVALID_TOPIC_EXCEPTION"),
    ({"name": "x" * 250}, "INVALID_TOPIC_EXCEPTION"),
    ({"name": "ok-zero", "num_partitions": 0}, "INVALID_PARTITIONS"),
    ({"name": "ok-neg", "num_partitions": -5}, "INVALID_PARTITIONS"),
    ({"name": "ok-rf0", "replication_factor": 0}, "INVALID_REPLICATION_FACTOR"),
    ({"name": "ok-rf4", "replication_factor": 4}, "INVALID_REPLICATION_FACTOR"),
    ({"name": "ok-cfg", "configs": {"retention.mss": "1"}}, "INVALID_CONFIG"),
    ({"name": "ok-cfg2", "configs": {"retention.ms": "soon"}}, "INVALID_CONFIG"),
    ({"name": "ok-cfg3", "configs": {"segment.bytes": 10}}, "INVALID_CONFIG"),
])
def test_bad_topic_creations_get_a_per_topic_error_code(shared, topic, code):
    status, body = shared.controller_call("/v1/controller/topics/create", {"topics": [topic]})
    assert status == 200, body
    (result,) = body["topics"]
    assert result["error"]["code"] == code, result
    assert result["error"]["message"]
    active = shared.wait_for_active_controller()
    assert topic["name"] not in topics_of(shared.metadata(active))


def test_duplicates_and_partition_decreases_are_refused(shared):
    assert create_topic(shared, "dup", partitions=2)["error"] is None
    assert create_topic(shared, "dup")["error"]["code"] == "TOPIC_ALREADY_EXISTS"
    for count, code in ((1, "INVALID_PARTITIONS"), (2, "INVALID_PARTITIONS")):
        status, body = shared.controller_call("/v1/controller/partitions/create", {
            "topics": [{"name": "dup", "count": count}]})
        assert body["topics"][0]["error"]["code"] == code
    status, body = shared.controller_call("/v1/controller/partitions/create", {
        "topics": [{"name": "dup", "count": 4}]})
    assert body["topics"][0]["error"] is None
    active = shared.wait_for_active_controller()
    assert len(topics_of(shared.metadata(active))["dup"]) == 4


@pytest.mark.parametrize("path, data, content_type, code", [
    ("/v1/controller/topics/create", b"\xc1\xc1", "application/msgpack", "INVALID_REQUEST"),
    ("/v1/controller/topics/create", b"{not json", "application/json", "INVALID_REQUEST"),
    ("/v1/controller/brokers/register", b'{"broker_id": 9, "incarnation_id": "\\ud800", '
     b'"endpoints": {"BROKER": "h:1"}}', "application/json", "INVALID_REQUEST"),
    ("/v1/controller/topics/create", msgpack.packb([1, 2]), "application/msgpack",
     "INVALID_REQUEST"),
    ("/v1/controller/topics/create", msgpack.packb({"topics": "orders"}),
     "application/msgpack", "INVALID_REQUEST"),
    ("/v1/controller/topics/create", b"", "application/msgpack", "INVALID_REQUEST"),
    ("/v1/controller/topics/create", b"topics=x", "text/plain", "INVALID_REQUEST"),
    ("/v1/controller/brokers/heartbeat", msgpack.packb({"broker_id": "four"}),
     "application/msgpack", "INVALID_REQUEST"),
    ("/v1/controller/brokers/heartbeat", msgpack.packb(
        {"broker_id": 99, "broker_epoch": 1, "metadata_offset": 0}),
     "application/msgpack", "BROKER_ID_NOT_REGISTERED"),
    ("/v1/controller/partitions/alter", msgpack.packb({"broker_id": True}),
     "application/msgpack", "INVALID_REQUEST"),
    ("/v1/controller/metadata", msgpack.packb({"after_offset": -7}), "application/msgpack",
     "INVALID_REQUEST"),
    ("/v1/controller/metadata", msgpack.packb({"after_offset": 10**9}),
     "application/msgpack", "OFFSET_OUT_OF_RANGE"),
    ("/v1/controller/metadata/stream", msgpack.packb({"after_offset": -7}),
     "application/msgpack", "INVALID_REQUEST"),
    ("/v1/controller/metadata/stream", msgpack.packb({"after_offset": "0"}),
     "application/msgpack", "INVALID_REQUEST"),
    ("/v1/controller/metadata/stream", msgpack.packb({"after_offset": 10**9}),
     "application/msgpack", "OFFSET_OUT_OF_RANGE"),
    ("/v1/controller/nothing-here", msgpack.packb({}), "application/msgpack", "NOT_FOUND"),
    ("/v1/controller/topics/create", b"\x00" * (9 * 1024 * 1024), "application/msgpack",
     "MESSAGE_TOO_LARGE"),
])
def test_malformed_requests_get_a_clear_error_never_a_500(shared, path, data,
                                                          content_type, code):
    active = shared.wait_for_active_controller()
    status, raw = post_raw(shared.nodes[active].controller_url + path, data, content_type)
    body = __import__("json").loads(raw)
    assert 400 <= status < 500, (status, body)
    assert body["error"]["code"] == code, body
    assert shared.quorum(active)["active"]  # and the controller carries on


def test_the_metadata_stream_brings_each_change_as_it_commits(shared):
    """A broker's metadata stream (``metadata/stream``) from an offset: the
    records after it, then each change as it commits, and a frame with no
    records at least every second when nothing commits; from a non-active
    controller's URL it is found at the active one (a NOT_CONTROLLER hint)."""
    active = shared.wait_for_active_controller()
    since = shared.quorum(active)["metadata_offset"]
    others = [n for n in shared.controller_ids if n != active]
    # The client believes a follower leads: the refusal's hint finds the active one.
    client = ControllerClient({n: shared.nodes[n].controller_url for n in shared.controller_ids})
    client.leader_id = others[0]
    frames: list[tuple[float, dict]] = []

    def on_answer(answer: dict) -> bool:  # False ends the stream
        frames.append((time.monotonic(), answer))
        records = [decode(raw) for _, raw in answer.get("records", [])]
        return not any(isinstance(r, TopicRecord) and r.name == "streamed" for r in records)

    async def follow() -> None:
        async with client:
            await asyncio.wait_for(client.follow(
                "/v1/controller/metadata/stream", lambda: {"after_offset": since}, on_answer,
                silence_s=5.0), 30)

    def create_later() -> None:
        # Once the stream has sent nothing but keepalives for a while.
        wait_until(lambda: len(frames) >= 2, 10, "two frames of the stream")
        create_topic(shared, "streamed", partitions=1, replication_factor=3)

    creator = threading.Thread(target=create_later)
    creator.start()
    asyncio.run(follow())
    creator.join(30)
    assert client.leader_id == active
    offsets = [answer["offset"] for _, answer in frames]
    assert offsets == sorted(offsets) and offsets[-1] > since
    quiet_frames = [at for at, answer in frames if not answer.get("records")]
    assert quiet_frames, "no keepalive frame while nothing committed"
    # Keepalives about once a second: a broker can tell a quiet controller from a dead one.
    gaps = [b - a for a, b in zip([at for at, _ in frames], [at for at, _ in frames][1:])]
    assert max(gaps) < 2.5, gaps


def test_alter_partition_is_checked_against_epochs(shared):
    create_topic(shared, "isr-topic", partitions=1, replication_factor=3)
    active = shared.wait_for_active_controller()
    (p0,) = partitions_of(shared, active, "isr-topic")
    brokers = {b["broker_id"]: b for b in shared.metadata(active)["brokers"]}
    leader = p0["leader"]
    request = {"broker_id": leader, "broker_epoch": brokers[leader]["broker_epoch"],
               "topic": "isr-topic", "partition": 0, "leader_epoch": p0["leader_epoch"],
               "partition_epoch": p0["partition_epoch"], "new_isr": [leader]}
    status, body = shared.controller_call("/v1/controller/partitions/alter", request)
    assert status == 200 and body["isr"] == [leader]
    assert body["partition_epoch"] == p0["partition_epoch"] + 1
    status, body = shared.controller_call("/v1/controller/partitions/alter", request)
    assert (status, body["error"]["code"]) == (409, "INVALID_UPDATE_VERSION")
    future = dict(request, leader_epoch=p0["leader_epoch"] + 1,
                  partition_epoch=p0["partition_epoch"] + 1)
    status, body = shared.controller_call("/v1/controller/partitions/alter", future)
    assert (status, body["error"]["code"]) == (409, "UNKNOWN_LEADER_EPOCH")
    follower = next(b for b in p0["replicas"] if b != leader)
    not_leader = dict(request, broker_id=follower,
                      broker_epoch=brokers[follower]["broker_epoch"])
    status, body = shared.controller_call("/v1/controller/partitions/alter", not_leader)
    assert (status, body["error"]["code"]) == (421, "NOT_LEADER_OR_FOLLOWER")


def test_configs_can_be_altered_and_described(shared):
    create_topic(shared, "cfg", partitions=1, configs={"retention.ms": 60000})
    status, body = shared.controller_call("/v1/controller/configs/alter", {"resources": [
        {"type": "topic", "name": "cfg", "ops": [
            {"name": "retention.ms", "op": "set", "value": "120000"},
            {"name": "unclean.leader.election.enable", "op": "set", "value": True}]}]})
    assert status == 200 and body["resources"][0]["error"] is None, body
    status, body = shared.controller_call("/v1/controller/configs/describe", {
        "resources": [{"type": "topic", "name": "cfg"}]})
    configs = {c["name"]: c for c in body["resources"][0]["configs"]}
    assert configs["retention.ms"]["value"] == "120000"
    assert configs["retention.ms"]["source"] == "TOPIC_CONFIG"
    assert configs["unclean.leader.election.enable"]["value"] == "true"
    assert configs["segment.bytes"]["source"] == "DEFAULT_CONFIG"


def test_the_metadata_long_poll_waits_for_a_newer_offset(shared):
    active = shared.wait_for_active_controller()
    url = shared.nodes[active].controller_url + "/v1/controller/metadata"
    # The shared cluster may still be settling (an ISR change after an earlier
    # test's restart), so a poll that returns a newer record is answered early
    # and correctly; the test waits, with a deadline, for a quiet poll.
    deadline = time.monotonic() + 30
    while True:
        offset = shared.quorum(active)["metadata_offset"]
        started = time.monotonic()
        status, body = http_json(url, {"after_offset": offset, "max_wait_ms": 300})
        assert status == 200
        if not body["records"]:
            assert time.monotonic() - started >= 0.25
            break
        assert all(r["offset"] > offset for r in body["records"])
        assert time.monotonic() < deadline, "the metadata log never went quiet"
    status, body = http_json(url, {"after_offset": offset - 1})
    assert [r["offset"] for r in body["records"]][:1] == [offset]


def test_quorum_status_from_the_cli_shows_every_voter(shared):
    broker = shared.broker_ids[0]
    result = subprocess.run(
        [sys.executable, "-m", "api.cli", "--bootstrap", shared.nodes[broker].broker_url,
         "quorum", "status"], capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stderr
    active = shared.wait_for_active_controller()
    assert f"LeaderId:        {active}" in result.stdout
    rows = [line for line in result.stdout.splitlines() if line[:1].isdigit()]
    assert len(rows) == 3 and sum("Leader" in row.split()[1] for row in rows) == 1
    status, body = http_json(shared.nodes[broker].broker_url + "/v1/quorum")
    assert status == 200 and body["leader_id"] == active
    assert all(v["lag"] is not None for v in body["voters"])
