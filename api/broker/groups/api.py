"""HTTP endpoints of consumer groups (docs/protocol.md, "Consumer groups").

Members and tools speak to the group's coordinator; any broker tells where
it is. Bodies are msgpack (or JSON) maps, read field by field; a malformed
one gets ``INVALID_REQUEST`` naming the field.

=====================================  =========================================
``POST /v1/groups/coordinator``         ``{group_id}`` -> coordinator id and URL
``POST /v1/groups/heartbeat``           join, heartbeat, leave (KIP-848 fields)
``POST /v1/groups/watch``               wait until a member's heartbeat has news
``POST /v1/groups/offsets/commit``      commit offsets (member epoch checked)
``POST /v1/groups/offsets/fetch``       committed offsets
``POST /v1/admin/groups/delete``        delete an empty group
``POST /v1/admin/groups/offsets/reset`` set offsets of an empty group
``GET /v1/groups``                      every group on every live broker
``GET /v1/groups/{group}``              one group, from its coordinator
``GET /v1/groups?group_id={group}``     the same (for ids like "." and "..",
                                        which browsers and URL libraries
                                        drop from a path)
=====================================  =========================================

``GET`` with ``?local=true`` answers from this broker alone.
"""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
from aiohttp import web

from api.broker.groups.coordinator import HeartbeatRequest
from api.broker.groups.service import GROUP_ID_CHARS_MAX, PEER_TIMEOUT_S, GroupService
from api.broker.authz import require_topics, topic_filter
from kraft.authorizer import RequestAuth, auth_of
from protocol import acl, tls, wire
from protocol.errors import CoordinatorNotAvailableError, InvalidRequestError
from protocol.fields import Fields

INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1
TOPICS_MAX = 10_000
PARTITIONS_MAX = 100_000
#: Offsets in one commit: one batch of __consumer_offsets must hold them.
COMMIT_PARTITIONS_MAX = 2000
METADATA_CHARS_MAX = 4096
NAME_CHARS_MAX = 255
#: Longest a watch may wait (a client watches for a heartbeat interval).
WATCH_WAIT_MS_MAX = 60_000


