"""The authorizer: may this principal, from this host, do this to that
resource? Kafka's StandardAuthorizer rules over the ACLs of the metadata
image (protocol/acl.py for the model):

1. A principal in ``super.users`` may do anything. Anyone else waits for the
   metadata: until it has caught up, ``BROKER_NOT_AVAILABLE`` (retriable).
2. The ACLs that apply: those of the resource type whose pattern names the
   resource (a LITERAL of the name or of ``*``, a PREFIXED of a prefix),
   whose principal is the caller's or ``User:*``, whose host is the
   caller's or ``*``, and whose operation is the one asked, ``ALL``, or (for
   an ALLOW only) one that implies it (``acl.IMPLIED_BY``).
3. Any DENY that applies wins; else any ALLOW allows; else, when no ACL at
   all names the resource, ``allow.everyone.if.no.acl.found`` decides;
   else no.

Decisions are cached per (principal, host, operation, resource) until the
ACLs change: a request on the hot path costs one dict lookup. A miss costs
a few dict lookups in an index of the ACLs by resource, whatever their
number. The index is rebuilt, lazily, when the image's ACLs change.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections import defaultdict
from typing import Any, Callable, Iterable

from protocol import acl
from protocol.errors import (BrokerNotAvailableError, ClusterAuthorizationFailedError,
                             GroupAuthorizationFailedError, KraftError,
                             TopicAuthorizationFailedError,
                             TransactionalIdAuthorizationFailedError)

#: Decisions kept before the cache starts over.
CACHE_MAX = 100_000
#: ``authorizer.class.name`` values that turn the authorizer on: ours, and
#: Kafka's class name for the same thing.
STANDARD_AUTHORIZER = "kraftlog.StandardAuthorizer"
AUTHORIZER_NAMES = (STANDARD_AUTHORIZER,
                    "org.apache.kafka.metadata.authorizer.StandardAuthorizer")

#: The error a refusal raises, per resource type.
ERRORS: dict[str, type[KraftError]] = {
    acl.TOPIC: TopicAuthorizationFailedError,
    acl.GROUP: GroupAuthorizationFailedError,
    acl.CLUSTER: ClusterAuthorizationFailedError,
    acl.TRANSACTIONAL_ID: TransactionalIdAuthorizationFailedError,
}


@dataclasses.dataclass(frozen=True)
class AclSettings:
    """The node's authorizer settings: ``authorizer.class.name`` (empty:
    off), ``super.users`` (``;``-separated, as certificate subjects hold
    commas) and ``allow.everyone.if.no.acl.found``."""

    enabled: bool = False
    super_users: frozenset[str] = frozenset()
    allow_if_no_acls: bool = False

    @classmethod
    def from_settings(cls, settings) -> "AclSettings":
        name = settings.get("authorizer.class.name", "") or ""
        users = settings.get("super.users", "") or ""
        return cls(enabled=bool(name),
                   super_users=frozenset(u.strip() for u in users.split(";") if u.strip()),
                   allow_if_no_acls=bool(settings.get("allow.everyone.if.no.acl.found", False)))


class AclIndex:
    """The ACLs by what they name: (resource type, name) -> principal ->
    ACLs, for LITERAL and PREFIXED patterns apart, and the lengths of the
    prefixes there are, per resource type."""

    def __init__(self, bindings: Iterable[acl.AclBinding]) -> None:
        literal: dict = defaultdict(lambda: defaultdict(list))
        prefixed: dict = defaultdict(lambda: defaultdict(list))
        lengths: dict[str, set[int]] = defaultdict(set)
        for b in bindings:
            if b.pattern_type == acl.LITERAL:
                literal[b.resource_type, b.resource_name][b.principal].append(b)
            else:
                prefixed[b.resource_type, b.resource_name][b.principal].append(b)
                lengths[b.resource_type].add(len(b.resource_name))
        self.literal = {key: dict(by) for key, by in literal.items()}
        self.prefixed = {key: dict(by) for key, by in prefixed.items()}
        self.prefix_lengths = {rtype: sorted(ls) for rtype, ls in lengths.items()}

    def patterns(self, rtype: str, name: str) -> list[dict]:
        """principal -> ACLs, of every pattern that names the resource."""
        found = []
        for key in ((rtype, name), (rtype, acl.WILDCARD)):
            by = self.literal.get(key)
            if by is not None:
                found.append(by)
        for length in self.prefix_lengths.get(rtype, ()):
            if length > len(name):
                break
            by = self.prefixed.get((rtype, name[:length]))
            if by is not None:
                found.append(by)
        return found


def _applies(b: acl.AclBinding, host: str, operation: str) -> bool:
    if b.host != acl.WILDCARD and b.host != host:
        return False
    if b.operation == operation or b.operation == acl.ALL:
        return True
    return b.permission_type == acl.ALLOW and b.operation in acl.IMPLIED_BY.get(operation, ())


def decide(index: AclIndex, principal: str, host: str, operation: str, rtype: str, name: str,
           allow_if_no_acls: bool) -> bool:
    """Kafka's rules 2 and 3 (see the module's docstring) over ``index``."""
    patterns = index.patterns(rtype, name)
    if not patterns:
        return allow_if_no_acls
    allowed = False
    for by in patterns:
        for who in (principal, acl.WILDCARD_PRINCIPAL):
            for b in by.get(who, ()):
                if _applies(b, host, operation):
                    if b.permission_type == acl.DENY:
                        return False
                    allowed = True
    return allowed


class Authorizer:
    """Decisions over the ACLs of the image ``image()`` returns (the node's
    current one). ``ready()``: whether that image has caught up with the
    cluster's (before, only super users are served)."""

    def __init__(self, image: Callable, settings: AclSettings,
                 ready: Callable[[], bool] = lambda: True,
                 lock: Any = None) -> None:
        self.image = image
        self.settings = settings
        self.ready = ready
        #: Held while the image's ACLs are read (a controller's image changes
        #: on the Raft thread); a broker's changes on the event loop, as here.
        self.lock = lock if lock is not None else contextlib.nullcontext()
        self._acls: object = None  # the image's ACL set the index and cache are of
        self._version = -1
        self._bindings: tuple[acl.AclBinding, ...] = ()
        self._index = AclIndex(())
        self._cache: dict[tuple, bool] = {}

    @property
    def enabled(self) -> bool:
        return self.settings.enabled

    def is_super_user(self, principal: str) -> bool:
        return principal in self.settings.super_users

    def _current(self) -> None:
        image = self.image()
        if image.acls is not self._acls or image.acl_version != self._version:
            with self.lock:
                self._acls, self._version = image.acls, image.acl_version
                self._bindings = tuple(image.acls)
            self._index = AclIndex(self._bindings)
            self._cache = {}

    def authorize(self, principal: str, host: str, operation: str, rtype: str,
                  name: str) -> bool:
        """Whether the caller may; raises ``BrokerNotAvailableError`` while
        the ACLs are not known yet (to anyone but a super user)."""
        if not self.settings.enabled or principal in self.settings.super_users:
            return True
        if not self.ready():
            raise BrokerNotAvailableError(
                "this node has not caught up with the cluster's metadata (and its ACLs) "
                "yet: try again shortly")
        self._current()
        key = (principal, host, operation, rtype, name)
        decision = self._cache.get(key)
        if decision is None:
            if len(self._cache) >= CACHE_MAX:
                self._cache = {}
            decision = self._cache[key] = decide(self._index, principal, host, operation,
                                                 rtype, name, self.settings.allow_if_no_acls)
        return decision

    def authorize_any(self, principal: str, host: str, operation: str, rtype: str) -> bool:
        """Whether some resource of the type may be (Kafka's
        authorizeByResourceType, KIP-679, for an idempotent producer with
        WRITE on some topic): as Kafka decides it, a decision for a
        resource named ``hardcode``, else an ALLOW of the operation (or
        ALL) that no DENY dominates (the same literal name, or a prefix of
        its name), an ALLOW of ``*`` winning and a DENY of ``*`` losing."""
        if not self.settings.enabled or principal in self.settings.super_users:
            return True
        if self.authorize(principal, host, operation, rtype, "hardcode"):
            return True
        key = (principal, host, operation, rtype, None)
        decision = self._cache.get(key)
        if decision is None:
            if len(self._cache) >= CACHE_MAX:
                self._cache = {}
            decision = self._cache[key] = self._any(principal, host, operation, rtype)
        return decision

    def _any(self, principal: str, host: str, operation: str, rtype: str) -> bool:
        allowed: dict[str, set[str]] = {acl.LITERAL: set(), acl.PREFIXED: set()}
        denied: dict[str, set[str]] = {acl.LITERAL: set(), acl.PREFIXED: set()}
        allowed_all = False
        for b in self._bindings:
            if (b.resource_type != rtype or b.host not in (host, acl.WILDCARD)
                    or b.principal not in (principal, acl.WILDCARD_PRINCIPAL)
                    or b.operation not in (operation, acl.ALL)):
                continue
            wildcard = b.pattern_type == acl.LITERAL and b.resource_name == acl.WILDCARD
            if b.permission_type == acl.DENY:
                if wildcard:
                    return False
                denied[b.pattern_type].add(b.resource_name)
            elif wildcard:
                allowed_all = True  # wins, unless a DENY of * is found
            else:
                allowed[b.pattern_type].add(b.resource_name)
        if allowed_all:
            return True
        for pattern_type, names in allowed.items():
            for name in names:
                if pattern_type == acl.LITERAL and name in denied[acl.LITERAL]:
                    continue
                if not any(name[:n] in denied[acl.PREFIXED] for n in range(1, len(name) + 1)):
                    return True
        return False

    def require(self, principal: str, host: str, operation: str, rtype: str,
                name: str, what: str = "") -> None:
        """Raise the resource type's AUTHORIZATION_FAILED unless allowed."""
        if not self.authorize(principal, host, operation, rtype, name):
            raise refusal(principal, operation, rtype, name, what)


