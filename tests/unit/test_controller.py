"""The controller core, driven with an injected clock (plain integers) and
deterministic topic ids. Every batch it returns is committed to a real
``MetadataImage`` at consecutive offsets (through the records' wire form),
so the tests check the resulting cluster state, not just the records."""

from __future__ import annotations

import itertools
import logging
import re

import msgpack

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kraft import records as rec
from kraft.controller import (PARTITIONS_PER_REQUEST_MAX, PARTITIONS_PER_TOPIC_MAX, Controller,
                              ControllerResult, ControllerSettings, random_topic_id)
from kraft.image import MetadataImage
from kraft.records import NO_LEADER
from protocol.errors import (BrokerIdNotRegisteredError, DuplicateBrokerRegistrationError,
                             FencedLeaderEpochError, IneligibleReplicaError, InvalidConfigError,
                             InvalidRequestError, InvalidUpdateVersionError, KraftError,
                             NotLeaderOrFollowerError, StaleBrokerEpochError,
                             UnknownLeaderEpochError, UnknownTopicOrPartitionError)

SESSION_MS = 9000
INTERVAL_MS = 300_000


def commit(image: MetadataImage, records: list[rec.Record]) -> MetadataImage:
    """Apply a batch as the shell would: consecutive offsets after the image's."""
    for record in records:
        image.apply(rec.decode(record.encode()), image.offset + 1)
    image.check_invariants()
    return image


class Cluster:
    """A controller, the image it governs and a clock the test moves."""

    def __init__(self, **settings_overrides) -> None:
        settings_overrides.setdefault("auto_leader_rebalance_enable", False)
        self.settings = ControllerSettings(**settings_overrides)
        self.ids = (f"tid-{n}" for n in itertools.count())
        self.controller = Controller(self.settings, id_factory=lambda: next(self.ids))
        self.image = MetadataImage()
        self.now_ms = 0
        self.controller.become_active(self.image, self.now_ms)

    # -- calls that write: commit what they return --------------------------
    def call(self, method: str, request: dict, *, with_clock: bool = False) -> dict:
        args = (self.image, request, self.now_ms) if with_clock else (self.image, request)
        before = self.image.to_snapshot()
        try:
            result = getattr(self.controller, method)(*args)
        finally:  # The core never changes the image it is given, even when it refuses.
            assert self.image.to_snapshot() == before, method
        assert isinstance(result, ControllerResult)
        commit(self.image, result.records)
        return result.response

    def register(self, broker_id: int, incarnation: str | None = None,
                 rack: str | None = None, **fields) -> dict:
        return self.call("register_broker", {
            "broker_id": broker_id, "incarnation_id": incarnation or f"inc-{broker_id}",
            "endpoints": {"BROKER": f"127.0.0.1:{9000 + broker_id}"}, "rack": rack, **fields},
            with_clock=True)

    def heartbeat(self, broker_id: int, **fields) -> dict:
        broker = self.image.brokers.get(broker_id)
        request = {"broker_id": broker_id,
                   "broker_epoch": broker.broker_epoch if broker else 0,
                   "metadata_offset": self.image.offset}
        request.update(fields)
        return self.call("heartbeat", request, with_clock=True)

    def start(self, *broker_ids: int, racks: dict[int, str] | None = None) -> None:
        """Register the brokers and unfence them."""
        for broker_id in broker_ids:
            self.register(broker_id, rack=(racks or {}).get(broker_id))
        for broker_id in broker_ids:
            assert self.heartbeat(broker_id)["is_fenced"] is False

    def keep_alive(self, *broker_ids: int) -> None:
        for broker_id in broker_ids:
            self.heartbeat(broker_id)

    def tick(self) -> list[rec.Record]:
        before = self.image.to_snapshot()
        records = self.controller.tick(self.image, self.now_ms)
        assert self.image.to_snapshot() == before
        commit(self.image, records)
        return records

    def create(self, name: str, **fields) -> dict:
        response = self.call("create_topics", {"topics": [{"name": name, **fields}]})
        return response["topics"][0]

    def partition(self, topic: str, partition: int = 0):
        return self.image.partition(topic, partition)

    def set_config(self, topic: str, key: str, value) -> dict:
        return self.call("alter_configs", {"resources": [{
            "type": "topic", "name": topic, "ops": [{"name": key, "op": "set", "value": value}]}]})


def errors_of(items: list[dict]) -> list[str | None]:
    return [None if item["error"] is None else item["error"]["code"] for item in items]


# -- settings -------------------------------------------------------------------
@pytest.mark.parametrize("overrides", [
    {"session_timeout_ms": 0}, {"session_timeout_ms": True}, {"session_timeout_ms": "9000"},
    {"heartbeat_interval_ms": 9000}, {"heartbeat_interval_ms": 0},
    {"default_num_partitions": 0}, {"default_replication_factor": 0},
    {"leader_imbalance_check_interval_ms": 0}, {"unclean_leader_election_enable": "yes"},
    {"topic_config_defaults": {"retention.ms": "soon"}},
    {"topic_config_defaults": {"no.such.key": "1"}},
])
def test_bad_settings_are_refused(overrides):
    with pytest.raises(InvalidConfigError):
        ControllerSettings(**overrides)


def test_settings_normalise_topic_defaults_and_the_unclean_field_wins():
    settings = ControllerSettings(unclean_leader_election_enable=True, topic_config_defaults={
        "retention.ms": 1000, "unclean.leader.election.enable": "false"})
    assert settings.topic_config_defaults == {"retention.ms": "1000",
                                              "unclean.leader.election.enable": "true"}


def test_settings_from_a_node_config_use_kafka_names():
    from kraft.config import node_config_from_settings

    config = node_config_from_settings({
        "node.id": 7, "process.roles": "controller",
        "controller.quorum.voters": "7@127.0.0.1:9093",
        "listeners": "CONTROLLER://127.0.0.1:9093", "log.dirs": "/tmp/x",
        "broker.session.timeout.ms": 6000, "broker.heartbeat.interval.ms": "500",
        "num.partitions": 3, "default.replication.factor": 2,
        "unclean.leader.election.enable": "true", "auto.leader.rebalance.enable": False,
        "leader.imbalance.check.interval.seconds": 30, "log.retention.hours": 1,
        "min.insync.replicas": 2})
    settings = ControllerSettings.from_node(config)
    assert (settings.session_timeout_ms, settings.heartbeat_interval_ms) == (6000, 500)
    assert (settings.default_num_partitions, settings.default_replication_factor) == (3, 2)
    assert settings.unclean_leader_election_enable and not settings.auto_leader_rebalance_enable
    assert settings.leader_imbalance_check_interval_ms == 30_000
    assert settings.topic_config_defaults["retention.ms"] == "3600000"
    assert settings.topic_config_defaults["min.insync.replicas"] == "2"


def test_default_topic_ids_are_kafka_style_base64url():
    ids = {random_topic_id() for _ in range(200)}
    assert len(ids) == 200
    assert all(len(i) == 22 and not i.startswith("-") and "=" not in i for i in ids)


# -- registration ---------------------------------------------------------------
def test_new_registration_starts_fenced_with_the_record_offset_as_epoch():
    cluster = Cluster()
    assert cluster.register(1) == {"broker_id": 1, "broker_epoch": 0}
    assert cluster.register(2) == {"broker_id": 2, "broker_epoch": 1}
    broker = cluster.image.brokers[2]
    assert broker.fenced and broker.endpoints == {"BROKER": "127.0.0.1:9002"}
    assert cluster.controller.lease_expiry_ms(2) == SESSION_MS


def test_same_incarnation_again_is_an_idempotent_retry():
    cluster = Cluster()
    cluster.start(1)
    offset = cluster.image.offset
    cluster.now_ms = 5000
    assert cluster.register(1) == {"broker_id": 1, "broker_epoch": 0}
    assert cluster.image.offset == offset  # nothing written
    assert cluster.controller.lease_expiry_ms(1) == 5000 + SESSION_MS
    with pytest.raises(InvalidRequestError, match="new incarnation_id"):
        cluster.register(1, rack="elsewhere")


def test_another_incarnation_is_refused_while_the_old_lease_is_live():
    cluster = Cluster()
    cluster.start(1)
    cluster.now_ms = SESSION_MS - 1
    with pytest.raises(DuplicateBrokerRegistrationError):
        cluster.register(1, incarnation="intruder")
    assert cluster.image.brokers[1].incarnation_id == "inc-1"


def test_a_registration_computed_again_is_not_refused_as_its_own_duplicate():
    """The shell computes a batch again when it was not committed (another
    image met it): with the core's own state put back, the new incarnation's
    registration is computed as the first time, not refused because the
    first computation gave it a lease."""
    cluster = Cluster()
    cluster.start(1)
    cluster.now_ms = SESSION_MS + 1  # the old lease lapsed
    request = {"broker_id": 1, "incarnation_id": "inc-1b", "endpoints": {"BROKER": "h:1"}}
    saved = cluster.controller.own_state()
    first = cluster.controller.register_broker(cluster.image, request, cluster.now_ms)
    with pytest.raises(DuplicateBrokerRegistrationError):  # what it was before the fix
        cluster.controller.register_broker(cluster.image, request, cluster.now_ms)
    cluster.controller.restore_own_state(saved)
    again = cluster.controller.register_broker(cluster.image, request, cluster.now_ms)
    assert again.records == first.records and again.response == first.response


def test_restart_after_lease_lapse_fences_the_old_registration_first():
    cluster = Cluster(default_replication_factor=2)
    cluster.start(1, 2)
    cluster.create("t", num_partitions=2)
    led_by_1 = cluster.image.partitions_led_by(1)
    assert led_by_1
    cluster.now_ms = SESSION_MS
    cluster.keep_alive(2)
    result = cluster.controller.register_broker(cluster.image, {
        "broker_id": 1, "incarnation_id": "inc-1b", "endpoints": {"BROKER": "h:1"}},
        cluster.now_ms)
    types = [type(r) for r in result.records]
    assert types[0] is rec.FenceBrokerRecord and types[-1] is rec.RegisterBrokerRecord
    assert set(types[1:-1]) == {rec.PartitionChangeRecord}
    epoch = cluster.image.offset + len(result.records)
    assert result.response == {"broker_id": 1, "broker_epoch": epoch}
    commit(cluster.image, result.records)
    broker = cluster.image.brokers[1]
    assert (broker.incarnation_id, broker.broker_epoch, broker.fenced) == ("inc-1b", epoch, True)
    assert cluster.image.partitions_led_by(1) == []
    assert all(cluster.partition(t, p).leader == 2 for t, p in led_by_1)


def test_restart_of_an_already_fenced_broker_writes_only_the_registration():
    cluster = Cluster()
    cluster.start(1)
    cluster.now_ms = SESSION_MS
    cluster.tick()
    assert cluster.image.brokers[1].fenced
    result = cluster.controller.register_broker(cluster.image, {
        "broker_id": 1, "incarnation_id": "inc-1b", "endpoints": {"BROKER": "h:1"}},
        cluster.now_ms)
    assert [type(r) for r in result.records] == [rec.RegisterBrokerRecord]


def test_a_broker_that_completed_controlled_shutdown_may_restart_at_once():
    cluster = Cluster()
    cluster.start(1, 2)
    assert cluster.heartbeat(1, want_shutdown=True)["should_shut_down"]
    # Its id is free immediately: no waiting for the old lease to lapse.
    cluster.register(1, incarnation="inc-1b")
    assert cluster.image.brokers[1].incarnation_id == "inc-1b"


def test_a_fenced_broker_that_keeps_heartbeating_still_holds_its_id():
    cluster = Cluster()
    cluster.start(1)
    cluster.heartbeat(1, want_fence=True)
    assert cluster.image.brokers[1].fenced
    with pytest.raises(DuplicateBrokerRegistrationError):
        cluster.register(1, incarnation="inc-1b")
    cluster.now_ms = SESSION_MS  # it went quiet for a whole session
    cluster.register(1, incarnation="inc-1b")


def test_a_new_active_controller_gives_grace_to_unfenced_brokers_only():
    cluster = Cluster()
    cluster.start(1, 2)
    cluster.heartbeat(2, want_fence=True)
    cluster.now_ms = 10 * SESSION_MS
    cluster.controller.become_active(cluster.image, cluster.now_ms)
    assert cluster.controller.lease_expiry_ms(1) == cluster.now_ms + SESSION_MS
    assert cluster.controller.lease_expiry_ms(2) is None
    with pytest.raises(DuplicateBrokerRegistrationError):
        cluster.register(1, incarnation="inc-1b")  # unfenced: may still be alive
    cluster.register(2, incarnation="inc-2b")  # fenced and silent: replaced at once


# -- heartbeats -----------------------------------------------------------------
def test_heartbeat_from_unknown_or_stale_broker_is_refused_without_renewing():
    cluster = Cluster()
    cluster.register(1)
    with pytest.raises(BrokerIdNotRegisteredError):
        cluster.heartbeat(2, broker_epoch=0)
    cluster.now_ms = 100
    with pytest.raises(StaleBrokerEpochError):
        cluster.heartbeat(1, broker_epoch=7)
    assert cluster.controller.lease_expiry_ms(1) == SESSION_MS


def test_unfenced_only_once_caught_up_with_its_own_registration():
    cluster = Cluster()
    cluster.register(1)
    cluster.register(2)  # broker 2's epoch is offset 1
    response = cluster.heartbeat(2, metadata_offset=0)
    assert (response["is_caught_up"], response["is_fenced"]) == (False, True)
    assert cluster.image.brokers[2].fenced
    response = cluster.heartbeat(2, metadata_offset=1)
    assert (response["is_caught_up"], response["is_fenced"]) == (True, False)
    assert response["session_timeout_ms"] == SESSION_MS
    assert response["heartbeat_interval_ms"] == 2000 and not response["should_shut_down"]
    assert not cluster.image.brokers[2].fenced
    offset = cluster.image.offset
    cluster.heartbeat(2)  # steady state writes nothing
    assert cluster.image.offset == offset


def test_heartbeat_renews_the_lease():
    cluster = Cluster()
    cluster.start(1)
    cluster.now_ms = 5000
    cluster.heartbeat(1)
    assert cluster.controller.lease_expiry_ms(1) == 5000 + SESSION_MS
    cluster.now_ms = 5000 + SESSION_MS - 1
    assert cluster.tick() == []
    cluster.now_ms += 1
    assert [type(r) for r in cluster.tick()] == [rec.FenceBrokerRecord]


def test_want_fence_fences_and_moves_leadership():
    cluster = Cluster(default_replication_factor=2)
    cluster.start(1, 2)
    cluster.create("t", num_partitions=2)
    response = cluster.heartbeat(1, want_fence=True)
    assert response["is_fenced"] and cluster.image.brokers[1].fenced
    assert cluster.image.partitions_led_by(1) == []
    assert cluster.image.partitions_led_by(2) == [("t", 0), ("t", 1)]
    assert cluster.heartbeat(1, want_fence=True)["is_fenced"]  # stays fenced, no unfence