class GroupApi:
    def __init__(self, service: GroupService, peers: Any) -> None:
        self.service = service
        # Callable returning {broker_id: url} of the live brokers.
        self.peers = peers

    def add_routes(self, app: web.Application) -> None:
        app.router.add_post("/v1/groups/coordinator", self.handle_find_coordinator)
        app.router.add_post("/v1/groups/heartbeat", self.handle_heartbeat)
        app.router.add_post("/v1/groups/watch", self.handle_watch)
        app.router.add_post("/v1/groups/offsets/commit", self.handle_commit)
        app.router.add_post("/v1/groups/offsets/fetch", self.handle_fetch_offsets)
        app.router.add_post("/v1/groups/offsets/txn_commit", self.handle_txn_commit)
        app.router.add_post("/v1/admin/groups/delete", self.handle_delete)
        app.router.add_post("/v1/admin/groups/offsets/reset", self.handle_reset)
        app.router.add_get("/v1/groups", self.handle_list)
        app.router.add_get("/v1/groups/{group}", self.handle_describe)

    # -- members ---------------------------------------------------------------------
    async def handle_find_coordinator(self, request: web.Request) -> web.Response:
        body = Fields(await wire.read_body(request), "")
        group_id = _group_id(body)
        auth_of(request).require(acl.DESCRIBE, acl.GROUP, group_id)
        return wire.respond(request, await self.service.find_coordinator(group_id))

    async def handle_heartbeat(self, request: web.Request) -> web.Response:
        body = Fields(await wire.read_body(request), "")
        group_id = _group_id(body)
        heartbeat = HeartbeatRequest(
            member_id=body.string("member_id", NAME_CHARS_MAX, min_chars=0, default=""),
            member_epoch=body.integer("member_epoch", -2, INT32_MAX),
            instance_id=body.string("instance_id", NAME_CHARS_MAX, default=None),
            rebalance_timeout_ms=body.integer("rebalance_timeout_ms", 0, INT32_MAX,
                                              default=None),
            session_timeout_ms=body.integer("session_timeout_ms", 1, INT32_MAX, default=None),
            subscribed_topic_names=body.strings("subscribed_topic_names", TOPICS_MAX,
                                                NAME_CHARS_MAX, default=None),
            subscribed_topic_regex=body.string("subscribed_topic_regex", NAME_CHARS_MAX,
                                               default=None),
            server_assignor=body.string("server_assignor", NAME_CHARS_MAX, default=None),
            owned_partitions=_partitions(body, "owned_partitions", default=None),
            client_id=body.string("client_id", NAME_CHARS_MAX, min_chars=0, default=None),
            client_host=request.remote)
        auth = auth_of(request)
        auth.require(acl.READ, acl.GROUP, group_id)
        require_topics(auth, acl.DESCRIBE, heartbeat.subscribed_topic_names or (),
                       "a subscription")
        if heartbeat.subscribed_topic_regex is not None:
            # The group resolves a regex over every topic, for all its
            # members at once: with ACLs, only a caller who may see the
            # whole cluster subscribes by one.
            auth.require(acl.DESCRIBE, acl.CLUSTER, acl.CLUSTER_NAME,
                         "a regex subscription, which may match any topic; subscribe by "
                         "topic names instead")
        service = self.service
        response = await service.run(group_id, lambda core: core.heartbeat(
            service.clock_ms(), group_id, heartbeat, service.topics()))
        assignment = response.assignment
        return wire.respond(request, {
            "member_id": response.member_id, "member_epoch": response.member_epoch,
            "heartbeat_interval_ms": response.heartbeat_interval_ms,
            "assignment": None if assignment is None else _as_wire(assignment)})

    async def handle_watch(self, request: web.Request) -> web.Response:
        """A member waits here, between heartbeats, until its heartbeat
        would tell it something (``news``: heartbeat now), or ``max_wait_ms``
        passes. KIP-848 members hear of a rebalance only when they
        heartbeat; a watching member hears of it at once, so a rebalance
        takes a few requests, not a few heartbeat intervals."""
        body = Fields(await wire.read_body(request), "")
        group_id = _group_id(body)
        member_id = body.string("member_id", NAME_CHARS_MAX)
        max_wait_ms = body.integer("max_wait_ms", 0, WATCH_WAIT_MS_MAX)
        auth_of(request).require(acl.READ, acl.GROUP, group_id)
        news = await self.service.watch(group_id, member_id, max_wait_ms)
        return wire.respond(request, {"news": news})

    async def handle_commit(self, request: web.Request) -> web.Response:
        body = Fields(await wire.read_body(request), "")
        group_id = _group_id(body)
        member_id = body.string("member_id", NAME_CHARS_MAX, min_chars=0, default="")
        member_epoch = body.integer("member_epoch", -1, INT32_MAX, default=-1)
        offsets = _offsets(body)
        auth = auth_of(request)
        auth.require(acl.READ, acl.GROUP, group_id)
        refused = _unreadable(auth, offsets)
        service = self.service
        results = await service.run(group_id, lambda core: core.commit_offsets(
            service.clock_ms(), group_id, member_id, member_epoch, offsets))
        results.update(refused)
        return wire.respond(request, {"partitions": [
            {"topic": t, "partition": p,
             "error": None if code is None else {"code": code, "message": _why(code)}}
            for (t, p), code in sorted(results.items())]})

    async def handle_txn_commit(self, request: web.Request) -> web.Response:
        """TxnOffsetCommit: offsets committed with a producer's transaction."""
        body = Fields(await wire.read_body(request), "")
        group_id = _group_id(body)
        producer_id = body.integer("producer_id", 0, INT64_MAX)
        producer_epoch = body.integer("producer_epoch", 0, 2**15 - 1)
        transactional_id = body.string("transactional_id", NAME_CHARS_MAX)
        offsets = _offsets(body)
        auth = auth_of(request)
        auth.require(acl.WRITE, acl.TRANSACTIONAL_ID, transactional_id)
        auth.require(acl.READ, acl.GROUP, group_id)
        refused = _unreadable(auth, offsets)
        results = await self.service.txn_commit(group_id, producer_id, producer_epoch, offsets)
        results.update(refused)
        return wire.respond(request, {"partitions": [
            {"topic": t, "partition": p,
             "error": None if code is None else {"code": code, "message": _why(code)}}
            for (t, p), code in sorted(results.items())]})

    async def handle_fetch_offsets(self, request: web.Request) -> web.Response:
        body = Fields(await wire.read_body(request), "")
        group_id = _group_id(body)
        wanted = _partitions(body, "partitions", default=None)
        auth = auth_of(request)
        auth.require(acl.DESCRIBE, acl.GROUP, group_id)
        visible = topic_filter(auth)  # a topic the caller may not see is left out
        committed = await self.service.run(
            group_id, lambda core: (core.fetch_offsets(group_id, wanted), []))
        return wire.respond(request, {"group_id": group_id, "partitions": [
            {"topic": t, "partition": p, "offset": value[0], "metadata": value[1]}
            for (t, p), value in sorted(committed.items()) if visible(t)]})

    # -- admin -----------------------------------------------------------------------
    async def handle_delete(self, request: web.Request) -> web.Response:
        body = Fields(await wire.read_body(request), "")
        group_id = _group_id(body)
        auth_of(request).require(acl.DELETE, acl.GROUP, group_id)
        await self.service.run(group_id, lambda core: (None, core.delete_group(group_id)))
        return wire.respond(request, {"group_id": group_id, "deleted": True})

    async def handle_reset(self, request: web.Request) -> web.Response:
        body = Fields(await wire.read_body(request), "")
        group_id = _group_id(body)
        offsets = _offsets(body)
        auth = auth_of(request)
        auth.require(acl.READ, acl.GROUP, group_id)
        require_topics(auth, acl.READ, sorted({t for t, _ in offsets}), "an offsets reset")
        # The console calls any broker: passed on to the coordinator (checked here).
        forwarded = await self._at_coordinator(
            request, group_id, "POST", "/v1/admin/groups/offsets/reset", {
                "group_id": group_id, "offsets": [
                    {"topic": t, "partition": p, "offset": o, "metadata": m}
                    for (t, p), (o, m) in sorted(offsets.items())]})
        if forwarded is not None:
            return wire.respond(request, *forwarded)
        service = self.service
        await service.run(group_id, lambda core: (None, core.reset_offsets(
            service.clock_ms(), group_id, offsets)))
        return wire.respond(request, {"group_id": group_id, "partitions": [
            {"topic": t, "partition": p, "offset": o} for (t, p), (o, _) in
            sorted(offsets.items())]})

    # -- inspection ------------------------------------------------------------------
    async def handle_list(self, request: web.Request) -> web.Response:
        if "group_id" in request.query:
            return await self._describe(request, request.query["group_id"])
        auth = auth_of(request)
        if auth.enabled and not auth.allowed(acl.DESCRIBE, acl.CLUSTER, acl.CLUSTER_NAME):
            def visible(group: dict) -> bool:
                return auth.allowed(acl.DESCRIBE, acl.GROUP, group["group_id"])
        else:
            def visible(group: dict) -> bool:
                return True
        if request.query.get("local") == "true":
            return wire.respond(request, {"groups": [
                g for g in self.service.list_local() if visible(g)]})
        groups: list[dict] = []
        errors: list[dict] = []
        peers = self.peers()
        async with tls.session(self.service.peer_ssl) as session:
            answers = await asyncio.gather(*(
                _get_json(session, f"{url}/v1/groups?local=true")
                for url in peers.values()), return_exceptions=True)
        for (broker, _url), answer in zip(peers.items(), answers):
            if isinstance(answer, BaseException):
                errors.append({"broker_id": broker, "error": str(answer)})
            else:
                groups.extend(g for g in answer.get("groups", []) if visible(g))
        return wire.respond(request, {"groups": sorted(groups, key=lambda g: g["group_id"]),
                                      "unreachable_brokers": errors})

    async def handle_describe(self, request: web.Request) -> web.Response:
        """The group as its coordinator knows it, with each committed
        partition's log end offset and lag. Any broker answers: it asks the
        coordinator (``?local=true``) when that is another broker."""
        return await self._describe(request, request.match_info["group"])

    async def _describe(self, request: web.Request, group_id: str) -> web.Response:
        if not group_id or len(group_id) > GROUP_ID_CHARS_MAX:
            raise InvalidRequestError("group id must be 1-255 characters")
        auth = auth_of(request)
        auth.require(acl.DESCRIBE, acl.GROUP, group_id)
        visible = topic_filter(auth)
        service = self.service
        forwarded = await self._at_coordinator(request, group_id, "GET", "/v1/groups",
                                               params={"group_id": group_id})
        if forwarded is not None:
            described, status = forwarded
            if status == 200 and (not isinstance(described, dict)
                                  or described.get("group_id") != group_id):
                # Never pass on anything but the group asked for (an older
                # coordinator would answer ?group_id= with its whole list).
                raise CoordinatorNotAvailableError(
                    f"the coordinator of {group_id!r} answered for something else; retry")
            if status == 200 and auth.enabled:
                _visible_group(described, visible)
            return wire.respond(request, described, status)
        described = _jsonable(await service.run(
            group_id, lambda core: (core.describe(group_id, service.clock_ms()), [])))
        if auth.enabled:
            _visible_group(described, visible)
        ends = await service.end_offsets([(o["topic"], o["partition"])
                                          for o in described["offsets"]])
        for entry in described["offsets"]:
            end = ends.get((entry["topic"], entry["partition"]))
            entry["log_end_offset"] = end
            entry["lag"] = None if end is None else max(0, end - entry["offset"])
        return wire.respond(request, described)

    async def _at_coordinator(self, request: web.Request, group_id: str, method: str,
                              path: str, body: Any = None, params: dict | None = None
                              ) -> tuple[Any, int] | None:
        """The answer of ``group_id``'s coordinator to the same call, made
        with ``?local=true`` (JSON), when that is another broker; None when
        this broker is the coordinator or the caller asked for ``local``.
        The caller's rights are checked here, before the call."""
        if request.query.get("local") == "true":
            return None
        service = self.service
        where = await service.find_coordinator(group_id)
        if where["coordinator_id"] == service.broker_id:
            return None
        try:
            async with tls.session(service.peer_ssl) as session, session.request(
                    method, where["coordinator_url"] + path,
                    params={**(params or {}), "local": "true"},
                    json=body, headers={"Accept": "application/json"},
                    timeout=aiohttp.ClientTimeout(total=PEER_TIMEOUT_S)) as answer:
                status = answer.status
                try:
                    return await answer.json(), status
                except (aiohttp.ContentTypeError, ValueError):
                    raise CoordinatorNotAvailableError(
                        f"the coordinator of {group_id!r} (broker {where['coordinator_id']}) "
                        f"answered HTTP {status} without JSON; retry") from None
        except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
            raise CoordinatorNotAvailableError(
                f"the coordinator of {group_id!r} (broker {where['coordinator_id']}) "
                f"did not answer: {type(exc).__name__}; retry") from None


