"""The replication core and its disk side (``ReplicationCore`` over
``DiskLogs``): hosting follows the metadata image, on real log directories."""

from __future__ import annotations

import os

import pytest

from api.broker.lifecycle_core import BrokerState, LifecycleCore, LifecycleSettings
from api.broker.replica_manager import DiskLogs, read_topic_id
from api.broker.replication import FetchRequest, FetchSpec, ProduceItem, ReplicationCore, Respond
from kraft.image import MetadataImage
from kraft.records import (ConfigRecord, PartitionChangeRecord, PartitionRecord,
                           RegisterBrokerRecord, RemoveTopicRecord, TopicRecord)
from protocol.errors import (FencedLeaderEpochError, LeaderNotAvailableError,
                             NotLeaderOrFollowerError, UnknownLeaderEpochError,
                             UnknownTopicOrPartitionError)
from storage.batch import build_batch, decode_batches
from storage.config import LogConfig
from storage.manager import LogManager, LogManagerConfig, TopicPartition

ME = 1
OTHER = 2


class Cluster:
    """A metadata image grown record by record, as a broker would see it."""

    def __init__(self) -> None:
        self.image = MetadataImage()
        for broker in (ME, OTHER):
            self.add(RegisterBrokerRecord(broker, f"inc-{broker}",
                                          {"BROKER": f"127.0.0.1:{9000 + broker}"}, None))

    def add(self, record) -> None:
        self.image.apply(record, self.image.offset + 1)

    def topic(self, name: str, topic_id: str, leaders: list[int]) -> None:
        self.add(TopicRecord(name, topic_id))
        for p, leader in enumerate(leaders):
            self.add(PartitionRecord(topic_id, p, [leader], [leader], leader, 0, 0))


class Hosting:
    """A broker's replication core on real log directories, serving data
    (registered, unfenced); ``caught_up`` says whether its image has caught
    up with the controller's."""

    def __init__(self, log_manager: LogManager, topic_defaults=None) -> None:
        self.log_manager = log_manager
        self.disk = DiskLogs(ME, log_manager)
        self.lifecycle = LifecycleCore(LifecycleSettings(ME, "inc", {}, None, 1000, 3000), 0)
        self.lifecycle.broker_epoch = 0
        self.lifecycle.state = BrokerState.RUNNING
        self.core = ReplicationCore(ME, self.disk, self.lifecycle,
                                    topic_defaults=topic_defaults)
        self.partitions = self.core.partitions
        self.leader_partition = self.core.leader_partition

    def apply_image(self, image: MetadataImage, caught_up: bool) -> None:
        self.lifecycle.metadata_caught_up = caught_up
        self.core.apply_image(image, 0)

    def append(self, part, records):
        request_id = self.core.new_request_id()
        (appended,) = self.core.produce(request_id, [ProduceItem(part.tp, None, records)], 1,
                                        1000, 0)
        actions = self.take()
        (answer,) = [a for a in actions if isinstance(a, Respond) and a.request_id == request_id]
        self.untaken = [a for a in actions if a is not answer]
        assert answer.results[0]["error"] is None, answer
        return appended[1]

    def take(self) -> list:
        """The core's actions not yet taken (``append`` takes its own answer)."""
        self.untaken = getattr(self, "untaken", []) + self.core.ready()
        actions, self.untaken = self.untaken, []
        return actions


def make_manager(tmp_path, name: str = "logs", topic_defaults=None) -> Hosting:
    logs = LogManager(LogManagerConfig((str(tmp_path / name),)), LogConfig())
    logs.startup()
    return Hosting(logs, topic_defaults)


def test_hosts_only_partitions_whose_replicas_include_this_broker(tmp_path):
    cluster = Cluster()
    cluster.topic("orders", "id-1", [ME, OTHER, ME])
    rm = make_manager(tmp_path)
    rm.apply_image(cluster.image, caught_up=True)
    assert sorted(rm.partitions) == [TopicPartition("orders", 0), TopicPartition("orders", 2)]
    part = rm.leader_partition("orders", 0)
    assert part.is_leader and part.leader_epoch == 0
    assert read_topic_id(part.log.directory) == "id-1"