# -- lease expiry ---------------------------------------------------------------
def test_tick_fences_exactly_the_lapsed_brokers_at_the_session_boundary():
    cluster = Cluster(default_replication_factor=3)
    cluster.start(1, 2, 3)
    cluster.create("t", num_partitions=3)
    before = {p: cluster.partition("t", p) for p in range(3)}
    cluster.now_ms = 4000
    cluster.keep_alive(2, 3)
    cluster.now_ms = SESSION_MS - 1
    assert cluster.tick() == []
    cluster.now_ms = SESSION_MS
    records = cluster.tick()
    assert records[0] == rec.FenceBrokerRecord(1, 0)
    assert cluster.image.unfenced_broker_ids() == {2, 3}
    for p, old in before.items():
        new = cluster.partition("t", p)
        assert 1 not in new.isr and new.leader in (2, 3)
        if old.leader == 1:  # moved to the first live ISR member, epoch bumped
            assert new.leader == [b for b in old.replicas if b != 1][0]
            assert new.leader_epoch == old.leader_epoch + 1
        else:
            assert (new.leader, new.leader_epoch) == (old.leader, old.leader_epoch)
        assert new.partition_epoch == old.partition_epoch + 1
    assert cluster.tick() == []  # a fenced broker needs no further fencing


def test_a_broker_whose_process_is_gone_is_fenced_on_the_next_tick_not_the_session():
    cluster = Cluster(default_replication_factor=3)
    cluster.start(1, 2, 3)
    cluster.create("t", num_partitions=3)
    epoch = cluster.image.brokers[2].broker_epoch
    cluster.now_ms = 100  # long before the session could lapse
    assert not cluster.controller.end_lease(cluster.image, 2, epoch + 1)  # a later process
    assert not cluster.controller.end_lease(cluster.image, 9, 0)  # unknown
    assert cluster.tick() == []
    assert cluster.controller.end_lease(cluster.image, 2, epoch)
    assert cluster.tick()[0] == rec.FenceBrokerRecord(2, epoch)
    assert cluster.image.unfenced_broker_ids() == {1, 3}
    assert all(2 not in cluster.partition("t", p).isr for p in range(3))
    assert not cluster.controller.end_lease(cluster.image, 2, epoch)  # fenced already
    assert cluster.tick() == []
    # A broker that heartbeated after its connection closed is alive.
    cluster.now_ms = 200
    cluster.keep_alive(3)
    epoch3 = cluster.image.brokers[3].broker_epoch
    assert not cluster.controller.end_lease(cluster.image, 3, epoch3, closed_ms=150)
    assert cluster.controller.end_lease(cluster.image, 3, epoch3, closed_ms=250)


@pytest.mark.parametrize("elr", [True, False])
def test_brokers_lapsing_together_are_fenced_in_one_ordered_batch(elr):
    cluster = Cluster(default_replication_factor=2, eligible_leader_replicas=elr)
    cluster.start(1, 2, 3)
    cluster.create("t", assignments={0: [1, 2], 1: [3, 1]})
    cluster.now_ms = SESSION_MS - 5
    cluster.keep_alive(3)
    cluster.now_ms = SESSION_MS
    records = cluster.tick()
    assert records[:2] == [rec.FenceBrokerRecord(1, 0), rec.FenceBrokerRecord(2, 1)]
    assert all(isinstance(r, rec.PartitionChangeRecord) for r in records[2:])
    offline = cluster.partition("t", 0)
    if elr:  # KIP-966: the ISR empties, its members stay eligible
        assert (offline.leader, offline.isr, offline.elr) == (NO_LEADER, [], [1, 2])
        assert offline.last_known_leader == 1
    else:  # before it, never an empty ISR
        assert (offline.leader, offline.isr, offline.elr) == (NO_LEADER, [2], [])
    moved = cluster.partition("t", 1)
    assert (moved.leader, moved.isr) == (3, [3])


def test_no_live_isr_member_leaves_the_partition_offline():
    cluster = Cluster(default_replication_factor=2)
    cluster.start(1, 2)
    cluster.create("t", assignments={0: [1, 2]})
    cluster.call("alter_partition", {"broker_id": 1, "broker_epoch": 0, "topic": "t",
                                     "partition": 0, "leader_epoch": 0, "partition_epoch": 0,
                                     "new_isr": [1]})
    cluster.now_ms = SESSION_MS
    cluster.keep_alive(2)
    cluster.tick()
    p = cluster.partition("t", 0)
    # Broker 2 left the ISR while it kept min.insync.replicas (1): not eligible.
    assert (p.leader, p.isr, p.elr, p.leader_epoch) == (NO_LEADER, [], [1], 1)


@pytest.mark.parametrize("via", ["topic config", "cluster default"])
def test_unclean_election_when_enabled_resets_the_isr(via):
    cluster = Cluster(default_replication_factor=2,
                      unclean_leader_election_enable=(via == "cluster default"))
    cluster.start(1, 2)
    cluster.create("t", assignments={0: [1, 2]})
    if via == "topic config":
        assert cluster.set_config("t", "unclean.leader.election.enable", True)[
            "resources"][0]["error"] is None
    cluster.call("alter_partition", {"broker_id": 1, "broker_epoch": 0, "topic": "t",
                                     "partition": 0, "leader_epoch": 0, "partition_epoch": 0,
                                     "new_isr": [1]})
    cluster.now_ms = SESSION_MS
    cluster.keep_alive(2)
    cluster.tick()
    p = cluster.partition("t", 0)
    assert (p.leader, p.isr) == (2, [2])


def test_returning_broker_reelects_its_offline_partitions():
    cluster = Cluster()
    cluster.start(1, 2)
    cluster.create("t", assignments={0: [1], 1: [2]})
    cluster.now_ms = SESSION_MS
    cluster.keep_alive(2)
    cluster.tick()
    assert cluster.partition("t", 0).leader == NO_LEADER
    cluster.now_ms += 1000
    response = cluster.heartbeat(1)
    assert not response["is_fenced"]
    p = cluster.partition("t", 0)
    assert (p.leader, p.isr, p.leader_epoch) == (1, [1], 2)
    assert cluster.partition("t", 1).leader == 2


def offline_with_broker_2_out_of_sync(with_broker_3: bool = False) -> Cluster:
    """t-0 and t-1 on [1, 2], ISR [1]; broker 1 fenced, broker 2 live again
    but not in sync: both offline. ``with_broker_3``: also t-2 on [3, 1],
    led by a live broker 3."""
    cluster = Cluster(default_replication_factor=2)
    cluster.start(*((1, 2, 3) if with_broker_3 else (1, 2)))
    cluster.create("t", assignments={0: [1, 2], 1: [1, 2],
                                     **({2: [3, 1]} if with_broker_3 else {})})
    for p in (0, 1):
        cluster.call("alter_partition", {"broker_id": 1, "broker_epoch": 0, "topic": "t",
                                         "partition": p, "leader_epoch": 0,
                                         "partition_epoch": 0, "new_isr": [1]})
    cluster.heartbeat(2, want_fence=True)
    cluster.heartbeat(1, want_fence=True)
    assert cluster.partition("t", 0).leader == NO_LEADER
    cluster.heartbeat(2)  # back, but not in sync: stays offline
    assert [cluster.partition("t", p).leader for p in (0, 1)] == [NO_LEADER, NO_LEADER]
    return cluster


def fence_and_find_no_eligible_leader(cluster: Cluster, *brokers: int) -> None:
    """Fence ``brokers``: t-0 is left without a leader, and an unclean
    election finds none to elect either."""
    for broker in brokers:
        cluster.heartbeat(broker, want_fence=True)
    assert cluster.partition("t", 0).leader == NO_LEADER
    response = cluster.call("elect_leaders", {"election_type": "unclean", "partitions": [
        {"topic": "t", "partition": 0}]})
    assert response["partitions"][0]["error"]["code"] == "ELIGIBLE_LEADERS_NOT_AVAILABLE"


def test_returning_broker_outside_the_isr_leads_only_if_unclean_is_allowed():
    cluster = offline_with_broker_2_out_of_sync()
    # Enabling unclean election elects the live out-of-sync replica at once.
    cluster.set_config("t", "unclean.leader.election.enable", "true")
    for p in (0, 1):
        assert (cluster.partition("t", p).leader, cluster.partition("t", p).isr) == (2, [2])


def test_an_unclean_election_asked_for_gives_an_offline_partition_a_leader():
    """kraftlog partitions elect-leaders --unclean (Kafka's ElectLeaders,
    election type UNCLEAN): with unclean.leader.election.enable off, an
    operator elects a live replica outside the ISR of a partition with no
    leader, accepting the loss of what it lacks; one that has a leader is
    ELECTION_NOT_NEEDED, one with no live replica ELIGIBLE_LEADERS_NOT_AVAILABLE."""
    cluster = offline_with_broker_2_out_of_sync(with_broker_3=True)
    for bad in ("clean", ["unclean"], True, 2, None):
        with pytest.raises(InvalidRequestError, match="election_type"):
            cluster.call("elect_leaders", {"election_type": bad, "partitions": None})
    response = cluster.call("elect_leaders", {"election_type": "unclean", "partitions": [
        {"topic": "t", "partition": 0}, {"topic": "t", "partition": 2},
        {"topic": "nope", "partition": 0}]})
    assert [(r["partition"], r["leader"], r["unclean"], r["error"] and r["error"]["code"])
            for r in response["partitions"]] == [
        (0, 2, True, None), (2, 3, False, "ELECTION_NOT_NEEDED"),
        (0, NO_LEADER, False, "UNKNOWN_TOPIC_OR_PARTITION")]
    after = cluster.partition("t", 0)
    assert (after.leader, after.isr, after.leader_recovery_state) == (2, [2], rec.LEADER_RECOVERING)
    # Every partition (None): only those it changed or could not change are listed.
    response = cluster.call("elect_leaders", {"election_type": 1, "partitions": None})
    assert [(r["partition"], r["leader"], r["unclean"]) for r in response["partitions"]] == [
        (1, 2, True)]
    fence_and_find_no_eligible_leader(cluster, 2, 3)


def test_replicas_in_an_offline_log_dir_leave_isr_and_leadership_until_a_new_registration():
    """A broker's heartbeat names the log directories it took offline after
    a disk error and the replicas that were in them: the controller records
    them on its registration, takes those replicas out of their ISRs,
    elects other leaders for the partitions they led, and never lets them
    lead or rejoin (even when every other replica is gone), until the broker
    registers again (a restart, with the disk replaced or healthy)."""
    cluster = Cluster(default_replication_factor=3)
    cluster.start(1, 2, 3)
    cluster.create("t", assignments={0: [1, 2, 3], 1: [2, 1, 3], 2: [3, 2, 1]})
    topic_id = cluster.image.topics["t"].topic_id
    for bad, match in (({"offline_replicas": []}, "offline_replicas must be a map"),
                       ({"offline_replicas": {topic_id: [-1]}}, r"\[0\] must be an integer"),
                       ({"offline_replicas": {topic_id: 0}}, "must be a list"),
                       ({"offline_log_dirs": "/d"}, "offline_log_dirs must be a list")):
        with pytest.raises(InvalidRequestError, match=match):
            cluster.heartbeat(1, **bad)
    epochs = [cluster.partition("t", p).leader_epoch for p in range(3)]
    # Broker 1 lost the directory holding t-0 and t-1 (and one of a topic
    # deleted meanwhile: ignored).
    cluster.heartbeat(1, offline_log_dirs=["/data/b"],
                      offline_replicas={topic_id: [0, 1], "gone-topic": [4]})
    broker = cluster.image.brokers[1]
    assert (broker.offline_log_dirs, broker.offline_replicas) == (["/data/b"], {topic_id: [0, 1]})
    assert not broker.fenced  # its other logs are served as before
    p0, p1, p2 = (cluster.partition("t", p) for p in range(3))
    assert (p0.leader, p0.isr, p0.leader_epoch) == (2, [2, 3], epochs[0] + 1)
    assert (p1.leader, p1.isr, p1.leader_epoch) == (2, [2, 3], epochs[1])
    assert p2 == cluster.partition("t", 2) and p2.leader_epoch == epochs[2]
    # The same report again changes nothing.
    offset = cluster.image.offset
    cluster.heartbeat(1, offline_log_dirs=["/data/b"], offline_replicas={topic_id: [0]})
    assert cluster.image.offset == offset
    # The leader may not add it back; a preferred election does not pick it.
    with pytest.raises(IneligibleReplicaError, match="offline after a disk error"):
        cluster.call("alter_partition", {
            "broker_id": 2, "broker_epoch": cluster.image.brokers[2].broker_epoch,
            "topic": "t", "partition": 0, "leader_epoch": p0.leader_epoch,
            "partition_epoch": p0.partition_epoch, "new_isr": [2, 3, 1]})
    response = cluster.call("elect_leaders", {"partitions": [{"topic": "t", "partition": 0}]})
    assert response["partitions"][0]["error"]["code"] == "PREFERRED_LEADER_NOT_AVAILABLE"
    # Brokers 2 and 3 gone: t-0 has no eligible leader, not even unclean.
    cluster.set_config("t", "unclean.leader.election.enable", "true")
    fence_and_find_no_eligible_leader(cluster, 2, 3)
    # Broker 1 restarts: its new registration has no offline directory, and
    # (unclean allowed) it may lead t-0 again.
    cluster.now_ms = SESSION_MS
    cluster.tick()  # its old lease lapses
    cluster.register(1, incarnation="inc-1-again")
    assert cluster.image.brokers[1].offline_replicas == {}
    cluster.heartbeat(1)
    assert cluster.partition("t", 0).leader == 1


def test_become_active_gives_every_broker_a_fresh_lease_and_forgets_others():
    cluster = Cluster()
    cluster.start(1)
    cluster.controller.register_broker(cluster.image, {  # never committed
        "broker_id": 9, "incarnation_id": "x", "endpoints": {"B": "h:1"}}, 0)
    cluster.controller.become_active(cluster.image, 20_000)
    assert cluster.controller.lease_expiry_ms(1) == 20_000 + SESSION_MS
    assert cluster.controller.lease_expiry_ms(9) is None
    cluster.now_ms = 20_000 + SESSION_MS - 1
    assert cluster.tick() == []


# -- controlled shutdown --------------------------------------------------------
def test_controlled_shutdown_moves_leadership_then_fences_and_says_shut_down():
    cluster = Cluster(default_replication_factor=2)
    cluster.start(1, 2, 3)
    cluster.create("t", assignments={0: [1, 2], 1: [2, 1], 2: [1, 3]})
    cluster.call("alter_partition", {"broker_id": 1, "broker_epoch": 0, "topic": "t",
                                     "partition": 2, "leader_epoch": 0, "partition_epoch": 0,
                                     "new_isr": [1]})
    response = cluster.heartbeat(1, want_shutdown=True)
    assert response["should_shut_down"] and response["is_fenced"]
    broker = cluster.image.brokers[1]
    assert broker.in_controlled_shutdown and broker.fenced
    assert (cluster.partition("t", 0).leader, cluster.partition("t", 0).isr) == (2, [2])
    assert (cluster.partition("t", 1).leader, cluster.partition("t", 1).isr) == (2, [2])
    # Its only in-sync replica is leaving: offline (unclean is off), the
    # leaving broker its eligible leader replica.
    p = cluster.partition("t", 2)
    assert (p.leader, p.isr, p.elr) == (NO_LEADER, [], [1])
    offset = cluster.image.offset
    again = cluster.heartbeat(1, want_shutdown=True)
    assert again["should_shut_down"] and cluster.image.offset == offset


