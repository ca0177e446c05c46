"""The log manager: directories, checkpoints, clean and unclean restarts,
deletion, retention and background flushing."""

from __future__ import annotations

import asyncio
import os

import pytest

from storage.config import LogConfig
from storage.errors import InvalidConfigError, InvalidTopicError, LogDirectoryError
from storage.manager import (BOOT_ID_FILE, CLEAN_SHUTDOWN_FILE, LOG_START_FILE,
                             RECOVERY_POINT_FILE, LogManager, LogManagerConfig, TopicPartition,
                             parse_partition_dir)
from tests.helpers import make_batch, read_all

CONFIG = LogConfig(segment_bytes=4096, flush_ms=-1)


def manager_for(*dirs, config=CONFIG, **kwargs) -> LogManager:
    manager = LogManager(LogManagerConfig(log_dirs=tuple(str(d) for d in dirs), **kwargs),
                         config)
    manager.startup()
    return manager


def test_partition_dir_names_round_trip():
    assert parse_partition_dir("orders-3") == TopicPartition("orders", 3)
    assert parse_partition_dir("my-topic.v2-10") == TopicPartition("my-topic.v2", 10)
    assert parse_partition_dir("orders-3.abc-delete") is None
    assert parse_partition_dir("orders") is None
    assert parse_partition_dir("bad name-1") is None
    assert str(TopicPartition("orders", 3)) == "orders-3"


@pytest.mark.parametrize("topic", ["", ".", "..", "a" * 250, "has space", "slash/no", "ü"])
def test_invalid_topic_names_are_refused(tmp_path, topic):
    manager = manager_for(tmp_path / "d1")
    with pytest.raises(InvalidTopicError):
        manager.get_or_create_log(TopicPartition(topic, 0))
    assert manager.logs == {}
    manager.shutdown()


def test_negative_partition_and_bad_overrides_are_refused(tmp_path):
    manager = manager_for(tmp_path / "d1")
    with pytest.raises(InvalidTopicError):
        manager.get_or_create_log(TopicPartition("t", -1))
    with pytest.raises(InvalidConfigError):
        manager.get_or_create_log(TopicPartition("t", 0), {"retention.ms": "soon"})
    assert manager.logs == {}
    manager.shutdown()


def test_second_process_cannot_take_a_locked_dir(tmp_path):
    first = manager_for(tmp_path / "d1")
    with pytest.raises(LogDirectoryError, match="in use"):
        manager_for(tmp_path / "d1")
    first.shutdown()
    manager_for(tmp_path / "d1").shutdown()  # free again once released


def test_new_partitions_go_to_the_least_loaded_dir(tmp_path):
    manager = manager_for(tmp_path / "d1", tmp_path / "d2")
    for p in range(4):
        manager.get_or_create_log(TopicPartition("t", p))
    assert sorted(os.listdir(tmp_path / "d1")).count("t-0") == 1
    per_dir = [sum(1 for n in os.listdir(tmp_path / d) if n.startswith("t-")) for d in ("d1", "d2")]
    assert per_dir == [2, 2]
    manager.shutdown()


def test_clean_restart_trusts_data_and_removes_the_marker(tmp_path):
    manager = manager_for(tmp_path / "d1")
    tp = TopicPartition("orders", 0)
    log = manager.get_or_create_log(tp)
    for _ in range(20):
        log.append(make_batch(3), leader_epoch=1)
    log.delete_records_before(7)
    manager.shutdown()
    assert os.path.exists(tmp_path / "d1" / CLEAN_SHUTDOWN_FILE)
    assert os.path.exists(tmp_path / "d1" / RECOVERY_POINT_FILE)

    restarted = manager_for(tmp_path / "d1")
    assert not os.path.exists(tmp_path / "d1" / CLEAN_SHUTDOWN_FILE)
    reloaded = restarted.get_log(tp)
    assert (reloaded.log_start_offset, reloaded.log_end_offset) == (7, 60)
    assert reloaded.recovery_point == 60
    assert [r.offset for r in read_all(reloaded)] == list(range(7, 60))
    restarted.shutdown()


