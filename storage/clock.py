"""The wall clocks kraftlog's brokers and controllers act on.

``wall_clock_ms`` is the system's wall clock as this process read it at
start-up, moved on by the monotonic clock from then: steps of the system
clock while the process runs (an operator's ``date -s``, a virtual
machine's clock corrected after a pause, NTP stepping) move nothing that
measures a duration by it: ``flush.ms`` never waits out a backward step,
an idempotent producer's state never expires early after a forward one,
records stamped by the broker (LogAppendTime, markers) keep their order.
NTP's gradual slewing moves the monotonic clock alike; a restart reads the
wall clock afresh.

Absolute deadlines take whichever reading is safe for them, so a wrong
clock, stepped either way, at start-up or later, errs on the safe side:

- ``retention_clock_ms``, the earlier of the two, decides what time-based
  retention deletes: a forward step deletes nothing early, and neither
  does a clock that was ahead at start-up and corrected since (Kafka reads
  the system clock alone and deletes on a forward step);
- ``expiry_clock_ms``, the later of the two, decides whether a delegation
  token has expired: a backward step does not extend one.

Record timestamps set by producers (CreateTime) are theirs. Leases,
sessions and timeouts use the monotonic clock directly.
"""

from __future__ import annotations

import time

_WALL_AT_START_NS = time.time_ns()
_MONOTONIC_AT_START_NS = time.monotonic_ns()


def wall_clock_ms() -> int:
    """Milliseconds since the epoch: the start-up wall clock moved on by
    the monotonic clock (see the module doc)."""
    return (_WALL_AT_START_NS + time.monotonic_ns() - _MONOTONIC_AT_START_NS) // 1_000_000


def system_clock_ms() -> int:
    """The system's wall clock now, steps and all."""
    return time.time_ns() // 1_000_000


def retention_clock_ms() -> int:
    """The earlier of ``wall_clock_ms`` and the system clock: what may be
    deleted by age is judged by it."""
    return min(wall_clock_ms(), system_clock_ms())


def expiry_clock_ms() -> int:
    """The later of ``wall_clock_ms`` and the system clock: whether a
    credential has expired is judged by it."""
    return max(wall_clock_ms(), system_clock_ms())
