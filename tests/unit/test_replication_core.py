"""ReplicationCore as a state machine: events in, actions out, time as integers.

Two cores (a leader and a follower of one partition) on real log
directories, wired by hand: each ``SendFetch`` the follower's core emits is
handed to the leader's core and its ``Respond`` back, as the broker's shell
and the simulator do.
"""

from __future__ import annotations

import os

import pytest

from api.broker.data_api import decode_fetch, render_results
from api.broker.lifecycle_core import BrokerState, LifecycleCore, LifecycleSettings
from api.broker.replica_manager import DiskLogs
from api.broker.replication import (ALTER_PARTITION_TIMEOUT_MS, CONNECT_BACKOFF_MS,
                                    CancelRequest, ProduceItem, ReplicationCore,
                                    ReplicationSettings, Respond, SendAlterPartition, SendFetch)
from kraft.image import MetadataImage
from kraft.records import (ConfigRecord, PartitionChangeRecord, PartitionRecord,
                           RegisterBrokerRecord, RemoveTopicRecord, TopicRecord,
                           UnfenceBrokerRecord)
from storage.batch import build_batch
from storage.config import LogConfig
from storage.manager import LogManager, LogManagerConfig, TopicPartition

LEADER, FOLLOWER = 1, 2
TP = TopicPartition("t", 0)
LAG_MS = 10_000


def image_with(leader: int, isr: list[int], min_isr: int = 2) -> MetadataImage:
    image = MetadataImage()
    for broker in (LEADER, FOLLOWER):
        image.apply(RegisterBrokerRecord(broker, f"inc-{broker}",
                                         {"BROKER": f"127.0.0.1:{9000 + broker}"}, None),
                    image.offset + 1)
    image.apply(TopicRecord("t", "id-1"), image.offset + 1)
    image.apply(PartitionRecord("id-1", 0, [LEADER, FOLLOWER], isr, leader, 0, 0),
                image.offset + 1)
    image.apply(ConfigRecord("topic", "t", "min.insync.replicas", str(min_isr)),
                image.offset + 1)
    return image


def broker(tmp_path, broker_id: int, image: MetadataImage) -> ReplicationCore:
    logs = LogManager(LogManagerConfig((str(tmp_path / f"b{broker_id}"),)), LogConfig())
    logs.startup()
    lifecycle = LifecycleCore(LifecycleSettings(broker_id, "inc", {}, None, 1000, 3000), 0)
    lifecycle.broker_epoch = image.brokers[broker_id].broker_epoch  # as registered
    lifecycle.state = BrokerState.RUNNING
    lifecycle.metadata_caught_up = True
    core = ReplicationCore(broker_id, DiskLogs(broker_id, logs), lifecycle,
                           ReplicationSettings(lag_time_max_ms=LAG_MS))
    core.apply_image(image, 0)
    return core


def of(actions, kind):
    return [a for a in actions if isinstance(a, kind)]


def deliver_fetch(leader: ReplicationCore, fetch: SendFetch, now_ms: int
                  ) -> tuple[list, list]:
    """The leader's answer to ``fetch`` (as the wire carries it; [] when the
    leader parked it), and the leader's other actions."""
    request_id = leader.new_request_id()
    leader.fetch(request_id, decode_fetch(fetch.body), now_ms)
    actions = leader.ready()
    answers = [a for a in of(actions, Respond) if a.request_id == request_id]
    rest = [a for a in actions if a not in answers]
    return ([render_results("fetch", answers[0].results)] if answers else []), rest


def produce(core: ReplicationCore, count: int, acks: int, now_ms: int,
            timeout_ms: int = 30_000) -> int:
    request_id = core.new_request_id()
    core.produce(request_id, [ProduceItem(TP, None, build_batch([(None, b"v")] * count))],
                 acks, timeout_ms, now_ms)
    return request_id


@pytest.fixture
def pair(tmp_path):
    image = image_with(LEADER, [LEADER, FOLLOWER])
    leader = broker(tmp_path, LEADER, image)
    follower = broker(tmp_path, FOLLOWER, image)
    leader.ready()
    return leader, follower, image