def test_controlled_shutdown_records_come_in_order():
    cluster = Cluster(default_replication_factor=2)
    cluster.start(1, 2)
    cluster.create("t", assignments={0: [1, 2]})
    result = cluster.controller.heartbeat(cluster.image, {
        "broker_id": 1, "broker_epoch": 0, "metadata_offset": cluster.image.offset,
        "want_shutdown": True}, 0)
    assert result.records == [rec.BrokerRegistrationChangeRecord(1, 0, True),
                              rec.PartitionChangeRecord("tid-0", 0, leader=2, isr=[2]),
                              rec.FenceBrokerRecord(1, 0)]


def test_fenced_broker_asking_to_shut_down_may_at_once():
    cluster = Cluster()
    cluster.register(1)
    response = cluster.heartbeat(1, metadata_offset=-1, want_shutdown=True)
    assert response["should_shut_down"] and response["is_fenced"]
    assert response["is_caught_up"] is False
    # In controlled shutdown it is never unfenced, even once caught up.
    assert cluster.heartbeat(1)["is_fenced"]


# -- create topics --------------------------------------------------------------
def test_create_topic_with_defaults():
    cluster = Cluster(default_num_partitions=3, default_replication_factor=2)
    cluster.start(1, 2, 3)
    result = cluster.create("orders", configs={"retention.ms": 60_000,
                                               "unclean.leader.election.enable": False})
    assert result == {"name": "orders", "topic_id": "tid-0", "num_partitions": 3,
                      "replication_factor": 2, "error": None,
                      "configs": {"retention.ms": "60000",
                                  "unclean.leader.election.enable": "false"}}
    topic = cluster.image.topics["orders"]
    assert topic.topic_id == "tid-0" and sorted(topic.partitions) == [0, 1, 2]
    for p in topic.partitions.values():
        assert (p.isr, p.leader, p.leader_epoch, p.partition_epoch) == (
            p.replicas, p.replicas[0], 0, 0)
        assert len(p.replicas) == 2
    assert sorted(p.replicas[0] for p in topic.partitions.values()) == [1, 2, 3]
    assert cluster.image.topic_configs("orders") == {
        "retention.ms": "60000", "unclean.leader.election.enable": "false"}


def test_create_topics_records_come_topic_then_partitions_then_configs():
    cluster = Cluster()
    cluster.start(1)
    result = cluster.controller.create_topics(cluster.image, {"topics": [
        {"name": "t", "num_partitions": 2, "configs": {"segment.ms": "100"}}]})
    assert result.records == [rec.TopicRecord("t", "tid-0"),
                              rec.PartitionRecord("tid-0", 0, [1], [1], 1, 0, 0),
                              rec.PartitionRecord("tid-0", 1, [1], [1], 1, 0, 0),
                              rec.ConfigRecord("topic", "t", "segment.ms", "100")]


@pytest.mark.parametrize("topic, code", [
    ({"name": "bad name!"}, "INVALID_TOPIC_EXCEPTION"),
    ({"name": ".."}, "INVALID_TOPIC_EXCEPTION"),
    ({"name": "x" * 250}, "INVALID_TOPIC_EXCEPTION"),
    ({"name": "exists"}, "TOPIC_ALREADY_EXISTS"),
    ({"name": "exists.too"}, "INVALID_TOPIC_EXCEPTION"),  # collides with exists_too
    ({"name": "t", "num_partitions": 0}, "INVALID_PARTITIONS"),
    ({"name": "t", "num_partitions": -2}, "INVALID_PARTITIONS"),
    ({"name": "t", "num_partitions": PARTITIONS_PER_TOPIC_MAX + 1}, "INVALID_PARTITIONS"),
    ({"name": "t", "replication_factor": 0}, "INVALID_REPLICATION_FACTOR"),
    ({"name": "t", "replication_factor": -3}, "INVALID_REPLICATION_FACTOR"),
    ({"name": "t", "replication_factor": 3}, "INVALID_REPLICATION_FACTOR"),  # 2 live
    ({"name": "t", "configs": {"no.such": "1"}}, "INVALID_CONFIG"),
    ({"name": "t", "configs": {"retention.ms": "soon"}}, "INVALID_CONFIG"),
    ({"name": "t", "configs": {"cleanup.policy": "compress"}}, "INVALID_CONFIG"),
    ({"name": "t", "configs": {"min.cleanable.dirty.ratio": 1.5}}, "INVALID_CONFIG"),
    ({"name": "t", "configs": {"min.compaction.lag.ms": 10, "max.compaction.lag.ms": 5}},
     "INVALID_CONFIG"),
    ({"name": "t", "configs": {"segment.bytes": 10}}, "INVALID_CONFIG"),
    ({"name": "t", "configs": {"retention.ms": "9" * 1025}}, "INVALID_CONFIG"),
    ({"name": "t", "assignments": {0: [1], 2: [2]}}, "INVALID_PARTITIONS"),
    ({"name": "t", "assignments": {}}, "INVALID_PARTITIONS"),
    ({"name": "t", "assignments": {0: [1], "00": [2]}}, "INVALID_PARTITIONS"),
    ({"name": "t", "assignments": {0: [1], 1: [1, 2]}}, "INVALID_REPLICATION_FACTOR"),
    ({"name": "t", "assignments": {0: []}}, "INVALID_REPLICATION_FACTOR"),
    ({"name": "t", "assignments": {0: [1, 1]}}, "INVALID_REQUEST"),
    ({"name": "t", "assignments": {0: [1, 7]}}, "INVALID_REQUEST"),
    ({"name": "t", "assignments": {0: [3]}}, "INVALID_REQUEST"),  # only fenced brokers
    ({"name": "t", "num_partitions": 2, "assignments": {0: [1]}}, "INVALID_PARTITIONS"),
    ({"name": "t", "replication_factor": 2, "assignments": {0: [1]}},
     "INVALID_REPLICATION_FACTOR"),
])
def test_create_topic_errors_are_per_topic(topic, code):
    cluster = Cluster()
    cluster.start(1, 2)
    cluster.register(3)  # registered, fenced
    cluster.create("exists")
    cluster.create("exists_too")
    offset = cluster.image.offset
    response = cluster.call("create_topics", {"topics": [topic, {"name": "fine"}]})
    assert errors_of(response["topics"]) == [code, None]
    failed = response["topics"][0]
    assert failed["topic_id"] is None and failed["error"]["message"]
    # Only "fine" was written: its TopicRecord and PartitionRecord.
    assert "fine" in cluster.image.topics and cluster.image.offset == offset + 2


def test_a_name_twice_in_one_request_fails_every_occurrence():
    cluster = Cluster()
    cluster.start(1)
    response = cluster.call("create_topics", {"topics": [{"name": "a"}, {"name": "b"},
                                                         {"name": "a"}]})
    assert errors_of(response["topics"]) == ["INVALID_REQUEST", None, "INVALID_REQUEST"]
    assert sorted(cluster.image.topics) == ["b"]


def test_names_collide_within_one_request_too():
    cluster = Cluster()
    cluster.start(1)
    response = cluster.call("create_topics", {"topics": [{"name": "a.b"}, {"name": "a_b"}]})
    assert errors_of(response["topics"]) == [None, "INVALID_TOPIC_EXCEPTION"]
    assert "collides with existing topic 'a.b'" in response["topics"][1]["error"]["message"]


def test_validate_only_checks_everything_and_writes_nothing():
    cluster = Cluster()
    cluster.start(1)
    result = cluster.controller.create_topics(cluster.image, {"validate_only": True, "topics": [
        {"name": "ok", "num_partitions": 2}, {"name": "ok.too"}, {"name": "bad!"}]})
    assert result.records == []
    assert errors_of(result.response["topics"]) == [None, None, "INVALID_TOPIC_EXCEPTION"]
    ok = result.response["topics"][0]
    assert (ok["topic_id"], ok["num_partitions"], ok["replication_factor"]) == (None, 2, 1)
    assert next(cluster.ids) == "tid-0"  # validation drew no id


def test_topics_of_one_request_spread_over_the_brokers():
    cluster = Cluster()
    cluster.start(1, 2, 3)
    response = cluster.call("create_topics", {"topics": [{"name": n} for n in "abc"]})
    assert errors_of(response["topics"]) == [None, None, None]
    leaders = [cluster.partition(n).leader for n in "abc"]
    assert sorted(leaders) == [1, 2, 3]
    # And the next request spreads over what the image already holds.
    cluster.create("d", num_partitions=3)
    assert sorted(cluster.partition("d", p).leader for p in range(3)) == [1, 2, 3]


def test_placement_counts_the_replicas_brokers_already_hold():
    cluster = Cluster()
    cluster.start(1, 2, 3)
    cluster.create("x", assignments={0: [1, 2]})
    # Brokers 2 and 3 lead nothing; 2 already holds a replica, so 3 leads.
    assert cluster.create("y")["error"] is None
    assert cluster.partition("y").replicas == [3]


def test_placement_uses_only_live_brokers():
    cluster = Cluster(default_replication_factor=2)
    cluster.start(1, 2, 3)
    cluster.heartbeat(3, want_fence=True)
    cluster.create("t", num_partitions=4)
    assert {b for p in range(4) for b in cluster.partition("t", p).replicas} == {1, 2}


def test_manual_assignment_with_digit_keys_and_a_fenced_replica():
    cluster = Cluster()
    cluster.start(1, 2)
    cluster.register(3)  # fenced: a replica, but neither leader nor in the ISR
    result = cluster.create("t", assignments={"1": [2, 1], "0": [3, 1]})
    assert (result["num_partitions"], result["replication_factor"]) == (2, 2)
    p0, p1 = cluster.partition("t", 0), cluster.partition("t", 1)
    assert (p0.replicas, p0.isr, p0.leader) == ([3, 1], [1], 1)
    assert (p1.replicas, p1.isr, p1.leader) == ([2, 1], [2, 1], 2)


def test_request_partition_budget_is_shared_by_its_topics():
    cluster = Cluster()
    cluster.start(1)
    half = PARTITIONS_PER_REQUEST_MAX // 2
    result = cluster.controller.create_topics(cluster.image, {"validate_only": True, "topics": [
        {"name": "a", "num_partitions": half}, {"name": "b", "num_partitions": half},
        {"name": "c", "num_partitions": 1}]})
    assert errors_of(result.response["topics"]) == [None, None, "INVALID_PARTITIONS"]


def test_topic_id_factory_collisions_are_drawn_again():
    cluster = Cluster()
    cluster.start(1)
    cluster.create("a")
    cluster.ids = iter(["tid-0", "", 5, "tid-fresh"])
    assert cluster.create("b")["topic_id"] == "tid-fresh"
    cluster.ids = itertools.repeat("tid-0")
    assert cluster.create("c")["error"]["code"] == "UNKNOWN_SERVER_ERROR"


# -- delete topics --------------------------------------------------------------
def test_delete_topics():
    cluster = Cluster()
    cluster.start(1)
    cluster.create("a", configs={"retention.ms": 1})
    cluster.create("b")
    response = cluster.call("delete_topics", {"topics": ["a", "nope", "b", "b"]})
    assert response == {"topics": [
        {"name": "a", "error": None},
        {"name": "nope", "error": {"code": "UNKNOWN_TOPIC_OR_PARTITION",
                                   "message": "topic 'nope' does not exist"}},
        {"name": "b", "error": response["topics"][2]["error"]},
        {"name": "b", "error": response["topics"][3]["error"]}]}
    assert errors_of(response["topics"])[2:] == ["INVALID_REQUEST", "INVALID_REQUEST"]
    assert sorted(cluster.image.topics) == ["b"] and not cluster.image.topic_configs("a")


# -- create partitions ----------------------------------------------------------
def test_create_partitions_grows_a_topic_with_its_replication_factor():
    cluster = Cluster(default_replication_factor=2)
    cluster.start(1, 2, 3)
    cluster.create("t", num_partitions=2)
    response = cluster.call("create_partitions", {"topics": [{"name": "t", "count": 5}]})
    assert response == {"topics": [{"name": "t", "error": None}]}
    topic = cluster.image.topics["t"]
    assert sorted(topic.partitions) == [0, 1, 2, 3, 4]
    assert all(len(p.replicas) == 2 and p.isr == p.replicas for p in topic.partitions.values())
    leaders = [topic.partitions[p].leader for p in range(5)]
    assert max(leaders.count(b) for b in (1, 2, 3)) == 2  # spread


def test_create_partitions_with_assignments_and_validate_only():
    cluster = Cluster(default_replication_factor=2)
    cluster.start(1, 2, 3)
    cluster.create("t")
    offset = cluster.image.offset
    response = cluster.call("create_partitions", {"validate_only": True, "topics": [
        {"name": "t", "count": 3, "assignments": [[3, 1], [2, 3]]}]})
    assert errors_of(response["topics"]) == [None] and cluster.image.offset == offset
    cluster.call("create_partitions", {"topics": [
        {"name": "t", "count": 3, "assignments": [[3, 1], [2, 3]]}]})
    assert [cluster.partition("t", p).replicas for p in (1, 2)] == [[3, 1], [2, 3]]


@pytest.mark.parametrize("item, code, message", [
    ({"name": "nope", "count": 3}, "UNKNOWN_TOPIC_OR_PARTITION", "does not exist"),
    ({"name": "t", "count": 1}, "INVALID_PARTITIONS", "cannot decrease .* from 2 to 1"),
    ({"name": "t", "count": 2}, "INVALID_PARTITIONS", "already has 2 partitions"),
    ({"name": "t", "count": PARTITIONS_PER_TOPIC_MAX + 1}, "INVALID_PARTITIONS", "at most"),
    ({"name": "t", "count": 4, "assignments": [[1, 2]]}, "INVALID_PARTITIONS", "adds 2"),
    ({"name": "t", "count": 3, "assignments": [[1]]}, "INVALID_REPLICATION_FACTOR", "needs 2"),
    ({"name": "t", "count": 3, "assignments": [[1, 9]]}, "INVALID_REQUEST", "unregistered"),
])
def test_create_partitions_errors(item, code, message):
    cluster = Cluster(default_replication_factor=2)
    cluster.start(1, 2)
    cluster.create("t", num_partitions=2)
    offset = cluster.image.offset
    response = cluster.call("create_partitions", {"topics": [item]})
    error = response["topics"][0]["error"]
    assert error["code"] == code
    assert re.search(message, error["message"])
    assert cluster.image.offset == offset


