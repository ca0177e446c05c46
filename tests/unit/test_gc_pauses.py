"""protocol.gc_pauses: a long full collection freezes its survivors, so the
next full collections skip them; they are handed back after the interval."""

from __future__ import annotations

import asyncio
import gc
import weakref

from protocol import gc_pauses
from protocol.gc_pauses import GcPauses


class _Node:
    """Long-lived state with a reference cycle, as a broker's partitions."""

    def __init__(self) -> None:
        self.me = self


def test_a_long_full_collection_freezes_its_survivors_and_the_next_skips_them():
    pauses = GcPauses(freeze_after_ms=0.0, unfreeze_interval_s=60.0)
    pauses.install()
    state = [_Node() for _ in range(20_000)]
    try:
        gc.collect()  # a full collection: at least "0 ms", so a freeze is due
        assert gc.get_freeze_count() == 0  # never inside the collector's callback
        pauses.check(now_s=100.0)
        assert pauses.freezes == 1
        assert gc.get_freeze_count() >= len(state)
        # Frozen objects are out of the oldest generation: a full collection
        # no longer walks them.
        assert not any(isinstance(o, _Node) for o in gc.get_objects(generation=2))
        # Young collections neither freeze nor count.
        pauses.longest_ms = 0.0
        gc.collect(0)
        pauses.check(now_s=101.0)
        assert pauses.freezes == 1 and pauses.longest_ms == 0.0
        # The interval passed: everything frozen is collectable again, and a
        # cycle let go while frozen is reclaimed by the next full collection.
        del state[:10_000]
        pauses.check(now_s=160.0)
        assert gc.get_freeze_count() == 0
        gc.collect()
        assert sum(isinstance(o, _Node) for o in gc.get_objects()) == len(state)
    finally:
        pauses.uninstall()
        gc.unfreeze()


def test_short_full_collections_freeze_nothing():
    pauses = GcPauses(freeze_after_ms=60_000.0)
    pauses.install()
    try:
        gc.collect()
        pauses.check(now_s=1.0)
        assert pauses.freezes == 0 and gc.get_freeze_count() == 0
        assert 0.0 < pauses.longest_ms < 60_000.0
    finally:
        pauses.uninstall()


async def test_the_task_installs_itself_and_leaves_no_callback_when_cancelled(monkeypatch):
    monkeypatch.setattr(gc_pauses, "CHECK_INTERVAL_S", 0.01)
    pauses = GcPauses(freeze_after_ms=0.0)
    task = asyncio.get_running_loop().create_task(pauses.run())
    try:
        deadline = asyncio.get_running_loop().time() + 10
        while pauses.freezes == 0:
            assert asyncio.get_running_loop().time() < deadline, "never froze"
            gc.collect()
            await asyncio.sleep(0.02)
        assert gc.get_freeze_count() > 0
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        gc.unfreeze()
    assert pauses.on_collection not in gc.callbacks


def test_the_hourly_hand_back_is_not_undone_by_a_freeze_due_at_the_same_moment():
    pauses = GcPauses(freeze_after_ms=0.0, unfreeze_interval_s=60.0)
    pauses.install()
    state = [_Node() for _ in range(1_000)]
    try:
        gc.collect()
        pauses.check(now_s=100.0)  # frozen; hand-back due at 160
        del state[:]
        gc.collect()  # a long full collection just before the hand-back
        pauses.check(now_s=160.0)
        assert gc.get_freeze_count() == 0  # handed back, not frozen again
        gc.collect()
        assert not any(isinstance(o, _Node) for o in gc.get_objects())
    finally:
        pauses.uninstall()
        gc.unfreeze()


def test_garbage_made_since_the_long_collection_is_not_frozen():
    pauses = GcPauses(freeze_after_ms=0.0, unfreeze_interval_s=60.0)
    pauses.install()
    try:
        gc.collect()
        gc.disable()  # no young collection of our own between the two steps
        try:
            garbage = [weakref.ref(_Node()) for _ in range(1_000)]  # cycles, garbage at once
            pauses.check(now_s=1.0)
        finally:
            gc.enable()
        assert pauses.freezes == 1 and gc.get_freeze_count() > 0
        gc.collect()  # frozen objects would outlive it
        assert all(ref() is None for ref in garbage)
    finally:
        pauses.uninstall()
        gc.unfreeze()


def test_observers_are_told_each_full_collection_and_the_broker_exports_them():
    from api.broker.metrics import BrokerMetrics

    metrics = BrokerMetrics(lambda: {}, lambda: {})
    told: list[float] = []
    pauses = GcPauses(freeze_after_ms=60_000.0)
    gc_pauses.observers.extend([told.append, metrics.gc_full_pauses.observe])
    pauses.install()
    try:
        gc.collect(0)  # young: not told
        gc.collect()
        gc.collect()
    finally:
        pauses.uninstall()
        del gc_pauses.observers[-2:]
    assert len(told) == 2 and all(0.0 < s < 60.0 for s in told)
    text = metrics.render()
    assert "kraftlog_gc_full_collection_seconds_count 2\n" in text
    assert 'kraftlog_gc_full_collection_seconds_bucket{le="+Inf"} 2\n' in text
