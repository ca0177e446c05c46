"""Disk errors and clock jumps for a real broker process, without root.

Why: a broker must survive a failing disk (EIO) and a full one (ENOSPC), and
the only faithful way to test that is to make the real system calls of a real
broker process fail. Device mapper or FUSE could do it, but need root; this
needs nothing but the process's environment.

How: ``faultyio.c`` is a small shared library, loaded into the process with
``LD_PRELOAD``, that wraps the C library's file calls (open, read, write,
pwritev, fsync, ftruncate, rename, ...). While a control file names a fault,
the wrapped calls on files under the chosen directory fail at once with that
error, without touching the disk; everything else runs as usual. The library
notices a rewritten control file within a millisecond or two of the next I/O
call, so faults can be switched on and off while the broker runs, and they hit
files the broker already has open.

The same control file can also step the process's wall clock forward or
backward (``shift_clock``): clock_gettime on CLOCK_REALTIME (and its COARSE
and TAI variants), gettimeofday and time return the real time plus an offset,
so ``time.time()``, ``time.time_ns()`` and ``datetime.now()`` jump, while
``time.monotonic()`` and every other clock keep running as they were. The
offset is process-wide, whatever the directory.

Usage::

    faulty = FaultyDir(data_dir, control_path)
    proc = subprocess.Popen(argv, env={**os.environ, **faulty.env()})
    faulty.inject("write")      # every write under data_dir now fails with EIO
    faulty.inject("enospc")     # ... or the disk is full
    faulty.shift_clock(2 * 86_400_000)  # the wall clock is two days ahead
    faulty.shift_clock(-3_600_000)      # ... or an hour behind (faults stay)
    faulty.clear()              # the disk is healthy and the clock right again

A power loss (``lose_unsynced``): run the process with ``env(syncs=path)``
and the library journals, in ``path``, each file's size at every fsync and
every truncation. After the process is killed, ``lose_unsynced`` cuts each
file under the given directories back to what it had when last synced (a
file never synced to nothing): what a machine that lost power would find,
where ``kill -9`` alone keeps every write in the page cache.

Only calls that go through the wrapped symbols are affected: I/O through
mmap'ed memory, and files the C library opens for itself (fopen, opendir),
are not; nor are clocks read inside the C library (timespec_get, ftime),
straight from the vDSO or by system call (Go's runtime, static binaries), nor
absolute CLOCK_REALTIME deadlines handed to the kernel (pthread_cond_timedwait,
clock_nanosleep), which stay real: CPython waits on CLOCK_MONOTONIC, so this
does not matter for it, but it can for a JVM or a C program. Needs Linux with
glibc, /proc, and a C compiler (``cc``).
"""

from __future__ import annotations

import hashlib
import os
import stat
import subprocess
import tempfile
from dataclasses import dataclass, field

SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "faultyio.c")

# The faults a control file can name (see faultyio.c for the exact calls):
#   write  - writes, pwritev, ftruncate and truncate fail with EIO
#   read   - reads fail with EIO
#   fsync  - fsync and fdatasync fail with EIO
#   enospc - writes, and truncations that grow a file, fail with ENOSPC
#   open   - opening, creating or renaming anything there fails with EIO
FAULTS = ("write", "read", "fsync", "enospc", "open")

# The control-file token for the wall-clock offset, "clock=<signed ms>", and
# the largest offset the library takes (CLOCK_MAX_MS in faultyio.c).
_CLOCK_PREFIX = "clock="
CLOCK_MAX_MS = 10**15

_COMPILE = ["-shared", "-fPIC", "-O2"]


def build(cache_dir: str | None = None) -> str:
    """Compile the fault library (once per version of its source) and return
    the path of the ``.so`` to put in ``LD_PRELOAD``.

    The library is cached in ``cache_dir`` (by default ``kraftlog-faultyio``
    in the temp directory) under a name carrying a hash of the source, so an
    edited source is rebuilt and concurrent builds never see a half-written
    file. Raises RuntimeError, with the compiler's output, if it fails."""
    with open(SOURCE, "rb") as f:
        source = f.read()
    digest = hashlib.sha256(source + " ".join(_COMPILE).encode()).hexdigest()[:16]
    if cache_dir is None:
        cache_dir = os.path.join(tempfile.gettempdir(), "kraftlog-faultyio")
    os.makedirs(cache_dir, exist_ok=True)
    out = os.path.join(cache_dir, f"faultyio-{digest}.so")
    if os.path.exists(out):
        return out
    # Compile under a name of our own, then rename: the rename is atomic, so
    # another process building at the same time gets one whole file or none.
    fd, temp = tempfile.mkstemp(prefix=f"faultyio-{digest}.", suffix=".tmp", dir=cache_dir)
    os.close(fd)
    try:
        try:
            result = subprocess.run(["cc", *_COMPILE, "-o", temp, SOURCE, "-ldl"],
                                    capture_output=True, text=True, timeout=120)
        except FileNotFoundError:
            raise RuntimeError("cannot build faultyio: no C compiler (cc) found") from None
        if result.returncode != 0:
            raise RuntimeError(f"cannot build faultyio: cc exited with {result.returncode}:\n"
                               f"{result.stderr.strip()}")
        os.replace(temp, out)
    finally:
        if os.path.exists(temp):
            os.unlink(temp)
    return out