# -- configs --------------------------------------------------------------------
def describe(cluster, name, keys=None) -> dict:
    resource = {"type": "topic", "name": name}
    if keys is not None:
        resource["keys"] = keys
    return cluster.controller.describe_configs(cluster.image, {"resources": [resource]})[
        "resources"][0]


def test_describe_configs_lists_every_key_with_value_and_source():
    cluster = Cluster(topic_config_defaults={"retention.ms": 1234})
    cluster.start(1)
    cluster.create("t", configs={"segment.ms": 60_000})
    result = describe(cluster, "t")
    configs = {c["name"]: c for c in result["configs"]}
    assert result["error"] is None and set(configs) >= {"retention.ms", "min.insync.replicas"}
    assert configs["segment.ms"] == {"name": "segment.ms", "value": "60000",
                                     "source": "TOPIC_CONFIG", "read_only": False}
    assert configs["retention.ms"]["value"] == "1234"  # the node's default
    assert configs["retention.ms"]["source"] == "DEFAULT_CONFIG"
    assert configs["cleanup.policy"]["value"] == "delete"  # built in
    assert [c["name"] for c in describe(cluster, "t", ["segment.ms"])["configs"]] == [
        "segment.ms"]


def test_compaction_configs_are_stored_canonical_and_checked_against_the_defaults():
    cluster = Cluster(topic_config_defaults={"min.compaction.lag.ms": 60_000})
    cluster.start(1)
    response = cluster.call("create_topics", {"topics": [
        {"name": "compacted", "configs": {"cleanup.policy": ["delete", "compact"],
                                          "min.cleanable.dirty.ratio": 0.25,
                                          "delete.retention.ms": "1_000"}},
        # Fine alone, but below the cluster's default min.compaction.lag.ms.
        {"name": "too-eager", "configs": {"max.compaction.lag.ms": 1000}}]})
    assert errors_of(response["topics"]) == [None, "INVALID_CONFIG"]
    assert "min.compaction.lag.ms (60000)" in response["topics"][1]["error"]["message"]
    assert cluster.image.topic_configs("compacted") == {
        "cleanup.policy": "compact,delete", "min.cleanable.dirty.ratio": "0.25",
        "delete.retention.ms": "1000"}
    configs = {c["name"]: c["value"] for c in describe(cluster, "compacted")["configs"]}
    assert (configs["min.compaction.lag.ms"], configs["max.compaction.lag.ms"]) == (
        "60000", str(2**63 - 1))
    # Altering checks the topic's overrides after the ops against the defaults too.
    response = cluster.call("alter_configs", {"resources": [
        {"type": "topic", "name": "compacted", "ops": [
            {"name": "max.compaction.lag.ms", "op": "set", "value": "59999"}]}]})
    assert errors_of(response["resources"]) == ["INVALID_CONFIG"]
    response = cluster.call("alter_configs", {"resources": [
        {"type": "topic", "name": "compacted", "ops": [
            {"name": "max.compaction.lag.ms", "op": "set", "value": "59999"},
            {"name": "min.compaction.lag.ms", "op": "set", "value": 0},
            {"name": "cleanup.policy", "op": "set", "value": "COMPACT"}]}]})
    assert errors_of(response["resources"]) == [None]
    assert cluster.image.topic_configs("compacted")["cleanup.policy"] == "compact"


@pytest.mark.parametrize("resource, code", [
    ({"type": "broker", "name": "1"}, "INVALID_REQUEST"),
    ({"type": "topic", "name": "nope"}, "UNKNOWN_TOPIC_OR_PARTITION"),
    ({"type": "topic", "name": "t", "keys": ["no.such"]}, "INVALID_CONFIG"),
])
def test_describe_configs_errors_are_per_resource(resource, code):
    cluster = Cluster()
    cluster.start(1)
    cluster.create("t")
    response = cluster.controller.describe_configs(cluster.image, {"resources": [
        resource, {"type": "topic", "name": "t"}]})
    assert errors_of(response["resources"]) == [code, None]


def test_alter_configs_set_and_delete():
    cluster = Cluster()
    cluster.start(1)
    cluster.create("t", configs={"retention.ms": 1000, "segment.ms": 5000})
    response = cluster.call("alter_configs", {"resources": [{"type": "topic", "name": "t", "ops": [
        {"name": "retention.ms", "op": "set", "value": "2_000"},
        {"name": "segment.ms", "op": "delete"},
        {"name": "min.insync.replicas", "op": "set", "value": 1}]}]})
    assert response == {"resources": [{"type": "topic", "name": "t", "error": None}]}
    assert cluster.image.topic_configs("t") == {"retention.ms": "2000",
                                                "min.insync.replicas": "1"}
    configs = {c["name"]: c for c in describe(cluster, "t")["configs"]}
    assert configs["segment.ms"]["source"] == "DEFAULT_CONFIG"


def test_a_topic_no_acks_all_write_could_reach_is_refused():
    """Replication factor below min.insync.replicas: the producer's default
    acks=all sends would retry until delivery.timeout.ms and fail."""
    cluster = Cluster(topic_config_defaults={"min.insync.replicas": "2"})
    cluster.start(3)
    response = cluster.call("create_topics", {"topics": [
        {"name": "lonely", "num_partitions": 1, "replication_factor": 1},
        {"name": "strict", "num_partitions": 1, "replication_factor": 1,
         "configs": {"min.insync.replicas": "3"}},
        {"name": "fine", "num_partitions": 1, "replication_factor": 1,
         "configs": {"min.insync.replicas": "1"}}]})
    lonely, strict, fine = response["topics"]
    assert lonely["error"]["code"] == "INVALID_REPLICATION_FACTOR"
    assert ("below the cluster's default min.insync.replicas=2" in lonely["error"]["message"]
            and "--config min.insync.replicas=1" in lonely["error"]["message"])
    assert strict["error"]["code"] == "INVALID_REPLICATION_FACTOR"
    assert "below its min.insync.replicas=3" in strict["error"]["message"]
    assert fine["error"] is None and set(cluster.image.topics) == {"fine"}
    response = cluster.call("alter_configs", {"resources": [{"type": "topic", "name": "fine",
                                                             "ops": [{"name": "min.insync.replicas",
                                                                      "op": "delete"}]}]})
    (result,) = response["resources"]
    assert result["error"]["code"] == "INVALID_CONFIG"
    assert "keep min.insync.replicas at most 1" in result["error"]["message"]
    assert cluster.image.topic_configs("fine") == {"min.insync.replicas": "1"}


def test_raising_the_cluster_default_warns_of_each_topic_it_makes_unwritable(caplog):
    cluster = Cluster()
    cluster.start(3)
    cluster.create("old", replication_factor=1)
    cluster.create("pinned", replication_factor=1, configs={"min.insync.replicas": "1"})
    stricter = Controller(ControllerSettings(topic_config_defaults={"min.insync.replicas": "2"}))
    with caplog.at_level("WARNING"):
        stricter.become_active(cluster.image, 0)
    warnings = [r.getMessage() for r in caplog.records if "every acks=all" in r.getMessage()]
    assert len(warnings) == 1 and "'old'" in warnings[0], warnings
    assert "kraftlog topics alter old --config min.insync.replicas=1" in warnings[0]


def test_alter_configs_that_change_nothing_write_nothing():
    cluster = Cluster()
    cluster.start(1)
    cluster.create("t", configs={"retention.ms": 1000})
    result = cluster.controller.alter_configs(cluster.image, {"resources": [{
        "type": "topic", "name": "t", "ops": [
            {"name": "retention.ms", "op": "set", "value": 1000},
            {"name": "segment.ms", "op": "delete"}]}]})
    assert result.records == [] and errors_of(result.response["resources"]) == [None]


@pytest.mark.parametrize("resource, code", [
    ({"type": "topic", "name": "nope", "ops": []}, "UNKNOWN_TOPIC_OR_PARTITION"),
    ({"type": "broker", "name": "1", "ops": []}, "INVALID_REQUEST"),
    ({"type": "topic", "name": "t", "ops": [{"name": "no.such", "op": "set", "value": "1"}]},
     "INVALID_CONFIG"),
    ({"type": "topic", "name": "t", "ops": [{"name": "no.such", "op": "delete"}]},
     "INVALID_CONFIG"),
    ({"type": "topic", "name": "t", "ops": [{"name": "retention.ms", "op": "set",
                                             "value": "-7"}]}, "INVALID_CONFIG"),
    ({"type": "topic", "name": "t", "ops": [{"name": "cleanup.policy", "op": "set",
                                             "value": "compress"}]}, "INVALID_CONFIG"),
    ({"type": "topic", "name": "t", "ops": [{"name": "retention.ms", "op": "set", "value": 1},
                                            {"name": "retention.ms", "op": "delete"}]},
     "INVALID_REQUEST"),
])
def test_alter_configs_errors_are_per_resource(resource, code):
    cluster = Cluster()
    cluster.start(1)
    cluster.create("t")
    cluster.create("u")
    offset = cluster.image.offset
    response = cluster.call("alter_configs", {"resources": [resource, {
        "type": "topic", "name": "u", "ops": [{"name": "retention.ms", "op": "set",
                                               "value": 5}]}]})
    assert errors_of(response["resources"]) == [code, None]
    assert cluster.image.offset == offset + 1 and cluster.image.topic_configs("t") == {}


def test_alter_configs_validate_only_and_duplicate_resources():
    cluster = Cluster()
    cluster.start(1)
    cluster.create("t")
    op = {"type": "topic", "name": "t", "ops": [{"name": "retention.ms", "op": "set",
                                                 "value": 5}]}
    result = cluster.controller.alter_configs(cluster.image, {"resources": [op],
                                                              "validate_only": True})
    assert result.records == [] and errors_of(result.response["resources"]) == [None]
    response = cluster.call("alter_configs", {"resources": [op, op]})
    assert errors_of(response["resources"]) == ["INVALID_REQUEST", "INVALID_REQUEST"]


# -- alter partition ------------------------------------------------------------
def alter_partition_cluster() -> Cluster:
    """t-0 on [1, 2, 3] led by 1 at leader epoch 2, partition epoch 4, ISR
    [1, 2]; broker 3 fenced."""
    cluster = Cluster(default_replication_factor=3)
    cluster.start(1, 2, 3)
    cluster.create("t", assignments={0: [1, 2, 3]})
    cluster.heartbeat(1, want_fence=True)  # 2 leads at epoch 1
    cluster.heartbeat(1)
    rejoin(cluster, "t", 0, 1)
    cluster.call("elect_leaders", {"partitions": [{"topic": "t", "partition": 0}]})
    cluster.call("alter_partition", isr_request(partition_epoch=3, new_isr=[1, 2]))
    cluster.heartbeat(3, want_fence=True)
    current = cluster.partition("t", 0)
    assert (current.leader, current.leader_epoch, current.partition_epoch, current.isr) == (
        1, 2, 4, [1, 2])
    return cluster


def rejoin(cluster: Cluster, topic: str, partition: int, broker_id: int) -> None:
    """The partition's leader adds ``broker_id`` back to the ISR."""
    current = cluster.partition(topic, partition)
    cluster.call("alter_partition", {
        "broker_id": current.leader,
        "broker_epoch": cluster.image.brokers[current.leader].broker_epoch,
        "topic": topic, "partition": partition, "leader_epoch": current.leader_epoch,
        "partition_epoch": current.partition_epoch, "new_isr": current.isr + [broker_id]})


def isr_request(**changes) -> dict:
    """A valid AlterPartition of ``alter_partition_cluster``'s t-0, changed."""
    request = {"broker_id": 1, "broker_epoch": 0, "topic": "t", "partition": 0,
               "leader_epoch": 2, "partition_epoch": 4, "new_isr": [1]}
    request.update(changes)
    return request


# The checks of AlterPartition in their order. Case i is sent with the faults
# of every later case too (an earlier case's value wins a shared field), so
# it shows that check i comes before all later ones.
ALTER_PARTITION_FAULTS = [
    ({"broker_id": 9}, BrokerIdNotRegisteredError),
    ({"broker_epoch": 5}, StaleBrokerEpochError),
    ({"topic": "x"}, UnknownTopicOrPartitionError),
    ({"partition": 1}, UnknownTopicOrPartitionError),
    ({"broker_id": 2, "broker_epoch": 1}, NotLeaderOrFollowerError),
    ({"leader_epoch": 1}, FencedLeaderEpochError),
    ({"leader_epoch": 3}, UnknownLeaderEpochError),
    ({"partition_epoch": 9}, InvalidUpdateVersionError),
    ({"new_isr": [2]}, InvalidRequestError),  # leaves out the leader
    ({"new_isr": [1, 1]}, InvalidRequestError),
    ({"new_isr": [1, 4]}, InvalidRequestError),  # 4 is not a replica
    ({"new_isr": [1, 2, 3]}, IneligibleReplicaError),  # 3 is fenced
]


@pytest.mark.parametrize("case", range(len(ALTER_PARTITION_FAULTS)))
def test_alter_partition_errors_in_order(case):
    cluster = alter_partition_cluster()
    request = isr_request()
    for changes, _ in reversed(ALTER_PARTITION_FAULTS[case:]):
        request.update(changes)
    offset = cluster.image.offset
    with pytest.raises(ALTER_PARTITION_FAULTS[case][1]):
        cluster.call("alter_partition", request)
    assert cluster.image.offset == offset


def test_alter_partition_shrinks_and_expands_the_isr():
    cluster = alter_partition_cluster()
    response = cluster.call("alter_partition", isr_request(new_isr=[1]))
    assert response == {"topic": "t", "partition": 0, "leader": 1, "leader_epoch": 2,
                        "partition_epoch": 5, "isr": [1], "leader_recovery_state": 0}
    cluster.heartbeat(3)  # unfenced again: may join
    response = cluster.call("alter_partition", isr_request(partition_epoch=5,
                                                           new_isr=[1, 3, 2]))
    assert response["isr"] == [1, 3, 2] and response["partition_epoch"] == 6
    assert cluster.partition("t", 0).isr == [1, 3, 2]


def test_alter_partitions_answers_each_item_and_writes_the_accepted_ones():
    """Many AlterPartitions in one request (a broker rejoining thousands of
    ISRs sends a batch): each item is checked as alone, refused on its own,
    and the accepted ones written; a stale broker epoch refuses them all."""
    cluster = alter_partition_cluster()
    cluster.create("u", assignments={0: [1, 2, 3]})
    u = cluster.partition("u", 0)
    item = {k: v for k, v in isr_request(new_isr=[1]).items()
            if k not in ("broker_id", "broker_epoch")}
    u_item = {"topic": "u", "partition": 0, "leader_epoch": u.leader_epoch,
              "partition_epoch": u.partition_epoch, "new_isr": [1, 2]}
    request = {"broker_id": 1, "broker_epoch": 0, "partitions": [
        {**item, "leader_epoch": 1},  # fenced
        u_item,
        {**item, "topic": "nope"},
        "not a map",
        item,
        item,  # the same partition twice
    ]}
    offset = cluster.image.offset
    response = cluster.call("alter_partitions", request)
    assert errors_of(response["partitions"]) == [
        "FENCED_LEADER_EPOCH", None, "UNKNOWN_TOPIC_OR_PARTITION", "INVALID_REQUEST", None,
        "INVALID_REQUEST"]
    assert response["partitions"][1]["isr"] == [1, 2]
    assert response["partitions"][4]["isr"] == [1]
    assert cluster.partition("t", 0).isr == [1] and cluster.partition("u", 0).isr == [1, 2]
    assert cluster.image.offset > offset
    with pytest.raises(StaleBrokerEpochError):
        cluster.call("alter_partitions", {**request, "broker_epoch": 5})


