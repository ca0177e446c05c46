"""Access control lists: Kafka's model (KIP-11, KIP-290), shared by the
client, the CLI, the controller and the broker.

A binding allows or denies one principal, from one host, one operation on
the resources a pattern names:

- resource types ``TOPIC``, ``GROUP``, ``CLUSTER`` (its one name is
  ``kafka-cluster``) and ``TRANSACTIONAL_ID``;
- patterns ``LITERAL`` (the name, or ``*`` for every name) and ``PREFIXED``
  (every name that starts with it); filters also take ``MATCH`` (every
  pattern that applies to a name) and ``ANY`` (every pattern type);
- operations, each allowed only on the resource types Kafka allows it on
  (``SUPPORTED_OPERATIONS``), plus ``ALL``;
- principals ``User:<name>`` (``User:*``: everyone), hosts an IP address or
  ``*``, permission ``ALLOW`` or ``DENY``.

How a request is judged against the bindings is ``kraft.authorizer``'s.
"""

from __future__ import annotations

import ipaddress
from typing import Any, NamedTuple

from protocol.errors import InvalidRequestError

TOPIC, GROUP, CLUSTER, TRANSACTIONAL_ID = "TOPIC", "GROUP", "CLUSTER", "TRANSACTIONAL_ID"
RESOURCE_TYPES = (TOPIC, GROUP, CLUSTER, TRANSACTIONAL_ID)
LITERAL, PREFIXED, MATCH, ANY = "LITERAL", "PREFIXED", "MATCH", "ANY"
#: Pattern types a binding may have; filters also take MATCH and ANY.
PATTERN_TYPES = (LITERAL, PREFIXED)
FILTER_PATTERN_TYPES = (LITERAL, PREFIXED, MATCH, ANY)
ALLOW, DENY = "ALLOW", "DENY"
PERMISSION_TYPES = (ALLOW, DENY)

READ, WRITE, CREATE, DELETE, ALTER, DESCRIBE = (
    "READ", "WRITE", "CREATE", "DELETE", "ALTER", "DESCRIBE")
CLUSTER_ACTION, DESCRIBE_CONFIGS, ALTER_CONFIGS, IDEMPOTENT_WRITE, ALL = (
    "CLUSTER_ACTION", "DESCRIBE_CONFIGS", "ALTER_CONFIGS", "IDEMPOTENT_WRITE", "ALL")
OPERATIONS = (READ, WRITE, CREATE, DELETE, ALTER, DESCRIBE, CLUSTER_ACTION, DESCRIBE_CONFIGS,
              ALTER_CONFIGS, IDEMPOTENT_WRITE, ALL)

#: The operations a binding may name per resource type (Kafka's AclEntry),
#: ALL included.
SUPPORTED_OPERATIONS = {
    TOPIC: frozenset({READ, WRITE, CREATE, DESCRIBE, DELETE, ALTER, DESCRIBE_CONFIGS,
                      ALTER_CONFIGS, ALL}),
    GROUP: frozenset({READ, DESCRIBE, DELETE, ALL}),
    CLUSTER: frozenset({CREATE, CLUSTER_ACTION, DESCRIBE_CONFIGS, ALTER_CONFIGS,
                        IDEMPOTENT_WRITE, ALTER, DESCRIBE, ALL}),
    TRANSACTIONAL_ID: frozenset({DESCRIBE, WRITE, ALL}),
}
#: An ALLOW of the key also allows these (Kafka: READ, WRITE, DELETE and
#: ALTER imply DESCRIBE; ALTER_CONFIGS implies DESCRIBE_CONFIGS). A DENY
#: denies only what it names.
IMPLIED_BY = {DESCRIBE: (READ, WRITE, DELETE, ALTER), DESCRIBE_CONFIGS: (ALTER_CONFIGS,)}

CLUSTER_NAME = "kafka-cluster"
WILDCARD = "*"
WILDCARD_PRINCIPAL = "User:*"
PRINCIPAL_PREFIX = "User:"
PRINCIPAL_NAME_MAX = 255
RESOURCE_NAME_MAX = 255


class AclBinding(NamedTuple):
    """One ACL: what it applies to and what it allows or denies."""

    resource_type: str
    resource_name: str
    pattern_type: str
    principal: str
    host: str
    operation: str
    permission_type: str

    def to_wire(self) -> dict:
        return self._asdict()


class AclBindingFilter(NamedTuple):
    """Matches bindings: a None field matches anything; ``pattern_type``
    MATCH matches every pattern that applies to ``resource_name``, ANY
    every pattern type with exactly that name."""

    resource_type: str | None = None
    resource_name: str | None = None
    pattern_type: str = ANY
    principal: str | None = None
    host: str | None = None
    operation: str | None = None
    permission_type: str | None = None

    def to_wire(self) -> dict:
        return self._asdict()


