"""The wall clock kraftlog's brokers and controllers act on.

It is the system's wall clock as this process read it at start-up, moved on
by the monotonic clock from then. Steps of the system clock while the
process runs (an operator's ``date -s``, a virtual machine's clock
corrected after a pause, NTP stepping) therefore move nothing: no segment
is deleted early by time-based retention after a forward step, no fsync
waits out a backward step (``flush.ms``), no idempotent producer's state
expires early, and a delegation token is not accepted past its expiry
after a backward step. NTP's gradual slewing moves the monotonic clock
alike, so the two stay together; a restart reads the wall clock afresh.
Record timestamps set by producers (CreateTime) are theirs, not this
clock's. Leases, sessions and timeouts use the monotonic clock directly.
"""

from __future__ import annotations

import time

_WALL_AT_START_NS = time.time_ns()
_MONOTONIC_AT_START_NS = time.monotonic_ns()


def wall_clock_ms() -> int:
    """Milliseconds since the epoch, immune to steps of the system clock
    after this process started (see the module doc)."""
    return (_WALL_AT_START_NS + time.monotonic_ns() - _MONOTONIC_AT_START_NS) // 1_000_000


def system_clock_ms() -> int:
    """The system's wall clock now, steps and all (for reports: what an
    operator's ``date`` says)."""
    return time.time_ns() // 1_000_000