def _visible_group(described: dict, visible) -> None:
    """Leave out of a described group every trace of a topic the caller may
    not DESCRIBE: its offsets, partition counts, and members' subscriptions,
    assignments and targets."""
    def parts(value: Any) -> Any:
        if not isinstance(value, list):
            return value
        return [tp for tp in value if isinstance(tp, list) and tp and visible(tp[0])]

    if isinstance(described.get("offsets"), list):
        described["offsets"] = [o for o in described["offsets"]
                                if isinstance(o, dict) and visible(o.get("topic", ""))]
    if isinstance(described.get("subscribed_partition_counts"), dict):
        described["subscribed_partition_counts"] = {
            t: n for t, n in described["subscribed_partition_counts"].items() if visible(t)}
    for member in described.get("members") or ():
        if not isinstance(member, dict):
            continue
        if isinstance(member.get("subscribed_topic_names"), list):
            member["subscribed_topic_names"] = [t for t in member["subscribed_topic_names"]
                                                if visible(t)]
        for key in ("assigned", "pending_revocation", "target"):
            member[key] = parts(member.get(key))


def _unreadable(auth: RequestAuth, offsets: dict) -> dict[tuple[str, int], str]:
    """The partitions of ``offsets`` whose topic the caller may not READ,
    taken out of ``offsets`` and answered TOPIC_AUTHORIZATION_FAILED."""
    if not auth.enabled:
        return {}
    readable = topic_filter(auth, acl.READ)
    refused = {tp: "TOPIC_AUTHORIZATION_FAILED" for tp in offsets if not readable(tp[0])}
    for tp in refused:
        del offsets[tp]
    return refused


