"""Error bodies become the right KraftlogError: programs branch on ``code``
and ``retriable`` and on the subclasses, so these must be exact."""

import pickle

import pytest

from api.client import (
    KraftlogError, NotLeaderError, OffsetOutOfRangeError, RequestTimedOutError,
    TopicAlreadyExistsError, UnknownTopicOrPartitionError, error_from)
from api.client.errors import ERROR_BY_CODE, RETRIABLE_CODES, MessageTooLargeError


def test_none_is_no_error():
    assert error_from(None) is None


@pytest.mark.parametrize("code, cls, retriable", [
    ("UNKNOWN_TOPIC_OR_PARTITION", UnknownTopicOrPartitionError, True),
    ("NOT_LEADER_OR_FOLLOWER", NotLeaderError, True),
    ("OFFSET_OUT_OF_RANGE", OffsetOutOfRangeError, False),
    ("REQUEST_TIMED_OUT", RequestTimedOutError, True),
    ("MESSAGE_TOO_LARGE", MessageTooLargeError, False),
    ("TOPIC_ALREADY_EXISTS", TopicAlreadyExistsError, False),
])
def test_known_codes_map_to_their_subclass(code, cls, retriable):
    error = error_from({"code": code, "message": "what to do"})
    assert type(error) is cls
    assert isinstance(error, KraftlogError)
    assert (error.code, error.message, error.retriable) == (code, "what to do", retriable)
    assert code in str(error) and "what to do" in str(error)


def test_unknown_codes_stay_plain_errors_with_their_code():
    error = error_from({"code": "INVALID_CONFIG", "message": "bad"})
    assert type(error) is KraftlogError
    assert error.code == "INVALID_CONFIG" and not error.retriable


def test_every_protocol_retriable_code_is_retriable():
    for code in ("NOT_LEADER_OR_FOLLOWER", "UNKNOWN_TOPIC_OR_PARTITION",
                 "LEADER_NOT_AVAILABLE", "FENCED_LEADER_EPOCH", "UNKNOWN_LEADER_EPOCH",
                 "REQUEST_TIMED_OUT", "NOT_ENOUGH_REPLICAS", "NOT_CONTROLLER",
                 "BROKER_NOT_AVAILABLE", "KAFKA_STORAGE_ERROR"):
        assert code in RETRIABLE_CODES
        assert error_from({"code": code, "message": ""}).retriable
    for code in ERROR_BY_CODE:
        assert ERROR_BY_CODE[code]().retriable == (code in RETRIABLE_CODES)


def test_whole_request_error_shape_is_accepted():
    error = error_from({"error": {"code": "NOT_CONTROLLER", "message": "ask 2"}})
    assert error.code == "NOT_CONTROLLER" and error.retriable


def test_leader_hints_are_kept():
    error = error_from({"code": "NOT_LEADER_OR_FOLLOWER", "message": "not me",
                        "leader_id": 2, "leader_epoch": 5,
                        "leader_url": "http://127.0.0.1:9592"})
    assert isinstance(error, NotLeaderError)
    assert (error.leader_id, error.leader_epoch, error.leader_url) == (
        2, 5, "http://127.0.0.1:9592")
    assert NotLeaderError("no hint").leader_url is None


def test_malformed_bodies_become_unknown_server_error_not_silence():
    for body in ({"message": "no code"}, {"code": 5}, "text", ["list"]):
        error = error_from(body)
        assert error.code == "UNKNOWN_SERVER_ERROR" and not error.retriable


def test_a_body_field_named_retriable_cannot_override_the_code():
    error = error_from({"code": "TOPIC_ALREADY_EXISTS", "message": "", "retriable": True})
    assert not error.retriable


def test_errors_survive_pickling_with_their_fields():
    error = error_from({"code": "NOT_LEADER_OR_FOLLOWER", "message": "m", "leader_id": 3})
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is NotLeaderError
    assert (copy.code, copy.message, copy.retriable, copy.leader_id) == (
        error.code, "m", True, 3)
