"""Stopping a controller cancels its tasks until they end: on Python 3.11 a
single cancel() can be swallowed by asyncio.wait_for (the chaos harness's
rolling restarts caught a controller that never stopped that way)."""

from __future__ import annotations

import asyncio

from kraft.server import cancel_until_done


async def swallows_one_cancel(swallowed: list[int]) -> None:
    """What asyncio.wait_for does on 3.11 when the cancellation arrives as its
    future completes: the loop goes on as if nothing happened."""
    while True:
        try:
            await asyncio.sleep(0.01)
        except asyncio.CancelledError:
            if not swallowed:
                swallowed.append(1)
                continue
            raise


async def test_a_task_that_swallows_one_cancellation_still_ends():
    swallowed: list[int] = []
    task = asyncio.create_task(swallows_one_cancel(swallowed))
    await asyncio.sleep(0.02)
    left = await cancel_until_done([task], timeout_s=2.0)
    assert left == [] and task.cancelled() and swallowed == [1]


async def test_a_task_that_never_ends_is_reported_after_the_timeout():
    released = asyncio.Event()

    async def stubborn() -> None:
        while not released.is_set():
            try:
                await asyncio.sleep(0.01)
            except asyncio.CancelledError:
                continue

    task = asyncio.create_task(stubborn(), name="stubborn")
    await asyncio.sleep(0.02)  # inside its loop (a task cancelled before it starts just ends)
    left = await cancel_until_done([task], timeout_s=0.3)
    assert [t.get_name() for t in left] == ["stubborn"]
    released.set()
    await asyncio.wait_for(task, 2.0)