def test_alter_partition_with_the_same_isr_writes_nothing():
    cluster = alter_partition_cluster()
    result = cluster.controller.alter_partition(cluster.image, isr_request(new_isr=[1, 2]))
    assert result.records == [] and result.response["partition_epoch"] == 4


def test_a_member_already_in_the_isr_may_stay_even_if_fenced():
    cluster = alter_partition_cluster()
    cluster.heartbeat(2, want_shutdown=True)  # leaves the ISR itself
    assert cluster.partition("t", 0).isr == [1]
    with pytest.raises(IneligibleReplicaError):
        cluster.call("alter_partition", isr_request(partition_epoch=5, new_isr=[1, 2]))


def test_a_member_that_registered_again_since_the_leader_saw_it_cannot_join():  # KIP-903
    """The leader names the broker epoch each member fetched with; a broker
    that restarted (and may have lost its unflushed tail) since then is
    refused, whatever its liveness: it joins once it catches up again."""
    cluster = alter_partition_cluster()
    cluster.heartbeat(3)  # 3 unfenced: live, may join
    seen_epoch = cluster.image.brokers[3].broker_epoch
    with pytest.raises(InvalidRequestError, match="2 epochs for the 3 members"):
        cluster.call("alter_partition", isr_request(new_isr=[1, 2, 3],
                                                    new_isr_broker_epochs=[-1, 0]))
    with pytest.raises(InvalidRequestError, match="new_isr_broker_epochs"):
        cluster.call("alter_partition", isr_request(new_isr=[1, 2, 3],
                                                    new_isr_broker_epochs=[-1, 0, "x"]))
    cluster.now_ms += 10_000  # its old lease lapses (no tick: nobody is fenced)
    cluster.register(3, incarnation="inc-3-restarted")  # it restarted meanwhile
    cluster.heartbeat(3)
    assert not cluster.image.brokers[3].fenced
    assert cluster.image.brokers[3].broker_epoch != seen_epoch
    offset = cluster.image.offset
    with pytest.raises(IneligibleReplicaError, match="registered again since"):
        cluster.call("alter_partition", isr_request(
            new_isr=[1, 2, 3], new_isr_broker_epochs=[-1, -1, seen_epoch]))
    assert cluster.image.offset == offset and cluster.partition("t", 0).isr == [1, 2]
    # Only members being added are checked (2 stays on an old epoch), and -1
    # (a leader that names none) is not checked.
    response = cluster.call("alter_partition", isr_request(
        new_isr=[1, 2, 3], new_isr_broker_epochs=[-1, 12345,
                                                  cluster.image.brokers[3].broker_epoch]))
    assert response["isr"] == [1, 2, 3]
    response = cluster.call("alter_partition", isr_request(
        partition_epoch=response["partition_epoch"], new_isr=[1, 2]))
    response = cluster.call("alter_partition", isr_request(
        partition_epoch=response["partition_epoch"], new_isr=[1, 2, 3],
        new_isr_broker_epochs=[-1, -1, -1]))
    assert response["isr"] == [1, 2, 3]


# -- preferred leader election --------------------------------------------------
def two_brokers_with_moved_leaders(**settings) -> Cluster:
    """t-0 prefers 1 and t-1 prefers 2, but broker 2 leads both."""
    cluster = Cluster(default_replication_factor=2, **settings)
    cluster.start(1, 2)
    cluster.create("t", assignments={0: [1, 2], 1: [2, 1]})
    cluster.heartbeat(1, want_fence=True)
    cluster.heartbeat(1)
    rejoin(cluster, "t", 0, 1)
    assert (cluster.partition("t", 0).leader, cluster.partition("t", 0).isr) == (2, [2, 1])
    return cluster


def test_elect_leaders_on_request():
    cluster = two_brokers_with_moved_leaders()
    response = cluster.call("elect_leaders", {"partitions": [
        {"topic": "t", "partition": 0}, {"topic": "t", "partition": 1},
        {"topic": "t", "partition": 7}]})
    assert response["partitions"][:2] == [
        {"topic": "t", "partition": 0, "leader": 1, "error": None},
        {"topic": "t", "partition": 1, "leader": 2, "error": None}]
    assert response["partitions"][2]["error"]["code"] == "UNKNOWN_TOPIC_OR_PARTITION"
    p0 = cluster.partition("t", 0)
    assert (p0.leader, p0.leader_epoch) == (1, 2)


def test_elect_leaders_reports_an_unavailable_preferred_leader():
    cluster = two_brokers_with_moved_leaders()
    cluster.heartbeat(1, want_fence=True)
    response = cluster.call("elect_leaders", {"partitions": None})
    assert response == {"partitions": [{
        "topic": "t", "partition": 0, "leader": 2,
        "error": {"code": "PREFERRED_LEADER_NOT_AVAILABLE",
                  "message": response["partitions"][0]["error"]["message"]}}]}


def test_elect_leaders_for_all_lists_only_partitions_that_moved_or_failed():
    cluster = two_brokers_with_moved_leaders()
    response = cluster.call("elect_leaders", {})
    assert response == {"partitions": [{"topic": "t", "partition": 0, "leader": 1,
                                        "error": None}]}


def test_periodic_preferred_election_runs_only_after_the_interval():
    cluster = two_brokers_with_moved_leaders(auto_leader_rebalance_enable=True)
    cluster.now_ms = INTERVAL_MS - 1
    cluster.keep_alive(1, 2)
    assert cluster.tick() == []
    cluster.now_ms = INTERVAL_MS
    cluster.keep_alive(1, 2)
    assert cluster.tick() == [rec.PartitionChangeRecord("tid-0", 0, leader=1)]
    assert cluster.partition("t", 0).leader == 1
    cluster.heartbeat(1, want_fence=True)
    cluster.heartbeat(1)
    rejoin(cluster, "t", 0, 1)
    assert cluster.partition("t", 0).leader == 2
    cluster.now_ms = 2 * INTERVAL_MS - 1
    cluster.keep_alive(1, 2)
    assert cluster.tick() == []  # the timer restarted at the last check
    cluster.now_ms = 2 * INTERVAL_MS
    cluster.keep_alive(1, 2)
    assert len(cluster.tick()) == 1


def test_periodic_preferred_election_is_off_when_disabled():
    cluster = two_brokers_with_moved_leaders(auto_leader_rebalance_enable=False)
    cluster.now_ms = 10 * INTERVAL_MS
    cluster.keep_alive(1, 2)
    assert cluster.tick() == []


# -- partition reassignment ----------------------------------------------------
def reassign(cluster: Cluster, topic: str, partition: int, replicas) -> dict | None:
    """Start (or, with None, cancel) one reassignment; its error, or None."""
    response = cluster.call("alter_partition_reassignments", {"partitions": [
        {"topic": topic, "partition": partition, "replicas": replicas}]})
    assert [(e["topic"], e["partition"]) for e in response["partitions"]] == [(topic, partition)]
    return response["partitions"][0]["error"]


def state(cluster: Cluster, topic: str = "t", partition: int = 0) -> tuple:
    """(replicas, isr, leader, adding, removing) of a partition."""
    p = cluster.partition(topic, partition)
    return (p.replicas, p.isr, p.leader, p.adding_replicas, p.removing_replicas)


def in_progress(cluster: Cluster, topics=None) -> list[tuple]:
    answer = cluster.controller.list_partition_reassignments(cluster.image, {"topics": topics})
    return [(e["topic"], e["partition"], e["replicas"], e["adding_replicas"],
             e["removing_replicas"]) for e in answer["partitions"]]


def moving_cluster(*brokers: int, replicas=(1, 2), **settings) -> Cluster:
    """Brokers (1 to 4 by default) with t-0 on ``replicas``, all in sync."""
    cluster = Cluster(**settings)
    cluster.start(*(brokers or (1, 2, 3, 4)))
    cluster.create("t", assignments={0: list(replicas)})
    return cluster


def test_reassignment_adds_the_targets_then_drops_the_originals_once_in_sync():
    cluster = moving_cluster()
    before = cluster.partition("t", 0)
    assert reassign(cluster, "t", 0, [3, 4]) is None
    # Targets first; ISR and leader as they were; only the partition epoch moves.
    assert state(cluster) == ([3, 4, 1, 2], [1, 2], 1, [3, 4], [1, 2])
    after = cluster.partition("t", 0)
    assert (after.leader_epoch, after.partition_epoch) == (
        before.leader_epoch, before.partition_epoch + 1)
    assert in_progress(cluster) == [("t", 0, [3, 4, 1, 2], [3, 4], [1, 2])]
    rejoin(cluster, "t", 0, 3)
    assert state(cluster) == ([3, 4, 1, 2], [1, 2, 3], 1, [3, 4], [1, 2])
    offset = cluster.image.offset
    rejoin(cluster, "t", 0, 4)  # the last target catches up: done in the same batch
    assert cluster.image.offset == offset + 2
    # The leader was not a target: the first in-sync target takes over.
    assert state(cluster) == ([3, 4], [3, 4], 3, [], [])
    assert cluster.partition("t", 0).leader_epoch == before.leader_epoch + 1
    assert in_progress(cluster) == []


def test_the_alter_partition_answer_shows_the_completed_reassignment():
    cluster = moving_cluster()
    reassign(cluster, "t", 0, [3])
    current = cluster.partition("t", 0)
    response = cluster.call("alter_partition", {
        "broker_id": 1, "broker_epoch": 0, "topic": "t", "partition": 0,
        "leader_epoch": current.leader_epoch, "partition_epoch": current.partition_epoch,
        "new_isr": [1, 2, 3]})
    assert (response["leader"], response["isr"]) == (3, [3])
    assert response["partition_epoch"] == cluster.partition("t", 0).partition_epoch


def test_a_reassignment_that_keeps_the_leader_keeps_its_epoch():
    cluster = moving_cluster()
    reassign(cluster, "t", 0, [1, 3])
    assert state(cluster) == ([1, 3, 2], [1, 2], 1, [3], [2])
    rejoin(cluster, "t", 0, 3)
    assert state(cluster) == ([1, 3], [1, 3], 1, [], [])
    assert cluster.partition("t", 0).leader_epoch == 0


@pytest.mark.parametrize("target, expected", [
    ([3, 1, 2], ([3, 1, 2], [1, 2, 3], 1)),  # a reorder: only the preferred leader changes
    ([2, 3], ([2, 3], [2, 3], 2)),  # a shrink without the leader: 2 takes over
    ([1], ([1], [1], 1)),
])
def test_a_target_already_in_sync_is_done_in_one_record(target, expected):
    cluster = moving_cluster(replicas=(1, 2, 3))
    result = cluster.controller.alter_partition_reassignments(cluster.image, {"partitions": [
        {"topic": "t", "partition": 0, "replicas": target}]})
    assert len(result.records) == 1
    commit(cluster.image, result.records)
    assert state(cluster) == (*expected, [], [])
    assert in_progress(cluster) == []


def test_the_same_replicas_again_write_nothing():
    cluster = moving_cluster()
    result = cluster.controller.alter_partition_reassignments(cluster.image, {"partitions": [
        {"topic": "t", "partition": 0, "replicas": [1, 2]}]})
    assert result.records == [] and errors_of(result.response["partitions"]) == [None]


def test_cancel_goes_back_to_the_original_replicas_and_an_original_leader():
    cluster = moving_cluster()
    reassign(cluster, "t", 0, [3, 4])
    rejoin(cluster, "t", 0, 3)
    cluster.call("elect_leaders", {"partitions": [{"topic": "t", "partition": 0}]})
    assert state(cluster) == ([3, 4, 1, 2], [1, 2, 3], 3, [3, 4], [1, 2])
    assert reassign(cluster, "t", 0, None) is None
    # The added replica leaves the ISR and gives the leadership back.
    assert state(cluster) == ([1, 2], [1, 2], 1, [], [])
    assert in_progress(cluster) == []


def test_a_new_target_replaces_the_reassignment_under_way():
    cluster = moving_cluster(1, 2, 3, 4, 5)
    reassign(cluster, "t", 0, [3, 4])
    rejoin(cluster, "t", 0, 3)
    assert reassign(cluster, "t", 0, [3, 5]) is None
    # Still measured against the original [1, 2]; 4 is no replica any more,
    # and 3 stays in sync.
    assert state(cluster) == ([3, 5, 1, 2], [1, 2, 3], 1, [3, 5], [1, 2])
    rejoin(cluster, "t", 0, 5)
    assert state(cluster) == ([3, 5], [3, 5], 3, [], [])


def test_changes_that_would_leave_no_in_sync_replica_are_refused():
    cluster = moving_cluster(replicas=(1,))
    reassign(cluster, "t", 0, [2, 3])
    rejoin(cluster, "t", 0, 2)
    cluster.heartbeat(1, want_fence=True)  # the only original leaves the ISR
    assert state(cluster) == ([2, 3, 1], [2], 2, [2, 3], [1])
    offset = cluster.image.offset
    for target in (None, [1, 4]):
        error = reassign(cluster, "t", 0, target)
        assert error["code"] == "INVALID_REQUEST" and "out of sync" in error["message"]
    assert cluster.image.offset == offset
    assert reassign(cluster, "t", 0, [2, 4]) is None  # keeps the in-sync 2
    assert state(cluster) == ([2, 4, 1], [2], 2, [2, 4], [1])


def test_reassignment_errors_are_per_partition():
    cluster = moving_cluster()
    cluster.create("u", assignments={p: [1] for p in range(6)})
    items = [
        {"topic": "nope", "partition": 0, "replicas": [1]},
        {"topic": "u", "partition": 9, "replicas": [1]},
        {"topic": "u", "partition": 0, "replicas": []},
        {"topic": "u", "partition": 1, "replicas": [2, 2]},
        {"topic": "u", "partition": 2, "replicas": [1, 9]},
        {"topic": "u", "partition": 3},  # cancel, but nothing is under way
        {"topic": "u", "partition": 4, "replicas": [3]},  # twice in the request
        {"topic": "u", "partition": 4, "replicas": [4]},
        {"topic": "u", "partition": 5, "replicas": [3, 4]},  # valid: applied
    ]
    response = cluster.call("alter_partition_reassignments", {"partitions": items})
    assert errors_of(response["partitions"]) == [
        "UNKNOWN_TOPIC_OR_PARTITION", "UNKNOWN_TOPIC_OR_PARTITION", "INVALID_REQUEST",
        "INVALID_REQUEST", "INVALID_REQUEST", "NO_REASSIGNMENT_IN_PROGRESS",
        "INVALID_REQUEST", "INVALID_REQUEST", None]
    assert "unregistered brokers [9]" in response["partitions"][4]["error"]["message"]
    assert in_progress(cluster) == [("u", 5, [3, 4, 1], [3, 4], [1])]


