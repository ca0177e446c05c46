"""Client quotas: produce and fetch byte rates and request time, per user
and client id, enforced by throttling (never by dropping data).

Kafka's model. A quota is set on an *entity*: a user (the client's
principal: ``User:<SCRAM name>``, ``User:<certificate subject>`` over mutual
TLS, else ``User:ANONYMOUS``), a client id (what the client calls itself, Kafka's
``client.id``), or both, each possibly ``<default>``. Keys:
``producer_byte_rate`` and ``consumer_byte_rate`` (bytes per second) and
``request_percentage`` (percent of the broker's event loop, Kafka's percent
of one request handler thread). The quota of a request is the most specific
entity that has one, in Kafka's order (user+client, user+default client,
user, default user+client, default user+default client, default user,
client, default client); the rate is that entity's, shared by the clients it
covers (``<default>`` standing for each actual name), as in Kafka.

Rates are measured over ``quota.window.num`` samples of
``quota.window.size.seconds``. A request that takes its client over its quota
is served in full (a produce is appended, a fetch returns its records) and
the next produce (or fetch) of its entity waits for the time that brings the
rate back to the quota, as Kafka computes it: ``(rate - quota) / quota *
window``, at most the window (KIP-219: the answer goes at once and says so
in ``throttle_time_ms``; then the clients are held, whether or not they
honour the field).

Request time is what the handler of a request runs on the event loop, step by
step between its awaits (``OnLoopTime``): a long-polling fetch that waits
for records, or a produce waiting for its replicas, costs only the time it
works, as a Kafka request in purgatory costs its handler thread nothing.
Every API counts (metadata, groups, admin, inspection), as in Kafka; the
calls only nodes make (a follower's fetch, transaction markers, KIP-890
checks) are exempt, as Kafka exempts cluster actions, and so are health
probes and metrics scrapes; the nodes' own calls name themselves
``kraftlog-node`` (a client id no ``<default>`` quota should cover by
accident). Over the quota, the answer says so in the
``Kraftlog-Throttle-Time-Ms`` header (every API, not only produce and
fetch, so it cannot be a body field) and the entity's next request of any
kind waits (``request_quota_middleware``); a produce or a consumer's fetch
waits once, for the longer of its byte-rate and request holds.

Entities are stored as metadata configs of resource type ``client-quota``
whose name is the entity as canonical JSON (``entity_name``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Awaitable, Callable, Generator, Mapping
from typing import Any

from aiohttp import web

from protocol.quotas import (CLIENT_ID_CHARS_MAX, CLIENT_ID_HEADER, REQUEST_PERCENTAGE,
                             check_quota_value, entity_name, parse_entity_name,
                             resolution_order)
from protocol.tls import principal_of

#: A throttle is never longer than this, whatever the rate.
THROTTLE_MS_MAX = 60_000
#: The response header a request quota's throttle is reported in.
THROTTLE_HEADER = "Kraftlog-Throttle-Time-Ms"
#: Set on a request (``exempt_from_request_quota``) that only a node makes.
_EXEMPT_KEY = "kraftlog.quota_exempt"


class Rate:
    """A rate over a window of ``samples`` samples of ``sample_s`` seconds
    (Kafka's SampledStat Rate): the total in the window over the time it
    spans (at least all but one sample, so one burst is not a huge rate)."""

    def __init__(self, samples: int, sample_s: float) -> None:
        self.samples, self.sample_s = samples, sample_s
        self._buckets: list[list[float]] = []  # [start_s, total]

    def record(self, amount: float, now_s: float) -> None:
        if not self._buckets or now_s - self._buckets[-1][0] >= self.sample_s:
            self._buckets.append([now_s, 0.0])
        self._buckets[-1][1] += amount
        self._purge(now_s)

    def _purge(self, now_s: float) -> None:
        horizon = now_s - self.samples * self.sample_s
        while self._buckets and self._buckets[0][0] + self.sample_s <= horizon:
            self._buckets.pop(0)

    def window_s(self, now_s: float) -> float:
        span = now_s - self._buckets[0][0] if self._buckets else 0.0
        return max(span, (self.samples - 1) * self.sample_s)

    def rate(self, now_s: float) -> float:
        self._purge(now_s)
        return sum(total for _, total in self._buckets) / self.window_s(now_s)

    def idle_since(self, now_s: float) -> bool:
        """Nothing recorded within the window before ``now_s``."""
        self._purge(now_s)
        return not self._buckets


@dataclasses.dataclass
class Throttled:
    """Throttle time handed out, per quota key and client id (for /metrics)."""

    ms_total: dict[tuple[str, str], float] = dataclasses.field(default_factory=dict)

    def add(self, key: str, client_id: str, ms: float) -> None:
        self.ms_total[(key, client_id)] = self.ms_total.get((key, client_id), 0.0) + ms


class QuotaManager:
    """Measures what each quota entity's clients send and fetch, and says
    how long to hold their next request. ``quotas()`` gives the current
    entity -> {key: value} table (from the metadata image), ``version()``
    when it changed.

    As in Kafka, the rate is the matched entity's, shared by every client it
    covers: a quota on a user is shared by all of that user's client ids, a
    ``<default>`` stands for each actual name (each user under a
    ``<default>`` user quota has a rate of its own)."""

    #: Past this many measured buckets, idle ones are swept out.
    SWEEP_ABOVE = 10_000
    #: Client ids the throttle metric names; the rest are counted as "other".
    METRIC_CLIENTS_MAX = 1000

    def __init__(self, quotas: Callable[[], Mapping[str, Mapping[str, str]]],
                 version: Callable[[], int], samples: int, sample_s: float,
                 clock_s: Callable[[], float]) -> None:
        self._quotas, self._version = quotas, version
        self.samples, self.sample_s, self.clock_s = samples, sample_s, clock_s
        #: Never longer than the window a rate is measured over (Kafka's cap).
        self.throttle_ms_max = min(THROTTLE_MS_MAX, int(samples * sample_s * 1000))
        self._table: dict[str, dict[str, float]] = {}
        self._table_version: int | None = None
        self._resolved: dict[tuple[str, str, str], tuple[float, str] | None] = {}
        #: (key, bucket) -> its rate, and when its clients may be served again.
        self._rates: dict[tuple[str, str], Rate] = {}
        self._held_until: dict[tuple[str, str], float] = {}
        self._swept_at = 0.0
        self.throttled = Throttled()

    def _refresh(self) -> None:
        version = self._version()
        if version == self._table_version:
            return
        table: dict[str, dict[str, float]] = {}
        for name, values in self._quotas().items():
            entity = entity_name(parse_entity_name(name))
            for key, value in values.items():
                try:
                    table.setdefault(entity, {})[key] = check_quota_value(key, value)
                except ValueError:
                    continue  # checked when set; an unknown key of a newer version
        self._table, self._table_version = table, version
        self._resolved.clear()

    def resolve(self, key: str, user: str, client_id: str) -> tuple[float, str] | None:
        """The quota ``key`` of (user, client id) and the bucket it is
        measured in (the matched entity, ``<default>`` replaced by the
        actual name), or None: unlimited."""
        self._refresh()
        cached = self._resolved.get((key, user, client_id), False)
        if cached is not False:
            return cached
        found = None
        if self._table:
            for entity in resolution_order(user, client_id):
                value = self._table.get(entity_name(entity), {}).get(key)
                if value is not None:
                    actual = {kind: (user if kind == "user" else client_id)
                              for kind in entity}
                    found = (value, entity_name(actual))
                    break
        if len(self._resolved) > self.SWEEP_ABOVE:
            self._resolved.clear()
        self._resolved[(key, user, client_id)] = found
        return found

    def quota(self, key: str, user: str, client_id: str) -> float | None:
        """The quota ``key`` of (user, client id), or None: unlimited."""
        found = self.resolve(key, user, client_id)
        return None if found is None else found[0]

    def hold_for(self, key: str, user: str, client_id: str) -> float:
        """Seconds the next ``key`` request of (user, client id) must wait:
        what the last throttle of its bucket left (0: none)."""
        found = self.resolve(key, user, client_id)
        if found is None:
            return 0.0
        until = self._held_until.get((key, found[1]))
        left = 0.0 if until is None else until - self.clock_s()
        return max(0.0, left)

    def record(self, key: str, user: str, client_id: str, amount: float) -> int:
        """Count ``amount`` bytes for (user, client id); the milliseconds to
        hold its bucket's next request back (0: within quota)."""
        found = self.resolve(key, user, client_id)
        if found is None:
            return 0
        limit, bucket = found
        now = self.clock_s()
        self._sweep(now)
        rate = self._rates.get((key, bucket))
        if rate is None:
            rate = self._rates[(key, bucket)] = Rate(self.samples, self.sample_s)
        rate.record(amount, now)
        observed = rate.rate(now)
        if observed <= limit:
            return 0
        throttle_ms = (observed - limit) / limit * rate.window_s(now) * 1000
        throttle_ms = int(min(self.throttle_ms_max, throttle_ms))
        clients = self.throttled.ms_total
        label = client_id if (key, client_id) in clients \
            or len(clients) < self.METRIC_CLIENTS_MAX else "other"
        self.throttled.add(key, label, throttle_ms)
        until = now + throttle_ms / 1000
        if until > self._held_until.get((key, bucket), 0.0):
            self._held_until[(key, bucket)] = until
        return throttle_ms

    def _sweep(self, now: float) -> None:
        """Forget the buckets idle for a whole window, and holds past, once
        there are many of them (each client id under a ``<default>`` quota
        makes one) and at most once per window."""
        window = self.samples * self.sample_s
        if len(self._rates) <= self.SWEEP_ABOVE or now - self._swept_at < window:
            return
        self._swept_at = now
        self._rates = {k: r for k, r in self._rates.items() if not r.idle_since(now)}
        self._held_until = {k: t for k, t in self._held_until.items() if t > now}


def client_id_of(request: Any) -> str:
    """The client id a request names itself with ("" without one)."""
    value = request.headers.get(CLIENT_ID_HEADER, "")
    return value[:CLIENT_ID_CHARS_MAX]


def exempt_from_request_quota(request: Any) -> None:
    """Leave this request's time out of its user's ``request_percentage``:
    a follower's fetch, once the handler has checked that a node makes it
    (the routes only nodes call are in EXEMPT_ROUTES)."""
    request[_EXEMPT_KEY] = True


class OnLoopTime:
    """Awaits a coroutine and adds up the time its steps run on the event
    loop (``busy_s``): each ``send``/``throw`` into it, so the synchronous
    work of everything it awaits in turn, but not the time it is suspended
    (waiting for records, replicas, a lock, a thread pool's result)."""

    __slots__ = ("_coro", "busy_s")

    def __init__(self, coro: Awaitable[Any]) -> None:
        self._coro = coro.__await__()
        self.busy_s = 0.0

    def __await__(self) -> Generator[Any, Any, Any]:
        coro, clock = self._coro, time.perf_counter
        sent: Any = None
        thrown: BaseException | None = None
        while True:
            started = clock()
            try:
                if thrown is None:
                    step = coro.send(sent)
                else:
                    step, thrown = coro.throw(thrown), None
            except StopIteration as done:
                self.busy_s += clock() - started
                return done.value
            except BaseException:
                self.busy_s += clock() - started
                raise
            self.busy_s += clock() - started
            try:
                sent = yield step
            except GeneratorExit:
                coro.close()
                raise
            except BaseException as exc:  # noqa: BLE001  handed on to the coroutine
                sent, thrown = None, exc


async def run_counted(quotas: QuotaManager, user: str, client_id: str,
                      request: Awaitable[Any]) -> Any:
    """Await ``request`` (a request not sent over HTTP: one off a client's
    stream) and count its time on the event loop against its entity's
    ``request_percentage``, as the middleware counts an HTTP request's
    (the holding is the handler's, as for HELD_BY_HANDLER routes)."""
    if quotas.resolve(REQUEST_PERCENTAGE, user, client_id) is None:
        return await request
    timed = OnLoopTime(request)
    try:
        return await timed
    finally:
        quotas.record(REQUEST_PERCENTAGE, user, client_id, timed.busy_s * 100)


#: Routes only nodes and operators call (markers, KIP-890 checks, health
#: probes, metrics scrapes): never held, never counted, whoever calls.
EXEMPT_ROUTES = frozenset({"/v1/txn/markers", "/v1/transactions/verify",
                           "/v1/replica/fetch-stream", "/healthz", "/metrics",
                           # a client's stream: each request on it is counted
                           # (``run_counted``), not the stream's whole life
                           "/v1/stream"})
#: Routes whose handler does the holding (``DataApi.wait_turn``): for
#: clients only (a follower's fetch is not held), and once, for the longer
#: of the byte-rate and request holds, as Kafka throttles by the larger.
HELD_BY_HANDLER = frozenset({"/v1/produce", "/v1/fetch"})


def request_quota_middleware(quotas: QuotaManager) -> Callable:
    """Enforces ``request_percentage``: a request whose (user, client id)
    has one waits out its entity's last throttle, its handler's time on the
    event loop is counted, and an answer that takes the entity over its
    quota says for how long the next request will wait (THROTTLE_HEADER).
    Without such a quota a request only pays a cached lookup."""

    @web.middleware
    async def middleware(request: web.Request, handler) -> web.StreamResponse:
        resource = request.match_info.route.resource
        route = resource.canonical if resource is not None else ""
        if route in EXEMPT_ROUTES:
            return await handler(request)
        user, client_id = principal_of(request), client_id_of(request)
        if quotas.resolve(REQUEST_PERCENTAGE, user, client_id) is None:
            return await handler(request)
        if route not in HELD_BY_HANDLER:
            wait_s = quotas.hold_for(REQUEST_PERCENTAGE, user, client_id)
            if wait_s > 0:
                await asyncio.sleep(wait_s)
        timed = OnLoopTime(handler(request))
        throttle_ms = 0
        try:
            response = await timed
        finally:
            if not request.get(_EXEMPT_KEY):
                # Kafka's unit: percent of one thread, per second.
                throttle_ms = quotas.record(REQUEST_PERCENTAGE, user, client_id,
                                            timed.busy_s * 100)
        if throttle_ms and not response.prepared:
            response.headers[THROTTLE_HEADER] = str(throttle_ms)
        return response

    return middleware
