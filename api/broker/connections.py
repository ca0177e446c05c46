"""How many connections a broker holds: Kafka's connection limits.

``max.connections`` caps the connections a broker holds at once over all its
listeners (the HTTP listener and the Kafka one); ``max.connections.per.ip``
caps those from one client address, and ``max.connections.per.ip.overrides``
sets other caps for named addresses (``"10.0.0.5:500,127.0.0.1:2000"``).
A connection over a limit is closed as soon as it is accepted (after its TLS
handshake, on a TLS listener) and counted in
``kraftlog_connections_refused_total``; the client sees its connection
closed and retries, as a Kafka client does when a broker refuses it.

Unlike Kafka, the broker does not stop accepting while it is at
``max.connections``, and the other brokers' follower fetchers count like any
client: leave them room (each broker opens ``num.replica.fetchers``
connections to each leader it follows), or give their addresses an override.

``connections.max.idle.ms`` is enforced here too, for a connection that
never sends a request: it is closed once that long has passed (aiohttp
closes an idle keep-alive connection itself; the Kafka listener its own).
"""

from __future__ import annotations

import asyncio
import collections
import logging
from collections.abc import Callable, Mapping
from typing import Any

from kraft.config import parse_connection_overrides

logger = logging.getLogger(__name__)

MAX_CONNECTIONS = "max.connections"
MAX_CONNECTIONS_PER_IP = "max.connections.per.ip"
MAX_CONNECTIONS_PER_IP_OVERRIDES = "max.connections.per.ip.overrides"
IDLE_MS = "connections.max.idle.ms"


class ConnectionLimiter:
    """The broker's connection counts, shared by its listeners. Owned by
    the event loop: ``admit`` and ``release`` run on it."""

    def __init__(self, settings: Mapping[str, Any]) -> None:
        self.max_total = settings[MAX_CONNECTIONS]
        self.max_per_ip = settings[MAX_CONNECTIONS_PER_IP]
        self.overrides = parse_connection_overrides(settings[MAX_CONNECTIONS_PER_IP_OVERRIDES])
        self.idle_s = settings[IDLE_MS] / 1000
        self.total = 0
        self.per_ip: collections.Counter[str] = collections.Counter()
        #: Connections closed because a limit was reached, and those closed
        #: for sending nothing within connections.max.idle.ms (metrics).
        self.refused = 0
        self.idle_closed = 0
        self._holders: dict[object, str] = {}
        # The idle check of each HTTP connection, cancelled when it closes.
        self._idle_checks: dict[object, asyncio.TimerHandle] = {}

    def admit(self, holder: object, peer: Any) -> bool:
        """Count ``holder``'s connection from ``peer`` (a peername tuple);
        False, counting nothing, when a limit refuses it."""
        ip = peer[0] if isinstance(peer, tuple) and peer else str(peer)
        cap = self.overrides.get(ip, self.max_per_ip)
        if self.total >= self.max_total or self.per_ip[ip] >= cap:
            self.refused += 1
            which = (f"{MAX_CONNECTIONS} ({self.max_total})" if self.total >= self.max_total
                     else f"the per-address limit for {ip} ({cap})")
            logger.warning("refusing a connection from %s: %s reached", ip, which)
            return False
        self.total += 1
        self.per_ip[ip] += 1
        self._holders[holder] = ip
        return True

    def release(self, holder: object) -> None:
        check = self._idle_checks.pop(holder, None)
        if check is not None:
            check.cancel()
        ip = self._holders.pop(holder, None)
        if ip is None:
            return
        self.total -= 1
        self.per_ip[ip] -= 1
        if not self.per_ip[ip]:
            del self.per_ip[ip]

    def guard_aiohttp(self, server: Any, started: Callable[[Any], bool]) -> None:
        """Apply the limits to an aiohttp ``web.Server``'s connections
        (``runner.server`` once set up): each is counted when the server
        registers it and released when it is lost. ``started(handler)``:
        whether the handler has begun reading a request, for the idle rule."""
        made, lost = server.connection_made, server.connection_lost
        loop = asyncio.get_running_loop()

        def connection_made(handler: Any, transport: asyncio.Transport) -> None:
            made(handler, transport)
            if not self.admit(handler, transport.get_extra_info("peername")):
                transport.close()
                return
            self._idle_checks[handler] = loop.call_later(
                self.idle_s, self._close_if_silent, handler, transport, started)

        def connection_lost(handler: Any, exc: BaseException | None = None) -> None:
            self.release(handler)
            lost(handler, exc)

        server.connection_made = connection_made
        server.connection_lost = connection_lost

    def _close_if_silent(self, handler: Any, transport: asyncio.Transport,
                         started: Callable[[Any], bool]) -> None:
        self._idle_checks.pop(handler, None)
        if handler in self._holders and not transport.is_closing() and not started(handler):
            self.idle_closed += 1
            logger.info("closing a connection from %s: no request within %s = %d ms",
                        self._holders[handler], IDLE_MS, int(self.idle_s * 1000))
            transport.close()