def _field(raw: dict, name: str, where: str, optional: bool = False) -> Any:
    value = raw.get(name)
    if value is None and optional:
        return None
    if not isinstance(value, str):
        raise InvalidRequestError(f"{where}: {name} must be a string")
    return value


def binding_from_wire(raw: Any, where: str = "acl") -> AclBinding:
    """A binding from a request body, checked (``check_binding``)."""
    if not isinstance(raw, dict):
        raise InvalidRequestError(f"{where} must be a map of {', '.join(AclBinding._fields)}")
    binding = AclBinding(*(_field(raw, name, where) for name in AclBinding._fields))
    check_binding(binding)
    return binding


def filter_from_wire(raw: Any, where: str = "filter") -> AclBindingFilter:
    if not isinstance(raw, dict):
        raise InvalidRequestError(f"{where} must be a map")
    unknown = set(raw) - set(AclBindingFilter._fields)
    if unknown:
        raise InvalidRequestError(f"{where}: unknown fields {sorted(unknown)}")
    values = {name: _field(raw, name, where, optional=True) for name in AclBindingFilter._fields}
    values["pattern_type"] = values["pattern_type"] or ANY
    acl_filter = AclBindingFilter(**values)
    _check_choice(acl_filter.resource_type, RESOURCE_TYPES, "resource type")
    _check_choice(acl_filter.pattern_type, FILTER_PATTERN_TYPES, "pattern type")
    _check_choice(acl_filter.operation, OPERATIONS, "operation")
    _check_choice(acl_filter.permission_type, PERMISSION_TYPES, "permission type")
    return acl_filter


def _check_choice(value: str | None, choices: tuple, what: str) -> None:
    if value is not None and value not in choices:
        raise InvalidRequestError(f"unknown {what} {value!r}: one of {', '.join(choices)}")


def check_binding(b: AclBinding) -> None:
    """Refuse, with ``InvalidRequestError`` saying why, a binding Kafka
    would not store."""
    _check_choice(b.resource_type, RESOURCE_TYPES, "resource type")
    _check_choice(b.pattern_type, PATTERN_TYPES, "pattern type (a binding is LITERAL or PREFIXED)")
    _check_choice(b.operation, OPERATIONS, "operation")
    _check_choice(b.permission_type, PERMISSION_TYPES, "permission type")
    if not b.resource_name or len(b.resource_name) > RESOURCE_NAME_MAX:
        raise InvalidRequestError(
            f"a resource name has 1 to {RESOURCE_NAME_MAX} characters, not {b.resource_name!r}")
    if b.resource_type == CLUSTER and b.resource_name != CLUSTER_NAME:
        raise InvalidRequestError(
            f"the cluster resource's name is {CLUSTER_NAME!r}, not {b.resource_name!r}")
    if b.operation not in SUPPORTED_OPERATIONS[b.resource_type]:
        raise InvalidRequestError(
            f"{b.operation} does not apply to a {b.resource_type}: one of "
            f"{', '.join(sorted(SUPPORTED_OPERATIONS[b.resource_type]))}")
    name = b.principal[len(PRINCIPAL_PREFIX):]
    if not b.principal.startswith(PRINCIPAL_PREFIX) or not 0 < len(name) <= PRINCIPAL_NAME_MAX:
        raise InvalidRequestError(
            f"a principal is User:<name> (User:* for everyone), not {b.principal!r}")
    if b.host != WILDCARD:
        try:
            ipaddress.ip_address(b.host)
        except ValueError:
            raise InvalidRequestError(
                f"a host is an IP address or * (any host), not {b.host!r}") from None


def pattern_applies(pattern_type: str, pattern_name: str, name: str) -> bool:
    """Whether a binding's pattern names the resource ``name``."""
    if pattern_type == LITERAL:
        return pattern_name == name or pattern_name == WILDCARD
    return pattern_type == PREFIXED and name.startswith(pattern_name)


def filter_matches(f: AclBindingFilter, b: AclBinding) -> bool:
    """Whether the filter ``f`` selects the binding ``b`` (Kafka's
    AclBindingFilter.matches)."""
    if f.resource_type is not None and f.resource_type != b.resource_type:
        return False
    if f.pattern_type == MATCH:
        if f.resource_name is not None and not pattern_applies(
                b.pattern_type, b.resource_name, f.resource_name):
            return False
    else:
        if f.pattern_type != ANY and f.pattern_type != b.pattern_type:
            return False
        if f.resource_name is not None and f.resource_name != b.resource_name:
            return False
    return all(wanted is None or wanted == got for wanted, got in (
        (f.principal, b.principal), (f.host, b.host), (f.operation, b.operation),
        (f.permission_type, b.permission_type)))
