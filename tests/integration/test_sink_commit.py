"""The Spark sink's exactly-once protocol (``spark_source.commit``) against a
real node, without Spark: tasks are real transactional producers that
prepare, the driver's steps are the shipped functions, and a crash is a
step that never runs. After every crash point, what a restarted query
does (its tasks' ``begin_task``, then ``commit_batch``) leaves each row in
the topic exactly once for a read_committed consumer.

Crash points of a micro-batch, in order: (1) tasks prepared, no decision;
(2) decision written, nothing committed; (3) some transactions committed;
(4) all committed, not marked done; (5) done, but Spark's own commit log
not written (Spark replays the batch).
"""

from __future__ import annotations

import asyncio

import pytest

from api.client import Admin, Consumer, NewTopic, Producer, TopicPartition
from api.client.admin import AsyncAdmin
from spark_source import commit


TOPIC_PARTITIONS = 2


def run(url: str, fn):
    async def go():
        admin = AsyncAdmin(url)
        try:
            return await fn(admin)
        finally:
            await admin.close()
    return asyncio.run(go())


def make_topic(url: str, name: str) -> None:
    with Admin(url) as admin:
        admin.create_topics([NewTopic(name, TOPIC_PARTITIONS, 1)])


def task_writes(url: str, prefix: str, task: int, batch_id: int, topic: str,
                rows: list[str]):
    """What a Spark task of the sink does: begin (may skip), write in a
    transaction, prepare. The prepared transaction, or "skipped"."""
    if not run(url, lambda a: commit.begin_task(a, prefix, task, batch_id)):
        return "skipped"
    with Producer(url, transactional_id=commit.transactional_id(prefix, task),
                  transaction_two_phase_commit=True) as producer:
        producer.init_transactions()
        producer.begin_transaction()
        for row in rows:
            producer.send(topic, row, key=row)
        return producer.prepare_transaction()


def committed_rows(url: str, topic: str) -> list[str]:
    tps = [TopicPartition(topic, p) for p in range(TOPIC_PARTITIONS)]
    with Consumer(url, auto_offset_reset="earliest", isolation_level="read_committed",
                  request_timeout_ms=5000) as consumer:
        consumer.assign(tps)
        ends = consumer.end_offsets(tps)  # the last stable offsets
        rows = []
        for _ in range(200):
            if all(consumer.position(tp) >= ends[tp] for tp in tps):
                break
            rows.extend(r.value.decode() for r in consumer.poll(200))
        else:
            raise AssertionError("reading the topic back did not finish")
    return sorted(rows)


def open_transactions(url: str, prefix: str) -> list[str]:
    with Admin(url) as admin:
        return [t["transactional_id"] for t in admin.list_transactions()
                if t["transactional_id"].startswith(prefix + "-") and t["state"] == "Ongoing"]


BATCHES = {0: {0: ["a0", "a1"], 1: ["a2"]},
           1: {0: ["b0"], 1: ["b1", "b2"], 2: ["b3"]}}


def run_batch(url, prefix, topic, batch_id, tasks, crash_at=None):
    """One micro-batch of ``tasks`` ({task: rows}); stops short at
    ``crash_at``. The prepared transactions."""
    prepared = {t: task_writes(url, prefix, t, batch_id, topic, rows)
                for t, rows in tasks.items()}
    if crash_at == "prepared":
        return prepared
    live = {t: p for t, p in prepared.items() if p not in (None, "skipped")}
    if crash_at in ("decided", "some-committed", "all-committed"):
        run(url, lambda a: a.alter_consumer_group_offsets(
            prefix, commit.decision_entries(batch_id, live)))
        done = {"decided": [], "some-committed": list(live.values())[:1],
                "all-committed": list(live.values())}[crash_at]
        run(url, lambda a: commit.complete_all(a, done, commit=True))
        return prepared
    run(url, lambda a: commit.commit_batch(a, prefix, batch_id, live, list(tasks)))
    return prepared


@pytest.mark.parametrize("crash_at", ["prepared", "decided", "some-committed",
                                      "all-committed", "done"])
def test_a_crash_at_any_point_of_a_batch_leaves_each_row_exactly_once(url, crash_at):
    topic, prefix = f"sink-{crash_at}", f"sink-test-{crash_at}"
    make_topic(url, topic)
    run_batch(url, prefix, topic, 0, BATCHES[0])
    assert committed_rows(url, topic) == ["a0", "a1", "a2"]
    # Batch 1 runs with 3 tasks and the driver dies at ``crash_at``.
    run_batch(url, prefix, topic, 1, BATCHES[1], crash_at=crash_at)
    # The restarted query replays batch 1 with only 2 tasks (another plan:
    # the crashed attempt's task 2 is nobody's now), then runs batch 2.
    replay = {0: ["b0", "b3"], 1: ["b1", "b2"]}
    outcome = run_batch(url, prefix, topic, 1, replay)
    decided_before = crash_at != "prepared"
    assert all((p == "skipped") == decided_before for p in outcome.values()), outcome
    run_batch(url, prefix, topic, 2, {0: ["c0"], 1: ["c1"]})
    assert committed_rows(url, topic) == ["a0", "a1", "a2", "b0", "b1", "b2", "b3", "c0",
                                          "c1"]
    # Nothing is left open to hold read_committed consumers back.
    assert open_transactions(url, prefix) == []


def test_a_task_retried_within_a_batch_fences_its_first_attempt(url):
    topic, prefix = "sink-retry", "sink-test-retry"
    make_topic(url, topic)
    first = task_writes(url, prefix, 0, 0, topic, ["x0", "x1"])   # attempt 1: prepared,
    second = task_writes(url, prefix, 0, 0, topic, ["x0", "x1"])  # but Spark retried it
    assert second.producer_epoch > first.producer_epoch
    run(url, lambda a: commit.commit_batch(a, prefix, 0, {0: second}, [0]))
    assert committed_rows(url, topic) == ["x0", "x1"]


def test_registry_round_trip_in_parts():
    from api.client import PreparedTransaction

    prepared = {t: PreparedTransaction(commit.transactional_id("p", t), 1000 + t, t % 7)
                for t in range(600)}
    entries = commit.decision_entries(41, prepared)
    assert len(entries) > 1  # more than one part's worth
    assert all(len(v.metadata) <= commit.DECISION_PART_CHARS + 20 for v in entries.values())
    registry = commit.parse_registry("p", entries)
    assert registry.decided == 41 and dict(registry.decision) == prepared
    assert registry.pending
    # A stale part of an older, larger decision does not mix in.
    older = commit.decision_entries(40, {t: prepared[t] for t in range(1200 // 2)})
    mixed = {**older, **commit.decision_entries(42, {0: prepared[0]})}
    assert dict(commit.parse_registry("p", mixed).decision) == {0: prepared[0]}
