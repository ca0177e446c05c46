"""The disk fault injector (chaos/faultyio): real child processes, with the
library preloaded, doing file I/O inside the faulty directory, in a sibling
directory whose name merely starts the same, and elsewhere. Each fault must
fail exactly the calls it names, with the right errno, only inside; a fault
switched on while the child runs must reach an fd opened before it, and
clearing it must heal the disk. The wall-clock offset must move every
wall clock the child reads (forward and back, while it runs) and no other
clock, and must combine with disk faults."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
import time

import pytest

from chaos import faultyio
from chaos.faultyio import FaultyDir

CHILD_TIMEOUT = 30
CONTENT = b"0123456789"

# Runs in the child: every call below, on one directory, each reported as
# "OK" or the errno's name. A call that needs the fd reports "no-fd" when the
# file could not be opened.
OPS_CHILD = r"""
import errno, json, os, sys

def attempt(call):
    try:
        call()
        return "OK"
    except OSError as e:
        return errno.errorcode.get(e.errno, str(e.errno))

def builtin_write(path):
    f = open(path, "r+b")
    try:
        f.write(b"e")
        f.flush()
    finally:
        try:
            f.close()
        except OSError:
            pass

def run(directory):
    path = os.path.join(directory, "f")
    res = {}
    fd = None
    def open_existing():
        nonlocal fd
        fd = os.open(path, os.O_RDWR)
    res["open_existing"] = attempt(open_existing)
    fd_ops = {
        "write": lambda: os.write(fd, b"a"),
        "pwrite": lambda: os.pwrite(fd, b"b", 0),
        "pwritev": lambda: os.pwritev(fd, [b"c", b"d"], 0),
        "fsync": lambda: os.fsync(fd),
        "pread": lambda: os.pread(fd, 4, 0),
        "read": lambda: (os.lseek(fd, 0, os.SEEK_SET), os.read(fd, 4)),
        "preadv": lambda: os.preadv(fd, [bytearray(4)], 0),
        "ftruncate_grow": lambda: os.ftruncate(fd, os.fstat(fd).st_size + 100),
        "ftruncate_shrink": lambda: os.ftruncate(fd, 1),
    }
    for name, call in fd_ops.items():
        res[name] = attempt(call) if fd is not None else "no-fd"
    res["builtin_write"] = attempt(lambda: builtin_write(path))
    res["truncate_grow"] = attempt(lambda: os.truncate(path, 50))
    res["open_new"] = attempt(
        lambda: os.close(os.open(os.path.join(directory, "new"), os.O_CREAT | os.O_WRONLY)))
    res["rename"] = attempt(
        lambda: os.rename(os.path.join(directory, "g"), os.path.join(directory, "h")))
    if fd is not None:
        os.close(fd)
    return res

dirs = json.loads(sys.argv[1])
print(json.dumps({name: run(d) for name, d in dirs.items()}))
"""

# Runs in the child: opens a file in the faulty directory before any fault,
# then, step by step with the test (marker files), retries a write until the
# injected fault shows and until the cleared one is gone, timing both.
LIVE_CHILD = r"""
import errno, json, os, sys, time

inside, outside, markers = sys.argv[1:4]

def touch(name):
    open(os.path.join(markers, name), "w").close()

def wait_for(name, limit=10.0):
    deadline = time.monotonic() + limit
    while not os.path.exists(os.path.join(markers, name)):
        if time.monotonic() > deadline:
            sys.exit(f"no {name} marker after {limit} s")
        time.sleep(0.001)

def pwrite_errno(fd):
    try:
        os.pwrite(fd, b"x", 0)
        return 0
    except OSError as e:
        return e.errno

def retry_until(fd, wanted, limit=5.0):
    # Returns (last errno, seconds until it was `wanted`, or None if never).
    start = time.monotonic()
    while True:
        got = pwrite_errno(fd)
        if wanted(got):
            return got, time.monotonic() - start
        if time.monotonic() - start > limit:
            return got, None
        time.sleep(0.0005)