def test_append_advances_high_watermark_of_a_sole_isr_leader(tmp_path):
    cluster = Cluster()
    cluster.topic("t", "id-1", [ME])
    rm = make_manager(tmp_path)
    rm.apply_image(cluster.image, caught_up=True)
    part = rm.leader_partition("t", 0)
    info = rm.append(part, build_batch([(b"k", b"v")] * 3))
    assert (info.base_offset, part.high_watermark, part.log_end_offset) == (0, 3, 3)
    part.check_invariants()
    records = list(decode_batches(part.log.read(0, 1 << 20, part.high_watermark)))
    assert [r.offset for r in records] == [0, 1, 2]


def test_records_stay_uncommitted_while_another_isr_member_has_not_replicated(tmp_path):
    cluster = Cluster()
    cluster.add(TopicRecord("t", "id-1"))
    cluster.add(PartitionRecord("id-1", 0, [ME, OTHER], [ME, OTHER], ME, 0, 0))
    rm = make_manager(tmp_path)
    rm.apply_image(cluster.image, caught_up=True)
    part = rm.leader_partition("t", 0)
    rm.append(part, build_batch([(None, b"v")]))
    assert part.high_watermark == 0 and part.log_end_offset == 1


def test_not_leader_names_the_leader_and_its_url(tmp_path):
    cluster = Cluster()
    cluster.add(TopicRecord("t", "id-1"))
    cluster.add(PartitionRecord("id-1", 0, [ME, OTHER], [ME, OTHER], OTHER, 3, 0))
    rm = make_manager(tmp_path)
    rm.apply_image(cluster.image, caught_up=True)
    with pytest.raises(NotLeaderOrFollowerError) as caught:
        rm.leader_partition("t", 0)
    assert (caught.value.leader_id, caught.value.leader_epoch,
            caught.value.leader_url) == (OTHER, 3, "http://127.0.0.1:9002")


def test_unknown_topic_partition_and_leaderless_partition(tmp_path):
    cluster = Cluster()
    cluster.topic("t", "id-1", [ME])
    cluster.add(PartitionChangeRecord("id-1", 0, leader=-1, isr=[ME]))
    rm = make_manager(tmp_path)
    rm.apply_image(cluster.image, caught_up=True)
    with pytest.raises(UnknownTopicOrPartitionError, match="does not exist"):
        rm.leader_partition("nope", 0)
    with pytest.raises(UnknownTopicOrPartitionError, match="partitions 0 to 0"):
        rm.leader_partition("t", 5)
    with pytest.raises(LeaderNotAvailableError):
        rm.leader_partition("t", 0)


def test_leader_epoch_in_requests_is_checked(tmp_path):
    cluster = Cluster()
    cluster.topic("t", "id-1", [ME])
    cluster.add(PartitionChangeRecord("id-1", 0, leader=-1))  # epoch 1
    cluster.add(PartitionChangeRecord("id-1", 0, leader=ME))  # epoch 2
    rm = make_manager(tmp_path)
    rm.apply_image(cluster.image, caught_up=True)
    assert rm.leader_partition("t", 0, 2).leader_epoch == 2
    assert rm.leader_partition("t", 0, -1).leader_epoch == 2  # -1: no check
    with pytest.raises(FencedLeaderEpochError):
        rm.leader_partition("t", 0, 1)
    with pytest.raises(UnknownLeaderEpochError):
        rm.leader_partition("t", 0, 3)


def test_deleted_topic_loses_its_log_only_once_caught_up(tmp_path):
    cluster = Cluster()
    cluster.topic("t", "id-1", [ME])
    rm = make_manager(tmp_path)
    rm.apply_image(cluster.image, caught_up=True)
    directory = rm.leader_partition("t", 0).log.directory
    cluster.add(RemoveTopicRecord("id-1"))
    rm.apply_image(cluster.image, caught_up=False)
    assert os.path.isdir(directory), "a lagging image must not delete data"
    rm.apply_image(cluster.image, caught_up=True)
    assert not os.path.exists(directory) and not rm.partitions