def test_acks_all_waits_for_the_follower_and_is_answered_by_its_fetch(pair):
    leader, follower, _image = pair
    (first_fetch,) = of(follower.ready(), SendFetch)
    assert first_fetch.leader_id == LEADER and first_fetch.body["replica_id"] == FOLLOWER
    assert deliver_fetch(leader, first_fetch, 1) == ([], []), "nothing to send: parked"
    request_id = produce(leader, 3, -1, now_ms=2)
    actions = leader.ready()
    assert not [a for a in of(actions, Respond) if a.request_id == request_id]
    # The parked follower fetch was answered by the append.
    (answer,) = [a for a in of(actions, Respond)]
    follower.fetch_answered(first_fetch.request_id, {"partitions": render_results(
        "fetch", answer.results)}, 3)
    assert follower.partitions[TP].log_end_offset == 3
    (second_fetch,) = of(follower.ready(), SendFetch)
    assert second_fetch.body["partitions"][0]["offset"] == 3
    answer, rest = deliver_fetch(leader, second_fetch, 4)
    assert answer == [], "nothing new: parked again"
    (ack,) = [a for a in of(rest, Respond) if a.request_id == request_id]
    assert ack.results[0]["error"] is None and ack.results[0]["base_offset"] == 0
    assert leader.partitions[TP].high_watermark == 3


def test_acks_all_times_out_at_its_deadline(pair):
    leader, _follower, _image = pair
    request_id = produce(leader, 1, -1, now_ms=0, timeout_ms=500)
    leader.ready()
    leader.tick(499)
    assert not [a for a in of(leader.ready(), Respond) if a.request_id == request_id]
    leader.tick(500)
    (ack,) = [a for a in of(leader.ready(), Respond) if a.request_id == request_id]
    assert ack.results[0]["error"].code == "REQUEST_TIMED_OUT"


def test_acks_all_is_refused_before_appending_when_the_isr_is_too_small(tmp_path):
    leader = broker(tmp_path, LEADER, image_with(LEADER, [LEADER]))
    request_id = produce(leader, 1, -1, now_ms=0)
    (answer,) = [a for a in of(leader.ready(), Respond) if a.request_id == request_id]
    assert answer.results[0]["error"].code == "NOT_ENOUGH_REPLICAS"
    assert leader.partitions[TP].log_end_offset == 0


def test_a_lost_leadership_fails_the_waiting_write(pair):
    leader, _follower, image = pair
    request_id = produce(leader, 1, -1, now_ms=0)
    leader.ready()
    image.apply(PartitionChangeRecord("id-1", 0, leader=FOLLOWER), image.offset + 1)
    leader.apply_image(image, 1)
    (ack,) = [a for a in of(leader.ready(), Respond) if a.request_id == request_id]
    assert ack.results[0]["error"].code == "NOT_LEADER_OR_FOLLOWER"


def test_a_new_leader_cancels_the_fetch_in_flight_and_fetches_from_it(pair):
    _leader, follower, image = pair
    (first,) = of(follower.ready(), SendFetch)
    image.apply(PartitionChangeRecord("id-1", 0, leader=-1), image.offset + 1)
    follower.apply_image(image, 5)
    assert [a.request_id for a in of(follower.ready(), CancelRequest)] == [first.request_id]
    follower.fetch_answered(first.request_id, {"partitions": []}, 6)  # void: ignored
    assert of(follower.ready(), SendFetch) == []


def test_an_unreachable_leader_is_asked_again_after_a_back_off(pair):
    _leader, follower, _image = pair
    follower.tick(0)  # the first ISR check; the next is lag.time.max / 2 away
    (first,) = of(follower.ready(), SendFetch)
    follower.fetch_failed(first.request_id, 100)
    assert of(follower.ready(), SendFetch) == []
    assert follower.next_wake_ms() == 100 + CONNECT_BACKOFF_MS
    follower.tick(100 + CONNECT_BACKOFF_MS)
    (again,) = of(follower.ready(), SendFetch)
    assert again.request_id != first.request_id