fd = os.open(inside, os.O_RDWR)       # opened while the disk is healthy
out = os.open(outside, os.O_RDWR)
report = {"before": pwrite_errno(fd)}
touch("ready")
wait_for("injected")
report["fault"], report["fault_latency"] = retry_until(fd, lambda e: e != 0)
report["outside_during_fault"] = pwrite_errno(out)
touch("faulted")
wait_for("cleared")
report["healed"], report["heal_latency"] = retry_until(fd, lambda e: e == 0)
print(json.dumps(report))
"""


# Runs in the child: for each offset of the schedule in turn (ms, from the
# command line), retries until its wall clock shows that offset, then
# publishes "sample-N" (a marker file for the test, which then sets the next
# offset): the monotonic time the offset was seen, and every clock it can
# read, each taken right after the monotonic one. While retrying it reads
# clocks only, no files, so it is the clock reads that must notice a changed
# control file. It tells the real time by its wall clock at start (when no
# offset is set) moved on by its monotonic clock; the test checks the samples
# against its own clocks.
CLOCK_CHILD = r"""
import calendar, ctypes, datetime, json, os, sys, time

markers, schedule = sys.argv[1], json.loads(sys.argv[2])

class Timeval(ctypes.Structure):
    _fields_ = [("sec", ctypes.c_long), ("usec", ctypes.c_long)]

libc = ctypes.CDLL(None)  # finds the preloaded gettimeofday first, as C callers do

def gettimeofday():
    tv = Timeval()
    if libc.gettimeofday(ctypes.byref(tv), None) != 0:
        sys.exit("gettimeofday failed")
    return tv.sec + tv.usec / 1e6

def publish(name, data):
    temp = os.path.join(markers, name + ".tmp")
    with open(temp, "w") as f:
        json.dump(data, f)
    os.replace(temp, os.path.join(markers, name))

base_wall, base_mono = time.time(), time.monotonic()

def observed_offset():
    return time.time() - (base_wall + (time.monotonic() - base_mono))

for step, offset_ms in enumerate(schedule):
    deadline = time.monotonic() + 10.0
    while abs(observed_offset() - offset_ms / 1000) > 1.0:
        if time.monotonic() > deadline:
            sys.exit(f"step {step}: offset {offset_ms} ms not seen, {observed_offset()} s")
        time.sleep(0.0005)
    sample = {"seen_at": time.monotonic(), "monotonic": time.monotonic(),
              "boottime": time.clock_gettime(time.CLOCK_BOOTTIME),
              "time": time.time(), "time_ns": time.time_ns() / 1e9,
              # naive local time; TZ=UTC makes it UTC
              "datetime": datetime.datetime.now().replace(
                  tzinfo=datetime.timezone.utc).timestamp(),
              "gmtime": calendar.timegm(time.gmtime()),  # time(NULL)
              "gettimeofday": gettimeofday(),
              "realtime_coarse": time.clock_gettime(5),
              "tai_minus_realtime": time.clock_gettime(time.CLOCK_TAI) - time.time()}
    publish(f"sample-{step}", sample)
"""

# Runs in the child: one look at the clocks, and a pwrite on a file inside
# the faulty directory and on one outside.
CLOCK_AND_FAULT_CHILD = r"""
import json, os, sys, time

def pwrite_errno(path):
    fd = os.open(path, os.O_RDWR)
    try:
        os.pwrite(fd, b"x", 0)
        return 0
    except OSError as e:
        return e.errno
    finally:
        os.close(fd)

