"""Client quotas: produce and fetch byte rates and request time, per user
and client id, enforced by throttling (never by dropping data).

Kafka's model. A quota is set on an *entity*: a user (the client's
principal: ``User:<certificate subject>`` over mutual TLS, else
``User:ANONYMOUS``), a client id (what the client calls itself, Kafka's
``client.id``), or both, each possibly ``<default>``. Keys:
``producer_byte_rate`` and ``consumer_byte_rate`` (bytes per second; Kafka's
``request_percentage`` is refused as not enforced yet). The quota of a request is the most specific
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

Entities are stored as metadata configs of resource type ``client-quota``
whose name is the entity as canonical JSON (``entity_name``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

from protocol.quotas import (CLIENT_ID_CHARS_MAX, CLIENT_ID_HEADER, check_quota_value,
                             entity_name, parse_entity_name, resolution_order)

#: A throttle is never longer than this, whatever the rate.
THROTTLE_MS_MAX = 60_000


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