def test_a_lagging_follower_is_proposed_out_and_the_answer_applied(pair):
    leader, _follower, _image = pair
    leader.tick(0)
    leader.ready()
    leader.tick(LAG_MS + 1)
    (proposal,) = of(leader.ready(), SendAlterPartition)
    assert proposal.body["new_isr"] == [LEADER]
    assert proposal.body["broker_epoch"] == leader.lifecycle.broker_epoch
    assert proposal.timeout_ms == ALTER_PARTITION_TIMEOUT_MS
    leader.alter_partition_answered(proposal.request_id, {
        "leader_epoch": 0, "partition_epoch": 1, "isr": [LEADER],
        "leader_recovery_state": 0}, None, LAG_MS + 2)
    assert leader.partitions[TP].isr == [LEADER] and leader.isr_shrinks == 1


def test_fetches_name_the_followers_registration_and_an_expansion_names_it_too(tmp_path):
    """KIP-903: a follower's fetch carries its broker epoch; the leader
    proposes it into the ISR only on fetches of the registration the image
    shows, and names that epoch for the controller to check."""
    image = image_with(LEADER, [LEADER])
    for b in (LEADER, FOLLOWER):  # live: they may join an ISR
        image.apply(UnfenceBrokerRecord(b, image.brokers[b].broker_epoch), image.offset + 1)
    leader = broker(tmp_path, LEADER, image)
    follower = broker(tmp_path, FOLLOWER, image)
    leader.ready()
    registered = image.brokers[FOLLOWER].broker_epoch
    (fetch,) = of(follower.ready(), SendFetch)
    assert fetch.body["replica_epoch"] == registered
    def as_epoch(epoch: int) -> SendFetch:
        return SendFetch(fetch.request_id, fetch.leader_id,
                         {**fetch.body, "replica_epoch": epoch}, fetch.timeout_ms)

    # A registration the image does not show yet (a newer one): no proposal.
    _, rest = deliver_fetch(leader, as_epoch(registered + 5), 1)
    leader.tick(2)
    assert of(rest + leader.ready(), SendAlterPartition) == []
    # One that names none (a broker between registrations): no proposal.
    _, rest = deliver_fetch(leader, as_epoch(-1), 2)
    assert of(rest, SendAlterPartition) == []
    # One older than the image's: a late fetch of a dead incarnation, refused,
    # and the fetch session it names is closed.
    sessions = dict(leader._fetch_sessions)
    assert sessions
    stale = as_epoch(registered - 1)
    stale.body.update(session_id=max(sessions), session_epoch=1)
    (answer,), rest = deliver_fetch(leader, stale, 2)
    assert answer[0]["error"]["code"] == "STALE_BROKER_EPOCH"
    assert of(rest, SendAlterPartition) == [] and max(sessions) not in leader._fetch_sessions
    _, rest = deliver_fetch(leader, fetch, 3)
    (proposal,) = of(rest, SendAlterPartition)
    assert proposal.body["new_isr"] == [LEADER, FOLLOWER]
    assert proposal.body["new_isr_broker_epochs"] == [leader.lifecycle.broker_epoch, registered]


@pytest.mark.parametrize("code, counted", [("INELIGIBLE_REPLICA", True),
                                           ("INVALID_REQUEST", False)])
def test_only_a_refusal_no_copy_can_escape_forgets_the_proposed_members(tmp_path, code, counted):
    """INELIGIBLE_REPLICA depends on liveness and registrations, which change
    without a new partition epoch: another copy of the request may still be
    applied, so the proposed member keeps counting for the high watermark.
    INVALID_REQUEST holds for every copy: the member is forgotten."""
    image = image_with(LEADER, [LEADER])
    for b in (LEADER, FOLLOWER):
        image.apply(UnfenceBrokerRecord(b, image.brokers[b].broker_epoch), image.offset + 1)
    leader = broker(tmp_path, LEADER, image)
    follower = broker(tmp_path, FOLLOWER, image)
    leader.ready()
    (fetch,) = of(follower.ready(), SendFetch)
    _, rest = deliver_fetch(leader, fetch, 1)
    (proposal,) = of(rest, SendAlterPartition)
    leader.alter_partition_answered(proposal.request_id, None, code, 2)
    assert (FOLLOWER in leader.partitions[TP].maximal_isr) is counted