sample = {"monotonic": time.monotonic(), "time": time.time()}
sample["inside"] = pwrite_errno(sys.argv[1])
sample["outside"] = pwrite_errno(sys.argv[2])
print(json.dumps(sample))
"""

WALL_CLOCKS = ("time", "time_ns", "datetime", "gmtime", "gettimeofday", "realtime_coarse")
CLOCK_TOLERANCE = 2.0  # seconds
TWO_DAYS_MS = 2 * 86_400_000
ONE_HOUR_MS = 3_600_000


def child_env(faulty: FaultyDir) -> dict[str, str]:
    return {**os.environ, **faulty.env(), "TZ": "UTC"}


def check_clock_sample(sample: dict, offset_ms: int) -> None:
    """The child's wall clocks read the real time plus ``offset_ms`` (within
    CLOCK_TOLERANCE), its monotonic clock the real monotonic time: both
    against this process's clocks, which the library does not touch."""
    mono_now, wall_now = time.monotonic(), time.time()
    # CLOCK_MONOTONIC is system-wide: the child's reading, taken a moment
    # ago, is a little behind ours, not two days or an hour off.
    assert 0 <= mono_now - sample["monotonic"] < 5, (mono_now, sample)
    real_then = wall_now - (mono_now - sample["monotonic"])
    for clock in WALL_CLOCKS:
        if clock in sample:
            shift = sample[clock] - real_then
            assert abs(shift - offset_ms / 1000) < CLOCK_TOLERANCE, (clock, shift, offset_ms)


def run_clock_and_fault_child(faulty: FaultyDir, dirs: dict[str, str]) -> dict:
    argv = [sys.executable, "-I", "-S", "-c", CLOCK_AND_FAULT_CHILD,
            os.path.join(dirs["inside"], "f"), os.path.join(dirs["outside"], "f")]
    proc = subprocess.run(argv, env=child_env(faulty), capture_output=True, text=True,
                          timeout=CHILD_TIMEOUT)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


@pytest.fixture(scope="module")
def library(tmp_path_factory) -> str:
    return faultyio.build(str(tmp_path_factory.mktemp("faultyio-build")))


@pytest.fixture
def dirs(tmp_path) -> dict[str, str]:
    """The faulty directory, a sibling sharing its name as a prefix, and an
    unrelated one; each with a file ``f`` to open and ``g`` to rename."""
    paths = {"inside": tmp_path / "data", "sibling": tmp_path / "datax",
             "outside": tmp_path / "other"}
    for path in paths.values():
        path.mkdir()
        (path / "f").write_bytes(CONTENT)
        (path / "g").write_bytes(CONTENT)
    return {name: str(path) for name, path in paths.items()}


@pytest.fixture
def faulty(library, dirs, tmp_path) -> FaultyDir:
    return FaultyDir(dirs["inside"], str(tmp_path / "control"), library=library)


def run_ops(faulty: FaultyDir, dirs: dict[str, str]) -> dict[str, dict[str, str]]:
    proc = subprocess.run([sys.executable, "-I", "-S", "-c", OPS_CHILD, json.dumps(dirs)],
                          env={**os.environ, **faulty.env()}, capture_output=True, text=True,
                          timeout=CHILD_TIMEOUT)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


ALL_OPS = ("open_existing", "write", "pwrite", "pwritev", "fsync", "pread", "read", "preadv",
           "ftruncate_grow", "ftruncate_shrink", "builtin_write", "truncate_grow", "open_new",
           "rename")
WRITES = ("write", "pwrite", "pwritev", "builtin_write")


def expected(**failures: str) -> dict[str, str]:
    return {op: failures.get(op, "OK") for op in ALL_OPS}


@pytest.mark.parametrize("fault, inside", [
    (None, expected()),
    ("write", expected(**dict.fromkeys(
        WRITES + ("ftruncate_grow", "ftruncate_shrink", "truncate_grow"), "EIO"))),
    # A full disk refuses to grow a file, not to shrink one.
    ("enospc", expected(**dict.fromkeys(
        WRITES + ("ftruncate_grow", "truncate_grow"), "ENOSPC"))),
    ("fsync", expected(fsync="EIO")),
    ("read", expected(pread="EIO", read="EIO", preadv="EIO")),
    ("open", {**expected(open_existing="EIO", builtin_write="EIO", open_new="EIO",
                         rename="EIO"),
              **{op: "no-fd" for op in ALL_OPS[1:10]}}),
])
def test_fault_hits_only_the_directory(faulty, dirs, fault, inside):
    if fault is not None:
        faulty.inject(fault)
    results = run_ops(faulty, dirs)
    assert results["inside"] == inside
    # "/…/datax" is not under "/…/data", and elsewhere is elsewhere.
    assert results["sibling"] == expected()
    assert results["outside"] == expected()


