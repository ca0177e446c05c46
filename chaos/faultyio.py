"""Disk errors for a real broker process, on one directory, without root.

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

Usage::

    faulty = FaultyDir(data_dir, control_path)
    proc = subprocess.Popen(argv, env={**os.environ, **faulty.env()})
    faulty.inject("write")      # every write under data_dir now fails with EIO
    faulty.inject("enospc")     # ... or the disk is full
    faulty.clear()              # the disk is healthy again

Only calls that go through the wrapped symbols are affected: I/O through
mmap'ed memory, and files the C library opens for itself (fopen, opendir),
are not. Needs Linux with glibc, /proc, and a C compiler (``cc``).
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import tempfile

SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "faultyio.c")

# The faults a control file can name (see faultyio.c for the exact calls):
#   write  - writes, pwritev, ftruncate and truncate fail with EIO
#   read   - reads fail with EIO
#   fsync  - fsync and fdatasync fail with EIO
#   enospc - writes, and truncations that grow a file, fail with ENOSPC
#   open   - opening, creating or renaming anything there fails with EIO
FAULTS = ("write", "read", "fsync", "enospc", "open")

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


class FaultyDir:
    """One directory whose disk can be made to fail, and the switch for it.

    Start the process under test with ``env()`` in its environment, then call
    ``inject`` and ``clear`` at any time: the process sees the change on its
    next file call, within a few milliseconds, including on files it already
    has open. The directory itself (a broker's data directory, say) may be
    created later. Keep ``control_path`` outside it (a broker would take it
    for a stray file of its own), on a local file system."""

    def __init__(self, directory: str, control_path: str, *, library: str | None = None):
        # The library compares against the paths the kernel reports for open
        # files, which have symlinks resolved: so must this directory be.
        self.directory = os.path.realpath(directory)
        self.control_path = os.path.abspath(control_path)
        self._library = library

    def env(self) -> dict[str, str]:
        """The environment variables that put the process under this switch:
        ``LD_PRELOAD`` (the library first, then whatever this process's
        ``LD_PRELOAD`` already held) and the library's two settings. Merge
        them into the child's environment: ``{**os.environ, **d.env()}``."""
        if self._library is None:
            self._library = build()
        preload = self._library
        if os.environ.get("LD_PRELOAD"):
            preload = f"{preload}:{os.environ['LD_PRELOAD']}"
        return {"LD_PRELOAD": preload,
                "KRAFTLOG_FAULTYIO_DIR": self.directory,
                "KRAFTLOG_FAULTYIO_CONTROL": self.control_path}

    def inject(self, *faults: str) -> None:
        """Make file calls under the directory fail: each argument is one of
        ``FAULTS``. Replaces whatever was injected before (``inject("read",
        "fsync")`` means both at once; ``inject()`` is the same as
        ``clear()``). Raises ValueError for an unknown fault."""
        for fault in faults:
            if fault not in FAULTS:
                raise ValueError(f"unknown fault {fault!r}: expected one of {', '.join(FAULTS)}")
        self._write(" ".join(faults) + "\n" if faults else "")

    def clear(self) -> None:
        """Heal the disk: file calls under the directory work again."""
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

    def _write(self, text: str) -> None:
        # Write a new file and rename it over the old one, so the library
        # never reads a half-written control file. (It spots the change by
        # the file's inode, size and mtime, and re-reads a file changed in the
        # last 50 ms anyway, as two writes can share an mtime tick.)
        directory = os.path.dirname(self.control_path)
        fd, temp = tempfile.mkstemp(prefix=".faultyio-", suffix=".tmp", dir=directory)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(text)
            os.replace(temp, self.control_path)
        except BaseException:
            if os.path.exists(temp):
                os.unlink(temp)
            raise