def test_an_unanswered_proposal_is_given_up_at_its_deadline_and_made_afresh(pair):
    leader, _follower, _image = pair
    leader.tick(0)
    leader.ready()
    leader.tick(LAG_MS + 1)
    (proposal,) = of(leader.ready(), SendAlterPartition)
    leader.tick(LAG_MS + ALTER_PARTITION_TIMEOUT_MS)
    assert of(leader.ready(), CancelRequest) == []
    leader.tick(LAG_MS + 1 + ALTER_PARTITION_TIMEOUT_MS)
    actions = leader.ready()
    assert [a.request_id for a in of(actions, CancelRequest)] == [proposal.request_id]
    (again,) = of(actions, SendAlterPartition)
    assert again.request_id != proposal.request_id and again.body == proposal.body
    leader.alter_partition_answered(proposal.request_id, {"isr": [LEADER]}, None, 0)
    assert leader.partitions[TP].isr == [LEADER, FOLLOWER], "a void answer changes nothing"
    leader.check_invariants()


async def test_new_logs_made_off_the_loop_are_opened_when_ready_or_deleted_if_unassigned(
        tmp_path):
    """With an executor, a new log's files are made there: until they are
    the partition answers LEADER_NOT_AVAILABLE (retriable, "still opening"),
    not NOT_LEADER naming this very broker; once ``logs_created`` comes it
    leads. A partition unassigned meanwhile is deleted when its files are
    ready, as no later walk would find it."""
    import asyncio
    import concurrent.futures

    from protocol.errors import LeaderNotAvailableError

    logs = LogManager(LogManagerConfig((str(tmp_path / "b1"),)), LogConfig())
    logs.startup()
    lifecycle = LifecycleCore(LifecycleSettings(LEADER, "inc", {}, None, 1000, 3000), 0)
    lifecycle.broker_epoch = LEADER
    lifecycle.state = BrokerState.RUNNING
    lifecycle.metadata_caught_up = True
    ready: asyncio.Queue = asyncio.Queue()
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        disk = DiskLogs(LEADER, logs, create_on=pool, created=ready.put_nowait)
        core = ReplicationCore(LEADER, disk, lifecycle, ReplicationSettings())
        image = image_with(LEADER, [LEADER, FOLLOWER])
        core.apply_image(image, 0)
        assert core.opening(["t"]) and TP not in core.partitions
        with pytest.raises(LeaderNotAvailableError, match="still opening"):
            core.leader_partition("t", 0)
        created = await asyncio.wait_for(ready.get(), 10)
        assert created == [TP] and logs.get_log(TP) is not None
        core.logs_created(created, 1)
        core.tick(1)
        assert not core.opening(["t"]) and core.leader_partition("t", 0).is_leader
        assert core.partitions[TP].leader_epoch == 0

        # A second topic, unassigned while its files are being made.
        image.apply(TopicRecord("u", "id-2"), image.offset + 1)
        image.apply(PartitionRecord("id-2", 0, [LEADER], [LEADER], LEADER, 0, 0),
                    image.offset + 1)
        core.apply_image(image, 2, {"u": {0}})
        gone = image.copy()
        gone.apply(PartitionChangeRecord("id-2", 0, replicas=[FOLLOWER], isr=[FOLLOWER],
                                         leader=FOLLOWER), gone.offset + 1)
        core.apply_image(gone, 3)
        created = await asyncio.wait_for(ready.get(), 10)
        assert created == [TopicPartition("u", 0)]
        core.logs_created(created, 4)
        core.tick(4)
        assert logs.get_log(TopicPartition("u", 0)) is None
        assert not core.opening(["u"]) and TopicPartition("u", 0) not in core.partitions