def test_a_fenced_broker_may_be_a_target_and_joins_once_back():
    cluster = moving_cluster()
    cluster.heartbeat(3, want_fence=True)
    assert reassign(cluster, "t", 0, [3]) is None
    with pytest.raises(IneligibleReplicaError):
        rejoin(cluster, "t", 0, 3)
    cluster.heartbeat(3)
    rejoin(cluster, "t", 0, 3)
    assert state(cluster) == ([3], [3], 3, [], [])


def test_an_unclean_election_can_complete_a_reassignment(caplog):
    cluster = moving_cluster(replicas=(1,), unclean_leader_election_enable=True)
    reassign(cluster, "t", 0, [2])
    with caplog.at_level(logging.WARNING, logger="kraft.controller"):
        cluster.heartbeat(1, want_fence=True)
    # 2 never caught up, but unclean election is allowed: it leads alone,
    # which leaves the target wholly in sync.
    assert state(cluster) == ([2], [2], 2, [], [])
    assert cluster.partition("t", 0).leader_recovery_state == rec.LEADER_RECOVERING
    assert "UNCLEAN leader election for t-0: broker 2 (not in the ISR [1])" in caplog.text


def test_list_reassignments_by_topic():
    cluster = moving_cluster()
    cluster.create("other", assignments={0: [1], 1: [2]})
    reassign(cluster, "other", 1, [3])
    assert in_progress(cluster) == [("other", 1, [3, 2], [3], [2])]
    assert in_progress(cluster, ["other", "nope"]) == [("other", 1, [3, 2], [3], [2])]
    assert in_progress(cluster, ["t"]) == []


def test_new_partitions_take_the_target_replication_factor():
    cluster = moving_cluster()
    reassign(cluster, "t", 0, [3, 4, 1])  # three replicas, five while moving
    cluster.call("create_partitions", {"topics": [{"name": "t", "count": 2}]})
    assert len(cluster.partition("t", 1).replicas) == 3


def test_preferred_election_never_picks_a_replica_being_removed():
    cluster = moving_cluster(auto_leader_rebalance_enable=True)
    # A hand-made state the controller never writes (its targets come
    # first): the first replica is one being removed.
    commit(cluster.image, [rec.PartitionChangeRecord(
        "tid-0", 0, replicas=[2, 3, 1], adding_replicas=[3], removing_replicas=[2])])
    assert cluster.partition("t", 0).leader == 1
    response = cluster.call("elect_leaders", {"partitions": None})
    assert errors_of(response["partitions"]) == ["PREFERRED_LEADER_NOT_AVAILABLE"]
    cluster.now_ms = INTERVAL_MS
    cluster.keep_alive(1, 2, 3, 4)
    assert cluster.tick() == []
    assert cluster.partition("t", 0).leader == 1


# -- leader recovery after an unclean election -----------------------------------
def unclean_cluster() -> Cluster:
    """t-0 on [1, 2] whose ISR shrank to [1]; then 1 was fenced and 2 was
    elected uncleanly (unclean election enabled for the cluster)."""
    cluster = Cluster(unclean_leader_election_enable=True)
    cluster.start(1, 2)
    cluster.create("t", assignments={0: [1, 2]})
    cluster.call("alter_partition", {"broker_id": 1, "broker_epoch": 0, "topic": "t",
                                     "partition": 0, "leader_epoch": 0, "partition_epoch": 0,
                                     "new_isr": [1]})
    cluster.heartbeat(1, want_fence=True)
    return cluster


def leader_request(cluster: Cluster, partition: int = 0, **changes) -> dict:
    """An AlterPartition of t-``partition`` from its current leader (same
    ISR-of-one unless changed)."""
    current = cluster.partition("t", partition)
    request = {"broker_id": current.leader,
               "broker_epoch": cluster.image.brokers[current.leader].broker_epoch,
               "topic": "t", "partition": partition, "leader_epoch": current.leader_epoch,
               "partition_epoch": current.partition_epoch, "new_isr": [current.leader]}
    request.update(changes)
    return request


def test_an_unclean_election_marks_the_partition_recovering_and_says_so(caplog):
    cluster = Cluster(unclean_leader_election_enable=True)
    cluster.start(1, 2)
    cluster.create("t", assignments={0: [1, 2]})
    cluster.call("alter_partition", {"broker_id": 1, "broker_epoch": 0, "topic": "t",
                                     "partition": 0, "leader_epoch": 0, "partition_epoch": 0,
                                     "new_isr": [1]})
    with caplog.at_level(logging.WARNING, logger="kraft.controller"):
        result = cluster.controller.heartbeat(cluster.image, {
            "broker_id": 1, "broker_epoch": 0, "metadata_offset": cluster.image.offset,
            "want_fence": True}, 0)
    assert result.records[1] == rec.PartitionChangeRecord(
        "tid-0", 0, leader=2, isr=[2], leader_recovery_state=rec.LEADER_RECOVERING)
    [warning] = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert warning.getMessage() == (
        "UNCLEAN leader election for t-0: broker 2 (not in the ISR [1]) leads epoch 1; "
        "records acknowledged by the old ISR may be lost")


def test_offline_partitions_elected_uncleanly_are_recovering_too():
    cluster = Cluster()
    cluster.start(1, 2)
    cluster.create("t", assignments={0: [1, 2]})
    cluster.call("alter_partition", {"broker_id": 1, "broker_epoch": 0, "topic": "t",
                                     "partition": 0, "leader_epoch": 0, "partition_epoch": 0,
                                     "new_isr": [1]})
    cluster.heartbeat(1, want_fence=True)
    assert cluster.partition("t", 0).leader == NO_LEADER
    cluster.set_config("t", "unclean.leader.election.enable", True)
    p = cluster.partition("t", 0)
    assert (p.leader, p.isr, p.leader_recovery_state) == (2, [2], rec.LEADER_RECOVERING)


def test_validate_only_config_changes_elect_no_one():
    cluster = Cluster()
    cluster.start(1, 2)
    cluster.create("t", assignments={0: [1, 2]})
    cluster.call("alter_partition", {"broker_id": 1, "broker_epoch": 0, "topic": "t",
                                     "partition": 0, "leader_epoch": 0, "partition_epoch": 0,
                                     "new_isr": [1]})
    cluster.heartbeat(1, want_fence=True)
    response = cluster.call("alter_configs", {"validate_only": True, "resources": [{
        "type": "topic", "name": "t",
        "ops": [{"name": "unclean.leader.election.enable", "op": "set", "value": True}]}]})
    assert errors_of(response["resources"]) == [None]
    assert cluster.partition("t", 0).leader == NO_LEADER


def test_a_recovering_leader_keeps_the_isr_to_itself_until_it_says_recovered():
    cluster = unclean_cluster()
    cluster.heartbeat(1)  # back, and caught up: but the ISR may not grow yet
    with pytest.raises(InvalidRequestError, match="RECOVERING"):
        cluster.call("alter_partition", leader_request(cluster, new_isr=[2, 1]))
    with pytest.raises(InvalidRequestError, match="RECOVERING"):
        cluster.call("alter_partition", leader_request(cluster, new_isr=[2, 1],
                                                       leader_recovery_state=1))
    response = cluster.call("alter_partition", leader_request(cluster,
                                                              leader_recovery_state=0))
    assert response["leader_recovery_state"] == 0 and response["isr"] == [2]
    assert cluster.partition("t", 0).leader_recovery_state == rec.LEADER_RECOVERED
    response = cluster.call("alter_partition", leader_request(cluster, new_isr=[2, 1]))
    assert response["isr"] == [2, 1]


def test_recovered_and_a_larger_isr_may_come_in_one_request():
    cluster = unclean_cluster()
    cluster.heartbeat(1)
    response = cluster.call("alter_partition", leader_request(cluster, new_isr=[2, 1],
                                                              leader_recovery_state=0))
    assert (response["isr"], response["leader_recovery_state"]) == ([2, 1], 0)


def test_only_an_unclean_election_starts_recovery():
    cluster = Cluster()
    cluster.start(1)
    cluster.create("t", assignments={0: [1]})
    offset = cluster.image.offset
    with pytest.raises(InvalidRequestError, match="cannot go back to RECOVERING"):
        cluster.call("alter_partition", leader_request(cluster, leader_recovery_state=1))
    assert cluster.image.offset == offset
    response = cluster.call("alter_partition", leader_request(cluster))
    assert response["leader_recovery_state"] == 0


def test_a_clean_election_ends_recovery():
    cluster = unclean_cluster()
    cluster.heartbeat(2, want_fence=True)  # the unclean leader goes too
    p = cluster.partition("t", 0)
    assert (p.leader, p.isr, p.elr, p.leader_recovery_state) == (NO_LEADER, [], [2], 1)
    cluster.heartbeat(2)  # back: the only eligible replica, elected cleanly
    p = cluster.partition("t", 0)
    assert (p.leader, p.isr, p.leader_recovery_state) == (2, [2], 0)


# -- eligible leader replicas (KIP-966) ------------------------------------------
def eligible(cluster: Cluster, topic: str = "t", partition: int = 0) -> tuple:
    p = cluster.partition(topic, partition)
    return p.leader, p.isr, p.elr, p.last_known_leader


def last_replica_standing(**settings) -> Cluster:
    """KIP-966's example: RF 3, min.insync.replicas 2; brokers 3 then 2 leave
    the ISR, then its last member, broker 1, is fenced too."""
    cluster = Cluster(**settings)
    cluster.start(1, 2, 3)
    cluster.create("t", assignments={0: [1, 2, 3]}, configs={"min.insync.replicas": "2"})
    cluster.heartbeat(3, want_fence=True)
    assert eligible(cluster) == (1, [1, 2], [], NO_LEADER)  # still at min.insync.replicas
    cluster.heartbeat(2, want_fence=True)
    assert eligible(cluster) == (1, [1], [2], NO_LEADER)  # below: 2 holds all committed
    cluster.heartbeat(1, want_fence=True)
    assert eligible(cluster) == (NO_LEADER, [], [1, 2], 1)
    cluster.now_ms = SESSION_MS  # the fenced ones' leases lapse: they may register again
    return cluster


def test_after_an_unclean_shutdown_the_last_isr_member_waits_for_a_clean_replica():
    """The "last replica standing" loss KIP-966 closes: broker 1, the last
    ISR member, restarts after an unclean shutdown (its unflushed tail may
    be gone). It is no longer eligible while broker 2, which left the ISR
    when the high watermark had stopped, is: the partition waits for 2."""
    cluster = last_replica_standing()
    cluster.register(1, "inc-1b", clean_shutdown=False)
    assert eligible(cluster) == (NO_LEADER, [], [2], 1)
    cluster.heartbeat(1)  # unfenced: still no leader
    assert eligible(cluster) == (NO_LEADER, [], [2], 1)
    cluster.heartbeat(3)  # never eligible: it left with the ISR at 2
    assert eligible(cluster)[0] == NO_LEADER
    cluster.heartbeat(2)
    assert eligible(cluster) == (2, [2], [], NO_LEADER)
    p = cluster.partition("t")
    assert p.leader_recovery_state == rec.LEADER_RECOVERED  # a clean election
    # Back to min.insync.replicas: the high watermark moves without the others.
    cluster.call("alter_partition", leader_request(cluster, new_isr=[2, 1]))
    assert eligible(cluster) == (2, [2, 1], [], NO_LEADER)


def test_after_a_clean_shutdown_the_last_isr_member_stays_eligible():
    cluster = last_replica_standing()
    cluster.register(1, "inc-1b", clean_shutdown=True)
    assert eligible(cluster) == (NO_LEADER, [], [1, 2], 1)
    cluster.heartbeat(1)
    assert eligible(cluster) == (1, [1], [2], NO_LEADER)


def test_an_unclean_shutdown_of_a_live_registration_fences_it_first():
    """A restart that registers before its old registration was fenced: it
    is fenced (leaving the ISR for the ELR) and then, unclean, leaves the
    ELR, in one batch."""
    cluster = Cluster()
    cluster.start(1, 2)
    cluster.create("t", assignments={0: [1, 2]}, configs={"min.insync.replicas": "2"})
    cluster.heartbeat(2, want_fence=True)
    assert eligible(cluster) == (1, [1], [2], NO_LEADER)
    cluster.now_ms = SESSION_MS  # broker 1's lease has lapsed, unfenced still
    cluster.register(1, "inc-1b")  # clean_shutdown defaults to false
    assert eligible(cluster) == (NO_LEADER, [], [2], 1)


def test_with_no_clean_replica_left_the_last_known_leader_leads_again(caplog):
    """Every eligible replica had an unclean shutdown: rather than staying
    offline for good, the last known leader leads once back (what it lost
    is lost), loudly: what Kafka does, and did before KIP-966."""
    cluster = Cluster()
    cluster.start(1, 2)
    cluster.create("t", assignments={0: [1, 2]})  # min.insync.replicas 1
    cluster.heartbeat(2, want_fence=True)
    assert eligible(cluster) == (1, [1], [], NO_LEADER)  # 2 left at min.insync.replicas
    cluster.heartbeat(1, want_fence=True)
    assert eligible(cluster) == (NO_LEADER, [], [1], 1)
    cluster.now_ms = SESSION_MS
    cluster.register(1, "inc-1b")
    assert eligible(cluster) == (NO_LEADER, [], [], 1)
    cluster.heartbeat(2)  # not eligible, and unclean election is off
    assert eligible(cluster)[0] == NO_LEADER
    with caplog.at_level(logging.WARNING, logger="kraft.controller"):
        cluster.heartbeat(1)
    assert eligible(cluster) == (1, [1], [], NO_LEADER)
    assert "broker 1, the last known leader" in caplog.text


def test_the_last_known_leader_is_the_last_isr_member_not_any_eligible_one():
    """Broker 2 lost its unflushed tail and left the ISR (fenced) before
    the controller knew; broker 1, the last leader, is fenced after it.
    Both come back after unclean shutdowns, 2 last: the last known leader,
    1, leads, as the last ISR member did before KIP-966 (the replication
    simulation found a version that took the last to register)."""
    cluster = Cluster()
    cluster.start(1, 2)
    cluster.create("t", assignments={0: [1, 2]}, configs={"min.insync.replicas": "2"})
    cluster.heartbeat(2, want_fence=True)
    cluster.heartbeat(1, want_fence=True)
    assert eligible(cluster) == (NO_LEADER, [], [1, 2], 1)
    cluster.now_ms = SESSION_MS
    cluster.register(1, "inc-1b")
    cluster.register(2, "inc-2b")
    assert eligible(cluster) == (NO_LEADER, [], [], 1)
    cluster.heartbeat(2)
    assert eligible(cluster)[0] == NO_LEADER
    cluster.heartbeat(1)
    assert eligible(cluster) == (1, [1], [], NO_LEADER)


