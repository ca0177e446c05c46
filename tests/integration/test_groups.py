"""Consumer groups (KIP-848 style, server-side assignment) against real
``kraftlog node`` processes: one controller and three brokers, shared by the
module, with a 300 ms group heartbeat interval.

What is checked, each with exact outcomes:
  - assignment: every partition owned by exactly one member, counts within
    one of each other, seen both from the consumers (``assignment()``) and
    from the coordinator (``GET /v1/groups/{g}``); a partition is never in
    two members' hands at once while the group grows;
  - two groups on one topic each read every record, exactly once;
  - a member killed with SIGKILL: the survivor takes its partitions after
    the session timeout, and record by record nothing is skipped and the
    only duplicates are the killed member's records after its last commit;
  - the coordinator's broker killed with SIGKILL: the new coordinator loads
    the group, its members and committed offsets;
  - commits from fenced, stale or unknown members are refused and change
    nothing; malformed requests get 400 INVALID_REQUEST, never a 500.

Partitions change hands inside ``poll``, so every wait below keeps polling
every consumer of the group; every wait has a deadline (``wait_until``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import re
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from typing import Callable

import pytest

from api.broker.groups.service import partition_for
from api.client import (
    Admin, AsyncConsumer, Consumer, KraftlogError, NewTopic, Producer, TopicPartition)
from chaos.cluster import FAST_SETTINGS, REPO_ROOT, ProcessCluster, http_json, wait_until

HEARTBEAT_INTERVAL_MS = 300
SETTINGS = {**FAST_SETTINGS, "group.consumer.heartbeat.interval.ms": HEARTBEAT_INTERVAL_MS,
            # Sessions as short as half a second, for tests that wait one out.
            "group.min.session.timeout.ms": 500}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with ProcessCluster(str(tmp_path_factory.mktemp("groups")), controllers=1, brokers=3,
                        settings=SETTINGS) as cluster:
        cluster.start()
        cluster.wait_for_brokers_running(timeout_s=30)
        yield cluster


@pytest.fixture
def healed(cluster):
    """Every broker running again after the test, whatever it did."""
    yield cluster
    restarted = [b for b in cluster.broker_ids if not cluster.nodes[b].running]
    if restarted:
        cluster.start(restarted)
    cluster.wait_for_brokers_running(timeout_s=30)


# -- helpers -------------------------------------------------------------------------

def urls(cluster) -> list[str]:
    return [cluster.nodes[b].broker_url for b in cluster.broker_ids
            if cluster.nodes[b].running and not cluster.nodes[b].paused]


def broker_get(cluster, path: str) -> dict:
    """GET ``path`` (JSON) from the first running broker that answers 200."""
    last = None
    for url in urls(cluster):
        try:
            status, body = http_json(url + path)
        except OSError as exc:
            last = exc
            continue
        if status == 200:
            return body
        last = (status, body)
    raise AssertionError(f"no broker answered GET {path}: {last}")


def topic_partitions(cluster, name: str) -> list[dict]:
    return broker_get(cluster, f"/v1/topics/{name}")["partitions"]


def create_topic(cluster, name: str, partitions: int) -> list[TopicPartition]:
    with Admin(urls(cluster)) as admin:
        admin.create_topics([NewTopic(name, partitions, 3)])
    wait_until(lambda: len(parts := topic_partitions(cluster, name)) == partitions and all(
        p["leader"] >= 0 and len(p["isr"]) == 3 for p in parts), 30,
        f"{name}: a leader and three in-sync replicas for every partition")
    return [TopicPartition(name, p) for p in range(partitions)]


def produce(cluster, topic: str, values: list[bytes], partition: int | None = None
            ) -> dict[bytes, tuple[int, int]]:
    """Send ``values`` (keyed by themselves), acks=all; value -> (partition, offset)."""
    with Producer(urls(cluster), acks="all", linger_ms=2) as producer:
        handles = [(v, producer.send(topic, v, key=v, partition=partition)) for v in values]
        producer.flush()
        out = {}
        for value, handle in handles:
            meta = handle.result(timeout=30)
            out[value] = (meta.partition, meta.offset)
    return out


def find_coordinator(cluster, group: str) -> dict:
    """Where the group lives, once that broker serves it (its groups loaded)."""
    def ask():
        for url in urls(cluster):
            try:
                status, body = http_json(url + "/v1/groups/coordinator", {"group_id": group})
                if status != 200:
                    continue
                ready, _ = http_json(body["coordinator_url"] + "/v1/groups/offsets/fetch",
                                     {"group_id": group})
            except OSError:
                continue
            if ready == 200:
                return body
        return None
    return wait_until(ask, 20, f"a coordinator serving group {group}")


def describe_group(cluster, group: str) -> dict:
    return broker_get(cluster, f"/v1/groups/{group}")


def member_id(consumer: Consumer) -> str:
    """The member id the coordinator gave this consumer ("" before it joined)."""
    group = consumer._consumer._group  # noqa: SLF001  the id is not public API
    return group.member_id if group is not None else ""


def tps(pairs) -> set[TopicPartition]:
    return {TopicPartition(t, p) for t, p in pairs}


def poll_round(consumers: list[Consumer], sink: list[list] | None = None,
               timeout_ms: int = 20) -> None:
    """One poll of every consumer (partitions change hands inside poll)."""
    for i, consumer in enumerate(consumers):
        records = consumer.poll(timeout_ms=timeout_ms)
        if sink is not None:
            sink[i].extend(records)


def settled(cluster, group: str, consumers: list[Consumer], sink: list[list] | None = None
            ) -> list[set[TopicPartition]] | None:
    """After one poll round: each consumer's assignment, if the coordinator
    calls the group stable, knows exactly these members, and gives each
    exactly what the consumer holds; else None."""
    poll_round(consumers, sink)
    described = describe_group(cluster, group)
    if described["state"] != "stable":
        return None
    server = {m["member_id"]: tps(m["assigned"]) for m in described["members"]}
    if any(m["pending_revocation"] for m in described["members"]):
        return None
    client = {member_id(c): c.assignment() for c in consumers}
    if "" in client or server != client:
        return None
    return [client[member_id(c)] for c in consumers]


def wait_settled(cluster, group: str, consumers: list[Consumer],
                 sink: list[list] | None = None, timeout_s: float = 20
                 ) -> list[set[TopicPartition]]:
    return wait_until(lambda: settled(cluster, group, consumers, sink), timeout_s,
                      f"group {group} stable with {len(consumers)} members, the consumers "
                      f"holding what the coordinator assigned", interval_s=0)


def assert_partitioned(assignments: list[set[TopicPartition]], everything: set) -> None:
    """Every partition owned by exactly one consumer; counts within one."""
    owners = {}
    for i, owned in enumerate(assignments):
        for tp in owned:
            assert tp not in owners, f"{tp} owned by consumers {owners[tp]} and {i}"
            owners[tp] = i
    assert set(owners) == everything, f"unowned: {sorted(everything - set(owners))}"
    counts = [len(a) for a in assignments]
    assert max(counts) - min(counts) <= 1, counts


def group_consumer(cluster, group: str, **settings) -> Consumer:
    settings.setdefault("auto_offset_reset", "earliest")
    return Consumer(urls(cluster), group_id=group, fetch_max_wait_ms=100, **settings)


def post(url: str, data: bytes, content_type: str = "application/json") -> tuple[int, object]:
    """POST raw bytes; (status, decoded JSON answer)."""
    request = urllib.request.Request(url, data=data, headers={
        "Content-Type": content_type, "Accept": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.load(response)
    except urllib.error.HTTPError as exc:
        return exc.code, json.load(exc)


def join_raw(coordinator_url: str, group: str, topics: list[str], **extra) -> dict:
    status, body = http_json(coordinator_url + "/v1/groups/heartbeat", {
        "group_id": group, "member_id": "", "member_epoch": 0,
        "subscribed_topic_names": topics, **extra})
    assert status == 200, body
    return body


def heartbeat_raw(coordinator_url: str, group: str, member: str, epoch: int,
                  owned: list | None = None) -> dict:
    status, body = http_json(coordinator_url + "/v1/groups/heartbeat", {
        "group_id": group, "member_id": member, "member_epoch": epoch,
        "owned_partitions": owned or []})
    assert status == 200, body
    return body


def commit_raw(coordinator_url: str, group: str, member: str, epoch: int,
               offsets: list[tuple[str, int, int]]) -> tuple[int, dict]:
    return http_json(coordinator_url + "/v1/groups/offsets/commit", {
        "group_id": group, "member_id": member, "member_epoch": epoch,
        "offsets": [{"topic": t, "partition": p, "offset": o} for t, p, o in offsets]})


def fetch_offsets_raw(coordinator_url: str, group: str) -> dict[tuple[str, int], int]:
    status, body = http_json(coordinator_url + "/v1/groups/offsets/fetch", {"group_id": group})
    assert status == 200, body
    return {(e["topic"], e["partition"]): e["offset"] for e in body["partitions"]}


# -- 7. bad input ----------------------------------------------------------------------

def test_malformed_heartbeats_and_negative_commits_are_refused_never_a_500(cluster):
    group, topic = "bad-input", "bad-input"
    create_topic(cluster, topic, 2)
    coordinator = find_coordinator(cluster, group)["coordinator_url"]
    heartbeat = coordinator + "/v1/groups/heartbeat"
    join = {"group_id": group, "member_id": "", "member_epoch": 0,
            "subscribed_topic_names": [topic]}
    malformed = {
        "missing group_id": {k: v for k, v in join.items() if k != "group_id"},
        "empty group_id": {**join, "group_id": ""},
        "group_id a number": {**join, "group_id": 7},
        "missing member_epoch": {k: v for k, v in join.items() if k != "member_epoch"},
        "member_epoch a string": {**join, "member_epoch": "0"},
        "member_epoch a float": {**join, "member_epoch": 0.5},
        "member_epoch a bool": {**join, "member_epoch": False},
        "member_epoch below -2": {**join, "member_epoch": -3},
        "member_epoch too big": {**join, "member_epoch": 2**40},
        "epoch without member id": {**join, "member_epoch": 3},
        "owned_partitions a string": {**join, "owned_partitions": "bad-input-0"},
        "owned_partitions a map": {**join, "owned_partitions": {"topic": topic,
                                                                "partitions": [0]}},
        "owned_partitions items not maps": {**join, "owned_partitions": [0, 1]},
        "owned partitions not a list": {**join, "owned_partitions": [
            {"topic": topic, "partitions": 0}]},
        "owned partition negative": {**join, "owned_partitions": [
            {"topic": topic, "partitions": [-1]}]},
        "joining with owned partitions": {**join, "owned_partitions": [
            {"topic": topic, "partitions": [0]}]},
        "subscribed_topic_names a string": {**join, "subscribed_topic_names": topic},
        "subscribed topic name empty": {**join, "subscribed_topic_names": [""]},
        "no subscription on join": {k: v for k, v in join.items()
                                    if k != "subscribed_topic_names"},
        "regex unbalanced": {**join, "subscribed_topic_regex": "bad-(input"},
        "regex bad range": {**join, "subscribed_topic_regex": "[z-a]"},
        "regex bad escape": {**join, "subscribed_topic_regex": "bad\\"},
        "session timeout 0": {**join, "session_timeout_ms": 0},
        "rebalance timeout negative": {**join, "rebalance_timeout_ms": -1},
    }
    answers = {why: post(heartbeat, json.dumps(body).encode())
               for why, body in malformed.items()}
    answers["not JSON"] = post(heartbeat, b"{group_id: ")
    answers["a list"] = post(heartbeat, b"[1, 2]")
    answers["empty body"] = post(heartbeat, b"")
    wrong = {why: (status, body) for why, (status, body) in answers.items()
             if status != 400 or body.get("error", {}).get("code") != "INVALID_REQUEST"
             or not body["error"].get("message")}
    assert not wrong, f"not 400 INVALID_REQUEST with a message: {wrong}"
    status, body = post(heartbeat, json.dumps({**join, "server_assignor": "nope"}).encode())
    assert (status, body["error"]["code"]) == (400, "UNSUPPORTED_ASSIGNOR"), body
    # None of that made a member.
    assert describe_group(cluster, group)["members"] == []
    # (A regex Python refuses with OverflowError rather than re.error: the next test.)

    # A real member commits; a negative offset is refused per partition and
    # commits nothing, while the request's good partition is committed.
    member = join_raw(coordinator, group, [topic])
    mid, epoch = member["member_id"], member["member_epoch"]
    status, body = commit_raw(coordinator, group, mid, epoch, [(topic, 0, -1), (topic, 1, -5)])
    assert status == 200, body
    assert [(e["partition"], e["error"] and e["error"]["code"]) for e in body["partitions"]] \
        == [(0, "INVALID_REQUEST"), (1, "INVALID_REQUEST")]
    assert fetch_offsets_raw(coordinator, group) == {}
    status, body = commit_raw(coordinator, group, mid, epoch, [(topic, 0, 7), (topic, 1, -1)])
    assert status == 200, body
    assert [(e["partition"], e["error"] and e["error"]["code"]) for e in body["partitions"]] \
        == [(0, None), (1, "INVALID_REQUEST")]
    assert fetch_offsets_raw(coordinator, group) == {(topic, 0): 7}
    # Malformed commits are refused whole.
    commit = coordinator + "/v1/groups/offsets/commit"
    good = {"group_id": group, "member_id": mid, "member_epoch": epoch}
    for offsets in ("x", [{"topic": topic, "partition": 0, "offset": "9"}],
                    [{"topic": topic, "partition": -1, "offset": 9}],
                    [{"topic": "", "partition": 0, "offset": 9}], [9]):
        status, body = post(commit, json.dumps({**good, "offsets": offsets}).encode())
        assert (status, body["error"]["code"]) == (400, "INVALID_REQUEST"), (offsets, body)
    assert fetch_offsets_raw(coordinator, group) == {(topic, 0): 7}
    offsets = {(o["topic"], o["partition"]): o["offset"]
               for o in describe_group(cluster, group)["offsets"]}
    assert offsets == {(topic, 0): 7}
    # The broker is still well: the member heartbeats on.
    assert heartbeat_raw(coordinator, group, mid, epoch, [
        {"topic": topic, "partitions": [0, 1]}])["member_epoch"] == epoch


def test_a_regex_too_large_to_compile_is_invalid_request_not_a_server_error(cluster):
    """``a{4294967296}`` fails ``re.compile`` with OverflowError, not
    re.error. Before f84366b the coordinator's check caught only re.error
    and the heartbeat answered 500 UNKNOWN_SERVER_ERROR."""
    group = "bad-regex"
    coordinator = find_coordinator(cluster, group)["coordinator_url"]
    for regex in ("a{4294967296}", "x{1,99999999999}"):
        status, body = post(coordinator + "/v1/groups/heartbeat", json.dumps({
            "group_id": group, "member_id": "", "member_epoch": 0,
            "subscribed_topic_regex": regex}).encode())
        assert (status, body["error"]["code"]) == (400, "INVALID_REQUEST"), (regex, status, body)
        assert regex in body["error"]["message"], body
    assert describe_group(cluster, group)["members"] == []


# -- 6. fenced, stale and unknown members ---------------------------------------------------

def test_commits_of_stale_fenced_and_unknown_members_are_refused_and_change_nothing(cluster):
    group, topic = "fenced", "fenced"
    create_topic(cluster, topic, 1)
    coordinator = find_coordinator(cluster, group)["coordinator_url"]
    # Members subscribe to a topic that does not exist: no partitions, so
    # every join moves the group epoch and no revocation holds anyone back.
    nowhere = ["fenced-no-such-topic"]
    a = join_raw(coordinator, group, nowhere)
    a_id = a["member_id"]
    join_raw(coordinator, group, nowhere)
    epoch = heartbeat_raw(coordinator, group, a_id, a["member_epoch"])["member_epoch"]
    join_raw(coordinator, group, nowhere)
    previous, epoch = epoch, heartbeat_raw(coordinator, group, a_id, epoch)["member_epoch"]
    assert a["member_epoch"] < previous < epoch
    member = next(m for m in describe_group(cluster, group)["members"]
                  if m["member_id"] == a_id)
    assert (member["member_epoch"], member["previous_member_epoch"]) == (epoch, previous)

    status, body = commit_raw(coordinator, group, a_id, epoch, [(topic, 0, 5)])
    assert (status, body["partitions"][0]["error"]) == (200, None), body
    assert fetch_offsets_raw(coordinator, group) == {(topic, 0): 5}

    refused = {
        # older than both the current and the previous epoch
        "stale": (a_id, a["member_epoch"], "STALE_MEMBER_EPOCH"),
        "ahead": (a_id, epoch + 1, "FENCED_MEMBER_EPOCH"),
        "unknown id": ("no-such-member", epoch, "UNKNOWN_MEMBER_ID"),
        # the admin form while the group has members
        "admin": ("", -1, "UNKNOWN_MEMBER_ID"),
    }
    for why, (mid, member_epoch, code) in refused.items():
        status, body = commit_raw(coordinator, group, mid, member_epoch, [(topic, 0, 99)])
        assert status == 409 and body["error"]["code"] == code, (why, status, body)
        assert body["error"]["message"], (why, body)
    assert fetch_offsets_raw(coordinator, group) == {(topic, 0): 5}

    # A member the coordinator removed (its session ran out) is fenced too.
    gone = join_raw(coordinator, group, nowhere, session_timeout_ms=500)
    wait_until(lambda: gone["member_id"] not in
               {m["member_id"] for m in describe_group(cluster, group)["members"]},
               10, "the silent member removed after its 500 ms session")
    status, body = commit_raw(coordinator, group, gone["member_id"], gone["member_epoch"],
                              [(topic, 0, 99)])
    assert status == 409 and body["error"]["code"] == "UNKNOWN_MEMBER_ID", body
    # Its heartbeat is refused the same way (it must rejoin with epoch 0).
    status, body = http_json(coordinator + "/v1/groups/heartbeat", {
        "group_id": group, "member_id": gone["member_id"],
        "member_epoch": gone["member_epoch"]})
    assert status == 409 and body["error"]["code"] == "UNKNOWN_MEMBER_ID", body
    assert fetch_offsets_raw(coordinator, group) == {(topic, 0): 5}
    offsets = {(o["topic"], o["partition"]): o["offset"]
               for o in describe_group(cluster, group)["offsets"]}
    assert offsets == {(topic, 0): 5}

    # The previous epoch is still accepted (the response that moved the
    # member on may have been lost), as the coordinator documents.
    status, body = commit_raw(coordinator, group, a_id, previous, [(topic, 0, 6)])
    assert (status, body["partitions"][0]["error"]) == (200, None), body
    assert fetch_offsets_raw(coordinator, group) == {(topic, 0): 6}


# -- 1. one to four consumers on three partitions ---------------------------------------

def test_one_to_four_consumers_share_three_partitions(cluster):
    group, topic = "grow-3", "grow-3"
    everything = set(create_topic(cluster, topic, 3))
    with contextlib.ExitStack() as stack:
        consumers: list[Consumer] = []
        history = []
        for n in range(1, 5):
            consumer = stack.enter_context(group_consumer(cluster, group))
            consumer.subscribe([topic])
            consumers.append(consumer)
            assignments = wait_settled(cluster, group, consumers)
            assert_partitioned(assignments, everything)
            assert sorted(len(a) for a in assignments) == {
                1: [3], 2: [1, 2], 3: [1, 1, 1], 4: [0, 1, 1, 1]}[n]
            history.append(assignments)
            described = describe_group(cluster, group)
            assert len(described["members"]) == n
            assert {m["member_id"] for m in described["members"]} == \
                {member_id(c) for c in consumers}
        # Sticky: the fourth changed nothing for the first three, and owns nothing.
        assert history[3][:3] == history[2]
        assert history[3][3] == set()
        # Every broker tells the same: listed, and described alike.
        coordinator_id = find_coordinator(cluster, group)["coordinator_id"]
        owned = {member_id(c): a for c, a in zip(consumers, history[3])}
        for url in urls(cluster):
            listed = [g for g in http_json(url + "/v1/groups")[1]["groups"]
                      if g["group_id"] == group]
            assert [(g["state"], g["members"], g["coordinator_id"]) for g in listed] == \
                [("stable", 4, coordinator_id)], (url, listed)
            status, described = http_json(f"{url}/v1/groups/{group}")
            assert status == 200, described
            assert {m["member_id"]: tps(m["assigned"]) for m in described["members"]} == \
                owned, url


def test_any_broker_describes_a_group_whose_id_needs_quoting_in_a_url(cluster):
    """Group ids are free text (Kafka allows any); ``GET /v1/groups/{g}``
    with the id percent-encoded must describe that group from any broker.
    Before f84366b a broker that was not the coordinator forwarded the
    request with the id unquoted (api/broker/groups/api.py handle_describe),
    so ids with "/" or "#" came back 404 or 421, and "q0?a" came back 200
    describing group "q0" (same coordinator): another group's members and
    offsets."""
    topic = "quoted-ids"
    create_topic(cluster, topic, 1)
    find_coordinator(cluster, "quoted-ids")  # creates __consumer_offsets if need be
    count = wait_until(lambda: len(topic_partitions(cluster, "__consumer_offsets")), 20,
                       "__consumer_offsets")
    # A group and one named like it plus "?...", on the same coordinator.
    base, lookalike = next((f"q{i}", f"q{i}?{c}") for i in range(100) for c in "abcdefghij"
                           if partition_for(f"q{i}", count) == partition_for(f"q{i}?{c}", count))
    groups = [base, lookalike, "team/alpha", "a#b", "with space", "100%", ".", ".."]
    members = {}
    for group in groups:
        coordinator = find_coordinator(cluster, group)["coordinator_url"]
        members[group] = join_raw(coordinator, group, [topic])["member_id"]
    wrong = []
    for group in groups:
        coordinator = find_coordinator(cluster, group)["coordinator_url"]
        quoted = urllib.parse.quote(group, safe="")
        # "." and ".." are dropped from a URL's path by browsers and by
        # aiohttp's client: those ids are asked for as ?group_id= (the console
        # always does so).
        paths = [f"/v1/groups?group_id={quoted}"] + (
            [f"/v1/groups/{quoted}"] if group not in (".", "..") else [])
        for url in urls(cluster):
            for path in paths:
                status, body = http_json(url + path)
                got = (status, body.get("group_id"),
                       [m["member_id"] for m in body.get("members") or ()])
                if got != (200, group, [members[group]]):
                    node = "the coordinator" if url == coordinator else "another broker"
                    wrong.append(f"{path} from {node}: {status} group_id="
                                 f"{body.get('group_id')!r} error={body.get('error')}")
    for group in groups:  # leave
        coordinator = find_coordinator(cluster, group)["coordinator_url"]
        http_json(coordinator + "/v1/groups/heartbeat", {
            "group_id": group, "member_id": members[group], "member_epoch": -1})
    assert not wrong, "\n".join(wrong)


# -- 2. never two owners at once ---------------------------------------------------------

def hand_over_listeners(events: list) -> Callable[[int], dict]:
    """Per consumer i, rebalance listeners that note (time, i, "+"/"-",
    partitions) in ``events``."""
    def listeners(i: int) -> dict:
        def note(kind: str):
            return lambda partitions: events.append((time.monotonic(), i, kind, partitions))
        return {"on_partitions_assigned": note("+"), "on_partitions_revoked": note("-")}
    return listeners


def test_a_partition_is_never_in_two_consumers_hands_while_the_group_grows(cluster):
    group, topic = "handoff-4", "handoff-4"
    everything = set(create_topic(cluster, topic, 4))
    # Every hand-over as the consumers' listeners see it: (time, consumer,
    # "+"/"-", partitions). poll calls them before it returns records of a
    # partition given, and after the last records of one taken away.
    events: list[tuple[float, int, str, set]] = []
    listeners = hand_over_listeners(events)

    with contextlib.ExitStack() as stack:
        consumers = [stack.enter_context(group_consumer(cluster, group)) for _ in range(2)]
        for i, consumer in enumerate(consumers):
            consumer.subscribe([topic], **listeners(i))
        before = wait_settled(cluster, group, consumers)
        assert sorted(len(a) for a in before) == [2, 2]
        newcomer = stack.enter_context(group_consumer(cluster, group))
        newcomer.subscribe([topic], **listeners(2))
        consumers.append(newcomer)

        observations = 0
        changes = 0
        last = None
        deadline = time.monotonic() + 20
        while True:
            assert time.monotonic() < deadline, "the group did not settle with 3 members"
            poll_round(consumers)
            snapshot = [c.assignment() for c in consumers]
            observations += 1
            owners: dict[TopicPartition, int] = {}
            for i, owned in enumerate(snapshot):
                for tp in owned:
                    assert tp not in owners, \
                        f"observation {observations}: {tp} held by consumers " \
                        f"{owners[tp]} and {i}: {snapshot}"
                    owners[tp] = i
            # The coordinator's view holds to the same rule.
            described = describe_group(cluster, group)
            held = [tp for m in described["members"]
                    for tp in tps(m["assigned"]) | tps(m["pending_revocation"])]
            assert len(held) == len(set(held)), described["members"]
            if snapshot != last:
                changes += 1
                last = snapshot
            if settled(cluster, group, consumers) is not None:
                break
        final = [c.assignment() for c in consumers]
        assert_partitioned(final, everything)
        assert sorted(len(a) for a in final[:2]) == [1, 2]
        assert len(final[2]) == 1
        # One partition moved: from an old member to the newcomer, and the
        # old members kept the rest.
        assert final[0] <= before[0] and final[1] <= before[1]
        assert changes >= 1 and observations >= 1
    # The hand-over as it happened, however quickly (watching members may
    # finish it within one round of polls): given to the newcomer only
    # after its old owner gave it up.
    (moved,) = final[2]
    old_owner = 0 if moved in before[0] else 1
    given = [at for at, i, kind, parts in events if i == 2 and kind == "+" and moved in parts]
    taken = [at for at, i, kind, parts in events
             if i == old_owner and kind == "-" and moved in parts]
    assert len(given) == 1 and len(taken) == 1, events
    assert taken[0] <= given[0], events


def test_a_heartbeat_answered_after_a_take_never_hands_the_partitions_on_behind_its_back(
        cluster):
    """A member told to take partitions counts them as owned from then on.
    The race this pins down (what ``kraftlog bench rebalance`` once caught
    as two members holding one partition): the member is reading the
    committed offsets of the partitions it was told to take; the group
    grows; a heartbeat goes out, is handled by the coordinator, and its
    answer (take back half) arrives only after the take finished. Had that
    heartbeat said "owning nothing", the coordinator would have handed half
    to the newcomer while the member went on to take all. It says what the
    member was told to take, so the newcomer gets its half only after the
    member gave it up."""
    group, topic = "still-taking", "still-taking"
    everything = set(create_topic(cluster, topic, 4))
    deadline_s = 20

    async def scenario() -> list[tuple[float, int, str, set]]:
        events: list[tuple[float, int, str, set]] = []
        listeners = hand_over_listeners(events)
        first = AsyncConsumer(urls(cluster), group_id=group, enable_auto_commit=False)
        second = AsyncConsumer(urls(cluster), group_id=group, enable_auto_commit=False)
        stop = asyncio.Event()

        async def keep_polling(consumer: AsyncConsumer) -> None:
            while not stop.is_set():
                await consumer.poll(timeout_ms=20)

        async def until(check: Callable[[], bool], what: str) -> None:
            deadline = time.monotonic() + deadline_s
            while not check():
                assert time.monotonic() < deadline, f"waited {deadline_s} s for {what}"
                await asyncio.sleep(0.01)

        first.subscribe([topic], **listeners(0))
        member = first._group  # noqa: SLF001  the interleaving needs the member's steps
        # Hold the first member inside its take (between being told and
        # taking), and later hold a heartbeat's answer until the take is over.
        taking, go_on = asyncio.Event(), asyncio.Event()
        late_answer: list[dict] = []
        hand_over = asyncio.Event()
        read_committed, call = member.fetch_committed, member._call

        async def held_take(tps):
            taking.set()
            await go_on.wait()
            return await read_committed(tps)

        def new_target(answer: dict) -> int | None:
            assigned = answer.get("assignment")
            return None if assigned is None else sum(len(e["partitions"]) for e in assigned)

        async def late_heartbeats(path, body, timeout_ms=None):
            answer = await call(path, body, timeout_ms)
            if path == "/v1/groups/heartbeat" and taking.is_set() and \
                    new_target(answer) == 2 and not hand_over.is_set():
                late_answer.append(answer)  # handled by the coordinator; not yet heard
                await hand_over.wait()
            return answer

        member.fetch_committed = held_take
        member._call = late_heartbeats
        tasks = [asyncio.create_task(keep_polling(first))]
        try:
            await until(taking.is_set, "the first member to be told to take all 4")
            assert member.target == everything and not first.assignment()
            second.subscribe([topic], **listeners(1))
            tasks.append(asyncio.create_task(keep_polling(second)))
            # A heartbeat of the first member after the newcomer joined has
            # been handled (its answer: keep two), and is held.
            await until(lambda: bool(late_answer),
                        "a heartbeat of the first member answered with its new target")
            described = await asyncio.to_thread(describe_group, cluster, group)
            held_by = {m["member_id"]: tps(m["assigned"]) | tps(m["pending_revocation"])
                       for m in described["members"]}
            assert held_by[member.member_id] == everything, described
            go_on.set()  # the take finishes: all four, the answer not yet heard
            await until(lambda: first.assignment() == everything, "the take of all four")
            assert not second.assignment()
            hand_over.set()
            await until(lambda: len(first.assignment()) == 2 and len(second.assignment()) == 2,
                        "two partitions each")
        finally:
            go_on.set()
            hand_over.set()
            stop.set()
            await asyncio.gather(*tasks, return_exceptions=True)
            await first.close()
            await second.close()
        return events

    events = asyncio.run(scenario())
    holder: dict[TopicPartition, int] = {}
    for _, i, kind, parts in sorted(events, key=lambda e: e[0]):
        for tp in parts:
            if kind == "+":
                assert tp not in holder, f"{tp} given to {i} while {holder[tp]} held it: {events}"
                holder[tp] = i
            else:
                assert holder.pop(tp) == i, events
    assert not holder
    # The first member took all four, then gave two up before the second took them.
    assert [(i, k, len(p)) for _, i, k, p in sorted(events, key=lambda e: e[0])][:3] == [
        (0, "+", 4), (0, "-", 2), (1, "+", 2)], events


def test_closing_a_member_calls_its_revoke_listener_before_others_get_its_partitions(cluster):
    """As Kafka's consumer does: ``close`` tells ``on_partitions_revoked``
    of what the member still owns before it leaves, so the listener runs
    while nobody else can hold those partitions."""
    group, topic = "close-revokes", "close-revokes"
    everything = set(create_topic(cluster, topic, 4))
    events: list[tuple[float, int, str, set]] = []
    listeners = hand_over_listeners(events)

    with group_consumer(cluster, group) as stays:
        stays.subscribe([topic], **listeners(0))
        leaving = group_consumer(cluster, group)
        leaving.subscribe([topic], **listeners(1))
        before = wait_settled(cluster, group, [stays, leaving])
        assert_partitioned(before, everything)
        given_up = before[1]
        # stays may have held all four before leaving joined (and given two
        # up since): only what it is given after the close counts here.
        mark = len(events)
        leaving.close()
        closed = [(at, parts) for at, i, kind, parts in events[mark:]
                  if i == 1 and kind == "-"]
        assert len(closed) == 1 and closed[0][1] == given_up, events
        (after,) = wait_settled(cluster, group, [stays])
        assert after == everything
        taken = [at for at, i, kind, parts in events[mark:] if i == 0 and kind == "+"
                 and parts & given_up]
        assert taken and all(closed[0][0] <= at for at in taken), events


def watch_raw(coordinator_url: str, group: str, member: str, max_wait_ms: int
              ) -> tuple[int, dict]:
    return http_json(coordinator_url + "/v1/groups/watch", {
        "group_id": group, "member_id": member, "max_wait_ms": max_wait_ms},
        timeout_s=max_wait_ms / 1000 + 10)


def test_a_watch_answers_when_the_members_heartbeat_has_news_and_changes_nothing(cluster):
    """The watch, step by step: an old member hears of a newcomer, the
    newcomer hears of the release, and neither waits for a heartbeat."""
    group, topic = "watch-steps", "watch-steps"
    create_topic(cluster, topic, 2)
    coordinator = find_coordinator(cluster, group)["coordinator_url"]
    a = join_raw(coordinator, group, [topic])
    a_id, a_epoch = a["member_id"], a["member_epoch"]
    both = [{"topic": topic, "partitions": [0, 1]}]
    assert a["assignment"] == both
    # Nothing new for a: the watch runs out and says so.
    assert watch_raw(coordinator, group, a_id, 300) == (200, {"news": False})

    answers: dict[str, tuple] = {}

    def watch(name: str, member: str) -> threading.Thread:
        thread = threading.Thread(target=lambda: answers.__setitem__(
            name, watch_raw(coordinator, group, member, 60_000)), daemon=True)
        thread.start()
        return thread

    a_watch = watch("a", a_id)
    # b joins, which gives b a partition a holds (a watch placed after that
    # answers at once, one placed before is woken: both say news).
    b = join_raw(coordinator, group, [topic])
    b_id = b["member_id"]
    assert b["assignment"] == []
    a_watch.join(timeout=20)
    assert answers.get("a") == (200, {"news": True}), answers
    # The watch changed nothing; the heartbeat tells a to give one up.
    revoked = heartbeat_raw(coordinator, group, a_id, a_epoch, both)
    kept = revoked["assignment"]
    assert revoked["member_epoch"] == a_epoch and len(kept[0]["partitions"]) == 1
    b_watch = watch("b", b_id)
    released = heartbeat_raw(coordinator, group, a_id, a_epoch, kept)
    assert released["member_epoch"] > a_epoch
    b_watch.join(timeout=20)
    assert answers.get("b") == (200, {"news": True}), answers
    given = heartbeat_raw(coordinator, group, b_id, b["member_epoch"])
    assert len(given["assignment"][0]["partitions"]) == 1
    # Bad watches: unknown member, malformed fields.
    status, body = watch_raw(coordinator, group, "nobody", 100)
    assert (status, body["error"]["code"]) == (409, "UNKNOWN_MEMBER_ID"), body
    url = coordinator + "/v1/groups/watch"
    good = {"group_id": group, "member_id": b_id, "max_wait_ms": 100}
    for bad in ({**good, "max_wait_ms": -1}, {**good, "max_wait_ms": 10**9},
                {**good, "max_wait_ms": "1"}, {k: v for k, v in good.items()
                                               if k != "member_id"},
                {**good, "group_id": ""}, [1]):
        status, body = post(url, json.dumps(bad).encode())
        assert (status, body["error"]["code"]) == (400, "INVALID_REQUEST"), (bad, body)
    for member in (a_id, b_id):
        heartbeat_raw(coordinator, group, member, -1)


def test_a_rebalance_does_not_wait_for_heartbeats(tmp_path):
    """With a heartbeat interval of a minute, a member joining and one
    leaving are both settled in seconds: the members watch, and heartbeat
    as soon as the coordinator has something for them."""
    minute = 60_000
    settings = {**FAST_SETTINGS, "group.consumer.heartbeat.interval.ms": minute,
                "offsets.topic.replication.factor": 1}
    with ProcessCluster(str(tmp_path), controllers=1, brokers=1, settings=settings) as slow, \
            contextlib.ExitStack() as stack:
        slow.start()
        slow.wait_for_brokers_running(timeout_s=30)
        group, topic = "no-wait", "no-wait"
        with Admin(urls(slow)) as admin:
            admin.create_topics([NewTopic(topic, 4, 1)])
        everything = {TopicPartition(topic, p) for p in range(4)}
        consumers = [stack.enter_context(group_consumer(slow, group, session_timeout_ms=120_000))
                     for _ in range(2)]
        for consumer in consumers:
            consumer.subscribe([topic])
        assert_partitioned(wait_settled(slow, group, consumers, timeout_s=30), everything)
        newcomer = stack.enter_context(group_consumer(slow, group, session_timeout_ms=120_000))
        newcomer.subscribe([topic])
        consumers.append(newcomer)
        assert_partitioned(wait_settled(slow, group, consumers, timeout_s=20), everything)
        consumers.pop(0).close()
        # The deadlines are the check: without the watch, the old members
        # hear of the newcomer, and the newcomer of the released partitions,
        # only at their next heartbeat, a minute on.
        assert_partitioned(wait_settled(slow, group, consumers, timeout_s=20), everything)


# -- 3. two groups, one topic --------------------------------------------------------------

def test_two_groups_on_one_topic_each_read_every_record(cluster):
    topic = "two-groups"
    create_topic(cluster, topic, 3)
    values = [b"two-groups-%d" % i for i in range(300)]
    # Half before the groups exist (read while they form), half once they are stable.
    produced = produce(cluster, topic, values[:150])
    with contextlib.ExitStack() as stack:
        groups = {"two-groups-a": 2, "two-groups-b": 1}
        members = {g: [stack.enter_context(group_consumer(cluster, g)) for _ in range(n)]
                   for g, n in groups.items()}
        for consumers in members.values():
            for consumer in consumers:
                consumer.subscribe([topic])
        read = {g: [[] for _ in consumers] for g, consumers in members.items()}
        for g, consumers in members.items():
            assert_partitioned(wait_settled(cluster, g, consumers, read[g]),
                               {TopicPartition(topic, p) for p in range(3)})
        produced.update(produce(cluster, topic, values[150:]))

        def everything_read() -> bool:
            for g, consumers in members.items():
                poll_round(consumers, read[g])
            return all(sum(len(r) for r in read[g]) >= len(values) for g in members)
        wait_until(everything_read, 30, "both groups reading all 300 records", interval_s=0)
        # A few more rounds: nothing more arrives (no record read twice).
        for g, consumers in members.items():
            wait_settled(cluster, g, consumers, read[g])
        for g, per_consumer in read.items():
            records = [r for rs in per_consumer for r in rs]
            got = [(r.value, (r.partition, r.offset)) for r in records]
            assert len(got) == len(values), (g, len(got))
            assert dict(got) == produced, g
            assert all(r.key == r.value for r in records)
        # In group a both consumers read (the partitions were shared).
        assert all(read["two-groups-a"]), [len(r) for r in read["two-groups-a"]]


# -- 4. a member killed -9 ---------------------------------------------------------------

@dataclass
class Load:
    """Unique keyed values sent with acks=all until stopped."""

    cluster: ProcessCluster
    topic: str
    acked: dict[bytes, tuple[int, int]] = field(default_factory=dict)
    failed: dict[bytes, str] = field(default_factory=dict)
    stop: threading.Event = field(default_factory=threading.Event)
    thread: threading.Thread | None = None
    sent: int = 0

    def send(self, producer: Producer, count: int) -> None:
        handles = []
        for _ in range(count):
            value = b"%s-%d" % (self.topic.encode(), self.sent)
            self.sent += 1
            handles.append((value, producer.send(self.topic, value, key=value)))
        for value, handle in handles:
            try:
                meta = handle.result(timeout=30)
                self.acked[value] = (meta.partition, meta.offset)
            except Exception as exc:  # noqa: BLE001  every outcome is recorded
                self.failed[value] = getattr(exc, "code", type(exc).__name__)

    def start(self) -> "Load":
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        return self

    def _run(self) -> None:
        with Producer(urls(self.cluster), acks="all", linger_ms=2) as producer:
            while not self.stop.wait(0.05):
                self.send(producer, 10)

    def finish(self) -> None:
        self.stop.set()
        if self.thread is not None:
            self.thread.join(60)
            assert not self.thread.is_alive(), "the load did not stop"


def start_cli_consumer(cluster, topic: str, group: str, out_path: str
                       ) -> subprocess.Popen:
    with open(out_path, "wb") as out, open(out_path + ".err", "wb") as err:
        return subprocess.Popen(
            [sys.executable, "-m", "api.cli", "--bootstrap", ",".join(urls(cluster)),
             "consume", topic, "--group", group, "--from-beginning", "--print-offset",
             "--session-timeout-ms", "3000"],
            cwd=REPO_ROOT, stdout=out, stderr=err, start_new_session=True)


def printed(path: str) -> list[tuple[int, int, bytes]]:
    """(partition, offset, value) of every whole line a consumer printed."""
    with open(path, "rb") as f:
        data = f.read()
    lines = data.split(b"\n")[:-1]  # a last line without its newline is not whole
    out = []
    for line in lines:
        where, value = line.split(b"\t", 1)
        partition, offset = where.split(b":")
        out.append((int(partition), int(offset), value))
    return out


def test_a_member_killed_9_its_partitions_move_after_the_session_timeout_at_least_once(
        cluster, tmp_path):
    group, topic = "killed-member", "killed-member"
    everything = set(create_topic(cluster, topic, 4))
    load = Load(cluster, topic)
    with Producer(urls(cluster), acks="all") as producer:
        load.send(producer, 200)
    assert not load.failed
    load.start()
    outs = {name: str(tmp_path / f"{name}.out") for name in ("a", "b")}
    procs: dict[str, subprocess.Popen] = {}
    try:
        procs["a"] = start_cli_consumer(cluster, topic, group, outs["a"])

        def members() -> dict[str, set[TopicPartition]] | None:
            described = describe_group(cluster, group)
            if described["state"] != "stable":
                return None
            return {m["member_id"]: tps(m["assigned"]) for m in described["members"]}

        first = wait_until(lambda: (m := members()) and len(m) == 1 and m, 30,
                           "consumer a alone in the group")
        (a_id,) = first
        assert first[a_id] == everything
        procs["b"] = start_cli_consumer(cluster, topic, group, outs["b"])
        both = wait_until(lambda: (m := members()) and len(m) == 2 and all(
            len(ps) == 2 for ps in m.values()) and m, 30,
            "consumers a and b in the group with two partitions each")
        (b_id,) = set(both) - {a_id}
        victim_partitions = {tp.partition for tp in both[a_id]}
        survivor_partitions = {tp.partition for tp in both[b_id]}
        wait_until(lambda: {p for p, _, _ in printed(outs["b"])} == survivor_partitions, 20,
                   "consumer b printing records of both its partitions")

        # a has committed on its partitions (auto-commit, every 5 s), and has
        # printed past that commit; then it dies without a word.
        def committed() -> dict[int, int]:
            return {o["partition"]: o["offset"] for o in describe_group(cluster, group)["offsets"]}

        def a_past_its_commit() -> bool:
            done = committed()
            last = {}
            for p, o, _ in printed(outs["a"]):
                last[p] = o
            return all(p in done and done[p] > 0 and last.get(p, -1) >= done[p]
                       for p in victim_partitions)
        wait_until(a_past_its_commit, 20, "consumer a committed and printed past its commit")
        committed_before = committed()
        assert members() == both, "the group moved before the kill"
        os.kill(procs["a"].pid, signal.SIGKILL)
        procs["a"].wait(10)
        killed_at = time.monotonic()

        after = wait_until(lambda: (m := members()) and set(m) == {b_id} and m, 20,
                           "consumer b alone in the group, owning every partition")
        took_s = time.monotonic() - killed_at
        assert after[b_id] == everything
        # Not before the session timeout (3 s from a's last heartbeat, which
        # was at most one heartbeat interval before the kill).
        assert took_s >= 3.0 - HEARTBEAT_INTERVAL_MS / 1000 - 0.2, took_s
        a_lines = printed(outs["a"])
        a_last = {p: max(o for q, o, _ in a_lines if q == p) for p in victim_partitions}

        # Processing goes on: b reads a's partitions past where a stopped.
        wait_until(lambda: all(any(q == p and o > a_last[p] for q, o, _ in printed(outs["b"]))
                               for p in victim_partitions), 20,
                   "consumer b printing a's partitions past a's last record")
        load.finish()
        assert not load.failed, list(load.failed.items())[:5]
        wait_until(lambda: set(load.acked) <= {v for _, _, v in printed(outs["b"])}
                   | {v for _, _, v in a_lines}, 30, "every record printed")
    finally:
        load.finish()
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)

    b_lines = printed(outs["b"])
    # Each printed record is one produced, at the offset its acknowledgement named.
    for p, o, value in a_lines + b_lines:
        assert load.acked.get(value) == (p, o), (p, o, value)
    # No record skipped.
    seen = {v for _, _, v in a_lines} | {v for _, _, v in b_lines}
    skipped = sorted(set(load.acked) - seen)
    assert not skipped, f"{len(skipped)} records never printed, e.g. {skipped[:5]}"
    # Neither printed a record twice itself.
    for name, lines in (("a", a_lines), ("b", b_lines)):
        positions = [(p, o) for p, o, _ in lines]
        assert len(positions) == len(set(positions)), f"consumer {name} printed a record twice"
    # Duplicates: only a's partitions at the kill, only from b's starting point
    # (the offset a last committed) to a's last printed record.
    b_start = {p: min(o for q, o, _ in b_lines if q == p) for p in victim_partitions}
    for p in victim_partitions:
        assert committed_before[p] <= b_start[p] <= a_last[p] + 1, \
            (p, committed_before[p], b_start[p], a_last[p])
    duplicates = {(p, o) for p, o, _ in a_lines} & {(p, o) for p, o, _ in b_lines}
    expected = {(p, o) for p in victim_partitions for o in range(b_start[p], a_last[p] + 1)}
    assert duplicates == expected, (sorted(duplicates - expected)[:5],
                                    sorted(expected - duplicates)[:5])
    # And within the last auto-commit interval (5 s) of a's output: a printed
    # them after the commit b started from, so a had not committed them.
    assert all(o >= committed_before[p] for p, o in duplicates)


# -- 5. the coordinator killed -9 --------------------------------------------------------

def test_the_coordinators_broker_killed_9_the_group_and_its_offsets_survive(healed):
    cluster = healed
    group, topic = "coordinator-killed", "coordinator-killed"
    everything = create_topic(cluster, topic, 3)
    for p in range(3):
        produce(cluster, topic, [b"first-%d-%d" % (p, i) for i in range(40)], partition=p)
    with contextlib.ExitStack() as stack:
        c1 = stack.enter_context(group_consumer(cluster, group, enable_auto_commit=False))
        c1.subscribe([topic])
        read1: list[list] = [[]]
        wait_until(lambda: (poll_round([c1], read1), len(read1[0]) >= 120)[1], 30,
                   "the first member reading all 120 records", interval_s=0)
        assert sorted((r.partition, r.offset) for r in read1[0]) == \
            [(p, o) for p in range(3) for o in range(40)]
        assert c1.assignment() == set(everything)
        c1.commit({tp: 25 for tp in everything})
        assert c1.committed(everything) == {tp: 25 for tp in everything}
        c1_id = member_id(c1)

        old = find_coordinator(cluster, group)
        cluster.kill(old["coordinator_id"], signal.SIGKILL)

        def new_coordinator() -> dict | None:
            poll_round([c1], read1)
            where = find_coordinator(cluster, group)
            if where["coordinator_id"] == old["coordinator_id"]:
                return None
            described = describe_group(cluster, group)
            return where if described["state"] != "dead" else None
        new = wait_until(new_coordinator, 30, "another broker coordinating the group",
                         interval_s=0)
        assert new["partition"] == old["partition"]

        # Loaded from __consumer_offsets: the member (same id), its
        # partitions and the committed offsets.
        assert wait_settled(cluster, group, [c1], read1) == [set(everything)]
        assert member_id(c1) == c1_id
        assert c1.committed(everything) == {tp: 25 for tp in everything}
        assert {(o["topic"], o["partition"]): o["offset"]
                for o in describe_group(cluster, group)["offsets"]} == \
            {(topic, p): 25 for p in range(3)}

        # The member keeps consuming: exactly the new records, nothing again.
        assert len(read1[0]) == 120
        for p in range(3):
            produce(cluster, topic, [b"second-%d-%d" % (p, i) for i in range(10)],
                    partition=p)
        wait_until(lambda: (poll_round([c1], read1), len(read1[0]) >= 150)[1], 30,
                   "the member reading the 30 new records", interval_s=0)
        assert sorted((r.partition, r.offset) for r in read1[0][120:]) == \
            [(p, o) for p in range(3) for o in range(40, 50)]
        c1.commit({tp: 25 for tp in everything})  # the new coordinator takes commits
        assert sorted((o["partition"], o["offset"], o["log_end_offset"], o["lag"])
                      for o in describe_group(cluster, group)["offsets"]) == \
            [(p, 25, 50, 25) for p in range(3)]

        # A new member starts from the committed offsets (25), not from 0.
        c2 = stack.enter_context(group_consumer(cluster, group, enable_auto_commit=False))
        c2.subscribe([topic])
        read = [read1[0], []]
        assignments = wait_settled(cluster, group, [c1, c2], read)
        assert_partitioned(assignments, set(everything))
        taken = assignments[1]
        assert taken, "the new member got no partition"
        wait_until(lambda: (poll_round([c1, c2], read),
                            len(read[1]) >= 25 * len(taken))[1], 30,
                   "the new member reading its partitions from the committed offset",
                   interval_s=0)
        assert sorted((r.partition, r.offset) for r in read[1]) == \
            [(tp.partition, o) for tp in sorted(taken) for o in range(25, 50)]
        assert len(read1[0]) == 150


def test_a_backtracking_regex_neither_stalls_the_coordinator_nor_matches_wrongly(cluster):
    """``(a+)+b`` against a topic named with 26 a's takes Python's ``re``
    seconds per match (and did stall the broker, every timer tick); topic
    regexes are matched with a time limit, so the join answers at once."""
    topic = "a" * 26
    create_topic(cluster, topic, 1)
    group = "backtracking"
    coordinator = find_coordinator(cluster, group)["coordinator_url"]
    started = time.monotonic()
    status, body = post(coordinator + "/v1/groups/heartbeat", json.dumps({
        "group_id": group, "member_id": "", "member_epoch": 0,
        "subscribed_topic_regex": "(a+)+b"}).encode())
    assert status == 200, body
    assert body["assignment"] == []  # no topic ends in "b"
    # Several timer ticks later the broker still answers at once.
    wait_until(lambda: time.monotonic() - started > 1.0, 5, "a second of timer ticks")
    asked = time.monotonic()
    assert http_json(coordinator + "/healthz", timeout_s=2.0)[0] == 200
    assert time.monotonic() - asked < 1.0
    post(coordinator + "/v1/groups/heartbeat", json.dumps({
        "group_id": group, "member_id": body["member_id"], "member_epoch": -1}).encode())


def kraftlog(cluster, *argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "api.cli", "--bootstrap", urls(cluster)[0],
                           *argv], capture_output=True, text=True, cwd=REPO_ROOT, timeout=60)


def test_the_groups_commands_list_describe_reset_and_delete(cluster):
    """What an operator sees (kafka-consumer-groups): committed offset, log
    end and lag per partition; resets and deletes only of an empty group."""
    topic, group = "cli-groups", "cli-billing"
    create_topic(cluster, topic, 2)
    produce(cluster, topic, [b"%d" % i for i in range(40)])
    with Consumer(urls(cluster), group_id=group, auto_offset_reset="earliest",
                  enable_auto_commit=False) as consumer:
        consumer.subscribe([topic])
        wait_until(lambda: len(consumer.poll(200)) >= 0 and len(consumer.assignment()) == 2,
                   20, "both partitions assigned")
        consumer.commit({TopicPartition(topic, 0): 5, TopicPartition(topic, 1): 6})
        answered = []
        consumer.commit_async({TopicPartition(topic, 1): 7},
                              callback=lambda offsets, error: answered.append((offsets, error)))
        wait_until(lambda: answered, 10, "the async commit's callback")
        assert answered == [({TopicPartition(topic, 1): 7}, None)]
        listed = kraftlog(cluster, "groups", "list")
        assert listed.returncode == 0, listed.stderr
        assert re.search(rf"^{group}\s+stable\s+1\s", listed.stdout, re.M), listed.stdout
        described = kraftlog(cluster, "groups", "describe", group)
        assert described.returncode == 0, described.stderr
        ends = {tp.partition: end for tp, end in consumer.end_offsets(
            [TopicPartition(topic, 0), TopicPartition(topic, 1)]).items()}
        for partition, committed in ((0, 5), (1, 7)):
            row = rf"^{topic}\s+{partition}\s+{committed}\s+{ends[partition]}\s+" \
                  rf"{ends[partition] - committed}\s+\S+\s+127\.0\.0\.1"
            assert re.search(row, described.stdout, re.M), described.stdout
        refused = kraftlog(cluster, "groups", "reset-offsets", group, "--topic", topic,
                           "--to-earliest", "--execute")
        assert refused.returncode == 1 and refused.stderr.count("NON_EMPTY_GROUP") == 1, refused
    plan = kraftlog(cluster, "groups", "reset-offsets", group, "--topic", topic,
                    "--partition", "1", "--shift-by", "-3")
    assert plan.returncode == 0, plan.stderr
    assert re.search(rf"^{topic}\s+1\s+7\s+4\s*$", plan.stdout, re.M), plan.stdout
    assert "add --execute" in plan.stderr
    offsets = {(o["topic"], o["partition"]): o["offset"]
               for o in describe_group(cluster, group)["offsets"]}
    assert offsets == {(topic, 0): 5, (topic, 1): 7}, "a plan changes nothing"
    reset = kraftlog(cluster, "groups", "reset-offsets", group, "--topic", topic,
                     "--partition", "1", "--shift-by", "-3", "--execute")
    assert reset.returncode == 0, reset.stderr
    assert re.search(rf"^{topic}\s+1\s+7\s+4\s*$", reset.stdout, re.M), reset.stdout
    offsets = {(o["topic"], o["partition"]): o["offset"]
               for o in describe_group(cluster, group)["offsets"]}
    assert offsets == {(topic, 0): 5, (topic, 1): 4}
    negative = kraftlog(cluster, "groups", "reset-offsets", group, "--topic", topic,
                        "--to-offset", "-1", "--execute")
    assert negative.returncode == 1 and "--to-offset must be 0 or more" in negative.stderr
    deleted = kraftlog(cluster, "groups", "delete", group)
    assert deleted.returncode == 0, deleted.stderr
    assert describe_group(cluster, group)["state"] == "dead"
    for argv in (("describe", group), ("delete", group)):
        gone = kraftlog(cluster, "groups", *argv)
        assert gone.returncode == 1, gone
        (line,) = gone.stderr.strip().splitlines()
        assert line.count("GROUP_ID_NOT_FOUND") == 1 and "does not exist" in line, line


def test_closing_an_iterating_consumer_commits_only_what_it_handed_out(cluster):
    """Iteration holds a whole poll's records; the commit on close must count
    only those handed to the application (at-least-once)."""
    topic = group = "iterate-and-close"
    create_topic(cluster, topic, 1)
    produce(cluster, topic, [b"%d" % i for i in range(50)], partition=0)
    with Consumer(urls(cluster), group_id=group, auto_offset_reset="earliest") as consumer:
        consumer.subscribe([topic])
        handed = []
        for record in consumer:
            handed.append(record.offset)
            if len(handed) == 3:
                break
    assert handed == [0, 1, 2]
    offsets = {(o["topic"], o["partition"]): o["offset"]
               for o in describe_group(cluster, group)["offsets"]}
    assert offsets == {(topic, 0): 3}


def test_a_member_cut_off_from_its_coordinator_stops_consuming_after_a_session(healed):
    """The coordinator gives a silent member's partitions away after its
    session; the member must stop consuming them by then too, not keep
    them while its heartbeats fail."""
    cluster = healed
    topic = group = "cut-off-member"
    create_topic(cluster, topic, 2)
    coordinator = find_coordinator(cluster, group)["coordinator_id"]
    lost = []
    consumer = Consumer(urls(cluster), group_id=group, session_timeout_ms=1500,
                        auto_offset_reset="earliest")
    try:
        consumer.subscribe([topic], on_partitions_lost=lambda tps: lost.append(set(tps)))
        wait_until(lambda: consumer.poll(100) is not None and len(consumer.assignment()) == 2,
                   20, "both partitions assigned")
        cluster.pause(coordinator)
        try:
            wait_until(lambda: consumer.poll(100) is not None and lost,
                       15, "the cut-off member to give up its partitions")
            assert lost == [{TopicPartition(topic, 0), TopicPartition(topic, 1)}]
            assert consumer.assignment() == set()
        finally:
            cluster.resume(coordinator)
        # Back in touch: it rejoins and gets them again.
        wait_until(lambda: consumer.poll(100) is not None and len(consumer.assignment()) == 2,
                   30, "the member to rejoin")
    finally:
        consumer.close()


def test_a_subscription_the_coordinator_refuses_is_raised_by_poll(cluster):
    """A bad regex is not retried forever in the background: poll says why."""
    with Consumer(urls(cluster), group_id="bad-pattern") as consumer:
        consumer.subscribe(pattern="orders-(")
        deadline = time.monotonic() + 20
        with pytest.raises(KraftlogError) as raised:
            while time.monotonic() < deadline:  # poll raises once the refusal is in
                consumer.poll(100)
        assert raised.value.code == "INVALID_REQUEST"
        assert "orders-(" in str(raised.value)