def test_what_a_start_says_of_unflushed_data_lost_since_the_last_run(tmp_path):
    """KIP-966 needs to know whether a broker lost its unflushed tail: a
    clean shutdown lost nothing, nor did a crash of the process alone (the
    same boot of the machine: the page cache kept every write). A new boot
    may have lost it, and says so until ``record_boot`` (called once the
    controller was told): a crash before that says so again."""
    def start(boot: str, *dirs: str) -> LogManager:
        manager = LogManager(LogManagerConfig(tuple(str(tmp_path / d) for d in dirs or ("d",))),
                             CONFIG, boot_id=boot)
        manager.startup()
        return manager

    first = start("A")
    assert not first.nothing_unflushed_lost  # nothing known of the dir
    first.abandon()
    again = start("A")
    assert not again.nothing_unflushed_lost  # still unreported
    again.record_boot()
    again.abandon()  # kill -9
    same_boot = start("A")
    assert same_boot.nothing_unflushed_lost
    same_boot.abandon()
    new_boot = start("B")  # a machine crash in between
    assert not new_boot.nothing_unflushed_lost
    assert not os.path.exists(tmp_path / "d" / BOOT_ID_FILE)
    new_boot.record_boot()
    new_boot.shutdown()
    after_clean = start("C")  # a clean shutdown, whatever the boot
    assert after_clean.nothing_unflushed_lost
    after_clean.abandon()
    again_clean = start("C")  # recorded at once when clean
    assert again_clean.nothing_unflushed_lost
    again_clean.abandon()
    # Another set of log dirs (one added, or one dropped with its logs after
    # a disk failure): not what was recorded.
    assert not start("C", "d", "e").nothing_unflushed_lost


def test_a_dir_taken_offline_forgets_its_boot_and_one_such_dir_is_enough(tmp_path):
    """A failed write-back may drop cached pages, so a dir that met a disk
    error no longer counts as intact in the same boot; nor does the broker,
    which has another dir that does."""
    manager = LogManager(LogManagerConfig((str(tmp_path / "d0"), str(tmp_path / "d1"))),
                         CONFIG, boot_id="A")
    manager.startup()
    manager.record_boot()
    manager.fail_dir(str(tmp_path / "d1"), "EIO")
    assert not os.path.exists(tmp_path / "d1" / BOOT_ID_FILE)
    assert os.path.exists(tmp_path / "d0" / BOOT_ID_FILE)
    manager.abandon()
    restarted = LogManager(LogManagerConfig((str(tmp_path / "d0"), str(tmp_path / "d1"))),
                           CONFIG, boot_id="A")
    restarted.startup()
    assert not restarted.nothing_unflushed_lost
    restarted.shutdown()


def test_unclean_restart_recovers_from_the_checkpointed_recovery_point(tmp_path):
    manager = manager_for(tmp_path / "d1")
    tp = TopicPartition("orders", 0)
    log = manager.get_or_create_log(tp)
    for _ in range(10):
        log.append(make_batch(3), leader_epoch=0)
    log.flush()
    manager.checkpoint()
    for _ in range(5):
        log.append(make_batch(3), leader_epoch=0)
    path = log.active_segment.log_path
    manager.abandon()  # crash: no flush, no marker
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) - 10)

    restarted = manager_for(tmp_path / "d1")
    reloaded = restarted.get_log(tp)
    assert reloaded.log_end_offset == 42  # 14 whole batches survive the torn 15th
    assert [r.offset for r in read_all(reloaded)] == list(range(42))
    # Start-up checkpoints what recovery validated and fsynced.
    restarted.abandon()
    from storage.checkpoint import OffsetCheckpoint
    assert OffsetCheckpoint(str(tmp_path / "d1" / RECOVERY_POINT_FILE)).read() == {
        ("orders", 0): 42}


