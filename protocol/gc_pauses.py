"""Garbage-collector pauses bounded by what changed, not by the heap.

CPython's cycle collector scans its oldest generation whole: every object
that has lived a while. A broker with 10,000 partition replicas holds a few
million of them (partitions, logs, segments, indexes, the metadata image),
so each full collection stopped its event loop for 0.36-0.54 s on the
benchmark machine (measured with ``gc.callbacks`` in each broker of ``kraftlog
bench scale``'s cluster): a fetch waited 700 ms instead of 200, and
heartbeats, fetch deadlines and produce acknowledgements with it.

``GcPauses`` moves the survivors of a full collection that took longer than
``FREEZE_AFTER_MS`` out of the collector's reach (``gc.freeze``): they are
the node's long-lived state, and the next full collections scan only what
was made since. Reference counting still frees every frozen object that is
let go; only a reference cycle among frozen objects that becomes garbage
would stay, so once every ``UNFREEZE_INTERVAL_S`` the frozen objects are
handed back (``gc.unfreeze``) and the next full collection looks at them
all once more (and freezes again if it is long). Young collections are
untouched.

The node process starts it (``api.node.run_node``); the client library never
changes how its host process collects. Written for CPython's generational
collector (3.11 to 3.13), which reports full collections as generation 2;
where none are reported, it does nothing.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import time
from collections.abc import Callable

logger = logging.getLogger(__name__)

#: Told the seconds of each full collection a running ``GcPauses`` measures
#: (the broker's ``kraftlog_gc_full_collection_seconds``).
observers: list[Callable[[float], None]] = []

#: A full collection longer than this freezes its survivors.
FREEZE_AFTER_MS = 20.0
#: Frozen objects are handed back to the collector this often.
UNFREEZE_INTERVAL_S = 3600.0
#: How often the node looks whether a freeze is due.
CHECK_INTERVAL_S = 1.0


class GcPauses:
    """Measures full collections (``on_collection``, a ``gc.callbacks``
    entry) and freezes or unfreezes when ``check`` is called. Pure but for
    the ``gc`` module: the clock is passed in."""

    def __init__(self, freeze_after_ms: float = FREEZE_AFTER_MS,
                 unfreeze_interval_s: float = UNFREEZE_INTERVAL_S) -> None:
        self.freeze_after_ms = freeze_after_ms
        self.unfreeze_interval_s = unfreeze_interval_s
        self.longest_ms = 0.0
        self.freezes = 0
        self._started: float | None = None
        self._due_ms: float | None = None  # the long collection a freeze is due for
        self._unfreeze_at: float | None = None

    def on_collection(self, phase: str, info: dict) -> None:
        if info.get("generation") != 2:
            return
        if phase == "start":
            self._started = time.perf_counter()
            return
        if self._started is None:
            return
        took_ms = (time.perf_counter() - self._started) * 1000
        self._started = None
        self.longest_ms = max(self.longest_ms, took_ms)
        for observe in observers:
            observe(took_ms / 1000)
        if took_ms >= self.freeze_after_ms:
            # Not frozen here: the collector is still running its callbacks.
            self._due_ms = took_ms

    def check(self, now_s: float) -> None:
        """Freeze if a long full collection asked for it; unfreeze when the
        interval since the first freeze has passed (and freeze nothing in
        the same call: the next full collection decides again)."""
        if self._unfreeze_at is not None and now_s >= self._unfreeze_at:
            gc.unfreeze()
            self._unfreeze_at = None
            self._due_ms = None
            logger.info("handed the frozen objects back to the garbage collector "
                        "(every %.0f s)", self.unfreeze_interval_s)
            return
        if self._due_ms is not None:
            took_ms, self._due_ms = self._due_ms, None
            # What became garbage since that collection is not frozen with
            # the rest: a young collection first (it scans only new objects).
            gc.collect(1)
            gc.freeze()
            self.freezes += 1
            if self._unfreeze_at is None:
                self._unfreeze_at = now_s + self.unfreeze_interval_s
            logger.info("a full garbage collection took %.0f ms: froze its survivors, "
                        "which later ones skip (freeze %d)", took_ms, self.freezes)

    def install(self) -> None:
        if self.on_collection not in gc.callbacks:
            gc.callbacks.append(self.on_collection)

    def uninstall(self) -> None:
        if self.on_collection in gc.callbacks:
            gc.callbacks.remove(self.on_collection)

    async def run(self) -> None:
        """Install and check every ``CHECK_INTERVAL_S`` until cancelled."""
        self.install()
        try:
            while True:
                await asyncio.sleep(CHECK_INTERVAL_S)
                self.check(time.monotonic())
        finally:
            self.uninstall()