def test_restart_replaying_metadata_keeps_logs_until_caught_up(tmp_path):
    cluster = Cluster()
    cluster.topic("t", "id-1", [ME])
    rm = make_manager(tmp_path)
    rm.apply_image(cluster.image, caught_up=True)
    rm.append(rm.leader_partition("t", 0), build_batch([(None, b"kept")]))
    rm.log_manager.shutdown()
    restarted = make_manager(tmp_path)
    restarted.apply_image(MetadataImage(), caught_up=False)  # nothing replayed yet
    restarted.apply_image(cluster.image, caught_up=True)
    part = restarted.leader_partition("t", 0)
    assert part.log_end_offset == 1 and part.high_watermark == 1


def test_topic_recreated_under_the_same_name_starts_empty(tmp_path):
    cluster = Cluster()
    cluster.topic("t", "id-1", [ME])
    rm = make_manager(tmp_path)
    rm.apply_image(cluster.image, caught_up=True)
    rm.append(rm.leader_partition("t", 0), build_batch([(None, b"old")]))
    rm.log_manager.shutdown()
    # While the broker was down: deleted and created again.
    cluster.add(RemoveTopicRecord("id-1"))
    cluster.topic("t", "id-2", [ME])
    restarted = make_manager(tmp_path)
    restarted.apply_image(cluster.image, caught_up=True)
    part = restarted.leader_partition("t", 0)
    assert part.log_end_offset == 0
    assert read_topic_id(part.log.directory) == "id-2"


def test_topic_config_overrides_reach_the_log(tmp_path):
    cluster = Cluster()
    cluster.topic("t", "id-1", [ME])
    rm = make_manager(tmp_path)
    rm.apply_image(cluster.image, caught_up=True)
    cluster.add(ConfigRecord("topic", "t", "max.message.bytes", "2048"))
    cluster.add(ConfigRecord("topic", "t", "unclean.leader.election.enable", "true"))
    rm.apply_image(cluster.image, caught_up=True)
    assert rm.leader_partition("t", 0).log.config.max_message_bytes == 2048


def test_a_long_poll_is_answered_by_an_append_and_then_forgotten(tmp_path):
    cluster = Cluster()
    cluster.topic("t", "id-1", [ME, ME])
    rm = make_manager(tmp_path)
    rm.apply_image(cluster.image, caught_up=True)
    specs = [FetchSpec(TopicPartition("t", p), 0, 1 << 20, None) for p in (0, 1)]
    rm.core.fetch(7, FetchRequest(-1, specs, 5000, 1, 1 << 20), now_ms=0)
    assert rm.take() == [], "nothing to read yet: the fetch waits"
    rm.append(rm.leader_partition("t", 1), build_batch([(None, b"x")]))
    (answer,) = [a for a in rm.take() if isinstance(a, Respond) and a.request_id == 7]
    assert [bool(r["records"]) for r in answer.results] == [False, True]
    assert rm.core._waiting_on == {} and rm.core._parked_fetches == {}


def test_a_long_poll_with_nothing_new_is_answered_at_its_deadline(tmp_path):
    cluster = Cluster()
    cluster.topic("t", "id-1", [ME])
    rm = make_manager(tmp_path)
    rm.apply_image(cluster.image, caught_up=True)
    spec = FetchSpec(TopicPartition("t", 0), 0, 1 << 20, None)
    rm.core.tick(1000)  # the ISR check runs; the next is lag.time.max / 2 away
    rm.core.fetch(9, FetchRequest(-1, [spec], 500, 1, 1 << 20), now_ms=1000)
    assert rm.core.next_wake_ms() == 1500
    rm.core.tick(1499)
    assert not [a for a in rm.take() if isinstance(a, Respond)]
    rm.core.tick(1500)
    (answer,) = [a for a in rm.take() if isinstance(a, Respond)]
    assert answer.request_id == 9 and answer.results[0]["records"] == b""