def test_a_truncation_below_the_recovery_point_is_checkpointed_before_new_data(tmp_path):
    """A follower cuts a flushed suffix and takes the leader's records in a
    new epoch there; after a crash (no flush, no checkpoint tick) the
    restart re-reads from the truncation point, not from the old recovery
    point: the new epoch starts where its first batch is, and records
    written since the truncation are re-validated, not trusted. (The
    replication simulation found it, seed 896 with 5 brokers: a leader
    learned epoch 6 five records late, so a follower kept records the
    cluster had overwritten.)"""
    manager = manager_for(tmp_path / "d1")
    tp = TopicPartition("orders", 0)
    log = manager.get_or_create_log(tp)
    for _ in range(4):
        log.append(make_batch(3), leader_epoch=5)  # offsets 0-11 in epoch 5
    log.flush()
    manager.checkpoint()  # recovery point 12 on disk
    log.truncate_to(6)  # a divergent, flushed suffix goes
    for _ in range(3):
        log.append(make_batch(3, tag="new"), leader_epoch=6)  # 6-14 in epoch 6
    assert log.epoch_cache.entries == [(5, 0), (6, 6)]
    manager.abandon()  # crash: no flush, no checkpoint, no marker

    restarted = manager_for(tmp_path / "d1")
    reloaded = restarted.get_log(tp)
    assert reloaded.epoch_cache.entries == [(5, 0), (6, 6)]
    assert reloaded.end_offset_for_epoch(5) == (5, 6)
    assert [r.value[:4] for r in read_all(reloaded)][6:] == [b"new0", b"new1", b"new2"] * 3
    restarted.abandon()


def test_a_checkpoint_written_late_never_raises_a_lowered_recovery_point(tmp_path):
    """The periodic checkpoint is written off the loop: a snapshot taken
    before a truncation and written after it must not put the old, higher
    recovery point back."""
    manager = manager_for(tmp_path / "d1")
    tp = TopicPartition("orders", 0)
    log = manager.get_or_create_log(tp)
    for _ in range(4):
        log.append(make_batch(3), leader_epoch=0)
    log.flush()
    from storage.checkpoint import OffsetCheckpoint
    on_disk = OffsetCheckpoint(str(tmp_path / "d1" / RECOVERY_POINT_FILE))
    late = manager._checkpoint_snapshot()  # taken by the checkpoint tick ...
    log.truncate_to(6)
    log.append(make_batch(3), leader_epoch=1)  # ... the write after the cut checkpoints 6 ...
    assert on_disk.read() == {("orders", 0): 6}
    manager._write_checkpoints(late)  # ... and the tick's write lands after it
    assert on_disk.read() == {("orders", 0): 6}
    manager.abandon()


def test_many_truncations_cost_one_checkpoint_write_per_dir_and_a_failed_one_takes_it_offline(
        tmp_path, monkeypatch):
    """A failover cuts the tails of many followers at once: their dir's
    checkpoints are written once, at the first write after the cuts. If
    that write fails, the append is refused (KAFKA_STORAGE_ERROR) before a
    byte is written and the dir goes offline: no log in it is written again
    by this process."""
    from storage.checkpoint import OffsetCheckpoint
    from storage.errors import LogDirectoryError

    manager = manager_for(tmp_path / "d1")
    logs = [manager.get_or_create_log(TopicPartition("t", p)) for p in range(5)]
    for log in logs:
        for _ in range(3):
            log.append(make_batch(3), leader_epoch=0)
        log.flush()
    writes = []
    real_write = OffsetCheckpoint.write
    monkeypatch.setattr(OffsetCheckpoint, "write",
                        lambda self, entries: (writes.append(self), real_write(self, entries)))
    for log in logs:
        log.truncate_to(3)
    assert writes == [], "nothing is written at the cuts"
    for log in logs:
        log.append(make_batch(3), leader_epoch=1)
    assert len(writes) == 2, "one recovery-point and one log-start checkpoint, once"

    logs[0].flush()  # recovery point 6
    logs[0].truncate_to(3)

    def failing(self, entries):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(OffsetCheckpoint, "write", failing)
    end = logs[0].log_end_offset
    with pytest.raises(LogDirectoryError, match="recovery-point checkpoint"):
        logs[0].append(make_batch(3), leader_epoch=2)
    assert logs[0].log_end_offset == end
    monkeypatch.setattr(OffsetCheckpoint, "write", real_write)
    assert list(manager.offline_dirs) == [str(tmp_path / "d1")]
    for log in logs:
        with pytest.raises(LogDirectoryError, match="offline"):
            log.append(make_batch(3), leader_epoch=2)
    # On disk: what the first cut wrote, never above the second cut.
    assert OffsetCheckpoint(str(tmp_path / "d1" / RECOVERY_POINT_FILE)).read()[("t", 0)] == 3
    manager.abandon()


