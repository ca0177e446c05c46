"""Small asyncio helpers every part uses.

``wait_event`` is how a loop waits for its wake-up with a limit. It uses
``asyncio.timeout`` rather than ``asyncio.wait_for``: on Python 3.11
``wait_for`` runs the wait in a task of its own (a task and two more turns
of the event loop per wait, on paths that wait once per batch sent or
fetched), and can swallow a cancellation that lands as the wait ends (a
stopping process then waits on).
"""

from __future__ import annotations

import asyncio

__all__ = ["wait_event"]


async def wait_event(event: asyncio.Event, timeout_s: float | None) -> bool:
    """Wait until ``event`` is set, for at most ``timeout_s`` seconds (None:
    no limit); whether it was set."""
    if event.is_set():
        return True
    try:
        async with asyncio.timeout(timeout_s):
            await event.wait()
    except TimeoutError:
        return False
    return True
