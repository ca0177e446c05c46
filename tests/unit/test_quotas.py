"""Client quotas: the rate over sampled windows, Kafka's resolution order,
the throttle it asks for, entity and value checks, certificate subjects as
principals. (A real node enforcing them: tests/integration/test_quotas.py.)"""

from __future__ import annotations

import asyncio
import functools
import time

import pytest

from api.broker.quotas import OnLoopTime, QuotaManager, Rate
from protocol.quotas import (CONSUMER_BYTE_RATE, DEFAULT, PRODUCER_BYTE_RATE,
                             REQUEST_PERCENTAGE, check_entity, check_quota_value, entity_name,
                             resolution_order)
from protocol.tls import PrincipalMapper, TlsConfigError, subject_name


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def manager(table: dict, clock: Clock, samples: int = 11, sample_s: float = 1.0):
    version = {"n": 0}
    quotas = QuotaManager(lambda: table, lambda: version["n"], samples, sample_s, clock)
    return quotas, version


def test_a_rate_spans_at_least_all_samples_but_one_and_forgets_old_ones():
    clock = Clock()
    rate = Rate(samples=3, sample_s=1.0)
    rate.record(100, clock.now)
    assert rate.rate(clock.now) == pytest.approx(100 / 2)  # a burst is spread over 2 s
    clock.now += 1.5
    rate.record(100, clock.now)
    assert rate.rate(clock.now) == pytest.approx(200 / 2)
    clock.now += 10  # every sample older than the window: forgotten
    assert rate.rate(clock.now) == 0 and rate.idle_since(clock.now)


def test_the_most_specific_entity_with_a_quota_wins_in_kafkas_order():
    order = resolution_order("User:alice", "app")
    assert order[0] == {"user": "User:alice", "client-id": "app"}
    assert order[-1] == {"client-id": DEFAULT} and len(order) == 8
    table = {entity_name({"client-id": DEFAULT}): {PRODUCER_BYTE_RATE: "1000"},
             entity_name({"user": "User:alice"}): {PRODUCER_BYTE_RATE: "5000"},
             entity_name({"user": "User:alice", "client-id": "app"}):
                 {CONSUMER_BYTE_RATE: "7"}}
    quotas, _ = manager(table, Clock())
    assert quotas.quota(PRODUCER_BYTE_RATE, "User:alice", "app") == 5000
    assert quotas.quota(CONSUMER_BYTE_RATE, "User:alice", "app") == 7
    assert quotas.quota(PRODUCER_BYTE_RATE, "User:bob", "other") == 1000
    assert quotas.quota(CONSUMER_BYTE_RATE, "User:bob", "other") is None


def test_a_client_over_its_quota_is_held_back_as_kafka_computes_it():
    clock = Clock()
    table = {entity_name({"client-id": "slow"}): {PRODUCER_BYTE_RATE: "1000"}}
    quotas, version = manager(table, clock, samples=2, sample_s=1.0)
    assert quotas.record(PRODUCER_BYTE_RATE, "User:ANONYMOUS", "slow", 500) == 0
    # 2000 bytes over a 1 s window against 1000/s: (2000 - 1000) / 1000 * 1 s.
    assert quotas.record(PRODUCER_BYTE_RATE, "User:ANONYMOUS", "slow", 1500) == 1000
    assert quotas.throttled.ms_total == {(PRODUCER_BYTE_RATE, "slow"): 1000}
    # Another client id, no quota: never held back.
    assert quotas.record(PRODUCER_BYTE_RATE, "User:ANONYMOUS", "fast", 10**9) == 0
    # The quota removed: the next metadata version frees the client.
    table.clear()
    version["n"] += 1
    assert quotas.record(PRODUCER_BYTE_RATE, "User:ANONYMOUS", "slow", 10**9) == 0


@pytest.mark.parametrize("key, value, message", [
    ("producer_byte_rate", 0, "positive"), ("producer_byte_rate", -5, "positive"),
    ("producer_byte_rate", "fast", "a number"), ("consumer_byte_rate", float("inf"), "positive"),
    ("request_percentage", 0, "positive"), ("io_thread_rate", 1, "unknown quota")])
def test_quota_values_are_checked(key, value, message):
    with pytest.raises(ValueError, match=message):
        check_quota_value(key, value)


@pytest.mark.parametrize("entity, message", [
    ({}, "a map of user and/or client-id"), ("app", "a map"),
    ({"group": "x"}, "unknown entity type"), ({"client-id": ""}, "1-255 characters"),
    ({"user": 7}, "1-255 characters"), ({"user": "etl"}, "User:etl")])