def test_unreadable_checkpoint_costs_time_not_data(tmp_path):
    manager = manager_for(tmp_path / "d1")
    log = manager.get_or_create_log(TopicPartition("orders", 0))
    for _ in range(10):
        log.append(make_batch(3), leader_epoch=0)
    log.delete_records_before(4)
    manager.shutdown()
    os.unlink(tmp_path / "d1" / CLEAN_SHUTDOWN_FILE)
    (tmp_path / "d1" / RECOVERY_POINT_FILE).write_text("garbage\n")
    (tmp_path / "d1" / LOG_START_FILE).write_text("0\n1\norders 0 nope\n")
    restarted = manager_for(tmp_path / "d1")
    reloaded = restarted.get_log(TopicPartition("orders", 0))
    assert reloaded.log_end_offset == 30
    # Without its checkpoint the log start falls back to the first segment.
    assert reloaded.log_start_offset == 0
    restarted.shutdown()


def test_delete_log_removes_the_partition_and_leftovers_are_cleaned(tmp_path):
    manager = manager_for(tmp_path / "d1")
    tp = TopicPartition("orders", 0)
    manager.get_or_create_log(tp).append(make_batch(3), leader_epoch=0)
    assert manager.delete_log(tp)
    assert not manager.delete_log(tp)
    assert manager.get_log(tp) is None
    assert not [n for n in os.listdir(tmp_path / "d1") if n.startswith("orders")]
    os.makedirs(tmp_path / "d1" / "old-0.123-delete")
    manager.shutdown()
    restarted = manager_for(tmp_path / "d1")
    assert restarted.logs == {}
    assert not os.path.exists(tmp_path / "d1" / "old-0.123-delete")
    restarted.shutdown()


def test_retention_through_the_manager_respects_upper_bounds(tmp_path):
    config = LogConfig(segment_bytes=2048, retention_bytes=2048, retention_ms=-1, flush_ms=-1)
    manager = manager_for(tmp_path / "d1", config=config)
    a, b, c = TopicPartition("a", 0), TopicPartition("b", 0), TopicPartition("c", 0)
    for tp in (a, b, c):
        log = manager.get_or_create_log(tp)
        for _ in range(40):
            log.append(make_batch(3), leader_epoch=0)
    deleted = manager.run_retention(upper_bounds={a: 0, b: manager.get_log(b).log_end_offset})
    assert deleted > 0
    assert manager.get_log(a).log_start_offset == 0  # protected by its high watermark
    assert manager.get_log(b).log_start_offset > 0
    # A log with no bound (not hosted by the broker yet) is left alone.
    assert manager.get_log(c).log_start_offset == 0
    manager.shutdown()


def test_manager_config_from_broker_keys(tmp_path):
    config = LogManagerConfig.from_broker_config({
        "log.dirs": f"{tmp_path}/a, {tmp_path}/b", "log.retention.check.interval.ms": 1000,
        "node.id": 1})
    assert config.log_dirs == (f"{tmp_path}/a", f"{tmp_path}/b")
    assert config.retention_check_interval_ms == 1000
    with pytest.raises(InvalidConfigError):
        LogManagerConfig.from_broker_config({"log.dirs": ""})


async def test_background_flush_fsyncs_off_the_event_loop(tmp_path):
    config = LogConfig(flush_ms=50)
    manager = manager_for(tmp_path / "d1", config=config, flush_check_interval_ms=10)
    log = manager.get_or_create_log(TopicPartition("orders", 0))
    await manager.start_background_tasks()
    try:
        log.append(make_batch(3), leader_epoch=0)
        assert log.recovery_point == 0
        deadline = asyncio.get_running_loop().time() + 10
        while log.recovery_point < 3:
            assert asyncio.get_running_loop().time() < deadline, "flush never happened"
            await asyncio.sleep(0.01)
        assert not log.flush_due()
    finally:
        await manager.stop_background_tasks()
        manager.shutdown()


def test_topic_overrides_survive_a_lookup_and_change_only_when_given(tmp_path):
    manager = manager_for(tmp_path / "d1")
    tp = TopicPartition("orders", 0)
    manager.get_or_create_log(tp, {"retention.ms": 5000})
    assert manager.get_or_create_log(tp).config.retention_ms == 5000
    assert manager.get_or_create_log(tp, {}).config.retention_ms == CONFIG.retention_ms
    manager.shutdown()


