"""Unit tests of checkpoint files (storage/checkpoint.py): Kafka's plain-text
layout, atomic replacement, and refusal of malformed files."""

from __future__ import annotations

import os

import pytest

from storage.checkpoint import (
    CheckpointFormatError,
    LeaderEpochCheckpoint,
    OffsetCheckpoint,
    write_atomically,
)


def write_text(path, text: str) -> str:
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
    return str(path)


# ---------------------------------------------------------------------------
# write_atomically
# ---------------------------------------------------------------------------
def test_write_atomically_creates_the_file_and_leaves_no_temporary(tmp_path):
    path = str(tmp_path / "recovery-point-offset-checkpoint")
    write_atomically(path, b"hello\n")
    with open(path, "rb") as f:
        assert f.read() == b"hello\n"
    assert os.listdir(tmp_path) == ["recovery-point-offset-checkpoint"]


def test_write_atomically_replaces_longer_content_entirely(tmp_path):
    path = str(tmp_path / "cp")
    write_atomically(path, b"x" * 10_000)
    write_atomically(path, b"short")
    with open(path, "rb") as f:
        assert f.read() == b"short"
    assert not os.path.exists(path + ".tmp")


def test_write_atomically_accepts_any_bytes_like_and_large_payloads(tmp_path):
    path = str(tmp_path / "cp")
    payload = bytes(range(256)) * 8192  # 2 MiB: more than one os.write may take
    write_atomically(path, memoryview(payload))
    with open(path, "rb") as f:
        assert f.read() == payload


def test_write_atomically_replaces_the_file_by_rename(tmp_path):
    # A reader holding the old file keeps seeing the old content: the new
    # content arrives as a new inode, never written into the old one.
    path = str(tmp_path / "cp")
    write_atomically(path, b"old")
    with open(path, "rb") as old_reader:
        write_atomically(path, b"new")
        assert old_reader.read() == b"old"
    with open(path, "rb") as f:
        assert f.read() == b"new"


def test_write_atomically_overwrites_a_stale_temporary(tmp_path):
    path = str(tmp_path / "cp")
    write_text(path + ".tmp", "left over from a crash, and longer than the new content")
    write_atomically(path, b"fresh")
    with open(path, "rb") as f:
        assert f.read() == b"fresh"
    assert os.listdir(tmp_path) == ["cp"]


# ---------------------------------------------------------------------------
# OffsetCheckpoint
# ---------------------------------------------------------------------------
def test_offset_checkpoint_round_trip(tmp_path):
    checkpoint = OffsetCheckpoint(str(tmp_path / "recovery-point-offset-checkpoint"))
    offsets = {("orders", 0): 1_234, ("orders", 11): 0, ("audit.log-v2", 3): 2**40}
    checkpoint.write(offsets)
    assert checkpoint.read() == offsets
    assert OffsetCheckpoint(checkpoint.path).read() == offsets


def test_offset_checkpoint_uses_kafkas_layout(tmp_path):
    checkpoint = OffsetCheckpoint(str(tmp_path / "cp"))
    checkpoint.write({("b", 1): 7, ("a", 10): 5, ("a", 2): 9})
    with open(checkpoint.path) as f:
        assert f.read() == "0\n3\na 2 9\na 10 5\nb 1 7\n"


def test_offset_checkpoint_rewrite_replaces_old_entries(tmp_path):
    checkpoint = OffsetCheckpoint(str(tmp_path / "cp"))
    checkpoint.write({("a", 0): 1, ("b", 0): 2})
    checkpoint.write({("a", 0): 5})
    assert checkpoint.read() == {("a", 0): 5}
    checkpoint.write({})
    assert checkpoint.read() == {}
    assert not os.path.exists(checkpoint.path + ".tmp")


def test_missing_files_read_as_empty(tmp_path):
    assert OffsetCheckpoint(str(tmp_path / "absent")).read() == {}
    assert LeaderEpochCheckpoint(str(tmp_path / "absent")).read() == []