def refusal(principal: str, operation: str, rtype: str, name: str, what: str = "") -> KraftError:
    """The error of a refused ``operation`` (a message naming what was
    refused and how to allow it, nothing more)."""
    target = "the cluster" if rtype == acl.CLUSTER else f"{rtype.lower()} {name!r}"
    flag = {acl.TOPIC: f"--topic {name}", acl.GROUP: f"--group {name}",
            acl.CLUSTER: "--cluster",
            acl.TRANSACTIONAL_ID: f"--transactional-id {name}"}[rtype]
    return ERRORS[rtype](
        f"{principal} may not {operation} {target}{' (' + what + ')' if what else ''}: an "
        f"administrator can allow it with `kraftlog acls add --allow-principal {principal} "
        f"--operation {operation} {flag}`")


class AllowAll:
    """The authorizer when ``authorizer.class.name`` is empty: everything is
    allowed (today's behaviour without ACLs)."""

    enabled = False

    def authorize(self, *_args) -> bool:
        return True

    def authorize_any(self, *_args) -> bool:
        return True

    def require(self, *_args, **_kwargs) -> None:
        return None

    def is_super_user(self, _principal: str) -> bool:
        return True


# ---------------------------------------------------------------------------
# Enforcement on an HTTP app: every route has a rule, checked per request
# ---------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class RouteRule:
    """How one route is authorized: the Kafka API it is (for people), an
    operation on the CLUSTER the middleware checks before the handler runs
    (``cluster_op``), whether the handler checks each resource it touches
    itself (``per_resource``), and ``open``: no ACL at all (``/healthz``;
    authentication still applies)."""

    api: str
    cluster_op: str | None = None
    per_resource: bool = False
    open: bool = False