def test_logs_with_the_same_overrides_share_one_config_and_bad_ones_are_refused_each_time(
        tmp_path):
    """A topic's partitions, thousands perhaps, get one LogConfig built once
    (it is frozen); other overrides get their own, and a bad value is
    refused at every log, never remembered as good."""
    manager = manager_for(tmp_path / "d1")
    overrides = {"retention.ms": "5000", "cleanup.policy": "compact"}
    logs = [manager.get_or_create_log(TopicPartition("orders", p), dict(overrides))
            for p in range(3)]
    assert logs[0].config is logs[1].config is logs[2].config
    assert (logs[0].config.retention_ms, logs[0].config.compact) == (5000, True)
    other = manager.get_or_create_log(TopicPartition("audit", 0), {"retention.ms": "7000"})
    assert other.config.retention_ms == 7000 and other.config is not logs[0].config
    plain = manager.get_or_create_log(TopicPartition("plain", 0))
    assert plain.config == CONFIG
    for partition in (0, 1):
        with pytest.raises(InvalidConfigError):
            manager.get_or_create_log(TopicPartition("bad", partition), {"retention.ms": "soon"})
    # A value equal to a good one but of a type the parser refuses (True == 1
    # in Python) is refused all the same.
    manager.get_or_create_log(TopicPartition("one", 0), {"retention.ms": 1})
    with pytest.raises(InvalidConfigError):
        manager.get_or_create_log(TopicPartition("truth", 0), {"retention.ms": True})
    manager.shutdown()


def test_a_disk_error_takes_its_whole_dir_offline_and_nothing_touches_it_again(tmp_path):
    """fail_dir: the other logs of the dir go offline too, the listeners
    hear which partitions it held, no checkpoint or new log goes there, the
    other dir goes on; a name whose log is there is refused, even after
    its topic is deleted (a second copy elsewhere would clash at the next
    start); out of file descriptors is no disk error for a read, which
    changes nothing, but is for a write, which may have changed the log
    halfway."""
    import errno

    manager = manager_for(tmp_path / "d0", tmp_path / "d1")
    logs = {p: manager.get_or_create_log(TopicPartition("t", p)) for p in range(4)}
    in_d1 = sorted(p for p, log in logs.items() if log.directory.startswith(str(tmp_path / "d1")))
    told = []
    manager.dir_failure_listeners.append(lambda d, tps: told.append((d, tps)))
    victim = logs[in_d1[0]]
    victim.append(make_batch(1), leader_epoch=0)
    real_read = victim.active_segment.read
    victim.active_segment.read = lambda *args, **kwargs: (_ for _ in ()).throw(
        OSError(errno.EMFILE, "Too many open files"))
    with pytest.raises(LogDirectoryError, match="Too many open files"):
        victim.read(0, 100)  # a read changes nothing: refused, the dir stays
    assert not manager.offline_dirs and not victim.offline, "the process, not the disk"
    victim.active_segment.read = real_read
    victim.active_segment.append = lambda *args: (_ for _ in ()).throw(
        OSError(errno.EMFILE, "Too many open files"))
    with pytest.raises(LogDirectoryError, match="now offline"):
        victim.append(make_batch(1), leader_epoch=0)  # a write may have changed it halfway
    d1 = str(tmp_path / "d1")
    assert list(manager.offline_dirs) == [d1]
    assert told == [(d1, [TopicPartition("t", p) for p in in_d1])]
    assert all(logs[p].offline for p in in_d1) and set(manager.logs) == {
        TopicPartition("t", p) for p in logs if p not in in_d1}
    with pytest.raises(LogDirectoryError, match="offline"):
        logs[in_d1[1]].read(0, 100)
    with pytest.raises(LogDirectoryError, match="offline after a disk error"):
        manager.get_or_create_log(TopicPartition("t", in_d1[0]))
    assert manager.delete_log(TopicPartition("t", in_d1[0])) is False
    with pytest.raises(LogDirectoryError, match="offline after a disk error"):
        manager.get_or_create_log(TopicPartition("t", in_d1[0]))
    fresh = manager.get_or_create_log(TopicPartition("u", 0))
    assert fresh.directory.startswith(str(tmp_path / "d0"))
    before = os.path.getmtime(tmp_path / "d1" / RECOVERY_POINT_FILE)
    manager.checkpoint()
    assert os.path.getmtime(tmp_path / "d1" / RECOVERY_POINT_FILE) == before
    assert [d["offline"] for d in manager.describe_dirs()] == [False, True]
    manager.shutdown()
    assert not os.path.exists(tmp_path / "d1" / CLEAN_SHUTDOWN_FILE)
    assert os.path.exists(tmp_path / "d0" / CLEAN_SHUTDOWN_FILE)


