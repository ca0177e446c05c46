"""The fuzz campaign's oracle and input maker (``chaos/fuzz.py``): each kind
of failure it must report, planted in an answer; what it must accept; and
inputs that replay exactly from a seed."""

from __future__ import annotations

import json
import random

import msgpack
import pytest

from chaos import fuzz


def packed(body) -> bytes:
    return msgpack.packb(body, use_bin_type=True)


REFUSAL = packed({"error": {"code": "INVALID_REQUEST", "message": "partitions must be a list"}})


@pytest.mark.parametrize("status, body, elapsed_s, expected", [
    (500, packed({"error": {"code": "UNKNOWN_SERVER_ERROR", "message": "boom"}}), 0.1,
     "HTTP 500"),
    (502, b"", 0.1, "HTTP 502"),
    (200, packed({"partitions": [{"topic": "t", "partition": 0, "error": {
        "code": "UNKNOWN_SERVER_ERROR", "message": "internal error"}}]}), 0.1,
     "an UNKNOWN_SERVER_ERROR in the answer"),
    (400, b"oops", 0.1, "HTTP 400 without an error code and message"),
    (400, packed({"error": "a string, not a code and message"}), 0.1,
     "HTTP 400 without an error code and message"),
    (None, b"", 0.1, "the connection closed with no answer"),
    (200, packed({}), fuzz.ANSWER_DEADLINE_S + 1, "a hang"),
], ids=["500", "502", "per-item-unknown-server-error", "400-not-an-error-body",
        "400-error-without-code", "dropped-connection", "hang"])
def test_the_oracle_reports_each_kind_of_failure(status, body, elapsed_s, expected):
    _, finding = fuzz.judge(status, body, elapsed_s)
    assert finding is not None and expected in finding


@pytest.mark.parametrize("status, body, content_type, code", [
    (200, packed({"partitions": []}), fuzz.MSGPACK, None),
    (400, REFUSAL, fuzz.MSGPACK, "INVALID_REQUEST"),
    (503, packed({"error": {"code": "NOT_ENOUGH_REPLICAS", "message": "isr 1 < 2"}}),
     fuzz.MSGPACK, "NOT_ENOUGH_REPLICAS"),
    (404, json.dumps({"error": {"code": "NOT_FOUND", "message": "no endpoint"}}).encode(),
     "application/json", "NOT_FOUND"),
    (200, b"<html>the console</html>", "text/html", None),
])
def test_the_oracle_accepts_answers_users_can_act_on(status, body, content_type, code):
    assert fuzz.judge(status, body, 0.1, content_type) == (code, None)


def test_every_route_has_an_example_that_encodes():
    routes = fuzz.routes()
    assert len({(r.method, r.path.split("?")[0]) for r in routes}) >= 80
    for route in routes:
        if route.method == "POST":
            assert fuzz._pack(route.body) is not None, route.path


def test_inputs_replay_exactly_from_a_seed_and_survive_a_corpus_file():
    def inputs(seed: int) -> list[fuzz.Input]:
        rng = random.Random(seed)
        return [fuzz.make_input(rng, route) for route in fuzz.routes() * 3]

    first, again = inputs(11), inputs(11)
    assert first == again and first != inputs(12)
    assert any(item.data != fuzz._pack(route.body)
               for item, route in zip(first, fuzz.routes() * 3) if route.method == "POST")
    for item in first:
        assert fuzz.Input.from_json(item.to_json()) == item