def test_a_log_that_fails_to_open_is_kept_and_retried(tmp_path, monkeypatch):
    cluster = Cluster()
    cluster.topic("t", "id-1", [ME])
    rm = make_manager(tmp_path)
    rm.apply_image(cluster.image, caught_up=True)
    rm.append(rm.leader_partition("t", 0), build_batch([(None, b"committed")]))
    rm.log_manager.shutdown()
    restarted = make_manager(tmp_path)
    real_open = restarted.log_manager.get_or_create_log

    def out_of_file_descriptors(*args, **kwargs):
        raise OSError(24, "Too many open files")

    monkeypatch.setattr(restarted.log_manager, "get_or_create_log", out_of_file_descriptors)
    restarted.apply_image(cluster.image, caught_up=True)
    assert TopicPartition("t", 0) in restarted.log_manager.logs, "assigned data was deleted"
    monkeypatch.setattr(restarted.log_manager, "get_or_create_log", real_open)
    restarted.apply_image(cluster.image, caught_up=True)
    assert restarted.leader_partition("t", 0).log_end_offset == 1


def test_replaying_an_older_incarnation_never_deletes_the_current_one(tmp_path):
    old = Cluster()
    old.topic("t", "id-1", [ME])
    current = Cluster()
    current.topic("t", "id-2", [ME])
    rm = make_manager(tmp_path)
    rm.apply_image(current.image, caught_up=True)
    rm.append(rm.leader_partition("t", 0), build_batch([(None, b"current")]))
    rm.apply_image(old.image, caught_up=False)  # a replay passing the old topic
    rm.apply_image(current.image, caught_up=True)
    assert rm.leader_partition("t", 0).log_end_offset == 1


def test_a_replayed_older_leadership_is_ignored(tmp_path):
    cluster = Cluster()
    cluster.topic("t", "id-1", [ME])
    past = Cluster()
    past.topic("t", "id-1", [ME])
    cluster.add(PartitionChangeRecord("id-1", 0, leader=OTHER, isr=[ME, OTHER],
                                      replicas=[ME, OTHER]))
    rm = make_manager(tmp_path)
    rm.apply_image(cluster.image, caught_up=True)
    assert not rm.partitions[TopicPartition("t", 0)].is_leader
    rm.apply_image(past.image, caught_up=False)  # epoch 0 again, naming this broker
    assert not rm.partitions[TopicPartition("t", 0)].is_leader


def test_high_watermarks_survive_a_restart_through_the_checkpoint(tmp_path):
    cluster = Cluster()
    cluster.add(TopicRecord("t", "id-1"))
    cluster.add(PartitionRecord("id-1", 0, [ME, OTHER], [ME, OTHER], OTHER, 0, 0))
    rm = make_manager(tmp_path)
    rm.apply_image(cluster.image, caught_up=True)
    part = rm.partitions[TopicPartition("t", 0)]
    leader_log_data = build_batch([(None, b"v")] * 8)
    leader = make_manager(tmp_path, "leader-logs")
    leader_image = Cluster()
    leader_image.topic("t", "id-1", [ME])
    leader.apply_image(leader_image.image, caught_up=True)
    lead = leader.leader_partition("t", 0)
    leader.append(lead, leader_log_data)
    part.append_as_follower(lead.log.read(0, 1 << 20, 8), 6)
    assert part.high_watermark == 6
    snapshot = rm.disk.high_watermark_snapshot(rm.partitions)
    rm.disk.write_high_watermarks(snapshot)
    rm.log_manager.shutdown()
    restarted = make_manager(tmp_path)
    restarted.apply_image(cluster.image, caught_up=True)
    assert restarted.partitions[TopicPartition("t", 0)].high_watermark == 6


