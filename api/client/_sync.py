"""The event loop behind the synchronous clients.

``Producer``, ``Consumer`` and ``Admin`` are thin shells over their asyncio
versions: each owns a ``LoopThread`` (an event loop running in a daemon
thread) and submits coroutines to it with ``run_coroutine_threadsafe``, so
the sync and async clients share one implementation. The producer's ``send``
is the exception: it appends to a thread-safe accumulator directly, since a
thread hop per record would cost more than the record itself.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")

#: How long ``stop`` waits for the loop thread to finish its cleanup.
STOP_TIMEOUT_S = 10.0


class LoopThread:
    """An asyncio event loop running forever in a daemon thread."""

    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self._started = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()
        self._started.wait()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.call_soon(self._started.set)
        try:
            self.loop.run_forever()
        finally:
            pending = [t for t in asyncio.all_tasks(self.loop) if not t.done()]
            for task in pending:
                task.cancel()
            if pending:
                self.loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
            self.loop.run_until_complete(self.loop.shutdown_asyncgens())
            self.loop.close()

    @property
    def thread_id(self) -> int | None:
        return self._thread.ident

    @property
    def in_loop_thread(self) -> bool:
        return threading.current_thread() is self._thread

    def run(self, coro: Coroutine[Any, Any, T], timeout_s: float | None = None) -> T:
        """Run ``coro`` on the loop and wait for its result (or exception).

        Refuses to run from the loop thread itself (a delivery callback
        calling ``flush``, say): waiting there would wait forever.
        """
        if self.in_loop_thread:
            coro.close()
            raise RuntimeError("a blocking client call from the client's own event-loop thread "
                               "(e.g. inside a delivery callback) would deadlock")
        if not self._thread.is_alive():
            coro.close()
            raise RuntimeError("the client's event loop has stopped (the client is closed)")
        future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return future.result(timeout_s)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise TimeoutError(f"no result within {timeout_s} s") from None
        except BaseException:
            # Interrupted (KeyboardInterrupt): do not leave the call running.
            future.cancel()
            raise

    def call(self, fn: Callable[..., T], *args: Any) -> T:
        """Run plain ``fn(*args)`` on the loop thread (state owned by the
        loop is only touched there)."""
        if self.in_loop_thread:
            return fn(*args)

        async def call() -> T:
            return fn(*args)
        return self.run(call())

    def call_soon(self, fn: Callable[..., Any], *args: Any) -> None:
        """Schedule ``fn(*args)`` on the loop without waiting."""
        self.loop.call_soon_threadsafe(fn, *args)

    def stop(self) -> None:
        if self._thread.is_alive():
            self.loop.call_soon_threadsafe(self.loop.stop)
            if not self.in_loop_thread:
                self._thread.join(STOP_TIMEOUT_S)