def test_write_and_enospc_together(faulty, dirs):
    faulty.inject("write", "enospc")
    inside = run_ops(faulty, dirs)["inside"]
    assert [inside[op] for op in WRITES] == ["ENOSPC"] * len(WRITES)
    # Shrinking is no ENOSPC, but still a failed write.
    assert inside["ftruncate_shrink"] == "EIO"


def wait_for(path: str, proc: subprocess.Popen, limit: float = 10.0) -> None:
    deadline = time.monotonic() + limit
    while not os.path.exists(path):
        if proc.poll() is not None:
            pytest.fail(f"child exited early: {proc.communicate()[1]}")
        if time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"no {os.path.basename(path)} marker after {limit} s")
        time.sleep(0.001)


def test_fault_injected_while_running_reaches_open_fds(faulty, dirs, tmp_path):
    markers = tmp_path / "markers"
    markers.mkdir()
    argv = [sys.executable, "-I", "-S", "-c", LIVE_CHILD,
            os.path.join(dirs["inside"], "f"), os.path.join(dirs["outside"], "f"), str(markers)]
    proc = subprocess.Popen(argv, env={**os.environ, **faulty.env()},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(str(markers / "ready"), proc)
        faulty.inject("write")
        (markers / "injected").touch()
        wait_for(str(markers / "faulted"), proc)
        faulty.clear()
        (markers / "cleared").touch()
        out, err = proc.communicate(timeout=CHILD_TIMEOUT)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err
    report = json.loads(out)
    assert report["before"] == 0
    assert report["fault"] == errno.EIO
    assert report["outside_during_fault"] == 0
    assert report["healed"] == 0
    # The library promises 10 ms; the bound here leaves room for a loaded machine.
    assert report["fault_latency"] is not None and report["fault_latency"] < 0.5
    assert report["heal_latency"] is not None and report["heal_latency"] < 0.5


def test_control_file_api(faulty, monkeypatch):
    assert faulty.faults() == ()  # no control file yet: no faults
    faulty.inject("read", "fsync")
    assert faulty.faults() == ("read", "fsync")
    faulty.inject("enospc")
    assert faulty.faults() == ("enospc",)
    faulty.clear()
    assert faulty.faults() == ()
    with pytest.raises(ValueError, match="unknown fault"):
        faulty.inject("write", "explode")
    assert faulty.faults() == ()  # a rejected inject changes nothing

    monkeypatch.setenv("LD_PRELOAD", "/already/there.so")
    env = faulty.env()
    assert env["LD_PRELOAD"].split(":") == [faulty._library, "/already/there.so"]
    assert env["KRAFTLOG_FAULTYIO_DIR"] == os.path.realpath(faulty.directory)
    assert env["KRAFTLOG_FAULTYIO_CONTROL"] == faulty.control_path


def test_build_is_cached_and_reports_compiler_errors(library, tmp_path, monkeypatch):
    assert faultyio.build(os.path.dirname(library)) == library
    broken = tmp_path / "broken.c"
    broken.write_text("int broken(void) { return }\n")
    monkeypatch.setattr(faultyio, "SOURCE", str(broken))
    with pytest.raises(RuntimeError, match="error"):
        faultyio.build(str(tmp_path / "cache"))
    assert not [name for name in os.listdir(tmp_path / "cache") if name.endswith(".tmp")]


def test_clock_jumps_while_running(faulty, tmp_path):
    markers = tmp_path / "markers"
    markers.mkdir()
    # No control file at the start: no offset. Then forward, back (changed
    # while the child runs, not merely set before it starts), and cleared.
    steps = [(None, 0), (lambda: faulty.shift_clock(TWO_DAYS_MS), TWO_DAYS_MS),
             (lambda: faulty.shift_clock(-ONE_HOUR_MS), -ONE_HOUR_MS),
             (faulty.clear, 0)]
    schedule = json.dumps([offset_ms for _, offset_ms in steps])
    proc = subprocess.Popen([sys.executable, "-I", "-S", "-c", CLOCK_CHILD, str(markers),
                             schedule],
                            env=child_env(faulty), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    samples = []
    try:
        for step, (change, offset_ms) in enumerate(steps):
            changed_at = time.monotonic()  # before: the child cannot see it sooner
            if change is not None:
                change()
            assert faulty.clock_offset_ms() == offset_ms
            wait_for(str(markers / f"sample-{step}"), proc)
            sample = json.loads((markers / f"sample-{step}").read_text())
            check_clock_sample(sample, offset_ms)
            if change is not None:
                # The library promises 10 ms; the bound leaves room for a
                # loaded machine.
                assert 0 <= sample["seen_at"] - changed_at < 0.5
            samples.append(sample)
        _, err = proc.communicate(timeout=CHILD_TIMEOUT)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err
    boot_now = time.clock_gettime(time.CLOCK_BOOTTIME)
    tai_minus_realtime = time.clock_gettime(time.CLOCK_TAI) - time.time()
    for sample in samples:
        assert 0 <= boot_now - sample["boottime"] < 10  # CLOCK_BOOTTIME: not shifted
        # CLOCK_TAI moves with CLOCK_REALTIME: the same (kernel) distance apart.
        assert abs(sample["tai_minus_realtime"] - tai_minus_realtime) < 0.5
    # The monotonic clock ran on steadily through every jump.
    monotonic = [sample["monotonic"] for sample in samples]
    assert monotonic == sorted(monotonic)


def test_clock_offset_and_disk_faults_combine(faulty, dirs):
    faulty.inject("write")
    faulty.shift_clock(-2 * ONE_HOUR_MS)
    assert faulty.faults() == ("write",)
    sample = run_clock_and_fault_child(faulty, dirs)
    assert (sample["inside"], sample["outside"]) == (errno.EIO, 0)
    check_clock_sample(sample, -2 * ONE_HOUR_MS)

    faulty.inject("fsync")  # a new fault: the disk writes again, the clock stays
    assert faulty.clock_offset_ms() == -2 * ONE_HOUR_MS
    sample = run_clock_and_fault_child(faulty, dirs)
    assert (sample["inside"], sample["outside"]) == (0, 0)
    check_clock_sample(sample, -2 * ONE_HOUR_MS)


def test_clock_tokens_parsed_alike_in_library_and_api(library, dirs, tmp_path):
    # The directory does not exist: the clock offset applies regardless.
    faulty = FaultyDir(str(tmp_path / "nowhere"), str(tmp_path / "control"), library=library)
    with open(faulty.control_path, "w") as f:
        f.write("clock=3600000 write\tclock=-86400000\nclock=12x clock= clock=--5 clock=+ "
                "clock=1.5 clock=99999999999999999999 clock=1000000000000001 CLOCK=5\n")
    assert faulty.clock_offset_ms() == -86_400_000  # the last well-formed one
    assert faulty.faults() == ("write",)
    sample = run_clock_and_fault_child(faulty, dirs)
    assert (sample["inside"], sample["outside"]) == (0, 0)  # not under "nowhere"
    check_clock_sample(sample, -86_400_000)


def test_clock_api(faulty):
    assert faulty.clock_offset_ms() == 0  # no control file yet
    faulty.shift_clock(5000)
    assert (faulty.faults(), faulty.clock_offset_ms()) == ((), 5000)
    faulty.inject("read", "fsync")  # keeps the offset
    assert (faulty.faults(), faulty.clock_offset_ms()) == (("read", "fsync"), 5000)
    faulty.shift_clock(-1)  # sets, does not add; keeps the faults
    assert (faulty.faults(), faulty.clock_offset_ms()) == (("read", "fsync"), -1)
    faulty.shift_clock(faultyio.CLOCK_MAX_MS)
    assert faulty.clock_offset_ms() == faultyio.CLOCK_MAX_MS
    faulty.shift_clock(0)
    assert (faulty.faults(), faulty.clock_offset_ms()) == (("read", "fsync"), 0)
    with open(faulty.control_path) as f:
        assert f.read().split() == ["read", "fsync"]
    faulty.shift_clock(-ONE_HOUR_MS)
    faulty.clear()  # faults and offset both
    assert (faulty.faults(), faulty.clock_offset_ms()) == ((), 0)

    faulty.shift_clock(7)
    for bad, error in ((1.5, TypeError), (True, TypeError), ("5", TypeError),
                       (faultyio.CLOCK_MAX_MS + 1, ValueError),
                       (-faultyio.CLOCK_MAX_MS - 1, ValueError)):
        with pytest.raises(error):
            faulty.shift_clock(bad)
    with pytest.raises(ValueError, match="unknown fault"):
        faulty.inject("explode")
    assert (faulty.faults(), faulty.clock_offset_ms()) == ((), 7)  # rejected: no change


# Runs in the child: files written, synced, truncated and written again the
# ways a broker does, then killed by itself (no clean exit) before syncing
# the rest. argv: directory.
POWER_CHILD = r"""
import os, signal, sys
d = sys.argv[1]
def make(name):
    return os.open(os.path.join(d, name), os.O_RDWR | os.O_CREAT, 0o644)
a = make("synced-then-more")
os.write(a, b"a" * 100); os.fsync(a); os.write(a, b"b" * 50)
b = make("never-synced")
os.write(b, b"c" * 80)
c = make("truncated-after-sync")
os.write(c, b"d" * 100); os.fdatasync(c); os.ftruncate(c, 40); os.pwrite(c, b"e" * 30, 40)
os.makedirs(os.path.join(d, "sub"))
e = make("sub/synced")
os.write(e, b"f" * 10); os.fsync(e)
# A file replaced whole, as checkpoints are: written and synced, then renamed.
t = make("checkpoint.tmp")
os.write(t, b"g" * 20); os.fsync(t); os.rename(os.path.join(d, "checkpoint.tmp"),
                                               os.path.join(d, "checkpoint"))
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_power_loss_cuts_each_file_back_to_its_last_sync(library, tmp_path):
    """A real process with the library preloaded journals its syncs;
    lose_unsynced then leaves what a machine losing power could: each file
    as at its last fsync or fdatasync, lowered by a truncation since, a file
    never synced empty, a file renamed after its sync whole. Run again on
    what it left, it cuts nothing (the journal now names the disk as is)."""
    data = tmp_path / "data"
    data.mkdir()
    syncs = str(tmp_path / "syncs")
    faulty = FaultyDir(str(data), str(tmp_path / "control"), library=library)
    proc = subprocess.run([sys.executable, "-I", "-S", "-c", POWER_CHILD, str(data)],
                          env={**os.environ, **faulty.env(syncs=syncs)}, capture_output=True,
                          timeout=CHILD_TIMEOUT)
    assert proc.returncode == -9, proc.stderr
    sizes = {p.relative_to(data).as_posix(): p.stat().st_size
             for p in data.rglob("*") if p.is_file()}
    assert sizes == {"synced-then-more": 150, "never-synced": 80,
                     "truncated-after-sync": 70, "sub/synced": 10, "checkpoint": 20}

    loss = faultyio.lose_unsynced([str(data)], syncs)

    after = {p.relative_to(data).as_posix(): p.stat().st_size
             for p in data.rglob("*") if p.is_file()}
    assert after == {"synced-then-more": 100, "never-synced": 0,
                     "truncated-after-sync": 40, "sub/synced": 10, "checkpoint": 20}
    assert (data / "synced-then-more").read_bytes() == b"a" * 100
    assert (data / "truncated-after-sync").read_bytes() == b"d" * 40
    assert (loss.files, loss.bytes) == (3, 50 + 80 + 30)
    again = faultyio.lose_unsynced([str(data)], syncs)
    assert (again.files, again.bytes) == (0, 0)


# Runs in the child: a group flush as the broker's (kraftlog's own
# sync_filesystem through a log dir's lock file), then more writes, killed
# before any other sync. argv: log dir, "fail" to have the fsync fault on.
SYNCFS_CHILD = r"""
import os, signal, sys
from storage.checkpoint import sync_filesystem
d = sys.argv[1]
lock = os.open(os.path.join(d, ".lock"), os.O_RDWR | os.O_CREAT, 0o644)
os.makedirs(os.path.join(d, "t-0"))
seg = os.open(os.path.join(d, "t-0", "0.log"), os.O_RDWR | os.O_CREAT, 0o644)
os.write(seg, b"a" * 100)
try:
    sync_filesystem(lock)
except OSError as exc:
    print(exc.errno, flush=True)
os.write(seg, b"b" * 50)
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_filesystem_sync_is_journalled_and_faulted_as_an_fsync(library, tmp_path):
    """syncfs through a log dir's fd makes every file under that dir durable
    at its size when the call began: a power loss keeps those sizes. With
    the fsync fault on, syncfs fails with EIO and nothing counts as synced;
    a syncfs the kill interrupted (its sizes journalled, no commit line)
    counts for nothing either."""
    from pathlib import Path

    repo = str(Path(__file__).resolve().parents[2])
    for fail in (False, True):
        data = tmp_path / f"data-{fail}"
        data.mkdir()
        syncs = str(tmp_path / f"syncs-{fail}")
        faulty = FaultyDir(str(data), str(tmp_path / f"control-{fail}"), library=library)
        if fail:
            faulty.inject("fsync")
        proc = subprocess.run([sys.executable, "-c", SYNCFS_CHILD, str(data)],
                              env={**os.environ, **faulty.env(syncs=syncs), "PYTHONPATH": repo},
                              capture_output=True, text=True, timeout=CHILD_TIMEOUT)
        assert proc.returncode == -9, proc.stderr
        assert proc.stdout.split() == (["5"] if fail else [])  # EIO
        assert (data / "t-0" / "0.log").stat().st_size == 150
        faultyio.lose_unsynced([str(data)], syncs)
        assert (data / "t-0" / "0.log").stat().st_size == (0 if fail else 100)

    journal = tmp_path / "torn"
    journal.write_text("P 7.1 1 5 100\nP 7.1 1 6 30\nC 7.1\nP 7.2 1 5 900\n"
                       "P 8.1 1 9 40\nC 8.", encoding="ascii")
    assert faultyio.durable_sizes(str(journal)) == {(1, 5): 100, (1, 6): 30}


def test_the_sync_journal_is_read_as_a_crash_leaves_it(tmp_path):
    """Sizes journalled out of order by two threads syncing one file keep
    the largest; a truncation lowers it; a last line the kill cut short is
    ignored; no journal at all is an error, not an emptied disk."""
    journal = tmp_path / "syncs"
    journal.write_text("S 1 7 200\nS 1 7 100\nS 1 8 50\nT 1 8 20\nS 1 9 10\nS 1 10 5678\n"
                       "S 1 9 56", encoding="ascii")
    assert faultyio.durable_sizes(str(journal)) == {(1, 7): 200, (1, 8): 20, (1, 9): 10,
                                                   (1, 10): 5678}
    with pytest.raises(FileNotFoundError):
        faultyio.lose_unsynced([str(tmp_path)], str(tmp_path / "missing"))


def test_a_process_started_after_a_torn_journal_line_starts_a_new_line(library, tmp_path):
    journal = tmp_path / "syncs"
    journal.write_bytes(b"S 1 2 3\nS 1 2 4")  # the last write of a killed process, cut
    target = tmp_path / "f"
    faulty = FaultyDir(str(tmp_path), str(tmp_path / "control"), library=library)
    child = ("import os, sys; fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT); "
             "os.write(fd, b'x' * 9); os.fsync(fd)")
    subprocess.run([sys.executable, "-I", "-S", "-c", child, str(target)], check=True,
                   env={**os.environ, **faulty.env(syncs=str(journal))}, timeout=CHILD_TIMEOUT)
    st = target.stat()
    assert journal.read_text(encoding="ascii").splitlines()[1:] == [
        "S 1 2 4!", f"S {st.st_dev} {st.st_ino} 9"]
    # The cut line (perhaps "S 1 2 45" once) is not taken for a size of 4.
    assert faultyio.durable_sizes(str(journal))[(1, 2)] == 3


def test_the_nemesis_names_the_boot_record_the_broker_keeps():
    from chaos import nemesis
    from storage import manager
    assert nemesis.BOOT_ID_FILE == manager.BOOT_ID_FILE