def test_min_insync_replicas_comes_from_the_topic_or_the_broker_default(tmp_path):
    cluster = Cluster()
    cluster.topic("plain", "id-1", [ME])
    cluster.topic("strict", "id-2", [ME])
    cluster.add(ConfigRecord("topic", "strict", "min.insync.replicas", "3"))
    rm = make_manager(tmp_path, topic_defaults={"min.insync.replicas": "2"})
    rm.apply_image(cluster.image, caught_up=True)
    assert rm.leader_partition("plain", 0).min_insync_replicas == 2
    assert rm.leader_partition("strict", 0).min_insync_replicas == 3


def test_an_unclean_leader_says_loudly_which_offsets_may_be_lost(tmp_path, caplog):
    cluster = Cluster()
    cluster.add(TopicRecord("t", "id-1"))
    cluster.add(PartitionRecord("id-1", 0, [OTHER, ME], [OTHER], OTHER, 0, 0))
    rm = make_manager(tmp_path)
    rm.apply_image(cluster.image, caught_up=True)
    part = rm.partitions[TopicPartition("t", 0)]
    part.log.append(build_batch([(None, b"v")] * 7), 0)  # what it had replicated
    cluster.add(PartitionChangeRecord("id-1", 0, leader=ME, isr=[ME], leader_recovery_state=1))
    with caplog.at_level("WARNING"):
        rm.apply_image(cluster.image, caught_up=True)
    assert part.is_leader
    (line,) = [r.getMessage() for r in caplog.records if "UNCLEAN" in r.getMessage()]
    assert "at or above offset 7 are LOST" in line and "t-0" in line


def test_many_new_logs_open_in_passes_and_a_failing_one_holds_none_back(tmp_path, monkeypatch):
    """At most NEW_LOGS_PER_PASS logs open per pass (a broker given thousands
    at once keeps serving meanwhile); the "open" timer opens the rest, each
    pass counted for the coordinators; a log that cannot open waits for the
    next metadata change and never takes the others' turn."""
    import api.broker.replication as replication

    cluster = Cluster()
    cluster.topic("wide", "id-w", [ME] * 40)
    rm = make_manager(tmp_path)
    real_open = rm.disk.open

    def open_but_three(tp, *args):
        if tp.partition in (0, 1, 2):
            raise OSError("simulated: this log cannot open")
        return real_open(tp, *args)

    monkeypatch.setattr(rm.disk, "open", open_but_three)
    rm.apply_image(cluster.image, caught_up=True)
    assert len(rm.partitions) == replication.NEW_LOGS_PER_PASS - 3
    passes, now = rm.core.passes, 0
    while rm.core.next_wake_ms() <= now + 1 and len(rm.partitions) < 37:
        now += 1
        rm.core.tick(now)
    assert len(rm.partitions) == 37  # all but the three, in passes of the timer
    assert rm.core.passes > passes
    assert all(rm.leader_partition("wide", p).is_leader for p in range(3, 40))
    monkeypatch.setattr(rm.disk, "open", real_open)
    rm.core.tick(now + 1)  # the timer does not retry a failed log...
    assert len(rm.partitions) == 37
    cluster.add(ConfigRecord("topic", "wide", "retention.ms", "1000"))  # ...a change does
    rm.core.apply_image(cluster.image, now + 2, {"wide": None})
    assert len(rm.partitions) == 40