def test_a_failed_log_dir_lets_go_of_its_partitions_and_refuses_them_from_then_on(pair):
    """A disk error took the leader's log dir offline (LogManager.fail_dir):
    ``logs_offline`` fails the write waiting for replication with
    KAFKA_STORAGE_ERROR (nobody acknowledges what the log may not hold),
    refuses later writes and fetches the same way, never opens the log again
    on a metadata change, and forgets it once the partition is deleted. The
    follower that loses its log stops fetching it."""
    leader, follower, image = pair
    request_id = produce(leader, 1, -1, now_ms=0)
    leader.ready()
    manager = leader.logs.log_manager
    (directory,) = manager.config.log_dirs
    manager.fail_dir(directory, "EIO (test)")
    leader.logs_offline([TP], 1)
    (ack,) = [a for a in of(leader.ready(), Respond) if a.request_id == request_id]
    assert ack.results[0]["error"].code == "KAFKA_STORAGE_ERROR"
    assert TP not in leader.partitions and leader.offline == {TP}
    again = produce(leader, 1, 1, now_ms=2)
    (answer,) = [a for a in of(leader.ready(), Respond) if a.request_id == again]
    assert answer.results[0]["error"].code == "KAFKA_STORAGE_ERROR"
    assert "offline after a disk error" in str(answer.results[0]["error"])
    image.apply(ConfigRecord("topic", "t", "retention.ms", "1000"), image.offset + 1)
    leader.apply_image(image, 3)
    assert TP not in leader.partitions, "an offline log is never opened again"
    # The follower's dir fails too: its fetch session lets the partition go.
    (fetch,) = of(follower.ready(), SendFetch)
    follower.logs.log_manager.fail_dir(follower.logs.log_manager.config.log_dirs[0], "EIO")
    follower.logs_offline([TP], 4)
    actions = follower.ready()
    assert [a.request_id for a in of(actions, CancelRequest)] == [fetch.request_id]
    assert not of(actions, SendFetch)
    # The topic is deleted: the core forgets the partition; its files stay,
    # and the log manager refuses the name until a restart.
    image.apply(RemoveTopicRecord("id-1"), image.offset + 1)
    leader.apply_image(image, 5)
    assert leader.offline == set() and manager.offline_logs() == {TP: directory}
    assert os.path.isdir(os.path.join(directory, "t-0"))


def test_the_leaderships_one_metadata_change_brings_are_logged_on_one_line(tmp_path, caplog):
    """A broker given the leadership of three new partitions at once says
    so in one line naming each with its epoch and log end; one given a
    single one says it as before."""
    image = image_with(LEADER, [LEADER, FOLLOWER])
    leader = broker(tmp_path, LEADER, image)
    image = image.copy()
    image.apply(TopicRecord("u", "id-2"), image.offset + 1)
    for number in range(3):
        image.apply(PartitionRecord("id-2", number, [LEADER, FOLLOWER], [LEADER, FOLLOWER],
                                    LEADER, 4, 0), image.offset + 1)
    with caplog.at_level("INFO", logger="api.broker.replication"):
        leader.apply_image(image, 10, {"u": None})
    lines = [r.getMessage() for r in caplog.records if "leader of" in r.getMessage()]
    assert lines == ["broker 1: leader of 3 partitions: u-0 in epoch 4 (log end 0), "
                     "u-1 in epoch 4 (log end 0), u-2 in epoch 4 (log end 0)"]
    caplog.clear()
    image = image.copy()
    image.apply(PartitionRecord("id-2", 3, [LEADER, FOLLOWER], [LEADER, FOLLOWER], LEADER, 5, 0),
                image.offset + 1)
    with caplog.at_level("INFO", logger="api.broker.replication"):
        leader.apply_image(image, 20, {"u": {3}})
    assert [r.getMessage() for r in caplog.records if "leader of" in r.getMessage()] == [
        "broker 1: leader of u-3 in epoch 5 (log end 0)"]
