"""Small checkpoint files, written atomically, in Kafka's plain-text layout.

Every checkpoint is written by ``write_atomically``: write a temporary file,
fsync it, rename it over the old one, fsync the directory. A crash at any
point leaves either the old or the new file, never a mix.

Layout (as Kafka's ``CheckpointFile``)::

    <version>
    <number of entries>
    <entry>            one per line, fields separated by one space

``OffsetCheckpoint`` entries are ``topic partition offset`` and serve the
recovery point, log start offset and (later) high-watermark checkpoints of a
log directory. ``LeaderEpochCheckpoint`` entries are ``epoch start_offset``.
"""

from __future__ import annotations

import ctypes
import os
import re
import sys

VERSION = 0


def fsync_directory(path: str) -> None:
    """Make a directory's entries (created, renamed, deleted files) durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _find_syncfs():
    """libc's ``syncfs`` where it reports write-back errors (Linux 5.8 and
    later: before, it returned 0 even when the disk had failed a write, so a
    flush could pass for durable when it was not); None elsewhere."""
    if not sys.platform.startswith("linux"):
        return None
    match = re.match(r"(\d+)\.(\d+)", os.uname().release)
    if match is None or (int(match.group(1)), int(match.group(2))) < (5, 8):
        return None
    try:
        syncfs = ctypes.CDLL(None, use_errno=True).syncfs
    except (OSError, AttributeError):
        return None
    syncfs.argtypes = [ctypes.c_int]
    syncfs.restype = ctypes.c_int
    return syncfs


_syncfs = _find_syncfs()
#: Whether ``sync_filesystem`` can be used (else a caller fsyncs file by file).
SYNCFS_AVAILABLE = _syncfs is not None


def sync_filesystem(fd: int) -> None:
    """Make everything written to the filesystem holding ``fd`` durable: file
    data, new and renamed names, directories (Linux ``syncfs``: one journal
    commit instead of one per fsync'd file). Raises ``OSError`` if a
    write-back on that filesystem failed since ``fd`` was opened or last
    synced this way: which file lost data is then unknown. The GIL is let go
    meanwhile (ctypes)."""
    if _syncfs is None:
        raise OSError(0, "syncfs is not available here (Linux 5.8 or later is needed)")
    if _syncfs(fd) != 0:
        code = ctypes.get_errno()
        raise OSError(code, f"syncfs: {os.strerror(code)}")


def write_atomically(path: str, data: bytes, *, sync: bool = True,
                     sync_directory: bool = True) -> None:
    """Replace ``path`` with ``data`` (old or new after a crash, never a
    mix). ``sync=False`` skips both fsyncs: the caller makes the file and
    its name durable later (fsync the file, then its directory) and copes
    with finding the old content, or none, after a crash meanwhile.
    ``sync_directory=False`` skips the second only: the caller fsyncs the
    directory next anyway (for other names in it)."""
    tmp_path = path + ".tmp"
    fd = os.open(tmp_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        if sync:
            os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp_path, path)
    if sync and sync_directory:
        fsync_directory(os.path.dirname(os.path.abspath(path)))


class CheckpointFormatError(ValueError):
    """A checkpoint file that does not parse; the caller decides whether to
    fall back (for example to full recovery)."""


def _format(entries: list[tuple]) -> bytes:
    lines = [str(VERSION), str(len(entries))]
    lines.extend(" ".join(map(str, entry)) for entry in entries)
    return ("\n".join(lines) + "\n").encode()


def _parse(path: str, fields: int) -> list[list[str]]:
    with open(path, "rb") as f:
        raw = f.read()
    try:
        text = raw.decode("utf-8", errors="strict")
    except UnicodeDecodeError:
        raise CheckpointFormatError(f"{path}: not UTF-8 text") from None
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    if len(lines) < 2:
        raise CheckpointFormatError(f"{path}: missing version or count line")
    if lines[0] != str(VERSION):
        raise CheckpointFormatError(f"{path}: unknown checkpoint version {lines[0]!r}")
    try:
        count = int(lines[1])
    except ValueError:
        raise CheckpointFormatError(f"{path}: bad entry count {lines[1]!r}") from None
    body = lines[2:]
    if len(body) != count:
        raise CheckpointFormatError(f"{path}: expected {count} entries, found {len(body)}")
    rows = [line.split(" ") for line in body]
    for row in rows:
        if len(row) != fields:
            raise CheckpointFormatError(f"{path}: malformed entry {' '.join(row)!r}")
    return rows


class OffsetCheckpoint:
    """``{(topic, partition): offset}`` persisted in one file per log directory."""

    def __init__(self, path: str) -> None:
        self.path = path

    def write(self, offsets: dict[tuple[str, int], int]) -> None:
        entries = [(topic, partition, offset)
                   for (topic, partition), offset in sorted(offsets.items())]
        write_atomically(self.path, _format(entries))

    def read(self) -> dict[tuple[str, int], int]:
        """The stored offsets; ``{}`` when the file does not exist."""
        if not os.path.exists(self.path):
            return {}
        rows = _parse(self.path, 3)
        try:
            return {(topic, int(partition)): int(offset) for topic, partition, offset in rows}
        except ValueError as exc:
            raise CheckpointFormatError(f"{self.path}: {exc}") from exc


class LeaderEpochCheckpoint:
    """``[(epoch, start_offset), ...]`` for one partition."""

    def __init__(self, path: str) -> None:
        self.path = path

    def write(self, entries: list[tuple[int, int]], *, sync: bool = True,
              sync_directory: bool = True) -> None:
        write_atomically(self.path, _format(entries), sync=sync,
                         sync_directory=sync_directory)

    def read(self) -> list[tuple[int, int]]:
        if not os.path.exists(self.path):
            return []
        rows = _parse(self.path, 2)
        try:
            return [(int(epoch), int(offset)) for epoch, offset in rows]
        except ValueError as exc:
            raise CheckpointFormatError(f"{self.path}: {exc}") from exc