def test_opening_thousands_of_logs_walks_each_about_once(tmp_path):
    """Each "open" pass looks at the next NEW_LOGS_PER_PASS logs waiting,
    not at every log still waiting: 2,000 logs given at once cost about
    2,000 looks in all (walking every waiting one each pass was 2,000 x 125
    passes / 2), and a metadata change of a partition still waiting looks at
    its log at once (of a topic: at the topic's)."""
    import api.broker.replication as replication

    cluster = Cluster()
    cluster.topic("wide", "id-w", [ME] * 1500)
    cluster.topic("narrow", "id-n", [ME] * 500)
    rm = make_manager(tmp_path)
    looked = []
    real_assigned_in = rm.core._assigned_in

    def counting(image, changed):
        for item in real_assigned_in(image, changed):
            looked.append(item[0])
            yield item

    rm.core._assigned_in = counting
    rm.apply_image(cluster.image, caught_up=True)
    assert len(rm.partitions) == replication.NEW_LOGS_PER_PASS
    first_walk = len(looked)
    now = 0
    cluster.add(ConfigRecord("topic", "narrow", "retention.ms", "1000"))
    rm.core.apply_image(cluster.image, now, {"narrow": None})
    changes = 0
    while changes < 1000 and len(rm.partitions) < 2000:
        now += 1  # (no tick: these passes alone open the logs, 16 each)
        # Changes of one partition of the wide topic (ISRs moving while the
        # logs open): each looks at that partition, not at the topic's every
        # waiting log.
        rm.core.apply_image(cluster.image, now, {"wide": {(7 * now) % 1500}})
        changes += 1
    assert len(rm.partitions) == 2000
    assert all(rm.leader_partition("narrow", p).is_leader for p in range(500))
    assert first_walk == 2000 and changes > 50
    assert len(looked) - first_walk <= 2 * 2000 + 500 + 2 * changes, len(looked)


async def test_a_produce_right_after_a_partition_is_given_here_waits_for_its_log(tmp_path):
    """The broker's shell makes new logs' files on a thread; a produce that
    arrives meanwhile waits for the log (within its timeout) and is written,
    instead of being answered LEADER_NOT_AVAILABLE at once."""
    import asyncio

    from api.broker.replica_manager import ReplicaManager

    log_manager = LogManager(LogManagerConfig((str(tmp_path / "d"),)), LogConfig())
    log_manager.startup()
    lifecycle = LifecycleCore(LifecycleSettings(ME, "inc", {}, None, 1000, 3000), 0)
    lifecycle.broker_epoch = 0
    lifecycle.state = BrokerState.RUNNING
    lifecycle.metadata_caught_up = True
    manager = ReplicaManager(ME, log_manager, lifecycle)
    try:
        cluster = Cluster()
        cluster.topic("fresh", "id-fresh", [ME])
        tp = TopicPartition("fresh", 0)
        manager.apply_image(cluster.image)
        assert manager.core.opening_any([tp])  # its files are being made
        results, _ = await asyncio.wait_for(manager.produce(
            [ProduceItem(tp, None, build_batch([(None, b"v")] * 2))], 1, 10_000), 15)
        assert results[0]["error"] is None and results[0]["base_offset"] == 0, results
        assert not manager.core.opening_any([tp])
    finally:
        manager.stop()
        manager.wait_for_creations()
        log_manager.shutdown()


async def test_logs_made_while_the_loop_was_busy_are_hosted_together(tmp_path):
    """New logs asked for in one turn of the event loop go to the executor
    as one job, and those it finished while the loop was busy reach
    ``created`` in one list (one wake-up of the loop and one pass of the
    core for the burst, not one each), every one hosted."""
    import asyncio
    import concurrent.futures

    from api.broker.replication import LOG_PENDING

    log_manager = LogManager(LogManagerConfig((str(tmp_path / "d"),)), LogConfig())
    log_manager.startup()
    calls: list[list[TopicPartition]] = []
    arrived = asyncio.Event()
    tps = [TopicPartition("burst", p) for p in range(5)]

    def created(done: list[TopicPartition]) -> None:
        calls.append(list(done))
        if sum(map(len, calls)) == len(tps):
            arrived.set()

    class Pool(concurrent.futures.ThreadPoolExecutor):
        jobs = 0

        def submit(self, *args, **kwargs):
            self.jobs += 1
            return super().submit(*args, **kwargs)

    pool = Pool(1)
    disk = DiskLogs(ME, log_manager, create_on=pool, created=created)
    for tp in tps:
        assert disk.open(tp, "id-burst", {}, True) == LOG_PENDING
    await asyncio.sleep(0)  # the loop's turn ends: the burst goes to the executor
    pool.shutdown(wait=True)  # the loop is held here until every file is made
    await asyncio.wait_for(arrived.wait(), 10)
    assert pool.jobs == 1
    assert calls == [tps]
    assert all(log_manager.get_log(tp) is not None for tp in tps)
    log_manager.shutdown()