def _group_id(body: Fields) -> str:
    return body.string("group_id", GROUP_ID_CHARS_MAX)


def _partitions(body: Fields, key: str, default: Any) -> list[tuple[str, int]] | None:
    """``[{"topic": t, "partitions": [p, ...]}, ...]`` as (topic, partition) pairs."""
    items = body.sequence(key, TOPICS_MAX, default=None)
    if items is None:
        return default
    out: list[tuple[str, int]] = []
    for i, item in enumerate(items):
        entry = Fields(item, f"{key}[{i}]")
        topic = entry.string("topic", NAME_CHARS_MAX)
        for j, number in enumerate(entry.sequence("partitions", PARTITIONS_MAX)):
            if not isinstance(number, int) or isinstance(number, bool) or not \
                    0 <= number <= INT32_MAX:
                raise InvalidRequestError(
                    f"{key}[{i}].partitions[{j}] must be a partition number, got {number!r}")
            out.append((topic, number))
    return out


def _offsets(body: Fields) -> dict[tuple[str, int], tuple[int, str]]:
    """``[{"topic", "partition", "offset", "metadata"?}, ...]``."""
    out: dict[tuple[str, int], tuple[int, str]] = {}
    for i, item in enumerate(body.sequence("offsets", COMMIT_PARTITIONS_MAX)):
        entry = Fields(item, f"offsets[{i}]")
        tp = (entry.string("topic", NAME_CHARS_MAX), entry.integer("partition", 0, INT32_MAX))
        out[tp] = (entry.integer("offset", -(2**63), INT64_MAX),
                   entry.string("metadata", METADATA_CHARS_MAX, min_chars=0, default=""))
    return out


def _as_wire(partitions: Any) -> list[dict]:
    by_topic: dict[str, list[int]] = {}
    for topic, partition in sorted(partitions):
        by_topic.setdefault(topic, []).append(partition)
    return [{"topic": t, "partitions": ps} for t, ps in by_topic.items()]


_WHY = {
    "STALE_MEMBER_EPOCH": "the member epoch is older than the member's current one: "
                          "the partition may have moved; rejoin or refresh the assignment",
    "UNKNOWN_MEMBER_ID": "the group does not know this member: rejoin",
    "INVALID_REQUEST": "offsets must be 0 or more",
    "TOPIC_AUTHORIZATION_FAILED": "not authorized to READ the topic: its offsets are not "
                                  "committed",
}


def _why(code: str) -> str:
    return _WHY.get(code, code)


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k) if not isinstance(k, str) else k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        items = sorted(value) if isinstance(value, (set, frozenset)) else value
        return [_jsonable(v) for v in items]
    return value


async def _get_json(session: aiohttp.ClientSession, url: str) -> dict:
    async with session.get(url, headers={"Accept": "application/json"},
                           timeout=aiohttp.ClientTimeout(total=PEER_TIMEOUT_S)) as response:
        return await response.json()