def test_a_log_made_while_its_dir_failed_is_not_hosted(tmp_path):
    manager = manager_for(tmp_path / "d0")
    directory, config = manager.reserve_new_log(TopicPartition("t", 0))
    made = manager.open_new_log(TopicPartition("t", 0), directory, config)
    told = []
    manager.dir_failure_listeners.append(lambda d, tps: told.append(tps))
    manager.fail_dir(directory, "EIO (test)")
    with pytest.raises(LogDirectoryError, match="went offline"):
        manager.adopt_new_log(TopicPartition("t", 0), directory, made)
    assert manager.get_log(TopicPartition("t", 0)) is None and made.offline
    assert told == [[], [TopicPartition("t", 0)]]
    assert manager.offline_logs() == {TopicPartition("t", 0): directory}
    manager.abandon()


def test_a_flush_of_a_log_deleted_meanwhile_is_no_disk_error(tmp_path):
    manager = manager_for(tmp_path / "d0")
    log = manager.get_or_create_log(TopicPartition("t", 0))
    log.append(make_batch(3), leader_epoch=0)
    log.roll()  # the partition directory's names need an fsync

    async def race() -> None:
        flushing = asyncio.create_task(manager.flush_logs_async([log]))
        await asyncio.sleep(0)  # the ticket is taken; the fsyncs run on the thread
        manager.delete_log(TopicPartition("t", 0))
        await flushing

    asyncio.run(race())
    assert manager.offline_dirs == {}
    manager.abandon()


def test_many_dirty_logs_are_fsynced_in_a_few_hand_overs_to_the_flush_thread(
        tmp_path, monkeypatch):
    """200 dirty partitions: every one durable (its recovery point at its log
    end) after four trips to the flush thread (64 a trip), not 200 event-loop
    wake-ups, their first flush too, when each also writes its names and
    leader-epoch checkpoint. Such a ticket (a new log's first flush, a roll)
    goes in a trip of its own kind, ahead of the segments' fsyncs, so those
    are durable sooner. A log whose fsync fails in a trip takes its dir
    offline (with every log in it); what the trips before made durable
    stands."""
    from storage import manager as manager_module

    manager = manager_for(tmp_path / "d0")
    logs = [manager.get_or_create_log(TopicPartition("many", p)) for p in range(200)]
    for log in logs:
        log.append(make_batch(2), leader_epoch=0)
    trips = []
    real_sync = manager_module._sync_tickets

    def counted(tickets, *group):
        trips.append(len(tickets))
        return real_sync(tickets, *group)
    monkeypatch.setattr(manager_module, "_sync_tickets", counted)
    asyncio.run(manager.flush_logs_async(logs))  # new logs: their names and epochs too
    assert trips == [64, 64, 64, 8] and all(log.recovery_point == 2 for log in logs)
    for log in logs:
        log.append(make_batch(1), leader_epoch=0)
    logs[5].roll()  # a new segment's name to sync: alone, first
    trips.clear()
    asyncio.run(manager.flush_logs_async(logs))
    assert trips == [1, 64, 64, 64, 7]
    assert all(log.recovery_point == 3 for log in logs)
    for log in logs:
        log.append(make_batch(1), leader_epoch=0)
    failing = logs[70]

    def one_fails(tickets, *group):
        failures = real_sync(tickets, *group)
        return [OSError(5, "EIO (test)") if t.segments[0] in failing._segments else f
                for t, f in zip(tickets, failures)]
    monkeypatch.setattr(manager_module, "_sync_tickets", one_fails)
    asyncio.run(manager.flush_logs_async(logs))
    assert failing.offline and set(manager.offline_dirs) == {str(tmp_path / "d0")}
    assert all(log.recovery_point == 4 for log in logs[:64])  # the trip before
    manager.abandon()


def _count_fsyncs(monkeypatch) -> list[int]:
    fsyncs = []
    real_fsync = os.fsync

    def counted(fd):
        fsyncs.append(fd)
        return real_fsync(fd)
    monkeypatch.setattr(os, "fsync", counted)
    return fsyncs