def test_entities_are_checked(entity, message):
    with pytest.raises(ValueError, match=message):
        check_entity(entity)


def test_a_certificate_subject_is_named_as_java_names_it():
    subject = ((("countryName", "GB"),), (("organizationName", "Acme, Ltd"),),
               (("commonName", "etl"),))
    assert subject_name(subject) == r"CN=etl,O=Acme\, Ltd,C=GB"


def test_the_next_request_of_a_throttled_client_waits_its_throttle_out():
    clock = Clock()
    table = {entity_name({"client-id": "slow"}): {CONSUMER_BYTE_RATE: "1000"}}
    quotas, _ = manager(table, clock, samples=2, sample_s=1.0)
    hold = functools.partial(quotas.hold_for, CONSUMER_BYTE_RATE, "User:ANONYMOUS")
    assert hold("slow") == 0
    ms = quotas.record(CONSUMER_BYTE_RATE, "User:ANONYMOUS", "slow", 2500)
    assert ms == 1500
    assert hold("slow") == pytest.approx(1.5)
    assert hold("other") == 0
    assert quotas.hold_for(PRODUCER_BYTE_RATE, "User:ANONYMOUS", "slow") == 0  # per quota
    clock.now += 1.0
    assert hold("slow") == pytest.approx(0.5)
    clock.now += 1
    assert hold("slow") == 0
    # Never held longer than the window the rate is measured over (2 s here).
    assert quotas.record(CONSUMER_BYTE_RATE, "User:ANONYMOUS", "slow", 10**9) == 2000


def test_a_user_quota_is_shared_by_every_client_id_and_a_default_is_per_name():
    clock = Clock()
    table = {entity_name({"user": "User:etl"}): {PRODUCER_BYTE_RATE: "1000"},
             entity_name({"user": DEFAULT}): {PRODUCER_BYTE_RATE: "1000"}}
    quotas, _ = manager(table, clock, samples=2, sample_s=1.0)
    # A new client id per request does not escape the user's quota.
    held = [quotas.record(PRODUCER_BYTE_RATE, "User:etl", f"c{i}", 600) for i in range(3)]
    assert held[0] == 0 and held[1] > 0 and held[2] > held[1]
    # Another user under the <default> quota has a bucket of its own.
    assert quotas.record(PRODUCER_BYTE_RATE, "User:other", "c0", 600) == 0
    assert quotas.record(PRODUCER_BYTE_RATE, "User:third", "c0", 600) == 0


def test_idle_buckets_are_swept_out():
    clock = Clock()
    table = {entity_name({"client-id": DEFAULT}): {PRODUCER_BYTE_RATE: "1000"}}
    quotas, _ = manager(table, clock, samples=2, sample_s=1.0)
    quotas.SWEEP_ABOVE = 50
    for i in range(200):
        quotas.record(PRODUCER_BYTE_RATE, "User:ANONYMOUS", f"client-{i}", 5000)
    clock.now += 10
    quotas.record(PRODUCER_BYTE_RATE, "User:ANONYMOUS", "late", 1)
    assert len(quotas._rates) == 1 and not quotas._held_until


def test_principal_mapping_rules_read_as_kafkas():
    rules = PrincipalMapper(
        "RULE:^CN=(.*?),OU=ServiceUsers.*$/$1/,"
        "RULE:^CN=(.*?),OU=(.*?),O=(.*?),L=(.*?),ST=(.*?),C=(.*?)$/$1@$2/L,"
        "RULE:^.*[Cc][Nn]=([a-zA-Z0-9.]*).*$/$1/U, DEFAULT")
    assert rules.name("CN=kafka-server1,OU=ServiceUsers,O=org,C=us") == "kafka-server1"
    assert rules.name("CN=Duke,OU=JavaSoft,O=Sun,L=Santa Clara,ST=CA,C=US") == "duke@javasoft"
    assert rules.name("CN=Duke,OU=JavaSoft,O=Sun") == "DUKE"
    assert rules.name("OU=JavaSoft,O=Sun,C=US") == "OU=JavaSoft,O=Sun,C=US"  # DEFAULT
    assert PrincipalMapper("RULE:^CN=(.*?),.*$/$1/").name("O=x") is None  # refused
    assert PrincipalMapper().name("CN=a,O=b") == "CN=a,O=b"
    for bad in ("RULE:^CN=(.*$/$1/", "RULES:x/y/", "RULE:a/b"):
        with pytest.raises(TlsConfigError, match="ssl.principal.mapping.rules"):
            PrincipalMapper(bad)


def _work(seconds: float) -> None:
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        pass


