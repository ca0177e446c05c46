"""LifecycleCore: the broker's membership state machine, driven with integers."""

from __future__ import annotations

import pytest

from api.broker.lifecycle_core import (RETRY_BACKOFF_MS, BrokerState, IllegalTransition,
                                       LifecycleCore, LifecycleSettings)

INTERVAL_MS = 1000
SESSION_MS = 3000


def core(now_ms: int = 0) -> LifecycleCore:
    return LifecycleCore(LifecycleSettings(7, "inc-1", {"BROKER": "127.0.0.1:1"}, "r1",
                                           INTERVAL_MS, SESSION_MS), now_ms)


def registered(now_ms: int = 0) -> LifecycleCore:
    broker = core(now_ms)
    request = broker.poll(now_ms)
    broker.answered(request.kind, {"broker_epoch": 12}, now_ms)
    return broker


def test_registers_first_then_heartbeats_at_once():
    broker = core()
    request = broker.poll(0)
    assert request.kind == "register"
    assert request.body == {"broker_id": 7, "incarnation_id": "inc-1",
                            "endpoints": {"BROKER": "127.0.0.1:1"}, "rack": "r1",
                            "clean_shutdown": False}
    assert broker.poll(0) is None, "one request at a time"
    broker.answered("register", {"broker_epoch": 12}, 5)
    assert (broker.state, broker.broker_epoch) == (BrokerState.FENCED, 12)
    heartbeat = broker.poll(5)
    assert heartbeat.kind == "heartbeat" and heartbeat.body["broker_epoch"] == 12
    assert heartbeat.timeout_ms == SESSION_MS // 2


def test_a_registration_says_whether_the_logs_were_closed_cleanly_and_later_ones_do():
    """KIP-966: the first registration of a process carries what its log
    dirs said at start-up; a re-registration of the same process lost
    nothing, so it says clean."""
    for clean in (False, True):
        broker = core()
        broker.clean_shutdown = clean
        assert broker.poll(0).body["clean_shutdown"] is clean
        broker.answered("register", {"broker_epoch": 12}, 5)
        assert broker.poll(5).kind == "heartbeat"
        broker.failed("heartbeat", "STALE_BROKER_EPOCH", 6)
        again = broker.poll(10 ** 6)
        assert again.kind == "register" and again.body["clean_shutdown"] is True


def test_unfenced_by_a_heartbeat_answer_then_heartbeats_every_interval():
    broker = registered()
    assert broker.poll(10).kind == "heartbeat"
    broker.answered("heartbeat", {"is_fenced": False}, 10)
    assert broker.state is BrokerState.RUNNING
    assert broker.poll(10 + INTERVAL_MS - 1) is None
    assert broker.poll(10 + INTERVAL_MS).kind == "heartbeat"


def test_a_failed_heartbeat_is_retried_soon_and_a_silent_session_fences_the_broker():
    broker = registered()
    broker.poll(0)
    broker.answered("heartbeat", {"is_fenced": False}, 0)
    now = INTERVAL_MS
    while now <= SESSION_MS + INTERVAL_MS:
        request = broker.poll(now)
        if request is not None:
            broker.failed(request.kind, None, now)
            assert broker.next_wake_ms() == now + RETRY_BACKOFF_MS
        now += RETRY_BACKOFF_MS
    assert broker.state is BrokerState.FENCED, "no heartbeat for a whole session"


def test_a_timed_out_request_counts_as_failed():
    broker = registered()
    request = broker.poll(0)
    broker.tick(request.timeout_ms - 1)
    assert broker.in_flight is not None
    broker.tick(request.timeout_ms)
    assert broker.in_flight is None and broker.poll(request.timeout_ms) is None
    assert broker.poll(request.timeout_ms + RETRY_BACKOFF_MS).kind == "heartbeat"


def test_a_forgotten_registration_registers_again():
    broker = registered()
    broker.poll(0)
    broker.answered("heartbeat", {"is_fenced": False}, 0)
    request = broker.poll(INTERVAL_MS)
    broker.failed(request.kind, "STALE_BROKER_EPOCH", INTERVAL_MS)
    assert (broker.state, broker.broker_epoch) == (BrokerState.STARTING, None)
    assert broker.poll(INTERVAL_MS).kind == "register"


def test_metadata_caught_up_needs_the_registration_and_the_controllers_offset():
    broker = registered()
    assert broker.metadata_applied(11, 20, 0) and not broker.metadata_caught_up
    assert broker.metadata_applied(20, 20, 0) and broker.metadata_caught_up
    assert not broker.metadata_applied(20, 20, 0), "nothing new"
    assert broker.fetch_ready


def test_catching_up_while_fenced_asks_for_a_heartbeat_now():
    broker = registered()
    broker.poll(0)
    broker.answered("heartbeat", {"is_fenced": True}, 0)
    assert broker.next_wake_ms() == INTERVAL_MS
    broker.metadata_applied(12, 12, 50)
    assert broker.poll(50).kind == "heartbeat"


def test_serving_needs_running_and_caught_up():
    broker = registered()
    assert "fenced" in broker.not_serving_reason()
    broker.poll(0)
    broker.answered("heartbeat", {"is_fenced": False}, 0)
    assert "replaying" in broker.not_serving_reason()
    broker.metadata_applied(12, 12, 0)
    assert broker.not_serving_reason() is None


def test_shutdown_stops_requests_and_ignores_late_answers():
    broker = registered()
    request = broker.poll(0)
    broker.begin_shutdown()
    broker.answered(request.kind, {"is_fenced": True}, 1)
    assert broker.state is BrokerState.SHUTTING_DOWN
    assert broker.poll(10_000) is None and broker.next_wake_ms() is None
    broker.stop()
    assert broker.state is BrokerState.STOPPED


def test_an_illegal_transition_names_both_states():
    broker = registered()
    broker.stop()
    with pytest.raises(IllegalTransition, match="stopped -> running"):
        broker._set_state(BrokerState.RUNNING)


def test_offline_log_dirs_ride_on_heartbeats_until_the_registration_records_them():
    broker = registered()
    broker.answered("heartbeat", broker.poll(0) and {"is_fenced": False}, 1)
    assert "offline_log_dirs" not in broker.heartbeat_body()
    broker.report_offline(["/d1"], {"tid": [3, 1]}, 2)
    assert broker.poll(2).body["offline_replicas"] == {"tid": [1, 3]}, "sent at once"
    broker.answered("heartbeat", {"is_fenced": False}, 3)
    # The metadata shows the registration without them yet; then with them
    # (a deleted topic's partitions need not be recorded).
    broker.registration_seen(12, [], {}, {"tid"})
    assert broker.heartbeat_body()["offline_log_dirs"] == ["/d1"]
    broker.report_offline(["/d1"], {"tid": [1, 3], "gone": [0]}, 4)
    broker.registration_seen(12, ["/d1"], {"tid": [1, 3]}, {"tid"})
    assert "offline_log_dirs" not in broker.heartbeat_body()
    # A new registration records none: they ride again until it does.
    assert broker.poll(5).kind == "heartbeat"
    broker.failed("heartbeat", "STALE_BROKER_EPOCH", 5)
    assert broker.poll(5).kind == "register"
    broker.answered("register", {"broker_epoch": 40}, 6)
    assert broker.heartbeat_body()["offline_log_dirs"] == ["/d1"]
    broker.registration_seen(12, ["/d1"], {"tid": [1, 3]}, {"tid"})  # the old one's
    assert broker.heartbeat_body()["offline_log_dirs"] == ["/d1"]