def test_a_flush_of_many_logs_of_a_dir_syncs_its_filesystem_once_not_each_file(
        tmp_path, monkeypatch):
    """40 new logs flushed together (their data, new names and leader-epoch
    checkpoints): no fsync of any file, one filesystem sync per trip to the
    flush thread, every recovery point at its log end. Reopened, each log
    has its records and its epochs from the checkpoint written without an
    fsync of its own. A flush of fewer logs than log.flush.syncfs.min.logs
    fsyncs file by file; 0 turns the group sync off."""
    from storage import manager as manager_module
    from storage.checkpoint import SYNCFS_AVAILABLE, LeaderEpochCheckpoint
    from storage.log import EPOCH_CHECKPOINT_NAME

    assert SYNCFS_AVAILABLE, "this test needs Linux 5.8 or later (syncfs reports errors)"
    manager = manager_for(tmp_path / "d0", flush_syncfs_min_logs=8)
    logs = [manager.get_or_create_log(TopicPartition("g", p)) for p in range(40)]
    for log in logs:
        log.append(make_batch(3), leader_epoch=4)
    syncs = []
    real_sync = manager_module.sync_filesystem
    monkeypatch.setattr(manager_module, "sync_filesystem",
                        lambda fd: (syncs.append(fd), real_sync(fd))[1])
    fsyncs = _count_fsyncs(monkeypatch)
    assert manager.unflushed_log_count() == 40  # (the metric's count)
    asyncio.run(manager.flush_logs_async(logs))
    assert fsyncs == [] and len(syncs) == 1
    assert all(log.recovery_point == 3 for log in logs)
    assert manager.unflushed_log_count() == 0

    for log in logs[:3]:  # fewer than 8: fsynced file by file
        log.append(make_batch(1), leader_epoch=4)
    syncs.clear()
    asyncio.run(manager.flush_logs_async(logs[:3]))
    assert syncs == [] and len(fsyncs) >= 3
    assert [log.recovery_point for log in logs[:4]] == [4, 4, 4, 3]
    manager.abandon()

    again = manager_for(tmp_path / "d0", flush_syncfs_min_logs=0)
    reopened = [again.get_log(TopicPartition("g", p)) for p in range(40)]
    assert [log.log_end_offset for log in reopened] == [4] * 3 + [3] * 37
    assert all(LeaderEpochCheckpoint(os.path.join(log.directory, EPOCH_CHECKPOINT_NAME)).read()
               == [(4, 0)] for log in reopened)
    for log in reopened:
        log.append(make_batch(1), leader_epoch=5)
    fsyncs.clear()
    asyncio.run(again.flush_logs_async(reopened))
    assert syncs == [] and len(fsyncs) >= 40  # 0: never the group sync
    again.abandon()


def test_a_failed_filesystem_sync_takes_the_dir_offline_with_the_logs_it_covered(
        tmp_path, monkeypatch):
    """syncfs reports a write-back error of the filesystem, not of a file:
    no log of the group may count its data durable, so their dir goes
    offline, recovery points where they were; a dir with no group (too few
    of its logs in the flush) is fsynced file by file and stays."""
    from storage import manager as manager_module

    manager = manager_for(tmp_path / "d0", tmp_path / "d1", flush_syncfs_min_logs=4)
    many = [manager.get_or_create_log(TopicPartition("m", p)) for p in range(12)]
    in_d0 = [log for log in many if log.directory.startswith(str(tmp_path / "d0"))]
    in_d1 = [log for log in many if log.directory.startswith(str(tmp_path / "d1"))]
    assert len(in_d0) >= 4
    for log in many:
        log.append(make_batch(2), leader_epoch=0)
    for log in in_d1[3:]:
        log.append(make_batch(1), leader_epoch=0)
    flushed = in_d0 + in_d1[:3]  # d1's three: no group

    def failing(fd):
        raise OSError(5, "syncfs: Input/output error (test)")
    monkeypatch.setattr(manager_module, "sync_filesystem", failing)
    asyncio.run(manager.flush_logs_async(flushed))
    assert all(log.offline and log.recovery_point == 0 for log in in_d0)
    assert set(manager.offline_dirs) == {str(tmp_path / "d0")}
    assert all(not log.offline and log.recovery_point == 2 for log in in_d1[:3])
    manager.abandon()