def _parse_clock(token: str) -> int | None:
    """The offset a ``clock=`` token sets, or None if it is not a well-formed
    one (which the library ignores): exactly as faultyio.c parses it."""
    if not token.startswith(_CLOCK_PREFIX):
        return None
    value = token[len(_CLOCK_PREFIX):]
    digits = value[1:] if value[:1] in ("+", "-") else value
    if not digits or not all("0" <= c <= "9" for c in digits):
        return None
    ms = int(digits)
    if ms > CLOCK_MAX_MS:
        return None
    return -ms if value.startswith("-") else ms


class FaultyDir:
    """One directory whose disk can be made to fail, a wall clock that can be
    made to jump, and the switch for both.

    Start the process under test with ``env()`` in its environment, then call
    ``inject``, ``shift_clock`` and ``clear`` at any time: the process sees
    the change on its next file call or wall-clock read, within a few
    milliseconds, including on files it already has open. The directory
    itself (a broker's data directory, say) may be created later. Keep
    ``control_path`` outside it (a broker would take it for a stray file of
    its own), on a local file system.

    Faults and the clock offset are independent settings in one control
    file: ``inject`` replaces the faults and keeps the offset,
    ``shift_clock`` replaces the offset and keeps the faults, and ``clear``
    resets both. Each reads the file and writes it back whole, so drive one
    control file from one thread at a time."""

    def __init__(self, directory: str, control_path: str, *, library: str | None = None):
        # The library compares against the paths the kernel reports for open
        # files, which have symlinks resolved: so must this directory be.
        self.directory = os.path.realpath(directory)
        self.control_path = os.path.abspath(control_path)
        self._library = library

    def env(self, syncs: str | None = None) -> dict[str, str]:
        """The environment variables that put the process under this switch:
        ``LD_PRELOAD`` (the library first, then whatever this process's
        ``LD_PRELOAD`` already held) and the library's two settings. Merge
        them into the child's environment: ``{**os.environ, **d.env()}``.
        ``syncs``: the path of the sync journal ``lose_unsynced`` reads."""
        if self._library is None:
            self._library = build()
        preload = self._library
        if os.environ.get("LD_PRELOAD"):
            preload = f"{preload}:{os.environ['LD_PRELOAD']}"
        env = {"LD_PRELOAD": preload,
               "KRAFTLOG_FAULTYIO_DIR": self.directory,
               "KRAFTLOG_FAULTYIO_CONTROL": self.control_path}
        if syncs is not None:
            env["KRAFTLOG_FAULTYIO_SYNCS"] = os.path.abspath(syncs)
        return env

    def inject(self, *faults: str) -> None:
        """Make file calls under the directory fail: each argument is one of
        ``FAULTS``. Replaces the faults injected before (``inject("read",
        "fsync")`` means both at once; ``inject()`` heals the disk) and keeps
        the clock offset as it is. Raises ValueError for an unknown fault."""
        for fault in faults:
            if fault not in FAULTS:
                raise ValueError(f"unknown fault {fault!r}: expected one of {', '.join(FAULTS)}")
        self._store(faults, self.clock_offset_ms())

    def shift_clock(self, ms: int) -> None:
        """Set the process's wall clock to run ``ms`` milliseconds ahead of
        the real one (behind, if negative); ``shift_clock(0)`` puts it right.
        This sets the offset, it does not add to it. The injected faults
        stay. Raises TypeError unless ``ms`` is an int, and ValueError if its
        magnitude exceeds ``CLOCK_MAX_MS``."""
        if not isinstance(ms, int) or isinstance(ms, bool):
            raise TypeError(f"clock offset must be an int of milliseconds, not {ms!r}")
        if abs(ms) > CLOCK_MAX_MS:
            raise ValueError(f"clock offset {ms} ms is beyond +/-{CLOCK_MAX_MS} ms")
        self._store(self.faults(), ms)

    def clear(self) -> None:
        """Heal the disk and put the clock right: no faults, no offset."""
        self._write("")

    def faults(self) -> tuple[str, ...]:
        """The faults now injected, as the library reads them (none if the
        control file does not exist)."""
        try:
            with open(self.control_path, encoding="utf-8") as f:
                tokens = f.read().split()
        except FileNotFoundError:
            return ()
        return tuple(t for t in tokens if t in FAULTS)

    def clock_offset_ms(self) -> int:
        """The wall-clock offset now set, in milliseconds, as the library
        reads it: the last well-formed ``clock=`` token, or 0 (also if the
        control file does not exist)."""
        try:
            with open(self.control_path, encoding="utf-8") as f:
                tokens = f.read().split()
        except FileNotFoundError:
            return 0
        offset = 0
        for token in tokens:
            ms = _parse_clock(token)
            if ms is not None:
                offset = ms
        return offset

    def _store(self, faults: tuple[str, ...], clock_ms: int) -> None:
        tokens = list(faults)
        if clock_ms:
            tokens.append(f"{_CLOCK_PREFIX}{clock_ms}")
        self._write(" ".join(tokens) + "\n" if tokens else "")

    def _write(self, text: str) -> None:
        # A new file renamed over the old one, so the library never reads a
        # half-written control file. (It spots the change by the file's
        # inode, size and mtime, and re-reads a file changed in the last 50
        # ms anyway, as two writes can share an mtime tick.)
        _replace_file(self.control_path, text)