def test_changing_min_insync_replicas_judges_the_eligible_replicas_again():
    """Lowered to 1 with the ISR still empty, the high watermark still stands,
    so the ELR stays (Kafka forgets it, which could elect a broker that lost
    its tail over one that kept everything); once an ISR reaches the new
    value it is forgotten."""
    cluster = last_replica_standing()
    cluster.register(1, "inc-1b")  # lost its tail
    cluster.set_config("t", "min.insync.replicas", "1")
    assert eligible(cluster) == (NO_LEADER, [], [2], 1)
    cluster.heartbeat(1)  # the last known leader, but 2 is eligible
    assert eligible(cluster)[0] == NO_LEADER
    cluster.heartbeat(2)
    assert eligible(cluster) == (2, [2], [], NO_LEADER)


def test_a_broker_with_a_lower_default_min_insync_replicas_lowers_the_controllers():
    """Each broker registers its own default min.insync.replicas; the ELR
    is kept by the smallest, so no leader moves its high watermark while
    the controller counts its ISR below the value (which would make an
    eligible replica miss committed records)."""
    cluster = Cluster(topic_config_defaults={"min.insync.replicas": "2"})
    for broker in (1, 2, 3):
        cluster.register(broker, min_insync_replicas=2 if broker != 3 else 1)
        cluster.heartbeat(broker)
    cluster.create("t", assignments={0: [1, 2, 3]})  # no override
    cluster.heartbeat(3, want_fence=True)
    cluster.heartbeat(2, want_fence=True)
    assert eligible(cluster) == (1, [1], [], NO_LEADER)  # 1 >= 1: none eligible


def test_a_replica_whose_log_dir_failed_leaves_the_isr_and_the_elr():
    cluster = Cluster()
    cluster.start(1, 2, 3)
    cluster.create("t", assignments={0: [1, 2, 3]}, configs={"min.insync.replicas": "3"})
    topic_id = cluster.image.topics["t"].topic_id
    cluster.heartbeat(3, want_fence=True)
    assert eligible(cluster) == (1, [1, 2], [3], NO_LEADER)
    cluster.heartbeat(3)
    cluster.heartbeat(2, offline_log_dirs=["/d2"], offline_replicas={topic_id: [0]})
    assert eligible(cluster) == (1, [1], [3], NO_LEADER)  # 2 has no log to offer
    cluster.heartbeat(3, offline_log_dirs=["/d3"], offline_replicas={topic_id: [0]})
    assert eligible(cluster) == (1, [1], [], NO_LEADER)


def test_an_unclean_election_passes_over_the_eligible_replicas_and_forgets_them(caplog):
    cluster = last_replica_standing()
    cluster.heartbeat(3)
    with caplog.at_level(logging.WARNING, logger="kraft.controller"):
        [result] = cluster.call("elect_leaders", {"election_type": "unclean"})["partitions"]
    assert (result["leader"], result["unclean"]) == (3, True)
    assert eligible(cluster) == (3, [3], [], NO_LEADER)
    assert cluster.partition("t").leader_recovery_state == rec.LEADER_RECOVERING
    assert "broker 3 (not in the ISR [1, 2])" in caplog.text


def test_without_eligible_leader_replicas_the_last_member_stays_in_the_isr():
    """eligible.leader.replicas.enable=false: Kafka's behaviour before
    KIP-966, kept for upgrades."""
    cluster = Cluster(eligible_leader_replicas=False)
    cluster.start(1, 2, 3)
    cluster.create("t", assignments={0: [1, 2, 3]}, configs={"min.insync.replicas": "2"})
    for broker in (3, 2, 1):
        cluster.heartbeat(broker, want_fence=True)
    assert eligible(cluster) == (NO_LEADER, [1], [], NO_LEADER)
    cluster.now_ms = SESSION_MS
    cluster.register(1, "inc-1b")
    cluster.heartbeat(1)
    assert eligible(cluster) == (1, [1], [], NO_LEADER)  # whatever it lost


def test_eligible_replicas_survive_a_snapshot_and_are_left_out_when_empty():
    cluster = last_replica_standing()
    cluster.register(1, "inc-1b")
    restored = MetadataImage.from_snapshot(cluster.image.to_snapshot())
    assert eligible(cluster) == (NO_LEADER, [], [2], 1)
    assert restored.partition("t", 0) == cluster.partition("t")
    plain = Cluster()
    plain.start(1)
    plain.create("t", assignments={0: [1]})
    raw = msgpack.unpackb(plain.image.to_snapshot(), strict_map_key=False)
    assert not {"elr", "last_known_leader"} & set(raw["topics"][0]["partitions"][0])


# -- property: reassignments, ISR changes and fencing keep the invariants --------
OPERATION = st.one_of(
    st.tuples(st.just("reassign"), st.integers(0, 1),
              st.one_of(st.none(), st.lists(st.integers(1, 4), min_size=1, max_size=4,
                                            unique=True))),
    st.tuples(st.just("isr"), st.integers(0, 1), st.sets(st.integers(1, 4)),
              st.sampled_from([None, 0, 1])),
    st.tuples(st.just("fence"), st.integers(1, 4)),
    st.tuples(st.just("unfence"), st.integers(1, 4)),
    st.tuples(st.just("elect")),
    st.tuples(st.just("unclean"), st.booleans()),
)


def _operate(cluster: Cluster, operation: tuple) -> None:
    kind = operation[0]
    if kind == "reassign":
        reassign(cluster, "t", operation[1], operation[2])
    elif kind == "isr":
        _, partition, members, recovery_state = operation
        current = cluster.partition("t", partition)
        if current.leader == NO_LEADER:
            return
        request = leader_request(cluster, partition, new_isr=[current.leader] + sorted(
            (members & set(current.replicas)) - {current.leader}))
        if recovery_state is not None:
            request["leader_recovery_state"] = recovery_state
        cluster.call("alter_partition", request)
    elif kind == "fence":
        cluster.heartbeat(operation[1], want_fence=True)
    elif kind == "unfence":
        cluster.heartbeat(operation[1])
    elif kind == "elect":
        cluster.call("elect_leaders", {})
    else:
        cluster.set_config("t", "unclean.leader.election.enable", operation[1])


def check_partition_invariants(cluster: Cluster) -> None:
    for topic in cluster.image.topics.values():
        for p in topic.partitions.values():
            assert set(p.adding_replicas) <= set(p.replicas)
            assert set(p.removing_replicas) <= set(p.replicas)
            assert set(p.isr) <= set(p.replicas)
            # An empty ISR leaves eligible leader replicas (KIP-966).
            assert p.isr or (p.elr and p.leader == NO_LEADER)
            assert p.leader == NO_LEADER or p.leader in p.isr
            if len(p.isr) >= 1:  # min.insync.replicas: none is eligible outside the ISR
                assert not p.elr
            # Only a leaderless partition remembers a leader, and one that emptied its ISR does.
            assert p.leader == NO_LEADER or p.last_known_leader == NO_LEADER
            assert p.isr or p.last_known_leader != NO_LEADER
            # The controller's own layout: targets first, then the leaving ones.
            assert p.replicas == p.target_replicas + p.removing_replicas
            # Completion is never left pending.
            assert not p.reassigning or not set(p.target_replicas) <= set(p.isr)
            if p.leader_recovery_state == rec.LEADER_RECOVERING:
                # The unclean leader alone, or, once it is gone too, eligible.
                assert (len(p.isr) == 1 and p.leader in (NO_LEADER, p.isr[0])
                        or (not p.isr and len(p.elr) == 1))


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(operations=st.lists(OPERATION, max_size=25))
def test_reassignments_isr_changes_and_fencing_keep_the_invariants(operations):
    cluster = Cluster(default_replication_factor=2)
    cluster.start(1, 2, 3, 4)
    cluster.create("t", assignments={0: [1, 2], 1: [3, 4]})
    for operation in operations:
        try:
            _operate(cluster, operation)
        except KraftError:
            pass  # a refusal; Cluster.call checked it changed nothing
        check_partition_invariants(cluster)


# -- malformed requests ---------------------------------------------------------
REGISTER = {"broker_id": 1, "incarnation_id": "i", "endpoints": {"B": "h:1"}}
HEARTBEAT = {"broker_id": 1, "broker_epoch": 0, "metadata_offset": 0}
ALTER_PARTITION = {"broker_id": 1, "broker_epoch": 0, "topic": "t", "partition": 0,
                   "leader_epoch": 0, "partition_epoch": 0, "new_isr": [1]}

MALFORMED = [
    ("register_broker", None, "request body"),
    ("register_broker", [], "request body"),
    ("register_broker", {**REGISTER, "broker_id": -1}, "broker_id"),
    ("register_broker", {**REGISTER, "broker_id": True}, "broker_id"),
    ("register_broker", {**REGISTER, "broker_id": 1.0}, "broker_id"),
    ("register_broker", {**REGISTER, "broker_id": "1"}, "broker_id"),
    ("register_broker", {**REGISTER, "broker_id": 2**31}, "broker_id"),
    ("register_broker", {**REGISTER, "broker_id": 10**5000}, "broker_id"),
    ("register_broker", {k: v for k, v in REGISTER.items() if k != "broker_id"}, "broker_id"),
    ("register_broker", {**REGISTER, "incarnation_id": ""}, "incarnation_id"),
    ("register_broker", {**REGISTER, "incarnation_id": "x" * 65}, "incarnation_id"),
    ("register_broker", {**REGISTER, "incarnation_id": 5}, "incarnation_id"),
    ("register_broker", {**REGISTER, "endpoints": {}}, "endpoints"),
    ("register_broker", {**REGISTER, "endpoints": ["h:1"]}, "endpoints"),
    ("register_broker", {**REGISTER, "endpoints": {"B": 9092}}, "endpoints"),
    ("register_broker", {**REGISTER, "endpoints": {1: "h:1"}}, "endpoints"),
    ("register_broker", {**REGISTER, "endpoints": {"B": "h"}}, "endpoints"),
    ("register_broker", {**REGISTER, "endpoints": {"B": "h:99999"}}, "endpoints"),
    ("register_broker", {**REGISTER, "endpoints": {"B": ":1"}}, "endpoints"),
    ("register_broker", {**REGISTER, "rack": 3}, "rack"),
    ("heartbeat", {**HEARTBEAT, "broker_epoch": -1}, "broker_epoch"),
    ("heartbeat", {**HEARTBEAT, "metadata_offset": -2}, "metadata_offset"),
    ("heartbeat", {**HEARTBEAT, "metadata_offset": None}, "metadata_offset"),
    ("heartbeat", {**HEARTBEAT, "want_fence": 1}, "want_fence"),
    ("heartbeat", {**HEARTBEAT, "want_shutdown": "yes"}, "want_shutdown"),
    ("create_topics", {}, "topics"),
    ("create_topics", {"topics": {"name": "t"}}, "topics"),
    ("create_topics", {"topics": [{"name": "t"}] * 1001}, "topics"),
    ("create_topics", {"topics": ["t"]}, "topics[0]"),
    ("create_topics", {"topics": [{"name": 5}]}, "topics[0].name"),
    ("create_topics", {"topics": [{"name": "t", "num_partitions": "3"}]}, "num_partitions"),
    ("create_topics", {"topics": [{"name": "t", "num_partitions": False}]}, "num_partitions"),
    ("create_topics", {"topics": [{"name": "t", "replication_factor": 1.5}]},
     "replication_factor"),
    ("create_topics", {"topics": [{"name": "t", "configs": []}]}, "configs"),
    ("create_topics", {"topics": [{"name": "t", "configs": {"retention.ms": None}}]},
     "configs"),
    ("create_topics", {"topics": [{"name": "t", "configs": {"retention.ms": [1]}}]},
     "configs"),
    ("create_topics", {"topics": [{"name": "t", "configs": {5: "1"}}]}, "configs"),
    ("create_topics", {"topics": [{"name": "t", "assignments": [[1]]}]}, "assignments"),
    ("create_topics", {"topics": [{"name": "t", "assignments": {"x": [1]}}]}, "assignments"),
    ("create_topics", {"topics": [{"name": "t", "assignments": {-1: [1]}}]}, "assignments"),
    ("create_topics", {"topics": [{"name": "t", "assignments": {0: 1}}]}, "assignments"),
    ("create_topics", {"topics": [{"name": "t", "assignments": {0: [-1]}}]}, "assignments"),
    ("create_topics", {"topics": [{"name": "t", "assignments": {0: ["1"]}}]}, "assignments"),
    ("create_topics", {"topics": [], "validate_only": "true"}, "validate_only"),
    ("delete_topics", {"topics": "t"}, "topics"),
    ("delete_topics", {"topics": [None]}, "topics[0]"),
    ("delete_topics", {"topics": [""]}, "topics[0]"),
    ("create_partitions", {"topics": [{"name": "t"}]}, "count"),
    ("create_partitions", {"topics": [{"name": "t", "count": -1}]}, "count"),
    ("create_partitions", {"topics": [{"name": "t", "count": 2, "assignments": {}}]},
     "assignments"),
    ("create_partitions", {"topics": [{"name": "t", "count": 2, "assignments": [1]}]},
     "assignments[0]"),
    ("describe_configs", {"resources": [{"type": "topic"}]}, "name"),
    ("describe_configs", {"resources": [{"type": 1, "name": "t"}]}, "type"),
    ("describe_configs", {"resources": [{"type": "topic", "name": "t", "keys": "a"}]}, "keys"),
    ("describe_configs", {"resources": [{"type": "topic", "name": "t", "keys": [1]}]}, "keys"),
    ("alter_configs", {"resources": [{"type": "topic", "name": "t"}]}, "ops"),
    ("alter_configs", {"resources": [{"type": "topic", "name": "t", "ops": [
        {"name": "retention.ms", "op": "append", "value": "1"}]}]}, "op"),
    ("alter_configs", {"resources": [{"type": "topic", "name": "t", "ops": [
        {"name": "retention.ms", "op": "set"}]}]}, "value"),
    ("alter_configs", {"resources": [{"type": "topic", "name": "t", "ops": [
        {"name": "retention.ms", "op": "set", "value": {"a": 1}}]}]}, "value"),
    ("alter_configs", {"resources": [{"type": "topic", "name": "t", "ops": ["x"]}]}, "ops[0]"),
    ("alter_partition", {**ALTER_PARTITION, "new_isr": None}, "new_isr"),
    ("alter_partition", {**ALTER_PARTITION, "new_isr": [1, "2"]}, "new_isr[1]"),
    ("alter_partition", {**ALTER_PARTITION, "new_isr": [1] * 1001}, "new_isr"),
    ("alter_partition", {**ALTER_PARTITION, "partition": -1}, "partition"),
    ("alter_partition", {**ALTER_PARTITION, "leader_epoch": "0"}, "leader_epoch"),
    ("alter_partition", {**ALTER_PARTITION, "topic": ["t"]}, "topic"),
    ("elect_leaders", {"partitions": "all"}, "partitions"),
    ("elect_leaders", {"partitions": [{"topic": "t"}]}, "partition"),
    ("elect_leaders", {"partitions": [["t", 0]]}, "partitions[0]"),
    ("alter_partition", {**ALTER_PARTITION, "leader_recovery_state": 2},
     "leader_recovery_state"),
    ("alter_partition", {**ALTER_PARTITION, "leader_recovery_state": True},
     "leader_recovery_state"),
    ("alter_partition_reassignments", {}, "partitions"),
    ("alter_partition_reassignments", {"partitions": [{"topic": "t"}]}, "partition"),
    ("alter_partition_reassignments", {"partitions": [
        {"topic": "t", "partition": 0, "replicas": "1,2"}]}, "partitions[0].replicas"),
    ("alter_partition_reassignments", {"partitions": [
        {"topic": "t", "partition": 0, "replicas": [1, -2]}]}, "partitions[0].replicas[1]"),
    ("alter_partition_reassignments", {"partitions": [
        {"topic": "t", "partition": 0, "replicas": [1] * 1001}]}, "partitions[0].replicas"),
    ("alter_partition_reassignments", {"partitions": [{"topic": "t", "partition": 0}] * 10_001},
     "partitions"),
    ("list_partition_reassignments", {"topics": "t"}, "topics"),
    ("list_partition_reassignments", {"topics": [5]}, "topics[0]"),
]