async def test_request_time_is_the_time_a_handler_runs_not_the_time_it_waits():
    # A long poll: 30 ms of work around 300 ms of waiting (for records, a
    # replica, a lock). Only the work counts against request_percentage.
    async def inner() -> str:
        _work(0.01)
        await asyncio.sleep(0.15)
        return "records"

    async def handler() -> str:
        _work(0.01)
        value = await inner()
        await asyncio.sleep(0.15)
        _work(0.01)
        return value

    timed = OnLoopTime(handler())
    started = time.perf_counter()
    assert await timed == "records"
    assert time.perf_counter() - started >= 0.3
    assert 0.03 <= timed.busy_s < 0.25, timed.busy_s  # far below the 0.3 s waited


async def test_a_timed_handler_that_fails_or_is_cancelled_still_counts_its_work():
    async def failing() -> None:
        _work(0.01)
        await asyncio.sleep(0)
        raise KeyError("gone")

    timed = OnLoopTime(failing())
    with pytest.raises(KeyError):
        await timed
    assert timed.busy_s >= 0.01

    caught = []

    async def cancelled() -> None:
        _work(0.01)
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            caught.append(True)  # the handler sees its cancellation, as without timing
            raise

    timed = OnLoopTime(cancelled())
    task = asyncio.ensure_future(timed)
    await asyncio.sleep(0.05)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert caught == [True] and timed.busy_s >= 0.01


def test_request_percentage_throttles_in_kafkas_unit_percent_of_one_thread():
    clock = Clock()
    table = {entity_name({"user": "User:etl"}): {REQUEST_PERCENTAGE: "10"}}
    quotas, _ = manager(table, clock, samples=2, sample_s=1.0)
    # 50 ms of handler time in a 1 s window: 5 %, within 10 %.
    assert quotas.record(REQUEST_PERCENTAGE, "User:etl", "a", 0.05 * 100) == 0
    # 250 ms: 25 % against 10 %, held (25 - 10) / 10 * 1 s, shared by its client ids.
    assert quotas.record(REQUEST_PERCENTAGE, "User:etl", "b", 0.2 * 100) == 1500
    assert quotas.hold_for(REQUEST_PERCENTAGE, "User:etl", "c") == pytest.approx(1.5)
    assert quotas.hold_for(PRODUCER_BYTE_RATE, "User:etl", "c") == 0  # other quotas free


async def test_calls_only_nodes_and_operators_make_are_never_held_by_a_request_quota():
    # Everyone's client id under one <default> quota, its bucket held for half a
    # minute: a client's request waits, but not a health probe, a metrics
    # scrape, a marker or a KIP-890 check, nor a node's own calls (their
    # client id is kraftlog-node, which a quota on "" does not cover).
    import aiohttp
    from aiohttp import web

    from api.broker.quotas import request_quota_middleware
    from protocol.quotas import CLIENT_ID_HEADER
    from protocol.tls import NODE_CLIENT_ID

    clock = Clock()
    table = {entity_name({"client-id": ""}): {REQUEST_PERCENTAGE: "1"}}
    quotas, _ = manager(table, clock)
    quotas._held_until[(REQUEST_PERCENTAGE, entity_name({"client-id": ""}))] = clock.now + 30

    async def ok(request):
        return web.Response(text="ok")
    app = web.Application(middlewares=[request_quota_middleware(quotas)])
    for path in ("/healthz", "/metrics", "/v1/topics"):
        app.router.add_get(path, ok)
    for path in ("/v1/txn/markers", "/v1/transactions/verify"):
        app.router.add_post(path, ok)
    runner = web.AppRunner(app, shutdown_timeout=0.5)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    base = f"http://127.0.0.1:{port}"
    try:
        async with aiohttp.ClientSession() as client:
            for method, path in (("GET", "/healthz"), ("GET", "/metrics"),
                                 ("POST", "/v1/txn/markers"),
                                 ("POST", "/v1/transactions/verify")):
                async with client.request(method, base + path,
                                          timeout=aiohttp.ClientTimeout(total=5)) as answer:
                    assert answer.status == 200, path
            async with client.get(base + "/v1/topics", headers={
                    CLIENT_ID_HEADER: NODE_CLIENT_ID},
                    timeout=aiohttp.ClientTimeout(total=5)) as answer:
                assert answer.status == 200
            with pytest.raises(asyncio.TimeoutError):  # the held client does wait
                async with client.get(base + "/v1/topics",
                                      timeout=aiohttp.ClientTimeout(total=1)):
                    pass
    finally:
        await runner.cleanup()