# ---------------------------------------------------------------------------
# LeaderEpochCheckpoint
# ---------------------------------------------------------------------------
def test_leader_epoch_checkpoint_round_trip(tmp_path):
    checkpoint = LeaderEpochCheckpoint(str(tmp_path / "leader-epoch-checkpoint"))
    entries = [(0, 0), (3, 150), (4, 150), (9, 2**33)]
    checkpoint.write(entries)
    assert checkpoint.read() == entries
    with open(checkpoint.path) as f:
        assert f.read() == "0\n4\n0 0\n3 150\n4 150\n9 8589934592\n"


def test_leader_epoch_checkpoint_of_no_entries(tmp_path):
    checkpoint = LeaderEpochCheckpoint(str(tmp_path / "cp"))
    checkpoint.write([])
    assert checkpoint.read() == []
    with open(checkpoint.path) as f:
        assert f.read() == "0\n0\n"


def test_file_without_final_newline_still_reads(tmp_path):
    path = write_text(tmp_path / "cp", "0\n2\n1 0\n2 10")
    assert LeaderEpochCheckpoint(path).read() == [(1, 0), (2, 10)]


# ---------------------------------------------------------------------------
# Malformed files
# ---------------------------------------------------------------------------
MALFORMED_EPOCH_FILES = {
    "empty file": "",
    "version only": "0\n",
    "unknown version": "1\n1\n0 0\n",
    "non-numeric version": "v0\n1\n0 0\n",
    "count not a number": "0\nmany\n0 0\n",
    "count too high": "0\n3\n0 0\n1 5\n",
    "count too low": "0\n1\n0 0\n1 5\n",
    "negative count": "0\n-1\n",
    "too few fields": "0\n1\n7\n",
    "too many fields": "0\n1\n7 0 0\n",
    "non-integer epoch": "0\n1\nseven 0\n",
    "non-integer offset": "0\n1\n7 1.5\n",
    "blank entry line": "0\n2\n0 0\n\n",
    "tab separated": "0\n1\n7\t0\n",
}


@pytest.mark.parametrize("name", sorted(MALFORMED_EPOCH_FILES))
def test_malformed_leader_epoch_checkpoint_is_refused(tmp_path, name):
    path = write_text(tmp_path / "cp", MALFORMED_EPOCH_FILES[name])
    with pytest.raises(CheckpointFormatError) as info:
        LeaderEpochCheckpoint(path).read()
    assert path in str(info.value)  # the message names the file to look at


MALFORMED_OFFSET_FILES = {
    "unknown version": "2\n1\norders 0 5\n",
    "count not a number": "0\nx\norders 0 5\n",
    "count too high": "0\n2\norders 0 5\n",
    "two fields": "0\n1\norders 5\n",
    "four fields": "0\n1\nmy topic 0 5\n",
    "non-integer partition": "0\n1\norders zero 5\n",
    "non-integer offset": "0\n1\norders 0 five\n",
}


@pytest.mark.parametrize("name", sorted(MALFORMED_OFFSET_FILES))
def test_malformed_offset_checkpoint_is_refused(tmp_path, name):
    path = write_text(tmp_path / "cp", MALFORMED_OFFSET_FILES[name])
    with pytest.raises(CheckpointFormatError) as info:
        OffsetCheckpoint(path).read()
    assert path in str(info.value)


@pytest.mark.parametrize("text, entry", [("0\n1\n7 0 0\n", "7 0 0"), ("0\n1\n7\n", "7")])
def test_malformed_entry_is_quoted_in_the_error(tmp_path, text, entry):
    path = write_text(tmp_path / "cp", text)
    with pytest.raises(CheckpointFormatError, match=f"malformed entry '{entry}'"):
        LeaderEpochCheckpoint(path).read()


def test_undecodable_bytes_are_a_format_error(tmp_path):
    path = str(tmp_path / "cp")
    with open(path, "wb") as f:
        f.write(b"0\n1\n\xff\xfe 0\n")
    with pytest.raises(CheckpointFormatError):
        LeaderEpochCheckpoint(path).read()


def test_format_error_is_a_value_error():
    # Callers that fall back on any ValueError (e.g. to full recovery) catch it.
    assert issubclass(CheckpointFormatError, ValueError)