@pytest.mark.parametrize("method, request_body, field", MALFORMED)
def test_malformed_requests_name_the_field(method, request_body, field):
    cluster = Cluster()
    cluster.start(1)
    cluster.create("t")
    args = [cluster.image, request_body]
    if method in ("register_broker", "heartbeat"):
        args.append(0)
    with pytest.raises(InvalidRequestError) as raised:
        getattr(cluster.controller, method)(*args)
    assert field in str(raised.value)


JSON_LIKE = st.recursive(
    st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats(allow_nan=False)
    | st.text(max_size=8) | st.sampled_from(["t", "topic", "set", "delete", "h:1", "-1", "0"]),
    lambda children: st.lists(children, max_size=4)
    | st.dictionaries(st.sampled_from([
        "broker_id", "broker_epoch", "metadata_offset", "incarnation_id", "endpoints", "rack",
        "want_fence", "want_shutdown", "topics", "name", "num_partitions",
        "replication_factor", "configs", "assignments", "validate_only", "count",
        "resources", "type", "keys", "ops", "op", "value", "topic", "partition",
        "leader_epoch", "partition_epoch", "new_isr", "partitions", "retention.ms", "0",
        "replicas", "leader_recovery_state"])
        | st.integers(0, 3), children, max_size=6),
    max_leaves=20)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(method=st.sampled_from(["register_broker", "heartbeat", "create_topics",
                               "delete_topics", "create_partitions", "describe_configs",
                               "alter_configs", "alter_partition", "elect_leaders",
                               "alter_partition_reassignments",
                               "list_partition_reassignments"]),
       request_body=JSON_LIKE)
def test_any_request_gets_a_response_or_a_kraft_error(method, request_body):
    cluster = FUZZ_CLUSTER
    before = cluster.image.to_snapshot()
    args = [cluster.image, request_body]
    if method in ("register_broker", "heartbeat"):
        args.append(0)
    try:
        result = getattr(cluster.controller, method)(*args)
    except KraftError:
        pass
    else:
        if isinstance(result, ControllerResult):
            commit(MetadataImage.from_snapshot(before), result.records)
    assert cluster.image.to_snapshot() == before


VALID_REQUESTS = [
    ("register_broker", {"broker_id": 5, "incarnation_id": "i", "rack": "r",
                         "endpoints": {"B": "h:1", "C": "h:2"}}),
    ("heartbeat", {"broker_id": 1, "broker_epoch": 1, "metadata_offset": 3,
                   "want_fence": False, "want_shutdown": False}),
    ("create_topics", {"validate_only": False, "topics": [
        {"name": "new", "num_partitions": 2, "replication_factor": 2,
         "configs": {"retention.ms": "1", "unclean.leader.election.enable": True}},
        {"name": "manual", "assignments": {"0": [1, 2], "1": [2, 0]}}]}),
    ("delete_topics", {"topics": ["t", "topic"]}),
    ("create_partitions", {"validate_only": False, "topics": [
        {"name": "t", "count": 3}, {"name": "topic", "count": 2, "assignments": [[2, 0]]}]}),
    ("describe_configs", {"resources": [{"type": "topic", "name": "t",
                                         "keys": ["retention.ms"]}]}),
    ("alter_configs", {"validate_only": False, "resources": [{"type": "topic", "name": "t", "ops": [
        {"name": "retention.ms", "op": "set", "value": 5},
        {"name": "segment.ms", "op": "delete"}]}]}),
    ("alter_partition", {"broker_id": 1, "broker_epoch": 1, "topic": "topic", "partition": 0,
                         "leader_epoch": 0, "partition_epoch": 0, "new_isr": [1]}),
    ("elect_leaders", {"partitions": [{"topic": "t", "partition": 1}]}),
    ("alter_partition", {"broker_id": 1, "broker_epoch": 1, "topic": "topic", "partition": 0,
                         "leader_epoch": 0, "partition_epoch": 0, "new_isr": [1],
                         "leader_recovery_state": 0}),
    ("alter_partition_reassignments", {"partitions": [
        {"topic": "t", "partition": 0, "replicas": [2, 0]},
        {"topic": "topic", "partition": 0, "replicas": [0]}]}),
    ("list_partition_reassignments", {"topics": ["t", "topic"]}),
]


def _leaf_paths(value, path=()):
    """Every position in a request: map values, map keys and list items."""
    yield path
    if isinstance(value, dict):
        for key, item in value.items():
            yield path + (("key", key),)
            yield from _leaf_paths(item, path + (key,))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from _leaf_paths(item, path + (i,))


def _replaced(value, path, new):
    """A copy of ``value`` with the position ``path`` replaced by ``new``
    (at a map key position, the key is renamed to ``new`` if it can be one)."""
    if not path:
        return new
    step, rest = path[0], path[1:]
    if isinstance(step, tuple):  # ("key", key): rename it
        if not isinstance(new, (str, int, float, type(None))):
            return value
        return {(new if k == step[1] else k): v for k, v in value.items()}
    copy = list(value) if isinstance(value, list) else dict(value)
    copy[step] = _replaced(value[step], rest, new)
    return copy


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_valid_requests_with_one_field_spoiled_get_a_response_or_a_kraft_error(data):
    method, valid = data.draw(st.sampled_from(VALID_REQUESTS))
    path = data.draw(st.sampled_from(list(_leaf_paths(valid))))
    request_body = _replaced(valid, path, data.draw(JSON_LIKE))
    cluster = FUZZ_CLUSTER
    before = cluster.image.to_snapshot()
    args = [cluster.image, request_body] + ([0] if method in ("register_broker",
                                                               "heartbeat") else [])
    try:
        result = getattr(cluster.controller, method)(*args)
    except KraftError:
        return
    finally:
        assert cluster.image.to_snapshot() == before
    if isinstance(result, ControllerResult):
        commit(MetadataImage.from_snapshot(before), result.records)


def test_the_valid_fuzz_requests_are_valid():
    for method, request_body in VALID_REQUESTS:
        cluster = _fuzz_cluster()
        args = [cluster.image, request_body] + ([0] if method in ("register_broker",
                                                                   "heartbeat") else [])
        result = getattr(cluster.controller, method)(*args)
        response = result if isinstance(result, dict) else result.response
        assert "'error': {" not in repr(response), (method, response)


def _fuzz_cluster() -> Cluster:
    cluster = Cluster(default_replication_factor=2)
    cluster.start(0, 1, 2)
    cluster.create("t", num_partitions=2)
    cluster.create("topic", assignments={0: [1, 2]})
    return cluster


FUZZ_CLUSTER = _fuzz_cluster()


# -- purity ---------------------------------------------------------------------
def test_a_long_scenario_never_changes_the_image_it_is_given():
    """Cluster.call and Cluster.tick check the image is unchanged by each
    call; this walks through every kind of change on one cluster."""
    cluster = Cluster(default_replication_factor=2, auto_leader_rebalance_enable=True)
    cluster.start(1, 2, 3)
    cluster.create("t", num_partitions=4, configs={"retention.ms": 5})
    leader = cluster.partition("t").leader
    cluster.call("alter_partition", {"broker_id": leader,
                                     "broker_epoch": cluster.image.brokers[leader].broker_epoch,
                                     "topic": "t", "partition": 0, "leader_epoch": 0,
                                     "partition_epoch": 0, "new_isr": [leader]})
    cluster.heartbeat(1, want_fence=True)
    cluster.heartbeat(2, want_shutdown=True)
    cluster.set_config("t", "unclean.leader.election.enable", True)
    cluster.heartbeat(1)
    cluster.call("create_partitions", {"topics": [{"name": "t", "count": 6}]})
    with pytest.raises(DuplicateBrokerRegistrationError):
        cluster.register(1, incarnation="inc-1b")
    cluster.now_ms = INTERVAL_MS
    cluster.keep_alive(1)
    assert cluster.tick()  # fences 3, rebalances
    cluster.register(2, incarnation="inc-2b")
    cluster.heartbeat(2)
    cluster.call("elect_leaders", {"partitions": None})
    cluster.call("alter_partition_reassignments", {"partitions": [
        {"topic": "t", "partition": 1, "replicas": [3, 1]},
        {"topic": "t", "partition": 2, "replicas": [2]}]})
    cluster.call("alter_partition_reassignments", {"partitions": [
        {"topic": "t", "partition": 1, "replicas": None}]})
    cluster.call("delete_topics", {"topics": ["t"]})
    assert cluster.image.topics == {}


# -- producer ids (AllocateProducerIds) ----------------------------------------------
def test_producer_id_blocks_never_overlap_and_survive_in_the_image():
    cluster = Cluster()
    cluster.start(1, 2)
    blocks = []
    for broker_id in (1, 2, 1):
        epoch = cluster.image.brokers[broker_id].broker_epoch
        answer = cluster.call("allocate_producer_ids",
                              {"broker_id": broker_id, "broker_epoch": epoch})
        blocks.append((answer["producer_id_start"], answer["producer_id_len"]))
    assert blocks == [(0, 1000), (1000, 1000), (2000, 1000)]
    restored = MetadataImage.from_snapshot(cluster.image.to_snapshot())
    assert restored.next_producer_id == 3000


def test_producer_ids_go_only_to_a_registered_broker_of_the_current_epoch():
    cluster = Cluster()
    cluster.start(1)
    epoch = cluster.image.brokers[1].broker_epoch
    with pytest.raises(StaleBrokerEpochError):
        cluster.call("allocate_producer_ids", {"broker_id": 1, "broker_epoch": epoch + 7})
    with pytest.raises(BrokerIdNotRegisteredError):
        cluster.call("allocate_producer_ids", {"broker_id": 9, "broker_epoch": 0})
    with pytest.raises(InvalidRequestError):
        cluster.call("allocate_producer_ids", {"broker_id": "one", "broker_epoch": 0})
    assert cluster.image.next_producer_id == 0


# -- SCRAM users and client quotas ---------------------------------------------------------
def _upsert(name, password, mechanism="SCRAM-SHA-512", iterations=4096) -> dict:
    from protocol import scram
    salt = scram.new_salt()
    return {"name": name, "mechanism": mechanism, "iterations": iterations, "salt": salt,
            "salted_password": scram.salted_password(password, salt, iterations, mechanism)}


def test_a_user_has_one_password_whatever_the_mechanism():
    from protocol import scram
    cluster = Cluster()
    answer = cluster.call("alter_users", {"upsertions": [
        _upsert("etl", "old-password", "SCRAM-SHA-256")]})
    assert answer["results"] == [{"name": "etl", "error": None}]
    cluster.call("alter_users", {"upsertions": [_upsert("etl", "new-password")]})
    creds = cluster.image.scram_credentials("etl")
    assert list(creds) == ["SCRAM-SHA-512"]  # the old password went with its mechanism
    assert scram.verify("new-password", scram.decode(creds["SCRAM-SHA-512"]), "SCRAM-SHA-512")
    assert cluster.controller.describe_users(cluster.image, {}) == {
        "users": [{"name": "etl", "credentials": [
            {"mechanism": "SCRAM-SHA-512", "iterations": 4096}]}]}


def test_deleting_a_user_or_one_credential():
    cluster = Cluster()
    cluster.call("alter_users", {"upsertions": [_upsert("a", "password-a")]})
    # Two credentials, as a store from elsewhere might hold: one goes, then all.
    cluster.image.configs[("user-scram", "a")]["SCRAM-SHA-256"] = \
        cluster.image.configs[("user-scram", "a")]["SCRAM-SHA-512"]
    cluster.call("alter_users", {"deletions": [{"name": "a", "mechanism": "SCRAM-SHA-256"}]})
    assert list(cluster.image.scram_credentials("a")) == ["SCRAM-SHA-512"]
    cluster.call("alter_users", {"deletions": [{"name": "a"}]})
    assert cluster.image.scram_credentials("a") == {}
    answer = cluster.call("alter_users", {"deletions": [{"name": "a"}]})
    assert answer["results"][0]["error"]["code"] == "RESOURCE_NOT_FOUND"


@pytest.mark.parametrize("change, message", [
    ({"mechanism": ["SCRAM-SHA-512"]}, "mechanism must be a string"),
    ({"mechanism": "SCRAM-SHA-1"}, "unknown SCRAM mechanism"),
    ({"iterations": 100}, "iterations"),
    ({"salt": b"short"}, "salt must be"),
    ({"salted_password": b"x" * 32}, "64-byte"),
    ({"name": "CN=admin,O=x"}, "without ':', '=' or ','"),
    ({"name": "anonymous"}, "ANONYMOUS"),
])
def test_bad_users_are_refused_and_nothing_is_written(change, message):
    cluster = Cluster()
    before = cluster.image.offset
    answer = cluster.call("alter_users", {"upsertions": [{**_upsert("ok", "password"),
                                                          **change}]})
    error = answer["results"][0]["error"]
    assert error["code"] == "INVALID_REQUEST" and re.search(message, error["message"])
    assert cluster.image.offset == before


def test_a_stored_entity_can_always_be_removed():
    cluster = Cluster()
    cluster.image.configs[("client-quota", '{"user":"etl"}')] = {"producer_byte_rate": "10.0"}
    answer = cluster.call("alter_client_quotas", {"entries": [
        {"entity": {"user": "etl"}, "ops": [{"key": "producer_byte_rate", "value": None}]}]})
    assert answer["entries"][0]["error"] is None
    assert cluster.image.client_quotas() == {}
    answer = cluster.call("alter_client_quotas", {"entries": [
        {"entity": {"user": "etl"}, "ops": [{"key": "producer_byte_rate", "value": 5}]}]})
    assert "User:etl" in answer["entries"][0]["error"]["message"]
