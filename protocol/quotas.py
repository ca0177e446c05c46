"""Client quotas as the controller stores them and the broker applies them:
the keys, the entities (user, client id, ``<default>``) and their canonical
names, Kafka's resolution order (docs/security.md, api/broker/quotas.py)."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

#: The metadata config resource type quotas are stored under.
CLIENT_QUOTA_RESOURCE = "client-quota"
#: Bytes per second a client may produce / fetch.
PRODUCER_BYTE_RATE = "producer_byte_rate"
CONSUMER_BYTE_RATE = "consumer_byte_rate"
#: Kafka's share of request handler time, in percent of one thread over the
#: quota window: here, of the broker's event loop (the time a request's
#: handler runs on it; a long-polling fetch waiting for records costs nothing).
REQUEST_PERCENTAGE = "request_percentage"
QUOTA_KEYS = (PRODUCER_BYTE_RATE, CONSUMER_BYTE_RATE, REQUEST_PERCENTAGE)
USER = "user"
CLIENT_ID = "client-id"
ENTITY_TYPES = (USER, CLIENT_ID)
#: An entity value that means "every user" / "every client id" without one of its own.
DEFAULT = "<default>"
ANONYMOUS = "User:ANONYMOUS"
#: The header a client names itself in (Kafka's client.id).
CLIENT_ID_HEADER = "Kraftlog-Client-Id"
CLIENT_ID_CHARS_MAX = 255


def entity_name(entity: Mapping[str, str]) -> str:
    """The metadata name of an entity ({"user": ..., "client-id": ...})."""
    return json.dumps({k: entity[k] for k in sorted(entity)}, separators=(",", ":"))


def parse_entity_name(name: str) -> dict[str, str]:
    return json.loads(name)


def check_quota_value(key: str, value: Any) -> float:
    """A quota's value, checked: a positive finite number."""
    if key not in QUOTA_KEYS:
        raise ValueError(f"unknown quota {key!r}: use {', '.join(QUOTA_KEYS)}")
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"quota {key} must be a number, not {value!r}") from None
    if not math.isfinite(number) or number <= 0:
        raise ValueError(f"quota {key} must be a positive number, not {value!r}")
    return number


def resolution_order(user: str, client_id: str) -> list[dict[str, str]]:
    """The entities whose quota applies to (user, client id), most specific
    first (Kafka's order)."""
    return [{USER: user, CLIENT_ID: client_id}, {USER: user, CLIENT_ID: DEFAULT},
            {USER: user}, {USER: DEFAULT, CLIENT_ID: client_id},
            {USER: DEFAULT, CLIENT_ID: DEFAULT}, {USER: DEFAULT},
            {CLIENT_ID: client_id}, {CLIENT_ID: DEFAULT}]


def check_entity(entity: Any, strict: bool = True) -> dict[str, str]:
    """An entity as a request gives it: a map of ``user`` and/or
    ``client-id`` to a name or ``<default>`` (``strict``: a user named as a
    principal, ``User:...``)."""
    if not isinstance(entity, Mapping) or not entity:
        raise ValueError("a quota entity is a map of user and/or client-id to a name "
                         f"(or {DEFAULT!r}), not {entity!r}")
    checked = {}
    for key, value in entity.items():
        if key not in ENTITY_TYPES:
            raise ValueError(f"unknown entity type {key!r}: use {' or '.join(ENTITY_TYPES)}")
        if not isinstance(value, str) or not 0 < len(value) <= CLIENT_ID_CHARS_MAX:
            raise ValueError(f"entity {key} must be a name of 1-{CLIENT_ID_CHARS_MAX} "
                             f"characters (or {DEFAULT!r}), not {value!r}")
        if strict and key == USER and value != DEFAULT and not value.startswith("User:"):
            raise ValueError(f"a user is named as its principal, User:{value} (User:<SCRAM "
                             "name> or User:<certificate subject>), or <default>")
        checked[key] = value
    return checked