def test_syncfs_is_used_only_where_it_reports_write_back_errors(monkeypatch):
    """Before Linux 5.8 syncfs returned 0 after a failed write-back: a flush
    would pass for durable when it was not, so it is not used there."""
    from storage import checkpoint

    class Uname:
        def __init__(self, release):
            self.release = release

    monkeypatch.setattr(checkpoint.sys, "platform", "linux")
    for release, usable in (("5.4.0-150-generic", False), ("5.8.0", True),
                            ("6.18.44-fc", True), ("4.19.0", False), ("weird", False)):
        monkeypatch.setattr(checkpoint.os, "uname", lambda r=release: Uname(r))
        assert (checkpoint._find_syncfs() is not None) is usable, release
    monkeypatch.setattr(checkpoint.sys, "platform", "darwin")
    assert checkpoint._find_syncfs() is None
    with pytest.raises(OSError, match="Bad file descriptor"):
        checkpoint.sync_filesystem(987_654)


def test_a_flush_that_fails_but_not_the_disk_is_tried_again_whole(tmp_path, monkeypatch):
    """A ticket whose sync raised something other than a disk error (a bug):
    its log takes back the names and snapshots it took, stays due, and the
    next flush syncs them; the recovery point moves only then."""
    from storage import manager as manager_module

    manager = manager_for(tmp_path / "d0")
    part_log = manager.get_or_create_log(TopicPartition("t", 0))
    part_log.append(make_batch(2), leader_epoch=0)
    part_log.roll()
    real_sync = manager_module._sync_tickets
    monkeypatch.setattr(manager_module, "_sync_tickets",
                        lambda tickets, *group: [ValueError("a bug")] * len(tickets))
    asyncio.run(manager.flush_logs_async([part_log]))
    assert part_log.recovery_point == 0 and not part_log.offline
    seen = []

    def recorded(tickets, *group):
        seen.extend(tickets)
        return real_sync(tickets, *group)
    monkeypatch.setattr(manager_module, "_sync_tickets", recorded)
    asyncio.run(manager.flush_logs_async([part_log]))
    (again,) = seen
    assert again.directory == part_log.directory and again.files
    assert part_log.recovery_point == 2
    part_log.append(make_batch(1), leader_epoch=0)
    after = part_log.begin_flush()  # nothing left over: data only
    assert after.directory is None and after.files == []
    part_log.end_flush(after)
    manager.abandon()


def test_the_flush_scheduler_looks_only_at_logs_written_since_their_last_flush(
        tmp_path, monkeypatch):
    """200 hosted partitions, 3 written to: a flush tick asks those 3 whether
    they are due, not all 200 (a broker of 10,000 quiet partitions spends
    nothing on them every log.flush.scheduler.interval.ms). Flushed, they
    drop out; written again, or a flush given back (abort), they are back."""
    from storage.log import Log

    manager = manager_for(tmp_path / "d0", config=LogConfig(segment_bytes=4096, flush_ms=1000))
    logs = [manager.get_or_create_log(TopicPartition("quiet", p)) for p in range(200)]
    asked = []
    real_due = Log.flush_due
    monkeypatch.setattr(Log, "flush_due", lambda self, now_ms=None: (
        asked.append(self), real_due(self, now_ms))[1])
    later = 2**62  # past any flush.ms
    assert manager.logs_due_for_flush(later) == [] and asked == []
    for log in (logs[7], logs[70], logs[170]):
        log.append(make_batch(2), leader_epoch=0)
    logs[70].append(make_batch(1), leader_epoch=0)  # still one to look at
    assert manager.logs_due_for_flush(later) == [logs[7], logs[70], logs[170]]
    assert asked == [logs[7], logs[70], logs[170]]
    asyncio.run(manager.flush_logs_async([logs[7], logs[70]]))
    asked.clear()
    assert manager.logs_due_for_flush(later) == [logs[170]] and asked == [logs[170]]
    asked.clear()
    ticket = logs[170].begin_flush()  # taken, then given back (a cancelled flush)
    assert manager.logs_due_for_flush(later) == [] and asked == []
    logs[170].abort_flush(ticket)
    logs[7].append(make_batch(1), leader_epoch=0)
    assert manager.logs_due_for_flush(later) == [logs[170], logs[7]]
    manager.delete_log(TopicPartition("quiet", 7))
    assert manager.logs_due_for_flush(later) == [logs[170]]
    manager.abandon()
