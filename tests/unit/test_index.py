"""SparseIndex: binary-search queries, persistence and corruption detection."""

import pytest

from storage.index import OFFSET_ENTRY, TIME_ENTRY, IndexCorruptError, SparseIndex


def filled(path, entries, entry=OFFSET_ENTRY):
    index = SparseIndex(str(path), entry)
    for key, value in entries:
        index.append(key, value)
    return index


def test_queries_are_floor_lower_and_floor_by_value(tmp_path):
    index = filled(tmp_path / "i", [(10, 100), (20, 200), (30, 300)])
    assert [index.floor(k) for k in (9, 10, 15, 30, 99)] == [-1, 0, 0, 2, 2]
    assert [index.lower(k) for k in (10, 11, 30, 31)] == [-1, 0, 1, 2]
    assert [index.floor_value(v) for v in (99, 100, 250, 300)] == [-1, 0, 1, 2]
    assert index.entry(1) == (20, 200) and index.last() == (30, 300)


def test_entries_reach_the_file_only_when_written_and_reload(tmp_path):
    index = filled(tmp_path / "i", [(1, 0), (5, 64)])
    assert (tmp_path / "i").stat().st_size == 0
    index.write_pending()
    index.append(9, 128)
    index.write_pending()
    index.sync()
    assert (tmp_path / "i").stat().st_size == 3 * OFFSET_ENTRY.size
    index.close()
    again = SparseIndex(str(tmp_path / "i"), OFFSET_ENTRY)
    again.load()
    assert [again.entry(i) for i in range(len(again))] == [(1, 0), (5, 64), (9, 128)]
    again.check_invariants()


def test_truncation_shrinks_memory_and_file(tmp_path):
    index = filled(tmp_path / "t", [(100, 1), (200, 2), (300, 3)], TIME_ENTRY)
    index.write_pending()
    index.truncate_entries(1)
    assert len(index) == 1
    assert (tmp_path / "t").stat().st_size == TIME_ENTRY.size
    index.append(150, 2)  # appending after a truncation continues from there
    index.write_pending()
    assert (tmp_path / "t").stat().st_size == 2 * TIME_ENTRY.size


@pytest.mark.parametrize("content", [b"\x00" * 7, OFFSET_ENTRY.pack(5, 0) + OFFSET_ENTRY.pack(5, 8),
                                     OFFSET_ENTRY.pack(5, 80) + OFFSET_ENTRY.pack(6, 8)])
def test_partial_or_unsorted_files_are_detected(tmp_path, content):
    (tmp_path / "i").write_bytes(content)
    index = SparseIndex(str(tmp_path / "i"), OFFSET_ENTRY)
    with pytest.raises(IndexCorruptError):
        index.load()


def test_out_of_order_append_is_a_bug_not_an_input_error(tmp_path):
    index = filled(tmp_path / "i", [(10, 100)])
    with pytest.raises(AssertionError):
        index.append(10, 200)


def test_an_index_holds_no_open_file_and_fsyncs_only_what_is_new(tmp_path, monkeypatch):
    """A broker of 10,000 partitions must not hold three descriptors for
    each (its segment and two indexes: 30,000, past a common limit of
    20,000, where a flush met EMFILE and took the log dir offline): 300
    written indexes leave no descriptor open. A sync fsyncs a file with
    new writes (entries, a truncation) once, and nothing otherwise."""
    import os

    def open_fds():
        return len(os.listdir("/proc/self/fd"))

    before = open_fds()
    indexes = [filled(tmp_path / f"i{n}", [(1, 0), (5, 64)]) for n in range(300)]
    for index in indexes:
        index.write_pending()
        assert index.on_disk
    assert open_fds() == before
    fsyncs = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (fsyncs.append(fd), real_fsync(fd))[1])
    index = indexes[0]
    index.sync()
    index.sync()  # nothing new: no fsync
    assert len(fsyncs) == 1
    index.append(9, 128)
    index.write_pending()
    index.sync()
    index.truncate_entries(1)
    index.sync()
    assert len(fsyncs) == 3 and open_fds() == before
    assert (tmp_path / "i0").stat().st_size == OFFSET_ENTRY.size
    index.close()
    index.sync()  # closed (its segment let go): nothing synced
    index.append(12, 256)
    with pytest.raises(OSError, match="closed"):  # nor written, as with a closed fd
        index.write_pending()
    assert len(fsyncs) == 3
    (tmp_path / "i1").unlink()  # deleted meanwhile: nothing to keep
    indexes[1].sync()
    assert len(fsyncs) == 3