def _replace_file(path: str, text: str) -> None:
    """Write ``text`` to a new file beside ``path`` and rename it over
    ``path``: a reader sees the old file or the new one, never half."""
    fd, temp = tempfile.mkstemp(prefix=".faultyio-", suffix=".tmp",
                                dir=os.path.dirname(os.path.abspath(path)))
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(temp, path)
    except BaseException:
        if os.path.exists(temp):
            os.unlink(temp)
        raise


# -- power loss ---------------------------------------------------------------------
@dataclass
class Loss:
    """What ``lose_unsynced`` took: files cut and bytes dropped."""

    files: int = 0
    bytes: int = 0
    #: The files cut, as (path, size before, size after).
    cuts: list[tuple[str, int, int]] = field(default_factory=list)


def durable_sizes(syncs: str) -> dict[tuple[int, int], int]:
    """(dev, inode) -> the bytes a power loss keeps of that file, from the
    sync journal: the largest size a sync covered, lowered by every
    truncation since (a truncation may reach the disk before the writes
    after it). Two threads syncing one file may journal their sizes out of
    order, hence the largest. A file the journal does not name was never
    synced. Raises FileNotFoundError if there is no journal (the library was
    not preloaded, or could not open it): cutting every file to nothing
    would be a loss no crash makes."""
    durable: dict[tuple[int, int], int] = {}
    with open(syncs, encoding="ascii", errors="replace") as f:
        text = f.read()
    # A last line without its newline was cut short by the kill.
    lines = text.split("\n")[:-1]
    # A syncfs's "P" lines count, as syncs where they stand, once its "C"
    # line says the call succeeded.
    committed = {line[2:] for line in lines if line.startswith("C ")}
    for line in lines:
        parts = line.split()
        if len(parts) == 5 and parts[0] == "P" and parts[1] in committed:
            parts = ["S", *parts[2:]]
        if len(parts) != 4 or parts[0] not in ("S", "T") \
                or not all(p.isdigit() for p in parts[1:]):
            continue
        key, size = (int(parts[1]), int(parts[2])), int(parts[3])
        if parts[0] == "S":
            durable[key] = max(durable.get(key, 0), size)
        elif key in durable:
            durable[key] = min(durable[key], size)
    return durable


def lose_unsynced(directories: list[str], syncs: str) -> Loss:
    """A power loss of the machine whose process (dead now: call this only
    after it was killed) journalled its syncs in ``syncs``: every regular
    file under ``directories`` is cut to what it had at its last fsync (to
    nothing if it was never synced), which is one of the states a crash
    that keeps only what fsync promises may leave. Directory entries
    (creations, renames, deletions) are kept as they are, and data
    overwritten in place since the last sync is not rolled back (kraftlog
    writes logs and indexes by appending and replaces other files whole).
    A file whose inode number a deleted, synced file had counts as synced
    to that size: this may lose less than such a crash, never more, for a
    process that makes data durable only by fsync, fdatasync and syncfs
    (a syncfs counts for the files under the directory of the fd it was
    given; writes through O_SYNC or O_DSYNC, sync_file_range or msync are
    not journalled, and kraftlog uses none of them). The journal is then
    rewritten to name every file at its new size, which is what the disk
    now holds, for the next incarnation to append to."""
    durable = durable_sizes(syncs)
    loss = Loss()
    survivors: list[str] = []
    for top in directories:
        for root, _dirs, files in os.walk(top):
            for name in files:
                path = os.path.join(root, name)
                try:
                    st = os.lstat(path)
                except FileNotFoundError:
                    continue
                if not stat.S_ISREG(st.st_mode):
                    continue
                keep = durable.get((st.st_dev, st.st_ino), 0)
                try:
                    if st.st_size > keep:
                        os.truncate(path, keep)
                        loss.files += 1
                        loss.bytes += st.st_size - keep
                        loss.cuts.append((path, st.st_size, keep))
                    st = os.lstat(path)
                except FileNotFoundError:
                    continue  # removed meanwhile (a child process of the node's)
                survivors.append(f"S {st.st_dev} {st.st_ino} {st.st_size}\n")
    _replace_file(syncs, "".join(survivors))
    return loss