#: Where the middleware leaves a request's ``RequestAuth``.
AUTH_KEY = "kraftlog.authorization"


class RequestAuth:
    """One request's caller, for the handler's checks."""

    def __init__(self, authorizer: "Authorizer | AllowAll", principal: str, host: str) -> None:
        self.authorizer, self.principal, self.host = authorizer, principal, host

    @property
    def enabled(self) -> bool:
        return self.authorizer.enabled

    def allowed(self, operation: str, rtype: str, name: str) -> bool:
        return self.authorizer.authorize(self.principal, self.host, operation, rtype, name)

    def allowed_any(self, operation: str, rtype: str) -> bool:
        return self.authorizer.authorize_any(self.principal, self.host, operation, rtype)

    def require(self, operation: str, rtype: str, name: str = acl.CLUSTER_NAME,
                what: str = "") -> None:
        if not self.allowed(operation, rtype, name):
            raise refusal(self.principal, operation, rtype, name, what)

    def refusal(self, operation: str, rtype: str, name: str, what: str = "") -> KraftError:
        return refusal(self.principal, operation, rtype, name, what)


_ALLOW_ALL = AllowAll()


def auth_of(request) -> RequestAuth:
    """The request's ``RequestAuth``; one that allows everything where no
    authorization middleware ran (an app built without it, in tests)."""
    found = request.get(AUTH_KEY)
    return found if found is not None else RequestAuth(_ALLOW_ALL, "User:ANONYMOUS", "")


def route_key(route) -> tuple[str, str] | None:
    """(method, canonical path) of an aiohttp route; HEAD is its GET's."""
    resource = route.resource
    if resource is None:
        return None
    return ("GET" if route.method == "HEAD" else route.method, resource.canonical)


def authorization_middleware(authorizer: "Authorizer | AllowAll",
                             rules: dict[tuple[str, str], RouteRule]):
    """The middleware: the route's rule, its CLUSTER operation checked, and
    the caller left for the handler (``auth_of``). A route with no rule is
    refused (``check_routes_complete`` keeps that from happening)."""
    from aiohttp import web

    from protocol import tls

    @web.middleware
    async def authorize(request, handler):
        key = route_key(request.match_info.route)
        if key is None:  # no such route: aiohttp's 404 / 405
            return await handler(request)
        rule = rules.get(key)
        if rule is None:
            raise ClusterAuthorizationFailedError(
                f"{key[0]} {key[1]} has no access rule, so nobody may call it")
        auth = RequestAuth(authorizer, tls.principal_of(request), request.remote or "")
        request[AUTH_KEY] = auth
        if rule.cluster_op is not None:
            auth.require(rule.cluster_op, acl.CLUSTER, what=rule.api)
        return await handler(request)

    return authorize


def check_routes_complete(app, rules: dict[tuple[str, str], RouteRule]) -> None:
    """Refuse to serve an app with a route that has no rule, or a rule for
    no route: every endpoint is authorized on purpose."""
    routes = {key for key in map(route_key, app.router.routes()) if key is not None}
    missing, extra = routes - set(rules), set(rules) - routes
    if missing or extra:
        raise RuntimeError(
            f"authorization rules and routes differ: routes without a rule {sorted(missing)}, "
            f"rules without a route {sorted(extra)}")