async def test_a_new_log_that_fails_to_be_made_does_not_keep_the_others_of_its_job(
        tmp_path, monkeypatch):
    """One job makes a turn's new logs; one of them failing leaves the
    others hosted, and the next open of the failed one raises its error
    (the core retries it with the next metadata change)."""
    import asyncio
    import concurrent.futures

    from api.broker.replication import LOG_PENDING

    log_manager = LogManager(LogManagerConfig((str(tmp_path / "d"),)), LogConfig())
    log_manager.startup()
    tps = [TopicPartition("job", p) for p in range(3)]
    real_open = log_manager.open_new_log

    def open_new_log(tp, directory, config):
        if tp.partition == 1:
            raise ValueError("made up")
        return real_open(tp, directory, config)
    monkeypatch.setattr(log_manager, "open_new_log", open_new_log)
    calls: list[list[TopicPartition]] = []
    arrived = asyncio.Event()

    def created(done):
        calls.append(list(done))
        arrived.set()

    pool = concurrent.futures.ThreadPoolExecutor(1)
    disk = DiskLogs(ME, log_manager, create_on=pool, created=created)
    for tp in tps:
        assert disk.open(tp, "id-job", {}, True) == LOG_PENDING
    await asyncio.wait_for(arrived.wait(), 10)
    pool.shutdown(wait=True)
    assert calls == [tps]
    assert [log_manager.get_log(tp) is not None for tp in tps] == [True, False, True]
    with pytest.raises(ValueError, match="made up"):
        disk.open(tps[1], "id-job", {}, True)
    log_manager.shutdown()


async def test_a_log_made_on_the_executor_opens_without_its_files_read_back(tmp_path,
                                                                              monkeypatch):
    """A new log's files are made on another thread with its topic id; the
    open that hosts it trusts them (a new topic's partitions cost no reads
    each) only for that topic id and those settings: given other settings,
    or another topic id (the topic recreated meanwhile), it reads and
    checks as before."""
    import asyncio
    import concurrent.futures

    from api.broker import replica_manager
    from api.broker.replication import LOG_PENDING

    log_manager = LogManager(LogManagerConfig((str(tmp_path / "d"),)), LogConfig())
    log_manager.startup()
    made: list[TopicPartition] = []
    everything_made = asyncio.Event()
    tps = [TopicPartition("made", p) for p in range(3)]

    def created(done: list[TopicPartition]) -> None:
        made.extend(done)
        if len(made) == len(tps):
            everything_made.set()

    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        disk = DiskLogs(ME, log_manager, create_on=pool, created=created)
        for tp in tps:
            assert disk.open(tp, "id-made", {"retention.ms": "1000"}, True) == LOG_PENDING
        await asyncio.wait_for(everything_made.wait(), 10)
    reads = []
    real_read = replica_manager.read_topic_id
    monkeypatch.setattr(replica_manager, "read_topic_id",
                        lambda directory: reads.append(directory) or real_read(directory))
    same, other_settings, other_id = tps
    log, _ = disk.open(same, "id-made", {"retention.ms": "1000"}, True)
    assert reads == [] and log.config.retention_ms == 1000
    # Its first open with other settings: read back, checked, reconfigured.
    log, _ = disk.open(other_settings, "id-made", {"retention.ms": "2000"}, True)
    assert reads and log.config.retention_ms == 2000
    assert real_read(log.directory) == "id-made"
    # Its first open for another topic id: the old log is replaced, empty.
    reads.clear()
    old = log_manager.get_log(other_id)
    old.append(build_batch([(None, b"old")]), 0)
    log, _ = disk.open(other_id, "id-newer", {}, True)
    assert reads and real_read(log.directory) == "id-newer" and log.log_end_offset == 0
    # Trusted once: a later open reads as any other.
    reads.clear()
    disk.open(same, "id-made", {"retention.ms": "1000"}, True)
    assert reads
    log_manager.shutdown()
