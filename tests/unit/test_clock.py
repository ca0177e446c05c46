"""The clock brokers and controllers act on (storage/clock.py) under a
stepped system clock: a real child process with chaos/faultyio preloaded
steps its wall clock forward ten days and back an hour while it runs;
``time.time()`` follows every step, ``storage.clock.wall_clock_ms`` none,
the log's retention deletes nothing early, retention's clock is the earlier
reading and expiry's the later."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from chaos.faultyio import FaultyDir
from chaos.cluster import REPO_ROOT

DAY_MS = 86_400_000

# The child: a log whose only segment is a day old by retention's clock,
# with retention.ms of a week; between steps it reports both clocks and
# what retention deleted, then waits for the next step (a marker file).
CHILD = r"""
import json, os, sys, time
from storage.clock import expiry_clock_ms, retention_clock_ms, wall_clock_ms
from storage.config import LogConfig
from storage.log import Log
from tests.helpers import make_batch

steps, directory = sys.argv[1], sys.argv[2]
log = Log.open(os.path.join(directory, "t-0"), LogConfig(retention_ms=7 * 86_400_000))
log.append(make_batch(3, timestamp_ms=wall_clock_ms() - 86_400_000), leader_epoch=0)
log.roll()
for step in range(3):
    marker = os.path.join(steps, f"go-{step}")
    deadline = time.monotonic() + 20
    while not os.path.exists(marker):
        if time.monotonic() > deadline:
            sys.exit("no step")
        time.sleep(0.01)
    time.sleep(0.05)  # the library looks at its control file every millisecond
    deleted = log.delete_retained_segments()
    print(json.dumps({"system": int(time.time() * 1000), "steady": wall_clock_ms(),
                      "retention": retention_clock_ms(), "expiry": expiry_clock_ms(),
                      "deleted": deleted, "start": log.log_start_offset}), flush=True)
"""


def test_steps_of_the_system_clock_move_neither_the_clock_nor_retention(tmp_path):
    control = FaultyDir(str(tmp_path / "data"), str(tmp_path / "clock"))
    steps = tmp_path / "steps"
    steps.mkdir()
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(steps), str(tmp_path / "data")], cwd=REPO_ROOT,
        env={**os.environ, **control.env(), "PYTHONPATH": REPO_ROOT},
        stdout=subprocess.PIPE, text=True)
    try:
        seen = []
        for step, offset_ms in enumerate((0, 10 * DAY_MS, -3_600_000)):
            control.shift_clock(offset_ms)
            (steps / f"go-{step}").touch()
            seen.append(json.loads(child.stdout.readline()))
        assert child.wait(timeout=30) == 0
    finally:
        child.kill()
    for report, offset_ms in zip(seen, (0, 10 * DAY_MS, -3_600_000)):
        assert abs(report["system"] - report["steady"] - offset_ms) < 2_000, report
        assert report["deleted"] == 0 and report["start"] == 0, report
        # Deletion by age takes the earlier reading, expiry the later.
        readings = (report["system"], report["steady"])
        assert report["retention"] <= min(readings) + 50, report
        assert report["expiry"] >= max(readings) - 50, report
